"""What the command line prints for a new user (the requirement: no output a new user
misreads): the placement column, the table's legend, the cold-start line, ties, the compact dry
run, paths in `results`, calibrate's options, --version and help texts. Behaviour only, no timing."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from amp_search import partition
from amp_search.cli import build_parser, main
from amp_search.cli import plan as cli_plan
from amp_search.cli.launch import dry_run_summary
from amp_search.cli.results import format_rows, shorten_path
from amp_search.planner import plan
from amp_search.records import Strategy
from amp_search.spec import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[1]
COLD_LINE = "amp-search: compiling the search kernels"


def _spec(nodes, *, num_layers=4, batch=8, hosts=False):
    """A small GPT spec over node groups [(gpu, count, gpus_per_node), ...]."""
    groups = []
    for i, (gpu, count, per) in enumerate(nodes):
        g = {"gpu": gpu, "count": count, "gpus_per_node": per,
             "intra_node_bandwidth": "50 GB/s", "inter_node_bandwidth": "10 Gbps"}
        if hosts:
            g["hosts"] = [f"node-{i}-{k}" for k in range(count)]
        groups.append(g)
    return {"cluster": {"nodes": groups},
            "model": {"preset": "gpt", "num_layers": num_layers, "hidden_size": 256,
                      "num_attention_heads": 4, "seq_length": 64, "vocab_size": 1024},
            "training": {"global_batch_size": batch, "precision": "fp32"}}


def _strategy(placement, partition_, *, mbs=1, batch=8):
    pp, dp, tmp = len(placement), len(placement[0]), len(placement[0][0])
    return Strategy(pp=pp, dp=dp, tmp=tmp, mbs=mbs, global_batch_size=batch,
                    partition=tuple(partition_), placement=placement, placement_order="listed")


@pytest.fixture
def tiny(tmp_path):
    shutil.copy(ROOT / "configs" / "cpu-tiny.yaml", tmp_path / "spec.yaml")
    return tmp_path / "spec.yaml"


# ----------------------------------------------------------------------------- 1. placement

def test_placement_counts_devices_per_stage_and_mixed_stages():
    # 1 node of 4 T4 then 1 node of 4 V100: one stage of all 8 holds both types
    spec = parse_spec(_spec([("T4-16GB", 1, 4), ("V100-16GB", 1, 4)], batch=8))
    one_stage = _strategy((tuple((d,) for d in range(8)),), (0, 6))
    assert cli_plan.stage_devices(spec, one_stage.placement[0]) == "4 T4-16GB + 4 V100-16GB"
    assert cli_plan.describe_placement(spec, one_stage) == "1 stage x (4 T4-16GB + 4 V100-16GB)"
    # pp 2 x dp 4: one stage per node, each of 4 GPUs (not 'T4-16GB x1 | V100-16GB x1')
    two = _strategy((tuple((d,) for d in range(4)), tuple((d,) for d in range(4, 8))),
                    (0, 3, 6))
    assert cli_plan.describe_placement(spec, two) == "1 stage x 4 T4-16GB | 1 stage x 4 V100-16GB"


def test_placement_groups_consecutive_stages_and_truncates_by_group():
    spec = parse_spec(_spec([("H100-80GB", 2, 8), ("A100-40GB", 1, 8)], num_layers=4))
    st = _strategy(tuple(tuple((8 * j + k,) for k in range(8)) for j in range(3)),
                   (0, 2, 4, 6), batch=8)
    assert cli_plan.describe_placement(spec, st) == \
        "2 stages x 8 H100-80GB | 1 stage x 8 A100-40GB"
    # alternating stage types: too long for the column, it keeps whole leading groups and
    # counts the stages it leaves out
    spec = parse_spec(_spec([("H100-80GB", 1, 1), ("A100-40GB", 1, 1)] * 4, num_layers=8))
    st = _strategy(tuple(((d,),) for d in range(8)), tuple(range(0, 9)) + (10,), batch=8)
    full = cli_plan.describe_placement(spec, st, max_chars=None)
    assert full.count("|") == 7
    short = cli_plan.describe_placement(spec, st, max_chars=56)
    assert len(short) <= 56 and short.startswith("1 stage x 1 H100-80GB | ")
    shown = short.rsplit(" | ", 1)
    kept = shown[0].count("stage x")
    assert shown[1] == f"+{8 - kept} stages"


def test_plan_table_shows_what_stages_hold(capsys):
    assert main(["plan", str(ROOT / "configs" / "amp-hetero-gpt2.yaml"), "--top-k", "3",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    megatron = next(line for line in out.splitlines() if line.startswith("megatron"))
    assert "1 stage x (12 V100-16GB + 4 T4-16GB)" in megatron  # 16 GPUs, both types
    assert " x1 " not in out and "x1 |" not in out


# ----------------------------------------------------------------------------- 2. layers/stage

def test_legend_says_what_layers_per_stage_sums_to(capsys):
    assert main(["plan", str(ROOT / "configs" / "amp-hetero-gpt2.yaml"), "--top-k", "2",
                 "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the legend is wrapped
    assert "a row sums to 26, the 24 transformer blocks plus the embedding and the head" in out
    assert "placement: the node order, then what the stages hold" in out


def test_legend_for_a_layer_chain():
    spec = load_spec(ROOT / "configs" / "amp-transgan.yaml")
    e = plan(spec).best
    text = " ".join(cli_plan.legend(spec, [("1", e, None)]))
    assert f"sums to {len(spec.model.layers)}, every layer of the chain" in text


# ----------------------------------------------------------------------------- 3. cold start

@pytest.fixture
def terminal(monkeypatch):
    """stderr is a terminal, and no cold-start line was printed yet in this process."""
    monkeypatch.setattr(cli_plan, "_stderr_is_terminal", lambda: True)
    monkeypatch.setattr(cli_plan, "_cold_start_said", False)


def test_cold_start_line_once_and_says_what_happens(terminal, capsys):
    cli_plan.cold_start_note(background=True)
    assert capsys.readouterr().err == (f"{COLD_LINE} in the background (first run only); this "
                                       f"run uses their plain-Python versions\n")
    cli_plan.cold_start_note()  # once per process
    assert capsys.readouterr().err == ""


def test_kernels_prepared_only_when_not_cached(monkeypatch):
    """Built ahead of time: nothing started. In numba's cache only: a background process
    builds them ahead of time (unless that failed before), numba from the first call. Not
    cached: one background compile, the Python twins meanwhile, and the one line; once per
    process."""
    from amp_search import kernels
    from cost_models import _jit

    started, said = [], []
    monkeypatch.setattr(kernels, "start_background_compile", lambda: started.append(1))
    monkeypatch.setattr(cli_plan, "cold_start_note", lambda background: said.append(background))
    monkeypatch.setattr(_jit, "_interim", None)
    monkeypatch.setattr(kernels, "aot_ready", lambda: True)
    monkeypatch.setattr(kernels, "kernels_cached", lambda: True)
    monkeypatch.setattr(cli_plan, "_kernels_prepared", False)
    cli_plan.prepare_kernels()
    assert started == [] and said == [] and _jit._interim is None
    monkeypatch.setattr(kernels, "aot_ready", lambda: False)
    monkeypatch.setattr(kernels, "aot_buildable", lambda: False)   # a build failed before
    monkeypatch.setattr(cli_plan, "_kernels_prepared", False)
    cli_plan.prepare_kernels()
    assert started == [] and said == [] and _jit._interim is None
    monkeypatch.setattr(kernels, "aot_buildable", lambda: True)
    monkeypatch.setattr(kernels, "cache_writable", lambda: True)
    monkeypatch.setattr(cli_plan, "_kernels_prepared", False)
    cli_plan.prepare_kernels()
    assert started == [1] and said == [] and _jit._interim is None
    started.clear()
    monkeypatch.setattr(kernels, "kernels_cached", lambda: False)
    monkeypatch.setattr(kernels, "cache_writable", lambda: True)
    monkeypatch.setattr(cli_plan, "_kernels_prepared", False)
    cli_plan.prepare_kernels()
    cli_plan.prepare_kernels()
    assert started == [1] and said == [True] and _jit._interim == {}
    monkeypatch.setattr(kernels, "cache_writable", lambda: False)   # no cache folder
    monkeypatch.setattr(_jit, "_interim", None)
    monkeypatch.setattr(cli_plan, "_kernels_prepared", False)
    cli_plan.prepare_kernels()
    assert started == [1] and said == [True, False] and _jit._interim is None


def test_plan_says_it_once_the_search_starts_and_stdout_stays_json(tiny, monkeypatch, capsys):
    said = []
    monkeypatch.setattr(cli_plan, "prepare_kernels",
                        lambda: print(f"{COLD_LINE} (test)", file=sys.stderr) or said.append(1))
    assert main(["plan", str(tiny), "--no-progress", "--json", "-"]) == 0
    cap = capsys.readouterr()
    json.loads(cap.out)  # stdout stays pure JSON
    assert said == [1] and COLD_LINE in cap.err


def test_no_cold_start_line_on_errors_or_off_a_terminal(tiny, monkeypatch, capsys):
    monkeypatch.setattr(cli_plan, "_cold_start_said", False)
    monkeypatch.setattr(cli_plan, "_stderr_is_terminal", lambda: False)
    cli_plan.cold_start_note()
    assert capsys.readouterr().err == ""
    monkeypatch.setattr(cli_plan, "_stderr_is_terminal", lambda: True)
    # a search refused before it starts prints its one error line only
    assert main(["plan", str(ROOT / "configs" / "amp-hetero-gpt2.yaml"),
                 "--max-search-seconds", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("amp-search: error: "), err


def test_kernels_cached_reads_the_cache_and_never_raises(monkeypatch):
    import numpy as np

    from amp_search import partition_kernels
    from cost_models import _jit

    group = partition_kernels.GROUP
    group.materialize()
    partition.optimal_partition(np.ones((2, 4)), np.zeros((2, 5)), 2)   # as the planner calls
    partition_kernels.solve(np.ones((2, 4)), np.zeros((2, 5)), 2, np.zeros((2, 1)),
                            np.zeros(2), False, np.zeros((2, 1)), np.zeros(2), False)
    if partition.KERNELS_WHAT not in _jit._warned:  # a writable cache: the index holds solve
        assert group.numba_cached() is True
    monkeypatch.setattr(partition_kernels, "solve", object())  # numba internals not as expected
    assert group.numba_cached() is False
    monkeypatch.setattr(group, "_aot", None)                   # nor built ahead of time
    monkeypatch.setattr(group, "_aot_looked", True)
    assert partition.kernels_cached() is False


def test_kernels_not_cached_in_an_empty_cache_folder(tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-m", "amp_search.kernels", "--status"], env=env,
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"cached": False, "aot": False, "aot_failed": None}


# ----------------------------------------------------------------------------- 4. ties

def test_ties_in_the_shown_digits_are_named():
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    a, b, c = plan(spec).strategies[:3]
    rows = [("1", a, None), ("2", dataclasses.replace(b, iteration_time_s=a.iteration_time_s
                                                      * (1 + 1e-6)), None),
            ("3", dataclasses.replace(c, iteration_time_s=a.iteration_time_s * 2), None)]
    text = " ".join(cli_plan.legend(spec, rows))
    assert "Ranks 1, 2 show the same iter s: equal times are ordered by lower peak memory." \
        in text
    assert "show the same iter s" not in " ".join(cli_plan.legend(spec, rows[:1] + rows[2:]))


# ----------------------------------------------------------------------------- 5. dry run

def _big_spec_and_plan(tmp_path):
    """6 nodes of 8 (48 ranks) with hostnames, and a pp 6 x dp 8 strategy: one stage per
    node."""
    data = _spec([("CPU-local", 6, 8)], num_layers=4, batch=8, hosts=True)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(data))
    row = {"pp": 6, "dp": 8, "tmp": 1, "mbs": 1, "partition": list(range(7)),
           "placement": [[[8 * j + k] for k in range(8)] for j in range(6)],
           "iteration_time_s": 1.5}
    plan_path = tmp_path / "plan.json"
    plan_path.write_text(json.dumps({"strategies": [row]}))
    return spec_path, plan_path


def test_dry_run_is_a_compact_summary(tmp_path, capsys):
    spec_path, plan_path = _big_spec_and_plan(tmp_path)
    assert main(["launch", str(spec_path), "--plan", str(plan_path), "--top-k", "1",
                 "--dry-run", "--launcher", "torchrun"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert len(lines) <= 10, out
    assert "48 processes on 6 nodes (torchrun launcher), started by 6 commands" in out
    assert out.count("torch.distributed.run") == 1  # node 0's command only
    assert "--node-rank 0" in out and "+5 more commands: --verbose prints them" in out
    assert "would write to " + str(tmp_path / "runs") in out
    assert "nothing was started, written or recorded" in out
    assert not (tmp_path / "runs").exists()
    assert not (tmp_path / "amp-search-results.sqlite").exists()


def test_dry_run_verbose_prints_every_command_and_file(tmp_path, capsys):
    spec_path, plan_path = _big_spec_and_plan(tmp_path)
    assert main(["launch", str(spec_path), "--plan", str(plan_path), "--top-k", "1",
                 "--dry-run", "--launcher", "torchrun", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.count("torch.distributed.run") == 6
    assert "trial.json (would be written)" in out and '"ranks"' in out
    assert not (tmp_path / "runs").exists()


def test_dry_run_names_why_a_trial_would_not_start():
    spec = parse_spec(_spec([("CPU-local", 1, 4)]))
    rec = SimpleNamespace(index=1, label="pp2-dp2-tmp1-mbs1-z2", predicted_s=None,
                          strategy=None, commands=(), error="DeepSpeed's pipeline engine "
                          "rejects ZeRO stage 2 with pp=2", trial_dir=None, files={})
    text = dry_run_summary(spec, rec, total=1, launcher="local")
    assert "would not start: DeepSpeed's pipeline engine rejects ZeRO stage 2" in text


# ----------------------------------------------------------------------------- 6. results

def test_results_cut_paths_from_the_left():
    path = "/very/long/" + "folder/" * 20 + "runs/01-pp2-dp2-tmp1-mbs2-z0-abcdef12/log.txt"
    short = shorten_path(path, 60)
    assert len(short) == 60 and short.startswith("...")
    assert short.endswith("runs/01-pp2-dp2-tmp1-mbs2-z0-abcdef12/log.txt")
    assert shorten_path("/tmp/a/log.txt") == "/tmp/a/log.txt"
    row = SimpleNamespace(id=1, label="pp2-dp2-tmp1-mbs2-z0", partition=[0, 3, 6],
                          predicted_s=0.2, measured_mean_s=0.3, measured_std_s=0.01,
                          peak_memory_bytes=2**20, status="ok", started_at="now",
                          log_path=path, error=None)
    assert "abcdef12/log.txt" in format_rows([row])


# ----------------------------------------------------------------------------- 7. calibrate

def _calibrate_args(*argv):
    return build_parser().parse_args(["calibrate", "spec.yaml", *argv])


def test_calibrate_spells_options_like_the_others():
    assert _calibrate_args("--results", "r.db").results == Path("r.db")
    assert _calibrate_args("--db", "r.db").results == Path("r.db")  # the old name still works
    assert _calibrate_args("--json", "c.json").json == Path("c.json")
    assert str(_calibrate_args("--json", "-").json) == "-"
    assert str(_calibrate_args("--json").json) == "-"  # as before: JSON on stdout
    assert _calibrate_args().json is None
    help_text = build_parser()._subparsers._group_actions[0].choices["calibrate"].format_help()
    assert "--results DB" in help_text and "--db" not in help_text


def test_calibrate_missing_database_names_results(tiny, capsys):
    assert main(["calibrate", str(tiny), "--results", str(tiny.parent / "none.db")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no results database" in err[0] and "--results" in err[0]


def test_calibrate_json_to_stdout_and_file(tiny, tmp_path, capsys):
    spec = load_spec(tiny)
    trials = [{"strategy": e.strategy.to_dict(), "measured_s": 1.1 * e.iteration_time_s}
              for e in plan(spec).strategies[:8]]
    (tmp_path / "trials.json").write_text(json.dumps(trials))
    base = ["calibrate", str(tiny), "--trials", str(tmp_path / "trials.json"), "--dry-run"]
    assert main([*base, "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)  # only JSON on stdout
    assert isinstance(data, dict)
    assert main([*base, "--json", str(tmp_path / "cal.json")]) == 0
    assert "mean absolute error" in capsys.readouterr().out  # the report, too
    written = json.loads((tmp_path / "cal.json").read_text())
    assert {k: v for k, v in written.items() if k != "created"} == \
        {k: v for k, v in data.items() if k != "created"}


# ----------------------------------------------------------------------------- 8. --version

def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == \
        f"amp-search {importlib.metadata.version('amp-search')}"


# ----------------------------------------------------------------------------- 9. help texts

def test_every_flag_has_help():
    """Every argument of every sub-command this module's commands register (profile and
    profile-comm live elsewhere)."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {x.option_strings or x.dest}"
               for name, parser in sub.choices.items()
               if name not in ("profile", "profile-comm")
               for x in parser._actions if not x.help]
    assert missing == []


