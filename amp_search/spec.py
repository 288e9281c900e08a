"""The YAML spec, parsed once at the edge into frozen dataclasses (style.md, habit 2).

    spec.yaml --load_spec--> Spec(cluster: Cluster, model: ModelSpec, training: TrainingSpec)

Every problem is reported as a SpecError naming the key path and what is accepted. The file is
read by `yaml_io` (size, encoding, nesting, alias and duplicate-key limits); `parse_spec` then
checks every value, and accepts any Python data without raising anything but SpecError or
UsageError. Accepted ranges (inclusive):

    cluster.nodes[i].count                    1 to 1,000,000 nodes (1,000,000 devices in all)
    cluster.nodes[i].gpus_per_node            1 to 1,024
    cluster.nodes[i].nvlink_domain            GPUs of one NVLink domain over several nodes of
        the group: a multiple of gpus_per_node, up to 1,024 (a GB200 NVL72 rack: 72)
    cluster.nodes[i].intra/inter_node_bandwidth   1 Mbps to 100 TB/s; inter_node_bandwidth may
        be left out when the cluster has one node in all: it is never used then, and the
        record holds the node's intra_node_bandwidth as a placeholder
    cluster.nodes[i].intra/inter_node_link    a kind of the catalog's `links:` (nvlink, pcie,
        infiniband, roce, ethernet, slingshot, measured); default the GPU's / infiniband
    gpu.memory                                64 MiB to 64 TiB
    gpu.memory_bandwidth                      1 GB/s to 100 TB/s
    gpu.peak_tflops.<precision>               0.001 to 100,000 TFLOP/s, or null (unsupported)
    names (model, layer, GPU)                 1 to 128 printable characters
    model sizes                               amp_search.model_spec's MAX_* caps; heads >= 1
    model.hidden_dropout                      0 up to (not including) 1; default 0
    training.memory_headroom                  0% to 50%
    training.framework_overhead               0 B up to less than the smallest device memory
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from pathlib import Path

from cost_models.layers import CROSS_ENTROPY_KINDS, MOE_DISPATCHERS, Layer

from .errors import SpecError, UsageError
from .hosts import validate_hostname
from .model_spec import (ARCH_KEYS, DROPOUT_LAYER_FIELDS, MOE_LAYER_FIELDS, TRAINING_LAYER_FIELDS,
                         WINDOW_LAYER_FIELDS, ModelSpec, parse_model)
from .resources import catalog_path
from .spec_reader import MappingReader, key_text, read_name, read_number, show_value
from .units import (DEVICE_MEMORY, FIXED_COST_TIME, GEMM_SIZE, MEMORY_BANDWIDTH,
                    NETWORK_BANDWIDTH, OVERHEAD_MEMORY, link_count, parse_bandwidth,
                    parse_duration, parse_flops, parse_node_bandwidth, parse_size)
from .yaml_io import load_yaml_file, show_path

PRECISIONS = ("fp32", "fp16", "bf16", "fp8", "nvfp4")
"""training.precision, and the keys of a GPU's peak_tflops. fp8 and nvfp4 are Transformer
Engine's: the linear layers' GEMMs in FP8 (NVFP4: FP4 E2M1 with an FP8 scale per 16 values,
Blackwell only), everything else (attention core, norms, weights, gradients, activations,
communication) in BF16, so they need both rates and the megatron backend."""
NARROW_GEMM_PRECISIONS = ("fp8", "nvfp4")
"""Precisions whose linear GEMMs run narrower than the tensors are kept (STORAGE_PRECISION)."""
STORAGE_PRECISION = {"fp8": "bf16", "nvfp4": "bf16"}
"""The precision a training precision keeps its tensors in, where the two differ."""
OBJECTIVES = ("time", "cost", "gpu_seconds")
"""training.objective: what the best plan minimizes."""
MAX_PRICE_PER_HOUR = 1e7
BACKENDS = ("deepspeed", "megatron")
"""training.backend: the framework a plan is costed for."""
# sanity caps: absurd values are rejected, not attempted
MAX_DEVICES = 1_000_000
MAX_OFFLOAD_LAYERS = 4096  # training.cpu_offload_layers; the model's blocks bound it too
MAX_BATCH = 65_536  # a larger batch makes the simulated re-rank run for minutes
MAX_GPUS_PER_NODE = 1024
MIN_TFLOPS, MAX_TFLOPS = 0.001, 100_000.0
MAX_SOURCE_CHARS = 1000


# ----------------------------------------------------------------------------- records

@dataclass(frozen=True, kw_only=True)
class GPU:
    """A device type from the catalog (profiles/gpus.yaml) or defined inline in the spec."""

    name: str
    kind: str
    """gpu | cpu"""
    memory_bytes: int
    memory_bandwidth_bytes_per_s: float
    peak_flops_per_s: dict
    """precision -> dense FLOP/s, or None where the precision is unsupported."""
    source: str = ""
    gemm_max_efficiency: float = 0.8
    """The fraction of dense peak large GEMMs reach (cost_models.compute.gemm_efficiency)."""
    gemm_half_flops: float = 2e9
    """The GEMM size (FLOPs per call) at which they reach half of it."""
    gemm_fp8_max_efficiency: float | None = None
    """The fraction of the FP8 dense peak large FP8 GEMMs reach (their quantization included);
    None: gemm_max_efficiency."""
    gemm_nvfp4_max_efficiency: float | None = None
    """The fraction of the NVFP4 dense peak large NVFP4 GEMMs reach (gemm_efficiency.nvfp4_max;
    None: the FP8 one)."""
    gemm_efficiency_source: str = ""
    """Where this GPU's gemm_efficiency comes from (gemm_efficiency.source; the catalog's
    defaults' where it gives none)."""
    kernel_floor_s: float = 0.0
    """Device time of one block pass at least (its many small kernels)."""
    host_block_pass_s: float = 0.0
    """Host time to issue one block pass of one micro-batch (framework, launches)."""
    host_tp_allreduce_per_rank_s: float = 0.0
    """Host time of one tensor-parallel all-reduce per extra rank."""
    moe_expert_overhead_s: float = 0.0
    """What one micro-batch of a mixture-of-experts block costs per local expert beyond its
    kernels' device time, forward and backward, where Megatron-Core's dropless token
    dispatcher synchronizes the host in every MoE layer (the catalog's
    `moe_expert_overhead`; none with training.moe_sync_free)."""
    moe_a2a_overlap_share: float = 0.0
    """The share of a mixture-of-experts layer's expert-parallel all-to-alls that
    Megatron-LM's --overlap-moe-expert-parallel-comm hides behind another micro-batch's
    compute (training.moe_a2a_overlap; the catalog's `moe_a2a_overlap`)."""
    flash_attention: bool = True
    """Whether the usual training stacks run a fused attention kernel on it (training.attention:
    auto then costs flash attention, else the standard one that stores the scores)."""
    link_latency_intra_s: float = 0.0
    """Latency of one ring step of a collective (or one P2P message) between two of its devices
    inside a node (NVLink or PCIe: cost_models.comm.NCCL_RING_STEP_LATENCY_S)."""
    link_latency_inter_s: float = 0.0
    """The same across nodes (the network)."""
    host_link_bytes_per_s: float = 32e9
    """One direction of the link between the GPU and its host's memory, for one GPU (PCIe
    x16 of its generation, or NVLink-C2C on Grace superchips): what activation offloading
    (training.cpu_offload_layers) moves over; the catalog's `host_link`."""
    host_link_source: str = ""
    intra_node_link: str = "nvlink"
    """The kind of link between two of its devices inside a node (the catalog's `links:`): what
    share of a node's intra_node_bandwidth collectives reach, unless the node group names its
    own."""
    prediction_error: float = 0.0
    """The default model's measured error of iteration time on this GPU (a fraction: mean
    absolute percentage error over published runs); `plan` marks the plans whose predicted
    times lie within it of the best as tied. 0: unknown."""
    prediction_error_source: str = ""
    """Where `prediction_error` was measured."""
    prediction_error_moe: float = 0.0
    """The same on mixture-of-experts models (the catalog's prediction_error `moe:`), whose
    expert dispatch, routing and host syncs the model knows less well than a dense block.
    0: not known (`error_of` then gives the dense figure)."""
    prediction_error_moe_source: str = ""
    """Where `prediction_error_moe` was measured."""

    def error_of(self, experts: bool) -> tuple[float, str]:
        """(the model's measured error on this GPU, where it was measured) for a model with
        experts or a dense one."""
        if experts and self.prediction_error_moe > 0.0:
            return self.prediction_error_moe, self.prediction_error_moe_source
        return self.prediction_error, self.prediction_error_source


@dataclass(frozen=True, kw_only=True)
class LinkKind:
    """A kind of link from the catalog's `links:` (profiles/gpus.yaml)."""

    name: str
    achievable_share: float
    """The share of the nominal (data-sheet) bandwidth, one direction, that large collectives
    and P2P transfers reach on it (NCCL's bus bandwidth over the line rate)."""
    source: str


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    gpu: GPU
    count: int
    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    """GPU-to-GPU inside the node, one direction, as written (the data sheet's figure)."""
    inter_node_bandwidth_bytes_per_s: float
    """The node's total network bandwidth (all NICs), one direction, as written."""
    intra_node_link: LinkKind = LinkKind(name="measured", achievable_share=1.0, source="")
    """What kind of link that is, and the share of it collectives reach
    (`intra_node_achievable_bytes_per_s`)."""
    inter_node_link: LinkKind = LinkKind(name="measured", achievable_share=1.0, source="")
    """The same for the network."""
    hosts: tuple[str, ...] = ()
    """Hostnames of the `count` nodes, for launching (optional)."""
    network_links: int = 0
    """How many links the spec wrote inter_node_bandwidth as ('8 x 400 Gbps': 8); 0 where it
    gave the node's total. Only the header reads it (not part of the spec's fingerprint)."""
    price_per_hour: float | None = None
    """What one node costs per hour, in the user's currency (optional): the cost of a plan is
    its iteration time times the price of the nodes it uses (`planner.plan_subsets`). Not
    part of the spec's fingerprint: it does not change a plan of the whole cluster."""
    nvlink_domain_gpus: int = 0
    """GPUs of one NVLink domain that spans several of the group's nodes (a GB200 or GB300
    NVL72 rack: 72, or the 64 of them a job uses; trays of 4 GPUs are its nodes), consecutive
    nodes filling each domain (the last may hold fewer): links inside a domain are
    intra_node_bandwidth, and its nodes' networks add up (`Cluster.nvlink_domains`). 0: each
    node is a domain of its own."""

    @property
    def intra_node_achievable_bytes_per_s(self) -> float:
        """What collectives reach inside a node: the bandwidth written times its link's share."""
        return self.intra_node_bandwidth_bytes_per_s * self.intra_node_link.achievable_share

    @property
    def inter_node_achievable_bytes_per_s(self) -> float:
        """What collectives reach on the node's network: written bandwidth times the share."""
        return self.inter_node_bandwidth_bytes_per_s * self.inter_node_link.achievable_share


