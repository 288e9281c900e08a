"""Command lines that start one trial: local torchrun, the deepspeed launcher, torchrun per
node over ssh, or srun. Every command is an argv list (never a shell string) plus the
environment variables it adds; hostnames were validated when they were read.

Rank placement (amp_search.trial.ranks): each launcher numbers processes node after node in
the order of `launch_nodes`, and inside a node by ascending planned local device; the trial
process maps that launch rank to its global rank and device through the config, so any
placement, heterogeneous or interleaved, runs as planned:

- local      `torchrun --standalone --nproc-per-node N` on this machine; on GPUs
             CUDA_VISIBLE_DEVICES lists the planned devices (all ranks must be on one node);
- deepspeed  `deepspeed --hostfile H --include host:d0,d1@host2:... --master_addr A`, the
             hostfile holding the trial's nodes in launch order (the launcher keeps hostfile
             order and the --include device order, and sets CUDA_VISIBLE_DEVICES to it);
- torchrun   one `torchrun --nnodes K --node-rank i --nproc-per-node n_i` per node, through
             `ssh host -- ...` for remote hosts. ssh hands the remote side one command string:
             every element is quoted with shlex.quote, and hosts are validated names. A node
             whose host is this machine by its spelling (`hosts.is_loopback_host`: localhost or any
             loopback address, 127.0.0.0/8 and ::1) starts here without ssh, so a hostfile of
             127.0.0.1 and 127.0.0.2 runs two real nodes on one machine;
- slurm      `srun --distribution=arbitrary` with SLURM_HOSTFILE naming the host of every
             launch rank, one line each.

MASTER_ADDR is the host of global rank 0 (its process opens the rendezvous store), except for
torchrun per node, whose node-rank-0 agent holds the store.
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..hosts import is_loopback_host
from ..trial.ranks import RankAssignment, launch_nodes, node_devices
from .hostfile import HostSlots, format_hostfile

LAUNCHERS = ("local", "deepspeed", "torchrun", "slurm")
TRIAL_MODULE = "amp_search.trial.run"


@dataclass(frozen=True, kw_only=True)
class Command:
    """One process to start for a trial."""

    argv: tuple[str, ...]
    env: dict = field(default_factory=dict)
    """Variables set for this process on top of the launch's base environment."""
    host: str = "localhost"
    """Where the trial's ranks of this command run (informational)."""

    def display(self) -> str:
        """How the command reads in a terminal (for --dry-run; never executed as text)."""
        env = " ".join(f"{k}={shlex.quote(str(v))}" for k, v in sorted(self.env.items()))
        return (env + " " if env else "") + shlex.join(self.argv)

    def to_dict(self) -> dict:
        return {"argv": list(self.argv), "env": dict(self.env), "host": self.host}


@dataclass(frozen=True, kw_only=True)
class TrialLaunch:
    """Everything to start one trial: the commands (run together) and the files they read."""

    commands: tuple[Command, ...]
    files: dict = field(default_factory=dict)
    """path -> text, written before the commands start (hostfiles)."""

    def to_dict(self) -> dict:
        return {"commands": [c.to_dict() for c in self.commands],
                "files": {str(k): v for k, v in self.files.items()}}


@dataclass(frozen=True, kw_only=True)
class LaunchContext:
    """What a launcher needs besides the ranks."""

    python: str
    """Python executable on every host (same path on remote hosts)."""
    workdir: Path
    """Directory the trial runs in (the trial directory; must exist on remote hosts)."""
    device: str
    """cpu | cuda."""
    master_port: int = 29500
    ssh: tuple[str, ...] = ("ssh", "-o", "BatchMode=yes")
    """The ssh command (torchrun per node)."""
    node_slots: dict = field(default_factory=dict)
    """node id -> device slots of that node (for the deepspeed hostfile)."""
    trial_env: dict = field(default_factory=dict)
    """Variables every trial process needs (OMP_NUM_THREADS, PYTHONPATH, ...). Local commands
    get them from the orchestrator; remote ones carry them: in the ssh command (torchrun), in
    .deepspeed_env (which the deepspeed launcher exports to its pdsh workers), or through
    srun --export=ALL."""


@dataclass(frozen=True, kw_only=True)
class NodeLaunch:
    """The processes of one node: launch ranks offset .. offset+len(devices)-1, the i-th
    (LOCAL_RANK i) on devices[i]."""

    node: int
    host: str
    devices: tuple[int, ...]
    """Local device of each local rank, in local-rank order."""


def trial_nodes(ranks: tuple[RankAssignment, ...]) -> tuple[NodeLaunch, ...]:
    """The nodes of an amp_search.trial.run trial, in launch order, devices ascending."""
    host_of = {a.node: a.host for a in ranks}
    return tuple(NodeLaunch(node=n, host=host_of[n], devices=node_devices(ranks, n))
                 for n in launch_nodes(ranks))


def _cuda_env(device: str, devices: tuple[int, ...]) -> dict:
    return {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))} if device == "cuda" else {}


def trial_program(config_path: Path) -> tuple[str, ...]:
    """The trial program as torchrun / the deepspeed launcher take it."""
    return ("--module", TRIAL_MODULE, "--config", str(config_path))


