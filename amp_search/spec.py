"""The YAML spec, parsed once at the edge into frozen dataclasses (style.md, habit 2).

    spec.yaml --load_spec--> Spec(cluster: Cluster, model: ModelSpec, training: TrainingSpec)

Every problem is reported as a SpecError naming the key path and what is accepted. The file is
read by `yaml_io` (size, encoding, nesting, alias and duplicate-key limits); `parse_spec` then
checks every value, and accepts any Python data without raising anything but SpecError or
UsageError. Accepted ranges (inclusive):

    cluster.nodes[i].count                    1 to 1,000,000 nodes (1,000,000 devices in all)
    cluster.nodes[i].gpus_per_node            1 to 1,024
    cluster.nodes[i].intra/inter_node_bandwidth   1 Mbps to 100 TB/s; inter_node_bandwidth may
        be left out when the cluster has one node in all: it is never used then, and the
        record holds the node's intra_node_bandwidth as a placeholder
    gpu.memory                                64 MiB to 64 TiB
    gpu.memory_bandwidth                      1 GB/s to 100 TB/s
    gpu.peak_tflops.<precision>               0.001 to 100,000 TFLOP/s, or null (unsupported)
    names (model, layer, GPU)                 1 to 128 printable characters
    model sizes                               see the MAX_* caps below; heads >= 1
    training.memory_headroom                  0% to 50%
    training.framework_overhead               0 B up to less than the smallest device memory
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
import reprlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cost_models.layers import MLP_KINDS, NORM_KINDS, POSITION_EMBEDDINGS, Layer

from .errors import SpecError, UsageError
from .hosts import validate_hostname
from .resources import catalog_path, models_path
from .units import (DEVICE_MEMORY, FIXED_COST_TIME, GEMM_SIZE, MEMORY_BANDWIDTH,
                    NETWORK_BANDWIDTH, OVERHEAD_MEMORY, parse_bandwidth, parse_duration,
                    parse_flops, parse_size)
from .yaml_io import load_yaml_file, show_path

PRECISIONS = ("fp32", "fp16", "bf16")
BACKENDS = ("deepspeed", "megatron")
"""training.backend: the framework a plan is costed for."""
MODEL_PRESETS = ("llama3-8b", "llama3-70b", "llama3.1-405b", "qwen3-8b", "qwen3-32b")
"""Named models (profiles/models.yaml): `model: {preset: NAME, seq_length: ...}` takes every
size from there; any size key the spec gives overrides it."""
PRESETS = ("gpt", "bert", "layers") + MODEL_PRESETS
# sanity caps: absurd values are rejected, not attempted
MAX_LAYERS = 10_000
MAX_WIDTH = 1_000_000
MAX_SEQ = 10_000_000
MAX_VOCAB = 10_000_000
MAX_DEVICES = 1_000_000
MAX_BATCH = 65_536  # a larger batch makes the simulated re-rank run for minutes
MAX_GPUS_PER_NODE = 1024
MIN_TFLOPS, MAX_TFLOPS = 0.001, 100_000.0
MAX_NAME_CHARS = 128
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
    kernel_floor_s: float = 0.0
    """Device time of one block pass at least (its many small kernels)."""
    host_block_pass_s: float = 0.0
    """Host time to issue one block pass of one micro-batch (framework, launches)."""
    host_tp_allreduce_per_rank_s: float = 0.0
    """Host time of one tensor-parallel all-reduce per extra rank."""
    flash_attention: bool = True
    """Whether the usual training stacks run a fused attention kernel on it (training.attention:
    auto then costs flash attention, else the standard one that stores the scores)."""
    link_latency_intra_s: float = 0.0
    """Latency of one ring step of a collective (or one P2P message) between two of its devices
    inside a node (NVLink or PCIe: cost_models.comm.NCCL_RING_STEP_LATENCY_S)."""
    link_latency_inter_s: float = 0.0
    """The same across nodes (the network)."""


@dataclass(frozen=True, kw_only=True)
class NodeGroup:
    gpu: GPU
    count: int
    gpus_per_node: int
    intra_node_bandwidth_bytes_per_s: float
    """GPU-to-GPU inside the node, one direction."""
    inter_node_bandwidth_bytes_per_s: float
    """The node's total network bandwidth (all NICs), one direction."""
    hosts: tuple[str, ...] = ()
    """Hostnames of the `count` nodes, for launching (optional)."""


