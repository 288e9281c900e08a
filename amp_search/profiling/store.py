"""Measured profiles on disk: per-layer times (AMP section 3.4) and per-link collective fits.

    profiles/measured/<device>__<precision>__<hash8>.json   LayerProfile  (amp-search profile)
    profiles/comm/<device>__<backend>.json                  CommProfile   (amp-search profile-comm)

Layer profile JSON (format 1):
    {"format": 1, "device": "CPU-local", "precision": "fp32",
     "versions": {"torch": ..., "deepspeed": ..., "megatron_core": ...},
     "created": ISO time, "host": ..., "settings": {...how it was measured...},
     "entries": [{"signature", "tmp", "mbs", "forward_s", "backward_s",
                  "forward_std_s", "backward_std_s", "repeats", "optimizer_step_s"}, ...]}
(optimizer_step_s: one Adam step over the layer's parameters at that tmp, the same for every
mbs; absent in older files, read as 0.) An optional "framework_overheads" object holds the
training framework's own fixed costs measured with real trials (`FrameworkOverheads`,
amp_search.profiling.framework); an optional "speed_probe" object the machine's speed when the
profile was taken (`SpeedProbe`, amp_search.profiling.speed).

A profile is only ever used for the device name and precision it was measured with; a file
for another device is never returned by `find_profile`.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import re
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from cost_models.comm import COLLECTIVES, collective_time_s, sigmoid_efficiency

from ..errors import UsageError

FORMAT = 1
LINKS = ("intra", "inter")
_VERSIONED = (("torch", "torch"), ("deepspeed", "deepspeed"), ("megatron_core", "megatron-core"))


def installed_versions() -> dict:
    """Versions of the libraries whose kernels and schedules the timings depend on."""
    from importlib import metadata

    out = {}
    for key, dist in _VERSIONED:
        try:
            out[key] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[key] = None
    return out


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def safe_name(text: str) -> str:
    """A device name as a file-name part ('A100 80GB' -> 'A100_80GB')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_") or "device"


# ----------------------------------------------------------------------------- layer profiles

@dataclass(frozen=True, kw_only=True)
class OverheadProbe:
    """One real trial run to measure the framework's fixed costs."""

    label: str
    gas: int
    """Micro-batches per iteration per replica."""
    measured_s: float
    """Mean measured seconds per iteration."""
    predicted_s: float
    """The cost model's seconds per iteration from the layer profile alone (no overheads)."""
    other_processes_cores: float | None = None
    """Cores other programs used meanwhile (None: unknown)."""
    microbatches_on_path: float | None = None
    """Whole-model micro-batches of per-layer cost on the trial's critical path, as the cost
    model counts them: gas at pp 1, fewer in a pipeline (None: files from before; gas)."""

    @property
    def residual_s(self) -> float:
        return self.measured_s - self.predicted_s


@dataclass(frozen=True, kw_only=True)
class SpeedProbe:
    """The machine's speed when a layer profile was taken, as the trials see it
    (amp_search.profiling.speed): one block layer's forward + backward timed in `workers`
    processes at once, the mean of their medians. `amp-search launch` takes it again before
    each trial and scales that trial's prediction by the ratio (on a shared or virtual
    machine the speed drifts 10-20% from minute to minute)."""

    ms: float
    workers: int
    seconds: float
    layer: str
    """The signature of the layer timed (tmp 1, micro-batch `mbs`)."""
    mbs: int = 1
    created: str = ""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "SpeedProbe":
        return cls(ms=float(d["ms"]), workers=int(d["workers"]), seconds=float(d["seconds"]),
                   layer=str(d["layer"]), mbs=int(d.get("mbs", 1)),
                   created=str(d.get("created", "")))


def _probes_from(d: dict, key: str = "probes") -> tuple[OverheadProbe, ...]:
    return tuple(OverheadProbe(**p) for p in d.get(key) or ())


def _float_or_none(x) -> float | None:
    return None if x is None else float(x)


