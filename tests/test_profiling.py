"""Layer and link profiles: the lookup table, the file format, device matching, the sweeps and
the fits. Nothing here depends on how fast the machine is."""
from __future__ import annotations

import argparse
import json
import math

import pytest

from amp_search.errors import UsageError
from amp_search.profiling import comm as comm_mod
from amp_search.profiling import layers as layers_mod
from amp_search.profiling.store import (CommProfile, CommSample, LayerProfile, ProfileEntry,
                                        find_comm_profile, find_profile, installed_versions)
from cost_models.comm import bus_factor, latency_steps, sigmoid_efficiency
from amp_search.spec import parse_spec
from conftest import time_module_with

SIG = "transformer:s16:h32:a2:f128"


def tiny_spec_data(precision="fp32", gpu="CPU-local"):
    return {
        "cluster": {"nodes": [{"gpu": gpu, "count": 1, "gpus_per_node": 2,
                               "intra_node_bandwidth": "2 GB/s",
                               "inter_node_bandwidth": "10 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 32,
                  "num_attention_heads": 2, "seq_length": 16, "vocab_size": 64},
        "training": {"global_batch_size": 4, "precision": precision}}


def tiny_spec(precision="fp32", gpu="CPU-local"):
    return parse_spec(tiny_spec_data(precision, gpu))


def entry(sig=SIG, tmp=1, mbs=1, f=1.0, b=2.0):
    return ProfileEntry(signature=sig, tmp=tmp, mbs=mbs, forward_s=f, backward_s=b, repeats=3)


def profile(device="CPU-local", precision="fp32", created="2026-01-01T00:00:00+00:00",
            entries=None, versions=None):
    return LayerProfile(device=device, precision=precision, created=created,
                        versions=installed_versions() if versions is None else versions,
                        entries=entries if entries is not None else
                        [entry(mbs=1, f=1.0, b=2.0), entry(mbs=2, f=1.5, b=3.0),
                         entry(mbs=4, f=3.0, b=6.0)])


# ----------------------------------------------------------------------------- lookup

def test_lookup_exact_interpolated_extrapolated_and_missing():
    p = profile()
    hit = p.lookup(SIG, 1, 2)
    assert (hit.forward_s, hit.backward_s) == (1.5, 3.0)
    assert hit.source.startswith("profile:") and "interp" not in hit.source
    mid = p.lookup(SIG, 1, 3)  # halfway between mbs 2 and 4
    assert mid.forward_s == pytest.approx(2.25) and mid.backward_s == pytest.approx(4.5)
    assert mid.source.endswith(":interpolated")
    big = p.lookup(SIG, 1, 8)  # per-sample scaling of the largest measured
    assert big.forward_s == pytest.approx(6.0) and big.source.endswith(":extrapolated")
    assert p.lookup(SIG, 2, 2) is None  # tmp never measured
    assert p.lookup("transformer:s16:h64:a2:f256", 1, 1) is None


def test_profile_round_trip(tmp_path):
    p = profile()
    path = p.save(tmp_path / p.default_filename())
    assert path.name.startswith("CPU-local__fp32__") and len(path.stem.split("__")[2]) == 8
    q = LayerProfile.load(path)
    assert q.device == "CPU-local" and q.precision == "fp32" and q.path == path
    assert [e.to_dict() for e in q.entries] == [e.to_dict() for e in p.entries]
    d = json.loads(path.read_text())
    assert d["format"] == 1 and set(d["versions"]) == {"torch", "deepspeed", "megatron_core"}
    assert set(d["entries"][0]) == {"signature", "tmp", "mbs", "forward_s", "backward_s",
                                    "forward_std_s", "backward_std_s", "repeats",
                                    "optimizer_step_s"}


def test_find_profile_matches_device_and_precision_only(tmp_path):
    profile(device="V100-16GB").save(tmp_path / "a.json")
    profile(precision="bf16").save(tmp_path / "b.json")
    assert find_profile("CPU-local", "fp32", tmp_path) is None  # never another device's
    old = profile(created="2026-01-01T00:00:00+00:00")
    old.save(tmp_path / "c.json")
    new = profile(created="2026-02-01T00:00:00+00:00", entries=[entry(f=9.0)])
    new.save(tmp_path / "d.json")
    (tmp_path / "junk.json").write_text("{not json")
    (tmp_path / "CPU-local__fp32__calibration.json").write_text('{"format": 1}')
    found = find_profile("CPU-local", "fp32", tmp_path)
    assert found.path.name == "d.json"  # newest wins
    assert find_profile("V100-16GB", "fp32", tmp_path).device == "V100-16GB"
    other = profile(created="2026-01-15T00:00:00+00:00", entries=[entry(sig="head:x")])
    other.save(tmp_path / "e.json")
    # a caller that names the layers it needs gets the profile that covers them
    assert find_profile("CPU-local", "fp32", tmp_path, signatures=["head:x"]).path.name \
        == "e.json"
    assert find_profile("CPU-local", "fp32", tmp_path / "missing") is None


def test_stale_versions_flag():
    assert not profile().stale_versions
    assert profile(versions={"torch": "0.1", "deepspeed": None, "megatron_core": None}
                   ).stale_versions


def test_malformed_profile_is_a_usage_error(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"format": 1, "device": "d", "precision": "fp32",
                               "entries": [{"signature": "s"}]}))
    with pytest.raises(UsageError, match="malformed"):
        LayerProfile.load(bad)
    with pytest.raises(UsageError, match="not found"):
        LayerProfile.load(tmp_path / "none.json")


