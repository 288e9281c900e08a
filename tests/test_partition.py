"""Pipeline layer assignment (amp_search.partition): exactness against brute force and an
independent reference, for eq. 5 alone and for the full objective (eq. 5 + data-parallel
sync, under memory budgets), numba vs plain Python, hand-checked cases, uniform splits, bad
input."""
from __future__ import annotations

import itertools
import types

import numpy as np
import pytest

from amp_search import partition_kernels
from amp_search.partition import (
    PartitionResult,
    optimal_partition,
    pipeline_objective,
    uniform_partition,
)

RTOL = 1e-9


def brute_force(times, cuts, gas):
    """min of eq. 5 over all C(L-1, pp-1) boundary sets, and every boundary set reaching it."""
    pp, L = times.shape
    scored = [
        (pipeline_objective(times, cuts, gas, (0, *inner, L)), (0, *inner, L))
        for inner in itertools.combinations(range(1, L), pp - 1)
    ]
    best = min(v for v, _ in scored)
    return best, {b for v, b in scored if v <= best * (1 + RTOL)}


def min_over_cap(times, cuts, gas):
    """Independent exact reference: min over every stage time M of (gas-1)*M + f(M), with
    f(M) = min sum_j (T_j + cut_j) s.t. all T_j <= M by a plain O(pp L^2) DP in numpy."""
    pp, L = times.shape
    prefix = np.concatenate([np.zeros((pp, 1)), np.cumsum(times, axis=1)], axis=1)
    seg = prefix[:, None, :] - prefix[:, :, None]  # seg[j, a, b]: layers [a, b) on stage j
    valid = np.triu(np.ones((L + 1, L + 1), dtype=bool), 1)  # a < b
    best = np.inf
    for cap in np.unique(seg[:, valid]):
        cost = np.where(valid[0] & (seg[0, 0] <= cap), seg[0, 0], np.inf)  # cost[b], stage 0
        for j in range(1, pp):
            total = cost[:, None] + cuts[j][:, None] + seg[j]  # [a, b]: stage j is [a, b)
            total[~valid | (seg[j] > cap)] = np.inf
            cost = total.min(axis=0)
        best = min(best, (gas - 1) * cap + cost[L])
    return best


def random_instance(rng, L, pp, kind):
    """Heterogeneous stages: base layer times scaled by a per-stage speed factor."""
    if kind == "ties":  # few distinct layer times, speed ratios 1:2, equal cuts
        base = rng.integers(1, 3, size=L).astype(float)
        times = np.outer(rng.choice([1.0, 2.0], size=pp), base)
        cuts = np.zeros((pp, L + 1))
        cuts[1:, 1:L] = rng.choice([0.0, 0.5])
    else:
        base = rng.uniform(0.1, 1.0, size=L)
        times = np.outer(rng.uniform(0.5, 3.0, size=pp), base)
        times += rng.uniform(0.0, 0.05, size=(pp, L))
        cuts = np.zeros((pp, L + 1))
        cuts[1:, 1:L] = rng.uniform(0.0, 0.5, size=(pp - 1, L - 1))
    return times, cuts


def small_instances(kind, count=150, seed=0):
    rng = np.random.default_rng([seed, ["hetero", "ties"].index(kind)])
    for _ in range(count):
        L = int(rng.integers(1, 11))
        pp = int(rng.integers(1, L + 1))
        gas = int(rng.integers(1, 9))
        yield (*random_instance(rng, L, pp, kind), gas)


def check_result(r: PartitionResult, times, cuts, gas):
    pp, L = times.shape
    assert len(r.boundaries) == pp + 1 and r.boundaries[0] == 0 and r.boundaries[-1] == L
    assert all(a < b for a, b in zip(r.boundaries, r.boundaries[1:]))
    assert all(isinstance(b, int) for b in r.boundaries)
    # the returned boundaries achieve the returned objective and stage times
    assert r.objective_s == pytest.approx(pipeline_objective(times, cuts, gas, r.boundaries),
                                          rel=1e-12)
    expect_t = [times[j, a:b].sum() for j, (a, b) in enumerate(zip(r.boundaries, r.boundaries[1:]))]
    assert r.stage_time_s == pytest.approx(expect_t, rel=1e-12)


