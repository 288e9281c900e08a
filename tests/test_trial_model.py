"""amp_search.trial.model: the built layers hold exactly cost_models.layers.param_count
parameters per tensor rank, for tmp 1 and 2, and the simulated shard matches the real one."""
from __future__ import annotations

import os
import tempfile

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("megatron.core")

from cost_models.layers import Layer, param_count  # noqa: E402
from amp_search.trial import model as trial_model  # noqa: E402

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


def _tp2_rows(rank: int) -> list:
    rows = []
    for layer in LAYERS:
        m = trial_model.build_layer(layer, tp_size=2)
        x = trial_model.example_inputs(layer, 2)
        trial_model.forward_backward(m, layer, x)  # the real collectives run
        rows.append({"count": trial_model.parameter_count(m), "shapes": _shapes(m)})
    return rows


@pytest.fixture(scope="module")
def tp2_rows():
    from two_ranks import on_two_ranks

    return on_two_ranks(_tp2_rows)


@pytest.fixture(scope="module")
def single():
    trial_model.init_single_process_parallel()


@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.name)
def test_param_count_tmp1(single, layer):
    m = trial_model.build_layer(layer, tp_size=1)
    assert trial_model.parameter_count(m) == param_count(layer, 1)
    out = trial_model.forward_backward(m, layer, trial_model.example_inputs(layer, 2))
    assert torch.isfinite(out)


def test_param_count_tmp2(tp2_rows):
    for rank_rows in tp2_rows:
        for layer, row in zip(LAYERS, rank_rows):
            assert row["count"] == param_count(layer, 2), layer.name


@pytest.mark.parametrize("k", [2, 4])
@pytest.mark.parametrize("layer", LAYERS, ids=lambda l: l.name)
def test_simulated_shard_counts(layer, k):
    m = trial_model.build_layer(layer, simulate_tp_size=k)
    assert trial_model.parameter_count(m) == param_count(layer, k)
    out = trial_model.forward_backward(m, layer, trial_model.example_inputs(layer, 2))
    assert torch.isfinite(out)


def test_simulated_shapes_equal_real_tp2_shapes(tp2_rows):
    for layer, row in zip(LAYERS, tp2_rows[0]):
        sim = {n: list(s) for n, s in _shapes(trial_model.build_layer(layer, simulate_tp_size=2)).items()}
        assert sorted(sim.values()) == sorted(row["shapes"].values()), layer.name


def test_activation_shapes_batch_first(single):
    for layer in LAYERS:
        m = trial_model.build_layer(layer)
        inputs = trial_model.example_inputs(layer, 3)
        out = m(inputs[0])
        if layer.kind == "head":
            assert tuple(out.shape) == (3, S, V)
        else:
            assert tuple(out.shape) == (3, S, H)


def test_custom_layer_rejected():
    layer = Layer(kind="custom", seq_length=S, custom_forward_flops=1e6, custom_params=10,
                  custom_output_elements=S * H, name="odd")
    with pytest.raises(trial_model.UnsupportedLayer, match="custom"):
        trial_model.build_layer(layer, simulate_tp_size=1)


def test_bf16_precision_dtype():
    m = trial_model.build_layer(LAYERS[1], simulate_tp_size=2, precision="bf16")
    assert all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_tp_size_must_match_group(single):
    with pytest.raises(ValueError, match="tensor-parallel group has 1"):
        trial_model.build_layer(LAYERS[1], tp_size=2)


# ----------------------------------------------------------------------------- SP, selective

CHAIN = [
    Layer(kind="embedding", seq_length=S, hidden_size=H, vocab_size=V, name="embedding"),
    Layer(kind="transformer", seq_length=S, hidden_size=H, num_attention_heads=A,
          ffn_hidden_size=F_, name="block0"),
    Layer(kind="mlp", seq_length=S, hidden_size=96, ffn_hidden_size=F_, input_hidden_size=H,
          name="mlp-in64"),
    Layer(kind="transformer", seq_length=S, hidden_size=96, num_attention_heads=A,
          ffn_hidden_size=F_, name="block1"),
    Layer(kind="head", seq_length=S, hidden_size=96, vocab_size=V, name="head"),
]
"""A chain of every kind, with an input projection (h 64 -> 96)."""


