"""Hidden dropout (model.hidden_dropout, Megatron-LM's --hidden-dropout): which layers take it,
the masks it keeps, the bytes it moves, the arguments it is run with, and the spec errors.
The real trial engine's masks: tests/test_memory.py."""
from __future__ import annotations

import pytest

from amp_search.cli import main
from amp_search.errors import SpecError
from amp_search.launch.megatron import megatron_args
from amp_search.model_spec import parse_model
from amp_search.planner import estimate
from amp_search.spec import parse_spec
from cost_models.activations import layer_saved_bytes
from cost_models.layers import elementwise_bytes, model_param_count
from cost_models.recompute import replicated_elementwise_bytes


NODE = {"gpu": "A100-80GB", "count": 1, "gpus_per_node": 2, "intra_node_bandwidth": "300 GB/s",
        "inter_node_bandwidth": "200 Gbps"}


def _model(**kw):
    return {"preset": "gpt", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4,
            "seq_length": 128, "vocab_size": 512, **kw}


def test_dropout_is_on_the_embedding_and_blocks_only():
    m = parse_model(_model(hidden_dropout=0.1))
    assert [(x.kind, x.hidden_dropout, x.dropout_masks) for x in m.layers] == [
        ("embedding", 0.1, 1), ("transformer", 0.1, 2), ("transformer", 0.1, 2),
        ("head", 0.0, 0)]
    plain = parse_model(_model())
    assert all(x.hidden_dropout == 0.0 and x.dropout_masks == 0 for x in plain.layers)
    # it changes no parameter, and a profile of a block without dropout is not one with it
    assert model_param_count(m.layers) == model_param_count(plain.layers)
    assert m.layers[1].signature == plain.layers[1].signature + ":dropout"
    layers = parse_model({"preset": "layers", "seq_length": 64, "hidden_dropout": 0.2,
                          "layers": [{"kind": "embedding", "hidden_size": 64, "vocab_size": 128},
                                     {"kind": "mlp", "hidden_size": 64},
                                     {"kind": "head", "hidden_size": 64, "vocab_size": 128}]})
    assert [x.dropout_masks for x in layers.layers] == [1, 1, 0]


@pytest.mark.parametrize("value", [1, 1.5, -0.1, "0.1", True])
def test_bad_dropout_names_the_key(value):
    with pytest.raises(SpecError, match=r"model.hidden_dropout: got .*expected a number from 0 "
                                        r"up to \(not including\) 1"):
        parse_model(_model(hidden_dropout=value))


def test_bad_dropout_is_one_line_and_exit_2(write_spec, capsys):
    path = write_spec({"cluster": {"nodes": [NODE]},
                       "model": _model(hidden_dropout=2),
                       "training": {"global_batch_size": 8}})
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "model.hidden_dropout" in err


def test_each_mask_is_a_byte_per_element_split_by_sequence_parallelism():
    m, plain = parse_model(_model(hidden_dropout=0.1)), parse_model(_model())
    s, h = 128, 256
    kw = dict(mbs=2, bytes_per_element=2)
    for x, y in zip(m.layers, plain.layers):
        for tmp, sp in ((1, False), (2, False), (2, True)):
            more = layer_saved_bytes(x, tmp=tmp, sequence_parallel=sp, **kw) \
                - layer_saved_bytes(y, tmp=tmp, sequence_parallel=sp, **kw)
            assert more == x.dropout_masks * s * h * 2 // (tmp if sp else 1), (x.kind, tmp, sp)
    # the eager trial layer's dropout reads its input and writes its output and mask
    block, bare = m.layers[1], plain.layers[1]
    assert elementwise_bytes(block, 1, 2) - elementwise_bytes(bare, 1, 2) == 2 * 5 * s * h
    assert replicated_elementwise_bytes(block, 2) - replicated_elementwise_bytes(bare, 2) \
        == 2 * 5 * s * h


def test_a_plan_with_dropout_holds_more_and_megatron_runs_it():
    def spec(**kw):
        return parse_spec({"cluster": {"nodes": [NODE]},
                           "model": _model(**kw),
                           "training": {"global_batch_size": 8, "backend": "megatron",
                                        "precision": "bf16"}})
    kw = dict(pp=1, dp=1, tmp=2, mbs=2, zero_stage=1, activation_checkpointing="none",
              sequence_parallel=False)
    with_masks, without = estimate(spec(hidden_dropout=0.1), **kw), estimate(spec(), **kw)
    grew = with_masks.memory[0].activation_bytes - without.memory[0].activation_bytes
    assert grew == (2 * 2 + 1) * 128 * 256 * 2       # 5 masks, mbs 2, one micro-batch held
    args = megatron_args(spec(hidden_dropout=0.1).model.layers, with_masks.strategy,
                         precision="bf16", iters=2, seed=1)
    assert args[args.index("--hidden-dropout") + 1] == "0.1"
    assert args[args.index("--attention-dropout") + 1] == "0"
