"""The event-level simulator (cost_models.simulator) fed by the planner's cost model, and the
re-ranking of the search's best strategies by it.

`simulation_inputs(model, strategy)` gives `simulate_iteration`'s keyword arguments for one
strategy on its placement and layer split, from the same cost terms as AMP eq. 5 and 4
(`CostModel.stage_costs`), so that a calibration applies to both:

- compute, per stage j and micro-batch, as three passes (`pass_times`): forward, backward and,
  with full recomputation, the recomputed forward, each the sum over the stage's layers of
  that pass's device time (`LayerTimer` forward / backward x the calibrated compute scale, the
  kernel floor once per block pass) plus that pass's tensor-parallel all-reduces (Megatron's
  f/g operators: 2 in a transformer block's forward, 2 in its backward, 2 more in its
  recomputed forward; with sequence parallelism all-gathers and reduce-scatters instead:
  `cost_models.layers.tp_collectives_by_pass` through `CostModel.tp_collectives`, the one table
  the cost model's totals come from too), on the stage's slowest device type for that layer
  (`CostModel.stage_pass_times_s`, the one `stage_costs` takes too).
  Where the host's time to issue a pass exceeds its device time, the pass takes the host's:
  the forward on its own, the backward and the recomputed forward together, each micro-batch
  starting in step with the host (`cost_models.compute.synced_overlapped_time_s`); the
  backward's excess is shared evenly by the backward and the recomputed forward, which run
  back to back. The calibrated per-micro-batch overhead is spread evenly over the passes.
  So forward + backward (+ recompute) equals the closed form's t_j exactly: the simulation
  differs from eq. 5 only by the schedule;
- P2P at boundary j: the activation of the stage's last layer x mbs, each way, on that
  boundary's link (the cost model's e_j = 2 (latency + bytes / bandwidth)), as the trials'
  framework (`TRIAL_FRAMEWORK`, DeepSpeed) moves it: blocking sends and receives in its
  TrainSchedule's instruction order (`cost_models.schedule`, p2p_mode "blocking"), the
  model the closed form's share of the steady state's P2P describes
  (`cost_models.pipeline.P2P_BLOCKING_SHARE[TRIAL_FRAMEWORK]`, which the planner uses);
- data parallelism: the stage's gradient bytes in DeepSpeed's buckets (5e8 elements), one
  ring collective each on the stage's slowest dp ring (all-reduce for ZeRO 0, with an
  all-gather of the weights under BF16_Optimizer; reduce-scatter + all-gather for ZeRO 1;
  reduce-scatter in every micro-batch's backward for ZeRO 2), after the backward (DeepSpeed's
  pipeline engine reduces at the accumulation boundary; overlap_comm is off in the trials'
  configs), or with training.overlap_grad_reduce during the last backward in the backend's
  buckets (megatron-core's max(4e7, 1e6 x dp x cp) parameters; `simulation_inputs`); the
  analytic `dp_overlap` coefficient is not applied, the schedule decides what overlaps;
- the optimizer step and the per-iteration overhead as in eq. 4.

- ZeRO 3 (pp = 1 only: DeepSpeed's pipeline engine rejects it, `search_space`'s
  zero_2_3_with_pipeline rule): each micro-batch runs layer by layer, each layer's
  parameters all-gathered over the dp ring before its forward and again before its
  backward, prefetched while the layer before computes, and its gradients reduce-scattered
  after its backward, overlapped with the rest of the backward (DeepSpeed's overlap_comm,
  on by default for stage 3: `comm.gradient_reduce_overlaps_backward`); per layer, the
  bytes `comm.data_parallel_sync_time_s(zero_stage=3)` charges for the stage (the
  parameters in the training precision, the gradients in DeepSpeed's reduce precision), so
  one iteration moves the closed form's volume, with one ring latency per layer and
  collective where the closed form has one per collective. The layer times are the stage's
  forward and backward (recomputation included) split in proportion to `pass_times`'
  per-layer device time. Two DeepSpeed defaults (runtime/zero/config.py, 0.19.8) this
  leaves out: it prefetches up to stage3_prefetch_bucket_size (5e7) elements ahead, where
  the simulator fetches one layer ahead (conservative for layers far smaller than that);
  and it keeps a parameter gathered between its forward and its backward when it is reused
  within stage3_max_reuse_distance (1e9 elements), so on models far below that size the
  backward's gathers may not happen; the simulator follows the closed form's (and the ZeRO
  paper's, Rajbhandari et al. 2020 section 7) 1.5x volume.

Each flow has its own link at the bandwidth the cost model gives it; the cost model already
divides a NIC among the flows that cross it at once (static sharing, amp_search.costing.links).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from cost_models import comm
from cost_models import memory as memory_model
from cost_models import pipeline
from cost_models.layers import tp_allreduce_elements_by_pass

from .records import Estimate, SimulationBreakdown, Strategy
from .search_space import Candidate

if TYPE_CHECKING:
    from cost_models.simulator import SimulatedIteration

    from .placement import DeviceOrder
    from .costing import CostModel, PlacedLayout, StageCosts
    from .spec import TrainingSpec

DEFAULT_SIMULATE_TOP = 32
"""Strategies of the exact DP's ranking that `plan` simulates and re-orders by default.
benchmarks/rerank_depth.py (2026-11-22): simulating every feasible strategy of the shipped
configs and of the 16x16 and 2048-GPU search-time clusters, the simulated best comes from
closed-form rank 3 at the deepest and the simulated top 10 from rank 18 at the deepest, so
32 covers the top 10 with a margin; benchmarks/search_time.py: re-ranking 32 costs about
0.1 s of CPU at 16x16 and 0.6 s at 2048 GPUs."""

SCHEDULE = "1f1b"
"""The schedule DeepSpeed's and Megatron-LM's pipeline engines run (non-interleaved 1F1B)."""

TRIAL_FRAMEWORK = "deepspeed"
"""The framework amp-search's own trials run (DeepSpeed's PipelineEngine), the default
training.backend; the closed form (`P2P_BLOCKING_SHARE[backend]`) and the simulator
(`p2p_mode_of(backend)`) model the P2P of the spec's backend."""


