"""Quantities with units, converted to SI once at load (bytes, bytes/s).

Bandwidths: '170 Gbps', '10 Gb/s', '25 GB/s', '900 MB/s', '1.6 TB/s'.
Sizes: '16 GiB', '40 GB', '512 MiB', '1 TiB'.
A bare number is rejected, because '10' could be Gbps or GB/s (a factor of 8).
"""
from __future__ import annotations

import re

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
_NUMBER_UNIT = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z/]+)\s*$")


def _match_unit(text: str, units: dict, what: str, path: str) -> tuple[float, float]:
    accepted = ", ".join(units)
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise SpecError(path, f"expected a {what} string with a unit such as "
                              f"{_examples(units)}, got {type(text).__name__}")
    if isinstance(text, (int, float)):
        raise SpecError(path, f"a bare number ({text}) is ambiguous; write the unit, "
                              f"one of: {accepted}")
    m = _NUMBER_UNIT.match(text)
    if not m:
        raise SpecError(path, f"cannot read {text!r} as a {what}; write a number and a unit, "
                              f"one of: {accepted}")
    value, unit = float(m.group(1)), m.group(2)
    scale = units.get(unit)
    if scale is None and unit.lower().endswith("bps"):  # 'gbps', 'GBPS': bits, never bytes
        scale = units.get(unit[0].upper() + "bps")
    if scale is None:
        raise SpecError(path, f"unknown unit {unit!r} in {text!r}; accepted: {accepted}")
    return value, scale


def _examples(units: dict) -> str:
    return "'170 Gbps' or '25 GB/s'" if "Gbps" in units else "'16 GiB'"


def parse_bandwidth(text, path: str) -> float:
    """'170 Gbps' -> bytes per second. Gbps/Gb/s are bits; GB/s are bytes."""
    value, scale = _match_unit(text, BANDWIDTH_UNITS_BYTES_PER_S, "bandwidth", path)
    if value <= 0:
        raise SpecError(path, f"bandwidth must be positive, got {text!r}")
    return value * scale


def parse_size(text, path: str) -> int:
    """'16 GiB' -> bytes."""
    value, scale = _match_unit(text, SIZE_UNITS_BYTES, "size", path)
    if value < 0:
        raise SpecError(path, f"size must not be negative, got {text!r}")
    return int(round(value * scale))
