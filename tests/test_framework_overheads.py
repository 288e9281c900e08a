"""The framework's fixed costs: the fit of probe residuals, storage in the layer profile, their
use by the cost model when there is no calibration, and the real probe trials on CPU."""
from __future__ import annotations

import dataclasses
import json

import pytest

from amp_search.measurements import Measurements
from amp_search.costing import CostModel, measured_overheads
from amp_search.planner import estimate
from amp_search.profiling.framework import (PROBE_GAS, overheads_from_residuals, probe_node,
                                            probe_strategies)
from amp_search.profiling.store import FrameworkOverheads, LayerProfile, OverheadProbe
from conftest import TINY_CPU_SPEC, tiny_cpu_spec, uniform_profile
from cost_models.params import CostParams

TINY = TINY_CPU_SPEC
_spec = tiny_cpu_spec


def _profile(spec, overheads=None):
    return uniform_profile(spec, framework_overheads=overheads)


def test_residual_line_is_recovered_exactly():
    mb, step = overheads_from_residuals([1, 8], [0.040 + 0.018, 0.040 + 8 * 0.018])
    assert mb == pytest.approx(0.018)
    assert step == pytest.approx(0.040)
    # three points: least squares
    mb, step = overheads_from_residuals([1, 4, 8], [0.05, 0.08, 0.12])
    assert mb == pytest.approx(0.01, abs=1e-3) and step == pytest.approx(0.04, abs=2e-3)


def test_negative_fixed_costs_are_clamped():
    # residual falls with gas: no per-micro-batch cost, the mean residual is per iteration
    mb, step = overheads_from_residuals([1, 8], [0.10, 0.03])
    assert mb == 0.0 and step == pytest.approx(0.065)
    # the layer profile over-predicts everything: no overhead at all, never a credit
    assert overheads_from_residuals([1, 8], [-0.02, -0.01]) == (0.0, 0.0)
    # a negative intercept: no per-iteration cost, the per-micro-batch one fitted through 0
    mb, step = overheads_from_residuals([1, 8], [0.0252, 0.2267])
    assert step == 0.0 and mb == pytest.approx((0.0252 + 8 * 0.2267) / 65)
    with pytest.raises(ValueError):
        overheads_from_residuals([8, 8], [0.1, 0.2])


def test_overheads_round_trip_in_the_layer_profile(tmp_path):
    spec = _spec(tmp_path)
    fw = FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=0.018,
                            step_overhead_s=0.04, layers=4, created="2026-11-22T00:00:00+00:00",
                            probes=(OverheadProbe(label="pp1-dp2-tmp1-mbs1-z0", gas=1,
                                                  measured_s=0.2, predicted_s=0.142,
                                                  other_processes_cores=0.01),))
    path = _profile(spec, fw).save(tmp_path / "p.json")
    back = LayerProfile.load(path)
    assert back.framework_overheads == fw
    assert back.framework_overheads.probes[0].residual_s == pytest.approx(0.058)
    # older files without the key still load, without overheads
    d = json.loads(path.read_text())
    del d["framework_overheads"]
    assert LayerProfile.from_dict(d).framework_overheads is None


