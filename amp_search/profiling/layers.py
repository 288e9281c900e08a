"""Measure each distinct layer of a spec's model: forward and backward seconds per
(layer signature, tensor-parallel degree, micro-batch size) on one device (AMP section 3.4:
"profiling several tensor model parallelism settings and store results in a lookup table").

What is timed is the layer code the trials run (`amp_search.trial.model.build_layer`):
- tmp = 1: the real megatron-core layer (no communication);
- tmp = k > 1 in a concurrent CPU sweep whose worker count is a multiple of k (the default
  on CPU, see below): the real megatron-core tensor-parallel layer, k workers forming one
  tensor group over gloo, exactly as k ranks of a tmp=k trial run it. The timer leaves out
  the time the thread spends inside the collectives (`amp-search profile-comm` prices those
  and the cost model adds them), so a point holds what a rank does around them: the GEMMs
  of its shard and megatron-core's own work (its autograd functions, the vocab-parallel
  embedding's masking and cross-entropy, separate bias adds), which the shard alone does not
  do. Measured 2026-11-22 on the 2-core VM (configs/cpu-local.yaml, tmp 2, two workers):
  the real layers took 1.5-1.8 ms more per transformer block (forward + backward) than the
  shard at micro-batch 1-4, 6.5-8 ms per micro-batch of the 6-layer model, most of what
  tmp 2 trials ran slower than predicted from shard profiles at micro-batch 1 and 2;
- otherwise (one process, or CUDA): tensor rank 0's *shard* of the layer built in this one
  process (`simulate_tp_size=k`): the same GEMM shapes as one rank of a tmp=k trial and no
  collectives; the cost model adds those from the link profile.

Forward and backward are timed separately: forward = the module's forward (for the head, the
logits and the loss); backward = `torch.autograd.backward` with a gradient of ones (for the
head, `loss.backward()`). The sweep runs `rounds` times (default 3), each with fresh modules
and inputs and its share of the `repeats` timed passes per point: within a round each point
is warmed up, then timed (in turns over the micro-batch sizes of one module). The median of
all of a point's samples is stored (the standard deviation beside it), so that a few seconds
in which a shared machine runs slow, or one unlucky memory layout, do not set a point's
figure. On CPU torch runs one thread, as the trials do
(OMP_NUM_THREADS=1), and the timer is that thread's CPU time (wall time on an idle core,
robust to other processes on a shared machine); on CUDA it is a pair of CUDA events around
each pass.

Concurrent profiling (`concurrent` = N > 1, the default on CPU: the most devices of this type
in one node of the spec). A trial runs one process per device, all busy at once; on one node
they share caches, memory bandwidth, the host's (or VM's) CPU time, PCIe and power. So N
worker processes (fresh interpreters; on CPU each with OMP_NUM_THREADS=1) run the same
measurement code on the same points in lock-step: a barrier (held by the parent, over a
socket per worker) before every timed pass and every timed optimizer step, and at the end of
each point's warm-up, so that all N really overlap.
Each stored figure is the median over the N processes, rounds and passes (N x repeats
samples).
On CPU the timer stays each worker's thread CPU time: with one worker per core, it equals wall
time on an otherwise idle machine, and it still leaves out the time another program takes
a core away (which a profile should not keep); `settings["other_processes_cores"]` says how
busy the machine was. `timer="wall"` times wall clock instead (what a trial's iteration pays,
disturbances included). On CUDA, worker k uses device k mod the visible count; the default
there is 1 (one process, CUDA events), since GPU kernels do not share a core.

`settings` records how a profile was measured: `concurrent` (processes at once; absent in
older profiles: 1), `rounds`, `timer`, `statistic`, `repeats` per process (each entry's
`repeats` is the number of samples behind its median: processes x repeats), `tp_layers`
(`real`: tmp > 1 points that divide `concurrent` ran as real tensor groups; `shard`, or
absent in older profiles: all tmp > 1 points are shards).
"""
from __future__ import annotations

