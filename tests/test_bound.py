"""The search's branch and bound: the lower bounds hold, and the kept plans are exactly what a
search of every candidate ranks first."""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest

from amp_search import load_spec, plan, planner
from amp_search.spec import parse_spec
from amp_search.costing import CostModel
from amp_search.placement import device_orders
from amp_search.planner import KEEP
from amp_search.search_space import (Reason, SearchSpace, check_batch_has_a_degree,
                                     enumerate_candidates)
from cost_models.pipeline import (StageCostArrays, interleaved_iteration,
                                  iteration_lower_bound_s, one_f_one_b_iteration)
from conftest import ROOT


def splits(L: int, pp: int):
    for cut in itertools.combinations(range(1, L), pp - 1):
        yield (0, *cut, L)


def arrays(rng, pp: int, L: int) -> StageCostArrays:
    layer = rng.uniform(0.5, 2.0, L)[None, :] * rng.uniform(1.0, 3.0, pp)[:, None]
    return StageCostArrays(
        layer_s=layer, tensor_parallel_s=0.1 * layer,
        cut_s=rng.uniform(0.0, 0.3, (pp, L + 1)), sync_s=rng.uniform(0.0, 0.2, (pp, L)),
        sync_fixed_s=rng.uniform(0.0, 0.1, pp), optimizer_s=rng.uniform(0.0, 0.05, (pp, L)),
        microbatch_overhead_s=0.05, step_overhead_s=0.2)


@pytest.mark.parametrize("seed", range(6))
def test_closed_form_bound_is_below_every_split(seed):
    rng = np.random.default_rng(seed)
    pp, L, gas = 3, 7, int(rng.integers(1, 9))
    costs = arrays(rng, pp, L)
    for share in (0.0, 0.5, 1.0):
        best = min(one_f_one_b_iteration(costs, b, gas, blocking_share=share).iteration_s
                   for b in splits(L, pp))
        bound = iteration_lower_bound_s(
            costs.layer_s, gas, microbatch_overhead_s=costs.microbatch_overhead_s,
            step_overhead_s=costs.step_overhead_s, after_layer_s=costs.sync_s,
            after_fixed_s=costs.sync_fixed_s)
        assert bound <= best * (1 + 1e-12)
        assert bound > 0.5 * best          # and not a trivial one


@pytest.mark.parametrize("seed", range(4))
def test_interleaved_bound_is_below_every_chunking(seed):
    rng = np.random.default_rng(100 + seed)
    pp, v, L, gas = 2, 2, 8, 4
    costs = arrays(rng, pp, L)
    times = [interleaved_iteration(costs, b, gas, pp, v, blocking_share=0.5).iteration_s
             for b in splits(L, pp * v)]
    bound = iteration_lower_bound_s(costs.layer_s, gas, v,
                                    microbatch_overhead_s=costs.microbatch_overhead_s,
                                    step_overhead_s=costs.step_overhead_s)
    assert bound <= min(times) * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_device_type_bound_holds_for_every_assignment(seed):
    """Before a placement the rows are device types: for every way of forming pp stages of
    equal size from the devices (a stage at its slowest type's pace), the bound holds."""
    rng = np.random.default_rng(200 + seed)
    L, gas, pp = 6, 3, 3
    types = rng.uniform(0.5, 2.0, L)[None, :] * np.array([[1.0], [1.7], [2.9]]) \
        + rng.uniform(0.0, 0.2, (3, L))
    devices = np.array([2, 3, 1])                        # 6 devices, stages of 2
    bound = iteration_lower_bound_s(types, gas, type_devices=devices, devices_per_stage=2)
    ids = np.repeat(np.arange(3), devices)
    best = np.inf
    for perm in set(itertools.permutations(ids.tolist())):
        stages = [perm[2 * j:2 * j + 2] for j in range(pp)]
        rows = np.stack([types[list(s)].max(axis=0) for s in stages])
        zero = StageCostArrays(layer_s=rows, tensor_parallel_s=0 * rows,
                               cut_s=np.zeros((pp, L + 1)), sync_s=0 * rows,
                               sync_fixed_s=np.zeros(pp), optimizer_s=0 * rows,
                               microbatch_overhead_s=0.0, step_overhead_s=0.0)
        best = min(best, min(one_f_one_b_iteration(zero, b, gas, blocking_share=1.0)
                             .iteration_s for b in splits(L, pp)))
    assert bound <= best * (1 + 1e-12)


SPECS = ["amp-hetero-gpt2.yaml", "mixed-h100-a100-gpt13b.yaml", "h100-llama3-70b.yaml",
         "cpu-tiny-moe.yaml"]


