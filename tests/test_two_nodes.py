"""Two nodes, for real, on one machine: a tiny pp=2 trial whose stages sit on two "nodes" of
one CPU device each, node 0 at 127.0.0.1 and node 1 at 127.0.0.2 (the whole 127.0.0.0/8 is
this machine: no ssh), each node one torchrun (node ranks 0 and 1, static rendezvous at node
0's agent):

(a) through the per-node scripts `amp-search export` writes, each script its own process;
(b) through `amp-search launch --launcher torchrun --hostfile` (one local torchrun per node):
    the database row, result.json, trial.json and commands.json show both nodes' ranks, and
    the live processes show torchrun node rank i running global rank i;
(c) one node's torchrun is killed (SIGKILL, by pid) mid-trial: the trial is recorded as
    failed with a reason, every process of both nodes is gone, and the next trial runs.

Loopback addresses only. About 80 s on a 2-core machine (five torchrun launches of 2 ranks).
"""
from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
pytest.importorskip("megatron.core")
psutil = pytest.importorskip("psutil")

from amp_search.cli import main  # noqa: E402
from amp_search.launch import LaunchOptions, TrialRequest, parse_hostfile, run_trials  # noqa: E402
from amp_search.records import Strategy  # noqa: E402
from amp_search.spec import load_spec  # noqa: E402
from conftest import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
HOSTS = ("127.0.0.1", "127.0.0.2")

TWO_NODE_SPEC = """
# two "nodes" of one CPU process each (OMP_NUM_THREADS=1), both on this machine
cluster:
  nodes:
    - gpu: CPU-local
      count: 2
      gpus_per_node: 1
      intra_node_bandwidth: 10 GB/s
      inter_node_bandwidth: 10 Gbps
model:
  preset: gpt
  num_layers: 4
  hidden_size: 256
  num_attention_heads: 4
  seq_length: 64
  vocab_size: 1024
training:
  global_batch_size: 8
  precision: fp32
  activation_checkpointing: none
"""
HOSTFILE = "".join(f"{h} slots=1\n" for h in HOSTS)
# stage 0 on device 0 (node 0), stage 1 on device 1 (node 1)
PP2 = {"pp": 2, "dp": 1, "tmp": 1, "mbs": 2, "partition": [0, 3, 6],
       "placement": [[[0]], [[1]]], "zero_stage": 0, "activation_checkpointing": False}
LAYER_NAMES = ["embedding", "block0", "block1", "block2", "block3", "head"]


def _env() -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                        os.environ.get("PYTHONPATH")])))
    # gloo binds to the address this machine's hostname resolves to; keep it on loopback
    if "lo" in {name for _, name in socket.if_nameindex()}:
        env["GLOO_SOCKET_IFNAME"] = "lo"
    return env


@pytest.fixture
def two_nodes(tmp_path):
    (tmp_path / "spec.yaml").write_text(TWO_NODE_SPEC)
    (tmp_path / "hostfile").write_text(HOSTFILE)
    return tmp_path


def _arg(argv, flag):
    return argv[argv.index(flag) + 1] if flag in argv else None


class _Workers:
    """Watches this process's descendants while a trial runs: for every trial process
    (amp_search.trial.run under torchrun), its launch rank (RANK), torchrun's node rank
    (GROUP_RANK) and the --node-rank of the torchrun that started it."""

    def __init__(self):
        self.seen: dict[int, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    def _run(self):
        me = psutil.Process()
        while not self._stop.wait(0.2):
            for p in me.children(recursive=True):
                if p.pid in self.seen:
                    continue
                try:
                    argv = p.cmdline()
                    if "amp_search.trial.run" not in argv or "torch.distributed.run" in argv:
                        continue
                    env = p.environ()
                    parent = p.parent().cmdline()
                except (psutil.Error, OSError):
                    continue
                if "RANK" not in env:
                    continue
                self.seen[p.pid] = {"rank": int(env["RANK"]),
                                    "group_rank": int(env.get("GROUP_RANK", -1)),
                                    "master_addr": env.get("MASTER_ADDR"),
                                    "torchrun_node_rank": _arg(parent, "--node-rank")}

    def by_rank(self) -> dict[int, dict]:
        return {w["rank"]: w for w in self.seen.values()}


def _check_result(result: dict, tag: str):
    assert result["status"] == "ok" and result["world_size"] == 2, (tag, result)
    # both ranks reported: one stage each, the planned layers
    assert result["rank_layers"] == [[0, 3], [3, 6]], tag
    assert result["stage_layers"] == [LAYER_NAMES[:3], LAYER_NAMES[3:]], tag
    assert len(result["peak_memory_bytes"]) == 2 and min(result["peak_memory_bytes"]) > 0
    assert result["mean_s"] > 0 and len(result["iteration_times_s"]) == 4
    # the record says where each rank ran: global rank i under node i's torchrun
    assert [(w["rank"], w["node_rank"]) for w in result["rank_nodes"]] == [(0, 0), (1, 1)], tag
    assert len({w["pid"] for w in result["rank_nodes"]}) == 2, tag


def _check_node_ranks(workers: _Workers, tag: str):
    """Global rank i ran under node i's torchrun (node rank i), rendezvous at node 0."""
    got = workers.by_rank()
    assert sorted(got) == [0, 1], (tag, workers.seen)
    for rank in (0, 1):
        assert got[rank]["group_rank"] == rank, (tag, got)
        assert got[rank]["torchrun_node_rank"] == str(rank), (tag, got)
        assert got[rank]["master_addr"] == HOSTS[0], (tag, got)


def _assert_gone(pids, what: str, deadline_s: float = 15.0):
    deadline = time.monotonic() + deadline_s
    while True:
        left = [pid for pid in pids if _alive(pid)]
        if not left:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} still running: {left}")
        time.sleep(0.2)


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


