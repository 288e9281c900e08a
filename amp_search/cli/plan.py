"""`amp-search plan` and `amp-search estimate`."""
from __future__ import annotations

import argparse
import os
import sys
import textwrap
from itertools import groupby
from pathlib import Path

from ._args import (DEGREE_FLAGS, STRATEGY_DEGREES, add_profiles_argument, add_strategy_knobs,
                    layers_per_stage, measurements_for, narrow_table, nonnegative_int, output_file,
                    positive_float, positive_int, render_table, write_json)
from cost_models.layers import model_flops_per_sample

from ..errors import UsageError
from ..records import Estimate, Plan
from ..spec import FINGERPRINT_KEY, ModelError, Spec, load_spec, spec_fingerprint


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="rank every strategy for a spec",
                       description="Rank every (pp, dp, tmp, mbs) strategy of a YAML spec.")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    p.add_argument("--wide", action="store_true",
                   help="print every column, however wide (by default the table leaves out "
                        "placement, layers/stage, ... until it fits the terminal)")
    p.add_argument("--top-k", type=positive_int, default=10, metavar="K",
                   help="rows to show and write (default 10)")
    p.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write the result as JSON to FILE; '-': only the JSON, on "
                        "standard output")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="refuse a search estimated to take longer, before it starts "
                        "(default 120)")
    p.add_argument("--simulate-top", type=nonnegative_int, default=None, metavar="N",
                   help="simulate the best N strategies of the closed-form ranking event by "
                        "event (1F1B, P2P, gradient buckets, optimizer step) and re-order "
                        "them by the simulated time (default 32; 0: none)")
    p.add_argument("--no-simulate", action="store_true",
                   help="rank by the closed form (AMP eq. 5 + 4) only; same as "
                        "--simulate-top 0")
    p.add_argument("--groups-alone", action=argparse.BooleanOptionalAction, default=None,
                   help="on a cluster of several node groups, also plan each group on its "
                        "own, the others idle, and say whether it beats the whole cluster "
                        f"(default: on up to {GROUPS_ALONE_MAX_GPUS} GPUs)")
    from . import subsets

    subsets.add_arguments(p)
    add_profiles_argument(p)
    p.set_defaults(func=run_plan)

    e = sub.add_parser("estimate", help="predict one given strategy",
                       description="Predict the iteration time and memory of one strategy.")
    e.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    for name, what in (("pp", "pipeline stages"), ("dp", "data-parallel replicas"),
                       ("tmp", "tensor-parallel degree (GPUs per tensor group)"),
                       ("mbs", "micro-batch size: samples per micro-batch per replica")):
        e.add_argument(*DEGREE_FLAGS.get(name, (f"--{name}",)), dest=name, type=positive_int,
                       required=True, metavar="N",
                       help=f"{what} (required; pp x dp x tmp (x cp) = the cluster's GPUs)"
                       if name == "pp" else f"{what} (required)")
    add_strategy_knobs(e, sequence_knobs=True)
    e.add_argument("--no-simulate", action="store_true",
                   help="give the closed form (AMP eq. 5 + 4) only, without simulating the "
                        "iteration event by event")
    e.add_argument("--backend", choices=("deepspeed", "megatron"), default=None,
                   help="the framework to cost it for, where the spec names no "
                        "training.backend (default: deepspeed)")
    e.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write the estimate as JSON to FILE; '-': only the JSON, on "
                        "standard output")
    add_profiles_argument(e)
    e.set_defaults(func=run_estimate)


def _gib(n: int) -> str:
    return f"{n / 2**30:.1f}"


PLACEMENT_CHARS = 56
"""Longest stage description the placement column shows (after the node order)."""


def stage_devices(spec: Spec, stage) -> str:
    """What one pipeline stage holds: '8 H100-80GB', or '4 T4-16GB + 4 V100-16GB'."""
    groups = spec.cluster.node_groups
    if all(g.gpu.name == groups[0].gpu.name for g in groups):     # one type: no device looked up
        return f"{sum(len(replica) for replica in stage)} {groups[0].gpu.name}"
    devices = spec.cluster.devices
    counts: dict[str, int] = {}
    for replica in stage:
        for d in replica:
            name = devices[d].gpu.name
            counts[name] = counts.get(name, 0) + 1
    return " + ".join(f"{n} {name}" for name, n in counts.items())


