"""amp_search.trial.model: the built layers hold exactly cost_models.layers.param_count
parameters per tensor rank, for tmp 1 and 2, and the simulated shard matches the real one."""
from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cost_models.layers import Layer, param_count  # noqa: E402
from amp_search.trial import model as M  # noqa: E402

S, H, A, F_, V = 16, 64, 4, 256, 128
LAYERS = [
    Layer(kind="embedding", seq_length=S, hidden_size=H, vocab_size=V, name="embedding"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          ffn_hidden_size=F_, name="block"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          ffn_hidden_size=F_, input_hidden_size=32, name="block-in32"),
    Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, name="mlp"),
    Layer(kind="mlp", seq_length=S, hidden_size=H, ffn_hidden_size=F_, input_hidden_size=48,
          name="mlp-in48"),
    Layer(kind="head", seq_length=S, hidden_size=H, vocab_size=V, name="head"),
]


def _shapes(module) -> dict:
    return {n: tuple(p.shape) for n, p in module.named_parameters()}


def _tp2_worker(rank: int, store: str, out_dir: str) -> None:
    import json

    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(2, 1)
    rows = []
    for layer in LAYERS:
        m = M.build_layer(layer, tp_size=2)
        x = M.example_inputs(layer, 2)
        M.forward_backward(m, layer, x)  # the real collectives run
        rows.append({"count": M.parameter_count(m), "shapes": _shapes(m)})
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(rows, f)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def tp2_rows():
    import json

    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        mp.spawn(_tp2_worker, args=(store, d), nprocs=2, join=True)
        return [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]


@pytest.fixture(scope="module")
def single():
    M.init_single_process_parallel()


@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.name)
def test_param_count_tmp1(single, layer):
    m = M.build_layer(layer, tp_size=1)
    assert M.parameter_count(m) == param_count(layer, 1)
    out = M.forward_backward(m, layer, M.example_inputs(layer, 2))
    assert torch.isfinite(out)


def test_param_count_tmp2(tp2_rows):
    for rank_rows in tp2_rows:
        for layer, row in zip(LAYERS, rank_rows):
            assert row["count"] == param_count(layer, 2), layer.name


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.name)
def test_simulated_shard_counts(layer, k):
    m = M.build_layer(layer, simulate_tp_size=k)
    assert M.parameter_count(m) == param_count(layer, k)
    out = M.forward_backward(m, layer, M.example_inputs(layer, 2))
    assert torch.isfinite(out)


def test_simulated_shapes_equal_real_tp2_shapes(tp2_rows):
    for layer, row in zip(LAYERS, tp2_rows[0]):
        sim = {n: list(s) for n, s in _shapes(M.build_layer(layer, simulate_tp_size=2)).items()}
        assert sorted(sim.values()) == sorted(row["shapes"].values()), layer.name


def test_activation_shapes_batch_first(single):
    for layer in LAYERS:
        m = M.build_layer(layer)
        inputs = M.example_inputs(layer, 3)
        out = m(inputs[0])
        if layer.kind == "head":
            assert tuple(out.shape) == (3, S, V)
        else:
            assert tuple(out.shape) == (3, S, H)


def test_custom_layer_rejected():
    layer = Layer(kind="custom", seq_length=S, custom_forward_flops=1e6, custom_params=10,
                  custom_output_elements=S * H, name="odd")
    with pytest.raises(M.UnsupportedLayer, match="custom"):
        M.build_layer(layer, simulate_tp_size=1)


def test_bf16_precision_dtype():
    m = M.build_layer(LAYERS[1], simulate_tp_size=2, precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_tp_size_must_match_group(single):
    with pytest.raises(ValueError, match="tensor-parallel group has 1"):
        M.build_layer(LAYERS[1], tp_size=2)
