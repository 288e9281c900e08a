"""The pictures of a simulated iteration (amp_search.timeline) and the `timeline` sub-command
(amp_search.cli.timeline), which builds the simulator's input from the cost model."""
from __future__ import annotations

import argparse
import functools
import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest

from amp_search.cli import timeline as cli
from amp_search.timeline import chrome_trace, write_chrome_trace, write_gantt_png
from cost_models.simulator import STREAMS, simulate_iteration
from conftest import ROOT


def _sim(**kw):
    base = dict(forward_s=[1e-3, 1.2e-3, 0.9e-3], backward_s=[2e-3, 2.4e-3, 1.8e-3],
                optimizer_s=[3e-4] * 3, gas=6, p2p_bytes=[2e6, 2e6],
                p2p_latency_s=[1e-5, 1e-5], p2p_bandwidth_bytes_per_s=[5e9, 5e9], dp=2,
                gradient_bytes=[4e8, 5e8, 3e8], dp_latency_s=[1e-5] * 3,
                dp_bandwidth_bytes_per_s=[1e10] * 3, bucket_bytes=2e8, overlap=True,
                recompute_s=[1e-3, 1.2e-3, 0.9e-3], use_numba=False)
    base.update(kw)
    return simulate_iteration(**base)


def test_chrome_trace_is_valid_with_one_event_per_simulated_event(tmp_path):
    sim = _sim()
    path = tmp_path / "trace.json"
    names = [f"stage {j} (test)" for j in range(sim.pp)]
    write_chrome_trace(sim, path, stage_names=names)
    data = json.loads(path.read_text())
    events = data["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(sim.table) == len(sim.events)
    assert data["displayTimeUnit"] == "ms"
    meta = {(e["pid"], e["name"]): e["args"] for e in events if e["ph"] == "M"
            and e["name"] == "process_name"}
    assert [meta[(j, "process_name")]["name"] for j in range(sim.pp)] == names
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["ph"] == "M"
               and e["name"] == "thread_name"}
    assert threads[(0, 0)] == "compute" and set(threads.values()) == set(STREAMS)
    by_stream: dict = {}
    for e in complete:
        assert {"name", "cat", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["dur"] >= 0 and e["ts"] >= 0
        by_stream.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for spans in by_stream.values():            # no two events of one stream overlap
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:]))
    # microseconds: the last compute event ends where the iteration does
    end = max(e["ts"] + e["dur"] for e in complete if e["tid"] == 0)
    assert end == pytest.approx(sim.makespan_s * 1e6, rel=1e-9)
    kinds = {e["cat"] for e in complete}
    assert {"forward", "recompute", "backward", "optimizer", "send", "recv", "allreduce",
            "idle"} <= kinds


def test_chrome_trace_checks_stage_names():
    with pytest.raises(ValueError, match="stage_names needs 3"):
        chrome_trace(_sim(), stage_names=["a"])


def test_gantt_png_is_written(tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "gantt.png"
    write_gantt_png(_sim(), path, title="test pipeline")
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    assert not list(tmp_path.glob(".*.tmp"))        # written through a renamed temporary


def test_png_writer_draws_the_same_png_in_its_own_process(tmp_path):
    """timeline's PngWriter: the helper process writes the bytes write_gantt_png writes; a bad
    path is an OSError with the helper's message; closed without a job, it is stopped."""
    pytest.importorskip("matplotlib")
    from amp_search.timeline import PngWriter

    sim = _sim()
    write_gantt_png(sim, tmp_path / "here.png", title="t", stage_names=["a", "b", "c"])
    with PngWriter() as w:
        w.write(sim, tmp_path / "there.png", title="t", stage_names=["a", "b", "c"])
    assert (tmp_path / "there.png").read_bytes() == (tmp_path / "here.png").read_bytes()
    with PngWriter() as w, pytest.raises(OSError, match="No such file"):
        w.write(sim, tmp_path / "missing" / "x.png")
    w = PngWriter()
    w.close()
    assert w._proc.returncode is not None


def test_gantt_draws_each_task_once_in_one_collection_per_kind():
    """Every task of the compute stream, the sends and the data-parallel stream that lasts is
    one rectangle at its start, of its duration, in its stage's row and lane; the receives are
    not drawn; one collection per kind, however many tasks."""
    pytest.importorskip("matplotlib")
    from matplotlib.colors import to_rgb

    from amp_search.timeline import COLOURS, gantt_figure
    from cost_models.simulator import KINDS

    sim = _sim(gas=12)
    ax = gantt_figure(sim, title="test").axes[0]
    t = sim.table
    drawn_streams = [STREAMS.index(s) for s in ("compute", "send_next", "send_prev", "dp")]
    lasting = np.isin(t.stream, drawn_streams) & (t.end_s > t.start_s)
    colours = {c.get_facecolor()[0][:3].round(4).tobytes(): c for c in ax.collections}
    assert len(ax.collections) == len({KINDS[k] for k in t.kind[lasting]})
    for k in np.unique(t.kind[lasting]):
        mine = lasting & (t.kind == k)
        coll = colours[np.round(to_rgb(COLOURS[KINDS[k]]), 4).tobytes()]
        boxes = np.array([p.vertices[:4] for p in coll.get_paths()])   # (n, 4 corners, xy)
        assert len(boxes) == mine.sum()
        x0, x1 = boxes[:, :, 0].min(axis=1), boxes[:, :, 0].max(axis=1)
        y0 = boxes[:, :, 1].min(axis=1)
        order = np.lexsort((y0, x0))
        want = np.lexsort((t.stage[mine], t.start_s[mine]))
        assert np.allclose(x0[order], t.start_s[mine][want] * 1e3)
        assert np.allclose(x1[order] - x0[order],
                           (t.end_s[mine] - t.start_s[mine])[want] * 1e3)
        assert np.array_equal(np.floor(y0[order] + 0.5).astype(int), t.stage[mine][want])


def _run(argv, monkeypatch, capsys):
    """Run `amp-search timeline ...` through its own parser (the command is registered in
    amp_search.cli by the planner's owner), with the plain-Python kernel (no compile)."""
    monkeypatch.setattr(cli, "simulate_iteration",
                        functools.partial(simulate_iteration, use_numba=False))
    parser = argparse.ArgumentParser(prog="amp-search")
    cli.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["timeline", *argv])
    code = args.func(args)
    return code, capsys.readouterr().out


