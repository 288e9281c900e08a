"""An event-level simulator of one training iteration of a pipeline (issue 11, first part).

AMP's eq. 5 and 4 (`cost_models.pipeline`) are a closed form; this module plays the schedule
out instead, as Proteus's HTAE and dPRO's replayer do: every micro-batch's forward and backward
on every stage, the P2P transfers between stages, the data-parallel gradient buckets and the
optimizer step become tasks on streams, and a discrete-event loop over task completions gives
each task's start and end. A pure function of numbers: it imports nothing from `amp_search`.

What is simulated (one pipeline replica; the other dp replicas run the same timeline)
-------------------------------------------------------------------------------------
- Streams. Each stage has one compute stream (forward, recompute, backward, optimizer, in the
  schedule's fixed order) and three communication streams, each first-in first-out:
  ``send_next`` (activations to stage j+1), ``send_prev`` (gradients to stage j-1) and ``dp``
  (gradient buckets, then the optional weight all-gather). A transfer also appears on the
  receiving stage as a ``recv`` event (streams ``recv_prev`` / ``recv_next``) with the same
  times. Proteus separates feature and gradient communication queues the same way.
- Schedules (`schedule_order`). "1f1b": DeepSpeed's / Megatron-LM's non-interleaved 1F1B:
  stage j runs min(pp-j-1, gas) warm-up forwards, then one forward and one backward in turn,
  then the remaining backwards. "gpipe": all forwards, then all backwards. Micro-batches run in
  order 0 .. gas-1 in both passes.
- Dependencies. A forward of micro-batch m on stage j > 0 starts only once the activation of m
  from stage j-1 has arrived; a backward (or its separate recompute) of m on stage j < pp-1
  only once the gradient of m from stage j+1 has arrived.
- P2P modes (``p2p_mode``). "async": sends that never block, as free-running NCCL streams
  would be: a transfer is queued on the sender's stream when the producing task ends and the
  sender goes on computing; only the receiver waits. "blocking": DeepSpeed's PipelineEngine,
  whose SendActivation, RecvActivation, SendGrad and RecvGrad instructions are separate
  blocking ``dist.send`` / ``dist.recv`` calls (deepspeed runtime/pipe/engine.py, p2p.py):
  each stage runs its `TrainSchedule` instructions in order (`deepspeed_train_order`: a
  forward step sends the previous step's gradient back, receives its activation and runs the
  forward; a backward step receives its gradient, sends the previous step's activation on and
  runs the backward), a send or receive holds the stage's compute stream from the moment it
  is issued, a send/receive pair is a rendezvous (the transfer starts when both stages have
  issued their call, and both compute streams stay blocked until it ends), and ZeRO 0/1's
  gradient reduction (ReduceGrads) comes after the stage's last instruction. GPipe, which
  DeepSpeed does not run, gets the plain blocking order: receive before a pass, send after
  it. "paired": Megatron-LM's non-interleaved 1F1B (`megatron_order`), the same rendezvous,
  but its steady state's send_forward_recv_backward and send_backward_recv_forward post a
  send and a receive of one boundary together (`batch_isend_irecv`) and wait for both: the
  two transfers run at once, one each way.
- Data-parallel gradient sync (ZeRO 0 and 1 as DeepSpeed runs them; ZeRO 2's per-micro-batch
  reduction with ``reduce_every_microbatch``). A stage's gradient bytes are cut into buckets
  of ``bucket_bytes`` (DeepSpeed's reduce_bucket_size, 5e8 elements: `deepspeed_bucket_bytes`),
  the last one partial. Gradients appear in reverse layer order through the backward, in
  proportion to time: bucket b (cumulative bytes c_b of the stage's G) is complete after the
  fraction c_b / G of the emitting backward. With ``overlap`` (DeepSpeed's overlap_comm) a
  bucket is reduced on the dp stream as soon as it is complete, alongside the rest of the
  backward. Without it every bucket waits for the end of that backward and the stage's next
  compute task waits for all of them (the reduction blocks the compute stream, as DeepSpeed
  without overlap_comm does). Each bucket is one ring collective (``gradient_collective``:
  "all_reduce" for ZeRO 0, "reduce_scatter" for ZeRO 1 and 2) of ``dp`` ranks. The optimizer
  step waits for every bucket of its stage; ``gather_bytes_after_step`` (ZeRO 1 and 2, or
  DeepSpeed's BF16_Optimizer) adds a ring all-gather of the updated weights after the step.
- ZeRO 3 (pp = 1; the ``zero3_*`` arguments): the stage's compute runs layer by layer, and
  every layer's forward and backward waits for an all-gather of that layer's parameters,
  which the task before it issued when it started (DeepSpeed's prefetch of the next
  parameters, one at a time, on its own stream); every layer's backward then queues a
  reduce-scatter of its gradients on the dp stream, overlapped with the rest of the backward
  (overlap_comm, DeepSpeed's default for stage 3); the optimizer step waits for all of them.
  Gathers and reduce-scatters share the dp link. With free links this is the plain schedule;
  on slow links each pass exposes at least its first gather (tests/test_simulate.py works a
  case by hand).
- Flows and bandwidth sharing (Proteus's assumption, as a flow-level fluid model). A transfer
  or collective is a flow: first its latency (``steps(n) * latency_s`` of
  `cost_models.comm`, during which it uses no bandwidth), then its wire bytes
  (``bus(n) * message bytes``), which drain at its current rate. A flow crosses one or more
  links (a route: link ids, each optionally with a number of identical parallel copies of the
  flow, e.g. the tmp rings of a stage that all cross one NIC); a link has a bandwidth. The
  flows in flight on the links get max-min fair rates (progressive filling, a copy counting as
  one flow), recomputed whenever a flow starts or ends its transfer. Alone on its links a flow
  takes exactly `cost_models.comm.collective_time_s` (p2p: `p2p_time_s`).
- The iteration ends when the last stage has finished its optimizer step (and all-gather);
  ``step_overhead_s`` is then added (`cost_models.pipeline.iteration_time_s`'s fixed term).

Relation to the closed form (tests/test_schedule.py checks each statement)
---------------------------------------------------------------------------
With t_j = forward_j + backward_j, no overlap and one bucket per stage (or zero latency; k
buckets pay k ring latencies where the closed form's sync pays one):

- uniform stages, free P2P, 1F1B or GPipe: the simulated time equals
  ``iteration_time_s(pipeline_time_s(t, 0, gas), sync_j + step_j, step_overhead_s)``
  exactly, that is (gas + pp - 1) t + sync + step + overhead;
- 1F1B, free P2P, every stage with the same backward:forward ratio: eq. 5 is an upper bound
  of the simulated pipeline (a stage no slower than the slowest stage b then has no longer a
  forward or a backward than b, so nothing feeds b slower than it computes), and so eq. 4 of
  the iteration, since stage j's sync starts when its own last backward ends. With different
  ratios (recomputation on some stages, measured layer times) it is no bound: forward
  (0, 5, 4, 0), backward (0, 10, 12, 0), gas 2 simulates 48 against eq. 5's 47;
- GPipe is two flow shops, the forwards over the stages and send streams, then the
  backwards: sum f + sum d + (gas-1) max(f, d) + the same for b. eq. 5 is a lower bound,
  exact when one stage is the slowest in both passes and no P2P is slower than it;
- P2P of e_j = 2 d_j (d_j one direction, as `comm.stage_boundary_time_s`), uniform stages,
  "async": GPipe equals eq. 5 (d <= t); 1F1B is at or above it (checked on random cases, not
  proven), because its steady state waits for each gradient's round trip, P2P included;
- the same, "blocking" 1F1B (DeepSpeed), gas >= 2: each further micro-batch adds exactly
  `pipeline.steady_state_period_s(t, e, blocking_share=1)` (t + 4d with pp >= 3: a middle
  stage sends and receives four transfers per micro-batch; t + 2d with pp = 2), and
  `pipeline_1f1b_time_s(t, e, gas, blocking_share=1)` is at or above the simulation by at
  most one e = 2d (its fill and drain; equal for pp = 2); checked by hand for pp 2 and 3 and
  on random cases, not proven. Free P2P: every mode equals eq. 5;
- the same, "paired" 1F1B (Megatron-LM), gas >= 2: each further micro-batch adds exactly
  `steady_state_period_s(t, e, blocking_share=0.5)` (t + 2d inside, t + d for pp = 2), and
  `pipeline_1f1b_time_s(..., blocking_share=0.5)` is within one d of the simulation (random
  cases, not proven; pp 2 by hand).

Speed: the event loop is a numba kernel (``use_numba=False`` runs the very same code as plain
Python, which the tests compare), O(E log E) in the E = O(pp * gas) tasks. Where no flow can
share a link every duration is fixed, and the events are taken from a stack instead of a
heap. On the 2-core development machine (busy with other work, compilation cached), pp = 128
and gas = 2048 (1.05 million tasks, 1.85 million events) take about 0.3 s with private links
and about 0.7 s with P2P and dp flows sharing 16 NICs; a cold numba cache adds about 10 s of
compilation once. Blocking P2P puts the sends and receives on the compute streams too (about
twice the tasks): on the same pp 128, gas 2048 case with private links, overlapped buckets and
dp 4, 0.6 to 0.7 s against 0.4 s async in the same session (2026-11-22), 0.16 s of which
builds DeepSpeed's instruction order (`deepspeed_train_order`).
"""
from __future__ import annotations

import math
import types
from dataclasses import dataclass, field
from functools import cached_property
from collections.abc import Hashable, Mapping, Sequence

