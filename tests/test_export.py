"""`amp-search export`: the top plan of every shipped config exported in both formats and read
back by the launcher itself (its plan reader, hostfile parser, trial config reader, and its
own dry run of the same strategy, whose files must be the exported ones); the exported
DeepSpeed files run for real on CPU; the Megatron-LM argument list against a hand-written one,
uneven splits checked by megatron-core's own validator; bad input is one line and exit 2."""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from amp_search.cli import main
from amp_search.cli._args import measurements_for
from amp_search.cli.launch import read_plan
from amp_search.errors import UsageError
from amp_search.export import export_strategy, megatron_split, write_export
from amp_search.launch import LaunchOptions, parse_hostfile, run_trials
from amp_search.planner import estimate, plan_backends
from amp_search.spec import load_spec
from amp_search.trial.config import TrialConfig
from conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
LAYER_NAMES = ["embedding", "block0", "block1", "block2", "block3", "head"]


@pytest.fixture(scope="module")
def top_plans():
    """config name -> (spec, the plan's best Estimate), with the shipped measurements (what
    `amp-search plan` and `export --rank 1` use)."""
    out = {}
    for path in CONFIGS:
        spec = load_spec(path)
        result = plan_backends(spec, measurements=measurements_for(
            spec, argparse.Namespace(profiles=None)), max_search_s=600)
        out[path.stem] = (spec.for_backend(result.best.backend), result.best)
    return out


# ----------------------------------------------------------------------------- helpers

def _exec_argv(script: Path) -> tuple[list[str], dict]:
    """The command a generated script execs, and the variables it exports."""
    text = script.read_text()
    env = {}
    for line in text.splitlines():
        if line.startswith("export "):
            k, _, v = line[len("export "):].partition("=")
            env[k] = shlex.split(v)[0]
    command = text[text.index("\nexec ") + len("\nexec "):].replace("\\\n", " ")
    return shlex.split(command), env


def _normalised(argv) -> list[str]:
    """From the module the interpreter runs on, files named by their base name (the launcher
    uses absolute paths in its trial folder, the export paths relative to its own)."""
    argv = list(argv)
    argv = argv[argv.index("-m"):]
    keep = ("trial.json", "hostfile", "pretrain_gpt.py")
    return [Path(a).name if Path(a).name in keep else a for a in argv]


def _dry_run_command(cmd: dict) -> tuple[list[str], dict]:
    """A launcher command (commands.json) as (argv, env), looking inside `ssh host -- ...`."""
    if cmd["argv"][0] != "ssh":
        return cmd["argv"], cmd["env"]
    words = shlex.split(cmd["argv"][-1])
    start = words.index("env") + 1
    env, k = {}, start
    while "=" in words[k] and not words[k].startswith("/"):
        key, _, v = words[k].partition("=")
        env[key] = v
        k += 1
    return words[k:], env


def _launcher_dry_run(spec, out: Path, tmp: Path, **options):
    """The launcher's own reading of the exported plan.json and hostfile, and its dry run."""
    items = read_plan(out / "plan.json", spec)
    hostfile = parse_hostfile(out / "hostfile")
    recs = run_trials(spec, items, LaunchOptions(dry_run=True, hostfile=hostfile,
                                                 runs_dir=tmp / "runs", **options))
    assert len(recs) == 1 and recs[0].status == "dry-run" and not recs[0].error, recs[0].error
    files = {Path(k).name: v for k, v in recs[0].files.items()}
    return items[0].strategy, files


# ----------------------------------------------------------------------------- every config

@pytest.mark.parametrize("config", [p.stem for p in CONFIGS])
def test_top_plan_exports_files_the_launcher_accepts(config, top_plans, tmp_path):
    spec, best = top_plans[config]
    s = best.strategy
    if any(x.kind == "custom" for x in spec.model.layers):
        # the launcher cannot run custom layers; export refuses with the launcher's words
        with pytest.raises(UsageError) as launcher_err:
            run_trials(spec, [best], LaunchOptions(dry_run=True))
        for fmt in ("deepspeed", "megatron"):
            with pytest.raises(UsageError) as export_err:
                export_strategy(spec, s, fmt=fmt, estimate=best)
            assert str(export_err.value) == str(launcher_err.value)
        return

    # --- DeepSpeed (which has no ring attention: a Megatron-LM plan at cp > 1, as Megatron-LM's
    # searched context parallelism may give, is refused by name)
    if s.cp > 1:
        with pytest.raises(UsageError, match=f"cp {s.cp}: context parallelism is Megatron-LM's"):
            export_strategy(spec, s, fmt="deepspeed", estimate=best)
    else:
        _check_deepspeed_export(spec, s, best, tmp_path)
    _check_megatron_export(spec, s, best, tmp_path)


