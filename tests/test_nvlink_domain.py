"""cluster.nodes[].nvlink_domain: an NVLink domain over several nodes (a GB200 NVL72 rack's
trays of 4 GPUs). The cost model takes the domain as its node (links inside are NVLink, its
trays' networks add up), so the trays cost exactly what one node of the domain's GPUs does,
while launch and export keep one host per tray."""
from __future__ import annotations

import re

import pytest

from amp_search import SpecError, estimate
from amp_search.cli import main
from amp_search.costing.links import ClusterArrays
from amp_search.export import export_strategy
from amp_search.planner import plan
from amp_search.spec import parse_spec, spec_fingerprint

MOE = {"preset": "gpt", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8, "num_query_groups": 8,
       "seq_length": 1024, "vocab_size": 32000, "mlp": "swiglu", "norm": "rmsnorm",
       "position_embedding": "rope", "bias": False, "ffn_hidden_size": 512,
       "num_experts": 16, "moe_router_topk": 2, "moe_ffn_hidden_size": 128}


def _spec(nodes: list[dict], **training) -> dict:
    return {"cluster": {"nodes": nodes},
            "model": MOE,
            "training": {"global_batch_size": 64, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 1, "sequence_parallel": True, **training}}


def _trays(domain: int | None, count: int = 8) -> dict:
    """`count` trays of 4 GB200, each with its four 400 Gb/s NICs; `domain` GPUs per NVLink
    domain (None: none written)."""
    return dict({"gpu": "GB200-186GB", "count": count, "gpus_per_node": 4,
                 "intra_node_bandwidth": "900 GB/s", "inter_node_bandwidth": "4 x 400 Gbps"},
                **({"nvlink_domain": domain} if domain else {}))


def _racks(count: int = 2) -> dict:
    """The same GPUs written as `count` nodes of 16, each an NVLink domain."""
    return {"gpu": "GB200-186GB", "count": count, "gpus_per_node": 16,
            "intra_node_bandwidth": "900 GB/s", "inter_node_bandwidth": "16 x 400 Gbps"}


STRATEGIES = [dict(pp=2, dp=4, tmp=4, mbs=1, ep=4), dict(pp=1, dp=4, tmp=8, mbs=2, ep=2),
              dict(pp=4, dp=8, tmp=1, mbs=1, ep=8), dict(pp=1, dp=32, tmp=1, mbs=2, ep=16),
              dict(pp=2, dp=2, tmp=4, mbs=1, ep=2, cp=2)]


@pytest.mark.parametrize("kw", STRATEGIES, ids=lambda kw: "-".join(f"{k}{v}" for k, v in
                                                                    kw.items()))
def test_trays_in_a_domain_cost_what_one_node_of_the_domain_does(kw):
    trays = parse_spec(_spec([_trays(16)], context_parallel=[1, 2]))
    racks = parse_spec(_spec([_racks()], context_parallel=[1, 2]))
    assert trays.cluster.nvlink_domains == tuple(tuple(range(k, k + 4)) for k in (0, 4))
    kw = dict(kw, activation_checkpointing="none", sequence_parallel=kw["tmp"] > 1)
    a, b = (estimate(s, **kw) for s in (trays, racks))
    assert a.iteration_time_s == b.iteration_time_s
    assert a.breakdown == b.breakdown
    # without the domain each tray is a node of its own: groups across trays pay the network
    alone = estimate(parse_spec(_spec([_trays(None)], context_parallel=[1, 2])), **kw)
    if kw["tmp"] * kw.get("cp", 1) > 4 or kw["ep"] * kw["tmp"] > 4:
        assert alone.iteration_time_s > a.iteration_time_s


def test_links_see_domains_and_the_baseline_keeps_groups_inside_one():
    spec = parse_spec(_spec([_trays(16, count=9)]))       # the last domain holds one tray
    arr = ClusterArrays.of(spec.cluster)
    assert arr.num_nodes == 3 and list(arr.node_of[[0, 15, 16, 32, 35]]) == [0, 0, 1, 2, 2]
    tray = spec.cluster.nodes[0]
    assert arr.inter_bytes_per_s[0] == pytest.approx(4 * tray.inter_node_achievable_bytes_per_s)
    assert arr.inter_bytes_per_s[2] == pytest.approx(tray.inter_node_achievable_bytes_per_s)
    assert arr.intra_bytes_per_s[2] == tray.intra_node_achievable_bytes_per_s
    assert spec.cluster.min_nvlink_gpus == 4 and spec.cluster.min_gpus_per_node == 4
    even = parse_spec(_spec([_trays(16)], expert_parallel="search"))
    assert even.cluster.min_nvlink_gpus == 16
    base = plan(even, simulate_top=0).baseline
    assert base is not None and base.strategy.ep * base.strategy.tmp <= 16


def test_a_spec_without_the_key_keeps_its_fingerprint_and_the_key_counts():
    plain = spec_fingerprint(parse_spec(_spec([_trays(None)])))
    assert spec_fingerprint(parse_spec(_spec([_trays(4)]))) == plain | {
        "spec_sha256": spec_fingerprint(parse_spec(_spec([_trays(4)])))["spec_sha256"]}
    assert spec_fingerprint(parse_spec(_spec([_trays(16)])))["cluster"] != plain["cluster"]


@pytest.mark.parametrize("value, why", [(6, "a multiple of gpus_per_node (4)"),
                                        (0, "out of range"), ("rack", "expected an integer")])
def test_a_bad_domain_is_one_line_naming_the_key(value, why):
    with pytest.raises(SpecError, match=r"^cluster.nodes\[0\].nvlink_domain: .*" + re.escape(why)):
        parse_spec(_spec([_trays(None) | {"nvlink_domain": value}]))


def test_plan_says_so_and_export_keeps_a_host_per_tray(tmp_path, write_spec, capsys):
    path = write_spec(_spec([_trays(16)]))
    assert main(["plan", str(path), "--top-k", "1", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "8 nodes x 4 GB200-186GB in NVLink domains of 16 (inside a domain 900 GB/s" in out
    spec = parse_spec(_spec([_trays(16)]))
    ex = export_strategy(spec, plan(spec, simulate_top=0).best.strategy, fmt="megatron")
    scripts = [f for f in ex.files if f.path.startswith("launch-node")]
    assert len(scripts) == 8 and all("CUDA_VISIBLE_DEVICES=0,1,2,3" in f.text for f in scripts)
