"""The event-level simulator of one iteration (cost_models.simulator) against the closed form
(cost_models.pipeline, AMP eq. 5 and 4) where its assumptions hold, and against hand-worked
timelines where overlap and bandwidth sharing matter.

Most cases run the plain-Python twin of the kernel (use_numba=False: the same code, no
compilation); a few run the compiled kernel and compare the two."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cost_models import comm
from cost_models import pipeline
from cost_models.schedule import deepspeed_train_order, megatron_order, schedule_order
from cost_models.simulator import (DEEPSPEED_REDUCE_BUCKET_ELEMENTS, KINDS, P2P_MODES, STREAMS,
                                   deepspeed_bucket_bytes, simulate_iteration)
from cost_models.simulator_inputs import LinkUse

PY = dict(use_numba=False)
FAST = settings(max_examples=60, deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def sim(**kw):
    kw.setdefault("use_numba", False)
    kw.setdefault("optimizer_s", [0.0] * len(kw["forward_s"]))
    return simulate_iteration(**kw)


def rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1e-300)


# ------------------------------------------------------------------ the schedules

@pytest.mark.parametrize("pp,gas", [(1, 1), (1, 5), (3, 2), (4, 4), (4, 9), (6, 3)])
def test_1f1b_order_is_deepspeed_train_schedule(pp, gas):
    kinds, micro = schedule_order("1f1b", pp, gas)
    for j in range(pp):
        w = min(pp - j - 1, gas)
        assert list(kinds[j, :w]) == [0] * w and list(micro[j, :w]) == list(range(w))
        steady = kinds[j, w:w + 2 * (gas - w)]
        assert list(steady) == [0, 2] * (gas - w)
        assert list(kinds[j, 2 * gas - w:]) == [2] * w
        for kind in (0, 2):     # every micro-batch once per pass, in order
            assert list(micro[j][kinds[j] == kind]) == list(range(gas))


def test_gpipe_order_and_separate_recompute():
    kinds, micro = schedule_order("gpipe", 3, 4)
    assert (kinds[:, :4] == 0).all() and (kinds[:, 4:] == 2).all()
    kinds, micro = schedule_order("1f1b", 2, 3, recompute=True)
    assert list(kinds[0]) == [0, 0, 1, 2, 0, 1, 2, 1, 2]
    assert list(micro[0]) == [0, 1, 0, 0, 2, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="schedule"):
        schedule_order("interleaved", 2, 2)


# ------------------------------------------------------------------ (a) the closed form

@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
@pytest.mark.parametrize("pp,gas", [(1, 1), (1, 7), (2, 1), (2, 8), (4, 3), (5, 16), (8, 8)])
def test_uniform_free_links_equal_eq5_plus_sync_and_step(schedule, pp, gas):
    f, b, step, overhead = 0.0123, 0.0291, 0.0041, 0.0007
    grad, bw, lat, dp = 3.3e8, 1.1e10, 2e-5, 4
    s = sim(forward_s=[f] * pp, backward_s=[b] * pp, optimizer_s=[step] * pp, gas=gas,
            schedule=schedule, dp=dp, gradient_bytes=[grad] * pp, dp_latency_s=[lat] * pp,
            dp_bandwidth_bytes_per_s=[bw] * pp, bucket_bytes=1e9, step_overhead_s=overhead)
    sync = comm.data_parallel_sync_time_s(param_bytes=grad, grad_bytes=grad, n=dp,
                                       bandwidth_bytes_per_s=bw, latency_s=lat, zero_stage=0,
                                       gas=gas)
    closed = pipeline.iteration_time_s(pipeline.pipeline_time_s([f + b] * pp, np.zeros(pp - 1), gas),
                                np.full(pp, sync + step), overhead)
    assert rel(s.iteration_time_s, closed) < 1e-12
    assert rel(s.iteration_time_s, (gas + pp - 1) * (f + b) + sync + step + overhead) < 1e-12
    # the bubble of stage j is the (pp-1) t fill-and-drain plus the others' tails
    assert rel(s.busy_s[0], gas * (f + b) + step) < 1e-12
    assert rel(s.idle_s[0], (pp - 1) * (f + b) + sync) < 1e-12


@pytest.mark.parametrize("zero,every", [(1, False), (2, True)])
def test_zero_1_and_2_traffic_equals_the_analytic_sync(zero, every):
    """ZeRO 1: reduce-scatter, step, all-gather; ZeRO 2 (pp = 1): a reduce-scatter after
    every micro-batch's backward (blocking without overlap), all-gather after the step."""
    gas, dp, G, bw, lat = 5, 4, 2e8, 5e9, 1e-5
    s = sim(forward_s=[0.01], backward_s=[0.02], optimizer_s=[0.003], gas=gas, dp=dp,
            gradient_bytes=[G], dp_latency_s=[lat], dp_bandwidth_bytes_per_s=[bw],
            bucket_bytes=1e9, gradient_collective="reduce_scatter",
            reduce_every_microbatch=every, gather_bytes_after_step=[G])
    sync = comm.data_parallel_sync_time_s(param_bytes=G, grad_bytes=G, n=dp,
                                       bandwidth_bytes_per_s=bw, latency_s=lat,
                                       zero_stage=zero, gas=gas)
    closed = pipeline.iteration_time_s(pipeline.pipeline_time_s([0.03], [], gas), [sync + 0.003])
    assert rel(s.iteration_time_s, closed) < 1e-12


def test_buckets_pay_their_latency_each():
    """DeepSpeed's buckets are separate collectives: k buckets pay k ring latencies (the
    closed form's sync pays one); bandwidth-wise they add up to one all-reduce."""
    G, dp, bw, lat = 1.2e9, 8, 1e10, 3e-5
    s = sim(forward_s=[0.0], backward_s=[0.0], gas=1, dp=dp, gradient_bytes=[G],
            dp_latency_s=[lat], dp_bandwidth_bytes_per_s=[bw],
            bucket_bytes=deepspeed_bucket_bytes(2))
    assert deepspeed_bucket_bytes(2) == 2 * DEEPSPEED_REDUCE_BUCKET_ELEMENTS == 1e9
    assert s.iteration_time_s == pytest.approx(comm.allreduce_time_s(G, dp, bw, lat, messages=2),
                                               rel=1e-12)
    kinds = [e.kind for e in s.events if e.stream == "dp"]
    assert kinds == ["allreduce", "allreduce"]


