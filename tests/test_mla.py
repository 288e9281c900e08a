"""Multi-latent attention (DeepSeek-V3, Kimi-K2) and dense blocks before the experts
(model.moe_first_dense_layers): the shapes counted by hand on a tiny block, the presets'
published totals, the spec's rules and Megatron-LM's arguments."""
from __future__ import annotations

import pytest

from amp_search import estimate
from amp_search.launch.megatron import architecture_args
from amp_search.spec import SpecError, parse_spec
from cost_models.activations import layer_saved_bytes
from cost_models.layers import (Layer, attention_core_flops, expert_param_count, gemm_flops,
                                kv_elements_per_token, model_param_count, param_count,
                                tp_collectives_by_pass)

# h 64, 4 heads of d 16 (non-rotary) + d_r 8 (rotary), values d_v 16, latents q_r 32, c 24
TINY = {"preset": "gpt", "num_layers": 4, "hidden_size": 64, "num_attention_heads": 4,
        "seq_length": 32, "vocab_size": 512, "mlp": "swiglu", "norm": "rmsnorm", "bias": False,
        "position_embedding": "rope", "ffn_hidden_size": 128, "head_dim": 16,
        "kv_lora_rank": 24, "q_lora_rank": 32, "qk_rope_head_dim": 8, "v_head_dim": 16}
TINY_MOE = {**TINY, "num_experts": 8, "moe_router_topk": 2, "moe_ffn_hidden_size": 32,
            "moe_shared_expert_intermediate_size": 32, "moe_first_dense_layers": 1}


def _raw(model: dict, **training) -> dict:
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s"}]},
            "model": model,
            "training": {"global_batch_size": 16, "precision": "bf16", "backend": "megatron",
                         **training}}


def _block(**model) -> Layer:
    return parse_spec(_raw({**TINY, **model})).model.layers[1]


