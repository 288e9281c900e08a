"""Every trial, recorded in SQLite (stdlib sqlite3), so results outlive the launch.

Schema (version 2): a `meta` table (schema_version) and a `results` table with one row per
trial *attempt*. An attempt is inserted as `running` before its processes start and updated
once, at the end, to its final status:

    ok | oom | failed | timeout      finished
    interrupted                      Ctrl-C, the budget, or the launch died: runs again
    running                          in progress (or its launch was killed hard: the next
                                     launch or `amp-search results` recovers it)

`final` says whether a finished attempt is kept for good (a re-run of the same launch skips
it): ok, a real out-of-memory and an invalid plan are; a peer's death, a crash or a timeout
may not recur and run again (unless `launch --no-retry`). Each row also names the launch that
ran it (host, pid, process start time) and its trial folder, so a row left `running` by a
launch that is gone can be told from one in progress and completed from the folder's
result.json.

A trial is identified by (spec_sha256, trial_key) with trial_key = strategy label + partition +
placement + backend: the same strategy on the same spec is the same trial.

The file is a log that survives: write-ahead logging (WAL), one short transaction per call,
and every failure to read or write it (read-only or full file system, a damaged file) raised as
one `ResultsDBError` line naming the file and the cause. A damaged file is never replaced.
Trials of launches that share a database take turns through `TrialLock`, an flock on the file
`<database>.lock` beside it.

Version 1 databases are migrated in place (columns added with ALTER TABLE).
"""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
from contextlib import closing, contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from ..errors import UsageError
from .process import out_of_memory_in

SCHEMA_VERSION = 2
FINISHED = ("ok", "oom", "failed", "timeout")
STATUSES = FINISHED + ("interrupted", "running")
BUSY_TIMEOUT_S = 30.0
"""How long a write waits for another process's transaction before giving up."""

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
    ended_at          TEXT,
    final             INTEGER,
    launcher_host     TEXT,
    launcher_pid      INTEGER,
    launcher_started  REAL,
    trial_dir         TEXT
);
CREATE INDEX IF NOT EXISTS results_key ON results (spec_sha256, trial_key);
"""

_V2_COLUMNS = (("final", "INTEGER"), ("launcher_host", "TEXT"), ("launcher_pid", "INTEGER"),
               ("launcher_started", "REAL"), ("trial_dir", "TEXT"))
"""Columns version 2 added to version 1's results table."""


class ResultsDBError(UsageError):
    """The results database cannot be read or written (one line: the file and the cause).
    `damaged`: the file itself is broken (not a full disk or a read-only file system)."""

    def __init__(self, message: str, *, damaged: bool = False):
        super().__init__(message)
        self.damaged = damaged


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
    final: bool = False
    """A finished attempt kept for good (not run again by the next launch)."""
    launcher_host: str | None = None
    """Host of the launch that ran it (None: recorded by amp-search before schema 2)."""
    launcher_pid: int | None = None
    launcher_started: float | None = None
    """Start time of the launch's process (seconds since the epoch), to tell a reused pid."""
    trial_dir: str | None = None

    @property
    def measured_s(self) -> float | None:
        """Measured seconds per iteration (the name amp_search.calibrate reads)."""
        return self.measured_mean_s

    @property
    def folder(self) -> Path | None:
        """The trial's folder (from the log path for rows of schema 1)."""
        if self.trial_dir:
            return Path(self.trial_dir)
        return Path(self.log_path).parent if self.log_path else None

    def to_dict(self) -> dict:
        return asdict(self)


def default_final(status: str, error: str | None = None) -> bool:
    """Whether an attempt that ended with `status` is kept for good when the caller does not
    say: ok, and out of memory where the error says so."""
    return status == "ok" or (status == "oom" and out_of_memory_in(error or ""))


