"""The schedules: the order in which each pipeline stage runs its tasks in one training
iteration, as arrays. `cost_models.simulator` plays these orders out; they depend on no times.

An order gives, per stage j (one row each), its tasks in the order it runs them: kind and
micro-batch arrays of shape [pp, n], and where sends and receives are tasks of their own, the
P2P flow each one carries and the peer stage. The kinds are the codes below (indices into
`cost_models.simulator.KINDS`); stages with fewer tasks end in zero-length no-ops (IDLE).

- "1f1b" (`schedule_order`): DeepSpeed's / Megatron-LM's non-interleaved 1F1B: stage j runs
  min(pp-j-1, gas) warm-up forwards, then one forward and one backward in turn, then the
  remaining backwards. "gpipe": all forwards, then all backwards. Micro-batches run in order
  0 .. gas-1 in both passes. With a separate recompute, each backward is preceded by its
  recompute.
- Blocking sends and receives as tasks of the compute stream. DeepSpeed's PipelineEngine
  (`deepspeed_train_order`) runs its `TrainSchedule` instructions in order: a forward step
  sends the previous step's gradient back, receives its activation and runs the forward; a
  backward step receives its gradient, sends the previous step's activation on and runs the
  backward. GPipe, which DeepSpeed does not run, gets the plain blocking order
  (`blocking_order`): receive before a pass, send after it. Megatron-LM's non-interleaved
  1F1B (`megatron_order`) posts a send and a receive of one boundary together in its steady
  state (send_forward_recv_backward, send_backward_recv_forward), a task that holds two flows.
- Megatron-LM's interleaved 1F1B (`interleaved_order`): v model chunks per device, and the
  activations each device holds at its peak (`interleaved_in_flight`, which the memory model
  uses).
"""
from __future__ import annotations

import numpy as np

SCHEDULES = ("1f1b", "gpipe")

FORWARD, RECOMPUTE, BACKWARD = 0, 1, 2
"""Compute task kinds of an order (indices into `cost_models.simulator.KINDS`)."""
SEND, RECV, IDLE = 4, 5, 9
"""A blocking send or receive, and the no-op that pads a short stage's order."""


