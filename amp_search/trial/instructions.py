"""DeepSpeed's own instruction timings of a trial (opt-in: `TrialConfig.instruction_trace`).

DeepSpeed's PipelineEngine runs one training batch as a stream of instructions per stage
(`deepspeed.runtime.pipe.schedule.TrainSchedule`): LoadMicroBatch, ForwardPass, BackwardPass,
SendActivation, RecvActivation, SendGrad, RecvGrad, then ReduceTiedGrads, ReduceGrads and
OptimizerStep, each executed by the method that `PipelineEngine._INSTRUCTION_MAP` names for
its class. `install_pipeline` replaces that map on one engine instance (the class is left
alone) by wrappers that take `time.perf_counter()` before and after each call; the plain
engine of pp = 1 with ZeRO 2 or 3 (`amp_search.trial.run._Sequential`) is timed by the trial
loop around its forward, backward and step calls instead (`InstructionRecorder.timed_call`).

Each rank writes one JSON file beside the trial's result (`trace_path`), holding the timed
iterations (those after the warm-up) only:

    {"format": "amp-search instruction trace", "version": 1, "rank": g, "stage": j,
     "replica": r, "tensor": t, "pp": .., "dp": .., "tmp": .., "gas": .., "engine":
     "pipeline" | "plain", "clock": "time.perf_counter, seconds from the iteration's barrier",
     "iterations": [{"iteration": i, "instructions": [[name, microbatch, start_s, end_s],
     ...]}, ...]}

Times are seconds from the moment the iteration's `dist.barrier()` returned on that rank:
every rank leaves the barrier at nearly the same moment (gloo over shared memory: tens of
microseconds apart), which aligns the ranks' clocks. `microbatch` is the micro-batch an
instruction serves (DeepSpeed's instructions name a pipe buffer, not a micro-batch; each
kind handles micro-batches 0 .. gas-1 in order, so the n-th of a kind in an iteration serves
micro-batch n), -1 for the per-batch ones. On CUDA the wrapper synchronises the device
before taking each end time, so the times are the device's, not the launch queue's.

`read_trace` reads and checks one file; `train_order` gives an iteration's instructions in
the vocabulary of `cost_models.schedule.deepspeed_train_order`; `chrome_trace` draws the
measured instructions in the Chrome trace format that `amp-search timeline --trace` writes.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

FORMAT = "amp-search instruction trace"
VERSION = 1
CLOCK = "time.perf_counter, seconds from the iteration's barrier"

PIPELINE_INSTRUCTIONS = ("LoadMicroBatch", "ForwardPass", "BackwardPass", "SendActivation",
                         "RecvActivation", "SendGrad", "RecvGrad", "ReduceTiedGrads",
                         "ReduceGrads", "OptimizerStep")
"""The instruction classes of DeepSpeed's TrainSchedule, by name (`_INSTRUCTION_MAP`'s keys)."""

PER_MICROBATCH = ("LoadMicroBatch", "ForwardPass", "BackwardPass", "SendActivation",
                  "RecvActivation", "SendGrad", "RecvGrad")
"""Instructions that serve one micro-batch; the others run once per batch."""

ENGINES = ("pipeline", "plain")

P2P_PEER = {"SendActivation": +1, "RecvActivation": -1, "SendGrad": -1, "RecvGrad": +1}
"""The other stage of a P2P instruction, relative to its own."""


def trace_path(output: str | Path, rank: int) -> Path:
    """Where global rank `rank` writes its trace: beside the result JSON `output`."""
    return Path(output).parent / f"instructions-rank{rank}.json"


# ----------------------------------------------------------------------------- recording

class InstructionRecorder:
    """Collects one rank's instruction times, for the iterations it is told to time."""

    def __init__(self, *, rank: int, stage: int, replica: int, tensor: int, pp: int, dp: int,
                 tmp: int, gas: int, engine: str, sync: Callable[[], None] | None = None):
        if engine not in ENGINES:
            raise ValueError(f"engine {engine!r}; known: {', '.join(ENGINES)}")
        self.meta = {"rank": rank, "stage": stage, "replica": replica, "tensor": tensor,
                     "pp": pp, "dp": dp, "tmp": tmp, "gas": gas, "engine": engine}
        self.sync = sync
        self.iterations: list[dict] = []
        self._t0: float | None = None
        self._rows: list | None = None
        self._count: dict[str, int] = {}

    @property
    def recording(self) -> bool:
        return self._rows is not None

    def begin(self, iteration: int, t0: float) -> None:
        """Start timing iteration `iteration`, whose barrier returned at perf_counter t0."""
        self._t0, self._rows, self._count = t0, [], {}
        self.iterations.append({"iteration": iteration, "instructions": self._rows})

    def end(self) -> None:
        self._t0, self._rows = None, None

    def add(self, name: str, start: float, end: float) -> None:
        """One instruction that ran from perf_counter `start` to `end`."""
        if self._rows is None:
            return
        if name in PER_MICROBATCH:
            mb = self._count.get(name, 0)
            self._count[name] = mb + 1
        else:
            mb = -1
        self._rows.append([name, mb, start - self._t0, end - self._t0])

    def timed_call(self, name: str, fn: Callable, *args, **kwargs):
        """fn(*args, **kwargs), recorded as instruction `name` while recording."""
        if self._rows is None:
            return fn(*args, **kwargs)
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            if self.sync is not None:
                self.sync()
            self.add(name, t, time.perf_counter())

    def to_dict(self) -> dict:
        return {"format": FORMAT, "version": VERSION, **self.meta, "clock": CLOCK,
                "iterations": self.iterations}

    def write(self, path: Path) -> None:
        """Write the trace atomically (a reader never sees half a file)."""
        path = Path(path)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.to_dict(), separators=(",", ":")))
        tmp.replace(path)