import os
import statistics
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..machine_load import BUSY_CORES, OtherLoad
from ..spec import Spec
from .store import (LayerProfile, ProfileEntry, hostname, installed_versions, now_iso,
                    worker_env)

DEVICES = ("cpu", "cuda")
MIN_WARMUP_S = 0.05
"""Least warm-up time per point, on top of the `warmup` passes (with warmup > 0)."""
TIMERS = {"cpu": ("thread_cpu_time", "wall"), "cuda": ("cuda_events",)}
DEFAULT_ROUNDS = 3
"""Times the sweep runs, with fresh modules and inputs (the `repeats` are split over them), so
that each point pools samples from moments and memory layouts apart: on a shared (virtual)
machine the speed shifts for seconds at a time."""
WORKER_START_TIMEOUT_S = 600.0
"""How long the workers of a concurrent sweep may take to import torch and build a layer."""
TP_LAYERS = ("real", "shard")
"""How tmp > 1 points are measured: as real tensor groups of the concurrent workers, or as one
rank's shard in one process (see the module docstring)."""


def tp_layers_mode(device: str, concurrent: int) -> str:
    """'real' where the sweep can run real tensor groups (CPU, more than one worker), else
    'shard'."""
    return "real" if device == "cpu" and concurrent > 1 else "shard"


def real_tensor_group(tmp: int, concurrent: int, mode: str) -> bool:
    """Whether the points of degree `tmp` run as real tensor groups of `tmp` workers."""
    return mode == "real" and tmp > 1 and concurrent % tmp == 0


@dataclass(frozen=True, kw_only=True)
class _Point:
    signature: str
    layer: object  # cost_models.layers.Layer
    tmp: int
    mbs: int


def profile_device_name(spec: Spec, device: str, name: str | None = None) -> str:
    """The catalog name the profile is keyed by: `name` if given, else the spec's only device
    type of the matching kind (cpu for --device cpu, gpu for --device cuda)."""
    types = {d.gpu.name: d.gpu for d in spec.cluster.devices}
    if name is not None:
        if name not in types:
            raise UsageError(f"--name {name!r} is not a device type of this spec; its types: "
                             f"{', '.join(types)}")
        return name
    kind = "cpu" if device == "cpu" else "gpu"
    matching = [n for n, g in types.items() if g.kind == kind]
    if len(matching) != 1:
        raise UsageError(f"--device {device}: the spec has {len(matching)} device type(s) of "
                         f"kind {kind} ({', '.join(matching) or 'none'}; all: "
                         f"{', '.join(types)}); pass --name to say which one this machine is")
    return matching[0]


def check_tmps(spec: Spec, tmps) -> tuple[int, ...]:
    """Tensor-parallel degrees every layer can be split by (heads, ffn, vocab)."""
    tmps = tuple(sorted(set(int(t) for t in tmps)))
    sizes = spec.model.tp_divisors
    ok = [t for t in range(1, 65) if all(s % t == 0 for s in sizes)]
    bad = [t for t in tmps if t < 1 or any(s % t for s in sizes)]
    if bad:
        raise UsageError(f"--tmp {','.join(map(str, bad))} does not divide the model's heads / "
                         f"ffn / vocab sizes ({', '.join(map(str, sizes))}); valid: "
                         f"{', '.join(map(str, ok))}")
    return tmps


def check_mbss(mbss) -> tuple[int, ...]:
    mbss = tuple(sorted(set(int(m) for m in mbss)))
    if not mbss or mbss[0] < 1:
        raise UsageError(f"--mbs needs positive micro-batch sizes, got {list(mbss)}")
    return mbss


def distinct_layers(spec: Spec) -> dict:
    """signature -> the first layer with it (custom layers are skipped: nothing real to run)."""
    out = {}
    for layer in spec.model.layers:
        if layer.kind != "custom" and layer.signature not in out:
            out[layer.signature] = layer
    return out


