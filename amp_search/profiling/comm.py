"""Measure the links: all-reduce, all-gather, reduce-scatter and point-to-point over
torch.distributed for a sweep of message and group sizes, inside a node ('intra') and across
nodes ('inter'), and fit a model per (collective, link) (see `store.LinkFit`):

    alpha-beta  t = steps(n) * alpha + bus(n) * S / B                 (non-negative LS, numpy)
    sigmoid     t = steps(n) * alpha + bus(n) * S / (B * eff(S)),     (Lin et al. 2024: the
                eff(S) = floor + (1 - floor) / (1 + exp(-k (log2 S - x0)))   S-shaped mid region)

Both are fitted on relative error; `time_s` uses the sigmoid only where it is clearly better.

The sweep itself (`sweep`) runs in every rank of an initialized process group (gloo on CPU,
NCCL on GPU); `profile_comm` launches it with torchrun (`python -m torch.distributed.run`)
and fits what rank 0 wrote:
- launcher 'local': one node, `--standalone`, nproc processes;
- launcher 'torchrun': one node of a multi-node run (nnodes, node_rank, master_addr/port);
  run the same command on every node; node 0 writes the profile.
Groups: 'intra' = the first g ranks of node 0; 'inter' = local rank 0 of the first g nodes
(so one process per node, as a data-parallel or pipeline link sees it).
"""
from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from cost_models.comm import COLLECTIVES, bus_factor, latency_steps, sigmoid_efficiency

from ..errors import UsageError
from .store import (CommProfile, CommSample, LinkFit, hostname, installed_versions, now_iso,
                    worker_env)

