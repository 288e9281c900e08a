"""Analytic per-layer time on one device (used when no measured profile matches).

Device time of one forward pass of one micro-batch through one tensor rank's shard:

    t_forward = sum over GEMM calls i of F_i / (peak * eff(F_i))       dense GEMMs
              + attention                                             flash or standard
              + elementwise bytes / memory bandwidth                  norms, GeLU, residuals
    t_backward = 2 x t_forward                                        (input and weight grads)

plus, per micro-batch, a fixed kernel floor for every block pass (`kernel_floor_time_s`).

- eff(F) = eff_max * F / (F + F_half): a GEMM's fraction of dense peak rises with its size F
  (FLOPs of the call) and saturates (AMP section 3.4: raising tmp shrinks the GEMMs, and 'a
  matrix multiplication with only a few FLOPs can take a long time'); eff_max and F_half are
  per GPU type, in the catalog.
- attention 'flash' (a fused kernel, e.g. FlashAttention / SDPA): the core's 4 s^2 h / t FLOPs
  at GEMM efficiency, no score traffic; 'standard' (Megatron and DeepSpeed before 2023, V100
  and T4): the a s^2 / t score matrix, `standard_attention_bytes` per score element and
  forward pass, its two batched GEMMs each the longer of their FLOPs and their bytes
  (`standard_attention_times_s`).
- kernel floor: the GPU's minimum time for a block's many small kernels in one pass (launch
  to launch, tails), whatever their size; per device type, in the catalog.

The host that issues the kernels is a second resource (`host_time_s`): a block pass costs a
fixed host time (Python, framework dispatch, autograd, launches), and every tensor-parallel
all-reduce a host-side cost per extra rank (`host_time_by_pass_s` per pass). The GPU runs
asynchronously behind the host, so a pass takes the longer of the two
(`overlapped_time_s`): small layers are host-bound, large ones device-bound, and the host
terms vanish at scale. Each micro-batch starts in step with the host (its input is copied to
the device with a blocking copy), so the forward and the backward overlap the host each on
its own (`synced_overlapped_time_s`).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .layers import (Layer, attention_core_flops, attention_score_elements,
                     cp_merge_bytes_by_pass, elementwise_bytes_by_pass, gemm_flops,
                     tp_collectives_by_pass)

ATTENTION_KINDS = ("flash", "standard")

BLOCK_KINDS = ("transformer", "mlp")
"""Layers that run as a block of many kernels (and that full recomputation replays)."""


def standard_attention_bytes(bytes_per_element: int) -> float:
    """Bytes moved per score element in one forward of unfused attention: QK^T writes the
    scores (g), scale-mask-softmax reads and writes them (2g), dropout reads them, writes its
    output and a 1-byte mask (2g + 1), attention x V reads them (g): 6g + 1 (13 B in fp16)."""
    return 6.0 * bytes_per_element + 1.0


def standard_attention_backward_bytes(bytes_per_element: int) -> float:
    """Bytes moved per score element in one backward of unfused attention: attention x V's
    backward writes the probabilities' gradient and reads the probabilities (for V's
    gradient) (2g), dropout's backward reads the gradient and the mask and writes (2g + 1),
    softmax's reads its output and the gradient and writes (3g), QK^T's backward reads the
    scores' gradient twice (for Q's and K's) (2g): 9g + 1 (19 B in fp16), 1.46x the forward's
    `standard_attention_bytes`, not 2x."""
    return 9.0 * bytes_per_element + 1.0


@dataclass(frozen=True, kw_only=True)
class DeviceSpeed:
    """The numbers of one device type the analytic layer time needs."""

    peak_flops_per_s: float
    """Dense peak of the training precision."""
    memory_bandwidth_bytes_per_s: float
    gemm_max_efficiency: float = 0.8
    """eff_max: the fraction of peak large GEMMs reach."""
    gemm_half_flops: float = 2e9
    """F_half: the GEMM size (FLOPs per call) at which efficiency is half of eff_max."""
    linear_peak_flops_per_s: float | None = None
    """Dense peak of the linear layers' GEMMs where they run in a narrower precision than the
    rest (FP8 under Transformer Engine: the attention core and the memory-bound work stay in
    BF16, `peak_flops_per_s`); None: the same peak."""
    linear_gemm_max_efficiency: float | None = None
    """eff_max of those narrower GEMMs (their F_half scales with the peak, the same fixed
    time per call); None: gemm_max_efficiency."""

    def linear(self) -> "DeviceSpeed":
        """The speed the linear layers' GEMMs run at: this one, or the narrower precision's
        peak and efficiency, with F_half scaled by the peaks' ratio (the same fixed time per
        GEMM call: F_half / (peak eff_max) is a time)."""
        if self.linear_peak_flops_per_s is None:
            return self
        eff = self.linear_gemm_max_efficiency or self.gemm_max_efficiency
        half = self.gemm_half_flops * (self.linear_peak_flops_per_s * eff
                                       / (self.peak_flops_per_s * self.gemm_max_efficiency))
        return DeviceSpeed(peak_flops_per_s=self.linear_peak_flops_per_s,
                           memory_bandwidth_bytes_per_s=self.memory_bandwidth_bytes_per_s,
                           gemm_max_efficiency=eff, gemm_half_flops=half)


@dataclass(frozen=True, kw_only=True)
class HostCosts:
    """Host-side fixed costs of the training framework on a device type (analytic times)."""

    block_pass_s: float = 0.0
    """Host time to issue one block pass of one micro-batch (the head and loss: one pass's
    worth)."""
    tp_allreduce_per_rank_s: float = 0.0
    """Host time of one tensor-parallel all-reduce per extra rank in the group."""


@dataclass(frozen=True, kw_only=True)
class LayerTime:
    forward_s: float
    backward_s: float


def gemm_efficiency(flops, *, max_efficiency: float, half_flops: float):
    """eff(F) = eff_max * F / (F + F_half): the fraction of dense peak a GEMM of F FLOPs gets."""
    return max_efficiency * flops / (flops + half_flops)


def gemm_time_s(flops, device: DeviceSpeed):
    """One GEMM call of `flops` FLOPs at its size's efficiency."""
    if flops <= 0:
        return 0.0
    eff = gemm_efficiency(flops, max_efficiency=device.gemm_max_efficiency,
                          half_flops=device.gemm_half_flops)
    if eff <= 0.0:      # so small that eff underflows: the same time, (F + F_half)/(peak eff_max)
        return (flops + device.gemm_half_flops) / (device.peak_flops_per_s
                                                   * device.gemm_max_efficiency)
    return flops / (device.peak_flops_per_s * eff)


