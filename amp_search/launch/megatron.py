"""The Megatron-LM backend: a `pretrain_gpt.py` command line per strategy.

Megatron-LM (a checkout given by --megatron-path) trains the same GPT as the trials: no
attention dropout, the spec's hidden dropout (--hidden-dropout, model.hidden_dropout, 0 unless
given), mock data of the spec's vocabulary, and the block the spec describes
(`architecture_args`; the default GPT block is learned absolute positions, untied output
layer, GELU MLP, LayerNorm, biases, multi-head attention):

    num_query_groups g < heads    --group-query-attention --num-query-groups g
    head_dim d != h / heads       --kv-channels d
    mlp: swiglu                   --swiglu (--ffn-hidden-size is always given)
    mlp: quick_geglu              --quick-geglu --glu-linear-offset 1 --activation-func-clamp-
                                  value 7 (GPT-OSS's clamped quick-GELU GLU)
    norm: rmsnorm                 --normalization RMSNorm
    bias: false                   --disable-bias-linear
    position_embedding            --position-embedding-type learned_absolute | rope (rotary
                                  base: Megatron's default 10000; the base does not change
                                  the cost, set --rotary-base for real training)
    rope_scaling: yarn            nothing (Megatron-LM's YaRN arguments vary by version): the
                                  run rotates with plain RoPE, which Megatron-LM may fuse, so
                                  it measures a little less than the plan's unfused YaRN
    qk_norm: true                 --qk-layernorm
    kv_lora_rank c (MLA)          --multi-latent-attention --kv-lora-rank c --qk-head-dim d
                                  --qk-pos-emb-head-dim d_r --v-head-dim d_v [--q-lora-rank]
    head cross_entropy: te        --cross-entropy-loss-fusion --cross-entropy-fusion-impl te
                                  (training.cross_entropy; Transformer Engine's kernel: CUDA)
    tie_embeddings: false         --untie-embeddings-and-output-weights (tied: Megatron's
                                  default, no flag)
    num_experts E, topk k, ...    --num-experts E --moe-router-topk k --moe-ffn-hidden-size
                                  --moe-grouped-gemm --moe-token-dispatcher-type alltoall
                                  [--moe-shared-expert-intermediate-size]
    moe_first_dense_layers k      --moe-layer-freq ([0]*k+[1]*(L-k))
    mtp_num_layers N              --mtp-num-layers N (its module on the last stage: m in a
                                  layout)

The strategy maps to its arguments:

    tmp, pp                  --tensor-model-parallel-size, --pipeline-model-parallel-size
    mbs, global batch        --micro-batch-size, --global-batch-size (dp = world / (tmp * pp))
    partition                nothing when every stage holds as many blocks; else
                             --decoder-first/last-pipeline-num-layers when only the first and
                             last stages differ; else --pipeline-model-parallel-layout, one
                             stage per '|' (E embedding, t block, L loss/head), e.g. Et*3|t*2|tL
    activation_checkpointing --recompute-granularity full --recompute-method uniform
                             --recompute-num-layers 1
    selective_recompute      --recompute-granularity selective (the attention core, or
                             training.recompute_modules: --recompute-modules ...)
    sequence_parallel        --sequence-parallel
    cp > 1                   --context-parallel-size (ring attention; Megatron's rank order
                             tp-cp-dp-pp, the placement's replicas d * cp + c)
    ep (experts)             --expert-model-parallel-size ep --expert-tensor-parallel-size 1
    virtual_stages v > 1     --num-layers-per-virtual-pipeline-stage (blocks / (v * pp)): the
                             interleaved 1F1B schedule over Megatron's uniform chunks
                             (megatron/training/arguments.py: needs pp > 1 with P2P overlap,
                             its default in current versions (pp > 2 without it, and in v0.7), and the
                             blocks per stage divisible by it; the schedule needs the
                             micro-batch count a multiple of pp)
    zero_stage 1             --use-distributed-optimizer (ZeRO-1: optimizer state and fp32
                             master weights sharded over dp; gradients reduce-scattered,
                             weights all-gathered)
    zero_stage 3             Megatron-FSDP: --use-megatron-fsdp --data-parallel-sharding-
                             strategy optim_grads_params --use-distributed-optimizer
                             --ckpt-format fsdp_dtensor --overlap-param-gather
                             --overlap-grad-reduce (pp 1); zero_stage 2 does not exist in
                             Megatron-LM (`megatron_unsupported`, which the launcher's
                             preflight asks)
    precision                --bf16 / --fp16 (fp32: neither); fp8: --bf16 --fp8-format hybrid;
                             nvfp4: --bf16 --fp4-format e2m1 --fp4-recipe nvfp4; both with
                             --transformer-impl transformer_engine (Megatron-LM's
                             validate_args: "transformer-engine required for fp8 training")

Megatron numbers ranks as the launcher does (it has no rank map like amp_search.trial.run), in
the same tp-dp-pp order as DeepSpeed. So the placement is honoured by ordering the nodes by
their smallest global rank and, inside a node, CUDA_VISIBLE_DEVICES by global rank; that needs
every node's ranks to be one contiguous block (`megatron_nodes` says when they are not).
"""
from __future__ import annotations