@dataclass(frozen=True, kw_only=True)
class Node:
    id: int
    group: int
    gpu: GPU
    devices: tuple[int, ...]
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    """As written (the data sheet's); collectives reach the `achievable` ones below."""
    host: str | None = None
    intra_node_achievable_bytes_per_s: float = 0.0
    inter_node_achievable_bytes_per_s: float = 0.0


@dataclass(frozen=True, kw_only=True)
class Device:
    id: int
    node: int
    local_rank: int
    gpu: GPU


@dataclass(frozen=True, kw_only=True)
class Cluster:
    node_groups: tuple[NodeGroup, ...]
    nodes: tuple[Node, ...]
    devices: tuple[Device, ...]

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def min_gpus_per_node(self) -> int:
        return min(len(n.devices) for n in self.nodes)

    @cached_property
    def nvlink_domains(self) -> tuple[tuple[int, ...], ...]:
        """The node ids of each NVLink domain, in order: a node alone, or consecutive nodes of
        a group whose `nvlink_domain_gpus` spans several (the group's last domain may hold
        fewer). What the cost model's links take as a node (amp_search.costing.links):
        inside a domain every link is NVLink, and its nodes share their networks."""
        out, first = [], 0
        for g in self.node_groups:
            per = max(1, g.nvlink_domain_gpus // g.gpus_per_node)
            out += [tuple(range(first + k, first + min(k + per, g.count)))
                    for k in range(0, g.count, per)]
            first += g.count
        return tuple(out)

    @cached_property
    def nvlink_domain_widths(self) -> tuple[int, ...]:
        """Devices of each NVLink domain (`nvlink_domains`)."""
        return tuple(sum(len(self.nodes[i].devices) for i in ids) for ids in self.nvlink_domains)

    @property
    def min_nvlink_gpus(self) -> int:
        """Devices of the smallest NVLink domain (`nvlink_domains`)."""
        return min(self.nvlink_domain_widths)

    @classmethod
    def from_groups(cls, groups: tuple[NodeGroup, ...]) -> "Cluster":
        nodes, devices = [], []
        for g_idx, g in enumerate(groups):
            for k in range(g.count):
                ids = tuple(range(len(devices), len(devices) + g.gpus_per_node))
                node = Node(id=len(nodes), group=g_idx, gpu=g.gpu, devices=ids,
                            intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
                            inter_node_bandwidth_bytes_per_s=g.inter_node_bandwidth_bytes_per_s,
                            host=g.hosts[k] if g.hosts else None,
                            intra_node_achievable_bytes_per_s=g.intra_node_achievable_bytes_per_s,
                            inter_node_achievable_bytes_per_s=g.inter_node_achievable_bytes_per_s)
                nodes.append(node)
                devices += [Device(id=i, node=node.id, local_rank=r, gpu=g.gpu)
                            for r, i in enumerate(ids)]
        return cls(node_groups=tuple(groups), nodes=tuple(nodes), devices=tuple(devices))


PIPELINE_P2P = ("whole", "split")
"""training.pipeline_p2p values (TrainingSpec.pipeline_p2p)."""
FINETUNE = ("none", "lora")
"""training.finetune values (TrainingSpec.finetune)."""
RECOMPUTE_MODULES = ("core_attn", "layernorm", "moe_act", "mla_up_proj")
"""(cost_models.activations.RECOMPUTABLE, which imports numpy.) What selective recomputation
may recompute (Megatron-LM's --recompute-modules, with
--recompute-granularity selective): the attention core; the norms that are modules of their
own (under Transformer Engine, a mixture-of-experts block's pre-MLP norm: the other norms are
fused into the linear layer after them); the experts' activation function; multi-latent
attention's up-projections and RoPE (their outputs, the queries, keys and values, discarded
after the core and made again in the backward)."""

DEFAULT_INTER_NODE_LINK = "infiniband"
"""The network's link kind where a node group names none (what GPU clusters for training
mostly run; `ethernet` and `roce` differ from it by 1%)."""

MAX_VIRTUAL_STAGES = 64
"""The largest training.virtual_pipeline_stages accepted (each chunk needs a layer per stage)."""
VIRTUAL_STAGES_SEARCH = ()
"""What `virtual_pipeline_stages: search` reads as, until the model is known: then every
number of chunks per stage up to VIRTUAL_STAGES_SEARCH_MOST that splits the model's blocks
evenly on some pipeline (`cost_models.pipeline.interleaved_virtual_stages`): Llama 3 70B's
80 blocks give 1, 2, 4, 5 and 8 (the 5 its Megatron-Bridge recipes run on 4 and 8 stages),
where a fixed 1, 2, 3, 4, 6, 8 tried two that no pipeline splits it into and missed 5. A
model whose blocks split evenly on no pipeline (DeepSeek-V3 with MTP) gets 1, 2, 4 and 8
uneven chunks (`cost_models.pipeline.balanced_chunks`, Megatron-LM's
--pipeline-model-parallel-layout)."""
VIRTUAL_STAGES_SEARCH_MOST = 8
"""The most chunks per stage `search` tries. The cost model charges a chunk nothing of its
own (its boundaries' P2P only in the fill and drain, the steady state's overlapped), so
more chunks always shrink the modelled bubble and the largest v that splits would always
win: on the published recipes, searching up to 64 (v 10 to 40 for Llama 3 70B) put the
recipe in its plan's top 10 for 15 of 66 against 18 (benchmarks/megatron_bridge.py
--ranks, 2026-11-30). The recipes themselves run 3 to 8, and 12 or 24 for Qwen3; a larger
limit waits for a per-chunk cost measured on the interleaved schedule."""
CONTEXT_PARALLEL_SEARCH = (1, 2, 4, 8, 16, 32)
"""The context-parallel degrees `context_parallel: search` tries (those that divide the devices
and the sequence: search_space's rules)."""
MAX_CONTEXT_PARALLEL = 1024
EXPERT_PARALLEL_SEARCH = (1, 2, 4, 8, 16, 32, 64, 128, 256)
"""The expert-parallel degrees `expert_parallel: search` tries (the default for a model with
experts; the search space keeps those that divide the experts and the stage's ranks)."""
MAX_EXPERT_PARALLEL = 4096
"""The model chunks per stage `virtual_pipeline_stages: search` tries; the search space's rules
keep those that split the transformer blocks evenly (search_space.chunks_split_blocks)."""


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    global_batch_size: int
    precision: str
    activation_checkpointing: tuple[str, ...]
    """Recomputation modes to search, from none | selective | full (`search`, the spec's
    default: all three; a list names some of them)."""
    zero_stage: tuple[int, ...]
    """Values to search: one stage, or 0-3 for `search` (the spec's default)."""
    memory_headroom: float = 0.05
    """Fraction of each device's memory kept free."""
    framework_overhead_bytes: int = 1 << 30
    """Fixed per-device memory (CUDA context, allocator, communication buffers)."""
    optimizer: str = "adam"
    attention: str = "auto"
    """flash | standard | auto (each device type's catalog `flash_attention`)."""
    sequence_parallel: tuple[bool, ...] = (False,)
    """Values to search: (False,), (True,) or (False, True) for `search`, the spec's default
    (the rules keep it to tmp > 1 and sequences divisible by tmp). This record's default is
    (False,), what AMP's paper runs."""
    virtual_pipeline_stages: tuple[int, ...] = (1,)
    """Model chunks per pipeline stage to search: (1,) plain 1F1B, (v,) for a given v, or,
    for `search`, each v that splits the model's blocks evenly on some pipeline
    (VIRTUAL_STAGES_SEARCH; v > 1: Megatron-LM's interleaved 1F1B; the spec's default under
    the megatron backend, (1,) under deepspeed, which has no such schedule)."""
    context_parallel: tuple[int, ...] = (1,)
    """Context-parallel degrees to search: (1,) none (the default), (c,) a given one, or
    CONTEXT_PARALLEL_SEARCH for `search`; megatron backend only (Megatron-LM's ring
    attention)."""
    expert_parallel: tuple[int, ...] = (1,)
    """Expert-parallel degrees to search (a model with experts): (e,) a given one, a list, or
    EXPERT_PARALLEL_SEARCH for `search`, the default for such a model; megatron backend only
    (Megatron-LM's --expert-model-parallel-size, with expert tensor parallelism 1)."""
    objective: str = "time"
    """What the best plan minimizes (OBJECTIVES): time per iteration; cost (iteration time x
    the price of the nodes used: every node group needs price_per_hour); gpu_seconds (time x
    GPUs used, DeepPool's GPU-time efficiency). Cost and GPU-seconds may leave nodes idle:
    the planner then also plans subsets of the cluster (`planner.plan_subsets`)."""
    backend: str = "deepspeed"
    """The training framework the plan is for (BACKENDS): deepspeed (the trial program) or
    megatron (Megatron-LM: zero_stage 1 is its distributed optimizer, 3 Megatron-FSDP, with
    pp 1; ZeRO 2 does not exist there)."""
    finetune: str = "none"
    """FINETUNE: none (every weight trained) or lora (the weights frozen, low-rank adapters
    trained beside them: no weight gradients, optimizer state or gradient reduction for the
    frozen weights, each backward computing the input gradients only; the adapters, a rank of
    tens beside widths of thousands, are not costed)."""
    pipeline_p2p: str = "whole"
    """How Megatron-LM sends the activation crossing a stage boundary without sequence
    parallelism (PIPELINE_P2P): whole, every tensor rank the whole tensor (megatron-core's
    p2p_communication); split, each rank 1/t of it and the receiver all-gathers it over the
    tensor group (Megatron-LM before megatron-core and Megatron-DeepSpeed:
    --scatter-gather-tensors-in-pipeline, on by default there). DeepSpeed's pipeline engine
    always splits (pipe_partitioned)."""

    overlap_grad_reduce: bool | None = None
    """Whether the gradients are reduced in buckets while the last micro-batch's backward
    still runs (Megatron-LM's --overlap-grad-reduce, DeepSpeed's overlap_comm); None (the
    spec's `default`): the backend's default, `cost_models.comm.
    gradient_reduce_overlaps_backward` (off under Megatron-LM and for DeepSpeed's ZeRO 0-2,
    on for ZeRO 3; DeepSpeed never overlaps ZeRO 0's all-reduce)."""

    tp_comm_overlap: bool = False
    """Megatron-LM's --tp-comm-overlap: each tensor-parallel all-gather and reduce-scatter
    (sequence parallelism) runs in chunks beside the GEMM it feeds or follows (Transformer
    Engine's userbuffers); strategies without sequence parallelism, and DeepSpeed plans, keep
    them exposed."""

    overlap_p2p_comm: bool = True
    """Megatron-LM's interleaved schedule overlaps its P2P with the model chunks (its
    default since megatron-core; --no-overlap-p2p-communication: False, as Megatron-LM ran it
    before, the steady state waiting for each boundary's transfer). Only virtual stages under
    backend megatron use it (cost_models.pipeline.INTERLEAVED_BLOCKING_SHARE)."""

    moe_sync_free: bool = False
    """Whether Megatron-Core runs its mixture-of-experts layers without a host sync: a static
    per-rank expert capacity (--moe-expert-rank-capacity-factor) lets the token dispatcher
    size its all-to-alls without reading the routed counts back to the host, and the whole
    iteration runs as one CUDA graph with the experts' MLP fused (Megatron-Bridge's MXFP8
    recipes from NeMo 26.06). False (the default, Megatron-Core's dropless dispatchers): each
    MoE layer reads the counts back, so the host cannot run ahead and what it spends per
    local expert shows (the catalog's moe_expert_overhead), and its grouped experts run part
    of their elementwise work as separate PyTorch ops (cost_models.layers
    .unfused_expert_bytes_by_pass; true sets Layer.fused_experts on the MoE blocks). Megatron
    backend only."""

    moe_a2a_overlap: bool = False
    """Megatron-LM's --overlap-moe-expert-parallel-comm: in the steady state each MoE layer's
    dispatch and combine all-to-alls run beside another micro-batch's compute, hiding the
    catalog's `moe_a2a_overlap` share of them. Megatron backend, a model with experts."""

    moe_dispatcher: str = "alltoall"
    """Megatron-core's token dispatcher (cost_models.layers.MOE_DISPATCHERS): 'alltoall' (its
    default) sends each of a token's k copies to its expert's rank; 'deepep' and 'hybridep'
    (--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend X) send a token once over
    the network to each other node its experts are on and forward it there over NVLink
    (cost_models.comm.hierarchical_shares): the same inside a node, up to k times fewer
    network bytes across nodes. Megatron backend, a model with experts."""

    recompute_modules: tuple[str, ...] = ("core_attn",)
    """What `selective` recomputation recomputes (RECOMPUTE_MODULES, Megatron-LM's
    --recompute-modules, whose default is core_attn alone). The deepspeed trials recompute the
    attention core only."""

    cross_entropy: str = "native"
    """The loss kernel (cost_models.layers.CROSS_ENTROPY_KINDS): 'native', Megatron-LM's
    vocab-parallel cross-entropy (and DeepSpeed's trials'), which keeps an fp32 softmax of the
    logits; 'te', Transformer Engine's fused one (--cross-entropy-loss-fusion
    --cross-entropy-fusion-impl te, what Megatron-Bridge's recipes run), which keeps the
    logits' gradient in their own dtype. Megatron backend, bf16 / fp8 / nvfp4 / fp32 logits;
    the model's head carries it (Layer.cross_entropy)."""

    cpu_offload_layers: int = 0
    """Megatron-LM's --cpu-offloading --cpu-offloading-num-layers N (Transformer Engine's
    activation offloading): the saved activations of the first N transformer blocks go to
    host memory during the forward and come back for the backward, on a side stream beside
    the compute (GPU.host_link_bytes_per_s). megatron-core allows it with pp 1 and no
    recomputation only (search_space.cpu_offload_rules); 0: none."""

    grad_reduce_in_fp32: bool | None = None
    """Whether the gradients are accumulated and reduced in fp32 (Megatron-LM's
    --accumulate-allreduce-grads-in-fp32, megatron-core's grad_reduce_in_fp32; DeepSpeed's
    communication_data_type fp32) or in the training dtype; None (`default`): the backend's
    (fp32 under Megatron-LM with bf16, fp8 or nvfp4, which also keeps its gradient buffer in
    fp32; the training dtype under DeepSpeed)."""

    def overlaps_grad_reduce(self, zero_stage: int) -> bool:
        """Whether a strategy at `zero_stage` reduces its gradients overlapped with the
        backward (`overlap_grad_reduce`, else the backend's default)."""
        from cost_models.comm import gradient_reduce_overlaps_backward   # numpy: not at import

        return gradient_reduce_overlaps_backward(framework=self.backend, zero_stage=zero_stage,
                                                 overlap_comm=self.overlap_grad_reduce)

    def selective(self, selective_recompute: bool) -> bool | tuple[str, ...]:
        """What cost_models.activations' `selective` argument is for a strategy with
        selective recomputation on or off: False, True (the attention core alone, the
        default recompute_modules) or the modules named."""
        if not selective_recompute:
            return False
        return True if self.recompute_modules == ("core_attn",) else self.recompute_modules

    @property
    def bytes_per_element(self) -> int:
        return 4 if self.precision == "fp32" else 2

    @property
    def frozen_weights(self) -> bool:
        """Whether the model's weights are frozen (finetune lora): no weight gradients,
        optimizer state, optimizer step or gradient reduction for them."""
        return self.finetune == "lora"

    @property
    def storage_precision(self) -> str:
        """What weights, gradients, activations and messages are kept in: bf16 for fp8
        (Transformer Engine casts only the GEMMs' inputs), else the precision itself."""
        return STORAGE_PRECISION.get(self.precision, self.precision)


@dataclass(frozen=True, kw_only=True)
class SearchLimits:
    """The optional `search:` section: the degrees the planner may try, as NeMo's
    auto-configurator users limit them. Per degree (tp, pp, dp, mbs) a set of allowed values
    or a maximum; None: any. Context parallelism and virtual stages take their values from
    training.context_parallel and training.virtual_pipeline_stages."""

    allowed: tuple[tuple[str, tuple[int, ...]], ...] = ()
    """(degree, its allowed values ascending) pairs."""
    maximum: tuple[tuple[str, int], ...] = ()
    """(degree, the largest allowed value) pairs."""

    def admits(self, name: str, value: int) -> bool:
        allowed = dict(self.allowed).get(name)
        return (allowed is None or value in allowed) and \
            value <= dict(self.maximum).get(name, value)

    def describe(self) -> str:
        """'tp 1/2/4, pp at most 8' ('' when nothing is limited)."""
        out = [f"{k} {'/'.join(map(str, v))}" for k, v in self.allowed]
        out += [f"{k} at most {v}" for k, v in self.maximum]
        return ", ".join(out)


SEARCH_DEGREES = {"tp": "tensor_parallel_sizes", "pp": "pipeline_parallel_sizes",
                  "dp": "data_parallel_sizes", "mbs": "micro_batch_sizes"}
"""The `search:` keys, each with the name NeMo's auto-configurator gives it (accepted too)."""
MAX_SEARCH_VALUE = 1_000_000


def _search_limits(data) -> SearchLimits:
    """search: {tp: [1, 2, 4], pp: {max: 8}, mbs: 2, ...} (a list of allowed values, one value
    to pin it, or {max: N}); NeMo's names (tensor_parallel_sizes, ...) are accepted."""
    if data is None:
        return SearchLimits()
    aliases = {v: k for k, v in SEARCH_DEGREES.items()}
    r = MappingReader(data, "search", tuple(SEARCH_DEGREES) + tuple(aliases))
    allowed, maximum = {}, {}
    for key in list(SEARCH_DEGREES) + list(aliases):
        if not r.has(key):
            continue
        name = aliases.get(key, key)
        if name in allowed or name in maximum:
            raise SpecError(r.at(key), f"{name} is limited twice (as {name} and "
                                       f"{SEARCH_DEGREES[name]}); give it once")
        v = r.raw(key)
        accepted = (f"accepted: a positive integer (pins {name}), a list of them such as "
                    f"[1, 2, 4], or {{max: N}}")
        if isinstance(v, dict):
            m = MappingReader(v, r.at(key), ("max",))
            maximum[name] = m.int("max", required=True, hi=MAX_SEARCH_VALUE)
        elif isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= MAX_SEARCH_VALUE:
            allowed[name] = (v,)
        elif isinstance(v, list) and v and all(
                isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= MAX_SEARCH_VALUE
                for x in v):
            allowed[name] = tuple(sorted(set(v)))
        else:
            raise SpecError(r.at(key), f"got {show_value(v)}; {accepted}")
    return SearchLimits(allowed=tuple(allowed.items()), maximum=tuple(maximum.items()))


@dataclass(frozen=True, kw_only=True)
class Spec:
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    search: SearchLimits = field(default_factory=SearchLimits)
    """Limits on the degrees the planner tries (the `search:` section; none by default)."""
    path: Path | None = None
    sha256: str = ""
    """Hash of the parsed spec content (what the results database keys trials by)."""
    backend_given: bool = True
    """Whether the spec names training.backend. Where it does not, `training` is the first
    backend (BACKENDS order) that can run the spec and `other_backends` the rest: the CLI's
    `plan` plans each (`backends()`) and says which is faster."""
    other_backends: tuple[TrainingSpec, ...] = ()
    """training as each other backend would run it, where the spec names none (its
    backend-dependent defaults included: Megatron-LM searches ZeRO 0/1 and virtual stages)."""
    backend_notes: tuple[str, ...] = ()
    """Why a backend the spec could mean cannot run it (one line each), where it names none."""

    def backends(self) -> tuple["Spec", ...]:
        """This spec under each backend it may be planned for: itself, then `other_backends`
        (where the spec names no training.backend)."""
        return (self,) + tuple(replace(self, training=t, other_backends=())
                               for t in self.other_backends)

    def for_backend(self, backend: str) -> "Spec":
        """This spec costed for `backend` (a plan row's `Estimate.backend`): itself where
        training.backend is it, else the one of `backends()` that is; UsageError where the
        spec names another backend or `backend` cannot run it."""
        for s in self.backends():
            if s.training.backend == backend:
                return s
        why = next((n for n in self.backend_notes if n.startswith(f"{backend}:")), None)
        raise UsageError(f"backend {backend}: " + (why.split(":", 1)[1].strip() if why else
                                                   f"the spec sets training.backend: "
                                                   f"{self.training.backend}"))

    def attention_for(self, gpu: GPU) -> str:
        """The attention implementation the model runs on `gpu`: 'flash' (a fused kernel that
        stores no scores) or 'standard' (training.attention; auto follows the catalog)."""
        if self.training.attention != "auto":
            return self.training.attention
        return "flash" if gpu.flash_attention else "standard"

    def model_error(self) -> "ModelError":
        """The default model's measured error on the cluster's least known GPU type (the
        catalog's prediction_error; its `moe:` figure for a model with experts): what `plan`
        marks ties within."""
        experts = bool(self.model.num_experts)
        gpu = max((g.gpu for g in self.cluster.node_groups),
                  key=lambda g: g.error_of(experts)[0])
        mape, source = gpu.error_of(experts)
        return ModelError(mape=mape, gpu=gpu, kind="experts" if experts else "dense",
                          source=source, for_experts=experts and gpu.prediction_error_moe > 0.0)


@dataclass(frozen=True, kw_only=True)
class ModelError:
    """The default model's measured error on a cluster (`Spec.model_error`)."""

    mape: float
    """A fraction (0.037: 3.7%); 0.0 where none is known."""
    gpu: GPU
    """The cluster's GPU type whose figure it is: the least known one."""
    kind: str
    """'experts' for a model with experts, else 'dense'."""
    source: str
    """Where it was measured (the catalog's prediction_error source)."""
    for_experts: bool
    """Whether it is the GPU's figure for models with experts (the catalog's `moe:`)."""


def _read_catalog(path: Path | None) -> tuple[Path, dict, dict, object]:
    """(path, gpus, defaults, the `links:` section as written or None) of a catalog file."""
    path = catalog_path() if path is None else Path(path)
    data = load_yaml_file(path, what="GPU catalog")
    gpus = data.get("gpus") if isinstance(data, dict) else None
    if not isinstance(gpus, dict):
        raise UsageError(f"GPU catalog {show_path(path)}: expected a mapping 'gpus: {{NAME: {{memory, "
                         f"memory_bandwidth, peak_tflops}}}}'")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict) or any(k not in GPU_MODEL_KEYS for k in defaults):
        raise UsageError(f"GPU catalog {show_path(path)}: 'defaults' may hold "
                         f"{', '.join(GPU_MODEL_KEYS)}")
    return path, gpus, defaults, data.get("links")