@dataclass(frozen=True, kw_only=True)
class Node:
    id: int
    group: int
    gpu: GPU
    devices: tuple[int, ...]
    intra_node_bandwidth_bytes_per_s: float
    inter_node_bandwidth_bytes_per_s: float
    host: str | None = None


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

    @classmethod
    def from_groups(cls, groups: tuple[NodeGroup, ...]) -> "Cluster":
        nodes, devices = [], []
        for g_idx, g in enumerate(groups):
            for k in range(g.count):
                ids = tuple(range(len(devices), len(devices) + g.gpus_per_node))
                node = Node(id=len(nodes), group=g_idx, gpu=g.gpu, devices=ids,
                            intra_node_bandwidth_bytes_per_s=g.intra_node_bandwidth_bytes_per_s,
                            inter_node_bandwidth_bytes_per_s=g.inter_node_bandwidth_bytes_per_s,
                            host=g.hosts[k] if g.hosts else None)
                nodes.append(node)
                devices += [Device(id=i, node=node.id, local_rank=r, gpu=g.gpu)
                            for r, i in enumerate(ids)]
        return cls(node_groups=tuple(groups), nodes=tuple(nodes), devices=tuple(devices))


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    preset: str
    """gpt | bert | layers | a named model (MODEL_PRESETS: a GPT chain of its sizes)"""
    layers: tuple[Layer, ...]
    """The full chain the pipeline splits: embedding, blocks, head (for the presets)."""
    num_attention_heads: int
    """Heads of every attention layer (tmp must divide it); 0 if there is no attention."""

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    @property
    def tp_divisors(self) -> tuple[int, ...]:
        """Sizes every tensor-parallel degree must divide (heads, key/value groups, widths).
        The vocabulary is padded to a multiple of 128 x tmp instead, as Megatron-LM does
        (cost_models.layers.padded_vocab_size)."""
        sizes = set()
        for layer in self.layers:
            if layer.kind == "transformer":
                sizes |= {layer.num_attention_heads, layer.ffn_hidden_size, layer.hidden_size}
                if layer.num_query_groups:      # Megatron-LM: tp | num_query_groups
                    sizes.add(layer.num_query_groups)
            elif layer.kind == "mlp":
                sizes |= {layer.ffn_hidden_size}
        return tuple(sorted(sizes))

    @property
    def vocab_size(self) -> int:
        """The vocabulary of the embedding or head (0 if the model has neither)."""
        return next((l.vocab_size for l in self.layers if l.kind in ("embedding", "head")), 0)


MAX_VIRTUAL_STAGES = 64
"""The largest training.virtual_pipeline_stages accepted (each chunk needs a layer per stage)."""
VIRTUAL_STAGES_SEARCH = (1, 2, 3, 4, 6, 8)
"""The model chunks per stage `virtual_pipeline_stages: search` tries; the search space's rules
keep those that split the transformer blocks evenly (search_space.chunks_split_blocks)."""


@dataclass(frozen=True, kw_only=True)
class TrainingSpec:
    global_batch_size: int
    precision: str
    activation_checkpointing: tuple[str, ...]
    """Recomputation modes to search, from none | selective | full (`search`: all three; a
    list names some of them)."""
    zero_stage: tuple[int, ...]
    """Values to search: one stage, or 0-3 for `search`."""
    memory_headroom: float = 0.05
    """Fraction of each device's memory kept free."""
    framework_overhead_bytes: int = 1 << 30
    """Fixed per-device memory (CUDA context, allocator, communication buffers)."""
    optimizer: str = "adam"
    attention: str = "auto"
    """flash | standard | auto (each device type's catalog `flash_attention`)."""
    sequence_parallel: tuple[bool, ...] = (False,)
    """Values to search: (False,), (True,) or (False, True) for `search`. Default false: it is
    what the trial engine (DeepSpeed's pipeline over megatron-core layers) and AMP's paper
    run, and it needs tmp > 1 and a sequence divisible by tmp; `search` adds it where it wins."""
    virtual_pipeline_stages: tuple[int, ...] = (1,)
    """Model chunks per pipeline stage to search: (1,) plain 1F1B (the default), (v,) for a
    given v, or VIRTUAL_STAGES_SEARCH for `search` (v > 1: Megatron-LM's interleaved 1F1B)."""
    backend: str = "deepspeed"
    """The training framework the plan is for (BACKENDS): deepspeed (the trial program) or
    megatron (Megatron-LM: zero_stage 1 is its distributed optimizer, ZeRO 2/3 do not
    exist there)."""

    @property
    def bytes_per_element(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True, kw_only=True)
class Spec:
    cluster: Cluster
    model: ModelSpec
    training: TrainingSpec
    path: Path | None = None
    sha256: str = ""
    """Hash of the parsed spec content (what the results database keys trials by)."""

    def attention_for(self, gpu: GPU) -> str:
        """The attention implementation the model runs on `gpu`: 'flash' (a fused kernel that
        stores no scores) or 'standard' (training.attention; auto follows the catalog)."""
        if self.training.attention != "auto":
            return self.training.attention
        return "flash" if gpu.flash_attention else "standard"


# ----------------------------------------------------------------------------- helpers

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 2


