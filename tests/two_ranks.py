"""Run a function on two real ranks (two processes over gloo, megatron-core's parallel state at
tp 2, or tp 1) and collect what each returns: the trial-model tests' tp 2 and ep 2 checks."""
from __future__ import annotations

import json
import os
import tempfile


def _worker(rank: int, store: str, out_dir: str, body, tp: int = 2) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(tp, 1)
    result = body(rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def on_two_ranks(body, tp: int = 2) -> list:
    """[rank 0's, rank 1's] JSON-able result of `body(rank)`, a module-level function (it is
    pickled into the two processes); `tp` 1: two data-parallel ranks instead."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(os.path.join(d, "store"), d, body, tp), nprocs=2, join=True)
        return [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