def install_pipeline(engine, recorder: InstructionRecorder) -> None:
    """Time every instruction `engine` (a DeepSpeed PipelineEngine) executes: its
    `_exec_schedule` looks the executor of each instruction up in `self._INSTRUCTION_MAP`,
    which this shadows on the instance with timing wrappers of the class's executors."""
    table = type(engine)._INSTRUCTION_MAP
    missing = sorted(set(PIPELINE_INSTRUCTIONS) - {cls.__name__ for cls in table})
    if missing:
        raise RuntimeError(f"this DeepSpeed's PipelineEngine has no executor for "
                           f"{', '.join(missing)}; the instruction trace cannot time it")

    def timed(name: str, fn: Callable) -> Callable:
        def run(self, *args, **kwargs):
            return recorder.timed_call(name, fn, self, *args, **kwargs)
        run.__name__ = getattr(fn, "__name__", name)
        return run

    engine._INSTRUCTION_MAP = {cls: timed(cls.__name__, fn) for cls, fn in table.items()}


# ----------------------------------------------------------------------------- reading

@dataclass(frozen=True)
class Instruction:
    """One executed instruction (seconds from the iteration's barrier)."""

    name: str
    microbatch: int
    start_s: float
    end_s: float

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class RankTrace:
    """One rank's trace file."""

    rank: int
    stage: int
    replica: int
    tensor: int
    pp: int
    dp: int
    tmp: int
    gas: int
    engine: str
    iterations: tuple[tuple[Instruction, ...], ...]
    iteration_numbers: tuple[int, ...]


def read_trace(path: str | Path) -> RankTrace:
    """Read and check one rank's trace file; ValueError names what is wrong."""
    path = Path(path)
    try:
        d = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT or d.get("version") != VERSION:
        raise ValueError(f"{path}: not an {FORMAT} of version {VERSION}")
    ints = ("rank", "stage", "replica", "tensor", "pp", "dp", "tmp", "gas")
    for k in ints:
        if not isinstance(d.get(k), int) or isinstance(d.get(k), bool) or d[k] < 0:
            raise ValueError(f"{path}: {k} must be an integer >= 0")
    if d.get("engine") not in ENGINES:
        raise ValueError(f"{path}: engine must be one of {', '.join(ENGINES)}")
    if not d["stage"] < d["pp"]:
        raise ValueError(f"{path}: stage {d['stage']} of pp {d['pp']}")
    known = set(PIPELINE_INSTRUCTIONS)
    iterations, numbers = [], []
    for it in d.get("iterations", []):
        rows = []
        last_end = 0.0
        for row in it["instructions"]:
            name, mb, start, end = row
            if name not in known:
                raise ValueError(f"{path}: unknown instruction {name!r}")
            if not (isinstance(mb, int) and -1 <= mb < d["gas"]):
                raise ValueError(f"{path}: {name} micro-batch {mb} outside -1 .. gas-1")
            if (mb >= 0) != (name in PER_MICROBATCH):
                raise ValueError(f"{path}: {name} with micro-batch {mb}")
            start, end = float(start), float(end)
            if not (0.0 <= start <= end) or start < last_end - 1e-9:
                raise ValueError(f"{path}: iteration {it['iteration']}: {name} from {start} "
                                 f"to {end} s is out of order")
            last_end = end
            rows.append(Instruction(name, mb, start, end))
        iterations.append(tuple(rows))
        numbers.append(int(it["iteration"]))
    return RankTrace(**{k: d[k] for k in ints}, engine=d["engine"],
                     iterations=tuple(iterations), iteration_numbers=tuple(numbers))