def _show(v) -> str:
    """A short, one-line rendering of any user value for a message."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 200:
        return f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    try:
        text = _REPR.repr(v)
    except Exception:   # noqa: BLE001 - a library caller's object with a broken __repr__
        text = f"<{type(v).__name__}>"
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,60}$")


def _key(k) -> str:
    """A mapping key as it appears in a key path: as written if plain, else quoted."""
    return k if isinstance(k, str) and _PLAIN_KEY.match(k) else _show(k)


def _name(v, path: str, default: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name (or other short text): a string or integer of 1 to `limit` printable characters."""
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() <= 64:
        v = str(v)
    if not isinstance(v, str) or not 0 < len(v) <= limit or not v.isprintable():
        raise SpecError(path, f"expected text of 1 to {limit} printable characters, got "
                              f"{_show(v) if isinstance(v, str) else type(v).__name__}")
    return v


def _number(v, path: str, lo: float, hi: float, what: str) -> float:
    """A finite int or float in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(path, f"expected a number ({what}), got {_show(v)}; accepted: "
                              f"{lo:g} to {hi:,g}")
    if not (math.isfinite(v) if isinstance(v, float) else True) or not lo <= v <= hi:
        raise SpecError(path, f"{_show(v)} is out of range; accepted: {lo:g} to {hi:,g} "
                              f"({what})")
    return float(v)


class _Reader:
    """Typed access to a YAML mapping that reports the key path on every error and rejects
    unknown keys with the list of valid ones."""

    def __init__(self, data, path: str, allowed: tuple[str, ...]):
        if not isinstance(data, dict):
            raise SpecError(path or "<top>", f"expected a mapping with keys {', '.join(allowed)};"
                                             f" got {type(data).__name__}")
        unknown = [k for k in data if not isinstance(k, str) or k not in allowed]
        if unknown:
            where = f"{path}.{_key(unknown[0])}" if path else _key(unknown[0])
            raise SpecError(where, f"unknown key; valid keys here: {', '.join(allowed)}")
        self.data, self.path = data, path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default=None, required: bool = False):
        if key not in self.data or self.data[key] is None:
            if required:
                raise SpecError(self.at(key), "required key is missing")
            return default
        return self.data[key]

    def int(self, key: str, default=None, *, lo: int = 1, hi: int, required=False) -> int:
        v = self.raw(key, default, required)
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecError(self.at(key), f"expected an integer in [{lo}, {hi}], got {_show(v)}")
        if not lo <= v <= hi:
            raise SpecError(self.at(key), f"{_show(v)} is out of range; accepted: {lo} to {hi}")
        return v

    def choice(self, key: str, options: tuple, default=None):
        v = self.raw(key, default, default is None)
        if not isinstance(v, (str, int)) or isinstance(v, bool) or v not in options:
            raise SpecError(self.at(key), f"got {_show(v)}; accepted: "
                                          f"{', '.join(map(str, options))}")
        return v


def _read_catalog(path: Path | None) -> tuple[Path, dict, dict]:
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
    return path, gpus, defaults


def load_catalog(path: Path | None = None) -> dict[str, GPU]:
    """The GPU catalog: name -> GPU (default: the one the package ships). Read through the
    same front door as a spec, and every entry checked as an inline GPU is; the analytic
    model's keys an entry lacks come from the catalog's `defaults:`."""
    path, gpus, defaults = _read_catalog(path)
    catalog = {}
    for name, entry in gpus.items():
        name = _name(name, f"catalog.{_key(name)}", "")
        catalog[name] = _gpu(entry, name, f"catalog.{name}", defaults)
    return catalog


@lru_cache(maxsize=1)
def catalog_defaults() -> dict:
    """The packaged catalog's `defaults:` (what an inline GPU of a spec falls back on)."""
    return _read_catalog(None)[2]


GPU_MODEL_KEYS = ("gemm_efficiency", "kernel_floor", "host_time", "flash_attention",
                  "link_latency")
"""Keys of a catalog entry (or inline GPU) for the analytic model; missing ones come from the
catalog's `defaults:`."""


def _gpu(entry, name: str, path: str, defaults: dict | None = None) -> GPU:
    """A GPU from a catalog entry or an inline mapping; `name` is the default name; the
    analytic model's keys default to `defaults` (the catalog's `defaults:` mapping)."""
    r = _Reader(entry, path, ("name", "kind", "memory", "memory_bandwidth", "peak_tflops",
                              "source") + GPU_MODEL_KEYS)
    peak = r.raw("peak_tflops", required=True)
    if not isinstance(peak, dict) or not peak:
        raise SpecError(r.at("peak_tflops"), "expected a mapping precision -> TFLOP/s, "
                                             "e.g. {fp32: 15.7, fp16: 125}")
    bad = [k for k in peak if not isinstance(k, str) or k not in PRECISIONS]
    if bad:
        raise SpecError(f"{r.at('peak_tflops')}.{_key(bad[0])}", f"unknown precision; accepted: "
                                                                f"{', '.join(PRECISIONS)}")
    flops = {}
    for p in PRECISIONS:
        v = peak.get(p)
        flops[p] = None if v is None else _number(
            v, f"{r.at('peak_tflops')}.{p}", MIN_TFLOPS, MAX_TFLOPS,
            "dense TFLOP/s; null where the precision is unsupported") * 1e12
    model = _gpu_model(r, defaults if defaults is not None else catalog_defaults())
    return GPU(name=_name(r.raw("name"), r.at("name"), name),
               kind=r.choice("kind", ("gpu", "cpu"), "gpu"),
               memory_bytes=parse_size(r.raw("memory", required=True), r.at("memory"),
                                       DEVICE_MEMORY),
               memory_bandwidth_bytes_per_s=parse_bandwidth(
                   r.raw("memory_bandwidth", required=True), r.at("memory_bandwidth"),
                   MEMORY_BANDWIDTH),
               peak_flops_per_s=flops,
               source=_name(r.raw("source"), r.at("source"), "", MAX_SOURCE_CHARS), **model)


