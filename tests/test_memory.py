"""The memory model (the requirement: nothing it proposes runs out of memory): formulas, the
per-stage record the planner uses, and the proof that it holds: every part predicted within
5 % of what the real trial engine holds, measured on this machine (small model, tmp 1/2, pp 1/2,
dp 2, recomputation on/off, ZeRO 0-3)."""
from __future__ import annotations

import json

import pytest

from cost_models import activations

from cost_models import memory as memory_model
from cost_models.layers import Layer, param_count
from conftest import ROOT, load_benchmark

S, H, A, F_, V = 32, 64, 4, 256, 512


def _layers(n_blocks=2, s=S, h=H, a=A, v=V):
    block = dict(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
                 ffn_hidden_size=4 * h)
    return ((Layer(kind="embedding", seq_length=s, hidden_size=h, vocab_size=v, name="emb"),)
            + tuple(Layer(**block, name=f"block{i}") for i in range(n_blocks))
            + (Layer(kind="head", seq_length=s, hidden_size=h, vocab_size=v, name="head"),))


# ----------------------------------------------------------------------------- formulas

@pytest.mark.parametrize("tmp", [1, 2, 4])
@pytest.mark.parametrize("layer", [
    Layer(kind="embedding", seq_length=S, hidden_size=H, vocab_size=V),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          ffn_hidden_size=F_),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          ffn_hidden_size=F_, input_hidden_size=48),
    Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_),
    Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, input_hidden_size=32),
    Layer(kind="head", seq_length=S, hidden_size=H, vocab_size=V),
    Layer(kind="custom", seq_length=S, custom_forward_flops=1e6, custom_params=1234,
          custom_output_elements=99),
], ids=lambda x: getattr(x, "kind", x))
def test_parameter_tensors_sum_to_param_count(layer, tmp):
    assert sum(memory_model.param_tensor_numels(layer, tmp)) == param_count(layer, tmp)


def test_mixed_precision_adam_is_16_bytes_per_parameter_without_zero():
    P = 1_000_000
    states = memory_model.model_state_bytes((P,), precision="fp32", zero_stage=0, dp=4, gas=8)
    assert (states.parameter_bytes, states.gradient_bytes, states.optimizer_bytes) == \
        (4 * P, 4 * P, 8 * P)
    assert states.buffer_bytes == 0