@lru_cache(maxsize=1)
def _packaged_catalog() -> tuple[Path, dict, dict, object]:
    """`_read_catalog` of the packaged catalog, read once."""
    return _read_catalog(None)


def _parse_links(links, path: Path) -> dict[str, LinkKind]:
    """A catalog's `links:` section: name -> LinkKind ({achievable: '82%', source: ...}
    each). A catalog of the user's without the section takes the packaged catalog's."""
    if links is None and path.resolve() != catalog_path().resolve():
        return link_kinds()
    if not isinstance(links, dict) or not links:
        raise UsageError(f"GPU catalog {show_path(path)}: expected a mapping 'links: {{KIND: "
                         f"{{achievable, source}}}}'")
    out = {}
    for name, entry in links.items():
        name = read_name(name, f"catalog.links.{key_text(name)}", "")
        r = MappingReader(entry, f"catalog.links.{name}", ("achievable", "source"))
        out[name] = LinkKind(
            name=name,
            achievable_share=read_percent(r.raw("achievable", required=True), r.at("achievable"),
                                          "'82%'"),
            source=read_name(r.raw("source", required=True), r.at("source"), "",
                             MAX_SOURCE_CHARS))
    return out


@lru_cache(maxsize=1)
def link_kinds() -> dict[str, LinkKind]:
    """The packaged catalog's link kinds (profiles/gpus.yaml `links:`)."""
    path, _, _, links = _packaged_catalog()
    return _parse_links(links, path)


