"""The simulator fed by the cost model (amp_search.simulate) and the re-ranking in `plan`."""
from __future__ import annotations

import json

import numpy as np
import pytest

from amp_search import estimate, load_spec, plan
from amp_search.costing import CostModel
from amp_search.planner import ranking_key
from amp_search.search_space import Candidate
from amp_search.simulate import (P2P_MODE, TRIAL_FRAMEWORK, p2p_mode_of, pass_times, simulate,
                                 simulation_inputs, tp_pass_elements, with_simulation)
from cost_models import comm
from cost_models import pipeline
from cost_models.simulator import P2P_MODE_OF_FRAMEWORK, P2P_MODES, simulate_iteration
from cost_models.layers import Layer, tp_allreduce_elements
from conftest import ROOT

CONFIGS = ROOT / "configs"


def _spec(name: str):
    return load_spec(CONFIGS / f"{name}.yaml")


@pytest.mark.parametrize("kind", ["transformer", "mlp", "embedding", "head", "custom"])
@pytest.mark.parametrize("recompute", [False, True])
def test_tp_pass_split_sums_to_the_cost_models_all_reduces(kind, recompute):
    layer = Layer(kind=kind, seq_length=128, hidden_size=256)
    parts = tp_pass_elements(layer, recompute)
    assert sorted(x for p in parts for x in p) == sorted(tp_allreduce_elements(layer,
                                                                               recompute))
    if not recompute:
        assert parts[2] == ()


CASES = [  # (config, strategy): homogeneous, heterogeneous with tensor parallelism, measured
    ("amp-homo-gpt2", dict(pp=2, dp=8, tmp=1, mbs=1)),
    ("amp-hetero-gpt2", dict(pp=4, dp=2, tmp=2, mbs=2)),
    ("amp-hetero-gpt2", dict(pp=4, dp=2, tmp=2, mbs=2, activation_checkpointing=True)),
    ("amp-hetero-gpt2", dict(pp=2, dp=1, tmp=8, mbs=1, partition="uniform")),
    ("cpu-local", dict(pp=2, dp=1, tmp=1, mbs=2)),
    ("cpu-local", dict(pp=1, dp=1, tmp=2, mbs=4, activation_checkpointing=True)),
]


@pytest.mark.parametrize("config,kw", CASES)
def test_passes_sum_to_the_closed_forms_stage_time(config, kw):
    """forward + backward (+ recompute) of each stage is the cost model's t_j exactly: the
    simulation differs from eq. 5 only by the schedule, not by its inputs."""
    spec = _spec(config)
    e = estimate(spec, **kw)
    model = CostModel(spec)
    k = simulation_inputs(model, e.strategy)
    total = k["forward_s"] + k["backward_s"] + (0.0 if k["recompute_s"] is None
                                                 else k["recompute_s"])
    np.testing.assert_allclose(total, e.stage_time_s, rtol=1e-12)
    assert np.all(k["forward_s"] > 0) and np.all(k["backward_s"] > k["forward_s"])
    assert (k["recompute_s"] is not None) == e.strategy.activation_checkpointing


def test_recompute_is_the_forward_again_without_tensor_parallelism():
    spec = _spec("amp-homo-gpt2")
    e = estimate(spec, pp=2, dp=8, tmp=1, mbs=1, activation_checkpointing=True)
    k = simulation_inputs(CostModel(spec), e.strategy)
    np.testing.assert_allclose(k["recompute_s"], k["forward_s"], rtol=1e-12)


def test_tensor_parallel_time_is_split_not_lost():
    """The all-reduces of the three passes sum to the cost model's tensor-parallel term."""
    spec = _spec("amp-hetero-gpt2")
    model = CostModel(spec)
    e = estimate(spec, pp=4, dp=2, tmp=2, mbs=2, activation_checkpointing=True)
    s = e.strategy
    c = Candidate.of(s)
    layout = model.layout(c, placement=np.array(s.placement))
    costs = model.stage_costs(c, layout)
    t = pass_times(model, c, layout, costs, s.partition)
    np.testing.assert_allclose(t.tensor_parallel_s,
                               pipeline.stage_totals(costs.tensor_parallel_s, s.partition),
                               rtol=1e-12)
    assert np.all(t.tensor_parallel_s > 0)


