"""The opt-in instruction trace of the trial program (amp_search.trial.instructions): a real
instrumented tiny trial writes well-formed records whose order per stage is DeepSpeed's
TrainSchedule (`cost_models.schedule.deepspeed_train_order`); the flag off writes nothing and
leaves trial.json as it was. No timing is asserted. About half a minute on 2 cores."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from amp_search.spec import load_spec
from amp_search.trial.config import TrialConfig
from amp_search.trial.instructions import (InstructionRecorder, PIPELINE_INSTRUCTIONS,
                                           chrome_trace, read_trace, train_order)
from cost_models.schedule import deepspeed_train_order
from cost_models.simulator import KINDS
from conftest import ROOT, load_benchmark


def _bench():
    return load_benchmark("instruction_timing")


def _expected(pp: int, gas: int, stage: int) -> list[tuple[str, int, int]]:
    kind, micro, _, peer = deepspeed_train_order(pp, gas)
    return [(KINDS[k], int(m), int(p)) for k, m, p in
            zip(kind[stage].tolist(), micro[stage].tolist(), peer[stage].tolist())
            if KINDS[k] != "idle"]


def test_recorder_numbers_microbatches_and_skips_untimed_iterations(tmp_path):
    rec = InstructionRecorder(rank=1, stage=1, replica=0, tensor=0, pp=2, dp=1, tmp=1, gas=2,
                              engine="pipeline")
    assert rec.timed_call("ForwardPass", lambda x: x + 1, 1) == 2     # not recording: no row
    rec.begin(3, 10.0)
    for name in ("RecvActivation", "ForwardPass", "RecvActivation", "ForwardPass",
                 "BackwardPass", "SendGrad", "BackwardPass", "SendGrad", "ReduceGrads",
                 "OptimizerStep"):
        rec.timed_call(name, lambda: None)
    rec.end()
    rec.timed_call("ForwardPass", lambda: None)                       # after end(): no row
    rec.write(tmp_path / "t.json")
    t = read_trace(tmp_path / "t.json")
    assert t.iteration_numbers == (3,) and len(t.iterations[0]) == 10
    assert [(x.name, x.microbatch) for x in t.iterations[0]][:5] == [
        ("RecvActivation", 0), ("ForwardPass", 0), ("RecvActivation", 1), ("ForwardPass", 1),
        ("BackwardPass", 0)]
    assert t.iterations[0][-1].microbatch == -1
    assert train_order(t)[:2] == [("recv", 0, 0), ("forward", 0, -1)]
    # a malformed file is refused with the reason
    d = json.loads((tmp_path / "t.json").read_text())
    d["iterations"][0]["instructions"][0][0] = "Teleport"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="unknown instruction 'Teleport'"):
        read_trace(tmp_path / "bad.json")


def test_flag_off_leaves_trial_json_unchanged():
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    bench = _bench()
    s = replace(bench.case_strategy(spec, "pp2-gas4"), global_batch_size=8, mbs=2)
    from amp_search.trial.config import trial_config
    from amp_search.trial.ranks import assign_ranks

    ranks = assign_ranks(s, {d.id: (d.node, d.local_rank) for d in spec.cluster.devices},
                         {n.id: "localhost" for n in spec.cluster.nodes})
    cfg = trial_config(spec, s, ranks, iters=4, warmup=2, seed=1, output="r.json")
    assert "instruction_trace" not in cfg.to_dict()
    assert TrialConfig.from_dict(cfg.to_dict()) == cfg and not cfg.instruction_trace
    on = replace(cfg, instruction_trace=True)
    assert on.to_dict()["instruction_trace"] is True
    assert TrialConfig.from_dict(on.to_dict()) == on


@pytest.fixture(scope="module")
def traced_trial(tmp_path_factory):
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    bench = _bench()
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    # pp 2 over an uneven split, gas 4 (global batch 8, mbs 2)
    s = replace(bench.case_strategy(spec, "pp2-uneven"), mbs=2)
    assert s.gas == 4
    d = tmp_path_factory.mktemp("traced")
    outcome, result, traces = bench.run_traced_trial(spec, s, d, iters=3, warmup=1,
                                                     timeout_s=300)
    return s, d, outcome, result, traces


def test_instrumented_trial_records_deepspeed_train_order(traced_trial):
    s, d, outcome, result, traces = traced_trial
    assert outcome.ok and result is not None, (d / "log.txt").read_text()[-3000:]
    assert [t.rank for t in traces] == [0, 1]
    assert sorted(p.name for p in d.glob("instructions-rank*.json")) == \
        ["instructions-rank0.json", "instructions-rank1.json"]
    for t in traces:
        assert (t.pp, t.gas, t.engine) == (2, 4, "pipeline")
        assert t.iteration_numbers == (1, 2)            # the timed iterations only
        for i in range(2):
            assert train_order(t, i) == _expected(2, 4, t.stage)
            names = [x.name for x in t.iterations[i]]
            assert set(names) <= set(PIPELINE_INSTRUCTIONS)
            assert names[-3:] == ["ReduceTiedGrads", "ReduceGrads", "OptimizerStep"]
            assert names.count("ForwardPass") == names.count("BackwardPass") == 4
            # one thread per rank: instructions do not overlap
            ends = [x.end_s for x in t.iterations[i]]
            starts = [x.start_s for x in t.iterations[i]]
            assert all(a <= b for a, b in zip(ends, starts[1:]))
    trace = chrome_trace(traces, 0)
    xs = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(xs) == sum(len(t.iterations[0]) for t in traces)
    assert {e["pid"] for e in xs} == {0, 1} and all(e["dur"] >= 0 for e in xs)
    json.dumps(trace)                                    # JSON-ready


def test_plain_engine_records_forward_backward_step(tmp_path):
    """pp = 1 with ZeRO 2 trains through the plain DeepSpeed engine: forward, backward and
    step of every micro-batch are timed."""
    pytest.importorskip("deepspeed")
    bench = _bench()
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    s = replace(bench.case_strategy(spec, "pp1-dp2"), zero_stage=2, mbs=2)
    assert s.gas == 2
    outcome, result, traces = bench.run_traced_trial(spec, s, tmp_path, iters=2, warmup=1,
                                                     timeout_s=300)
    assert outcome.ok and result is not None, (tmp_path / "log.txt").read_text()[-3000:]
    assert [(t.rank, t.stage, t.replica, t.engine) for t in traces] == \
        [(0, 0, 0, "plain"), (1, 0, 1, "plain")]
    for t in traces:
        assert [(x.name, x.microbatch) for x in t.iterations[0]] == [
            ("ForwardPass", 0), ("BackwardPass", 0), ("OptimizerStep", -1),
            ("ForwardPass", 1), ("BackwardPass", 1), ("OptimizerStep", -1)]
