"""A planned strategy as the files a user runs on a real cluster (`amp-search export`).

    export_strategy(spec, strategy, fmt="deepspeed" | "megatron", ...) -> Export
    write_export(export, out_dir, force=False) -> [written paths]

Nothing here is a second copy of the launcher: every file comes from the function that
`amp-search launch` itself builds a trial with, so what was measured is what is exported.

- deepspeed: trial.json and ds_config.json from `trial.config.trial_config` (the trial
  program `python -m amp_search.trial.run --config trial.json` reads both: the model, the
  strategy, the planned layer boundaries and the rank -> device map), the hostfile,
  .deepspeed_env and the `deepspeed` launcher command from `launchers.build_launch`
  (launch.sh), one torchrun per node from `launchers.torchrun_node` (launch-node<i>.sh, for
  clusters without pdsh), and the pipeline partition (partition.json).
- megatron: the pretrain_gpt.py arguments from `launch.megatron.megatron_args` (what
  `launch --backend megatron` runs; megatron_args.json), one torchrun per node from
  `launchers.torchrun_node` over `launch.megatron.megatron_nodes` (launch-node<i>.sh), and
  how the layer split is given to Megatron-LM.

Both write plan.json (the strategy as `amp-search plan --json` writes it, which
`amp-search launch --plan` reads), the hostfile and a README.md. The scripts take the Python
interpreter from $PYTHON (default python3) and, for Megatron-LM, the checkout from
$MEGATRON_PATH; every other word is quoted with shlex.quote (hostnames were validated when
they were read).

Hosts: --hostfile (line i = node i of the spec), else the spec's `cluster.nodes[].hosts`,
else localhost for a one-node cluster, else placeholders node-0, node-1, ... (said in the
output; export again with --hostfile to fill them in).
"""
from __future__ import annotations

import contextlib
import json
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UsageError
from .hosts import is_loopback_host
from .launch.hostfile import HostSlots, format_hostfile
from .launch.launchers import (LaunchContext, build_launch, torchrun_node, trial_nodes,
                               trial_program)
from .launch.megatron import (check_gpt_chain, megatron_args, megatron_nodes, training_kwargs,
                              megatron_program, split_args, stage_layer_counts,
                              virtual_stage_args)
from .launch.orchestrator import LaunchOptions, check_options, node_hosts, preflight
from .records import Estimate, Strategy
from .spec import Spec
from .trial.config import trial_config, trial_env
from .trial.ranks import RankAssignment, assign_ranks

FORMATS = ("deepspeed", "megatron")
DEFAULT_MASTER_PORT = 29500
_PY = "@PYTHON@"
"""Stands for the interpreter in the commands; the scripts write "$PYTHON" there."""
_MEGATRON = "@MEGATRON_PATH@"
"""Stands for the Megatron-LM checkout; the scripts write "$MEGATRON_PATH" there."""
_RAW = {_PY: '"$PYTHON"', f"{_MEGATRON}/pretrain_gpt.py": '"$MEGATRON_PATH/pretrain_gpt.py"'}

STRATEGY_KNOBS: tuple[tuple[str, str], ...] = (
    ("pp", "pipeline stages"),
    ("dp", "data-parallel replicas"),
    ("tmp", "tensor-parallel degree"),
    ("mbs", "micro-batch size"),
    ("gas", "micro-batches per iteration (gradient accumulation)"),
    ("global_batch_size", "samples per iteration"),
    ("zero_stage", "ZeRO stage (Megatron-LM: 1 is its distributed optimizer, 3 Megatron-FSDP; "
                   "it has no 2)"),
    ("activation_checkpointing", "full recomputation of each transformer block"),
    ("selective_recompute", "recomputation of the attention core only (Korthikanti et al.)"),
    ("sequence_parallel", "sequence parallelism over the tensor group"),
    ("virtual_stages", "model chunks per stage (> 1: Megatron-LM's interleaved 1F1B)"),
    ("cp", "context-parallel ranks per sequence (Megatron-LM's ring attention)"),
    ("ep", "expert-parallel ranks (a model with experts; expert tensor parallelism 1)"),
    ("placement_order", "node order the ranks were placed over"),
)
"""What the exported README lists about the strategy: one line per knob (a knob's flags come
from ds_config / megatron_args, which the launcher uses too)."""