def test_zero_stages_divide_what_they_partition():
    P, d = 1 << 24, 8
    tensors = (P // 1024,) * 1024                 # slices end on tensor boundaries
    z = {k: memory_model.model_state_bytes(tensors, precision="bf16", zero_stage=k, dp=d, gas=4,
                                buckets=memory_model.ZeroBuckets(reduce_bucket_elements=P,
                                                      stage3_persistence_threshold=0,
                                                      stage3_max_live_parameters=0))
         for k in (1, 2, 3)}
    assert z[1].optimizer_bytes == z[2].optimizer_bytes == 12 * P // d   # fp32 master + moments
    assert z[1].parameter_bytes == z[2].parameter_bytes == 2 * P          # weights whole
    assert z[1].gradient_bytes == 2 * P                # full bf16 gradients until the boundary
    # two bf16 partition buffers from the 2nd micro-batch on, or the fp32 one at the step
    assert z[2].gradient_bytes == max(2 * 2 * P // d, 4 * P // d)
    assert z[3].parameter_bytes == 2 * P // d and z[3].gradient_bytes == 6 * P // d


def test_zero_bucket_is_counted_with_zero_only():
    b = memory_model.ZeroBuckets(reduce_bucket_elements=1000)
    assert memory_model.zero_bucket_bytes(precision="bf16", zero_stage=0, buckets=b) == 0
    assert memory_model.zero_bucket_bytes(precision="bf16", zero_stage=2, buckets=b) == 2000
    assert memory_model.zero_bucket_bytes(precision="fp32", zero_stage=1) == 4 * 500_000_000


def test_straddling_partition_takes_whole_parameters():
    # 3 tensors of 10 over 2 ranks: slices [0, 15) and [15, 30); rank 0 holds tensors 0-1,
    # rank 1 tensors 1-2: 20 elements each
    assert memory_model.straddling_partition_numel((10, 10, 10), 2) == 20
    assert memory_model.straddling_partition_numel((10, 10, 10), 1) == 30


def test_zero_2_and_3_need_pp_1():
    assert memory_model.zero_allowed(1, 3) and memory_model.zero_allowed(4, 1)
    assert not memory_model.zero_allowed(2, 2) and not memory_model.zero_allowed(2, 3)


def test_first_stage_holds_the_most_micro_batches():
    assert [activations.in_flight_microbatches(j, 4, 8) for j in range(4)] == [4, 3, 2, 1]
    assert activations.in_flight_microbatches(0, 4, 2) == 2


def test_tensor_parallelism_divides_what_it_splits():
    block = _layers()[1]
    one = activations.layer_saved_bytes(block, mbs=1, tmp=1, bytes_per_element=2)
    two = activations.layer_saved_bytes(block, mbs=1, tmp=2, bytes_per_element=2)
    replicated = 2 * S * (4 * H + 4)                       # LayerNorm inputs/outputs and stats
    assert two - replicated == pytest.approx((one - replicated) / 2, rel=1e-9)
    head = _layers()[-1]
    assert activations.layer_saved_bytes(head, mbs=1, tmp=2, bytes_per_element=2) < \
        activations.layer_saved_bytes(head, mbs=1, tmp=1, bytes_per_element=2)


def test_attention_scores_are_optional_and_quadratic():
    block = _layers(s=128)[1]
    flash = activations.layer_saved_bytes(block, mbs=1, tmp=1, bytes_per_element=2)
    classic = activations.layer_saved_bytes(block, mbs=1, tmp=1, bytes_per_element=2,
                                  attention_scores=True)
    assert classic - flash == 5 * A * 128 * 128       # Korthikanti et al.: 5 a s^2 b in fp16


def test_recomputation_keeps_block_inputs_plus_one_working_set():
    layers = _layers(n_blocks=8)
    kw = dict(stage=0, pp=1, gas=4, mbs=2, tmp=1, bytes_per_element=2)
    full = activations.stage_saved_activation_bytes(layers, recompute=False, **kw)
    ckpt = activations.stage_saved_activation_bytes(layers, recompute=True, **kw)
    inputs = 8 * 2 * S * H * 2
    assert ckpt < full
    assert ckpt >= inputs + activations.layer_saved_bytes(layers[0], mbs=2, tmp=1, bytes_per_element=2)


def test_pipeline_buffers_hold_the_logits_on_the_last_stage():
    layers = _layers()
    head_stage = layers[2:]
    bf16 = activations.pipeline_buffer_bytes(head_stage, stage=1, pp=2, gas=4, mbs=2, tmp=1,
                                   bytes_per_element=2, pipelined=True)
    assert bf16 == 2 * (2 * S * V * 2)                     # two buffers of bf16 logits
    assert activations.pipeline_buffer_bytes(head_stage, stage=1, pp=2, gas=4, mbs=2, tmp=1,
                                   bytes_per_element=2, pipelined=False) == 0


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("zero,ckpt", [(0, False), (1, False), (0, True)])
def test_linear_stage_memory_tracks_the_exact_stage_bytes(precision, zero, ckpt):
    """The partition DP's additive form agrees with stage_bytes on a real split: pipeline
    buffers (the last stage's logits, one fewer in fp32) exactly, model states within the
    per-parameter averaging of ZeRO padding; with recomputation it may count the working set
    on top of the head's saved activations, which the exact model frees first (an upper
    bound)."""
    layers = _spec(layers=6).model.layers
    pp, dp, tmp, mbs, gas = 3, 2, 1, 2, 4
    bounds = (0, 3, 5, len(layers))
    g = memory_model.BYTES_PER_ELEMENT[precision]
    lin = memory_model.linear_stage_memory(layers, dp=dp, tmp=tmp, mbs=mbs, gas=gas, zero_stage=zero,
                                recompute=ckpt, precision=precision,
                                framework_overhead_bytes=0)
    layer_bytes, reserved = lin.stage_arrays(pp, gas)
    for j in range(pp):
        part = layers[bounds[j]:bounds[j + 1]]
        exact = memory_model.stage_bytes(part, stage=j, pp=pp, dp=dp, tmp=tmp, mbs=mbs, gas=gas,
                              zero_stage=zero, recompute=ckpt, precision=precision)
        approx = layer_bytes[j, bounds[j]:bounds[j + 1]].sum() + reserved[j]
        total = (exact.parameter_bytes + exact.gradient_bytes + exact.optimizer_bytes
                 + exact.activation_bytes + exact.buffer_bytes)
        assert 0.99 * total <= approx <= 1.07 * total, j
    last = layers[-1]
    logits = g * last.seq_length * last.vocab_size * mbs
    buffers = activations.pipe_buffer_count(pp - 1, pp, gas) - (1 if precision == "fp32" else 0)
    out = g * last.seq_length * last.hidden_size * mbs                # a block's output
    fixed = reserved[0] - activations.pipe_buffer_count(0, pp, gas) * out
    assert reserved[-1] == pytest.approx(fixed + buffers * logits)


def _spec(memory="16 GiB", layers=24, hidden=2048, zero=0, ckpt="none", headroom="5%"):
    from amp_search.spec import parse_spec
    return parse_spec({
        "cluster": {"nodes": [{"gpu": {"name": "G", "memory": memory,
                                       "memory_bandwidth": "900 GB/s",
                                       "peak_tflops": {"fp32": 15, "fp16": 120, "bf16": 120}},
                               "count": 1, "gpus_per_node": 8,
                               "intra_node_bandwidth": "300 GB/s",
                               "inter_node_bandwidth": "100 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": layers, "hidden_size": hidden,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 51200},
        "training": {"global_batch_size": 64, "precision": "fp16", "zero_stage": zero,
                     "activation_checkpointing": ckpt, "memory_headroom": headroom}},
        catalog={})


def _strategy(pp, dp, tmp, mbs, n_layers, zero=0, ckpt=False):
    from amp_search.records import Strategy
    cuts = [round(j * n_layers / pp) for j in range(pp + 1)]
    placement = tuple(tuple(tuple((j * dp + r) * tmp + t for t in range(tmp))
                            for r in range(dp)) for j in range(pp))
    return Strategy(pp=pp, dp=dp, tmp=tmp, mbs=mbs, global_batch_size=64,
                    partition=tuple(cuts), placement=placement, zero_stage=zero,
                    activation_checkpointing=ckpt)


def test_stage_memory_record():
    from amp_search.costing.stage_memory import stage_memory
    spec = _spec()
    L = spec.model.num_layers
    mem = stage_memory(spec, _strategy(4, 2, 1, 1, L))
    assert [m.stage for m in mem] == [0, 1, 2, 3]
    for m in mem:
        assert m.peak_bytes == (m.parameter_bytes + m.gradient_bytes + m.optimizer_bytes
                                + m.activation_bytes + m.overhead_bytes)
        assert m.capacity_bytes == int(16 * 2 ** 30 * 0.95)
        assert m.overhead_bytes >= spec.training.framework_overhead_bytes
        d = m.to_dict()
        assert d["fits"] == m.fits and json.dumps(d)
    # the first stage holds the most micro-batches (and the same number of blocks)
    assert mem[0].activation_bytes > mem[2].activation_bytes


def test_what_does_not_fit_is_flagged_and_knobs_make_it_fit():
    from amp_search.costing.stage_memory import stage_memory
    spec = _spec(memory="24 GiB", layers=24, hidden=2048)
    L = spec.model.num_layers
    plain = stage_memory(spec, _strategy(1, 8, 1, 8, L))            # 1.3B params on each GPU
    assert not all(m.fits for m in plain)
    zero3_ckpt = stage_memory(spec, _strategy(1, 8, 1, 1, L, zero=3, ckpt=True))
    assert zero3_ckpt[0].peak_bytes < plain[0].peak_bytes
    # fp16 without ZeRO: FP16_UnfusedOptimizer keeps all 12 bytes; ZeRO 3 an eighth of them
    assert zero3_ckpt[0].optimizer_bytes * 8 == pytest.approx(plain[0].optimizer_bytes,
                                                              rel=0.01)


def test_capacity_is_the_smallest_device_of_the_stage_minus_headroom():
    from amp_search.costing.stage_memory import stage_memory
    spec = _spec(headroom="10%")
    mem = stage_memory(spec, _strategy(2, 1, 4, 1, spec.model.num_layers))
    assert all(m.capacity_bytes == int(16 * 2 ** 30 * 0.9) for m in mem)


# ----------------------------------------------------------------------------- measured

def _bench():
    """benchmarks/memory_accuracy.py, which holds the measuring harness."""
    return load_benchmark("memory_accuracy")


TEST_CASES = {
    # (pp, dp, tmp): [(zero stage, recompute, precision, gas)]
    (1, 2, 1): [(0, False, "bf16", 3), (1, True, "bf16", 3), (2, False, "bf16", 3),
                (2, False, "fp32", 1), (3, False, "bf16", 3), (1, False, "fp32", 3)],
    (2, 1, 1): [(0, True, "bf16", 3), (1, False, "fp32", 3)],
    (1, 1, 2): [(1, False, "bf16", 3), (0, True, "fp32", 3), (3, False, "fp32", 2)],
}


def test_predictions_match_the_real_trial_engine_within_5_percent():
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    B = _bench()
    layers = B.gpt_layers(**B.QUICK)
    cases = []
    for (pp, dp, tmp), knobs in TEST_CASES.items():
        part = tuple(round(j * len(layers) / pp) for j in range(pp + 1))
        cases += [B.Case(pp=pp, dp=dp, tmp=tmp, mbs=2, gas=gas, zero_stage=z, recompute=ck,
                         precision=p, partition=part, buckets=B.QUICK_BUCKETS)
                  for z, ck, p, gas in knobs]
    rows = B.compare(B.measure(cases, layers, timeout_s=300), layers)
    assert len(rows) == len(B.PARTS) * sum(c.pp for c in cases)
    # every part that exists was measured (nothing silently zero)
    by = {(r.case, r.stage, r.part): r for r in rows}
    for r in rows:
        if r.part in ("parameter_bytes", "optimizer_bytes", "activation_bytes_per_microbatch",
                      "activation_peak_bytes", "gradient_bytes"):
            assert r.measured > 0, r
    assert by[("pp1dp2tmp1-mbs2x3-z3-bf16", 0, "buffer_bytes")].measured > 0
    bad = B.failures(rows)
    assert not bad, "\n" + B.table(bad)


def test_knob_predictions_match_the_real_trial_engine_within_5_percent():
    """Sequence parallelism and selective recomputation on the real trial engine (gloo, tmp
    2): one stage and two stages (whose pipeline buffers hold [s/t, b, h] shards), with full
    and selective recomputation, ZeRO 0-2; every part within 5 %."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    B = _bench()
    layers = B.gpt_layers(**B.QUICK)
    kw = dict(mbs=2, gas=3, buckets=B.QUICK_BUCKETS)
    one, two = (0, len(layers)), (0, 2, len(layers))
    cases = [B.Case(pp=1, dp=1, tmp=2, zero_stage=0, recompute=False, sequence_parallel=True,
                    precision="bf16", partition=one, **kw),
             B.Case(pp=1, dp=1, tmp=2, zero_stage=1, recompute=False, selective=True,
                    sequence_parallel=True, precision="fp32", partition=one, **kw),
             B.Case(pp=1, dp=1, tmp=2, zero_stage=2, recompute=False, selective=True,
                    precision="bf16", partition=one, **kw),
             B.Case(pp=2, dp=1, tmp=2, zero_stage=0, recompute=True, sequence_parallel=True,
                    precision="fp32", partition=two, **kw),
             B.Case(pp=2, dp=1, tmp=2, zero_stage=1, recompute=False, sequence_parallel=True,
                    precision="bf16", partition=two, **kw)]
    rows = B.compare(B.measure(cases, layers, timeout_s=300), layers)
    assert len(rows) == len(B.PARTS) * sum(c.pp for c in cases)
    for r in rows:
        if r.part in ("parameter_bytes", "activation_bytes_per_microbatch",
                      "activation_peak_bytes"):
            assert r.measured > 0, r
    # sequence parallelism really shrinks what is saved: the same case without it saves more
    plain = B.predict(B.Case(pp=1, dp=1, tmp=2, zero_stage=0, recompute=False,
                             precision="bf16", partition=one, **kw), layers, 0)
    sp = {(r.case, r.part): r for r in rows}[("pp1dp1tmp2-mbs2x3-z0-sp-bf16",
                                              "activation_bytes_per_microbatch")]
    assert sp.measured < 0.9 * plain["activation_bytes_per_microbatch"]
    bad = B.failures(rows)
    assert not bad, "\n" + B.table(bad)


def test_dropout_masks_match_the_real_trial_engine_within_5_percent():
    """Hidden dropout (Layer.hidden_dropout) on the real trial engine: its 1-byte masks
    (after the embedding, the attention and the MLP) are what the model adds, with and
    without sequence parallelism; every part within 5%, and the masks really are kept."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    B = _bench()
    layers = B.gpt_layers(**B.QUICK, hidden_dropout=0.1)
    one = (0, len(layers))
    kw = dict(mbs=2, gas=3, buckets=B.QUICK_BUCKETS, pp=1, dp=1, zero_stage=0,
              recompute=False, precision="bf16", partition=one)
    cases = [B.Case(tmp=1, **kw), B.Case(tmp=2, sequence_parallel=True, **kw)]
    rows = B.compare(B.measure(cases, layers, timeout_s=300), layers)
    bad = B.failures(rows)
    assert not bad, "\n" + B.table(bad)
    plain = B.predict(cases[0], B.gpt_layers(**B.QUICK), 0)
    got = {(r.case, r.part): r for r in rows}[("pp1dp1tmp1-mbs2x3-z0-bf16",
                                              "activation_bytes_per_microbatch")]
    masks = (2 * B.QUICK["num_layers"] + 1) * B.QUICK["hidden"] * B.QUICK["seq"] * 2
    assert got.measured - plain["activation_bytes_per_microbatch"] == \
        pytest.approx(masks, rel=0.2), (got.measured, plain["activation_bytes_per_microbatch"])


@pytest.mark.parametrize("config", ["amp-hetero-gpt2", "cpu-tiny-llama", "a100-gpt7b"])
def test_stage_memory_cached_by_composition_is_each_stage_computed_alone(config):
    """The planner caches a stage's model states and activation terms by the composition of
    its layers (amp_search.costing.stage_memory._composition): for every strategy of a plan,
    each stage's bytes equal cost_models.memory.stage_bytes of that stage's own layers."""
    from amp_search import load_spec, plan
    from amp_search.costing.stage_memory import stage_memory
    from cost_models import memory

    spec = load_spec(ROOT / "configs" / f"{config}.yaml")
    t = spec.training
    for e in plan(spec, simulate_top=0).strategies[:12]:
        s = e.strategy
        if s.virtual_stages > 1:
            continue
        got = stage_memory(spec, s)
        for j, m in enumerate(got):
            a, z = s.partition[j], s.partition[j + 1]
            scores = any(spec.attention_for(spec.cluster.devices[d].gpu) == "standard"
                         for rep in s.placement[j] for d in rep)
            want = memory.stage_bytes(spec.model.layers[a:z], stage=j, pp=s.pp, dp=s.replicas,
                                      tmp=s.tmp, mbs=s.mbs, gas=s.gas, zero_stage=s.zero_stage,
                                      recompute=s.activation_checkpointing,
                                      precision=t.precision, attention_scores=scores,
                                      sequence_parallel=s.sequence_parallel,
                                      selective=s.selective_recompute, framework=t.backend,
                                      cp=s.cp, ep=s.ep)
            assert (m.parameter_bytes, m.gradient_bytes, m.optimizer_bytes,
                    m.activation_bytes) == (want.parameter_bytes, want.gradient_bytes,
                                            want.optimizer_bytes, want.activation_bytes), \
                (s.label(), j)
