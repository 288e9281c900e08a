"""The command line: a thin shell over the library. Each sub-command lives in its own module
with `add_parser(subparsers)` registering it and a `run(args) -> int`."""
from __future__ import annotations

import argparse
import os
import sys

from ..errors import AmpSearchError

COMMAND_MODULES = ("plan", "launch", "results", "profile", "calibrate", "example",
                   "timeline", "export")


def version() -> str:
    """The installed package's version (importlib.metadata), or 'unknown' when the package
    runs from a folder that was never installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("amp-search")
    except PackageNotFoundError:
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    import importlib

    parser = argparse.ArgumentParser(
        prog="amp-search",
        description="Find the fastest 3D-parallel training strategy for a model on a cluster.")
    parser.add_argument("--version", action="version", version=f"amp-search {version()}",
                        help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
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
