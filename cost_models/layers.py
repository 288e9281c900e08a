"""The model as the cost model sees it: a chain of layers, each described by numbers.

A `Layer` is the *application* description (Calculon's term): sizes only, no device, no
strategy. The functions below derive what the cost terms need from it, per sample (one
sequence) and for a tensor-parallel degree `tmp`:

- `forward_flops`      GEMM FLOPs of one forward pass (backward is 2x, Narayanan et al. 2021);
- `elementwise_bytes`  bytes moved by the memory-bound ops (norms, softmax, GELU, residuals);
- `param_count`        parameters held by one tensor rank;
- `output_elements`    elements of the activation sent to the next layer (the P2P volume);
- `tp_allreduce_elements`  elements all-reduced inside the layer per forward+backward
  (`tp_allreduce_elements_by_pass`: the same, per pass).

The layer code the trials run (`amp_search/trial/`) implements exactly these layers:
- embedding: vocab-parallel token embedding (V*h / tmp) + replicated learned positions (s*h);
- transformer: pre-LayerNorm GPT block, fused QKV (column parallel), output projection (row
  parallel), GELU MLP h -> f -> h (column then row parallel), biases everywhere;
- mlp: pre-LayerNorm GELU MLP h -> f -> h with a residual (column then row parallel);
- head: final LayerNorm + untied LM projection h -> V (column parallel) + vocab-parallel
  cross-entropy;
- custom: a layer given by its forward FLOPs, parameters and output size; replicated, never
  split by tensor parallelism.
"""
from __future__ import annotations

from dataclasses import dataclass, field

LAYER_KINDS = ("embedding", "transformer", "mlp", "head", "custom")
VOCAB_PAD_MULTIPLE = 128
"""Megatron-LM pads the vocabulary to a multiple of 128 x tmp (--make-vocab-size-divisible-by),
so that every tensor rank holds an equal, aligned shard; the trials do the same."""


