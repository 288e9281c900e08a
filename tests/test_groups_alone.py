"""Each node group of a mixed cluster planned on its own (`planner.node_groups_alone`), and the
line `plan` prints about it: does the slower group help or hold the others back?"""
from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from amp_search.cli import main
from amp_search.planner import node_groups_alone, plan
from amp_search.spec import Cluster, load_catalog, load_spec

ROOT = Path(__file__).resolve().parent.parent
HETERO = ROOT / "configs" / "amp-hetero-gpt2.yaml"


def test_each_group_alone_is_the_plan_of_a_spec_with_that_group_only():
    spec = load_spec(HETERO)
    alone = node_groups_alone(spec, simulate_top=0)
    assert [(a.gpu, a.nodes, a.gpus) for a in alone] == [("V100-16GB", 3, 12), ("T4-16GB", 1, 4)]
    offsets = (0, 12)                    # the V100 devices are 0-11, the T4 ones 12-15
    for a, g, offset in zip(alone, spec.cluster.node_groups, offsets):
        own = plan(replace(spec, cluster=Cluster.from_groups((g,))), simulate_top=0).best
        # the same plan, its placement on the whole cluster's device ids
        shifted = tuple(tuple(tuple(d + offset for d in r) for r in st)
                        for st in own.strategy.placement)
        assert a.best.strategy == replace(own.strategy, placement=shifted)
        assert a.best.iteration_time_s == own.iteration_time_s
        assert a.best.strategy.num_devices == a.gpus
    assert node_groups_alone(load_spec(ROOT / "configs" / "a100-gpt7b.yaml")) == ()


def test_a_group_where_nothing_fits_says_why(write_spec):
    """A 40-layer 13B model does not fit on one node of 4 T4s: that group reports the prune
    counts; the A100 node alone fits."""
    path = write_spec({
        "cluster": {"nodes": [
            {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 8,
             "intra_node_bandwidth": "600 GB/s", "inter_node_bandwidth": "8 x 200 Gbps"},
            {"gpu": "T4-16GB", "count": 1, "gpus_per_node": 4,
             "intra_node_bandwidth": "50 Gbps", "inter_node_bandwidth": "50 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 40, "hidden_size": 5120,
                  "num_attention_heads": 40, "seq_length": 2048, "vocab_size": 50304},
        "training": {"global_batch_size": 64, "precision": "fp16", "zero_stage": 0,
                     "activation_checkpointing": "none", "sequence_parallel": False}})
    a100, t4 = node_groups_alone(load_spec(path), simulate_top=0)
    assert a100.best is not None and t4.best is None
    assert "out_of_memory" in t4.reason


def test_plan_prints_and_writes_the_groups_alone(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "120")
    out_json = tmp_path / "plan.json"
    assert main(["plan", str(HETERO), "--no-progress", "--top-k", "3",
                 "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    text = " ".join(out.split())
    assert "Each node group alone, the others idle, against the whole cluster's" in text
    assert "3 x 4 V100-16GB:" in text and "1 x 4 T4-16GB:" in text
    assert max(map(len, out.splitlines())) <= 120
    data = json.loads(out_json.read_text())
    groups = data["node_groups_alone"]
    assert [g["gpu"] for g in groups] == ["V100-16GB", "T4-16GB"]
    whole = 32 / data["strategies"][0]["iteration_time_s"]
    v100 = groups[0]["samples_per_s"]
    # what the line concludes follows from the two rates and the model's error (the V100's)
    error = load_catalog()["V100-16GB"].prediction_error
    if v100 > whole * (1 + error):
        assert "leave the others out" in text
    elif v100 >= whole * (1 - error):
        assert "the other nodes add little" in text
    else:
        assert "Every node together is" in text
    assert main(["plan", str(HETERO), "--no-progress", "--top-k", "3", "--no-groups-alone",
                 "--json", str(out_json)]) == 0
    assert "Each node group alone" not in capsys.readouterr().out
    assert "node_groups_alone" not in json.loads(out_json.read_text())
