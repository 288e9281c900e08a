"""Predicted vs measured memory of the real trial model (the requirement: "nothing it proposes
runs out of memory").

    python benchmarks/memory_accuracy.py            # larger model; exits 1 if a part is off > 5 %
    python benchmarks/memory_accuracy.py --quick    # the small model tests/test_memory.py uses
    python benchmarks/memory_accuracy.py --knobs-only [--quick]
                                      # only the sequence-parallel / selective-recompute cases

What runs: the DeepSpeed engine that `amp_search.trial.run` builds (the PipelineModule split at
the plan's boundaries over megatron-core tensor-parallel layers; the plain engine for pp = 1 with
ZeRO 2/3), its `ds_config`, its synthetic data, on gloo CPU processes of this machine. Each group
of cases with the same (pp, dp, tmp) runs in one set of `pp*dp*tmp` processes.

What is measured, per rank, in the second training iteration (optimizer states exist by then):

- parameter bytes: the storages behind the module's parameters (ZeRO 1/2: DeepSpeed's flat
  low-precision buffers, padding included; ZeRO 3: each rank's partitions `ds_tensor`, the
  weights gathered whole, and the flat buffer of a coalesced all-gather while it is unpacked);
- optimizer bytes: the fp32 master weights and the Adam moments (and step counters);
- gradient bytes: every other tensor the optimizer wrapper and the parameters hold
  (`param.grad`, flat accumulators, gradient partitions, fp32 gradients of the step);
- buffer bytes: DeepSpeed's gradient-reduction bucket (ZeRO 1-3);
  these four are sampled at the end of every backward, before and after the gradient
  reduction, around the optimizer step (and with ZeRO 3 after every layer's forward and every
  all-gather); the largest value of each is kept;
- activation bytes per micro-batch: what autograd saves for backward during one micro-batch's
  forward, through `torch.autograd.graph.saved_tensors_hooks`, each storage counted once (views
  share one), parameters left out, plus the block inputs DeepSpeed's activation checkpointing
  keeps outside autograd (`ctx.deepspeed_saved_tensors`); the loss belongs to the last stage;
- activation peak: the most such bytes alive at once over the iteration (1F1B keeps several
  micro-batches in flight; recomputation rebuilds one block in backward);
- pipeline buffers: the stage outputs the pipeline engine keeps in `pipe_buffers['outputs']`,
  storages already counted as saved left out.

Sequence parallelism and selective recomputation (Korthikanti et al. 2022) are measured in
their own cases (`knob_cases`): the trial layers' sequence-parallel path (activations as
[s/t, b, h] shards, all-gather / reduce-scatter over gloo) at tmp 2, alone, with full
recomputation, with selective recomputation, under ZeRO 1/2, and with pp 2 (shards in the
pipeline buffers); selective recomputation (the attention core under a reentrant checkpoint)
at tmp 1 and 2. The trial layers run a fused attention kernel (scaled_dot_product_attention),
so selective recomputation saves its log-sum-exp only here: the a s^2 score terms of standard
attention are not exercised by any CPU trial.

DeepSpeed's reduce bucket defaults to 5e8 elements, more than these models and, at ZeRO 2, more
than this machine's memory (two fp32 processes were killed for lack of memory), so the cases
set smaller buckets (QUICK_BUCKETS, LARGE_BUCKETS) and the prediction uses the same values.
Each part is compared with cost_models.memory for the most loaded rank of each stage; the test
(tests/test_memory.py) runs a few small cases through the same functions.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import weakref
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from cost_models import activations  # noqa: E402

from cost_models import memory as MEM  # noqa: E402
from cost_models.layers import Layer  # noqa: E402

TOLERANCE = 0.05
"""Largest relative error accepted for any part (the memory model's accuracy requirement)."""
PARTS = ("parameter_bytes", "gradient_bytes", "optimizer_bytes", "buffer_bytes",
         "activation_bytes_per_microbatch", "activation_peak_bytes", "pipeline_buffer_bytes")


# ----------------------------------------------------------------------------- cases

def gpt_layers(*, num_layers: int, hidden: int, heads: int, seq: int, vocab: int,
               ffn: int = 0, hidden_dropout: float = 0.0) -> tuple[Layer, ...]:
    """The gpt preset's chain: embedding, blocks, head (as amp_search.spec builds it)."""
    block = dict(kind="transformer", seq_length=seq, hidden_size=hidden,
                 num_attention_heads=heads, ffn_hidden_size=ffn or 4 * hidden,
                 hidden_dropout=hidden_dropout)
    return ((Layer(kind="embedding", seq_length=seq, hidden_size=hidden, vocab_size=vocab,
                   name="embedding", hidden_dropout=hidden_dropout),)
            + tuple(Layer(**block, name=f"block{i}") for i in range(num_layers))
            + (Layer(kind="head", seq_length=seq, hidden_size=hidden, vocab_size=vocab,
                     name="head"),))


@dataclass(frozen=True, kw_only=True)
class Case:
    """One strategy to measure: degrees, micro-batching, ZeRO, recomputation, precision."""

    pp: int
    dp: int
    tmp: int
    mbs: int
    gas: int
    zero_stage: int
    recompute: bool
    precision: str
    partition: tuple[int, ...]
    buckets: MEM.ZeroBuckets = field(default_factory=MEM.ZeroBuckets)
    sequence_parallel: bool = False
    selective: bool = False
    """Selective recomputation (the attention core only)."""
    """DeepSpeed bucket sizes; the measuring runs set small ones (QUICK_BUCKETS, LARGE_BUCKETS)."""

    @property
    def world(self) -> tuple[int, int, int]:
        return self.pp, self.dp, self.tmp

    def label(self) -> str:
        return (f"pp{self.pp}dp{self.dp}tmp{self.tmp}-mbs{self.mbs}x{self.gas}-"
                f"z{self.zero_stage}{'-ckpt' if self.recompute else ''}"
                f"{'-sel' if self.selective else ''}{'-sp' if self.sequence_parallel else ''}"
                f"-{self.precision}")

    def to_dict(self) -> dict:
        return {**self.__dict__, "partition": list(self.partition),
                "buckets": dict(self.buckets.__dict__)}

    @classmethod
    def from_dict(cls, d: dict) -> "Case":
        return cls(**{**d, "partition": tuple(d["partition"]),
                      "buckets": MEM.ZeroBuckets(**d["buckets"])})


def cases_for(layers: tuple[Layer, ...], *, worlds, precisions=("fp32", "bf16"), mbs=2, gas=3,
              partitions: dict | None = None, buckets: MEM.ZeroBuckets) -> list[Case]:
    """Every case DeepSpeed and the trial runner allow for the given (pp, dp, tmp) worlds:
    ZeRO 0-3 (2/3 only with pp = 1), recomputation on/off (off only with ZeRO 2/3 at pp = 1,
    where the trial runner trains a plain engine without it)."""
    out = []
    L = len(layers)
    for pp, dp, tmp in worlds:
        part = (partitions or {}).get(pp) or tuple(round(j * L / pp) for j in range(pp + 1))
        for prec in precisions:
            for z in (0, 1, 2, 3):
                if not MEM.zero_allowed(pp, z):
                    continue
                for ck in ((False,) if z >= 2 else (False, True)):
                    out.append(Case(pp=pp, dp=dp, tmp=tmp, mbs=mbs, gas=gas, zero_stage=z,
                                    recompute=ck, precision=prec, partition=tuple(part),
                                    buckets=buckets))
    return out


def knob_cases(layers: tuple[Layer, ...], *, worlds, precisions=("fp32", "bf16"), mbs=2, gas=3,
               buckets: MEM.ZeroBuckets) -> list[Case]:
    """Sequence parallelism (tmp > 1) alone, with full or selective recomputation, under ZeRO
    1 (and 2 at pp = 1); selective recomputation alone at every world."""
    out = []
    L = len(layers)
    for pp, dp, tmp in worlds:
        part = tuple(round(j * L / pp) for j in range(pp + 1))
        kw = dict(pp=pp, dp=dp, tmp=tmp, mbs=mbs, gas=gas, partition=part, buckets=buckets)
        for prec in precisions:
            out.append(Case(zero_stage=0, recompute=False, selective=True, precision=prec,
                            **kw))
            if tmp == 1:
                continue
            out += [Case(zero_stage=0, recompute=False, sequence_parallel=True,
                         precision=prec, **kw),
                    Case(zero_stage=0, recompute=True, sequence_parallel=True, precision=prec,
                         **kw),
                    Case(zero_stage=1, recompute=False, selective=True, sequence_parallel=True,
                         precision=prec, **kw)]
            if pp == 1:
                out.append(Case(zero_stage=2, recompute=False, sequence_parallel=True,
                                precision=prec, **kw))
    return out


# ----------------------------------------------------------------------------- prediction

def predict(case: Case, layers: tuple[Layer, ...], stage: int) -> dict:
    """cost_models.memory's numbers for the device of `stage`, part by part."""
    mine = layers[case.partition[stage]:case.partition[stage + 1]]
    states = MEM.stage_bytes(mine, stage=stage, pp=case.pp, dp=case.dp, tmp=case.tmp,
                             mbs=case.mbs, gas=case.gas, zero_stage=case.zero_stage,
                             recompute=case.recompute, precision=case.precision,
                             buckets=case.buckets, sequence_parallel=case.sequence_parallel,
                             selective=case.selective)
    g = MEM.BYTES_PER_ELEMENT[case.precision]
    kw = dict(mbs=case.mbs, tmp=case.tmp, bytes_per_element=g)
    sp = dict(sequence_parallel=case.sequence_parallel)
    return {
        **{k: v for k, v in states.to_dict().items() if k != "activation_bytes"},
        "activation_bytes_per_microbatch": sum(
            activations.layer_activation_bytes(x, recompute=case.recompute, selective=case.selective,
                                       **sp, **kw) for x in mine),
        "activation_peak_bytes": activations.stage_saved_activation_bytes(
            mine, stage=stage, pp=case.pp, gas=case.gas, recompute=case.recompute,
            selective=case.selective, **sp, **kw),
        "pipeline_buffer_bytes": activations.pipeline_buffer_bytes(
            mine, stage=stage, pp=case.pp, gas=case.gas,
            pipelined=MEM.pipeline_engine(pp=case.pp, zero_stage=case.zero_stage), **kw),
    }


# ----------------------------------------------------------------------------- measuring

def _storage(t):
    """(key, bytes) of a tensor's storage; None for meta / empty tensors."""
    if t.device.type == "meta":
        return None
    st = t.untyped_storage()
    if st.nbytes() == 0:
        return None
    return st.data_ptr(), st.nbytes()


class _Saved:
    """A tensor saved for backward, wrapped so that we notice when autograd frees it."""
    __slots__ = ("t", "__weakref__")

    def __init__(self, t):
        self.t = t


class SavedMeter:
    """Bytes saved for backward by autograd, each storage counted once while it is alive.

    `label` names the layer running; `record` says whether new storages are added to
    `by_label` (one micro-batch's forward); `live` and `peak` follow every storage."""

    def __init__(self, parameter_storages):
        self.parameter_storages = parameter_storages  # () -> set of data_ptrs to leave out
        self.refs: dict[int, int] = {}
        self.nbytes: dict[int, int] = {}
        self.live = 0
        self.peak = 0
        self.label = "?"
        self.record = False
        self.by_label: dict[str, int] = defaultdict(int)

    def _pack(self, t):
        import torch
        if isinstance(t, torch.nn.Parameter):
            return t
        s = _storage(t)
        if s is None or s[0] in self.parameter_storages():
            return t
        key, nb = s
        if self.refs.get(key, 0) == 0:
            self.nbytes[key] = nb
            self.live += nb
            self.peak = max(self.peak, self.live)
            if self.record:
                self.by_label[self.label] += nb
        self.refs[key] = self.refs.get(key, 0) + 1
        box = _Saved(t)
        weakref.finalize(box, self._release, key)
        return box

    def _release(self, key):
        self.refs[key] -= 1
        if self.refs[key] == 0:
            del self.refs[key]
            self.live -= self.nbytes.pop(key)

    @staticmethod
    def _unpack(x):
        return x.t if isinstance(x, _Saved) else x

    def hooks(self):
        import torch
        return torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)

    def keep(self, tensors) -> list:
        """Count tensors kept for backward outside autograd's saved-tensor mechanism (DeepSpeed's
        CheckpointFunction keeps its inputs as `ctx.deepspeed_saved_tensors`); they stay counted
        while the returned boxes live."""
        return [self._pack(t) for t in tensors]


