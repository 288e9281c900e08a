"""Kernels compiled ahead of time: a kernel group (cost_models._jit.KernelGroup) built by
numba's pycc into a CPython extension module, which a later process imports without numba.

Why: numba's cached kernels still need numba in the process. Importing it takes about
0.2-0.3 s of a 2-core machine's time and loading the cached object code another 0.05-0.1 s,
most of a warm `plan` of a small cluster (issue 23's 0.5 s for AMP's 16x16 case). The
extension module loads in a few milliseconds and needs only numpy.

What is built: each kernel the group calls from Python (its entry points), with the one
signature the planner called it with (read off numba's dispatcher after a plan, so nobody
writes a signature by hand), compiled for a generic CPU of the machine's architecture, with
its callees inside. A pycc function does not check the types of its arguments: a float
array passed where an int64 array is expected is read as int64. So a JSON file beside the
module records each argument's kind, dtype and dimensions, and `checker` builds the test
that each call passes before it reaches the compiled code (KernelGroup calls numba's
dispatcher for a call that fails it).

Where: the module's name carries a hash of the kernels' source file, numpy's version, the
Python build and FORMAT, so that an edited kernel or an upgraded numpy is never served by a
stale module; the files lie in `folders()`: the folder `set_folder` named (the CLI names
NUMBA_CACHE_DIR/amp_search_aot where that is set, as numba's own cache moves there), else
cost_models' __pycache__ (as numba's in-tree cache), else ~/.cache/amp-search where that
one cannot be written. A build that failed leaves `<name>.failed` with its reason, so that
it is not tried in every run.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import sys
import tempfile
import warnings
from pathlib import Path

import numpy as np

FORMAT = 1
"""The layout of the module and its JSON; part of the name's hash."""
EXTENSION_SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
_folder: Path | None = None


class AotUnavailable(Exception):
    """The group cannot be built ahead of time (a kernel with several signatures or an
    argument type the checker does not know, no numba.pycc, no C compiler)."""


def set_folder(path: str | os.PathLike | None) -> None:
    """Keep the compiled modules in `path` (None: the defaults, `folders`)."""
    global _folder
    _folder = None if path is None else Path(path)


def folders() -> list[Path]:
    """Where the modules are looked for, in order; a build writes into the first one that
    can be written."""
    if _folder is not None:
        return [_folder]
    return [Path(__file__).resolve().parent / "__pycache__",
            Path.home() / ".cache" / "amp-search"]


def module_name(group: str, source: Path) -> str:
    """`_amp_aot_<group>_<hash>`: the hash of the kernels' source, numpy's version, the
    Python build and FORMAT."""
    h = hashlib.sha256(Path(source).read_bytes())
    for part in (np.__version__, sys.version, sys.platform, str(FORMAT)):
        h.update(b"\0" + part.encode())
    return f"_amp_aot_{group}_{h.hexdigest()[:16]}"


def load(group: str, source: Path) -> tuple[object, dict] | None:
    """(the extension module, {kernel: argument specs}) of the group, or None where no
    current build is found (or it does not load)."""
    name = module_name(group, source)
    for folder in folders():
        so, meta = folder / (name + EXTENSION_SUFFIX), folder / (name + ".json")
        if not (so.is_file() and meta.is_file()):
            continue
        try:
            specs = json.loads(meta.read_text())["args"]
            loader = importlib.machinery.ExtensionFileLoader(name, str(so))
            spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
            module = importlib.util.module_from_spec(spec)
            loader.exec_module(module)
        except (ImportError, OSError, ValueError, KeyError, TypeError):
            continue
        if all(hasattr(module, k) for k in specs):
            return module, specs
    return None


def failed(group: str, source: Path) -> str | None:
    """Why the last build of the group's current source failed, or None."""
    name = module_name(group, source)
    for folder in folders():
        path = folder / (name + ".failed")
        if path.is_file():
            return path.read_text().strip() or "failed"
    return None


# ----------------------------------------------------------------------------- checking

