"""Does the default cost model predict today's large runs? 278 published Megatron-Core runs.

    python benchmarks/megatron_bridge.py [--data benchmarks/data/megatron-bridge-performance.csv]
                                         [--json out.json] [--csv predictions.csv] [--rows]
                                         [--fit]

The data (benchmarks/data/megatron-bridge-performance.csv, provenance and license in
benchmarks/data/README.md) are NVIDIA's published throughputs of tuned Megatron-Bridge
recipes on DGX H100, B200, B300, GB200 and GB300 systems, 8 to 1,024 GPUs. Each row is one
recipe: its model, system, precision, GPUs, global and micro-batch, sequence, and TP, PP, CP,
VP, EP and FSDP sizes. The measured iteration time is global batch x sequence / (tokens/s/GPU x
GPUs).

1. every row the planner can express becomes a spec built in code:
   - the model by name from profiles/models.yaml (Llama 3 8B and 70B, Llama 3.1 405B, Qwen3
     30B-A3B and 235B-A22B, GPT-OSS 120B, Kimi-K2), at the row's sequence length;
   - the system from the catalog (SYSTEMS): DGX nodes of 8 GPUs with NVLink inside (450 GB/s a
     direction on H100, 900 GB/s on Blackwell) and one NIC per GPU (400 Gb/s ConnectX-7, 800 Gb/s
     ConnectX-8 on B300/GB300); an NVL72 rack (GB200, GB300) as a node of 64 GPUs, the usual
     job segment of 16 trays of 4, so that tensor, context and data groups inside it pay NVLink;
   - training as Megatron-Bridge's performance recipes run it: backend megatron, the distributed
     optimizer (zero_stage 1; Megatron-FSDP, zero_stage 3, where the row names an FSDP size),
     sequence parallelism where tp > 1, no recomputation, the row's precision (FP8, FP8-CS,
     MXFP8 and FP8-MX are all `fp8`: FP8 GEMMs, BF16 elsewhere), the CPU activation
     offloading of the Llama 3 70B FSDP recipes (CPU_OFFLOAD_LAYERS), and MoE layers
     that sync the host except in the MXFP8 MoE recipes from NeMo 26.06 on
     (training.moe_sync_free, SYNC_FREE_FROM);
   - full fine-tuning (`sft`) as pre-training: it runs the same passes over every weight
     (its packed sequences' shorter attention is not modelled); LoRA as
     `training.finetune: lora` (the weights frozen: input gradients only, no optimizer);
2. it is costed with the public library call only, the default model with no coefficient given:
   `estimate(spec, pp, dp, tmp, mbs, cp=cp, virtual_stages=vp, zero_stage=1,
   sequence_parallel=tp > 1, activation_checkpointing="none")`, the interleaved chunks as
   Megatron-LM splits them (or as the recipe's layout gives them, PIPELINE_LAYOUTS), dp =
   GPUs / (tp pp cp);
3. figures: MAPE and mean signed error over the expressible rows, per system, per precision and
   per model; the rows that cannot be expressed are counted with their reason.

`--ranks` plans each distinct recipe's cluster and global batch with tp, pp, dp, cp, virtual
stages, micro-batch, recomputation and sequence parallelism searched (closed form), and reports
where the published recipe ranks (or that it is predicted not to fit) and how the best plan's
predicted time compares with the recipe's (55 minutes on a 2-core machine: some of these are
1,024-GPU searches).
The plan keeps one row per layout (pp, dp, tmp, cp, mbs) with its fastest virtual stages and
recomputation, so a recipe whose knobs are not its layout's fastest has no row of its own: the
report gives its rank where it has one (its layout, virtual stages and expert parallelism),
its layout's rank, how the recipe's own knobs compare with the ones the plan keeps for that
layout (within the model's error of them: a tie the one row per layout does not show), and its
place by predicted time among the plan's rows (1 + the rows predicted faster than the recipe
as published). Whether the plan's best is predicted faster
than the recipe by more than the model's error is tested against the catalog's
prediction_error for that kind of model (dense, or its `moe:` figure: the error `plan` marks
ties within) and against the model's measured MAPE on that system for that kind of model in
each recipe's newest release (`kind_errors`); the counts are given for every recipe and for the fastest
published recipe of each setting (`setting_of`), the others having been superseded.

`--fit` fits the free coefficients these rows need, each split by GPU type or model, never by
row: the fraction of the FP8 dense peak that large FP8 GEMMs reach (`gemm_efficiency.fp8_max`
in profiles/gpus.yaml) on the Hopper dense rows, scored on the Blackwell rows, and the other
way round; the NVFP4 one on one Llama model's NVFP4 rows, scored on the other's; and the cost
per local expert of a MoE layer that syncs the host (`moe_expert_overhead`) on one Qwen3
model's rows, scored on the other MoE models'.

The script exits 1 when the MAPE target is missed and 2 when a row cannot be costed.
"""
from __future__ import annotations

import argparse
import csv
import json
import statistics
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from amp_search import estimate  # noqa: E402
from amp_search.errors import AmpSearchError  # noqa: E402
from amp_search.spec import load_catalog, parse_spec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "megatron-bridge-performance.csv"

TARGET_MAPE = 0.15                   # the modern-models issue: <= 15% (goal 10%)

NVL72_SEGMENT_GPUS = 64
"""GPUs of an NVL72 rack one job uses as its NVLink domain (16 compute trays of 4)."""


@dataclass(frozen=True)
class System:
    gpu: str
    gpus_per_node: int
    intra_node_bandwidth: str
    nic_gbps: int
    """One NIC per GPU, Gb/s one direction."""


SYSTEMS = {
    # DGX H100: NVLink 4, 900 GB/s bidirectional per GPU; 8 x ConnectX-7 400 Gb/s
    "DGX-H100": System("H100-80GB", 8, "450 GB/s", 400),
    # DGX B200: NVLink 5, 1.8 TB/s bidirectional per GPU; 8 x ConnectX-7 400 Gb/s
    "DGX-B200": System("B200-180GB", 8, "900 GB/s", 400),
    # DGX B300: NVLink 5; 8 x ConnectX-8 800 Gb/s
    "DGX-B300": System("B300-288GB", 8, "900 GB/s", 800),
    # GB200 NVL72: 72 GPUs on one NVLink 5 domain; one ConnectX-7 400 Gb/s per GPU
    "DGX-GB200": System("GB200-186GB", NVL72_SEGMENT_GPUS, "900 GB/s", 400),
    # GB300 NVL72: one ConnectX-8 800 Gb/s per GPU
    "DGX-GB300": System("GB300-288GB", NVL72_SEGMENT_GPUS, "900 GB/s", 800),
}