def p2p_mode_of(framework: str) -> str:
    """The schedule simulator's p2p_mode for a key of `cost_models.pipeline.P2P_BLOCKING_SHARE`
    ("deepspeed": "blocking", "megatron": "paired", "async": "async"); ValueError for
    another."""
    from cost_models.simulator import P2P_MODE_OF_FRAMEWORK

    if framework not in P2P_MODE_OF_FRAMEWORK:
        raise ValueError(f"framework {framework!r}: the simulator models the P2P of "
                         f"{', '.join(P2P_MODE_OF_FRAMEWORK)}")
    return P2P_MODE_OF_FRAMEWORK[framework]


P2P_MODE = p2p_mode_of(TRIAL_FRAMEWORK)
"""The simulator's P2P model of the trials' framework: "blocking"."""


tp_pass_elements = tp_allreduce_elements_by_pass
"""The tensor-parallel all-reduces of one micro-batch of a layer per pass (forward, backward,
recomputed forward): `cost_models.layers.tp_allreduce_elements_by_pass`."""


@dataclass(frozen=True)
class PassTimes:
    """One micro-batch on each pipeline stage, per pass (seconds, [pp] arrays)."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    recompute_s: np.ndarray | None
    """The recomputed forward before each backward (full recomputation), else None."""
    tensor_parallel_s: np.ndarray
    """The tensor-parallel all-reduces of all passes (included in the three above)."""
    layer_s: np.ndarray | None = None
    """[pp, 3, L]: each layer's share of the stage's forward, backward and recompute above
    (zero outside the stage's layers; each pass sums to the stage's), for ZeRO 3."""


def pass_times(model: "CostModel", c: Candidate, layout: "PlacedLayout", costs: "StageCosts",
               bounds) -> PassTimes:
    """Forward, backward and recomputation time of one micro-batch on each stage (the module
    docstring says how); they sum to the stage's t_j of AMP eq. 5 (`costs.layer_s` over its
    layers + the per-micro-batch overhead). With v*pp + 1 `bounds` (v > 1 model chunks per
    stage) the arrays are per chunk, [v*pp], chunk k on stage k mod pp, each with 1/v of the
    stage's per-micro-batch overhead."""
    L = model.num_layers
    ckpt = c.activation_checkpointing
    # per layer: [forward, backward, recompute] device time on each stage's slowest type
    device = np.zeros((c.pp, 3, L))
    cache: dict = {}
    for j in range(c.pp):
        types = layout.stage_gpus[j]
        if types not in cache:                  # the slowest type, as stage_costs takes
            cache[types] = model.stage_pass_times_s(types, c)
        device[j] = cache[types]

    tp = np.zeros((c.pp, 3, L))
    if c.layer_collectives:
        for k in range(3):      # the cost model's table of collectives, pass by pass
            tp[:, k, :] = model.tp_time_s(c, layout, part=k)

    work = device + tp                                       # [pp, 3, L]
    # host-bound parts: the forward's where its host time is longer; the rest shared evenly
    # by the backward and the recomputed forward, which run back to back (together they take
    # their host time or their device time, whichever is longer)
    forward_excess = np.maximum(costs.host_forward_s - work[:, 0, :], 0.0)
    excess = np.maximum(costs.layer_s - work.sum(axis=1) - forward_excess, 0.0)
    passes = 3 if ckpt else 2
    share = np.zeros(3)
    share[:passes] = 1.0 / passes
    rest = np.array([0.0, 1.0, 1.0 if ckpt else 0.0]) / (passes - 1)
    per_layer = work + excess[:, None, :] * rest[None, :, None]
    per_layer[:, 0, :] += forward_excess
    chunks = len(bounds) - 1
    if chunks != c.pp:          # interleaved: chunk k runs on stage k mod pp
        per_layer, tp = per_layer[np.arange(chunks) % c.pp], tp[np.arange(chunks) % c.pp]
    totals = np.stack([pipeline.stage_totals(per_layer[:, k, :], bounds) for k in range(3)])
    totals += costs.microbatch_overhead_s * share[:, None] * (c.pp / chunks)
    # each stage's (chunk's) pass totals spread over its layers in proportion to their time
    own = np.zeros((chunks, L), dtype=bool)
    for j in range(chunks):
        own[j, bounds[j]:bounds[j + 1]] = True
    mine = np.where(own[:, None, :], per_layer, 0.0)
    raw = mine.sum(axis=2)                                       # [chunks, 3]
    counts = own.sum(axis=1)[:, None, None]
    weights = np.where(raw[:, :, None] > 0, mine / np.where(raw > 0, raw, 1.0)[:, :, None],
                       own[:, None, :] / np.maximum(counts, 1))
    return PassTimes(forward_s=totals[0], backward_s=totals[1],
                     recompute_s=totals[2] if ckpt else None,
                     tensor_parallel_s=pipeline.stage_totals(tp.sum(axis=1), bounds),
                     layer_s=weights * totals.T[:, :, None])


