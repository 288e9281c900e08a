"""Named models (model.preset: llama3-8b, ...) and the Llama-family model keys: parsing, errors,
parameter totals against the published ones, and Megatron-LM's arguments."""
from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from amp_search.launch.megatron import megatron_args
from amp_search.records import Strategy
from amp_search.resources import models_path
from amp_search.model_spec import MODEL_KEYS, MODEL_PRESETS, PRESETS, swiglu_ffn_hidden_size
from amp_search.spec import SpecError, parse_spec
from cost_models.layers import Layer, model_param_count

from conftest import ROOT


def _raw(model: dict) -> dict:
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s"}]},
            "model": model,
            "training": {"global_batch_size": 8, "precision": "bf16",
                         **({"backend": "megatron"} if model.get("preset") in MOE else {})}}


MOE = ("qwen3-30b-a3b", "qwen3-235b-a22b", "mixtral-8x7b", "mixtral-8x22b", "deepseek-v3",
       "kimi-k2")
"""The presets with experts (costed for the megatron backend only)."""


def _model(**model):
    return parse_spec(_raw(model)).model


GPT = {"preset": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
       "seq_length": 32, "vocab_size": 256}

PUBLISHED = {                      # (published total, exact count where known)
    "llama3-8b": (8.03e9, 8_030_261_248),
    "llama3-70b": (70.6e9, 70_553_706_496),
    "llama3.1-405b": (405.9e9, 405_853_388_800),
    "qwen3-8b": (8.19e9, 8_190_735_360),     # Hugging Face safetensors total
    "qwen3-32b": (32.8e9, None),
    "qwen3-30b-a3b": (30.5e9, None),      # the mixture-of-experts presets (tests/test_moe.py)
    "qwen3-235b-a22b": (235e9, None),
    "mixtral-8x7b": (46.7e9, None),
    "mixtral-8x22b": (141e9, None),
    "gpt-oss-120b": (116.83e9, None),     # OpenAI's model card (sliding-window blocks)
    "gpt-oss-20b": (20.91e9, None),
    "deepseek-v3": (671e9, None),         # the technical report, without the MTP module
    "kimi-k2": (1.03e12, None),           # Moonshot's "1T" (its config gives 1.026T)
}


def test_models_yaml_is_the_presets():
    data = yaml.safe_load(models_path().read_text())
    assert tuple(data["models"]) == MODEL_PRESETS
    assert set(MODEL_PRESETS) <= set(PRESETS) and set(PUBLISHED) == set(MODEL_PRESETS)
    for entry in data["models"].values():
        assert set(entry) <= set(MODEL_KEYS)
    assert not set(data["not_modelled"]) & set(PRESETS)


@pytest.mark.parametrize("name", MODEL_PRESETS)
def test_every_preset_parses_to_its_published_size(name):
    m = _model(preset=name)
    assert m.preset == name and [x.kind for x in m.layers][::len(m.layers) - 1] == \
        ["embedding", "head"]
    block = m.layers[1]
    gpt_oss = name.startswith("gpt-oss")      # GPT-OSS: biases and its clamped quick-GEGLU
    assert (block.mlp, block.norm, block.bias, block.position_embedding) == \
        ("quick_geglu" if gpt_oss else "swiglu", "rmsnorm", gpt_oss, "rope")
    if block.is_mla:            # DeepSeek-V3, Kimi-K2: every head its own K and V
        assert block.num_query_groups == 0 and block.kv_lora_rank == 512
    else:
        assert 0 < block.num_query_groups < block.num_attention_heads
        assert block.num_query_groups in m.tp_divisors
    total = model_param_count(m.layers)
    published, exact = PUBLISHED[name]
    assert abs(total - published) / published < 0.01, total
    if exact is not None:
        assert total == exact


def test_llama3_8b_fields():
    m = _model(preset="llama3-8b", seq_length=4096)
    emb, block, head = m.layers[0], m.layers[1], m.layers[-1]
    assert m.num_layers == 34 and m.num_attention_heads == 32 and m.vocab_size == 128256
    assert (block.hidden_size, block.ffn_hidden_size, block.num_query_groups, block.head_dim,
            block.seq_length) == (4096, 14336, 8, 0, 4096)
    assert emb.position_embedding == "rope" and not emb.tie_embeddings
    assert head.norm == "rmsnorm" and not head.bias and not head.tie_embeddings
    assert m.tp_divisors == (8, 32, 4096, 14336)


