"""What a mixture-of-experts layer costs where Megatron-Core's dropless token dispatcher
syncs the host (the catalog's moe_expert_overhead per local expert and micro-batch,
CostModel.moe_sync_s), and training.moe_sync_free, which drops it; and the share of the
expert-parallel all-to-alls that training.moe_a2a_overlap (--overlap-moe-expert-parallel-comm)
hides."""
from __future__ import annotations

from dataclasses import replace

import pytest

from amp_search import estimate
from amp_search.costing.cost_model import CostModel
from amp_search.errors import SpecError
from amp_search.spec import load_catalog, parse_spec, spec_fingerprint

NODE = {"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8, "intra_node_bandwidth": "450 GB/s",
        "inter_node_bandwidth": "3200 Gbps"}
MOE = {"preset": "qwen3-30b-a3b", "seq_length": 4096}
DENSE = {"preset": "llama3-8b", "seq_length": 4096}
TINY = {"preset": "gpt", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
        "ffn_hidden_size": 128, "seq_length": 32, "vocab_size": 512, "num_experts": 4,
        "moe_router_topk": 2}


def _spec(model=MOE, backend: str = "megatron", **training) -> dict:
    t = {"global_batch_size": 16, "precision": "bf16", "backend": backend,
         "activation_checkpointing": "none", "zero_stage": 1, "sequence_parallel": False,
         **training}
    return {"cluster": {"nodes": [dict(NODE)]}, "model": dict(model), "training": t}


def _time(spec: dict, catalog=None, **kw) -> float:
    s = parse_spec(spec, catalog=catalog)
    kw = {**dict(pp=1, dp=8, tmp=1, mbs=1, zero_stage=1, activation_checkpointing="none"),
          **({"ep": 8} if s.model.num_experts else {}), **kw}
    return estimate(s, **kw).iteration_time_s


def _catalog(overhead_s: float) -> dict:
    return {n: replace(g, moe_expert_overhead_s=overhead_s) for n, g in load_catalog().items()}


def test_each_local_expert_costs_the_overhead_per_micro_batch():
    """Iteration time rises by micro-batches x MoE blocks x E/ep x the overhead, and by what
    the catalog says: double it, double the rise; none with moe_sync_free."""
    spec = parse_spec(_spec())
    blocks = sum(1 for x in spec.model.layers if x.is_moe)
    experts = spec.model.num_experts
    free = _time(_spec(moe_sync_free=True))
    overhead = load_catalog()["H100-80GB"].moe_expert_overhead_s
    assert overhead > 0
    micro_batches = 16 // 8
    want = micro_batches * blocks * experts / 8 * overhead
    assert _time(_spec()) - free == pytest.approx(want, rel=1e-6)
    assert _time(_spec(), catalog=_catalog(2 * overhead)) - free \
        == pytest.approx(2 * want, rel=1e-6)
    assert _time(_spec(moe_sync_free=True), catalog=_catalog(2 * overhead)) \
        == pytest.approx(free, rel=1e-12)


def test_it_follows_the_local_experts_and_splits_over_the_passes():
    spec = parse_spec(_spec())
    model = CostModel(spec)
    gpu = load_catalog()["H100-80GB"]
    f8, b8 = model.moe_sync_s(gpu, 8)
    f16, b16 = model.moe_sync_s(gpu, 16)
    moe = [x.is_moe for x in spec.model.layers]
    assert all((f > 0) == m for f, m in zip(f8, moe))
    assert f16 * 2 == pytest.approx(f8) and b8 == pytest.approx(2 * f8)
    block = next(i for i, m in enumerate(moe) if m)
    assert f8[block] + b8[block] == pytest.approx(128 / 8 * gpu.moe_expert_overhead_s)


@pytest.mark.parametrize("spec", [_spec(DENSE), _spec(backend="deepspeed", precision="fp32"),
                                  _spec(moe_sync_free=True)])
def test_none_for_dense_models_deepspeed_or_sync_free(spec):
    model = CostModel(parse_spec(spec))
    assert model.moe_sync_s(load_catalog()["H100-80GB"], 8) == (0.0, 0.0)


def test_the_spec_key_and_the_fingerprint():
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(moe_sync_free="yes"))
    assert "training.moe_sync_free" in str(e.value) and "true, false" in str(e.value)
    # false is the default, and a dense model's fingerprint ignores the catalog's overhead
    def sections(spec, catalog=None):
        out = spec_fingerprint(parse_spec(spec, catalog=catalog))
        out.pop("spec_sha256")          # the file's text
        return out

    assert sections(_spec(moe_sync_free=False)) == sections(_spec())
    assert sections(_spec(moe_sync_free=True)) != sections(_spec())
    assert sections(_spec(), catalog=_catalog(1e-3)) != sections(_spec())
    assert sections(_spec(DENSE), catalog=_catalog(1e-3)) == sections(_spec(DENSE))


