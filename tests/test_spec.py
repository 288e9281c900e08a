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
    # a name as users write it: the catalog's names it may mean, never taken for it
    ("cluster.nodes.0.gpu", "B200", "cluster.nodes[0].gpu: unknown GPU 'B200'; did you mean "
                                    "'B200-180GB'? known:"),
    ("cluster.nodes.0.gpu", "a100", "cluster.nodes[0].gpu: unknown GPU 'a100'; did you mean "
                                    "'A100-40GB' or 'A100-80GB'? known:"),
    ("cluster.nodes.0.gpu", "GB200 NVL72", "unknown GPU 'GB200 NVL72'; did you mean "
                                           "'GB200-186GB'? known:"),
    ("cluster.nodes.0.inter_node_bandwidth", 10, "cluster.nodes[0].inter_node_bandwidth: a bare"),
    ("cluster.nodes.0.count", "three", "cluster.nodes[0].count: expected an integer"),
    ("cluster.nodes.0.colour", "red", "cluster.nodes[0].colour: unknown key; valid keys"),
    ("model.num_attention_heads", 15, "model.num_attention_heads: num_attention_heads (15) "
                                      "must divide hidden_size"),
    ("model.num_layers", 10**20, "model.num_layers: 100000000000000000000 is out of range"),
    ("training.global_batch_size", 100_000_000,
     "training.global_batch_size: 100000000 is out of range; accepted: 1 to 65536"),
    ("model.preset", "llama", "model.preset: got 'llama'; accepted: gpt, bert, layers"),
    ("training.precision", "bf16", "training.precision: V100-16GB (cluster.nodes[0]) has no "
                                   "bf16 support"),
    ("training.zero_stage", 4, "training.zero_stage: got 4; accepted: 0, 1, 2, 3, search"),
    ("training.activation_checkpointing", "some", "training.activation_checkpointing: got "
                                                  "'some'; accepted: none, selective, full, "
                                                  "search, or a list"),
    ("training.activation_checkpointing", ["none", "none"], "training.activation_checkpointing: "
                                                           "got ['none', 'none']; accepted"),
    ("training.activation_checkpointing", [], "training.activation_checkpointing: got []"),
    ("training.sequence_parallel", "yes", "training.sequence_parallel: got 'yes'; accepted: "
                                          "true, false, search"),
    ("training.sequence_parallel", 1, "training.sequence_parallel: got 1; accepted: true, "
                                      "false, search"),
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


# ------------------------------------------------------------------------------------- hardening

import math  # noqa: E402
import os  # noqa: E402
import warnings  # noqa: E402

import yaml  # noqa: E402

from amp_search.hosts import is_valid_hostname  # noqa: E402
from amp_search.spec import load_catalog, parse_spec  # noqa: E402
from amp_search.units import NETWORK_BANDWIDTH  # noqa: E402
from amp_search import yaml_io  # noqa: E402


def _write_bytes(tmp_path, data: bytes, name="spec.yaml"):
    p = tmp_path / name
    p.write_bytes(data)
    return p


@pytest.mark.parametrize("text,message", [
    ("1e999 GB/s", "is not a finite bandwidth"),
    ("0.5 Mbps", "out of range; accepted: 1 Mbps to 100 TB/s"),
    ("101 TB/s", "out of range; accepted: 1 Mbps to 100 TB/s"),
    ("0 Gbps", "must be positive"),
    ("nan Gbps", "cannot read"),
    ("1" * 10_000 + "x", "at most 64 characters"),
])
def test_bandwidth_finite_and_in_range(text, message):
    with pytest.raises(SpecError, match=message):   # how fast: benchmarks/fail_fast.py
        parse_bandwidth(text, "x", NETWORK_BANDWIDTH)
    assert parse_bandwidth("1 Mbps", "x", NETWORK_BANDWIDTH) == 125e3
    assert parse_bandwidth("0.001 Gbps", "x", NETWORK_BANDWIDTH) == pytest.approx(125e3)