@pytest.mark.parametrize("use_numba", [True, False], ids=["numba", "python"])
@pytest.mark.parametrize("kind", ["hetero", "ties"])
def test_matches_brute_force(kind, use_numba):
    for times, cuts, gas in small_instances(kind):
        best, argmins = brute_force(times, cuts, gas)
        r = optimal_partition(times, cuts, gas, use_numba=use_numba)
        check_result(r, times, cuts, gas)
        assert r.objective_s == pytest.approx(best, rel=RTOL), (times, cuts, gas)
        assert r.boundaries in argmins


@pytest.mark.parametrize("kind", ["hetero", "ties"])
def test_numba_and_python_agree(kind):
    for times, cuts, gas in small_instances(kind, seed=1):
        fast = optimal_partition(times, cuts, gas, use_numba=True)
        slow = optimal_partition(times, cuts, gas, use_numba=False)
        assert fast == slow


def test_python_mode_is_plain_python():
    # use_numba=False must not call back into compiled kernels
    for name in ("solve", "_optimal_boundaries", "_min_inner_objective",
                 "_capped_min_sum_by_axis", "_capped_min_sum", "_suffix_bound",
                 "_min_bottleneck", "_trace"):
        fn = partition_kernels.PYTHON_TWINS[name]
        assert isinstance(fn, types.FunctionType)
        assert fn.__globals__ is partition_kernels.PYTHON_TWINS


@pytest.mark.parametrize(
    "L, pp, gas, speeds, seed",
    [
        (24, 2, 2, "hetero", 0),
        (30, 4, 3, "hetero", 1),
        (40, 5, 8, "hetero", 2),
        (40, 6, 2, "ratio2", 3),  # gas-1 == speed ratio - 1: a nearly flat frontier
        (32, 8, 2, "ratio2", 4),
        (36, 3, 64, "hetero", 5),
        (14, 14, 4, "hetero", 6),
    ],
)
def test_matches_reference_on_longer_chains(L, pp, gas, speeds, seed):
    rng = np.random.default_rng(seed)
    base = np.r_[0.3, rng.uniform(0.9, 1.1, size=L - 2), 2.6]  # embedding, blocks, head
    speed = rng.uniform(1.0, 3.0, pp) if speeds == "hetero" else rng.choice([1.0, 2.0], pp)
    times = np.outer(speed, base)
    cuts = np.zeros((pp, L + 1))
    cuts[1:, 1:L] = rng.uniform(0.0, 0.2, size=(pp - 1, 1))
    expect = min_over_cap(times, cuts, gas)
    for use_numba in (True, False):
        r = optimal_partition(times, cuts, gas, use_numba=use_numba)
        check_result(r, times, cuts, gas)
        assert r.objective_s == pytest.approx(expect, rel=RTOL)


def test_slow_stage_gets_fewer_layers():
    # 6 equal layers, stage 1 twice as slow: uniform 3+3 gives T = (3, 6)
    times = np.array([[1.0] * 6, [2.0] * 6])
    cuts = np.zeros((2, 7))
    uniform = uniform_partition(6, 2)
    assert uniform == (0, 3, 6)
    r = optimal_partition(times, cuts, gas=8)
    assert r.boundaries == (0, 4, 6) and r.stage_time_s == (4.0, 4.0)
    assert r.objective_s == 7 * 4 + 8 == 36.0
    assert pipeline_objective(times, cuts, 8, uniform) == 7 * 6 + 9 == 51.0
    # with a single micro-batch only sum_j T_j counts: load the fast stage
    r1 = optimal_partition(times, cuts, gas=1)
    assert r1.boundaries == (0, 5, 6) and r1.objective_s == 7.0


