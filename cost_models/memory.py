"""Memory of one device in training: model states by ZeRO stage, and a stage's whole peak
(`stage_bytes`; `linear_stage_memory`, its form for the partition DP) with the activations and
buffers of cost_models.activations.

Pure functions of numbers (and of `cost_models.layers.Layer`), one term per function. They
describe what DeepSpeed 0.19.8 allocates for the trial program `amp_search.trial.run` (torch
Adam; a PipelineModule, or the plain engine for pp = 1 with ZeRO 2/3), and what autograd saves
for backward in the layers of `amp_search.trial.model`. `benchmarks/memory_accuracy.py`
measures every term on the real engine and checks it within 5 %.

Notation: P parameters on the device (one tensor rank of one stage), d the data-parallel
degree, g the bytes of one element in the training precision (fp32 4, bf16/fp16 2), t the
tensor-parallel degree, s sequence length, h hidden size, f ffn size, a heads, V vocabulary,
b the micro-batch size.

Model states: what each DeepSpeed optimizer holds (bytes per device)
-------------------------------------------------------------------
Mixed-precision Adam keeps fp32 master weights (4 B) and two fp32 moments (8 B) per parameter
(Rajbhandari et al. 2020, "ZeRO", section 3.1: 2 + 2 + 12 bytes). What DeepSpeed really holds,
read from its source and measured:

  engine (who picks it)               weights     gradients (largest at any time)          optimizer
  torch Adam (fp32, ZeRO 0)           4P          4P                                         8P
  BF16_Optimizer (bf16, ZeRO 0, pipe) 2P          2P param.grad + 2P accumulator + 4P'       12P'
  FP16_UnfusedOptimizer (fp16 ZeRO 0) 2P          2P + 4P (fp32 copies at the step)          12P
  ZeRO 1 (DeepSpeedZeroOptimizer)     gP          max(gP, g P'', 4P')                        12P'
  ZeRO 2 (plain engine, pp = 1)       gP          max(k g P'' + g X, 4P')  k = 2 if gas > 1   12P'
  ZeRO 3 (d > 1)                      g(P/d + P + G)      (g + 4) P/d                     12P/d

P' = P/d (the flat buffer is padded to a multiple of 2d); P'' = the parameters *touching* this
rank's partition, whole (DeepSpeed gives a rank every gradient that overlaps its slice), largest
over ranks; X = the largest parameter with more elements than the reduce bucket (0 if none);
G = one all-gather group in flight (`zero3_inflight_gather_numel`). Notes from the source (deepspeed/runtime/...):
- the fp32 ZeRO 1/2 optimizer still clones an fp32 master partition (stage_1_and_2.py
  `weights_partition = ....clone().to(master dtype)`), so fp32 ZeRO 1/2 holds 4P + 12P/d;
- bf16 with ZeRO 0 under the pipeline engine is BF16_Optimizer (engine.py
  `_do_optimizer_sanity_check`: bf16 + pipeline -> BFLOAT16), which *partitions* the fp32 master
  and moments over data parallelism like ZeRO 1 and accumulates gradients in a flat buffer of the
  gradient-accumulation dtype (bf16 unless data_types.grad_accum_dtype says otherwise);
- ZeRO 1 keeps the full low-precision gradients until the reduction at the accumulation
  boundary; after it, the gradients of its partition; the fp32 gradient partition exists only
  during the step;
- ZeRO 2 reduces in every micro-batch into a contiguous partition buffer; from the second
  micro-batch on two such buffers coexist (the accumulated one and the new one);
- ZeRO 3 partitions each parameter; parameters of at most `stage3_param_persistence_threshold`
  elements stay whole on every rank, and the weights of the layer running are gathered whole;
- ZeRO 1-3 allocate a gradient bucket of `reduce_bucket_size` elements (DeepSpeed default 5e8:
  1 GB in bf16) -> `zero_bucket_bytes`.

Activations saved for backward, and the pipeline buffers: cost_models.activations.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import lru_cache

import numpy as np

from .activations import (FP32_BYTES, ActivationTerms, activation_terms, head_buffers_aliased,
                          in_flight_microbatches, layer_activation_bytes, pipe_buffer_count,
                          recompute_working_set_bytes, stage_activation_bytes,
                          stage_output_buffer_bytes)
from .layers import (Layer, block_tensor_numels, expert_param_count, padded_vocab_size,
                     per_distinct_layer)

BYTES_PER_ELEMENT = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 2, "nvfp4": 2}
"""g: bytes of a weight, gradient or activation element in each training precision."""
ADAM_STATE_BYTES = 8
"""Adam's two fp32 moments (exp_avg, exp_avg_sq) per parameter."""
ZERO_PARTITION_ALIGNMENT = 2
"""DeepSpeed pads its flat buffers to a multiple of 2 x dp elements (stage_1_and_2.py
`nccl_start_alignment_factor`)."""
ENGINES = ("torch_adam", "bf16_optimizer", "fp16_optimizer", "zero1", "zero2", "zero3")