@FAST
@given(pp=st.integers(1, 7), gas=st.integers(1, 12), ratio=st.floats(0.3, 4.0),
       f=st.lists(st.floats(0.01, 3.0), min_size=7, max_size=7))
def test_1f1b_eq5_upper_bound_when_stages_share_one_backward_ratio(pp, gas, ratio, f):
    """Free links, 1F1B, every stage's backward = ratio x its forward (the CLI's 1:2 split):
    eq. 5 is an upper bound. A stage j with t_j <= t_b then has f_j <= f_b and b_j <= b_b, so
    nothing upstream of the slowest stage b feeds it slower than it computes, and b runs its
    gas micro-batches back to back after a fill of at most sum_{j<b} f_j."""
    fwd = np.array(f[:pp])
    s = sim(forward_s=fwd, backward_s=ratio * fwd, gas=gas)
    closed = pipeline.pipeline_time_s(fwd * (1 + ratio), np.zeros(pp - 1), gas)
    assert s.iteration_time_s <= closed * (1 + 1e-12)
    b = int(np.argmax(fwd))
    assert s.iteration_time_s >= gas * fwd[b] * (1 + ratio) * (1 - 1e-12)   # b's own work


def test_1f1b_eq5_is_no_bound_when_backward_ratios_differ():
    """With different forward:backward ratios (recomputation on some stages, measured layer
    times) eq. 5 can be exceeded: the slowest stage (2) runs its second forward only when the
    slower forward of stage 1 has delivered it, and idles 1 s (1F1B puts F1 before B0)."""
    s = sim(forward_s=[0, 5, 4, 0], backward_s=[0, 10, 12, 0], gas=2)
    assert s.iteration_time_s == 48.0
    assert pipeline.pipeline_time_s([0, 15, 16, 0], np.zeros(3), 2) == 47.0
    # ... and it can be far below it: the fill of fast stages overlaps the slow one
    s = sim(forward_s=[0, 3, 2], backward_s=[0, 6, 6], gas=2)
    assert s.iteration_time_s == 25.0 < pipeline.pipeline_time_s([0, 9, 8], np.zeros(2), 2) == 26.0


@FAST
@given(pp=st.integers(1, 6), gas=st.integers(1, 10),
       f=st.lists(st.floats(0.01, 2.0), min_size=6, max_size=6),
       b=st.lists(st.floats(0.01, 4.0), min_size=6, max_size=6),
       d=st.lists(st.floats(0.0, 1.5), min_size=5, max_size=5))
def test_gpipe_is_two_flow_shops(pp, gas, f, b, d):
    """GPipe = a flow shop of the forwards over the stages and send streams, then one of the
    backwards: sum f + sum d + (gas-1) max(f, d), and the same for b. So eq. 5 is a lower
    bound of GPipe, exact when one stage is slowest in both passes and P2P is no slower."""
    fwd, bwd, dd = np.array(f[:pp]), np.array(b[:pp]), np.array(d[:pp - 1])
    s = sim(forward_s=fwd, backward_s=bwd, gas=gas, schedule="gpipe", p2p_bytes=dd,
            p2p_bandwidth_bytes_per_s=np.ones(pp - 1))
    top = lambda x: max(np.max(x), np.max(dd, initial=0.0))  # noqa: E731
    expect = fwd.sum() + bwd.sum() + 2 * dd.sum() + (gas - 1) * (top(fwd) + top(bwd))
    assert s.iteration_time_s == pytest.approx(expect, rel=1e-12)
    assert s.iteration_time_s >= pipeline.pipeline_time_s(fwd + bwd, 2 * dd, gas) * (1 - 1e-12)


@pytest.mark.parametrize("pp,gas", [(2, 4), (3, 7), (4, 8), (4, 2), (6, 12)])
def test_uniform_p2p_gpipe_equals_eq5_1f1b_pays_more(pp, gas):
    """P2P of d each way (e = 2d, AMP): GPipe with d <= f equals eq. 5; 1F1B's steady state
    waits for gradients whose round trip includes the P2P, so eq. 5 is a lower bound."""
    f, b, d = 1.0, 2.0, 0.25
    kw = dict(forward_s=[f] * pp, backward_s=[b] * pp, gas=gas, p2p_bytes=[d] * (pp - 1),
              p2p_bandwidth_bytes_per_s=[1.0] * (pp - 1))
    closed = pipeline.pipeline_time_s([f + b] * pp, [2 * d] * (pp - 1), gas)
    assert rel(sim(schedule="gpipe", **kw).iteration_time_s, closed) < 1e-12
    one = sim(schedule="1f1b", **kw).iteration_time_s
    assert one >= closed * (1 - 1e-12)
    if gas >= pp:
        assert one > closed


@FAST
@given(pp=st.integers(2, 6), gas=st.integers(1, 10), f=st.floats(0.05, 2.0),
       ratio=st.floats(0.3, 4.0), d=st.floats(0.0, 2.0))
def test_1f1b_uniform_with_p2p_at_or_above_eq5(pp, gas, f, ratio, d):
    s = sim(forward_s=[f] * pp, backward_s=[f * ratio] * pp, gas=gas,
            p2p_bytes=[d] * (pp - 1), p2p_bandwidth_bytes_per_s=[1.0] * (pp - 1))
    closed = pipeline.pipeline_time_s([f * (1 + ratio)] * pp, [2 * d] * (pp - 1), gas)
    assert s.iteration_time_s >= closed * (1 - 1e-12)


# ------------------------------------------------------------------ (b) GPipe vs 1F1B

@pytest.mark.parametrize("pp,gas", [(1, 3), (2, 2), (3, 8), (4, 4), (7, 20)])
def test_gpipe_and_1f1b_same_time_uniform(pp, gas):
    t = {}
    for schedule in ("gpipe", "1f1b"):
        t[schedule] = sim(forward_s=[0.5] * pp, backward_s=[1.5] * pp, gas=gas,
                          schedule=schedule).iteration_time_s
    assert t["gpipe"] == t["1f1b"] == (gas + pp - 1) * 2.0


def test_separate_recompute_is_shown_and_costs_the_same():
    kw = dict(forward_s=[1.0, 1.0, 1.0], gas=4)
    merged = sim(backward_s=[3.0] * 3, **kw)
    split = sim(backward_s=[2.0] * 3, recompute_s=[1.0] * 3, **kw)
    assert merged.iteration_time_s == split.iteration_time_s == 6 * 4.0
    assert sum(e.kind == "recompute" for e in split.events) == 12
    assert all(a.kind != "recompute" for a in merged.events)


