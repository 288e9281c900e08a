"""The default model against Megatron-LM's published iteration times for 22B-1T GPT models
(Korthikanti et al. 2022, Table 5: full recomputation vs selective recomputation + sequence
parallelism, A100 GPUs).

    python benchmarks/megatron_table5.py [--data benchmarks/data/korthikanti2022_table5.csv]
                                         [--json out.json]

Each row of the CSV (its header lines say where the numbers come from) becomes a spec built in
code: A100-80GB nodes of 8 GPUs from the catalog (the row's GPU count), 300 GB/s NVLink inside
a node (the A100 data sheet, as benchmarks/gpu_accuracy.py writes it; the cost model prices it
at the catalog's nvlink share), 1,600 Gbps per node across
nodes (a DGX A100's eight 200 Gb/s HDR InfiniBand adapters: an assumption about the paper's
cluster, not read from it), GPT preset with the row's heads, hidden, layers and sequence,
vocabulary 51,200 (GPT-2's, padded), fp16, standard (unfused) attention and the pipeline's
scatter/gather of boundary activations (`training.pipeline_p2p: split`) and the interleaved
schedule's P2P not overlapped with the chunks (`training.overlap_p2p_comm: false`), as
Megatron-LM ran in 2022, `training.backend: megatron`, the row's global batch. It is
predicted with the public library call and the default model:

    estimate(spec, pp, dp, tmp, mbs, partition="uniform", zero_stage=0,
             activation_checkpointing="full" | "selective", sequence_parallel=False | True)

and the script prints, per row, measured and predicted seconds per iteration and the error
(predicted / measured - 1), whether the prediction fits in 80 GB, and per model the measured
and predicted speed-up of selective + sequence parallel over full recomputation.

The paper's 175B and 530B runs use the interleaved schedule with 3 model chunks per device
(`virtual_stages`), and so do their predictions (`estimate(..., virtual_stages=3)`: Megatron's
uniform chunks, bubble divided by 3, P2P times 3, the steady state waiting for its share of
it as Megatron-LM's paired sends made it). The rows describe one data-parallel replica
group (dp 1), as the transcription does, so no data-parallel gradient reduction is charged.
Exit status 2 when a row cannot be predicted or the data file is malformed.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search.planner import estimate  # noqa: E402
from amp_search.spec import parse_spec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "korthikanti2022_table5.csv"
GPU = "A100-80GB"
GPUS_PER_NODE = 8
INTRA_NODE_BANDWIDTH = "300 GB/s"
INTER_NODE_BANDWIDTH = "1600 Gbps"
VOCAB_SIZE = 51200
PRECISION = "fp16"
ATTENTION = "standard"
PIPELINE_P2P = "split"
"""Megatron-LM of 2022 split the activation crossing a stage boundary over the tensor group
(--scatter-gather-tensors-in-pipeline, on by default then; megatron-core dropped it)."""
OVERLAP_P2P_COMM = False
"""The interleaved schedule's P2P beside the chunks came with megatron-core's overlap_p2p_comm
(2023); in 2022 each steady-state exchange was waited for."""
MODES = {"full": ("full", False), "selective_sp": ("selective", True)}
"""CSV mode -> (activation_checkpointing, sequence_parallel)."""
INT_FIELDS = ("heads", "hidden", "layers", "seq", "tmp", "pp", "dp", "gpus", "global_batch",
              "micro_batch", "virtual_stages")


def load_rows(path: Path) -> list[dict]:
    """The CSV's rows (lines starting with '#' are its source notes)."""
    with open(path, newline="") as f:
        lines = [x for x in f if not x.startswith("#")]
    rows = []
    for i, r in enumerate(csv.DictReader(lines), start=1):
        try:
            row = {k: int(r[k]) for k in INT_FIELDS}
            row.update(model=r["model"], mode=r["mode"],
                       measured_s=float(r["iteration_time_s"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SystemExit(f"{path}: row {i}: {exc!r}") from None
        if row["mode"] not in MODES:
            raise SystemExit(f"{path}: row {i}: mode {row['mode']!r}; accepted: "
                             f"{', '.join(MODES)}")
        rows.append(row)
    return rows


def spec_dict(row: dict) -> dict:
    ckpt, sp = MODES[row["mode"]]
    nodes = -(-row["gpus"] // GPUS_PER_NODE)
    if nodes * GPUS_PER_NODE != row["gpus"]:
        raise SystemExit(f"{row['model']}: {row['gpus']} GPUs are not whole nodes of "
                         f"{GPUS_PER_NODE}")
    return {
        "cluster": {"nodes": [{
            "gpu": GPU, "count": nodes, "gpus_per_node": GPUS_PER_NODE,
            "intra_node_bandwidth": INTRA_NODE_BANDWIDTH,
            "inter_node_bandwidth": INTER_NODE_BANDWIDTH}]},
        "model": {"preset": "gpt", "num_layers": row["layers"], "hidden_size": row["hidden"],
                  "num_attention_heads": row["heads"], "seq_length": row["seq"],
                  "vocab_size": VOCAB_SIZE},
        "training": {"global_batch_size": row["global_batch"], "precision": PRECISION,
                     "activation_checkpointing": ckpt, "sequence_parallel": sp,
                     "zero_stage": 0, "attention": ATTENTION, "backend": "megatron",
                     "pipeline_p2p": PIPELINE_P2P, "overlap_p2p_comm": OVERLAP_P2P_COMM},
    }


def predict(row: dict) -> dict:
    ckpt, sp = MODES[row["mode"]]
    e = estimate(parse_spec(spec_dict(row)), pp=row["pp"], dp=row["dp"], tmp=row["tmp"],
                 mbs=row["micro_batch"], partition="uniform", zero_stage=0,
                 activation_checkpointing=ckpt, sequence_parallel=sp,
                 virtual_stages=row["virtual_stages"])
    peak = max(m.peak_bytes for m in e.memory)
    return {"predicted_s": e.iteration_time_s, "fits": e.fits, "peak_gib": peak / 2**30,
            "bubble_s": e.breakdown.pipeline_bubble_s,
            "tensor_parallel_s": e.breakdown.tensor_parallel_s}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json", type=Path, metavar="FILE", help="write the rows as JSON ('-': "
                                                                "stdout)")
    args = ap.parse_args(argv)
    rows = load_rows(args.data)
    for row in rows:
        try:
            row.update(predict(row))
        except Exception as exc:  # noqa: BLE001 -- reported, then exit 2
            print(f"{row['model']} {row['mode']}: cannot predict: {exc}", file=sys.stderr)
            return 2
        row["error"] = row["predicted_s"] / row["measured_s"] - 1
    out = sys.stderr if args.json is not None and str(args.json) == "-" else sys.stdout
    print(f"{'model':>5} {'mode':>12} {'t':>2} {'p':>3} {'v':>2} {'mbs':>3} "
          f"{'measured s':>10} {'predicted s':>11} {'error':>7} {'peak GiB':>8}", file=out)
    for r in rows:
        note = "" if r["fits"] else "  (does not fit in 80 GB)"
        note += "  (interleaved 1F1B, as in the paper)" if r["virtual_stages"] > 1 else ""
        print(f"{r['model']:>5} {r['mode']:>12} {r['tmp']:>2} {r['pp']:>3} "
              f"{r['virtual_stages']:>2} {r['micro_batch']:>3} {r['measured_s']:>10.2f} "
              f"{r['predicted_s']:>11.2f} {r['error']:>+7.1%} {r['peak_gib']:>8.1f}{note}",
              file=out)
    errors = [abs(r["error"]) for r in rows]
    print(f"mean |error| {statistics.fmean(errors):.1%}, largest {max(errors):.1%} over "
          f"{len(rows)} rows", file=out)
    speedups = []
    by_model: dict[str, dict] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["mode"]] = r
    print("speed-up of selective + sequence parallel over full recomputation:", file=out)
    for model, modes in by_model.items():
        if set(modes) != set(MODES):
            continue
        f, s = modes["full"], modes["selective_sp"]
        m, p = f["measured_s"] / s["measured_s"], f["predicted_s"] / s["predicted_s"]
        speedups.append({"model": model, "measured": m, "predicted": p})
        print(f"  {model:>5}: measured {m:.3f}x, predicted {p:.3f}x", file=out)
    if args.json is not None:
        text = json.dumps({"rows": rows, "speedups": speedups}, indent=1)
        if str(args.json) == "-":
            print(text)
        else:
            args.json.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
