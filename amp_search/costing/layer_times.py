"""Per-layer forward/backward times per device type: measured profile first, analytic second.

For each GPU type in the cluster, `LayerTimer` uses the measured profile of that exact device
name in the spec's precision that it is given (`Measurements.layer_profiles`, written by
`amp-search profile` and loaded at the edge by `amp_search.measurements`); a layer,
tensor-parallel degree and micro-batch size the profile covers takes its measured times, the
rest falls back to the analytic model of cost_models.compute. A profile of another device
name is never used. `sources()` says, per device type, where its numbers came from.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from cost_models.compute import (DeviceSpeed, analytic_layer_time, gemm_forward_time_s,
                                  optimizer_step_time_s)
from cost_models.layers import Layer, param_count, per_distinct_layer

from ..spec import GPU, STORAGE_PRECISION, Spec


@dataclass(frozen=True)
class LayerTimes:
    """Per layer of the model, one micro-batch on one tensor rank of one device type."""

    forward_s: np.ndarray
    backward_s: np.ndarray
    analytic: np.ndarray
    """True where the time is the analytic model's (the fixed kernel and host costs are then
    added by the planner; a measured time already holds them)."""


def device_speed(gpu: GPU, precision: str) -> DeviceSpeed:
    """The catalog's numbers of `gpu` that the analytic layer time uses; under fp8 the linear
    layers' GEMMs run at the FP8 peak and the rest at the storage precision's (bf16)."""
    storage = STORAGE_PRECISION.get(precision, precision)
    narrower = storage != precision
    return DeviceSpeed(peak_flops_per_s=gpu.peak_flops_per_s[storage],
                       memory_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s,
                       gemm_max_efficiency=gpu.gemm_max_efficiency,
                       gemm_half_flops=gpu.gemm_half_flops,
                       linear_peak_flops_per_s=gpu.peak_flops_per_s[precision] if narrower
                       else None,
                       linear_gemm_max_efficiency=(
                           gpu.gemm_nvfp4_max_efficiency or gpu.gemm_fp8_max_efficiency
                           if precision == "nvfp4" else gpu.gemm_fp8_max_efficiency)
                       if narrower else None)


@dataclass
class LayerTimer:
    spec: Spec
    profiles: Mapping = field(default_factory=dict)
    """device type name -> LayerProfile (in the spec's precision); absent: analytic only."""
    _cache: dict = field(default_factory=dict)
    _used: dict = field(default_factory=dict)   # gpu name -> set of sources actually used

    def _profile(self, gpu: GPU):
        return self.profiles.get(gpu.name)

    def times(self, gpu: GPU, tmp: int, mbs: int, cp: int = 1, ep: int = 1) -> LayerTimes:
        """Forward and backward time per layer for one micro-batch on one tensor rank of
        `gpu` (one context-parallel rank's share with cp > 1: analytic, the profiles being
        measured on whole sequences), and which of them are analytic."""
        key = (gpu.name, tmp, mbs, cp, ep)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        layers = self.spec.model.layers
        fwd = np.empty(len(layers))
        bwd = np.empty(len(layers))
        analytic = np.zeros(len(layers), dtype=bool)
        by_signature: dict[str, tuple[float, float, bool]] = {}
        profile = self._profile(gpu)
        used = self._used.setdefault(gpu.name, set())
        for i, layer in enumerate(layers):
            sig = layer.signature
            if sig not in by_signature:
                # a measured profile trains every weight: LoRA's frozen ones are analytic
                by_signature[sig] = self._layer_time(
                    gpu, layer, tmp, mbs, profile if cp == 1 and not layer.is_moe
                    and not self.spec.training.frozen_weights else None, used, cp, ep)
            fwd[i], bwd[i], analytic[i] = by_signature[sig]
        hit = self._cache[key] = LayerTimes(forward_s=fwd, backward_s=bwd, analytic=analytic)
        return hit

    def _layer_time(self, gpu: GPU, layer: Layer, tmp: int, mbs: int, profile,
                    used: set, cp: int = 1, ep: int = 1) -> tuple[float, float, bool]:
        if profile is not None:
            hit = profile.lookup(layer.signature, tmp, mbs)
            if hit is not None:
                used.add(profile.source)
                return hit.forward_s, hit.backward_s, False
        training = self.spec.training
        t = analytic_layer_time(layer, tmp=tmp, mbs=mbs,
                                device=device_speed(gpu, training.precision),
                                bytes_per_element=training.bytes_per_element,
                                attention=self.spec.attention_for(gpu),
                                framework=training.backend, cp=cp, ep=ep,
                                frozen=training.frozen_weights)
        used.add("analytic")
        return t.forward_s, t.backward_s, True

    def gemm_forward_s(self, gpu: GPU, tmp: int, mbs: int, cp: int = 1, ep: int = 1
                       ) -> np.ndarray:
        """[L] each layer's forward GEMMs of one micro-batch on one tensor rank of `gpu`
        (cost_models.compute.gemm_forward_time_s: analytic, beside measured layer times too,
        whose profiles do not split out the GEMMs)."""
        key = (gpu.name, tmp, mbs, cp, ep, "gemm")
        hit = self._cache.get(key)
        if hit is None:
            device = device_speed(gpu, self.spec.training.precision)
            hit = self._cache[key] = np.array(per_distinct_layer(
                self.spec.model.layers, lambda layer: gemm_forward_time_s(
                    layer, tmp=tmp, mbs=mbs, device=device, cp=cp, ep=ep)))
        return hit

    def optimizer_step_s(self, gpu: GPU, tmp: int) -> np.ndarray:
        """Seconds of one optimizer step over each layer's parameters on one tensor rank of
        `gpu` (not yet divided among data-parallel ranks): the profile's measured Adam step
        where it has one, else memory-bound at the device's bandwidth."""
        key = (gpu.name, tmp, "optimizer")
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        profile = self._profile(gpu)
        training = self.spec.training
        out = np.empty(len(self.spec.model.layers))
        for i, layer in enumerate(self.spec.model.layers):
            hit = profile.lookup(layer.signature, tmp, 1) if profile is not None else None
            if hit is not None and hit.optimizer_step_s > 0:
                out[i] = hit.optimizer_step_s
            else:
                out[i] = optimizer_step_time_s(
                    param_count(layer, tmp),
                    memory_bandwidth_bytes_per_s=gpu.memory_bandwidth_bytes_per_s,
                    precision=training.precision)
        if training.frozen_weights:     # the frozen weights take no optimizer step
            out[:] = 0.0
        self._cache[key] = out
        return out

    def sources(self) -> dict[str, str]:
        """gpu name -> 'profile:<file>', 'analytic' or 'profile:<file>+analytic' (mixed)."""
        return {name: "+".join(sorted(s)) for name, s in self._used.items()}
