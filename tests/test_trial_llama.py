"""amp_search.trial.model builds Llama-family blocks (grouped-query attention, head_dim,
SwiGLU, RMSNorm, no biases, rotary positions) for real: per-rank parameters equal
cost_models.layers.param_count at tmp 1 and 2, tmp 1 and tmp 2 compute the same loss, the
grouped attention matches a plain reference, tied embeddings are refused, and one real
DeepSpeed trial of configs/cpu-tiny-llama.yaml at tmp 2 ends ok."""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

import torch.nn.functional as F  # noqa: E402

from cost_models.layers import Layer, param_count  # noqa: E402
from amp_search.trial import model as trial_model  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
S, H, A, G, F_, V = 16, 64, 4, 2, 176, 256   # V: padded alike at tmp 1 and 2
LLAMA = dict(mlp="swiglu", norm="rmsnorm", bias=False)
LAYERS = [
    Layer(kind="embedding", seq_length=S, hidden_size=H, vocab_size=V,
          position_embedding="rope", name="embedding-rope"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          num_query_groups=G, ffn_hidden_size=F_, position_embedding="rope", **LLAMA,
          name="llama-block"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          num_query_groups=G, head_dim=24, ffn_hidden_size=F_, position_embedding="rope",
          **LLAMA, name="llama-block-d24"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          num_query_groups=G, ffn_hidden_size=F_, input_hidden_size=32, mlp="swiglu",
          norm="rmsnorm", name="gqa-swiglu-bias-in32"),
    Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, input_hidden_size=48,
          **LLAMA, name="swiglu-mlp-in48"),
    Layer(kind="head", seq_length=S, hidden_size=H, vocab_size=V, norm="rmsnorm", bias=False,
          name="head-rms-nobias"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          num_query_groups=G, ffn_hidden_size=F_, position_embedding="rope", qk_norm=True,
          **LLAMA, name="qk-norm-block"),
]
MQA = Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
            num_query_groups=1, ffn_hidden_size=F_, position_embedding="rope", **LLAMA,
            name="mqa-block")
CHAIN = [LAYERS[0], LAYERS[1], LAYERS[2], LAYERS[6],
         Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, **LLAMA,
               name="swiglu-mlp"),
         LAYERS[5]]
"""embedding (rope) -> GQA blocks (d 16, d 24, query and key norms) -> SwiGLU mlp -> head."""


def _chain_loss(tp: int, sequence_parallel: bool = False) -> float:
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (2, S), generator=g)
    labels = torch.randint(0, V, (2, S), generator=g)
    x = ids
    for i, layer in enumerate(CHAIN):
        torch.manual_seed(100 + i)      # megatron draws the master weight: same on any tp
        x = trial_model.build_layer(layer, tp_size=tp, sequence_parallel=sequence_parallel)(x)
    loss = trial_model.lm_loss(x, labels)
    loss.backward()
    return loss.item()


def _tp2_results(rank: int) -> dict:
    rows = []
    for layer in LAYERS:
        m = trial_model.build_layer(layer, tp_size=2)
        trial_model.forward_backward(m, layer, trial_model.example_inputs(layer, 2))
        rows.append({"count": trial_model.parameter_count(m),
                     "shapes": sorted(list(p.shape) for p in m.parameters())})
    return {"rows": rows, "loss": _chain_loss(2), "loss_sp": _chain_loss(2, True)}


@pytest.fixture(scope="module")
def tp2():
    from two_ranks import on_two_ranks

    return on_two_ranks(_tp2_results)


@pytest.fixture(scope="module")
def single():
    trial_model.init_single_process_parallel()


@pytest.mark.parametrize("layer", LAYERS + [MQA], ids=lambda l: l.name)
def test_param_count_tmp1_and_forward_backward(single, layer):
    m = trial_model.build_layer(layer, tp_size=1)
    assert trial_model.parameter_count(m) == param_count(layer, 1)
    out = trial_model.forward_backward(m, layer, trial_model.example_inputs(layer, 2))
    assert torch.isfinite(out)
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())


