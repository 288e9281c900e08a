"""training.recompute_modules (Megatron-LM's --recompute-modules with selective recomputation):
what each module frees and costs, the spec's checks, the search rule and the arguments."""
from __future__ import annotations

import dataclasses

import pytest
from conftest import h100_megatron_spec

from amp_search.cli import main
from amp_search.errors import SpecError
from amp_search.launch.megatron import megatron_args, training_kwargs
from amp_search.planner import estimate
from amp_search.search_space import (EQUIVALENCE_RULES, Candidate, Reason, SearchSpace,
                                     first_violation)
from amp_search.spec import parse_spec
from cost_models import activations
from cost_models.compute import DeviceSpeed
from cost_models.layers import Layer
from cost_models.recompute import selective_recompute_time_s

S, H, A, G, D, E, K, FE = 1024, 512, 8, 2, 64, 16, 4, 256
MOE = Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
            num_query_groups=G, head_dim=D, ffn_hidden_size=1024, mlp="swiglu",
            norm="rmsnorm", bias=False, position_embedding="rope", num_experts=E,
            moe_router_topk=K, moe_ffn_hidden_size=FE)
DENSE = dataclasses.replace(MOE, num_experts=0, moe_router_topk=0, moe_ffn_hidden_size=0)
MODEL = {"preset": "gpt", "num_layers": 4, "hidden_size": 256, "num_attention_heads": 8,
         "seq_length": 512, "vocab_size": 1024, "mlp": "swiglu", "norm": "rmsnorm",
         "bias": False, "position_embedding": "rope", "ffn_hidden_size": 512,
         "num_experts": 16, "moe_router_topk": 2, "moe_ffn_hidden_size": 128}


def _spec(model=MODEL, **training) -> dict:
    return h100_megatron_spec(model, **training)


def _saved(layer, selective, fp8=False, tmp=1):
    return activations.layer_saved_bytes(layer, mbs=2, tmp=tmp, bytes_per_element=2,
                                         selective=selective, fp8=fp8)


def test_each_module_frees_what_it_recomputes():
    g, mbs = 2, 2
    core = _saved(MOE, False) - _saved(MOE, True)
    assert core == 4 * A * S * mbs                            # the log-sum-exp (fp32)
    assert _saved(MOE, ("core_attn",)) == _saved(MOE, True)
    # layernorm: the pre-MLP norm's output (the router's input), in any precision
    assert _saved(MOE, False) - _saved(MOE, ("layernorm",)) == g * H * S * mbs
    assert _saved(MOE, False, fp8=True) - _saved(MOE, ("layernorm",), fp8=True) \
        == g * H * S * mbs
    # moe_act: fc2's 16-bit input, k f_e per token; under FP8 fc2 keeps its FP8 copy anyway
    assert _saved(MOE, False) - _saved(MOE, ("moe_act",)) == g * K * FE * S * mbs
    assert _saved(MOE, False, fp8=True) == _saved(MOE, ("moe_act",), fp8=True)
    both = ("layernorm", "moe_act")
    assert _saved(MOE, False) - _saved(MOE, both) == g * (H + K * FE) * S * mbs
    # sequence parallelism splits the norm's output over the tensor ranks, the experts' by
    # their tokens
    sp = activations.layer_saved_bytes(MOE, mbs=2, tmp=2, bytes_per_element=2,
                                       sequence_parallel=True, selective=both)
    assert activations.layer_saved_bytes(MOE, mbs=2, tmp=2, bytes_per_element=2,
                                         sequence_parallel=True) - sp \
        == g * (H + K * FE) // 2 * S * mbs
    # a dense block: Transformer Engine fuses its norms into the linear layers after them
    assert _saved(DENSE, ("layernorm",)) == _saved(DENSE, False)
    # during the backward, one layer's recomputed tensors exist again
    work = activations.selective_working_set_bytes(MOE, mbs=2, tmp=1, bytes_per_element=2,
                                                   selective=both)
    assert work == g * (H + K * FE) * S * mbs
    with pytest.raises(ValueError, match="known"):
        _saved(MOE, ("mlp",))


def test_each_module_costs_its_forward_again():
    bw = 2e12
    device = DeviceSpeed(peak_flops_per_s=1e15, memory_bandwidth_bytes_per_s=bw)
    kw = dict(tmp=1, mbs=2, device=device, bytes_per_element=2, attention="flash")
    core = selective_recompute_time_s(MOE, **kw).backward_s
    assert core > 0
    extra = selective_recompute_time_s(MOE, modules=("layernorm", "moe_act"), **kw).backward_s
    assert extra == pytest.approx((2 * 2 * H + 3 * 2 * K * FE) * S * 2 / bw)
    both = selective_recompute_time_s(MOE, modules=("core_attn", "layernorm", "moe_act"), **kw)
    assert both.backward_s == pytest.approx(core + extra)
    assert selective_recompute_time_s(DENSE, modules=("layernorm",), **kw).backward_s == 0.0


