"""The one front door for YAML files the user hands us (specs, the GPU catalog):

    path --read_bytes--> bytes --decode--> text --parse_yaml--> plain data (dict, list, scalars)

Every failure is the user's error, reported in one line that names the file: a UsageError when
the file cannot be read at all, else a SpecError (with the key path where there is one).
Limits, all checked while reading so that no input runs long or fills memory:

- size: at most MAX_BYTES (1 MiB) are read; a larger file (or /dev/zero) is rejected. A FIFO
  or pipe is opened without blocking (a FIFO with no writer reads as no data) and read for at
  most READ_TIMEOUT_S (10 s);
- encoding: UTF-8, UTF-8 with a byte-order mark, or UTF-16 (LE or BE) with a byte-order mark;
  anything else names the byte offset (and line) of the first byte that is not valid, and a NUL
  character (UTF-16 saved without a byte-order mark) is rejected too;
- YAML: one document of the safe subset (no Python tags), nested at most MAX_DEPTH (64) levels,
  with at most MAX_ALIASES (1,000) alias nodes and at most MAX_NODES (100,000) values after
  every alias is expanded (a billion-laughs document stops at once), no alias inside the node
  it names (a cycle), and no key twice in one mapping (the error names the key path and both
  lines). Merge keys (`<<: *base`) are allowed and may be overridden.
- any other exception of the parser (RecursionError, MemoryError, ValueError from an integer
  too long to convert or a date that does not exist, ...) is reported as the file's error too.
"""
from __future__ import annotations

import os
import re
import select
import stat
import time

import yaml
from yaml.composer import Composer
from yaml.constructor import ConstructorError, SafeConstructor
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.resolver import Resolver

from .errors import SpecError, UsageError

MAX_BYTES = 1 << 20
"""Largest file read (1 MiB); a spec is a few KiB."""
MAX_DEPTH = 64
"""Deepest nesting of lists and mappings, counting the levels an alias brings in."""
MAX_ALIASES = 1_000
"""Most alias nodes (*name) in one document."""
MAX_NODES = 100_000
"""Most values (scalars, lists, mappings) in a document, each alias counting as all the values
of the node it names."""
READ_TIMEOUT_S = 10.0
"""Longest wait for data from a pipe or FIFO."""

_BOMS = (  # longest first: the UTF-32 LE mark starts with the UTF-16 LE one
    (b"\xff\xfe\x00\x00", None, "UTF-32"), (b"\x00\x00\xfe\xff", None, "UTF-32"),
    (b"\xef\xbb\xbf", "utf-8", "UTF-8"),
    (b"\xff\xfe", "utf-16-le", "UTF-16 LE"), (b"\xfe\xff", "utf-16-be", "UTF-16 BE"),
)
_MERGE_TAG = "tag:yaml.org,2002:merge"


def show_path(path) -> str:
    """A file name for a one-line message (quoted if it holds odd characters)."""
    s = str(path)
    return s if s.isprintable() and len(s) <= 300 else repr(s)[:300]


def _short(text: str, limit: int = 60) -> str:
    text = text if text.isprintable() else repr(text)[1:-1]
    return text if len(text) <= limit else text[:limit - 3] + "..."


# ----------------------------------------------------------------------------- bytes

