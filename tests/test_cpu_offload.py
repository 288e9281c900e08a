"""CPU activation offloading (training.cpu_offload_layers, megatron-core's --cpu-offloading
--cpu-offloading-num-layers): megatron-core's rules, the memory it takes off the device, the
copies the host link cannot hide, the arguments Megatron-LM runs it with, and the spec's
errors."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest

from amp_search import estimate, plan
from amp_search.cli import main
from amp_search.errors import AmpSearchError, SpecError
from amp_search.launch.megatron import megatron_args
from amp_search.launch.orchestrator import preflight
from amp_search.spec import load_catalog, parse_spec, spec_fingerprint
from cost_models.activations import layer_activation_bytes, offloaded_activation_bytes

NODE = {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8, "intra_node_bandwidth": "450 GB/s",
        "inter_node_bandwidth": "3200 Gbps"}
MODEL = {"preset": "llama3-8b", "seq_length": 4096}


def _spec(offload: int = 0, gpu: str = "H100-80GB", **training) -> dict:
    t = {"global_batch_size": 16, "precision": "bf16", "backend": "megatron",
         "activation_checkpointing": "none", "zero_stage": 1, "sequence_parallel": False,
         **training}
    if offload:
        t["cpu_offload_layers"] = offload
    return {"cluster": {"nodes": [dict(NODE, gpu=gpu)]}, "model": dict(MODEL), "training": t}


def _one(spec, **kw):
    return estimate(spec, **{**dict(pp=1, dp=8, tmp=1, mbs=1, zero_stage=1,
                                    activation_checkpointing="none"), **kw})


def test_offloaded_blocks_leave_the_device_but_one_in_flight():
    plain, off = parse_spec(_spec()), parse_spec(_spec(8))
    a, b = _one(plain), _one(off)
    block = next(x for x in plain.model.layers if x.kind == "transformer")
    each = layer_activation_bytes(block, mbs=1, tmp=1, bytes_per_element=2, recompute=False)
    assert offloaded_activation_bytes([each] * 8) == 7 * each
    assert a.memory[0].activation_bytes - b.memory[0].activation_bytes == 7 * each
    assert a.memory[0].parameter_bytes == b.memory[0].parameter_bytes


def test_copies_the_host_link_cannot_hide_are_charged():
    """The copies cost what the host link cannot hide beside the blocks' passes: more blocks
    cost more, a faster link (GB200's NVLink-C2C against an H100's PCIe Gen5) less, and a
    link fast enough nothing."""
    def added(offload, gpu="H100-80GB", catalog=None):
        base = _one(parse_spec(_spec(gpu=gpu), catalog=catalog)).iteration_time_s
        return _one(parse_spec(_spec(offload, gpu=gpu), catalog=catalog)).iteration_time_s \
            / base - 1.0

    assert 0.0 < added(8) < added(16)
    assert 0.0 < added(8, "GB200-186GB") < added(8)
    instant = {n: replace(g, host_link_bytes_per_s=1e15) for n, g in load_catalog().items()}
    assert added(8, catalog=instant) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("kw, reason", [
    (dict(pp=2, dp=4), "no pipeline parallelism with CPU offloading"),
    (dict(activation_checkpointing="full"), "does not work with activation recomputation"),
])
def test_megatron_core_rules(kw, reason):
    spec = parse_spec(_spec(8, activation_checkpointing="search"))
    with pytest.raises(AmpSearchError, match=reason):
        _one(spec, **kw)


def test_deepspeed_has_no_such_offloading():
    spec = parse_spec(_spec(8, backend="deepspeed", zero_stage=0))
    with pytest.raises(AmpSearchError, match="activation offloading is megatron-core's"):
        _one(spec, zero_stage=0)


def test_a_plan_with_offloading_keeps_pp_1_and_says_so(capsys, write_spec):
    d = _spec(8, activation_checkpointing="search")
    result = plan(parse_spec(d), simulate_top=0)
    assert result.strategies and all(
        e.strategy.pp == 1 and not e.strategy.activation_checkpointing
        and not e.strategy.selective_recompute for e in result.strategies)
    assert result.pruned["cpu_offload_with_pipeline"] > 0
    assert main(["plan", str(write_spec(d)), "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())       # the header wraps its lines
    assert "the first 8 blocks' activations offloaded to host memory" in out


def test_megatron_runs_it_on_transformer_engine_and_cpus_are_refused():
    spec = parse_spec(_spec(8))
    s = _one(spec).strategy
    args = megatron_args(spec.model.layers, s, precision="bf16", iters=3, cpu_offload_layers=8)
    i = args.index("--cpu-offloading-num-layers")
    assert args[i - 1] == "--cpu-offloading" and args[i + 1] == "8"
    assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
    assert "--cpu-offloading" not in megatron_args(spec.model.layers, s, precision="bf16",
                                                   iters=3)
    cpu = parse_spec({"cluster": {"nodes": [{"gpu": "CPU-local", "count": 1,
                                            "gpus_per_node": 2,
                                            "intra_node_bandwidth": "10 GB/s"}]},
                      "model": {"preset": "gpt", "num_layers": 4, "hidden_size": 64,
                                "num_attention_heads": 4, "seq_length": 32, "vocab_size": 128},
                      "training": {"global_batch_size": 4, "backend": "megatron",
                                   "activation_checkpointing": "none",
                                   "cpu_offload_layers": 2}})
    strategy = estimate(cpu, pp=1, dp=2, tmp=1, mbs=1, zero_stage=0,
                        activation_checkpointing="none").strategy
    assert "needs CUDA" in preflight(cpu, strategy, "megatron")


@pytest.mark.parametrize("value, match", [
    (32, r"accepted: 0 to 31 \(fewer than the model's 32 transformer blocks"),
    (-1, "out of range"),
    ("some", "expected an integer"),
])
def test_bad_values_name_the_key(value, match):
    d = _spec()
    d["training"]["cpu_offload_layers"] = value
    with pytest.raises(SpecError, match=r"training.cpu_offload_layers.*" + match):
        parse_spec(d)


def test_no_offloading_keeps_the_fingerprint():
    d = _spec()
    e = copy.deepcopy(d)
    e["training"]["cpu_offload_layers"] = 0
    def sections(data):         # the parsed sections' hashes (spec_sha256 is of the text)
        f = spec_fingerprint(parse_spec(data))
        return {k: v for k, v in f.items() if k != "spec_sha256"}

    assert sections(d) == sections(e)
    assert sections(_spec(4))["training"] != sections(d)["training"]
    assert sections(_spec(4))["cluster"] != sections(d)["cluster"]    # the host link counts