# ------------------------------------------------------------------ (c) overlap

@pytest.mark.parametrize("per_bucket_s,saving_s", [(1.0, 1.5), (0.25, 0.75)])
def test_overlapped_buckets_hide_behind_the_backward(per_bucket_s, saving_s):
    """pp 1, gas 1, forward 1 s, backward 2 s, step 0.5 s; 4 buckets of an all-reduce over 2
    ranks (bus factor 1) of per_bucket_s each. Without overlap: 3 + 4 x bucket + 0.5. With
    overlap the buckets fill at 1.5, 2, 2.5 and 3 s (a quarter of the backward each) and run
    one after another from there: bucket 1 s -> ends 5.5 (saves 1.5 s); 0.25 s -> each one
    done before the next fills, the last ends at 3.25 (saves 3 x 0.25 s)."""
    kw = dict(forward_s=[1.0], backward_s=[2.0], optimizer_s=[0.5], gas=1, dp=2,
              gradient_bytes=[4.0], bucket_bytes=1.0,
              dp_bandwidth_bytes_per_s=[1.0 / per_bucket_s])
    off = sim(overlap=False, **kw)
    on = sim(overlap=True, **kw)
    assert off.iteration_time_s == pytest.approx(3 + 4 * per_bucket_s + 0.5, rel=1e-12)
    assert off.iteration_time_s - on.iteration_time_s == pytest.approx(saving_s, rel=1e-12)
    starts = [e.start_s for e in on.events if e.kind == "allreduce"]
    first = [1.5, 2.0, 2.5, 3.0]
    expect = [max(first[k], first[0] + k * per_bucket_s) for k in range(4)]
    assert starts == pytest.approx(expect, rel=1e-12)
    assert on.exposed_comm_s[0] == pytest.approx(
        on.iteration_time_s - 0.5 - 3.0, rel=1e-12)


def test_without_overlap_each_backward_waits_for_its_buckets():
    """ZeRO 2 without overlap_comm: the reduce-scatter of every micro-batch blocks the next
    compute task; with it, the buckets of micro-batch m run under the next forward."""
    kw = dict(forward_s=[1.0], backward_s=[1.0], gas=3, dp=2, gradient_bytes=[1.0],
              bucket_bytes=1.0, dp_bandwidth_bytes_per_s=[2.0],
              gradient_collective="reduce_scatter", reduce_every_microbatch=True)
    assert sim(overlap=False, **kw).iteration_time_s == pytest.approx(3 * (2 + 0.25))
    assert sim(overlap=True, **kw).iteration_time_s == pytest.approx(3 * 2 + 0.25)


# ------------------------------------------------------------------ (d) sharing

def test_two_flows_on_one_link_take_twice_as_long():
    """Stages 0 and 1 finish at 0 s (zero compute) and all-reduce 2 bytes each (2 ranks,
    bus factor 1) over links of 1 B/s: on their own links 2 s, on one shared link 4 s."""
    kw = dict(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], gas=1, dp=2,
              gradient_bytes=[2.0, 2.0], bucket_bytes=10.0)
    own = sim(dp_routes=[["a"], ["b"]], links={"a": 1.0, "b": 1.0}, **kw)
    shared = sim(dp_routes=[["a"], ["a"]], links={"a": 1.0}, **kw)
    assert own.iteration_time_s == 2.0
    assert shared.iteration_time_s == 4.0
    assert [e.end_s for e in shared.events if e.stream == "dp"] == [4.0, 4.0]


def test_flow_sharing_part_of_its_life():
    """Stage 1's bucket (2 B) starts at 0 alone at 1 B/s; stage 0's (2 B) starts at 1 s when
    its 1 s backward ends. From 1 s each gets 0.5 B/s: stage 1's last byte ends at 3 s; then
    stage 0's last byte runs alone at 1 B/s: 4 s."""
    s = sim(forward_s=[0.0, 0.0], backward_s=[1.0, 0.0], gas=1, dp=2, gradient_bytes=[2.0, 2.0],
            bucket_bytes=10.0, dp_routes=[["nic"], ["nic"]], links={"nic": 1.0})
    dp = {e.stage: (e.start_s, e.end_s) for e in s.events if e.stream == "dp"}
    assert dp == {0: (1.0, 4.0), 1: (0.0, 3.0)}
    assert s.iteration_time_s == 4.0
    assert s.critical_path[-1] == "stage 0 optimizer"
    assert s.critical_path[-2] == "stage 0 allreduce bucket 1/1 mb 0"


def test_max_min_fairness_over_two_links_and_copies():
    """A (8 B) crosses link x (10 B/s); B (4 B) crosses x and y (2 B/s): B is held to 2 B/s by
    y, A gets the other 8 B/s of x (max-min, not an equal split): A ends at 1 s, B at 2 s.
    Three copies of a flow on a link split it three ways."""
    kw = dict(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], gas=1, dp=2, bucket_bytes=100.0)
    s = sim(gradient_bytes=[8.0, 4.0], dp_routes=[["x"], ["x", "y"]],
            links={"x": 10.0, "y": 2.0}, **kw)
    assert {e.stage: e.end_s for e in s.events if e.stream == "dp"} == \
        pytest.approx({0: 1.0, 1: 2.0}, rel=1e-12)
    s = sim(gradient_bytes=[3.0, 0.0], dp_routes=[[LinkUse("x", 3)], ["y"]],
            links={"x": 3.0, "y": 1.0}, **kw)
    assert s.iteration_time_s == pytest.approx(3.0, rel=1e-12)


def test_p2p_activations_and_gradients_share_a_half_duplex_link():
    """pp 2, gas 2, all compute 1 s, 3 B each way at 1 B/s. Full duplex: act 1 crosses
    [4, 7] while grad 0 crosses [6, 9]; the iteration takes 13 s. One half-duplex link for
    both: from 6 s each gets 0.5 B/s, act 1 ends at 8, grad 0 (2 B left) at 10: 14 s."""
    kw = dict(forward_s=[1.0, 1.0], backward_s=[1.0, 1.0], gas=2, p2p_bytes=[3.0])
    duplex = sim(p2p_routes=[["f"]], p2p_grad_routes=[["g"]], links={"f": 1.0, "g": 1.0}, **kw)
    half = sim(p2p_routes=[["l"]], links={"l": 1.0}, **kw)
    private = sim(p2p_bandwidth_bytes_per_s=[1.0], **kw)
    assert duplex.iteration_time_s == private.iteration_time_s == 13.0
    assert half.iteration_time_s == 14.0
    sends = {(e.label): (e.start_s, e.end_s) for e in half.events if e.kind == "send"}
    assert sends["send activation mb 1 stage 0->1"] == (4.0, 8.0)
    assert sends["send gradient mb 0 stage 1->0"] == (6.0, 10.0)


