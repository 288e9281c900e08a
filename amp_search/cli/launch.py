"""`amp-search launch`: run the top-k predicted strategies for real, fastest measured wins."""
from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

from ._args import (add_profiles_argument, layers_per_stage, measurements_for, nonnegative_int,
                    output_file, port, positive_float, positive_int, render_table, write_json)
from ..errors import UsageError
from ..machine_load import BUSY_CORES, busy_note
from ..records import Estimate, Strategy
from ..spec import (FINGERPRINT_KEY, FINGERPRINT_SECTIONS, Spec, load_spec,
                    spec_fingerprint)


def add_parser(sub) -> None:
    from ..launch.launchers import LAUNCHERS
    from ..launch.orchestrator import BACKENDS

    p = sub.add_parser(
        "launch", help="run the top-k strategies as real trials",
        description="Plan (or read a plan), run the top-k strategies one after another as "
                    "real training trials, record them, and report the fastest measured one. "
                    "Exits 0 when a trial ended ok (or with --dry-run), 1 when none did, "
                    "2 on bad input or a results database that cannot be written (the "
                    "trial's measurement then stays in its folder for the next launch), "
                    "130 on Ctrl-C. Launches sharing a results database take turns, one "
                    "trial at a time.")
    p.add_argument("spec", type=Path, help="YAML cluster + model + training spec")
    p.add_argument("--top-k", type=positive_int, default=3, metavar="K",
                   help="trials to run, best predicted first (default 3)")
    p.add_argument("--plan", type=Path, metavar="FILE",
                   help="read the ranking from `amp-search plan --json FILE` instead of planning")
    p.add_argument("--subset", type=positive_int, metavar="N",
                   help="plan and run on part of the cluster only, the rest idle: subset N as "
                        "`amp-search plan --subsets` numbers them (its '#' column)")
    p.add_argument("--backend", choices=BACKENDS, default=None,
                   help="deepspeed: amp-search's trial program; megatron: Megatron-LM "
                        "pretrain_gpt.py (needs --megatron-path). Default: the spec's "
                        "training.backend (deepspeed unless it says otherwise)")
    p.add_argument("--megatron-path", type=Path, metavar="DIR",
                   help="Megatron-LM checkout holding pretrain_gpt.py")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local",
                   help="local: torchrun on this machine (default); deepspeed: the deepspeed "
                        "launcher with a hostfile; torchrun: torchrun per node over ssh; "
                        "slurm: srun inside an allocation")
    p.add_argument("--hostfile", type=Path, metavar="FILE",
                   help="DeepSpeed hostfile, one 'host slots=N' per spec node, in spec order")
    p.add_argument("--iters", type=positive_int, default=40, metavar="N",
                   help="iterations per trial, warm-up included (default 40, as AMP)")
    p.add_argument("--warmup", type=nonnegative_int, default=20, metavar="W",
                   help="leading iterations left out of the mean (default 20)")
    p.add_argument("--trial-timeout", type=positive_float, default=1800.0, metavar="S",
                   help="stop a trial after S seconds (default 1800)")
    p.add_argument("--budget-minutes", type=positive_float, metavar="M",
                   help="stop starting trials after M minutes in all")
    p.add_argument("--results", type=Path, metavar="DB",
                   help="SQLite results database (default: amp-search-results.sqlite beside "
                        "the spec)")
    p.add_argument("--runs-dir", type=Path, metavar="DIR",
                   help="where trial directories go (default: runs/ beside the spec)")
    retry = p.add_mutually_exclusive_group()
    retry.add_argument("--retry-failed", action="store_true",
                       help="run again every trial recorded as oom / failed / timeout")
    retry.add_argument("--no-retry", action="store_true",
                       help="do not run again trials whose failure may not recur (a killed "
                            "rank, a crash, a timeout), which a launch runs again by default; "
                            "ok, a real out-of-memory and an invalid plan are never run again")
    p.add_argument("--master-port", type=port, default=29500, metavar="PORT",
                   help="rendezvous port for multi-node launchers (default 29500)")
    p.add_argument("--dry-run", action="store_true",
                   help="print each trial's processes, nodes, first command and the folder "
                        "its files would go to; run nothing, write nothing, record nothing")
    p.add_argument("-v", "--verbose", action="store_true",
                   help="with --dry-run: also print every command (one per node for "
                        "torchrun) and the full text of every file a trial would write")
    p.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write the trials and the best strategy as JSON ('-': stdout)")
    p.add_argument("--no-speed-probe", action="store_true",
                   help="do not time the profile's speed-probe layer before each trial (a few "
                        "seconds); by default, where the layer profile holds the machine's "
                        "speed when it was taken (amp-search profile on cpu), each trial's "
                        "prediction is scaled by the machine's speed now over then")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--max-search-seconds", type=positive_float, default=120.0, metavar="S",
                   help="refuse a search estimated to take longer, before it starts "
                        "(default 120)")
    add_profiles_argument(p)
    p.set_defaults(func=run)