def default_concurrency(spec: Spec, device: str, name: str) -> int:
    """How many processes measure at once by default: on CPU, the most devices of type `name`
    in one node of the spec (a trial runs one process per device, all busy at once); on CUDA
    1 (GPU kernels do not share a core; pass `concurrent` to load a multi-GPU node)."""
    if device != "cpu":
        return 1
    return max((len(n.devices) for n in spec.cluster.nodes if n.gpu.name == name), default=1)


def profile_layers(spec: Spec, *, device: str = "cpu", tmps=(1,), mbss=(1, 2, 4, 8),
                   warmup: int = 3, repeats: int = 10, progress: bool = False,
                   device_name: str | None = None, out: Path | None = None,
                   directory: Path | None = None, write: bool = True,
                   concurrent: int | None = None, timer: str | None = None,
                   rounds: int = DEFAULT_ROUNDS) -> LayerProfile:
    """Measure every distinct layer of `spec` for each tmp in `tmps` and mbs in `mbss`.

    `concurrent`: processes measuring the same points in lock-step (see the module
    docstring); None: `default_concurrency` (on CPU the spec's devices per node of this
    type, on CUDA 1); 1: in this process. `timer`: on CPU 'thread_cpu_time' (default) or
    'wall'; on CUDA 'cuda_events'. `rounds`: the sweep runs this many times (at most
    `repeats`), each with fresh modules and inputs and its share of the `repeats` timed
    passes; each point's median pools them all.

    Writes the profile (to `out`, else `directory`/<device>__<precision>__<hash>.json; the CLI
    passes the layer-profile folder of its --profiles root) when `write`; an existing file at
    that path measured with the same library versions and the same way (concurrency and
    timer) is merged into (new points replace old ones). Ctrl-C stops the sweep (and its
    workers), writes what was measured so far and re-raises KeyboardInterrupt.
    """
    import torch

    if device not in DEVICES:
        raise UsageError(f"--device {device!r}; accepted: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device on this machine "
                         f"(torch {torch.__version__}); use --device cpu")
    if warmup < 0 or repeats < 1:
        raise UsageError(f"need warmup >= 0 and repeats >= 1, got {warmup} and {repeats}")
    if int(rounds) != rounds or rounds < 1:
        raise UsageError(f"--rounds needs a positive integer, got {rounds}")
    rounds = min(int(rounds), repeats)
    name = profile_device_name(spec, device, device_name)
    if device == "cuda" and device_name is None:
        _check_cuda_name(name)
    if concurrent is None:
        concurrent = default_concurrency(spec, device, name)
    if int(concurrent) != concurrent or not 1 <= concurrent <= 1024:
        raise UsageError(f"--concurrent needs a process count from 1 to 1024, got {concurrent}")
    concurrent = int(concurrent)
    tmps, mbss = check_tmps(spec, tmps), check_mbss(mbss)
    precision = spec.training.precision
    layers = distinct_layers(spec)
    if not layers:
        raise UsageError("the model has only custom layers: there is no real layer code to "
                         "profile (they are costed from their FLOPs)")

    timer = TIMERS[device][0] if timer is None else timer
    if timer not in TIMERS[device]:
        raise UsageError(f"timer {timer!r} for --device {device}; accepted: "
                         f"{', '.join(TIMERS[device])}")
    settings = {"device": device, "warmup": warmup, "repeats": repeats, "tmps": list(tmps),
                "mbss": list(mbss), "concurrent": concurrent, "rounds": rounds,
                "statistic": ("median" if concurrent == 1 else
                              f"median over {concurrent} processes x repeats"),
                "torch_threads": 1 if device == "cpu" else None,
                "timer": timer,
                "tp_layers": tp_layers_mode(device, concurrent),
                "torch_device": (torch.cuda.get_device_name() if device == "cuda"
                                 else _cpu_model()),
                "cpu_count": os.cpu_count()}
    profile = LayerProfile(device=name, precision=precision, entries=(),
                           versions=installed_versions(), created=now_iso(), host=hostname(),
                           settings=settings)
    path = Path(out) if out is not None else None
    if write:
        if path is None and directory is None:
            raise UsageError("profile_layers: give `out` (a file) or `directory` to write to")
        path = path or Path(directory) / _default_name(profile, layers)
        _merge_existing(profile, path)

    groups = [[_Point(signature=s, layer=l, tmp=t, mbs=m) for m in mbss]
              for s, l in layers.items() for t in tmps]
    per_round = [repeats // rounds + (r < repeats % rounds) for r in range(rounds)]
    busy = OtherLoad()
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=rounds * sum(len(g) for g in groups), desc=f"profile {name}"
                   + (f" x{concurrent}" if concurrent > 1 else ""), unit="point")
    pooled: dict[int, list] = {}

    def measured(gi: int, samples: list) -> None:
        """One round of group `gi` is in (a sample triple per process): its entries now
        pool every round so far."""
        pooled.setdefault(gi, []).extend(samples)
        for entry in _entries(groups[gi], _pool(pooled[gi])):
            profile.add(entry)
        if bar is not None:
            bar.update(len(groups[gi]))

    def showing(gi: int) -> None:
        if bar is not None:
            p0 = groups[gi][0]
            bar.set_postfix_str(f"{p0.signature.split(':')[0]} tmp{p0.tmp}")

    try:
        if concurrent == 1:
            _sweep_here(groups, per_round, precision, device, warmup, timer, measured, showing)
        else:
            _sweep_concurrent(groups, per_round, concurrent, precision, device, warmup, timer,
                              measured, showing)
    except KeyboardInterrupt:
        if write and profile.entries:
            profile.settings["interrupted"] = True
            profile.save(path)
        raise
    finally:
        if bar is not None:
            bar.close()
    profile.settings["other_processes_cores"] = busy.others_cores()
    if write:
        profile.save(path)
    return profile


