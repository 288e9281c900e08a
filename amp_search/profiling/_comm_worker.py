"""One rank of the link sweep, started by torchrun from `profile_comm`:
`python -m amp_search.profiling._comm_worker JOB.json` (the job file says what to measure;
rank 0 writes the samples to job['out'])."""
from __future__ import annotations

import json
import sys
from datetime import timedelta


def main(argv: list[str]) -> int:
    import torch
    import torch.distributed as dist

    from .comm import sweep

    job = json.loads(open(argv[0]).read())
    torch.set_num_threads(1)
    dist.init_process_group(job["backend"], timeout=timedelta(minutes=10))
    if job["device"] == "cuda":
        import os
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    try:
        samples = sweep(sizes=job["sizes"], collectives=job["collectives"],
                        warmup=job["warmup"], repeats=job["repeats"],
                        device=job["device"],
                        progress=job["progress"])
        hosts = [None] * dist.get_world_size()
        dist.all_gather_object(hosts, __import__("socket").gethostname())
        if dist.get_rank() == 0:
            with open(job["out"], "w") as f:
                json.dump({"world_size": dist.get_world_size(), "nodes": len(set(hosts)),
                           "samples": [s.to_dict() for s in samples]}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
