"""Pictures of a simulated iteration (cost_models.simulator.SimulatedIteration).

- `write_chrome_trace`: the Chrome trace event format (JSON), which Perfetto
  (ui.perfetto.dev) and chrome://tracing open, the convention of the profilers of this
  field (PyTorch's profiler, Nsight's export, DeepSpeed's flops profiler timeline). One
  process per pipeline stage, one thread per stream (compute, send_next, send_prev,
  recv_prev, recv_next, dp); every event is a complete ("X") event with ts and dur in
  microseconds, and the idle gaps of the compute stream are events too, so the bubble shows.
- `write_gantt_png`: a Gantt chart with matplotlib (`gantt_figure`: the Agg canvas, no pyplot
  and no global backend change, one PolyCollection per kind of task): one row per stage,
  its compute stream as the main band (forward, recompute, backward, optimizer step, idle
  and, with DeepSpeed's blocking P2P, the time blocked in a send or a receive, in distinct
  colours), its P2P sends and its data-parallel collectives as two thin lanes under it;
  time in milliseconds.

Both read the columns of `sim.table`, so a large timeline stays cheap to write.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from cost_models.simulator import KINDS, STREAMS, SimulatedIteration

COLOURS = {
    "forward": "#4c72b0",
    "recompute": "#8172b3",
    "backward": "#dd8452",
    "optimizer": "#55a868",
    "idle": "#e6e6e6",
    "send": "#c44e52",
    "recv": "#eaa6a8",
    "allreduce": "#937860",
    "reduce_scatter": "#937860",
    "allgather": "#da8bc3",
}
"""Colour of each event kind in the PNG (and the trace's colour names below)."""

_TRACE_COLOURS = {"forward": "thread_state_running", "recompute": "rail_load",
                  "backward": "thread_state_iowait", "optimizer": "good", "idle": "grey",
                  "send": "bad", "recv": "terrible", "allreduce": "rail_animation",
                  "reduce_scatter": "rail_animation", "allgather": "rail_idle"}
"""Chrome's reserved colour names (cname) per kind; Perfetto picks its own colours."""


def _stage_names(sim: SimulatedIteration, stage_names: Sequence[str] | None) -> list[str]:
    if stage_names is None:
        return [f"stage {j}" for j in range(sim.pp)]
    names = [str(n) for n in stage_names]
    if len(names) != sim.pp:
        raise ValueError(f"stage_names needs {sim.pp} names, got {len(names)}")
    return names


def chrome_trace(sim: SimulatedIteration, *, stage_names: Sequence[str] | None = None
                 ) -> dict:
    """The iteration as a Chrome trace (a JSON-ready dict): {"traceEvents": [...],
    "displayTimeUnit": "ms", "otherData": {...}}. Metadata ("M") events name each process
    (stage) and thread (stream); then one "X" event per simulated event."""
    names = _stage_names(sim, stage_names)
    t = sim.table
    events: list[dict] = []
    for j, name in enumerate(names):
        events.append({"ph": "M", "pid": j, "tid": 0, "name": "process_name",
                       "args": {"name": name}})
        events.append({"ph": "M", "pid": j, "tid": 0, "name": "process_sort_index",
                       "args": {"sort_index": j}})
        for k, stream in enumerate(STREAMS):
            events.append({"ph": "M", "pid": j, "tid": k, "name": "thread_name",
                           "args": {"name": stream}})
            events.append({"ph": "M", "pid": j, "tid": k, "name": "thread_sort_index",
                           "args": {"sort_index": k}})
    order = np.lexsort((t.start_s, t.stream, t.stage))
    ts = (t.start_s[order] * 1e6).tolist()
    dur = ((t.end_s[order] - t.start_s[order]) * 1e6).tolist()
    stage, stream, kind = t.stage[order].tolist(), t.stream[order].tolist(), \
        t.kind[order].tolist()
    mb = t.microbatch[order].tolist()
    for i, row in enumerate(order.tolist()):
        k = KINDS[kind[i]]
        args = {"microbatch": mb[i]} if mb[i] >= 0 else {}
        events.append({"name": t.label(row), "cat": k, "ph": "X", "ts": ts[i],
                       "dur": max(dur[i], 0.0), "pid": stage[i], "tid": stream[i],
                       "cname": _TRACE_COLOURS[k], "args": args})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"source": "amp-search simulated iteration",
                          "schedule": sim.schedule, "pp": sim.pp, "gas": sim.gas,
                          "iteration_time_s": sim.iteration_time_s}}