def _gpu_model(r: "_Reader", defaults: dict) -> dict:
    """The GPU record's analytic-model fields from an entry's keys, else the defaults':

        gemm_efficiency: {max: 0.8, half_at: 2 GFLOP}
        kernel_floor: 450 us
        host_time: {block_pass: 1100 us, tp_allreduce_per_rank: 20 us}
        flash_attention: true
        link_latency: {intra: 3.4 us, inter: 9.6 us}
    """
    def get(key):
        return r.raw(key) if r.has(key) else defaults.get(key)

    out = {}
    gemm = get("gemm_efficiency")
    if gemm is not None:
        g = _Reader(gemm, r.at("gemm_efficiency"), ("max", "half_at"))
        out["gemm_max_efficiency"] = _number(g.raw("max", required=True), g.at("max"), 0.01,
                                             1.0, "fraction of dense peak")
        out["gemm_half_flops"] = parse_flops(g.raw("half_at", required=True), g.at("half_at"),
                                             GEMM_SIZE)
    floor = get("kernel_floor")
    if floor is not None:
        out["kernel_floor_s"] = parse_duration(floor, r.at("kernel_floor"), FIXED_COST_TIME)
    host = get("host_time")
    if host is not None:
        h = _Reader(host, r.at("host_time"), ("block_pass", "tp_allreduce_per_rank"))
        out["host_block_pass_s"] = parse_duration(h.raw("block_pass", required=True),
                                                  h.at("block_pass"), FIXED_COST_TIME)
        out["host_tp_allreduce_per_rank_s"] = parse_duration(
            h.raw("tp_allreduce_per_rank", required=True), h.at("tp_allreduce_per_rank"),
            FIXED_COST_TIME)
    flash = get("flash_attention")
    if flash is not None:
        if not isinstance(flash, bool):
            raise SpecError(r.at("flash_attention"), f"got {_show(flash)}; accepted: true, "
                                                     f"false")
        out["flash_attention"] = flash
    lat = get("link_latency")
    if lat is not None:
        k = _Reader(lat, r.at("link_latency"), ("intra", "inter"))
        out["link_latency_intra_s"] = parse_duration(k.raw("intra", required=True),
                                                     k.at("intra"), FIXED_COST_TIME)
        out["link_latency_inter_s"] = parse_duration(k.raw("inter", required=True),
                                                     k.at("inter"), FIXED_COST_TIME)
    return out


def _cluster(data, catalog: dict[str, GPU]) -> Cluster:
    """The node groups. inter_node_bandwidth is required unless the cluster has one node in
    all; then the planner never uses it and the group's intra_node_bandwidth stands in."""
    r = _Reader(data, "cluster", ("nodes",))
    nodes = r.raw("nodes", required=True)
    if not isinstance(nodes, list) or not nodes:
        raise SpecError("cluster.nodes", "expected a non-empty list of node groups")
    fields = []
    total = 0
    for i, entry in enumerate(nodes):
        path = f"cluster.nodes[{i}]"
        n = _Reader(entry, path, ("gpu", "count", "gpus_per_node", "intra_node_bandwidth",
                                  "inter_node_bandwidth", "hosts"))
        gpu_v = n.raw("gpu", required=True)
        if isinstance(gpu_v, dict):
            gpu = _gpu(gpu_v, f"custom-{i}", n.at("gpu"))
        elif isinstance(gpu_v, str) and gpu_v in catalog:
            gpu = catalog[gpu_v]
        else:
            raise SpecError(n.at("gpu"), f"unknown GPU {_show(gpu_v)}; known: {', '.join(catalog)} "
                                         f"(or define one inline: {{name, memory, "
                                         f"memory_bandwidth, peak_tflops}})")
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
        inter = None
        if n.has("inter_node_bandwidth"):
            inter = parse_bandwidth(n.raw("inter_node_bandwidth"), n.at("inter_node_bandwidth"),
                                    NETWORK_BANDWIDTH)
        fields.append(dict(gpu=gpu, count=count, gpus_per_node=per,
                           intra_node_bandwidth_bytes_per_s=intra,
                           inter_node_bandwidth_bytes_per_s=inter, hosts=tuple(hosts)))
    num_nodes = sum(f["count"] for f in fields)
    for i, f in enumerate(fields):
        if f["inter_node_bandwidth_bytes_per_s"] is None:
            if num_nodes > 1:
                raise SpecError(f"cluster.nodes[{i}].inter_node_bandwidth",
                                f"required key is missing (the cluster has {num_nodes} nodes; "
                                f"it may be left out only for a single node), e.g. '100 Gbps'")
            f["inter_node_bandwidth_bytes_per_s"] = f["intra_node_bandwidth_bytes_per_s"]
    return Cluster.from_groups(tuple(NodeGroup(**f) for f in fields))