def test_huge_head_moves_blocks_forward():
    # embedding 0.5, 6 blocks of 1, head of 4, identical stages
    times = np.tile([0.5, 1, 1, 1, 1, 1, 1, 4.0], (2, 1))
    cuts = np.zeros((2, 9))
    uniform = uniform_partition(8, 2, first=1, last=1)
    assert uniform == (0, 4, 8)  # T = (3.5, 7)
    r = optimal_partition(times, cuts, gas=4)
    assert r.boundaries == (0, 6, 8) and r.stage_time_s == (5.5, 5.0)
    assert r.objective_s == 3 * 5.5 + 10.5 == 27.0
    assert pipeline_objective(times, cuts, 4, uniform) == 3 * 7 + 10.5


def test_cut_costs_change_the_answer():
    times = np.ones((2, 6))
    cuts = np.zeros((2, 7))
    assert optimal_partition(times, cuts, gas=4).boundaries == (0, 3, 6)
    cuts[1, 3] = 5.0  # an expensive activation right after layer 2 (e.g. a wide layer)
    r = optimal_partition(times, cuts, gas=4)
    assert r.boundaries in {(0, 2, 6), (0, 4, 6)}
    assert r.objective_s == 3 * 4 + 6 == 18.0
    # a cheap cut point attracts the boundary even against balance
    cuts[1, :] = 1.5
    cuts[1, 2] = 0.0
    r = optimal_partition(times, cuts, gas=2)
    assert r.boundaries == (0, 2, 6) and r.objective_s == 4 + 6 + 0 == 10.0


def test_ignored_cut_entries():
    rng = np.random.default_rng(3)
    times, cuts = random_instance(rng, 9, 3, "hetero")
    noisy = cuts.copy()
    noisy[0, :] = np.nan  # row 0: stage 0 has no predecessor
    noisy[:, 0] = noisy[:, 9] = 1e9  # no stage starts at 0 (except stage 0) or at L
    assert optimal_partition(times, noisy, 3) == optimal_partition(times, cuts, 3)


def test_single_stage_and_one_layer_per_stage():
    times = np.array([[1.0, 2.0, 3.0]])
    r = optimal_partition(times, np.zeros((1, 4)), gas=5)
    assert r.boundaries == (0, 3) and r.objective_s == 5 * 6.0 and r.stage_time_s == (6.0,)
    times = np.array([[1.0, 1, 1], [2, 2, 2], [3, 3, 3]])
    cuts = np.full((3, 4), 0.25)
    r = optimal_partition(times, cuts, gas=2)
    assert r.boundaries == (0, 1, 2, 3) and r.stage_time_s == (1.0, 2.0, 3.0)
    assert r.objective_s == 3.0 + 6.0 + 0.5


def test_all_zero_times():
    r = optimal_partition(np.zeros((3, 5)), np.zeros((3, 6)), gas=4)
    assert r.objective_s == 0.0 and len(r.boundaries) == 4


def test_to_dict():
    r = optimal_partition(np.array([[1.0, 1, 1, 1], [1, 1, 1, 1]]), np.zeros((2, 5)), gas=3)
    assert r.to_dict() == {
        "boundaries": [0, 2, 4],
        "layers_per_stage": [2, 2],
        "objective_s": 8.0,
        "stage_time_s": [2.0, 2.0],
        "sync_s": 0.0,
    }
    assert r.num_stages == 2


@pytest.mark.parametrize(
    "args, expect",
    [
        ((12, 4), (0, 3, 6, 9, 12)),
        ((10, 3), (0, 4, 7, 10)),  # 10 = 4 + 3 + 3: earlier stages take the extra layer
        ((10, 3, 1, 1), (0, 4, 7, 10)),  # 8 blocks = 3 + 3 + 2, plus embedding and head
        ((26, 4, 1, 1), (0, 7, 13, 19, 26)),  # 24 blocks, 6 each
        ((5, 1, 1, 1), (0, 5)),
        ((7, 5, 1, 1), (0, 2, 3, 4, 5, 7)),  # one block per stage
        ((4, 4), (0, 1, 2, 3, 4)),
    ],
)
def test_uniform_partition(args, expect):
    num_layers, pp, *fixed = args
    first, last = fixed or (0, 0)
    assert uniform_partition(num_layers, pp, first=first, last=last) == expect


