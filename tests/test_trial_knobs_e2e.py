"""Real trials with sequence parallelism and selective recomputation on CPU (gloo), launched
by `amp-search launch --plan` like every trial: DeepSpeed's PipelineModule (pp 2) and plain
engine (pp 1, ZeRO 2) over the trial layers at tmp 2. Same seed and data as the trial
without the knobs: the losses must agree, and the result records the strategy's knobs."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")

from amp_search.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def _row(pp, dp, tmp, partition, *, zero=0, sp=False, recompute="none", mbs=2):
    dev = iter(range(4))
    placement = [[[next(dev) for _ in range(tmp)] for _ in range(dp)] for _ in range(pp)]
    return {"pp": pp, "dp": dp, "tmp": tmp, "mbs": mbs, "partition": list(partition),
            "placement": placement, "zero_stage": zero,
            "activation_checkpointing": recompute == "full", "recompute": recompute,
            "sequence_parallel": sp, "iteration_time_s": 0.1}


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    d = tmp_path_factory.mktemp("cpu-tiny-knobs")
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", d / "spec.yaml")
    plan = {"strategies": [_row(2, 1, 2, (0, 2, 6)),
                           _row(2, 1, 2, (0, 2, 6), sp=True, recompute="selective"),
                           _row(1, 1, 2, (0, 6), zero=2, sp=True, recompute="selective")]}
    (d / "plan.json").write_text(json.dumps(plan))
    rc = main(["launch", str(d / "spec.yaml"), "--plan", str(d / "plan.json"), "--top-k", "3",
               "--iters", "3", "--warmup", "1", "--no-progress", "--json", str(d / "out.json")])
    return rc, json.loads((d / "out.json").read_text())


def test_knob_trials_run_and_train_the_same_model(launched):
    rc, out = launched
    trials = out["trials"]
    assert rc == 0 and [t["status"] for t in trials] == ["ok"] * 3, \
        [t["error"] + t["log_tail"] for t in trials]
    assert [t["strategy"]["sequence_parallel"] for t in trials] == [False, True, True]
    assert [t["strategy"]["selective_recompute"] for t in trials] == [False, True, True]
    base = trials[0]["losses"]
    assert len(base) == 3 and base[0] == pytest.approx(6.93, abs=0.1)   # ~ln(1024) at init
    for t in trials[1:]:
        assert t["losses"] == pytest.approx(base, rel=1e-4), t["label"]
