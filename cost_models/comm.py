"""Communication terms (AMP section 3.4, with alpha-beta latency and NIC sharing).

All sizes in bytes, bandwidths in bytes/s (one direction), times in seconds.

Every function takes numpy arrays as well as floats for sizes, bandwidths and latencies
(elementwise, broadcasting), so the planner costs all stages and layers in one call; the group
size `n` is a plain integer. The ring algorithm's factors live here once:

    t(collective, S, n) = steps(n) * alpha + bus(n) * S / B        (Lin et al. 2024, nccl-tests)

    collective       bus(n)        steps(n)
    all-reduce       2(n-1)/n      2(n-1)         AMP eq. 3
    all-gather       (n-1)/n       n-1            S: the gathered output
    reduce-scatter   (n-1)/n       n-1            S: the input
    p2p              1             1              AMP: e = v / b
"""
from __future__ import annotations

import numpy as np

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "p2p")

NCCL_RING_STEP_LATENCY_S = {"nvlink": 3.4e-6, "pcie": 5.7e-6, "network": 9.6e-6}
"""Latency of one ring step by link kind: NCCL's own tuning model (src/graph/tuning.cc, `hwLat`,
ring algorithm, Simple protocol, which large messages use), read 2026-11-22. NCCL prices a ring
collective at baseLat + steps(n) * hwLat; the catalog (profiles/gpus.yaml `link_latency`) holds
these per device type (NVLink for SXM parts, PCIe for PCIe cards; the network across nodes), and
`collective_time_s` charges steps(n) of them per message. (NCCL's 8.4 us base latency per call is
host-side launch work, which `cost_models.compute.host_time_s` counts for TP all-reduces.)"""

GRADIENT_FRAMEWORKS = ("deepspeed", "megatron")


def bus_factor(collective: str, n: int) -> float:
    """Bytes each rank moves over its link per message byte, ring algorithms (Lin et al. 2024;
    nccl-tests 'bus bandwidth'): all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n of
    the full (gathered / unscattered) buffer, point-to-point 1."""
    if collective == "p2p":
        return 1.0
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n


def latency_steps(collective: str, n: int) -> float:
    """Sequential message steps of the ring algorithm: all-reduce 2(n-1), all-gather and
    reduce-scatter n-1, point-to-point 1."""
    if collective == "p2p":
        return 1.0
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective {collective!r}; known: {', '.join(COLLECTIVES)}")
    if n <= 1:
        return 0.0
    return 2.0 * (n - 1) if collective == "all_reduce" else float(n - 1)


def sigmoid_efficiency(message_bytes, floor: float, k: float, x0: float):
    """Bandwidth efficiency in (floor, 1]: a sigmoid in log2(message bytes) (Lin et al. 2024's
    transition region); floor at small messages, 1 at large ones."""
    x = np.log2(np.maximum(np.asarray(message_bytes, dtype=float), 1.0))
    return floor + (1.0 - floor) / (1.0 + np.exp(-k * (x - x0)))


def collective_time_s(collective: str, message_bytes, n: int, bandwidth_bytes_per_s,
                      latency_s=0.0, messages=1.0):
    """`messages` ring collectives of `message_bytes` in all over `n` ranks:
    messages * steps(n) * latency + bus(n) * bytes / bandwidth."""
    return (messages * latency_steps(collective, n) * latency_s
            + bus_factor(collective, n) * message_bytes / bandwidth_bytes_per_s)


def collectives_by_kind(collectives) -> dict[str, tuple[float, int]]:
    """{kind: (elements in all, calls)} of records with `.kind` and `.elements` (e.g.
    cost_models.layers.TpCollective): what `collectives_time_s` needs, and what a planner
    vectorises over layers."""
    out: dict[str, tuple[float, int]] = {}
    for c in collectives:
        if c.kind not in COLLECTIVES:
            raise ValueError(f"unknown collective {c.kind!r}; known: {', '.join(COLLECTIVES)}")
        e, k = out.get(c.kind, (0.0, 0))
        out[c.kind] = (e + float(c.elements), k + 1)
    return out


