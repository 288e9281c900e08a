"""Argument types shared by the sub-commands: each rejects a bad value with one line."""
from __future__ import annotations

import argparse
import math


def _integer(text: str, lo: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if v < lo:
        raise argparse.ArgumentTypeError(f"expected {what}, got {v}")
    return v


def positive_int(text: str) -> int:
    return _integer(text, 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _integer(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0 or math.isinf(v):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v