# ------------------------------------------------------------------ kernel, records, speed

def _random_case(rng, shared: bool) -> dict:
    pp, gas = int(rng.integers(1, 6)), int(rng.integers(1, 9))
    links = {"n0": float(rng.uniform(1, 5)), "n1": float(rng.uniform(1, 5)),
             "n2": float(rng.uniform(1, 5))}
    pick = lambda: list(rng.choice(list(links), size=int(rng.integers(1, 3)),  # noqa: E731
                                   replace=False))
    kw = dict(forward_s=rng.uniform(0, 2, pp), backward_s=rng.uniform(0, 3, pp),
              optimizer_s=rng.uniform(0, 1, pp), gas=gas,
              schedule=str(rng.choice(["1f1b", "gpipe"])), p2p_bytes=rng.uniform(0, 2, pp - 1),
              p2p_latency_s=rng.uniform(0, .2, pp - 1), dp=int(rng.integers(1, 4)),
              gradient_bytes=rng.uniform(0, 5, pp), dp_latency_s=rng.uniform(0, .1, pp),
              bucket_bytes=float(rng.uniform(.5, 3)), overlap=bool(rng.integers(2)),
              gradient_collective=str(rng.choice(["all_reduce", "reduce_scatter"])),
              reduce_every_microbatch=bool(rng.integers(2)),
              gather_bytes_after_step=rng.uniform(0, 2, pp),
              recompute_s=None if rng.integers(2) else rng.uniform(0, 1, pp))
    if shared:
        kw.update(p2p_routes=[pick() for _ in range(pp - 1)],
                  p2p_grad_routes=[[LinkUse(x, int(rng.integers(1, 3))) for x in pick()]
                                   for _ in range(pp - 1)],
                  dp_routes=[pick() for _ in range(pp)], links=links)
    else:
        kw.update(p2p_bandwidth_bytes_per_s=rng.uniform(1, 3, pp - 1),
                  dp_bandwidth_bytes_per_s=rng.uniform(1, 3, pp))
    return kw


def test_compiled_kernel_equals_python_twin_and_any_event_order():
    rng = np.random.default_rng(11)
    for _ in range(40):
        kw = _random_case(rng, shared=True)
        a = simulate_iteration(**kw)
        b = simulate_iteration(**kw, use_numba=False)
        assert a.iteration_time_s == b.iteration_time_s
        assert a.critical_path == b.critical_path and a.exposed_comm_s == b.exposed_comm_s
        np.testing.assert_array_equal(a.table.end_s, b.table.end_s)
        kw = _random_case(rng, shared=False)     # no sharing: a stack gives the same timeline
        c = simulate_iteration(**kw)
        d = simulate_iteration(**kw, time_ordered=True)
        np.testing.assert_allclose(c.table.start_s, d.table.start_s, rtol=0, atol=1e-12)
        assert c.critical_path == d.critical_path


def test_events_are_consistent():
    rng = np.random.default_rng(3)
    for shared in (True, False):
        for _ in range(15):
            s = sim(**_random_case(rng, shared))
            ev = s.events
            assert all(e.stream in STREAMS and e.kind in KINDS and e.end_s >= e.start_s
                       for e in ev)
            for j in range(s.pp):
                for stream in STREAMS:          # one task at a time per stream
                    mine = sorted((e.start_s, e.end_s) for e in ev
                                  if e.stage == j and e.stream == stream)
                    assert all(a[1] <= b[0] + 1e-12 for a, b in zip(mine, mine[1:]))
                compute = [e for e in ev if e.stage == j and e.stream == "compute"]
                busy = sum(e.duration_s for e in compute if e.kind != "idle")
                idle = sum(e.duration_s for e in compute if e.kind == "idle")
                assert busy == pytest.approx(s.busy_s[j], abs=1e-9)
                assert idle == pytest.approx(s.idle_s[j], abs=1e-9)
                assert busy + idle == pytest.approx(s.makespan_s, abs=1e-9)
                assert -1e-9 <= s.exposed_comm_s[j] <= s.idle_s[j] + 1e-9
            sends = sorted((e.start_s, e.end_s, e.microbatch) for e in ev if e.kind == "send")
            recvs = sorted((e.start_s, e.end_s, e.microbatch) for e in ev if e.kind == "recv")
            assert sends == recvs
            # the critical path ends with the task that ends last
            assert s.critical_path and s.to_dict()["critical_path"][-1] == s.critical_path[-1]


def test_p2p_alone_takes_the_comm_formula():
    s = sim(forward_s=[0.0, 0.0], backward_s=[0.0, 0.0], gas=1, p2p_bytes=[3e7],
            p2p_latency_s=[4e-5], p2p_bandwidth_bytes_per_s=[2.5e10])
    sends = [e for e in s.events if e.kind == "send"]
    assert [e.duration_s for e in sends] == pytest.approx([comm.p2p_time_s(3e7, 2.5e10, 4e-5)] * 2,
                                                          rel=1e-12)
    assert s.iteration_time_s == pytest.approx(comm.stage_boundary_time_s(3e7, 2.5e10, 4e-5),
                                               rel=1e-12)


@pytest.mark.parametrize("bad,match", [
    (dict(gas=0), "gas"), (dict(backward_s=[1.0]), "backward_s needs 2"),
    (dict(forward_s=[1.0, -1.0]), "finite and >= 0"), (dict(schedule="zb"), "schedule"),
    (dict(dp=2), "dp_bandwidth"), (dict(p2p_bytes=[1.0]), "p2p_bandwidth"),
    (dict(dp=2, dp_routes=[["a"], ["b"]], links={"a": 1.0}), "no bandwidth"),
    (dict(dp=2, dp_routes=[["a"], ["a"]], links={"a": 0.0}), "bandwidth must be > 0"),
    (dict(gradient_collective="all_gather"), "gradient_collective"),
    (dict(bucket_bytes=0.0), "bucket_bytes"),
    (dict(dp=2, dp_bandwidth_bytes_per_s=[1.0, 1.0], bucket_bytes=1e-9), "buckets"),
    (dict(p2p_routes=[["a"]], p2p_bandwidth_bytes_per_s=[1.0], links={"a": 1.0}), "not both"),
    (dict(p2p_grad_routes=[["a"]], links={"a": 1.0}), "needs p2p_routes"),
])
def test_malformed_input_is_rejected(bad, match):
    kw = dict(forward_s=[1.0, 1.0], backward_s=[1.0, 1.0], optimizer_s=[0.0, 0.0], gas=2,
              gradient_bytes=[1.0, 1.0])
    kw.update(bad)
    with pytest.raises(ValueError, match=match):
        simulate_iteration(**kw, use_numba=False)


