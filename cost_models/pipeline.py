"""Pipeline and iteration time (AMP eq. 4 and 5), on per-stage numbers.

The planner builds per-layer cost arrays [stage, layer] (the stage's devices running that
layer), cuts them at the partition's boundaries with `stage_totals`, and composes:

    t_j   = stage_totals(compute + tensor_parallel)_j + per-micro-batch overhead
    T_pp  = pipeline_time_s(t, e, gas)                                  (eq. 5)
    T     = iteration_time_s(T_pp, sync_j + step_j, step_overhead)      (eq. 4)

The exact partition DP (amp_search.partition) minimises the same objective inside its
numba kernels.
"""
from __future__ import annotations

import numpy as np


def stage_totals(per_layer, boundaries) -> np.ndarray:
    """Sum of per_layer[j, l] over stage j's layers boundaries[j] .. boundaries[j+1]-1.

    per_layer: [pp, L] (stage j's cost of layer l); boundaries: pp + 1 increasing indices."""
    per_layer = np.asarray(per_layer, dtype=float)
    b = np.asarray(boundaries, dtype=np.int64)
    prefix = np.concatenate([np.zeros((per_layer.shape[0], 1)), np.cumsum(per_layer, axis=1)],
                            axis=1)
    js = np.arange(per_layer.shape[0])
    return prefix[js, b[1:]] - prefix[js, b[:-1]]


def boundary_times(cut_s, boundaries) -> np.ndarray:
    """e_j for j = 1 .. pp-1: cut_s[j, i] is the P2P into stage j when it starts at layer i."""
    b = np.asarray(boundaries, dtype=np.int64)
    js = np.arange(1, len(b) - 1)
    return np.asarray(cut_s, dtype=float)[js, b[1:-1]]


def pipeline_time_s(stage_time_s, cut_time_s, gas: int) -> float:
    """AMP eq. 5: T_pp = (gas - 1) * max_i t_i + sum_i e_i + sum_i t_i.

    t_i: one micro-batch forward+backward on stage i; e_i: P2P between stages i and i+1."""
    t = np.asarray(stage_time_s, dtype=float)
    return float((gas - 1) * t.max() + np.sum(cut_time_s) + t.sum())


def iteration_time_s(pipeline_s: float, after_pipeline_s, step_overhead_s: float = 0.0) -> float:
    """AMP eq. 4: T = T_pp (the slowest replica) + the largest per-stage time spent after the
    pipeline drains (data-parallel sync and optimizer step) + a fixed cost per iteration."""
    return float(pipeline_s + np.max(after_pipeline_s, initial=0.0) + step_overhead_s)


def exposed_time_s(time_s, overlap: float):
    """The part of a communication not hidden behind computation (overlap in [0, 1])."""
    return time_s * (1.0 - overlap)
