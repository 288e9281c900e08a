"""training.finetune: lora: the weights frozen, so each backward computes the input gradients
only, and there are no weight gradients, optimizer state, optimizer step or gradient
reduction to cost for them."""
from __future__ import annotations

import pytest

from amp_search import SpecError, estimate
from amp_search.launch.orchestrator import preflight
from amp_search.spec import parse_spec
from cost_models.compute import DeviceSpeed, analytic_layer_time, gemm_time_s
from cost_models.layers import Layer, gemm_flops


def _spec(finetune: str) -> dict:
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "3200 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 4096,
                      "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200},
            "training": {"global_batch_size": 32, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 1, "activation_checkpointing": "none",
                         "sequence_parallel": False, "finetune": finetune}}


def test_a_frozen_layers_backward_runs_its_gemms_once():
    dev = DeviceSpeed(peak_flops_per_s=989e12, memory_bandwidth_bytes_per_s=3.35e12)
    x = Layer(kind="transformer", hidden_size=4096, num_attention_heads=32, seq_length=2048,
              ffn_hidden_size=16384)
    kw = dict(tmp=2, mbs=1, device=dev, bytes_per_element=2, framework="megatron")
    full, lora = analytic_layer_time(x, **kw), analytic_layer_time(x, **kw, frozen=True)
    gemm = sum(gemm_time_s(f, dev) for f in gemm_flops(x, 2))
    assert lora.forward_s == full.forward_s
    assert full.backward_s - lora.backward_s == pytest.approx(gemm)


def test_lora_costs_no_optimizer_gradients_or_reduction():
    kw = dict(pp=1, dp=4, tmp=4, mbs=1, partition="uniform")
    full = estimate(parse_spec(_spec("none")), **kw)
    lora = estimate(parse_spec(_spec("lora")), **kw)
    assert full.breakdown.data_parallel_s > 0 and lora.breakdown.data_parallel_s == 0
    assert full.breakdown.optimizer_s > 0 and lora.breakdown.optimizer_s == 0
    assert lora.breakdown.compute_s < full.breakdown.compute_s
    for m_full, m_lora in zip(full.memory, lora.memory):
        assert m_lora.gradient_bytes == 0 and m_lora.optimizer_bytes == 0
        assert m_lora.parameter_bytes == m_full.parameter_bytes
    # the partition DP's memory (pp > 1) agrees: the frozen states are the weights only
    kw = dict(pp=2, dp=2, tmp=4, mbs=1)
    e = estimate(parse_spec(_spec("lora")), **kw)
    assert all(m.gradient_bytes == 0 for m in e.memory) and e.fits


def test_lora_is_checked_and_not_launched():
    d = _spec("qlora")
    with pytest.raises(SpecError, match=r"training\.finetune.*none, lora"):
        parse_spec(d)
    spec = parse_spec(_spec("lora"))
    s = estimate(spec, pp=1, dp=4, tmp=4, mbs=1).strategy
    assert "train every weight" in preflight(spec, s, "megatron")


def test_the_search_prunes_by_the_frozen_states():
    """A model whose trained states fit on no layout of two H100s (18 bytes a parameter),
    whose frozen weights (2 bytes) do: the search's memory-first pruning knows the
    difference, and the TFLOP/s column counts no weight gradients."""
    from amp_search import NoFeasibleStrategy, plan
    from amp_search.cli.plan import model_flops_per_sample
    d = _spec("none")
    d["cluster"]["nodes"][0].update(count=1, gpus_per_node=2)
    d["model"].update(hidden_size=8192, num_attention_heads=32, num_layers=16)
    d["training"].update(global_batch_size=8, zero_stage=0)
    with pytest.raises(NoFeasibleStrategy, match="out_of_memory"):
        plan(parse_spec(d))
    d["training"]["finetune"] = "lora"
    spec = parse_spec(d)
    assert plan(spec).best.fits
    layers = spec.model.layers
    assert model_flops_per_sample(layers, frozen=True) < model_flops_per_sample(layers)