def simulatable(s: Strategy, training: "TrainingSpec | None" = None) -> str | None:
    """None if `s` can be simulated (under the spec's `training`, where given), else why not
    (one phrase)."""
    if s.zero_stage == 3 and s.pp > 1:
        return "ZeRO 3 with pp > 1 is not simulated (DeepSpeed's pipeline engine rejects it)"
    if training is not None and s.virtual_stages > 1 and not training.overlap_p2p_comm:
        # the interleaved run sends asynchronously, as Megatron-LM's default overlap does
        return ("the interleaved schedule's blocking P2P (training.overlap_p2p_comm: false) "
                "is not simulated")
    return None


def simulation_inputs(model: "CostModel", strategy: Strategy, *, schedule: str = SCHEDULE,
                      overlap: bool | None = None, bucket_elements: int | None = None,
                      order: "DeviceOrder | None" = None, p2p_mode: str | None = None) -> dict:
    """The keyword arguments of `cost_models.simulator.simulate_iteration` for `strategy` (its
    partition and placement) under `model` (the module docstring says what each one is).
    overlap: reduce each gradient bucket during the backward; default the spec's
    (`CostModel.overlaps_grad_reduce`: training.overlap_grad_reduce, else the backend's
    default). bucket_elements: default, overlapped, the backend's bucket
    (`comm.gradient_bucket_elements`), else DeepSpeed's reduce_bucket_size (one collective
    per 5e8 elements after the backward); p2p_mode: default the P2P of the
    spec's training.backend (`p2p_mode_of`: DeepSpeed's blocking sends, `P2P_MODE`, or
    Megatron's paired ones); order: the DeviceOrder the placement came from, whose layout
    the model has cached (else the placement is costed again). Raises ValueError for a
    strategy that `simulatable` refuses."""
    why = simulatable(strategy, model.spec.training)
    if why is not None:
        raise ValueError(f"{strategy.label()}: {why}")
    overlap, bucket_elements = gradient_buckets(model, strategy, overlap, bucket_elements)
    if p2p_mode is None:
        p2p_mode = p2p_mode_of(model.spec.training.backend)
    s = strategy
    c = Candidate.of(s)
    layout = model.layout(c, order) if order is not None else None
    if layout is None or layout.placement_tuple != s.placement:
        layout = model.layout(c, placement=np.array(s.placement, dtype=np.int64))
    costs = model.stage_costs(c, layout)
    bounds = s.partition
    t = pass_times(model, c, layout, costs, bounds)
    if s.virtual_stages > 1:
        return _interleaved_inputs(model, s, layout, costs, t, bucket_elements, overlap)
    bpe = model.spec.training.bytes_per_element
    kw: dict = dict(forward_s=t.forward_s, backward_s=t.backward_s, recompute_s=t.recompute_s,
                    optimizer_s=pipeline.stage_totals(costs.optimizer_s, bounds), gas=s.gas,
                    schedule=schedule, step_overhead_s=costs.step_overhead_s,
                    p2p_mode=p2p_mode)
    if s.pp > 1:
        bw, crosses = layout.p2p_links
        # each tensor rank sends its part (comm.boundary_shards); each context-parallel rank
        # its s/cp tokens
        shard = model.boundary_shards(c) * s.cp
        latency = model.link_latencies_s("p2p", crosses, layout, boundaries=True)
        receiver, sender = model.boundary_gathers(c)
        if receiver or sender:
            # DeepSpeed's partitioned P2P: the all-gathers that rebuild the activation and
            # its gradient (one on the receiving stage, two on the sending one, per micro-
            # batch) wait with the transfers, half in each direction, as the closed form's
            # cut charges them
            gather = model.boundary_gather_s(c, layout)
            last = np.array([bounds[j + 1] - 1 for j in range(s.pp - 1)])
            latency = latency + (receiver * gather[np.arange(1, s.pp), last]
                                 + sender * gather[np.arange(s.pp - 1), last]) / 2
        kw.update(p2p_bytes=np.array([model.out_bytes[bounds[j + 1] - 1] * s.mbs / shard
                                      for j in range(s.pp - 1)]),
                  p2p_latency_s=latency,
                  p2p_bandwidth_bytes_per_s=np.asarray(bw, dtype=float))
    if model.is_megatron_fsdp(Candidate.of(s)):
        pass    # Megatron-FSDP: each layer's traffic is in its pass times (costs.layer_s)
    elif s.dp > 1 and s.zero_stage == 3:        # pp = 1: per-layer gathers, reduce-scatters
        bw, crosses = layout.dp_links
        params = model.params_per_layer(s.tmp).astype(float)
        grad_bpe = comm.gradient_reduce_bytes_per_element(
            model.spec.training.precision,
            fp32_allreduce=model.spec.training.grad_reduce_in_fp32)
        layer = t.layer_s[0]
        kw.update(dp=s.dp, dp_latency_s=model.link_latencies_s("all_reduce", crosses, layout),
                  dp_bandwidth_bytes_per_s=np.asarray(bw, dtype=float),
                  zero3_layer_forward_s=layer[0],
                  zero3_layer_backward_s=layer[1] + layer[2],
                  zero3_param_bytes=params * bpe, zero3_grad_bytes=params * grad_bpe)
    elif s.replicas > 1 and not model.spec.training.frozen_weights:
        # the gradients are reduced over dp x cp (LoRA's frozen weights have none)
        bw, crosses = layout.dp_links
        synced, bw = _dp_sync_params(model, Candidate.of(s), layout, bw, (
            lambda x: pipeline.stage_totals(x, bounds)))
        grad, gather = _dp_sync_bytes(model, s, synced * bpe)
        kw.update(dp=s.replicas, gradient_bytes=grad,
                  dp_latency_s=model.link_latencies_s("all_reduce", crosses, layout),
                  dp_bandwidth_bytes_per_s=bw,
                  bucket_bytes=float(bucket_elements) * (grad_element_bytes(model) if overlap
                                                         else bpe), overlap=overlap,
                  gradient_collective="all_reduce" if s.zero_stage == 0 else "reduce_scatter",
                  reduce_every_microbatch=s.zero_stage == 2,
                  gather_bytes_after_step=gather)
    return kw


