"""amp-search: find the fastest 3D-parallel (pp x dp x tmp) strategy for a model on a cluster.

    from amp_search import load_spec, plan, estimate
    spec = load_spec("configs/amp-hetero-gpt2.yaml")
    result = plan(spec)              # Plan: ranked Estimates + Megatron baseline
    print(result.best.strategy, result.best.iteration_time_s)

Names are imported on first use, so that a trial process (which imports
`amp_search.trial.run`) does not pay for the planner, numba and the cost model.
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "AmpSearchError": "errors", "Infeasible": "errors", "SpecError": "errors",
    "UsageError": "errors",
    "NoFeasibleStrategy": "planner", "estimate": "planner", "evaluate": "planner",
    "plan": "planner", "plan_backends": "planner",
    "Breakdown": "records", "Estimate": "records", "Plan": "records", "StageMemory": "records",
    "Strategy": "records",
    "Spec": "spec", "load_spec": "spec",
    "LaunchOptions": "tuner", "TuneResult": "tuner", "tune": "tuner",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return __all__
