"""The search space as named rules: one set used by the enumeration, the Megatron baseline,
`estimate`'s errors and the prune counts; equivalent points collapse; the ranking holds one
strategy per layout."""
from __future__ import annotations

from collections import Counter
from dataclasses import replace

import pytest

from amp_search import Infeasible, UsageError, estimate, load_spec, plan
from amp_search.search_space import (FEASIBILITY_RULES, Candidate, Reason, SearchSpace,
                                     enumerate_candidates, first_violation)
from conftest import ROOT

CPU_LOCAL = ROOT / "configs" / "cpu-local.yaml"


def cand(pp, dp, tmp, mbs=1, zero=0, ckpt=False):
    return Candidate(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero,
                     activation_checkpointing=ckpt)


def test_each_rule_names_its_reason():
    space = SearchSpace(num_devices=8, num_layers=6, global_batch_size=12,
                        tp_divisors=(4, 64), zero_stages=(0, 1, 2, 3), recompute=("none",))
    cases = {cand(8, 1, 1): Reason.PP_EXCEEDS_LAYERS,
             cand(1, 1, 8): Reason.TMP_DOES_NOT_DIVIDE_MODEL,
             cand(1, 8, 1): Reason.DP_DOES_NOT_DIVIDE_BATCH,
             cand(2, 2, 2, mbs=4): Reason.MBS_DOES_NOT_DIVIDE_BATCH,
             cand(2, 2, 2, zero=2): Reason.ZERO_WITH_PIPELINE}
    megatron = replace(space, backend="megatron")
    v = first_violation(megatron, cand(2, 2, 2, zero=2))
    assert v is not None and v.reason == Reason.ZERO_UNDER_MEGATRON, v
    for c, reason in cases.items():
        v = first_violation(space, c)
        assert v is not None and v.reason == reason, (c, v)
        assert isinstance(v.error(), Infeasible) and v.error().reason == reason.value
    assert first_violation(space, cand(2, 2, 2, mbs=3, zero=1)) is None
    assert len(FEASIBILITY_RULES) == 20     # 4 on virtual stages (test_interleaved), 3 on cp,
    #                                         3 on experts (test_moe), 1 on experts under
    #                                         deepspeed (test_trial_moe), 1 on CPU offloading
    #                                         (test_cpu_offload)


