"""The kernels of the exact pipeline layer assignment (amp_search.partition): numba
functions over dense float64/int64 arrays, and their plain-Python twins. The problem (T_j,
sync_j, mem_j, the objective and the memory budgets) is stated in amp_search.partition's
docstring; this is how it is solved.

AMP solves eq. 5 with a table dp[i][j][m] over every possible stage time m
(eq. 6-8), in O(pp * L^4) time.  We split the max terms off instead.  Write
lam = gas - 1, S = sum_j T_j + sum_j cut_j, M = max_j T_j, D = max_j sync_j, and

    f(cM, cD) = min S over memory-feasible partitions with every T_j <= cM, sync_j <= cD.

f is non-increasing in both caps, and the minimum of lam * M + D + S equals the
minimum over (cM, cD) of lam * cM + cD + f(cM, cD).  Four parts make that cheap:

1. f(cM, cD) is an O(pp * L) DP (``_capped_min_sum``).  Stage j ending at b costs
   min over starts a of cost[j-1, a] + cut[j, a] + (prefix[j, b] - prefix[j, a]).
   Time, sync and memory are each a sum of non-negative per-layer values over the
   stage, so each constraint admits the starts right of its own leftmost one,
   which only moves right as b grows.  The admissible starts form a window
   [a_min(b), b-1], a_min the largest of the three leftmost starts, and a
   monotone deque gives each minimum in amortised O(1).  Only the band of ends that can still
   lead to an admissible partition is visited.  A solve can also be told s_max,
   the value from which on its result is not needed: a state whose cost plus a
   lower bound on any completion (``_suffix_bound``: the uncapped, memory-feasible
   min-sum of the remaining stages) exceeds s_max is dropped, and the solve
   returns +inf when nothing is left.  A finite result is still exactly f, since
   every dropped path costs more than it.
2. M_lb and D_lb, the smallest achievable max_j T_j and max_j sync_j over the
   memory-feasible partitions, come from a min-max DP (``_min_bottleneck``),
   which stops each scan once the stage alone is too slow (or too big).
3. A one-dimensional branch and bound (the walk).  Given a coordinate c of a
   partition with weight w > 0, and g(cap) = min over partitions with c <= cap of
   the rest R of the objective, which a solve returns with a solution of
   coordinate c* <= cap: that solution's value is w * c* + g(cap), and no
   partition with c in [c*, cap] does better (its R is >= g(cap), its c >= c*),
   which settles [c*, cap]; below c*, R >= g(cap).  A pending interval [lo, hi]
   of c comes with r_low <= R of every partition whose c lies in it; such a
   partition beats the incumbent best only if w * c + r_low < best, so hi shrinks
   to (best - r_low) / w as best improves.  A fresh interval is solved at its
   midpoint, to find better solutions early; the part left above a midpoint is
   solved at its top; a solve that finds nothing closes [lo, cap].  Invariant:
   every admissible partition that beats best has its c in a pending interval
   whose r_low is <= its R.  The walk stops when no interval is left, and then
   best is optimal.  It ends: each solve either finds a value of c inside its
   interval, which no later interval holds, or closes part of the interval.
4. Nesting.  With h(cM) = min S + D (the inner objective) over partitions with
   M <= cM, the objective is lam * M + (S + D): the outer walk
   (``_optimal_boundaries``) runs over M with w = lam and g = h.  Each h(cap) is
   itself a walk over D with w = 1, R = S and g(cD) = f(cap, cD) (the inner walk,
   ``_min_inner_objective``; each solve ``_capped_min_sum_by_axis``, which takes the
   caps by walk axis).  The outer walk needs h(cap) only below
   t = best - lam * lo, for the interval [lo, hi] it solves: a partition with M in
   [lo, cap] and S + D >= t has value >= best.  So the inner walk prunes its
   intervals at limit = min(the least S + D it found, t), tells each solve of a D
   interval [lo', ...] that results from limit - lo' on do not matter (s_max), and
   reports closed when h(cap) >= t; the outer walk then closes [lo, cap].  When
   the least S + D found ends below the final t, it is h(cap) exactly: every
   pruned inner interval had its bound at or above the limit of its time, and
   limits only decrease, to that least value.
   The outer walk starts from f(inf, inf) (+inf: nothing fits in memory, no
   answer) and its solution, the incumbents of f(M_lb, inf) and f(inf, D_lb),
   and the interval [M_lb, (best - r0) / lam] with r0 = f(inf, inf) + D_lb,
   which is <= S + D of every partition.  gas == 1 drops the M term (the walk
   runs over D alone, each node one solve); without sync arrays D = 0, h = f
   and this is the eq. 5 search over M alone; without either, f(inf, inf) is the
   answer (one solve).

The result is exact up to float rounding of the prefix sums (~1e-15 relative).
The DP compares each capped quantity with its cap using the same prefix
differences that give each solution's coordinates, so no epsilon is needed; the
only tolerance is the relative 1e-12 margin by which s_max pruning errs on the
safe side.  Integer byte counts (below 2^53) make memory sums exact.

Cost: one solve is O(pp * L), much less when the caps leave a narrow band; the
min-max DPs are O(pp * L^2) at worst.  A walk takes at most about 2 K solves
for K distinct values of its coordinate in its window (only a solve that finds
a new value opens a lower interval, and only those open an upper one), so a
call takes O(K_M * K_D) solves at worst.  Without sync, the walk over M takes 3 to 15 solves in
practice.  With sync and memory budgets, a call on a 130-layer chain takes a
median of 10 to 35 solves and 25 to 250 us; it climbs to hundreds of solves
(1-2 ms) when both lam * M + S and D + S are nearly flat along their
frontiers, mostly for gas 2 to 8 with several device speeds and sync
coefficients (benchmarks/partition_dp.py --mode full).

The kernels form a cost_models._jit.KernelGroup (``GROUP``): built ahead of time into an
extension module that loads without numba (cost_models._aot), else ``numba.njit(cache=True)``
functions from their first call (``_kernel``: without an on-disk cache, and one warning
saying so, where numba finds no writable cache folder), so that importing this module does
not import numba.  ``solve`` is the entry point; ``PYTHON_TWINS`` holds the very same code as
plain Python, which amp_search.partition runs for ``use_numba=False`` and, through
cost_models._jit.pick, until the compiled kernels are in the cache; the tests compare the
two.  ``kernels_cached`` tells whether a compiled build is there.
"""

