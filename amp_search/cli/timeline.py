"""`amp-search timeline`: simulate one iteration of a planned (or given) strategy with the
event-level simulator (cost_models.simulator) and draw it: a Chrome trace (Perfetto,
chrome://tracing) and a PNG Gantt chart.

The simulator's input comes from the same cost model as the plan
(`amp_search.simulate.simulation_inputs`, whose docstring says what each term is): the cost
model's forward, backward and recomputation time of each stage, its P2P, data-parallel
buckets (ZeRO 0-2; ZeRO 3 at pp 1, layer by layer), optimizer step and per-iteration overhead.
"""
from __future__ import annotations

import argparse
import importlib.util
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..spec import Spec, load_spec
from ._args import (add_profiles_argument, add_strategy_choice, add_strategy_knobs,
                    measurements_for, positive_float, positive_int, render_table)
from .plan import chosen_strategy, stage_devices

if TYPE_CHECKING:
    from cost_models.simulator import SimulatedIteration

    from ..records import Estimate

# The parser is built for every amp-search command: numpy, numba and the simulator are
# imported only when `timeline` runs.
_BUCKET_ELEMENTS_DEFAULT = ("overlapped, the backend's bucket (DeepSpeed's reduce_bucket_size "
                            "5e8, Megatron-LM's max(4e7, 1e6 x dp x cp)); else 5e8")


def simulate_iteration(**kw) -> "SimulatedIteration":
    """cost_models.simulator.simulate_iteration, imported on first use."""
    from cost_models.simulator import simulate_iteration as simulate

    return simulate(**kw)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "timeline", help="simulate one iteration of a strategy and draw its timeline",
        description="Simulate one training iteration of a strategy, the plan's rank N or one "
                    "given by --pp --dp --tmp --mbs, event by event (1F1B or GPipe, P2P, "
                    "data-parallel buckets, optimizer step), print simulated against "
                    "analytic time and each stage's busy and idle time, and write a Chrome "
                    "trace and a PNG Gantt chart (by default SPEC-timeline.json and "
                    "SPEC-timeline.png in the current folder; --no-files: neither).")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    add_strategy_choice(p, rank_help="simulate the plan's N-th strategy (1: the best)")
    add_strategy_knobs(p, zero_stages=(0, 1, 2), given="with a given strategy: ",
                       sequence_knobs=True)
    p.add_argument("--schedule", default="1f1b", metavar="NAME",
                   help="pipeline schedule: 1f1b (default; DeepSpeed's and Megatron-LM's "
                        "non-interleaved 1F1B) or gpipe")
    p.add_argument("--overlap-comm", action=argparse.BooleanOptionalAction, default=None,
                   help="reduce each gradient bucket as soon as it is complete, during the "
                        "backward (DeepSpeed's overlap_comm, Megatron-LM's "
                        "--overlap-grad-reduce), or after it; default: as the spec's "
                        "training.overlap_grad_reduce says (absent: the backend's default)")
    p.add_argument("--bucket-elements", type=positive_int, default=None, metavar="N",
                   help=f"gradient bucket size in elements (default "
                        f"{_BUCKET_ELEMENTS_DEFAULT})")
    p.add_argument("--trace", type=Path, metavar="FILE.json",
                   help="write the Chrome trace here (open in ui.perfetto.dev or "
                        "chrome://tracing); default: SPEC-timeline.json in the current folder")
    p.add_argument("--png", type=Path, metavar="FILE.png",
                   help="write the Gantt chart here (needs matplotlib); default: "
                        "SPEC-timeline.png in the current folder")
    p.add_argument("--no-files", action="store_true",
                   help="write neither file, print the table only")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="with --rank: refuse a search estimated to take longer (default 120)")
    add_profiles_argument(p)
    p.set_defaults(func=run)


def stage_names(spec: Spec, estimate: Estimate) -> list[str]:
    """'stage j: layers a-b on <devices>' for each stage."""
    s = estimate.strategy
    out = []
    for j in range(s.pp):
        spans = [(a, z - 1) for a, z in s.stage_layer_ranges(j)]
        layers = ("layers " if len(spans) > 1 or spans[0][1] > spans[0][0] else "layer ") \
            + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
        out.append(f"stage {j}: {layers} on {stage_devices(spec, s.placement[j])}")
    return out


# ---------------------------------------------------------------------- the command

