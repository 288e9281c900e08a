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
megatron_model_state_bytes) and there is no DeepSpeed bucket. With 16-bit gradients its
optimizer copies them to fp32 for the step (step_bytes, 4 bytes per parameter it updates) and
frees the copies before the next forward: the peak takes the larger of them and the
activations, which are freed by then.

Each part is at its own largest, so the sum bounds the real peak from above. DeepSpeed's bucket
sizes are its defaults (cost_models.memory.DEEPSPEED_DEFAULT_BUCKETS), which is what the trial
runner's ds_config leaves them at.

Strategies whose peak exceeds the capacity are pruned by the search under
search_space.Reason.OUT_OF_MEMORY.
"""
from __future__ import annotations

from dataclasses import replace

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
    s = strategy
    devices = spec.cluster.devices
    if capacity_bytes is None or attention_scores is None:
        stage_gpus = [{devices[d].gpu.name: devices[d].gpu for replica in s.placement[j]
                       for d in replica}.values() for j in range(s.pp)]
        capacity_bytes = [min(g.memory_bytes for g in gs) for gs in stage_gpus]
        attention_scores = [any(spec.attention_for(g) == "standard" for g in gs)
                            for gs in stage_gpus]
    return tuple(_one_stage(spec, s, j, capacity_bytes[j], attention_scores[j])
                 for j in range(s.pp))


def stages_fit(spec: Spec, strategy: Strategy, capacity_bytes, attention_scores) -> bool:
    """Whether every stage of `stage_memory` fits, the stages looked at in order until one
    does not (the first stage holds the most micro-batches in flight)."""
    return all(_one_stage(spec, strategy, j, capacity_bytes[j], attention_scores[j]).fits
               for j in range(strategy.pp))


def _one_stage(spec: Spec, s: Strategy, j: int, capacity, attention_scores) -> StageMemory:
    """Stage j of `stage_memory`."""
    t = spec.training
    if s.virtual_stages > 1:
        st = _interleaved_stage_bytes(spec, s, j, bool(attention_scores))
    else:
        st = _stage_bytes(spec.model.layers, ((s.partition[j], s.partition[j + 1]),), j,
                          s.pp, s.replicas, s.tmp, s.mbs, s.gas, s.zero_stage,
                          s.activation_checkpointing, t.precision,
                          bool(attention_scores), s.sequence_parallel,
                          t.selective(s.selective_recompute), t.backend, s.cp, s.ep,
                          grad_fp32=t.grad_reduce_in_fp32)
    if t.cpu_offload_layers and s.pp == 1:     # the offloaded blocks' activations on the host
        st = replace(st, activation_bytes=st.activation_bytes - offloaded_bytes(
            spec, s, bool(attention_scores)) // s.cp)
    if t.frozen_weights:                # no gradients or optimizer state
        st = memory_model.frozen_states(st)
    overhead = t.framework_overhead_bytes + st.buffer_bytes
    # the optimizer step's transient copies exist while no activations do
    peak = (st.parameter_bytes + st.gradient_bytes + st.optimizer_bytes
            + max(st.activation_bytes, st.step_bytes) + overhead)
    return StageMemory(stage=j, parameter_bytes=st.parameter_bytes,
                       gradient_bytes=st.gradient_bytes, optimizer_bytes=st.optimizer_bytes,
                       activation_bytes=st.activation_bytes, overhead_bytes=overhead,
                       step_bytes=st.step_bytes, peak_bytes=peak,
                       capacity_bytes=int(capacity * (1.0 - t.memory_headroom)))


def offloaded_layers(spec: Spec) -> tuple[int, ...]:
    """Indices of the transformer blocks training.cpu_offload_layers offloads: the first N
    (megatron-core's TransformerBlock offloads its first cpu_offloading_num_layers)."""
    blocks = [i for i, x in enumerate(spec.model.layers) if x.kind == "transformer"]
    return tuple(blocks[:spec.training.cpu_offload_layers])


def offloaded_saved_bytes(spec: Spec, *, mbs: int, tmp: int, sequence_parallel: bool,
                          attention_scores: bool) -> list[int]:
    """One micro-batch's saved activations of each offloaded block (`offloaded_layers`), on
    one device (before context parallelism's split)."""
    t = spec.training
    return [activations.layer_activation_bytes(
        spec.model.layers[i], mbs=mbs, tmp=tmp,
        bytes_per_element=memory_model.BYTES_PER_ELEMENT[t.precision], recompute=False,
        attention_scores=attention_scores, sequence_parallel=sequence_parallel,
        fp8=t.precision in ("fp8", "nvfp4")) for i in offloaded_layers(spec)]


def offloaded_bytes(spec: Spec, s: Strategy, attention_scores: bool) -> int:
    """The activation bytes CPU offloading takes off the device
    (activations.offloaded_activation_bytes of `offloaded_saved_bytes`)."""
    return activations.offloaded_activation_bytes(offloaded_saved_bytes(
        spec, mbs=s.mbs, tmp=s.tmp, sequence_parallel=s.sequence_parallel,
        attention_scores=attention_scores))


def _interleaved_stage_bytes(spec: Spec, s: Strategy, j: int,
                             attention_scores: bool) -> memory_model.StageBytes:
    """Stage j's parts under the interleaved schedule (v > 1, Megatron-LM): the model states
    of all its chunks' layers; the saved activations of the chunk micro-batches it holds at
    once (cost_models.activations.interleaved_saved_activation_bytes: pp + (pp-1)/v micro-batches'
    worth on the first stage with equal chunks) plus the recomputation working set; no
    DeepSpeed pipeline buffers (Megatron sends and frees its outputs)."""
    t = spec.training
    layers = spec.model.layers
    ranges = s.stage_layer_ranges(j)
    st = _stage_bytes(layers, ranges, s.pp - 1, s.pp, s.replicas, s.tmp, s.mbs, s.gas,
                      s.zero_stage, s.activation_checkpointing, t.precision, attention_scores,
                      s.sequence_parallel, t.selective(s.selective_recompute), t.backend,
                      ep=s.ep, grad_fp32=t.grad_reduce_in_fp32)
    per_chunk, one = _chunk_activations(
        layers, ranges, s.mbs, s.tmp, t.bytes_per_element, attention_scores,
        s.sequence_parallel, t.precision in ("fp8", "nvfp4"), s.activation_checkpointing,
        t.selective(s.selective_recompute))
    act = activations.interleaved_saved_activation_bytes(per_chunk, stage=j, pp=s.pp,
                                                          gas=s.gas) + one - sum(per_chunk)
    act = act // s.cp if s.cp > 1 else act      # a context-parallel rank's s/cp tokens
    return replace(st, activation_bytes=int(act))


_MODEL_CACHES: dict[int, tuple[tuple, dict]] = {}
"""id(model layers) -> (the layers, {key: value}): per model, the stage terms the search asks
for again and again, keyed by small tuples of numbers (hashing a hundred layers per lookup
cost more than the terms). The entry holds the layers, so their id is not reused while it
lives."""
MAX_CACHED_MODELS = 8
MAX_CACHED_TERMS = 200_000


def _memo(layers: tuple[Layer, ...], key: tuple, compute):
    """compute(), cached per model (`_MODEL_CACHES`) under `key`."""
    entry = _MODEL_CACHES.get(id(layers))
    if entry is None or entry[0] is not layers:
        if len(_MODEL_CACHES) >= MAX_CACHED_MODELS:
            _MODEL_CACHES.clear()
        entry = _MODEL_CACHES[id(layers)] = (layers, {})
    cache = entry[1]
    hit = cache.get(key)
    if hit is None:
        if len(cache) >= MAX_CACHED_TERMS:
            cache.clear()
        hit = cache[key] = compute()
    return hit


def _composition(layers: tuple[Layer, ...], ranges: tuple[tuple[int, int], ...]) -> tuple:
    """What a device's layer `ranges` hold, as runs of equal layers: ((kind id, count), ...)
    per range, a kind being a layer signature (equal signatures cost the same, whatever the
    layer's name or place). Stages of equal composition have equal memory terms, so the
    terms are cached under it: a 16-block stage is computed once, wherever it sits."""
    runs = _memo(layers, ("runs",), lambda: _runs(layers))
    out = []
    for a, z in ranges:
        part = []
        for start, end, kind in runs:
            if end <= a:
                continue
            if start >= z:
                break
            part.append((kind, min(end, z) - max(start, a)))
        out.append(tuple(part))
    return tuple(out)


def _runs(layers: tuple[Layer, ...]) -> tuple[tuple[int, int, int], ...]:
    """(start, end, kind id) of each run of layers with equal signatures."""
    kinds: dict[str, int] = {}
    runs: list[list[int]] = []
    for i, layer in enumerate(layers):
        kind = kinds.setdefault(layer.signature, len(kinds))
        if runs and runs[-1][2] == kind:
            runs[-1][1] = i + 1
        else:
            runs.append([i, i + 1, kind])
    return tuple(tuple(r) for r in runs)


def _chunk_activations(layers: tuple[Layer, ...], ranges: tuple[tuple[int, int], ...],
                       mbs: int, tmp: int, g: int, attention_scores: bool,
                       sequence_parallel: bool, fp8: bool, recompute: bool,
                       selective_recompute: bool | tuple) -> tuple[tuple[int, ...], int]:
    """One device's chunks (layer `ranges`) under the interleaved schedule: each chunk's saved
    activations of one micro-batch, and one micro-batch of all of them with the
    recomputation working set (the last stage's count, one in flight); cached, as every
    data-parallel degree of the search asks for the same chunks."""
    args = (ranges, mbs, tmp, g, attention_scores, sequence_parallel, fp8, recompute,
            selective_recompute)
    return _memo(layers, ("chunks",) + args, lambda: _chunk_activation_terms(layers, *args))


def _chunk_activation_terms(layers, ranges, mbs, tmp, g, attention_scores, sequence_parallel,
                            fp8, recompute, selective_recompute):
    """`_chunk_activations`' terms, each chunk's and the device's layers taken as runs of
    equal layers (`_held_runs`: the same integer sums, a call per run instead of per layer);
    `one` is activations.stage_saved_activation_bytes of the device's layers (stage 0 of
    one, a single micro-batch in flight)."""
    kw = dict(mbs=mbs, tmp=tmp, bytes_per_element=g, attention_scores=attention_scores,
              sequence_parallel=sequence_parallel, fp8=fp8)
    selective = False if recompute else selective_recompute
    chunk_runs = [_held_runs(layers, ((a, z),)) for a, z in ranges]
    per_chunk = tuple(sum(n * activations.layer_activation_bytes(x, recompute=recompute,
                                                                 selective=selective, **kw)
                          for x, n in runs) for runs in chunk_runs)
    terms = activations.activation_terms_of_runs(
        tuple(run for runs in chunk_runs for run in runs), recompute=recompute,
        selective=selective_recompute, **kw)
    one = activations.stage_activation_bytes(terms, stage=0, pp=1, gas=1, pipelined=False)
    return per_chunk, one


def _held_runs(layers: tuple[Layer, ...], ranges: tuple[tuple[int, int], ...]
               ) -> tuple[tuple[Layer, int], ...]:
    """The layers in `ranges`, in order, as (layer, count) runs of equal signatures (the
    first layer of each run within its range standing for the run): what
    activations.activation_terms_of_runs takes."""
    runs = _memo(layers, ("runs",), lambda: _runs(layers))
    out = []
    for a, z in ranges:
        for start, end, _ in runs:
            if end <= a:
                continue
            if start >= z:
                break
            first = max(start, a)
            out.append((layers[first], min(end, z) - first))
    return tuple(out)


def _stage_bytes(layers: tuple[Layer, ...], ranges: tuple[tuple[int, int], ...], stage: int,
                 pp: int, dp: int, tmp: int, mbs: int, gas: int, zero_stage: int,
                 recompute: bool, precision: str, attention_scores: bool,
                 sequence_parallel: bool = False, selective: bool | tuple = False,
                 backend: str = "deepspeed", cp: int = 1,
                 ep: int = 1, grad_fp32: bool | None = None) -> memory_model.StageBytes:
    """The parts of one device holding the model's layers in `ranges` (dp: the ranks the
    optimizer states are sharded over, dp x cp; ep: the expert-parallel degree): its model
    states and activation terms are cached per composition of layers (`_composition`), as
    the search asks for the same stages many times and most stages of a pipeline hold equal
    blocks; only the stage's place (micro-batches in flight, buffers) is applied per call."""
    comp = _composition(layers, ranges)

    def held() -> tuple[Layer, ...]:
        return tuple(x for a, z in ranges for x in layers[a:z])

    states = _memo(layers, ("states", comp, dp, tmp, gas, zero_stage, precision, backend, ep,
                            grad_fp32),
                   lambda: memory_model.stage_state_bytes(
                       held(), dp=dp, tmp=tmp, gas=gas, zero_stage=zero_stage,
                       precision=precision, framework=backend, ep=ep, grad_fp32=grad_fp32))
    terms = _memo(layers, ("activations", comp, mbs, tmp, recompute, precision,
                           attention_scores, sequence_parallel, selective),
                  lambda: activations.activation_terms_of_runs(
                      _held_runs(layers, ranges), mbs=mbs, tmp=tmp,
                      bytes_per_element=memory_model.BYTES_PER_ELEMENT[precision],
                      recompute=recompute, attention_scores=attention_scores,
                      sequence_parallel=sequence_parallel, selective=selective,
                      fp8=precision in ("fp8", "nvfp4")))
    return memory_model.stage_bytes_of(states, terms, stage=stage, pp=pp, gas=gas,
                                       zero_stage=zero_stage, cp=cp)