def collectives_time_s(by_kind: dict, n: int, bandwidth_bytes_per_s, latency_s=0.0,
                       bytes_per_element=1.0):
    """Ring collectives one after another: the sum over kinds of `collective_time_s` of the
    kind's bytes (elements x `bytes_per_element`, which may be an array or carry a
    micro-batch factor) and its number of calls. `by_kind`: {kind: (elements, calls)}, the
    values floats or arrays (broadcast elementwise)."""
    total = 0.0
    for kind, (elements, calls) in by_kind.items():
        total = total + collective_time_s(kind, np.asarray(elements, dtype=float)
                                          * bytes_per_element, n, bandwidth_bytes_per_s,
                                          latency_s, messages=np.asarray(calls, dtype=float))
    return total


def allreduce_time_s(message_bytes, n: int, bandwidth_bytes_per_s, latency_s=0.0,
                     messages=1.0):
    """Ring all-reduce, AMP eq. 3: 2(n-1)M / (nB), plus 2(n-1) latencies per message."""
    return collective_time_s("all_reduce", message_bytes, n, bandwidth_bytes_per_s, latency_s,
                             messages)


def allgather_time_s(message_bytes, n: int, bandwidth_bytes_per_s, latency_s=0.0):
    """Ring all-gather of a full message of M bytes: (n-1)M / (nB), plus n-1 latencies."""
    return collective_time_s("all_gather", message_bytes, n, bandwidth_bytes_per_s, latency_s)


def reduce_scatter_time_s(message_bytes, n: int, bandwidth_bytes_per_s, latency_s=0.0):
    """Ring reduce-scatter of an input of M bytes: (n-1)M / (nB), plus n-1 latencies."""
    return collective_time_s("reduce_scatter", message_bytes, n, bandwidth_bytes_per_s,
                             latency_s)


def p2p_time_s(message_bytes, bandwidth_bytes_per_s, latency_s=0.0):
    """Point-to-point send between pipeline stages, AMP: e = v / b (plus one latency)."""
    return collective_time_s("p2p", message_bytes, 1, bandwidth_bytes_per_s, latency_s)


def stage_boundary_time_s(activation_bytes, bandwidth_bytes_per_s, latency_s=0.0):
    """AMP eq. 5's e_i for one micro-batch crossing a stage boundary: the activation forward
    and its gradient backward, one P2P each."""
    return 2.0 * p2p_time_s(activation_bytes, bandwidth_bytes_per_s, latency_s)


def context_parallel_ring_time_s(kv_bytes, cp: int, core_s, bandwidth_bytes_per_s,
                                 latency_s=0.0, *, backward: bool = False):
    """The exposed time of one pass of one layer's context-parallel ring (Megatron-LM's
    default cp_comm_type p2p, ring attention): cp - 1 steps, each sending this rank's K/V
    chunk (`kv_bytes`, both directions of the ring at once) to the next rank while the
    attention core runs on the chunk it holds, so each step hides up to core_s / cp of it.
    The backward passes the K/V and their gradients: twice the bytes per step, against the
    backward core (core_s is the pass's own core time). Arrays broadcast."""
    if cp <= 1:
        return 0.0
    step = p2p_time_s(kv_bytes * (2.0 if backward else 1.0), bandwidth_bytes_per_s, latency_s)
    return (cp - 1) * np.maximum(step - np.asarray(core_s) / cp, 0.0)


def all_to_all_time_s(message_bytes, seconds_per_byte, latency_s=0.0, messages=1.0):
    """`messages` all-to-alls, each rank holding `message_bytes` for the others (1/n of it to
    each member, sent at once): bytes x the group's seconds per byte of message (its links,
    amp_search.costing.links.all_to_all_links) plus one latency each (the n-1 sends are
    posted together)."""
    return messages * (latency_s + message_bytes * seconds_per_byte)


def node_hit_probability(experts: int, topk: int, experts_on_node):
    """The chance that a token routed to `topk` distinct experts of `experts`, uniformly (the
    force-balanced routing the benchmarks run), picks at least one of the `experts_on_node`
    a node holds: 1 - C(E - e, k) / C(E, k), as the product over the k draws of
    (E - e - i) / (E - i). `experts_on_node` may be an array (and fractional: E m / n for a
    node holding m of the group's n ranks)."""
    e = np.asarray(experts_on_node, dtype=float)
    miss = np.ones_like(e)
    for i in range(int(topk)):
        miss = miss * np.clip((experts - e - i) / (experts - i), 0.0, 1.0)
    return 1.0 - miss


