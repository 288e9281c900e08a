"""numba compilation with the on-disk cache where it can be written, loaded without numba's
start-up cost where it is.

`njit(fn, what=...)` is ``numba.njit(cache=True, **options)(fn)``; where numba finds no
writable cache folder (the package's ``__pycache__`` and the user-wide cache both read-only:
numba raises ``RuntimeError: cannot cache function ...: no locator available``) it is
``numba.njit(**options)(fn)`` instead, which compiles on first use in every process, and one
warning per process and `what` says so. Used by amp_search.partition (the layer-assignment DP)
and cost_models.simulator_kernels (the simulator).

Loading from the cache. numba's dispatcher, on the first call of any cached function in a
process, calls ``target_context.refresh()`` before it reads the cache: that imports and
installs every typing and lowering registry numba has (arrays, strings, random, the linear
algebra that imports scipy.linalg, ...), about 0.4 s of CPU (0.2 s of it scipy), which
compiled machine code never uses; on a cache hit only the object code is linked and the
runtime (NRT, for array allocation) initialised. `_CachedDispatcher.compile` does exactly
that on a hit: the overload it installs is the one numba's own ``compile`` would load (the
same index key, the same ``_load_overload``, the same ``insert_user_function`` and
``add_overload``), only without the refresh; on a miss, or if anything in numba's internals
differs from what it expects, it is numba's ``compile``, unchanged (which refreshes,
compiles and saves). Measured on this project's 2-core machine: a process that calls one
cached kernel, 1.02 s of CPU with numba's dispatcher, 0.49 s with this one.
"""
from __future__ import annotations

import time
import types
import warnings
from pathlib import Path

_warned: set[str] = set()
_dispatcher_class = None
_interim: dict[str, float | bool] | None = None
"""While set (`python_until_cached`): per kernel group, True once its compiled kernels are in
numba's on-disk cache, else when that was last looked at."""
INTERIM_POLL_S = 0.5
"""How often a group whose kernels are not cached yet looks at the cache again."""


def _cached_dispatcher_class():
    """numba's CPU dispatcher with a `compile` that loads a cache hit without refreshing the
    target context (module docstring); built on first use so that importing this module does
    not import numba."""
    global _dispatcher_class
    if _dispatcher_class is not None:
        return _dispatcher_class
    from numba.core import sigutils
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import CPUDispatcher
    from numba.core.runtime import rtsys

    class _CachedDispatcher(CPUDispatcher):
        def compile(self, sig):
            try:
                entry = self._load_cached(sig)
            except Exception:  # noqa: BLE001 - numba's own path below decides
                entry = None
            return entry if entry is not None else super().compile(sig)

        def _load_cached(self, sig):
            if not self._can_compile or not getattr(self._cache, "_enabled", False):
                return None
            with global_compiler_lock:
                args, _ = sigutils.normalize_signature(sig)
                existing = self.overloads.get(tuple(args))
                if existing is not None:
                    return existing.entry_point
                rtsys.initialize(self.targetctx)        # what refresh() does first
                cres = self._cache._load_overload(sig, self.targetctx)
                if cres is None or cres.objectmode:
                    return None
                self._cache_hits[sig] += 1
                self.targetctx.insert_user_function(cres.entry_point, cres.fndesc,
                                                    [cres.library])
                self.add_overload(cres)
                return cres.entry_point

    # pickled by reference, as cost_models._jit._CachedDispatcher (module __getattr__), as
    # numba pickles its own dispatchers' class
    _CachedDispatcher.__qualname__ = "_CachedDispatcher"
    _dispatcher_class = _CachedDispatcher
    return _dispatcher_class