@pytest.mark.parametrize(
    "num_layers, pp, first, last",
    [(4, 5, 0, 0), (7, 6, 1, 1), (2, 1, 1, 1), (10, 0, 0, 0), (10, 2, -1, 0)],
)
def test_uniform_partition_rejects(num_layers, pp, first, last):
    with pytest.raises(ValueError):
        uniform_partition(num_layers, pp, first=first, last=last)


@pytest.mark.parametrize(
    "times, cuts, gas, match",
    [
        (np.ones((3, 2)), np.zeros((3, 3)), 1, "pp <= L"),
        (np.ones((0, 4)), np.zeros((0, 5)), 1, "pp >= 1"),
        (np.ones(4), np.zeros(5), 1, "2-D"),
        (np.ones((2, 4)), np.zeros((2, 4)), 1, "shape"),
        (np.ones((2, 4)), np.zeros((2, 5)), 0, "gas"),
        (np.ones((2, 4)), np.zeros((2, 5)), 2.5, "gas"),
        (np.ones((2, 4)), np.zeros((2, 5)), True, "gas"),
        (-np.ones((2, 4)), np.zeros((2, 5)), 1, "finite and >= 0"),
        (np.full((2, 4), np.nan), np.zeros((2, 5)), 1, "finite and >= 0"),
        (np.full((2, 4), np.inf), np.zeros((2, 5)), 1, "finite and >= 0"),
        (np.ones((2, 4)), np.full((2, 5), -1.0), 1, "cut_cost_s"),
        (np.ones((2, 4)), np.full((2, 5), np.nan), 1, "cut_cost_s"),
    ],
)
def test_bad_inputs(times, cuts, gas, match):
    with pytest.raises(ValueError, match=match):
        optimal_partition(times, cuts, gas)


@pytest.mark.parametrize(
    "bounds", [(0, 4), (0, 1, 2, 4), (1, 2, 4), (0, 3, 5), (0, 0, 4), (0, 4, 4)]
)
def test_pipeline_objective_rejects_bad_boundaries(bounds):
    with pytest.raises(ValueError, match="boundaries"):
        pipeline_objective(np.ones((2, 4)), np.zeros((2, 5)), 2, bounds)


# ---------------------------------------------------------------------------------------
# The full objective: eq. 5 + max_j sync_j, subject to per-stage memory budgets
# ---------------------------------------------------------------------------------------


def stage_sums(values, bounds):
    return np.array([values[j, a:b].sum() for j, (a, b) in enumerate(zip(bounds, bounds[1:]))])


def fits(mem, budget, bounds):
    return mem is None or bool(np.all(stage_sums(mem, bounds) <= budget))


def brute_force_full(times, cuts, gas, sync, fixed, mem, budget):
    """min of the full objective over the memory-feasible boundary sets (inf if none), and
    every feasible boundary set reaching it."""
    pp, L = times.shape
    scored = []
    for inner in itertools.combinations(range(1, L), pp - 1):
        bounds = (0, *inner, L)
        if fits(mem, budget, bounds):
            value = pipeline_objective(times, cuts, gas, bounds, sync_layer_s=sync,
                                       sync_fixed_s=fixed)
            scored.append((value, bounds))
    if not scored:
        return np.inf, set()
    best = min(v for v, _ in scored)
    return best, {b for v, b in scored if v <= best * (1 + RTOL)}