_ARCH_KEYS = ("num_query_groups", "head_dim", "mlp", "norm", "bias", "position_embedding",
              "tie_embeddings")
"""The Llama-family keys (cost_models.layers.Layer's fields of the same names); absent, a
model is the GPT block of before: MHA, head_dim h/a, GELU, LayerNorm, biases, learned
positions, untied head."""
_MODEL_KEYS = ("preset", "num_layers", "hidden_size", "num_attention_heads", "seq_length",
               "vocab_size", "ffn_hidden_size", "layers", "name") + _ARCH_KEYS
_LAYER_KEYS = ("kind", "count", "hidden_size", "num_attention_heads", "ffn_hidden_size",
               "vocab_size", "forward_flops", "params", "output_elements", "name") + _ARCH_KEYS
_LAYER_ARCH = {"embedding": ("position_embedding", "tie_embeddings"),
               "transformer": ("num_query_groups", "head_dim", "mlp", "norm", "bias",
                               "position_embedding"),
               "mlp": ("mlp", "norm", "bias"),
               "head": ("norm", "bias", "tie_embeddings"),
               "custom": ()}
"""The Llama-family keys each kind of layer takes (preset: layers)."""


@lru_cache(maxsize=1)
def _named_models() -> tuple[dict, dict]:
    """profiles/models.yaml: (name -> model-section keys, name -> why it is refused)."""
    path = models_path()
    data = load_yaml_file(path, what="named models")
    models = data.get("models") if isinstance(data, dict) else None
    refused = (data.get("not_modelled") or {}) if isinstance(data, dict) else None
    if not isinstance(models, dict) or not isinstance(refused, dict):
        raise UsageError(f"named models {show_path(path)}: expected 'models: {{NAME: {{model "
                         f"keys}}}}' and 'not_modelled: {{NAME: reason}}'")
    return models, refused


def named_model(name: str) -> dict:
    """The model-section keys of a named model (MODEL_PRESETS) from profiles/models.yaml."""
    entry = _named_models()[0].get(name)
    if name not in MODEL_PRESETS or not isinstance(entry, dict):
        raise UsageError(f"named models {show_path(models_path())}: no model {name!r}; "
                         f"known: {', '.join(MODEL_PRESETS)}")
    return dict(entry)


def _heads_divide(path: str, hidden: int, heads: int, note: str = "") -> None:
    if hidden % heads:
        raise SpecError(path, f"num_attention_heads ({heads}) must divide hidden_size "
                              f"({hidden}); try one of "
                              f"{', '.join(str(d) for d in _divisors(hidden) if d <= 256)}"
                              f", or give head_dim{note}")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0] if n <= 1 << 20 else [1]


def _flag(r: _Reader, key: str, default: bool) -> bool:
    v = r.raw(key, default)
    if v is not True and v is not False:
        raise SpecError(r.at(key), f"got {_show(v)}; accepted: true, false")
    return v


def swiglu_ffn_hidden_size(hidden: int) -> int:
    """Megatron-LM's default MLP width with --swiglu (megatron/training/arguments.py):
    int((4h * 2/3) / 64) * 64, about the parameters of a 4h GELU MLP in three matrices."""
    return int((4 * hidden * 2 / 3) / 64) * 64


def _ffn(r: _Reader, h: int, mlp: str, note: str = "") -> int:
    """ffn_hidden_size: given, else 4h (gelu) or Megatron-LM's swiglu default."""
    default = 4 * h if mlp == "gelu" else swiglu_ffn_hidden_size(h)
    if not default and not r.has("ffn_hidden_size"):
        raise SpecError(r.at("ffn_hidden_size"), f"required key is missing: mlp: swiglu with "
                                                 f"hidden_size {h} has no default (Megatron-"
                                                 f"LM's int(8h/3 / 64) * 64 is 0){note}")
    return r.int("ffn_hidden_size", default, hi=4 * MAX_WIDTH)


def _attention(r: _Reader, h: int, a: int, note=lambda k: "") -> dict:
    """num_query_groups and head_dim as Layer fields (0: the MHA default, h / a); a must
    divide h unless head_dim is given (as Megatron-LM's --kv-channels)."""
    d = r.int("head_dim", hi=MAX_WIDTH) if r.has("head_dim") else 0
    if not d:
        _heads_divide(r.at("num_attention_heads"), h, a, note("hidden_size"))
    elif h % a == 0 and d == h // a:
        d = 0                                       # the default, written out
    g = 0
    if r.has("num_query_groups"):
        g = r.int("num_query_groups", hi=MAX_WIDTH)
        if a % g:
            raise SpecError(r.at("num_query_groups"),
                            f"{g} must divide num_attention_heads ({a}); accepted: "
                            f"{', '.join(str(x) for x in _divisors(a) if x <= 256)}"
                            f"{note('num_query_groups')}")
        g = 0 if g == a else g                      # one group per head: MHA
    return {"num_query_groups": g, "head_dim": d}


