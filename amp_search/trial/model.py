"""The layers the trials train: one torch module per `cost_models.layers.Layer`.

This is the code behind every definition in the docstring of `cost_models/layers.py`; the
per-rank parameter count of each built module equals `cost_models.layers.param_count(layer, t)`
(tests/test_trial_model.py checks it for t = 1 and 2).

API (what the memory and profiling code use)
--------------------------------------------

    build_layer(layer, *, tp_size=1, tp_group=None, precision="fp32",
                simulate_tp_size=0, causal=True, sequence_parallel=False,
                selective_recompute=False, expert_group=None,
                simulate_ep=1) -> torch.nn.Module

        One module per Layer. `tp_size` is the tensor-parallel degree; the megatron-core
        layers take their group from `tp_group`, else from megatron's `parallel_state` (which
        must then be initialized: see `init_single_process_parallel`). `precision` sets the
        parameter dtype (fp32 | bf16 | fp16). `causal` masks attention (GPT; BERT uses False).

        simulate_tp_size=k (with tp_size=1) builds the *sharded* layer of tensor rank 0 of a
        tmp=k run in ONE process with no communication: plain torch parameters with the
        per-rank shapes (QKV 3h/k, fc1 f/k, vocab V/k, ...), same FLOPs and parameter count as
        one rank of the real layer, no collectives (the profiler costs those separately).
        It needs no torch.distributed at all.

        sequence_parallel=True (tp_size > 1, real layers): Korthikanti et al. 2022's sequence
        parallelism. Activations between layers are then sequence-first shards [s/t, b, h]
        (Megatron's layout): the embedding scatters its output over the tensor ranks, the
        LayerNorms, residual adds and replicated biases run on the rank's s/t tokens, each
        column-parallel linear all-gathers its input (saving only the shard, gathered again
        in backward) and reduce-scatters its input gradient, each row-parallel linear
        reduce-scatters its output; the gradients of the weights used on a shard (LayerNorms,
        row-parallel biases, an input projection) are all-reduced over the tensor group in
        backward; the head gathers and returns batch-first logits. megatron-core 0.16's own
        sequence-parallel path cannot run on CPU (its all-gather / reduce-scatter buffers are
        allocated with torch.cuda.current_device(): tensor_parallel/layers.py
        LinearWithGradAccumulationAndAsyncCommunication, mappings._gather_along_first_dim /
        _reduce_scatter_along_first_dim), so the same communication is written here with
        torch.distributed on megatron-core's parameters (same shapes, same initialization).

        selective_recompute=True: the attention core (scaled_dot_product_attention) runs
        under torch.utils.checkpoint and is recomputed in backward (Korthikanti et al. 2022,
        section 4.3); its inputs q, k, v and output are kept, what it saves is not.

        expert_group (a transformer block with experts, `Layer.is_moe`): the expert-parallel
        group that splits its routed experts (`_MoE`; None: every expert on this rank);
        simulate_ep=k with simulate_tp_size: one expert-parallel rank's E/k experts, fed the
        token slots of a balanced route, in one process.

    Activations are batch-first: every layer but the embedding takes x [mbs, s, h_in] and
    returns [mbs, s, h]. The embedding takes token ids [mbs, s] (int64). The head returns the
    vocab-parallel logits [mbs, s, V/tp] (this rank's slice, not gathered); the loss is
    `head.loss(logits, labels)` (labels [mbs, s] int64), or the module function
    `lm_loss(logits, labels)` which DeepSpeed's PipelineModule uses as its `loss_fn`.

    example_inputs(layer, mbs, *, dtype=torch.float32, device="cpu", seed=0) -> tuple
        The input(s) one forward of the layer takes: (x,), (ids,) or, for the head,
        (x, labels) with the labels for `head.loss`.

    forward_backward(module, layer, inputs) -> torch.Tensor
        One forward and backward pass (for the head: through its loss); returns the scalar
        that was back-propagated. For profiling, wrap it in your timer.

    init_single_process_parallel() -> None
        A gloo world of size 1 plus megatron `initialize_model_parallel(1, 1)`, so that a
        layer built with tp_size=1 (the real megatron-core modules) runs in one process.
        Idempotent.

Layer definitions (Megatron-LM's GPT; batch-first [b, s, h] unless sequence parallel; with
`Layer.hidden_dropout` > 0 a dropout on the embedding's output and on the attention's and
the MLP's outputs before their residual adds, as Megatron-LM's --hidden-dropout):
- embedding: megatron-core VocabParallelEmbedding (V x h, split on V) + learned positions
  (s x h, replicated), summed;
- transformer: x + proj(attn(LN1(x))), then + fc2(gelu(fc1(LN2(.)))); QKV is one
  ColumnParallelLinear h -> 3h whose output is laid out [heads, 3, head_dim] so each tensor
  rank owns whole heads; proj and fc2 are RowParallelLinear (bias replicated);
- mlp: x + fc2(gelu(fc1(LN(x)))), column then row parallel;
- head: final LayerNorm + untied ColumnParallelLinear h -> V (gather_output=False) and
  megatron-core vocab_parallel_cross_entropy, averaged over tokens;
- a transformer or mlp layer with `input_hidden_size` set starts with a replicated
  torch.nn.Linear(h_in -> h);
- custom: rejected (`UnsupportedLayer`): it is defined only by its FLOPs, parameters and
  output size, so there is no real computation to run.

The Llama family (the Layer fields beside the GPT defaults), as megatron-core runs them:
- num_query_groups g (grouped-query attention) and head_dim d: QKV is one
  ColumnParallelLinear h -> (a + 2g) d laid out [g, a/g + 2, d] (each group's query heads,
  its key, its value: megatron-core's layout), so each tensor rank holds g/t whole groups
  and their a/t query heads (g must be divisible by t); k and v are repeated to the query
  heads for the attention; proj is RowParallelLinear a d -> h;
- mlp 'swiglu': fc1 one ColumnParallelLinear h -> 2f (stride 2: each rank holds its f/t of
  gate, then its f/t of up, so tmp=1 and tmp=2 hold the same weights), silu(gate) * up, fc2
  RowParallelLinear f -> h; mlp 'quick_geglu' (GPT-OSS) the same linears with its clamped
  quick-GELU GLU (`_activation`);
- norm 'rmsnorm': torch.nn.RMSNorm (weight only) wherever LayerNorm stands (eps 1e-5);
- bias False: no bias on any linear (QKV, proj, fc1, fc2, the head's projection, an input
  projection);
- position_embedding 'rope': the embedding holds no positions; each block applies rotary
  embeddings (rotate-half form, base ROPE_THETA = 10000) to q and k; rope_scaling 'yarn'
  (GPT-OSS) runs the same eager rotation, with these frequencies and no attention scale (the
  frequencies change no time: the eager rotation is what megatron-core runs for YaRN);
- qk_norm: the layer's norm over one head's d on each query and key head, before RoPE
  (megatron-core's q_layernorm and k_layernorm);
- the attention core gets q, k and v as contiguous tensors, as Transformer Engine's attention
  copies them where their layout is not one it takes (get_qkv_layout), so the QKV output is
  freed and the core saves q, k, v and its output, with grouped-query attention served by
  the kernel itself (enable_gqa) rather than by k and v repeated to every query head;
- tie_embeddings: rejected (`UnsupportedLayer`): trials run untied embeddings (see
  `check_layer`).

Mixture of experts (num_experts E > 0, `Layer.is_moe`): the block's MLP is `_MoE`, Megatron-LM's
dropless MoE layer with the all-to-all dispatcher and expert tensor parallelism 1: a
replicated router E x h (no bias), top-k routing with renormalized softmax weights, E/ep whole
experts (fc1 h -> f_e or 2 f_e, fc2 f_e -> h) on each rank of the expert-parallel group, the
tokens moved there and back by all-to-alls (`ALL_TO_ALL_SENT` counts the bytes), and the
shared experts (a tensor-parallel MLP of width f_s) beside them. The experts' parameters carry
`allreduce = False` and `group_name = EXPERT_GROUP_NAME` (DeepSpeed's marks for expert
parameters).

Initialization draws each weight in full (megatron's CPU initialization: the master weight,
then this rank's slice), so with the same seed a tmp=1 and a tmp=2 model hold the same weights.
"""
from __future__ import annotations

