"""An event-level simulator of one training iteration of a pipeline.

AMP's eq. 5 and 4 (`cost_models.pipeline`) are a closed form; this module plays the schedule
out instead, as Proteus's HTAE and dPRO's replayer do: every micro-batch's forward and backward
on every stage, the P2P transfers between stages, the data-parallel gradient buckets and the
optimizer step become tasks on streams, and a discrete-event loop over task completions gives
each task's start and end. A pure function of numbers: it imports nothing from `amp_search`.

`simulate_iteration` and `simulate_interleaved` take the orders of `cost_models.schedule`,
build the event loop's arrays (`cost_models.simulator_inputs`, where the link model is), run
the loop (`cost_models.simulator_kernels`) and return a `SimulatedIteration`.

What is simulated (one pipeline replica; the other dp replicas run the same timeline)
-------------------------------------------------------------------------------------
- Streams. Each stage has one compute stream (forward, recompute, backward, optimizer, in the
  schedule's fixed order) and three communication streams, each first-in first-out:
  ``send_next`` (activations to stage j+1), ``send_prev`` (gradients to stage j-1) and ``dp``
  (gradient buckets, then the optional weight all-gather). A transfer also appears on the
  receiving stage as a ``recv`` event (streams ``recv_prev`` / ``recv_next``) with the same
  times. Proteus separates feature and gradient communication queues the same way.
- Schedules: "1f1b" (DeepSpeed's / Megatron-LM's non-interleaved 1F1B) or "gpipe", each
  stage's compute stream in the order of `cost_models.schedule.schedule_order`.
- Dependencies. A forward of micro-batch m on stage j > 0 starts only once the activation of m
  from stage j-1 has arrived; a backward (or its separate recompute) of m on stage j < pp-1
  only once the gradient of m from stage j+1 has arrived.
- P2P modes (``p2p_mode``). "async": sends that never block, as free-running NCCL streams
  would be: a transfer is queued on the sender's stream when the producing task ends and the
  sender goes on computing; only the receiver waits. "blocking": DeepSpeed's PipelineEngine,
  whose SendActivation, RecvActivation, SendGrad and RecvGrad instructions are separate
  blocking ``dist.send`` / ``dist.recv`` calls (deepspeed runtime/pipe/engine.py, p2p.py):
  each stage runs its `TrainSchedule` instructions in order
  (`cost_models.schedule.deepspeed_train_order`), a send or receive holds the stage's compute
  stream from the moment it is issued, a send/receive pair is a rendezvous (the transfer
  starts when both stages have issued their call, and both compute streams stay blocked until
  it ends), and ZeRO 0/1's gradient reduction (ReduceGrads) comes after the stage's last
  instruction. GPipe, which DeepSpeed does not run, gets the plain blocking order
  (`cost_models.schedule.blocking_order`). "paired": Megatron-LM's non-interleaved 1F1B
  (`cost_models.schedule.megatron_order`), the same rendezvous, but its steady state's
  send_forward_recv_backward and send_backward_recv_forward post a send and a receive of one
  boundary together (`batch_isend_irecv`) and wait for both: the two transfers run at once,
  one each way.
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

The event loop is a numba kernel, O(E log E) in the E = O(pp * gas) tasks; ``use_numba=False``
runs the very same code as plain Python (`cost_models.simulator_kernels`).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from .comm import DEEPSPEED_REDUCE_BUCKET_ELEMENTS
from .schedule import BACKWARD, FORWARD, IDLE, RECOMPUTE, RECV, SEND, interleaved_order
from .simulator_inputs import (FlowColumns, Flows, LinksAndRoutes, Route, add_data_parallel_flows,
                               add_p2p_flows, add_zero3_flows, apply_zero3_ops, compute_ops,
                               compute_stream_order, interleaved_inputs, nonnegative_floats,
                               zero3_inputs, zero3_order)
from .simulator_kernels import FLOW_GATHER, FLOW_P2P, FLOW_PREFETCH, pick

GRADIENT_COLLECTIVES = ("all_reduce", "reduce_scatter")


STREAMS = ("compute", "send_next", "send_prev", "recv_prev", "recv_next", "dp")
"""Event streams: compute; activations sent to stage j+1; gradients sent to stage j-1;
activations received from j-1; gradients received from j+1; data-parallel collectives."""

KINDS = ("forward", "recompute", "backward", "optimizer", "send", "recv", "allreduce",
         "reduce_scatter", "allgather", "idle")
"""Event kinds; an order's task kinds (`cost_models.schedule`'s FORWARD .. IDLE) index it."""
assert [KINDS[k] for k in (FORWARD, RECOMPUTE, BACKWARD, SEND, RECV, IDLE)] == \
    ["forward", "recompute", "backward", "send", "recv", "idle"]

_OPTIMIZER = KINDS.index("optimizer")
_K_COLLECTIVE = {"all_reduce": 6, "reduce_scatter": 7, "all_gather": 8}
_S_COMPUTE, _S_SEND_NEXT, _S_SEND_PREV, _S_RECV_PREV, _S_RECV_NEXT, _S_DP = range(6)

P2P_MODES = ("async", "blocking", "paired")
"""How P2P transfers meet the compute streams (`simulate_iteration`'s p2p_mode): "async",
free-running sends on their own streams; "blocking", DeepSpeed's separate blocking send and
receive calls in its TrainSchedule's instruction order
(`cost_models.schedule.deepspeed_train_order`); "paired", Megatron-LM's 1F1B, whose steady
state posts a send and a receive together and waits for both
(`cost_models.schedule.megatron_order`)."""

P2P_MODE_OF_FRAMEWORK = {"deepspeed": "blocking", "megatron": "paired", "async": "async"}
"""The p2p_mode for each key of `cost_models.pipeline.P2P_BLOCKING_SHARE`."""


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
    if kind in (FORWARD, RECOMPUTE, BACKWARD):
        return f"stage {stage} {name} mb {mb}"
    if kind in (SEND, RECV):
        what = "activation" if (peer > stage) == (kind == SEND) else "gradient"
        src, dst = (stage, peer) if kind == SEND else (peer, stage)
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
                           (SEND if p["f_kind"][t - base] == FLOW_P2P
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
        tasks = np.asarray(self.critical_path_tasks, dtype=np.int64)
        comp = tasks < base
        c, f = np.where(comp, tasks, 0), np.where(comp, 0, tasks - base)
        if not p["f_owner"].size:           # no flows: every task computes
            f_owner = f_kind = f_start = f_end = coll = np.zeros(1)
        else:
            f_owner, f_kind, f_start, f_end, coll = (p["f_owner"], p["f_kind"], p["f_start"],
                                                     p["f_end"], p["coll_kind"])
        if not tasks.size:
            return ()
        stages = np.where(comp, c // K, f_owner[f]).astype(np.int64)
        kinds = np.where(comp, comp_kind.ravel()[c],
                         np.where(f_kind[f] == FLOW_P2P, SEND, coll[f])).astype(np.int64)
        starts = np.where(comp, p["c_start"].ravel()[c], f_start[f]).astype(float)
        ends = np.where(comp, p["c_end"].ravel()[c], f_end[f]).astype(float)
        # each task counts what it adds past the latest end before it (0.0 at first)
        before = np.concatenate([[0.0], np.maximum.accumulate(np.maximum(ends, 0.0))[:-1]])
        counted = np.maximum(ends - np.maximum(starts, before), 0.0)
        # runs: consecutive tasks of one stage and kind
        first = np.flatnonzero(np.concatenate(
            [[True], (stages[1:] != stages[:-1]) | (kinds[1:] != kinds[:-1])]))
        tasks_in = np.diff(np.append(first, tasks.size))
        run_end = np.maximum.reduceat(ends, first)
        run_time = np.add.reduceat(counted, first)
        return tuple((j, KINDS[k], n, s, e, dt) for j, k, n, s, e, dt in zip(
            stages[first].tolist(), kinds[first].tolist(), tasks_in.tolist(),
            starts[first].tolist(), run_end.tolist(), run_time.tolist()))

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


# ----------------------------------------------------------------------------- simulate

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

    Cost: O(E log E) for E = O(pp * gas) events (`cost_models.simulator_kernels`)."""
    fwd = np.asarray(forward_s, dtype=float).reshape(-1)
    pp = fwd.shape[0]
    if pp < 1:
        raise ValueError("forward_s needs at least one stage")
    fwd = nonnegative_floats("forward_s", fwd, pp)
    bwd = nonnegative_floats("backward_s", backward_s, pp)
    opt = nonnegative_floats("optimizer_s", optimizer_s, pp)
    rec = None if recompute_s is None else nonnegative_floats("recompute_s", recompute_s, pp)
    _check_counts(gas, dp)
    gas, dp = int(gas), int(dp)
    _check_dp_sync(gradient_collective, bucket_bytes)
    if not (math.isfinite(step_overhead_s) and step_overhead_s >= 0):
        raise ValueError(f"step_overhead_s must be finite and >= 0, got {step_overhead_s}")
    if p2p_mode not in P2P_MODES:
        raise ValueError(f"p2p_mode {p2p_mode!r}; known: {', '.join(P2P_MODES)}")

    blocking, kinds, micro, xfer, peer = compute_stream_order(
        schedule, p2p_mode, pp, gas, recompute=rec is not None)
    z3 = zero3_inputs(zero3_layer_forward_s, zero3_layer_backward_s, zero3_param_bytes,
                      zero3_grad_bytes, fwd=fwd, bwd=bwd, rec=rec, pp=pp, dp=dp,
                      other=(gradient_bytes, gather_bytes_after_step, reduce_every_microbatch))
    if z3 is not None:
        kinds, micro, z3_layer = zero3_order(gas, z3[0].shape[0])
    lk = LinksAndRoutes(links or {})

    # ---- flows: P2P activations, P2P gradients, then each stage's buckets and gather
    columns = FlowColumns()
    add_p2p_flows(columns, lk, pp=pp, gas=gas, p2p_bytes=p2p_bytes, latency_s=p2p_latency_s,
                  bandwidth=p2p_bandwidth_bytes_per_s, routes=p2p_routes,
                  grad_routes=p2p_grad_routes)
    dpf = add_data_parallel_flows(
        columns, lk, pp=pp, gas=gas, dp=dp, gradient_bytes=gradient_bytes,
        gather_bytes_after_step=gather_bytes_after_step, latency_s=dp_latency_s,
        bandwidth=dp_bandwidth_bytes_per_s, routes=dp_routes, bucket_bytes=bucket_bytes,
        gradient_collective=gradient_collective,
        reduce_every_microbatch=reduce_every_microbatch)
    if z3 is not None:      # per-layer gathers (stream 0, free at pp = 1), reduce-scatters
        z3_gather0, z3_reduce0, n_reduce = add_zero3_flows(
            columns, lk, z3, z3_layer, kinds, micro, dp=dp, latency_s=dpf.latency_s[0],
            route=dpf.routes[0])
        dpf.buckets[0] = n_reduce        # the optimizer step waits for every reduce-scatter
    flows = columns.flows()
    s_ptr, s_flow = flows.stream_queues(3 * pp)

    # ---- compute ops: durations, dependencies, outputs, bucket emissions
    ops = compute_ops(kinds, micro, fwd=fwd, bwd=bwd, rec=rec, opt=opt, gas=gas,
                      blocking=blocking, xfer=xfer, dp=dp, dp_flows=dpf, overlap=overlap)
    if z3 is not None:
        apply_zero3_ops(ops, kinds, z3, z3_layer, z3_gather0, z3_reduce0)
        overlap = True

    f_lptr, f_link, f_mult, link_bw, slot_ptr, alone = lk.kernel_arrays(len(flows))
    if time_ordered is None:
        time_ordered = bool(np.any(alone == 0.0))
    event_loop = pick("event_loop", use_numba)
    c_start, c_end, f_start, f_end, st_end, path, complete = event_loop(
        pp, ops.dur, ops.dep, ops.out, ops.emit, bool(overlap), dpf.nb, dpf.bptr, dpf.buckets,
        flows.stream, flows.wake, flows.kind, flows.latency_s, flows.wire_bytes, alone,
        flows.bucket_frac, f_lptr, f_link, f_mult, s_ptr, s_flow, link_bw, slot_ptr,
        bool(time_ordered), ops.xfer, bool(blocking), ops.pre)
    if not complete:        # cannot happen for the schedules above; an invariant
        raise RuntimeError("the schedule simulation deadlocked")
    return _summarise(
        schedule=schedule, pp=pp, gas=gas, kinds=kinds, micro=micro,
        peer=np.full(kinds.shape, -1, dtype=np.int64) if peer is None else peer,
        c_start=c_start, c_end=c_end, f_start=f_start, f_end=f_end, path=path, flows=flows,
        st_end=st_end,
        collective="reduce_scatter" if z3 is not None else gradient_collective,
        step_overhead_s=float(step_overhead_s), use_numba=use_numba, s_ptr=s_ptr,
        s_flow=s_flow)


def _check_counts(gas, dp) -> None:
    """ValueError unless gas and dp are positive integers."""
    if isinstance(gas, bool) or not isinstance(gas, (int, np.integer)) or gas < 1:
        raise ValueError(f"gas must be a positive integer, got {gas!r}")
    if isinstance(dp, bool) or not isinstance(dp, (int, np.integer)) or dp < 1:
        raise ValueError(f"dp must be a positive integer, got {dp!r}")


def _check_dp_sync(gradient_collective: str, bucket_bytes: float) -> None:
    """ValueError for an unknown gradient collective or a bucket size that is not > 0."""
    if gradient_collective not in GRADIENT_COLLECTIVES:
        raise ValueError(f"gradient_collective {gradient_collective!r}; known: "
                         f"{', '.join(GRADIENT_COLLECTIVES)}")
    if not (bucket_bytes > 0 and math.isfinite(bucket_bytes)):
        raise ValueError(f"bucket_bytes must be finite and > 0, got {bucket_bytes}")


def simulate_interleaved(*, forward_s, backward_s, optimizer_s, gas: int,
                         p2p_bytes=None, p2p_latency_s=None, p2p_bandwidth_bytes_per_s=None,
                         dp: int = 1, gradient_bytes=None, dp_latency_s=None,
                         dp_bandwidth_bytes_per_s=None,
                         bucket_bytes: float = deepspeed_bucket_bytes(2),
                         gradient_collective: str = "all_reduce",
                         gather_bytes_after_step=None, overlap: bool = False,
                         step_overhead_s: float = 0.0,
                         use_numba: bool = True) -> SimulatedIteration:
    """Simulate one iteration of Megatron-LM's interleaved 1F1B schedule
    (`cost_models.schedule.interleaved_order`) with v = forward_s.shape[1] model chunks per
    device, on `simulate_iteration`'s event loop.

    forward_s[j, c], backward_s[j, c] (pp x v): one micro-batch of chunk c of device j, that
    is virtual stage c pp + j (recomputation folded into the backward); optimizer_s[j] once.
    P2P: p2p_bytes[b] and p2p_latency_s[b] for each of the v pp - 1 virtual boundaries b
    (virtual stage b to b+1, from device b mod pp to (b+1) mod pp), the gradient the same size
    back; p2p_bandwidth_bytes_per_s[j] (pp values) the link from device j to device j+1, the
    last one the wrap-around from device pp-1 to device 0 (each direction a private link).
    Omitted p2p_bytes: free transfers. Sends are "async" (free-running, the receiver waits):
    Megatron's paired sends and receives of the interleaved schedule are not modelled.
    Data parallelism (dp > 1): gradient_bytes[j] in buckets after the device's last backward
    (with `overlap`, Megatron-LM's --overlap-grad-reduce: each chunk's 1/v of them during
    that chunk's last backward, the buckets spread over it as `simulate_iteration` spreads
    them), on a private link of dp_bandwidth_bytes_per_s[j], then the optimizer step,
    then gather_bytes_after_step[j] (the distributed optimizer's all-gather of the updated
    weights; none where omitted) on the same link, as `simulate_iteration` has them.

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
    opt = nonnegative_floats("optimizer_s", optimizer_s, pp)
    _check_counts(gas, dp)
    gas = int(gas)
    _check_dp_sync(gradient_collective, bucket_bytes)
    kinds, micro, chunk = interleaved_order(pp, v, gas)
    flows, ops, dpf, lk = interleaved_inputs(
        kinds, micro, chunk, fwd=fwd, bwd=bwd, opt=opt, gas=gas, p2p_bytes=p2p_bytes,
        p2p_latency_s=p2p_latency_s, p2p_bandwidth_bytes_per_s=p2p_bandwidth_bytes_per_s,
        dp=dp, gradient_bytes=gradient_bytes, dp_latency_s=dp_latency_s,
        dp_bandwidth_bytes_per_s=dp_bandwidth_bytes_per_s, bucket_bytes=bucket_bytes,
        gradient_collective=gradient_collective, gather_bytes_after_step=gather_bytes_after_step,
        overlap=overlap)
    s_ptr, s_flow = flows.stream_queues(3 * pp)
    f_lptr, f_link, f_mult, link_bw, slot_ptr, alone = lk.kernel_arrays(len(flows))
    event_loop = pick("event_loop", use_numba)
    c_start, c_end, f_start, f_end, st_end, path, complete = event_loop(
        pp, ops.dur, ops.dep, ops.out, ops.emit, bool(overlap), dpf.nb, dpf.bptr, dpf.buckets,
        flows.stream, flows.wake, flows.kind, flows.latency_s, flows.wire_bytes, alone,
        flows.bucket_frac, f_lptr, f_link, f_mult, s_ptr, s_flow, link_bw, slot_ptr, False,
        ops.xfer, False, ops.pre)
    if not complete:        # an invariant of the order above
        raise RuntimeError("the interleaved schedule simulation deadlocked")
    return _summarise(
        schedule=f"interleaved-1f1b-v{v}", pp=pp, gas=gas, kinds=kinds, micro=micro,
        peer=np.full(kinds.shape, -1, dtype=np.int64), c_start=c_start, c_end=c_end,
        f_start=f_start, f_end=f_end, path=path, flows=flows, st_end=st_end,
        collective=gradient_collective, step_overhead_s=float(step_overhead_s),
        use_numba=use_numba, s_ptr=s_ptr, s_flow=s_flow)

# ----------------------------------------------------------------------------- summary

def _summarise(*, schedule, pp, gas, kinds, micro, peer, c_start, c_end, f_start, f_end,
               path, flows: Flows, st_end, collective, step_overhead_s, use_numba, s_ptr,
               s_flow) -> SimulatedIteration:
    """The `SimulatedIteration` of the event loop's outputs."""
    f_kind = flows.kind
    makespan = float(st_end.max())
    comp_kind = np.concatenate([kinds, np.full((pp, 1), _OPTIMIZER)], axis=1)
    comp_mb = np.concatenate([micro, np.full((pp, 1), -1)], axis=1)
    comp_peer = np.concatenate([peer, np.full((pp, 1), -1)], axis=1)
    computing = comp_kind <= _OPTIMIZER      # not a blocking send / receive, not a no-op
    compute_end = np.where(computing, c_end, c_start)
    busy = (compute_end - c_start).sum(axis=1)
    coll_kind = np.where((f_kind == FLOW_GATHER) | (f_kind == FLOW_PREFETCH),
                         _K_COLLECTIVE["all_gather"],
                         _K_COLLECTIVE[collective])
    if not computing.all():                  # the no-ops that pad short stages: not a task
        path = path[(path >= pp * comp_kind.shape[1]) |
                    (comp_kind.reshape(-1)[np.minimum(path, comp_kind.size - 1)] != IDLE)]

    # exposed communication per stage: its flows (sent, received, dp) outside its compute
    # (a blocking send or receive holds the compute stream without computing: exposed)
    exposed_comm_time = pick("exposed_comm_time", use_numba)
    exposed = exposed_comm_time(c_start, compute_end, f_start, f_end, s_ptr, s_flow)

    parts = dict(pp=pp, makespan=makespan, comp_kind=comp_kind, comp_mb=comp_mb,
                 comp_peer=comp_peer,
                 c_start=c_start, c_end=c_end, f_start=f_start, f_end=f_end,
                 f_stream=flows.stream, f_owner=flows.owner, f_wake=flows.wake, f_kind=f_kind,
                 f_mb=flows.microbatch, f_peer=flows.peer, f_count=flows.count,
                 coll_kind=coll_kind)
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
    if p["f_kind"][f] == FLOW_P2P:
        return _label(int(p["f_owner"][f]), SEND, int(p["f_mb"][f]), int(p["f_wake"][f]), 0)
    return _label(int(p["f_owner"][f]), int(p["coll_kind"][f]), int(p["f_mb"][f]),
                  int(p["f_peer"][f]), int(p["f_count"][f]))


def _event_table(*, pp, makespan, comp_kind, comp_mb, comp_peer, c_start, c_end, f_start,
                 f_end, f_stream, f_owner, f_wake, f_kind, f_mb, f_peer, f_count, coll_kind
                 ) -> EventTable:
    """Columns of every event: compute tasks (blocking sends and receives among them, the
    padding no-ops left out), idle gaps, sends, receives, collectives."""
    K = c_start.shape[1]
    real = (comp_kind != IDLE).reshape(-1)
    gap_s = np.concatenate([np.zeros((pp, 1)), c_end], axis=1)
    gap_e = np.concatenate([c_start, np.full((pp, 1), makespan)], axis=1)
    gap = gap_e > gap_s
    stage_of_gap = np.broadcast_to(np.arange(pp)[:, None], gap.shape)[gap]
    p2p = f_kind == FLOW_P2P
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
        kind=col(comp_kind.reshape(-1)[real].astype(np.int8), np.full(n_gap, IDLE, np.int8),
                 np.full(n_p2p, SEND, np.int8), np.full(n_p2p, RECV, np.int8),
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
