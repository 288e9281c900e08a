"""training.moe_dispatcher: megatron-core's all-to-all token dispatcher against the hierarchical
ones (DeepEP, Hybrid-EP: --moe-token-dispatcher-type flex), which send a token once over the
network to each other node its experts are on and forward it there over NVLink
(cost_models.comm.hierarchical_shares)."""
from __future__ import annotations

import itertools
from math import comb

import numpy as np
import pytest

from amp_search import estimate
from amp_search.costing.links import ClusterArrays, all_to_all_links
from amp_search.errors import SpecError
from amp_search.spec import parse_spec, spec_fingerprint
from cost_models.comm import hierarchical_shares, node_hit_probability

NODE = {"gpu": "H100-80GB", "gpus_per_node": 8, "intra_node_bandwidth": "450 GB/s",
        "inter_node_bandwidth": "8 x 400 Gbps"}
MOE = {"preset": "qwen3-30b-a3b", "seq_length": 4096}
TINY = {"preset": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "ffn_hidden_size": 128, "seq_length": 32, "vocab_size": 512, "num_experts": 4,
        "moe_router_topk": 2}


def _spec(model=MOE, nodes: int = 2, backend: str = "megatron", **training) -> dict:
    t = {"global_batch_size": 64, "precision": "bf16", "backend": backend,
         "activation_checkpointing": "none", "zero_stage": 1, "sequence_parallel": False,
         **training}
    return {"cluster": {"nodes": [dict(NODE, count=nodes)]}, "model": dict(model),
            "training": t}


def test_the_chance_a_node_is_hit_by_counting():
    """1 - C(E - e, k) / C(E, k), checked against every top-k choice of a small router."""
    experts, topk = 8, 3
    for on_node in range(experts + 1):
        picks = list(itertools.combinations(range(experts), topk))
        hit = sum(any(x < on_node for x in p) for p in picks) / len(picks)
        assert node_hit_probability(experts, topk, on_node) == pytest.approx(hit)
        assert node_hit_probability(experts, topk, on_node) == pytest.approx(
            1 - comb(experts - on_node, topk) / comb(experts, topk))


def test_the_shares_a_rank_moves():
    # two nodes of 8 ranks, Qwen3 30B-A3B's router (128 experts, top 8): a token hits the
    # other node almost surely, once over the network instead of 4 copies
    node = np.repeat([0, 1], 8)
    nvlink, network = hierarchical_shares(node[:, None] == node[None, :], 128, 8)
    p = 1 - comb(64, 8) / comb(128, 8)
    assert network == pytest.approx(np.full(16, p / 8))
    assert nvlink == pytest.approx(np.full(16, 7 / 8))
    # one node: an all-to-all's shares, (n - 1) / n over NVLink and none over the network
    one = np.zeros(8, dtype=int)
    nvlink, network = hierarchical_shares(one[:, None] == one[None, :], 128, 8)
    assert nvlink == pytest.approx(np.full(8, 7 / 8)) and not network.any()


def test_the_links_inside_a_node_are_the_all_to_alls_and_cheaper_across():
    spec = parse_spec(_spec())
    arr = ClusterArrays.of(spec.cluster)
    inside = np.arange(16).reshape(2, 8)
    a = all_to_all_links(arr, inside)
    b = all_to_all_links(arr, inside, hierarchical=(128, 8))
    assert np.array_equal(a.seconds_per_byte, b.seconds_per_byte)
    across = np.arange(16).reshape(1, 16)
    a = all_to_all_links(arr, across)
    b = all_to_all_links(arr, across, hierarchical=(128, 8))
    assert a.crosses_nodes.all() and b.crosses_nodes.all()
    # the network bounds both; the hierarchical one sends ~1 copy per token, not 4
    assert b.seconds_per_byte[0] == pytest.approx(a.seconds_per_byte[0] * (
        (1 - comb(64, 8) / comb(128, 8)) / 8) / (8 / 16))


def test_the_plan_costs_it_across_nodes_only():
    kw = dict(pp=1, dp=16, tmp=1, mbs=1, zero_stage=1, activation_checkpointing="none")
    alltoall, flex = parse_spec(_spec()), parse_spec(_spec(moe_dispatcher="hybridep"))
    inside = [estimate(s, ep=8, **kw).iteration_time_s for s in (alltoall, flex)]
    assert inside[0] == inside[1]
    across = [estimate(s, ep=16, **kw) for s in (alltoall, flex)]
    assert across[1].breakdown.tensor_parallel_s < 0.5 * across[0].breakdown.tensor_parallel_s
    assert across[1].iteration_time_s < across[0].iteration_time_s
    # DeepSpeed plans of a spec without a backend ignore it
    both = _spec(moe_dispatcher="deepep")
    del both["training"]["backend"]
    assert parse_spec(both).for_backend("megatron").training.moe_dispatcher == "deepep"


def test_the_spec_key_its_errors_and_the_fingerprint():
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(moe_dispatcher="nccl"))
    assert "training.moe_dispatcher" in str(e.value) and "hybridep" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(_spec({"preset": "llama3-8b", "seq_length": 4096}, moe_dispatcher="deepep"))
    assert "training.moe_dispatcher" in str(e.value) and "accepted: alltoall" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(backend="deepspeed", precision="fp32", moe_dispatcher="deepep"))
    assert "training.moe_dispatcher" in str(e.value) and "backend megatron" in str(e.value)

    def sections(spec):
        out = spec_fingerprint(parse_spec(spec))
        out.pop("spec_sha256")
        return out

    assert sections(_spec(moe_dispatcher="alltoall")) == sections(_spec())
    assert sections(_spec(moe_dispatcher="deepep")) != sections(_spec())


