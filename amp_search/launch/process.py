"""Run a trial's commands to the end, to a timeout, or to Ctrl-C, and never leave a process
behind.

Each command starts in its own session (`start_new_session=True`): its process group holds
everything it forks, except what makes its own session (torchrun starts every worker in a new
session). Stopping a trial therefore signals the command's group *and* the group of every
descendant found under it: SIGTERM first, SIGKILL after a grace period. The orchestrator's own
group is never signalled.

Trials die with their launch: on Linux each command gets a parent-death signal
(prctl(PR_SET_PDEATHSIG, SIGTERM), so torchrun stops its workers when the launch is killed
hard), and amp_search.trial.run's ranks set their own (SIGKILL) towards torchrun. Every
process of a trial carries TRIAL_DIR_VAR in its environment, so that a later launch finds and
ends what a launch killed before it left behind (`trial_processes`, `stop_trial_processes`).

Failures are told apart truthfully: `oom` only where the log says memory ran out (or the
kernel's OOM killer acted during the trial); a rank that was killed is `failed: rank N exited
(signal 9: SIGKILL)`.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable

from .launchers import Command

from ..trial.run import ERROR_MARKER, PR_SET_PDEATHSIG, prctl_function

KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL."""
PEER_EXIT_GRACE_S = 15.0
"""After one command of a multi-command trial fails, how long the others get to exit."""

TRIAL_DIR_VAR = "AMP_SEARCH_TRIAL_DIR"
"""Environment variable naming the trial folder in every process of a trial."""

_OOM = re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory|std::bad_alloc",
                  re.IGNORECASE)
# torchrun's report (ChildFailedError) lists every rank that failed: "Failures:" then
# "Root Cause (first observed failure):", one "[i]:" entry each, with its rank and exit code
# (negative: a signal). Lines may carry a prefix (pdsh's "host: ", srun --label's "0: ").
_FAILURES = re.compile(r"(?:^|[\s:])Failures:\s*$")
_ROOT_CAUSE = re.compile(r"Root Cause \(first observed failure\):\s*$")
_ENTRY = re.compile(r"(?:^|[\s:])\[\d+\]:\s*$")
_ENTRY_TIME = re.compile(r"(?:^|\s)time\s*:\s*(\S+)")
_ENTRY_RANK = re.compile(r"(?:^|\s)rank\s*:\s*(\d+)")
_ENTRY_EXIT = re.compile(r"(?:^|\s)exitcode\s*:\s*(-?\d+)(?:\s*\(pid:\s*(\d+)\))?")
_REPORT_END = re.compile(r"(?:^|[\s:])={3,}\s*$")


@dataclass(frozen=True, kw_only=True)
class ProcessOutcome:
    """How a trial's processes ended."""

    returncodes: tuple[int | None, ...]
    """One per command (negative: killed by that signal)."""
    timed_out: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(rc == 0 for rc in self.returncodes)

    def to_dict(self) -> dict:
        return {"returncodes": list(self.returncodes), "timed_out": self.timed_out,
                "wall_s": self.wall_s}


