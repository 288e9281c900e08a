"""Stopping a trial stops all of it: its process group and descendants in their own
sessions (as torchrun's workers are), on timeout and on Ctrl-C; failure classification."""
from __future__ import annotations

import os
import sys
import time

import pytest

from amp_search.launch.launchers import Command
from amp_search.launch.process import (ProcessOutcome, classify_failure, error_summary,
                                       failure_reason, log_tail, run_commands)

# a parent that starts a child in a new session (like torchrun's workers), prints both pids,
# then sleeps forever
_TREE = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                         start_new_session=True)
print("PIDS", child.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _child_pid(log) -> int:
    for line in log.read_text().splitlines():
        if line.startswith("PIDS"):
            return int(line.split()[1])
    raise AssertionError("no PIDS line: " + log.read_text())


def test_timeout_kills_the_whole_tree(tmp_path):
    log = tmp_path / "log.txt"
    out = run_commands((Command(argv=(sys.executable, "-c", _TREE)),), base_env=dict(os.environ),
                       cwd=tmp_path, log_path=log, timeout_s=2.0)
    assert out.timed_out and not out.ok
    assert out.returncodes[0] is not None and out.returncodes[0] < 0   # stopped by a signal
    child = _child_pid(log)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), "the grandchild in its own session survived"
    assert classify_failure(out, log_tail(log)) == "timeout"


def test_keyboard_interrupt_stops_everything(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    calls = {"n": 0}
    real_sleep = time.sleep

    def sleepy(s):  # the 30th poll raises Ctrl-C inside run_commands' wait loop
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        real_sleep(s)

    monkeypatch.setattr("amp_search.launch.process.time.sleep", sleepy)
    with pytest.raises(KeyboardInterrupt):
        run_commands((Command(argv=(sys.executable, "-c", _TREE)),),
                     base_env=dict(os.environ), cwd=tmp_path, log_path=log, timeout_s=60)
    monkeypatch.undo()
    child = _child_pid(log)
    deadline = time.monotonic() + 5
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def test_failure_stops_peers(tmp_path, monkeypatch):
    monkeypatch.setattr("amp_search.launch.process.PEER_EXIT_GRACE_S", 0.5)
    log = tmp_path / "log.txt"
    out = run_commands((Command(argv=(sys.executable, "-c", "raise SystemExit(3)")),
                        Command(argv=(sys.executable, "-c", "import time; time.sleep(600)"))),
                       base_env=dict(os.environ), cwd=tmp_path, log_path=log, timeout_s=60)
    assert out.returncodes[0] == 3 and not out.timed_out
    assert out.returncodes[1] is not None and out.returncodes[1] < 0   # stopped, not slept out


def test_argv_is_not_a_shell(tmp_path):
    marker = tmp_path / "pwned"
    log = tmp_path / "log.txt"
    out = run_commands((Command(argv=(sys.executable, "-c", "import sys; print(sys.argv[1])",
                                      f"x; touch {marker}")),),
                       base_env=dict(os.environ), cwd=tmp_path, log_path=log, timeout_s=30)
    assert out.ok and not marker.exists()
    assert f"x; touch {marker}" in log.read_text()


_KILLED_RANK_3 = ("[rank2]: RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by "
                  "peer [127.0.0.1]:43204\n"
                  "Failures:\n[1]:\n  rank      : 0 (local_rank: 0)\n"
                  "  exitcode  : -15 (pid: 6671)  (SIGTERM)\n"
                  "Root Cause (first observed failure):\n[0]:\n  time      : 2026\n"
                  "  host      : localhost\n  rank      : 3 (local_rank: 3)\n"
                  "  exitcode  : -9 (pid: 6674)  (SIGKILL)\n  error_file: <N/A>\n")


@pytest.mark.parametrize("rcs,text,oom_killed,status", [
    ((1,), "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False, "oom"),
    ((1,), "RuntimeError: [enforce fail at alloc_cpu.cpp] DefaultCPUAllocator: can't "
           "allocate memory: you tried to allocate 1000 bytes. Error code 12 (Cannot allocate "
           "memory)", False, "oom"),
    # a SIGKILL is an OOM only where the kernel's OOM killer acted meanwhile
    ((137,), "", False, "failed"),
    ((137,), "", True, "oom"),
    ((1,), _KILLED_RANK_3, False, "failed"),
    ((1,), _KILLED_RANK_3, True, "oom"),
    ((1,), "Root Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n"
           "  exitcode  : 1 (pid: 2)", True, "failed"),
    ((1,), "ValueError: partition [0, 9] does not split", False, "failed"),
])
def test_classify(rcs, text, oom_killed, status):
    out = ProcessOutcome(returncodes=rcs, timed_out=False, wall_s=1.0)
    assert classify_failure(out, text, oom_killed=oom_killed) == status


def test_a_killed_rank_is_named_not_its_peers_errors():
    out = ProcessOutcome(returncodes=(1,), timed_out=False, wall_s=1.0)
    assert failure_reason(out, _KILLED_RANK_3) == \
        "rank 3 exited (signal 9: SIGKILL, pid 6674)"
    assert "OOM killer" in failure_reason(out, _KILLED_RANK_3, oom_killed=True)
    assert failure_reason(ProcessOutcome(returncodes=(-9,), timed_out=False, wall_s=1.0),
                          "") == "the launcher exited (signal 9: SIGKILL)"


def test_error_summary_picks_the_exception_line():
    text = ("[rank1]: Traceback (most recent call last):\n"
            "[rank1]:   File \"x.py\", line 1\n"
            "[rank1]: RuntimeError: deliberate failure\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "====================\n")
    assert error_summary(text) == "RuntimeError: deliberate failure"