def _count_checkpoint_inputs(meter: SavedMeter):
    """Make DeepSpeed's activation checkpointing report the block inputs it keeps."""
    from deepspeed.runtime.activation_checkpointing import checkpointing as ck
    fn = ck.CheckpointFunction
    if getattr(fn, "_amp_counted", None) is not None:
        fn._amp_counted[0] = meter
        return
    forward, backward = fn.forward, fn.backward
    current = [meter]

    def counted_forward(ctx, run_function, all_outputs, *args):
        out = forward(ctx, run_function, all_outputs, *args)
        ctx.amp_boxes = current[0].keep(ctx.deepspeed_saved_tensors or ())
        return out

    def counted_backward(ctx, *grads):
        out = backward(ctx, *grads)
        ctx.amp_boxes = None
        return out
    fn.forward, fn.backward = staticmethod(counted_forward), staticmethod(counted_backward)
    fn._amp_counted = current


def _walk(obj, out: list, seen: set, depth: int = 0) -> None:
    """Every tensor reachable from a DeepSpeed optimizer object (lists, dicts, attributes)."""
    import torch
    if depth > 8 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        out.append(obj)
        if obj.grad is not None:
            out.append(obj.grad)
        return
    if isinstance(obj, dict):
        for v in list(obj.values()):
            _walk(v, out, seen, depth + 1)
    elif isinstance(obj, (list, tuple, set)):
        for v in list(obj):
            _walk(v, out, seen, depth + 1)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)) and \
            type(obj).__module__.split(".")[0] == "deepspeed":
        for v in list(vars(obj).values()):
            _walk(v, out, seen, depth + 1)


