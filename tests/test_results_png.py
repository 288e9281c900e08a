"""`amp-search results SPEC --png`: predicted against measured time of the recorded trials."""
from __future__ import annotations

import pytest

from amp_search.cli import build_parser
from amp_search.errors import UsageError
from amp_search.launch.results_db import ResultsDB
from amp_search.spec import load_spec
from amp_search.timeline import _spearman, write_prediction_png
from conftest import ROOT

SPEC = ROOT / "configs" / "cpu-local.yaml"


def _db(tmp_path, rows):
    db = ResultsDB(tmp_path / "r.sqlite")
    sha = load_spec(SPEC).sha256
    for i, (pred, meas, status) in enumerate(rows):
        rid = db.start(spec_sha256=sha, spec_path=str(SPEC), trial_key=f"k{i}",
                       label=f"pp1-dp2-mbs{i}", backend="deepspeed", launcher="local",
                       strategy={"partition": [0, 6], "placement": [[[0], [1]]]},
                       predicted_s=pred, iters=3, warmup=1, log_path="", started_at="t0")
        db.finish(rid, status=status, ended_at="t1",
                  measured_mean_s=meas if status == "ok" else None)
    return tmp_path / "r.sqlite"


def _run(argv, capsys):
    args = build_parser().parse_args(argv)
    return args.func(args), capsys.readouterr().out


def test_results_png_plots_the_finished_trials(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    db = _db(tmp_path, [(0.4, 0.42, "ok"), (0.6, 0.55, "ok"), (0.5, None, "oom"),
                        (None, 0.7, "ok"), (0.8, 0.9, "ok")])
    png = tmp_path / "acc.png"
    code, out = _run(["results", str(SPEC), "--results", str(db), "--png", str(png)], capsys)
    assert code == 0 and "predicted against measured time of 3 trials" in out
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_results_png_without_points_is_one_clear_error(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    db = _db(tmp_path, [(0.5, None, "oom")])
    with pytest.raises(UsageError, match="nothing to plot"):
        _run(["results", str(SPEC), "--results", str(db), "--png", str(tmp_path / "a.png")],
             capsys)


def test_prediction_png_checks_its_series(tmp_path):
    pytest.importorskip("matplotlib")
    with pytest.raises(ValueError, match="one length"):
        write_prediction_png({"a": ([1.0, 2.0], [1.0])}, tmp_path / "x.png")
    with pytest.raises(ValueError, match="no point"):
        write_prediction_png({"a": ([], [])}, tmp_path / "x.png")
    write_prediction_png({"analytic": ([1.0, 2.0, 3.0], [1.1, 1.9, 3.2]),
                          "simulated": ([1.05, 2.0, 3.1], [1.1, 1.9, 3.2])}, tmp_path / "x.png")
    assert (tmp_path / "x.png").stat().st_size > 5000


def test_spearman_matches_scipy():
    scipy = pytest.importorskip("scipy.stats")
    x = [0.4, 0.5, 0.5, 0.9, 0.7, 0.1]
    y = [1.0, 2.0, 1.5, 4.0, 3.0, 0.5]
    assert _spearman(x, y) == pytest.approx(scipy.spearmanr(x, y).statistic, rel=1e-12)