def schedule_order(schedule: str, pp: int, gas: int, *, recompute: bool = False
                   ) -> tuple[np.ndarray, np.ndarray]:
    """The compute stream of each stage, without the optimizer step: (kind [pp, n],
    microbatch [pp, n]) with kind 0 forward, 1 recompute, 2 backward; n = 2 gas, or 3 gas with
    a separate recompute (each backward preceded by its recompute).

    "1f1b": min(pp-j-1, gas) warm-up forwards on stage j, then forward w+i and backward i in
    turn, then the remaining backwards (DeepSpeed's TrainSchedule, Megatron-LM's
    forward_backward_pipelining_without_interleaving). "gpipe": all forwards, then all
    backwards."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule {schedule!r}; known: {', '.join(SCHEDULES)}")
    mbs = np.arange(gas, dtype=np.int64)
    kinds = np.empty((pp, 2 * gas), dtype=np.int64)
    micro = np.empty((pp, 2 * gas), dtype=np.int64)
    for j in range(pp):
        w = gas if schedule == "gpipe" else min(pp - j - 1, gas)
        steady = gas - w
        k = np.concatenate([np.zeros(w, np.int64),
                            np.tile(np.array([FORWARD, BACKWARD], np.int64), steady),
                            np.full(w, BACKWARD, np.int64)])
        m = np.concatenate([mbs[:w],
                            np.stack([mbs[w:], mbs[:steady]], axis=1).reshape(-1),
                            mbs[steady:]])
        kinds[j], micro[j] = k, m
    if not recompute:
        return kinds, micro
    # each backward becomes recompute, backward
    reps = np.where(kinds == BACKWARD, 2, 1)
    out_k = np.empty((pp, 3 * gas), dtype=np.int64)
    out_m = np.empty((pp, 3 * gas), dtype=np.int64)
    for j in range(pp):
        kk = np.repeat(kinds[j], reps[j])
        mm = np.repeat(micro[j], reps[j])
        first = np.concatenate([[True], (kk[1:] != kk[:-1]) | (mm[1:] != mm[:-1])])
        kk = np.where((kk == BACKWARD) & first, RECOMPUTE, kk)
        out_k[j], out_m[j] = kk, mm
    return out_k, out_m



def megatron_order(pp: int, gas: int, *, recompute: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each stage's instructions in Megatron-LM's forward_backward_pipelining_without_
    interleaving (megatron/core/pipeline_parallel/schedules.py): (kind, microbatch, flows
    [pp, n, 2], peer), as `deepspeed_train_order` gives them, a task holding one or two flows.

    Stage j runs w = min(pp - j - 1, gas) warm-up steps recv_forward, forward, send_forward;
    then (if gas > w) recv_forward; then for i < gas - w: forward of w + i,
    send_forward_recv_backward (the activation of w + i out, the gradient of i in, posted
    together with batch_isend_irecv and waited for together), backward of i, and
    send_backward_recv_forward (the gradient of i back, the activation of w + i + 1 in), or
    send_backward alone after the last one; then w cool-down steps recv_backward, backward,
    send_backward. Calls with no peer (the first stage's backward sends, the last stage's
    forward sends) are no-ops and left out."""
    nb_p2p = (pp - 1) * gas
    rows = []
    for j in range(pp):
        first, last = j == 0, j == pp - 1
        act_in = lambda m: (j - 1) * gas + m            # noqa: E731 (flow ids, as above)
        act_out = lambda m: j * gas + m                 # noqa: E731
        grad_in = lambda m: nb_p2p + j * gas + m        # noqa: E731
        grad_out = lambda m: nb_p2p + (j - 1) * gas + m     # noqa: E731
        row: list = []

        def comm(kind, m, flows, peer):
            row.append((kind, m, flows[0], flows[1] if len(flows) > 1 else -1, peer))

        def backward(m):
            if recompute:
                row.append((RECOMPUTE, m, -1, -1, -1))
            row.append((BACKWARD, m, -1, -1, -1))

        w = min(pp - j - 1, gas)
        for i in range(w):
            if not first:
                comm(RECV, i, [act_in(i)], j - 1)
            row.append((FORWARD, i, -1, -1, -1))
            if not last:
                comm(SEND, i, [act_out(i)], j + 1)
        if gas > w and not first:
            comm(RECV, w, [act_in(w)], j - 1)
        r = gas - w
        for i in range(r):
            row.append((FORWARD, w + i, -1, -1, -1))
            if not last:
                comm(SEND, w + i, [act_out(w + i), grad_in(i)], j + 1)
            backward(i)
            if not first:
                if i == r - 1:
                    comm(SEND, i, [grad_out(i)], j - 1)
                else:
                    comm(SEND, i, [grad_out(i), act_in(w + i + 1)], j - 1)
        for i in range(r, gas):
            if not last:
                comm(RECV, i, [grad_in(i)], j + 1)
            backward(i)
            if not first:
                comm(SEND, i, [grad_out(i)], j - 1)
        rows.append(np.array(row, dtype=np.int64).reshape(-1, 5))
    n = max(r.shape[0] for r in rows)
    kind = np.full((pp, n), IDLE, dtype=np.int64)
    micro = np.full((pp, n), -1, dtype=np.int64)
    flow = np.full((pp, n, 2), -1, dtype=np.int64)
    peer = np.full((pp, n), -1, dtype=np.int64)
    for j, r in enumerate(rows):
        m = r.shape[0]
        kind[j, :m], micro[j, :m], flow[j, :m, 0], flow[j, :m, 1], peer[j, :m] = r.T
    return kind, micro, flow, peer