def __getattr__(name: str):
    if name == "_CachedDispatcher":
        return _cached_dispatcher_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def njit(fn, *, what: str, **options):
    import numba

    try:
        if numba.config.DISABLE_JIT:
            return numba.njit(**options)(fn)      # the plain Python function
        try:
            cls = _cached_dispatcher_class()
        except (ImportError, AttributeError):    # numba's internals moved: its own dispatcher
            return numba.njit(cache=True, **options)(fn)
        # what numba.njit(cache=True, **options) builds, with the class above
        disp = cls(py_func=fn, locals={},
                   targetoptions={**options, "nopython": True, "boundscheck": None})
        disp.enable_caching()
        return disp
    except RuntimeError as exc:
        if "cannot cache" not in str(exc):
            raise
    if what not in _warned:
        _warned.add(what)
        # warn_explicit with line 0: the warning prints as one line, without a source line
        warnings.warn_explicit(f"amp-search: numba finds no writable cache folder, so the "
                               f"{what} are compiled in every run (~10 s); set "
                               f"NUMBA_CACHE_DIR to a writable folder to keep them",
                               RuntimeWarning, __file__, 0, module=__name__)
    return numba.njit(**options)(fn)


def in_cache(dispatcher) -> bool:
    """Whether numba's on-disk cache holds a compiled overload of `dispatcher` for this
    machine, so that its first call loads it instead of compiling. Reads one small index
    file; any doubt (no cache, numba internals changed, a stale or foreign entry) answers
    False."""
    try:
        import numba

        if numba.config.DISABLE_JIT:
            return True  # nothing is compiled
        cache = dispatcher._cache
        index = cache._cache_file._load_index()  # {} when the source file changed
        codegen = dispatcher.targetctx.codegen()
        return any(cache._index_key(key[0], codegen) == key for key in index)
    except Exception:  # noqa: BLE001 - a guess about a cache must never fail a run
        return False


def python_until_cached(on: bool = True) -> None:
    """Process-wide: until a kernel group's compiled kernels are in numba's on-disk cache
    (another process compiles them: amp_search.kernels), run its plain-Python twins instead
    of compiling in this process, and switch to the compiled ones as soon as they are there
    (`pick`). The twins run the very same code, so only the speed differs. Off (the default):
    the kernels are compiled on first use, as numba does."""
    global _interim
    _interim = {} if on else None


def pick(group: str, compiled, twin, cached):
    """The kernel to call: `compiled`, or `twin` while `python_until_cached` is on and
    `cached()` (the group's cache check, looked at every INTERIM_POLL_S at most) says the
    compiled kernels are not in the cache yet."""
    if _interim is None:
        return compiled
    state = _interim.get(group)
    if state is True:
        return compiled
    now = time.monotonic()
    if state is None or now - state >= INTERIM_POLL_S:
        if cached():
            _interim[group] = True
            return compiled
        _interim[group] = now
    return twin


class _LazyKernel:
    """A kernel of a `KernelGroup` before numba has seen it: calling it turns the whole group
    into numba dispatchers (`KernelGroup.materialize`) and calls its own. Importing a kernel
    module therefore does not import numba."""

    def __init__(self, group: "KernelGroup", fn):
        self.group = group
        self.py_func = fn
        self.__name__ = fn.__name__
        self.__qualname__ = fn.__qualname__
        self.__doc__ = fn.__doc__
        self.__module__ = fn.__module__

    def __call__(self, *args):
        self.group.materialize()
        return self.group.namespace[self.__name__](*args)

    def __reduce__(self):      # by reference, as numba pickles its dispatchers
        return _module_attribute, (self.__module__, self.__name__)


def _module_attribute(module: str, name: str):
    import importlib

    return getattr(importlib.import_module(module), name)