import numpy as np

from . import comm as C
from . import _jit as _jit_module
from ._jit import in_cache, njit

KERNELS_WHAT = "schedule simulator kernels"
"""The name of this module's kernels in cost_models._jit's warnings."""
SCHEDULES = ("1f1b", "gpipe")
GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")

DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (zero_optimization; also the element count of
the ZeRO-0 ``allreduce_gradients`` buffers): 5e8 elements."""

MAX_BUCKETS_PER_STAGE = 1_000_000
"""A bound on the gradient buckets of one stage and iteration (a guard against a bucket size
given in the wrong unit)."""

STREAMS = ("compute", "send_next", "send_prev", "recv_prev", "recv_next", "dp")
"""Event streams: compute; activations sent to stage j+1; gradients sent to stage j-1;
activations received from j-1; gradients received from j+1; data-parallel collectives."""

KINDS = ("forward", "recompute", "backward", "optimizer", "send", "recv", "allreduce",
         "reduce_scatter", "allgather", "idle")

_FORWARD, _RECOMPUTE, _BACKWARD, _OPTIMIZER = 0, 1, 2, 3     # compute op kinds (= KINDS index)
_K_SEND, _K_RECV, _K_IDLE = 4, 5, 9
_K_COLLECTIVE = {"all_reduce": 6, "reduce_scatter": 7, "all_gather": 8}
_S_COMPUTE, _S_SEND_NEXT, _S_SEND_PREV, _S_RECV_PREV, _S_RECV_NEXT, _S_DP = range(6)
_FLOW_P2P, _FLOW_BUCKET, _FLOW_GATHER = 0, 1, 2
_FLOW_PREFETCH = 3      # ZeRO 3's per-layer parameter all-gather (made ready by op_pre)


def deepspeed_bucket_bytes(bytes_per_element: float) -> float:
    """DeepSpeed's default gradient bucket in bytes: 5e8 elements of `bytes_per_element`."""
    return float(DEEPSPEED_REDUCE_BUCKET_ELEMENTS) * float(bytes_per_element)


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True, slots=True)
class Event:
    """One task of the simulated iteration. Times in seconds from the iteration's start."""

    stage: int
    stream: str
    """One of STREAMS."""
    kind: str
    """One of KINDS."""
    microbatch: int
    """The micro-batch (for a bucket: the one whose backward produced it); -1: none."""
    start_s: float
    end_s: float
    label: str

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True, eq=False)
class EventTable:
    """Every event of an iteration as columns (numpy arrays of one length), the form that a
    million events stay cheap in; `SimulatedIteration.events` makes `Event` records of it.

    stream and kind are indices into STREAMS and KINDS. `peer` is the other stage of a send
    or receive, the bucket index of a bucket, else -1; `count` is the number of buckets of
    the bucket's stage per emitting backward, else 0."""

    stage: np.ndarray
    stream: np.ndarray
    kind: np.ndarray
    microbatch: np.ndarray
    start_s: np.ndarray
    end_s: np.ndarray
    peer: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return int(self.stage.shape[0])

    def label(self, i: int) -> str:
        return _label(int(self.stage[i]), int(self.kind[i]), int(self.microbatch[i]),
                      int(self.peer[i]), int(self.count[i]))


def _label(stage: int, kind: int, mb: int, peer: int, count: int) -> str:
    name = KINDS[kind]
    if kind in (_FORWARD, _RECOMPUTE, _BACKWARD):
        return f"stage {stage} {name} mb {mb}"
    if kind in (_K_SEND, _K_RECV):
        what = "activation" if (peer > stage) == (kind == _K_SEND) else "gradient"
        src, dst = (stage, peer) if kind == _K_SEND else (peer, stage)
        return f"{name} {what} mb {mb} stage {src}->{dst}"
    if kind in (6, 7) and count > 0:
        return f"stage {stage} {name} bucket {peer + 1}/{count} mb {mb}"
    return f"stage {stage} {name}"


@dataclass(frozen=True, eq=False)
class SimulatedIteration:
    """The simulated timeline of one training iteration and what it sums to (seconds)."""

    schedule: str
    pp: int
    gas: int
    iteration_time_s: float
    """Makespan (the last stage's optimizer step or weight gather ends) + step_overhead_s."""
    makespan_s: float
    stage_end_s: tuple[float, ...]
    """When each stage has finished everything (optimizer step, weight all-gather)."""
    busy_s: tuple[float, ...]
    """Per stage: time its compute stream computes (forward, recompute, backward, step)."""
    idle_s: tuple[float, ...]
    """Per stage: makespan - busy: the bubble, including exposed communication."""
    exposed_comm_s: tuple[float, ...]
    """Per stage: time in which one of its transfers or collectives is in flight (sent,
    received or its dp sync) while its compute stream is idle."""
    critical_path_tasks: np.ndarray = field(repr=False, compare=False)
    """The simulator's task ids along the critical path (see `critical_path`)."""
    _parts: dict = field(repr=False, compare=False)

    @cached_property
    def critical_path(self) -> tuple[str, ...]:
        """Labels of the chain of tasks that ends last, first task first: each task's start
        was set by the one before it (the latest of its constraints; on a tie, the transfer
        or bucket over the stream's previous task)."""
        return tuple(_task_label(int(t), self._parts) for t in self.critical_path_tasks)

    @cached_property
    def critical_path_kinds(self) -> tuple[str, ...]:
        """The kind (one of KINDS) of each task of `critical_path`."""
        p = self._parts
        base = p["comp_kind"].size
        return tuple(KINDS[int(p["comp_kind"].flat[t]) if t < base else
                           (_K_SEND if p["f_kind"][t - base] == _FLOW_P2P
                            else int(p["coll_kind"][t - base]))]
                     for t in self.critical_path_tasks.tolist())

    def critical_path_segments(self) -> tuple[tuple[int, str, int, float, float, float], ...]:
        """The critical path as runs of consecutive tasks of one stage and kind: (stage,
        kind, tasks, start_s, end_s, time_s), first run first. A transfer belongs to its
        sending stage. time_s is the part of the iteration the run accounts for: from the
        previous run's end (or its own start, if later) to its end, so that the runs' times
        sum to the makespan (a bucket starts inside the backward that produced it: the
        overlap is counted once)."""
        p = self._parts
        comp_kind = p["comp_kind"]
        K = comp_kind.shape[1]
        base = comp_kind.size
        out: list[list] = []
        prev_end = 0.0
        for t in self.critical_path_tasks.tolist():
            if t < base:
                j, k = divmod(t, K)
                kind, start, end = int(comp_kind[j, k]), p["c_start"][j, k], p["c_end"][j, k]
            else:
                f = t - base
                j = int(p["f_owner"][f])
                kind = _K_SEND if p["f_kind"][f] == _FLOW_P2P else int(p["coll_kind"][f])
                start, end = p["f_start"][f], p["f_end"][f]
            start, end = float(start), float(end)
            counted = max(end - max(start, prev_end), 0.0)
            prev_end = max(prev_end, end)
            if out and out[-1][0] == j and out[-1][1] == kind:
                run = out[-1]
                run[2] += 1
                run[4] = max(run[4], end)
                run[5] += counted
            else:
                out.append([j, kind, 1, start, end, counted])
        return tuple((j, KINDS[k], n, s, e, dt) for j, k, n, s, e, dt in out)

    @cached_property
    def table(self) -> EventTable:
        """Every event as columns (built on first use)."""
        return _event_table(**self._parts)

    @cached_property
    def events(self) -> tuple[Event, ...]:
        """Every event as a record, by stage, then start time (built on first use: a few
        seconds for a million events)."""
        t = self.table
        order = np.lexsort((t.stream, t.start_s, t.stage))
        stage, stream, kind = t.stage[order].tolist(), t.stream[order].tolist(), \
            t.kind[order].tolist()
        mb, peer, count = t.microbatch[order].tolist(), t.peer[order].tolist(), \
            t.count[order].tolist()
        start, end = t.start_s[order].tolist(), t.end_s[order].tolist()
        return tuple(Event(stage[i], STREAMS[stream[i]], KINDS[kind[i]], mb[i], start[i],
                           end[i], _label(stage[i], kind[i], mb[i], peer[i], count[i]))
                     for i in range(len(order)))

    def to_dict(self) -> dict:
        """The summary (not the events) as JSON-ready data."""
        return {"schedule": self.schedule, "pp": self.pp, "gas": self.gas,
                "iteration_time_s": self.iteration_time_s, "makespan_s": self.makespan_s,
                "stage_end_s": list(self.stage_end_s), "busy_s": list(self.busy_s),
                "idle_s": list(self.idle_s), "exposed_comm_s": list(self.exposed_comm_s),
                "critical_path": list(self.critical_path), "num_events": len(self.table)}


# ----------------------------------------------------------------------------- schedule

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
                            np.tile(np.array([_FORWARD, _BACKWARD], np.int64), steady),
                            np.full(w, _BACKWARD, np.int64)])
        m = np.concatenate([mbs[:w],
                            np.stack([mbs[w:], mbs[:steady]], axis=1).reshape(-1),
                            mbs[steady:]])
        kinds[j], micro[j] = k, m
    if not recompute:
        return kinds, micro
    # each backward becomes recompute, backward
    reps = np.where(kinds == _BACKWARD, 2, 1)
    out_k = np.empty((pp, 3 * gas), dtype=np.int64)
    out_m = np.empty((pp, 3 * gas), dtype=np.int64)
    for j in range(pp):
        kk = np.repeat(kinds[j], reps[j])
        mm = np.repeat(micro[j], reps[j])
        first = np.concatenate([[True], (kk[1:] != kk[:-1]) | (mm[1:] != mm[:-1])])
        kk = np.where((kk == _BACKWARD) & first, _RECOMPUTE, kk)
        out_k[j], out_m[j] = kk, mm
    return out_k, out_m


