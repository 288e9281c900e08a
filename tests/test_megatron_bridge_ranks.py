"""benchmarks/megatron_bridge.py --ranks: what a recipe's setting is, the model's error by kind
of model, and the counts the report prints."""
from __future__ import annotations

from conftest import load_benchmark

MB = load_benchmark("megatron_bridge")


def _row(**kw) -> dict:
    row = {"release": "26.04", "workload": "pre-training", "model": "Qwen3_30B_a3B",
           "system": "DGX-B200", "precision": "MXFP8", "gpus": "8", "gbs": "512", "mbs": "4",
           "seq": "4096", "fsdp": "0", "tp": "1", "pp": "1", "cp": "1", "vp": "n/a",
           "ep": "8", "tokens_per_s_per_gpu": "1000"}
    return {**row, **kw}


def test_a_setting_is_what_the_user_fixes_not_the_knobs_the_plan_chooses():
    a = _row()
    assert MB.setting_of(a) == MB.setting_of(_row(mbs="1", pp="2", ep="4"))
    # FP8 recipes of every scaling are one spec precision; BF16 is another
    assert MB.setting_of(a) == MB.setting_of(_row(precision="FP8-CS"))
    assert MB.setting_of(a) != MB.setting_of(_row(precision="BF16"))
    assert MB.setting_of(a) != MB.setting_of(_row(gbs="1024"))
    assert MB.kind_of(a) == "experts" and MB.kind_of(_row(model="LLAMA3_8B")) == "dense"


def test_kind_errors_are_the_newest_measurements_mape_by_system_and_kind():
    def result(model, predicted, release="26.04", measured=10.0):
        row = _row(model=model, release=release)
        return MB.Result(row, measured, predicted, True)

    results = [result("Qwen3_30B_a3B", 12.0, release="26.02"),   # superseded by the next
               result("Qwen3_30B_a3B", 11.0),
               result("LLAMA3_8B", 9.5)]
    errors = MB.kind_errors(results)
    assert abs(errors[("DGX-B200", "experts")] - 0.1) < 1e-12
    assert abs(errors[("DGX-B200", "dense")] - 0.05) < 1e-12


def test_rank_summary_counts_each_test_of_the_issue():
    ranks = [{"rank": 3, "layout_rank": 3, "place": 3, "best_within_error": True,
              "best_within_kind_error": True, "knobs_tied": True},
             {"rank": None, "layout_rank": 8, "place": 12, "best_within_error": False,
              "best_within_kind_error": True, "knobs_tied": False},
             {"rank": None, "layout_rank": 9, "place": 10, "best_within_error": False,
              "best_within_kind_error": True, "knobs_tied": True},
             {"rank": 40, "layout_rank": 40, "place": None, "best_within_error": False,
              "best_within_kind_error": False, "knobs_tied": True}]
    assert MB.rank_summary(ranks) == {
        "recipes": 4, "top10": 1, "layout10": 3, "layout10_tied": 2, "place10": 2,
        "within_error": 1, "within_kind_error": 3, "both": 1, "both_kind": 1}
