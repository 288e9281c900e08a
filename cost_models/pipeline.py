"""Pipeline and iteration time (AMP eq. 4 and 5)."""
from __future__ import annotations

from collections.abc import Sequence


def pipeline_time_s(stage_time_s: Sequence[float], cut_time_s: Sequence[float],
                    gas: int) -> float:
    """AMP eq. 5: T_pp = (gas - 1) * max_i t_i + sum_i e_i + sum_i t_i.

    t_i: one micro-batch forward+backward on stage i; e_i: P2P between stages i and i+1.
    """
    return (gas - 1) * max(stage_time_s) + sum(cut_time_s) + sum(stage_time_s)


def iteration_time_s(pipeline_time_s_per_replica: Sequence[float],
                     dp_sync_time_s_per_device: Sequence[float]) -> float:
    """AMP eq. 4: T = max over replicas of T_pp + max over devices of the DP gradient sync."""
    return max(pipeline_time_s_per_replica) + max(dp_sync_time_s_per_device, default=0.0)


def exposed_time_s(time_s: float, overlap: float) -> float:
    """The part of a communication not hidden behind computation (overlap in [0, 1])."""
    return time_s * (1.0 - overlap)
