"""`amp-search timeline`: simulate one iteration of a planned (or given) strategy with the
event-level simulator (cost_models.schedule) and draw it: a Chrome trace (Perfetto,
chrome://tracing) and a PNG Gantt chart.

The simulator's input comes from the same cost model as the plan (`simulation_inputs`):

- per stage j, t_j = the Estimate's stage_time_s (device compute or host time, tensor-parallel
  all-reduces, micro-batch overhead). APPROXIMATION: the cost model keeps only the sum, so
  t_j is split into forward and backward in the forward:backward ratio of the stage's layer
  times (LayerTimer: 1:2 for the analytic model, 1:1:2 forward:recompute:backward with full
  recomputation, a measured profile its own ratio), its fixed costs (kernel floor, host
  time, TP all-reduces, micro-batch overhead) in the same ratio. With recomputation the
  recomputed forward is shown as its own task before each backward;
- P2P at boundary j: the activation bytes leaving the stage's last layer x mbs over that
  boundary's link (bandwidth and latency as the cost model's cut term e_j = 2 (lat + v/b));
- data-parallel sync: the stage's gradient bytes (its parameters x bytes per element) in
  DeepSpeed's buckets (5e8 elements) over its slowest dp ring, all-reduce for ZeRO 0 (plus
  an all-gather of the weights under BF16_Optimizer), reduce-scatter + all-gather for ZeRO 1,
  per micro-batch for ZeRO 2; ZeRO 3 is not simulated yet;
- each flow has its own link at the bandwidth the cost model gives it, which already
  divides a NIC among the flows that cross it at once (static sharing, amp_search.topology);
  the simulator's dynamic sharing needs NIC-level link ids from the planner (issue 11);
- the optimizer step and the per-iteration overhead as in eq. 4.
"""
from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..spec import Spec, load_spec
from ._args import (add_profiles_argument, add_strategy_knobs, measurements_for,
                    positive_float, positive_int, render_table)
from .plan import announce, cold_start_note, stage_devices

if TYPE_CHECKING:
    from cost_models.schedule import SimulatedIteration

    from ..records import Estimate

# The parser is built for every amp-search command: numpy, numba and the simulator are
# imported only when `timeline` runs.
_BUCKET_ELEMENTS_DEFAULT = "DeepSpeed's reduce_bucket_size, 5e8"


def simulate_iteration(**kw) -> "SimulatedIteration":
    """cost_models.schedule.simulate_iteration, imported on first use."""
    from cost_models.schedule import simulate_iteration as simulate

    return simulate(**kw)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "timeline", help="simulate one iteration of a strategy and draw its timeline",
        description="Simulate one training iteration of a strategy, the plan's rank N or one "
                    "given by --pp --dp --tmp --mbs, event by event (1F1B or GPipe, P2P, "
                    "data-parallel buckets, optimizer step), print simulated against "
                    "analytic time and each stage's busy and idle time, and write a Chrome "
                    "trace and a PNG Gantt chart. Forward and backward times are the "
                    "stage's t_j split in the ratio of its layer times (an approximation).")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    p.add_argument("--rank", type=positive_int, metavar="N",
                   help="simulate the plan's N-th strategy (1: the best)")
    for name, what in (("pp", "pipeline stages"), ("dp", "data-parallel replicas"),
                       ("tmp", "tensor-parallel degree"), ("mbs", "micro-batch size")):
        p.add_argument(f"--{name}", type=positive_int, metavar="N",
                       help=f"{what} of a given strategy (with --pp --dp --tmp --mbs, "
                            f"instead of --rank)")
    add_strategy_knobs(p, zero_stages=(0, 1, 2), given="with a given strategy: ")
    p.add_argument("--schedule", default="1f1b", metavar="NAME",
                   help="pipeline schedule: 1f1b (default; DeepSpeed's and Megatron-LM's "
                        "non-interleaved 1F1B) or gpipe")
    p.add_argument("--overlap-comm", action="store_true",
                   help="reduce each gradient bucket as soon as it is complete, during the "
                        "backward (DeepSpeed's overlap_comm); default: after it")
    p.add_argument("--bucket-elements", type=positive_int, default=None, metavar="N",
                   help=f"gradient bucket size in elements (default "
                        f"{_BUCKET_ELEMENTS_DEFAULT})")
    p.add_argument("--trace", type=Path, metavar="FILE.json",
                   help="write a Chrome trace (open in ui.perfetto.dev or chrome://tracing)")
    p.add_argument("--png", type=Path, metavar="FILE.png",
                   help="write a Gantt chart (needs matplotlib)")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="with --rank: refuse a search estimated to take longer (default 120)")
    add_profiles_argument(p)
    p.set_defaults(func=run)


# ---------------------------------------------------------------------- simulator input