def test_p2p_and_dp_inputs_are_the_cost_models():
    spec = _spec("amp-homo-gpt2")
    e = estimate(spec, pp=2, dp=8, tmp=1, mbs=1, partition="uniform")
    k = simulation_inputs(CostModel(spec), e.strategy)
    e_j = 2 * comm.p2p_time_s(k["p2p_bytes"], k["p2p_bandwidth_bytes_per_s"], k["p2p_latency_s"])
    # p2p_s: e_j once, and 1F1B's steady state
    steady = pipeline.pipeline_1f1b_time_s(e.stage_time_s, e_j, e.strategy.gas) \
        - pipeline.pipeline_time_s(e.stage_time_s, e_j, e.strategy.gas)
    assert e.breakdown.p2p_s == pytest.approx(float(e_j.sum()) + steady, rel=1e-12)
    assert k["gradient_collective"] == "all_reduce" and k["dp"] == 8
    assert k["overlap"] is False


def test_single_stage_simulation_equals_the_closed_form():
    """pp 1, one gradient bucket, no dp_overlap: nothing for the schedule to change, so the
    simulated iteration is eq. 5 + 4 to rounding."""
    spec = _spec("amp-homo-gpt2")
    model = CostModel(spec)
    e = estimate(spec, pp=1, dp=16, tmp=1, mbs=2, partition="uniform")
    s = with_simulation(model, e, use_numba=False)
    assert s.time_source == "simulated"
    assert s.iteration_time_s == pytest.approx(e.iteration_time_s, rel=1e-9)
    assert s.analytic_iteration_time_s == e.iteration_time_s


def test_simulated_estimate_records_both_times_and_the_breakdown():
    spec = _spec("amp-hetero-gpt2")
    e = estimate(spec, pp=4, dp=2, tmp=2, mbs=2, simulate=True)
    assert e.time_source == "simulated" and e.simulation is not None
    closed = estimate(spec, pp=4, dp=2, tmp=2, mbs=2)
    assert closed.time_source == "analytic" and closed.simulation is None
    assert e.analytic_iteration_time_s == closed.iteration_time_s
    # DeepSpeed's blocking sends and receives, simulated, pay in every steady-state
    # micro-batch the P2P the closed form charges (P2P_BLOCKING_SHARE["deepspeed"]): within a
    # few % of it (0.754 s against 0.774 s), below it by part of eq. 5's fill and drain on
    # these unequal stages; free-running sends ("async") would hide most of it (0.52 s)
    assert 0.95 * closed.iteration_time_s <= e.iteration_time_s <= closed.iteration_time_s
    model = CostModel(spec)
    kw = simulation_inputs(model, e.strategy)
    assert kw["p2p_mode"] == P2P_MODE == "blocking"
    free_running = simulate_iteration(**{**kw, "p2p_mode": "async"}).iteration_time_s
    assert free_running < 0.8 * e.iteration_time_s
    assert simulate_iteration(**kw).iteration_time_s == e.iteration_time_s
    sim = e.simulation
    assert len(sim.busy_s) == len(sim.idle_s) == len(sim.exposed_comm_s) == 4
    makespan = max(sim.stage_end_s)
    for busy, idle, exposed in zip(sim.busy_s, sim.idle_s, sim.exposed_comm_s):
        assert busy + idle == pytest.approx(makespan, rel=1e-12)
        assert 0.0 <= exposed <= idle * (1 + 1e-12)
    assert sum(c.time_s for c in sim.critical_path) == pytest.approx(
        max(sim.stage_end_s), rel=1e-9)
    d = json.loads(json.dumps(e.to_dict()))
    assert d["time_source"] == "simulated"
    assert d["analytic_iteration_time_s"] == closed.iteration_time_s
    assert len(d["simulation"]["stages"]) == 4
    assert set(d["simulation"]["critical_path_time_by_kind_s"]) >= {"forward", "backward"}
    assert d["simulation"]["critical_path"][0]["start_s"] == 0.0
    # the JSON's runs are the records' (SimulationBreakdown keeps them as plain runs)
    assert d["simulation"]["critical_path"] == [c.to_dict() for c in sim.critical_path]


