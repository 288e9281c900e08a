"""Time amp_search.partition.optimal_partition on GPT-like chains, and compare it with AMP's DP.

Chains are an embedding, N transformer blocks and a large LM head, with L = N + 2 layers.
Stage j's per-layer times are the base times scaled by the speed of its device type (H100,
A100 and V100-like factors 1.0 / 1.8 / 3.2, drawn per stage). Cut costs are a constant
per stage link. --jitter adds per-(stage, layer) noise, which makes almost every stage
time distinct. That is a harder case for the search than profiled cost models, where all
blocks cost the same.

Reported per (N, pp):
  * median per-call time with gas = 1, and the median / 90th percentile / max per-call
    time over gas in {2, 4, 8, 16, 32, 64, 128} and several speed draws, each timed warm
    as the median of --repeats calls;
  * the median and max number of f(cap) solves of the branch and bound (see partition_kernels.py).
The first call in a fresh process, with an empty numba cache (JIT compile) and then with
the on-disk cache, is timed in subprocesses. Then AMP's own O(pp * L^4) DP (paper §3.5,
eq. 6-8, dp[i][j][m] over every stage time m; compiled with numba here) runs on the N = 24
chain and must give the same objective; the script exits 1 when it does not.

--mode full (or all, the default) times the full objective instead: eq. 5 + the data-parallel
sync term of AMP eq. 4, under per-stage memory budgets (optimal_partition's sync_* and
memory_* arrays), on the N = 128 chain (L = 130) or the --full-blocks ones. Per-layer
parameters are 1 per block and 2 blocks' worth for the embedding and for the head; stage j's
sync is its parameters times a per-stage coefficient drawn from 1 / 4 / 16 ms per block
(NVLink-, InfiniBand- and Ethernet-like data-parallel rings) plus a latency part of up to
0.5 ms. Per-layer memory is 0.8 GB per block of parameters (mixed-precision Adam) plus
0.2 GB of activations per block and in-flight micro-batch, min(pp - j, gas) on stage j
(1F1B). Stage j's budget is its device type's memory (80 / 40 / 32 GB) times kappa, with
kappa = `tightness` x the least kappa at which some split fits: 1.02 (tight), 1.25 and
2.0 (loose), and one case without memory arrays. Reported per (N, pp), over the gas sweep
with gas = 1 included and the four memory cases: median / p90 / max per-call time, the
median and max number of f solves, and what optimising eq. 5 alone would have cost: the
share of the memory-constrained cases where the eq. 5 split breaks a budget, and the median
and max excess of the eq. 5 split's full objective over the optimum where it fits.

Times are the calling thread's CPU time (time.thread_time), which other processes sharing
the machine do not inflate, median over --repeats calls after a warm-up call.

    python benchmarks/partition_dp.py [--mode all|eq5|full] [--repeats 15] [--draws 4]
                                      [--jitter 0.0] [--full-blocks 128] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numba
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script from anywhere; PYTHONPATH still wins
    sys.path.append(str(ROOT))

from amp_search import partition_kernels  # noqa: E402
from amp_search.partition import optimal_partition, pipeline_objective  # noqa: E402

SPEEDS = (1.0, 1.8, 3.2)  # time factor per device type (H100-, A100-, V100-like)
DEVICE_GB = (80.0, 40.0, 32.0)  # memory per device type
SYNC_S_PER_BLOCK = (1e-3, 4e-3, 16e-3)  # per-stage DP ring: NVLink-, IB-, Ethernet-like
TIGHTNESS = (1.02, 1.25, 2.0, None)  # memory budget factor; None: no memory arrays
GAS_SWEEP = (2, 4, 8, 16, 32, 64, 128)
BLOCKS = (24, 96, 128)
PPS = (2, 4, 8, 16, 32, 64)


def gpt_chain(blocks: int, pp: int, rng, *, jitter: float = 0.0, head_blocks: float = 2.6):
    """(stage_layer_time_s, cut_cost_s) for embedding + `blocks` blocks + head on pp stages."""
    L = blocks + 2
    base = np.r_[0.05, np.ones(blocks), head_blocks] * 10e-3  # one block: 10 ms
    speed = rng.choice(SPEEDS, size=pp)
    times = np.outer(speed, base)
    if jitter:
        times *= 1.0 + jitter * rng.standard_normal((pp, L)).clip(-3, 3)
    cuts = np.zeros((pp, L + 1))
    cuts[1:, 1:L] = rng.choice([0.2e-3, 2e-3], size=(pp - 1, 1))  # NVLink- or IB-like link
    return times, cuts


def gpt_chain_full(blocks: int, pp: int, rng, gas: int, tightness, *, jitter: float = 0.0):
    """gpt_chain plus sync and memory arrays (module docstring): a dict of optimal_partition's
    arguments after gas."""
    L = blocks + 2
    kind = rng.integers(0, len(SPEEDS), size=pp)  # device type per stage
    base = np.r_[0.05, np.ones(blocks), 2.6] * 10e-3
    times = np.outer(np.array(SPEEDS)[kind], base)
    if jitter:
        times *= 1.0 + jitter * rng.standard_normal((pp, L)).clip(-3, 3)
    cuts = np.zeros((pp, L + 1))
    cuts[1:, 1:L] = rng.choice([0.2e-3, 2e-3], size=(pp - 1, 1))
    params = np.r_[2.0, np.ones(blocks), 2.0]  # in blocks of parameters
    args = dict(stage_layer_time_s=times, cut_cost_s=cuts,
                sync_layer_s=np.outer(rng.choice(SYNC_S_PER_BLOCK, size=pp), params),
                sync_fixed_s=rng.uniform(0.0, 0.5e-3, size=pp))
    if tightness is None:
        return args
    activations = np.r_[0.1, np.ones(blocks), 0.5] * 0.2e9  # per in-flight micro-batch
    in_flight = np.minimum(pp - np.arange(pp), gas)
    mem = np.round(params[None, :] * 0.8e9 + activations[None, :] * in_flight[:, None])
    device = np.array(DEVICE_GB)[kind] * 1e9
    # the least kappa for which some split has every mem_j <= kappa * device_j
    share = partition_kernels._prefix(mem / device[:, None])
    kappa = partition_kernels._min_bottleneck(share, np.zeros(pp), share, np.zeros(pp), False,
                                              np.inf, np.empty((pp, L + 1)))
    args.update(memory_layer_bytes=mem, memory_budget_bytes=np.floor(device * kappa * tightness))
    return args


@numba.njit(cache=True)
def amp_paper_dp(times, cut, gas):
    """AMP §3.5 as published: dp[j][i][k] = min over splits of layers [0, i) into stages
    0..j of eq. 6 with tolerance m = ms[k], i.e. (gas-1)*max(0, max_j T_j - m) + sum T + sum
    e (eq. 7 base case, eq. 8 recursion, tolerance passed on as max(t2, m)). ms holds 0 and
    every stage time of every stage; returns (dp[pp-1][L][index of 0], K). O(pp L^2 K), with
    K = O(pp L^2) tolerances (the paper counts K = O(L^2) for identical stages: O(pp L^4))."""
    pp, L = times.shape
    prefix = np.zeros((pp, L + 1))
    for j in range(pp):
        for l in range(L):
            prefix[j, l + 1] = prefix[j, l] + times[j, l]
    vals = [0.0]
    for j in range(pp):
        for a in range(L):
            for b in range(a + 1, L + 1):
                vals.append(prefix[j, b] - prefix[j, a])
    ms = np.unique(np.array(vals))
    K = ms.size
    seg_k = np.zeros((pp, L + 1, L + 1), dtype=np.int64)  # index in ms of stage time [a, b)
    for j in range(pp):
        for a in range(L):
            for b in range(a + 1, L + 1):
                seg_k[j, a, b] = np.searchsorted(ms, prefix[j, b] - prefix[j, a])
    lam = gas - 1.0
    dp = np.full((pp, L + 1, K), np.inf)
    for i in range(1, L + 1):  # base case (eq. 7): one stage holds layers [0, i)
        t = prefix[0, i] - prefix[0, 0]
        for k in range(K):
            dp[0, i, k] = lam * max(0.0, t - ms[k]) + t
    for j in range(1, pp):  # recursion (eq. 8): last cut at i2, stage j holds [i2, i)
        for i in range(j + 1, L + 1):
            for i2 in range(j, i):
                t2 = prefix[j, i] - prefix[j, i2]
                k2 = seg_k[j, i2, i]
                e = cut[j, i2]
                for k in range(K):
                    if t2 > ms[k]:
                        v = dp[j - 1, i2, k2] + lam * (t2 - ms[k]) + t2 + e
                    else:
                        v = dp[j - 1, i2, k] + t2 + e
                    if v < dp[j, i, k]:
                        dp[j, i, k] = v
    return dp[pp - 1, L, 0], K


def per_call_s(fn, repeats: int) -> float:
    fn()  # warm
    times = []
    for _ in range(repeats):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times)


def first_call_s() -> dict:
    """First optimal_partition call in a fresh process: cold numba cache, then cached."""
    code = (
        "import sys, time; sys.path.append(sys.argv[1]); import numpy as np; "
        "t, c = time.perf_counter(), time.process_time(); "
        "from amp_search.partition import optimal_partition; "
        "optimal_partition(np.ones((4, 26)), np.zeros((4, 27)), 8); "
        "print(time.perf_counter() - t, time.process_time() - c)"
    )
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for label in ("compile", "cached"):
            run = subprocess.run([sys.executable, "-c", code, str(ROOT)], env=env,
                                 capture_output=True, text=True, check=True)
            wall, cpu = map(float, run.stdout.strip().splitlines()[-1].split())
            out[label] = {"wall_s": wall, "cpu_s": cpu}
    return out


def solves(times, cuts, gas, sync_layer_s=None, sync_fixed_s=None, memory_layer_bytes=None,
           memory_budget_bytes=None) -> int:
    pp = times.shape[0]
    none2, zero = np.zeros((0, 0)), np.zeros(pp)
    has_sync, has_mem = sync_layer_s is not None, memory_layer_bytes is not None
    return int(partition_kernels.solve(
        np.ascontiguousarray(times), cuts, gas,
        sync_layer_s if has_sync else none2, sync_fixed_s if has_sync else zero, has_sync,
        memory_layer_bytes if has_mem else none2, memory_budget_bytes if has_mem else zero,
        has_mem)[4])


def full_rows(args, rng) -> list[dict]:
    """The full-objective table (module docstring), printed as it goes."""
    print(f"\nfull objective: eq. 5 + max_j sync_j under memory budgets, per-call times in "
          f"microseconds,\njitter={args.jitter}, {args.draws} speed/link draws, gas in "
          f"(1,) + {GAS_SWEEP}, memory tightness {TIGHTNESS}\n")
    head = (f"{'N':>4} {'L':>4} {'pp':>3} | {'gas=1':>7} | {'median':>7} {'p90':>7} {'max':>7}"
            f" | {'solves med/max':>14} | {'eq.5 split: OOM':>15} {'excess med/max':>15}")
    print(head)
    print("-" * len(head))
    rows = []
    for blocks in args.full_blocks:
        for pp in (pp for pp in PPS if pp <= blocks + 2):
            t1, tg, ks, oom, excess = [], [], [], 0, []
            mem_cases = 0
            for _ in range(args.draws):
                for gas in (1, *GAS_SWEEP):
                    for tightness in TIGHTNESS:
                        kw = gpt_chain_full(blocks, pp, rng, gas, tightness, jitter=args.jitter)
                        times, cuts = kw["stage_layer_time_s"], kw["cut_cost_s"]
                        extra = {k: v for k, v in kw.items() if k.startswith(("sync", "memory"))}
                        t = per_call_s(lambda: optimal_partition(gas=gas, **kw), args.repeats)
                        (t1 if gas == 1 else tg).append(t)
                        ks.append(solves(times, cuts, gas, **extra))
                        best = optimal_partition(gas=gas, **kw)
                        b = optimal_partition(times, cuts, gas).boundaries  # eq. 5 alone
                        mem_cases += tightness is not None
                        if best is None:
                            continue
                        mem, budget = kw.get("memory_layer_bytes"), kw.get("memory_budget_bytes")
                        if mem is not None and any(mem[j, b[j]:b[j + 1]].sum() > budget[j]
                                                   for j in range(pp)):
                            oom += 1
                            continue
                        full = pipeline_objective(times, cuts, gas, b,
                                                  sync_layer_s=kw["sync_layer_s"],
                                                  sync_fixed_s=kw["sync_fixed_s"])
                        if full < best.objective_s * (1 - 1e-9):
                            raise SystemExit(f"eq. 5 split beats the optimum: {full} < "
                                             f"{best.objective_s} (pp={pp}, gas={gas})")
                        excess.append(full / best.objective_s - 1.0)
            row = dict(blocks=blocks, layers=blocks + 2, pp=pp,
                       gas1_us=1e6 * statistics.median(t1),
                       median_us=1e6 * statistics.median(tg),
                       p90_us=1e6 * float(np.percentile(tg, 90)), max_us=1e6 * max(tg),
                       solves_median=statistics.median(ks), solves_max=max(ks),
                       eq5_oom_share=oom / mem_cases,
                       eq5_excess_median=max(0.0, statistics.median(excess)),
                       eq5_excess_max=max(0.0, max(excess)))
            rows.append(row)
            print(f"{blocks:>4} {blocks + 2:>4} {pp:>3} | {row['gas1_us']:>7.1f} | "
                  f"{row['median_us']:>7.1f} {row['p90_us']:>7.1f} {row['max_us']:>7.1f} | "
                  f"{row['solves_median']:>6.0f} / {row['solves_max']:<5d} | "
                  f"{100 * row['eq5_oom_share']:>14.0f}% "
                  f"{100 * row['eq5_excess_median']:>6.1f}% / {100 * row['eq5_excess_max']:.1f}%")
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15, help="timed calls per instance")
    ap.add_argument("--draws", type=int, default=4, help="random stage-speed draws per row")
    ap.add_argument("--jitter", type=float, default=0.0, help="relative per-layer noise")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=("all", "eq5", "full"), default="all",
                    help="eq5: eq. 5 alone (and AMP's DP); full: with sync and memory")
    ap.add_argument("--full-blocks", type=int, nargs="+", default=[128],
                    help="blocks N of the chains for --mode full")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    if args.mode == "full":
        rows = full_rows(args, rng)
        if args.json:
            args.json.write_text(json.dumps(dict(jitter=args.jitter, gas_sweep=GAS_SWEEP,
                                                 full_rows=rows), indent=2))
        return 0

    first = first_call_s()
    print("first call in a fresh process (imports included): "
          f"{first['compile']['wall_s']:.2f} s wall / {first['compile']['cpu_s']:.2f} s CPU "
          f"with JIT compile, {first['cached']['wall_s']:.2f} s / "
          f"{first['cached']['cpu_s']:.2f} s from numba's on-disk cache")
    print(f"per-call times in microseconds, jitter={args.jitter}, {args.draws} speed draws, "
          f"gas sweep {GAS_SWEEP}\n")
    head = (f"{'N':>4} {'L':>4} {'pp':>3} | {'gas=1':>7} | {'median':>7} {'p90':>7} {'max':>7}"
            f" | {'solves med/max':>14}")
    print(head)
    print("-" * len(head))
    rows = []
    for blocks in BLOCKS:
        for pp in (pp for pp in PPS if pp <= blocks + 2):
            t1, tg, ks = [], [], []
            for _ in range(args.draws):
                times, cuts = gpt_chain(blocks, pp, rng, jitter=args.jitter)
                t1.append(per_call_s(lambda: optimal_partition(times, cuts, 1), args.repeats))
                for gas in GAS_SWEEP:
                    tg.append(per_call_s(lambda: optimal_partition(times, cuts, gas),
                                         args.repeats))
                    ks.append(solves(times, cuts, gas))
            row = dict(blocks=blocks, layers=blocks + 2, pp=pp,
                       gas1_us=1e6 * statistics.median(t1),
                       median_us=1e6 * statistics.median(tg),
                       p90_us=1e6 * float(np.percentile(tg, 90)), max_us=1e6 * max(tg),
                       solves_median=statistics.median(ks), solves_max=max(ks))
            rows.append(row)
            print(f"{blocks:>4} {blocks + 2:>4} {pp:>3} | {row['gas1_us']:>7.1f} | "
                  f"{row['median_us']:>7.1f} {row['p90_us']:>7.1f} {row['max_us']:>7.1f} | "
                  f"{row['solves_median']:>6.0f} / {row['solves_max']:<5d}")

    print("\nAMP's O(pp L^4) DP (numba) vs optimal_partition, N = 24 (L = 26), gas = 8;")
    print("jitter 0: few distinct stage times (small K); "
          "jitter 0.02: all distinct (K ~ pp L^2 / 2)")
    head = (f"{'jitter':>6} {'pp':>3} | {'K':>6} | {'AMP DP ms':>10} | {'ours us':>8} | "
            f"{'speed-up':>9} | objective equal")
    print(head)
    print("-" * len(head))
    amp_paper_dp(np.ones((2, 4)), np.zeros((2, 5)), 2)  # compile outside the timing
    paper = []
    for jitter in (0.0, 0.02):
        for pp in (2, 4, 8, 16):
            times, cuts = gpt_chain(24, pp, rng, jitter=jitter)
            ref, k = amp_paper_dp(times, cuts, 8)
            t_paper = per_call_s(lambda: amp_paper_dp(times, cuts, 8), 5)
            t_ours = per_call_s(lambda: optimal_partition(times, cuts, 8), args.repeats)
            ours = optimal_partition(times, cuts, 8).objective_s
            same = abs(ours - ref) <= 1e-9 * abs(ref)
            paper.append(dict(jitter=jitter, pp=pp, tolerances=k, amp_dp_s=t_paper,
                              ours_s=t_ours, speedup=t_paper / t_ours, amp_objective_s=ref,
                              our_objective_s=ours, equal=same))
            print(f"{jitter:>6} {pp:>3} | {k:>6} | {1e3 * t_paper:>10.1f} | {1e6 * t_ours:>8.1f} | "
                  f"{t_paper / t_ours:>8.0f}x | {same} ({ours:.6f} s)")

    full = full_rows(args, rng) if args.mode == "all" else []
    if args.json:
        args.json.write_text(json.dumps(dict(first_call_s=first, jitter=args.jitter,
                                             gas_sweep=GAS_SWEEP, rows=rows,
                                             amp_dp=paper, full_rows=full), indent=2))
    return 0 if all(p["equal"] for p in paper) else 1


if __name__ == "__main__":
    sys.exit(main())