def _sweep_here(groups, per_round, precision, device, warmup, timer, measured,
                showing) -> None:
    """concurrent = 1: every round of every group in this process, one module alive at a
    time."""
    import torch

    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)
    try:
        for repeats in per_round:
            for gi, group in enumerate(groups):
                showing(gi)
                module = _build(group[0].layer, group[0].tmp, precision, device)
                measured(gi, [_measure_samples(module, group, precision, device, warmup,
                                               repeats, timer=timer)])
                del module
    finally:
        if device == "cpu":
            torch.set_num_threads(threads)


def _sweep_concurrent(groups, per_round, n, precision, device, warmup, timer, measured,
                      showing) -> None:
    """concurrent = n > 1: n worker processes measure every round of every group in
    lock-step; `measured` gets each (round, group) once all n workers' samples are in.

    The workers are fresh interpreters (`python -c ...`, not multiprocessing: that would
    re-import the caller's main module, and a process that has torch and gloo loaded must not
    fork), each joined to this process by a socket pair. This process is the barrier: a
    worker says 'sync' and waits; when all n have, each gets 'go'. Every way out (done, a
    worker's error or death, Ctrl-C) closes the sockets, so the workers stop, and reaps them.
    """
    import socket
    import subprocess
    import sys
    from multiprocessing.connection import Connection, wait

    env = worker_env()
    if device == "cpu":
        env["OMP_NUM_THREADS"] = "1"  # one thread per worker, as in the trials
    import tempfile

    mode = tp_layers_mode(device, n)
    store_dir = None
    if any(real_tensor_group(g[0].tmp, n, mode) for g in groups):
        # the workers' gloo world (real tensor groups): a FileStore, no TCP port needed
        store_dir = tempfile.TemporaryDirectory(prefix="amp-search-profile-")
    job = {"groups": groups, "per_round": per_round, "precision": precision,
           "device": device, "warmup": warmup, "timer": timer, "tp_layers": mode,
           "store": None if store_dir is None else str(Path(store_dir.name) / "store")}
    procs, conns = [], []
    samples: dict[tuple[int, int], list] = {}
    at_barrier: set[int] = set()
    done: set[int] = set()
    try:
        for k in range(n):
            ours, theirs = socket.socketpair()
            with theirs:
                procs.append(subprocess.Popen(
                    [sys.executable, "-c", "import sys; from amp_search.profiling.layers "
                     "import _worker_main; sys.exit(_worker_main(sys.argv[1:]))",
                     str(theirs.fileno()), str(k), str(n)],
                    pass_fds=(theirs.fileno(),), env=env, stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL, start_new_session=True))
            conns.append(Connection(ours.detach()))
            conns[-1].send(job)
        showing(0)
        last = time.monotonic()
        while len(done) < n:
            ready = wait([c for k, c in enumerate(conns) if k not in done], timeout=1.0)
            if not ready:
                if not samples and time.monotonic() - last > WORKER_START_TIMEOUT_S:
                    raise RuntimeError(f"profiling workers measured nothing in "
                                       f"{WORKER_START_TIMEOUT_S:.0f} s")
                continue
            last = time.monotonic()
            for c in ready:
                k = conns.index(c)
                try:
                    msg = c.recv()
                except (EOFError, OSError):
                    raise RuntimeError(f"profiling worker {k} of {n} exited (status "
                                       f"{procs[k].wait()}) before the sweep was done") from None
                if msg[0] == "sync":
                    at_barrier.add(k)
                    if len(at_barrier) == n:
                        at_barrier.clear()
                        for c2 in conns:
                            c2.send("go")
                elif msg[0] == "group":
                    key = (msg[1], msg[2])  # (round, group)
                    samples.setdefault(key, []).append(msg[3])
                    if len(samples[key]) == n:
                        measured(key[1], samples.pop(key))
                        showing((key[1] + 1) % len(groups))
                elif msg[0] == "done":
                    done.add(k)
                else:  # ("error", traceback)
                    raise RuntimeError(f"profiling worker {k} of {n} failed:\n{msg[1]}")
    finally:
        for c in conns:
            c.close()  # a worker waiting at the barrier (or sending) stops
        for proc in procs:
            try:
                proc.wait(timeout=10.0 if len(done) == n else 2.0)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if store_dir is not None:
            store_dir.cleanup()


