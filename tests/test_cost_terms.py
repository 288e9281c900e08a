"""Each formula lives once in cost_models/; the array forms the planner uses equal the scalar
ones, and the planner's breakdown is made of them."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from cost_models import comm
from cost_models import pipeline
from cost_models.compute import microbatch_time_s
from conftest import ROOT, load_benchmark


@pytest.mark.parametrize("collective", comm.COLLECTIVES)
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_collective_arrays_equal_scalars(collective, n):
    sizes = np.array([[1e3, 1e6], [5e7, 3e9]])
    bw = np.array([[1e9], [2.5e10]])
    lat = np.array([[1e-5], [3e-6]])
    vec = comm.collective_time_s(collective, sizes, n, bw, lat, messages=3)
    for i in range(2):
        for k in range(2):
            one = comm.collective_time_s(collective, float(sizes[i, k]), n, float(bw[i, 0]),
                                      float(lat[i, 0]), messages=3)
            assert vec[i, k] == pytest.approx(one)


def test_ring_factors_once():
    # AMP eq. 3: 2(n-1)M/(nB); all-gather and reduce-scatter half of it; p2p M/B
    assert comm.allreduce_time_s(8e9, 4, 1e9) == pytest.approx(2 * 3 * 8 / 4)
    assert comm.allgather_time_s(8e9, 4, 1e9) == pytest.approx(3 * 8 / 4)
    assert comm.reduce_scatter_time_s(8e9, 4, 1e9, 1e-3) == pytest.approx(3 * 8 / 4 + 3e-3)
    assert comm.p2p_time_s(1e9, 1e9, 1e-3) == pytest.approx(1.001)
    assert comm.stage_boundary_time_s(1e9, 1e9, 1e-3) == pytest.approx(2.002)
    assert comm.allreduce_time_s(8e9, 1, 1e9, 1.0) == 0
    assert comm.allreduce_time_s(0.0, 4, 1e9, 1e-3, messages=2) == pytest.approx(2 * 6e-3)
    # the link fits of measured profiles use the same factors
    from amp_search.profiling.store import LinkFit
    fit = LinkFit(collective="all_gather", link="intra", alpha_s=2e-5, bandwidth_bytes_per_s=5e9)
    assert fit.time_s(1e6, 4) == pytest.approx(comm.allgather_time_s(1e6, 4, 5e9, 2e-5))


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("bf16", [False, True])
def test_data_parallel_sync_vectorised_and_linear(zero, bf16):
    bw = np.array([1e9, 5e9, 2e10])
    lat = np.array([1e-5, 0.0, 2e-4])
    kw = dict(n=4, zero_stage=zero, gas=3, gather_weights_after_step=bf16)
    vec = comm.data_parallel_sync_time_s(param_bytes=2e8, grad_bytes=2e8,
                                      bandwidth_bytes_per_s=bw, latency_s=lat, **kw)
    for j in range(3):
        one = comm.data_parallel_sync_time_s(param_bytes=2e8, grad_bytes=2e8,
                                          bandwidth_bytes_per_s=float(bw[j]),
                                          latency_s=float(lat[j]), **kw)
        assert vec[j] == pytest.approx(one)
    # linear in the bytes: what the planner's per-layer form relies on
    f = lambda b: comm.data_parallel_sync_time_s(  # noqa: E731
        param_bytes=b, grad_bytes=b, bandwidth_bytes_per_s=bw, latency_s=lat, **kw)
    np.testing.assert_allclose(f(3e8) - f(0.0), 3 * (f(1e8) - f(0.0)), rtol=1e-9)
    assert np.all(comm.data_parallel_sync_time_s(param_bytes=1.0, grad_bytes=1.0, n=1,
                                              bandwidth_bytes_per_s=bw, latency_s=lat,
                                              zero_stage=zero, gas=3) == 0)


def test_pipeline_composition_equals_eq5_by_hand():
    per_layer = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
    bounds = (0, 1, 4)
    t = pipeline.stage_totals(per_layer, bounds)
    np.testing.assert_allclose(t, [1.0, 6.0])
    cut = np.zeros((2, 5))
    cut[1, 1] = 0.5
    e = pipeline.boundary_times(cut, bounds)
    np.testing.assert_allclose(e, [0.5])
    # eq. 5: (gas-1) max t + sum e + sum t
    assert pipeline.pipeline_time_s(t, e, gas=4) == pytest.approx(3 * 6 + 0.5 + 7)
    # eq. 4: plus the slowest stage's sync + step, plus a fixed step overhead
    assert pipeline.iteration_time_s(25.5, np.array([0.2, 0.7]), 0.1) == pytest.approx(26.3)
    assert microbatch_time_s(1.0, 2.0, True) == 4.0 and microbatch_time_s(1.0, 2.0, False) == 3


def test_planner_breakdown_is_the_composition_of_the_terms():
    """The estimate's parts are the cost_models terms on the chosen split."""
    from amp_search import estimate, load_spec
    from amp_search.costing import CostModel
    from amp_search.search_space import Candidate

    spec = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    e = estimate(spec, pp=4, dp=2, tmp=2, mbs=2, placement_order="listed")
    s = e.strategy
    model = CostModel(spec)
    c = Candidate(pp=s.pp, dp=s.dp, tmp=s.tmp, mbs=s.mbs, zero_stage=s.zero_stage,
                  activation_checkpointing=s.activation_checkpointing)
    placement = np.array(s.placement)
    costs = model.stage_costs(c, model.layout(c, placement=placement))
    t = pipeline.stage_totals(costs.layer_s, s.partition)
    np.testing.assert_allclose(t, e.stage_time_s)
    after = costs.sync_fixed_s + pipeline.stage_totals(costs.after_pipeline_s, s.partition)
    cuts = pipeline.boundary_times(costs.cut_s, s.partition)
    expect = pipeline.pipeline_1f1b_time_s(t, cuts, s.gas) + after.max()
    assert e.iteration_time_s == pytest.approx(expect)
    b = e.breakdown
    assert b.data_parallel_s + b.optimizer_s == pytest.approx(after.max())
    # the steady state's P2P is in the breakdown's p2p, and the parts add up to the total
    eq5 = pipeline.pipeline_time_s(t, cuts, s.gas)
    assert b.p2p_s == pytest.approx(cuts.sum() + (expect - after.max() - eq5))
    assert b.p2p_s > cuts.sum() > 0          # 10 Gbps between stages: it shows
    parts = b.compute_s + b.pipeline_bubble_s + b.p2p_s + b.tensor_parallel_s \
        + b.data_parallel_s + b.optimizer_s
    assert parts == pytest.approx(e.iteration_time_s)