from __future__ import annotations

import math

import numpy as np

from cost_models import _jit

KERNELS_WHAT = "partition kernels"
"""The name of this module's kernels in cost_models._jit's warnings."""


_KERNEL_NAMES = ("_capped_min_sum", "_suffix_bound", "_min_bottleneck", "_trace", "_bottleneck",
                 "_push_interval", "_capped_min_sum_by_axis", "_coordinate", "_take_solution",
                 "_min_inner_objective", "_optimal_boundaries", "_prefix", "solve")
"""The kernels, callees before callers (the order numba compiles them in)."""

GROUP = _jit.KernelGroup(globals(), group="partition", what=KERNELS_WHAT, names=_KERNEL_NAMES,
                         entries=("solve",))
"""The kernels' three ways to run: ahead of time, numba, plain Python (cost_models._jit)."""
_lazy = GROUP.lazy


def _kernel(fn):
    """``numba.njit(cache=True)(fn)``, or without the on-disk cache where none can be
    written (cost_models._jit)."""
    return _jit.njit(fn, what=KERNELS_WHAT)


# Shared array conventions, for a chain of L layers cut into pp stages:
#   prefix[j, b]  (pp, L+1) float64: time of layers [0, b) on stage j's devices,
#                 so stage j holding layers [a, b) takes prefix[j, b] - prefix[j, a].
#   cut[j, a]     (pp, L+1) float64: p2p cost between stages j-1 and j when stage j
#                 starts at layer a (row 0 is never read).
#   Stage j (0-based) ends at a boundary b in [j+1, j+1+slack], slack = L - pp,
#   because every stage before it and after it needs at least one layer.


