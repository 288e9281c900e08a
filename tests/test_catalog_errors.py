"""The catalog's prediction_error figures are what the benchmarks measure: the A100's is
benchmarks/gpu_accuracy.py's MAPE on the open A100 set; each DGX system's GPU's, the MAPE of
benchmarks/megatron_bridge.py on that system's dense rows, and its `moe:` figure on the
mixture-of-experts rows (to the 0.1% the catalog writes). A change of the model that moves
them fails here, and the catalog is refreshed with it; `plan` marks its ties within them."""
from __future__ import annotations

import csv

from conftest import load_benchmark

from amp_search.spec import load_catalog


def test_the_a100_error_is_gpu_accuracys():
    ga = load_benchmark("gpu_accuracy")
    rows = ga.load_rows(ga.DATA)
    assert not ga.predict(rows)
    mape = ga.figures(rows)["mape"]
    cat = load_catalog()
    for gpu in ("A100-40GB", "A100-80GB"):
        error, source = cat[gpu].error_of(False)
        assert "gpu_accuracy.py" in source
        assert round(error, 3) == round(mape, 3), gpu


def test_the_dgx_errors_are_megatron_bridges():
    mb = load_benchmark("megatron_bridge")
    with open(mb.DATA, newline="") as f:
        results = mb.cost_rows(list(csv.DictReader(f))).results
    measured = {k: mb.mape(rs) for k, rs in mb.groups(
        results, lambda r: (r.row["system"], mb.kind_of(r.row))).items()}
    cat = load_catalog()
    checked = 0
    for gpu, system in (("H100-80GB", "DGX-H100"), ("B200-180GB", "DGX-B200"),
                        ("B300-288GB", "DGX-B300"), ("GB200-186GB", "DGX-GB200"),
                        ("GB300-288GB", "DGX-GB300")):
        for experts, kind in ((False, "dense"), (True, "experts")):
            error, source = cat[gpu].error_of(experts)
            if (system, kind) not in measured:
                assert "not measured" in source, (gpu, kind)
                continue
            assert "megatron_bridge.py" in source, (gpu, kind)
            assert round(error, 3) == round(measured[(system, kind)], 3), (gpu, kind)
            checked += 1
    assert checked == 9