MODELS = {"LLAMA3_8B": "llama3-8b", "LLAMA3_70B": "llama3-70b",
          "LLAMA3.1_405B": "llama3.1-405b", "Qwen3_30B_a3B": "qwen3-30b-a3b",
          "Qwen3_235B_a22B": "qwen3-235b-a22b", "GPT OSS 120B": "gpt-oss-120b",
          "Kimi_K2": "kimi-k2", "DeepSeekV3": "deepseek-v3", "DeepSeekV3 (w/ MTP)": "deepseek-v3"}
"""The file's model names -> profiles/models.yaml."""
MOE_PRESETS = ("qwen3-30b-a3b", "qwen3-235b-a22b", "gpt-oss-120b", "kimi-k2", "deepseek-v3")
MTP_MODELS = {"DeepSeekV3", "DeepSeekV3 (w/ MTP)"}
"""The file's models whose recipes train with one multi-token-prediction depth
(model.mtp_num_layers 1): Megatron-Bridge's src/megatron/bridge/recipes/deepseek/
deepseek_v3.py sets mtp_num_layers 1, which its performance scripts keep (read through the
search tool); the 25.11 table names its runs with and without it."""
"""Those of them with experts (the 'kind' split of the report)."""

PRECISIONS = {"BF16": "bf16", "FP8": "fp8", "FP8-CS": "fp8", "MXFP8": "fp8", "FP8-MX": "fp8",
              "NVFP4": "nvfp4"}
"""The file's precisions -> training.precision (FP8 recipes differ in their scaling: delayed,
current (CS) or per-block (MX); all run the linear layers' GEMMs in FP8; NVFP4 runs them in
FP4 with an FP8 scale per 16 values)."""


KNOWN_REGRESSIONS = {
    "gpt-oss-note": "a regression its release names (\"Performance regression in GPT-OSS 120B "
                    "pre-training is a known issue (cudnn-frontend#256)\", fixed in 26.08): "
                    "not what the recipe runs at"}
"""Footnotes of the published tables that mark a measurement as a known regression, by the
footnote's name (the file keeps the marker, e.g. `661[^gpt-oss-note]`, in the TFLOP/s
column). Megatron-Bridge's docs/performance-summary.md, 26.06.01: "Performance regression in
GPT-OSS 120B pre-training is a known issue (cudnn-frontend#256). It will be resolved with the
next container release": cuDNN frontend's fused grouped MLP backward on sm100, which only the
GB200 and GB300 MXFP8 recipes run (cutedsl_fused_grouped_mlp); the same recipes ran 1.6x
faster in 26.08 (read through the search tool)."""


def unexpressed(row: dict) -> str:
    """Why a row cannot be costed yet ('' if it can), or why it is not scored (a measurement
    its release names a regression)."""
    model = row["model"]
    for note, why in KNOWN_REGRESSIONS.items():
        if f"[^{note}]" in row.get("model_tflops_per_gpu", ""):
            return why
    if row["workload"] not in ("pre-training", "sft", "lora"):
        return f"{row['workload']}: this workload is not modelled"
    if model == "DeepSeekV3 (w/o MTP)" and row["precision"] in PRECISIONS:
        return ("the 25.11 DeepSeek-V3 recipes without multi-token prediction: their uneven "
                "pipeline layouts (--pipeline-model-parallel-layout) are not known")
    if model in MTP_MODELS and int(row["pp"]) > 1 and chunk_shape(row) is None:
        return (f"DeepSeek-V3's uneven pipeline layout over pp {row['pp']} x vp "
                f"{virtual(row)} is not known")
    if model.startswith("Nemotron"):
        return "hybrid Mamba layers are not modelled"
    if "tokendrop" in model:
        return "token dropping (an expert capacity factor) is not modelled"
    if row["precision"] not in PRECISIONS:
        return f"precision {row['precision']} (the release's table states none)"
    if model not in MODELS:
        return f"model {model} has no preset"
    if zero_of(row) == 3 and int(row["fsdp"]) != layout_of(row)[1]:
        return "Megatron FSDP over part of the data-parallel ranks (HSDP) is not modelled"
    if row["system"] not in SYSTEMS:
        return f"system {row['system']} is not in SYSTEMS"
    return ""


CPU_OFFLOAD_LAYERS = {("LLAMA3_70B", "DGX-GB200"): 40, ("LLAMA3_70B", "DGX-GB300"): 20}
"""The recipes' activation offloading (training.cpu_offload_layers) where they run
Megatron-FSDP: Megatron-Bridge's scripts/performance/configs/llama/
llama3_workload_base_configs.py sets cpu_offloading_num_layers 40 (GB200) and 20 (GB300) on
its Llama 3 70B FP8 current-scaling FSDP pre-training recipes (20 and 30 on the BF16 ones,
which the open file does not hold), read through the search tool; the MXFP8 and NVFP4
recipes run pipeline parallelism instead, without it."""


RECOMPUTED = {("GPT OSS 120B", "DGX-GB200"): ("layernorm", "moe_act"),
              ("GPT OSS 120B", "DGX-B200"): ("layernorm", "moe_act"),
              ("GPT OSS 120B", "DGX-H100"): ("layernorm", "moe_act")}
"""The recipes' selective recomputation (training.recompute_modules) where they name one:
Megatron-Bridge's scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py sets
recompute_modules ["layernorm", "moe_act"] on its GPT-OSS 120B BF16 recipes for GB200, B200
and H100 (the GB300 and B300 ones capture CUDA graphs instead), read through the search tool;
applied to the BF16 rows (the MXFP8 recipes are later configs of their own)."""


RECOMPUTED_EVERY_PRECISION = {("Kimi_K2", "DGX-GB300"): ("mla_up_proj",)}
"""The same for recipes that name it at every precision: Megatron-Bridge's
scripts/performance/configs/kimi/kimi_workload_base_configs.py sets recompute_modules
["mla_up_proj"] (multi-latent attention's up-projections) on its Kimi-K2 GB300 recipe of
micro-batch 2 (BF16, FP8-CS, NVFP4; the later MXFP8 one of micro-batch 1 recomputes nothing),
read through the search tool; the open file's MXFP8 rows run micro-batch 2."""


def recompute_modules(row: dict) -> tuple[str, ...]:
    """The row's recipe's recomputed modules (RECOMPUTED, RECOMPUTED_EVERY_PRECISION; () for
    none)."""
    if row["model"] in MTP_MODELS:
        return deepseek_recompute(row)
    every = RECOMPUTED_EVERY_PRECISION.get((row["model"], row["system"]))
    if every:
        return every
    if row["precision"] != "BF16":
        return ()
    return RECOMPUTED.get((row["model"], row["system"]), ())