def random_full_instance(rng, L, pp, kind):
    """random_instance plus sync (per-stage coefficient x per-layer parameters, plus a
    latency-like fixed part) and integer memory (per-stage factor x per-layer bytes) with
    budgets from generous to infeasible, some set exactly to a stage's memory."""
    times, cuts = random_instance(rng, L, pp, "ties" if kind == "ties" else "hetero")
    if kind == "ties":  # integer-valued, so that many splits tie exactly
        params = rng.integers(0, 3, size=L).astype(float)
        sync = np.outer(rng.choice([0.0, 1.0, 2.0], size=pp), params)
        fixed = rng.choice([0.0, 1.0], size=pp)
    else:
        params = rng.uniform(0.1, 1.0, size=L)
        sync = np.outer(rng.uniform(0.0, 3.0) * rng.uniform(0.0, 1.0, size=pp), params)
        fixed = rng.uniform(0.0, 0.5, size=pp)
    if kind == "no-memory":
        return times, cuts, sync, fixed, None, None
    mem = np.outer(rng.integers(1, 4, size=pp), rng.integers(1, 10, size=L)).astype(float)
    share = mem.sum(axis=1) / pp
    budget = np.floor(share * rng.uniform(0.5, 2.5, size=pp))
    if rng.random() < 0.5:  # tight: some stages get exactly what one split needs
        inner = np.sort(rng.choice(np.arange(1, L), size=pp - 1, replace=False))
        need = stage_sums(mem, (0, *inner.tolist(), L))
        tight = rng.random(pp) < 0.5
        budget[tight] = need[tight]
    if rng.random() < 0.1:
        budget[rng.integers(pp)] = np.inf  # no limit on that stage
    return times, cuts, sync, fixed, mem, budget


def full_instances(kind, count=150, seed=0):
    rng = np.random.default_rng([seed, ["hetero", "ties", "no-memory"].index(kind), 7])
    for _ in range(count):
        L = int(rng.integers(1, 11))
        pp = int(rng.integers(1, L + 1))
        gas = int(rng.integers(1, 9))
        yield (*random_full_instance(rng, L, pp, kind), gas)


def full_kwargs(sync, fixed, mem, budget):
    return dict(sync_layer_s=sync, sync_fixed_s=fixed, memory_layer_bytes=mem,
                memory_budget_bytes=budget)


def check_full_result(r: PartitionResult, times, cuts, gas, sync, fixed, mem, budget):
    pp, L = times.shape
    b = r.boundaries
    assert len(b) == pp + 1 and b[0] == 0 and b[-1] == L
    assert all(x < y for x, y in zip(b, b[1:])) and all(isinstance(x, int) for x in b)
    assert fits(mem, budget, b)
    expect = pipeline_objective(times, cuts, gas, b, sync_layer_s=sync, sync_fixed_s=fixed)
    assert r.objective_s == pytest.approx(expect, rel=1e-12)
    assert r.stage_time_s == pytest.approx(stage_sums(times, b).tolist(), rel=1e-12)
    expect_sync = (fixed + stage_sums(sync, b)).max() if sync is not None else 0.0
    assert r.sync_s == pytest.approx(expect_sync, rel=1e-12)


@pytest.mark.parametrize("use_numba", [True, False], ids=["numba", "python"])
@pytest.mark.parametrize("kind", ["hetero", "ties", "no-memory"])
def test_full_objective_matches_brute_force(kind, use_numba):
    infeasible = feasible = 0
    for times, cuts, sync, fixed, mem, budget, gas in full_instances(kind):
        best, argmins = brute_force_full(times, cuts, gas, sync, fixed, mem, budget)
        r = optimal_partition(times, cuts, gas, use_numba=use_numba,
                              **full_kwargs(sync, fixed, mem, budget))
        if best == np.inf:  # None exactly when nothing fits in memory
            assert r is None, (times, mem, budget)
            infeasible += 1
            continue
        assert r is not None, (times, mem, budget)
        check_full_result(r, times, cuts, gas, sync, fixed, mem, budget)
        assert r.objective_s == pytest.approx(best, rel=RTOL), (times, cuts, gas, sync, fixed)
        assert r.boundaries in argmins
        feasible += 1
    assert feasible > 50
    assert (infeasible > 10) == (kind != "no-memory")


@pytest.mark.parametrize("kind", ["hetero", "ties", "no-memory"])
def test_full_objective_numba_and_python_agree(kind):
    for times, cuts, sync, fixed, mem, budget, gas in full_instances(kind, seed=1):
        kwargs = full_kwargs(sync, fixed, mem, budget)
        fast = optimal_partition(times, cuts, gas, use_numba=True, **kwargs)
        slow = optimal_partition(times, cuts, gas, use_numba=False, **kwargs)
        assert fast == slow