@dataclass(frozen=True, kw_only=True)
class ZeroOverheads:
    """What one ZeRO stage's own bookkeeping costs beyond stage 0's, measured by running the
    trial program at that stage beside stage 0 (amp_search.profiling.framework): the
    difference of their residuals (measured - the cost model's prediction, which already
    holds the stage's collectives and its smaller optimizer step) at each micro-batch count.
    On the 2-core CPU machine ZeRO 1 cost ~30 ms more per iteration than the model said and
    ZeRO 2 ~29 ms more per micro-batch (DeepSpeed's gradient buckets, partition copies and
    per-partition reductions): the ZeRO 1/2 trials ran 4-29% slower than predicted.

    Per parameter a device holds, so that it follows the model's size and the tensor
    degree: microbatch_s_per_param in every micro-batch's backward (the gradient reduction
    ZeRO 2/3 run as gradients are produced), step_s_per_param once per iteration (the
    boundary's reduction, the partitioned step's copies and the weights' all-gather)."""

    zero_stage: int
    microbatch_s_per_param: float
    step_s_per_param: float
    params_per_device: int
    """Parameters each probe device held (pp 1, tmp 1: the whole model)."""
    probes: tuple[OverheadProbe, ...] = ()

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "ZeroOverheads":
        return cls(zero_stage=int(d["zero_stage"]),
                   microbatch_s_per_param=float(d["microbatch_s_per_param"]),
                   step_s_per_param=float(d["step_s_per_param"]),
                   params_per_device=int(d["params_per_device"]),
                   probes=_probes_from(d))


