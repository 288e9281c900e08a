"""Global rank <-> (stage, replica, tensor) <-> device, against DeepSpeed's own topology."""
from __future__ import annotations

import itertools

import pytest

from cost_models.layers import Layer
from amp_search.records import Strategy
from amp_search.trial.config import TrialConfig, ds_config
from amp_search.trial.ranks import (assign_ranks, coords, global_rank, launch_order,
                                    node_devices)


@pytest.mark.parametrize("pp,dp,tmp", [(2, 2, 1), (4, 1, 1), (2, 1, 2), (2, 3, 2), (3, 2, 4)])
def test_global_rank_is_deepspeeds(pp, dp, tmp):
    topo_mod = pytest.importorskip("deepspeed.runtime.pipe.topology")
    topo = topo_mod.PipeModelDataParallelTopology(num_pp=pp, num_mp=tmp, num_dp=dp)
    for j, r, t in itertools.product(range(pp), range(dp), range(tmp)):
        g = global_rank(j, r, t, dp=dp, tmp=tmp)
        assert topo.get_rank(pipe=j, data=r, model=t) == g
        assert coords(g, dp=dp, tmp=tmp) == (j, r, t)


def _hetero():
    """pp2 x dp1 x tmp2 on two 4-device nodes, stage 0 on node 1 (devices 6, 5), stage 1
    on node 0 (devices 3, 0): an interleaved, reversed placement."""
    placement = (((6, 5),), ((3, 0),))
    s = Strategy(pp=2, dp=1, tmp=2, mbs=1, global_batch_size=4, partition=(0, 2, 4),
                 placement=placement)
    device_node = {d: (d // 4, d % 4) for d in range(8)}
    return s, assign_ranks(s, device_node, {0: "node-a", 1: "node-b"})


def test_assign_ranks_follow_placement():
    s, ranks = _hetero()
    assert [(a.rank, a.stage, a.tensor, a.device, a.host, a.local_device) for a in ranks] == [
        (0, 0, 0, 6, "node-b", 2), (1, 0, 1, 5, "node-b", 1),
        (2, 1, 0, 3, "node-a", 3), (3, 1, 1, 0, "node-a", 0)]


def test_launch_order_is_node_then_local_device():
    _, ranks = _hetero()
    # node-a (node 0) first: local devices 0 -> rank 3, 3 -> rank 2; then node-b: 1 -> 1, 2 -> 0
    assert launch_order(ranks) == (3, 2, 1, 0)
    assert node_devices(ranks, 0) == (0, 3)
    assert node_devices(ranks, 1) == (1, 2)


def test_trial_config_round_trip(tmp_path):
    s, ranks = _hetero()
    layers = (Layer(kind="embedding", seq_length=8, hidden_size=16, vocab_size=32, name="e"),
              Layer(kind="transformer", seq_length=8, hidden_size=16, num_attention_heads=2,
                    ffn_hidden_size=64, name="b0"),
              Layer(kind="mlp", seq_length=8, hidden_size=16, ffn_hidden_size=64,
                    input_hidden_size=8, name="m"),
              Layer(kind="head", seq_length=8, hidden_size=16, vocab_size=32, name="h"))
    cfg = TrialConfig(layers=layers, strategy=s, ranks=ranks, launch_order=launch_order(ranks),
                      precision="bf16", device="cuda", iters=5, warmup=1,
                      ds_config=ds_config(s, precision="bf16"), output=str(tmp_path / "r.json"))
    cfg.write(tmp_path / "t.json")
    back = TrialConfig.read(tmp_path / "t.json")
    assert back == cfg


def test_ds_config_batch_and_options():
    s = Strategy(pp=2, dp=2, tmp=1, mbs=2, global_batch_size=16, partition=(0, 3, 6),
                 placement=(((0,), (1,)), ((2,), (3,))), zero_stage=1)
    d = ds_config(s, precision="bf16")
    assert d["train_batch_size"] == 16
    assert d["train_micro_batch_size_per_gpu"] == 2
    assert d["gradient_accumulation_steps"] == 4
    assert d["zero_optimization"] == {"stage": 1}
    assert d["bf16"]["enabled"] and not d["fp16"]["enabled"]
    assert d["optimizer"]["params"]["torch_adam"] is True  # no 85 s fused-Adam build


def _cfg(device):
    s, ranks = _hetero()
    return TrialConfig(layers=(), strategy=s, ranks=ranks, launch_order=launch_order(ranks),
                       device=device)


@pytest.mark.parametrize("env,expect", [
    # torchrun on node-a: LOCAL_RANK 0/1 drive devices 0/3 = global ranks 3/2
    ({"RANK": "0", "CUDA_VISIBLE_DEVICES": "0,3"}, (3, 0)),
    ({"RANK": "1", "CUDA_VISIBLE_DEVICES": "0,3"}, (2, 1)),
    # node-b, launch ranks 2 and 3: devices 1 and 2 = global ranks 1 and 0
    ({"RANK": "2", "CUDA_VISIBLE_DEVICES": "1,2"}, (1, 0)),
    ({"RANK": "3", "CUDA_VISIBLE_DEVICES": "1,2"}, (0, 1)),
    # srun: every task sees the whole node and picks its planned device
    ({"SLURM_PROCID": "3"}, (0, 2)),
])
def test_process_finds_its_rank_and_device(env, expect):
    pytest.importorskip("torch")
    from amp_search.trial.run import resolve_rank

    assert resolve_rank(_cfg("cuda"), env) == expect


def test_process_refuses_a_device_it_cannot_see():
    pytest.importorskip("torch")
    from amp_search.trial.run import resolve_rank

    with pytest.raises(RuntimeError, match="planned device 2 is not in"):
        resolve_rank(_cfg("cuda"), {"RANK": "3", "CUDA_VISIBLE_DEVICES": "0,1"})
    assert resolve_rank(_cfg("cpu"), {"RANK": "3"}) == (0, 0)
