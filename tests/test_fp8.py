"""training.precision: fp8 (Transformer Engine: FP8 GEMMs, BF16 elsewhere) and the interleaved
chunks that count the embedding and the loss as layers (Megatron-LM's
--account-for-embedding-in-pipeline-split / --account-for-loss-in-pipeline-split)."""
from __future__ import annotations

import json

import pytest

from amp_search.errors import SpecError, UsageError
from amp_search.export import export_strategy
from amp_search.launch.megatron import megatron_args
from amp_search.partition import interleaved_partition
from amp_search.planner import estimate
from amp_search.spec import load_catalog, parse_spec
from amp_search.costing.layer_times import device_speed
from cost_models.compute import analytic_layer_time, attention_time_s, gemm_forward_time_s


def _spec(precision="fp8", gpu="H100-80GB", backend="megatron", layers=8, count=1):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": gpu, "count": count, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "3200 Gbps"}]},
        "model": {"preset": "llama3-8b", "num_layers": layers, "seq_length": 4096},
        "training": {"global_batch_size": 64, "precision": precision, "backend": backend,
                     "zero_stage": 1, "activation_checkpointing": "none"}})


def test_fp8_is_megatron_only_and_needs_an_fp8_rate():
    assert _spec().training.storage_precision == "bf16"
    assert _spec(precision="bf16").training.storage_precision == "bf16"
    with pytest.raises(SpecError) as err:
        _spec(backend="deepspeed")
    assert "training.precision" in str(err.value) and "megatron" in str(err.value)
    with pytest.raises(SpecError) as err:
        _spec(gpu="A100-80GB")
    msg = str(err.value)
    assert "A100-80GB" in msg and "no fp8 support" in msg and "bf16" in msg


def test_catalog_fp8_rates_are_twice_bf16_on_hopper_and_blackwell():
    cat = load_catalog()
    for name in ("H100-80GB", "H200-141GB", "B200-180GB", "B300-288GB", "GB200-186GB",
                 "GB300-288GB", "L4-24GB"):
        peak = cat[name].peak_flops_per_s
        assert peak["fp8"] == pytest.approx(2 * peak["bf16"], rel=3e-3), name
    for name in ("A100-80GB", "V100-16GB", "T4-16GB"):
        assert cat[name].peak_flops_per_s["fp8"] is None


def test_the_nvl72_gpus_sustain_their_own_fp8_rates():
    """GB200 and GB300 print the same FP8 peak but draw 1,200 and 1,400 W: each has its own
    fitted fp8_max (megatron_bridge.py fit_fp8_per_gpu), the GB300's sustained FP8 rate above
    the GB200's, both beside the H100's; the GPUs not fitted keep the default."""
    cat = load_catalog()
    gb200, gb300, h100 = (cat[n] for n in ("GB200-186GB", "GB300-288GB", "H100-80GB"))
    assert gb200.peak_flops_per_s["fp8"] == gb300.peak_flops_per_s["fp8"]
    assert gb200.gemm_fp8_max_efficiency < h100.gemm_fp8_max_efficiency \
        < gb300.gemm_fp8_max_efficiency
    for name in ("B200-180GB", "B300-288GB", "H200-141GB"):
        assert cat[name].gemm_fp8_max_efficiency == h100.gemm_fp8_max_efficiency, name
    for gpu in (gb200, gb300):
        assert "Llama 3 70B" in gpu.gemm_efficiency_source
    # the rates reach the linear GEMMs: the GB300's FP8 linear layers run faster
    layer = _spec().model.layers[1]
    fast, slow = (gemm_forward_time_s(layer, tmp=1, mbs=1, device=device_speed(g, "fp8"))
                  for g in (gb300, gb200))
    assert fast < slow


def test_fp8_speeds_up_the_linear_gemms_only():
    gpu = load_catalog()["H100-80GB"]
    layer = _spec().model.layers[1]
    assert layer.kind == "transformer"
    bf16, fp8 = device_speed(gpu, "bf16"), device_speed(gpu, "fp8")
    # the attention core and the memory-bound work run in BF16 either way
    assert fp8.peak_flops_per_s == bf16.peak_flops_per_s
    assert attention_time_s(layer, tmp=1, mbs=1, device=fp8, bytes_per_element=2,
                            attention="flash") == attention_time_s(
        layer, tmp=1, mbs=1, device=bf16, bytes_per_element=2, attention="flash")
    assert fp8.linear().peak_flops_per_s == gpu.peak_flops_per_s["fp8"]
    # the same fixed time per GEMM call: F_half / (peak eff_max) unchanged
    lin = fp8.linear()
    assert lin.gemm_half_flops / (lin.peak_flops_per_s * lin.gemm_max_efficiency) == \
        pytest.approx(bf16.gemm_half_flops / (bf16.peak_flops_per_s * bf16.gemm_max_efficiency))
    t16 = analytic_layer_time(layer, tmp=1, mbs=1, device=bf16, bytes_per_element=2)
    t8 = analytic_layer_time(layer, tmp=1, mbs=1, device=fp8, bytes_per_element=2)
    assert 0.5 * t16.forward_s < t8.forward_s < t16.forward_s