def describe_placement(spec: Spec, strategy, max_chars: int | None = PLACEMENT_CHARS) -> str:
    """The stages first to last, consecutive stages that hold the same devices together:
    '2 stages x 8 H100-80GB | 1 stage x (4 T4-16GB + 4 V100-16GB)'. Longer than max_chars,
    it keeps the leading groups that fit and counts the rest ('| +5 stages')."""
    groups = [(len(list(g)), k) for k, g in
              groupby(stage_devices(spec, st) for st in strategy.placement)]
    parts = [f"{n} stage{'s' if n > 1 else ''} x " + (f"({k})" if " + " in k else k)
             for n, k in groups]
    text = " | ".join(parts)
    if max_chars is None or len(text) <= max_chars:
        return text
    shown, stages = [], 0
    for (n, _), part in zip(groups, parts):
        rest = strategy.pp - stages - n
        tail = f" | +{rest} stages" if rest else ""
        if len(" | ".join([*shown, part]) + tail) > max_chars:
            break
        shown.append(part)
        stages += n
    if not shown:  # even the first group is too long: cut it
        first = parts[0][:max_chars - 3] + "..."
        rest = strategy.pp - groups[0][0]
        return first + (f" | +{rest} stage{'s' if rest > 1 else ''}" if rest else "")
    rest = strategy.pp - stages
    return " | ".join(shown) + f" | +{rest} stage{'s' if rest > 1 else ''}"


def _placement(spec: Spec, e: Estimate) -> str:
    """e.g. 'slowest-first: 2 stages x 2 T4-16GB | 6 stages x 2 V100-16GB'."""
    return f"{e.strategy.placement_order}: {describe_placement(spec, e.strategy)}"


def _memory(e: Estimate) -> str:
    if not e.memory:
        return "-"
    worst = max(e.memory, key=lambda m: m.peak_bytes / max(m.capacity_bytes, 1))
    return f"{_gib(worst.peak_bytes)}/{_gib(worst.capacity_bytes)}"


def _differs(e: Estimate) -> bool:
    """Whether the table shows two different times for `e` (simulated and closed form)."""
    return f"{e.iteration_time_s:.4g}" != f"{e.analytic_iteration_time_s:.4g}"


NARROW_DROP_ORDER = ("placement", "layers/stage", "eq.5 s", "samples/s", "sp", "zero")
"""The columns a table narrower than the terminal leaves out first (`--wide` keeps them)."""


def format_table(spec: Spec, rows: list[tuple[str, Estimate, float | None]],
                 width: int | None = None, dropped: list | None = None) -> str:
    """The strategies as a table; an 'eq.5 s' column (the closed form) beside 'iter s' when
    some shown time was simulated and differs from it. `width`: leave out columns, in
    NARROW_DROP_ORDER, until every line fits (their names are appended to `dropped`)."""
    both = any(_differs(e) for _, e, _ in rows)
    chunked = any(e.strategy.virtual_stages > 1 for _, e, _ in rows)   # a 'v' column
    context = any(e.strategy.cp > 1 for _, e, _ in rows)                # a 'cp' column
    experts = bool(spec.model.num_experts)                              # an 'ep' column
    backends = len({e.backend for _, e, _ in rows}) > 1                 # a 'backend' column
    head = ("rank",) + (("backend",) if backends else ()) + ("pp", "dp", "tmp") + (("cp",) if context else ()) + (
            ("ep",) if experts else ()) + (
            "mbs", "zero", "ckpt", "sp") + (("v",) if chunked else ()) + (
            "layers/stage",
            "placement", "mem GiB", "iter s") + (("eq.5 s",) if both else ()) \
        + ("samples/s", "TFLOP/s/GPU", "vs Megatron")
    flops = model_flops_per_sample(spec.model.layers, frozen=spec.training.frozen_weights) \
        * spec.training.global_batch_size
    cells = []
    for label, e, speedup in rows:
        s = e.strategy
        analytic = (f"{e.analytic_iteration_time_s:.4g}" if _differs(e) else "=",) \
            if both else ()
        cells.append((label, *((e.backend,) if backends else ()), str(s.pp), str(s.dp),
                      str(s.tmp),
                      *((str(s.cp),) if context else ()),
                      *((str(s.ep),) if experts else ()), str(s.mbs), str(s.zero_stage),
                      {"none": "-", "selective": "sel"}.get(s.recompute, s.recompute),
                      "yes" if s.sequence_parallel else "-",
                      *((str(s.virtual_stages),) if chunked else ()),
                      layers_per_stage(s.partition, 24), _placement(spec, e), _memory(e),
                      f"{e.iteration_time_s:.4g}" + ("" if e.simulated else "*"
                                                     if any(r[1].simulated for r in rows)
                                                     else ""),
                      *analytic, f"{e.samples_per_s:.4g}",
                      f"{flops / e.iteration_time_s / s.num_devices / 1e12:.4g}",
                      "-" if speedup is None else f"{speedup:.2f}x"))
    left = ("backend", "layers/stage", "placement")     # left-aligned
    head, cells, table = narrow_table(head, cells, left_names=left, drops=NARROW_DROP_ORDER,
                                      width=width, dropped=dropped)
    if width is not None and backends and max(map(len, table.splitlines())) > width:
        # a two-backend table at 80 columns: the backends' short names, then LAST_DROPS
        k = head.index("backend")
        cells = [c[:k] + (SHORT_BACKEND.get(c[k], c[k]),) + c[k + 1:] for c in cells]
        if dropped is not None:
            dropped.append("the backends' full names (" + ", ".join(
                f"{v}: {b}" for b, v in SHORT_BACKEND.items()) + ")")
        table = narrow_table(head, cells, left_names=left, drops=LAST_DROPS, width=width,
                             dropped=dropped)[2]
    return table