def simulation_inputs(spec: Spec, estimate: Estimate, *, measurements, schedule: str = "1f1b",
                      overlap: bool = False, bucket_elements: int | None = None,
                      model=None) -> dict:
    """The keyword arguments of `simulate_iteration` for `estimate` (its strategy, partition
    and placement) under the cost model of `spec` and `measurements` (the module docstring
    says what each one is and what is approximated); bucket_elements: default DeepSpeed's
    reduce_bucket_size; `model`: that CostModel, if already built. Raises UsageError for
    ZeRO 3."""
    import numpy as np

    from cost_models import memory as M
    from cost_models import pipeline as P
    from cost_models.schedule import DEEPSPEED_REDUCE_BUCKET_ELEMENTS

    from ..planner import CostModel
    from ..search_space import Candidate

    if bucket_elements is None:
        bucket_elements = DEEPSPEED_REDUCE_BUCKET_ELEMENTS

    s = estimate.strategy
    if s.zero_stage == 3:
        raise UsageError(f"timeline: {s.label()} uses ZeRO 3 (weights gathered in every "
                         f"micro-batch), which is not simulated yet; give a strategy with "
                         f"--zero-stage 0, 1 or 2")
    if model is None:
        model = CostModel(spec, measurements=measurements)
    c = Candidate(pp=s.pp, dp=s.dp, tmp=s.tmp, mbs=s.mbs, zero_stage=s.zero_stage,
                  activation_checkpointing=s.activation_checkpointing)
    layout = model.layout(c, placement=np.array(s.placement, dtype=np.int64))
    costs = model.stage_costs(c, layout)
    bounds = s.partition
    stage_time = P.stage_totals(costs.layer_s, bounds) + costs.microbatch_overhead_s
    ckpt = s.activation_checkpointing

    forward = np.empty(s.pp)
    for j in range(s.pp):      # forward share of t_j: the ratio of the stage's layer times
        a, b = bounds[j], bounds[j + 1]
        best_total, share = -1.0, 1.0 / (4.0 if ckpt else 3.0)
        for g in layout.stage_gpus[j]:
            lt = model.timer.times(model.gpus[g], s.tmp, s.mbs)
            f, bw = float(lt.forward_s[a:b].sum()), float(lt.backward_s[a:b].sum())
            total = f + bw + (f if ckpt else 0.0)
            if total > best_total and total > 0:   # the stage's slowest device type
                best_total, share = total, f / total
        forward[j] = share * stage_time[j]
    recompute = forward.copy() if ckpt else None
    backward = stage_time - forward - (recompute if ckpt else 0.0)

    bpe = spec.training.bytes_per_element
    kw: dict = dict(forward_s=forward, backward_s=backward, recompute_s=recompute,
                    optimizer_s=P.stage_totals(costs.optimizer_s, bounds), gas=s.gas,
                    schedule=schedule, step_overhead_s=costs.step_overhead_s)
    if s.pp > 1:
        bw, crosses = layout.p2p_links
        kw.update(p2p_bytes=np.array([model.out_bytes[bounds[j + 1] - 1] * s.mbs
                                      for j in range(s.pp - 1)]),
                  p2p_latency_s=np.array([model.latency("p2p", "inter" if x else "intra")
                                          for x in crosses]),
                  p2p_bandwidth_bytes_per_s=np.asarray(bw, dtype=float))
    if s.dp > 1:
        bw, crosses = layout.dp_links
        grad = P.stage_totals(model.params_per_layer(s.tmp)[None, :].repeat(s.pp, axis=0),
                              bounds) * bpe
        engine = M.deepspeed_engine(zero_stage=s.zero_stage, precision=spec.training.precision)
        gather = s.zero_stage in (1, 2) or engine == "bf16_optimizer"
        kw.update(dp=s.dp, gradient_bytes=grad,
                  dp_latency_s=np.array([model.latency("all_reduce", "inter" if x else "intra")
                                         for x in crosses]),
                  dp_bandwidth_bytes_per_s=np.asarray(bw, dtype=float),
                  bucket_bytes=float(bucket_elements) * bpe, overlap=overlap,
                  gradient_collective="all_reduce" if s.zero_stage == 0 else "reduce_scatter",
                  reduce_every_microbatch=s.zero_stage == 2,
                  gather_bytes_after_step=grad if gather else None)
    return kw


def stage_names(spec: Spec, estimate: Estimate) -> list[str]:
    """'stage j: layers a-b on <devices>' for each stage."""
    s = estimate.strategy
    out = []
    for j in range(s.pp):
        a, b = s.partition[j], s.partition[j + 1] - 1
        layers = f"layers {a}-{b}" if b > a else f"layer {a}"
        out.append(f"stage {j}: {layers} on {stage_devices(spec, s.placement[j])}")
    return out


# ---------------------------------------------------------------------- the command