@_lazy
def _capped_min_sum(prefix, cut, cap, sprefix, sfixed, scap, mprefix, mbudget, has_mem,
                    rest, s_max, cost, start, window, window_key):
    """f(cap, scap): min of sum_j T_j + sum_j cut_j over memory-feasible partitions with
    every T_j <= cap and every sync_j <= scap; +inf when there is none, and possibly when
    it is above s_max (the caller does not need it then, see rest).  A finite result is
    always exact, with its solution in start.

    sprefix, sfixed, scap: sync_j = sfixed[j] + sprefix[j, b] - sprefix[j, a]; scap = +inf
                  skips the test.  mprefix, mbudget, has_mem: memory of stage j is
                  mprefix[j, b] - mprefix[j, a] <= mbudget[j]; tested only when has_mem.
    rest[j, b]    lower bound on the cost of stages j.. covering [b, L) (_suffix_bound):
                  a prefix state whose cost plus rest exceeds s_max (with a relative
                  1e-12 margin for rounding) cannot lead below s_max and is dropped.
                  An empty rest (or s_max = +inf) turns this off.
    cost[j, b]    (out) min of sum_{i<=j} (T_i + cut_i) over stages 0..j covering
                  layers [0, b), every stage admissible; +inf if nothing is (or dropped).
    start[j, b]   (out) first layer of stage j in that optimum (for _trace).
    window[k]     scratch deque of candidate starts a of stage j (= ends of stage
                  j-1), increasing in a and in window_key[k], where
    window_key[k] = cost[j-1, a] + cut[j, a] - prefix[j, a]  (= cost[j, b] - prefix[j, b]).
    The admissible starts of a stage ending at b form a window [a_min(b), b-1]:
    each constraint admits the starts from its own leftmost one (the stage's time,
    sync and memory only grow as a falls, layers being >= 0), a_min(b) is the
    largest of the three, and each only moves right as b grows.  So the deque drops
    starts at its head for good: those too slow for cap, and those left of two
    pointers that track the leftmost start meeting the sync cap and the budget.
    low_end[j]    no admissible partition ends stage j before low_end[j].
    Only the band of ends that can hold a finite cost is visited and written:
    from low_end[j] up to where the starts offered by stage j-1 run out.
    """
    pp = prefix.shape[0]
    L = prefix.shape[1] - 1
    slack = L - pp
    has_t = cap < np.inf
    has_s = scap < np.inf
    prune = rest.shape[0] > 0 and s_max < np.inf
    drop = s_max + 1e-12 * abs(s_max) if prune else np.inf

    # Backward pass: stage j+1 must reach low_end[j+1] admissibly, so stage j
    # ends no earlier than the lowest start a for which [a, low_end[j+1]) is
    # admissible (or low_end[j+1] itself when not even one layer is).
    low_end = np.empty(pp, dtype=np.int64)
    low_end[pp - 1] = L
    for j in range(pp - 2, -1, -1):
        e = low_end[j + 1]
        a = e
        if not (has_t or has_s or has_mem):
            a = j + 1
        while a - 1 >= j + 1:
            if prefix[j + 1, e] - prefix[j + 1, a - 1] > cap:
                break
            if has_s and sfixed[j + 1] + (sprefix[j + 1, e] - sprefix[j + 1, a - 1]) > scap:
                break
            if has_mem and mprefix[j + 1, e] - mprefix[j + 1, a - 1] > mbudget[j + 1]:
                break
            a -= 1
        low_end[j] = a

    # Stage 0 holds [0, b).  [lo, hi] is the band of ends of the previous stage.
    lo = low_end[0]
    hi = lo - 1
    kept = False
    for b in range(lo, slack + 2):
        t = prefix[0, b] - prefix[0, 0]
        if t > cap:
            break
        if has_s and sfixed[0] + (sprefix[0, b] - sprefix[0, 0]) > scap:
            break
        if has_mem and mprefix[0, b] - mprefix[0, 0] > mbudget[0]:
            break
        if prune and t + rest[1, b] > drop:
            t = np.inf
        else:
            kept = True
        cost[0, b] = t
        start[0, b] = 0
        hi = b
    if not kept:
        return np.inf

    for j in range(1, pp):
        prev = cost[j - 1]  # row views: prev[a] = cost[j-1, a], pre[b] = prefix[j, b]
        row = cost[j]
        pre = prefix[j]
        spre = sprefix[j]
        mpre = mprefix[j]
        fixed = sfixed[j]
        budget = mbudget[j]
        e = cut[j]
        head = 0
        tail = 0  # window[head:tail] is the live deque
        a_s = lo  # leftmost start (>= lo) meeting the sync cap, the memory budget
        a_m = lo
        new_lo = -1
        new_hi = -1
        for b in range(lo + 1, j + 2 + slack):
            a = b - 1  # start a = b-1 becomes available once stage j may end at b
            if a <= hi:
                if prev[a] < np.inf:
                    key = prev[a] + e[a] - pre[a]
                    while tail > head and window_key[tail - 1] >= key:
                        tail -= 1
                    window[tail] = a
                    window_key[tail] = key
                    tail += 1
            elif head == tail:
                break  # no start is left for this end or any later one
            # starts whose stage [a, b) breaks a constraint never fit again
            if has_s or has_mem:
                a_min = lo
                if has_s:
                    while a_s < b and fixed + (spre[b] - spre[a_s]) > scap:
                        a_s += 1
                    a_min = a_s
                if has_mem:
                    while a_m < b and mpre[b] - mpre[a_m] > budget:
                        a_m += 1
                    if a_m > a_min:
                        a_min = a_m
                while head < tail and window[head] < a_min:
                    head += 1
            while head < tail and pre[b] - pre[window[head]] > cap:
                head += 1
            if b < low_end[j]:
                continue
            v = np.inf
            if head < tail:
                a = window[head]
                v = prev[a] + e[a] + (pre[b] - pre[a])
                if prune and v + rest[j + 1, b] > drop:
                    v = np.inf
                else:
                    start[j, b] = a
                    if new_lo < 0:
                        new_lo = b
                    new_hi = b
            row[b] = v
        if new_lo < 0:
            return np.inf
        lo = new_lo
        hi = new_hi
    return cost[pp - 1, L]