def test_qwen3_head_dim_is_kept():
    block = _model(preset="qwen3-32b").layers[1]
    assert (block.hidden_size, block.num_attention_heads, block.head_dim) == (5120, 64, 128)
    assert block.seq_length == 4096             # the preset's default sequence


def test_size_keys_override_the_preset():
    m = _model(preset="llama3-70b", num_layers=4, seq_length=2048, vocab_size=32000)
    assert m.num_layers == 6 and m.vocab_size == 32000
    assert m.layers[1].seq_length == 2048 and m.layers[1].hidden_size == 8192
    assert _model(preset="llama3-8b", mlp="gelu", ffn_hidden_size=16384).layers[1].mlp == "gelu"


def test_default_gpt_is_the_old_block():
    """A spec without the new keys parses to exactly the Layers it always did."""
    old = ((Layer(kind="embedding", seq_length=32, hidden_size=64, vocab_size=256,
                  name="embedding"),)
           + tuple(Layer(kind="transformer", seq_length=32, hidden_size=64,
                         num_attention_heads=4, ffn_hidden_size=256, name=f"block{i}")
                   for i in range(2))
           + (Layer(kind="head", seq_length=32, hidden_size=64, vocab_size=256,
                    name="head"),))
    m = _model(**GPT)
    assert m.layers == old and m.tp_divisors == (4, 64, 256)
    assert [x.signature for x in m.layers] == [x.signature for x in old]
    # the defaults written out, and MHA / h/a spelled explicitly, are the same model
    explicit = _model(**GPT, mlp="gelu", norm="layernorm", bias=True,
                      position_embedding="learned", tie_embeddings=False,
                      num_query_groups=4, head_dim=16)
    assert explicit.layers == old


def test_swiglu_ffn_default_is_megatrons():
    assert swiglu_ffn_hidden_size(4096) == 10880        # int((4*4096*2/3)/64)*64
    m = _model(**{**GPT, "hidden_size": 4096, "num_attention_heads": 32}, mlp="swiglu")
    assert m.layers[1].ffn_hidden_size == 10880
    with pytest.raises(SpecError, match=r"^model.ffn_hidden_size: required key is missing: "
                                        r"mlp: swiglu with hidden_size 16"):
        _model(**{**GPT, "hidden_size": 16}, mlp="swiglu")


BAD = [
    ({"mlp": "relu"}, "model.mlp: got 'relu'; accepted: gelu, swiglu"),
    ({"norm": "batchnorm"}, "model.norm: got 'batchnorm'; accepted: layernorm, rmsnorm"),
    ({"position_embedding": "alibi"}, "model.position_embedding: got 'alibi'; accepted: "
                                      "learned, rope"),
    ({"bias": "no"}, "model.bias: got 'no'; accepted: true, false"),
    ({"tie_embeddings": 1}, "model.tie_embeddings: got 1; accepted: true, false"),
    ({"num_query_groups": 3}, "model.num_query_groups: 3 must divide num_attention_heads (4); "
                              "accepted: 1, 2, 4"),
    ({"num_query_groups": 0}, "model.num_query_groups: 0 is out of range"),
    ({"head_dim": 0}, "model.head_dim: 0 is out of range"),
    ({"head_dim": 16.5}, "model.head_dim: expected an integer"),
    ({"num_attention_heads": 5}, "model.num_attention_heads: num_attention_heads (5) must "
                                 "divide hidden_size (64)"),
]


@pytest.mark.parametrize("extra,message", BAD, ids=[b[1].split(":")[0] + str(i)
                                                     for i, b in enumerate(BAD)])
def test_bad_model_keys_name_the_key(extra, message):
    with pytest.raises(SpecError) as err:
        _model(**{**GPT, **extra})
    assert message in str(err.value) and "\n" not in str(err.value)


def test_head_dim_lifts_heads_dividing_hidden():
    block = _model(**{**GPT, "num_attention_heads": 5, "head_dim": 16}).layers[1]
    assert (block.num_attention_heads, block.head_dim) == (5, 16)