@pytest.mark.parametrize(
    "L, pp, gas, speeds, seed",
    [
        (16, 3, 2, "hetero", 0),
        (16, 4, 4, "few", 1),  # few distinct values: nearly flat frontiers in M and D
        (18, 4, 2, "few", 2),
        (18, 5, 8, "hetero", 3),
        (14, 6, 3, "few", 4),
        (20, 3, 1, "few", 5),  # gas == 1: the walk runs over D alone
    ],
)
def test_full_objective_on_longer_chains(L, pp, gas, speeds, seed):
    """GPT-like chains (embedding, blocks, big head) with sync proportional to parameters,
    per-stage coefficients and 1F1B-like memory budgets, against brute force."""
    rng = np.random.default_rng(seed)
    base = np.r_[0.3, rng.uniform(0.9, 1.1, size=L - 2), 2.6]
    params = np.r_[2.0, np.ones(L - 2), 4.0]
    if speeds == "few":
        base = np.r_[0.3, np.ones(L - 2), 2.6]
        speed = rng.choice([1.0, 1.8, 3.2], pp)
        coef = rng.choice([0.1, 0.4, 1.6], pp)
    else:
        speed = rng.uniform(1.0, 3.0, pp)
        coef = rng.uniform(0.1, 1.6, pp)
    times = np.outer(speed, base)
    cuts = np.zeros((pp, L + 1))
    cuts[1:, 1:L] = rng.uniform(0.0, 0.2, size=(pp - 1, 1))
    sync = np.outer(coef, params)
    fixed = rng.uniform(0.0, 0.1, pp)
    inflight = np.minimum(pp - np.arange(pp), gas)  # 1F1B: early stages hold more
    activations = np.r_[1.0, np.full(L - 2, 3.0), 1.0]
    mem = np.round(np.outer(np.ones(pp), params * 8) + np.outer(inflight, activations))
    budget = np.floor(mem.sum(axis=1) / pp * rng.uniform(1.1, 1.6, pp))
    kwargs = full_kwargs(sync, fixed, mem, budget)
    best, argmins = brute_force_full(times, cuts, gas, sync, fixed, mem, budget)
    for use_numba in (True, False):
        r = optimal_partition(times, cuts, gas, use_numba=use_numba, **kwargs)
        if best == np.inf:
            assert r is None
            continue
        check_full_result(r, times, cuts, gas, sync, fixed, mem, budget)
        assert r.objective_s == pytest.approx(best, rel=RTOL)
        assert r.boundaries in argmins


def test_sync_term_changes_the_split():
    # embedding, 6 blocks, a cheap LM head with 4 blocks' worth of parameters; identical
    # stages, sync = 1 s per block of parameters, 2 micro-batches
    times = np.tile([0.5, 1, 1, 1, 1, 1, 1, 1.0], (2, 1))
    cuts = np.zeros((2, 9))
    sync = np.tile([1.0, 1, 1, 1, 1, 1, 1, 4.0], (2, 1))
    fixed = np.zeros(2)
    eq5 = optimal_partition(times, cuts, gas=2)
    assert eq5.boundaries == (0, 4, 8) == uniform_partition(8, 2, first=1, last=1)
    assert eq5.objective_s == 4.0 + 7.5 and eq5.sync_s == 0.0
    # its stage 1 all-reduces 3 blocks + the head = 7, against 4 on stage 0
    kw = dict(sync_layer_s=sync, sync_fixed_s=fixed)
    assert pipeline_objective(times, cuts, 2, eq5.boundaries, **kw) == 11.5 + 7.0
    r = optimal_partition(times, cuts, gas=2, **kw)
    assert r.boundaries == (0, 5, 8)  # one more block forward: eq. 5 = 12, sync = max(5, 6)
    assert r.stage_time_s == (4.5, 3.0) and r.sync_s == 6.0
    assert r.objective_s == 12.0 + 6.0 < 18.5
    # with many micro-batches the bottleneck term wins again
    assert optimal_partition(times, cuts, gas=16, **kw).boundaries == (0, 4, 8)