def _zero3(bandwidth, latency=0.0, **kw):
    """pp = 1, dp = 2, two layers: forward 1 s each, backward 2 s each, step 0.5 s; each
    layer's parameters all-gather in 3 s and its gradients reduce-scatter in 1 s alone
    (cost_models.comm's ring times at `bandwidth`)."""
    params = 3.0 / comm.allgather_time_s(1.0, 2, 1.0)          # bytes that gather in 3 s at 1 B/s
    grads = 1.0 / comm.reduce_scatter_time_s(1.0, 2, 1.0)
    args = dict(forward_s=[2.0], backward_s=[4.0], optimizer_s=[0.5], dp=2,
                dp_bandwidth_bytes_per_s=[bandwidth], dp_latency_s=[latency],
                zero3_layer_forward_s=[1.0, 1.0], zero3_layer_backward_s=[2.0, 2.0],
                zero3_param_bytes=[params, params], zero3_grad_bytes=[grads, grads])
    args.update(kw)
    return simulate_iteration(**args)


@pytest.mark.parametrize("use_numba", [True, False])
@pytest.mark.parametrize("gas", [1, 3])
def test_zero_3_with_free_links_equals_the_schedule_without_zero(gas, use_numba):
    z3 = _zero3(np.inf, gas=gas, step_overhead_s=0.25, use_numba=use_numba)
    plain = simulate_iteration(forward_s=[2.0], backward_s=[4.0], optimizer_s=[0.5], gas=gas,
                               step_overhead_s=0.25, use_numba=use_numba)
    assert z3.iteration_time_s == plain.iteration_time_s == gas * 6.0 + 0.5 + 0.25
    assert z3.busy_s == plain.busy_s and z3.exposed_comm_s == (0.0,)
    # every layer pass waits for one gather, every backward one reduce-scatter
    kinds = [e.kind for e in z3.events if e.stream == "dp"]
    assert kinds.count("allgather") == 4 * gas and kinds.count("reduce_scatter") == 2 * gas


@pytest.mark.parametrize("use_numba", [True, False])
def test_zero_3_exposed_gathers_by_hand(use_numba):
    """Gathers 3 s, layer forward 1 s: only the first gather of each pass hides nothing.
    By hand (gas 1): gather f0 [0, 3], f0 [3, 4]; gather f1 (issued when f0 starts) [3, 6],
    f1 [6, 7]; gather b1 [6, 9], b1 [9, 11]; gather b0 (issued at 9) runs alone until the
    reduce-scatter of b1 joins at 11 with a third of its bytes left: both then share the link
    and end at 13; b0 [13, 15]; reduce-scatter of b0 [15, 16]; step [16, 16.5]."""
    sim = _zero3(1.0, gas=1, use_numba=use_numba)
    assert sim.makespan_s == pytest.approx(16.5, rel=1e-12)
    assert sim.busy_s == (6.5,) and sim.exposed_comm_s[0] == pytest.approx(10.0, rel=1e-12)
    compute = [(e.kind, round(e.start_s, 9), round(e.end_s, 9)) for e in sim.events
               if e.stream == "compute" and e.kind != "idle"]
    assert compute == [("forward", 3, 4), ("forward", 6, 7), ("backward", 9, 11),
                       ("backward", 13, 15), ("optimizer", 16, 16.5)]
    dp = sorted((round(e.start_s, 9), round(e.end_s, 9), e.kind) for e in sim.events
                if e.stream == "dp")
    assert dp == [(0, 3, "allgather"), (3, 6, "allgather"), (6, 9, "allgather"),
                  (9, 13, "allgather"), (11, 13, "reduce_scatter"), (15, 16, "reduce_scatter")]
    # the critical path runs through the gathers, ends with the last reduce-scatter and step
    assert sim.critical_path[-2:] == ("stage 0 reduce_scatter", "stage 0 optimizer")
    assert sum(1 for k in sim.critical_path_kinds if k == "allgather") == 4
    # the volume of the closed form: gas (2 all-gathers + 1 reduce-scatter) of the stage
    alone = comm.data_parallel_sync_time_s(param_bytes=2 * (3.0 / comm.allgather_time_s(1.0, 2, 1.0)),
                                        grad_bytes=2 * (1.0 / comm.reduce_scatter_time_s(1.0, 2,
                                                                                      1.0)),
                                        n=2, bandwidth_bytes_per_s=1.0, latency_s=0.0,
                                        zero_stage=3, gas=1)
    assert alone == pytest.approx(3 * 4 + 1 * 2)
    # latency: one ring latency (n - 1 = 1 step) per gather and reduce-scatter
    slow = _zero3(np.inf, latency=0.125, gas=1, use_numba=use_numba)
    # gathers of 0.125 s hide behind the layer before, except the first: only it and the
    # last reduce-scatter are exposed
    assert slow.makespan_s == pytest.approx(6.5 + 0.125 + 0.125)