def hierarchical_shares(same_node, experts: int, topk: int):
    """(NVLink, network) share of each rank's dispatch message (its tokens' k copies, h each)
    that a hierarchical dispatcher (DeepEP, Hybrid-EP) moves, for groups whose ranks sit on
    nodes as `same_node` says ([..., n, n] booleans: ranks i and j share a node). Over the
    network, one copy per token for each other node that one of its experts is on
    (`node_hit_probability`, the node holding E m / n experts for its m ranks): 1 / k of the
    message each, not one copy per expert there. Over NVLink, every copy that is not for
    itself, once: its own node's directly and, for the nodes whose tokens it receives, their
    copies for its node's other ranks, forwarded: (m - 1) / m of the message for a rank with m
    group members on its node (an all-to-all moves (m - 1) / n). [..., n] each."""
    same = np.asarray(same_node, dtype=bool)
    n = same.shape[-1]
    local = same.sum(axis=-1).astype(float)                            # m of each rank
    # each remote node j contributes P(hit j) once: 1/m_j from each of its m_j ranks
    per_member = node_hit_probability(experts, topk, experts * local / n) / local
    remote_hits = ((~same) * per_member[..., None, :]).sum(axis=-1)
    return (local - 1.0) / local, remote_hits / topk


def expert_dispatch_bytes(tokens, topk: int, hidden: int, bytes_per_element: float):
    """One rank's message in one dispatch all-to-all of a mixture-of-experts layer: each of
    its tokens goes to k experts, h elements each (BF16 even under FP8, which Megatron-LM
    dispatches unquantised by default), with its router weight (megatron-core's alltoall
    dispatcher sends the permuted probabilities beside the tokens: the experts apply them;
    counted at the element size)."""
    return tokens * topk * (hidden + 1) * bytes_per_element


def expert_combine_bytes(tokens, topk: int, hidden: int, bytes_per_element: float):
    """One rank's message in one combine all-to-all: its tokens' k expert outputs back, h
    elements each."""
    return tokens * topk * hidden * bytes_per_element


def boundary_shards(tmp: int, *, framework: str, sequence_parallel: bool,
                    scatter_gather: bool = False) -> int:
    """How many ways the activation (and its gradient) crossing a pipeline stage boundary is
    split over the tensor group, each tensor rank sending its part to its peer: under
    sequence parallelism its [s/t, b, h] shard (both frameworks); without it DeepSpeed's
    pipeline engine partitions it over the tensor group too (PipelineEngine's
    pipe_partitioned and grad_partitioned, on by default with tensor parallelism:
    PartitionedTensor), while megatron-core sends the whole tensor from every rank, and
    Megatron-LM before it 1/t (`scatter_gather`: --scatter-gather-tensors-in-pipeline,
    split_tensor_into_1d_equal_chunks, on by default there)."""
    if framework not in GRADIENT_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(GRADIENT_FRAMEWORKS)}")
    if tmp > 1 and (sequence_parallel or framework == "deepspeed" or scatter_gather):
        return tmp
    return 1


def boundary_gathers(tmp: int, *, framework: str, sequence_parallel: bool,
                     scatter_gather: bool = False) -> tuple[int, int]:
    """(receiving stage, sending stage): all-gathers of the whole boundary activation over
    the tensor group per micro-batch, where it is split (`boundary_shards`) without sequence
    parallelism. DeepSpeed (PartitionedTensor.full): the receiver rebuilds its input before
    the forward; the sender rebuilds its own output before the backward, then the gradient it
    receives: (1, 2). Megatron-LM with `scatter_gather` (gather_split_1d_tensor after each
    receive): the receiver its input, the sender the gradient it receives: (1, 1). (0, 0)
    elsewhere (sequence parallelism's shards are what the next layer takes)."""
    if tmp > 1 and framework == "deepspeed" and not sequence_parallel:
        return 1, 2
    if tmp > 1 and scatter_gather and not sequence_parallel:
        return 1, 1
    return 0, 0


def fsdp_unit_times_s(param_bytes, grad_bytes, n: int, bandwidth_bytes_per_s, latency_s=0.0):
    """(forward, backward) traffic of one Megatron-FSDP unit (one layer) in one micro-batch
    over the n data-parallel ranks (--data-parallel-sharding-strategy optim_grads_params, the
    ZeRO-3 of Megatron-LM): the forward all-gathers the unit's weights; the backward
    all-gathers them again and reduce-scatters their gradients (Rajbhandari et al. 2020: 1.5x
    the data of an all-reduce). With --overlap-param-gather and --overlap-grad-reduce each
    runs beside a neighbouring unit's compute, so a layer's pass takes the longer of its
    compute and this (amp_search.costing.CostModel.stage_costs)."""
    gather = allgather_time_s(param_bytes, n, bandwidth_bytes_per_s, latency_s)
    return gather, gather + reduce_scatter_time_s(grad_bytes, n, bandwidth_bytes_per_s,
                                                  latency_s)


