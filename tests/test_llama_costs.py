"""Llama-family blocks (grouped-query attention, head width, SwiGLU, RMSNorm, no biases,
RoPE, tied embeddings) in the cost terms of cost_models/: parameters against the published
counts, FLOPs, memory-bound bytes and saved activations against the hand formulas, and the
GPT block unchanged."""
from __future__ import annotations

import dataclasses

import pytest

from cost_models import layers as L
from cost_models import activations
from cost_models import memory as memory_model
from cost_models.layers import Layer

LLAMA = dict(mlp="swiglu", norm="rmsnorm", bias=False, position_embedding="rope")


def llama_chain(n, *, h, a, g, f, v=128256, s=8192, tied=False):
    common = dict(seq_length=s, hidden_size=h, **LLAMA)
    return ([Layer(kind="embedding", vocab_size=v, tie_embeddings=tied, **common)]
            + [Layer(kind="transformer", num_attention_heads=a, num_query_groups=g,
                     ffn_hidden_size=f, **common)] * n
            + [Layer(kind="head", vocab_size=v, tie_embeddings=tied, **common)])


def test_llama3_8b_and_70b_published_counts():
    assert L.model_param_count(llama_chain(32, h=4096, a=32, g=8, f=14336)) == 8_030_261_248
    assert L.model_param_count(llama_chain(80, h=8192, a=64, g=8, f=28672)) == 70_553_706_496


def test_tied_embeddings_counted_once_in_the_model_not_per_layer():
    untied = llama_chain(2, h=256, a=4, g=2, f=512, v=1000, s=64)
    tied = llama_chain(2, h=256, a=4, g=2, f=512, v=1000, s=64, tied=True)
    assert L.model_param_count(untied) - L.model_param_count(tied) == 1000 * 256
    for x, y in zip(untied, tied):          # each holding stage keeps its copy
        assert L.param_count(x, 2) == L.param_count(y, 2)


def test_model_param_count_of_a_gpt_chain_is_the_sum_at_tmp1():
    gpt = [Layer(kind="embedding", seq_length=1024, hidden_size=768, vocab_size=50304),
           Layer(kind="transformer", seq_length=1024, hidden_size=768,
                 num_attention_heads=12, ffn_hidden_size=3072),
           Layer(kind="head", seq_length=1024, hidden_size=768, vocab_size=50304)]
    assert L.model_param_count(gpt) == sum(L.param_count(x, 1) for x in gpt)


