"""The planner: AMP's Algorithm 1 with a memory model, exact fast layer assignment and NIC
sharing. `plan()` is the whole pipeline:

    spec -> CostModel (amp_search.costing: cluster arrays, layer times per device type,
                       measurements given)
         -> enumerate (search_space: named rules, equivalent points collapsed)
         -> place (Megatron order over the node orders)
         -> stage costs (cost_models: compute, TP/P2P/DP collectives, optimizer step)
         -> partition (exact DP, amp_search.partition) + memory
         -> assemble (cost_models.pipeline: AMP eq. 5 and 4)
         -> rank (one row per layout)
         -> simulate the best (amp_search.simulate: re-rank by the event simulation) => Plan

Its twin for the other half (launch the best as real trials, record, keep the best measured,
refit) is amp_search.tune.tune.

Measurements (layer profiles, link fits, calibration) are never read here: the caller loads
them (`amp_search.measurements.load_measurements`) and passes them in.
"""
from __future__ import annotations

import time
from collections import Counter
from contextlib import contextmanager
from dataclasses import replace
import itertools

import numpy as np

from cost_models.params import CostParams
from cost_models.recompute import RECOMPUTE_MODES

from .costing import CostModel, SharedRows
from .errors import AmpSearchError, UsageError
from .measurements import NO_MEASUREMENTS, Measurements
from .placement import device_orders
from .records import Estimate, GroupAlone, Plan, Strategy, SubsetPlan
from .search_space import (FEASIBILITY_RULES, Candidate, Reason, SearchSpace,
                           check_batch_has_a_degree, chunks_split_blocks, divisors,
                           enumerate_candidates, first_violation, search_cost)
from .simulate import DEFAULT_SIMULATE_TOP, rerank, with_simulation
from .spec import Cluster, Spec

__all__ = ["NoFeasibleStrategy", "SearchTooLarge", "estimate", "evaluate", "megatron_baseline",
           "node_groups_alone", "plan", "plan_backends", "rank", "ranking_key", "cluster_subsets",
           "subset_spec", "plan_on_subset", "plan_subsets", "start_subsets", "pareto_front",
           "choose_subset", "groups_alone_uses"]


class NoFeasibleStrategy(AmpSearchError):
    """Every candidate was pruned; the message says why."""


class Dominated(NoFeasibleStrategy):
    """Nothing below `plan`'s cutoff_s: what fits is no faster than the plan the caller has."""


class SearchTooLarge(AmpSearchError):
    """The search would take longer than the caller allows; the message says what to change."""


# ---------------------------------------------------------------------- public API

KEEP = 32
"""Layouts `plan` keeps by default: the strategies it simulates and re-ranks
(simulate.DEFAULT_SIMULATE_TOP), the table's rows and launch's trials come from them."""

BOUND_ABOVE = 400
"""Placements (candidates x placement orders) above which `plan` searches by branch and bound
(`cost_best_candidates`); at or below it, bounding costs more than it saves (AMP's 16x16
cluster, 54 candidates x 2 orders: 0.16 s against 0.06-0.11 s per subset), and every
candidate is costed, the same plans kept."""

_TIE_SLACK = 2e-3
"""Relative margin on the kept plans' slowest time: `ranking_key` compares times to 4
significant digits (each rounded by at most 5e-4 of itself), so a strategy within this of
the slowest kept one may still rank above it and is costed."""


def plan(spec: Spec, *, measurements: Measurements = NO_MEASUREMENTS,
         cost_params: CostParams | None = None, progress: bool = False,
         max_search_s: float | None = None, on_start=None,
         simulate_top: int | None = None, backend: str | None = None,
         keep: int | None = KEEP, keep_within: float = 1.0,
         cutoff_s: float | None = None, shared: SharedRows | None = None,
         bound_above: int | None = None, baseline: bool = True) -> Plan:
    """Rank the feasible strategies for `spec` (AMP Algorithm 1, lines 1-7).

    `keep`: the plan holds the fastest `keep` layouts (at least `simulate_top`) and every
    strategy within `keep_within` times the best's closed-form time, exactly as a search of
    every candidate ranks them; the others are left out (counted under
    SLOWER_THAN_KEPT), most of them never costed: candidates are costed in the order of a
    lower bound on their time, and the search stops where that bound passes the slowest kept
    plan (`cost_best_candidates`). None: cost and rank every candidate.

    `simulate_top`: simulate the best N strategies of the exact DP's ranking event by event
    and re-order them by the simulated time (`simulate_ranking`; default
    amp_search.simulate.DEFAULT_SIMULATE_TOP; 0: the closed form only), and the Megatron
    baseline with them.

    `backend`: deepspeed | megatron, the framework the plan is for (None: any); the search
    space's rules drop what it cannot run (search_space.interleaved_backend).

    `cutoff_s`: the caller has no use for a plan whose closed-form time is this or more
    (`plan_subsets`: another part of the cluster already beats it in every objective); such
    plans are left out like the slower-than-kept ones, most never costed, and counted under
    Reason.DOMINATED. Raises Dominated when that leaves nothing. `shared`: per device type
    rows to take and keep (costing.SharedRows: the searches of several parts of a cluster).
    `bound_above`: placements above which the search bounds (default BOUND_ABOVE).
    `baseline`: False leaves the Megatron baseline out (Plan.baseline None), for a caller
    that uses the best plan alone.

    `measurements`: layer profiles, link fits and calibration to use (default: none, the
    analytic model on the packaged catalog). `max_search_s`: refuse (SearchTooLarge) a search
    whose estimated cost (search_space.SearchCost) is larger, before starting it; `on_start`:
    called with that SearchCost when the search starts. Raises NoFeasibleStrategy when nothing
    fits, with the prune counts in the message."""
    t0 = time.perf_counter()
    model = CostModel(spec, measurements=measurements, cost_params=cost_params, shared=shared)
    space = SearchSpace.of(spec, backend)
    pruned: Counter = Counter()
    candidates = enumerate_candidates(space, pruned)
    check_batch_has_a_degree(space, candidates, pruned)
    looked_at = len(candidates) + sum(pruned.values())
    orders = device_orders(spec.cluster, spec.training.precision)
    cost = search_cost(space, candidates, len(orders))
    if max_search_s is not None and cost.estimated_s > max_search_s:
        raise SearchTooLarge(
            f"the search would take too long ({cost.describe()}; the limit is "
            f"{max_search_s:g} s): fix training.zero_stage and "
            f"training.activation_checkpointing instead of 'search', describe the model with "
            f"fewer, larger layers (the pipeline split places whole layers), or allow more "
            f"time (--max-search-seconds)")
    if on_start is not None:
        on_start(cost)
    if keep is not None:
        keep = max(keep, DEFAULT_SIMULATE_TOP if simulate_top is None else simulate_top)
    if bound_above is None:
        bound_above = BOUND_ABOVE
    if keep is None or len(candidates) * len(orders) <= bound_above:
        estimates, evaluated = cost_every_candidate(model, candidates, orders, pruned, progress)
        if cutoff_s is not None:
            below = [e for e in estimates if e.iteration_time_s < cutoff_s]
            if len(estimates) > len(below):
                pruned[Reason.DOMINATED.value] += len(estimates) - len(below)
            estimates = below
        if keep is not None:
            estimates = kept_plans(estimates, keep, keep_within, pruned)
    else:
        estimates, evaluated = cost_best_candidates(
            model, candidates, orders, pruned, progress, keep=keep, keep_within=keep_within,
            cutoff_s=cutoff_s)
    ranked = rank(estimates, pruned)
    if not ranked:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(pruned.items()))
        if pruned.get(Reason.DOMINATED.value):
            raise Dominated(f"no strategy is faster than {cutoff_s:.4g} s ({detail})")
        raise NoFeasibleStrategy(
            f"no strategy is feasible ({detail}); try training.zero_stage: search, "
            f"training.activation_checkpointing: search, or a smaller global_batch_size")
    ranked, proposal = simulate_ranking(
        model, ranked, megatron_baseline(spec, model, space) if baseline else None,
        simulate_top, orders)
    return Plan(strategies=tuple(ranked), baseline=proposal,
                search_time_s=time.perf_counter() - t0, candidates=looked_at,
                evaluated=evaluated, pruned=dict(pruned))