PIPELINE_LAYOUTS = {16: (4, 14, 4, 1)}
"""Model chunks (pp x vp) -> (blocks with the embedding, middle chunks, blocks in each,
blocks in the last chunk, with the multi-token-prediction depth and the loss): the recipes'
--pipeline-model-parallel-layout where Kimi-K2's and DeepSeek-V3's 61 blocks do not split
evenly. Megatron-Bridge's src/megatron/bridge/recipes/kimi/kimi_k2.py and deepseek/
deepseek_v3.py give 16 chunks (pp 4 x vp 4, pp 8 x vp 2, pp 16, and pp 2 x vp 8 as
"Et*4|(t*4|)*14tmL") as [embedding + 4], 14 x [4], [1 (+ mtp) + loss] (read through the
search tool); the other shapes are not known here."""


def chunk_shape(row: dict):
    """PIPELINE_LAYOUTS' shape for the row's chunks (None where none is given, or for a model
    whose blocks split evenly)."""
    if row["model"] not in ("Kimi_K2",) + tuple(MTP_MODELS):
        return None
    pp, _, _, _, _, vp = layout_of(row)
    return PIPELINE_LAYOUTS.get(pp * vp)


def chunk_boundaries(row: dict):
    """The recipe's explicit model-chunk (or stage) boundaries (PIPELINE_LAYOUTS) over the
    chain of embedding, blocks, [MTP block and loss,] head; None where Megatron-LM splits
    evenly."""
    shape = chunk_shape(row)
    if shape is None:
        return None
    first, middle, size, last = shape
    bounds = [0, 1 + first]
    for _ in range(middle):
        bounds.append(bounds[-1] + size)
    tail = 3 if row["model"] in MTP_MODELS else 1      # [MTP block, its loss,] head
    bounds.append(bounds[-1] + last + tail)
    return tuple(bounds)


DEEPSEEK_RECOMPUTED = {"DGX-GB300": {2: ("mla_up_proj",), 1: ()},
                       "DGX-GB200": {1: ("mla_up_proj",)}, "DGX-B300": {1: ("mla_up_proj",),
                                                                      2: ("mla_up_proj",)},
                       "DGX-B200": {1: ("mla_up_proj",)}}
"""DeepSeek-V3's recomputed modules by system and micro-batch, as Megatron-Bridge's
scripts/performance/configs/deepseek/deepseek_workload_base_configs.py sets them (read
through the search tool): ["mla_up_proj"], but for its GB300 MXFP8 recipe of micro-batch 1
(full-iteration CUDA graphs, none); its B200 recipe of pp 8 x vp 2 adds "mlp", the dense
blocks' MLP, which is not modelled (3 of the 61 blocks)."""


def deepseek_recompute(row: dict) -> tuple[str, ...]:
    return DEEPSEEK_RECOMPUTED.get(row["system"], {}).get(int(row["mbs"]), ("mla_up_proj",))


def spec_dict(row: dict) -> dict:
    """The spec a user would write for the row's run."""
    sysm = SYSTEMS[row["system"]]
    gpus = int(row["gpus"])
    per_node = min(sysm.gpus_per_node, gpus)
    if gpus % per_node:
        raise ValueError(f"{gpus} GPUs do not fill nodes of {per_node}")
    return {
        "cluster": {"nodes": [{
            "gpu": sysm.gpu, "count": gpus // per_node, "gpus_per_node": per_node,
            "intra_node_bandwidth": sysm.intra_node_bandwidth,
            "inter_node_bandwidth": f"{sysm.nic_gbps * per_node} Gbps"}]},
        "model": {"preset": MODELS[row["model"]], "seq_length": int(row["seq"]),
                  **({"mtp_num_layers": 1} if row["model"] in MTP_MODELS else {})},
        "training": {"global_batch_size": int(row["gbs"]),
                     "precision": PRECISIONS[row["precision"]], "backend": "megatron",
                     "zero_stage": zero_of(row),
                     "activation_checkpointing": "selective" if recompute_modules(row)
                     else "none",
                     **({"recompute_modules": list(recompute_modules(row))}
                        if recompute_modules(row) else {}),
                     "sequence_parallel": int(row["tp"]) > 1, "framework_overhead": "2 GiB",
                     "finetune": "lora" if row["workload"] == "lora" else "none",
                     # the recipes' DistributedDataParallelConfig: overlap_grad_reduce=True
                     "overlap_grad_reduce": True,
                     # and their CommOverlapConfig(tp_comm_overlap=True): Transformer Engine's
                     # userbuffers (with tp > 1 and sequence parallelism)
                     "tp_comm_overlap": True,
                     # and their grad_reduce_in_fp32 = False (set_llama3_common_configs,
                     # set_gpt_oss_common_configs): bf16 gradient buffers and reductions
                     "grad_reduce_in_fp32": False,
                     "cpu_offload_layers": CPU_OFFLOAD_LAYERS.get(
                         (row["model"], row["system"]), 0) if zero_of(row) == 3 else 0,
                     "moe_sync_free": sync_free(row),
                     "moe_a2a_overlap": a2a_overlap(row),
                     **({"moe_dispatcher": dispatcher(row)}
                        if MODELS[row["model"]] in MOE_PRESETS else {}),
                     "cross_entropy": cross_entropy(row)},
    }


NATIVE_CROSS_ENTROPY = {"GPT OSS 120B"}
"""Models whose Megatron-Bridge recipes keep Megatron-LM's own cross-entropy: the GPT-OSS
pre-training recipes set cross_entropy_fusion_impl "native" ("GPT-OSS uses native",
recipes/gpt_oss/gpt_oss.py); the Llama 3 and 3.1 (recipes/llama/llama3.py) and Qwen3
(recipes/qwen/h100/qwen3_moe.py) ones set cross_entropy_loss_fusion with
cross_entropy_fusion_impl "te", Transformer Engine's fused kernel (training.cross_entropy: te);
read through the search tool."""


def cross_entropy(row: dict) -> str:
    """The recipe's loss kernel (training.cross_entropy)."""
    return "native" if row["model"] in NATIVE_CROSS_ENTROPY else "te"


SYNC_FREE_FROM = (26, 6)
"""The first NeMo release whose MXFP8 mixture-of-experts recipes run sync-free
(training.moe_sync_free): Megatron-Bridge 0.5 (NeMo 26.06) sets moe_expert_rank_capacity_factor
1.5, moe_paged_stash, the CuTeDSL fused grouped MLP and cuda_graph_impl full_iteration on its
Qwen3 MXFP8 recipes for GB200 and GB300 (its PR #4211) and B200 and B300 (PR #4606; the v0.5.1
release notes: "Qwen3 B300/B200 recipe improvement with CuTeDSL fused grouped GEMM, and full
iteration CUDA graphs"), read through the search tool. The same notes name a "GPT-OSS
GB200/GB300 MXFP8 regression due to regressed CuTeDSL fused kernels", so its MXFP8 recipes run
those kernels too; their GB200 and GB300 configs capture the full iteration in a CUDA graph
(scripts/performance/configs/gpt_oss/gpt_oss_workload_base_configs.py), which no host sync
survives, so they are sync-free; the B300 one leaves that graph commented out and sets no expert
capacity (SYNCED_RECIPES). Earlier releases, and the BF16 and Hopper FP8 recipes, run the
dropless dispatchers, which read the token counts back to the host in every MoE layer."""

