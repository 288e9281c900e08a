"""Does the default cost model predict real GPUs? 1,440 published A100 iterations (vTrain).

    python benchmarks/gpu_accuracy.py [--data benchmarks/data/vtrain-single-node-a100.csv]
                                      [--json out.json] [--csv predictions.csv]

The data (benchmarks/data/vtrain-single-node-a100.csv, provenance and MIT license in
benchmarks/data/README.md) are measured Megatron-LM GPT iterations on one A100 node: 2, 4 or 8
GPUs, 18 (tp, dp, pp) layouts, hidden 1024 or 2048, 12-24 layers, fp16, full recomputation,
1F1B, no gradient bucketing. Nothing is read from outside the repository.

1. every row becomes a spec built in code (one node of A100-80GB from the catalog with the row's
   GPU count, 300 GB/s NVLink inside the node (the A100 data sheet; priced at the catalog's
   nvlink share); GPT preset with the row's layers, hidden, heads
   and sequence, vocabulary 51,200 = GPT-2's padded to a multiple of 128; fp16, full
   recomputation, ZeRO 0, standard attention, backend megatron, the row's global batch); specs
   are built once per distinct shape;
2. it is predicted with the public library call only, the default model with no coefficient
   given: `estimate(spec, pp, dp, tmp, mbs, partition="uniform", zero_stage=0,
   activation_checkpointing=True)` (Megatron's uniform split: embedding on the first stage, head
   on the last);
3. figures, against the targets (the constants below; the transfer issue's: MAPE <= 8%, the
   median group Spearman >= 0.95, the best of the top 3 within 3% in every group):
   - MAPE over all rows;
   - mean signed error (predicted / measured - 1) per (tp, dp, pp) layout;
   - Spearman's rank correlation of predicted against measured time within each group of rows
     that share the model shape (hidden, layers), the GPU count and the global batch, i.e. the
     choices a user ranks (groups of fewer than 3 rows are skipped and counted; a group whose
     rows all get the same prediction is ranked not at all and counts as 0): median, and the
     worst (a figure, no longer a target);
   - top-1 regret per group: the measured time of the row the model ranks first, over the
     measured best of the group, minus 1 (rows tied for first: their mean): median, worst (a
     figure, no longer a target); beside it, the same for the best of the top k (k = 2-5;
     `amp-search launch --top-k k` runs the k strategies predicted fastest and keeps the
     measured best): k = 3 is the target;
   - the data's own micro-batch times (`microbatch_times`, `larger_microbatch_faster`): the
     pairs of micro-batch sizes of one layout whose larger micro-batch takes less time, which
     no model whose time grows with the work ranks as measured, and whether each group the
     top 3 miss has its measured best on one;
   - beside it, the noise-aware regret: the regret less the data's own run-to-run noise
     (`twin_noise`: the data has no repeated rows, so the noise is bounded from above by the
     median |log ratio| of pairs of runs that do the same per-GPU work and differ only in dp,
     0.51% on this file); the target applies to the strict regret;
   - the held-out figures of the fit (`held_out_report`): the free coefficients of the GPU
     model (FIT_COEFFICIENTS: the host time of a block pass, the host time of a tensor-parallel
     all-reduce per extra rank, the GPU's kernel floor per block pass) are fitted on one part
     of the data and scored on the other, for splits by model shape and by layout (never by
     row); the held-out part must be within 3 points of MAPE of the fitted part.
   `--fit` also fits them on all rows and on each split's halves and prints the values, which
   profiles/gpus.yaml holds for A100-80GB (with the split they came from).
The spec names the framework that ran them (training.backend: megatron): the memory traffic of
its fused bias-GeLU and bias-dropout-add kernels and of its backward
(cost_models.layers.elementwise_bytes_by_pass), and its paired P2P in 1F1B's steady state.
The script exits 1 when a target is missed (each miss is printed) and 2 when a row cannot be
predicted.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search import estimate  # noqa: E402
from amp_search.spec import parse_spec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "vtrain-single-node-a100.csv"

# targets (default model, no flags): the transfer issue's (MAPE, the best of the top 3, the
# median group Spearman), which replaced the worst group Spearman >= 0.7 and the top-1 regret
# <= 3% in every group of the issue before it; those two are still reported, as figures
TARGET_MAPE = 0.08                  # MAPE <= 8%
TARGET_LAYOUT_SIGNED_ERROR = 0.15   # every layout's mean signed error within +-15%
TARGET_SPEARMAN_MEDIAN = 0.95       # within-group Spearman, median >= 0.95
TARGET_SPEARMAN_WORST = 0.7         # ... the worst: reported beside it, not a target
TARGET_REGRET = 0.03                # regret <= 3% ...
TARGET_TOP_K = 3                    # ... of the best of the top 3 (`launch --top-k 3`), in
                                    # every group; the top-1 regret is reported beside it
MIN_GROUP_ROWS = 3                  # Spearman needs at least 3 rows
TOP_K = (2, 3, 4, 5)                # best of the top k: what `launch --top-k k` would keep
LARGER_MICROBATCH_FASTER = 0.03     # `larger_microbatch_faster`: by 3% or more

# the setup of the measurements (benchmarks/data/README.md)
GPU = "A100-80GB"
INTRA_NODE_BANDWIDTH = "300 GB/s"   # NVLink 3 GPU-to-GPU, one direction: the A100 data sheet
INTER_NODE_BANDWIDTH = "200 Gbps"   # unused: one node
VOCAB_SIZE = 51200                  # GPT-2's 50,257 padded to a multiple of 128
PRECISION = "fp16"
ATTENTION = "standard"              # Megatron-LM of 2022: unfused softmax and dropout
BACKEND = "megatron"                # the framework that ran them (its fusions, its P2P)
TARGET_HELD_OUT_POINTS = 0.03       # held-out MAPE within 3 points of the fitted part
SHIPPED_SPLIT = "layers 12,16 -> 20,24"
"""The split whose fitted half gave the coefficients profiles/gpus.yaml ships (fitted on the
12- and 16-layer models, scored on the 20- and 24-layer ones); the 3-point target applies to
it, the other splits are reported to show how the fit transfers."""

FIT_COEFFICIENTS = {  # CostParams field -> (start, lower, upper), seconds
    "host_block_pass_s": (1e-3, 1e-6, 1e-2),
    "host_tp_allreduce_per_rank_s": (2e-5, 1e-8, 1e-3),
    "kernel_floor_s": (3e-4, 1e-7, 5e-3),
}

COLUMNS = {  # CSV header -> field
    "# GPUs": "gpus", "global batch": "gbs", "micro batch": "mbs", "hidden size": "hidden",
    "attention heads": "heads", "# layers": "layers", "sequence length": "seq",
    "tensor parallelism": "tp", "data parallelism": "dp", "pipeline parallelism": "pp",
    "iteration time (ms)": "measured_ms",
}


def load_rows(path: Path) -> list[dict]:
    """The CSV as a list of dicts with the short field names of COLUMNS."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise SystemExit(f"{path}: missing columns {sorted(missing)}")
        rows = []
        for r in reader:
            row = {COLUMNS[k]: int(v) for k, v in r.items() if k in COLUMNS and k !=
                   "iteration time (ms)"}
            row["measured_ms"] = float(r["iteration time (ms)"])
            rows.append(row)
    return rows