def cost_every_candidate(model: CostModel, candidates, orders, pruned: Counter,
                         progress: bool) -> tuple[list[Estimate], int]:
    """Each candidate on its fastest placement order, with its memory: the feasible ones, and
    the placements costed."""
    estimates = []
    shown = candidates
    if progress:            # tqdm (and the multiprocessing lock it makes) only when shown
        from tqdm import tqdm

        shown = tqdm(candidates, desc="searching", unit="strategy", leave=False,
                     mininterval=0.25)
    for c in shown:
        if model.states_cannot_fit(c):
            pruned[Reason.OUT_OF_MEMORY.value] += 1
            continue
        # the fastest placement order, then its memory (the others' is never looked at)
        best, order = min(((model.evaluate(c, o, with_memory=False), o) for o in orders),
                          key=lambda eo: eo[0].iteration_time_s)
        best = model.add_memory(c, order, best)
        if best.fits:
            estimates.append(best)
        else:
            pruned[Reason.OUT_OF_MEMORY.value] += 1
    return estimates, len(candidates) * len(orders)


def cost_best_candidates(model: CostModel, candidates, orders, pruned: Counter,
                         progress: bool, *, keep: int, keep_within: float,
                         cutoff_s: float | None = None) -> tuple[list[Estimate], int]:
    """What `cost_every_candidate` gives for the strategies `plan` keeps (the fastest `keep`
    layouts and those within `keep_within` of the best, by `ranking_key`), costing few of
    the others: best first by a lower bound on the time (branch and bound).

    Every candidate gets the bound of `CostModel.lower_bound_s` without a placement from
    cached per-layer arrays only (floors=False); taken from a heap in the order of its bound,
    it gets that bound with the P2P and sync floors and goes back (with virtual stages, once
    its fixed chunks are found to fit somewhere: `CostModel.fits_nowhere`); taken again, the
    tighter bound of each placement order and goes back; taken again, the tightest (the
    partition DP's) and goes back; and when it comes out a third time it is costed on the
    orders whose bound is below the best time found for it (the first fastest order is the
    one `cost_every_candidate` takes) and its memory added. A candidate whose bound, at the
    4 digits `ranking_key` compares, is above a time already found for its layout is dropped
    whenever it comes out (`rank` keeps each layout's fastest setting of its knobs; counted
    under SLOWER_KNOBS_SAME_LAYOUT). The search stops when the
    smallest bound left is above the threshold: the slowest of the fastest `keep` layouts,
    or keep_within times the best, whichever is larger (with `_TIE_SLACK`); it only falls
    as plans are found, so each strategy faster than the final threshold was costed, and
    the plans above it are left out. `cutoff_s`: the threshold starts there, and the plans
    at or above it are left out too (counted under Reason.DOMINATED, whether their memory
    fits or not: it is not added to them). Returns those
    estimates and the placements costed."""
    import heapq

    found: dict[tuple, float] = {}          # layout -> its fastest feasible time
    estimates: list[Estimate] = []
    order_bounds: dict[int, list[float]] = {}
    # tier -1: the per-layer rows alone; 0: with the P2P and sync floors; 1 and 2: on each
    # placement order, then with the partition DP; then costed
    heap = [(model.lower_bound_s(c, floors=False), -1, i) for i, c in enumerate(candidates)]
    heapq.heapify(heap)
    cutoff = float("inf") if cutoff_s is None else cutoff_s
    threshold, evaluated, settled, dominated = cutoff, 0, 0, 0
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(candidates), desc="searching", unit="strategy", leave=False,
                   mininterval=0.25)

    def settle():
        nonlocal settled
        settled += 1
        if bar is not None:
            bar.update(1)

    while heap and heap[0][0] <= threshold * (1.0 + _TIE_SLACK):
        bound, tier, i = heapq.heappop(heap)
        c = candidates[i]
        fastest = found.get(layout_of(c))
        if fastest is not None and _shown(bound) > _shown(fastest):
            # its layout has a faster setting of its knobs already: `rank` keeps that one
            pruned[Reason.SLOWER_KNOBS_SAME_LAYOUT.value] += 1
            order_bounds.pop(i, None)
            settle()
            continue
        if tier < 0:
            heapq.heappush(heap, (max(bound, model.lower_bound_s(c)), 0, i))
            continue
        if tier == 0:
            # virtual stages: the split is fixed, so the memory is known before the time
            if model.states_cannot_fit(c) or model.fits_nowhere(c, orders):
                pruned[Reason.OUT_OF_MEMORY.value] += 1
                settle()
                continue
        if tier < 2:                # a tighter bound, and back into the heap
            order_bounds[i] = [model.lower_bound_s(c, o, split=tier == 1) for o in orders]
            heapq.heappush(heap, (min(order_bounds[i]), tier + 1, i))
            continue
        bounds = order_bounds.pop(i)
        best = order = None
        limit = threshold * (1.0 + _TIE_SLACK)     # some order's bound is below it
        for o, bound in zip(orders, bounds):
            if bound > limit or best is not None and bound > best.iteration_time_s:
                continue            # this order cannot be kept (the threshold only falls),
                # or faster than one already costed
            e = model.evaluate(c, o, with_memory=False)
            evaluated += 1
            if best is None or e.iteration_time_s < best.iteration_time_s:
                best, order = e, o
        settle()
        if best.iteration_time_s >= cutoff:     # left out whether it fits or not
            dominated += 1
            continue
        best = model.add_memory(c, order, best)
        if not best.fits:
            pruned[Reason.OUT_OF_MEMORY.value] += 1
            continue
        estimates.append(best)
        layout = layout_of(c)
        if best.iteration_time_s < found.get(layout, float("inf")):
            found[layout] = best.iteration_time_s
            threshold = min(cutoff, _kept_threshold(found, keep, keep_within))
    if bar is not None:
        bar.close()
    left = len(candidates) - settled
    if left and _kept_threshold(found, keep, keep_within) > cutoff:
        dominated, left = dominated + left, 0       # the cutoff, not the kept plans, stopped it
    if dominated:
        pruned[Reason.DOMINATED.value] += dominated
    if left:
        pruned[Reason.SLOWER_THAN_KEPT.value] += left
    return kept_plans(estimates, keep, keep_within, pruned), evaluated


