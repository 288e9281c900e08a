"""Sequence parallelism on/off: the model's prediction against real trials.

    python -m amp_search launch configs/cpu-local.yaml --plan PLAN --json OUT.json ...
    python benchmarks/sequence_parallel_trials.py SPEC OUT.json [OUT2.json ...] [--json FILE]

Reads the launch outputs (`amp-search launch --json`), takes each ok trial's timed iterations
from its result.json (`trial_dir`), and prints per (strategy without sp, sp) pair: the measured
mean and minimum seconds per iteration (the minimum is the least disturbed when other programs
share the machine; launch notes how many cores they used), the model's prediction (`estimate`
with the measurements `amp-search plan` loads from the shipped profiles folder) and the ratio
of sequence parallel to without, measured and predicted. Trials repeated over several outputs
are pooled (all their timed iterations). Nothing is launched here: the trials are the
launcher's. Exit status 2 for an unreadable output.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search.planner import estimate  # noqa: E402
from amp_search.measurements import load_measurements  # noqa: E402
from amp_search.resources import profiles_dir  # noqa: E402
from amp_search.spec import load_spec  # noqa: E402


def trial_times(outputs: list[Path]) -> dict[tuple, dict]:
    """{(pp, dp, tmp, mbs, zero, recompute, sp): {"times": [...], "busy": [...]}}."""
    pooled: dict[tuple, dict] = {}
    for out in outputs:
        try:
            trials = json.loads(out.read_text())["trials"]
        except (OSError, ValueError, KeyError) as exc:
            raise SystemExit(f"{out}: {exc}") from None
        for t in trials:
            if t.get("status") != "ok":
                continue
            s = t["strategy"]
            key = (s["pp"], s["dp"], s["tmp"], s["mbs"], s["zero_stage"],
                   s.get("recompute", "none"), bool(s.get("sequence_parallel")))
            result = json.loads((Path(t["trial_dir"]) / "result.json").read_text())
            timed = result["iteration_times_s"][-result["timed_iterations"]:]
            row = pooled.setdefault(key, {"times": [], "busy": []})
            row["times"] += timed
            row["busy"].append(t.get("other_processes_cores"))
    return pooled


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path)
    ap.add_argument("outputs", type=Path, nargs="+")
    ap.add_argument("--json", type=Path, metavar="FILE")
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    meas = load_measurements(spec, profiles_dir())
    pooled = trial_times(args.outputs)
    rows = []
    for key in sorted(pooled):
        pp, dp, tmp, mbs, zero, recompute, sp = key
        e = estimate(spec, pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero,
                     activation_checkpointing=recompute, sequence_parallel=sp,
                     measurements=meas, partition="uniform" if pp > 1 else "optimal")
        times = pooled[key]["times"]
        rows.append({"pp": pp, "dp": dp, "tmp": tmp, "mbs": mbs, "zero_stage": zero,
                     "recompute": recompute, "sequence_parallel": sp,
                     "iterations": len(times), "measured_mean_s": statistics.fmean(times),
                     "measured_min_s": min(times), "predicted_s": e.iteration_time_s,
                     "tensor_parallel_s": e.breakdown.tensor_parallel_s,
                     "other_processes_cores": pooled[key]["busy"]})
    print(f"{'strategy':>24} {'sp':>3} {'n':>3} {'mean s':>7} {'min s':>7} {'pred s':>7}")
    for r in rows:
        label = f"pp{r['pp']}-dp{r['dp']}-tmp{r['tmp']}-mbs{r['mbs']}-z{r['zero_stage']}"
        print(f"{label:>24} {'on' if r['sequence_parallel'] else 'off':>3} "
              f"{r['iterations']:>3} {r['measured_mean_s']:>7.3f} {r['measured_min_s']:>7.3f} "
              f"{r['predicted_s']:>7.3f}")
    print("sequence parallel / without:")
    index = {(r["pp"], r["dp"], r["tmp"], r["mbs"], r["zero_stage"], r["recompute"],
              r["sequence_parallel"]): r for r in rows}
    pairs = []
    for k, on in index.items():
        off = index.get(k[:-1] + (False,))
        if not k[-1] or off is None:
            continue
        p = {"mbs": k[3], "measured_mean": on["measured_mean_s"] / off["measured_mean_s"],
             "measured_min": on["measured_min_s"] / off["measured_min_s"],
             "predicted": on["predicted_s"] / off["predicted_s"]}
        pairs.append(p)
        print(f"  mbs {k[3]}: measured {p['measured_mean']:.2f}x (mean) "
              f"{p['measured_min']:.2f}x (min), predicted {p['predicted']:.2f}x")
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "pairs": pairs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