# ----------------------------------------------------------------------------- layer sweep

def test_profile_layers_tiny_model(tmp_path):
    spec = tiny_spec()
    out = tmp_path / "p.json"
    p = layers_mod.profile_layers(spec, device="cpu", tmps=(1, 2), mbss=(1, 2), warmup=0,
                                  repeats=2, out=out, concurrent=1)
    assert p.settings["concurrent"] == 1 and p.settings["timer"] == "thread_cpu_time"
    assert p.settings["rounds"] == 2  # the default 3, at most one per timed pass
    sigs = {l.signature for l in spec.model.layers}
    assert len(sigs) == 3 and set(p.signatures) == sigs
    assert len(p.entries) == 3 * 2 * 2
    for e in p.entries:
        assert e.forward_s > 0 and e.backward_s > 0 and e.repeats == 2
        assert e.optimizer_step_s > 0  # every layer of a GPT has parameters
    hit = p.lookup(SIG, 2, 2)
    assert hit.optimizer_step_s == p.lookup(SIG, 2, 1).optimizer_step_s > 0
    q = find_profile("CPU-local", "fp32", tmp_path)
    assert q is not None and q.path == out and not q.stale_versions
    for layer in spec.model.layers:
        assert q.lookup(layer.signature, 2, 2) is not None
    # a second run adds points to the same file instead of dropping the old ones
    layers_mod.profile_layers(spec, device="cpu", tmps=(1,), mbss=(4,), warmup=0, repeats=1,
                              out=out, concurrent=1)
    assert len(LayerProfile.load(out).entries) == 3 * 2 * 2 + 3


def test_profile_layers_rejects_bad_input():
    spec = tiny_spec()
    with pytest.raises(UsageError, match="does not divide"):
        layers_mod.profile_layers(spec, tmps=(3,), write=False)
    with pytest.raises(UsageError, match="positive"):
        layers_mod.profile_layers(spec, mbss=(0,), write=False)
    with pytest.raises(UsageError, match="no CUDA|kind gpu"):
        layers_mod.profile_layers(spec, device="cuda", write=False)
    with pytest.raises(UsageError, match="not a device type"):
        layers_mod.profile_layers(spec, device_name="V100-16GB", write=False)
    with pytest.raises(UsageError, match="--device"):
        layers_mod.profile_layers(spec, device="tpu", write=False)