def check_fingerprint(path: Path, data: dict, spec: Spec) -> None:
    """Refuse a plan whose fingerprint names another spec (a plan without one, written by
    hand or by an older amp-search, is checked row by row only)."""
    given = data.get(FINGERPRINT_KEY)
    if given is None:
        return
    if not isinstance(given, dict) or not all(isinstance(given.get(k), str) for k in FINGERPRINT_SECTIONS):
        raise UsageError(f"{path}: {FINGERPRINT_KEY} is malformed; write the plan again with "
                         f"`amp-search plan {spec.path or 'SPEC'} --json FILE`")
    ours = spec_fingerprint(spec)
    differ = [k for k in FINGERPRINT_SECTIONS if given[k] != ours[k]]
    if differ:
        raise UsageError(f"{path} was made for another spec: its {' and '.join(differ)} "
                         f"differ{'s' if len(differ) == 1 else ''} from "
                         f"{spec.path or 'this spec'}'s; plan again with `amp-search plan "
                         f"{spec.path or 'SPEC'} --json FILE`")


def check_plan_row(spec: Spec, s: Strategy) -> str:
    """The first rule a plan row breaks ('' if none): degrees of at least 1 that multiply to
    the devices its placement uses, on the cluster's devices, each once; a layer split into
    pp x virtual_stages non-empty parts; micro-batches that make the global batch."""
    for name in ("pp", "dp", "tmp", "mbs", "virtual_stages", "cp", "ep"):
        if getattr(s, name) < 1:
            return f"{name} {getattr(s, name)}: must be at least 1"
    if not 0 <= s.zero_stage <= 3:
        return f"zero_stage {s.zero_stage}: must be 0, 1, 2 or 3"
    have = len(spec.cluster.devices)
    cp = f" x cp {s.cp}" if s.cp > 1 else ""
    if s.num_devices > have:
        return (f"pp {s.pp} x dp {s.dp}{cp} x tmp {s.tmp} = {s.num_devices} devices, but the "
                f"cluster has {have}")
    shape = [[len(r) for r in st] for st in s.placement]
    if len(shape) != s.pp or any(len(st) != s.replicas for st in shape) or \
            any(n != s.tmp for st in shape for n in st):
        return (f"placement is not pp {s.pp} stages x dp {s.dp}{cp} replicas x tmp {s.tmp} "
                f"devices")
    used = [d for st in s.placement for r in st for d in r]
    bad = [d for d in used if not 0 <= d < have]
    if bad:
        return (f"placement names device {bad[0]}, but the cluster's devices are 0-{have - 1}")
    if len(set(used)) != len(used):
        twice = next(d for d in used if used.count(d) > 1)
        return f"placement uses device {twice} more than once"
    from ..launch.orchestrator import splits_layers

    n, chunks, p = len(spec.model.layers), s.pp * s.virtual_stages, s.partition
    if not splits_layers(p, n, chunks):
        return (f"partition {list(p)} does not split the model's {n} layers into {chunks} "
                f"non-empty parts (from 0 to {n}, increasing)")
    if s.gas < 1 or s.gas * s.dp * s.mbs != s.global_batch_size:
        return (f"dp {s.dp} x mbs {s.mbs} does not divide the spec's global batch "
                f"{s.global_batch_size}")
    return ""


