"""What megatron-core runs unfused for GPT-OSS: its grouped experts' work beside their kernels
(the clamped quick-GEGLU and the experts' fc2 bias, cost_models.layers
.unfused_expert_bytes_by_pass), which training.moe_sync_free (the fused expert MLP) takes
away, and YaRN's rotation (model.rope_scaling, unfused_rope_bytes_by_pass)."""
from __future__ import annotations

from dataclasses import replace

import pytest

from amp_search.spec import parse_spec
from cost_models.compute import DeviceSpeed, analytic_layer_time
from amp_search.errors import SpecError
from cost_models.layers import (FP32_ROUTER_BYTES, Layer, elementwise_bytes_by_pass,
                                model_param_count, unfused_expert_bytes_by_pass,
                                unfused_rope_bytes_by_pass)
from cost_models.recompute import selective_recompute_time_s

GPT_OSS_BLOCK = Layer(kind="transformer", seq_length=4096, hidden_size=2880,
                      num_attention_heads=64, num_query_groups=8, head_dim=64,
                      ffn_hidden_size=2880, num_experts=128, moe_router_topk=4,
                      mlp="quick_geglu", norm="rmsnorm", bias=True, position_embedding="rope")
DEVICE = DeviceSpeed(peak_flops_per_s=2.5e15, memory_bandwidth_bytes_per_s=8e12)


def test_counted_bytes():
    """Per sample on one rank, g = 2, P = 4 (fp32 router probabilities): the clamps and the
    concatenation 8g / 10g per element of k f_e, the fc2 bias (6P + 2g) h / (8P + 2g) h per
    routed copy."""
    g, p, s, k, h, fe = 2, FP32_ROUTER_BYTES, 4096, 4, 2880, 2880
    fwd, bwd = unfused_expert_bytes_by_pass(GPT_OSS_BLOCK, 1, g)
    assert fwd == s * k * (8 * g * fe + (6 * p + 2 * g) * h)
    assert bwd == s * k * (10 * g * fe + (8 * p + 2 * g) * h)
    # tensor parallelism (sequence parallel under MoE): the rank's s/t tokens
    assert unfused_expert_bytes_by_pass(GPT_OSS_BLOCK, 2, g) == (fwd / 2, bwd / 2)
    # without biases only the clamps; a SwiGLU without biases (Qwen3, Mixtral) nothing
    no_bias = replace(GPT_OSS_BLOCK, bias=False)
    assert unfused_expert_bytes_by_pass(no_bias, 1, g) == (s * k * 8 * g * fe,
                                                           s * k * 10 * g * fe)
    assert unfused_expert_bytes_by_pass(replace(no_bias, mlp="swiglu"), 1, g) == (0.0, 0.0)
    # fused experts, and a dense block, move none of it
    assert unfused_expert_bytes_by_pass(replace(GPT_OSS_BLOCK, fused_experts=True), 1, g) \
        == (0.0, 0.0)
    dense = replace(GPT_OSS_BLOCK, num_experts=0, moe_router_topk=0)
    assert unfused_expert_bytes_by_pass(dense, 1, g) == (0.0, 0.0)


def test_megatron_layer_time_pays_them_at_memory_bandwidth():
    fused = replace(GPT_OSS_BLOCK, fused_experts=True)
    kw = dict(tmp=1, mbs=4, device=DEVICE, bytes_per_element=2, framework="megatron", ep=8)
    slow, fast = analytic_layer_time(GPT_OSS_BLOCK, **kw), analytic_layer_time(fused, **kw)
    fwd, bwd = unfused_expert_bytes_by_pass(GPT_OSS_BLOCK, 1, 2)
    assert slow.forward_s - fast.forward_s == pytest.approx(4 * fwd / 8e12)
    assert slow.backward_s - fast.backward_s == pytest.approx(4 * bwd / 8e12)
    # GPT-OSS 120B at 16k tokens: about 2.6 ms of a layer's micro-batch on a Blackwell GPU
    assert 2e-3 < (slow.forward_s + slow.backward_s) - (fast.forward_s + fast.backward_s) < 3e-3
    # the trial layers (DeepSpeed) run their own eager activation, counted apart
    assert elementwise_bytes_by_pass(GPT_OSS_BLOCK, 1, 2, "deepspeed") \
        == elementwise_bytes_by_pass(fused, 1, 2, "deepspeed")


