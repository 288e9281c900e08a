"""The planner end to end: enumeration, placement, topology, cost terms, ranking, CLI JSON."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from amp_search import Plan, estimate, load_spec, plan
from amp_search.placement import device_orders, megatron_placement
from amp_search.costing import CostModel
from amp_search.search_space import Candidate
from amp_search.search_space import SearchSpace, divisors, enumerate_candidates
from amp_search.costing.links import ClusterArrays, p2p_links, ring_links
from cost_models import comm
from cost_models.pipeline import pipeline_time_s
from conftest import ROOT

HETERO = ROOT / "configs" / "amp-hetero-gpt2.yaml"


@pytest.fixture(scope="module")
def hetero():
    return load_spec(HETERO)


@pytest.fixture(scope="module")
def hetero_plan(hetero):
    return plan(hetero)


def test_enumeration_covers_every_degree(hetero):
    from collections import Counter
    pruned = Counter()
    cands = enumerate_candidates(SearchSpace.of(hetero), pruned)
    triples = {(c.pp, c.dp, c.tmp) for c in cands}
    expected = {(pp, 16 // (pp * t), t) for t in divisors(16) for pp in divisors(16 // t)}
    assert triples == expected                 # 16 heads, 26 layers: nothing pruned
    for c in cands:
        assert c.pp * c.dp * c.tmp == 16 and (32 // c.dp) % c.mbs == 0
    assert len([c for c in cands if (c.pp, c.dp, c.tmp) == (1, 16, 1)]) == 2   # mbs 1, 2


def test_plan_is_ranked_and_beats_megatron(hetero_plan: Plan):
    # ranked by the time to the 4 significant digits the table shows (planner.ranking_key)
    times = [float(f"{e.iteration_time_s:.4g}") for e in hetero_plan.strategies]
    assert times == sorted(times)
    assert hetero_plan.baseline is not None
    # the baseline is one point of the searched space, so the best can only be as fast or faster
    assert hetero_plan.best.iteration_time_s <= hetero_plan.baseline.iteration_time_s
    # AMP section 4.5: Megatron picks dp=16 because the model fits; the 10 Gbps links make it slow
    assert hetero_plan.baseline.strategy.dp == 16
    assert hetero_plan.speedup(hetero_plan.best) > 1.5
    assert hetero_plan.best.strategy.pp > 1


def test_breakdown_sums_to_iteration_time(hetero_plan: Plan):
    for e in hetero_plan.strategies[:20]:
        b = e.breakdown
        total = (b.compute_s + b.pipeline_bubble_s + b.p2p_s + b.tensor_parallel_s
                 + b.data_parallel_s + b.optimizer_s)
        # the breakdown is the closed form's (iteration_time_s may be simulated)
        assert total == pytest.approx(e.analytic_iteration_time_s, rel=1e-9)
        s = e.strategy
        cuts = [0.0] * (s.pp - 1)
        assert e.iteration_time_s >= pipeline_time_s(e.stage_time_s, cuts, s.gas) - 1e-12


def test_optimal_partition_never_worse_than_uniform(hetero):
    for pp, dp, tmp in [(2, 8, 1), (4, 4, 1), (8, 2, 1), (4, 2, 2)]:
        opt = estimate(hetero, pp=pp, dp=dp, tmp=tmp, mbs=1)
        uni = estimate(hetero, pp=pp, dp=dp, tmp=tmp, mbs=1, partition="uniform")
        assert opt.iteration_time_s <= uni.iteration_time_s * (1 + 1e-12)


def test_slow_t4_stage_gets_fewer_layers(hetero):
    """Listed order puts the T4 node last: with pp=4 the T4 stage must carry less work."""
    e = estimate(hetero, pp=4, dp=4, tmp=1, mbs=1, placement_order="listed")
    b = e.strategy.partition
    sizes = [y - x for x, y in zip(b, b[1:])]
    assert sizes[-1] < max(sizes[:-1])


def test_placement_orders(hetero):
    orders = device_orders(hetero.cluster, "fp16")
    assert [o.name for o in orders] == ["listed", "slowest-first"]  # fastest-first == listed
    assert list(orders[1].devices[:4]) == [12, 13, 14, 15]
    homo = load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml")
    assert len(device_orders(homo.cluster, "fp16")) == 1
    P = megatron_placement(orders[0], 2, 2, 4)
    assert P[0, 0].tolist() == [0, 1, 2, 3] and P[0, 1].tolist() == [4, 5, 6, 7]
    assert P[1, 0].tolist() == [8, 9, 10, 11]


ETHERNET = 0.95
"""The catalog's ethernet share (the AMP configs' AWS network; their links inside a node are
AMP's measured figures, used as written)."""