@dataclass(frozen=True, kw_only=True)
class FrameworkOverheads:
    """The training framework's fixed costs that a layer profile cannot see, measured by
    running its trial program (amp_search.profiling.framework): what an iteration costs
    beyond its layers' forward/backward, its collectives and its optimizer step.

    microbatch_overhead_s: per micro-batch of the whole model on one stage (the engine's
    forward/backward/step calls, its hooks per module and parameter, gradient-accumulation
    bookkeeping, data loading); spread over the model's `layers` it is `layer_overhead_s`, so
    that a pipeline stage pays for the layers it holds. step_overhead_s: per iteration (the
    optimizer step's own bookkeeping, timers, loss scaling, barriers). The cost model uses
    them as `CostParams.layer_overhead_s` and `step_overhead_s` when there is no
    calibration."""

    backend: str
    microbatch_overhead_s: float
    step_overhead_s: float
    layers: int
    """Layers of the model the probe trials ran (embedding and head included)."""
    probes: tuple[OverheadProbe, ...] = ()
    created: str = ""
    zero: tuple[ZeroOverheads, ...] = ()
    """ZeRO stages 1-3 beyond stage 0, where the spec searches them (the probes above are
    stage 0's)."""
    pipeline_microbatch_overhead_s: float | None = None
    pipeline_step_overhead_s: float | None = None
    """The same two costs of DeepSpeed's pipeline engine (pp > 1), which runs its own
    schedule and no data-parallel gradient reduction at dp 1: measured with every device of
    the node a stage (`pipeline_probes`); None where not measured (then pp > 1 is priced with
    the pp 1 costs)."""
    pipeline_probes: tuple[OverheadProbe, ...] = ()

    @property
    def layer_overhead_s(self) -> float:
        """The per-micro-batch cost per layer."""
        return self.microbatch_overhead_s / max(self.layers, 1)

    @property
    def pipeline_layer_overhead_s(self) -> float:
        """The same under the pipeline engine (pp 1's where it was not measured)."""
        if self.pipeline_microbatch_overhead_s is None:
            return self.layer_overhead_s
        return self.pipeline_microbatch_overhead_s / max(self.layers, 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FrameworkOverheads":
        return cls(backend=str(d["backend"]),
                   microbatch_overhead_s=float(d["microbatch_overhead_s"]),
                   step_overhead_s=float(d["step_overhead_s"]), layers=int(d["layers"]),
                   probes=_probes_from(d), created=str(d.get("created", "")),
                   zero=tuple(ZeroOverheads.from_dict(z) for z in d.get("zero") or ()),
                   pipeline_microbatch_overhead_s=_float_or_none(
                       d.get("pipeline_microbatch_overhead_s")),
                   pipeline_step_overhead_s=_float_or_none(d.get("pipeline_step_overhead_s")),
                   pipeline_probes=_probes_from(d, "pipeline_probes"))


@dataclass(frozen=True)
class LayerTiming:
    """One layer's compute time for one micro-batch on one device (its TP collectives excluded)."""

    forward_s: float
    backward_s: float
    source: str
    """'profile:<file>' (exact mbs), 'profile:<file>:interpolated' or ':extrapolated'."""
    optimizer_step_s: float = 0.0
    """One Adam step over the layer's parameters on this tensor rank (once per iteration,
    whatever the micro-batch size; ZeRO 1-3 divide it by the data-parallel degree); 0 when
    the profile did not measure it."""


@dataclass(frozen=True, kw_only=True)
class ProfileEntry:
    """Measured times of one (layer signature, tmp, mbs): median over `repeats` runs."""

    signature: str
    tmp: int
    mbs: int
    forward_s: float
    backward_s: float
    forward_std_s: float = 0.0
    backward_std_s: float = 0.0
    repeats: int = 0
    optimizer_step_s: float = 0.0
    """One Adam step over this layer's parameters at this tmp (the same for every mbs)."""

    def to_dict(self) -> dict:
        return asdict(self)


class LayerProfile:
    """A lookup table (signature, tmp, mbs) -> forward/backward seconds for one device and
    precision.

    `lookup` needs an exact (signature, tmp) match. Micro-batch sizes:
    - measured mbs: the measured times;
    - between two measured mbs: linear interpolation in mbs (time = a + b*mbs between them);
    - above the largest measured: per-sample scaling of the largest, t(m) = t(m_max) * m / m_max
      (large micro-batches saturate the kernels, so throughput per sample stays flat);
    - below the smallest measured: per-sample scaling of the smallest, t(m) = t(m_min) * m /
      m_min, which ignores fixed per-call costs and so is a lower bound (profile mbs 1 to avoid).
    """

    def __init__(self, *, device: str, precision: str, entries, versions: dict | None = None,
                 created: str = "", host: str = "", settings: dict | None = None,
                 path: Path | None = None,
                 framework_overheads: FrameworkOverheads | None = None,
                 speed_probe: SpeedProbe | None = None):
        self.device = device
        self.framework_overheads = framework_overheads
        self.speed_probe = speed_probe
        self.precision = precision
        self.versions = dict(versions or {})
        self.created = created or now_iso()
        self.host = host
        self.settings = dict(settings or {})
        self.path = path
        self._entries: dict[tuple[str, int, int], ProfileEntry] = {}
        for e in entries:
            self.add(e)

    # -- contents
    def add(self, entry: ProfileEntry) -> None:
        self._entries[(entry.signature, entry.tmp, entry.mbs)] = entry

    @property
    def entries(self) -> list[ProfileEntry]:
        return [self._entries[k] for k in sorted(self._entries)]

    @property
    def signatures(self) -> tuple[str, ...]:
        return tuple(sorted({k[0] for k in self._entries}))

    def measured_mbs(self, signature: str, tmp: int) -> list[int]:
        return sorted(m for (s, t, m) in self._entries if s == signature and t == tmp)

    def covers(self, signature: str, tmp: int) -> bool:
        return bool(self.measured_mbs(signature, tmp))

    @property
    def stale_versions(self) -> bool:
        """True when the libraries it was measured with differ from the installed ones."""
        now = installed_versions()
        return any(self.versions.get(k) != now.get(k) for k in now)

    @property
    def source(self) -> str:
        name = self.path.name if self.path else f"{self.device}/{self.precision}"
        return f"profile:{name}"

    # -- the lookup the cost model uses
    def lookup(self, signature: str, tmp: int, mbs: int) -> LayerTiming | None:
        ms = self.measured_mbs(signature, tmp)
        if not ms or mbs < 1:
            return None
        opt = max(self._entries[(signature, tmp, m)].optimizer_step_s for m in ms)
        if mbs in ms:
            e = self._entries[(signature, tmp, mbs)]
            return LayerTiming(e.forward_s, e.backward_s, self.source, opt)
        if mbs > ms[-1] or mbs < ms[0]:
            ref = ms[-1] if mbs > ms[-1] else ms[0]
            e = self._entries[(signature, tmp, ref)]
            k = mbs / ref
            return LayerTiming(e.forward_s * k, e.backward_s * k, self.source + ":extrapolated",
                               opt)
        i = bisect_left(ms, mbs)
        lo, hi = self._entries[(signature, tmp, ms[i - 1])], self._entries[(signature, tmp, ms[i])]
        w = (mbs - lo.mbs) / (hi.mbs - lo.mbs)
        return LayerTiming(lo.forward_s + w * (hi.forward_s - lo.forward_s),
                           lo.backward_s + w * (hi.backward_s - lo.backward_s),
                           self.source + ":interpolated", opt)

    # -- files
    def default_filename(self) -> str:
        digest = hashlib.sha256("\n".join(self.signatures).encode()).hexdigest()[:8]
        return f"{safe_name(self.device)}__{self.precision}__{digest}.json"

    def to_dict(self) -> dict:
        d = {"format": FORMAT, "device": self.device, "precision": self.precision,
             "versions": self.versions, "created": self.created, "host": self.host,
             "settings": self.settings, "entries": [e.to_dict() for e in self.entries]}
        if self.framework_overheads is not None:
            d["framework_overheads"] = self.framework_overheads.to_dict()
        if self.speed_probe is not None:
            d["speed_probe"] = self.speed_probe.to_dict()
        return d

    def save(self, path: Path) -> Path:
        """Write atomically (a partial profile after Ctrl-C is still a valid file)."""
        self.path = _write_atomic(path, self.to_dict())
        return self.path

    @classmethod
    def from_dict(cls, d: dict, path: Path | None = None) -> "LayerProfile":
        where = str(path) if path else "layer profile"
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise UsageError(f"{where}: not a layer profile of format {FORMAT}")
        try:
            entries = [ProfileEntry(signature=str(e["signature"]), tmp=int(e["tmp"]),
                                    mbs=int(e["mbs"]), forward_s=float(e["forward_s"]),
                                    backward_s=float(e["backward_s"]),
                                    forward_std_s=float(e.get("forward_std_s", 0.0)),
                                    backward_std_s=float(e.get("backward_std_s", 0.0)),
                                    repeats=int(e.get("repeats", 0)),
                                    optimizer_step_s=float(e.get("optimizer_step_s", 0.0)))
                       for e in d["entries"]]
            fw = d.get("framework_overheads")
            speed = d.get("speed_probe")
            return cls(device=str(d["device"]), precision=str(d["precision"]), entries=entries,
                       versions=d.get("versions") or {}, created=str(d.get("created", "")),
                       host=str(d.get("host", "")), settings=d.get("settings") or {}, path=path,
                       framework_overheads=None if fw is None
                       else FrameworkOverheads.from_dict(fw),
                       speed_probe=None if speed is None else SpeedProbe.from_dict(speed))
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where}: malformed layer profile ({exc!r})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "LayerProfile":
        return cls.from_dict(_load_json(Path(path), "profile"), path=Path(path))