SYNCED_RECIPES = {("GPT OSS 120B", "DGX-B300")}
"""(model, system) of the MXFP8 recipes from SYNC_FREE_FROM on that still sync the host
(GPT_OSS_120B_PRETRAIN_CONFIG_B300_FP8_MX_V2: "# cuda_graph_impl=\"full_iteration\"",
no moe_expert_rank_capacity_factor)."""


def moe_mxfp8_recipe(row: dict) -> bool:
    """A mixture-of-experts MXFP8 recipe from SYNC_FREE_FROM on (Megatron-Bridge 0.5's), but
    Kimi-K2's: its sync-free MXFP8 config (full-iteration CUDA graphs, paged stash, an expert
    capacity) runs micro-batch 1, and the open file's Kimi-K2 MXFP8 rows, 26.06 included, run
    the micro-batch 2 of its base config, which sets none of that."""
    return (MODELS.get(row["model"]) in MOE_PRESETS and row["model"] != "Kimi_K2"
            and row["precision"] in ("MXFP8", "FP8-MX")
            and release_key(row["release"])[:2] >= SYNC_FREE_FROM)


def sync_free(row: dict) -> bool:
    """Whether the row's recipe runs its MoE layers sync-free (SYNC_FREE_FROM, less
    SYNCED_RECIPES)."""
    return moe_mxfp8_recipe(row) and (row["model"], row["system"]) not in SYNCED_RECIPES


def a2a_overlap(row: dict) -> bool:
    """Whether the row's recipe overlaps its MoE all-to-alls with another micro-batch's
    compute (training.moe_a2a_overlap, --overlap-moe-expert-parallel-comm), as
    Megatron-Bridge's performance configs set it (read through the search tool): the Qwen3
    235B-A22B H100 recipes (tp2 pp8 vp4 ep32) in every release, its Qwen3 30B-A3B H100
    recipes with a pipeline (pp2 with virtual stages, ep8), and the MXFP8 recipes from NeMo
    26.06 (`moe_mxfp8_recipe`: Qwen3's set moe_a2a_overlap, GPT-OSS 120B's moe_a2a_overlap
    too, its B300 one without the full-iteration graph as well), and DeepSeek-V3's B200
    recipe of pp 8 x vp 2 x ep 32 (its V2 MXFP8 config, with DeepEP)."""
    model, h100 = MODELS.get(row["model"]), row["system"] == "DGX-H100"
    return (model == "qwen3-235b-a22b" and h100) \
        or (model == "qwen3-30b-a3b" and h100 and int(row["pp"]) > 1) or moe_mxfp8_recipe(row) \
        or (row["model"] in MTP_MODELS and dispatcher(row) == "deepep")


def dispatcher(row: dict) -> str:
    """The recipe's token dispatcher (training.moe_dispatcher): "hybridep" where its config
    sets moe_flex_dispatcher_backend, as Megatron-Bridge's scripts/performance/configs read
    through the search tool do: qwen/qwen3_workload_base_configs.py on every Qwen3 30B-A3B
    recipe (H100 included: its ep 16 spans two nodes) and on the Qwen3 235B-A22B GB200 and
    GB300 ones (the B200, B300 and H100 ones keep "alltoall"), and
    kimi/kimi_workload_base_configs.py on the Kimi-K2 GB200 and GB300 ones;
    gpt_oss/gpt_oss_workload_base_configs.py on GPT-OSS 120B's GB200 and GB300 MXFP8 recipes
    and its B300 BF16 one together with ep 8 (its earlier ep 64 kept "alltoall"). Inside one
    node (or NVL72 rack) a hierarchical dispatch moves what an all-to-all does, so of the open
    file's rows only the H100 Qwen3 30B-A3B ones at ep 16 cost differently."""
    model, system, nvl72 = row["model"], row["system"], row["system"] in ("DGX-GB200",
                                                                        "DGX-GB300")
    if model in MTP_MODELS:         # DeepSeek-V3: Hybrid-EP, DeepEP on B200 at pp 8 x vp 2
        return "deepep" if system == "DGX-B200" and virtual(row) == 2 else "hybridep"
    flex = (model == "Qwen3_30B_a3B" or (model in ("Qwen3_235B_a22B", "Kimi_K2") and nvl72)
            or (model == "GPT OSS 120B" and (nvl72 if row["precision"] != "BF16"
                                             else system == "DGX-B300" and experts(row) == 8)))
    return "hybridep" if flex else "alltoall"


def zero_of(row: dict) -> int:
    """The recipe's ZeRO stage: 3 (Megatron-FSDP, optim_grads_params) where it names an FSDP
    size, else 1 (the distributed optimizer)."""
    return 3 if row["fsdp"] not in ("", "0") else 1


def measured_s(row: dict) -> float:
    return int(row["gbs"]) * int(row["seq"]) / (float(row["tokens_per_s_per_gpu"])
                                                   * int(row["gpus"]))


def virtual(row: dict) -> int:
    return 1 if row["vp"] in ("", "n/a") else int(row["vp"])


@dataclass
class Result:
    row: dict
    measured_s: float
    predicted_s: float
    fits: bool
    memory_share: float = 0.0
    """The fullest device's predicted peak over its whole memory (the planner's headroom,
    training.memory_headroom, not kept free): a recipe that ran is at most 1."""

    @property
    def error(self) -> float:
        return self.predicted_s / self.measured_s - 1.0

    def label(self) -> str:
        r = self.row
        return (f"{r['model']} {r['system']} {r['precision']} {r['gpus']} GPUs tp{r['tp']} "
                f"pp{r['pp']} cp{r['cp']} vp{virtual(r)} ep{experts(r)} mbs{r['mbs']} "
                f"gbs{r['gbs']}")


@dataclass
class Scored:
    results: list[Result] = field(default_factory=list)
    skipped: Counter = field(default_factory=Counter)


def cost_rows(rows: list[dict], fp8_max: float | None = None,
              nvfp4_max: float | None = None, moe_expert_s: float | None = None,
              a2a_hidden: float | None = None, gpu: str | None = None) -> Scored:
    """Each row costed (`estimate_recipe`), unexpressible ones counted; a coefficient given
    replaces the catalog's for every GPU, or for `gpu` (a catalog name) alone."""
    out = Scored()
    catalog = None
    fitted = {k: v for k, v in (("gemm_fp8_max_efficiency", fp8_max),
                                ("gemm_nvfp4_max_efficiency", nvfp4_max),
                                ("moe_expert_overhead_s", moe_expert_s),
                                ("moe_a2a_overlap_share", a2a_hidden)) if v is not None}
    if fitted:          # a fit: another value of a catalog coefficient
        catalog = {name: replace(entry, **fitted) if gpu in (None, name) else entry
                   for name, entry in load_catalog().items()}
    for row in rows:
        why = unexpressed(row)
        if why:
            out.skipped[why] += 1
            continue
        spec = parse_spec(spec_dict(row), catalog=catalog)
        e = estimate_recipe(spec, row)
        out.results.append(Result(row, measured_s(row), e.iteration_time_s, e.fits,
                                  memory_share(e, spec.training.memory_headroom)))
    return out


