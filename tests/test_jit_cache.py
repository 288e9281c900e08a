"""cost_models._jit: a kernel found in numba's on-disk cache is loaded without numba's target
refresh (its registries, scipy.linalg among them), and gives what numba's own dispatcher gives;
a signature not in the cache is compiled by numba as usual, beside it. Behaviour only (which
modules a process imports, what the kernels return), no timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

KERNELS = textwrap.dedent("""
    import numpy as np
    from cost_models._jit import njit

    def _scaled(a, k):
        out = np.empty(a.shape[0])
        for i in range(a.shape[0]):
            out[i] = a[i] * k
        return out

    def _total(a, k):
        s = 0.0
        b = scaled(a, k)            # a cached kernel calling another
        for i in range(b.shape[0]):
            if b[i] < 0:
                raise ValueError("negative")
            s += b[i]
        return s

    scaled = njit(_scaled, what="test kernels")
    total = njit(_total, what="test kernels")
""")

# one process: call the kernels, report what it loaded and imported
PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    import jitprobe
    a = np.arange(5.0)
    out = {"total": jitprobe.total(a, 2.0), "scaled": jitprobe.scaled(a, 0.5).tolist()}
    try:
        jitprobe.total(-a - 1.0, 1.0)
    except ValueError as exc:
        out["raised"] = str(exc)
    out["hits"] = sum(jitprobe.total._cache_hits.values())
    out["refreshed"] = "numba.np.npyimpl" in sys.modules   # what the target refresh imports
    out["scipy_linalg"] = "scipy.linalg" in sys.modules
    if len(sys.argv) > 1:       # a signature the cache does not hold: numba compiles it
        out["int_total"] = jitprobe.total(np.arange(5), 2)
    print(json.dumps(out))
""")


