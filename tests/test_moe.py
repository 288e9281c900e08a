"""Mixture-of-experts blocks and expert parallelism (ep): the presets' parameter totals, the
per-rank experts and their GEMMs, the all-to-all by hand, memory divided by ep, the rules,
the search's ep column, the export's arguments and the spec's errors."""
from __future__ import annotations

import json

import numpy as np
import pytest

from amp_search.cli import main
from amp_search.costing.links import ClusterArrays, all_to_all_links
from amp_search.errors import SpecError
from amp_search.launch.megatron import megatron_args
from amp_search.planner import estimate, plan
from amp_search.search_space import Candidate, Reason, SearchSpace, first_violation
from amp_search.spec import parse_spec
from cost_models import comm
from cost_models.layers import (Layer, expert_param_count, gemm_flops, model_flops_per_sample,
                                model_param_count, param_count)

QWEN3_30B_BLOCK = Layer(kind="transformer", seq_length=4096, hidden_size=2048,
                        num_attention_heads=32, num_query_groups=4, head_dim=128,
                        ffn_hidden_size=6144, mlp="swiglu", norm="rmsnorm", bias=False,
                        position_embedding="rope", num_experts=128, moe_router_topk=8,
                        moe_ffn_hidden_size=768)


def _spec(model: dict, gpus: int = 16, per_node: int = 8, **training) -> dict:
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": gpus // per_node,
                                   "gpus_per_node": per_node,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "8 x 400 Gbps"}]},
            "model": model,
            "training": {"global_batch_size": 64, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 1, **training}}


TINY_MOE = {"preset": "gpt", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
            "seq_length": 512, "vocab_size": 1024, "mlp": "swiglu", "norm": "rmsnorm",
            "bias": False, "position_embedding": "rope", "ffn_hidden_size": 512,
            "num_experts": 16, "moe_router_topk": 2, "moe_ffn_hidden_size": 128}


@pytest.mark.parametrize("name, published", [("qwen3-30b-a3b", 30.5e9),
                                             ("qwen3-235b-a22b", 235e9),
                                             ("mixtral-8x7b", 46.7e9),
                                             ("mixtral-8x22b", 141e9)])
def test_presets_have_their_published_totals(name, published):
    spec = parse_spec(_spec({"preset": name}))
    assert model_param_count(spec.model.layers) == pytest.approx(published, rel=0.005)
    assert spec.model.num_experts in (8, 128)
    assert spec.training.expert_parallel == tuple(     # searched by default: the divisors
        e for e in (1, 2, 4, 8, 16, 32, 64, 128) if spec.model.num_experts % e == 0)