def test_memory_budget_changes_the_split():
    # 6 equal layers on identical stages: eq. 5 wants 3 + 3 ...
    times = np.ones((2, 6))
    cuts = np.zeros((2, 7))
    assert optimal_partition(times, cuts, gas=4).boundaries == (0, 3, 6)
    # ... but stage 0 keeps 3 micro-batches in flight (3 bytes per layer), stage 1 two
    mem = np.array([[3.0] * 6, [2.0] * 6])
    r = optimal_partition(times, cuts, 4, memory_layer_bytes=mem,
                          memory_budget_bytes=np.array([8.0, 8.0]))
    assert r.boundaries == (0, 2, 6) and r.objective_s == 3 * 4 + 6 == 18.0
    # a budget that is exactly enough still fits
    r = optimal_partition(times, cuts, 4, memory_layer_bytes=mem,
                          memory_budget_bytes=np.array([9.0, 8.0]))
    assert r.boundaries == (0, 3, 6)
    # 2 + 3 layers at most: no split fits
    assert optimal_partition(times, cuts, 4, memory_layer_bytes=mem,
                             memory_budget_bytes=np.array([8.0, 7.0])) is None
    # one layer too big for every stage; a negative budget fits nothing
    big = mem.copy()
    big[:, 2] = 100.0
    assert optimal_partition(times, cuts, 4, memory_layer_bytes=big,
                             memory_budget_bytes=np.array([99.0, 99.0])) is None
    assert optimal_partition(times, cuts, 1, memory_layer_bytes=mem,
                             memory_budget_bytes=np.array([-1.0, np.inf])) is None
    # +inf budgets constrain nothing
    r = optimal_partition(times, cuts, 4, memory_layer_bytes=mem,
                          memory_budget_bytes=np.array([np.inf, np.inf]))
    assert r == optimal_partition(times, cuts, 4)


def test_zero_sync_and_loose_memory_change_nothing():
    rng = np.random.default_rng(11)
    for L, pp, gas in [(9, 3, 4), (12, 5, 2), (7, 7, 3), (10, 1, 8), (10, 4, 1)]:
        times, cuts = random_instance(rng, L, pp, "hetero")
        plain = optimal_partition(times, cuts, gas)
        r = optimal_partition(times, cuts, gas, sync_layer_s=np.zeros((pp, L)),
                              sync_fixed_s=np.zeros(pp), memory_layer_bytes=np.ones((pp, L)),
                              memory_budget_bytes=np.full(pp, float(L)))
        assert r.objective_s == pytest.approx(plain.objective_s, rel=1e-12)
        assert r.sync_s == 0.0
        # a constant sync on every stage adds exactly that
        r = optimal_partition(times, cuts, gas, sync_layer_s=np.zeros((pp, L)),
                              sync_fixed_s=np.full(pp, 0.25))
        assert r.objective_s == pytest.approx(plain.objective_s + 0.25, rel=1e-12)


def test_full_to_dict():
    times = np.ones((2, 4))
    r = optimal_partition(times, np.zeros((2, 5)), gas=3, sync_layer_s=np.full((2, 4), 0.5),
                          sync_fixed_s=np.array([0.25, 0.0]))
    assert r.boundaries == (0, 2, 4)
    assert r.to_dict() == {
        "boundaries": [0, 2, 4],
        "layers_per_stage": [2, 2],
        "objective_s": 8.0 + 1.25,
        "stage_time_s": [2.0, 2.0],
        "sync_s": 1.25,
    }


def test_pipeline_objective_with_sync():
    times = np.array([[1.0, 2, 3], [2.0, 2, 2]])
    cuts = np.full((2, 4), 0.5)
    sync = np.array([[0.1, 0.2, 0.3], [1.0, 1.0, 1.0]])
    fixed = np.array([0.05, 0.0])
    # (0, 2, 3): T = (3, 2), sync = (0.35, 1.0)
    assert pipeline_objective(times, cuts, 3, (0, 2, 3)) == 2 * 3 + 5 + 0.5
    assert pipeline_objective(times, cuts, 3, (0, 2, 3), sync_layer_s=sync,
                              sync_fixed_s=fixed) == pytest.approx(11.5 + 1.0)
    with pytest.raises(ValueError, match="both or neither"):
        pipeline_objective(times, cuts, 3, (0, 2, 3), sync_layer_s=sync)