def _gpt_model(r: _Reader, preset: str, seq: int, given: frozenset | None) -> ModelSpec:
    """preset gpt, bert or a named model (`given`: the keys the spec itself wrote)."""
    def note(key: str) -> str:
        if given is None or key in given:
            return ""
        return f" ({key} from preset {preset}; any size key given overrides the preset's)"

    if r.has("layers"):
        raise SpecError(r.at("layers"), f"only for preset: layers (this model is {preset})")
    L = r.int("num_layers", required=True, hi=MAX_LAYERS)
    h = r.int("hidden_size", required=True, hi=MAX_WIDTH)
    a = r.int("num_attention_heads", required=True, hi=MAX_WIDTH)
    v = r.int("vocab_size", required=True, hi=MAX_VOCAB)
    mlp = r.choice("mlp", MLP_KINDS, "gelu")
    f = _ffn(r, h, mlp)
    attention = _attention(r, h, a, note)
    norm = r.choice("norm", NORM_KINDS, "layernorm")
    bias = _flag(r, "bias", True)
    pos = r.choice("position_embedding", POSITION_EMBEDDINGS, "learned")
    tied = _flag(r, "tie_embeddings", False)
    block = Layer(kind="transformer", seq_length=seq, hidden_size=h, num_attention_heads=a,
                  ffn_hidden_size=f, **attention, mlp=mlp, norm=norm, bias=bias,
                  position_embedding=pos)
    layers = ((Layer(kind="embedding", seq_length=seq, hidden_size=h, vocab_size=v,
                     position_embedding=pos, tie_embeddings=tied, name="embedding"),)
              + tuple(Layer(**{**block.__dict__, "name": f"block{i}"}) for i in range(L))
              + (Layer(kind="head", seq_length=seq, hidden_size=h, vocab_size=v, norm=norm,
                       bias=bias, tie_embeddings=tied, name="head"),))
    return ModelSpec(preset=preset, layers=layers, num_attention_heads=a)