def census(engine) -> dict:
    """Bytes of the model states the engine holds now, by part (unique storages)."""
    import torch
    params = list(engine.module.parameters())
    par: dict[int, int] = {}
    for p in params:
        for t in (getattr(p, "ds_tensor", None), p.data):
            s = _storage(t) if isinstance(t, torch.Tensor) else None
            if s:
                par[s[0]] = s[1]
    opt = engine.optimizer
    inner = [o for o in (getattr(opt, "optimizer", None), getattr(engine, "basic_optimizer", None),
                         opt) if o is not None and hasattr(o, "state")]
    optim: dict[int, int] = {}
    for o in {id(o): o for o in inner}.values():
        for g in o.param_groups:
            for p in g["params"]:
                s = _storage(p)
                if s and s[0] not in par:
                    optim[s[0]] = s[1]
        for st in o.state.values():
            for v in st.values():
                s = _storage(v) if isinstance(v, torch.Tensor) else None
                if s:
                    optim[s[0]] = s[1]
    # fp32 master weights, also when the wrapper has swapped them out of param_groups
    for name in ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat",
                 "fp32_groups_flat_partition"):
        for t in getattr(opt, name, None) or ():
            s = _storage(t) if isinstance(t, torch.Tensor) else None
            if s and s[0] not in par:
                optim[s[0]] = s[1]
    buckets: dict[int, int] = {}
    for t in _bucket_tensors(opt):
        s = _storage(t)
        if s and s[0] not in par and s[0] not in optim:
            buckets[s[0]] = s[1]
    found: list = []
    _walk(opt, found, set())
    own = [t for p in params for t in (p.grad, getattr(p, "grad_accum", None)) if t is not None]
    zero3 = hasattr(opt, "fp32_partitioned_groups_flat")
    if zero3:
        # ZeRO 3 holds gradients in two known places; what else it holds are weights being
        # gathered (all-gather buffers that become param.data)
        own += [opt.grad_partitions_flat_buffer] + [
            t.grad for t in opt.fp32_partitioned_groups_flat if t.grad is not None] + [
            p.grad for o in inner for g in o.param_groups for p in g["params"]
            if p.grad is not None]
    grads: dict[int, int] = {}
    for t in own + ([] if zero3 else found):
        s = _storage(t)
        if s and s[0] not in par and s[0] not in optim and s[0] not in buckets:
            grads[s[0]] = s[1]
    if zero3:
        for t in found:
            s = _storage(t)
            if s and s[0] not in optim and s[0] not in buckets and s[0] not in grads:
                par[s[0]] = s[1]
    out = {"parameter_bytes": sum(par.values()), "optimizer_bytes": sum(optim.values()),
           "gradient_bytes": sum(grads.values()), "buffer_bytes": sum(buckets.values())}
    return out


