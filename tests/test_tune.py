"""tune(): plan -> real trials -> best measured -> optional refit, as a library call. One real
trial (about 20 s on 2 cores); the other tests reuse it or launch nothing."""
from __future__ import annotations

import os
import shutil
import sqlite3
from pathlib import Path

import pytest

from amp_search import LaunchOptions, TuneResult, load_spec, tune
from amp_search.records import Plan
from amp_search.tuner import REFIT_MIN_TRIALS

ROOT = Path(__file__).resolve().parents[1]


def _options(d: Path, **kw) -> LaunchOptions:
    return LaunchOptions(iters=4, warmup=2, results_path=d / "results.sqlite",
                         runs_dir=d / "runs", base_env={**os.environ, "OMP_NUM_THREADS": "1"},
                         **kw)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    """One real trial of cpu-tiny's best planned strategy, refit asked (too few trials)."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    d = tmp_path_factory.mktemp("tune")
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", d / "spec.yaml")
    spec = load_spec(d / "spec.yaml")
    seen = {"trials": [], "records": [], "notes": []}
    result = tune(spec, top_k=1, options=_options(d), refit=True, profiles=d / "profiles",
                  on_trials=seen["trials"].append, on_record=seen["records"].append,
                  on_note=seen["notes"].append)
    return spec, d, result, seen


def test_one_real_trial_is_measured_and_is_the_best(tuned):
    spec, d, result, seen = tuned
    assert isinstance(result, TuneResult) and isinstance(result.plan, Plan)
    assert result.strategies == (result.plan.strategies[0].strategy,)
    (rec,) = result.records
    assert rec.status == "ok", (rec.error, rec.log_tail)
    assert rec.strategy == result.strategies[0] and not rec.cached
    assert rec.measured_s is not None and rec.measured_s > 0
    assert rec.predicted_s == result.plan.strategies[0].iteration_time_s
    assert result.best is rec
    assert seen["trials"] == [result.strategies] and seen["records"] == [rec]
    rows = sqlite3.connect(d / "results.sqlite").execute(
        "SELECT status, measured_mean_s FROM results").fetchall()
    assert rows == [("ok", rec.measured_s)]
    assert result.to_dict()["best"]["label"] == rec.label


def test_refit_with_too_few_trials_says_so_and_fits_nothing(tuned):
    _, d, result, seen = tuned
    assert result.calibration is None and result.calibration_path is None
    assert f"needs at least {REFIT_MIN_TRIALS}" in result.refit_note
    assert "holds 1 measured trial of this spec" in result.refit_note
    assert seen["notes"][-1] == result.refit_note
    assert not (d / "profiles").exists()


def test_refit_fits_and_stores_on_the_specs_measured_trials(tuned, tmp_path):
    """The recorded trial (cached: nothing runs) plus a second one recorded by hand."""
    from amp_search.launch.orchestrator import trial_key
    from amp_search.launch.results_db import ResultsDB

    spec, d, first, _ = tuned
    with sqlite3.connect(d / "results.sqlite") as src, \
            sqlite3.connect(tmp_path / "results.sqlite") as dst:
        src.backup(dst)
    other = first.plan.strategies[1].strategy
    db = ResultsDB(tmp_path / "results.sqlite")
    row = db.start(spec_sha256=spec.sha256, spec_path=str(spec.path),
                   trial_key=trial_key(other, "deepspeed"), label=other.label(),
                   backend="deepspeed", launcher="local", strategy=other.to_dict(),
                   predicted_s=None, iters=4, warmup=2, log_path=str(tmp_path / "log.txt"),
                   started_at="2026-01-01T00:00:00+00:00")
    db.finish(row, status="ok", ended_at="2026-01-01T00:00:10+00:00",
              measured_mean_s=1.3 * first.best.measured_s)
    result = tune(spec, top_k=1, options=_options(tmp_path), plan=first.plan, refit=True,
                  profiles=tmp_path / "profiles")
    assert result.records[0].cached and result.best.measured_s == first.best.measured_s
    cal = result.calibration
    assert cal is not None and result.refit_note == ""
    assert cal.n_trials == 2 and cal.fitted
    assert result.calibration_path is not None and result.calibration_path.is_file()
    assert result.calibration_path.parent == tmp_path / "profiles" / "measured"
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_dry_run_launches_nothing(tmp_path):
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    from amp_search import plan

    given = [e.strategy for e in plan(spec).strategies[:3]]
    notes = []
    result = tune(spec, top_k=2, options=_options(tmp_path, dry_run=True), plan=given,
                  refit=True, on_note=notes.append)
    assert result.plan is None and result.strategies == tuple(given[:2])
    assert [r.status for r in result.records] == ["dry-run", "dry-run"]
    assert all(r.commands and r.measured_s is None for r in result.records)
    assert result.best is None and result.calibration is None
    assert "dry run" in result.refit_note and notes == [result.refit_note]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spec.yaml"]
