"""Megatron-LM's distributed optimizer (training.backend: megatron, zero_stage 1) and the
sequence-parallel collectives and the sequence-parallel time term, with
hand-computed bytes and seconds."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from amp_search import Infeasible, estimate, plan
from amp_search.planner import NoFeasibleStrategy
from amp_search.launch.megatron import megatron_args, megatron_unsupported
from amp_search.launch.orchestrator import preflight
from amp_search.costing import CostModel
from amp_search.records import Strategy
from amp_search.search_space import Candidate
from amp_search.simulate import pass_times
from amp_search.spec import SpecError, parse_spec
from cost_models import comm
from cost_models import memory as memory_model
from cost_models import pipeline
from cost_models.compute import HostCosts, host_time_s
from cost_models.layers import Layer, TpCollective, param_count, tp_collectives_by_pass


def spec(*, backend="megatron", zero=1, precision="fp16", sp=False, per=4, layers=4, gbs=8):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": per,
                               "intra_node_bandwidth": "150 GB/s"}]},
        "model": {"preset": "gpt", "num_layers": layers, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
        "training": {"global_batch_size": gbs, "precision": precision, "zero_stage": zero,
                     "sequence_parallel": sp, "backend": backend}})


# ----------------------------------------------------------------------------- memory

@pytest.mark.parametrize("precision,plain,weights_and_grads,sharded", [
    # Megatron Core user guide, "Distributed Optimizer": bytes per parameter
    ("fp16", 20, 4, 16),     # fp16 param, fp16 grads: 20 | 4 + 16/d
    ("bf16", 18, 6, 12),     # bf16 param, fp32 grads: 18 | 6 + 12/d
    ("fp32", 16, 8, 8),      # fp32 param, fp32 grads: 16 | 8 + 8/d
])
def test_megatron_bytes_per_parameter_are_the_documented_table(precision, plain,
                                                              weights_and_grads, sharded):
    P, d = 1000, 4
    zero0 = memory_model.megatron_model_state_bytes(P, precision=precision, zero_stage=0, dp=d)
    zero1 = memory_model.megatron_model_state_bytes(P, precision=precision, zero_stage=1, dp=d)
    # the table counts the fp32 copy of fp16 gradients, which exists at the step only
    total = lambda s: (s.parameter_bytes + s.gradient_bytes + s.optimizer_bytes  # noqa: E731
                       + s.step_bytes)
    assert total(zero0) == plain * P
    assert total(zero1) == weights_and_grads * P + sharded * P // d   # 4 + 16/4 = 8 B (fp16)
    assert zero1.parameter_bytes == zero0.parameter_bytes               # weights not sharded
    assert zero1.gradient_bytes == zero0.gradient_bytes                 # nor the grad buffer
    assert zero0.buffer_bytes == zero1.buffer_bytes == 0                # no DeepSpeed bucket
    # a partition is ceil(P / d): 1001 parameters over 4 ranks hold 251 each
    one = memory_model.megatron_model_state_bytes(1001, precision=precision, zero_stage=1, dp=4)
    assert one.optimizer_bytes + one.step_bytes == sharded * 251
    assert one.step_bytes == (4 * 251 if precision == "fp16" else 0)
    with pytest.raises(ValueError, match="no ZeRO stage 2"):
        memory_model.megatron_model_state_bytes(P, precision=precision, zero_stage=2, dp=d)


def test_estimate_holds_the_distributed_optimizers_bytes():
    """bf16, dp 4, pp 1, tmp 1: weights 2P, fp32 gradient buffer 4P, optimizer 12 ceil(P/4)."""
    s = spec(precision="bf16")
    P = sum(param_count(x, 1) for x in s.model.layers)
    mem = estimate(s, pp=1, dp=4, tmp=1, mbs=1).memory[0]
    assert (mem.parameter_bytes, mem.gradient_bytes, mem.optimizer_bytes) == \
        (2 * P, 4 * P, 12 * -(-P // 4))
    assert mem.overhead_bytes == s.training.framework_overhead_bytes     # no ZeRO bucket
    plain = estimate(s, pp=1, dp=4, tmp=1, mbs=1, zero_stage=0).memory[0]
    assert plain.optimizer_bytes == 12 * P
    # DeepSpeed's ZeRO 1 of the same model: bf16 gradients and a 1 GB bucket
    ds = estimate(spec(precision="bf16", backend="deepspeed"), pp=1, dp=4, tmp=1,
                  mbs=1).memory[0]
    assert ds.gradient_bytes != mem.gradient_bytes and ds.overhead_bytes > mem.overhead_bytes


# ----------------------------------------------------------------------------- time

def test_distributed_optimizer_moves_the_all_reduces_volume():
    """Reduce-scatter of the gradients + all-gather of the weights: (n-1)/n each, so with
    equal dtypes the same seconds as one all-reduce 2(n-1)/n; bf16 reduces fp32 gradients."""
    kw = dict(n=4, bandwidth_bytes_per_s=1e9, latency_s=0.0, gas=1, framework="megatron")
    dist = comm.data_parallel_sync_time_s(param_bytes=2e9, grad_bytes=4e9, zero_stage=1, **kw)
    assert dist == pytest.approx(0.75 * 4 + 0.75 * 2)                 # 4.5 s
    assert comm.data_parallel_sync_time_s(param_bytes=2e9, grad_bytes=4e9, zero_stage=0,
                                       **kw) == pytest.approx(2 * 0.75 * 4)
    assert comm.data_parallel_sync_time_s(param_bytes=2e9, grad_bytes=2e9, zero_stage=1, **kw) \
        == pytest.approx(comm.allreduce_time_s(2e9, 4, 1e9))
    # latency: n-1 steps each, 2(n-1) in all, as the all-reduce
    lat = dict(kw, bandwidth_bytes_per_s=1e30, latency_s=1e-3)
    assert comm.data_parallel_sync_time_s(param_bytes=1.0, grad_bytes=1.0, zero_stage=1, **lat) \
        == pytest.approx(6e-3)
    with pytest.raises(ValueError, match="no ZeRO stage 3"):
        comm.data_parallel_sync_time_s(param_bytes=1.0, grad_bytes=1.0, zero_stage=3, **kw)


def test_distributed_optimizer_divides_the_step_not_the_sync():
    s = spec(precision="fp16")
    kw = dict(pp=1, dp=4, tmp=1, mbs=1)
    dist, plain = estimate(s, **kw, zero_stage=1), estimate(s, **kw, zero_stage=0)
    assert dist.breakdown.optimizer_s == pytest.approx(plain.breakdown.optimizer_s / 4)
    # fp16 weights and gradients: reduce-scatter + all-gather = the all-reduce's seconds
    assert dist.breakdown.data_parallel_s == pytest.approx(plain.breakdown.data_parallel_s)
    assert dist.iteration_time_s < plain.iteration_time_s


# ----------------------------------------------------------------------------- search, launch

def test_megatron_backend_prunes_zero_2_3_by_name():
    s = parse_spec({**_raw(), "training": {**_raw()["training"], "zero_stage": "search"}})
    assert s.training.zero_stage == (0, 1)     # Megatron-LM's search: its distributed optimizer
    result = plan(s)
    assert {e.strategy.zero_stage for e in result.strategies} <= {0, 1}
    two = parse_spec({**_raw(), "training": {**_raw()["training"], "zero_stage": 2}})
    with pytest.raises(NoFeasibleStrategy, match="zero_2_3_under_megatron"):
        plan(two)
    with pytest.raises(Infeasible, match="zero_2_3_under_megatron"):
        estimate(s, pp=1, dp=4, tmp=1, mbs=1, zero_stage=2)
    with pytest.raises(SpecError, match="training.backend: got 'jax'; accepted: deepspeed, "
                                        "megatron"):
        parse_spec({**_raw(), "training": {**_raw()["training"], "backend": "jax"}})


def _raw():
    return {"cluster": {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 4,
                                   "intra_node_bandwidth": "150 GB/s"}]},
            "model": {"preset": "gpt", "num_layers": 4, "hidden_size": 1024,
                      "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
            "training": {"global_batch_size": 8, "precision": "bf16", "backend": "megatron"}}


def test_megatron_command_has_the_distributed_optimizer_for_zero_1_only():
    s = spec()
    layers = s.model.layers
    n = len(layers)

    def strat(zero):
        return Strategy(pp=1, dp=4, tmp=1, mbs=1, global_batch_size=8, partition=(0, n),
                        placement=(((0,), (1,), (2,), (3,)),), zero_stage=zero,
                        activation_checkpointing=False)

    assert "--use-distributed-optimizer" in megatron_args(layers, strat(1), precision="bf16",
                                                          iters=2)
    assert "--use-distributed-optimizer" not in megatron_args(layers, strat(0),
                                                              precision="bf16", iters=2)
    assert megatron_unsupported(strat(1)) == ""
    assert megatron_unsupported(strat(3)) == ""             # Megatron-FSDP (pp 1)
    assert "--use-megatron-fsdp" in megatron_args(layers, strat(3), precision="bf16", iters=2)
    assert "no ZeRO stage 2" in preflight(s, strat(2), "megatron")
    assert preflight(s, strat(2), "deepspeed") == ""        # pp 1: DeepSpeed's plain engine


# ----------------------------------------------------------------------------- sequence parallel

def _kinds(part):
    return sorted((c.kind, c.elements) for c in part)


def test_sequence_parallel_collectives_of_a_block_by_hand():
    s_, h = 1024, 1024
    b = Layer(kind="transformer", seq_length=s_, hidden_size=h, num_attention_heads=16,
              ffn_hidden_size=4 * h)
    sh = s_ * h
    fwd, bwd, rec = tp_collectives_by_pass(b, sequence_parallel=True, framework="megatron")
    assert _kinds(fwd) == sorted([("all_gather", sh)] * 2 + [("reduce_scatter", sh)] * 2)
    # the conjugates + the column GEMMs' inputs gathered again for the weight gradients
    assert _kinds(bwd) == sorted([("all_gather", sh)] * 4 + [("reduce_scatter", sh)] * 2)
    assert rec == ()
    _, bwd_trial, _ = tp_collectives_by_pass(b, sequence_parallel=True)
    # the trial layers also all-reduce 2 LayerNorms' and 2 row biases' gradients (6 x h)
    assert _kinds(bwd_trial) == sorted(_kinds(bwd) + [("all_reduce", h)] * 6)
    assert tp_collectives_by_pass(b, True, True, "megatron")[2] == fwd
    # seconds at n = 2, 1 B/s, no latency, 1 byte per element: forward the same volume as
    # tensor parallelism's 2 all-reduces (2 sh), backward 1.5x (3 sh)
    t = lambda part: comm.collectives_time_s(comm.collectives_by_kind(part), 2, 1.0)  # noqa: E731
    plain = tp_collectives_by_pass(b)
    assert t(plain[0]) == t(plain[1]) == pytest.approx(2 * sh)
    assert t(fwd) == pytest.approx(2 * sh) and t(bwd) == pytest.approx(3 * sh)
    # latency at n = 2: an all-reduce is 2 ring steps, an all-gather or reduce-scatter 1;
    # backward: tensor parallelism 2 x 2 = 4 steps, sequence parallel 6 (+ 6 x 2 in the trials)
    steps = lambda part: comm.collectives_time_s(comm.collectives_by_kind(part), 2, 1e30,  # noqa
                                              latency_s=1.0)
    assert steps(plain[1]) == pytest.approx(4) and steps(bwd) == pytest.approx(6)
    assert steps(bwd_trial) == pytest.approx(18)


def test_sequence_parallel_collectives_of_the_other_layers():
    s_, h = 512, 256
    emb = Layer(kind="embedding", seq_length=s_, hidden_size=h, vocab_size=1024)
    head = Layer(kind="head", seq_length=s_, hidden_size=h, vocab_size=1024)
    sh = s_ * h
    assert tp_collectives_by_pass(emb, sequence_parallel=True, framework="megatron") == (
        (TpCollective("reduce_scatter", sh),), (TpCollective("all_gather", sh),), ())
    assert _kinds(tp_collectives_by_pass(emb, sequence_parallel=True)[0]) == \
        [("all_reduce", sh)]
    fwd, bwd, _ = tp_collectives_by_pass(head, sequence_parallel=True, framework="megatron")
    assert _kinds(fwd) == sorted([("all_gather", sh)] + [("all_reduce", s_)] * 3)
    assert _kinds(bwd) == sorted([("all_gather", sh), ("reduce_scatter", sh)])
    with pytest.raises(ValueError, match="framework 'jax'"):
        tp_collectives_by_pass(head, framework="jax")


def test_host_time_counts_every_collective_call():
    b = Layer(kind="transformer", seq_length=128, hidden_size=256, num_attention_heads=4,
              ffn_hidden_size=1024)
    host = HostCosts(block_pass_s=1e-3, tp_allreduce_per_rank_s=1e-5)
    assert host_time_s(b, tmp=2, recompute=False, host=host) == pytest.approx(2e-3 + 4e-5)
    # 4 forward + 6 backward + 6 small all-reduces in the trial layers' backward
    assert host_time_s(b, tmp=2, recompute=False, host=host, sequence_parallel=True) == \
        pytest.approx(2e-3 + 16e-5)
    assert host_time_s(b, tmp=4, recompute=False, host=host, sequence_parallel=True,
                       framework="megatron") == pytest.approx(2e-3 + 10 * 3e-5)


@pytest.mark.parametrize("backend", ["deepspeed", "megatron"])
def test_planner_and_simulator_charge_the_same_sequence_parallel_collectives(backend):
    s = spec(backend=backend, sp=True, zero=0)
    e = estimate(s, pp=2, dp=1, tmp=2, mbs=2, partition="uniform")
    model = CostModel(s)
    c = Candidate.of(e.strategy)
    layout = model.layout(c, placement=np.array(e.strategy.placement))
    costs = model.stage_costs(c, layout)
    t = pass_times(model, c, layout, costs, e.strategy.partition)
    np.testing.assert_allclose(t.tensor_parallel_s,
                               pipeline.stage_totals(costs.tensor_parallel_s, e.strategy.partition),
                               rtol=1e-12)
    plain = estimate(spec(backend=backend, sp=False, zero=0), pp=2, dp=1, tmp=2, mbs=2,
                     partition="uniform")
    assert e.breakdown.tensor_parallel_s > plain.breakdown.tensor_parallel_s


def test_sequence_parallel_uses_the_measured_all_gather_and_reduce_scatter():
    """cpu-local ships a gloo profile whose all-gather and reduce-scatter have their own fits
    (slower per byte than its all-reduce): the sequence-parallel term takes them."""
    from amp_search.measurements import load_measurements
    from amp_search.resources import profiles_dir
    from amp_search.spec import load_spec
    from conftest import ROOT

    s = load_spec(ROOT / "configs" / "cpu-local.yaml")
    meas = load_measurements(s, profiles_dir())
    fits = meas.link_fits
    if ("all_gather", "intra") not in fits or ("reduce_scatter", "intra") not in fits:
        pytest.skip("no all-gather / reduce-scatter fit in the shipped gloo profile")
    kw = dict(pp=1, dp=1, tmp=2, mbs=2, zero_stage=0)
    with_fits = estimate(s, **kw, sequence_parallel=True, measurements=meas)
    ar = fits[("all_reduce", "intra")]
    only_ar = replace(meas, link_fits={k: v for k, v in fits.items()
                                       if k[0] in ("all_reduce", "p2p")})
    without = estimate(s, **kw, sequence_parallel=True, measurements=only_ar)
    # gloo's all-gather and reduce-scatter move fewer bytes per second than its all-reduce
    assert fits[("all_gather", "intra")].bandwidth_bytes_per_s < ar.bandwidth_bytes_per_s
    assert with_fits.breakdown.tensor_parallel_s > without.breakdown.tensor_parallel_s
    # without sequence parallelism nothing changes: all-reduces only
    assert estimate(s, **kw, measurements=meas).iteration_time_s == pytest.approx(
        estimate(s, **kw, measurements=only_ar).iteration_time_s, rel=1e-12)


def test_simulator_plays_the_distributed_optimizers_collectives():
    """Megatron bf16: the gradient buffer (fp32) is reduce-scattered, the bf16 weights are
    all-gathered after the step; ZeRO 0: one all-reduce, nothing gathered."""
    from amp_search.simulate import simulation_inputs

    s = spec(precision="bf16", zero=1)
    model = CostModel(s)
    e = estimate(s, pp=1, dp=4, tmp=1, mbs=1)
    k = simulation_inputs(model, e.strategy)
    P_ = sum(param_count(x, 1) for x in s.model.layers)
    assert k["gradient_collective"] == "reduce_scatter"
    np.testing.assert_allclose(k["gradient_bytes"], [4.0 * P_])
    np.testing.assert_allclose(k["gather_bytes_after_step"], [2.0 * P_])
    e0 = estimate(s, pp=1, dp=4, tmp=1, mbs=1, zero_stage=0)
    k0 = simulation_inputs(model, e0.strategy)
    assert k0["gradient_collective"] == "all_reduce" and k0["gather_bytes_after_step"] is None