def _write_atomically(path: Path, write) -> None:
    """Write through a temporary file beside `path`, renamed over it when complete."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_chrome_trace(sim: SimulatedIteration, path: str | os.PathLike, *,
                       stage_names: Sequence[str] | None = None) -> None:
    """Write `chrome_trace(sim)` as JSON to `path` (open it in ui.perfetto.dev or
    chrome://tracing). stage_names: one process name per stage (default 'stage j').
    Raises OSError when the file cannot be written."""
    data = chrome_trace(sim, stage_names=stage_names)

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as fh:
            # dumps, not dump: json.dump streams through the pure-Python encoder, several
            # times slower than dumps' C encoder on a trace of thousands of events
            fh.write(json.dumps(data, separators=(",", ":")))
            fh.write("\n")

    _write_atomically(Path(path), write)


def write_gantt_png(sim: SimulatedIteration, path: str | os.PathLike, *, title: str = "",
                    stage_names: Sequence[str] | None = None, dpi: int = 120) -> None:
    """Draw the iteration as a Gantt chart into a PNG at `path`: a row per stage (stage 0 on
    top), compute in the main band, P2P sends and data-parallel collectives in two thin lanes
    under it, the bubble as light grey idle, a dashed line where the iteration ends; the x axis in
    milliseconds (`gantt_figure`). Needs matplotlib (ImportError without it); raises OSError
    when the file cannot be written."""
    fig = gantt_figure(sim, title=title, stage_names=stage_names)
    _write_atomically(Path(path), lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))


class PngWriter:
    """`write_gantt_png` in a helper process (amp_search._png_worker) started at construction,
    so that its import of matplotlib (about 0.3 s) runs beside the caller's planning on
    another core. `write` hands it the job and waits; `close` stops it if no job came (use
    it in a finally, or as a context manager)."""

    def __init__(self) -> None:
        import subprocess
        import sys

        self._proc = subprocess.Popen([sys.executable, "-m", "amp_search._png_worker"],
                                      stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE)

    def write(self, sim: SimulatedIteration, path: str | os.PathLike, *, title: str = "",
              stage_names: Sequence[str] | None = None) -> None:
        """Draw `sim` into the PNG at `path`; OSError with the helper's message when it
        cannot be written."""
        import pickle

        job = {"sim": sim, "path": str(path), "title": title,
               "stage_names": None if stage_names is None else list(stage_names)}
        _, err = self._proc.communicate(pickle.dumps(job))
        if self._proc.returncode != 0:
            lines = err.decode(errors="replace").strip().splitlines()
            raise OSError(lines[-1] if lines else
                          f"the drawing process ended with status {self._proc.returncode}")

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stderr):
            if stream is not None and not stream.closed:
                stream.close()

    def __enter__(self) -> "PngWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def gantt_figure(sim: SimulatedIteration, *, title: str = "",
                 stage_names: Sequence[str] | None = None):
    """The Gantt chart of `write_gantt_png` as a matplotlib Figure on the Agg canvas, laid
    out. Every drawn task is one rectangle of the one PolyCollection of its kind (in the order
    of COLOURS), so that the figure holds a few artists however many tasks it shows."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    names = _stage_names(sim, stage_names)
    t = sim.table
    pp = sim.pp
    row_in = min(0.45, 18.0 / max(pp, 1))
    fig = Figure(figsize=(13.0, 1.6 + row_in * pp))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    start_ms = t.start_s * 1e3
    width_ms = (t.end_s - t.start_s) * 1e3
    # the lane of each stream (y offset in its stage's row, height): compute, then the
    # stage's sends, then dp; the receives are not drawn (the compute stream shows the wait)
    lane_y0, lane_h = np.full(len(STREAMS), np.nan), np.zeros(len(STREAMS))
    for streams, offset, h in ((("compute",), -0.38, 0.56),
                               (("send_next", "send_prev"), 0.21, 0.08), (("dp",), 0.31, 0.08)):
        for name in streams:
            lane_y0[STREAMS.index(name)], lane_h[STREAMS.index(name)] = offset, h
    kind_names = np.array(KINDS)[t.kind]
    drawn = ~np.isnan(lane_y0[t.stream]) & (width_ms > 0)
    y0 = t.stage + lane_y0[t.stream]
    y1 = y0 + lane_h[t.stream]
    # one collection of rectangles per kind, in the order of COLOURS (the drawing order of
    # one bar per task, drawn kind after kind)
    shown = []
    for kind, colour in COLOURS.items():
        sel = drawn & (kind_names == kind)
        if not sel.any():
            continue
        x0, b, top = start_ms[sel], y0[sel], y1[sel]
        x1 = x0 + width_ms[sel]
        corners = np.stack([np.stack([x0, b], 1), np.stack([x0, top], 1),
                            np.stack([x1, top], 1), np.stack([x1, b], 1)], axis=1)
        ax.add_collection(PolyCollection(
            corners, closed=True, facecolors=colour,
            edgecolors="none" if kind == "idle" else "white",
            linewidths=0.3 if pp * sim.gas <= 512 else 0.0), autolim=False)
        shown.append(kind)
    end_ms = sim.makespan_s * 1e3
    ax.axvline(end_ms, color="black", linestyle="--", linewidth=0.8)
    ax.set_ylim(pp - 0.4, -0.6)
    ax.set_yticks(range(pp))
    ax.set_yticklabels(names, fontsize=8 if pp <= 32 else 5)
    ax.set_xlim(0.0, end_ms * 1.02 if end_ms > 0 else 1.0)
    ax.set_xlabel("time (ms)")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    label = {"allreduce": "all-reduce (dp)", "reduce_scatter": "reduce-scatter (dp)",
             "allgather": "all-gather (dp)", "send": "P2P send (blocked in it)",
             "recv": "blocked in P2P receive", "idle": "idle (bubble)",
             "optimizer": "optimizer step"}
    handles = [Patch(facecolor=COLOURS[k], label=label.get(k, k)) for k in shown]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.10 - 0.6 / (
        1.6 + row_in * pp)), ncol=min(len(handles), 8), fontsize=8, frameon=False)
    heading = title or f"{sim.schedule.upper()} pp {sim.pp}, gas {sim.gas}"
    ax.set_title(f"{heading}: {sim.iteration_time_s * 1e3:.4g} ms per iteration (simulated)",
                 fontsize=10)
    fig.tight_layout()
    # tight_layout leaves a placeholder layout engine, for which savefig lays the figure out
    # (a whole draw) once more; the layout is done
    fig.set_layout_engine(None)
    return fig