def test_large_pipeline_runs_every_task():
    """pp 64 x gas 1024 (0.26 million tasks, P2P on private links, overlapped buckets) runs to
    the end with every compute task counted once. How fast (under 1 s once compiled):
    benchmarks/fail_fast.py."""
    pp, gas = 64, 1024
    rng = np.random.default_rng(0)
    f = rng.uniform(1e-3, 2e-3, pp)
    kw = dict(forward_s=f, backward_s=2 * f, optimizer_s=np.full(pp, 1e-3), gas=gas,
              p2p_bytes=np.full(pp - 1, 1e6), p2p_latency_s=np.full(pp - 1, 1e-5),
              p2p_bandwidth_bytes_per_s=np.full(pp - 1, 1e10), dp=4,
              gradient_bytes=np.full(pp, 2e9), dp_latency_s=np.full(pp, 1e-5),
              dp_bandwidth_bytes_per_s=np.full(pp, 1e10), overlap=True)
    s = simulate_iteration(**kw)
    assert s.iteration_time_s > gas * 3 * f.max()
    # each stage computes gas forwards and backwards and one optimizer step, nothing more
    np.testing.assert_allclose(s.busy_s, gas * 3 * f + 1e-3, rtol=1e-9)


def test_critical_path_segments_account_for_the_makespan():
    """The critical path's runs start at 0, follow one another and their counted times sum
    to the makespan, buckets that start inside their backward included."""
    sim = simulate_iteration(forward_s=[1.0, 1.5, 1.0], backward_s=[2.0, 3.0, 2.0],
                             optimizer_s=[0.5] * 3, gas=4, p2p_bytes=[1e9, 1e9],
                             p2p_bandwidth_bytes_per_s=[1e10, 1e10], dp=2,
                             gradient_bytes=[4e9, 6e9, 4e9], dp_bandwidth_bytes_per_s=[1e10] * 3,
                             bucket_bytes=1e9, overlap=True, use_numba=False)
    segs = sim.critical_path_segments()
    assert segs[0][3] == 0.0
    assert sum(s[5] for s in segs) == pytest.approx(sim.makespan_s, rel=1e-12)
    assert sum(s[2] for s in segs) == len(sim.critical_path)
    assert all(a[4] <= b[4] for a, b in zip(segs, segs[1:]))
    kinds = {s[1] for s in segs}
    assert {"forward", "backward"} <= kinds and kinds <= set(KINDS)
    # runs merge consecutive tasks of one stage and kind
    assert all((a[0], a[1]) != (b[0], b[1]) for a, b in zip(segs, segs[1:]))


# ------------------------------------------------------------------ blocking P2P (DeepSpeed)

def _uniform(pp, gas, f, b, d, **kw):
    """pp equal stages (forward f, backward b), every transfer d one way (bytes d, 1 byte/s)."""
    return sim(forward_s=[f] * pp, backward_s=[b] * pp, gas=gas, p2p_bytes=[d] * (pp - 1),
               p2p_bandwidth_bytes_per_s=[1.0] * (pp - 1), **kw)


def _starts(s, stage, kind, stream="compute"):
    return [e.start_s for e in s.events if e.stage == stage and e.kind == kind
            and e.stream == stream]


@pytest.mark.parametrize("pp,gas", [(1, 3), (2, 1), (2, 4), (3, 4), (4, 7), (5, 2)])
@pytest.mark.parametrize("recompute", [False, True])
def test_blocking_order_is_deepspeeds_train_schedule(pp, gas, recompute):
    """Instruction by instruction, DeepSpeed's own TrainSchedule (the installed deepspeed),
    and its compute ops in schedule_order's 1F1B order."""
    ds = pytest.importorskip("deepspeed.runtime.pipe.schedule")
    name = {"SendGrad": (4, -1), "RecvActivation": (5, -1), "RecvGrad": (5, 1),
            "SendActivation": (4, 1), "ForwardPass": (0, 0), "BackwardPass": (2, 0)}
    kind, micro, flow, peer = deepspeed_train_order(pp, gas, recompute=recompute)
    ck, cm = schedule_order("1f1b", pp, gas, recompute=recompute)
    nb = (pp - 1) * gas
    for j in range(pp):
        theirs = [name[type(c).__name__] for step in
                  ds.TrainSchedule(micro_batches=gas, stages=pp, stage_id=j).steps()
                  for c in step if type(c).__name__ in name]
        real = kind[j] != KINDS.index("idle")
        assert not real[real.argmin():].any() or real.all()     # padding only at the end
        mine = [(int(k), 0 if k in (0, 1, 2) else int(p) - j)
                for k, p in zip(kind[j][real], peer[j][real]) if k != 1]
        assert mine == theirs
        comp = real & (kind[j] <= 2)
        assert list(kind[j][comp]) == list(ck[j]) and list(micro[j][comp]) == list(cm[j])
        for k, m, f, p in zip(kind[j][real], micro[j][real], flow[j][real], peer[j][real]):
            if k in (4, 5):                 # the flow ids simulate_iteration gives transfers
                b = min(j, p)
                grad = (k == 4) == (p < j)
                assert f == (nb if grad else 0) + b * gas + m