def load_catalog(path: Path | None = None) -> dict[str, GPU]:
    """The GPU catalog: name -> GPU (default: the one the package ships, read and checked
    once). Read through the same front door as a spec, and every entry checked as an inline
    GPU is; the analytic model's keys an entry lacks come from the catalog's `defaults:`."""
    if path is None:
        return dict(_packaged_gpus())
    return _catalog_gpus(*_read_catalog(path))


@lru_cache(maxsize=1)
def _packaged_gpus() -> dict[str, GPU]:
    """`load_catalog` of the packaged catalog (its GPUs are frozen records; callers get a
    copy of the mapping)."""
    return _catalog_gpus(*_packaged_catalog())


def _catalog_gpus(path: Path, gpus: dict, defaults: dict, links) -> dict[str, GPU]:
    """A catalog's entries (`_read_catalog`'s parts) as name -> GPU."""
    links = _parse_links(links, path)
    catalog = {}
    for name, entry in gpus.items():
        name = read_name(name, f"catalog.{key_text(name)}", "")
        catalog[name] = _gpu(entry, name, f"catalog.{name}", defaults, links)
    return catalog


@lru_cache(maxsize=1)
def catalog_defaults() -> dict:
    """The packaged catalog's `defaults:` (what an inline GPU of a spec falls back on)."""
    return _packaged_catalog()[2]


def read_percent(raw, path: str, example: str) -> float:
    """A percentage written as text ('6.4%') as a fraction in [0, 1]."""
    text = raw.strip() if isinstance(raw, str) else ""
    try:
        value = float(text[:-1]) / 100 if text.endswith("%") else float("nan")
    except ValueError:
        value = float("nan")
    if not 0.0 <= value <= 1.0:
        raise SpecError(path, f"got {show_value(raw)}; accepted: a percentage from 0% to 100%, "
                              f"e.g. {example}")
    return value


GPU_MODEL_KEYS = ("gemm_efficiency", "kernel_floor", "host_time", "flash_attention",
                  "link_latency", "intra_node_link", "prediction_error", "host_link",
                  "moe_expert_overhead", "moe_a2a_overlap")
"""Keys of a catalog entry (or inline GPU) for the analytic model; missing ones come from the
catalog's `defaults:`."""


def _catalog_matches(name, catalog) -> list[str]:
    """The catalog's GPU names that `name` (as a user may write one: 'B200', 'h100', 'GB200
    NVL72') may mean: those it starts or that start it, case, spaces and dashes aside, or
    else those its first word starts; exact names only count (a hint, never taken for the
    user)."""
    import re

    if not isinstance(name, str):
        return []

    def norm(x: str) -> str:
        return "".join(ch for ch in x.lower() if ch.isalnum())

    words = re.findall(r"[a-z0-9]+", name.lower())
    for key in (norm(name), words[0] if words else ""):
        if key:
            hits = [c for c in catalog if norm(c).startswith(key) or key.startswith(norm(c))]
            if hits:
                return hits
    return []


def _gpu(entry, name: str, path: str, defaults: dict | None = None,
         links: dict[str, LinkKind] | None = None) -> GPU:
    """A GPU from a catalog entry or an inline mapping; `name` is the default name; the
    analytic model's keys default to `defaults` (the catalog's `defaults:` mapping)."""
    r = MappingReader(entry, path, ("name", "kind", "memory", "memory_bandwidth", "peak_tflops",
                              "source") + GPU_MODEL_KEYS)
    peak = r.raw("peak_tflops", required=True)
    if not isinstance(peak, dict) or not peak:
        raise SpecError(r.at("peak_tflops"), "expected a mapping precision -> TFLOP/s, "
                                             "e.g. {fp32: 15.7, fp16: 125}")
    bad = [k for k in peak if not isinstance(k, str) or k not in PRECISIONS]
    if bad:
        raise SpecError(f"{r.at('peak_tflops')}.{key_text(bad[0])}", f"unknown precision; accepted: "
                                                                f"{', '.join(PRECISIONS)}")
    flops = {}
    for p in PRECISIONS:
        v = peak.get(p)
        flops[p] = None if v is None else read_number(
            v, f"{r.at('peak_tflops')}.{p}", MIN_TFLOPS, MAX_TFLOPS,
            "dense TFLOP/s; null where the precision is unsupported") * 1e12
    model = _gpu_model(r, defaults if defaults is not None else catalog_defaults(),
                       links if links is not None else link_kinds())
    return GPU(name=read_name(r.raw("name"), r.at("name"), name),
               kind=r.choice("kind", ("gpu", "cpu"), "gpu"),
               memory_bytes=parse_size(r.raw("memory", required=True), r.at("memory"),
                                       DEVICE_MEMORY),
               memory_bandwidth_bytes_per_s=parse_bandwidth(
                   r.raw("memory_bandwidth", required=True), r.at("memory_bandwidth"),
                   MEMORY_BANDWIDTH),
               peak_flops_per_s=flops,
               source=read_name(r.raw("source"), r.at("source"), "", MAX_SOURCE_CHARS), **model)