def read_traces(trial_dir: str | Path) -> list[RankTrace]:
    """Every rank's trace in `trial_dir`, by rank."""
    traces = [read_trace(p) for p in Path(trial_dir).glob("instructions-rank*.json")]
    return sorted(traces, key=lambda t: t.rank)


def train_order(trace: RankTrace, iteration: int = 0) -> list[tuple[str, int, int]]:
    """The iteration's forward, backward, send and receive instructions as (kind,
    micro-batch, peer stage) with the kinds of `cost_models.simulator.KINDS` ("forward",
    "backward", "send", "recv"; peer -1 for a pass), the vocabulary of
    `deepspeed_train_order`. LoadMicroBatch and the per-batch instructions are left out."""
    out = []
    j = trace.stage
    for x in trace.iterations[iteration]:
        if x.name == "ForwardPass":
            out.append(("forward", x.microbatch, -1))
        elif x.name == "BackwardPass":
            out.append(("backward", x.microbatch, -1))
        elif x.name in P2P_PEER:
            out.append(("send" if x.name.startswith("Send") else "recv", x.microbatch,
                        j + P2P_PEER[x.name]))
    return out


KIND_OF = {"ForwardPass": "forward", "BackwardPass": "backward", "OptimizerStep": "optimizer",
           "SendActivation": "send", "SendGrad": "send", "RecvActivation": "recv",
           "RecvGrad": "recv", "ReduceGrads": "allreduce", "ReduceTiedGrads": "allreduce",
           "LoadMicroBatch": "load"}
"""The simulator's kind (`cost_models.simulator.KINDS`) each instruction's time counts as;
LoadMicroBatch (host-side batch copy) has none: "load"."""

_TRACE_COLOURS = {"forward": "thread_state_running", "backward": "thread_state_iowait",
                  "optimizer": "good", "send": "bad", "recv": "terrible",
                  "allreduce": "rail_animation", "load": "generic_work"}


def chrome_trace(traces: list[RankTrace], iteration: int = 0, *, pid_offset: int = 0,
                 title: str = "measured") -> dict:
    """One iteration of the measured instructions as a Chrome trace (the format of
    `amp_search.timeline.chrome_trace`): one process per rank, named by its stage, replica
    and tensor rank, one thread ("compute": DeepSpeed runs every instruction, blocking sends
    and receives included, on the stage's one Python thread); ts and dur in microseconds."""
    events: list[dict] = []
    for i, t in enumerate(traces):
        pid = pid_offset + i
        name = f"{title} stage {t.stage}" + (f" replica {t.replica}" if t.dp > 1 else "") + \
            (f" tensor {t.tensor}" if t.tmp > 1 else "") + f" (rank {t.rank})"
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_name",
                       "args": {"name": name}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "process_sort_index",
                       "args": {"sort_index": pid}})
        events.append({"ph": "M", "pid": pid, "tid": 0, "name": "thread_name",
                       "args": {"name": "compute"}})
        for x in t.iterations[iteration]:
            kind = KIND_OF[x.name]
            label = x.name + (f" mb {x.microbatch}" if x.microbatch >= 0 else "")
            events.append({"name": label, "cat": kind, "ph": "X", "ts": x.start_s * 1e6,
                           "dur": x.duration_s * 1e6, "pid": pid, "tid": 0,
                           "cname": _TRACE_COLOURS[kind],
                           "args": {"microbatch": x.microbatch} if x.microbatch >= 0 else {}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "amp-search measured DeepSpeed instructions",
                          "iteration": iteration}}