def test_blocking_two_stages_by_hand():
    """pp 2, gas 4, forward 1, backward 2, each transfer 0.5. Stage 0 runs F0 SA0 F1 RG0 SA1
    B0 F2 RG1 SA2 B1 F3 RG2 SA3 B2 RG3 B3, stage 1 RA0 F0 B0 SG0 RA1 F1 B1 SG1 ... B3 SG3
    (SA/RA: send/receive activation, SG/RG: gradient). F0 [0, 1] on stage 0, SA0 [1, 1.5],
    F1 on stage 0 [1.5, 2.5] beside F0 B0 on stage 1 [1.5, 4.5]; then stage 0 waits in RG0
    until SG0 [4.5, 5], SA1 [5, 5.5], B0 [5.5, 7.5] beside F1 B1 on stage 1 [5.5, 8.5], and
    so on every t + 2d = 4: stage 1's forwards start at 1.5, 5.5, 9.5, 13.5; its last SG3
    [16.5, 17] and stage 0's B3 [17, 19]. The closed form with DeepSpeed's share:
    (gas - 1)(t + e) + 2t + e = 3 * 4 + 6 + 1 = 19, the same."""
    s = _uniform(2, 4, 1.0, 2.0, 0.5, p2p_mode="blocking")
    assert s.iteration_time_s == pytest.approx(19.0, abs=1e-12)
    assert _starts(s, 1, "forward") == pytest.approx([1.5, 5.5, 9.5, 13.5], abs=1e-12)
    assert _starts(s, 0, "backward") == pytest.approx([5.5, 9.5, 13.5, 17.0], abs=1e-12)
    assert _starts(s, 0, "forward") == pytest.approx([0.0, 1.5, 7.5, 11.5], abs=1e-12)
    assert pipeline.pipeline_1f1b_time_s([3.0, 3.0], [1.0], 4, blocking_share=1.0) == 19.0
    # a blocking call holds the compute stream from its issue to the transfer's end: stage 0
    # computes 12 and is blocked 7 (RG0 from 2.5, RG3 from 15.5: waiting for the peer)
    assert s.busy_s == pytest.approx((12.0, 12.0), abs=1e-12)
    blocked = [(e.start_s, e.end_s) for e in s.events
               if e.stage == 0 and e.stream == "compute" and e.kind in ("send", "recv")]
    assert blocked == [(1.0, 1.5), (2.5, 5.0), (5.0, 5.5), (8.5, 9.0), (9.0, 9.5),
                       (12.5, 13.0), (13.0, 13.5), (15.5, 17.0)]
    assert s.idle_s[0] == pytest.approx(7.0, abs=1e-12)
    # async sends: stage 0 never waits to send, the gradient round trip bounds it: 17
    assert _uniform(2, 4, 1.0, 2.0, 0.5).iteration_time_s == pytest.approx(17.0, abs=1e-12)


def test_blocking_three_stages_by_hand():
    """pp 3, gas 4, forward 1, backward 2, transfers 0.5 (stage 1 runs RA0 F0 SA0 RA1 F1 RG0
    SA1 B0 SG0 RA2 F2 RG1 SA2 B1 SG1 RA3 F3 RG2 SA3 B2 SG2 RG3 B3 SG3). Worked out:
    stage 0: F0 [0, 1], SA0 [1, 1.5], F1 [1.5, 2.5], SA1 [3, 3.5] (stage 1 first sends its
    SA0 [2.5, 3]), F2 [3.5, 4.5], then RG0 waits for stage 1's SG0 [9, 9.5] (stage 1 waits in
    its RG0 for stage 2's SG0 [6, 6.5], sends SA1 [6.5, 7], runs B0 [7, 9]); SA2 [9.5, 10],
    B0 [10, 12], F3 [12, 13], RG1 until SG1 [14, 14.5], SA3 [14.5, 15], B1 [15, 17],
    SG2 [19, 19.5], B2 [19.5, 21.5], SG3 [22.5, 23], B3 [23, 25]. The steady state pays the
    middle stage's t + 4d = 5 per micro-batch, as the closed form (DeepSpeed's share) does;
    the closed form's fill and drain, 3t + 2e = 11, are one transfer (e = 2d = 1) too long
    here: 26 against 25."""
    s = _uniform(3, 4, 1.0, 2.0, 0.5, p2p_mode="blocking")
    assert s.iteration_time_s == pytest.approx(25.0, abs=1e-12)
    assert _starts(s, 0, "backward") == pytest.approx([10.0, 15.0, 19.5, 23.0], abs=1e-12)
    assert _starts(s, 0, "forward") == pytest.approx([0.0, 1.5, 3.5, 12.0], abs=1e-12)
    assert _starts(s, 1, "forward") == pytest.approx([1.5, 3.5, 10.0, 15.0], abs=1e-12)
    assert _starts(s, 1, "backward") == pytest.approx([7.0, 12.0, 17.0, 20.5], abs=1e-12)
    assert _starts(s, 2, "forward") == pytest.approx([3.0, 7.0, 12.0, 17.0], abs=1e-12)
    assert pipeline.pipeline_1f1b_time_s([3.0] * 3, [1.0, 1.0], 4, blocking_share=1.0) == 26.0
    assert pipeline.steady_state_period_s([3.0] * 3, [1.0, 1.0], blocking_share=1.0) == 5.0
    assert _uniform(3, 4, 1.0, 2.0, 0.5).iteration_time_s == pytest.approx(22.0, abs=1e-12)


@FAST
@given(pp=st.integers(2, 7), gas=st.integers(2, 12), f=st.floats(0.1, 2.0),
       b=st.floats(0.1, 4.0), d=st.floats(0.0, 3.0))
def test_blocking_uniform_follows_the_closed_form(pp, gas, f, b, d):
    """Uniform stages, DeepSpeed's blocking P2P: every further micro-batch adds exactly the
    closed form's steady-state period (t + 4d inside, t + 2d for pp 2), and the closed form
    (`pipeline_1f1b_time_s`, blocking_share 1) is above the simulation by at most one
    boundary's e = 2d (its fill and drain; equal for pp 2), a share that shrinks as gas grows.
    Checked on random cases, not proven."""
    t, e = f + b, [2 * d] * (pp - 1)
    one, more = (_uniform(pp, g, f, b, d, p2p_mode="blocking").iteration_time_s
                 for g in (gas, gas + 1))
    period = pipeline.steady_state_period_s([t] * pp, e, blocking_share=1.0)
    assert more - one == pytest.approx(period, rel=1e-9, abs=1e-9)
    closed = pipeline.pipeline_1f1b_time_s([t] * pp, e, gas, blocking_share=1.0)
    assert one <= closed + 1e-9 and closed - one <= 2 * d + 1e-9
    if pp == 2:
        assert one == pytest.approx(closed, rel=1e-12, abs=1e-12)
    # blocking never beats the free-running sends
    assert one >= _uniform(pp, gas, f, b, d).iteration_time_s - 1e-9


