"""The training framework's own fixed costs, measured with real trials.

A layer profile times each layer's forward and backward alone. A DeepSpeed iteration also
runs the engine's own work: per micro-batch its forward/backward/step calls, hooks and
gradient-accumulation bookkeeping and the data loader; per iteration the optimizer step's
bookkeeping (timers, loss scaling, ZeRO's flat buffers, barriers). On the 2-core CPU machine
this was 15-80 ms per iteration: the difference between a plan that ranks the trials and
one that does not. Lin et al. 2024 (seed 003) show the same fixed costs dominate
GPU iterations at small micro-batches.

So `amp-search profile` ends by running the trial program (amp_search.trial.run, the one
every trial runs) on the spec's own model twice, with all of one node's devices busy as in
a trial: pp 1, dp = the node's devices, tmp 1, micro-batch 1, ZeRO 0, no recomputation, with
1 and with `PROBE_GAS` micro-batches per iteration. Each trial's measured time less the cost
model's prediction from the fresh layer profile (no overheads, no calibration) is its
residual r(gas) = step_overhead + gas * microbatch_overhead; the two residuals give both
(least squares when there are more, each clamped at 0). They are stored in the layer profile
(`FrameworkOverheads`) and used by the cost model whenever there is no calibration: the
per-micro-batch cost spread evenly over the model's layers (`CostParams.layer_overhead_s`,
since the engine's work per micro-batch is per module and parameter: a pipeline stage pays for
the layers it holds; on CPU trials pp 2 stages showed about half the pp 1 cost) and
`step_overhead_s`.

ZeRO stages 1-3 run their own bookkeeping on top (gradient buckets copied and reduced per
partition, the partitioned step's copies, the weights' all-gather): on the CPU machine ZeRO 1
cost ~30 ms per iteration and ZeRO 2 ~29 ms per micro-batch more than the model priced, and the
plan ranked them too high. So where the spec searches a stage s in 1-3 and the node has two
or more devices, the same two trials run at stage s too; r_s(gas) - r_0(gas) is that stage's
own cost, fitted the same way and stored per parameter a device holds (`ZeroOverheads`):
`CostParams.zero_microbatch_s_per_param` in each micro-batch's backward,
`zero_step_s_per_param` once per iteration. The probe runs pp 1 with dp = the node's
devices; other dp, pipelines (ZeRO 1 with pp > 1) and tmp > 1 are priced by the parameters a
device holds, an extrapolation. DeepSpeed's costs: a Megatron-LM plan does not take them.

DeepSpeed's pipeline engine (pp > 1) runs its own schedule and, at dp 1, no gradient
reduction: on the CPU machine a pp 2 pipeline cost 8.5 ms per iteration where pp 1 dp 2 cost
19.5. So where the node has two or more devices, the model also runs as a pipeline of all of
them (dp 1, pp and 8 pp micro-batches), last; its residuals are fitted against the
whole-model micro-batches of per-layer cost the model puts on that pipeline's critical path
(`OverheadProbe.microbatches_on_path`, the model's slope in `layer_overhead_s`), and pp > 1
is priced with them (`CostParams.pipeline_*_delta_s`; the per-iteration one only at dp 1,
where there is no gradient reduction to account for).

What it cannot see: overheads that grow with the strategy beyond these (more tensor-parallel
calls, other dp): those stay in the calibration's reach (`amp-search calibrate`).
"""
from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np

from cost_models.layers import param_count

from ..errors import UsageError
from ..spec import Spec

if TYPE_CHECKING:
    from ..records import Strategy
from .store import (FrameworkOverheads, LayerProfile, OverheadProbe, ZeroOverheads,
                    now_iso)

PROBE_GAS = (1, 8)
"""Micro-batches per iteration of the probe trials: one, and enough to separate the
per-micro-batch cost from the per-iteration one."""
UNIT_S = 1e-4
"""The per-layer cost the probes' critical path is read off with (its slope at no cost)."""
PIPELINE_KIND = "the pipeline engine"
"""How `on_skip` names the pipeline engine's probes (a ZeRO stage's: "ZeRO 2")."""
PROBE_ITERS = 24
PROBE_WARMUP = 8
"""Iterations per probe trial and how many lead-in ones are left out of the mean."""


def overheads_from_residuals(gas: list[int] | np.ndarray,
                             residual_s: list[float] | np.ndarray) -> tuple[float, float]:
    """(microbatch_overhead_s, step_overhead_s): the least-squares line residual = step +
    gas * microbatch through the points, neither below 0 (a negative fixed cost means the
    layer profile over-predicts; the overhead is then taken as none rather than a credit):
    where one comes out negative it is 0 and the other is fitted again alone. Needs at least
    two distinct gas."""
    g = np.asarray(gas, dtype=float)
    r = np.asarray(residual_s, dtype=float)
    if g.shape != r.shape or len(np.unique(g)) < 2:
        raise ValueError("need residuals at two or more distinct micro-batch counts")
    slope, intercept = np.polyfit(g, r, 1)
    if slope < 0:                           # no per-micro-batch cost: a constant
        return 0.0, max(0.0, float(np.mean(r)))
    if intercept < 0:                       # no per-iteration cost: a line through 0
        return max(0.0, float(g @ r / (g @ g))), 0.0
    return float(slope), float(intercept)