def _spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman's rank correlation (average ranks for ties); nan below 2 points or for a
    constant series."""
    def ranks(a):
        order = np.argsort(a, kind="stable")
        r = np.empty(len(a))
        r[order] = np.arange(len(a), dtype=float)
        for v in np.unique(a):                    # ties share their mean rank
            tie = a == v
            r[tie] = r[tie].mean()
        return r
    if len(x) < 2:
        return float("nan")
    rx, ry = ranks(np.asarray(x, float)), ranks(np.asarray(y, float))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def write_prediction_png(series, path: str | os.PathLike, *, title: str = "",
                         labels: Sequence[str] | None = None, dpi: int = 120) -> None:
    """Predicted against measured iteration time: one scatter per entry of `series` ({name:
    (predicted_s, measured_s)}, sequences of one length), the diagonal (a perfect
    prediction) and +-10% bands, each series' MAPE and Spearman in the legend; `labels`
    (one per point of the first series) annotate its points. Needs matplotlib; raises
    ValueError for empty or mismatched series, OSError when the file cannot be written."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    data = {}
    for name, (pred, meas) in series.items():
        p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
        if p.shape != m.shape or p.ndim != 1:
            raise ValueError(f"series {name!r}: predicted and measured need one length")
        if p.size:
            data[name] = (p, m)
    if not data:
        raise ValueError("no point to plot")
    fig = Figure(figsize=(6.4, 6.0))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    every = np.concatenate([np.concatenate(v) for v in data.values()])
    lo, hi = float(every.min()) * 0.9, float(every.max()) * 1.1
    line = np.array([lo, hi])
    ax.plot(line, line, color="black", linewidth=0.9, label="predicted = measured")
    for f in (0.9, 1.1):
        ax.plot(line, line * f, color="grey", linewidth=0.6, linestyle=":")
    markers = "oxs^vD"
    for i, (name, (p, m)) in enumerate(data.items()):
        err = float(np.mean(np.abs(p / m - 1.0))) * 100
        rho = _spearman(p, m)
        ax.scatter(m, p, s=22, marker=markers[i % len(markers)],
                   label=f"{name}: MAPE {err:.1f}%, Spearman {rho:.2f} (n={len(p)})")
        if i == 0 and labels is not None:
            for x, y, text in zip(m, p, labels):
                ax.annotate(str(text), (x, y), fontsize=5, xytext=(3, 2),
                            textcoords="offset points", alpha=0.7)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.set_xlabel("measured s / iteration")
    ax.set_ylabel("predicted s / iteration")
    ax.grid(linewidth=0.3, alpha=0.5)
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title or "predicted against measured (dotted: +-10%)", fontsize=9)
    fig.tight_layout()
    fig.set_layout_engine(None)     # laid out: no second layout pass in savefig
    _write_atomically(Path(path), lambda tmp: fig.savefig(tmp, dpi=dpi, format="png"))