def test_preset_errors():
    with pytest.raises(SpecError, match=r"^model.preset: got 'llama'; accepted: gpt, bert, "
                                        r"layers, llama3-8b, llama3-70b, llama3.1-405b, "
                                        r"qwen3-8b, qwen3-32b, qwen3-30b-a3b, "
                                        r"qwen3-235b-a22b, mixtral-8x7b, mixtral-8x22b, "
                                        r"gpt-oss-120b, gpt-oss-20b, deepseek-v3, "
                                        r"kimi-k2$"):
        _model(preset="llama", seq_length=8)
    with pytest.raises(SpecError, match=r"^model.preset: nemotron-h: its hybrid Mamba-2 layers "
                                        r"are not modelled .*; accepted: gpt, "):
        _model(preset="nemotron-h")
    with pytest.raises(SpecError, match=r"^model.layers: only for preset: layers"):
        _model(preset="llama3-8b", layers=[{"kind": "embedding"}])


def test_override_conflicts_name_the_preset():
    with pytest.raises(SpecError) as err:
        _model(preset="llama3-8b", num_attention_heads=4)
    assert str(err.value).startswith("model.num_query_groups: 8 must divide "
                                     "num_attention_heads (4)")
    assert "(num_query_groups from preset llama3-8b; any size key given overrides" \
        in str(err.value)
    with pytest.raises(SpecError, match=r"^model.num_attention_heads: .* \(hidden_size from "
                                        r"preset llama3-70b"):
        _model(preset="llama3-70b", num_attention_heads=48, num_query_groups=8)