def test_active_flops_are_the_topk_experts_and_ep_splits_the_calls():
    """A token's FLOPs are its k experts' (3.3B active of Qwen3 30B-A3B), whatever ep; ep
    sets how many tokens each local expert's GEMM gets: E/ep calls of ep times the size."""
    b = QWEN3_30B_BLOCK
    s, h, k, fe = 4096, 2048, 8, 768
    for ep in (1, 8, 128):
        calls = gemm_flops(b, 1, ep)
        assert len(calls) == 2 + 1 + 2 * (128 // ep)      # qkv, proj, router, fc1s, fc2s
        assert sum(calls[3:]) == pytest.approx(2 * s * k * (h * 2 * fe + fe * h))
        assert calls[3] == pytest.approx(2 * s * k * ep / 128 * h * 2 * fe)
    spec = parse_spec(_spec({"preset": "qwen3-30b-a3b"}))
    gemm = sum(sum(gemm_flops(x, 1)) for x in spec.model.layers)
    active = gemm / (2 * 4096)    # 2 FLOPs per parameter and token: "3.3B activated" less
    assert 2.8e9 < active < 3.1e9  # the 0.31B embedding table, which no GEMM reads
    assert model_flops_per_sample(spec.model.layers) > 3 * gemm       # + the attention core


def test_experts_on_a_rank_are_divided_by_ep_not_by_tmp():
    b = QWEN3_30B_BLOCK
    experts = 128 * (2048 * 1536 + 768 * 2048)
    assert expert_param_count(b, 1) == experts
    assert expert_param_count(b, 8) == experts // 8
    assert param_count(b, 1, 1) - param_count(b, 1, 8) == experts - experts // 8
    assert param_count(b, 2, 8) - param_count(b, 4, 8) > 0          # attention split by tmp
    assert (param_count(b, 2, 8) - expert_param_count(b, 8)) == \
        pytest.approx((param_count(b, 1, 8) - expert_param_count(b, 8)) / 2, rel=0.02)  # router, norms


def test_all_to_all_links_by_hand():
    """Two nodes of 4 ranks: a group of 4 inside a node moves 3/4 of its message over NVLink;
    a group of 8 over both nodes moves 3/8 inside and 4/8 over the network, whose bandwidth
    the node's 4 sending ranks share."""
    arr = ClusterArrays(node_of=np.array([0, 0, 0, 0, 1, 1, 1, 1]),
                        intra_bytes_per_s=np.array([400e9, 400e9]),
                        inter_bytes_per_s=np.array([100e9, 100e9]), num_nodes=2)
    inside = all_to_all_links(arr, np.arange(8).reshape(2, 4))
    assert inside.seconds_per_byte == pytest.approx([0.75 / 400e9] * 2)
    assert not inside.crosses_nodes.any()
    across = all_to_all_links(arr, np.arange(8).reshape(1, 8))
    assert across.seconds_per_byte == pytest.approx([max(3 / 8 / 400e9, 4 / 8 / 25e9)])
    assert across.crosses_nodes.all()
    message = comm.expert_combine_bytes(4096, 8, 2048, 2)
    assert comm.expert_dispatch_bytes(4096, 8, 2048, 2) == 4096 * 8 * 2049 * 2
    assert comm.all_to_all_time_s(message, across.seconds_per_byte[0], 1e-5, 4) == \
        pytest.approx(4 * (1e-5 + message * 0.5 / 25e9))


def test_ep_adds_the_all_to_alls_and_divides_the_expert_memory():
    spec = parse_spec(_spec(TINY_MOE))
    one = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, ep=1)
    eight = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, ep=8)
    assert one.breakdown.tensor_parallel_s == 0.0
    assert eight.breakdown.tensor_parallel_s > 0.0                     # the all-to-alls
    assert eight.memory[0].parameter_bytes < one.memory[0].parameter_bytes
    sixteen = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, ep=16)          # over both nodes
    assert sixteen.breakdown.tensor_parallel_s > eight.breakdown.tensor_parallel_s


@pytest.mark.parametrize("degrees, reason", [
    (dict(pp=1, dp=16, tmp=1, ep=3), Reason.EP_DOES_NOT_DIVIDE_EXPERTS),
    (dict(pp=4, dp=4, tmp=1, ep=8), Reason.EP_EXCEEDS_STAGE_RANKS),
    (dict(pp=1, dp=8, tmp=2, ep=2), Reason.MOE_TENSOR_PARALLEL_WITHOUT_SP),
])
def test_the_rules(degrees, reason):
    space = SearchSpace.of(parse_spec(_spec(TINY_MOE)))
    c = Candidate.make(mbs=1, zero_stage=1, recompute="none", **degrees)
    assert first_violation(space, c).reason == reason
    ok = Candidate.make(mbs=1, zero_stage=1, recompute="none", pp=1, dp=8, tmp=2, ep=16,
                        sequence_parallel=True)
    assert first_violation(space, ok) is None