def blocking_order(schedule: str, pp: int, gas: int, *, recompute: bool = False
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each stage's instructions with blocking sends and receives, as
    `deepspeed_train_order` gives them: for "1f1b" DeepSpeed's TrainSchedule
    (`deepspeed_train_order`); for "gpipe" (which DeepSpeed does not run) each pass receives
    its input just before it and sends its output just after it."""
    if schedule == "1f1b":
        return deepspeed_train_order(pp, gas, recompute=recompute)
    kinds, micro = schedule_order(schedule, pp, gas, recompute=recompute)
    nb_p2p = (pp - 1) * gas
    rows = []
    for j in range(pp):
        row = []
        for k, m in zip(kinds[j].tolist(), micro[j].tolist()):
            if k == FORWARD:
                if j > 0:
                    row.append((RECV, m, (j - 1) * gas + m, j - 1))
                row.append((k, m, -1, -1))
                if j < pp - 1:
                    row.append((SEND, m, j * gas + m, j + 1))
            else:                # the gradient arrives before the recompute, if any
                if j < pp - 1 and (k == RECOMPUTE or not recompute):
                    row.append((RECV, m, nb_p2p + j * gas + m, j + 1))
                row.append((k, m, -1, -1))
                if k == BACKWARD and j > 0:
                    row.append((SEND, m, nb_p2p + (j - 1) * gas + m, j - 1))
        rows.append(np.array(row, dtype=np.int64).reshape(-1, 4))
    n = max(r.shape[0] for r in rows)
    out = np.full((4, pp, n), -1, dtype=np.int64)
    out[0] = IDLE
    for j, r in enumerate(rows):
        out[:, j, :r.shape[0]] = r.T
    return out[0], out[1], out[2], out[3]



def deepspeed_train_order(pp: int, gas: int, *, recompute: bool = False
                          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each stage's instruction stream in DeepSpeed's 1F1B `TrainSchedule` (deepspeed
    runtime/pipe/schedule.py), without the optimizer step: (kind, microbatch, flow, peer),
    [pp, n] arrays, n the longest stage's count; shorter stages end in zero-length no-ops
    (kind "idle", flow -1).

    TrainSchedule runs 2 (gas + pp - 1) steps; step s of stage j is a forward when s + j is
    even, else a backward, of a micro-batch that may be out of range (an idle step). A forward
    step issues SendGrad(previous step's micro-batch) to stage j-1, RecvActivation(its own)
    from j-1, then ForwardPass; a backward step RecvGrad(its own) from j+1,
    SendActivation(previous step's micro-batch) to j+1, then BackwardPass (with a separate
    recompute, that recompute then the backward). Sends and receives are kind "send" / "recv"
    with the flow id of `cost_models.simulator.simulate_iteration`: activation of
    micro-batch m over boundary b (stages b, b+1) b*gas + m, its gradient (pp-1)*gas + b*gas
    + m; peer is the other stage.
    The compute ops come in `schedule_order("1f1b", ...)`'s order (tests check both)."""
    nb_p2p = (pp - 1) * gas
    T = 2 * (gas + pp - 1)
    s = np.arange(T, dtype=np.int64)[None, :]          # [1, T] steps
    j = np.arange(pp, dtype=np.int64)[:, None]         # [pp, 1] stages
    fwd = (s + j) % 2 == 0                             # [pp, T]
    even = j % 2 == 0
    mb = np.where(even, np.where(fwd, s // 2 - j // 2, (s - 1) // 2 - pp + 1 + j // 2),
                  np.where(fwd, (s - 1) // 2 - j // 2, s // 2 - pp + (j + 1) // 2))
    prev = np.concatenate([np.full((pp, 1), -1, dtype=np.int64), mb[:, :-1]], axis=1)
    ok, ok_prev = (mb >= 0) & (mb < gas), (prev >= 0) & (prev < gas)
    # slots per step: [comm 1, comm 2, compute(, compute)]: kind, micro-batch, flow, peer
    n_slot = 4 if recompute else 3
    kind, micro, flow, peer = (np.full((pp, T, n_slot), -1, dtype=np.int64) for _ in range(4))
    jj = np.broadcast_to(j, (pp, T))

    def put(slot, sel, k, m, f, p):
        kind[..., slot][sel] = k
        micro[..., slot][sel] = m[sel]
        flow[..., slot][sel] = np.broadcast_to(f, (pp, T))[sel]
        peer[..., slot][sel] = np.broadcast_to(p, (pp, T))[sel]

    has_prev, has_next = jj > 0, jj < pp - 1
    # forward step: SendGrad(prev), RecvActivation(mb); backward step: RecvGrad(mb),
    # SendActivation(prev)
    put(0, fwd & ok_prev & has_prev, SEND, prev, nb_p2p + (j - 1) * gas + prev, j - 1)
    put(1, fwd & ok & has_prev, RECV, mb, (j - 1) * gas + mb, j - 1)
    put(0, ~fwd & ok & has_next, RECV, mb, nb_p2p + j * gas + mb, j + 1)
    put(1, ~fwd & ok_prev & has_next, SEND, prev, j * gas + prev, j + 1)
    put(2, fwd & ok, FORWARD, mb, -1, -1)
    if recompute:
        put(2, ~fwd & ok, RECOMPUTE, mb, -1, -1)
        put(3, ~fwd & ok, BACKWARD, mb, -1, -1)
    else:
        put(2, ~fwd & ok, BACKWARD, mb, -1, -1)
    # each stage's instructions in order, left-aligned; the rest of its row idle
    kind, micro, flow, peer = (a.reshape(pp, -1) for a in (kind, micro, flow, peer))
    keep = kind >= 0
    rows, cols = np.nonzero(keep)
    pos = (np.cumsum(keep, axis=1) - 1)[rows, cols]
    n = int(keep.sum(axis=1).max())
    out = (np.full((pp, n), IDLE, dtype=np.int64), np.full((pp, n), -1, dtype=np.int64),
           np.full((pp, n), -1, dtype=np.int64), np.full((pp, n), -1, dtype=np.int64))
    for a, b in zip(out, (kind, micro, flow, peer)):
        a[rows, pos] = b[rows, cols]
    return out


def interleaved_order(pp: int, virtual_stages: int, gas: int
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each device's compute stream in Megatron-LM's interleaved 1F1B schedule
    (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_
    interleaving with get_schedule_table and get_pp_rank_microbatches, megatron-core 0.16, at
    its default microbatch_group_size_per_vp_stage = pp), without the optimizer step:
    (kind [pp, n], microbatch [pp, n], chunk [pp, n]), n = 2 v gas, kind 0 forward or 2
    backward; chunk c of device j is the model chunk (virtual stage) c pp + j.

    The v gas forwards of a device run in groups of pp micro-batches per chunk: virtual
    micro-batch k is chunk (k mod pp v) // pp (for a backward: v - 1 - that), micro-batch
    (k // (pp v)) pp + k mod pp. Device j runs w = min(2 (pp - j - 1) + (v - 1) pp, v gas)
    warm-up forwards, then forward w + i and backward i in turn, then the remaining
    backwards (Megatron-LM v0.7 ran all v gas forwards first on every device when gas == pp;
    megatron-core 0.16 does not). Megatron requires gas to be a multiple of pp at the default
    group size (it raises otherwise); so does this (tests/test_interleaved.py compares the
    order with megatron-core's own tables)."""
    if pp < 1 or virtual_stages < 1 or gas < 1:
        raise ValueError(f"pp, virtual_stages and gas must be >= 1, got {pp}, "
                         f"{virtual_stages}, {gas}")
    if gas % pp:
        raise ValueError(f"the interleaved schedule needs the micro-batch count ({gas}) to be a "
                         f"multiple of pp ({pp}), as Megatron-LM requires")
    v = virtual_stages
    total = gas * v
    k = np.arange(total, dtype=np.int64)
    group = k % (pp * v)
    f_chunk = group // pp
    b_chunk = v - 1 - f_chunk
    mb = (k // (pp * v)) * pp + k % pp
    kinds = np.empty((pp, 2 * total), dtype=np.int64)
    micro = np.empty((pp, 2 * total), dtype=np.int64)
    chunk = np.empty((pp, 2 * total), dtype=np.int64)
    for j in range(pp):
        w = min(2 * (pp - j - 1) + (v - 1) * pp, total)
        r = total - w
        fw = np.arange(w, total)           # the forwards of the steady state
        kinds[j] = np.concatenate([np.full(w, FORWARD),
                                   np.tile(np.array([FORWARD, BACKWARD]), r),
                                   np.full(w, BACKWARD)])
        ks = np.concatenate([k[:w], np.stack([fw, k[:r]], axis=1).reshape(-1), k[r:]])
        micro[j] = mb[ks]
        chunk[j] = np.where(kinds[j] == FORWARD, f_chunk[ks], b_chunk[ks])
    return kinds, micro, chunk


def interleaved_in_flight(kinds: np.ndarray, chunk: np.ndarray, virtual_stages: int
                          ) -> np.ndarray:
    """[pp, v]: for each device, at the moment it holds the most chunk activations (forwards
    run whose backward has not), how many micro-batches of each chunk it holds; the count of a
    compute order (`interleaved_order`), independent of times."""
    pp = kinds.shape[0]
    out = np.zeros((pp, virtual_stages), dtype=np.int64)
    for j in range(pp):
        held = np.zeros(virtual_stages, dtype=np.int64)
        best = -1
        for kind, c in zip(kinds[j].tolist(), chunk[j].tolist()):
            held[c] += 1 if kind == FORWARD else -1
            if kind == FORWARD and held.sum() > best:
                best = int(held.sum())
                out[j] = held
    return out
