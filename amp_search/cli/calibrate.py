"""`amp-search calibrate SPEC`: fit the cost model's free coefficients to measured trials."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..errors import UsageError
from ._args import add_profiles_argument, measurements_for, output_file, profiles_root, write_json


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "calibrate", help="fit the cost model's coefficients to measured trials",
        description="Fit compute efficiency per device type, bandwidth and latency per link, "
                    "the data-parallel overlap factor and the per-micro-batch / per-step "
                    "overheads to the trials recorded for this spec, by least squares on the "
                    "relative error; store them beside the layer profiles (plan uses them) "
                    "and report the error before and after.")
    p.add_argument("spec", help="YAML spec the trials were launched for")
    p.add_argument("--results", type=Path, default=None, metavar="DB",
                   help="SQLite results database (default: amp-search-results.sqlite beside "
                        "the spec, where `amp-search launch` records)")
    p.add_argument("--db", type=Path, dest="results", help=argparse.SUPPRESS)  # old name
    p.add_argument("--trials", type=Path, default=None, metavar="FILE",
                   help="instead of the database: a JSON list of {strategy, measured_s}")
    p.add_argument("--holdout", action="store_true",
                   help="fit on every other trial and score on the rest (the stored "
                        "calibration is then fitted on half)")
    p.add_argument("--dry-run", action="store_true", help="fit and report; store nothing")
    p.add_argument("--json", type=output_file, nargs="?", const=Path("-"), default=None,
                   metavar="FILE",
                   help="also write the calibration as JSON to FILE; '-' (or no FILE): "
                        "only the JSON, on standard output")
    add_profiles_argument(p, writes=True)
    p.set_defaults(func=run)


def load_trials_file(path: Path):
    from ..calibrate import as_trials

    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UsageError(f"trials file not found: {path}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read trials file {path}: {exc}") from None
    if isinstance(data, dict):
        data = data.get("trials", [])
    if not isinstance(data, list):
        raise UsageError(f"{path}: expected a list of {{strategy, measured_s}} records")
    return as_trials(data)


def run(args) -> int:
    from ..calibrate import calibrate, save_calibration, trials_from_db
    from ..measurements import layer_profile_dir
    from ..spec import load_spec

    spec = load_spec(args.spec)
    if args.trials:
        trials = load_trials_file(args.trials)
    else:
        from ..launch.orchestrator import default_results_path

        db = args.results if args.results is not None else default_results_path(spec)
        if not Path(db).is_file():
            raise UsageError(f"no results database at {db}; run `amp-search launch "
                             f"{args.spec}` first, or pass --results DB or --trials FILE")
        trials = trials_from_db(spec, db)
    fit_on = range(0, len(trials), 2) if args.holdout else None
    cal = calibrate(spec, trials, fit_on=fit_on, measurements=measurements_for(spec, args))
    if not args.dry_run:
        save_calibration(cal, spec, layer_profile_dir(profiles_root(args)))
    if args.json is not None and str(args.json) == "-":
        write_json(args.json, cal.to_dict())
        return 0
    print(f"calibration of {'+'.join(cal.devices)} ({cal.precision}) on {cal.n_fit} of "
          f"{cal.n_trials} trials")
    print(f"{'coefficient':40s} {'before':>12s} {'after':>12s}")
    for name in cal.fitted:
        before, after = cal.values[name]
        print(f"{name:40s} {before:>12.4g} {after:>12.4g}")
    print(f"{'trial':34s} {'measured s':>10s} {'before s':>10s} {'err':>7s} {'after s':>10s} "
          f"{'err':>7s}  fit")
    for r in cal.rows:
        print(f"{r.label:34s} {r.measured_s:10.4f} {r.predicted_before_s:10.4f} "
              f"{100 * r.error_before:+6.1f}% {r.predicted_after_s:10.4f} "
              f"{100 * r.error_after:+6.1f}%  {'yes' if r.in_fit else 'no'}")
    print(f"mean absolute error ({cal.scored_on} trials): before {100 * cal.mape_before:.1f}%, "
          f"after {100 * cal.mape_after:.1f}%")
    if cal.path is not None:
        print(f"stored: {cal.path}")
    if args.json is not None:
        write_json(args.json, cal.to_dict())
    return 0
