"""The schedule simulator's event loop (`cost_models.simulator`): numba kernels over arrays,
and their plain-Python twins.

`event_loop` plays one iteration out: compute tasks on each stage's stream, flows (transfers
and collectives) on FIFO communication streams, max-min fair link sharing; it returns every
task's start and end and the critical path. `exposed_comm_time` sums, per stage, the time its
flows are in flight while its compute stream is idle. The loop is O(E log E) in the E tasks:
where flows can share a link the events are taken in time order (a binary heap), otherwise
every duration is fixed and they are taken from a stack.

The kernels form a `cost_models._jit.KernelGroup` (`GROUP`): built ahead of time into an
extension module that loads without numba (cost_models._aot), else a numba function
(``numba.njit(cache=True, error_model="numpy")``, with numba's on-disk cache) from the first
call of any kernel, so that importing this module does not import numba; `GROUP.cached`
says whether either is there (amp_search.kernels builds both in the background). `pick`
gives the kernel to call: compiled, or its plain-Python twin (the very same code), for
``use_numba=False`` (the tests compare the two) and while `cost_models._jit.
python_until_cached` waits for the cache.
"""
from __future__ import annotations

import math

import numpy as np

from . import _jit

KERNELS_WHAT = "schedule simulator kernels"
"""The name of this module's kernels in cost_models._jit's warnings."""

FLOW_P2P, FLOW_BUCKET, FLOW_GATHER, FLOW_PREFETCH = 0, 1, 2, 3
"""Flow kinds (the loop's f_kind): a P2P transfer (its end wakes the receiver, and ends the
blocking tasks that hold it); a gradient bucket (the optimizer step waits for all of a stage's
buckets); the weight all-gather after the step (it ends the stage); ZeRO 3's per-layer
parameter all-gather (made ready by op_pre)."""

_EV_COMPUTE_END, _EV_LATENCY_END, _EV_FLOW_END = 0, 1, 2
_NUM_EV = 3


_KERNEL_NAMES = ("_heap_push", "_heap_pop", "_wake_stream", "event_loop", "exposed_comm_time")
"""The kernels, callees before callers (the order `GROUP.materialize` compiles them in)."""

GROUP = _jit.KernelGroup(globals(), group="simulator", what=KERNELS_WHAT, names=_KERNEL_NAMES,
                         entries=("event_loop", "exposed_comm_time"), error_model="numpy")
"""The kernels' three ways to run: ahead of time, numba (``njit(cache=True,
error_model="numpy")``: every division is guarded), plain Python (cost_models._jit)."""
_kernel = GROUP.lazy


def pick(name: str, use_numba: bool):
    """The kernel `name` to call: built ahead of time, numba's, or its plain-Python twin
    (use_numba False, or while cost_models._jit.python_until_cached waits for the cache)."""
    return GROUP.kernel(name, use_numba)


@_kernel
def _heap_push(h_t, h_s, h_k, n, t, s, k, ordered):
    """Push (t, s, k) on the binary min-heap of the first n entries, ordered by (t, s), or
    (ordered False) on top of a stack. The arrays must have room for n + 1 entries."""
    i = n
    while ordered and i > 0:
        p = (i - 1) >> 1
        if h_t[p] < t or (h_t[p] == t and h_s[p] < s):
            break
        h_t[i] = h_t[p]
        h_s[i] = h_s[p]
        h_k[i] = h_k[p]
        i = p
    h_t[i] = t
    h_s[i] = s
    h_k[i] = k


@_kernel
def _wake_stream(s, sm_in, sm_stack, n_sm):
    """Put communication stream s on the stack of streams to serve (once); returns the new
    stack size."""
    if not sm_in[s]:
        sm_in[s] = True
        sm_stack[n_sm] = s
        n_sm += 1
    return n_sm


