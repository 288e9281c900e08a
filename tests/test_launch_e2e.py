"""Real trials end to end on CPU (gloo): DeepSpeed PipelineModule + megatron-core tensor
parallelism, launched by torchrun, recorded in SQLite; plus a failing, a hanging and an
interrupted trial. About a minute and a half on a 2-core machine."""
from __future__ import annotations

import json
import shutil
import signal
import sqlite3
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")

from amp_search.cli import main  # noqa: E402
from amp_search.launch import LaunchOptions, TrialRequest, orchestrator, process  # noqa: E402
from amp_search.launch import run_trials  # noqa: E402
from amp_search.records import Strategy  # noqa: E402
from amp_search.spec import load_spec  # noqa: E402
from conftest import held_monotonic, time_module_with  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
LAYER_NAMES = ["embedding", "block0", "block1", "block2", "block3", "head"]


def _strategy(pp, dp, tmp, partition, zero=0, ckpt=False, mbs=2):
    dev = iter(range(4))
    placement = [[[next(dev) for _ in range(tmp)] for _ in range(dp)] for _ in range(pp)]
    return {"pp": pp, "dp": dp, "tmp": tmp, "mbs": mbs, "partition": list(partition),
            "placement": placement, "zero_stage": zero, "activation_checkpointing": ckpt,
            "iteration_time_s": 0.1 * pp * tmp}


@pytest.fixture(scope="module")
def spec_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu-tiny")
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", d / "spec.yaml")
    return d


@pytest.fixture(scope="module")
def launched(spec_dir):
    """Three real trials through `amp-search launch --plan`: an uneven pp2 split with tmp 1
    and with tmp 2 (same seed and data: the losses must agree), and pp2 x dp2 with ZeRO-1
    and activation checkpointing."""
    plan = {"strategies": [_strategy(2, 1, 1, (0, 2, 6)), _strategy(2, 1, 2, (0, 2, 6)),
                           _strategy(2, 2, 1, (0, 4, 6), zero=1, ckpt=True)]}
    (spec_dir / "plan.json").write_text(json.dumps(plan))
    rc = main(["launch", str(spec_dir / "spec.yaml"), "--plan", str(spec_dir / "plan.json"),
               "--top-k", "3", "--iters", "4", "--warmup", "2", "--no-progress",
               "--json", str(spec_dir / "out.json")])
    return rc, json.loads((spec_dir / "out.json").read_text())


def test_real_trials_recorded(launched, spec_dir):
    rc, out = launched
    assert rc == 0
    assert [t["status"] for t in out["trials"]] == ["ok", "ok", "ok"], \
        [t["error"] + t["log_tail"] for t in out["trials"]]
    con = sqlite3.connect(spec_dir / "amp-search-results.sqlite")
    rows = con.execute("SELECT label, status, measured_mean_s, measured_std_s, "
                       "peak_memory_bytes, partition_json, log_path, versions_json, "
                       "started_at, ended_at, predicted_s FROM results ORDER BY id").fetchall()
    assert [r[:2] for r in rows] == [("pp2-dp1-tmp1-mbs2-z0", "ok"),
                                     ("pp2-dp1-tmp2-mbs2-z0", "ok"),
                                     ("pp2-dp2-tmp1-mbs2-z1-ckpt", "ok")]
    for r in rows:
        assert r[2] > 0 and r[3] >= 0 and r[4] > 0
        assert Path(r[6]).is_file()
        assert json.loads(r[7])["deepspeed"] and r[8] <= r[9] and r[10] > 0
    assert out["best"]["status"] == "ok"
    assert out["best"]["measured_mean_s"] == min(r[2] for r in rows)
    # the other programs' load during each trial is kept with it (local launcher, Linux)
    for t in out["trials"]:
        assert t["other_processes_cores"] is None or t["other_processes_cores"] >= 0
    if Path("/proc/stat").exists():
        stored = [json.loads(r[0]) for r in con.execute("SELECT result_json FROM results")]
        assert all(isinstance(r["other_processes_cores"], float) for r in stored)


def test_stages_hold_exactly_the_planned_layers(launched):
    _, out = launched
    for t in out["trials"]:
        result = json.loads((Path(t["trial_dir"]) / "result.json").read_text())
        p = t["strategy"]["partition"]
        planned = [LAYER_NAMES[a:b] for a, b in zip(p, p[1:])]
        assert result["stage_layers"] == planned
        assert len(result["iteration_times_s"]) == 4 and result["timed_iterations"] == 2


