"""The event simulator against DeepSpeed's own instruction timings.

    python benchmarks/instruction_timing.py [configs/cpu-local.yaml] [--out DIR]
        [--iters 10] [--warmup 4] [--cases pp2-gas4,pp2-gas8,pp2-uneven,pp1-dp2]
        [--json FILE]

Runs a few short real CPU trials of the spec's model (local torchrun, gloo, one OpenMP thread
per process) with `instruction_trace` on, so that every rank records the start and end of
each DeepSpeed instruction of the timed iterations (amp_search.trial.instructions), and
simulates the same strategy, partition and placement with `amp_search.simulate` (the layer
and link profiles shipped in profiles/, DeepSpeed's blocking P2P), twice: with the shipped
calibration (what `plan` uses) and with the profiles alone (no coefficient).

Per stage it prints, as seconds per iteration (the mean over the timed iterations):

    forward, backward, optimizer   the compute the instructions / tasks of that kind took
    p2p                            time blocked in SendActivation / RecvActivation / SendGrad /
                                   RecvGrad, waiting for the peer included (the simulator:
                                   its blocking send / receive tasks, rendezvous included)
    dp sync                        ReduceGrads + ReduceTiedGrads (simulated: the time a dp
                                   collective is in flight while the stage does not compute;
                                   ZeRO 0/1 reduce after the last instruction, so all of it;
                                   ZeRO 3's gathers and reduce-scatters overlap the layers)
    comm blocked                   p2p + dp sync: the exposed communication as the compute
                                   thread sees it (the simulator's `exposed_comm_s` counts only
                                   time with a transfer in flight, not the wait for a peer; it
                                   is in the JSON as exposed_comm_in_flight)
    idle (bubble)                  makespan - forward - backward - optimizer
    makespan                       the last instruction's end over all ranks, from the
                                   iteration's barrier (simulated: `makespan_s`)

and the trial's own measured mean (result.json) against the simulated iteration time (the
makespan + the calibrated per-iteration overhead). For each case it writes, under --out, the
measured instructions of the median iteration and the simulated iteration as Chrome traces
(`amp-search timeline --trace`'s format), and one trace with both (open in ui.perfetto.dev).

The trials are not recorded in the results database (they are instrumented, and short); the
trial directories stay under --out. A benchmark: it reads the command line; the library code
it calls does not.

Findings, 2026-11-22 (`--iters 14 --warmup 4`, two runs at 15:50 and 16:12 UTC; other
programs kept 1.0 to 1.4 of the 2 cores busy during every trial, so each measured figure is
high by that load; pairs below are run 1, run 2):

- Order and P2P. Every rank runs `deepspeed_train_order` exactly (tests/
  test_instruction_trace.py). A send returns in 0.3-0.4 ms when its receiver already
  waits, and otherwise blocks until the receiver posts (a SendGrad of 45 ms): the
  rendezvous that p2p_mode "blocking" assumes.
- Shape. The bubble (idle share of the makespan), measured / simulated, pp 2: stage 0
  33/35 and 30/35 % (gas 4), 27/28 and 31/28 % (gas 8), 62/70 and 64/70 % (uneven 2/4
  split); stage 1 10/17 and 12/17, 11/11 and 9/11, 8/8 and 5/8 %. Scaled to the measured
  compute level (measured forward + backward = 1.10 to 1.64 x simulated), the pp 2
  makespans are within -1 % to -13 % of the measured ones.
- Level. Per pass the profile's times are 10-25 % under the median instruction and 5-8 %
  under the fastest (pp2-gas4 stage 0: forward 27 ms simulated, 31 ms median, 27.8 ms
  fastest; backward 47.6 / 55 / 50.8 ms). The measured time outside the instructions is
  under 1 ms per iteration, so the calibration's 0.119 s step overhead, which brings the
  simulated iteration to -8 to -14 % of the measured one for the even pp 2 splits, stands
  in for slower compute, not for a per-iteration cost.
- Optimizer step. The last stage's OptimizerStep takes 45-70 ms against 6 ms simulated:
  gradient clipping (the trials' gradient_clipping 1.0) all-reduces the gradient norm over
  the pipeline, so every stage's step ends within 2 ms of stage 0's. The simulator steps
  each stage on its own; stage 0 ends last in 1F1B, so the makespan does not move.
- dp 2, ZeRO 0. ReduceGrads takes 64 / 124 ms against a simulated 18 ms all-reduce of the
  17 MB of fp32 gradients (calibrated link; 6 ms on the link profile alone): DeepSpeed's
  allreduce_gradients also flattens and copies the buckets on the host, which the link
  profile (bare all-reduces) does not hold.
- ZeRO 3 (the plain engine, dp 2). Measured 1.27 / 1.29 s (median iteration) against 0.51 s
  simulated and 0.60 s by the closed form: forward and backward take 3.4-3.6 x the
  profile's time (ZeRO 3's per-module fetch / release hooks on the host), where the
  simulator's per-layer gathers expose 24 ms. Scaled to the measured compute level the
  simulation is within +5 / +8 %: the host cost of ZeRO 3's hooks is the missing term.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search.launch.launchers import LaunchContext, build_launch  # noqa: E402
from amp_search.launch.orchestrator import PACKAGE_ROOT, _free_port  # noqa: E402
from amp_search.launch.process import run_commands  # noqa: E402
from amp_search.machine_load import OtherLoad  # noqa: E402
from amp_search.records import Strategy  # noqa: E402
from amp_search.trial.config import trial_config, trial_env  # noqa: E402
from amp_search.trial.instructions import chrome_trace as measured_trace  # noqa: E402
from amp_search.trial.instructions import read_traces  # noqa: E402
from amp_search.trial.ranks import assign_ranks  # noqa: E402

CASES = {
    # name: (pp, dp, mbs, partition or None for even, zero)
    "pp2-gas4": (2, 1, 4, None, 0),
    "pp2-gas8": (2, 1, 2, None, 0),
    "pp2-uneven": (2, 1, 4, (0, 2), 0),
    "pp1-dp2": (1, 2, 2, None, 0),
    "pp1-dp2-z3": (1, 2, 2, None, 3),
}
"""The trials: pp2 dp1 with gas 4 and 8 (even split), pp2 with an uneven split, pp1 dp2 with
ZeRO 0 (DeepSpeed's pipeline engine with one stage) and with ZeRO 3 (the plain engine: its
gathers and reduce-scatters run inside the timed forward and backward calls, so there the
measured forward and backward include the exposed part of ZeRO 3's communication)."""

QUANTITIES = ("forward", "backward", "optimizer", "p2p", "dp_sync", "comm_blocked", "idle")


def case_strategy(spec, name: str) -> Strategy:
    """The strategy of case `name` on the spec's first devices, placed in device order."""
    pp, dp, mbs, head, zero = CASES[name]
    L = len(spec.model.layers)
    partition = (0, *head[1:], L) if head else tuple(round(L * j / pp) for j in range(pp + 1))
    dev = iter(range(pp * dp))
    placement = tuple(tuple((next(dev),) for _ in range(dp)) for _ in range(pp))
    return Strategy(pp=pp, dp=dp, tmp=1, mbs=mbs, global_batch_size=spec.training.global_batch_size,
                    partition=partition, placement=placement, placement_order="given",
                    zero_stage=zero)


def run_traced_trial(spec, strategy: Strategy, trial_dir: Path, *, iters: int, warmup: int,
                     timeout_s: float = 600.0, python: str = sys.executable):
    """Run one real trial of `strategy` with the instruction trace on, in `trial_dir` (local
    torchrun); returns (ProcessOutcome, result dict or None, [RankTrace, ...])."""
    device_node = {d.id: (d.node, d.local_rank) for d in spec.cluster.devices}
    ranks = assign_ranks(strategy, device_node, {n.id: "localhost" for n in spec.cluster.nodes})
    trial_dir = Path(trial_dir).resolve()         # the processes run inside it
    trial_dir.mkdir(parents=True, exist_ok=True)
    result_path = trial_dir / "result.json"
    cfg = trial_config(spec, strategy, ranks, iters=iters, warmup=warmup, seed=1234,
                       output=str(result_path))
    cfg = replace(cfg, instruction_trace=True)
    config_path = trial_dir / "trial.json"
    cfg.write(config_path)
    env = trial_env(cfg.device, "deepspeed", str(PACKAGE_ROOT))
    ctx = LaunchContext(python=python, workdir=trial_dir, device=cfg.device,
                        master_port=_free_port(), trial_env=env)
    launch = build_launch("local", ranks, ctx, config_path)
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    load = OtherLoad()
    outcome = run_commands(launch.commands, base_env={**base, **env}, cwd=trial_dir,
                           log_path=trial_dir / "log.txt", timeout_s=timeout_s)
    try:
        result = json.loads(result_path.read_text())
        result["other_processes_cores"] = load.others_cores()
        result_path.write_text(json.dumps(result, indent=1))
    except (OSError, ValueError):
        result = None
    return outcome, result, read_traces(trial_dir)


# ----------------------------------------------------------------------------- measured

def measured_stage_times(traces) -> tuple[dict, list[float]]:
    """Per stage, the median over the timed iterations of each quantity (seconds; a stage's
    replicas and tensor ranks averaged; the median, as other programs on a shared machine
    slow some iterations), and each iteration's makespan (the last instruction's end over
    all ranks)."""
    n_it = min(len(t.iterations) for t in traces)
    makespans = [max(t.iterations[i][-1].end_s for t in traces if t.iterations[i])
                 for i in range(n_it)]
    pp = traces[0].pp
    out = {}
    for j in range(pp):
        rows = {q: [] for q in QUANTITIES}
        for t in (t for t in traces if t.stage == j):
            for i in range(n_it):
                by = {}
                for x in t.iterations[i]:
                    by[x.name] = by.get(x.name, 0.0) + x.duration_s
                fwd, bwd = by.get("ForwardPass", 0.0), by.get("BackwardPass", 0.0)
                opt = by.get("OptimizerStep", 0.0)
                p2p = sum(by.get(k, 0.0) for k in ("SendActivation", "RecvActivation",
                                                   "SendGrad", "RecvGrad"))
                dps = by.get("ReduceGrads", 0.0) + by.get("ReduceTiedGrads", 0.0)
                for q, v in (("forward", fwd), ("backward", bwd), ("optimizer", opt),
                             ("p2p", p2p), ("dp_sync", dps), ("comm_blocked", p2p + dps),
                             ("idle", makespans[i] - fwd - bwd - opt)):
                    rows[q].append(v)
        # rows hold rank after rank, each its iterations: v[i::n_it] is iteration i
        out[j] = {q: statistics.median(statistics.fmean(v[i::n_it]) for i in range(n_it))
                  for q, v in rows.items()}
        out[j]["makespan"] = statistics.median(makespans)
    return out, makespans


# ----------------------------------------------------------------------------- simulated

def _union(start, end) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for a, b in sorted(zip(start.tolist(), end.tolist())):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        elif b > a:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _uncovered(start, end, cover_start, cover_end) -> float:
    """Length of the union of [start, end) less the part the union of the cover holds."""
    total = 0.0
    cover = _union(cover_start, cover_end)
    for a, b in _union(start, end):
        covered = sum(max(0.0, min(b, d) - max(a, c)) for c, d in cover)
        total += (b - a) - covered
    return total


def simulated_stage_times(sim) -> dict:
    """The same quantities of a simulated iteration (cost_models.simulator.SimulatedIteration)."""
    from cost_models.simulator import KINDS, STREAMS

    t = sim.table
    dur = t.end_s - t.start_s
    compute = t.stream == STREAMS.index("compute")
    dp_stream = t.stream == STREAMS.index("dp")
    out = {}
    for j in range(sim.pp):
        on = t.stage == j

        def total(kinds, where):
            sel = on & where & np.isin(t.kind, [KINDS.index(k) for k in kinds])
            return float(dur[sel].sum())

        fwd = total(("forward",), compute)
        bwd = total(("backward", "recompute"), compute)
        opt = total(("optimizer",), compute)
        p2p = total(("send", "recv"), compute)
        busy = on & compute & np.isin(t.kind, [KINDS.index(k) for k in
                                               ("forward", "backward", "recompute",
                                                "optimizer")])
        dps = _uncovered(t.start_s[on & dp_stream], t.end_s[on & dp_stream],
                         t.start_s[busy], t.end_s[busy])
        out[j] = {"forward": fwd, "backward": bwd, "optimizer": opt, "p2p": p2p,
                  "dp_sync": dps, "comm_blocked": p2p + dps,
                  "exposed_comm_in_flight": sim.exposed_comm_s[j],
                  "idle": sim.idle_s[j], "makespan": sim.makespan_s}
    return out


def simulate_case(spec, strategy: Strategy, calibrated: bool):
    from cost_models.params import CostParams

    from amp_search.measurements import load_measurements
    from amp_search.costing import CostModel
    from amp_search.planner import evaluate
    from amp_search.resources import profiles_dir
    from amp_search.simulate import simulate

    m = load_measurements(spec, profiles_dir())
    model = CostModel(spec, measurements=m, cost_params=None if calibrated else CostParams())
    closed = evaluate(spec, strategy, model=model).analytic_iteration_time_s
    return simulate(model, strategy), model.sources(), closed


# ----------------------------------------------------------------------------- report

def both_traces(measured: dict, sim, pp: int) -> dict:
    """The measured and the simulated trace in one file: the simulated stages as processes
    100 + j, after the measured ranks."""
    from amp_search.timeline import chrome_trace

    simulated = chrome_trace(sim, stage_names=[f"simulated stage {j}" for j in range(pp)])
    events = list(measured["traceEvents"])
    for e in simulated["traceEvents"]:
        e = dict(e, pid=100 + e["pid"])
        if e.get("name") == "process_sort_index":
            e["args"] = {"sort_index": 100 + e["args"]["sort_index"]}
        events.append(e)
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "amp-search measured instructions and simulated iteration"}}