def _write_atomic(path: str | os.PathLike, data: dict) -> Path:
    """Write JSON through a temporary file and a rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    return path


def _load_json(path: Path, what: str):
    """The JSON in `path`; a missing or unreadable file is a UsageError naming it."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {path}") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise UsageError(f"cannot read {what} {path}: {exc}") from None


def _read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def find_profile(device_name: str, precision: str, directory: Path, *,
                 signatures=None) -> LayerProfile | None:
    """The newest layer profile measured on `device_name` in `precision`, or None.

    Only files whose device name AND precision match are considered, so a profile from another
    device is never returned. With `signatures` (the layers the caller needs), a profile that
    covers more of them wins over a newer one that covers fewer.
    Files that do not parse as layer profiles (calibrations, stray files) are skipped.
    """
    directory = Path(directory)
    if not directory.is_dir():
        return None
    want = set(signatures or ())
    best, best_key = None, None
    for p in sorted(directory.glob("*.json")):
        d = _read_json(p)
        if not isinstance(d, dict) or d.get("format") != FORMAT or "entries" not in d:
            continue
        if d.get("device") != device_name or d.get("precision") != precision:
            continue
        try:
            prof = LayerProfile.from_dict(d, path=p)
        except UsageError:
            continue
        covered = len(want & set(prof.signatures))
        key = (covered, prof.created, p.name)
        if best_key is None or key > best_key:
            best, best_key = prof, key
    return best