class _Stopped(Exception):
    """The sweep's parent closed the connection: stop quietly."""


def _worker_main(argv: list[str]) -> int:
    """One process of a concurrent sweep (started by `_sweep_concurrent`): argv = (socket
    fd, worker index, workers). Receives the job, measures every round of every group with
    a barrier ('sync', then wait for 'go') before each timed pass, sends ('group', round,
    index, samples) per round and group and ('done',) at the end, or ('error', traceback)."""
    import signal
    import warnings
    from multiprocessing.connection import Connection

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    # megatron-core says so on import, once per process: not N times per sweep
    warnings.filterwarnings("ignore", message="Transformer Engine and Apex are not installed")
    # and its real tensor-parallel layers about a CUDA setting, once per layer built
    warnings.filterwarnings("ignore", message=".*CUDA_DEVICE_MAX_CONNECTIONS")
    conn = Connection(int(argv[0]))
    k = int(argv[1])
    try:
        job = conn.recv()
        device = job["device"]
        import torch

        if device == "cpu":
            torch.set_num_threads(1)
        else:
            torch.cuda.set_device(k % torch.cuda.device_count())
        n = int(argv[2])
        if job.get("store"):
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"file://{job['store']}", rank=k,
                                    world_size=n)
            _COLLECTIVES.install()

        def sync() -> None:
            conn.send(("sync",))
            if conn.recv() != "go":
                raise _Stopped

        for r, repeats in enumerate(job["per_round"]):
            for gi, group in enumerate(job["groups"]):
                real = bool(job.get("store")) and real_tensor_group(
                    group[0].tmp, n, job.get("tp_layers", "shard"))
                module = _build(group[0].layer, group[0].tmp, job["precision"], device,
                                real_tp=real)
                conn.send(("group", r, gi, _measure_samples(
                    module, group, job["precision"], device, job["warmup"], repeats,
                    sync=sync, timer=job["timer"], agree=real)))
                del module
        conn.send(("done",))
        return 0
    except (_Stopped, EOFError, OSError):
        return 0  # the parent stopped the sweep (another worker failed, or Ctrl-C)
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
        return 1


