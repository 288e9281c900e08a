"""Closed form against simulation on trials already recorded: no trial is launched.

    python benchmarks/recorded_accuracy.py configs/cpu-local.yaml [--results DB]
                                           [--png FILE.png] [--json FILE]
    python benchmarks/recorded_accuracy.py configs/cpu-local.yaml \
        --accuracy-cache runs/accuracy/measurements.json

Every trial of the spec that finished ok in the results database (default: the one beside the
spec, as `amp-search results` reads it) is predicted again by today's cost model with the
shipped measurements (`amp_search.measurements.load_measurements`: layer profile, link
profile, calibration), twice: AMP eq. 5 + 4 (`planner.evaluate`) and the event-level
simulation of the same strategy, partition and placement (`simulate.with_simulation`). Both
are scored against the measured time (the trial's mean): MAPE, Spearman's rank correlation
over all trials, and the MAPE left after one common factor (the level; a profile taken in
another machine state moves every prediction by about the same factor). The prediction recorded at launch time is scored too, for reference.

With --accuracy-cache, the trials are those benchmarks/accuracy.py accepted (its cache of
measurements), each predicted as that script predicts it before calibration: the layer
profile of the machine state the trial ran in (with the framework overheads its probe
measured), the link profile beside it, no fitted coefficient; measured: the trial's median
iteration.

A benchmark: it reads the command line; the library code it calls does not.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search.launch.orchestrator import default_results_path  # noqa: E402
from amp_search.launch.results_db import ResultsDB  # noqa: E402
from amp_search.measurements import load_measurements  # noqa: E402
from amp_search.costing import CostModel  # noqa: E402
from amp_search.planner import evaluate  # noqa: E402
from amp_search.records import Strategy  # noqa: E402
from amp_search.resources import profiles_dir  # noqa: E402
from amp_search.simulate import with_simulation  # noqa: E402
from amp_search.spec import load_spec  # noqa: E402


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def mape(pred, meas) -> float:
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred / meas - 1.0)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("--results", type=Path, action="append",
                    help="results database (default: beside the spec); may be repeated")
    ap.add_argument("--profiles", type=Path, default=None,
                    help="measurements root (default: the shipped profiles folder)")
    ap.add_argument("--png", type=Path, help="draw both predictions against measured")
    ap.add_argument("--json", type=Path, help="write the figures and rows")
    ap.add_argument("--accuracy-cache", type=Path, metavar="measurements.json",
                    help="score benchmarks/accuracy.py's accepted trials instead")
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    if args.accuracy_cache is not None:
        out, path, sources = from_accuracy_cache(spec, args.accuracy_cache)
    else:
        got = from_results_db(spec, args)
        if isinstance(got, int):
            return got
        out, path, sources = got
    return report(args, out, path, sources)


def from_accuracy_cache(spec, cache: Path):
    from amp_search.measurements import load_measurements as load

    loaded: dict = {}
    out = []
    sources = set()
    for label, m in json.loads(cache.read_text()).items():
        if m.get("status") != "ok" or not m.get("median_s"):
            continue
        root = Path(m["profile_dir"]).parent
        if root not in loaded:
            loaded[root] = CostModel(spec, measurements=load(spec, root))
        model = loaded[root]
        s = Strategy.from_dict(m["strategy"])
        e = evaluate(spec, s, model=model)
        sim = with_simulation(model, e)
        sources.update(model.sources())
        out.append({"id": label, "label": label, "gbs": s.global_batch_size,
                    "measured_s": m["median_s"], "recorded_s": None,
                    "analytic_s": e.iteration_time_s, "simulated_s": sim.iteration_time_s,
                    "time_source": sim.time_source})
    return out, cache, sorted(sources)


def from_results_db(spec, args):
    paths = args.results or [default_results_path(spec)]
    rows = []
    for path in paths:
        if not path.is_file():
            print(f"no results database at {path}: no recorded trial to score")
            return 2
        rows += [r for r in ResultsDB(path).rows(spec.sha256)
                 if r.status == "ok" and r.measured_mean_s]
    path = ", ".join(map(str, paths))
    if not rows:
        print(f"no trial of {args.spec} finished ok in {path}")
        return 2
    measurements = load_measurements(spec, args.profiles or profiles_dir())
    model = CostModel(spec, measurements=measurements)
    out = []
    for r in rows:
        s = Strategy.from_dict(r.strategy)
        e = evaluate(spec, s, model=model)
        sim = with_simulation(model, e)
        out.append({"id": r.id, "label": r.label, "gbs": s.global_batch_size,
                    "measured_s": r.measured_mean_s, "recorded_s": r.predicted_s,
                    "analytic_s": e.iteration_time_s, "simulated_s": sim.iteration_time_s,
                    "time_source": sim.time_source})
    return out, path, model.sources()


def report(args, out, path, sources) -> int:
    meas = np.array([x["measured_s"] for x in out])
    figures = {}
    for name in ("analytic_s", "simulated_s", "recorded_s"):
        pred = np.array([np.nan if x[name] is None else x[name] for x in out])
        ok = ~np.isnan(pred)
        if not ok.any():
            continue
        scale = float(np.exp(np.mean(np.log(meas[ok] / pred[ok]))))
        figures[name] = {"mape": mape(pred[ok], meas[ok]),
                         "spearman": spearman(pred[ok], meas[ok]), "n": int(ok.sum()),
                         "level": scale, "mape_at_level": mape(pred[ok] * scale, meas[ok])}
    print(f"{len(out)} recorded trials of {args.spec} ({path}); measurements: "
          f"{'; '.join(sources)}")
    print(f"{'prediction':28} {'n':>3} {'MAPE':>7} {'Spearman':>9} {'level':>6} "
          f"{'MAPE at level':>13}")
    for name, what in (("analytic_s", "closed form (eq. 5 + 4)"),
                       ("simulated_s", "simulated (1F1B events)"),
                       ("recorded_s", "recorded at launch")):
        f = figures.get(name)
        if f is None:
            continue
        print(f"{what:28} {f['n']:>3} {f['mape']:>7.1%} {f['spearman']:>9.3f} "
              f"{f['level']:>6.3f} {f['mape_at_level']:>13.1%}")
    print("level: the one factor (geometric mean of measured / predicted) that would put the "
          "predictions on the measurements' level; MAPE at level: the error left after it "
          "(the shape of the prediction, not its level).")
    differ = [x for x in out if abs(x["simulated_s"] / x["analytic_s"] - 1) > 1e-9]
    print(f"{len(differ)} of {len(out)} trials simulate to a different time than the closed "
          f"form" + (": " + ", ".join(f"{x['label']} {x['simulated_s'] / x['analytic_s'] - 1:+.1%}"
                                     for x in differ[:12]) if differ else ""))
    if args.png:
        from amp_search.timeline import write_prediction_png

        write_prediction_png({"closed form": ([x["analytic_s"] for x in out], meas),
                              "simulated": ([x["simulated_s"] for x in out], meas)},
                             args.png, title=f"{args.spec.name}: {len(out)} recorded trials, "
                                             f"predicted today")
        print(f"wrote {args.png}")
    if args.json:
        args.json.write_text(json.dumps({"results_db": str(path), "figures": figures,
                                         "rows": out}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
