"""Shared by the sub-commands: argument types that reject a bad value with one line, and
JSON output to a file or standard output."""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ..errors import UsageError


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


def port(text: str) -> int:
    """A TCP port, 1 to 65535."""
    v = _integer(text, 1, "a TCP port (1 to 65535)")
    if v > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (1 to 65535), got {v}")
    return v


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


def output_file(text: str) -> Path:
    """An output file's argument: '-' (standard output) or a path whose folder exists,
    checked before any work is done, so that a long search is not lost to a typo in the
    folder at the end."""
    path = Path(text)
    if text == "-":
        return path
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: it is a folder")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text}: there is no folder "
                                         f"{path.parent}")
    return path


def write_json(path: Path, data) -> None:
    """Write `data` as JSON to `path`, or to standard output when `path` is '-'
    (`json_text`)."""
    text = json_text(data)
    if str(path) == "-":
        print(text)
        return
    try:
        path.write_text(text + "\n")
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def json_text(data, indent: str = "") -> str:
    """`data` as JSON, indented by two spaces a level, except that a list or an object
    holding no object (a placement's nested device ids, a stage's figures) is written on one
    line: what json.dumps(data, indent=2) holds, several times faster (json's C encoder
    writes those lines; with indent it writes nothing) and a placement of 2,048 devices on
    one line instead of 2,048."""
    if isinstance(data, dict):
        if not any(isinstance(v, _CONTAINERS) for v in data.values()):
            return _ENCODER.encode(data)
        if not all(type(k) is str for k in data):
            return json.dumps(data, indent=2)       # json's own key conversion
        inner = indent + "  "
        return "{\n" + ",\n".join(
            f"{inner}{_KEY(k)}: " + (json_text(v, inner) if isinstance(v, _CONTAINERS)
                                     else _ENCODER.encode(v))
            for k, v in data.items()) + f"\n{indent}}}"
    if isinstance(data, (list, tuple)) and any(isinstance(v, dict) for v in data):
        inner = indent + "  "
        return "[\n" + ",\n".join(inner + json_text(v, inner) for v in data) + f"\n{indent}]"
    return _ENCODER.encode(data)


_CONTAINERS = (dict, list, tuple)
_ENCODER = json.JSONEncoder()
"""json.dumps' defaults, without its per-call argument checks."""
_KEY = json.encoder.encode_basestring_ascii
"""A key as json.dumps writes it (ASCII, escaped)."""


# ----------------------------------------------------------------------------- strategies

