"""The stage boundary as the frameworks send it: DeepSpeed's pipeline engine partitions the
activation and its gradient over the tensor group (1/tmp per rank) and rebuilds them with
all-gathers; Megatron-LM sends the whole tensor without sequence parallelism; with it both
send the s/t shard. The real bytes are checked on a trial in tests/test_launch_e2e.py."""
from __future__ import annotations

import numpy as np
import pytest

from amp_search.costing.cost_model import CostModel
from amp_search.search_space import Candidate
from amp_search.spec import parse_spec
from cost_models import comm


def _spec(backend: str) -> dict:
    return {"cluster": {"nodes": [{"gpu": "V100-16GB", "count": 2, "gpus_per_node": 4,
                                   "intra_node_bandwidth": "100 GB/s",
                                   "inter_node_bandwidth": "10 Gbps"}]},
            "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 1024,
                      "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 51200},
            "training": {"global_batch_size": 16, "precision": "fp16", "backend": backend}}


@pytest.mark.parametrize("tmp, framework, sp, shards, gathers", [
    (1, "deepspeed", False, 1, (0, 0)),
    (4, "deepspeed", False, 4, (1, 2)),
    (4, "deepspeed", True, 4, (0, 0)),
    (4, "megatron", False, 1, (0, 0)),
    (4, "megatron", True, 4, (0, 0)),
])
def test_shards_and_gathers(tmp, framework, sp, shards, gathers):
    assert comm.boundary_shards(tmp, framework=framework, sequence_parallel=sp) == shards
    assert comm.boundary_gathers(tmp, framework=framework, sequence_parallel=sp) == gathers


@pytest.mark.parametrize("backend", ["deepspeed", "megatron"])
def test_the_cut_charges_what_each_framework_sends(backend):
    """pp 2 x tmp 4 over two nodes: the cut between the stages is two P2Ps of the rank's
    part (1/4 under DeepSpeed, the whole tensor under Megatron-LM) plus, under DeepSpeed, one
    all-gather on the receiving stage's tensor group and two on the sending stage's."""
    spec = parse_spec(_spec(backend))
    model = CostModel(spec)
    c = Candidate.make(pp=2, dp=1, tmp=4, mbs=1, zero_stage=0, recompute="none")
    layout = model.layout(c, placement=np.arange(8).reshape(2, 1, 4))
    costs = model.stage_costs(c, layout)
    bw, crosses = layout.p2p_links
    lat = model.link_latencies_s("p2p", crosses, layout, boundaries=True)
    a = 5                                           # stage 1 starts at layer 5
    activation = model.out_bytes[a - 1]
    part = activation / (4 if backend == "deepspeed" else 1)
    expected = comm.stage_boundary_time_s(part, bw[0], lat[0])
    if backend == "deepspeed":
        gather = model.boundary_gather_s(c, layout)
        expected += gather[1, a - 1] + 2 * gather[0, a - 1]
        assert gather[0, a - 1] > 0
    assert costs.cut_s[1, a] == pytest.approx(expected)
