"""Launcher command lines (argv lists), rank placement on hosts and devices, and the
Megatron-LM arguments of a strategy."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from cost_models.layers import Layer
from amp_search.errors import UsageError
from amp_search.launch.launchers import LaunchContext, build_launch, trial_nodes
from amp_search.launch.megatron import (megatron_args, megatron_nodes, parse_megatron_log,
                                        pipeline_layout, split_args)
from amp_search.records import Strategy
from amp_search.trial.ranks import assign_ranks

CFG = Path("/runs/t1/trial.json")


def _layers(n_blocks: int = 8):
    e = Layer(kind="embedding", seq_length=128, hidden_size=64, vocab_size=512, name="emb")
    b = [Layer(kind="transformer", seq_length=128, hidden_size=64, num_attention_heads=4,
               ffn_hidden_size=256, name=f"block{i}") for i in range(n_blocks)]
    h = Layer(kind="head", seq_length=128, hidden_size=64, vocab_size=512, name="head")
    return (e, *b, h)


def _hetero(device="cuda"):
    """pp2 x dp2 x tmp1 on two 4-GPU nodes; stage 0 on node 1 devices (6, 4), stage 1 on node
    0 devices (1, 2)."""
    s = Strategy(pp=2, dp=2, tmp=1, mbs=1, global_batch_size=8, partition=(0, 4, 10),
                 placement=(((6,), (4,)), ((1,), (2,))))
    ranks = assign_ranks(s, {d: (d // 4, d % 4) for d in range(8)},
                         {0: "gpu-a", 1: "gpu-b"})
    ctx = LaunchContext(python="/venv/bin/python", workdir=Path("/runs/t1"), device=device,
                        master_port=29600, node_slots={0: 4, 1: 4})
    return s, ranks, ctx


def _env_flags(argv):
    return [a for a in argv if isinstance(a, str)]


def test_every_command_is_an_argv_list():
    _, ranks, ctx = _hetero()
    for launcher in ("deepspeed", "torchrun", "slurm"):
        launch = build_launch(launcher, ranks, ctx, CFG)
        for c in launch.commands:
            assert isinstance(c.argv, tuple) and all(isinstance(a, str) for a in c.argv)


def test_local_launcher_single_node():
    s = Strategy(pp=2, dp=1, tmp=2, mbs=1, global_batch_size=4, partition=(0, 4, 10),
                 placement=(((3, 1),), ((0, 2),)))
    ranks = assign_ranks(s, {d: (0, d) for d in range(4)}, {0: "localhost"})
    ctx = LaunchContext(python="py", workdir=Path("/w"), device="cuda")
    (c,) = build_launch("local", ranks, ctx, CFG).commands
    assert c.argv[:4] == ("py", "-m", "torch.distributed.run", "--standalone")
    assert c.argv[c.argv.index("--nproc-per-node") + 1] == "4"
    assert c.argv[-4:] == ("--module", "amp_search.trial.run", "--config", str(CFG))
    assert c.env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}


def test_local_launcher_refuses_multi_node_gpus():
    _, ranks, ctx = _hetero()
    with pytest.raises(UsageError, match="local launcher runs on this machine only"):
        build_launch("local", ranks, ctx, CFG)


def test_deepspeed_launcher_hostfile_include_and_master():
    _, ranks, ctx = _hetero()
    launch = build_launch("deepspeed", ranks, ctx, CFG)
    (c,) = launch.commands
    argv = c.argv
    assert argv[:3] == ("/venv/bin/python", "-m", "deepspeed.launcher.runner")
    # nodes in hostfile (spec) order; devices ascending; rank 0 (device 6) lives on gpu-b
    assert argv[argv.index("--include") + 1] == "gpu-a:1,2@gpu-b:0,2"
    assert argv[argv.index("--master_addr") + 1] == "gpu-b"
    assert launch.files[Path("/runs/t1/hostfile")] == "gpu-a slots=4\ngpu-b slots=4\n"


def test_torchrun_per_node_over_ssh_is_quoted():
    _, ranks, ctx = _hetero()
    cmds = build_launch("torchrun", ranks, ctx, CFG).commands
    assert [c.host for c in cmds] == ["gpu-a", "gpu-b"]
    for i, c in enumerate(cmds):
        assert c.argv[:4] == ("ssh", "-o", "BatchMode=yes", c.host)
        assert c.argv[4] == "--"
        remote = shlex.split(c.argv[5])
        assert remote[:3] == ["cd", "/runs/t1", "&&"]
        assert f"CUDA_VISIBLE_DEVICES={['1,2', '0,2'][i]}" in remote
        assert remote[remote.index("--node-rank") + 1] == str(i)
        assert remote[remote.index("--master-addr") + 1] == "gpu-a"  # node-rank 0's agent


def test_torchrun_local_host_runs_without_ssh():
    s = Strategy(pp=1, dp=2, tmp=1, mbs=1, global_batch_size=2, partition=(0, 10),
                 placement=(((0,), (1,)),))
    ranks = assign_ranks(s, {0: (0, 0), 1: (0, 1)}, {0: "localhost"})
    ctx = LaunchContext(python="py", workdir=Path("/w"), device="cpu")
    (c,) = build_launch("torchrun", ranks, ctx, CFG).commands
    assert c.argv[0] == "py" and "--nnodes" in c.argv


def test_slurm_hostfile_has_one_line_per_launch_rank():
    _, ranks, ctx = _hetero()
    launch = build_launch("slurm", ranks, ctx, CFG)
    (c,) = launch.commands
    assert c.argv[0] == "srun" and "--distribution=arbitrary" in c.argv
    assert c.argv[c.argv.index("--ntasks") + 1] == "4"
    assert c.argv[-4:] == ("-m", "amp_search.trial.run", "--config", str(CFG))
    assert launch.files[Path("/runs/t1/slurm_hostfile")] == "gpu-a\ngpu-a\ngpu-b\ngpu-b\n"
    assert c.env["MASTER_ADDR"] == "gpu-b" and c.env["SLURM_HOSTFILE"].endswith("slurm_hostfile")


def test_trial_nodes_cover_every_rank_once():
    _, ranks, _ = _hetero()
    nodes = trial_nodes(ranks)
    assert [(n.host, n.devices) for n in nodes] == [("gpu-a", (1, 2)), ("gpu-b", (0, 2))]


# ----------------------------------------------------------------------------- Megatron

def _arg(args, flag):
    return args[args.index(flag) + 1]


def test_megatron_sizes_batches_and_options():
    layers = _layers(8)
    s = Strategy(pp=2, dp=2, tmp=2, mbs=2, global_batch_size=32, partition=(0, 5, 10),
                 placement=(((0, 1), (2, 3)), ((4, 5), (6, 7))), zero_stage=1,
                 activation_checkpointing=True)
    args = megatron_args(layers, s, precision="bf16", iters=40)
    assert _arg(args, "--tensor-model-parallel-size") == "2"
    assert _arg(args, "--pipeline-model-parallel-size") == "2"
    assert _arg(args, "--num-layers") == "8"
    assert _arg(args, "--micro-batch-size") == "2"
    assert _arg(args, "--global-batch-size") == "32"
    assert _arg(args, "--vocab-size") == "512"
    assert _arg(args, "--recompute-granularity") == "full"
    assert "--use-distributed-optimizer" in args and "--bf16" in args
    assert "--pipeline-model-parallel-layout" not in args  # 4 + 4 blocks: even
    assert "--decoder-first-pipeline-num-layers" not in args


def test_megatron_uneven_first_last():
    layers = _layers(8)  # chain: emb, 8 blocks, head (10 layers)
    # pp=2: emb + 2 blocks | 6 blocks + head
    assert split_args(layers, (0, 3, 10)) == ["--decoder-first-pipeline-num-layers", "2",
                                              "--decoder-last-pipeline-num-layers", "6"]
    # pp=4: 1 | 3 | 3 | 1 -> middle uniform
    assert split_args(layers, (0, 2, 5, 8, 10)) == [
        "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "1"]


def test_megatron_layout_for_irregular_split():
    layers = _layers(8)
    parts = (0, 3, 4, 7, 10)  # E t t | t | t t t | t t L  -> middle 1 and 3 differ
    assert split_args(layers, parts) == ["--pipeline-model-parallel-layout",
                                         "Et*2|t|t*3|t*2L"]
    assert pipeline_layout(layers, (0, 1, 10)) == "E|t*8L"
    # a stage holding only the embedding cannot be said with first/last counts
    assert split_args(layers, (0, 1, 10))[0] == "--pipeline-model-parallel-layout"


def test_megatron_rejects_non_gpt_chains():
    layers = (*_layers(2)[:-1], Layer(kind="mlp", seq_length=128, hidden_size=64,
                                      ffn_hidden_size=256), _layers(2)[-1])
    s = Strategy(pp=1, dp=1, tmp=1, mbs=1, global_batch_size=1, partition=(0, 5),
                 placement=(((0,),),))
    with pytest.raises(UsageError, match="megatron backend runs GPT"):
        megatron_args(layers, s, precision="fp32", iters=4)


def test_megatron_nodes_permute_devices_and_need_contiguous_ranks():
    _, ranks, _ = _hetero()
    # ranks 0,1 on gpu-b (devices 2, 0), ranks 2,3 on gpu-a (devices 1, 2)
    nodes = megatron_nodes(ranks)
    assert [(n.host, n.devices) for n in nodes] == [("gpu-b", (2, 0)), ("gpu-a", (1, 2))]
    s = Strategy(pp=2, dp=2, tmp=1, mbs=1, global_batch_size=8, partition=(0, 4, 10),
                 placement=(((0,), (4,)), ((1,), (5,))))  # ranks 0,2 on node 0; 1,3 on node 1
    bad = assign_ranks(s, {d: (d // 4, d % 4) for d in range(8)}, {0: "a", 1: "b"})
    with pytest.raises(UsageError, match="not one contiguous"):
        megatron_nodes(bad)


def test_parse_megatron_log():
    lines = [f" [2025-01-01 00:00:0{i}] iteration        {i}/       4 | consumed samples: "
             f"{8 * i} | elapsed time per iteration (ms): {100 + 10 * i:.1f} | learning rate: "
             f"1.0E-04 | global batch size:     8 | lm loss: {7 - i * 0.1:.6E} |"
             for i in range(1, 5)]
    lines.insert(1, "[Rank 0] (after 1 iterations) memory (MB) | allocated: 900.5 | "
                    "max allocated: 1024.0 | reserved: 1100.0 | max reserved: 1100.0")
    res = parse_megatron_log("\n".join(lines), warmup=2)
    assert res["iteration_times_s"] == pytest.approx([0.11, 0.12, 0.13, 0.14])
    assert res["mean_s"] == pytest.approx(0.135)
    assert res["losses"][0] == pytest.approx(6.9)
    assert res["peak_memory_bytes"] == [1024 * 2**20]


def test_remote_processes_get_the_trial_environment():
    _, ranks, ctx = _hetero()
    from dataclasses import replace

    ctx = replace(ctx, trial_env={"OMP_NUM_THREADS": "1", "PYTHONPATH": "/src dir"})
    ssh = build_launch("torchrun", ranks, ctx, CFG).commands[0]
    remote = shlex.split(ssh.argv[-1])
    assert "OMP_NUM_THREADS=1" in remote and "PYTHONPATH=/src dir" in remote
    ds = build_launch("deepspeed", ranks, ctx, CFG)
    assert ds.files[Path("/runs/t1/.deepspeed_env")] == "OMP_NUM_THREADS=1\nPYTHONPATH=/src dir\n"
    assert "--no_ssh_check" not in ds.commands[0].argv  # remote hosts: keep the ssh check


def _two_loopback_nodes(hosts=("127.0.0.1", "127.0.0.2"), device="cpu"):
    s = Strategy(pp=2, dp=1, tmp=1, mbs=1, global_batch_size=2, partition=(0, 5, 10),
                 placement=(((0,),), ((1,),)))
    ranks = assign_ranks(s, {0: (0, 0), 1: (1, 0)}, dict(enumerate(hosts)))
    ctx = LaunchContext(python="py", workdir=Path("/w"), device=device, master_port=29600,
                        trial_env={"OMP_NUM_THREADS": "1"}, node_slots={0: 1, 1: 1})
    return ranks, ctx


@pytest.mark.parametrize("hosts", [("127.0.0.1", "127.0.0.2"), ("localhost", "127.9.8.7"),
                                   ("::1", "::ffff:127.0.0.3"), ("LOCALHOST", "127.0.0.1")])
def test_torchrun_loopback_nodes_start_here_without_ssh(hosts):
    """Every loopback address is this machine: two nodes at 127.0.0.1 and 127.0.0.2 are two
    local torchruns (node ranks 0 and 1, rendezvous at node 0), no ssh."""
    ranks, ctx = _two_loopback_nodes(hosts)
    cmds = build_launch("torchrun", ranks, ctx, CFG).commands
    assert [c.host for c in cmds] == list(hosts)
    for i, c in enumerate(cmds):
        assert c.argv[:3] == ("py", "-m", "torch.distributed.run") and "ssh" not in c.argv
        assert c.argv[c.argv.index("--node-rank") + 1] == str(i)
        assert c.argv[c.argv.index("--nnodes") + 1] == "2"
        assert c.argv[c.argv.index("--master-addr") + 1] == hosts[0]
        assert c.env == {}   # local: the orchestrator's environment carries trial_env


@pytest.mark.parametrize("host", ["10.0.0.2", "vm", "localhost.example.org", "0.0.0.0",
                                  "::", "128.0.0.1", "fe80::1%eth0", "::ffff:10.0.0.1"])
def test_torchrun_non_loopback_node_goes_over_ssh(host):
    """Only the spelling decides (no lookup): a LAN address, a hostname (even this machine's),
    a name that merely starts with localhost, or the unspecified address go over ssh."""
    ranks, ctx = _two_loopback_nodes(("127.0.0.1", host))
    local, remote = build_launch("torchrun", ranks, ctx, CFG).commands
    assert local.argv[0] == "py"
    assert remote.argv[:4] == ("ssh", "-o", "BatchMode=yes", host)
    assert "OMP_NUM_THREADS=1" in shlex.split(remote.argv[-1])


def test_deepspeed_launcher_ssh_check_only_skipped_for_one_local_node():
    """The deepspeed runner reaches every node of a multi-node hostfile over pdsh/ssh, loopback
    ones too: the ssh check stays; one local node needs no ssh at all."""
    ranks, ctx = _two_loopback_nodes()
    (c,) = build_launch("deepspeed", ranks, ctx, CFG).commands
    assert "--no_ssh_check" not in c.argv
    assert c.argv[c.argv.index("--include") + 1] == "127.0.0.1:0@127.0.0.2:0"
    for host in ("localhost", "127.0.0.2", "::1"):
        s = Strategy(pp=1, dp=2, tmp=1, mbs=1, global_batch_size=2, partition=(0, 10),
                     placement=(((0,), (1,)),))
        one = assign_ranks(s, {0: (0, 0), 1: (0, 1)}, {0: host})
        (c,) = build_launch("deepspeed", one, ctx, CFG).commands
        assert "--no_ssh_check" in c.argv, host