def padded_vocab_size(vocab_size: int, tmp: int = 1) -> int:
    """The vocabulary the embedding and head really hold at tensor-parallel degree `tmp`."""
    multiple = VOCAB_PAD_MULTIPLE * tmp
    return -(-vocab_size // multiple) * multiple


@dataclass(frozen=True, kw_only=True)
class Layer:
    """One layer of the chain. Sizes are element counts; all per sample (one sequence)."""

    kind: str
    """One of LAYER_KINDS."""
    seq_length: int
    """Tokens per sample."""
    hidden_size: int = 0
    """Width of the layer's input and output (embedding: output; head: input)."""
    num_attention_heads: int = 0
    """Attention heads (transformer only)."""
    ffn_hidden_size: int = 0
    """Inner MLP width (transformer and mlp)."""
    vocab_size: int = 0
    """Vocabulary (embedding and head)."""
    input_hidden_size: int = 0
    """Width of the incoming activation when it differs from hidden_size (a projection is
    then part of the layer: h_in -> h). 0 means the same as hidden_size."""
    custom_forward_flops: float = 0.0
    """custom only: forward FLOPs per sample."""
    custom_params: int = 0
    """custom only: parameter count."""
    custom_output_elements: int = 0
    """custom only: output activation elements per sample."""
    name: str = field(default="")
    """A label for tables, e.g. 'block3'."""

    @property
    def signature(self) -> str:
        """A key naming the layer's shape; layers with equal signatures cost the same."""
        if self.kind == "custom":
            return (f"custom:f{self.custom_forward_flops:g}:p{self.custom_params}"
                    f":o{self.custom_output_elements}")
        parts = [self.kind, f"s{self.seq_length}", f"h{self.hidden_size}"]
        if self.kind == "transformer":
            parts += [f"a{self.num_attention_heads}", f"f{self.ffn_hidden_size}"]
        if self.kind == "mlp":
            parts += [f"f{self.ffn_hidden_size}"]
        if self.kind in ("embedding", "head"):
            parts += [f"v{self.vocab_size}"]
        if self.input_hidden_size and self.input_hidden_size != self.hidden_size:
            parts += [f"in{self.input_hidden_size}"]
        return ":".join(parts)

    @property
    def in_hidden(self) -> int:
        return self.input_hidden_size or self.hidden_size


def _projection_params(layer: Layer) -> int:
    """An input projection h_in -> h (weight + bias) when the width changes; replicated."""
    if layer.input_hidden_size and layer.input_hidden_size != layer.hidden_size:
        return layer.input_hidden_size * layer.hidden_size + layer.hidden_size
    return 0


def param_count(layer: Layer, tmp: int = 1) -> int:
    """Parameters held by one tensor-parallel rank.

    transformer: LN 2h + QKV (3h*h + 3h)/t + proj h*h/t + h + LN 2h + fc1 (h*f + f)/t + fc2 f*h/t + h
    (row-parallel biases and LayerNorms are replicated, as in Megatron).
    """
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    k = layer.kind
    if k == "embedding":
        return v * h // tmp + s * h
    if k == "transformer":
        return (2 * h + (3 * h * h + 3 * h) // tmp + h * h // tmp + h
                + 2 * h + (h * f + f) // tmp + f * h // tmp + h + _projection_params(layer))
    if k == "mlp":
        return 2 * h + (h * f + f) // tmp + f * h // tmp + h + _projection_params(layer)
    if k == "head":
        return 2 * h + (h * v + v) // tmp
    if k == "custom":
        return layer.custom_params
    raise ValueError(f"unknown layer kind {k!r}")


def forward_flops(layer: Layer, tmp: int = 1) -> float:
    """Matrix-multiply FLOPs of one forward pass per sample on one tensor rank: the GEMMs plus
    the attention core (transformer, Narayanan et al. 2021, eq. 2 per layer:
    2s(4h^2 + 2hf)/t + 4 s^2 h/t)."""
    if layer.kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {layer.kind!r}")
    return sum(gemm_flops(layer, tmp)) + attention_core_flops(layer, tmp)


def gemm_flops(layer: Layer, tmp: int = 1) -> tuple[float, ...]:
    """FLOPs of each dense GEMM call of one forward pass per sample on one tensor rank (the
    attention core, QK^T and attention x V, is `attention_core_flops`). What sets a GEMM's
    efficiency is its size (`cost_models.compute.gemm_efficiency`).

    transformer: QKV 2s h 3h/t, projection 2s (h/t) h, fc1 2s h f/t, fc2 2s (f/t) h;
    mlp: fc1 and fc2; head: 2s h V/t (V padded); an input projection 2s h_in h; custom: its
    FLOPs."""
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    proj = (2.0 * s * layer.input_hidden_size * h,) if _projection_params(layer) else ()
    k = layer.kind
    if k == "transformer":
        return proj + (2.0 * s * h * 3 * h / tmp, 2.0 * s * h * h / tmp,
                       2.0 * s * h * f / tmp, 2.0 * s * f * h / tmp)
    if k == "mlp":
        return proj + (2.0 * s * h * f / tmp, 2.0 * s * f * h / tmp)
    if k == "head":
        return (2.0 * s * h * v / tmp,)
    if k == "custom":
        return (float(layer.custom_forward_flops),) if layer.custom_forward_flops else ()
    return ()


def attention_core_flops(layer: Layer, tmp: int = 1) -> float:
    """QK^T and attention x V of one forward pass per sample: 4 s^2 h / t (Narayanan et al.
    2021); transformer layers only."""
    if layer.kind != "transformer":
        return 0.0
    return 4.0 * layer.seq_length ** 2 * layer.hidden_size / tmp


def attention_score_elements(layer: Layer, tmp: int = 1) -> float:
    """Elements of the attention score matrix per sample on one tensor rank: a s^2 / t."""
    if layer.kind != "transformer":
        return 0.0
    return layer.num_attention_heads * layer.seq_length ** 2 / tmp


def elementwise_bytes(layer: Layer, tmp: int, bytes_per_element: int) -> float:
    """Bytes read+written per sample by the memory-bound ops of one forward pass.

    Counted as (reads + writes) of each elementwise op's tensors:
    transformer: 2 LayerNorms and 2 residual adds on s*h (~4 tensors each), bias+GELU on s*f/t
    (the attention scores are `attention_score_elements`, costed by the attention kernel);
    head: LayerNorm on s*h, and the cross-entropy over s*V/t logits at a third of
    CROSS_ENTROPY_BYTES_PER_LOGIT (the backward pass, 2x the forward, takes the rest);
    embedding: the gathered rows s*h plus the positions.
    """
    h, f, s = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length
    v = padded_vocab_size(layer.vocab_size, tmp)
    k = layer.kind
    if k == "embedding":
        n = 3.0 * s * h
    elif k == "transformer":
        n = 16.0 * s * h + 4.0 * s * f / tmp
    elif k == "mlp":
        n = 8.0 * s * h + 4.0 * s * f / tmp
    elif k == "head":
        return 4.0 * s * h * bytes_per_element + CROSS_ENTROPY_BYTES_PER_LOGIT / 3 * s * v / tmp
    else:
        n = 2.0 * output_elements(layer)
    return n * bytes_per_element


def elementwise_bytes_by_pass(layer: Layer, tmp: int, bytes_per_element: int,
                              framework: str = "deepspeed") -> tuple[float, float]:
    """(forward, backward) bytes per sample moved by the memory-bound ops of one pass, as the
    framework runs them.

    deepspeed (the trial layers, amp_search.trial.model): `elementwise_bytes` forward, twice
    that backward.

    megatron (Megatron-LM's GPT block with its default fusions, --bias-gelu-fusion and
    --bias-dropout-fusion; g bytes per element, masks 1 byte), counted per token:
    forward: 2 LayerNorms (read x, write y: 2g h each), the attention context's permute to
    [s, b, h] (.contiguous(): 2g h), 2 fused bias-dropout-adds (read the GEMM output and the
    residual, write the sum and the 1-byte mask: (3g + 1) h each), the fused bias-GeLU on
    the f/t shard (2g f/t): (12g + 2) h + 2g f/t;
    backward: 2 LayerNorm backwards (read x and dy, write dx: 3g h each), 2 bias-dropout-add
    backwards (read dy and the mask, write dx, read dy again for the bias gradient:
    (3g + 1) h each), the 2 residual gradient sums (3g h each), the permute's (2g h), the
    bias-GeLU backward and its bias gradient (4g f/t): (20g + 2) h + 4g f/t, 1.6-1.8x the
    forward rather than 2x. The mlp layer has one LayerNorm, one bias-dropout-add, one
    residual sum and the GeLU; the other layers are counted as for deepspeed."""
    if framework not in TP_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(TP_FRAMEWORKS)}")
    if framework == "megatron" and layer.kind in ("transformer", "mlp"):
        g = float(bytes_per_element)
        sh = float(layer.seq_length * layer.hidden_size)
        sf = float(layer.seq_length * layer.ffn_hidden_size) / tmp
        if layer.kind == "transformer":
            return (12 * g + 2) * sh + 2 * g * sf, (20 * g + 2) * sh + 4 * g * sf
        return (5 * g + 1) * sh + 2 * g * sf, (9 * g + 1) * sh + 4 * g * sf
    forward = elementwise_bytes(layer, tmp, bytes_per_element)
    return forward, 2.0 * forward


CROSS_ENTROPY_BYTES_PER_LOGIT = 60.0
"""Memory traffic per logit of Megatron's vocab-parallel cross-entropy, forward and backward,
with fp16/bf16 logits: the fp32 copy (read 2, write 4), max, subtract, exp and sum (read 4 x 4,
write 4 x 2), the softmax kept for backward, and the gradient (read 4 x 2, write 4, cast to the
training precision 4 + 2) ~ 60 B. Counted, not fitted; it matches the head's share of the
vTrain A100 measurements at tp >= 2 (benchmarks/gpu_accuracy.py)."""


def output_elements(layer: Layer) -> int:
    """Elements of the activation this layer hands to the next one, per sample."""
    if layer.kind == "custom":
        return layer.custom_output_elements
    if layer.kind == "head":
        return 1  # the loss
    return layer.seq_length * layer.hidden_size


def tp_allreduce_elements_by_pass(layer: Layer, recompute: bool = False
                                  ) -> tuple[tuple[float, ...], ...]:
    """Sizes (elements per sample) of the all-reduces inside the layer under tensor
    parallelism (Megatron's f/g operators, Shoeybi et al. 2019), per pass: (forward,
    backward, recomputed forward).

    transformer: 2 in forward (after attention and MLP row-parallel GEMMs) + 2 in backward
    (input gradients of the column-parallel GEMMs), each s*h;
    mlp: 1 + 1 of s*h; embedding (vocab-parallel): 1 of s*h in forward;
    head: 3 of s in forward (vocab-parallel cross-entropy: max, sum of exp, target logit) and
    1 of s*h in backward (column-parallel input gradient);
    custom: none (replicated).
    With full recomputation a block's forward runs again inside its backward, all-reduces
    included (transformer 2 more, mlp 1 more).
    """
    s, h = layer.seq_length, layer.hidden_size
    k = layer.kind
    if k == "transformer":
        return (s * h, s * h), (s * h, s * h), ((s * h, s * h) if recompute else ())
    if k == "mlp":
        return (s * h,), (s * h,), ((s * h,) if recompute else ())
    if k == "embedding":
        return (s * h,), (), ()
    if k == "head":
        return (s, s, s), (s * h,), ()
    return (), (), ()


TP_FRAMEWORKS = ("deepspeed", "megatron")
"""Whose sequence-parallel layers `tp_collectives_by_pass` describes: the trial layers
(amp_search.trial.model, run by DeepSpeed) or Megatron-LM's own."""


@dataclass(frozen=True)
class TpCollective:
    """One tensor-parallel collective of one micro-batch sample: its kind
    (cost_models.comm.COLLECTIVES) and its size in elements per sample (all-reduce: the
    buffer; all-gather: the gathered output; reduce-scatter: the unscattered input), the sizes
    `cost_models.comm.collective_time_s` takes."""

    kind: str
    elements: float


def tp_collectives_by_pass(layer: Layer, recompute: bool = False,
                           sequence_parallel: bool = False, framework: str = "deepspeed"
                           ) -> tuple[tuple[TpCollective, ...], ...]:
    """The collectives inside the layer under tensor parallelism, per pass (forward, backward,
    recomputed forward), with or without sequence parallelism.

    Without it: the all-reduces of `tp_allreduce_elements_by_pass`.

    With it (Korthikanti et al. 2022, section 4.2.2, Figure 5: g is an all-gather in forward
    and a reduce-scatter in backward, g-bar the reverse), per transformer block:
    forward 2 all-gathers (the inputs of QKV and fc1, the column-parallel GEMMs) and 2
    reduce-scatters (the outputs of proj and fc2, the row-parallel GEMMs), all of s*h;
    backward the conjugates (2 reduce-scatters of the column GEMMs' input gradients, 2
    all-gathers of the row GEMMs' output gradients) plus one more all-gather of s*h per
    column-parallel GEMM: its input is saved as the s/t shard and gathered again for the
    weight gradient (Megatron's LinearWithGradAccumulationAndAsyncCommunication with
    sequence_parallel, and the trial layers' _SequenceColumnLinear). So the bus volume of
    backward is 1.5x that of tensor parallelism and there are twice as many calls (or more)
    as all-reduces, each with its own per-call cost.
    mlp: one column + one row GEMM (half of the above); head: its column-parallel LM
    projection (all-gather in forward; re-gather + reduce-scatter in backward) beside the
    cross-entropy's 3 all-reduces of s; embedding: Megatron reduce-scatters its output in
    forward and all-gathers the gradient in backward, the trial layers keep the vocab-parallel
    all-reduce and split the result (all-gather of the gradient in backward).
    The trial layers (`framework` "deepspeed") also all-reduce, in every micro-batch's
    backward, the gradients of the weights used on a sequence shard (their
    copy_to_tensor_model_parallel_region): per block 2 LayerNorms (weight and bias) and the
    row-parallel biases of proj and fc2, 6 all-reduces of h; mlp 3; head 2 (its LayerNorm);
    an input projection 2 more (h_in*h and h). Megatron-LM all-reduces those once per
    iteration (finalize_model_grads), which is not counted here.
    With full recomputation the block's forward (and its collectives) runs again in backward.
    """
    if framework not in TP_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(TP_FRAMEWORKS)}")
    if not sequence_parallel:
        return tuple(tuple(TpCollective("all_reduce", x) for x in part)
                     for part in tp_allreduce_elements_by_pass(layer, recompute))
    s, h = layer.seq_length, layer.hidden_size
    k = layer.kind
    ag, rs, ar = ("all_gather", "reduce_scatter", "all_reduce")
    trial = framework == "deepspeed"
    proj = ((TpCollective(ar, layer.input_hidden_size * h), TpCollective(ar, h))
            if trial and layer.input_hidden_size and layer.input_hidden_size != h else ())
    if k in ("transformer", "mlp"):
        gemm_pairs = 2 if k == "transformer" else 1
        forward = (TpCollective(ag, s * h), TpCollective(rs, s * h)) * gemm_pairs
        backward = (TpCollective(ag, s * h), TpCollective(ag, s * h),
                    TpCollective(rs, s * h)) * gemm_pairs
        if trial:
            backward += (TpCollective(ar, h),) * (3 * gemm_pairs) + proj
        return forward, backward, (forward if recompute else ())
    if k == "embedding":
        return ((TpCollective(ar if trial else rs, s * h),), (TpCollective(ag, s * h),), ())
    if k == "head":
        backward = (TpCollective(ag, s * h), TpCollective(rs, s * h))
        if trial:
            backward += (TpCollective(ar, h),) * 2
        return ((TpCollective(ag, s * h),) + (TpCollective(ar, s),) * 3, backward, ())
    return (), (), ()


def tp_allreduce_elements(layer: Layer, recompute: bool = False) -> tuple[float, ...]:
    """Sizes (elements per sample) of the all-reduces inside the layer for one forward and one
    backward pass (and the recomputed forward), all passes of
    `tp_allreduce_elements_by_pass` together."""
    return tuple(x for part in tp_allreduce_elements_by_pass(layer, recompute) for x in part)


def leading_layers(layers, kind: str) -> int:
    """How many layers of `kind` open the chain (the embedding's layers at the front; on the
    reversed chain, the head's at the back): the pipeline split keeps them with the first or
    last stage."""
    n = 0
    for layer in layers:
        if layer.kind != kind:
            break
        n += 1
    return n