P2P_MODES = ("async", "blocking", "paired")
"""How P2P transfers meet the compute streams (`simulate_iteration`'s p2p_mode): "async",
free-running sends on their own streams; "blocking", DeepSpeed's separate blocking send and
receive calls in its TrainSchedule's instruction order (`deepspeed_train_order`); "paired",
Megatron-LM's 1F1B, whose steady state posts a send and a receive together and waits for
both (`megatron_order`)."""


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
                row.append((_RECOMPUTE, m, -1, -1, -1))
            row.append((_BACKWARD, m, -1, -1, -1))

        w = min(pp - j - 1, gas)
        for i in range(w):
            if not first:
                comm(_K_RECV, i, [act_in(i)], j - 1)
            row.append((_FORWARD, i, -1, -1, -1))
            if not last:
                comm(_K_SEND, i, [act_out(i)], j + 1)
        if gas > w and not first:
            comm(_K_RECV, w, [act_in(w)], j - 1)
        r = gas - w
        for i in range(r):
            row.append((_FORWARD, w + i, -1, -1, -1))
            if not last:
                comm(_K_SEND, w + i, [act_out(w + i), grad_in(i)], j + 1)
            backward(i)
            if not first:
                if i == r - 1:
                    comm(_K_SEND, i, [grad_out(i)], j - 1)
                else:
                    comm(_K_SEND, i, [grad_out(i), act_in(w + i + 1)], j - 1)
        for i in range(r, gas):
            if not last:
                comm(_K_RECV, i, [grad_in(i)], j + 1)
            backward(i)
            if not first:
                comm(_K_SEND, i, [grad_out(i)], j - 1)
        rows.append(np.array(row, dtype=np.int64).reshape(-1, 5))
    n = max(r.shape[0] for r in rows)
    kind = np.full((pp, n), _K_IDLE, dtype=np.int64)
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
            if k == _FORWARD:
                if j > 0:
                    row.append((_K_RECV, m, (j - 1) * gas + m, j - 1))
                row.append((k, m, -1, -1))
                if j < pp - 1:
                    row.append((_K_SEND, m, j * gas + m, j + 1))
            else:                # the gradient arrives before the recompute, if any
                if j < pp - 1 and (k == _RECOMPUTE or not recompute):
                    row.append((_K_RECV, m, nb_p2p + j * gas + m, j + 1))
                row.append((k, m, -1, -1))
                if k == _BACKWARD and j > 0:
                    row.append((_K_SEND, m, nb_p2p + (j - 1) * gas + m, j - 1))
        rows.append(np.array(row, dtype=np.int64).reshape(-1, 4))
    n = max(r.shape[0] for r in rows)
    out = np.full((4, pp, n), -1, dtype=np.int64)
    out[0] = _K_IDLE
    for j, r in enumerate(rows):
        out[:, j, :r.shape[0]] = r.T
    return out[0], out[1], out[2], out[3]