def zero_overheads(zero_stage: int, stage0: list[OverheadProbe], probes: list[OverheadProbe],
                   params_per_device: int) -> ZeroOverheads:
    """A ZeRO stage's own cost from its probes and stage 0's at the same micro-batch counts:
    the line through r_stage(gas) - r_0(gas) (`overheads_from_residuals`, clamped at 0),
    per parameter a device held."""
    r0 = {p.gas: p.residual_s for p in stage0}
    extra = [(p.gas, p.residual_s - r0[p.gas]) for p in probes if p.gas in r0]
    microbatch, step = overheads_from_residuals([g for g, _ in extra], [r for _, r in extra])
    n = max(int(params_per_device), 1)
    return ZeroOverheads(zero_stage=zero_stage, microbatch_s_per_param=microbatch / n,
                         step_s_per_param=step / n, params_per_device=n, probes=tuple(probes))


def model_params(spec: Spec) -> int:
    """Parameters of the whole model: what each probe device holds (pp 1, tmp 1)."""
    return int(sum(param_count(layer, 1) for layer in spec.model.layers))


def probe_node(spec: Spec, device_name: str) -> str:
    """'' when the probe trials can run for `spec` on this machine, else why not."""
    if len(spec.cluster.nodes) != 1:
        return (f"the spec has {len(spec.cluster.nodes)} nodes; the probe runs one node's "
                f"trials locally (profile with a one-node spec of this machine)")
    node = spec.cluster.nodes[0]
    if node.gpu.name != device_name:
        return f"the spec's node is {node.gpu.name}, not {device_name}"
    if any(x.kind == "custom" for x in spec.model.layers):
        return "the model has custom layers, which trials cannot run"
    return ""


def probe_zero_stages(spec: Spec) -> tuple[int, ...]:
    """The ZeRO stages beyond 0 whose own cost the probe measures: those the spec searches,
    where the node has two or more devices (ZeRO partitions over data-parallel ranks) and the
    backend is DeepSpeed (Megatron's distributed optimizer is not what the probe runs)."""
    if spec.training.backend != "deepspeed" or len(spec.cluster.nodes[0].devices) < 2:
        return ()
    return tuple(sorted(z for z in set(spec.training.zero_stage) if z > 0))


def probe_strategies(spec: Spec, zero_stage: int = 0) -> list[tuple[Spec, "Strategy"]]:
    """The probe trials at `zero_stage`: (the spec with the probe's global batch, strategy)
    per gas."""
    from ..records import Strategy

    devices = tuple(spec.cluster.nodes[0].devices)
    n_dp = len(devices)
    out = []
    for gas in PROBE_GAS:
        gbs = n_dp * gas
        probe_spec = dataclasses.replace(
            spec, training=dataclasses.replace(spec.training, global_batch_size=gbs))
        s = Strategy(pp=1, dp=n_dp, tmp=1, mbs=1, global_batch_size=gbs,
                     partition=(0, len(spec.model.layers)),
                     placement=(tuple((d,) for d in devices),), placement_order="listed",
                     zero_stage=zero_stage, activation_checkpointing=False)
        out.append((probe_spec, s))
    return out


def pipeline_probe_strategies(spec: Spec) -> list[tuple[Spec, "Strategy"]]:
    """The pipeline engine's probe trials: every device of the node a stage of one replica
    (pp = the node's devices, dp 1, tmp 1, micro-batch 1, Megatron's uniform split), with
    PROBE_GAS x pp micro-batches; none where the node has one device, the model fewer blocks
    than devices, or the backend is not DeepSpeed."""
    from ..partition import uniform_partition
    from ..records import Strategy

    devices = tuple(spec.cluster.nodes[0].devices)
    n, layers = len(devices), spec.model.layers
    first, last = spec.model.ends
    if spec.training.backend != "deepspeed" or n < 2 or len(layers) - first - last < n:
        return []
    partition = uniform_partition(len(layers), n, first=first, last=last)
    out = []
    for k in PROBE_GAS:
        gas = n * k
        probe_spec = dataclasses.replace(
            spec, training=dataclasses.replace(spec.training, global_batch_size=gas))
        out.append((probe_spec, Strategy(
            pp=n, dp=1, tmp=1, mbs=1, global_batch_size=gas, partition=partition,
            placement=tuple(((d,),) for d in devices), placement_order="listed",
            zero_stage=0, activation_checkpointing=False)))
    return out