def memory_share(e, headroom: float) -> float:
    """The fullest device's predicted peak over its whole memory: each stage's usable
    capacity (StageMemory.capacity_bytes) is the device's memory less the headroom."""
    return max((m.peak_bytes / m.capacity_bytes * (1.0 - headroom) for m in e.memory),
               default=0.0)


def layout_of(row: dict) -> tuple[int, int, int, int, int, int]:
    """(pp, dp, tp, cp, mbs, virtual stages) of a recipe; dp = GPUs / (tp pp cp)."""
    tp, pp, cp = int(row["tp"]), int(row["pp"]), int(row["cp"])
    return pp, int(row["gpus"]) // (tp * pp * cp), tp, cp, int(row["mbs"]), virtual(row)


def experts(row: dict) -> int:
    """The recipe's expert-parallel degree (1 for a dense model)."""
    return 1 if row["ep"] in ("", "n/a") else int(row["ep"])


def estimate_recipe(spec, row: dict):
    """The recipe as published: its layout, the distributed optimizer (Megatron-FSDP where
    it names an FSDP size), sequence parallelism where tp > 1, no recomputation (or the
    selective recomputation of RECOMPUTED), its expert
    parallelism, and Megatron-LM's uniform split of the blocks over the stages (the
    embedding on the first, the head on the last), the split it ran: the planner's own
    split, which evens out the stages within the memory the model predicts, is not the
    recipe's (GPT-OSS's 201k-token head makes Megatron's last stage the slowest)."""
    pp, dp, tp, cp, mbs, vp = layout_of(row)
    return estimate(spec, pp=pp, dp=dp, tmp=tp, mbs=mbs, cp=cp, virtual_stages=vp,
                    zero_stage=zero_of(row),
                    activation_checkpointing="selective" if recompute_modules(row) else "none",
                    sequence_parallel=tp > 1,
                    ep=experts(row) if spec.model.num_experts else 1,
                    partition=chunk_boundaries(row) or "uniform")


def mape(results: list[Result]) -> float:
    return statistics.fmean(abs(r.error) for r in results) if results else float("nan")


def signed(results: list[Result]) -> float:
    return statistics.fmean(r.error for r in results) if results else float("nan")


def groups(results: list[Result], key) -> dict[str, list[Result]]:
    out = defaultdict(list)
    for r in results:
        out[key(r)].append(r)
    return dict(sorted(out.items()))


def family(system: str) -> str:
    return "Hopper" if system == "DGX-H100" else "Blackwell"


def report(scored: Scored, show_rows: bool) -> dict:
    res = scored.results
    print(f"{len(res)} rows costed, {sum(scored.skipped.values())} not (cannot be expressed, "
          f"or a known regression):")
    for why, n in scored.skipped.most_common():
        print(f"  {n:4d}  {why}")
    if show_rows:
        print("\n  measured  predicted   error  fits  mem%  run")
        for r in res:
            print(f"  {r.measured_s:8.2f}  {r.predicted_s:9.2f}  {r.error:+6.1%}  "
                  f"{'yes' if r.fits else 'NO':>4}  {r.memory_share:4.0%}  {r.label()}")
    tight = [r for r in res if not r.fits]
    over = [r for r in tight if r.memory_share > 1.0]
    out = {"rows": len(res), "skipped": dict(scored.skipped), "mape": mape(res),
           "signed": signed(res), "not_fitting": len(tight),
           "over_device_memory": len(over),
           "memory_share_max": max((r.memory_share for r in res), default=0.0), "by": {}}
    print(f"\nMAPE {mape(res):.1%} (mean signed {signed(res):+.1%}) over {len(res)} rows; "
          f"{len(tight)} predicted not to fit in memory with the planner's headroom "
          f"(training.memory_headroom), {len(over)} of them over the device's whole memory; "
          f"the fullest of them at {max((r.memory_share for r in tight), default=0):.1%} "
          f"of it")
    for name, key in (("system", lambda r: r.row["system"]),
                      ("kind", lambda r: kind_of(r.row)),
                      ("workload", lambda r: r.row["workload"]),
                      ("precision", lambda r: r.row["precision"]),
                      ("model", lambda r: r.row["model"]),
                      ("release", lambda r: r.row["release"])):
        print(f"  by {name}:")
        out["by"][name] = report_groups(res, key)
    # what the catalog's prediction_error takes per GPU: the dense rows' MAPE, and `moe:` the
    # mixture-of-experts rows'
    print("  by system and kind (the catalog's prediction_error and its moe: figure):")
    out["by"]["system_kind"] = report_groups(
        res, lambda r: f"{r.row['system']} {kind_of(r.row)}", width=18)
    latest = newest(res)
    print(f"\nEach recipe in the newest release that published it: MAPE {mape(latest):.1%} "
          f"(signed {signed(latest):+.1%}) over {len(latest)} recipes")
    out["newest"] = {"rows": len(latest), "mape": mape(latest), "signed": signed(latest),
                     "by_system": report_groups(latest, lambda r: r.row["system"])}
    return out


def report_groups(results: list[Result], key, width: int = 14) -> dict:
    """Print a line per group of `results` (by `key`): its rows, MAPE and mean signed error;
    return the same by group."""
    out = {}
    for k, rs in groups(results, key).items():
        print(f"    {k:{width}s} {len(rs):3d} rows  MAPE {mape(rs):6.1%}  signed {signed(rs):+6.1%}")
        out[k] = {"rows": len(rs), "mape": mape(rs), "signed": signed(rs)}
    return out


RECIPE_KEYS = ("model", "system", "precision", "gpus", "gbs", "mbs", "seq", "tp", "pp", "cp",
               "vp", "ep")
"""What names one recipe: the same run published by several releases."""


def release_key(release: str) -> tuple[int, ...]:
    """'26.04.01' -> (26, 4, 1): releases in time order."""
    return tuple(int(x) for x in release.split(".") if x.isdigit())


def newest(results: list[Result]) -> list[Result]:
    """Each recipe's measurement in the newest release that published it: what today's
    software does with it (the same MoE recipes ran up to 1.6x faster in 26.06 than in
    26.04.01)."""
    best: dict = {}
    for r in results:
        key = tuple(r.row[k] for k in RECIPE_KEYS)
        if key not in best or release_key(r.row["release"]) > \
                release_key(best[key].row["release"]):
            best[key] = r
    return list(best.values())


def is_dense(r: Result) -> bool:
    return kind_of(r.row) == "dense"