class KernelGroup:
    """The numba kernels of one module, with three ways to run them.

    - Ahead-of-time compiled (cost_models._aot): an extension module built once, in the
      background, which loads without importing numba. Used whenever a current build exists
      and a call's arguments have the types it was built for.
    - numba's dispatchers (`njit`, with the on-disk cache): the kernels are declared with
      `lazy` and become dispatchers on first use (`materialize`), callees first, so that the
      module imports without numba.
    - Plain-Python twins (`twins`, the very same code), for use_numba=False (the tests
      compare them) and while `python_until_cached` waits for a background compile.

    `kernel(name)` gives the one to call. `entries` are the kernels called from Python: the
    ones whose cache entries say the group is cached, and the ones built ahead of time.
    """

    def __init__(self, namespace: dict, *, group: str, what: str, names: tuple[str, ...],
                 entries: tuple[str, ...], **options):
        self.namespace = namespace
        self.group = group
        self.what = what
        self.names = names          # callees before callers: the order numba needs
        self.entries = entries
        self.options = options
        self.source = Path(namespace["__file__"])
        self._twins: dict | None = None
        self._aot: dict | None = None
        self._aot_looked = False
        self.aot_misses = 0
        """Calls that the compiled module could not take (argument types), run by numba."""

    def lazy(self, fn) -> _LazyKernel:
        return _LazyKernel(self, fn)

    def materialize(self) -> None:
        """Replace every lazy kernel of the module by its numba dispatcher (compiled on
        first call, or loaded from numba's cache), callees first."""
        for name in self.names:
            kernel = self.namespace[name]
            if isinstance(kernel, _LazyKernel):
                self.namespace[name] = njit(kernel.py_func, what=self.what, **self.options)

    @property
    def twins(self) -> dict:
        """Plain-Python copies of the kernels whose calls to one another stay in Python:
        each copy's globals point the kernel names at the other copies."""
        if self._twins is None:
            namespace = dict(self.namespace)
            for name in self.names:
                fn = self.namespace[name].py_func
                namespace[name] = types.FunctionType(fn.__code__, namespace, fn.__name__,
                                                     fn.__defaults__)
            self._twins = namespace
        return self._twins

    # ------------------------------------------------------------------ the caches
    def numba_cached(self) -> bool:
        """Whether numba's on-disk cache holds the entry kernels for this machine."""
        try:
            self.materialize()
        except Exception:  # noqa: BLE001 - a guess about a cache must never fail a run
            return False
        return all(in_cache(self.namespace[name]) for name in self.entries)

    def aot(self) -> dict | None:
        """{entry: guarded compiled function} from the ahead-of-time build, or None where
        there is none for the current source (looked for once per process, and again after
        `forget_aot`)."""
        if not self._aot_looked:
            self._aot_looked = True
            from . import _aot

            found = _aot.load(self.group, self.source)
            if found is not None:
                module, specs = found
                if set(self.entries) <= set(specs):
                    self._aot = {name: self._guarded(name, getattr(module, name),
                                                     _aot.checker(specs[name]))
                                 for name in self.entries}
        return self._aot

    def forget_aot(self) -> None:
        """Look for the ahead-of-time build again on the next call (after a build)."""
        self._aot, self._aot_looked = None, False

    def cached(self) -> bool:
        """Whether the kernels run compiled without compiling here: an ahead-of-time build,
        or numba's cache."""
        return self.aot() is not None or self.numba_cached()

    def _guarded(self, name: str, fast, check):
        def call(*args):
            if check(args):
                return fast(*args)
            self.aot_misses += 1
            self.materialize()
            return self.namespace[name](*args)
        call.__name__ = name
        return call

    def kernel(self, name: str, use_numba: bool = True):
        """The kernel `name` to call: its twin (use_numba False), else the ahead-of-time
        build, else numba's dispatcher (or the twin while `python_until_cached` waits)."""
        if not use_numba:
            return self.twins[name]
        aot = self.aot()
        if aot is not None and name in aot:
            return aot[name]
        return pick(self.group, self.namespace[name], self.twins[name], self.numba_cached)

    def build_aot(self):
        """Build the entry kernels ahead of time (cost_models._aot.build), after they have
        been called through numba (their signatures are read off the dispatchers); returns
        the module's path. _aot.AotUnavailable when it cannot be built."""
        from . import _aot

        self.materialize()
        path = _aot.build(self.group, self.source,
                          {name: self.namespace[name] for name in self.entries})
        self.forget_aot()
        return path

    def aot_failed(self) -> str | None:
        """Why the last ahead-of-time build of the current source failed, or None."""
        from . import _aot

        return _aot.failed(self.group, self.source)
