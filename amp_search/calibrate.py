"""Fit the cost model's free coefficients (cost_models.params.CostParams) to measured trials.

    trials (strategy, measured seconds per iteration)
        -> least squares on the relative error of planner.evaluate(spec, strategy, params)
        -> Calibration (params, MAPE before / after)  -> <profiles>/measured/<devices>__<prec>__calibration.json

The model is used as a black box: `planner.evaluate` with a CostParams, on the measurements
(layer profiles, link fits) the caller passes in. Coefficients are
searched in transformed units so that each is O(1) and respects its range:
    compute_scale[device], bandwidth_scale[link]   log of the multiplier
    latency_s[link]                                 units of 100 us, added to the measured
                                                    link latency (so >= minus that)
    dp_overlap                                      in [0, 1]
    microbatch_overhead_s                           ms, >= 0
    step_overhead_s                                 units of 10 ms, >= 0
A coefficient that moves no prediction (a link no trial uses, overlap without data
parallelism) is left at its starting value and not reported as fitted. A small ridge term
pulls the others toward their starting values so that nearly flat directions stay put.
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cost_models.params import CostParams

from .errors import UsageError
from .measurements import NO_MEASUREMENTS, Measurements, calibration_path, device_types
from .costing import CostModel, measured_overheads
from .planner import evaluate
from .records import Strategy
from .spec import Spec

FORMAT = 1


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True, kw_only=True)
class MeasuredTrial:
    """One real trial: the strategy it ran and its measured seconds per iteration."""

    strategy: Strategy
    measured_s: float
    label: str = ""
    measurements: Measurements | None = None
    """What to predict this trial with, when it differs from what `calibrate` is given (e.g.
    a profile taken just before the trial); None: those."""

    def to_dict(self) -> dict:
        return {"label": self.label or self.strategy.label(), "measured_s": self.measured_s,
                "strategy": self.strategy.to_dict()}


@dataclass(frozen=True, kw_only=True)
class TrialFit:
    """One trial's prediction before and after calibration."""

    label: str
    measured_s: float
    predicted_before_s: float
    predicted_after_s: float
    in_fit: bool

    @property
    def error_before(self) -> float:
        return self.predicted_before_s / self.measured_s - 1.0

    @property
    def error_after(self) -> float:
        return self.predicted_after_s / self.measured_s - 1.0

    def to_dict(self) -> dict:
        return {"label": self.label, "measured_s": self.measured_s,
                "predicted_before_s": self.predicted_before_s,
                "predicted_after_s": self.predicted_after_s, "in_fit": self.in_fit,
                "error_before": self.error_before, "error_after": self.error_after}


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """Fitted coefficients and how well they predict.

    `mape_before` / `mape_after` are scored on the held-out trials when the fit used only
    some (`fit_on`), else on all of them; `fit_mape_*` on the trials it was fitted to."""

    params: CostParams
    initial: CostParams
    mape_before: float
    mape_after: float
    fit_mape_before: float
    fit_mape_after: float
    n_trials: int
    n_fit: int
    fitted: tuple[str, ...]
    """Coefficients the trials constrain (the others kept their starting values)."""
    values: dict = field(default_factory=dict)
    """fitted coefficient name -> (value before, value after)."""
    devices: tuple[str, ...]
    precision: str
    rows: tuple[TrialFit, ...] = ()
    spec_sha256: str = ""
    created: str = ""
    path: Path | None = None

    @property
    def scored_on(self) -> str:
        return "held-out" if self.n_fit < self.n_trials else "all"

    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": "calibration", "devices": list(self.devices),
                "precision": self.precision, "params": self.params.to_dict(),
                "initial": self.initial.to_dict(), "fitted": list(self.fitted),
                "mape_before": self.mape_before, "mape_after": self.mape_after,
                "fit_mape_before": self.fit_mape_before, "fit_mape_after": self.fit_mape_after,
                "scored_on": self.scored_on, "n_trials": self.n_trials, "n_fit": self.n_fit,
                "spec_sha256": self.spec_sha256, "created": self.created,
                "trials": [r.to_dict() for r in self.rows]}


