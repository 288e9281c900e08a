"""Nothing measured is lost (the requirement): faults injected into real launches of the tiny model
(configs/cpu-tiny.yaml, 2 ranks, a few iterations) each end with one line and no traceback,
leave no trial process behind, and lose no measurement.

    the launch killed hard during a trial       its trial dies with it; the row is recovered
    a rank killed during a trial                failed (not oom), named, run again next time
    a database page overwritten                 one line, file left as it is, folders re-read
    a read-only or full database                one line; the measurement stays in its folder
                                                and the next launch records it
    two launches on one database at once        each trial runs once, never two at a time
    doctored plan files                         one line naming the row and the rule, exit 2

Processes are killed by their own pids only. Running as root, chmod does not stop writes:
a read-only database is then a sqlite file opened with ?mode=ro, a full one a page limit.
About a minute and a half on a 2-core machine."""
from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")
psutil = pytest.importorskip("psutil")

from amp_search.cli import main  # noqa: E402
from amp_search.spec import spec_fingerprint  # noqa: E402
from amp_search.launch.orchestrator import TRIAL_RECORD_NAME, trial_key  # noqa: E402
from amp_search.launch.process import TRIAL_DIR_VAR, trial_processes  # noqa: E402
from amp_search.launch.results_db import ResultsDB, TrialLock  # noqa: E402
from amp_search.records import Strategy  # noqa: E402
from amp_search.spec import load_spec, parse_spec  # noqa: E402
from amp_search.yaml_io import load_yaml_file  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PP2 = {"pp": 2, "dp": 1, "tmp": 1, "mbs": 2, "partition": [0, 3, 6],
       "placement": [[[0]], [[1]]], "zero_stage": 0, "activation_checkpointing": False,
       "iteration_time_s": 0.1}
PP2B = {**PP2, "partition": [0, 2, 6], "placement": [[[2]], [[3]]]}
QUICK = ["--iters", "4", "--warmup", "2", "--no-progress", "--no-speed-probe"]
LONG = ["--iters", "100000", "--warmup", "2", "--no-progress", "--no-speed-probe"]
"""A trial that runs until it is killed."""


@pytest.fixture
def spec(tmp_path):
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    return tmp_path / "spec.yaml"


def _plan(tmp_path, *rows, fingerprint=None, name="plan.json"):
    data = {"strategies": list(rows)}
    if fingerprint is not None:
        data["spec_fingerprint"] = fingerprint
    p = tmp_path / name
    p.write_text(json.dumps(data))
    return p


def _env() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, never a traceback
    return err[0]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


_STARTED: list[subprocess.Popen] = []


@pytest.fixture(autouse=True)
def _end_our_launches():
    """A launch a failed test left running is killed by its pid (its trial dies with it)."""
    yield
    while _STARTED:
        p = _STARTED.pop()
        if p.poll() is None:
            p.kill()
            p.communicate()