def test_partitioned_p2p_sends_what_the_model_charges(launched, spec_dir):
    """The pp2 x tmp2 trial: DeepSpeed's pipeline engine sends each tensor rank 1/tmp of the
    boundary activation (and of its gradient), and rebuilds it with all-gathers: the
    receiving stage one per micro-batch, the sending stage two; the cost model charges the
    same (cost_models.comm.boundary_shards and boundary_gathers), counted on the real ranks
    (amp_search.trial.run._p2p_counter)."""
    from cost_models import comm
    from cost_models.layers import output_elements

    _, out = launched
    trial = out["trials"][1]
    s = Strategy.from_dict({**trial["strategy"], "global_batch_size": trial["strategy"].get(
        "global_batch_size", 8)})
    spec = load_spec(spec_dir / "spec.yaml")
    result = json.loads((Path(trial["trial_dir"]) / "result.json").read_text())
    boundary = spec.model.layers[s.partition[1] - 1]          # block0's output crosses
    shards = comm.boundary_shards(s.tmp, framework="deepspeed",
                                  sequence_parallel=s.sequence_parallel)
    receiver, sender = comm.boundary_gathers(s.tmp, framework="deepspeed",
                                             sequence_parallel=s.sequence_parallel)
    assert (shards, receiver, sender) == (2, 1, 2)
    payload = s.gas * output_elements(boundary) * s.mbs * 4 / shards   # fp32 on the CPU
    ranks = result["rank_p2p_per_iteration"]
    assert len(ranks) == 4
    for rank, sent in enumerate(ranks):
        stage = rank // 2                                      # tp-dp-pp: tensor rank fastest
        assert sent["payload_bytes"] == payload, (rank, sent)
        assert 0 < sent["meta_bytes"] < 0.01 * payload         # the partitions' shapes
        assert sent["gathers"] == s.gas * (sender if stage == 0 else receiver), (rank, sent)


def test_tensor_parallel_losses_match(launched):
    """Same seed, same data: tmp=1 and tmp=2 must train the same model."""
    _, out = launched
    tp1, tp2 = out["trials"][0]["losses"], out["trials"][1]["losses"]
    assert len(tp1) == 4
    assert tp1 == pytest.approx(tp2, rel=1e-4)
    assert tp1[0] == pytest.approx(6.93, abs=0.1)  # ~ln(1024) at init


def test_rerun_skips_finished_trials(launched, spec_dir, capsys):
    rc = main(["launch", str(spec_dir / "spec.yaml"), "--plan", str(spec_dir / "plan.json"),
               "--top-k", "3", "--iters", "4", "--warmup", "2", "--no-progress"])
    assert rc == 0
    text = capsys.readouterr().out
    assert text.count("cached") == 3 and "best: " in text
    con = sqlite3.connect(spec_dir / "amp-search-results.sqlite")
    assert con.execute("SELECT COUNT(*) FROM results").fetchone() == (3,)
    assert main(["results", str(spec_dir / "spec.yaml")]) == 0
    text = capsys.readouterr().out
    assert text.count(" ok ") == 3 and "best measured: " in text


def _only_the_hang_times_out(monkeypatch) -> None:
    """The trial timeout applies to the hanging trial alone, and fires only once its ranks
    sleep: the failing trials end by themselves (torchrun and 2 ranks take their time to
    start on a loaded machine; 1800 s only guards against a hang), and the hanging trial's
    clock stands still until its log says it sleeps."""
    real = orchestrator.run_commands

    def run_commands(commands, *, cwd, log_path, timeout_s, **kw):
        config = json.loads((Path(cwd) / "trial.json").read_text())
        if not config.get("debug_hang_s"):
            return real(commands, cwd=cwd, log_path=log_path, timeout_s=1800, **kw)

        def sleeping() -> bool:
            log = Path(log_path)
            return log.exists() and "debug: sleeping" in log.read_text(errors="replace")

        with monkeypatch.context() as m:
            m.setattr(process, "time", time_module_with(monotonic=held_monotonic(sleeping)))
            return real(commands, cwd=cwd, log_path=log_path, timeout_s=timeout_s, **kw)

    monkeypatch.setattr(orchestrator, "run_commands", run_commands)


