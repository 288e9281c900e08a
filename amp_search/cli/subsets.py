"""`amp-search plan`'s answer to "which devices, at what cost": the best plan on each subset of
the cluster (planner.plan_subsets), the Pareto front of time against cost (or GPU-time), the
plan the spec's objective chooses under --deadline, --budget and --max-amplification, and a
PNG of the front."""
from __future__ import annotations

import argparse
import textwrap
from pathlib import Path

from ._args import narrow_table, output_file, positive_float, positive_int
from ..errors import UsageError
from ..records import SubsetPlan
from ..spec import Spec


def add_arguments(p) -> None:
    p.add_argument("--subsets", action=argparse.BooleanOptionalAction, default=None,
                   help="also plan parts of the cluster alone, the rest idle (whole nodes; at "
                        "most 15 parts) and show time, cost and GPU-seconds per sample of "
                        "each, with the Pareto front (default: on where the spec gives a "
                        "price_per_hour or an objective other than time, or a constraint "
                        "below is given)")
    p.add_argument("--max-subsets", type=positive_int, default=15, metavar="N",
                   help="plan at most N parts of the cluster, the most devices first (default "
                        "15; each is a search)")
    p.add_argument("--iterations", type=positive_int, metavar="N",
                   help="iterations the training runs, for --deadline and --budget")
    p.add_argument("--deadline", type=positive_float, metavar="HOURS",
                   help="only plans that run --iterations within this many hours")
    p.add_argument("--budget", type=positive_float, metavar="AMOUNT",
                   help="only plans whose --iterations cost at most this (in the currency of "
                        "the spec's price_per_hour)")
    p.add_argument("--max-amplification", type=amplification, metavar="K",
                   help="only plans that use at most K times the GPU-seconds per sample of the "
                        "most GPU-efficient one (DeepPool's amplification limit)")
    p.add_argument("--pareto-png", type=output_file, metavar="FILE",
                   help="draw time per iteration against cost (or GPU-seconds per sample) of "
                        "every subset, the front and the chosen plan, as a PNG (needs "
                        "matplotlib)")


def amplification(text: str) -> float:
    """--max-amplification: a number of at least 1 (the most GPU-efficient plan has 1)."""
    v = positive_float(text)
    if v < 1:
        raise argparse.ArgumentTypeError(
            f"expected a number of at least 1 (1: the most GPU-efficient plans only; a plan's "
            f"amplification is its GPU-seconds per sample over the least), got {text!r}")
    return v


def wanted(spec: Spec, args) -> bool:
    """Whether `plan` plans the subsets: --subsets, else where a price, an objective or a
    constraint asks for them. Checks the constraints' arguments (UsageError)."""
    priced = any(g.price_per_hour is not None for g in spec.cluster.node_groups)
    if (args.deadline is not None or args.budget is not None) and args.iterations is None:
        raise UsageError("--deadline and --budget need --iterations N (how many iterations "
                         "the training runs)")
    if args.budget is not None and not all(g.price_per_hour is not None
                                           for g in spec.cluster.node_groups):
        raise UsageError("--budget needs cluster.nodes[*].price_per_hour for every node group")
    if args.subsets is not None:
        if not args.subsets and (args.deadline or args.budget or args.max_amplification
                                 or args.pareto_png):
            raise UsageError("--no-subsets with --deadline, --budget, --max-amplification or "
                             "--pareto-png: they choose among the subsets")
        return args.subsets
    return priced or spec.training.objective != "time" or any(
        x is not None for x in (args.deadline, args.budget, args.max_amplification,
                                args.pareto_png))


def devices_text(spec: Spec, uses: tuple[tuple[int, int], ...]) -> str:
    """'3 x 4 V100-16GB + 1 x 4 T4-16GB': nodes x GPUs used of each node group
    (`planner.cluster_subsets`' form)."""
    return " + ".join(f"{n} x {k} {g.gpu.name}"
                      for g, (n, k) in zip(spec.cluster.node_groups, uses) if n)


def uses_text(spec: Spec, s: SubsetPlan) -> str:
    """`devices_text` of a subset plan, 'whole: ...' for every device."""
    return ("whole: " if s.whole else "") + devices_text(spec, s.uses)