def measure_framework_overheads(spec: Spec, profile: LayerProfile, *, measurements,
                                runs_dir: Path | None = None, progress: bool = False,
                                base_env: dict | None = None,
                                on_probe: Callable[[OverheadProbe], None] | None = None,
                                on_skip: Callable[[str, str], None] | None = None,
                                iters: int = PROBE_ITERS,
                                warmup: int = PROBE_WARMUP) -> FrameworkOverheads:
    """Run the probe trials (DeepSpeed, local launcher) and fit the overheads.

    `measurements`: the link profile etc. to predict with (amp_search.measurements); its
    calibration is ignored and `profile` replaces its layer profile for this device.
    Ctrl-C stops the running trial (the launcher reaps it) and re-raises while stage 0's
    probes run; during the pipeline engine's or a ZeRO stage's probes it ends the probing there
    and returns what is done, and one whose probe trial fails is left out; `on_skip(what,
    why)` hears of either ("the pipeline engine", "ZeRO 2")."""
    from types import MappingProxyType

    from cost_models.params import CostParams

    from ..launch import LaunchOptions, run_trials
    from ..planner import evaluate

    why = probe_node(spec, profile.device)
    if why:
        raise UsageError(f"cannot measure framework overheads: {why}")
    layers = dict(measurements.layer_profiles)
    layers[profile.device] = profile
    meas = dataclasses.replace(measurements, layer_profiles=MappingProxyType(layers),
                               calibration=None, calibration_source="uncalibrated")
    n_layers = len(spec.model.layers)

    def probe(probe_spec: Spec, s, tmp: str) -> OverheadProbe:
        # a database per probe: the results key is the strategy's label and the spec's
        # text, which the probes of one kind share
        options = LaunchOptions(backend="deepspeed", launcher="local", iters=iters,
                                warmup=warmup, progress=progress,
                                results_path=Path(tmp) / f"probe-pp{s.pp}-z{s.zero_stage}"
                                                         f"-gas{s.gas}.sqlite",
                                runs_dir=Path(runs_dir) if runs_dir is not None else Path(tmp),
                                base_env=dict(base_env or {}))
        bare = evaluate(probe_spec, s, measurements=meas, cost_params=CostParams())
        unit = evaluate(probe_spec, s, measurements=meas,
                        cost_params=CostParams(layer_overhead_s=UNIT_S))
        (rec,) = run_trials(probe_spec, [s], options)
        if rec.status != "ok" or rec.measured_s is None:
            raise UsageError(f"the framework-overhead probe trial {rec.label} ended "
                             f"{rec.status}: {rec.error or rec.log_tail[-300:]}")
        # how many whole-model micro-batches of per-layer cost the critical path holds
        # (gas at pp 1; (gas + pp - 1) / pp in a pipeline of equal stages)
        passes = (unit.iteration_time_s - bare.iteration_time_s) / (UNIT_S * n_layers)
        return OverheadProbe(label=rec.label, gas=s.gas, measured_s=rec.measured_s,
                             predicted_s=float(bare.iteration_time_s),
                             other_processes_cores=rec.other_processes_cores,
                             microbatches_on_path=float(passes))

    # the kinds of probe: ZeRO stage 0, the others searched, then (None) the pipeline engine
    kinds = [(0, probe_strategies(spec, 0)),
             *((z, probe_strategies(spec, z)) for z in probe_zero_stages(spec)),
             (None, pipeline_probe_strategies(spec))]
    done: dict[int | None, list[OverheadProbe]] = {}
    with tempfile.TemporaryDirectory(prefix="amp-search-overheads-") as tmp:
        for zero, strategies in kinds:
            if not strategies:
                continue
            got = []
            try:
                for probe_spec, s in strategies:
                    got.append(probe(probe_spec, s, tmp))
                    if on_probe is not None:
                        on_probe(got[-1])
            except (KeyboardInterrupt, UsageError) as exc:
                if zero == 0:
                    raise
                # stage 0 and the kinds done stand; this one (and after Ctrl-C the later
                # ones) is not measured, and priced as if it cost what stage 0 / pp 1 does
                if on_skip is not None:
                    on_skip(PIPELINE_KIND if zero is None else f"ZeRO {zero}",
                            "interrupted" if isinstance(exc, KeyboardInterrupt) else str(exc))
                if isinstance(exc, KeyboardInterrupt):
                    break
                continue
            done[zero] = got
    probes = done.pop(0)
    microbatch, step = overheads_from_residuals([p.gas for p in probes],
                                                [p.residual_s for p in probes])
    pipeline = done.pop(None, None)
    pipe_mb = pipe_step = None
    if pipeline is not None:
        try:
            pipe_mb, pipe_step = overheads_from_residuals(
                [p.microbatches_on_path for p in pipeline], [p.residual_s for p in pipeline])
        except ValueError:      # the model puts no per-layer cost on its path: nothing to fit
            if on_skip is not None:
                on_skip(PIPELINE_KIND, "its critical path holds no per-layer cost in the "
                                       "model")
            pipeline = None
    params = model_params(spec)
    zero = tuple(zero_overheads(z, probes, zp, params) for z, zp in sorted(done.items()))
    return FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=microbatch,
                              step_overhead_s=step, layers=n_layers,
                              zero=zero, pipeline_microbatch_overhead_s=pipe_mb,
                              pipeline_step_overhead_s=pipe_step,
                              pipeline_probes=tuple(pipeline or ()),
                              probes=tuple(probes), created=now_iso())