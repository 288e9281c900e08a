"""Every trial, recorded in SQLite (stdlib sqlite3), so results outlive the launch.

Schema (version 1): a `meta` table (schema_version) and a `results` table with one row per
trial *attempt*. An attempt is inserted as `running` before its processes start and updated
once, at the end, to its final status:

    ok | oom | failed | timeout      finished: a re-run of the same launch skips it
    interrupted                      Ctrl-C (or the launch died): not finished, runs again
    running                          in progress (or the launcher was killed hard)

A trial is identified by (spec_sha256, trial_key) with trial_key = strategy label + partition +
placement + backend: the same strategy on the same spec is the same trial.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UsageError

SCHEMA_VERSION = 1
FINISHED = ("ok", "oom", "failed", "timeout")
STATUSES = FINISHED + ("interrupted", "running")

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS results (
    id                INTEGER PRIMARY KEY AUTOINCREMENT,
    spec_sha256       TEXT NOT NULL,
    spec_path         TEXT,
    trial_key         TEXT NOT NULL,
    label             TEXT NOT NULL,
    backend           TEXT NOT NULL,
    launcher          TEXT NOT NULL,
    strategy_json     TEXT NOT NULL,
    partition_json    TEXT NOT NULL,
    placement_json    TEXT NOT NULL,
    predicted_s       REAL,
    measured_mean_s   REAL,
    measured_std_s    REAL,
    iters             INTEGER,
    warmup            INTEGER,
    peak_memory_bytes INTEGER,
    peak_memory_kind  TEXT,
    status            TEXT NOT NULL CHECK (status IN ({", ".join(f"'{s}'" for s in STATUSES)})),
    error             TEXT,
    log_path          TEXT,
    versions_json     TEXT,
    result_json       TEXT,
    started_at        TEXT NOT NULL,
    ended_at          TEXT
);
CREATE INDEX IF NOT EXISTS results_key ON results (spec_sha256, trial_key);
"""


@dataclass(frozen=True, kw_only=True)
class ResultRow:
    """One row of the results table."""

    id: int
    spec_sha256: str
    spec_path: str | None
    trial_key: str
    label: str
    backend: str
    launcher: str
    strategy: dict
    partition: list
    placement: list
    predicted_s: float | None
    measured_mean_s: float | None
    measured_std_s: float | None
    iters: int | None
    warmup: int | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None
    status: str
    error: str | None
    log_path: str | None
    versions: dict
    result: dict | None
    started_at: str
    ended_at: str | None

    @property
    def measured_s(self) -> float | None:
        """Measured seconds per iteration (the name amp_search.calibrate reads)."""
        return self.measured_mean_s

    def to_dict(self) -> dict:
        return asdict(self)


class ResultsDB:
    """The results database at `path` (created on first use).

    Each call opens its own short transaction, so the file is consistent after any
    interruption: a row is either `running`, or complete with its final status."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with closing(self._connect()) as con, con:
                con.executescript(_SCHEMA)
                row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    con.execute("INSERT INTO meta VALUES ('schema_version', ?)",
                                (str(SCHEMA_VERSION),))
                elif int(row[0]) != SCHEMA_VERSION:
                    raise UsageError(f"{self.path}: results schema version {row[0]}, this "
                                     f"amp-search reads version {SCHEMA_VERSION}; use another "
                                     f"--results file")
        except sqlite3.DatabaseError as exc:
            raise UsageError(f"{self.path}: not a usable results database ({exc})") from None
        except OSError as exc:
            raise UsageError(f"cannot create the results database {self.path}: {exc}") from None

    def _connect(self) -> sqlite3.Connection:
        con = sqlite3.connect(self.path, timeout=30)
        con.row_factory = sqlite3.Row
        return con

    def start(self, *, spec_sha256: str, spec_path: str | None, trial_key: str, label: str,
              backend: str, launcher: str, strategy: dict, predicted_s: float | None,
              iters: int, warmup: int, log_path: str, started_at: str) -> int:
        """Insert a `running` row; returns its id."""
        with closing(self._connect()) as con, con:
            cur = con.execute(
                "INSERT INTO results (spec_sha256, spec_path, trial_key, label, backend, "
                "launcher, strategy_json, partition_json, placement_json, predicted_s, iters, "
                "warmup, status, log_path, started_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)",
                (spec_sha256, spec_path, trial_key, label, backend, launcher,
                 json.dumps(strategy), json.dumps(strategy.get("partition")),
                 json.dumps(strategy.get("placement")), predicted_s, iters, warmup, log_path,
                 started_at))
            return int(cur.lastrowid)

    def finish(self, row_id: int, *, status: str, ended_at: str,
               measured_mean_s: float | None = None, measured_std_s: float | None = None,
               peak_memory_bytes: int | None = None, peak_memory_kind: str | None = None,
               error: str | None = None, versions: dict | None = None,
               result: dict | None = None) -> None:
        """Give a `running` row its final status and measurements."""
        assert status in STATUSES and status != "running", status
        with closing(self._connect()) as con, con:
            con.execute(
                "UPDATE results SET status=?, ended_at=?, measured_mean_s=?, measured_std_s=?, "
                "peak_memory_bytes=?, peak_memory_kind=?, error=?, versions_json=?, "
                "result_json=? WHERE id=?",
                (status, ended_at, measured_mean_s, measured_std_s, peak_memory_bytes,
                 peak_memory_kind, error, json.dumps(versions or {}),
                 None if result is None else json.dumps(result), row_id))

    def finished(self, spec_sha256: str, trial_key: str,
                 statuses: tuple[str, ...] = FINISHED) -> ResultRow | None:
        """The latest attempt of this trial that ended with one of `statuses`."""
        marks = ", ".join("?" for _ in statuses)
        with closing(self._connect()) as con:
            row = con.execute(
                f"SELECT * FROM results WHERE spec_sha256=? AND trial_key=? AND status IN "
                f"({marks}) ORDER BY id DESC LIMIT 1", (spec_sha256, trial_key, *statuses)
            ).fetchone()
        return None if row is None else _row(row)

    def rows(self, spec_sha256: str | None = None) -> list[ResultRow]:
        """All attempts (of one spec), oldest first."""
        with closing(self._connect()) as con:
            if spec_sha256 is None:
                cur = con.execute("SELECT * FROM results ORDER BY id")
            else:
                cur = con.execute("SELECT * FROM results WHERE spec_sha256=? ORDER BY id",
                                  (spec_sha256,))
            return [_row(r) for r in cur.fetchall()]


def _row(r: sqlite3.Row) -> ResultRow:
    return ResultRow(
        id=r["id"], spec_sha256=r["spec_sha256"], spec_path=r["spec_path"],
        trial_key=r["trial_key"], label=r["label"], backend=r["backend"],
        launcher=r["launcher"], strategy=json.loads(r["strategy_json"]),
        partition=json.loads(r["partition_json"]), placement=json.loads(r["placement_json"]),
        predicted_s=r["predicted_s"], measured_mean_s=r["measured_mean_s"],
        measured_std_s=r["measured_std_s"], iters=r["iters"], warmup=r["warmup"],
        peak_memory_bytes=r["peak_memory_bytes"], peak_memory_kind=r["peak_memory_kind"],
        status=r["status"], error=r["error"], log_path=r["log_path"],
        versions=json.loads(r["versions_json"] or "{}"),
        result=None if r["result_json"] is None else json.loads(r["result_json"]),
        started_at=r["started_at"], ended_at=r["ended_at"])