def _gpu_model(r: "MappingReader", defaults: dict, links: dict[str, LinkKind]) -> dict:
    """The GPU record's analytic-model fields from an entry's keys, else the defaults':

        gemm_efficiency: {max: 0.8, half_at: 2 GFLOP}
        kernel_floor: 450 us
        host_time: {block_pass: 1100 us, tp_allreduce_per_rank: 20 us}
        flash_attention: true
        link_latency: {intra: 3.4 us, inter: 9.6 us}
        intra_node_link: nvlink
    """
    def get(key):
        return r.raw(key) if r.has(key) else defaults.get(key)

    out = {}
    gemm = get("gemm_efficiency")
    if r.has("gemm_efficiency") and isinstance(gemm, dict) \
            and isinstance(defaults.get("gemm_efficiency"), dict):
        # each key the entry gives replaces the defaults' (e.g. a family's own max, with the
        # defaults' half_at and FP8/NVFP4 fractions); the defaults' source is theirs alone
        own = {"source": "as written for this GPU"} if gemm else {}
        gemm = {**defaults["gemm_efficiency"], **own, **gemm}
    if gemm is not None:
        g = MappingReader(gemm, r.at("gemm_efficiency"), ("max", "half_at", "fp8_max",
                                                          "nvfp4_max", "source"))
        if g.has("source"):
            out["gemm_efficiency_source"] = read_name(g.raw("source"), g.at("source"), "",
                                                      MAX_SOURCE_CHARS)
        out["gemm_max_efficiency"] = read_number(g.raw("max", required=True), g.at("max"), 0.01,
                                             1.0, "fraction of dense peak")
        if g.has("fp8_max"):
            out["gemm_fp8_max_efficiency"] = read_number(g.raw("fp8_max"), g.at("fp8_max"), 0.01,
                                                         1.0, "fraction of the FP8 dense peak")
        if g.has("nvfp4_max"):
            out["gemm_nvfp4_max_efficiency"] = read_number(
                g.raw("nvfp4_max"), g.at("nvfp4_max"), 0.01, 1.0,
                "fraction of the NVFP4 dense peak")
        out["gemm_half_flops"] = parse_flops(g.raw("half_at", required=True), g.at("half_at"),
                                             GEMM_SIZE)
    floor = get("kernel_floor")
    if floor is not None:
        out["kernel_floor_s"] = parse_duration(floor, r.at("kernel_floor"), FIXED_COST_TIME)
    moe = get("moe_expert_overhead")
    if moe is not None:
        out["moe_expert_overhead_s"] = parse_duration(moe, r.at("moe_expert_overhead"),
                                                      FIXED_COST_TIME)
    hidden = get("moe_a2a_overlap")
    if hidden is not None:
        out["moe_a2a_overlap_share"] = read_percent(hidden, r.at("moe_a2a_overlap"), "20%")
    host = get("host_time")
    if host is not None:
        h = MappingReader(host, r.at("host_time"), ("block_pass", "tp_allreduce_per_rank"))
        out["host_block_pass_s"] = parse_duration(h.raw("block_pass", required=True),
                                                  h.at("block_pass"), FIXED_COST_TIME)
        out["host_tp_allreduce_per_rank_s"] = parse_duration(
            h.raw("tp_allreduce_per_rank", required=True), h.at("tp_allreduce_per_rank"),
            FIXED_COST_TIME)
    flash = get("flash_attention")
    if flash is not None:
        if not isinstance(flash, bool):
            raise SpecError(r.at("flash_attention"), f"got {show_value(flash)}; accepted: true, "
                                                     f"false")
        out["flash_attention"] = flash
    err = get("prediction_error")
    if err is not None:
        e = MappingReader(err, r.at("prediction_error"), ("mape", "source", "moe"))
        out["prediction_error"] = read_percent(e.raw("mape", required=True), e.at("mape"),
                                               "'6.4%'")
        out["prediction_error_source"] = read_name(e.raw("source", required=True),
                                                   e.at("source"), "", MAX_SOURCE_CHARS)
        moe, where = e.raw("moe"), e.at("moe")
        if moe is None and isinstance(defaults.get("prediction_error"), dict):
            # an entry's own figure without `moe:` keeps the defaults' (not measured there)
            moe, where = defaults["prediction_error"].get("moe"), "defaults.prediction_error.moe"
        if moe is not None:
            m = MappingReader(moe, where, ("mape", "source"))
            out["prediction_error_moe"] = read_percent(m.raw("mape", required=True),
                                                       m.at("mape"), "'11.3%'")
            out["prediction_error_moe_source"] = read_name(
                m.raw("source", required=True), m.at("source"), "", MAX_SOURCE_CHARS)
    lat = get("link_latency")
    if lat is not None:
        k = MappingReader(lat, r.at("link_latency"), ("intra", "inter"))
        out["link_latency_intra_s"] = parse_duration(k.raw("intra", required=True),
                                                     k.at("intra"), FIXED_COST_TIME)
        out["link_latency_inter_s"] = parse_duration(k.raw("inter", required=True),
                                                     k.at("inter"), FIXED_COST_TIME)
    link = get("intra_node_link")
    if link is not None:
        out["intra_node_link"] = _link_kind(link, r.at("intra_node_link"), links).name
    host_link = get("host_link")
    if host_link is not None:
        h = MappingReader(host_link, r.at("host_link"), ("bandwidth", "source"))
        out["host_link_bytes_per_s"] = parse_bandwidth(h.raw("bandwidth", required=True),
                                                       h.at("bandwidth"), MEMORY_BANDWIDTH)
        out["host_link_source"] = read_name(h.raw("source", required=True), h.at("source"), "",
                                            MAX_SOURCE_CHARS)
    return out


def _link_kind(value, path: str, links: dict[str, LinkKind]) -> LinkKind:
    if not isinstance(value, str) or value not in links:
        raise SpecError(path, f"unknown link kind {show_value(value)}; accepted: "
                              f"{', '.join(links)}")
    return links[value]


def _cluster(data, catalog: dict[str, GPU]) -> Cluster:
    """The node groups. inter_node_bandwidth is required unless the cluster has one node in
    all; then the planner never uses it and the group's intra_node_bandwidth stands in."""
    r = MappingReader(data, "cluster", ("nodes",))
    nodes = r.raw("nodes", required=True)
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("cluster.nodes", "expected a non-empty list of node groups")
    fields = []
    total = 0
    kinds = link_kinds()
    for i, entry in enumerate(nodes):
        path = f"cluster.nodes[{i}]"
        n = MappingReader(entry, path, ("gpu", "count", "gpus_per_node", "intra_node_bandwidth",
                                        "intra_node_link", "inter_node_bandwidth",
                                        "inter_node_link", "hosts", "price_per_hour",
                                        "nvlink_domain"))
        gpu_v = n.raw("gpu", required=True)
        if isinstance(gpu_v, dict):
            gpu = _gpu(gpu_v, f"custom-{i}", n.at("gpu"))
        elif isinstance(gpu_v, str) and gpu_v in catalog:
            gpu = catalog[gpu_v]
        else:
            near = _catalog_matches(gpu_v, catalog)
            hint = f"did you mean {' or '.join(map(repr, near))}? " if near else ""
            raise SpecError(n.at("gpu"), f"unknown GPU {show_value(gpu_v)}; {hint}known: "
                                         f"{', '.join(catalog)} (or define one inline: "
                                         f"{{name, memory, memory_bandwidth, peak_tflops}})")
        count = n.int("count", 1, hi=MAX_DEVICES)
        per = n.int("gpus_per_node", required=True, hi=MAX_GPUS_PER_NODE)
        total += count * per
        if total > MAX_DEVICES:
            raise SpecError(n.at("count"), f"more than {MAX_DEVICES} devices in all")
        hosts = n.raw("hosts", [])
        if not isinstance(hosts, list) or (hosts and len(hosts) != count):
            raise SpecError(n.at("hosts"), f"expected a list of {count} hostnames (one per node)")
        for k, h in enumerate(hosts):
            validate_hostname(h, f"{n.at('hosts')}[{k}]")
        intra = parse_bandwidth(n.raw("intra_node_bandwidth", required=True),
                                n.at("intra_node_bandwidth"), NETWORK_BANDWIDTH)
        inter, links = None, 0
        if n.has("inter_node_bandwidth"):
            inter = parse_node_bandwidth(n.raw("inter_node_bandwidth"),
                                         n.at("inter_node_bandwidth"), NETWORK_BANDWIDTH)
            links = link_count(n.raw("inter_node_bandwidth"))
        domain = 0
        if n.has("nvlink_domain"):
            domain = n.int("nvlink_domain", hi=MAX_GPUS_PER_NODE)
            if domain % per:
                raise SpecError(n.at("nvlink_domain"), f"got {domain}; accepted: a multiple of "
                                                       f"gpus_per_node ({per}), the GPUs of "
                                                       f"one NVLink domain over several nodes "
                                                       f"(a GB200 NVL72 rack: 72)")
            domain = 0 if domain == per else domain     # a node alone: as without the key
        price = n.raw("price_per_hour", None)
        if price is not None:
            price = read_number(price, n.at("price_per_hour"), 0.0, MAX_PRICE_PER_HOUR,
                                "what one node costs per hour")
        fields.append(dict(gpu=gpu, count=count, gpus_per_node=per,
                           intra_node_bandwidth_bytes_per_s=intra,
                           inter_node_bandwidth_bytes_per_s=inter, hosts=tuple(hosts),
                           network_links=links, price_per_hour=price,
                           nvlink_domain_gpus=domain,
                           intra_node_link=_link_kind(n.raw("intra_node_link", gpu.intra_node_link),
                                                      n.at("intra_node_link"), kinds),
                           inter_node_link=_link_kind(n.raw("inter_node_link",
                                                            DEFAULT_INTER_NODE_LINK),
                                                      n.at("inter_node_link"), kinds)))
    num_nodes = sum(f["count"] for f in fields)
    for i, f in enumerate(fields):
        if f["inter_node_bandwidth_bytes_per_s"] is None:
            if num_nodes > 1:
                raise SpecError(f"cluster.nodes[{i}].inter_node_bandwidth",
                                f"required key is missing (the cluster has {num_nodes} nodes; "
                                f"it may be left out only for a single node), e.g. '100 Gbps'")
            f["inter_node_bandwidth_bytes_per_s"] = f["intra_node_bandwidth_bytes_per_s"]
    return Cluster.from_groups(tuple(NodeGroup(**f) for f in fields))