def _format(sim: SimulatedIteration, e: Estimate, names: list[str], kw: dict) -> list[str]:
    import numpy as np

    analytic = e.analytic_iteration_time_s
    diff = (sim.iteration_time_s - analytic) / analytic * 100 if analytic > 0 else 0.0
    lines = [f"iteration: simulated {sim.iteration_time_s:.4g} s, analytic (AMP eq. 5 + 4) "
             f"{analytic:.4g} s ({diff:+.1f}%)", ""]
    head = ("stage", "fwd ms", "bwd ms", "busy s", "idle s", "exposed comm s", "ends at s")
    rows = []
    bwd = np.asarray(kw["backward_s"]) + (0.0 if kw.get("recompute_s") is None
                                          else np.asarray(kw["recompute_s"]))
    bwd = bwd.reshape(sim.pp, -1).sum(axis=1)        # [pp, v] per chunk when interleaved
    fwd = np.asarray(kw["forward_s"]).reshape(sim.pp, -1).sum(axis=1)
    for j in range(sim.pp):
        rows.append((names[j], f"{fwd[j] * 1e3:.4g}", f"{bwd[j] * 1e3:.4g}",
                     f"{sim.busy_s[j]:.4g}", f"{sim.idle_s[j]:.4g}",
                     f"{sim.exposed_comm_s[j]:.4g}", f"{sim.stage_end_s[j]:.4g}"))
    lines.append(render_table(head, rows, left=(0,)))
    kinds = Counter(sim.critical_path_kinds)
    lines.append("")
    lines.append(f"critical path: {len(sim.critical_path)} tasks ("
                 + ", ".join(f"{n} {k}" for k, n in kinds.most_common()) + ")")
    return lines


def run(args) -> int:
    from cost_models.schedule import SCHEDULES

    from ..timeline import PngWriter

    if args.schedule not in SCHEDULES:
        raise UsageError(f"--schedule {args.schedule}: accepted: {', '.join(SCHEDULES)}")
    spec = load_spec(args.spec)
    measurements = measurements_for(spec, args)
    default_png = args.png is None and args.trace is None and not args.no_files
    if args.no_files:
        args.trace = args.png = None
    elif args.trace is None and args.png is None:       # both, named after the spec
        args.trace = Path(f"{args.spec.stem}-timeline.json")
        args.png = Path(f"{args.spec.stem}-timeline.png")
    if args.png is None:
        return _run(args, spec, measurements, None)
    if importlib.util.find_spec("matplotlib") is None:
        if default_png:
            print("note: no Gantt chart without matplotlib (pip install matplotlib); "
                  "writing the Chrome trace only")
            args.png = None
            return _run(args, spec, measurements, None)
        raise UsageError("--png needs matplotlib: pip install matplotlib")
    with PngWriter() as png:        # imports matplotlib in its own process while we plan
        return _run(args, spec, measurements, png)


def _run(args, spec, measurements, png) -> int:
    from ..costing import CostModel
    from ..simulate import gradient_buckets, simulatable, simulation_inputs
    from ..timeline import write_chrome_trace

    e, where = chosen_strategy(spec, args, measurements)
    spec = spec.for_backend(e.backend)      # a plan of several backends: the row's
    why = simulatable(e.strategy, spec.training)
    if why is not None:
        raise UsageError(f"timeline: {e.strategy.label()}: {why}; give another strategy "
                         f"(--rank N, or --pp --dp --tmp --mbs with --zero-stage 0, 1 or 2)")
    model = CostModel(spec, measurements=measurements)
    args.overlap_comm, args.bucket_elements = gradient_buckets(
        model, e.strategy, args.overlap_comm, args.bucket_elements)
    kw = simulation_inputs(model, e.strategy, schedule=args.schedule,
                           overlap=args.overlap_comm, bucket_elements=args.bucket_elements)
    if e.strategy.virtual_stages > 1:       # Megatron-LM's interleaved 1F1B
        from cost_models.simulator import simulate_interleaved

        if args.schedule != "1f1b":
            raise UsageError(f"--schedule {args.schedule} with {e.strategy.virtual_stages} "
                             f"virtual stages: the interleaved schedule is 1F1B's")
        args.schedule = f"interleaved 1F1B (v {e.strategy.virtual_stages})"

        sim = simulate_interleaved(**kw)
    else:
        sim = simulate_iteration(**kw)
    names = stage_names(spec, e)
    s = e.strategy
    sync = "overlapped with the backward" if args.overlap_comm else "after the backward"
    print(f"{s.label()} ({where}): {args.schedule}, gas {s.gas}"
          + (f", gradient buckets of {args.bucket_elements:.3g} elements {sync}"
             if s.dp > 1 else ""))
    print("\n".join(_format(sim, e, names, kw)))
    hidden = model.params.dp_overlap
    if s.dp > 1 and hidden > 0:
        print(f"note: the analytic time hides {hidden:.0%} of the data-parallel sync "
              f"(the calibration's dp_overlap); the simulation hides what the schedule "
              f"overlaps{'' if args.overlap_comm else ' (nothing without --overlap-comm)'}.")
    title = f"{s.label()}, {args.schedule}, gas {s.gas}"
    for path, what, write in (
            (args.trace, "Chrome trace", lambda p: write_chrome_trace(sim, p,
                                                                      stage_names=names)),
            (args.png, "Gantt chart", lambda p: png.write(sim, p, title=title,
                                                          stage_names=names))):
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
        print(f"wrote {what} {path}")
    return 0