def _shown(time_s: float) -> float:
    """A time at the 4 significant digits `ranking_key` compares."""
    return float(f"{time_s:.4g}")


def _kept_threshold(found: dict, keep: int, keep_within: float) -> float:
    """The slowest time `plan` keeps, from each layout's fastest feasible time found: that
    of the keep-th layout or keep_within times the best, whichever is larger; infinite
    until keep layouts are found."""
    if len(found) < keep:
        return float("inf")
    times = sorted(found.values())
    return max(times[keep - 1], times[0] * keep_within)


def kept_plans(estimates: list[Estimate], keep: int, keep_within: float,
               pruned: Counter) -> list[Estimate]:
    """The feasible estimates `plan` keeps (`_kept_threshold`, compared at the 4 digits of
    `ranking_key`), the others counted under SLOWER_THAN_KEPT: the same for every candidate
    costed (`cost_every_candidate`) as for those the bound let through."""
    found: dict = {}
    for e in estimates:
        layout = layout_of(e.strategy)
        found[layout] = min(found.get(layout, float("inf")), e.iteration_time_s)
    threshold = _kept_threshold(found, keep, keep_within)
    if threshold == float("inf"):
        return estimates
    limit = _shown(threshold)
    kept = [e for e in estimates if ranking_key(e)[0] <= limit]
    if len(estimates) > len(kept):
        pruned[Reason.SLOWER_THAN_KEPT.value] += len(estimates) - len(kept)
    return kept


def plan_backends(spec: Spec, **kw) -> Plan:
    """`plan` for each framework the spec may be run with: where it names no
    training.backend, DeepSpeed's and Megatron-LM's plans merged into one ranking (each
    strategy's `Estimate.backend` says which; their own rules and defaults apply), with the
    Megatron-LM plan's baseline (Megatron-LM's usual layout costed as Megatron-LM runs it).
    A spec that names its backend: `plan` itself. `kw`: as plan()'s."""
    specs = spec.backends()
    if len(specs) == 1:
        return plan(spec, **kw)
    t0 = time.perf_counter()
    plans, notes, first_error = [], list(spec.backend_notes), None
    for i, s in enumerate(specs):
        try:
            # on_start (the caller's "searching ..." line) for the first search only
            plans.append(plan(s, **({**kw, "on_start": None} if i else kw)))
        except NoFeasibleStrategy as exc:
            first_error = first_error or exc
            notes.append(f"{s.training.backend}: {exc}")
    if not plans:
        raise first_error
    pruned: Counter = Counter()
    for p in plans:
        pruned.update(p.pruned)
    baselines = [p.baseline for p in plans if p.baseline is not None]
    return Plan(strategies=tuple(sorted((e for p in plans for e in p.strategies),
                                        key=ranking_key)),
                baseline=next((b for b in baselines if b.backend == "megatron"),
                              baselines[0] if baselines else None),
                search_time_s=time.perf_counter() - t0,
                candidates=sum(p.candidates for p in plans),
                evaluated=sum(p.evaluated for p in plans), pruned=dict(pruned),
                backends=tuple(p.best.backend for p in plans), backend_notes=tuple(notes))


BEST_ONLY_SIMULATE_TOP = 8
"""Strategies simulated (at most) by a search that wants only its best plan: each node group
alone and each cluster subset. benchmarks/rerank_depth.py (2026-11-22) found the simulated
best at closed-form rank 3 at the deepest (simulate.DEFAULT_SIMULATE_TOP); the whole
cluster's plan, whose top 10 the table shows, simulates 32."""


def best_only(simulate_top: int | None) -> dict:
    """plan()'s simulate_top and keep for a search whose best plan alone is used, by branch
    and bound however small the search (keeping so few plans, it costs fewer candidates:
    15 parts of AMP's 16x16 cluster took 1.3-1.7 s instead of 1.9-2.0 s on the 2-core
    machine, 2026-11-27)."""
    top = BEST_ONLY_SIMULATE_TOP if simulate_top is None else \
        min(simulate_top, BEST_ONLY_SIMULATE_TOP)
    return dict(simulate_top=top, keep=max(1, top), bound_above=0, baseline=False)


def node_groups_alone(spec: Spec, *, measurements: Measurements = NO_MEASUREMENTS,
                      cost_params: CostParams | None = None, simulate_top: int | None = None,
                      backend: str | None = None, shared: SharedRows | None = None
                      ) -> tuple[GroupAlone, ...]:
    """Each node group of a mixed cluster planned on its own, the others idle (`plan` on the
    spec with that group only, the same model and re-rank): whether the slower groups help or
    hold the rest back. () for a cluster of one node group. `shared`: as plan()'s."""
    out = []
    for i, (g, uses) in enumerate(zip(spec.cluster.node_groups,
                                      groups_alone_uses(spec.cluster))):
        common = dict(group=i, gpu=g.gpu.name, nodes=g.count, gpus=g.count * g.gpus_per_node)
        try:        # its placement on the whole cluster's device ids, as plan_subsets' are
            best = plan_on_subset(spec, uses, measurements=measurements,
                                  cost_params=cost_params, backend=backend, shared=shared,
                                  **best_only(simulate_top)).best
            out.append(GroupAlone(**common, best=best))
        except NoFeasibleStrategy as exc:
            out.append(GroupAlone(**common, best=None, reason=str(exc)))
    return tuple(out)


MAX_SUBSETS = 15
"""Cluster subsets `plan_subsets` plans at most beside the whole cluster (each is a search)."""


def cluster_subsets(cluster: Cluster, limit: int = MAX_SUBSETS
                    ) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The parts of the cluster a plan may run on alone, the rest idle, as (nodes, GPUs per
    node) per node group (the first ones as listed): whole nodes, 0, 1, 2, 4, ... or all of a
    group's; on a one-node cluster 1, 2, 4, ... of its devices. Every combination but none and
    the whole cluster: each node group alone first, as listed (whether the slower groups
    help at all), then the most devices first; at most `limit` of them."""
    groups = cluster.node_groups
    if len(cluster.nodes) == 1:
        k = groups[0].gpus_per_node
        options = [[(1, 1 << b) for b in range(k.bit_length()) if 1 << b < k] + [(1, k)]]
    else:
        options = [[(n, g.gpus_per_node if n else 0) for n in sorted(
            {0, g.count} | {1 << b for b in range(g.count.bit_length()) if 1 << b < g.count})]
            for g in groups]
    whole = tuple((g.count, g.gpus_per_node) for g in groups)
    subsets = [u for u in itertools.product(*options) if any(n for n, _ in u) and u != whole]
    alone = groups_alone_uses(cluster)
    subsets.sort(key=lambda u: (alone.index(u) if u in alone else len(alone),
                                -_part_gpus(u), u))
    return tuple(subsets[:limit])


def _part_gpus(uses) -> int:
    """The devices a part in `cluster_subsets`' form uses: nodes x GPUs per node, summed."""
    return sum(n * k for n, k in uses)


