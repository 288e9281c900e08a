"""numba compilation with the on-disk cache where it can be written.

`njit(fn, what=...)` is ``numba.njit(cache=True, **options)(fn)``; where numba finds no
writable cache folder (the package's ``__pycache__`` and the user-wide cache both read-only:
numba raises ``RuntimeError: cannot cache function ...: no locator available``) it is
``numba.njit(**options)(fn)`` instead, which compiles on first use in every process, and one
warning per process and `what` says so. Used by amp_search.partition (the layer-assignment DP)
and cost_models.schedule (the simulator).
"""
from __future__ import annotations

import warnings

_warned: set[str] = set()


def njit(fn, *, what: str, **options):
    import numba

    try:
        return numba.njit(cache=True, **options)(fn)
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
