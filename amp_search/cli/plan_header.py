"""The lines `amp-search plan` prints before its table: what the plan is for and what it
searched, so that the table can be read without the spec beside it.

    plan for SPEC: 64 GPUs, 8 nodes x 8 H100-80GB (NVLink 450 GB/s, network 400 Gb/s per GPU)
    costed as Megatron-LM (training.backend megatron), bf16
    searched: pp x dp x tmp over the 64 GPUs, mbs ..., recomputation none/selective/full, ...
    fixed: ZeRO 1 (the distributed optimizer), virtual stages 1, context parallel 1
    baseline ('megatron' row): ...
    model: analytic layer times ...; coefficients uncalibrated

Each line is wrapped to `width` (the terminal's).
"""
from __future__ import annotations

import textwrap

from ..records import Plan
from ..spec import Spec

BACKEND_NAMES = {"megatron": "Megatron-LM", "deepspeed": "DeepSpeed's pipeline engine"}
NETWORK_SHARE_WARNING = 0.1
"""Warn where a GPU's share of its node's network is below this fraction of its link inside
the node (a data-centre node written with one NIC's bandwidth, not the node's), unless the spec
wrote it as its NICs ('8 x 200 Gbps') or the node's figure is more than one NIC carries."""
ONE_NIC_MAX_BITS_PER_S = 800e9
"""The fastest single network adapter (ConnectX-8, 800 Gb/s): a node's network written as more
than this is the node's, not one NIC's (a GB200 NVL72 rack's 72 x 400 Gb/s), and gets no
NETWORK_SHARE_WARNING."""