import os
import tempfile

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from cost_models.layers import (GATED_MLP_KINDS, MLP_KINDS, QUICK_GEGLU_CLAMP,
                                 QUICK_GEGLU_OFFSET, Layer, padded_vocab_size)

__all__ = ["UnsupportedLayer", "build_layer", "check_layer", "lm_loss", "example_inputs", "forward_backward",
           "init_single_process_parallel", "parameter_count", "TRIAL_PRECISIONS", "CHECKPOINTABLE_LAYERS",
           "EmbeddingLayer", "TransformerLayer", "MLPLayer", "HeadLayer"]

TRIAL_PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
INIT_STD = 0.02
"""Standard deviation of the normal weight initialization (GPT-2 / Megatron default)."""
CHECKPOINTABLE_LAYERS = ["TransformerLayer", "MLPLayer"]
"""Class names DeepSpeed's activation checkpointing may recompute (checkpointable_layers)."""


class UnsupportedLayer(ValueError):
    """The layer cannot be built for a real trial (custom layers; tied embeddings)."""


# ----------------------------------------------------------------------------- linears

def _init_normal(weight: torch.Tensor) -> None:
    nn.init.normal_(weight, mean=0.0, std=INIT_STD)


class _LocalColumn(nn.Module):
    """One tensor rank's shard of a column-parallel linear, no communication
    (simulate_tp_size). Returns (output, None) like megatron-core's ColumnParallelLinear."""

    def __init__(self, in_features: int, out_features: int, tp: int, dtype: torch.dtype,
                 bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features // tp, in_features, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features // tp, dtype=dtype)) if bias else None
        _init_normal(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


class _LocalRow(nn.Module):
    """One tensor rank's shard of a row-parallel linear (input split, bias replicated),
    without the all-reduce (simulate_tp_size)."""

    def __init__(self, in_features: int, out_features: int, tp: int, dtype: torch.dtype,
                 bias: bool = True):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features // tp, dtype=dtype))
        self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype)) if bias else None
        _init_normal(self.weight)

    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


# ----------------------------------------------------------------------------- sequence parallel
# Megatron's sequence-parallel communication along dim 0 ([s, b, h] activations), written with
# torch.distributed so that it runs on gloo (see build_layer's docstring for why).

