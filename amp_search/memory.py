"""Peak memory of every device of a strategy (issue 3): the planner's out-of-memory check.

    stage_memory(spec, strategy) -> (StageMemory per pipeline stage)

For each stage j the most loaded device is reported (tensor ranks hold equal shards; among the
data-parallel ranks ZeRO 1/2 load most the one whose slice touches the most whole parameters,
which cost_models.memory counts), with the usable capacity of the stage's *smallest* device:
memory x (1 - training.memory_headroom).

    peak = parameters + gradients + optimizer states          (cost_models.memory, by ZeRO stage)
         + activations: saved for backward by the micro-batches in flight under 1F1B, the
           recomputation working set, the pipeline engine's output buffers   (activation_bytes)
         + training.framework_overhead_bytes + DeepSpeed's ZeRO gradient bucket (overhead_bytes)

Each part is at its own largest, so the sum bounds the real peak from above. DeepSpeed's bucket
sizes are its defaults (cost_models.memory.DEEPSPEED_DEFAULT_BUCKETS), which is what the trial
runner's ds_config leaves them at.

Strategies whose peak exceeds the capacity are pruned by the search under OUT_OF_MEMORY.
"""
from __future__ import annotations

from functools import lru_cache

from cost_models import memory as M
from cost_models.layers import Layer

from .records import StageMemory, Strategy
from .spec import Spec

OUT_OF_MEMORY = "out_of_memory"
"""The prune reason the search counts strategies that do not fit under."""

__all__ = ["OUT_OF_MEMORY", "stage_memory", "prune_reason", "zero_allowed"]


def zero_allowed(pp: int, zero_stage: int) -> bool:
    """DeepSpeed's pipeline engine rejects ZeRO 2 and 3 (runtime/pipe/engine.py asserts
    `zero_optimization_stage() < ZeroStageEnum.gradients`), so they need pp = 1."""
    return M.zero_allowed(pp, zero_stage)


def stage_memory(spec: Spec, strategy: Strategy) -> tuple[StageMemory, ...]:
    """Predicted peak memory of the most loaded device of each pipeline stage."""
    t = spec.training
    s = strategy
    devices = spec.cluster.devices
    out = []
    for j in range(s.pp):
        st = _stage_bytes(spec.model.layers[s.partition[j]:s.partition[j + 1]], j, s.pp, s.dp,
                          s.tmp, s.mbs, s.gas, s.zero_stage, s.activation_checkpointing,
                          t.precision)
        capacity = min(devices[d].gpu.memory_bytes for replica in s.placement[j]
                       for d in replica)
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


def prune_reason(memory: tuple[StageMemory, ...]) -> str | None:
    """OUT_OF_MEMORY when some stage's peak exceeds its capacity, else None."""
    return None if all(m.fits for m in memory) else OUT_OF_MEMORY


@lru_cache(maxsize=65536)
def _stage_bytes(layers: tuple[Layer, ...], stage: int, pp: int, dp: int, tmp: int, mbs: int,
                 gas: int, zero_stage: int, recompute: bool, precision: str) -> M.StageBytes:
    """One stage's parts, cached: the search asks for the same stage many times."""
    return M.stage_bytes(layers, stage=stage, pp=pp, dp=dp, tmp=tmp, mbs=mbs, gas=gas,
                         zero_stage=zero_stage, recompute=recompute, precision=precision)
