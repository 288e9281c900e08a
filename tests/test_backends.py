"""A spec that names no training.backend is planned for DeepSpeed and for Megatron-LM, each with
its own defaults and rules, in one ranking with a backend column; a spec that names one is
planned for it alone, as before."""
from __future__ import annotations

import json

import pytest

from amp_search.cli import main
from amp_search.cli.plan_header import header_lines
from amp_search.errors import UsageError
from amp_search.planner import plan, plan_backends, ranking_key
from amp_search.records import Strategy
from amp_search.spec import load_spec


def _spec(write_spec, count=2, **training):
    return write_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": count, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "8 x 400 Gbps"}]},
        "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 4096},
        "training": {"global_batch_size": 32, "precision": "bf16", **training}})


def test_unnamed_backend_gives_each_backend_its_own_defaults(write_spec):
    spec = load_spec(_spec(write_spec))
    assert not spec.backend_given and spec.training.backend == "deepspeed"
    ds, mg = spec.backends()
    assert (ds.training.backend, mg.training.backend) == ("deepspeed", "megatron")
    assert ds.training.zero_stage == (0, 1, 2, 3) and mg.training.zero_stage == (0, 1)
    assert ds.training.virtual_pipeline_stages == (1,)
    assert len(mg.training.virtual_pipeline_stages) > 1
    assert spec.for_backend("megatron") == mg and spec.for_backend("deepspeed") is spec
    assert mg.sha256 == spec.sha256               # the same file: the same trials' key

    named = load_spec(_spec(write_spec, backend="megatron"))
    assert named.backend_given and named.backends() == (named,)
    assert named.training == mg.training
    with pytest.raises(UsageError, match="training.backend: megatron"):
        named.for_backend("deepspeed")


def test_plan_merges_both_backends_and_each_row_is_costed_by_its_own(write_spec):
    spec = load_spec(_spec(write_spec))
    both = plan_backends(spec, simulate_top=0)
    assert both.backends == ("deepspeed", "megatron")
    alone = {b: plan(spec.for_backend(b), simulate_top=0) for b in both.backends}
    for b, p in alone.items():
        assert {e.backend for e in p.strategies} == {b}
        mine = [e for e in both.strategies if e.backend == b]
        assert [e.strategy for e in mine] == [e.strategy for e in p.strategies]
        assert [e.iteration_time_s for e in mine] == [e.iteration_time_s for e in p.strategies]
    assert list(both.strategies) == sorted(both.strategies, key=ranking_key)
    assert both.candidates == sum(p.candidates for p in alone.values())
    assert both.baseline.backend == "megatron"      # Megatron-LM's layout, as it runs it
    # megatron rows never use what Megatron-LM lacks
    assert all(e.strategy.zero_stage <= 1 for e in both.strategies if e.backend == "megatron")
    assert all(e.strategy.virtual_stages == 1 for e in both.strategies
               if e.backend == "deepspeed")
    text = " ".join(x.strip() for x in header_lines(spec, both, width=200))
    assert "costed as DeepSpeed's pipeline engine and as Megatron-LM (training.backend not " \
           "given" in text
    assert "ZeRO 0/1/2/3 under deepspeed, 0/1 (the distributed optimizer) under megatron" in text
    # a named backend: one plan, as before
    named = load_spec(_spec(write_spec, backend="deepspeed"))
    one = plan_backends(named, simulate_top=0)
    assert one.backends == () and "backends" not in one.to_dict()
    assert [e.strategy for e in one.strategies] == [e.strategy for e in alone["deepspeed"].strategies]