def test_the_arguments_the_export_note_and_no_cpu_trial():
    from amp_search.export import export_strategy
    from amp_search.launch.megatron import megatron_args, training_kwargs
    from amp_search.launch.orchestrator import preflight

    spec = parse_spec(_spec(TINY, nodes=1, moe_dispatcher="hybridep", global_batch_size=8,
                            expert_parallel=2))
    e = estimate(spec, pp=1, dp=8, tmp=1, mbs=1, ep=2, zero_stage=1,
                 activation_checkpointing="none")
    args = megatron_args(spec.model.layers, e.strategy, precision="bf16", iters=2,
                         **training_kwargs(spec.training, e.strategy))
    i = args.index("--moe-token-dispatcher-type")
    assert args[i + 1] == "flex"
    assert args[args.index("--moe-flex-dispatcher-backend") + 1] == "hybridep"
    # megatron-core's flex dispatcher needs expert parallelism: ep 1 keeps the all-to-all
    one = estimate(spec, pp=1, dp=8, tmp=1, mbs=1, ep=1, zero_stage=1,
                   activation_checkpointing="none").strategy
    solo = megatron_args(spec.model.layers, one, precision="bf16", iters=2,
                         **training_kwargs(spec.training, one))
    assert solo[solo.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in solo
    plain = megatron_args(spec.model.layers, e.strategy, precision="bf16", iters=2)
    assert plain[plain.index("--moe-token-dispatcher-type") + 1] == "alltoall"
    assert "--moe-flex-dispatcher-backend" not in plain
    notes = " ".join(export_strategy(spec, e.strategy, fmt="megatron", estimate=e).notes)
    assert "Hybrid-EP" in notes and "training.moe_dispatcher" in notes
    cpu = parse_spec({"cluster": {"nodes": [{"gpu": "CPU-local", "count": 1, "gpus_per_node": 2,
                                          "intra_node_bandwidth": "10 GB/s"}]},
                      "model": dict(TINY),
                      "training": {"global_batch_size": 4, "backend": "megatron",
                                   "moe_dispatcher": "deepep", "expert_parallel": 2,
                                   "activation_checkpointing": "none", "zero_stage": 0}})
    s = estimate(cpu, pp=1, dp=2, tmp=1, mbs=1, ep=2, zero_stage=0,
                 activation_checkpointing="none").strategy
    why = preflight(cpu, s, "megatron")
    assert "training.moe_dispatcher" in why and "CUDA" in why
    s1 = estimate(cpu, pp=1, dp=2, tmp=1, mbs=1, ep=1, zero_stage=0,
                  activation_checkpointing="none").strategy
    assert "moe_dispatcher" not in (preflight(cpu, s1, "megatron") or "")


def test_plan_says_what_the_dispatcher_would_save(tmp_path, capsys):
    """Where the best plan's expert-parallel groups cross nodes under the all-to-all, `plan`
    prices the same plan with the hierarchical dispatcher, in a line and in the JSON; not
    where they stay inside a node, nor where the spec names the dispatcher already."""
    import json

    import yaml

    from amp_search.cli import main

    def run(nodes: int, **training) -> tuple[str, dict]:
        spec = _spec(nodes=nodes, precision="fp8", global_batch_size=1024, **training)
        path = tmp_path / f"s{nodes}{len(training)}.yaml"
        path.write_text(yaml.safe_dump(spec))
        out = tmp_path / "plan.json"
        assert main(["plan", str(path), "--top-k", "3", "--no-progress", "--json",
                     str(out)]) == 0
        return capsys.readouterr().out, json.loads(out.read_text())

    text, data = run(4, expert_parallel=32)
    hint = data["moe_dispatcher_hint"]
    assert hint["moe_dispatcher"] == "hybridep"
    assert hint["iteration_time_s"] < 0.99 * hint["as_planned_s"]
    assert "training.moe_dispatcher: hybridep" in " ".join(text.split())
    text, data = run(2, expert_parallel=8)         # ep 8 groups stay inside a node
    assert "moe_dispatcher_hint" not in data and "moe_dispatcher:" not in text
    text, data = run(4, expert_parallel=32, moe_dispatcher="hybridep")
    assert "moe_dispatcher_hint" not in data


def test_the_header_and_a_spec_without_a_backend():
    from amp_search import plan
    from amp_search.cli.plan import dispatcher_gain
    from amp_search.cli.plan_header import header_lines

    spec = parse_spec(_spec(TINY, nodes=1, moe_dispatcher="deepep", global_batch_size=8,
                            expert_parallel=2))
    text = " ".join(" ".join(header_lines(spec, plan(spec), 200)).split())
    assert "tokens dispatched hierarchically by deepep" in text
    plain = parse_spec(_spec(TINY, nodes=1, global_batch_size=8, expert_parallel=2))
    assert "hierarchically" not in " ".join(header_lines(plain, plan(plain), 200))
    # planned for both backends: the hint looks at a Megatron-LM best plan only
    both = _spec(TINY, nodes=2, global_batch_size=16, expert_parallel=4)
    del both["training"]["backend"]
    both = parse_spec(both)
    result = plan(both)
    for e in result.strategies[:5]:
        gain = dispatcher_gain(both, e)
        assert gain is None or (e.backend == "megatron" and gain[1] < gain[0])