def machine_busy(profile: LayerProfile) -> str | None:
    """A warning when other processes kept more than half a core busy while profiling."""
    others = profile.settings.get("other_processes_cores")
    if profile.settings.get("device") == "cpu" and others is not None and others > BUSY_CORES:
        return (f"other processes kept {others:.1f} of {profile.settings.get('cpu_count')} "
                f"cores busy while profiling: they share caches and memory bandwidth, so the "
                f"timings may be high; re-run on an idle machine")
    return None


def _default_name(profile: LayerProfile, layers: dict) -> str:
    probe = LayerProfile(device=profile.device, precision=profile.precision,
                         entries=[ProfileEntry(signature=s, tmp=1, mbs=1, forward_s=0.0,
                                               backward_s=0.0) for s in layers])
    return probe.default_filename()


def _method(settings: dict) -> tuple:
    """How a profile was measured, as far as it changes the figures: processes at once, timer
    and tensor-parallel layers (profiles from before concurrent profiling: one process,
    thread CPU time; from before real tensor groups: shards)."""
    return (int(settings.get("concurrent", 1)), settings.get("timer", "thread_cpu_time"),
            settings.get("tp_layers", "shard"))


def _merge_existing(profile: LayerProfile, path: Path) -> None:
    """Keep the points of an earlier profile at `path` (same device, precision, versions,
    and measured the same way: points taken alone and with the whole node busy do not mix)."""
    if not path.exists():
        return
    try:
        old = LayerProfile.load(path)
    except UsageError:
        return
    if (old.device, old.precision, old.versions, _method(old.settings)) != \
            (profile.device, profile.precision, profile.versions, _method(profile.settings)):
        return
    for e in old.entries:
        profile.add(e)


def _check_cuda_name(name: str) -> None:
    import torch

    model = name.split("-")[0].upper()
    seen = torch.cuda.get_device_name()
    if model not in seen.upper().replace(" ", ""):
        raise UsageError(f"this machine's GPU is {seen!r}, which does not look like the spec's "
                         f"{name!r}; pass --name {name} if it is that device")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def _build(layer, tmp: int, precision: str, device: str, real_tp: bool = False):
    """The module a point is timed on: the real layer (tmp 1; tmp > 1 with `real_tp`, in a
    tensor group of this worker and the next tmp - 1 of a concurrent sweep's world) or the
    shard of tensor rank 0."""
    import torch
    import torch.distributed as dist

    from ..trial.model import build_layer, init_single_process_parallel

    torch.manual_seed(0)
    if dist.is_initialized() and dist.get_world_size() > 1:
        _use_tensor_parallel(tmp if real_tp else 1)
    else:
        init_single_process_parallel()  # the real megatron-core layer, world of one
    if tmp == 1 or real_tp:
        module = build_layer(layer, tp_size=tmp if real_tp else 1, precision=precision)
    else:
        module = build_layer(layer, tp_size=1, simulate_tp_size=tmp, precision=precision)
    return module.to(device).train()


def _use_tensor_parallel(tmp: int) -> None:
    """megatron-core's parallel_state with tensor groups of `tmp` consecutive ranks of this
    world (re-initialized when the degree changes; every worker does it at the same point
    of the sweep)."""
    from megatron.core import parallel_state as ps

    if ps.model_parallel_is_initialized():
        if ps.get_tensor_model_parallel_world_size() == tmp:
            return
        ps.destroy_model_parallel()
    ps.initialize_model_parallel(tmp, 1, create_gloo_process_groups=False)


