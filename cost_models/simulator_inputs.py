"""The input arrays of the simulator's event loop (`cost_models.simulator_kernels.event_loop`),
built from `cost_models.simulator`'s arguments: the links and the routes that flows take over
them (`LinkUse`, `LinksAndRoutes`), the flows (P2P transfers, gradient buckets, weight
all-gathers, ZeRO 3's per-layer collectives: `Flows`) and each stage's compute tasks
(`ComputeOps`).

Ids: compute task (j, k) of K per stage is j*K + k (the last one the optimizer step); flows
are numbered as they are added, P2P activations (boundary b, micro-batch m) b*gas + m, then
their gradients (pp-1)*gas + b*gas + m, then each stage's buckets and weight all-gather.
Stage j's streams are 3j (activations sent to j+1), 3j+1 (gradients sent to j-1) and 3j+2
(data-parallel collectives); each is first-in first-out, in flow id order."""
from __future__ import annotations

import functools
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from . import comm
from .schedule import (BACKWARD, FORWARD, IDLE, RECOMPUTE, blocking_order, megatron_order,
                       schedule_order)
from .simulator_kernels import FLOW_BUCKET, FLOW_GATHER, FLOW_P2P, FLOW_PREFETCH

MAX_BUCKETS_PER_STAGE = 1_000_000
"""A bound on the gradient buckets of one stage and iteration (a guard against a bucket size
given in the wrong unit)."""


def nonnegative_floats(name: str, values, n: int, *, default: float | None = None
                       ) -> np.ndarray:
    """`values` as n finite floats >= 0 (None: n times `default`, if any); else ValueError."""
    if values is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return np.full(n, float(default))
    a = np.asarray(values, dtype=float).reshape(-1)
    if a.shape[0] != n:
        raise ValueError(f"{name} needs {n} values, got {a.shape[0]}")
    if not (np.all(np.isfinite(a)) and np.all(a >= 0.0)):
        raise ValueError(f"{name} must be finite and >= 0, got {a.tolist()}")
    return a


# ----------------------------------------------------------------------------- links

@dataclass(frozen=True)
class LinkUse:
    """A route entry: `copies` identical parallel flows of the simulated one cross `link`
    (e.g. the tmp rings of one stage that all cross one NIC); each takes a fair share."""

    link: Hashable
    copies: int = 1


Route = Sequence[Hashable]
"""Links a flow crosses: link ids (keys of `links`), or LinkUse(link id, copies)."""


