"""Run a trial's commands to the end, to a timeout, or to Ctrl-C, and never leave a process
behind.

Each command starts in its own session (`start_new_session=True`): its process group holds
everything it forks, except what makes its own session (torchrun starts every worker in a new
session). Stopping a trial therefore signals the command's group *and* the group of every
descendant found under it: SIGTERM first, SIGKILL after a grace period. The orchestrator's own
group is never signalled.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from .launchers import Command

from ..trial.run import ERROR_MARKER

KILL_GRACE_S = 5.0
"""Seconds between SIGTERM and SIGKILL."""
PEER_EXIT_GRACE_S = 15.0
"""After one command of a multi-command trial fails, how long the others get to exit."""

_OOM = re.compile(r"out of memory|OutOfMemoryError|Cannot allocate memory|std::bad_alloc",
                  re.IGNORECASE)
# torchrun's report names the first failure; a worker SIGKILLed first was the kernel's OOM
# killer (a SIGKILL to the others afterwards is torchrun's own clean-up, not an OOM)
_ROOT_CAUSE_KILLED = re.compile(r"Root Cause \(first observed failure\):.*?exitcode\s*:\s*-9",
                                re.DOTALL)


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
                 timeout_s: float, poll_s: float = 0.1) -> ProcessOutcome:
    """Start all commands (argv lists, no shell), wait for them, return how they ended.

    All output goes to `log_path`. On timeout, or once any command has failed and the others
    have not exited within PEER_EXIT_GRACE_S, everything is stopped. KeyboardInterrupt stops
    everything and propagates."""
    procs: list[subprocess.Popen] = []
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
                                              start_new_session=True))
            failed_at = None
            while any(p.poll() is None for p in procs):
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


def classify_failure(outcome: ProcessOutcome, log_text: str) -> str:
    """timeout | oom | failed for a trial that did not end well."""
    if outcome.timed_out:
        return "timeout"
    if any(rc in (137, -signal.SIGKILL) for rc in outcome.returncodes) or \
            _OOM.search(log_text) or _ROOT_CAUSE_KILLED.search(log_text):
        return "oom"
    return "failed"


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
