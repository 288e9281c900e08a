"""Interleaved 1F1B with virtual pipeline stages (Narayanan et al., SC'21, section 2.2.2):
the closed form against hand-computed values and the event simulator, the in-flight memory
against the schedule, the search space's rules, the spec key and the Strategy's JSON, the
planner picking it where it wins, and the exports (Megatron's flag; DeepSpeed refuses)."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from amp_search.cli import main
from amp_search.errors import Infeasible, SpecError, UsageError
from amp_search.export import export_strategy
from amp_search.launch.orchestrator import preflight
from amp_search.planner import estimate, plan
from amp_search.records import Strategy
from amp_search.search_space import (Candidate, Reason, SearchSpace, chunks_split_blocks,
                                     first_violation)
from amp_search.spec import VIRTUAL_STAGES_SEARCH, VIRTUAL_STAGES_SEARCH_MOST, parse_spec
from cost_models import activations
from cost_models import pipeline
from cost_models.schedule import interleaved_in_flight, interleaved_order
from cost_models.simulator import simulate_interleaved


# ----------------------------------------------------------------------------- closed form

def test_bubble_fraction_by_hand():
    """(p - 1) / (v m): p = 4, m = 8 is 3/8 plain, 3/16 with v = 2, 3/32 with v = 4."""
    assert pipeline.interleaved_bubble_fraction(4, 8, 1) == pytest.approx(3 / 8)
    assert pipeline.interleaved_bubble_fraction(4, 8, 2) == pytest.approx(3 / 16)
    assert pipeline.interleaved_bubble_fraction(4, 8, 4) == pytest.approx(3 / 32)
    with pytest.raises(ValueError):
        pipeline.interleaved_bubble_fraction(4, 8, 0)


def test_closed_form_by_hand():
    """p = 4, m = 8, v = 2, each device 6 s per micro-batch (two chunks of 1 s forward + 2 s
    backward), free P2P: ideal 8 x 6 = 48 s, bubble 3 x 6 / 2 = 9 s (3/16 of 48): 57 s,
    against plain 1F1B's (8 + 3) x 6 = 66 s."""
    t = np.full(4, 6.0)
    assert pipeline.interleaved_1f1b_time_s(t, np.zeros(3), 8, 2) == pytest.approx(57.0)
    assert pipeline.interleaved_1f1b_time_s(t, np.zeros(3), 8, 1) == pytest.approx(66.0)
    assert (57.0 - 48.0) / 48.0 == pytest.approx(pipeline.interleaved_bubble_fraction(4, 8, 2))


def test_closed_form_p2p_by_hand():
    """P2P multiplied by v: t = 6 on 4 devices, e = 1 at each boundary and the wrap-around,
    v = 2, Megatron's share 0.5. Middle devices wait 0.5 (2 e + 2 e) = 2 per micro-batch, the
    end devices 0.5 (2 e + (v - 1) e) = 1.5 (the wrap is crossed v - 1 times): period 8;
    the first micro-batch's forward and the last one's backward cross every one of the
    v pp - 1 chunk boundaries, 2 x 3 e + 1 wrap = 7: T = 7 x 8 + 6 + 18 / 2 + 7 = 78."""
    t, e = np.full(4, 6.0), np.ones(3)
    assert pipeline.interleaved_steady_state_period_s(t, e, 2, blocking_share=0.5,
                                               wrap_time_s=1.0) == pytest.approx(8.0)
    assert pipeline.interleaved_1f1b_time_s(t, e, 8, 2, blocking_share=0.5,
                                     wrap_time_s=1.0) == pytest.approx(78.0)


def test_overlapped_p2p_by_hand():
    """Megatron-LM's default for the interleaved schedule (overlap_p2p_comm): the steady
    state waits for no P2P while each link keeps up, period max t = 6: T = 7 x 6 + 6 + 18 / 2
    + 7 = 64; with e = 8 a link carries v e / 2 = 8 each way per micro-batch, more than the
    compute: period 8, T = 7 x 8 + 6 + 9 + 8 x 7 = 127."""
    t, e = np.full(4, 6.0), np.ones(3)
    assert pipeline.INTERLEAVED_BLOCKING_SHARE == 0.0
    assert pipeline.interleaved_1f1b_time_s(t, e, 8, 2, wrap_time_s=1.0) == pytest.approx(64.0)
    assert pipeline.interleaved_steady_state_period_s(
        t, 8 * e, 2, blocking_share=0.0, wrap_time_s=8.0) == pytest.approx(8.0)
    assert pipeline.interleaved_1f1b_time_s(t, 8 * e, 8, 2, wrap_time_s=8.0) == \
        pytest.approx(127.0)