def _check_deepspeed_export(spec, s, best, tmp_path):
    """The DeepSpeed export of `s` is what `launch` runs, node by node."""
    ds_out = tmp_path / "ds"
    ex = export_strategy(spec, s, fmt="deepspeed", estimate=best)
    write_export(ex, ds_out)
    cfg = TrialConfig.read(ds_out / "trial.json")           # the trial program's reader
    assert cfg.strategy == s and cfg.ds_config == json.loads(
        (ds_out / "ds_config.json").read_text())
    assert cfg.world_size == s.num_devices and sorted(cfg.launch_order) == list(
        range(s.num_devices))
    assert json.loads((ds_out / "partition.json").read_text())["boundaries"] == list(
        s.partition)
    strategy, files = _launcher_dry_run(spec, ds_out, tmp_path, launcher="deepspeed")
    assert strategy == s                                     # plan.json, read by launch --plan
    launched = json.loads(files["trial.json"])
    exported = json.loads((ds_out / "trial.json").read_text())
    assert launched.pop("output").endswith("result.json") and exported.pop("output") == \
        "result.json"
    assert exported == launched                              # what was measured is exported
    assert files["ds_config.json"] == (ds_out / "ds_config.json").read_text()
    assert files["hostfile"] == (ds_out / "hostfile").read_text()
    # the same environment, less the PYTHONPATH of this machine's checkout
    assert [x for x in files[".deepspeed_env"].splitlines()
            if not x.startswith("PYTHONPATH=")] == (ds_out / ".deepspeed_env").read_text(
        ).splitlines()
    launch_cmd = json.loads(files["commands.json"])["commands"][0]
    assert _normalised(_exec_argv(ds_out / "launch.sh")[0]) == _normalised(
        launch_cmd["argv"])
    # one torchrun per node: the same commands as `launch --launcher torchrun`
    _, tfiles = _launcher_dry_run(spec, ds_out, tmp_path / "t", launcher="torchrun")
    commands = json.loads(tfiles["commands.json"])["commands"]
    assert len(commands) == len(list(ds_out.glob("launch-node*.sh")))
    for i, c in enumerate(commands):
        argv, env = _dry_run_command(c)
        got, got_env = _exec_argv(ds_out / f"launch-node{i}.sh")
        assert _normalised(got) == _normalised(argv)
        assert got_env.get("CUDA_VISIBLE_DEVICES") == env.get("CUDA_VISIBLE_DEVICES")
    for script in ds_out.glob("*.sh"):
        assert os.access(script, os.X_OK)
        assert subprocess.run(["bash", "-n", str(script)]).returncode == 0



def _check_megatron_export(spec, s, best, tmp_path):
    """The Megatron-LM export of `s` is what `launch --backend megatron` runs (Megatron-LM has
    no ZeRO 2, and ZeRO 3 as Megatron-FSDP with pp 1 only: the launcher and export refuse
    the rest by name)."""
    mg_out = tmp_path / "mg"
    if s.zero_stage == 2 or (s.zero_stage == 3 and s.pp > 1):
        with pytest.raises(UsageError, match=f"Megatron-LM has no ZeRO stage {s.zero_stage}"):
            export_strategy(spec, s, fmt="megatron", estimate=best)
        s = replace(s, zero_stage=1)
        best = None
    ex = export_strategy(spec, s, fmt="megatron", estimate=best)
    write_export(ex, mg_out)
    args = json.loads((mg_out / "megatron_args.json").read_text())
    strategy, files = _launcher_dry_run(spec, mg_out, tmp_path / "m", backend="megatron",
                                        launcher="torchrun", megatron_path=tmp_path)
    assert strategy == s and json.loads(files["megatron_args.json"]) == args
    commands = json.loads(files["commands.json"])["commands"]
    assert len(commands) == len(list(mg_out.glob("launch-node*.sh")))
    for i, c in enumerate(commands):
        argv, env = _dry_run_command(c)
        got, got_env = _exec_argv(mg_out / f"launch-node{i}.sh")
        assert _normalised(got) == _normalised(argv)
        assert got[got.index("$MEGATRON_PATH/pretrain_gpt.py") + 1:] == args
        assert got_env.get("CUDA_VISIBLE_DEVICES") == env.get("CUDA_VISIBLE_DEVICES")
        assert got_env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    _check_with_megatron_core(spec, s, args)
    readme = (mg_out / "README.md").read_text()
    assert all(f"`{p.name}`" in readme for p in mg_out.iterdir() if p.name != "README.md")