def _degrees(r: MappingReader, key: str, default, search: tuple[int, ...], maximum: int,
             meaning: str) -> tuple[int, ...]:
    """A parallel degree key: an integer, a list of distinct ones, or search (`search`)."""
    value = r.raw(key, default)
    if value == "search":
        return search
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= maximum:
        return (value,)
    if isinstance(value, list) and value and all(
            isinstance(x, int) and not isinstance(x, bool) and 1 <= x <= maximum
            for x in value) and len(set(value)) == len(value):
        return tuple(sorted(value))
    raise SpecError(r.at(key), f"got {show_value(value)}; accepted: an integer from 1 to "
                               f"{maximum} ({meaning}), a list of them such as [1, 2], "
                               f"or search")


def _training(data) -> TrainingSpec:
    r = MappingReader(data, "training", ("global_batch_size", "precision", "activation_checkpointing",
                                   "zero_stage", "memory_headroom", "framework_overhead",
                                   "optimizer", "attention", "sequence_parallel",
                                   "virtual_pipeline_stages", "backend", "context_parallel",
                                   "expert_parallel", "objective", "pipeline_p2p",
                                   "finetune", "overlap_grad_reduce", "tp_comm_overlap",
                                   "overlap_p2p_comm",
                                   "grad_reduce_in_fp32", "cpu_offload_layers",
                                   "moe_sync_free", "moe_a2a_overlap", "recompute_modules",
                                   "cross_entropy", "moe_dispatcher"))
    # what is not fixed is searched: ZeRO, recomputation, sequence parallelism and (Megatron-LM)
    # virtual stages, as NeMo's auto-configurator does, and (Megatron-LM) context parallelism,
    # which NeMo's tries only where told (its context_parallel_sizes default to [1])
    backend = r.choice("backend", BACKENDS, "deepspeed")
    ckpt = r.raw("activation_checkpointing", "search")
    modes = ("none", "selective", "full")
    if isinstance(ckpt, list) and ckpt and all(isinstance(m, str) and m in modes for m in ckpt) \
            and len(set(ckpt)) == len(ckpt):
        ckpt_modes = tuple(m for m in modes if m in ckpt)      # in the canonical order
    elif isinstance(ckpt, str) and ckpt in modes + ("search",):
        ckpt_modes = modes if ckpt == "search" else (ckpt,)
    else:
        raise SpecError(r.at("activation_checkpointing"),
                        f"got {show_value(ckpt)}; accepted: none, selective, full, search, or a "
                        f"list of some of none, selective, full (e.g. [none, full])")
    sp = r.raw("sequence_parallel", "search")
    if sp is True or sp is False:
        sequence_parallel = (sp,)
    elif sp == "search":
        sequence_parallel = (False, True)
    else:
        raise SpecError(r.at("sequence_parallel"), f"got {show_value(sp)}; accepted: true, false, "
                                                   f"search")
    vps = r.raw("virtual_pipeline_stages", "search" if backend == "megatron" else 1)
    if vps == "search":
        virtual_stages = VIRTUAL_STAGES_SEARCH
    elif isinstance(vps, int) and not isinstance(vps, bool) and 1 <= vps <= MAX_VIRTUAL_STAGES:
        virtual_stages = (vps,)
    else:
        raise SpecError(r.at("virtual_pipeline_stages"),
                        f"got {show_value(vps)}; accepted: an integer from 1 to {MAX_VIRTUAL_STAGES} "
                        f"(model chunks per pipeline stage; 1 is plain 1F1B) or search")
    context_parallel = _degrees(r, "context_parallel", "search" if backend == "megatron" else 1,
                                CONTEXT_PARALLEL_SEARCH,
                                MAX_CONTEXT_PARALLEL, "ranks each sequence is split over; 1: none")
    expert_parallel = _degrees(r, "expert_parallel", "search", EXPERT_PARALLEL_SEARCH,
                               MAX_EXPERT_PARALLEL, "ranks the experts are split over; 1: none")
    zero = r.raw("zero_stage", "search")
    if isinstance(zero, str) and zero == "search":
        # Megatron-LM has ZeRO 1 only (its distributed optimizer)
        zero_stages = (0, 1) if backend == "megatron" else (0, 1, 2, 3)
    elif isinstance(zero, int) and not isinstance(zero, bool) and 0 <= zero <= 3:
        zero_stages = (zero,)
    else:
        raise SpecError(r.at("zero_stage"), f"got {show_value(zero)}; accepted: 0, 1, 2, 3, search")
    overlap = r.flag("overlap_grad_reduce", default_means=(
        "the backend's: off under Megatron-LM and for DeepSpeed's ZeRO 0-2, on for ZeRO 3"))
    grad_fp32 = r.flag("grad_reduce_in_fp32", default_means=(
        "the backend's: fp32 under Megatron-LM with bf16, fp8 or nvfp4; the training dtype "
        "under DeepSpeed"))
    tp_overlap = r.flag("tp_comm_overlap", False)
    headroom = r.raw("memory_headroom", "5%")
    hr_path = r.at("memory_headroom")
    if isinstance(headroom, str) and headroom.strip().endswith("%"):
        try:
            headroom = float(headroom.strip()[:-1]) / 100
        except ValueError:
            raise SpecError(hr_path, f"cannot read {show_value(headroom)}; write e.g. '5%' or 0.05")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or \
            not 0 <= headroom <= 0.5:
        raise SpecError(hr_path, f"got {show_value(headroom)}; accepted: a fraction from 0 to 0.5 "
                                 f"(0% to 50%), e.g. '5%' or 0.05")
    return TrainingSpec(
        global_batch_size=r.int("global_batch_size", required=True, hi=MAX_BATCH),
        precision=r.choice("precision", PRECISIONS, "fp16"),
        activation_checkpointing=ckpt_modes,
        sequence_parallel=sequence_parallel,
        virtual_pipeline_stages=virtual_stages,
        context_parallel=context_parallel,
        expert_parallel=expert_parallel,
        zero_stage=zero_stages,
        memory_headroom=float(headroom),
        framework_overhead_bytes=parse_size(r.raw("framework_overhead", "1 GiB"),
                                            r.at("framework_overhead"), OVERHEAD_MEMORY),
        optimizer=r.choice("optimizer", ("adam",), "adam"),
        attention=r.choice("attention", ("auto", "flash", "standard"), "auto"),
        objective=r.choice("objective", OBJECTIVES, "time"),
        backend=backend,
        pipeline_p2p=r.choice("pipeline_p2p", PIPELINE_P2P, "whole"),
        finetune=r.choice("finetune", FINETUNE, "none"),
        overlap_grad_reduce=overlap,
        tp_comm_overlap=tp_overlap,
        overlap_p2p_comm=r.flag("overlap_p2p_comm", True),
        grad_reduce_in_fp32=grad_fp32,
        cpu_offload_layers=r.int("cpu_offload_layers", default=0, lo=0, hi=MAX_OFFLOAD_LAYERS),
        moe_sync_free=r.flag("moe_sync_free", False),
        moe_a2a_overlap=r.flag("moe_a2a_overlap", False),
        moe_dispatcher=r.choice("moe_dispatcher", MOE_DISPATCHERS, "alltoall"),
        recompute_modules=_recompute_modules(r),
        cross_entropy=r.choice("cross_entropy", CROSS_ENTROPY_KINDS, "native"),
    )


def _recompute_modules(r: MappingReader) -> tuple[str, ...]:
    """training.recompute_modules: a non-empty list of RECOMPUTE_MODULES without repeats (in
    their canonical order); default core_attn."""
    given = r.raw("recompute_modules", ["core_attn"])
    if isinstance(given, str):
        given = [given]
    if not (isinstance(given, list) and given and len(set(map(str, given))) == len(given)
            and all(isinstance(m, str) and m in RECOMPUTE_MODULES for m in given)):
        raise SpecError(r.at("recompute_modules"),
                        f"got {show_value(given)}; accepted: a list of some of "
                        f"{', '.join(RECOMPUTE_MODULES)} (what selective recomputation "
                        f"recomputes, e.g. [layernorm, moe_act])")
    return tuple(m for m in RECOMPUTE_MODULES if m in given)