def _bucket_tensors(opt):
    """DeepSpeed's reduction buckets (ZeRO 1/2 `ipg_buckets[dtype].buffer`, ZeRO 3's flat
    `__ipg_bucket_flat_buffer`)."""
    import torch
    for b in (getattr(opt, "ipg_buckets", None) or {}).values():
        yield from (t for t in getattr(b, "buffer", []) if isinstance(t, torch.Tensor))
    for name, v in vars(opt).items():
        if "ipg_bucket_flat_buffer" in name and isinstance(v, torch.Tensor):
            yield v


def _watch_zero3_gathers(engine, samples: dict, measuring: list) -> None:
    """After every ZeRO 3 coalesced all-gather (partition_parameters.py
    AllGatherCoalescedHandle.wait copies each weight out of one flat buffer), add up the
    weight storages alive: partitions, gathered weights and that flat buffer."""
    from deepspeed.runtime.zero import partition_parameters as pp_
    cls = pp_.AllGatherCoalescedHandle
    if not hasattr(cls, "_amp_wait"):
        cls._amp_wait = cls.wait
        cls._amp_watchers = []

        def wait(self, *a, **k):
            out = cls._amp_wait(self, *a, **k)
            for watch in cls._amp_watchers:
                watch(self)
            return out
        cls.wait = wait

    def watch(handle):
        if not measuring[0]:
            return
        held = {}
        for p in engine.module.parameters():
            for t in (p.ds_tensor, p.data):
                s = _storage(t)
                if s:
                    held[s[0]] = s[1]
        for t in getattr(handle, "partitions", None) or ():
            s = _storage(t)
            if s:
                held[s[0]] = s[1]
        samples["parameter_bytes"] = max(samples["parameter_bytes"], sum(held.values()))
    cls._amp_watchers[:] = [watch]


