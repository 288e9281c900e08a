"""Context parallelism (cp): Megatron-LM's ring attention as a search dimension, in the spec,
the rules, the cost and memory model, the simulator's input, the table and the export."""
from __future__ import annotations

import json

import numpy as np
import pytest

from amp_search.costing import CostModel
from amp_search.errors import Infeasible, SpecError, UsageError
from amp_search.export import export_strategy
from amp_search.launch.orchestrator import preflight
from amp_search.placement import device_orders
from amp_search.planner import estimate, plan
from amp_search.records import Strategy
from amp_search.search_space import Candidate, Reason, SearchSpace, first_violation
from amp_search.spec import CONTEXT_PARALLEL_SEARCH, parse_spec
from amp_search.trial.ranks import assign_ranks
from cost_models import comm
from cost_models.compute import (DeviceSpeed, analytic_layer_time, attention_time_s,
                                  gemm_time_s)
from cost_models.layers import (attention_core_flops, cp_merge_bytes_by_pass,
                                kv_elements_per_token)


def _spec(cp=1, backend="megatron", seq=8192, count=2, gbs=64, attention="auto", **training):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": count, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "8 x 400 Gbps"}]},
        "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": seq},
        "training": {"global_batch_size": gbs, "precision": "bf16", "backend": backend,
                     "zero_stage": 1, "activation_checkpointing": "none",
                     "context_parallel": cp, "attention": attention, **training}})


def test_spec_key():
    assert _spec().training.context_parallel == (1,)
    assert _spec(cp=4).training.context_parallel == (4,)
    assert _spec(cp=[4, 1, 2]).training.context_parallel == (1, 2, 4)
    assert _spec(cp="search").training.context_parallel == CONTEXT_PARALLEL_SEARCH
    # not given: searched under Megatron-LM (as its virtual stages are), none under DeepSpeed
    # (the trial engine has no ring attention)
    raw = {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                                  "intra_node_bandwidth": "450 GB/s"}]},
           "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 8192},
           "training": {"global_batch_size": 8, "precision": "bf16"}}
    assert parse_spec(raw).training.context_parallel == (1,)
    raw["training"]["backend"] = "megatron"
    assert parse_spec(raw).training.context_parallel == CONTEXT_PARALLEL_SEARCH
    both = parse_spec({**raw, "training": {"global_batch_size": 8, "precision": "bf16"}})
    assert {s.training.backend: s.training.context_parallel for s in both.backends()} == {
        "deepspeed": (1,), "megatron": CONTEXT_PARALLEL_SEARCH}
    for bad in (0, -2, "two", True, 1.5, [], [2, 2], 5000):
        with pytest.raises(SpecError) as err:
            _spec(cp=bad)
        assert str(err.value).startswith("training.context_parallel") and \
            "search" in str(err.value)


def _violation(space, **kw):
    base = dict(pp=2, dp=2, tmp=2, mbs=1, zero_stage=1, recompute="none", cp=2)
    v = first_violation(space, Candidate.make(**{**base, **kw}))
    return None if v is None else v.reason


def test_rules():
    space = SearchSpace.of(_spec(cp=2))
    assert _violation(space) is None
    assert _violation(SearchSpace.of(_spec(cp=2, backend="deepspeed"))) == \
        Reason.CONTEXT_PARALLEL_UNDER_DEEPSPEED
    # 2 cp chunks per rank: the sequence divisible by 2 cp
    assert _violation(SearchSpace.of(_spec(seq=8194)), cp=3) == \
        Reason.SEQUENCE_NOT_DIVISIBLE_BY_CP
    # sequence parallelism splits a cp rank's s/cp tokens over tmp
    assert _violation(SearchSpace.of(_spec(seq=40)), cp=4, tmp=4, dp=1,
                      sequence_parallel=True) == Reason.SEQUENCE_NOT_DIVISIBLE_BY_CP
    assert _violation(SearchSpace.of(_spec(attention="standard"))) == \
        Reason.CONTEXT_PARALLEL_WITH_STANDARD_ATTENTION
    with pytest.raises(Infeasible, match="ring attention"):
        estimate(_spec(backend="deepspeed"), pp=2, dp=2, tmp=2, mbs=1, cp=2)
    with pytest.raises(UsageError, match=r"pp\*dp\*cp\*tmp = 2\*2\*2\*2 = 16, but"):
        estimate(_spec(count=4), pp=2, dp=2, tmp=2, mbs=1, cp=2)