def plan_backends_in(path: Path) -> set[str]:
    """The backends a plan JSON's rows were planned for (their 'backend'; none in a plan
    written by hand or by an older amp-search); read errors are left to `read_plan`."""
    try:
        rows = json.loads(path.read_text()).get("strategies")
    except (OSError, ValueError, AttributeError):
        return set()
    return {r["backend"] for r in rows if isinstance(r, dict) and isinstance(
        r.get("backend"), str)} if isinstance(rows, list) else set()


def read_plan(path: Path, spec: Spec, measurements=None,
              backend: str | None = None) -> list[Estimate | Strategy]:
    """Strategies (with their predicted times) from a plan JSON (`amp-search plan --json`).

    Each row gives pp, dp, tmp, mbs, partition, placement and optionally zero_stage,
    activation_checkpointing, iteration_time_s; the global batch comes from the spec. The
    plan's spec fingerprint (where it has one) must match the spec, and every row must pass
    `check_plan_row`, before anything launches: else one line naming the row and the rule."""
    from ..launch.orchestrator import TrialRequest

    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"plan file not found: {path}") from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read plan {path}: {exc}") from None
    rows = data.get("strategies") if isinstance(data, dict) else None
    if not isinstance(rows, list) or not rows:
        raise UsageError(f"{path}: expected {{\"strategies\": [...]}} as written by "
                         f"`amp-search plan --json`")
    check_fingerprint(path, data, spec)
    if backend is not None and not spec.backend_given:
        # a plan of both frameworks: the rows of the one launched, costed as it
        rows = [r for r in rows if not isinstance(r, dict) or r.get("backend") in (None,
                                                                                   backend)]
        if not rows:
            raise UsageError(f"{path} holds no plan for backend {backend}")
        spec = spec.for_backend(backend)
    strategies = []
    for i, row in enumerate(rows):
        try:
            if not isinstance(row, dict):
                raise TypeError("not an object")
            s = Strategy.from_dict({**row, "global_batch_size": spec.training.global_batch_size})
            predicted = row.get("iteration_time_s")
            predicted = None if predicted is None else float(predicted)
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise UsageError(f"{path}: strategies[{i}] is not a strategy ({exc!r} missing or "
                             f"malformed)") from None
        rule = check_plan_row(spec, s)
        if rule:
            raise UsageError(f"{path}: strategies[{i}] ({s.label()}): {rule}; was the plan "
                             f"made for this spec?")
        strategies.append((s, predicted))
    return [TrialRequest(strategy=s, predicted_s=_predict(spec, s, measurements)
                         if predicted is None else predicted) for s, predicted in strategies]


def subset_plan(spec: Spec, args, measurements):
    """`launch --subset N`: the plan of subset N of `planner.cluster_subsets` (as `plan
    --subsets` numbers them), its rows on those devices of the cluster only."""
    from ..planner import KEEP, cluster_subsets, plan_on_subset
    from .plan import announce
    from .subsets import devices_text

    subsets = cluster_subsets(spec.cluster, 10**6)     # plan --subsets' numbering
    if not subsets:
        raise UsageError(f"--subset {args.subset}: this cluster has no smaller part to plan "
                         f"on (one device)")
    if args.subset > len(subsets):
        raise UsageError(f"--subset {args.subset}: the cluster has subsets 1-{len(subsets)} "
                         f"(`amp-search plan {spec.path or 'SPEC'} --subsets` lists them)")
    uses = subsets[args.subset - 1]
    result = plan_on_subset(spec, uses, measurements=measurements, backend=args.backend,
                            max_search_s=args.max_search_seconds, on_start=announce,
                            keep=max(KEEP, args.top_k))
    if not (args.json is not None and str(args.json) == "-"):
        print(f"amp-search: subset {args.subset}: {devices_text(spec, uses)}, the other "
              f"devices idle",
              file=sys.stderr)
    return result