def slow_network_spec(widths: tuple[int, ...], backend: str) -> dict:
    """Nodes of several widths on slow networks (the P2P and data-parallel floors' NIC
    sharing and node-crossing rules matter most there)."""
    gpus = ("V100-16GB", "T4-16GB", "A100-40GB")
    return {"cluster": {"nodes": [
        {"gpu": gpus[i % 3], "count": 2, "gpus_per_node": w, "intra_node_bandwidth": "170 Gbps",
         "inter_node_bandwidth": f"{10 * (i + 1)} Gbps"} for i, w in enumerate(widths)]},
        "model": {"preset": "gpt", "hidden_size": 1024, "num_attention_heads": 16,
                  "num_layers": 24, "seq_length": 1024, "vocab_size": 52256},
        "training": {"global_batch_size": 32, "precision": "fp16", "backend": backend,
                     "zero_stage": 0, "activation_checkpointing": "none",
                     "sequence_parallel": False}}


@pytest.mark.parametrize("name", SPECS + ["slow:8,4:deepspeed", "slow:4,2,8:megatron",
                                          "slow:16:deepspeed", "slow:8,8:deepspeed",
                                          "slow:4,4,4:megatron"])
def test_every_bound_is_below_the_cost(name):
    """CostModel.lower_bound_s, without a placement, on each placement order, and with the
    partition DP, never exceeds what evaluate() gives (every candidate of the search)."""
    if name.startswith("slow:"):
        _, widths, backend = name.split(":")
        spec = parse_spec(slow_network_spec(tuple(map(int, widths.split(","))), backend))
    else:
        spec = load_spec(ROOT / "configs" / name)
    for s in spec.backends():
        model = CostModel(s)
        space = SearchSpace.of(s)
        pruned = Counter()
        candidates = enumerate_candidates(space, pruned)
        check_batch_has_a_degree(space, candidates, pruned)
        orders = device_orders(s.cluster, s.training.precision)
        for c in candidates[::max(1, len(candidates) // 150)]:
            times = []
            for o in orders:
                t = model.evaluate(c, o, with_memory=False).iteration_time_s
                times.append(t)
                assert model.lower_bound_s(c, o) <= t * (1 + 1e-9), (c, o.name)
                assert model.lower_bound_s(c, o, split=True) <= t * (1 + 1e-9), (c, o.name)
            assert model.lower_bound_s(c) <= min(times) * (1 + 1e-9), c


def amp_mix_part(v100_nodes: int, t4_nodes: int) -> dict:
    """AMP's V100 + T4 mix of benchmarks/search_time.py (16-GPU nodes; the T4 nodes' network
    5x the V100 nodes'), `v100_nodes` and `t4_nodes` of it."""
    return {"cluster": {"nodes": [
        {"gpu": "V100-16GB", "count": v100_nodes, "gpus_per_node": 16,
         "intra_node_bandwidth": "170 Gbps", "inter_node_bandwidth": "10 Gbps"},
        {"gpu": "T4-16GB", "count": t4_nodes, "gpus_per_node": 16,
         "intra_node_bandwidth": "50 Gbps", "inter_node_bandwidth": "50 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 24, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 52256},
        "training": {"global_batch_size": 32, "precision": "fp16", "backend": "deepspeed",
                     "activation_checkpointing": "none", "zero_stage": 0,
                     "sequence_parallel": False}}


@pytest.mark.parametrize("nodes, layout", [((12, 1), (26, 2, 4, 1)), ((12, 1), (13, 4, 4, 1)),
                                           ((4, 1), (5, 4, 4, 2))])
def test_the_bound_before_a_placement_charges_each_boundary_its_own_nodes_network(nodes,
                                                                                    layout):
    """A stage boundary between nodes pays the slower node's network, and a pipeline pays
    at least its mean stage's P2P in every steady-state micro-batch, before any placement:
    on a part of AMP's mix with one fast-network T4 node among slow V100 nodes, the bound
    without a placement is within 10% of the least placed one (it was 0.56-0.66 of it when
    every boundary was charged the T4 node's network), and still below it."""
    spec = parse_spec(amp_mix_part(*nodes))
    model = CostModel(spec)
    c = next(c for c in enumerate_candidates(SearchSpace.of(spec), Counter())
             if (c.pp, c.dp, c.tmp, c.mbs) == layout)
    placed = min(model.lower_bound_s(c, o) for o in device_orders(spec.cluster, "fp16"))
    assert 0.9 * placed <= model.lower_bound_s(c) <= placed * (1 + 1e-9)


def same(a, b):
    return [(e.strategy, e.iteration_time_s, e.memory, e.backend) for e in a]\
        == [(e.strategy, e.iteration_time_s, e.memory, e.backend) for e in b]


@pytest.mark.parametrize("name", ["amp-hetero-gpt2.yaml", "mixed-h100-a100-gpt13b.yaml",
                                  "a100-gpt7b.yaml", "slow:4,4:megatron"])
@pytest.mark.parametrize("bound_above", [0, planner.BOUND_ABOVE])
def test_kept_plans_are_the_exhaustive_ranking(name, bound_above, monkeypatch):
    """The bounded search keeps a prefix of the exhaustive ranking: its first KEEP layouts
    and the plans within keep_within of the best, the same strategies, times and memory;
    with the simulation's re-rank the same top too; and it costs fewer placements. Small
    searches cost every candidate and keep the same (bound_above: 0 bounds every search).
    The megatron spec searches virtual stages (1, 2, 3, 4, 6 and 8 for its 24 blocks; 2,
    3, 4 and 6 fit its 16 devices and batch), whose settings of one layout the bounded
    search drops once one of them is costed faster, and whose memory it checks first."""
    monkeypatch.setattr(planner, "BOUND_ABOVE", bound_above)
    if name.startswith("slow:"):
        _, widths, backend = name.split(":")
        spec = parse_spec(slow_network_spec(tuple(map(int, widths.split(","))), backend))
        assert len(spec.training.virtual_pipeline_stages) == 6
    else:
        spec = load_spec(ROOT / "configs" / name)
    for s in spec.backends():
        full = plan(s, simulate_top=0, keep=None)
        if name.startswith("slow:"):        # the interleaved schedule is among the kept plans
            assert any(e.strategy.virtual_stages > 1 for e in full.strategies[:KEEP])
        for keep, within in ((KEEP, 1.0), (5, 1.3)):
            part = plan(s, simulate_top=0, keep=keep, keep_within=within)
            n = len(part.strategies)
            assert same(part.strategies, full.strategies[:n])
            assert n >= min(keep, len(full.strategies))
            limit = full.best.iteration_time_s * within
            assert all(e.iteration_time_s > limit for e in full.strategies[n:])
            if n < len(full.strategies):
                assert part.pruned[Reason.SLOWER_THAN_KEPT.value] > 0
                assert part.evaluated <= full.evaluated
                if full.evaluated > bound_above:
                    assert part.evaluated < full.evaluated
        simulated = plan(s)
        assert same(simulated.strategies[:KEEP], plan(s, keep=None).strategies[:KEEP])


def test_fewer_layouts_than_kept_is_exhaustive():
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    full, part = plan(spec, keep=None), plan(spec, keep=10**6)
    assert same(part.strategies, full.strategies)
    assert Reason.SLOWER_THAN_KEPT.value not in part.pruned


def test_bound_with_measured_links_and_zero_sized_layers():
    """The floor of the tensor-parallel collectives uses the cluster's best link, measured or
    not; a model whose first layer costs nothing still gets a finite bound."""
    spec = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    model = CostModel(spec)
    space = SearchSpace.of(spec)
    c = next(c for c in enumerate_candidates(space, Counter()) if c.tmp > 1 and c.pp > 1)
    assert np.all(model.tp_floor_s(c) >= 0)
    b = model.lower_bound_s(c)
    assert np.isfinite(b) and b > 0
    rows = np.array([[0.0, 1.0, 2.0], [0.0, 2.0, 4.0]])
    assert iteration_lower_bound_s(rows, 2) == pytest.approx(3.0 / (1 + 0.5) + 3.0)
    assert iteration_lower_bound_s(np.zeros((2, 3)), 4, step_overhead_s=0.5) == 0.5


def test_fixed_split_memory_is_evaluates():
    """Where the split is fixed (virtual stages; the Megatron baseline's uniform split), the
    memory checked before the time is the one evaluate() gives."""
    spec = load_spec(ROOT / "configs" / "h100-llama3-70b.yaml")
    model = CostModel(spec)
    space = SearchSpace.of(spec)
    orders = device_orders(spec.cluster, spec.training.precision)
    checked = Counter()
    for c in enumerate_candidates(space, Counter())[::7]:
        for o in orders:
            e = model.evaluate(c, o)
            if c.virtual_stages > 1:
                assert model.split_fits(c, o, e.strategy.partition) == e.fits
                checked[e.fits] += 1
        if c.virtual_stages > 1:
            assert model.fits_nowhere(c, orders) == (not any(
                model.evaluate(c, o).fits for o in orders))
        else:
            assert not model.fits_nowhere(c, orders)
    assert checked[True] and checked[False]
