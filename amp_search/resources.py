"""The data the package ships, found in either layout.

- `profiles/` (the GPU catalog, the named models, and the measured layer and link profiles
  and calibrations that come with the product) is installed as the data package
  `amp_search.profiles`;
- `configs/` (the example specs) is installed as `amp_search.examples`.

In a source checkout or an editable install both are the top-level folders of the repository;
in a wheel they sit inside the installed package. Nothing here reads a measurement: that is
`amp_search.measurements`, called by the CLI or by a library caller who asks for it.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from .errors import UsageError

_REPO = Path(__file__).resolve().parent.parent


def _data_dir(package: str, folder: str) -> Path:
    """The folder of a data package: the installed one, else the source tree's."""
    try:
        spec = importlib.util.find_spec(f"amp_search.{package}")
    except (ImportError, ValueError):
        spec = None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        if Path(location).is_dir():
            return Path(location)
    return _REPO / folder


def profiles_dir() -> Path:
    """The shipped profiles folder: gpus.yaml, measured/ (layer profiles, calibrations) and
    comm/ (link profiles)."""
    return _data_dir("profiles", "profiles")


def catalog_path() -> Path:
    """The GPU catalog (profiles/gpus.yaml)."""
    return profiles_dir() / "gpus.yaml"


def models_path() -> Path:
    """The named models (profiles/models.yaml) that the spec's `model.preset` accepts."""
    return profiles_dir() / "models.yaml"


def examples_dir() -> Path:
    return _data_dir("examples", "configs")


def example_names() -> list[str]:
    """The shipped example specs, by name (file name without .yaml)."""
    return sorted(p.stem for p in examples_dir().glob("*.yaml"))


def example_path(name: str) -> Path:
    """The file of a shipped example spec; UsageError naming the examples if unknown."""
    names = example_names()
    if name not in names:
        raise UsageError(f"unknown example {name!r}; known: {', '.join(names)}")
    return examples_dir() / f"{name}.yaml"