def describe_error(path: Path, exc: BaseException, action: str) -> str:
    """One line naming the file, what failed and why, with what to do about it."""
    cause = str(exc) or type(exc).__name__
    if isinstance(exc, OSError) and exc.strerror:
        cause = exc.strerror
    low = cause.lower()
    if "malformed" in low or "not a database" in low or "corrupt" in low:
        return (f"{path}: the results database is damaged ({cause}); it is left as it is: "
                f"keep it aside (mv {path} {path}.broken) and launch again to start a new one "
                f"there, which takes the measured trials back from their folders, or start "
                f"one elsewhere with --results NEW")
    if "readonly" in low or "read-only" in low or "permission" in low or "access" in low \
            or "unable to open" in low:
        hint = " (a read-only file system or no write permission: give another --results)"
    elif "full" in low or "no space" in low:
        hint = " (the disk is full: free space or give another --results)"
    elif "i/o error" in low:
        hint = " (the disk may be full or failing: free space or give another --results)"
    elif "locked" in low or "busy" in low:
        hint = f" (another process held it for more than {BUSY_TIMEOUT_S:.0f} s)"
    else:
        hint = ""
    return f"{path}: cannot {action}: {cause}{hint}"


class ResultsDB:
    """The results database at `path` (created on first use).

    Each call opens its own short transaction, so the file is consistent after any
    interruption: a row is either `running`, or complete with its final status. Every
    sqlite3 or OS error is raised as ResultsDBError (one line)."""

    def __init__(self, path: str | Path, *, readonly: bool = False):
        """`readonly`: open an existing database for reading only (no schema change, no
        migration; schema 1 is read as it is)."""
        self.path = Path(path)
        self.readonly = readonly
        if readonly:
            if not self.path.is_file():
                raise ResultsDBError(f"no results database at {self.path}")
            with self._guard("read the results database"):
                with closing(self._connect()) as con:
                    self._check_version(con, readonly=True)
                    self._quick_check(con)
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ResultsDBError(describe_error(self.path.parent, exc,
                                                "create the results folder")) from None
        with self._guard("open the results database"):
            with closing(self._connect()) as con:
                self._quick_check(con)
                self._use_wal(con)
                # one process at a time creates or migrates the schema (two launches may
                # open a new database at once): the script takes the write lock first, and
                # the version check runs inside that transaction
                con.isolation_level = None
                try:
                    con.executescript("BEGIN IMMEDIATE;\n" + _SCHEMA)
                    self._check_version(con, readonly=False)
                except BaseException:
                    try:
                        con.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass        # SQLite rolled it back itself (disk full, I/O error)
                    raise
                con.execute("COMMIT")

    # ------------------------------------------------------------------------ plumbing

    @contextmanager
    def _guard(self, action: str) -> Iterator[None]:
        try:
            yield
        except ResultsDBError:
            raise
        except sqlite3.DatabaseError as exc:
            if "file is not a database" in str(exc):
                raise ResultsDBError(f"{self.path}: not a usable results database ({exc}); "
                                     f"it is left as it is: give another --results",
                                     damaged=True) from None
            text = describe_error(self.path, exc, action)
            raise ResultsDBError(text, damaged="is damaged" in text) from None
        except sqlite3.Error as exc:
            raise ResultsDBError(describe_error(self.path, exc, action)) from None
        except OSError as exc:
            raise ResultsDBError(describe_error(self.path, exc, action)) from None

    def _connect(self) -> sqlite3.Connection:
        if self.readonly:
            uri = self.path.resolve().as_uri()
            con = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
            try:
                con.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                # a WAL database in a folder that cannot be written (no -shm file can be made)
                # reads as immutable, where no -wal file holds what the file itself lacks
                con.close()
                wal = Path(str(self.path) + "-wal")
                if wal.exists() and wal.stat().st_size > 0:
                    raise
                con = sqlite3.connect(f"{uri}?immutable=1", uri=True, timeout=BUSY_TIMEOUT_S)
        else:
            con = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S)
        con.row_factory = sqlite3.Row
        return con

    @staticmethod
    def _use_wal(con: sqlite3.Connection) -> None:
        """Switch the database to write-ahead logging. SQLite answers "database is locked"
        at once, without waiting, while another connection switches it too (two launches
        opening a new database): try again until BUSY_TIMEOUT_S."""
        deadline = time.monotonic() + BUSY_TIMEOUT_S
        while True:
            try:
                if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                    con.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)

    def _quick_check(self, con: sqlite3.Connection) -> None:
        bad = [r[0] for r in con.execute("PRAGMA quick_check").fetchall()]
        if bad != ["ok"]:
            raise sqlite3.DatabaseError(f"database disk image is malformed ({bad[0]})")

    def _check_version(self, con: sqlite3.Connection, *, readonly: bool) -> None:
        row = con.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
        if row is None and not readonly:
            con.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            return
        version = None if row is None else row[0]
        if version == "1" and not readonly:
            self._migrate_v1(con)
        elif version not in ("1", str(SCHEMA_VERSION)):
            raise ResultsDBError(f"{self.path}: results schema version {version}, this "
                                 f"amp-search reads versions 1 and {SCHEMA_VERSION}; use "
                                 f"another --results file")

    def _migrate_v1(self, con: sqlite3.Connection) -> None:
        """Schema 1 -> 2: the launch and folder columns, and `final` from what schema 1 knew
        (ok; out of memory where the error says so; a failure recorded without starting any
        process, i.e. an invalid plan)."""
        have = {r[1] for r in con.execute("PRAGMA table_info(results)")}
        for name, kind in _V2_COLUMNS:
            if name not in have:
                con.execute(f"ALTER TABLE results ADD COLUMN {name} {kind}")
        for rid, status, error, log_path in con.execute(
                "SELECT id, status, error, log_path FROM results WHERE final IS NULL "
                "AND status != 'running'").fetchall():
            final = default_final(status, error) or (status == "failed" and not log_path)
            con.execute("UPDATE results SET final=? WHERE id=?", (int(final), rid))
        con.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))

    @contextmanager
    def _write(self, action: str) -> Iterator[sqlite3.Connection]:
        """A write transaction taken at once (BEGIN IMMEDIATE), committed on success."""
        if self.readonly:
            raise ResultsDBError(f"{self.path}: opened read-only; cannot {action}")
        with self._guard(action):
            with closing(self._connect()) as con:
                con.isolation_level = None
                con.execute("BEGIN IMMEDIATE")
                try:
                    yield con
                except BaseException:
                    try:
                        con.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # a failed write may have ended the transaction already
                    raise
                con.execute("COMMIT")

    # ------------------------------------------------------------------------ writes

    def start(self, *, spec_sha256: str, spec_path: str | None, trial_key: str, label: str,
              backend: str, launcher: str, strategy: dict, predicted_s: float | None,
              iters: int, warmup: int, log_path: str, started_at: str,
              trial_dir: str | None = None, launcher_pid: int | None = None,
              launcher_host: str | None = None,
              launcher_started: float | None = None) -> int:
        """Insert a `running` row; returns its id. The launch is this process unless given."""
        if launcher_pid is None:
            me = this_launch()
            launcher_pid, launcher_host = me["launcher_pid"], me["launcher_host"]
            launcher_started = me["launcher_started"]
        with self._write(f"record the start of trial {label}") as con:
            cur = con.execute(
                "INSERT INTO results (spec_sha256, spec_path, trial_key, label, backend, "
                "launcher, strategy_json, partition_json, placement_json, predicted_s, iters, "
                "warmup, status, log_path, started_at, trial_dir, launcher_pid, launcher_host, "
                "launcher_started) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?)",
                (spec_sha256, spec_path, trial_key, label, backend, launcher,
                 json.dumps(strategy), json.dumps(strategy.get("partition")),
                 json.dumps(strategy.get("placement")), predicted_s, iters, warmup, log_path,
                 started_at, trial_dir, launcher_pid, launcher_host, launcher_started))
            return int(cur.lastrowid)

    def finish(self, row_id: int, *, status: str, ended_at: str,
               measured_mean_s: float | None = None, measured_std_s: float | None = None,
               peak_memory_bytes: int | None = None, peak_memory_kind: str | None = None,
               error: str | None = None, versions: dict | None = None,
               result: dict | None = None, final: bool | None = None,
               only_running: bool = False) -> bool:
        """Give a row its final status and measurements. `final` (default: `default_final`)
        keeps a finished attempt for good. `only_running`: update it only if it is still
        `running` (what recovering an orphaned row uses, so two recoveries never both do).
        Returns whether the row was updated."""
        assert status in STATUSES and status != "running", status
        if final is None:
            final = default_final(status, error)
        with self._write(f"record the end of trial row {row_id}") as con:
            cur = con.execute(
                "UPDATE results SET status=?, ended_at=?, measured_mean_s=?, measured_std_s=?, "
                "peak_memory_bytes=?, peak_memory_kind=?, error=?, versions_json=?, "
                "result_json=?, final=? WHERE id=?" + (" AND status='running'"
                                                       if only_running else ""),
                (status, ended_at, measured_mean_s, measured_std_s, peak_memory_bytes,
                 peak_memory_kind, error, json.dumps(versions or {}),
                 None if result is None else json.dumps(result), int(bool(final)), row_id))
            return cur.rowcount > 0

    def import_trial(self, *, trial_dir: str, **row) -> int | None:
        """Insert a finished attempt found in a trial folder no row names (a database that
        was started afresh); None if a row already names the folder. `row` holds start()'s
        and finish()'s keywords."""
        with self._write(f"import the trial in {trial_dir}") as con:
            if con.execute("SELECT 1 FROM results WHERE trial_dir=? OR log_path=?",
                           (trial_dir, str(Path(trial_dir) / "log.txt"))).fetchone():
                return None
            s = row["strategy"]
            cur = con.execute(
                "INSERT INTO results (spec_sha256, spec_path, trial_key, label, backend, "
                "launcher, strategy_json, partition_json, placement_json, predicted_s, iters, "
                "warmup, status, log_path, started_at, trial_dir, launcher_pid, launcher_host, "
                "launcher_started, ended_at, measured_mean_s, measured_std_s, "
                "peak_memory_bytes, peak_memory_kind, error, versions_json, result_json, final) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, "
                "?, ?, ?, ?)",
                (row["spec_sha256"], row.get("spec_path"), row["trial_key"], row["label"],
                 row["backend"], row["launcher"], json.dumps(s),
                 json.dumps(s.get("partition")), json.dumps(s.get("placement")),
                 row.get("predicted_s"), row.get("iters"), row.get("warmup"), row["status"],
                 row.get("log_path"), row["started_at"], trial_dir, row.get("launcher_pid"),
                 row.get("launcher_host"), row.get("launcher_started"), row.get("ended_at"),
                 row.get("measured_mean_s"), row.get("measured_std_s"),
                 row.get("peak_memory_bytes"), row.get("peak_memory_kind"), row.get("error"),
                 json.dumps(row.get("versions") or {}),
                 None if row.get("result") is None else json.dumps(row["result"]),
                 int(bool(row.get("final", default_final(row["status"], row.get("error")))))))
            return int(cur.lastrowid)

    # ------------------------------------------------------------------------ reads

    def finished(self, spec_sha256: str, trial_key: str,
                 statuses: tuple[str, ...] = FINISHED, *,
                 final_only: bool = True) -> ResultRow | None:
        """The latest attempt of this trial that ended with one of `statuses` and, with
        `final_only`, is kept for good."""
        marks = ", ".join("?" for _ in statuses)
        with self._guard("read the results database"), closing(self._connect()) as con:
            final = " AND final=1" if final_only and self._has_final(con) else ""
            row = con.execute(
                f"SELECT * FROM results WHERE spec_sha256=? AND trial_key=? AND status IN "
                f"({marks}){final} ORDER BY id DESC LIMIT 1", (spec_sha256, trial_key, *statuses)
            ).fetchone()
        return None if row is None else _row(row)

    def rows(self, spec_sha256: str | None = None) -> list[ResultRow]:
        """All attempts (of one spec), oldest first."""
        with self._guard("read the results database"), closing(self._connect()) as con:
            if spec_sha256 is None:
                cur = con.execute("SELECT * FROM results ORDER BY id")
            else:
                cur = con.execute("SELECT * FROM results WHERE spec_sha256=? ORDER BY id",
                                  (spec_sha256,))
            return [_row(r) for r in cur.fetchall()]

    def running(self) -> list[ResultRow]:
        """Every row still `running` (in progress, or left by a launch that is gone)."""
        with self._guard("read the results database"), closing(self._connect()) as con:
            return [_row(r) for r in con.execute(
                "SELECT * FROM results WHERE status='running' ORDER BY id").fetchall()]

    def trial_dirs(self) -> set[str]:
        """The trial folders the rows name."""
        with self._guard("read the results database"), closing(self._connect()) as con:
            out = set()
            cols = _columns(con)
            for r in con.execute("SELECT * FROM results").fetchall():
                if "trial_dir" in cols and r["trial_dir"]:
                    out.add(str(Path(r["trial_dir"])))
                elif r["log_path"]:
                    out.add(str(Path(r["log_path"]).parent))
            return out

    @staticmethod
    def _has_final(con: sqlite3.Connection) -> bool:
        return "final" in _columns(con)