def test_tensor_group_spilling_over_nodes_pays_network(hetero):
    from amp_search.spec import link_kinds
    assert link_kinds()["ethernet"].achievable_share == ETHERNET
    arr = ClusterArrays.of(hetero.cluster)
    inside = ring_links(arr, np.array([[0, 1, 2, 3]]))
    spill = ring_links(arr, np.array([[2, 3, 4, 5]]))
    assert inside.bandwidth_bytes_per_s[0] == pytest.approx(170e9 / 8)
    assert not inside.crosses_nodes[0] and spill.crosses_nodes[0]
    assert spill.bandwidth_bytes_per_s[0] == pytest.approx(10e9 / 8 * ETHERNET)


def test_nic_sharing(hetero):
    """Two rings that both leave node 0 at once get half of its 10 Gbps each."""
    arr = ClusterArrays.of(hetero.cluster)
    one = ring_links(arr, np.array([[0, 4]]))
    two = ring_links(arr, np.array([[0, 4], [1, 5]]))
    nic = 10e9 / 8 * ETHERNET
    assert one.bandwidth_bytes_per_s[0] == pytest.approx(nic)
    assert two.bandwidth_bytes_per_s.tolist() == pytest.approx([nic / 2] * 2)
    # pipeline flows: 4 replicas crossing from node 0 to node 1 share node 0's NIC
    P = np.array([[[0], [1], [2], [3]], [[4], [5], [6], [7]]])
    assert p2p_links(arr, P).bandwidth_bytes_per_s[0] == pytest.approx(nic / 4)


def test_comm_terms():
    assert comm.allreduce_time_s(8e9, 4, 1e9) == pytest.approx(2 * 3 * 8 / 4)       # eq. 3
    assert comm.allreduce_time_s(8e9, 1, 1e9) == 0
    assert comm.p2p_time_s(1e9, 1e9) == pytest.approx(1.0)
    z0 = comm.data_parallel_sync_time_s(param_bytes=1e9, grad_bytes=1e9, n=4,
                                        bandwidth_bytes_per_s=1e9, latency_s=0, zero_stage=0,
                                        gas=4)
    z3 = comm.data_parallel_sync_time_s(param_bytes=1e9, grad_bytes=1e9, n=4,
                                        bandwidth_bytes_per_s=1e9, latency_s=0, zero_stage=3,
                                        gas=1)
    assert z3 == pytest.approx(1.5 * z0)        # ZeRO-3 moves 1.5x the data of ZeRO-0


def test_recompute_costs_time(hetero):
    a = estimate(hetero, pp=4, dp=4, tmp=1, mbs=1)
    b = estimate(hetero, pp=4, dp=4, tmp=1, mbs=1, activation_checkpointing=True)
    assert b.iteration_time_s > a.iteration_time_s
    assert b.strategy.activation_checkpointing