def subset_spec(spec: Spec, uses: tuple[tuple[int, int], ...]) -> tuple[Spec, tuple[int, ...]]:
    """The spec on the devices `uses` names (`cluster_subsets`' form), and for each of its
    devices the id it has in the whole cluster."""
    groups, ids, offset = [], [], 0
    for g, (n, k) in zip(spec.cluster.node_groups, uses):
        if n:
            groups.append(replace(g, count=n, gpus_per_node=k, hosts=g.hosts[:n]))
            ids += [offset + j * g.gpus_per_node + r for j in range(n) for r in range(k)]
        offset += g.count * g.gpus_per_node
    return replace(spec, cluster=Cluster.from_groups(tuple(groups))), tuple(ids)


def _price_per_hour(spec: Spec, uses) -> float | None:
    """What the nodes `uses` names cost per hour; None where a group used has no price."""
    total = 0.0
    for g, (n, _) in zip(spec.cluster.node_groups, uses):
        if n:
            if g.price_per_hour is None:
                return None
            total += n * g.price_per_hour
    return total


SUBSET_LAG = 1
"""How many of the parts just before it (in `_subset_waves`' order) a part's cutoff does not
wait for: it may be searched beside them. Fixed, so that the plans do not depend on the
number of CPUs or on which search ends first. With 1, two parts are searched at once and
neither ever waits for the other (on 2 CPUs: the worker and the `plan` process), and every
part but the next takes the cutoffs of all the plans found before it; waves of 4 parts
searched at once, each wave's cutoffs from the waves before it, left more parts with looser
cutoffs and each process waiting at the end of every wave (on the 16x16 cluster of
benchmarks/search_time.py, 2026-11-30: 100 placements costed instead of 80 and one part less
found dominated, the front the same)."""

SUBSET_CUTOFF_SLACK = 0.05
"""How far above a dominating plan's time `plan_subsets` still costs a subset's candidates:
the cutoff compares closed-form times with the found plans' simulated ones, which the
event simulation moves by a few percent."""


def plan_subsets(spec: Spec, whole: Plan, *, measurements: Measurements = NO_MEASUREMENTS,
                 cost_params: CostParams | None = None, simulate_top: int | None = None,
                 backend: str | None = None, limit: int = MAX_SUBSETS,
                 workers: int = 1, shared: SharedRows | None = None,
                 early: "EarlySubsets | None" = None) -> tuple[SubsetPlan, ...]:
    """The whole cluster's best (`whole`, the plan of `spec`) and the best plan on each of
    `cluster_subsets` (each planned as `plan` does, the same model and re-rank), their
    placements in the whole cluster's device ids, with what the nodes used cost: the points
    a cost or GPU-time objective, a deadline or a budget chooses among (`choose_subset`).

    A subset is searched only for plans that some plan already found does not dominate:
    one no slower that uses no more GPU-seconds per sample and (where both are priced) costs
    no more per iteration (`dominance_cutoff_s`). Such a plan would meet every deadline,
    budget and amplification limit the dominated one meets, at no more time, cost or
    GPU-time, so neither the front nor the choice changes; the subset is marked `dominated`
    and its search stops early. Each node group alone is searched in full (`plan` states
    whether the slower groups help, with numbers).

    The subsets are searched in waves: each node group alone first, then one part at a time,
    each part's cutoff from the plans of the parts before it but the SUBSET_LAG just before
    it (`_wave_basis`), so the result depends neither on which search ends first nor on
    `workers`: > 1, the searches run in forked processes and this one, a part as soon as
    its cutoff is known (where the platform cannot fork, one after another). `early`: the
    waves started beside the whole cluster's search (`start_subsets`): its worker and this
    process search what is left (`collect`).

    `shared`: the per device type rows the parts' searches take and keep (SharedRows; give
    the one the whole cluster's search filled: the forked workers inherit its rows)."""
    every = tuple((g.count, g.gpus_per_node) for g in spec.cluster.node_groups)
    out = {(): SubsetPlan(uses=every, gpus=spec.cluster.num_devices, best=whole.best,
                          price_per_hour=_price_per_hour(spec, every), whole=True)}
    parts = cluster_subsets(spec.cluster, limit)
    jobs = _subset_jobs(spec, parts, measurements=measurements, cost_params=cost_params,
                        simulate_top=simulate_top, backend=backend, shared=shared)
    waves = _subset_waves(spec.cluster, parts, spec.training.precision)
    cutoffs_of = _cutoffs_of(spec, parts, waves, out[()])
    done = {}
    if early is not None:       # started for this spec's backend, or of no use here
        if early.backend == spec.training.backend:
            done = early.collect()
        else:
            early.cancel()
    context = _fork_context() if workers > 1 and len(parts) > 1 and not done else None
    if context is not None:
        done = EarlySubsets(context, _worker_processes(workers, waves), jobs, waves,
                            cutoffs_of, spec.training.backend,
                            alone_first=_alone_first(spec.cluster, parts, waves)).collect()
    for k, wave in enumerate(waves):
        cutoffs = cutoffs_of(k, done)
        for i, cutoff in zip(wave, cutoffs):
            if i not in done:               # one after another, here
                done[i] = _best_on_job(jobs[i], cutoff)
            out[(i,)] = _subset_plan(spec, parts[i], done[i], cutoff)
    return (out[()],) + tuple(out[(i,)] for i in range(len(parts)))


def _cutoffs_of(spec: Spec, parts, waves, whole: "SubsetPlan | None"):
    """(k, {part index: _best_on_job's result} holding at least the basis of wave k) -> the
    dominance cutoffs of wave k's parts (`_wave_basis`; `whole`: the whole cluster's
    SubsetPlan, in the basis only where the first wave is not each node group alone)."""
    def cutoffs_of(k: int, found: dict) -> list[float | None]:
        out = {(i,): _subset_plan(spec, parts[i], f, None) for i, f in found.items()}
        out[()] = whole
        return _wave_cutoffs(spec, parts, waves[k],
                             _wave_basis(spec.cluster, parts, waves, k, out))
    return cutoffs_of


def _subset_waves(cluster: Cluster, parts, precision: str) -> list[list[int]]:
    """`plan_subsets`' waves of part indices: each node group alone, then each other part
    alone, the parts with the fewest devices first, of as many the one with the most peak
    FLOP/s at `precision` first (then as listed). A plan dominates another only with no more
    GPU-seconds, which a small part's fast plan has against every larger part, so the small
    parts' plans give the larger ones their tightest cutoffs (on the 16x16 cluster of
    benchmarks/search_time.py a fifth less left to cost, and 2 parts more found dominated,
    the front the same, than with the most devices first, the order `cluster_subsets` lists
    them in and cuts them at its limit); of as many devices, the fastest is likeliest to
    dominate the others (there, 4 V100 nodes before 2 V100 and 2 T4 nodes)."""
    alone = set(groups_alone_uses(cluster))
    first = [i for i, u in enumerate(parts) if u in alone]

    def peak(uses) -> float:
        return sum(n * k * (g.gpu.peak_flops_per_s.get(precision) or 0.0)
                   for g, (n, k) in zip(cluster.node_groups, uses))

    rest = sorted((i for i, u in enumerate(parts) if u not in alone),
                  key=lambda i: (_part_gpus(parts[i]), -peak(parts[i]), i))
    return ([first] if first else []) + [[i] for i in rest]


