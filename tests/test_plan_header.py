"""The header `amp-search plan` prints before its table: backend, precision, what was searched
and what was fixed, the baseline's rule, the model's sources, and a warning for a node's
network written as one NIC's."""
from __future__ import annotations

from amp_search.cli import main
from amp_search.cli.plan_header import header_lines
from amp_search.planner import plan, plan_backends
from amp_search.spec import load_spec


def _spec(write_spec, inter="3200 Gbps", **training):
    return write_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": inter}]},
        "model": {"preset": "llama3-8b", "num_layers": 8, "seq_length": 4096},
        "training": {"global_batch_size": 32, "precision": "bf16", **training}})


def test_header_names_backend_precision_space_and_baseline(write_spec):
    path = _spec(write_spec, backend="megatron", zero_stage=1,
                 activation_checkpointing="search")
    spec = load_spec(path)
    lines = header_lines(spec, plan(spec, simulate_top=0), width=80)
    text = " ".join(x.strip() for x in lines)
    assert "16 GPUs, 2 nodes x 8 H100-80GB" in text and "400 Gb/s per GPU" in text
    assert "costed as Megatron-LM (training.backend megatron), precision bf16" in text
    # Megatron-LM searches context parallelism unless the spec fixes it
    assert "searched: pp x dp x tmp x cp over the 16 GPUs" in text
    assert "recomputation none/selective/full" in text
    assert "context parallel 1/2/4/8/16/32" in text
    assert "fixed by the spec or its defaults: ZeRO 1 (the distributed optimizer)" in text
    assert "baseline ('megatron' row" in text and "smallest tmp x pp" in text
    assert "coefficients uncalibrated" in text
    assert "note:" not in text                        # 400 Gb/s of 450 GB/s is a DGX's share
    assert all(len(x) <= 80 for x in lines)


def test_header_warns_of_a_node_network_written_as_one_nic(write_spec):
    spec = load_spec(_spec(write_spec, inter="200 Gbps"))
    text = " ".join(x.strip() for x in header_lines(spec, plan(spec, simulate_top=0)))
    assert "note: the H100-80GB nodes get 25 Gb/s of network per GPU" in text
    assert "'8 x 400 Gbps'" in text
    assert "DeepSpeed's pipeline engine (training.backend not given: deepspeed)" in text


