"""The other half of `plan()`: launch the top k as real trials, keep the fastest measured.

    plan(spec) -> top k strategies -> run_trials -> TrialRecords -> best_trial
        [-> refit: calibrate on the spec's measured trials -> save_calibration]

`amp-search launch` is this function plus printing, JSON and Ctrl-C / SIGTERM handling.

    import os
    from amp_search import LaunchOptions, load_spec, tune

    spec = load_spec("configs/cpu-tiny.yaml")
    result = tune(spec, top_k=2, options=LaunchOptions(iters=6, warmup=2,
                                                       base_env=dict(os.environ)))
    for r in result.records:
        print(r.label, r.status, r.predicted_s, r.measured_s)
    if result.best is not None:
        print("fastest:", result.best.label, result.best.measured_s, "s/iteration")
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from .errors import UsageError
from .launch.orchestrator import (LaunchOptions, TrialRecord, TrialRequest, best_trial,
                                  default_results_path, run_trials, trial_requests)
from .measurements import NO_MEASUREMENTS, Measurements
from .records import Estimate, Plan, Strategy
from .spec import Spec

if TYPE_CHECKING:
    from .calibrate import Calibration

REFIT_MIN_TRIALS = 2
"""Measured trials of the spec a refit needs: with one, any coefficient matches it exactly and
the fit says nothing about the others."""


@dataclass(frozen=True, kw_only=True)
class TuneResult:
    """What `tune` planned, ran and measured."""

    plan: Plan | None
    """The plan the trials came from; None when `tune` was given the strategies to run."""
    strategies: tuple[Strategy, ...]
    """The strategies tried, in launch order (the top k)."""
    records: tuple[TrialRecord, ...]
    """One per strategy, in the same order: ok | oom | failed | timeout | skipped | dry-run."""
    best: TrialRecord | None
    """The fastest measured trial that ended ok (None if none did)."""
    calibration: Calibration | None = None
    """refit: the calibration fitted on the spec's measured trials."""
    calibration_path: Path | None = None
    """Where the calibration was stored (None: not stored, or no refit)."""
    refit_note: str = ""
    """refit asked but not done: why (a dry run, too few measured trials)."""

    def to_dict(self) -> dict:
        return {"plan": None if self.plan is None else self.plan.to_dict(),
                "strategies": [s.to_dict() for s in self.strategies],
                "trials": [r.to_dict() for r in self.records],
                "best": None if self.best is None else self.best.to_dict(),
                "calibration": None if self.calibration is None
                else self.calibration.to_dict(),
                "calibration_path": None if self.calibration_path is None
                else str(self.calibration_path),
                "refit_note": self.refit_note}


def tune(spec: Spec, *, top_k: int = 3, options: LaunchOptions | None = None,
         measurements: Measurements = NO_MEASUREMENTS,
         plan: Plan | Sequence[Estimate | Strategy | TrialRequest] | None = None,
         refit: bool = False, profiles: str | Path | None = None,
         on_trials: Callable[[tuple[Strategy, ...]], None] | None = None,
         on_record: Callable[[TrialRecord], None] | None = None,
         on_note: Callable[[str], None] | None = None,
         before_trial: Callable[[TrialRequest], TrialRequest] | None = None,
         progress: bool = False, max_search_s: float | None = None,
         on_start=None) -> TuneResult:
    """Plan `spec` (or take `plan`), run its best `top_k` strategies as real trials one after
    another (`run_trials`, recorded in the results database), and return them with the
    fastest measured one.

    `options`: how trials run (LaunchOptions(); the trials' environment is `base_env`, empty
    unless given: pass `dict(os.environ)` for your own). `measurements`: the layer profiles,
    link fits and calibration to plan and refit with. `plan`: a Plan, or Estimates /
    Strategies / TrialRequests, to run (its first `top_k`) instead of planning.
    `progress`, `max_search_s`, `on_start`: as plan()'s; the plan is for `options.backend`.

    `refit`: afterwards fit the cost model's coefficients (amp_search.calibrate.calibrate) on
    every measured trial of this spec in the results database, as `amp-search calibrate`
    does, and store the calibration under the profiles root `profiles` (where
    load_measurements finds it; None: returned, not stored). With fewer than
    REFIT_MIN_TRIALS measured trials, or a dry run, nothing is fitted: `refit_note` (and
    `on_note`) says why.

    `on_trials(strategies)` is called once the strategies to run are known, before the first
    trial; `on_record`, `on_note`, `before_trial`: as run_trials'. Raises what plan() and
    run_trials() raise (NoFeasibleStrategy, SearchTooLarge, UsageError, ResultsDBError), and
    KeyboardInterrupt after stopping the running trial."""
    options = options or LaunchOptions()
    if plan is None:
        from .planner import KEEP, plan as make_plan

        plan = make_plan(spec, measurements=measurements, progress=progress,
                         max_search_s=max_search_s, on_start=on_start,
                         backend=options.backend, keep=max(KEEP, top_k))
    requests = trial_requests(list(plan.strategies if isinstance(plan, Plan) else plan)[:top_k])
    strategies = tuple(r.strategy for r in requests)
    if on_trials is not None:
        on_trials(strategies)
    records = run_trials(spec, requests, options, on_record=on_record,
                         before_trial=before_trial, on_note=on_note)
    result = TuneResult(plan=plan if isinstance(plan, Plan) else None, strategies=strategies,
                        records=tuple(records), best=best_trial(records))
    if not refit:
        return result
    return _refit(spec, result, options, measurements, profiles, on_note)


def _refit(spec: Spec, result: TuneResult, options: LaunchOptions,
           measurements: Measurements, profiles, on_note) -> TuneResult:
    """`result` with the calibration fitted on the spec's measured trials (or why not)."""
    import dataclasses

    from .calibrate import calibrate, save_calibration, trials_from_db
    from .measurements import layer_profile_dir

    db = Path(options.results_path or default_results_path(spec))
    trials = []
    if options.dry_run:
        note = "no refit: a dry run measures nothing"
    else:
        try:
            trials = trials_from_db(spec, db)
        except UsageError as exc:  # no finished trial of this spec
            note = f"no refit: {exc}"
        else:
            note = "" if len(trials) >= REFIT_MIN_TRIALS else (
                f"no refit: {db} holds {len(trials)} measured trial"
                f"{'' if len(trials) == 1 else 's'} of this spec, a refit needs at least "
                f"{REFIT_MIN_TRIALS}; tune with a larger top_k")
    if note:
        if on_note is not None:
            on_note(note)
        return dataclasses.replace(result, refit_note=note)
    cal = calibrate(spec, trials, measurements=measurements)
    path = None if profiles is None else \
        save_calibration(cal, spec, layer_profile_dir(Path(profiles)))
    return dataclasses.replace(result, calibration=cal, calibration_path=path)


__all__ = ["REFIT_MIN_TRIALS", "LaunchOptions", "TuneResult", "tune"]