def _chosen(spec: Spec, args, measurements) -> tuple[Estimate, str]:
    from ..planner import estimate, plan

    given = {n: getattr(args, n) for n in ("pp", "dp", "tmp", "mbs")}
    if args.rank is not None:
        if any(v is not None for v in given.values()):
            raise UsageError("--rank and --pp/--dp/--tmp/--mbs exclude each other: give "
                             "the plan's rank or a strategy")
        result = plan(spec, measurements=measurements, max_search_s=args.max_search_seconds,
                      on_start=announce)
        if args.rank > len(result.strategies):
            raise UsageError(f"--rank {args.rank}: the plan has {len(result.strategies)} "
                             f"feasible strategies")
        return result.strategies[args.rank - 1], f"rank {args.rank} of the plan"
    missing = [f"--{n}" for n, v in given.items() if v is None]
    if missing:
        raise UsageError(f"give --rank N, or a strategy with --pp --dp --tmp --mbs "
                         f"(missing: {' '.join(missing)})")
    if args.partition == "optimal":
        cold_start_note()
    ckpt = None if args.activation_checkpointing is None else \
        args.activation_checkpointing == "full"
    e = estimate(spec, **given, partition=args.partition, zero_stage=args.zero_stage,
                 activation_checkpointing=ckpt, placement_order=args.placement_order,
                 measurements=measurements)
    return e, "given strategy"


def _format(sim: SimulatedIteration, e: Estimate, names: list[str], kw: dict) -> list[str]:
    import numpy as np

    analytic = e.iteration_time_s
    diff = (sim.iteration_time_s - analytic) / analytic * 100 if analytic > 0 else 0.0
    lines = [f"iteration: simulated {sim.iteration_time_s:.4g} s, analytic (AMP eq. 5 + 4) "
             f"{analytic:.4g} s ({diff:+.1f}%)", ""]
    head = ("stage", "fwd ms", "bwd ms", "busy s", "idle s", "exposed comm s", "ends at s")
    rows = []
    bwd = np.asarray(kw["backward_s"]) + (0.0 if kw.get("recompute_s") is None
                                          else np.asarray(kw["recompute_s"]))
    for j in range(sim.pp):
        rows.append((names[j], f"{kw['forward_s'][j] * 1e3:.4g}", f"{bwd[j] * 1e3:.4g}",
                     f"{sim.busy_s[j]:.4g}", f"{sim.idle_s[j]:.4g}",
                     f"{sim.exposed_comm_s[j]:.4g}", f"{sim.stage_end_s[j]:.4g}"))
    lines.append(render_table(head, rows, left=(0,)))
    kinds = Counter(sim.critical_path_kinds)
    lines.append("")
    lines.append(f"critical path: {len(sim.critical_path)} tasks ("
                 + ", ".join(f"{n} {k}" for k, n in kinds.most_common()) + ")")
    return lines


def run(args) -> int:
    from cost_models.schedule import DEEPSPEED_REDUCE_BUCKET_ELEMENTS, SCHEDULES

    from ..planner import CostModel
    from ..timeline import write_chrome_trace, write_gantt_png

    if args.schedule not in SCHEDULES:
        raise UsageError(f"--schedule {args.schedule}: accepted: {', '.join(SCHEDULES)}")
    if args.bucket_elements is None:
        args.bucket_elements = DEEPSPEED_REDUCE_BUCKET_ELEMENTS
    spec = load_spec(args.spec)
    measurements = measurements_for(spec, args)
    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--png needs matplotlib: pip install matplotlib")
    e, where = _chosen(spec, args, measurements)
    model = CostModel(spec, measurements=measurements)
    kw = simulation_inputs(spec, e, measurements=measurements, schedule=args.schedule,
                           overlap=args.overlap_comm, bucket_elements=args.bucket_elements,
                           model=model)
    sim = simulate_iteration(**kw)
    names = stage_names(spec, e)
    s = e.strategy
    sync = "overlapped with the backward" if args.overlap_comm else "after the backward"
    print(f"{s.label()} ({where}): {args.schedule}, gas {s.gas}"
          + (f", gradient buckets of {args.bucket_elements:.3g} elements {sync}"
             if s.dp > 1 else ""))
    print("\n".join(_format(sim, e, names, kw)))
    print("forward/backward: each stage's t_j split in the ratio of its layer times "
          "(an approximation: the cost model keeps only their sum).")
    hidden = model.params.dp_overlap
    if s.dp > 1 and hidden > 0:
        print(f"note: the analytic time hides {hidden:.0%} of the data-parallel sync "
              f"(the calibration's dp_overlap); the simulation hides what the schedule "
              f"overlaps{'' if args.overlap_comm else ' (nothing without --overlap-comm)'}.")
    title = f"{s.label()}, {args.schedule}, gas {s.gas}"
    for path, what, write in (
            (args.trace, "Chrome trace", lambda p: write_chrome_trace(sim, p,
                                                                      stage_names=names)),
            (args.png, "Gantt chart", lambda p: write_gantt_png(sim, p, title=title,
                                                                stage_names=names))):
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"wrote {what} {path}")
    return 0

