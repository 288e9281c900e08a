"""`amp-search plan` and `amp-search estimate`."""
from __future__ import annotations

import argparse
import sys
from itertools import groupby
from pathlib import Path

from ._args import (add_profiles_argument, layers_per_stage, measurements_for, positive_float,
                    positive_int, render_table, write_json)
from ..records import Estimate, Plan
from ..spec import Spec, load_spec


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="rank every strategy for a spec",
                       description="Rank every (pp, dp, tmp, mbs) strategy of a YAML spec.")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K",
                   help="rows to show and write (default 10)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write the result as JSON "
                                                             "('-' for standard output)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="refuse a search estimated to take longer, before it starts "
                        "(default 120)")
    add_profiles_argument(p)
    p.set_defaults(func=run_plan)

    e = sub.add_parser("estimate", help="predict one given strategy",
                       description="Predict the iteration time and memory of one strategy.")
    e.add_argument("spec", type=Path)
    for name in ("pp", "dp", "tmp", "mbs"):
        e.add_argument(f"--{name}", type=positive_int, required=True)
    e.add_argument("--partition", default="optimal", type=_partition,
                   help="optimal (exact DP), uniform (Megatron), or boundaries such as 0,13,26")
    e.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=None,
                   help="default: the spec's (first value if 'search')")
    e.add_argument("--activation-checkpointing", choices=("none", "full"), default=None)
    e.add_argument("--placement-order", choices=("listed", "fastest-first", "slowest-first"),
                   default=None, help="default: the best of the three")
    e.add_argument("--json", type=Path, metavar="FILE")
    add_profiles_argument(e)
    e.set_defaults(func=run_estimate)


def _partition(text: str):
    if text in ("optimal", "uniform"):
        return text
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected optimal, uniform or comma-separated boundaries, got {text!r}")


# ---------------------------------------------------------------------- formatting

def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


def _placement(spec: Spec, e: Estimate) -> str:
    """e.g. 'fastest-first: V100-16GB x3 | T4-16GB x1' (GPU type of each stage, run-length)."""
    devices = spec.cluster.devices
    stage_types = [devices[st[0][0]].gpu.name for st in e.strategy.placement]
    runs = [f"{k} x{len(list(g))}" for k, g in groupby(stage_types)]
    text = " | ".join(runs)
    if len(text) > 34:
        text = text[:31] + "..."
    return f"{e.strategy.placement_order}: {text}"


def _memory(e: Estimate) -> str:
    if not e.memory:
        return "-"
    worst = max(e.memory, key=lambda m: m.peak_bytes / max(m.capacity_bytes, 1))
    return f"{_gib(worst.peak_bytes)}/{_gib(worst.capacity_bytes)}"


def format_table(spec: Spec, rows: list[tuple[str, Estimate, float | None]]) -> str:
    head = ("rank", "pp", "dp", "tmp", "mbs", "zero", "ckpt", "layers/stage", "placement",
            "mem GiB", "iter s", "samples/s", "vs Megatron")
    cells = []
    for label, e, speedup in rows:
        s = e.strategy
        cells.append((label, str(s.pp), str(s.dp), str(s.tmp), str(s.mbs), str(s.zero_stage),
                      "full" if s.activation_checkpointing else "-",
                      layers_per_stage(s.partition, 24), _placement(spec, e), _memory(e),
                      f"{e.iteration_time_s:.4g}", f"{e.samples_per_s:.4g}",
                      "-" if speedup is None else f"{speedup:.2f}x"))
    return render_table(head, cells, left=(7, 8))


def vocab_note(spec: Spec, tmps) -> str | None:
    """How the vocabulary is padded at the shown tensor-parallel degrees, if it is."""
    from cost_models.layers import VOCAB_PAD_MULTIPLE, padded_vocab_size

    v = spec.model.vocab_size
    padded = {t: padded_vocab_size(v, t) for t in tmps}
    if not v or all(p == v for p in padded.values()):
        return None
    shown = ", ".join(f"{p} at tmp {t}" for t, p in padded.items())
    return (f"Vocabulary {v} padded to a multiple of {VOCAB_PAD_MULTIPLE} x tmp, as Megatron-LM "
            f"and the trials do: {shown}.")


def announce(cost) -> None:
    """Say what a search that takes a while will cost before it starts."""
    if cost.estimated_s >= 2.0:
        print(f"amp-search: searching {cost.describe()}", file=sys.stderr)


def run_plan(args) -> int:
    from ..planner import plan

    spec = load_spec(args.spec)
    result: Plan = plan(spec, measurements=measurements_for(spec, args),
                        progress=not args.no_progress and sys.stderr.isatty(),
                        max_search_s=args.max_search_seconds, on_start=announce)
    rows = [(str(i), e, result.speedup(e)) for i, e in enumerate(result.strategies[:args.top_k],
                                                                  1)]
    if result.baseline is not None:
        rows.append(("megatron", result.baseline, 1.0))
    to_stdout = args.json is not None and str(args.json) == "-"
    if not to_stdout:
        print(format_table(spec, rows))
        pruned = ", ".join(f"{k} {v}" for k, v in sorted(result.pruned.items())) or "none"
        sources = "; ".join(result.best.timing_sources)
        print(f"\n{len(result.strategies)} feasible of {result.candidates} candidates "
              f"({result.evaluated} placements costed; pruned: {pruned}) in "
              f"{result.search_time_s:.2f} s. Layer times: {sources}.")
        note = vocab_note(spec, sorted({e.strategy.tmp for _, e, _ in rows}))
        if note:
            print(note)
    if args.json is not None:
        write_json(args.json, result.to_dict(top_k=args.top_k))
    return 0


def run_estimate(args) -> int:
    from ..planner import estimate

    spec = load_spec(args.spec)
    ckpt = None if args.activation_checkpointing is None else \
        args.activation_checkpointing == "full"
    e = estimate(spec, pp=args.pp, dp=args.dp, tmp=args.tmp, mbs=args.mbs,
                 partition=args.partition, zero_stage=args.zero_stage,
                 activation_checkpointing=ckpt, placement_order=args.placement_order,
                 measurements=measurements_for(spec, args))
    if args.json is None or str(args.json) != "-":
        print(format_table(spec, [("-", e, None)]))
        note = vocab_note(spec, [e.strategy.tmp])
        if note:
            print(note)
        b = e.breakdown
        print(f"\nbreakdown: compute {b.compute_s:.4g} s, bubble {b.pipeline_bubble_s:.4g} s, "
              f"p2p {b.p2p_s:.4g} s, tensor-parallel {b.tensor_parallel_s:.4g} s, "
              f"data-parallel {b.data_parallel_s:.4g} s, optimizer {b.optimizer_s:.4g} s")
        for m in e.memory:
            print(f"stage {m.stage}: peak {_gib(m.peak_bytes)} GiB of {_gib(m.capacity_bytes)} "
                  f"GiB (params {_gib(m.parameter_bytes)}, grads {_gib(m.gradient_bytes)}, "
                  f"optimizer {_gib(m.optimizer_bytes)}, activations "
                  f"{_gib(m.activation_bytes)}, overhead {_gib(m.overhead_bytes)})"
                  + ("" if m.fits else "  DOES NOT FIT"))
    if args.json is not None:
        write_json(args.json, e.to_dict())
    return 0
