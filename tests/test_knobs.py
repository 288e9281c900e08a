"""Sequence parallelism and selective recomputation: the terms of
Korthikanti et al. 2022 with hand-computed values, the trial layers' counts against their
Table 2, the spec keys and flags, the search rules, and searches that pick each knob where
only it fits."""
from __future__ import annotations

from dataclasses import replace

import json

import pytest

from amp_search import Infeasible, estimate, plan
from amp_search.planner import NoFeasibleStrategy
from amp_search.search_space import Reason
from amp_search.spec import SpecError, parse_spec
from cost_models import activations
from cost_models.compute import DeviceSpeed, attention_time_s, gemm_time_s
from cost_models.layers import Layer
from cost_models.recompute import (paper_activation_bytes_per_layer,
                                   paper_attention_core_bytes_per_layer,
                                   replicated_elementwise_bytes,
                                   replicated_elementwise_bytes_by_pass,
                                   selective_recompute_time_s, sequence_parallel_time_s)

# GPT-3 175B as in the paper (section 4, Table 3): s 2048, h 12288, a 96, t 8
GPT3 = dict(s=2048, b=1, h=12288, a=96, t=8)
SBH = 2048 * 12288


# ----------------------------------------------------------------------------- Table 2

def test_table2_gpt3_175b_by_hand():
    # 5as/h = 5 * 96 * 2048 / 12288 = 80 for GPT-3 (section 4.3)
    assert 5 * 96 * 2048 / 12288 == 80
    p = paper_activation_bytes_per_layer
    assert p(**{**GPT3, "t": 1}) == SBH * (34 + 80)
    assert p(**GPT3) == SBH * (10 + 24 / 8 + 80 / 8) == SBH * 23
    assert p(**GPT3, sequence_parallel=True) == SBH / 8 * (34 + 80) == SBH * 14.25
    assert p(**GPT3, recompute="selective") == SBH * 13
    assert p(**GPT3, sequence_parallel=True, recompute="selective") == SBH * 34 / 8
    assert p(**GPT3, recompute="full") == 2 * SBH
    # "selective recomputation ... 70 % reduction for GPT-3": 80 of 114 per sbh/t
    saved = 1 - p(**GPT3, sequence_parallel=True, recompute="selective") \
        / p(**GPT3, sequence_parallel=True)
    assert saved == pytest.approx(80 / 114) and round(saved, 2) == 0.70
    # MT-NLG 530B (a 128, h 20480): 5as/h = 64, "65 %"
    mt = dict(s=2048, b=1, h=20480, a=128, t=8, sequence_parallel=True)
    assert round(1 - p(**mt, recompute="selective") / p(**mt), 2) == 0.65
    # the dropped part is the attention core's 5 a s^2 b / t
    assert p(**GPT3) - p(**GPT3, recompute="selective") == \
        paper_attention_core_bytes_per_layer(s=2048, b=1, a=96, t=8)
    with pytest.raises(ValueError, match="accepted: none, selective, full"):
        p(**GPT3, recompute="some")


def block(s=2048, h=12288, a=96):
    return Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
                 ffn_hidden_size=4 * h)


@pytest.mark.parametrize("t", [1, 2, 8])
@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("selective", [False, True])
def test_trial_layer_counts_are_table2_without_dropout(t, sp, selective):
    """The trial block in fp16 with standard attention saves Table 2's bytes less the two
    dropout masks it does not have (sbh, or sbh/t with SP) plus the LayerNorm statistics
    (2 x 2 x 2 B per token, /t with SP) and the attention log-sum-exp (4a/t per token, dropped
    by selective recomputation)."""
    s, h, a = 2048, 12288, 96
    sp = sp and t > 1
    got = activations.layer_saved_bytes(block(), mbs=1, tmp=t, bytes_per_element=2,
                              attention_scores=True, sequence_parallel=sp, selective=selective)
    paper = paper_activation_bytes_per_layer(s=s, b=1, h=h, a=a, t=t, sequence_parallel=sp,
                                             recompute="selective" if selective else "none")
    q = t if sp else 1
    extra = 8 * s / q + (0 if selective else 4 * a * s / t)
    assert got == pytest.approx(paper - 2 * s * h / q + extra, rel=1e-12)


