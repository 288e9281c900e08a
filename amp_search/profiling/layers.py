"""Measure each distinct layer of a spec's model: forward and backward seconds per
(layer signature, tensor-parallel degree, micro-batch size) on one device (AMP section 3.4:
"profiling several tensor model parallelism settings and store results in a lookup table").

What is timed is the layer code the trials run (`amp_search.trial.model.build_layer`):
- tmp = 1: the real megatron-core layer (a one-process gloo world, no communication);
- tmp = k > 1: tensor rank 0's *shard* of the layer built in this one process
  (`simulate_tp_size=k`): the same GEMM shapes as one rank of a tmp=k trial and no
  collectives; the cost model adds those from the link profile.

Forward and backward are timed separately: forward = the module's forward (for the head, the
logits and the loss); backward = `torch.autograd.backward` with a gradient of ones (for the
head, `loss.backward()`). Each point is warmed up, then timed `repeats` times (in rounds over
the micro-batch sizes of one module); the median is stored (the standard deviation beside
it). On CPU torch runs one thread, as the trials do
(OMP_NUM_THREADS=1), and the timer is that thread's CPU time (wall time on an idle core,
robust to other processes on a shared machine); on CUDA it is a pair of CUDA events around
each pass.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

from ..errors import UsageError
from ..spec import Spec
from .store import LayerProfile, ProfileEntry, hostname, installed_versions, now_iso

DEVICES = ("cpu", "cuda")
MIN_WARMUP_S = 0.05
"""Least warm-up time per point, on top of the `warmup` passes (with warmup > 0)."""


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


def profile_layers(spec: Spec, *, device: str = "cpu", tmps=(1,), mbss=(1, 2, 4, 8),
                   warmup: int = 3, repeats: int = 10, progress: bool = False,
                   device_name: str | None = None, out: Path | None = None,
                   directory: Path | None = None, write: bool = True) -> LayerProfile:
    """Measure every distinct layer of `spec` for each tmp in `tmps` and mbs in `mbss`.

    Writes the profile (to `out`, else `directory`/<device>__<precision>__<hash>.json; the CLI
    passes the layer-profile folder of its --profiles root) when `write`; an existing file at that path measured with the same library versions is
    merged into (new points replace old ones). Ctrl-C stops the sweep, writes what was
    measured so far and re-raises KeyboardInterrupt.
    """
    import torch

    if device not in DEVICES:
        raise UsageError(f"--device {device!r}; accepted: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA device on this machine "
                         f"(torch {torch.__version__}); use --device cpu")
    if warmup < 0 or repeats < 1:
        raise UsageError(f"need warmup >= 0 and repeats >= 1, got {warmup} and {repeats}")
    name = profile_device_name(spec, device, device_name)
    if device == "cuda" and device_name is None:
        _check_cuda_name(name)
    tmps, mbss = check_tmps(spec, tmps), check_mbss(mbss)
    precision = spec.training.precision
    layers = distinct_layers(spec)
    if not layers:
        raise UsageError("the model has only custom layers: there is no real layer code to "
                         "profile (they are costed from their FLOPs)")

    settings = {"device": device, "warmup": warmup, "repeats": repeats, "tmps": list(tmps),
                "mbss": list(mbss), "statistic": "median",
                "torch_threads": 1 if device == "cpu" else None,
                "timer": "thread_cpu_time" if device == "cpu" else "cuda_events",
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
    threads = torch.get_num_threads()
    busy = OtherLoad()
    if device == "cpu":
        torch.set_num_threads(1)
    bar = None
    if progress:
        from tqdm import tqdm
        bar = tqdm(total=sum(len(g) for g in groups), desc=f"profile {name}", unit="point")
    try:
        for group in groups:  # one module (signature, tmp) alive at a time
            p0 = group[0]
            if bar is not None:
                bar.set_postfix_str(f"{p0.signature.split(':')[0]} tmp{p0.tmp}")
            module = _build(p0.layer, p0.tmp, precision, device)
            for entry in _measure_group(module, group, precision, device, warmup, repeats):
                profile.add(entry)
            del module
            if bar is not None:
                bar.update(len(group))
    except KeyboardInterrupt:
        if write and profile.entries:
            profile.settings["interrupted"] = True
            profile.save(path)
        raise
    finally:
        if bar is not None:
            bar.close()
        if device == "cpu":
            torch.set_num_threads(threads)
    profile.settings["other_processes_cores"] = busy.others_cores()
    if write:
        profile.save(path)
    return profile


class OtherLoad:
    """How many cores other processes kept busy while we measured (from /proc/stat minus
    the CPU time of this process and of the children it waited for meanwhile); None where
    /proc/stat is not available."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait, in CPU seconds
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, own, time.monotonic()

    def others_cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[2] - self.start[2] < 0.5:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return round(max(0.0, others / (end[2] - self.start[2])), 2)