def parse_spec(data, *, catalog: dict[str, GPU] | None = None, path: Path | None = None) -> Spec:
    """Build a Spec from already-parsed YAML data (or any Python data: nothing but SpecError or
    UsageError is raised for it)."""
    r = MappingReader(data, "", ("cluster", "model", "training", "search"))
    catalog = load_catalog() if catalog is None else catalog
    cluster = _cluster(r.raw("cluster", required=True), catalog)
    model = parse_model(r.raw("model", required=True))
    training_data = r.raw("training", required=True)
    if isinstance(training_data, dict) and "backend" not in training_data:
        # no backend named: the spec as each backend would run it (their defaults differ),
        # the first that can as `training`; an error only where none can
        trainings, notes, first_error = [], [], None
        cpu = all(g.gpu.kind == "cpu" for g in cluster.node_groups)
        for backend in BACKENDS:
            if cpu and backend == "megatron":
                notes.append("megatron: Megatron-LM's pretrain_gpt.py needs CUDA devices; on "
                             "CPU devices the trials run DeepSpeed's engine")
                continue
            try:
                trainings.append(_checked_training({**training_data, "backend": backend},
                                                   cluster, model))
            except SpecError as exc:
                first_error = first_error or exc
                notes.append(f"{backend}: {exc}")
        if not trainings:
            raise first_error
        training, others = trainings[0], tuple(trainings[1:])
    else:
        training, others, notes = _checked_training(training_data, cluster, model), (), []
        if not training.overlap_p2p_comm and training.backend != "megatron":
            raise SpecError("training.overlap_p2p_comm",
                            f"Megatron-LM's interleaved schedule's P2P overlap "
                            f"(--no-overlap-p2p-communication); training.backend "
                            f"{training.backend} has no interleaved schedule: accepted with "
                            f"backend megatron (or no backend)")
        if training.tp_comm_overlap and training.backend != "megatron":
            raise SpecError("training.tp_comm_overlap",
                            f"Megatron-LM's --tp-comm-overlap (Transformer Engine's "
                            f"userbuffers); training.backend {training.backend} has none: "
                            f"accepted with backend megatron (or no backend: the DeepSpeed "
                            f"plans then keep their collectives exposed)")
        for key in _MOE_OPTION_OFF:
            if _moe_option_set(training, key) and training.backend != "megatron":
                raise SpecError(f"training.{key}", f"a Megatron-LM MoE option; training.backend "
                                                   f"{training.backend} has none: accepted with "
                                                   f"backend megatron (or no backend)")
    if training.cross_entropy != "native":      # the head's loss kernel (Layer.cross_entropy)
        model = replace(model, layers=tuple(
            replace(x, cross_entropy=training.cross_entropy) if x.kind == "head" else x
            for x in model.layers))
    if training.moe_sync_free:      # the sync-free recipes' fused expert MLP
        model = replace(model, layers=tuple(
            replace(x, fused_experts=True) if x.is_moe else x for x in model.layers))
    return Spec(cluster=cluster, model=model, training=training,
                search=_search_limits(r.raw("search")), path=path,
                sha256=_content_hash(data), backend_given=not isinstance(training_data, dict)
                or "backend" in training_data, other_backends=others,
                backend_notes=tuple(notes))


_MOE_OPTION_OFF = {"moe_sync_free": False, "moe_a2a_overlap": False,
                   "moe_dispatcher": "alltoall"}
"""The Megatron-LM MoE options of the training section, and the value that leaves each off."""


def _moe_option_set(training: "TrainingSpec", key: str) -> bool:
    """Whether the training section asks for Megatron-LM MoE option `key` (_MOE_OPTION_OFF)."""
    return getattr(training, key) != _MOE_OPTION_OFF[key]


def _checked_training(training_data, cluster: Cluster, model: ModelSpec) -> TrainingSpec:
    """The training section, checked against the cluster and the model."""
    training = _training(training_data)
    if training.virtual_pipeline_stages == VIRTUAL_STAGES_SEARCH:
        # here: cost_models.pipeline imports numpy, which registering a command must not
        from cost_models.pipeline import interleaved_virtual_stages

        first, last = model.ends
        training = replace(training, virtual_pipeline_stages=interleaved_virtual_stages(
            model.num_layers, first=first, last=last, most=VIRTUAL_STAGES_SEARCH_MOST))
    if "precision" not in training_data and all(g.gpu.kind == "cpu"
                                                for g in cluster.node_groups):
        # CPUs have no fast half precision to train in (DeepSpeed's fp16 needs CUDA): the
        # default there is fp32, not the 0.001 TFLOP/s fp16 of the catalog's CPU entry
        training = replace(training, precision="fp32")
    if training.moe_a2a_overlap and training.precision not in ("bf16", "fp16", "fp8", "nvfp4"):
        raise SpecError("training.moe_a2a_overlap", f"megatron-core overlaps the all-to-alls in "
                                                    f"bf16 or fp16 training only (got precision "
                                                    f"{training.precision}); accepted: false")
    if training.moe_a2a_overlap and model.mtp_layers > 2:
        raise SpecError("training.moe_a2a_overlap", f"megatron-core overlaps the all-to-alls "
                                                    f"with at most one multi-token-prediction "
                                                    f"depth (model.mtp_num_layers is "
                                                    f"{model.mtp_layers // 2}); accepted: false, "
                                                    f"or mtp_num_layers 1")
    if training.backend == "megatron" and any(
            x.mlp == "quick_geglu" and not x.is_moe for x in model.layers):
        raise SpecError("model.mlp", "quick_geglu without experts: megatron-core runs GPT-OSS's "
                                     "clamped quick-GEGLU in its experts only (its dense MLP "
                                     "refuses to fuse the quick-GELU); accepted with "
                                     "num_experts, or training.backend: deepspeed")
    if training.backend == "deepspeed" and model.mtp_layers:
        raise SpecError("model.mtp_num_layers", "multi-token prediction: DeepSpeed's trials have "
                                                "no such module (megatron-core's does); "
                                                "accepted with training.backend: megatron (or no "
                                                "backend)")
    if training.backend == "deepspeed" and any(x.is_mla for x in model.layers):
        raise SpecError("model.kv_lora_rank", "multi-latent attention: the layers DeepSpeed's "
                                              "trials run have none (megatron-core's "
                                              "MLASelfAttention does); accepted with "
                                              "training.backend: megatron (or no backend)")
    for key, off in _MOE_OPTION_OFF.items():
        if _moe_option_set(training, key) and not model.num_experts:
            raise SpecError(f"training.{key}", f"the model has no experts (model.num_experts); "
                                               f"accepted: {str(off).lower()}, or a model "
                                               f"with experts")
    if training.recompute_modules != ("core_attn",):
        if "selective" not in training.activation_checkpointing:
            raise SpecError("training.recompute_modules",
                            f"what selective recomputation recomputes; activation_checkpointing "
                            f"is {'/'.join(training.activation_checkpointing)}: accepted with "
                            f"activation_checkpointing selective (or search, or a list with it)")
        if training.backend != "megatron":
            raise SpecError("training.recompute_modules",
                            f"{', '.join(training.recompute_modules)}: the {training.backend} "
                            f"trials recompute the attention core only; accepted: [core_attn], "
                            f"or training.backend: megatron")
        if "moe_act" in training.recompute_modules and not model.num_experts:
            raise SpecError("training.recompute_modules",
                            "moe_act recomputes the experts' activation: the model has no "
                            "experts (model.num_experts); accepted: core_attn, layernorm")
        if "mla_up_proj" in training.recompute_modules and not any(
                x.is_mla for x in model.layers):
            raise SpecError("training.recompute_modules",
                            "mla_up_proj recomputes multi-latent attention's up-projections: "
                            "the model has none (model.kv_lora_rank); accepted: core_attn, "
                            "layernorm" + (", moe_act" if model.num_experts else ""))
    if training.cross_entropy == "te":
        if training.backend != "megatron":
            raise SpecError("training.cross_entropy",
                            f"te is Transformer Engine's fused cross-entropy, which Megatron-LM "
                            f"runs (--cross-entropy-fusion-impl te); training.backend "
                            f"{training.backend} has none: accepted: native, or "
                            f"training.backend: megatron")
        if training.precision == "fp16":
            raise SpecError("training.cross_entropy",
                            "Transformer Engine's fused cross-entropy takes bf16 or fp32 "
                            "logits (precision fp16 makes fp16 ones): accepted: native, or "
                            "precision bf16, fp8, nvfp4 or fp32")
    blocks = sum(x.kind == "transformer" for x in model.layers)
    if training.cpu_offload_layers >= max(blocks, 1):
        raise SpecError("training.cpu_offload_layers",
                        f"got {training.cpu_offload_layers}; accepted: 0 to {max(blocks - 1, 0)} "
                        f"(fewer than the model's {blocks} transformer blocks, as megatron-core "
                        f"requires)")
    experts = model.num_experts
    if not experts:
        if training.expert_parallel != EXPERT_PARALLEL_SEARCH and training.expert_parallel != (1,):
            raise SpecError("training.expert_parallel",
                            f"{'/'.join(map(str, training.expert_parallel))}: the model has no "
                            f"experts (model.num_experts); accepted: 1")
        training = replace(training, expert_parallel=(1,))
    elif training.expert_parallel == EXPERT_PARALLEL_SEARCH:    # those that split the experts
        training = replace(training, expert_parallel=tuple(
            e for e in EXPERT_PARALLEL_SEARCH if experts % e == 0))
    if experts and training.backend == "deepspeed" and training.precision != "fp32":
        raise SpecError("training.precision", f"{training.precision} with a mixture-of-experts "
                                              f"model ({experts} experts) under the deepspeed "
                                              f"backend: its trials train experts in fp32 "
                                              f"only (DeepSpeed's bf16 and fp16 optimizers "
                                              f"would reduce their gradients over the whole "
                                              f"data-parallel group); accepted: fp32, or "
                                              f"training.backend: megatron")
    precision = training.precision
    if training.backend != "megatron" and any(x.attention_window for x in model.layers):
        raise SpecError("training.backend", f"{training.backend}: the model's sliding-window "
                                            f"attention (model.window_size) is costed and run "
                                            f"as Megatron-LM runs it; the trial program's "
                                            f"attention is full; accepted: megatron")
    if precision in NARROW_GEMM_PRECISIONS and training.backend != "megatron":
        raise SpecError("training.precision", f"{precision} is costed as Megatron-LM runs it "
                                              f"with Transformer Engine; set "
                                              f"training.backend: megatron, or use bf16")
    for g_idx, g in enumerate(cluster.node_groups):
        for need in dict.fromkeys((precision, training.storage_precision)):
            if g.gpu.peak_flops_per_s.get(need) is None:
                supported = ", ".join(p for p, v in g.gpu.peak_flops_per_s.items() if v)
                also = f" (fp8 keeps the rest in {need})" if need != precision else ""
                raise SpecError("training.precision", f"{g.gpu.name} (cluster.nodes[{g_idx}]) "
                                                      f"has no {need} support{also}; use one "
                                                      f"of {supported}")
    _check_overhead(cluster, training)
    unpriced = [i for i, g in enumerate(cluster.node_groups) if g.price_per_hour is None]
    if training.objective == "cost" and unpriced:
        raise SpecError("training.objective", f"cost needs every node group's price_per_hour "
                                              f"(cluster.nodes[{unpriced[0]}] has none); "
                                              f"accepted: time, gpu_seconds, or the prices")
    return training