def test_cost_models_imports_nothing_from_amp_search():
    for path in (ROOT / "cost_models").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] == "amp_search" for n in names), path


def test_the_ring_factor_is_written_once():
    """2(n-1)/n appears only in cost_models/comm.py."""
    hits = []
    for path in list((ROOT / "amp_search").rglob("*.py")) + list(
            (ROOT / "cost_models").glob("*.py")):
        text = path.read_text()
        for needle in ("2 * (n - 1) / n", "2.0 * (n - 1) / n", "2 * (n - 1) * "):
            if needle in text:
                hits.append(Path(path).relative_to(ROOT).as_posix())
    assert set(hits) <= {"cost_models/comm.py"}, hits


# ----------------------------------------------------------------------------- GPU fidelity

def _block(h=1024, s=1024, a=16):
    from cost_models.layers import Layer
    return Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
                 ffn_hidden_size=4 * h)


def test_gemm_efficiency_rises_with_size_and_saturates():
    from cost_models.compute import gemm_efficiency
    kw = dict(max_efficiency=0.8, half_flops=2e9)
    assert gemm_efficiency(2e9, **kw) == pytest.approx(0.4)
    assert gemm_efficiency(2e12, **kw) == pytest.approx(0.8, rel=1e-2)
    assert gemm_efficiency(1e8, **kw) < gemm_efficiency(1e9, **kw) < gemm_efficiency(1e10, **kw)


def test_standard_attention_is_memory_bound_on_the_scores():
    """Unfused attention moves 6g + 1 bytes per score element per forward (13 B in fp16); a
    fused kernel moves none and pays the core's FLOPs instead."""
    from cost_models.compute import DeviceSpeed, analytic_layer_time, standard_attention_bytes
    dev = DeviceSpeed(peak_flops_per_s=312e12, memory_bandwidth_bytes_per_s=2e12)
    b = _block()
    std = analytic_layer_time(b, tmp=1, mbs=1, device=dev, bytes_per_element=2,
                              attention="standard")
    flash = analytic_layer_time(b, tmp=1, mbs=1, device=dev, bytes_per_element=2,
                                attention="flash")
    scores = 16 * 1024 * 1024
    assert standard_attention_bytes(2) == 13
    core = 4 * 1024 ** 2 * 1024
    eff = 0.8 * core / (core + 2e9)
    assert std.forward_s - flash.forward_s == pytest.approx(
        scores * 13 / 2e12 - core / (312e12 * eff))
    assert std.backward_s == pytest.approx(2 * std.forward_s)


def test_host_and_device_overlap_and_fixed_costs():
    from cost_models.compute import (HostCosts, block_passes, host_time_s,
                                     kernel_floor_time_s, overlapped_time_s)
    from cost_models.layers import Layer
    b = _block()
    host = HostCosts(block_pass_s=1e-3, tp_allreduce_per_rank_s=2e-5)
    assert block_passes(b, False) == 2 and block_passes(b, True) == 3
    assert host_time_s(b, tmp=1, recompute=True, host=host) == pytest.approx(3e-3)
    # 6 all-reduces with recomputation (2 forward, 2 recomputed forward, 2 backward), 3 ranks
    assert host_time_s(b, tmp=4, recompute=True, host=host) == pytest.approx(3e-3 + 6 * 3 * 2e-5)
    head = Layer(kind="head", seq_length=8, hidden_size=8, vocab_size=64)
    emb = Layer(kind="embedding", seq_length=8, hidden_size=8, vocab_size=64)
    assert host_time_s(head, tmp=2, recompute=True, host=host) == pytest.approx(1e-3)
    assert host_time_s(emb, tmp=2, recompute=True, host=host) == 0
    assert kernel_floor_time_s(b, recompute=False, kernel_floor_s=3e-4) == pytest.approx(6e-4)
    assert kernel_floor_time_s(head, recompute=False, kernel_floor_s=3e-4) == 0
    np.testing.assert_allclose(overlapped_time_s(np.array([1.0, 5.0]), np.array([2.0, 3.0])),
                               [2.0, 5.0])


