"""The search space, as named rules: what a strategy must satisfy to run, and which points are
the same plan.

Every rule is a function `(space, candidate) -> Violation | None`. The enumeration, the
Megatron baseline, `estimate`'s errors and the prune counts of `plan` all use these, so the
rules are written once:

    rule                        reason (prune count key)      why
    pp_within_layers            pp_exceeds_layers             a stage needs at least one layer
    tmp_divides_model           tmp_does_not_divide_model     heads and widths split evenly
                                                              (the vocabulary is padded)
    dp_divides_batch            dp_does_not_divide_batch      every replica gets whole samples
    mbs_divides_replica_batch   mbs_does_not_divide_batch     whole micro-batches per replica
    zero_in_megatron            zero_2_3_under_megatron       backend megatron: Megatron-LM
                                                              has ZeRO 1 only (its
                                                              distributed optimizer)
    zero_with_pipeline          zero_2_3_with_pipeline        DeepSpeed's pipeline engine
                                                              rejects ZeRO 2/3
    sequence_parallel_needs_tp  sequence_parallel_without_tp  sequence parallelism splits
                                                              the tensor group's replicated
                                                              regions: tmp > 1 only
    sequence_divides_tmp        sequence_not_divisible_by_tmp each tensor rank holds s/t
                                                              tokens
    virtual_stages_need_pipeline  virtual_stages_without_pipeline  v > 1 model chunks per
                                                              stage interleave a pipeline:
                                                              pp > 1 (Megatron-Core's
                                                              parallel_state asserts it; with
                                                              P2P overlap, its default, pp 2
                                                              runs)
    interleaved_microbatches    microbatches_not_multiple_of_pp  Megatron-LM's interleaved
                                                              schedule raises unless the
                                                              micro-batch count is a multiple
                                                              of pp
    chunks_split_blocks         blocks_not_divisible_by_chunks  the v*pp chunks hold equal
                                                              numbers of transformer blocks
                                                              (--num-layers-per-virtual-
                                                              pipeline-stage), at least one
    interleaved_backend         interleaved_under_deepspeed   DeepSpeed's PipelineEngine has no
                                                              interleaved schedule (search
                                                              for the deepspeed backend only)
    context_parallel_backend    context_parallel_under_deepspeed  cp > 1: Megatron-LM's ring
                                                              attention; the deepspeed
                                                              backend has none
    sequence_divides_cp         sequence_not_divisible_by_cp  cp > 1 splits each sequence into
                                                              2 cp chunks (causal load
                                                              balance), and each cp rank's
                                                              s/cp tokens over tmp under
                                                              sequence parallelism
    context_parallel_needs_flash  context_parallel_with_standard_attention  cp > 1 runs the
                                                              fused attention kernels of
                                                              Transformer Engine
    ep_divides_experts          ep_does_not_divide_experts    each expert-parallel rank holds
                                                              E/ep whole experts
    ep_within_stage_ranks       ep_exceeds_stage_ranks        expert tensor parallelism 1: the
                                                              ep ranks are a stage's dp x cp x
                                                              tmp ranks, so ep divides them
    moe_tensor_parallel_needs_sp  moe_tensor_parallel_without_sp  Megatron-LM requires
                                                              sequence parallelism for MoE
                                                              with tmp > 1
    experts_zero_under_deepspeed  experts_with_zero_under_deepspeed  backend deepspeed: the
                                                              trials' experts need ZeRO 0
                                                              (its ZeRO optimizers would
                                                              shard and reduce them over the
                                                              whole data-parallel group)
    cpu_offload_rules           cpu_offload_under_deepspeed   training.cpu_offload_layers is
                                cpu_offload_with_pipeline     megatron-core's activation
                                cpu_offload_with_recomputation  offloading: the megatron
                                                              backend, pp 1, no recomputation
                                                              (its TransformerConfig refuses
                                                              the rest)

and one equivalence, applied by the search only (an equivalent point is a valid strategy, so
`estimate` accepts it):

    zero_without_data_parallel  zero_without_data_parallel    ZeRO shards over dp; at dp = 1
                                                              every stage is the same plan, so
                                                              only the lowest searched stage
                                                              is kept

and the spec's limits, applied by the search only (`estimate` costs any strategy):

    degrees_within_search_limits  outside_search_limits       the `search:` section allows
    mbs_within_search_limits                                  other tp, pp, dp or mbs values

and one dominance, applied by the search only:

    selective_needs_scores      selective_with_flash_attention  selective recomputation
                                                              drops the attention scores;
                                                              flash attention stores none, so
                                                              it saves (next to) nothing and
                                                              re-runs the core: kept only if
                                                              some device runs standard
                                                              attention
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from enum import Enum
from typing import Callable

from cost_models.memory import zero_allowed

from .errors import Infeasible, SpecError
from .records import micro_batches
from .spec import SearchLimits, Spec


class Reason(str, Enum):
    """Why a point of the search space is not ranked (the keys of `Plan.pruned`)."""

    PP_EXCEEDS_LAYERS = "pp_exceeds_layers"
    TMP_DOES_NOT_DIVIDE_MODEL = "tmp_does_not_divide_model"
    DP_DOES_NOT_DIVIDE_BATCH = "dp_does_not_divide_batch"
    MBS_DOES_NOT_DIVIDE_BATCH = "mbs_does_not_divide_batch"
    ZERO_WITH_PIPELINE = "zero_2_3_with_pipeline"
    ZERO_UNDER_MEGATRON = "zero_2_3_under_megatron"
    ZERO_WITHOUT_DATA_PARALLEL = "zero_without_data_parallel"
    SEQUENCE_PARALLEL_WITHOUT_TP = "sequence_parallel_without_tp"
    SEQUENCE_NOT_DIVISIBLE = "sequence_not_divisible_by_tmp"
    SELECTIVE_WITH_FLASH = "selective_with_flash_attention"
    VIRTUAL_STAGES_WITHOUT_PIPELINE = "virtual_stages_without_pipeline"
    MICROBATCHES_NOT_MULTIPLE_OF_PP = "microbatches_not_multiple_of_pp"
    BLOCKS_NOT_DIVISIBLE_BY_CHUNKS = "blocks_not_divisible_by_chunks"
    INTERLEAVED_UNDER_DEEPSPEED = "interleaved_under_deepspeed"
    CONTEXT_PARALLEL_UNDER_DEEPSPEED = "context_parallel_under_deepspeed"
    SEQUENCE_NOT_DIVISIBLE_BY_CP = "sequence_not_divisible_by_cp"
    EP_DOES_NOT_DIVIDE_EXPERTS = "ep_does_not_divide_experts"
    EP_EXCEEDS_STAGE_RANKS = "ep_exceeds_stage_ranks"
    MOE_TENSOR_PARALLEL_WITHOUT_SP = "moe_tensor_parallel_without_sp"
    EXPERTS_WITH_ZERO_UNDER_DEEPSPEED = "experts_with_zero_under_deepspeed"
    CONTEXT_PARALLEL_WITH_STANDARD_ATTENTION = "context_parallel_with_standard_attention"
    CPU_OFFLOAD_UNDER_DEEPSPEED = "cpu_offload_under_deepspeed"
    CPU_OFFLOAD_WITH_PIPELINE = "cpu_offload_with_pipeline"
    CPU_OFFLOAD_WITH_RECOMPUTATION = "cpu_offload_with_recomputation"
    OUTSIDE_SEARCH_LIMITS = "outside_search_limits"
    """A degree the spec's `search:` section does not allow (the search only; `estimate`
    costs any strategy)."""
    OUT_OF_MEMORY = "out_of_memory"
    SLOWER_KNOBS_SAME_LAYOUT = "slower_knobs_same_layout"
    """Same (pp, dp, tmp, cp, mbs) as a faster ranked strategy that fits: only its ZeRO stage,
    recomputation, sequence parallelism, virtual stages or expert parallelism differ, which
    trade memory for time; the faster one is kept."""
    SLOWER_THAN_KEPT = "slower_than_the_kept_plans"
    """Not among the plans `plan` keeps (its best `keep` layouts and those within
    `keep_within` of the best): costed and slower, or never costed because a lower bound on
    its time (CostModel.lower_bound_s) already was."""
    DOMINATED = "dominated"
    """No faster than the caller's cutoff (`plan`'s cutoff_s; `plan_subsets`: a plan on
    another part of the cluster beats it in time, GPU-seconds and cost alike)."""

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A point of the search space before placement and partition."""

    pp: int
    dp: int
    tmp: int
    mbs: int
    zero_stage: int
    activation_checkpointing: bool
    """Full recomputation."""
    selective_recompute: bool = False
    """Selective recomputation (the attention core only); False when activation_checkpointing."""
    sequence_parallel: bool = False
    virtual_stages: int = 1
    """Model chunks per pipeline stage (> 1: the interleaved 1F1B schedule)."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks (Megatron-LM's ring
    attention); the devices are pp x dp x cp x tmp."""
    ep: int = 1
    """Expert-parallel degree (a model with experts): each of a stage's groups of ep
    consecutive ranks splits the experts (Megatron-LM's --expert-model-parallel-size with
    expert tensor parallelism 1); it places no device of its own."""

    @property
    def layer_collectives(self) -> bool:
        """Whether its layers communicate inside each micro-batch: tensor-parallel
        collectives, the context-parallel ring, expert-parallel all-to-alls."""
        return self.tmp > 1 or self.cp > 1 or self.ep > 1

    @property
    def replicas(self) -> int:
        """Model replicas of the placement, dp x cp: the context-parallel ranks of a data
        replica sit beside each other (Megatron-LM's order tp, cp, dp, pp) and reduce their
        gradients together."""
        return self.dp * self.cp

    @classmethod
    def of(cls, strategy) -> "Candidate":
        """The candidate a placed and partitioned strategy (records.Strategy) was made of."""
        return cls(pp=strategy.pp, dp=strategy.dp, tmp=strategy.tmp, mbs=strategy.mbs,
                   zero_stage=strategy.zero_stage,
                   activation_checkpointing=strategy.activation_checkpointing,
                   selective_recompute=strategy.selective_recompute,
                   sequence_parallel=strategy.sequence_parallel,
                   virtual_stages=strategy.virtual_stages, cp=strategy.cp, ep=strategy.ep)

    @classmethod
    def make(cls, *, pp: int, dp: int, tmp: int, mbs: int, zero_stage: int, recompute: str,
             sequence_parallel: bool = False, virtual_stages: int = 1,
             cp: int = 1, ep: int = 1) -> "Candidate":
        """A candidate from a recomputation mode: none | selective | full."""
        return cls(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero_stage,
                   activation_checkpointing=recompute == "full",
                   selective_recompute=recompute == "selective",
                   sequence_parallel=sequence_parallel, virtual_stages=virtual_stages, cp=cp,
                   ep=ep)

    @property
    def recompute(self) -> str:
        if self.activation_checkpointing:
            return "full"
        return "selective" if self.selective_recompute else "none"

    @property
    def layout(self) -> tuple[int, int, int, int]:
        return self.pp, self.dp, self.tmp, self.mbs