def as_trials(records) -> list[MeasuredTrial]:
    """MeasuredTrial from what the results database gives: MeasuredTrial objects, or objects /
    dicts with a `strategy` (Strategy or its dict) and the measured seconds per iteration
    under one of measured_s, iteration_time_s, mean_s, step_time_s."""
    out = []
    for i, r in enumerate(records):
        if isinstance(r, MeasuredTrial):
            out.append(r)
            continue
        get = r.get if isinstance(r, dict) else (lambda k, d=None, _r=r: getattr(_r, k, d))
        s = get("strategy")
        if isinstance(s, dict):
            s = Strategy.from_dict(s)
        t = next((get(k) for k in ("measured_s", "iteration_time_s", "mean_s", "step_time_s")
                  if get(k) is not None), None)
        if not isinstance(s, Strategy) or t is None:
            raise UsageError(f"trial record {i}: needs a strategy and a measured time per "
                             f"iteration; got {type(r).__name__}")
        out.append(MeasuredTrial(strategy=s, measured_s=float(t),
                                 label=str(get("label", "") or "")))
    return out


def trials_from_db(spec: Spec, path: Path | None = None) -> list[MeasuredTrial]:
    """The spec's trials that ended ok in the results database (`amp-search launch`'s, by
    default amp-search-results.sqlite beside the spec); the latest attempt of each."""
    from .launch.orchestrator import default_results_path
    from .launch.results_db import ResultsDB

    path = Path(path) if path is not None else default_results_path(spec)
    if not path.exists():
        raise UsageError(f"no results database at {path}; run `amp-search launch` first or "
                         f"pass --results DB")
    latest = {}
    for row in ResultsDB(path).rows(spec.sha256):
        # the trials of the framework the spec is costed for (a spec that names no backend
        # shares its sha256 with both frameworks' trials; the other's are not this model's)
        if row.status == "ok" and row.measured_mean_s and \
                row.backend in ("", None, spec.training.backend):
            latest[row.trial_key] = row
    if not latest:
        raise UsageError(f"{path} holds no finished trial of this spec (sha256 "
                         f"{spec.sha256[:12]}...); run `amp-search launch` first")
    return [MeasuredTrial(strategy=Strategy.from_dict(r.strategy), measured_s=r.measured_mean_s,
                          label=r.label) for r in latest.values()]


# ----------------------------------------------------------------------------- parameters

@dataclass(frozen=True)
class _Coef:
    name: str      # e.g. 'compute_scale[CPU-local]'
    field: str
    key: str | None
    unit: float    # value = to_value(theta)
    log: bool
    lo: float
    hi: float
    default: float = 1.0
    """The value while CostParams holds none (a scale 1, a latency 0, the catalog's cost)."""

    def to_theta(self, value: float) -> float:
        if self.log:
            return math.log(max(value, 1e-12))
        return value / self.unit

    def to_value(self, theta: float) -> float:
        return math.exp(theta) if self.log else theta * self.unit


def _measured_latency_s(spec: Spec, link: str, measurements: Measurements) -> float:
    """The smallest per-message latency the model already charges on `link` (the alpha of a
    measured link profile, else the catalog's `link_latency` of the devices): how far a
    negative correction may go."""
    model = CostModel(spec, cost_params=CostParams(), measurements=measurements)
    catalog = min(getattr(g, f"link_latency_{link}_s") for g in model.gpus)
    return max(0.0, min(model.latency(c, link, catalog) for c in ("all_reduce", "p2p")))