def gradient_buckets(model: "CostModel", strategy: Strategy, overlap: bool | None = None,
                     bucket_elements: int | None = None) -> tuple[bool, int]:
    """(overlap, bucket elements) a simulation of `strategy` uses, each as given or by
    default: the spec's overlap (`CostModel.overlaps_grad_reduce`), and overlapped the
    backend's bucket (`comm.gradient_bucket_elements`), else DeepSpeed's reduce_bucket_size."""
    if overlap is None:
        overlap = model.overlaps_grad_reduce(Candidate.of(strategy))
    if bucket_elements is None:
        bucket_elements = comm.gradient_bucket_elements(
            model.spec.training.backend, strategy.replicas) if overlap \
            else comm.DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    return overlap, bucket_elements


def grad_element_bytes(model: "CostModel") -> int:
    """Bytes of one gradient element as the backend reduces it (comm.
    gradient_reduce_bytes_per_element: Megatron-LM's fp32 buffer with bf16): a bucket of N
    elements is N times this."""
    t = model.spec.training
    return comm.gradient_reduce_bytes_per_element(t.precision, framework=t.backend,
                                                  fp32_allreduce=t.grad_reduce_in_fp32)


def _dp_sync_params(model: "CostModel", c: Candidate, layout: "PlacedLayout", bw,
                    totals) -> tuple[np.ndarray, np.ndarray]:
    """(parameters synced, dp bandwidth) per stage (or device, as `totals` sums [pp, L]): the
    parameters of `CostModel.synced_params_per_layer`, at the dp ring's bandwidth slowed by
    the share of the sync that `CostModel.synced_params` prices on the slower expert rings,
    so that the buckets are cut from the gradients a rank holds (not from the priced
    equivalent, which would pay more ring latencies) and take the time the closed form's
    sync takes."""
    pp = layout.placement.shape[0]
    plain = totals(np.broadcast_to(model.synced_params_per_layer(c), (pp, model.num_layers)))
    priced = totals(model.synced_params(c, layout))
    scale = np.divide(plain, priced, out=np.ones_like(plain, dtype=float), where=priced > 0)
    return plain, np.asarray(bw, dtype=float) * scale