def test_cp_splits_the_work_of_a_layer():
    layer = _spec().model.layers[1]
    dev = DeviceSpeed(peak_flops_per_s=989e12, memory_bandwidth_bytes_per_s=3.35e12)
    one = analytic_layer_time(layer, tmp=1, mbs=1, device=dev, bytes_per_element=2)
    two = analytic_layer_time(layer, tmp=1, mbs=1, device=dev, bytes_per_element=2, cp=2)
    # half the tokens; GEMMs half the size run a little less efficiently
    assert 0.5 * one.forward_s < two.forward_s < 0.52 * one.forward_s
    kw = dict(tmp=1, mbs=1, device=dev, bytes_per_element=2, attention="flash")
    # the ring's cp steps each run the core on one K/V chunk: cp calls of 1/cp^2 each, a
    # little slower than half the whole core, as each small call pays its fixed cost
    whole = attention_time_s(layer, **kw)
    assert attention_time_s(layer, **kw, cp=2) == pytest.approx(
        2 * gemm_time_s(attention_core_flops(layer, 1) / 4, dev))
    assert whole / 2 < attention_time_s(layer, **kw, cp=2) < 1.01 * whole / 2
    assert attention_time_s(layer, **kw, cp=8) > attention_time_s(layer, **kw, cp=2) / 4
    # Llama 3 8B: 8 key/value heads of 128, split over tmp, one per rank at least
    assert kv_elements_per_token(layer, 1) == 2 * 8 * 128
    assert kv_elements_per_token(layer, 4) == 2 * 2 * 128
    assert kv_elements_per_token(layer, 16) == 2 * 1 * 128
    assert kv_elements_per_token(_spec().model.layers[0], 1) == 0


def test_the_rings_merges_move_their_partial_outputs_and_gradients(monkeypatch):
    """Transformer Engine's ring attention merges its cp steps' partial outputs after the
    ring and adds each step's dq, dK and dV to the running sums (cp_merge_bytes_by_pass):
    g (2 + 2.25 (cp - 1)) per element of the rank's output forward, of q and K/V backward,
    and the K/V copied once into the ring's buffer. Llama 3 8B at s 8192, cp 4, tmp 2:
    2,048 tokens, 2,048 query and 1,024 key/value elements each. Nothing without cp; the
    layer's memory-bound time grows by exactly these bytes at the device's bandwidth."""
    layer = _spec().model.layers[1]
    t, q, kv, g = 8192 / 4, 32 * 128 / 2, 2 * 8 * 128 / 2, 2
    fwd, bwd = cp_merge_bytes_by_pass(layer, 2, 4, g)
    assert fwd == pytest.approx(g * t * q * (2 + 2.25 * 3))
    assert bwd == pytest.approx(g * t * ((q + kv) * (2 + 2.25 * 3) + 2 * kv))
    assert cp_merge_bytes_by_pass(layer, 2, 1, g) == (0.0, 0.0)
    assert cp_merge_bytes_by_pass(_spec().model.layers[0], 2, 4, g) == (0.0, 0.0)
    dev = DeviceSpeed(peak_flops_per_s=989e12, memory_bandwidth_bytes_per_s=3.35e12)
    kw = dict(tmp=2, mbs=3, device=dev, bytes_per_element=g, framework="megatron", cp=4)
    with_merges = analytic_layer_time(layer, **kw)
    import cost_models.compute as compute

    monkeypatch.setattr(compute, "cp_merge_bytes_by_pass", lambda *a: (0.0, 0.0))
    without = analytic_layer_time(layer, **kw)
    assert with_merges.forward_s - without.forward_s == pytest.approx(3 * fwd / 3.35e12)
    assert with_merges.backward_s - without.backward_s == pytest.approx(3 * bwd / 3.35e12)