LAST_DROPS = ("vs Megatron", "ckpt", "v", "TFLOP/s/GPU")
"""Left out after the backends' names are shortened, where the table still does not fit."""
SHORT_BACKEND = {"deepspeed": "ds", "megatron": "mg"}
"""The backend column's names where the terminal is too narrow for the full ones."""


LEGEND_WIDTH = 100


def _placement_example(spec: Spec, rows) -> str:
    """How to read one group of the placement column, taken from the rows shown (a group of
    several stages if there is one)."""
    groups = [(len(list(g)), k) for _, e, _ in rows for k, g in
              groupby(stage_devices(spec, st) for st in e.strategy.placement)]
    if not groups:
        return "'2 stages x 8 H100-80GB' is 2 consecutive stages of 8 H100-80GB each"
    n, held = max(groups, key=lambda g: g[0] > 1)  # the first group of several stages
    shown = f"({held})" if " + " in held else held
    held = held.replace(" + ", " and ")
    if n == 1:
        return f"'1 stage x {shown}' is one stage of {held}"
    return f"'{n} stages x {shown}' is {n} consecutive stages of {held} each"


def legend(spec: Spec, rows: list[tuple[str, Estimate, float | None]],
           width: int = LEGEND_WIDTH, dropped: tuple[str, ...] = ()) -> list[str]:
    """The lines under a table that say how to read it: what layers/stage sums to, what the
    placement column lists, and which shown times tie; wrapped to `width`. `dropped`: the
    columns the table left out for the terminal's width (said first)."""
    layers = spec.model.layers
    n = len(layers)
    blocks = sum(1 for x in layers if x.kind == "transformer")
    others = [x.kind for x in layers if x.kind != "transformer"]
    if spec.model.preset != "layers" and others == ["embedding", "head"]:
        what = (f"the {blocks} transformer blocks plus the embedding and the head, which count "
                f"as layers")
    else:
        what = "every layer of the chain (model.layers)"
    lines = [f"left out for the terminal's width: {', '.join(dropped)} (--wide shows every "
             f"column)."] if dropped else []
    if "layers/stage" not in dropped:
        lines.append(f"layers/stage: layers per pipeline stage, first to last; a row sums to "
                     f"{n}, {what}.")
    lines.append((f"placement: the node order, then what the stages hold, first to last; "
                  f"{_placement_example(spec, rows)} (dp x tmp devices per stage). "
                  if "placement" not in dropped else "")
                 + "mem GiB: peak / usable memory of the fullest device. ckpt: activation "
                   "recomputation (full: each block, sel: "
                 + ("the attention core only)" if spec.training.recompute_modules ==
                    ("core_attn",) else
                    f"{', '.join(spec.training.recompute_modules)}, training.recompute_modules)")
                 + ("; sp: sequence parallelism." if "sp" not in dropped else "."))
    lines.append("TFLOP/s/GPU: the model's FLOPs per second per GPU (3x the forward's GEMMs "
                 "and attention, recomputed work not counted); over the GPU's dense peak it is "
                 "the MFU.")
    if any(e.strategy.cp > 1 for _, e, _ in rows):
        lines.append("cp: context-parallel ranks per sequence (Megatron-LM's ring attention); "
                     "a stage then holds dp x cp x tmp devices.")
    if spec.model.num_experts:
        lines.append(f"ep: expert-parallel ranks: groups of ep consecutive ranks of a stage "
                     f"split the {spec.model.num_experts} experts (expert tensor parallelism "
                     f"1); the tokens reach their experts by all-to-all.")
    if any(e.strategy.virtual_stages > 1 for _, e, _ in rows):
        lines.append("v: model chunks per stage (Megatron-LM's interleaved 1F1B; stage j runs "
                     "chunks j, j + pp, ...); where v > 1, layers/stage lists the layers per "
                     "chunk, first to last.")
    simulated = [e for _, e, _ in rows if e.simulated]
    if simulated:
        star = any(not e.simulated for _, e, _ in rows)
        why = sorted({e.not_simulated_because for _, e, _ in rows
                      if e.not_simulated_because is not None})
        eq5 = any(_differs(e) for _, e, _ in rows)
        lines.append("iter s: simulated event by event (1F1B, P2P transfers, gradient buckets, "
                     "optimizer step)" + ("; * the closed form, not simulated" if star else "")
                     + (": " + "; ".join(why) if why else "")
                     + (". eq.5 s: the closed form, AMP eq. 5 + 4 ('=' where the same)."
                        if eq5 else "."))
    ranked = [(label, f"{e.iteration_time_s:.4g}") for label, e, _ in rows
              if label.isdigit()]
    ties = [[label for label, _ in g] for _, g in groupby(ranked, key=lambda r: r[1])]
    ties = [g for g in ties if len(g) > 1]
    if ties:
        shown = "; ".join(", ".join(g) for g in ties)
        lines.append(f"Ranks {shown} show the same iter s: equal times are ordered by lower "
                     f"peak memory.")
    return [w for line in lines for w in textwrap.wrap(line, width, break_on_hyphens=False)]


