"""Communication terms (AMP section 3.4, with alpha-beta latency and NIC sharing).

All sizes in bytes, bandwidths in bytes/s (one direction), times in seconds.
"""
from __future__ import annotations


def allreduce_time_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float,
                     latency_s: float = 0.0) -> float:
    """Ring all-reduce, AMP eq. 3: 2(n-1)M / (nB), plus 2(n-1) message latencies."""
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) * message_bytes / (n * bandwidth_bytes_per_s) + 2 * (n - 1) * latency_s


def allgather_time_s(message_bytes: float, n: int, bandwidth_bytes_per_s: float,
                     latency_s: float = 0.0) -> float:
    """Ring all-gather (or reduce-scatter) of a full message of M bytes: (n-1)M / (nB)
    (the bus-bandwidth factor (n-1)/n of Lin et al. 2024), plus n-1 latencies."""
    if n <= 1:
        return 0.0
    return (n - 1) * message_bytes / (n * bandwidth_bytes_per_s) + (n - 1) * latency_s


reduce_scatter_time_s = allgather_time_s


def p2p_time_s(message_bytes: float, bandwidth_bytes_per_s: float,
               latency_s: float = 0.0) -> float:
    """Point-to-point send between pipeline stages, AMP: e = v / b (plus one latency)."""
    return message_bytes / bandwidth_bytes_per_s + latency_s


def shared_bandwidth(link_bytes_per_s: float, flows: int) -> float:
    """Fair sharing (Proteus): k flows that cross the same NIC at once get B/k each."""
    return link_bytes_per_s / max(flows, 1)


def data_parallel_sync_time_s(*, param_bytes: float, grad_bytes: float, n: int,
                              bandwidth_bytes_per_s: float, latency_s: float, zero_stage: int,
                              gas: int, gather_weights_after_step: bool = False) -> float:
    """Data-parallel traffic of one iteration for one device, by ZeRO stage (Rajbhandari et
    al. 2020, section 7: stages 0-2 move 2(n-1)/n of the model per iteration, stage 3 1.5x):

    - 0: one ring all-reduce of the gradients at the accumulation boundary (AMP eq. 3), plus an
         all-gather of the updated weights when the optimizer partitions its fp32 master copy
         (`gather_weights_after_step`: DeepSpeed's BF16_Optimizer, bf16 without ZeRO);
    - 1: reduce-scatter of the gradients + all-gather of the updated weights (same volume);
    - 2: gradients reduce-scattered in every micro-batch's backward (DeepSpeed reduces the
         gradient partitions as they are produced), weights all-gathered once after the step;
    - 3: weights all-gathered in every micro-batch's forward and again in its backward, and
         gradients reduce-scattered in every backward.
    """
    if n <= 1:
        return 0.0
    ag = allgather_time_s
    if zero_stage in (0, 1):
        gather = ag(param_bytes, n, bandwidth_bytes_per_s, latency_s) \
            if zero_stage == 0 and gather_weights_after_step else 0.0
        return allreduce_time_s(grad_bytes, n, bandwidth_bytes_per_s, latency_s) + gather
    if zero_stage == 2:
        return (gas * reduce_scatter_time_s(grad_bytes, n, bandwidth_bytes_per_s, latency_s)
                + ag(param_bytes, n, bandwidth_bytes_per_s, latency_s))
    if zero_stage == 3:
        return gas * (2 * ag(param_bytes, n, bandwidth_bytes_per_s, latency_s)
                      + reduce_scatter_time_s(grad_bytes, n, bandwidth_bytes_per_s, latency_s))
    raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
