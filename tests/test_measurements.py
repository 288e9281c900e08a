"""Measurements are loaded at the edge and passed in; the package ships its data."""
from __future__ import annotations

import json
import subprocess
import sys
import zipfile

import pytest

from amp_search import estimate, load_spec, plan
from amp_search.measurements import (NO_MEASUREMENTS, Measurements, layer_profile_dir,
                                     load_measurements)
from amp_search.profiling.store import LayerProfile, ProfileEntry
from amp_search.resources import catalog_path, example_names, example_path, profiles_dir
from conftest import ROOT

CPU_LOCAL = ROOT / "configs" / "cpu-local.yaml"


def _slow_profile(spec, root, factor=100.0):
    """A profile of every layer of `spec` on CPU-local, `factor` times the shipped one."""
    shipped = load_measurements(spec, profiles_dir()).layer_profiles["CPU-local"]
    entries = [ProfileEntry(signature=e.signature, tmp=e.tmp, mbs=e.mbs,
                            forward_s=e.forward_s * factor, backward_s=e.backward_s * factor,
                            repeats=1) for e in shipped.entries]
    p = LayerProfile(device="CPU-local", precision="fp32", entries=entries,
                     created="2099-01-01T00:00:00+00:00")
    return p.save(layer_profile_dir(root) / "CPU-local__fp32__slow.json")


def test_bare_plan_reads_nothing_from_disk(tmp_path):
    spec = load_spec(CPU_LOCAL)
    bare = plan(spec)
    assert all("analytic" in s or s.startswith(("links=spec", "coefficients=uncal"))
               for s in bare.best.timing_sources), bare.best.timing_sources
    _slow_profile(spec, tmp_path)
    slow = load_measurements(spec, tmp_path)
    assert slow.calibration is None and slow.link_source == "spec"
    with_slow = plan(spec, measurements=slow)
    assert with_slow.best.iteration_time_s > 10 * bare.best.iteration_time_s
    assert any("CPU-local__fp32__slow.json" in s for s in with_slow.best.timing_sources)
    assert plan(spec).best.iteration_time_s == bare.best.iteration_time_s


def test_shipped_measurements_are_found_and_named():
    spec = load_spec(CPU_LOCAL)
    m = load_measurements(spec, profiles_dir())
    assert set(m.layer_profiles) == {"CPU-local"}
    # the shipped CPU profile is uncalibrated: it holds the framework's fixed costs, ZeRO 1-3's
    # included, and the machine-speed probe that launch compares against
    (profile,) = m.layer_profiles.values()
    assert m.calibration is None and profile.speed_probe is not None
    assert {z.zero_stage for z in profile.framework_overheads.zero} == {1, 2, 3}
    assert profile.framework_overheads.pipeline_step_overhead_s is not None
    assert m.link_source.startswith("profile:CPU-local__gloo.json")
    e = estimate(spec, pp=1, dp=2, tmp=1, mbs=4, measurements=m)
    assert any(s.startswith("coefficients=uncalibrated + framework overheads measured")
               for s in e.timing_sources), e.timing_sources
    assert "layer profiles CPU-local=" in m.describe()
    # a heterogeneous spec never takes a one-device link profile
    hetero = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    assert load_measurements(hetero, profiles_dir()).link_fits == {}


def test_a_profile_of_another_device_is_refused():
    spec = load_spec(CPU_LOCAL)
    shipped = load_measurements(spec, profiles_dir()).layer_profiles["CPU-local"]
    wrong = Measurements(layer_profiles={"V100-16GB": shipped})
    hetero = load_spec(ROOT / "configs" / "amp-hetero-gpt2.yaml")
    from amp_search.errors import UsageError
    with pytest.raises(UsageError, match="measured on CPU-local"):
        plan(hetero, measurements=wrong)


def test_cli_profiles_option_is_used_and_reported(tmp_path, capsys):
    from amp_search.cli import main
    spec = load_spec(CPU_LOCAL)
    _slow_profile(spec, tmp_path)
    assert main(["plan", str(CPU_LOCAL), "--top-k", "1", "--no-progress", "--profiles",
                 str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "CPU-local__fp32__slow.json" in out and "coefficients=uncalibrated" in out
    assert main(["plan", str(CPU_LOCAL), "--top-k", "1", "--no-progress", "--profiles",
                 str(tmp_path / "missing")]) == 2
    assert "profiles folder not found" in capsys.readouterr().err


def test_no_import_circle():
    code = ("import sys, amp_search.planner; "
            "assert 'amp_search.calibrate' not in sys.modules, 'planner imports calibrate'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_examples_are_listed_and_printable(capsys):
    from amp_search.cli import main
    assert set(example_names()) >= {"amp-hetero-gpt2", "cpu-local", "a100-gpt7b"}
    assert main(["example"]) == 0
    assert "amp-hetero-gpt2" in capsys.readouterr().out
    assert main(["example", "amp-hetero-gpt2"]) == 0
    assert capsys.readouterr().out == example_path("amp-hetero-gpt2").read_text()
    assert main(["example", "nope"]) == 2
    assert "known: a100-gpt7b" in capsys.readouterr().err
    assert catalog_path().is_file()


def test_wheel_carries_the_catalog_examples_and_profiles(tmp_path):
    """A non-editable build holds everything the CLI needs (the CI installs it into a fresh
    virtual environment and plans from another folder)."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    wheel = next(tmp_path.glob("amp_search-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "amp_search/profiles/gpus.yaml" in names
    assert {f"amp_search/examples/{n}.yaml" for n in example_names()} <= names
    assert any(n.startswith("amp_search/profiles/measured/") for n in names)
    assert any(n.startswith("cost_models/") for n in names)
    meta = json.dumps(sorted(names))
    assert "tests/" not in meta and "benchmarks/" not in meta
    assert NO_MEASUREMENTS.root is None