def test_cli_exit_2_one_line(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_text(yaml.safe_dump(_raw({**GPT, "mlp": "geglu"})))
    r = subprocess.run([sys.executable, "-m", "amp_search", "plan", str(p)], cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 2, r.stderr
    assert "model.mlp: got 'geglu'; accepted: gelu, swiglu" in r.stderr
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


# ----------------------------------------------------------------------------- preset: layers

def _layers(*items, seq=16):
    return _model(preset="layers", seq_length=seq, layers=list(items))


def test_layers_preset_keys_where_they_apply():
    m = _layers({"kind": "embedding", "hidden_size": 64, "vocab_size": 100,
                 "position_embedding": "rope", "tie_embeddings": True},
                {"kind": "transformer", "count": 2, "hidden_size": 64, "num_attention_heads": 8,
                 "num_query_groups": 2, "mlp": "swiglu", "norm": "rmsnorm", "bias": False},
                {"kind": "mlp", "hidden_size": 64, "mlp": "swiglu", "ffn_hidden_size": 96},
                {"kind": "head", "hidden_size": 64, "vocab_size": 100, "norm": "rmsnorm",
                 "tie_embeddings": True})
    emb, b0, b1, mlp, head = m.layers
    assert emb.position_embedding == b0.position_embedding == "rope"   # blocks follow it
    assert (b0.num_query_groups, b0.mlp, b0.norm, b0.bias) == (2, "swiglu", "rmsnorm", False)
    assert b1.num_query_groups == 2 and 2 in m.tp_divisors
    assert (mlp.mlp, mlp.ffn_hidden_size, mlp.norm, mlp.bias) == ("swiglu", 96, "layernorm", True)
    assert emb.tie_embeddings and head.tie_embeddings and head.norm == "rmsnorm"


@pytest.mark.parametrize("item,message", [
    ({"kind": "embedding", "hidden_size": 64, "vocab_size": 100, "mlp": "swiglu"},
     "model.layers[0].mlp: not used by a embedding layer; it takes: position_embedding, "
     "tie_embeddings"),
    ({"kind": "mlp", "hidden_size": 64, "num_query_groups": 2},
     "model.layers[0].num_query_groups: not used by a mlp layer"),
    ({"kind": "transformer", "hidden_size": 64, "num_attention_heads": 8,
      "num_query_groups": 3}, "model.layers[0].num_query_groups: 3 must divide "
                              "num_attention_heads (8)"),
    ({"kind": "head", "hidden_size": 64, "vocab_size": 100, "position_embedding": "rope"},
     "model.layers[0].position_embedding: not used by a head layer"),
])
def test_layers_preset_bad_keys(item, message):
    with pytest.raises(SpecError) as err:
        _layers(item)
    assert message in str(err.value)


def test_layers_preset_tying_needs_both_ends():
    with pytest.raises(SpecError, match=r"^model.layers\[0\].tie_embeddings: tie_embeddings: "
                                        r"true needs one embedding and one head"):
        _layers({"kind": "embedding", "hidden_size": 64, "vocab_size": 100,
                 "tie_embeddings": True},
                {"kind": "head", "hidden_size": 64, "vocab_size": 100})
    with pytest.raises(SpecError, match="model.num_query_groups: not used with preset: layers"):
        _model(preset="layers", seq_length=8, num_query_groups=2,
               layers=[{"kind": "mlp", "hidden_size": 8}])


# ----------------------------------------------------------------------------- Megatron-LM

def _args(model) -> list[str]:
    n = len(model.layers)
    s = Strategy(pp=1, dp=8, tmp=1, mbs=1, global_batch_size=8, partition=(0, n),
                 placement=(tuple((i,) for i in range(8)),), zero_stage=0,
                 activation_checkpointing=False)
    return megatron_args(model.layers, s, precision="bf16", iters=2)


def _pairs(args: list[str]) -> dict:
    return {a: (args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--")
                else True) for i, a in enumerate(args) if a.startswith("--")}


def test_megatron_args_of_llama3_8b():
    args = _pairs(_args(_model(preset="llama3-8b")))
    expected = {"--group-query-attention": True, "--num-query-groups": "8", "--swiglu": True,
                "--normalization": "RMSNorm", "--position-embedding-type": "rope",
                "--disable-bias-linear": True, "--untie-embeddings-and-output-weights": True,
                "--ffn-hidden-size": "14336", "--num-layers": "32", "--hidden-size": "4096",
                "--num-attention-heads": "32", "--vocab-size": "128256",
                "--seq-length": "8192"}
    assert {k: args.get(k) for k in expected} == expected
    assert "--kv-channels" not in args                    # 128 = 4096 / 32
    assert "--qk-layernorm" not in args


def test_megatron_args_of_qwen3_and_tied_models():
    args = _pairs(_args(_model(preset="qwen3-32b")))
    assert args["--kv-channels"] == "128" and args["--num-query-groups"] == "8"
    assert args["--qk-layernorm"] is True
    tied = _args(_model(**GPT, tie_embeddings=True))
    assert "--untie-embeddings-and-output-weights" not in tied
    assert "--position-embedding-type" in tied and \
        tied[tied.index("--position-embedding-type") + 1] == "learned_absolute"


def test_megatron_args_of_the_gpt_block_are_unchanged():
    args = _args(_model(**GPT))
    for flag in ("--group-query-attention", "--num-query-groups", "--kv-channels", "--swiglu",
                 "--normalization", "--disable-bias-linear", "--qk-layernorm"):
        assert flag not in args
    i = args.index("--ffn-hidden-size")
    assert args[i:i + 4] == ["--ffn-hidden-size", "256", "--seq-length", "32"]
    assert "--untie-embeddings-and-output-weights" in args


def test_fingerprint_of_a_gpt_model_ignores_the_new_fields():
    """Plans written before the Llama-family fields existed keep matching their spec."""
    import dataclasses
    import hashlib
    import json

    from amp_search.model_spec import (ARCH_KEYS, DROPOUT_LAYER_FIELDS, MOE_LAYER_FIELDS,
                                       TRAINING_LAYER_FIELDS, WINDOW_LAYER_FIELDS)
    from amp_search.spec import spec_fingerprint

    spec = parse_spec(_raw(GPT))
    old = dataclasses.asdict(spec.model)
    for layer in old["layers"]:
        for k in ARCH_KEYS + MOE_LAYER_FIELDS + WINDOW_LAYER_FIELDS + DROPOUT_LAYER_FIELDS \
                + TRAINING_LAYER_FIELDS:
            del layer[k]
    text = json.dumps(old, sort_keys=True, default=str)
    assert spec_fingerprint(spec)["model"] == hashlib.sha256(text.encode()).hexdigest()
    tied = parse_spec(_raw({**GPT, "tie_embeddings": True}))
    assert spec_fingerprint(tied)["model"] != spec_fingerprint(spec)["model"]
