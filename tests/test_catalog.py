"""The GPU catalog's newer entries (profiles/gpus.yaml): Hopper and Blackwell parts load with
their data-sheet figures (dense, per GPU), and an NVL72 rack written as one 72-GPU node plans
with its tensor groups on NVLink."""
from __future__ import annotations

import pytest

from amp_search.spec import parse_spec

# name: (memory GB, HBM GB/s, dense BF16 TFLOP/s, GPUs per NVLink domain); memory as nvidia-smi
# totals it where the sheet rounds GiB to "GB" (H200, B200, GB200, GB300)
SHEETS = {"H100-80GB": (80 * 2**30 / 1e9, 3350, 989.4, 8),
          "H200-141GB": (143771 * 2**20 / 1e9, 4800, 989.4, 8),
          "B200-180GB": (183359 * 2**20 / 1e9, 8000, 2250.0, 8),
          "B300-288GB": (288, 8000, 2250.0, 8),
          "GB200-186GB": (189471 * 2**20 / 1e9, 8000, 2500.0, 72),
          "GB300-288GB": (284208 * 2**20 / 1e9, 8000, 2500.0, 72)}


def _spec(gpu: str, per_node: int, nodes: int = 1):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": gpu, "count": nodes, "gpus_per_node": per_node,
                               "intra_node_bandwidth": "900 GB/s",
                               "inter_node_bandwidth": "400 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 16, "hidden_size": 4096,
                  "num_attention_heads": 32, "vocab_size": 50257, "seq_length": 2048},
        "training": {"global_batch_size": 576, "precision": "bf16"}})


@pytest.mark.parametrize("name", sorted(SHEETS))
def test_entry_has_its_data_sheet_figures(name):
    memory_gb, bandwidth, bf16, per_node = SHEETS[name]
    gpu = _spec(name, per_node).cluster.devices[0].gpu
    assert gpu.memory_bytes / 1e9 == pytest.approx(memory_gb)
    assert gpu.memory_bandwidth_bytes_per_s == pytest.approx(bandwidth * 1e9)
    assert gpu.peak_flops_per_s["bf16"] == pytest.approx(bf16 * 1e12)
    assert gpu.peak_flops_per_s["fp16"] == gpu.peak_flops_per_s["bf16"]


def test_an_nvl72_rack_keeps_tensor_groups_on_nvlink():
    from amp_search import plan

    spec = _spec("GB200-186GB", 72, nodes=2)
    best = plan(spec, simulate_top=0).strategies[0]
    assert best.strategy.num_devices == 144
    # every tensor group lies inside one 72-GPU rack
    for stage in best.strategy.placement:
        for group in stage:
            assert len({d // 72 for d in group}) == 1
