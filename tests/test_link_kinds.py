"""Links written from the data sheet: each link kind's achievable share is catalog data with a
source (profiles/gpus.yaml `links:`), and the cost model prices collectives on the bandwidth
written times that share."""
from __future__ import annotations

import subprocess
import sys

import pytest

from amp_search import SpecError, estimate
from amp_search.costing.links import ClusterArrays
from amp_search.spec import link_kinds, load_catalog, parse_spec
from conftest import ROOT

KINDS = ("nvlink", "pcie", "infiniband", "roce", "ethernet", "slingshot", "measured")


def _spec(intra="300 GB/s", inter="8 x 200 Gbps", count=2, gpu="A100-80GB", **node):
    return {"cluster": {"nodes": [dict({"gpu": gpu, "count": count, "gpus_per_node": 8,
                                        "intra_node_bandwidth": intra,
                                        "inter_node_bandwidth": inter}, **node)]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 2048,
                      "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 51200},
            "training": {"global_batch_size": 64, "precision": "bf16", "backend": "megatron",
                         "activation_checkpointing": "full", "sequence_parallel": False,
                         "zero_stage": 1}}


def test_catalog_link_kinds_have_shares_and_sources():
    kinds = link_kinds()
    assert set(KINDS) <= set(kinds)
    for k in kinds.values():
        assert 0.0 < k.achievable_share <= 1.0 and k.source
    assert kinds["measured"].achievable_share == 1.0
    assert kinds["nvlink"].achievable_share < kinds["infiniband"].achievable_share < 1.0


def test_catalog_gpus_name_their_link_inside_a_node():
    cat = load_catalog()
    assert cat["A100-80GB"].intra_node_link == "nvlink"      # SXM parts: the default
    assert cat["H100-80GB"].intra_node_link == "nvlink"
    assert cat["T4-16GB"].intra_node_link == "pcie"           # PCIe cards
    assert cat["CPU-local"].intra_node_link == "measured"     # processes on one host


def test_collectives_get_the_written_bandwidth_times_the_share():
    kinds = link_kinds()
    spec = parse_spec(_spec())
    arr = ClusterArrays.of(spec.cluster)
    g = spec.cluster.node_groups[0]
    assert g.intra_node_bandwidth_bytes_per_s == pytest.approx(300e9)   # as written
    assert arr.intra_bytes_per_s == pytest.approx(300e9 * kinds["nvlink"].achievable_share)
    assert arr.inter_bytes_per_s == pytest.approx(200e9 * kinds["infiniband"].achievable_share)
    # a node group names its own kinds
    spec = parse_spec(_spec(intra_node_link="measured", inter_node_link="ethernet"))
    arr = ClusterArrays.of(spec.cluster)
    assert arr.intra_bytes_per_s == pytest.approx(300e9)
    assert arr.inter_bytes_per_s == pytest.approx(200e9 * kinds["ethernet"].achievable_share)
    # a PCIe card's default
    arr = ClusterArrays.of(parse_spec(_spec(intra="32 GB/s", gpu="L4-24GB")).cluster)
    assert arr.intra_bytes_per_s == pytest.approx(32e9 * kinds["pcie"].achievable_share)


def test_a_data_sheet_link_costs_what_the_measured_share_of_it_does():
    """300 GB/s of NVLink at the catalog's share predicts exactly what the same cluster
    written with the bandwidth collectives reach (`measured`) does: the share is the only
    difference, and it is applied everywhere a link is priced."""
    share = link_kinds()["nvlink"].achievable_share
    ib = link_kinds()["infiniband"].achievable_share
    sheet = parse_spec(_spec())
    reached = parse_spec(_spec(intra=f"{300 * share} GB/s", inter=f"{1600 * ib} Gbps",
                               intra_node_link="measured", inter_node_link="measured"))
    for kw in (dict(pp=2, dp=4, tmp=2, mbs=1), dict(pp=1, dp=2, tmp=8, mbs=2)):
        a = estimate(sheet, partition="uniform", **kw)
        b = estimate(reached, partition="uniform", **kw)
        assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)
    slower = estimate(parse_spec(_spec(intra="300 GB/s", intra_node_link="measured")), pp=1,
                      dp=2, tmp=8, mbs=2, partition="uniform")
    assert estimate(sheet, pp=1, dp=2, tmp=8, mbs=2, partition="uniform").iteration_time_s \
        > slower.iteration_time_s                      # NVLink's share costs tensor parallelism


@pytest.mark.parametrize("key", ["intra_node_link", "inter_node_link"])
def test_unknown_link_kind_names_the_key_and_the_kinds(key):
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(**{key: "carrier-pigeon"}))
    msg = str(e.value)
    assert f"cluster.nodes[0].{key}" in msg and "carrier-pigeon" in msg
    assert all(k in msg for k in KINDS)


def test_unknown_link_kind_on_the_command_line_is_one_line_exit_2(tmp_path):
    text = (ROOT / "configs" / "amp-hetero-gpt2.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("inter_node_link: ethernet", "inter_node_link: token-ring", 1))
    r = subprocess.run([sys.executable, "-m", "amp_search", "plan", str(bad)],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 2
    assert "inter_node_link" in r.stderr and "token-ring" in r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_plan_header_names_each_link_and_its_share():
    from amp_search.cli.plan_header import _group
    g = parse_spec(_spec()).cluster.node_groups[0]
    share = f"{link_kinds()['nvlink'].achievable_share:.0%}"
    assert f"300 GB/s nvlink {share}" in _group(g)
    assert "infiniband" in _group(g)
    g = parse_spec(_spec(intra_node_link="measured")).cluster.node_groups[0]
    assert "300 GB/s;" in _group(g)                   # a measured figure: nothing to say