def _front_axes(subsets, gbs: int) -> tuple[str, list[int]]:
    """What the front trades time against (cost where every subset has a price, else
    GPU-seconds per sample) and the indices of its points."""
    from ..planner import pareto_front

    fit = [i for i, s in enumerate(subsets) if s.best is not None]
    priced = all(subsets[i].cost_per_iteration is not None for i in fit)
    other = "cost" if priced else "gpu_seconds"
    points = [(subsets[i].iteration_time_s, subsets[i].objective_value(other, gbs)) for i in fit]
    return other, [fit[k] for k in pareto_front(points)]


def report(spec: Spec, subsets: tuple[SubsetPlan, ...], args, width: int
           ) -> tuple[list[str], dict]:
    """The lines `plan` prints under its table, and the JSON it adds ('subsets', 'objective',
    'chosen')."""
    from ..planner import choose_subset

    gbs = spec.training.global_batch_size
    objective = spec.training.objective
    other, front = _front_axes(subsets, gbs)
    chosen = choose_subset(subsets, objective, gbs, iterations=args.iterations,
                           deadline_s=None if args.deadline is None else args.deadline * 3600,
                           budget=args.budget, max_amplification=args.max_amplification)
    fits = [s for s in subsets if s.best is not None]
    least = min(s.gpu_seconds_per_sample(gbs) for s in fits)
    priced = any(s.price_per_hour is not None for s in subsets)
    head = ("", "#", "devices used (the rest idle)", "GPUs", "best plan", "iter s") + (
        ("cost/iter",) if priced else ()) + ("GPU-s/sample", "ampl.", "front")
    rows = []
    for i, s in enumerate(subsets):
        mark = "->" if s is chosen else ""
        if s.best is None:
            rows.append((mark, str(i), uses_text(spec, s), str(s.gpus),
                         "dominated" if s.dominated else "nothing fits",
                         f">={s.cutoff_s:.4g}" if s.dominated else "-")
                        + (("-",) if priced else ()) + ("-", "-", ""))
            continue
        t = s.best.strategy
        cost = s.cost_per_iteration
        rows.append((mark, str(i), uses_text(spec, s), str(s.gpus),
                     t.layout_text(), f"{s.iteration_time_s:.4g}")
                    + ((("-" if cost is None else f"{cost:.4g}"),) if priced else ())
                    + (f"{s.gpu_seconds_per_sample(gbs):.4g}",
                       f"{s.gpu_seconds_per_sample(gbs) / least:.2f}x",
                       "*" if i in front else ""))
    title = (f"Devices used, the best plan on each (objective: {objective}; front '*': the "
             f"plans no other beats in both time and "
             f"{'cost' if other == 'cost' else 'GPU-seconds per sample'}; ampl.: GPU-seconds "
             f"per sample against the least"
             + ("; dominated: no plan there is faster than one above that uses no more "
                "GPU-seconds or money, so its search stopped early" if any(
                    s.dominated for s in subsets) else "") + "):")
    left = ("", "devices used (the rest idle)", "best plan")
    dropped: list[str] = []
    head, rows, table = narrow_table(head, rows, left_names=left,
                                     drops=("ampl.", "GPU-s/sample", "best plan"),
                                     width=None if args.wide else width, dropped=dropped)
    over = max(map(len, table.splitlines())) - width
    if over > 0 and not args.wide:       # still too wide: shorten the devices' descriptions
        k = head.index("devices used (the rest idle)")
        keep = max(24, max(len(r[k]) for r in rows) - over)
        rows = [r[:k] + ((r[k] if len(r[k]) <= keep else r[k][:keep - 3] + "..."),) + r[k + 1:]
                for r in rows]
        table = narrow_table(head, rows, left_names=left)[2]
    from ..planner import cluster_subsets

    left_out = len(cluster_subsets(spec.cluster, 10**6)) - (len(subsets) - 1)
    if left_out > 0:
        title += (f" {left_out} smaller parts were not planned (--max-subsets "
                  f"{len(subsets) - 1}, the most devices first).")
    if dropped:
        title += f" Left out for the terminal's width: {', '.join(dropped)} (--wide shows them)."
    lines = ["", *textwrap.wrap(title, width, break_on_hyphens=False), table]
    lines += textwrap.wrap(_choice_line(spec, subsets, chosen, args, other), width,
                           break_on_hyphens=False)
    data = {"objective": objective, "front_against": other,
            "subsets": [{**s.to_dict(gbs), "pareto": i in front, "chosen": s is chosen}
                        for i, s in enumerate(subsets)],
            "chosen_subset": None if chosen is None else subsets.index(chosen)}
    if args.pareto_png is not None:
        write_pareto_png(spec, subsets, front, chosen, other, args.pareto_png)
        lines.append(f"wrote {args.pareto_png}")
    return lines, data


