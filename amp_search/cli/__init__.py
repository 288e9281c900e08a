"""The command line: a thin shell over the library. Each sub-command lives in its own module
with `add_parser(subparsers)` registering it and a `run(args) -> int`."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import AmpSearchError

COMMAND_MODULES = ("plan", "launch", "results", "profile", "calibrate", "example",
                   "timeline", "export")
COMMANDS_OF_OTHER_NAME = {"estimate": "plan", "profile-comm": "profile"}
"""Sub-commands that a module of another name registers (beside its own)."""


def version() -> str:
    """The installed package's version (importlib.metadata), or 'unknown' when the package
    runs from a folder that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("amp-search")
    except PackageNotFoundError:
        return "unknown (not installed)"


def command_module(word: str) -> str | None:
    """The module (of COMMAND_MODULES) that registers the sub-command `word`; None if none."""
    return word if word in COMMAND_MODULES else COMMANDS_OF_OTHER_NAME.get(word)


class _VersionAction(argparse.Action):
    """--version: looks the version up (importlib.metadata, ~25 ms) only when asked."""

    def __init__(self, option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                 help=None):
        super().__init__(option_strings=option_strings, dest=dest, default=default, nargs=0,
                         help=help)

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"amp-search {version()}")       # on stdout, as argparse's "version" action
        parser.exit()


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The amp-search parser with every sub-command, or with the command `only` alone (what
    `main` builds when the command line names one: registering the others would import their
    modules' dependencies, the launchers and the exporter, for nothing)."""
    import importlib

    parser = argparse.ArgumentParser(
        prog="amp-search",
        description="Find the fastest 3D-parallel training strategy for a model on a cluster.")
    parser.add_argument("--version", action=_VersionAction, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES if only is None else (only,):
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    words = sys.argv[1:] if argv is None else argv
    # `amp-search COMMAND ...`: only that command's parser (its help and errors are the
    # same); anything else (no command, --help, --version, a typo) gets all of them.
    parser = build_parser(command_module(words[0]) if words else None)
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except AmpSearchError as exc:
        print(f"amp-search: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:          # e.g. `amp-search plan ... --json - | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print("amp-search: interrupted", file=sys.stderr)
        return 130


QUICK_EXIT_COMMANDS = frozenset({"plan", "estimate", "export", "example", "timeline"})
"""Commands whose process `run` ends without tearing the interpreter down: they launch
nothing and hold nothing open at their end (their output written, their worker processes
joined), and tearing down numpy and the cost model's caches takes 30-50 ms, a tenth of a
16x16 plan."""


def run() -> None:
    """The console script and `python -m amp_search`: `main` on sys.argv, then exit with its
    status. After one of QUICK_EXIT_COMMANDS the streams are flushed and the exit handlers
    run (atexit: multiprocessing's, temporary folders' finalizers, logging's), and the
    process ends there, as a forked worker does (os._exit); the others exit as usual.

    Those commands run numpy's BLAS on one thread (OPENBLAS_NUM_THREADS, unless it is set):
    their arrays are small, and the threads OpenBLAS starts at numpy's import cost 0.08 s of
    CPU on the 2-core machine, CPU that the worker `plan --subsets` forks can use."""
    words = sys.argv[1:]
    if words and words[0] in QUICK_EXIT_COMMANDS:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")      # before numpy's import
    code = main()
    if not words or words[0] not in QUICK_EXIT_COMMANDS:
        sys.exit(code)
    import atexit

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:         # e.g. `amp-search plan ... | head`: nothing more to say
        pass
    atexit._run_exitfuncs()
    os._exit(code)
