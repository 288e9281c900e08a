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


@pytest.mark.parametrize("backend, p2p, part, gathers", [
    ("deepspeed", "whole", 4, (1, 2)), ("megatron", "whole", 1, (0, 0)),
    ("megatron", "split", 4, (1, 1))])
def test_the_cut_charges_what_each_framework_sends(backend, p2p, part, gathers):
    """pp 2 x tmp 4 over two nodes: the cut between the stages is two P2Ps of the rank's
    part (1/4 under DeepSpeed and under Megatron-LM with training.pipeline_p2p split, the
    whole tensor under megatron-core) plus the all-gathers that rebuild it: under DeepSpeed
    one on the receiving stage's tensor group and two on the sending stage's, under split
    Megatron-LM one on each (the receiver its input, the sender the gradient it gets)."""
    d = _spec(backend)
    d["training"]["pipeline_p2p"] = p2p
    spec = parse_spec(d)
    model = CostModel(spec)
    c = Candidate.make(pp=2, dp=1, tmp=4, mbs=1, zero_stage=0, recompute="none")
    layout = model.layout(c, placement=np.arange(8).reshape(2, 1, 4))
    costs = model.stage_costs(c, layout)
    bw, crosses = layout.p2p_links
    lat = model.link_latencies_s("p2p", crosses, layout, boundaries=True)
    a = 5                                           # stage 1 starts at layer 5
    expected = comm.stage_boundary_time_s(model.out_bytes[a - 1] / part, bw[0], lat[0])
    gather = model.boundary_gather_s(c, layout)
    receiver, sender = gathers
    expected += receiver * gather[1, a - 1] + sender * gather[0, a - 1]
    assert gather[0, a - 1] > 0
    assert costs.cut_s[1, a] == pytest.approx(expected)
    if p2p == "split":          # 10 Gb/s between the nodes: a quarter of it is cheaper
        whole = CostModel(parse_spec(_spec(backend))).stage_costs(c, layout)
        assert costs.cut_s[1, a] < whole.cut_s[1, a]


@pytest.mark.parametrize("tmp, sp, shards, gathers", [
    (1, False, 1, (0, 0)), (4, False, 4, (1, 1)), (4, True, 4, (0, 0))])
def test_megatron_scatter_gather(tmp, sp, shards, gathers):
    """Megatron-LM before megatron-core (--scatter-gather-tensors-in-pipeline): each tensor
    rank sends 1/t and the receiver all-gathers it; with sequence parallelism nothing
    changes (the shard is already 1/t)."""
    kw = dict(framework="megatron", sequence_parallel=sp, scatter_gather=True)
    assert comm.boundary_shards(tmp, **kw) == shards
    assert comm.boundary_gathers(tmp, **kw) == gathers


def test_pipeline_p2p_is_checked():
    from amp_search import SpecError
    d = _spec("megatron")
    d["training"]["pipeline_p2p"] = "scatter"
    with pytest.raises(SpecError, match=r"training\.pipeline_p2p.*whole, split"):
        parse_spec(d)
