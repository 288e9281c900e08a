"""The cost model: everything about a spec that does not depend on the strategy, computed
once (`CostModel`), then one strategy costed in well under a millisecond plus its layer
assignment:

    placement      -> PlacedLayout   (each stage's devices and slowest links; costing.links)
    layer times    -> StageCosts     (cost_models' compute, TP/P2P/DP collective and optimizer
                                      terms per [stage, layer]; costing.layer_times)
    partition      -> boundaries     (the exact DP, amp_search.partition, with the memory
                                      budget of costing.stage_memory)
    closed form    -> Estimate       (cost_models.pipeline: AMP eq. 5 and 4)

Used by the planner (amp_search.planner) and the simulator's input builder
(amp_search.simulate) alike; it imports neither.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from cost_models import comm
from cost_models import memory as memory_model
from cost_models import pipeline
from cost_models.compute import (HostCosts, attention_time_s, block_passes,
                                 host_time_by_pass_s, kernel_floor_time_s,
                                 synced_overlapped_time_s, tp_overlap_exposed_s)
from cost_models.layers import (Layer, cp_merge_bytes_by_pass, expert_param_count, forward_flops,
                                kv_elements_per_token, output_elements, param_count,
                                per_distinct_layer, tp_collectives_by_pass)
from cost_models.params import CostParams
from cost_models.recompute import selective_recompute_time_s, sequence_parallel_time_s

from ..errors import UsageError
from ..measurements import NO_MEASUREMENTS, Measurements
from ..partition import interleaved_partition, optimal_partition, uniform_partition
from ..placement import DeviceOrder, as_tuple, megatron_placement
from ..records import Breakdown, Estimate, Strategy, micro_batches, pairs_micro_batches
from ..search_space import Candidate
from ..spec import Spec
from .layer_times import LayerTimer, device_speed
from .links import ClusterArrays, all_to_all_links, p2p_links, ring_links
from .stage_memory import (offloaded_layers, offloaded_saved_bytes, stage_memory,
                           stages_fit)

__all__ = ["CostModel", "PlacedLayout", "StageCosts", "measured_overheads"]

UNSPLITTABLE_CUT_S = 1e6
"""What `CostModel.cut_s` charges a stage boundary Megatron-LM cannot run: inside the
multi-token-prediction module after its first block (its losses stay with the head on the
last stage), so that the partition never chooses it."""


@dataclass(frozen=True)
class StageCosts(pipeline.StageCostArrays):
    """The costs of one strategy on its placement, before the layers are split: entry [j, l]
    is layer l run by pipeline stage j's devices (the slowest device type of the stage). The
    closed form's arrays (cost_models.pipeline.StageCostArrays: layer_s, tensor_parallel_s,
    cut_s, sync_s, sync_fixed_s, optimizer_s and the calibrated overheads), with the device
    and host times they were made of, which the simulator plays pass by pass.

    layer_s is what t_j sums: device compute + tensor-parallel communication, or the host's
    time to issue them where that is longer, the forward and the backward each on its own
    (cost_models.compute.synced_overlapped_time_s). cut_s[j, i] is e, the P2P into stage j
    when it starts at layer i (activation + gradient), paid once by the fill and drain and
    again by each steady-state micro-batch as far as the stage waits for it
    (cost_models.pipeline.pipeline_1f1b_time_s)."""

    compute_s: np.ndarray
    """[pp, L] device time of one micro-batch forward + backward (+ recomputation)."""
    host_s: np.ndarray
    """[pp, L] host time to issue them (analytic times; a measured time holds it already)."""
    host_forward_s: np.ndarray
    """[pp, L] the forward pass's part of host_s."""

    @property
    def after_pipeline_s(self) -> np.ndarray:
        """What eq. 4's second term sums per stage: DP sync + optimizer step."""
        return self.sync_s + self.optimizer_s


@dataclass(frozen=True)
class PlacedLayout:
    """A (pp, dp, tmp) placement and what mbs, ZeRO and recomputation do not change: the
    devices of each stage and, per stage, the slowest link of each traffic kind (computed over
    every device once, then cached: on a million devices that is what costs)."""

    placement: np.ndarray
    """[stage, replica, tensor rank] -> device id."""
    stage_gpus: list
    """Per stage: the indices (into CostModel.gpus) of its device types, ascending, as a
    tuple (a dictionary key)."""
    capacity_bytes: np.ndarray
    """[pp] memory of each stage's smallest device."""
    tp_links: tuple | None
    """(bandwidth [pp], crosses nodes [pp]) of each stage's slowest tensor ring; None: tmp 1."""
    dp_links: tuple | None
    """The same for the data-parallel rings; None: dp 1."""
    p2p_links: tuple | None
    """(bandwidth [pp-1], crosses nodes [pp-1]) of each stage boundary; None: pp 1."""
    tp_kind_links: dict | None = None
    """The tensor rings' links for the collectives with their own measured fit (all-gather,
    reduce-scatter: profile-comm measures each), as tp_links; the others use tp_links."""
    cp_links: tuple | None = None
    """The same for the context-parallel rings (the cp ranks of one data replica and tensor
    rank); None: cp 1."""

    @cached_property
    def placement_tuple(self) -> tuple:
        """`placement` as nested tuples (a Strategy's placement): made for the placements
        costed, not for every one the search bounds."""
        return as_tuple(self.placement)


@dataclass(frozen=True)
class _PlacedBound:
    """`CostModel.lower_bound_s`'s terms on one placement (`_placed_bound_rows`), kept
    between the bound without the split and the one with it."""

    layout: PlacedLayout
    rows: np.ndarray
    """[pp, L] each stage's per-layer time: device passes and collectives, or its host's."""
    bound_rows: pipeline.BoundRows
    """`rows` as cost_models.pipeline.bound_from_rows takes them (lower_bound_rows)."""
    cut: np.ndarray | None
    """The boundaries' P2P (`CostModel.cut_s`); None with one stage."""
    least: np.ndarray | None
    """[pp - 1] each boundary's cheapest P2P; None without 1F1B stages (one stage, or
    virtual stages, whose chunks fix their boundaries)."""
    sync: np.ndarray
    sync_fixed: np.ndarray
    mean_sync: float
    """The least the stage that syncs last waits for its data-parallel sync."""
    steady: float
    """What 1F1B's steady state waits for P2P at least."""
    alternative: float
    """The bound through the stage beside the dearest boundaries."""


def measured_overheads(measurements: Measurements) -> tuple[CostParams, str]:
    """The uncalibrated coefficients: none, except the framework's fixed costs where `amp-search
    profile` measured them with real trials (amp_search.profiling.framework); with several
    device types, the largest of each (the slowest host sets the pace of a synchronous
    step)."""
    found = [(name, p.framework_overheads) for name, p in
             sorted(measurements.layer_profiles.items()) if p.framework_overheads is not None]
    if not found:
        return CostParams(), "uncalibrated"
    zero: dict[str, dict[int, float]] = {"microbatch": {}, "step": {}}
    for _, f in found:
        for z in f.zero:
            for kind, value in (("microbatch", z.microbatch_s_per_param),
                                ("step", z.step_s_per_param)):
                zero[kind][z.zero_stage] = max(zero[kind].get(z.zero_stage, 0.0), value)
    layer = max(f.layer_overhead_s for _, f in found)
    step = max(f.step_overhead_s for _, f in found)
    # per device its pipeline figure where measured, else its pp 1 one; then the largest
    pipe_layer = max(f.pipeline_layer_overhead_s for _, f in found)
    pipe_step = max(f.step_overhead_s if f.pipeline_step_overhead_s is None
                    else f.pipeline_step_overhead_s for _, f in found)
    params = CostParams(
        layer_overhead_s=layer, step_overhead_s=step,
        pipeline_layer_overhead_delta_s=pipe_layer - layer,
        pipeline_step_overhead_delta_s=pipe_step - step,
        zero_microbatch_s_per_param=zero["microbatch"], zero_step_s_per_param=zero["step"])
    where = ", ".join(measurements.layer_profiles[n].source for n, _ in found)
    return params, f"uncalibrated + framework overheads measured in {where}"


class SharedRows:
    """Per device type rows that do not depend on the cluster, for the cost models of one
    model and training on different clusters (`planner.plan_subsets`' parts of a cluster and
    the whole): the layer timer, the model's tensor-parallel collectives and each device
    type's per-layer passes, knob times, fixed costs and bound rows, computed once for all
    of them. Keyed by the spec's model and training and
    the coefficients, so a cost model of anything else gets rows of its own."""

    def __init__(self) -> None:
        self._by_key: dict = {}

    def get(self, spec: Spec, params: CostParams, profiles) -> tuple[LayerTimer, dict]:
        key = (spec.model, spec.training, repr(params), tuple(sorted(
            (name, id(p)) for name, p in profiles.items())))
        hit = self._by_key.get(key)
        if hit is None:
            hit = self._by_key[key] = (LayerTimer(spec, profiles), {})
        return hit