def test_cli_plan_shows_a_backend_column_and_says_which_is_faster(write_spec, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    path = _spec(write_spec)
    assert main(["plan", str(path), "--no-simulate", "--no-progress", "--top-k", "20"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    head = next(x for x in lines if x.lstrip().startswith("rank"))
    assert head.split()[:2] == ["rank", "backend"]
    rows = [x.split() for x in lines[lines.index(head) + 2:] if x.strip()][:20]
    assert {r[1] for r in rows} >= {"deepspeed", "megatron"}
    text = " ".join(out.split())
    assert "Best plan per backend: " in text and "Set training.backend to plan one only." in text
    assert all(len(x) <= 120 for x in lines)
    assert main(["plan", str(path), "--no-simulate", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["backends"] == ["deepspeed", "megatron"]
    assert {s["backend"] for s in data["strategies"]} <= {"deepspeed", "megatron"}
    assert data["megatron_baseline"]["backend"] == "megatron"
    # named: no column
    assert main(["plan", str(_spec(write_spec, backend="megatron")), "--no-simulate",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    head = next(x for x in out.splitlines() if x.lstrip().startswith("rank"))
    assert "backend" not in head and "Best plan per backend" not in out


def test_a_backend_that_cannot_run_the_spec_is_left_out_and_named(write_spec, capsys):
    """fp8 is costed as Transformer Engine under Megatron-LM only: with no backend named, the
    plan is Megatron-LM's and the header says why DeepSpeed is not in it (naming deepspeed
    stays an error)."""
    spec = load_spec(_spec(write_spec, precision="fp8"))
    assert spec.training.backend == "megatron" and spec.other_backends == ()
    assert spec.backend_notes and spec.backend_notes[0].startswith("deepspeed: ")
    result = plan_backends(spec, simulate_top=0)
    assert {e.backend for e in result.strategies} == {"megatron"}
    text = " ".join(x.strip() for x in header_lines(spec, result, width=300))
    assert "(training.backend not given: megatron)" in text
    assert "not planned: deepspeed: training.precision: fp8" in text
    with pytest.raises(UsageError, match="fp8"):
        spec.for_backend("deepspeed")
    assert main(["plan", str(_spec(write_spec, precision="fp8", backend="deepspeed"))]) == 2
    assert "training.precision" in capsys.readouterr().err


def test_export_of_a_megatron_row_is_costed_as_megatron(write_spec, tmp_path, capsys):
    """export --rank N of a two-backend plan takes that row's backend's spec: a Megatron-LM
    row with the distributed optimizer exports without the 'costed DeepSpeed's ZeRO 1'
    note."""
    path = _spec(write_spec)
    spec = load_spec(path)
    result = plan_backends(spec)
    rank = next(i for i, e in enumerate(result.strategies, 1)
                if e.backend == "megatron" and e.strategy.zero_stage == 1)
    assert main(["export", str(path), "--rank", str(rank), "--format", "megatron", "--out",
                 str(tmp_path / "m"), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["label"] == result.strategies[rank - 1].strategy.label()
    notes = " ".join(data["notes"])
    assert "--use-distributed-optimizer" in notes and "costed DeepSpeed" not in notes


def test_a_cpu_cluster_without_a_backend_is_planned_for_deepspeed_and_says_why(write_spec):
    """Megatron-LM's pretrain_gpt.py needs CUDA: on CPU devices the trials are DeepSpeed's, so
    an unnamed backend plans DeepSpeed only and the header says why; the header counts
    devices, not GPUs, and shows no network for one node."""
    spec = load_spec(write_spec({
        "cluster": {"nodes": [{"gpu": "CPU-local", "gpus_per_node": 2,
                               "intra_node_bandwidth": "2 GB/s"}]},
        "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 64,
                  "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
        "training": {"global_batch_size": 4}}))
    assert not spec.backend_given and spec.backends() == (spec,)
    assert spec.backend_notes[0].startswith("megatron: Megatron-LM's pretrain_gpt.py needs CUDA")
    text = " ".join(x.strip() for x in header_lines(spec, plan_backends(spec, simulate_top=0),
                                                     width=300))
    assert "2 devices, 1 node x 2 CPU-local (inside a node 2 GB/s)" in text
    assert "not planned: megatron:" in text and "network" not in text.split("costed")[0]


def test_launch_reads_a_two_backend_plan_file_one_backend_at_a_time(write_spec, tmp_path,
                                                                    capsys):
    """The plan JSON of a spec without backend is accepted by `launch --plan` for the same
    spec: with --backend, that backend's rows run (costed as it); without, a file that mixes
    both is refused in one line."""
    path = _spec(write_spec, count=1)
    out = tmp_path / "plan.json"
    assert main(["plan", str(path), "--no-simulate", "--top-k", "20", "--json", str(out)]) == 0
    capsys.readouterr()
    rows = json.loads(out.read_text())["strategies"]
    assert {r["backend"] for r in rows} == {"deepspeed", "megatron"}
    assert main(["launch", str(path), "--plan", str(out), "--dry-run"]) == 2
    assert "holds plans for deepspeed and megatron: pass --backend" in capsys.readouterr().err
    ds = [r for r in rows if r["backend"] == "deepspeed"]
    assert main(["launch", str(path), "--plan", str(out), "--backend", "deepspeed",
                 "--top-k", "50", "--dry-run", "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["label"] for t in data["trials"]] == [
        Strategy.from_dict({**x, "global_batch_size": 32}).label() for x in ds]
    # a file of one backend's rows: that backend, without --backend
    only = tmp_path / "ds.json"
    only.write_text(json.dumps({**json.loads(out.read_text()), "strategies": ds[:2]}))
    assert main(["launch", str(path), "--plan", str(only), "--dry-run", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "deepspeed"


def test_when_one_backend_cannot_plan_the_header_and_advice_name_the_other(write_spec,
                                                                           capsys):
    """Context parallelism is Megatron-LM's: with no backend named, DeepSpeed finds nothing,
    and the header, the rows and the launch advice all say megatron."""
    path = _spec(write_spec, context_parallel=2)
    spec = load_spec(path)
    result = plan_backends(spec, simulate_top=0)
    assert result.backends == ("megatron",) and result.backend_notes
    text = " ".join(x.strip() for x in header_lines(spec, result, width=300))
    assert "costed as Megatron-LM (training.backend not given: megatron)" in text
    assert "not planned: deepspeed:" in text
    assert main(["plan", str(path), "--no-simulate", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--backend megatron --top-k" in out or "No other plan" in out


def test_a_two_backend_plan_fits_80_columns(write_spec, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", str(_spec(write_spec)), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= 80
    head = next(x for x in out.splitlines() if x.lstrip().startswith("rank"))
    assert "backend" in head
