"""Run a function on two real tensor-parallel ranks (two processes over gloo, megatron-core's
parallel state at tp 2) and collect what each returns: the trial-model tests' tp 2 checks."""
from __future__ import annotations

import json
import os
import tempfile


def _worker(rank: int, store: str, out_dir: str, body) -> None:
    import torch.distributed as dist
    from megatron.core import parallel_state

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    parallel_state.initialize_model_parallel(2, 1)
    result = body(rank)
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def on_two_ranks(body) -> list:
    """[rank 0's, rank 1's] JSON-able result of `body(rank)`, a module-level function (it is
    pickled into the two processes)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        mp.spawn(_worker, args=(os.path.join(d, "store"), d, body), nprocs=2, join=True)
        return [json.load(open(os.path.join(d, f"rank{r}.json"))) for r in range(2)]