def test_v1_is_plain_1f1b():
    rng = np.random.default_rng(3)
    for _ in range(20):
        pp = int(rng.integers(1, 6))
        t, e = rng.uniform(0.1, 2.0, pp), rng.uniform(0, 0.3, pp - 1)
        gas = int(rng.integers(1, 20))
        for share in (0.0, 0.5, 1.0):
            assert pipeline.interleaved_1f1b_time_s(t, e, gas, 1, blocking_share=share) == \
                pipeline.pipeline_1f1b_time_s(t, e, gas, blocking_share=share)


def test_chunk_totals_and_boundaries():
    """Chunk k on stage k mod pp: pp = 2, v = 2, 6 layers in chunks [0,2) [2,3) [3,5) [5,6)."""
    per_layer = np.array([[1.0, 2, 3, 4, 5, 6], [10, 20, 30, 40, 50, 60]])
    b = (0, 2, 3, 5, 6)
    assert pipeline.chunk_device_totals(per_layer, b, 2).tolist() == [1 + 2 + 4 + 5, 30 + 60]
    assert pipeline.chunk_device_totals(per_layer, (0, 3, 6), 2).tolist() == \
        pipeline.stage_totals(per_layer, (0, 3, 6)).tolist()
    cut = np.arange(14, dtype=float).reshape(2, 7)      # cut[j, i]
    e, wrap = pipeline.chunk_boundary_times(cut, b, 2)
    assert e.tolist() == [max(cut[1, 2], cut[1, 5])]     # chunks 1 and 3 start on stage 1
    assert wrap == cut[1, 3]                             # chunk 2 starts on stage 0


# ----------------------------------------------------------------------------- simulator

def test_megatron_order():
    """Megatron-LM's order for p = 4, v = 2, m = 8 on device 0: 2 (p-1) + (v-1) p = 10
    warm-up forwards in groups of p micro-batches per chunk, then 1F1B; backwards start at
    the last chunk."""
    kinds, micro, chunk = interleaved_order(4, 2, 8)
    assert kinds.shape == (4, 32)
    assert micro[0, :10].tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 4, 5]
    assert chunk[0, :10].tolist() == [0, 0, 0, 0, 1, 1, 1, 1, 0, 0]
    assert kinds[0, :12].tolist() == [0] * 11 + [2]
    assert (micro[0, 11], chunk[0, 11]) == (0, 1)          # first backward: mb 0, last chunk
    assert kinds[3, :5].tolist() == [0, 0, 0, 0, 0] and kinds[3, 5] == 2   # (v-1) p = 4
    for j in range(4):                  # every (chunk, micro-batch) once forward, once back
        for k in (0, 2):
            sel = kinds[j] == k
            assert sorted(zip(chunk[j][sel], micro[j][sel])) == \
                sorted(itertools.product(range(2), range(8)))
    with pytest.raises(ValueError, match="multiple of pp"):
        interleaved_order(4, 2, 6)


@pytest.mark.parametrize("pp, v, gas", [(4, 2, 8), (4, 2, 4), (2, 3, 6), (3, 4, 12),
                                         (8, 2, 8), (4, 1, 8)])
def test_order_is_megatron_cores(pp, v, gas):
    """The order against megatron-core's own tables (get_schedule_table, get_pp_rank_
    microbatches), replayed as forward_backward_pipelining_with_interleaving runs them:
    warm-up forwards, then forward w + i and backward i, then the cool-down backwards; a
    backward of virtual micro-batch k runs chunk v - 1 - table chunk."""
    pytest.importorskip("torch")
    schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    from types import SimpleNamespace

    table = schedules.get_schedule_table(gas, v, pp)
    kinds, micro, chunk = interleaved_order(pp, v, gas)
    for j in range(pp):
        comm = SimpleNamespace(pp_group=SimpleNamespace(size=lambda: pp, rank=lambda j=j: j),
                               virtual_pipeline_model_parallel_size=v)
        total, _, w, rest = schedules.get_pp_rank_microbatches(gas, v, pp,
                                                               p2p_communicator=comm)
        f = [(0, table[k][0], table[k][1]) for k in range(total)]
        b = [(2, table[k][0], v - 1 - table[k][1]) for k in range(total)]
        order = f[:w] + [x for i in range(rest) for x in (f[w + i], b[i])] + b[rest:]
        assert list(zip(kinds[j].tolist(), micro[j].tolist(), chunk[j].tolist())) == order