def test_plan_searches_ep_and_shows_it(capsys):
    spec = parse_spec(_spec(TINY_MOE, sequence_parallel="search"))
    p = plan(spec, simulate_top=4)
    assert len({e.strategy.ep for e in p.strategies}) > 1
    assert all(128 % e.strategy.ep == 0 or e.strategy.ep <= 16 for e in p.strategies)
    best = p.strategies[0].to_dict()
    assert "ep" in best
    spec_dense = parse_spec(_spec({k: v for k, v in TINY_MOE.items()
                                   if not k.startswith(("num_experts", "moe_"))}))
    assert spec_dense.training.expert_parallel == (1,)


def test_the_megatron_baseline_spreads_the_experts_inside_a_node():
    """Megatron-LM's usual layout for a model with experts may spread them over a node
    (ep x tmp within its GPUs), as the MoE recipes do, rather than keep every expert on
    every rank: the baseline is the fastest of those proposals, so never slower than its
    ep-1 proposal, and its ep stays inside a node."""
    spec = parse_spec(_spec({**TINY_MOE, "hidden_size": 1024, "moe_ffn_hidden_size": 1024,
                             "num_experts": 64}))
    base = plan(spec, simulate_top=0).baseline
    assert base.strategy.ep > 1 and base.strategy.ep * base.strategy.tmp <= 8
    only_one = plan(parse_spec(_spec({**TINY_MOE, "hidden_size": 1024,
                                      "moe_ffn_hidden_size": 1024, "num_experts": 64},
                                     expert_parallel=[1])), simulate_top=0).baseline
    assert only_one.strategy.ep == 1
    assert base.iteration_time_s <= only_one.iteration_time_s
    dense = plan(parse_spec(_spec({k: v for k, v in TINY_MOE.items()
                                   if not k.startswith(("num_experts", "moe_"))})),
                 simulate_top=0)
    assert dense.baseline.strategy.ep == 1


def test_cli_table_has_an_ep_column(tmp_path, capsys):
    path = tmp_path / "moe.yaml"
    path.write_text(json.dumps(_spec(TINY_MOE)))
    assert main(["estimate", str(path), "--pp", "1", "--dp", "16", "--tmp", "1", "--mbs", "1",
                 "--ep", "4", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.split()[:1] == ["rank"])
    assert "ep" in head.split()
    assert "ep: expert-parallel ranks" in out
    assert main(["plan", str(path), "--top-k", "3", "--no-progress"]) == 0
    out = capsys.readouterr().out
    searched = " ".join(out.split("searched: ", 1)[1].split("\nfixed")[0].split())
    assert "expert parallel 1/2/4/8/16 " in searched + " "        # the divisors of its 16


def test_megatron_arguments():
    spec = parse_spec(_spec({"preset": "qwen3-30b-a3b"}))
    e = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, ep=16, partition="uniform")
    args = megatron_args(spec.model.layers, e.strategy, precision="bf16", iters=3)
    text = " ".join(args)
    for flag in ("--num-experts 128", "--moe-router-topk 8", "--moe-ffn-hidden-size 768",
                 "--moe-grouped-gemm", "--moe-token-dispatcher-type alltoall",
                 "--expert-model-parallel-size 16", "--expert-tensor-parallel-size 1"):
        assert flag in text


@pytest.mark.parametrize("change, key", [
    ({"backend": "deepspeed"}, "training.precision"),   # bf16: deepspeed runs experts in fp32
    ({"expert_parallel": 0}, "training.expert_parallel"),
])
def test_spec_errors_name_the_key(change, key):
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(TINY_MOE, **change))
    assert key in str(err.value)


def test_experts_keys_need_num_experts():
    model = {k: v for k, v in TINY_MOE.items() if k != "num_experts"}
    with pytest.raises(SpecError, match="only with num_experts"):
        parse_spec(_spec(model))
    dense = {k: v for k, v in TINY_MOE.items() if not k.startswith(("num_experts", "moe_"))}
    with pytest.raises(SpecError, match="no experts"):
        parse_spec(_spec(dense, expert_parallel=4))


