"""One trial process: `python -m amp_search.trial.run --config trial.json`.

Started by torchrun, the deepspeed launcher or srun, once per device. It

1. reads its launch rank (RANK, else SLURM_PROCID) and looks up its global rank and device
   in the config (amp_search.trial.ranks explains the mapping);
2. joins torch.distributed with that rank (gloo on CPU, NCCL on CUDA) and megatron-core's
   parallel_state with the same tensor / pipeline groups as DeepSpeed's grid (checked);
3. with experts, creates the expert-parallel and expert-data-parallel groups
   (`expert_groups`) and has DeepSpeed reduce the experts' gradients over the latter;
   builds the model as a DeepSpeed PipelineModule split at exactly the planned boundaries,
   over a PipeModelDataParallelTopology(pp, tmp, dp), with megatron-core tensor-parallel layers
   (amp_search.trial.model); with pp = 1 and ZeRO 2 or 3 (which DeepSpeed's pipeline engine
   rejects) it trains the same layers as a plain DeepSpeed engine;
4. trains `iters` iterations on synthetic tokens; each iteration's time is the slowest rank's;
5. global rank 0 writes the result JSON: iteration times, mean and std of the iterations
   after `warmup`, losses, peak memory per rank, the layers each stage holds, what each rank
   sent to other stages per timed iteration (payload and metadata bytes, and the all-gathers
   that rebuild partitioned activations: `_p2p_counter`), what each rank's expert
   all-to-alls sent per timed iteration (`model.ALL_TO_ALL_SENT`) and the sum of its experts'
   weights at the end, versions;
6. with `instruction_trace` on, every rank also writes the start and end of each DeepSpeed
   instruction of the iterations after `warmup` (amp_search.trial.instructions).

Every rank dies with its launcher process (torchrun, the deepspeed launcher's worker, srun's
step daemon): SIGKILL through prctl(PR_SET_PDEATHSIG) on Linux, a watcher thread elsewhere, so
that no rank outlives a launch that was killed hard (`die_with_parent`).

A program, so it reads the launcher's environment variables; nothing else here does.
"""
from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import platform
import resource
import signal
import statistics
import sys
import threading
import time
from pathlib import Path

from .config import TrialConfig

SYNTHETIC_BATCHES = 8
"""Distinct micro-batches per replica, cycled, so the loss visibly falls over a trial."""


def resolve_rank(cfg: TrialConfig, env) -> tuple[int, int]:
    """(global rank, local device index to use) of this process, from the launcher's
    variables: the launch rank (RANK, else SLURM_PROCID) through cfg.launch_order, and on
    CUDA the planned local device's position in CUDA_VISIBLE_DEVICES."""
    for var in ("RANK", "SLURM_PROCID"):
        if var in env:
            launch_rank = int(env[var])
            break
    else:
        raise SystemExit("amp_search.trial.run: no RANK or SLURM_PROCID in the environment; "
                         "start it with torchrun, the deepspeed launcher or srun")
    g = cfg.launch_order[launch_rank]
    if cfg.device != "cuda":
        return g, 0
    local = cfg.ranks[g].local_device
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if not visible:
        return g, local
    ids = [v.strip() for v in visible.split(",")]
    if str(local) not in ids:
        raise RuntimeError(f"rank {g}: planned device {local} is not in "
                           f"CUDA_VISIBLE_DEVICES={visible}")
    return g, ids.index(str(local))


def _setup(cfg: TrialConfig):
    """Join torch.distributed / DeepSpeed / megatron; returns (rank, torch device)."""
    g, local = resolve_rank(cfg, os.environ)
    # DeepSpeed's PipelineModule and engine read these
    os.environ.update(RANK=str(g), LOCAL_RANK=str(local), WORLD_SIZE=str(cfg.world_size))
    os.environ.setdefault("DS_ACCELERATOR", cfg.device)

    import torch
    import torch.distributed as dist

    if cfg.device == "cuda":
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cfg.device == "cuda" else "gloo", init_method="env://",
                            rank=g, world_size=cfg.world_size)

    # the shared-memory op only serves inference all-reduce and takes 60 s to compile
    # (importlib, not `import deepspeed.comm.torch as m`: deepspeed.comm has an attribute `torch`)
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed
    from megatron.core import parallel_state

    deepspeed.init_distributed(dist_backend="nccl" if cfg.device == "cuda" else "gloo")
    s = cfg.strategy
    parallel_state.initialize_model_parallel(s.tmp, s.pp, create_gloo_process_groups=False)
    return g, device