def test_uneven_model_is_balanced_by_cost_not_count():
    """AMP's TransGAN: 12 wide blocks then 12 narrow ones. The DP gives the narrow blocks to
    few stages; a uniform split by layer count is slower (by less than the FLOPs alone say:
    every block pays the framework's fixed host time per pass, narrow or wide). On the
    config's 10 Gbps links every split pays 1F1B's steady-state P2P of the wide activations,
    which dominates (optimal and uniform then tie), so the nodes get a fast network here."""
    import yaml

    from amp_search.spec import parse_spec

    data = yaml.safe_load((ROOT / "configs" / "amp-transgan.yaml").read_text())
    data["cluster"]["nodes"][0]["inter_node_bandwidth"] = "1600 Gbps"
    spec = parse_spec(data)
    opt = estimate(spec, pp=4, dp=4, tmp=1, mbs=1)
    uni = estimate(spec, pp=4, dp=4, tmp=1, mbs=1, partition="uniform")
    assert opt.iteration_time_s < uni.iteration_time_s * 0.96
    b = opt.strategy.partition
    assert b[-2] >= 13          # the last stage starts inside or after the wide blocks... holds all narrow ones


def test_plan_json_cli(tmp_path):
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "amp_search", "plan", str(HETERO), "--top-k", "3",
                        "--json", str(out), "--no-progress"], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert "megatron" in r.stdout and "rank" in r.stdout
    data = json.loads(out.read_text())
    assert len(data["strategies"]) == 3 and data["strategies"][0]["rank"] == 1
    first = data["strategies"][0]
    for key in ("pp", "dp", "tmp", "mbs", "partition", "placement", "iteration_time_s",
                "breakdown", "memory", "fits", "speedup_over_megatron"):
        assert key in first
    assert set(first["breakdown"]) == {"compute_s", "pipeline_bubble_s", "p2p_s",
                                       "tensor_parallel_s", "data_parallel_s",
                                       "optimizer_s"}
    assert len(first["placement"]) == first["pp"]
    assert len(first["placement"][0]) == first["dp"]
    assert len(first["placement"][0][0]) == first["tmp"]
    assert data["search_time_s"] > 0 and data["evaluated"] >= data["num_ranked"]
    assert isinstance(data["pruned"], dict)


def test_json_text_is_json_with_leaf_lists_on_one_line():
    """`json_text` holds what json.dumps holds (objects and lists of objects one item a
    line, indented), a list or object without objects in it on one line."""
    from amp_search.cli._args import json_text

    data = {"a": 1, "placement": [[[0, 1], [2, 3]]], "rows": [{"x": 1.5, "y": None}, {}],
            "empty": [], "nested": {"b": {"c": [1, 2]}, "s": "t"}, "inf": float("inf"),
            "tuple": (1, (2, 3))}
    text = json_text(data)
    assert json.loads(text) == json.loads(json.dumps(data))
    lines = text.splitlines()
    assert '  "placement": [[[0, 1], [2, 3]]],' in lines
    assert '    {"x": 1.5, "y": null},' in lines and '    {}' in lines
    assert lines[0] == "{" and lines[-1] == "}" and '      "c": [1, 2]' in lines
    assert json_text({1: [1]}) == json.dumps({1: [1]}, indent=2)   # json's key conversion