def _bandwidth(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8 / 1e9
    return f"{bits:.4g} Gb/s" if bits < 1000 else f"{bits / 1000:.4g} Tb/s"


def _over(link) -> str:
    """' nvlink 82%': the link kind and the share of it collectives reach ('' where the figure
    written is measured)."""
    if link.name == "measured":
        return ""
    return f" {link.name} {link.achievable_share:.0%}"


def _group(g, one_node: bool = False) -> str:
    """'4 nodes x 8 A100-80GB (inside a node 300 GB/s nvlink 82%; network 200 Gb/s per GPU
    infiniband 96%)': the bandwidths as written, their link kinds and the share of each that
    collectives reach; a cluster of one node has no network to show. Nodes that an NVLink
    domain joins say so: '64 nodes x 4 GB200-186GB in NVLink domains of 64 (inside a domain
    ...)'."""
    per_gpu = g.inter_node_bandwidth_bytes_per_s / g.gpus_per_node
    nodes = f"{g.count} node{'s' if g.count > 1 else ''} x {g.gpus_per_node} {g.gpu.name}"
    inside = "a node"
    if g.nvlink_domain_gpus > g.gpus_per_node:
        nodes += f" in NVLink domains of {g.nvlink_domain_gpus}"
        inside = "a domain"
    unit = "device" if g.gpu.kind == "cpu" else "GPU"
    return (f"{nodes} (inside {inside} {g.intra_node_bandwidth_bytes_per_s / 1e9:.4g} GB/s"
            + _over(g.intra_node_link)
            + ("" if one_node else f"; network {_bandwidth(per_gpu)} per {unit}"
               + _over(g.inter_node_link)) + ")")


def _knobs(spec: Spec) -> list[tuple[str, str, bool]]:
    """(knob, its values, whether more than one is searched) for each searched knob."""
    t = spec.training
    megatron = t.backend == "megatron"
    zero_name = {0: "0", 1: "1 (the distributed optimizer)" if megatron else "1",
                 2: "2", 3: "3 (Megatron-FSDP)" if megatron else "3"}
    chunks = t.virtual_pipeline_stages
    knobs = [("ZeRO", t.zero_stage, lambda z: zero_name[z], ""),
             ("recomputation", t.activation_checkpointing, str, ""),
             ("sequence parallelism", t.sequence_parallel, lambda v: "on" if v else "off", ""),
             ("virtual stages", chunks, str,
              _uneven_chunks_note(spec) if megatron and len(chunks) > 1 else ""),
             ("context parallel", t.context_parallel, str, "")] + (
        [("expert parallel", t.expert_parallel, str, "")] if spec.model.num_experts else [])
    return [(name, "/".join(show(v) for v in values) + note, len(values) > 1)
            for name, values, show, note in knobs]


def _uneven_chunks_note(spec: Spec) -> str:
    """How the virtual stages of a model whose blocks split evenly on no pipeline
    (DeepSeek-V3 with its multi-token prediction: 61 blocks) are chunked; '' for others."""
    from cost_models.pipeline import needs_uneven_chunks

    first, last = spec.model.ends
    if not needs_uneven_chunks(spec.model.num_layers, first=first, last=last):
        return ""
    blocks = spec.model.num_layers - first - last
    return (f" (uneven chunks: its {blocks} blocks split evenly on no pipeline; each chunk as "
            f"even as whole blocks make it by FLOPs, Megatron-LM's "
            f"--pipeline-model-parallel-layout)")


def _backend_line(spec: Spec, plan: Plan) -> str:
    t = spec.for_backend(plan.backends[0]).training if plan.backends else spec.training
    tail = f"precision {t.precision}" + (" (FP8 GEMMs, BF16 elsewhere)"
                                         if t.precision == "fp8" else
                                         " (NVFP4 GEMMs, BF16 elsewhere)"
                                         if t.precision == "nvfp4" else "")
    if t.finetune == "lora":
        tail += ", LoRA fine-tuning (the weights frozen; the adapters not costed)"
    if t.tp_comm_overlap and t.backend == "megatron":
        tail += (", tensor-parallel communication beside the GEMMs with sequence parallelism "
                 "(training.tp_comm_overlap)")
    if not t.overlap_p2p_comm and t.backend == "megatron":
        tail += (", the interleaved schedule's P2P waited for in every micro-batch "
                 "(training.overlap_p2p_comm: false)")
    if t.cpu_offload_layers:
        tail += (f", the first {t.cpu_offload_layers} blocks' activations offloaded to host "
                 f"memory (training.cpu_offload_layers)")
    if spec.model.num_experts and "megatron" in (plan.backends or (t.backend,)):
        gpus = {g.gpu.name: g.gpu for g in spec.cluster.node_groups}.values()
        moe = spec.for_backend("megatron").training
        tail += (", MoE layers sync-free (training.moe_sync_free)" if moe.moe_sync_free else
                 ", MoE layers synced with the host by Megatron-LM's dropless dispatcher: "
                 + "/".join(sorted({f"{g.moe_expert_overhead_s * 1e6:.0f} us" for g in gpus}))
                 + " per local expert and micro-batch (the catalog's moe_expert_overhead; "
                 "training.moe_sync_free: true where it runs them sync-free)")
        if moe.moe_a2a_overlap:
            hidden = min(g.moe_a2a_overlap_share for g in gpus)
            tail += (f", {hidden:.0%} of their all-to-alls hidden beside another micro-batch "
                     f"with pp 1 or virtual stages and no full recomputation "
                     f"(training.moe_a2a_overlap)")
        if moe.moe_dispatcher != "alltoall":
            tail += (f", tokens dispatched hierarchically by {moe.moe_dispatcher}: once over the "
                     f"network to each node their experts are on, then over NVLink "
                     f"(training.moe_dispatcher)")
    if t.cross_entropy == "te":
        tail += ", Transformer Engine's fused cross-entropy (training.cross_entropy)"
    if t.overlap_grad_reduce is not None:
        tail += (", gradients reduced in buckets during the backward"
                 if t.overlap_grad_reduce else ", gradients reduced after the backward") \
            + " (training.overlap_grad_reduce)"
    if len(plan.backends) > 1:
        names = " and as ".join(BACKEND_NAMES.get(b, b) for b in plan.backends)
        return (f"costed as {names} (training.backend not given: each planned, the backend "
                f"column says which), {tail}")
    line = f"costed as {BACKEND_NAMES.get(t.backend, t.backend)} (training.backend " + (
        f"{t.backend}" if spec.backend_given else f"not given: {t.backend}") + f"), {tail}"
    notes = plan.backend_notes or spec.backend_notes
    return line + (f"; not planned: {'; '.join(notes)}" if notes and not spec.backend_given
                   else "")


def header_lines(spec: Spec, plan: Plan, width: int = 100) -> list[str]:
    """The header (module docstring), each line wrapped to `width` columns."""
    groups = spec.cluster.node_groups
    n = spec.cluster.num_devices
    where = f" for {spec.path}" if spec.path is not None else ""
    cpu = all(g.gpu.kind == "cpu" for g in groups)
    one_node = len(spec.cluster.nodes) == 1
    lines = [f"plan{where}: {n} {'devices' if cpu else 'GPUs'}, "
             + " + ".join(_group(g, one_node) for g in groups),
             _backend_line(spec, plan)]
    specs = [spec.for_backend(b) for b in plan.backends] or [spec]
    per_backend = [_knobs(s) for s in specs]
    knobs = []
    for i, (name, _, _) in enumerate(per_backend[0]):
        values = [k[i] for k in per_backend]
        if len({v for _, v, _ in values}) == 1:
            knobs.append((f"{name} {values[0][1]}", values[0][2]))
        else:                   # the backends' defaults differ
            knobs.append((f"{name} " + ", ".join(f"{v} under {s.training.backend}"
                                                 for (_, v, _), s in zip(values, specs)),
                          any(many for _, _, many in values)))
    context = any(len(s.training.context_parallel) > 1 for s in specs)
    searched = [f"pp x dp x tmp{' x cp' if context else ''} over the "
                f"{n} {'devices' if cpu else 'GPUs'}", "mbs (every divisor of the batch per replica)"] + \
        [text for text, many in knobs if many]
    fixed = [text for text, many in knobs if not many]
    limits = spec.search.describe()
    lines.append("searched: " + ", ".join(searched)
                 + (f"; within the spec's search limits: {limits}" if limits else ""))
    if fixed:
        lines.append("fixed by the spec or its defaults: " + ", ".join(fixed)
                     + " (a spec key set to 'search' searches it)")
    lines.append("baseline ('megatron' row, 'vs Megatron' column): Megatron-LM's usual layout, "
                 "as AMP's paper proposes it: tensor parallelism inside a node, the smallest "
                 "tmp x pp whose uniform layer split fits, the nodes as listed, the spec's "
                 "first value of each knob"
                 + ("; with experts, each searched ep whose groups stay inside a node (ep 1 "
                    "too)" if spec.model.num_experts else "")
                 + "; the fastest such proposal"
                 + ("" if plan.baseline is not None else " (none fits)")
                 + (f", costed as {BACKEND_NAMES.get(plan.baseline.backend)}"
                    if plan.baseline is not None and len(plan.backends) > 1 else ""))
    sources = dict(x.split("=", 1) for x in plan.best.timing_sources if "=" in x)
    coefficients = sources.pop("coefficients", "uncalibrated")
    links = sources.pop("links", "spec")
    if links == "spec":
        links = "the spec's x their kinds' shares"
    lines.append(f"model: layer times {', '.join(f'{k} {v}' for k, v in sources.items())}; "
                 f"links {links}; coefficients {coefficients}; {plan.candidates} candidates, "
                 f"{plan.evaluated} placements costed")
    for g in groups:
        per_gpu = g.inter_node_bandwidth_bytes_per_s / g.gpus_per_node
        if g.gpu.kind == "gpu" and g.count > 1 and g.gpus_per_node > 1 and \
                not g.network_links and \
                g.inter_node_bandwidth_bytes_per_s * 8 <= ONE_NIC_MAX_BITS_PER_S and \
                per_gpu < NETWORK_SHARE_WARNING * g.intra_node_bandwidth_bytes_per_s:
            lines.append(f"note: the {g.gpu.name} nodes get {_bandwidth(per_gpu)} of network "
                         f"per GPU, under a tenth of their "
                         f"{g.intra_node_bandwidth_bytes_per_s / 1e9:.4g} GB/s inside a node; "
                         f"if that is one NIC's, write the node's: inter_node_bandwidth counts "
                         f"all its NICs (e.g. '8 x 400 Gbps')")
    return [w for line in lines for w in textwrap.wrap(line, width=width,
                                                          subsequent_indent="  ")]
