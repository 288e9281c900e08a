"""The search kernels (the partition DP, the schedule simulator), compiled by a background
process: into numba's on-disk cache, so that the first `plan` after an install need not wait
for numba (about 25 s of compilation on a 2-core machine), then ahead of time into extension
modules that later processes load without importing numba at all (cost_models._aot; about
0.3 s of a small plan's 0.8 s was numba's import and cache loading).

    if not kernels_cached():
        start_background_compile()          # python -m amp_search.kernels, detached
        cost_models._jit.python_until_cached()
    elif not aot_ready() and aot_buildable():
        start_background_compile()          # builds the modules; this run uses numba's cache

The foreground process runs the kernels' plain-Python twins (the same code, slower) until
numba's cache holds them, and switches to the compiled kernels then (cost_models._jit.pick):
a small search finishes in Python in a few seconds, a large one finishes compiled. The
background process compiles by planning a shipped example, so it compiles exactly the
signatures the planner calls, and builds the modules from those signatures; one at a time per
user (a lock file), and it leaves when done.
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


def _groups():
    from cost_models import simulator_kernels

    from . import partition_kernels

    return partition_kernels.GROUP, simulator_kernels.GROUP


def kernels_cached() -> bool:
    """Whether both groups of kernels run compiled without compiling in this process (built
    ahead of time, or in numba's cache for this machine)."""
    return all(group.cached() for group in _groups())


def aot_ready() -> bool:
    """Whether both groups are built ahead of time for the current sources (a process then
    does not import numba)."""
    return all(group.aot() is not None for group in _groups())


def aot_buildable() -> bool:
    """False once a build of the current sources failed (no C compiler, say): the kernels
    then stay with numba's cache, and no background process is started for them."""
    return not any(group.aot_failed() for group in _groups())


def use_numba_cache_dir(path: str | None) -> None:
    """Keep the ahead-of-time builds beside numba's cache where NUMBA_CACHE_DIR moves it
    (`path`, read from the environment by the caller), else in their default folders."""
    from cost_models import _aot

    _aot.set_folder(None if not path else os.path.join(path, "amp_search_aot"))


def cache_writable() -> bool:
    """False where numba finds no writable cache folder (the kernels then compile in every
    process, and a background compile would be lost)."""
    from cost_models import _jit

    groups = _groups()
    for group in groups:
        group.materialize()         # (creating the dispatchers is what warns)
    return not _jit._warned & {group.what for group in groups}


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
    numba's kernels, then build each group not yet built ahead of time from the
    signatures that plan called; returns False if another process holds the lock (it
    compiles). A group that cannot be built ahead of time stays with numba's cache."""
    with open(lock_path(), "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        from cost_models._aot import AotUnavailable

        from .planner import plan
        from .resources import example_path
        from .spec import load_spec

        plan(load_spec(example_path(EXAMPLE)))
        for group in _groups():
            if group.aot() is None and not group.aot_failed():
                try:
                    group.build_aot()
                except AotUnavailable:
                    pass          # recorded beside the modules (aot_buildable)
        return True


def main(argv: list[str] | None = None) -> int:
    """`python -m amp_search.kernels`: compile and build (what start_background_compile
    runs); `--status`: print {"cached": ..., "aot": ..., "aot_failed": why or null} as JSON
    for this environment's caches (NUMBA_CACHE_DIR honoured), compiling nothing."""
    import argparse
    import json

    ap = argparse.ArgumentParser(prog="python -m amp_search.kernels",
                                 description="compile the search kernels (numba's cache, "
                                             "then ahead of time)")
    ap.add_argument("--status", action="store_true",
                    help="print whether they are cached and built ahead of time, as JSON")
    args = ap.parse_args(argv)
    use_numba_cache_dir(os.environ.get("NUMBA_CACHE_DIR"))
    if args.status:
        failed = [reason for group in _groups() if (reason := group.aot_failed())]
        print(json.dumps({"cached": kernels_cached(), "aot": aot_ready(),
                          "aot_failed": failed[0] if failed else None}))
    else:
        compile_kernels()
    return 0


if __name__ == "__main__":
    sys.exit(main())
