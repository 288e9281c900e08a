"""Spec loading: units, defaults, and one clear line (exit 2) for every kind of bad input."""
from __future__ import annotations

import subprocess
import sys

import pytest

from amp_search import SpecError, UsageError, load_spec
from amp_search.units import parse_bandwidth, parse_size
from conftest import ROOT, hetero_spec


def test_units():
    assert parse_bandwidth("10 Gbps", "x") == pytest.approx(1.25e9)
    assert parse_bandwidth("25 GB/s", "x") == pytest.approx(25e9)
    assert parse_bandwidth("100 gbps", "x") == pytest.approx(12.5e9)
    assert parse_size("16 GiB", "x") == 16 * 2**30
    assert parse_size("40 GB", "x") == 40 * 10**9
    with pytest.raises(SpecError, match="bare number"):
        parse_bandwidth(10, "cluster.nodes[0].inter_node_bandwidth")
    with pytest.raises(SpecError, match="unknown unit"):
        parse_bandwidth("10 furlongs", "x")


def test_hetero_cluster_devices_in_order():
    spec = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    c = spec.cluster
    assert c.num_devices == 16 and len(c.nodes) == 4
    assert [d.gpu.name for d in c.devices[:12]] == ["V100-16GB"] * 12
    assert c.devices[12].gpu.name == "T4-16GB" and c.devices[12].node == 3
    assert c.nodes[0].inter_node_bandwidth_bytes_per_s == pytest.approx(10e9 / 8)
    layers = spec.model.layers
    assert len(layers) == 26 and layers[0].kind == "embedding" and layers[-1].kind == "head"


def test_layers_preset_uneven_widths():
    spec = load_spec(ROOT / "configs" / "amp-transgan.yaml")
    kinds = [l.kind for l in spec.model.layers]
    assert kinds == ["custom"] + ["transformer"] * 24 + ["custom"]
    narrow = spec.model.layers[13]
    assert narrow.hidden_size == 16 and narrow.input_hidden_size == 1024
    assert spec.model.layers[14].input_hidden_size == 0


def test_inline_gpu(write_spec):
    d = hetero_spec()
    d["cluster"]["nodes"][1]["gpu"] = {"name": "MyGPU", "memory": "24 GiB",
                                       "memory_bandwidth": "1 TB/s",
                                       "peak_tflops": {"fp16": 100}}
    spec = load_spec(write_spec(d))
    assert spec.cluster.devices[-1].gpu.name == "MyGPU"


def _mutate(path: str, value):
    d = hetero_spec()
    keys = path.split(".")
    node = d
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return d


_DELETE = object()

BAD = [
    ("cluster.nodes.0.gpu", "A999", "cluster.nodes[0].gpu: unknown GPU 'A999'; known:"),
    ("cluster.nodes.0.inter_node_bandwidth", 10, "cluster.nodes[0].inter_node_bandwidth: a bare"),
    ("cluster.nodes.0.count", "three", "cluster.nodes[0].count: expected an integer"),
    ("cluster.nodes.0.colour", "red", "cluster.nodes[0].colour: unknown key; valid keys"),
    ("model.num_attention_heads", 15, "model.num_attention_heads: num_attention_heads (15) "
                                      "must divide hidden_size"),
    ("model.num_layers", 10**20, "model.num_layers: 100000000000000000000 is out of range"),
    ("model.preset", "llama", "model.preset: got 'llama'; accepted: gpt, bert, layers"),
    ("training.precision", "bf16", "training.precision: V100-16GB (cluster.nodes[0]) has no "
                                   "bf16 support"),
    ("training.zero_stage", 4, "training.zero_stage: got 4; accepted: 0, 1, 2, 3, search"),
    ("training.activation_checkpointing", "some", "training.activation_checkpointing: got "
                                                  "'some'; accepted: none, full, search"),
    ("training.memory_headroom", "60%", "training.memory_headroom: got 0.6; accepted: a "
                                        "fraction from 0 to 0.5"),
    ("training.global_batch_size", 0, "training.global_batch_size: 0 is out of range"),
    ("training", _DELETE, "training: required key is missing"),
    ("cluster.nodes.0.hosts", ["a;rm -rf /", "b", "c"], "is not a valid hostname"),
]


@pytest.mark.parametrize("path,value,message", BAD, ids=[b[0] for b in BAD])
def test_bad_values_name_the_key(write_spec, path, value, message):
    with pytest.raises(SpecError) as err:
        load_spec(write_spec(_mutate(path, value)))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_bad_yaml_and_missing_file(write_spec):
    with pytest.raises(SpecError, match="not valid YAML at line "):
        load_spec(write_spec("cluster:\n  nodes: [a, b\n  x: }\n"))
    with pytest.raises(UsageError, match="spec file not found"):
        load_spec(ROOT / "nope.yaml")


def test_batch_no_dp_divides(write_spec):
    d = hetero_spec()
    d["model"]["num_layers"] = 2          # pp <= 4 layers, tmp | 16 heads: dp >= 1 ... force:
    d["model"]["num_attention_heads"] = 1
    d["training"]["global_batch_size"] = 3  # 16 devices, pp <= 4, tmp = 1 -> dp in {4, 8, 16}
    from amp_search import plan
    with pytest.raises(SpecError, match="training.global_batch_size: no feasible "
                                        "data-parallel degree divides 3"):
        plan(load_spec(write_spec(d)))


@pytest.mark.parametrize("args,message", [
    (["plan", "missing.yaml"], "spec file not found"),
    (["estimate", "configs/amp-hetero-gpt2.yaml", "--pp", "3", "--dp", "1", "--tmp", "1",
      "--mbs", "1"], "pp*dp*tmp = 3*1*1 = 3, but the cluster has 16 devices"),
])
def test_cli_errors_exit_2_one_line(args, message):
    r = subprocess.run([sys.executable, "-m", "amp_search", *args], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert message in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_cli_bad_yaml_exit_2(write_spec):
    p = write_spec(_mutate("cluster.nodes.0.gpu", "A999"))
    r = subprocess.run([sys.executable, "-m", "amp_search", "plan", str(p)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2 and "cluster.nodes[0].gpu: unknown GPU" in r.stderr
    assert "Traceback" not in r.stderr