def test_llama_block_params_by_hand():
    h, a, g, f, d = 4096, 32, 8, 14336, 128
    x = Layer(kind="transformer", seq_length=8192, hidden_size=h, num_attention_heads=a,
              num_query_groups=g, ffn_hidden_size=f, **LLAMA)
    assert (x.query_groups, x.kv_channels) == (g, d)
    for t in (1, 2, 4, 8):
        assert L.param_count(x, t) == (2 * h + h * (a * d + 2 * g * d) // t + a * d * h // t
                                       + 3 * h * f // t)
        assert sum(memory_model.param_tensor_numels(x, t)) == L.param_count(x, t)
    # with biases: QKV (a + 2g) d / t, proj h, fc1 2f / t, fc2 h
    xb = dataclasses.replace(x, bias=True)
    assert L.param_count(xb, 4) - L.param_count(x, 4) == (a * d + 2 * g * d) // 4 + h \
        + 2 * f // 4 + h
    # LayerNorm instead of RMSNorm: a bias per norm
    assert L.param_count(dataclasses.replace(x, norm="layernorm"), 4) \
        - L.param_count(x, 4) == 2 * h


def test_tensor_parallel_shards_sum_to_the_whole():
    x = Layer(kind="transformer", seq_length=512, hidden_size=1024, num_attention_heads=16,
              num_query_groups=4, ffn_hidden_size=2816, **LLAMA)
    replicated = 2 * x.hidden_size                            # the two RMSNorms
    for t in (2, 4):
        assert t * (L.param_count(x, t) - replicated) + replicated == L.param_count(x, 1)
    xb = dataclasses.replace(x, bias=True)                    # + proj and fc2 biases
    replicated_b = replicated + 2 * x.hidden_size
    for t in (2, 4):
        assert t * (L.param_count(xb, t) - replicated_b) + replicated_b == L.param_count(xb, 1)
    emb, head = (Layer(kind=k, seq_length=512, hidden_size=1024, vocab_size=32000, **LLAMA)
                 for k in ("embedding", "head"))
    assert L.param_count(emb, 4) == L.padded_vocab_size(32000, 4) * 1024 // 4   # no positions
    assert L.param_count(head, 4) == 1024 + L.padded_vocab_size(32000, 4) * 1024 // 4


GPT_LIKE = [
    Layer(kind="transformer", seq_length=1024, hidden_size=768, num_attention_heads=12,
          ffn_hidden_size=3072),
    Layer(kind="transformer", seq_length=2048, hidden_size=4096, num_attention_heads=32,
          ffn_hidden_size=16384, input_hidden_size=1024),
    Layer(kind="mlp", seq_length=256, hidden_size=512, ffn_hidden_size=2048),
    Layer(kind="embedding", seq_length=1024, hidden_size=768, vocab_size=50257),
    Layer(kind="head", seq_length=1024, hidden_size=768, vocab_size=50257),
]


def _forced_general(x):
    """The same GPT layer through the Llama branches: an explicit g = a and d = h / a keep
    the numbers; a learned-position flag kept; only is_gpt_block is bypassed."""
    class General(Layer):
        @property
        def is_gpt_block(self):
            return False
    return General(**{fl.name: getattr(x, fl.name) for fl in dataclasses.fields(x)})


@pytest.mark.parametrize("x", GPT_LIKE, ids=lambda x: x.signature)
@pytest.mark.parametrize("t", [1, 2, 4])
def test_llama_branches_reproduce_the_gpt_block(x, t):
    y = _forced_general(x)
    assert L.param_count(y, t) == L.param_count(x, t)
    assert memory_model.param_tensor_numels(y, t) == memory_model.param_tensor_numels(x, t)
    assert L.gemm_flops(y, t) == pytest.approx(L.gemm_flops(x, t), rel=1e-15)
    assert L.attention_core_flops(y, t) == pytest.approx(L.attention_core_flops(x, t),
                                                         rel=1e-15)
    for fw in L.TP_FRAMEWORKS:
        assert L.elementwise_bytes_by_pass(y, t, 2, fw) == pytest.approx(
            L.elementwise_bytes_by_pass(x, t, 2, fw), rel=1e-15)
        for sp in (False, True):
            assert L.tp_collectives_by_pass(y, True, sp, fw) == \
                L.tp_collectives_by_pass(x, True, sp, fw)
    for scores in (False, True):
        for sp in (False, True):
            for sel in (False, True):
                kw = dict(mbs=2, tmp=t, bytes_per_element=2, attention_scores=scores,
                          sequence_parallel=sp, selective=sel)
                assert activations.layer_saved_bytes(y, **kw) == activations.layer_saved_bytes(x, **kw)
    kw = dict(mbs=2, tmp=t, bytes_per_element=2, attention_scores=True)
    assert activations.selective_working_set_bytes(y, **kw) == activations.selective_working_set_bytes(x, **kw)


def test_gqa_with_g_equal_a_is_mha():
    mha = GPT_LIKE[0]
    gqa = dataclasses.replace(mha, num_query_groups=12, head_dim=64)
    assert gqa.signature == mha.signature
    for t in (1, 2, 4):
        assert L.param_count(gqa, t) == L.param_count(mha, t)
        assert L.forward_flops(gqa, t) == L.forward_flops(mha, t)
        assert activations.layer_saved_bytes(gqa, mbs=1, tmp=t, bytes_per_element=2) == \
            activations.layer_saved_bytes(mha, mbs=1, tmp=t, bytes_per_element=2)
    # and in a Llama block (RMSNorm, SwiGLU, RoPE): g = a through the general formulas
    llama_mha = Layer(kind="transformer", seq_length=128, hidden_size=256,
                      num_attention_heads=8, ffn_hidden_size=512, **LLAMA)
    llama_g = dataclasses.replace(llama_mha, num_query_groups=8)
    assert L.param_count(llama_g, 2) == L.param_count(llama_mha, 2)
    assert L.gemm_flops(llama_g, 2) == L.gemm_flops(llama_mha, 2)
    assert L.elementwise_bytes_by_pass(llama_g, 2, 2, "megatron") == \
        L.elementwise_bytes_by_pass(llama_mha, 2, 2, "megatron")


def test_llama_block_flops_by_hand():
    s, h, a, g, f, d = 8192, 8192, 64, 8, 28672, 128
    x = Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
              num_query_groups=g, ffn_hidden_size=f, **LLAMA)
    for t in (1, 8):
        assert L.gemm_flops(x, t) == pytest.approx((
            2 * s * h * (a * d + 2 * g * d) / t,    # QKV
            2 * s * a * d * h / t,                  # proj
            2 * s * h * 2 * f / t,                  # fused gate + up (linear_fc1)
            2 * s * f * h / t), rel=1e-15)          # down
        assert L.attention_core_flops(x, t) == pytest.approx(4 * s * s * a * d / t)
        assert L.forward_flops(x, t) == pytest.approx(
            2 * s * h * (a * d + 2 * g * d + a * d + 3 * f) / t + 4 * s * s * a * d / t)
    # a head width other than h / a (e.g. Gemma-style d = 256 with h = 2048, a = 8)
    y = Layer(kind="transformer", seq_length=1024, hidden_size=2048, num_attention_heads=8,
              num_query_groups=1, head_dim=256, ffn_hidden_size=16384, **LLAMA)
    assert y.kv_channels == 256
    assert L.gemm_flops(y, 1)[:2] == (2.0 * 1024 * 2048 * (8 * 256 + 2 * 256),
                                      2.0 * 1024 * 8 * 256 * 2048)