def fit(rows: list[dict]) -> dict:
    """The FP8 GEMM efficiency that minimises MAPE on one GPU family's dense rows, scored on
    every row of the other. The mixture-of-experts rows are left out of the fit: their older
    releases carry a fixed cost per local expert (fit_moe_expert), which a GEMM efficiency
    fitted on them would absorb."""
    grid = [round(0.30 + 0.01 * i, 2) for i in range(61)]
    by_value = {v: cost_rows(rows, v).results for v in grid}
    out = {}
    for train in ("Hopper", "Blackwell"):
        test = "Blackwell" if train == "Hopper" else "Hopper"
        best = min(grid, key=lambda v: mape([r for r in by_value[v] if is_dense(r)
                                             and family(r.row["system"]) == train]))
        fitted = [r for r in by_value[best] if is_dense(r) and family(r.row["system"]) == train]
        held = [r for r in by_value[best] if family(r.row["system"]) == test]
        print(f"fit on {train}'s dense rows ({len(fitted)}): fp8_max {best:.2f}, MAPE "
              f"{mape(fitted):.1%}; "
              f"held-out {test} ({len(held)} rows): MAPE {mape(held):.1%} "
              f"(signed {signed(held):+.1%})")
        out[train] = {"fp8_max": best, "fit_mape": mape(fitted), "held_out": test,
                      "held_out_mape": mape(held), "held_out_signed": signed(held)}
    best_all = min(grid, key=lambda v: mape(by_value[v]))
    print(f"fit on all rows: fp8_max {best_all:.2f}, MAPE {mape(by_value[best_all]):.1%}")
    out["all"] = {"fp8_max": best_all, "mape": mape(by_value[best_all])}
    return out


FP8_FIT_MODEL = "LLAMA3_70B"
"""The model whose dense FP8-family rows (FP8, FP8-CS, MXFP8) fit each NVL72 GPU's FP8 GEMM
efficiency (`fit_fp8_per_gpu`): the most such rows on both racks (13 each)."""


def fit_fp8_per_gpu(rows: list[dict]) -> dict:
    """The FP8 GEMM efficiency of each NVL72 rack's GPU (GB200, GB300) alone: the value that
    minimises MAPE on its FP8_FIT_MODEL dense FP8-family rows, scored on its FP8-family rows
    of every other model (split by model), beside the score at the catalog's value. GB200
    and GB300 have the same data-sheet FP8 peak (5,000 TF dense) but not the same power
    (1,200 and 1,400 W), so their sustained FP8 GEMM rates differ."""
    out = {}
    grid = [round(0.40 + 0.01 * i, 2) for i in range(41)]
    for system in ("DGX-GB200", "DGX-GB300"):
        gpu = SYSTEMS[system].gpu
        mine = [r for r in rows
                if r["system"] == system and PRECISIONS.get(r["precision"]) == "fp8"]
        by_value = {v: cost_rows(mine, fp8_max=v, gpu=gpu).results for v in grid}
        best, fitted, held = fit_on_model(by_value, FP8_FIT_MODEL)     # a dense model
        held_now = [r for r in cost_rows(mine).results if r.row["model"] != FP8_FIT_MODEL]
        print(f"FP8 on {gpu}: fit on {FP8_FIT_MODEL}'s {len(fitted)} dense rows: "
              f"fp8_max {best:.2f}, MAPE {mape(fitted):.1%}; held-out other models "
              f"({len(held)} rows): MAPE {mape(held):.1%} (signed {signed(held):+.1%}; "
              f"{by_model(held)}); the catalog's value: {mape(held_now):.1%}")
        out[gpu] = {"fp8_max": best, "fit_mape": mape(fitted),
                    "held_out_mape": mape(held), "held_out_signed": signed(held),
                    "held_out_mape_catalog": mape(held_now)}
    return out


def fit_on_model(by_value: dict, train: str) -> tuple:
    """Of a grid fit's results per value (`cost_rows(...).results`), the value that
    minimises MAPE on model `train`'s rows, its results on those rows and on the other
    models' rows (held out)."""
    best = min(by_value, key=lambda v: mape([r for r in by_value[v] if r.row["model"] == train]))
    fitted = [r for r in by_value[best] if r.row["model"] == train]
    held = [r for r in by_value[best] if r.row["model"] != train]
    return best, fitted, held


def by_model(results: list[Result]) -> str:
    """Each model's MAPE over `results`, on one line."""
    return "; ".join(f"{m} {mape(rs):.1%}" for m, rs in groups(
        results, lambda r: r.row["model"]).items())


def fit_moe_expert(rows: list[dict]) -> dict:
    """The cost per local expert and micro-batch of a MoE layer whose dispatcher syncs the
    host (moe_expert_overhead; cost_models: CostModel.moe_sync_s) that minimises MAPE on one
    mixture-of-experts model's rows, scored on the other MoE models' rows (split by model)."""
    rows = [r for r in rows if MODELS.get(r["model"]) in MOE_PRESETS]
    grid = [10e-6 * i for i in range(51)]
    by_value = {v: cost_rows(rows, moe_expert_s=v).results for v in grid}
    out = {}
    for train in ("Qwen3_30B_a3B", "Qwen3_235B_a22B"):
        best, fitted, held = fit_on_model(by_value, train)
        print(f"MoE: fit on {train} ({len(fitted)} rows): moe_expert_overhead "
              f"{best * 1e6:.0f} us, MAPE {mape(fitted):.1%}; held-out other MoE models "
              f"({len(held)} rows): MAPE {mape(held):.1%} (signed {signed(held):+.1%}; "
              f"{by_model(held)})")
        out[train] = {"moe_expert_overhead_s": best, "fit_mape": mape(fitted),
                      "held_out_mape": mape(held), "held_out_signed": signed(held)}
    zero = by_value[0.0]
    print(f"MoE: without it (0 us): MAPE {mape(zero):.1%} over the {len(zero)} MoE rows")
    out["none"] = {"mape": mape(zero)}
    return out


def fit_a2a_overlap(rows: list[dict]) -> dict:
    """The share of the MoE all-to-alls that --overlap-moe-expert-parallel-comm hides
    (moe_a2a_overlap) that minimises MAPE on the Qwen3 235B-A22B rows whose recipes set it
    (`a2a_overlap`), scored on the other models' rows that set it (split by model)."""
    rows = [r for r in rows if a2a_overlap(r) and not unexpressed(r)]
    grid = [round(0.05 * i, 2) for i in range(19)]
    by_value = {v: cost_rows(rows, a2a_hidden=v).results for v in grid}
    train = "Qwen3_235B_a22B"
    best, fitted, held = fit_on_model(by_value, train)
    _, fitted_zero, zero = fit_on_model({0.0: by_value[0.0]}, train)
    print(f"A2A overlap: fit on {train} ({len(fitted)} rows): moe_a2a_overlap {best:.0%}, MAPE "
          f"{mape(fitted):.1%} (0%: {mape(fitted_zero):.1%}); held-out other models "
          f"({len(held)} rows): MAPE {mape(held):.1%} (0%: {mape(zero):.1%}; "
          f"{by_model(held)})")
    return {"moe_a2a_overlap": best, "fit_mape": mape(fitted), "held_out_mape": mape(held),
            "held_out_mape_without": mape(zero)}