@pytest.mark.parametrize("pp, v, gas, f, b", [
    (4, 2, 8, 1.0, 2.0), (2, 2, 2, 1.0, 1.0), (4, 3, 4, 1.0, 2.0), (3, 2, 9, 0.5, 1.7),
    (8, 4, 16, 1.0, 3.0), (4, 4, 12, 0.3, 0.9), (4, 1, 8, 1.0, 2.0)])
def test_simulation_equals_closed_form_with_free_links(pp, v, gas, f, b):
    """Uniform chunks, free P2P: the simulated makespan is (m + (p-1)/v) v (f + b) exactly."""
    sim = simulate_interleaved(forward_s=np.full((pp, v), f), backward_s=np.full((pp, v), b),
                               optimizer_s=np.zeros(pp), gas=gas)
    closed = pipeline.interleaved_1f1b_time_s(np.full(pp, v * (f + b)), np.zeros(pp - 1), gas, v)
    assert sim.makespan_s == pytest.approx(closed, rel=1e-12)
    assert closed == pytest.approx((gas + (pp - 1) / v) * v * (f + b), rel=1e-12)


def test_simulation_python_twin_and_optimizer():
    kw = dict(forward_s=np.full((3, 2), 1.0), backward_s=np.full((3, 2), 2.0),
              optimizer_s=np.array([0.5, 0.25, 0.75]), gas=6, step_overhead_s=0.125)
    a = simulate_interleaved(**kw)
    c = simulate_interleaved(**kw, use_numba=False)
    assert a.iteration_time_s == pytest.approx(c.iteration_time_s)
    # the last backward of device 0 (chunk 0) ends the pipeline: (6 + 2/2) x 6 = 42
    assert a.stage_end_s[0] == pytest.approx(42.0 + 0.5)
    assert a.iteration_time_s == pytest.approx(max(a.stage_end_s) + 0.125)


def test_simulated_p2p_slows_it_down():
    """Transfers of 1 s each way on every one of the v pp - 1 chunk boundaries (the
    wrap-around from the last device to the first included): slower than free links."""
    pp, v, gas = 4, 2, 8
    free = simulate_interleaved(forward_s=np.ones((pp, v)), backward_s=np.full((pp, v), 2.0),
                                optimizer_s=np.zeros(pp), gas=gas).makespan_s
    slow = simulate_interleaved(forward_s=np.ones((pp, v)), backward_s=np.full((pp, v), 2.0),
                                optimizer_s=np.zeros(pp), gas=gas,
                                p2p_bytes=np.full(pp * v - 1, 1.0),
                                p2p_bandwidth_bytes_per_s=np.ones(pp)).makespan_s
    assert slow > free


# ----------------------------------------------------------------------------- memory

@pytest.mark.parametrize("pp, v, gas", [(4, 2, 8), (4, 4, 8), (8, 2, 16), (4, 2, 4), (3, 3, 6)])
def test_in_flight_count_matches_the_schedule_and_the_simulation(pp, v, gas):
    kinds, _, chunk = interleaved_order(pp, v, gas)
    held = interleaved_in_flight(kinds, chunk, v)
    sim = simulate_interleaved(forward_s=np.full((pp, v), 1.0),
                               backward_s=np.full((pp, v), 2.0), optimizer_s=np.zeros(pp),
                               gas=gas)
    t = sim.table
    for j in range(pp):
        expect = activations.interleaved_in_flight_chunks(j, pp, v, gas)
        assert held[j].sum() == expect
        # from the simulated timeline: forwards started minus backwards ended, at its peak
        mine = t.stage == j
        fs = np.sort(t.start_s[mine & (t.kind == 0)])
        be = np.sort(t.end_s[mine & (t.kind == 2)])
        peak = max(int((fs <= x).sum() - (be <= x).sum()) for x in fs)
        assert peak == expect
    if gas > pp:   # Korthikanti et al.: the first stage holds p (1 + (p-1)/(p v)) micro-batches
        assert activations.interleaved_in_flight_chunks(0, pp, v, gas) / v == \
            pytest.approx(pp * (1 + (pp - 1) / (pp * v)))


