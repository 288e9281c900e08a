"""amp-search: find the fastest 3D-parallel (pp x dp x tmp) strategy for a model on a cluster.

    from amp_search import load_spec, plan, estimate
    spec = load_spec("configs/amp-hetero-gpt2.yaml")
    result = plan(spec)              # Plan: ranked Estimates + Megatron baseline
    print(result.best.strategy, result.best.iteration_time_s)
"""
from .errors import AmpSearchError, Infeasible, SpecError, UsageError
from .planner import NoFeasibleStrategy, estimate, evaluate, plan
from .records import Breakdown, Estimate, Plan, StageMemory, Strategy
from .spec import Spec, load_spec

__all__ = [
    "AmpSearchError", "Breakdown", "Estimate", "Infeasible", "NoFeasibleStrategy", "Plan",
    "Spec", "SpecError", "StageMemory", "Strategy", "UsageError", "estimate", "evaluate",
    "load_spec", "plan",
]
