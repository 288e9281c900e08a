"""Megatron-FSDP (zero_stage 3 under the megatron backend, --data-parallel-sharding-strategy
optim_grads_params): weights, gradients and optimizer state sharded over data parallelism,
each layer's weights all-gathered in its forward and backward and its gradients
reduce-scattered, beside the neighbouring layers' compute."""
from __future__ import annotations

import numpy as np
import pytest

from amp_search import Infeasible, estimate
from amp_search.costing.cost_model import CostModel
from amp_search.launch.megatron import megatron_args, megatron_unsupported
from amp_search.search_space import Candidate
from amp_search.spec import parse_spec
from cost_models import comm
from cost_models import memory as memory_model


def _spec(bw="900 GB/s") -> dict:
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                                   "intra_node_bandwidth": bw}]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 4096,
                      "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200},
            "training": {"global_batch_size": 32, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 3, "activation_checkpointing": "none",
                         "sequence_parallel": False}}


def test_states_are_sharded_with_two_layers_whole():
    P, d, layer = 8_000_000, 8, 1_000_000
    z3 = memory_model.megatron_model_state_bytes(P, precision="bf16", zero_stage=3, dp=d,
                                                 gathered_numel=2 * layer)
    z1 = memory_model.megatron_model_state_bytes(P, precision="bf16", zero_stage=1, dp=d)
    assert z3.parameter_bytes == 2 * (P // d + 2 * layer)         # bf16 shard + two layers
    assert z3.gradient_bytes == 4 * (P // d + 2 * layer)          # fp32 main grads
    assert z3.optimizer_bytes == z1.optimizer_bytes == 12 * P // d
    assert memory_model.optimizer_shards(framework="megatron", zero_stage=3,
                                         precision="bf16", dp=d) == d


def test_each_layer_takes_the_longer_of_its_compute_and_its_traffic():
    """Over a fast link the traffic hides under the compute (the same time as ZeRO 1's
    compute); over a slow one each layer's pass is its gathers and reduce-scatter."""
    for bw, hidden in (("900 GB/s", True), ("1 GB/s", False)):
        spec = parse_spec(_spec(bw))
        model = CostModel(spec)
        c3 = Candidate.make(pp=1, dp=8, tmp=1, mbs=1, zero_stage=3, recompute="none")
        c1 = Candidate.make(pp=1, dp=8, tmp=1, mbs=1, zero_stage=1, recompute="none")
        layout = model.layout(c3, placement=np.arange(8).reshape(1, 8, 1))
        fsdp = model.stage_costs(c3, layout)
        zero1 = model.stage_costs(c1, model.layout(c1, placement=np.arange(8).reshape(1, 8, 1)))
        forward, backward = model.fsdp_time_s(c3, layout)
        assert not fsdp.sync_s.any() and not fsdp.sync_fixed_s.any()   # nothing at the step
        block = 2
        params = model.synced_params_per_layer(c3)[block]
        bwl, crosses = layout.dp_links
        lat = model.link_latencies_s("all_gather", crosses, layout)
        f, b = comm.fsdp_unit_times_s(params * 2, params * 4, 8, float(bwl[0]), float(lat[0]))
        assert forward[0, block] == pytest.approx(f, rel=1e-3)
        assert backward[0, block] == pytest.approx(b, rel=1e-3)
        if hidden:
            # the blocks' traffic hides under their compute; the embedding's 210M weights
            # take longer to gather than its lookup takes
            np.testing.assert_allclose(fsdp.compute_s[:, 1:-1], zero1.compute_s[:, 1:-1])
            assert fsdp.compute_s[0, 0] > zero1.compute_s[0, 0]
        else:
            assert fsdp.compute_s[0, block] == pytest.approx(forward[0, block]
                                                             + backward[0, block])


def test_the_search_rules_and_the_launcher():
    spec = parse_spec(_spec())
    e = estimate(spec, pp=1, dp=8, tmp=1, mbs=1, zero_stage=3)
    assert e.fits and e.breakdown.data_parallel_s == 0.0
    with pytest.raises(Infeasible, match="Megatron-FSDP"):
        estimate(spec, pp=2, dp=4, tmp=1, mbs=1, zero_stage=3)
    s = e.strategy
    args = megatron_args(spec.model.layers, s, precision="bf16", iters=2)
    for flag in ("--use-megatron-fsdp", "--data-parallel-sharding-strategy",
                 "optim_grads_params", "--overlap-param-gather", "--overlap-grad-reduce"):
        assert flag in args
    assert megatron_unsupported(s) == ""


def test_cpu_devices_cannot_run_megatron_fsdp():
    from amp_search.launch.orchestrator import preflight
    d = _spec()
    d["cluster"]["nodes"][0].update(gpu="CPU-local", gpus_per_node=2)
    d["training"].update(precision="fp32", global_batch_size=8)
    d["model"].update(hidden_size=256, num_attention_heads=4, vocab_size=2048)
    spec = parse_spec(d)
    s = estimate(spec, pp=1, dp=2, tmp=1, mbs=1, zero_stage=3).strategy
    assert "needs CUDA" in preflight(spec, s, "megatron")
