"""The spec's `search:` section: the tp, pp, dp and mbs the planner may try, as NeMo's
auto-configurator users limit them (a list, one pinned value, or a maximum)."""
from __future__ import annotations

import pytest

from amp_search.errors import SpecError
from amp_search.planner import estimate, plan
from amp_search.spec import parse_spec


def _spec(search=None):
    d = {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                                "intra_node_bandwidth": "450 GB/s",
                                "inter_node_bandwidth": "8 x 400 Gbps"}]},
         "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 4096},
         "training": {"global_batch_size": 32, "precision": "bf16"}}
    if search is not None:
        d["search"] = search
    return parse_spec(d)


def test_limits_restrict_the_plan_and_are_counted():
    free = plan(_spec(), simulate_top=0)
    assert {e.strategy.tmp for e in free.strategies} > {2, 4}
    limited = plan(_spec({"tp": [2, 4], "pp": {"max": 2}, "micro_batch_sizes": 1}),
                   simulate_top=0)
    assert {e.strategy.tmp for e in limited.strategies} <= {2, 4}
    assert max(e.strategy.pp for e in limited.strategies) <= 2
    assert {e.strategy.mbs for e in limited.strategies} == {1}
    assert limited.pruned["outside_search_limits"] > 0
    # the strategies it keeps cost what they cost without limits
    by_label = {e.strategy.label(): e.iteration_time_s for e in free.strategies}
    for e in limited.strategies:
        if e.strategy.label() in by_label:
            assert e.iteration_time_s == by_label[e.strategy.label()]
    # estimate costs any strategy, limited or not
    assert estimate(_spec({"tp": 2}), pp=1, dp=2, tmp=8, mbs=1).iteration_time_s > 0


@pytest.mark.parametrize("search, key", [
    ({"tp": 0}, "search.tp"), ({"pp": "many"}, "search.pp"), ({"dp": {"most": 2}}, "search.dp"),
    ({"tp": 2, "tensor_parallel_sizes": [2]}, "search.tensor_parallel_sizes"),
    ({"ep": 2}, "search"), ({"mbs": [1, True]}, "search.mbs"), ([1, 2], "search"),
])
def test_bad_limits_name_the_key(search, key):
    with pytest.raises(SpecError) as err:
        _spec(search)
    assert str(err.value).startswith(key), str(err.value)
    assert "\n" not in str(err.value)