def _trial_config(case: Case, layers):
    """The TrialConfig the launcher would write for this case (one device per rank)."""
    from amp_search.records import Strategy
    from amp_search.trial.config import TrialConfig, ds_config
    from amp_search.trial.ranks import assign_ranks
    pp, dp, tmp = case.world
    placement = tuple(tuple(tuple((j * dp + r) * tmp + t for t in range(tmp)) for r in range(dp))
                      for j in range(pp))
    s = Strategy(pp=pp, dp=dp, tmp=tmp, mbs=case.mbs, global_batch_size=case.mbs * case.gas * dp,
                 partition=case.partition, placement=placement, zero_stage=case.zero_stage,
                 activation_checkpointing=case.recompute, selective_recompute=case.selective,
                 sequence_parallel=case.sequence_parallel)
    n = pp * dp * tmp
    ranks = assign_ranks(s, {d: (0, d) for d in range(n)}, {0: "localhost"})
    config = ds_config(s, precision=case.precision)
    config["zero_optimization"].update(case.buckets.ds_config())
    return TrialConfig(layers=tuple(layers), strategy=s, ranks=ranks,
                       launch_order=tuple(range(n)), precision=case.precision, device="cpu",
                       iters=2, warmup=1, ds_config=config)


def _setup_process(pp: int, tmp: int) -> None:
    """torch.distributed (gloo) + DeepSpeed + megatron parallel_state, as the trial runner."""
    import torch.distributed as dist
    importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None
    import deepspeed
    from megatron.core import parallel_state
    # a file the world's ranks meet at (measure's AMP_MEMORY_STORE): no port that another
    # process (a concurrent test's trial) may take between choosing it and binding it
    store = os.environ.get("AMP_MEMORY_STORE")
    if store:
        dist.init_process_group("gloo", init_method=f"file://{store}",
                                rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo", init_method="env://")
    deepspeed.init_distributed(dist_backend="gloo")
    parallel_state.initialize_model_parallel(tmp, pp, create_gloo_process_groups=False)


def measure_rank(case: Case, layers) -> dict:
    """Build the trial engine for `case`, train two iterations, return this rank's numbers."""
    import gc

    import deepspeed
    import torch
    import torch.distributed as dist

    from amp_search.trial import run as R
    cfg = _trial_config(case, layers)
    torch.manual_seed(cfg.seed)
    pipelined = not (case.pp == 1 and case.zero_stage >= 2)
    module = R._pipeline_module(cfg) if pipelined else R._Sequential.build(cfg)
    engine, *_ = deepspeed.initialize(
        model=module, model_parameters=[p for p in module.parameters() if p.requires_grad],
        config=cfg.ds_config, mpu=None if pipelined else R._TensorMPU())
    rank = dist.get_rank()
    me = cfg.ranks[rank]
    data = R._Data(cfg, me.replica)

    def param_storages():
        return {p.data.untyped_storage().data_ptr() for p in engine.module.parameters()}

    meter = SavedMeter(param_storages)
    _count_checkpoint_inputs(meter)
    if pipelined:
        local_layers = layers[module._local_start:module._local_stop]
        funcs = engine.module.forward_funcs
    else:
        local_layers = layers
        funcs = list(engine.module.layers)
    for f, layer in zip(funcs, local_layers):
        f.register_forward_pre_hook(lambda m, i, name=layer.name: setattr(meter, "label", name))

    samples: dict[str, int] = defaultdict(int)
    pipe_peak = [0]

    def sample(point):
        for k, v in census(engine).items():
            samples[k] = max(samples[k], v)

    def wrap(obj, name, before=None, after=None):
        fn = getattr(obj, name)

        def wrapped(*a, **k):
            if before:
                before()
            out = fn(*a, **k)
            if after:
                after()
            return out
        setattr(obj, name, wrapped)

    measuring = [False]

    def on(point):
        def hook():
            if measuring[0]:
                sample(point)
        return hook

    def stop_recording():
        meter.record = False

    def pipe_buffers():
        if not measuring[0]:
            return
        seen = {}
        for t in engine.pipe_buffers.get("outputs", []):
            for x in (t if isinstance(t, (tuple, list)) else (t,)):
                s = _storage(x) if isinstance(x, torch.Tensor) else None
                if s and s[0] not in meter.refs:   # not already counted as saved
                    seen[s[0]] = s[1]
        pipe_peak[0] = max(pipe_peak[0], sum(seen.values()))

    if pipelined:
        # the pipeline engine dispatches through a class-level table of functions
        from deepspeed.runtime.pipe import schedule as S
        table = engine._INSTRUCTION_MAP = dict(type(engine)._INSTRUCTION_MAP)

        def instr(kind, before=None, after=None):
            fn = table[kind]

            def wrapped(self, **kw):
                if before:
                    before()
                out = fn(self, **kw)
                if after:
                    after()
                return out
            table[kind] = wrapped
        instr(S.ForwardPass, after=stop_recording)
        instr(S.BackwardPass, before=pipe_buffers, after=on("backward"))
        instr(S.ReduceGrads, before=on("reduce"), after=on("reduced"))
        instr(S.OptimizerStep, before=on("step"), after=on("stepped"))
    else:
        wrap(engine, "allreduce_gradients", before=on("reduce"), after=on("reduced"))
        wrap(engine, "_take_model_step", before=on("step"), after=on("stepped"))
    wrap(engine.basic_optimizer, "step", before=on("inner_step"))
    if case.zero_stage == 3:
        # weights gathered during forward: sample after each layer, and right after each
        # coalesced all-gather, when its flat buffer and the weights copied out of it coexist
        def gathered(*_):
            if measuring[0]:
                sample("forward")
        for f in funcs:
            f.register_forward_hook(gathered)
        _watch_zero3_gathers(engine, samples, measuring)

    def iteration():
        if pipelined:
            engine.train_batch(data_iter=data)
            return
        for mb in range(case.gas):
            ids, labels = next(data)
            loss = engine(ids, labels)
            stop_recording()
            engine.backward(loss)
            sample("backward") if measuring[0] else None
            engine.step()

    iteration()                      # first iteration: optimizer states get created
    measuring[0] = True
    meter.record = True
    meter.by_label.clear()
    with meter.hooks():
        meter.peak = meter.live
        iteration()
    result = {
        "rank": rank, "stage": me.stage, "replica": me.replica, "tensor": me.tensor,
        "optimizer": type(engine.optimizer).__name__,
        **{k: int(v) for k, v in samples.items()},
        "activation_bytes_per_microbatch": int(sum(meter.by_label.values())),
        "activation_by_layer": dict(meter.by_label),
        "activation_peak_bytes": int(meter.peak),
        "pipeline_buffer_bytes": int(pipe_peak[0]),
    }
    if hasattr(engine, "destroy"):
        engine.destroy()
    del engine, module
    gc.collect()
    return result


def _worker(job_path: str) -> None:
    """One process of a measuring group: every case of the job, results as JSON lines."""
    job = json.loads(Path(job_path).read_text())
    layers = tuple(Layer(**x) for x in job["layers"])
    cases = [Case.from_dict(c) for c in job["cases"]]
    pp, dp, tmp = cases[0].world
    _setup_process(pp, tmp)
    import torch.distributed as dist
    rank = dist.get_rank()
    out = []
    for c in cases:
        r = measure_rank(c, layers)
        r["case"] = c.to_dict()
        out.append(r)
    Path(f"{job['out']}.{rank}").write_text(json.dumps(out))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(cases: list[Case], layers, *, timeout_s: float = 1800) -> list[dict]:
    """Run the cases, grouped by world, each group in its own set of processes; returns one
    record per (case, rank)."""
    groups: dict = defaultdict(list)
    for c in cases:
        groups[c.world].append(c)
    records = []
    with tempfile.TemporaryDirectory(prefix="amp-memory-") as tmp:
        for world, group in groups.items():
            n = world[0] * world[1] * world[2]
            job = Path(tmp) / f"job-{'x'.join(map(str, world))}.json"
            out = str(job.with_suffix(""))
            job.write_text(json.dumps({"layers": [x.__dict__ for x in layers],
                                       "cases": [c.to_dict() for c in group], "out": out}))
            port = _free_port()
            procs = []
            for r in range(n):
                env = {**os.environ, "RANK": str(r), "LOCAL_RANK": str(r),
                       "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
                       "AMP_MEMORY_STORE": str(job.with_suffix(".store")),
                       "DS_ACCELERATOR": "cpu", "PYTHONWARNINGS": "ignore",
                       "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--worker", str(job)], env=env,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
            logs = []
            for p in procs:
                try:
                    logs.append(p.communicate(timeout=timeout_s)[0])
                except subprocess.TimeoutExpired:
                    for q in procs:
                        q.kill()
                    raise RuntimeError(f"measuring world {world} timed out after {timeout_s} s")
            if any(p.returncode for p in procs):
                bad = next(i for i, p in enumerate(procs) if p.returncode)
                raise RuntimeError(f"measuring world {world}: rank {bad} failed:\n"
                                   + logs[bad][-4000:])
            for r in range(n):
                records += json.loads(Path(f"{out}.{r}").read_text())
    return records


# ----------------------------------------------------------------------------- comparing

@dataclass
class Row:
    case: str
    stage: int
    part: str
    predicted: int
    measured: int

    @property
    def error(self) -> float:
        if self.measured == 0:
            return 0.0 if self.predicted == 0 else float("inf")
        return (self.predicted - self.measured) / self.measured


def compare(records: list[dict], layers) -> list[Row]:
    """One row per (case, stage, part): the prediction against the largest measured value
    over the stage's ranks (the planner's 'most loaded device of the stage')."""
    by: dict = defaultdict(list)
    for r in records:
        by[(json.dumps(r["case"], sort_keys=True), r["stage"])].append(r)
    rows = []
    for (key, stage), recs in sorted(by.items()):
        c = json.loads(key)
        case = Case.from_dict(c)
        pred = predict(case, layers, stage)
        for part in PARTS:
            rows.append(Row(case=case.label(), stage=stage, part=part, predicted=int(pred[part]),
                            measured=max(int(r.get(part, 0)) for r in recs)))
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'case':38s} {'stage':>5s} {'part':32s} {'predicted':>12s} {'measured':>12s} "
             f"{'error':>8s}"]
    for r in rows:
        err = "" if r.measured == 0 and r.predicted == 0 else f"{100 * r.error:+7.2f}%"
        lines.append(f"{r.case:38s} {r.stage:5d} {r.part:32s} {r.predicted:12d} "
                     f"{r.measured:12d} {err:>8s}")
    return "\n".join(lines)


