"""GEMM efficiency per GPU family as catalog data with its source (profiles/gpus.yaml): each
family's `max` is the A100's 0.8 scaled by its published matmul share against the A100's; a
GPU without a measurement keeps the A100's, and an entry's keys replace the defaults' one by
one."""
from __future__ import annotations

import pytest

from amp_search.spec import catalog_defaults, load_catalog, parse_spec


def test_each_family_has_its_share_and_its_source():
    c = load_catalog()
    assert c["A100-80GB"].gemm_max_efficiency == 0.8
    assert c["A100-80GB"].gemm_efficiency_source.startswith("A100 (the fallback)")
    expected = {"V100-16GB": 0.8 * 77.9 / 84.8, "T4-16GB": 0.8 * 65.1 / 84.8,
                "H100-80GB": 0.8 * (80.3 / 86.9 + 79.8 / 84.8) / 2,
                "B200-180GB": 0.8 * (77.6 / 86.9 + 75.4 / 84.8) / 2,
                "B300-288GB": 0.8 * 78.6 / 86.9, "GB200-186GB": 0.8 * 72.9 / 86.9}
    for name, value in expected.items():
        assert c[name].gemm_max_efficiency == pytest.approx(value, abs=6e-4), name
        assert "matmul share" in c[name].gemm_efficiency_source, name
    assert c["H200-141GB"].gemm_max_efficiency == c["H100-80GB"].gemm_max_efficiency
    assert c["L4-24GB"].gemm_max_efficiency == 0.8          # not measured: the fallback
    for g in c.values():                                      # every GPU says where from
        assert g.gemm_efficiency_source
        assert g.gemm_half_flops == (3e5 if g.kind == "cpu" else 2e9)
    # the family's own max, the defaults' FP8 and NVFP4 fractions
    assert c["H100-80GB"].gemm_fp8_max_efficiency == c["A100-80GB"].gemm_fp8_max_efficiency


def _spec(gpu) -> dict:
    return {"cluster": {"nodes": [{"gpu": gpu, "count": 1, "gpus_per_node": 2,
                                   "intra_node_bandwidth": "300 GB/s"}]},
            "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 4096,
                      "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200},
            "training": {"global_batch_size": 8, "precision": "fp16"}}


def test_an_inline_gpu_keeps_the_keys_it_does_not_give():
    gpu = {"name": "MyGPU", "memory": "24 GiB", "memory_bandwidth": "1 TB/s",
           "peak_tflops": {"fp16": 100, "bf16": 100, "fp32": 20},
           "gemm_efficiency": {"max": 0.7}}
    g = parse_spec(_spec(gpu)).cluster.node_groups[0].gpu
    assert g.gemm_max_efficiency == 0.7
    fallback = catalog_defaults()["gemm_efficiency"]        # the catalog's defaults: block
    assert g.gemm_half_flops == 2e9 and g.gemm_fp8_max_efficiency == fallback["fp8_max"]
    assert g.gemm_efficiency_source == "as written for this GPU"


def test_a_v100_block_is_slower_by_its_share():
    """A GEMM-bound block (hidden 4096, 8 x 2048 tokens): the V100's time over what the A100's
    0.8 would give is about 0.8 / 0.735, the GEMMs being most of it."""
    from dataclasses import replace

    from amp_search.costing.layer_times import LayerTimer

    spec = parse_spec(_spec("V100-16GB"))
    v100 = spec.cluster.node_groups[0].gpu
    as_a100 = replace(v100, name="V100-as-A100", gemm_max_efficiency=0.8)
    own = LayerTimer(spec).times(v100, 1, 8)
    other = LayerTimer(spec).times(as_a100, 1, 8)
    ratio = (own.forward_s[1] + own.backward_s[1]) / (other.forward_s[1] + other.backward_s[1])
    assert 1.04 < ratio <= 0.8 / 0.735 + 1e-9


def test_the_source_is_not_part_of_a_plan():
    from amp_search.spec import spec_fingerprint
    data = spec_fingerprint(parse_spec(_spec("V100-16GB")))
    assert "gemm_efficiency_source" not in str(data)