def test_recomputed_activation_runs_the_clamps_again():
    """recompute_modules moe_act re-runs the activation's forward: the clamps and the
    concatenation too where the experts are not fused (8g per element of k f_e)."""
    kw = dict(tmp=1, mbs=1, device=DEVICE, bytes_per_element=2, attention="flash",
              modules=("moe_act",))
    fused = replace(GPT_OSS_BLOCK, fused_experts=True)
    extra = selective_recompute_time_s(GPT_OSS_BLOCK, **kw).backward_s \
        - selective_recompute_time_s(fused, **kw).backward_s
    assert extra == pytest.approx(4096 * 4 * 2880 * 8 * 2 / 8e12)


def _gpt_oss_spec(**training) -> dict:
    return {"cluster": {"nodes": [{"gpu": "B200-180GB", "count": 8, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "900 GB/s",
                                   "inter_node_bandwidth": "3200 Gbps"}]},
            "model": {"preset": "gpt-oss-120b"},
            "training": {"global_batch_size": 512, "backend": "megatron", "precision": "bf16",
                         **training}}


def test_sync_free_recipes_fuse_the_experts():
    """training.moe_sync_free (the recipes' CuTeDSL fused grouped MLP) marks every MoE block
    fused; the parameters stay as they are, and a spec without it hashes as before (the
    field is left out of the fingerprint at its default: tests/test_presets.py)."""
    synced = parse_spec(_gpt_oss_spec())
    free = parse_spec(_gpt_oss_spec(moe_sync_free=True))
    blocks = [x for x in free.model.layers if x.kind == "transformer"]
    assert blocks and all(x.fused_experts for x in blocks)
    assert not any(x.fused_experts for x in synced.model.layers)
    assert "fusedmlp" in blocks[0].signature
    assert "fusedmlp" not in synced.model.layers[1].signature
    assert model_param_count(free.model.layers) == model_param_count(synced.model.layers)


def test_gpt_oss_exports_its_activation(tmp_path):
    """`export --format megatron` writes GPT-OSS's activation as Megatron-LM takes it
    (megatron/training/arguments.py: --quick-geglu, --glu-linear-offset,
    --activation-func-clamp-value)."""
    from amp_search.launch.megatron import architecture_args

    spec = parse_spec(_gpt_oss_spec())
    args = architecture_args(spec.model.layers)
    assert "--swiglu" not in args
    i = args.index("--quick-geglu")
    assert args[i + 1:i + 5] == ["--glu-linear-offset", "1", "--activation-func-clamp-value", "7"]


def test_spec_accepts_quick_geglu_with_the_gated_default_width():
    """A dense quick-GEGLU model: the trial layers run it; Megatron-LM cannot (megatron-core
    has the clamped quick-GEGLU in its experts only), so that backend refuses it in one line
    and, with no backend named, plans for DeepSpeed with a note."""
    raw = _gpt_oss_spec()
    raw["model"] = {"preset": "gpt", "num_layers": 2, "hidden_size": 768,
                    "num_attention_heads": 12, "vocab_size": 1000, "seq_length": 256,
                    "mlp": "quick_geglu"}
    with pytest.raises(SpecError, match="model.mlp: quick_geglu without experts.*accepted with "
                                        "num_experts, or training.backend: deepspeed"):
        parse_spec(raw)
    del raw["training"]["backend"]
    spec = parse_spec(raw)
    assert spec.training.backend == "deepspeed"
    assert any("megatron: model.mlp" in n for n in spec.backend_notes)
    block = spec.model.layers[1]
    assert block.mlp == "quick_geglu" and block.gated_mlp
    assert block.ffn_hidden_size == 2048 and block.fc1_width == 4096


