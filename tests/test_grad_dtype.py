"""training.grad_reduce_in_fp32: the gradients accumulated and reduced in fp32 (Megatron-LM's
default with bf16) or in the training dtype (megatron-core's grad_reduce_in_fp32=False, as
Megatron-Bridge's recipes run): the gradient buffer, the distributed optimizer's share and
the data-parallel traffic."""
from __future__ import annotations

import pytest

from amp_search import estimate
from amp_search.spec import SpecError, parse_spec
from amp_search.trial.config import ds_config
from cost_models import comm
from cost_models import memory as memory_model


def _spec(fp32=None, backend="megatron") -> dict:
    training = {"global_batch_size": 64, "precision": "bf16", "backend": backend,
                "zero_stage": 1, "activation_checkpointing": "none",
                "sequence_parallel": False}
    if fp32 is not None:
        training["grad_reduce_in_fp32"] = fp32
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "100 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 4096,
                      "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200},
            "training": training}


def test_the_key():
    assert parse_spec(_spec()).training.grad_reduce_in_fp32 is None
    assert parse_spec(_spec(False)).training.grad_reduce_in_fp32 is False
    with pytest.raises(SpecError, match=r"training\.grad_reduce_in_fp32: got 'no'; accepted: "
                                        r"true, false, default"):
        parse_spec(_spec("no"))


def test_megatron_states_follow_the_distributed_optimizer_table():
    """Megatron Core's distrib_optimizer.md: bf16 weights with fp32 gradients 6 + 12/d bytes a
    parameter, 16-bit gradients 4 + 16/d, of which the fp32 gradient copy (4/d) exists at the
    optimizer step only."""
    P, d = 1_000_000, 8
    fp32 = memory_model.megatron_model_state_bytes(P, precision="bf16", zero_stage=1, dp=d)
    bf16 = memory_model.megatron_model_state_bytes(P, precision="bf16", zero_stage=1, dp=d,
                                                   grad_fp32=False)
    assert fp32.parameter_bytes + fp32.gradient_bytes + fp32.optimizer_bytes == (6 + 12 / d) * P
    assert fp32.step_bytes == 0             # .float() of an fp32 buffer is the buffer
    assert bf16.parameter_bytes + bf16.gradient_bytes + bf16.optimizer_bytes == (4 + 12 / d) * P
    assert bf16.step_bytes == 4 / d * P
    assert comm.gradient_reduce_bytes_per_element("bf16", framework="megatron") == 4
    assert comm.gradient_reduce_bytes_per_element("bf16", framework="megatron",
                                                  fp32_allreduce=False) == 2
    assert comm.gradient_reduce_bytes_per_element("bf16", fp32_allreduce=True) == 4


def test_a_plan_with_16_bit_gradients_holds_and_moves_less():
    kw = dict(pp=2, dp=8, tmp=1, mbs=1, simulate=True)
    fp32 = estimate(parse_spec(_spec(None)), **kw)
    bf16 = estimate(parse_spec(_spec(False)), **kw)
    assert bf16.breakdown.data_parallel_s < fp32.breakdown.data_parallel_s
    assert bf16.simulation.iteration_time_s < fp32.simulation.iteration_time_s
    for a, b in zip(fp32.memory, bf16.memory):
        assert b.gradient_bytes * 2 == a.gradient_bytes
        # the step's fp32 copies are never held with the activations
        assert 0 < b.step_bytes < b.activation_bytes
        assert b.peak_bytes == (b.parameter_bytes + b.gradient_bytes + b.optimizer_bytes
                                + b.activation_bytes + b.overhead_bytes)
        assert a.step_bytes == 0
        assert b.peak_bytes < a.peak_bytes


def test_deepspeed_says_it_in_its_config():
    s = estimate(parse_spec(_spec(True, backend="deepspeed")), pp=2, dp=8, tmp=1,
                 mbs=1).strategy
    assert ds_config(s, precision="bf16", fp32_reduce=True)["communication_data_type"] == \
        "fp32"
    assert "communication_data_type" not in ds_config(s, precision="bf16")


def test_the_simulator_and_the_launch_follow_it():
    from amp_search.launch.megatron import megatron_args, megatron_unsupported_gradients
    from amp_search.simulate import simulation_inputs
    from amp_search.costing.cost_model import CostModel

    for backend in ("deepspeed", "megatron"):
        bytes_ = {}
        for fp32 in (True, False):
            spec = parse_spec(_spec(fp32, backend=backend))
            e = estimate(spec, pp=2, dp=8, tmp=1, mbs=1)
            bytes_[fp32] = simulation_inputs(CostModel(spec), e.strategy)["gradient_bytes"]
        assert list(bytes_[True]) == [2 * b for b in bytes_[False]], backend
    spec = parse_spec(_spec(True))
    s = estimate(spec, pp=2, dp=8, tmp=1, mbs=1).strategy
    assert "--accumulate-allreduce-grads-in-fp32" in megatron_args(
        spec.model.layers, s, precision="fp16", iters=2, grad_reduce_in_fp32=True)
    assert "pretrain_gpt.py accumulates" in megatron_unsupported_gradients("bf16", False)
    assert megatron_unsupported_gradients("bf16", None) == ""


def test_the_peak_is_the_step_where_the_gradient_copies_outweigh_the_activations():
    """Without the distributed optimizer every rank copies all its 16-bit gradients to fp32
    for the step (4 bytes a parameter); with short sequences that is more than one
    micro-batch's activations, and the peak is then the step's."""
    d = _spec(False)
    d["model"]["seq_length"] = 128
    d["training"]["zero_stage"] = 0
    e = estimate(parse_spec(d), pp=2, dp=8, tmp=1, mbs=1)
    for m in e.memory:
        params = m.parameter_bytes // 2                 # bf16 weights
        assert m.step_bytes == 4 * params > m.activation_bytes
        assert m.peak_bytes == (m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes
                                + m.step_bytes + m.overhead_bytes)