def _predict(spec: Spec, strategy: Strategy, measurements=None) -> float | None:
    """The cost model's prediction for a hand-written strategy (None if it cannot say)."""
    from ..measurements import NO_MEASUREMENTS
    from ..planner import evaluate

    try:
        return evaluate(spec, strategy,
                        measurements=measurements or NO_MEASUREMENTS).iteration_time_s
    except Exception:  # noqa: BLE001 - a prediction is optional; the trial still runs
        return None


# ----------------------------------------------------------------------------- output

def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.0f}"


def format_trials(records) -> str:
    """Predicted vs measured seconds per iteration, per trial."""
    head = ("#", "strategy", "layers/stage", "predicted s", "measured s", "+-", "peak MiB",
            "status", "note")
    cells = []
    for r in records:
        note = "cached" if r.cached else ""
        if r.error:
            note = (note + ": " if note else "") + r.error
        busy = busy_note(r.other_processes_cores)
        if busy:
            note = (note + "; " if note else "") + busy
        if r.machine_speed is not None:
            note = (note + "; " if note else "") + f"speed {r.machine_speed:.2f}x"
        if len(note) > 70:
            note = note[:67] + "..."
        cells.append((str(r.index), r.label, layers_per_stage(r.strategy.partition),
                      "-" if r.predicted_s is None else f"{r.predicted_s:.4g}",
                      "-" if r.measured_mean_s is None else f"{r.measured_mean_s:.4g}",
                      "-" if r.measured_std_s is None else f"{r.measured_std_s:.2g}",
                      _mib(r.peak_memory_bytes), r.status, note))
    return render_table(head, cells, left=(1, 2, 7, 8))


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 'es' if word.endswith('s') else 's'}"


def dry_run_summary(spec: Spec, rec, *, total: int, launcher: str, verbose: bool = False) -> str:
    """What one trial of `launch --dry-run` would do, in a few lines: its processes and
    nodes, the first command (rank 0's, or node 0's for torchrun per node), and the folder
    its files would be written to (which the dry run does not create). With verbose, every
    command and the full text of every file follow."""
    s = rec.strategy
    pred = "" if rec.predicted_s is None else f", predicted {rec.predicted_s:.4g} s/iteration"
    lines = [f"trial {rec.index}/{total}: {rec.label}{pred}"]
    if not rec.commands:  # did not pass the preflight checks: nothing would start
        lines.append(f"  would not start: {rec.error or 'no command'}")
        return "\n".join(lines) + "\n"
    try:
        nodes = len({spec.cluster.devices[d].node for st in s.placement for r in st
                     for d in r})
    except IndexError:
        nodes = 0
    n_cmd = len(rec.commands)
    how = "1 command" if n_cmd == 1 else f"{n_cmd} commands, one per node" + (
        "" if verbose else "; node 0's")
    lines.append(f"  {_plural(s.num_devices, 'process')} on {_plural(nodes, 'node')} "
                 f"({launcher} launcher), started by {how}:")
    lines.extend(f"    {c}" for c in (rec.commands if verbose else rec.commands[:1]))
    if n_cmd > 1 and not verbose:
        lines.append(f"    (+{_plural(n_cmd - 1, 'more command')}: --verbose prints them)")
    if rec.trial_dir:
        names = sorted(Path(p).name for p in rec.files)
        lines.append(f"  would write to {rec.trial_dir}{os.sep}: {', '.join(names)}")
    if rec.error:
        lines.append(f"  note: {rec.error}")
    if verbose:
        for path, text in rec.files.items():
            if not path.endswith("commands.json"):
                lines.append(f"  --- {path} (would be written)\n{text.rstrip()}")
    return "\n".join(lines) + "\n"