def test_llama_parts_are_built(single):
    block = trial_model.build_layer(LAYERS[1])
    assert isinstance(block.ln1, torch.nn.RMSNorm) and isinstance(block.ln2, torch.nn.RMSNorm)
    assert block.qkv.bias is None and block.proj.bias is None
    assert block.mlp.fc1.bias is None and block.mlp.fc2.bias is None
    assert tuple(block.qkv.weight.shape) == ((A + 2 * G) * (H // A), H)
    assert tuple(block.mlp.fc1.weight.shape) == (2 * F_, H)
    assert block.rotary is not None
    assert trial_model.build_layer(LAYERS[0]).position is None


def test_param_count_tmp2(tp2):
    for rank in tp2:
        for layer, row in zip(LAYERS, rank["rows"]):
            assert row["count"] == param_count(layer, 2), layer.name


@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.name)
def test_simulated_shard_matches_real_tp2(tp2, layer):
    m = trial_model.build_layer(layer, simulate_tp_size=2)
    assert trial_model.parameter_count(m) == param_count(layer, 2)
    row = tp2[0]["rows"][LAYERS.index(layer)]
    assert sorted(list(p.shape) for p in m.parameters()) == row["shapes"]


def test_tmp1_and_tmp2_compute_the_same_loss(single, tp2):
    """Same seeds, same master weights: the grouped heads, the SwiGLU halves and the rotary
    embeddings are sharded right when tmp 2 (with and without sequence parallelism) gives
    tmp 1's loss."""
    loss = _chain_loss(1)
    for rank in tp2:
        assert rank["loss"] == pytest.approx(loss, rel=1e-5)
        assert rank["loss_sp"] == pytest.approx(loss, rel=1e-5)


def _rope_ref(x, theta=10000.0):
    """x [b, n, s, d]: rotate each pair (i, i + d/2) by angle pos * theta^(-2i/d)."""
    d = x.shape[-1]
    pos = torch.arange(x.shape[-2], dtype=torch.float64)[:, None]
    ang = pos * theta ** (-torch.arange(d // 2, dtype=torch.float64) * 2 / d)
    c, s_ = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * c - x2 * s_, x2 * c + x1 * s_), dim=-1)


@pytest.mark.parametrize("layer", [LAYERS[1], LAYERS[2], LAYERS[6], MQA],
                         ids=lambda l: l.name)
def test_block_matches_a_plain_reference(single, layer):
    """The block's output equals a head-by-head reference from its own weights: query head
    j attends with K/V group j // (a/g) of the [g, a/g + 2, d] QKV layout, the query and
    key norms (qk_norm) then RoPE on q and k, causal softmax, then silu(gate) * up with
    fc1 = [gate; up]."""
    torch.manual_seed(3)
    m = trial_model.build_layer(layer)
    (x,) = trial_model.example_inputs(layer, 2)
    x = x.detach()
    a, g = layer.num_attention_heads, layer.num_query_groups
    d, per = layer.head_dim or H // a, a // g
    if layer.qk_norm:       # trained norm weights, not the initial ones
        for norm in (m.q_norm, m.k_norm):
            norm.weight.data.uniform_(0.5, 1.5)

    def qk(x, norm):
        return x if norm is None else F.rms_norm(x, (d,), norm.weight, norm.eps)

    with torch.no_grad():
        out = m(x)
        y = m.ln1(x)
        qkv = F.linear(y, m.qkv.weight).view(2, S, g, per + 2, d)
        heads = []
        mask = torch.ones(S, S, dtype=torch.bool).tril()
        for j in range(a):
            grp = j // per
            q = _rope_ref(qk(qkv[:, :, grp, j % per], m.q_norm).unsqueeze(1)).squeeze(1)
            k = _rope_ref(qk(qkv[:, :, grp, per], m.k_norm).unsqueeze(1)).squeeze(1)
            v = qkv[:, :, grp, per + 1]
            sc = (q @ k.transpose(-1, -2) / math.sqrt(d)).masked_fill(~mask, float("-inf"))
            heads.append(sc.softmax(-1) @ v)
        x1 = x + F.linear(torch.cat(heads, dim=-1), m.proj.weight)
        gate, up = F.linear(m.ln2(x1), m.mlp.fc1.weight).split(layer.ffn_hidden_size, dim=-1)
        ref = x1 + F.linear(F.silu(gate) * up, m.mlp.fc2.weight)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_groups_equal_heads_is_multi_head_attention(single):
    """num_query_groups = a builds exactly the MHA block (num_query_groups 0): same
    parameters, same output."""
    base = Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
                 ffn_hidden_size=F_, position_embedding="rope", **LLAMA)
    outs = []
    for g in (0, A):
        torch.manual_seed(5)
        layer = Layer(**{**base.__dict__, "num_query_groups": g})
        m = trial_model.build_layer(layer)
        outs.append(m(trial_model.example_inputs(layer, 2)[0]))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)


def test_rotary_depends_only_on_relative_position():
    rot = trial_model._Rotary(8, trial_model.ROPE_THETA)
    q, k = torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
    qs = rot(q.expand(1, 1, 12, 8).clone())[0, 0]
    ks = rot(k.expand(1, 1, 12, 8).clone())[0, 0]
    assert torch.dot(qs[7], ks[4]).item() == pytest.approx(torch.dot(qs[5], ks[2]).item())
    assert torch.dot(qs[0], ks[0]).item() == pytest.approx(torch.dot(q, k).item())