ABSURD = [
    ("cluster.nodes.1.gpu", {"memory": "1e999 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": 10}}, "memory: '1e999 GiB' is not a finite"),
    ("cluster.nodes.1.gpu", {"memory": "1e30 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": 10}}, "accepted: 64 MiB to 64 TiB"),
    ("cluster.nodes.1.gpu", {"memory": "16 GiB", "memory_bandwidth": "1e999 GB/s",
                             "peak_tflops": {"fp16": 10}}, "memory_bandwidth: '1e999 GB/s'"),
    ("cluster.nodes.1.gpu", {"memory": "16 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": math.nan}}, "peak_tflops.fp16: nan is out"),
    ("cluster.nodes.1.gpu", {"memory": "16 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": math.inf}}, "peak_tflops.fp16: inf is out"),
    ("cluster.nodes.1.gpu", {"memory": "16 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": 1e300}}, "accepted: 0.001 to 100,000"),
    ("cluster.nodes.1.gpu", {"memory": "16 GiB", "memory_bandwidth": "1 TB/s",
                             "peak_tflops": {"fp16": 1e-300}}, "accepted: 0.001 to 100,000"),
    ("cluster.nodes.1.gpu", {"name": {"a": [1] * 10**6}, "memory": "16 GiB",
                             "memory_bandwidth": "1 TB/s", "peak_tflops": {"fp16": 10}},
     "gpu.name: expected text of 1 to 128"),
    ("cluster.nodes.0.intra_node_bandwidth", "1e999 GB/s", "is not a finite bandwidth"),
    ("cluster.nodes.0.inter_node_bandwidth", ".inf Gbps", "cannot read"),
    ("cluster.nodes.1.inter_node_bandwidth", _DELETE, "cluster.nodes[1].inter_node_bandwidth: "
                                                      "required key is missing (the cluster "
                                                      "has 4 nodes"),
    ("cluster.nodes.0.hosts", ["::::", "b", "c"], "'::::' is not a valid hostname"),
    ("training.framework_overhead", "1e999 GiB", "is not a finite size"),
    ("training.framework_overhead", "16 GiB",
     "16 GiB leaves no memory on T4-16GB (cluster.nodes[1], 14.9 GiB)"),
    ("training.memory_headroom", math.nan, "accepted: a fraction from 0 to 0.5"),
    ("model.num_layers", 10**5000, "an integer of about 5000 digits is out of range"),
    ("model.name", [[[[[1]]]]] * 1000, "model.name: expected text"),
    ("model.preset", ["gpt"] * 10**6, "model.preset: got ['gpt', 'gpt',"),
]


@pytest.mark.parametrize("path,value,message", ABSURD,
                         ids=[f"{i}-{a[0]}" for i, a in enumerate(ABSURD)])
def test_absurd_values_rejected(write_spec, path, value, message):
    d = _mutate(path, value)
    with pytest.raises(SpecError) as err:
        parse_spec(d)
    assert message in str(err.value)
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_layers_preset_zero_heads_is_a_spec_error():
    d = hetero_spec()
    d["model"] = {"preset": "layers", "seq_length": 128, "layers": [
        {"kind": "embedding", "hidden_size": 64, "vocab_size": 1024},
        {"kind": "transformer", "hidden_size": 64, "num_attention_heads": 0},
        {"kind": "head", "hidden_size": 64, "vocab_size": 1024}]}
    with pytest.raises(SpecError, match=r"model.layers\[1\].num_attention_heads: 0 is out of "
                                        r"range; accepted: 1 to"):
        parse_spec(d)


def test_inter_node_bandwidth_optional_for_one_node():
    d = hetero_spec()
    d["cluster"]["nodes"] = [{"gpu": "T4-16GB", "gpus_per_node": 4,
                              "intra_node_bandwidth": "50 Gbps"}]
    spec = parse_spec(d)
    g = spec.cluster.node_groups[0]
    assert g.inter_node_bandwidth_bytes_per_s == g.intra_node_bandwidth_bytes_per_s
    d["cluster"]["nodes"][0]["count"] = 2
    with pytest.raises(SpecError, match=r"cluster.nodes\[0\].inter_node_bandwidth: required"):
        parse_spec(d)


def test_parse_spec_any_python_data_is_a_spec_error():
    cyclic: list = []
    cyclic.append(cyclic)
    d = hetero_spec()
    d["model"]["name"] = cyclic
    with pytest.raises(SpecError, match="model.name"):
        parse_spec(d)
    for bad in (None, 1, "x", [], cyclic, {1: 2}, {("a",) * 10**5: 1}, {"cluster": cyclic}):
        with pytest.raises(SpecError) as err:
            parse_spec(bad)
        assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_hostnames():
    for good in ("node-1", "gpu01.cluster.local", "10.0.0.1", "::1", "fe80::1%eth0"):
        assert is_valid_hostname(good), good
    for bad in ("::::", "1.2.3.999", "-oProxyCommand=x", "a b", "a;b", "", "x" * 254,
                "fe80::1%a b", 7, None):
        assert not is_valid_hostname(bad), bad


