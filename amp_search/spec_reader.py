"""Reading a YAML spec's values: one clear SpecError naming the key path and what is
accepted for every problem. Shared by amp_search.spec (cluster, training, the GPU catalog) and
amp_search.model_spec (the model section)."""
from __future__ import annotations

import math
import re
import reprlib

from .errors import SpecError

MAX_NAME_CHARS = 128

_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 60
_REPR.maxlevel = 2


def show_value(v) -> str:
    """A short, one-line rendering of any user value for a message."""
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > 200:
        return f"an integer of about {int(v.bit_length() * 0.30103)} digits"
    try:
        text = _REPR.repr(v)
    except Exception:   # noqa: BLE001 - a library caller's object with a broken __repr__
        text = f"<{type(v).__name__}>"
    return text if text.isprintable() else text.encode("unicode_escape").decode("ascii")


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,60}$")


def key_text(k) -> str:
    """A mapping key as it appears in a key path: as written if plain, else quoted."""
    return k if isinstance(k, str) and _PLAIN_KEY.match(k) else show_value(k)


def read_name(v, path: str, default: str, limit: int = MAX_NAME_CHARS) -> str:
    """A name (or other short text): a string or integer of 1 to `limit` printable characters."""
    if v is None:
        return default
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() <= 64:
        v = str(v)
    if not isinstance(v, str) or not 0 < len(v) <= limit or not v.isprintable():
        raise SpecError(path, f"expected text of 1 to {limit} printable characters, got "
                              f"{show_value(v) if isinstance(v, str) else type(v).__name__}")
    return v


def read_number(v, path: str, lo: float, hi: float, what: str) -> float:
    """A finite int or float in [lo, hi]."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise SpecError(path, f"expected a number ({what}), got {show_value(v)}; accepted: "
                              f"{lo:g} to {hi:,g}")
    if not (math.isfinite(v) if isinstance(v, float) else True) or not lo <= v <= hi:
        raise SpecError(path, f"{show_value(v)} is out of range; accepted: {lo:g} to {hi:,g} "
                              f"({what})")
    return float(v)


class MappingReader:
    """Typed access to a YAML mapping that reports the key path on every error and rejects
    unknown keys with the list of valid ones."""

    def __init__(self, data, path: str, allowed: tuple[str, ...]):
        if not isinstance(data, dict):
            raise SpecError(path or "<top>", f"expected a mapping with keys {', '.join(allowed)};"
                                             f" got {type(data).__name__}")
        unknown = [k for k in data if not isinstance(k, str) or k not in allowed]
        if unknown:
            where = f"{path}.{key_text(unknown[0])}" if path else key_text(unknown[0])
            raise SpecError(where, f"unknown key; valid keys here: {', '.join(allowed)}")
        self.data, self.path = data, path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def has(self, key: str) -> bool:
        return key in self.data and self.data[key] is not None

    def raw(self, key: str, default=None, required: bool = False):
        if key not in self.data or self.data[key] is None:
            if required:
                raise SpecError(self.at(key), "required key is missing")
            return default
        return self.data[key]

    def int(self, key: str, default=None, *, lo: int = 1, hi: int, required=False) -> int:
        v = self.raw(key, default, required)
        if isinstance(v, bool) or not isinstance(v, int):
            raise SpecError(self.at(key), f"expected an integer in [{lo}, {hi}], got {show_value(v)}")
        if not lo <= v <= hi:
            raise SpecError(self.at(key), f"{show_value(v)} is out of range; accepted: {lo} to {hi}")
        return v

    def number(self, key: str, default: float, *, lo: float, below: float) -> float:
        """A number in [lo, below)."""
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v < below:
            raise SpecError(self.at(key), f"got {show_value(v)}; expected a number from {lo:g} "
                                          f"up to (not including) {below:g}")
        return float(v)

    def flag(self, key: str, default: bool | None = False, *, default_means: str = ""
             ) -> bool | None:
        """A true/false key. With `default_means` (what the default is, for the message) the
        value `default` is accepted too, and it and an absent key read as None."""
        v = self.raw(key, "default" if default_means else default)
        if v is True or v is False:
            return v
        if default_means and v == "default":
            return None
        raise SpecError(self.at(key), f"got {show_value(v)}; accepted: true, false"
                        + (f", default ({default_means})" if default_means else ""))

    def choice(self, key: str, options: tuple, default=None):
        v = self.raw(key, default, default is None)
        if not isinstance(v, (str, int)) or isinstance(v, bool) or v not in options:
            raise SpecError(self.at(key), f"got {show_value(v)}; accepted: "
                                          f"{', '.join(map(str, options))}")
        return v
