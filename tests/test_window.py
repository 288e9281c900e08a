"""Sliding-window attention (GPT-OSS): the model keys, the band of the causal triangle the
attention core computes, the Megatron-LM arguments, and the backend that runs it."""
from __future__ import annotations

import pytest

from amp_search.errors import SpecError, UsageError
from amp_search.launch.megatron import megatron_args, window_args
from amp_search.model_spec import parse_model
from amp_search.planner import estimate
from amp_search.spec import parse_spec, spec_fingerprint
from cost_models.layers import attention_core_flops, model_param_count, window_fraction


def _model(**kw):
    return {"preset": "gpt", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 4,
            "seq_length": 1024, "vocab_size": 512, **kw}


def test_window_keys_make_every_nth_block_full():
    m = parse_model(_model(window_size=128, window_attn_skip_freq=2))
    blocks = [x for x in m.layers if x.kind == "transformer"]
    assert [b.attention_window for b in blocks] == [128, 0, 128, 0]
    assert [x.attention_window for x in m.layers if x.kind != "transformer"] == [0, 0]
    every = parse_model(_model(window_size=128))
    assert all(b.attention_window == 128 for b in every.layers if b.kind == "transformer")
    three = parse_model(_model(num_layers=6, window_size=64, window_attn_skip_freq=3))
    assert [b.attention_window for b in three.layers if b.kind == "transformer"] == \
        [64, 64, 0, 64, 64, 0]
    assert blocks[0].signature.endswith(":w128") and ":w" not in blocks[1].signature
    # the window changes no parameter
    assert model_param_count(m.layers) == model_param_count(parse_model(_model()).layers)
    with pytest.raises(SpecError, match="model.window_attn_skip_freq: only with window_size"):
        parse_model(_model(window_attn_skip_freq=2))
    with pytest.raises(SpecError, match="model.window_size"):
        parse_model(_model(window_size=0))


def test_the_attention_core_computes_the_band_of_the_causal_triangle():
    m = parse_model(_model(window_size=128, window_attn_skip_freq=2))
    windowed, full = m.layers[1], m.layers[2]
    s, w = 1024, 128
    band = s * w - w * w / 2                  # (query, key) pairs within w of each other
    assert window_fraction(windowed) == pytest.approx(band / (s * s / 2))
    assert attention_core_flops(windowed) == pytest.approx(
        attention_core_flops(full) * band / (s * s / 2))
    assert window_fraction(full) == 1.0
    # a window as long as the sequence is full attention
    assert window_fraction(parse_model(_model(window_size=4096)).layers[1]) == 1.0


def _spec(backend="megatron", size=None, **model):
    training = {"global_batch_size": 16, "precision": "bf16", "zero_stage": 1,
                "activation_checkpointing": "none"}
    if backend:
        training["backend"] = backend
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s"}]},
        "model": _model(**(size or {}), **model), "training": training})


def test_windowed_blocks_are_faster_run_under_megatron_and_export_its_arguments():
    big = {"hidden_size": 2048, "num_attention_heads": 16, "seq_length": 8192}
    full = estimate(_spec(size=big), pp=2, dp=4, tmp=1, mbs=1)
    windowed = estimate(_spec(size=big, window_size=128, window_attn_skip_freq=2), pp=2,
                        dp=4, tmp=1, mbs=1)
    assert windowed.iteration_time_s < full.iteration_time_s
    windowed = estimate(_spec(window_size=128, window_attn_skip_freq=2), pp=2, dp=4, tmp=1,
                        mbs=1)
    spec = _spec(window_size=128, window_attn_skip_freq=2)
    args = megatron_args(spec.model.layers, windowed.strategy, precision="bf16", iters=10)
    i = args.index("--window-size")
    assert args[i + 1] == "128,0"
    assert args[args.index("--window-attn-skip-freq") + 1] == "2"
    assert window_args(_spec(window_size=64).model.layers) == ["--window-size", "64,0"]
    assert window_args(_spec().model.layers) == []
    # the trial program's attention is full: not under deepspeed; unnamed: megatron only
    with pytest.raises(SpecError, match="training.backend: deepspeed: the model's sliding"):
        _spec(backend="deepspeed", window_size=128)
    unnamed = _spec(backend=None, window_size=128)
    assert unnamed.training.backend == "megatron" and unnamed.other_backends == ()
    # a model without a window keeps its fingerprint (attention_window 0 is not hashed)
    assert "attention_window" not in str(spec_fingerprint(_spec()))


def test_gpt_oss_presets_alternate_windowed_and_full_blocks():
    for name, experts in (("gpt-oss-120b", 128), ("gpt-oss-20b", 32)):
        m = parse_model({"preset": name})
        blocks = [x for x in m.layers if x.kind == "transformer"]
        assert [b.attention_window for b in blocks[:4]] == [128, 0, 128, 0]
        assert blocks[0].num_experts == experts and blocks[0].moe_router_topk == 4
        with pytest.raises(UsageError):
            window_args(tuple(m.layers[:2]) + (m.layers[2].__class__(
                **{**m.layers[2].__dict__, "attention_window": 64}),) + tuple(m.layers[3:]))