def test_shipped_catalog_and_configs_load():
    catalog = load_catalog()
    assert "CPU-local" in catalog and catalog["CPU-local"].peak_flops_per_s["fp16"] == 1e9
    for f in sorted((ROOT / "configs").glob("*.yaml")):
        load_spec(f)


# --------------------------------------------------------------- the front door (yaml_io)

def test_encodings(tmp_path):
    text = (ROOT / "configs" / "amp-hetero-gpt2.yaml").read_text() + "# café\n"
    want = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml").sha256
    for data in (text.encode("utf-8"), b"\xef\xbb\xbf" + text.encode("utf-8"),
                 "\ufeff".encode("utf-16-le") + text.encode("utf-16-le"),
                 "\ufeff".encode("utf-16-be") + text.encode("utf-16-be")):
        assert load_spec(_write_bytes(tmp_path, data)).sha256 == want
    latin1 = text.encode("latin-1")
    offset = latin1.index(b"\xe9")
    with pytest.raises(SpecError, match=f"not valid UTF-8 text: byte 0xE9 at offset {offset} "
                                        f"\\(line {text.count(chr(10))}\\)"):
        load_spec(_write_bytes(tmp_path, latin1))
    for data in (text.encode("utf-16-le"), "a: 1\n".encode("utf-16-be")):
        with pytest.raises(SpecError, match="UTF-16 .*without a byte-order mark"):
            load_spec(_write_bytes(tmp_path, data))
    with pytest.raises(SpecError, match="the file is UTF-32"):
        load_spec(_write_bytes(tmp_path, text.encode("utf-32")))


def test_duplicate_key_names_path_and_both_lines(tmp_path):
    text = (ROOT / "configs" / "amp-hetero-gpt2.yaml").read_text()
    n = text.count("\n")
    with pytest.raises(SpecError) as err:
        load_spec(_write_bytes(tmp_path, (text + "model:\n  preset: gpt\n").encode()))
    assert str(err.value).startswith("model: duplicate key in ")
    first = text.splitlines().index("model:") + 1
    assert f"at lines {first} and {n + 1}" in str(err.value)
    with pytest.raises(SpecError, match=r"^cluster.nodes\[1\].count: duplicate key"):
        load_spec(_write_bytes(tmp_path, text.replace("      count: 1\n",
                                                      "      count: 1\n      count: 2\n").encode()))
    # a merge key may be overridden: not a duplicate
    assert yaml_io.load_yaml_bytes(b"a: &a {x: 1}\nb: {<<: *a, x: 2}\n")["b"] == {"x": 2}


@pytest.mark.parametrize("doc,message", [
    ("a: &a [1, *a]\n", "alias \\*a is inside the node it names"),
    ("a: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper than 64 levels"),
    ("a: &a " + "[" * 40 + "]" * 40 + "\nb: " + "[" * 30 + "*a" + "]" * 30 + "\n",
     "nested deeper than 64 levels"),
    ("a: &a 1\nb: [" + ", ".join(["*a"] * 1001) + "]\n", "more than 1,000 aliases"),
    ("a: [" + ",".join(["1"] * 100_001) + "]\n", "more than 100,000 values"),
    ("a: 1\n---\nb: 2\n", "but found another document"),
    ("a: !!python/object/apply:os.system [ls]\n", "could not determine a constructor"),
    ("a: " + "9" * 5000 + "\n", "cannot read this value: Exceeds the limit"),
    ("a: 2001-13-45\n", "cannot read this value: month must be in 1..12"),
    ("a: *nope\n", "found undefined alias"),
    ("a: \x07\n", "control characters are not allowed"),
])
def test_yaml_limits(tmp_path, doc, message):
    with pytest.raises(SpecError, match=message) as err:    # how fast: benchmarks/fail_fast.py
        load_spec(_write_bytes(tmp_path, doc.encode()))
    assert "\n" not in str(err.value)


def test_parser_depth_limit_reads_as_ours(tmp_path, monkeypatch):
    """Whichever depth limit fires first, ours or the parser's own (LibYAML's, PyYAML's from
    6.0.4), the user reads the same line, naming the file."""
    def deep(self):
        raise yaml.MarkedYAMLError(None, None, "exceeded maximum nesting depth",
                                   yaml.Mark("x", 0, 0, 7, None, None))
    monkeypatch.setattr(yaml_io.BoundedSafeLoader, "get_single_data", deep)
    path = _write_bytes(tmp_path, b"a: 1\n")
    with pytest.raises(SpecError, match="spec.yaml: not valid YAML at line 1, column 8: nested "
                                        "deeper than 64 levels") as err:
        load_spec(path)
    assert "\n" not in str(err.value)