# ----------------------------------------------------------------------------- link profiles

@dataclass(frozen=True, kw_only=True)
class LinkFit:
    """The fitted model of one collective on one link kind.

    alpha-beta:  t = steps(n) * alpha_s + bus(n) * S / bandwidth_bytes_per_s
    sigmoid:     t = steps(n) * alpha_s + bus(n) * S / (bandwidth_bytes_per_s * eff(S)),
                 eff(S) = floor + (1 - floor) / (1 + exp(-k (log2 S - x0)))
    (S: message bytes; n: group size; steps/bus: cost_models.comm `latency_steps` /
    `bus_factor`.)
    `model` says which one `time_s` uses (the one with the smaller error on the samples).
    """

    collective: str
    link: str
    alpha_s: float
    bandwidth_bytes_per_s: float
    model: str = "alpha-beta"
    sigmoid: dict | None = None
    """{'alpha_s', 'bandwidth_bytes_per_s', 'floor', 'k', 'x0'} when the sigmoid was fitted."""
    mape_alpha_beta: float = float("nan")
    mape_sigmoid: float = float("nan")
    group_sizes: tuple[int, ...] = ()
    message_bytes_range: tuple[float, float] = (0.0, 0.0)
    samples: int = 0

    def time_s(self, message_bytes: float, group_size: int) -> float:
        n = int(group_size)
        if n <= 1 and self.collective != "p2p":
            return 0.0
        if self.model == "sigmoid" and self.sigmoid:
            sg = self.sigmoid
            eff = float(sigmoid_efficiency(message_bytes, sg["floor"], sg["k"], sg["x0"]))
            return float(collective_time_s(self.collective, message_bytes, n,
                                           sg["bandwidth_bytes_per_s"] * eff, sg["alpha_s"]))
        return float(collective_time_s(self.collective, message_bytes, n,
                                       self.bandwidth_bytes_per_s, self.alpha_s))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["group_sizes"] = list(self.group_sizes)
        d["message_bytes_range"] = list(self.message_bytes_range)
        for k in ("mape_alpha_beta", "mape_sigmoid"):
            if isinstance(d[k], float) and math.isnan(d[k]):
                d[k] = None
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LinkFit":
        nan = float("nan")
        return cls(collective=str(d["collective"]), link=str(d["link"]),
                   alpha_s=float(d["alpha_s"]),
                   bandwidth_bytes_per_s=float(d["bandwidth_bytes_per_s"]),
                   model=str(d.get("model", "alpha-beta")), sigmoid=d.get("sigmoid"),
                   mape_alpha_beta=nan if d.get("mape_alpha_beta") is None
                   else float(d["mape_alpha_beta"]),
                   mape_sigmoid=nan if d.get("mape_sigmoid") is None else float(d["mape_sigmoid"]),
                   group_sizes=tuple(int(x) for x in d.get("group_sizes", ())),
                   message_bytes_range=tuple(float(x) for x in d.get("message_bytes_range",
                                                                     (0, 0))),
                   samples=int(d.get("samples", 0)))


@dataclass(frozen=True, kw_only=True)
class CommSample:
    """One measured point: seconds per operation, mean (`time_s`, what is fitted), standard
    deviation and median over `repeats` timed operations."""

    collective: str
    link: str
    group_size: int
    message_bytes: int
    time_s: float
    std_s: float = 0.0
    median_s: float = 0.0
    repeats: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(kw_only=True)