def _chain_loss_and_grads(rank, tp, *, sequence_parallel, selective):
    """Forward and backward of the CHAIN on fixed tokens; (loss, {param: grad})."""
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, V, (2, S), generator=g)
    labels = torch.randint(0, V, (2, S), generator=g)
    mods = []
    for i, layer in enumerate(CHAIN):
        torch.manual_seed(100 + i)      # megatron draws the master weight: same on any tp
        mods.append(trial_model.build_layer(layer, tp_size=tp, sequence_parallel=sequence_parallel,
                                  selective_recompute=selective))
    x, shapes = ids, []
    for m in mods:
        x = m(x)
        shapes.append(tuple(x.shape))
    loss = trial_model.lm_loss(x, labels)
    loss.backward()
    grads = {f"{i}.{n}": p.grad.clone() for i, m in enumerate(mods)
             for n, p in m.named_parameters()}
    grads["shapes"] = torch.tensor(shapes)
    return loss.item(), grads


def _knobs_worker(rank: int, store: str, out_dir: str) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(2, 1)
    out = {}
    for name, sp, sel in (("tp2", False, False), ("tp2-sp", True, False),
                          ("tp2-sel", False, True), ("tp2-sp-sel", True, True)):
        out[name] = _chain_loss_and_grads(rank, 2, sequence_parallel=sp, selective=sel)
    torch.save(out, os.path.join(out_dir, f"knobs{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def knob_runs():
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        store = os.path.join(d, "store")
        mp.spawn(_knobs_worker, args=(store, d), nprocs=2, join=True)
        return [torch.load(os.path.join(d, f"knobs{r}.pt")) for r in range(2)]


def test_sequence_parallel_and_selective_change_nothing_but_memory(knob_runs):
    """tmp = 2 over gloo: the loss and every gradient on every rank are the same with and
    without sequence parallelism and selective recomputation (only where tensors live and
    what is recomputed differ); the replicated weights' gradients, all-reduced over the tensor
    group under sequence parallelism, agree across the ranks."""
    for rank in knob_runs:
        loss, grads = rank["tp2"]
        for name in ("tp2-sp", "tp2-sel", "tp2-sp-sel"):
            other_loss, other = rank[name]
            assert other_loss == pytest.approx(loss, rel=1e-6), name
            assert other.keys() == grads.keys()
            for k in grads:
                if k != "shapes":
                    torch.testing.assert_close(other[k], grads[k], rtol=1e-4, atol=1e-6,
                                               msg=f"{name} {k}")
    # with sequence parallelism the activations between layers are [s/2, b, h] shards
    assert knob_runs[0]["tp2"][1]["shapes"].tolist()[:4] == [[2, S, H], [2, S, H], [2, S, 96],
                                                            [2, S, 96]]
    assert knob_runs[0]["tp2-sp"][1]["shapes"].tolist()[:4] == [[S // 2, 2, H],
                                                               [S // 2, 2, H],
                                                               [S // 2, 2, 96],
                                                               [S // 2, 2, 96]]
    # LayerNorm weights are replicated: identical gradients on both tensor ranks
    for k, gr in knob_runs[0]["tp2-sp"][1].items():
        if ".ln" in k:
            torch.testing.assert_close(gr, knob_runs[1]["tp2-sp"][1][k])


def test_selective_recompute_single_rank_matches(single):
    loss, grads = _chain_loss_and_grads(0, 1, sequence_parallel=False, selective=False)
    loss2, grads2 = _chain_loss_and_grads(0, 1, sequence_parallel=True, selective=True)
    assert loss2 == pytest.approx(loss, rel=1e-6)
    for k in grads:
        torch.testing.assert_close(grads2[k], grads[k])
    assert grads2["shapes"].tolist()[1] == [2, S, H]    # no sequence parallelism at tmp 1
