"""How fast bad input is refused, and how fast the simulator runs a large pipeline: the
wall-clock targets that the tests used to assert (tests check behaviour only; timing belongs
here, where a busy machine can be noticed and the run repeated).

Targets (each the median of --repeats runs, in this process):
- a malformed bandwidth string refused in under 1 s;
- each of the YAML limits (depth, aliases, cycles, values, size, documents, tags) refused in
  under 5 s; the billion-laughs document in under 2 s;
- /dev/zero and a FIFO with no writer, given as the spec, refused in under 5 s;
- the simulator: pp 64 x gas 1024 (0.26 million tasks) in under 1 s once compiled.

Exits 1 when a target is missed.

    python benchmarks/fail_fast.py [--repeats 3] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search.errors import SpecError, UsageError  # noqa: E402
from amp_search.spec import load_spec  # noqa: E402
from amp_search.units import NETWORK_BANDWIDTH, parse_bandwidth  # noqa: E402

BAD_BANDWIDTHS = ("1e999 GB/s", "0.5 Mbps", "101 TB/s", "0 Gbps", "nan Gbps", "1" * 10_000 + "x")
BAD_YAML = {
    "alias cycle": "a: &a [1, *a]\n",
    "depth 1000": "a: " + "[" * 1000 + "]" * 1000 + "\n",
    "depth by aliases": "a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30
                        + "\n",
    "1,001 aliases": "a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n",
    "100,001 values": "a: [" + ",".join(["1"] * 100_001) + "]\n",
    "two documents": "a: 1\n---\nb: 2\n",
    "python tag": "a: !!python/object/apply:os.system [ls]\n",
    "5,000-digit int": "a: " + "9" * 5000 + "\n",
}
BILLION_LAUGHS = ("a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefghi", "bcdefghij"))
    + "model:\n  name: *j\n")
TARGET_S = {"bandwidth": 1.0, "yaml": 5.0, "billion laughs": 2.0, "special file": 5.0,
            "simulate pp64 x gas1024": 1.0}


def timed(fn, repeats: int) -> float:
    """Median wall seconds of fn() over `repeats` runs."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def refused(fn, *errors):
    def run():
        try:
            fn()
        except errors:
            return
        raise SystemExit(f"expected {errors} from {fn}")
    return run


def large_pipeline():
    import numpy as np

    from cost_models.simulator import simulate_iteration

    pp, gas = 64, 1024
    f = np.random.default_rng(0).uniform(1e-3, 2e-3, pp)
    kw = dict(forward_s=f, backward_s=2 * f, optimizer_s=np.full(pp, 1e-3), gas=gas,
              p2p_bytes=np.full(pp - 1, 1e6), p2p_latency_s=np.full(pp - 1, 1e-5),
              p2p_bandwidth_bytes_per_s=np.full(pp - 1, 1e10), dp=4,
              gradient_bytes=np.full(pp, 2e9), dp_latency_s=np.full(pp, 1e-5),
              dp_bandwidth_bytes_per_s=np.full(pp, 1e10), overlap=True)
    simulate_iteration(**{**kw, "gas": 2})     # compile, or load numba's cache, first
    return lambda: simulate_iteration(**kw)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []                       # (group, case, seconds)
    for text in BAD_BANDWIDTHS:
        rows.append(("bandwidth", text[:20], timed(refused(
            lambda: parse_bandwidth(text, "x", NETWORK_BANDWIDTH), SpecError), args.repeats)))
    with tempfile.TemporaryDirectory() as tmp:
        for name, doc in BAD_YAML.items():
            path = Path(tmp) / "spec.yaml"
            path.write_text(doc)
            rows.append(("yaml", name, timed(refused(lambda: load_spec(path), SpecError),
                                             args.repeats)))
        path = Path(tmp) / "laughs.yaml"
        path.write_text(BILLION_LAUGHS)
        rows.append(("billion laughs", "9^9 aliases", timed(
            refused(lambda: load_spec(path), SpecError), args.repeats)))
        if os.path.exists("/dev/zero"):
            rows.append(("special file", "/dev/zero", timed(
                refused(lambda: load_spec("/dev/zero"), SpecError), args.repeats)))
        if hasattr(os, "mkfifo"):
            fifo = Path(tmp) / "fifo.yaml"
            os.mkfifo(fifo)
            rows.append(("special file", "FIFO, no writer", timed(
                refused(lambda: load_spec(fifo), UsageError), 1)))
    rows.append(("simulate pp64 x gas1024", "0.26 M tasks", timed(large_pipeline(),
                                                                   args.repeats)))
    missed = [(g, c, s) for g, c, s in rows if s >= TARGET_S[g]]
    print(f"{'group':<24} {'case':<22} {'median s':>9} {'target s':>9}")
    for g, c, s in rows:
        print(f"{g:<24} {c:<22} {s:9.3f} {TARGET_S[g]:9.1f}{'  MISSED' if s >= TARGET_S[g] else ''}")
    if args.json:
        args.json.write_text(json.dumps([{"group": g, "case": c, "median_s": s,
                                          "target_s": TARGET_S[g]} for g, c, s in rows],
                                        indent=1))
    print(f"{len(rows) - len(missed)} of {len(rows)} within target")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
