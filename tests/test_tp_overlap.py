"""training.tp_comm_overlap: Megatron-LM's --tp-comm-overlap (Transformer Engine's
userbuffers), the tensor-parallel all-gathers and reduce-scatters of sequence parallelism
run in chunks beside the GEMMs they feed or follow (cost_models.compute.tp_overlap_exposed_s),
in the closed form, the simulator, the search's bounds and the exported arguments."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from amp_search import estimate, plan
from amp_search.costing.cost_model import CostModel
from amp_search.launch.megatron import megatron_args
from amp_search.planner import BOUND_ABOVE, SearchSpace, device_orders, enumerate_candidates
from amp_search.search_space import Candidate
from amp_search.spec import SpecError, parse_spec, spec_fingerprint
from cost_models.compute import tp_overlap_exposed_s


def _spec(overlap=True, *, backend="megatron", layers=8, nodes=1, gbs=32) -> dict:
    training = {"global_batch_size": gbs, "precision": "bf16", "backend": backend,
                "zero_stage": 1, "activation_checkpointing": "none",
                "sequence_parallel": "search"}
    if overlap is not None:
        training["tp_comm_overlap"] = overlap
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": nodes, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "100 GB/s",
                                   "inter_node_bandwidth": "400 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": layers, "hidden_size": 8192,
                      "num_attention_heads": 64, "seq_length": 4096, "vocab_size": 51200},
            "training": training}


@pytest.mark.parametrize("comm, gemm, t, exposed", [
    (1.0, 10.0, 4, 0.25),               # the GEMMs outlast it: the first chunk's transfer
    (8.0, 2.0, 4, 8.0 - 1.5),           # it outlasts the GEMMs beside the other chunks
    (0.0, 5.0, 8, 0.0),
])
def test_exposed_is_the_first_chunk_or_what_outlasts_the_gemms(comm, gemm, t, exposed):
    assert tp_overlap_exposed_s(comm, gemm, t) == pytest.approx(exposed)


def test_the_key():
    assert parse_spec(_spec(None)).training.tp_comm_overlap is False
    assert parse_spec(_spec(True)).training.tp_comm_overlap is True
    with pytest.raises(SpecError, match=r"training\.tp_comm_overlap: got 'yes'; accepted: "
                                        r"true, false"):
        parse_spec(_spec("yes"))
    with pytest.raises(SpecError, match=r"training\.tp_comm_overlap: Megatron-LM's "
                                        r"--tp-comm-overlap .* accepted with backend megatron"):
        parse_spec(_spec(True, backend="deepspeed"))
    # no backend named: both are planned, the DeepSpeed plans without the overlap
    raw = _spec(True)
    del raw["training"]["backend"]
    both = parse_spec(raw)
    assert {t.backend for t in (both.training, *both.other_backends)} == {"deepspeed",
                                                                          "megatron"}
    # absent and false cost the same plan (only the hash of the text written differs)
    absent, false = (spec_fingerprint(parse_spec(_spec(v))) for v in (None, False))
    assert {k: v for k, v in absent.items() if k != "spec_sha256"} == \
        {k: v for k, v in false.items() if k != "spec_sha256"}


def test_each_pass_hides_its_collectives_behind_its_own_gemms():
    on, off = CostModel(parse_spec(_spec(True))), CostModel(parse_spec(_spec(False)))
    c = Candidate.make(pp=1, dp=1, tmp=8, mbs=1, zero_stage=1, recompute="none",
                       sequence_parallel=True)
    layout = on.layout(c, placement=np.arange(8).reshape(1, 1, 8))
    assert on.overlaps_tp_comm(c) and not off.overlaps_tp_comm(c)
    whole = sum(tp_overlap_exposed_s(off.tp_time_s(c, layout, part=k),
                                     on._tp_window_s(c, layout, k), 8) for k in (0, 1))
    assert on.tp_time_s(c, layout) == pytest.approx(whole)
    assert np.all(on.tp_time_s(c, layout) <= off.tp_time_s(c, layout) + 1e-15)
    assert on.tp_time_s(c, layout).sum() < off.tp_time_s(c, layout).sum()
    gemm = on.timer.gemm_forward_s(on.gpus[0], 8, 1)
    assert on._tp_window_s(c, layout, 1)[0] == pytest.approx(2 * gemm)
    # without sequence parallelism the all-reduces stay exposed
    no_sp = Candidate.make(pp=1, dp=1, tmp=8, mbs=1, zero_stage=1, recompute="none",
                           sequence_parallel=False)
    assert not on.overlaps_tp_comm(no_sp)
    assert np.array_equal(on.tp_time_s(no_sp, layout), off.tp_time_s(no_sp, layout))


@pytest.mark.parametrize("strategy", [dict(pp=2, dp=1, tmp=4, mbs=1),
                                      dict(pp=2, dp=1, tmp=4, mbs=1, virtual_stages=2)])
def test_closed_form_and_simulation_agree(strategy):
    kw = dict(strategy, sequence_parallel=True, simulate=True)
    off = estimate(parse_spec(_spec(False)), **kw)
    on = estimate(parse_spec(_spec(True)), **kw)
    closed = off.iteration_time_s - on.iteration_time_s
    simulated = off.simulation.iteration_time_s - on.simulation.iteration_time_s
    assert closed > 0.1 * off.breakdown.tensor_parallel_s
    assert simulated == pytest.approx(closed, rel=0.05)
    assert on.breakdown.tensor_parallel_s < off.breakdown.tensor_parallel_s


def test_the_search_keeps_the_same_best_as_costing_every_candidate():
    spec = parse_spec(_spec(True, layers=32, nodes=4, gbs=128))
    placements = len(enumerate_candidates(SearchSpace.of(spec, None), Counter())) \
        * len(device_orders(spec.cluster, "bf16"))
    assert placements > BOUND_ABOVE
    bounded, every = plan(spec, simulate_top=0), plan(spec, simulate_top=0, keep=None)
    assert bounded.best.strategy == every.best.strategy
    model = CostModel(spec)
    for e in every.strategies[:20]:
        assert model.lower_bound_s(Candidate.of(e.strategy)) <= e.iteration_time_s * (1 + 1e-9)


def test_the_arguments_ask_for_it_on_transformer_engine():
    spec = parse_spec(_spec(True))
    s = estimate(spec, pp=1, dp=1, tmp=8, mbs=1, sequence_parallel=True).strategy
    args = megatron_args(spec.model.layers, s, precision="bf16", iters=2, tp_comm_overlap=True)
    assert "--tp-comm-overlap" in args
    assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
    plain = megatron_args(spec.model.layers, s, precision="bf16", iters=2)
    assert "--tp-comm-overlap" not in plain
    assert plain[plain.index("--transformer-impl") + 1] == "local"
    no_sp = estimate(spec, pp=1, dp=1, tmp=8, mbs=1, sequence_parallel=False).strategy
    assert "--tp-comm-overlap" not in megatron_args(spec.model.layers, no_sp,
                                                    precision="bf16", iters=2,
                                                    tp_comm_overlap=True)
