"""DeepSpeed's hostfile format: one `host slots=N` per line, `#` comments, blank lines.

    worker-0 slots=8      # node 0 of the spec
    worker-1 slots=16

Line i names node i of the spec (spec order), so a heterogeneous cluster's hostfile lists its
node groups in the order the spec does. `slots` is read as the whole number it is (Metis read
`slots=16` as 1 by taking one character); hostnames are validated (amp_search.hosts) before
they reach any launcher and always travel as argv elements.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import SpecError, UsageError
from ..hosts import validate_hostname

_LINE = re.compile(r"^(?P<host>\S+)\s+slots\s*=\s*(?P<slots>\S+)\s*$")
MAX_SLOTS = 1024


@dataclass(frozen=True, kw_only=True)
class HostSlots:
    """One hostfile line."""

    host: str
    slots: int
    """Devices (processes) the host offers."""

    def to_dict(self) -> dict:
        return asdict(self)


def parse_hostfile_text(text: str, source: str = "<hostfile>") -> tuple[HostSlots, ...]:
    """Parse hostfile text; raises UsageError naming the line on any problem."""
    out: list[HostSlots] = []
    seen: set[str] = set()
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        where = f"{source}:{n}"
        if not m:
            raise UsageError(f"{where}: expected 'HOST slots=N', got {raw.strip()!r}")
        try:
            validate_hostname(m["host"], where)
        except SpecError as exc:
            raise UsageError(str(exc)) from None
        slots_text = m["slots"]
        if not slots_text.isdigit() or not 1 <= int(slots_text) <= MAX_SLOTS:
            raise UsageError(f"{where}: slots must be a whole number from 1 to {MAX_SLOTS}, "
                             f"got {slots_text!r}")
        if m["host"] in seen:
            raise UsageError(f"{where}: host {m['host']!r} is listed twice")
        seen.add(m["host"])
        out.append(HostSlots(host=m["host"], slots=int(slots_text)))
    if not out:
        raise UsageError(f"{source}: no hosts; write one 'HOST slots=N' per line")
    return tuple(out)


def parse_hostfile(path: str | Path) -> tuple[HostSlots, ...]:
    """Read and parse a hostfile."""
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise UsageError(f"hostfile not found: {p}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read hostfile {p}: {exc}") from None
    return parse_hostfile_text(text, str(p))


def format_hostfile(hosts: tuple[HostSlots, ...]) -> str:
    """The hostfile text for `hosts` (what the deepspeed launcher is given)."""
    return "".join(f"{h.host} slots={h.slots}\n" for h in hosts)