def test_trial_layer_counts_by_hand():
    """A small block, fp32, flash attention, t = 2: g(4h + 4) replicated per token, halved by
    sequence parallelism; selective drops the 4a/t log-sum-exp only."""
    x = Layer(kind="transformer", seq_length=32, hidden_size=64, num_attention_heads=4,
              ffn_hidden_size=256)
    kw = dict(mbs=1, tmp=2, bytes_per_element=4)
    # replicated 4(4*64 + 4) = 1040, split 4(128 + 256) + 4*4/2 = 1544, per token
    assert activations.layer_saved_bytes(x, **kw) == (1040 + 1544) * 32 == 82688
    assert activations.layer_saved_bytes(x, sequence_parallel=True, **kw) == 1040 * 16 + 1544 * 32
    assert activations.layer_saved_bytes(x, selective=True, **kw) == 82688 - 8 * 32
    # sp is a no-op at t = 1; the checkpointed input and a pipeline buffer are the s/t shard
    assert activations.layer_saved_bytes(x, mbs=1, tmp=1, bytes_per_element=4, sequence_parallel=True) \
        == activations.layer_saved_bytes(x, mbs=1, tmp=1, bytes_per_element=4)
    assert activations.checkpoint_input_bytes(x, mbs=1, bytes_per_element=4, tmp=2,
                                    sequence_parallel=True) == 4 * 32 * 64 // 2
    # a pipeline buffer holds 1/t of the output on each tensor rank (SP shard, or DeepSpeed's
    # partitioning of the replicated output)
    assert activations.stage_output_buffer_bytes(x, mbs=1, tmp=2, bytes_per_element=4) == 4 * 32 * 64 / 2
    # selective's backward working set: one core's output (g h/t) and log-sum-exp per token
    assert activations.selective_working_set_bytes(x, **kw) == (4 * 32 + 8) * 32


# ----------------------------------------------------------------------------- time

A100 = DeviceSpeed(peak_flops_per_s=312e12, memory_bandwidth_bytes_per_s=2.0e12)


def test_selective_recompute_time_is_the_attention_core_once_more():
    x = block()
    for attention in ("flash", "standard"):
        k = selective_recompute_time_s(x, tmp=8, mbs=1, device=A100, bytes_per_element=2,
                                       attention=attention)
        assert k.forward_s == 0 and k.backward_s == attention_time_s(
            x, tmp=8, mbs=1, device=A100, bytes_per_element=2, attention=attention) > 0
    # standard: (4g + 1) = 9 B per score of the a s^2 / t scores in fp16 for the softmax and
    # dropout, and its two batched GEMMs at the roofline: compute-bound at this head width
    # (d = 128), so each takes its FLOPs' time, 2 s^2 d per head, at GEMM efficiency
    std = selective_recompute_time_s(x, tmp=8, mbs=1, device=A100, bytes_per_element=2,
                                     attention="standard")
    flops = 2 * 2048 ** 2 * 128 * 96 / 8
    gemm = gemm_time_s(flops, A100)
    assert gemm > 2 * 96 * 2048 ** 2 / 8 / 2.0e12            # past the memory roofline
    assert std.backward_s == pytest.approx(2 * gemm + 96 * 2048 ** 2 / 8 * 9 / 2.0e12)
    # flash: the core's 4 s^2 h / t FLOPs as one GEMM
    fl = selective_recompute_time_s(x, tmp=8, mbs=1, device=A100, bytes_per_element=2,
                                    attention="flash")
    assert fl.backward_s == pytest.approx(gemm_time_s(4 * 2048 ** 2 * 12288 / 8, A100))
    # in FLOPs: 4 b s^2 h against 72 b s h^2 (1 + s/6h): 0.9 % for GPT-3
    ratio = 4 * 2048 ** 2 * 12288 / (72 * 2048 * 12288 ** 2 * (1 + 2048 / (6 * 12288)))
    assert round(ratio, 4) == 0.0090
    head = Layer(kind="head", seq_length=2048, hidden_size=12288, vocab_size=51200)
    assert selective_recompute_time_s(head, tmp=8, mbs=1, device=A100, bytes_per_element=2,
                                      attention="flash").total_s == 0