def failures(rows: list[Row], tolerance: float = TOLERANCE) -> list[Row]:
    return [r for r in rows if abs(r.error) > tolerance]


# ----------------------------------------------------------------------------- main

QUICK = dict(num_layers=2, hidden=64, heads=4, seq=32, vocab=512)
"""The small model of tests/test_memory.py."""
LARGE = dict(num_layers=4, hidden=512, heads=8, seq=256, vocab=8192)
"""The benchmark's model: vocabulary large enough that the head's logits matter."""
QUICK_BUCKETS = MEM.ZeroBuckets(reduce_bucket_elements=50_000, allgather_bucket_elements=50_000,
                                stage3_prefetch_elements=20_000,
                                stage3_persistence_threshold=1_000)
"""Smaller than the model, so that several buckets fill in one backward (DeepSpeed's defaults,
5e8 elements, are larger than these models and than this machine's memory at ZeRO 2)."""
LARGE_BUCKETS = MEM.ZeroBuckets(reduce_bucket_elements=2_000_000,
                                allgather_bucket_elements=2_000_000,
                                stage3_prefetch_elements=1_000_000,
                                stage3_persistence_threshold=10_000)
QUICK_WORLDS = ((1, 2, 1), (2, 1, 1), (1, 1, 2))
LARGE_WORLDS = ((1, 2, 1), (2, 1, 1), (1, 1, 2), (2, 2, 1))
KNOB_WORLDS = ((1, 1, 2), (2, 1, 2), (1, 2, 1))
"""Sequence parallelism at tmp 2 (one stage; two stages, whose buffers hold shards) and
selective recomputation at tmp 1 and 2."""


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="the small model of the test")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--json", type=Path, help="also write the rows as JSON here")
    ap.add_argument("--knobs-only", action="store_true",
                    help="only the sequence-parallel and selective-recomputation cases")
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args.worker)
        return 0
    layers = gpt_layers(**(QUICK if args.quick else LARGE))
    buckets = QUICK_BUCKETS if args.quick else LARGE_BUCKETS
    cases = [] if args.knobs_only else cases_for(
        layers, worlds=QUICK_WORLDS if args.quick else LARGE_WORLDS, buckets=buckets)
    cases += knob_cases(layers, worlds=KNOB_WORLDS, buckets=buckets)
    rows = compare(measure(cases, layers), layers)
    print(table(rows))
    bad = failures(rows)
    if args.json:
        args.json.write_text(json.dumps([r.__dict__ | {"error": r.error} for r in rows],
                                        indent=1))
    print(f"\n{len(rows)} comparisons, {len(bad)} off by more than {100 * TOLERANCE:.0f}%")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