def attention_time_s(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed,
                     bytes_per_element: int, attention: str, cp: int = 1) -> float:
    """The attention core of one forward pass (see the module docstring); one context-parallel
    rank's share, 1/cp of it, with cp > 1: Megatron-LM's ring attention (Transformer
    Engine's AttnFuncWithCPAndKVP2P) runs it as cp kernel calls, one per ring step on the
    K/V chunk the rank holds then, each 1/cp of the rank's share (with the causal mask
    balanced over the steps by the 2 cp chunks), so each call pays the fixed cost of a
    small one (`gemm_time_s`: cp x F_half more than one call of the whole share)."""
    if attention not in ATTENTION_KINDS:
        raise ValueError(f"attention {attention!r}; accepted: {', '.join(ATTENTION_KINDS)}")
    if attention == "flash":
        flops = attention_core_flops(layer, tmp) * mbs
        if cp > 1:
            return cp * gemm_time_s(flops / (cp * cp), device)
        return gemm_time_s(flops, device)
    return standard_attention_times_s(layer, tmp=tmp, mbs=mbs, device=device,
                                      bytes_per_element=bytes_per_element, cp=cp)[0]


def score_gemm_flops(layer: Layer, tmp: int = 1) -> float:
    """FLOPs per sample of one of unfused attention's two batched GEMMs (QK^T, or the
    probabilities times V) in one forward on one tensor rank: 2 s^2 a d / t over every score
    (an unfused kernel computes the whole matrix, a sliding window's masked scores too)."""
    if layer.kind != "transformer":
        return 0.0
    width = layer.hidden_size if layer.is_gpt_block else layer.core_width
    return 2.0 * layer.seq_length ** 2 * width / tmp