@pytest.mark.parametrize("pp,gas", [(1, 4), (2, 1), (2, 8), (4, 3), (5, 16), (8, 8)])
def test_blocking_with_free_p2p_equals_eq5(pp, gas):
    """Free transfers: the rendezvous costs nothing, both modes give eq. 5 + 4 on uniform
    stages, with dp buckets and the optimizer step."""
    f, b, step = 0.0123, 0.0291, 0.0041
    kw = dict(forward_s=[f] * pp, backward_s=[b] * pp, optimizer_s=[step] * pp, gas=gas,
              dp=2, gradient_bytes=[1e8] * pp, dp_bandwidth_bytes_per_s=[1e10] * pp,
              bucket_bytes=1e9)
    a = sim(**kw, p2p_mode="async")
    s = sim(**kw, p2p_mode="blocking")
    assert s.iteration_time_s == pytest.approx(a.iteration_time_s, rel=1e-12)
    sync = comm.allreduce_time_s(1e8, 2, 1e10, 0.0)
    assert s.iteration_time_s == pytest.approx(
        pipeline.iteration_time_s(pipeline.pipeline_time_s([f + b] * pp, np.zeros(pp - 1), gas),
                           np.full(pp, sync + step)), rel=1e-12)


def test_blocking_compiled_equals_python_and_events_are_consistent():
    """Random cases (1F1B and GPipe, dp buckets, recompute, ZeRO 2, shared links): the
    compiled kernel and the Python twin agree; a blocked send or receive is on the compute
    stream of both its stages from its issue to the transfer's end, is not busy time, and the
    transfer starts when the later of the two has issued its call."""
    rng = np.random.default_rng(5)
    for n in range(24):
        kw = _random_case(rng, shared=n % 2 == 0)
        kw.update(p2p_mode="blocking")
        a = simulate_iteration(**kw)
        b = simulate_iteration(**kw, use_numba=False)
        assert a.iteration_time_s == b.iteration_time_s
        assert a.critical_path == b.critical_path and a.exposed_comm_s == b.exposed_comm_s
        np.testing.assert_array_equal(a.table.end_s, b.table.end_s)
        assert a.iteration_time_s >= simulate_iteration(
            **{**kw, "p2p_mode": "async"}).iteration_time_s - 1e-9 or kw.get("p2p_routes")
        ev = a.events
        transfers = {(e.stage, e.microbatch, e.stream == "send_next"): (e.start_s, e.end_s)
                     for e in ev if e.kind == "send" and e.stream != "compute"}
        calls = {}
        for e in ev:
            if e.kind in ("send", "recv") and e.stream == "compute":
                sender = e.stage if e.kind == "send" else int(
                    e.label.split("stage ")[1].split("->")[0])
                to_next = "activation" in e.label
                calls.setdefault((sender, e.microbatch, to_next), []).append(e)
        assert sorted(calls) == sorted(transfers)
        in_flight = np.zeros(a.pp)      # per stage: its blocked calls' transfer parts
        for key, (start, end) in transfers.items():
            pair = calls[key]
            assert sorted(e.kind for e in pair) == ["recv", "send"]
            assert all(e.end_s == end and e.start_s <= start for e in pair)
            for e in pair:
                in_flight[e.stage] += end - start
            assert max(e.start_s for e in pair) == start or kw.get("p2p_routes")
        for j in range(a.pp):
            compute = [e for e in ev if e.stage == j and e.stream == "compute"]
            spans = sorted((e.start_s, e.end_s) for e in compute)
            assert all(x[1] <= y[0] + 1e-12 for x, y in zip(spans, spans[1:]))
            work = sum(e.duration_s for e in compute
                       if e.kind in ("forward", "recompute", "backward", "optimizer"))
            assert work == pytest.approx(a.busy_s[j], abs=1e-9)
            assert sum(e.duration_s for e in compute) == pytest.approx(a.makespan_s, abs=1e-9)
            assert in_flight[j] - 1e-9 <= a.exposed_comm_s[j] <= a.idle_s[j] + 1e-9
        segs = a.critical_path_segments()
        assert sum(x[5] for x in segs) == pytest.approx(a.makespan_s, rel=1e-9)
        assert "idle" not in a.critical_path_kinds


@pytest.mark.parametrize("recompute", [None, [0.5, 0.5, 0.5]])
def test_blocking_gpipe_by_hand(recompute):
    """GPipe with blocking P2P (each pass receives just before it, sends just after it):
    pp 3, gas 2, forward 1, backward 2, transfers 0.5. Stage 0: F0 [0, 1], SA0 [1, 1.5],
    F1 [1.5, 2.5], SA1 [3, 3.5] once stage 1 has sent its SA0 [2.5, 3]; stage 1: F1
    [3.5, 4.5], SA1 [4.5, 5]; stage 2: F0 [3, 4], F1 [5, 6], B0 [6, 8], SG0 [8, 8.5], B1
    [8.5, 10.5]; stage 1: B0 [8.5, 10.5], SG0 [10.5, 11], SG1 [11, 11.5] (stage 2 waits in
    it from 10.5), B1 [11.5, 13.5], SG1 [13.5, 14]; stage 0: B0 [11, 13], B1 [14, 16].
    A separate recompute of 0.5 before each backward adds 0.5 to each backward: 18."""
    s = _uniform(3, 2, 1.0, 2.0, 0.5, schedule="gpipe", p2p_mode="blocking",
                 recompute_s=recompute)
    extra = 0.0 if recompute is None else 0.5
    assert _starts(s, 2, "forward") == pytest.approx([3.0, 5.0], abs=1e-12)
    assert _starts(s, 1, "forward") == pytest.approx([1.5, 3.5], abs=1e-12)
    assert _starts(s, 0, "backward") == pytest.approx([11.0 + 3 * extra, 14.0 + 4 * extra],
                                                      abs=1e-12)
    assert s.iteration_time_s == pytest.approx(16.0 + 4 * extra, abs=1e-12)