_cold_start_said = False
_kernels_prepared = False


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


def prepare_kernels() -> None:
    """Before a search: where numba's cache does not hold the search kernels yet (the first
    run after an install), compile them in a background process (amp_search.kernels) and run
    their plain-Python twins meanwhile, switching to the compiled ones once they are cached;
    say so in one line (`cold_start_note`). Where numba's cache holds them but they are not
    built ahead of time yet, the background process builds them (this run uses numba's).
    Once per process; where numba has no writable cache folder the kernels compile here, as
    before."""
    global _kernels_prepared
    if _kernels_prepared:
        return
    _kernels_prepared = True
    from cost_models import _jit

    from .. import kernels

    kernels.use_numba_cache_dir(os.environ.get("NUMBA_CACHE_DIR"))
    if kernels.aot_ready():
        return                      # the modules built ahead of time: numba is not imported
    if kernels.kernels_cached():
        if kernels.aot_buildable() and kernels.cache_writable():
            kernels.start_background_compile()     # builds the modules for the next runs
        return
    background = kernels.cache_writable()
    if background:
        kernels.start_background_compile()
        _jit.python_until_cached()
    cold_start_note(background)


def cold_start_note(background: bool = True) -> None:
    """One line on stderr when the search kernels are not in numba's cache: that they are
    compiled in the background while this run uses their plain-Python versions, or (numba
    has no cache folder) compiled in this run, about 25 s. Like the progress bars, only when
    stderr is a terminal (so a script's or a test's stderr keeps its one error line), and
    once per process."""
    global _cold_start_said
    if _cold_start_said or not _stderr_is_terminal():
        return
    _cold_start_said = True
    if background:
        print("amp-search: compiling the search kernels in the background (first run only); "
              "this run uses their plain-Python versions", file=sys.stderr, flush=True)
    else:
        print("amp-search: compiling the search kernels (numba has no cache folder, so in "
              "every run, about 25 s)", file=sys.stderr, flush=True)


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
    """Say what a search that takes a while will cost before it starts, and that the kernels
    are compiled first if they are (called once the search is accepted, so a refused search
    or a bad spec prints only its error)."""
    prepare_kernels()
    if cost.estimated_s >= 2.0 and sys.stderr.isatty():
        print(f"amp-search: searching {cost.describe()}", file=sys.stderr)


def chosen_strategy(spec: Spec, args, measurements) -> tuple[Estimate, str]:
    """The strategy a one-strategy command acts on (`add_strategy_choice`): the plan's
    --rank N, or the estimate of the one given by --pp --dp --tmp --mbs and the knobs of
    `add_strategy_knobs`; with where it came from, for the output."""
    from ..planner import KEEP, estimate, plan_backends

    given = {n: getattr(args, n) for n, _ in STRATEGY_DEGREES}
    if args.rank is not None:
        if any(v is not None for v in given.values()):
            raise UsageError("--rank and --pp/--dp/--tmp/--mbs exclude each other: give "
                             "the plan's rank or a strategy")
        result = plan_backends(spec, measurements=measurements,
                               max_search_s=args.max_search_seconds, on_start=announce,
                               keep=max(KEEP, args.rank))
        if args.rank > len(result.strategies):
            raise UsageError(f"--rank {args.rank}: the plan has {len(result.strategies)} "
                             f"feasible strategies")
        return result.strategies[args.rank - 1], f"rank {args.rank} of the plan"
    missing = [f"--{n}" for n, v in given.items() if v is None]
    if missing:
        raise UsageError(f"give --rank N, or a strategy with --pp --dp --tmp --mbs "
                         f"(missing: {' '.join(missing)})")
    if args.partition == "optimal":
        prepare_kernels()
    e = estimate(spec, **given, partition=args.partition, zero_stage=args.zero_stage,
                 activation_checkpointing=args.activation_checkpointing,
                 sequence_parallel=getattr(args, "sequence_parallel", None),
                 virtual_stages=getattr(args, "virtual_stages", None),
                 cp=getattr(args, "cp", None) or 1, ep=getattr(args, "ep", None),
                 placement_order=args.placement_order, measurements=measurements)
    return e, "given strategy"


