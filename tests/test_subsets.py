"""Which devices to use, at what cost: the cluster subsets the planner tries, their best plans
on the whole cluster's device ids, prices, objectives, the Pareto front (checked against brute
force on a small cluster), deadlines and budgets, and a launch on a subset's devices only."""
from __future__ import annotations

import itertools
import json
from dataclasses import replace
from pathlib import Path

import pytest

from amp_search.cli import main
from amp_search.planner import (MAX_SUBSETS, Dominated, choose_subset, cluster_subsets,
                                pareto_front, plan, plan_on_subset, plan_subsets,
                                start_subsets, subset_spec)
from amp_search.spec import load_spec, parse_spec, spec_fingerprint

ROOT = Path(__file__).resolve().parent.parent


def _priced(h100=2, a100=2, price=True, **training) -> dict:
    def group(gpu, count, bw, cost):
        g = {"gpu": gpu, "count": count, "gpus_per_node": 2, "intra_node_bandwidth": bw,
             "inter_node_bandwidth": "2 x 200 Gbps"}
        if price:
            g["price_per_hour"] = cost
        return g
    return {"cluster": {"nodes": [group("H100-80GB", h100, "450 GB/s", 24.6),
                                  group("A100-80GB", a100, "300 GB/s", 10.2)]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 2048,
                      "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
            "training": {"global_batch_size": 32, "precision": "bf16", "backend": "deepspeed",
                         "zero_stage": 1, "activation_checkpointing": "none",
                         "sequence_parallel": False, **training}}


def test_subsets_are_whole_nodes_groups_alone_then_most_devices_first_and_bounded():
    spec = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")      # 3 x 4 V100 + 1 x 4 T4
    subsets = cluster_subsets(spec.cluster)
    assert len(subsets) == 4 * 2 - 2             # (0..3 V100 nodes) x (0..1 T4) - none - all
    assert subsets[:2] == (((3, 4), (0, 0)), ((0, 0), (1, 4)))     # each group alone first
    gpus = [sum(n * k for n, k in u) for u in subsets[2:]]
    assert gpus == sorted(gpus, reverse=True)
    assert all(k in (0, 4) and (k == 0) == (n == 0) for u in subsets for n, k in u)
    assert ((3, 4), (0, 0)) in subsets and ((0, 0), (1, 4)) in subsets
    # one node: fewer of its devices; a big group: 0, 1, 2, 4, ... of its nodes, bounded
    cpu = load_spec(ROOT / "configs" / "cpu-local.yaml")
    assert cluster_subsets(cpu.cluster) == (((1, 1),),)
    big = parse_spec(_priced(h100=16, a100=16))
    many = cluster_subsets(big.cluster)
    assert len(many) == MAX_SUBSETS and len(cluster_subsets(big.cluster, 1000)) == 6 * 6 - 2
    assert many[:2] == (((16, 2), (0, 0)), ((0, 0), (16, 2)))    # kept however many there are
    assert {n for u in cluster_subsets(big.cluster, 1000) for n, _ in u} == {0, 1, 2, 4, 8, 16}


def test_subset_spec_keeps_each_device_where_it_is():
    spec = parse_spec(_priced(h100=2, a100=3))
    sub, ids = subset_spec(spec, ((1, 2), (2, 2)))
    assert sub.cluster.num_devices == len(ids) == 6
    assert ids == (0, 1, 4, 5, 6, 7)               # the first H100 node, the first 2 A100 nodes
    for d, i in zip(sub.cluster.devices, ids):
        whole = spec.cluster.devices[i]
        assert d.gpu == whole.gpu and d.local_rank == whole.local_rank
    assert spec_fingerprint(parse_spec(_priced(price=False))) == \
        {**spec_fingerprint(parse_spec(_priced())),
         "spec_sha256": spec_fingerprint(parse_spec(_priced(price=False)))["spec_sha256"]}


def test_front_and_choice_match_brute_force_over_every_subset():
    """Every (H100 nodes, A100 nodes) in 0..2 x 0..2 planned as its own spec: the front of
    (time, cost) and the cheapest plan within a deadline are the brute force's."""
    data = _priced()
    spec = parse_spec(data)
    whole = plan(spec, simulate_top=0)
    subsets = plan_subsets(spec, whole, simulate_top=0)
    assert len(subsets) == 1 + 3 * 3 - 2 and subsets[0].whole
    brute = {}
    for h, a in itertools.product(range(3), range(3)):
        if not h and not a:
            continue
        d = json.loads(json.dumps(data))
        d["cluster"]["nodes"] = [g for g, n in zip(d["cluster"]["nodes"], (h, a)) if n]
        for g, n in zip(d["cluster"]["nodes"], [n for n in (h, a) if n]):
            g["count"] = n
        best = plan(parse_spec(d), simulate_top=0).best
        brute[(h, a)] = (best.iteration_time_s, best.iteration_time_s * (
            h * 24.6 + a * 10.2) / 3600)
    by_uses = {tuple(n for n, _ in s.uses): s for s in subsets}
    assert by_uses.keys() == brute.keys()
    gpus = {k: 2 * sum(k) for k in brute}
    for k, s in by_uses.items():
        if not s.dominated:
            assert (s.iteration_time_s, s.cost_per_iteration) == \
                pytest.approx(brute[k], rel=1e-12)
            continue
        # searched only up to its cutoff: its true best is no faster, and another plan found
        # is as fast with no more GPU-seconds or cost
        assert s.best is None and brute[k][0] >= s.cutoff_s and "dominated" in s.reason
        assert any(o != k and not by_uses[o].dominated and brute[o][0] <= brute[k][0]
                   and brute[o][1] <= brute[k][1]
                   and brute[o][0] * gpus[o] <= brute[k][0] * gpus[k] for o in brute)
    dominated = {k for k in brute if any(
        o != k and brute[o][0] <= brute[k][0] and brute[o][1] <= brute[k][1] and
        brute[o] != brute[k] for o in brute)}
    fit = [s for s in subsets if s.best is not None]
    points = [(s.iteration_time_s, s.cost_per_iteration) for s in fit]
    front = {tuple(n for n, _ in fit[i].uses) for i in pareto_front(points)}
    assert front == set(brute) - dominated and front
    # the cheapest within a deadline, as brute force finds it
    iterations = 1000
    deadline = sorted(t for t, _ in brute.values())[3] * iterations
    ok = {k: v for k, v in brute.items() if v[0] * iterations <= deadline}
    want = min(ok, key=lambda k: (ok[k][1], ok[k][0]))
    got = choose_subset(subsets, "cost", 32, iterations=iterations, deadline_s=deadline)
    assert tuple(n for n, _ in got.uses) == want
    assert choose_subset(subsets, "cost", 32, iterations=iterations, deadline_s=1e-9) is None
    # time: the fastest; gpu_seconds: the least time x GPUs
    assert choose_subset(subsets, "time", 32).iteration_time_s == min(t for t, _ in
                                                                       brute.values())
    g = choose_subset(subsets, "gpu_seconds", 32)
    assert g.gpu_seconds_per_sample(32) == min(s.gpu_seconds_per_sample(32) for s in subsets
                                               if s.best is not None)
    # amplification: plans within K x the least GPU-seconds per sample only
    fastest = choose_subset(subsets, "time", 32, max_amplification=1.0)
    assert fastest is g
    # every placement is on the whole cluster's devices of the chosen groups
    for s in subsets[1:]:
        if s.best is None:
            continue
        used = {d for st in s.best.strategy.placement for r in st for d in r}
        allowed = set(subset_spec(spec, s.uses)[1])
        assert used == allowed


def test_dominated_subsets_stop_early_and_change_neither_front_nor_choice():
    """A subset whose every plan is beaten in time, GPU-seconds and cost by a plan found
    before it is searched only up to that cutoff: marked dominated, its true best (a full
    search of it) really is dominated, and the front and every objective's choice are those
    of the full searches."""
    spec = parse_spec(_priced(h100=2, a100=4))
    whole = plan(spec, simulate_top=0)
    subsets = plan_subsets(spec, whole, simulate_top=0)
    full = [subsets[0]] + [replace(s, best=plan_on_subset(spec, s.uses, simulate_top=0).best,
                                   dominated=False, cutoff_s=None, reason="")
                           for s in subsets[1:]]
    dominated = [i for i, s in enumerate(subsets) if s.dominated]
    assert dominated
    for i in dominated:
        truth = full[i]
        assert truth.iteration_time_s >= subsets[i].cutoff_s
        assert any(o.best is not None and o.iteration_time_s <= truth.iteration_time_s
                   and o.cost_per_iteration <= truth.cost_per_iteration
                   and o.gpu_seconds_per_sample(32) <= truth.gpu_seconds_per_sample(32)
                   for j, o in enumerate(subsets) if j != i)
    for s, f in zip(subsets, full):
        if not s.dominated:
            assert s.best == f.best
    def front(ss):
        fit = [s for s in ss if s.best is not None]
        return {fit[i].uses for i in pareto_front(
            [(s.iteration_time_s, s.cost_per_iteration) for s in fit])}
    assert front(subsets) == front(full)
    deadline = 1000 * sorted(s.iteration_time_s for s in full)[4]
    for objective, kw in (("time", {}), ("cost", {}), ("gpu_seconds", {}),
                          ("cost", dict(iterations=1000, deadline_s=deadline)),
                          ("time", dict(iterations=1000, budget=1.5)),
                          ("time", dict(max_amplification=1.3))):
        assert choose_subset(subsets, objective, 32, **kw).uses == \
            choose_subset(full, objective, 32, **kw).uses


def test_plan_cutoff_keeps_the_plans_below_it():
    """plan(cutoff_s): the same plans below the cutoff as without it (the same best where it
    is faster), the rest counted as dominated; Dominated where nothing is below it."""
    spec = parse_spec(_priced(h100=4, a100=4))
    free = plan(spec, simulate_top=0, keep=None)
    times = sorted(e.iteration_time_s for e in free.strategies)
    cut = times[len(times) // 2]
    bounded = plan(spec, simulate_top=0, keep=None, cutoff_s=cut)
    assert bounded.best == free.best
    assert [e for e in bounded.strategies] == [e for e in free.strategies
                                               if e.iteration_time_s < cut]
    assert bounded.pruned["dominated"] > 0
    with pytest.raises(Dominated, match="no strategy is faster than"):
        plan(spec, simulate_top=0, cutoff_s=times[0])
    # by branch and bound (1548 points, most never costed), the same
    spec = parse_spec(_priced(h100=16, a100=16, zero_stage="search", global_batch_size=256,
                              activation_checkpointing="search"))
    free = plan(spec, simulate_top=0)
    cut = sorted(e.iteration_time_s for e in free.strategies)[3]
    bounded = plan(spec, simulate_top=0, cutoff_s=cut)
    assert bounded.strategies == tuple(e for e in free.strategies if e.iteration_time_s < cut)
    assert bounded.evaluated < free.evaluated and bounded.pruned["dominated"] > 0


def test_shared_rows_change_no_plan():
    """The parts' searches take their per device type rows from one costing.SharedRows (the
    whole cluster's search fills it first): the same plans as each search on its own, and
    each names only its own device types' sources."""
    from amp_search.costing import SharedRows

    spec = parse_spec(_priced(h100=2, a100=2))
    shared = SharedRows()
    whole = plan(spec, shared=shared)
    assert whole == replace(plan(spec), search_time_s=whole.search_time_s)
    for uses in (((2, 2), (0, 0)), ((0, 0), (1, 2)), ((1, 2), (2, 2))):
        a = plan_on_subset(spec, uses, shared=shared)
        b = plan_on_subset(spec, uses)
        assert a.strategies == b.strategies
    alone = plan_on_subset(spec, ((0, 0), (2, 2)), shared=shared).best
    assert [s.split("=")[0] for s in alone.timing_sources if "=" in s][0] == "A100-80GB"
    assert not any(s.startswith("H100") for s in alone.timing_sources)


def test_subsets_in_forked_workers_are_the_same_as_one_after_another():
    """plan_subsets(workers=2) runs the searches in forked processes: the same plans, reasons
    and order as one process."""
    spec = parse_spec(_priced(h100=2, a100=1))
    whole = plan(spec)
    one = plan_subsets(spec, whole, workers=1)
    assert plan_subsets(spec, whole, workers=2) == one
    # each node group alone started first, beside the whole cluster's search: the same
    early = start_subsets(spec, workers=2)
    assert early is not None
    whole = plan(spec)
    assert plan_subsets(spec, whole, workers=2, early=early) == one
    assert start_subsets(spec, workers=1) is None       # no CPU to spare
    early = start_subsets(spec, workers=2)
    early.cancel()                                       # the caller's search failed


def test_every_wave_started_beside_the_whole_search_gives_the_same_plans():
    """4 + 4 nodes: 14 parts, the groups alone and then 12 one at a time; the early worker
    chains the waves (each from the ones before it but the last), and plan_subsets searches
    what it had not taken beside it: the same plans, reasons and order as one process, whether it
    collects them before the first wave ends or after the worker took every part."""
    import time

    from amp_search.planner import _subset_waves

    spec = parse_spec(_priced(h100=4, a100=4))
    waves = _subset_waves(spec.cluster, cluster_subsets(spec.cluster),
                          spec.training.precision)
    assert len(waves) == 13 and all(len(w) == 1 for w in waves[1:])
    whole = plan(spec)
    one = plan_subsets(spec, whole, workers=1)
    assert plan_subsets(spec, whole, workers=2, early=start_subsets(spec, workers=2)) == one
    # two worker processes, each taking one part at a time beside this one
    early = start_subsets(spec, workers=3)
    assert len(early._processes) == 2
    assert plan_subsets(spec, whole, workers=3, early=early) == one
    early = start_subsets(spec, workers=2)
    deadline = time.monotonic() + 120
    while not early.handed_out() and time.monotonic() < deadline:
        time.sleep(0.05)                # the worker took every part: the last wave too
    assert plan_subsets(spec, whole, workers=2, early=early) == one


def test_parts_started_for_another_backend_are_searched_again():
    """A spec that names no backend is planned for each: parts started beside the whole
    search under the default backend are not taken for the backend the whole search chose
    (they were, before: the groups alone costed for DeepSpeed beside Megatron-LM's parts)."""
    d = _priced(h100=2, a100=1)
    del d["training"]["backend"]
    spec = parse_spec(d)
    assert spec.other_backends
    megatron = spec.for_backend("megatron")
    whole = plan(megatron)
    one = plan_subsets(megatron, whole, workers=1)
    assert {p.best.backend for p in one if p.best is not None} == {"megatron"}
    early = start_subsets(spec, workers=2)
    assert early is not None and early.backend == "deepspeed"
    assert plan_subsets(megatron, whole, workers=2, early=early) == one


def test_cli_plan_prints_the_subsets_the_choice_and_the_front(write_spec, tmp_path, capsys,
                                                             monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    path = write_spec(_priced(objective="cost"))
    png = tmp_path / "front.png"
    pytest.importorskip("matplotlib")
    assert main(["plan", str(path), "--no-simulate", "--no-progress", "--iterations", "1000",
                 "--deadline", "2", "--pareto-png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "Devices used, the best plan on each (objective: cost" in out
    assert "Chosen (the cheapest under 1000 iterations within 2 h):" in " ".join(out.split())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["plan", str(path), "--no-simulate", "--json", "-", "--iterations", "1000",
                 "--budget", "1e9"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["objective"] == "cost" and data["front_against"] == "cost"
    chosen = data["subsets"][data["chosen_subset"]]
    assert chosen["chosen"] and chosen["cost_per_iteration"] == min(
        s["cost_per_iteration"] for s in data["subsets"] if s["best"] is not None)
    assert any(s["pareto"] for s in data["subsets"]) and data["subsets"][0]["whole"]


@pytest.mark.parametrize("argv, message", [
    (["--deadline", "2"], "--deadline and --budget need --iterations N"),
    (["--budget", "9", "--iterations", "5"], "--budget needs cluster.nodes[*].price_per_hour"),
    (["--no-subsets", "--max-amplification", "2"], "--no-subsets with"),
])
def test_constraints_without_what_they_need_are_one_line_errors(write_spec, capsys, argv,
                                                                 message):
    path = write_spec(_priced(price=False))
    assert main(["plan", str(path), "--no-simulate", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cost_objective_needs_prices_and_a_price_is_checked(write_spec, capsys):
    assert main(["plan", str(write_spec(_priced(price=False, objective="cost")))]) == 2
    assert "training.objective: cost needs every node group's price_per_hour" in \
        capsys.readouterr().err
    bad = _priced()
    bad["cluster"]["nodes"][0]["price_per_hour"] = -1
    assert main(["plan", str(write_spec(bad))]) == 2
    assert "cluster.nodes[0].price_per_hour" in capsys.readouterr().err


def test_launch_subset_runs_on_the_subsets_devices_only(capsys):
    """`launch --subset 1` on the two-process CPU spec: each trial is one process, device 0."""
    spec = str(ROOT / "configs" / "cpu-local.yaml")
    assert main(["launch", spec, "--subset", "1", "--top-k", "3", "--dry-run", "--json",
                 "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["trials"]) == 3
    for t in data["trials"]:
        s = t["strategy"]
        assert s["pp"] * s["dp"] * s["tmp"] == 1 and s["placement"] == [[[0]]]
    assert main(["launch", spec, "--subset", "2", "--dry-run"]) == 2
    assert "subsets 1-1" in capsys.readouterr().err


def test_the_subsets_table_fits_80_columns_and_says_what_it_left_out(write_spec, capsys,
                                                                     monkeypatch):
    """Three priced node groups: long device lists are shortened, columns left out are
    named, and so are the smaller parts --max-subsets did not plan."""
    data = _priced()
    data["cluster"]["nodes"].append({"gpu": "V100-32GB", "count": 2, "gpus_per_node": 2,
                                     "intra_node_bandwidth": "150 GB/s",
                                     "inter_node_bandwidth": "2 x 100 Gbps",
                                     "price_per_hour": 4.9})
    data["training"]["precision"] = "fp16"
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", str(write_spec(data)), "--no-simulate", "--no-progress",
                 "--subsets", "--max-subsets", "5"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    text = " ".join(out.split())
    assert "smaller parts were not planned (--max-subsets 5" in text
    assert "Left out for the terminal's width:" in text


def test_a_part_that_fails_in_this_process_stops_the_early_worker(monkeypatch):
    """The caller searches parts beside the early worker (EarlySubsets.collect); an error
    there (or an interrupt) stops the worker and reaches the caller."""
    import amp_search.planner as planner

    spec = parse_spec(_priced(h100=4, a100=4))
    whole = plan(spec)
    early = start_subsets(spec, workers=2)      # the worker takes one part of 14 at a time
    processes = list(early._processes)
    assert processes

    def fails(job, cutoff_s):
        raise RuntimeError("a part failed")

    monkeypatch.setattr(planner, "_best_on_job", fails)
    with pytest.raises(RuntimeError, match="a part failed"):
        plan_subsets(spec, whole, workers=2, early=early)
    for proc in processes:
        proc.join(timeout=30)
        assert not proc.is_alive()


def test_a_part_that_fails_in_a_worker_reaches_the_caller(monkeypatch):
    """A worker's error (or one that cannot be pickled, as its text) reaches the caller,
    whose own searches succeed, and every worker ends; a worker killed is named; cancel
    ends them too."""
    import os
    import threading

    import amp_search.planner as planner

    spec = parse_spec(_priced(h100=4, a100=4))
    whole = plan(spec)
    caller, search = os.getpid(), planner._best_on_job

    class Local(Exception):             # a local class: it cannot be pickled
        pass

    class Unreadable(Exception):        # pickled, but its loads fails (a required argument)
        def __init__(self, a, b):
            super().__init__(f"{a} {b}")

    from amp_search.errors import SpecError

    for error, raised, text in ((ValueError("a worker's part failed"), ValueError,
                                 "a worker's part failed"),
                                (Local("not picklable"), RuntimeError,
                                 "Local: not picklable"),
                                (SpecError("cluster.nodes[0]", "bad"), SpecError,
                                 "cluster.nodes\\[0\\]: bad"),
                                (Unreadable("x", "y"), RuntimeError, "Unreadable: x y")):
        def fails(job, cutoff_s, error=error):
            if os.getpid() != caller:
                raise error
            return search(job, cutoff_s)

        monkeypatch.setattr(planner, "_best_on_job", fails)    # the workers inherit it
        early = start_subsets(spec, workers=2)
        with pytest.raises(raised, match=text) as info:
            plan_subsets(spec, whole, workers=2, early=early)
        if raised is not RuntimeError:      # with the worker's traceback as a note
            assert "raised in a process searching a part" in info.value.__notes__[-1]
        for proc in early._processes:
            proc.join(timeout=30)
            assert not proc.is_alive()
    # a worker killed in the middle of a part: the caller says so instead of waiting
    import signal
    import time

    def hangs(job, cutoff_s):
        if os.getpid() != caller:
            time.sleep(120)
        return search(job, cutoff_s)

    monkeypatch.setattr(planner, "_best_on_job", hangs)
    early = start_subsets(spec, workers=2)
    while early._next.value == 0:           # the worker took its first part
        time.sleep(0.01)
    os.kill(early._processes[0].pid, signal.SIGKILL)
    with pytest.raises(RuntimeError, match="ended with exit code -9"):
        plan_subsets(spec, whole, workers=2, early=early)
    monkeypatch.setattr(planner, "_best_on_job", search)
    before = threading.active_count()
    early = start_subsets(spec, workers=3)
    early.cancel()
    assert not any(proc.is_alive() for proc in early._processes)
    for _ in range(100):                    # the caller's inbox thread ends
        if threading.active_count() <= before:
            break
        threading.Event().wait(0.05)
    assert threading.active_count() <= before


def test_large_results_reach_every_process_after_the_workers_end(monkeypatch):
    """Each part's result goes to every process; a worker that took its last part and ended
    reads no more, and large results to it (a 2048-GPU part's is 60 KB, more than a pipe
    holds) are skipped instead of blocking the sender, with 1 and 2 workers."""
    import os
    import time

    import amp_search.planner as planner

    spec = parse_spec(_priced(h100=4, a100=4))
    whole = plan(spec)
    one = plan_subsets(spec, whole, workers=1)
    caller, search = os.getpid(), planner._best_on_job

    def padded(job, cutoff_s):
        best, reason, dominated = search(job, cutoff_s)
        if os.getpid() == caller:
            time.sleep(0.3)         # the caller's parts end last, after the workers'
        return best, reason + " " * 70_000, dominated

    monkeypatch.setattr(planner, "_best_on_job", padded)
    for workers in (2, 3):
        got = plan_subsets(spec, whole, workers=workers,
                           early=start_subsets(spec, workers=workers))
        assert [p.best for p in got] == [p.best for p in one]


def test_parts_are_searched_smallest_first_the_fastest_of_equals_first_each_from_all_before():
    """After the groups alone, the parts with the fewest devices come first and, of as many,
    the one with the most peak FLOP/s (H100 nodes before A100 nodes); each part's cutoff
    comes from every part before it but the one just before it (which may be searched beside
    it), and from each group alone."""
    from amp_search.planner import SUBSET_LAG, _basis_waves, _subset_waves

    spec = parse_spec(_priced(h100=4, a100=4))             # nodes of 2 GPUs
    parts = cluster_subsets(spec.cluster)
    waves = _subset_waves(spec.cluster, parts, spec.training.precision)
    assert [parts[i] for i in waves[0]] == [((4, 2), (0, 0)), ((0, 0), (4, 2))]
    assert [parts[i] for w in waves[1:] for i in w][:7] == [
        ((1, 2), (0, 0)), ((0, 0), (1, 2)),                           # 2 GPUs: H100 first
        ((2, 2), (0, 0)), ((1, 2), (1, 2)), ((0, 0), (2, 2)),         # 4 GPUs
        ((2, 2), (1, 2)), ((1, 2), (2, 2))]                           # 6 GPUs
    assert SUBSET_LAG == 1
    assert [_basis_waves(k, True) for k in range(5)] == [0, 1, 1, 2, 3]
    assert [_basis_waves(k, False) for k in range(4)] == [0, 0, 1, 2]
