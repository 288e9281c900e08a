"""Does the memory model hold on published peaks of real Megatron-LM runs? (Issue 21, item 5.)

Megatron-LM's functional tests publish, per GPU type, the memory of their `*_memory_speed`
runs as golden values: `mem-allocated-bytes` (what stays allocated after a step: weights,
gradient buffers, optimizer state) and `mem-max-allocated-bytes` (the caching allocator's
peak: that plus the activations and temporaries of the step). Megatron-LM logs them on the
last rank (`_set_tensorboard_writer`: rank world_size - 1), which under pipeline parallelism
is on the last stage. The runs' arguments are in each test's model_config.yaml: a 7B GPT
(32 layers, hidden 4096, 32 heads, 8 query groups, the default 4h GeLU MLP, LayerNorm,
learned positions, biases, untied embeddings, Megatron-LM's default hidden dropout 0.1),
sequence 8192, bf16 (so fp32 gradient buffers: pretrain_gpt.py accumulates in fp32 with
bf16), the distributed optimizer, Transformer Engine in deterministic mode (fused attention:
no stored scores), no sequence parallelism, no recomputation, global batch 8 on one node of
8 GPUs.

Each run is costed as written (model.hidden_dropout: 0.1), with no fixed framework memory
(the allocator's counters exclude the CUDA context and NCCL's buffers), on the stage
Megatron-LM logs. Nothing is fitted here.

    python benchmarks/published_memory.py [--json out.json]

Exits 1 when a peak is off by more than 5%.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search import estimate  # noqa: E402
from amp_search.spec import parse_spec  # noqa: E402

TARGET = 0.05
SOURCE = "NVIDIA/Megatron-LM tests/functional_tests/test_cases/gpt"


@dataclass(frozen=True)
class Published:
    test: str
    gpu: str
    golden_commit: str
    pp: int
    dp: int
    tmp: int
    mbs: int
    virtual_stages: int
    vocab_size: int
    allocated_bytes: int
    """mem-allocated-bytes after a step (steps 2-25 alike)."""
    max_allocated_bytes: int
    """mem-max-allocated-bytes from step 2 on."""


RUNS = (
    Published("gpt3_7b_tp4_pp1_memory_speed", "H100-80GB", "acb150e84708", 1, 2, 4, 2, 1,
              131072, 20_663_519_232, 57_143_791_616),
    Published("gpt3_7b_tp4_pp1_memory_speed", "A100-80GB", "57a0267265f6", 1, 2, 4, 2, 1,
              131072, 20_634_103_808, 58_188_115_968),
    # --num-layers-per-virtual-pipeline-stage 1: 8 chunks of one layer per stage
    Published("gpt3_7b_tp1_pp4_memory_speed", "H100-80GB", "d3fbbcad6146", 4, 2, 1, 1, 8,
              131073, 24_540_168_192, 60_518_424_576),
    Published("gpt3_7b_tp1_pp4_memory_speed", "A100-80GB", "72a2714a40e6", 4, 2, 1, 1, 8,
              131073, 24_510_808_064, 60_489_064_448),
)


def spec_of(run: Published):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": run.gpu, "count": 1, "gpus_per_node": 8,
                               "intra_node_bandwidth": "300 GB/s",
                               "inter_node_bandwidth": "200 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 32, "hidden_size": 4096,
                  "num_attention_heads": 32, "num_query_groups": 8, "ffn_hidden_size": 16384,
                  "mlp": "gelu", "norm": "layernorm", "position_embedding": "learned",
                  "bias": True, "tie_embeddings": False, "vocab_size": run.vocab_size,
                  "seq_length": 8192, "hidden_dropout": 0.1},
        "training": {"global_batch_size": 8, "precision": "bf16", "backend": "megatron",
                     "zero_stage": 1, "activation_checkpointing": "none",
                     "sequence_parallel": False, "grad_reduce_in_fp32": True,
                     "attention": "flash", "framework_overhead": "0 GiB"}})


def predict(run: Published) -> dict:
    e = estimate(spec_of(run), pp=run.pp, dp=run.dp, tmp=run.tmp, mbs=run.mbs,
                 virtual_stages=run.virtual_stages, zero_stage=1,
                 activation_checkpointing="none", sequence_parallel=False)
    last = e.memory[-1]                  # the stage of rank world_size - 1
    states = last.parameter_bytes + last.gradient_bytes + last.optimizer_bytes
    return {"test": run.test, "gpu": run.gpu,
            "source": f"{SOURCE}/{run.test}/golden_values_dev_dgx_"
                      f"{'h100' if run.gpu.startswith('H100') else 'a100'}.json@"
                      f"{run.golden_commit}",
            "layout": f"pp{run.pp} dp{run.dp} tp{run.tmp} mbs{run.mbs}"
                      + (f" vp{run.virtual_stages}" if run.virtual_stages > 1 else ""),
            "published_allocated_bytes": run.allocated_bytes,
            "predicted_states_bytes": states,
            "states_error": states / run.allocated_bytes - 1.0,
            "published_peak_bytes": run.max_allocated_bytes,
            "predicted_peak_bytes": last.peak_bytes,
            "predicted_activation_bytes": last.activation_bytes,
            "peak_error": last.peak_bytes / run.max_allocated_bytes - 1.0}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args(argv)
    rows = [predict(r) for r in RUNS]
    gb = 1e9
    print(f"{'test':30} {'GPU':10} {'layout':24} {'states GB':>18} {'err':>6}  "
          f"{'peak GB':>16} {'err':>6}")
    for r in rows:
        print(f"{r['test']:30} {r['gpu']:10} {r['layout']:24} "
              f"{r['predicted_states_bytes'] / gb:7.2f} / {r['published_allocated_bytes'] / gb:7.2f}"
              f" {r['states_error']:+6.1%}  {r['predicted_peak_bytes'] / gb:6.2f} / "
              f"{r['published_peak_bytes'] / gb:6.2f} {r['peak_error']:+6.1%}")
    print("predicted / published: states = weights + gradients + optimizer after a step "
          "(mem-allocated-bytes); peak = mem-max-allocated-bytes, on the last rank")
    worst = max(abs(r["peak_error"]) for r in rows)
    ok = worst <= TARGET
    print(f"worst peak error {worst:.1%} (target <= {TARGET:.0%})"
          + ("" if ok else ": MISSED"))
    if args.json:
        args.json.write_text(json.dumps({"runs": rows, "worst_peak_error": worst,
                                         "target": TARGET, "passed": ok}, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
