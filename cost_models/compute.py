"""Analytic per-layer compute time on one device (used when no measured profile matches).

    t_forward = FLOPs / (peak * efficiency(GEMM size)) + elementwise bytes / memory bandwidth
    t_backward = 2 * t_forward   (two GEMMs per forward GEMM: input and weight gradients)

Efficiency falls for small matrices (AMP section 3.4: raising tmp lowers arithmetic intensity,
so 'a matrix multiplication with only a few FLOPs can take a long time'). It follows a
saturating curve in the GEMM's smallest dimension d: eff(d) = eff_max * d / (d + d_half).
"""
from __future__ import annotations

from dataclasses import dataclass

from .layers import Layer, elementwise_bytes, forward_flops, gemm_min_dim

DEFAULT_MAX_EFFICIENCY = 0.7
"""Best fraction of dense peak large transformer GEMMs reach in training (Megatron-LM reports
~52% of peak end-to-end on A100 for GPT-3 scale, kernels alone reach ~70-80%)."""
DEFAULT_HALF_EFFICIENCY_DIM = 128
"""GEMM dimension at which efficiency is half of the maximum (tile-quantisation regime)."""


@dataclass(frozen=True, kw_only=True)
class LayerTime:
    forward_s: float
    backward_s: float


def gemm_efficiency(min_dim: float, *, max_efficiency: float = DEFAULT_MAX_EFFICIENCY,
                    half_dim: float = DEFAULT_HALF_EFFICIENCY_DIM) -> float:
    """eff(d) = eff_max * d / (d + d_half): the fraction of peak a GEMM of smallest side d gets."""
    return max_efficiency * min_dim / (min_dim + half_dim)


def analytic_layer_time(layer: Layer, *, tmp: int, mbs: int, peak_flops_per_s: float,
                        memory_bandwidth_bytes_per_s: float, bytes_per_element: int
                        ) -> LayerTime:
    """Forward and backward time of one micro-batch of `mbs` samples through one tensor rank's
    shard of `layer` (collectives excluded; they are costed by cost_models.comm)."""
    eff = gemm_efficiency(gemm_min_dim(layer, tmp, mbs))
    gemm_s = forward_flops(layer, tmp) * mbs / (peak_flops_per_s * eff)
    memory_s = elementwise_bytes(layer, tmp, bytes_per_element) * mbs \
        / memory_bandwidth_bytes_per_s
    forward_s = gemm_s + memory_s
    return LayerTime(forward_s=forward_s, backward_s=2.0 * forward_s)


ADAM_BYTES_PER_PARAM = {"fp32": 28, "bf16": 32, "fp16": 32}
"""Memory traffic of one Adam step per parameter: read the fp32 weight, gradient and two
moments (16 B), write the weight and the moments back (12 B); mixed precision also reads
and writes the low-precision copy (+4 B). The step is elementwise, so memory-bound."""


def optimizer_step_time_s(n_params: float, *, memory_bandwidth_bytes_per_s: float,
                          precision: str) -> float:
    """One Adam step over `n_params` parameters (a device's share): memory-bound, at the
    device's peak memory bandwidth."""
    return n_params * ADAM_BYTES_PER_PARAM[precision] / memory_bandwidth_bytes_per_s


def microbatch_time_s(forward_s, backward_s, recompute: bool):
    """One micro-batch through a layer: forward, then backward; full activation recomputation
    replays the forward inside the backward pass. Floats or arrays."""
    return forward_s + backward_s + (forward_s if recompute else 0.0)
