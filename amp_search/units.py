"""Quantities with units, converted to SI once at load (bytes, bytes/s, seconds, FLOPs).

Bandwidths: '170 Gbps', '10 Gb/s', '25 GB/s', '900 MB/s', '1.6 TB/s'.
Sizes: '16 GiB', '40 GB', '512 MiB', '1 TiB'.
Durations: '450 us', '1.1 ms', '2 s'. Work: '2 GFLOP', '500 MFLOP'.
A bare number is rejected, because '10' could be Gbps or GB/s (a factor of 8).

Every value must be a finite number (so '1e999 GB/s', which float() reads as infinity, is
rejected) written in at most 64 characters, and, where the caller passes `bounds`, lie within
them; the message states the accepted range in units, e.g. "accepted: 1 Mbps to 100 TB/s".
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from .errors import SpecError

# bits or bytes per second, decimal prefixes (networking and vendor sheets use SI)
BANDWIDTH_UNITS_BYTES_PER_S = {
    "Kbps": 1e3 / 8, "Mbps": 1e6 / 8, "Gbps": 1e9 / 8, "Tbps": 1e12 / 8,
    "Kb/s": 1e3 / 8, "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Tb/s": 1e12 / 8,  # lower-case b: bits
    "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,                   # capital B: bytes
    "GiB/s": 2.0**30, "MiB/s": 2.0**20,
}
SIZE_UNITS_BYTES = {
    "B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
TIME_UNITS_S = {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}
FLOP_UNITS = {"FLOP": 1.0, "KFLOP": 1e3, "MFLOP": 1e6, "GFLOP": 1e9, "TFLOP": 1e12}
MAX_QUANTITY_CHARS = 64
"""Longest accepted quantity string; longer ones are rejected before any parsing."""
# unambiguous number (no nested optional digit runs, so no backtracking blow-up), then a unit
_NUMBER_UNIT = re.compile(r"^\s*((?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)"
                          r"\s*([A-Za-z/]+)\s*$")
_REL_TOL = 1e-9   # bounds are inclusive up to rounding ('0.001 Gbps' is 1 Mbps)


@dataclass(frozen=True)
class Bounds:
    """An inclusive accepted range in SI units, with the text a message shows for it."""

    lo: float
    hi: float
    text: str

    def check(self, value: float, shown, path: str) -> None:
        if not (self.lo * (1 - _REL_TOL) <= value <= self.hi * (1 + _REL_TOL)):
            raise SpecError(path, f"{shown} is out of range; accepted: {self.text}")


# the ranges the spec uses (generous: every shipped config and catalog entry is well inside)
NETWORK_BANDWIDTH = Bounds(1e6 / 8, 100e12, "1 Mbps to 100 TB/s")
MEMORY_BANDWIDTH = Bounds(1e9, 100e12, "1 GB/s to 100 TB/s")
DEVICE_MEMORY = Bounds(64 * 2**20, 64 * 2**40, "64 MiB to 64 TiB")
FIXED_COST_TIME = Bounds(0.0, 1.0, "0 s to 1 s")
GEMM_SIZE = Bounds(1.0, 1e15, "1 FLOP to 1000 TFLOP")
OVERHEAD_MEMORY = Bounds(0, 64 * 2**40, "0 B to 64 TiB")


def _shown(text) -> str:
    """A short one-line rendering of a user value for a message."""
    s = repr(text) if isinstance(text, str) else type(text).__name__
    return s if len(s) <= 40 else s[:37] + "..."


def _match_unit(text, units: dict, what: str, path: str) -> tuple[float, float]:
    accepted = ", ".join(units)
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise SpecError(path, f"expected a {what} string with a unit such as "
                              f"{_examples(units)}, got {type(text).__name__}")
    if isinstance(text, (int, float)):
        shown = f"{text:g}" if isinstance(text, float) else (
            str(text) if text.bit_length() < 64 else "a very large integer")
        raise SpecError(path, f"a bare number ({shown}) is ambiguous; write the unit, "
                              f"one of: {accepted}")
    m = _NUMBER_UNIT.match(text) if len(text) <= MAX_QUANTITY_CHARS else None
    if not m:
        raise SpecError(path, f"cannot read {_shown(text)} as a {what}; write a number and a "
                              f"unit (at most {MAX_QUANTITY_CHARS} characters), one of: "
                              f"{accepted}")
    value, unit = float(m.group(1)), m.group(2)
    scale = units.get(unit)
    if scale is None and unit.lower().endswith("bps"):  # 'gbps', 'GBPS': bits, never bytes
        scale = units.get(unit[0].upper() + "bps")
    if scale is None:
        raise SpecError(path, f"unknown unit {_shown(unit)} in {_shown(text)}; accepted: "
                              f"{accepted}")
    if not math.isfinite(value * scale):
        raise SpecError(path, f"{_shown(text)} is not a finite {what}")
    return value, scale


def _examples(units: dict) -> str:
    for unit, example in (("Gbps", "'170 Gbps' or '25 GB/s'"), ("us", "'450 us'"),
                          ("GFLOP", "'2 GFLOP'")):
        if unit in units:
            return example
    return "'16 GiB'"


def parse_bandwidth(text, path: str, bounds: Bounds | None = None) -> float:
    """'170 Gbps' -> bytes per second. Gbps/Gb/s are bits; GB/s are bytes.

    Finite and positive always; within `bounds` (e.g. NETWORK_BANDWIDTH) where given."""
    value, scale = _match_unit(text, BANDWIDTH_UNITS_BYTES_PER_S, "bandwidth", path)
    if value <= 0:
        raise SpecError(path, f"bandwidth must be positive, got {_shown(text)}"
                              + (f"; accepted: {bounds.text}" if bounds else ""))
    if bounds is not None:
        bounds.check(value * scale, _shown(text), path)
    return value * scale


_LINK_COUNT = re.compile(r"^\s*(\d{1,4})\s*[x\u00d7*]\s*(\S.*)$")
MAX_LINKS = 1024
"""The most links a node's bandwidth may be written as ('8 x 400 Gbps')."""