def _alone_first(cluster: Cluster, parts, waves) -> bool:
    """Whether `_subset_waves`' first wave is each node group alone: then every wave may run
    beside the whole cluster's search (start_subsets)."""
    return bool(waves) and parts[waves[0][0]] in set(groups_alone_uses(cluster))


def _worker_processes(workers: int, waves) -> int:
    """The forked processes that search the parts beside the caller, which takes a CPU of
    `workers`: no more than can search at once (each node group alone, or SUBSET_LAG + 1
    parts)."""
    return min(workers - 1, max(len(waves[0]), SUBSET_LAG + 1))


def _basis_waves(k: int, alone_first: bool) -> int:
    """How many waves, from the first, give wave `k`'s cutoffs (`_wave_basis`): all before it
    but the SUBSET_LAG just before it, and every node group alone where they come first."""
    return max(min(k, 1) if alone_first else 0, k - SUBSET_LAG)


def _wave_basis(cluster: Cluster, parts, waves, k: int, out: dict) -> list["SubsetPlan"]:
    """The subset plans wave `k`'s cutoffs come from: those of the waves before it but the
    last SUBSET_LAG (`_basis_waves`; `out`, by (part index,)), and the whole cluster's
    (`out[()]`) only where the first wave is not each node group alone (`_alone_first`):
    where it is, every wave may run beside the whole cluster's search, which cannot wait for
    it."""
    first = _alone_first(cluster, parts, waves)
    basis = [out[(i,)] for w in waves[:_basis_waves(k, first)] for i in w]
    return basis if first else [out[()]] + basis


def _wave_cutoffs(spec: Spec, parts, wave, basis) -> list[float | None]:
    """Each part of `wave`'s dominance cutoff from the subset plans `basis` (none for a node
    group alone: searched in full)."""
    alone = set(groups_alone_uses(spec.cluster))
    return [None if parts[i] in alone else dominance_cutoff_s(
        basis, _part_gpus(parts[i]), _price_per_hour(spec, parts[i]))
        for i in wave]


def _subset_plan(spec: Spec, uses, found, cutoff_s: float | None) -> "SubsetPlan":
    """The SubsetPlan of a part from `_best_on_job`'s (best, reason, dominated)."""
    best, reason, dominated = found
    return SubsetPlan(uses=uses, gpus=_part_gpus(uses),
                      price_per_hour=_price_per_hour(spec, uses), best=best, reason=reason,
                      dominated=dominated, cutoff_s=cutoff_s if dominated else None)


def _subset_jobs(spec: Spec, parts, *, shared: SharedRows | None = None,
                 simulate_top: int | None = None, **kw) -> list:
    """(spec, uses, plan()'s keywords) of each part's search."""
    kw = dict(kw, shared=SharedRows() if shared is None else shared, **best_only(simulate_top))
    return [(spec, uses, kw) for uses in parts]


class _CallerGone(Exception):
    """In a worker of EarlySubsets: the process that started it is gone."""


def _sendable(exc: BaseException) -> BaseException:
    """`exc` as a worker of EarlySubsets sends it to the caller: with the worker's traceback
    as a note; where it does not survive pickling, an AmpSearchError or RuntimeError of its
    text."""
    import pickle
    import traceback

    text = "".join(traceback.format_exception(exc)).rstrip()
    try:
        exc.add_note(f"(raised in a process searching a part of the cluster)\n{text}")
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:           # noqa: BLE001 -- sent as its text instead
        kind = AmpSearchError if isinstance(exc, AmpSearchError) else RuntimeError
        return kind(f"{type(exc).__name__}: {exc}")