def parent_death_hook(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get `sig` when this process dies (Linux prctl);
    None where the platform has no such call. The child exits at once if this process died
    before the call took effect."""
    prctl = prctl_function()
    if prctl is None:
        return None
    parent = os.getpid()

    def hook() -> None:  # runs in the child between fork and exec: no allocation-heavy code
        prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return hook


def _descendants(pid: int) -> list[int]:
    try:
        import psutil

        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except Exception:  # psutil missing, or the process is gone
        return []


def _signal_tree(pids: list[int], sig: int) -> None:
    """Send `sig` to the process group of each pid (never our own group)."""
    own = os.getpgrp()
    groups = set()
    for pid in pids:
        try:
            groups.add(os.getpgid(pid))
        except ProcessLookupError:
            continue
    for pgid in groups - {own}:
        try:
            os.killpg(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def stop(procs: list[subprocess.Popen], grace_s: float = KILL_GRACE_S) -> None:
    """Stop the processes, their groups and all their descendants."""
    tree = []
    for p in procs:
        if p.poll() is None:
            tree += [p.pid, *_descendants(p.pid)]
        else:
            tree += _descendants(p.pid)
    if not tree:
        return
    _signal_tree(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        alive = [p for p in procs if p.poll() is None]
        if not alive and not any(_exists(pid) for pid in tree):
            break
        time.sleep(0.1)
    for p in procs:
        if p.poll() is None:
            tree += _descendants(p.pid)
    _signal_tree(tree, signal.SIGKILL)
    for p in procs:
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie still "exists"; treat it as gone
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def run_commands(commands: tuple[Command, ...], *, base_env: dict, cwd: Path, log_path: Path,
                 timeout_s: float, poll_s: float = 0.1,
                 die_with_parent: bool = True) -> ProcessOutcome:
    """Start all commands (argv lists, no shell), wait for them, return how they ended.

    All output goes to `log_path`. On timeout, or once any command has failed and the others
    have not exited within PEER_EXIT_GRACE_S, everything is stopped. KeyboardInterrupt stops
    everything and propagates. `die_with_parent`: the commands get SIGTERM when this process
    dies (where the platform allows; see `parent_death_hook`)."""
    procs: list[subprocess.Popen] = []
    hook = parent_death_hook() if die_with_parent else None
    t0 = time.monotonic()
    timed_out = False
    with open(log_path, "ab") as log:
        try:
            for c in commands:
                log.write(f"$ {c.display()}\n".encode())
                log.flush()
                procs.append(subprocess.Popen(list(c.argv), env={**base_env, **c.env},
                                              cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL,
                                              start_new_session=True, preexec_fn=hook))
            failed_at = None
            while True:
                # poll every process (any() would stop at the first running one, and a
                # later command's death would go unseen while the first runs on)
                running = [p.poll() is None for p in procs]
                if not any(running):
                    break
                now = time.monotonic()
                if now - t0 > timeout_s:
                    timed_out = True
                    break
                if failed_at is None and any(p.returncode not in (None, 0) for p in procs):
                    failed_at = now
                if failed_at is not None and now - failed_at > PEER_EXIT_GRACE_S:
                    break
                time.sleep(poll_s)
        except BaseException:
            stop(procs)
            raise
        finally:
            stop(procs)  # any leftover descendants (a no-op when all exited cleanly)
    return ProcessOutcome(returncodes=tuple(p.returncode for p in procs), timed_out=timed_out,
                          wall_s=time.monotonic() - t0)


def log_tail(path: Path, lines: int = 20, max_bytes: int = 1 << 16) -> str:
    """The last `lines` lines of a log."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            text = f.read().decode(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def classify_failure(outcome: ProcessOutcome, log_text: str, *,
                     oom_killed: bool = False) -> str:
    """timeout | oom | failed for a trial that did not end well. `oom` only where the log
    says memory ran out, or where a process was killed (SIGKILL) while the kernel's OOM
    killer acted (`oom_killed`, from `oom_kill_count` before and after): a rank killed by
    anything else, and its peers' "Connection reset by peer", are `failed`."""
    if outcome.timed_out:
        return "timeout"
    if _OOM.search(log_text):
        return "oom"
    if oom_killed and (any(rc in (137, -signal.SIGKILL) for rc in outcome.returncodes)
                       or killed_rank(log_text) is not None):
        return "oom"
    return "failed"


def out_of_memory_in(log_text: str) -> bool:
    """Whether a trial's log says memory ran out (CUDA, the CPU allocator, C++)."""
    return bool(_OOM.search(log_text))


def _signal_name(num: int) -> str:
    try:
        return signal.Signals(num).name
    except ValueError:
        return f"signal {num}"


@dataclass(frozen=True)
class _RankFailure:
    rank: int
    exitcode: int
    pid: int | None
    time: str | None          # torchrun's whole-second timestamp, as printed
    root_cause: bool


def _torchrun_reports(log_text: str) -> list[list[_RankFailure]]:
    """The failure entries of each torchrun report in the log, in the order printed: the
    "Failures:" list, then the "Root Cause" entry."""
    reports: list[list[_RankFailure]] = []
    section = None          # None | "failures" | "root"
    entry: dict | None = None

    def close() -> None:
        nonlocal entry
        if entry is not None and "rank" in entry and "exitcode" in entry:
            reports[-1].append(_RankFailure(**{"pid": None, "time": None, **entry}))
        entry = None

    for line in log_text.splitlines():
        if _FAILURES.search(line):
            close()
            reports.append([])
            section = "failures"
        elif _ROOT_CAUSE.search(line):
            close()
            if section is None:
                reports.append([])
            section = "root"
        elif section is None:
            continue
        elif _REPORT_END.search(line):
            close()
            section = None
        elif _ENTRY.search(line):
            close()
            entry = {"root_cause": section == "root"}
        elif entry is not None and "exitcode" not in entry:  # (not the traceback's lines)
            if "time" not in entry and (m := _ENTRY_TIME.search(line)):
                entry["time"] = m.group(1)
            elif "rank" not in entry and (m := _ENTRY_RANK.search(line)):
                entry["rank"] = int(m.group(1))
            elif "rank" in entry and (m := _ENTRY_EXIT.search(line)):
                entry["exitcode"] = int(m.group(1))
                entry["pid"] = int(m.group(2)) if m.group(2) else None
    close()
    return reports