def test_each_microbatch_starts_in_step_with_the_host():
    """The forward and the backward overlap the host each on its own (the input's blocking
    copy syncs every micro-batch): a host-bound forward (1 ms host, 0.8 device) before a
    device-bound backward (2 host, 2.4 device) takes 1 + 2.4 = 3.4, not max(3, 3.2); where
    both passes lean the same way it is the plain max. The host time splits by pass: a
    block's passes each one block_pass_s and their own all-reduces, the head half a pass's
    worth in forward and in backward."""
    from cost_models.compute import (HostCosts, host_time_by_pass_s, host_time_s,
                                     overlapped_time_s, synced_overlapped_time_s)
    from cost_models.layers import Layer
    assert synced_overlapped_time_s(1.0, 0.8, 3.0, 3.2) == pytest.approx(3.4)
    assert overlapped_time_s(3.0, 3.2) == pytest.approx(3.2)
    assert synced_overlapped_time_s(1.0, 0.5, 3.0, 1.5) == pytest.approx(3.0)
    assert synced_overlapped_time_s(1.0, 1.2, 3.0, 3.6) == pytest.approx(3.6)
    np.testing.assert_allclose(synced_overlapped_time_s(np.zeros(2), np.array([1.0, 2.0]),
                                                        np.zeros(2), np.array([3.0, 5.0])),
                               [3.0, 5.0])     # no host costs: the device time
    b = _block()
    host = HostCosts(block_pass_s=1e-3, tp_allreduce_per_rank_s=2e-5)
    one = 1e-3 + 2 * 3 * 2e-5                  # a pass's 2 all-reduces over 4 ranks
    assert host_time_by_pass_s(b, tmp=4, recompute=True, host=host) == \
        pytest.approx((one, one, one))
    assert host_time_by_pass_s(b, tmp=4, recompute=False, host=host) == \
        pytest.approx((one, one, 0.0))
    assert sum(host_time_by_pass_s(b, tmp=4, recompute=True, host=host)) == \
        pytest.approx(host_time_s(b, tmp=4, recompute=True, host=host))
    head = Layer(kind="head", seq_length=8, hidden_size=8, vocab_size=64)
    assert host_time_by_pass_s(head, tmp=2, recompute=True, host=host) == \
        pytest.approx((5e-4, 5e-4, 0.0))


def test_recomputation_replays_the_forward_all_reduces():
    from cost_models.layers import tp_allreduce_elements
    b = _block()
    assert len(tp_allreduce_elements(b)) == 4 and len(tp_allreduce_elements(b, True)) == 6