def speed_correction(spec: Spec, measurements, *, quiet: bool = False):
    """A `run_trials(before_trial=...)` that takes the machine-speed probe of every device type
    whose layer profile holds one (amp_search.profiling.speed) and predicts the trial again
    with those layer times scaled by now / then (`CostParams.compute_scale` on top of the
    plan's coefficients); None where no profile holds a probe."""
    import dataclasses

    from ..costing import CostModel
    from ..planner import evaluate
    from ..profiling.speed import measure_speed, probe_layer

    layer = probe_layer(spec).signature
    refs = {name: p.speed_probe for name, p in sorted(measurements.layer_profiles.items())
            if p.speed_probe is not None and p.speed_probe.layer == layer}
    if not refs:
        return None
    base = CostModel(spec, measurements=measurements).params
    failed: list[str] = []

    def before_trial(req):
        if failed:
            return req
        try:
            ratios = {name: measure_speed(spec, workers=ref.workers, seconds=ref.seconds,
                                          mbs=ref.mbs).ms / ref.ms for name, ref in refs.items()}
        except UsageError as exc:
            failed.append(str(exc))
            print(f"warning: {exc}; predictions not corrected for the machine's speed",
                  file=sys.stderr)
            return req
        params = dataclasses.replace(base, compute_scale={
            **base.compute_scale, **{n: base.compute(n) * r for n, r in ratios.items()}})
        predicted = evaluate(spec, req.strategy, measurements=measurements,
                             cost_params=params).iteration_time_s
        ratio = sum(ratios.values()) / len(ratios)
        if not quiet:
            was = "" if req.predicted_s is None else f" {req.predicted_s:.4g} s ->"
            print(f"{req.strategy.label()}: machine speed {ratio:.3f}x the profile's; "
                  f"predicted{was} {predicted:.4g} s", file=sys.stderr, flush=True)
        return dataclasses.replace(req, predicted_s=predicted, machine_speed=ratio)

    return before_trial


def _sigterm(signum, frame):
    raise KeyboardInterrupt  # stop the running trial the same way as Ctrl-C