@dataclass(frozen=True)
class Violation:
    """A rule a candidate breaks: the prune key and a sentence for the user."""

    reason: Reason
    message: str

    def error(self) -> Infeasible:
        return Infeasible(self.reason.value, self.message)


@dataclass(frozen=True)
class SearchSpace:
    """The sizes the rules look at, taken from a spec once."""

    num_devices: int
    num_layers: int
    global_batch_size: int
    tp_divisors: tuple[int, ...]
    zero_stages: tuple[int, ...]
    recompute: tuple[str, ...]
    """Recomputation modes searched: none | selective | full."""
    sequence_parallel: tuple[bool, ...] = (False,)
    seq_lengths: tuple[int, ...] = ()
    """The sequence lengths of the model's layers (sequence parallelism splits them)."""
    attention_scores: bool = True
    """Whether some device type runs standard attention (stores the scores)."""
    virtual_stages: tuple[int, ...] = (1,)
    """Model chunks per pipeline stage searched (training.virtual_pipeline_stages)."""
    num_blocks: int = 0
    """The layers between the leading embedding(s) and the trailing head(s): what the
    interleaved schedule's chunks split evenly."""
    num_leading: int = 0
    """The leading embedding layers."""
    context_parallel: tuple[int, ...] = (1,)
    """Context-parallel degrees searched (training.context_parallel)."""
    expert_parallel: tuple[int, ...] = (1,)
    """Expert-parallel degrees searched (training.expert_parallel)."""
    num_experts: int = 0
    """The model's routed experts (0: dense)."""
    limits: SearchLimits = SearchLimits()
    """The spec's `search:` section: the tp, pp, dp and mbs the search may try."""
    backend: str = "deepspeed"
    """The framework the plan is for (deepspeed | megatron): training.backend, unless the
    caller names another (`launch --backend`)."""
    cpu_offload_layers: int = 0
    """training.cpu_offload_layers (0: no activation offloading)."""
    recompute_modules: tuple[str, ...] = ("core_attn",)
    """What selective recomputation recomputes (training.recompute_modules)."""

    @classmethod
    def of(cls, spec: Spec, backend: str | None = None) -> "SearchSpace":
        """`backend`: the framework the plan is for; None: the spec's training.backend."""
        t = spec.training
        gpus = {d.gpu.name: d.gpu for d in spec.cluster.devices}.values()
        lead, tail = spec.model.ends
        return cls(virtual_stages=t.virtual_pipeline_stages,
                   context_parallel=t.context_parallel, limits=spec.search,
                   expert_parallel=t.expert_parallel, num_experts=spec.model.num_experts,
                   num_blocks=spec.model.num_layers - lead - tail, num_leading=lead,
                   num_devices=spec.cluster.num_devices, num_layers=spec.model.num_layers,
                   global_batch_size=t.global_batch_size, tp_divisors=spec.model.tp_divisors,
                   zero_stages=t.zero_stage, recompute=t.activation_checkpointing,
                   sequence_parallel=t.sequence_parallel,
                   seq_lengths=tuple(sorted({x.seq_length for x in spec.model.layers})),
                   attention_scores=any(spec.attention_for(g) == "standard" for g in gpus),
                   backend=backend or t.backend, cpu_offload_layers=t.cpu_offload_layers,
                   recompute_modules=t.recompute_modules)