def test_a_port_out_of_range_is_one_line(capsys):
    from amp_search.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["launch", "configs/cpu-tiny.yaml", "--master-port", "70000", "--dry-run"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "TCP port (1 to 65535)" in err and "Traceback" not in err


# ----------------------------------------------------------------------------- 10. start-up

def _subcommands(parser: argparse.ArgumentParser) -> dict:
    return next(a for a in parser._actions
                if isinstance(a, argparse._SubParsersAction)).choices


def test_a_named_command_gets_the_same_parser_alone():
    """`amp-search COMMAND ...` builds only the module of COMMAND (cli.command_module): every
    sub-command has one, and its help there is the help of the full parser."""
    from amp_search.cli import command_module

    full = _subcommands(build_parser())
    for name, parser in full.items():
        alone = _subcommands(build_parser(command_module(name)))
        assert name in alone, name
        assert alone[name].format_help() == parser.format_help()
    assert command_module("no-such-command") is None


def test_an_unknown_command_lists_them_all(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["plam"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'plam'" in err and "timeline" in err and "estimate" in err


START_UP_PROBE = """
import json, sys
from amp_search.cli import main
code = main(sys.argv[1:])
watched = ("torch", "deepspeed", "matplotlib", "amp_search.launch", "amp_search.export",
           "tqdm", "scipy.linalg")
from amp_search import partition_kernels
from cost_models import simulator_kernels
solve = partition_kernels.solve
groups = (partition_kernels.GROUP, simulator_kernels.GROUP)
aot = all(g._aot is not None for g in groups)      # both built ahead of time and loaded
print(json.dumps({"code": code, "imported": [m for m in watched if m in sys.modules],
                  "numba": "numba" in sys.modules, "aot": aot,
                  "aot_misses": sum(g.aot_misses for g in groups),
                  "kernels_from_cache": partition_kernels.GROUP._aot is not None
                  or sum(getattr(solve, "_cache_hits", {}).values()) > 0}))
"""


@pytest.mark.parametrize("argv", [
    ["plan", "configs/cpu-tiny.yaml", "--json", "-"],
    ["estimate", "configs/cpu-tiny.yaml", "--pp", "2", "--dp", "1", "--tmp", "2", "--mbs", "1",
     "--json", "-"],
    ["timeline", "configs/cpu-tiny.yaml", "--rank", "1", "--no-files"],
])
def test_the_planning_commands_import_no_framework(argv):
    """plan, estimate and timeline (without --png) import neither torch, DeepSpeed nor
    matplotlib, nor the launchers, the exporter or the progress bar (--json -: no bar);
    scipy.linalg neither, when numba loads the kernels from its cache (cost_models._jit), and
    not numba itself when they are built ahead of time (cost_models._aot)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-m", "amp_search", *argv], cwd=ROOT, env=env,
                   capture_output=True, check=True)           # the kernels are cached after it
    done = subprocess.run([sys.executable, "-c", START_UP_PROBE, *argv], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["code"] == 0
    allowed = set() if out["kernels_from_cache"] else {"scipy.linalg"}
    assert set(out["imported"]) <= allowed, out["imported"]
    if out["aot"] and not out["aot_misses"]:   # both groups built ahead of time (a
        assert not out["numba"]                 # background build may be half done): no numba


@pytest.mark.parametrize("network, per_node, noted", [
    ("400 Gbps", 8, True), ("8 x 400 Gbps", 8, False), ("25600 Gbps", 64, False)])
def test_network_note_only_where_the_node_may_have_been_written_as_one_nic(
        write_spec, capsys, network, per_node, noted):
    """`plan` asks whether a node's network is one NIC's only where it could be: a node figure
    of more than one NIC carries (a GB200 NVL72 rack's 64 x 400 Gb/s written as one number),
    or one written as its NICs, gets no note."""
    spec = write_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2,
                               "gpus_per_node": per_node, "intra_node_bandwidth": "900 GB/s",
                               "inter_node_bandwidth": network}]},
        "model": {"preset": "gpt", "num_layers": 8, "hidden_size": 1024,
                  "num_attention_heads": 16, "seq_length": 1024, "vocab_size": 51200},
        "training": {"global_batch_size": 256, "backend": "megatron"}})
    assert main(["plan", str(spec), "--top-k", "1", "--no-progress"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("if that is one NIC's, write the node's" in out) == noted


def test_an_output_file_in_no_folder_is_refused_before_the_search(capsys, tmp_path):
    """--json, --png and --pareto-png name a file in a folder that exists (or '-'), checked
    before any work: a long search is not lost to a typo at the end; --max-amplification is
    at least 1 (the most GPU-efficient plan's)."""
    missing = str(tmp_path / "no-such-folder" / "plan.json")
    for argv in (["plan", "configs/cpu-tiny.yaml", "--json", missing],
                 ["plan", "configs/cpu-tiny.yaml", "--json", str(tmp_path)],
                 ["plan", "configs/cpu-tiny.yaml", "--pareto-png", missing],
                 ["estimate", "configs/cpu-tiny.yaml", "--pp", "1", "--dp", "4", "--tmp", "1",
                  "--mbs", "1", "--json", missing],
                 ["results", "configs/cpu-tiny.yaml", "--png", missing],
                 ["plan", "configs/cpu-tiny.yaml", "--max-amplification", "0.5"]):
        with pytest.raises(SystemExit) as exc:
            main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err
        assert err.strip().splitlines()[-1].startswith("amp-search")    # after the usage
        assert ("cannot write" in err) != ("at least 1" in err)