def run(args) -> int:
    from ..launch.hostfile import parse_hostfile
    from ..launch.orchestrator import LaunchOptions, default_results_path
    from ..tuner import tune

    from .plan import announce

    spec = load_spec(args.spec)
    if args.warmup >= args.iters:
        raise UsageError(f"--warmup ({args.warmup}) must be smaller than --iters "
                         f"({args.iters})")
    hostfile = parse_hostfile(args.hostfile) if args.hostfile is not None else None
    measurements = measurements_for(spec, args)
    if args.subset is not None and args.plan is not None:
        raise UsageError("--subset and --plan exclude each other: a plan file's rows name "
                         "their devices already")
    if args.backend is None:
        # the spec's; where it names none, the one its plan file's rows were planned for
        rows = plan_backends_in(args.plan) if args.plan is not None else set()
        if len(rows) > 1:
            raise UsageError(f"{args.plan} holds plans for {' and '.join(sorted(rows))}: pass "
                             f"--backend to run those of one (a launch runs one framework)")
        args.backend = rows.pop() if rows and not spec.backend_given else \
            spec.training.backend
    given = None if args.plan is None else read_plan(args.plan, spec, measurements,
                                                     backend=args.backend)
    if not spec.backend_given:          # costed as the framework that runs it
        spec = spec.for_backend(args.backend)
    if args.subset is not None:
        given = subset_plan(spec, args, measurements)
    options = LaunchOptions(
        backend=args.backend, launcher=args.launcher, hostfile=hostfile, iters=args.iters,
        warmup=args.warmup, trial_timeout_s=args.trial_timeout,
        budget_s=None if args.budget_minutes is None else args.budget_minutes * 60,
        dry_run=args.dry_run, results_path=args.results, runs_dir=args.runs_dir,
        megatron_path=args.megatron_path, master_port=args.master_port,
        retry_failed=args.retry_failed, retry_transient=not args.no_retry,
        progress=not args.no_progress and sys.stderr.isatty(), base_env=dict(os.environ))
    quiet = args.json is not None and str(args.json) == "-"
    total = 0  # trials to run: known once tune() has planned (or read --plan)

    def trials(strategies) -> None:
        nonlocal total
        total = len(strategies)

    def show(rec) -> None:
        if quiet:
            return
        if args.dry_run:
            print(dry_run_summary(spec, rec, total=total, launcher=args.launcher,
                                  verbose=args.verbose))
            return
        measured = "-" if rec.measured_mean_s is None else f"{rec.measured_mean_s:.4g} s"
        busy = "" if rec.cached else busy_note(rec.other_processes_cores)
        again = rec.status in ("oom", "failed", "timeout", "interrupted") and \
            not rec.final and not args.no_retry
        print(f"trial {rec.index}/{total} {rec.label}: {rec.status}"
              f"{' (cached)' if rec.cached else ''}, measured {measured}"
              + (f" - {rec.error}" if rec.error else "") + (f" ({busy})" if busy else "")
              + (" (runs again on the next launch)" if again and not rec.cached else ""),
              file=sys.stderr, flush=True)

    def note(text: str) -> None:
        if not quiet:
            print(f"amp-search: {text}", file=sys.stderr, flush=True)

    before = None
    if not (args.dry_run or args.no_speed_probe) and args.launcher == "local":
        before = speed_correction(spec, measurements, quiet=quiet)
    previous = signal.signal(signal.SIGTERM, _sigterm)
    try:
        result = tune(spec, top_k=args.top_k, options=options, measurements=measurements,
                      plan=given, on_trials=trials, on_record=show, on_note=note,
                      before_trial=before, progress=options.progress,
                      max_search_s=args.max_search_seconds, on_start=announce)
    finally:
        signal.signal(signal.SIGTERM, previous)
    records, best = result.records, result.best
    db_path = None if args.dry_run else str(args.results or default_results_path(spec))
    if not quiet and args.dry_run:
        runs = Path(args.runs_dir or (spec.path.parent if spec.path else Path.cwd())
                    / "runs").resolve()
        print(f"dry run: nothing was started, written or recorded. A real launch writes each "
              f"trial's folder under {runs} and records it in "
              f"{args.results or default_results_path(spec)}."
              + ("" if args.verbose else " --verbose prints every command and file."))
    if not quiet and not args.dry_run:
        print(format_trials(records))
        if best is None:
            print("\nno trial ended ok")
        else:
            pred = "" if best.predicted_s is None else f", predicted {best.predicted_s:.4g} s"
            print(f"\nbest: {best.label} partition {list(best.strategy.partition)}: "
                  f"{best.measured_mean_s:.4g} s/iteration measured{pred}")
        busy = [r for r in records if not r.cached and r.other_processes_cores is not None
                and r.other_processes_cores > BUSY_CORES]
        if busy:
            print(f"warning: other programs kept more than {BUSY_CORES} of a core busy during "
                  f"{len(busy)} of the trials (see their notes): their times may be high; "
                  f"measure again on a quiet machine with another --results file")
        print(f"results: {db_path}")
    if args.json is not None:
        write_json(args.json, {
            "spec": str(args.spec), "spec_sha256": spec.sha256, "results_db": db_path,
            "backend": args.backend, "launcher": args.launcher, "iters": args.iters,
            "warmup": args.warmup, "dry_run": args.dry_run,
            "trials": [r.to_dict() for r in records],
            "best": None if best is None else best.to_dict()})
    return 0 if args.dry_run or best is not None else 1