def standard_attention_times_s(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed,
                               bytes_per_element: int, cp: int = 1) -> tuple[float, float]:
    """(forward, backward) of unfused attention, as Megatron-LM runs it, each kernel at the
    roofline: the longer of its FLOPs at GEMM efficiency and its bytes at memory bandwidth.
    With E score elements and g bytes each (`standard_attention_bytes`, 6g + 1 per element
    forward; `standard_attention_backward_bytes`, 9g + 1 backward):
    forward: QK^T max(F, writes g E), scale-mask-softmax and dropout (4g + 1) E, attention x V
    max(F, reads g E);
    backward: attention x V's two GEMMs max(2F, 2g E), dropout's and softmax's backwards
    (5g + 1) E, QK^T's two GEMMs max(2F, 2g E).
    F = `score_gemm_flops`; the batched GEMMs are compute-bound once the head width d exceeds
    about peak / memory bandwidth (~125 on an A100), memory-bound below it."""
    elements = attention_score_elements(layer, tmp) * mbs / cp
    g = float(bytes_per_element)
    byte_s = elements / device.memory_bandwidth_bytes_per_s      # one byte per score element
    f_s = gemm_time_s(score_gemm_flops(layer, tmp) * mbs / cp, device)
    # the GEMMs' own reads and writes of the scores: g each forward, 2g each backward; the
    # rest of the bytes counted per element are the softmax's and the dropout's
    gemm_forward, gemm_backward = g * byte_s, 2.0 * g * byte_s
    forward = 2.0 * max(f_s, gemm_forward) \
        + standard_attention_bytes(bytes_per_element) * byte_s - 2.0 * gemm_forward
    backward = 2.0 * max(2.0 * f_s, gemm_backward) \
        + standard_attention_backward_bytes(bytes_per_element) * byte_s - 2.0 * gemm_backward
    return forward, backward


def analytic_layer_time(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed,
                        bytes_per_element: int, attention: str = "flash",
                        framework: str = "deepspeed", cp: int = 1, ep: int = 1,
                        frozen: bool = False) -> LayerTime:
    """Forward and backward device time of one micro-batch of `mbs` samples through one tensor
    rank's shard of `layer`, its size-dependent work only (collectives: cost_models.comm;
    fixed costs: `kernel_floor_time_s`, `host_time_s`). The GEMMs and a fused attention take
    twice their forward time in backward (input and weight gradients); the memory-bound ops
    move what `cost_models.layers.elementwise_bytes_by_pass` counts for the framework, and
    unfused attention under megatron what `standard_attention_backward_bytes` counts (the
    trial layers under deepspeed: twice the forward, as before these were counted).

    With context parallelism (cp > 1) the rank holds s/cp of each sequence's tokens: every
    GEMM call is cp times smaller (so a little less efficient), the memory-bound work is 1/cp,
    and the attention core, its queries against every key (the K/V passed around the ring,
    cost_models.comm.context_parallel_ring_time_s), 1/cp of the whole core, the causal mask
    balanced over the ranks as Megatron-LM's 2 cp chunks do; the ring's merges of its steps'
    partial outputs and gradients move `cost_models.layers.cp_merge_bytes_by_pass` more.
    `ep`: a mixture-of-experts layer's expert-parallel degree, which sets how many tokens
    each local expert's GEMM gets (`cost_models.layers.gemm_flops`). `frozen`: the weights are not trained (LoRA's
    base model), so the backward runs the GEMMs' input gradients only, once their forward
    time rather than twice."""
    gemm = gemm_forward_time_s(layer, tmp=tmp, mbs=mbs, device=device, cp=cp, ep=ep)
    if attention == "standard" and framework == "megatron":
        core, core_backward = standard_attention_times_s(
            layer, tmp=tmp, mbs=mbs, device=device, bytes_per_element=bytes_per_element, cp=cp)
    else:
        core = attention_time_s(layer, tmp=tmp, mbs=mbs, device=device,
                                bytes_per_element=bytes_per_element, attention=attention, cp=cp)
        core_backward = 2.0 * core
    ew_forward, ew_backward = elementwise_bytes_by_pass(layer, tmp, bytes_per_element, framework)
    merge_forward, merge_backward = cp_merge_bytes_by_pass(layer, tmp, cp, bytes_per_element)
    ew_forward, ew_backward = ew_forward / cp + merge_forward, ew_backward / cp + merge_backward
    bw = device.memory_bandwidth_bytes_per_s
    return LayerTime(forward_s=gemm + core + ew_forward * mbs / bw,
                     backward_s=(1.0 if frozen else 2.0) * gemm + core_backward
                     + ew_backward * mbs / bw)