def _launch_process(spec, plan, *extra) -> subprocess.Popen:
    argv = [sys.executable, "-m", "amp_search", "launch", str(spec), "--plan", str(plan),
            "--top-k", "1", *extra]
    p = subprocess.Popen(argv, cwd=spec.parent, env=_env(), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    _STARTED.append(p)
    return p


def _wait_for_iterations(spec, launch: subprocess.Popen, timeout_s: float = 180) -> Path:
    """The trial folder, once its ranks train (its log shows iteration 3)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for log in (spec.parent / "runs").glob("*/log.txt"):
            if "iteration 3/" in log.read_text(errors="replace"):
                return log.parent
        if launch.poll() is not None:
            raise AssertionError(f"the launch ended early: {launch.communicate()}")
        time.sleep(0.2)
    launch.kill()
    raise AssertionError("the trial never started training")


def _rows(db_path) -> list[dict]:
    con = sqlite3.connect(db_path)
    con.row_factory = sqlite3.Row
    return [dict(r) for r in con.execute("SELECT * FROM results ORDER BY id")]


def _no_traceback(text: str) -> None:
    assert "Traceback" not in text, text


# ----------------------------------------------------------------------------- 1. launch killed

def test_killed_launch_takes_its_trial_with_it_and_the_row_is_recovered(spec, tmp_path,
                                                                         capsys):
    launch = _launch_process(spec, _plan(tmp_path, PP2), *LONG)
    folder = _wait_for_iterations(spec, launch)
    trial = trial_processes(folder)
    assert len(trial) >= 3, trial  # torchrun and its 2 ranks
    os.kill(launch.pid, signal.SIGKILL)
    launch.communicate()
    # the trial's processes die with their launch (parent-death signals); the loop ends as
    # soon as they are gone, its deadline only guards against a hang on a loaded machine
    deadline = time.monotonic() + 60.0
    while any(_alive(p) for p in trial) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in trial if _alive(p)], "trial processes outlived their launch"
    db = spec.parent / "amp-search-results.sqlite"
    assert [r["status"] for r in _rows(db)] == ["running"]
    assert _rows(db)[0]["launcher_pid"] == launch.pid
    # `results` finds the row of a launch that is gone: interrupted, and run again
    assert main(["results", str(spec)]) == 0
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "marked 1 trial(s) interrupted" in captured.err
    (row,) = _rows(db)
    assert row["status"] == "interrupted" and row["final"] == 0
    assert f"pid {launch.pid}" in row["error"]


def test_result_left_by_a_dead_launch_is_recorded_and_its_processes_ended(spec, tmp_path,
                                                                          capsys):
    """The launch died after its trial measured (or its orphans measured later): the
    result.json is recorded by the next `results` (or launch), the trial is not run again,
    and a process of that trial still running is ended."""
    sp = load_spec(spec)
    s = Strategy.from_dict({**PP2, "global_batch_size": 8})
    folder = spec.parent / "runs" / "01-orphan"
    folder.mkdir(parents=True)
    (folder / "result.json").write_text(json.dumps(
        {"status": "ok", "mean_s": 0.321, "std_s": 0.01, "peak_memory_bytes": [1 << 20],
         "peak_memory_kind": "cpu_max_rss_approx", "losses": [6.9, 6.8]}))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    db = ResultsDB(spec.parent / "amp-search-results.sqlite")
    db.start(spec_sha256=sp.sha256, spec_path=str(spec), trial_key=trial_key(s, "deepspeed"),
             label=s.label(), backend="deepspeed", launcher="local", strategy=s.to_dict(),
             predicted_s=0.1, iters=4, warmup=2, log_path=str(folder / "log.txt"),
             started_at="2026-01-01T00:00:00+00:00", trial_dir=str(folder),
             launcher_pid=gone.pid, launcher_host=socket.gethostname(),
             launcher_started=time.time() - 100)
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              env={**_env(), TRIAL_DIR_VAR: str(folder)})
    try:
        assert main(["results", str(spec)]) == 0
        captured = capsys.readouterr()
        assert "recorded the result of 1 trial(s)" in captured.err
        assert "ended 1 process(es)" in captured.err
        assert orphan.wait(timeout=10) is not None
    finally:
        if orphan.poll() is None:
            orphan.kill()
            orphan.wait()
    (row,) = _rows(spec.parent / "amp-search-results.sqlite")
    assert row["status"] == "ok" and row["measured_mean_s"] == 0.321 and row["final"] == 1
    # the next launch takes it from the database: not measured again
    assert main(["launch", str(spec), "--plan", str(_plan(tmp_path, PP2)), "--top-k", "1",
                 *QUICK]) == 0
    assert "ok (cached), measured 0.321 s" in capsys.readouterr().err
    assert len(_rows(spec.parent / "amp-search-results.sqlite")) == 1


# ----------------------------------------------------------------------------- 2. rank killed

def test_a_killed_rank_is_a_failure_named_after_it_and_runs_again(spec, tmp_path):
    launch = _launch_process(spec, _plan(tmp_path, PP2), *LONG)
    folder = _wait_for_iterations(spec, launch)
    ranks = [p for p in trial_processes(folder)
             if "torch.distributed.run" not in psutil.Process(p).cmdline()]
    assert len(ranks) == 2, ranks
    os.kill(ranks[-1], signal.SIGKILL)
    out, err = launch.communicate(timeout=180)
    assert launch.returncode == 1, (out, err)       # no trial ended ok
    _no_traceback(out + err)
    (row,) = _rows(spec.parent / "amp-search-results.sqlite")
    assert row["status"] == "failed", row["error"]
    first = row["error"].splitlines()[0]
    assert first.startswith("rank ") and "signal 9: SIGKILL" in first, first
    assert f"pid {ranks[-1]}" in first
    assert "runs again on the next launch" in err
    # not final: the next launch runs it again (with --no-retry it would keep it)
    db = ResultsDB(spec.parent / "amp-search-results.sqlite")
    sp = load_spec(spec)
    key = trial_key(Strategy.from_dict({**PP2, "global_batch_size": 8}), "deepspeed")
    assert db.finished(sp.sha256, key) is None
    assert db.finished(sp.sha256, key, final_only=False).status == "failed"
    assert not trial_processes(folder)


# ----------------------------------------------------------------------------- 3. damaged file

def _measured_folder(spec, db_path: Path, strategy: dict, mean_s: float) -> Path:
    """A trial folder as a launch leaves it (trial-record.json, result.json), and its row."""
    sp = load_spec(spec)
    s = Strategy.from_dict({**strategy, "global_batch_size": 8})
    folder = spec.parent / "runs" / f"01-{s.label()}-measured"
    folder.mkdir(parents=True)
    record = dict(spec_sha256=sp.sha256, spec_path=str(spec), label=s.label(),
                  trial_key=trial_key(s, "deepspeed"), backend="deepspeed", launcher="local",
                  strategy=s.to_dict(), predicted_s=0.1, iters=4, warmup=2,
                  log_path=str(folder / "log.txt"), started_at="2026-01-01T00:00:00+00:00",
                  trial_dir=str(folder), launcher_pid=1, launcher_host="elsewhere",
                  launcher_started=0.0)
    (folder / TRIAL_RECORD_NAME).write_text(json.dumps(
        {**record, "results_db": str(db_path.resolve())}))
    (folder / "result.json").write_text(json.dumps({"status": "ok", "mean_s": mean_s,
                                                    "std_s": 0.0}))
    db = ResultsDB(db_path)
    rid = db.start(**record)
    db.finish(rid, status="ok", ended_at="2026-01-01T00:00:10+00:00", measured_mean_s=mean_s,
              result={"mean_s": mean_s}, final=True)
    return folder


def test_damaged_database_is_one_line_left_as_it_is_and_folders_restore_it(spec, tmp_path,
                                                                           capsys):
    db_path = spec.parent / "amp-search-results.sqlite"
    _measured_folder(spec, db_path, PP2, 0.123)
    # as `dd if=/dev/urandom of=DB bs=512 seek=5 count=1 conv=notrunc`, with fixed bytes
    with open(db_path, "r+b") as f:
        f.seek(5 * 512)
        f.write(bytes(range(256)) * 2)
    before = db_path.read_bytes()
    plan = _plan(tmp_path, PP2)
    for argv in (["results", str(spec)],
                 ["launch", str(spec), "--plan", str(plan), "--top-k", "1", *QUICK]):
        assert main(argv) == 2
        line = _error_line(capsys)
        assert "damaged" in line and str(db_path) in line and "--results NEW" in line, line
    assert db_path.read_bytes() == before  # never replaced
    assert [p.name for p in (spec.parent / "runs").iterdir()] == ["01-pp2-dp1-tmp1-mbs2-z0-"
                                                                  "measured"]  # nothing ran
    # kept aside, a new database at the same path takes the measured trial back
    db_path.rename(db_path.with_suffix(".broken"))
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", *QUICK]) == 0
    err = capsys.readouterr().err
    assert "took 1 measured trial(s) back" in err and "ok (cached), measured 0.123 s" in err
    assert [(r["status"], r["measured_mean_s"]) for r in _rows(db_path)] == [("ok", 0.123)]


# ----------------------------------------------------------------------------- 4. read-only, full

def _readonly_after(monkeypatch, flag: list) -> None:
    """From when flag[0] is set, the database opens read-only (as on a read-only file
    system; chmod does not stop root)."""
    real = ResultsDB._connect

    def connect(self):
        if not flag[0]:
            return real(self)
        con = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
        con.row_factory = sqlite3.Row
        return con

    monkeypatch.setattr(ResultsDB, "_connect", connect)


def test_read_only_database_during_a_trial_keeps_the_measurement_for_the_next_launch(
        spec, tmp_path, capsys, monkeypatch):
    import amp_search.launch.orchestrator as orch

    flag = [False]
    real_run = orch.run_commands

    def run_then_read_only(*args, **kw):
        out = real_run(*args, **kw)
        flag[0] = True  # the file system turns read-only while the trial runs
        return out

    monkeypatch.setattr(orch, "run_commands", run_then_read_only)
    _readonly_after(monkeypatch, flag)
    plan = _plan(tmp_path, PP2)
    db_path = spec.parent / "amp-search-results.sqlite"
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", *QUICK]) == 2
    line = _error_line(capsys)
    assert str(db_path) in line and "readonly" in line and "result.json" in line, line
    (row,) = _rows(db_path)
    assert row["status"] == "running"
    measured = json.loads((Path(row["trial_dir"]) / "result.json").read_text())["mean_s"]
    monkeypatch.undo()
    # the next launch records it from the folder and does not run it again
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", *QUICK]) == 0
    err = capsys.readouterr().err
    assert "recorded the result of 1 trial(s)" in err and "ok (cached)" in err
    (row,) = _rows(db_path)
    assert row["status"] == "ok" and row["measured_mean_s"] == measured


def test_read_only_database_at_the_start_is_one_line_and_starts_nothing(spec, tmp_path,
                                                                        capsys, monkeypatch):
    db_path = spec.parent / "amp-search-results.sqlite"
    ResultsDB(db_path)
    plan = _plan(tmp_path, PP2)
    (spec.parent / "runs").mkdir()
    if os.geteuid() != 0:  # a real read-only folder
        for p in (db_path, spec.parent / "runs", spec.parent):
            os.chmod(p, 0o555)
    else:
        _readonly_after(monkeypatch, [True])
    try:
        assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", *QUICK]) == 2
    finally:
        for p in (spec.parent, spec.parent / "runs", db_path):
            os.chmod(p, 0o755)
    line = _error_line(capsys)
    assert str(db_path) in line or str(spec.parent) in line, line
    assert "readonly" in line or "Read-only" in line or "ermission" in line, line
    assert not list((spec.parent / "runs").iterdir())  # nothing started, no folder left
    assert _rows(db_path) == []


def test_full_disk_is_one_line(spec, tmp_path, capsys, monkeypatch):
    real = ResultsDB._connect

    def full(self):  # the file cannot grow past its first page: "database or disk is full"
        con = real(self)
        con.execute("PRAGMA max_page_count=1")
        return con

    monkeypatch.setattr(ResultsDB, "_connect", full)
    assert main(["launch", str(spec), "--plan", str(_plan(tmp_path, PP2)), "--top-k", "1",
                 *QUICK]) == 2
    line = _error_line(capsys)
    assert "disk is full" in line and "amp-search-results.sqlite" in line, line
    monkeypatch.undo()
    assert not (spec.parent / "runs").exists() or not list((spec.parent / "runs").iterdir())
    assert main(["results", str(spec)]) == 0  # with room again, the file works
    assert "no trials recorded" in capsys.readouterr().out


# ----------------------------------------------------------------------------- 5. two at once

def _open_results(path, barrier, errors):
    barrier.wait()
    try:
        ResultsDB(path)
    except Exception as exc:        # noqa: BLE001 (reported to the parent)
        errors.put(str(exc))


def test_processes_opening_a_new_database_at_once_all_get_it(tmp_path):
    """Launches that open one new results database at the same moment: SQLite refuses the
    switch to write-ahead logging at once while another connection makes it, and two
    processes could both insert the schema version; each now waits its turn (it failed in
    12 of 180 openings, 6 processes at a time, before)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        pytest.skip("needs fork")
    ctx = multiprocessing.get_context("fork")
    errors = ctx.Queue()
    for i in range(10):
        barrier = ctx.Barrier(6)
        procs = [ctx.Process(target=_open_results,
                             args=(tmp_path / f"r{i}.sqlite", barrier, errors))
                 for _ in range(6)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=120)
            assert p.exitcode == 0
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    for i in range(10):
        assert ResultsDB(tmp_path / f"r{i}.sqlite", readonly=True)


def test_two_launches_on_one_database_run_each_trial_once(spec, tmp_path):
    plan = _plan(tmp_path, PP2, PP2B)
    launches = [_launch_process(spec, plan, "--top-k", "2", *QUICK) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in launches]
    for p, (out, err) in zip(launches, outs):
        assert p.returncode == 0, (out, err)
        _no_traceback(out + err)
    rows = _rows(spec.parent / "amp-search-results.sqlite")
    assert sorted(r["trial_key"] for r in rows) == sorted({r["trial_key"] for r in rows})
    assert len(rows) == 2 and all(r["status"] == "ok" for r in rows)
    # never two trials at a time (times to the second)
    a, b = sorted(rows, key=lambda r: r["started_at"])
    assert a["ended_at"] <= b["started_at"]
    runs = sum(err.count(": ok, measured") for _, err in outs)
    cached = sum(err.count(": ok (cached)") for _, err in outs)
    assert (runs, cached) == (2, 2), outs


def test_the_lock_says_who_holds_it(tmp_path):
    first, second = TrialLock(tmp_path / "r.sqlite"), TrialLock(tmp_path / "r.sqlite")
    assert first.acquire("pp2-dp1")
    try:
        assert not second.acquire("pp4", wait=False)
        assert second.holder()["pid"] == os.getpid()
        assert second.holder()["trial"] == "pp2-dp1"
    finally:
        first.release()
    assert second.acquire("pp4", wait=False)
    second.release()


# ----------------------------------------------------------------------------- 6. doctored plans

def test_plan_for_another_spec_is_refused(spec, tmp_path, capsys):
    other = load_yaml_file(ROOT / "configs" / "cpu-tiny.yaml")
    other["model"]["num_layers"] = 4
    other["model"]["hidden_size"] = 128
    plan = _plan(tmp_path, PP2, fingerprint=spec_fingerprint(parse_spec(other)))
    assert main(["launch", str(spec), "--plan", str(plan), *QUICK]) == 2
    line = _error_line(capsys)
    assert "was made for another spec" in line and "model differs" in line, line
    assert not (spec.parent / "amp-search-results.sqlite").exists()
    # its own fingerprint is accepted
    plan = _plan(tmp_path, PP2, fingerprint=spec_fingerprint(load_spec(spec)))
    assert main(["launch", str(spec), "--plan", str(plan), "--dry-run", *QUICK]) == 0


@pytest.mark.parametrize("row,rule", [
    ({**PP2, "pp": 3, "dp": 4, "partition": [0, 2, 4, 6],
      "placement": [[[0], [1], [2], [3]]] * 3}, "= 12 devices, but the cluster has 4"),
    ({**PP2, "mbs": 0}, "mbs 0: must be at least 1"),
    ({**PP2, "partition": [0, 3, 7]}, "does not split the model's 6 layers"),
    ({**PP2, "placement": [[[0]], [[9]]]}, "names device 9"),
    ({**PP2, "placement": [[[1]], [[1]]]}, "uses device 1 more than once"),
    ({**PP2, "dp": 2}, "placement is not pp 2 stages x dp 2 replicas"),
])
def test_bad_plan_rows_are_refused_before_anything_launches(spec, tmp_path, capsys, row, rule):
    plan = _plan(tmp_path, PP2, row)  # the good first row does not run either
    for extra in ([], ["--dry-run"]):
        assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "2", *QUICK,
                     *extra]) == 2
        line = _error_line(capsys)
        assert "strategies[1]" in line and rule in line, line
    assert not (spec.parent / "amp-search-results.sqlite").exists()
    assert not (spec.parent / "runs").exists()
