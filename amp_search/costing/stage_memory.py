"""Peak memory of every device of a strategy: the planner's out-of-memory check.

    stage_memory(spec, strategy) -> (StageMemory per pipeline stage)

For each stage j the most loaded device is reported (tensor ranks hold equal shards; among the
data-parallel ranks ZeRO 1/2 load most the one whose slice touches the most whole parameters,
which cost_models.memory counts), with the usable capacity of the stage's *smallest* device:
memory x (1 - training.memory_headroom).

    peak = parameters + gradients + optimizer states          (cost_models.memory, by ZeRO stage)
         + activations: saved for backward by the micro-batches in flight under 1F1B, the
           recomputation working set, the pipeline engine's output buffers   (activation_bytes)
         + training.framework_overhead_bytes + DeepSpeed's ZeRO gradient bucket (overhead_bytes)

Under `training.backend: megatron` the model states are Megatron-LM's (its documented bytes
per parameter; zero_stage 1 the distributed optimizer: cost_models.memory.
megatron_model_state_bytes) and there is no DeepSpeed bucket.

Each part is at its own largest, so the sum bounds the real peak from above. DeepSpeed's bucket
sizes are its defaults (cost_models.memory.DEEPSPEED_DEFAULT_BUCKETS), which is what the trial
runner's ds_config leaves them at.

Strategies whose peak exceeds the capacity are pruned by the search under
search_space.Reason.OUT_OF_MEMORY.
"""
from __future__ import annotations

from functools import lru_cache

from cost_models import activations

from cost_models import memory as memory_model
from cost_models.layers import Layer

from ..records import StageMemory, Strategy
from ..spec import Spec

__all__ = ["stage_memory"]


def stage_memory(spec: Spec, strategy: Strategy, capacity_bytes=None,
                 attention_scores=None) -> tuple[StageMemory, ...]:
    """Predicted peak memory of the most loaded device of each pipeline stage.
    `capacity_bytes`: the memory of each stage's smallest device; `attention_scores`: whether
    each stage runs standard attention (Spec.attention_for), if the caller has them."""
    t = spec.training
    s = strategy
    devices = spec.cluster.devices
    if capacity_bytes is None or attention_scores is None:
        stage_gpus = [{devices[d].gpu.name: devices[d].gpu for replica in s.placement[j]
                       for d in replica}.values() for j in range(s.pp)]
        capacity_bytes = [min(g.memory_bytes for g in gs) for gs in stage_gpus]
        attention_scores = [any(spec.attention_for(g) == "standard" for g in gs)
                            for gs in stage_gpus]
    out = []
    for j in range(s.pp):
        if s.virtual_stages > 1:
            st = _interleaved_stage_bytes(spec, s, j, bool(attention_scores[j]))
        else:
            st = _stage_bytes(spec.model.layers[s.partition[j]:s.partition[j + 1]], j, s.pp,
                              s.dp * s.cp, s.tmp, s.mbs, s.gas, s.zero_stage,
                              s.activation_checkpointing, t.precision,
                              bool(attention_scores[j]), s.sequence_parallel,
                              s.selective_recompute, t.backend, s.cp)
        capacity = capacity_bytes[j]
        overhead = t.framework_overhead_bytes + st.buffer_bytes
        peak = (st.parameter_bytes + st.gradient_bytes + st.optimizer_bytes
                + st.activation_bytes + overhead)
        out.append(StageMemory(stage=j, parameter_bytes=st.parameter_bytes,
                               gradient_bytes=st.gradient_bytes,
                               optimizer_bytes=st.optimizer_bytes,
                               activation_bytes=st.activation_bytes, overhead_bytes=overhead,
                               peak_bytes=peak,
                               capacity_bytes=int(capacity * (1.0 - t.memory_headroom))))
    return tuple(out)


def _interleaved_stage_bytes(spec: Spec, s: Strategy, j: int,
                             attention_scores: bool) -> memory_model.StageBytes:
    """Stage j's parts under the interleaved schedule (v > 1, Megatron-LM): the model states
    of all its chunks' layers; the saved activations of the chunk micro-batches it holds at
    once (cost_models.activations.interleaved_saved_activation_bytes: pp + (pp-1)/v micro-batches'
    worth on the first stage with equal chunks) plus the recomputation working set; no
    DeepSpeed pipeline buffers (Megatron sends and frees its outputs)."""
    t = spec.training
    layers = spec.model.layers
    chunks = [layers[a:z] for a, z in s.stage_layer_ranges(j)]
    device = tuple(x for c in chunks for x in c)
    st = _stage_bytes(device, s.pp - 1, s.pp, s.dp * s.cp, s.tmp, s.mbs, s.gas, s.zero_stage,
                      s.activation_checkpointing, t.precision, attention_scores,
                      s.sequence_parallel, s.selective_recompute, t.backend)
    g = t.bytes_per_element
    kw = dict(mbs=s.mbs, tmp=s.tmp, bytes_per_element=g, attention_scores=attention_scores,
              sequence_parallel=s.sequence_parallel, fp8=t.precision == "fp8")
    selective = s.selective_recompute and not s.activation_checkpointing
    per_chunk = [sum(activations.layer_activation_bytes(x, recompute=s.activation_checkpointing,
                                              selective=selective, **kw) for x in c)
                 for c in chunks]
    # one micro-batch in flight (the last stage's count): per-micro-batch bytes + working set
    one = activations.stage_saved_activation_bytes(device, stage=s.pp - 1, pp=s.pp, gas=s.gas,
                                         recompute=s.activation_checkpointing,
                                         selective=s.selective_recompute, **kw)
    act = activations.interleaved_saved_activation_bytes(per_chunk, stage=j, pp=s.pp,
                                                          gas=s.gas) + one - sum(per_chunk)
    act = act // s.cp if s.cp > 1 else act      # a context-parallel rank's s/cp tokens
    return memory_model.StageBytes(parameter_bytes=st.parameter_bytes,
                                   gradient_bytes=st.gradient_bytes,
                                   optimizer_bytes=st.optimizer_bytes,
                                   buffer_bytes=st.buffer_bytes, activation_bytes=int(act))


@lru_cache(maxsize=65536)
def _stage_bytes(layers: tuple[Layer, ...], stage: int, pp: int, dp: int, tmp: int, mbs: int,
                 gas: int, zero_stage: int, recompute: bool, precision: str,
                 attention_scores: bool, sequence_parallel: bool = False,
                 selective: bool = False, backend: str = "deepspeed",
                 cp: int = 1) -> memory_model.StageBytes:
    """One stage's parts, cached: the search asks for the same stage many times (dp: the
    ranks the optimizer states are sharded over, dp x cp)."""
    return memory_model.stage_bytes(layers, stage=stage, pp=pp, dp=dp, tmp=tmp, mbs=mbs, gas=gas,
                         zero_stage=zero_stage, recompute=recompute, precision=precision,
                         attention_scores=attention_scores,
                         sequence_parallel=sequence_parallel, selective=selective,
                         framework=backend, cp=cp)