@dataclass(frozen=True, kw_only=True)
class ExportedFile:
    """One file of an export."""

    path: str
    """Relative to the output folder."""
    text: str
    what: str
    """One line: what the file is."""
    executable: bool = False


@dataclass(frozen=True, kw_only=True)
class Export:
    """What `amp-search export` writes for one strategy."""

    format: str
    strategy: Strategy
    predicted_s: float | None
    hosts: dict
    """node id -> host the files name."""
    placeholder_hosts: bool
    """True when the hosts are node-0, node-1, ... (no --hostfile, no hosts in the spec)."""
    split: dict
    """How the pipeline split is expressed (form, arguments, exact)."""
    notes: tuple[str, ...]
    files: tuple[ExportedFile, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"format": self.format, "label": self.strategy.label(),
                "strategy": self.strategy.to_dict(), "predicted_s": self.predicted_s,
                "hosts": {str(k): v for k, v in self.hosts.items()},
                "placeholder_hosts": self.placeholder_hosts, "split": self.split,
                "notes": list(self.notes),
                "files": [{"path": f.path, "what": f.what} for f in self.files]}


# ----------------------------------------------------------------------------- hosts, ranks

def export_hosts(spec: Spec, hostfile: tuple[HostSlots, ...] | None) -> tuple[dict, bool]:
    """(node id -> host, placeholders?): the hostfile's, else the spec's, else localhost for
    one node, else node-<id> placeholders."""
    nodes = spec.cluster.nodes
    if hostfile is not None or all(n.host for n in nodes):
        return node_hosts(spec, LaunchOptions(launcher="torchrun", hostfile=hostfile)), False
    if len(nodes) == 1:
        return {nodes[0].id: "localhost"}, False
    return {n.id: f"node-{n.id}" for n in nodes}, True


def _ranks(spec: Spec, s: Strategy, hosts: dict) -> tuple[RankAssignment, ...]:
    device_node = {d.id: (d.node, d.local_rank) for d in spec.cluster.devices}
    try:
        return assign_ranks(s, device_node, hosts)
    except (KeyError, IndexError):
        raise UsageError(f"{s.label()}: the placement names devices the spec does not "
                         f"have") from None