def _model(data) -> ModelSpec:
    r = _Reader(data, "model", _MODEL_KEYS)
    asked = r.raw("preset")
    if isinstance(asked, str) and asked not in PRESETS:
        reason = _named_models()[1].get(asked)
        if isinstance(reason, str):
            raise SpecError(r.at("preset"), f"{asked}: {reason}; accepted: "
                                            f"{', '.join(PRESETS)}")
    preset = r.choice("preset", PRESETS)
    given = None
    if preset in MODEL_PRESETS:
        given = frozenset(k for k in data if data[k] is not None)
        r = _Reader({**named_model(preset), **{k: data[k] for k in given}}, "model",
                    _MODEL_KEYS)
    _name(r.raw("name"), r.at("name"), "")
    seq = r.int("seq_length", required=True, hi=MAX_SEQ)
    if preset != "layers":
        return _gpt_model(r, preset, seq, given)
    for k in ("num_layers", "hidden_size", "num_attention_heads", "vocab_size",
              "ffn_hidden_size") + _ARCH_KEYS:
        if r.has(k):
            raise SpecError(r.at(k), "not used with preset: layers; give sizes per layer "
                                     "in model.layers")
    items = r.raw("layers", required=True)
    if not isinstance(items, list) or not items:
        raise SpecError("model.layers", "expected a non-empty list of layers")
    layers: list[Layer] = []
    heads: set[int] = set()
    prev_width = 0
    pos_default = "learned"         # blocks follow the position embedding before them
    tied_at: list[tuple[str, Layer]] = []
    for i, item in enumerate(items):
        lr = _Reader(item, f"model.layers[{i}]", _LAYER_KEYS)
        kind = lr.choice("kind", ("embedding", "transformer", "mlp", "head", "custom"))
        count = lr.int("count", 1, hi=MAX_LAYERS)
        if len(layers) + count > MAX_LAYERS:
            raise SpecError(lr.at("count"), f"more than {MAX_LAYERS} layers in all")
        name = _name(lr.raw("name"), lr.at("name"), kind)
        needs = {"embedding": ("hidden_size", "vocab_size"),
                 "transformer": ("hidden_size", "num_attention_heads"),
                 "mlp": ("hidden_size",), "head": ("hidden_size", "vocab_size"),
                 "custom": ("forward_flops", "params", "output_elements")}[kind]
        for k in _LAYER_KEYS[2:9]:
            if lr.has(k) and k not in needs and k != "ffn_hidden_size":
                raise SpecError(lr.at(k), f"not used by a {kind} layer; it takes: "
                                          f"{', '.join(needs)}")
        for k in _ARCH_KEYS:
            if lr.has(k) and k not in _LAYER_ARCH[kind]:
                takes = ", ".join(_LAYER_ARCH[kind]) or "none of the architecture keys"
                raise SpecError(lr.at(k), f"not used by a {kind} layer; it takes: {takes}")
        for k in needs:
            lr.raw(k, required=True)
        if kind == "custom":
            flops = lr.raw("forward_flops")
            if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not \
                    0 <= flops <= 1e18:
                raise SpecError(lr.at("forward_flops"), f"got {_show(flops)}; expected forward "
                                                        f"FLOPs per sample, a number in "
                                                        f"[0, 1e18]")
            base = Layer(kind="custom", seq_length=seq, custom_forward_flops=float(flops),
                         custom_params=lr.int("params", lo=0, hi=10**13),
                         custom_output_elements=lr.int("output_elements", hi=10**12))
            width = 0
        else:
            h = lr.int("hidden_size", hi=MAX_WIDTH)
            a = lr.int("num_attention_heads", hi=MAX_WIDTH) if kind == "transformer" else 0
            arch: dict = {}
            if kind in ("transformer", "mlp"):
                arch["mlp"] = lr.choice("mlp", MLP_KINDS, "gelu")
            if kind == "transformer":
                arch |= _attention(lr, h, a)
                heads.add(a)
            if kind in ("transformer", "mlp", "head"):
                arch["norm"] = lr.choice("norm", NORM_KINDS, "layernorm")
                arch["bias"] = _flag(lr, "bias", True)
            if kind in ("embedding", "transformer"):
                arch["position_embedding"] = lr.choice("position_embedding",
                                                       POSITION_EMBEDDINGS, pos_default)
                if kind == "embedding":
                    pos_default = arch["position_embedding"]
            if kind in ("embedding", "head"):
                arch["tie_embeddings"] = _flag(lr, "tie_embeddings", False)
            f = _ffn(lr, h, arch["mlp"]) if kind in ("transformer", "mlp") else 0
            if lr.has("ffn_hidden_size") and kind not in ("transformer", "mlp"):
                raise SpecError(lr.at("ffn_hidden_size"), f"not used by a {kind} layer")
            v = lr.int("vocab_size", hi=MAX_VOCAB) if kind in ("embedding", "head") else 0
            in_h = prev_width if kind in ("transformer", "mlp") and prev_width and \
                prev_width != h else 0
            base = Layer(kind=kind, seq_length=seq, hidden_size=h, num_attention_heads=a,
                         ffn_hidden_size=f, vocab_size=v, input_hidden_size=in_h, **arch)
            width = h
            if kind in ("embedding", "head"):
                tied_at.append((lr.at("tie_embeddings"), base))
        for c in range(count):
            # only the first of a run of same-width layers carries the input projection
            extra = {"input_hidden_size": 0} if c else {}
            layers.append(Layer(**{**base.__dict__, **extra,
                                   "name": f"{name}{c}" if count > 1 else name}))
        prev_width = width
    _check_tied(tied_at, layers)
    return ModelSpec(preset="layers", layers=tuple(layers),
                     num_attention_heads=math.gcd(*heads) if heads else 0)


def _check_tied(tied_at: list[tuple[str, Layer]], layers: list[Layer]) -> None:
    """tie_embeddings (preset: layers): one embedding and one head, both tied, of one shape."""
    tied = [(path, x) for path, x in tied_at if x.tie_embeddings]
    if not tied:
        return
    kinds = [x.kind for x in layers]
    emb = [x for x in layers if x.kind == "embedding"]
    head = [x for x in layers if x.kind == "head"]
    if kinds.count("embedding") != 1 or kinds.count("head") != 1 or len(tied) != 2 or \
            (emb[0].vocab_size, emb[0].hidden_size) != (head[0].vocab_size,
                                                        head[0].hidden_size):
        raise SpecError(tied[0][0], "tie_embeddings: true needs one embedding and one head "
                                    "layer, both with tie_embeddings: true and the same "
                                    "vocab_size and hidden_size")