LAUNCHERS = ("local", "torchrun")
DEFAULT_SIZES = tuple(int(round(2 ** (k / 2))) // 4 * 4 for k in range(20, 53))
"""Message bytes: 1 KiB to 64 MiB in half-octave steps (multiples of 4 bytes)."""
SIGMOID_GAIN = 0.8
"""The sigmoid model is used when its mean relative error is below this fraction of the
alpha-beta model's (it has three more parameters)."""


# ----------------------------------------------------------------------------- the sweep

def _sync(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


def _op(collective: str, buf, out, group, peer: int, me_first: bool):
    import torch.distributed as dist

    if collective == "all_reduce":
        dist.all_reduce(buf, group=group)
    elif collective == "all_gather":
        dist.all_gather_into_tensor(out, buf, group=group)
    elif collective == "reduce_scatter":
        dist.reduce_scatter_tensor(out, buf, group=group)
    elif collective == "p2p":  # one ping-pong = two messages
        if me_first:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
    else:
        raise ValueError(collective)


def _buffers(collective: str, nbytes: int, n: int, device: str):
    """(input, output) tensors for one message of `nbytes` (see CommProfile.time_s for which
    buffer the size counts)."""
    import torch

    elems = max(n, nbytes // 4 // n * n)  # fp32, divisible by the group size
    if collective == "all_gather":
        return torch.ones(elems // n, device=device), torch.empty(elems, device=device)
    if collective == "reduce_scatter":
        return torch.ones(elems, device=device), torch.empty(elems // n, device=device)
    return torch.ones(elems, device=device), None


def _timed(collective, buf, out, group, peer, me_first, device) -> float:
    """Seconds of one operation started together on all ranks of the group (after a
    barrier), as a training step issues it between computations. (Back-to-back batches of
    operations are not representative: on a CPU with as many processes as cores, gloo's
    queued operations contend for the cores and take several times longer.)"""
    import torch.distributed as dist

    dist.barrier(group=group)
    _sync(device)
    t0 = time.perf_counter()
    _op(collective, buf, out, group, peer, me_first)
    _sync(device)
    return time.perf_counter() - t0


def sweep(*, sizes=DEFAULT_SIZES, collectives=COLLECTIVES, group_sizes=None, warmup: int = 3,
          repeats: int = 30, device: str = "cpu", progress: bool = False) -> list[CommSample]:
    """Run in every rank of an initialized default process group; returns the samples on
    global rank 0 (an empty list elsewhere).

    Each sample is the mean (and median) over `repeats` single operations of the slowest
    rank's seconds (p2p: per one-way message, half a ping-pong). The repeats are taken in
    rounds over all message sizes, so a passing disturbance (another process, a frequency
    change) spreads over the sizes instead of spoiling one of them.

    The mean, not the median, is what the model fits: what a training step pays is the sum
    of many operations, i.e. their expectation. On a virtual machine the distribution can be
    bimodal (a waiting process whose virtual CPU went idle wakes up milliseconds late); the
    median would hide that cost and the mean keeps it."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    hosts = [None] * world
    dist.all_gather_object(hosts, hostname())
    node_of, nodes = {}, []
    for r, h in enumerate(hosts):
        if h not in node_of:
            node_of[h] = len(nodes)
            nodes.append([])
        nodes[node_of[h]].append(r)  # nodes[i] = global ranks on node i
    plans = []  # (link, ranks)
    for g in sorted(set(group_sizes or range(2, world + 1))):
        if g <= len(nodes[0]):
            plans.append(("intra", tuple(nodes[0][:g])))
        if g <= len(nodes):
            plans.append(("inter", tuple(nd[0] for nd in nodes[:g])))
    groups = [(link, ranks, dist.new_group(list(ranks))) for link, ranks in plans]
    work = [(link, ranks, group, coll) for link, ranks, group in groups for coll in collectives
            if not (coll == "p2p" and len(ranks) != 2)]
    samples: list[CommSample] = []
    bar = None
    if progress and rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=len(work) * (warmup + repeats), desc="profile-comm", unit="round")
    try:
        for link, ranks, group, coll in work:
            if rank in ranks:
                n = len(ranks)
                peer = ranks[1] if rank == ranks[0] else ranks[0]
                me_first = rank == ranks[0]
                per_msg = 2 if coll == "p2p" else 1  # a ping-pong carries two messages
                bufs = [_buffers(coll, nbytes, n, device) for nbytes in sizes]
                times = torch.zeros(repeats, len(sizes), dtype=torch.float64)
                for r in range(warmup + repeats):
                    for i, (buf, out) in enumerate(bufs):
                        t = _timed(coll, buf, out, group, peer, me_first, device) / per_msg
                        if r >= warmup:
                            times[r - warmup, i] = t
                    if bar is not None:
                        bar.set_postfix_str(f"{link} n{n} {coll}")
                        bar.update(1)
                del bufs
                times = times.to(device)
                dist.all_reduce(times, op=dist.ReduceOp.MAX, group=group)  # slowest rank
                times = times.cpu().numpy()
                if rank == 0:
                    for i, nbytes in enumerate(sizes):
                        col = times[:, i]
                        samples.append(CommSample(
                            collective=coll, link=link, group_size=n, message_bytes=int(nbytes),
                            time_s=float(col.mean()), std_s=float(col.std()),
                            median_s=float(np.median(col)), repeats=repeats))
            elif bar is not None:
                bar.update(warmup + repeats)
            dist.barrier()  # ranks outside the group wait here
    finally:
        if bar is not None:
            bar.close()
    return samples


# ----------------------------------------------------------------------------- fitting

def _design(collective: str, samples) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    steps = np.array([latency_steps(collective, s.group_size) for s in samples])
    volume = np.array([bus_factor(collective, s.group_size) * s.message_bytes
                       for s in samples])
    t = np.array([s.time_s for s in samples])
    return steps, volume, t


def fit_alpha_beta(collective: str, samples) -> tuple[float, float, float]:
    """(alpha_s, bandwidth_bytes_per_s, mean relative error): non-negative least squares of
    t = steps * alpha + volume / B on relative error (each row divided by its time)."""
    from scipy.optimize import nnls

    steps, volume, t = _design(collective, samples)
    a = np.stack([steps, volume], axis=1) / t[:, None]
    (alpha, beta), _ = nnls(a, np.ones_like(t))
    beta = max(beta, 1e-18)
    pred = steps * alpha + volume * beta
    return float(alpha), float(1.0 / beta), float(np.mean(np.abs(pred / t - 1.0)))


def fit_sigmoid(collective: str, samples, alpha0: float, bandwidth0: float) -> dict | None:
    """The three-region model (see module docstring) by least squares on relative error;
    None if it does not converge."""
    from scipy.optimize import least_squares

    steps, volume, t = _design(collective, samples)
    sizes = np.array([s.message_bytes for s in samples], dtype=float)
    lo, hi = math.log2(sizes.min()), math.log2(sizes.max())

    # parameters: log alpha, log B, logit floor, k, x0
    def unpack(p):
        return (math.exp(p[0]), math.exp(p[1]), 1.0 / (1.0 + math.exp(-p[2])), p[3], p[4])

    def residual(p):
        alpha, bw, floor, k, x0 = unpack(p)
        pred = steps * alpha + volume / (bw * sigmoid_efficiency(sizes, floor, k, x0))
        return pred / t - 1.0

    best = None
    for x0 in np.linspace(lo, hi, 5):
        p0 = [math.log(max(alpha0, 1e-7)), math.log(bandwidth0 * 1.5), 0.0, 1.0, x0]
        try:
            r = least_squares(residual, p0, bounds=([-30, math.log(bandwidth0) - 5, -8, 0.05, lo],
                                                    [5, math.log(bandwidth0) + 5, 8, 10, hi]))
        except ValueError:
            continue
        if best is None or r.cost < best.cost:
            best = r
    if best is None or not best.success:
        return None
    alpha, bw, floor, k, x0 = unpack(best.x)
    return {"alpha_s": alpha, "bandwidth_bytes_per_s": bw, "floor": floor, "k": float(k),
            "x0": float(x0), "mape": float(np.mean(np.abs(residual(best.x))))}


def fit_link(collective: str, link: str, samples) -> LinkFit:
    """Both models for one (collective, link) from its samples (any group sizes)."""
    samples = [s for s in samples if s.collective == collective and s.link == link]
    if len(samples) < 3:
        raise ValueError(f"{collective}/{link}: need >= 3 samples, got {len(samples)}")
    alpha, bw, mape_ab = fit_alpha_beta(collective, samples)
    sig = fit_sigmoid(collective, samples, alpha, bw)
    mape_sig = sig.pop("mape") if sig else float("nan")
    use_sig = sig is not None and mape_sig < SIGMOID_GAIN * mape_ab
    sizes = [s.message_bytes for s in samples]
    return LinkFit(collective=collective, link=link, alpha_s=alpha, bandwidth_bytes_per_s=bw,
                   model="sigmoid" if use_sig else "alpha-beta", sigmoid=sig,
                   mape_alpha_beta=mape_ab, mape_sigmoid=mape_sig,
                   group_sizes=tuple(sorted({s.group_size for s in samples})),
                   message_bytes_range=(float(min(sizes)), float(max(sizes))),
                   samples=len(samples))


def build_profile(samples, *, device: str, backend: str, world_size: int, nodes: int,
                  settings: dict | None = None) -> CommProfile:
    fits = {}
    for coll, link in sorted({(s.collective, s.link) for s in samples}):
        fits[(coll, link)] = fit_link(coll, link, samples)
    return CommProfile(device=device, backend=backend, world_size=world_size, nodes=nodes,
                       fits=fits, samples=list(samples), versions=installed_versions(),
                       created=now_iso(), host=hostname(), settings=dict(settings or {}))


# ----------------------------------------------------------------------------- the driver

def _first_error(stderr: str | None) -> str:
    """The exception line of a failed worker's output (torchrun wraps it in banners)."""
    import re

    for line in reversed((stderr or "").splitlines()):
        if re.match(r"^\s*(\[rank\d+\]:)?\s*[A-Za-z_.]*(Error|Exception|Interrupt)\b", line):
            return ": " + line.strip()
    return ""


def profile_comm(*, device_name: str, launcher: str = "local", nproc: int = 2,
                 nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                 master_port: int | None = None, device: str = "cpu", sizes=DEFAULT_SIZES,
                 collectives=COLLECTIVES, warmup: int = 3, repeats: int = 30,
                 out: Path | None = None, directory: Path | None = None,
                 progress: bool = False,
                 timeout_s: float = 1800.0, write: bool = True) -> CommProfile | None:
    """Launch the sweep with torchrun, fit it, write it to `out` or to
    `directory`/<device>__<backend>.json (the CLI: the link-profile folder of --profiles).

    Returns the profile on node 0 (None on the other nodes, which only take part)."""
    if launcher not in LAUNCHERS:
        raise UsageError(f"--launcher {launcher!r}; accepted: {', '.join(LAUNCHERS)}")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}; accepted: cpu, cuda")
    if nproc < 1 or nnodes < 1 or not 0 <= node_rank < nnodes:
        raise UsageError(f"need nproc >= 1, nnodes >= 1 and 0 <= node_rank < nnodes; got "
                         f"nproc={nproc}, nnodes={nnodes}, node_rank={node_rank}")
    if nproc * nnodes < 2:
        raise UsageError("a link sweep needs at least 2 processes (--nproc 2)")
    if launcher == "local" and nnodes != 1:
        raise UsageError("--launcher local runs one node; use --launcher torchrun for "
                         f"--nnodes {nnodes}")
    bad = [c for c in collectives if c not in COLLECTIVES]
    if bad:
        raise UsageError(f"unknown collective(s) {', '.join(bad)}; known: "
                         f"{', '.join(COLLECTIVES)}")
    if not sizes or min(sizes) < 4:
        raise UsageError("message sizes must be >= 4 bytes")
    backend = "nccl" if device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="amp-search-comm-") as tmp:
        raw = Path(tmp) / "samples.json"
        job = {"sizes": [int(s) for s in sizes], "collectives": list(collectives),
               "warmup": warmup, "repeats": repeats,
               "device": device, "backend": backend, "out": str(raw), "progress": progress}
        job_path = Path(tmp) / "job.json"
        job_path.write_text(json.dumps(job))
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}"]
        if launcher == "local":
            cmd += ["--standalone"]
        else:
            cmd += [f"--nnodes={nnodes}", f"--node_rank={node_rank}",
                    f"--master_addr={master_addr}",
                    f"--master_port={master_port or 29511}"]
        cmd += ["-m", "amp_search.profiling._comm_worker", str(job_path)]
        env = worker_env()
        env.setdefault("OMP_NUM_THREADS", "1")
        try:
            proc = subprocess.run(cmd, env=env, timeout=timeout_s,
                                  stdout=None if progress else subprocess.PIPE,
                                  stderr=None if progress else subprocess.PIPE, text=True)
        except subprocess.TimeoutExpired:
            raise UsageError(f"the link sweep did not finish in {timeout_s:.0f} s "
                             f"({' '.join(cmd)})") from None
        if proc.returncode != 0:
            raise UsageError(f"the link sweep failed (exit {proc.returncode}): "
                             f"{' '.join(cmd)}{_first_error(proc.stderr)}")
        if node_rank != 0:
            return None
        data = json.loads(raw.read_text())
    samples = [CommSample(**s) for s in data["samples"]]
    settings = {"launcher": launcher, "nproc_per_node": nproc, "warmup": warmup,
                "repeats": repeats, "device": device,
                "statistic": "mean (time_s) and median (median_s) over repeats of single "
                             "operations started after a barrier, each the slowest rank's "
                             "time; repeats taken in rounds over all sizes",
                "message_bytes": "all_reduce: buffer; all_gather: gathered output; "
                                 "reduce_scatter: input; p2p: one message"}
    profile = build_profile(samples, device=device_name, backend=backend,
                            world_size=int(data["world_size"]), nodes=int(data["nodes"]),
                            settings=settings)
    if write:
        if out is None and directory is None:
            raise UsageError("profile_comm: give `out` (a file) or `directory` to write to")
        profile.save(out or Path(directory) / profile.default_filename())
    return profile