def read_bytes(path, *, what: str = "spec file", limit: int = MAX_BYTES) -> bytes:
    """At most `limit` bytes of the file at `path`; UsageError / SpecError if it cannot be
    read, is a directory, or is larger than `limit`."""
    shown = show_path(path)
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) |
                     getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise UsageError(f"{what} not found: {shown}") from None
    except (OSError, ValueError) as exc:       # ValueError: a NUL byte in the path
        raise UsageError(f"cannot read {what} {shown}: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise UsageError(f"cannot read {what} {shown}: it is a directory")
        data = _read_at_most(fd, limit + 1, what, shown)
    finally:
        os.close(fd)
    if not data and stat.S_ISFIFO(mode):
        raise UsageError(f"cannot read {what} {shown}: no data (a FIFO with no writer?)")
    if len(data) > limit:
        raise SpecError("", f"{shown}: the file is larger than {limit:,} bytes "
                            f"({limit / 2**20:g} MiB); accepted: up to {limit:,} bytes")
    return data


def _read_at_most(fd: int, n: int, what: str, shown: str) -> bytes:
    """Up to n bytes from fd (opened non-blocking), waiting at most READ_TIMEOUT_S in all."""
    chunks, total = [], 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    while total < n:
        try:
            chunk = os.read(fd, min(1 << 16, n - total))
        except BlockingIOError:                 # a pipe whose writer has not written yet
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise UsageError(f"cannot read {what} {shown}: no data after "
                                 f"{READ_TIMEOUT_S:g} s") from None
            continue
        except OSError as exc:
            raise UsageError(f"cannot read {what} {shown}: {exc.strerror or exc}") from None
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
        if time.monotonic() > deadline:
            raise UsageError(f"cannot read {what} {shown}: still reading after "
                             f"{READ_TIMEOUT_S:g} s")
    return b"".join(chunks)


# ----------------------------------------------------------------------------- text

def decode(data: bytes, shown: str) -> str:
    """UTF-8 (with or without a byte-order mark) or UTF-16 with a byte-order mark -> text.
    SpecError naming the byte offset (and line) of the first invalid byte otherwise."""
    encoding, skip, label = "utf-8", 0, "UTF-8"
    for bom, enc, name in _BOMS:
        if data.startswith(bom):
            if enc is None:
                raise SpecError("", f"{shown}: the file is {name}; accepted: UTF-8 (or UTF-16 "
                                    f"with a byte-order mark); save it as UTF-8")
            encoding, skip, label = enc, len(bom), name
            break
    try:
        text = data[skip:].decode(encoding)
    except UnicodeDecodeError as exc:
        offset = skip + exc.start
        bad = data[offset:offset + 1].hex().upper() or "end of file"
        line = _line_of(data, offset, encoding)
        hint = ("; it looks like UTF-16 without a byte-order mark" if label == "UTF-8" and
                b"\x00" in data[:4096] else "")
        raise SpecError("", f"{shown}: not valid {label} text: byte 0x{bad} at offset {offset} "
                            f"(line {line}){hint}; accepted: UTF-8, or UTF-16 with a "
                            f"byte-order mark; save the file as UTF-8") from None
    nul = text.find("\x00")
    if nul >= 0:
        offset = skip + len(text[:nul].encode(encoding))
        raise SpecError("", f"{shown}: a NUL character at byte offset {offset} (line "
                            f"{text.count(chr(10), 0, nul) + 1}); is it UTF-16 saved without a "
                            f"byte-order mark? accepted: UTF-8, or UTF-16 with a byte-order mark")
    return text


def _line_of(data: bytes, offset: int, encoding: str) -> int:
    newline = "\n".encode(encoding)
    if encoding.startswith("utf-16"):           # count whole code units only
        units = data[:offset]
        return sum(1 for i in range(2, len(units) - 1, 2) if units[i:i + 2] == newline) + 1
    return data.count(newline, 0, offset) + 1


# ----------------------------------------------------------------------------- YAML

class _LimitError(yaml.MarkedYAMLError):
    """One of this module's limits, raised where the parser stands."""


class _DuplicateKey(yaml.YAMLError):
    def __init__(self, key_path: str, first_line: int, second_line: int):
        super().__init__(key_path)
        self.key_path, self.first_line, self.second_line = key_path, first_line, second_line


try:                                # libyaml scans and parses ~10x faster than pure Python
    from yaml._yaml import CParser as _Parser
except ImportError:                 # pragma: no cover - PyYAML built without libyaml
    from yaml.reader import Reader
    from yaml.scanner import Scanner
    from yaml.parser import Parser

    class _Parser(Reader, Scanner, Parser):
        def __init__(self, stream):
            Reader.__init__(self, stream)
            Scanner.__init__(self)
            Parser.__init__(self)


class _BoundedComposer(Composer):
    """PyYAML's composer, with the limits of this module and key paths for duplicate keys."""

    def __init__(self):
        super().__init__()
        self._depth = 0
        self._heights: list[int] = []       # height so far of each node being composed
        self._values = 0                    # values so far, aliases expanded
        self._aliases = 0
        self._open: set[str] = set()        # anchors of the nodes being composed
        self._anchor_info: dict[str, tuple[int, int]] = {}   # anchor -> (values, height)
        self._path: list[str] = []

    def _limit(self, message: str, event) -> _LimitError:
        return _LimitError(None, None, message, event.start_mark)

    def _count(self, n: int, event) -> None:
        self._values += n
        if self._values > MAX_NODES:
            raise self._limit(f"the document holds more than {MAX_NODES:,} values once aliases "
                              f"are expanded; accepted: at most {MAX_NODES:,}", event)

    def _reach(self, height: int, event) -> None:
        """A child of the given height joins the node being composed."""
        if self._depth + height > MAX_DEPTH:
            raise self._limit(f"nested deeper than {MAX_DEPTH} levels (counting aliases "
                              f"expanded); accepted: at most {MAX_DEPTH}", event)
        if self._heights:
            self._heights[-1] = max(self._heights[-1], height + 1)

    def compose_node(self, parent, index):
        event = self.peek_event()
        self._path.append(_component(parent, index))
        try:
            if isinstance(event, AliasEvent):
                self._aliases += 1
                if self._aliases > MAX_ALIASES:
                    raise self._limit(f"more than {MAX_ALIASES:,} aliases; accepted: at most "
                                      f"{MAX_ALIASES:,}", event)
                if event.anchor in self._open:
                    raise self._limit(f"alias *{_short(str(event.anchor))} is inside the node "
                                      f"it names (a cycle); accepted: aliases to earlier, "
                                      f"complete nodes", event)
                info = self._anchor_info.get(event.anchor)
                if info is not None:
                    self._count(info[0], event)
                    self._reach(info[1], event)
                return super().compose_node(parent, index)   # undefined alias: its error
            self._reach(1, event)
            self._count(1, event)
            self._depth += 1
            self._heights.append(1)
            start = self._values - 1
            anchor = event.anchor
            if anchor is not None:
                self._open.add(anchor)
            try:
                node = super().compose_node(parent, index)
            finally:
                self._open.discard(anchor)
                height = self._heights.pop()
                self._depth -= 1
            if self._heights:
                self._heights[-1] = max(self._heights[-1], height + 1)
            if anchor is not None:
                self._anchor_info[anchor] = (self._values - start, height)
            if isinstance(node, MappingNode):
                self._check_duplicates(node)
            return node
        finally:
            self._path.pop()

    def _check_duplicates(self, node: MappingNode) -> None:
        seen: dict = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, ScalarNode):
                continue
            key = (key_node.tag, key_node.value)
            try:    # equal after construction ('1' and '0x1', 'yes' and 'true') is a duplicate
                constructed = self.construct_object(key_node, deep=True)
                hash(constructed)
                key = ("value", constructed)
            except Exception:   # noqa: BLE001 - an unusual key is compared as written
                pass
            if key in seen:
                raise _DuplicateKey(_join(self._path + [_key_text(key_node.value)]),
                                    seen[key] + 1, key_node.start_mark.line + 1)
            seen[key] = key_node.start_mark.line