def expert_groups(cfg: TrialConfig) -> tuple[list[list[int]], list[list[int]]]:
    """(expert-parallel groups, expert-data-parallel groups) of global ranks, as the cost
    model lays them out: in each stage, groups of ep consecutive ranks (replica-major, tensor
    fastest) split the experts, and the ranks at the same place in those groups hold the
    same experts and reduce their gradients together (dp x tmp / ep of them)."""
    s = cfg.strategy
    per_stage = s.dp * s.tmp
    ep_groups, edp_groups = [], []
    for j in range(s.pp):
        base = j * per_stage
        ep_groups += [[base + i * s.ep + q for q in range(s.ep)] for i in range(per_stage // s.ep)]
        edp_groups += [[base + q + i * s.ep for i in range(per_stage // s.ep)]
                       for q in range(s.ep)]
    return ep_groups, edp_groups


def _join_expert_groups(cfg: TrialConfig, rank: int):
    """Create every expert-parallel and expert-data-parallel group (each rank creates all of
    them, in the same order) and register this rank's expert-data-parallel group with
    DeepSpeed under the experts' group name, so that its engine broadcasts their initial
    weights over it (DeepSpeed's _broadcast_model) and `_reduce_expert_gradients` finds it.
    Returns this rank's expert-parallel group; None for a model without experts."""
    if not any(x.is_moe for x in cfg.layers):
        return None
    import torch.distributed as dist
    from deepspeed.utils import groups as ds_groups

    from .model import EXPERT_GROUP_NAME

    ep_groups, edp_groups = expert_groups(cfg)
    mine = {}
    for kind, members_list in (("ep", ep_groups), ("edp", edp_groups)):
        for members in members_list:
            g = dist.new_group(members)
            if rank in members:
                mine[kind] = g
    ds_groups._EXPERT_PARALLEL_GROUP[EXPERT_GROUP_NAME] = mine["ep"]
    ds_groups._EXPERT_DATA_PARALLEL_GROUP[EXPERT_GROUP_NAME] = mine["edp"]
    return mine["ep"]


def _reduce_expert_gradients_too(engine) -> None:
    """DeepSpeed's engine reduces the gradients of parameters marked `allreduce = False` (the
    routed experts) over their expert-data-parallel group only where it found MoE layers of
    its own at initialization (has_moe_layers), which the trial's are not: it is set here, so
    that its `_reduce_expert_gradients` (a sum over that group divided by dp) runs after
    every data-parallel reduction. At run time the flag changes nothing else under ZeRO 0
    (only checkpointing and the wall-clock breakdown read it)."""
    engine.has_moe_layers = True


class _Data:
    """Synthetic next-token data for one data-parallel replica: (ids, labels) micro-batches
    of [mbs, s], the same on every stage and tensor rank of the replica."""

    def __init__(self, cfg: TrialConfig, replica: int):
        import torch

        emb = next((x for x in cfg.layers if x.kind == "embedding"), None)
        vocab = emb.vocab_size if emb else 2
        seq = cfg.layers[0].seq_length
        gen = torch.Generator().manual_seed(cfg.seed * 1009 + replica)
        tokens = torch.randint(0, vocab, (SYNTHETIC_BATCHES, cfg.strategy.mbs, seq + 1),
                               generator=gen)
        self.batches = [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]
        self.i = 0

    def __iter__(self):
        return self

    def __next__(self):
        ids, labels = self.batches[self.i % len(self.batches)]
        self.i += 1
        return ids, labels


def _knobs(cfg: TrialConfig) -> dict:
    """build_layer's arguments for the strategy's sequence parallelism and selective
    recomputation (full recomputation is DeepSpeed's activation checkpointing)."""
    s = cfg.strategy
    return {"sequence_parallel": s.sequence_parallel and s.tmp > 1,
            "selective_recompute": s.selective_recompute and not s.activation_checkpointing}


def _layer_specs(cfg: TrialConfig, expert_group=None):
    """One DeepSpeed LayerSpec per layer; only the local stage's layers get built."""
    from deepspeed.pipe import LayerSpec

    from . import model as trial_model

    classes = {"embedding": trial_model.EmbeddingLayer, "transformer": trial_model.TransformerLayer,
               "mlp": trial_model.MLPLayer, "head": trial_model.HeadLayer}

    class Spec(LayerSpec):
        def __init__(self, layer):  # (no super().__init__: we build through build_layer)
            if layer.kind not in classes:
                trial_model.build_layer(layer)  # raises UnsupportedLayer with the reason
            self.typename, self.module_args, self.module_kwargs = classes[layer.kind], (), {}
            self.layer, self.global_rank = layer, -1

        def build(self, log=False):
            return trial_model.build_layer(self.layer, tp_size=cfg.strategy.tmp, precision="fp32",
                                 causal=cfg.causal, expert_group=expert_group, **_knobs(cfg))

        def __repr__(self):
            return f"{self.typename.__name__}({self.layer.name})"

    return [Spec(layer) for layer in cfg.layers]


def _pipeline_module(cfg: TrialConfig, expert_group=None):
    from deepspeed.pipe import PipelineModule
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    from . import model as trial_model

    class PlannedPipelineModule(PipelineModule):
        """PipelineModule split at given layer boundaries (DeepSpeed offers only uniform,
        parameter and type-based partitioning): `_partition_layers` takes the plan's."""

        def __init__(self, layers, *, boundaries, **kwargs):
            self._planned_parts = list(boundaries)  # read by _partition_layers in __init__
            super().__init__(layers, **kwargs)

        def _partition_layers(self, method="planned"):
            parts = self._planned_parts
            if len(parts) != self.num_stages + 1 or parts[0] != 0 or \
                    parts[-1] != len(self._layer_specs) or sorted(parts) != parts:
                raise ValueError(f"partition {parts} does not split {len(self._layer_specs)} "
                                 f"layers into {self.num_stages} stages")
            self.parts = list(parts)
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    s = cfg.strategy
    topo = PipeModelDataParallelTopology(num_pp=s.pp, num_mp=s.tmp, num_dp=s.dp)
    return PlannedPipelineModule(
        _layer_specs(cfg, expert_group), boundaries=s.partition, topology=topo, loss_fn=trial_model.lm_loss,
        seed_layers=True, base_seed=cfg.seed, partition_method="planned",
        activation_checkpoint_interval=1 if s.activation_checkpointing else 0,
        checkpointable_layers=trial_model.CHECKPOINTABLE_LAYERS)


def _check_groups(module, rank: int) -> None:
    """megatron's tensor / data / pipeline ranks must be DeepSpeed's grid's."""
    from megatron.core import parallel_state as ps

    grid = module._grid
    ours = (ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank(),
            ps.get_pipeline_model_parallel_rank())
    theirs = (grid.get_slice_parallel_rank(), grid.get_data_parallel_rank(),
              grid.get_stage_id())
    if ours != theirs:
        raise RuntimeError(f"rank {rank}: megatron (tp, dp, pp) ranks {ours} differ from "
                           f"DeepSpeed's grid {theirs}")


class _Sequential:
    """pp = 1 with ZeRO 2/3: the layer chain as one module returning the loss."""

    @staticmethod
    def build(cfg: TrialConfig, expert_group=None):
        import torch
        from deepspeed.runtime.utils import set_random_seed

        from . import model as trial_model

        class Chain(torch.nn.Module):
            def __init__(self):
                super().__init__()
                mods = []
                for i, layer in enumerate(cfg.layers):
                    set_random_seed(cfg.seed + i)  # as PipelineModule(seed_layers=True)
                    mods.append(trial_model.build_layer(layer, tp_size=cfg.strategy.tmp,
                                              precision="fp32", causal=cfg.causal,
                                              expert_group=expert_group, **_knobs(cfg)))
                self.layers = torch.nn.ModuleList(mods)

            def forward(self, ids, labels):
                from torch.utils.checkpoint import checkpoint

                x = ids
                for layer, m in zip(cfg.layers, self.layers):
                    if cfg.strategy.activation_checkpointing and \
                            type(m).__name__ in trial_model.CHECKPOINTABLE_LAYERS:
                        # full recomputation: keep the block's input, replay it in backward
                        x = checkpoint(m, x, use_reentrant=False)
                    else:
                        x = m(x)
                return trial_model.lm_loss(x, labels)

        return Chain()


class _TensorMPU:
    """DeepSpeed's `mpu` interface over megatron's tensor and data groups (pp = 1 engine; the
    PipelineModule brings its own grid)."""

    def __init__(self):
        from megatron.core import parallel_state as ps

        self.get_model_parallel_rank = ps.get_tensor_model_parallel_rank
        self.get_model_parallel_world_size = ps.get_tensor_model_parallel_world_size
        self.get_model_parallel_group = ps.get_tensor_model_parallel_group
        self.get_data_parallel_rank = ps.get_data_parallel_rank
        self.get_data_parallel_world_size = ps.get_data_parallel_world_size
        self.get_data_parallel_group = ps.get_data_parallel_group


def _versions() -> dict:
    import deepspeed
    import torch

    try:
        from megatron.core import package_info
        megatron = package_info.__version__
    except ImportError:
        megatron = "unknown"
    return {"python": platform.python_version(), "torch": torch.__version__,
            "deepspeed": deepspeed.__version__, "megatron_core": megatron}


def _peak_memory(device) -> tuple[int, str]:
    import torch

    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    # Linux reports ru_maxrss in KiB: the whole process, framework included (approximation)
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "cpu_max_rss_approx"


def _call(name: str, fn, *args):
    return fn(*args)


def _instruction_recorder(cfg: TrialConfig, rank: int, engine, device, pipelined: bool):
    """None unless cfg.instruction_trace; else a recorder timing this rank's DeepSpeed
    instructions (installed into the pipeline engine; the plain engine's forward, backward and
    step are timed by the training loop)."""
    if not cfg.instruction_trace:
        return None
    import torch

    from .instructions import InstructionRecorder, install_pipeline

    me, s = cfg.ranks[rank], cfg.strategy
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else None
    rec = InstructionRecorder(rank=rank, stage=me.stage, replica=me.replica, tensor=me.tensor,
                              pp=s.pp, dp=s.dp, tmp=s.tmp, gas=s.gas,
                              engine="pipeline" if pipelined else "plain", sync=sync)
    if pipelined:
        install_pipeline(engine, rec)
    return rec


def _p2p_counter(pipelined: bool) -> dict | None:
    """What this rank's pipeline engine sends to other stages, counted by wrapping
    deepspeed.runtime.pipe.p2p.send (the engine calls it through the module): bytes of
    floating-point payload (activations, gradients, or their 1/tmp partitions) and of the
    rest (the partitions' metadata), and the tensor all-gathers that rebuild a partitioned
    activation or gradient (deepspeed.runtime.utils.PartitionedTensor.full). None for the
    plain engine (pp = 1 with ZeRO 2/3), which sends nothing."""
    if not pipelined:
        return None
    from deepspeed.runtime.pipe import p2p
    from deepspeed.runtime.utils import PartitionedTensor

    counts = {"payload_bytes": 0, "meta_bytes": 0, "gathers": 0}
    send, full = p2p.send, PartitionedTensor.full

    def counted_send(tensor, dest_stage, async_op=False):
        key = "payload_bytes" if tensor.is_floating_point() else "meta_bytes"
        counts[key] += tensor.numel() * tensor.element_size()
        return send(tensor, dest_stage, async_op=async_op)

    def counted_full(self, *args, **kwargs):
        counts["gathers"] += 1
        return full(self, *args, **kwargs)

    p2p.send = counted_send
    PartitionedTensor.full = counted_full
    return counts


def train(cfg: TrialConfig) -> dict | None:
    """Run the trial; returns the result dict on global rank 0, None elsewhere."""
    rank, device = _setup(cfg)
    import deepspeed
    import torch
    import torch.distributed as dist

    torch.manual_seed(cfg.seed)
    s = cfg.strategy
    pipelined = not (s.pp == 1 and s.zero_stage >= 2)
    expert_group = _join_expert_groups(cfg, rank)
    if expert_group is not None and (s.zero_stage or cfg.precision != "fp32"):
        raise RuntimeError(f"a model with experts trains under DeepSpeed with ZeRO 0 in fp32 "
                           f"only (got ZeRO {s.zero_stage}, {cfg.precision}): its ZeRO and "
                           f"bf16 optimizers would reduce the experts' gradients over the "
                           f"whole data-parallel group; use the megatron backend")
    if not pipelined:
        module = _Sequential.build(cfg, expert_group)
    else:
        if s.zero_stage >= 2:
            raise RuntimeError(f"DeepSpeed cannot combine ZeRO stage {s.zero_stage} with "
                               f"pipeline parallelism (pp={s.pp}); use ZeRO 0 or 1")
        module = _pipeline_module(cfg, expert_group)
        _check_groups(module, rank)
    engine, _, _, _ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=cfg.ds_config, mpu=None if pipelined else _TensorMPU())
    if expert_group is not None:
        _reduce_expert_gradients_too(engine)

    me = cfg.ranks[rank]
    data = _Data(cfg, me.replica)
    trace = _instruction_recorder(cfg, rank, engine, device, pipelined)
    call = trace.timed_call if trace is not None else _call
    sent = _p2p_counter(pipelined)
    sent_before = None

    def step() -> float:
        if pipelined:
            return float(engine.train_batch(data_iter=data))
        losses = []
        for _ in range(s.gas):
            ids, labels = next(data)
            loss = call("ForwardPass", engine, ids.to(device), labels.to(device))
            call("BackwardPass", engine.backward, loss)
            call("OptimizerStep", engine.step)
            losses.append(loss.detach().float())
        mean = torch.stack(losses).mean()
        dist.all_reduce(mean)  # average over data-parallel replicas (and equal tensor ranks)
        return float(mean) / dist.get_world_size()

    from .model import ALL_TO_ALL_SENT

    times, losses = [], []
    for it in range(cfg.iters):
        dist.barrier()
        t0 = time.perf_counter()
        if trace is not None and it >= cfg.warmup:
            trace.begin(it, t0)
        if sent is not None and it == cfg.warmup:
            sent_before = dict(sent)
        if it == cfg.warmup:
            a2a_before = dict(ALL_TO_ALL_SENT)
        loss = step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        dt = torch.tensor([time.perf_counter() - t0], device=device)
        if trace is not None:
            trace.end()
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the iteration ends with its slowest rank
        times.append(float(dt))
        losses.append(loss)
        if rank == 0:
            print(f"iteration {it + 1}/{cfg.iters} time_s={times[-1]:.4f} loss={loss:.5f}",
                  flush=True)

    if trace is not None:
        from .instructions import trace_path

        trace.write(trace_path(cfg.output, rank))
    peak = _peak_memory(device)
    if pipelined:
        local = (module._local_start, module._local_stop)
    else:
        local = (0, len(cfg.layers))
    gathered = [None] * dist.get_world_size()
    timed_iters = max(cfg.iters - cfg.warmup, 1)
    per_iteration = None if sent is None or sent_before is None else \
        {k: (sent[k] - sent_before[k]) / timed_iters for k in sent}
    a2a = None if expert_group is None else \
        {k: (ALL_TO_ALL_SENT[k] - a2a_before[k]) / timed_iters for k in ALL_TO_ALL_SENT}
    dist.all_gather_object(gathered, {"rank": rank, "peak": peak, "layers": local,
                                      "where": _where(rank), "p2p": per_iteration,
                                      "a2a": a2a, "experts": _expert_weights_sum(module)})
    result = None
    if rank == 0:
        timed = times[cfg.warmup:]
        result = {
            "status": "ok",
            "world_size": cfg.world_size,
            "iteration_times_s": times,
            "timed_iterations": len(timed),
            "mean_s": statistics.fmean(timed),
            "std_s": statistics.pstdev(timed) if len(timed) > 1 else 0.0,
            "losses": losses,
            "peak_memory_bytes": [g["peak"][0] for g in gathered],
            "peak_memory_kind": peak[1],
            "rank_layers": [list(g["layers"]) for g in gathered],
            "rank_nodes": [g["where"] for g in gathered],
            "rank_p2p_per_iteration": [g["p2p"] for g in gathered],
            "rank_all_to_all_per_iteration": [g["a2a"] for g in gathered],
            "rank_expert_weights_sum": [g["experts"] for g in gathered],
            "stage_layers": [[cfg.layers[i].name for i in range(*gathered[a.rank]["layers"])]
                             for a in cfg.ranks if a.replica == 0 and a.tensor == 0],
            "versions": _versions(),
            "device": cfg.device,
            "precision": cfg.precision,
        }
    dist.barrier()
    return result


def _expert_weights_sum(module) -> float | None:
    """The sum of this rank's routed experts' weights after training (None without experts):
    ranks of one expert-data-parallel group end equal only if their gradients were reduced
    together."""
    params = [p for p in module.parameters() if getattr(p, "allreduce", True) is False]
    return float(sum(p.detach().double().sum() for p in params)) if params else None


def _where(rank: int) -> dict:
    """Where this rank ran: its host, the launcher's node rank (torchrun's GROUP_RANK, the
    deepspeed launcher's CROSS_RANK, srun's SLURM_NODEID; -1 where none is set) and pid."""
    import socket

    node = next((os.environ[k] for k in ("GROUP_RANK", "CROSS_RANK", "SLURM_NODEID")
                 if os.environ.get(k, "").isdigit()), "-1")
    return {"rank": rank, "hostname": socket.gethostname(), "node_rank": int(node),
            "pid": os.getpid()}


_PARENT_PID = os.getppid()
"""The launcher process that started this one (read as early as the module loads)."""
PR_SET_PDEATHSIG = 1
"""prctl option (linux/prctl.h): the signal a process gets when its parent dies."""


def prctl_function():
    """Linux's prctl(2) through ctypes, looked up once; None where the platform has none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


def die_with_parent(parent_pid: int = _PARENT_PID, poll_s: float = 1.0) -> None:
    """End this process as soon as its launcher process (`parent_pid`) is gone: the kernel's
    parent-death signal on Linux, a daemon thread that watches the parent pid elsewhere (and
    where the parent died before the signal was set)."""
    if os.getppid() != parent_pid:
        os._exit(1)  # the launcher is already gone
    prctl = prctl_function()
    if prctl is not None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() == parent_pid:
            return
        os._exit(1)  # the launcher died before the signal was set

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(1)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m amp_search.trial.run",
                                 description="One process of a real amp-search trial.")
    ap.add_argument("--config", required=True, type=Path, help="trial config JSON")
    args = ap.parse_args(argv)
    cfg = TrialConfig.read(args.config)
    if cfg.debug_fail:
        raise RuntimeError(cfg.debug_fail)
    if cfg.debug_hang_s > 0:
        print(f"debug: sleeping {cfg.debug_hang_s} s", flush=True)
        time.sleep(cfg.debug_hang_s)
    if cfg.iters <= cfg.warmup:
        raise SystemExit(f"iters ({cfg.iters}) must exceed warmup ({cfg.warmup})")
    result = train(cfg)
    if result is not None:
        out = Path(cfg.output)
        tmp = out.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(out)  # the launcher never sees a half-written result
        print(f"trial done: mean {result['mean_s']:.4f} s/iteration over "
              f"{result['timed_iterations']} iterations; result in {out}", flush=True)
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    return 0


ERROR_MARKER = "amp-search trial error: "
"""Prefix of the one line a failing trial process writes with a single write() call, so that
the launcher reads a clean reason even when several ranks fail at once and their tracebacks
interleave in the shared log."""


if __name__ == "__main__":
    die_with_parent()
    try:
        code = main()
    except BaseException as exc:  # report, then fail as Python would
        if not isinstance(exc, (KeyboardInterrupt, SystemExit)):
            line = f"{ERROR_MARKER}{type(exc).__name__}: {exc}".replace("\n", " ")[:400]
            os.write(2, (line + "\n").encode())
        raise
    sys.stdout.flush()
    sys.stderr.flush()
    # skip interpreter teardown: background threads of gloo / DeepSpeed sometimes abort in
    # their C++ destructors ("terminate called without an active exception") after a
    # successful run; the result is already written
    os._exit(code)
