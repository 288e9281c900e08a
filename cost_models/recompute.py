"""Sequence parallelism and selective activation recomputation (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv:2205.05198).

Two knobs Megatron-LM turns on by default since 2022:

- sequence parallelism (SP, section 4.2.2): the layer-norm and dropout regions, which tensor
  parallelism leaves replicated, are split over the t tensor ranks along the sequence; each
  all-reduce of tensor parallelism becomes a reduce-scatter + all-gather pair with the same
  bus volume (a ring all-reduce *is* a reduce-scatter then an all-gather), but twice as many
  calls, and backward gathers each column-parallel GEMM's input again (1.5x the backward
  volume): `cost_models.layers.tp_collectives_by_pass`; the layer-norm / dropout / residual
  work and its saved activations are divided by t;
- selective recomputation (section 4.3): only the attention core (QK^T, softmax, dropout,
  attention x V) is checkpointed and re-run in backward; it holds the 5 a s^2 b bytes that
  grow with s^2 and costs only the core's FLOPs again.

Table 2 of the paper, activation bytes per transformer layer in fp16 with dropout:

    no parallelism                       s b h (34 + 5 a s / h)
    tensor parallel                      s b h (10 + 24/t + 5 a s / (h t))
    tensor + sequence parallel           s b h / t (34 + 5 a s / h)
    tensor parallel + selective          s b h (10 + 24/t)
    tensor + sequence + selective        s b h 34 / t
    full recomputation                   2 s b h           (the layer's input only)

`paper_activation_bytes_per_layer` is that table. With a fused (flash) attention kernel there is
no a s^2 term to drop: the kernel stores no scores, so selective recomputation saves nothing
in memory (and only the kernel's O(s a) log-sum-exp in the trial layers,
cost_models.memory) while still costing its forward again; the search therefore only ranks it
when standard attention is used (amp_search.search_space).

The planner's memory counts what the trial layers save (cost_models.memory, which takes
`sequence_parallel` and `selective` flags); the time terms are here.
"""
from __future__ import annotations

from dataclasses import dataclass

from .compute import DeviceSpeed, attention_time_s, gemm_time_s
from .layers import (Layer, clamp_bytes_per_element, dropout_bytes, megatron_activation_bytes,
                     megatron_norm_residual_bytes, mla_up_projection_flops, q_k_bytes)

RECOMPUTE_MODES = ("none", "selective", "full")
"""training.activation_checkpointing values: nothing, the attention core, each whole block."""


# ----------------------------------------------------------------------------- the paper's table

def paper_activation_bytes_per_layer(*, s: int, b: int, h: int, a: int, t: int = 1,
                                     sequence_parallel: bool = False,
                                     recompute: str = "none") -> float:
    """Korthikanti et al. 2022, Table 2 (and eq. 1-2 of section 4): activation bytes one
    transformer layer keeps for backward, fp16 with dropout, per tensor rank."""
    if recompute not in RECOMPUTE_MODES:
        raise ValueError(f"recompute {recompute!r}; accepted: {', '.join(RECOMPUTE_MODES)}")
    if recompute == "full":
        return 2.0 * s * b * h / (t if sequence_parallel else 1)
    core = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if sequence_parallel:
        return s * b * h / t * (34.0 + core)
    return s * b * h * (10.0 + 24.0 / t + core / t)


def paper_attention_core_bytes_per_layer(*, s: int, b: int, a: int, t: int = 1) -> float:
    """What selective recomputation drops (section 4.1): the softmax output (2 a s^2 b), its
    dropout mask (a s^2 b) and dropout output (2 a s^2 b), 5 a s^2 b / t bytes in fp16."""
    return 5.0 * a * s * s * b / t


# ----------------------------------------------------------------------------- time

@dataclass(frozen=True, kw_only=True)
class KnobTime:
    """Device seconds one knob adds to one micro-batch of one layer (negative: saves)."""

    forward_s: float
    backward_s: float
    """Including a recomputation the knob runs inside backward."""

    @property
    def total_s(self) -> float:
        return self.forward_s + self.backward_s


def selective_recompute_time_s(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed,
                               bytes_per_element: int, attention: str,
                               modules: tuple[str, ...] = ("core_attn",)) -> KnobTime:
    """Selective recomputation re-runs the attention core's forward (QK^T, softmax, dropout,
    attention x V: `cost_models.compute.attention_time_s`, flash or standard) once inside the
    backward pass (Korthikanti et al. 2022, section 4.3). In FLOPs: 4 b s^2 h / t more per
    layer against forward + backward's 72 b s h^2 (1 + s / (6h)) / t, e.g. 0.9 % for GPT-3
    175B (s = 2048, h = 12288). Transformer layers only.

    `modules` (Megatron-LM's --recompute-modules, cost_models.activations.RECOMPUTABLE): the
    attention core as above where core_attn is named; in a mixture-of-experts block,
    layernorm re-runs the pre-MLP norm's forward (read h, write h: 2g h per token) and
    moe_act the experts' activation's (a gated one reads 2 f_e and writes f_e, GELU reads and
    writes f_e, for each of the token's k experts; the quick-GEGLU's separate clamps and
    concatenation again where the experts are not fused, `clamp_bytes_per_element`),
    memory-bound, on the rank's s/t tokens; in multi-latent attention, mla_up_proj re-runs
    the column-parallel up-projections (`cost_models.layers.mla_up_projection_flops`) and RoPE."""
    if layer.kind != "transformer":
        return KnobTime(forward_s=0.0, backward_s=0.0)
    core = attention_time_s(layer, tmp=tmp, mbs=mbs, device=device,
                            bytes_per_element=bytes_per_element, attention=attention) \
        if "core_attn" in modules else 0.0
    if layer.is_mla and "mla_up_proj" in modules:
        # the up-projections' GEMMs and RoPE again (one read and write of q and k)
        core += sum(gemm_time_s(f * mbs, device) for f in mla_up_projection_flops(layer, tmp)) \
            + q_k_bytes(layer, tmp, bytes_per_element) * mbs \
            / device.memory_bandwidth_bytes_per_s
    if layer.is_moe:
        g, per = float(bytes_per_element), 0.0
        if "layernorm" in modules:
            per += 2.0 * g * layer.hidden_size
        if "moe_act" in modules:      # with the quick-GEGLU's unfused clamps, those too
            per += (megatron_activation_bytes(layer, bytes_per_element)
                    + clamp_bytes_per_element(layer, bytes_per_element)[0]) \
                * layer.moe_router_topk * layer.expert_ffn
        core += per * layer.seq_length * mbs / tmp / device.memory_bandwidth_bytes_per_s
    return KnobTime(forward_s=0.0, backward_s=float(core))