def test_enumeration_counts_prunes_and_collapses_zero_without_dp():
    space = SearchSpace(num_devices=4, num_layers=6, global_batch_size=8, tp_divisors=(4,),
                        zero_stages=(0, 1, 2, 3), recompute=("none", "full"))
    pruned = Counter()
    cands = enumerate_candidates(space, pruned)
    assert all(first_violation(space, c) is None for c in cands)
    # at dp = 1 only the lowest searched ZeRO stage is a candidate
    assert {c.zero_stage for c in cands if c.dp == 1} == {0}
    assert pruned[Reason.ZERO_WITHOUT_DATA_PARALLEL.value] > 0
    assert pruned[Reason.ZERO_WITH_PIPELINE.value] > 0
    # every point of the grid is either a candidate or counted once
    grid = 0
    for pp, dp, tmp in [(1, 1, 4), (2, 1, 2), (4, 1, 1), (1, 2, 2), (2, 2, 1), (1, 4, 1)]:
        grid += len([m for m in (1, 2, 4, 8) if (8 // dp) % m == 0]) * 8
    assert len(cands) + sum(pruned.values()) == grid
    # a spec that asks for one ZeRO stage keeps it at dp = 1
    only2 = SearchSpace(num_devices=2, num_layers=6, global_batch_size=8, tp_divisors=(4,),
                        zero_stages=(2,), recompute=("none",))
    assert {c.zero_stage for c in enumerate_candidates(only2, Counter())} == {2}


def test_estimate_applies_the_same_rules():
    spec = load_spec(CPU_LOCAL)
    with pytest.raises(Infeasible, match="zero_2_3_with_pipeline"):
        estimate(spec, pp=2, dp=1, tmp=1, mbs=1, zero_stage=3)
    with pytest.raises(Infeasible, match="mbs_does_not_divide_batch"):
        estimate(spec, pp=1, dp=2, tmp=1, mbs=16)
    with pytest.raises(UsageError, match="product must equal 2"):
        estimate(spec, pp=2, dp=2, tmp=1, mbs=1)
    # an equivalent point is a valid strategy: estimate accepts it
    assert estimate(spec, pp=1, dp=1, tmp=2, mbs=1, zero_stage=3).iteration_time_s > 0


def test_cli_estimate_infeasible_is_one_line(capsys):
    from amp_search.cli import main
    rc = main(["estimate", str(CPU_LOCAL), "--pp", "2", "--dp", "1", "--tmp", "1", "--mbs",
               "1", "--zero-stage", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "zero_2_3_with_pipeline" in err[0]


def test_ranking_holds_distinct_layouts_and_breaks_ties_by_memory():
    """configs/cpu-local.yaml searches ZeRO 0-3 and recomputation: the top 8 (what
    `launch --top-k 8` runs) are eight different (pp, dp, tmp, mbs) plans."""
    spec = load_spec(CPU_LOCAL)
    result = plan(spec)
    layouts = [(e.strategy.pp, e.strategy.dp, e.strategy.tmp, e.strategy.mbs)
               for e in result.strategies]
    assert len(layouts) == len(set(layouts)) >= 8
    assert result.pruned[Reason.SLOWER_KNOBS_SAME_LAYOUT.value] > 0
    assert result.pruned[Reason.ZERO_WITHOUT_DATA_PARALLEL.value] > 0
    from amp_search.planner import ranking_key
    keys = [ranking_key(e) for e in result.strategies]
    assert keys == sorted(keys)


def test_megatron_baseline_obeys_the_rules():
    spec = load_spec(ROOT / "configs" / "a100-gpt7b.yaml")
    base = plan(spec).baseline
    s = base.strategy
    assert first_violation(SearchSpace.of(spec), cand(s.pp, s.dp, s.tmp, s.mbs, s.zero_stage,
                                                      s.activation_checkpointing)) is None
    assert s.tmp <= spec.cluster.min_gpus_per_node


def test_a_search_too_large_is_refused_up_front(write_spec, capsys):
    """10,240 GPUs and a 10,000-layer model: the estimated cost is stated and the search is
    refused with what to change, in well under a second (no DP runs)."""
    from amp_search.cli import main
    from amp_search.planner import SearchTooLarge
    from amp_search.search_space import search_cost
    path = write_spec({
        "cluster": {"nodes": [{"gpu": "A100-80GB", "count": 1280, "gpus_per_node": 8,
                               "intra_node_bandwidth": "300 GB/s",
                               "inter_node_bandwidth": "200 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 10000, "hidden_size": 4096,
                  "num_attention_heads": 32, "seq_length": 2048, "vocab_size": 50304},
        "training": {"global_batch_size": 4096, "precision": "bf16",
                     "activation_checkpointing": "search", "zero_stage": "search"}})
    spec = load_spec(path)
    space = SearchSpace.of(spec)
    cost = search_cost(space, enumerate_candidates(space, Counter()), 1)
    assert cost.estimated_s > 1000 and cost.layers == 10002
    with pytest.raises(SearchTooLarge, match="fix training.zero_stage"):
        plan(spec, max_search_s=120)
    assert main(["plan", str(path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--max-search-seconds" in err[0]
    # what a small search will cost is known too, and it runs
    small = load_spec(CPU_LOCAL)
    seen = []
    plan(small, max_search_s=120, on_start=seen.append)
    assert seen and seen[0].estimated_s < 120 and seen[0].candidates > 0


def _enumerate_one_by_one(space: SearchSpace, pruned: Counter) -> list[Candidate]:
    """The enumeration as it was written first: every rule on every point, in order."""
    from amp_search.search_space import (EQUIVALENCE_RULES, LAYOUT_RULES,
                                         degrees_within_search_limits, divisors,
                                         first_violation, mbs_within_search_limits)

    knobs = len(space.zero_stages) * len(space.recompute) * len(space.sequence_parallel) \
        * len(space.virtual_stages) * len(space.expert_parallel)
    out = []
    for cp in space.context_parallel:
        if space.num_devices % cp:
            continue
        for tmp in divisors(space.num_devices // cp):
            for pp in divisors(space.num_devices // cp // tmp):
                dp = space.num_devices // (cp * tmp * pp)
                probe = Candidate.make(pp=pp, dp=dp, tmp=tmp, mbs=1, cp=cp,
                                       zero_stage=space.zero_stages[0],
                                       recompute=space.recompute[0])
                v = first_violation(space, probe, LAYOUT_RULES + (degrees_within_search_limits,))
                if v is not None:
                    pruned[v.reason.value] += knobs
                    continue
                for mbs in divisors(space.global_batch_size // dp):
                    for z in space.zero_stages:
                        for ck in space.recompute:
                            for sp in space.sequence_parallel:
                                for vs in space.virtual_stages:
                                    for ep in space.expert_parallel:
                                        c = Candidate.make(pp=pp, dp=dp, tmp=tmp, mbs=mbs,
                                                           zero_stage=z, recompute=ck,
                                                           sequence_parallel=sp,
                                                           virtual_stages=vs, cp=cp, ep=ep)
                                        v = first_violation(
                                            space, c, FEASIBILITY_RULES[len(LAYOUT_RULES):]
                                            + EQUIVALENCE_RULES + (mbs_within_search_limits,))
                                        if v is not None:
                                            pruned[v.reason.value] += 1
                                        else:
                                            out.append(c)
    return out


@pytest.mark.parametrize("backend", ["deepspeed", "megatron"])
def test_the_enumeration_checks_each_rule_once_per_loop_it_reads_with_the_same_result(backend):
    """enumerate_candidates checks the rules that read no inner loop once for all of it: the
    same candidates, in the same order, and the same prune counts under the same (first
    broken) rule as every rule on every point, on a mixture-of-experts model with every knob
    searched (ZeRO, recomputation, sequence parallelism, virtual stages, cp, ep)."""
    from amp_search.search_space import enumerate_candidates
    from amp_search.spec import parse_spec

    spec = parse_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 4, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "8 x 400 Gbps"}]},
        "model": {"preset": "gpt", "num_layers": 12, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 2048, "vocab_size": 32000,
                  "num_experts": 16, "moe_router_topk": 2, "moe_ffn_hidden_size": 1024},
        "training": {"global_batch_size": 64, "backend": backend,
                     # DeepSpeed's trials train experts in fp32 only
                     "precision": "fp32" if backend == "deepspeed" else "bf16",
                     "zero_stage": "search", "activation_checkpointing": "search",
                     "sequence_parallel": "search", "virtual_pipeline_stages": "search",
                     "context_parallel": "search", "expert_parallel": "search"}})
    space = SearchSpace.of(spec, backend)
    assert len(space.virtual_stages) > 1 and len(space.expert_parallel) > 1
    fast, slow = Counter(), Counter()
    got, want = enumerate_candidates(space, fast), _enumerate_one_by_one(space, slow)
    assert got == want and fast == slow and len(fast) >= 5
    # built by search_space._with, not Candidate's __init__: the same fields, hashes and types
    assert [(hash(c), repr(c), type(c)) for c in got] == \
        [(hash(c), repr(c), type(c)) for c in want]