def test_an_inline_gpu_gives_its_own_overhead():
    gpu = {"name": "X1", "memory": "80 GiB", "memory_bandwidth": "3350 GB/s",
           "peak_tflops": {"bf16": 989, "fp16": 989, "fp32": 67}}
    spec = _spec()
    spec["cluster"]["nodes"][0]["gpu"] = dict(gpu, moe_expert_overhead="1 ms")
    assert parse_spec(spec).cluster.devices[0].gpu.moe_expert_overhead_s == pytest.approx(1e-3)
    spec["cluster"]["nodes"][0]["gpu"] = dict(gpu, moe_expert_overhead="slow")
    with pytest.raises(SpecError) as e:
        parse_spec(spec)
    assert "moe_expert_overhead" in str(e.value)


def test_export_says_the_arguments_run_the_synced_dispatcher():
    """The plan costs sync-free MoE layers; the exported arguments run megatron-core's
    dropless dispatcher, and the notes say which arguments run them sync-free."""
    from amp_search import plan
    from amp_search.export import export_strategy

    for free in (False, True):
        spec = parse_spec(_spec(TINY, moe_sync_free=free, global_batch_size=8,
                                expert_parallel=2))
        best = plan(spec).best
        notes = " ".join(export_strategy(spec, best.strategy, fmt="megatron",
                                         estimate=best).notes)
        assert ("--moe-expert-rank-capacity-factor" in notes) == free


@pytest.mark.parametrize("free", [False, True])
def test_the_plan_header_says_what_moe_layers_cost(free):
    from amp_search import plan
    from amp_search.cli.plan_header import header_lines

    spec = parse_spec(_spec(TINY, moe_sync_free=free, expert_parallel=2, global_batch_size=8))
    text = " ".join(" ".join(header_lines(spec, plan(spec), 200)).split())
    if free:
        assert "MoE layers sync-free (training.moe_sync_free)" in text
    else:
        overhead_us = spec.cluster.devices[0].gpu.moe_expert_overhead_s * 1e6
        assert "synced with the host" in text
        assert f"{overhead_us:.0f} us per local expert" in text
    dense = parse_spec(_spec(DENSE))
    assert "MoE" not in " ".join(header_lines(dense, plan(dense), 200))
    assert "all-to-alls hidden" not in text
    both = parse_spec(_spec(TINY, moe_sync_free=free, moe_a2a_overlap=True, expert_parallel=2,
                            global_batch_size=8))
    hidden = both.cluster.devices[0].gpu.moe_a2a_overlap_share     # the catalog's
    assert f"{hidden:.0%} of their all-to-alls hidden beside another micro-batch" in " ".join(
        " ".join(header_lines(both, plan(both), 200)).split())


# ------------------------------------------------------- the all-to-alls beside compute

def _hidden(share: float) -> dict:
    return {n: replace(g, moe_a2a_overlap_share=share) for n, g in load_catalog().items()}


def test_the_overlap_hides_the_catalogs_share_of_the_all_to_alls():
    """training.moe_a2a_overlap (--overlap-moe-expert-parallel-comm) takes the catalog's
    share off the expert-parallel all-to-alls, and nothing else: hiding all of them takes
    off what they cost, hiding none changes nothing."""
    kw = dict(dp=16, ep=16)             # the expert-parallel group spans both nodes
    two = _spec(global_batch_size=64)   # 4 micro-batches: 3 of 4 forwards have a partner
    two["cluster"]["nodes"][0]["count"] = 2
    plain = _time(two, **kw)
    share = load_catalog()["H100-80GB"].moe_a2a_overlap_share
    assert 0 < share < 1
    on = dict(two, training=dict(two["training"], moe_a2a_overlap=True))
    paired = plain - _time(on, catalog=_hidden(1.0), **kw)      # 3/4 of the all-to-alls
    assert paired > 0
    assert plain - _time(on, **kw) == pytest.approx(share * paired, rel=1e-6)
    assert _time(on, catalog=_hidden(0.0), **kw) == pytest.approx(plain, rel=1e-12)
    # one micro-batch has no partner; full recomputation is not overlapped (megatron-core
    # asserts it), nor is pp > 1 without virtual stages (see below)
    one = dict(on, training=dict(on["training"], global_batch_size=16))
    assert _time(one, **kw) == pytest.approx(
        _time(dict(two, training=dict(two["training"], global_batch_size=16)), **kw),
        rel=1e-12)
    full = dict(kw, activation_checkpointing="full")
    assert _time(on, **full) == pytest.approx(_time(two, **full), rel=1e-12)


