"""benchmarks/megatron_table5.py: the published Megatron-LM rows it reads and how it costs
them (the full comparison is the benchmark's output, not a test)."""
from __future__ import annotations

import pytest

from conftest import load_benchmark

T5 = load_benchmark("megatron_table5")


def test_the_data_file_has_both_modes_of_each_model_and_says_where_it_comes_from():
    rows = T5.load_rows(T5.DATA)
    assert sorted({(r["model"], r["mode"]) for r in rows}) == sorted(
        (m, k) for m in ("22B", "175B", "530B", "1T") for k in ("full", "selective_sp"))
    for r in rows:
        assert r["tmp"] * r["pp"] * r["dp"] == r["gpus"] and r["measured_s"] > 0
        assert r["global_batch"] % (r["dp"] * r["micro_batch"]) == 0
    header = [x for x in T5.DATA.read_text().splitlines() if x.startswith("#")]
    assert any("2205.05198" in x for x in header) and any("calculon" in x for x in header)


def test_a_row_is_costed_as_megatron_with_its_knobs(tmp_path):
    rows = [r for r in T5.load_rows(T5.DATA) if r["model"] == "22B"]
    spec = T5.parse_spec(T5.spec_dict(rows[0]))
    assert spec.training.backend == "megatron" and spec.cluster.num_devices == rows[0]["gpus"]
    got = {r["mode"]: T5.predict(r) for r in rows}
    # selective + sequence parallel skips the recomputed forward: faster, as measured
    assert 0 < got["selective_sp"]["predicted_s"] < got["full"]["predicted_s"]
    assert got["full"]["fits"] and got["selective_sp"]["fits"]
    bad = tmp_path / "bad.csv"
    bad.write_text(T5.DATA.read_text().replace("selective_sp", "sometimes", 1))
    with pytest.raises(SystemExit, match="mode 'sometimes'"):
        T5.load_rows(bad)
