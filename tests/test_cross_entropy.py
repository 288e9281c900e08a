"""training.cross_entropy (Megatron-LM's --cross-entropy-loss-fusion
--cross-entropy-fusion-impl te, Transformer Engine's fused cross-entropy): what the head keeps
and moves, the spec's checks, and the arguments."""
from __future__ import annotations

import dataclasses

import pytest
import yaml
from conftest import h100_megatron_spec

from amp_search.cli import main
from amp_search.errors import SpecError
from amp_search.launch.megatron import megatron_args, training_kwargs
from amp_search.planner import estimate
from amp_search.spec import parse_spec, spec_fingerprint
from cost_models import activations
from cost_models.layers import Layer, elementwise_bytes, padded_vocab_size

S, H, V = 512, 256, 50000
HEAD = Layer(kind="head", seq_length=S, hidden_size=H, vocab_size=V, norm="rmsnorm",
             bias=False)
MODEL = {"preset": "gpt", "num_layers": 4, "hidden_size": H, "num_attention_heads": 8,
         "seq_length": S, "vocab_size": V, "mlp": "swiglu", "norm": "rmsnorm", "bias": False,
         "position_embedding": "rope", "ffn_hidden_size": 512}


def _spec(**training) -> dict:
    return h100_megatron_spec(MODEL, **training)


@pytest.mark.parametrize("tmp", [1, 2])
def test_the_fused_loss_keeps_the_gradient_in_the_logits_dtype(tmp):
    g, mbs = 2, 2
    te = dataclasses.replace(HEAD, cross_entropy="te")
    v = padded_vocab_size(V, tmp) // tmp
    native = activations.layer_saved_bytes(HEAD, mbs=mbs, tmp=tmp, bytes_per_element=g)
    fused = activations.layer_saved_bytes(te, mbs=mbs, tmp=tmp, bytes_per_element=g)
    norm = g * (2 * H + 1)                   # the norm's input and output, RMSNorm's rstd
    # Megatron-LM's: the fp32 softmax, the target mask and the masked target
    assert native == (norm + 4 * v + 1 + 8) * S * mbs
    # Transformer Engine's: the gradient in bf16, two fp32 statistics and the target
    assert fused == (norm + g * v + 4 + 4 + 8) * S * mbs
    # and its kernels move 5 elements a logit instead of the fp32 loss's 60 bytes
    assert elementwise_bytes(HEAD, tmp, g) - elementwise_bytes(te, tmp, g) \
        == pytest.approx((60 - 5 * g) / 3 * S * v)


def test_the_spec_puts_it_on_the_head_and_the_arguments_pass_it():
    plain, te = parse_spec(_spec()), parse_spec(_spec(cross_entropy="te"))
    assert te.training.cross_entropy == "te" and plain.training.cross_entropy == "native"
    assert [x.cross_entropy for x in te.model.layers if x.kind == "head"] == ["te"]
    assert all(x.cross_entropy == "native" for x in te.model.layers if x.kind != "head")
    assert te.model.layers[-1].signature.endswith(":ce-te")
    kw = dict(pp=2, dp=4, tmp=1, mbs=2, activation_checkpointing="none")
    e, p = estimate(te, **kw), estimate(plain, **kw)
    assert e.memory[-1].activation_bytes < p.memory[-1].activation_bytes   # the head's stage
    assert e.memory[0].activation_bytes == p.memory[0].activation_bytes
    args = megatron_args(te.model.layers, e.strategy, precision="bf16", iters=2,
                         **training_kwargs(te.training, e.strategy))
    i = args.index("--cross-entropy-loss-fusion")
    assert args[i:i + 3] == ["--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"]
    assert "--cross-entropy-loss-fusion" not in megatron_args(
        plain.model.layers, p.strategy, precision="bf16", iters=2,
        **training_kwargs(plain.training, p.strategy))
    # written out as the default, the spec is the one without the key
    assert spec_fingerprint(parse_spec(_spec(cross_entropy="native")))["model"] == \
        spec_fingerprint(plain)["model"]
    assert spec_fingerprint(te)["model"] != spec_fingerprint(plain)["model"]


def test_no_backend_given_plans_it_with_megatron_only():
    data = _spec(cross_entropy="te")
    del data["training"]["backend"]
    spec = parse_spec(data)
    assert spec.training.backend == "megatron" and not spec.other_backends
    assert any(n.startswith("deepspeed:") and "training.cross_entropy" in n
               for n in spec.backend_notes)


@pytest.mark.parametrize("training,words", [
    ({"cross_entropy": "te", "backend": "deepspeed"}, ["training.cross_entropy",
                                                       "backend: megatron"]),
    ({"cross_entropy": "te", "precision": "fp16"}, ["training.cross_entropy", "bf16"]),
    ({"cross_entropy": "fused"}, ["training.cross_entropy", "native", "te"]),
])
def test_what_the_spec_refuses(training, words):
    with pytest.raises(SpecError) as exc:
        parse_spec(_spec(**training))
    assert all(w in str(exc.value) for w in words)


def test_the_plan_header_says_it(tmp_path, capsys, monkeypatch):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(cross_entropy="te")))
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["plan", str(path), "--top-k", "2", "--no-progress", "--no-simulate"]) == 0
    assert "Transformer Engine's fused cross-entropy (training.cross_entropy)" \
        in capsys.readouterr().out


def test_the_cli_says_it_in_one_line(tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(cross_entropy="te", backend="deepspeed")))
    assert main(["plan", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "training.cross_entropy" in err
