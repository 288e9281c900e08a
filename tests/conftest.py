"""Shared fixtures: small specs written to tmp_path."""
from __future__ import annotations

import errno
import importlib.util
import itertools
import os
import socket
import sys
import time
import types
import zlib
from pathlib import Path
from typing import Callable

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _output_not_to_a_terminal(monkeypatch):
    """Every test reads the CLI's output as a pipe gets it, whatever terminal runs pytest:
    `plan` fits its table to COLUMNS where that is set (pytest-xdist's workers set it to
    80), which would cut the columns the tests read."""
    monkeypatch.delenv("COLUMNS", raising=False)


def load_benchmark(name: str):
    """The script benchmarks/NAME.py as a module, loaded once and registered under NAME (its
    dataclasses look their module up there)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def hetero_spec() -> dict:
    """AMP's heterogeneous cluster (3x4 V100 + 1x4 T4) with GPT-2 medium."""
    return yaml.safe_load((ROOT / "configs" / "amp-hetero-gpt2.yaml").read_text())


TINY_CPU_SPEC = """
cluster:
  nodes:
    - gpu: CPU-local
      count: 1
      gpus_per_node: 2
      intra_node_bandwidth: 2 GB/s
      inter_node_bandwidth: 10 Gbps
model:
  preset: gpt
  num_layers: 2
  hidden_size: 64
  num_attention_heads: 2
  seq_length: 32
  vocab_size: 256
training:
  global_batch_size: 4
  precision: fp32
  activation_checkpointing: none
  zero_stage: 0
  framework_overhead: 256 MiB
"""
"""A 2-block GPT on one node of 2 CPU-local devices."""


def h100_megatron_spec(model: dict, **training) -> dict:
    """A spec dict of one node of 8 H100 training `model` with Megatron-LM: global batch 64,
    bf16, the distributed optimizer; `training`: further or other training keys."""
    return {"cluster": {"nodes": [{"gpu": "H100-80GB", "count": 1, "gpus_per_node": 8,
                                   "intra_node_bandwidth": "450 GB/s",
                                   "inter_node_bandwidth": "400 Gbps"}]},
            "model": model,
            "training": {"global_batch_size": 64, "precision": "bf16", "backend": "megatron",
                         "zero_stage": 1, **training}}


def tiny_cpu_spec(tmp_path, text: str = TINY_CPU_SPEC):
    """`text` (default TINY_CPU_SPEC) written to tmp_path/spec.yaml and loaded."""
    from amp_search.spec import load_spec

    p = tmp_path / "spec.yaml"
    p.write_text(text)
    return load_spec(p)


def uniform_profile(spec, **fields):
    """A CPU-local fp32 layer profile of every layer of `spec` at tmp 1 and micro-batch 1, 2, 4
    (1 ms x mbs forward, 2 ms x mbs backward); `fields`: further LayerProfile arguments
    (framework_overheads, speed_probe)."""
    from amp_search.profiling.store import LayerProfile, ProfileEntry

    entries = [ProfileEntry(signature=x.signature, tmp=1, mbs=m, forward_s=1e-3 * m,
                            backward_s=2e-3 * m) for x in spec.model.layers for m in (1, 2, 4)]
    return LayerProfile(device="CPU-local", precision="fp32", entries=entries, **fields)


@pytest.fixture
def write_spec(tmp_path):
    def write(data: dict | str, name: str = "spec.yaml") -> Path:
        p = tmp_path / name
        p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
        return p
    return write


_PORT_BLOCK = 100
_port_calls = itertools.count()


def _port_band() -> tuple[int, int]:
    """[lo, hi): ports below the ephemeral range, which no connect() of this machine is
    given (the range above it where the ephemeral one starts too low)."""
    try:
        eph_lo, eph_hi = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range")
                             .read_text().split())
    except (OSError, ValueError):
        eph_lo, eph_hi = 32768, 60999
    if min(32000, eph_lo) - 20000 >= 10 * _PORT_BLOCK:
        return 20000, min(32000, eph_lo)
    return eph_hi + 1, 65536


def _bindable(port: int) -> bool:
    """Nothing holds `port` on any address, TIME_WAIT included (no SO_REUSEADDR here)."""
    bound = False
    for family, addr in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            with socket.socket(family) as s:
                s.bind((addr, port))
            bound = True
        except OSError as exc:  # no IPv6 here: the IPv4 bind decides
            if exc.errno == errno.EADDRINUSE:
                return False
    return bound


def free_port() -> int:
    """A rendezvous port for a trial a test launches. Not one the kernel hands out (bind to
    port 0): those come from the ephemeral range, which other xdist workers' gloo and
    torchrun connections draw from too, and one of them may take it in the seconds before
    torchrun binds it. Not a fixed one (29500): two runs on one machine would meet there.
    So: below the ephemeral range, in a block of 100 of this pytest session and xdist worker
    (gw<k>), the next one each call, and free now. A trial may reuse a port right after a
    killed one: torch's TCPStore binds with SO_REUSEADDR."""
    lo, hi = _port_band()
    session = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    block = (zlib.crc32(session.encode()) + (int(worker) if worker.isdigit() else 0)) \
        % ((hi - lo) // _PORT_BLOCK)
    for _ in range(hi - lo):
        port = lo + (block * _PORT_BLOCK + next(_port_calls)) % (hi - lo)
        if _bindable(port):
            return port
    raise RuntimeError(f"no free port in {lo}-{hi - 1}")


def time_module_with(**overrides) -> types.SimpleNamespace:
    """A stand-in for the time module (the real one, with `overrides`), to monkeypatch into
    one module of the library (`monkeypatch.setattr(module, "time", ...)`) so that a test's
    conditions depend on what happened, not on how fast a loaded machine did it; the global
    time module stays as it is."""
    proxy = types.SimpleNamespace(**{n: getattr(time, n) for n in dir(time)
                                     if not n.startswith("_")})
    for name, fn in overrides.items():
        setattr(proxy, name, fn)
    return proxy


def held_monotonic(released: Callable[[], bool], guard_s: float = 600.0):
    """A time.monotonic that stands still from its first call until `released()` is true
    (or `guard_s` has passed: a hang guard), then runs as the real one."""
    held: dict = {}

    def monotonic() -> float:
        now = time.monotonic()
        if "released" not in held:
            at = held.setdefault("at", now)
            if not released() and now - at < guard_s:
                return at
            held["released"] = True
        return now

    return monotonic