_PLAIN_KEY = re.compile(r"^[A-Za-z0-9_-]{1,60}$")


def _key_text(value: str) -> str:
    """A key as it appears in a key path: as written if plain, else quoted."""
    return value if _PLAIN_KEY.match(value) else repr(_short(value))


def _component(parent, index) -> str:
    if isinstance(parent, SequenceNode):
        return f"[{index}]"
    if isinstance(parent, MappingNode):
        if isinstance(index, ScalarNode):
            return _key_text(index.value)
        return "<key>" if index is None else "<complex key>"
    return ""


def _join(parts: list[str]) -> str:
    out = ""
    for p in parts:
        if not p:
            continue
        out += p if p.startswith("[") or not out else f".{p}"
    return out


class _ReportingConstructor(SafeConstructor):
    """SafeConstructor whose value errors (an integer too long to convert, a date that does not
    exist) become YAML errors at the value's line."""

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep)
        except yaml.YAMLError:
            raise
        except (ValueError, TypeError, OverflowError) as exc:
            reason = str(exc).split(";")[0].splitlines()[0] if str(exc) else type(exc).__name__
            raise ConstructorError(None, None, f"cannot read this value: {_short(reason, 120)}",
                                   node.start_mark) from None


class BoundedSafeLoader(_Parser, _BoundedComposer, _ReportingConstructor, Resolver):
    """yaml.SafeLoader's subset with this module's limits (libyaml's parser where available,
    PyYAML's composer so that nesting, aliases and duplicate keys are checked as it goes)."""

    def __init__(self, stream):
        _Parser.__init__(self, stream)
        _BoundedComposer.__init__(self)
        _ReportingConstructor.__init__(self)
        Resolver.__init__(self)

    # the C parser defines its own composition; use the bounded Python one instead
    get_single_node = _BoundedComposer.get_single_node
    get_node = _BoundedComposer.get_node
    check_node = _BoundedComposer.check_node
    compose_document = _BoundedComposer.compose_document
    compose_node = _BoundedComposer.compose_node
    compose_scalar_node = _BoundedComposer.compose_scalar_node
    compose_sequence_node = _BoundedComposer.compose_sequence_node
    compose_mapping_node = _BoundedComposer.compose_mapping_node

    def get_single_data(self):
        node = self.get_single_node()
        return None if node is None else self.construct_document(node)