def test_saved_activations_per_chunk():
    """Equal chunks: the count times one chunk's bytes; device 0 of p = 4, v = 2, m = 8 holds
    7 micro-batches of chunk 0 and 4 of chunk 1 at its peak."""
    assert activations.interleaved_saved_activation_bytes([100, 100], stage=0, pp=4, gas=8) == 1100
    assert activations.interleaved_saved_activation_bytes([10, 1000], stage=0, pp=4, gas=8) == \
        7 * 10 + 4 * 1000


# ----------------------------------------------------------------------------- spec, rules

def _spec(layers=8, gbs=8, devices=4, vps=None, per_node=None, backend="megatron"):
    """Megatron by default: only its backend runs the interleaved schedule."""
    training = {"global_batch_size": gbs, "precision": "fp32",
                "activation_checkpointing": "none", "backend": backend}
    if vps is not None:
        training["virtual_pipeline_stages"] = vps
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "CPU-local", "count": 1,
                               "gpus_per_node": per_node or devices,
                               "intra_node_bandwidth": "10 GB/s",
                               "inter_node_bandwidth": "10 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": layers, "hidden_size": 256,
                  "num_attention_heads": 4, "seq_length": 64, "vocab_size": 1024},
        "training": training})


def test_spec_key():
    # searched by default where the backend has the schedule (Megatron-LM), not by DeepSpeed
    # `search`: the v that split the 8 blocks (10 layers with the embedding and the head)
    # evenly on some pipeline: 2 and 4 (blocks), 5 (2 x 5 chunks of every layer alike)
    assert _spec().training.virtual_pipeline_stages == (1, 2, 4, 5)
    assert _spec(backend="deepspeed").training.virtual_pipeline_stages == (1,)
    assert _spec(vps=2).training.virtual_pipeline_stages == (2,)
    assert _spec(vps="search").training.virtual_pipeline_stages == (1, 2, 4, 5)
    assert VIRTUAL_STAGES_SEARCH == ()      # only until the model is known
    for bad in (0, -1, "two", True, 1.5, 65):
        with pytest.raises(SpecError) as err:
            _spec(vps=bad)
        assert "training.virtual_pipeline_stages" in str(err.value)
        assert "accepted" in str(err.value) and "search" in str(err.value)


@pytest.mark.parametrize("layers, expected", [(8, (1, 2, 4, 5)), (24, (1, 2, 3, 4, 6, 8)),
                                              (80, (1, 2, 4, 5, 8)), (94, (1, 2, 3, 4, 6, 8)),
                                              (126, (1, 2, 3, 4, 6, 7, 8))])
def test_searched_virtual_stages_are_those_some_pipeline_splits(layers, expected):
    """`search` holds exactly the v up to VIRTUAL_STAGES_SEARCH_MOST that the search space's
    rule lets through on some pp >= 2: Llama 3 70B's 80 blocks give 5 (on 4 stages) and no
    3 or 6; Llama 3.1 405B's 126 give 7 (on 18 stages, the embedding and head counted)."""
    spec = _spec(layers=layers, vps="search")
    space = SearchSpace.of(spec)
    searched = spec.training.virtual_pipeline_stages
    assert searched == expected
    for v in range(2, VIRTUAL_STAGES_SEARCH_MOST + 1):
        splits = any(chunks_split_blocks(space, Candidate.make(
            pp=pp, dp=1, tmp=1, mbs=1, zero_stage=0, recompute="none", virtual_stages=v))
            is None for pp in range(2, spec.model.num_layers + 1))
        assert (v in searched) == splits, v


def _violation(space, **kw):
    base = dict(pp=4, dp=1, tmp=1, mbs=1, zero_stage=0, recompute="none")
    v = first_violation(space, Candidate.make(**{**base, **kw}))
    return None if v is None else v.reason