def test_ctrl_c_keeps_what_was_measured(tmp_path, monkeypatch):
    real = layers_mod._measure_samples
    calls = {"n": 0}

    def flaky(*a, **k):  # Ctrl-C while the second layer is measured
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(layers_mod, "_measure_samples", flaky)
    out = tmp_path / "partial.json"
    with pytest.raises(KeyboardInterrupt):
        layers_mod.profile_layers(tiny_spec(), tmps=(1,), mbss=(1, 2), warmup=0, repeats=1,
                                  out=out, concurrent=1)
    p = LayerProfile.load(out)
    assert len(p.entries) == 2 and p.settings.get("interrupted") is True


# ----------------------------------------------------------------------------- concurrent sweep

def _children() -> set[int]:
    """Live child processes of this one (Linux /proc; empty where it is not available)."""
    import os
    from pathlib import Path

    kids = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            kids.update(int(x) for x in (task / "children").read_text().split())
        except OSError:
            pass
    return kids


def _started_since(before: set[int]) -> list[int]:
    """Child processes alive now that were not in `before`: what the code under test left
    behind. Children started earlier in this (shared, pytest-xdist) worker process, such as
    the detached background compile an in-process `plan` starts, are not the test's to
    judge."""
    return sorted(_children() - before)


def test_default_concurrency_is_devices_per_node_on_cpu_and_one_on_cuda():
    spec = tiny_spec()  # one node of 2 CPU-local devices
    assert layers_mod.default_concurrency(spec, "cpu", "CPU-local") == 2
    assert layers_mod.default_concurrency(spec, "cuda", "CPU-local") == 1
    with pytest.raises(UsageError, match="--concurrent"):
        layers_mod.profile_layers(spec, concurrent=0, write=False)
    with pytest.raises(UsageError, match="timer"):
        layers_mod.profile_layers(spec, timer="cuda_events", write=False)
    with pytest.raises(UsageError, match="--rounds"):
        layers_mod.profile_layers(spec, rounds=0, write=False)


def test_concurrent_sweep_two_processes_in_lock_step(tmp_path):
    spec = tiny_spec()
    out = tmp_path / "p.json"
    # an earlier profile measured in one process: not mixed with points taken concurrently
    layers_mod.profile_layers(spec, tmps=(1,), mbss=(4,), warmup=0, repeats=1, out=out,
                              concurrent=1)
    assert LayerProfile.load(out).settings["concurrent"] == 1
    before = _children()
    p = layers_mod.profile_layers(spec, tmps=(1, 2), mbss=(1, 2), warmup=1, repeats=2,
                                  out=out)  # the default for a 2-device CPU node: 2
    assert _started_since(before) == []  # every worker was reaped
    assert p.settings["concurrent"] == 2 and p.settings["timer"] == "thread_cpu_time"
    assert "2 processes" in p.settings["statistic"]
    q = LayerProfile.load(out)
    assert q.settings["concurrent"] == 2 and q.settings["timer"] == "thread_cpu_time"
    assert len(q.entries) == 3 * 2 * 2  # the one-process mbs 4 points were dropped
    assert q.settings["rounds"] == 2
    for e in q.entries:
        # each median pools both processes' samples: 2 workers x 2 rounds of 1 timed pass
        assert e.repeats == 2 * 2
        assert e.forward_s > 0 and e.backward_s > 0 and e.optimizer_step_s > 0
    assert q.lookup(SIG, 2, 2) is not None
    # a second concurrent run merges into the same file
    layers_mod.profile_layers(spec, tmps=(1,), mbss=(4,), warmup=0, repeats=1, out=out,
                              concurrent=2)
    assert len(LayerProfile.load(out).entries) == 3 * 2 * 2 + 3