def test_no_overlap_without_the_key():
    assert CostModel(parse_spec(_spec())).a2a_hidden_share == 0.0


@pytest.mark.parametrize("key", ["moe_sync_free", "moe_a2a_overlap"])
def test_the_moe_keys_need_experts_and_megatron(key):
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(DENSE, **{key: True}))
    assert f"training.{key}" in str(e.value) and "no experts" in str(e.value)
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(backend="deepspeed", precision="fp32", **{key: True}))
    assert f"training.{key}" in str(e.value)
    assert "backend megatron" in str(e.value) or "bf16 or fp16" in str(e.value)
    if key == "moe_a2a_overlap":        # megatron-core asserts bf16 or fp16 for it
        with pytest.raises(SpecError) as e:
            parse_spec(_spec(precision="fp32", **{key: True}))
        assert "training.moe_a2a_overlap" in str(e.value) and "fp32" in str(e.value)
    both = _spec(**{key: True})
    del both["training"]["backend"]         # planned for both: the DeepSpeed plans ignore it
    spec = parse_spec(both)
    assert getattr(spec.for_backend("megatron").training, key)


def test_the_overlap_key_and_the_fingerprint():
    with pytest.raises(SpecError) as e:
        parse_spec(_spec(moe_a2a_overlap=1))
    assert "training.moe_a2a_overlap" in str(e.value)

    def sections(spec, catalog=None):
        out = spec_fingerprint(parse_spec(spec, catalog=catalog))
        out.pop("spec_sha256")
        return out

    assert sections(_spec(moe_a2a_overlap=False)) == sections(_spec())
    assert sections(_spec(), catalog=_hidden(0.9)) == sections(_spec())   # not used
    on = _spec(moe_a2a_overlap=True)
    assert sections(on, catalog=_hidden(0.9)) != sections(on)


def test_the_overlap_arguments_and_where_megatron_core_runs_them():
    from amp_search.launch.megatron import megatron_args
    from amp_search.launch.orchestrator import preflight

    spec = parse_spec(_spec(TINY, moe_a2a_overlap=True, expert_parallel=2, global_batch_size=8))
    s = estimate(spec, pp=1, dp=8, tmp=1, mbs=1, ep=2, zero_stage=1,
                 activation_checkpointing="none").strategy
    args = megatron_args(spec.model.layers, s, precision="bf16", iters=2, moe_a2a_overlap=True)
    assert "--overlap-moe-expert-parallel-comm" in args and "--delay-wgrad-compute" in args
    assert args[args.index("--transformer-impl") + 1] == "transformer_engine"
    piped = estimate(spec, pp=2, dp=4, tmp=1, mbs=1, ep=2, zero_stage=1,
                     activation_checkpointing="none", virtual_stages=1).strategy
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(
        spec.model.layers, piped, precision="bf16", iters=2, moe_a2a_overlap=True)
    full = estimate(spec, pp=1, dp=8, tmp=1, mbs=1, ep=2, zero_stage=1,
                    activation_checkpointing="full").strategy
    assert "--overlap-moe-expert-parallel-comm" not in megatron_args(
        spec.model.layers, full, precision="bf16", iters=2, moe_a2a_overlap=True)
    # costed without it there: pp > 1 and no virtual stages
    assert CostModel(spec).a2a_hidden_share > 0
    off = parse_spec(_spec(TINY, expert_parallel=2, global_batch_size=8))
    kw = dict(tmp=1, mbs=1, ep=2, zero_stage=1, activation_checkpointing="none")
    assert estimate(spec, pp=2, dp=4, virtual_stages=1, **kw).iteration_time_s \
        == pytest.approx(estimate(off, pp=2, dp=4, virtual_stages=1, **kw).iteration_time_s,
                         rel=1e-12)
    cpu = _spec(TINY, moe_a2a_overlap=True, expert_parallel=2, global_batch_size=8)
    cpu["cluster"]["nodes"][0] = {"gpu": "CPU-local", "count": 1, "gpus_per_node": 4,
                                  "intra_node_bandwidth": "10 GB/s",
                                  "inter_node_bandwidth": "10 Gbps"}
    cpu_spec = parse_spec(cpu)
    on_cpu = estimate(cpu_spec, pp=1, dp=4, tmp=1, mbs=1, ep=2, zero_stage=1,
                      activation_checkpointing="none").strategy
    assert "needs CUDA" in preflight(cpu_spec, on_cpu, "megatron")
