"""Uneven model chunks for a model whose blocks split evenly on no pipeline (DeepSeek-V3 with
its multi-token prediction: 61 blocks, then the MTP block and two losses): the chunks the
search and `estimate` give it, and the layout `export` writes for Megatron-LM."""
from __future__ import annotations

import json

import pytest

from amp_search.export import export_strategy
from amp_search.planner import estimate
from amp_search.spec import parse_spec
from cost_models.pipeline import (balanced_chunks, interleaved_split, interleaved_virtual_stages,
                                  needs_uneven_chunks)


def _deepseek(**training):
    return parse_spec({
        "cluster": {"nodes": [{"gpu": "GB200-186GB", "count": 4, "gpus_per_node": 64,
                               "intra_node_bandwidth": "900 GB/s",
                               "inter_node_bandwidth": "64 x 400 Gbps"}]},
        "model": {"preset": "deepseek-v3", "mtp_num_layers": 1},
        "training": {"global_batch_size": 4096, "precision": "fp8", "backend": "megatron",
                     **training}})


def test_which_chains_need_uneven_chunks():
    assert needs_uneven_chunks(65, first=1, last=3)         # DeepSeek-V3 + MTP: 61 blocks
    assert not needs_uneven_chunks(63, first=1, last=1)     # 61 + E + L: 63 = 3 x 21 layers
    assert not needs_uneven_chunks(82, first=1, last=1)     # Llama 3 70B
    assert not needs_uneven_chunks(5, first=1, last=1)      # 3 blocks: no pipeline of chunks
    # the even forms come first; 'layout' only where neither exists on any pipeline
    assert interleaved_split(82, 32, first=1, last=1) is None
    assert interleaved_split(65, 16, first=1, last=3) == "layout"
    assert interleaved_split(65, 62, first=1, last=3) is None       # more chunks than blocks
    assert interleaved_virtual_stages(65, first=1, last=3, most=8) == (1, 2, 4, 8)
    assert interleaved_virtual_stages(82, first=1, last=1, most=8) == (1, 2, 4, 5, 8)


def test_balanced_chunks_are_as_even_as_whole_blocks_make_them():
    # every block alike, no ends: as even as can be (a tie stops a chunk: the last is larger)
    assert balanced_chunks([1.0] * 10, 3) == (0, 3, 6, 10)
    assert balanced_chunks([1.0] * 12, 4) == (0, 3, 6, 9, 12)
    # a heavy head: its chunk takes fewer blocks; every chunk one block at least
    b = balanced_chunks([0, 1, 1, 1, 1, 1, 1, 1, 5], 4, first=1, last=1)
    assert b[0] == 0 and b[-1] == 9 and all(y - x >= 1 for x, y in zip(b, b[1:]))
    assert b[-1] - b[-2] == 2                           # [1 block + head]
    with pytest.raises(ValueError):
        balanced_chunks([1.0] * 5, 6)


def test_deepseek_v3_runs_its_recipes_layout_and_exports_it(tmp_path):
    """pp 4 x v 4 (Megatron-Bridge's GB200 recipe): [E + 4], 14 x [4], [1 + MTP + losses],
    the layout the recipe writes ("Et*4|(t*4|)*14tmL"), in `estimate` without a partition
    given, and in the arguments `export` writes."""
    spec = _deepseek()
    assert spec.training.virtual_pipeline_stages == (1, 2, 4, 8)
    e = estimate(spec, pp=4, dp=64, tmp=1, mbs=1, ep=64, virtual_stages=4, zero_stage=1,
                 activation_checkpointing="full")
    sizes = [b - a for a, b in zip(e.strategy.partition, e.strategy.partition[1:])]
    assert sizes == [5] + [4] * 14 + [4]        # layers: E + 4 blocks, ..., 1 block + MTP + 2
    ex = export_strategy(spec, e.strategy, fmt="megatron", estimate=e, iters=10, warmup=5)
    args = json.loads(next(f.text for f in ex.files if f.path == "megatron_args.json"))
    layout = args[args.index("--pipeline-model-parallel-layout") + 1]
    assert layout == "Et*4|" + "t*4|" * 14 + "tmL"
    assert "--num-layers-per-virtual-pipeline-stage" not in args