def local_launch(nodes: tuple[NodeLaunch, ...], ctx: LaunchContext, *, rank0_host: str,
                 program: tuple[str, ...]) -> TrialLaunch:
    """All ranks on this machine through torchrun --standalone."""
    if ctx.device == "cuda" and len(nodes) > 1:
        raise UsageError(f"the local launcher runs on this machine only, but the placement "
                         f"uses {len(nodes)} nodes; use --launcher deepspeed, torchrun or "
                         f"slurm with a --hostfile")
    devices = nodes[0].devices if len(nodes) == 1 else ()
    nproc = sum(len(n.devices) for n in nodes)
    argv = (ctx.python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0", *program)
    return TrialLaunch(commands=(Command(argv=argv, env=_cuda_env(ctx.device, devices),
                                         host="localhost"),))


def deepspeed_launch(nodes: tuple[NodeLaunch, ...], ctx: LaunchContext, *, rank0_host: str,
                     program: tuple[str, ...]) -> TrialLaunch:
    """The `deepspeed` launcher with a hostfile of the trial's nodes and --include."""
    hostfile = ctx.workdir / "hostfile"
    hosts = tuple(HostSlots(host=n.host, slots=max(ctx.node_slots.get(n.node, 0),
                                                   max(n.devices) + 1)) for n in nodes)
    include = "@".join(f"{n.host}:{','.join(map(str, n.devices))}" for n in nodes)
    argv = (ctx.python, "-m", "deepspeed.launcher.runner", "--hostfile", str(hostfile),
            "--include", include, "--master_addr", rank0_host,
            "--master_port", str(ctx.master_port), "--no_local_rank",
            # one local host: nothing to reach over ssh (the runner would insist on it);
            # with several nodes the runner reaches every one, loopback ones too, over
            # pdsh/ssh, so the check stays
            *(("--no_ssh_check",) if len(nodes) == 1 and is_loopback_host(nodes[0].host)
              else ()),
            *program)
    files = {hostfile: format_hostfile(hosts)}
    if ctx.trial_env:
        files[ctx.workdir / ".deepspeed_env"] = "".join(
            f"{k}={v}\n" for k, v in sorted(ctx.trial_env.items()))
    return TrialLaunch(commands=(Command(argv=argv, host=nodes[0].host),), files=files)


def torchrun_node(nodes: tuple[NodeLaunch, ...], i: int, ctx: LaunchContext, *,
                  program: tuple[str, ...]) -> Command:
    """The torchrun of node i of a multi-node launch, as run on that node: static rendezvous
    at the first node, CUDA_VISIBLE_DEVICES = the node's planned devices in local-rank order
    (what `torchrun_launch` runs over ssh, and `amp-search export` writes per node)."""
    n = nodes[i]
    argv = (ctx.python, "-m", "torch.distributed.run", "--nnodes", str(len(nodes)),
            "--node-rank", str(i), "--nproc-per-node", str(len(n.devices)),
            "--master-addr", nodes[0].host, "--master-port", str(ctx.master_port),
            "--max-restarts", "0", *program)
    return Command(argv=argv, env=_cuda_env(ctx.device, n.devices), host=n.host)


def torchrun_launch(nodes: tuple[NodeLaunch, ...], ctx: LaunchContext, *, rank0_host: str,
                    program: tuple[str, ...]) -> TrialLaunch:
    """One torchrun per node (static rendezvous at the first node), remote ones over ssh."""
    commands = []
    for i, n in enumerate(nodes):
        host = n.host
        node = torchrun_node(nodes, i, ctx, program=program)
        inner, env = node.argv, node.env
        if is_loopback_host(host):
            commands.append(Command(argv=inner, env=env, host=host))
            continue
        remote = ["cd", str(ctx.workdir), "&&", "env",
                  *(f"{k}={v}" for k, v in sorted({**ctx.trial_env, **env}.items())), *inner]
        # ssh passes one string to the remote shell: quote every element of it
        commands.append(Command(argv=(*ctx.ssh, host, "--",
                                      " ".join(x if x == "&&" else shlex.quote(x)
                                               for x in remote)), host=host))
    return TrialLaunch(commands=tuple(commands))


def slurm_launch(nodes: tuple[NodeLaunch, ...], ctx: LaunchContext, *, rank0_host: str,
                 program: tuple[str, ...]) -> TrialLaunch:
    """srun with one task per rank, placed by SLURM_HOSTFILE (--distribution=arbitrary);
    each task sees all of its node's GPUs and the trial picks its planned one."""
    hostfile = ctx.workdir / "slurm_hostfile"
    text = "".join(f"{n.host}\n" * len(n.devices) for n in nodes)
    if program[:1] == ("--module",):
        program = ("-m", *program[1:])
    argv = ("srun", "--nodes", str(len(nodes)), "--ntasks", str(sum(len(n.devices)
                                                                   for n in nodes)),
            "--distribution=arbitrary", "--nodelist", ",".join(n.host for n in nodes),
            "--kill-on-bad-exit=1", "--export=ALL",
            *(("--gpu-bind=none",) if ctx.device == "cuda" else ()), ctx.python, *program)
    env = {"SLURM_HOSTFILE": str(hostfile), "MASTER_ADDR": rank0_host,
           "MASTER_PORT": str(ctx.master_port)}
    return TrialLaunch(commands=(Command(argv=argv, env=env, host=nodes[0].host),),
                       files={hostfile: text})


BUILDERS = {"local": local_launch, "deepspeed": deepspeed_launch, "torchrun": torchrun_launch,
            "slurm": slurm_launch}


def build_launch(launcher: str, ranks: tuple[RankAssignment, ...], ctx: LaunchContext,
                 config_path: Path) -> TrialLaunch:
    """The commands of one amp_search.trial.run trial under `launcher`."""
    if launcher not in BUILDERS:
        raise UsageError(f"unknown launcher {launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    return BUILDERS[launcher](trial_nodes(ranks), ctx, rank0_host=ranks[0].host,
                              program=trial_program(config_path))