def test_the_block_counts_its_projections_by_hand():
    b = _block()
    assert b.is_mla and not b.is_gpt_block and b.qk_head_width == 24
    assert (b.attention_width, b.core_width, b.mla_latent_width) == (4 * 16, 4 * 40 // 2, 64)
    # per rank at t 2: input norm 64, q down 64x32 and its norm 32 (whole on every rank),
    # q up 32x4x24/2, kv down 64x32 and its norm 24 (whole), kv up 24x4x32/2, output
    # projection 4x16x64/2, pre-MLP norm 64, SwiGLU fc1 64x256/2 and fc2 128x64/2
    assert param_count(b, 2) == (64 + 2048 + 32 + 1536 + 2048 + 24 + 1536 + 2048 + 64 + 8192
                                 + 4096)
    s = 32
    attention = 2.0 * s * (64 * 32 + 32 * 4 * 24 + 64 * 32 + 24 * 4 * 32 + 4 * 16 * 64)
    assert sum(gemm_flops(b, 1)) == pytest.approx(attention + 2.0 * s * (64 * 256 + 128 * 64))
    # QK^T over d + d_r, attention x V over d_v, every query x key (Narayanan et al.'s count)
    assert attention_core_flops(b, 1) == pytest.approx(2.0 * s * s * 4 * (24 + 16))
    assert kv_elements_per_token(b, 2) == 2 * (24 + 16)     # a/t heads' K and V (ring cp)
    # without a query latent: one query projection h -> a (d + d_r)
    assert param_count(_block(q_lora_rank=0), 1) == param_count(b, 1) - (
        64 * 32 + 32 + 32 * 4 * 24) + 64 * 4 * 24


def test_sequence_parallel_gathers_the_latents():
    b = _block()
    forward, backward, again = tp_collectives_by_pass(b, recompute=True, sequence_parallel=True,
                                                      framework="megatron")
    s = 32
    assert [(c.kind, c.elements) for c in forward] == [
        ("all_gather", s * 32), ("all_gather", s * 24), ("all_gather", s * 8),
        ("reduce_scatter", s * 64), ("all_gather", s * 64), ("reduce_scatter", s * 64)]
    assert sorted((c.kind, c.elements) for c in backward) == sorted(
        [("reduce_scatter", s * 32), ("reduce_scatter", s * 24), ("reduce_scatter", s * 8),
         ("all_gather", s * 32), ("all_gather", s * 24), ("all_gather", s * 64),
         ("all_gather", s * 64), ("all_gather", s * 64), ("reduce_scatter", s * 64)])
    assert again == forward


def test_saved_activations_by_hand():
    b = _block()
    g, s = 2, 32
    # per token: the two norms' inputs and outputs 4h and their rstd (2); the latents' norm
    # inputs and outputs 2 (q_r + c) and their rstd (2); q, k, v a (2 (d + d_r) + d_v), the
    # core's output a d_v, the SwiGLU's fc1 output and its output 3f; the log-sum-exp 4a
    per_token = g * (4 * 64 + 2) + g * (2 * (32 + 24) + 2) \
        + g * (4 * (2 * 24 + 16) + 4 * 16 + 3 * 128) + 4 * 4
    assert layer_saved_bytes(b, mbs=1, tmp=1, bytes_per_element=g) == per_token * s
    # sequence parallelism splits the per-token norms and latents, not the heads' tensors
    assert layer_saved_bytes(b, mbs=1, tmp=2, bytes_per_element=g, sequence_parallel=True) \
        == ((g * (4 * 64 + 2) + g * (2 * (32 + 24) + 2)) * s // 2
            + (g * (4 * (2 * 24 + 16) + 4 * 16 + 3 * 128) // 2 + 4 * 4 // 2) * s)


def test_dense_blocks_open_the_chain():
    m = parse_spec(_raw(TINY_MOE)).model
    blocks = [x for x in m.layers if x.kind == "transformer"]
    assert [x.is_moe for x in blocks] == [False, True, True, True]
    assert blocks[0].ffn_hidden_size == 128 and expert_param_count(blocks[0]) == 0
    assert all(x.is_mla for x in blocks) and m.num_experts == 8
    args = architecture_args(m.layers)
    assert args[args.index("--moe-layer-freq") + 1] == "([0]*1+[1]*3)"
    for flag, value in (("--kv-lora-rank", "24"), ("--q-lora-rank", "32"),
                        ("--qk-head-dim", "16"), ("--qk-pos-emb-head-dim", "8"),
                        ("--v-head-dim", "16")):
        assert args[args.index(flag) + 1] == value
    assert "--multi-latent-attention" in args
    e = estimate(parse_spec(_raw(TINY_MOE)), pp=2, dp=4, tmp=1, mbs=1, ep=4)
    assert e.fits and e.iteration_time_s > 0


@pytest.mark.parametrize("name, total, active", [("deepseek-v3", 671e9, 37e9),
                                                 ("kimi-k2", 1.03e12, 32e9)])
def test_presets_have_their_published_totals(name, total, active):
    """The technical reports' totals (DeepSeek-V3 without its MTP module) and activated
    parameters (the routed experts a token skips left out)."""
    layers = parse_spec(_raw({"preset": name})).model.layers
    n = model_param_count(layers)
    skipped = sum(expert_param_count(x) * (1 - x.moe_router_topk / x.num_experts)
                  for x in layers if x.is_moe)
    assert n == pytest.approx(total, rel=0.01)
    assert n - skipped == pytest.approx(active, rel=0.03)


@pytest.mark.parametrize("extra, message", [
    ({"head_dim": None}, "model.head_dim: required key is missing: multi-latent attention"),
    ({"num_query_groups": 2}, "model.num_query_groups: not with multi-latent attention"),
    ({"bias": True}, "model.bias: multi-latent attention's projections have no biases"),
    ({"position_embedding": "learned"}, "model.position_embedding: multi-latent attention "
                                        "rotates"),
    ({"qk_rope_head_dim": None}, "model.qk_rope_head_dim: required key is missing"),
    ({"kv_lora_rank": None}, "model.q_lora_rank: only with kv_lora_rank"),
    ({"qk_norm": True}, "model.qk_norm: not with multi-latent attention"),
])
def test_spec_errors_name_the_key(extra, message):
    model = {k: v for k, v in {**TINY, **extra}.items() if v is not None}
    with pytest.raises(SpecError) as err:
        parse_spec(_raw(model))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_moe_first_dense_layers_rules():
    with pytest.raises(SpecError, match=r"^model.moe_first_dense_layers: .*only with "
                                        r"num_experts"):
        parse_spec(_raw({**TINY, "moe_first_dense_layers": 1}))
    with pytest.raises(SpecError, match=r"^model.moe_first_dense_layers: "):
        parse_spec(_raw({**TINY_MOE, "moe_first_dense_layers": 4}))


def test_deepspeed_cannot_run_it():
    raw = _raw(TINY, backend="deepspeed")
    with pytest.raises(SpecError, match=r"^model.kv_lora_rank: multi-latent attention: .* "
                                        r"accepted with training.backend: megatron"):
        parse_spec(raw)
    del raw["training"]["backend"]          # no backend: Megatron-LM's plans only, with why
    spec = parse_spec(raw)
    assert spec.training.backend == "megatron" and not spec.other_backends
    assert any(n.startswith("deepspeed: model.kv_lora_rank") for n in spec.backend_notes)


def test_recomputing_the_up_projections():
    """mla_up_proj (Megatron-LM's --recompute-modules): the queries, keys and values are not
    kept, and the backward runs the up-projections' GEMMs and RoPE again."""
    from cost_models.activations import selective_working_set_bytes
    from cost_models.compute import DeviceSpeed, gemm_time_s
    from cost_models.layers import mla_gemm_flops, q_k_bytes
    from cost_models.recompute import selective_recompute_time_s

    b = _block()
    g, s = 2, 32
    kept = layer_saved_bytes(b, mbs=1, tmp=1, bytes_per_element=g)
    qkv = g * 4 * (2 * 24 + 16) * s
    assert layer_saved_bytes(b, mbs=1, tmp=1, bytes_per_element=g,
                             selective=("mla_up_proj",)) == kept - qkv
    assert selective_working_set_bytes(b, mbs=1, tmp=1, bytes_per_element=g,
                                       selective=("mla_up_proj",)) == qkv
    device = DeviceSpeed(peak_flops_per_s=1e12, memory_bandwidth_bytes_per_s=1e11)
    t = selective_recompute_time_s(b, tmp=1, mbs=1, device=device, bytes_per_element=g,
                                   attention="flash", modules=("mla_up_proj",))
    q_down, q_up, kv_down, kv_up = mla_gemm_flops(b, 1)
    assert t.forward_s == 0.0 and t.backward_s == pytest.approx(
        gemm_time_s(q_up, device) + gemm_time_s(kv_up, device) + q_k_bytes(b, 1, g) / 1e11)
    spec = parse_spec(_raw(TINY, activation_checkpointing="selective",
                           recompute_modules=["mla_up_proj"]))
    assert spec.training.recompute_modules == ("mla_up_proj",)
    with pytest.raises(SpecError, match=r"^training.recompute_modules: mla_up_proj recomputes "
                                        r"multi-latent attention's up-projections: the model "
                                        r"has none"):
        parse_spec(_raw({k: v for k, v in TINY.items() if k not in (
            "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim")},
                        recompute_modules=["mla_up_proj"]))


def test_uneven_model_chunks_are_estimated_as_given():
    """Megatron-LM's --pipeline-model-parallel-layout may give the interleaved schedule
    uneven chunks (Kimi-K2's 61 blocks in 16: [embedding + 4], 14 x [4], [1 + loss]);
    `estimate` takes the chunks given. A model whose blocks split evenly on no pipeline (5
    blocks: 7 layers) gets uneven chunks as even as its blocks' FLOPs make them, and its
    search tries 2 chunks per stage."""
    from conftest import load_benchmark

    spec = parse_spec(_raw({**TINY_MOE, "num_layers": 5}))      # 5 blocks: 7 layers
    assert spec.training.virtual_pipeline_stages == (1, 2)
    e = estimate(spec, pp=2, dp=4, tmp=1, mbs=1, ep=4, virtual_stages=2)
    assert e.strategy.partition == (0, 2, 4, 5, 7)      # [E + 1], [2], [1], [1 + head]
    chunks = (0, 3, 4, 5, 7)                # [E + 2], [1], [1], [1 + head]
    e = estimate(spec, pp=2, dp=4, tmp=1, mbs=1, ep=4, virtual_stages=2, partition=chunks)
    assert e.strategy.partition == chunks and e.strategy.virtual_stages == 2
    mb = load_benchmark("megatron_bridge")
    row = {"model": "Kimi_K2", "tp": "1", "pp": "4", "cp": "1", "vp": "4", "mbs": "2",
           "gpus": "256"}
    bounds = mb.chunk_boundaries(row)
    assert len(bounds) == 17 and bounds[:3] == (0, 5, 9) and bounds[-2:] == (61, 63)


def test_multi_token_prediction_follows_the_last_block():
    """model.mtp_num_layers (Megatron-LM's --mtp-num-layers): per depth a block like the last
    one reading 2h (the eh_proj) and a loss through the main head's output layer, on the
    last stage with the head."""
    from amp_search.launch.megatron import pipeline_layout, stage_layer_counts

    raw = _raw({**TINY_MOE, "mtp_num_layers": 1})
    m = parse_spec(raw).model
    names = [x.name for x in m.layers]
    assert names[-3:] == ["mtp0", "mtp0_loss", "head"] and m.ends == (1, 3)
    block, loss = m.layers[-3], m.layers[-2]
    assert block.mtp and block.is_moe and block.is_mla and block.input_hidden_size == 128
    assert loss.mtp and loss.kind == "head"
    # the MTP block's parameters are the last block's and its eh_proj 2h x h; its loss
    # counts a matrix V x h (the stage's copy of the embedding for the MTP's token lookup)
    base = parse_spec(_raw(TINY_MOE)).model
    assert model_param_count(m.layers) == model_param_count(base.layers) \
        + param_count(base.layers[-2], 1) + 128 * 64 + param_count(base.layers[-1], 1)
    args = architecture_args(m.layers)
    assert args[args.index("--mtp-num-layers") + 1] == "1"
    assert stage_layer_counts(m.layers, (0, 3, 8)) == [2, 2]
    assert pipeline_layout(m.layers, (0, 3, 5, 8)) == "Et*2|t*2|mL"
    # the split keeps the MTP's loss with the head: a stage never starts inside the module
    spec = parse_spec(raw)
    for pp in (2, 4):
        e = estimate(spec, pp=pp, dp=8 // pp, tmp=1, mbs=1, ep=1)
        assert e.strategy.partition[-2] <= len(m.layers) - 3
    with pytest.raises(SpecError, match=r"^model.mtp_num_layers: multi-token prediction: "):
        parse_spec({**raw, "training": {**raw["training"], "backend": "deepspeed"}})
    # megatron-core's TransformerConfig: "MTP layernum only supports 1 when enabling
    # overlap_moe_expert_parallel_comm"
    assert parse_spec(_raw({**TINY_MOE, "mtp_num_layers": 1}, moe_a2a_overlap=True))
    with pytest.raises(SpecError, match=r"^training.moe_a2a_overlap: .* at most one "
                                        r"multi-token-prediction depth .* is 2\)"):
        parse_spec(_raw({**TINY_MOE, "mtp_num_layers": 2}, moe_a2a_overlap=True))


def test_the_deepseek_recipes_chunks():
    """megatron_bridge.py's DeepSeek-V3 recipes: 16 chunks of [embedding + 4], 14 x [4],
    [1 + MTP block + its loss + head] over its 65 layers; a layout it does not know is a
    reason, not a guess."""
    from conftest import load_benchmark

    mb = load_benchmark("megatron_bridge")
    row = {"model": "DeepSeekV3", "tp": "1", "pp": "2", "cp": "1", "vp": "8", "mbs": "1",
           "gpus": "256", "workload": "pre-training", "precision": "MXFP8", "fsdp": "",
           "system": "DGX-GB300", "model_tflops_per_gpu": "", "release": "26.06", "seq": "4096",
           "gbs": "4096", "ep": "32"}
    bounds = mb.chunk_boundaries(row)
    assert len(bounds) == 17 and bounds[:2] == (0, 5) and bounds[-2:] == (61, 65)
    spec = parse_spec(mb.spec_dict(row))
    assert spec.model.num_layers == 65 and spec.model.mtp_layers == 2
    assert spec.training.recompute_modules == ("core_attn",)      # GB300, micro-batch 1: none
    assert mb.unexpressed(row) == ""
    assert "not known" in mb.unexpressed({**row, "system": "DGX-B300", "pp": "8", "vp": "n/a"})