import re
import statistics
from dataclasses import replace
from pathlib import Path

from cost_models.layers import QUICK_GEGLU_CLAMP, QUICK_GEGLU_OFFSET, Layer

from ..errors import UsageError
from ..records import Strategy, pairs_micro_batches
from ..trial.ranks import RankAssignment
from .launchers import NodeLaunch

MEGATRON_SCRIPT = "pretrain_gpt.py"
_LAYOUT_CHAR = {"embedding": "E", "transformer": "t", "head": "L"}


def check_gpt_chain(layers: tuple[Layer, ...]) -> Layer:
    """Megatron's GPT is embedding, equal transformer blocks, [its multi-token-prediction
    module,] head; returns a block."""
    kinds = [x.kind for x in layers]
    blocks = main_blocks(layers)
    mtp = [x for x in layers if x.mtp]
    if (len(layers) < 3 or kinds[0] != "embedding" or kinds[-1] != "head"
            or len(blocks) + len(mtp) != len(layers) - 2
            or [x.kind for x in layers[len(layers) - 1 - len(mtp):-1]]
            != ["transformer", "head"] * (len(mtp) // 2)):
        raise UsageError("the megatron backend runs GPT models (embedding, transformer blocks, "
                         "head); this spec's layers are " + ", ".join(dict.fromkeys(kinds)))
    shapes = {(b.hidden_size, b.num_attention_heads, b.ffn_hidden_size, b.in_hidden)
              for b in blocks}
    if len(shapes) != 1:
        raise UsageError("the megatron backend needs all transformer blocks of one size")
    dense = moe_first_dense_blocks(blocks)
    kinds = {(b.num_query_groups, b.head_dim, b.mlp, b.norm, b.bias, b.position_embedding,
              b.rope_scaling, b.qk_norm, b.kv_lora_rank, b.q_lora_rank, b.qk_rope_head_dim,
              b.v_head_dim, b.num_experts, b.moe_router_topk, b.moe_ffn_hidden_size,
              b.moe_shared_expert_size) for b in blocks[dense:]}
    if len(kinds) != 1 or any(
            replace(b, **{k: getattr(blocks[-1], k) for k in _MOE_FIELDS}) != replace(
                blocks[-1], name=b.name, attention_window=b.attention_window)
            for b in blocks[:dense]):
        raise UsageError("the megatron backend needs all transformer blocks of one kind "
                         "(num_query_groups, head_dim, mlp, norm, bias, position_embedding, "
                         "rope_scaling, qk_norm, latent attention, experts), but for dense "
                         "blocks before the first mixture-of-experts one "
                         "(model.moe_first_dense_layers)")
    if layers[0].position_embedding != blocks[0].position_embedding:
        raise UsageError(f"the megatron backend needs the embedding's position_embedding "
                         f"({layers[0].position_embedding}) to be the blocks' "
                         f"({blocks[0].position_embedding})")
    return blocks[-1]


def main_blocks(layers) -> list[Layer]:
    """The transformer blocks of the decoder (--num-layers), without the multi-token-prediction
    module's (Layer.mtp)."""
    return [x for x in layers if x.kind == "transformer" and not x.mtp]


_MOE_FIELDS = ("num_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_shared_expert_size",
               "fused_experts")
"""The Layer fields a dense block before the mixture-of-experts ones leaves unset."""


def moe_first_dense_blocks(blocks) -> int:
    """How many dense blocks open a mixture-of-experts model's chain (0 for a dense model, or
    one whose first block has experts): Megatron-LM's --moe-layer-freq [0]*k+[1]*(L-k)."""
    if not blocks or not blocks[-1].is_moe:
        return 0
    return next(i for i, b in enumerate(blocks) if b.is_moe)


def window_args(layers: tuple[Layer, ...]) -> list[str]:
    """--window-size w,0 and --window-attn-skip-freq N for sliding-window blocks ([] without
    them): every N-th block full attention, the others windowed (Megatron-LM's pattern)."""
    blocks = [x for x in layers if x.kind == "transformer"]
    windows = {b.attention_window for b in blocks if b.attention_window}
    if not windows:
        return []
    if len(windows) > 1:
        raise UsageError("the megatron backend takes one window size for every windowed block")
    args = ["--window-size", f"{windows.pop()},0"]
    windowed = [bool(b.attention_window) for b in blocks]
    if all(windowed):
        return args
    n = windowed.index(False) + 1
    if windowed != [(i + 1) % n != 0 for i in range(len(blocks))]:
        raise UsageError("the megatron backend's windowed blocks repeat: N - 1 windowed, then "
                         "one full (--window-attn-skip-freq N)")
    return args + ["--window-attn-skip-freq", str(n)]


def architecture_args(layers: tuple[Layer, ...]) -> list[str]:
    """Megatron-LM's arguments for the block's Llama-family options ([] for the GPT block,
    whose position and tying arguments `megatron_args` writes)."""
    block = check_gpt_chain(layers)
    h, a = block.hidden_size, block.num_attention_heads
    args = []
    if block.num_query_groups and block.num_query_groups != a:
        args += ["--group-query-attention", "--num-query-groups", str(block.num_query_groups)]
    if block.head_dim and block.head_dim * a != h:
        args += ["--kv-channels", str(block.head_dim)]
    if block.mlp == "swiglu":
        args += ["--swiglu"]
    if block.mlp == "quick_geglu":      # GPT-OSS's activation (cost_models.layers)
        args += ["--quick-geglu", "--glu-linear-offset", f"{QUICK_GEGLU_OFFSET:g}",
                 "--activation-func-clamp-value", f"{QUICK_GEGLU_CLAMP:g}"]
    if block.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if not block.bias:
        args += ["--disable-bias-linear"]
    if block.qk_norm:
        args += ["--qk-layernorm"]
    if block.is_mla:
        args += ["--multi-latent-attention", "--kv-lora-rank", str(block.kv_lora_rank),
                 "--qk-head-dim", str(block.kv_channels),
                 "--qk-pos-emb-head-dim", str(block.qk_rope_head_dim),
                 "--v-head-dim", str(block.v_head_dim)]
        if block.q_lora_rank:
            args += ["--q-lora-rank", str(block.q_lora_rank)]
    if layers[-1].kind == "head" and layers[-1].cross_entropy == "te":
        args += ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    if block.is_moe:
        args += ["--num-experts", str(block.num_experts),
                 "--moe-router-topk", str(block.moe_router_topk),
                 "--moe-ffn-hidden-size", str(block.expert_ffn),
                 "--moe-grouped-gemm", "--moe-token-dispatcher-type", "alltoall"]
        if block.moe_shared_expert_size:
            args += ["--moe-shared-expert-intermediate-size",
                     str(block.moe_shared_expert_size)]
        blocks = main_blocks(layers)
        dense = moe_first_dense_blocks(blocks)
        if dense:
            args += ["--moe-layer-freq", f"([0]*{dense}+[1]*{len(blocks) - dense})"]
    mtp = sum(x.mtp and x.kind == "transformer" for x in layers)
    if mtp:
        args += ["--mtp-num-layers", str(mtp)]
    return args


def stage_layer_counts(layers: tuple[Layer, ...], partition: tuple[int, ...]) -> list[int]:
    """Transformer blocks of the decoder on each stage (the MTP module's not counted)."""
    return [len(main_blocks(layers[a:b])) for a, b in zip(partition[:-1], partition[1:])]


def pipeline_layout(layers: tuple[Layer, ...], partition: tuple[int, ...]) -> str:
    """Megatron's --pipeline-model-parallel-layout string for an exact split (one '|' per
    stage, or per model chunk): E the embedding, t a block, m a multi-token-prediction
    depth (its block and loss), L the loss (the head)."""
    stages = []
    for a, b in zip(partition[:-1], partition[1:]):
        s = "".join(_layout_char(x) for x in layers[a:b])
        stages.append(re.sub(r"t{2,}", lambda m: f"t*{len(m.group(0))}", s))
    return "|".join(stages)


def _layout_char(layer: Layer) -> str:
    if layer.mtp:
        return "m" if layer.kind == "transformer" else ""
    return _LAYOUT_CHAR[layer.kind]


def split_args(layers: tuple[Layer, ...], partition: tuple[int, ...]) -> list[str]:
    """The arguments that make Megatron split the pipeline as planned."""
    counts = stage_layer_counts(layers, partition)
    p = len(counts)
    if p == 1 or len(set(counts)) == 1:
        return []
    middle = counts[1:-1]
    if min(counts[0], counts[-1]) > 0 and len(set(middle)) <= 1 and (not middle or middle[0] > 0):
        return ["--decoder-first-pipeline-num-layers", str(counts[0]),
                "--decoder-last-pipeline-num-layers", str(counts[-1])]
    return ["--pipeline-model-parallel-layout", pipeline_layout(layers, partition)]


def virtual_stage_args(layers: tuple[Layer, ...], strategy: Strategy) -> list[str]:
    """--num-layers-per-virtual-pipeline-stage for v > 1 model chunks per stage ([] for v = 1),
    or the embedding and the loss counted as layers, or else the layout of v*pp chunks of
    at least one block each (--pipeline-model-parallel-layout, the last chunk may hold the
    loss alone); UsageError for other chunks."""
    s = strategy
    if s.virtual_stages <= 1:
        return []
    counts = stage_layer_counts(layers, s.partition)
    sizes = [b - a for a, b in zip(s.partition[:-1], s.partition[1:])]
    chunks = s.virtual_stages * s.pp
    if len(counts) == chunks and len(set(counts)) == 1 and counts[0] >= 1:
        return ["--num-layers-per-virtual-pipeline-stage", str(counts[0])]
    lead = [x.kind for x in layers[:s.partition[1]]].count("embedding")
    tail = [x.kind for x in layers[s.partition[-2]:]].count("head")
    if len(sizes) == chunks and len(set(sizes)) == 1 and lead <= 1 and tail <= 1 \
            and len(set(counts[1:-1])) <= 1 and min(counts[1:-1] or [1]) >= 1:
        # every layer counted alike: the embedding and the loss take a block's place
        return (["--num-virtual-stages-per-pipeline-rank", str(s.virtual_stages)]
                + (["--account-for-embedding-in-pipeline-split"] if lead else [])
                + (["--account-for-loss-in-pipeline-split"] if tail else []))
    if len(counts) == chunks and min(counts[:-1]) >= 1:
        # chunks as given (estimate's explicit boundaries): one '|' per model chunk, as the
        # DeepSeek-V3 and Kimi-K2 recipes of Megatron-Bridge write them
        return ["--pipeline-model-parallel-layout", pipeline_layout(layers, s.partition)]
    raise UsageError(f"{s.label()}: Megatron-LM's interleaved schedule needs the "
                     f"transformer blocks split evenly over the {chunks} model chunks, with "
                     f"or without the embedding and the head counted as a layer each; "
                     f"blocks per chunk are {counts}")


def overlaps_moe_a2a(s: Strategy, block: Layer) -> bool:
    """Whether megatron-core runs --overlap-moe-expert-parallel-comm for this strategy: a
    MoE block with ep > 1 and micro-batches it can pair (`pairs_micro_batches`)."""
    return block.is_moe and s.ep > 1 and pairs_micro_batches(s.pp, s.virtual_stages,
                                                             s.activation_checkpointing)


def runs_flex_dispatcher(s: Strategy, block: Layer, moe_dispatcher: str) -> bool:
    """Whether megatron-core runs training.moe_dispatcher's flex dispatcher (DeepEP,
    Hybrid-EP) for this strategy: a MoE block with ep > 1 (its MoEFlexTokenDispatcher asserts
    expert parallelism; ep 1 keeps the all-to-all)."""
    return block.is_moe and s.ep > 1 and moe_dispatcher != "alltoall"


def training_kwargs(training, strategy: Strategy) -> dict:
    """`megatron_args`' keywords from the spec's training section (amp_search.spec.
    TrainingSpec) for `strategy`: what the launcher and the export pass alike."""
    return dict(overlap_grad_reduce=training.overlaps_grad_reduce(strategy.zero_stage),
                tp_comm_overlap=training.tp_comm_overlap,
                overlap_p2p_comm=training.overlap_p2p_comm,
                grad_reduce_in_fp32=training.grad_reduce_in_fp32,
                cpu_offload_layers=training.cpu_offload_layers,
                moe_a2a_overlap=training.moe_a2a_overlap,
                moe_dispatcher=training.moe_dispatcher,
                recompute_modules=training.recompute_modules)


def megatron_args(layers: tuple[Layer, ...], strategy: Strategy, *, precision: str,
                  iters: int, seed: int = 1234, lr: float = 1e-4,
                  overlap_grad_reduce: bool = False, tp_comm_overlap: bool = False,
                  overlap_p2p_comm: bool = True, grad_reduce_in_fp32: bool | None = None,
                  cpu_offload_layers: int = 0, moe_a2a_overlap: bool = False,
                  moe_dispatcher: str = "alltoall",
                  recompute_modules: tuple[str, ...] = ("core_attn",)) -> list[str]:
    """The pretrain_gpt.py arguments for one strategy; `overlap_grad_reduce` (the spec's
    training.overlap_grad_reduce): --overlap-grad-reduce, the gradients reduced in buckets
    during the backward; `tp_comm_overlap` (training.tp_comm_overlap, with tmp > 1 and
    sequence parallelism): --tp-comm-overlap on Transformer Engine's layers (its
    userbuffers need them and CUDA); `overlap_p2p_comm` False (training.overlap_p2p_comm,
    with virtual stages): --no-overlap-p2p-communication; `grad_reduce_in_fp32` True:
    --accumulate-allreduce-grads-in-fp32 (pretrain_gpt.py sets it itself for bf16; with bf16
    it cannot be turned off there, `megatron_unsupported_gradients`); `cpu_offload_layers`
    (training.cpu_offload_layers) > 0: --cpu-offloading --cpu-offloading-num-layers N on
    Transformer Engine's layers (its offload handler; CUDA); `moe_a2a_overlap`
    (training.moe_a2a_overlap, where `overlaps_moe_a2a`):
    --overlap-moe-expert-parallel-comm --delay-wgrad-compute on Transformer Engine's layers,
    as Megatron-LM's MoE performance guide runs them; `moe_dispatcher`
    (training.moe_dispatcher) deepep or hybridep: --moe-token-dispatcher-type flex
    --moe-flex-dispatcher-backend X (its library, on CUDA); `recompute_modules`
    (training.recompute_modules) other than the attention core alone: --recompute-modules
    with selective recomputation."""
    block = check_gpt_chain(layers)
    s = strategy
    vocab = layers[0].vocab_size
    seq = block.seq_length
    overlaps_tp = tp_comm_overlap and s.tmp > 1 and s.sequence_parallel
    overlaps_a2a = moe_a2a_overlap and overlaps_moe_a2a(s, block)
    # Transformer Engine where an option needs it: userbuffers, activation offloading, the
    # delayed weight gradients of the all-to-all overlap, and its FP8 and NVFP4 recipes
    # (Megatron-LM asserts "transformer-engine required for fp8 training"); else the local
    # layers the CPU trials run
    engine = overlaps_tp or bool(cpu_offload_layers) or overlaps_a2a \
        or precision in ("fp8", "nvfp4")
    args = [
        "--tensor-model-parallel-size", str(s.tmp),
        "--pipeline-model-parallel-size", str(s.pp),
        "--num-layers", str(len(main_blocks(layers))),
        "--hidden-size", str(block.hidden_size),
        "--num-attention-heads", str(block.num_attention_heads),
        "--ffn-hidden-size", str(block.ffn_hidden_size),
        *architecture_args(layers), *window_args(layers),
        "--seq-length", str(seq), "--max-position-embeddings", str(seq),
        "--micro-batch-size", str(s.mbs), "--global-batch-size", str(s.global_batch_size),
        "--train-iters", str(iters), "--log-interval", "1", "--eval-iters", "0",
        "--lr", str(lr), "--lr-decay-style", "constant", "--seed", str(seed),
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", str(vocab),
        "--position-embedding-type",
        "rope" if layers[0].position_embedding == "rope" else "learned_absolute",
        *([] if layers[0].tie_embeddings else ["--untie-embeddings-and-output-weights"]),
        "--attention-dropout", "0", "--hidden-dropout", f"{block.hidden_dropout:g}",
        "--transformer-impl", "transformer_engine" if engine else "local",
        "--no-gradient-accumulation-fusion",
        *(virtual_stage_args(layers, s) if s.virtual_stages > 1
          else split_args(layers, s.partition)),
    ]
    if s.activation_checkpointing:
        args += ["--recompute-granularity", "full", "--recompute-method", "uniform",
                 "--recompute-num-layers", "1"]
    elif s.selective_recompute:
        args += ["--recompute-granularity", "selective"]
        if tuple(recompute_modules) != ("core_attn",):
            args += ["--recompute-modules", *recompute_modules]
    if s.sequence_parallel:
        args += ["--sequence-parallel"]
    if s.cp > 1:
        args += ["--context-parallel-size", str(s.cp)]
    if block.is_moe:            # the experts whole on each expert-parallel rank
        args += ["--expert-model-parallel-size", str(s.ep),
                 "--expert-tensor-parallel-size", "1"]
    if s.zero_stage == 1:
        args += ["--use-distributed-optimizer"]
    if overlap_grad_reduce and s.zero_stage != 3:
        args += ["--overlap-grad-reduce"]
    if grad_reduce_in_fp32 and precision != "fp32":
        args += ["--accumulate-allreduce-grads-in-fp32"]
    if not overlap_p2p_comm and s.virtual_stages > 1:
        args += ["--no-overlap-p2p-communication"]
    if overlaps_tp:
        args += ["--tp-comm-overlap"]
    if cpu_offload_layers:
        args += ["--cpu-offloading", "--cpu-offloading-num-layers", str(cpu_offload_layers)]
    if runs_flex_dispatcher(s, block, moe_dispatcher):
        args[args.index("--moe-token-dispatcher-type") + 1] = "flex"
        args += ["--moe-flex-dispatcher-backend", moe_dispatcher]
    if overlaps_a2a:
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if s.zero_stage == 3:     # Megatron-FSDP (its README's required flags, and the overlaps
        args += ["--use-megatron-fsdp", "--data-parallel-sharding-strategy",   # the plan
                 "optim_grads_params", "--use-distributed-optimizer",          # costs)
                 "--ckpt-format", "fsdp_dtensor", "--overlap-param-gather",
                 "--overlap-grad-reduce"]
    if precision in ("bf16", "fp16"):
        args += [f"--{precision}"]
    elif precision == "fp8":        # Transformer Engine: FP8 GEMMs (E4M3 forward, E5M2
        args += ["--bf16", "--fp8-format", "hybrid"]   # gradients), BF16 elsewhere
    elif precision == "nvfp4":      # NVFP4 GEMMs (E2M1, an E4M3 scale per 16 values)
        args += ["--bf16", "--fp4-format", "e2m1", "--fp4-recipe", "nvfp4"]
    return args


def megatron_unsupported(strategy: Strategy) -> str:
    """Why Megatron-LM cannot run the strategy as planned ('' if it can): its ZeRO stages are
    1 (the distributed optimizer) and 3 (Megatron-FSDP, with pp 1 as planned here); there is
    no flag for ZeRO 2."""
    if strategy.zero_stage == 2 or (strategy.zero_stage == 3 and strategy.pp > 1):
        return (f"Megatron-LM has no ZeRO stage {strategy.zero_stage}"
                + (" with pp > 1 as planned here" if strategy.zero_stage == 3 else "")
                + " (zero_stage 1 is its --use-distributed-optimizer, 3 Megatron-FSDP with "
                  "pp 1); plan with training.backend: megatron, which prunes it, or use "
                  "zero_stage 0, 1 or 3")
    return ""


def megatron_unsupported_gradients(precision: str, grad_reduce_in_fp32: bool | None) -> str:
    """Why pretrain_gpt.py cannot keep the gradients as planned ('' if it can): with bf16
    (fp8, nvfp4: bf16 elsewhere) it accumulates and reduces them in fp32 whatever it is
    told, so training.grad_reduce_in_fp32 false (megatron-core's grad_reduce_in_fp32=False,
    as Megatron-Bridge runs it) is not what it would measure."""
    if grad_reduce_in_fp32 is False and precision in ("bf16", "fp8", "nvfp4"):
        return ("training.grad_reduce_in_fp32 false: Megatron-LM's pretrain_gpt.py accumulates "
                "and reduces bf16 gradients in fp32 itself, so its trial would not measure the "
                "plan (set it to default to launch with pretrain_gpt.py; Megatron-Bridge runs "
                "it as planned)")
    return ""


def megatron_nodes(ranks: tuple[RankAssignment, ...]) -> tuple[NodeLaunch, ...]:
    """Nodes ordered by their smallest global rank, devices by global rank; raises
    UsageError when a node's ranks are not one contiguous block (Megatron cannot remap)."""
    by_node: dict[int, list[RankAssignment]] = {}
    for a in ranks:
        by_node.setdefault(a.node, []).append(a)
    nodes = sorted(by_node.values(), key=lambda rs: min(a.rank for a in rs))
    expect = 0
    out = []
    for rs in nodes:
        rs = sorted(rs, key=lambda a: a.rank)
        got = [a.rank for a in rs]
        if got != list(range(expect, expect + len(rs))):
            raise UsageError(f"node {rs[0].host} holds global ranks {got}, not one contiguous "
                             f"block; Megatron-LM numbers ranks node by node, so this "
                             f"placement cannot be launched exactly (use --backend deepspeed)")
        expect += len(rs)
        out.append(NodeLaunch(node=rs[0].node, host=rs[0].host,
                              devices=tuple(a.local_device for a in rs)))
    return tuple(out)


def megatron_program(megatron_path: Path, args: list[str]) -> tuple[str, ...]:
    """pretrain_gpt.py and its arguments, as torchrun takes a script."""
    return (str(Path(megatron_path) / MEGATRON_SCRIPT), *args)


_ITER = re.compile(r"elapsed time per iteration \(ms\):\s*([0-9.eE+-]+)")
_LOSS = re.compile(r"lm loss:\s*([0-9.eE+-]+)")
_MEM = re.compile(r"max allocated:\s*([0-9.eE+-]+)")


def parse_megatron_log(text: str, *, warmup: int) -> dict:
    """Iteration times, losses and peak memory from a Megatron-LM log (--log-interval 1)."""
    times = [float(x) / 1e3 for x in _ITER.findall(text)]
    losses = [float(x) for x in _LOSS.findall(text)]
    mem = [float(x) for x in _MEM.findall(text)]
    timed = times[warmup:]
    return {
        "iteration_times_s": times,
        "timed_iterations": len(timed),
        "mean_s": statistics.fmean(timed) if timed else None,
        "std_s": statistics.pstdev(timed) if len(timed) > 1 else (0.0 if timed else None),
        "losses": losses,
        "peak_memory_bytes": [int(m * 2**20) for m in mem],  # Megatron reports MB (MiB)
        "peak_memory_kind": "cuda_max_memory_allocated" if mem else "",
    }