def _coefficients(spec: Spec, measurements: Measurements = NO_MEASUREMENTS) -> list[_Coef]:
    devices = sorted({d.gpu.name for d in spec.cluster.devices})
    links = []
    if any(len(n.devices) > 1 for n in spec.cluster.nodes):
        links.append("intra")
    if len(spec.cluster.nodes) > 1:
        links.append("inter")
    coefs = [_Coef(f"compute_scale[{d}]", "compute_scale", d, 1.0, True, -5.0, 5.0)
             for d in devices]
    # the analytic model's fixed costs per device type (they move only analytic layer times),
    # starting from the catalog's values
    gpus = {d.gpu.name: d.gpu for d in spec.cluster.devices}
    for name, unit in (("host_block_pass_s", 1e-4), ("host_tp_allreduce_per_rank_s", 1e-5),
                       ("kernel_floor_s", 1e-4)):
        coefs += [_Coef(f"{name}[{d}]", name, d, unit, False, 0.0, 1e4,
                        default=float(getattr(gpus[d], name))) for d in devices]
    coefs += [_Coef(f"bandwidth_scale[{lk}]", "bandwidth_scale", lk, 1.0, True, -7.0, 7.0)
              for lk in links]
    # latency_s is added to a measured link's alpha, so it may correct it downwards
    coefs += [_Coef(f"latency_s[{lk}]", "latency_s", lk, 1e-4, False,
                    -0.999 * _measured_latency_s(spec, lk, measurements) / 1e-4, 1e3,
                    default=0.0) for lk in links]
    coefs += [_Coef("dp_overlap", "dp_overlap", None, 1.0, False, 0.0, 1.0),
              _Coef("microbatch_overhead_s", "microbatch_overhead_s", None, 1e-3, False, 0.0,
                    1e4),
              _Coef("step_overhead_s", "step_overhead_s", None, 1e-2, False, 0.0, 1e4)]
    return coefs


def _get(p: CostParams, c: _Coef) -> float:
    if c.key is None:
        return float(getattr(p, c.field))
    return float(getattr(p, c.field).get(c.key, c.default))


def _with(base: CostParams, coefs, theta) -> CostParams:
    d = base.to_dict()
    d = {k: (dict(v) if isinstance(v, dict) else v) for k, v in d.items()}
    for c, t in zip(coefs, theta):
        t = min(max(float(t), c.lo), c.hi)
        if c.key is None:
            d[c.field] = c.to_value(t)
        else:
            d[c.field][c.key] = c.to_value(t)
    return CostParams.from_dict(d)


# ----------------------------------------------------------------------------- fitting

def predict(spec: Spec, trials, params: CostParams, *,
            measurements: Measurements = NO_MEASUREMENTS) -> np.ndarray:
    """planner.evaluate's iteration time for each trial's strategy under `params`, with the
    trial's own measurements if it has them, else `measurements`."""
    models: dict = {}
    out = np.empty(len(trials))
    for i, t in enumerate(trials):
        m = getattr(t, "measurements", None) or measurements
        if id(m) not in models:
            models[id(m)] = CostModel(spec, cost_params=params, measurements=m)
        out[i] = evaluate(spec, t.strategy, model=models[id(m)]).iteration_time_s
    return out


def mape(pred, meas) -> float:
    """Mean absolute percentage error of predicted against measured times (a fraction)."""
    pred, meas = np.asarray(pred, float), np.asarray(meas, float)
    return float(np.mean(np.abs(pred / meas - 1.0))) if len(meas) else float("nan")


def _select(n: int, fit_on) -> np.ndarray:
    if fit_on is None:
        return np.ones(n, dtype=bool)
    idx = list(fit_on)
    mask = np.zeros(n, dtype=bool)
    if idx and all(isinstance(x, (bool, np.bool_)) for x in idx):
        if len(idx) != n:
            raise UsageError(f"fit_on has {len(idx)} flags for {n} trials")
        mask[:] = idx
    else:
        for i in idx:
            if not 0 <= int(i) < n:
                raise UsageError(f"fit_on index {i} is out of range for {n} trials")
            mask[int(i)] = True
    if not mask.any():
        raise UsageError("fit_on selects no trial to fit")
    return mask


