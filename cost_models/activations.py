"""Activation memory of one device in training: what autograd saves for backward, per layer and
micro-batch, the micro-batches 1F1B keeps in flight, recomputation's working set, and the
pipeline engine's buffers.

Pure functions of numbers (and of `cost_models.layers.Layer`). The notation is
cost_models.memory's: g the bytes of one element in the training precision, t the
tensor-parallel degree, s sequence length, h hidden size, f ffn size, a heads, V vocabulary,
b the micro-batch size. `benchmarks/memory_accuracy.py` measures every term on the real engine.

Activations saved for backward (per micro-batch, bytes)
-------------------------------------------------------
Counted tensor by tensor in the trial layers (pre-LN GPT block, F.scaled_dot_product_attention,
megatron-core linears and vocab-parallel cross-entropy), per token:

  transformer: g (4h + 4h/t + 2f/t + 4) + 4a/t      (+ g h_in with an input projection)
      LN1 input, LN1 output (QKV input), LN2 input, LN2 output (fc1 input)      4h
      QKV output (q, k, v views) 3h/t, attention output (proj input) h/t        4h/t
      fc1 output (GELU input), GELU output (fc2 input)                          2f/t
      LayerNorm mean and rstd, two per LayerNorm                                4
      attention log-sum-exp (fp32, one per head)                                4a/t bytes
  mlp:         g (2h + 2f/t + 2)                     (+ g h_in with an input projection)
  head:        g (2h + 2) + 4V/t + 9                 fp32 softmax of the logits (megatron saves
                                                     exp_logits in fp32), target mask (1 B) and
                                                     masked target (8 B)
               (Transformer Engine's fused cross-entropy, Layer.cross_entropy 'te': g V/t + 16,
               the logits' gradient in their dtype, two fp32 statistics and the target)
  embedding:   8 (t = 1) or 9 (t > 1)                the token ids (int64) [+ the vocab mask]
  custom:      g x output elements                   (a guess: one saved tensor per layer)

Llama-family layers (cost_models.layers.Layer.is_gpt_block false; g K/V groups, head width
d, F = 3f for SwiGLU and 2f for GELU, n = 1 statistic per RMSNorm, 2 per LayerNorm), as
megatron-core saves them:

  transformer: g (4h + 2n + ((a + 2g)d + [(a + g)(d + n)] + a d + F) / t) + 4a/t
      2 norm inputs and outputs (the second's input is the residual)            4h
      norm statistics (RMSNorm: rstd; LayerNorm: mean and rstd), two norms      2n
      q, k and v as the attention saves them (a + 2g)d/t: Transformer Engine's
        attention takes views of the QKV output where their layout allows and
        copies them contiguous where it does not (get_qkv_layout: v beside a
        rotated k); RoPE's rotated q and k are new tensors that replace the
        views (fused RoPE saves only its s x d frequencies, shared, not
        counted); either way the QKV output itself is freed                    (a + 2g)d/t
      qk_norm only: the query and key norms' inputs, and their statistics
        (per head)                                                  ((a + g)d + (a + g)n)/t
      attention output (proj input)                                             a d/t
      fc1 output (the fused bias-SwiGLU's input, 2f/t) and the SwiGLU output
        (fc2 input, f/t): 3f/t; GELU as above 2f/t                              F/t
      attention log-sum-exp (fp32, one per query head)                          4a/t bytes
  mlp:  g (2h + n + F/t);   head: g (2h + n) + 4V/t + 9.
  A mixture-of-experts block (E experts, k per token, width f_e, shared width f_s) saves,
  instead of the MLP's F/t, g (k (h + F_e + f_e) + F_s + f_s)/t + 8E/t: each routed copy's
  permuted input (fc1's input), fc1's output and the weighted activation's output (fc2's
  input), the shared experts as a dense MLP, and the router's fp32 logits and
  probabilities (`_moe_saved_elements`). megatron-core's grouped experts apply the router's
  probabilities inside the activation (GroupedMLP / TEGroupedMLP: activation_func_with_probs,
  weighted_bias_swiglu_impl, which saves its input and the probabilities), so the combine
  is a plain sum that keeps none of the experts' outputs. GPT-OSS's quick-GEGLU in unfused
  grouped experts (`Layer.fused_experts` false) keeps one more 2 f_e per routed copy: its
  clamps keep fc1's output and its fused kernel the clamped concatenation
  (weighted_bias_quick_geglu_impl); recomputing moe_act frees that too.
Biases save nothing. Hidden dropout (`Layer.hidden_dropout` > 0, Megatron-LM's
--hidden-dropout, 0.1 by default there) keeps a 1-byte mask per element of each dropout's
output: 2h per token in a transformer block (after the attention and after the MLP), h in
an mlp layer and in the embedding, split by sequence parallelism like the norms; without it
(the Llama recipes, the default here) none. With standard attention the (2g + 1) a s^2/t score bytes per query head
as above (megatron-core's unfused attention also keeps K and V repeated to a heads under
GQA, not counted). In Korthikanti et al.'s notation (2-byte elements, t = 1, b samples,
leaving out the per-token statistics and the 4 sba log-sum-exp bytes): the GPT block with
f = 4h keeps 2sb(4h + 3h + h + 8h) = 32 sbh (their 34 sbh less the 2 sbh of dropout masks);
a Llama block with RoPE, g = a and f = 8h/3 2sb(4h + 3h + h + 8h) = 32 sbh; Llama 3 8B
(a = 32, g = 8, d = 128, f = 3.5h) 2sb(4h + 1.5h + h + 10.5h) = 34 sbh.
Sequence parallelism divides the 4h + 2n part by t.

The flash-attention kernel behind scaled_dot_product_attention saves no attention scores;
`attention_scores=True` (training.attention: standard) adds what the classic implementation
keeps per score element: the softmax output (g), the attention-dropout mask (1 B) and the
dropout output (g), (2g + 1) a s^2 / t per sample (Korthikanti et al. 2022, "Reducing
activation recomputation", section 4.1: 5 a s^2 b bytes per layer in fp16).

FP8 (training.precision fp8, Transformer Engine): a linear layer saves an FP8 copy of its input
(1 B per element) for the backward instead of the BF16 tensor: the QKV and fc1 inputs (the norm
outputs, h each, which the fused norm-linear then does not keep in BF16) and the fc2 input
(the activation's output, f/t) shrink to 1 B per element; the projection's input, the
attention output that the fused attention keeps in BF16 for its own backward, gains its 1 B
FP8 copy (a d/t). Per token: (g - 1) (2h + f/t) fewer bytes and a d/t more (`fp8`).
NVFP4 (training.precision nvfp4) is counted the same: its saved copies hold 4-bit values and
one FP8 scale per 16 (0.5625 B an element), so the one byte here is an upper bound.

Sequence parallelism (Korthikanti et al. 2022, tmp > 1) stores the replicated per-token terms
(the LayerNorm inputs and outputs, their mean and rstd, an input projection's input) for the
rank's s/t tokens only: transformer g (4h/t + 4h/t + 2f/t + 4/t) + 4a/t, their Table 2's
sbh(10 + 24/t) -> 34 sbh/t without the dropout masks the trial layers do not have; a block's
checkpointed input is the s/t shard too. Selective recomputation
checkpoints the attention core only: the transformer no longer keeps the core's log-sum-exp
(4a/t) nor, with standard attention, its (2g + 1) a s^2 / t score bytes; during backward one
core's output and those terms exist again (`selective_working_set_bytes`). With flash
attention selective recomputation therefore saves only the 4a/t log-sum-exp bytes per token
(there is no s^2 term to drop) while still re-running the core: the paper's saving is the
standard-attention one (cost_models.recompute). Megatron-LM's --recompute-modules name
more than the core (`recomputed_modules`): layernorm frees the output of each norm that is a
module of its own, under Transformer Engine a mixture-of-experts block's pre-MLP norm (the
router's input, g h per token; the other norms are fused into the linear layer after them,
which keeps its input either way); moe_act frees the experts' activation output (fc2's
input, g k f_e/t per token) in 16-bit training (under FP8 fc2 keeps its FP8 copy of it
anyway). Each is recomputed in the backward and exists again for one layer meanwhile.

With full recomputation (DeepSpeed activation checkpointing of each transformer/mlp block) a
block keeps only its input, g s h_in per sample; the embedding and head keep everything.
1F1B keeps min(pp - j, gas) micro-batches in flight on stage j (DeepSpeed TrainSchedule), so the
first stage holds the most; recomputation adds one block's working set during backward.
The pipeline engine also keeps each in-flight buffer's stage output (for the last stage: the
logits) in `pipe_buffers['outputs']`, max(2, min(pp - j, gas)) buffers; with tmp > 1 a
non-last stage keeps 1/t of each output per rank (DeepSpeed partitions it over the tensor
group; under sequence parallelism it is the rank's [s/t, b, h] shard).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .layers import Layer, padded_vocab_size

FP32_BYTES = 4
"""fp32 master weights, fp32 gradient partitions, cross-entropy softmax, log-sum-exp."""
DROPOUT_MASK_BYTES = 1
"""A dropout mask element (torch's native dropout and Megatron-LM's fused bias-dropout-add
keep a bool per element)."""
INDEX_BYTES = 8
"""int64 token ids and targets."""
CHECKPOINTED_KINDS = ("transformer", "mlp")
"""Layer kinds the trials recompute (amp_search.trial.model.CHECKPOINTABLE_LAYERS)."""


def sequence_shards(tmp: int, sequence_parallel: bool) -> int:
    """How many ways sequence parallelism splits the replicated regions: tmp when it is on
    (Megatron switches it off at tmp = 1), else 1."""
    return tmp if sequence_parallel and tmp > 1 else 1


RECOMPUTABLE = ("core_attn", "layernorm", "moe_act", "mla_up_proj")
"""What selective recomputation may recompute (Megatron-LM's --recompute-modules)."""


def recomputed_modules(selective) -> frozenset:
    """The modules a `selective` argument recomputes: False (or empty) none, True the
    attention core (core_attn, what selective recomputation means without a list), or the
    names of RECOMPUTABLE themselves."""
    if selective is True:
        return frozenset(("core_attn",))
    if not selective:
        return frozenset()
    unknown = set(selective) - set(RECOMPUTABLE)
    if unknown:
        raise ValueError(f"recompute modules {sorted(unknown)}; known: {', '.join(RECOMPUTABLE)}")
    return frozenset(selective)


@lru_cache(maxsize=65536)      # a pure function; the search asks for the same layer often
def layer_saved_bytes(layer: Layer, *, mbs: int, tmp: int, bytes_per_element: int,
                      attention_scores: bool = False, sequence_parallel: bool = False,
                      selective: bool | tuple = False, fp8: bool = False) -> int:
    """Bytes autograd saves for backward in one forward of the trial layer (no full
    recomputation), per micro-batch; the per-token terms are in the module docstring.

    `sequence_parallel` (tmp > 1) splits the replicated per-token terms over the t ranks: the
    LayerNorm inputs and outputs (the column-parallel linears save their sequence shard and
    gather it again in backward), their mean and rstd, the input projection's input; the
    sharded terms (QKV, attention output, fc1, GELU, log-sum-exp, scores) stay as they are
    (Korthikanti et al. 2022, Table 2: sbh(10 + 24/t) -> sbh 34/t).
    `selective` checkpoints the attention core (True, or core_attn among the names of
    `recomputed_modules`): its log-sum-exp (flash) or its scores, dropout mask and dropout
    output (standard) are not kept; its inputs q, k, v are the QKV output and its output the
    projection's input, both kept anyway. layernorm and moe_act: see the module docstring."""
    modules = recomputed_modules(selective)
    core = "core_attn" in modules
    g, t = bytes_per_element, tmp
    h, f, a = layer.hidden_size, layer.ffn_hidden_size, layer.num_attention_heads
    v = padded_vocab_size(layer.vocab_size, tmp)
    s = layer.seq_length
    q = sequence_shards(tmp, sequence_parallel)
    proj_in = g * layer.input_hidden_size if layer.input_hidden_size and \
        layer.input_hidden_size != h else 0
    k = layer.kind
    masks = DROPOUT_MASK_BYTES * layer.dropout_masks * h     # per token, on the rank's tokens
    if k == "embedding":
        return (INDEX_BYTES + (1 if t > 1 else 0)) * s * mbs + masks * s // q * mbs
    if k in ("transformer", "mlp", "head") and not layer.is_gpt_block:
        replicated, split = _llama_saved_per_token(layer, tmp=t, bytes_per_element=g,
                                                   attention_scores=attention_scores,
                                                   selective=core)
        if fp8:
            replicated, split = _fp8_saved_per_token(layer, replicated, split, t, g)
        norm_out, act_out = recomputed_module_bytes(layer, modules, g, t)
        replicated -= norm_out                  # the pre-MLP norm's output
        if not fp8:                             # fc2's 16-bit input (FP8 keeps its copy)
            split -= act_out
        split -= recomputed_up_projection_bytes(layer, modules, g, t)
        return ((replicated + masks + proj_in * (k != "head")) * s // q + split * s) * mbs
    if k == "transformer":
        replicated = g * (4 * h + 4) + proj_in
        split = g * (4 * h // t + 2 * f // t)
        if not core:
            split += FP32_BYTES * a // t
            if attention_scores:
                split += (2 * g + 1) * a * s // t
    elif k == "mlp":
        replicated, split = g * (2 * h + 2) + proj_in, g * 2 * f // t
    elif k == "head":
        replicated, split = g * (2 * h + 2), _loss_saved_per_token(layer, v, t, g)
    elif k == "custom":
        return g * layer.custom_output_elements * mbs
    else:
        raise ValueError(f"unknown layer kind {k!r}")
    if fp8:
        replicated, split = _fp8_saved_per_token(layer, replicated, split, t, g)
    return ((replicated + masks) * s // q + split * s) * mbs


def _loss_saved_per_token(layer: Layer, v: int, t: int, g: int) -> int:
    """Bytes per token the head's loss keeps for the backward (V: the padded vocabulary):
    Megatron-LM's vocab-parallel cross-entropy its fp32 softmax (4V/t), the target mask (1 B)
    and the masked target (8 B); Transformer Engine's fused one (Layer.cross_entropy 'te') the
    logits' gradient in their own dtype (g V/t), two fp32 softmax statistics and the target
    (transformer_engine.pytorch.cross_entropy.CrossEntropyFunction: 16 B)."""
    if layer.cross_entropy == "te":
        return g * v // t + 2 * FP32_BYTES + INDEX_BYTES
    return FP32_BYTES * v // t + 1 + INDEX_BYTES


def _fp8_saved_per_token(layer: Layer, replicated: int, split: int, tmp: int,
                         g: int) -> tuple[int, int]:
    """(replicated, split) per token under FP8 (module docstring): the linear layers' saved
    inputs as FP8 copies, for the transformer and mlp layers (the head's GEMM stays in BF16
    under Transformer Engine's recipes)."""
    k = layer.kind
    if k not in ("transformer", "mlp"):
        return replicated, split
    h, f = layer.hidden_size, layer.ffn_hidden_size
    norms = 2 if k == "transformer" else 1               # QKV and fc1 inputs, or fc1's
    if layer.is_moe:   # the experts' fc1 (k h) and fc2 (k f_e) inputs; the pre-MLP norm's
        norms = 1      # output stays in BF16, the router's input
        f = layer.moe_shared_expert_size
        split -= (g - 1) * layer.moe_router_topk * (layer.expert_ffn + h) // tmp
    split -= (g - 1) * (f // tmp)                        # fc2 input
    if k == "transformer":
        split += layer.attention_width // tmp            # the projection input's FP8 copy
    # multi-latent attention: the up-projections' inputs, the normed latents
    latents = (layer.q_lora_rank + layer.kv_lora_rank) if layer.is_mla else 0
    return replicated - (g - 1) * (norms * h + latents), split


def _llama_saved_per_token(layer: Layer, *, tmp: int, bytes_per_element: int,
                           attention_scores: bool, selective: bool) -> tuple[int, int]:
    """(replicated, split) bytes per token a transformer, mlp or head layer with the
    Llama-family options saves (see the module docstring's table); the replicated part is
    what sequence parallelism divides by t, without an input projection's input."""
    g, t = bytes_per_element, tmp
    h, f, a = layer.hidden_size, layer.ffn_hidden_size, layer.num_attention_heads
    stats = layer.norm_stats
    mlp = (3 if layer.gated_mlp else 2) * f
    k = layer.kind
    if k == "head":
        v = padded_vocab_size(layer.vocab_size, tmp)
        return g * (2 * h + stats), _loss_saved_per_token(layer, v, t, g)
    if k == "mlp":
        return g * (2 * h + stats), g * (mlp // t)
    d, kv = layer.kv_channels, layer.query_groups
    attention = layer.qkv_width + layer.attention_width
    if layer.qk_norm:
        attention += (a + kv) * (d + stats)
    if layer.is_moe:
        mlp = _moe_saved_elements(layer)
    split = g * ((attention + mlp) // t)
    if layer.is_moe:
        split += 2 * FP32_BYTES * layer.num_experts // t     # the router's fp32 probabilities
    if not selective:
        split += FP32_BYTES * a // t
        if attention_scores:
            split += (2 * g + 1) * a * layer.seq_length // t
    return g * (4 * h + 2 * stats) + _mla_latent_saved(layer, g), split


def _mla_latent_saved(layer: Layer, g: int) -> int:
    """Bytes per token multi-latent attention keeps of its latents (0 for other layers):
    each latent norm's input and output (the up-projection's input), 2 (q_r + c), and their
    statistics. Like the block's norms they are per token and whole on every tensor rank,
    so sequence parallelism divides them by t (megatron-core runs the down-projections on
    the sequence shard and the up-projections' norm-linear gathers after the norm). The
    queries, keys and values the core keeps are `Layer.qkv_width`."""
    if not layer.is_mla:
        return 0
    stats = layer.norm_stats * (2 if layer.q_lora_rank else 1)
    return g * (2 * (layer.q_lora_rank + layer.kv_lora_rank) + stats)


def _moe_saved_elements(layer: Layer) -> int:
    """Elements per token a mixture-of-experts MLP saves (its rank's tokens, s/t of them
    under sequence parallelism, which Megatron-LM requires of MoE with tmp > 1): for each of
    the token's k copies the permuted input (fc1 input, h), fc1's output (F_e, the weighted
    activation's input) and the weighted activation's output (fc2 input, f_e); the experts'
    outputs are summed as they are (the router's weights applied in the activation, as
    megatron-core does), so none is kept; the shared experts as a dense MLP of width f_s."""
    k, h = layer.moe_router_topk, layer.hidden_size
    act = 3 if layer.gated_mlp else 2
    return k * (h + (act + _clamped_copy(layer)) * layer.expert_ffn) \
        + act * layer.moe_shared_expert_size


def _clamped_copy(layer: Layer) -> int:
    """Elements per routed copy, in units of f_e, that the quick-GEGLU of unfused grouped
    experts keeps beyond a SwiGLU's: the clamped concatenation of fc1's two halves (2; its
    clamps keep fc1's output, counted already); 0 otherwise."""
    return 2 if layer.unfused_clamps else 0


def offloaded_activation_bytes(per_layer_bytes) -> int:
    """What CPU activation offloading (megatron-core's --cpu-offloading-num-layers, Transformer
    Engine's offload handler) takes off a device that holds one micro-batch's activations
    (pp 1): the offloaded blocks' saved bytes (`per_layer_bytes`, one micro-batch each) less
    the largest, which is on its way to or from the host at any time (a copy in flight
    beside the compute, double-buffered)."""
    values = [int(x) for x in per_layer_bytes]
    return sum(values) - max(values, default=0)


def checkpoint_input_bytes(layer: Layer, *, mbs: int, bytes_per_element: int,
                           tmp: int = 1, sequence_parallel: bool = False) -> int:
    """What a recomputed block keeps: its input, g s h_in per sample (its sequence shard,
    g s h_in / t, under sequence parallelism)."""
    return bytes_per_element * layer.seq_length * layer.in_hidden * mbs \
        // sequence_shards(tmp, sequence_parallel)


def layer_activation_bytes(layer: Layer, *, mbs: int, tmp: int, bytes_per_element: int,
                           recompute: bool, attention_scores: bool = False,
                           sequence_parallel: bool = False, selective: bool | tuple = False,
                           fp8: bool = False) -> int:
    """Bytes the layer keeps for backward per micro-batch: everything it saves, or with full
    recomputation only a block's input (embedding and head are not recomputed)."""
    if recompute and layer.kind in CHECKPOINTED_KINDS:
        return checkpoint_input_bytes(layer, mbs=mbs, bytes_per_element=bytes_per_element,
                                      tmp=tmp, sequence_parallel=sequence_parallel)
    return layer_saved_bytes(layer, mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
                             attention_scores=attention_scores,
                             sequence_parallel=sequence_parallel, selective=selective, fp8=fp8)


def selective_working_set_bytes(layer: Layer, *, mbs: int, tmp: int, bytes_per_element: int,
                                attention_scores: bool = False,
                                selective: bool | tuple = True) -> int:
    """Extra bytes while a selectively recomputed attention core runs its backward: what the
    re-run core saves (its output g h/t and log-sum-exp 4a/t per token, plus the scores of
    standard attention), one transformer layer, one micro-batch; with `selective` naming
    more modules (`recomputed_modules`), a mixture-of-experts block's recomputed pre-MLP norm
    output (g h, on the rank's tokens) and experts' activation output (g k f_e/t) too."""
    if layer.kind != "transformer":
        return 0
    modules = recomputed_modules(selective)
    g, t, s = bytes_per_element, tmp, layer.seq_length
    a, h = layer.num_attention_heads, layer.hidden_size
    per_token = 0
    if "core_attn" in modules:
        width = h if layer.is_gpt_block else layer.attention_width    # the core's output
        per_token = g * width // t + FP32_BYTES * a // t
        if attention_scores:
            per_token += (2 * g + 1) * a * s // t
    norm_out, act_out = recomputed_module_bytes(layer, modules, g, t)
    per_token += norm_out // t + act_out    # the norm's on the rank's s/t tokens (MoE: SP)
    per_token += recomputed_up_projection_bytes(layer, modules, g, t)
    return per_token * s * mbs


def recomputed_up_projection_bytes(layer: Layer, modules, g: int, t: int) -> int:
    """Bytes per token multi-latent attention does not keep when mla_up_proj is recomputed
    (megatron-core checkpoints its up-projections and RoPE and discards their outputs once
    the core has run): the queries, keys and values, g a (2 (d + d_r) + d_v) / t, made again
    from the latents it keeps before the core's backward; 0 otherwise."""
    if "mla_up_proj" not in modules or not layer.is_mla:
        return 0
    return g * layer.qkv_width // t


def recomputed_module_bytes(layer: Layer, modules, g: int, t: int) -> tuple[int, int]:
    """Bytes per token of what the recomputed modules beyond the attention core re-create, a
    mixture-of-experts block's: layernorm its pre-MLP norm's output (g h, on every token the
    rank holds: divided by t only under sequence parallelism) and moe_act its experts'
    activation output (g k f_e / t, fc2's 16-bit input); (0, 0) for other layers. What
    `layer_saved_bytes` does not keep and `selective_working_set_bytes` holds again."""
    if not layer.is_moe:
        return 0, 0
    norm_out = g * layer.hidden_size if "layernorm" in modules else 0
    act_out = g * ((1 + _clamped_copy(layer)) * layer.moe_router_topk * layer.expert_ffn // t) \
        if "moe_act" in modules else 0
    return norm_out, act_out


def in_flight_microbatches(stage: int, pp: int, gas: int) -> int:
    """Micro-batches whose activations stage j holds at once under 1F1B: min(pp - j, gas)
    (DeepSpeed TrainSchedule.num_pipe_buffers; Narayanan et al. 2021, section 2.2)."""
    return max(1, min(pp - stage, gas))


def interleaved_in_flight_chunks(stage: int, pp: int, virtual_stages: int, gas: int) -> int:
    """Chunk activations (one model chunk, one micro-batch each) device j holds at once under
    Megatron-LM's interleaved 1F1B: its w = min(2 (pp - j - 1) + (v - 1) pp, v gas) warm-up
    forwards plus the steady state's next one, min(w + 1, v gas) (megatron-core 0.16's
    get_pp_rank_microbatches, num_warmup_microbatches). In micro-batches
    of the whole device: pp + (pp - 1) / v on the first device, against plain 1F1B's pp
    (`in_flight_microbatches`): the factor 1 + (pp - 1) / (pp v) of Korthikanti et al. 2022,
    section 4.2.3 (cost_models.schedule.interleaved_in_flight counts it from the schedule)."""
    v = virtual_stages
    return min(2 * (pp - stage - 1) + (v - 1) * pp + 1, v * gas)


def interleaved_saved_activation_bytes(chunk_bytes, *, stage: int, pp: int, gas: int) -> int:
    """The most bytes device j's saved activations reach under the interleaved schedule, with
    chunk_bytes[c] one micro-batch's saved activations of its chunk c: replays the device's
    order (cost_models.schedule.interleaved_order) and takes the largest sum over the chunks
    of (micro-batches held) x chunk_bytes[c]; with equal chunks that is
    `interleaved_in_flight_chunks` x chunk_bytes."""
    counts = _held_chunk_counts(pp, len(chunk_bytes), gas, stage)
    return int(max(0, (counts @ np.array([int(x) for x in chunk_bytes], dtype=np.int64)).max()))


@lru_cache(maxsize=256)
def _interleaved_kinds_chunks(pp: int, virtual_stages: int, gas: int):
    """cost_models.schedule.interleaved_order's kinds and chunks, once per shape."""
    from .schedule import interleaved_order

    kinds, _, chunk = interleaved_order(pp, virtual_stages, gas)
    return kinds, chunk


@lru_cache(maxsize=4096)
def _held_chunk_counts(pp: int, virtual_stages: int, gas: int, stage: int) -> np.ndarray:
    """[events, v] int64: after each step of device `stage`'s interleaved order, how many
    micro-batches of each of its chunks it holds (forwards run whose backward has not);
    cached, as the search asks for the same schedule for every candidate of its shape."""
    kinds, chunk = _interleaved_kinds_chunks(pp, virtual_stages, gas)
    step = np.zeros((kinds.shape[1], virtual_stages), dtype=np.int64)
    valid = chunk[stage] >= 0
    rows = np.flatnonzero(valid)
    step[rows, chunk[stage][valid]] = np.where(kinds[stage][valid] == 0, 1, -1)
    out = np.cumsum(step, axis=0)
    out.setflags(write=False)
    return out


def recompute_working_set_bytes(layers, *, mbs: int, tmp: int, bytes_per_element: int,
                                attention_scores: bool = False, sequence_parallel: bool = False,
                                selective: bool | tuple = False, fp8: bool = False) -> int:
    """Extra bytes while a recomputed block runs its backward: its full saved set minus the
    input it already kept (the recomputation saves the same input storage), largest block;
    with `selective`, the largest `selective_working_set_bytes`."""
    best = 0
    for x in layers:
        if selective:
            best = max(best, selective_working_set_bytes(
                x, mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
                attention_scores=attention_scores, selective=selective))
        elif x.kind in CHECKPOINTED_KINDS:
            full = layer_saved_bytes(x, mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
                                     attention_scores=attention_scores,
                                     sequence_parallel=sequence_parallel, fp8=fp8)
            best = max(best, full - checkpoint_input_bytes(
                x, mbs=mbs, bytes_per_element=bytes_per_element, tmp=tmp,
                sequence_parallel=sequence_parallel))
    return best


@dataclass(frozen=True)
class ActivationTerms:
    """What a stage's layers keep, before the schedule says how many micro-batches: the
    part of `stage_saved_activation_bytes` and `pipeline_buffer_bytes` that does not depend
    on where the stage sits (so a planner computes it once per set of layers)."""

    per_microbatch_bytes: int
    """Saved for backward by one micro-batch of the layers."""
    working_set_bytes: int
    """Recomputation's working set beyond them (0 without recomputation)."""
    buffer_bytes: float
    """One pipeline output buffer: the last layer's output (0 without layers)."""
    aliased_buffers: int
    """Buffers of a stage ending with the head already counted with its saved logits."""


def activation_terms(layers, *, mbs: int, tmp: int, bytes_per_element: int,
                     recompute: bool, attention_scores: bool = False,
                     sequence_parallel: bool = False, selective: bool | tuple = False,
                     fp8: bool = False) -> ActivationTerms:
    """The stage-independent terms of `stage_saved_activation_bytes` (its per-micro-batch
    bytes and recomputation working set, which starts after the head's backward has freed
    what the head saved, so the head's bytes are not counted twice) and of
    `pipeline_buffer_bytes` (one buffer's bytes, and the head's aliased buffers)."""
    return activation_terms_of_runs(
        tuple((x, 1) for x in layers), mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
        recompute=recompute, attention_scores=attention_scores,
        sequence_parallel=sequence_parallel, selective=selective, fp8=fp8)


def activation_terms_of_runs(runs, *, mbs: int, tmp: int, bytes_per_element: int,
                             recompute: bool, attention_scores: bool = False,
                             sequence_parallel: bool = False, selective: bool | tuple = False,
                             fp8: bool = False) -> ActivationTerms:
    """`activation_terms` of the layers that `runs`, ((layer, count), ...) in order, stand
    for: each layer `count` times over. Each layer's bytes are computed once per run and
    multiplied (integers: the same sums), the largest working set taken over the runs' layers
    (the same maximum), so that a stage of many equal blocks costs a few calls instead of one
    per block."""
    kw = dict(mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
              attention_scores=attention_scores, sequence_parallel=sequence_parallel, fp8=fp8)
    selective = False if recompute else selective
    runs = [(x, n) for x, n in runs if n > 0]
    per_mb = sum(n * layer_activation_bytes(x, recompute=recompute, selective=selective, **kw)
                 for x, n in runs)
    working = 0
    if recompute or selective:
        head = sum(n * layer_saved_bytes(x, **kw) for x, n in runs if x.kind == "head")
        working = max(0, recompute_working_set_bytes([x for x, _ in runs], selective=selective,
                                                     **kw) - head)
    last = runs[-1][0] if runs else None
    return ActivationTerms(
        per_microbatch_bytes=per_mb, working_set_bytes=working,
        buffer_bytes=stage_output_buffer_bytes(last, mbs=mbs, tmp=tmp,
                                               bytes_per_element=bytes_per_element)
        if last is not None else 0.0,
        aliased_buffers=head_buffers_aliased(bytes_per_element)
        if last is not None and last.kind == "head" else 0)


def stage_activation_bytes(terms: ActivationTerms, *, stage: int, pp: int, gas: int,
                           pipelined: bool) -> int:
    """`stage_saved_activation_bytes` + `pipeline_buffer_bytes` of stage j from its terms."""
    act = in_flight_microbatches(stage, pp, gas) * terms.per_microbatch_bytes \
        + terms.working_set_bytes
    if pipelined and terms.buffer_bytes:
        act += _buffers_bytes(stage, pp, gas, terms.buffer_bytes, terms.aliased_buffers)
    return act


def _buffers_bytes(stage: int, pp: int, gas: int, buffer_bytes: float, aliased: int) -> int:
    """The pipeline engine's output buffers of stage j (`pipe_buffer_count`), less those
    already counted with the head's saved logits, of `buffer_bytes` each."""
    return int((pipe_buffer_count(stage, pp, gas) - aliased) * buffer_bytes)


def stage_saved_activation_bytes(layers, *, stage: int, pp: int, gas: int, mbs: int, tmp: int,
                                 bytes_per_element: int, recompute: bool,
                                 attention_scores: bool = False, sequence_parallel: bool = False,
                                 selective: bool | tuple = False, fp8: bool = False) -> int:
    """The most bytes saved for backward that stage j holds at once:
    n = in_flight_microbatches micro-batches of its layers' saved activations; with
    recomputation (full or selective), plus one block's (one attention core's) working set
    during backward (`activation_terms`)."""
    terms = activation_terms(layers, mbs=mbs, tmp=tmp, bytes_per_element=bytes_per_element,
                             recompute=recompute, attention_scores=attention_scores,
                             sequence_parallel=sequence_parallel, selective=selective, fp8=fp8)
    return stage_activation_bytes(terms, stage=stage, pp=pp, gas=gas, pipelined=False)


def pipeline_buffer_bytes(layers, *, stage: int, pp: int, gas: int, mbs: int, tmp: int,
                          bytes_per_element: int, pipelined: bool) -> int:
    """Stage outputs the pipeline engine keeps in `pipe_buffers['outputs']`: one per buffer
    (max(2, min(pp - j, gas)) buffers, filled by min(buffers, gas) micro-batches); on the last
    stage the head's logits (g s V/t per sample), which for fp32 are the very tensor the
    cross-entropy saves for the micro-batch in flight (counted there, not here)."""
    if not pipelined or not layers:
        return 0
    last = layers[-1]
    return _buffers_bytes(stage, pp, gas,
                          stage_output_buffer_bytes(last, mbs=mbs, tmp=tmp,
                                                    bytes_per_element=bytes_per_element),
                          head_buffers_aliased(bytes_per_element) if last.kind == "head" else 0)


def pipe_buffer_count(stage: int, pp: int, gas: int) -> int:
    """Output buffers the pipeline engine allocates on stage j: max(2, min(pp - j, gas)),
    of which at most gas are ever filled (DeepSpeed TrainSchedule.num_pipe_buffers)."""
    return min(max(2, min(pp - stage, gas)), gas)


def stage_output_buffer_bytes(last: Layer, *, mbs: int, tmp: int,
                              bytes_per_element: int) -> float:
    """Bytes one pipeline buffer holds when `last` is the stage's last layer: its output
    activation, 1/t of it on each tensor rank when tmp > 1 (DeepSpeed's pipeline engine keeps
    a non-last stage's outputs partitioned over the tensor group, `pipe_partitioned`; under
    sequence parallelism the outputs are [s/t, b, h] shards already and the partitioning is
    switched off); after the head, its logits g s V/t per sample."""
    from .layers import output_elements

    if last.kind != "head":
        return float(bytes_per_element * output_elements(last) * mbs) / tmp
    return float(bytes_per_element * last.seq_length
                 * (padded_vocab_size(last.vocab_size, tmp) // tmp) * mbs)


def head_buffers_aliased(bytes_per_element: int) -> int:
    """Logit buffers of the last stage that are the very tensor the fp32 cross-entropy saves
    for the micro-batch in flight (counted with the activations, not again here)."""
    return 1 if bytes_per_element == FP32_BYTES else 0


# ----------------------------------------------------------------------------- one stage
