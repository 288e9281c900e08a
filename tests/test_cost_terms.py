"""Each formula lives once in cost_models/; the array forms the planner uses equal the scalar
ones, and the planner's breakdown is made of them."""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from cost_models import comm as C
from cost_models import pipeline as P
from cost_models.compute import microbatch_time_s
from conftest import ROOT


@pytest.mark.parametrize("collective", C.COLLECTIVES)
@pytest.mark.parametrize("n", [1, 2, 3, 8])
def test_collective_arrays_equal_scalars(collective, n):
    sizes = np.array([[1e3, 1e6], [5e7, 3e9]])
    bw = np.array([[1e9], [2.5e10]])
    lat = np.array([[1e-5], [3e-6]])
    vec = C.collective_time_s(collective, sizes, n, bw, lat, messages=3)
    for i in range(2):
        for k in range(2):
            one = C.collective_time_s(collective, float(sizes[i, k]), n, float(bw[i, 0]),
                                      float(lat[i, 0]), messages=3)
            assert vec[i, k] == pytest.approx(one)


def test_ring_factors_once():
    # AMP eq. 3: 2(n-1)M/(nB); all-gather and reduce-scatter half of it; p2p M/B
    assert C.allreduce_time_s(8e9, 4, 1e9) == pytest.approx(2 * 3 * 8 / 4)
    assert C.allgather_time_s(8e9, 4, 1e9) == pytest.approx(3 * 8 / 4)
    assert C.reduce_scatter_time_s(8e9, 4, 1e9, 1e-3) == pytest.approx(3 * 8 / 4 + 3e-3)
    assert C.p2p_time_s(1e9, 1e9, 1e-3) == pytest.approx(1.001)
    assert C.stage_boundary_time_s(1e9, 1e9, 1e-3) == pytest.approx(2.002)
    assert C.allreduce_time_s(8e9, 1, 1e9, 1.0) == 0
    assert C.allreduce_time_s(0.0, 4, 1e9, 1e-3, messages=2) == pytest.approx(2 * 6e-3)
    # the link fits of measured profiles use the same factors
    from amp_search.profiling.store import LinkFit
    fit = LinkFit(collective="all_gather", link="intra", alpha_s=2e-5, bandwidth_bytes_per_s=5e9)
    assert fit.time_s(1e6, 4) == pytest.approx(C.allgather_time_s(1e6, 4, 5e9, 2e-5))


@pytest.mark.parametrize("zero", [0, 1, 2, 3])
@pytest.mark.parametrize("bf16", [False, True])
def test_data_parallel_sync_vectorised_and_linear(zero, bf16):
    bw = np.array([1e9, 5e9, 2e10])
    lat = np.array([1e-5, 0.0, 2e-4])
    kw = dict(n=4, zero_stage=zero, gas=3, gather_weights_after_step=bf16)
    vec = C.data_parallel_sync_time_s(param_bytes=2e8, grad_bytes=2e8,
                                      bandwidth_bytes_per_s=bw, latency_s=lat, **kw)
    for j in range(3):
        one = C.data_parallel_sync_time_s(param_bytes=2e8, grad_bytes=2e8,
                                          bandwidth_bytes_per_s=float(bw[j]),
                                          latency_s=float(lat[j]), **kw)
        assert vec[j] == pytest.approx(one)
    # linear in the bytes: what the planner's per-layer form relies on
    f = lambda b: C.data_parallel_sync_time_s(  # noqa: E731
        param_bytes=b, grad_bytes=b, bandwidth_bytes_per_s=bw, latency_s=lat, **kw)
    np.testing.assert_allclose(f(3e8) - f(0.0), 3 * (f(1e8) - f(0.0)), rtol=1e-9)
    assert np.all(C.data_parallel_sync_time_s(param_bytes=1.0, grad_bytes=1.0, n=1,
                                              bandwidth_bytes_per_s=bw, latency_s=lat,
                                              zero_stage=zero, gas=3) == 0)


def test_pipeline_composition_equals_eq5_by_hand():
    per_layer = np.array([[1.0, 2.0, 3.0, 4.0], [2.0, 2.0, 2.0, 2.0]])
    bounds = (0, 1, 4)
    t = P.stage_totals(per_layer, bounds)
    np.testing.assert_allclose(t, [1.0, 6.0])
    cut = np.zeros((2, 5))
    cut[1, 1] = 0.5
    e = P.boundary_times(cut, bounds)
    np.testing.assert_allclose(e, [0.5])
    # eq. 5: (gas-1) max t + sum e + sum t
    assert P.pipeline_time_s(t, e, gas=4) == pytest.approx(3 * 6 + 0.5 + 7)
    # eq. 4: plus the slowest stage's sync + step, plus a fixed step overhead
    assert P.iteration_time_s(25.5, np.array([0.2, 0.7]), 0.1) == pytest.approx(26.3)
    assert microbatch_time_s(1.0, 2.0, True) == 4.0 and microbatch_time_s(1.0, 2.0, False) == 3


def test_planner_breakdown_is_the_composition_of_the_terms():
    """The estimate's parts are the cost_models terms on the chosen split."""
    from amp_search import estimate, load_spec
    from amp_search.planner import Candidate, CostModel

    spec = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    e = estimate(spec, pp=4, dp=2, tmp=2, mbs=2, placement_order="listed")
    s = e.strategy
    model = CostModel(spec)
    c = Candidate(pp=s.pp, dp=s.dp, tmp=s.tmp, mbs=s.mbs, zero_stage=s.zero_stage,
                  activation_checkpointing=s.activation_checkpointing)
    placement = np.array(s.placement)
    gpus = [np.unique(model.gpu_of_device[placement[j]]) for j in range(s.pp)]
    costs = model.stage_costs(c, placement, gpus)
    t = P.stage_totals(costs.layer_s, s.partition)
    np.testing.assert_allclose(t, e.stage_time_s)
    after = costs.sync_fixed_s + P.stage_totals(costs.after_pipeline_s, s.partition)
    expect = P.pipeline_time_s(t, P.boundary_times(costs.cut_s, s.partition), s.gas) \
        + after.max()
    assert e.iteration_time_s == pytest.approx(expect)
    b = e.breakdown
    assert b.data_parallel_s + b.optimizer_s == pytest.approx(after.max())


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