def _seconds_apart(a: str | None, b: str | None) -> float:
    """Seconds from timestamp `a` to `b` as torchrun prints them; 0 where either is missing
    or unreadable."""
    try:
        return (datetime.fromisoformat(b) - datetime.fromisoformat(a)).total_seconds()
    except (TypeError, ValueError):
        return 0.0


def killed_rank(log_text: str) -> tuple[int, int, int | None] | None:
    """(rank, signal, pid) of the rank a signal ended, from torchrun's failure report; None
    when the report is missing or names no such rank.

    torchrun's "Root Cause" is the failure with the smallest whole-second timestamp, on a tie
    the one it saw first (the lowest local rank among those that ended together): a peer that
    exited with code 1 (its connection reset) in the same second as the rank that was killed
    is often named instead. So every entry counts: a rank ended by a signal other than
    SIGTERM, at the root cause's second (or the next), is the likelier cause, the root cause
    first among them. SIGTERM entries other than the root cause are not: torchrun ends the
    survivors of a failure with SIGTERM (and with SIGKILL after a grace period, at a later
    second) and lists them too."""
    best = None
    for n, report in enumerate(_torchrun_reports(log_text)):
        root = next((f for f in report if f.root_cause), None)
        for i, f in enumerate(report):
            if f.exitcode >= 0:
                continue
            term = f.exitcode == -signal.SIGTERM
            if f.root_cause:
                kind = 1 if term else 0
            elif not term and _seconds_apart(root.time if root else None, f.time) <= 1:
                kind = 0
            else:
                continue
            key = (kind, not f.root_cause, -n, i)   # the last report where there are several
            if best is None or key < best[0]:
                best = (key, f)
    if best is None:
        return None
    f = best[1]
    return f.rank, -f.exitcode, f.pid


def failure_reason(outcome: ProcessOutcome, log_text: str, *, oom_killed: bool = False) -> str:
    """One line that says why a trial failed: the rank a signal ended first (its peers' errors
    follow from it), else the trial's own report or last exception line, else the commands'
    exit codes."""
    killed = killed_rank(log_text)
    if killed is not None and not _OOM.search(log_text):
        rank, sig, pid = killed
        by = " by the kernel's OOM killer" if oom_killed and sig == signal.SIGKILL else ""
        return (f"rank {rank} exited (signal {sig}: {_signal_name(sig)}{by}"
                + (f", pid {pid}" if pid else "") + ")")
    for i, rc in enumerate(outcome.returncodes):
        if rc is not None and rc < 0 and not _OOM.search(log_text):
            return (f"{'the launcher' if len(outcome.returncodes) == 1 else f'command {i + 1}'}"
                    f" exited (signal {-rc}: {_signal_name(-rc)})")
    return error_summary(log_text) or f"exit codes {list(outcome.returncodes)}"


def oom_kill_count() -> int | None:
    """How many processes the kernel's OOM killer has ended since boot (Linux /proc/vmstat,
    memory cgroups included); None where it cannot be read."""
    try:
        with open("/proc/vmstat") as f:
            for line in f:
                if line.startswith("oom_kill "):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


def trial_processes(trial_dir: Path) -> list[int]:
    """Pids of this machine's processes that belong to the trial in `trial_dir` (their
    environment names it through TRIAL_DIR_VAR), this process excepted."""
    try:
        import psutil
    except ImportError:
        return []
    want = str(trial_dir)
    out = []
    for p in psutil.process_iter(["pid"]):
        if p.pid == os.getpid():
            continue
        try:
            if p.environ().get(TRIAL_DIR_VAR) == want and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return out


def stop_trial_processes(trial_dir: Path, grace_s: float = KILL_GRACE_S) -> list[int]:
    """End every process of the trial in `trial_dir` still running (left by a launch that
    was killed hard): SIGTERM, then SIGKILL after `grace_s`. Returns the pids found."""
    pids = trial_processes(trial_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_exists(p) for p in pids):
            time.sleep(0.1)
        if not any(_exists(p) for p in pids):
            break
    return pids


_ERROR_LINE = re.compile(r"^\W*(?:\[rank\d+\]:\s*)?(\w+(?:Error|Exception|Exit)\b.*)$")


def error_summary(log_text: str) -> str:
    """One line that says why a trial failed: its last exception line, else its last line."""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    for ln in reversed(lines):              # the trial's own one-line report wins
        head, marker, reason = ln.partition(ERROR_MARKER)
        if marker and reason:
            return reason[:300]
    for ln in reversed(lines):
        m = _ERROR_LINE.match(ln)
        if m and "ChildFailedError" not in ln:
            return m.group(1)[:300]
    return lines[-1][:300] if lines else ""