GROUPS_ALONE_MAX_GPUS = 512
"""`plan` plans each node group of a mixed cluster alone by default up to this many GPUs (the
group searches together take about as long as the whole cluster's); --groups-alone above."""


def groups_alone_note(spec: Spec, result: Plan, alone, error: float) -> str:
    """One line: each node group's best plan alone against the whole cluster's, and what it
    means for the user (leave the others out, or not)."""
    gbs = spec.training.global_batch_size
    whole = gbs / result.best.iteration_time_s
    parts = []
    for a in alone:
        name = f"{a.nodes} x {a.gpus // a.nodes} {a.gpu}"
        rate = a.samples_per_s(gbs)
        if rate is None:
            parts.append(f"{name}: nothing fits")
            continue
        s = a.best.strategy
        parts.append(f"{name}: {rate:.4g} samples/s ({s.layout_text()}), "
                     f"{rate / whole:.2f}x")
    line = (f"Each node group alone, the others idle, against the whole cluster's "
            f"{whole:.4g} samples/s: " + "; ".join(parts) + ". ")
    fits = [a for a in alone if a.best is not None]
    if not fits:
        return line + "Only the whole cluster fits the model."
    top = max(fits, key=lambda a: a.samples_per_s(gbs))
    r = top.samples_per_s(gbs) / whole
    if r > 1 + error:
        return line + (f"The {top.gpu} nodes alone are {r:.2f}x as fast: leave the others "
                       f"out (plan a spec without them).")
    if r >= 1 - error:
        return line + (f"The {top.gpu} nodes alone are within the model's error (±{error:.1%}) "
                       f"of the whole cluster: the other nodes add little.")
    return line + f"Every node together is {1 / r:.2f}x as fast as the best group alone."


def groups_alone_of(spec: Spec, subsets) -> tuple:
    """Each node group alone (records.GroupAlone), taken from the planned subsets where they
    hold every group's; () where they do not (or there are none)."""
    from ..planner import groups_alone_uses
    from ..records import GroupAlone

    out = []
    for i, (g, uses) in enumerate(zip(spec.cluster.node_groups,
                                      groups_alone_uses(spec.cluster))):
        hit = next((s for s in subsets if s.uses == uses), None)
        if hit is None:
            return ()
        out.append(GroupAlone(group=i, gpu=g.gpu.name, nodes=g.count,
                              gpus=g.count * g.gpus_per_node, best=hit.best,
                              reason=hit.reason))
    return tuple(out)


def tie_ratio(error: float) -> float:
    """(1 + e) / (1 - e): two predictions whose error bands (+-e) overlap lie within this
    ratio of each other; 1 where the error is not known."""
    return (1 + error) / (1 - error) if 0.0 < error < 1.0 else 1.0


def tied_count(result: Plan, error: float) -> int:
    """How many ranked plans tie with the best within the model's error: their error bands
    overlap the best's, t <= t_best (1 + e) / (1 - e)."""
    if not result.strategies or not 0.0 < error < 1.0:
        return 1
    limit = result.strategies[0].iteration_time_s * tie_ratio(error)
    return sum(e.iteration_time_s <= limit for e in result.strategies)


def tie_note(spec: Spec, tied: int, error: ModelError, result: Plan | None = None) -> str:
    """What the tie with the best within the model's `error` (`Spec.model_error`) means for
    the user, in one line; `result`: the plan, where it holds several backends (`launch`
    runs one: the best's)."""
    if error.mape <= 0.0:
        return "The model's error on these GPUs is not known: measure the best few plans."
    where = (f"±{error.mape:.1%} on {error.gpu.name}"
             + (" for a model with experts" if error.for_experts else "")
             + (f", {error.source}" if error.source else ""))
    if tied <= 1:
        return (f"No other plan lies within the model's error of the best ({where}).")
    path = spec.path if spec.path is not None else "SPEC"
    if result is not None and (len(result.backends) > 1 or
                               result.best.backend != spec.training.backend):
        backend = result.best.backend
        k = sum(e.backend == backend for e in result.strategies[:tied])
        return (f"Ranks 1-{tied} ('~') lie within the model's error of the best ({where}): "
                f"`amp-search launch {path} --backend {backend} --top-k {k}` measures the {k} "
                f"{backend} plans among them and keeps the fastest"
                + (" (a launch runs one framework)." if len(result.backends) > 1 else "."))
    return (f"Ranks 1-{tied} ('~') lie within the model's error of the best ({where}): "
            f"`amp-search launch {path} --top-k {tied}` measures them and keeps the fastest.")


