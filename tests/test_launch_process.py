"""Stopping a trial stops all of it: its process group and descendants in their own
sessions (as torchrun's workers are), on timeout and on Ctrl-C; failure classification."""
from __future__ import annotations

import os
import sys
import time

import pytest

from amp_search.launch.launchers import Command
from amp_search.launch.process import (ProcessOutcome, classify_failure, error_summary,
                                       failure_reason, killed_rank, log_tail, run_commands)
from conftest import held_monotonic, time_module_with

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


def _has_pids(log) -> bool:
    return log.exists() and any(ln.startswith("PIDS") for ln in log.read_text().splitlines())


def _gone(pid: int) -> bool:
    """Whether the process has ended; waits for it (a hang guard, not a timing condition)."""
    deadline = time.monotonic() + 60
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    return not _alive(pid)


def test_timeout_kills_the_whole_tree(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    # the clock stands still until the parent has started its child and said so: the timeout
    # then fires with the whole tree up, however slow the machine
    monkeypatch.setattr("amp_search.launch.process.time",
                        time_module_with(monotonic=held_monotonic(lambda: _has_pids(log))))
    out = run_commands((Command(argv=(sys.executable, "-c", _TREE)),), base_env=dict(os.environ),
                       cwd=tmp_path, log_path=log, timeout_s=0.5)
    monkeypatch.undo()
    assert out.timed_out and not out.ok
    assert out.returncodes[0] is not None and out.returncodes[0] < 0   # stopped by a signal
    assert _gone(_child_pid(log)), "the grandchild in its own session survived"
    assert classify_failure(out, log_tail(log)) == "timeout"


def test_keyboard_interrupt_stops_everything(tmp_path, monkeypatch):
    log = tmp_path / "log.txt"
    real_sleep = time.sleep
    interrupted = []

    def sleepy(s):  # Ctrl-C inside run_commands' wait loop once the whole tree is up (once:
        if not interrupted and _has_pids(log):  # stopping the tree sleeps too)
            interrupted.append(True)
            raise KeyboardInterrupt
        real_sleep(s)

    monkeypatch.setattr("amp_search.launch.process.time", time_module_with(sleep=sleepy))
    with pytest.raises(KeyboardInterrupt):   # the timeout only guards against a hang
        run_commands((Command(argv=(sys.executable, "-c", _TREE)),),
                     base_env=dict(os.environ), cwd=tmp_path, log_path=log, timeout_s=600)
    monkeypatch.undo()
    assert _gone(_child_pid(log)), "the grandchild in its own session survived"


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

# captured from torchrun (torch 2.x, 2 ranks): rank 1 SIGKILL'd, rank 0 exiting with code 1 in
# the same poll and second; torchrun names rank 0 (a timestamp tie goes to the lowest rank)
_KILLED_RANK_1_ROOT_CAUSE_RANK_0 = """\
E1130 12:26:26.793000 24463 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 1) local_rank: 0 (pid: 24470) of binary: /work/main/.venv/bin/python
Traceback (most recent call last):
  File "/work/main/.venv/lib/python3.11/site-packages/torch/distributed/launcher/api.py", \
line 383, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
amp_search/trial/run.py FAILED
------------------------------------------------------------
Failures:
[1]:
  time      : 2026-11-30_12:26:26
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 24471)  (SIGKILL)
  error_file: <N/A>
  traceback : Signal 9 (SIGKILL) received by PID 24471
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-30_12:26:26
  host      : localhost
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 24470)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


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
    # the killed rank is found in the "Failures:" list too
    ((1,), _KILLED_RANK_1_ROOT_CAUSE_RANK_0, False, "failed"),
    ((1,), _KILLED_RANK_1_ROOT_CAUSE_RANK_0, True, "oom"),
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


def test_a_killed_rank_is_found_where_torchrun_names_a_peer_as_root_cause():
    """torchrun's root cause is the failure with the smallest whole-second timestamp (on a
    tie, the lowest rank): a peer that exited with code 1 in the same second is named, the
    rank a signal ended is listed under "Failures:"."""
    out = ProcessOutcome(returncodes=(1,), timed_out=False, wall_s=1.0)
    assert killed_rank(_KILLED_RANK_1_ROOT_CAUSE_RANK_0) == (1, 9, 24471)
    assert failure_reason(out, _KILLED_RANK_1_ROOT_CAUSE_RANK_0) == \
        "rank 1 exited (signal 9: SIGKILL, pid 24471)"
    # a killed rank wins over a SIGTERM named as root cause (how survivors are stopped)
    sigterm_root = (_KILLED_RANK_1_ROOT_CAUSE_RANK_0
                    .replace("exitcode  : 1 (pid: 24470)",
                             "exitcode  : -15 (pid: 24470)  (SIGTERM)"))
    assert killed_rank(sigterm_root) == (1, 9, 24471)
    assert killed_rank(_KILLED_RANK_3) == (3, 9, 6674)
    # each line as pdsh (the deepspeed launcher's nodes) or srun --label prints it
    for prefix in ("node1: ", "1: "):
        prefixed = "".join(prefix + ln for ln in
                           _KILLED_RANK_1_ROOT_CAUSE_RANK_0.splitlines(keepends=True))
        assert killed_rank(prefixed) == (1, 9, 24471)


def test_the_survivors_torchrun_stops_are_not_named():
    """torchrun stops the other ranks of a failed trial (SIGTERM, SIGKILL after a grace
    period) and lists them under "Failures:" too: the rank that failed first is reported."""
    out = ProcessOutcome(returncodes=(1,), timed_out=False, wall_s=1.0)
    # both ranks raised; torchrun saw rank 0 exit and stopped rank 1
    stopped = (_KILLED_RANK_1_ROOT_CAUSE_RANK_0
               .replace("  exitcode  : -9 (pid: 24471)  (SIGKILL)",
                        "  exitcode  : -15 (pid: 24471)  (SIGTERM)")
               .replace("Signal 9 (SIGKILL)", "Signal 15 (SIGTERM)"))
    assert killed_rank(stopped) is None
    assert failure_reason(out, "[rank0]: RuntimeError: deliberate failure\n" + stopped) == \
        "RuntimeError: deliberate failure"
    assert killed_rank(_KILLED_RANK_3.replace("-9 (pid: 6674)  (SIGKILL)",
                                              "1 (pid: 6674)")) is None
    # a rank that ignored the SIGTERM is killed 30 s later: not the cause either
    late = _KILLED_RANK_1_ROOT_CAUSE_RANK_0.replace("  time      : 2026-11-30_12:26:26\n  host"
                                                    "      : localhost\n  rank      : 1",
                                                    "  time      : 2026-11-30_12:26:57\n  host"
                                                    "      : localhost\n  rank      : 1")
    assert late != _KILLED_RANK_1_ROOT_CAUSE_RANK_0
    assert killed_rank(late) is None
    # no report, or every rank exited with a code
    assert killed_rank("") is None
    assert killed_rank(_KILLED_RANK_1_ROOT_CAUSE_RANK_0.replace(
        "exitcode  : -9 (pid: 24471)  (SIGKILL)", "exitcode  : 1 (pid: 24471)")) is None


def test_error_summary_picks_the_exception_line():
    text = ("[rank1]: Traceback (most recent call last):\n"
            "[rank1]:   File \"x.py\", line 1\n"
            "[rank1]: RuntimeError: deliberate failure\n"
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
            "====================\n")
    assert error_summary(text) == "RuntimeError: deliberate failure"
