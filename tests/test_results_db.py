"""The SQLite results database and `amp-search results`."""
from __future__ import annotations

import sqlite3

import pytest

from amp_search.errors import UsageError
from amp_search.launch.results_db import SCHEMA_VERSION, ResultsDB

STRATEGY = {"pp": 2, "dp": 1, "tmp": 1, "mbs": 1, "global_batch_size": 4,
            "partition": [0, 3, 6], "placement": [[[0]], [[1]]]}


def _start(db, key="k1", **kw):
    return db.start(spec_sha256="abc", spec_path="s.yaml", trial_key=key, label="pp2",
                    backend="deepspeed", launcher="local", strategy=STRATEGY, predicted_s=0.5,
                    iters=4, warmup=2, log_path="/l", started_at="t0", **kw)


def test_schema_and_round_trip(tmp_path):
    db = ResultsDB(tmp_path / "r.sqlite")
    rid = _start(db)
    assert db.finished("abc", "k1") is None  # running is not finished
    db.finish(rid, status="ok", ended_at="t1", measured_mean_s=0.4, measured_std_s=0.01,
              peak_memory_bytes=123, peak_memory_kind="cpu_max_rss_approx",
              versions={"torch": "x"}, result={"losses": [1.0]})
    row = db.finished("abc", "k1")
    assert row.status == "ok" and row.measured_mean_s == 0.4 and row.measured_s == 0.4
    assert row.partition == [0, 3, 6] and row.placement == [[[0]], [[1]]]
    assert row.versions == {"torch": "x"} and row.result == {"losses": [1.0]}
    con = sqlite3.connect(tmp_path / "r.sqlite")
    assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
        str(SCHEMA_VERSION),)


def test_interrupted_is_not_finished_and_latest_wins(tmp_path):
    db = ResultsDB(tmp_path / "r.sqlite")
    a = _start(db)
    db.finish(a, status="interrupted", ended_at="t1")
    assert db.finished("abc", "k1") is None
    b = _start(db)
    db.finish(b, status="failed", ended_at="t2", error="boom")
    # a failure that may not recur is not kept for good: it runs again (unless --no-retry)
    assert db.finished("abc", "k1") is None
    assert db.finished("abc", "k1", final_only=False).id == b
    c = _start(db)
    db.finish(c, status="failed", ended_at="t3", error="invalid plan", final=True)
    assert db.finished("abc", "k1").id == c
    assert db.finished("abc", "k1", ("ok",)) is None
    assert [r.status for r in db.rows("abc")] == ["interrupted", "failed", "failed"]
    assert db.rows("other") == []


def test_only_a_real_out_of_memory_is_final_by_default(tmp_path):
    db = ResultsDB(tmp_path / "r.sqlite")
    a = _start(db)
    db.finish(a, status="oom", ended_at="t1", error="torch.OutOfMemoryError: CUDA out of memory")
    assert db.finished("abc", "k1").final
    b = _start(db, key="k2")
    db.finish(b, status="oom", ended_at="t1", error="Connection reset by peer")
    assert db.finished("abc", "k2") is None


def test_rows_name_their_launch_and_folder(tmp_path):
    import os
    import socket

    db = ResultsDB(tmp_path / "r.sqlite")
    rid = _start(db, trial_dir="/runs/01")
    row = db.running()[0]
    assert row.id == rid and row.launcher_pid == os.getpid()
    assert row.launcher_host == socket.gethostname() and row.launcher_started > 0
    assert str(row.folder) == "/runs/01"
    # a recovery completes a running row once only
    assert db.finish(rid, status="interrupted", ended_at="t1", only_running=True)
    assert not db.finish(rid, status="ok", ended_at="t2", only_running=True)
    assert db.rows()[0].status == "interrupted"


def test_write_ahead_log(tmp_path):
    ResultsDB(tmp_path / "r.sqlite")
    con = sqlite3.connect(tmp_path / "r.sqlite")
    assert con.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def test_schema_1_is_migrated(tmp_path):
    """A database written by amp-search before schema 2 keeps working: columns are added
    and what was final stays final (ok, a real OOM, an invalid plan)."""
    from amp_search.launch.results_db import _SCHEMA, _V2_COLUMNS

    p = tmp_path / "r.sqlite"
    v1 = _SCHEMA
    for name, kind in _V2_COLUMNS:
        v1 = v1.replace(f",\n    {name:<17} {kind}", "")
    assert "final" not in v1 and "trial_dir" not in v1
    with sqlite3.connect(p) as con:
        con.executescript(v1)
        con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
        for status, error, log in [("ok", None, "/r/1/log.txt"),
                                   ("oom", "CUDA out of memory", "/r/2/log.txt"),
                                   ("oom", "Connection reset by peer", "/r/3/log.txt"),
                                   ("failed", "rejects ZeRO stage 2", ""),
                                   ("timeout", "stopped", "/r/5/log.txt")]:
            con.execute("INSERT INTO results (spec_sha256, trial_key, label, backend, launcher,"
                        " strategy_json, partition_json, placement_json, status, error, "
                        "log_path, started_at) VALUES ('abc', ?, 'l', 'deepspeed', 'local', "
                        "'{}', '[]', '[]', ?, ?, ?, 't')", (status + str(error), status, error,
                                                           log))
    db = ResultsDB(p)
    rows = db.rows("abc")
    assert [r.final for r in rows] == [True, True, False, True, False]
    assert str(rows[0].folder) == "/r/1"
    with sqlite3.connect(p) as con:
        assert con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone() == (
            str(SCHEMA_VERSION),)
    # read-only use of a schema 1 file (no migration)
    p2 = tmp_path / "v1.sqlite"
    with sqlite3.connect(p2) as con:
        con.executescript(v1)
        con.execute("INSERT INTO meta VALUES ('schema_version', '1')")
    assert ResultsDB(p2, readonly=True).rows() == []


def test_status_is_checked(tmp_path):
    ResultsDB(tmp_path / "r.sqlite")  # creates the schema
    with pytest.raises(sqlite3.IntegrityError):
        with sqlite3.connect(tmp_path / "r.sqlite") as con:
            con.execute("UPDATE results SET status='weird'")
            con.execute("INSERT INTO results (spec_sha256, trial_key, label, backend, "
                        "launcher, strategy_json, partition_json, placement_json, status, "
                        "started_at) VALUES ('a','b','c','d','e','{}','[]','[]','weird','t')")


def test_schema_version_mismatch(tmp_path):
    p = tmp_path / "r.sqlite"
    ResultsDB(p)
    with sqlite3.connect(p) as con:
        con.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    with pytest.raises(UsageError, match="schema version 99"):
        ResultsDB(p)


def test_not_a_database(tmp_path):
    p = tmp_path / "r.sqlite"
    p.write_text("hello, not sqlite" * 100)
    with pytest.raises(UsageError, match="not a usable results database"):
        ResultsDB(p)