def dispatcher_gain(spec: Spec, best: Estimate, measurements=None
                    ) -> tuple[float, float, str] | None:
    """(the best plan's predicted time as planned, with a hierarchical token dispatcher, its
    name) where the best plan is a Megatron-LM one with experts, megatron-core's default
    all-to-all dispatcher and expert-parallel groups that cross nodes, and where the
    dispatcher makes it faster by more than 1% (training.moe_dispatcher;
    links.all_to_all_links): the best plan's own strategy, placement and split costed with
    it (simulated where the plan simulated it). None otherwise."""
    s = best.strategy
    if not spec.model.num_experts or best.backend != "megatron" or s.ep < 2:
        return None
    megatron = spec.for_backend("megatron")
    if megatron.training.moe_dispatcher != "alltoall":
        return None
    from dataclasses import replace

    from ..costing import CostModel
    from ..measurements import NO_MEASUREMENTS
    from ..planner import evaluate
    from ..simulate import with_simulation

    flex = replace(megatron, training=replace(megatron.training, moe_dispatcher="hybridep"))
    model = CostModel(flex, measurements=measurements or NO_MEASUREMENTS)
    e = evaluate(flex, s, model=model)
    now, then = best.iteration_time_s, \
        (with_simulation(model, e) if best.simulated else e).iteration_time_s
    if then >= now * 0.99:
        return None
    return now, then, "hybridep"


def dispatcher_note(gain: tuple[float, float, str] | None) -> str | None:
    """The line `plan` prints where `dispatcher_gain` found one."""
    if gain is None:
        return None
    now, then, name = gain
    return (f"The best plan's expert-parallel groups cross nodes: with training.moe_dispatcher: "
            f"{name} (or deepep), which sends a token once over the network to each other node "
            f"its experts are on rather than once per expert there, it is predicted {then:.4g} s "
            f"against {now:.4g} s ({(1 - then / now) * 100:.0f}% faster); set it to let the "
            f"search weigh it (it needs that library, on CUDA).")


def backends_note(result: Plan, error: float) -> str | None:
    """Where the plan holds several backends: each one's best plan, and which is faster."""
    if len(result.backends) < 2:
        return None
    from .plan_header import BACKEND_NAMES

    firsts = {}
    for i, e in enumerate(result.strategies, 1):
        firsts.setdefault(e.backend, (i, e))
    parts = [f"{BACKEND_NAMES.get(b, b)} rank {i}, {e.iteration_time_s:.4g} s"
             for b, (i, e) in firsts.items()]
    (_, best), (_, other) = list(firsts.values())[:2]
    r = other.iteration_time_s / best.iteration_time_s
    verdict = ((f"{BACKEND_NAMES.get(best.backend)} is {r:.2f}x as fast" if r >= 1.005 else
                f"{BACKEND_NAMES.get(best.backend)} is as fast")
               + (", within the model's error: either will do" if r <= (1 + error) / (1 - error)
                  else ""))
    return ("Best plan per backend: " + "; ".join(parts) + f". {verdict}. Set training.backend "
            f"to plan one only.")


