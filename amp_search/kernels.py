"""The search kernels (the partition DP, the schedule simulator), compiled into numba's on-disk
cache by a background process, so that the first `plan` after an install need not wait for
numba (about 25 s of compilation on a 2-core machine).

    if not kernels_cached():
        start_background_compile()          # python -m amp_search.kernels, detached
        cost_models._jit.python_until_cached()

The foreground process then runs the kernels' plain-Python twins (the same code, slower) and
switches to the compiled kernels as soon as the cache holds them (cost_models._jit.pick): a
small search finishes in Python in a few seconds, a large one finishes compiled. The
background process compiles by planning a shipped example, so it compiles exactly the
signatures the planner calls; one at a time per user (a lock file), and it leaves when done.
"""
from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import tempfile
from pathlib import Path

EXAMPLE = "amp-hetero-gpt2"
"""The shipped spec whose plan compiles every kernel signature the planner uses."""


def kernels_cached() -> bool:
    """Whether numba's cache holds both groups of kernels for this machine."""
    from cost_models import simulator_kernels

    from . import partition

    return partition.kernels_cached() and simulator_kernels.kernels_cached()


def cache_writable() -> bool:
    """False where numba finds no writable cache folder (the kernels then compile in every
    process, and a background compile would be lost)."""
    from cost_models import _jit
    from cost_models import simulator_kernels

    from . import partition  # (creating its dispatchers is what warns)

    simulator_kernels.materialize()
    return not _jit._warned & {partition.KERNELS_WHAT, simulator_kernels.KERNELS_WHAT}


def lock_path() -> Path:
    """The lock file that keeps background compiles to one at a time per user."""
    return Path(tempfile.gettempdir()) / f"amp-search-kernels-{os.getuid()}.lock"


def start_background_compile(python: str = sys.executable) -> subprocess.Popen:
    """Start `python -m amp_search.kernels` in its own session, detached from the caller's
    terminal and output; it outlives the caller and exits once the kernels are cached (at
    once if another one is already compiling them)."""
    return subprocess.Popen([python, "-m", "amp_search.kernels"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, close_fds=True)


def compile_kernels() -> bool:
    """Compile (or load) every kernel the planner calls, by planning the shipped example with
    the compiled kernels; returns False if another process holds the lock (it compiles)."""
    from .planner import plan
    from .resources import example_path
    from .spec import load_spec

    with open(lock_path(), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        plan(load_spec(example_path(EXAMPLE)))
        return True


if __name__ == "__main__":
    compile_kernels()
