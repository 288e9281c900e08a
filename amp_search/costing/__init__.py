"""The cost model of one strategy on one cluster, shared by the planner and the simulator:

- cost_model:   CostModel (cluster arrays, caches; `evaluate` costs one strategy), StageCosts,
                PlacedLayout, measured_overheads, SharedRows (rows several clusters share)
- layer_times:  per-layer forward/backward times per device type (profile first, analytic
                second): LayerTimer
- links:        which links each collective uses and the bandwidth it gets (NIC sharing):
                ClusterArrays, ring_links, p2p_links
- stage_memory: each pipeline stage's peak memory, the out-of-memory check: stage_memory

The formulas themselves are in the top-level `cost_models` package (pure functions of
numbers); this package applies them to a spec, a placement and measurements.
"""
from .cost_model import CostModel, PlacedLayout, SharedRows, StageCosts, measured_overheads

__all__ = ["CostModel", "PlacedLayout", "SharedRows", "StageCosts", "measured_overheads"]