def test_llama_block_elementwise_bytes_by_hand():
    s, h, a, g, f, d, t, b = 1024, 2048, 16, 4, 5632, 128, 2, 2
    x = Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
              num_query_groups=g, ffn_hidden_size=f, **LLAMA)
    rope = 2 * s * (a + g) * d / t
    # trial-style: norms + residuals 16 s h, eager SiLU * up 5 s f / t, RoPE
    assert L.elementwise_bytes(x, t, b) == pytest.approx(
        b * (16 * s * h + 5 * s * f / t + rope))
    fw, bw = L.elementwise_bytes_by_pass(x, t, b, "megatron")
    assert fw == pytest.approx(s * ((10 * b + 2) * h + 2 * b * a * d + 3 * b * f / t)
                               + b * rope)
    assert bw == pytest.approx(s * ((16 * b + 2) * h + 2 * b * a * d + 5 * b * f / t)
                               + b * rope)
    # with biases: the bias-dropout-add and bias-SwiGLU bias gradients come back
    xb = dataclasses.replace(x, bias=True)
    fwb, bwb = L.elementwise_bytes_by_pass(xb, t, b, "megatron")
    assert fwb == pytest.approx(fw)
    assert bwb - bw == pytest.approx(s * (2 * b * h + 2 * b * f / t))
    # learned positions, no RoPE: the rotary traffic goes
    xl = dataclasses.replace(x, position_embedding="learned")
    assert fw - L.elementwise_bytes_by_pass(xl, t, b, "megatron")[0] == pytest.approx(b * rope)
    emb = Layer(kind="embedding", seq_length=s, hidden_size=h, vocab_size=32000, **LLAMA)
    assert L.elementwise_bytes(emb, t, b) == 2 * s * h * b