def _links_match(text):
    """The 'N x B' match of a node's network bandwidth ('8 x 400 Gbps'), or None."""
    return _LINK_COUNT.match(text) if isinstance(text, str) and \
        len(text) <= MAX_QUANTITY_CHARS else None


def link_count(text) -> int:
    """How many links a node's network bandwidth is written as: N of 'N x B' ('8 x 400
    Gbps'); 0 where it is written as the node's total."""
    m = _links_match(text)
    return int(m.group(1)) if m is not None else 0


def parse_node_bandwidth(text, path: str, bounds: Bounds | None = None) -> float:
    """A node's network bandwidth: '3200 Gbps', or as its NICs are sold, 'N x B' ('8 x 400
    Gbps', also '8x400Gbps' or with '*'): N links of B each, N x B in all. Within `bounds`."""
    m = _links_match(text)
    if m is None:
        return parse_bandwidth(text, path, bounds)
    count = int(m.group(1))
    if not 1 <= count <= MAX_LINKS:
        raise SpecError(path, f"{_shown(text)}: the link count must be from 1 to {MAX_LINKS}")
    total = count * parse_bandwidth(m.group(2), path)
    if bounds is not None:
        bounds.check(total, _shown(text), path)
    return total


def parse_size(text, path: str, bounds: Bounds | None = None) -> int:
    """'16 GiB' -> bytes.

    Finite and not negative always; within `bounds` (e.g. DEVICE_MEMORY) where given."""
    value, scale = _match_unit(text, SIZE_UNITS_BYTES, "size", path)
    if value < 0:
        raise SpecError(path, f"size must not be negative, got {_shown(text)}")
    if bounds is not None:
        bounds.check(value * scale, _shown(text), path)
    return int(round(value * scale))


def parse_duration(text, path: str, bounds: Bounds | None = None) -> float:
    """'450 us' -> seconds. Finite and not negative; within `bounds` where given."""
    value, scale = _match_unit(text, TIME_UNITS_S, "duration", path)
    if value < 0:
        raise SpecError(path, f"a duration must not be negative, got {_shown(text)}")
    if bounds is not None:
        bounds.check(value * scale, _shown(text), path)
    return value * scale


def parse_flops(text, path: str, bounds: Bounds | None = None) -> float:
    """'2 GFLOP' -> floating-point operations. Finite and positive; within `bounds`."""
    value, scale = _match_unit(text, FLOP_UNITS, "number of FLOPs", path)
    if value <= 0:
        raise SpecError(path, f"must be positive, got {_shown(text)}")
    if bounds is not None:
        bounds.check(value * scale, _shown(text), path)
    return value * scale