def test_zero_3_input_checks():
    with pytest.raises(ValueError, match="together"):
        _zero3(1.0, gas=1, zero3_grad_bytes=None)
    with pytest.raises(ValueError, match="sums to"):
        _zero3(1.0, gas=1, zero3_layer_forward_s=[1.0, 2.0])
    with pytest.raises(ValueError, match="pp = 1 and dp > 1"):
        _zero3(1.0, gas=1, dp=1)
    with pytest.raises(ValueError, match="do not apply"):
        _zero3(1.0, gas=1, gradient_bytes=[1.0])


def test_zero_3_is_simulated_at_pp_1():
    spec = _spec("amp-homo-gpt2")
    e = estimate(spec, pp=1, dp=16, tmp=1, mbs=1, zero_stage=3, partition="uniform",
                 simulate=True)
    assert e.time_source == "simulated" and e.simulation is not None
    model = CostModel(spec)
    kw = simulation_inputs(model, e.strategy)
    L = model.num_layers
    assert kw["zero3_param_bytes"].shape == (L,) and kw["gas"] == e.strategy.gas
    # the layer split sums to the stage's passes, the bytes to the closed form's volume
    assert kw["zero3_layer_forward_s"].sum() == pytest.approx(kw["forward_s"][0], rel=1e-12)
    assert kw["zero3_param_bytes"].sum() == pytest.approx(
        model.params_per_layer(1).sum() * spec.training.bytes_per_element)
    # gathers add to the compute: the simulated time is above the same compute with free links
    free = simulate_iteration(**{**kw, "dp_bandwidth_bytes_per_s": np.full(1, np.inf),
                                 "dp_latency_s": np.zeros(1)})
    sim = simulate(model, e.strategy)
    assert free.makespan_s == pytest.approx(kw["gas"] * (kw["forward_s"][0]
                                                         + kw["backward_s"][0])
                                            + kw["optimizer_s"][0], rel=1e-9)
    assert sim.makespan_s > free.makespan_s
    assert sim.exposed_comm_s[0] == pytest.approx(sim.makespan_s - free.makespan_s, rel=1e-9)
    # and with pp > 1 (which DeepSpeed's pipeline engine rejects) it says why not
    from dataclasses import replace

    from amp_search.simulate import simulatable
    assert simulatable(replace(e.strategy, pp=2)).startswith("ZeRO 3 with pp > 1")


def test_plan_reranks_the_top_n_by_simulated_time():
    spec = _spec("amp-hetero-gpt2")
    closed = plan(spec, simulate_top=0)
    assert all(e.time_source == "analytic" for e in closed.strategies)
    n = 6
    sim = plan(spec, simulate_top=n)
    head, tail = sim.strategies[:n], sim.strategies[n:]
    assert all(e.simulated for e in head) and not any(e.simulated for e in tail)
    # the top n are the closed form's top n, re-ordered by the ranking key on simulated times
    labels = lambda es: [e.strategy.label() for e in es]     # noqa: E731
    assert sorted(labels(head)) == sorted(labels(closed.strategies[:n]))
    assert labels(head) == labels(sorted(head, key=ranking_key))
    assert labels(tail) == labels(closed.strategies[n:])
    by_label = {e.strategy.label(): e for e in closed.strategies}
    for e in head:
        assert e.analytic_iteration_time_s == by_label[e.strategy.label()].iteration_time_s
    # the simulator and the closed form model the same (DeepSpeed's blocking) P2P: on this
    # cluster the simulated times are at most 12% below the closed form's (eq. 5's fill and
    # drain on unequal stages) and the best strategy stays the best
    for e in head:
        assert 0.88 * e.analytic_iteration_time_s <= e.iteration_time_s \
            <= e.analytic_iteration_time_s * (1 + 1e-9)
    assert labels(head)[0] == labels(closed.strategies)[0]
    assert sim.baseline is not None and sim.baseline.simulated
    d = sim.to_dict(top_k=n)
    assert all(r["time_source"] == "simulated" for r in d["strategies"])
    assert d["megatron_baseline"]["time_source"] == "simulated"


