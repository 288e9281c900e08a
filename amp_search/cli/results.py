"""`amp-search results`: the trials recorded for a spec.

Before it shows them, it records what launches that died left behind (their trials'
result.json, `recover_orphans`); otherwise it only reads. A database that cannot be written
is shown as it is, with a note; one that cannot be read is one line, exit 2."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UsageError
from ._args import layers_per_stage, output_file, render_table
from ..spec import load_spec


def add_parser(sub) -> None:
    p = sub.add_parser("results", help="show the trials recorded for a spec",
                       description="Print every trial of a spec from the results database.")
    p.add_argument("spec", type=Path, help="YAML spec the trials were launched for")
    p.add_argument("--results", type=Path, metavar="DB",
                   help="SQLite results database (default: amp-search-results.sqlite beside "
                        "the spec)")
    p.add_argument("--runs-dir", type=Path, metavar="DIR",
                   help="where the launches put their trial folders (default: runs/ beside "
                        "the spec): measured trials there that the database lacks are "
                        "recorded")
    p.add_argument("--json", type=output_file, metavar="FILE",
                   help="also write the rows as JSON ('-': stdout)")
    p.add_argument("--png", type=output_file, metavar="FILE.png",
                   help="draw the finished trials' predicted against measured time, with "
                        "the diagonal (needs matplotlib)")
    p.set_defaults(func=run)


def _f(x, fmt: str = ".4g") -> str:
    return "-" if x is None else format(x, fmt)


NOTE_CHARS = 80
"""Widest log path or error the table shows."""


def shorten_path(path: str, max_chars: int = NOTE_CHARS) -> str:
    """A path that fits in max_chars: relative to the current folder when it is inside it,
    then cut from the left, so that the trial folder and file name stay
    ('...runs/01-.../log.txt')."""
    if not path:
        return ""
    try:
        rel = Path(path).resolve().relative_to(Path.cwd().resolve())
        path = str(rel)
    except (ValueError, OSError):
        pass
    if len(path) <= max_chars:
        return path
    return "..." + path[len(path) - (max_chars - 3):]


def format_rows(rows) -> str:
    head = ("id", "strategy", "layers/stage", "predicted s", "measured s", "+-", "peak MiB",
            "status", "started", "log / error")
    cells = []
    for r in rows:
        note = shorten_path(r.log_path or "", NOTE_CHARS)
        if r.status != "ok" and r.error:
            note = r.error.splitlines()[0]
            if len(note) > NOTE_CHARS:
                note = note[:NOTE_CHARS - 3] + "..."
        cells.append((str(r.id), r.label, layers_per_stage(r.partition), _f(r.predicted_s),
                      _f(r.measured_mean_s), _f(r.measured_std_s, ".2g"),
                      "-" if r.peak_memory_bytes is None else f"{r.peak_memory_bytes / 2**20:.0f}",
                      r.status, r.started_at or "-", note))
    return render_table(head, cells, left=(1, 2, 7, 8, 9))


def plotted(rows) -> list:
    """The rows the --png plot shows: finished ok, with a prediction and a measurement."""
    return [r for r in rows if r.status == "ok" and r.predicted_s is not None
            and r.measured_mean_s is not None and r.measured_mean_s > 0]


def write_png(spec_path: Path, rows, path: Path) -> int:
    """Predicted against measured of `rows` into `path`; returns the points drawn."""
    from ..timeline import write_prediction_png

    points = plotted(rows)
    if not points:
        raise UsageError(f"--png: no trial of {spec_path} finished ok with a prediction and a "
                         f"measurement; nothing to plot")
    try:
        write_prediction_png(
            {"recorded prediction": ([r.predicted_s for r in points],
                                     [r.measured_mean_s for r in points])},
            path, labels=[r.label for r in points],
            title=f"{spec_path.name}: predicted (at launch) against measured, "
                  f"{len(points)} trials")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    return len(points)


def run(args) -> int:
    import importlib.util

    from ..launch.orchestrator import default_results_path, recover_orphans
    from ..launch.results_db import ResultsDB, ResultsDBError

    if args.png is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--png needs matplotlib: pip install matplotlib")
    spec = load_spec(args.spec)
    path = args.results or default_results_path(spec)
    if not Path(path).is_file():
        raise UsageError(f"no results database at {path}; run `amp-search launch "
                         f"{args.spec}` first (or pass --results)")
    runs = Path(args.runs_dir or (spec.path.parent if spec.path else Path.cwd()) / "runs")
    to_stdout = args.json is not None and str(args.json) == "-"
    try:
        db = ResultsDB(path)
        found = recover_orphans(db, runs_dirs=(runs.resolve(),))
        if found and not to_stdout:
            print(f"amp-search: {found.summary()}", file=sys.stderr)
    except ResultsDBError as exc:
        if exc.damaged:
            raise
        db = ResultsDB(path, readonly=True)  # shown as it is (one line if unreadable too)
        print(f"amp-search: note: {exc}; shown as it is", file=sys.stderr)
    rows = db.rows(spec.sha256)
    if not to_stdout:
        if rows:
            print(format_rows(rows))
            ok = [r for r in rows if r.status == "ok" and r.measured_mean_s is not None]
            if ok:
                best = min(ok, key=lambda r: r.measured_mean_s)
                print(f"\nbest measured: {best.label} partition {best.partition}: "
                      f"{best.measured_mean_s:.4g} s/iteration")
        else:
            print(f"no trials recorded for {args.spec} (sha256 {spec.sha256[:12]}) in {path}")
    if args.png is not None:
        n = write_png(args.spec, rows, args.png)
        if not to_stdout:
            print(f"wrote {args.png}: predicted against measured time of {n} trials")
    if args.json is not None:
        text = json.dumps({"spec": str(args.spec), "spec_sha256": spec.sha256,
                           "results_db": str(path), "rows": [r.to_dict() for r in rows]},
                          indent=2)
        if to_stdout:
            print(text)
        else:
            try:
                args.json.write_text(text + "\n")
            except OSError as exc:
                raise UsageError(f"cannot write {args.json}: {exc.strerror}") from None
    return 0