def check_exportable(spec: Spec, s: Strategy, fmt: str, estimate: Estimate | None) -> None:
    """Raise UsageError (one line) when the strategy cannot be exported as `fmt`: the
    launcher's own checks (custom layers, Megatron's GPT chain, preflight) and memory."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}; accepted: {', '.join(FORMATS)}")
    check_options(spec, LaunchOptions(backend=fmt, launcher="torchrun" if fmt == "megatron"
                                      else "deepspeed", dry_run=True,
                                      megatron_path=Path(_MEGATRON)))
    reason = preflight(spec, s, fmt)
    if reason:
        raise UsageError(f"{s.label()} cannot run: {reason}")
    if estimate is not None and not estimate.fits:
        worst = max(estimate.memory, key=lambda m: m.peak_bytes / m.capacity_bytes)
        raise UsageError(f"{s.label()} does not fit in memory: stage {worst.stage} needs "
                         f"{worst.peak_bytes / 2**30:.1f} GiB of "
                         f"{worst.capacity_bytes / 2**30:.1f} GiB")


# ----------------------------------------------------------------------------- scripts

def _words(argv) -> list[str]:
    return [_RAW.get(a, shlex.quote(a)) for a in argv]


def _command_lines(argv) -> str:
    """The command, one option (with its value) per continued line."""
    lines: list[str] = []
    for w in _words(argv):
        if w.startswith("--") or w in _RAW.values() or not lines:
            lines.append(w)
        else:
            lines[-1] += " " + w
    return " \\\n    ".join(lines)


def _script(about: list[str], env: dict, argv, *, megatron: bool = False) -> str:
    out = ["#!/usr/bin/env bash", *(f"# {x}" if x else "#" for x in about),
           "set -euo pipefail", 'cd "$(dirname "$0")"', 'PYTHON="${PYTHON:-python3}"']
    if megatron:
        out.append('MEGATRON_PATH="${MEGATRON_PATH:?set MEGATRON_PATH to a Megatron-LM '
                   'checkout (the folder holding pretrain_gpt.py)}"')
    out += [f"export {k}={shlex.quote(str(v))}" for k, v in sorted(env.items())]
    out.append("exec " + _command_lines(argv))
    return "\n".join(out) + "\n"


def _context(spec: Spec, device: str, env: dict, master_port: int) -> LaunchContext:
    return LaunchContext(python=_PY, workdir=Path("."), device=device, master_port=master_port,
                         trial_env=env,
                         node_slots={n.id: len(n.devices) for n in spec.cluster.nodes})


def _rank_table(ranks: tuple[RankAssignment, ...], node_rank: dict, local_rank: dict) -> str:
    head = "| global rank | stage | replica | tensor | host | node rank | local rank | device |"
    rows = [head, "|" + "---|" * 8]
    for a in ranks:
        rows.append(f"| {a.rank} | {a.stage} | {a.replica} | {a.tensor} | {a.host} | "
                    f"{node_rank[a.node]} | {local_rank[a.rank]} | {a.local_device} |")
    return "\n".join(rows)


# ----------------------------------------------------------------------------- partitions

def _stage_layers(spec: Spec, s: Strategy) -> list[dict]:
    names = [x.name for x in spec.model.layers]
    return [{"stage": j, "first_layer": a, "last_layer": b - 1, "layers": names[a:b]}
            for j, (a, b) in enumerate(zip(s.partition, s.partition[1:]))]


def deepspeed_partition_method(spec: Spec, s: Strategy) -> str | None:
    """The built-in `PipelineModule(partition_method=...)` that gives exactly the planned
    boundaries ('uniform' or 'type:TransformerLayer'), or None (explicit boundaries needed).
    Uses DeepSpeed's own partition functions (None when DeepSpeed is not installed)."""
    try:
        # DeepSpeed logs to stdout from import on (its accelerator notice): keep stdout for
        # `--json -` by binding its log handler to stderr
        with contextlib.redirect_stdout(sys.stderr):
            from deepspeed.runtime.utils import partition_balanced, partition_uniform
    except ImportError:
        return None
    n, want = len(spec.model.layers), list(s.partition)
    if list(partition_uniform(n, s.pp)) == want:
        return "uniform"
    blocks = [1 if x.kind == "transformer" else 0 for x in spec.model.layers]
    if any(blocks) and [int(x) for x in partition_balanced(blocks, s.pp)] == want:
        return "type:TransformerLayer"
    return None


def megatron_split(spec: Spec, s: Strategy) -> dict:
    """How Megatron-LM is told the planned split: form, arguments, and whether it is exact."""
    layers = spec.model.layers
    if s.virtual_stages > 1:
        args = virtual_stage_args(layers, s)
        counts = stage_layer_counts(layers, s.partition)
        how = {"--num-layers-per-virtual-pipeline-stage":
               f"{s.virtual_stages} model chunks of {counts[0]} transformer blocks on each "
               f"stage (stage j runs chunks j, j + {s.pp}, ...): "
               f"--num-layers-per-virtual-pipeline-stage {counts[0]} gives it exactly",
               "--num-virtual-stages-per-pipeline-rank":
               f"{s.virtual_stages} model chunks on each stage (stage j runs chunks j, "
               f"j + {s.pp}, ...), the embedding and the loss counted as a block each: "
               f"{' '.join(args)} gives it exactly (blocks per chunk {counts})",
               "--pipeline-model-parallel-layout":
               f"{s.virtual_stages} uneven model chunks on each stage (stage j runs chunks j, "
               f"j + {s.pp}, ...; blocks per chunk {counts}): --pipeline-model-parallel-layout "
               f"{args[1] if len(args) > 1 else ''} gives them exactly, in Megatron-LM "
               f"versions that have that flag (megatron-core 0.16 parses it)"}[args[0]]
        return {"blocks_per_chunk": counts, "args": args, "exact": True, "form": "interleaved",
                "note": how + " (Megatron-LM's interleaved 1F1B)"}
    args = split_args(layers, s.partition)
    counts = stage_layer_counts(layers, s.partition)
    out = {"blocks_per_stage": counts, "args": args, "exact": True}
    if not args:
        out.update(form="uniform", note=f"every stage holds {counts[0]} transformer blocks: "
                   f"Megatron-LM's default even split, exactly as planned")
    elif args[0] == "--decoder-first-pipeline-num-layers":
        out.update(form="first-last", note=(
            f"blocks per stage {counts}: --decoder-first/last-pipeline-num-layers give it "
            f"exactly (Megatron-LM spreads the rest evenly over the middle stages)"))
    else:
        out.update(form="layout", note=(
            f"blocks per stage {counts}: --decoder-first/last-pipeline-num-layers cannot "
            f"express this split (its middle stages are uneven or a first/last stage holds no "
            f"block); --pipeline-model-parallel-layout {args[1]} gives it exactly, in "
            f"Megatron-LM versions that have that flag (megatron-core 0.16 parses it); an "
            f"older Megatron-LM cannot run this split"))
    return out