@_lazy
def _suffix_bound(prefix, cut, mprefix, mbudget, has_mem, rest, window, window_key):
    """rest[j, b] (out, pp+1 x L+1): min of sum (T_i + cut_i) over stages i = j..pp-1
    covering layers [b, L) within the memory budgets, with no time or sync cap, cut_j
    included; +inf where no such split exists.  rest[pp, L] = 0; row 0 is not computed.

    The same sliding-window DP as _capped_min_sum, run from the right: stage j starting
    at b may end at e in [b+1, e_max(b)], and e_max(b) only moves left as b does.
    Every capped solve's completion from (j, b) costs at least rest[j, b]."""
    pp = prefix.shape[0]
    L = prefix.shape[1] - 1
    rest[:, :] = np.inf
    rest[pp, L] = 0.0
    for j in range(pp - 1, 0, -1):  # row 0 is never read
        pre = prefix[j]
        mpre = mprefix[j]
        nxt = rest[j + 1]
        budget = mbudget[j]
        head = 0
        tail = 0  # window[head:tail]: ends e, decreasing in e, increasing in key
        e_top = L - (pp - 1 - j)  # stage j ends at or before e_top ...
        e_add = e_top + 1  # ... ends >= e_add are already in the window
        for b in range(e_top - 1, j - 1, -1):  # ... and starts at b in [j, e_top)
            while e_add > b + 1:  # end e = e_add - 1 becomes available
                e_add -= 1
                if nxt[e_add] < np.inf:
                    key = pre[e_add] + nxt[e_add]
                    while tail > head and window_key[tail - 1] >= key:
                        tail -= 1
                    window[tail] = e_add
                    window_key[tail] = key
                    tail += 1
            if has_mem:
                while head < tail and mpre[window[head]] - mpre[b] > budget:
                    head += 1
            if head < tail:
                rest[j, b] = window_key[head] - pre[b] + cut[j, b]