@_kernel
def _heap_pop(h_t, h_s, h_k, n, ordered):
    """Remove the least of the first n > 0 entries (ordered False: the top of the stack);
    returns its (t, k)."""
    if not ordered:
        return h_t[n - 1], h_k[n - 1]
    t0 = h_t[0]
    k0 = h_k[0]
    n -= 1
    t = h_t[n]
    s = h_s[n]
    k = h_k[n]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= n:
            break
        if c + 1 < n and (h_t[c + 1] < h_t[c] or (h_t[c + 1] == h_t[c] and h_s[c + 1] < h_s[c])):
            c += 1
        if t < h_t[c] or (t == h_t[c] and s < h_s[c]):
            break
        h_t[i] = h_t[c]
        h_s[i] = h_s[c]
        h_k[i] = h_k[c]
        i = c
    if n > 0:
        h_t[i] = t
        h_s[i] = s
        h_k[i] = k
    return t0, k0


@_kernel
def event_loop(pp, op_dur, op_dep, op_out, op_emit, overlap, stage_nb, stage_bptr,
               stage_buckets, f_stream, f_wake, f_kind, f_lat, f_bytes, f_alone, b_frac,
               f_lptr, f_link, f_mult, s_ptr, s_flow, l_bw, l_ptr, ordered, op_xfer,
               blocking, op_pre):
    """The discrete-event loop (numba-compiled; `GROUP.twins` holds the same code as plain
    Python). cost_models.simulator_inputs builds its arguments.

    Every task starts at the latest of its constraints (its stream's previous task, its
    input, its buckets), so where no flow can share a link every duration is fixed and the
    events may be taken in any order (ordered False: a stack); with sharing they are taken
    in time order (a binary heap), which the fluid rates need.

    Compute task (j, k), k < K = op_dur.shape[1] (the last one is the optimizer step), has
    id j*K + k; flow f has id pp*K + f. f_alone[f] > 0: the flow can never share a link
    (each of its links carries one stream), so it runs at that rate without the fluid
    machinery. Returns the start, end and binding predecessor of every task, each stage's
    end and last task, and whether every task ran.

    blocking: op_xfer[j, k, q] >= 0 makes compute task (j, k) a blocking send or receive of
    those P2P flows (one, or a paired send and receive): a flow becomes ready when both its
    sender and its receiver have reached their task for it (a rendezvous, at the later
    arrival), and a task ends when the last of its flows ends.

    op_pre[j, k] >= 0: the flow that compute task (j, k) makes ready when it starts (ZeRO 3's
    prefetch of the next layer's parameters while this one computes)."""
    INF = np.inf
    K = op_dur.shape[1]
    nf = f_stream.shape[0]
    ns = s_ptr.shape[0] - 1
    nl = l_bw.shape[0]
    base = pp * K

    c_start = np.full((pp, K), np.nan)
    c_end = np.full((pp, K), np.nan)
    c_pred = np.full(pp * K, -1, dtype=np.int64)
    next_op = np.zeros(pp, dtype=np.int64)
    busy = np.zeros(pp, dtype=np.bool_)
    buckets_left = stage_buckets.copy()
    block_left = np.zeros(pp, dtype=np.int64)
    last_bucket = np.full(pp, -1, dtype=np.int64)
    st_end = np.full(pp, np.nan)
    st_last = np.full(pp, -1, dtype=np.int64)

    f_state = np.zeros(nf, dtype=np.int64)     # 0 waiting, 1 latency, 2 transfer, 3 done
    f_ready = np.full(nf, INF)
    f_prod = np.full(nf, -1, dtype=np.int64)
    f_start = np.full(nf, np.nan)
    f_end = np.full(nf, np.nan)
    f_pred = np.full(nf, -1, dtype=np.int64)
    f_rem = f_bytes.copy()
    f_rate = np.zeros(nf)
    f_upd = np.zeros(nf)
    f_sched = np.full(nf, INF)
    f_on = np.zeros(nf, dtype=np.bool_)
    f_mark = np.zeros(nf, dtype=np.int64)
    f_frz = np.zeros(nf, dtype=np.int64)
    f_lpos = np.full(f_link.shape[0], -1, dtype=np.int64)
    f_arr = np.zeros(nf, dtype=np.int64)       # blocking: sides that reached the transfer
    f_arr_t = np.full(nf, -INF)                # ... the later arrival and its predecessor
    f_arr_p = np.full(nf, -1, dtype=np.int64)
    f_ep = np.full((nf, 2), -1, dtype=np.int64)   # ... the two tasks that hold it
    op_left = np.zeros(pp * K, dtype=np.int64)     # flows a blocking task still waits for

    s_head = s_ptr[:-1].copy()
    s_busy = np.zeros(ns, dtype=np.bool_)
    s_last = np.full(ns, -1, dtype=np.int64)

    l_cnt = np.zeros(nl, dtype=np.int64)
    l_slot = np.full(max(l_ptr[nl], 1), -1, dtype=np.int64)
    l_mark = np.zeros(nl, dtype=np.int64)
    l_cap = np.zeros(nl)
    l_w = np.zeros(nl)
    l_u = np.zeros(nl, dtype=np.int64)
    queue = np.empty(max(nl, 1), dtype=np.int64)
    comp = np.empty(max(l_ptr[nl], 1), dtype=np.int64)
    dirty = np.empty(max(nl, 1), dtype=np.int64)
    n_dirty = 0
    epoch = 0

    st_stack = np.empty(pp, dtype=np.int64)
    st_in = np.zeros(pp, dtype=np.bool_)
    n_st = 0
    sm_stack = np.empty(max(ns, 1), dtype=np.int64)
    sm_in = np.zeros(max(ns, 1), dtype=np.bool_)
    n_sm = 0

    h_t = np.empty(2 * (pp + ns) + 16)
    h_s = np.empty(h_t.shape[0], dtype=np.int64)
    h_k = np.empty(h_t.shape[0], dtype=np.int64)
    n_h = 0
    seq = 0
    for j in range(pp):
        st_stack[n_st] = j
        st_in[j] = True
        n_st += 1

    room = max(l_ptr[nl], 1) + ns + pp + 2     # the most events one pass of the loop adds
    now = 0.0
    while True:
        if n_h + room > h_t.shape[0]:   # grow the event queue
            g_t = np.empty(2 * (n_h + room))
            g_s = np.empty(g_t.shape[0], dtype=np.int64)
            g_k = np.empty(g_t.shape[0], dtype=np.int64)
            g_t[:n_h] = h_t[:n_h]
            g_s[:n_h] = h_s[:n_h]
            g_k[:n_h] = h_k[:n_h]
            h_t, h_s, h_k = g_t, g_s, g_k
        # ---- settle: new fair rates where flows joined or left links, then start what can
        if n_dirty > 0:
            epoch += 1
            nq = 0
            for i in range(n_dirty):
                lk = dirty[i]
                if l_mark[lk] != epoch:
                    l_mark[lk] = epoch
                    queue[nq] = lk
                    nq += 1
            n_dirty = 0
            nc = 0
            qi = 0
            while qi < nq:               # the flows and links connected to the changed ones
                lk = queue[qi]
                qi += 1
                for p in range(l_ptr[lk], l_ptr[lk] + l_cnt[lk]):
                    f = l_slot[p]
                    if f_mark[f] != epoch:
                        f_mark[f] = epoch
                        comp[nc] = f
                        nc += 1
                        for e in range(f_lptr[f], f_lptr[f + 1]):
                            l2 = f_link[e]
                            if l_mark[l2] != epoch:
                                l_mark[l2] = epoch
                                queue[nq] = l2
                                nq += 1
            for i in range(nc):          # drain each flow at its old rate up to now
                f = comp[i]
                if f_rate[f] == INF:
                    f_rem[f] = 0.0
                elif f_rate[f] > 0.0:
                    f_rem[f] = max(f_rem[f] - f_rate[f] * (now - f_upd[f]), 0.0)
                f_upd[f] = now
            for i in range(nq):
                lk = queue[i]
                l_cap[lk] = l_bw[lk]
                l_w[lk] = 0.0
                l_u[lk] = 0
            for i in range(nc):
                f = comp[i]
                for e in range(f_lptr[f], f_lptr[f + 1]):
                    l_w[f_link[e]] += f_mult[e]
                    l_u[f_link[e]] += 1
            left = nc
            while left > 0:              # progressive filling: max-min fair rates
                best = -1
                share = INF
                for i in range(nq):
                    lk = queue[i]
                    if l_u[lk] > 0:
                        s_l = l_cap[lk] / l_w[lk]
                        if best < 0 or s_l < share:
                            best = lk
                            share = s_l
                if best < 0:
                    break
                for p in range(l_ptr[best], l_ptr[best] + l_cnt[best]):
                    f = l_slot[p]
                    if f_frz[f] != epoch:
                        f_frz[f] = epoch
                        f_rate[f] = share
                        left -= 1
                        for e in range(f_lptr[f], f_lptr[f + 1]):
                            l2 = f_link[e]
                            l_u[l2] -= 1
                            l_w[l2] -= f_mult[e]
                            if share < INF:
                                l_cap[l2] = max(l_cap[l2] - f_mult[e] * share, 0.0)
            for i in range(nc):
                f = comp[i]
                if f_rate[f] == INF or f_rem[f] <= 0.0:
                    end = now
                else:
                    end = now + f_rem[f] / f_rate[f]
                if end != f_sched[f]:
                    f_sched[f] = end
                    _heap_push(h_t, h_s, h_k, n_h, end, seq,
                               f * _NUM_EV + _EV_FLOW_END, ordered)
                    n_h += 1
                    seq += 1
        while n_sm > 0 or n_st > 0:
            while n_sm > 0:              # communication streams
                n_sm -= 1
                s = sm_stack[n_sm]
                sm_in[s] = False
                if s_busy[s] or s_head[s] >= s_ptr[s + 1]:
                    continue
                f = s_flow[s_head[s]]
                if f_ready[f] == INF:    # its producer has not run yet
                    continue
                # starts when produced and the stream is free (in time order: now, or the
                # future moment a bucket fills up during the backward)
                start = f_ready[f]
                f_pred[f] = f_prod[f]
                prev = s_last[s]
                if prev >= 0 and f_end[prev] > start:
                    start = f_end[prev]
                    f_pred[f] = base + prev
                s_busy[s] = True
                s_head[s] += 1
                s_last[s] = f
                f_start[f] = start
                if f_alone[f] > 0.0:     # never shares: latency + bytes / rate
                    f_state[f] = 2
                    end = start + (f_lat[f] + f_bytes[f] / f_alone[f])
                    f_sched[f] = end
                    _heap_push(h_t, h_s, h_k, n_h, end, seq,
                               f * _NUM_EV + _EV_FLOW_END, ordered)
                else:
                    f_state[f] = 1
                    _heap_push(h_t, h_s, h_k, n_h, start + f_lat[f], seq,
                               f * _NUM_EV + _EV_LATENCY_END, ordered)
                n_h += 1
                seq += 1
            while n_st > 0:              # compute streams
                n_st -= 1
                j = st_stack[n_st]
                st_in[j] = False
                k = next_op[j]
                if busy[j] or k >= K or block_left[j] > 0:
                    continue
                d = op_dep[j, k]
                if d >= 0 and f_state[d] != 3:
                    continue
                if k == K - 1 and buckets_left[j] > 0:
                    continue
                # starts when the latest of its constraints is met (in time order: now)
                start = 0.0
                pred = -1
                if k > 0:
                    start = c_end[j, k - 1]
                    pred = j * K + k - 1
                if d >= 0 and f_end[d] >= start:
                    start = f_end[d]
                    pred = base + d
                lb = last_bucket[j]
                if lb >= 0 and (k == K - 1 or not overlap) and f_end[lb] >= start:
                    start = f_end[lb]
                    pred = base + lb
                task = j * K + k
                c_pred[task] = pred
                c_start[j, k] = start
                busy[j] = True
                if op_xfer[j, k, 0] >= 0:    # blocking sends / receives: wait for the peers
                    for q in range(op_xfer.shape[2]):
                        x = op_xfer[j, k, q]
                        if x < 0:
                            continue
                        op_left[task] += 1
                        f_ep[x, f_arr[x]] = task
                        f_arr[x] += 1
                        if start >= f_arr_t[x]:
                            f_arr_t[x] = start
                            f_arr_p[x] = pred
                        if f_arr[x] == 2:
                            f_ready[x] = f_arr_t[x]
                            f_prod[x] = f_arr_p[x]
                            s = f_stream[x]
                            n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)
                    continue
                dur = op_dur[j, k]
                _heap_push(h_t, h_s, h_k, n_h, start + dur, seq,
                           j * _NUM_EV + _EV_COMPUTE_END, ordered)
                n_h += 1
                seq += 1
                pf = op_pre[j, k]
                if pf >= 0:
                    f_ready[pf] = start
                    f_prod[pf] = task
                    s = f_stream[pf]
                    n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)
                em = op_emit[j, k]
                if em >= 0 and overlap and stage_nb[j] > 0:
                    for b in range(stage_nb[j]):
                        f = stage_bptr[j] + em * stage_nb[j] + b
                        f_ready[f] = start + dur * b_frac[f]
                        f_prod[f] = task
                    s = f_stream[stage_bptr[j]]
                    n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)

        # ---- next event
        if n_h == 0:
            break
        t, key = _heap_pop(h_t, h_s, h_k, n_h, ordered)
        n_h -= 1
        now = t
        what = key % _NUM_EV
        idx = key // _NUM_EV
        if what == _EV_COMPUTE_END:
            j = idx
            k = next_op[j]
            task = j * K + k
            c_end[j, k] = now
            busy[j] = False
            next_op[j] = k + 1
            o = op_out[j, k]
            if o >= 0:
                f_ready[o] = now
                f_prod[o] = task
                s = f_stream[o]
                n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)
            em = op_emit[j, k]
            if em >= 0 and not overlap and stage_nb[j] > 0:
                for b in range(stage_nb[j]):
                    f = stage_bptr[j] + em * stage_nb[j] + b
                    f_ready[f] = now
                    f_prod[f] = task
                block_left[j] = stage_nb[j]
                s = f_stream[stage_bptr[j]]
                n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)
            if k == K - 1 and o < 0:
                st_end[j] = now
                st_last[j] = task
            if not st_in[j]:
                st_in[j] = True
                st_stack[n_st] = j
                n_st += 1
        elif what == _EV_LATENCY_END:
            f = idx
            f_state[f] = 2
            if f_bytes[f] <= 0.0 or f_lptr[f + 1] == f_lptr[f]:
                f_rem[f] = 0.0
                f_sched[f] = now
                _heap_push(h_t, h_s, h_k, n_h, now, seq,
                           f * _NUM_EV + _EV_FLOW_END, ordered)
                n_h += 1
                seq += 1
            else:
                f_on[f] = True
                f_rate[f] = 0.0
                f_upd[f] = now
                for e in range(f_lptr[f], f_lptr[f + 1]):
                    lk = f_link[e]
                    p = l_ptr[lk] + l_cnt[lk]
                    l_slot[p] = f
                    f_lpos[e] = p
                    l_cnt[lk] += 1
                    dirty[n_dirty] = lk
                    n_dirty += 1
        else:   # _EV_FLOW_END
            f = idx
            if f_state[f] != 2 or t != f_sched[f]:
                continue                 # superseded by a later rate change
            f_state[f] = 3
            f_end[f] = now
            f_rem[f] = 0.0
            if f_on[f]:
                f_on[f] = False
                for e in range(f_lptr[f], f_lptr[f + 1]):
                    lk = f_link[e]
                    p = f_lpos[e]
                    q = l_ptr[lk] + l_cnt[lk] - 1
                    g = l_slot[q]
                    l_slot[p] = g
                    if g != f:
                        for e2 in range(f_lptr[g], f_lptr[g + 1]):
                            if f_link[e2] == lk:
                                f_lpos[e2] = p
                    l_cnt[lk] -= 1
                    dirty[n_dirty] = lk
                    n_dirty += 1
            s = f_stream[f]
            s_busy[s] = False
            n_sm = _wake_stream(s, sm_in, sm_stack, n_sm)
            kind = f_kind[f]
            j = f_wake[f]
            if kind == FLOW_P2P and blocking:   # the blocked tasks end with their last flow
                for side in range(2):
                    tk = f_ep[f, side]
                    op_left[tk] -= 1
                    if op_left[tk] == 0:
                        jj = tk // K
                        k = tk - jj * K
                        c_end[jj, k] = now
                        c_pred[tk] = base + f
                        busy[jj] = False
                        next_op[jj] = k + 1
                        if not st_in[jj]:
                            st_in[jj] = True
                            st_stack[n_st] = jj
                            n_st += 1
            if kind == FLOW_BUCKET:
                buckets_left[j] -= 1
                last_bucket[j] = f
                if block_left[j] > 0:
                    block_left[j] -= 1
            elif kind == FLOW_GATHER:
                st_end[j] = now
                st_last[j] = base + f
            if not st_in[j]:
                st_in[j] = True
                st_stack[n_st] = j
                n_st += 1
    complete = True
    for j in range(pp):
        if next_op[j] < K or math.isnan(st_end[j]):
            complete = False
    # the critical path: back from the task that ends last along the binding predecessors
    n_path = 0
    path = np.empty(pp * K + nf, dtype=np.int64)
    if complete:
        jl = 0
        for j in range(pp):
            if st_end[j] > st_end[jl]:
                jl = j
        task = st_last[jl]
        while task >= 0 and n_path < path.shape[0]:
            path[n_path] = task
            n_path += 1
            task = c_pred[task] if task < base else f_pred[task - base]
    return (c_start, c_end, f_start, f_end, st_end, path[:n_path][::-1].copy(), complete)