def parse_yaml(text: str, shown: str):
    """Text -> plain data, within the limits above. SpecError (one line) on any failure."""
    loader = BoundedSafeLoader(text)
    try:
        return loader.get_single_data()
    except _DuplicateKey as exc:
        raise SpecError(exc.key_path or "<top>", f"duplicate key in {shown}, at lines "
                                                 f"{exc.first_line} and {exc.second_line}; "
                                                 f"each key may appear once in a mapping") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        if "maximum nesting depth" in problem:
            # the parser's own depth limit (LibYAML, and PyYAML from 6.0.4) can fire before
            # ours: the user reads the same line whichever one does
            problem = (f"nested deeper than {MAX_DEPTH} levels (counting aliases expanded); "
                       f"accepted: at most {MAX_DEPTH}")
        raise SpecError("", f"{shown}: not valid YAML{where}: {_short(problem, 200)}") from None
    except RecursionError:
        raise SpecError("", f"{shown}: nested too deeply; accepted: at most {MAX_DEPTH} "
                            f"levels") from None
    except MemoryError:
        raise SpecError("", f"{shown}: the document does not fit in memory") from None
    except Exception as exc:    # noqa: BLE001 - any parser failure is the input's fault
        raise SpecError("", f"{shown}: cannot read the YAML: {type(exc).__name__}: "
                            f"{_short(str(exc).splitlines()[0] if str(exc) else '', 200)}"
                        ) from None
    finally:
        loader.dispose()


def load_yaml_file(path, *, what: str = "spec file"):
    """Read, decode and parse the YAML file at `path` (see the module docstring for limits)."""
    shown = show_path(path)
    return parse_yaml(decode(read_bytes(path, what=what), shown), shown)


def load_yaml_bytes(data: bytes, name: str = "<bytes>"):
    """The same checks for bytes already in memory (limited to MAX_BYTES as well)."""
    if len(data) > MAX_BYTES:
        raise SpecError("", f"{name}: larger than {MAX_BYTES:,} bytes; accepted: up to "
                            f"{MAX_BYTES:,} bytes")
    return parse_yaml(decode(data, name), name)


__all__ = ["MAX_BYTES", "MAX_DEPTH", "MAX_ALIASES", "MAX_NODES", "READ_TIMEOUT_S",
           "BoundedSafeLoader", "decode", "load_yaml_bytes", "load_yaml_file", "parse_yaml",
           "read_bytes", "show_path"]