# ----------------------------------------------------------------------------- formats

def _readme(title: str, spec: Spec, s: Strategy, predicted_s: float | None,
            files: list[ExportedFile], run: list[str], ranks_md: str, notes: list[str],
            placeholder: bool) -> str:
    pred = "" if predicted_s is None else f" Predicted: {predicted_s:.4g} s per iteration."
    lines = [f"# {title}: {s.label()}", "",
             f"Written by `amp-search export` from `{spec.path or 'the spec'}` "
             f"(spec sha256 {spec.sha256[:12]}).{pred}", "", "## Strategy", ""]
    d = s.to_dict()
    lines += [f"- {what} (`{k}`): {d[k]}" for k, what in STRATEGY_KNOBS if k in d]
    bounds = list(s.partition)
    lines += [f"- layer boundaries (`partition`): {bounds}; stage j runs layers "
              f"partition[j] .. partition[j+1]-1" if s.virtual_stages == 1 else
              f"- layer boundaries (`partition`): {bounds}; model chunk k runs layers "
              f"partition[k] .. partition[k+1]-1 on stage k mod {s.pp}", "", "## Files", ""]
    lines += [f"- `{f.path}`: {f.what}" for f in files]
    lines += ["- `README.md`: this file", "", "## Running it on a real cluster", ""]
    if placeholder:
        lines += ["**The hosts are placeholders** (node-0, node-1, ...): export again with "
                  "`--hostfile FILE` (one `host slots=N` per spec node, in spec order) or "
                  "give `cluster.nodes[].hosts` in the spec.", ""]
    lines += run + ["", "## Which process runs where", "", ranks_md, ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


def _deepspeed(spec: Spec, s: Strategy, ranks, hosts, *, iters, warmup, seed, master_port):
    """DeepSpeed's files: (files, split, notes, README steps, README rank section)."""
    cfg = trial_config(spec, s, ranks, iters=iters, warmup=warmup, seed=seed,
                       output="result.json")
    env = trial_env(cfg.device, "deepspeed")
    ctx = _context(spec, cfg.device, env, master_port)
    program = trial_program(Path("trial.json"))
    launch = build_launch("deepspeed", ranks, ctx, Path("trial.json"))
    method = deepspeed_partition_method(spec, s)
    stages = _stage_layers(spec, s)
    partition = {
        "boundaries": list(s.partition), "stages": stages,
        "partition_method": method,
        "note": (("one stage with ZeRO 2/3, which DeepSpeed's pipeline engine rejects: "
                  "amp_search.trial.run trains the layers as one plain DeepSpeed engine"
                  if s.pp == 1 and s.zero_stage >= 2 else
                  "amp_search.trial.run builds a PipelineModule whose _partition_layers "
                  "returns these boundaries (PlannedPipelineModule)")
                 + (f"; in your own DeepSpeed model PipelineModule(partition_method="
                    f"{method!r}) gives the same split"
                    + (" (with your transformer block's class name after 'type:')"
                       if method.startswith("type:") else "") if method else
                    "; no built-in partition_method of DeepSpeed gives this split: pass the "
                    "boundaries explicitly")),
    }
    files = [
        ExportedFile(path="trial.json", text=json.dumps(cfg.to_dict(), indent=1),
                     what="the trial config amp_search.trial.run reads: model layers, "
                          "strategy, rank -> device map, launch order, DeepSpeed config"),
        ExportedFile(path="ds_config.json", text=json.dumps(cfg.ds_config, indent=1),
                     what="the DeepSpeed config (batch sizes, ZeRO stage, precision, Adam)"),
        ExportedFile(path="partition.json", text=json.dumps(partition, indent=1),
                     what="the pipeline split: layer boundaries and the layers of each stage"),
    ]
    for path, text in launch.files.items():
        name = Path(path).name
        what = {"hostfile": "DeepSpeed hostfile: the trial's nodes, `host slots=N`",
                ".deepspeed_env": "environment the deepspeed launcher exports on every node"}
        files.append(ExportedFile(path=name, text=text, what=what.get(name, "launcher file")))
    cmd = launch.commands[0]
    nodes = trial_nodes(ranks)
    files.append(ExportedFile(
        path="launch.sh", executable=True, what="start all nodes with the deepspeed launcher "
        "(from the first node; pdsh + passwordless ssh to the others)",
        text=_script([f"{s.label()}: every rank of every node, through the deepspeed "
                      f"launcher (run on {nodes[0].host})."], {**env, **cmd.env}, cmd.argv)))
    node_rank, local_rank = {}, {}
    for i, n in enumerate(nodes):
        node_rank[n.node] = i
        c = torchrun_node(nodes, i, ctx, program=program)
        files.append(ExportedFile(
            path=f"launch-node{i}.sh", executable=True,
            what=f"torchrun for node rank {i} ({n.host}, local devices "
                 f"{','.join(map(str, n.devices))}); run one on each node instead of launch.sh",
            text=_script([f"{s.label()}: node rank {i} of {len(nodes)}; run on {n.host}."],
                         {**env, **c.env}, c.argv)))
    for a in ranks:
        local_rank[a.rank] = nodes[node_rank[a.node]].devices.index(a.local_device)
    run = [
        "1. Install the same amp-search, DeepSpeed, PyTorch and megatron-core on every node "
        "and put this folder at the same path on all of them (a shared file system).",
        "2. Either run `./launch.sh` on the first node (the deepspeed launcher reaches the "
        "others over pdsh/ssh and exports `.deepspeed_env` there), or run "
        "`./launch-node<i>.sh` on node i, all at about the same time (torchrun's static "
        "rendezvous at the first node).",
        "3. `PYTHON=/path/to/python ./launch.sh` picks the interpreter (default python3).",
        f"4. The run trains {iters} iterations on synthetic tokens and global rank 0 writes "
        f"`result.json` (mean time of the last {iters - warmup}): what `amp-search launch` "
        f"measured, on your cluster. For your own model, take `ds_config.json` and "
        f"`partition.json` and keep the rank order below.",
    ]
    ranks_md = ("Every launcher numbers processes node after node (hostfile order) and inside "
                "a node by ascending local device; amp_search.trial.run maps that launch rank "
                "to the planned global rank through `launch_order` in trial.json. Global "
                "rank g = (stage * dp + replica) * tmp + tensor (DeepSpeed's "
                "PipeModelDataParallelTopology).\n\n"
                + _rank_table(ranks, node_rank, local_rank))
    notes = []
    if cfg.precision != spec.training.precision:
        notes.append(f"trains in {cfg.precision}, not the spec's {spec.training.precision} "
                     f"(DeepSpeed's fp16 optimizer needs CUDA)")
    return files, {"form": "boundaries", "boundaries": list(s.partition),
                   "partition_method": method, "exact": True}, notes + [partition["note"]], \
        run, ranks_md


def _megatron(spec: Spec, s: Strategy, ranks, hosts, *, iters, warmup, seed, master_port):
    """Megatron-LM's files: (files, split, notes, README steps, README rank section)."""
    cfg = trial_config(spec, s, ranks, iters=iters, warmup=warmup, seed=seed,
                       output="result.json")   # device and precision, as the launcher
    block = check_gpt_chain(spec.model.layers)
    args = megatron_args(spec.model.layers, s, precision=cfg.precision, iters=iters, seed=seed,
                         **training_kwargs(spec.training, s))
    nodes = megatron_nodes(ranks)
    env = trial_env(cfg.device, "megatron")
    ctx = _context(spec, cfg.device, env, master_port)
    program = megatron_program(Path(_MEGATRON), args)
    split = megatron_split(spec, s)
    files = [ExportedFile(path="megatron_args.json", text=json.dumps(args, indent=1),
                          what="the pretrain_gpt.py arguments, as `amp-search launch "
                               "--backend megatron` passes them")]
    node_rank, local_rank = {}, {}
    for i, n in enumerate(nodes):
        node_rank[n.node] = i
        for k, d in enumerate(n.devices):
            local_rank[next(a.rank for a in ranks
                            if a.node == n.node and a.local_device == d)] = k
        c = torchrun_node(nodes, i, ctx, program=program)
        files.append(ExportedFile(
            path=f"launch-node{i}.sh", executable=True,
            what=f"torchrun of pretrain_gpt.py for node rank {i} ({n.host}, "
                 f"CUDA_VISIBLE_DEVICES={','.join(map(str, n.devices))})",
            text=_script([f"{s.label()}: Megatron-LM, node rank {i} of {len(nodes)}; run on "
                          f"{n.host}.", "Arguments: megatron_args.json (the same list)."],
                         {**env, **c.env}, c.argv, megatron=True)))
    files.append(ExportedFile(
        path="hostfile", text=format_hostfile(tuple(
            HostSlots(host=hosts[n.id], slots=len(n.devices)) for n in spec.cluster.nodes)),
        what="the spec's nodes as `host slots=N` (for `amp-search launch --hostfile`)"))
    run = [
        "1. Check out Megatron-LM (a version with the flags in megatron_args.json) at the same "
        "path on every node and install its requirements.",
        "2. On node i run `MEGATRON_PATH=/path/to/Megatron-LM ./launch-node<i>.sh`, all "
        "nodes at about the same time (torchrun's static rendezvous at node rank 0).",
        "3. The arguments train on mock data (`--mock-data`, NullTokenizer) for "
        f"{iters} iterations with a constant learning rate, as `amp-search launch --backend "
        "megatron` measures; for real training replace those with your data, tokenizer, "
        "schedule and checkpointing arguments and keep the parallel, batch, split, recompute "
        "and precision ones.",
        "4. `--transformer-impl local --no-gradient-accumulation-fusion` are what the trials "
        "run (no Transformer Engine or apex needed); where those are installed, "
        "`--transformer-impl transformer_engine` is faster and leaves the strategy as it is."
        if "local" in args else
        "4. `--transformer-impl transformer_engine`: Transformer Engine is needed (FP8 and "
        "NVFP4 are its recipes, and the strategy's other options run on it); "
        "`--no-gradient-accumulation-fusion` leaves apex out and can be dropped where it is "
        "installed.",
    ]
    ranks_md = ("Megatron-LM has no rank map: it takes torchrun's rank (node rank x processes "
                "per node + local rank) as its global rank and orders its groups tp fastest, "
                "then dp, then pp (megatron-core's default order tp-cp-ep-dp-pp), so rank g = "
                "(stage * dp + replica) * tmp + tensor, as the plan numbers them. The node "
                "ranks are therefore given in the order of each node's smallest global rank "
                "(not necessarily spec order), and CUDA_VISIBLE_DEVICES lists each node's "
                "devices in global-rank order, so local rank k drives the planned device.\n\n"
                + _rank_table(ranks, node_rank, local_rank))
    notes = [f"pipeline split: {split['note']}"]
    if block.position_embedding == "rope":
        notes.append("rotary position embeddings run at Megatron-LM's default base "
                     "(--rotary-base 10000), which costs the same as any other: for real "
                     "training add the model's own (e.g. 500000 for Llama 3, 1000000 for "
                     "Qwen3) and its rope scaling")
    if block.rope_scaling == "yarn":
        notes.append("model.rope_scaling yarn: the plan costs megatron-core's YaRN rotation, "
                     "which runs unfused (its attention scale is not 1); these arguments train "
                     "plain RoPE, which Megatron-LM fuses (a little faster than planned): for "
                     "real training add your Megatron-LM's "
                     "YaRN arguments and the model's scaling (GPT-OSS: factor 32, original "
                     "length 4096, base 150000)")
    if not cfg.causal:
        notes.append("pretrain_gpt.py trains a causal GPT: this spec's BERT blocks run with "
                     "a causal attention mask there (same sizes and cost, other masking)")
    if s.zero_stage == 1:
        notes.append("zero_stage 1 is Megatron-LM's distributed optimizer "
                     "(--use-distributed-optimizer): optimizer state and fp32 master weights "
                     "sharded over data parallelism, gradients reduce-scattered and weights "
                     "all-gathered instead of one all-reduce"
                     + ("" if spec.training.backend == "megatron" else
                        "; the plan costed DeepSpeed's ZeRO 1 (plan with training.backend: "
                        "megatron to cost Megatron-LM's memory and communication)"))
    if s.zero_stage == 3:
        notes.append("zero_stage 3 is Megatron-FSDP (--use-megatron-fsdp "
                     "--data-parallel-sharding-strategy optim_grads_params): weights, gradients "
                     "and optimizer state sharded over data parallelism, each layer's weights "
                     "all-gathered in its forward and backward and its gradients "
                     "reduce-scattered, beside the neighbouring layers' compute "
                     "(--overlap-param-gather --overlap-grad-reduce); it needs CUDA")
    if spec.training.grad_reduce_in_fp32 is False and cfg.precision != "fp16":
        notes.append("training.grad_reduce_in_fp32 false: the plan keeps the gradients in "
                     f"{cfg.precision} (megatron-core's grad_reduce_in_fp32=False, as "
                     "Megatron-Bridge sets it); Megatron-LM's pretrain_gpt.py turns "
                     "--accumulate-allreduce-grads-in-fp32 on for bf16 itself, which doubles "
                     "the gradient buffer and the data-parallel traffic the plan costed")
    if "--cpu-offloading" in args:
        notes.append(f"--cpu-offloading --cpu-offloading-num-layers "
                     f"{spec.training.cpu_offload_layers} (training.cpu_offload_layers): the "
                     f"first blocks' saved activations go to host memory and back beside the "
                     f"compute, on Transformer Engine's layers (--transformer-impl "
                     f"transformer_engine); it needs CUDA")
    if "--tp-comm-overlap" in args:
        notes.append("--tp-comm-overlap (training.tp_comm_overlap): the tensor-parallel "
                     "all-gathers and reduce-scatters run beside the GEMMs in Transformer "
                     "Engine's userbuffers, so these arguments use --transformer-impl "
                     "transformer_engine; it needs CUDA")
    if "--overlap-moe-expert-parallel-comm" in args:
        notes.append("--overlap-moe-expert-parallel-comm --delay-wgrad-compute "
                     "(training.moe_a2a_overlap): each MoE layer's all-to-alls run beside "
                     "another micro-batch's compute, on Transformer Engine's layers; it needs "
                     "CUDA")
    elif spec.training.moe_a2a_overlap and spec.model.num_experts:
        notes.append("training.moe_a2a_overlap: megatron-core overlaps the all-to-alls only "
                     "with ep > 1, pp 1 or virtual stages, and no full recomputation; this "
                     "plan is not such a one, and was costed without it")
    if "--moe-flex-dispatcher-backend" in args:
        notes.append(f"--moe-token-dispatcher-type flex --moe-flex-dispatcher-backend "
                     f"{spec.training.moe_dispatcher} (training.moe_dispatcher): the "
                     f"{'DeepEP' if spec.training.moe_dispatcher == 'deepep' else 'Hybrid-EP'} "
                     f"library must be installed beside Megatron-LM; it needs CUDA")
    if spec.training.moe_sync_free and spec.model.num_experts:
        notes.append("training.moe_sync_free: the plan costs MoE layers that never wait for "
                     "the host; these arguments run megatron-core's dropless dispatcher, "
                     "which does. Megatron-LM runs them sync-free with a static expert "
                     "capacity and full-iteration CUDA graphs (--moe-token-dispatcher-type "
                     "flex --moe-flex-dispatcher-backend hybridep "
                     "--moe-expert-rank-capacity-factor F --cuda-graph-impl full_iteration; "
                     "its MoE documentation, on CUDA): add them by hand")
    if cfg.precision != spec.training.precision:
        notes.append(f"trains in {cfg.precision}, not the spec's {spec.training.precision}")
    return files, split, notes, run, ranks_md


def export_strategy(spec: Spec, strategy: Strategy, *, fmt: str,
                    hostfile: tuple[HostSlots, ...] | None = None,
                    estimate: Estimate | None = None, iters: int = 40, warmup: int = 20,
                    seed: int = 1234, master_port: int = DEFAULT_MASTER_PORT) -> Export:
    """The files of `strategy` in format `fmt` (nothing written; see write_export). Raises
    UsageError when the launcher would not run it (the launcher's own checks), when it does
    not fit in memory (`estimate`), or when Megatron-LM cannot place its ranks."""
    check_exportable(spec, strategy, fmt, estimate)
    if not 0 <= warmup < iters:
        raise UsageError(f"--iters {iters} --warmup {warmup}: need 0 <= warmup < iters")
    hosts, placeholder = export_hosts(spec, hostfile)
    ranks = _ranks(spec, strategy, hosts)
    predicted = None if estimate is None else estimate.iteration_time_s
    build = _deepspeed if fmt == "deepspeed" else _megatron
    files, split, notes, run, ranks_md = build(
        spec, strategy, ranks, hosts, iters=iters, warmup=warmup, seed=seed,
        master_port=master_port)
    plan = {"strategies": [estimate.to_dict() if estimate is not None
                           else {**strategy.to_dict(), "iteration_time_s": None}]}
    files.append(ExportedFile(path="plan.json", text=json.dumps(plan, indent=1),
                              what="the strategy as `amp-search plan --json` writes it "
                                   "(`amp-search launch SPEC --plan plan.json` reads it)"))
    if placeholder:
        notes = [f"hosts are placeholders ({', '.join(hosts.values())}): export again with "
                 f"--hostfile FILE or give cluster.nodes[].hosts"] + notes
    if all(is_loopback_host(h) for h in hosts.values()):
        one = len(set(hosts.values())) == 1
        notes.append("all ranks run on this machine (localhost)" if one else
                     f"all ranks run on this machine: the nodes are loopback addresses "
                     f"({', '.join(hosts.values())}); run every launch-node<i>.sh here")
    title = "DeepSpeed" if fmt == "deepspeed" else "Megatron-LM"
    readme = _readme(f"{title} export", spec, strategy, predicted, files, run, ranks_md, notes,
                     placeholder)
    files.append(ExportedFile(path="README.md", text=readme,
                              what="what each file is and how to run it on a cluster"))
    return Export(format=fmt, strategy=strategy, predicted_s=predicted, hosts=hosts,
                  placeholder_hosts=placeholder, split=split, notes=tuple(notes),
                  files=tuple(files))


def write_export(export: Export, out: Path, *, force: bool = False) -> list[Path]:
    """Write the files under `out` (created); refuses a non-empty `out` unless `force`."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise UsageError(f"--out {out} is not empty; give --force to write into it")
    written = []
    try:
        out.mkdir(parents=True, exist_ok=True)
        for f in export.files:
            p = out / f.path
            p.write_text(f.text)
            if f.executable:
                p.chmod(0o755)
            written.append(p)
    except OSError as exc:
        raise UsageError(f"cannot write {out}: {exc.strerror or exc}") from None
    return written


__all__ = ["Export", "ExportedFile", "FORMATS", "STRATEGY_KNOBS", "check_exportable",
           "deepspeed_partition_method", "export_hosts", "export_strategy", "megatron_split",
           "write_export"]