def spec_dict(row: dict) -> dict:
    """The spec of one row, as the YAML of configs/a100-gpt7b.yaml would give it."""
    return {
        "cluster": {"nodes": [{
            "gpu": GPU, "count": 1, "gpus_per_node": row["gpus"],
            "intra_node_bandwidth": INTRA_NODE_BANDWIDTH,
            "inter_node_bandwidth": INTER_NODE_BANDWIDTH}]},
        "model": {"preset": "gpt", "num_layers": row["layers"], "hidden_size": row["hidden"],
                  "num_attention_heads": row["heads"], "seq_length": row["seq"],
                  "vocab_size": VOCAB_SIZE},
        "training": {"global_batch_size": row["gbs"], "precision": PRECISION,
                     "activation_checkpointing": "full", "zero_stage": 0,
                     "attention": ATTENTION, "backend": BACKEND},
    }


def layout(row: dict) -> str:
    return f"tp{row['tp']} dp{row['dp']} pp{row['pp']}"


def group_key(row: dict) -> tuple:
    """Rows a user would rank against each other: same model, GPU count and global batch."""
    return (row["hidden"], row["layers"], row["heads"], row["seq"], row["gpus"], row["gbs"])


def group_label(key: tuple) -> str:
    hidden, layers, heads, seq, gpus, gbs = key
    return f"h{hidden} L{layers} a{heads} s{seq} {gpus}gpu gbs{gbs}"


def predict(rows: list[dict], simulate: bool = False) -> list[str]:
    """Sets row['predicted_ms'] (None when the model refuses the row); returns the errors.
    simulate: the simulated iteration time (`estimate(..., simulate=True)`), not eq. 5 + 4."""
    specs: dict[tuple, object] = {}
    errors = []
    for row in rows:
        key = (row["gpus"], row["layers"], row["hidden"], row["heads"], row["seq"], row["gbs"])
        if key not in specs:
            specs[key] = parse_spec(spec_dict(row))
        try:
            e = estimate(specs[key], pp=row["pp"], dp=row["dp"], tmp=row["tp"], mbs=row["mbs"],
                         partition="uniform", zero_stage=0, activation_checkpointing=True,
                         simulate=simulate)
        except Exception as exc:  # noqa: BLE001 -- reported row by row, then exit 2
            row["predicted_ms"] = None
            errors.append(f"{group_label(group_key(row))} {layout(row)} mbs{row['mbs']}: "
                          f"{type(exc).__name__}: {exc}")
            continue
        row["predicted_ms"] = e.iteration_time_s * 1e3
    return errors


def spearman(x, y) -> float:
    from scipy.stats import spearmanr

    return float(spearmanr(x, y).statistic)