def machine_busy(profile: LayerProfile) -> str | None:
    """A warning when other processes kept more than half a core busy while profiling."""
    others = profile.settings.get("other_processes_cores")
    if profile.settings.get("device") == "cpu" and others is not None and others > 0.5:
        return (f"other processes kept {others:.1f} of {profile.settings.get('cpu_count')} "
                f"cores busy while profiling: they share caches and memory bandwidth, so the "
                f"timings may be high; re-run on an idle machine")
    return None


def _default_name(profile: LayerProfile, layers: dict) -> str:
    probe = LayerProfile(device=profile.device, precision=profile.precision,
                         entries=[ProfileEntry(signature=s, tmp=1, mbs=1, forward_s=0.0,
                                               backward_s=0.0) for s in layers])
    return probe.default_filename()


def _merge_existing(profile: LayerProfile, path: Path) -> None:
    """Keep the points of an earlier profile at `path` (same device, precision, versions)."""
    if not path.exists():
        return
    try:
        old = LayerProfile.load(path)
    except UsageError:
        return
    if (old.device, old.precision, old.versions) != (profile.device, profile.precision,
                                                     profile.versions):
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


def _build(layer, tmp: int, precision: str, device: str):
    import torch

    from ..trial.model import build_layer, init_single_process_parallel

    torch.manual_seed(0)
    if tmp == 1:
        init_single_process_parallel()  # the real megatron-core layer, world of one
        module = build_layer(layer, tp_size=1, precision=precision)
    else:
        module = build_layer(layer, tp_size=1, simulate_tp_size=tmp, precision=precision)
    return module.to(device).train()


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


def _pass(module, p: _Point, inputs, device: str) -> tuple[float, float]:
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
    # the thread's CPU time: equal to wall time on an idle core (torch runs one thread, and
    # CPU autograd runs in the calling thread), but it leaves out the time other processes
    # on a shared machine take the core away
    t0 = time.thread_time()
    out, grad = _forward(module, p.layer, inputs)
    t1 = time.thread_time()
    torch.autograd.backward(out, grad)
    t2 = time.thread_time()
    return t1 - t0, t2 - t1


def _measure_group(module, group: list[_Point], precision: str, device: str, warmup: int,
                   repeats: int) -> list[ProfileEntry]:
    """Time one module at each micro-batch size of `group`. Each size is warmed up (at least
    `warmup` passes and MIN_WARMUP_S seconds: the first passes of a new shape pay for
    allocator growth and kernel selection); then the timed passes go in rounds over the
    sizes, so that a passing disturbance spreads over them instead of spoiling one."""
    inputs = [_inputs(p.layer, p.mbs, precision, device) for p in group]
    for p, x in zip(group, inputs):
        i, t_start = 0, time.perf_counter()
        while warmup and (i < warmup or time.perf_counter() - t_start < MIN_WARMUP_S):
            _pass(module, p, x, device)
            i += 1
    fwd = [[] for _ in group]
    bwd = [[] for _ in group]
    for _ in range(repeats):
        for k, (p, x) in enumerate(zip(group, inputs)):
            tf, tb = _pass(module, p, x, device)
            fwd[k].append(tf)
            bwd[k].append(tb)
    opt_s = _optimizer_step_s(module, device, repeats)
    return [ProfileEntry(signature=p.signature, tmp=p.tmp, mbs=p.mbs,
                         forward_s=statistics.median(f), backward_s=statistics.median(b),
                         forward_std_s=statistics.pstdev(f), backward_std_s=statistics.pstdev(b),
                         repeats=repeats, optimizer_step_s=opt_s)
            for p, f, b in zip(group, fwd, bwd)]


def _optimizer_step_s(module, device: str, repeats: int) -> float:
    """Seconds of one Adam step over the layer's (tensor rank's) parameters, as the trials'
    DeepSpeed runs it (torch.optim.Adam, `torch_adam`), on fp32 master copies (what mixed
    precision updates too). Independent of the micro-batch size; one per iteration. ZeRO 1-3
    split it over the data-parallel ranks."""
    import torch

    params = [torch.nn.Parameter(torch.zeros(p.shape, dtype=torch.float32, device=device))
              for p in module.parameters() if p.requires_grad]
    if not params:
        return 0.0
    for p in params:
        p.grad = torch.full_like(p, 1e-3)
    opt = torch.optim.Adam(params, lr=1e-4)
    times = []
    for i in range(2 + max(3, repeats // 2)):
        if device == "cuda":
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            opt.step()
            torch.cuda.synchronize()
            t = time.perf_counter() - t0
        else:
            t0 = time.thread_time()
            opt.step()
            t = time.thread_time() - t0
        if i >= 2:
            times.append(t)
    return statistics.median(times)