def test_estimate_json_cli(tmp_path):
    out = tmp_path / "e.json"
    r = subprocess.run([sys.executable, "-m", "amp_search", "estimate", str(HETERO), "--pp", "2",
                        "--dp", "8", "--tmp", "1", "--mbs", "2", "--partition", "0,14,26",
                        "--json", str(out)], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    data = json.loads(out.read_text())
    assert data["partition"] == [0, 14, 26] and data["iteration_time_s"] > 0
    assert "breakdown" in data and "fits" in data and "memory" in data


def test_memory_aware_partition(write_spec):
    """A fast GPU with little memory next to a slow one with plenty: the time-optimal split
    overloads the fast GPU; the DP's memory budgets move layers to the big one, and the result
    fits (checked by the exact per-stage memory model)."""
    from amp_search.partition import optimal_partition

    fast_small = {"name": "FastSmall", "memory": "3 GiB", "memory_bandwidth": "2 TB/s",
                  "peak_tflops": {"fp16": 400}}
    slow_big = {"name": "SlowBig", "memory": "80 GiB", "memory_bandwidth": "300 GB/s",
                "peak_tflops": {"fp16": 50}}
    node = {"count": 1, "gpus_per_node": 1, "intra_node_bandwidth": "100 GB/s",
            "inter_node_bandwidth": "100 Gbps"}
    spec = load_spec(write_spec({
        "cluster": {"nodes": [{"gpu": fast_small, **node}, {"gpu": slow_big, **node}]},
        "model": {"preset": "gpt", "num_layers": 24, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
        "training": {"global_batch_size": 8, "precision": "fp16",
                     "framework_overhead": "256 MiB"}}))
    e = estimate(spec, pp=2, dp=1, tmp=1, mbs=1, placement_order="listed")
    assert e.fits, [m.to_dict() for m in e.memory]
    # without the budgets, the fast GPU would take more layers than fit
    model = CostModel(spec)
    c = Candidate(pp=2, dp=1, tmp=1, mbs=1, zero_stage=0, activation_checkpointing=False)
    order = device_orders(spec.cluster, "fp16")[0]
    assert order.name == "listed"
    unconstrained = model.evaluate(c, order, partition=optimal_partition(
        *_dp_inputs(model, c, order), 8).boundaries)
    assert not unconstrained.fits
    assert e.strategy.partition[1] < unconstrained.strategy.partition[1]


def _dp_inputs(model: CostModel, c: Candidate, order):
    """stage_layer_time and cut arrays as evaluate() builds them (time only)."""
    placement = megatron_placement(order, c.pp, c.dp, c.tmp)
    costs = model.stage_costs(c, model.layout(c, placement=placement))
    return costs.layer_s, np.zeros((c.pp, model.num_layers + 1))


def test_optimizer_step_term_is_split_by_partitioning_optimizers():
    """One Adam step per iteration, memory-bound (analytic) or measured (profile); ZeRO 1-3
    split it over the data-parallel ranks, plain torch Adam (fp32, ZeRO 0) does not."""
    from cost_models.compute import ADAM_BYTES_PER_PARAM
    from cost_models.layers import param_count

    spec = load_spec(ROOT / "configs" / "cpu-local.yaml")
    gpu = spec.cluster.devices[0].gpu
    n = sum(param_count(l, 1) for l in spec.model.layers)
    step = n * ADAM_BYTES_PER_PARAM["fp32"] / gpu.memory_bandwidth_bytes_per_s
    one = estimate(spec, pp=1, dp=1, tmp=2, mbs=1, zero_stage=0)
    n2 = sum(param_count(l, 2) for l in spec.model.layers)
    assert one.breakdown.optimizer_s == pytest.approx(
        n2 * ADAM_BYTES_PER_PARAM["fp32"] / gpu.memory_bandwidth_bytes_per_s)
    z0 = estimate(spec, pp=1, dp=2, tmp=1, mbs=1, zero_stage=0)
    z1 = estimate(spec, pp=1, dp=2, tmp=1, mbs=1, zero_stage=1)
    assert z0.breakdown.optimizer_s == pytest.approx(step)
    assert z1.breakdown.optimizer_s == pytest.approx(step / 2)
    # the pipeline stage with the larger step (and sync) is the one reported
    pp2 = estimate(spec, pp=2, dp=1, tmp=1, mbs=1, zero_stage=0)
    lo, mid, hi = pp2.strategy.partition
    stage_steps = [sum(param_count(l, 1) for l in spec.model.layers[a:b])
                   * ADAM_BYTES_PER_PARAM["fp32"] / gpu.memory_bandwidth_bytes_per_s
                   for a, b in ((lo, mid), (mid, hi))]
    assert pp2.breakdown.optimizer_s == pytest.approx(max(stage_steps))