def test_simulate_matches_the_plain_python_kernel():
    spec = _spec("amp-hetero-gpt2")
    model = CostModel(spec)
    e = estimate(spec, pp=4, dp=4, tmp=1, mbs=1)
    a = simulate(model, e.strategy)
    b = simulate(model, e.strategy, use_numba=False)
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-12)


def _cli(argv, capsys):
    from amp_search.cli import build_parser

    args = build_parser().parse_args(argv)
    code = args.func(args)
    return code, capsys.readouterr().out


def test_estimate_command_prints_the_simulated_breakdown(capsys):
    spec = str(CONFIGS / "amp-hetero-gpt2.yaml")
    base = ["estimate", spec, "--pp", "4", "--dp", "2", "--tmp", "2", "--mbs", "2"]
    code, out = _cli(base, capsys)
    assert code == 0
    assert "simulated (1f1b):" in out and "closed form (AMP eq. 5 + 4)" in out
    assert "exposed comm s" in out and "critical path (" in out and "eq.5 s" in out
    code, out = _cli(base + ["--no-simulate"], capsys)
    assert code == 0 and "simulated" not in out and "eq.5 s" not in out
    code, out = _cli(base + ["--json", "-"], capsys)
    d = json.loads(out)
    assert d["time_source"] == "simulated" and d["simulation"]["stages"][0]["stage"] == 0


def test_plan_command_options(capsys):
    spec = str(CONFIGS / "amp-hetero-gpt2.yaml")
    code, out = _cli(["plan", spec, "--no-progress", "--top-k", "4", "--simulate-top", "2",
                      "--json", "-"], capsys)
    d = json.loads(out)
    assert [r["time_source"] for r in d["strategies"]] == ["simulated"] * 2 + ["analytic"] * 2
    code, out = _cli(["plan", spec, "--no-progress", "--top-k", "4", "--no-simulate"], capsys)
    assert code == 0 and "eq.5 s" not in out and "simulated" not in out
    code, out = _cli(["plan", spec, "--no-progress", "--top-k", "4", "--simulate-top", "2"],
                     capsys)
    flat = " ".join(out.split())
    assert "eq.5 s" in out and "* the closed form, not simulated" in flat
    assert "the best 2 simulated and re-ranked" in flat


def test_host_bound_excess_is_spread_evenly_over_the_passes():
    """A host far slower than the device: each pass takes its host time, and the passes
    share it evenly (each block pass issues the same work, the head half a pass's worth in
    each), still summing to t_j."""
    from cost_models.params import CostParams

    spec = _spec("amp-homo-gpt2")
    slow_host = CostParams(host_block_pass_s={"T4-16GB": 0.05})
    e = estimate(spec, pp=2, dp=8, tmp=1, mbs=1, partition="uniform", cost_params=slow_host)
    model = CostModel(spec, cost_params=slow_host)
    k = simulation_inputs(model, e.strategy)
    np.testing.assert_allclose(k["forward_s"] + k["backward_s"], e.stage_time_s, rtol=1e-12)
    # 12-13 blocks of 2 passes at 50 ms of host each: about 0.6 s per pass, nearly equal
    # (the embedding is not host-bound: its backward stays the longer)
    assert np.all(k["forward_s"] > 0.5)
    np.testing.assert_allclose(k["backward_s"] / k["forward_s"], 1.0, rtol=0.05)
    assert k["backward_s"][0] > k["forward_s"][0]