def test_fp8_leaves_the_head_projection_in_bf16():
    """megatron-core's output layer is a plain ColumnParallelLinear outside Transformer
    Engine's FP8 region: under fp8 and nvfp4 its GEMM runs at the BF16 rate, the blocks' at
    the narrower one."""
    spec = _spec()
    head = spec.model.layers[-1]
    block = spec.model.layers[1]
    assert head.kind == "head" and block.kind == "transformer"
    for gpu, precision in ((load_catalog()["H100-80GB"], "fp8"),
                           (load_catalog()["B200-180GB"], "nvfp4")):
        bf16, narrow = device_speed(gpu, "bf16"), device_speed(gpu, precision)
        kw = dict(tmp=1, mbs=2)
        assert gemm_forward_time_s(head, device=narrow, **kw) == \
            gemm_forward_time_s(head, device=bf16, **kw) > 0
        assert gemm_forward_time_s(block, device=narrow, **kw) < \
            0.7 * gemm_forward_time_s(block, device=bf16, **kw)


def test_fp8_saved_linear_inputs_by_hand():
    from cost_models.activations import layer_saved_bytes

    layer = _spec().model.layers[1]          # Llama 3 8B block: h 4096, f 14336, a d 4096
    kw = dict(mbs=2, tmp=2, bytes_per_element=2)
    delta = layer_saved_bytes(layer, **kw) - layer_saved_bytes(layer, **kw, fp8=True)
    # QKV and fc1 inputs 2 -> 1 B (h each), fc2 input 2 -> 1 B (f/t), + the FP8 copy of the
    # projection input (a d / t), per token, s = 4096 tokens, mbs 2
    assert delta == (2 * 4096 + 14336 // 2 - 4096 // 2) * 4096 * 2
    head = _spec().model.layers[-1]
    assert layer_saved_bytes(head, **kw) == layer_saved_bytes(head, **kw, fp8=True)


def test_fp8_plan_is_faster_keeps_bf16_states_and_exports_te_flags():
    bf = estimate(_spec(precision="bf16"), pp=2, dp=2, tmp=2, mbs=1)
    f8 = estimate(_spec(), pp=2, dp=2, tmp=2, mbs=1)
    assert f8.iteration_time_s < bf.iteration_time_s
    for m8, m16 in zip(f8.memory, bf.memory):     # BF16 weights, FP32 grads and optimizer
        assert (m8.parameter_bytes, m8.gradient_bytes, m8.optimizer_bytes) == \
            (m16.parameter_bytes, m16.gradient_bytes, m16.optimizer_bytes)
        assert m8.activation_bytes < m16.activation_bytes
    args = megatron_args(_spec().model.layers, f8.strategy, precision="fp8", iters=10)
    i = args.index("--fp8-format")
    assert args[i + 1] == "hybrid" and "--bf16" in args
    # Megatron-LM refuses FP8 without Transformer Engine ("transformer-engine required for fp8
    # training and inference"); BF16 keeps the trials' local layers
    assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
    bf_args = megatron_args(_spec().model.layers, bf.strategy, precision="bf16", iters=10)
    assert bf_args[bf_args.index("--transformer-impl") + 1] == "local"


def test_interleaved_partition_counts_embedding_and_loss_where_blocks_do_not_split():
    # blocks split evenly: Megatron's --num-layers-per-virtual-pipeline-stage
    assert interleaved_partition(10, 4, first=1, last=1) == (0, 3, 5, 7, 10)
    # Llama 3.1 405B: 126 blocks + embedding + head = 128 layers in 32 chunks of 4
    b = interleaved_partition(128, 32, first=1, last=1)
    assert len(b) == 33 and all(y - x == 4 for x, y in zip(b, b[1:]))
    # 128 chunks: the embedding alone in the first, the head alone in the last
    b = interleaved_partition(128, 128, first=1, last=1)
    assert b == tuple(range(129))
    with pytest.raises(ValueError, match="do not split"):
        interleaved_partition(11, 4, first=1, last=1)       # 9 blocks, 11 layers


def test_estimate_and_export_of_uneven_blocks(tmp_path):
    spec = _spec(layers=14, count=1)       # 14 blocks + embedding + head = 16 layers
    with pytest.raises(Exception) as err:  # 14 blocks do not split into 8 chunks ...
        estimate(_spec(layers=13), pp=4, dp=1, tmp=2, mbs=1, virtual_stages=2)
    assert "account-for-embedding" in str(err.value)
    e = estimate(spec, pp=4, dp=1, tmp=2, mbs=1, virtual_stages=2)  # ... 16 layers do
    assert e.strategy.partition == tuple(range(0, 17, 2))
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e, iters=10, warmup=5)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "2"
    assert "--account-for-embedding-in-pipeline-split" in args
    assert "--account-for-loss-in-pipeline-split" in args
    assert "--num-layers-per-virtual-pipeline-stage" not in args
    with pytest.raises(UsageError):
        megatron_args(spec.model.layers,
                      e.strategy.__class__(**{**e.strategy.__dict__,
                                              "partition": (0, 1, 3, 5, 7, 9, 11, 13, 16)}),
                      precision="fp8", iters=10)


