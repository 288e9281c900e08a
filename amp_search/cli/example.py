"""`amp-search example [NAME]`: the example specs the package ships, for a user who installed
it from a wheel and has no checkout of the repository."""
from __future__ import annotations

import sys


def add_parser(sub) -> None:
    p = sub.add_parser(
        "example", help="list the shipped example specs, or print one",
        description="Without NAME: list the example specs that come with the package. With "
                    "NAME: print that spec, e.g. `amp-search example amp-hetero-gpt2 > "
                    "spec.yaml && amp-search plan spec.yaml`.")
    p.add_argument("name", nargs="?", default=None, help="example to print")
    p.add_argument("--where", action="store_true",
                   help="print the folders of the shipped examples and profiles")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..resources import example_names, example_path, examples_dir, profiles_dir

    if args.where:
        print(f"examples: {examples_dir()}\nprofiles: {profiles_dir()}")
        return 0
    if args.name is None:
        for name in example_names():
            first = _summary(example_path(name))
            print(f"{name:26s} {first}")
        print("\nprint one with `amp-search example NAME > spec.yaml`")
        return 0
    sys.stdout.write(example_path(args.name).read_text(encoding="utf-8"))
    return 0


def _summary(path) -> str:
    """The first comment line of an example, as its one-line description."""
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
    return ""
