"""The machine's speed as the trials see it, taken with a layer profile and again before each
trial, so that a prediction carries the machine's speed at the time its trial runs.

On a shared or virtual machine the speed drifts: on the 2-core development VM the same trial
took 0.44 s in one launch and 0.56 s in the next (`benchmarks/accuracy.py` keeps its
trials within 4% of a profile's speed for this reason). A user does not re-profile before
every launch. So `amp-search profile` ends by timing one block layer of the spec's model
(the first transformer or mlp layer; tmp 1, micro-batch `PROBE_MBS`, forward + backward) in as
many processes at once as the node has devices (all of a node's ranks busy, as in a trial),
for `PROBE_SECONDS` each; the mean of their medians is the reference (`SpeedProbe`, stored in
the layer profile). `amp-search launch` takes the same probe before each trial it runs on
this machine and multiplies the device's layer times by now / reference
(`CostParams.compute_scale`) for that trial's prediction. It measures the machine, never the
trial, and it is a ratio of two measurements of the same work.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import asdict

from ..errors import UsageError
from ..spec import Spec
from .store import SpeedProbe, now_iso, worker_env

PROBE_SECONDS = 2.0
"""How long each process times the layer."""
PROBE_MBS = 2
"""The micro-batch of the probe (as benchmarks/accuracy.py's machine-speed probe)."""
SKIP = 3
"""Leading passes left out (first-call allocations)."""


def probe_layer(spec: Spec):
    """The layer the probe times: the model's first transformer or mlp block, else its
    largest layer by forward FLOPs."""
    from cost_models.layers import forward_flops

    layers = spec.model.layers
    for layer in layers:
        if layer.kind in ("transformer", "mlp"):
            return layer
    return max(layers, key=lambda l: forward_flops(l))


def measure_speed(spec: Spec, *, workers: int, seconds: float = PROBE_SECONDS,
                  mbs: int = PROBE_MBS, env: dict | None = None) -> SpeedProbe:
    """Time the probe layer in `workers` CPU processes at once (one thread each); raises
    UsageError if a worker fails. `env`: the environment of the workers (default: this
    process's)."""
    layer = probe_layer(spec)
    job = json.dumps({"layer": asdict(layer), "seconds": seconds, "mbs": mbs,
                      "precision": spec.training.precision})
    child_env = {**worker_env(env), "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    cmd = [sys.executable, "-m", "amp_search.profiling.speed", job]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=child_env, text=True) for _ in range(max(1, workers))]
    try:
        outs = [p.communicate(timeout=seconds + 300) for p in procs]
    except BaseException:
        for p in procs:
            p.kill()
            p.wait()
        raise
    medians = []
    for p, (out, err) in zip(procs, outs):
        words = out.split()
        if p.returncode != 0 or not words:
            last = (err.strip().splitlines() or ["no output"])[-1]
            raise UsageError(f"speed probe failed: {last}")
        medians.append(float(words[-1]))
    return SpeedProbe(ms=sum(medians) / len(medians), workers=len(medians), seconds=seconds,
                      layer=layer.signature, mbs=mbs, created=now_iso())


def _worker(job: dict) -> float:
    """Median ms of forward + backward of the job's layer (one thread)."""
    import torch

    from cost_models.layers import Layer

    from ..trial.model import (TRIAL_PRECISIONS, build_layer, example_inputs,
                               forward_backward, init_single_process_parallel)

    torch.set_num_threads(1)
    layer = Layer(**job["layer"])
    init_single_process_parallel()
    module = build_layer(layer, tp_size=1, precision=job["precision"])
    inputs = example_inputs(layer, int(job["mbs"]), dtype=TRIAL_PRECISIONS[job["precision"]])
    times, end = [], time.monotonic() + float(job["seconds"])
    while time.monotonic() < end or len(times) <= SKIP:
        t0 = time.perf_counter()
        forward_backward(module, layer, inputs)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times[SKIP:])


if __name__ == "__main__":
    print(f"{_worker(json.loads(sys.argv[1])):.4f}")