def _training(data) -> TrainingSpec:
    r = _Reader(data, "training", ("global_batch_size", "precision", "activation_checkpointing",
                                   "zero_stage", "memory_headroom", "framework_overhead",
                                   "optimizer", "attention", "sequence_parallel",
                                   "virtual_pipeline_stages", "backend"))
    ckpt = r.raw("activation_checkpointing", "none")
    modes = ("none", "selective", "full")
    if isinstance(ckpt, list) and ckpt and all(isinstance(m, str) and m in modes for m in ckpt) \
            and len(set(ckpt)) == len(ckpt):
        ckpt_modes = tuple(m for m in modes if m in ckpt)      # in the canonical order
    elif isinstance(ckpt, str) and ckpt in modes + ("search",):
        ckpt_modes = modes if ckpt == "search" else (ckpt,)
    else:
        raise SpecError(r.at("activation_checkpointing"),
                        f"got {_show(ckpt)}; accepted: none, selective, full, search, or a "
                        f"list of some of none, selective, full (e.g. [none, full])")
    sp = r.raw("sequence_parallel", False)
    if sp is True or sp is False:
        sequence_parallel = (sp,)
    elif sp == "search":
        sequence_parallel = (False, True)
    else:
        raise SpecError(r.at("sequence_parallel"), f"got {_show(sp)}; accepted: true, false, "
                                                   f"search")
    vps = r.raw("virtual_pipeline_stages", 1)
    if vps == "search":
        virtual_stages = VIRTUAL_STAGES_SEARCH
    elif isinstance(vps, int) and not isinstance(vps, bool) and 1 <= vps <= MAX_VIRTUAL_STAGES:
        virtual_stages = (vps,)
    else:
        raise SpecError(r.at("virtual_pipeline_stages"),
                        f"got {_show(vps)}; accepted: an integer from 1 to {MAX_VIRTUAL_STAGES} "
                        f"(model chunks per pipeline stage; 1 is plain 1F1B) or search")
    zero = r.raw("zero_stage", 0)
    if isinstance(zero, str) and zero == "search":
        zero_stages = (0, 1, 2, 3)
    elif isinstance(zero, int) and not isinstance(zero, bool) and 0 <= zero <= 3:
        zero_stages = (zero,)
    else:
        raise SpecError(r.at("zero_stage"), f"got {_show(zero)}; accepted: 0, 1, 2, 3, search")
    headroom = r.raw("memory_headroom", "5%")
    hr_path = r.at("memory_headroom")
    if isinstance(headroom, str) and headroom.strip().endswith("%"):
        try:
            headroom = float(headroom.strip()[:-1]) / 100
        except ValueError:
            raise SpecError(hr_path, f"cannot read {_show(headroom)}; write e.g. '5%' or 0.05")
    if isinstance(headroom, bool) or not isinstance(headroom, (int, float)) or \
            not 0 <= headroom <= 0.5:
        raise SpecError(hr_path, f"got {_show(headroom)}; accepted: a fraction from 0 to 0.5 "
                                 f"(0% to 50%), e.g. '5%' or 0.05")
    return TrainingSpec(
        global_batch_size=r.int("global_batch_size", required=True, hi=MAX_BATCH),
        precision=r.choice("precision", PRECISIONS, "fp16"),
        activation_checkpointing=ckpt_modes,
        sequence_parallel=sequence_parallel,
        virtual_pipeline_stages=virtual_stages,
        zero_stage=zero_stages,
        memory_headroom=float(headroom),
        framework_overhead_bytes=parse_size(r.raw("framework_overhead", "1 GiB"),
                                            r.at("framework_overhead"), OVERHEAD_MEMORY),
        optimizer=r.choice("optimizer", ("adam",), "adam"),
        attention=r.choice("attention", ("auto", "flash", "standard"), "auto"),
        backend=r.choice("backend", BACKENDS, "deepspeed"),
    )


def parse_spec(data, *, catalog: dict[str, GPU] | None = None, path: Path | None = None) -> Spec:
    """Build a Spec from already-parsed YAML data (or any Python data: nothing but SpecError or
    UsageError is raised for it)."""
    r = _Reader(data, "", ("cluster", "model", "training"))
    catalog = load_catalog() if catalog is None else catalog
    cluster = _cluster(r.raw("cluster", required=True), catalog)
    model = _model(r.raw("model", required=True))
    training = _training(r.raw("training", required=True))
    precision = training.precision
    for g_idx, g in enumerate(cluster.node_groups):
        if g.gpu.peak_flops_per_s.get(precision) is None:
            supported = ", ".join(p for p, v in g.gpu.peak_flops_per_s.items() if v)
            raise SpecError("training.precision", f"{g.gpu.name} (cluster.nodes[{g_idx}]) has "
                                                  f"no {precision} support; use one of "
                                                  f"{supported}")
    _check_overhead(cluster, training)
    return Spec(cluster=cluster, model=model, training=training, path=path,
                sha256=_content_hash(data))


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


def spec_fingerprint(spec: Spec) -> dict:
    """What a plan JSON carries to name the spec it was made for: the spec's sha256 and a
    hash of each parsed section (cluster, model, training), so a plan is refused for
    another spec but not for the same spec written differently. `amp-search plan --json`
    writes it under FINGERPRINT_KEY; `launch --plan` checks it."""
    import dataclasses

    out = {"spec_sha256": spec.sha256}
    for name in FINGERPRINT_SECTIONS:
        section = dataclasses.asdict(getattr(spec, name))
        if name == "model":
            # the Llama-family Layer fields count only where they differ from the GPT block,
            # so a GPT model hashes as it did before they existed (its plans stay valid)
            for layer in section["layers"]:
                for k in _ARCH_KEYS:
                    default = Layer.__dataclass_fields__[k].default
                    if type(layer[k]) is type(default) and layer[k] == default:
                        del layer[k]
        text = json.dumps(section, sort_keys=True, default=str)
        out[name] = hashlib.sha256(text.encode()).hexdigest()
    return out


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