def _seq_all_gather(x: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    t = dist.get_world_size(group)
    out = torch.empty((x.shape[0] * t,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.all_gather_into_tensor(out, x.contiguous(), group=group)
    return out


def _seq_reduce_scatter(x: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    t = dist.get_world_size(group)
    if x.shape[0] % t:
        raise ValueError(f"sequence parallelism: sequence length {x.shape[0]} is not "
                         f"divisible by the tensor-parallel degree {t}")
    out = torch.empty((x.shape[0] // t,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    dist.reduce_scatter_tensor(out, x.contiguous(), group=group)
    return out


def _seq_split(x: torch.Tensor, group) -> torch.Tensor:
    import torch.distributed as dist

    t, r = dist.get_world_size(group), dist.get_rank(group)
    if x.shape[0] % t:
        raise ValueError(f"sequence parallelism: sequence length {x.shape[0]} is not "
                         f"divisible by the tensor-parallel degree {t}")
    n = x.shape[0] // t
    return x[r * n:(r + 1) * n].contiguous()


class _ScatterToSequence(torch.autograd.Function):
    """Keep this rank's s/t slice; backward all-gathers the gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_split(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_all_gather(grad, ctx.group), None


class _ReduceScatterToSequence(torch.autograd.Function):
    """Row-parallel output: reduce-scatter over the sequence; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _seq_reduce_scatter(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _seq_all_gather(grad, ctx.group), None


class _SequenceColumnLinear(torch.autograd.Function):
    """Column-parallel linear on a sequence shard: all-gather the input, y = x W^T + b;
    saves the *shard* and gathers it again in backward; the input gradient is
    reduce-scattered (megatron-core's LinearWithGradAccumulationAndAsyncCommunication with
    sequence_parallel=True)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group):
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.has_bias = group, bias is not None
        y = torch.matmul(_seq_all_gather(x, group), weight.t())
        return y + bias if bias is not None else y

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        full = _seq_all_gather(x, ctx.group)
        grad_input = _seq_reduce_scatter(grad.matmul(weight), ctx.group)
        g2 = grad.reshape(-1, grad.shape[-1])
        grad_weight = g2.t().matmul(full.reshape(-1, full.shape[-1]))
        return grad_input, grad_weight, (g2.sum(dim=0) if ctx.has_bias else None), None


def _replicated(p: torch.Tensor, group) -> torch.Tensor:
    """A weight used on a sequence shard: its gradient is all-reduced over the tensor group
    in backward (megatron's copy_to_tensor_model_parallel_region)."""
    from megatron.core.tensor_parallel.mappings import copy_to_tensor_model_parallel_region

    return copy_to_tensor_model_parallel_region(p, group=group)


def _layer_norm(ln: nn.Module, x, group):
    """LayerNorm or RMSNorm of a sequence shard (group) or of the whole sequence (group
    None)."""
    if group is None:
        return ln(x)
    if isinstance(ln, nn.RMSNorm):
        return _RMSNorm.apply(x, _replicated(ln.weight, group), ln.eps)
    return F.layer_norm(x, ln.normalized_shape, _replicated(ln.weight, group),
                        _replicated(ln.bias, group), ln.eps)


def _linear_on_shard(lin: nn.Linear, x, group):
    """A replicated nn.Linear (input projection) applied to a sequence shard (group) or not."""
    if group is None:
        return lin(x)
    bias = None if lin.bias is None else _replicated(lin.bias, group)
    return F.linear(x, _replicated(lin.weight, group), bias)


NORM_EPS = 1e-5
"""Epsilon of LayerNorm and RMSNorm (Megatron-LM's --norm-epsilon default)."""


def _norm(layer: Layer, dtype: torch.dtype, width: int = 0) -> nn.Module:
    """The layer's normalization over hidden_size (or `width`): LayerNorm (weight and bias)
    or RMSNorm (weight only), replicated on every tensor rank."""
    width = width or layer.hidden_size
    if layer.norm == "rmsnorm":
        return _FusedRMSNorm(width, eps=NORM_EPS, dtype=dtype)
    return nn.LayerNorm(width, eps=NORM_EPS, dtype=dtype)


class _RMSNorm(torch.autograd.Function):
    """x * rsqrt(mean(x^2) + eps) * weight saving only x and the per-token rstd, as the fused
    RMSNorm kernels Megatron-LM runs (Transformer Engine's, Apex's) do; eager torch RMSNorm
    would keep the normalized x too. The backward recomputes it."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        with torch.no_grad():
            rstd = torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
            out = x * rstd * weight
        ctx.eps = eps
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, _, weight = ctx.saved_tensors
        with torch.enable_grad():
            x_, w_ = x.detach().requires_grad_(), weight.detach().requires_grad_()
            out = x_ * torch.rsqrt(x_.pow(2).mean(dim=-1, keepdim=True) + ctx.eps) * w_
        grad_x, grad_w = torch.autograd.grad(out, (x_, w_), grad)
        return grad_x, grad_w, None


class _FusedRMSNorm(nn.RMSNorm):
    """torch.nn.RMSNorm (the same weight and state) run through `_RMSNorm`."""

    def forward(self, x):
        return _RMSNorm.apply(x, self.weight, self.eps)


def _make_sequence_column(base):
    class SequenceParallelColumn(base):
        """megatron-core's ColumnParallelLinear (its parameters) on a sequence shard."""

        def forward(self, x):
            return _SequenceColumnLinear.apply(x, self.weight, self.bias, self.tp_group), None

    return SequenceParallelColumn


def _make_sequence_row(base):
    class SequenceParallelRow(base):
        """megatron-core's RowParallelLinear (its parameters), output reduce-scattered over
        the sequence; `batch_first`: the input is [b, s, f/t] (an attention output kept in
        the layout the kernel wrote, not copied) and the output is turned to [s, b, h] before
        the reduce-scatter."""

        def forward(self, x, batch_first: bool = False):
            y = F.linear(x, self.weight)
            if batch_first:
                y = y.transpose(0, 1)
            y = _ReduceScatterToSequence.apply(y, self.tp_group)
            if self.bias is None:
                return y, None
            return y + _replicated(self.bias, self.tp_group), None

    return SequenceParallelRow


class _Linears:
    """Builds the column / row parallel linears of one layer: megatron-core's (real tensor
    parallelism) or local shards (simulate)."""

    def __init__(self, *, tp_size: int, tp_group, dtype: torch.dtype, simulate: int,
                 sequence_parallel: bool = False):
        self.tp, self.group, self.dtype, self.simulate = tp_size, tp_group, dtype, simulate
        self.sequence_parallel = bool(sequence_parallel and tp_size > 1 and not simulate)
        self.config = None
        if not simulate:
            from megatron.core import ModelParallelConfig

            self.config = ModelParallelConfig(tensor_model_parallel_size=tp_size,
                                              use_cpu_initialization=True, params_dtype=dtype,
                                              perform_initialization=True)

    @property
    def shards(self) -> int:
        """How many ways the split dimensions are divided."""
        return self.simulate or self.tp

    @property
    def seq_group(self):
        """The tensor group when activations are sequence shards, else None."""
        return self.group if self.sequence_parallel else None

    def column(self, n_in: int, n_out: int, *, bias: bool = True, stride: int = 1) -> nn.Module:
        """`stride` k: the output is k blocks (e.g. SwiGLU's gate and up) each split over
        the ranks, so rank r holds block-shard r of each, in order (megatron's stride)."""
        if self.simulate:
            return _LocalColumn(n_in, n_out, self.simulate, self.dtype, bias)
        from megatron.core.tensor_parallel import ColumnParallelLinear

        cls = _make_sequence_column(ColumnParallelLinear) if self.sequence_parallel \
            else ColumnParallelLinear
        return cls(n_in, n_out, config=self.config, init_method=_init_normal,
                   bias=bias, gather_output=False, stride=stride, tp_group=self.group)

    def row(self, n_in: int, n_out: int, *, bias: bool = True) -> nn.Module:
        if self.simulate:
            return _LocalRow(n_in, n_out, self.simulate, self.dtype, bias)
        from megatron.core.tensor_parallel import RowParallelLinear

        cls = _make_sequence_row(RowParallelLinear) if self.sequence_parallel \
            else RowParallelLinear
        return cls(n_in, n_out, config=self.config, init_method=_init_normal,
                   bias=bias, input_is_parallel=True, skip_bias_add=False, tp_group=self.group)


def _input_projection(layer: Layer, dtype: torch.dtype) -> nn.Module | None:
    if layer.input_hidden_size and layer.input_hidden_size != layer.hidden_size:
        proj = nn.Linear(layer.input_hidden_size, layer.hidden_size, bias=layer.bias,
                         dtype=dtype)
        _init_normal(proj.weight)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)
        return proj
    return None


# ----------------------------------------------------------------------------- layers

def _dropout(x, p: float, training: bool):
    """Hidden dropout (Layer.hidden_dropout): torch's native dropout, which keeps a 1-byte
    (bool) mask per element for the backward, as on a GPU (F.dropout on a CPU tensor keeps
    a mask in the tensor's own dtype instead); nothing at 0 or in evaluation."""
    if p <= 0.0 or not training:
        return x
    return torch.native_dropout(x, p, True)[0]


class EmbeddingLayer(nn.Module):
    """ids [b, s] -> [b, s, h]: vocab-parallel token embedding + replicated learned
    positions (none with rotary embeddings, which the blocks apply)."""

    def __init__(self, layer: Layer, lin: _Linears):
        super().__init__()
        h, s = layer.hidden_size, layer.seq_length
        v = padded_vocab_size(layer.vocab_size, lin.shards)     # as Megatron-LM pads it
        self.simulate = lin.simulate
        if lin.simulate:
            self.word = nn.Embedding(v // lin.simulate, h, dtype=lin.dtype)
            _init_normal(self.word.weight)
        else:
            from megatron.core.tensor_parallel import VocabParallelEmbedding

            self.word = VocabParallelEmbedding(v, h, init_method=_init_normal,
                                               config=lin.config, tp_group=lin.group)
        if layer.position_embedding == "rope":
            self.position = None
        else:
            self.position = nn.Parameter(torch.empty(s, h, dtype=lin.dtype))
            _init_normal(self.position)
        self.seq_group = lin.seq_group
        self.dropout = layer.hidden_dropout

    def forward(self, ids):
        if self.simulate:  # this rank's rows only; the lookup cost is the same
            ids = ids % self.word.num_embeddings
        x = self.word(ids)
        if self.position is not None:
            x = x + self.position[: ids.shape[1]]
        if self.seq_group is not None:      # sequence parallel: this rank's [s/t, b, h]
            x = _ScatterToSequence.apply(x.transpose(0, 1), self.seq_group)
        return _dropout(x, self.dropout, self.training)


class _MLP(nn.Module):
    """fc2(gelu(fc1(x))), or SwiGLU fc2(silu(gate) * up) with gate and up fused in fc1
    (h -> 2f, each rank holding its f/t of gate then its f/t of up): column then row
    parallel."""

    def __init__(self, layer: Layer, lin: _Linears):
        super().__init__()
        h, f = layer.hidden_size, layer.ffn_hidden_size
        self.mlp = layer.mlp
        if layer.gated_mlp:
            self.fc1 = lin.column(h, 2 * f, bias=layer.bias, stride=2)
        else:
            self.fc1 = lin.column(h, f, bias=layer.bias)
        self.fc2 = lin.row(f, h, bias=layer.bias)   # sequence parallel: fc1's output is
        #                                             [s, b, f/t] already

    def forward(self, x):
        y, _ = self.fc1(x)
        # a gated MLP as Megatron-LM's fused bias_swiglu runs it (saving its input only)
        y = _WeightedActivation.apply(y, None, self.mlp) if self.mlp in GATED_MLP_KINDS \
            else F.gelu(y)
        y, _ = self.fc2(y)
        return y


# ----------------------------------------------------------------------------- experts

EXPERT_GROUP_NAME = "amp_search_experts"
"""`group_name` of the routed experts' parameters, which carry `allreduce = False`: DeepSpeed's
engine leaves their gradients out of its data-parallel all-reduce (deepspeed.moe.utils
.is_moe_param) and the trial reduces them over the expert-data-parallel group itself
(amp_search.trial.run)."""

ALL_TO_ALL_SENT = {"bytes": 0, "to_others_bytes": 0, "calls": 0}
"""What this process's expert all-to-alls sent (dispatch and combine, forward and backward):
every message's bytes, those to other ranks, and the all-to-alls (token counts excluded)."""


class _AllToAll(torch.autograd.Function):
    """torch.distributed.all_to_all_single with uneven splits along dim 0; the backward sends
    each gradient back where its row came from (the splits swapped)."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group):
        ctx.splits, ctx.group = (list(out_splits), list(in_splits)), group
        return _all_to_all(x, out_splits, in_splits, group)

    @staticmethod
    def backward(ctx, grad):
        out_splits, in_splits = ctx.splits
        return _all_to_all(grad, in_splits, out_splits, ctx.group), None, None, None


def _all_to_all(x, out_splits, in_splits, group):
    import torch.distributed as dist

    x = x.contiguous()
    out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
    dist.all_to_all_single(out, x, list(out_splits), list(in_splits), group=group)
    row = x[0].numel() * x.element_size() if x.shape[0] else 0
    me = dist.get_rank(group)
    ALL_TO_ALL_SENT["bytes"] += sum(in_splits) * row
    ALL_TO_ALL_SENT["to_others_bytes"] += (sum(in_splits) - in_splits[me]) * row
    ALL_TO_ALL_SENT["calls"] += 1
    return out


class _Expert(nn.Module):
    """One routed expert, whole (expert tensor parallelism 1): fc2(act(fc1(x))) of width
    f_e, GELU or a gated activation (gate and up fused in fc1)."""

    def __init__(self, layer: Layer, dtype: torch.dtype):
        super().__init__()
        h = layer.hidden_size
        self.mlp = layer.mlp
        self.fc1 = nn.Linear(h, layer.expert_fc1_width, bias=layer.bias, dtype=dtype)
        self.fc2 = nn.Linear(layer.expert_ffn, h, bias=layer.bias, dtype=dtype)
        for lin in (self.fc1, self.fc2):
            _init_normal(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)

    def forward(self, x, weight):
        """fc2(act(fc1(x)) x weight): each row's router weight applied in the activation,
        as megatron-core's grouped experts do (the fc2 bias weighted too), so the layer's
        sum over a token's experts keeps none of their outputs. The quick-GEGLU clamps
        fc1's halves and concatenates them before its kernel, as megatron-core's unfused
        experts do (weighted_bias_quick_geglu_impl), keeping that copy too."""
        y = self.fc1(x)
        if self.mlp == "quick_geglu":
            y = torch.cat(_clamped_halves(y), dim=-1)
        a = _WeightedActivation.apply(y, weight, self.mlp)
        y = F.linear(a, self.fc2.weight)
        return y if self.fc2.bias is None else y + weight * self.fc2.bias


def _activation(y, mlp: str):
    """The MLP's activation on fc1's output `y` (cost_models.layers.MLP_KINDS): GELU; SwiGLU
    silu(gate) * up; GPT-OSS's quick-GEGLU, its halves clamped (the gate above at c, the
    linear half to [-c, c]), quick_gelu(gate) * (linear + 1) with quick_gelu(x) =
    x sigmoid(1.702 x), as megatron-core's weighted_bias_quick_geglu_impl computes it."""
    if mlp == "swiglu":
        gate, up = y.chunk(2, dim=-1)
        return F.silu(gate) * up
    if mlp == "quick_geglu":
        gate, up = _clamped_halves(y)
        return gate * torch.sigmoid(1.702 * gate) * (up + QUICK_GEGLU_OFFSET)
    return F.gelu(y)


def _clamped_halves(y):
    """The quick-GEGLU's clamp of fc1's output: the gate above at QUICK_GEGLU_CLAMP, the
    linear half to [-QUICK_GEGLU_CLAMP, QUICK_GEGLU_CLAMP] (a no-op on halves already
    clamped)."""
    gate, up = y.chunk(2, dim=-1)
    return gate.clamp(max=QUICK_GEGLU_CLAMP), up.clamp(min=-QUICK_GEGLU_CLAMP,
                                                         max=QUICK_GEGLU_CLAMP)


class _WeightedActivation(torch.autograd.Function):
    """act(y) x w (w: one router weight per row, [rows, 1], or None) saving only y and w, as
    megatron-core's fused activations (bias_swiglu_impl, weighted_bias_swiglu_impl,
    activation_func_with_probs under its fuser) do; the backward recomputes act(y)."""

    @staticmethod
    def forward(ctx, y, weight, mlp):
        ctx.mlp, ctx.weighted = mlp, weight is not None
        ctx.save_for_backward(y, weight)
        with torch.no_grad():
            out = _activation(y, mlp)
            return out * weight if weight is not None else out

    @staticmethod
    def backward(ctx, grad):
        y, weight = ctx.saved_tensors
        with torch.enable_grad():
            y_ = y.detach().requires_grad_()
            if not ctx.weighted:
                return torch.autograd.grad(_activation(y_, ctx.mlp), y_, grad)[0], None, None
            w_ = weight.detach().requires_grad_()
            out = _activation(y_, ctx.mlp) * w_
        grad_y, grad_w = torch.autograd.grad(out, (y_, w_), grad)
        return grad_y, grad_w, None


class _MoE(nn.Module):
    """A mixture-of-experts MLP as Megatron-LM's dropless MoE layer with the all-to-all token
    dispatcher runs it (--moe-token-dispatcher-type alltoall, --expert-tensor-parallel-size
    1): a replicated router (E x h, no bias) scores this rank's tokens, each goes to its top k
    experts with the softmax of its k scores, renormalized, as weights; the tokens are sorted
    by expert and sent to the expert-parallel rank that holds it (one all-to-all of the
    counts, one of the tokens with their weights: ep k tokens / E per expert on average),
    each of the rank's E/ep experts runs on what it got, applying each token's weight in its
    activation (as megatron-core's grouped experts do: `_WeightedActivation`), and the
    results return by the reverse all-to-all and are summed; plus the shared experts (a
    tensor-parallel MLP of width f_s) on
    every token. No token is dropped and no auxiliary loss is added (neither changes the
    time). Expert e lives on expert-parallel rank e // (E/ep).

    With sequence parallelism the tokens are this rank's [s/t, b, h] shard, so the tensor
    ranks route different tokens (Megatron-LM requires sequence parallelism with experts and
    tmp > 1). `simulate` (one process, no group): the rank's E/ep experts get all n k token
    slots (each token's choices taken modulo E/ep), the expert work of a balanced route."""

    def __init__(self, layer: Layer, lin: "_Linears", expert_group=None, simulate_ep: int = 1):
        super().__init__()
        import torch.distributed as dist

        h, E = layer.hidden_size, layer.num_experts
        self.k = layer.moe_router_topk
        self.group = expert_group
        self.seq_group = lin.seq_group
        ep = dist.get_world_size(expert_group) if expert_group is not None else simulate_ep
        if ep < 1 or E % ep:
            raise ValueError(f"layer {layer.name or layer.kind!r}: {E} experts do not split "
                             f"over {ep} expert-parallel ranks")
        me = dist.get_rank(expert_group) if expert_group is not None else 0
        self.num_experts, self.ep, self.local = E, ep, E // ep
        self.router = nn.Parameter(torch.empty(E, h, dtype=lin.dtype))
        _init_normal(self.router)
        experts = []
        for e in range(E):     # drawn in order, so any ep holds the same weights
            x = _Expert(layer, lin.dtype)
            if me * self.local <= e < (me + 1) * self.local:
                experts.append(x)
        self.experts = nn.ModuleList(experts)
        for p in self.experts.parameters():
            p.allreduce = False
            p.group_name = EXPERT_GROUP_NAME
        self.shared = None
        if layer.moe_shared_expert_size:
            from dataclasses import replace

            self.shared = _MLP(replace(layer, ffn_hidden_size=layer.moe_shared_expert_size,
                                       num_experts=0), lin)

    def forward(self, x):
        shape, h = x.shape, x.shape[-1]
        tokens = x.reshape(-1, h)
        router = self.router if self.seq_group is None else _replicated(self.router,
                                                                        self.seq_group)
        probs = torch.softmax(F.linear(tokens, router).float(), dim=-1)
        weights, chosen = probs.topk(self.k, dim=-1)                    # [n, k]
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(x.dtype)
        flat = chosen.reshape(-1)
        if self.group is None and self.ep > 1:          # simulate: the local experts only
            flat = flat % self.local
        order = torch.argsort(flat, stable=True)        # token slots by expert
        routed = tokens[order // self.k]
        slot_weights = weights.reshape(-1, 1)[order]    # each routed copy's router weight
        counts = torch.bincount(flat, minlength=self.num_experts if self.group is not None
                                else self.local)
        if self.group is not None and self.ep > 1:
            import torch.distributed as dist

            got = torch.empty_like(counts)
            dist.all_to_all_single(got, counts, group=self.group)
            sent_split = counts.view(self.ep, self.local).sum(dim=1).tolist()
            got = got.view(self.ep, self.local)         # [source rank, local expert]
            got_split = got.sum(dim=1).tolist()
            # each copy with its router weight as one more column (megatron-core's
            # dispatcher sends the permuted probabilities beside the tokens)
            received = _AllToAll.apply(torch.cat([routed, slot_weights], dim=-1), got_split,
                                       sent_split, self.group)
            # from (source, expert) order to expert order
            expert_of = torch.repeat_interleave(
                torch.arange(self.local).repeat(self.ep), got.reshape(-1))
            regroup = torch.argsort(expert_of, stable=True)
            per_expert = got.sum(dim=0).tolist()
            received = received[regroup]
            y = self._run_experts(received[:, :h], received[:, h:], per_expert)
            y = _AllToAll.apply(y[torch.argsort(regroup)], sent_split, got_split, self.group)
        else:                   # every expert here: counts has one entry per local expert
            y = self._run_experts(routed, slot_weights, counts.tolist())
        y = y[torch.argsort(order)].view(-1, self.k, h)                # back to token order
        out = y.sum(dim=1).view(shape)      # the weights were applied in the experts
        if self.shared is not None:
            out = out + self.shared(x)
        return out

    def _run_experts(self, rows, weights, per_expert):
        return torch.cat([expert(part, w) for expert, part, w in
                          zip(self.experts, rows.split(per_expert),
                              weights.split(per_expert))])


ROPE_THETA = 10000.0
"""Base of the rotary embeddings' frequencies (Megatron-LM's --rotary-base default); a
Layer field `rope_theta`, where there is one, overrides it."""


def _rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


class _Rotary:
    """Standard rotary position embeddings (Su et al. 2021; rotate-half form, as
    Megatron-LM's and Llama's Hugging Face code): q and k [b, heads, s, d] at positions
    0..s-1 -> q cos + rotate_half(q) sin. No parameters."""

    def __init__(self, head_dim: int, theta: float):
        self.inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32)
                                        / head_dim)
        self._cache: dict = {}

    def cos_sin(self, s: int, dtype, device):
        key = (s, dtype, str(device))
        if key not in self._cache:
            freqs = torch.outer(torch.arange(s, dtype=torch.float32), self.inv_freq)
            emb = torch.cat((freqs, freqs), dim=-1)
            self._cache[key] = (emb.cos().to(dtype=dtype, device=device),
                                emb.sin().to(dtype=dtype, device=device))
        return self._cache[key]

    def __call__(self, x):
        cos, sin = self.cos_sin(x.shape[-2], x.dtype, x.device)
        return x * cos + _rotate_half(x) * sin


class TransformerLayer(nn.Module):
    """Pre-norm block: [b, s, h_in] -> [b, s, h]. GPT (LayerNorm, multi-head attention,
    GELU MLP, biases, learned positions in the embedding) or the Llama family's (RMSNorm,
    grouped-query attention, rotary embeddings on q and k, SwiGLU, no biases), as the
    Layer's fields say."""

    def __init__(self, layer: Layer, lin: _Linears, causal: bool = True,
                 selective_recompute: bool = False, expert_group=None, simulate_ep: int = 1):
        super().__init__()
        h, a = layer.hidden_size, layer.num_attention_heads
        t = lin.shards
        if a <= 0 or a % t or (not layer.head_dim and h % a):
            raise ValueError(f"transformer layer {layer.name!r}: {a} heads must divide hidden "
                             f"size {h} and be divisible by the tensor-parallel degree "
                             f"{t}")
        g = layer.num_query_groups or a
        if a % g or g % t:
            raise ValueError(f"transformer layer {layer.name!r}: {g} query groups must divide "
                             f"the {a} heads and be divisible by the tensor-parallel degree "
                             f"{t}")
        d = layer.head_dim or h // a
        self.heads_local = a // t
        self.groups_local = g // t
        self.heads_per_group = a // g
        self.head_dim = d
        self.causal = causal
        self.rotary = None
        if layer.position_embedding == "rope":
            if d % 2:
                raise ValueError(f"transformer layer {layer.name!r}: rotary embeddings need "
                                 f"an even head dimension, got {d}")
            self.rotary = _Rotary(d, float(getattr(layer, "rope_theta", 0) or ROPE_THETA))
        self.proj_in = _input_projection(layer, lin.dtype)
        self.ln1 = _norm(layer, lin.dtype)
        # fused QKV, output laid out [groups, heads_per_group + 2, head_dim] (megatron-core's
        # layout: each group's query heads, then its key, then its value), so each tensor
        # rank owns g/t whole groups and their a/t query heads; MHA: [heads, 3, head_dim]
        self.qkv = lin.column(h, (a + 2 * g) * d, bias=layer.bias)
        self.q_norm = self.k_norm = None
        if layer.qk_norm:
            self.q_norm, self.k_norm = _norm(layer, lin.dtype, d), _norm(layer, lin.dtype, d)
        # each tensor rank normalises its own heads: the norms' gradients are summed over
        # the tensor group (real tensor parallelism), as for a norm on a sequence shard
        self.head_group = lin.group if lin.tp > 1 and not lin.simulate else None
        self.proj = lin.row(a * d, h, bias=layer.bias)
        self.ln2 = _norm(layer, lin.dtype)
        self.mlp = _MoE(layer, lin, expert_group, simulate_ep) if layer.is_moe \
            else _MLP(layer, lin)
        self.seq_group = lin.seq_group
        self.selective_recompute = selective_recompute
        self.dropout = layer.hidden_dropout

    def _split_qkv(self, qkv, lead: tuple, perm: tuple):
        """qkv [lead..., groups_local * (per + 2) * d] -> q [b, a/t, s, d], k and v
        [b, g/t, s, d], contiguous, the query and key norms and rotary embeddings applied to
        q and k; `perm` takes the layout [lead..., heads, d] to [b, heads, s, d]."""
        per = self.heads_per_group
        qkv = qkv.view(*lead, self.groups_local, per + 2, self.head_dim)
        if per == 1:
            q, k, v = (qkv[..., i, :] for i in range(3))
        else:
            q = qkv[..., :per, :].reshape(*lead, self.heads_local, self.head_dim)
            k, v = (qkv[..., per + i, :] for i in range(2))
        # copies in the [lead..., heads, d] layout (the kernel's as before), so that none of
        # them keeps the QKV output alive
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        if self.q_norm is not None:
            q = _layer_norm(self.q_norm, q, self.head_group)
            k = _layer_norm(self.k_norm, k, self.head_group)
        q, k, v = q.permute(*perm), k.permute(*perm), v.permute(*perm)
        if self.rotary is not None:
            q, k = self.rotary(q), self.rotary(k)
        return q, k, v

    def _core(self, q, k, v):
        # grouped-query: each k/v group serves its query heads inside the kernel
        return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal,
                                              enable_gqa=self.heads_per_group > 1)

    def attention(self, q, k, v):
        """The attention core, checkpointed under selective recomputation (reentrant, so
        that its inputs are saved through autograd like every other saved tensor)."""
        if self.selective_recompute and torch.is_grad_enabled():
            return checkpoint(self._core, q, k, v, use_reentrant=True,
                              preserve_rng_state=False)
        return self._core(q, k, v)

    def forward(self, x):
        if self.seq_group is not None:
            return self._forward_sequence_parallel(x)
        if self.proj_in is not None:
            x = self.proj_in(x)
        b, s, _ = x.shape
        qkv, _ = self.qkv(self.ln1(x))                       # [b, s, (a+2g)d/t]
        q, k, v = self._split_qkv(qkv, (b, s), (0, 2, 1, 3))  # [b, a/t or g/t, s, d]
        y = self.attention(q, k, v)
        y = y.transpose(1, 2).reshape(b, s, self.heads_local * self.head_dim)
        y, _ = self.proj(y)
        x = x + _dropout(y, self.dropout, self.training)
        return x + _dropout(self.mlp(self.ln2(x)), self.dropout, self.training)

    def _forward_sequence_parallel(self, x):
        """x: this rank's [s/t, b, h_in] -> [s/t, b, h]."""
        g = self.seq_group
        if self.proj_in is not None:
            x = _linear_on_shard(self.proj_in, x, g)
        qkv, _ = self.qkv(_layer_norm(self.ln1, x, g))   # gathered: [s, b, (a+2g)d/t]
        s, b = qkv.shape[:2]
        q, k, v = self._split_qkv(qkv, (s, b), (1, 2, 0, 3))  # [b, a/t or g/t, s, d]
        y = self.attention(q, k, v)                          # [b, a/t, s, d]
        # hand the projection the kernel's output without a copy, in whichever of the two
        # layouts the kernel wrote it ([s, b, a, d] or [b, s, a, d] in memory)
        seq_first = y.permute(2, 0, 1, 3)
        local = self.heads_local * self.head_dim
        if seq_first.is_contiguous():
            y, _ = self.proj(seq_first.reshape(s, b, local))
        else:
            y, _ = self.proj(y.transpose(1, 2).reshape(b, s, local), batch_first=True)
        # reduce-scattered: [s/t, b, h]
        x = x + _dropout(y, self.dropout, self.training)
        return x + _dropout(self.mlp(_layer_norm(self.ln2, x, g)), self.dropout, self.training)


class MLPLayer(nn.Module):
    """Pre-norm MLP (GELU or gated) with a residual: [b, s, h_in] -> [b, s, h]."""

    def __init__(self, layer: Layer, lin: _Linears):
        super().__init__()
        self.proj_in = _input_projection(layer, lin.dtype)
        self.ln = _norm(layer, lin.dtype)
        self.mlp = _MLP(layer, lin)
        self.seq_group = lin.seq_group
        self.dropout = layer.hidden_dropout

    def forward(self, x):
        g = self.seq_group
        if self.proj_in is not None:
            x = _linear_on_shard(self.proj_in, x, g)
        return x + _dropout(self.mlp(_layer_norm(self.ln, x, g)), self.dropout, self.training)


class HeadLayer(nn.Module):
    """Final norm + untied LM projection: [b, s, h] -> vocab-parallel logits [b, s, V/t]."""

    def __init__(self, layer: Layer, lin: _Linears):
        super().__init__()
        self.simulate = lin.simulate
        self.ln = _norm(layer, lin.dtype)
        self.lm = lin.column(layer.hidden_size, padded_vocab_size(layer.vocab_size, lin.shards),
                             bias=layer.bias)
        self.seq_group = lin.seq_group

    def forward(self, x):
        logits, _ = self.lm(_layer_norm(self.ln, x, self.seq_group))
        if self.seq_group is not None:      # gathered [s, b, V/t] -> batch-first
            logits = logits.transpose(0, 1).contiguous()
        return logits

    def loss(self, logits, labels):
        """Mean token cross-entropy (vocab-parallel; local shard only when simulating)."""
        if self.simulate:
            v_local = logits.shape[-1]
            return F.cross_entropy(logits.float().flatten(0, 1), (labels % v_local).flatten())
        return lm_loss(logits, labels)


def lm_loss(logits, labels):
    """Mean cross-entropy of vocab-parallel logits [b, s, V/t] against labels [b, s]
    (megatron-core vocab_parallel_cross_entropy over parallel_state's tensor group)."""
    from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(logits.float(), labels).mean()


# ----------------------------------------------------------------------------- API

def build_layer(layer: Layer, *, tp_size: int = 1, tp_group=None, precision: str = "fp32",
                simulate_tp_size: int = 0, causal: bool = True, sequence_parallel: bool = False,
                selective_recompute: bool = False, expert_group=None,
                simulate_ep: int = 1) -> nn.Module:
    """One module implementing `layer` for one tensor rank (see the module docstring)."""
    if precision not in TRIAL_PRECISIONS:
        raise ValueError(f"precision {precision!r}; accepted: {', '.join(TRIAL_PRECISIONS)}")
    if simulate_tp_size and tp_size != 1:
        raise ValueError("simulate_tp_size builds a sharded layer in one process; "
                         f"pass tp_size=1 with it (got tp_size={tp_size})")
    if tp_size < 1 or simulate_tp_size < 0:
        raise ValueError(f"tp_size must be >= 1 and simulate_tp_size >= 0 "
                         f"(got {tp_size}, {simulate_tp_size})")
    check_layer(layer)
    if not simulate_tp_size:
        tp_group = _resolve_group(tp_size, tp_group)
    lin = _Linears(tp_size=tp_size, tp_group=tp_group, dtype=TRIAL_PRECISIONS[precision],
                   simulate=simulate_tp_size, sequence_parallel=sequence_parallel)
    if layer.kind in ("transformer", "mlp") and layer.ffn_hidden_size % lin.shards:
        raise ValueError(f"{layer.kind} layer {layer.name!r}: ffn size "
                         f"{layer.ffn_hidden_size} is not divisible by the tensor-parallel "
                         f"degree {lin.shards}")
    if layer.kind == "embedding":
        return EmbeddingLayer(layer, lin)
    if layer.kind == "transformer":
        return TransformerLayer(layer, lin, causal=causal,
                                selective_recompute=selective_recompute,
                                expert_group=expert_group, simulate_ep=simulate_ep)
    if layer.kind == "mlp":
        return MLPLayer(layer, lin)
    if layer.kind == "head":
        return HeadLayer(layer, lin)
    raise ValueError(f"unknown layer kind {layer.kind!r}")


def check_layer(layer: Layer) -> None:
    """Raise UnsupportedLayer (with the reason) if real trials cannot build `layer`, and
    ValueError for a field value no layer has; needs no torch.distributed."""
    if layer.kind == "custom":
        raise UnsupportedLayer(f"layer {layer.name or 'custom'!r} is a custom layer (given only "
                               f"by its FLOPs, parameters and output size); real trials "
                               f"cannot run it: describe it as embedding / transformer / mlp "
                               f"/ head layers to run trials")
    if layer.tie_embeddings and layer.kind in ("embedding", "head"):
        raise UnsupportedLayer(f"layer {layer.name or layer.kind!r} ties the embedding and "
                               f"the LM head; trials run untied embeddings (sharing one "
                               f"matrix between the first and last pipeline stage needs "
                               f"DeepSpeed's TiedLayerSpec and its gradient all-reduce, which "
                               f"the trial pipeline does not build): set tie_embeddings false")
    for field, value, accepted in (("mlp", layer.mlp, MLP_KINDS),
                                   ("norm", layer.norm, ("layernorm", "rmsnorm")),
                                   ("position_embedding", layer.position_embedding,
                                    ("learned", "rope"))):
        if value not in accepted:
            raise ValueError(f"layer {layer.name or layer.kind!r}: {field} {value!r}; "
                             f"accepted: {', '.join(accepted)}")


def _resolve_group(tp_size: int, tp_group):
    """The tensor-parallel group the real layers use (given, else parallel_state's); the
    layers split by its size, which must be tp_size."""
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("build_layer without simulate_tp_size needs torch.distributed and "
                           "megatron parallel_state; call init_single_process_parallel() "
                           "first, or pass simulate_tp_size")
    if tp_group is None:
        from megatron.core import parallel_state

        if not parallel_state.model_parallel_is_initialized():
            raise RuntimeError("megatron parallel_state is not initialized; call "
                               "init_single_process_parallel() or initialize_model_parallel")
        tp_group = parallel_state.get_tensor_model_parallel_group()
    size = dist.get_world_size(tp_group)
    if size != tp_size:
        raise ValueError(f"tp_size={tp_size} but the tensor-parallel group has {size} ranks")
    return tp_group


def example_inputs(layer: Layer, mbs: int, *, dtype: torch.dtype = torch.float32,
                   device="cpu", seed: int = 0) -> tuple:
    """Synthetic inputs of one forward pass of `layer` with micro-batch `mbs`."""
    g = torch.Generator().manual_seed(seed)
    s = layer.seq_length
    if layer.kind == "embedding":
        return (torch.randint(0, layer.vocab_size, (mbs, s), generator=g).to(device),)
    x = torch.randn(mbs, s, layer.in_hidden, generator=g).to(device=device, dtype=dtype)
    x.requires_grad_(True)
    if layer.kind == "head":
        return x, torch.randint(0, layer.vocab_size, (mbs, s), generator=g).to(device)
    return (x,)


def forward_backward(module: nn.Module, layer: Layer, inputs: tuple) -> torch.Tensor:
    """Forward and backward of one layer; returns the back-propagated scalar."""
    if layer.kind == "head":
        x, labels = inputs
        out = module.loss(module(x), labels)
        out.backward()
        return out.detach()
    out = module(*inputs)
    out.backward(torch.ones_like(out))  # unit output gradient, same GEMMs as a real backward
    return out.detach().sum()


def init_single_process_parallel() -> None:
    """A gloo world of size 1 and megatron parallel_state with tp = pp = 1, for running
    real (megatron-core) layers with tp_size=1 in a single process. Idempotent."""
    import torch.distributed as dist
    from megatron.core import parallel_state

    if not dist.is_initialized():
        fd, path = tempfile.mkstemp(prefix="amp-search-store-")
        os.close(fd)
        os.unlink(path)  # FileStore creates it; no TCP port is needed
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)


def parameter_count(module: nn.Module) -> int:
    """Parameters held by this rank's module."""
    return sum(p.numel() for p in module.parameters())