def test_selective_recomputation_of_the_core_reruns_the_ring(monkeypatch):
    """Megatron-LM checkpoints its core attention, which under cp is Transformer Engine's whole
    ring: selective recomputation (core_attn) runs its transfers again inside the backward
    (a forward ring pass charged to pass 1) and its merges (the forward's
    cp_merge_bytes_by_pass at memory bandwidth). Not without cp, with full recomputation
    (its own forward pass), or where the modules do not name the core."""
    spec = _spec(cp=2, count=1, activation_checkpointing="selective")
    model = CostModel(spec)
    order = device_orders(spec.cluster, spec.training.precision)[0]
    kw = dict(pp=1, dp=2, tmp=2, mbs=1, zero_stage=1, cp=2, sequence_parallel=True)
    sel, none = Candidate.make(recompute="selective", **kw), Candidate.make(recompute="none",
                                                                               **kw)
    assert model.recomputes_ring(sel) and not model.recomputes_ring(none)
    assert not model.recomputes_ring(Candidate.make(recompute="full", **kw))
    assert not model.recomputes_ring(Candidate.make(recompute="selective", **{**kw, "cp": 1}))
    moe_act = CostModel(_spec(cp=2, count=1, activation_checkpointing="selective",
                              recompute_modules=["layernorm"]))
    assert not moe_act.recomputes_ring(sel)
    layout = model.layout(sel, order)
    ring = model.cp_time_s(none, layout, part=0)
    assert ring.sum() > 0
    assert model.cp_time_s(sel, layout, part=1) == pytest.approx(
        model.cp_time_s(none, layout, part=1) + ring)
    gpu = spec.cluster.devices[0].gpu
    merges = np.array([cp_merge_bytes_by_pass(x, 2, 2, 2)[0] for x in spec.model.layers])
    bw = gpu.memory_bandwidth_bytes_per_s
    with_merges = model._knob_time(gpu, sel)
    import amp_search.costing.cost_model as cm

    monkeypatch.setattr(cm, "cp_merge_bytes_by_pass", lambda *a: (0.0, 0.0))
    without = CostModel(spec)._knob_time(gpu, sel)
    assert with_merges - without == pytest.approx(merges / bw)


def test_ring_time_by_hand():
    bw, lat = 100e9, 5e-6
    step = 1e9 / bw + lat                                    # 1 GB of K/V per step
    assert comm.context_parallel_ring_time_s(1e9, 1, 0.0, bw, lat) == 0.0
    assert comm.context_parallel_ring_time_s(1e9, 4, 0.0, bw, lat) == pytest.approx(3 * step)
    # each step hides up to a quarter of the core
    assert comm.context_parallel_ring_time_s(1e9, 4, 0.02, bw, lat) == pytest.approx(
        3 * (step - 0.005))
    assert comm.context_parallel_ring_time_s(1e9, 4, 1.0, bw, lat) == 0.0
    # backward: K/V and their gradients, twice the bytes per step
    assert comm.context_parallel_ring_time_s(1e9, 2, 0.0, bw, lat, backward=True) == \
        pytest.approx(2e9 / bw + lat)