Rule = Callable[[SearchSpace, Candidate], "Violation | None"]


def pp_within_layers(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.pp > s.num_layers:
        return Violation(Reason.PP_EXCEEDS_LAYERS,
                         f"pp = {c.pp} exceeds the model's {s.num_layers} layers "
                         f"(embedding and head included)")
    return None


def tmp_divides_model(s: SearchSpace, c: Candidate) -> Violation | None:
    bad = [size for size in s.tp_divisors if size % c.tmp]
    if bad:
        return Violation(Reason.TMP_DOES_NOT_DIVIDE_MODEL,
                         f"tmp = {c.tmp} does not divide the model size {bad[0]} (heads, hidden "
                         f"and ffn must be divisible by tmp; the vocabulary is padded)")
    return None


def dp_divides_batch(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.global_batch_size % c.dp:
        return Violation(Reason.DP_DOES_NOT_DIVIDE_BATCH,
                         f"dp = {c.dp} does not divide global_batch_size "
                         f"{s.global_batch_size}")
    return None


def mbs_divides_replica_batch(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.global_batch_size % (c.dp * c.mbs):
        return Violation(Reason.MBS_DOES_NOT_DIVIDE_BATCH,
                         f"dp*mbs = {c.dp * c.mbs} does not divide global_batch_size "
                         f"{s.global_batch_size}")
    return None


def zero_in_megatron(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.backend == "megatron" and c.zero_stage == 2:
        return Violation(Reason.ZERO_UNDER_MEGATRON,
                         "ZeRO stage 2 under the megatron backend: Megatron-LM's stages are 1 "
                         "(its distributed optimizer, --use-distributed-optimizer) and 3 "
                         "(Megatron-FSDP); use zero_stage 0, 1 or 3")
    if s.backend == "megatron" and c.zero_stage == 3 and c.pp > 1:
        return Violation(Reason.ZERO_UNDER_MEGATRON,
                         f"ZeRO stage 3 (Megatron-FSDP) with pp = {c.pp}: planned with pp = 1 "
                         f"only here; use pp = 1 or zero_stage 0/1")
    return None


def zero_with_pipeline(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.backend == "deepspeed" and not zero_allowed(c.pp, c.zero_stage):
        return Violation(Reason.ZERO_WITH_PIPELINE,
                         f"ZeRO stage {c.zero_stage} with pp = {c.pp}: DeepSpeed's pipeline "
                         f"engine accepts ZeRO 0 and 1 only; use pp = 1 or zero_stage 0/1")
    return None


def sequence_parallel_needs_tp(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.sequence_parallel and c.tmp == 1:
        return Violation(Reason.SEQUENCE_PARALLEL_WITHOUT_TP,
                         "sequence parallelism with tmp = 1: it splits the regions tensor "
                         "parallelism replicates, so it needs tmp > 1 (Megatron-LM switches "
                         "it off at tmp = 1); use tmp > 1 or sequence_parallel false")
    return None


def sequence_divides_tmp(s: SearchSpace, c: Candidate) -> Violation | None:
    bad = [n for n in s.seq_lengths if n % c.tmp] if c.sequence_parallel else []
    if bad:
        return Violation(Reason.SEQUENCE_NOT_DIVISIBLE,
                         f"sequence parallelism with tmp = {c.tmp}: the sequence length "
                         f"{bad[0]} is not divisible by tmp (each tensor rank holds s/tmp "
                         f"tokens)")
    return None


def selective_needs_scores(s: SearchSpace, c: Candidate) -> Violation | None:
    """Selective recomputation of the attention core alone under flash attention drops
    nothing but the log-sum-exp; other modules (training.recompute_modules) free more."""
    if c.selective_recompute and not c.activation_checkpointing and not s.attention_scores \
            and s.recompute_modules == ("core_attn",):
        return Violation(Reason.SELECTIVE_WITH_FLASH,
                         "selective recomputation under flash attention: there are no stored "
                         "attention scores to drop, so it saves next to no memory and re-runs "
                         "the attention core (no recomputation is faster)")
    return None


def virtual_stages_need_pipeline(s: SearchSpace, c: Candidate) -> Violation | None:
    """Megatron-Core (0.16's parallel_state: pipeline-model-parallel size > 1 with the
    interleaved schedule; Megatron-LM's arguments.py asks for pp > 2 only where P2P overlap
    is turned off, --no-overlap-p2p-communication; v0.7 asked for pp > 2 always)."""
    if c.virtual_stages > 1 and c.pp < 2:
        return Violation(Reason.VIRTUAL_STAGES_WITHOUT_PIPELINE,
                         f"virtual_pipeline_stages = {c.virtual_stages} with pp = {c.pp}: the "
                         f"interleaved schedule interleaves the model chunks of a pipeline: "
                         f"pp > 1; use virtual_pipeline_stages 1")
    return None


def interleaved_microbatches(s: SearchSpace, c: Candidate) -> Violation | None:
    gas = micro_batches(s.global_batch_size, c.dp, c.mbs)
    if c.virtual_stages > 1 and gas % c.pp:
        return Violation(Reason.MICROBATCHES_NOT_MULTIPLE_OF_PP,
                         f"virtual_pipeline_stages = {c.virtual_stages}: {gas} micro-batches "
                         f"per iteration is not a multiple of pp = {c.pp} (Megatron-LM's "
                         f"forward_backward_pipelining_with_interleaving raises unless "
                         f"num_microbatches % pipeline-model-parallel-size == 0, at its default "
                         f"microbatch_group_size_per_vp_stage = pp)")
    return None


def chunks_split_blocks(s: SearchSpace, c: Candidate) -> Violation | None:
    chunks = c.virtual_stages * c.pp
    if c.virtual_stages <= 1:
        return None
    from cost_models.pipeline import interleaved_split

    ends = dict(first=s.num_leading, last=s.num_layers - s.num_leading - s.num_blocks)
    # whether partition.interleaved_partition splits it (the chunks themselves are not
    # needed here: for DeepSeek-V3's uneven ones, 45,040 balanced_chunks calls were a third
    # of its plan, 2026-11-30)
    if interleaved_split(s.num_layers, chunks, **ends) is None:
        from cost_models.pipeline import needs_uneven_chunks

        if needs_uneven_chunks(s.num_layers, **ends):
            return Violation(Reason.BLOCKS_NOT_DIVISIBLE_BY_CHUNKS,
                             f"virtual_pipeline_stages = {c.virtual_stages} with pp = {c.pp}: "
                             f"{chunks} model chunks, more than the {s.num_blocks} transformer "
                             f"blocks (each chunk holds one at least)")
        return Violation(Reason.BLOCKS_NOT_DIVISIBLE_BY_CHUNKS,
                         f"virtual_pipeline_stages = {c.virtual_stages} with pp = {c.pp}: the "
                         f"{s.num_blocks} transformer blocks do not split into {chunks} equal "
                         f"chunks of at least one block, nor do they with the embedding and "
                         f"the head counted as a layer each (Megatron-LM's "
                         f"--num-layers-per-virtual-pipeline-stage, or "
                         f"--account-for-embedding-in-pipeline-split and "
                         f"--account-for-loss-in-pipeline-split)")
    return None


def interleaved_backend(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.virtual_stages > 1 and s.backend == "deepspeed":
        return Violation(Reason.INTERLEAVED_UNDER_DEEPSPEED,
                         f"virtual_pipeline_stages = {c.virtual_stages}: DeepSpeed's "
                         f"PipelineEngine has no interleaved schedule; use the megatron "
                         f"backend or virtual_pipeline_stages 1")
    return None


def context_parallel_backend(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.cp > 1 and s.backend != "megatron":
        return Violation(Reason.CONTEXT_PARALLEL_UNDER_DEEPSPEED,
                         f"cp = {c.cp}: context parallelism is Megatron-LM's ring attention; "
                         f"the {s.backend} backend has none (use backend megatron, or cp 1)")
    return None


def sequence_divides_cp(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.cp == 1:
        return None
    bad = [n for n in s.seq_lengths if n % (2 * c.cp)]
    if bad:
        return Violation(Reason.SEQUENCE_NOT_DIVISIBLE_BY_CP,
                         f"cp = {c.cp}: the sequence length {bad[0]} is not divisible by "
                         f"2 x cp = {2 * c.cp} (Megatron-LM splits each sequence into 2 cp "
                         f"chunks to balance the causal mask)")
    bad = [n for n in s.seq_lengths if (n // c.cp) % c.tmp] if c.sequence_parallel else []
    if bad:
        return Violation(Reason.SEQUENCE_NOT_DIVISIBLE_BY_CP,
                         f"cp = {c.cp} with sequence parallelism at tmp = {c.tmp}: a cp "
                         f"rank's {bad[0] // c.cp} tokens do not split over tmp")
    return None


def ep_divides_experts(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.ep > 1 and s.num_experts % c.ep:
        return Violation(Reason.EP_DOES_NOT_DIVIDE_EXPERTS,
                         f"ep = {c.ep} does not divide the model's {s.num_experts} experts"
                         if s.num_experts else
                         f"ep = {c.ep}: the model has no experts (model.num_experts)")
    return None


def ep_within_stage_ranks(s: SearchSpace, c: Candidate) -> Violation | None:
    ranks = c.dp * c.cp * c.tmp
    if c.ep > 1 and ranks % c.ep:
        return Violation(Reason.EP_EXCEEDS_STAGE_RANKS,
                         f"ep = {c.ep} does not divide a stage's dp x cp x tmp = {ranks} ranks "
                         f"(expert tensor parallelism 1: the experts are split over them)")
    return None


def moe_tensor_parallel_needs_sp(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.num_experts and c.tmp > 1 and not c.sequence_parallel:
        return Violation(Reason.MOE_TENSOR_PARALLEL_WITHOUT_SP,
                         f"tmp = {c.tmp} with experts needs sequence parallelism (Megatron-LM "
                         f"requires it for MoE with tensor parallelism; "
                         f"training.sequence_parallel: true or search)")
    return None


def experts_zero_under_deepspeed(s: SearchSpace, c: Candidate) -> Violation | None:
    if s.num_experts and s.backend == "deepspeed" and c.zero_stage:
        return Violation(Reason.EXPERTS_WITH_ZERO_UNDER_DEEPSPEED,
                         f"ZeRO stage {c.zero_stage} with experts under the deepspeed backend: "
                         f"the trials' expert layer is not DeepSpeed's own, so its ZeRO "
                         f"optimizer would shard and reduce the experts' gradients over the "
                         f"whole data-parallel group; ZeRO 0 (training.zero_stage: 0), or "
                         f"backend megatron")
    return None


def cpu_offload_rules(s: SearchSpace, c: Candidate) -> Violation | None:
    """megatron-core's TransformerConfig: CPU offloading without pipeline parallelism and
    without activation recomputation; DeepSpeed's pipeline engine has no such offloading."""
    n = s.cpu_offload_layers
    if not n:
        return None
    if s.backend != "megatron":
        return Violation(Reason.CPU_OFFLOAD_UNDER_DEEPSPEED,
                         f"training.cpu_offload_layers {n} under the {s.backend} backend: "
                         f"activation offloading is megatron-core's (--cpu-offloading); "
                         f"backend megatron, or cpu_offload_layers 0")
    if c.pp > 1:
        return Violation(Reason.CPU_OFFLOAD_WITH_PIPELINE,
                         f"pp = {c.pp} with training.cpu_offload_layers {n}: megatron-core has "
                         f"no pipeline parallelism with CPU offloading")
    if c.activation_checkpointing or c.selective_recompute:
        return Violation(Reason.CPU_OFFLOAD_WITH_RECOMPUTATION,
                         f"recomputation with training.cpu_offload_layers {n}: megatron-core's "
                         f"CPU offloading does not work with activation recomputation "
                         f"(training.activation_checkpointing: none)")
    return None


def context_parallel_needs_flash(s: SearchSpace, c: Candidate) -> Violation | None:
    if c.cp > 1 and s.attention_scores:
        return Violation(Reason.CONTEXT_PARALLEL_WITH_STANDARD_ATTENTION,
                         f"cp = {c.cp} with standard (unfused) attention: Megatron-LM's "
                         f"context parallelism runs Transformer Engine's fused attention "
                         f"(training.attention flash, on GPUs that have it)")
    return None


def _outside_limits(s: SearchSpace, degrees) -> Violation | None:
    for name, value in degrees:
        if not s.limits.admits(name, value):
            return Violation(Reason.OUTSIDE_SEARCH_LIMITS,
                             f"{name} = {value} is outside the spec's search limits "
                             f"({s.limits.describe()})")
    return None


def degrees_within_search_limits(s: SearchSpace, c: Candidate) -> Violation | None:
    return _outside_limits(s, (("tp", c.tmp), ("pp", c.pp), ("dp", c.dp)))


def mbs_within_search_limits(s: SearchSpace, c: Candidate) -> Violation | None:
    return _outside_limits(s, (("mbs", c.mbs),))


def zero_without_data_parallel(s: SearchSpace, c: Candidate) -> Violation | None:
    lowest = min(s.zero_stages)
    if c.dp == 1 and c.zero_stage != lowest:
        return Violation(Reason.ZERO_WITHOUT_DATA_PARALLEL,
                         f"ZeRO stage {c.zero_stage} at dp = 1 shards nothing: the same plan "
                         f"as stage {lowest}")
    return None


LAYOUT_RULES: tuple[Rule, ...] = (pp_within_layers, tmp_divides_model, dp_divides_batch)
"""Rules on (pp, dp, tmp) alone: checked once per layout in the enumeration."""
FEASIBILITY_RULES: tuple[Rule, ...] = LAYOUT_RULES + (mbs_divides_replica_batch,
                                                      zero_in_megatron,
                                                      zero_with_pipeline,
                                                      sequence_parallel_needs_tp,
                                                      sequence_divides_tmp,
                                                      virtual_stages_need_pipeline,
                                                      interleaved_microbatches,
                                                      chunks_split_blocks,
                                                      interleaved_backend,
                                                      context_parallel_backend,
                                                      sequence_divides_cp,
                                                      context_parallel_needs_flash,
                                                      ep_divides_experts,
                                                      ep_within_stage_ranks,
                                                      moe_tensor_parallel_needs_sp,
                                                      experts_zero_under_deepspeed,
                                                      cpu_offload_rules)
"""Everything a strategy must satisfy to run (what `estimate` checks)."""
EQUIVALENCE_RULES: tuple[Rule, ...] = (zero_without_data_parallel, selective_needs_scores)
"""Points that repeat (or are beaten by) another point's plan (the search keeps one)."""

# FEASIBILITY_RULES after LAYOUT_RULES, cut where the enumeration's inner loops begin: each
# part reads nothing of the loops inside it, so `enumerate_candidates` checks it once for
# all of them and a candidate's first broken rule is the same as checked one by one
_KNOB_RULES = FEASIBILITY_RULES[len(LAYOUT_RULES):]
_BY_RECOMPUTE = _KNOB_RULES[:3]        # mbs, ZeRO, recomputation (and the layout)
_BY_SP = _KNOB_RULES[3:5]              # sequence parallelism
_BY_VS = _KNOB_RULES[5:12]             # virtual stages (and cp)
_BY_EP = _KNOB_RULES[12:] + EQUIVALENCE_RULES   # expert parallelism: the rest
assert _BY_RECOMPUTE == (mbs_divides_replica_batch, zero_in_megatron, zero_with_pipeline)
assert _BY_SP == (sequence_parallel_needs_tp, sequence_divides_tmp)
assert _BY_VS[0] is virtual_stages_need_pipeline and _BY_VS[-1] is context_parallel_needs_flash
assert _BY_EP[0] is ep_divides_experts


def first_violation(space: SearchSpace, c: Candidate,
                    rules: tuple[Rule, ...] = FEASIBILITY_RULES) -> Violation | None:
    for rule in rules:
        v = rule(space, c)
        if v is not None:
            return v
    return None


def divisors(n: int) -> list[int]:
    """The positive divisors of n, ascending (O(sqrt n))."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def degrees(num_devices: int):
    """Every (pp, dp, tmp) with pp * dp * tmp = num_devices."""
    for tmp in divisors(num_devices):
        for pp in divisors(num_devices // tmp):
            yield pp, num_devices // (tmp * pp), tmp


def _with(c: Candidate, **changes) -> Candidate:
    """dataclasses.replace(c, **changes) for the enumeration's inner loops, without its
    per-call field introspection and frozen __init__ (0.8 against 4.6 us a call; 29,000 calls
    in a Megatron-LM plan of Llama 3 70B on 64 H100 with cp, v and sp searched). Candidate
    has no __post_init__ or derived field to recompute: equal to replace's result, and hashed
    alike (tests/test_search_space.py)."""
    new = object.__new__(Candidate)
    new.__dict__.update(c.__dict__, **changes)
    return new


def enumerate_candidates(space: SearchSpace, pruned: Counter) -> list[Candidate]:
    """Every (pp, dp, tmp, cp, mbs, zero, recompute, sequence parallel, virtual stages, ep)
    that satisfies the rules, one per equivalent group; what is dropped is counted in
    `pruned` under its reason, the first rule (FEASIBILITY_RULES order) it breaks (a cp that
    does not divide the devices is no point of the space). The rules are checked in runs
    (`_BY_RECOMPUTE`, `_BY_SP`, `_BY_VS`, `_BY_EP`), each once for all the points of the loops
    inside it, which it does not read: the same candidates and counts as every rule on every
    point, several times faster where sp, v and ep are searched."""
    sps, vss, eps = space.sequence_parallel, space.virtual_stages, space.expert_parallel
    knobs = len(space.zero_stages) * len(space.recompute) * len(sps) * len(vss) * len(eps)
    out = []
    layouts = ((pp, dp, tmp, cp) for cp in space.context_parallel
               if space.num_devices % cp == 0
               for pp, dp, tmp in degrees(space.num_devices // cp))
    for pp, dp, tmp, cp in layouts:
        probe = Candidate.make(pp=pp, dp=dp, tmp=tmp, mbs=1, zero_stage=space.zero_stages[0],
                               recompute=space.recompute[0], cp=cp)
        v = first_violation(space, probe, LAYOUT_RULES + (degrees_within_search_limits,))
        if v is not None:
            pruned[v.reason.value] += knobs
            continue
        for mbs in divisors(space.global_batch_size // dp):
            for z in space.zero_stages:
                for ck in space.recompute:
                    # each rule once for every point of the loops it does not read
                    probe = Candidate.make(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=z,
                                           recompute=ck, sequence_parallel=sps[0],
                                           virtual_stages=vss[0], cp=cp, ep=eps[0])
                    v = first_violation(space, probe, _BY_RECOMPUTE)
                    if v is not None:
                        pruned[v.reason.value] += len(sps) * len(vss) * len(eps)
                        continue
                    for sp in sps:
                        probe = _with(probe, sequence_parallel=sp)
                        v = first_violation(space, probe, _BY_SP)
                        if v is not None:
                            pruned[v.reason.value] += len(vss) * len(eps)
                            continue
                        for vs in vss:
                            probe = _with(probe, virtual_stages=vs)
                            v = first_violation(space, probe, _BY_VS)
                            if v is not None:
                                pruned[v.reason.value] += len(eps)
                                continue
                            for ep in eps:
                                c = _with(probe, ep=ep)
                                v = first_violation(space, c, _BY_EP
                                                    + (mbs_within_search_limits,))
                                if v is not None:
                                    pruned[v.reason.value] += 1
                                    continue
                                out.append(c)
    return out


SECONDS_PER_EVALUATION = 5e-3
"""Fixed cost of costing one strategy on one placement (cost arrays, memory check), measured
at 1-5 ms on the 2-core development machine; the estimate takes the top."""
SECONDS_PER_DP_CELL = 5e-7
"""Cost per stage x layer cell of the exact partition DP (0.1-0.7 us measured)."""
SECONDS_PER_LAYOUT_DEVICE = 1e-6
"""Cost per device of placing one (pp, dp, tmp) layout and finding its links (0.5-0.7 us
measured at 128,000 and 1,000,000 devices)."""


@dataclass(frozen=True)
class SearchCost:
    """What a search will cost at most, known before it starts: every candidate costed (the
    branch and bound of planner.plan costs fewer)."""

    candidates: int
    evaluations: int
    """Candidates x placement orders: the strategies costed, each with an exact DP."""
    layers: int
    dp_cells: int
    """Sum over the evaluations of pp x layers: the partition DP's work."""
    layout_devices: int = 0
    """Distinct placed layouts x devices: the placement and link work."""

    @property
    def estimated_s(self) -> float:
        return (self.evaluations * SECONDS_PER_EVALUATION + self.dp_cells * SECONDS_PER_DP_CELL
                + self.layout_devices * SECONDS_PER_LAYOUT_DEVICE)

    def describe(self) -> str:
        """The search's size and its cost if every candidate is costed: the most it takes
        (plan's branch and bound usually stops well before)."""
        return (f"{self.candidates:,} strategies x {self.evaluations // max(self.candidates, 1)} "
                f"placement order(s), {self.layers:,} layers: at most about "
                f"{self.estimated_s:,.0f} s")


def search_cost(space: SearchSpace, candidates: list[Candidate], orders: int) -> SearchCost:
    layouts = len({(c.pp, c.dp, c.tmp, c.cp) for c in candidates})
    return SearchCost(candidates=len(candidates), evaluations=len(candidates) * orders,
                      layers=space.num_layers,
                      dp_cells=orders * space.num_layers * sum(c.pp for c in candidates),
                      layout_devices=orders * layouts * space.num_devices)


def check_batch_has_a_degree(space: SearchSpace, candidates: list[Candidate],
                             pruned: Counter) -> None:
    """A global batch that no feasible dp divides is the user's error, not an empty plan."""
    if candidates or not pruned.get(Reason.DP_DOES_NOT_DIVIDE_BATCH.value):
        return
    rules = (pp_within_layers, tmp_divides_model)
    options = sorted({dp for pp, dp, tmp in degrees(space.num_devices)
                      if first_violation(space, Candidate(pp=pp, dp=dp, tmp=tmp, mbs=1,
                                                          zero_stage=0,
                                                          activation_checkpointing=False),
                                         rules) is None})
    raise SpecError("training.global_batch_size",
                    f"no feasible data-parallel degree divides {space.global_batch_size}: with "
                    f"{space.num_devices} devices and {space.num_layers} layers, dp must be one "
                    f"of {options}; use a multiple of one of them")
