"""`amp-search launch` / `amp-search results` on bad input, --dry-run, --plan, backends."""
from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from amp_search.cli import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def spec(tmp_path):
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    return tmp_path / "spec.yaml"


def _plan(tmp_path, *rows):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps({"strategies": list(rows)}))
    return p


PP2DP2 = {"pp": 2, "dp": 2, "tmp": 1, "mbs": 2, "partition": [0, 3, 6],
          "placement": [[[0], [1]], [[2], [3]]], "zero_stage": 0,
          "activation_checkpointing": False, "iteration_time_s": 0.25}
TP2PP2 = {**PP2DP2, "dp": 1, "tmp": 2, "placement": [[[0, 1]], [[2, 3]]],
          "iteration_time_s": 0.3}


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err  # one line, never a traceback
    return err[0]


def test_missing_spec(tmp_path, capsys):
    assert main(["launch", str(tmp_path / "nope.yaml")]) == 2
    assert "spec file not found" in _error_line(capsys)


@pytest.mark.parametrize("value", ["0", "-1", "x"])
def test_bad_top_k(spec, value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["launch", str(spec), "--top-k", value])
    assert exc.value.code == 2
    assert "--top-k" in capsys.readouterr().err


def test_warmup_must_be_below_iters(spec, capsys):
    assert main(["launch", str(spec), "--iters", "4", "--warmup", "4", "--dry-run"]) == 2
    assert "--warmup (4) must be smaller than --iters (4)" in _error_line(capsys)


def test_missing_hostfile(spec, tmp_path, capsys):
    assert main(["launch", str(spec), "--launcher", "deepspeed",
                 "--hostfile", str(tmp_path / "hf")]) == 2
    assert "hostfile not found" in _error_line(capsys)


def test_bad_hostname_in_hostfile(spec, tmp_path, capsys):
    (tmp_path / "hf").write_text("node;reboot slots=4\n")
    assert main(["launch", str(spec), "--launcher", "deepspeed",
                 "--hostfile", str(tmp_path / "hf")]) == 2
    assert "not a valid hostname" in _error_line(capsys)


def test_multi_node_launcher_needs_hosts(spec, tmp_path, capsys):
    plan = _plan(tmp_path, PP2DP2)
    assert main(["launch", str(spec), "--plan", str(plan), "--launcher", "torchrun",
                 "--dry-run"]) == 2
    assert "needs the nodes' hostnames" in _error_line(capsys)


def test_hostfile_slots_must_cover_the_node(spec, tmp_path, capsys):
    (tmp_path / "hf").write_text("worker-0 slots=2\n")
    plan = _plan(tmp_path, PP2DP2)
    assert main(["launch", str(spec), "--plan", str(plan), "--launcher", "deepspeed",
                 "--hostfile", str(tmp_path / "hf"), "--dry-run"]) == 2
    assert "slots=2" in _error_line(capsys)


def test_dry_run_prints_everything_and_runs_nothing(spec, tmp_path, capsys):
    plan = _plan(tmp_path, PP2DP2, TP2PP2)
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "2", "--dry-run",
                 "--verbose", "--iters", "6", "--warmup", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("-m torch.distributed.run --standalone") == 2
    assert "--module amp_search.trial.run --config" in out
    assert '"train_micro_batch_size_per_gpu": 2' in out and '"iters": 6' in out
    assert not (tmp_path / "amp-search-results.sqlite").exists()
    assert not (tmp_path / "runs").exists()


def test_dry_run_deepspeed_launcher_with_hostfile(spec, tmp_path, capsys):
    (tmp_path / "hf").write_text("worker-0 slots=16\n")
    plan = _plan(tmp_path, PP2DP2)
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", "--dry-run",
                 "--verbose", "--launcher", "deepspeed", "--hostfile", str(tmp_path / "hf")]) == 0
    out = capsys.readouterr().out
    assert "deepspeed.launcher.runner" in out and "--include worker-0:0,1,2,3" in out
    assert "worker-0 slots=4" in out  # the trial's own hostfile: the spec node's devices