def _choice_line(spec: Spec, subsets, chosen, args, other: str) -> str:
    gbs = spec.training.global_batch_size
    objective = spec.training.objective
    limits = []
    if args.deadline is not None:
        limits.append(f"{args.iterations} iterations within {args.deadline:g} h")
    if args.budget is not None:
        limits.append(f"{args.iterations} iterations for at most {args.budget:g}")
    if args.max_amplification is not None:
        limits.append(f"at most {args.max_amplification:g}x the least GPU-seconds per sample")
    under = f" under {', '.join(limits)}" if limits else ""
    what = {"time": "the fastest", "cost": "the cheapest",
            "gpu_seconds": "the most GPU-efficient"}[objective]
    if chosen is None:
        return (f"No plan meets {', '.join(limits)}: relax a limit, or give the training "
                f"more nodes.")
    whole = subsets[0]
    t = chosen.best.strategy
    money = "" if chosen.cost_per_iteration is None else \
        f", cost {chosen.cost_per_iteration:.4g} per iteration"
    total = ""
    if args.iterations is not None:
        hours = chosen.iteration_time_s * args.iterations / 3600
        total = f"; {args.iterations} iterations take {hours:.4g} h" + (
            "" if chosen.cost_per_iteration is None
            else f" and cost {chosen.cost_per_iteration * args.iterations:.4g}")
    text = (f"Chosen ({what}{under}): {uses_text(spec, chosen)}, {t.layout_text()}, "
            f"{chosen.iteration_time_s:.4g} s per iteration{money}, "
            f"{chosen.gpu_seconds_per_sample(gbs):.4g} GPU-s per sample{total}.")
    if chosen is not whole and whole.best is not None:
        r = chosen.iteration_time_s / whole.iteration_time_s
        speed = f"{r:.2f}x the time" if r >= 1.005 else f"{1 / r:.2f}x as fast"
        text += f" Against every device: {speed}"
        if chosen.cost_per_iteration is not None and whole.cost_per_iteration:
            text += f", {chosen.cost_per_iteration / whole.cost_per_iteration:.2f}x the cost"
        idle = spec.cluster.num_devices - chosen.gpus
        k = subsets.index(chosen)
        backend = chosen.best.backend
        named = "" if backend == spec.training.backend else f"--backend {backend} "
        text += (f"; {idle} devices left idle: `amp-search launch {spec.path or 'SPEC'} "
                 f"{named}--subset {k} --top-k 3` runs on subset {k}'s devices only.")
    return text


def write_pareto_png(spec: Spec, subsets, front: list[int], chosen, other: str,
                     path: Path) -> None:
    """Time per iteration against cost per iteration (or GPU-seconds per sample) of each
    subset's best plan, the front joined, the chosen plan ringed."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("--pareto-png needs matplotlib: pip install matplotlib") from None
    gbs = spec.training.global_batch_size
    fig = Figure(figsize=(8, 5.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    pts = [(i, s.iteration_time_s, s.objective_value(other, gbs))
           for i, s in enumerate(subsets) if s.best is not None]
    ax.scatter([p[1] for p in pts], [p[2] for p in pts], color="#4477aa", zorder=2,
               label="best plan on a subset")
    fx = [subsets[i].iteration_time_s for i in front]
    fy = [subsets[i].objective_value(other, gbs) for i in front]
    ax.plot(fx, fy, color="#ee6677", marker="o", zorder=3, label="Pareto front")
    for i, x, y in pts:
        ax.annotate(uses_text(spec, subsets[i]).replace("whole: ", "all: "), (x, y),
                    fontsize=7, xytext=(4, 4), textcoords="offset points")
    if chosen is not None:
        ax.scatter([chosen.iteration_time_s], [chosen.objective_value(other, gbs)], s=220,
                   facecolors="none", edgecolors="#228833", linewidths=2, zorder=4,
                   label=f"chosen ({spec.training.objective})")
    ax.set_xlabel("time per iteration (s)")
    ax.set_ylabel("cost per iteration" if other == "cost" else "GPU-seconds per sample")
    ax.set_title("time against " + ("cost" if other == "cost" else "GPU-time") +
                 ": the best plan on each part of the cluster", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8)
    ax.margins(x=0.2, y=0.1)
    fig.tight_layout()
    try:
        fig.savefig(path, format="png")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