def _dp_sync_bytes(model: "CostModel", s: Strategy, weight_bytes: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray | None]:
    """(gradient bytes reduced, weight bytes all-gathered after the step or None) per stage or
    device, from the bytes of the weights it syncs in the training precision: Megatron-LM
    reduces its gradient buffer's dtype (fp32 with bf16) and only its distributed optimizer
    (zero_stage 1) all-gathers the updated weights; DeepSpeed reduces in the training
    precision and all-gathers after ZeRO 1 and 2 and under its BF16_Optimizer."""
    precision = model.spec.training.precision
    if model.spec.training.backend == "megatron":
        grad = weight_bytes * comm.gradient_reduce_bytes_per_element(
            precision, framework="megatron",
            fp32_allreduce=model.spec.training.grad_reduce_in_fp32) \
            / model.spec.training.bytes_per_element
        return grad, (weight_bytes if s.zero_stage == 1 else None)
    engine = memory_model.deepspeed_engine(zero_stage=s.zero_stage, precision=precision)
    gather = s.zero_stage in (1, 2) or engine == "bf16_optimizer"
    grad = weight_bytes if not model.spec.training.grad_reduce_in_fp32 else \
        weight_bytes * comm.gradient_reduce_bytes_per_element(precision, fp32_allreduce=True) \
        / model.spec.training.bytes_per_element
    return grad, (weight_bytes if gather else None)