def test_p2p_mode_is_checked():
    kw = dict(forward_s=[1.0, 1.0], backward_s=[1.0, 1.0], optimizer_s=[0.0, 0.0], gas=2)
    assert P2P_MODES == ("async", "blocking", "paired")
    with pytest.raises(ValueError, match="p2p_mode 'isend'; known: async, blocking, paired"):
        simulate_iteration(**kw, p2p_mode="isend", use_numba=False)
    with pytest.raises(ValueError, match="Megatron-LM's 1F1B"):
        simulate_iteration(**kw, schedule="gpipe", p2p_mode="paired", use_numba=False)
    # one stage: nothing to block on, gpipe or not
    one = dict(forward_s=[1.0], backward_s=[1.0], optimizer_s=[0.0], gas=2, schedule="gpipe")
    assert simulate_iteration(**one, p2p_mode="blocking", use_numba=False).iteration_time_s == 4


# ------------------------------------------------------------------ paired P2P (Megatron-LM)

@pytest.mark.parametrize("pp,gas", [(1, 3), (2, 1), (2, 4), (3, 4), (4, 2), (5, 9)])
@pytest.mark.parametrize("recompute", [False, True])
def test_megatron_order_is_1f1b_with_each_transfer_once_on_both_sides(pp, gas, recompute):
    """The compute ops in schedule_order's 1F1B order; every transfer held by exactly one
    task of its sender and one of its receiver, in micro-batch order on each side; the
    steady state's tasks hold a send and a receive of one boundary."""
    kind, micro, flow, peer = megatron_order(pp, gas, recompute=recompute)
    ck, cm = schedule_order("1f1b", pp, gas, recompute=recompute)
    nb = (pp - 1) * gas
    held: dict = {}
    for j in range(pp):
        real = kind[j] != KINDS.index("idle")
        comp = real & (kind[j] <= 2)
        assert list(kind[j][comp]) == list(ck[j]) and list(micro[j][comp]) == list(cm[j])
        for k in np.flatnonzero(real & (kind[j] > 3)):
            fl = [int(x) for x in flow[j, k] if x >= 0]
            assert fl and all(min(j, peer[j, k]) == (x % nb) // gas for x in fl)
            for x in fl:
                held.setdefault(x, []).append(j)
    assert sorted(held) == list(range(2 * nb))
    for x, stages in held.items():
        b = (x % nb) // gas
        assert sorted(stages) == [b, b + 1]


def test_paired_two_stages_by_hand():
    """pp 2, gas 4, forward 1, backward 2, transfers 0.5, Megatron-LM's order: stage 0 F0
    SF0 F1 SFRB(1, 0) B0 F2 SFRB(2, 1) B1 F3 SFRB(3, 2) B2 RB3 B3, stage 1 RF0 F0 B0
    SBRF(0, 1) F1 B1 SBRF(1, 2) F2 B2 SBRF(2, 3) F3 B3 SB3. F0 [0, 1], SF0 [1, 1.5]; stage 1
    F0 B0 [1.5, 4.5] while stage 0 runs F1 and waits in SFRB from 2.5; both transfers of the
    pair [4.5, 5] (one each way); then every t + d = 3.5: stage 1's forwards start at 1.5, 5,
    8.5, 12; SB3 [15, 15.5], stage 0's B3 [15.5, 17.5]. The closed form with Megatron's share
    (gas - 1)(t + e / 2) + 2t + e = 10.5 + 6 + 1 = 17.5, the same; DeepSpeed's blocking
    order takes 19, free-running sends 17."""
    s = _uniform(2, 4, 1.0, 2.0, 0.5, p2p_mode="paired")
    assert s.iteration_time_s == pytest.approx(17.5, abs=1e-12)
    assert _starts(s, 1, "forward") == pytest.approx([1.5, 5.0, 8.5, 12.0], abs=1e-12)
    assert _starts(s, 0, "backward") == pytest.approx([5.0, 8.5, 12.0, 15.5], abs=1e-12)
    assert pipeline.pipeline_1f1b_time_s([3.0, 3.0], [1.0], 4,
                                  blocking_share=pipeline.P2P_BLOCKING_SHARE["megatron"]) == 17.5
    held = [(e.start_s, e.end_s) for e in s.events
            if e.stage == 0 and e.stream == "compute" and e.kind in ("send", "recv")]
    assert held == [(1.0, 1.5), (2.5, 5.0), (8.0, 8.5), (11.5, 12.0), (14.0, 15.5)]


@FAST
@given(pp=st.integers(2, 7), gas=st.integers(2, 12), f=st.floats(0.1, 2.0),
       b=st.floats(0.1, 4.0), d=st.floats(0.0, 3.0))
def test_paired_uniform_follows_the_closed_form_with_megatrons_share(pp, gas, f, b, d):
    """Uniform stages, Megatron-LM's paired P2P: every further micro-batch adds exactly the
    closed form's steady-state period with P2P_BLOCKING_SHARE["megatron"] (t + 2d inside,
    t + d for pp 2), and the closed form is within one d of the simulation (its fill and
    drain; above or below: with d > t the cycle bound rules and the pairs' fill costs more);
    it lies between free-running and DeepSpeed's blocking P2P. Random cases, not proven."""
    t, e = f + b, [2 * d] * (pp - 1)
    share = pipeline.P2P_BLOCKING_SHARE["megatron"]
    one, more = (_uniform(pp, g, f, b, d, p2p_mode="paired").iteration_time_s
                 for g in (gas, gas + 1))
    assert more - one == pytest.approx(pipeline.steady_state_period_s([t] * pp, e,
                                                               blocking_share=share),
                                       rel=1e-9, abs=1e-9)
    closed = pipeline.pipeline_1f1b_time_s([t] * pp, e, gas, blocking_share=share)
    assert abs(closed - one) <= d + 1e-9
    assert _uniform(pp, gas, f, b, d).iteration_time_s - 1e-9 <= one \
        <= _uniform(pp, gas, f, b, d, p2p_mode="blocking").iteration_time_s + 1e-9


def test_paired_compiled_equals_python():
    rng = np.random.default_rng(8)
    for n in range(16):
        kw = _random_case(rng, shared=n % 2 == 0)
        kw.update(schedule="1f1b", p2p_mode="paired")
        a = simulate_iteration(**kw)
        b = simulate_iteration(**kw, use_numba=False)
        assert a.iteration_time_s == b.iteration_time_s
        assert a.critical_path == b.critical_path and a.exposed_comm_s == b.exposed_comm_s
        np.testing.assert_array_equal(a.table.end_s, b.table.end_s)
        segs = a.critical_path_segments()
        assert sum(x[5] for x in segs) == pytest.approx(a.makespan_s, rel=1e-9)
        for j in range(a.pp):
            assert -1e-9 <= a.exposed_comm_s[j] <= a.idle_s[j] + 1e-9