def test_rules():
    space = SearchSpace.of(_spec(layers=8, gbs=8))      # 8 blocks, 8 micro-batches at mbs 1
    assert _violation(space, virtual_stages=2) is None
    assert _violation(space, pp=1, dp=4, virtual_stages=2) == \
        Reason.VIRTUAL_STAGES_WITHOUT_PIPELINE
    assert _violation(space, mbs=4, virtual_stages=2) == \
        Reason.MICROBATCHES_NOT_MULTIPLE_OF_PP                    # 2 micro-batches, pp 4
    assert _violation(space, virtual_stages=3) == Reason.BLOCKS_NOT_DIVISIBLE_BY_CHUNKS
    assert _violation(space, virtual_stages=4) == Reason.BLOCKS_NOT_DIVISIBLE_BY_CHUNKS
    assert _violation(SearchSpace.of(_spec(), "deepspeed"), virtual_stages=2) == \
        Reason.INTERLEAVED_UNDER_DEEPSPEED
    assert _violation(SearchSpace.of(_spec(), "megatron"), virtual_stages=2) is None
    # Megatron-Core asserts pp > 1 (Megatron-LM v0.7 asked for pp > 2; with P2P overlap,
    # the default of newer versions, pp 2 runs): pp 2 interleaves
    assert _violation(SearchSpace.of(_spec(), "megatron"), pp=2, dp=2, virtual_stages=2) is None
    assert _violation(SearchSpace.of(_spec(), "megatron"), pp=1, dp=4, virtual_stages=2) == \
        Reason.VIRTUAL_STAGES_WITHOUT_PIPELINE
    assert _violation(space, mbs=4) is None               # v = 1: none of these apply
    # the spec's backend is the default: deepspeed, unless it says megatron
    assert _violation(SearchSpace.of(_spec(backend="deepspeed")), virtual_stages=2) == \
        Reason.INTERLEAVED_UNDER_DEEPSPEED


def test_estimate_errors_name_the_rule():
    spec = _spec()
    with pytest.raises(Infeasible) as err:
        estimate(spec, pp=4, dp=1, tmp=1, mbs=4, virtual_stages=2)
    assert "multiple of pp" in str(err.value)
    with pytest.raises(UsageError, match="--virtual-stages"):
        estimate(spec, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=0)


def test_strategy_json_round_trip():
    s = estimate(_spec(), pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2).strategy
    assert s.virtual_stages == 2 and s.label().endswith("-v2")
    d = json.loads(json.dumps(s.to_dict()))
    assert Strategy.from_dict(d) == s
    d.pop("virtual_stages")
    d["partition"] = [0, 3, 5, 7, 10]
    assert Strategy.from_dict(d).virtual_stages == 1      # older JSON still loads


# ----------------------------------------------------------------------------- planner

def test_planner_uses_megatrons_uniform_chunks():
    """8 blocks over v pp = 8 chunks of one block, the embedding with chunk 0 and the head
    with chunk 7; stage j runs chunks j and j + 4."""
    e = estimate(_spec(), pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2)
    s = e.strategy
    assert s.partition == (0, 2, 3, 4, 5, 6, 7, 8, 10)
    assert s.stage_layer_ranges(0) == ((0, 2), (5, 6))
    assert s.stage_layer_ranges(3) == ((4, 5), (8, 10))
    assert sorted(i for j in range(4) for i in s.stage_layers(j)) == list(range(10))
    with pytest.raises(UsageError, match="v\\*pp \\+ 1 = 9"):
        estimate(_spec(), pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2, partition=(0, 3, 5, 7, 10))


def test_interleaving_cuts_the_bubble_and_holds_more_activations():
    spec = _spec()
    plain = estimate(spec, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=1, partition="uniform")
    inter = estimate(spec, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2)
    # the same layers per stage in total: the bubble shrinks about by v (exact on equal
    # stages; the embedding and head make the stages unequal)
    assert inter.breakdown.pipeline_bubble_s < 0.6 * plain.breakdown.pipeline_bubble_s
    # Megatron-LM overlaps the interleaved steady state's P2P with the chunks
    # (overlap_p2p_comm, its default): only the fill and drain pay it, each of the v pp - 1
    # chunk boundaries once, where plain 1F1B pays its pp - 1 boundaries in every micro-batch
    assert plain.breakdown.p2p_s < inter.breakdown.p2p_s < 2 * plain.breakdown.p2p_s
    # stage 0 holds the activations of pp + (pp-1)/v = 5.5 micro-batches' worth, not 4
    assert inter.memory[0].activation_bytes > plain.memory[0].activation_bytes
    assert inter.memory[3].activation_bytes < inter.memory[0].activation_bytes