def replicated_elementwise_bytes(layer: Layer, bytes_per_element: int) -> float:
    """Bytes per sample moved in one forward by the ops tensor parallelism leaves replicated
    and sequence parallelism splits over t, as the trial layers run them (eager PyTorch):
    layer norms, residual adds and hidden dropouts on s x h.
    The same terms as `cost_models.layers.elementwise_bytes` without the ones already split
    by t: transformer 2 LayerNorms + 2 residual adds (16 s h), mlp one of each (8 s h),
    head its final LayerNorm (4 s h), and each hidden dropout's (2g + 1) s h; the embedding
    adds its positions before the scatter. RMSNorm moves the same s x h tensors as
    LayerNorm, so Llama-family layers are counted alike (their RoPE and SwiGLU work is on
    the t-split q, k and fc1 output)."""
    s, h = layer.seq_length, layer.hidden_size
    n = {"transformer": 16.0, "mlp": 8.0, "head": 4.0}.get(layer.kind, 0.0)
    dropout = 0.0 if layer.kind == "embedding" else dropout_bytes(layer, bytes_per_element)
    return n * s * h * bytes_per_element + dropout


def replicated_elementwise_bytes_by_pass(layer: Layer, bytes_per_element: int,
                                         framework: str = "deepspeed") -> tuple[float, float]:
    """(forward, backward) bytes per sample of the replicated region sequence parallelism
    splits, counted as `cost_models.layers.elementwise_bytes_by_pass` counts the framework's
    kernels.

    deepspeed (the trial layers): `replicated_elementwise_bytes` forward, twice that backward.

    megatron (fused bias-dropout-add, fused norms; g bytes per element, masks 1 byte), the
    s x h terms of that count (`cost_models.layers.megatron_norm_residual_bytes`), per token: forward 2 norms (2g h each) and 2 bias-dropout-adds
    ((3g + 1) h each): (10g + 2) h; backward 2 norm backwards (3g h each), 2 bias-dropout-add
    backwards ((2g + 1) h each, + g h each for the bias gradient with biases) and the 2
    residual gradient sums (3g h each): (16g + 2) h [+ 2g h]. The mlp layer has one of each:
    (5g + 1) h and (8g + 1) h [+ g h]; the head its final norm: 2g h and 3g h. A residual
    add's own backward is the identity (its gradient flows on unchanged), so the backward
    is 1.6-1.7x the forward rather than 2x; the attention context's permute and the MLP
    activation run on the t-split width and are not in this region."""
    if framework != "megatron":
        forward = replicated_elementwise_bytes(layer, bytes_per_element)
        return forward, 2.0 * forward
    s = layer.seq_length
    if layer.kind == "head":        # its final norm
        g, h = float(bytes_per_element), float(layer.hidden_size)
        return s * 2 * g * h, s * 3 * g * h
    forward, backward = megatron_norm_residual_bytes(layer, bytes_per_element)
    return s * forward, s * backward


def sequence_parallel_time_s(layer: Layer, *, tmp: int, mbs: int, device: DeviceSpeed,
                             bytes_per_element: int, recompute: bool = False,
                             framework: str = "deepspeed") -> KnobTime:
    """What sequence parallelism changes in a layer's device time: the replicated elementwise
    work (`replicated_elementwise_bytes_by_pass`, the framework's kernels, memory-bound) runs
    on s/t tokens, saving (1 - 1/t) of it in forward and in backward, and the forward's once
    more in a fully recomputed forward. Its communication (reduce-scatters and all-gathers
    instead of all-reduces, the all-gather repeated in backward for each column-parallel
    weight gradient, and the per-call host time of each) is in
    `cost_models.layers.tp_collectives_by_pass`, which the planner and the simulator cost
    (exposed, or beside the GEMMs with training.tp_comm_overlap:
    `cost_models.compute.tp_overlap_exposed_s`)."""
    if tmp <= 1:
        return KnobTime(forward_s=0.0, backward_s=0.0)
    forward, backward = replicated_elementwise_bytes_by_pass(layer, bytes_per_element,
                                                             framework)
    share = mbs * (1.0 - 1.0 / tmp) / device.memory_bandwidth_bytes_per_s
    return KnobTime(forward_s=-forward * share,
                    backward_s=-(backward + (forward if recompute else 0.0)) * share)
