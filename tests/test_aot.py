"""cost_models._aot: a kernel group built ahead of time loads without numba, gives what the
plain-Python twins give, refuses (to numba) a call whose argument types differ from the
build's, is not served after its source changes, and a failed build is recorded, not retried.
Behaviour only, no timing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from amp_search import partition_kernels
from cost_models import _aot

ROOT = Path(__file__).resolve().parent.parent

BUILD = textwrap.dedent("""
    import sys
    import numpy as np
    from amp_search import partition_kernels as pk
    from cost_models import _aot
    _aot.set_folder(sys.argv[1])
    pk.GROUP.materialize()
    pk.solve(np.ones((2, 4)), np.zeros((2, 5)), 2, np.zeros((2, 1)), np.zeros(2), False,
             np.zeros((2, 1)), np.zeros(2), False)     # the planner's argument types
    print(pk.GROUP.build_aot())
""")

PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from amp_search.partition import optimal_partition
    from amp_search import partition_kernels as pk
    from cost_models import _aot
    _aot.set_folder(sys.argv[1])
    args = (np.arange(1.0, 9.0).reshape(2, 4), np.zeros((2, 5)), 3)
    r, twin = optimal_partition(*args), optimal_partition(*args, use_numba=False)
    print(json.dumps({"same": r == twin, "aot": pk.GROUP._aot is not None,
                      "numba": "numba" in sys.modules}))
""")


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The partition kernels built ahead of time into a folder of their own (in another
    process, where `solve` has exactly the planner's signature)."""
    folder = tmp_path_factory.mktemp("aot")
    done = subprocess.run([sys.executable, "-c", BUILD, str(folder)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode and "AotUnavailable" in done.stderr:
        pytest.skip(f"cannot build ahead of time here: {done.stderr.splitlines()[-1]}")
    assert done.returncode == 0, done.stderr
    return folder


@pytest.fixture
def group(built, monkeypatch):
    """partition_kernels.GROUP looking at the built folder only, restored afterwards."""
    g = partition_kernels.GROUP
    monkeypatch.setattr(_aot, "_folder", built)
    monkeypatch.setattr(g, "_aot", None)
    monkeypatch.setattr(g, "_aot_looked", False)
    monkeypatch.setattr(g, "aot_misses", 0)
    return g


def test_the_build_loads_without_numba(built):
    done = subprocess.run([sys.executable, "-c", PROBE, str(built)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out == {"same": True, "aot": True, "numba": False}


def test_the_build_gives_what_the_twins_give(group):
    solve, twin = group.kernel("solve"), group.kernel("solve", use_numba=False)
    assert group.aot() is not None and solve is group.aot()["solve"]
    rng = np.random.default_rng(3)
    for _ in range(100):
        pp = int(rng.integers(1, 6))
        L = int(rng.integers(pp, 25))
        has_sync, has_mem = bool(rng.integers(0, 2)), bool(rng.integers(0, 2))
        args = (rng.uniform(0.1, 2.0, (pp, L)), rng.uniform(0, 0.3, (pp, L + 1)),
                int(rng.integers(1, 9)), rng.uniform(0, 0.05, (pp, L)),
                rng.uniform(0, 0.2, pp), has_sync, rng.integers(1, 100, (pp, L)).astype(float),
                np.full(pp, float(rng.integers(100, 100 + 40 * L))), has_mem)
        got, want = solve(*args), twin(*args)
        assert got[0].tolist() == want[0].tolist()
        assert got[3] == want[3] and got[4] == want[4]
    assert group.aot_misses == 0


@pytest.mark.parametrize("change", ["int array", "fortran order", "float for int",
                                    "int for bool", "read-only output"])
def test_a_call_of_other_types_goes_to_numba(group, change, monkeypatch):
    """pycc's functions do not check types (an int64 array would be read as float64): the
    guard sends such a call to numba's dispatcher, which answers it rightly."""
    times = np.arange(1.0, 9.0).reshape(2, 4)
    args = [times, np.zeros((2, 5)), 3, np.zeros((2, 1)), np.zeros(2), False,
            np.zeros((2, 1)), np.zeros(2), False]
    if change == "int array":
        args[0] = times.astype(np.int64)
    elif change == "fortran order":
        args[0] = np.asfortranarray(times)
    elif change == "float for int":
        args[2] = 3.0
    elif change == "int for bool":
        args[5] = 0
    else:
        args[0] = times.copy()
        args[0].flags.writeable = False
    twin = group.kernel("solve", use_numba=False)
    want = twin(*args)
    meta = next(_aot._folder.glob("_amp_aot_partition_*.json"))
    assert not _aot.checker(json.loads(meta.read_text())["args"]["solve"])(tuple(args))
    group.materialize()
    numba_calls = []
    monkeypatch.setitem(group.namespace, "solve",      # numba's dispatcher, without compiling
                        lambda *a: numba_calls.append(1) or twin(*a))
    got = group.kernel("solve")(*args)
    assert group.aot_misses == 1 and numba_calls == [1]
    assert got[0].tolist() == want[0].tolist() and got[3] == want[3]


def test_the_checker_takes_the_planner_types():
    check = _aot.checker([["array", "float64", 2, True], ["int"], ["bool"], ["float"]])
    assert check((np.zeros((2, 3)), 3, True, 0.5))
    assert check((np.zeros((2, 3)), np.int64(3), np.bool_(False), 2))
    assert not check((np.zeros(3), 3, True, 0.5))               # ndim
    assert not check((np.zeros((2, 3)), True, True, 0.5))       # a bool is not an int
    assert not check((np.zeros((2, 3)), 3, 1, 0.5))             # an int is not a bool
    assert not check((np.zeros((2, 3)), 3, True))               # too few
    assert not check((np.zeros((4, 6))[::2, ::2], 3, True, 0.5))  # not contiguous


def test_an_edited_source_is_not_served_a_stale_build(group, tmp_path):
    source = tmp_path / "kernels.py"
    source.write_text("def f():\n    return 1\n")
    before = _aot.module_name("partition", source)
    source.write_text("def f():\n    return 2\n")
    assert _aot.module_name("partition", source) != before
    assert _aot.load("partition", source) is None


def test_a_failed_build_is_recorded_and_not_retried(tmp_path, monkeypatch):
    """A kernel compiled for two signatures cannot be exported as one function: the build
    says so in `<name>.failed`, and aot_buildable turns False."""
    from amp_search import kernels

    numba = pytest.importorskip("numba")
    monkeypatch.setattr(_aot, "_folder", tmp_path)
    twice = numba.njit(lambda a: a[0] + 1)
    twice(np.zeros(2))
    twice(np.zeros(2, dtype=np.int64))
    source = Path(partition_kernels.__file__)
    with pytest.raises(_aot.AotUnavailable, match="2 signatures"):
        _aot.build("partition", source, {"solve": twice})
    assert "2 signatures" in _aot.failed("partition", source)
    assert partition_kernels.GROUP.aot_failed() == _aot.failed("partition", source)
    assert not kernels.aot_buildable()