class CommProfile:
    """Measured collectives per link kind and their fits (see `LinkFit`).

    `time_s` returns None for a link kind that was not measured (a one-node machine has no
    'inter' samples): the caller then falls back to the spec's nominal bandwidth.
    """

    device: str
    backend: str
    world_size: int
    nodes: int
    fits: dict = field(default_factory=dict)
    """(collective, link) -> LinkFit"""
    samples: list = field(default_factory=list)
    versions: dict = field(default_factory=dict)
    created: str = ""
    host: str = ""
    settings: dict = field(default_factory=dict)
    path: Path | None = None

    @property
    def links_measured(self) -> tuple[str, ...]:
        return tuple(lk for lk in LINKS if any(k[1] == lk for k in self.fits))

    def fit(self, collective: str, link: str) -> LinkFit | None:
        return self.fits.get((collective, link))

    def time_s(self, collective: str, message_bytes: float, group_size: int,
               link: str) -> float | None:
        """Seconds for one `collective` of `message_bytes` (all-reduce: the buffer; all-gather:
        the gathered output; reduce-scatter: the input; p2p: the message) over `group_size`
        ranks on link kind 'intra' | 'inter'; None when that link kind was not measured."""
        if collective not in COLLECTIVES:
            raise ValueError(f"unknown collective {collective!r}; known: {COLLECTIVES}")
        if link not in LINKS:
            raise ValueError(f"unknown link {link!r}; known: {LINKS}")
        f = self.fits.get((collective, link))
        return None if f is None else f.time_s(float(message_bytes), int(group_size))

    def describe(self) -> str:
        missing = [lk for lk in LINKS if lk not in self.links_measured]
        note = f"; not measured: {', '.join(missing)} (nominal bandwidth used)" if missing else ""
        return (f"{self.path.name if self.path else self.device} ({self.backend}, "
                f"{self.world_size} ranks on {self.nodes} node(s)){note}")

    def default_filename(self) -> str:
        return f"{safe_name(self.device)}__{self.backend}.json"

    def to_dict(self) -> dict:
        return {"format": FORMAT, "kind": "comm", "device": self.device, "backend": self.backend,
                "world_size": self.world_size, "nodes": self.nodes,
                "links_measured": list(self.links_measured), "versions": self.versions,
                "created": self.created, "host": self.host, "settings": self.settings,
                "fits": [f.to_dict() for _, f in sorted(self.fits.items())],
                "samples": [s.to_dict() for s in self.samples]}

    def save(self, path: Path) -> Path:
        self.path = _write_atomic(path, self.to_dict())
        return self.path

    @classmethod
    def from_dict(cls, d: dict, path: Path | None = None) -> "CommProfile":
        where = str(path) if path else "comm profile"
        if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("kind") != "comm":
            raise UsageError(f"{where}: not a comm profile of format {FORMAT}")
        try:
            fits = {}
            for fd in d.get("fits", []):
                f = LinkFit.from_dict(fd)
                fits[(f.collective, f.link)] = f
            samples = [CommSample(**s) for s in d.get("samples", [])]
            return cls(device=str(d["device"]), backend=str(d["backend"]),
                       world_size=int(d["world_size"]), nodes=int(d["nodes"]), fits=fits,
                       samples=samples, versions=d.get("versions") or {},
                       created=str(d.get("created", "")), host=str(d.get("host", "")),
                       settings=d.get("settings") or {}, path=path)
        except (KeyError, TypeError, ValueError) as exc:
            raise UsageError(f"{where}: malformed comm profile ({exc!r})") from None

    @classmethod
    def load(cls, path: str | os.PathLike) -> "CommProfile":
        return cls.from_dict(_load_json(Path(path), "comm profile"), path=Path(path))


def find_comm_profile(directory: Path, *, device: str | None = None,
                      backend: str | None = None) -> CommProfile | None:
    """The newest comm profile in `directory` (optionally only for `device` / `backend`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    best, best_key = None, None
    for p in sorted(directory.glob("*.json")):
        d = _read_json(p)
        if not isinstance(d, dict) or d.get("kind") != "comm":
            continue
        if device is not None and d.get("device") != device:
            continue
        if backend is not None and d.get("backend") != backend:
            continue
        try:
            prof = CommProfile.from_dict(d, path=p)
        except UsageError:
            continue
        key = (prof.created, p.name)
        if best_key is None or key > best_key:
            best, best_key = prof, key
    return best


def hostname() -> str:
    import socket       # here: planning, which imports this module, never asks (5 ms)

    return socket.gethostname()


def worker_env(base=None) -> dict:
    """The environment of a profiling worker process: `base` (default: this process's) with
    the directory holding amp_search/ and cost_models/ first on PYTHONPATH, so that the
    worker imports this same code."""
    env = dict(os.environ if base is None else base)
    repo = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                else "")
    return env