def _probe(tmp_path: Path, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True,
                          text=True, cwd=tmp_path, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_cached_kernels_load_without_the_target_refresh(tmp_path):
    (tmp_path / "jitprobe.py").write_text(KERNELS)
    first = _probe(tmp_path)            # compiles and writes the cache
    assert first["hits"] == 0 and first["refreshed"]
    second = _probe(tmp_path)           # loads it
    assert second["hits"] == 1
    assert not second["refreshed"] and not second["scipy_linalg"]
    expected = 2.0 * np.arange(5.0).sum()
    for run in (first, second):
        assert run["total"] == expected
        assert run["scaled"] == (0.5 * np.arange(5.0)).tolist()
        assert run["raised"] == "negative"


def test_a_signature_missing_from_the_cache_is_compiled_beside_a_loaded_one(tmp_path):
    (tmp_path / "jitprobe.py").write_text(KERNELS)
    _probe(tmp_path)
    mixed = _probe(tmp_path, "int")     # float64 loaded from the cache, int64 compiled
    assert mixed["hits"] == 1 and mixed["int_total"] == 20.0
    assert mixed["total"] == 20.0


def test_partition_kernels_give_the_same_split_loaded_or_compiled():
    """The shipped kernels, called in this process (loaded or compiled, whichever numba's
    cache says), against their plain-Python twins."""
    from amp_search.partition import optimal_partition

    rng = np.random.default_rng(7)
    times = rng.uniform(0.5, 2.0, size=(4, 20))
    cuts = rng.uniform(0.0, 0.3, size=(4, 21))
    jit = optimal_partition(times, cuts, 8)
    py = optimal_partition(times, cuts, 8, use_numba=False)
    assert jit.boundaries == py.boundaries and jit.objective_s == py.objective_s


def test_a_kernel_pickles_and_runs_in_another_process():
    """As numba's own dispatchers: pickled by reference to its class (cost_models._jit)."""
    import pickle

    from amp_search import partition_kernels

    values = np.arange(6.0).reshape(2, 3)
    data = pickle.dumps(partition_kernels._prefix)
    code = ("import pickle, sys, numpy as np; f = pickle.loads(sys.stdin.buffer.read()); "
            "print(f(np.arange(6.0).reshape(2, 3)).tolist())")
    done = subprocess.run([sys.executable, "-c", code], input=data, capture_output=True,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr.decode()
    assert json.loads(done.stdout) == partition_kernels._prefix(values).tolist()


# ----------------------------------------------------------------------------- cold start

def test_pick_runs_the_twin_until_the_cache_holds_the_kernels(monkeypatch):
    from cost_models import _jit

    monkeypatch.setattr(_jit, "_interim", None)
    assert _jit.pick("g", "compiled", "twin", lambda: False) == "compiled"   # off: numba
    _jit.python_until_cached()
    monkeypatch.setattr(_jit, "INTERIM_POLL_S", 0.0)
    looks = []
    cached = lambda: looks.append(1) or len(looks) >= 3        # noqa: E731
    assert [_jit.pick("g", "compiled", "twin", cached) for _ in range(4)] == \
        ["twin", "twin", "compiled", "compiled"]
    assert len(looks) == 3                                     # not looked at once cached
    monkeypatch.setattr(_jit, "INTERIM_POLL_S", 1e9)           # looked at once per interval
    assert _jit.pick("h", "compiled", "twin", lambda: False) == "twin"
    assert _jit.pick("h", "compiled", "twin", lambda: True) == "twin"
    _jit.python_until_cached(False)
    assert _jit._interim is None


def _background_compiles(numba_cache_dir: str) -> list:
    """The `python -m amp_search.kernels` processes (amp_search.kernels.
    start_background_compile) working on this numba cache."""
    import psutil

    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            cmdline = p.info["cmdline"] or []
            if (cmdline[1:] == ["-m", "amp_search.kernels"]
                    and p.environ().get("NUMBA_CACHE_DIR") == numba_cache_dir):
                found.append(p)
        except psutil.Error:
            continue
    return found


def _running(process) -> bool:
    """Whether the process runs (a zombie no one has reaped yet has ended; is_running: the
    pid is not another process's by now)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_cold_plan_runs_in_python_and_compiles_in_the_background(tmp_path):
    """`amp-search plan` with an empty numba cache: the same answer as a warm run, from the
    plain-Python kernels, while a detached process fills the cache, after which the kernels
    load from it."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba"), "TMPDIR": str(tmp_path)}
    spec = str(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    argv = [sys.executable, "-m", "amp_search", "plan", spec, "--json", "-", "--no-progress"]
    cold = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert cold.returncode == 0, cold.stderr
    # the cold run started the background compile (detached, in its own session) before it
    # exited: once that process has left, the kernels are cached and built (or why not)
    background = _background_compiles(env["NUMBA_CACHE_DIR"])
    assert background, "the cold run started no background compile"
    deadline = time.monotonic() + 1800       # a guard against a hang, not a speed target
    while any(_running(p) for p in background) and time.monotonic() < deadline:
        time.sleep(1)
    assert not any(_running(p) for p in background), "the background compile never ended"
    check = [sys.executable, "-m", "amp_search.kernels", "--status"]
    r = subprocess.run(check, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    status = json.loads(r.stdout) if r.returncode == 0 else {}
    assert status.get("cached"), (status, r.stderr)
    assert status["aot"] or status["aot_failed"], status     # built, or why not
    warm = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert warm.returncode == 0, warm.stderr
    if status["aot"]:           # both groups built ahead of time: a plan never imports numba
        probe = ("import sys; from amp_search.cli import main; "
                 "code = main(sys.argv[1:]); print(code, 'numba' in sys.modules)")
        done = subprocess.run([sys.executable, "-c", probe, *argv[3:]], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=300)
        assert done.stdout.strip().splitlines()[-1] == "0 False", done.stdout + done.stderr

    def ranking(out):
        return [(s["pp"], s["dp"], s["tmp"], s["mbs"], s["partition"], s["placement"],
                 s["iteration_time_s"]) for s in json.loads(out)["strategies"]]
    assert ranking(cold.stdout) == ranking(warm.stdout)