def test_sequence_parallel_time_splits_the_replicated_elementwise_work():
    x = block()
    assert replicated_elementwise_bytes(x, 2) == 16 * 2048 * 12288 * 2
    k = sequence_parallel_time_s(x, tmp=8, mbs=2, device=A100, bytes_per_element=2)
    fwd = 16 * 2048 * 12288 * 2 * 2 * (1 - 1 / 8) / 2.0e12
    assert k.forward_s == pytest.approx(-fwd) and k.backward_s == pytest.approx(-2 * fwd)
    full = sequence_parallel_time_s(x, tmp=8, mbs=2, device=A100, bytes_per_element=2,
                                    recompute=True)
    assert full.backward_s == pytest.approx(-3 * fwd)
    assert sequence_parallel_time_s(x, tmp=1, mbs=2, device=A100,
                                    bytes_per_element=2).total_s == 0


def test_sequence_parallel_under_megatron_splits_its_fused_kernels_bytes():
    """Under Megatron the split region is the fused norms and bias-dropout-adds of the
    layer's own elementwise count: that count less the t-split permute and activation; a
    residual add's backward is the identity, so the backward is not twice the forward."""
    from cost_models.layers import elementwise_bytes_by_pass
    x = block()
    g, s, h, f, t = 2, 2048, 12288, 4 * 12288, 8
    fwd, bwd = replicated_elementwise_bytes_by_pass(x, g, "megatron")
    assert (fwd, bwd) == ((10 * g + 2) * s * h, (18 * g + 2) * s * h)
    whole_fwd, whole_bwd = elementwise_bytes_by_pass(x, t, g, "megatron")
    assert whole_fwd - fwd == pytest.approx(s * (2 * g * h + 2 * g * f / t))
    assert whole_bwd - bwd == pytest.approx(s * (2 * g * h + 4 * g * f / t))
    assert replicated_elementwise_bytes_by_pass(x, g, "deepspeed") == (
        replicated_elementwise_bytes(x, g), 2 * replicated_elementwise_bytes(x, g))
    meg = sequence_parallel_time_s(x, tmp=t, mbs=2, device=A100, bytes_per_element=g,
                                   framework="megatron")
    share = 2 * (1 - 1 / t) / 2.0e12
    assert meg.forward_s == pytest.approx(-fwd * share)
    assert meg.backward_s == pytest.approx(-bwd * share)
    ds = sequence_parallel_time_s(x, tmp=t, mbs=2, device=A100, bytes_per_element=g)
    assert ds.total_s < meg.total_s < 0
    full = sequence_parallel_time_s(x, tmp=t, mbs=2, device=A100, bytes_per_element=g,
                                    framework="megatron", recompute=True)
    assert full.backward_s == pytest.approx(-(bwd + fwd) * share)


# ----------------------------------------------------------------------------- spec and planner

def gpt_spec(*, sp=False, ckpt="none", seq=2048, layers=8, gpu="A100-40GB", count=1, per=2,
             h=4096, a=32, gbs=8):
    node = {"gpu": gpu, "count": count, "gpus_per_node": per,
            "intra_node_bandwidth": "150 GB/s", "inter_node_bandwidth": "100 Gbps"}
    return parse_spec({
        "cluster": {"nodes": [node]},
        "model": {"preset": "gpt", "num_layers": layers, "hidden_size": h,
                  "num_attention_heads": a, "seq_length": seq, "vocab_size": 32000},
        "training": {"global_batch_size": gbs, "precision": "fp16", "zero_stage": 1,
                     "activation_checkpointing": ckpt, "sequence_parallel": sp}})


