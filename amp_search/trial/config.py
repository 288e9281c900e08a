"""The trial config: everything one trial process needs, as one JSON file.

The launcher writes it (`TrialConfig.to_dict()` -> trial.json) and every process of the trial
reads it (`python -m amp_search.trial.run --config trial.json`). Fields:

    layers      the chain, as dicts of cost_models.layers.Layer fields
    strategy    Strategy.to_dict(): pp, dp, tmp, mbs, global_batch_size, partition, placement,
                zero_stage, activation_checkpointing, selective_recompute, sequence_parallel
    ranks       RankAssignment per global rank (stage, replica, tensor, device, host, ...)
    launch_order  launch rank -> global rank (see amp_search.trial.ranks)
    precision   what DeepSpeed trains in: fp32 | bf16 | fp16 (fp16 needs CUDA: on CPU the
                launcher maps fp16 to bf16, the only half precision DeepSpeed's CPU
                accelerator trains in)
    device      cpu (gloo) | cuda (NCCL)
    iters, warmup  AMP times 40 iterations and averages the last 20 (warmup=20)
    seed        seeds weights (per layer, so tmp/pp do not change them) and the synthetic data
    causal      attention mask (GPT true, BERT false)
    output      where global rank 0 writes the result JSON
    ds_config   the DeepSpeed config (also written beside the trial as ds_config.json)
    debug_fail / debug_hang_s   make the process fail / sleep on purpose (launcher tests)
    instruction_trace  each rank also writes its DeepSpeed instruction timings of the timed
                iterations beside the result (amp_search.trial.instructions); default off,
                and only written to trial.json when on
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from cost_models.layers import Layer

from ..errors import UsageError
from ..records import Strategy
from .ranks import RankAssignment, launch_order

if TYPE_CHECKING:
    from ..spec import Spec

DEVICES = ("cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class TrialConfig:
    """One trial: a model, a strategy and where each rank runs."""

    layers: tuple[Layer, ...]
    """The layer chain the partition splits."""
    strategy: Strategy
    ranks: tuple[RankAssignment, ...]
    """Indexed by global rank."""
    launch_order: tuple[int, ...]
    """launch rank -> global rank."""
    precision: str = "fp32"
    """fp32 | bf16 | fp16: what DeepSpeed trains in."""
    device: str = "cpu"
    """cpu | cuda."""
    iters: int = 40
    """Timed iterations in all, warm-up included."""
    warmup: int = 20
    """Leading iterations left out of the mean."""
    seed: int = 1234
    causal: bool = True
    """Causal attention mask (GPT); False for BERT."""
    lr: float = 1e-4
    """Adam learning rate."""
    output: str = "result.json"
    """Path of the result JSON that global rank 0 writes."""
    ds_config: dict = field(default_factory=dict)
    """The DeepSpeed config (see ds_config())."""
    debug_fail: str = ""
    """If set, every process raises RuntimeError(debug_fail) right after start-up."""
    debug_hang_s: float = 0.0
    """If > 0, every process sleeps this long right after start-up."""
    instruction_trace: bool = False
    """Each rank writes the start and end of every DeepSpeed instruction of the timed
    iterations to instructions-rank{g}.json beside `output` (amp_search.trial.instructions)."""

    @property
    def world_size(self) -> int:
        return self.strategy.num_devices

    def to_dict(self) -> dict:
        return {
            "layers": [_layer_dict(x) for x in self.layers],
            "strategy": self.strategy.to_dict(),
            "ranks": [a.to_dict() for a in self.ranks],
            "launch_order": list(self.launch_order),
            "precision": self.precision, "device": self.device,
            "iters": self.iters, "warmup": self.warmup, "seed": self.seed,
            "causal": self.causal, "lr": self.lr, "output": self.output,
            "ds_config": self.ds_config,
            "debug_fail": self.debug_fail, "debug_hang_s": self.debug_hang_s,
            **({"instruction_trace": True} if self.instruction_trace else {}),
        }

    @classmethod
    def from_dict(cls, d: dict) -> "TrialConfig":
        return cls(
            layers=tuple(Layer(**x) for x in d["layers"]),
            strategy=Strategy.from_dict(d["strategy"]),
            ranks=tuple(RankAssignment.from_dict(a) for a in d["ranks"]),
            launch_order=tuple(int(x) for x in d["launch_order"]),
            precision=d["precision"], device=d["device"], iters=int(d["iters"]),
            warmup=int(d["warmup"]), seed=int(d["seed"]), causal=bool(d["causal"]),
            lr=float(d.get("lr", 1e-4)), output=d["output"], ds_config=d.get("ds_config", {}),
            debug_fail=d.get("debug_fail", ""), debug_hang_s=float(d.get("debug_hang_s", 0)),
            instruction_trace=bool(d.get("instruction_trace", False)))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def read(cls, path: Path) -> "TrialConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _layer_dict(layer: Layer) -> dict:
    return {k: getattr(layer, k) for k in Layer.__dataclass_fields__}


def ds_config(strategy: Strategy, *, precision: str, lr: float = 1e-4,
              overlap_comm: bool | None = None, fp32_reduce: bool | None = None) -> dict:
    """The DeepSpeed config of a strategy: batch sizes, ZeRO stage, precision, Adam, and
    `overlap_comm` where the spec sets it (training.overlap_grad_reduce; None: DeepSpeed's
    default, which the cost model follows too; ZeRO 0 has no such setting); with
    `fp32_reduce` (training.grad_reduce_in_fp32 true) communication_data_type fp32.

    Adam runs as torch's (`torch_adam`): DeepSpeed's fused CPU Adam takes 85 s to compile.
    Activation checkpointing is not a ds_config key here: the PipelineModule recomputes each
    block (activation_checkpoint_interval=1 over CHECKPOINTABLE_LAYERS)."""
    return {
        "train_batch_size": strategy.global_batch_size,
        "train_micro_batch_size_per_gpu": strategy.mbs,
        "gradient_accumulation_steps": strategy.gas,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": {"stage": strategy.zero_stage, **(
            {"overlap_comm": bool(overlap_comm)}
            if overlap_comm is not None and strategy.zero_stage > 0 else {})},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 12},
        **({"communication_data_type": "fp32"} if fp32_reduce else {}),
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        # sequence parallelism: stage outputs are already per-rank sequence shards, which
        # DeepSpeed must not split and re-gather over the tensor group as replicated tensors
        **({"pipeline": {"pipe_partitioned": False, "grad_partitioned": False}}
           if strategy.sequence_parallel and strategy.tmp > 1 else {}),
    }


def trial_device(spec: "Spec", strategy: Strategy) -> str:
    """cpu | cuda: the kind of the devices the strategy uses."""
    kinds = {spec.cluster.devices[d].gpu.kind
             for st in strategy.placement for rep in st for d in rep}
    if len(kinds) != 1:
        raise UsageError("a trial cannot mix CPU and GPU devices")
    return "cpu" if kinds == {"cpu"} else "cuda"


def trial_precision(precision: str, device: str) -> str:
    """What the trial trains in: the spec's precision, except fp16 on CPU, which DeepSpeed
    cannot train (its fp16 optimizer needs CUDA): bf16 there."""
    return "bf16" if device == "cpu" and precision == "fp16" else precision


def trial_config(spec: "Spec", strategy: Strategy, ranks: tuple[RankAssignment, ...], *,
                 iters: int, warmup: int, seed: int, output: str, debug_fail: str = "",
                 debug_hang_s: float = 0.0) -> TrialConfig:
    """The trial config of `strategy` on `spec`'s cluster, its DeepSpeed config included: the
    one function both `amp-search launch` (each trial's trial.json and ds_config.json) and
    `amp-search export --format deepspeed` build it with, so what is exported is what was
    measured."""
    device = trial_device(spec, strategy)
    precision = trial_precision(spec.training.precision, device)
    return TrialConfig(layers=spec.model.layers, strategy=strategy, ranks=ranks,
                       launch_order=launch_order(ranks), precision=precision, device=device,
                       iters=iters, warmup=warmup, seed=seed,
                       causal=spec.model.preset != "bert", output=output,
                       ds_config=ds_config(strategy, precision=precision,
                                           overlap_comm=spec.training.overlap_grad_reduce,
                                           fp32_reduce=spec.training.grad_reduce_in_fp32),
                       debug_fail=debug_fail, debug_hang_s=debug_hang_s)


def trial_env(device: str, backend: str, pythonpath: str = "") -> dict:
    """The environment variables every trial process gets (launch and export alike):
    one OpenMP thread per process, unbuffered output, DeepSpeed's accelerator, and for
    Megatron-LM one CUDA connection (it orders its tensor-parallel communication on it);
    PYTHONPATH when `pythonpath` is given."""
    env = {"OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "DS_ACCELERATOR": device}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    if backend == "megatron":
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    return env