def run_plan(args) -> int:
    from ..costing import SharedRows
    from ..planner import KEEP, plan_backends
    from . import subsets as cli_subsets

    spec = load_spec(args.spec)
    with_subsets = cli_subsets.wanted(spec, args)
    measurements = measurements_for(spec, args)
    simulate_top = 0 if args.no_simulate else args.simulate_top
    model_error = spec.model_error()
    error = model_error.mape
    # the plans shown, and every plan that may tie with the best (tied_count)
    shared = SharedRows()       # per device type rows, for the parts planned after it too
    workers = os.cpu_count() or 1
    early = None
    if with_subsets and not spec.other_backends:
        from ..planner import start_subsets

        # the parts' waves in a worker beside the whole cluster's search (the backend is
        # known); plan_subsets then searches what is left beside that worker
        early = start_subsets(spec, measurements=measurements, simulate_top=simulate_top,
                              limit=args.max_subsets, workers=workers, shared=shared)
    try:
        result: Plan = plan_backends(spec, measurements=measurements,
                                     progress=not args.no_progress and sys.stderr.isatty(),
                                     max_search_s=args.max_search_seconds, on_start=announce,
                                     simulate_top=simulate_top, keep=max(KEEP, args.top_k),
                                     keep_within=tie_ratio(error), shared=shared)
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    tied = tied_count(result, error)
    alone, subsets = (), ()
    if with_subsets:
        from ..planner import plan_subsets

        subsets = plan_subsets(spec.for_backend(result.best.backend), result,
                               measurements=measurements, simulate_top=simulate_top,
                               limit=args.max_subsets, workers=workers, shared=shared,
                               early=early)
    if args.groups_alone or (args.groups_alone is None and
                             spec.cluster.num_devices <= GROUPS_ALONE_MAX_GPUS):
        from ..planner import node_groups_alone

        alone = groups_alone_of(spec, subsets) or node_groups_alone(
            spec.for_backend(result.best.backend), measurements=measurements,
            simulate_top=simulate_top, shared=shared)
    rows = [(f"{i}~" if 1 < i <= tied else str(i), e, result.speedup(e))
            for i, e in enumerate(result.strategies[:args.top_k], 1)]
    if result.baseline is not None:
        rows.append(("megatron", result.baseline, 1.0))
    to_stdout = args.json is not None and str(args.json) == "-"
    gain = dispatcher_gain(spec, result.best, measurements)
    width = LEGEND_WIDTH
    if not to_stdout:
        import shutil

        from .plan_header import header_lines

        # the terminal's width (COLUMNS where set); output to a file or a pipe is not cut
        terminal = bool(os.environ.get("COLUMNS")) or sys.stdout.isatty()
        width = max(60, shutil.get_terminal_size((LEGEND_WIDTH, 24)).columns) if terminal \
            else LEGEND_WIDTH
        print("\n".join(header_lines(spec, result, width)) + "\n")
        dropped: list[str] = []
        print(format_table(spec, rows, width=width if terminal and not args.wide else None,
                           dropped=dropped))
        print("\n" + "\n".join(legend(spec, rows, min(width, LEGEND_WIDTH), tuple(dropped))))
        pruned = ", ".join(f"{k} {v}" for k, v in sorted(result.pruned.items())) or "none"
        sources = "; ".join(result.best.timing_sources)
        n_sim = sum(e.simulated for e in result.strategies)
        sim = f"; the best {n_sim} simulated and re-ranked" if n_sim else ""
        footer = (f"{len(result.strategies)} ranked of {result.candidates} candidates "
                  f"({result.evaluated} placements costed{sim}; pruned: {pruned}) in "
                  f"{result.search_time_s:.2f} s. Layer times: {sources}.")
        note = vocab_note(spec, sorted({e.strategy.tmp for _, e, _ in rows}))
        versus = backends_note(result, error)
        dispatch = dispatcher_note(gain)
        extra = ([versus] if versus else []) + ([dispatch] if dispatch else []) + \
            ([groups_alone_note(spec, result, alone, error)] if alone else []) + \
            ([note] if note else [])
        for line in [tie_note(spec, tied, model_error, result), footer] + extra:
            print("\n".join(textwrap.wrap(line, width, break_on_hyphens=False)))
    subset_json = {}
    if subsets:
        lines, subset_json = cli_subsets.report(spec, subsets, args, width)
        if not to_stdout:
            print("\n".join(lines))
    if args.json is not None:
        extra = {"node_groups_alone": [a.to_dict(spec.training.global_batch_size)
                                       for a in alone]} if alone else {}
        extra.update(subset_json)
        # the error the ties were marked within: rows 1..tied are `~` in the table
        extra["model_error"] = {"mape": error, "gpu": model_error.gpu.name,
                                "kind": model_error.kind, "source": model_error.source,
                                "tied": tied}
        if gain is not None:
            extra["moe_dispatcher_hint"] = {"moe_dispatcher": gain[2],
                                            "iteration_time_s": gain[1],
                                            "as_planned_s": gain[0]}
        write_json(args.json, {**result.to_dict(top_k=args.top_k), **extra,
                               FINGERPRINT_KEY: spec_fingerprint(spec)})
    return 0