def _check_overhead(cluster: Cluster, training: TrainingSpec) -> None:
    """framework_overhead must leave room on the smallest device."""
    g_idx, g = min(enumerate(cluster.node_groups), key=lambda x: x[1].gpu.memory_bytes)
    if training.framework_overhead_bytes >= g.gpu.memory_bytes:
        raise SpecError("training.framework_overhead",
                        f"{training.framework_overhead_bytes / 2**30:.4g} GiB leaves no memory on "
                        f"{g.gpu.name} (cluster.nodes[{g_idx}], "
                        f"{g.gpu.memory_bytes / 2**30:.4g} GiB); accepted: 0 B up to less than "
                        f"the smallest device memory")


def _content_hash(data) -> str:
    """SHA-256 of the spec's content, keys sorted. Called only after every value has been
    checked, so `data` holds nothing but known keys and bounded scalars (no cycle, no huge
    name): the encoding is bounded. What the results database keys trials by."""
    try:
        canonical = json.dumps(data, sort_keys=True, default=str)
    except (TypeError, ValueError, RecursionError, OverflowError) as exc:
        raise SpecError("", f"cannot hash the spec's content ({type(exc).__name__}); use plain "
                            f"mappings, lists, strings and numbers") from None
    return hashlib.sha256(canonical.encode("utf-8", "surrogatepass")).hexdigest()


FINGERPRINT_KEY = "spec_fingerprint"
"""Where a plan JSON names the spec it was made for (`spec_fingerprint`)."""
FINGERPRINT_SECTIONS = ("cluster", "model", "training")


def _as_dict(obj, memo: dict):
    """dataclasses.asdict, with each record converted once (`memo` by id): a cluster of 16,384
    devices names the same GPU record 16,384 times. The dicts of a repeated record are shared,
    so a caller that edits them edits every occurrence alike."""
    kind = type(obj)
    if kind in _PLAIN:
        return obj
    names = _FIELD_NAMES.get(kind)
    if names is None:
        import dataclasses

        names = _FIELD_NAMES[kind] = tuple(f.name for f in dataclasses.fields(kind)) \
            if dataclasses.is_dataclass(kind) else ()
    if names:
        hit = memo.get(id(obj))
        if hit is None:
            hit = memo[id(obj)] = {name: _as_dict(getattr(obj, name), memo) for name in names}
        return hit
    if isinstance(obj, (list, tuple)):
        return kind(_as_dict(x, memo) for x in obj)
    if isinstance(obj, dict):
        return {k: _as_dict(v, memo) for k, v in obj.items()}
    return obj


_PLAIN = frozenset((int, float, str, bool, type(None)))
_FIELD_NAMES: dict = {}
"""A dataclass's field names, by class (`_as_dict`); () for any other class."""


def spec_fingerprint(spec: Spec) -> dict:
    """What a plan JSON carries to name the spec it was made for: the spec's sha256 and a
    hash of each parsed section (cluster, model, training), so a plan is refused for
    another spec but not for the same spec written differently. `amp-search plan --json`
    writes it under FINGERPRINT_KEY; `launch --plan` checks it."""
    out = {"spec_sha256": spec.sha256}
    # the catalog's moe_expert_overhead counts where a Megatron-LM plan has synced experts
    synced_experts = spec.model.num_experts and any(
        s.training.backend == "megatron" and not s.training.moe_sync_free
        for s in spec.backends())
    overlapped_experts = spec.model.num_experts and any(
        s.training.backend == "megatron" and s.training.moe_a2a_overlap
        for s in spec.backends())
    for name in FINGERPRINT_SECTIONS:
        section = _as_dict(getattr(spec, name), {})
        if name == "model":
            # the Llama-family Layer fields count only where they differ from the GPT block,
            # so a GPT model hashes as it did before they existed (its plans stay valid)
            for layer in {id(x): x for x in section["layers"]}.values():
                for k in ARCH_KEYS + MOE_LAYER_FIELDS + WINDOW_LAYER_FIELDS \
                        + DROPOUT_LAYER_FIELDS + TRAINING_LAYER_FIELDS:
                    default = Layer.__dataclass_fields__[k].default
                    if k in layer and type(layer[k]) is type(default) and layer[k] == default:
                        del layer[k]
        # each GPU record once: the devices share their node group's (`_as_dict`)
        gpus = list({id(item["gpu"]): item["gpu"] for item in _gpu_items(section)}.values()) \
            if name == "cluster" else []
        if name == "cluster" and spec.training.precision != "nvfp4":
            # likewise the NVFP4 figures
            for gpu in gpus:
                gpu["peak_flops_per_s"].pop("nvfp4", None)
                gpu.pop("gemm_nvfp4_max_efficiency", None)
        if name == "cluster" and spec.training.precision != "fp8":
            # the FP8 figures count only for fp8 training, so that a plan made before the
            # catalog had them stays valid
            for gpu in gpus:
                gpu["peak_flops_per_s"].pop("fp8", None)
                gpu.pop("gemm_fp8_max_efficiency", None)
        if name == "cluster":       # what the model's error is does not change a plan
            for gpu in gpus:
                gpu.pop("prediction_error", None)
                gpu.pop("prediction_error_source", None)
                gpu.pop("prediction_error_moe", None)
                gpu.pop("prediction_error_moe_source", None)
                gpu.pop("gemm_efficiency_source", None)
                gpu.pop("host_link_source", None)
                if not spec.training.cpu_offload_layers:   # only offloading uses it
                    gpu.pop("host_link_bytes_per_s", None)
                if not synced_experts:     # only Megatron-LM's synced experts use it
                    gpu.pop("moe_expert_overhead_s", None)
                if not overlapped_experts:     # only the EP overlap uses it
                    gpu.pop("moe_a2a_overlap_share", None)
            for item in section["node_groups"]:      # how the bandwidth was written neither,
                item.pop("network_links", None)       # nor what a node costs
                item.pop("price_per_hour", None)
                if not item["nvlink_domain_gpus"]:
                    del item["nvlink_domain_gpus"]    # as before the key existed
        if name == "training" and section["finetune"] == "none":
            del section["finetune"]              # as before the key existed
        if name == "training" and section["pipeline_p2p"] == "whole":
            del section["pipeline_p2p"]          # as before the key existed
        if name == "training" and section["overlap_grad_reduce"] is None:
            del section["overlap_grad_reduce"]   # as before the key existed
        if name == "training" and not section["tp_comm_overlap"]:
            del section["tp_comm_overlap"]       # as before the key existed
        if name == "training" and section["overlap_p2p_comm"]:
            del section["overlap_p2p_comm"]      # as before the key existed
        if name == "training" and section["grad_reduce_in_fp32"] is None:
            del section["grad_reduce_in_fp32"]   # as before the key existed
        if name == "training" and not section["cpu_offload_layers"]:
            del section["cpu_offload_layers"]    # as before the key existed
        if name == "training" and not section["moe_sync_free"]:
            del section["moe_sync_free"]         # as before the key existed
        if name == "training" and not section["moe_a2a_overlap"]:
            del section["moe_a2a_overlap"]       # as before the key existed
        if name == "training" and section["moe_dispatcher"] == "alltoall":
            del section["moe_dispatcher"]        # as before the key existed
        if name == "training" and tuple(section["recompute_modules"]) == ("core_attn",):
            del section["recompute_modules"]     # as before the key existed
        if name == "training" and section["cross_entropy"] == "native":
            del section["cross_entropy"]         # as before the key existed
        if name == "training" and section["objective"] == "time":
            del section["objective"]             # as before the key existed
        if name == "training" and section["context_parallel"] == (1,):
            del section["context_parallel"]      # as before the key existed
        if name == "training" and section["expert_parallel"] == (1,):
            del section["expert_parallel"]       # (a model without experts)
        out[name] = hashlib.sha256(_section_json(section, name).encode()).hexdigest()
    return out


def _gpu_items(cluster: dict) -> list[dict]:
    """The node groups, nodes and devices of a cluster section (`_as_dict`): each names a
    GPU record under "gpu"."""
    return [item for part in ("node_groups", "nodes", "devices") for item in cluster[part]]


def _section_json(section: dict, name: str) -> str:
    """json.dumps(section, sort_keys=True, default=str), byte for byte; the cluster's GPU
    records, which every device repeats (the same dict, `_as_dict`), are written once each
    and put in place of a stand-in (a cluster of 16,384 devices: 270 ms of json.dumps
    before, 2026-11-30). The section is spent: its items hold the stand-ins after."""
    if name != "cluster":
        return json.dumps(section, sort_keys=True, default=str)
    texts: dict[int, tuple[str, str]] = {}
    for item in _gpu_items(section):
        gpu = item["gpu"]
        if isinstance(gpu, dict):
            if id(gpu) not in texts:
                texts[id(gpu)] = (f"\x00amp-search-gpu-{len(texts)}",
                                  json.dumps(gpu, sort_keys=True, default=str))
            item["gpu"] = texts[id(gpu)][0]
    text = json.dumps(section, sort_keys=True, default=str)
    for stand_in, gpu_text in texts.values():
        text = text.replace(json.dumps(stand_in), gpu_text)
    return text


def load_spec(path: str | os.PathLike) -> Spec:
    """Read and validate a YAML spec file. Raises SpecError / UsageError with one clear line.

    The file goes through `yaml_io` (at most 1 MiB; UTF-8 or UTF-16 with a BOM; nesting, alias
    and duplicate-key checks), then `parse_spec` checks every value."""
    p = Path(path)
    data = load_yaml_file(p, what="spec file")
    if data is None:
        raise SpecError("", f"{show_path(p)}: the spec is empty; it needs cluster, model and "
                            f"training")
    return parse_spec(data, path=p)