def test_one_framework_sets_the_p2p_of_both_models():
    """The planner's closed form and the simulator take the trials' framework's P2P from one
    constant: DeepSpeed, blocking share 1 and the blocking simulation; the modes the
    simulator has match the closed form's shares (blocking 1, paired 0.5, free-running 0)."""
    assert TRIAL_FRAMEWORK == "deepspeed" and P2P_MODE == p2p_mode_of(TRIAL_FRAMEWORK)
    assert set(P2P_MODE_OF_FRAMEWORK) <= set(pipeline.P2P_BLOCKING_SHARE)
    assert set(P2P_MODE_OF_FRAMEWORK.values()) == set(P2P_MODES)
    share = {"blocking": 1.0, "paired": 0.5, "async": 0.0}
    for framework, mode in P2P_MODE_OF_FRAMEWORK.items():
        assert pipeline.P2P_BLOCKING_SHARE[framework] == share[mode]
    with pytest.raises(ValueError, match="'nccl'"):
        p2p_mode_of("nccl")
    # the planner's estimate is the closed form with that share
    spec = _spec("amp-hetero-gpt2")
    e = estimate(spec, pp=4, dp=2, tmp=2, mbs=2)
    model = CostModel(spec)
    kw = simulation_inputs(model, e.strategy)
    e_j = 2 * comm.p2p_time_s(kw["p2p_bytes"], kw["p2p_bandwidth_bytes_per_s"],
                           kw["p2p_latency_s"])
    pipe = pipeline.pipeline_1f1b_time_s(e.stage_time_s, e_j, e.strategy.gas,
                                  blocking_share=pipeline.P2P_BLOCKING_SHARE[TRIAL_FRAMEWORK])
    steady = pipe - pipeline.pipeline_time_s(e.stage_time_s, e_j, e.strategy.gas)
    assert steady > 0 and e.breakdown.p2p_s == pytest.approx(float(e_j.sum()) + steady,
                                                             rel=1e-12)


@pytest.mark.parametrize("name", ["amp-hetero-gpt2", "amp-transgan"])
def test_each_micro_batch_costs_the_closed_forms_steady_state_period(name):
    """On the shipped clusters' deep pipelines (pp 16, unequal stages, slow boundaries), one
    more micro-batch adds to the simulated iteration exactly the closed form's steady-state
    period with DeepSpeed's share (`steady_state_period_s`): the two agree on what DeepSpeed's
    blocking P2P costs per micro-batch; what remains between them is eq. 5's fill and drain
    (sum t + sum e, an upper bound on unequal stages)."""
    spec = _spec(name)
    e = estimate(spec, pp=16, dp=1, tmp=1, mbs=2)
    kw = simulation_inputs(CostModel(spec), e.strategy)
    t = kw["forward_s"] + kw["backward_s"]
    e_j = 2 * comm.p2p_time_s(kw["p2p_bytes"], kw["p2p_bandwidth_bytes_per_s"],
                           kw["p2p_latency_s"])
    np.testing.assert_allclose(t, e.stage_time_s, rtol=1e-9)
    gas = kw["gas"]
    # at twice the spec's micro-batches the pipeline is in its steady state (at gas = pp = 16
    # the warm-up of amp-hetero-gpt2's slowest boundary still shows: 16 -> 17 adds 0.0168 s
    # of its 0.0185 s period, 32 -> 33 the whole of it)
    one, more = (simulate_iteration(**{**kw, "gas": g}).iteration_time_s
                 for g in (2 * gas, 2 * gas + 1))
    period = pipeline.steady_state_period_s(t, e_j, blocking_share=pipeline.P2P_BLOCKING_SHARE[TRIAL_FRAMEWORK])
    assert period > t.max() * 1.05               # the slow boundaries are paid per micro-batch
    assert more - one == pytest.approx(period, rel=1e-9)
    assert simulate_iteration(**kw).iteration_time_s <= e.iteration_time_s


def test_mixed_stage_takes_every_pass_from_its_slowest_device_type(monkeypatch):
    """A stage of H100s and A100s whose H100 forward is the slower one but whose A100 total
    is: the closed form and the simulator both take all passes from the A100 (the slower
    total), so with a host-bound forward the passes still sum to t_j."""
    from cost_models.params import CostParams

    original = CostModel.device_pass_times_s

    def skewed(self, gpu, c):
        p = original(self, gpu, c).copy()
        if gpu.name.startswith("H100"):     # forward slower than the A100's, total faster
            p[0] *= 3.0
            p[2] *= 3.0
        else:
            p[1] *= 10.0
        return p

    monkeypatch.setattr(CostModel, "device_pass_times_s", skewed)
    spec = _spec("mixed-h100-a100-gpt13b")
    host = CostParams(host_block_pass_s={g: 0.02 for g in ("A100-40GB", "H100-80GB")})
    for ckpt in (True, False):
        e = estimate(spec, pp=1, dp=4, tmp=8, mbs=1, activation_checkpointing=ckpt,
                     cost_params=host)
        k = simulation_inputs(CostModel(spec, cost_params=host), e.strategy)
        passes = k["forward_s"] + k["backward_s"] + (k["recompute_s"] if ckpt else 0.0)
        np.testing.assert_allclose(passes, e.stage_time_s, rtol=1e-12)
