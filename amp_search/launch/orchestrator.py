"""AMP Algorithm 1, last step: run the top predicted strategies for real, one after another,
record every trial, and pick the fastest measured one.

    run_trials(spec, [Estimate | Strategy | TrialRequest, ...], LaunchOptions(...))
        -> [TrialRecord, ...]          (best_trial(records) is the winner)

Per trial: a trial directory (trial.json, ds_config.json, hostfiles, trial-record.json,
log.txt, result.json), a `running` row in the results database, the launcher's commands run to
the end or to the timeout, then the row's final status: ok | oom | failed | timeout (or
interrupted on Ctrl-C, which stops the trial's processes and re-raises). Trials that finished
for good before (same spec hash, strategy, partition, placement, backend: ok, a real
out-of-memory, an invalid plan) are not run again; a failure that may not recur (a rank that
was killed, a crash, a timeout) is, unless `retry_transient` is off.

Nothing measured is lost:
- launches sharing a database take turns, one trial at a time (results_db.TrialLock), so no
  trial runs twice at once and no two trials skew each other's times;
- each time a launch takes the turn, it recovers the rows left `running` by a launch that is
  gone (`recover_orphans`): it ends that trial's processes still alive, and records the
  result.json the trial left (or marks the row interrupted, to run again);
- a database that cannot be written stops the launch with one line; the trial's measurement
  stays in its folder, whose trial-record.json lets the next launch (or `amp-search results`)
  record it, even into a new database at the same path.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterable

from ..errors import UsageError
from ..machine_load import OtherLoad
from ..records import Estimate, Strategy
from ..spec import Spec
from ..trial.config import trial_config, trial_device, trial_env, trial_precision
from ..trial.ranks import RankAssignment, assign_ranks
from .hostfile import HostSlots
from .launchers import LAUNCHERS, BUILDERS, LaunchContext, TrialLaunch, build_launch
from .megatron import (check_gpt_chain, megatron_args, megatron_nodes, megatron_program,
                       training_kwargs,
                       megatron_unsupported, megatron_unsupported_gradients,
                       overlaps_moe_a2a, parse_megatron_log, runs_flex_dispatcher)
from .process import (TRIAL_DIR_VAR, classify_failure, failure_reason, log_tail,
                      oom_kill_count, out_of_memory_in, run_commands, stop_trial_processes)
from .results_db import (FINISHED, ResultRow, ResultsDB, ResultsDBError, TrialLock,
                         holder_text, launch_alive, this_launch)

BACKENDS = ("deepspeed", "megatron")
DEFAULT_RESULTS_NAME = "amp-search-results.sqlite"
TRIAL_RECORD_NAME = "trial-record.json"
"""In each trial folder: what its database row holds at the start (spec, strategy, launch,
database), so the folder alone can be recorded again."""
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
"""The directory holding amp_search/ and cost_models/ (put on the trials' PYTHONPATH)."""


@dataclass(frozen=True, kw_only=True)
class LaunchOptions:
    """How to run the trials."""

    backend: str = "deepspeed"
    """deepspeed (amp_search.trial.run) | megatron (Megatron-LM pretrain_gpt.py)."""
    launcher: str = "local"
    """local | deepspeed | torchrun | slurm."""
    hostfile: tuple[HostSlots, ...] | None = None
    """Hosts of the spec's nodes, in spec node order (overrides cluster.nodes[].hosts)."""
    iters: int = 40
    """Iterations per trial, warm-up included (AMP: 40)."""
    warmup: int = 20
    """Leading iterations left out of the mean (AMP: mean of the last 20)."""
    trial_timeout_s: float = 1800.0
    """A trial running longer is stopped and recorded as `timeout`."""
    budget_s: float | None = None
    """Wall-clock budget for all trials; later trials are skipped once it is spent."""
    dry_run: bool = False
    """Write the trial files and report the commands; start nothing, record nothing."""
    results_path: Path | None = None
    """The SQLite results database (default: amp-search-results.sqlite beside the spec)."""
    runs_dir: Path | None = None
    """Where trial directories go (default: runs/ beside the spec)."""
    python: str = sys.executable
    """Python interpreter of the trials (same path on every host)."""
    megatron_path: Path | None = None
    """Megatron-LM checkout (megatron backend)."""
    master_port: int = 29500
    """Rendezvous port of multi-node launches (the local launcher picks a free one)."""
    seed: int = 1234
    retry_failed: bool = False
    """Run again trials that finished as oom / failed / timeout (ok ones are always kept)."""
    retry_transient: bool = True
    """Run again trials whose failure may not recur (a killed rank, a crash, a timeout);
    False keeps every finished trial (`launch --no-retry`)."""
    progress: bool = False
    """Show a tqdm progress bar on stderr."""
    base_env: dict = field(default_factory=dict)
    """Environment the trial processes start from (the CLI passes its own)."""
    ssh: tuple[str, ...] = ("ssh", "-o", "BatchMode=yes")


@dataclass(frozen=True, kw_only=True)
class TrialRequest:
    """One strategy to run, with its prediction and optional debug behaviour (tests)."""

    strategy: Strategy
    predicted_s: float | None = None
    debug_fail: str = ""
    """Make every trial process raise this message at start-up."""
    debug_hang_s: float = 0.0
    """Make every trial process sleep this long at start-up."""
    machine_speed: float | None = None
    """The machine's speed probe just before the trial over the layer profile's
    (amp_search.profiling.speed); `predicted_s` already carries it. None: not measured."""


@dataclass(frozen=True, kw_only=True)
class TrialRecord:
    """The outcome of one trial."""

    index: int
    """1-based position in the launch (the plan's rank among the trials)."""
    label: str
    strategy: Strategy
    predicted_s: float | None
    status: str
    """ok | oom | failed | timeout | interrupted | skipped (budget) | dry-run."""
    cached: bool = False
    """Finished in an earlier launch; taken from the database, not run again."""
    measured_mean_s: float | None = None
    measured_std_s: float | None = None
    peak_memory_bytes: int | None = None
    """Largest over the ranks."""
    peak_memory_kind: str = ""
    """cuda_max_memory_allocated, or cpu_max_rss_approx (whole-process RSS on CPU)."""
    error: str = ""
    """Why it did not end ok: one line."""
    final: bool = False
    """Kept for good: the next launch does not run it again (ok, a real out-of-memory, an
    invalid plan)."""
    log_tail: str = ""
    log_path: str | None = None
    trial_dir: str | None = None
    row_id: int | None = None
    versions: dict = field(default_factory=dict)
    losses: tuple[float, ...] = ()
    started_at: str | None = None
    ended_at: str | None = None
    wall_s: float | None = None
    other_processes_cores: float | None = None
    """Cores other programs kept busy while the trial ran (local launcher only; None where it
    cannot be told): above `machine_load.BUSY_CORES` the measured time may be high."""
    machine_speed: float | None = None
    """The machine's speed probe before the trial over the layer profile's, by which its
    prediction was scaled (`TrialRequest.machine_speed`); None: not measured. Not kept in the
    results database."""
    commands: tuple[str, ...] = ()
    """The commands as they read in a terminal."""
    files: dict = field(default_factory=dict)
    """dry-run: path -> text of the files the trial would read (trial.json, ds_config.json,
    hostfiles)."""

    @property
    def measured_s(self) -> float | None:
        """Measured seconds per iteration (the name amp_search.calibrate reads)."""
        return self.measured_mean_s

    def to_dict(self) -> dict:
        return {
            "index": self.index, "label": self.label, "strategy": self.strategy.to_dict(),
            "predicted_s": self.predicted_s, "status": self.status, "cached": self.cached,
            "measured_mean_s": self.measured_mean_s, "measured_std_s": self.measured_std_s,
            "peak_memory_bytes": self.peak_memory_bytes,
            "peak_memory_kind": self.peak_memory_kind, "error": self.error,
            "final": self.final, "log_tail": self.log_tail, "log_path": self.log_path,
            "trial_dir": self.trial_dir, "row_id": self.row_id, "versions": self.versions,
            "losses": list(self.losses), "started_at": self.started_at,
            "ended_at": self.ended_at, "wall_s": self.wall_s,
            "other_processes_cores": self.other_processes_cores,
            "machine_speed": self.machine_speed,
            "commands": list(self.commands),
            "files": dict(self.files),
        }


# ----------------------------------------------------------------------------- helpers

def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def trial_key(strategy: Strategy, backend: str) -> str:
    """What identifies a trial within a spec: strategy label + partition + placement."""
    return (f"{backend}|{strategy.label()}|partition={','.join(map(str, strategy.partition))}"
            f"|placement={json.dumps([[list(r) for r in s] for s in strategy.placement])}")


def default_results_path(spec: Spec) -> Path:
    """amp-search-results.sqlite beside the spec."""
    return (spec.path.resolve().parent if spec.path else Path.cwd()) / DEFAULT_RESULTS_NAME


def trial_requests(items: Iterable) -> list[TrialRequest]:
    """What to run, from Estimates (their prediction kept), Strategies or TrialRequests."""
    out = []
    for x in items:
        if isinstance(x, TrialRequest):
            out.append(x)
        elif isinstance(x, Estimate):
            out.append(TrialRequest(strategy=x.strategy, predicted_s=x.iteration_time_s))
        elif isinstance(x, Strategy):
            out.append(TrialRequest(strategy=x))
        else:
            raise TypeError(f"expected Estimate, Strategy or TrialRequest, got {type(x)}")
    return out


def node_hosts(spec: Spec, options: LaunchOptions) -> dict[int, str]:
    """node id -> host: from the hostfile (line i = node i), else the spec's hosts, else
    localhost for the local launcher."""
    nodes = spec.cluster.nodes
    if options.launcher == "local":
        return {n.id: "localhost" for n in nodes}
    if options.hostfile is not None:
        hf = options.hostfile
        if len(hf) < len(nodes):
            raise UsageError(f"the hostfile lists {len(hf)} hosts but the spec has "
                             f"{len(nodes)} nodes; list one host per node, in spec order")
        for n, h in zip(nodes, hf):
            if h.slots < len(n.devices):
                raise UsageError(f"hostfile: {h.host} has slots={h.slots} but node {n.id} "
                                 f"({n.gpu.name}) has {len(n.devices)} devices in the spec")
        return {n.id: h.host for n, h in zip(nodes, hf)}
    if all(n.host for n in nodes):
        return {n.id: n.host for n in nodes}
    raise UsageError(f"--launcher {options.launcher} needs the nodes' hostnames: give "
                     f"--hostfile (one 'host slots=N' per node) or cluster.nodes[].hosts")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def splits_layers(partition, num_layers: int, parts: int) -> bool:
    """Whether `partition` (boundaries) splits num_layers layers into `parts` non-empty,
    consecutive parts: 0 = b_0 < b_1 < ... < b_parts = num_layers."""
    p = list(partition)
    return len(p) == parts + 1 and p[0] == 0 and p[-1] == num_layers and \
        all(a < b for a, b in zip(p, p[1:]))


def preflight(spec: Spec, strategy: Strategy, backend: str) -> str:
    """Why the strategy cannot run as a trial ('' if it can)."""
    s = strategy
    n = len(spec.model.layers)
    p = s.partition
    chunks = s.pp * s.virtual_stages
    if not splits_layers(p, n, chunks):
        return (f"partition {list(p)} does not split {n} layers into {chunks} non-empty "
                f"{'stages' if s.virtual_stages == 1 else 'model chunks'}")
    if s.cp > 1 and backend == "deepspeed":
        return (f"cp {s.cp}: context parallelism is Megatron-LM's ring attention; DeepSpeed's "
                f"PipelineEngine has none (use the megatron backend, or cp 1)")
    if s.virtual_stages > 1 and backend == "deepspeed":
        return (f"virtual_stages {s.virtual_stages}: DeepSpeed's PipelineEngine has no "
                f"interleaved schedule (use the megatron backend, or virtual_stages 1)")
    if s.virtual_stages > 1 and backend == "megatron" and (s.pp < 2 or s.gas % s.pp):
        return (f"virtual_stages {s.virtual_stages}: Megatron-LM's interleaved schedule needs "
                f"pp > 1 and the micro-batch count ({s.gas}) a multiple of pp ({s.pp})")
    if s.global_batch_size % (s.dp * s.mbs):
        return (f"global batch {s.global_batch_size} is not a multiple of dp x mbs = "
                f"{s.dp} x {s.mbs}")
    if backend == "megatron" and megatron_unsupported(s):
        return megatron_unsupported(s)
    if backend == "megatron" and megatron_unsupported_gradients(
            spec.training.precision, spec.training.grad_reduce_in_fp32):
        return megatron_unsupported_gradients(spec.training.precision,
                                              spec.training.grad_reduce_in_fp32)
    if spec.training.finetune != "none":
        return (f"training.finetune {spec.training.finetune}: the trial program and "
                f"Megatron-LM's pretrain_gpt.py train every weight (LoRA runs in "
                f"Megatron-Bridge or NeMo); the plan costs it, but it is not launched or "
                f"exported here")
    # Transformer Engine's and megatron-core's CUDA-only features, asked for on CPUs
    cpu_megatron = backend == "megatron" and any(g.gpu.kind == "cpu"
                                                 for g in spec.cluster.node_groups)
    moe = next((x for x in spec.model.layers if x.is_moe), None)
    if cpu_megatron and spec.training.tp_comm_overlap and s.tmp > 1 and s.sequence_parallel:
        return ("training.tp_comm_overlap (Transformer Engine's userbuffers) needs CUDA: these "
                "devices are CPUs; set it false here")
    if cpu_megatron and spec.training.cpu_offload_layers:
        return ("training.cpu_offload_layers (Transformer Engine's activation offloading) "
                "needs CUDA: these devices are CPUs; set it to 0 here")
    if cpu_megatron and spec.training.moe_a2a_overlap and moe is not None \
            and overlaps_moe_a2a(s, moe):
        return ("training.moe_a2a_overlap (--overlap-moe-expert-parallel-comm, delayed "
                "weight gradients on Transformer Engine) needs CUDA: these devices are CPUs; "
                "set it false here")
    if cpu_megatron and moe is not None and runs_flex_dispatcher(s, moe,
                                                                  spec.training.moe_dispatcher):
        return (f"training.moe_dispatcher {spec.training.moe_dispatcher} (megatron-core's flex "
                f"dispatcher on its CUDA library) needs CUDA: these devices are CPUs; use "
                f"alltoall here")
    if cpu_megatron and s.zero_stage == 3:
        return ("zero_stage 3 (Megatron-FSDP) needs CUDA: these devices are CPUs; use "
                "zero_stage 0 or 1 here")
    if backend == "deepspeed" and spec.model.num_experts and (
            s.zero_stage or spec.training.precision != "fp32"):
        return (f"a model with experts runs under DeepSpeed with ZeRO 0 in fp32 only (got ZeRO "
                f"{s.zero_stage}, {spec.training.precision}): the trials' expert layer is not "
                f"DeepSpeed's own, whose ZeRO and bf16 optimizers would reduce its gradients "
                f"over the whole data-parallel group (use the megatron backend)")
    if backend == "deepspeed" and s.pp > 1 and s.zero_stage >= 2:
        return (f"DeepSpeed's pipeline engine rejects ZeRO stage {s.zero_stage} with pp={s.pp}"
                f" (ZeRO 0 or 1 only)")
    return ""


def best_trial(records: list[TrialRecord]) -> TrialRecord | None:
    """The fastest measured trial that ended ok."""
    ok = [r for r in records if r.status == "ok" and r.measured_mean_s is not None]
    return min(ok, key=lambda r: r.measured_mean_s) if ok else None


def check_options(spec: Spec, options: LaunchOptions) -> None:
    """Refuse options that cannot launch (UsageError naming the flag and what is accepted):
    backend, launcher, iterations and warm-up, the trial timeout, layers a trial can run, and
    Megatron-LM's own needs."""
    if options.backend not in BACKENDS:
        raise UsageError(f"--backend {options.backend!r}; accepted: {', '.join(BACKENDS)}")
    if options.launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {options.launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    if options.iters < 1 or not 0 <= options.warmup < options.iters:
        raise UsageError(f"--iters {options.iters} --warmup {options.warmup}: need "
                         f"iters >= 1 and 0 <= warmup < iters (AMP: --iters 40 --warmup 20)")
    if options.trial_timeout_s <= 0:
        raise UsageError(f"--trial-timeout must be positive, got {options.trial_timeout_s}")
    custom = [x.name for x in spec.model.layers if x.kind == "custom"]
    if custom:
        raise UsageError(f"layer {custom[0]!r} is a custom layer (given only by FLOPs, "
                         f"parameters and output size); real trials cannot run it")
    if options.backend == "deepspeed" and any(x.tie_embeddings for x in spec.model.layers):
        raise UsageError("model.tie_embeddings: true: the DeepSpeed trials run untied "
                         "embeddings (sharing the matrix between the first and last stage is "
                         "not built); set tie_embeddings: false to launch them, or use "
                         "--backend megatron")
    if options.backend == "megatron":
        check_gpt_chain(spec.model.layers)
        if options.launcher == "slurm":
            raise UsageError("the megatron backend runs under --launcher local, torchrun or "
                             "deepspeed (Megatron-LM reads torchrun's RANK / LOCAL_RANK)")
        if options.megatron_path is None:
            raise UsageError("--backend megatron needs --megatron-path (a Megatron-LM checkout)")
        script = Path(options.megatron_path) / "pretrain_gpt.py"
        if not options.dry_run and not script.is_file():
            raise UsageError(f"{script} not found; --megatron-path must point to a "
                             f"Megatron-LM checkout")


# ----------------------------------------------------------------------------- one trial

@dataclass(frozen=True, kw_only=True)
class _Prepared:
    trial_dir: Path
    config_path: Path
    result_path: Path
    log_path: Path
    launch: TrialLaunch
    env: dict
    files: dict
    """path -> text of every file the trial reads (written unless dry-run)."""


def _prepare(spec: Spec, req: TrialRequest, index: int, ranks: tuple[RankAssignment, ...],
             options: LaunchOptions, runs_dir: Path) -> _Prepared:
    s = req.strategy
    key_hash = hashlib.sha256(trial_key(s, options.backend).encode()).hexdigest()[:8]
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    trial_dir = runs_dir / f"{index:02d}-{s.label()}-{key_hash}-{stamp}"
    k = 1
    while trial_dir.exists():
        k += 1
        trial_dir = runs_dir / f"{index:02d}-{s.label()}-{key_hash}-{stamp}-{k}"
    config_path = trial_dir / "trial.json"
    result_path = trial_dir / "result.json"
    cfg = trial_config(spec, s, ranks, iters=options.iters, warmup=options.warmup,
                       seed=options.seed, output=str(result_path), debug_fail=req.debug_fail,
                       debug_hang_s=req.debug_hang_s)
    device, precision = cfg.device, cfg.precision
    files = {config_path: json.dumps(cfg.to_dict(), indent=1),
             trial_dir / "ds_config.json": json.dumps(cfg.ds_config, indent=1)}
    env = trial_env(device, options.backend, str(PACKAGE_ROOT) + (
        ":" + options.base_env["PYTHONPATH"] if options.base_env.get("PYTHONPATH") else ""))
    port = _free_port() if options.launcher == "local" else options.master_port
    ctx = LaunchContext(python=options.python, workdir=trial_dir, device=device,
                        master_port=port, ssh=options.ssh, trial_env=env,
                        node_slots={n.id: len(n.devices) for n in spec.cluster.nodes})
    if options.backend == "megatron":
        args = megatron_args(spec.model.layers, s, precision=precision, iters=options.iters,
                             seed=options.seed, **training_kwargs(spec.training, s))
        program = megatron_program(options.megatron_path, args)
        launch = BUILDERS[options.launcher](megatron_nodes(ranks), ctx,
                                            rank0_host=ranks[0].host, program=program)
        files[trial_dir / "megatron_args.json"] = json.dumps(args, indent=1)
    else:
        launch = build_launch(options.launcher, ranks, ctx, config_path)
    files.update(launch.files)
    files[trial_dir / "commands.json"] = json.dumps(launch.to_dict(), indent=1)
    if not options.dry_run:
        trial_dir.mkdir(parents=True)
        for path, text in files.items():
            Path(path).write_text(text)
    return _Prepared(trial_dir=trial_dir, config_path=config_path, result_path=result_path,
                     log_path=trial_dir / "log.txt", launch=launch, env=env,
                     files={str(k): v for k, v in files.items()})


def _from_row(index: int, req: TrialRequest, row) -> TrialRecord:
    res = row.result or {}
    return TrialRecord(
        index=index, label=row.label, strategy=req.strategy,
        predicted_s=req.predicted_s if req.predicted_s is not None else row.predicted_s,
        status=row.status, cached=True, final=row.final, measured_mean_s=row.measured_mean_s,
        measured_std_s=row.measured_std_s, peak_memory_bytes=row.peak_memory_bytes,
        peak_memory_kind=row.peak_memory_kind or "", error=(row.error or "").splitlines()[0]
        if row.error else "", log_path=row.log_path, row_id=row.id, versions=row.versions,
        losses=tuple(res.get("losses", ())), started_at=row.started_at, ended_at=row.ended_at,
        other_processes_cores=res.get("other_processes_cores"))


def _run_one(spec: Spec, req: TrialRequest, index: int, options: LaunchOptions,
             db: ResultsDB | None, runs_dir: Path, hosts: dict[int, str],
             timeout_s: float, budget_limited: bool) -> TrialRecord:
    s = req.strategy
    base = dict(index=index, label=s.label(), strategy=s, predicted_s=req.predicted_s,
                machine_speed=req.machine_speed)
    reason = preflight(spec, s, options.backend)
    device_node = {d.id: (d.node, d.local_rank) for d in spec.cluster.devices}
    if not reason:
        try:
            ranks = assign_ranks(s, device_node, hosts)
        except (KeyError, IndexError):
            reason = "the placement names devices the spec does not have"
    if reason:
        if options.dry_run:
            return TrialRecord(**base, status="dry-run", error=reason)
        now = _now()
        row = db.start(spec_sha256=spec.sha256, spec_path=str(spec.path), label=s.label(),
                       trial_key=trial_key(s, options.backend), backend=options.backend,
                       launcher=options.launcher, strategy=s.to_dict(),
                       predicted_s=req.predicted_s, iters=options.iters,
                       warmup=options.warmup, log_path="", started_at=now)
        db.finish(row, status="failed", ended_at=now, error=reason, final=True)
        return TrialRecord(**base, status="failed", error=reason, final=True, row_id=row,
                           started_at=now, ended_at=now)

    prep = _prepare(spec, req, index, ranks, options, runs_dir)
    commands = tuple(c.display() for c in prep.launch.commands)
    base.update(trial_dir=str(prep.trial_dir), log_path=str(prep.log_path), commands=commands)
    if options.dry_run:
        return TrialRecord(**base, status="dry-run", files=prep.files)

    started = _now()
    record = dict(spec_sha256=spec.sha256, spec_path=str(spec.path), label=s.label(),
                  trial_key=trial_key(s, options.backend), backend=options.backend,
                  launcher=options.launcher, strategy=s.to_dict(), predicted_s=req.predicted_s,
                  iters=options.iters, warmup=options.warmup, log_path=str(prep.log_path),
                  started_at=started, trial_dir=str(prep.trial_dir), **this_launch())
    try:
        row = db.start(**record)
    except ResultsDBError:
        shutil.rmtree(prep.trial_dir, ignore_errors=True)  # nothing ran: leave no folder
        raise
    try:
        (prep.trial_dir / TRIAL_RECORD_NAME).write_text(json.dumps(
            {**record, "results_db": str(db.path.resolve()), "row_id": row}, indent=1))
    except OSError as exc:
        db.finish(row, status="interrupted", ended_at=_now(),
                  error=f"cannot write {TRIAL_RECORD_NAME}: {exc.strerror or exc}")
        raise UsageError(f"cannot write {prep.trial_dir / TRIAL_RECORD_NAME}: "
                         f"{exc.strerror or exc}") from None
    base.update(row_id=row, started_at=started)
    # what other programs used meanwhile: only this machine's processes are counted, so only
    # for trials whose every process runs here
    load = OtherLoad() if options.launcher == "local" else None
    oom_before = oom_kill_count()
    try:
        outcome = run_commands(prep.launch.commands,
                               base_env={**options.base_env, **prep.env,
                                         TRIAL_DIR_VAR: str(prep.trial_dir)},
                               cwd=prep.trial_dir, log_path=prep.log_path, timeout_s=timeout_s)
    except KeyboardInterrupt:
        try:
            db.finish(row, status="interrupted", ended_at=_now(), error="interrupted (Ctrl-C)",
                      final=False)
        except ResultsDBError:
            pass  # the row stays running; the next launch finds it interrupted
        raise
    oom_after = oom_kill_count()
    oom_killed = oom_before is not None and oom_after is not None and oom_after > oom_before
    ended = _now()
    others = None if load is None else load.others_cores()
    base.update(other_processes_cores=others)
    long_tail = log_tail(prep.log_path, 300)  # torchrun's report follows the real error
    tail = "\n".join(long_tail.splitlines()[-20:])
    # a result is written (atomically) before teardown: a crash after it does not void it
    result = _read_result(prep, options) if outcome.ok or (
        not outcome.timed_out and options.backend == "deepspeed") else None
    if result is not None and result.get("mean_s") is not None:
        if others is not None:
            result = {**result, "other_processes_cores": others}
        measured = _measured(result)
        _finish(db, prep, row, s.label(), status="ok", ended_at=ended, final=True, **measured)
        del measured["result"]
        return TrialRecord(**base, status="ok", final=True, **measured,
                           losses=tuple(result.get("losses", ())), ended_at=ended,
                           wall_s=outcome.wall_s,
                           error="" if outcome.ok else f"exit codes "
                           f"{list(outcome.returncodes)} after the result was written")
    final = False
    if outcome.ok:
        status, error = "failed", "the trial exited without writing its result"
    else:
        status = classify_failure(outcome, long_tail, oom_killed=oom_killed)
        if status == "timeout":
            error = f"stopped after {timeout_s:.0f} s" + (
                " (the launch budget ran out)" if budget_limited else " (--trial-timeout)")
            if budget_limited:
                status = "interrupted"  # not the trial's fault: run it again next time
        else:
            error = failure_reason(outcome, long_tail, oom_killed=oom_killed)
            # the log says memory ran out: the same strategy runs out again (an OOM kill by the
            # kernel may have been another program's doing: tried again)
            final = status == "oom" and out_of_memory_in(long_tail)
    _finish(db, prep, row, s.label(), status=status, ended_at=ended, error=error + "\n" + tail,
            final=final)
    return TrialRecord(**base, status=status, error=error, final=final, log_tail=tail,
                       ended_at=ended, wall_s=outcome.wall_s)


def _finish(db: ResultsDB, prep: _Prepared, row: int, label: str, **kw) -> None:
    """db.finish; where the database cannot be written, one line that says where the trial's
    outcome stays and who records it."""
    try:
        db.finish(row, **kw)
    except ResultsDBError as exc:
        kept = (f"its measurement stays in {prep.result_path}" if kw["status"] == "ok"
                else f"its log stays in {prep.log_path}")
        raise ResultsDBError(f"{exc}; trial {label} ended {kw['status']}: {kept} and the next "
                             f"launch or `amp-search results` records it",
                             damaged=exc.damaged) from None


def _read_result(prep: _Prepared, options: LaunchOptions) -> dict | None:
    if options.backend == "megatron":
        try:
            text = prep.log_path.read_text(errors="replace")
        except OSError:
            return None
        res = parse_megatron_log(text, warmup=options.warmup)
        prep.result_path.write_text(json.dumps(res, indent=1))
        return res
    try:
        return json.loads(prep.result_path.read_text())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------- recovery

@dataclass(frozen=True, kw_only=True)
class Recovery:
    """What `recover_orphans` did."""

    recorded: tuple[str, ...] = ()
    """Labels of trials whose result.json was recorded (their launch had died)."""
    interrupted: tuple[str, ...] = ()
    """Labels of trials marked interrupted (their launch died before a result)."""
    imported: tuple[str, ...] = ()
    """Labels of measured trials taken from folders no row named (a new database)."""
    processes_ended: tuple[int, ...] = ()
    """Pids of trial processes a dead launch had left running."""

    def __bool__(self) -> bool:
        return bool(self.recorded or self.interrupted or self.imported or self.processes_ended)

    def summary(self) -> str:
        """One line (for the user), '' when nothing was done."""
        parts = []
        if self.recorded:
            parts.append(f"recorded the result of {len(self.recorded)} trial(s) whose launch "
                         f"had died ({', '.join(self.recorded)})")
        if self.interrupted:
            parts.append(f"marked {len(self.interrupted)} trial(s) interrupted whose launch had "
                         f"died before a result ({', '.join(self.interrupted)})")
        if self.imported:
            parts.append(f"took {len(self.imported)} measured trial(s) back from their folders "
                         f"({', '.join(self.imported)})")
        if self.processes_ended:
            parts.append(f"ended {len(self.processes_ended)} process(es) they had left running")
        return "; ".join(parts)


def _result_in(folder: Path, backend: str, warmup: int | None) -> dict | None:
    """The measured result a trial folder holds (result.json, or Megatron's log)."""
    try:
        res = json.loads((folder / "result.json").read_text())
    except (OSError, ValueError):
        res = None
        if backend == "megatron":
            try:
                res = parse_megatron_log((folder / "log.txt").read_text(errors="replace"),
                                         warmup=warmup or 0)
            except (OSError, ValueError):
                res = None
    return res if isinstance(res, dict) and res.get("mean_s") is not None else None


def _measured(res: dict) -> dict:
    """What a trial's result gives its row (and its TrialRecord, less `result`)."""
    peaks = res.get("peak_memory_bytes") or []
    return dict(measured_mean_s=res["mean_s"], measured_std_s=res.get("std_s"),
                peak_memory_bytes=max(peaks) if peaks else None,
                peak_memory_kind=res.get("peak_memory_kind", ""),
                versions=res.get("versions", {}), result=res)


def _orphaned(row: ResultRow, own_rows_orphaned: bool) -> bool:
    if row.launcher_pid is None:  # schema 1: no launch recorded; a folder with a result only
        return True
    if row.launcher_host != socket.gethostname():
        return False  # another machine's launch: cannot tell
    if row.launcher_pid == os.getpid():
        return own_rows_orphaned
    return launch_alive(row) is False


def recover_orphans(db: ResultsDB, *, runs_dirs: Iterable[Path] = (),
                    own_rows_orphaned: bool = False) -> Recovery:
    """Complete the rows left `running` by a launch that is gone (on this host): end the
    trial's processes still alive, record the result.json it left (ok), else mark it
    interrupted (it runs again). Rows of schema 1 (no launch recorded) are completed only
    from a result. Then record the measured trials of folders under `runs_dirs` whose
    trial-record.json names this database but no row does (the file was started afresh).

    `own_rows_orphaned`: rows of this very process count as orphaned (a launch holding the
    TrialLock runs no trial of its own at that moment)."""
    recorded, interrupted, imported, ended = [], [], [], []
    for row in db.running():
        if not _orphaned(row, own_rows_orphaned):
            continue
        folder = row.folder
        if row.launcher_pid is not None and folder is not None:
            ended += stop_trial_processes(folder)
        res = None if folder is None else _result_in(folder, row.backend, row.warmup)
        who = ("an earlier amp-search launch" if row.launcher_pid is None else
               f"its launch (pid {row.launcher_pid} on {row.launcher_host})")
        if res is not None:
            if db.finish(row.id, status="ok", ended_at=_now(), final=True, only_running=True,
                         error=f"recorded after {who} ended", **_measured(res)):
                recorded.append(row.label)
        elif row.launcher_pid is not None:
            tail = "" if folder is None else log_tail(folder / "log.txt", 20)
            if db.finish(row.id, status="interrupted", ended_at=_now(), final=False,
                         only_running=True,
                         error=f"{who} ended while the trial ran" + ("\n" + tail if tail
                                                                      else "")):
                interrupted.append(row.label)
    known = None
    here = str(db.path.resolve())
    for runs in runs_dirs:
        for rec_path in sorted(Path(runs).glob(f"*/{TRIAL_RECORD_NAME}")):
            try:
                rec = json.loads(rec_path.read_text())
            except (OSError, ValueError):
                continue
            if not isinstance(rec, dict) or rec.get("results_db") != here:
                continue
            folder = rec_path.parent
            if known is None:
                known = db.trial_dirs()
            if str(folder) in known or rec.get("trial_dir") in known:
                continue
            res = _result_in(folder, rec.get("backend", "deepspeed"), rec.get("warmup"))
            if res is None:
                continue
            try:
                fields = {k: rec[k] for k in ("spec_sha256", "trial_key", "label", "backend",
                                              "launcher", "strategy", "started_at")}
            except KeyError:
                continue
            fields.update({k: rec.get(k) for k in ("spec_path", "predicted_s", "iters",
                                                   "warmup", "log_path", "launcher_pid",
                                                   "launcher_host", "launcher_started")})
            if db.import_trial(trial_dir=str(folder), status="ok", final=True,
                               ended_at=_now(), error="recorded again from its folder",
                               **fields, **_measured(res)) is not None:
                imported.append(str(rec["label"]))
    return Recovery(recorded=tuple(recorded), interrupted=tuple(interrupted),
                    imported=tuple(imported), processes_ended=tuple(ended))


# ----------------------------------------------------------------------------- all trials

def run_trials(spec: Spec, items: Iterable, options: LaunchOptions | None = None, *,
               on_record: Callable[[TrialRecord], None] | None = None,
               before_trial: Callable[[TrialRequest], TrialRequest] | None = None,
               on_note: Callable[[str], None] | None = None
               ) -> list[TrialRecord]:
    """Run the trials one after another; returns one TrialRecord per item, in order.

    `items`: Estimates (predicted time from the plan), Strategies or TrialRequests.
    `on_record` is called as each trial ends (for live output). `before_trial` is called
    just before a trial really starts (not for cached, skipped or dry-run ones) and may
    return the request with another prediction (amp-search launch: the machine's speed
    now). `on_note` gets one-line notes: waiting for another launch's trial on the same
    database, results recovered from launches that died.

    Each trial takes the database's TrialLock first (waiting while another launch runs one),
    recovers what dead launches left (`recover_orphans`), and is skipped when it finished
    meanwhile. Raises ResultsDBError (one line) when the database cannot be written."""
    from tqdm import tqdm

    options = options or LaunchOptions()
    check_options(spec, options)
    requests = trial_requests(items)
    hosts = node_hosts(spec, options)
    runs_dir = Path(options.runs_dir or (spec.path.parent if spec.path else Path.cwd())
                    / "runs").resolve()
    db = None if options.dry_run else ResultsDB(options.results_path
                                                or default_results_path(spec))
    if options.retry_failed:
        keep, final_only = ("ok",), False
    else:
        keep, final_only = FINISHED, options.retry_transient
    lock = None if db is None else TrialLock(db.path)
    t0 = time.monotonic()
    records: list[TrialRecord] = []
    told: set[str] = set()

    def waiting(holder: dict) -> None:
        if on_note is not None:
            on_note(f"waiting for {holder_text(holder)}, which runs a trial recorded in "
                    f"{db.path} (one trial at a time per database)")

    def recover(runs_dirs: tuple[Path, ...] = ()) -> None:
        found = recover_orphans(db, runs_dirs=runs_dirs, own_rows_orphaned=True)
        if found and on_note is not None and found.summary() not in told:
            told.add(found.summary())
            on_note(found.summary())

    if lock is not None:
        with lock.held("recovery", on_wait=waiting):
            recover((runs_dir,))  # folders no row names are taken back once, here
    bar = tqdm(total=len(requests), desc="trials", unit="trial", disable=not options.progress,
               file=sys.stderr, leave=False)
    try:
        for index, req in enumerate(requests, 1):
            s = req.strategy
            bar.set_postfix_str(s.label())
            if lock is not None:
                lock.acquire(s.label(), on_wait=waiting)
            try:
                if lock is not None:
                    recover()  # the rows of a launch that died while this one waited
                rec = _one(spec, req, index, options, db, runs_dir, hosts, t0, keep,
                           final_only, before_trial)
            finally:
                if lock is not None:
                    lock.release()
            records.append(rec)
            bar.update(1)
            if on_record is not None:
                on_record(rec)
    finally:
        bar.close()
    return records


def _one(spec: Spec, req: TrialRequest, index: int, options: LaunchOptions,
         db: ResultsDB | None, runs_dir: Path, hosts: dict[int, str], t0: float,
         keep: tuple[str, ...], final_only: bool,
         before_trial: Callable[[TrialRequest], TrialRequest] | None) -> TrialRecord:
    """One trial of run_trials: taken from the database, skipped, or run."""
    s = req.strategy
    done = None if db is None else db.finished(spec.sha256, trial_key(s, options.backend), keep,
                                               final_only=final_only)
    if done is not None:
        return _from_row(index, req, done)
    left = None if options.budget_s is None else options.budget_s - (time.monotonic() - t0)
    if left is not None and left <= 0 and not options.dry_run:
        return TrialRecord(index=index, label=s.label(), strategy=s,
                           predicted_s=req.predicted_s, status="skipped",
                           error="the --budget-minutes budget is spent")
    timeout = options.trial_timeout_s if left is None else min(options.trial_timeout_s, left)
    if before_trial is not None and not options.dry_run:
        req = before_trial(req)
    return _run_one(spec, req, index, options, db, runs_dir, hosts, timeout,
                    budget_limited=timeout < options.trial_timeout_s)


__all__ = ["BACKENDS", "LaunchOptions", "Recovery", "TrialRecord", "TrialRequest", "best_trial",
           "default_results_path", "node_hosts", "preflight", "recover_orphans", "run_trials",
           "trial_key", "trial_device", "trial_precision"]