@_lazy
def _min_bottleneck(prefix, offset, mprefix, mbudget, has_mem, upper, worst):
    """Smallest achievable max_j q_j, q_j = offset[j] + prefix[j, b_{j+1}] - prefix[j, b_j],
    over the memory-feasible partitions (min-max DP).

    With the time prefix and offset 0 this is M_lb, the least max_j T_j; with the sync
    prefix and offset sync_fixed_s it is D_lb, the least max_j sync_j.  upper: the max q
    of a partition known to be memory-feasible (+inf if none is known); values >= upper
    are not resolved, so the result is min(the min-max, upper).
    worst[j, b]  (out) min over memory-feasible partitions of layers [0, b) into
                 stages 0..j of their largest q (or upper).
    Scanning starts a downwards, the last stage only gets worse (larger q, more
    memory), so the scan stops once that stage alone is no better than the best
    found, or breaks the memory budget.
    """
    pp = prefix.shape[0]
    L = prefix.shape[1] - 1
    slack = L - pp
    for b in range(1, slack + 2):
        t = offset[0] + (prefix[0, b] - prefix[0, 0])
        if (has_mem and mprefix[0, b] - mprefix[0, 0] > mbudget[0]) or t > upper:
            t = upper
        worst[0, b] = t
    for j in range(1, pp):
        first_b = L if j == pp - 1 else j + 1  # the last stage must end at L
        pre = prefix[j]
        mpre = mprefix[j]
        prev = worst[j - 1]
        for b in range(first_b, j + 2 + slack):
            best = upper
            for a in range(b - 1, j - 1, -1):
                t = offset[j] + (pre[b] - pre[a])
                if t >= best:
                    break
                if has_mem and mpre[b] - mpre[a] > mbudget[j]:
                    break
                v = prev[a]
                if t > v:
                    v = t
                if v < best:
                    best = v
            worst[j, b] = best
    return worst[pp - 1, L]


@_lazy
def _trace(start, L):
    """Boundaries b_0..b_pp of the optimum stored in start[j, b] (see _capped_min_sum)."""
    pp = start.shape[0]
    bounds = np.empty(pp + 1, dtype=np.int64)
    bounds[pp] = L
    for j in range(pp - 1, 0, -1):
        bounds[j] = start[j, bounds[j + 1]]
    bounds[0] = 0
    return bounds


@_lazy
def _bottleneck(prefix, offset, bounds):
    """max_j (offset[j] + stage j's prefix difference), by the same prefix differences the
    DP compares: max_j T_j with offset 0, max_j sync_j with the sync prefix."""
    m = 0.0
    for j in range(prefix.shape[0]):
        t = offset[j] + (prefix[j, bounds[j + 1]] - prefix[j, bounds[j]])
        if t > m:
            m = t
    return m


@_lazy
def _push_interval(stack, top, lo, hi, s_low, probe):
    """Push a walk's pending interval [lo, hi] of its coordinate, with s_low (the lower
    bound on the rest of the objective there) and probe (1.0: solve it at its midpoint,
    0.0: at its top): stack[top] = (lo, hi, s_low, probe), doubling stack when full.
    Returns (stack, top + 1)."""
    if top == stack.shape[0]:
        stack = np.concatenate((stack, np.empty_like(stack)))
    stack[top, 0] = lo
    stack[top, 1] = hi
    stack[top, 2] = s_low
    stack[top, 3] = probe
    return stack, top + 1


@_lazy
def _capped_min_sum_by_axis(q, ws, o, cap_o, cap_i, s_max, rest):
    """f with the caps given per walk axis: cap_o on axis o and cap_i on the other one
    (axis 0: time, so the cap on max_j T_j; axis 1: sync, the cap on max_j sync_j), pruned
    at s_max (see _capped_min_sum).  q: the problem arrays, ws: the scratch arrays
    (_optimal_boundaries).
    """
    prefix, sprefix, sfixed, zero, cut, mprefix, mbudget, has_mem = q
    cost, start, window, window_key = ws
    cap_m = cap_o if o == 0 else cap_i
    cap_d = cap_i if o == 0 else cap_o
    return _capped_min_sum(prefix, cut, cap_m, sprefix, sfixed, cap_d, mprefix, mbudget,
                           has_mem, rest, s_max, cost, start, window, window_key)


@_lazy
def _coordinate(q, use, a, bounds):
    """Coordinate a of a partition: max_j T_j (a = 0) or max_j sync_j (a = 1), and 0 when
    that term is not in the objective."""
    if not use[a]:
        return 0.0
    if a == 0:
        return _bottleneck(q[0], q[3], bounds)
    return _bottleneck(q[1], q[2], bounds)