def test_tensor_parallel_points_run_as_real_groups_where_the_workers_divide(tmp_path):
    # which points a sweep measures as real tensor groups: CPU, tmp dividing the workers
    assert layers_mod.tp_layers_mode("cpu", 2) == "real"
    assert layers_mod.tp_layers_mode("cpu", 1) == "shard"
    assert layers_mod.tp_layers_mode("cuda", 2) == "shard"
    assert layers_mod.real_tensor_group(2, 2, "real")
    assert layers_mod.real_tensor_group(2, 4, "real")
    assert not layers_mod.real_tensor_group(4, 2, "real")   # more ranks than workers
    assert not layers_mod.real_tensor_group(2, 3, "real")
    assert not layers_mod.real_tensor_group(1, 2, "real")   # tmp 1 has no group
    assert not layers_mod.real_tensor_group(2, 2, "shard")
    # profiles of shards (older ones carry no tp_layers) are not merged with real groups
    assert layers_mod._method({"concurrent": 2}) != \
        layers_mod._method({"concurrent": 2, "tp_layers": "real"})
    assert layers_mod._method({"concurrent": 1}) == \
        layers_mod._method({"concurrent": 1, "tp_layers": "shard"})
    out = tmp_path / "p.json"
    before = _children()
    p = layers_mod.profile_layers(tiny_spec(), tmps=(2,), mbss=(1,), warmup=1, repeats=2,
                                  out=out, concurrent=2)
    assert _started_since(before) == []
    assert p.settings["tp_layers"] == "real"
    assert LayerProfile.load(out).settings["tp_layers"] == "real"
    assert {e.tmp for e in p.entries} == {2} and len(p.entries) == 3
    for e in p.entries:
        assert e.forward_s > 0 and e.backward_s > 0 and e.repeats == 2 * 2
    one = layers_mod.profile_layers(tiny_spec(), tmps=(2,), mbss=(1,), warmup=0, repeats=1,
                                    write=False, concurrent=1)
    assert one.settings["tp_layers"] == "shard"