def test_cp_halves_activation_memory_and_keeps_the_states():
    spec = _spec(cp=[1, 2], gbs=256)
    d = estimate(spec, pp=2, dp=4, tmp=2, mbs=1, cp=1, partition="uniform")
    c = estimate(spec, pp=2, dp=2, tmp=2, mbs=1, cp=2, partition="uniform")
    for m1, m2 in zip(d.memory, c.memory):
        assert m2.activation_bytes == pytest.approx(m1.activation_bytes / 2, rel=0.01)
        assert (m2.parameter_bytes, m2.gradient_bytes) == (m1.parameter_bytes,
                                                           m1.gradient_bytes)
        # the distributed optimizer shards over dp x cp = 4 ranks either way
        assert m2.optimizer_bytes == m1.optimizer_bytes
    assert c.strategy.cp == 2 and c.strategy.num_devices == 16
    assert c.strategy.gas == 256 // 2 and d.strategy.gas == 256 // 4


def test_placement_puts_a_replicas_cp_ranks_side_by_side_and_ranks_follow_megatron():
    spec = _spec(cp=2)
    model = CostModel(spec)
    c = Candidate.make(pp=2, dp=2, tmp=2, mbs=1, zero_stage=1, recompute="none", cp=2)
    e = model.evaluate(c, device_orders(spec.cluster, "bf16")[0], partition="uniform")
    placement = np.array(e.strategy.placement)
    assert placement.shape == (2, 4, 2)                     # (stage, dp x cp, tmp)
    # stage 0: replica d * cp + c on devices 0-7, tensor ranks fastest, then cp, then dp
    assert placement[0].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    layout = model.layout(c, placement=placement)
    bw, crosses = layout.cp_links
    from amp_search.spec import link_kinds
    share = link_kinds()["nvlink"].achievable_share
    assert not crosses.any() and np.allclose(bw, 450e9 * share)  # cp rings inside a node
    nodes = {d.id: (d.node, d.local_rank) for d in spec.cluster.devices}
    ranks = assign_ranks(e.strategy, nodes, {0: "a", 1: "b"})
    # Megatron's order tp-cp-dp-pp: rank = ((stage * dp + d) * cp + c) * tmp + t
    assert [a.device for a in ranks] == list(range(16))
    s = e.strategy
    assert Strategy.from_dict(json.loads(json.dumps(s.to_dict()))) == s
    assert s.label().endswith("-cp2")


def test_cp_is_searched_shown_exported_and_simulated(tmp_path):
    spec = _spec(cp="search", seq=32768, gbs=16)
    p = plan(spec, simulate_top=4)
    cps = {e.strategy.cp for e in p.strategies}
    assert 1 in cps and len(cps) > 1
    best = next(e for e in p.strategies if e.strategy.cp > 1)
    assert best.simulated and best.iteration_time_s == pytest.approx(
        best.analytic_iteration_time_s, rel=0.2)
    ex = export_strategy(spec, best.strategy, fmt="megatron", estimate=best, iters=10,
                         warmup=5)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    assert args[args.index("--context-parallel-size") + 1] == str(best.strategy.cp)
    reason = preflight(spec, best.strategy, "deepspeed")
    assert "context parallelism" in reason and "\n" not in reason
    with pytest.raises(UsageError) as err:
        export_strategy(spec, best.strategy, fmt="deepspeed", estimate=best)
    assert "ring attention" in str(err.value)


def test_cli_plan_has_a_cp_column_and_estimate_takes_cp(write_spec, capsys):
    from amp_search.cli import main

    path = write_spec(_raw(cp="search"))
    assert main(["plan", str(path), "--top-k", "30", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.lstrip().startswith("rank"))
    assert head.split()[:6] == ["rank", "pp", "dp", "tmp", "cp", "mbs"]
    assert "cp: context-parallel ranks per sequence" in out
    assert main(["estimate", str(path), "--pp", "2", "--dp", "2", "--tp", "2", "--cp", "2",
                 "--mbs", "1", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[1:6] == ["2", "2", "2", "2", "1"]


def _raw(cp):
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "3200 Gbps"}]},
            "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 32768},
            "training": {"global_batch_size": 16, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 1, "context_parallel": cp}}