def twin_noise(rows: list[dict]) -> dict:
    """How much two measured runs of the same work differ, from the data alone (it has no
    repeated rows): 'twins' are rows with the same model, tp, pp, micro-batch and samples per
    replica (gbs / dp) that differ only in dp, so each GPU computes the same and only the ring
    of the gradient all-reduce grows. |log(t_a / t_b)| over the twin pairs (dp 2 -> 4 -> 8 of
    one shape) bounds the run-to-run noise from above (it includes the all-reduce's real
    growth). Its median is the tolerance of the noise-aware regret."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        by[(r["hidden"], r["layers"], r["heads"], r["seq"], r["tp"], r["pp"], r["mbs"],
            r["gbs"] // r["dp"])].append(r)
    diffs = []
    for twins in by.values():
        twins = sorted(twins, key=lambda r: r["dp"])
        diffs += [abs(float(np.log(b["measured_ms"] / a["measured_ms"])))
                  for a, b in zip(twins, twins[1:])]
    if not diffs:
        return {"pairs": 0, "median": 0.0, "p75": 0.0, "p90": 0.0}
    q = np.quantile(diffs, [0.5, 0.75, 0.9])
    return {"pairs": len(diffs), "median": float(q[0]), "p75": float(q[1]),
            "p90": float(q[2])}


def figures(rows: list[dict], noise: float | None = None) -> dict:
    """MAPE, per-layout signed error, within-group Spearman and top-1 regret of the rows that
    have a prediction. `noise` (a fraction; default: `twin_noise`'s median on these rows):
    the tolerance of the noise-aware regret, regret - noise where positive (a predicted best
    within the data's own run-to-run noise of the measured best is no model error); the
    strict regret is reported beside it."""
    ok = [r for r in rows if r.get("predicted_ms") is not None]
    twins = twin_noise(ok)
    if noise is None:
        noise = twins["median"]
    pred = np.array([r["predicted_ms"] for r in ok])
    meas = np.array([r["measured_ms"] for r in ok])
    signed = pred / meas - 1.0
    per_layout: dict[str, list[float]] = defaultdict(list)
    for r, s in zip(ok, signed):
        per_layout[layout(r)].append(float(s))
    layouts = {k: {"rows": len(v), "mean_signed_error": float(np.mean(v)),
                   "mape": float(np.mean(np.abs(v)))}
               for k, v in sorted(per_layout.items(), key=lambda kv: np.mean(kv[1]))}
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in ok:
        groups[group_key(r)].append(r)
    group_figs, skipped = [], 0
    for key, g in sorted(groups.items()):
        p = np.array([r["predicted_ms"] for r in g])
        m = np.array([r["measured_ms"] for r in g])
        # rows predicted equally fast (within 1e-9) are a tie the user breaks at random: the
        # regret is the mean over them
        tied = np.flatnonzero(p <= p.min() * (1 + 1e-9))
        i_pred, i_best = int(tied[0]), int(np.argmin(m))
        regret = float(m[tied].mean() / m[i_best] - 1.0)
        # what `amp-search launch --top-k k` keeps: the measured best of the k rows predicted
        # fastest (ties broken by the order of the rows)
        order = np.argsort(p, kind="stable")
        top_k = {k: float(m[order[:k]].min() / m[i_best] - 1.0) for k in TOP_K}
        fig = {"group": group_label(key), "rows": len(g), "regret": regret,
               "top_k_regret": top_k,
               "regret_beyond_noise": max(0.0, regret - noise),
               "predicted_best": " = ".join(f"{layout(g[i])} mbs{g[i]['mbs']}" for i in tied),
               "measured_best": f"{layout(g[i_best])} mbs{g[i_best]['mbs']}",
               "spearman": None, "constant_prediction": bool(len(tied) == len(g))}
        if len(g) >= MIN_GROUP_ROWS:
            # a prediction that is the same for every row ranks nothing: counted as 0
            fig["spearman"] = 0.0 if fig["constant_prediction"] else spearman(p, m)
        else:
            skipped += 1
        group_figs.append(fig)
    rhos = [g["spearman"] for g in group_figs if g["spearman"] is not None]
    constant = sum(1 for g in group_figs if g["spearman"] is not None
                   and g["constant_prediction"])
    regrets = [g["regret"] for g in group_figs]
    noisy = [g["regret_beyond_noise"] for g in group_figs]
    return {
        "rows": len(ok), "mape": float(np.mean(np.abs(signed))),
        "mean_signed_error": float(np.mean(signed)),
        "per_layout": layouts,
        "groups": group_figs, "groups_scored": len(rhos), "groups_skipped": skipped,
        "groups_constant_prediction": constant,
        "spearman_median": float(statistics.median(rhos)) if rhos else float("nan"),
        "spearman_worst": float(min(rhos)) if rhos else float("nan"),
        "regret_median": float(statistics.median(regrets)) if regrets else float("nan"),
        "regret_worst": float(max(regrets)) if regrets else float("nan"),
        "regret_groups_above_target": sum(1 for r in regrets if not r <= TARGET_REGRET),
        "top_k": {k: {"worst": float(max(g["top_k_regret"][k] for g in group_figs)),
                      "groups_above_target": sum(1 for g in group_figs
                                                 if not g["top_k_regret"][k] <= TARGET_REGRET)}
                  for k in TOP_K} if group_figs else {},
        "noise": noise, "twin_noise": twins,
        "regret_beyond_noise_median": float(statistics.median(noisy)) if noisy else
        float("nan"),
        "regret_beyond_noise_worst": float(max(noisy)) if noisy else float("nan"),
        "regret_beyond_noise_groups_above_target": sum(1 for r in noisy
                                                       if not r <= TARGET_REGRET),
    }


class Evaluator:
    """Every row's prediction under any CostParams, fast: one CostModel per spec (its layer
    times cached), the coefficients swapped in (the same evaluate() that `estimate` runs;
    `check_against_estimate` confirms it)."""

    def __init__(self, rows: list[dict]):
        from amp_search.placement import device_orders
        from amp_search.costing import CostModel
        from amp_search.search_space import Candidate

        self.rows = rows
        models: dict[tuple, CostModel] = {}
        self.items = []
        for row in rows:
            key = (row["gpus"], row["layers"], row["hidden"], row["heads"], row["seq"],
                   row["gbs"])
            if key not in models:
                models[key] = CostModel(parse_spec(spec_dict(row)))
            model = models[key]
            order = device_orders(model.spec.cluster, PRECISION)[0]
            c = Candidate(pp=row["pp"], dp=row["dp"], tmp=row["tp"], mbs=row["mbs"],
                          zero_stage=0, activation_checkpointing=True)
            self.items.append((model, order, c))
        self.measured_ms = np.array([r["measured_ms"] for r in rows])

    def predict_ms(self, params=None, idx=None) -> np.ndarray:
        from cost_models.params import CostParams

        params = params or CostParams()
        sel = range(len(self.items)) if idx is None else idx
        out = np.empty(len(sel))
        for k, i in enumerate(sel):
            model, order, c = self.items[i]
            model.params = params
            out[k] = model.evaluate(c, order, partition="uniform").iteration_time_s * 1e3
        return out

    def check_against_estimate(self, rows: list[dict]) -> None:
        fast = self.predict_ms()
        slow = np.array([r["predicted_ms"] for r in rows])
        if not np.allclose(fast, slow, rtol=1e-9):
            raise SystemExit("the fast evaluator disagrees with estimate()")


def fit(ev: Evaluator, idx) -> dict:
    """Least squares on log(predicted / measured) over the rows `idx`: the FIT_COEFFICIENTS of
    the catalog's GPU (log-scaled, within their bounds)."""
    from scipy.optimize import least_squares

    from cost_models.params import CostParams

    names = list(FIT_COEFFICIENTS)
    lo = np.log([FIT_COEFFICIENTS[n][1] for n in names])
    hi = np.log([FIT_COEFFICIENTS[n][2] for n in names])
    x0 = np.log([FIT_COEFFICIENTS[n][0] for n in names])
    meas = ev.measured_ms[idx]

    def params(x) -> CostParams:
        return CostParams(**{n: {GPU: float(np.exp(v))} for n, v in zip(names, x)})

    def resid(x):
        return np.log(ev.predict_ms(params(x), idx) / meas)

    r = least_squares(resid, x0, bounds=(lo, hi), diff_step=1e-3, max_nfev=200)
    return {n: float(np.exp(v)) for n, v in zip(names, r.x)}


def splits(rows: list[dict]) -> dict[str, tuple[list[int], list[int]]]:
    """(fit rows, held-out rows) by model shape and by layout, never by row."""
    by = defaultdict(list)
    for i, r in enumerate(rows):
        by[r["hidden"]].append(i)
    layouts = sorted({layout(r) for r in rows})
    half_a = set(layouts[0::2])
    a = [i for i, r in enumerate(rows) if layout(r) in half_a]
    b = [i for i, r in enumerate(rows) if layout(r) not in half_a]
    shallow = [i for i, r in enumerate(rows) if r["layers"] <= 16]
    deep = [i for i, r in enumerate(rows) if r["layers"] > 16]
    return {"hidden 1024 -> 2048": (by[1024], by[2048]),
            "hidden 2048 -> 1024": (by[2048], by[1024]),
            "layouts A -> B": (a, b), "layouts B -> A": (b, a),
            "layers 12,16 -> 20,24": (shallow, deep)}


def held_out_report(rows: list[dict], ev: Evaluator | None = None) -> dict:
    """For each split (`splits`): the coefficients fitted on one part, and the figures of
    `figures()` on that part and on the part the fit did not see."""
    from cost_models.params import CostParams

    ev = ev or Evaluator(rows)
    out = {}
    for name, (fit_idx, held_idx) in splits(rows).items():
        coef = fit(ev, fit_idx)
        pred = ev.predict_ms(CostParams(**{n: {GPU: v} for n, v in coef.items()}))
        parts = {}
        for part, idx in (("fitted", fit_idx), ("held_out", held_idx)):
            sub = [dict(rows[i], predicted_ms=float(pred[i])) for i in idx]
            f = figures(sub)
            parts[part] = {k: f[k] for k in ("rows", "mape", "spearman_median",
                                             "spearman_worst", "regret_median",
                                             "regret_worst", "regret_groups_above_target")}
            top = f["top_k"][TARGET_TOP_K]
            parts[part]["top_k_regret_worst"] = top["worst"]
            parts[part]["top_k_groups_above_target"] = top["groups_above_target"]
            parts[part]["layout_signed_min"] = min(v["mean_signed_error"]
                                                   for v in f["per_layout"].values())
            parts[part]["layout_signed_max"] = max(v["mean_signed_error"]
                                                   for v in f["per_layout"].values())
        parts["coefficients"] = coef
        out[name] = parts
    return out


SHAPE_KEYS = {"per (hidden, tp, mbs)": ("hidden", "tp", "mbs"),
              "per (hidden, tp, mbs, pp)": ("hidden", "tp", "mbs", "pp")}
"""Cells of the per-shape yardstick: what a measured layer profile knows that the analytic
model does not, the real time of a layer shape at each tensor-parallel degree and micro-batch
size (`amp-search profile` measures them per tmp and mbs); the finer key adds the pipeline
degree (its schedule's own overheads)."""


def _critical_path(row: dict) -> np.ndarray:
    """(block micro-batches, head micro-batches) on 1F1B's critical path: nmb + pp - 1
    micro-batch slots of the slowest stage, each through L / pp blocks (Megatron's uniform
    split) and, on the last stage, the head."""
    slots = row["gbs"] / (row["dp"] * row["mbs"]) + row["pp"] - 1
    return np.array([row["layers"] / row["pp"] * slots, slots])


def per_shape_ceiling(rows: list[dict]) -> dict:
    """How far per-shape measurements could take a model on this data: a yardstick for the
    rank targets, not a target. For each key of SHAPE_KEYS, each cell gets two corrections,
    fitted by least squares to (measured - predicted) on one half of the models of the shipped
    split (12 and 16 layers, or 20 and 24): seconds per block micro-batch and per head
    micro-batch on the critical path (`_critical_path`), what measured block and head times
    would change. They are added to the predictions of the other half, which they never saw;
    figures() of that half. A cell with fewer than 2 rows in the fitting half keeps the
    model's prediction. The rows need 'predicted_ms'."""
    ok = [r for r in rows if r.get("predicted_ms") is not None]
    shallow, deep = splits(ok)[SHIPPED_SPLIT]
    halves = {"layers 12,16 -> 20,24": (shallow, deep), "layers 20,24 -> 12,16": (deep, shallow)}
    out = {}
    for name, keys in SHAPE_KEYS.items():
        for direction, (learn, other) in halves.items():
            x: dict[tuple, list] = defaultdict(list)
            y: dict[tuple, list] = defaultdict(list)
            for r in (ok[i] for i in learn):
                cell = tuple(r[k] for k in keys)
                x[cell].append(_critical_path(r))
                y[cell].append(r["measured_ms"] - r["predicted_ms"])
            fix = {cell: np.linalg.lstsq(np.array(x[cell]), np.array(y[cell]), rcond=None)[0]
                   for cell in x if len(x[cell]) >= 2}
            held = [dict(r, predicted_ms=r["predicted_ms"] + float(
                        _critical_path(r) @ fix.get(tuple(r[k] for k in keys), np.zeros(2))))
                    for r in (ok[i] for i in other)]
            f = figures(held)
            top = f["top_k"].get(TARGET_TOP_K, {})
            out[f"{name}, {direction}"] = {
                k: f[k] for k in ("rows", "mape", "spearman_median", "spearman_worst",
                                  "regret_worst", "regret_groups_above_target")
            } | {"groups": len(f["groups"]), "cells": len(fix),
                 # the target's own measure: the best of the top k (launch --top-k)
                 "top_k_regret_worst": top.get("worst", float("nan")),
                 "top_k_groups_above_target": top.get("groups_above_target", 0)}
    return out


MICROBATCH_CELL = ("hidden", "layers", "heads", "seq", "gpus", "tp", "dp", "pp")
"""A layout of one model: the rows that differ only in the micro-batch size and the global
batch (`microbatch_times`)."""


def microbatch_times(rows: list[dict]) -> dict[tuple, float]:
    """The data's own time of one micro-batch, per layout (MICROBATCH_CELL) and micro-batch
    size: the slope of the measured iteration time over the micro-batches each pipeline runs
    (gbs / (dp mbs)), by least squares over the global batches measured. Under 1F1B the
    iteration is (m + pp - 1) micro-batch slots of the slowest stage plus what does not
    depend on m (the optimizer step, the gradient sync), so the slope is the slowest stage's
    time per micro-batch, free of those. Cells with one micro-batch count are left out."""
    by: dict[tuple, list[tuple[float, float]]] = defaultdict(list)
    for r in rows:
        by[tuple(r[k] for k in MICROBATCH_CELL) + (r["mbs"],)].append(
            (r["gbs"] / (r["dp"] * r["mbs"]), r["measured_ms"]))
    out = {}
    for cell, points in by.items():
        m = np.array([x for x, _ in points])
        if np.ptp(m) == 0:
            continue
        t = np.array([y for _, y in points])
        out[cell] = float(np.polyfit(m, t, 1)[0])
    return out


def _times_by_layout(rows: list[dict]) -> dict[tuple, dict[int, float]]:
    """`microbatch_times` grouped by layout (MICROBATCH_CELL): micro-batch size -> time."""
    out: dict[tuple, dict[int, float]] = defaultdict(dict)
    for cell, t in microbatch_times(rows).items():
        out[cell[:-1]][cell[-1]] = t
    return out


def larger_microbatch_faster(rows: list[dict],
                             tolerance: float = LARGER_MICROBATCH_FASTER) -> list[dict]:
    """Where the data's micro-batch time falls as the micro-batch grows (`microbatch_times`):
    each pair of successive micro-batch sizes of one layout whose larger micro-batch, more
    samples through the same layers, takes at least `tolerance` less time. Sorted by how much
    less. No cost model whose time grows with the work of a micro-batch can rank such rows
    as measured: it puts the larger micro-batch's rows too slow against the others."""
    return _faster_pairs(_times_by_layout(rows), tolerance)


def _faster_pairs(by_layout: dict[tuple, dict[int, float]], tolerance: float) -> list[dict]:
    """`larger_microbatch_faster` on the times `_times_by_layout` gives."""
    out = []
    for layout_key, by_mbs in by_layout.items():
        ms = sorted(by_mbs)
        for small, large in zip(ms, ms[1:]):
            if by_mbs[large] < by_mbs[small] * (1.0 - tolerance):
                out.append(dict(zip(MICROBATCH_CELL, layout_key),
                                mbs_small=small, mbs_large=large,
                                microbatch_ms_small=by_mbs[small],
                                microbatch_ms_large=by_mbs[large],
                                change=by_mbs[large] / by_mbs[small] - 1.0))
    return sorted(out, key=lambda d: d["change"])


def data_monotonicity(rows: list[dict], f: dict) -> dict:
    """`larger_microbatch_faster` on the rows, out of how many pairs of successive
    micro-batch sizes, and for each group whose best of the top TARGET_TOP_K misses the
    target (figures `f`), whether its measured best runs on the larger micro-batch of such a
    pair."""
    by_layout = _times_by_layout(rows)
    faster = _faster_pairs(by_layout, LARGER_MICROBATCH_FASTER)
    pairs = sum(max(len(v) - 1, 0) for v in by_layout.values())
    on_larger = {tuple(d[k] for k in MICROBATCH_CELL) + (d["mbs_large"],) for d in faster}
    best_rows = {}
    for r in rows:
        g = group_label(group_key(r))
        if g not in best_rows or r["measured_ms"] < best_rows[g]["measured_ms"]:
            best_rows[g] = r
    missed = []
    for g in f["groups"]:
        if g["top_k_regret"].get(TARGET_TOP_K, 0.0) <= TARGET_REGRET:
            continue
        best = best_rows[g["group"]]
        missed.append({"group": g["group"], "measured_best": g["measured_best"],
                       "regret": g["top_k_regret"][TARGET_TOP_K],
                       "best_on_a_faster_larger_microbatch": tuple(
                           best[k] for k in MICROBATCH_CELL) + (best["mbs"],) in on_larger})
    return {"pairs": pairs, "tolerance": LARGER_MICROBATCH_FASTER,
            "larger_microbatch_faster": faster, "top_k_missed": missed}


def misses(f: dict, held_out: dict | None = None) -> list[str]:
    out = []
    for split, parts in (held_out or {}).items():
        gap = parts["held_out"]["mape"] - parts["fitted"]["mape"]
        if split == SHIPPED_SPLIT and gap > TARGET_HELD_OUT_POINTS:
            out.append(f"{split}: held-out MAPE {parts['held_out']['mape']:.1%} is "
                       f"{100 * gap:.1f} points above the fitted part's")
    if not f["mape"] <= TARGET_MAPE:
        out.append(f"MAPE {f['mape']:.1%} > {TARGET_MAPE:.0%}")
    for name, lay in f["per_layout"].items():
        if not abs(lay["mean_signed_error"]) <= TARGET_LAYOUT_SIGNED_ERROR:
            out.append(f"layout {name}: mean signed error {lay['mean_signed_error']:+.1%} "
                       f"beyond +-{TARGET_LAYOUT_SIGNED_ERROR:.0%}")
    if not f["spearman_median"] >= TARGET_SPEARMAN_MEDIAN:
        out.append(f"within-group Spearman median {f['spearman_median']:.3f} < "
                   f"{TARGET_SPEARMAN_MEDIAN}")
    top = f["top_k"].get(TARGET_TOP_K) if f["top_k"] else None
    if top is not None and top["groups_above_target"]:
        out.append(f"best of the top {TARGET_TOP_K} more than {TARGET_REGRET:.0%} off the "
                   f"measured best in {top['groups_above_target']} of {len(f['groups'])} "
                   f"groups (worst {top['worst']:.1%})")
    return out


def report(f: dict, held_out: dict | None, elapsed_s: float, ceiling: dict | None = None,
           monotonicity: dict | None = None) -> None:
    print(f"{f['rows']} rows, predicted in {elapsed_s:.2f} s")
    print(f"MAPE {f['mape']:.1%} (target <= {TARGET_MAPE:.0%}); mean signed error "
          f"{f['mean_signed_error']:+.1%}")
    print()
    print(f"mean signed error per layout (target within +-{TARGET_LAYOUT_SIGNED_ERROR:.0%})")
    print(f"  {'layout':16} {'rows':>5} {'signed':>8} {'MAPE':>7}")
    for name, lay in f["per_layout"].items():
        flag = "" if abs(lay["mean_signed_error"]) <= TARGET_LAYOUT_SIGNED_ERROR else "  MISSED"
        print(f"  {name:16} {lay['rows']:>5} {lay['mean_signed_error']:>+8.1%} "
              f"{lay['mape']:>7.1%}{flag}")
    print()
    print(f"within-group Spearman ({f['groups_scored']} groups of >= {MIN_GROUP_ROWS} rows; "
          f"{f['groups_skipped']} groups of fewer rows skipped; "
          f"{f['groups_constant_prediction']} with the same prediction for every row, counted "
          f"as 0): median "
          f"{f['spearman_median']:.3f} (target >= {TARGET_SPEARMAN_MEDIAN}), worst "
          f"{f['spearman_worst']:.3f} (not a target since the transfer issue; it was >= "
          f"{TARGET_SPEARMAN_WORST})")
    scored = sorted((g for g in f["groups"] if g["spearman"] is not None),
                    key=lambda g: g["spearman"])
    for g in scored[:5]:
        print(f"  {g['group']:34} {g['rows']:>3} rows  Spearman {g['spearman']:+.3f}")
    print()
    n_bad = sum(1 for g in f["groups"] if not g["regret"] <= TARGET_REGRET)
    print(f"top-1 regret ({len(f['groups'])} groups; not a target since the transfer issue, "
          f"the best of the top {TARGET_TOP_K} is): median {f['regret_median']:.1%}, worst "
          f"{f['regret_worst']:.1%}; {n_bad} groups above {TARGET_REGRET:.0%}")
    for g in sorted(f["groups"], key=lambda g: -g["regret"])[:5]:
        print(f"  {g['group']:34} regret {g['regret']:>6.1%}  predicted best "
              f"{g['predicted_best']}, measured best {g['measured_best']}")
    tw = f["twin_noise"]
    print(f"noise-aware top-1 regret (regret less the data's run-to-run noise, {f['noise']:.2%}: "
          f"the median difference of {tw['pairs']} pairs of runs of the same per-GPU work that "
          f"differ only in dp; p75 {tw['p75']:.2%}, p90 {tw['p90']:.2%}): median "
          f"{f['regret_beyond_noise_median']:.1%}, worst {f['regret_beyond_noise_worst']:.1%}; "
          f"{f['regret_beyond_noise_groups_above_target']} groups above {TARGET_REGRET:.0%} "
          f"(the target applies to the strict figure)")
    if f["top_k"]:
        print("best of the top k (the measured best of the k strategies predicted fastest, what "
              "`amp-search launch --top-k k` keeps), regret: " + "; ".join(
                  f"k={k} worst {v['worst']:.1%}, {v['groups_above_target']} groups above "
                  f"{TARGET_REGRET:.0%}" for k, v in f["top_k"].items())
              + f" (target: k={TARGET_TOP_K} within {TARGET_REGRET:.0%} in every group)")
    if monotonicity is not None:
        m = monotonicity
        faster = m["larger_microbatch_faster"]
        print()
        print(f"the data's own micro-batch times (`microbatch_times`: the slope of the measured "
              f"time over each pipeline's micro-batches, per layout and micro-batch size): in "
              f"{len(faster)} of {m['pairs']} pairs of successive micro-batch sizes of one "
              f"layout, the larger micro-batch takes {m['tolerance']:.0%} or more less time, "
              f"which no model whose time grows with a micro-batch's work ranks as measured")
        for d in faster[:5]:
            print(f"  h{d['hidden']} L{d['layers']} {d['gpus']}gpu tp{d['tp']} dp{d['dp']} "
                  f"pp{d['pp']}: mbs{d['mbs_small']} {d['microbatch_ms_small']:.1f} ms, "
                  f"mbs{d['mbs_large']} {d['microbatch_ms_large']:.1f} ms ({d['change']:+.0%})")
        for g in m["top_k_missed"]:
            on = "on" if g["best_on_a_faster_larger_microbatch"] else "not on"
            print(f"  best of the top {TARGET_TOP_K} missed in {g['group']} ({g['regret']:.1%}): "
                  f"the measured best, {g['measured_best']}, is {on} such a larger micro-batch")
    print()
    print("held-out figures of the fit")
    if held_out is None:
        print("  not run (--no-held-out, --simulate, or rows that could not be predicted)")
    else:
        for split, parts in held_out.items():
            coef = ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in parts["coefficients"].items())
            shipped = "  (shipped in profiles/gpus.yaml)" if split == SHIPPED_SPLIT else ""
            print(f"  {split}: {coef}{shipped}")
            for part in ("fitted", "held_out"):
                p = parts[part]
                print(f"    {part:9} {p['rows']:>4} rows  MAPE {p['mape']:6.1%}  layout signed "
                      f"[{p['layout_signed_min']:+.1%}, {p['layout_signed_max']:+.1%}]  "
                      f"Spearman median {p['spearman_median']:.3f} worst "
                      f"{p['spearman_worst']:+.3f}  regret worst {p['regret_worst']:.1%} "
                      f"({p['regret_groups_above_target']} groups > {TARGET_REGRET:.0%}), "
                      f"best of the top {TARGET_TOP_K} worst {p['top_k_regret_worst']:.1%} "
                      f"({p['top_k_groups_above_target']} groups)")
    if ceiling:
        print()
        print("per-shape yardstick, not a target (per_shape_ceiling): each cell's time per block "
              "and per head micro-batch corrected, as measured layer times would, by what the "
              "other half of the models measured")
        for name, p in ceiling.items():
            print(f"  {name:48} {p['rows']:>4} rows  MAPE {p['mape']:5.1%}  Spearman median "
                  f"{p['spearman_median']:.3f} worst {p['spearman_worst']:+.3f}  regret worst "
                  f"{p['regret_worst']:5.1%} ({p['regret_groups_above_target']} of "
                  f"{p['groups']} groups > {TARGET_REGRET:.0%}); best of the top "
                  f"{TARGET_TOP_K} worst {p['top_k_regret_worst']:.1%} "
                  f"({p['top_k_groups_above_target']} groups > {TARGET_REGRET:.0%})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA, help="the measurements (CSV)")
    ap.add_argument("--json", type=Path, help="write all the figures to this file")
    ap.add_argument("--csv", type=Path, help="write the per-row predictions to this file")
    ap.add_argument("--fit", action="store_true",
                    help="also fit the coefficients on all rows and print them")
    ap.add_argument("--no-held-out", action="store_true",
                    help="skip the held-out refits (the default model's figures only)")
    ap.add_argument("--simulate", action="store_true",
                    help="score the simulated iteration time (amp_search.simulate) instead of "
                         "the closed form; the held-out refits, which fit the closed form, are "
                         "skipped")
    args = ap.parse_args(argv)
    if args.simulate:
        args.no_held_out = True

    rows = load_rows(args.data)
    t0 = time.perf_counter()
    errors = predict(rows, simulate=args.simulate)
    elapsed = time.perf_counter() - t0
    if errors:
        print(f"{len(errors)} rows could not be predicted:")
        for e in errors:
            print(f"  {e}")
        print()
    f = figures(rows)
    held_out = None
    if not errors and not args.no_held_out:
        ev = Evaluator(rows)
        ev.check_against_estimate(rows)
        t1 = time.perf_counter()
        held_out = held_out_report(rows, ev)
        print(f"(held-out refits: {time.perf_counter() - t1:.1f} s)")
        if args.fit:
            coef = fit(ev, list(range(len(rows))))
            print("fitted on all rows: " + ", ".join(f"{k} = {v * 1e6:.1f} us"
                                                     for k, v in coef.items()))
    ceiling = None if errors else per_shape_ceiling(rows)
    monotonicity = data_monotonicity(rows, f)
    report(f, held_out, elapsed, ceiling, monotonicity)
    missed = misses(f, held_out)
    print()
    if missed:
        print("targets missed:")
        for m in missed:
            print(f"  {m}")
    else:
        print("all targets met")

    if args.json:
        out = dict(f, data=str(args.data), predict_s=elapsed, unpredicted=errors,
                   held_out=held_out, per_shape_ceiling=ceiling,
                   data_monotonicity=monotonicity, missed=missed,
                   targets={"mape": TARGET_MAPE,
                            "layout_mean_signed_error": TARGET_LAYOUT_SIGNED_ERROR,
                            "spearman_median": TARGET_SPEARMAN_MEDIAN,
                            "regret": TARGET_REGRET, "top_k": TARGET_TOP_K})
        args.json.write_text(json.dumps(out, indent=2))
    if args.csv:
        fields = ["gpus", "gbs", "mbs", "hidden", "heads", "layers", "seq", "tp", "dp", "pp",
                  "measured_ms", "predicted_ms", "signed_error"]
        with open(args.csv, "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=fields)
            w.writeheader()
            for r in rows:
                p = r.get("predicted_ms")
                w.writerow(dict({k: r[k] for k in fields[:11]}, predicted_ms=p,
                                signed_error=None if p is None else p / r["measured_ms"] - 1))
    if errors:
        return 2
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