P2P_MODE_OF_FRAMEWORK = {"deepspeed": "blocking", "megatron": "paired", "async": "async"}
"""The p2p_mode for each key of `cost_models.pipeline.P2P_BLOCKING_SHARE`."""


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
    with the flow id of `simulate_iteration`: activation of micro-batch m over boundary b
    (stages b, b+1) b*gas + m, its gradient (pp-1)*gas + b*gas + m; peer is the other stage.
    The compute ops come in `schedule_order("1f1b", ...)`'s order (tests check both)."""
    nb_p2p = (pp - 1) * gas
    T = 2 * (gas + pp - 1)
    s = np.arange(T, dtype=np.int64)
    rows = []
    for j in range(pp):
        fwd = (s + j) % 2 == 0
        if j % 2 == 0:
            mb = np.where(fwd, s // 2 - j // 2, (s - 1) // 2 - pp + 1 + j // 2)
        else:
            mb = np.where(fwd, (s - 1) // 2 - j // 2, s // 2 - pp + (j + 1) // 2)
        prev = np.concatenate([[-1], mb[:-1]])
        ok, ok_prev = (mb >= 0) & (mb < gas), (prev >= 0) & (prev < gas)
        # slots per step: [comm 1, comm 2, compute(, compute)]: kind, micro-batch, flow, peer
        n_slot = 4 if recompute else 3
        kind = np.full((T, n_slot), -1, dtype=np.int64)
        micro = np.full((T, n_slot), -1, dtype=np.int64)
        flow = np.full((T, n_slot), -1, dtype=np.int64)
        peer = np.full((T, n_slot), -1, dtype=np.int64)

        def put(slot, sel, k, m, f, p):
            kind[sel, slot], micro[sel, slot], flow[sel, slot] = k, m[sel], f[sel]
            peer[sel, slot] = p

        if j > 0:                      # forward step: SendGrad(prev), RecvActivation(mb)
            put(0, fwd & ok_prev, _K_SEND, prev, nb_p2p + (j - 1) * gas + prev, j - 1)
            put(1, fwd & ok, _K_RECV, mb, (j - 1) * gas + mb, j - 1)
        if j < pp - 1:                 # backward step: RecvGrad(mb), SendActivation(prev)
            put(0, ~fwd & ok, _K_RECV, mb, nb_p2p + j * gas + mb, j + 1)
            put(1, ~fwd & ok_prev, _K_SEND, prev, j * gas + prev, j + 1)
        none = np.full(T, -1, dtype=np.int64)
        put(2, fwd & ok, _FORWARD, mb, none, -1)
        if recompute:
            put(2, ~fwd & ok, _RECOMPUTE, mb, none, -1)
            put(3, ~fwd & ok, _BACKWARD, mb, none, -1)
        else:
            put(2, ~fwd & ok, _BACKWARD, mb, none, -1)
        keep = kind.reshape(-1) >= 0
        rows.append(tuple(a.reshape(-1)[keep] for a in (kind, micro, flow, peer)))
    n = max(r[0].shape[0] for r in rows)
    out = (np.full((pp, n), _K_IDLE, dtype=np.int64), np.full((pp, n), -1, dtype=np.int64),
           np.full((pp, n), -1, dtype=np.int64), np.full((pp, n), -1, dtype=np.int64))
    for j, r in enumerate(rows):
        for a, b in zip(out, r):
            a[j, :b.shape[0]] = b
    return out


# ----------------------------------------------------------------------------- the kernel

_EV_COMPUTE_END, _EV_LATENCY_END, _EV_FLOW_END = 0, 1, 2
_NUM_EV = 3

def _jit(fn):
    """``numba.njit(cache=True, error_model="numpy")(fn)`` (every division is guarded), or
    without the on-disk cache where none can be written (cost_models._jit)."""
    return njit(fn, what=KERNELS_WHAT, error_model="numpy")


class _Kernel:
    """A kernel that becomes a numba function on its first call, so that importing this
    module (the CLI does, for its choices) does not import numba. On that call every kernel
    of the module is replaced by its jitted version, helpers first, so that the kernels find
    one another compiled (numba types a callee's global name when it compiles the caller)."""

    def __init__(self, fn):
        self.py_func = fn
        self.__name__ = fn.__name__
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        _materialize()
        return globals()[self.__name__](*args)


def _materialize() -> None:
    """Replace every `_Kernel` of the module by its numba dispatcher (compiled on first call,
    or loaded from the on-disk cache), helpers first."""
    for name in _KERNEL_NAMES:
        kernel = globals()[name]
        if isinstance(kernel, _Kernel):
            globals()[name] = _jit(kernel.py_func)


def kernels_cached() -> bool:
    """Whether numba's on-disk cache holds the compiled simulator kernels for this machine
    (the two that the inputs call; they load without their callees)."""
    try:
        _materialize()
    except Exception:  # noqa: BLE001 - a guess about a cache must never fail a run
        return False
    return in_cache(globals()["_simulate_kernel"]) and in_cache(globals()["_exposed_kernel"])


def _pick(name: str, use_numba: bool):
    """The kernel `name` to call: compiled, or its plain-Python twin (use_numba False, or
    while cost_models._jit.python_until_cached waits for the cache)."""
    if not use_numba:
        return _PY[name]
    return _jit_module.pick("simulator", globals()[name], _PY[name], kernels_cached)


def _kernel(fn):
    return _Kernel(fn)


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
def _simulate_kernel(pp, op_dur, op_dep, op_out, op_emit, overlap, stage_nb, stage_bptr,
                     stage_buckets, f_stream, f_wake, f_kind, f_lat, f_bytes, f_alone, b_frac,
                     f_lptr, f_link, f_mult, s_ptr, s_flow, l_bw, l_ptr, ordered, op_xfer,
                     blocking, op_pre):
    """The discrete-event loop (numba-compiled; `_PY` holds the same code as plain Python).

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
            if kind == 0 and blocking:   # the blocked tasks end with their last flow
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
            if kind == 1:
                buckets_left[j] -= 1
                last_bucket[j] = f
                if block_left[j] > 0:
                    block_left[j] -= 1
            elif kind == 2:
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


def _python_twins(*kernels):
    """Plain-Python copies of `kernels` whose calls to one another stay in Python (as in
    amp_search.partition): each copy's globals point the kernel names at the other copies."""
    namespace = dict(globals())
    for kernel in kernels:
        fn = kernel.py_func
        namespace[fn.__name__] = types.FunctionType(fn.__code__, namespace, fn.__name__,
                                                    fn.__defaults__)
    return namespace




# ----------------------------------------------------------------------------- inputs

@dataclass(frozen=True)
class LinkUse:
    """A route entry: `copies` identical parallel flows of the simulated one cross `link`
    (e.g. the tmp rings of one stage that all cross one NIC); each takes a fair share."""

    link: Hashable
    copies: int = 1


Route = Sequence[Hashable]
"""Links a flow crosses: link ids (keys of `links`), or LinkUse(link id, copies)."""


def _floats(name: str, values, n: int, *, default: float | None = None) -> np.ndarray:
    if values is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return np.full(n, float(default))
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.shape[0] != n:
        raise ValueError(f"{name} needs {n} values, got {a.shape[0]}")
    if not (np.all(np.isfinite(a)) and np.all(a >= 0.0)):
        raise ValueError(f"{name} must be finite and >= 0, got {a.tolist()}")
    return a


class _Links:
    """Link ids -> dense indices, with bandwidths, and flow routes as CSR arrays."""

    def __init__(self, bandwidth: Mapping[Hashable, float]):
        self.index: dict = {}
        self.bw: list[float] = []
        for link, b in bandwidth.items():
            self.add(link, b)
        self.parts: list[tuple[np.ndarray, np.ndarray, int]] = []
        self.streams: dict[int, set] = {}

    def add(self, link, bandwidth: float) -> None:
        b = float(bandwidth)
        if not b > 0.0:                  # +inf allowed: a link that never limits
            raise ValueError(f"link {link!r}: bandwidth must be > 0 bytes/s, got {bandwidth}")
        if link in self.index:
            raise ValueError(f"link {link!r} is given twice")
        self.index[link] = len(self.bw)
        self.bw.append(b)

    def route(self, route: Route, stream: int, count: int = 1) -> None:
        """`count` consecutive flows of `stream`, each over `route`."""
        merged: dict[int, float] = {}
        if isinstance(route, (str, bytes, LinkUse)):
            raise ValueError(f"a route is a sequence of link ids, got {route!r}")
        for item in route:
            link, copies = (item.link, item.copies) if isinstance(item, LinkUse) else (item, 1)
            if link not in self.index:
                raise ValueError(f"link {link!r} of a route has no bandwidth")
            if isinstance(copies, bool) or not isinstance(copies, (int, np.integer)) \
                    or copies < 1:
                raise ValueError(f"link {link!r}: copies must be >= 1, got {copies}")
            li = self.index[link]
            merged[li] = merged.get(li, 0.0) + float(copies)
        for li in merged:
            self.streams.setdefault(li, set()).add(stream)
        self.parts.append((np.fromiter(merged.keys(), dtype=np.int64, count=len(merged)),
                           np.fromiter(merged.values(), dtype=float, count=len(merged)),
                           int(count)))

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr [flows + 1], link [entries], copies [entries]) in the order routed."""
        degree = np.concatenate([np.full(c, len(li), dtype=np.int64)
                                 for li, _, c in self.parts] or [np.zeros(0, np.int64)])
        ptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
        link = np.concatenate([np.tile(li, c) for li, _, c in self.parts]
                              or [np.zeros(0, np.int64)]).astype(np.int64)
        mult = np.concatenate([np.tile(m, c) for _, m, c in self.parts]
                              or [np.zeros(0)]).astype(float)
        return ptr, link, mult

    def slot_ptr(self) -> np.ndarray:
        """Slots per link: at most one flow per stream that uses it is in flight at once."""
        counts = [len(self.streams.get(i, ())) for i in range(len(self.bw))]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def _zero3_inputs(layer_f, layer_b, param, grad, *, fwd, bwd, rec, pp, dp, other):
    """The checked ZeRO 3 arrays of `simulate_iteration` (forward, backward, parameter and
    gradient bytes per layer), or None where none is given."""
    given = [x is not None for x in (layer_f, layer_b, param, grad)]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("ZeRO 3 needs zero3_layer_forward_s, zero3_layer_backward_s, "
                         "zero3_param_bytes and zero3_grad_bytes together")
    if pp != 1 or dp < 2:
        raise ValueError(f"ZeRO 3 is simulated for pp = 1 and dp > 1 (DeepSpeed's pipeline "
                         f"engine rejects ZeRO 3), got pp = {pp}, dp = {dp}")
    gradient_bytes, gather_bytes_after_step, reduce_every_microbatch = other
    if gradient_bytes is not None or gather_bytes_after_step is not None \
            or reduce_every_microbatch:
        raise ValueError("ZeRO 3 reduce-scatters per layer (zero3_grad_bytes): gradient_bytes, "
                         "gather_bytes_after_step and reduce_every_microbatch do not apply")
    n = np.asarray(layer_f, dtype=float).reshape(-1).shape[0]
    if n < 1:
        raise ValueError("zero3_layer_forward_s needs at least one layer")
    out = tuple(_floats(name, x, n) for name, x in (
        ("zero3_layer_forward_s", layer_f), ("zero3_layer_backward_s", layer_b),
        ("zero3_param_bytes", param), ("zero3_grad_bytes", grad)))
    for name, total, want in (("forward", out[0].sum(), fwd[0]),
                              ("backward", out[1].sum(), bwd[0] + (0.0 if rec is None
                                                                   else rec[0]))):
        if not math.isclose(total, want, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"zero3_layer_{name}_s sums to {total:.9g} s, but the stage's "
                             f"{name} is {want:.9g} s")
    return out


def _zero3_order(gas: int, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZeRO 3's compute stream at pp = 1: a no-op (it issues the first gather), then per
    micro-batch the forward of each layer in order and the backward of each in reverse:
    (kind, microbatch, layer), [1, 1 + 2 gas layers] arrays."""
    fwd_l = np.arange(layers, dtype=np.int64)
    per_mb_kind = np.concatenate([np.full(layers, _FORWARD), np.full(layers, _BACKWARD)])
    per_mb_layer = np.concatenate([fwd_l, fwd_l[::-1]])
    kind = np.concatenate([[_K_IDLE], np.tile(per_mb_kind, gas)]).astype(np.int64)
    micro = np.concatenate([[-1], np.repeat(np.arange(gas), 2 * layers)]).astype(np.int64)
    layer = np.concatenate([[0], np.tile(per_mb_layer, gas)]).astype(np.int64)
    return kind[None, :], micro[None, :], layer[None, :]


def simulate_iteration(
    *,
    forward_s,
    backward_s,
    optimizer_s,
    gas: int,
    schedule: str = "1f1b",
    recompute_s=None,
    p2p_bytes=None,
    p2p_latency_s=None,
    p2p_bandwidth_bytes_per_s=None,
    p2p_routes: Sequence[Route] | None = None,
    p2p_grad_routes: Sequence[Route] | None = None,
    dp: int = 1,
    gradient_bytes=None,
    dp_latency_s=None,
    dp_bandwidth_bytes_per_s=None,
    dp_routes: Sequence[Route] | None = None,
    bucket_bytes: float = deepspeed_bucket_bytes(2),
    overlap: bool = False,
    gradient_collective: str = "all_reduce",
    reduce_every_microbatch: bool = False,
    gather_bytes_after_step=None,
    zero3_layer_forward_s=None,
    zero3_layer_backward_s=None,
    zero3_param_bytes=None,
    zero3_grad_bytes=None,
    links: Mapping[Hashable, float] | None = None,
    step_overhead_s: float = 0.0,
    use_numba: bool = True,
    time_ordered: bool | None = None,
    p2p_mode: str = "async",
) -> SimulatedIteration:
    """Simulate one training iteration of a pp-stage pipeline (the module docstring has the
    model). All times in seconds, sizes in bytes, bandwidths in bytes/s (one direction).

    Compute, per stage j (pp = len(forward_s)) and per micro-batch: forward_s[j],
    backward_s[j] (including recomputation, unless recompute_s[j] is given: then a separate
    recompute task of that length runs just before each backward, once its gradient has
    arrived), optimizer_s[j] once per iteration; gas micro-batches; schedule "1f1b" or
    "gpipe".

    P2P, per boundary j between stages j and j+1 (pp-1 values): p2p_bytes[j] the activation
    of one micro-batch (its gradient has the same size), p2p_latency_s[j] one message's
    latency. Routes: by default each boundary has a private full-duplex link of
    p2p_bandwidth_bytes_per_s[j]; or give p2p_routes[j] (the activations' links) and
    p2p_grad_routes[j] (the gradients', default the same links) over `links` ({link id:
    bandwidth}). Omitted p2p_bytes: free transfers. p2p_mode (one of P2P_MODES): "async"
    (default), sends that never block; "blocking", DeepSpeed's blocking sends and receives in
    its TrainSchedule order; "paired" (1F1B only), Megatron-LM's order with a send and a
    receive posted together (the module docstring says how; `P2P_MODE_OF_FRAMEWORK`).

    Data parallelism over `dp` ranks, per stage: gradient_bytes[j] (one device's gradients),
    dp_latency_s[j] per ring step, a private link of dp_bandwidth_bytes_per_s[j] or
    dp_routes[j] over `links`; bucket_bytes (default DeepSpeed's 5e8 fp16 elements: pass
    `deepspeed_bucket_bytes(bytes_per_element)`); overlap (DeepSpeed's overlap_comm);
    gradient_collective "all_reduce" (ZeRO 0) or "reduce_scatter" (ZeRO 1, 2);
    reduce_every_microbatch (ZeRO 2: every backward emits buckets, not only the last);
    gather_bytes_after_step[j] (ZeRO 1, 2, BF16_Optimizer: an all-gather of the updated
    weights after the step). dp = 1: no data-parallel traffic.

    ZeRO 3 (pp = 1, dp > 1; `zero3_*` given together, one value per layer of the stage): the
    stage runs each micro-batch as one task per layer, zero3_layer_forward_s[l] forward in
    layer order, then zero3_layer_backward_s[l] (its recomputation included) in reverse; they
    must sum to forward_s[0] and backward_s[0] (+ recompute_s[0]). Before each of these tasks
    the layer's zero3_param_bytes[l] (one device's full parameters) are all-gathered over the
    dp ranks, prefetched: the gather of a task is issued when the task before it starts (the
    first one at t = 0), one at a time in task order, and the task waits for it; after each
    backward task the layer's zero3_grad_bytes[l] are reduce-scattered on the dp stream,
    overlapped with the rest of the backward (DeepSpeed's overlap_comm, on by default for
    stage 3), and the optimizer step waits for all of them. Gathers and reduce-scatters share
    the stage's dp link (or route) max-min fairly. Each is one ring collective of
    `cost_models.comm` (`collective_time_s` when alone), so an iteration moves exactly the
    volume of `comm.data_parallel_sync_time_s(zero_stage=3)`: gas (2 all-gathers + 1
    reduce-scatter) of the stage's parameters. gradient_bytes, gather_bytes_after_step and
    reduce_every_microbatch do not apply (ValueError).

    step_overhead_s is added once at the end. use_numba=False runs the same kernel as plain
    Python (slow; for tests). time_ordered: take the events in time order (a heap); None
    (default) does so only where some link can be shared, since otherwise every duration is
    fixed and any order gives the same timeline (True forces it, for tests). Raises
    ValueError on malformed input.

    Cost: O(E log E) for E = O(pp * gas) events; pp = 128, gas = 2048 takes about 0.3 s
    (0.7 s with shared links; a cold numba cache adds ~10 s of compilation once)."""
    fwd = np.asarray(forward_s, dtype=float).reshape(-1)
    pp = fwd.shape[0]
    if pp < 1:
        raise ValueError("forward_s needs at least one stage")
    fwd = _floats("forward_s", fwd, pp)
    bwd = _floats("backward_s", backward_s, pp)
    opt = _floats("optimizer_s", optimizer_s, pp)
    rec = None if recompute_s is None else _floats("recompute_s", recompute_s, pp)
    if isinstance(gas, bool) or not isinstance(gas, (int, np.integer)) or gas < 1:
        raise ValueError(f"gas must be a positive integer, got {gas!r}")
    gas = int(gas)
    if isinstance(dp, bool) or not isinstance(dp, (int, np.integer)) or dp < 1:
        raise ValueError(f"dp must be a positive integer, got {dp!r}")
    dp = int(dp)
    if gradient_collective not in GRADIENT_COLLECTIVES:
        raise ValueError(f"gradient_collective {gradient_collective!r}; known: "
                         f"{', '.join(GRADIENT_COLLECTIVES)}")
    if not (bucket_bytes > 0 and math.isfinite(bucket_bytes)):
        raise ValueError(f"bucket_bytes must be finite and > 0, got {bucket_bytes}")
    if not (math.isfinite(step_overhead_s) and step_overhead_s >= 0):
        raise ValueError(f"step_overhead_s must be finite and >= 0, got {step_overhead_s}")

    if p2p_mode not in P2P_MODES:
        raise ValueError(f"p2p_mode {p2p_mode!r}; known: {', '.join(P2P_MODES)}")
    blocking = p2p_mode != "async" and pp > 1
    kinds, micro = schedule_order(schedule, pp, gas, recompute=rec is not None)
    xfer = peer = None
    if blocking and p2p_mode == "paired":
        if schedule != "1f1b":
            raise ValueError(f"p2p_mode 'paired' is Megatron-LM's 1F1B; schedule {schedule!r} "
                             f"has no paired order")
        kinds, micro, xfer, peer = megatron_order(pp, gas, recompute=rec is not None)
    elif blocking:
        kinds, micro, xfer, peer = blocking_order(schedule, pp, gas, recompute=rec is not None)
    if blocking:
        # and a no-op after each stage's last instruction: DeepSpeed's ReduceGrads (ZeRO 0,
        # 1) comes after the stage's last send, in the last step, as Megatron-LM's
        # finalize_model_grads after its schedule (the no-op emits the buckets)
        kinds, micro, xfer, peer = (
            np.concatenate([a, np.full((pp, 1) + a.shape[2:], v, np.int64)], axis=1)
            for a, v in ((kinds, _K_IDLE), (micro, -1), (xfer, -1), (peer, -1)))
    z3 = _zero3_inputs(zero3_layer_forward_s, zero3_layer_backward_s, zero3_param_bytes,
                       zero3_grad_bytes, fwd=fwd, bwd=bwd, rec=rec, pp=pp, dp=dp,
                       other=(gradient_bytes, gather_bytes_after_step, reduce_every_microbatch))
    if z3 is not None:
        kinds, micro, z3_layer = _zero3_order(gas, z3[0].shape[0])
    n_ops = kinds.shape[1]
    K = n_ops + 1
    lk = _Links(links or {})

    # ---- flows: P2P activations [j*gas + m], P2P gradients [NF + j*gas + m], buckets, gathers
    nb_p2p = (pp - 1) * gas
    p2p_b = _floats("p2p_bytes", p2p_bytes, pp - 1, default=0.0)
    p2p_l = _floats("p2p_latency_s", p2p_latency_s, pp - 1, default=0.0)
    f_stream, f_owner, f_wake, f_kind, f_lat, f_bytes, b_frac, f_mb, f_peer, f_count = \
        ([] for _ in range(10))
    if p2p_routes is not None and p2p_bandwidth_bytes_per_s is not None:
        raise ValueError("give p2p_bandwidth_bytes_per_s (private links) or p2p_routes, not both")
    if p2p_grad_routes is not None and p2p_routes is None:
        raise ValueError("p2p_grad_routes needs p2p_routes")
    if dp_routes is not None and dp_bandwidth_bytes_per_s is not None:
        raise ValueError("give dp_bandwidth_bytes_per_s (private links) or dp_routes, not both")
    if pp > 1:
        if p2p_routes is None:
            if p2p_bandwidth_bytes_per_s is None:
                if np.any(p2p_b > 0):
                    raise ValueError("p2p_bytes needs p2p_bandwidth_bytes_per_s or p2p_routes")
                bw = np.full(pp - 1, np.inf)
            else:
                bw = np.asarray(p2p_bandwidth_bytes_per_s, dtype=float).reshape(-1)
                if bw.shape[0] != pp - 1:
                    raise ValueError(f"p2p_bandwidth_bytes_per_s needs {pp - 1} values")
            fwd_routes = []
            grad_routes = []
            for j in range(pp - 1):
                lk.add(("p2p", j, "activation"), bw[j])
                lk.add(("p2p", j, "gradient"), bw[j])
                fwd_routes.append([("p2p", j, "activation")])
                grad_routes.append([("p2p", j, "gradient")])
        else:
            fwd_routes = list(p2p_routes)
            grad_routes = list(p2p_grad_routes) if p2p_grad_routes is not None else fwd_routes
            if len(fwd_routes) != pp - 1 or len(grad_routes) != pp - 1:
                raise ValueError(f"p2p routes need {pp - 1} entries (one per boundary)")
        for direction in (0, 1):
            for j in range(pp - 1):
                sender = j if direction == 0 else j + 1
                stream = 3 * sender + (0 if direction == 0 else 1)
                route = fwd_routes[j] if direction == 0 else grad_routes[j]
                lk.route(route, stream, gas)
                f_stream.append(np.full(gas, stream))
                f_owner.append(np.full(gas, sender))
                f_wake.append(np.full(gas, j + 1 if direction == 0 else j))
                f_kind.append(np.full(gas, _FLOW_P2P))
                f_lat.append(np.full(gas, p2p_l[j]))
                f_bytes.append(np.full(gas, p2p_b[j]))
                b_frac.append(np.zeros(gas))
                f_mb.append(np.arange(gas))
                f_peer.append(np.full(gas, j + 1 if direction == 0 else j))
                f_count.append(np.zeros(gas))

    grad = _floats("gradient_bytes", gradient_bytes, pp, default=0.0)
    gather = _floats("gather_bytes_after_step", gather_bytes_after_step, pp, default=0.0)
    dp_l = _floats("dp_latency_s", dp_latency_s, pp, default=0.0)
    stage_nb = np.zeros(pp, dtype=np.int64)
    stage_bptr = np.zeros(pp, dtype=np.int64)
    stage_buckets = np.zeros(pp, dtype=np.int64)
    gather_flow = np.full(pp, -1, dtype=np.int64)
    emitters = gas if reduce_every_microbatch else 1
    if dp > 1:
        if dp_routes is None:
            if dp_bandwidth_bytes_per_s is None:
                raise ValueError("dp > 1 needs dp_bandwidth_bytes_per_s or dp_routes")
            bw = np.asarray(dp_bandwidth_bytes_per_s, dtype=float).reshape(-1)
            if bw.shape[0] != pp:
                raise ValueError(f"dp_bandwidth_bytes_per_s needs {pp} values")
            for j in range(pp):
                lk.add(("dp", j), bw[j])
            routes = [[("dp", j)] for j in range(pp)]
        else:
            routes = list(dp_routes)
            if len(routes) != pp:
                raise ValueError(f"dp_routes needs {pp} entries (one per stage)")
        n_flows = 2 * nb_p2p
        for j in range(pp):
            stream = 3 * j + 2
            nb = int(math.ceil(grad[j] / bucket_bytes)) if grad[j] > 0 else 0
            if nb * emitters > MAX_BUCKETS_PER_STAGE:
                raise ValueError(f"stage {j}: {grad[j]:.3g} gradient bytes in buckets of "
                                 f"{bucket_bytes:.3g} bytes make {nb * emitters} buckets; at "
                                 f"most {MAX_BUCKETS_PER_STAGE} are simulated")
            stage_nb[j] = nb
            stage_bptr[j] = n_flows
            stage_buckets[j] = nb * emitters
            if nb:
                sizes = np.full(nb, float(bucket_bytes))
                sizes[-1] = grad[j] - bucket_bytes * (nb - 1)
                frac = np.minimum(np.cumsum(sizes) / grad[j], 1.0)
                frac[-1] = 1.0
                n = nb * emitters
                f_stream.append(np.full(n, stream))
                f_owner.append(np.full(n, j))
                f_wake.append(np.full(n, j))
                f_kind.append(np.full(n, _FLOW_BUCKET))
                f_lat.append(np.full(n, C.latency_steps(gradient_collective, dp) * dp_l[j]))
                f_bytes.append(np.tile(C.bus_factor(gradient_collective, dp) * sizes,
                                       emitters))
                b_frac.append(np.tile(frac, emitters))
                f_mb.append(np.repeat(np.arange(gas - emitters, gas), nb))
                f_peer.append(np.tile(np.arange(nb), emitters))
                f_count.append(np.full(n, nb))
                lk.route(routes[j], stream, n)
                n_flows += n
            if gather[j] > 0:
                gather_flow[j] = n_flows
                f_stream.append(np.array([stream]))
                f_owner.append(np.array([j]))
                f_wake.append(np.array([j]))
                f_kind.append(np.array([_FLOW_GATHER]))
                f_lat.append(np.array([C.latency_steps("all_gather", dp) * dp_l[j]]))
                f_bytes.append(np.array([C.bus_factor("all_gather", dp) * gather[j]]))
                b_frac.append(np.zeros(1))
                f_mb.append(np.array([-1]))
                f_peer.append(np.array([-1]))
                f_count.append(np.zeros(1))
                lk.route(routes[j], stream)
                n_flows += 1

    if z3 is not None:      # per-layer gathers (stream 0, free at pp = 1), reduce-scatters
        z3_g0 = sum(len(a) for a in f_stream)
        layer = z3_layer[0, 1:]
        is_bwd = kinds[0, 1:] == _BACKWARD
        for stream, kind, coll, sel, size in (
                (0, _FLOW_PREFETCH, "all_gather", np.ones_like(is_bwd), z3[2]),
                (2, _FLOW_BUCKET, "reduce_scatter", is_bwd, z3[3])):
            ls = layer[sel]
            n = ls.shape[0]
            f_stream.append(np.full(n, stream))
            f_owner.append(np.zeros(n))
            f_wake.append(np.zeros(n))
            f_kind.append(np.full(n, kind))
            f_lat.append(np.where(size[ls] > 0, C.latency_steps(coll, dp) * dp_l[0], 0.0))
            f_bytes.append(C.bus_factor(coll, dp) * size[ls])
            b_frac.append(np.zeros(n))
            f_mb.append(micro[0, 1:][sel])
            f_peer.append(ls)
            f_count.append(np.zeros(n))
            lk.route(routes[0], stream, n)
        z3_r0 = z3_g0 + n_ops - 1
        stage_buckets[0] = int(is_bwd.sum())

    def cat(parts, dtype):
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

    f_stream_a = cat(f_stream, np.int64)
    nf = f_stream_a.shape[0]
    # FIFO order of each stream: the flows' ids are already in production order per stream
    ns = 3 * pp
    order = np.argsort(f_stream_a, kind="stable").astype(np.int64)
    s_ptr = np.concatenate([[0], np.cumsum(np.bincount(f_stream_a, minlength=ns))]
                           ).astype(np.int64)

    # ---- compute ops: durations, dependencies, outputs, bucket emissions
    op_dur = np.empty((pp, K))
    op_dep = np.full((pp, K), -1, dtype=np.int64)
    op_out = np.full((pp, K), -1, dtype=np.int64)
    op_emit = np.full((pp, K), -1, dtype=np.int64)
    js = np.arange(pp)[:, None]
    op_dur[:, :n_ops] = np.where(kinds == _FORWARD, fwd[:, None],
                                 np.where(kinds == _BACKWARD, bwd[:, None],
                                          np.where(kinds == _RECOMPUTE,
                                                   0.0 if rec is None else rec[:, None], 0.0)))
    op_dur[:, n_ops] = opt
    is_f = kinds == _FORWARD
    first_b = kinds == (_BACKWARD if rec is None else _RECOMPUTE)
    is_b = kinds == _BACKWARD
    op_xfer = np.full((pp, K, 1 if xfer is None else xfer.reshape(pp, n_ops, -1).shape[2]),
                      -1, dtype=np.int64)
    if blocking:     # the blocking sends and receives carry the dependencies
        op_xfer[:, :n_ops] = xfer.reshape(pp, n_ops, -1)
    elif pp > 1:
        op_dep[:, :n_ops] = np.where(is_f & (js > 0), (js - 1) * gas + micro, -1)
        op_dep[:, :n_ops] = np.where(first_b & (js < pp - 1), nb_p2p + js * gas + micro,
                                     op_dep[:, :n_ops])
        op_out[:, :n_ops] = np.where(is_f & (js < pp - 1), js * gas + micro, -1)
        op_out[:, :n_ops] = np.where(is_b & (js > 0), nb_p2p + (js - 1) * gas + micro,
                                     op_out[:, :n_ops])
    op_out[:, n_ops] = gather_flow
    if dp > 1:
        e = micro - (gas - emitters)
        op_emit[:, :n_ops] = np.where(is_b & (e >= 0) & (stage_nb[:, None] > 0), e, -1)
        if blocking and not overlap and emitters == 1:
            op_emit[:, :n_ops] = -1
            op_emit[:, n_ops - 1] = np.where(stage_nb > 0, 0, -1)
    op_pre = np.full((pp, K), -1, dtype=np.int64)
    if z3 is not None:      # task i > 0 waits for gather i-1, which task i-1 issues
        op_dur[0, :n_ops] = np.where(kinds[0] == _FORWARD, z3[0][z3_layer[0]],
                                     np.where(kinds[0] == _BACKWARD, z3[1][z3_layer[0]], 0.0))
        gathers = z3_g0 + np.arange(n_ops - 1)
        op_dep[0, 1:n_ops] = gathers
        op_pre[0, :n_ops - 1] = gathers
        op_emit[0] = -1
        bwd_ops = np.flatnonzero(kinds[0] == _BACKWARD)
        op_out[0, bwd_ops] = z3_r0 + np.arange(bwd_ops.shape[0])
        overlap = True

    f_lptr, f_link, f_mult = lk.csr()
    link_bw = np.asarray(lk.bw, dtype=float)
    slot_ptr = lk.slot_ptr()
    # a flow whose every link carries only its own stream never shares: its rate is fixed
    shared_entry = (slot_ptr[1:] - slot_ptr[:-1])[f_link] > 1
    degree = f_lptr[1:] - f_lptr[:-1]
    alone = np.full(nf, np.inf)
    has = degree > 0
    if np.any(has):
        alone[has] = np.minimum.reduceat(link_bw[f_link] / f_mult, f_lptr[:-1][has])
    flow_of_entry = np.repeat(np.arange(nf), degree)
    alone[np.bincount(flow_of_entry[shared_entry], minlength=nf) > 0] = 0.0
    f_owner_a, f_wake_a, f_kind_a = cat(f_owner, np.int64), cat(f_wake, np.int64), \
        cat(f_kind, np.int64)
    if time_ordered is None:
        time_ordered = bool(np.any(alone == 0.0))
    kernel = _pick("_simulate_kernel", use_numba)
    c_start, c_end, f_start, f_end, st_end, path, complete = kernel(
        pp, op_dur, op_dep, op_out, op_emit, bool(overlap), stage_nb, stage_bptr,
        stage_buckets, f_stream_a, f_wake_a, f_kind_a, cat(f_lat, float),
        cat(f_bytes, float), alone, cat(b_frac, float), f_lptr, f_link, f_mult, s_ptr,
        order, link_bw, slot_ptr, bool(time_ordered), op_xfer, bool(blocking), op_pre)
    if not complete:        # cannot happen for the schedules above; an invariant
        raise RuntimeError("the schedule simulation deadlocked")

    return _summarise(
        schedule=schedule, pp=pp, gas=gas, kinds=kinds, micro=micro,
        peer=np.full(kinds.shape, -1, dtype=np.int64) if peer is None else peer,
        c_start=c_start,
        c_end=c_end, f_start=f_start, f_end=f_end, path=path,
        f_stream=f_stream_a, f_owner=f_owner_a, f_wake=f_wake_a, f_kind=f_kind_a,
        f_mb=cat(f_mb, np.int64), f_peer=cat(f_peer, np.int64),
        f_count=cat(f_count, np.int64), st_end=st_end,
        collective="reduce_scatter" if z3 is not None else gradient_collective,
        step_overhead_s=float(step_overhead_s),
        use_numba=use_numba, s_ptr=s_ptr, s_flow=order)


# ----------------------------------------------------------------------------- interleaved

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
        kinds[j] = np.concatenate([np.full(w, _FORWARD),
                                   np.tile(np.array([_FORWARD, _BACKWARD]), r),
                                   np.full(w, _BACKWARD)])
        ks = np.concatenate([k[:w], np.stack([fw, k[:r]], axis=1).reshape(-1), k[r:]])
        micro[j] = mb[ks]
        chunk[j] = np.where(kinds[j] == _FORWARD, f_chunk[ks], b_chunk[ks])
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
            held[c] += 1 if kind == _FORWARD else -1
            if kind == _FORWARD and held.sum() > best:
                best = int(held.sum())
                out[j] = held
    return out


def simulate_interleaved(*, forward_s, backward_s, optimizer_s, gas: int,
                         p2p_bytes=None, p2p_latency_s=None, p2p_bandwidth_bytes_per_s=None,
                         dp: int = 1, gradient_bytes=None, dp_latency_s=None,
                         dp_bandwidth_bytes_per_s=None,
                         bucket_bytes: float = deepspeed_bucket_bytes(2),
                         gradient_collective: str = "all_reduce",
                         step_overhead_s: float = 0.0,
                         use_numba: bool = True) -> SimulatedIteration:
    """Simulate one iteration of Megatron-LM's interleaved 1F1B schedule (`interleaved_order`)
    with v = forward_s.shape[1] model chunks per device, on `simulate_iteration`'s kernel.

    forward_s[j, c], backward_s[j, c] (pp x v): one micro-batch of chunk c of device j, that
    is virtual stage c pp + j (recomputation folded into the backward); optimizer_s[j] once.
    P2P: p2p_bytes[b] and p2p_latency_s[b] for each of the v pp - 1 virtual boundaries b
    (virtual stage b to b+1, from device b mod pp to (b+1) mod pp), the gradient the same size
    back; p2p_bandwidth_bytes_per_s[j] (pp values) the link from device j to device j+1, the
    last one the wrap-around from device pp-1 to device 0 (each direction a private link).
    Omitted p2p_bytes: free transfers. Sends are "async" (free-running, the receiver waits):
    Megatron's paired sends and receives of the interleaved schedule are not modelled.
    Data parallelism (dp > 1): gradient_bytes[j] in buckets after the device's last backward,
    on a private link of dp_bandwidth_bytes_per_s[j], without overlap, then the optimizer step.

    With free links and chunks of equal length the makespan is the closed form
    `cost_models.pipeline.interleaved_1f1b_time_s` exactly (tests/test_interleaved.py)."""
    fwd = np.asarray(forward_s, dtype=float)
    bwd = np.asarray(backward_s, dtype=float)
    if fwd.ndim != 2 or fwd.shape != bwd.shape or fwd.shape[0] < 1 or fwd.shape[1] < 1:
        raise ValueError(f"forward_s and backward_s must both be [pp, v], got {fwd.shape} "
                         f"and {bwd.shape}")
    if not (np.all(np.isfinite(fwd)) and np.all(np.isfinite(bwd)) and fwd.min() >= 0
            and bwd.min() >= 0):
        raise ValueError("forward_s and backward_s must be finite and >= 0")
    pp, v = fwd.shape
    V = pp * v
    opt = _floats("optimizer_s", optimizer_s, pp)
    if isinstance(gas, bool) or not isinstance(gas, (int, np.integer)) or gas < 1:
        raise ValueError(f"gas must be a positive integer, got {gas!r}")
    gas = int(gas)
    if isinstance(dp, bool) or not isinstance(dp, (int, np.integer)) or dp < 1:
        raise ValueError(f"dp must be a positive integer, got {dp!r}")
    if gradient_collective not in GRADIENT_COLLECTIVES:
        raise ValueError(f"gradient_collective {gradient_collective!r}; known: "
                         f"{', '.join(GRADIENT_COLLECTIVES)}")
    if not (bucket_bytes > 0 and math.isfinite(bucket_bytes)):
        raise ValueError(f"bucket_bytes must be finite and > 0, got {bucket_bytes}")
    kinds, micro, chunk = interleaved_order(pp, v, gas)
    n_ops = kinds.shape[1]
    K = n_ops + 1
    p2p_b = _floats("p2p_bytes", p2p_bytes, V - 1, default=0.0)
    p2p_l = _floats("p2p_latency_s", p2p_latency_s, V - 1, default=0.0)
    if p2p_bandwidth_bytes_per_s is None:
        if np.any(p2p_b > 0):
            raise ValueError("p2p_bytes needs p2p_bandwidth_bytes_per_s")
        p2p_bw = np.full(pp, np.inf)
    else:
        p2p_bw = _floats("p2p_bandwidth_bytes_per_s", p2p_bandwidth_bytes_per_s, pp)
    lk = _Links({})
    for j in range(pp):
        lk.add(("p2p", j, "activation"), p2p_bw[j])      # device j -> j+1 (mod pp)
        lk.add(("p2p", j, "gradient"), p2p_bw[j])        # device j+1 -> j (mod pp)

    # ---- P2P flows, numbered in the order their senders produce them (each stream a FIFO)
    f_stream, f_wake, f_lat, f_bytes, f_mb, f_owner = [], [], [], [], [], []
    op_dep = np.full((pp, K), -1, dtype=np.int64)
    op_out = np.full((pp, K), -1, dtype=np.int64)
    act_id: dict = {}
    grad_id: dict = {}
    for j in range(pp):
        for i in range(n_ops):
            vs = int(chunk[j, i]) * pp + j
            m = int(micro[j, i])
            if kinds[j, i] == _FORWARD and vs < V - 1:       # activation to vs + 1
                b, stream, to = vs, 3 * j, (j + 1) % pp
                lk.route([("p2p", j, "activation")], stream)
                act_id[(b, m)] = op_out[j, i] = len(f_stream)
            elif kinds[j, i] == _BACKWARD and vs > 0:        # gradient to vs - 1
                b, stream, to = vs - 1, 3 * j + 1, (j - 1) % pp
                lk.route([("p2p", (j - 1) % pp, "gradient")], stream)
                grad_id[(b, m)] = op_out[j, i] = len(f_stream)
            else:
                continue
            f_stream.append(stream)
            f_wake.append(to)
            f_owner.append(j)
            f_lat.append(p2p_l[b])
            f_bytes.append(p2p_b[b])
            f_mb.append(m)
    for j in range(pp):
        for i in range(n_ops):
            vs = int(chunk[j, i]) * pp + j
            m = int(micro[j, i])
            if kinds[j, i] == _FORWARD and vs > 0:
                op_dep[j, i] = act_id[(vs - 1, m)]
            elif kinds[j, i] == _BACKWARD and vs < V - 1:
                op_dep[j, i] = grad_id[(vs, m)]
    n_p2p = len(f_stream)
    f_kind = [_FLOW_P2P] * n_p2p
    b_frac = [0.0] * n_p2p
    f_peer = list(f_wake)
    f_count = [0] * n_p2p

    # ---- data parallelism: buckets after each device's last backward, no overlap
    grad = _floats("gradient_bytes", gradient_bytes, pp, default=0.0)
    dp_l = _floats("dp_latency_s", dp_latency_s, pp, default=0.0)
    stage_nb = np.zeros(pp, dtype=np.int64)
    stage_bptr = np.zeros(pp, dtype=np.int64)
    op_emit = np.full((pp, K), -1, dtype=np.int64)
    if dp > 1:
        if dp_bandwidth_bytes_per_s is None:
            raise ValueError("dp > 1 needs dp_bandwidth_bytes_per_s")
        dbw = _floats("dp_bandwidth_bytes_per_s", dp_bandwidth_bytes_per_s, pp)
        for j in range(pp):
            nb = int(math.ceil(grad[j] / bucket_bytes)) if grad[j] > 0 else 0
            if nb > MAX_BUCKETS_PER_STAGE:
                raise ValueError(f"stage {j}: {nb} gradient buckets; at most "
                                 f"{MAX_BUCKETS_PER_STAGE} are simulated")
            stage_nb[j], stage_bptr[j] = nb, len(f_stream)
            if not nb:
                continue
            lk.add(("dp", j), dbw[j])
            sizes = np.full(nb, float(bucket_bytes))
            sizes[-1] = grad[j] - bucket_bytes * (nb - 1)
            frac = np.minimum(np.cumsum(sizes) / grad[j], 1.0)
            frac[-1] = 1.0
            for b in range(nb):
                f_stream.append(3 * j + 2)
                f_wake.append(j)
                f_owner.append(j)
                f_lat.append(C.latency_steps(gradient_collective, dp) * dp_l[j])
                f_bytes.append(C.bus_factor(gradient_collective, dp) * sizes[b])
                f_mb.append(gas - 1)
                f_kind.append(_FLOW_BUCKET)
                b_frac.append(frac[b])
                f_peer.append(b)
                f_count.append(nb)
            lk.route([("dp", j)], 3 * j + 2, nb)
            op_emit[j, n_ops - 1] = 0        # the device's last op is a backward
    f_stream_a = np.array(f_stream, dtype=np.int64).reshape(-1)
    nf = f_stream_a.shape[0]
    ns = 3 * pp
    order = np.argsort(f_stream_a, kind="stable").astype(np.int64)
    s_ptr = np.concatenate([[0], np.cumsum(np.bincount(f_stream_a, minlength=ns))]
                           ).astype(np.int64)
    op_dur = np.empty((pp, K))
    js = np.arange(pp)[:, None]
    op_dur[:, :n_ops] = np.where(kinds == _FORWARD, fwd[js, chunk], bwd[js, chunk])
    op_dur[:, n_ops] = opt
    f_lptr, f_link, f_mult = lk.csr()
    link_bw = np.asarray(lk.bw, dtype=float)
    slot_ptr = lk.slot_ptr()
    degree = f_lptr[1:] - f_lptr[:-1]
    alone = np.full(nf, np.inf)
    has = degree > 0
    if np.any(has):
        alone[has] = np.minimum.reduceat(link_bw[f_link] / f_mult, f_lptr[:-1][has])
    kernel = _pick("_simulate_kernel", use_numba)
    f_wake_a = np.array(f_wake, dtype=np.int64).reshape(-1)
    f_kind_a = np.array(f_kind, dtype=np.int64).reshape(-1)
    c_start, c_end, f_start, f_end, st_end, path, complete = kernel(
        pp, op_dur, op_dep, op_out, op_emit, False, stage_nb, stage_bptr, stage_nb.copy(),
        f_stream_a, f_wake_a, f_kind_a, np.array(f_lat, dtype=float).reshape(-1),
        np.array(f_bytes, dtype=float).reshape(-1), alone,
        np.array(b_frac, dtype=float).reshape(-1), f_lptr, f_link, f_mult, s_ptr, order,
        link_bw, slot_ptr, False, np.full((pp, K, 1), -1, dtype=np.int64), False,
        np.full((pp, K), -1, dtype=np.int64))
    if not complete:        # an invariant of the order above
        raise RuntimeError("the interleaved schedule simulation deadlocked")
    return _summarise(
        schedule=f"interleaved-1f1b-v{v}", pp=pp, gas=gas, kinds=kinds, micro=micro,
        peer=np.full(kinds.shape, -1, dtype=np.int64), c_start=c_start, c_end=c_end,
        f_start=f_start, f_end=f_end, path=path, f_stream=f_stream_a,
        f_owner=np.array(f_owner, dtype=np.int64).reshape(-1), f_wake=f_wake_a,
        f_kind=f_kind_a, f_mb=np.array(f_mb, dtype=np.int64).reshape(-1),
        f_peer=np.array(f_peer, dtype=np.int64).reshape(-1),
        f_count=np.array(f_count, dtype=np.int64).reshape(-1), st_end=st_end,
        collective=gradient_collective, step_overhead_s=float(step_overhead_s),
        use_numba=use_numba, s_ptr=s_ptr, s_flow=order)


# ----------------------------------------------------------------------------- summary

@_kernel
def _exposed_kernel(c_start, c_end, f_start, f_end, s_ptr, s_flow):
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


def _summarise(*, schedule, pp, gas, kinds, micro, peer, c_start, c_end, f_start, f_end,
               path, f_stream, f_owner, f_wake, f_kind, f_mb, f_peer, f_count, st_end,
               collective, step_overhead_s, use_numba, s_ptr, s_flow) -> SimulatedIteration:
    makespan = float(st_end.max())
    comp_kind = np.concatenate([kinds, np.full((pp, 1), _OPTIMIZER)], axis=1)
    comp_mb = np.concatenate([micro, np.full((pp, 1), -1)], axis=1)
    comp_peer = np.concatenate([peer, np.full((pp, 1), -1)], axis=1)
    computing = comp_kind <= _OPTIMIZER      # not a blocking send / receive, not a no-op
    compute_end = np.where(computing, c_end, c_start)
    busy = (compute_end - c_start).sum(axis=1)
    coll_kind = np.where((f_kind == _FLOW_GATHER) | (f_kind == _FLOW_PREFETCH),
                         _K_COLLECTIVE["all_gather"],
                         _K_COLLECTIVE[collective])
    if not computing.all():                  # the no-ops that pad short stages: not a task
        path = path[(path >= pp * comp_kind.shape[1]) |
                    (comp_kind.reshape(-1)[np.minimum(path, comp_kind.size - 1)] != _K_IDLE)]

    # exposed communication per stage: its flows (sent, received, dp) outside its compute
    # (a blocking send or receive holds the compute stream without computing: exposed)
    exposed_kernel = _pick("_exposed_kernel", use_numba)
    exposed = exposed_kernel(c_start, compute_end, f_start, f_end, s_ptr, s_flow)

    parts = dict(pp=pp, makespan=makespan, comp_kind=comp_kind, comp_mb=comp_mb,
                 comp_peer=comp_peer,
                 c_start=c_start, c_end=c_end, f_start=f_start, f_end=f_end, f_stream=f_stream,
                 f_owner=f_owner, f_wake=f_wake, f_kind=f_kind, f_mb=f_mb, f_peer=f_peer,
                 f_count=f_count, coll_kind=coll_kind)
    return SimulatedIteration(
        schedule=schedule, pp=pp, gas=gas, iteration_time_s=makespan + step_overhead_s,
        makespan_s=makespan, stage_end_s=tuple(float(x) for x in st_end),
        busy_s=tuple(float(x) for x in busy),
        idle_s=tuple(float(makespan - x) for x in busy),
        exposed_comm_s=tuple(float(x) for x in exposed), critical_path_tasks=path,
        _parts=parts)


def _task_label(task: int, p: dict) -> str:
    """The label of a task id of the kernel (compute j*K + k, then flows)."""
    comp_kind, comp_mb = p["comp_kind"], p["comp_mb"]
    pp, K = comp_kind.shape
    if task < pp * K:
        j, k = divmod(task, K)
        return _label(j, int(comp_kind[j, k]), int(comp_mb[j, k]), int(p["comp_peer"][j, k]),
                      0)
    f = task - pp * K
    if p["f_kind"][f] == _FLOW_P2P:
        return _label(int(p["f_owner"][f]), _K_SEND, int(p["f_mb"][f]), int(p["f_wake"][f]), 0)
    return _label(int(p["f_owner"][f]), int(p["coll_kind"][f]), int(p["f_mb"][f]),
                  int(p["f_peer"][f]), int(p["f_count"][f]))


def _event_table(*, pp, makespan, comp_kind, comp_mb, comp_peer, c_start, c_end, f_start,
                 f_end, f_stream, f_owner, f_wake, f_kind, f_mb, f_peer, f_count, coll_kind
                 ) -> EventTable:
    """Columns of every event: compute tasks (blocking sends and receives among them, the
    padding no-ops left out), idle gaps, sends, receives, collectives."""
    K = c_start.shape[1]
    real = (comp_kind != _K_IDLE).reshape(-1)
    gap_s = np.concatenate([np.zeros((pp, 1)), c_end], axis=1)
    gap_e = np.concatenate([c_start, np.full((pp, 1), makespan)], axis=1)
    gap = gap_e > gap_s
    stage_of_gap = np.broadcast_to(np.arange(pp)[:, None], gap.shape)[gap]
    p2p = f_kind == _FLOW_P2P
    coll = ~p2p
    to_next = (f_stream % 3 == 0)[p2p]
    n_comp, n_gap, n_p2p, n_coll = int(real.sum()), int(gap.sum()), int(p2p.sum()), \
        int(coll.sum())

    def col(*parts, dtype):
        return np.concatenate([np.asarray(p).reshape(-1) for p in parts]).astype(dtype)

    return EventTable(
        stage=col(np.repeat(np.arange(pp), K)[real], stage_of_gap, f_owner[p2p], f_wake[p2p],
                  f_owner[coll], dtype=np.int32),
        stream=col(np.full(n_comp + n_gap, _S_COMPUTE, np.int8),
                   np.where(to_next, _S_SEND_NEXT, _S_SEND_PREV).astype(np.int8),
                   np.where(to_next, _S_RECV_PREV, _S_RECV_NEXT).astype(np.int8),
                   np.full(n_coll, _S_DP, np.int8), dtype=np.int8),
        kind=col(comp_kind.reshape(-1)[real].astype(np.int8), np.full(n_gap, _K_IDLE, np.int8),
                 np.full(n_p2p, _K_SEND, np.int8), np.full(n_p2p, _K_RECV, np.int8),
                 coll_kind[coll].astype(np.int8), dtype=np.int8),
        microbatch=col(comp_mb.reshape(-1)[real], np.full(n_gap, -1), f_mb[p2p], f_mb[p2p],
                       f_mb[coll], dtype=np.int32),
        start_s=col(c_start.reshape(-1)[real], gap_s[gap], f_start[p2p], f_start[p2p],
                    f_start[coll], dtype=float),
        end_s=col(c_end.reshape(-1)[real], gap_e[gap], f_end[p2p], f_end[p2p], f_end[coll],
                  dtype=float),
        peer=col(comp_peer.reshape(-1)[real], np.full(n_gap, -1), f_wake[p2p], f_owner[p2p],
                 f_peer[coll], dtype=np.int32),
        count=col(np.zeros(n_comp + n_gap + 2 * n_p2p, np.int32), f_count[coll],
                  dtype=np.int32))


_KERNEL_NAMES = ("_heap_push", "_heap_pop", "_wake_stream", "_simulate_kernel",
                 "_exposed_kernel")
"""The kernels, callees before callers (the order `_Kernel` compiles them in)."""

_PY = _python_twins(*(globals()[name] for name in _KERNEL_NAMES))
"""Plain-Python twins of the kernels (use_numba=False)."""