def arg_spec(numba_type) -> list:
    """The JSON description of one argument type: ["array", dtype, ndim, writable] (C
    order), ["int"], ["bool"] or ["float"]."""
    from numba.core import types

    if isinstance(numba_type, types.Array):
        if numba_type.layout != "C" or not numba_type.aligned:
            raise AotUnavailable(f"array argument {numba_type} is not C-contiguous")
        return ["array", str(np.dtype(numba_type.dtype.name)), numba_type.ndim,
                bool(numba_type.mutable)]
    if isinstance(numba_type, types.Boolean):
        return ["bool"]
    if isinstance(numba_type, types.Integer) and numba_type.bitwidth == 64 \
            and numba_type.signed:
        return ["int"]
    if isinstance(numba_type, types.Float) and numba_type.bitwidth == 64:
        return ["float"]
    raise AotUnavailable(f"argument type {numba_type} is not checked ahead of time")


def checker(specs: list):
    """A function of an argument tuple: True when every argument has the type the compiled
    function was built for (what numba's dispatcher would dispatch to it)."""
    arrays = [(i, np.dtype(s[1]), s[2], s[3]) for i, s in enumerate(specs) if s[0] == "array"]
    ints = [i for i, s in enumerate(specs) if s[0] == "int"]
    bools = [i for i, s in enumerate(specs) if s[0] == "bool"]
    floats = [i for i, s in enumerate(specs) if s[0] == "float"]
    n = len(specs)
    ndarray, integer, np_bool, real = np.ndarray, (int, np.integer), (bool, np.bool_), \
        (float, int, np.floating, np.integer)

    def check(args) -> bool:
        if len(args) != n:
            return False
        for i, dtype, ndim, writable in arrays:
            a = args[i]
            if type(a) is not ndarray or a.dtype != dtype or a.ndim != ndim:
                return False
            flags = a.flags
            if not (flags.c_contiguous and flags.aligned) or (writable and not flags.writeable):
                return False
        for i in ints:
            if not isinstance(args[i], integer) or isinstance(args[i], np_bool):
                return False
        for i in bools:
            if not isinstance(args[i], np_bool):
                return False
        for i in floats:
            if not isinstance(args[i], real) or isinstance(args[i], np_bool):
                return False
        return True

    return check


# ----------------------------------------------------------------------------- building

def build(group: str, source: Path, dispatchers: dict) -> Path:
    """Compile `dispatchers` (kernel name -> numba dispatcher that has been called, so that
    it holds the one signature to build) into the group's extension module, in the first
    folder that can be written; returns the module's path. AotUnavailable (and a
    `<name>.failed` file) when it cannot be built."""
    name = module_name(group, source)
    dest = _writable_folder()
    try:
        return _build(name, group, dispatchers, dest)
    except AotUnavailable as exc:
        (dest / (name + ".failed")).write_text(f"{exc}\n")
        raise
    except Exception as exc:  # noqa: BLE001 - the compiler's and linker's many failures
        reason = f"{type(exc).__name__}: {exc}".splitlines()[0]
        (dest / (name + ".failed")).write_text(f"{reason}\n")
        raise AotUnavailable(reason) from exc


def _writable_folder() -> Path:
    for folder in folders():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            continue
        if os.access(folder, os.W_OK):
            return folder
    raise AotUnavailable("no writable folder for the compiled kernels: "
                         + ", ".join(map(str, folders())))


def _build(name: str, group: str, dispatchers: dict, dest: Path) -> Path:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # pycc's pending-deprecation warning
        try:
            from numba.pycc import CC
        except ImportError as exc:
            raise AotUnavailable(f"numba.pycc is not available: {exc}") from exc
    cc = CC(name)
    cc.verbose = False
    specs = {}
    for kernel, dispatcher in dispatchers.items():
        overloads = list(dispatcher.overloads.values())
        if len(overloads) != 1:
            raise AotUnavailable(f"{kernel} was compiled for {len(overloads)} signatures, "
                                 f"not one")
        signature = overloads[0].signature
        specs[kernel] = [arg_spec(t) for t in signature.args]
        cc.export(kernel, signature)(dispatcher.py_func)
    with tempfile.TemporaryDirectory(dir=dest, prefix=f".{name}-") as tmp:
        cc.output_dir = tmp
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            cc.compile()
        built = Path(tmp) / cc.output_file
        meta = Path(tmp) / (name + ".json")
        meta.write_text(json.dumps({"format": FORMAT, "group": group, "args": specs}))
        so = dest / (name + EXTENSION_SUFFIX)
        os.replace(meta, dest / meta.name)        # the JSON first: a module is only used
        os.replace(built, so)                     # with its JSON beside it
    for old in dest.glob(f"_amp_aot_{group}_*"):  # earlier sources' builds
        if not old.name.startswith(name):
            old.unlink(missing_ok=True)
    return so
