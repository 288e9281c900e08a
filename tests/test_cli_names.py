"""Names a Megatron-LM or NeMo user types: --tp for the tensor-parallel degree, beside AMP's
--tmp; and an estimate of a strategy that does not fit says so before anything else."""
from __future__ import annotations

from pathlib import Path

import pytest

from amp_search.cli import main

ROOT = Path(__file__).resolve().parent.parent
SPEC = str(ROOT / "configs" / "mixed-h100-a100-gpt13b.yaml")


@pytest.mark.parametrize("flag", ["--tp", "--tmp"])
def test_estimate_takes_tp_and_tmp(flag, capsys):
    assert main(["estimate", SPEC, "--pp", "4", "--dp", "4", flag, "2", "--mbs", "1",
                 "--no-simulate", "--json", "-"]) == 0
    import json

    assert json.loads(capsys.readouterr().out)["tmp"] == 2


def test_export_takes_tp(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["export", SPEC, "--format", "megatron", "--pp", "4", "--dp", "4", "--tp", "2",
                 "--mbs", "1", "--out", str(out)]) == 0, capsys.readouterr().err
    assert "--tensor-model-parallel-size 2" in " ".join(
        p.read_text() for p in out.rglob("*") if p.is_file())


def test_a_strategy_that_does_not_fit_says_so_first_and_in_its_exit_status(capsys):
    assert main(["estimate", SPEC, "--pp", "1", "--dp", "32", "--tp", "1", "--mbs", "8",
                 "--no-simulate"]) == 1
    out = capsys.readouterr()
    assert out.err.startswith("amp-search: this strategy does not fit: stage 0 needs "), out.err
    assert "DOES NOT FIT" in out.out          # the estimate is printed all the same


def test_a_strategy_that_fits_says_nothing_of_it(capsys):
    assert main(["estimate", SPEC, "--pp", "4", "--dp", "4", "--tp", "2", "--mbs", "1",
                 "--no-simulate"]) == 0
    assert "does not fit" not in capsys.readouterr().err
