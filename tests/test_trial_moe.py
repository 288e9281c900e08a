"""The trials' mixture-of-experts block (amp_search.trial.model._MoE): with its experts split
over two real expert-parallel ranks (all-to-alls over gloo) it computes what one rank holding
every expert computes, gradients included, and its parameters are what the cost model counts."""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from cost_models.layers import Layer, expert_param_count, param_count

sys.path.insert(0, str(Path(__file__).parent))

MOE = dict(kind="transformer", seq_length=16, hidden_size=32, num_attention_heads=4,
           ffn_hidden_size=64, num_experts=4, moe_router_topk=2, moe_ffn_hidden_size=24)
LLAMA_MOE = dict(MOE, mlp="swiglu", norm="rmsnorm", bias=False, position_embedding="rope",
                 num_query_groups=2, moe_shared_expert_size=16)
GPT_OSS_MOE = dict(MOE, mlp="quick_geglu", norm="rmsnorm", bias=True, position_embedding="rope",
                   num_query_groups=2)


def _ep2_against_one_rank(rank: int, fields: dict | None = None) -> dict:
    """Rank r's block with ep 2 and the same block with every expert, on rank r's input:
    outputs, input gradients and router gradients must agree; each local expert's gradient
    must be the sum of the two ranks' gradients of that expert in the all-expert block."""
    import torch
    import torch.distributed as dist

    from amp_search.trial.model import ALL_TO_ALL_SENT, build_layer

    layer = Layer(**(fields or MOE))
    torch.manual_seed(0)
    split = build_layer(layer, expert_group=dist.group.WORLD)
    torch.manual_seed(0)
    whole = build_layer(layer)
    x = torch.randn(3, layer.seq_length, layer.hidden_size,
                    generator=torch.Generator().manual_seed(10 + rank))
    outs, grads = [], []
    for m in (split, whole):
        xi = x.clone().requires_grad_(True)
        y = m(xi)
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append(y.detach())
        grads.append(xi.grad)
    whole_experts = [torch.cat([p.grad.reshape(-1) for p in e.parameters()])
                     for e in whole.mlp.experts]
    for g in whole_experts:
        dist.all_reduce(g)       # each expert of the split block saw both ranks' tokens
    local = split.mlp.local
    expert_err = max(
        float((torch.cat([p.grad.reshape(-1) for p in e.parameters()])
               - whole_experts[rank * local + i]).abs().max())
        for i, e in enumerate(split.mlp.experts))
    return {"out_err": float((outs[0] - outs[1]).abs().max()),
            "out_scale": float(outs[1].abs().max()),
            "input_grad_err": float((grads[0] - grads[1]).abs().max()),
            "router_grad_err": float((split.mlp.router.grad - whole.mlp.router.grad).abs().max()),
            "expert_grad_err": expert_err,
            "local_experts": len(split.mlp.experts),
            "params": sum(p.numel() for p in split.parameters()),
            "a2a_calls": ALL_TO_ALL_SENT["calls"]}


def _llama_ep2(rank: int) -> dict:
    return _ep2_against_one_rank(rank, LLAMA_MOE)


def _gpt_oss_ep2(rank: int) -> dict:
    return _ep2_against_one_rank(rank, GPT_OSS_MOE)


@pytest.mark.parametrize("body, fields", [(_ep2_against_one_rank, MOE),
                                          (_llama_ep2, LLAMA_MOE),
                                          (_gpt_oss_ep2, GPT_OSS_MOE)],
                         ids=["gelu", "swiglu-shared-expert", "quick-geglu-biases"])
def test_two_expert_parallel_ranks_compute_what_one_rank_does(body, fields):
    from two_ranks import on_two_ranks

    layer = Layer(**fields)
    for r in on_two_ranks(body, tp=1):
        assert r["out_scale"] > 0
        assert r["out_err"] < 1e-5
        assert r["input_grad_err"] < 1e-5
        assert r["router_grad_err"] < 1e-5
        assert r["expert_grad_err"] < 1e-5
        assert r["local_experts"] == 2
        # what the cost model counts for one rank of ep 2
        assert r["params"] == param_count(layer, 1, 2)
        assert r["params"] == param_count(layer, 1, 1) - expert_param_count(layer, 1) \
            + expert_param_count(layer, 2)
        # dispatch and combine in the forward, both again in the backward
        assert r["a2a_calls"] == 4