def test_spec_keys():
    assert gpt_spec().training.sequence_parallel == (False,)
    assert gpt_spec(sp=True).training.sequence_parallel == (True,)
    assert gpt_spec(sp="search").training.sequence_parallel == (False, True)
    assert gpt_spec(ckpt="selective").training.activation_checkpointing == ("selective",)
    assert gpt_spec(ckpt="search").training.activation_checkpointing == \
        ("none", "selective", "full")
    assert gpt_spec(ckpt=["full", "none"]).training.activation_checkpointing == \
        ("none", "full")
    with pytest.raises(SpecError, match="training.sequence_parallel: got 'on'; accepted: "
                                        "true, false, search"):
        gpt_spec(sp="on")


def test_estimate_costs_both_knobs_and_names_the_rule():
    spec = gpt_spec(gpu="V100-32GB", seq=4096)     # standard attention: scores are stored
    kw = dict(pp=1, dp=1, tmp=2, mbs=1)
    base = estimate(spec, **kw)
    sp = estimate(spec, **kw, sequence_parallel=True)
    sel = estimate(spec, **kw, activation_checkpointing="selective")
    full = estimate(spec, **kw, activation_checkpointing="full")
    act = {k: e.memory[0].activation_bytes for k, e in
           (("base", base), ("sp", sp), ("sel", sel), ("full", full))}
    assert act["sp"] < act["base"] and act["sel"] < act["base"] and act["full"] < act["sel"]
    # SP: the same forward volume but backward re-gathers the column GEMMs' inputs and every
    # all-reduce is two calls (tests/test_distopt_sp.py has the hand-computed terms);
    # selective: the core once more, less than full recomputation's whole forward
    assert sp.breakdown.tensor_parallel_s > base.breakdown.tensor_parallel_s
    assert base.iteration_time_s < sel.iteration_time_s < full.iteration_time_s
    assert sp.strategy.sequence_parallel and sp.strategy.label().endswith("-sp")
    assert sel.strategy.recompute == "selective" and sel.to_dict()["recompute"] == "selective"
    assert sp.to_dict()["sequence_parallel"] is True
    with pytest.raises(Infeasible, match="sequence_parallel_without_tp"):
        estimate(spec, pp=1, dp=2, tmp=1, mbs=1, sequence_parallel=True)
    odd = gpt_spec(seq=2047, count=1, per=2)
    with pytest.raises(Infeasible, match="sequence_not_divisible_by_tmp"):
        estimate(odd, **kw, sequence_parallel=True)


def test_sequence_parallel_sends_a_shard_between_stages():
    """Under DeepSpeed both send 1/tmp of the activation (sequence parallelism its shard,
    the pipeline engine otherwise its partition, rebuilt by all-gathers that only the
    latter pays); under Megatron-LM only sequence parallelism splits it."""
    spec = gpt_spec(per=4)
    kw = dict(pp=2, dp=1, tmp=2, mbs=1, partition="uniform")
    a = estimate(spec, **kw).breakdown.p2p_s
    b = estimate(spec, **kw, sequence_parallel=True).breakdown.p2p_s
    assert b < a
    spec = replace(spec, training=replace(spec.training, backend="megatron", zero_stage=(0,)))
    a = estimate(spec, **kw).breakdown.p2p_s
    b = estimate(spec, **kw, sequence_parallel=True).breakdown.p2p_s
    assert b == pytest.approx(a / 2, rel=0.05)


def test_search_picks_selective_where_only_it_fits():
    """V100 (standard attention), s = 5120: nothing fits without recomputation; selective
    drops the scores and is faster than full recomputation, so the search ranks it first."""
    with pytest.raises(NoFeasibleStrategy):
        plan(gpt_spec(gpu="V100-16GB", seq=5120, h=2048, a=16))
    result = plan(gpt_spec(gpu="V100-16GB", seq=5120, h=2048, a=16, ckpt="search"))
    best = result.strategies[0].strategy
    assert best.recompute == "selective"
    full = plan(gpt_spec(gpu="V100-16GB", seq=5120, h=2048, a=16, ckpt="full"))
    assert result.strategies[0].iteration_time_s < full.strategies[0].iteration_time_s