def fit_nvfp4(rows: list[dict]) -> dict:
    """The NVFP4 GEMM efficiency (gemm_efficiency.nvfp4_max: the fraction of the NVFP4 dense
    peak large NVFP4 GEMMs reach) that minimises MAPE on one model's NVFP4 rows, scored on the
    other model's (split by model: Llama 3 70B and Llama 3.1 405B)."""
    rows = [r for r in rows if r["precision"] == "NVFP4"]
    grid = [round(0.20 + 0.01 * i, 2) for i in range(61)]
    by_value = {v: cost_rows(rows, nvfp4_max=v).results for v in grid}
    models = sorted({r.row["model"] for r in by_value[grid[0]]})
    out = {}
    for train in models:
        best, fitted, held = fit_on_model(by_value, train)
        print(f"NVFP4: fit on {train} ({len(fitted)} rows): nvfp4_max {best:.2f}, MAPE "
              f"{mape(fitted):.1%}; held-out other models ({len(held)} rows): MAPE "
              f"{mape(held):.1%} (signed {signed(held):+.1%})")
        out[train] = {"nvfp4_max": best, "fit_mape": mape(fitted),
                      "held_out_mape": mape(held), "held_out_signed": signed(held)}
    best_all = min(grid, key=lambda v: mape(by_value[v]))
    print(f"NVFP4: fit on all {len(by_value[best_all])} rows: nvfp4_max {best_all:.2f}, MAPE "
          f"{mape(by_value[best_all]):.1%}")
    out["all"] = {"nvfp4_max": best_all, "mape": mape(by_value[best_all])}
    return out


def kind_of(row: dict) -> str:
    """'experts' for a mixture-of-experts model, else 'dense'."""
    return "experts" if MODELS[row["model"]] in MOE_PRESETS else "dense"


def setting_of(row: dict) -> tuple:
    """What a user asking the planner fixes: the model, the system and its GPUs, the global
    batch, the sequence and the precision as the spec names it (FP8, FP8-CS, MXFP8 and
    FP8-MX are all `fp8`); the recipes of one setting differ in the knobs the plan chooses."""
    return (row["model"], row["system"], row["gpus"], row["gbs"], row["seq"],
            PRECISIONS[row["precision"]])


def kind_errors(results: list[Result]) -> dict:
    """The model's own error on each system for each kind of model: the MAPE of the newest
    measurement of each recipe (`newest`), by (system, 'dense' | 'experts')."""
    return {k: mape(rs) for k, rs in groups(
        newest(results), lambda r: (r.row["system"], kind_of(r.row))).items()}


def recipe_ranks(rows: list[dict], results: list[Result] | None = None) -> list[dict]:
    """For each distinct expressible pre-training recipe (model, system, GPUs, batch,
    precision): plan the same cluster and batch with tp, pp, dp, cp, virtual stages, mbs,
    recomputation and sequence parallelism searched (the closed form, no simulation), and
    find the published recipe in the ranking: its rank, or why it is not ranked (pruned as
    out of memory), and the best plan's predicted time against the recipe's. A model with
    experts searches ep too; the ranking keeps the fastest ep of each layout, so the recipe's
    layout is found whatever its ep."""
    from amp_search.planner import NoFeasibleStrategy, plan

    errors = kind_errors(results if results is not None else cost_rows(rows).results)
    seen, out = set(), []
    for row in rows:
        if unexpressed(row) or row["workload"] != "pre-training":
            continue
        key = tuple(row[k] for k in ("model", "system", "gpus", "gbs", "mbs", "seq", "tp", "pp",
                                     "cp", "vp", "ep", "precision"))
        if key in seen:
            continue
        seen.add(key)
        d = spec_dict(row)
        d["training"].update(virtual_pipeline_stages="search", context_parallel="search",
                             activation_checkpointing="search", sequence_parallel="search")
        spec = parse_spec(d)
        recipe = estimate_recipe(spec, row)
        pp, dp, tp, cp, _, _ = layout_of(row)
        try:
            result = plan(spec, simulate_top=0, keep=None)     # every strategy: exact ranks
        except NoFeasibleStrategy:
            result = None
        ranked = result.strategies if result is not None else ()
        layout = layout_of(row)
        ep = experts(row) if spec.model.num_experts else 1
        rank = next((i for i, e in enumerate(ranked, 1)
                     if (e.strategy.pp, e.strategy.dp, e.strategy.tmp, e.strategy.cp,
                         e.strategy.mbs, e.strategy.virtual_stages) == layout
                     and e.strategy.ep == ep), None)
        # the recipe's (pp, dp, tmp, cp, mbs) whatever its virtual stages and recomputation:
        # the ranking keeps each layout once, with its fastest knobs
        layout_rank = next((i for i, e in enumerate(ranked, 1)
                            if (e.strategy.pp, e.strategy.dp, e.strategy.tmp, e.strategy.cp,
                                e.strategy.mbs) == layout[:5]), None)
        best = ranked[0] if ranked else None
        error = spec.model_error().mape     # what `plan` ties within
        layout_s = ranked[layout_rank - 1].iteration_time_s if layout_rank else None
        kind_error = errors[(row["system"], kind_of(row))]

        def best_within(err: float) -> bool:
            """Whether the plan's best is predicted no faster than the recipe by more
            than `err`."""
            return best is not None and best.iteration_time_s >= \
                recipe.iteration_time_s * (1.0 - err)

        # where the recipe's own prediction would sit among the plan's rows (one per layout,
        # each with its fastest knobs): 1 + the rows predicted faster than it
        place = 1 + sum(e.iteration_time_s < recipe.iteration_time_s for e in ranked) \
            if recipe.fits else None
        out.append({"recipe": f"{row['model']} {row['system']} {row['precision']} "
                              f"{row['gpus']} GPUs gbs {row['gbs']}: tp{tp} pp{pp} cp{cp} "
                              f"vp{virtual(row)} ep{experts(row)} mbs{row['mbs']}",
                    "rank": rank, "layout_rank": layout_rank, "place": place,
                    # the time of the knobs the plan keeps for the recipe's layout, and
                    # whether the recipe's own knobs (virtual stages, ep, recomputation) are
                    # predicted within the model's error of them: a tie the plan's one row
                    # per layout does not show
                    "layout_predicted_s": layout_s,
                    "knobs_tied": recipe.fits and layout_s is not None
                    and recipe.iteration_time_s <= layout_s * (1.0 + error),
                    "ranked": len(ranked),
                    "recipe_fits": recipe.fits,
                    "recipe_predicted_s": recipe.iteration_time_s,
                    "measured_s": measured_s(row),
                    "best_predicted_s": best.iteration_time_s if best else None,
                    "best": best.strategy.label() if best else None,
                    # the second test: nothing above the recipe is predicted faster
                    # than it by more than the model's own error on that GPU (the catalog's
                    # prediction_error for that kind of model: what `plan` ties within)
                    "prediction_error": error,
                    "best_within_error": best_within(error),
                    # the same against the model's measured error on this system for this
                    # kind of model (`kind_errors`: dense and mixture-of-experts apart)
                    "kind_error": kind_error,
                    "best_within_kind_error": best_within(kind_error),
                    "setting": list(setting_of(row))})
    # the fastest measured recipe of each setting: what tuning reached; a slower one was
    # superseded (Qwen3 30B-A3B on 8 B200: mbs 1 in 27.0 s, mbs 4 in 9.7 s)
    fastest: dict = {}
    for r in out:
        k = tuple(r["setting"])
        if k not in fastest or r["measured_s"] < fastest[k]["measured_s"]:
            fastest[k] = r
    for r in out:
        r["fastest_of_setting"] = fastest[tuple(r["setting"])] is r
    return out