def gemm_forward_time_s(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed, cp: int = 1,
                        ep: int = 1) -> float:
    """The forward GEMMs of one micro-batch through one tensor rank's shard of `layer` (one
    context-parallel rank's tokens), each call at its size's efficiency in the training
    precision's GEMM rate (`DeviceSpeed.linear`); the backward runs them twice (input and
    weight gradients). The head's projection is not a linear layer of that precision:
    Megatron-LM (the one backend that trains in FP8 here) runs it as a plain PyTorch GEMM
    outside Transformer Engine's FP8 region (megatron-core's GPTModel.output_layer is a
    tensor_parallel.ColumnParallelLinear, which never quantizes; TE's fp8_autocast wraps the
    transformer block only), so under FP8 and NVFP4 it runs at the storage precision's (BF16)
    rate, as the attention core does."""
    linear = device if layer.kind == "head" else device.linear()
    return sum(gemm_time_s(f * mbs / cp, linear) for f in gemm_flops(layer, tmp, ep))


def tp_overlap_exposed_s(comm_s, gemm_s, tmp: int):
    """What a tensor-parallel collective overlapped with the GEMM it feeds or follows leaves
    exposed, as Transformer Engine's userbuffers run them (Megatron-LM --tp-comm-overlap):
    the GEMM is split into tmp chunks and each chunk's all-gather or reduce-scatter runs
    beside another chunk's GEMM, so the first (or last) chunk's transfer is always exposed,
    and the rest wherever the transfers outlast the GEMM chunks beside them:
    max(comm / t, comm - gemm (1 - 1/t))."""
    return np.maximum(comm_s / tmp, comm_s - gemm_s * (1.0 - 1.0 / tmp))


def block_passes(layer: Layer, recompute: bool) -> int:
    """Passes of one micro-batch through a block: forward, backward and, with full
    recomputation, the forward again; 0 for the other layers."""
    if layer.kind not in BLOCK_KINDS:
        return 0
    return 3 if recompute else 2


def kernel_floor_time_s(layer: Layer, *, recompute: bool, kernel_floor_s: float) -> float:
    """The fixed device time of one micro-batch of `layer`: the kernel floor per block pass."""
    return block_passes(layer, recompute) * kernel_floor_s


def host_time_by_pass_s(layer: Layer, *, tmp: int, recompute: bool, host: HostCosts,
                        sequence_parallel: bool = False, framework: str = "deepspeed"
                        ) -> tuple[float, float, float]:
    """Host time to issue one micro-batch of `layer`, per pass (forward, backward, recomputed
    forward): each block pass costs `block_pass_s` and each of its tensor-parallel collectives
    (all-reduces; with sequence parallelism the all-gathers, reduce-scatters and all-reduces of
    `tp_collectives_by_pass`, each call costing what an all-reduce does) `tmp - 1` times
    `tp_allreduce_per_rank_s`; the head and loss one pass's worth, half in forward and half
    in backward; the embedding nothing (a few kernels)."""
    if layer.kind == "head":
        return host.block_pass_s / 2, host.block_pass_s / 2, 0.0
    if layer.kind not in BLOCK_KINDS:
        return 0.0, 0.0, 0.0
    by_pass = tp_collectives_by_pass(layer, recompute, sequence_parallel, framework)
    per_call = (tmp - 1) * host.tp_allreduce_per_rank_s if tmp > 1 else 0.0
    ran = (True, True, recompute)
    return tuple(host.block_pass_s + len(calls) * per_call if on else 0.0
                 for calls, on in zip(by_pass, ran))