def _columns(con: sqlite3.Connection) -> set[str]:
    return {r[1] for r in con.execute("PRAGMA table_info(results)")}


def _row(r: sqlite3.Row) -> ResultRow:
    keys = set(r.keys())
    extra = {k: r[k] for k in ("launcher_host", "launcher_pid", "launcher_started",
                               "trial_dir") if k in keys}
    final = r["final"] if "final" in keys else None
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
        started_at=r["started_at"], ended_at=r["ended_at"],
        final=bool(final) if final is not None else default_final(r["status"], r["error"]),
        **extra)


# ----------------------------------------------------------------------------- processes

def process_start_time(pid: int) -> float | None:
    """When process `pid` started (seconds since the epoch); None if it is gone or cannot
    be told. With the pid, it names a process even after the pid is reused."""
    try:
        import psutil

        return float(psutil.Process(pid).create_time())
    except Exception:  # noqa: BLE001 - psutil missing, or the process is gone
        return None


def this_launch() -> dict:
    """The row columns that name this process as the launch (host, pid, start time)."""
    pid = os.getpid()
    return {"launcher_pid": pid, "launcher_host": socket.gethostname(),
            "launcher_started": process_start_time(pid)}


def launch_alive(row: ResultRow) -> bool | None:
    """Whether the launch that ran `row` still runs: True / False on this host, None where
    it cannot be told (another host, or a row of schema 1)."""
    if row.launcher_pid is None or row.launcher_host != socket.gethostname():
        return None
    started = process_start_time(row.launcher_pid)
    if started is None:
        try:
            os.kill(row.launcher_pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return row.launcher_started is None
    return row.launcher_started is None or abs(started - row.launcher_started) < 1.0


# ----------------------------------------------------------------------------- the lock

class TrialLock:
    """Trials of launches sharing a results database take turns: an exclusive flock on
    `<database>.lock`, held while a trial runs and is recorded. The holder writes its pid,
    host, start time and trial into the file, so that a waiting launch can say whom it waits
    for. The lock goes with the process: a launch killed hard holds nothing."""

    def __init__(self, db_path: str | Path):
        self.path = Path(str(db_path) + ".lock")
        self._fd: int | None = None

    def holder(self) -> dict:
        """What the holder wrote (pid, host, since, trial); {} if unreadable."""
        try:
            return json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return {}

    def acquire(self, what: str, *, wait: bool = True, poll_s: float = 0.5,
                on_wait: Callable[[dict], None] | None = None) -> bool:
        """Take the lock for `what` (a trial label). If another process holds it: wait
        (calling `on_wait(holder)` once) or, with wait=False, return False."""
        import fcntl

        assert self._fd is None, "already held"
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ResultsDBError(describe_error(self.path, exc, "create the lock file")) \
                from None
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not wait:
                    os.close(fd)
                    return False
                if not told and on_wait is not None:
                    on_wait(self.holder())
                told = True
                time.sleep(poll_s)
            except OSError as exc:
                os.close(fd)
                raise ResultsDBError(describe_error(self.path, exc, "lock")) from None
        self._fd = fd
        info = {"pid": os.getpid(), "host": socket.gethostname(),
                "since": time.strftime("%Y-%m-%d %H:%M:%S"), "trial": what}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
        except OSError:
            pass  # who holds it is only a courtesy to waiting launches
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the file releases the flock
            self._fd = None

    @contextmanager
    def held(self, what: str, *, on_wait: Callable[[dict], None] | None = None
             ) -> Iterator[None]:
        self.acquire(what, on_wait=on_wait)
        try:
            yield
        finally:
            self.release()


def holder_text(info: dict) -> str:
    """'pid 123 on host h (since ..., trial ...)' for a waiting message."""
    if not info:
        return "another process"
    return (f"pid {info.get('pid')} on {info.get('host')} (since {info.get('since')}, "
            f"trial {info.get('trial')})")