def _rel(sim: float, meas: float) -> str:
    if meas <= 1e-6:
        return "   -" if sim <= 1e-6 else "  new"
    return f"{sim / meas - 1:+5.0%}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("spec", type=Path, nargs="?", default=ROOT / "configs" / "cpu-local.yaml")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "instruction_timing")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, of {', '.join(CASES)}")
    ap.add_argument("--reuse", action="store_true",
                    help="read the traces of trials already under --out instead of running")
    ap.add_argument("--json", type=Path, help="write every figure")
    args = ap.parse_args(argv)
    from amp_search.spec import load_spec
    from amp_search.timeline import write_chrome_trace

    spec = load_spec(args.spec)
    names = [n.strip() for n in args.cases.split(",") if n.strip()]
    for n in names:
        if n not in CASES:
            print(f"--cases: unknown case {n!r}; known: {', '.join(CASES)}", file=sys.stderr)
            return 2
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict = {"spec": str(args.spec), "iters": args.iters, "warmup": args.warmup,
                    "cases": {}}
    for name in names:
        s = case_strategy(spec, name)
        trial_dir = args.out / name
        if args.reuse:
            result = json.loads((trial_dir / "result.json").read_text())
            traces, wall = read_traces(trial_dir), None
        else:
            t0 = time.monotonic()
            outcome, result, traces = run_traced_trial(spec, s, trial_dir, iters=args.iters,
                                                       warmup=args.warmup)
            wall = time.monotonic() - t0
            if not outcome.ok or result is None or not traces:
                print(f"{name}: the trial failed (exit codes {list(outcome.returncodes)}); "
                      f"see {trial_dir / 'log.txt'}")
                report["cases"][name] = {"status": "failed"}
                continue
        meas, makespans = measured_stage_times(traces)
        sims, closed = {}, {}
        for key, calibrated in (("calibrated", True), ("profile_only", False)):
            sim, sources, closed[key] = simulate_case(spec, s, calibrated)
            sims[key] = (sim, simulated_stage_times(sim))
        sim = sims["calibrated"][0]
        median_it = int(np.argsort(makespans)[len(makespans) // 2])
        mtrace = measured_trace(traces, median_it)
        for suffix, data in (("measured", mtrace), ("both", both_traces(mtrace, sim, s.pp))):
            (args.out / f"{name}.{suffix}.trace.json").write_text(
                json.dumps(data, separators=(",", ":")))
        write_chrome_trace(sim, args.out / f"{name}.simulated.trace.json")

        others = result.get("other_processes_cores")
        print(f"\n== {name}: {s.label()} partition {list(s.partition)} gas {s.gas}; "
              f"{len(makespans)} timed iterations" + (f", trial {wall:.0f} s" if wall else "")
              + (f"; other programs kept {others:.2f} cores busy meanwhile"
                 if others is not None else ""))
        print(f"   measured iteration (result.json) mean {result['mean_s']:.4f} s, median "
              f"{statistics.median(result['iteration_times_s'][args.warmup:]):.4f} s; simulated "
              f"{sim.iteration_time_s:.4f} s calibrated ({_rel(sim.iteration_time_s, result['mean_s'])}),"
              f" {sims['profile_only'][0].iteration_time_s:.4f} s profile only "
              f"({_rel(sims['profile_only'][0].iteration_time_s, result['mean_s'])}); closed "
              f"form (eq. 5 + 4, calibrated) {closed['calibrated']:.4f} s "
              f"({_rel(closed['calibrated'], result['mean_s'])})")
        print(f"   {'stage':>5} {'quantity':>13} {'measured':>9} {'sim cal':>9} {'diff':>6} "
              f"{'sim prof':>9} {'diff':>6}")
        rows = {}
        for j in range(s.pp):
            for q in QUANTITIES + ("makespan",):
                if q == "makespan" and j > 0:
                    continue
                m = meas[j][q]
                a, b = sims["calibrated"][1][j][q], sims["profile_only"][1][j][q]
                rows[f"{j}.{q}"] = {"measured_s": m, "simulated_calibrated_s": a,
                                    "simulated_profile_only_s": b}
                print(f"   {j if q != 'makespan' else 'all':>5} {q:>13} {m:9.4f} {a:9.4f} "
                      f"{_rel(a, m):>6} {b:9.4f} {_rel(b, m):>6}")
        # the shape, apart from the level: scale the simulation by the measured compute
        sim_rows = sims["calibrated"][1]
        m_comp = sum(meas[j]["forward"] + meas[j]["backward"] for j in range(s.pp))
        s_comp = sum(sim_rows[j]["forward"] + sim_rows[j]["backward"] for j in range(s.pp))
        level = m_comp / s_comp if s_comp > 0 else float("nan")
        m_span = meas[0]["makespan"]
        share = {
            "measured_idle_share": [meas[j]["idle"] / m_span for j in range(s.pp)],
            "simulated_idle_share": [sim_rows[j]["idle"] / sim.makespan_s for j in range(s.pp)],
            "measured_comm_blocked_share": [meas[j]["comm_blocked"] / m_span
                                            for j in range(s.pp)],
            "simulated_comm_blocked_share": [sim_rows[j]["comm_blocked"] / sim.makespan_s
                                             for j in range(s.pp)]}
        print(f"   level: measured forward+backward = {level:.2f} x simulated (calibrated); "
              f"simulated makespan x {level:.2f} = {sim.makespan_s * level:.4f} s against "
              f"{m_span:.4f} s measured ({_rel(sim.makespan_s * level, m_span)})")
        print("   share of the makespan, measured / simulated: idle " + ", ".join(
            f"stage {j} {a:.0%} / {b:.0%}" for j, (a, b) in enumerate(
                zip(share["measured_idle_share"], share["simulated_idle_share"])))
              + "; comm blocked " + ", ".join(
            f"stage {j} {a:.0%} / {b:.0%}" for j, (a, b) in enumerate(
                zip(share["measured_comm_blocked_share"],
                    share["simulated_comm_blocked_share"]))))
        timed = result["iteration_times_s"][args.warmup:]
        report["cases"][name] = {
            "status": "ok", "level": level, "shares": share,
            "measured_median_s": statistics.median(timed), "strategy": s.to_dict(), "gas": s.gas,
            "measured_mean_s": result["mean_s"],
            "measured_iteration_times_s": result["iteration_times_s"],
            "measured_makespans_s": makespans,
            "simulated_iteration_time_s": {k: v[0].iteration_time_s for k, v in sims.items()},
            "closed_form_iteration_time_s": closed,
            "simulated_makespan_s": {k: v[0].makespan_s for k, v in sims.items()},
            "stages": rows, "trial_wall_s": wall, "measurements": sources,
            "other_processes_cores": others,
            "simulated_exposed_comm_in_flight_s": {
                k: list(v[0].exposed_comm_s) for k, v in sims.items()}}
    print("\nsim cal: simulated with the shipped calibration (as `plan`); sim prof: the layer "
          "and link profiles alone. diff: simulated / measured - 1. Traces (Perfetto): "
          f"{args.out}/<case>.{{measured,simulated,both}}.trace.json")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