def _interleaved_inputs(model: "CostModel", s: Strategy, layout: "PlacedLayout",
                        costs: "StageCosts", t: PassTimes, bucket_elements: int,
                        overlap: bool = False) -> dict:
    """`cost_models.simulator.simulate_interleaved`'s keyword arguments for v > 1 model chunks
    per stage: per chunk the passes of `pass_times` (recomputation folded into the backward),
    P2P over each of the v*pp - 1 chunk boundaries (the activation of the chunk's last layer)
    on the stage boundary's link (the wrap-around from the last stage to the first on the
    slowest of them: the cost arrays have no such link), async sends (the simulator does not
    pair Megatron's sends and receives), gradient buckets after the backward (`overlap`: each
    chunk's share during its last backward) in the bytes and with the weights' all-gather of
    the 1F1B path (`_dp_sync_bytes`)."""
    pp, v, bounds = s.pp, s.virtual_stages, s.partition
    c = Candidate.of(s)
    per_chunk = (lambda x: np.asarray(x, dtype=float).reshape(v, pp).T)   # noqa: E731
    back = t.backward_s + (0.0 if t.recompute_s is None else t.recompute_s)
    kw: dict = dict(forward_s=per_chunk(t.forward_s), backward_s=per_chunk(back),
                    optimizer_s=pipeline.chunk_device_totals(costs.optimizer_s, bounds, pp),
                    gas=s.gas, step_overhead_s=costs.step_overhead_s)
    bw, crosses = layout.p2p_links
    lat = np.asarray(model.link_latencies_s("p2p", crosses, layout, boundaries=True), float)
    bw = np.asarray(bw, dtype=float)
    shard = model.boundary_shards(c) * s.cp
    kw.update(p2p_bytes=np.array([model.out_bytes[bounds[k + 1] - 1] * s.mbs / shard
                                  for k in range(v * pp - 1)]),
              p2p_latency_s=np.array([lat[k % pp] if (k + 1) % pp else lat.max()
                                      for k in range(v * pp - 1)]),
              p2p_bandwidth_bytes_per_s=np.concatenate([bw, [bw.min()]]))
    if s.replicas > 1:
        bpe = model.spec.training.bytes_per_element
        dbw, dcross = layout.dp_links
        synced, dbw = _dp_sync_params(model, c, layout, dbw, (
            lambda x: pipeline.chunk_device_totals(x, bounds, pp)))
        grad, gather = _dp_sync_bytes(model, s, synced * bpe)
        kw.update(dp=s.replicas, gradient_bytes=grad,
                  dp_latency_s=model.link_latencies_s("all_reduce", dcross, layout),
                  dp_bandwidth_bytes_per_s=dbw,
                  bucket_bytes=float(bucket_elements) * (grad_element_bytes(model) if overlap
                                                         else bpe),
                  gradient_collective="all_reduce" if s.zero_stage == 0 else "reduce_scatter",
                  gather_bytes_after_step=gather, overlap=overlap)
    return kw


def breakdown_of(sim: "SimulatedIteration") -> SimulationBreakdown:
    """The simulated iteration's per-stage busy / idle / exposed-communication times and its
    critical path, as a record."""
    return SimulationBreakdown(
        schedule=sim.schedule, iteration_time_s=sim.iteration_time_s,
        busy_s=sim.busy_s, idle_s=sim.idle_s, exposed_comm_s=sim.exposed_comm_s,
        stage_end_s=sim.stage_end_s,
        critical_runs=sim.critical_path_segments())


def simulate(model: "CostModel", strategy: Strategy, *, order: "DeviceOrder | None" = None,
             **kw) -> "SimulatedIteration":
    """Simulate one iteration of `strategy` (keyword arguments: `simulation_inputs`'s)."""
    from cost_models.simulator import simulate_interleaved, simulate_iteration

    use_numba = kw.pop("use_numba", True)
    run = simulate_interleaved if strategy.virtual_stages > 1 else simulate_iteration
    return run(**simulation_inputs(model, strategy, order=order, **kw), use_numba=use_numba)


def with_simulation(model: "CostModel", e: Estimate, *, order: "DeviceOrder | None" = None,
                    use_numba: bool = True) -> Estimate:
    """`e` with its iteration time simulated (`time_source` "simulated", the closed form kept
    in `analytic_iteration_time_s`, the per-stage breakdown in `simulation`); unchanged, with
    the reason in `time_source`, where the strategy cannot be simulated."""
    if e.simulated:
        return e
    why = simulatable(e.strategy, model.spec.training)
    if why is not None:
        return replace(e, time_source=Estimate.analytic_because(why))
    sim = simulate(model, e.strategy, order=order, use_numba=use_numba)
    return replace(e, iteration_time_s=sim.iteration_time_s,
                   analytic_iteration_time_s=e.analytic_iteration_time_s, time_source="simulated",
                   simulation=breakdown_of(sim))


def rerank(model: "CostModel", ranked: list[Estimate], top: int, *, ranking_key,
           orders=(), use_numba: bool = True) -> list[Estimate]:
    """Simulate the first `top` of `ranked` (the exact DP's order) and re-order those by their
    simulated times (`ranking_key`: 4 significant digits, then lower peak memory); the rest
    keep their closed-form times and order, after them. orders: the DeviceOrders of the
    search, so that their cached layouts are reused."""
    if top <= 0 or not ranked:
        return ranked
    by_name = {o.name: o for o in orders}
    head = [with_simulation(model, e, order=by_name.get(e.strategy.placement_order),
                            use_numba=use_numba) for e in ranked[:top]]
    return sorted(head, key=ranking_key) + list(ranked[top:])
