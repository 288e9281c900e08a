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
wrote it as its NICs ('8 x 200 Gbps')."""


def _bandwidth(bytes_per_s: float) -> str:
    bits = bytes_per_s * 8 / 1e9
    return f"{bits:.4g} Gb/s" if bits < 1000 else f"{bits / 1000:.4g} Tb/s"


def _group(g) -> str:
    per_gpu = g.inter_node_bandwidth_bytes_per_s / g.gpus_per_node
    nodes = f"{g.count} node{'s' if g.count > 1 else ''} x {g.gpus_per_node} {g.gpu.name}"
    return (f"{nodes} (inside a node {g.intra_node_bandwidth_bytes_per_s / 1e9:.4g} GB/s; "
            f"network {_bandwidth(per_gpu)} per GPU)")


def _values(name: str, values, show=str) -> tuple[str, bool]:
    """'name v1/v2' and whether more than one value is searched."""
    return f"{name} {'/'.join(show(v) for v in values)}", len(values) > 1


def header_lines(spec: Spec, plan: Plan, width: int = 100) -> list[str]:
    """The header (module docstring), each line wrapped to `width` columns."""
    t = spec.training
    groups = spec.cluster.node_groups
    n = spec.cluster.num_devices
    where = f" for {spec.path}" if spec.path is not None else ""
    lines = [f"plan{where}: {n} GPUs, " + " + ".join(_group(g) for g in groups),
             f"costed as {BACKEND_NAMES.get(t.backend, t.backend)} (training.backend "
             f"{t.backend}), precision {t.precision}"
             + (" (FP8 GEMMs, BF16 elsewhere)" if t.precision == "fp8" else "")]
    zero_name = {0: "0", 1: "1 (the distributed optimizer)" if t.backend == "megatron" else "1",
                 2: "2", 3: "3"}
    knobs = [_values("ZeRO", t.zero_stage, lambda z: zero_name[z]),
             _values("recomputation", t.activation_checkpointing),
             _values("sequence parallelism", t.sequence_parallel,
                     lambda v: "on" if v else "off"),
             _values("virtual stages", t.virtual_pipeline_stages),
             _values("context parallel", t.context_parallel)] + (
        [_values("expert parallel", t.expert_parallel)] if spec.model.num_experts else [])
    searched = [f"pp x dp x tmp{' x cp' if len(t.context_parallel) > 1 else ''} over the "
                f"{n} GPUs", "mbs (every divisor of the batch per replica)"] + \
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
                 "first value of each knob; the fastest such proposal"
                 + ("" if plan.baseline is not None else " (none fits)"))
    sources = dict(x.split("=", 1) for x in plan.best.timing_sources if "=" in x)
    coefficients = sources.pop("coefficients", "uncalibrated")
    links = sources.pop("links", "nominal")
    lines.append(f"model: layer times {', '.join(f'{k} {v}' for k, v in sources.items())}; "
                 f"links {links}; coefficients {coefficients}; {plan.candidates} candidates, "
                 f"{plan.evaluated} placements costed")
    for g in groups:
        per_gpu = g.inter_node_bandwidth_bytes_per_s / g.gpus_per_node
        if g.gpu.kind == "gpu" and g.count > 1 and g.gpus_per_node > 1 and \
                not g.network_links and \
                per_gpu < NETWORK_SHARE_WARNING * g.intra_node_bandwidth_bytes_per_s:
            lines.append(f"note: the {g.gpu.name} nodes get {_bandwidth(per_gpu)} of network "
                         f"per GPU, under a tenth of their "
                         f"{g.intra_node_bandwidth_bytes_per_s / 1e9:.4g} GB/s inside a node; "
                         f"if that is one NIC's, write the node's: inter_node_bandwidth counts "
                         f"all its NICs (e.g. '8 x 400 Gbps')")
    return [w for line in lines for w in textwrap.wrap(line, width=width,
                                                          subsequent_indent="  ")]