def link_latency_s(crosses_nodes, intra_s, inter_s):
    """Per-message (per ring step) latency of a ring or P2P link: the inter-node latency where
    it crosses nodes, else the intra-node one (arrays broadcast elementwise)."""
    return np.where(crosses_nodes, inter_s, intra_s)


def gradient_reduce_bytes_per_element(precision: str, *, framework: str = "deepspeed",
                                      fp32_allreduce: bool | None = None) -> int:
    """Bytes per gradient element of the data-parallel reduction, as the framework issues it.

    - fp32 training: 4.
    - DeepSpeed (the trial backend here; `engine.communication_data_type`): the training
      precision (fp16 / bf16: 2), also with BF16_Optimizer, whose fp32 gradient accumulators
      are cast to bf16 for the all-reduce; fp32 only with `fp32_allreduce: true` (or
      `communication_data_type: fp32`).
    - Megatron-LM (local DDP): fp32 when gradients are accumulated in fp32
      (`--accumulate-allreduce-grads-in-fp32`, off by default, forced on with bf16), else the
      training precision. `fp32_allreduce` stands for that flag here (megatron-core's
      grad_reduce_in_fp32; False keeps bf16 gradients in bf16, as Megatron-Bridge's
      performance recipes do).
    `fp32_allreduce` None: the framework's default.
    """
    if framework not in GRADIENT_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(GRADIENT_FRAMEWORKS)}")
    if precision == "fp32" or fp32_allreduce:
        return 4
    if framework == "megatron" and precision in ("bf16", "fp8", "nvfp4") \
            and fp32_allreduce is None:
        return 4
    if precision in ("fp16", "bf16", "fp8", "nvfp4"):
        return 2
    raise ValueError(f"precision {precision!r}; known: fp32, fp16, bf16")


def gradient_reduce_overlaps_backward(*, framework: str = "deepspeed", zero_stage: int = 0,
                                      overlap_comm: bool | None = None) -> bool:
    """Whether the framework reduces gradient buckets while the backward pass still runs.

    - DeepSpeed: ZeRO 0 all-reduces after the backward of the accumulation boundary
      (`engine.allreduce_gradients`), never overlapped; ZeRO 1/2 overlap with `overlap_comm`
      (default false), ZeRO 3 by default (`overlap_comm` default true for stage 3).
    - Megatron-LM: with `--overlap-grad-reduce` (off by default; the vTrain data's version
      has no gradient bucketing at all: benchmarks/data/README.md).
    `overlap_comm` None: the framework's default."""
    if framework not in GRADIENT_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(GRADIENT_FRAMEWORKS)}")
    if framework == "deepspeed" and zero_stage == 0:
        return False
    if overlap_comm is not None:
        return bool(overlap_comm)
    return framework == "deepspeed" and zero_stage == 3


def shared_bandwidth(link_bytes_per_s, flows):
    """Fair sharing (Proteus): k flows that cross the same NIC at once get B/k each."""
    return link_bytes_per_s / np.maximum(flows, 1)


DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (zero_optimization; also the element count of
the ZeRO-0 ``allreduce_gradients`` buffers): 5e8 elements."""
MEGATRON_BUCKET_MIN_PARAMS = 40_000_000
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000
"""megatron-core's default gradient bucket with --overlap-grad-reduce
(DistributedDataParallelConfig.bucket_size None): max(40,000,000, 1,000,000 x the dp x cp
ranks) parameters, "larger DP sizes need larger buckets to ensure collectives do not become
latency-bound"; without the overlap, one bucket."""


def gradient_bucket_elements(framework: str, data_parallel_ranks: int) -> int:
    """The framework's default gradient bucket in elements: DeepSpeed's reduce_bucket_size,
    megatron-core's max(4e7, 1e6 x dp x cp)."""
    if framework == "megatron":
        return max(MEGATRON_BUCKET_MIN_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK
                   * int(data_parallel_ranks))
    return DEEPSPEED_REDUCE_BUCKET_ELEMENTS