class _CollectiveClock:
    """Time this thread spends inside torch.distributed.all_reduce (and waiting on an async
    one), on the sweep's clock: the tensor-parallel layers' collectives, which the profile
    leaves out (profile-comm measures them). Installed in the workers of a sweep with real
    tensor groups; the non-sequence-parallel layers use no other collective."""

    def __init__(self):
        self.clock = time.thread_time
        self.spent = 0.0
        self.installed = False

    def install(self) -> None:
        import torch.distributed as dist

        if self.installed:
            return
        self.installed = True
        original = dist.all_reduce
        outer = self

        class _Handle:
            def __init__(self, work):
                self.work = work

            def wait(self, *args, **kwargs):
                t0 = outer.clock()
                try:
                    return self.work.wait(*args, **kwargs)
                finally:
                    outer.spent += outer.clock() - t0

            def __getattr__(self, name):
                return getattr(self.work, name)

        def all_reduce(*args, **kwargs):
            t0 = outer.clock()
            try:
                work = original(*args, **kwargs)
            finally:
                outer.spent += outer.clock() - t0
            return _Handle(work) if work is not None else None

        dist.all_reduce = all_reduce


_COLLECTIVES = _CollectiveClock()


def _inputs(layer, mbs: int, precision: str, device: str):
    from ..trial.model import TRIAL_PRECISIONS, example_inputs

    return example_inputs(layer, mbs, dtype=TRIAL_PRECISIONS[precision], device=device)


def _forward(module, layer, inputs):
    """The forward pass as a trial runs it; returns (tensor to back-propagate, its grad)."""
    import torch

    if layer.kind == "head":
        x, labels = inputs
        logits = module(x)
        if getattr(module, "simulate", 0):
            # A tmp=k rank computes megatron's vocab-parallel cross-entropy over its V/k slice
            # (plus three small all-reduces, costed separately); HeadLayer.loss in simulate
            # mode uses F.cross_entropy, whose kernels are cheaper, so time megatron's on the
            # shard (a tensor group of one does the same local work).
            from ..trial.model import init_single_process_parallel, lm_loss

            init_single_process_parallel()
            return lm_loss(logits, labels % logits.shape[-1]), None
        return module.loss(logits, labels), None
    out = module(*inputs)
    return out, torch.ones_like(out)


def _pass(module, p: _Point, inputs, device: str, timer: str) -> tuple[float, float]:
    """(forward seconds, backward seconds) of one pass."""
    import torch

    for x in inputs:
        if x.requires_grad:
            x.grad = None
    if device == "cuda":
        e0, e1, e2 = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        torch.cuda.synchronize()
        e0.record()
        out, grad = _forward(module, p.layer, inputs)
        e1.record()
        torch.autograd.backward(out, grad)
        e2.record()
        torch.cuda.synchronize()
        return e0.elapsed_time(e1) / 1e3, e1.elapsed_time(e2) / 1e3
    # thread_cpu_time (one process): equal to wall time on an idle core (torch runs one
    # thread, and CPU autograd runs in the calling thread), but it leaves out the time other
    # processes on a shared machine take the core away. wall (concurrent workers): what a
    # trial's iteration pays, sharing included.
    # With real tensor groups, the time inside their collectives is left out (c0..c2).
    clock = time.thread_time if timer == "thread_cpu_time" else time.perf_counter
    _COLLECTIVES.clock = clock
    c0 = _COLLECTIVES.spent
    t0 = clock()
    out, grad = _forward(module, p.layer, inputs)
    t1 = clock()
    c1 = _COLLECTIVES.spent
    torch.autograd.backward(out, grad)
    t2 = clock()
    c2 = _COLLECTIVES.spent
    return t1 - t0 - (c1 - c0), t2 - t1 - (c2 - c1)


def _no_sync() -> None:
    pass