def partition_arg(text: str):
    """--partition: optimal, uniform, or comma-separated layer boundaries."""
    if text in ("optimal", "uniform"):
        return text
    try:
        return tuple(int(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected optimal, uniform or comma-separated boundaries, got {text!r}") from None


STRATEGY_DEGREES = (("pp", "pipeline stages"), ("dp", "data-parallel replicas"),
                    ("tmp", "tensor-parallel degree"), ("mbs", "micro-batch size"))
DEGREE_FLAGS = {"tmp": ("--tmp", "--tp")}
"""The spellings each degree's flag accepts: --tp as Megatron-LM and NeMo users write it,
--tmp as AMP's paper and the tables do."""


def add_strategy_choice(parser: argparse.ArgumentParser, *, rank_help: str) -> None:
    """--rank N (the plan's N-th strategy) or --pp --dp --tmp --mbs (a given one), for the
    commands that act on one strategy (timeline, export); `chosen_strategy` in cli.plan
    reads them."""
    parser.add_argument("--rank", type=positive_int, metavar="N", help=rank_help)
    for name, what in STRATEGY_DEGREES:
        parser.add_argument(*DEGREE_FLAGS.get(name, (f"--{name}",)), dest=name,
                            type=positive_int, metavar="N",
                            help=f"{what} of a given strategy (with --pp --dp --tmp --mbs, "
                                 f"instead of --rank)")


def add_strategy_knobs(parser: argparse.ArgumentParser, *, zero_stages=(0, 1, 2, 3),
                       given: str = "", sequence_knobs: bool = False) -> None:
    """--partition, --zero-stage, --activation-checkpointing and --placement-order of a given
    strategy (estimate, timeline); `given` prefixes their help (e.g. 'with a given strategy: ').
    `sequence_knobs`: also --activation-checkpointing selective and --sequence-parallel /
    --no-sequence-parallel (Korthikanti et al. 2022), for commands that cost them."""
    parser.add_argument("--partition", default="optimal", type=partition_arg, metavar="HOW",
                        help=f"{given}optimal (exact DP), uniform (Megatron), or boundaries "
                             f"such as 0,13,26")
    parser.add_argument("--zero-stage", type=int, choices=zero_stages, default=None,
                        help=f"{given}DeepSpeed ZeRO stage (default: the spec's; its lowest "
                             f"if 'search')")
    modes = ("none", "selective", "full") if sequence_knobs else ("none", "full")
    parser.add_argument("--activation-checkpointing", choices=modes, default=None,
                        help=f"{given}full: recompute each block's forward in backward"
                             + ("; selective: only the attention core" if sequence_knobs
                                else "")
                             + " (default: the spec's; none if it says 'search')")
    if sequence_knobs:
        parser.add_argument("--sequence-parallel", action=argparse.BooleanOptionalAction,
                            default=None,
                            help=f"{given}sequence parallelism over the tensor group (tmp > 1; "
                                 f"default: the spec's; off if it says 'search')")
    if sequence_knobs:
        parser.add_argument("--cp", type=positive_int, default=None, metavar="C",
                            help=f"{given}context-parallel ranks per sequence (Megatron-LM's "
                                 f"ring attention, backend megatron; pp x dp x cp x tmp = the "
                                 f"cluster's GPUs; default 1)")
        parser.add_argument("--ep", type=positive_int, default=None, metavar="E",
                            help=f"{given}expert-parallel ranks (a model with experts, backend "
                                 f"megatron; groups of E consecutive ranks of a stage split the "
                                 f"experts; default: the spec's first training.expert_parallel "
                                 f"value)")
        parser.add_argument("--virtual-stages", type=positive_int, default=None, metavar="V",
                            help=f"{given}model chunks per pipeline stage: V > 1 runs "
                                 f"Megatron-LM's interleaved 1F1B (needs pp > 1 and the "
                                 f"micro-batch count a multiple of pp; default: the spec's "
                                 f"training.virtual_pipeline_stages, 1 if it says 'search')")
    parser.add_argument("--placement-order", choices=("listed", "fastest-first",
                                                      "slowest-first"), default=None,
                        help=f"{given}the node order ranks are placed over (default: the "
                             f"best of the three)")


# ----------------------------------------------------------------------------- measurements

def add_profiles_argument(parser: argparse.ArgumentParser, *, writes: bool = False) -> None:
    """--profiles DIR: the profiles root measurements are read from (or written to)."""
    what = "written to" if writes else "read from"
    parser.add_argument(
        "--profiles", type=Path, default=None, metavar="DIR",
        help=f"profiles folder measurements are {what}: layer profiles and calibrations in "
             f"DIR/measured, link profiles in DIR/comm (default: the folder the package "
             f"ships, `amp-search example --where` prints it)")


def profiles_root(args) -> Path:
    from ..resources import profiles_dir

    root = getattr(args, "profiles", None)
    return Path(root) if root is not None else profiles_dir()


def measurements_for(spec, args):
    """The measurements under --profiles (default: the shipped folder) for this spec."""
    from ..measurements import load_measurements

    return load_measurements(spec, profiles_root(args))


# ----------------------------------------------------------------------------- tables

def layers_per_stage(partition, max_chars: int | None = None) -> str:
    """Stage boundaries (0, 3, 8, ...) as layers per stage: '3/5/...'."""
    b = list(partition or [])
    text = "/".join(str(y - x) for x, y in zip(b, b[1:]))
    if max_chars is not None and len(text) > max_chars:
        text = text[:max_chars - 3] + "..."
    return text


def render_table(head: tuple[str, ...], rows: list[tuple[str, ...]],
                 left: tuple[int, ...] = ()) -> str:
    """Columns padded to their widest cell under a dashed rule; numbers right-aligned, the
    columns in `left` left-aligned."""
    lines = [head, *rows]
    widths = [max(len(r[i]) for r in lines) for i in range(len(head))]
    out = []
    for k, r in enumerate(lines):
        out.append("  ".join(c.ljust(w) if i in left else c.rjust(w)
                             for i, (c, w) in enumerate(zip(r, widths))).rstrip())
        if k == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def narrow_table(head: tuple[str, ...], rows: list[tuple[str, ...]], *, left_names=(),
                 drops=(), width: int | None = None, dropped: list | None = None
                 ) -> tuple[tuple[str, ...], list[tuple[str, ...]], str]:
    """`render_table` of head and rows (the columns named in `left_names` left-aligned),
    leaving out the columns `drops` names, in that order, until every line fits `width`
    (None: none left out); the names left out are appended to `dropped`. Returns the head
    and rows kept, and the table."""
    def render() -> str:
        return render_table(head, rows, left=tuple(i for i, h in enumerate(head)
                                                   if h in left_names))

    table = render()
    for name in drops:
        if width is None or max(map(len, table.splitlines())) <= width:
            break
        if name not in head:
            continue
        k = head.index(name)
        head, rows = head[:k] + head[k + 1:], [r[:k] + r[k + 1:] for r in rows]
        if dropped is not None:
            dropped.append(name)
        table = render()
    return head, rows, table