def test_dry_run_megatron_arguments(spec, tmp_path, capsys):
    plan = _plan(tmp_path, {**TP2PP2, "partition": [0, 2, 6], "zero_stage": 1,
                            "activation_checkpointing": True})
    assert main(["launch", str(spec), "--plan", str(plan), "--top-k", "1", "--dry-run",
                 "--backend", "megatron", "--megatron-path", str(tmp_path / "Megatron-LM"),
                 "--json", str(tmp_path / "o.json")]) == 0
    out = capsys.readouterr().out
    assert str(tmp_path / "Megatron-LM" / "pretrain_gpt.py") in out
    for piece in ("--tensor-model-parallel-size 2", "--pipeline-model-parallel-size 2",
                  "--global-batch-size 8", "--micro-batch-size 2",
                  "--decoder-first-pipeline-num-layers 1",
                  "--decoder-last-pipeline-num-layers 3", "--recompute-granularity full",
                  "--use-distributed-optimizer"):
        assert piece in out, piece
    data = json.loads((tmp_path / "o.json").read_text())
    assert data["dry_run"] and data["trials"][0]["status"] == "dry-run"


def test_megatron_needs_a_path(spec, tmp_path, capsys):
    plan = _plan(tmp_path, PP2DP2)
    assert main(["launch", str(spec), "--plan", str(plan), "--backend", "megatron"]) == 2
    assert "--megatron-path" in _error_line(capsys)


def test_bad_plan_files(spec, tmp_path, capsys):
    assert main(["launch", str(spec), "--plan", str(tmp_path / "none.json")]) == 2
    assert "plan file not found" in _error_line(capsys)
    (tmp_path / "p.json").write_text("{not json")
    assert main(["launch", str(spec), "--plan", str(tmp_path / "p.json")]) == 2
    assert "cannot read plan" in _error_line(capsys)
    (tmp_path / "p.json").write_text(json.dumps({"strategies": [{"pp": 2}]}))
    assert main(["launch", str(spec), "--plan", str(tmp_path / "p.json")]) == 2
    assert "strategies[0]" in _error_line(capsys)
    (tmp_path / "p.json").write_text(json.dumps({"strategies": [{**PP2DP2, "mbs": 3}]}))
    assert main(["launch", str(spec), "--plan", str(tmp_path / "p.json")]) == 2
    assert "does not divide the spec's global batch" in _error_line(capsys)


def test_custom_layers_cannot_be_trials(tmp_path, capsys):
    (tmp_path / "spec.yaml").write_text("""
cluster: {nodes: [{gpu: CPU-local, count: 1, gpus_per_node: 2, intra_node_bandwidth: 10 GB/s,
                   inter_node_bandwidth: 10 Gbps}]}
model:
  preset: layers
  seq_length: 16
  layers:
    - {kind: custom, forward_flops: 1000, params: 10, output_elements: 64, name: odd}
    - {kind: custom, forward_flops: 1000, params: 10, output_elements: 64, name: odd2}
training: {global_batch_size: 2, precision: fp32}
""")
    plan = _plan(tmp_path, {"pp": 2, "dp": 1, "tmp": 1, "mbs": 1, "partition": [0, 1, 2],
                            "placement": [[[0]], [[1]]]})
    assert main(["launch", str(tmp_path / "spec.yaml"), "--plan", str(plan)]) == 2
    assert "custom layer" in _error_line(capsys)


def test_infeasible_strategy_recorded_without_launching(spec, tmp_path, capsys):
    plan = _plan(tmp_path, {**PP2DP2, "zero_stage": 2})
    assert main(["launch", str(spec), "--plan", str(plan), "--no-progress"]) == 1
    out = capsys.readouterr().out
    assert "failed" in out and "rejects ZeRO stage 2 with pp=2" in out
    con = sqlite3.connect(tmp_path / "amp-search-results.sqlite")
    assert con.execute("SELECT status FROM results").fetchall() == [("failed",)]


def test_results_without_database(spec, capsys):
    assert main(["results", str(spec)]) == 2
    assert "no results database" in _error_line(capsys)


def test_results_json(spec, tmp_path, capsys):
    plan = _plan(tmp_path, {**PP2DP2, "zero_stage": 3})
    main(["launch", str(spec), "--plan", str(plan), "--no-progress"])
    capsys.readouterr()
    assert main(["results", str(spec), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [r["status"] for r in data["rows"]] == ["failed"]
    assert data["rows"][0]["strategy"]["zero_stage"] == 3


def test_planned_dry_run(spec, capsys):
    """Without --plan the launch plans first (amp_search.planner)."""
    assert main(["launch", str(spec), "--top-k", "2", "--dry-run", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.count("\ntrial ") + out.startswith("trial ") == 2