@dataclass(frozen=True, kw_only=True)
class ZeroBuckets:
    """DeepSpeed's ZeRO bucket settings; the defaults are DeepSpeed 0.19.8's
    (deepspeed/runtime/zero/config.py)."""

    reduce_bucket_elements: int = 500_000_000
    """zero_optimization.reduce_bucket_size: elements of the gradient bucket (ZeRO 1-3)."""
    allgather_bucket_elements: int = 500_000_000
    """zero_optimization.allgather_bucket_size (ZeRO 1/2 all-gather of updated weights)."""
    stage3_prefetch_elements: int = 50_000_000
    """stage3_prefetch_bucket_size."""
    stage3_persistence_threshold: int = 100_000
    """stage3_param_persistence_threshold: smaller parameters are never partitioned."""
    stage3_max_live_parameters: int = 1_000_000_000
    """stage3_max_live_parameters."""

    def ds_config(self) -> dict:
        """The `zero_optimization` keys that set these values."""
        return {"reduce_bucket_size": self.reduce_bucket_elements,
                "allgather_bucket_size": self.allgather_bucket_elements,
                "stage3_prefetch_bucket_size": self.stage3_prefetch_elements,
                "stage3_param_persistence_threshold": self.stage3_persistence_threshold,
                "stage3_max_live_parameters": self.stage3_max_live_parameters}


DEEPSPEED_DEFAULT_BUCKETS = ZeroBuckets()


@dataclass(frozen=True, kw_only=True)
class ModelStates:
    """Bytes of the model states one device holds (each part at its largest)."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    """fp32 master weights + Adam moments."""
    buffer_bytes: int
    """DeepSpeed's gradient-reduction bucket."""
    step_bytes: int = 0
    """Held during the optimizer step only, when no activations are: Megatron-LM's fp32
    copies of 16-bit gradients (`megatron_step_bytes_per_param`)."""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class StageBytes:
    """The memory parts of the most loaded device of one stage, in bytes."""

    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    buffer_bytes: int
    activation_bytes: int
    step_bytes: int = 0
    """ModelStates.step_bytes: the device peaks at the larger of it and the activations."""

    def to_dict(self) -> dict:
        return asdict(self)


# ----------------------------------------------------------------------------- search rules

def zero_allowed(pp: int, zero_stage: int) -> bool:
    """ZeRO 2 and 3 are rejected by DeepSpeed's pipeline engine (runtime/pipe/engine.py asserts
    zero stage < 2), so they need pp = 1, where the trials train a plain engine."""
    return not (pp > 1 and zero_stage >= 2)