def test_llama_block_saved_activations_by_hand():
    s, h, a, g, f, d, bpe, mbs = 256, 512, 8, 2, 1536, 64, 2, 3
    x = Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
              num_query_groups=g, ffn_hidden_size=f, **LLAMA)
    for t in (1, 2):
        per_token = (bpe * (4 * h + 2)                       # 2 RMSNorm inputs + outputs, rstd
                     + bpe * ((a + 2 * g) * d                # rotated q and k, contiguous v
                              + a * d                        # attention output (proj input)
                              + 3 * f) // t                  # fc1 output 2f, SwiGLU output f
                     + 4 * a // t)                           # flash log-sum-exp (fp32)
        assert activations.layer_saved_bytes(x, mbs=mbs, tmp=t, bytes_per_element=bpe) == \
            per_token * s * mbs
        # the query and key norms keep their inputs and one statistic per head
        qk = dataclasses.replace(x, qk_norm=True)
        assert activations.layer_saved_bytes(qk, mbs=mbs, tmp=t, bytes_per_element=bpe) \
            - per_token * s * mbs == bpe * (a + g) * (d + 1) // t * s * mbs
    t = 2
    sp = activations.layer_saved_bytes(x, mbs=mbs, tmp=t, bytes_per_element=bpe, sequence_parallel=True)
    full = activations.layer_saved_bytes(x, mbs=mbs, tmp=t, bytes_per_element=bpe)
    assert full - sp == bpe * (4 * h + 2) * s * mbs // 2
    sel = activations.layer_saved_bytes(x, mbs=mbs, tmp=t, bytes_per_element=bpe, selective=True,
                              attention_scores=True)
    assert full - sel == 4 * a // t * s * mbs
    assert activations.selective_working_set_bytes(x, mbs=mbs, tmp=t, bytes_per_element=bpe) == \
        (bpe * a * d // t + 4 * a // t) * s * mbs
    # SwiGLU keeps f/t more than GELU, RMSNorm one statistic per norm fewer than LayerNorm
    xg = dataclasses.replace(x, mlp="gelu", norm="layernorm")
    assert activations.layer_saved_bytes(x, mbs=1, tmp=1, bytes_per_element=bpe) \
        - activations.layer_saved_bytes(xg, mbs=1, tmp=1, bytes_per_element=bpe) == bpe * (f - 2) * s
    head = Layer(kind="head", seq_length=s, hidden_size=h, vocab_size=32000, **LLAMA)
    gpt_head = Layer(kind="head", seq_length=s, hidden_size=h, vocab_size=32000)
    assert activations.layer_saved_bytes(gpt_head, mbs=1, tmp=2, bytes_per_element=bpe) \
        - activations.layer_saved_bytes(head, mbs=1, tmp=2, bytes_per_element=bpe) == bpe * s


def test_collectives_count_unchanged_and_no_kv_width():
    x = Layer(kind="transformer", seq_length=512, hidden_size=1024, num_attention_heads=16,
              num_query_groups=2, ffn_hidden_size=2816, **LLAMA)
    gpt = Layer(kind="transformer", seq_length=512, hidden_size=1024, num_attention_heads=16,
                ffn_hidden_size=4096)
    for fw in L.TP_FRAMEWORKS:
        for rec in (False, True):
            assert L.tp_collectives_by_pass(x, rec, False, fw) == \
                L.tp_collectives_by_pass(gpt, rec, False, fw)
        fwd, bwd, _ = L.tp_collectives_by_pass(x, False, True, fw)
        assert fwd == L.tp_collectives_by_pass(gpt, False, True, fw)[0]
        big = [c for c in bwd if c.elements > 1024]
        assert big == [c for c in L.tp_collectives_by_pass(gpt, False, True, fw)[1]
                       if c.elements > 1024]
    # the trial layers' per-shard weight all-reduces: one per RMSNorm, no biases
    bwd = L.tp_collectives_by_pass(x, False, True, "deepspeed")[1]
    assert sum(c.elements == 1024 and c.kind == "all_reduce" for c in bwd) == 2


def test_unknown_options_rejected():
    with pytest.raises(ValueError, match="mlp"):
        L.param_count(Layer(kind="transformer", seq_length=8, hidden_size=8,
                            num_attention_heads=2, ffn_hidden_size=8, mlp="relu"), 1)