def host_time_s(layer: Layer, *, tmp: int, recompute: bool, host: HostCosts,
                sequence_parallel: bool = False, framework: str = "deepspeed") -> float:
    """Host time to issue one micro-batch of `layer`: the sum of `host_time_by_pass_s`."""
    return sum(host_time_by_pass_s(layer, tmp=tmp, recompute=recompute, host=host,
                                   sequence_parallel=sequence_parallel, framework=framework))


def overlapped_time_s(host_s, device_s):
    """The GPU runs behind the host: a layer takes the longer of the two (arrays or floats)."""
    return np.maximum(host_s, device_s)


def synced_overlapped_time_s(host_forward_s, device_forward_s, host_s, device_s):
    """`overlapped_time_s` when every micro-batch starts in step: forward and backward overlap
    the host each on its own, max(host_f, device_f) + max(host - host_f, device - device_f)
    (arrays or floats; host_s and device_s are the totals over the passes).

    The training loops copy each micro-batch's input to the device with a blocking copy,
    which waits for the work queued before it: Megatron-LM's get_batch on every stage (its
    broadcast_data reads the sizes back with .cpu()), DeepSpeed's pipeline engine's
    load_micro_batch on the first and last stage, a plain loop's .to(device). Megatron-LM's
    pipeline P2P also ends with torch.cuda.synchronize() ("to protect against race condition
    when using batch_isend_irecv", p2p_communication._communicate). So the host cannot issue
    the next forward while the device still runs this backward. Where the forward is
    host-bound and the backward (with the recomputed forward) device-bound, the micro-batch
    takes host_f + device_b, not the max of the totals. For a layer whose passes scale alike
    (the recomputed forward and the backward do at least the forward's work and issue at
    most twice its host work) this is the exact max-plus time of the forward-then-backward
    sequence; with no fixed host costs it is the device time, as before. The planner applies
    it layer by layer (its partition DP needs costs that add up over layers), so a stage whose
    layers lean different ways (host-bound blocks beside a device-bound head) is charged a
    little more than its micro-batch's max-plus time, as the layer-by-layer max was before."""
    return (np.maximum(host_forward_s, device_forward_s)
            + np.maximum(host_s - host_forward_s, device_s - device_forward_s))


ADAM_BYTES_PER_PARAM = {"fp32": 28, "bf16": 42, "fp16": 42, "fp8": 42, "nvfp4": 42}
"""Memory traffic of one optimizer step per parameter. fp32 Adam: read the weight, gradient and
two moments (16 B), write the weight and the moments (12 B). Mixed precision adds the passes
over the gradients before the step: copy the fp16/bf16 gradient into an fp32 main gradient
(read 2, write 4), unscale and check it for inf/NaN (read 4), and after the step write the
fp16/bf16 weights (2) and zero the gradient (2): 42 B, as the vTrain A100 data shows (41-43 B
per parameter where the shards are not tiny). The step is elementwise, so memory-bound. fp8
(Transformer Engine) keeps BF16 weights and gradients beside the fp32 master: bf16's 42 B."""


def optimizer_step_time_s(n_params: float, *, memory_bandwidth_bytes_per_s: float,
                          precision: str) -> float:
    """One Adam step over `n_params` parameters (a device's share): memory-bound, at the
    device's peak memory bandwidth."""
    return n_params * ADAM_BYTES_PER_PARAM[precision] / memory_bandwidth_bytes_per_s


def microbatch_time_s(forward_s, backward_s, recompute: bool):
    """One micro-batch through a layer: forward, then backward; full activation recomputation
    replays the forward inside the backward pass. Floats or arrays."""
    return forward_s + backward_s + (forward_s if recompute else 0.0)