def report_ranks(ranks: list[dict]) -> dict:
    """Print each recipe's place in its plan and the counts (`rank_summary`) for every recipe
    and for the fastest of each setting; return those counts."""
    print(f"\nThe published recipe in the plan of its cluster and batch "
          f"({len(ranks)} distinct recipes; closed form):")
    for r in ranks:
        where = (f"rank {r['rank']} of {r['ranked']}" if r["rank"] is not None else
                 "not ranked: predicted not to fit" if not r["recipe_fits"] else
                 "not ranked (a faster setting of its knobs is kept"
                 + (f": its layout at rank {r['layout_rank']}, the recipe's knobs "
                    f"{r['recipe_predicted_s'] / r['layout_predicted_s'] - 1:+.1%} against "
                    f"the kept ones)" if r["layout_rank"] else ")"))
        best = (f"best {r['best']} {r['best_predicted_s']:.4g} s, "
                f"{r['best_predicted_s'] / r['recipe_predicted_s'] - 1:+.1%} against the "
                f"recipe's predicted {r['recipe_predicted_s']:.4g} s"
                if r["best"] else "no plan fits")
        place = "" if r["place"] is None or r["place"] == r["rank"] else \
            f" (its predicted time at place {r['place']})"
        print(f"  {r['recipe']}: {where}{place}; {best}; measured {r['measured_s']:.4g} s")
    summaries = {"every_recipe": rank_summary(ranks),
                 "fastest_of_setting": rank_summary([r for r in ranks
                                                     if r["fastest_of_setting"]])}
    for title, summary in (("every recipe", summaries["every_recipe"]),
                           ("the fastest published recipe of each setting (model, system, "
                            "GPUs, batch, sequence, precision)",
                            summaries["fastest_of_setting"])):
        print(f"{title}, {summary['recipes']}:\n"
              f"  in the top 10: {summary['top10']}; its layout (pp, dp, tmp, cp, mbs, with "
              f"whatever virtual stages and recomputation the plan keeps for it): "
              f"{summary['layout10']}, {summary['layout10_tied']} of them with the recipe's "
              f"own knobs predicted within the model's error of the kept ones; "
              f"its predicted time among the plan's rows (1 + the rows "
              f"predicted faster): {summary['place10']}\n"
              f"  the plan's best predicted no faster than the recipe by more than the model's "
              f"error on its GPU: {summary['within_error']} (the catalog's prediction_error "
              f"for that kind of model, dense or MoE), "
              f"{summary['within_kind_error']} (its measured MAPE on that system for that kind "
              f"of model, newest releases); that and in the top 10: {summary['both']}, "
              f"{summary['both_kind']}")
    return summaries


def rank_summary(ranks: list[dict]) -> dict:
    """The counts `report_ranks` prints for some recipes."""
    top = [r["rank"] is not None and r["rank"] <= 10 for r in ranks]
    return {"recipes": len(ranks), "top10": sum(top),
            "layout10": sum(r["layout_rank"] is not None and r["layout_rank"] <= 10
                            for r in ranks),
            "layout10_tied": sum(r["layout_rank"] is not None and r["layout_rank"] <= 10
                                 and r.get("knobs_tied", False) for r in ranks),
            "place10": sum(r["place"] is not None and r["place"] <= 10 for r in ranks),
            "within_error": sum(r["best_within_error"] for r in ranks),
            "within_kind_error": sum(r["best_within_kind_error"] for r in ranks),
            "both": sum(r["best_within_error"] and t for r, t in zip(ranks, top)),
            "both_kind": sum(r["best_within_kind_error"] and t for r, t in zip(ranks, top))}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--csv", type=Path, help="write one line per costed row here")
    ap.add_argument("--rows", action="store_true", help="print every costed row")
    ap.add_argument("--fit", action="store_true",
                    help="fit the FP8 GEMM efficiency, split by GPU family")
    ap.add_argument("--ranks", action="store_true",
                    help="plan each recipe's cluster and batch and find the recipe's rank "
                         "(about an hour on 2 cores)")
    a = ap.parse_args(argv)
    with open(a.data, newline="") as f:
        rows = list(csv.DictReader(f))
    try:
        scored = cost_rows(rows)
    except (AmpSearchError, ValueError) as exc:
        print(f"megatron_bridge: a row cannot be costed: {exc}", file=sys.stderr)
        return 2
    out = report(scored, a.rows)
    if a.fit:
        out["fit"] = fit(rows)
        out["fit_fp8_per_gpu"] = fit_fp8_per_gpu(rows)
        out["fit_nvfp4"] = fit_nvfp4(rows)
        out["fit_moe_expert"] = fit_moe_expert(rows)
        out["fit_a2a_overlap"] = fit_a2a_overlap(rows)
    if a.ranks:
        out["ranks"] = recipe_ranks(rows, scored.results)
        out["ranks_summary"] = report_ranks(out["ranks"])
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["release", "model", "system", "precision", "gpus", "tp", "pp", "cp",
                        "vp", "ep", "mbs", "gbs", "measured_s", "predicted_s", "error", "fits"])
            for r in scored.results:
                x = r.row
                w.writerow([x["release"], x["model"], x["system"], x["precision"], x["gpus"],
                            x["tp"], x["pp"], x["cp"], virtual(x), experts(x), x["mbs"],
                            x["gbs"], f"{r.measured_s:.4f}", f"{r.predicted_s:.4f}",
                            f"{r.error:.4f}", r.fits])
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")
    if out["mape"] > TARGET_MAPE:
        print(f"MISSED: MAPE {out['mape']:.1%} > {TARGET_MAPE:.0%}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