def test_time_inside_tensor_parallel_collectives_is_left_out(monkeypatch):
    import torch
    import torch.distributed as dist

    from cost_models.layers import Layer

    # the profiler's `time` module, with a clock that moves only when told: the layer's own
    # work and the collectives advance it by known amounts, so what the profiler subtracts is
    # checked exactly, however slow or busy the machine (the first backward in a process
    # imports sympy, which takes a second or more)
    fake = time_module_with(perf_counter=lambda: fake.now, thread_time=lambda: fake.now)
    fake.now = 0.0
    monkeypatch.setattr(layers_mod, "time", fake)  # the global time module stays as it is
    calls = []

    class Work:
        def wait(self):
            calls.append("wait")
            fake.now += 0.05
            return True

    def slow_all_reduce(tensor, op=None, group=None, async_op=False):
        calls.append("all_reduce async" if async_op else "all_reduce")
        fake.now += 0.05
        return Work() if async_op else None

    monkeypatch.setattr(dist, "all_reduce", slow_all_reduce)
    clock = layers_mod._CollectiveClock()
    monkeypatch.setattr(layers_mod, "_COLLECTIVES", clock)
    clock.install()   # wraps the (slow) all_reduce for the rest of this test

    own_forward_s, own_backward_s = 0.003, 0.007  # the layer's own work in each pass

    class Block(torch.nn.Module):
        """A layer whose forward holds one all-reduce and backward one async all-reduce."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, x):
            fake.now += own_forward_s
            dist.all_reduce(x)
            return _AsyncInBackward.apply(x * self.w)

    class _AsyncInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            fake.now += own_backward_s
            dist.all_reduce(g, async_op=True).wait()
            return g

    layer = Layer(kind="mlp", hidden_size=4, ffn_hidden_size=8, seq_length=1)
    point = layers_mod._Point(signature="x", layer=layer, tmp=2, mbs=1)
    x = torch.ones(4, requires_grad=True)
    tf, tb = layers_mod._pass(Block(), point, (x,), "cpu", "wall")
    assert calls == ["all_reduce", "all_reduce async", "wait"]
    # the forward spent 50 ms inside a collective, the backward 50 ms issuing an async one
    # and 50 ms waiting on it: what is left is exactly the layer's own work
    assert tf == pytest.approx(own_forward_s, abs=1e-9)
    assert tb == pytest.approx(own_backward_s, abs=1e-9)
    assert clock.spent == pytest.approx(0.05 + 0.05 + 0.05, abs=1e-9)
    assert fake.now == pytest.approx(own_forward_s + own_backward_s + 0.15, abs=1e-9)


def test_concurrent_ctrl_c_keeps_what_was_measured_and_stops_workers(tmp_path, monkeypatch):
    real = layers_mod._entries
    calls = {"n": 0}

    def flaky(*a, **k):  # Ctrl-C in the parent once the second layer's samples are in
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(layers_mod, "_entries", flaky)
    out = tmp_path / "partial.json"
    before = _children()
    with pytest.raises(KeyboardInterrupt):
        layers_mod.profile_layers(tiny_spec(), tmps=(1,), mbss=(1, 2), warmup=0, repeats=1,
                                  out=out, concurrent=2)
    assert _started_since(before) == []
    p = LayerProfile.load(out)
    assert len(p.entries) == 2 and p.settings.get("interrupted") is True
    assert p.settings["concurrent"] == 2


def test_concurrent_worker_error_is_raised():
    from cost_models.layers import Layer

    # a layer the trial code cannot build: a worker reports it, the sweep stops and raises
    layer = Layer(kind="custom", seq_length=16, custom_forward_flops=1e6, custom_params=10,
                  custom_output_elements=16)
    point = layers_mod._Point(signature=layer.signature, layer=layer, tmp=1, mbs=1)
    before = _children()
    with pytest.raises(RuntimeError, match="worker . of 2 failed"):
        layers_mod._sweep_concurrent([[point]], [1], 2, "fp32", "cpu", 0, "wall",
                                     lambda gi, samples: None, lambda gi: None)
    assert _started_since(before) == []


# ----------------------------------------------------------------------------- link fits

def synthetic_samples(coll, alpha, bw, *, link="intra", sizes=comm_mod.DEFAULT_SIZES,
                      groups=(2,), sig=None):
    out = []
    for n in groups:
        if coll == "p2p" and n != 2:
            continue
        for s in sizes:
            eff = 1.0 if sig is None else float(sigmoid_efficiency(s, *sig))
            t = latency_steps(coll, n) * alpha + bus_factor(coll, n) * s / (bw * eff)
            out.append(CommSample(collective=coll, link=link, group_size=n, message_bytes=s,
                                  time_s=t))
    return out


@pytest.mark.parametrize("coll", ["all_reduce", "all_gather", "reduce_scatter", "p2p"])
def test_alpha_beta_fit_recovers_known_link(coll):
    samples = synthetic_samples(coll, 20e-6, 3e9, groups=(2, 4))
    f = comm_mod.fit_link(coll, "intra", samples)
    assert f.alpha_s == pytest.approx(20e-6, rel=1e-3)
    assert f.bandwidth_bytes_per_s == pytest.approx(3e9, rel=1e-3)
    assert f.model == "alpha-beta" and f.mape_alpha_beta < 1e-3
    assert f.time_s(1 << 20, 4 if coll != "p2p" else 2) == pytest.approx(
        latency_steps(coll, 4 if coll != "p2p" else 2) * 20e-6
        + bus_factor(coll, 4 if coll != "p2p" else 2) * (1 << 20) / 3e9, rel=1e-3)


def test_sigmoid_fit_wins_on_s_shaped_link():
    sig = (0.1, 1.5, 17.0)  # 10% of the bandwidth below ~64 KiB, full above ~1 MiB
    samples = synthetic_samples("all_reduce", 10e-6, 5e9, sig=sig)
    f = comm_mod.fit_link("all_reduce", "intra", samples)
    assert f.model == "sigmoid" and f.mape_sigmoid < 0.02 < f.mape_alpha_beta
    for s in (4096, 1 << 16, 1 << 18, 1 << 22):
        truth = 2 * 10e-6 + s / (5e9 * float(sigmoid_efficiency(s, *sig)))
        assert f.time_s(s, 2) == pytest.approx(truth, rel=0.05)


def test_comm_profile_round_trip_and_missing_inter_link(tmp_path):
    samples = [s for c in ("all_reduce", "p2p") for s in synthetic_samples(c, 1e-5, 2e9)]
    prof = comm_mod.build_profile(samples, device="CPU-local", backend="gloo", world_size=2,
                                  nodes=1)
    assert prof.links_measured == ("intra",)
    assert prof.time_s("all_reduce", 1e6, 2, "inter") is None
    assert "not measured: inter" in prof.describe()
    path = prof.save(tmp_path / "c.json")
    back = find_comm_profile(tmp_path)
    assert back is not None and back.path == path
    t = back.time_s("all_reduce", 1e6, 2, "intra")
    assert t == pytest.approx(2 * 1e-5 + 1e6 / 2e9, rel=1e-3)
    assert back.time_s("p2p", 1e6, 2, "intra") == pytest.approx(1e-5 + 1e6 / 2e9, rel=1e-3)
    assert back.time_s("reduce_scatter", 1e6, 2, "intra") is None  # not measured
    with pytest.raises(ValueError):
        back.time_s("broadcast", 1e6, 2, "intra")
    assert find_comm_profile(tmp_path, device="V100-16GB") is None


def test_real_two_process_gloo_sweep(tmp_path):
    prof = comm_mod.profile_comm(device_name="CPU-local", launcher="local", nproc=2,
                                 sizes=(4096, 65536, 1 << 20), warmup=1, repeats=3,
                                 out=tmp_path / "c.json")
    assert prof.world_size == 2 and prof.nodes == 1 and prof.links_measured == ("intra",)
    assert set(c for c, _ in prof.fits) == {"all_reduce", "all_gather", "reduce_scatter", "p2p"}
    assert all(s.time_s > 0 for s in prof.samples) and len(prof.samples) == 12
    for (c, _), f in prof.fits.items():
        assert f.bandwidth_bytes_per_s > 0 and math.isfinite(f.alpha_s)
    assert CommProfile.load(tmp_path / "c.json").fits.keys() == prof.fits.keys()


def test_profile_comm_rejects_bad_input():
    with pytest.raises(UsageError, match="launcher"):
        comm_mod.profile_comm(device_name="x", launcher="ssh")
    with pytest.raises(UsageError, match="at least 2"):
        comm_mod.profile_comm(device_name="x", nproc=1)
    with pytest.raises(UsageError, match="torchrun"):
        comm_mod.profile_comm(device_name="x", nnodes=2)


# ----------------------------------------------------------------------------- CLI

def _cli(argv):
    from amp_search.cli import profile as cli_profile

    parser = argparse.ArgumentParser()
    cli_profile.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_profile_writes_and_prints(tmp_path, capsys, monkeypatch):
    import yaml

    import amp_search.launch
    from amp_search.launch.orchestrator import TrialRecord
    from amp_search.profiling.framework import overheads_from_residuals

    # the framework probe's trials answered here: 1 s per iteration and 0.5 s per
    # micro-batch; the overheads are fitted to these less the model's predictions from the
    # profile just taken, whose values depend on the machine's speed, so the fit is checked
    # against the probes' own stored figures (tests/test_framework_overheads.py runs the
    # trials for real: a minute of DeepSpeed starts on this machine, for the same code path)
    def trials(spec, items, options=None, **kw):
        return [TrialRecord(index=i, label=s.label(), strategy=s, predicted_s=None,
                            status="ok", measured_mean_s=1.0 + 0.5 * s.gas)
                for i, s in enumerate(items)]

    monkeypatch.setattr(amp_search.launch, "run_trials", trials)

    spec_path = tmp_path / "s.yaml"
    spec_path.write_text(yaml.safe_dump(tiny_spec_data()))
    out = tmp_path / "p.json"
    # the default on a node of 2 CPU devices: 2 processes at once (the framework probe's
    # real trials run in the next call only: each set takes a minute or two here)
    assert _cli(["profile", str(spec_path), "--device", "cpu", "--tmp", "1", "--mbs", "1",
                 "--warmup", "0", "--repeats", "1", "--out", str(out), "--no-progress",
                 "--no-framework"]) == 0
    text = capsys.readouterr().out
    assert str(out) in text and "transformer:s16:h32:a2:f128" in text
    assert "2 processes at once" in text
    assert LayerProfile.load(out).settings["concurrent"] == 2
    # the machine's speed right after the sweep, in as many processes as the sweep ran
    probe = LayerProfile.load(out).speed_probe
    assert "speed probe:" in text and probe.workers == 2 and probe.ms > 0
    assert _cli(["profile", str(spec_path), "--device", "cpu", "--tmp", "1", "--mbs", "1",
                 "--warmup", "0", "--repeats", "1", "--concurrent", "1", "--out",
                 str(tmp_path / "c.json"), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "one process" in text
    assert LayerProfile.load(tmp_path / "c.json").settings["concurrent"] == 1
    # the framework probe ran, was printed and was stored with the profile
    assert "framework overheads:" in text and "ms per micro-batch" in text
    fw = LayerProfile.load(tmp_path / "c.json").framework_overheads
    assert fw is not None and [p.gas for p in fw.probes] == [1, 8]
    # each probe stored the mocked trial's time and the model's own prediction for it
    assert [p.measured_s for p in fw.probes] == [1.0 + 0.5 * 1, 1.0 + 0.5 * 8]
    assert all(math.isfinite(p.predicted_s) and p.predicted_s > 0 for p in fw.probes)
    # the overheads are the fit through those residuals (measured less predicted) ...
    residuals = [p.measured_s - p.predicted_s for p in fw.probes]
    assert [p.residual_s for p in fw.probes] == residuals
    microbatch, step = overheads_from_residuals([1, 8], residuals)
    assert fw.microbatch_overhead_s == pytest.approx(microbatch, rel=1e-12, abs=1e-15)
    assert fw.step_overhead_s == pytest.approx(step, rel=1e-12, abs=1e-15)
    # two points and no clamping (the tiny model's predictions are far below the mocked
    # seconds on any machine): the line step + gas * microbatch goes through both residuals
    for p, r in zip(fw.probes, residuals):
        assert fw.step_overhead_s + p.gas * fw.microbatch_overhead_s == pytest.approx(r)
    # ... and what was printed is what was stored
    assert f"{fw.microbatch_overhead_s * 1e3:.1f} ms per micro-batch" in text
    assert f"{fw.step_overhead_s * 1e3:.1f} ms per iteration" in text
    assert _cli(["profile", str(spec_path), "--device", "cpu", "--tmp", "1", "--mbs", "1",
                 "--warmup", "0", "--repeats", "1", "--concurrent", "1", "--out",
                 str(tmp_path / "d.json"), "--no-progress", "--no-speed-probe",
                 "--no-framework"]) == 0
    assert LayerProfile.load(tmp_path / "d.json").speed_probe is None
    with pytest.raises(UsageError):
        _cli(["profile", str(spec_path), "--device", "cpu", "--tmp", "3", "--out", str(out)])