def calibrate(spec: Spec, records, *, fit_on=None, initial: CostParams | None = None,
              regularization: float = 1e-4,
              measurements: Measurements = NO_MEASUREMENTS) -> Calibration:
    """Least-squares fit of the free coefficients to measured trials.

    records: MeasuredTrial (or see `as_trials`); fit_on: indices (or one bool per record) of
    the trials to fit on; the rest are held out and scored. `initial` is the uncalibrated
    model (default: CostParams() with the framework overheads the layer profiles measured,
    `costing.measured_overheads`), which is also the starting point. `measurements`: the
    layer profiles and link fits to predict with (the calibration they hold is not used:
    `initial` is).
    """
    from scipy.optimize import least_squares

    from .profiling.store import now_iso

    trials = as_trials(records)
    if not trials:
        raise UsageError("no measured trials to calibrate with; run `amp-search launch` first")
    bad = [t.label or t.strategy.label() for t in trials
           if not (t.measured_s > 0 and math.isfinite(t.measured_s))]
    if bad:
        raise UsageError(f"trial {bad[0]} has no positive measured time")
    n_dev = spec.cluster.num_devices
    wrong = [t.strategy.label() for t in trials if t.strategy.num_devices != n_dev
             or t.strategy.global_batch_size != spec.training.global_batch_size]
    if wrong:
        raise UsageError(f"trial {wrong[0]} does not belong to this spec ({n_dev} devices, "
                         f"global batch {spec.training.global_batch_size})")
    mask = _select(len(trials), fit_on)
    initial = initial or measured_overheads(measurements)[0]
    meas = np.array([t.measured_s for t in trials])
    fit_trials = [t for t, m in zip(trials, mask) if m]
    meas_fit = meas[mask]

    coefs = _coefficients(spec, measurements)
    theta0 = np.array([min(max(c.to_theta(_get(initial, c)), c.lo), c.hi) for c in coefs])
    pred0 = predict(spec, trials, initial, measurements=measurements)

    # which coefficients the fitted trials constrain at all
    base = pred0[mask]
    active = []
    for i, c in enumerate(coefs):
        th = theta0.copy()
        th[i] = th[i] + 0.5 if th[i] + 0.5 <= c.hi else th[i] - 0.5
        moved = predict(spec, fit_trials, _with(initial, coefs, th), measurements=measurements)
        if np.any(np.abs(moved / base - 1.0) > 1e-9):
            active.append(i)
    act = np.array(active, dtype=int)

    def residual(x):
        th = theta0.copy()
        th[act] = x
        pred = predict(spec, fit_trials, _with(initial, coefs, th), measurements=measurements)
        return np.concatenate([pred / meas_fit - 1.0,
                               math.sqrt(regularization) * (x - theta0[act])])

    params = initial
    if len(act):
        lo = np.array([coefs[i].lo for i in act])
        hi = np.array([coefs[i].hi for i in act])
        starts = [theta0[act]]
        # a second start: compute scaled so that the mean prediction matches
        ratio = float(np.median(meas_fit / base))
        alt = theta0[act].copy()
        for k, i in enumerate(act):
            if coefs[i].field == "compute_scale":
                alt[k] = min(max(alt[k] + math.log(ratio), lo[k]), hi[k])
        if not np.allclose(alt, starts[0]):
            starts.append(alt)
        best = None
        for x0 in starts:
            x0 = np.clip(x0, lo, hi)
            r = least_squares(residual, x0, bounds=(lo, hi), method="trf", diff_step=1e-4,
                              x_scale=1.0, max_nfev=400)
            if best is None or r.cost < best.cost:
                best = r
        th = theta0.copy()
        th[act] = best.x
        params = _with(initial, coefs, th)
    pred1 = predict(spec, trials, params, measurements=measurements)
    scored = ~mask if (~mask).any() else mask
    rows = tuple(TrialFit(label=t.label or t.strategy.label(), measured_s=t.measured_s,
                          predicted_before_s=float(b), predicted_after_s=float(a),
                          in_fit=bool(m))
                 for t, b, a, m in zip(trials, pred0, pred1, mask))
    return Calibration(params=params, initial=initial,
                       mape_before=mape(pred0[scored], meas[scored]),
                       mape_after=mape(pred1[scored], meas[scored]),
                       fit_mape_before=mape(pred0[mask], meas[mask]),
                       fit_mape_after=mape(pred1[mask], meas[mask]),
                       n_trials=len(trials), n_fit=int(mask.sum()),
                       fitted=tuple(coefs[i].name for i in act),
                       values={coefs[i].name: (_get(initial, coefs[i]), _get(params, coefs[i]))
                               for i in act},
                       devices=device_types(spec), precision=spec.training.precision, rows=rows,
                       spec_sha256=spec.sha256, created=now_iso())


# ----------------------------------------------------------------------------- storage

def save_calibration(cal: Calibration, spec: Spec, directory: Path) -> Path:
    """Write the calibration where `load_measurements` finds it: `directory` is the layer
    profile folder of a profiles root (amp_search.measurements.layer_profile_dir)."""
    path = calibration_path(spec, directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(cal.to_dict(), indent=1) + "\n")
    os.replace(tmp, path)
    object.__setattr__(cal, "path", path)
    return path