def _cpu(training):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "CPU-local", "count": 1, "gpus_per_node": 2,
                               "intra_node_bandwidth": "10 GB/s"}]},
        "model": {"preset": "gpt", "num_layers": 2, "hidden_size": 64,
                  "num_attention_heads": 2, "seq_length": 32, "vocab_size": 128},
        "training": {"global_batch_size": 4, **training}})


def test_cpu_clusters_default_to_fp32_and_inter_node_bandwidth_takes_nic_counts():
    assert _cpu({}).training.precision == "fp32"            # not the 0.001 TFLOP/s fp16
    assert _cpu({"precision": "fp16"}).training.precision == "fp16"   # written: kept
    assert _spec(precision="bf16").training.precision == "bf16"
    base = {"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
            "intra_node_bandwidth": "450 GB/s"}
    model = {"preset": "llama3-8b", "num_layers": 4}
    training = {"global_batch_size": 16, "precision": "bf16"}
    nics = parse_spec({"cluster": {"nodes": [{**base, "inter_node_bandwidth": "8 x 400 Gbps"}]},
                       "model": model, "training": training})
    total = parse_spec({"cluster": {"nodes": [{**base, "inter_node_bandwidth": "3200 Gbps"}]},
                        "model": model, "training": training})
    assert nics.cluster.node_groups[0].inter_node_bandwidth_bytes_per_s == \
        total.cluster.node_groups[0].inter_node_bandwidth_bytes_per_s == 3200e9 / 8
    with pytest.raises(SpecError) as err:
        parse_spec({"cluster": {"nodes": [{**base, "inter_node_bandwidth": "0 x 400 Gbps"}]},
                    "model": model, "training": training})
    assert "cluster.nodes[0].inter_node_bandwidth" in str(err.value)


def test_nvfp4_is_blackwell_megatron_only_faster_than_fp8_and_exports_te_flags():
    """training.precision: nvfp4 (Transformer Engine's NVFP4 recipe): Blackwell's FP4 rate for
    the linear GEMMs at the catalog's nvfp4_max efficiency, BF16 elsewhere; Megatron-LM's
    --fp4-format e2m1 --fp4-recipe nvfp4."""
    cat = load_catalog()
    for name in ("B200-180GB", "B300-288GB", "GB200-186GB", "GB300-288GB"):
        peak = cat[name].peak_flops_per_s
        assert peak["nvfp4"] >= 2 * peak["fp8"] * 0.99 and cat[name].gemm_nvfp4_max_efficiency
    for name in ("H100-80GB", "A100-80GB"):
        assert cat[name].peak_flops_per_s.get("nvfp4") is None
    with pytest.raises(SpecError, match="no nvfp4 support"):
        _spec(precision="nvfp4")                      # an H100
    with pytest.raises(SpecError, match="megatron"):
        _spec(precision="nvfp4", gpu="GB200-186GB", backend="deepspeed")
    gb = dict(gpu="GB200-186GB")
    f4 = estimate(_spec(precision="nvfp4", **gb), pp=2, dp=2, tmp=2, mbs=1)
    f8 = estimate(_spec(precision="fp8", **gb), pp=2, dp=2, tmp=2, mbs=1)
    assert f4.iteration_time_s < f8.iteration_time_s
    speed = device_speed(cat["GB200-186GB"], "nvfp4")
    assert speed.linear_peak_flops_per_s == cat["GB200-186GB"].peak_flops_per_s["nvfp4"]
    assert speed.linear_gemm_max_efficiency == cat["GB200-186GB"].gemm_nvfp4_max_efficiency
    assert speed.peak_flops_per_s == cat["GB200-186GB"].peak_flops_per_s["bf16"]
    for m4, m8 in zip(f4.memory, f8.memory):          # the same BF16 states and saved copies
        assert m4.peak_bytes == m8.peak_bytes
    args = megatron_args(_spec(**gb).model.layers, f4.strategy, precision="nvfp4", iters=10)
    assert args[args.index("--fp4-format") + 1] == "e2m1" and "--bf16" in args
    assert args[args.index("--fp4-recipe") + 1] == "nvfp4" and "--fp8-format" not in args
    assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