def gradient_reduce_time_s(*, grad_bytes, n: int, bandwidth_bytes_per_s, latency_s,
                           zero_stage: int, gas: int, framework: str = "deepspeed"):
    """The gradient reduction's part of `data_parallel_sync_time_s`, the part a reduction
    overlapped with the backward can hide (the weights' all-gather after the step waits for
    the step): the all-reduce of ZeRO 0; the reduce-scatter of ZeRO 1 (Megatron-LM's
    distributed optimizer, and DeepSpeed's, whose all-reduce volume is a reduce-scatter then
    the weights' all-gather, as the simulator plays it); DeepSpeed's ZeRO 2 reduce-scatter of
    every micro-batch; 0 for ZeRO 3, whose per-layer traffic the closed form charges whole
    (the simulator overlaps it layer by layer)."""
    if framework not in GRADIENT_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(GRADIENT_FRAMEWORKS)}")
    if n <= 1 or zero_stage == 3:
        return 0.0 * (grad_bytes + latency_s + bandwidth_bytes_per_s)
    bw, lat = bandwidth_bytes_per_s, latency_s
    if zero_stage == 1:
        return reduce_scatter_time_s(grad_bytes, n, bw, lat)
    if zero_stage == 2:
        return gas * reduce_scatter_time_s(grad_bytes, n, bw, lat)
    return allreduce_time_s(grad_bytes, n, bw, lat)


def data_parallel_sync_time_s(*, param_bytes, grad_bytes, n: int, bandwidth_bytes_per_s,
                              latency_s, zero_stage: int, gas: int,
                              gather_weights_after_step: bool = False,
                              framework: str = "deepspeed"):
    """Data-parallel traffic of one iteration for one device, by ZeRO stage (Rajbhandari et
    al. 2020, section 7: stages 0-2 move 2(n-1)/n of the model per iteration, stage 3 1.5x),
    as DeepSpeed 0.19.8 issues it:

    - 0: one ring all-reduce of the gradients at the accumulation boundary (AMP eq. 3), plus an
         all-gather of the updated weights when the optimizer partitions its fp32 master copy
         (`gather_weights_after_step`: DeepSpeed's BF16_Optimizer, bf16 without ZeRO);
    - 1: reduce-scatter of the gradients + all-gather of the updated weights (same volume);
    - 2: gradients reduce-scattered in every micro-batch's backward (DeepSpeed reduces the
         gradient partitions as they are produced), weights all-gathered once after the step;
    - 3: weights all-gathered in every micro-batch's forward and again in its backward, and
         gradients reduce-scattered in every backward.

    Megatron-LM (`framework` "megatron"): stage 0 all-reduces the gradient buffer; stage 1 is
    its distributed optimizer, which reduce-scatters the gradient buffer (in the gradient
    dtype, `grad_bytes`) and, after the step, all-gathers the updated weights (in the
    parameter dtype, `param_bytes`) -- the same ring volume as the all-reduce when the two
    dtypes agree (Megatron Core user guide, "Distributed Optimizer"); it has no stage 2/3.

    Linear in the bytes: the planner takes its value at 0 (the latencies) and its slope.
    """
    if framework not in GRADIENT_FRAMEWORKS:
        raise ValueError(f"framework {framework!r}; known: {', '.join(GRADIENT_FRAMEWORKS)}")
    if framework == "megatron" and zero_stage not in (0, 1):
        raise ValueError(f"Megatron-LM has no ZeRO stage {zero_stage}; accepted: 0, 1")
    if n <= 1:
        return 0.0 * (param_bytes + grad_bytes + latency_s + bandwidth_bytes_per_s)
    bw, lat = bandwidth_bytes_per_s, latency_s
    if framework == "megatron":
        if zero_stage == 1:
            return reduce_scatter_time_s(grad_bytes, n, bw, lat) \
                + allgather_time_s(param_bytes, n, bw, lat)
        return allreduce_time_s(grad_bytes, n, bw, lat)
    if zero_stage in (0, 1):
        gather = allgather_time_s(param_bytes, n, bw, lat) \
            if zero_stage == 0 and gather_weights_after_step else 0.0
        return allreduce_time_s(grad_bytes, n, bw, lat) + gather
    if zero_stage == 2:
        return gas * reduce_scatter_time_s(grad_bytes, n, bw, lat) \
            + allgather_time_s(param_bytes, n, bw, lat)
    if zero_stage == 3:
        return gas * (2 * allgather_time_s(param_bytes, n, bw, lat)
                      + reduce_scatter_time_s(grad_bytes, n, bw, lat))
    raise ValueError(f"zero_stage must be 0-3, got {zero_stage}")