class LinksAndRoutes:
    """Link ids -> dense indices, with bandwidths, and flow routes as CSR arrays."""

    def __init__(self, bandwidth: Mapping[Hashable, float]):
        self.index: dict = {}
        self.bw: list[float] = []
        for link, b in bandwidth.items():
            self.add(link, b)
        self.parts: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        """Blocks of consecutive flows: (links per flow, their link indices, their copies)."""
        self._pending: tuple[list, list, list] = ([], [], [])
        """The flows of `route` calls since the last block, as lists (one array per block,
        not per call: a simulation routes hundreds of small routes)."""
        self.streams: dict[int, set] = {}

    def add(self, link, bandwidth: float) -> None:
        b = float(bandwidth)
        if not b > 0.0:                  # +inf allowed: a link that never limits
            raise ValueError(f"link {link!r}: bandwidth must be > 0 bytes/s, got {bandwidth}")
        if link in self.index:
            raise ValueError(f"link {link!r} is given twice")
        self.index[link] = len(self.bw)
        self.bw.append(b)

    def route(self, route: Route, stream: int, count: int = 1) -> None:
        """`count` consecutive flows of `stream`, each over `route`."""
        merged: dict[int, float] = {}
        if isinstance(route, (str, bytes, LinkUse)):
            raise ValueError(f"a route is a sequence of link ids, got {route!r}")
        for item in route:
            link, copies = (item.link, item.copies) if isinstance(item, LinkUse) else (item, 1)
            if link not in self.index:
                raise ValueError(f"link {link!r} of a route has no bandwidth")
            if isinstance(copies, bool) or not isinstance(copies, (int, np.integer)) \
                    or copies < 1:
                raise ValueError(f"link {link!r}: copies must be >= 1, got {copies}")
            li = self.index[link]
            merged[li] = merged.get(li, 0.0) + float(copies)
        for li in merged:
            self.streams.setdefault(li, set()).add(stream)
        count = int(count)
        degrees, indices, copies_ = self._pending
        degrees.extend([len(merged)] * count)
        indices.extend(list(merged.keys()) * count)
        copies_.extend(list(merged.values()) * count)

    def _flush(self) -> None:
        degree, link, mult = self._pending
        if degree:
            self.parts.append((np.array(degree, dtype=np.int64), np.array(link, dtype=np.int64),
                               np.array(mult, dtype=float)))
            self._pending = ([], [], [])

    def route_each(self, links, streams) -> None:
        """One flow per item, in order: flow k over the single link links[k] (one copy), of
        stream streams[k]; what `route([links[k]], streams[k])` for each k does, at once."""
        if len(links) != len(streams):
            raise ValueError(f"{len(links)} links for {len(streams)} streams")
        try:
            li = np.array([self.index[x] for x in links], dtype=np.int64)
        except KeyError as exc:
            raise ValueError(f"link {exc.args[0]!r} of a route has no bandwidth") from None
        self.route_indices(li, streams)

    def route_indices(self, link_indices: np.ndarray, streams) -> None:
        """`route_each` with the links given by their indices (`index`) instead of keys."""
        li = np.asarray(link_indices, dtype=np.int64).reshape(-1)
        if len(li) != len(streams):
            raise ValueError(f"{len(li)} links for {len(streams)} streams")
        for i, stream in set(zip(li.tolist(), streams)):
            self.streams.setdefault(i, set()).add(stream)
        self._flush()
        self.parts.append((np.ones(len(li), dtype=np.int64), li, np.ones(len(li))))

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(ptr [flows + 1], link [entries], copies [entries]) in the order routed."""
        self._flush()
        degree = np.concatenate([d for d, _, _ in self.parts] or [np.zeros(0, np.int64)])
        ptr = np.concatenate([[0], np.cumsum(degree)]).astype(np.int64)
        link = np.concatenate([li for _, li, _ in self.parts]
                              or [np.zeros(0, np.int64)]).astype(np.int64)
        mult = np.concatenate([m for _, _, m in self.parts] or [np.zeros(0)]).astype(float)
        return ptr, link, mult

    def slot_ptr(self) -> np.ndarray:
        """Slots per link: at most one flow per stream that uses it is in flight at once."""
        counts = [len(self.streams.get(i, ())) for i in range(len(self.bw))]
        return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    def kernel_arrays(self, nf: int) -> tuple[np.ndarray, ...]:
        """The event loop's link arrays for the nf flows routed: (flow ptr, link, copies,
        link bandwidth, link slot ptr, fixed rate). A flow whose every link carries only its
        own stream never shares: its fixed rate is its slowest link's share (+inf without
        links); 0 for a flow that may share a link (the loop computes its fair rate)."""
        f_lptr, f_link, f_mult = self.csr()
        link_bw = np.asarray(self.bw, dtype=float)
        slot_ptr = self.slot_ptr()
        shared_entry = (slot_ptr[1:] - slot_ptr[:-1])[f_link] > 1
        degree = f_lptr[1:] - f_lptr[:-1]
        alone = np.full(nf, np.inf)
        has = degree > 0
        if np.any(has):
            alone[has] = np.minimum.reduceat(link_bw[f_link] / f_mult, f_lptr[:-1][has])
        flow_of_entry = np.repeat(np.arange(nf), degree)
        alone[np.bincount(flow_of_entry[shared_entry], minlength=nf) > 0] = 0.0
        return f_lptr, f_link, f_mult, link_bw, slot_ptr, alone


# ----------------------------------------------------------------------------- flows

@dataclass(frozen=True, eq=False)
class Flows:
    """Every flow's columns, by flow id: its stream (3j, 3j+1, 3j+2 for stage j), the stage
    that sends or runs it (owner) and the one whose task its end wakes (wake), its kind
    (simulator_kernels.FLOW_*), latency, wire bytes, the fraction of its backward after
    which a bucket is complete (bucket_frac), micro-batch, peer (a transfer's other stage, a
    bucket's index, a ZeRO 3 collective's layer) and count (a bucket's stage's buckets per
    backward)."""

    stream: np.ndarray
    owner: np.ndarray
    wake: np.ndarray
    kind: np.ndarray
    latency_s: np.ndarray
    wire_bytes: np.ndarray
    bucket_frac: np.ndarray
    microbatch: np.ndarray
    peer: np.ndarray
    count: np.ndarray

    def __len__(self) -> int:
        return int(self.stream.shape[0])

    def stream_queues(self, num_streams: int) -> tuple[np.ndarray, np.ndarray]:
        """(ptr [num_streams + 1], flow ids): each stream's flows, in id order (the order
        they are produced in)."""
        order = np.argsort(self.stream, kind="stable").astype(np.int64)
        s_ptr = np.concatenate([[0], np.cumsum(np.bincount(self.stream, minlength=num_streams))]
                               ).astype(np.int64)
        return s_ptr, order


class FlowColumns:
    """`Flows` in the making: blocks of flows appended in id order (`add`), then `flows`."""

    _INT = ("stream", "owner", "wake", "kind", "microbatch", "peer", "count")
    _FLOAT = ("latency_s", "wire_bytes", "bucket_frac")

    def __init__(self):
        self.parts: dict[str, list] = {name: [] for name in self._INT + self._FLOAT}

    def __len__(self) -> int:
        return sum(len(a) for a in self.parts["stream"])

    def add(self, **columns) -> None:
        """One block of flows: an array of its values for each column of `Flows`."""
        for name, parts in self.parts.items():
            parts.append(columns[name])

    def flows(self) -> Flows:
        def cat(parts, dtype):
            return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)

        return Flows(**{name: cat(self.parts[name], np.int64) for name in self._INT},
                     **{name: cat(self.parts[name], float) for name in self._FLOAT})


def add_p2p_flows(columns: FlowColumns, links: LinksAndRoutes, *, pp: int, gas: int,
                  p2p_bytes, latency_s, bandwidth, routes, grad_routes) -> None:
    """Every boundary's activation of every micro-batch, then every gradient, each over a
    private link per boundary and direction of `bandwidth`, or over `routes` (activations)
    and `grad_routes` (gradients, default the same)."""
    p2p_b = nonnegative_floats("p2p_bytes", p2p_bytes, pp - 1, default=0.0)
    p2p_l = nonnegative_floats("p2p_latency_s", latency_s, pp - 1, default=0.0)
    if routes is not None and bandwidth is not None:
        raise ValueError("give p2p_bandwidth_bytes_per_s (private links) or p2p_routes, not both")
    if grad_routes is not None and routes is None:
        raise ValueError("p2p_grad_routes needs p2p_routes")
    if pp == 1:
        return
    if routes is None:
        if bandwidth is None:
            if np.any(p2p_b > 0):
                raise ValueError("p2p_bytes needs p2p_bandwidth_bytes_per_s or p2p_routes")
            bw = np.full(pp - 1, np.inf)
        else:
            bw = np.asarray(bandwidth, dtype=float).reshape(-1)
            if bw.shape[0] != pp - 1:
                raise ValueError(f"p2p_bandwidth_bytes_per_s needs {pp - 1} values")
        fwd_routes = []
        bwd_routes = []
        for j in range(pp - 1):
            links.add(("p2p", j, "activation"), bw[j])
            links.add(("p2p", j, "gradient"), bw[j])
            fwd_routes.append([("p2p", j, "activation")])
            bwd_routes.append([("p2p", j, "gradient")])
    else:
        fwd_routes = list(routes)
        bwd_routes = list(grad_routes) if grad_routes is not None else fwd_routes
        if len(fwd_routes) != pp - 1 or len(bwd_routes) != pp - 1:
            raise ValueError(f"p2p routes need {pp - 1} entries (one per boundary)")
    for direction in (0, 1):
        for j in range(pp - 1):
            sender = j if direction == 0 else j + 1
            links.route(fwd_routes[j] if direction == 0 else bwd_routes[j],
                        3 * sender + direction, gas)
    # the flows in the same order: direction, then boundary, then micro-batch
    b = np.arange(pp - 1, dtype=np.int64)
    sender = np.concatenate([b, b + 1])
    wake = np.concatenate([b + 1, b])
    n = 2 * (pp - 1) * gas
    columns.add(stream=np.repeat(3 * sender + np.repeat([0, 1], pp - 1), gas),
                owner=np.repeat(sender, gas), wake=np.repeat(wake, gas),
                kind=np.full(n, FLOW_P2P), latency_s=np.tile(np.repeat(p2p_l, gas), 2),
                wire_bytes=np.tile(np.repeat(p2p_b, gas), 2), bucket_frac=np.zeros(n),
                microbatch=np.tile(np.arange(gas), 2 * (pp - 1)), peer=np.repeat(wake, gas),
                count=np.zeros(n))


@dataclass(frozen=True, eq=False)
class DataParallelFlows:
    """Per stage: its buckets per emitting backward (nb), its first bucket's flow id
    (bptr), the buckets its optimizer step waits for (buckets), its weight all-gather's flow
    id (gather_flow, -1: none); the backwards that emit buckets (emitters: the last one, or
    all gas); the dp latency per ring step and the routes (None for dp = 1)."""

    nb: np.ndarray
    bptr: np.ndarray
    buckets: np.ndarray
    gather_flow: np.ndarray
    emitters: int
    latency_s: np.ndarray
    routes: list | None


def add_data_parallel_flows(columns: FlowColumns, links: LinksAndRoutes, *, pp: int,
                            gas: int, dp: int, gradient_bytes, gather_bytes_after_step,
                            latency_s, bandwidth, routes, bucket_bytes: float,
                            gradient_collective: str, reduce_every_microbatch: bool,
                            chunk_emitters: int = 0) -> DataParallelFlows:
    """Each stage's gradient buckets (of the last backward, or of every backward with
    reduce_every_microbatch, or with chunk_emitters = v of the last backward of each of the
    v model chunks, `gradient_bytes` then being one chunk's), then its weight all-gather
    after the step, over a private link of `bandwidth` per stage or over `routes`. dp = 1:
    none."""
    if routes is not None and bandwidth is not None:
        raise ValueError("give dp_bandwidth_bytes_per_s (private links) or dp_routes, not both")
    grad = nonnegative_floats("gradient_bytes", gradient_bytes, pp, default=0.0)
    gather = nonnegative_floats("gather_bytes_after_step", gather_bytes_after_step, pp,
                                default=0.0)
    dp_l = nonnegative_floats("dp_latency_s", latency_s, pp, default=0.0)
    emitters = chunk_emitters or (gas if reduce_every_microbatch else 1)
    if dp == 1:
        zeros = np.zeros(pp, dtype=np.int64)
        return DataParallelFlows(nb=zeros, bptr=zeros.copy(), buckets=zeros.copy(),
                                 gather_flow=np.full(pp, -1, dtype=np.int64),
                                 emitters=emitters, latency_s=dp_l, routes=None)
    private = routes is None
    if private:
        if bandwidth is None:
            raise ValueError("dp > 1 needs dp_bandwidth_bytes_per_s or dp_routes")
        bw = np.asarray(bandwidth, dtype=float).reshape(-1)
        if bw.shape[0] != pp:
            raise ValueError(f"dp_bandwidth_bytes_per_s needs {pp} values")
        for j in range(pp):
            links.add(("dp", j), bw[j])
        routes = [[("dp", j)] for j in range(pp)]
    else:
        routes = list(routes)
        if len(routes) != pp:
            raise ValueError(f"dp_routes needs {pp} entries (one per stage)")
    nb, bptr, stage = _add_dp_flow_block(
        columns, pp=pp, gas=gas, dp=dp, grad=grad, gather=gather, dp_l=dp_l,
        bucket_bytes=bucket_bytes, gradient_collective=gradient_collective,
        emitters=emitters, chunk_emitters=chunk_emitters)
    # every flow of stage j (its buckets, then its all-gather) over routes[j]
    if private:
        links.route_indices(np.array([links.index[("dp", j)] for j in range(pp)])[stage],
                            (3 * stage + 2).tolist())
    else:
        for j, n in enumerate(np.bincount(stage, minlength=pp).tolist()):
            if n:
                links.route(routes[j], 3 * j + 2, n)
    buckets = nb * emitters
    return DataParallelFlows(nb=nb, bptr=bptr, buckets=buckets,
                             gather_flow=np.where(gather > 0, bptr + buckets, -1),
                             emitters=emitters, latency_s=dp_l, routes=routes)


def _add_dp_flow_block(columns: FlowColumns, *, pp: int, gas: int, dp: int, grad: np.ndarray,
                       gather: np.ndarray, dp_l: np.ndarray, bucket_bytes: float,
                       gradient_collective: str, emitters: int, chunk_emitters: int
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`add_data_parallel_flows`' flows, as one block of columns: each stage's buckets, then
    its all-gather. Returns each stage's buckets per emitter (nb), its first flow's id (bptr)
    and each added flow's stage."""
    stage_nb = np.zeros(pp, dtype=np.int64)
    sizes, fracs = [], []
    for j, g in enumerate(grad.tolist()):
        nb = int(math.ceil(g / bucket_bytes)) if g > 0 else 0
        if nb * emitters > MAX_BUCKETS_PER_STAGE:
            raise ValueError(f"stage {j}: {g:.3g} gradient bytes in buckets of "
                             f"{bucket_bytes:.3g} bytes make {nb * emitters} buckets; at "
                             f"most {MAX_BUCKETS_PER_STAGE} are simulated")
        stage_nb[j] = nb
        if nb:
            size, frac = _bucket_sizes(grad[j], bucket_bytes, nb)
            sizes.append(np.tile(size, emitters))
            fracs.append(np.tile(frac, emitters))
    stage_buckets = stage_nb * emitters
    has_gather = gather > 0
    per_stage = stage_buckets + has_gather
    first = np.concatenate([[0], np.cumsum(per_stage)[:-1]]).astype(np.int64)
    total = int(per_stage.sum())
    stage = np.repeat(np.arange(pp), per_stage)
    bptr = len(columns) + first
    if total == 0:
        return stage_nb, bptr, stage
    # each flow's place in its stage's block: the buckets first, then the all-gather
    place = np.arange(total) - np.repeat(first, per_stage)
    is_gather = place >= stage_buckets[stage]
    bucket = ~is_gather
    nb_of = stage_nb[stage]
    latency = np.where(is_gather, comm.latency_steps("all_gather", dp) * dp_l[stage],
                       comm.latency_steps(gradient_collective, dp) * dp_l[stage])
    wire = np.zeros(total)
    frac = np.zeros(total)
    if sizes:
        wire[bucket] = comm.bus_factor(gradient_collective, dp) * np.concatenate(sizes)
        frac[bucket] = np.concatenate(fracs)
    wire[is_gather] = comm.bus_factor("all_gather", dp) * gather[stage[is_gather]]
    # a bucket's index among its stage's: emitter e's nb buckets come e-th
    k = np.where(bucket, place, 0)
    nb_safe = np.maximum(nb_of, 1)
    micro = np.where(is_gather, -1, gas - 1 if chunk_emitters
                     else gas - emitters + k // nb_safe)
    columns.add(stream=3 * stage + 2, owner=stage, wake=stage,
                kind=np.where(is_gather, FLOW_GATHER, FLOW_BUCKET), latency_s=latency,
                wire_bytes=wire, bucket_frac=frac, microbatch=micro,
                peer=np.where(is_gather, -1, k % nb_safe),
                count=np.where(is_gather, 0, nb_of))
    return stage_nb, bptr, stage


def _bucket_sizes(grad: float, bucket_bytes: float, nb: int) -> tuple[np.ndarray, np.ndarray]:
    """The nb buckets of `grad` bytes (the last one partial), and the fraction of the
    gradients complete at the end of each."""
    sizes = np.full(nb, float(bucket_bytes))
    sizes[-1] = grad - bucket_bytes * (nb - 1)
    frac = np.minimum(np.cumsum(sizes) / grad, 1.0)
    frac[-1] = 1.0
    return sizes, frac


# ----------------------------------------------------------------------------- ZeRO 3

def zero3_inputs(layer_f, layer_b, param, grad, *, fwd, bwd, rec, pp, dp, other):
    """The checked ZeRO 3 arrays of `simulate_iteration` (forward, backward, parameter and
    gradient bytes per layer), or None where none is given."""
    given = [x is not None for x in (layer_f, layer_b, param, grad)]
    if not any(given):
        return None
    if not all(given):
        raise ValueError("ZeRO 3 needs zero3_layer_forward_s, zero3_layer_backward_s, "
                         "zero3_param_bytes and zero3_grad_bytes together")
    if pp != 1 or dp < 2:
        raise ValueError(f"ZeRO 3 is simulated for pp = 1 and dp > 1 (DeepSpeed's pipeline "
                         f"engine rejects ZeRO 3), got pp = {pp}, dp = {dp}")
    gradient_bytes, gather_bytes_after_step, reduce_every_microbatch = other
    if gradient_bytes is not None or gather_bytes_after_step is not None \
            or reduce_every_microbatch:
        raise ValueError("ZeRO 3 reduce-scatters per layer (zero3_grad_bytes): gradient_bytes, "
                         "gather_bytes_after_step and reduce_every_microbatch do not apply")
    n = np.asarray(layer_f, dtype=float).reshape(-1).shape[0]
    if n < 1:
        raise ValueError("zero3_layer_forward_s needs at least one layer")
    out = tuple(nonnegative_floats(name, x, n) for name, x in (
        ("zero3_layer_forward_s", layer_f), ("zero3_layer_backward_s", layer_b),
        ("zero3_param_bytes", param), ("zero3_grad_bytes", grad)))
    for name, total, want in (("forward", out[0].sum(), fwd[0]),
                              ("backward", out[1].sum(), bwd[0] + (0.0 if rec is None
                                                                   else rec[0]))):
        if not math.isclose(total, want, rel_tol=1e-9, abs_tol=1e-12):
            raise ValueError(f"zero3_layer_{name}_s sums to {total:.9g} s, but the stage's "
                             f"{name} is {want:.9g} s")
    return out


def zero3_order(gas: int, layers: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """ZeRO 3's compute stream at pp = 1: a no-op (it issues the first gather), then per
    micro-batch the forward of each layer in order and the backward of each in reverse:
    (kind, microbatch, layer), [1, 1 + 2 gas layers] arrays."""
    fwd_l = np.arange(layers, dtype=np.int64)
    per_mb_kind = np.concatenate([np.full(layers, FORWARD), np.full(layers, BACKWARD)])
    per_mb_layer = np.concatenate([fwd_l, fwd_l[::-1]])
    kind = np.concatenate([[IDLE], np.tile(per_mb_kind, gas)]).astype(np.int64)
    micro = np.concatenate([[-1], np.repeat(np.arange(gas), 2 * layers)]).astype(np.int64)
    layer = np.concatenate([[0], np.tile(per_mb_layer, gas)]).astype(np.int64)
    return kind[None, :], micro[None, :], layer[None, :]


def add_zero3_flows(columns: FlowColumns, links: LinksAndRoutes, z3, layer: np.ndarray,
                    kinds: np.ndarray, micro: np.ndarray, *, dp: int, latency_s: float,
                    route: Route) -> tuple[int, int, int]:
    """ZeRO 3's per-layer parameter all-gathers, one per compute task after the first (on
    stream 0, free at pp = 1), then the reduce-scatter of each backward task (on the dp
    stream), all over `route`: (first gather's id, first reduce-scatter's id, the number of
    reduce-scatters)."""
    first_gather = len(columns)
    layer = layer[0, 1:]
    is_bwd = kinds[0, 1:] == BACKWARD
    for stream, kind, coll, sel, size in (
            (0, FLOW_PREFETCH, "all_gather", np.ones_like(is_bwd), z3[2]),
            (2, FLOW_BUCKET, "reduce_scatter", is_bwd, z3[3])):
        ls = layer[sel]
        n = ls.shape[0]
        columns.add(stream=np.full(n, stream), owner=np.zeros(n), wake=np.zeros(n),
                    kind=np.full(n, kind),
                    latency_s=np.where(size[ls] > 0, comm.latency_steps(coll, dp) * latency_s,
                                       0.0),
                    wire_bytes=comm.bus_factor(coll, dp) * size[ls], bucket_frac=np.zeros(n),
                    microbatch=micro[0, 1:][sel], peer=ls, count=np.zeros(n))
        links.route(route, stream, n)
    return first_gather, first_gather + kinds.shape[1] - 1, int(is_bwd.sum())


# ----------------------------------------------------------------------------- compute

def compute_stream_order(schedule: str, p2p_mode: str, pp: int, gas: int, *, recompute: bool
                         ) -> tuple[bool, np.ndarray, np.ndarray, np.ndarray | None,
                                    np.ndarray | None]:
    """(blocking, kind, microbatch, flows, peer): each stage's compute stream for
    `p2p_mode`, without the optimizer step; with blocking P2P (pp > 1) its sends and
    receives are tasks of it (flows [pp, n, q]: the P2P flows of each; peer: the other
    stage), else flows and peer are None. The same arguments give the same (read-only)
    arrays: a search simulates many strategies of one (pp, gas)."""
    return _compute_stream_order(schedule, p2p_mode, int(pp), int(gas), bool(recompute))


@functools.lru_cache(maxsize=256)
def _compute_stream_order(schedule: str, p2p_mode: str, pp: int, gas: int, recompute: bool):
    out = _stream_order(schedule, p2p_mode, pp, gas, recompute=recompute)
    for a in out[1:]:
        if a is not None:
            a.flags.writeable = False
    return out


def _stream_order(schedule: str, p2p_mode: str, pp: int, gas: int, *, recompute: bool):
    blocking = p2p_mode != "async" and pp > 1
    kinds, micro = schedule_order(schedule, pp, gas, recompute=recompute)
    xfer = peer = None
    if blocking and p2p_mode == "paired":
        if schedule != "1f1b":
            raise ValueError(f"p2p_mode 'paired' is Megatron-LM's 1F1B; schedule {schedule!r} "
                             f"has no paired order")
        kinds, micro, xfer, peer = megatron_order(pp, gas, recompute=recompute)
    elif blocking:
        kinds, micro, xfer, peer = blocking_order(schedule, pp, gas, recompute=recompute)
    if blocking:
        # and a no-op after each stage's last instruction: DeepSpeed's ReduceGrads (ZeRO 0,
        # 1) comes after the stage's last send, in the last step, as Megatron-LM's
        # finalize_model_grads after its schedule (the no-op emits the buckets)
        kinds, micro, xfer, peer = (
            np.concatenate([a, np.full((pp, 1) + a.shape[2:], v, np.int64)], axis=1)
            for a, v in ((kinds, IDLE), (micro, -1), (xfer, -1), (peer, -1)))
    return blocking, kinds, micro, xfer, peer


@dataclass(frozen=True, eq=False)
class ComputeOps:
    """The event loop's compute tasks, [pp, K] arrays (the order's K - 1 tasks, then the
    optimizer step): duration; the flow it waits for (dep), the flow its end makes ready
    (out), the emitting backward's index whose buckets it produces (emit), the flow its
    start makes ready (pre), -1 for none; xfer [pp, K, q]: the P2P flows of a blocking send
    or receive."""

    dur: np.ndarray
    dep: np.ndarray
    out: np.ndarray
    emit: np.ndarray
    xfer: np.ndarray
    pre: np.ndarray


def compute_ops(kinds: np.ndarray, micro: np.ndarray, *, fwd, bwd, rec, opt, gas: int,
                blocking: bool, xfer, dp: int, dp_flows: DataParallelFlows, overlap: bool
                ) -> ComputeOps:
    """The compute tasks of `compute_stream_order`'s order: durations, P2P dependencies and
    outputs (or the blocking tasks' flows), bucket emissions, the weight all-gather after the
    step."""
    pp, n_ops = kinds.shape
    K = n_ops + 1
    nb_p2p = (pp - 1) * gas
    op_dur = np.empty((pp, K))
    op_dep = np.full((pp, K), -1, dtype=np.int64)
    op_out = np.full((pp, K), -1, dtype=np.int64)
    op_emit = np.full((pp, K), -1, dtype=np.int64)
    js = np.arange(pp)[:, None]
    op_dur[:, :n_ops] = np.where(kinds == FORWARD, fwd[:, None],
                                 np.where(kinds == BACKWARD, bwd[:, None],
                                          np.where(kinds == RECOMPUTE,
                                                   0.0 if rec is None else rec[:, None], 0.0)))
    op_dur[:, n_ops] = opt
    is_f = kinds == FORWARD
    first_b = kinds == (BACKWARD if rec is None else RECOMPUTE)
    is_b = kinds == BACKWARD
    op_xfer = np.full((pp, K, 1 if xfer is None else xfer.reshape(pp, n_ops, -1).shape[2]),
                      -1, dtype=np.int64)
    if blocking:     # the blocking sends and receives carry the dependencies
        op_xfer[:, :n_ops] = xfer.reshape(pp, n_ops, -1)
    elif pp > 1:
        op_dep[:, :n_ops] = np.where(is_f & (js > 0), (js - 1) * gas + micro, -1)
        op_dep[:, :n_ops] = np.where(first_b & (js < pp - 1), nb_p2p + js * gas + micro,
                                     op_dep[:, :n_ops])
        op_out[:, :n_ops] = np.where(is_f & (js < pp - 1), js * gas + micro, -1)
        op_out[:, :n_ops] = np.where(is_b & (js > 0), nb_p2p + (js - 1) * gas + micro,
                                     op_out[:, :n_ops])
    op_out[:, n_ops] = dp_flows.gather_flow
    if dp > 1:
        stage_nb = dp_flows.nb
        emitters = dp_flows.emitters
        e = micro - (gas - emitters)
        op_emit[:, :n_ops] = np.where(is_b & (e >= 0) & (stage_nb[:, None] > 0), e, -1)
        if blocking and not overlap and emitters == 1:
            op_emit[:, :n_ops] = -1
            op_emit[:, n_ops - 1] = np.where(stage_nb > 0, 0, -1)
    op_pre = np.full((pp, K), -1, dtype=np.int64)
    return ComputeOps(dur=op_dur, dep=op_dep, out=op_out, emit=op_emit, xfer=op_xfer,
                      pre=op_pre)


def apply_zero3_ops(ops: ComputeOps, kinds: np.ndarray, z3, layer: np.ndarray,
                    first_gather: int, first_reduce_scatter: int) -> None:
    """ZeRO 3's stage 0 in `ops`: per-layer durations; task i > 0 waits for gather i-1,
    which task i-1 issues when it starts; each backward task's end makes its reduce-scatter
    ready."""
    n_ops = kinds.shape[1]
    ops.dur[0, :n_ops] = np.where(kinds[0] == FORWARD, z3[0][layer[0]],
                                  np.where(kinds[0] == BACKWARD, z3[1][layer[0]], 0.0))
    gathers = first_gather + np.arange(n_ops - 1)
    ops.dep[0, 1:n_ops] = gathers
    ops.pre[0, :n_ops - 1] = gathers
    ops.emit[0] = -1
    bwd_ops = np.flatnonzero(kinds[0] == BACKWARD)
    ops.out[0, bwd_ops] = first_reduce_scatter + np.arange(bwd_ops.shape[0])


# ----------------------------------------------------------------------------- interleaved

def interleaved_inputs(kinds: np.ndarray, micro: np.ndarray, chunk: np.ndarray, *, fwd, bwd,
                       opt, gas: int, p2p_bytes, p2p_latency_s, p2p_bandwidth_bytes_per_s,
                       dp: int, gradient_bytes, dp_latency_s, dp_bandwidth_bytes_per_s,
                       bucket_bytes: float, gradient_collective: str,
                       gather_bytes_after_step=None, overlap: bool = False
                       ) -> tuple[Flows, ComputeOps, DataParallelFlows, LinksAndRoutes]:
    """`simulate_interleaved`'s flows and compute tasks for the order (kinds, micro, chunk)
    of `schedule.interleaved_order`: (flows, ops, dp_flows, links). P2P flows are
    numbered in the order their senders produce them (each stream a FIFO); a device's
    buckets follow its last backward, or with `overlap` each chunk's 1/v of them run
    during that chunk's last backward (its gradients are complete then: Megatron-LM's
    --overlap-grad-reduce, which syncs each model chunk's buffer on its own)."""
    pp, v = fwd.shape
    V = pp * v
    n_ops = kinds.shape[1]
    K = n_ops + 1
    p2p_b = nonnegative_floats("p2p_bytes", p2p_bytes, V - 1, default=0.0)
    p2p_l = nonnegative_floats("p2p_latency_s", p2p_latency_s, V - 1, default=0.0)
    if p2p_bandwidth_bytes_per_s is None:
        if np.any(p2p_b > 0):
            raise ValueError("p2p_bytes needs p2p_bandwidth_bytes_per_s")
        p2p_bw = np.full(pp, np.inf)
    else:
        p2p_bw = nonnegative_floats("p2p_bandwidth_bytes_per_s", p2p_bandwidth_bytes_per_s, pp)
    lk = LinksAndRoutes({})
    for j in range(pp):
        lk.add(("p2p", j, "activation"), p2p_bw[j])      # device j -> j+1 (mod pp)
        lk.add(("p2p", j, "gradient"), p2p_bw[j])        # device j+1 -> j (mod pp)

    # ---- P2P flows, numbered in the order their senders produce them (each stream a FIFO):
    # row by row (device j), op by op; vectorised over the [pp, n_ops] order
    js = np.broadcast_to(np.arange(pp)[:, None], kinds.shape)
    vs = chunk.astype(np.int64) * pp + js                      # each op's virtual stage
    micro = micro.astype(np.int64)
    sends_act = (kinds == FORWARD) & (vs < V - 1)              # activation to vs + 1
    sends_grad = (kinds == BACKWARD) & (vs > 0)                # gradient to vs - 1
    sends = sends_act | sends_grad
    flow_of = np.cumsum(sends.reshape(-1)).reshape(kinds.shape) - 1
    op_out = np.full((pp, K), -1, dtype=np.int64)
    op_out[:, :n_ops] = np.where(sends, flow_of, -1)
    fj, fi = np.nonzero(sends)                                 # row-major: the flows' order
    act = sends_act[fj, fi]
    boundary = np.where(act, vs[fj, fi], vs[fj, fi] - 1)
    f_stream = 3 * fj + np.where(act, 0, 1)
    f_wake = np.where(act, (fj + 1) % pp, (fj - 1) % pp)
    act_link = np.array([lk.index[("p2p", j, "activation")] for j in range(pp)])
    grad_link = np.array([lk.index[("p2p", j, "gradient")] for j in range(pp)])
    links = np.where(act, act_link[fj], grad_link[(fj - 1) % pp])
    # receives: a forward after the first virtual stage waits for the activation of (vs - 1,
    # m), a backward before the last for the gradient of (vs, m)
    n_micro = int(micro.max()) + 1 if micro.size else 0
    act_flow = np.full((V, n_micro), -1, dtype=np.int64)
    grad_flow = np.full((V, n_micro), -1, dtype=np.int64)
    ids = np.arange(len(fj))
    act_flow[boundary[act], micro[fj, fi][act]] = ids[act]
    grad_flow[boundary[~act], micro[fj, fi][~act]] = ids[~act]
    op_dep = np.full((pp, K), -1, dtype=np.int64)
    gets_act = (kinds == FORWARD) & (vs > 0)
    gets_grad = (kinds == BACKWARD) & (vs < V - 1)
    dep = op_dep[:, :n_ops]
    dep[gets_act] = act_flow[vs[gets_act] - 1, micro[gets_act]]
    dep[gets_grad] = grad_flow[vs[gets_grad], micro[gets_grad]]
    if np.any(dep[gets_act | gets_grad] < 0):
        raise ValueError("a receive has no matching send in the interleaved order")
    lk.route_indices(links, f_stream.tolist())
    n_p2p = len(f_stream)
    columns = FlowColumns()
    columns.add(stream=f_stream, owner=fj, wake=f_wake, kind=np.full(n_p2p, FLOW_P2P),
                latency_s=p2p_l[boundary], wire_bytes=p2p_b[boundary],
                bucket_frac=np.zeros(n_p2p), microbatch=micro[fj, fi], peer=f_wake,
                count=np.zeros(n_p2p))

    # ---- data parallelism: buckets after each device's last backward (or, overlapped, each
    # chunk's during its last backward), then the weights' all-gather after the step, as
    # `simulate_iteration` has them
    grad = gradient_bytes
    if overlap and dp > 1:
        grad = nonnegative_floats("gradient_bytes", gradient_bytes, pp, default=0.0) / v
    dp_flows = add_data_parallel_flows(
        columns, lk, pp=pp, gas=gas, dp=dp, gradient_bytes=grad,
        gather_bytes_after_step=gather_bytes_after_step, latency_s=dp_latency_s,
        bandwidth=dp_bandwidth_bytes_per_s, routes=None, bucket_bytes=bucket_bytes,
        gradient_collective=gradient_collective, reduce_every_microbatch=False,
        chunk_emitters=v if overlap and dp > 1 else 0)
    op_out[:, n_ops] = dp_flows.gather_flow
    op_emit = np.full((pp, K), -1, dtype=np.int64)
    if overlap and dp > 1:      # each chunk's last backward, in the order they run
        for j in range(pp):
            if dp_flows.nb[j] > 0:
                last = [int(np.nonzero((kinds[j] == BACKWARD) & (chunk[j] == c))[0].max())
                        for c in range(v)]
                for e, k in enumerate(sorted(last)):
                    op_emit[j, k] = e
    else:
        op_emit[dp_flows.nb > 0, n_ops - 1] = 0    # the device's last op is a backward
    flows = columns.flows()
    op_dur = np.empty((pp, K))
    js = np.arange(pp)[:, None]
    op_dur[:, :n_ops] = np.where(kinds == FORWARD, fwd[js, chunk], bwd[js, chunk])
    op_dur[:, n_ops] = opt
    ops = ComputeOps(dur=op_dur, dep=op_dep, out=op_out, emit=op_emit,
                     xfer=np.full((pp, K, 1), -1, dtype=np.int64),
                     pre=np.full((pp, K), -1, dtype=np.int64))
    return flows, ops, dp_flows, lk
