"""Measurements, loaded once at the edge and passed in: layer profiles, link fits, calibration.

    load_measurements(spec, root)  ->  Measurements  ->  plan(spec, measurements=...)

The planner never reads the disk for them: a bare `plan(spec)` uses the packaged GPU catalog
and the analytic model (`NO_MEASUREMENTS`). The CLI loads them from `--profiles DIR` (by
default the profiles folder the package ships, `amp_search.resources.profiles_dir()`), and
library callers do the same when they want them. A profiles root holds:

    ROOT/measured/<device>__<precision>__<hash8>.json       layer profiles (amp-search profile)
    ROOT/measured/<devices>__<precision>__calibration.json  calibrations (amp-search calibrate)
    ROOT/comm/<device>__<backend>.json                      link profiles (amp-search profile-comm)

A profile is only ever used for the device name and precision it was measured with.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Mapping

from cost_models.params import CostParams

from .errors import UsageError
from .profiling.store import (LayerProfile, LinkFit, find_comm_profile, find_profile,
                              safe_name)
from .spec import Spec

LAYER_PROFILES = "measured"
LINK_PROFILES = "comm"


def layer_profile_dir(root: Path) -> Path:
    """Where layer profiles and calibrations live under a profiles root."""
    return Path(root) / LAYER_PROFILES


def link_profile_dir(root: Path) -> Path:
    """Where link (collective) profiles live under a profiles root."""
    return Path(root) / LINK_PROFILES


@dataclass(frozen=True, kw_only=True)
class Measurements:
    """Everything measured that the cost model may use for one spec."""

    layer_profiles: Mapping[str, LayerProfile] = field(
        default_factory=lambda: MappingProxyType({}))
    """device type name -> its layer profile in the spec's precision."""
    link_fits: Mapping[tuple[str, str], LinkFit] = field(
        default_factory=lambda: MappingProxyType({}))
    """(collective, 'intra' | 'inter') -> measured fit; used for 'all_reduce' and 'p2p', and
    for the tensor-parallel 'all_gather' and 'reduce_scatter' of sequence parallelism."""
    link_source: str = "spec"
    """Where the link figures came from ('spec': the spec's bandwidths times their link kinds'
    achievable shares, profiles/gpus.yaml `links:`)."""
    calibration: CostParams | None = None
    """Fitted coefficients (amp-search calibrate) for the spec's devices and precision."""
    calibration_source: str = "uncalibrated"
    root: Path | None = None
    """The profiles root they were loaded from; None: nothing loaded."""

    def describe(self) -> str:
        """One line: what was loaded, for the CLI to print."""
        layers = ", ".join(f"{k}={Path(p.path).name if p.path else 'given'}"
                           for k, p in sorted(self.layer_profiles.items())) or "none"
        return (f"measurements from {self.root or '-'}: layer profiles {layers}; links "
                f"{self.link_source}; coefficients {self.calibration_source}")


NO_MEASUREMENTS = Measurements()
"""The analytic model on the packaged catalog and the spec's links."""


def load_measurements(spec: Spec, root: str | os.PathLike) -> Measurements:
    """The newest layer profile of each device type of `spec` (in its precision), the link
    profile (only when every device is of one type: a profile of other hardware is never
    used) and the calibration for the spec's device types and precision, under `root`."""
    root = Path(root)
    if not root.is_dir():
        raise UsageError(f"profiles folder not found: {root}")
    precision = spec.training.precision
    signatures = [layer.signature for layer in spec.model.layers]
    names = sorted({d.gpu.name for d in spec.cluster.devices})
    layers = {}
    for name in names:
        profile = find_profile(name, precision, layer_profile_dir(root), signatures=signatures)
        if profile is not None:
            layers[name] = profile
    fits, link_source = {}, "spec"
    comm = find_comm_profile(link_profile_dir(root), device=names[0]) if len(names) == 1 \
        else None
    if comm is not None:
        fits = {(c, lk): f for (c, lk), f in comm.fits.items()
                if c in ("all_reduce", "p2p", "all_gather", "reduce_scatter")}
        link_source = (f"profile:{Path(comm.path).name} ({'+'.join(comm.links_measured)}; "
                       f"rest from the spec)")
    calibration, cal_source = find_calibration(spec, layer_profile_dir(root))
    return Measurements(layer_profiles=MappingProxyType(layers),
                        link_fits=MappingProxyType(fits), link_source=link_source,
                        calibration=calibration, calibration_source=cal_source, root=root)


# ----------------------------------------------------------------------------- calibrations

def device_types(spec: Spec) -> tuple[str, ...]:
    """The spec's device type names, sorted (what calibrations are keyed by)."""
    return tuple(sorted({d.gpu.name for d in spec.cluster.devices}))


def calibration_path(spec: Spec, directory: Path) -> Path:
    """<directory>/<device>[+<device>...]__<precision>__calibration.json: beside the layer
    profiles of the same devices and precision."""
    names = "+".join(safe_name(d) for d in device_types(spec))
    return Path(directory) / f"{names}__{spec.training.precision}__calibration.json"


def load_calibration(spec: Spec, directory: Path) -> dict | None:
    """The stored calibration for the spec's device types and precision, as written."""
    path = calibration_path(spec, directory)
    if not path.exists():
        return None
    try:
        d = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read calibration {path}: {exc}") from None
    if not isinstance(d, dict) or d.get("kind") != "calibration" or \
            d.get("devices") != list(device_types(spec)) or \
            d.get("precision") != spec.training.precision:
        raise UsageError(f"{path} is not a calibration for {', '.join(device_types(spec))} "
                         f"{spec.training.precision}; delete it or re-run amp-search calibrate")
    d["path"] = str(path)
    return d


def find_calibration(spec: Spec, directory: Path) -> tuple[CostParams | None, str]:
    """The fitted CostParams for the spec's device types and precision and where they came
    from, or (None, 'uncalibrated')."""
    d = load_calibration(spec, directory)
    if d is None:
        return None, "uncalibrated"
    try:
        return CostParams.from_dict(d["params"]), f"calibration:{Path(d['path']).name}"
    except (KeyError, TypeError) as exc:
        raise UsageError(f"malformed calibration {d['path']}: {exc!r}") from None