class CostModel:
    """Everything about a spec that does not depend on the strategy, computed once; then
    `evaluate()` costs one strategy in well under a millisecond plus its DP. `shared`: take
    the layer timer and the per-device-type rows from there (`SharedRows`)."""

    def __init__(self, spec: Spec, *, measurements: Measurements = NO_MEASUREMENTS,
                 cost_params: CostParams | None = None, shared: SharedRows | None = None):
        self.spec = spec
        self.measurements = measurements
        if cost_params is not None:
            self.params, self.params_source = cost_params, "given"
        elif measurements.calibration is not None:
            self.params, self.params_source = (measurements.calibration,
                                               measurements.calibration_source)
            measured = measured_overheads(measurements)[0]
            unpriced = [f"ZeRO {z}" for z in sorted(set(measured.zero_microbatch_s_per_param)
                                                    - set(self.params.zero_microbatch_s_per_param))]
            if (measured.pipeline_layer_overhead_delta_s, measured.pipeline_step_overhead_delta_s) \
                    != (0.0, 0.0) and (self.params.pipeline_layer_overhead_delta_s,
                                       self.params.pipeline_step_overhead_delta_s) == (0.0, 0.0):
                unpriced.insert(0, "the pipeline engine")
            if unpriced and spec.training.backend == "deepspeed":
                # a calibration fitted before the profile measured them: say so, do not
                # add them on top of overheads fitted with them inside
                self.params_source += (f" ({', '.join(unpriced)}: own costs not in the "
                                       f"calibration; calibrate again)")
        else:
            self.params, self.params_source = measured_overheads(measurements)
        self.p2p_blocking_share = pipeline.P2P_BLOCKING_SHARE[spec.training.backend]
        """How much of a stage boundary's P2P the backend's 1F1B steady state blocks on."""
        self.interleaved_blocking_share = pipeline.INTERLEAVED_BLOCKING_SHARE \
            if spec.training.overlap_p2p_comm else pipeline.P2P_BLOCKING_SHARE["megatron"]
        """The same under Megatron-LM's interleaved schedule: none with its P2P overlapped
        (training.overlap_p2p_comm, its default), half of it without."""
        precision = spec.training.precision
        for name, profile in measurements.layer_profiles.items():
            if profile.device != name or profile.precision != precision:
                raise UsageError(f"the layer profile given for {name} ({precision}) was "
                                 f"measured on {profile.device} in {profile.precision}")
        if shared is None:
            self.timer, self._type_rows = LayerTimer(spec, measurements.layer_profiles), {}
        else:
            self.timer, self._type_rows = shared.get(spec, self.params,
                                                     measurements.layer_profiles)
        self.cluster = ClusterArrays.of(spec.cluster)
        fits = measurements.link_fits
        self.cluster_for = {k: self.cluster.with_links(fits.get((k, "intra")),
                                                       fits.get((k, "inter")))
                            for k in ("all_reduce", "p2p", "all_gather", "reduce_scatter")}
        layers = spec.model.layers
        self.num_layers = len(layers)
        bpe = spec.training.bytes_per_element
        self.gpus = sorted({d.gpu.name: d.gpu for d in spec.cluster.devices}.values(),
                           key=lambda g: g.name)
        index = {g.name: i for i, g in enumerate(self.gpus)}
        self.standard_attention = [spec.attention_for(g) == "standard" for g in self.gpus]
        self.gpu_of_device = np.array([index[d.gpu.name] for d in spec.cluster.devices])
        self.devices_per_type = np.bincount(self.gpu_of_device, minlength=len(self.gpus))
        # per sample: P2P bytes leaving layer l, TP all-reduce bytes and message count of layer l
        self.out_bytes = np.array([output_elements(l) * bpe for l in layers], dtype=float)
        self._params: dict[tuple, np.ndarray] = {}
        self._fixed_cache: dict = {}
        self._latency_cache: dict = {}
        # block passes per layer (1 for the others, whose kernel floor is 0), per recompute
        self._floor_passes = {ck: np.array([max(block_passes(l, ck), 1) for l in layers],
                                           dtype=float) for ck in (False, True)}
        self._placement_cache: dict = {}
        self._type_sets: dict = {}        # _stage_gpus: a set's bit code -> its tuple
        self._placed_bounds: dict = {}      # lower_bound_s: (order name, candidate) -> rows
        self._bound_terms: dict = {}
        """`_placed_bound_rows`' results, their per-layer rows and their data-parallel sync,
        by what each depends on (`_placed_bound_key`): the candidates that differ in what
        they do not read share them."""
        self._rows_bounds: dict = {}        # lower_bound_s: candidate -> its rows' bound
        # what `tp_floor_s` and the device types' rows depend on besides the candidate
        self._types_and_links = tuple(g.name for g in self.gpus) + tuple(
            (k, float(a.intra_bytes_per_s.max()), float(a.inter_bytes_per_s.max()))
            for k, a in sorted(self.cluster_for.items()))
        self.capacity_bytes = np.array([d.gpu.memory_bytes for d in spec.cluster.devices],
                                       dtype=float)
        self.num_experts = spec.model.num_experts
        t = spec.training
        # routed experts per layer, where each MoE layer's dispatcher syncs the host
        # (`moe_sync_s`): Megatron-LM without training.moe_sync_free
        self._synced_experts = np.array(
            [l.num_experts if l.is_moe else 0 for l in layers], dtype=float) \
            if self.num_experts and t.backend == "megatron" and not t.moe_sync_free else None
        self.a2a_hidden_share = min(g.moe_a2a_overlap_share for g in self.gpus) \
            if self.num_experts and t.backend == "megatron" and t.moe_a2a_overlap else 0.0
        """The share of the expert-parallel all-to-alls hidden behind another micro-batch's
        compute (training.moe_a2a_overlap; the least of the cluster's device types' catalog
        `moe_a2a_overlap`), 0 without it."""
        moe = next((x for x in layers if x.is_moe), None)
        self.hierarchical_dispatch = (moe.num_experts, moe.moe_router_topk) \
            if moe is not None and t.backend == "megatron" and t.moe_dispatcher != "alltoall" \
            else None
        """(experts, top-k) where the MoE layers' token dispatcher is hierarchical
        (training.moe_dispatcher deepep or hybridep: links.all_to_all_links), None for
        Megatron-core's all-to-all and under DeepSpeed."""
        self.node_widths = np.array(spec.cluster.nvlink_domain_widths)
        """Devices per node as the links see one (an NVLink domain, ClusterArrays), by id."""
        self.first_fixed, self.last_fixed = spec.model.ends
        self._chunk_cache: dict[int, tuple[int, ...]] = {}
        """`_chunks` by the number of chunks."""

    def tp_collectives(self, recompute: bool, sequence_parallel: bool, part: int | None = None
                       ) -> dict:
        """{kind: (elements [L], calls [L])} of each layer's tensor-parallel collectives per
        sample (cost_models.layers.tp_collectives_by_pass, the backend's layers), all passes
        or pass `part` (0 forward, 1 backward, 2 recomputed forward); cached."""
        key = ("tp-collectives", recompute, sequence_parallel, part)    # the model's alone
        hit = self._type_rows.get(key)
        if hit is None:
            framework = self.spec.training.backend
            per_layer = []
            for layer in self.spec.model.layers:
                passes = tp_collectives_by_pass(layer, recompute, sequence_parallel, framework)
                per_layer.append(comm.collectives_by_kind(
                    x for k, p in enumerate(passes) if part in (None, k) for x in p))
            kinds = sorted({k for d in per_layer for k in d})
            hit = self._type_rows[key] = {
                k: (np.array([d.get(k, (0.0, 0))[0] for d in per_layer]),
                    np.array([d.get(k, (0.0, 0))[1] for d in per_layer], dtype=float))
                for k in kinds}
        return hit

    def tp_time_s(self, c: Candidate, layout: PlacedLayout, part: int | None = None
                  ) -> np.ndarray:
        """[pp, L]: each layer's tensor-parallel collectives of one micro-batch (all passes, or
        pass `part`) on each stage's slowest tensor ring: per kind, its link fit's bandwidth
        and latency where profile-comm measured the kind (all-gather and reduce-scatter have
        their own on gloo), else the all-reduce's; with `overlaps_tp_comm`, what each pass's
        GEMMs leave of them (cost_models.compute.tp_overlap_exposed_s). With cp or ep, their
        rings' exposed time too (`cp_time_s`, `ep_time_s`)."""
        out = np.zeros((c.pp, self.num_layers))
        if c.cp > 1:
            out = out + self.cp_time_s(c, layout, part)
        if c.ep > 1:
            out = out + self.ep_time_s(c, layout, part)
        if c.tmp == 1:
            return out
        if self.overlaps_tp_comm(c):        # each pass against its own GEMMs
            passes = (0, 1, 2) if part is None else (part,)
            return out + sum(tp_overlap_exposed_s(self._tp_collectives_s(c, layout, k),
                                                  self._tp_window_s(c, layout, k), c.tmp)
                             for k in passes)
        return out + self._tp_collectives_s(c, layout, part)

    def _tp_collectives_s(self, c: Candidate, layout: PlacedLayout, part: int | None
                          ) -> np.ndarray:
        """[pp, L] the tensor-parallel collectives alone of `tp_time_s`."""
        out = np.zeros((c.pp, self.num_layers))
        bpe = self.spec.training.bytes_per_element
        for kind, (elements, calls) in self.tp_collectives(
                c.activation_checkpointing, c.sequence_parallel, part).items():
            bw, lat = self._tp_ring(kind, layout)
            out = out + comm.collective_time_s(kind, elements[None, :] * bpe * c.mbs / c.cp,
                                               c.tmp, bw[:, None], lat[:, None],
                                               messages=calls[None, :])
        return out

    def overlaps_tp_comm(self, c: Candidate) -> bool:
        """Whether `c`'s tensor-parallel collectives run beside its GEMMs
        (training.tp_comm_overlap: Megatron-LM's --tp-comm-overlap, Transformer Engine's
        userbuffers, which need sequence parallelism and tmp > 1)."""
        t = self.spec.training
        return (t.tp_comm_overlap and t.backend == "megatron" and c.tmp > 1
                and c.sequence_parallel)

    def _tp_window_s(self, c: Candidate, layout: PlacedLayout, part: int) -> np.ndarray:
        """[pp, L] the GEMM time pass `part` of each layer runs beside its tensor-parallel
        collectives (`tp_overlap_exposed_s`): the forward GEMMs (LayerTimer.gemm_forward_s x
        the calibrated compute scale), twice that in the backward (once with frozen
        weights), once in a recomputed forward, on the stage's device type with the
        shortest (the window that hides least); zero for a pass that does not run."""
        if part == 2 and not c.activation_checkpointing:
            return np.zeros((c.pp, self.num_layers))
        key = ("tp-window", c.tmp, c.mbs, c.cp, c.ep)
        per_type = self._fixed_cache.get(key)
        if per_type is None:
            per_type = self._fixed_cache[key] = np.stack([
                self.timer.gemm_forward_s(g, c.tmp, c.mbs, c.cp, c.ep)
                * self.params.compute(g.name) for g in self.gpus])
        factor = 2.0 if part == 1 and not self.spec.training.frozen_weights else 1.0
        return factor * np.stack([per_type[list(gs)].min(axis=0) for gs in layout.stage_gpus])

    def _tp_ring(self, kind: str, layout: PlacedLayout) -> tuple[np.ndarray, np.ndarray]:
        """Per stage, the bandwidth and per-message latency of a `kind` collective on the
        stage's slowest tensor ring: the kind's measured link fit where profile-comm has one
        (all-gather and reduce-scatter have their own on gloo), else the all-reduce's."""
        bw, crosses = (layout.tp_kind_links or {}).get(kind, layout.tp_links)
        return bw, self.link_latencies_s(self._latency_kind(kind), crosses, layout)

    def _latency_kind(self, kind: str) -> str:
        """The collective whose per-message latency a `kind` collective pays: its own where
        profile-comm measured it, else the all-reduce's."""
        measured = (kind, "intra") in self.measurements.link_fits or \
            (kind, "inter") in self.measurements.link_fits
        return kind if measured else "all_reduce"

    def cp_time_s(self, c: Candidate, layout: PlacedLayout, part: int | None = None
                  ) -> np.ndarray:
        """[pp, L]: the exposed time of each layer's context-parallel ring in one micro-batch
        (all passes, or pass `part`), on each stage's slowest cp ring, against the attention
        core of its slowest device type (cost_models.comm.context_parallel_ring_time_s): the
        forward, the backward (K/V and their gradients) and, with full recomputation, the
        forward again; with the selective recomputation of the core (`recomputes_ring`), its
        forward again inside the backward."""
        kv, cores = self._cp_arrays(c)
        bw, crosses = layout.cp_links
        lat = self.link_latencies_s("p2p", crosses, layout)
        key = ("cp-core", id(layout), c.tmp, c.mbs, c.cp)
        hit = self._fixed_cache.get(key)
        if hit is None or hit[0] is not layout:     # [pp, L]: each stage's slowest core
            stages = layout.stage_gpus
            slowest = {t: np.max([cores[g] for g in t], axis=0) for t in set(stages)}
            hit = self._fixed_cache[key] = (layout, np.array([slowest[t] for t in stages]))
        core = hit[1]
        bw, lat = np.asarray(bw, dtype=float)[:, None], np.asarray(lat, dtype=float)[:, None]
        out = np.zeros((c.pp, self.num_layers))
        passes = [(0, False), (1, True)] + ([(2, False)] if c.activation_checkpointing else []) \
            + ([(1, False)] if self.recomputes_ring(c) else [])  # its forward inside the backward
        for k, backward in passes:
            if part in (None, k):
                out += comm.context_parallel_ring_time_s(
                    kv[None, :], c.cp, core * (2.0 if backward else 1.0), bw, lat,
                    backward=backward)
        return out

    def boundary_shards(self, c: Candidate) -> int:
        """The parts a stage boundary's activation is sent in over the tensor group
        (cost_models.comm.boundary_shards, for the spec's backend and pipeline_p2p)."""
        t = self.spec.training
        return comm.boundary_shards(c.tmp, framework=t.backend,
                                    sequence_parallel=c.sequence_parallel,
                                    scatter_gather=t.pipeline_p2p == "split")

    def boundary_gathers(self, c: Candidate) -> tuple[int, int]:
        """(receiver, sender) all-gathers per micro-batch and boundary
        (cost_models.comm.boundary_gathers, for the spec's backend and pipeline_p2p)."""
        t = self.spec.training
        return comm.boundary_gathers(c.tmp, framework=t.backend,
                                     sequence_parallel=c.sequence_parallel,
                                     scatter_gather=t.pipeline_p2p == "split")

    def boundary_gather_s(self, c: Candidate, layout: PlacedLayout) -> np.ndarray:
        """[pp, L]: one all-gather of layer l's whole output (one micro-batch, a context-
        parallel rank's share) over stage j's tensor group, on its slowest ring (the
        all-gather's measured links where profile-comm has them)."""
        bw, lat = self._tp_ring("all_gather", layout)
        return comm.allgather_time_s(self.out_bytes[None, :] * c.mbs / c.cp, c.tmp,
                                     np.asarray(bw, dtype=float)[:, None],
                                     np.asarray(lat, dtype=float)[:, None])

    def ep_time_s(self, c: Candidate, layout: PlacedLayout, part: int | None = None
                  ) -> np.ndarray:
        """[pp, L]: each mixture-of-experts layer's all-to-alls of one micro-batch (all
        passes, or pass `part`) on each stage's slowest expert-parallel group: the dispatch
        and the combine in the forward, their gradients in the backward, again in a
        recomputed forward; exposed, but for the share `a2a_hidden_share` that
        training.moe_a2a_overlap (--overlap-moe-expert-parallel-comm) hides behind another
        micro-batch's compute, with pp 1 or virtual stages and no full recomputation (what
        megatron-core runs it with), in all but the first forward and the last backward. A rank sends each of its mbs s / (tmp cp)
        tokens (sequence parallelism: s/t) to k experts (cost_models.comm)."""
        spb, crosses = self._ep_links(c, layout)
        lat = self.link_latencies_s("p2p", crosses, layout)
        key = ("dispatch", c.mbs, c.tmp, c.cp)
        hit = self._fixed_cache.get(key)
        if hit is None:
            bpe = self.spec.training.bytes_per_element
            hit = self._fixed_cache[key] = tuple(np.array([message(
                c.mbs * x.seq_length / (c.tmp * c.cp), x.moe_router_topk, x.hidden_size, bpe)
                if x.is_moe else 0.0 for x in self.spec.model.layers])
                for message in (comm.expert_dispatch_bytes, comm.expert_combine_bytes))
        dispatch, combine = hit
        passes = (1, 1, 1 if c.activation_checkpointing else 0)
        calls = float(sum(passes) if part is None else passes[part])   # of each
        out = sum(comm.all_to_all_time_s(m[None, :], spb[:, None], lat[:, None], calls)
                  for m in (dispatch, combine))
        # the first forward and the last backward have no partner
        hidden = 0.0
        if self.a2a_hidden_share and pairs_micro_batches(c.pp, c.virtual_stages,
                                                         c.activation_checkpointing):
            gas = micro_batches(self.spec.training.global_batch_size, c.dp, c.mbs)
            hidden = self.a2a_hidden_share * (gas - 1) / gas
        return np.where(dispatch[None, :] > 0, out * (1.0 - hidden), 0.0)

    def _ep_links(self, c: Candidate, layout: PlacedLayout) -> tuple[np.ndarray, np.ndarray]:
        """Per stage: the seconds per byte of its slowest expert-parallel group's
        all-to-all, and whether any of them crosses nodes. A stage's ranks in Megatron-LM's
        order (tensor rank fastest, then context, then data) form groups of ep consecutive
        ranks."""
        key = ("ep", id(layout), c.ep)
        hit = self._fixed_cache.get(key)
        if hit is None or hit[0] is not layout:
            p = self.params
            groups = layout.placement.reshape(c.pp, -1, c.ep)
            links = all_to_all_links(self.cluster_for["p2p"], groups,
                                     intra_scale=p.bandwidth("intra"),
                                     inter_scale=p.bandwidth("inter"),
                                     hierarchical=self.hierarchical_dispatch)
            hit = self._fixed_cache[key] = (layout, links.seconds_per_byte.max(axis=1),
                                            links.crosses_nodes.any(axis=1))
        return hit[1], hit[2]

    def _cp_arrays(self, c: Candidate) -> tuple[np.ndarray, list[np.ndarray]]:
        """[L] K/V bytes one cp rank passes per ring step, and per device type [L] its
        attention core's forward time, for one micro-batch; cached."""
        key = ("cp", c.tmp, c.mbs, c.cp)
        hit = self._fixed_cache.get(key)
        if hit is None:
            t = self.spec.training
            bpe = t.bytes_per_element
            layers = self.spec.model.layers
            kv = np.array([kv_elements_per_token(x, c.tmp) * x.seq_length / c.cp
                           for x in layers], dtype=float) * c.mbs * bpe
            cores = []
            for gpu in self.gpus:
                device = device_speed(gpu, t.precision)
                attention = self.spec.attention_for(gpu)
                cores.append(np.array(per_distinct_layer(layers, lambda x: attention_time_s(
                    x, tmp=c.tmp, mbs=c.mbs, device=device, bytes_per_element=bpe,
                    attention=attention, cp=c.cp))))
            hit = self._fixed_cache[key] = (kv, cores)
        return hit

    def latency(self, collective: str, link: str, catalog_s=None):
        """Calibrated latency plus the per-message latency of the link: the measured one
        (profile-comm's fit) if any, else `catalog_s` (the devices' catalog `link_latency`;
        None: the largest of the cluster's device types)."""
        fit = self.measurements.link_fits.get((collective, link))
        if fit is not None:
            return self.params.latency(link) + fit.alpha_s
        if catalog_s is None:
            catalog_s = max(getattr(g, f"link_latency_{link}_s") for g in self.gpus)
        return self.params.latency(link) + catalog_s

    def params_per_layer(self, tmp: int, ep: int = 1) -> np.ndarray:
        if (tmp, ep) not in self._params:
            self._params[tmp, ep] = np.array(
                [param_count(x, tmp, ep) for x in self.spec.model.layers], dtype=float)
        return self._params[tmp, ep]

    def expert_params_per_layer(self, ep: int) -> np.ndarray:
        """[L] the routed experts' parameters one expert-parallel rank holds per layer (part
        of `params_per_layer`)."""
        if ("experts", ep) not in self._params:
            self._params["experts", ep] = np.array(
                [expert_param_count(x, ep) for x in self.spec.model.layers], dtype=float)
        return self._params["experts", ep]

    def sources(self) -> tuple[str, ...]:
        """Where the numbers came from: layer times per device type, links, coefficients."""
        mine = {g.name for g in self.gpus}
        return tuple(f"{k}={v}" for k, v in sorted(self.timer.sources().items())
                     if k in mine) + (
            f"links={self.measurements.link_source}", f"coefficients={self.params_source}")

    # ------------------------------------------------------------------ one strategy
    def evaluate(self, c: Candidate, order: DeviceOrder | None = None, *,
                 placement: np.ndarray | None = None,
                 partition: str | tuple[int, ...] = "optimal",
                 with_memory: bool = True) -> Estimate:
        """Cost one strategy: placement from `order` (Megatron's mapping) or given; partition
        'optimal' (exact DP), 'uniform' (Megatron) or explicit boundaries. with_memory=False:
        without the per-stage peak memory (`memory` empty, so `fits` says nothing), for a
        caller that keeps one of several placements by time and adds it (`add_memory`)."""
        layout = self.layout(c, order, placement)
        costs = self.stage_costs(c, layout)
        scores = self._attention_scores(layout)
        bounds = self._partition(c, costs, layout, partition, any(scores))
        strategy = self._strategy(c, bounds, layout.placement_tuple,
                                  order.name if order is not None else "given")
        return self._assemble(strategy, costs, layout.capacity_bytes,
                              scores if with_memory else None)

    def _strategy(self, c: Candidate, partition, placement: tuple,
                  placement_order: str) -> Strategy:
        """The Strategy record of `c` with its layer split and placement."""
        return Strategy(pp=c.pp, dp=c.dp, tmp=c.tmp, mbs=c.mbs,
                        global_batch_size=self.spec.training.global_batch_size,
                        partition=tuple(int(x) for x in partition), placement=placement,
                        placement_order=placement_order, zero_stage=c.zero_stage,
                        activation_checkpointing=c.activation_checkpointing,
                        selective_recompute=c.selective_recompute,
                        sequence_parallel=c.sequence_parallel,
                        virtual_stages=c.virtual_stages, cp=c.cp, ep=c.ep)

    def states_cannot_fit(self, c: Candidate) -> bool:
        """Whether the model states alone cannot fit, whatever the split and the placement
        (Megatron-LM's optimizers, whose states are linear in the parameters: some stage
        holds at least 1/pp of them, and no device has more memory than the largest); such a
        candidate is out of memory without being costed. False where it may fit, and for
        DeepSpeed (its ZeRO partitions are not linear in the parameters)."""
        t = self.spec.training
        if t.backend != "megatron" or c.zero_stage > 1:
            return False
        key = ("states", c.tmp, c.replicas, c.zero_stage, c.ep)
        hit = self._fixed_cache.get(key)
        if hit is None:
            per_param = memory_model.megatron_model_state_bytes(
                1, precision=t.precision, zero_stage=0, dp=1, grad_fp32=t.grad_reduce_in_fp32)
            if t.frozen_weights:            # the weights only
                per_param = memory_model.frozen_states(per_param)
            held = per_param.parameter_bytes + per_param.gradient_bytes
            experts = float(self.expert_params_per_layer(c.ep).sum())
            edp = memory_model.expert_data_parallel(c.replicas, c.tmp, c.ep)
            shards = (c.replicas, edp) if c.zero_stage == 1 else (1, 1)
            hit = self._fixed_cache[key] = \
                (float(self.params_per_layer(c.tmp, c.ep).sum()) - experts) \
                * (held + per_param.optimizer_bytes / shards[0]) \
                + experts * (held + per_param.optimizer_bytes / shards[1])
        usable = self.capacity_bytes.max() * (1.0 - t.memory_headroom) \
            - t.framework_overhead_bytes
        return hit / c.pp > usable

    def lower_bound_s(self, c: Candidate, order: DeviceOrder | None = None, *,
                      split: bool = False, floors: bool = True) -> float:
        """A time `evaluate(c, order)` never beats. Without an order, a bound for every
        order from cached per-layer arrays alone (cost_models.pipeline.
        iteration_lower_bound_s on the device types' passes: as many stages on the faster
        types as their devices fill, and the tensor-parallel collectives on the cluster's
        best link, `tp_floor_s`). On `order`'s
        placement: each stage's device passes and tensor-, context- and expert-parallel
        collectives, or its host's time where longer (at most its `layer_s`,
        synced_overlapped_time_s), through iteration_lower_bound_s, plus with one model
        chunk per stage each boundary's cheapest P2P (`cut_s`; 1F1B's fill and drain pay
        each boundary once); with `split`, its data-parallel sync too (without the optimizer
        step; an overlapped gradient reduction counted as if it hid entirely) and, with one
        model chunk per stage, the exact partition DP on those rows and the boundaries' P2P
        over the memory-feasible splits (or all, where none is: what `_partition` chooses
        among), which minimises a sum (eq. 5) that each split's closed-form time is at
        least: the tightest bound, at the price of one or two DP solves; with virtual
        stages, the interleaved schedule's time on its fixed chunks with their boundaries'
        P2P, as `_assemble` charges it.
        `floors` False, without an order: the per-layer rows alone (no P2P or sync floors),
        what the search orders every candidate by before it asks for more."""
        gas = micro_batches(self.spec.training.global_batch_size, c.dp, c.mbs)
        p = self.params
        common = dict(microbatch_overhead_s=p.microbatch_overhead_s,
                      step_overhead_s=p.step_overhead(c.pp, c.replicas))
        if order is None:
            # the device types' rows and the best links: the same on every part of a cluster
            # that has these types (SharedRows)
            # (of the ZeRO stage the rows read its per-micro-batch cost alone,
            # `device_pass_times_s`, and of pp whether it is above 1, CostParams.layer_overhead)
            key = ("fastest", self._types_and_links, c.tmp, c.mbs, c.activation_checkpointing,
                   c.selective_recompute, c.sequence_parallel,
                   p.zero_cost("zero_microbatch_s_per_param", c.zero_stage), c.cp, c.ep,
                   c.pp > 1)
            bound_rows = self._type_rows.get(key)
            if bound_rows is None:
                rows = np.stack([self.device_pass_times_s(g, c).sum(axis=0)
                                 for g in self.gpus])
                if c.tmp > 1:
                    rows = rows + self.tp_floor_s(c)[None, :]
                rows = np.maximum(rows, np.stack([self._host_row(i, c)
                                                  for i in range(len(self.gpus))]))
                bound_rows = self._type_rows[key] = pipeline.lower_bound_rows(rows)
            # the search asks for the rows alone first, then with the floors: the second
            # takes the first's (and lets it go)
            rows_bound = self._rows_bounds.pop(c, None) if floors else None
            if rows_bound is None:
                rows_bound = pipeline.bound_from_rows(
                    bound_rows, gas, c.virtual_stages, type_devices=self.devices_per_type,
                    devices_per_stage=self.spec.cluster.num_devices // c.pp, **common)
            if not floors:          # the per-layer rows alone: the cheapest bound
                self._rows_bounds[c] = rows_bound
                return rows_bound
            p2p, least, most = self.p2p_floors_s(c)
            fixed = p2p + self.dp_sync_floor_s(c)
            if c.virtual_stages > 1 or c.pp == 1:       # no P2P in the steady state
                return rows_bound + fixed
            b = (gas - 1) * self.p2p_blocking_share
            # or one micro-batch through every layer and boundary and the steady state's
            # least (`_steady_floor_s`, the placed bound's `alternative` on the device types'
            # rows): the dearest boundary has, with 3 stages or more, a middle stage beside
            # it, which waits for its other boundary too
            pair = most + (least if c.pp > 2 else 0.0)
            one_pass = bound_rows.total + (gas - 1 + c.pp) * p.microbatch_overhead_s \
                + common["step_overhead_s"]
            return max(rows_bound + fixed + b * least, fixed + one_pass + self._steady_floor_s(
                c, gas, cheapest_s=bound_rows.total, dearest_pair_s=pair, p2p_s=p2p))
        # the tiers of the search ask for each placement's bound without the split, then with
        # it: the second takes the first's rows (and lets them go)
        key = (order.name, c)
        placed = self._placed_bounds.pop(key, None) if split else None
        if placed is None:
            placed = self._placed_bound_rows(c, order, gas, common["step_overhead_s"])
            if not split:
                self._placed_bounds[key] = placed
        layout, rows, cut, least = placed.layout, placed.rows, placed.cut, placed.least
        sync, sync_fixed = placed.sync, placed.sync_fixed
        mean_sync, steady, alternative = placed.mean_sync, placed.steady, placed.alternative
        if not split:       # pipeline.iteration_lower_bound_s on the rows
            bound = pipeline.bound_from_rows(placed.bound_rows, gas, c.virtual_stages, **common)
            if least is not None:   # 1F1B's fill and drain pay each boundary's P2P once
                bound += float(least.sum()) + steady
            return max(bound + mean_sync, alternative)
        if self.overlaps_grad_reduce(c):     # the reduction may hide entirely: what is left
            reduce, reduce_fixed = self._dp_sync(c, layout, reduce_only=True)
            sync, sync_fixed = np.maximum(sync - reduce, 0.0), \
                np.maximum(sync_fixed - reduce_fixed, 0.0)
        if c.pp == 1:       # pipeline.iteration_lower_bound_s on the rows
            return pipeline.bound_from_rows(placed.bound_rows, gas, c.virtual_stages,
                                            after_layer_s=sync, after_fixed_s=sync_fixed,
                                            **common)
        if c.virtual_stages > 1:
            # the fixed chunks: the schedule's time on these rows with its P2P, as `_assemble`
            # charges it (the chunks' boundaries are known, so their P2P is exact)
            chunks = self._chunks(c)
            t = pipeline.chunk_device_totals(rows, chunks, c.pp) + p.microbatch_overhead_s
            cuts, wrap = pipeline.chunk_boundary_times(cut, chunks, c.pp)
            return pipeline.iteration_time_s(
                pipeline.interleaved_1f1b_time_s(t, cuts, gas, c.virtual_stages,
                                                 blocking_share=self.interleaved_blocking_share,
                                                 wrap_time_s=wrap),
                sync_fixed + pipeline.chunk_device_totals(sync, chunks, c.pp),
                common["step_overhead_s"])
        # The partition DP on these rows and the boundaries' P2P (eq. 5, which pays each
        # once: 1F1B's steady state pays more), over the splits `_partition` chooses among:
        # those in memory, or, where none is, all of them (the memory check does not depend
        # on the times)
        mem_layer, mem_budget = self._memory_arrays(c, gas, layout,
                                                    any(self._attention_scores(layout)))
        kw = dict(sync_layer_s=sync, sync_fixed_s=sync_fixed, checked=False)
        best = optimal_partition(rows, cut, gas, memory_layer_bytes=mem_layer,
                                 memory_budget_bytes=mem_budget, **kw) or \
            optimal_partition(rows, cut, gas, **kw)
        return max(best.objective_s + (gas - 1 + c.pp) * p.microbatch_overhead_s
                   + common["step_overhead_s"] + steady, alternative)

    def _placed_bound_rows(self, c: Candidate, order: DeviceOrder, gas: int,
                           step_overhead_s: float) -> "_PlacedBound":
        """What `lower_bound_s` bounds `order`'s placement by, with and without the split:
        each stage's per-layer rows (device passes and tensor-, context- and expert-parallel
        collectives, or its host's time where longer), the boundaries' P2P, the data-parallel
        sync, and the P2P floors of 1F1B's steady state. Cached under `_placed_bound_key`,
        its rows and boundaries' P2P under the part of it they read (the ZeRO stage's
        per-micro-batch cost instead of the stage): arrays no caller writes to."""
        p = self.params
        rows_key, key = self._placed_bound_key(c, order)
        hit = self._bound_terms.get(key)
        if hit is not None:
            return hit
        layout = self.layout(c, order)
        terms = self._bound_terms.get(rows_key)
        if terms is None:
            types = layout.stage_gpus
            passes = {t: self.stage_pass_times_s(t, c).sum(axis=0) for t in set(types)}
            rows = np.stack([passes[t] for t in types])
            if c.layer_collectives:
                rows = rows + self.tp_time_s(c, layout)
            host = {t: np.max([self._host_row(g, c) for g in t], axis=0) for t in set(types)}
            rows = np.maximum(rows, np.stack([host[t] for t in types]))
            cut = self.cut_s(c, layout) if c.pp > 1 else None
            terms = self._bound_terms[rows_key] = (rows, cut, pipeline.lower_bound_rows(rows))
        rows, cut, bound_rows = terms
        sync_key = ("sync", order.name, c.pp, c.dp, c.cp, c.tmp, c.mbs, c.zero_stage, c.ep)
        synced = self._bound_terms.get(sync_key)
        if synced is None:
            sync, sync_fixed = self._dp_sync(c, layout)
            # the stage that syncs last: at least the split that evens out the stages' syncs
            # (stage j syncing all the parameters would take totals[j]): 1 / sum_j 1 / totals[j]
            totals = sync.sum(axis=1)
            mean_sync = 0.0 if self.overlaps_grad_reduce(c) else float(sync_fixed.min()) + (
                1.0 / float((1.0 / totals).sum()) if (totals > 0).all() else 0.0)
            synced = self._bound_terms[sync_key] = (sync, sync_fixed, mean_sync)
        sync, sync_fixed, mean_sync = synced
        least = None
        steady = alternative = 0.0
        if cut is not None and c.virtual_stages == 1:
            # each boundary's cheapest P2P; 1F1B's steady state waits, in every micro-batch
            # but one, for the blocking share of the bottleneck stage's two boundaries
            # (pipeline.steady_state_period_s): at least the least such pair's; and as long
            # as the stage beside the dearest pair takes
            least = cut[1:, 1:-1].min(axis=1)
            pairs = np.concatenate([[0.0], least]) + np.concatenate([least, [0.0]])
            steady = (gas - 1) * self.p2p_blocking_share * float(pairs.min())
            cheapest = float(rows.min(axis=0).sum())
            one_pass = float(least.sum()) + cheapest \
                + (gas - 1 + c.pp) * p.microbatch_overhead_s + step_overhead_s + mean_sync
            alternative = one_pass + self._steady_floor_s(
                c, gas, cheapest_s=cheapest, dearest_pair_s=float(pairs.max()),
                p2p_s=float(least.sum()))
        hit = self._bound_terms[key] = _PlacedBound(
            layout=layout, rows=rows, bound_rows=bound_rows, cut=cut, least=least, sync=sync,
            sync_fixed=sync_fixed, mean_sync=mean_sync, steady=steady, alternative=alternative)
        return hit

    def _placed_bound_key(self, c: Candidate, order: DeviceOrder) -> tuple[tuple, tuple]:
        """What `_placed_bound_rows` depends on of `c` and `order`: (that of its per-layer
        rows and boundaries' P2P, that of the whole). The placement (order, pp, dp, cp, tmp),
        the micro-batch, the knobs; of the ZeRO stage the rows read its per-micro-batch cost
        alone (`device_pass_times_s`: 0 under Megatron-LM), the data-parallel sync the stage
        (`_dp_sync` and `overlaps_grad_reduce` read the placement, the micro-batch, the
        stage and ep alone: its own key there); of the virtual stages the rows read nothing
        but through the expert-parallel
        all-to-alls (`ep_time_s`, whether the schedule pairs micro-batches), and the rest
        whether there are any (one model chunk per stage: the 1F1B floors)."""
        v = c.virtual_stages if c.ep > 1 else 1
        rows_key = ("rows", order.name, c.pp, c.dp, c.cp, c.tmp, c.mbs,
                    c.activation_checkpointing, c.selective_recompute, c.sequence_parallel,
                    c.ep, v, self.params.zero_cost("zero_microbatch_s_per_param", c.zero_stage))
        return rows_key, ("placed",) + rows_key + (c.zero_stage, c.virtual_stages == 1)

    def _steady_floor_s(self, c: Candidate, gas: int, *, cheapest_s: float,
                        dearest_pair_s: float, p2p_s: float) -> float:
        """What 1F1B's steady state adds at least to one micro-batch's pass through every
        layer and boundary (`cheapest_s`: the layers at their cheapest; `p2p_s`: the
        boundaries' P2P; `dearest_pair_s`: the P2P some stage waits for at its boundaries):
        in every micro-batch but one, the stage beside the dearest pair waits for its
        blocking share of them, and a period is at least the mean over the stages of t_j +
        the share of its two boundaries' P2P it waits for (pipeline.steady_state_period_s),
        whose P2P counts each boundary twice."""
        b = (gas - 1) * self.p2p_blocking_share
        return max(b * dearest_pair_s, (gas - 1) * cheapest_s / c.pp + b * 2.0 * p2p_s / c.pp)

    def p2p_floors_s(self, c: Candidate) -> tuple[float, float, float]:
        """What the pp - 1 stage boundaries' P2P add at least to a 1F1B iteration (its fill
        and drain pay each boundary once; virtual stages: 0) on any order of whole nodes
        (`device_orders`; a stage is dp x cp x tmp consecutive devices of it): each boundary
        its cheapest layer's activation and gradient over the fastest link (no NIC shared)
        and the lowest latency, and over the network at least on the boundaries that must
        cross nodes. A pair of a boundary sends between devices a stage apart in the order,
        so with stages as wide as the widest node every boundary crosses, and a node holds
        devices of two stages at most: before the last boundary all of its devices send at
        once, each at its share of the node's network (links.p2p_links shares the NICs
        among all boundaries' flows). With narrower stages each of the M - 1 node changes
        lies between the pairs of some boundary, and one boundary's pairs span fewer than
        2 stages, so at most 1 + (2 stage - 2) // (narrowest node) of them; with stages no
        wider than the narrowest node, the stage-width devices before a node change (all on
        one node) each send across it at once, at 1/stage of that node's network at most.
        Returns (all boundaries, the least any one boundary pays (each stage has one at
        least: 1F1B's steady state waits for it, pipeline.steady_state_period_s), the most,
        of the kinds of boundary there certainly are); cached."""
        if c.pp == 1 or c.virtual_stages > 1:
            return (0.0, 0.0, 0.0)
        key = ("p2p-floor", c.pp, c.replicas, c.tmp, c.mbs, c.cp, c.sequence_parallel)
        hit = self._fixed_cache.get(key)
        if hit is None:
            counts, bw, lat = self._p2p_floor_links(c.pp)
            message = float(self.out_bytes[:self.num_layers - 1].min()) * c.mbs \
                / (self.boundary_shards(c) * c.cp)
            each = comm.stage_boundary_time_s(message, bw, lat)
            there = each[counts > 0]
            hit = self._fixed_cache[key] = (float((counts * each).sum()), float(there.min()),
                                            float(there.max()))
        return hit

    def _p2p_floor_links(self, pp: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`p2p_floors_s`' boundaries of a pp-stage pipeline: (how many, bandwidth,
        latency) of each kind; cached."""
        key = ("p2p-floor-links", pp)
        hit = self._fixed_cache.get(key)
        if hit is None:
            p, arr = self.params, self.cluster_for["p2p"]
            inter, fastest, inter_latency, least_latency = self._best_links("p2p")
            stage = self.spec.cluster.num_devices // pp
            widths = self.node_widths
            shared, rates = 0, np.zeros(0)
            if stage >= widths.max():
                crossing = pp - 1
                # a node then holds devices of two stages at most; before the last
                # boundary all of them send at once, each over its share of the NIC: a
                # boundary at most at the least share among its stage's nodes, and at most
                # (devices of the nodes with a share >= x) // stage stages have only such
                # nodes, so the fastest shares go to as many boundaries as they can fill.
                # With 3 stages or more the last boundary's receivers share theirs too: no
                # node of the last stage holds a device of the first, so each of its
                # devices receives at once (each boundary then at most at the share of a
                # stage of its own: its senders' for the others, the last stage's for it).
                # Where the nodes are as wide as one another and whole nodes make a stage,
                # every node holds one stage and all of its devices send (or receive) at
                # once: a boundary at most at the slower of its two stages' shares, and as
                # at most (stages with a share >= x) - 1 boundaries join two such stages,
                # the i-th fastest boundary at most the (i + 1)-th fastest stage's
                aligned = (widths == widths[0]).all() and stage % widths[0] == 0
                shared = pp - 1 if pp > 2 or aligned else 0
                rates = np.array(self._stage_rates(
                    arr.inter_bytes_per_s / widths * p.bandwidth("inter"), stage,
                    shared + aligned, ("p2p",)))[int(aligned):]
            else:
                per_boundary = 1 + (2 * stage - 2) // widths.min()
                crossing = min(pp - 1, -(-(len(widths) - 1) // per_boundary))
                if stage <= widths.min():
                    # the stage devices before a node change all send across it at once, to
                    # the next node (a pair spans no whole node), each at 1/stage of the
                    # slower node's network at most; in any order of the nodes at most
                    # (nodes with a network >= x) - 1 node changes join two such nodes, and
                    # a node change lies under the pairs of two boundaries at most (the
                    # stage devices before it span two stages at most; of one where the
                    # stage divides every node's width, so that nodes change between
                    # stages): the i-th fastest crossing boundary (from 1) at most the
                    # ceil(i/2)-th (the i-th) fastest node after the fastest
                    nodes = np.sort(arr.inter_bytes_per_s * p.bandwidth("inter"))[::-1]
                    each = 1 if (widths % stage == 0).all() else 2
                    shared = crossing
                    rates = nodes[(np.arange(crossing) + each) // each] / stage
            rate, many = np.unique(rates, return_counts=True)
            hit = self._fixed_cache[key] = (
                np.concatenate([many, [crossing - shared, pp - 1 - crossing]]).astype(float),
                np.concatenate([rate, [inter, fastest]]),
                np.concatenate([np.full(len(rate), inter_latency),
                                [inter_latency, least_latency]]))
        return hit

    def _best_links(self, collective: str) -> tuple[float, float, float, float]:
        """The floors' links for `collective`: (the best network bandwidth, the best of any
        link, the network's least latency, any link's least latency), no NIC shared."""
        p, arr = self.params, self.cluster_for[collective]
        inter = float(arr.inter_bytes_per_s.max()) * p.bandwidth("inter")
        inter_latency = self.latency(collective, "inter",
                                     min(g.link_latency_inter_s for g in self.gpus))
        return (inter, max(inter, float(arr.intra_bytes_per_s.max()) * p.bandwidth("intra")),
                inter_latency, min(inter_latency, self.latency(
                    collective, "intra", min(g.link_latency_intra_s for g in self.gpus))))

    def dp_sync_floor_s(self, c: Candidate) -> float:
        """What the data-parallel sync adds at least to an iteration (eq. 4 waits for the
        stage that syncs last, which holds at least the mean of the synced parameters) on any
        order of whole nodes: `_dp_sync` on the fastest link and the lowest latency, over the
        network where every ring must cross nodes (a ring spans (dp cp - 1) tmp consecutive
        devices of the order: as many as the widest node, it cannot stay inside one), each at
        1/min(node width, tmp) of its node's network (that many rings leave a node at once);
        0 where the reduction may overlap the backward."""
        if c.replicas == 1 or self.is_megatron_fsdp(c) or self.spec.training.frozen_weights \
                or self.overlaps_grad_reduce(c):
            return 0.0
        # the micro-batches matter to ZeRO 2 and 3 alone (a reduction per micro-batch)
        gas = micro_batches(self.spec.training.global_batch_size, c.dp, c.mbs) \
            if c.zero_stage >= 2 else 0
        key = ("dp-floor", c.pp, c.dp, c.cp, c.tmp, gas, c.zero_stage, c.ep)
        hit = self._fixed_cache.get(key)
        if hit is None:
            p, arr = self.params, self.cluster_for["all_reduce"]
            inter, fastest, inter_latency, least_latency = self._best_links("all_reduce")
            widths = self.node_widths
            if (c.replicas - 1) * c.tmp >= widths.max():
                # every ring crosses; a node's consecutive devices hold min(width, tmp) of
                # them, each leaving it at once over its share of the NIC: a stage's rings
                # at most at the least share among its nodes (`_stage_rates`)
                bw = np.array(self._stage_rates(arr.inter_bytes_per_s / np.minimum(
                    widths, c.tmp) * p.bandwidth("inter"),
                    self.spec.cluster.num_devices // c.pp, c.pp, ("all_reduce", c.tmp)))
                lat = np.full(c.pp, inter_latency)
            else:
                bw, lat = np.array([fastest]), np.array([least_latency])
            fixed, per_param = self._dp_sync_rates(c, bw, lat)
            # the split that evens out the stages' syncs: P / sum_j (1 / per-parameter_j)
            # (one rate for all: the mean stage's)
            params = float(self.synced_params_per_layer(c).sum())
            spread = float((1.0 / per_param).sum()) * (c.pp / len(per_param)) \
                if (per_param > 0).all() else float("inf")
            hit = self._fixed_cache[key] = float(fixed.min() + params / spread)
        return hit

    def _stage_rates(self, rates: np.ndarray, stage: int, count: int, kind: tuple
                     ) -> list[float]:
        """The `count` fastest per-stage rates any order of whole nodes allows (`rates` by
        node, named by `kind` for the cache), where a stage (`stage` consecutive devices)
        runs at the least rate among its nodes: at most (devices of the nodes with a rate
        >= x) // stage stages have only such nodes, so the fastest rates go to as many
        stages as their nodes fill."""
        if count <= 0:
            return []
        key = ("stage-rates", kind, stage, count)
        hit = self._fixed_cache.get(key)
        if hit is None:
            by_rate = np.argsort(-rates, kind="stable")
            fill = np.cumsum(self.node_widths[by_rate]) // stage
            # the k-th stage (k = 1 ..) is filled once the k-th count of `fill` is reached
            hit = self._fixed_cache[key] = \
                rates[by_rate][np.searchsorted(fill, np.arange(1, count + 1))].tolist()
        return hit

    def _host_row(self, g: int, c: Candidate) -> np.ndarray:
        """[L]: the host's time to issue one micro-batch of each layer on device type
        self.gpus[g] (where its times are analytic), as `stage_costs` takes it; a layer
        takes at least this and at least its device time (synced_overlapped_time_s)."""
        key = ("host", g, c.tmp, c.mbs, c.cp, c.ep, c.activation_checkpointing,
               c.sequence_parallel)
        hit = self._fixed_cache.get(key)
        if hit is None:
            gpu = self.gpus[g]
            lt = self.timer.times(gpu, c.tmp, c.mbs, c.cp, c.ep)
            issue = self._fixed_costs(gpu, c.tmp, c.activation_checkpointing,
                                      c.sequence_parallel)[1]
            hit = self._fixed_cache[key] = np.where(lt.analytic, issue, 0.0)
        return hit

    def fits_nowhere(self, c: Candidate, orders) -> bool:
        """Whether a strategy with virtual stages is out of memory on every placement order,
        whichever of them is fastest: its split is fixed (Megatron-LM's uniform chunks), so
        its memory is known before its time is. False for one model chunk per stage, whose
        split depends on the times."""
        if c.virtual_stages == 1:
            return False
        chunks = self._chunks(c)
        return not any(self.split_fits(c, o, chunks) for o in orders)

    def split_fits(self, c: Candidate, order: DeviceOrder, partition: tuple[int, ...]) -> bool:
        """Whether `c` on `order`'s placement with the layer split `partition` fits in
        memory: the stage_memory that `evaluate` gives it, without its time."""
        layout = self.layout(c, order)
        return stages_fit(self.spec, self._strategy(c, partition, (), order.name),
                          layout.capacity_bytes, self._attention_scores(layout))

    def tp_floor_s(self, c: Candidate) -> np.ndarray:
        """[L]: each layer's tensor-parallel collectives of one micro-batch (`tp_time_s`) on
        the best link any ring could get: the cluster's largest bandwidth, intra- or
        inter-node, and its smallest per-message latency (a floor for every placement); with
        `overlaps_tp_comm`, 1/tmp of that (what the overlap leaves at least); cached (an
        array no caller writes to)."""
        key = ("tp-floor", c.tmp, c.mbs, c.cp, c.activation_checkpointing, c.sequence_parallel)
        hit = self._fixed_cache.get(key)
        if hit is None:
            hit = self._fixed_cache[key] = self._tp_floor_s(c)
        return hit

    def _tp_floor_s(self, c: Candidate) -> np.ndarray:
        """`tp_floor_s`, computed."""
        out = np.zeros(self.num_layers)
        bpe = self.spec.training.bytes_per_element
        p = self.params
        for kind, (elements, calls) in self.tp_collectives(
                c.activation_checkpointing, c.sequence_parallel).items():
            arr = self.cluster_for[kind] if self.cluster_for[kind] is not self.cluster \
                else self.cluster_for["all_reduce"]
            bw = max(float(arr.intra_bytes_per_s.max()) * p.bandwidth("intra"),
                     float(arr.inter_bytes_per_s.max()) * p.bandwidth("inter"))
            name = self._latency_kind(kind)
            lat = min(self.latency(name, "intra", min(g.link_latency_intra_s
                                                      for g in self.gpus)),
                      self.latency(name, "inter", min(g.link_latency_inter_s
                                                      for g in self.gpus)))
            out = out + comm.collective_time_s(kind, elements * bpe * c.mbs / c.cp, c.tmp, bw,
                                               lat, messages=calls)
        if self.overlaps_tp_comm(c):        # at least the first chunk's, tp_overlap_exposed_s
            return out / c.tmp
        return out

    def _attention_scores(self, layout: PlacedLayout) -> list[bool]:
        """Per stage: whether any of its device types runs standard attention (stores the
        attention scores)."""
        return [any(self.standard_attention[g] for g in gs) for gs in layout.stage_gpus]

    def add_memory(self, c: Candidate, order: DeviceOrder, e: Estimate) -> Estimate:
        """`e`, evaluated over `order` with with_memory=False, with the memory `evaluate`
        gives it (the same layout, from the cache)."""
        layout = self.layout(c, order)
        return replace(e, memory=stage_memory(
            self.spec, e.strategy, capacity_bytes=layout.capacity_bytes,
            attention_scores=self._attention_scores(layout)))

    def layout(self, c: Candidate, order: DeviceOrder | None = None,
               placement: np.ndarray | None = None) -> PlacedLayout:
        """The placement of (pp, dp, tmp): Megatron's over `order` (cached) or the one given."""
        p = self.params
        scale = dict(intra_scale=p.bandwidth("intra"), inter_scale=p.bandwidth("inter"))
        key = None if placement is not None else (order.name, c.pp, c.dp, c.cp, c.tmp,
                                                  tuple(scale.values()))
        hit = self._placement_cache.get(key) if key is not None else None
        if hit is not None:
            return hit
        if placement is None:
            placement = megatron_placement(order, c.pp, c.replicas, c.tmp)
        tp = dp = p2p = cp = None
        tp_kind = {}
        if c.tmp > 1:
            r = ring_links(self.cluster_for["all_reduce"], placement, **scale)
            tp = (r.bandwidth_bytes_per_s.min(axis=1), r.crosses_nodes.any(axis=1))
            for kind in ("all_gather", "reduce_scatter"):
                if self.cluster_for[kind] is not self.cluster:     # measured: its own links
                    r = ring_links(self.cluster_for[kind], placement, **scale)
                    tp_kind[kind] = (r.bandwidth_bytes_per_s.min(axis=1),
                                     r.crosses_nodes.any(axis=1))
        if c.replicas > 1:        # the gradients are reduced over dp x cp
            r = ring_links(self.cluster_for["all_reduce"], placement.transpose(0, 2, 1), **scale)
            dp = (r.bandwidth_bytes_per_s.min(axis=1), r.crosses_nodes.any(axis=1))
        if c.cp > 1:              # [stage, replica d, tensor rank, cp rank]
            rings = placement.reshape(c.pp, c.dp, c.cp, c.tmp).transpose(0, 1, 3, 2)
            r = ring_links(self.cluster_for["p2p"], rings.reshape(c.pp, -1, c.cp), **scale)
            cp = (r.bandwidth_bytes_per_s.min(axis=1), r.crosses_nodes.any(axis=1))
        if c.pp > 1:
            r = p2p_links(self.cluster_for["p2p"], placement, **scale)
            p2p = (r.bandwidth_bytes_per_s, r.crosses_nodes)
        hit = PlacedLayout(
            placement=placement, stage_gpus=self._stage_gpus(placement),
            capacity_bytes=self.capacity_bytes[placement.reshape(c.pp, -1)].min(axis=1),
            tp_links=tp, dp_links=dp, p2p_links=p2p, tp_kind_links=tp_kind, cp_links=cp)
        if key is not None:
            self._placement_cache[key] = hit
        return hit

    def _row_params(self, gpu) -> tuple:
        """What `stage_costs`' rows take from the coefficients for `gpu`: its compute scale,
        kernel floor and host costs (fitted or the catalog's), by its name."""
        p, n = self.params, gpu.name
        return (n, p.compute(n), p.fixed_cost("kernel_floor_s", n, gpu.kernel_floor_s),
                p.fixed_cost("host_block_pass_s", n, gpu.host_block_pass_s),
                p.fixed_cost("host_tp_allreduce_per_rank_s", n,
                             gpu.host_tp_allreduce_per_rank_s))

    def _stage_gpus(self, placement: np.ndarray) -> list[tuple[int, ...]]:
        """The device types (indices into self.gpus) of each stage of `placement`,
        ascending."""
        pp = placement.shape[0]
        present = np.zeros((pp, len(self.gpus)), dtype=bool)
        present[np.arange(pp)[:, None], self.gpu_of_device[placement.reshape(pp, -1)]] = True
        codes = (present << np.arange(len(self.gpus))).sum(axis=1).tolist()
        sets = self._type_sets
        for k in set(codes) - sets.keys():
            sets[k] = tuple(np.flatnonzero((k >> np.arange(len(self.gpus))) & 1).tolist())
        return [sets[k] for k in codes]

    def stage_costs(self, c: Candidate, layout: PlacedLayout) -> StageCosts:
        """Every per-layer cost array of the strategy (cost_models' terms, vectorised)."""
        p = self.params
        L = self.num_layers

        compute, host = np.zeros((c.pp, L)), np.zeros((c.pp, L))
        compute_forward, host_forward = np.zeros((c.pp, L)), np.zeros((c.pp, L))
        optimizer = np.zeros((c.pp, L))
        optimizer_share = memory_model.optimizer_shards(
            framework=self.spec.training.backend, zero_stage=c.zero_stage,
            precision=self.spec.training.precision, dp=c.replicas)
        ckpt = c.activation_checkpointing
        rows: dict = {}                 # stages holding the same device types cost the same
        for j in range(c.pp):
            types = layout.stage_gpus[j]
            if types not in rows:
                # kept for the other candidates and parts of the cluster (SharedRows) whose
                # stages hold these types, by all the row depends on (the coefficients too)
                key = ("stage-row", c.tmp, c.mbs, ckpt, c.selective_recompute,
                       c.sequence_parallel, c.cp, c.ep, c.zero_stage, p.layer_overhead(c.pp),
                       optimizer_share, p.zero_cost("zero_step_s_per_param", c.zero_stage),
                       p.zero_cost("zero_microbatch_s_per_param", c.zero_stage),
                       *(self._row_params(self.gpus[g]) for g in types))
                rows[types] = self._type_rows.get(key)
            if rows[types] is None:
                # device, host, optimizer, and the forward pass's device and host: per layer,
                # the slowest device type's passes (stage_pass_times_s) and the slowest host's
                row = np.zeros((5, L))
                for g in types:         # a stage runs at its slowest device type's pace
                    gpu = self.gpus[g]
                    scale = p.compute(gpu.name)
                    lt = self.timer.times(gpu, c.tmp, c.mbs, c.cp, c.ep)
                    _, issue, issue_forward = self._fixed_costs(gpu, c.tmp, ckpt,
                                                                c.sequence_parallel)
                    issue = np.where(lt.analytic, issue, 0.0)
                    take = issue > row[1]
                    row[1], row[4] = np.where(take, issue, row[1]), np.where(
                        take, np.where(lt.analytic, issue_forward, 0.0), row[4])
                    np.maximum(row[2], self.timer.optimizer_step_s(gpu, c.tmp) * scale
                               / optimizer_share + self._zero_time_s("zero_step_s_per_param", c),
                               out=row[2])
                passes = self.stage_pass_times_s(types, c)
                row[0], row[3] = passes.sum(axis=0), passes[0]
                rows[types] = self._type_rows[key] = row
            compute[j], host[j], optimizer[j], compute_forward[j], host_forward[j] = rows[types]
        if self.is_megatron_fsdp(c):    # each layer's pass: its compute or its unit's traffic
            fsdp_forward, fsdp_backward = self.fsdp_time_s(c, layout)
            backward = np.maximum(compute - compute_forward, fsdp_backward)
            compute_forward = np.maximum(compute_forward, fsdp_forward)
            compute = compute_forward + backward

        if self.spec.training.cpu_offload_layers and c.pp == 1:
            forward, backward = self.offload_exposed_s(c, layout, compute_forward,
                                                       compute - compute_forward)
            compute_forward = compute_forward + forward
            compute = compute + forward + backward
        tensor_parallel = tensor_parallel_forward = np.zeros((c.pp, L))
        if c.layer_collectives:   # each stage's rings run on its slowest ring's links
            tensor_parallel = self.tp_time_s(c, layout)
            if host.any():  # the forward's share matters only beside a host time
                tensor_parallel_forward = self.tp_time_s(c, layout, part=0)

        cut = self.cut_s(c, layout)
        sync, sync_fixed = self._dp_sync(c, layout)
        overlap = self._gradient_overlap(c, layout, compute - compute_forward)
        return StageCosts(compute_s=compute, host_s=host, host_forward_s=host_forward,
                          tensor_parallel_s=tensor_parallel,
                          cut_s=cut,
                          sync_s=sync, sync_fixed_s=sync_fixed, optimizer_s=optimizer,
                          microbatch_overhead_s=p.microbatch_overhead_s,
                          step_overhead_s=p.step_overhead(c.pp, c.replicas),
                          gradient_overlap=overlap,
                          layer_s=synced_overlapped_time_s(
                              host_forward, compute_forward + tensor_parallel_forward, host,
                              compute + tensor_parallel))

    def cut_s(self, c: Candidate, layout: PlacedLayout) -> np.ndarray:
        """[pp, L + 1]: cut_s[j, i], the P2P into stage j (activation and gradient) when it
        starts at layer i; zero for stage 0 and at the ends."""
        L = self.num_layers
        cut = np.zeros((c.pp, L + 1))
        if c.pp > 1:
            bw, crosses = layout.p2p_links
            lat = self.link_latencies_s("p2p", crosses, layout, boundaries=True)
            # each tensor rank sends its part (comm.boundary_shards), each context-parallel
            # rank its s/cp tokens
            shard = self.boundary_shards(c) * c.cp
            cut[1:, 1:L] = comm.stage_boundary_time_s(
                self.out_bytes[None, :L - 1] * c.mbs / shard, bw[:, None], lat[:, None])
            receiver, sender = self.boundary_gathers(c)
            if receiver or sender:      # DeepSpeed rebuilds the partitioned tensors
                gather = self.boundary_gather_s(c, layout)              # [pp, L]
                cut[1:, 1:L] += receiver * gather[1:, :L - 1] + sender * gather[:-1, :L - 1]
            mtp = self.spec.model.mtp_layers
            if mtp:     # Megatron-LM runs the MTP module's losses with the head, on the last stage
                cut[1:, L - mtp:L] += UNSPLITTABLE_CUT_S
        return cut

    def offload_exposed_s(self, c: Candidate, layout: PlacedLayout, forward: np.ndarray,
                          backward: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([1, L], [1, L]): what CPU activation offloading (training.cpu_offload_layers,
        pp 1) adds to each offloaded block's forward and backward: its saved activations go
        to the host beside the forward and come back beside the backward, on a side stream,
        at the slowest device type's host link (GPU.host_link_bytes_per_s); a copy longer
        than the pass it runs beside shows by the difference."""
        key = ("offload-bytes", c.mbs, c.tmp, c.cp, c.sequence_parallel,
               tuple(self._attention_scores(layout)))
        hit = self._fixed_cache.get(key)
        if hit is None:
            per = np.zeros(self.num_layers)
            per[list(offloaded_layers(self.spec))] = np.array(offloaded_saved_bytes(
                self.spec, mbs=c.mbs, tmp=c.tmp, sequence_parallel=c.sequence_parallel,
                attention_scores=self._attention_scores(layout)[0]), dtype=float) / c.cp
            hit = self._fixed_cache[key] = per
        host = min(self.gpus[g].host_link_bytes_per_s for g in layout.stage_gpus[0])
        copy = hit[None, :] / host
        on = hit[None, :] > 0
        return (np.where(on, np.maximum(copy - forward, 0.0), 0.0),
                np.where(on, np.maximum(copy - backward, 0.0), 0.0))

    def stage_pass_times_s(self, types, c: Candidate) -> np.ndarray:
        """[3, L]: `device_pass_times_s` of a stage holding the device types `types` (indices
        into self.gpus): per layer, every pass from the type whose passes add up to the
        longest (the first such), so that the passes of one layer always come from one type.
        The one rule `stage_costs` and the simulator's pass_times share."""
        best = np.full(self.num_layers, -1.0)
        out = np.zeros((3, self.num_layers))
        for g in types:
            passes = self.device_pass_times_s(self.gpus[g], c)
            total = passes.sum(axis=0)
            take = total > best
            out[:, take] = passes[:, take]
            best = np.where(take, total, best)
        return out

    def device_pass_times_s(self, gpu, c: Candidate) -> np.ndarray:
        """[3, L]: one micro-batch of each layer on `gpu`, per pass (forward, backward,
        recomputed forward; zeros without full recomputation): the layer timer's times x the
        calibrated compute scale, the knobs' time (`_knob_time`) in the backward, and, where
        the times are analytic, the kernel floor split evenly over the block passes. Their sum
        is the device time `stage_costs` charges; the simulator plays them one by one."""
        ckpt = c.activation_checkpointing
        scale = self.params.compute(gpu.name)
        floor_s = self.params.fixed_cost("kernel_floor_s", gpu.name, gpu.kernel_floor_s)
        # the framework's fixed cost per layer and micro-batch (CostParams.layer_overhead, one
        # figure per micro-batch) is charged half to the forward and half to the backward, so
        # that the simulator, which plays the passes one by one, pays it where it is spent
        framework_s = self.params.layer_overhead(c.pp) / 2
        key = ("passes", gpu.name, c.tmp, c.mbs, ckpt, c.selective_recompute,
               c.sequence_parallel, scale, floor_s, framework_s,
               self.params.zero_cost("zero_microbatch_s_per_param", c.zero_stage), c.cp, c.ep)
        hit = self._type_rows.get(key)
        if hit is None:
            lt = self.timer.times(gpu, c.tmp, c.mbs, c.cp, c.ep)
            floor = self._fixed_costs(gpu, c.tmp, ckpt)[0]
            per_pass = np.where(lt.analytic, floor / self._floor_passes[ckpt], 0.0)
            sync_fwd, sync_bwd = (np.where(lt.analytic, x, 0.0)
                                  for x in self.moe_sync_s(gpu, c.ep))
            fwd = lt.forward_s * scale + per_pass + framework_s + sync_fwd
            bwd = ((lt.backward_s + self._knob_time(gpu, c)) * scale + per_pass + framework_s
                   + sync_bwd + self._zero_time_s("zero_microbatch_s_per_param", c))
            hit = self._type_rows[key] = np.stack([fwd, bwd, fwd if ckpt
                                                   else np.zeros_like(fwd)])
        return hit

    def moe_sync_s(self, gpu, ep: int) -> tuple[np.ndarray | float, np.ndarray | float]:
        """Per layer, (forward, backward): what one micro-batch of each mixture-of-experts
        block costs beyond its kernels where Megatron-Core's dropless token dispatcher reads
        the routed token counts back to the host in every MoE layer (to size its
        all-to-alls; not with training.moe_sync_free, nor under DeepSpeed): the host, held
        there, cannot run ahead, and what it then spends on each of the rank's E/ep local
        experts (issuing their GEMMs, quantization and activation expert by expert) shows:
        the catalog's moe_expert_overhead per local expert and micro-batch, a third in the
        forward and two in the backward, as its work is split. 0 for the other layers (and,
        as `device_pass_times_s` charges it, where a measured time holds it already)."""
        if self._synced_experts is None or not gpu.moe_expert_overhead_s:
            return 0.0, 0.0
        per = self._synced_experts / ep * gpu.moe_expert_overhead_s
        return per / 3.0, per * (2.0 / 3.0)

    def _zero_time_s(self, name: str, c: Candidate) -> np.ndarray | float:
        """Per layer: ZeRO stage c.zero_stage's own bookkeeping as the framework probe measured
        it (`CostParams.zero_microbatch_s_per_param` / `zero_step_s_per_param`), for the
        parameters of the layer a device holds; 0 where none was measured, and under
        Megatron-LM (the probe measures DeepSpeed's ZeRO; Megatron's distributed optimizer is
        priced by its collectives alone)."""
        if self.spec.training.backend != "deepspeed":
            return 0.0
        per_param = self.params.zero_cost(name, c.zero_stage)
        return per_param * self.params_per_layer(c.tmp) if per_param else 0.0

    def _knob_time(self, gpu, c: Candidate) -> np.ndarray | float:
        """Per layer: device seconds selective recomputation adds (the attention core's forward
        again in backward) and sequence parallelism saves (the replicated elementwise work
        split over tmp), cost_models.recompute; analytic, also beside measured layer times
        (the profiles are measured without these knobs)."""
        sel = c.selective_recompute and not c.activation_checkpointing
        sp = c.sequence_parallel and c.tmp > 1
        if not sel and not sp:
            return 0.0
        key = ("knobs", gpu.name, c.tmp, c.mbs, sel, sp, c.activation_checkpointing, c.cp)
        hit = self._type_rows.get(key)
        if hit is None:
            t = self.spec.training
            kw = dict(tmp=c.tmp, mbs=c.mbs, device=device_speed(gpu, t.precision),
                      bytes_per_element=t.bytes_per_element)

            def knobs_s(layer: Layer) -> float:
                x = 0.0
                if sel:
                    x += selective_recompute_time_s(
                        layer, attention=self.spec.attention_for(gpu),
                        modules=t.recompute_modules, **kw).total_s
                if sp:
                    x += sequence_parallel_time_s(
                        layer, recompute=c.activation_checkpointing, framework=t.backend,
                        **kw).total_s
                return x

            out = per_distinct_layer(self.spec.model.layers, knobs_s)
            # one context-parallel rank's share: both knobs' work is per token (the
            # recomputed core too: its queries against every key, 1/cp of the whole)
            hit = np.array(out) / c.cp
            if self.recomputes_ring(c):
                # the recomputed core is Transformer Engine's ring attention again: its
                # merges too (the ring's transfers: cp_time_s)
                bw = device_speed(gpu, t.precision).memory_bandwidth_bytes_per_s
                hit = hit + np.array(per_distinct_layer(
                    self.spec.model.layers, lambda layer: cp_merge_bytes_by_pass(
                        layer, c.tmp, c.cp, t.bytes_per_element)[0])) * c.mbs / bw
            self._type_rows[key] = hit
        return hit

    def recomputes_ring(self, c: Candidate) -> bool:
        """Whether selective recomputation re-runs the attention core under context
        parallelism, inside the backward: Megatron-LM checkpoints its core attention
        (core_attn in training.recompute_modules), which with cp > 1 is Transformer Engine's
        whole ring attention, its transfers and merges."""
        return (c.cp > 1 and c.selective_recompute and not c.activation_checkpointing
                and "core_attn" in self.spec.training.recompute_modules)

    def _fixed_costs(self, gpu, tmp: int, recompute: bool, sequence_parallel: bool = False
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per layer: the kernel floor (device), the host time of one micro-batch on `gpu` and
        its forward pass's share (cost_models.compute), from the catalog's fixed costs or the
        fitted ones."""
        p = self.params
        floor_s = p.fixed_cost("kernel_floor_s", gpu.name, gpu.kernel_floor_s)
        costs = HostCosts(
            block_pass_s=p.fixed_cost("host_block_pass_s", gpu.name, gpu.host_block_pass_s),
            tp_allreduce_per_rank_s=p.fixed_cost("host_tp_allreduce_per_rank_s", gpu.name,
                                                 gpu.host_tp_allreduce_per_rank_s))
        key = ("fixed", tmp, recompute, floor_s, costs, sequence_parallel)
        hit = self._type_rows.get(key)
        if hit is None:
            layers = self.spec.model.layers
            rows = np.array(per_distinct_layer(layers, lambda l: (
                kernel_floor_time_s(l, recompute=recompute, kernel_floor_s=floor_s),
                *host_time_by_pass_s(l, tmp=tmp, recompute=recompute, host=costs,
                                     sequence_parallel=sequence_parallel,
                                     framework=self.spec.training.backend)))
                            ).reshape(len(layers), 4)
            issue = rows[:, 1:]
            hit = self._type_rows[key] = (rows[:, 0].copy(), issue.sum(axis=1),
                                          issue[:, 0].copy())
        return hit

    def _catalog_latency(self, stage_gpus) -> tuple[np.ndarray, np.ndarray]:
        """Per stage: the catalog's per-message latency (intra, inter) of its slowest device
        type's links (cost_models.comm.NCCL_RING_STEP_LATENCY_S)."""
        return (np.array([max(self.gpus[g].link_latency_intra_s for g in gs)
                          for gs in stage_gpus]),
                np.array([max(self.gpus[g].link_latency_inter_s for g in gs)
                          for gs in stage_gpus]))

    def link_latencies_s(self, collective: str, crosses_nodes, layout: "PlacedLayout", *,
                         boundaries: bool = False) -> np.ndarray:
        """Per stage (or, with `boundaries`, per stage boundary: the slower of its two
        stages): the per-message latency of `collective` on each ring's link, intra- or
        inter-node as `crosses_nodes` says, from the stage's slowest device type (see
        `latency`). The one source for the cost model and the simulator's input."""
        # per layout (the layouts are cached, and held here so that an id is never reused)
        hit = self._latency_cache.get(id(layout))
        if hit is None or hit[0] is not layout:
            hit = self._latency_cache[id(layout)] = (layout,
                                                     self._catalog_latency(layout.stage_gpus))
        per_stage = hit[1]
        if boundaries:
            per_stage = tuple(np.maximum(a[:-1], a[1:]) for a in per_stage)
        return self._link_latency(collective, np.asarray(crosses_nodes), per_stage)

    def _link_latency(self, collective: str, crosses_nodes: np.ndarray,
                      catalog: tuple = (0.0, 0.0)) -> np.ndarray:
        intra, inter = catalog
        return comm.link_latency_s(crosses_nodes, self.latency(collective, "intra", intra),
                                   self.latency(collective, "inter", inter))

    def is_megatron_fsdp(self, c: Candidate) -> bool:
        """Megatron-FSDP (zero_stage 3 under the megatron backend) over more than one rank."""
        return self.spec.training.backend == "megatron" and c.zero_stage == 3 \
            and c.replicas > 1

    def fsdp_time_s(self, c: Candidate, layout: PlacedLayout) -> tuple[np.ndarray, np.ndarray]:
        """([pp, L], [pp, L]): each layer's Megatron-FSDP traffic in one micro-batch's forward
        and backward (cost_models.comm.fsdp_unit_times_s) on its stage's slowest dp ring: its
        weights in the training precision, its gradients in Megatron's gradient dtype, over
        the dp x cp ranks (routed experts at their share, as the data-parallel sync counts
        them: `synced_params`)."""
        bw, crosses = layout.dp_links
        t = self.spec.training
        bpe = t.bytes_per_element
        grad = comm.gradient_reduce_bytes_per_element(t.precision, framework="megatron",
                                                      fp32_allreduce=t.grad_reduce_in_fp32)
        lat = self.link_latencies_s("all_gather", crosses, layout)
        params = self.synced_params(c, layout)
        return comm.fsdp_unit_times_s(params * bpe, params * grad, c.replicas,
                                      np.asarray(bw, dtype=float)[:, None],
                                      np.asarray(lat, dtype=float)[:, None])

    def _dp_sync(self, c: Candidate, layout: PlacedLayout, reduce_only: bool = False
                 ) -> tuple[np.ndarray, np.ndarray]:
        """The data-parallel sync of stage j is linear in the parameters it holds
        (cost_models.comm.data_parallel_sync_time_s on the stage's slowest dp ring):
        sync_j = fixed[j] + sum over its layers of per_layer[j, l], less what the calibrated
        dp_overlap hides; `reduce_only`: its gradient reduction's part
        (comm.gradient_reduce_time_s), which an overlapped reduction hides behind the backward
        (`_gradient_overlap`). Megatron-FSDP has none at the step: its traffic runs layer by
        layer (`fsdp_time_s`)."""
        if c.replicas == 1 or self.is_megatron_fsdp(c) or self.spec.training.frozen_weights:
            return np.zeros((c.pp, self.num_layers)), np.zeros(c.pp)
        bw, crosses = layout.dp_links
        fixed, per_param = self._dp_sync_rates(c, bw, self.link_latencies_s(
            "all_reduce", crosses, layout), reduce_only)
        return per_param[:, None] * self.synced_params(c, layout), fixed

    def _dp_sync_rates(self, c: Candidate, bw, lat, reduce_only: bool = False
                       ) -> tuple[np.ndarray, np.ndarray]:
        """(fixed, per parameter) of `_dp_sync` on rings of bandwidth `bw` and latency
        `lat` (arrays, one per stage)."""
        bpe = self.spec.training.bytes_per_element
        # DeepSpeed (the trial backend) reduces gradients in the training precision unless
        # fp32_allreduce is set, and overlaps them with the backward only where
        # gradient_reduce_overlaps_backward says so (not by default); dp_overlap is calibrated
        # (Megatron-LM: its gradient buffer's dtype, fp32 with bf16)
        framework = self.spec.training.backend
        grad_scale = comm.gradient_reduce_bytes_per_element(
            self.spec.training.precision, framework=framework,
            fp32_allreduce=self.spec.training.grad_reduce_in_fp32) / bpe
        gas = micro_batches(self.spec.training.global_batch_size, c.dp, c.mbs)
        gather_weights = framework == "deepspeed" and memory_model.deepspeed_engine(
            zero_stage=c.zero_stage, precision=self.spec.training.precision) == "bf16_optimizer"

        def sync(element_bytes: float) -> np.ndarray:      # [pp]: one parameter's bytes
            if reduce_only:
                return pipeline.exposed_time_s(comm.gradient_reduce_time_s(
                    grad_bytes=element_bytes * grad_scale, n=c.replicas,
                    bandwidth_bytes_per_s=bw, latency_s=lat, zero_stage=c.zero_stage, gas=gas,
                    framework=framework), self.params.dp_overlap)
            return pipeline.exposed_time_s(comm.data_parallel_sync_time_s(
                param_bytes=element_bytes, grad_bytes=element_bytes * grad_scale, n=c.replicas,
                bandwidth_bytes_per_s=bw, latency_s=lat,
                zero_stage=c.zero_stage, gas=gas, gather_weights_after_step=gather_weights,
                framework=framework), self.params.dp_overlap)

        fixed = sync(0.0)
        return fixed, sync(float(bpe)) - fixed

    def overlaps_grad_reduce(self, c: Candidate) -> bool:
        """Whether `c` reduces its gradients in buckets during the backward
        (TrainingSpec.overlaps_grad_reduce) and has a reduction to overlap: dp x cp > 1,
        weights trained, ZeRO 0-2 (ZeRO 3 and Megatron-FSDP move theirs layer by layer), and
        under DeepSpeed pp 1 (its PipelineEngine reduces at the accumulation boundary, after
        the backward, whatever overlap_comm says).

        megatron-core buckets the first pipeline stage's gradients (and the first model
        chunk's) only; a later stage reduces its whole buffer once its last backward ends,
        j backward passes before the first stage's does, which eq. 4 (every stage's sync after
        the same pipeline end) does not see: the same overlap stands in for that head start."""
        t = self.spec.training
        return (c.replicas > 1 and c.zero_stage != 3 and not t.frozen_weights
                and not (t.backend == "deepspeed" and c.pp > 1)
                and t.overlaps_grad_reduce(c.zero_stage))

    def _gradient_overlap(self, c: Candidate, layout: PlacedLayout, backward: np.ndarray
                          ) -> pipeline.GradientOverlap | None:
        """The overlapped part of the data-parallel sync (pipeline.GradientOverlap) with
        `backward` [pp, L] as the window, or None where `overlaps_grad_reduce` is false."""
        if not self.overlaps_grad_reduce(c):
            return None
        reduce, reduce_fixed = self._dp_sync(c, layout, reduce_only=True)
        t = self.spec.training
        windows = micro_batches(t.global_batch_size, c.dp, c.mbs) \
            if c.zero_stage == 2 and t.backend == "deepspeed" else 1
        return pipeline.GradientOverlap(
            reduce_s=reduce, reduce_fixed_s=reduce_fixed, backward_s=backward,
            elements=self.synced_params_per_layer(c),
            bucket_elements=float(comm.gradient_bucket_elements(t.backend, c.replicas)),
            windows=windows)

    def synced_params_per_layer(self, c: Candidate) -> np.ndarray:
        """[L] the parameters whose gradients one rank reduces over the dp x cp ranks, as the
        data-parallel sync prices them on the dp ring's own links: a layer's parameters, its
        routed experts' counted at the share of the bytes their own reduction moves, over
        the dp x cp x tmp / ep expert-data-parallel ranks instead (the ring's bus factor
        (n-1)/n at either size; none where each expert has one holder). Whatever the
        placement, `synced_params` counts at least these (the floors use them)."""
        params = self.params_per_layer(c.tmp, c.ep)
        if not self.num_experts or c.replicas == 1:
            return params
        key = ("synced", c.tmp, c.ep, c.replicas)
        hit = self._fixed_cache.get(key)
        if hit is None:
            experts = self.expert_params_per_layer(c.ep)
            edp = memory_model.expert_data_parallel(c.replicas, c.tmp, c.ep)
            share = ((edp - 1) / edp) / ((c.replicas - 1) / c.replicas)
            hit = self._fixed_cache[key] = params - experts + share * experts
        return hit

    def synced_params(self, c: Candidate, layout: PlacedLayout) -> np.ndarray:
        """[pp, L] `synced_params_per_layer` on each stage of `layout`, the routed experts'
        share scaled by how much slower per byte their own rings are than the dp ring:
        megatron-core reduces the experts' gradients (and gathers their weights) over the
        expert-data-parallel group, the ranks at the same place in each expert-parallel
        group, whose ring has more ranks per node leaving it at once (ep 8 on nodes of 8:
        every rank's ring leaves its node, each on its eighth of the NIC, where the dp ring's
        one crossing per node has the whole NIC). The slowdown is per stage: the dp ring's
        bandwidth over the slowest expert ring's (a stage's ranks in groups of ep consecutive
        ones, `_ep_links`; each ring the ranks at one place in every group, all rings at
        once), at least 1: where the expert rings are no slower, they are priced as the dp
        ring (a floor, so that `synced_params_per_layer` stays a lower bound). Cached per
        layout, which fixes tmp and the replicas."""
        params = self.synced_params_per_layer(c)
        if not self.num_experts or c.replicas == 1 or \
                memory_model.expert_data_parallel(c.replicas, c.tmp, c.ep) == 1:
            return np.broadcast_to(params, (c.pp, len(params)))
        key = ("edp", id(layout), c.ep)
        hit = self._fixed_cache.get(key)
        if hit is None or hit[0] is not layout:
            p = self.params
            rings = layout.placement.reshape(c.pp, -1, c.ep).transpose(0, 2, 1)
            r = ring_links(self.cluster_for["all_reduce"], rings,
                           intra_scale=p.bandwidth("intra"), inter_scale=p.bandwidth("inter"))
            dp_bw = np.asarray(layout.dp_links[0], dtype=float)
            slowdown = np.maximum(dp_bw / r.bandwidth_bytes_per_s.min(axis=1), 1.0)
            dense = self.params_per_layer(c.tmp, c.ep) - self.expert_params_per_layer(c.ep)
            priced = dense[None, :] + (params - dense)[None, :] * slowdown[:, None]
            priced.setflags(write=False)            # shared by every caller, as the cache's
            hit = self._fixed_cache[key] = (layout, priced)
        return hit[1]

    def uniform_split(self, pp: int) -> tuple[int, ...]:
        """Megatron-LM's uniform split of the blocks over pp stages, the embedding on the
        first and the head on the last (partition.uniform_partition; ValueError where pp
        exceeds the blocks)."""
        return uniform_partition(self.num_layers, pp, first=self.first_fixed,
                                 last=self.last_fixed)

    def _chunks(self, c: Candidate) -> tuple[int, ...]:
        """The interleaved schedule's chunks: Megatron-LM's uniform split into v*pp chunks
        (partition.interleaved_partition), chunk k on stage k mod pp; the only assignment
        Megatron runs, so the DP does not move layers between chunks. A model whose blocks
        split evenly on no pipeline (DeepSeek-V3 with MTP) gets chunks as even as whole
        blocks make them by each layer's forward FLOPs (its layout, given to Megatron-LM
        block by block)."""
        chunks = c.virtual_stages * c.pp
        hit = self._chunk_cache.get(chunks)
        if hit is None:
            hit = self._chunk_cache[chunks] = tuple(int(x) for x in interleaved_partition(
                self.num_layers, chunks, first=self.first_fixed, last=self.last_fixed,
                weights=self._layer_flops))
        return hit

    @cached_property
    def _layer_flops(self) -> list[float]:
        """Each layer's forward FLOPs per sample (`_chunks`' weights), once per distinct
        layer."""
        return per_distinct_layer(self.spec.model.layers, forward_flops)

    def _partition(self, c: Candidate, costs: StageCosts, layout: PlacedLayout,
                   partition: str | tuple[int, ...], scores: bool) -> tuple[int, ...]:
        if isinstance(partition, tuple):
            return partition
        if c.virtual_stages > 1:
            return self._chunks(c)
        if partition == "uniform":
            return self.uniform_split(c.pp)
        gas = micro_batches(self.spec.training.global_batch_size, c.dp, c.mbs)
        mem_layer, mem_budget = self._memory_arrays(c, gas, layout, scores)
        kw = dict(sync_layer_s=costs.after_pipeline_s, sync_fixed_s=costs.sync_fixed_s,
                  checked=False)          # arrays built to optimal_partition's rules
        result = optimal_partition(costs.layer_s, costs.cut_s, gas, memory_layer_bytes=mem_layer,
                                   memory_budget_bytes=mem_budget, **kw)
        if result is None:      # no split fits: report the fastest one, which won't fit
            result = optimal_partition(costs.layer_s, costs.cut_s, gas, **kw)
            return result.boundaries
        if c.pp == 1 or (gas == 1 or not costs.cut_s.any()) and costs.gradient_overlap is None:
            return result.boundaries
        # The DP minimises eq. 5, which pays each cut once; 1F1B's steady state pays the cuts
        # a stage waits for in every micro-batch (pipeline_1f1b_time_s). A second DP with
        # every cut weighted as if it were on the steady state's path, and Megatron's uniform
        # split, are candidates too; the one the full objective ranks first is kept. (The DPs
        # charge an overlapped gradient reduction whole, linear in the layers; the full
        # objective charges what the backward leaves exposed, pipeline.exposed_sync_s.)
        heavy = costs.cut_s * (1.0 + self.p2p_blocking_share * (gas - 1))
        other = optimal_partition(costs.layer_s, heavy, gas, memory_layer_bytes=mem_layer,
                                  memory_budget_bytes=mem_budget, **kw)
        candidates = [result.boundaries] + ([other.boundaries] if other is not None else [])
        try:
            uniform = self.uniform_split(c.pp)
        except ValueError:
            uniform = None
        if uniform is not None and (mem_layer is None or np.all(
                pipeline.stage_totals(mem_layer, uniform) <= mem_budget)):
            candidates.append(uniform)
        # the DPs and the uniform split often agree: each distinct split is costed once
        return min(dict.fromkeys(candidates), key=lambda b: pipeline.one_f_one_b_iteration_s(
            costs, b, gas, blocking_share=self.p2p_blocking_share))

    def _memory_arrays(self, c: Candidate, gas: int, layout: PlacedLayout, scores: bool
                       ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """Memory as the partition DP needs it (cost_models.memory.linear_stage_memory),
        against each stage's smallest device's usable capacity; with the attention scores
        stored when any stage runs standard attention (the exact check is per stage)."""
        if c.pp == 1:
            return None, None
        key = ("linear-memory", c.tmp, c.dp, c.mbs, gas, c.zero_stage,      # the model's alone
               c.activation_checkpointing, scores, c.selective_recompute, c.sequence_parallel,
               c.cp, c.ep)
        lin = self._type_rows.get(key)
        if lin is None:
            t = self.spec.training
            lin = memory_model.linear_stage_memory(
                self.spec.model.layers, dp=c.replicas, tmp=c.tmp, mbs=c.mbs, gas=gas, cp=c.cp,
                ep=c.ep,
                zero_stage=c.zero_stage, recompute=c.activation_checkpointing,
                precision=t.precision, framework_overhead_bytes=t.framework_overhead_bytes,
                attention_scores=scores, sequence_parallel=c.sequence_parallel,
                selective=t.selective(c.selective_recompute), framework=t.backend,
                frozen=t.frozen_weights, grad_fp32=t.grad_reduce_in_fp32)
            self._type_rows[key] = lin
        layer_bytes, reserved = lin.stage_arrays(c.pp, gas)
        usable = layout.capacity_bytes * (1.0 - self.spec.training.memory_headroom)
        return layer_bytes, usable - reserved

    def _assemble(self, strategy: Strategy, costs: StageCosts, capacity: np.ndarray,
                  scores: list[bool] | None) -> Estimate:
        """The closed form on the chosen split (cost_models.pipeline: AMP eq. 5 and 4, or the
        interleaved schedule's with Megatron-LM's P2P, the only framework that runs it), with
        the breakdown and the memory check (scores None: without the memory)."""
        s = strategy
        if s.virtual_stages > 1:
            terms = pipeline.interleaved_iteration(
                costs, s.partition, s.gas, s.pp, s.virtual_stages,
                blocking_share=self.interleaved_blocking_share)
        else:
            terms = pipeline.one_f_one_b_iteration(costs, s.partition, s.gas,
                                                   blocking_share=self.p2p_blocking_share)
        breakdown = Breakdown(
            compute_s=terms.compute_s, pipeline_bubble_s=terms.pipeline_bubble_s,
            p2p_s=terms.p2p_s, tensor_parallel_s=terms.tensor_parallel_s,
            data_parallel_s=terms.data_parallel_s, optimizer_s=terms.optimizer_s)
        return Estimate(strategy=s, iteration_time_s=terms.iteration_s, breakdown=breakdown,
                        stage_time_s=tuple(float(x) for x in terms.stage_time_s),
                        memory=() if scores is None else stage_memory(
                            self.spec, s, capacity_bytes=capacity, attention_scores=scores),
                        timing_sources=self.sources(), backend=self.spec.training.backend)