@_lazy
def _take_solution(q, use, o, w_o, w_i, start, L, s, best, best_bounds, h, h_o):
    """The solution a solve of value s (finite) left in `start`: traced, its inner value
    w_i * (coordinate i) + s and its coordinate o; it replaces the incumbent (best,
    best_bounds) of the full objective w_o * (coordinate o) + inner value where lower, and
    (h, h_o) where its inner value is lower. Returns (coordinate i, best, best_bounds, h,
    h_o)."""
    bounds = _trace(start, L)
    c_o = _coordinate(q, use, o, bounds)
    c_i = _coordinate(q, use, 1 - o, bounds)
    value = w_i * c_i + s
    if w_o * c_o + value < best:
        best = w_o * c_o + value
        best_bounds = bounds
    if value < h:
        h = value
        h_o = c_o
    return c_i, best, best_bounds, h, h_o


@_lazy
def _min_inner_objective(q, ws, use, weight, o, cap_o, w_lo, i_lb, best, best_bounds, rest,
                         pending):
    """h(cap_o) = min over partitions with coordinate o <= cap_o of the inner objective
    S + w_i * coordinate i, by the inner walk over the other axis i (module docstring,
    parts 3 and 4).

    w_lo: weight[o] times the least coordinate o the caller asks about; h only matters
    below best - w_lo, and once it is known not to, the walk stops and reports closed.
    i_lb: the least coordinate i of any memory-feasible partition.  rest: completion
    bounds for pruning (_suffix_bound, or empty).  Every solution met also updates
    (best, best_bounds), the incumbent of the full objective.  Returns (h, coordinate o
    of an h-optimal solution, closed, best, best_bounds, solves); h is exact unless
    closed, which includes nothing fitting under cap_o.
    """
    i = 1 - o
    L = q[0].shape[1] - 1
    start = ws[1]
    inf = np.inf
    w_o = weight[o]
    w_i = weight[i]
    # f(cap_o, inf) bounds S in the whole walk; it matters below best - w_lo - w_i * i_lb
    s0 = _capped_min_sum_by_axis(q, ws, o, cap_o, inf, best - w_lo - w_i * i_lb, rest)
    solves = 1
    if s0 == inf:
        return inf, 0.0, True, best, best_bounds, solves
    _, best, best_bounds, h, h_o = _take_solution(q, use, o, w_o, w_i, start, L, s0, best,
                                                  best_bounds, inf, 0.0)
    if not use[i] or w_i * i_lb + s0 >= best - w_lo:  # h is known, or >= best - w_lo
        return h, h_o, not (h < best - w_lo), best, best_bounds, solves
    # Bottom: the cheapest solution with coordinate i = i_lb, if one fits under cap_o; it
    # settles i_lb.  The walk then covers (i_lb, inf), where S >= s0.
    s = _capped_min_sum_by_axis(q, ws, o, cap_o, i_lb, min(h, best - w_lo) - w_i * i_lb,
                                rest)
    solves += 1
    if s < inf:
        _, best, best_bounds, h, h_o = _take_solution(q, use, o, w_o, w_i, start, L, s, best,
                                                      best_bounds, h, h_o)
    top = 0
    pending, top = _push_interval(pending, top, math.nextafter(i_lb, inf), inf, s0, 1.0)
    while top > 0:
        top -= 1
        lo = pending[top, 0]
        s_low = pending[top, 2]
        probe = pending[top, 3] == 1.0
        limit = min(h, best - w_lo)
        hi = min(pending[top, 1], (limit - s_low) / w_i)
        if hi < lo:
            continue
        cap = lo + 0.5 * (hi - lo) if probe else hi
        s = _capped_min_sum_by_axis(q, ws, o, cap_o, cap, limit - w_i * lo, rest)
        solves += 1
        if cap < hi:  # (cap, hi]: nothing new known about it
            pending, top = _push_interval(pending, top, math.nextafter(cap, inf), hi, s_low, 0.0)
        if s == inf:  # nothing under cap fits, or gets below limit: [lo, cap] is closed
            continue
        c_i, best, best_bounds, h, h_o = _take_solution(q, use, o, w_o, w_i, start, L, s,
                                                        best, best_bounds, h, h_o)
        below = math.nextafter(c_i, -inf)
        if below >= lo:  # [lo, c_i): S >= s now; popped first
            pending, top = _push_interval(pending, top, lo, below, s, 1.0)
    return h, h_o, not (h < best - w_lo), best, best_bounds, solves