def simulation_lines(spec: Spec, e: Estimate) -> list[str]:
    """The simulated iteration of `e`: its time against the closed form, each stage's busy,
    idle (bubble) and exposed-communication time, and the critical path by kind."""
    sim = e.simulation
    a = e.analytic_iteration_time_s
    diff = f" ({(sim.iteration_time_s - a) / a * 100:+.1f}%)" if a > 0 else ""
    lines = [f"simulated ({sim.schedule}): {sim.iteration_time_s:.4g} s per iteration, closed "
             f"form (AMP eq. 5 + 4) {a:.4g} s{diff}"]
    rows = []
    for j, (busy, idle, comm, end) in enumerate(zip(sim.busy_s, sim.idle_s,
                                                     sim.exposed_comm_s, sim.stage_end_s)):
        spans = [(a, z - 1) for a, z in e.strategy.stage_layer_ranges(j)]
        rows.append((f"stage {j}", ", ".join(f"{lo}-{hi}" if hi > lo else f"{lo}"
                                             for lo, hi in spans),
                     stage_devices(spec, e.strategy.placement[j]), f"{busy:.4g}",
                     f"{idle:.4g}", f"{idle / (busy + idle) * 100:.0f}%"
                     if busy + idle > 0 else "-", f"{comm:.4g}", f"{end:.4g}"))
    lines.append(render_table(("stage", "layers", "devices", "busy s", "idle s", "idle",
                               "exposed comm s", "ends at s"), rows, left=(0, 1, 2)))
    by_kind = sim.critical_time_by_kind()
    total = sum(by_kind.values())
    lines.append(f"critical path ({len(sim.critical_path)} runs of one stage and kind): "
                 + ", ".join(f"{k} {t:.4g} s ({t / total * 100:.0f}%)" if total > 0 else k
                             for k, t in by_kind.items()))
    lines.append("busy: forward, recompute, backward and optimizer step; idle: the rest of the "
                 "iteration (the bubble, waits included); exposed comm: a transfer or "
                 "collective of the stage in flight while it computes nothing.")
    return [w for line in lines for w in (line.split("\n") if "\n" in line else
                                          textwrap.wrap(line, LEGEND_WIDTH,
                                                        break_on_hyphens=False))]


def run_estimate(args) -> int:
    from ..planner import estimate

    spec = load_spec(args.spec)
    if args.backend is not None:
        spec = spec.for_backend(args.backend)
    if args.partition == "optimal":
        prepare_kernels()
    e = estimate(spec, pp=args.pp, dp=args.dp, tmp=args.tmp, mbs=args.mbs,
                 partition=args.partition, zero_stage=args.zero_stage,
                 activation_checkpointing=args.activation_checkpointing,
                 placement_order=args.placement_order,
                 measurements=measurements_for(spec, args), simulate=not args.no_simulate,
                 sequence_parallel=args.sequence_parallel, virtual_stages=args.virtual_stages,
                 cp=args.cp or 1, ep=args.ep)
    if not e.fits:      # said first: the time below is what it would take with the memory
        worst = max(e.memory, key=lambda m: m.peak_bytes / m.capacity_bytes)
        print(f"amp-search: this strategy does not fit: stage {worst.stage} needs "
              f"{_gib(worst.peak_bytes)} GiB of {_gib(worst.capacity_bytes)} GiB usable; the "
              f"time below is what it would take if it fitted", file=sys.stderr)
    if args.json is None or str(args.json) != "-":
        print(format_table(spec, [("-", e, None)]))
        print("\n" + "\n".join(legend(spec, [("-", e, None)])))
        note = vocab_note(spec, [e.strategy.tmp])
        if note:
            print(note)
        b = e.breakdown
        print(f"\nbreakdown: compute {b.compute_s:.4g} s, bubble {b.pipeline_bubble_s:.4g} s, "
              f"p2p {b.p2p_s:.4g} s, tensor-parallel {b.tensor_parallel_s:.4g} s, "
              f"data-parallel {b.data_parallel_s:.4g} s, optimizer {b.optimizer_s:.4g} s"
              + (" (closed form)" if e.simulation is not None else ""))
        if e.simulation is not None:
            print("\n" + "\n".join(simulation_lines(spec, e)))
        elif e.not_simulated_because:
            print(f"not simulated: {e.not_simulated_because}")
        bounds = e.strategy.partition
        for m in e.memory:
            j = m.stage
            held = ""
            if 0 <= j < len(e.strategy.placement) and j + 1 < len(bounds):
                spans = [(a, z - 1) for a, z in e.strategy.stage_layer_ranges(j)]
                held = (f"{'layers' if len(spans) > 1 or spans[0][1] > spans[0][0] else 'layer'} "
                        + ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in spans)
                        + f" on {stage_devices(spec, e.strategy.placement[j])}: ")
            print(f"stage {m.stage}: {held}peak {_gib(m.peak_bytes)} GiB of "
                  f"{_gib(m.capacity_bytes)} GiB (params {_gib(m.parameter_bytes)}, grads {_gib(m.gradient_bytes)}, "
                  f"optimizer {_gib(m.optimizer_bytes)}, activations "
                  f"{_gib(m.activation_bytes)}, overhead {_gib(m.overhead_bytes)}"
                  + (f"; the optimizer step's fp32 gradient copies {_gib(m.step_bytes)}, "
                     f"held without the activations" if m.step_bytes else "") + ")"
                  + ("" if m.fits else "  DOES NOT FIT"))
    if args.json is not None:
        write_json(args.json, e.to_dict())
    return 0 if e.fits else ESTIMATE_DOES_NOT_FIT


ESTIMATE_DOES_NOT_FIT = 1
"""`estimate`'s exit status for a strategy that does not fit in memory (its estimate is printed
all the same; 2 stays bad input)."""