@_kernel
def exposed_comm_time(c_start, c_end, f_start, f_end, s_ptr, s_flow):
    """Per stage j: the length of the union of its communication intervals less the part
    its compute intervals (c_start[j], c_end[j]: disjoint, in order) cover. Stage j's
    flows are those of its streams 3j, 3j+1, 3j+2 (sent, dp) and of 3(j-1) and 3(j+1)+1
    (received); each stream's flows start in order, so a 5-way merge visits them in order."""
    pp, K = c_start.shape
    total = np.zeros(pp)
    streams = np.empty(5, dtype=np.int64)
    head = np.empty(5, dtype=np.int64)
    for j in range(pp):
        busy_before = np.zeros(K + 1)            # compute time before each compute task
        for k in range(K):
            busy_before[k + 1] = busy_before[k] + (c_end[j, k] - c_start[j, k])
        n = 0
        for s in (3 * j, 3 * j + 1, 3 * j + 2, 3 * (j - 1), 3 * (j + 1) + 1):
            if 0 <= s < s_ptr.shape[0] - 1 and (s != 3 * (j - 1) or j > 0):
                streams[n] = s
                head[n] = s_ptr[s]
                n += 1
        cur_s = 0.0
        cur_e = -np.inf
        k = 0                                    # first compute task ending at or after t
        while True:
            best = -1
            for i in range(n):
                if head[i] < s_ptr[streams[i] + 1] and (
                        best < 0 or f_start[s_flow[head[i]]] < f_start[s_flow[head[best]]]):
                    best = i
            if best >= 0:
                f = s_flow[head[best]]
                head[best] += 1
                if f_start[f] <= cur_e:
                    if f_end[f] > cur_e:
                        cur_e = f_end[f]
                    continue
            if cur_e > cur_s:                    # close the merged interval [cur_s, cur_e]
                covered = 0.0
                for side in range(2):            # t only grows: k moves forward
                    t = cur_s if side == 0 else cur_e
                    while k < K and c_end[j, k] < t:
                        k += 1
                    b = busy_before[k]
                    if k < K and t > c_start[j, k]:
                        b += t - c_start[j, k]
                    covered += b if side == 1 else -b
                total[j] += (cur_e - cur_s) - covered
            if best < 0:
                break
            cur_s = f_start[f]
            cur_e = f_end[f]
    return total