@_lazy
def _optimal_boundaries(prefix, cut, gas, sprefix, sfixed, has_sync, mprefix, mbudget, has_mem):
    """Boundaries minimising the full objective, and the number of f solves: the set-up and
    the outer walk of the module docstring, parts 2 to 4.  The boundaries are empty when no
    partition is memory-feasible."""
    pp = prefix.shape[0]
    L = prefix.shape[1] - 1
    inf = np.inf
    zero = np.zeros(pp)  # per-stage offset of the time coordinate
    q = (prefix, sprefix, sfixed, zero, cut, mprefix, mbudget, has_mem)
    cost = np.empty((pp, L + 1))
    start = np.zeros((pp, L + 1), dtype=np.int64)
    window = np.empty(L + 1, dtype=np.int64)
    window_key = np.empty(L + 1)
    ws = (cost, start, window, window_key)
    pending_o = np.empty((4, 4))
    pending_i = np.empty((4, 4))
    use = np.array([gas > 1, has_sync])  # which max terms are in the objective
    weight = np.array([gas - 1.0, 1.0])
    o = 0 if use[0] else 1  # the outer walk's axis: M, or D when gas == 1
    i = 1 - o
    w_o = weight[o]
    w_i = weight[i]
    rest = np.empty((0, 0))  # completion bounds for pruning; little use for eq. 5 alone
    if has_sync:
        rest = np.empty((pp + 1, L + 1))
        _suffix_bound(prefix, cut, mprefix, mbudget, has_mem, rest, window, window_key)

    # Top of the frontier: f(inf, inf), which also tells whether anything fits in memory.
    s_top = _capped_min_sum_by_axis(q, ws, o, inf, inf, inf, rest)
    if s_top == inf:
        return np.empty(0, dtype=np.int64), 1
    solves = 1
    best_bounds = _trace(start, L)
    if not use[o]:  # neither max term: f(inf, inf) is the optimum
        return best_bounds, solves
    c_o = _coordinate(q, use, o, best_bounds)
    c_i = _coordinate(q, use, i, best_bounds)
    best = w_o * c_o + w_i * c_i + s_top
    i_lb = 0.0
    if use[i]:  # i == 1: the least max_j sync_j
        i_lb = _min_bottleneck(sprefix, sfixed, mprefix, mbudget, has_mem, c_i, cost)
    if o == 0:  # the least max_j T_j
        o_lb = _min_bottleneck(prefix, zero, mprefix, mbudget, has_mem, c_o, cost)
    else:
        o_lb = _min_bottleneck(sprefix, sfixed, mprefix, mbudget, has_mem, c_o, cost)

    # Bottom of the frontier: the cheapest solution with the least coordinate o (and, with
    # both terms, the cheapest one with the least coordinate i), for early incumbents;
    # neither matters unless below best.
    s_max = best - w_o * o_lb - w_i * i_lb
    s = _capped_min_sum_by_axis(q, ws, o, o_lb, inf, s_max, rest)
    solves += 1
    if s < inf:
        bounds = _trace(start, L)
        value = w_o * _coordinate(q, use, o, bounds) + w_i * _coordinate(q, use, i, bounds) + s
        if value < best:
            best = value
            best_bounds = bounds
    lo = o_lb
    if use[i]:
        s = _capped_min_sum_by_axis(q, ws, o, inf, i_lb, s_max, rest)
        solves += 1
        if s < inf:
            bounds = _trace(start, L)
            value = w_o * _coordinate(q, use, o, bounds) + w_i * i_lb + s
            if value < best:
                best = value
                best_bounds = bounds
    else:  # h = f, so f(o_lb) and its solution settle coordinate o_lb
        lo = math.nextafter(o_lb, inf)

    # The outer walk over coordinate o, with h(cap) from the inner walk; S + w_i * c_i is
    # at least s_top + w_i * i_lb for every partition.
    s_low = s_top + w_i * i_lb
    pending_o, top = _push_interval(pending_o, 0, lo, (best - s_low) / w_o, s_low, 1.0)
    while top > 0:
        top -= 1
        lo = pending_o[top, 0]
        hi = min(pending_o[top, 1], (best - pending_o[top, 2]) / w_o)
        s_low = pending_o[top, 2]
        probe = pending_o[top, 3] == 1.0
        if hi < lo:
            continue
        cap = lo + 0.5 * (hi - lo) if probe else hi
        h, c_o, closed, best, best_bounds, k = _min_inner_objective(
            q, ws, use, weight, o, cap, w_o * lo, i_lb, best, best_bounds, rest, pending_i)
        solves += k
        if cap < hi:  # (cap, hi]: nothing new known about it
            pending_o, top = _push_interval(pending_o, top, math.nextafter(cap, inf), hi, s_low,
                                            0.0)
        if closed:  # h(cap) >= best - w_o * lo, or nothing fits: [lo, cap] is closed
            continue
        below = math.nextafter(c_o, -inf)
        if below >= lo:  # [lo, c_o): S + w_i * c_i >= h now; popped first
            pending_o, top = _push_interval(pending_o, top, lo, below, h, 1.0)
    return best_bounds, solves