def test_tied_embeddings_refused():
    for kind in ("embedding", "head"):
        layer = Layer(kind=kind, seq_length=S, hidden_size=H, vocab_size=V, tie_embeddings=True)
        with pytest.raises(trial_model.UnsupportedLayer, match="untied embeddings"):
            trial_model.build_layer(layer, simulate_tp_size=1)


def test_groups_must_split_over_tensor_ranks():
    with pytest.raises(ValueError, match="query groups"):
        trial_model.build_layer(MQA, simulate_tp_size=2)


# ----------------------------------------------------------------------------- one real trial

def test_one_real_llama_trial_at_tmp2(tmp_path):
    """configs/cpu-tiny-llama.yaml, one planned strategy with tmp 2 (pipeline 2 where the
    plan has one), trained for real by DeepSpeed over gloo on 4 processes: ends ok."""
    pytest.importorskip("deepspeed")
    from amp_search import LaunchOptions, load_spec, plan, tune

    shutil.copy(ROOT / "configs" / "cpu-tiny-llama.yaml", tmp_path / "spec.yaml")
    spec = load_spec(tmp_path / "spec.yaml")
    assert {x.mlp for x in spec.model.layers if x.kind == "transformer"} == {"swiglu"}
    candidates = [e.strategy for e in plan(spec).strategies if e.strategy.tmp == 2]
    strategy = next((s for s in candidates if s.pp == 2), candidates[0])
    options = LaunchOptions(iters=3, warmup=1, results_path=tmp_path / "results.sqlite",
                            runs_dir=tmp_path / "runs",
                            base_env={**os.environ, "OMP_NUM_THREADS": "1"})
    result = tune(spec, top_k=1, options=options, plan=[strategy])
    (rec,) = result.records
    assert rec.status == "ok", (rec.error, rec.log_tail)
    assert rec.strategy.tmp == 2
    assert rec.measured_s is not None and rec.measured_s > 0


def test_swiglu_and_rmsnorm_keep_what_the_fused_kernels_keep():
    """The trial's SwiGLU and RMSNorm save what Megatron-LM's fused kernels save (the
    activation's input; the norm's input and rstd), and its attention what Transformer
    Engine's saves (contiguous q, k and v, the QKV output freed), so a Llama mlp layer and
    a Llama block, with query and key norms or without, keep exactly
    cost_models.activations.layer_saved_bytes; and both compute what eager torch computes,
    gradients included."""
    from cost_models.activations import layer_saved_bytes

    mlp = Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, **LLAMA)
    for layer in (mlp, LAYERS[1], LAYERS[6]):
        m = trial_model.build_layer(layer, simulate_tp_size=1)
        x = torch.randn(S, 2, H, requires_grad=True)
        params = {p.untyped_storage().data_ptr() for p in m.parameters()}
        saved = {}

        def pack(t):
            if t.untyped_storage().data_ptr() not in params:
                saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            y = m(x)
        # RoPE's cos and sin tables: its s x d frequencies, shared (not counted)
        rotary = getattr(m, "rotary", None)
        for table in (x for pair in (rotary._cache.values() if rotary else ()) for x in pair):
            saved.pop(table.untyped_storage().data_ptr(), None)
        counted = layer_saved_bytes(layer, mbs=2, tmp=1, bytes_per_element=4)
        got = sum(saved.values())
        assert got == counted, (layer.name or layer.kind, got, counted)
    # the fused forms against eager torch
    x = torch.randn(5, H, requires_grad=True)
    w = torch.randn(H, requires_grad=True)
    out = trial_model._RMSNorm.apply(x, w, 1e-5)
    x2, w2 = x.detach().clone().requires_grad_(True), w.detach().clone().requires_grad_(True)
    ref = F.rms_norm(x2, (H,), w2, 1e-5)
    (out * ref.detach()).sum().backward()
    (ref * ref.detach()).sum().backward()
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.allclose(x.grad, x2.grad, atol=1e-5) and torch.allclose(w.grad, w2.grad,
                                                                          atol=1e-5)
    y = torch.randn(5, 2 * F_, requires_grad=True)
    out = trial_model._WeightedActivation.apply(y, None, "swiglu")
    y2 = y.detach().clone().requires_grad_(True)
    gate, up = y2.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    out.sum().backward()
    ref.sum().backward()
    assert torch.allclose(out, ref, atol=1e-6) and torch.allclose(y.grad, y2.grad, atol=1e-6)