class EarlySubsets:
    """`plan_subsets`' waves searched beside the caller's search of the whole cluster: each
    node group alone (the first wave, which no cutoff bounds), then each later wave once the
    waves its cutoffs come from are done (`_basis_waves`; `alone_first` False: the first
    wave's cutoffs come from the whole cluster's plan, `plan_subsets` searching them after
    it), with the cutoffs plan_subsets gives it (`cutoffs_of(k, found)`).

    `workers` forked processes and, once its own search is done, the caller (`collect`)
    each take the next part in the waves' order themselves (a shared counter), wait for the
    parts its cutoff comes from, search it and send what they found to every other one's
    inbox (a pipe each, drained by a thread of its reader). No process hands parts to
    another: a part starts as soon as its searcher is free and its basis is in, not after
    threads of the caller that compete with its own search for the interpreter have passed
    it along (with a pool fed from the caller's threads, a worker waited 5-20 ms between
    parts while the caller searched; 2026-11-30). The plans depend neither on which process
    searches a part nor on which ends first. `plan_subsets(early=...)` collects them."""

    def __init__(self, context, workers: int, jobs: list, waves: list[list[int]], cutoffs_of,
                 backend: str, *, alone_first: bool = True) -> None:
        import os

        self.backend = backend
        """The backend the parts are costed for (plan_subsets ignores them for another)."""
        self._jobs, self._waves, self._cutoffs_of = jobs, waves, cutoffs_of
        self._alone_first = alone_first
        self._order = [(k, i) for k, wave in enumerate(waves) for i in wave]
        self._next = context.Value("i", 0)          # the next of _order to take, shared
        # an inbox per process, 0 the caller's: (read end, write end, the writers' lock)
        self._inboxes = [(*context.Pipe(duplex=False), context.Lock())
                         for _ in range(workers + 1)]
        self._found: dict = {}
        self._error: BaseException | None = None
        self._stopped = False
        self._cond = None
        self._caller = os.getpid()
        self._processes = [context.Process(target=self._work, args=(me,), daemon=True,
                                           name=f"amp-search-parts-{me}")
                           for me in range(1, workers + 1)]
        try:
            for proc in self._processes:
                proc.start()
            # each inbox's read end in its reader alone, and none of its own write end here:
            # a send to a process that is gone fails (EPIPE) instead of filling a pipe no one
            # reads, and this process's inbox ends (EOF) once every worker has
            for reader, _, _ in self._inboxes[1:]:
                reader.close()
            self._inboxes[0][1].close()
            self._listen(0)     # after the forks: no child inherits the thread's state
        except BaseException:
            self.cancel()
            raise

    def handed_out(self) -> bool:
        """Whether every part was taken (by the workers, or by `collect`)."""
        return self._next.value >= len(self._order)

    def _listen(self, me: int) -> None:
        """Read process `me`'s inbox into `_found` in a daemon thread, to its end: a part's
        plans, or an error that stops every search (one that cannot be read included)."""
        import threading

        self._cond = threading.Condition()
        reader = self._inboxes[me][0]

        def drain() -> None:
            while True:
                try:
                    i, found, error = reader.recv()
                except (EOFError, OSError):
                    return
                except Exception as exc:        # noqa: BLE001 -- a message not unpickled
                    i, found, error = -1, None, RuntimeError(
                        f"a part's result could not be read: {type(exc).__name__}: {exc}")
                with self._cond:
                    if error is not None:
                        self._error = self._error or error
                    else:
                        self._found[i] = found
                    self._cond.notify_all()

        threading.Thread(target=drain, daemon=True, name="amp-search-parts-inbox").start()

    def _alive(self, me: int) -> None:
        """Raise where the other side is gone: in the caller (`me` 0), a worker that ended
        without a word (killed); in a worker, the caller."""
        import os

        if me:
            if os.getppid() != self._caller:
                raise _CallerGone
            return
        for proc in self._processes:
            if proc.exitcode not in (None, 0):
                raise RuntimeError(
                    f"a process searching the cluster's parts ended with exit code "
                    f"{proc.exitcode} (a negative code: killed by that signal)")

    @contextmanager
    def _locked(self, lock, me: int):
        """`lock` held, asking every half second whether the other side is gone (a process
        killed while it held the lock never lets it go)."""
        while not lock.acquire(timeout=0.5):
            self._alive(me)
        try:
            yield
        finally:
            lock.release()

    def _send(self, me: int, message) -> None:
        """`message` to every other process's inbox; a worker that is gone (it took its last
        part) is skipped, and the caller gone ends a worker (_CallerGone)."""
        for other, (_, writer, lock) in enumerate(self._inboxes):
            if other == me:
                continue
            with self._locked(lock, me):
                try:
                    writer.send(message)
                except (BrokenPipeError, ConnectionResetError):
                    if other == 0:
                        raise _CallerGone from None

    def _take(self, me: int) -> tuple[int, int] | None:
        """The next (wave, part) of the waves' order, None when every part was taken."""
        with self._locked(self._next.get_lock(), me):
            p = self._next.value
            if p >= len(self._order):
                return None
            self._next.value = p + 1
        return self._order[p]

    def _wait(self, parts, me: int) -> None:
        """Until every one of `parts` is found here; raises the first error any search
        sent, or where the other side is gone (`_alive`)."""
        with self._cond:
            while self._error is None and not self._stopped and \
                    any(i not in self._found for i in parts):
                if not self._cond.wait(timeout=0.5):
                    try:
                        self._alive(me)
                    except RuntimeError as exc:
                        self._error = exc
            if self._error is not None:
                raise self._error
            if self._stopped:
                raise RuntimeError("the parts' searches were cancelled")

    def _search(self, me: int) -> None:
        """Take, search and send parts until none is left to take."""
        while (task := self._take(me)) is not None:
            k, i = task
            basis = self._waves[:_basis_waves(k, self._alone_first)]
            self._wait([j for wave in basis for j in wave], me)
            with self._cond:
                cutoff = self._cutoffs_of(k, dict(self._found))[self._waves[k].index(i)]
            found = _best_on_job(self._jobs[i], cutoff)
            with self._cond:
                self._found[i] = found
            self._send(me, (i, found, None))

    def _work(self, me: int) -> None:
        """A forked worker's life: parts searched until none is left (its inbox read), an
        error sent to the caller, with its traceback as a note. An interrupt is the
        caller's to handle (cancel ends the workers); the caller gone, it ends."""
        import signal

        signal.signal(signal.SIGINT, signal.SIG_IGN)
        for other, (reader, writer, _) in enumerate(self._inboxes):
            if other != me:
                reader.close()      # the caller's, and the other workers'
            else:
                writer.close()      # its inbox ends once every other process is gone
        self._listen(me)
        try:
            self._search(me)
        except _CallerGone:
            return
        except BaseException as exc:        # noqa: BLE001 -- the caller raises it
            if exc is self._error:
                return                      # another process's, which it sent
            try:
                self._send(me, (-1, None, _sendable(exc)))
            except (_CallerGone, OSError):
                pass

    def collect(self) -> dict:
        """{part index: (best, reason, dominated)} of every part: the caller searches parts
        here, beside the workers, until none is left to take, then waits for the workers'
        last. The workers are then let go."""
        try:
            self._search(0)
            self._wait([i for _, i in self._order], 0)
            for proc in self._processes:
                while proc.exitcode is None:
                    proc.join(timeout=0.5)
                    if proc.exitcode is None:
                        self._alive(0)
            with self._cond:
                return dict(self._found)
        except BaseException:
            self.cancel()
            raise
        finally:
            self._close_ends()

    def cancel(self) -> None:
        """Stop the searches (the caller's own failed or was interrupted)."""
        if self._cond is not None:
            with self._cond:
                self._stopped = True
                self._cond.notify_all()
        for proc in self._processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self._processes:
            if proc.pid is not None:
                proc.join(timeout=5)
        self._close_ends()

    def _close_ends(self) -> None:
        """Close the pipe ends this process holds; its inbox thread reads to the end of its
        inbox (every worker gone) and stops."""
        for k, (reader, writer, _) in enumerate(self._inboxes):
            if k:
                writer.close()


def start_subsets(spec: Spec, *, measurements: Measurements = NO_MEASUREMENTS,
                  cost_params: CostParams | None = None, simulate_top: int | None = None,
                  backend: str | None = None, limit: int = MAX_SUBSETS, workers: int = 1,
                  shared: SharedRows | None = None) -> EarlySubsets | None:
    """Start `plan_subsets`' waves beside the caller's search of the whole cluster, in forked
    processes, one CPU fewer than `workers` (that search takes one): each node group alone
    first, then each later wave once the waves its cutoffs come from are done, with the
    cutoffs plan_subsets gives it (`_wave_basis`: the whole cluster's plan is not among
    them). None where there is one node group, a single CPU or no fork. Give the result to
    plan_subsets(early=...) with the same spec and options (a spec that names its backend:
    plan_subsets drops parts costed for another backend than its spec's); the caller then
    searches what is left beside the workers, with `shared` (give the SharedRows its own
    search fills)."""
    parts = cluster_subsets(spec.cluster, limit)
    waves = _subset_waves(spec.cluster, parts, spec.training.precision)
    context = _fork_context() if workers > 1 and _alone_first(spec.cluster, parts, waves) \
        else None
    if context is None:
        return None
    jobs = _subset_jobs(spec, parts, measurements=measurements, cost_params=cost_params,
                        simulate_top=simulate_top, backend=backend, shared=shared)
    # the whole cluster's plan is not in any wave's basis (the first is each group alone)
    cutoffs_of = _cutoffs_of(spec, parts, waves, None)
    return EarlySubsets(context, _worker_processes(workers, waves), jobs, waves, cutoffs_of,
                        spec.training.backend)


def groups_alone_uses(cluster: Cluster) -> tuple[tuple[tuple[int, int], ...], ...]:
    """Each node group alone, the others idle, in `cluster_subsets`' form, as listed (none
    for one group)."""
    groups = cluster.node_groups
    if len(groups) < 2:
        return ()
    return tuple(tuple((x.count, x.gpus_per_node) if j == i else (0, 0)
                       for j, x in enumerate(groups)) for i in range(len(groups)))