@_lazy
def _prefix(values):
    """(pp, L+1) running sums of the rows of values (pp, L)."""
    pp, L = values.shape
    prefix = np.zeros((pp, L + 1))
    for j in range(pp):
        for l in range(L):
            prefix[j, l + 1] = prefix[j, l] + values[j, l]
    return prefix


@_lazy
def solve(times, cut, gas, sync_layer, sync_fixed, has_sync, mem_layer, mem_budget, has_mem):
    """amp_search.partition.optimal_partition's kernel: (boundaries, T_j per stage, sync_j
    per stage, full objective, f solves).  The boundaries are empty when nothing is
    memory-feasible.

    times[j, l] (pp, L) is stage_layer_time_s; sync_layer, sync_fixed and mem_layer,
    mem_budget are only read when has_sync / has_mem.  The returned stage times and syncs
    are summed layer by layer, not taken as prefix differences, which would cancel.
    """
    pp, L = times.shape
    prefix = _prefix(times)
    sprefix = _prefix(sync_layer) if has_sync else np.zeros((pp, 1))  # (pp, 1): never read
    mprefix = _prefix(mem_layer) if has_mem else np.zeros((pp, 1))
    bounds, solves = _optimal_boundaries(prefix, cut, gas, sprefix, sync_fixed, has_sync,
                             mprefix, mem_budget, has_mem)
    stage_time = np.zeros(pp)
    stage_sync = np.zeros(pp)
    if bounds.size == 0:
        return bounds, stage_time, stage_sync, np.inf, solves
    total = 0.0  # sum_j T_j + sum_j cut_j, summed in a fixed order (same in Python)
    for j in range(pp):
        for l in range(bounds[j], bounds[j + 1]):
            stage_time[j] += times[j, l]
        total += stage_time[j]
        if j > 0:
            total += cut[j, bounds[j]]
        if has_sync:
            stage_sync[j] = sync_fixed[j]
            for l in range(bounds[j], bounds[j + 1]):
                stage_sync[j] += sync_layer[j, l]
    t_max = stage_time[0]  # the maxima by loop: np.max would tie the cached kernel to
    s_max = stage_sync[0]  # numba.np.arraymath, whose import loads scipy (cost_models._jit)
    for j in range(1, pp):
        t_max = max(t_max, stage_time[j])
        s_max = max(s_max, stage_sync[j])
    objective = (gas - 1) * t_max + total + s_max
    return bounds, stage_time, stage_sync, objective, solves


PYTHON_TWINS = GROUP.twins
"""Plain-Python twins of the kernels (use_numba=False)."""


def kernels_cached() -> bool:
    """Whether ``solve`` runs compiled without compiling here (~15 s): built ahead of time,
    or in numba's on-disk cache for this machine (loading ``solve`` from that cache needs
    none of the kernels it calls, so its index alone decides; cost_models._jit.in_cache)."""
    return GROUP.cached()