def test_billion_laughs_fails_fast(tmp_path):
    doc = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]\n" for p, c in zip("abcdefghi", "bcdefghij"))
    doc += "model:\n  name: *j\n"
    with pytest.raises(SpecError, match="more than 100,000 values once aliases are expanded"):
        load_spec(_write_bytes(tmp_path, doc.encode()))


def test_size_limit_and_special_files(tmp_path):
    with pytest.raises(SpecError, match="larger than 1,048,576 bytes"):
        load_spec(_write_bytes(tmp_path, b"# " + b"x" * (1 << 20) + b"\n"))
    with pytest.raises(UsageError, match="is a directory"):
        load_spec(tmp_path)
    if os.path.exists("/dev/zero"):
        with pytest.raises(SpecError, match="larger than 1,048,576 bytes"):
            load_spec("/dev/zero")
    if hasattr(os, "mkfifo"):
        fifo = tmp_path / "fifo.yaml"
        os.mkfifo(fifo)
        with pytest.raises(UsageError, match="no data \\(a FIFO with no writer\\?\\)"):
            load_spec(fifo)
    with pytest.raises(UsageError, match="cannot read spec file"):
        load_spec(str(tmp_path / "a\x00b"))


def test_catalog_goes_through_the_front_door(tmp_path):
    bad = _write_bytes(tmp_path, b"gpus:\n  X: {memory: 1 GiB, memory_bandwidth: 1 TB/s, "
                                 b"peak_tflops: {fp16: .nan}}\n", "gpus.yaml")
    with pytest.raises(SpecError, match=r"catalog.X.peak_tflops.fp16: nan is out of range"):
        load_catalog(bad)
    with pytest.raises(UsageError, match="expected a mapping 'gpus:"):
        load_catalog(_write_bytes(tmp_path, b"- 1\n", "gpus.yaml"))
    with pytest.raises(UsageError, match="GPU catalog not found"):
        load_catalog(tmp_path / "none.yaml")


# ----------------------------------------------------------------------- numba cache fallback

def test_numba_cache_falls_back_without_a_locator(monkeypatch):
    """With no writable cache folder numba raises 'cannot cache function ...: no locator
    available' when a cached kernel is defined; the kernels are then compiled uncached and one
    warning says so."""
    import numba.core.caching
    import numpy as np

    from amp_search import partition_kernels
    from cost_models import _jit

    monkeypatch.setattr(numba.core.caching.CacheImpl, "_locator_classes", [])
    with pytest.raises(RuntimeError, match="no locator available"):
        numba.njit(cache=True)(partition_kernels._prefix.py_func)
    monkeypatch.setattr(_jit, "_warned", set())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        prefix = partition_kernels._kernel(partition_kernels._prefix.py_func)
        partition_kernels._kernel(partition_kernels._bottleneck.py_func)
    assert len(caught) == 1 and "NUMBA_CACHE_DIR" in str(caught[0].message)
    assert "\n" not in str(caught[0].message)
    values = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(prefix(values), partition_kernels._prefix(values))


def test_the_cluster_fingerprint_is_json_dumps_byte_for_byte():
    """spec_fingerprint writes each GPU record once and puts it in place of its stand-ins
    (`_section_json`): the text hashed is json.dumps' own, so plans made before still match,
    on a mixed cluster with a catalog GPU and one defined inline."""
    import json

    from amp_search.spec import _as_dict, _section_json

    spec = parse_spec({"cluster": {"nodes": [
        {"gpu": "V100-16GB", "count": 3, "gpus_per_node": 4, "intra_node_bandwidth": "150 GB/s",
         "inter_node_bandwidth": "100 Gbps"},
        {"gpu": {"name": "my-card", "memory": "24 GB", "memory_bandwidth": "900 GB/s",
                 "peak_tflops": {"fp32": 20, "fp16": 80}}, "count": 2, "gpus_per_node": 2,
         "intra_node_bandwidth": "32 GB/s", "inter_node_bandwidth": "25 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 4, "hidden_size": 256,
                  "num_attention_heads": 4, "seq_length": 128, "vocab_size": 1000},
        "training": {"global_batch_size": 8}})
    for name in ("cluster", "model", "training"):
        plain = json.dumps(_as_dict(getattr(spec, name), {}), sort_keys=True, default=str)
        assert _section_json(_as_dict(getattr(spec, name), {}), name) == plain