def test_search_picks_sequence_parallel_where_only_it_fits():
    """A100-40GB (flash), 16 layers of h 4096 at s = 5120: without sequence parallelism no
    layout fits; with `search` the only feasible plans are tmp 2 with sequence parallelism;
    selective recomputation is pruned under flash attention with its reason."""
    with pytest.raises(NoFeasibleStrategy):
        plan(gpt_spec(seq=5120, layers=16))
    result = plan(gpt_spec(seq=5120, layers=16, sp="search"))
    assert result.strategies and all(e.strategy.sequence_parallel and e.strategy.tmp == 2
                                     for e in result.strategies)
    assert result.pruned[Reason.SEQUENCE_PARALLEL_WITHOUT_TP.value] > 0
    both = plan(gpt_spec(seq=2048, sp="search", ckpt="search"))
    assert both.pruned[Reason.SELECTIVE_WITH_FLASH.value] > 0


def test_cli_estimate_flags_table_and_json(tmp_path, capsys):
    from amp_search.cli import main
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps({
        "cluster": {"nodes": [{"gpu": "V100-32GB", "count": 1, "gpus_per_node": 2,
                               "intra_node_bandwidth": "150 GB/s",
                               "inter_node_bandwidth": "100 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 4, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 32000},
        "training": {"global_batch_size": 8, "precision": "fp16"}}))
    out = tmp_path / "e.json"
    rc = main(["estimate", str(path), "--pp", "1", "--dp", "1", "--tmp", "2", "--mbs", "1",
               "--sequence-parallel", "--activation-checkpointing", "selective",
               "--json", str(out)])
    text = capsys.readouterr().out
    assert rc == 0
    d = json.loads(out.read_text())
    assert d["sequence_parallel"] is True and d["recompute"] == "selective"
    head = [ln for ln in text.splitlines() if ln.startswith("rank")][0].split()
    row = [ln for ln in text.splitlines() if ln.strip().startswith("-  ")][0].split()
    assert row[head.index("ckpt")] == "sel" and row[head.index("sp")] == "yes"
    rc = main(["estimate", str(path), "--pp", "1", "--dp", "2", "--tmp", "1", "--mbs", "1",
               "--sequence-parallel"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "sequence_parallel_without_tp" in err[0]


def test_simulator_costs_the_knobs_like_the_closed_form():
    """The event simulator's passes of a sequence-parallel, selectively recomputed strategy
    sum to the closed form's stage times (knob time included), and its P2P carries the s/t
    shard."""
    import numpy as np

    from amp_search.costing import CostModel
    from amp_search.search_space import Candidate
    from amp_search.simulate import pass_times, simulation_inputs

    spec = gpt_spec(gpu="V100-32GB", per=4, seq=2048)
    model = CostModel(spec)
    kw = dict(pp=2, dp=1, tmp=2, mbs=1, partition="uniform")
    e = estimate(spec, **kw, sequence_parallel=True, activation_checkpointing="selective")
    s = e.strategy
    assert Candidate.of(s).sequence_parallel and Candidate.of(s).selective_recompute
    c = Candidate.of(s)
    layout = model.layout(c, placement=np.array(s.placement))
    t = pass_times(model, c, layout, model.stage_costs(c, layout), s.partition)
    np.testing.assert_allclose(t.forward_s + t.backward_s, e.stage_time_s, rtol=1e-9)
    plain = estimate(spec, **kw)
    k_sp = simulation_inputs(model, s)
    k_plain = simulation_inputs(model, plain.strategy)
    np.testing.assert_allclose(k_sp["p2p_bytes"], k_plain["p2p_bytes"])  # both 1/tmp
    assert np.all(k_plain["p2p_latency_s"] > k_sp["p2p_latency_s"])      # + the gathers
