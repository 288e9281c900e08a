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
    assert db.finished("abc", "k1").id == b
    assert db.finished("abc", "k1", ("ok",)) is None
    assert [r.status for r in db.rows("abc")] == ["interrupted", "failed"]
    assert db.rows("other") == []


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