def test_cost_model_adds_measured_overheads_unless_calibrated(tmp_path):
    spec = _spec(tmp_path)
    n_layers = len(spec.model.layers)                 # 2 blocks + embedding + head
    fw = FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=0.018,
                            step_overhead_s=0.04, layers=n_layers)
    bare = Measurements(layer_profiles={"CPU-local": _profile(spec)})
    measured = Measurements(layer_profiles={"CPU-local": _profile(spec, fw)})
    params, source = measured_overheads(measured)
    assert params == CostParams(layer_overhead_s=0.018 / n_layers, step_overhead_s=0.04)
    assert "framework overheads" in source
    assert measured_overheads(bare) == (CostParams(), "uncalibrated")

    # pp 1: the whole per-micro-batch cost in each of the gas micro-batches, and the step's
    kw = dict(pp=1, dp=2, tmp=1, mbs=1, zero_stage=0)
    t0 = estimate(spec, measurements=bare, **kw).iteration_time_s
    t1 = estimate(spec, measurements=measured, **kw).iteration_time_s
    gas = 4 // 2
    assert t1 - t0 == pytest.approx(0.04 + gas * 0.018, rel=1e-6)
    # pp 2, split 2/2: each stage pays for its own layers, (gas + pp - 1) times in 1F1B
    kw = dict(pp=2, dp=1, tmp=1, mbs=1, zero_stage=0, partition=(0, 2, 4))
    t0 = estimate(spec, measurements=bare, **kw).iteration_time_s
    t1 = estimate(spec, measurements=measured, **kw).iteration_time_s
    assert t1 - t0 == pytest.approx(0.04 + (4 + 1) * 0.018 / 2, rel=0.02)

    # a calibration (or given coefficients) replaces them
    cal = CostParams(step_overhead_s=0.5)
    calibrated = Measurements(layer_profiles={"CPU-local": _profile(spec, fw)},
                              calibration=cal, calibration_source="calibration:x")
    assert CostModel(spec, measurements=calibrated).params == cal
    assert CostModel(spec, measurements=measured, cost_params=CostParams()).params == \
        CostParams()


def test_probe_strategies_use_one_whole_node(tmp_path):
    spec = _spec(tmp_path)
    probes = probe_strategies(spec)
    assert [s.gas for _, s in probes] == list(PROBE_GAS)
    for probe_spec, s in probes:
        assert (s.pp, s.dp, s.tmp, s.mbs, s.zero_stage) == (1, 2, 1, 1, 0)
        assert probe_spec.training.global_batch_size == s.global_batch_size == 2 * s.gas
        assert s.partition == (0, len(spec.model.layers))
        assert sorted(d for r in s.placement[0] for d in r) == [0, 1]
    assert probe_node(spec, "CPU-local") == ""
    assert probe_node(spec, "V100") == "the spec's node is CPU-local, not V100"
    two = _spec(tmp_path, TINY.replace("count: 1", "count: 2"))
    assert "2 nodes" in probe_node(two, "CPU-local")


