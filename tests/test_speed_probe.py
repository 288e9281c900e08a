"""The machine-speed probe: taken with a layer profile, taken again by launch before each trial,
and the trial's prediction scaled by the ratio (amp_search.profiling.speed)."""
from __future__ import annotations

import dataclasses

import pytest

from amp_search.launch.orchestrator import LaunchOptions, TrialRequest, run_trials
from amp_search.measurements import Measurements
from amp_search.planner import evaluate, plan
from amp_search.profiling.speed import measure_speed, probe_layer
from amp_search.profiling.store import LayerProfile, SpeedProbe
from conftest import tiny_cpu_spec, uniform_profile

_spec = tiny_cpu_spec


def _profile(spec, probe=None):
    return uniform_profile(spec, speed_probe=probe)


def test_the_probe_layer_and_its_round_trip_in_the_layer_profile(tmp_path):
    spec = _spec(tmp_path)
    layer = probe_layer(spec)
    assert layer.kind == "transformer"
    probe = SpeedProbe(ms=21.5, workers=2, seconds=2.0, layer=layer.signature, mbs=2,
                       created="2026-11-22T19:00:00+00:00")
    path = _profile(spec, probe).save(tmp_path / "p.json")
    assert LayerProfile.load(path).speed_probe == probe
    assert LayerProfile.load(_profile(spec).save(tmp_path / "q.json")).speed_probe is None


def test_a_real_probe_times_the_layer_in_each_worker(tmp_path):
    pytest.importorskip("torch")
    spec = _spec(tmp_path)
    probe = measure_speed(spec, workers=2, seconds=0.2, mbs=1)
    assert probe.workers == 2 and probe.mbs == 1 and probe.ms > 0
    assert probe.layer == probe_layer(spec).signature


def test_launch_scales_each_prediction_by_the_machine_speed_now(tmp_path, capsys, monkeypatch):
    """A reference 4x faster than a real probe: launch probes again before the trial, records
    the ratio of that probe (seen here) to the reference, and re-makes the prediction with the
    layer times scaled by it; without a reference there is nothing to correct. The ratio itself
    is whatever the machine's speed gives, so only its use is checked, not its size."""
    pytest.importorskip("torch")
    from amp_search.cli.launch import speed_correction
    from amp_search.profiling import speed

    spec = _spec(tmp_path)
    real = measure_speed(spec, workers=1, seconds=0.3)
    ref = dataclasses.replace(real, ms=real.ms / 4)
    seen = []

    def probe(*args, **kwargs):
        seen.append(measure_speed(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(speed, "measure_speed", probe)
    m = Measurements(layer_profiles={"CPU-local": _profile(spec, ref)})
    assert speed_correction(spec, Measurements(layer_profiles={"CPU-local": _profile(spec)})
                            ) is None
    before = speed_correction(spec, m)
    s = plan(spec, measurements=m, progress=False).strategies[0].strategy
    base = evaluate(spec, s, measurements=m).iteration_time_s
    req = before(TrialRequest(strategy=s, predicted_s=base))
    [now] = seen
    assert now.workers == ref.workers and now.mbs == ref.mbs and now.seconds == ref.seconds
    assert req.machine_speed == pytest.approx(now.ms / ref.ms)
    assert (req.predicted_s > base) == (req.machine_speed > 1.0)
    assert "machine speed" in capsys.readouterr().err


def test_before_trial_runs_only_for_trials_that_start(tmp_path):
    """A dry run starts nothing, so it neither probes nor re-predicts."""
    spec = _spec(tmp_path)
    s = plan(spec, progress=False).strategies[0].strategy
    calls = []

    def before(req):
        calls.append(req)
        return req

    [rec] = run_trials(spec, [TrialRequest(strategy=s, predicted_s=1.0)],
                       LaunchOptions(dry_run=True, runs_dir=tmp_path / "runs"),
                       before_trial=before)
    assert rec.status == "dry-run" and calls == [] and rec.machine_speed is None