def test_failing_and_hanging_trials_recorded_and_launch_goes_on(tmp_path, monkeypatch):
    _only_the_hang_times_out(monkeypatch)
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    before = _children()
    s = {k: v for k, v in _strategy(2, 1, 1, (0, 3, 6)).items() if k != "iteration_time_s"}
    mk = lambda **kw: Strategy.from_dict({**s, **kw, "global_batch_size": 8})  # noqa: E731
    reqs = [TrialRequest(strategy=mk(), debug_fail="deliberate failure"),
            TrialRequest(strategy=mk(partition=[0, 2, 6]), debug_hang_s=600),
            TrialRequest(strategy=mk(partition=[0, 4, 6]), debug_fail="second failure")]
    recs = run_trials(spec, reqs, LaunchOptions(iters=4, warmup=2, trial_timeout_s=20,
                                                base_env=_env()))
    assert [r.status for r in recs] == ["failed", "timeout", "failed"], \
        [(r.status, r.error, r.log_tail) for r in recs]
    assert recs[0].error == "RuntimeError: deliberate failure"
    assert "debug: sleeping" in Path(recs[1].log_path).read_text()
    assert recs[1].error == "stopped after 20 s (--trial-timeout)"
    con = sqlite3.connect(tmp_path / "amp-search-results.sqlite")
    rows = con.execute("SELECT status, error FROM results ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["failed", "timeout", "failed"]
    assert "deliberate failure" in rows[0][1] and "second failure" in rows[2][1]
    _assert_no_children(before)


def test_ctrl_c_stops_the_trial_and_leaves_the_db_consistent(tmp_path):
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    before = _children()
    s = {k: v for k, v in _strategy(4, 1, 1, (0, 2, 3, 4, 6)).items()
         if k != "iteration_time_s"}
    req = TrialRequest(strategy=Strategy.from_dict({**s, "global_batch_size": 8}),
                       debug_hang_s=600)
    stop = threading.Event()

    def ctrl_c_once_sleeping():  # Ctrl-C while the trial's processes are up
        while not stop.wait(0.2):
            if any("debug: sleeping" in p.read_text(errors="replace")
                   for p in (tmp_path / "runs").glob("*/log.txt")):
                signal.raise_signal(signal.SIGINT)
                return

    watcher = threading.Thread(target=ctrl_c_once_sleeping, daemon=True)
    # a shell starts background jobs with SIGINT ignored; Ctrl-C is what is tested here
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    watcher.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run_trials(spec, [req], LaunchOptions(iters=4, warmup=2, trial_timeout_s=120,
                                                  base_env=_env()))
    finally:
        stop.set()
        watcher.join()
        signal.signal(signal.SIGINT, previous)
    con = sqlite3.connect(tmp_path / "amp-search-results.sqlite")
    assert con.execute("SELECT status FROM results").fetchall() == [("interrupted",)]
    _assert_no_children(before)


def test_budget_stops_starting_trials(tmp_path, monkeypatch):
    # the budget's clock runs from the first trial's start: what comes before it (recovery,
    # the lock, SQLite) takes what it takes on a loaded machine
    real = orchestrator.run_commands
    started = []

    def run_commands(*args, **kw):
        started.append(time.monotonic())
        return real(*args, **kw)

    monkeypatch.setattr(orchestrator, "run_commands", run_commands)
    monkeypatch.setattr(orchestrator, "time", time_module_with(
        monotonic=lambda: time.monotonic() - started[0] if started else 0.0))
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    s = {k: v for k, v in _strategy(2, 1, 1, (0, 3, 6)).items() if k != "iteration_time_s"}
    reqs = [TrialRequest(strategy=Strategy.from_dict({**s, "partition": p,
                                                      "global_batch_size": 8}),
                         debug_hang_s=600) for p in ([0, 3, 6], [0, 2, 6])]
    recs = run_trials(spec, reqs, LaunchOptions(iters=4, warmup=2, budget_s=0.5,
                                                base_env=_env()))
    # the first trial is cut by the budget (not its fault: it stays runnable), the second
    # never starts
    assert [r.status for r in recs] == ["interrupted", "skipped"]
    assert "budget" in recs[0].error and "budget" in recs[1].error
    con = sqlite3.connect(tmp_path / "amp-search-results.sqlite")
    assert con.execute("SELECT status FROM results").fetchall() == [("interrupted",)]


def _env() -> dict:
    import os

    return dict(os.environ)


def _children() -> set:
    import psutil

    return {p.pid for p in psutil.Process().children(recursive=True)}


def _assert_no_children(before: set):
    """No process started during the test is still running (earlier ones, such as
    multiprocessing's resource tracker, are not ours to judge)."""
    import time

    import psutil

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        left = [p for p in psutil.Process().children(recursive=True)
                if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]
        if not left:
            return
        time.sleep(0.2)
    raise AssertionError(f"processes left behind: {left}")