def _check_with_megatron_core(spec, s, args):
    """The split arguments, given to megatron-core's TransformerConfig, build the planned
    number of transformer blocks on every stage."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    counts = megatron_split(spec, s)["blocks_per_stage"]
    flag = dict(zip(args, args[1:]))
    kw = dict(num_layers=int(flag["--num-layers"]), hidden_size=int(flag["--hidden-size"]),
              num_attention_heads=int(flag["--num-attention-heads"]),
              pipeline_model_parallel_size=s.pp, pipeline_dtype=torch.float32)
    if "--pipeline-model-parallel-layout" in flag:
        c = TransformerConfig(pipeline_model_parallel_layout=flag[
            "--pipeline-model-parallel-layout"], **kw)
        built = [c.pipeline_model_parallel_layout.get_num_layers_to_build(pp_rank=j)
                 for j in range(s.pp)]
    elif "--decoder-first-pipeline-num-layers" in flag:
        first = int(flag["--decoder-first-pipeline-num-layers"])
        last = int(flag["--decoder-last-pipeline-num-layers"])
        TransformerConfig(num_layers_in_first_pipeline_stage=first,
                          num_layers_in_last_pipeline_stage=last, **kw)
        middle = [(kw["num_layers"] - first - last) // (s.pp - 2)] * (s.pp - 2) \
            if s.pp > 2 else []
        built = [first, *middle, last]
    else:
        if s.pp > 1:
            TransformerConfig(**kw)
        built = [kw["num_layers"] // s.pp] * s.pp
    assert built == counts and sum(counts) == kw["num_layers"]


# ----------------------------------------------------------------------------- hand-written

def test_megatron_arguments_for_an_uneven_split(tmp_path):
    """cpu-tiny (4 blocks), pp 2 x tmp 2, mbs 2, ZeRO 1, recomputation, layers split
    embedding+block0 | block1-3+head: 1 and 3 blocks, first/last form."""
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    e = estimate(spec, pp=2, dp=1, tmp=2, mbs=2, partition=(0, 2, 6), zero_stage=1,
                 activation_checkpointing=True)
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e, iters=10, warmup=5)
    write_export(ex, tmp_path)
    assert json.loads((tmp_path / "megatron_args.json").read_text()) == [
        "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
        "--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "4",
        "--ffn-hidden-size", "1024", "--seq-length", "64", "--max-position-embeddings", "64",
        "--micro-batch-size", "2", "--global-batch-size", "8",
        "--train-iters", "10", "--log-interval", "1", "--eval-iters", "0",
        "--lr", "0.0001", "--lr-decay-style", "constant", "--seed", "1234",
        "--mock-data", "--tokenizer-type", "NullTokenizer", "--vocab-size", "1024",
        "--position-embedding-type", "learned_absolute",
        "--untie-embeddings-and-output-weights", "--attention-dropout", "0",
        "--hidden-dropout", "0", "--transformer-impl", "local",
        "--no-gradient-accumulation-fusion",
        "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "3",
        "--recompute-granularity", "full", "--recompute-method", "uniform",
        "--recompute-num-layers", "1", "--use-distributed-optimizer"]
    argv, env = _exec_argv(tmp_path / "launch-node0.sh")
    assert argv[:13] == ["$PYTHON", "-m", "torch.distributed.run", "--nnodes", "1",
                         "--node-rank", "0", "--nproc-per-node", "4", "--master-addr",
                         "localhost", "--master-port", "29500"]
    assert env == {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "DS_ACCELERATOR": "cpu",
                   "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    assert ex.split["form"] == "first-last" and ex.split["exact"]
    _check_with_megatron_core(spec, e.strategy, json.loads(
        (tmp_path / "megatron_args.json").read_text()))


def test_megatron_arguments_carry_sequence_parallel_and_selective_recomputation(tmp_path):
    """Korthikanti et al.'s two knobs reach Megatron-LM as its own flags: selective is
    --recompute-granularity selective (no method / layer count), SP is --sequence-parallel."""
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    e = estimate(spec, pp=1, dp=2, tmp=2, mbs=2, partition="uniform",
                 activation_checkpointing="selective", sequence_parallel=True)
    assert e.strategy.selective_recompute and e.strategy.sequence_parallel
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e, iters=10, warmup=5)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    i = args.index("--recompute-granularity")
    assert args[i + 1] == "selective" and "--recompute-method" not in args
    assert "--sequence-parallel" in args
    text = next(f.text for f in ex.files if f.path == "README.md")
    assert "(`sequence_parallel`): True" in text and "(`selective_recompute`): True" in text


@pytest.mark.parametrize("partition, counts, form, split", [
    ((0, 1, 3, 5, 6), [0, 2, 2, 0], "layout", ["--pipeline-model-parallel-layout",
                                               "E|t*2|t*2|L"]),
    ((0, 2, 3, 4, 6), [1, 1, 1, 1], "uniform", []),
    ((0, 3, 4, 5, 6), [2, 1, 1, 0], "layout", ["--pipeline-model-parallel-layout",
                                               "Et*2|t|t|L"]),
    ((0, 2, 3, 5, 6), [1, 1, 2, 0], "layout", ["--pipeline-model-parallel-layout",
                                               "Et|t|t*2|L"]),
])
def test_megatron_split_forms(partition, counts, form, split):
    """Hand-derived: which form each pp-4 split of cpu-tiny takes; the first/last form cannot
    give a stage without blocks, the layout gives every split; megatron-core agrees."""
    spec = load_spec(ROOT / "configs" / "cpu-tiny.yaml")
    e = estimate(spec, pp=4, dp=1, tmp=1, mbs=2, partition=partition)
    got = megatron_split(spec, e.strategy)
    assert (got["blocks_per_stage"], got["form"], got["args"]) == (counts, form, split)
    if form == "layout":
        assert "cannot express" in got["note"]
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    _check_with_megatron_core(spec, e.strategy, args)


def test_megatron_first_last_split_with_middle_stages():
    spec = load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml")   # 24 blocks, 16 GPUs
    e = estimate(spec, pp=4, dp=4, tmp=1, mbs=1, partition=(0, 5, 12, 19, 26))
    got = megatron_split(spec, e.strategy)
    assert got["blocks_per_stage"] == [4, 7, 7, 6] and got["form"] == "first-last"
    assert got["args"] == ["--decoder-first-pipeline-num-layers", "4",
                           "--decoder-last-pipeline-num-layers", "6"]
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e)
    _check_with_megatron_core(spec, e.strategy, json.loads(
        next(f.text for f in ex.files if f.path == "megatron_args.json")))


@pytest.mark.parametrize("partition, method", [
    ((0, 7, 14, 20, 26), "uniform"),                 # DeepSpeed's partition_uniform(26, 4)
    ((0, 7, 13, 19, 26), "type:TransformerLayer"),   # 6 blocks a stage, balanced by type
    ((0, 5, 12, 19, 26), None),                      # neither: explicit boundaries
])
def test_deepspeed_partition_method(partition, method):
    pytest.importorskip("deepspeed")
    from amp_search.export import deepspeed_partition_method

    spec = load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml")
    e = estimate(spec, pp=4, dp=4, tmp=1, mbs=1, partition=partition)
    assert deepspeed_partition_method(spec, e.strategy) == method


# ----------------------------------------------------------------------------- runs for real

def test_exported_deepspeed_files_run_on_cpu(tmp_path, capsys):
    """Export an uneven pp 2 x dp 2 strategy (ZeRO 1, recomputation) of cpu-tiny through the
    CLI and run its launch.sh: the deepspeed launcher, 4 gloo processes, a real trial."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("megatron.core")
    out, port = tmp_path / "export", free_port()
    assert main(["export", str(ROOT / "configs" / "cpu-tiny.yaml"), "--format", "deepspeed",
                 "--out", str(out), "--pp", "2", "--dp", "2", "--tmp", "1", "--mbs", "2",
                 "--partition", "0,2,6", "--zero-stage", "1",
                 "--activation-checkpointing", "full", "--iters", "4", "--warmup", "2",
                 "--master-port", str(port), "--json", str(tmp_path / "summary.json")]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [f["path"] for f in summary["files"]] == [
        "trial.json", "ds_config.json", "partition.json", "hostfile", ".deepspeed_env",
        "launch.sh", "launch-node0.sh", "plan.json", "README.md"]
    for f in summary["files"]:
        assert f"wrote {out / f['path']}: " in printed
    ds = json.loads((out / "ds_config.json").read_text())
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"],
            ds["gradient_accumulation_steps"], ds["zero_optimization"]) == (
        8, 2, 2, {"stage": 1})
    assert f"--master_port {port} " in (out / "launch.sh").read_text()
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run(["bash", str(out / "launch.sh")], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["status"] == "ok" and result["world_size"] == 4
    assert result["stage_layers"] == [LAYER_NAMES[:2], LAYER_NAMES[2:]]
    assert len(result["iteration_times_s"]) == 4 and result["timed_iterations"] == 2
    assert result["losses"][0] == pytest.approx(6.93, abs=0.1)   # ~ln(1024) at init


# ----------------------------------------------------------------------------- bad input

def _fails(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("amp-search: error: ")
    return err


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    spec = str(ROOT / "configs" / "cpu-tiny.yaml")
    given = ["--pp", "1", "--dp", "4", "--tmp", "1", "--mbs", "2"]
    out = str(tmp_path / "o")
    assert "accepted: deepspeed, megatron" in _fails(
        ["export", spec, "--format", "onnx", "--out", out, *given], capsys)
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "keep.txt").write_text("x")
    assert "--force" in _fails(["export", spec, "--format", "deepspeed", "--out", out,
                                *given], capsys)
    assert main(["export", spec, "--format", "deepspeed", "--out", out, "--force",
                 *given]) == 0
    assert (tmp_path / "o" / "keep.txt").exists() and (tmp_path / "o" / "trial.json").exists()
    capsys.readouterr()
    fresh = str(tmp_path / "fresh")
    assert "feasible strategies" in _fails(["export", spec, "--format", "deepspeed", "--out",
                                            fresh, "--rank", "100000"], capsys)
    assert "must equal 4" in _fails(["export", spec, "--format", "megatron", "--out", fresh,
                                     "--pp", "3", "--dp", "1", "--tmp", "1", "--mbs", "2"],
                                    capsys)
    assert "ZeRO stage 2" in _fails(["export", spec, "--format", "deepspeed", "--out", fresh,
                                     "--pp", "2", "--dp", "2", "--tmp", "1", "--mbs", "2",
                                     "--zero-stage", "2"], capsys)
    a100 = str(ROOT / "configs" / "a100-gpt7b.yaml")
    assert "does not fit in memory" in _fails(
        ["export", a100, "--format", "deepspeed", "--out", fresh, "--pp", "1", "--dp", "32",
         "--tmp", "1", "--mbs", "16", "--zero-stage", "0", "--activation-checkpointing",
         "none"], capsys)
    assert not Path(fresh).exists()    # nothing written on bad input


def test_json_to_stdout_is_only_json(tmp_path, capsys):
    spec = str(ROOT / "configs" / "cpu-tiny.yaml")
    assert main(["export", spec, "--format", "megatron", "--out", str(tmp_path / "m"),
                 "--pp", "2", "--dp", "1", "--tmp", "2", "--mbs", "2", "--partition", "0,2,6",
                 "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["format"] == "megatron" and data["label"] == "pp2-dp1-tmp2-mbs2-z0"
    assert data["split"]["args"] == ["--decoder-first-pipeline-num-layers", "1",
                                     "--decoder-last-pipeline-num-layers", "3"]
    assert [Path(p).name for p in data["written"]] == [f["path"] for f in data["files"]]
    assert data["hosts"] == {"0": "localhost"} and not data["placeholder_hosts"]


def test_default_is_the_plans_best(top_plans, tmp_path, capsys):
    """No --rank and no strategy: the plan's rank 1, as `plan` ranks it."""
    spec, best = top_plans["cpu-tiny"]
    assert main(["export", str(ROOT / "configs" / "cpu-tiny.yaml"), "--format", "deepspeed",
                 "--out", str(tmp_path / "d"), "--json", "-"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["chosen"] == "rank 1 of the plan" and data["label"] == best.strategy.label()
    assert data["strategy"]["partition"] == list(best.strategy.partition)
    assert data["predicted_s"] == pytest.approx(best.iteration_time_s)


def test_interleaved_placement_megatron_refuses_deepspeed_maps(tmp_path):
    """Ranks 0-3 on four different nodes: Megatron-LM numbers ranks node by node and cannot
    place them; the DeepSpeed export maps launch rank -> planned global rank."""
    from amp_search.records import Strategy

    spec = load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml")   # 4 nodes x 4 T4
    order = [n * 4 + k for k in range(4) for n in range(4)]      # 0, 4, 8, 12, 1, 5, ...
    s = Strategy(pp=1, dp=16, tmp=1, mbs=2, global_batch_size=32, partition=(0, 26),
                 placement=(tuple((d,) for d in order),), placement_order="given")
    with pytest.raises(UsageError, match="not one contiguous block"):
        export_strategy(spec, s, fmt="megatron")
    ex = export_strategy(spec, s, fmt="deepspeed")
    cfg = TrialConfig.from_dict(json.loads(next(f.text for f in ex.files
                                                 if f.path == "trial.json")))
    # launch rank: node 0's devices 0-3, then node 1's, ...; global rank g runs on order[g]
    assert list(cfg.launch_order) == [order.index(d) for d in range(16)]
    readme = next(f.text for f in ex.files if f.path == "README.md")
    assert "| 1 | 0 | 1 | 0 | node-1 | 1 | 0 | 0 |" in readme


def test_hostfile_names_the_hosts(tmp_path):
    """--hostfile: line i is node i; the placeholders are gone from every file."""
    spec = load_spec(ROOT / "configs" / "amp-homo-gpt2.yaml")
    e = estimate(spec, pp=2, dp=8, tmp=1, mbs=1, partition="uniform")
    (tmp_path / "hf").write_text("".join(f"gpu-{i}.example.org slots=4\n" for i in range(4)))
    ex = export_strategy(spec, e.strategy, fmt="deepspeed", estimate=e,
                         hostfile=parse_hostfile(tmp_path / "hf"))
    assert not ex.placeholder_hosts and ex.hosts == {i: f"gpu-{i}.example.org"
                                                     for i in range(4)}
    text = "".join(f.text for f in ex.files)
    assert "node-0" not in text and "gpu-3.example.org slots=4" in text
    launch = next(f.text for f in ex.files if f.path == "launch.sh")
    assert "--include gpu-0.example.org:0,1,2,3@gpu-1.example.org:0,1,2,3@" in launch
    assert "--no_ssh_check" not in launch


def test_loopback_hostfile_exports_local_per_node_scripts(tmp_path):
    """A hostfile of loopback addresses (two "nodes" of this machine): each launch-node<i>.sh
    is the torchrun `launch --launcher torchrun` starts here for node i, without ssh, and the
    notes say all ranks run on this machine."""
    from amp_search.records import Strategy

    (tmp_path / "spec.yaml").write_text((ROOT / "configs" / "cpu-tiny.yaml").read_text()
                                        .replace("count: 1\n      gpus_per_node: 4",
                                                 "count: 2\n      gpus_per_node: 2"))
    spec = load_spec(tmp_path / "spec.yaml")
    (tmp_path / "hf").write_text("127.0.0.1 slots=2\n127.0.0.2 slots=2\n")
    s = Strategy(pp=2, dp=2, tmp=1, mbs=2, global_batch_size=8, partition=(0, 3, 6),
                 placement=(((0,), (1,)), ((2,), (3,))))
    ex = export_strategy(spec, s, fmt="deepspeed", hostfile=parse_hostfile(tmp_path / "hf"),
                         master_port=29611)
    assert ex.hosts == {0: "127.0.0.1", 1: "127.0.0.2"} and not ex.placeholder_hosts
    assert any("loopback addresses (127.0.0.1, 127.0.0.2)" in n for n in ex.notes)
    out = tmp_path / "ds"
    write_export(ex, out)
    _, files = _launcher_dry_run(spec, out, tmp_path, launcher="torchrun", master_port=29611)
    commands = json.loads(files["commands.json"])["commands"]
    assert [c["host"] for c in commands] == ["127.0.0.1", "127.0.0.2"]
    for i, c in enumerate(commands):
        assert c["argv"][0] != "ssh" and "ssh" not in (out / f"launch-node{i}.sh").read_text()
        got, _ = _exec_argv(out / f"launch-node{i}.sh")
        assert _normalised(got) == _normalised(c["argv"])
        assert got[got.index("--node-rank") + 1] == str(i)
        assert got[got.index("--master-addr") + 1] == "127.0.0.1"
