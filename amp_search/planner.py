"""The planner: AMP's Algorithm 1 with a memory model, exact fast layer assignment and NIC
sharing.

    spec -> CostModel (cluster arrays, layer times per device type)
         -> enumerate (pp, dp, tmp, mbs, zero, recompute)      [prunes counted by reason]
         -> place (Megatron order over 3 node orders)
         -> partition (exact DP, amp_search.partition)
         -> cost (AMP eq. 4-5 + TP/DP/P2P terms) + memory
         -> rank                                             => Plan
"""
from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cost_models import comm as C
from cost_models import memory as M
from cost_models.compute import backward_with_recompute_s
from cost_models.layers import output_elements, param_count, tp_allreduce_elements
from cost_models.params import CostParams

from .errors import AmpSearchError, UsageError
from .memory import stage_memory, zero_allowed
from .partition import optimal_partition, uniform_partition
from .placement import DeviceOrder, as_tuple, device_orders, megatron_placement
from .records import Breakdown, Estimate, Plan, Strategy
from .spec import PROFILES_DIR, Spec
from .timing import LayerTimer
from .topology import ClusterArrays, p2p_links, ring_links


class NoFeasibleStrategy(AmpSearchError):
    """Every candidate was pruned; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """A point of the search space before placement and partition."""

    pp: int
    dp: int
    tmp: int
    mbs: int
    zero_stage: int
    activation_checkpointing: bool


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class CostModel:
    """Everything about a spec that does not depend on the strategy, computed once; then
    `evaluate()` costs one strategy in well under a millisecond plus its DP."""

    def __init__(self, spec: Spec, *, cost_params: CostParams | None = None,
                 profile_dir: Path | None = PROFILES_DIR / "measured"):
        self.spec = spec
        if cost_params is not None:
            self.params, self.params_source = cost_params, "given"
        else:
            self.params, self.params_source = _calibration(spec, profile_dir)
        self.timer = LayerTimer(spec, profile_dir)
        self.cluster = ClusterArrays.of(spec.cluster)
        # measured links (amp-search profile-comm) replace the nominal bandwidths
        self.link_fits = _link_fits(spec, None if profile_dir is None
                                    else Path(profile_dir).parent / "comm")
        self.cluster_for = {k: self.cluster.with_links(*self.link_fits.get(k, (None, None)))
                            for k in ("all_reduce", "p2p")}
        self.link_source = self.link_fits.get("source", "nominal")
        layers = spec.model.layers
        self.num_layers = len(layers)
        bpe = spec.training.bytes_per_element
        self.gpus = sorted({d.gpu.name: d.gpu for d in spec.cluster.devices}.values(),
                           key=lambda g: g.name)
        index = {g.name: i for i, g in enumerate(self.gpus)}
        self.gpu_of_device = np.array([index[d.gpu.name] for d in spec.cluster.devices])
        # per sample: P2P bytes leaving layer l, TP all-reduce bytes and message count of layer l
        self.out_bytes = np.array([output_elements(l) * bpe for l in layers], dtype=float)
        self.tp_bytes = np.array([sum(tp_allreduce_elements(l)) * bpe for l in layers],
                                 dtype=float)
        self.tp_messages = np.array([len(tp_allreduce_elements(l)) for l in layers], dtype=float)
        self._params: dict[int, np.ndarray] = {}
        self._mem_cache: dict = {}
        self._placement_cache: dict = {}
        self.capacity_bytes = np.array([d.gpu.memory_bytes for d in spec.cluster.devices],
                                       dtype=float)
        self.first_fixed = sum(1 for _ in _leading(layers, "embedding"))
        self.last_fixed = sum(1 for _ in _leading(reversed(layers), "head"))

    def latency(self, collective: str, link: str) -> float:
        """Calibrated latency plus the measured per-message latency of the link, if any."""
        fit = self.link_fits.get(collective, (None, None))[0 if link == "intra" else 1]
        return self.params.latency(link) + (fit.alpha_s if fit is not None else 0.0)

    def params_per_layer(self, tmp: int) -> np.ndarray:
        if tmp not in self._params:
            self._params[tmp] = np.array([param_count(l, tmp) for l in self.spec.model.layers],
                                         dtype=float)
        return self._params[tmp]

    # ------------------------------------------------------------------ one strategy
    def evaluate(self, c: Candidate, order: DeviceOrder | None = None, *,
                 placement: np.ndarray | None = None,
                 partition: str | tuple[int, ...] = "optimal") -> Estimate:
        """Cost one strategy: placement from `order` (Megatron's mapping) or given; partition
        'optimal' (exact DP), 'uniform' (Megatron) or explicit boundaries."""
        spec, p = self.spec, self.params
        gbs = spec.training.global_batch_size
        gas = gbs // (c.dp * c.mbs)
        if placement is None:
            placement, placement_tuple, stage_gpus = self._placement(order, c)
        else:
            placement_tuple = as_tuple(placement)
            stage_gpus = [np.unique(self.gpu_of_device[placement[j]]) for j in range(c.pp)]
        L = self.num_layers
        link_scale = dict(intra_scale=p.bandwidth("intra"), inter_scale=p.bandwidth("inter"))

        # t[j, l]: compute of layer l for one micro-batch on stage j's slowest device type
        compute = np.zeros((c.pp, L))
        for j in range(c.pp):
            for g in stage_gpus[j]:
                gpu = self.gpus[g]
                fwd, bwd = self.timer.times(gpu, c.tmp, c.mbs)
                back = backward_with_recompute_s(fwd, bwd) if c.activation_checkpointing \
                    else bwd
                np.maximum(compute[j], (fwd + back) * p.compute(gpu.name), out=compute[j])

        # tensor-parallel all-reduces inside each layer, on the stage's slowest tensor ring
        tp = np.zeros((c.pp, L))
        if c.tmp > 1:
            rings = ring_links(self.cluster_for["all_reduce"], placement, **link_scale)
            bw = rings.bandwidth_bytes_per_s.min(axis=1)                        # [stage]
            lat = np.where(rings.crosses_nodes.any(axis=1), self.latency("all_reduce", "inter"),
                           self.latency("all_reduce", "intra"))
            n = c.tmp
            tp = (2 * (n - 1) / n * self.tp_bytes[None, :] * c.mbs / bw[:, None]
                  + self.tp_messages[None, :] * 2 * (n - 1) * lat[:, None])

        # e[j, i]: P2P into stage j when it starts at layer i: activation forward + gradient
        # backward, each crossing once outside the steady state (AMP eq. 5, sum of e_i)
        cut = np.zeros((c.pp, L + 1))
        if c.pp > 1:
            links = p2p_links(self.cluster_for["p2p"], placement, **link_scale)
            lat = np.where(links.crosses_nodes, self.latency("p2p", "inter"),
                           self.latency("p2p", "intra"))
            for j in range(1, c.pp):
                cut[j, 1:L] = 2 * (self.out_bytes[:L - 1] * c.mbs
                                   / links.bandwidth_bytes_per_s[j - 1] + lat[j - 1])

        stage_layer = compute + tp
        sync_layer, sync_fixed = self._dp_sync_arrays(c, placement, gas, link_scale)
        # after the sync each stage steps its optimizer once per iteration
        opt_layer = self._optimizer_arrays(c, stage_gpus)
        sync_layer = sync_layer + opt_layer
        if isinstance(partition, tuple):
            bounds = partition
        elif partition == "uniform":
            bounds = uniform_partition(L, c.pp, first=self.first_fixed, last=self.last_fixed)
        else:
            mem_layer, mem_budget = self._memory_arrays(c, gas, placement)
            result = optimal_partition(stage_layer, cut, gas, sync_layer_s=sync_layer,
                                       sync_fixed_s=sync_fixed, memory_layer_bytes=mem_layer,
                                       memory_budget_bytes=mem_budget)
            if result is None:      # no split fits: report the fastest one, which won't fit
                result = optimal_partition(stage_layer, cut, gas, sync_layer_s=sync_layer,
                                           sync_fixed_s=sync_fixed)
            bounds = result.boundaries

        prefix_c = np.concatenate([np.zeros((c.pp, 1)), np.cumsum(compute, axis=1)], axis=1)
        prefix_t = np.concatenate([np.zeros((c.pp, 1)), np.cumsum(tp, axis=1)], axis=1)
        js = np.arange(c.pp)
        lo, hi = np.array(bounds[:-1]), np.array(bounds[1:])
        stage_compute = prefix_c[js, hi] - prefix_c[js, lo] + p.microbatch_overhead_s
        stage_tp = prefix_t[js, hi] - prefix_t[js, lo]
        stage_time = stage_compute + stage_tp
        cuts = cut[js[1:], lo[1:]] if c.pp > 1 else np.zeros(0)
        b = int(np.argmax(stage_time))
        pipeline_s = (gas - 1) * stage_time[b] + cuts.sum() + stage_time.sum()   # eq. 5

        # AMP eq. 4, second term: the slowest stage's data-parallel sync (and optimizer step)
        prefix_s = np.concatenate([np.zeros((c.pp, 1)), np.cumsum(sync_layer, axis=1)], axis=1)
        prefix_o = np.concatenate([np.zeros((c.pp, 1)), np.cumsum(opt_layer, axis=1)], axis=1)
        stage_after = sync_fixed + prefix_s[js, hi] - prefix_s[js, lo]
        s_b = int(np.argmax(stage_after))
        opt_s = float(prefix_o[s_b, hi[s_b]] - prefix_o[s_b, lo[s_b]])
        dp_s = float(stage_after[s_b]) - opt_s
        strategy = Strategy(pp=c.pp, dp=c.dp, tmp=c.tmp, mbs=c.mbs, global_batch_size=gbs,
                            partition=tuple(int(x) for x in bounds),
                            placement=placement_tuple,
                            placement_order=order.name if order is not None else "given",
                            zero_stage=c.zero_stage,
                            activation_checkpointing=c.activation_checkpointing)
        total = pipeline_s + dp_s + opt_s + p.step_overhead_s                   # eq. 4
        breakdown = Breakdown(
            compute_s=float(gas * stage_compute[b] + p.step_overhead_s),
            pipeline_bubble_s=float(stage_time.sum() - stage_time[b]),
            p2p_s=float(cuts.sum()), tensor_parallel_s=float(gas * stage_tp[b]),
            data_parallel_s=dp_s, optimizer_s=opt_s)
        return Estimate(strategy=strategy, iteration_time_s=float(total), breakdown=breakdown,
                        stage_time_s=tuple(float(x) for x in stage_time),
                        memory=stage_memory(self.spec, strategy),
                        timing_sources=tuple(f"{k}={v}" for k, v in
                                             sorted(self.timer.sources().items()))
                        + (f"links={self.link_source}", f"coefficients={self.params_source}"))

    def _placement(self, order: DeviceOrder, c: Candidate) -> tuple:
        """Megatron placement over `order`, as an array and as the record's tuple, with the GPU
        types of each stage; cached, since mbs, ZeRO and recomputation do not change it."""
        key = (order.name, c.pp, c.dp, c.tmp)
        hit = self._placement_cache.get(key)
        if hit is None:
            placement = megatron_placement(order, c.pp, c.dp, c.tmp)
            hit = (placement, as_tuple(placement),
                   [np.unique(self.gpu_of_device[placement[j]]) for j in range(c.pp)])
            self._placement_cache[key] = hit
        return hit

    def _memory_arrays(self, c: Candidate, gas: int, placement: np.ndarray
                       ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Memory as the partition DP needs it, additive over a stage's layers:
        mem[j, l] = state bytes per parameter * params_l + in-flight micro-batches of stage j *
        layer l's saved activations, against budget[j] = usable capacity of stage j's smallest
        device - framework overhead - ZeRO bucket - pipeline buffers - recomputation working
        set. It linearises amp_search.memory.stage_memory (ZeRO padding, the largest straddling
        gradient), which then checks the chosen split exactly."""
        if c.pp == 1:
            return None, None
        key = (c.tmp, c.dp, c.mbs, gas, c.zero_stage, c.activation_checkpointing)
        if key not in self._mem_cache:
            self._mem_cache[key] = _layer_memory(self.spec, c, gas)
        per_layer, act, fixed, out_buffer, head_buffer = self._mem_cache[key]
        js = np.arange(c.pp)
        inflight = np.array([M.in_flight_microbatches(j, c.pp, gas) for j in js], dtype=float)
        mem = per_layer[None, :] + inflight[:, None] * act[None, :]
        capacity = self.capacity_bytes[placement.reshape(c.pp, -1)].min(axis=1)
        buffers = np.array([min(max(2, min(c.pp - j, gas)), gas) for j in js], dtype=float)
        pipe = buffers * out_buffer
        pipe[-1] = buffers[-1] * head_buffer
        return mem, capacity * (1.0 - self.spec.training.memory_headroom) - fixed - pipe

    def _optimizer_arrays(self, c: Candidate, stage_gpus) -> np.ndarray:
        """opt[j, l]: one optimizer step over layer l's parameters on stage j's slowest device
        type, split over the data-parallel ranks when the optimizer partitions its states
        (ZeRO 1-3, and DeepSpeed's BF16_Optimizer)."""
        engine = M.deepspeed_engine(zero_stage=c.zero_stage,
                                    precision=self.spec.training.precision)
        share = c.dp if M.partitions_optimizer(engine) else 1
        opt = np.zeros((c.pp, self.num_layers))
        for j in range(c.pp):
            for g in stage_gpus[j]:
                gpu = self.gpus[g]
                t = self.timer.optimizer_step_s(gpu, c.tmp) * self.params.compute(gpu.name)
                np.maximum(opt[j], t / share, out=opt[j])
        return opt

    def _dp_sync_arrays(self, c: Candidate, placement: np.ndarray, gas: int,
                        link_scale: dict) -> tuple[np.ndarray, np.ndarray]:
        """The data-parallel sync of stage j is linear in the parameters it holds:
        sync_j = sync_fixed[j] + sum over its layers of sync_layer[j, l] (cost_models.comm,
        on the stage's slowest dp ring, less the part the overlap factor hides)."""
        zeros = np.zeros((c.pp, self.num_layers)), np.zeros(c.pp)
        if c.dp == 1:
            return zeros
        p = self.params
        rings = ring_links(self.cluster_for["all_reduce"], placement.transpose(0, 2, 1),
                           **link_scale)
        bw = rings.bandwidth_bytes_per_s.min(axis=1)
        crosses = rings.crosses_nodes.any(axis=1)
        bpe = self.spec.training.bytes_per_element
        exposed = 1.0 - p.dp_overlap
        bf16_optimizer = M.deepspeed_engine(zero_stage=c.zero_stage,
                                            precision=self.spec.training.precision) \
            == "bf16_optimizer"
        fixed, per_param = np.empty(c.pp), np.empty(c.pp)
        for j in range(c.pp):
            def sync(n_params: float) -> float:
                return C.data_parallel_sync_time_s(
                    param_bytes=n_params * bpe, grad_bytes=n_params * bpe, n=c.dp,
                    bandwidth_bytes_per_s=bw[j],
                    latency_s=self.latency("all_reduce", "inter" if crosses[j] else "intra"),
                    zero_stage=c.zero_stage, gas=gas, gather_weights_after_step=bf16_optimizer)
            fixed[j] = sync(0.0) * exposed
            per_param[j] = sync(1.0) * exposed - fixed[j]
        return per_param[:, None] * self.params_per_layer(c.tmp)[None, :], fixed


def _layer_memory(spec: Spec, c: Candidate, gas: int) -> tuple:
    """Per layer: model-state bytes (the whole model's bytes per parameter times the layer's
    parameters) and saved activation bytes per micro-batch; the fixed bytes per device
    (framework overhead, ZeRO bucket, recomputation working set); per-buffer bytes of a stage
    output and of the head's logits (cost_models.memory)."""
    layers = spec.model.layers
    t = spec.training
    g = t.bytes_per_element
    numels = [M.param_tensor_numels(l, c.tmp) for l in layers]
    flat = tuple(n for ts in numels for n in ts)
    states = M.model_state_bytes(flat, precision=t.precision, zero_stage=c.zero_stage, dp=c.dp,
                                 gas=gas)
    per_param = (states.parameter_bytes + states.gradient_bytes + states.optimizer_bytes) \
        / max(sum(flat), 1)
    per_layer = per_param * np.array([sum(ts) for ts in numels], dtype=float)
    act = np.array([M.layer_activation_bytes(l, mbs=c.mbs, tmp=c.tmp, bytes_per_element=g,
                                             recompute=c.activation_checkpointing)
                    for l in layers], dtype=float)
    fixed = float(t.framework_overhead_bytes + states.buffer_bytes)
    if c.activation_checkpointing:
        fixed += M.recompute_working_set_bytes(layers, mbs=c.mbs, tmp=c.tmp,
                                               bytes_per_element=g)
    out_buffer = g * c.mbs * max(output_elements(l) for l in layers[:-1]) if len(layers) > 1 \
        else 0.0
    last = layers[-1]
    head_buffer = g * c.mbs * last.seq_length * (last.vocab_size // c.tmp) \
        if last.kind == "head" else g * c.mbs * output_elements(last)
    return per_layer, act, fixed, float(out_buffer), float(head_buffer)


def _link_fits(spec: Spec, comm_dir: Path | None) -> dict:
    """collective -> (intra LinkFit | None, inter LinkFit | None) from the newest comm profile
    measured on this cluster's device type (only when every device is of that type: a profile
    of other hardware is never used). Collectives use their alpha-beta fit."""
    names = {d.gpu.name for d in spec.cluster.devices}
    if comm_dir is None or len(names) != 1:
        return {}
    from .profiling.store import find_comm_profile
    profile = find_comm_profile(comm_dir, device=names.pop())
    if profile is None:
        return {}
    fits: dict = {c: (profile.fit(c, "intra"), profile.fit(c, "inter"))
                  for c in ("all_reduce", "p2p")}
    measured = "+".join(profile.links_measured)
    fits["source"] = f"profile:{Path(profile.path).name} ({measured}; rest nominal)"
    return fits


def _leading(layers, kind: str):
    for layer in layers:
        if layer.kind != kind:
            return
        yield layer


# ---------------------------------------------------------------------- enumeration

def enumerate_candidates(spec: Spec, pruned: Counter) -> list[Candidate]:
    """Every (pp, dp, tmp, mbs, zero, recompute) with pp*dp*tmp = #devices; what is dropped
    is counted in `pruned` under its reason."""
    n = spec.cluster.num_devices
    L = spec.model.num_layers
    gbs = spec.training.global_batch_size
    zeros, ckpts = spec.training.zero_stage, spec.training.activation_checkpointing
    knobs = len(zeros) * len(ckpts)
    out = []
    for tmp in divisors(n):
        for pp in divisors(n // tmp):
            dp = n // (tmp * pp)
            if pp > L:
                pruned["pp_exceeds_layers"] += knobs
                continue
            if any(size % tmp for size in spec.model.tp_divisors):
                pruned["tmp_does_not_divide_model"] += knobs
                continue
            if gbs % dp:
                pruned["dp_does_not_divide_batch"] += knobs
                continue
            for mbs in divisors(gbs // dp):
                for z in zeros:
                    for ck in ckpts:
                        if not zero_allowed(pp, z):
                            pruned["zero_2_3_with_pipeline"] += 1
                            continue
                        out.append(Candidate(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=z,
                                             activation_checkpointing=ck))
    return out


def _check_any_degree(spec: Spec, candidates: list[Candidate], pruned: Counter) -> None:
    """A global batch that no feasible dp divides is the user's error, not an empty plan."""
    n, gbs = spec.cluster.num_devices, spec.training.global_batch_size
    if not candidates and pruned.get("dp_does_not_divide_batch"):
        options = sorted({n // (tmp * pp) for tmp in divisors(n) for pp in divisors(n // tmp)
                          if pp <= spec.model.num_layers
                          and not any(s % tmp for s in spec.model.tp_divisors)})
        from .errors import SpecError
        raise SpecError("training.global_batch_size",
                        f"no feasible data-parallel degree divides {gbs}: with {n} devices "
                        f"and {spec.model.num_layers} layers, dp must be one of {options}; "
                        f"use a multiple of one of them")


# ---------------------------------------------------------------------- public API

def plan(spec: Spec, *, progress: bool = False, cost_params: CostParams | None = None,
         profile_dir: Path | None = PROFILES_DIR / "measured") -> Plan:
    """Rank every feasible strategy for `spec` (AMP Algorithm 1, lines 1-7).

    Raises NoFeasibleStrategy when nothing fits, with the prune counts in the message."""
    from tqdm import tqdm

    t0 = time.perf_counter()
    model = CostModel(spec, cost_params=cost_params, profile_dir=profile_dir)
    pruned: Counter = Counter()
    candidates = enumerate_candidates(spec, pruned)
    _check_any_degree(spec, candidates, pruned)
    orders = device_orders(spec.cluster, spec.training.precision)
    best: list[Estimate] = []
    evaluated = 0
    bar = tqdm(candidates, desc="searching", unit="strategy", disable=not progress,
               leave=False, mininterval=0.25)
    for c in bar:
        kept = None
        for order in orders:
            e = model.evaluate(c, order)
            evaluated += 1
            if kept is None or e.iteration_time_s < kept.iteration_time_s:
                kept = e
        if not kept.fits:
            pruned["out_of_memory"] += 1
            continue
        best.append(kept)
    bar.close()
    if not best:
        detail = ", ".join(f"{k}: {v}" for k, v in sorted(pruned.items()))
        raise NoFeasibleStrategy(
            f"no strategy is feasible ({detail}); try training.zero_stage: search, "
            f"training.activation_checkpointing: search, or a smaller global_batch_size")
    best.sort(key=lambda e: e.iteration_time_s)
    baseline = megatron_baseline(spec, model)
    return Plan(strategies=tuple(best), baseline=baseline,
                search_time_s=time.perf_counter() - t0,
                candidates=len(candidates) + sum(pruned.values()) - pruned["out_of_memory"],
                evaluated=evaluated, pruned=dict(pruned))


def megatron_baseline(spec: Spec, model: CostModel) -> Estimate | None:
    """AMP section 4.1: for each mbs, tmp at most the smallest node, the smallest tmp*pp
    that fits, tensor groups inside nodes (listed order), uniform layer split; the fastest
    of those proposals by the cost model."""
    n, gbs = spec.cluster.num_devices, spec.training.global_batch_size
    order = device_orders(spec.cluster, spec.training.precision)[0]
    L = spec.model.num_layers
    zero = spec.training.zero_stage[0]
    best = None
    for ckpt in sorted(set(spec.training.activation_checkpointing)):
        proposals = []
        for product in divisors(n):                      # tmp * pp, smallest first
            for tmp in divisors(product):
                pp = product // tmp
                dp = n // product
                if tmp > spec.cluster.min_gpus_per_node or gbs % dp or \
                        any(s % tmp for s in spec.model.tp_divisors) or \
                        pp > L - model.first_fixed - model.last_fixed or \
                        not zero_allowed(pp, zero):
                    continue
                for mbs in divisors(gbs // dp):
                    c = Candidate(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero,
                                  activation_checkpointing=ckpt)
                    e = model.evaluate(c, order, partition="uniform")
                    if e.fits:
                        proposals.append(e)
            if proposals:
                break
        for e in proposals:
            if best is None or e.iteration_time_s < best.iteration_time_s:
                best = e
        if best is not None:
            return best
    return best


def estimate(spec: Spec, *, pp: int, dp: int, tmp: int, mbs: int,
             partition: str | tuple[int, ...] = "optimal", zero_stage: int | None = None,
             activation_checkpointing: bool | None = None, placement_order: str | None = None,
             cost_params: CostParams | None = None,
             profile_dir: Path | None = PROFILES_DIR / "measured") -> Estimate:
    """Predict one given strategy (the best of the placement orders unless one is named).
    A strategy that does not fit in memory is still estimated, with `fits` False."""
    n, L, gbs = spec.cluster.num_devices, spec.model.num_layers, spec.training.global_batch_size
    for name, v in (("pp", pp), ("dp", dp), ("tmp", tmp), ("mbs", mbs)):
        if not isinstance(v, int) or v < 1:
            raise UsageError(f"--{name} must be a positive integer, got {v!r}")
    if pp * dp * tmp != n:
        raise UsageError(f"pp*dp*tmp = {pp}*{dp}*{tmp} = {pp * dp * tmp}, but the cluster has "
                         f"{n} devices; the product must equal {n}")
    if pp > L:
        raise UsageError(f"--pp {pp} exceeds the model's {L} layers")
    bad = [s for s in spec.model.tp_divisors if s % tmp]
    if bad:
        raise UsageError(f"--tmp {tmp} does not divide the model size {bad[0]} "
                         f"(heads, hidden, ffn and vocab must be divisible by tmp)")
    if gbs % (dp * mbs):
        raise UsageError(f"dp*mbs = {dp * mbs} does not divide global_batch_size {gbs}")
    if isinstance(partition, tuple):
        if len(partition) != pp + 1 or partition[0] != 0 or partition[-1] != L or \
                any(a >= b for a, b in zip(partition, partition[1:])):
            raise UsageError(f"--partition {','.join(map(str, partition))}: expected {pp + 1} "
                             f"strictly increasing boundaries from 0 to {L}")
    elif partition not in ("optimal", "uniform"):
        raise UsageError(f"--partition {partition!r}: accepted: optimal, uniform, or "
                         f"boundaries such as 0,12,{L}")
    zero = spec.training.zero_stage[0] if zero_stage is None else zero_stage
    ckpt = spec.training.activation_checkpointing[0] if activation_checkpointing is None \
        else activation_checkpointing
    if zero not in (0, 1, 2, 3):
        raise UsageError(f"--zero-stage {zero}: accepted: 0, 1, 2, 3")
    model = CostModel(spec, cost_params=cost_params, profile_dir=profile_dir)
    orders = device_orders(spec.cluster, spec.training.precision)
    if placement_order is not None:
        orders = [o for o in orders if o.name == placement_order] or [
            o for o in device_orders(spec.cluster, spec.training.precision)[:1]]
    c = Candidate(pp=pp, dp=dp, tmp=tmp, mbs=mbs, zero_stage=zero,
                  activation_checkpointing=ckpt)
    if partition == "uniform":
        try:
            uniform_partition(L, pp, first=model.first_fixed, last=model.last_fixed)
        except ValueError as exc:
            raise UsageError(f"--partition uniform: {exc}") from None
    return min((model.evaluate(c, o, partition=partition) for o in orders),
               key=lambda e: e.iteration_time_s)


def evaluate(spec: Spec, strategy: Strategy, *, cost_params: CostParams | None = None,
             profile_dir: Path | None = PROFILES_DIR / "measured",
             model: CostModel | None = None) -> Estimate:
    """Predict a fully given Strategy (its own partition and placement), e.g. to compare
    with a measured trial or to fit a calibration. Pass `model` to reuse its caches."""
    if model is None:
        model = CostModel(spec, cost_params=cost_params, profile_dir=profile_dir)
    c = Candidate(pp=strategy.pp, dp=strategy.dp, tmp=strategy.tmp, mbs=strategy.mbs,
                  zero_stage=strategy.zero_stage,
                  activation_checkpointing=strategy.activation_checkpointing)
    return model.evaluate(c, placement=np.array(strategy.placement, dtype=np.int64),
                          partition=tuple(strategy.partition))


def _calibration(spec: Spec, profile_dir: Path | None) -> tuple[CostParams, str]:
    """The calibration stored beside the profiles for this spec's devices, if any."""
    if profile_dir is None:
        return CostParams(), "uncalibrated"
    from .calibrate import calibration_path, find_calibration
    params = find_calibration(spec, Path(profile_dir))
    if params is None:
        return CostParams(), "uncalibrated"
    return params, f"calibration:{calibration_path(spec, Path(profile_dir)).name}"
