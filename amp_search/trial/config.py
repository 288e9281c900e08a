"""The trial config: everything one trial process needs, as one JSON file.

The launcher writes it (`TrialConfig.to_dict()` -> trial.json) and every process of the trial
reads it (`python -m amp_search.trial.run --config trial.json`). Fields:

    layers      the chain, as dicts of cost_models.layers.Layer fields
    strategy    Strategy.to_dict(): pp, dp, tmp, mbs, global_batch_size, partition, placement,
                zero_stage, activation_checkpointing
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
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cost_models.layers import Layer

from ..records import Strategy
from .ranks import RankAssignment

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
            debug_fail=d.get("debug_fail", ""), debug_hang_s=float(d.get("debug_hang_s", 0)))

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def read(cls, path: Path) -> "TrialConfig":
        return cls.from_dict(json.loads(Path(path).read_text()))


def _layer_dict(layer: Layer) -> dict:
    return {k: getattr(layer, k) for k in Layer.__dataclass_fields__}


def ds_config(strategy: Strategy, *, precision: str, lr: float = 1e-4) -> dict:
    """The DeepSpeed config of a strategy: batch sizes, ZeRO stage, precision, Adam.

    Adam runs as torch's (`torch_adam`): DeepSpeed's fused CPU Adam takes 85 s to compile.
    Activation checkpointing is not a ds_config key here: the PipelineModule recomputes each
    block (activation_checkpoint_interval=1 over CHECKPOINTABLE_LAYERS)."""
    return {
        "train_batch_size": strategy.global_batch_size,
        "train_micro_batch_size_per_gpu": strategy.mbs,
        "gradient_accumulation_steps": strategy.gas,
        "optimizer": {"type": "Adam", "params": {"lr": lr, "torch_adam": True}},
        "zero_optimization": {"stage": strategy.zero_stage},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16", "initial_scale_power": 12},
        "gradient_clipping": 1.0,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
    }