GOOD = dict(sync_layer_s=np.zeros((2, 4)), sync_fixed_s=np.zeros(2),
            memory_layer_bytes=np.ones((2, 4)), memory_budget_bytes=np.full(2, 4.0))


@pytest.mark.parametrize(
    "change, match",
    [
        (dict(sync_fixed_s=None), "sync_layer_s was given without sync_fixed_s"),
        (dict(sync_layer_s=None), "sync_fixed_s was given without sync_layer_s"),
        (dict(memory_budget_bytes=None), "without memory_budget_bytes"),
        (dict(memory_layer_bytes=None), "without memory_layer_bytes"),
        (dict(sync_layer_s=np.zeros((2, 5))), "sync_layer_s must have shape"),
        (dict(sync_layer_s=np.zeros(4)), "sync_layer_s must have shape"),
        (dict(sync_fixed_s=np.zeros(3)), "sync_fixed_s must have shape"),
        (dict(memory_layer_bytes=np.ones((3, 4))), "memory_layer_bytes must have shape"),
        (dict(memory_budget_bytes=np.ones((2, 1))), "memory_budget_bytes must have shape"),
        (dict(sync_layer_s=-np.ones((2, 4))), "sync_layer_s must be finite and >= 0"),
        (dict(sync_layer_s=np.full((2, 4), np.nan)), "sync_layer_s must be finite"),
        (dict(sync_layer_s=np.full((2, 4), np.inf)), "sync_layer_s must be finite"),
        (dict(sync_fixed_s=np.array([0.0, -1.0])), "sync_fixed_s must be finite and >= 0"),
        (dict(sync_fixed_s=np.array([0.0, np.inf])), "sync_fixed_s must be finite"),
        (dict(memory_layer_bytes=np.full((2, 4), -1.0)), "memory_layer_bytes must be finite"),
        (dict(memory_layer_bytes=np.full((2, 4), np.nan)), "memory_layer_bytes must be finite"),
        (dict(memory_budget_bytes=np.array([1.0, np.nan])), "memory_budget_bytes must be"),
        (dict(memory_budget_bytes=np.array([1.0, -np.inf])), "memory_budget_bytes must be"),
    ],
)
def test_bad_full_inputs(change, match):
    with pytest.raises(ValueError, match=match):
        optimal_partition(np.ones((2, 4)), np.zeros((2, 5)), 2, **{**GOOD, **change})


@pytest.mark.parametrize("seed", range(6))
def test_unchecked_call_gives_the_checked_answer(seed):
    """checked=False (the cost model's calls) skips the input checks only: the same split,
    objective and stage times, with and without sync and memory, and None where nothing
    fits."""
    rng = np.random.default_rng(seed)
    pp, L = int(rng.integers(1, 5)), int(rng.integers(5, 30))
    times, cuts = rng.random((pp, L)), rng.random((pp, L + 1)) * 0.1
    kw = dict(sync_layer_s=rng.random((pp, L)) * 0.01, sync_fixed_s=rng.random(pp) * 0.01,
              memory_layer_bytes=rng.integers(1, 9, (pp, L)).astype(float),
              memory_budget_bytes=np.full(pp, float(rng.integers(L, 4 * L))))
    for extra in ({}, kw, {**kw, "memory_budget_bytes": np.full(pp, -1.0)}):
        a = optimal_partition(times, cuts, 4, **extra)
        b = optimal_partition(times, cuts, 4, checked=False, **extra)
        assert a == b
    assert optimal_partition(times, cuts, 4, memory_budget_bytes=np.full(pp, -1.0),
                             memory_layer_bytes=kw["memory_layer_bytes"], checked=False) is None