def _agreed(more: bool, agree: bool) -> bool:
    """Whether to warm up once more: this worker's wish, or (`agree`: a real tensor group,
    whose passes hold collectives) whether any worker of the world wishes so, so that all
    run the same number of passes."""
    if not agree:
        return more
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if more else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def _measure_samples(module, group: list[_Point], precision: str, device: str, warmup: int,
                     repeats: int, *, sync=_no_sync, timer: str = "thread_cpu_time",
                     agree: bool = False):
    """Time one module at each micro-batch size of `group`: ([forward samples per point],
    [backward samples per point], [optimizer step samples]). Each size is warmed up (at least
    `warmup` passes and MIN_WARMUP_S seconds: the first passes of a new shape pay for
    allocator growth and kernel selection); then the timed passes go in rounds over the
    sizes, so that a passing disturbance spreads over them instead of spoiling one.
    `sync()` is called after each size's warm-up and before every timed pass and optimizer
    step (a barrier across the workers of a concurrent sweep). `agree`: the workers decide
    the warm-up passes together (real tensor groups)."""
    if device == "cuda":
        timer = "cuda_events"
    inputs = [_inputs(p.layer, p.mbs, precision, device) for p in group]
    for p, x in zip(group, inputs):
        i, t_start = 0, time.perf_counter()
        while warmup and _agreed(i < warmup or time.perf_counter() - t_start < MIN_WARMUP_S,
                                 agree):
            _pass(module, p, x, device, timer)
            i += 1
        sync()
    fwd = [[] for _ in group]
    bwd = [[] for _ in group]
    for _ in range(repeats):
        for k, (p, x) in enumerate(zip(group, inputs)):
            sync()
            tf, tb = _pass(module, p, x, device, timer)
            fwd[k].append(tf)
            bwd[k].append(tb)
    return fwd, bwd, _optimizer_step_samples(module, device, repeats, sync, timer)


def _pool(per_worker: list) -> tuple[list, list, list]:
    """Sample triples of one group (one per process and round), pooled per point."""
    fwd = [sum((w[0][i] for w in per_worker), []) for i in range(len(per_worker[0][0]))]
    bwd = [sum((w[1][i] for w in per_worker), []) for i in range(len(per_worker[0][1]))]
    opt = sum((w[2] for w in per_worker), [])
    return fwd, bwd, opt


def _entries(group: list[_Point], samples) -> list[ProfileEntry]:
    """One entry per point: medians (and standard deviations) of all its samples; `repeats`
    is how many there were (processes x timed passes)."""
    fwd, bwd, opt = samples
    opt_s = statistics.median(opt) if opt else 0.0
    return [ProfileEntry(signature=p.signature, tmp=p.tmp, mbs=p.mbs,
                         forward_s=statistics.median(f), backward_s=statistics.median(b),
                         forward_std_s=statistics.pstdev(f), backward_std_s=statistics.pstdev(b),
                         repeats=len(f), optimizer_step_s=opt_s)
            for p, f, b in zip(group, fwd, bwd)]


def _optimizer_step_samples(module, device: str, repeats: int, sync=_no_sync,
                            timer: str = "thread_cpu_time") -> list[float]:
    """Seconds of Adam steps over the layer's (tensor rank's) parameters, as the trials'
    DeepSpeed runs it (torch.optim.Adam, `torch_adam`), on fp32 master copies (what mixed
    precision updates too). Independent of the micro-batch size; one per iteration. ZeRO 1-3
    split it over the data-parallel ranks. Two untimed steps, then max(3, repeats // 2) timed
    ones (each after `sync()`); [] for a layer without parameters."""
    import torch

    params = [torch.nn.Parameter(torch.zeros(p.shape, dtype=torch.float32, device=device))
              for p in module.parameters() if p.requires_grad]
    if not params:
        return []
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam(params, lr=1e-4)
    clock = time.thread_time if timer == "thread_cpu_time" else time.perf_counter
    times = []
    for i in range(2 + max(3, repeats // 2)):
        if i >= 2:
            sync()
        if device == "cuda":
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            t = time.perf_counter() - t0
        else:
            t0 = clock()
            opt.step()
            t = clock() - t0
        if i >= 2:
            times.append(t)
    return times