def test_breakdown_sums_to_the_closed_form():
    for v in (1, 2):
        e = estimate(_big_model_spec(v), pp=8, dp=1, tmp=1, mbs=1, virtual_stages=v)
        b = e.breakdown
        parts = (b.compute_s + b.pipeline_bubble_s + b.p2p_s + b.tensor_parallel_s
                 + b.data_parallel_s + b.optimizer_s)
        assert parts == pytest.approx(e.analytic_iteration_time_s, rel=1e-9)


def test_simulated_estimate_runs_the_interleaved_schedule():
    e = estimate(_spec(), pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2, simulate=True)
    assert e.simulated and e.simulation.schedule == "interleaved-1f1b-v2"
    assert e.iteration_time_s == pytest.approx(e.analytic_iteration_time_s, rel=0.1)


def _big_model_spec(vps="search"):
    """A 32-block GPT (~15 B parameters) on 8 single-GPU nodes and 8 samples per iteration:
    it needs a deep pipeline, and 8 micro-batches leave plain 1F1B a bubble of 7/8."""
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "A100-80GB", "count": 8, "gpus_per_node": 1,
                               "intra_node_bandwidth": "300 GB/s",
                               "inter_node_bandwidth": "100 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 32, "hidden_size": 6144,
                  "num_attention_heads": 48, "seq_length": 2048, "vocab_size": 51200},
        "training": {"global_batch_size": 8, "precision": "bf16",
                     "activation_checkpointing": "none", "zero_stage": 0,
                     "virtual_pipeline_stages": vps, "backend": "megatron"}})


def test_search_picks_interleaving_where_it_wins():
    spec = _big_model_spec()
    result = plan(spec, simulate_top=0)
    best = result.best.strategy
    assert best.virtual_stages > 1 and best.pp >= 4
    plain = estimate(spec, pp=best.pp, dp=best.dp, tmp=best.tmp, mbs=best.mbs,
                     virtual_stages=1)
    assert result.best.iteration_time_s < 0.9 * plain.iteration_time_s
    assert result.pruned.get(Reason.BLOCKS_NOT_DIVISIBLE_BY_CHUNKS.value, 0) > 0
    # the same search for the deepspeed backend cannot pick it, and says why
    ds = plan(spec, simulate_top=0, backend="deepspeed")
    assert all(e.strategy.virtual_stages == 1 for e in ds.strategies)
    assert ds.pruned[Reason.INTERLEAVED_UNDER_DEEPSPEED.value] > 0
    assert ds.best.iteration_time_s > result.best.iteration_time_s


# ----------------------------------------------------------------------------- exports, CLI

def test_megatron_export_has_the_flag_and_deepspeed_refuses(tmp_path):
    spec = _spec()
    e = estimate(spec, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2)
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e, iters=10, warmup=5)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    i = args.index("--num-layers-per-virtual-pipeline-stage")
    assert args[i + 1] == "1" and args[args.index("--num-layers") + 1] == "8"
    assert "--decoder-first-pipeline-num-layers" not in args
    assert ex.split["form"] == "interleaved"
    readme = next(f.text for f in ex.files if f.path == "README.md")
    assert "(`virtual_stages`): 2" in readme and "stage k mod 4" in readme
    with pytest.raises(UsageError) as err:
        export_strategy(spec, e.strategy, fmt="deepspeed", estimate=e)
    assert "no interleaved schedule" in str(err.value) and "\n" not in str(err.value)
    assert "interleaved" in preflight(spec, e.strategy, "deepspeed")
    assert preflight(spec, e.strategy, "megatron") == ""


