"""How busy the rest of the machine was while we measured something.

A timing on a shared machine (a laptop, a CI runner, a 2-vCPU VM, the host CPU of a GPU node)
is only as good as the machine was quiet: another process on the same cores slows a CPU trial
directly and a GPU trial through its host-side launch work. `OtherLoad` reads the whole
machine's busy CPU time from /proc/stat and subtracts this process's own CPU time and that of
the children it has waited for (the trial processes), which leaves what *other* programs used.
Profiling stores it in a profile's settings; a launch stores it per trial, so that a disturbed
measurement is flagged instead of silently trusted.
"""
from __future__ import annotations

import os
import time

BUSY_CORES = 0.5
"""More than this many cores of other work while measuring: the figure may be high."""


class OtherLoad:
    """How many cores other processes kept busy between construction and `others_cores()`
    (from /proc/stat minus the CPU time of this process and of the children it waited for
    meanwhile); None where /proc/stat is not available (not Linux) or the span was under
    0.5 s."""

    def __init__(self):
        self.start = self._sample()

    @staticmethod
    def _sample():
        try:
            with open("/proc/stat") as f:
                v = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        hz = os.sysconf("SC_CLK_TCK")
        busy = (sum(v[:8]) - v[3] - v[4]) / hz  # all but idle and iowait, in CPU seconds
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return busy, own, time.monotonic()

    def others_cores(self) -> float | None:
        end = self._sample()
        if self.start is None or end is None or end[2] - self.start[2] < 0.5:
            return None
        others = (end[0] - self.start[0]) - (end[1] - self.start[1])
        return round(max(0.0, others / (end[2] - self.start[2])), 2)


def busy_note(others_cores: float | None) -> str:
    """'' on a quiet machine; else a short note for a table's note column."""
    if others_cores is None or others_cores <= BUSY_CORES:
        return ""
    return f"machine busy: other processes used {others_cores:.1f} cores"