def test_yarn_rotates_unfused():
    """YaRN (rope_scaling yarn): megatron-core's eager rotation moves 12g forward and 10g
    backward per element of q and k against the fused kernel's 2g and 2g."""
    yarn = replace(GPT_OSS_BLOCK, rope_scaling="yarn")
    q_k = 4096 * (64 + 8) * 64
    assert unfused_rope_bytes_by_pass(yarn, 1, 2) == (10 * 2 * q_k, 8 * 2 * q_k)
    assert unfused_rope_bytes_by_pass(yarn, 2, 2) == (10 * q_k, 8 * q_k)
    assert unfused_rope_bytes_by_pass(GPT_OSS_BLOCK, 1, 2) == (0.0, 0.0)
    f_yarn = elementwise_bytes_by_pass(yarn, 1, 2, "megatron")
    f_rope = elementwise_bytes_by_pass(GPT_OSS_BLOCK, 1, 2, "megatron")
    assert (f_yarn[0] - f_rope[0], f_yarn[1] - f_rope[1]) == (20 * q_k, 16 * q_k)
    assert "yarn" in yarn.signature and "yarn" not in GPT_OSS_BLOCK.signature


def test_gpt_oss_preset_and_rope_scaling_in_the_spec():
    spec = parse_spec(_gpt_oss_spec())
    block = spec.model.layers[1]
    assert (block.rope_scaling, block.mlp, block.bias) == ("yarn", "quick_geglu", True)
    raw = _gpt_oss_spec()
    raw["model"] = {"preset": "gpt", "num_layers": 2, "hidden_size": 256,
                    "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128,
                    "rope_scaling": "yarn"}
    with pytest.raises(SpecError, match="model.rope_scaling.*position_embedding: rope"):
        parse_spec(raw)
    # from a preset, the error says so
    raw["model"] = {"preset": "gpt-oss-20b", "position_embedding": "learned"}
    with pytest.raises(SpecError, match="rope_scaling from preset gpt-oss-20b"):
        parse_spec(raw)
    raw["model"] = {"preset": "gpt", "num_layers": 2, "hidden_size": 256,
                    "num_attention_heads": 4, "vocab_size": 1000, "seq_length": 128}
    raw["model"]["rope_scaling"] = "linear"
    with pytest.raises(SpecError, match="model.rope_scaling.*none, yarn"):
        parse_spec(raw)


def test_quick_geglu_experts_keep_their_clamped_copy():
    """Both gated activations save fc1's 2 f_e output and fc2's f_e input per routed copy;
    the quick-GEGLU of unfused experts its clamped 2 f_e concatenation too (g 2 k f_e per
    token more), which recomputing moe_act frees with the activation's output, and which
    fused experts do not make."""
    from cost_models.activations import layer_saved_bytes, selective_working_set_bytes

    kw = dict(mbs=1, tmp=1, bytes_per_element=2)
    swiglu = replace(GPT_OSS_BLOCK, mlp="swiglu")
    copy = 2 * 4096 * 4 * 2 * 2880
    assert layer_saved_bytes(GPT_OSS_BLOCK, **kw) == layer_saved_bytes(swiglu, **kw) + copy
    fused = replace(GPT_OSS_BLOCK, fused_experts=True)
    assert layer_saved_bytes(fused, **kw) == layer_saved_bytes(swiglu, **kw)
    moe_act = dict(kw, selective=("moe_act",))
    assert layer_saved_bytes(GPT_OSS_BLOCK, **moe_act) == layer_saved_bytes(swiglu, **moe_act)
    assert selective_working_set_bytes(GPT_OSS_BLOCK, **moe_act) \
        == selective_working_set_bytes(swiglu, **moe_act) + copy
