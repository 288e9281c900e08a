"""The three failure kinds stay apart (style.md, habit 5):

    AmpSearchError              anything the user can fix; the CLI prints one line, exits 2
     ├── SpecError              the spec (YAML) is wrong: names the key path and what is accepted
     └── UsageError             a command-line value or file is wrong (missing file, bad flag value)
          └── Infeasible        a given strategy breaks a rule of the search space
                                (amp_search.search_space); `reason` is the rule's prune key

Broken internal invariants are plain `assert`s / ValueErrors and do show a traceback.
"""
from __future__ import annotations


class AmpSearchError(Exception):
    """Base class of errors the user can fix."""


class SpecError(AmpSearchError):
    """A value in the spec is wrong. `path` is the dotted key path, e.g. cluster.nodes[0].gpu."""

    def __init__(self, path: str, message: str):
        self.path = path
        self.message = message
        super().__init__(f"{path}: {message}" if path else message)

    def __reduce__(self):       # pickled whole (a forked search sends it to its caller)
        return type(self), (self.path, self.message), self.__dict__


class UsageError(AmpSearchError):
    """A command-line argument or input file is wrong."""


class Infeasible(UsageError):
    """A given strategy cannot run; `reason` is the prune key of the rule it breaks (the
    search counts candidates under the same keys)."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)

    def __reduce__(self):
        return type(self), (self.reason, self.detail), self.__dict__