def test_simulated_expert_rank_holds_its_share():
    """Profiling builds one expert-parallel rank's experts in one process (simulate_ep)."""
    import torch

    from amp_search.trial.model import build_layer

    layer = Layer(**MOE)
    m = build_layer(layer, simulate_tp_size=1, simulate_ep=2)
    assert len(m.mlp.experts) == 2
    assert sum(p.numel() for p in m.parameters()) == param_count(layer, 1, 2)
    y = m(torch.randn(2, layer.seq_length, layer.hidden_size))
    assert y.shape == (2, layer.seq_length, layer.hidden_size)


# ----------------------------------------------------------------------------- real trials

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("pp, dp, ep", [(2, 2, 2), (1, 4, 2)], ids=["pp2-ep2", "dp4-ep2"])
def test_real_moe_trial(tmp_path, pp, dp, ep):
    """configs/cpu-tiny-moe.yaml trained for real by DeepSpeed over gloo on 4 processes with
    the experts split over 2 expert-parallel ranks: the trial ends ok; the all-to-alls move,
    summed over the ranks, exactly what the cost model charges (each rank's n k token slots
    of h fp32 values, dispatched and combined, forward and backward, in every expert block
    of every micro-batch); and the ranks that hold the same experts (dp 4: ranks 0 and 2, 1
    and 3) end with the same expert weights, which only their reduced gradients give, while
    the two halves of the experts differ."""
    pytest.importorskip("deepspeed")
    import json
    import os
    import shutil

    from amp_search import LaunchOptions, load_spec, tune
    from amp_search.planner import estimate
    from cost_models import comm

    shutil.copy(ROOT / "configs" / "cpu-tiny-moe.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    strategy = estimate(spec, pp=pp, dp=dp, tmp=1, mbs=2, ep=ep).strategy
    options = LaunchOptions(iters=3, warmup=1, results_path=tmp_path / "results.sqlite",
                            runs_dir=tmp_path / "runs",
                            base_env={**os.environ, "OMP_NUM_THREADS": "1"})
    (rec,) = tune(spec, top_k=1, options=options, plan=[strategy]).records
    assert rec.status == "ok", (rec.error, rec.log_tail)
    assert rec.strategy.ep == ep
    result = json.loads(next((tmp_path / "runs").glob("*/result.json")).read_text())
    layers = spec.model.layers
    block = next(x for x in layers if x.is_moe)
    per_stage = [sum(layers[i].is_moe for i in range(a, b))
                 for a, b in zip(strategy.partition, strategy.partition[1:])]
    # dispatch (the tokens and their router weights) and combine, forward and backward
    message = sum(f(strategy.mbs * block.seq_length, block.moe_router_topk, block.hidden_size, 4)
                  for f in (comm.expert_dispatch_bytes, comm.expert_combine_bytes))
    expected = sum(2 * message * per_stage[j] * strategy.gas * dp for j in range(pp))
    sent = result["rank_all_to_all_per_iteration"]
    assert sum(r["bytes"] for r in sent) == expected
    assert all(r["calls"] == 4 * per_stage[a // dp] * strategy.gas for a, r in enumerate(sent))
    assert all(0 < r["to_others_bytes"] < r["bytes"] for r in sent)
    weights = result["rank_expert_weights_sum"]
    if dp == 4:
        assert weights[0] == pytest.approx(weights[2], rel=1e-9)
        assert weights[1] == pytest.approx(weights[3], rel=1e-9)
        assert weights[0] != pytest.approx(weights[1], rel=1e-6)


def test_experts_under_deepspeed_need_zero0_and_fp32():
    """Under the deepspeed backend a model with experts is planned with ZeRO 0 (a rule) in
    fp32 (the spec), what its trials can run; launch refuses the rest before starting."""
    import yaml

    from amp_search.errors import SpecError
    from amp_search.launch.orchestrator import preflight
    from amp_search.planner import estimate
    from amp_search.search_space import Candidate, Reason, SearchSpace, first_violation
    from amp_search.spec import parse_spec

    raw = yaml.safe_load((ROOT / "configs" / "cpu-tiny-moe.yaml").read_text())
    raw["training"]["zero_stage"] = "search"
    spec = parse_spec(raw)
    v = first_violation(SearchSpace.of(spec), Candidate.make(
        pp=1, dp=4, tmp=1, mbs=2, ep=2, zero_stage=1, recompute="none"))
    assert v is not None and v.reason == Reason.EXPERTS_WITH_ZERO_UNDER_DEEPSPEED
    assert "training.zero_stage: 0" in v.message
    assert first_violation(SearchSpace.of(spec), Candidate.make(
        pp=1, dp=4, tmp=1, mbs=2, ep=2, zero_stage=0, recompute="none")) is None
    one = estimate(spec, pp=1, dp=4, tmp=1, mbs=2, ep=2, zero_stage=0).strategy
    assert preflight(spec, one, "deepspeed") == ""
    assert "ZeRO 0 in fp32" in preflight(spec, replace(one, zero_stage=1), "deepspeed")
    raw["training"].update(zero_stage=0, precision="bf16")
    with pytest.raises(SpecError, match="training.precision"):
        parse_spec(raw)


def _reference_activation(a, mlp: str):
    """The activations written out independently of the trial's code: GELU, SwiGLU, and
    GPT-OSS's clamped quick-GEGLU (its reference implementation's swiglu with alpha 1.702,
    limit 7: the gate clamped above, the linear half to [-7, 7], (linear + 1) as the factor)."""
    import torch

    if mlp == "gelu":
        return torch.nn.functional.gelu(a)
    gate, up = a.chunk(2, dim=-1)
    if mlp == "swiglu":
        return torch.nn.functional.silu(gate) * up
    gate = torch.clamp(gate, max=7.0)
    up = torch.clamp(up, min=-7.0, max=7.0)
    return gate * torch.sigmoid(1.702 * gate) * (up + 1.0)


@pytest.mark.parametrize("fields", [MOE, LLAMA_MOE, GPT_OSS_MOE],
                         ids=["gelu", "swiglu", "quick-geglu"])
def test_an_expert_keeps_its_input_fc1_output_and_fc2_input_only(fields):
    """The router's weight is applied in the expert's activation (as megatron-core's grouped
    experts do), which keeps only its input and the weights: an expert saves for backward
    its input (h), fc1's output (F_e) and fc2's input (f_e) per row, and the weights, what
    cost_models.activations counts per routed copy; the layer sums the experts' outputs
    without keeping them."""
    import torch

    from amp_search.trial.model import _Expert

    layer = Layer(**fields)
    expert = _Expert(layer, torch.float32)
    with torch.no_grad():       # outputs past the quick-GEGLU's clamp at 7, to check it
        expert.fc1.weight.mul_(400.0)
    rows, h = 10, layer.hidden_size
    x = torch.randn(rows, h, requires_grad=True)
    w = torch.rand(rows, 1, requires_grad=True)
    storages = {}
    params = {p.untyped_storage().data_ptr() for p in expert.parameters()}

    def pack(t):
        if t.untyped_storage().data_ptr() not in params:       # the weights are held anyway
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = expert(x, w)
    saved = sum(storages.values())
    # GPT-OSS's quick-GEGLU keeps its clamped concatenation of fc1's output too
    clamped = layer.expert_fc1_width if layer.mlp == "quick_geglu" else 0
    per_row = h + layer.expert_fc1_width + clamped + layer.expert_ffn + 1
    assert saved == rows * per_row * 4
    # the weighted activation's gradients are those of act(fc1(x)) * w
    y.sum().backward()
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    a = expert.fc1(x2)
    if layer.mlp == "quick_geglu":
        assert (a.abs() > 7.0).any()            # the clamp is reached
    a = _reference_activation(a, layer.mlp)
    ref = torch.nn.functional.linear(a * w2, expert.fc2.weight)
    if expert.fc2.bias is not None:
        ref = ref + w2 * expert.fc2.bias
    ref.sum().backward()
    assert torch.allclose(y, ref, atol=1e-6)
    assert torch.allclose(x.grad, x2.grad, atol=1e-6)
    assert torch.allclose(w.grad, w2.grad, atol=1e-5)