def test_profile_cli_says_why_it_skips_the_probe(tmp_path, capsys):
    pytest.importorskip("torch")
    from amp_search.cli import main

    spec = tmp_path / "spec.yaml"
    spec.write_text(TINY.replace("count: 1", "count: 2"))
    rc = main(["profile", str(spec), "--device", "cpu", "--mbs", "1", "--repeats", "1",
               "--rounds", "1", "--warmup", "0", "--concurrent", "1", "--no-progress",
               "--profiles", str(tmp_path / "profiles")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "framework overheads not measured: the spec has 2 nodes" in out
    (path,) = (tmp_path / "profiles" / "measured").glob("*.json")
    assert LayerProfile.load(path).framework_overheads is None


def test_real_probe_trials_on_cpu(tmp_path):
    """The probe trials of a spec that searches ZeRO 1, really run (DeepSpeed over gloo, a
    tiny model): stage 0's at gas 1 and 8, whose residuals are what the fit is made of,
    whatever their size on this machine; ZeRO 1's, whose cost is the difference of their
    residuals, per parameter; and the pipeline engine's (one set of real trials serves all
    three: each trial starts DeepSpeed in two processes)."""
    pytest.importorskip("deepspeed")
    import os

    from amp_search.profiling.framework import measure_framework_overheads

    spec = _spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: 1"))
    seen = []
    fw = measure_framework_overheads(spec, _profile(spec), measurements=Measurements(),
                                     runs_dir=tmp_path / "runs", iters=3, warmup=1,
                                     base_env=dict(os.environ), on_probe=seen.append)
    (z1,) = fw.zero
    assert list(fw.probes + z1.probes + fw.pipeline_probes) == seen
    assert [p.gas for p in fw.probes] == list(PROBE_GAS)
    assert all(p.measured_s > 0 and p.predicted_s > 0 for p in fw.probes)
    # the probe trials really ran with those micro-batch counts
    assert fw.probes[1].predicted_s > fw.probes[0].predicted_s
    mb, step = overheads_from_residuals([p.gas for p in fw.probes],
                                        [p.residual_s for p in fw.probes])
    assert (fw.microbatch_overhead_s, fw.step_overhead_s) == (mb, step)
    assert fw.microbatch_overhead_s >= 0 and fw.step_overhead_s >= 0
    # and the pipeline engine's: both devices a stage, 2 and 16 micro-batches
    assert [p.gas for p in fw.pipeline_probes] == [2, 16]
    assert [p.microbatches_on_path for p in fw.probes] == pytest.approx(list(PROBE_GAS))
    # 2 stages of 2 layers: (gas + 1) stage passes of half the model on the critical path
    assert [p.microbatches_on_path for p in fw.pipeline_probes] == pytest.approx([1.5, 8.5])
    assert (fw.pipeline_microbatch_overhead_s, fw.pipeline_step_overhead_s) == \
        overheads_from_residuals([1.5, 8.5], [p.residual_s for p in fw.pipeline_probes])
    # ZeRO 1's probes: the same layout at stage 1, its cost per parameter
    assert [p.label for p in z1.probes] == ["pp1-dp2-tmp1-mbs1-z1"] * len(PROBE_GAS)
    assert z1.params_per_device == sum(CostModel(spec).params_per_layer(1))
    assert z1.microbatch_s_per_param >= 0 and z1.step_s_per_param >= 0
    assert all(p.measured_s > 0 and p.predicted_s > 0 for p in z1.probes)
    configs = [json.loads(p.read_text())["strategy"]
               for p in (tmp_path / "runs").glob("*/trial.json")]
    assert sorted((c["pp"], c["dp"], c["global_batch_size"], c["zero_stage"])
                  for c in configs) == \
        [(1, 2, 2, 0), (1, 2, 2, 1), (1, 2, 16, 0), (1, 2, 16, 1), (2, 1, 2, 0), (2, 1, 16, 0)]


# ----------------------------------------------------------------- ZeRO stages' own costs

def _probes(stage, residuals):
    return [OverheadProbe(label=f"pp1-dp2-tmp1-mbs1-z{stage}", gas=g, measured_s=1.0 + r,
                          predicted_s=1.0) for g, r in zip(PROBE_GAS, residuals)]


def test_zero_stage_cost_is_its_residual_beyond_stage_0_per_parameter():
    from amp_search.profiling.framework import zero_overheads

    g1, g8 = PROBE_GAS
    stage0 = _probes(0, [0.020 + g1 * 0.002, 0.020 + g8 * 0.002])
    # ZeRO 2: 30 ms more per iteration and 7 ms more per micro-batch than stage 0
    z2 = _probes(2, [p.residual_s + 0.030 + g * 0.007 for p, g in zip(stage0, PROBE_GAS)])
    z = zero_overheads(2, stage0, z2, params_per_device=1_000_000)
    assert z.zero_stage == 2 and z.params_per_device == 1_000_000
    assert z.microbatch_s_per_param * 1e6 == pytest.approx(0.007)
    assert z.step_s_per_param * 1e6 == pytest.approx(0.030)
    assert z.probes == tuple(z2)
    # a stage that costs less than the model says is priced at nothing, never a credit
    cheap = _probes(1, [p.residual_s - 0.01 for p in stage0])
    z = zero_overheads(1, stage0, cheap, params_per_device=10)
    assert (z.microbatch_s_per_param, z.step_s_per_param) == (0.0, 0.0)


def test_zero_costs_round_trip_and_price_each_stage(tmp_path):
    from amp_search.profiling.store import ZeroOverheads

    spec = _spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: search"))
    params = sum(CostModel(spec).params_per_layer(1))
    z2 = ZeroOverheads(zero_stage=2, microbatch_s_per_param=0.007 / params,
                       step_s_per_param=0.030 / params, params_per_device=params,
                       probes=tuple(_probes(2, [0.05, 0.1])))
    fw = FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=0.0,
                            step_overhead_s=0.0, layers=len(spec.model.layers), zero=(z2,))
    path = _profile(spec, fw).save(tmp_path / "p.json")
    assert LayerProfile.load(path).framework_overheads == fw
    d = json.loads(path.read_text())
    del d["framework_overheads"]["zero"]            # files from before: no ZeRO costs
    assert LayerProfile.from_dict(d).framework_overheads.zero == ()

    measured = Measurements(layer_profiles={"CPU-local": LayerProfile.load(path)})
    cp, _ = measured_overheads(measured)
    assert cp.zero_microbatch_s_per_param == {2: z2.microbatch_s_per_param}
    assert cp.zero_step_s_per_param == {2: z2.step_s_per_param}
    # a calibration file keeps them through JSON (object keys are strings there)
    assert CostParams.from_dict(json.loads(json.dumps(cp.to_dict()))) == cp

    bare = Measurements(layer_profiles={"CPU-local": _profile(spec)})
    gas = 4 // 2
    for simulate in (False, True):
        for stage, extra in ((0, 0.0), (1, 0.0), (2, 0.030 + gas * 0.007)):
            kw = dict(pp=1, dp=2, tmp=1, mbs=1, zero_stage=stage, simulate=simulate)
            t0 = estimate(spec, measurements=bare, **kw).iteration_time_s
            t1 = estimate(spec, measurements=measured, **kw).iteration_time_s
            assert t1 - t0 == pytest.approx(extra, rel=1e-6, abs=1e-12), (stage, simulate)

    # one model, the stages in turn (nothing cached across them), and again after stage 2
    from amp_search.placement import device_orders
    from amp_search.search_space import Candidate

    model, plain = CostModel(spec, measurements=measured), CostModel(spec, measurements=bare)
    order = device_orders(spec.cluster, "fp32")[0]

    def time_s(m, stage):
        c = Candidate(pp=1, dp=2, tmp=1, mbs=1, zero_stage=stage, activation_checkpointing=False)
        return m.evaluate(c, order).iteration_time_s

    diffs = [time_s(model, z) - time_s(plain, z) for z in (2, 0, 1, 2)]
    assert diffs == pytest.approx([0.030 + gas * 0.007, 0.0, 0.0, 0.030 + gas * 0.007],
                                  abs=1e-12)

    # DeepSpeed's ZeRO costs: a Megatron-LM plan (distributed optimizer = stage 1) never
    # takes them, even from a profile that holds them for its stage
    z1 = dataclasses.replace(z2, zero_stage=1)
    fw1 = dataclasses.replace(fw, zero=(z1,))
    megatron = _spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: 1\n  backend: megatron"))
    kw = dict(pp=1, dp=2, tmp=1, mbs=1, zero_stage=1)
    assert estimate(megatron, measurements=Measurements(
        layer_profiles={"CPU-local": _profile(megatron, fw1)}), **kw).iteration_time_s == \
        estimate(megatron, measurements=Measurements(
            layer_profiles={"CPU-local": _profile(megatron)}), **kw).iteration_time_s


def test_probe_zero_stages_follow_the_spec(tmp_path):
    from amp_search.profiling.framework import probe_zero_stages

    searched = TINY.replace("zero_stage: 0", "zero_stage: search")
    assert probe_zero_stages(_spec(tmp_path, searched)) == (1, 2, 3)
    assert probe_zero_stages(_spec(tmp_path)) == ()
    assert probe_zero_stages(_spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: 2"))) \
        == (2,)
    one = searched.replace("gpus_per_node: 2", "gpus_per_node: 1")
    assert probe_zero_stages(_spec(tmp_path, one)) == ()           # nothing to partition over
    megatron = searched.replace("zero_stage: search", "zero_stage: 1\n  backend: megatron")
    assert probe_zero_stages(_spec(tmp_path, megatron)) == ()
    for stage in (1, 2):
        for _, s in probe_strategies(_spec(tmp_path, searched), stage):
            assert (s.pp, s.dp, s.tmp, s.mbs, s.zero_stage) == (1, 2, 1, 1, stage)


def test_a_failed_or_interrupted_zero_probe_keeps_what_was_measured(tmp_path, monkeypatch):
    """Stage 0's probes must succeed (their failure or Ctrl-C ends the measurement); a ZeRO
    stage whose trial fails is left out and the others still run; Ctrl-C during a ZeRO stage
    keeps stage 0 and the stages done before it."""
    from types import SimpleNamespace

    import amp_search.launch as launch
    from amp_search.errors import UsageError
    from amp_search.profiling.framework import measure_framework_overheads

    spec = _spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: search"))
    outcome = {}        # stage -> "ok" | "failed" | "interrupt"

    def fake_run_trials(probe_spec, strategies, options):
        (s,) = strategies
        what = outcome.get("pipeline" if s.pp > 1 else s.zero_stage, "ok")
        if what == "interrupt":
            raise KeyboardInterrupt
        return [SimpleNamespace(status=what, measured_s=0.5 if what == "ok" else None,
                                label=s.label(), other_processes_cores=0.0, error="boom",
                                log_tail="")]

    monkeypatch.setattr(launch, "run_trials", fake_run_trials)

    def measure():
        skipped = []
        fw = measure_framework_overheads(spec, _profile(spec), measurements=Measurements(),
                                         on_skip=lambda z, why: skipped.append((z, why)))
        return [z.zero_stage for z in fw.zero], skipped

    assert measure() == ([1, 2, 3], [])
    outcome.update({2: "failed"})
    stages, skipped = measure()
    assert stages == [1, 3] and [z for z, _ in skipped] == ["ZeRO 2"] and "failed" in skipped[0][1]
    outcome.update({2: "interrupt"})
    assert measure() == ([1], [("ZeRO 2", "interrupted")])
    # the pipeline engine's probes run last: their failure or Ctrl-C keeps every ZeRO stage
    outcome.update({2: "ok", "pipeline": "failed"})
    assert measure()[0] == [1, 2, 3]
    outcome.update({"pipeline": "interrupt"})
    assert measure() == ([1, 2, 3], [("the pipeline engine", "interrupted")])
    for what, error in (("failed", UsageError), ("interrupt", KeyboardInterrupt)):
        outcome.update({0: what})
        with pytest.raises(error):
            measure()


def test_a_calibration_without_zero_costs_says_so(tmp_path):
    """A calibration fitted before the profile measured ZeRO's own costs keeps its coefficients
    (they were fitted with those costs inside) and the plan's sources say the costs are not in
    it; one fitted after carries them (calibrate starts from the profile's)."""
    from amp_search.profiling.store import ZeroOverheads

    spec = _spec(tmp_path, TINY.replace("zero_stage: 0", "zero_stage: search"))
    fw = FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=0.0, step_overhead_s=0.0,
                            layers=len(spec.model.layers),
                            zero=(ZeroOverheads(zero_stage=2, microbatch_s_per_param=1e-9,
                                                step_s_per_param=0.0, params_per_device=1),))
    old = CostParams(step_overhead_s=0.05)
    m = Measurements(layer_profiles={"CPU-local": _profile(spec, fw)}, calibration=old,
                     calibration_source="calibration:x.json")
    model = CostModel(spec, measurements=m)
    assert model.params == old
    assert model.params_source == ("calibration:x.json (ZeRO 2: own costs not in the "
                                   "calibration; calibrate again)")
    new = dataclasses.replace(old, zero_microbatch_s_per_param={2: 1e-9})
    assert CostModel(spec, measurements=dataclasses.replace(m, calibration=new)).params_source \
        == "calibration:x.json"


# ------------------------------------------------------------- the pipeline engine's costs

def test_pipeline_probe_strategies(tmp_path):
    from amp_search.profiling.framework import pipeline_probe_strategies

    spec = _spec(tmp_path)                          # 4 layers (embedding, 2 blocks, head)
    probes = pipeline_probe_strategies(spec)
    assert [s.gas for _, s in probes] == [2, 16]
    for probe_spec, s in probes:
        assert (s.pp, s.dp, s.tmp, s.mbs, s.zero_stage) == (2, 1, 1, 1, 0)
        assert s.partition == (0, 2, 4)
        assert probe_spec.training.global_batch_size == s.gas
        assert [sorted(d for r in stage for d in r) for stage in s.placement] == [[0], [1]]
    assert pipeline_probe_strategies(_spec(tmp_path, TINY.replace("gpus_per_node: 2",
                                                                  "gpus_per_node: 1"))) == []
    megatron = TINY.replace("zero_stage: 0", "zero_stage: 0\n  backend: megatron")
    assert pipeline_probe_strategies(_spec(tmp_path, megatron)) == []
    five = TINY.replace("gpus_per_node: 2", "gpus_per_node: 5")     # more devices than layers
    assert pipeline_probe_strategies(_spec(tmp_path, five)) == []


def test_pipeline_costs_replace_the_pp1_ones_under_a_pipeline(tmp_path):
    spec = _spec(tmp_path)
    n_layers = len(spec.model.layers)
    fw = FrameworkOverheads(backend="deepspeed", microbatch_overhead_s=0.016,
                            step_overhead_s=0.04, layers=n_layers,
                            pipeline_microbatch_overhead_s=0.004,
                            pipeline_step_overhead_s=0.01)
    path = _profile(spec, fw).save(tmp_path / "p.json")
    assert LayerProfile.load(path).framework_overheads == fw
    d = json.loads(path.read_text())
    for key in ("pipeline_microbatch_overhead_s", "pipeline_step_overhead_s",
                "pipeline_probes"):
        del d["framework_overheads"][key]          # files from before: pp 1's costs for all
    assert LayerProfile.from_dict(d).framework_overheads.pipeline_step_overhead_s is None

    measured = Measurements(layer_profiles={"CPU-local": _profile(spec, fw)})
    cp, _ = measured_overheads(measured)
    assert cp.layer_overhead(1) == pytest.approx(0.016 / n_layers)
    assert cp.layer_overhead(2) == pytest.approx(0.004 / n_layers)
    assert (cp.step_overhead(1, 2), cp.step_overhead(2, 1)) == pytest.approx((0.04, 0.01))
    # measured without gradient reduction: a pipeline with dp > 1 keeps pp 1's step cost
    assert cp.step_overhead(2, 2) == pytest.approx(0.04)
    # a calibration's step_overhead moves both; the sums are never below 0
    assert dataclasses.replace(cp, step_overhead_s=0.1).step_overhead(2, 1) == \
        pytest.approx(0.07)
    assert dataclasses.replace(cp, step_overhead_s=0.0).step_overhead(2, 1) == 0.0
    # a calibration fitted before the pipeline costs existed says so
    old_cal = Measurements(layer_profiles={"CPU-local": _profile(spec, fw)},
                           calibration=CostParams(), calibration_source="calibration:x.json")
    assert CostModel(spec, measurements=old_cal).params_source == (
        "calibration:x.json (the pipeline engine: own costs not in the calibration; "
        "calibrate again)")
    # files from before the probes counted the critical path: their probes still load
    d2 = json.loads(path.read_text())
    d2["framework_overheads"]["probes"] = [{"label": "x", "gas": 1, "measured_s": 0.2,
                                            "predicted_s": 0.1}]
    assert LayerProfile.from_dict(d2).framework_overheads.probes[0].microbatches_on_path \
        is None

    bare = Measurements(layer_profiles={"CPU-local": _profile(spec)})
    old = Measurements(layer_profiles={"CPU-local": LayerProfile.from_dict(d)})
    kw = dict(pp=1, dp=2, tmp=1, mbs=1, zero_stage=0)
    t0, t1 = (estimate(spec, measurements=m, **kw).iteration_time_s for m in (bare, measured))
    assert t1 - t0 == pytest.approx(0.04 + 2 * 0.016, rel=1e-6)      # pp 1: as before
    kw = dict(pp=2, dp=1, tmp=1, mbs=1, zero_stage=0, partition=(0, 2, 4))
    t0, t1, t_old = (estimate(spec, measurements=m, **kw).iteration_time_s
                     for m in (bare, measured, old))
    # 1F1B, 4 micro-batches, 2 equal stages: (4 + 1) stage passes of half the layers
    assert t1 - t0 == pytest.approx(0.01 + (4 + 1) * 0.004 / 2, rel=0.02)
    assert t_old - t0 == pytest.approx(0.04 + (4 + 1) * 0.016 / 2, rel=0.02)