def test_the_spec_reads_and_checks_recompute_modules():
    from amp_search.spec import RECOMPUTE_MODULES

    # the spec's names are the cost model's (two tuples: the spec does not import numpy)
    assert RECOMPUTE_MODULES == activations.RECOMPUTABLE
    spec = parse_spec(_spec(activation_checkpointing="selective",
                            recompute_modules=["moe_act", "layernorm"]))
    assert spec.training.recompute_modules == ("layernorm", "moe_act")   # canonical order
    assert spec.training.selective(True) == ("layernorm", "moe_act")
    assert spec.training.selective(False) is False
    default = parse_spec(_spec(activation_checkpointing="selective"))
    assert default.training.recompute_modules == ("core_attn",)
    assert default.training.selective(True) is True
    bad = [({"activation_checkpointing": "selective", "recompute_modules": ["mlp"]},
            "accepted: a list of some of core_attn, layernorm, moe_act"),
           ({"activation_checkpointing": "selective", "recompute_modules": []}, "accepted"),
           ({"activation_checkpointing": "selective",
             "recompute_modules": ["layernorm", "layernorm"]}, "accepted"),
           ({"activation_checkpointing": "none", "recompute_modules": ["layernorm"]},
            "activation_checkpointing selective"),
           ({"activation_checkpointing": "selective", "recompute_modules": ["layernorm"],
             "backend": "deepspeed", "precision": "fp32"}, "attention core only")]
    for training, message in bad:
        with pytest.raises(SpecError, match=message) as err:
            parse_spec(_spec(**training))
        assert "training.recompute_modules" in str(err.value)
    dense = {k: v for k, v in MODEL.items() if not k.startswith(("num_experts", "moe_"))}
    with pytest.raises(SpecError, match="no experts"):
        parse_spec(_spec(dense, activation_checkpointing="selective",
                         recompute_modules=["moe_act"]))


def test_the_cli_says_one_line_for_a_bad_module(tmp_path, capsys):
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(activation_checkpointing="selective",
                                         recompute_modules=["moe"])))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "training.recompute_modules" in err[0] and "moe_act" in err[0]


def test_selective_under_flash_is_searched_when_it_frees_more():
    """Recomputing the attention core alone under flash attention frees next to nothing (the
    search leaves it out); with the norm and the experts' activation it frees real memory."""
    c = Candidate(pp=1, dp=8, tmp=1, mbs=1, zero_stage=1, activation_checkpointing=False,
                  selective_recompute=True, ep=8)
    plain = SearchSpace.of(parse_spec(_spec(activation_checkpointing="search")))
    assert not plain.attention_scores
    v = first_violation(plain, c, EQUIVALENCE_RULES)
    assert v is not None and v.reason == Reason.SELECTIVE_WITH_FLASH
    more = SearchSpace.of(parse_spec(_spec(activation_checkpointing="search",
                                           recompute_modules=["layernorm", "moe_act"])))
    assert first_violation(more, c, EQUIVALENCE_RULES) is None


def test_the_estimate_and_the_arguments_follow_the_modules():
    modules = ["layernorm", "moe_act"]
    spec = parse_spec(_spec(activation_checkpointing="selective", recompute_modules=modules))
    plain = parse_spec(_spec(activation_checkpointing="selective"))
    kw = dict(pp=1, dp=8, tmp=1, mbs=2, ep=8, activation_checkpointing="selective")
    e, p = estimate(spec, **kw), estimate(plain, **kw)
    assert e.memory[0].activation_bytes < p.memory[0].activation_bytes
    args = megatron_args(spec.model.layers, e.strategy, precision="bf16", iters=2,
                         **training_kwargs(spec.training, e.strategy))
    i = args.index("--recompute-modules")
    assert args[i - 2:i + 3] == ["--recompute-granularity", "selective",
                                 "--recompute-modules", "layernorm", "moe_act"]
    args = megatron_args(plain.model.layers, p.strategy, precision="bf16", iters=2,
                         **training_kwargs(plain.training, p.strategy))
    assert "--recompute-granularity" in args and "--recompute-modules" not in args


def test_the_plan_legend_names_the_modules(tmp_path, capsys):
    import yaml

    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(activation_checkpointing=["none", "selective"],
                                         recompute_modules=["layernorm", "moe_act"])))
    assert main(["plan", str(path), "--top-k", "2", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "sel: layernorm, moe_act, training.recompute_modules" in out