def test_plan_prints_the_header_first_within_the_width(write_spec, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", str(_spec(write_spec)), "--top-k", "2", "--no-simulate"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("plan for ")
    head = out[:out.index("")]
    assert len(head) >= 5 and all(len(x) <= 80 for x in head)


def test_plan_output_fits_80_and_120_columns_and_wide_keeps_every_column(write_spec, capsys,
                                                                         monkeypatch):
    from pathlib import Path

    spec = str(Path(__file__).resolve().parent.parent / "configs" / "amp-hetero-gpt2.yaml")
    for width in (80, 120):
        monkeypatch.setenv("COLUMNS", str(width))
        assert main(["plan", spec, "--top-k", "5", "--no-progress"]) == 0
        out = capsys.readouterr().out.splitlines()
        assert max(map(len, out)) <= width, max(out, key=len)
        head = next(line for line in out if line.lstrip().startswith("rank"))
        assert "iter s" in head and "vs Megatron" in head and "mem GiB" in head
    assert "placement" not in head or width >= 120
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", spec, "--top-k", "5", "--no-progress", "--wide"]) == 0
    out = capsys.readouterr().out.splitlines()
    head = next(line for line in out if line.lstrip().startswith("rank"))
    assert "placement" in head and "layers/stage" in head and len(head) > 80
    assert not any("left out for the terminal" in line for line in out)


def test_model_flops_by_hand_and_the_tflops_column(write_spec, capsys, monkeypatch):
    from cost_models.layers import Layer, model_flops_per_sample

    h, f, s, v, a = 64, 256, 32, 128, 4
    gpt = [Layer(kind="embedding", seq_length=s, hidden_size=h, vocab_size=v),
           Layer(kind="transformer", seq_length=s, hidden_size=h, num_attention_heads=a,
                 ffn_hidden_size=f),
           Layer(kind="head", seq_length=s, hidden_size=h, vocab_size=v)]
    forward = (2 * s * h * 3 * h + 2 * s * h * h + 2 * s * h * f + 2 * s * f * h  # QKV, proj, MLP
               + 4 * s * s * h                                                  # attention core
               + 2 * s * h * v)                                                 # logits
    assert model_flops_per_sample(gpt) == 3 * forward
    from amp_search.cli.plan import format_table

    spec = load_spec(_spec(write_spec))
    e = plan(spec, simulate_top=0).best
    expected = model_flops_per_sample(spec.model.layers) * 32 / e.iteration_time_s / 16 / 1e12
    table = format_table(spec, [("1", e, 1.0)]).splitlines()
    assert "TFLOP/s/GPU" in table[0]
    assert f"  {expected:.4g}  " in table[2]


def test_ties_within_the_models_measured_error_are_marked_and_counted(write_spec, capsys,
                                                                      monkeypatch):
    from amp_search.cli.plan import tie_note, tied_count
    from amp_search.spec import load_catalog

    cat = load_catalog()
    assert cat["A100-80GB"].prediction_error == __import__("pytest").approx(0.063)
    assert "gpu_accuracy.py" in cat["A100-80GB"].prediction_error_source
    # the largest measured on dense runs (DGX B200's)
    assert cat["V100-16GB"].prediction_error == __import__("pytest").approx(0.068)
    assert cat["V100-16GB"].prediction_error == cat["B200-180GB"].prediction_error
    assert "not measured" in cat["V100-16GB"].prediction_error_source
    spec = load_spec(_spec(write_spec))
    model_error = spec.model_error()
    error = model_error.mape
    assert model_error.gpu.name == "H100-80GB" and error == __import__("pytest").approx(0.035)
    assert model_error.kind == "dense" and not model_error.for_experts
    result = plan_backends(spec, simulate_top=0)
    times = [e.iteration_time_s for e in result.strategies]
    limit = times[0] * (1 + error) / (1 - error)
    assert tied_count(result, error) == sum(t <= limit for t in times)
    assert tied_count(result, 0.0) == 1
    note = tie_note(spec, 3, model_error)
    assert "Ranks 1-3 ('~')" in note and "--top-k 3" in note and "±3.5% on H100-80GB" in note
    assert "No other plan" in tie_note(spec, 1, model_error)
    monkeypatch.setenv("COLUMNS", "100")
    assert main(["plan", str(_spec(write_spec)), "--top-k", "5", "--no-simulate"]) == 0
    out = capsys.readouterr().out
    n = tied_count(result, error)
    assert ("Ranks 1-" in out) == (n > 1)
    assert sum(line.lstrip().split(" ")[0].endswith("~") for line in out.splitlines()) == \
        min(n, 5) - 1


def test_a_model_with_experts_ties_within_the_models_error_on_such_models(write_spec,
                                                                           capsys):
    """The catalog keeps a second figure for mixture-of-experts models (`moe:`), larger than
    the dense one where both were measured; a GPU with no such measurement takes the largest
    measured (the catalog's defaults), its own dense figure or not. A plan of a model with
    experts marks its ties, and says so, within that figure; a dense one keeps the dense."""
    import pytest

    from amp_search.cli.plan import tie_note
    from amp_search.spec import load_catalog

    cat = load_catalog()
    h100 = cat["H100-80GB"]
    assert h100.error_of(False) == (h100.prediction_error, h100.prediction_error_source)
    assert h100.error_of(True)[0] == pytest.approx(0.113)
    assert "mixture-of-experts runs on DGX H100" in h100.error_of(True)[1]
    # measured on dense runs only (A100) or on nothing (V100): the largest measured MoE
    # figure (B300's)
    largest = max(g.error_of(True)[0] for g in cat.values()
                  if "not measured" not in g.error_of(True)[1])
    assert largest == cat["B300-288GB"].error_of(True)[0]
    for name in ("A100-80GB", "V100-16GB"):
        assert cat[name].error_of(True)[0] == largest
        assert "not measured" in cat[name].error_of(True)[1]
    assert all(g.error_of(True)[0] >= g.error_of(False)[0] for g in cat.values())
    dense = load_spec(_spec(write_spec))
    moe = load_spec(write_spec({
        "cluster": {"nodes": [{"gpu": "H100-80GB", "count": 2, "gpus_per_node": 8,
                               "intra_node_bandwidth": "450 GB/s",
                               "inter_node_bandwidth": "3200 Gbps"}]},
        "model": {"preset": "qwen3-30b-a3b", "num_layers": 4, "seq_length": 4096},
        "training": {"global_batch_size": 32, "precision": "bf16", "backend": "megatron"}}))
    assert dense.model_error().mape == pytest.approx(0.035)
    error = moe.model_error()
    assert error.gpu.name == "H100-80GB" and error.mape == pytest.approx(0.113)
    assert error.kind == "experts" and error.for_experts
    note = tie_note(moe, 2, error)
    assert "±11.3% on H100-80GB for a model with experts" in note
    assert "mixture-of-experts runs on DGX H100" in note
    assert "for a model with experts" not in tie_note(dense, 2, dense.model_error())
    # the JSON says which error the ties were marked within, and how many there are
    import json

    # (every plan kept, so that each tie is among the strategies written)
    assert main(["plan", str(moe.path), "--no-simulate", "--top-k", "32", "--json", "-"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model_error"]["mape"] == pytest.approx(0.113)
    assert out["model_error"]["kind"] == "experts" and out["model_error"]["gpu"] == "H100-80GB"
    times = [r["iteration_time_s"] for r in out["strategies"]]
    assert out["model_error"]["tied"] == sum(t <= times[0] * 1.113 / 0.887 for t in times)


def test_no_warning_where_the_network_is_written_as_its_nics(write_spec):
    """'8 x 200 Gbps' is a node's eight HDR NICs, written as such: 25 GB/s per GPU, under a
    tenth of NVLink, but what the user meant; the note is for a bandwidth given as one
    figure no larger than one NIC carries (plan_header.ONE_NIC_MAX_BITS_PER_S). How it was
    written does not change the spec's fingerprint."""
    from amp_search.spec import spec_fingerprint

    nics = load_spec(_spec(write_spec, inter="8 x 200 Gbps"))
    text = " ".join(x.strip() for x in header_lines(nics, plan(nics, simulate_top=0)))
    assert "200 Gb/s per GPU" in text and "note:" not in text
    total = load_spec(_spec(write_spec, inter="1600 Gbps"))   # more than one NIC carries
    assert "note:" not in " ".join(header_lines(total, plan(total, simulate_top=0)))
    one = load_spec(_spec(write_spec, inter="200 Gbps"))       # as much as one NIC carries
    assert "note:" in " ".join(header_lines(one, plan(one, simulate_top=0)))
    assert {k: v for k, v in spec_fingerprint(nics).items() if k != "spec_sha256"} == \
        {k: v for k, v in spec_fingerprint(total).items() if k != "spec_sha256"}


def test_the_whole_space_is_searched_by_default(write_spec):
    """A spec that names no knob: ZeRO, recomputation and sequence parallelism are searched
    (and under Megatron-LM its distributed optimizer and virtual stages), as NeMo's
    auto-configurator does; the header says so and the best plan may use any of them."""
    spec = load_spec(_spec(write_spec))
    t = spec.training
    assert t.zero_stage == (0, 1, 2, 3) and t.sequence_parallel == (False, True)
    assert t.activation_checkpointing == ("none", "selective", "full")
    assert t.virtual_pipeline_stages == (1,)         # DeepSpeed has no interleaved schedule
    result = plan(spec, simulate_top=0)
    text = " ".join(x.strip() for x in header_lines(spec, result, width=200))
    assert "ZeRO 0/1/2/3" in text and "recomputation none/selective/full" in text
    assert "sequence parallelism off/on" in text
    knobs = {(e.strategy.zero_stage, e.strategy.recompute, e.strategy.sequence_parallel)
             for e in result.strategies}
    assert len(knobs) > 1                            # the ranking mixes them
    mega = load_spec(_spec(write_spec, backend="megatron"))
    assert mega.training.zero_stage == (0, 1)
    assert len(mega.training.virtual_pipeline_stages) > 1
    text = " ".join(x.strip() for x in header_lines(mega, plan(mega, simulate_top=0), width=200))
    assert "ZeRO 0/1 (the distributed optimizer)" in text and "virtual stages 1/" in text


def test_header_says_deepseek_v3_runs_uneven_chunks(write_spec):
    """Megatron-LM's default searches the virtual stages that split the blocks evenly on some
    pipeline; DeepSeek-V3 with its multi-token prediction has 61 blocks, which split on none,
    so the search tries 2, 4 and 8 uneven chunks per stage (Megatron-LM's
    --pipeline-model-parallel-layout), and the header says so. A model with even splits, or a
    spec that fixes 1, gets no such note."""
    from amp_search.cli.plan_header import _knobs

    def knob(spec):
        return next((values, many) for name, values, many in _knobs(spec)
                    if name == "virtual stages")

    ds = write_spec({
        "cluster": {"nodes": [{"gpu": "GB200-186GB", "count": 4, "gpus_per_node": 64,
                               "intra_node_bandwidth": "900 GB/s",
                               "inter_node_bandwidth": "64 x 400 Gbps"}]},
        "model": {"preset": "deepseek-v3", "mtp_num_layers": 1},
        "training": {"global_batch_size": 2048, "precision": "fp8", "backend": "megatron"}})
    spec = load_spec(ds)
    assert spec.training.virtual_pipeline_stages == (1, 2, 4, 8)
    values, many = knob(spec)
    assert many and values == ("1/2/4/8 (uneven chunks: its 61 blocks split evenly on no "
                               "pipeline; each chunk as even as whole blocks make it by FLOPs, "
                               "Megatron-LM's --pipeline-model-parallel-layout)")
    llama = load_spec(_spec(write_spec, backend="megatron"))
    assert knob(llama)[0] == "/".join(map(str, llama.training.virtual_pipeline_stages))
    assert knob(load_spec(_spec(write_spec))) == ("1", False)      # DeepSpeed