def deepspeed_engine(*, zero_stage: int, precision: str) -> str:
    """Which DeepSpeed optimizer the trial program ends up with (engine.py
    `_configure_optimizer` / `_do_optimizer_sanity_check`, torch Adam as the basic optimizer):
    ZeRO 1-3 their ZeRO optimizers; ZeRO 0: fp32 the bare torch Adam, bf16 BF16_Optimizer under
    the pipeline engine (every trial with ZeRO 0 uses it), fp16 FP16_UnfusedOptimizer."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
    if precision not in BYTES_PER_ELEMENT:
        raise ValueError(f"precision {precision!r}; accepted: {', '.join(BYTES_PER_ELEMENT)}")
    if zero_stage:
        return f"zero{zero_stage}"
    return {"fp32": "torch_adam", "bf16": "bf16_optimizer", "fp16": "fp16_optimizer",
            "fp8": "bf16_optimizer", "nvfp4": "bf16_optimizer"}[precision]


def pipeline_engine(*, pp: int, zero_stage: int) -> bool:
    """The trials train a PipelineModule except for pp = 1 with ZeRO 2/3 (amp_search.trial.run)."""
    return not (pp == 1 and zero_stage >= 2)


# ----------------------------------------------------------------------------- parameters

@lru_cache(maxsize=65536)      # a pure function; the search asks for the same layer often
def param_tensor_numels(layer: Layer, tmp: int = 1, ep: int = 1) -> tuple[int, ...]:
    """Elements of each parameter tensor of the trial layer on one tensor rank, in module
    registration order (the order DeepSpeed flattens them); sums to `param_count`. A layer
    with Llama-family options: `cost_models.layers.block_tensor_numels` (megatron-core's
    order: norm, linear_qkv, linear_proj, norm, linear_fc1, linear_fc2)."""
    if not layer.is_gpt_block and layer.kind != "custom":
        return block_tensor_numels(layer, tmp, ep=ep)
    h, f, s, t = layer.hidden_size, layer.ffn_hidden_size, layer.seq_length, tmp
    v = padded_vocab_size(layer.vocab_size, tmp)
    proj = ()
    if layer.input_hidden_size and layer.input_hidden_size != h:
        proj = (layer.input_hidden_size * h, h)
    mlp = (h * f // t, f // t, f * h // t, h)
    k = layer.kind
    if k == "embedding":
        return (v * h // t, s * h)
    if k == "transformer":
        return proj + (h, h, 3 * h * h // t, 3 * h // t, h * h // t, h, h, h) + mlp
    if k == "mlp":
        return proj + (h, h) + mlp
    if k == "head":
        return (h, h, v * h // t, v // t)
    if k == "custom":
        return (layer.custom_params,)
    raise ValueError(f"unknown layer kind {k!r}")


def expert_data_parallel(dp: int, tmp: int, ep: int) -> int:
    """The ranks that hold the same experts of a stage (expert tensor parallelism 1): the
    stage's dp x tmp ranks (dp here the data x context-parallel ranks) over the ep ranks
    that split the experts."""
    return max(dp * tmp // ep, 1)


def flat_numel(params: int, dp: int) -> int:
    """Elements of DeepSpeed's flat parameter buffer: padded to a multiple of 2 dp."""
    q = ZERO_PARTITION_ALIGNMENT * dp
    return -(-params // q) * q


def partition_numel(params: int, dp: int) -> int:
    """P': elements of one rank's slice of the flat buffer (ZeRO 1/2, BF16_Optimizer)."""
    return flat_numel(params, dp) // dp


def straddling_partition_numel(tensor_numels: tuple[int, ...], dp: int) -> int:
    """P'': the most elements any rank's gradient partition holds in ZeRO 1/2, where a rank
    keeps every parameter that overlaps its slice whole (stage_1_and_2.py
    `get_partition_info` -> params_in_partition; `grads_in_partition` sums their numel)."""
    total = sum(tensor_numels)
    part = partition_numel(total, dp)
    if not tensor_numels:
        return 0
    # tensor k spans [start_k, end_k) of the flat buffer; rank r owns [r*part, (r+1)*part).
    # The tensors overlapping rank r are a contiguous run: from the first whose end > lo to
    # the last whose start < hi (zero-size tensors overlap nothing and add nothing).
    sizes = np.asarray(tensor_numels, dtype=np.int64)
    ends = np.cumsum(sizes)
    starts = ends - sizes
    prefix = np.concatenate([[0], ends])
    lo = np.arange(dp, dtype=np.int64) * part
    first = np.searchsorted(ends, lo, side="right")
    last = np.searchsorted(starts, lo + part, side="left")
    held = prefix[np.maximum(last, first)] - prefix[first]
    return int(held.max())


def zero3_partition_numel(tensor_numels: tuple[int, ...], dp: int) -> int:
    """ZeRO 3 partitions each parameter on its own: sum of ceil(numel / dp)."""
    return sum(-(-n // dp) for n in tensor_numels)


def zero3_persistent_numel(tensor_numels: tuple[int, ...],
                           buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS) -> int:
    """Parameters small enough that ZeRO 3 keeps them whole on every rank
    (numel <= stage3_param_persistence_threshold)."""
    return sum(n for n in tensor_numels if n <= buckets.stage3_persistence_threshold)


def zero3_gathered_numel(tensor_numels: tuple[int, ...], *, inflight_numel: int = 0,
                         buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS) -> int:
    """Weights ZeRO 3 holds whole at once besides each rank's partitions: the persistent ones,
    up to stage3_max_live_parameters of the others, and `inflight_numel` more while a
    coalesced all-gather is being unpacked (`zero3_inflight_gather_numel`).

    DeepSpeed releases a gathered parameter after its module ran only if it is not reused
    within stage3_max_reuse_distance (default 1e9 elements; partitioned_param_coordinator.py
    `__params_to_release`); its next use (its backward) is at most ~2P elements later, so with
    the defaults a stage below ~5e8 parameters keeps every weight gathered from its forward to
    its backward (measured: P/d + P + one gather group)."""
    persistent = zero3_persistent_numel(tensor_numels, buckets)
    live = min(sum(tensor_numels) - persistent, buckets.stage3_max_live_parameters)
    return persistent + live + inflight_numel


def zero3_inflight_gather_numel(layer_tensor_numels: list[tuple[int, ...]],
                                buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS) -> int:
    """One coalesced all-gather group, which exists twice for a moment (the flat buffer and the
    weights copied out of it, partition_parameters.py AllGatherCoalescedHandle.wait). When
    the most weights are gathered (late in forward, early in backward) the groups are blocks'
    weights prefetched until stage3_prefetch_bucket_size is reached: at most the bucket plus
    one weight, and at most one layer (the embedding and head, fetched at the ends, are left
    out of the weight bound). An estimate: measured within 5 % on two models."""
    def big(ts):
        return [n for n in ts if n > buckets.stage3_persistence_threshold]
    largest_layer = max((sum(big(ts)) for ts in layer_tensor_numels), default=0)
    block_tensors = [n for ts in layer_tensor_numels if len(ts) > 4 for n in big(ts)]
    largest_tensor = max(block_tensors or [n for ts in layer_tensor_numels for n in big(ts)]
                         or [0])
    return min(largest_layer, buckets.stage3_prefetch_elements + largest_tensor)


# ----------------------------------------------------------------------------- model states

def weight_bytes(*, params: int, precision: str, zero_stage: int, dp: int,
                 zero3_partition: int = 0, zero3_gathered: int = 0) -> int:
    """Training-precision weights: g P (the flat buffer, padded, for ZeRO 1/2); ZeRO 3 with
    d > 1 keeps its partitions plus the gathered weights, g (sum ceil(n/d) + gathered); with
    d = 1 the partition is the whole weight, g P."""
    g = BYTES_PER_ELEMENT[precision]
    if zero_stage == 3 and dp > 1:
        return g * (zero3_partition + zero3_gathered)
    if zero_stage in (1, 2):
        return g * flat_numel(params, dp)
    return g * params


def partitions_optimizer(engine: str) -> bool:
    """Whether the engine's optimizer updates only its 1/dp partition of the parameters (ZeRO
    1-3, BF16_Optimizer) rather than all of them (torch Adam, FP16_UnfusedOptimizer)."""
    return engine not in ("torch_adam", "fp16_optimizer")


def optimizer_shards(*, framework: str, zero_stage: int, precision: str, dp: int) -> int:
    """Over how many data-parallel ranks the optimizer step is divided: dp where the optimizer
    updates only its partition (DeepSpeed's ZeRO 1-3 and BF16_Optimizer, Megatron-LM's
    distributed optimizer, zero_stage 1), else 1."""
    if framework == "megatron":
        return dp if zero_stage in (1, 3) else 1
    engine = deepspeed_engine(zero_stage=zero_stage, precision=precision)
    return dp if partitions_optimizer(engine) else 1


def optimizer_bytes(*, params: int, engine: str, dp: int) -> int:
    """fp32 master weights (4 B) + Adam moments (8 B) per parameter the rank updates: all of
    them for torch Adam (no master copy: 8P) and FP16_UnfusedOptimizer (12P); its partition P'
    for ZeRO 1-3 and BF16_Optimizer (12P')."""
    if engine == "torch_adam":
        return ADAM_STATE_BYTES * params
    if engine == "fp16_optimizer":
        return (FP32_BYTES + ADAM_STATE_BYTES) * params
    if engine == "zero3":
        return (FP32_BYTES + ADAM_STATE_BYTES) * -(-params // dp)
    return (FP32_BYTES + ADAM_STATE_BYTES) * partition_numel(params, dp)


def gradient_bytes(*, params: int, precision: str, engine: str, dp: int, gas: int,
                   straddle_numel: int, extra_large_numel: int = 0) -> int:
    """The largest amount of gradient memory the optimizer holds at one time (see the table in
    the module docstring); `straddle_numel` is P'' (`straddling_partition_numel`);
    `extra_large_numel` the largest parameter above the reduce bucket, whose gradient ZeRO 2
    reduces from its own tensor instead of the bucket (stage_1_and_2.py
    `extra_large_param_to_reduce`), so it lives beside the partition buffers."""
    g = BYTES_PER_ELEMENT[precision]
    fp32_partition = FP32_BYTES * partition_numel(params, dp)
    if engine == "torch_adam":
        return g * params
    if engine == "fp16_optimizer":
        return (g + FP32_BYTES) * params
    if engine == "bf16_optimizer":
        return 2 * g * params + fp32_partition
    if engine == "zero1":
        return max(g * params, g * straddle_numel, fp32_partition)
    if engine == "zero2":
        return max((2 if gas > 1 else 1) * g * straddle_numel + g * extra_large_numel,
                   fp32_partition)
    if engine == "zero3":
        return (g + FP32_BYTES) * -(-params // dp)
    raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")


def zero_bucket_bytes(*, precision: str, zero_stage: int,
                      buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS) -> int:
    """The gradient bucket ZeRO 1-3 allocate whole: reduce_bucket_size elements of the
    gradient dtype (stage_1_and_2.py `setup_buckets` / `reduce_gradients`, stage3.py
    `__ipg_bucket_flat_buffer`); none without ZeRO."""
    if zero_stage == 0:
        return 0
    return BYTES_PER_ELEMENT[precision] * buckets.reduce_bucket_elements


MEMORY_FRAMEWORKS = ("deepspeed", "megatron")


def frozen_states(states):
    """The model states (ModelStates, or a stage's StageBytes) of frozen weights (LoRA's base
    model): the weights only, with no gradients, optimizer state or gradient bucket."""
    return replace(states, gradient_bytes=0, optimizer_bytes=0, buffer_bytes=0, step_bytes=0)


def megatron_grad_bytes(precision: str, grad_fp32: bool | None = None) -> int:
    """Bytes of one element of Megatron-LM's contiguous gradient buffer (main_grad): fp32 for
    bf16 training (--accumulate-allreduce-grads-in-fp32, forced on with bf16; megatron-core's
    DistributedDataParallelConfig.grad_reduce_in_fp32) and for fp32, fp16 for fp16 (its
    default); `grad_fp32` False keeps it in the training dtype (grad_reduce_in_fp32=False,
    as Megatron-Bridge's performance recipes set it), True in fp32."""
    if precision not in BYTES_PER_ELEMENT:
        raise ValueError(f"precision {precision!r}; accepted: {', '.join(BYTES_PER_ELEMENT)}")
    if grad_fp32 is None:
        grad_fp32 = precision != "fp16"
    return FP32_BYTES if grad_fp32 or precision == "fp32" else 2


def megatron_optimizer_bytes_per_param(precision: str) -> int:
    """What Megatron-LM's optimizer holds per parameter through the whole iteration besides
    the model's weights and gradient buffer: Adam's two fp32 moments (8) and an fp32 master
    copy of low-precision weights (4): fp16 and bf16 12, fp32 8, whatever the gradients'
    dtype (the fp32 copy of 16-bit gradients is `megatron_step_bytes_per_param`)."""
    g = BYTES_PER_ELEMENT[precision]
    return ADAM_STATE_BYTES + (FP32_BYTES if g != FP32_BYTES else 0)


def megatron_step_bytes_per_param(precision: str, grad_fp32: bool | None = None) -> int:
    """The fp32 copy of a 16-bit gradient buffer (4 per parameter, else 0) that Megatron-LM's
    mixed-precision optimizers make for the step: `_copy_model_grads_to_main_grads` sets
    `shard_main_param.grad = shard_model_grad.float()` (distrib_optimizer.py; optimizer.py
    for the non-distributed one; `.float()` of an fp32 buffer is the buffer itself), and the
    next iteration's `zero_grad` (set_to_none) frees it before the first forward. It is
    part of the documented 4 + 16/d (fp16) but is never held with the activations."""
    return FP32_BYTES if megatron_grad_bytes(precision, grad_fp32) != FP32_BYTES else 0


def megatron_model_state_bytes(params: int, *, precision: str, zero_stage: int,
                               dp: int, gathered_numel: int = 0,
                               grad_fp32: bool | None = None) -> ModelStates:
    """Model states of Megatron-LM's optimizers, bytes per parameter as its documentation
    gives them (Megatron Core user guide, "Distributed Optimizer", docs/source/
    distrib_optimizer.md; d = data-parallel size):

        param, grads            non-distributed   distributed (--use-distributed-optimizer)
        fp16, fp16              20                4 + 16/d
        bf16, fp32              18                6 + 12/d
        fp32, fp32              16                8 + 8/d

    zero_stage 0: Float16OptimizerWithFloat16Params / FP32Optimizer (every rank holds all of
    it); zero_stage 1: the distributed optimizer, which shards the optimizer part (master
    weights, fp32 gradient copies, moments) over the d data-parallel ranks (ceil(P/d) each)
    and keeps the weights and the gradient buffer whole; zero_stage 3: Megatron-FSDP
    (--use-megatron-fsdp --data-parallel-sharding-strategy optim_grads_params), which shards
    the weights and the gradients too, ceil(P/d) each, and holds `gathered_numel` more of
    each whole: the FSDP units (one layer each) all-gathered for the layer computing and the
    one prefetched, and their gradients before the reduce-scatter (2 x the largest layer).
    No ZeRO 2 (amp_search.search_space prunes it under the megatron backend); no DeepSpeed
    bucket. With 16-bit gradients the table's fp32 gradient copy (4/d of the 16/d) is
    `step_bytes`, held at the optimizer step only (`megatron_step_bytes_per_param`)."""
    if zero_stage not in (0, 1, 3):
        raise ValueError(f"Megatron-LM has no ZeRO stage {zero_stage}; accepted: 0, 1 "
                         f"(1 = --use-distributed-optimizer), 3 (Megatron-FSDP)")
    per_param = megatron_optimizer_bytes_per_param(precision)
    step = megatron_step_bytes_per_param(precision, grad_fp32)
    held = -(-params // dp) if zero_stage in (1, 3) else params
    if zero_stage == 3:
        whole = held + gathered_numel
        return ModelStates(parameter_bytes=BYTES_PER_ELEMENT[precision] * whole,
                           gradient_bytes=megatron_grad_bytes(precision, grad_fp32) * whole,
                           optimizer_bytes=per_param * held, buffer_bytes=0,
                           step_bytes=step * held)
    return ModelStates(parameter_bytes=BYTES_PER_ELEMENT[precision] * params,
                       gradient_bytes=megatron_grad_bytes(precision, grad_fp32) * params,
                       optimizer_bytes=per_param * held, buffer_bytes=0,
                       step_bytes=step * held)


def model_state_bytes(tensor_numels: tuple[int, ...], *, precision: str, zero_stage: int,
                      dp: int, gas: int, zero3_inflight_numel: int = 0,
                      buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS,
                      framework: str = "deepspeed", expert_numel: int = 0,
                      expert_dp: int = 1, grad_fp32: bool | None = None) -> ModelStates:
    """Weights, gradients, optimizer states and bucket of one device holding the parameter
    tensors `tensor_numels` (one stage, one tensor rank, in flattening order);
    `zero3_inflight_numel` is `zero3_inflight_gather_numel` of its layers (ZeRO 3 only;
    Megatron-FSDP: twice its largest layer, `megatron_model_state_bytes`).
    `framework` "megatron": Megatron-LM's optimizers (`megatron_model_state_bytes`), where
    `expert_numel` of the parameters are routed experts, whose optimizer state the
    distributed optimizer shards over the `expert_dp` expert-data-parallel ranks instead of
    the dp ones; `grad_fp32` its gradient buffer's dtype (`megatron_grad_bytes`)."""
    params = sum(tensor_numels)
    if framework not in MEMORY_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(MEMORY_FRAMEWORKS)}")
    if framework == "megatron":
        dense = megatron_model_state_bytes(params - expert_numel, precision=precision,
                                           zero_stage=zero_stage, dp=dp,
                                           gathered_numel=zero3_inflight_numel,
                                           grad_fp32=grad_fp32)
        if not expert_numel:
            return dense
        expert = megatron_model_state_bytes(expert_numel, precision=precision,
                                            zero_stage=zero_stage, dp=expert_dp,
                                            grad_fp32=grad_fp32)
        return ModelStates(**{f.name: getattr(dense, f.name) + getattr(expert, f.name)
                              for f in fields(ModelStates)})
    engine = deepspeed_engine(zero_stage=zero_stage, precision=precision)
    straddle = straddling_partition_numel(tensor_numels, dp) if zero_stage in (1, 2) else 0
    zero3 = zero_stage == 3 and dp > 1     # only then are the per-tensor partitions used
    return ModelStates(
        parameter_bytes=weight_bytes(
            params=params, precision=precision, zero_stage=zero_stage, dp=dp,
            zero3_partition=zero3_partition_numel(tensor_numels, dp) if zero3 else 0,
            zero3_gathered=zero3_gathered_numel(tensor_numels, buckets=buckets,
                                                inflight_numel=zero3_inflight_numel)
            if zero3 else 0),
        gradient_bytes=gradient_bytes(
            params=params, precision=precision, engine=engine, dp=dp, gas=gas,
            straddle_numel=straddle,
            extra_large_numel=max((n for n in tensor_numels if n > buckets.reduce_bucket_elements),
                                  default=0)),
        optimizer_bytes=optimizer_bytes(params=params, engine=engine, dp=dp),
        buffer_bytes=zero_bucket_bytes(precision=precision, zero_stage=zero_stage,
                                       buckets=buckets))


# ----------------------------------------------------------------------------- activations

def stage_bytes(layers, *, stage: int, pp: int, dp: int, tmp: int, mbs: int, gas: int,
                zero_stage: int, recompute: bool, precision: str,
                buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS,
                attention_scores: bool = False, sequence_parallel: bool = False,
                selective: bool | tuple = False, framework: str = "deepspeed",
                cp: int = 1, ep: int = 1, grad_fp32: bool | None = None) -> StageBytes:
    """All parts for the device of one stage (every tensor rank holds the same shapes). With
    context parallelism (cp > 1; dp is then the dp x cp ranks the optimizer states are sharded
    over) a rank keeps the activations of its s/cp tokens: 1/cp of every activation and
    buffer term (each is per token, the stored scores of standard attention too: s/cp
    queries against s keys). A mixture-of-experts block's rank holds E/ep experts, their
    optimizer state sharded over dp x tmp / ep ranks (`model_state_bytes`)."""
    states = stage_state_bytes(layers, dp=dp, tmp=tmp, gas=gas, zero_stage=zero_stage,
                               precision=precision, buckets=buckets, framework=framework, ep=ep,
                               grad_fp32=grad_fp32)
    terms = activation_terms(layers, mbs=mbs, tmp=tmp,
                             bytes_per_element=BYTES_PER_ELEMENT[precision],
                             recompute=recompute, attention_scores=attention_scores,
                             sequence_parallel=sequence_parallel, selective=selective,
                             fp8=precision in ("fp8", "nvfp4"))
    return stage_bytes_of(states, terms, stage=stage, pp=pp, gas=gas, zero_stage=zero_stage,
                          cp=cp)


def stage_state_bytes(layers, *, dp: int, tmp: int, gas: int, zero_stage: int, precision: str,
                      buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS,
                      framework: str = "deepspeed", ep: int = 1,
                      grad_fp32: bool | None = None) -> ModelStates:
    """`model_state_bytes` of one device holding `layers` (what `stage_bytes` takes from it;
    it does not depend on where the stage sits)."""
    per_layer = [param_tensor_numels(x, tmp, ep) for x in layers]
    return model_state_bytes(
        tuple(n for ts in per_layer for n in ts), precision=precision, zero_stage=zero_stage,
        dp=dp, gas=gas, buckets=buckets,
        zero3_inflight_numel=(2 * max((sum(ts) for ts in per_layer), default=0)
                              if framework == "megatron" else
                              zero3_inflight_gather_numel(per_layer, buckets))
        if zero_stage == 3 and dp > 1 else 0,       # only ZeRO 3 over dp > 1 reads it
        framework=framework, expert_numel=sum(expert_param_count(x, ep) for x in layers),
        expert_dp=expert_data_parallel(dp, tmp, ep), grad_fp32=grad_fp32)


def stage_bytes_of(states: ModelStates, terms: ActivationTerms, *, stage: int, pp: int,
                   gas: int, zero_stage: int, cp: int = 1) -> StageBytes:
    """`stage_bytes` of stage j from its model states and activation terms (a planner caches
    both per set of layers, and places them here per stage)."""
    act = stage_activation_bytes(terms, stage=stage, pp=pp, gas=gas,
                                 pipelined=pipeline_engine(pp=pp, zero_stage=zero_stage))
    act = act // cp if cp > 1 else act
    return StageBytes(parameter_bytes=states.parameter_bytes,
                      gradient_bytes=states.gradient_bytes,
                      optimizer_bytes=states.optimizer_bytes,
                      buffer_bytes=states.buffer_bytes, activation_bytes=int(act),
                      step_bytes=states.step_bytes)


# ----------------------------------------------------------------------------- for the DP

@dataclass(frozen=True, kw_only=True)
class LinearMemory:
    """Stage memory in the additive form the partition DP needs (pp > 1); `stage_arrays`
    gives, for pp stages,

        bytes(stage j holding layers a..b-1) ~ sum_{l=a}^{b-1} layer_bytes[j, l] + reserved_bytes[j]

    layer_bytes[j, l] = model-state bytes per parameter (of the whole model, `model_state_bytes`)
    x layer l's parameters + in_flight_microbatches(j) x layer l's saved activations;
    reserved_bytes[j] = framework overhead + ZeRO bucket + recomputation working set + stage j's
    pipeline buffers (sized by the largest output any layer could hand on; the last stage's by
    the model's last layer, the head's logits). It linearises `stage_bytes` (ZeRO padding and
    the largest straddling gradient are averaged in; the recomputation working set is not
    reduced by the head's freed activations, and the optimizer step's transient bytes,
    `ModelStates.step_bytes`, are added to the activations where the exact check takes the
    larger of the two: upper bounds), which then checks the chosen split exactly. Nothing
    here depends on pp, so one record serves every pipeline depth."""

    state_bytes: np.ndarray
    """[L] model-state bytes of each layer."""
    activation_bytes: np.ndarray
    """[L] saved activation bytes of each layer per micro-batch in flight."""
    fixed_bytes: float
    """Per device: framework overhead + ZeRO bucket + recomputation working set."""
    output_buffer_bytes: float
    """One pipeline buffer of a stage that ends before the last layer (the largest output)."""
    last_buffer_bytes: float
    """One pipeline buffer of the last stage (the last layer's output, the head's logits)."""
    last_buffers_aliased: int
    """Buffers of the last stage already counted with the activations (fp32 logits)."""

    def stage_arrays(self, pp: int, gas: int) -> tuple[np.ndarray, np.ndarray]:
        """(layer_bytes [pp, L], reserved_bytes [pp]) for a pipeline of pp stages."""
        stages = range(pp)
        inflight = np.array([in_flight_microbatches(j, pp, gas) for j in stages], dtype=float)
        buffers = np.array([pipe_buffer_count(j, pp, gas) for j in stages], dtype=float)
        reserved = self.fixed_bytes + buffers * self.output_buffer_bytes
        reserved[-1] = self.fixed_bytes + (buffers[-1] - self.last_buffers_aliased) \
            * self.last_buffer_bytes
        return (self.state_bytes[None, :] + inflight[:, None] * self.activation_bytes[None, :],
                reserved)


@lru_cache(maxsize=64)
def _layer_tensors(layers: tuple, tmp: int, ep: int):
    """(one layer per signature, every tensor's numel in layer order, each layer's
    parameters, each layer's routed-expert parameters) of one tensor and expert rank: layers of
    one signature hold the same tensors, so each is counted once; the search asks for the same
    (layers, tmp, ep) for every candidate."""
    first: dict = {}
    for x in layers:
        first.setdefault(x.signature, x)
    numel_of = {k: param_tensor_numels(x, tmp, ep) for k, x in first.items()}
    numels = [numel_of[x.signature] for x in layers]
    flat = tuple(n for ts in numels for n in ts)
    expert_of = {k: expert_param_count(x, ep) for k, x in first.items()}
    experts = np.array([expert_of[x.signature] for x in layers], dtype=float)
    experts.setflags(write=False)
    layer_numel = np.array([sum(ts) for ts in numels], dtype=float)
    layer_numel.setflags(write=False)
    return first, flat, layer_numel, experts


def linear_stage_memory(layers, *, dp: int, tmp: int, mbs: int, gas: int, zero_stage: int,
                        recompute: bool, precision: str, framework_overhead_bytes: int,
                        buckets: ZeroBuckets = DEEPSPEED_DEFAULT_BUCKETS,
                        attention_scores: bool = False, sequence_parallel: bool = False,
                        selective: bool | tuple = False, framework: str = "deepspeed",
                        cp: int = 1, ep: int = 1, frozen: bool = False,
                        grad_fp32: bool | None = None) -> LinearMemory:
    """`LinearMemory` of a pipelined strategy (see there); the same terms as `stage_bytes`
    (with cp > 1, 1/cp of the activation terms; routed experts' states per parameter as
    their own sharding gives them)."""
    g = BYTES_PER_ELEMENT[precision]
    first, flat, layer_numel, experts = _layer_tensors(tuple(layers), tmp, ep)
    states = model_state_bytes(flat, precision=precision, zero_stage=zero_stage, dp=dp, gas=gas,
                               buckets=buckets, framework=framework,
                               expert_numel=int(experts.sum()),
                               expert_dp=expert_data_parallel(dp, tmp, ep), grad_fp32=grad_fp32)
    if frozen:
        states = frozen_states(states)
    total = (states.parameter_bytes + states.gradient_bytes + states.optimizer_bytes
             + states.step_bytes)
    per_param = total / max(sum(flat), 1)
    per_expert_param = per_param
    if experts.any():               # the experts' and the rest's bytes per parameter
        ex = model_state_bytes((int(experts.sum()),), precision=precision,
                               zero_stage=zero_stage, dp=dp, gas=gas, buckets=buckets,
                               framework=framework, expert_numel=int(experts.sum()),
                               expert_dp=expert_data_parallel(dp, tmp, ep),
                               grad_fp32=grad_fp32)
        if frozen:
            ex = frozen_states(ex)
        ex_total = ex.parameter_bytes + ex.gradient_bytes + ex.optimizer_bytes + ex.step_bytes
        per_expert_param = ex_total / experts.sum()
        per_param = (total - ex_total) / max(sum(flat) - experts.sum(), 1)
    kw = dict(mbs=mbs, tmp=tmp, bytes_per_element=g, attention_scores=attention_scores,
              sequence_parallel=sequence_parallel, fp8=precision in ("fp8", "nvfp4"))
    selective = False if recompute else selective
    fixed = float(framework_overhead_bytes + states.buffer_bytes)
    if recompute or selective:
        # the largest block's: one layer of each signature is enough
        fixed += recompute_working_set_bytes(tuple(first.values()), selective=selective,
                                             **kw) / cp
    outputs = per_distinct_layer(layers[:-1], lambda x: stage_output_buffer_bytes(
        x, mbs=mbs, tmp=tmp, bytes_per_element=g))
    last = layers[-1]
    activation_of = {k: layer_activation_bytes(x, recompute=recompute, selective=selective,
                                               **kw) for k, x in first.items()}
    return LinearMemory(
        state_bytes=per_param * (layer_numel - experts) + per_expert_param * experts,
        activation_bytes=np.array([activation_of[x.signature] for x in layers],
                                  dtype=float) / cp,
        fixed_bytes=fixed, output_buffer_bytes=max(outputs, default=0.0) / cp,
        last_buffer_bytes=stage_output_buffer_bytes(last, mbs=mbs, tmp=tmp,
                                                    bytes_per_element=g) / cp,
        last_buffers_aliased=head_buffers_aliased(g) if last.kind == "head" else 0)