def _four_stage_megatron(**training) -> dict:
    """A tiny GPT under Megatron-LM on 4 CPU devices of one node each, 1 Gb/s between them
    (P2P that shows), with `training`'s keys added."""
    return {"cluster": {"nodes": [{"gpu": "CPU-local", "count": 4, "gpus_per_node": 1,
                                   "intra_node_bandwidth": "10 GB/s",
                                   "inter_node_bandwidth": "1 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 256,
                      "num_attention_heads": 4, "seq_length": 64, "vocab_size": 1024},
            "training": {"global_batch_size": 16, "precision": "fp32",
                         "activation_checkpointing": "none", "backend": "megatron",
                         **training}}


def test_overlap_p2p_comm_off_waits_for_the_steady_states_p2p():
    """training.overlap_p2p_comm: false (--no-overlap-p2p-communication, Megatron-LM before
    megatron-core): the steady state waits for half of each boundary's exchange, as plain
    1F1B under Megatron-LM; the exports say so; DeepSpeed has no such schedule; the default's
    fingerprint is the one from before the key."""
    from amp_search.launch.megatron import megatron_args, training_kwargs
    from amp_search.spec import spec_fingerprint

    def spec(**t):
        return parse_spec(_four_stage_megatron(**t))

    on, off = spec(), spec(overlap_p2p_comm=False)
    assert on.training.overlap_p2p_comm and not off.training.overlap_p2p_comm
    def sections(x):          # the parsed sections' hashes (spec_sha256 is of the text)
        return {k: v for k, v in spec_fingerprint(x).items() if k != "spec_sha256"}

    assert sections(spec(overlap_p2p_comm=True)) == sections(on) != sections(off)
    a = estimate(on, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2)
    b = estimate(off, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=2)
    assert b.breakdown.p2p_s > a.breakdown.p2p_s > 0          # 1 Gb/s between the stages
    assert b.iteration_time_s - a.iteration_time_s == pytest.approx(
        b.breakdown.p2p_s - a.breakdown.p2p_s)
    plain_on = estimate(on, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=1)
    assert estimate(off, pp=4, dp=1, tmp=1, mbs=1, virtual_stages=1) == plain_on
    args = megatron_args(off.model.layers, b.strategy, precision="fp32", iters=1,
                         **training_kwargs(off.training, b.strategy))
    assert "--no-overlap-p2p-communication" in args
    assert "--no-overlap-p2p-communication" not in megatron_args(
        on.model.layers, a.strategy, precision="fp32", iters=1,
        **training_kwargs(on.training, a.strategy))
    from amp_search.cli.plan_header import header_lines

    text = " ".join(x.strip() for x in header_lines(off, plan(off, simulate_top=0), 200))
    assert "training.overlap_p2p_comm: false" in text
    assert "overlap_p2p_comm" not in " ".join(header_lines(on, plan(on, simulate_top=0), 200))
    # the simulator's interleaved run sends asynchronously: with the blocking P2P the plan
    # keeps the closed form for the strategies with chunks (and says why), simulates the rest
    from amp_search.simulate import simulatable, with_simulation

    from amp_search.costing import CostModel

    model = CostModel(off)
    assert "overlap_p2p_comm: false" in simulatable(b.strategy, off.training)
    left = with_simulation(model, b)
    assert left.time_source.startswith("analytic (the interleaved")
    assert left.not_simulated_because == simulatable(b.strategy, off.training)
    assert left.iteration_time_s == b.iteration_time_s
    assert simulatable(a.strategy, on.training) is None
    assert with_simulation(CostModel(on), a).simulated
    assert with_simulation(CostModel(on), a).not_simulated_because is None
    assert b.not_simulated_because is None         # the closed form, not asked to simulate
    assert with_simulation(model, estimate(off, pp=4, dp=1, tmp=1, mbs=1)).simulated
    ranked = plan(off).strategies
    assert {e.simulated for e in ranked[:32]} == {True, False}
    assert all(e.simulated == (e.strategy.virtual_stages == 1) for e in ranked[:32])
    with pytest.raises(SpecError) as err:
        spec(overlap_p2p_comm=False, backend="deepspeed")
    assert "training.overlap_p2p_comm" in str(err.value) and "backend megatron" in str(err.value)
    with pytest.raises(SpecError, match="accepted: true, false"):
        spec(overlap_p2p_comm="sometimes")


def test_cli_estimate_shows_v_and_errors_are_one_line(write_spec, tmp_path, capsys):
    path = write_spec({
        "cluster": {"nodes": [{"gpu": "CPU-local", "count": 1, "gpus_per_node": 4,
                               "intra_node_bandwidth": "10 GB/s",
                               "inter_node_bandwidth": "10 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 256,
                  "num_attention_heads": 4, "seq_length": 64, "vocab_size": 1024},
        "training": {"global_batch_size": 8, "precision": "fp32",
                     "activation_checkpointing": "none", "backend": "megatron"}})
    argv = ["estimate", str(path), "--pp", "4", "--dp", "1", "--tmp", "1", "--mbs", "1"]
    assert main(argv + ["--virtual-stages", "2", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    head = out.splitlines()[0].split()
    assert head[head.index("sp") + 1] == "v"
    assert "layers 0-1, 5 on" in out               # stage 0: chunks 0 and 4
    assert main(argv + ["--virtual-stages", "2", "--no-simulate", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["virtual_stages"] == 2
    assert main(argv + ["--virtual-stages", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "equal chunks" in err
    assert main(argv) == 0                          # v = 1: no v column
    assert " v " not in capsys.readouterr().out.splitlines()[0] + " "


def test_cli_plan_says_why_the_blocking_interleaved_rows_are_not_simulated(write_spec, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    path = write_spec(_four_stage_megatron(overlap_p2p_comm=False,
                                           virtual_pipeline_stages="search"))
    assert main(["plan", str(path), "--no-progress", "--top-k", "32", "--wide"]) == 0
    flat = " ".join(capsys.readouterr().out.split())
    assert "* the closed form, not simulated: the interleaved schedule's blocking P2P " \
           "(training.overlap_p2p_comm: false) is not simulated." in flat
    assert main(["plan", str(path), "--no-progress", "--json", "-"]) == 0
    rows = json.loads(capsys.readouterr().out)["strategies"]
    assert {r["time_source"].split(" (")[0] for r in rows
            if r["virtual_stages"] > 1} == {"analytic"}
    # one such strategy estimated: the reason alone, on its own line
    argv = ["estimate", str(path), "--pp", "4", "--dp", "1", "--tmp", "1", "--mbs", "1",
            "--virtual-stages", "2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "\nnot simulated: the interleaved schedule's blocking P2P " \
           "(training.overlap_p2p_comm: false) is not simulated\n" in out
    assert {r["time_source"] for r in rows[:8] if r["virtual_stages"] == 1} == {"simulated"}


@pytest.mark.parametrize("zero_stage", [0, 1])
def test_interleaved_simulation_syncs_what_the_1f1b_simulation_does(zero_stage):
    """Megatron-LM in bf16 reduces its fp32 gradient buffer and, with its distributed
    optimizer (ZeRO 1), all-gathers the updated bf16 weights after the step: the interleaved
    schedule's simulation moves the same data-parallel bytes in all as the plain 1F1B one
    (it had the bf16 gradients and no all-gather), and its iteration pays for them."""
    from amp_search.costing import CostModel
    from amp_search.simulate import simulate, simulation_inputs

    spec = parse_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 4,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "400 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 2048,
                  "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 32000},
        "training": {"global_batch_size": 16, "precision": "bf16", "backend": "megatron",
                     "zero_stage": zero_stage, "activation_checkpointing": "none",
                     "sequence_parallel": False}})
    model = CostModel(spec)
    kw = dict(pp=4, dp=2, tmp=1, mbs=1, zero_stage=zero_stage, partition="uniform")
    v2 = estimate(spec, **kw, virtual_stages=2).strategy
    v1 = estimate(spec, **kw).strategy
    a, b = simulation_inputs(model, v2), simulation_inputs(model, v1)
    assert np.sum(a["gradient_bytes"]) == pytest.approx(np.sum(b["gradient_bytes"]))
    weights = np.sum(b["gradient_bytes"]) / 2          # fp32 gradients of bf16 weights
    if zero_stage == 1:
        assert np.sum(a["gather_bytes_after_step"]) == pytest.approx(weights)
        assert np.sum(b["gather_bytes_after_step"]) == pytest.approx(weights)
        without = simulate(model, v2).iteration_time_s
        assert without > simulate_interleaved(**{**a, "gather_bytes_after_step": None}
                                              ).iteration_time_s
    else:
        assert a["gather_bytes_after_step"] is None and b["gather_bytes_after_step"] is None