def test_small_layers_are_host_bound_large_ones_device_bound():
    """With the catalog's fixed costs, each pass of a layer takes max(host, device + TP): a
    small model's iteration time follows the host's, a large one's the FLOPs; in between
    (hidden 2048 at micro-batch 1 on an A100) the forward is host-bound and the backward
    device-bound, and a micro-batch takes the forward's host time plus the backward's device
    time, more than the max of the totals."""
    from amp_search.costing import CostModel
    from amp_search.search_space import Candidate
    from amp_search.spec import parse_spec
    from cost_models.params import CostParams

    def spec(h):
        return parse_spec({
            "cluster": {"nodes": [{"gpu": "A100-80GB", "gpus_per_node": 1,
                                   "intra_node_bandwidth": "150 GB/s"}]},
            "model": {"preset": "gpt", "num_layers": 4, "hidden_size": h,
                      "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 51200},
            "training": {"global_batch_size": 1, "precision": "fp16"}})

    c = Candidate(pp=1, dp=1, tmp=1, mbs=1, zero_stage=0, activation_checkpointing=False)
    for h, host_bound in ((256, True), (2048, None), (8192, False)):
        model = CostModel(spec(h))
        placement = np.zeros((1, 1, 1), dtype=np.int64)
        costs = model.stage_costs(c, model.layout(c, placement=placement))
        blocks = slice(1, 5)
        gpu = model.gpus[0]
        host = costs.host_s[0, blocks]
        assert np.all(host == pytest.approx(2 * gpu.host_block_pass_s))
        assert np.all(costs.host_forward_s[0, blocks] == pytest.approx(gpu.host_block_pass_s))
        device = costs.compute_s[0, blocks] + costs.tensor_parallel_s[0, blocks]
        forward = model.device_pass_times_s(gpu, c)[0, blocks]
        if host_bound is None:      # forward host-bound, backward device-bound
            assert np.all(forward < host / 2) and np.all(device - forward > host / 2)
            np.testing.assert_allclose(costs.layer_s[0, blocks],
                                       host / 2 + device - forward)
            assert np.all(costs.layer_s[0, blocks] > np.maximum(host, device))
        else:
            assert np.all((host > device) == host_bound), h
            np.testing.assert_allclose(costs.layer_s[0, blocks], np.maximum(host, device))
        # a fitted value replaces the catalog's
        model.params = CostParams(host_block_pass_s={gpu.name: 0.0})
        costs = model.stage_costs(c, model.layout(c, placement=placement))
        assert np.all(costs.host_s[0, blocks] == 0)


def test_attention_kind_is_a_spec_key_with_a_catalog_default(write_spec):
    """training.attention: auto follows the catalog (no FlashAttention before Ampere);
    standard attention stores 5 a s^2 b bytes per layer (Korthikanti et al.), which is what
    keeps GPT-2 345M at micro-batch 2 from fitting a 16 GB T4 without recomputation."""
    from amp_search import estimate, load_spec
    data = {"cluster": {"nodes": [{"gpu": "T4-16GB", "gpus_per_node": 1,
                                   "intra_node_bandwidth": "50 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 24, "hidden_size": 1024,
                      "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 50304},
            "training": {"global_batch_size": 2, "precision": "fp16"}}
    auto = load_spec(write_spec(data))
    t4 = auto.cluster.devices[0].gpu
    assert not t4.flash_attention and auto.attention_for(t4) == "standard"
    std = estimate(auto, pp=1, dp=1, tmp=1, mbs=2)
    flash = estimate(load_spec(write_spec({**data, "training": {
        **data["training"], "attention": "flash"}})), pp=1, dp=1, tmp=1, mbs=2)
    assert not std.fits and flash.fits
    extra = std.memory[0].activation_bytes - flash.memory[0].activation_bytes
    assert extra == pytest.approx(24 * 5 * 16 * 1024 ** 2 * 2, rel=0.01)   # 5 a s^2 b x 24
    assert std.iteration_time_s > flash.iteration_time_s


def test_catalog_model_keys_are_checked(write_spec):
    from amp_search import SpecError, load_spec
    gpu = {"name": "X", "memory": "16 GiB", "memory_bandwidth": "900 GB/s",
           "peak_tflops": {"fp16": 100}, "gemm_efficiency": {"max": 0.6, "half_at": "1 GFLOP"},
           "kernel_floor": "100 us", "host_time": {"block_pass": "300 us",
                                                   "tp_allreduce_per_rank": "5 us"},
           "flash_attention": False}
    data = {"cluster": {"nodes": [{"gpu": gpu, "gpus_per_node": 1,
                                   "intra_node_bandwidth": "50 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 64,
                      "num_attention_heads": 4, "seq_length": 16, "vocab_size": 128},
            "training": {"global_batch_size": 2, "precision": "fp16"}}
    g = load_spec(write_spec(data)).cluster.devices[0].gpu
    assert (g.gemm_max_efficiency, g.gemm_half_flops, g.kernel_floor_s, g.host_block_pass_s,
            g.host_tp_allreduce_per_rank_s, g.flash_attention) == pytest.approx(
        (0.6, 1e9, 1e-4, 3e-4, 5e-6, False))
    for key, value, message in (("kernel_floor", "5 s", "accepted: 0 s to 1 s"),
                                ("kernel_floor", 100, "bare number"),
                                ("gemm_efficiency", {"max": 1.5, "half_at": "1 GFLOP"}, "max"),
                                ("flash_attention", "yes", "accepted: true, false")):
        bad = {**data, "cluster": {"nodes": [{**data["cluster"]["nodes"][0],
                                              "gpu": {**gpu, key: value}}]}}
        with pytest.raises(SpecError, match=message):
            load_spec(write_spec(bad))
    # an inline GPU without them takes the catalog's defaults
    plain = {k: v for k, v in gpu.items() if k in ("name", "memory", "memory_bandwidth",
                                                   "peak_tflops")}
    d = load_spec(write_spec({**data, "cluster": {"nodes": [{**data["cluster"]["nodes"][0],
                                                             "gpu": plain}]}}))
    a100 = load_spec(ROOT / "configs" / "a100-gpt7b.yaml").cluster.devices[0].gpu
    assert d.cluster.devices[0].gpu.host_block_pass_s == a100.host_block_pass_s > 0


def test_vocabulary_is_padded_as_megatron_pads_it(write_spec):
    """GPT-2's 50,257 tokens: padded to a multiple of 128 x tmp instead of rejected; the
    parameter count and the trial model's embedding and head hold the padded shard."""
    from amp_search import estimate, load_spec
    from amp_search.trial.model import build_layer
    from cost_models.layers import Layer, padded_vocab_size, param_count

    assert [padded_vocab_size(50257, t) for t in (1, 2, 8)] == [50304, 50432, 51200]
    assert padded_vocab_size(51200, 4) == 51200
    spec = load_spec(write_spec({
        "cluster": {"nodes": [{"gpu": "A100-80GB", "gpus_per_node": 2,
                               "intra_node_bandwidth": "300 GB/s"}]},
        "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 64,
                  "num_attention_heads": 4, "seq_length": 16, "vocab_size": 50257},
        "training": {"global_batch_size": 4, "precision": "bf16"}}))
    assert estimate(spec, pp=1, dp=1, tmp=2, mbs=1).iteration_time_s > 0
    head = Layer(kind="head", seq_length=16, hidden_size=64, vocab_size=50257)
    emb = Layer(kind="embedding", seq_length=16, hidden_size=64, vocab_size=50257)
    assert param_count(head, 2) == 2 * 64 + (64 * 50432 + 50432) // 2
    for layer in (head, emb):
        module = build_layer(layer, simulate_tp_size=2)
        assert sum(p.numel() for p in module.parameters()) == param_count(layer, 2)


# ------------------------------------------------------------- steady-state P2P of 1F1B

def test_steady_state_period_hand_worked():
    """t = (3, 5, 4), e = (1, 2): stage 1 (the middle) waits for both boundaries."""
    t, e = [3.0, 5.0, 4.0], [1.0, 2.0]
    # DeepSpeed, blocking share 1: stage terms 3+1, 5+1+2, 4+2 -> 8
    assert pipeline.steady_state_period_s(t, e, blocking_share=1.0) == pytest.approx(8.0)
    # Megatron, share 0.5: 3.5, 6.5, 5 -> 6.5
    assert pipeline.steady_state_period_s(t, e, blocking_share=0.5) == pytest.approx(6.5)
    # async: the cycle bounds, stage 0 (3+5+4+1+2)/3 = 5, stage 1 (5+4+2)/2 = 5.5, stage 2
    # 4/1: the round trip behind stage 1 beats the bottleneck's 5 -> 5.5
    assert pipeline.steady_state_period_s(t, e, blocking_share=0.0) == pytest.approx(5.5)
    # T = (gas - 1) * period + sum e + sum t: gas 4, share 1 -> 3*8 + 3 + 12 = 39
    assert pipeline.pipeline_1f1b_time_s(t, e, 4, blocking_share=1.0) == pytest.approx(39.0)


def test_steady_state_reduces_to_eq5_without_p2p_or_with_one_microbatch():
    rng = np.random.default_rng(3)
    for _ in range(50):
        pp = int(rng.integers(1, 9))
        t = rng.uniform(0.1, 2.0, pp)
        e = rng.uniform(0.0, 1.0, pp - 1)
        gas = int(rng.integers(1, 40))
        for share in pipeline.P2P_BLOCKING_SHARE.values():
            assert pipeline.pipeline_1f1b_time_s(t, np.zeros(pp - 1), gas, blocking_share=share) \
                == pytest.approx(pipeline.pipeline_time_s(t, np.zeros(pp - 1), gas))
            assert pipeline.pipeline_1f1b_time_s(t, e, 1, blocking_share=share) \
                == pytest.approx(pipeline.pipeline_time_s(t, e, 1))
            assert pipeline.pipeline_1f1b_time_s(t, e, gas, blocking_share=share) \
                >= pipeline.pipeline_time_s(t, e, gas) - 1e-12


def test_steady_state_async_matches_the_simulator_on_uniform_stages():
    """Free-running sends (the simulator's model): 2d (pp-1)/pp per micro-batch beyond eq. 5,
    the 1F1B cycle bound; within 2% of the event simulation once gas >= pp, and above it."""
    from cost_models.simulator import simulate_iteration

    for pp, gas, d in ((2, 16, 1.0), (4, 16, 0.5), (4, 64, 0.1), (8, 16, 1.0), (8, 32, 2.0)):
        sim = simulate_iteration(forward_s=[1.0] * pp, backward_s=[2.0] * pp,
                                 optimizer_s=[0.0] * pp, gas=gas, p2p_bytes=[d] * (pp - 1),
                                 p2p_bandwidth_bytes_per_s=[1.0] * (pp - 1),
                                 p2p_latency_s=[0.0] * (pp - 1), use_numba=False)
        closed = pipeline.pipeline_1f1b_time_s([3.0] * pp, [2 * d] * (pp - 1), gas,
                                        blocking_share=0.0)
        assert closed == pytest.approx(sim.iteration_time_s, rel=0.02), (pp, gas, d)
        assert closed >= sim.iteration_time_s - 1e-9


def test_steady_state_rejects_mismatched_boundaries():
    with pytest.raises(ValueError, match="boundary"):
        pipeline.steady_state_period_s([1.0, 2.0], [0.1, 0.2], blocking_share=1.0)


# ------------------------------------------------------------- link latency and gradients

def test_link_latency_by_link_kind_from_the_catalog():
    from amp_search.spec import load_catalog

    cat = load_catalog()
    nccl = comm.NCCL_RING_STEP_LATENCY_S
    assert cat["A100-80GB"].link_latency_intra_s == pytest.approx(nccl["nvlink"])
    assert cat["T4-16GB"].link_latency_intra_s == pytest.approx(nccl["pcie"])
    assert cat["T4-16GB"].link_latency_inter_s == pytest.approx(nccl["network"])
    assert cat["CPU-local"].link_latency_intra_s == 0.0
    lat = comm.link_latency_s(np.array([True, False]), 3.4e-6, 9.6e-6)
    np.testing.assert_allclose(lat, [9.6e-6, 3.4e-6])
    # tp 8 all-reduce of 8 MB on NVLink at 150 GB/s: 14 steps x 3.4 us + 1.75 x 8e6 / 150e9
    t = comm.allreduce_time_s(8e6, 8, 150e9, nccl["nvlink"])
    assert t == pytest.approx(14 * 3.4e-6 + 1.75 * 8e6 / 150e9)


def test_planner_charges_the_catalog_latency_on_tensor_parallel_rings():
    """One A100 node, tp 8: each of a block's 6 all-reduces (recomputation replays 2) pays
    2(8-1) ring steps of 3.4 us over the bandwidth term."""
    from amp_search.costing import CostModel
    from amp_search.search_space import Candidate
    from amp_search.spec import parse_spec

    spec = parse_spec({
        "cluster": {"nodes": [{"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8,
                               "intra_node_bandwidth": "150 GB/s",
                               "intra_node_link": "measured",     # used as written
                               "inter_node_bandwidth": "200 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 4, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 51200},
        "training": {"global_batch_size": 8, "precision": "fp16",
                     "activation_checkpointing": "full", "zero_stage": 0}})
    model = CostModel(spec)
    c = Candidate(pp=1, dp=1, tmp=8, mbs=1, zero_stage=0, activation_checkpointing=True)
    from amp_search.placement import device_orders
    costs = model.stage_costs(c, model.layout(c, device_orders(spec.cluster, "fp16")[0]))
    block = 2          # embedding, then the blocks
    msg = 1024 * 1024 * 2                                 # s x h fp16, one sample
    expect = 6 * (14 * 3.4e-6 + 1.75 * msg / 150e9)
    assert costs.tensor_parallel_s[0, block] == pytest.approx(expect, rel=1e-6)


def test_gradient_reduce_precision_and_overlap_by_framework():
    g = comm.gradient_reduce_bytes_per_element
    assert g("fp16") == 2 and g("bf16") == 2 and g("fp32") == 4
    assert g("fp16", fp32_allreduce=True) == 4
    assert g("bf16", framework="megatron") == 4          # Megatron forces fp32 grads with bf16
    assert g("fp16", framework="megatron") == 2
    with pytest.raises(ValueError):
        g("fp16", framework="horovod")
    o = comm.gradient_reduce_overlaps_backward
    assert o() is False                                  # DeepSpeed ZeRO 0: after backward
    assert o(zero_stage=0, overlap_comm=True) is False   # ZeRO 0 never overlaps
    assert o(zero_stage=2) is False and o(zero_stage=2, overlap_comm=True) is True
    assert o(zero_stage=3) is True
    assert o(framework="megatron") is False


def test_catalog_link_latency_is_checked(tmp_path):
    """A catalog entry's link_latency needs both link kinds, as durations: one clear line."""
    from amp_search.errors import AmpSearchError
    from amp_search.spec import load_catalog

    entry = ("gpus:\n  X:\n    kind: gpu\n    memory: 16 GiB\n    memory_bandwidth: 900 GB/s\n"
             "    peak_tflops: {fp32: 15, fp16: 120}\n    link_latency: %s\n")
    path = tmp_path / "gpus.yaml"
    path.write_text(entry % "{intra: 2 us, inter: 12 us}")
    gpu = load_catalog(path)["X"]
    assert gpu.link_latency_intra_s == pytest.approx(2e-6)
    assert gpu.link_latency_inter_s == pytest.approx(12e-6)
    for bad, key in (("{intra: 2 us}", "inter"), ("{intra: 2 us, inter: -1 us}", "inter"),
                     ("{intra: 2 us, inter: 1 us, pcie: 3 us}", "pcie")):
        path.write_text(entry % bad)
        with pytest.raises(AmpSearchError, match=key) as info:
            load_catalog(path)
        assert "\n" not in str(info.value)


def _gpu_accuracy():
    return load_benchmark("gpu_accuracy")


def _row(dp, gbs, measured, predicted=None, tp=1, pp=1, mbs=1):
    return {"gpus": tp * pp * dp, "gbs": gbs, "mbs": mbs, "hidden": 1024, "heads": 16,
            "layers": 12, "seq": 1024, "tp": tp, "dp": dp, "pp": pp, "measured_ms": measured,
            "predicted_ms": predicted}


def test_twin_noise_from_runs_of_the_same_per_gpu_work():
    """dp 2 -> 4 -> 8 at 4 samples per replica: |log| of 100 -> 101 -> 99, and another shape's
    pair 50 -> 50: median of (0.995%, 2.000%, 0) is 0.995%."""
    G = _gpu_accuracy()
    rows = [_row(2, 8, 100.0), _row(4, 16, 101.0), _row(8, 32, 99.0),
            _row(2, 8, 50.0, tp=2), _row(4, 16, 50.0, tp=2),
            _row(2, 4, 70.0)]                         # 2 samples per replica: no twin
    t = G.twin_noise(rows)
    assert t["pairs"] == 3
    assert t["median"] == pytest.approx(np.log(101 / 100))


def test_noise_aware_regret_beside_the_strict_one():
    """One group; the model picks a row 2% slower than the best: strict regret 2%, less 0.5%
    of noise 1.5%; a 0.4% miss is no error once the noise is 0.5%."""
    G = _gpu_accuracy()
    rows = [_row(2, 8, 102.0, 90.0), _row(2, 8, 100.0, 95.0, mbs=2), _row(2, 8, 110.0, 99.0,
                                                                           mbs=4)]
    f = G.figures(rows, noise=0.005)
    (g,) = f["groups"]
    assert g["regret"] == pytest.approx(0.02)
    assert g["regret_beyond_noise"] == pytest.approx(0.015)
    assert f["regret_groups_above_target"] == 0
    rows[0]["measured_ms"] = 100.4
    g = G.figures(rows, noise=0.005)["groups"][0]
    assert g["regret"] == pytest.approx(0.004) and g["regret_beyond_noise"] == 0.0


def test_per_shape_yardstick_learns_block_and_head_time_from_the_other_models():
    """Measured = predicted + 0.5 ms per block micro-batch + 3 ms per head micro-batch on the
    critical path, in the cell (1024, tp 1, mbs 1): learned on the 12-layer models, the
    24-layer ones come out exact. A cell the fitting half lacks (mbs 2) keeps the
    prediction."""
    G = _gpu_accuracy()

    def row(layers, pp, gbs, mbs=1, predicted=100.0):
        r = dict(_row(1, gbs, 0.0, predicted, pp=pp, mbs=mbs), layers=layers)
        nmb = gbs / mbs
        r["measured_ms"] = predicted + (0.5 * layers / pp + 3.0) * (nmb + pp - 1) \
            if mbs == 1 else predicted * 1.2
        return r

    rows = [row(12, 1, 4), row(12, 2, 8), row(12, 1, 8),
            row(24, 1, 4), row(24, 2, 8), row(24, 2, 4),
            row(24, 1, 4, mbs=2, predicted=50.0)]
    out = G.per_shape_ceiling(rows)
    learned = out["per (hidden, tp, mbs), layers 12,16 -> 20,24"]
    assert learned["rows"] == 4 and learned["cells"] == 1
    # 3 rows exact, the unlearned one 1/1.2 - 1 off
    assert learned["mape"] == pytest.approx((1 - 1 / 1.2) / 4)
    # the other way round: the 24-layer models hold 2 cells, the mbs 2 one with a single row
    assert out["per (hidden, tp, mbs), layers 20,24 -> 12,16"]["cells"] == 1
    # per pipeline degree too: (1024, 1, 1, pp 1) and (..., pp 2) each from their own rows
    fine = out["per (hidden, tp, mbs, pp), layers 12,16 -> 20,24"]
    assert fine["cells"] == 1 and fine["rows"] == 4   # pp 2 has a single 12-layer row


def test_megatron_memory_traffic_is_counted_for_its_fused_kernels():
    """Under megatron a block's memory-bound ops move what its fused bias-GeLU and
    bias-dropout-add kernels move, (12g + 2) s h + 2g s f/t forward and (20g + 2) s h + 4g s f/t
    backward; the trial layers (deepspeed) keep their count, twice the forward backward."""
    from cost_models.layers import elementwise_bytes, elementwise_bytes_by_pass
    b = _block()
    s, h, f = 1024, 1024, 4096
    fwd, bwd = elementwise_bytes_by_pass(b, 2, 2, "megatron")
    assert fwd == 26 * s * h + 4 * s * f / 2
    assert bwd == 42 * s * h + 8 * s * f / 2
    assert 1.5 < bwd / fwd < 2.0
    assert elementwise_bytes_by_pass(b, 2, 2) == (elementwise_bytes(b, 2, 2),
                                                  2 * elementwise_bytes(b, 2, 2))
    with pytest.raises(ValueError, match="framework"):
        elementwise_bytes_by_pass(b, 1, 2, "jax")


def test_megatron_standard_attention_backward_moves_19_bytes_per_score():
    """Unfused attention's backward moves 9g + 1 bytes per score element (19 B in fp16), not
    twice the forward's 13; GEMMs still take twice their forward time."""
    from cost_models.compute import (DeviceSpeed, analytic_layer_time,
                                     standard_attention_backward_bytes)
    from cost_models.layers import elementwise_bytes_by_pass
    dev = DeviceSpeed(peak_flops_per_s=312e12, memory_bandwidth_bytes_per_s=2e12)
    b = _block()
    assert standard_attention_backward_bytes(2) == 19
    t = analytic_layer_time(b, tmp=1, mbs=1, device=dev, bytes_per_element=2,
                            attention="standard", framework="megatron")
    ew_f, ew_b = elementwise_bytes_by_pass(b, 1, 2, "megatron")
    scores = 16 * 1024 * 1024
    gemm = t.forward_s - ew_f / 2e12 - scores * 13 / 2e12
    assert t.backward_s == pytest.approx(2 * gemm + ew_b / 2e12 + scores * 19 / 2e12)
    ds = analytic_layer_time(b, tmp=1, mbs=1, device=dev, bytes_per_element=2,
                             attention="standard")
    assert t.forward_s < ds.forward_s and t.backward_s < ds.backward_s


def test_the_spec_backend_chooses_the_memory_traffic_of_analytic_layers():
    """LayerTimer costs an analytic layer with the spec's framework: megatron's fused kernels
    move fewer bytes than the trial layers, so its blocks are faster; GEMM-only layers equal."""
    import dataclasses
    from pathlib import Path

    from amp_search.spec import load_spec
    from amp_search.costing.layer_times import LayerTimer
    spec = load_spec(Path(__file__).resolve().parent.parent / "configs" / "a100-gpt7b.yaml")
    mega = dataclasses.replace(spec, training=dataclasses.replace(spec.training,
                                                                  backend="megatron"))
    gpu = spec.cluster.nodes[0].gpu
    ds_t = LayerTimer(spec).times(gpu, 2, 1)
    mg_t = LayerTimer(mega).times(gpu, 2, 1)
    blocks = [i for i, l in enumerate(spec.model.layers) if l.kind == "transformer"]
    assert all(mg_t.forward_s[i] < ds_t.forward_s[i] for i in blocks)
    assert all(mg_t.backward_s[i] < ds_t.backward_s[i] for i in blocks)


def test_the_datas_own_microbatch_time_is_the_slope_over_the_microbatches():
    """A layout at mbs 1: 4 and 8 micro-batches per pipeline (dp 2, gbs 8 and 16) take 100 and
    180 ms, 20 ms a micro-batch; at mbs 2, 2 and 4 micro-batches take 60 and 92 ms, 16 ms: a
    micro-batch of twice the samples 20% faster, flagged; at mbs 4, 1 and 2 micro-batches 50
    and 70 ms, 20 ms (+25% against mbs 2), not flagged. A cell measured at one global batch
    has no slope."""
    G = _gpu_accuracy()
    rows = [_row(2, 8, 100.0), _row(2, 16, 180.0), _row(2, 8, 60.0, mbs=2),
            _row(2, 16, 92.0, mbs=2), _row(2, 8, 50.0, mbs=4), _row(2, 16, 70.0, mbs=4),
            _row(2, 8, 40.0, tp=2)]
    times = G.microbatch_times(rows)
    cell = (1024, 12, 16, 1024, 2, 1, 2, 1)
    assert times[cell + (1,)] == pytest.approx(20.0)
    assert times[cell + (2,)] == pytest.approx(16.0)
    assert times[cell + (4,)] == pytest.approx(20.0)
    assert len(times) == 3                   # tp 2: one global batch
    (faster,) = G.larger_microbatch_faster(rows)
    assert (faster["mbs_small"], faster["mbs_large"]) == (1, 2)
    assert faster["change"] == pytest.approx(-0.2)
    assert G.larger_microbatch_faster(rows, tolerance=0.25) == []


def test_top_3_misses_say_whether_their_best_is_such_a_microbatch():
    """One group whose three predicted fastest are the mbs-1 rows and whose measured best is the
    mbs-2 row of gbs 16 (16 ms a micro-batch, against 20 at mbs 1): the top 3 miss it, and its
    measured best runs on the larger micro-batch that is faster; the miss is the benchmark's
    one target left (misses)."""
    G = _gpu_accuracy()
    rows = [_row(2, 16, 180.0, 10.0), _row(2, 16, 181.0, 11.0, tp=2),
            _row(2, 16, 182.0, 12.0, pp=2), _row(2, 16, 92.0, 50.0, mbs=2),
            _row(2, 8, 100.0, 60.0), _row(2, 8, 60.0, 70.0, mbs=2)]
    for r in rows:
        r["gpus"] = 8
    f = G.figures(rows, noise=0.0)
    m = G.data_monotonicity(rows, f)
    assert m["pairs"] == 1 and len(m["larger_microbatch_faster"]) == 1
    (miss,) = [g for g in m["top_k_missed"] if "gbs16" in g["group"]]
    assert miss["measured_best"] == "tp1 dp2 pp1 mbs2"
    assert miss["best_on_a_faster_larger_microbatch"]
    assert any("best of the top 3" in x for x in G.misses(f))


def test_best_of_the_top_k_is_what_launch_top_k_keeps():
    """Predicted order 90 < 95 < 99: top-1 picks the 102 ms row (regret 2%), the top 2 hold the
    measured best (0%); a group whose fastest row is predicted last needs all three."""
    G = _gpu_accuracy()
    rows = [_row(2, 8, 102.0, 90.0), _row(2, 8, 100.0, 95.0, mbs=2),
            _row(2, 8, 110.0, 99.0, mbs=4),
            _row(2, 8, 130.0, 10.0, tp=2), _row(2, 8, 120.0, 11.0, tp=2, mbs=2),
            _row(2, 8, 100.0, 12.0, tp=2, mbs=4)]
    for r in rows[3:]:
        r["hidden"] = 2048                        # a second group
    f = G.figures(rows, noise=0.0)
    a, b = sorted(f["groups"], key=lambda g: g["group"])
    assert a["top_k_regret"][2] == 0.0 and a["regret"] == pytest.approx(0.02)
    assert b["top_k_regret"][2] == pytest.approx(0.2) and b["top_k_regret"][3] == 0.0
    assert f["top_k"][2] == {"worst": pytest.approx(0.2), "groups_above_target": 1}
    assert f["top_k"][3]["groups_above_target"] == 0


def test_a_gemm_too_small_for_its_efficiency_costs_the_fixed_time():
    """A custom layer's forward_flops of 5e-324 (found by the spec fuzz): eff(F) underflows
    to 0, the time is the limit (F + F_half) / (peak eff_max), not a division by zero."""
    from cost_models.compute import DeviceSpeed, gemm_time_s

    d = DeviceSpeed(peak_flops_per_s=19.5e12, memory_bandwidth_bytes_per_s=1e12)
    fixed = d.gemm_half_flops / (d.peak_flops_per_s * d.gemm_max_efficiency)
    assert gemm_time_s(5e-324, d) == pytest.approx(fixed)
    assert gemm_time_s(1e-300, d) == pytest.approx(fixed)


def test_unfused_attention_gemms_at_the_roofline():
    """Unfused attention's two batched GEMMs take the longer of their FLOPs and their bytes:
    memory-bound at a small head width (the bytes-only count, 6g+1 and 9g+1 per score),
    compute-bound at a large one, where the time grows with the FLOPs."""
    from cost_models.compute import (DeviceSpeed, score_gemm_flops, standard_attention_bytes,
                                     standard_attention_backward_bytes,
                                     standard_attention_times_s)
    from cost_models.layers import Layer, attention_score_elements
    dev = DeviceSpeed(peak_flops_per_s=312e12, memory_bandwidth_bytes_per_s=2.0e12,
                      gemm_max_efficiency=0.8, gemm_half_flops=2e9)
    narrow = Layer(kind="transformer", hidden_size=1024, num_attention_heads=32,
                   seq_length=2048, ffn_hidden_size=4096, vocab_size=1)      # d = 32
    fwd, bwd = standard_attention_times_s(narrow, tmp=1, mbs=1, device=dev, bytes_per_element=2)
    e = attention_score_elements(narrow, 1)
    assert fwd == pytest.approx(e * standard_attention_bytes(2) / 2.0e12)
    assert bwd == pytest.approx(e * standard_attention_backward_bytes(2) / 2.0e12)
    wide = Layer(kind="transformer", hidden_size=8192, num_attention_heads=32,
                 seq_length=2048, ffn_hidden_size=4096, vocab_size=1)        # d = 256
    fwd, bwd = standard_attention_times_s(wide, tmp=1, mbs=1, device=dev, bytes_per_element=2)
    e = attention_score_elements(wide, 1)
    assert fwd > e * standard_attention_bytes(2) / 2.0e12
    f = score_gemm_flops(wide, 1)
    gemm = f / (312e12 * 0.8 * f / (f + 2e9))
    assert fwd == pytest.approx(2 * gemm + 9 * e / 2.0e12)
    assert bwd == pytest.approx(4 * gemm + 11 * e / 2.0e12)