@pytest.mark.parametrize("virtual_stages", [1, 2])
def test_the_simulator_syncs_the_experts_as_the_closed_form(virtual_stages):
    """Both schedules' simulated gradient buckets carry, stage by stage, what the closed
    form's data-parallel sync prices: the experts' share of their own reduction
    (CostModel.synced_params_per_layer), not every parameter the rank holds (the first and
    last stages hold the embedding and the head, no experts, so a wrong count shows)."""
    from amp_search.costing.cost_model import CostModel
    from amp_search.simulate import simulation_inputs
    from cost_models import pipeline

    spec = parse_spec(_spec({**TINY_MOE, "num_layers": 8},
                            virtual_pipeline_stages=virtual_stages))
    e = estimate(spec, pp=4, dp=4, tmp=1, mbs=1, ep=2, virtual_stages=virtual_stages)
    s = e.strategy
    model = CostModel(spec)
    synced = model.synced_params_per_layer(Candidate.of(s))
    assert synced.sum() < model.params_per_layer(1, 2).sum()          # experts count less
    if virtual_stages == 1:
        want = pipeline.stage_totals(synced[None, :].repeat(s.pp, axis=0), s.partition)
    else:
        want = pipeline.chunk_device_totals(synced[None, :].repeat(s.pp, axis=0),
                                            s.partition, s.pp)
    got = simulation_inputs(model, s)["gradient_bytes"]
    ratio = got / want              # the bytes per element each schedule's buckets carry
    np.testing.assert_allclose(ratio, ratio[0])


@pytest.mark.parametrize("ep, crossing", [(8, 8), (2, 2), (16, None)])
def test_expert_gradients_ride_their_own_rings(ep, crossing):
    """Two nodes of 8, dp 16: the experts' gradients are reduced (and their weights gathered)
    over the expert-data-parallel ranks, those at one place in each group of ep consecutive
    ranks: with ep 8 eight rings {i, i+8} all leave each node at once, each on an eighth of
    its network, where the dp ring's one crossing per node has all of it; with ep 2 two rings
    of 8 (even and odd ranks) cross each node boundary; with ep 16 each expert has one
    holder and nothing is synced. The priced parameters carry the slowdown, the simulator's
    buckets the gradients as they are, on a dp bandwidth slowed to match."""
    from amp_search.costing.cost_model import CostModel
    from amp_search.placement import device_orders
    from amp_search.simulate import simulation_inputs

    spec = parse_spec(_spec(TINY_MOE, overlap_grad_reduce=False, grad_reduce_in_fp32=False))
    model = CostModel(spec)
    c = Candidate.make(pp=1, dp=16, tmp=1, mbs=1, zero_stage=1, recompute="none", ep=ep)
    layout = model.layout(c, device_orders(spec.cluster, "bf16")[0])
    arr = ClusterArrays.of(spec.cluster)
    intra, inter = arr.intra_bytes_per_s[0], arr.inter_bytes_per_s[0]
    experts = model.expert_params_per_layer(ep)
    dense = model.params_per_layer(1, ep) - experts
    if crossing is None:
        np.testing.assert_allclose(model.synced_params(c, layout)[0], dense)
        return
    edp = 16 // ep
    share = ((edp - 1) / edp) / (15 / 16)
    slowdown = min(intra, inter) / (inter / crossing)
    np.testing.assert_allclose(model.synced_params(c, layout)[0],
                               dense + share * slowdown * experts)
    e = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, ep=ep, simulate=False)
    got = simulation_inputs(model, e.strategy)
    plain = model.synced_params_per_layer(c).sum()
    assert got["gradient_bytes"][0] == pytest.approx(plain * 2)          # bf16 gradients
    priced = model.synced_params(c, layout)[0].sum()
    assert got["dp_bandwidth_bytes_per_s"][0] == pytest.approx(
        layout.dp_links[0][0] * plain / priced)
