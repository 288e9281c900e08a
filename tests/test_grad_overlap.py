"""training.overlap_grad_reduce: the data-parallel gradient reduction in buckets during the
backward (Megatron-LM's --overlap-grad-reduce, DeepSpeed's overlap_comm), in the closed form
(cost_models.pipeline.exposed_sync_s), the simulator (1F1B and interleaved), the lower bounds
of the search and the configs a trial or an export writes."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from amp_search import estimate, plan
from amp_search.planner import (BOUND_ABOVE, SearchSpace, device_orders,
                                 enumerate_candidates)
from amp_search.costing.cost_model import CostModel
from amp_search.launch.megatron import megatron_args
from amp_search.search_space import Candidate
from amp_search.spec import SpecError, parse_spec
from amp_search.trial.config import ds_config
from cost_models import comm, pipeline


def _spec(overlap=None, *, backend="megatron", zero=1, nodes=2, gbs=64, layers=8) -> dict:
    training = {"global_batch_size": gbs, "precision": "bf16", "backend": backend,
                "zero_stage": zero, "activation_checkpointing": "none",
                "sequence_parallel": False}
    if overlap is not None:
        training["overlap_grad_reduce"] = overlap
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": nodes, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "100 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": layers, "hidden_size": 4096,
                      "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 51200},
            "training": training}


def test_the_key_and_its_default_per_backend():
    assert parse_spec(_spec()).training.overlap_grad_reduce is None
    meg = parse_spec(_spec()).training
    assert not meg.overlaps_grad_reduce(1)              # Megatron-LM: off unless asked
    assert parse_spec(_spec(True)).training.overlaps_grad_reduce(1)
    ds = parse_spec(_spec(backend="deepspeed", zero="search")).training
    assert [ds.overlaps_grad_reduce(z) for z in range(4)] == [False, False, False, True]
    forced = parse_spec(_spec(True, backend="deepspeed")).training
    assert not forced.overlaps_grad_reduce(0)           # DeepSpeed never overlaps ZeRO 0
    with pytest.raises(SpecError, match=r"training\.overlap_grad_reduce: got 'yes'; "
                                        r"accepted: true, false, default"):
        parse_spec(_spec("yes"))


def test_buckets_are_the_frameworks_defaults():
    assert comm.gradient_bucket_elements("megatron", 8) == 40_000_000
    assert comm.gradient_bucket_elements("megatron", 128) == 128_000_000
    assert comm.gradient_bucket_elements("deepspeed", 128) == 500_000_000


def _costs(reduce_s, window_s, elements, bucket, sync_extra=0.0):
    """One stage of one layer: sync = reduce + sync_extra (a gather after the step)."""
    pp, L = 1, 1
    z = np.zeros((pp, L))
    return pipeline.StageCostArrays(
        layer_s=z + 1.0, tensor_parallel_s=z, cut_s=np.zeros((pp, L + 1)),
        sync_s=z + reduce_s + sync_extra, sync_fixed_s=np.zeros(pp), optimizer_s=z,
        microbatch_overhead_s=0.0, step_overhead_s=0.0,
        gradient_overlap=pipeline.GradientOverlap(
            reduce_s=z + reduce_s, reduce_fixed_s=np.zeros(pp), backward_s=z + window_s,
            elements=np.array([elements]), bucket_elements=bucket))


@pytest.mark.parametrize("reduce_s, window_s, elements, bucket, exposed", [
    (1.0, 5.0, 100, 100, 1.0),          # one bucket: nothing to overlap it with
    (1.0, 5.0, 100, 400, 1.0),          # the bucket is larger than the gradients
    (1.0, 5.0, 100, 10, 0.1),           # a long backward: only the last bucket is left
    (4.0, 1.0, 100, 10, 4.0 - 0.9),     # a short one: all of it less the window after b_1
])
def test_the_exposed_sync_is_the_last_bucket_or_what_the_window_cannot_hold(
        reduce_s, window_s, elements, bucket, exposed):
    costs = _costs(reduce_s, window_s, elements, bucket, sync_extra=0.5)
    totals = lambda x: pipeline.stage_totals(x, (0, 1))       # noqa: E731
    got = pipeline.exposed_sync_s(costs, totals)
    assert got[0] == pytest.approx(0.5 + exposed)               # the gather stays whole
    assert pipeline.one_f_one_b_iteration_s(costs, (0, 1), 1, blocking_share=0.0) \
        == pytest.approx(1.0 + 0.5 + exposed)


def _pair(strategy: dict, **spec_kw):
    off = estimate(parse_spec(_spec(False, **spec_kw)), **strategy, simulate=True)
    on = estimate(parse_spec(_spec(True, **spec_kw)), **strategy, simulate=True)
    return off, on


@pytest.mark.parametrize("strategy", [dict(pp=1, dp=16, tmp=1, mbs=1),
                                      dict(pp=2, dp=8, tmp=1, mbs=1),
                                      dict(pp=2, dp=4, tmp=2, mbs=1, virtual_stages=2)])
def test_closed_form_and_simulation_hide_the_same_share(strategy):
    """Megatron's distributed optimizer across two nodes of 100 Gbps: overlapping the
    reduce-scatter with the backward shortens the iteration by the same amount in the closed
    form and in the event simulation (1F1B and interleaved)."""
    off, on = _pair(strategy)
    closed = off.iteration_time_s - on.iteration_time_s
    simulated = off.simulation.iteration_time_s - on.simulation.iteration_time_s
    assert closed > 0.02 * off.breakdown.data_parallel_s
    assert simulated == pytest.approx(closed, rel=0.1)
    assert on.breakdown.data_parallel_s < off.breakdown.data_parallel_s


def test_the_search_keeps_the_same_plans_as_costing_every_candidate():
    """The branch and bound's lower bounds count an overlapped reduction as if it hid
    entirely, so they stay below every time the closed form gives."""
    raw = _spec(True, nodes=4, gbs=128, layers=16)
    raw["training"]["activation_checkpointing"] = "search"
    spec = parse_spec(raw)
    placements = len(enumerate_candidates(SearchSpace.of(spec, None), Counter())) \
        * len(device_orders(spec.cluster, "bf16"))
    assert placements > BOUND_ABOVE                 # searched by branch and bound
    bounded = plan(spec, simulate_top=0)
    every = plan(spec, simulate_top=0, keep=None)
    assert bounded.best.strategy == every.best.strategy
    assert bounded.best.iteration_time_s == every.best.iteration_time_s
    model = CostModel(spec)
    for e in every.strategies[:20]:
        c = Candidate.of(e.strategy)
        assert model.lower_bound_s(c) <= e.iteration_time_s * (1 + 1e-9)


def test_trial_and_export_configs_say_it():
    s = estimate(parse_spec(_spec(True)), pp=2, dp=8, tmp=1, mbs=1).strategy
    layers = parse_spec(_spec(True)).model.layers
    assert "--overlap-grad-reduce" in megatron_args(layers, s, precision="bf16", iters=2,
                                                    overlap_grad_reduce=True)
    assert "--overlap-grad-reduce" not in megatron_args(layers, s, precision="bf16", iters=2)
    ds = estimate(parse_spec(_spec(True, backend="deepspeed")), pp=2, dp=8, tmp=1,
                  mbs=1).strategy
    assert ds_config(ds, precision="bf16", overlap_comm=True)["zero_optimization"] == \
        {"stage": 1, "overlap_comm": True}
    assert ds_config(ds, precision="bf16")["zero_optimization"] == {"stage": 1}


def test_deepspeed_zero1_hides_its_reduce_scatter_only_and_never_in_a_pipeline():
    """DeepSpeed's ZeRO 1 all-reduce volume is a reduce-scatter then the weights' all-gather
    (as the simulator plays it): only the reduce-scatter can hide. Its PipelineEngine reduces
    at the accumulation boundary, after the backward, so pp > 1 overlaps nothing."""
    kw = dict(grad_bytes=1e9, n=8, bandwidth_bytes_per_s=1e10, latency_s=1e-5, gas=4)
    assert comm.gradient_reduce_time_s(zero_stage=1, **kw) == pytest.approx(
        comm.reduce_scatter_time_s(1e9, 8, 1e10, 1e-5))
    model = CostModel(parse_spec(_spec(True, backend="deepspeed")))
    one = Candidate.make(pp=1, dp=16, tmp=1, mbs=1, zero_stage=1, recompute="none")
    two = Candidate.make(pp=2, dp=8, tmp=1, mbs=1, zero_stage=1, recompute="none")
    assert model.overlaps_grad_reduce(one) and not model.overlaps_grad_reduce(two)