def dominance_cutoff_s(found, gpus: int, price_per_hour: float | None) -> float | None:
    """The iteration time at and above which a plan on `gpus` devices costing
    `price_per_hour` is dominated by one of the `found` subset plans: no faster, more
    GPU-seconds (time x GPUs) and, where both have a price, no cheaper. For each found plan
    that is max(its time, its time x its GPUs / gpus, its cost / price); the least over
    them, times 1 + SUBSET_CUTOFF_SLACK. None where nothing found can dominate."""
    least = None
    for p in found:
        if p.best is None:
            continue
        t = p.iteration_time_s
        bound = max(t, t * p.gpus / gpus)
        if price_per_hour is not None:
            if p.price_per_hour is None:
                continue            # its cost is not known: it cannot be cheaper
            bound = max(bound, t * p.price_per_hour / price_per_hour)
        least = bound if least is None else min(least, bound)
    return None if least is None else least * (1.0 + SUBSET_CUTOFF_SLACK)


def _fork_context():
    """multiprocessing's fork context, or None where the platform cannot fork (imported
    here: only a search with subsets and several workers needs it)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return None
    return multiprocessing.get_context("fork")


def _best_on_job(job, cutoff_s: float | None) -> tuple[Estimate | None, str, bool]:
    """(the best plan, "", False) on a subset's job (spec, uses, plan()'s keywords), no plan
    at or above `cutoff_s` wanted; (None, why nothing fits, False); or (None, what beats it,
    True) where a plan found elsewhere dominates every plan here."""
    spec, uses, kw = job
    kw = {**kw, "cutoff_s": cutoff_s}
    try:
        return plan_on_subset(spec, uses, **kw).best, "", False
    except Dominated:
        return None, (f"dominated: every plan that fits here is predicted at "
                      f"{kw['cutoff_s']:.4g} s per iteration or more, and a plan on another "
                      f"part of the cluster is faster with no more GPU-seconds or cost"), True
    except NoFeasibleStrategy as exc:
        return None, str(exc), False


def plan_on_subset(spec: Spec, uses: tuple[tuple[int, int], ...], **kw) -> Plan:
    """`plan` on the devices `uses` names (`cluster_subsets`' form), the rest idle, each
    strategy's placement in the whole cluster's device ids (what `launch` runs: those devices
    only). `kw`: as plan()'s."""
    sub, ids = subset_spec(spec, uses)
    result = plan(sub, **kw)

    def whole_ids(e: Estimate) -> Estimate:
        s = e.strategy
        return replace(e, strategy=replace(s, placement=tuple(
            tuple(tuple(ids[d] for d in r) for r in st) for st in s.placement)))

    return replace(result, strategies=tuple(whole_ids(e) for e in result.strategies),
                   baseline=None if result.baseline is None else whole_ids(result.baseline))


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats in both coordinates (lower is better in
    each; of equal points the first), ordered by the first coordinate."""
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1], i))
    front, best_second = [], float("inf")
    for i in order:
        if points[i][1] < best_second:
            front.append(i)
            best_second = points[i][1]
    return front


def choose_subset(subsets: tuple[SubsetPlan, ...], objective: str, global_batch_size: int, *,
                  iterations: int | None = None, deadline_s: float | None = None,
                  budget: float | None = None, max_amplification: float | None = None
                  ) -> SubsetPlan | None:
    """The subset plan that minimizes `objective` (time | cost | gpu_seconds) among those that
    fit, finish `iterations` within `deadline_s`, cost at most `budget` for them, and use at
    most `max_amplification` times the GPU-seconds per sample of the most GPU-efficient one
    (DeepPool's amplification limit); None where none does. Ties: the faster."""
    ok = [s for s in subsets if s.best is not None]
    if max_amplification is not None and ok:
        least = min(s.gpu_seconds_per_sample(global_batch_size) for s in ok)
        ok = [s for s in ok
              if s.gpu_seconds_per_sample(global_batch_size) <= max_amplification * least]
    if deadline_s is not None:
        ok = [s for s in ok if s.iteration_time_s * iterations <= deadline_s]
    if budget is not None:
        ok = [s for s in ok if s.cost_per_iteration is not None
              and s.cost_per_iteration * iterations <= budget]
    ok = [s for s in ok if s.objective_value(objective, global_batch_size) is not None]
    if not ok:
        return None
    return min(ok, key=lambda s: (s.objective_value(objective, global_batch_size),
                                  s.iteration_time_s))


def layout_of(x: Candidate | Strategy) -> tuple[int, int, int, int, int]:
    """(pp, dp, cp, tmp, mbs): what `rank` keeps one strategy of, for a candidate or a
    strategy alike."""
    return x.pp, x.dp, x.cp, x.tmp, x.mbs


def ranking_key(e: Estimate) -> tuple[float, int, str]:
    """Fastest first; times that agree to the 4 significant digits the table shows are
    ordered by the lower peak memory, then by label (a stated, stable order)."""
    peak = max((m.peak_bytes for m in e.memory), default=0)
    return _shown(e.iteration_time_s), peak, e.strategy.label()


def rank(estimates: list[Estimate], pruned: Counter) -> list[Estimate]:
    """Sort by `ranking_key` and keep one strategy per layout (pp, dp, tmp, cp, mbs;
    `layout_of`): the others differ only in ZeRO stage, recomputation, sequence parallelism,
    virtual stages or expert parallelism, which trade memory for time, and a faster setting
    of them fits; they are counted under SLOWER_KNOBS_SAME_LAYOUT. (Each ep a layout of its
    own was tried on 2026-11-30: on the 14 GPT-OSS 120B recipes of benchmarks/
    megatron_bridge.py the plans held 4-5x as many rows, their first ones the same layout's
    ep 4-64 tied within the model's error, and no more recipes came into the top 10.)"""
    seen, out = set(), []
    for e in sorted(estimates, key=ranking_key):
        layout = layout_of(e.strategy)
        if layout in seen:
            pruned[Reason.SLOWER_KNOBS_SAME_LAYOUT.value] += 1
            continue
        seen.add(layout)
        out.append(e)
    return out


def simulate_ranking(model: CostModel, ranked: list[Estimate], baseline: Estimate | None,
                     top: int | None, orders) -> tuple[list[Estimate], Estimate | None]:
    """Re-rank the first `top` strategies (None: the default number) by their simulated
    iteration time (amp_search.simulate.rerank) and simulate the baseline too; top 0: as
    they are."""
    top = DEFAULT_SIMULATE_TOP if top is None else top
    if top <= 0:
        return ranked, baseline
    ranked = rerank(model, ranked, top, ranking_key=ranking_key, orders=orders)
    if baseline is not None:
        baseline = with_simulation(model, baseline, order=next(
            (o for o in orders if o.name == baseline.strategy.placement_order), None))
    return ranked, baseline


def megatron_baseline(spec: Spec, model: CostModel, space: SearchSpace) -> Estimate | None:
    """AMP section 4.1: for each mbs, tmp at most the smallest node, the smallest tmp*pp
    that fits, tensor groups inside nodes (listed order), uniform layer split; the fastest
    of those proposals by the cost model. ZeRO: the spec's first stage. A model with
    experts proposes each searched ep with its expert groups inside a node (ep x tmp at
    most the smallest node; `_baseline_eps`), as Megatron-Bridge's MoE recipes keep their
    all-to-alls on NVLink, ep 1 included. A node here is an NVLink domain
    (`Cluster.nvlink_domains`: a GB200 NVL72 rack's trays are one)."""
    n = space.num_devices
    order = device_orders(spec.cluster, spec.training.precision)[0]
    blocks = space.num_layers - model.first_fixed - model.last_fixed
    zero = space.zero_stages[0]
    sp = space.sequence_parallel[0]
    for ckpt in sorted(set(space.recompute), key=RECOMPUTE_MODES.index):
        proposals = []
        for product in divisors(n):                      # tmp * pp, smallest first
            for tmp in divisors(product):
                pp, dp = product // tmp, n // product
                if tmp > spec.cluster.min_nvlink_gpus or pp > blocks or \
                        space.global_batch_size % dp:
                    continue
                for mbs in divisors(space.global_batch_size // dp):
                    for c in _baseline_eps(spec, space, Candidate.make(
                            pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero, recompute=ckpt,
                            sequence_parallel=sp)):
                        # the split is fixed: memory first, the time of those that fit
                        if first_violation(space, c) is None and model.split_fits(
                                c, order, model.uniform_split(pp)):
                            e = model.evaluate(c, order, partition="uniform")
                            if e.fits:
                                proposals.append(e)
            if proposals:
                break
        if proposals:
            return min(proposals, key=lambda e: e.iteration_time_s)
    return None


def _baseline_eps(spec: Spec, space: SearchSpace, c: Candidate) -> list[Candidate]:
    """The Megatron baseline's proposals of `c` (ep 1): for a model with experts, also each
    searched ep > 1 whose expert groups stay inside a node (ep x tmp at most the smallest
    NVLink domain's GPUs); the rules are checked by the caller."""
    if not spec.model.num_experts:
        return [c]
    return [c] + [replace(c, ep=ep) for ep in space.expert_parallel
                  if ep > 1 and ep * c.tmp <= spec.cluster.min_nvlink_gpus]


def estimate(spec: Spec, *, pp: int, dp: int, tmp: int, mbs: int,
             partition: str | tuple[int, ...] = "optimal", zero_stage: int | None = None,
             activation_checkpointing: bool | str | None = None,
             placement_order: str | None = None,
             measurements: Measurements = NO_MEASUREMENTS,
             cost_params: CostParams | None = None, simulate: bool = False,
             sequence_parallel: bool | None = None,
             virtual_stages: int | None = None, cp: int = 1,
             ep: int | None = None) -> Estimate:
    """Predict one given strategy (the best of the placement orders unless one is named).
    It must satisfy the search space's rules (Infeasible otherwise, naming the rule). A
    strategy that does not fit in memory is still estimated, with `fits` False. simulate:
    also simulate the chosen one's iteration (amp_search.simulate.with_simulation), which
    then gives its iteration_time_s. `activation_checkpointing`: none | selective | full (True
    is full, False none); None and `sequence_parallel` None take the spec's first value.
    `virtual_stages`: model chunks per stage (None: the spec's first value; > 1 the
    interleaved schedule, with Megatron-LM's uniform chunks unless `partition` gives v*pp+1
    boundaries). `cp`: context-parallel ranks per sequence (Megatron-LM's ring attention;
    pp * dp * cp * tmp devices). `ep`: expert-parallel ranks (a model with experts; None:
    the spec's first training.expert_parallel value)."""
    n, L = spec.cluster.num_devices, spec.model.num_layers
    ep = spec.training.expert_parallel[0] if ep is None else ep
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise UsageError(f"--ep must be a positive integer, got {ep!r}")
    for name, v in (("pp", pp), ("dp", dp), ("tmp", tmp), ("mbs", mbs), ("cp", cp)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"--{name} must be a positive integer, got {v!r}")
    if pp * dp * tmp * cp != n:
        names, values = ("pp*dp*tmp", f"{pp}*{dp}*{tmp}") if cp == 1 else \
            ("pp*dp*cp*tmp", f"{pp}*{dp}*{cp}*{tmp}")
        raise UsageError(f"{names} = {values} = {pp * dp * tmp * cp}, but the cluster has "
                         f"{n} devices; the product must equal {n}")
    zero = spec.training.zero_stage[0] if zero_stage is None else zero_stage
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage {zero}: accepted: 0, 1, 2, 3")
    ckpt = activation_checkpointing
    if ckpt is None:
        ckpt = spec.training.activation_checkpointing[0]
    elif isinstance(ckpt, bool):
        ckpt = "full" if ckpt else "none"
    if ckpt not in RECOMPUTE_MODES:
        raise UsageError(f"--activation-checkpointing {ckpt!r}: accepted: "
                         f"{', '.join(RECOMPUTE_MODES)}")
    sp = spec.training.sequence_parallel[0] if sequence_parallel is None \
        else bool(sequence_parallel)
    vs = spec.training.virtual_pipeline_stages[0] if virtual_stages is None else virtual_stages
    if isinstance(vs, bool) or not isinstance(vs, int) or vs < 1:
        raise UsageError(f"--virtual-stages must be a positive integer, got {vs!r}")
    c = Candidate.make(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero, recompute=ckpt,
                       sequence_parallel=sp, virtual_stages=vs, cp=cp, ep=ep)
    rules = FEASIBILITY_RULES
    if isinstance(partition, tuple) and vs > 1:
        # the chunks given (Megatron-LM's --pipeline-model-parallel-layout) need not be equal
        rules = tuple(r for r in rules if r is not chunks_split_blocks)
    violation = first_violation(SearchSpace.of(spec), c, rules)
    if violation is not None:
        raise violation.error()
    model = CostModel(spec, measurements=measurements, cost_params=cost_params)
    if isinstance(partition, tuple):
        n = vs * pp + 1
        if len(partition) != n or partition[0] != 0 or partition[-1] != L or \
                any(a >= b for a, b in zip(partition, partition[1:])):
            raise UsageError(f"--partition {','.join(map(str, partition))}: expected {n} "
                             f"strictly increasing boundaries from 0 to {L}" + (
                                 f" (one per model chunk: v*pp + 1 = {n})" if vs > 1 else ""))
    elif partition == "uniform":
        try:
            model.uniform_split(pp)
        except ValueError as exc:
            raise UsageError(f"--partition uniform: {exc}") from None
    elif partition != "optimal":
        raise UsageError(f"--partition {partition!r}: accepted: optimal, uniform, or "
                         f"boundaries such as 0,12,{L}")
    orders = device_orders(spec.cluster, spec.training.precision)
    if placement_order is not None:
        orders = [o for o in orders if o.name == placement_order] or orders[:1]
    best = min(((model.evaluate(c, o, partition=partition), o) for o in orders),
               key=lambda eo: eo[0].iteration_time_s)
    if not simulate:
        return best[0]
    return with_simulation(model, best[0], order=best[1])


def evaluate(spec: Spec, strategy: Strategy, *, measurements: Measurements = NO_MEASUREMENTS,
             cost_params: CostParams | None = None, model: CostModel | None = None) -> Estimate:
    """Predict a fully given Strategy (its own partition and placement), e.g. to compare
    with a measured trial or to fit a calibration. Pass `model` to reuse its caches."""
    if model is None:
        model = CostModel(spec, measurements=measurements, cost_params=cost_params)
    return model.evaluate(Candidate.of(strategy),
                          placement=np.array(strategy.placement, dtype=np.int64),
                          partition=tuple(strategy.partition))