def test_timeline_command_writes_both_files(tmp_path, monkeypatch, capsys):
    trace, png = tmp_path / "t.json", tmp_path / "g.png"
    argv = [str(ROOT / "configs" / "amp-hetero-gpt2.yaml"), "--pp", "4", "--dp", "4", "--tmp",
            "1", "--mbs", "2", "--partition", "uniform", "--trace", str(trace)]
    if importlib.util.find_spec("matplotlib") is not None:
        argv += ["--png", str(png)]
    else:
        png = None
    code, out = _run(argv, monkeypatch, capsys)
    assert code == 0
    assert "iteration: simulated" in out and "analytic (AMP eq. 5 + 4)" in out
    assert out.count("stage ") >= 4 and "critical path:" in out
    assert len(json.loads(trace.read_text())["traceEvents"]) > 100
    if png is not None:
        assert png.read_bytes()[:4] == b"\x89PNG"


def test_timeline_refuses_zero_3_from_the_plan(monkeypatch, capsys):
    """A strategy the simulator cannot play (ZeRO 3 with pp > 1) gets one clear line."""
    from dataclasses import replace

    from amp_search import estimate, load_spec
    from amp_search.errors import UsageError

    e = estimate(load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml"), pp=1, dp=16, tmp=1,
                 mbs=1, zero_stage=3, partition="uniform")
    e = replace(e, strategy=replace(e.strategy, pp=2))
    monkeypatch.setattr(cli, "chosen_strategy", lambda spec, args, m: (e, "given strategy"))
    with pytest.raises(UsageError, match="ZeRO 3 with pp > 1 is not simulated"):
        _run([str(ROOT / "configs" / "amp-homo-gpt2.yaml"), "--rank", "1"], monkeypatch,
             capsys)


def _no_measurements():
    from amp_search.measurements import NO_MEASUREMENTS

    return NO_MEASUREMENTS


def test_registering_the_command_imports_no_numpy():
    """build_parser imports every command module for every amp-search run: this one must
    not pull in numpy, numba or the simulator."""
    code = ("import sys, argparse, amp_search.cli.timeline as t; "
            "t.add_parser(argparse.ArgumentParser().add_subparsers()); "
            "bad = [m for m in ('numpy', 'numba', 'cost_models.simulator') if m in sys.modules]; "
            "sys.exit(str(bad) if bad else 0)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("argv,match", [
    (["--pp", "2"], "missing: --dp --tmp --mbs"),
    (["--pp", "2", "--dp", "8", "--tmp", "1", "--mbs", "1", "--schedule", "zb"],
     "accepted: 1f1b, gpipe"),
    (["--rank", "1", "--pp", "2"], "exclude each other"),
    (["--pp", "1", "--dp", "16", "--tmp", "1", "--mbs", "1", "--zero-stage", "2",
      "--partition", "uniform", "--no-files"], None),
])
def test_timeline_command_usage(argv, match, monkeypatch, capsys):
    from amp_search.errors import UsageError

    spec = str(ROOT / "configs" / "amp-homo-gpt2.yaml")
    if match is None:           # ZeRO 2 at pp 1: reduce-scatter per micro-batch, all-gather
        code, out = _run([spec, *argv], monkeypatch, capsys)
        assert code == 0 and "pp1-dp16-tmp1-mbs1-z2" in out and "gradient buckets" in out
        return
    with pytest.raises(UsageError, match=match):
        _run([spec, *argv], monkeypatch, capsys)


def test_timeline_writes_both_files_by_default_named_after_the_spec(tmp_path, monkeypatch,
                                                                    capsys):
    monkeypatch.chdir(tmp_path)
    code, out = _run([str(ROOT / "configs" / "amp-hetero-gpt2.yaml"), "--rank", "1"],
                     monkeypatch, capsys)
    assert code == 0
    trace = tmp_path / "amp-hetero-gpt2-timeline.json"
    assert json.loads(trace.read_text())["traceEvents"]
    assert f"wrote Chrome trace {trace.name}" in out
    png = tmp_path / "amp-hetero-gpt2-timeline.png"
    if importlib.util.find_spec("matplotlib") is not None:
        assert png.read_bytes()[:4] == b"\x89PNG" and f"wrote Gantt chart {png.name}" in out
    else:
        assert not png.exists() and "no Gantt chart without matplotlib" in out
    for f in tmp_path.iterdir():
        f.unlink()
    code, out = _run([str(ROOT / "configs" / "amp-hetero-gpt2.yaml"), "--rank", "1",
                      "--no-files"], monkeypatch, capsys)
    assert code == 0 and "wrote" not in out and not any(tmp_path.iterdir())