# ----------------------------------------------------------------------------- (a)

def test_exported_per_node_scripts_rendezvous(two_nodes):
    """`amp-search export --hostfile` of a two-node plan: launch-node0.sh and launch-node1.sh,
    started as two processes, train the trial together; rank 0 (node 0) writes result.json."""
    d, port = two_nodes, free_port()
    out = d / "export"
    assert main(["export", str(d / "spec.yaml"), "--format", "deepspeed", "--out", str(out),
                 "--pp", "2", "--dp", "1", "--tmp", "1", "--mbs", "2", "--partition",
                 "0,3,6", "--hostfile", str(d / "hostfile"), "--iters", "4", "--warmup",
                 "1", "--master-port", str(port)]) == 0
    trial = json.loads((out / "trial.json").read_text())
    assert [(r["rank"], r["node"], r["host"]) for r in trial["ranks"]] == \
        [(0, 0, HOSTS[0]), (1, 1, HOSTS[1])]
    scripts = sorted(out.glob("launch-node*.sh"))
    assert [s.name for s in scripts] == ["launch-node0.sh", "launch-node1.sh"]
    for i, s in enumerate(scripts):
        text = s.read_text()
        assert f"--node-rank {i}" in text and f"--master-addr {HOSTS[0]}" in text
        assert "ssh" not in text
    env = {**_env(), "PYTHON": sys.executable}
    procs, logs = [], []
    with _Workers() as workers:
        try:
            for i, s in enumerate(scripts):
                log = open(d / f"node{i}.log", "wb")
                logs.append(log)
                procs.append(subprocess.Popen([str(s)], cwd=d, env=env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL))
            codes = [p.wait(timeout=240) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            for log in logs:
                log.close()
    text = [(d / f"node{i}.log").read_text(errors="replace") for i in range(2)]
    assert codes == [0, 0], text
    result = json.loads((out / "result.json").read_text())
    _check_result(result, "export")
    assert "trial done" in text[0]  # global rank 0 ran on node 0 and wrote the result
    _check_node_ranks(workers, "export")
    print(f"\n(a) exported scripts, two nodes: {result['mean_s']:.4f} s/iteration "
          f"(iterations {[round(t, 4) for t in result['iteration_times_s']]})")


# ----------------------------------------------------------------------------- (b)

def test_launch_torchrun_over_two_loopback_nodes(two_nodes):
    """`amp-search launch --launcher torchrun --hostfile` with 127.0.0.1 and 127.0.0.2: one
    local torchrun per node (no ssh), the trial recorded ok with both nodes' ranks."""
    d, port = two_nodes, free_port()
    (d / "plan.json").write_text(json.dumps({"strategies": [{**PP2,
                                                             "iteration_time_s": 0.1}]}))
    argv = ["launch", str(d / "spec.yaml"), "--plan", str(d / "plan.json"), "--top-k", "1",
            "--launcher", "torchrun", "--hostfile", str(d / "hostfile"), "--master-port",
            str(port), "--iters", "4", "--warmup", "1", "--no-progress", "--no-speed-probe",
            "--trial-timeout", "240", "--json", str(d / "out.json")]
    saved = dict(os.environ)
    os.environ.update(_env())  # the CLI hands its own environment to the trials
    try:
        with _Workers() as workers:
            rc = main(argv)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    out = json.loads((d / "out.json").read_text())
    (t,) = out["trials"]
    assert rc == 0 and t["status"] == "ok", (t["error"], t["log_tail"])
    trial_dir = Path(t["trial_dir"])

    # the launch: one torchrun per node, both started here (no ssh), node i at HOSTS[i]
    commands = json.loads((trial_dir / "commands.json").read_text())["commands"]
    assert [c["host"] for c in commands] == list(HOSTS)
    for i, c in enumerate(commands):
        assert c["argv"][:3] == [sys.executable, "-m", "torch.distributed.run"], c["argv"]
        assert _arg(c["argv"], "--node-rank") == str(i)
        assert _arg(c["argv"], "--nnodes") == "2"
        assert _arg(c["argv"], "--nproc-per-node") == "1"
        assert _arg(c["argv"], "--master-addr") == HOSTS[0]
        assert _arg(c["argv"], "--master-port") == str(port)
    # where each global rank was planned: rank i on node i, host HOSTS[i]
    trial = json.loads((trial_dir / "trial.json").read_text())
    assert [(r["rank"], r["node"], r["host"]) for r in trial["ranks"]] == \
        [(0, 0, HOSTS[0]), (1, 1, HOSTS[1])]
    assert trial["launch_order"] == [0, 1]
    # ... and where it ran: torchrun node rank i started global rank i
    _check_node_ranks(workers, "launch")

    # the record: the database row holds the result of both ranks
    con = sqlite3.connect(d / "amp-search-results.sqlite")
    status, launcher, mean_s, result_json = con.execute(
        "SELECT status, launcher, measured_mean_s, result_json FROM results").fetchone()
    assert (status, launcher) == ("ok", "torchrun")
    result = json.loads(result_json)
    _check_result(result, "launch")
    assert mean_s == result["mean_s"] == t["measured_mean_s"]
    assert json.loads((trial_dir / "result.json").read_text())["rank_layers"] == \
        result["rank_layers"]
    print(f"\n(b) amp-search launch --launcher torchrun, two nodes: {mean_s:.4f} s/iteration "
          f"(wall {t['wall_s']:.1f} s)")


# ----------------------------------------------------------------------------- (c)

def test_killing_one_node_fails_the_trial_and_the_next_one_runs(two_nodes):
    """SIGKILL to node 1's torchrun while the trial trains: node 1's rank dies with its
    torchrun, node 0's rank loses its peer; the trial is recorded as failed with a reason,
    nothing of either node is left, and the next trial runs ok."""
    d, port = two_nodes, free_port()
    spec = load_spec(d / "spec.yaml")
    mk = lambda gbs, partition: Strategy.from_dict(  # noqa: E731
        {**PP2, "partition": partition, "global_batch_size": gbs})
    # 64 micro-batches per iteration (seconds each): the kill lands while it trains
    reqs = [TrialRequest(strategy=mk(128, [0, 3, 6])), TrialRequest(strategy=mk(8, [0, 2, 6]))]
    runs = d / "runs"
    killed: dict = {}

    def kill_node1_mid_trial():
        me = psutil.Process()
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            logs = sorted(runs.glob("01-*/log.txt"))
            if logs and "iteration 1/" in logs[0].read_text(errors="replace"):
                break
            time.sleep(0.1)
        else:
            return
        try:
            torchruns = {_arg(p.cmdline(), "--node-rank"): p for p in me.children()
                         if "torch.distributed.run" in p.cmdline()}
            killed["node0"] = [torchruns["0"].pid,
                               *(c.pid for c in torchruns["0"].children(recursive=True))]
            killed["node1"] = [torchruns["1"].pid,
                               *(c.pid for c in torchruns["1"].children(recursive=True))]
            killed["processes"] = {c.pid: " ".join(c.cmdline())[:120] for n in ("0", "1")
                                   for c in torchruns[n].children(recursive=True)}
        except (psutil.Error, KeyError) as exc:
            killed["error"] = repr(exc)
            return
        os.kill(torchruns["1"].pid, signal.SIGKILL)
        killed["at"] = time.monotonic()

    watcher = threading.Thread(target=kill_node1_mid_trial, daemon=True)
    watcher.start()
    recs = run_trials(spec, reqs, LaunchOptions(
        launcher="torchrun", hostfile=parse_hostfile(d / "hostfile"), iters=4, warmup=1,
        master_port=port, trial_timeout_s=240, base_env=_env(), runs_dir=runs))
    watcher.join()
    assert "at" in killed, killed
    assert len(killed["node0"]) == 2 and len(killed["node1"]) == 2, killed  # torchrun + rank
    first, second = recs
    # depends on amp_search/launch/process.py classifying a rank killed by a signal as
    # `failed` (with its reason), not `oom`: the reason is the kill, not memory
    assert first.status == "failed", (first.status, first.error, first.log_tail)
    assert first.error and first.measured_mean_s is None
    # every process of both nodes (torchrun agents and ranks) is gone
    _assert_gone(killed["node0"], "node 0's torchrun and rank")
    _assert_gone(killed["node1"], "node 1's torchrun and rank")
    # the next trial ran, on both nodes again
    assert second.status == "ok", (second.error, second.log_tail)
    assert second.measured_mean_s > 0
    con = sqlite3.connect(d / "amp-search-results.sqlite")
    rows = con.execute("SELECT status, error FROM results ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["failed", "ok"]  # failed: see the note above
    assert rows[0][1].startswith(first.error)
    result = json.loads(con.execute("SELECT result_json FROM results WHERE status = 'ok'")
                        .fetchone()[0])
    assert result["world_size"] == 2 and len(result["rank_layers"]) == 2
    print(f"\n(c) killed node 1's torchrun: {first.status}: {first.error} "
          f"(trial wall {first.wall_s:.1f} s); next trial {second.status}, "
          f"{second.measured_mean_s:.4f} s/iteration")
