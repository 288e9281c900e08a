"""Pipeline and iteration time (AMP eq. 4 and 5), on per-stage numbers.

The planner builds per-layer cost arrays [stage, layer] (the stage's devices running that
layer), cuts them at the partition's boundaries with `stage_totals`, and composes:

    t_j   = stage_totals(compute + tensor_parallel)_j + per-micro-batch overhead
    T_pp  = pipeline_time_s(t, e, gas)                                  (eq. 5)
    T_pp  = pipeline_1f1b_time_s(t, e, gas, blocking_share)   (eq. 5 with the P2P of every
                                                               micro-batch in the steady state)
    T     = iteration_time_s(T_pp, sync_j + step_j, step_overhead)      (eq. 4)

The exact partition DP (amp_search.partition) minimises the same objective inside its
numba kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np


def interleaved_split(num_layers: int, chunks: int, *, first: int = 0,
                      last: int = 0) -> str | None:
    """How Megatron-LM splits a chain of `first` embedding layers, the blocks and `last` head
    layers into `chunks` equal model chunks (pp x virtual stages) of at least one block:
    'blocks' where the blocks split evenly (--num-layers-per-virtual-pipeline-stage; the
    embedding joins the first chunk, the head the last); else 'layers' where the blocks plus
    a single embedding and a single head do, every layer counted alike
    (--account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split);
    else, for a chain whose blocks split evenly on no pipeline at all (`needs_uneven_chunks`),
    'layout' where there are as many blocks as chunks (uneven chunks, given to Megatron-LM as
    --pipeline-model-parallel-layout: `balanced_chunks`); None where none of them does."""
    even = _even_split(num_layers, chunks, first, last)
    if even is not None:
        return even
    if chunks >= 1 and num_layers - first - last >= chunks and \
            needs_uneven_chunks(num_layers, first=first, last=last):
        return "layout"
    return None


def _even_split(num_layers: int, chunks: int, first: int, last: int) -> str | None:
    """`interleaved_split`'s even forms: 'blocks', 'layers' or None."""
    blocks = num_layers - first - last
    if chunks >= 1 and blocks >= chunks and blocks % chunks == 0:
        return "blocks"
    if chunks >= 1 and first <= 1 and last <= 1 and blocks >= chunks - first - last \
            and num_layers % chunks == 0:
        return "layers"
    return None


@lru_cache(maxsize=256)
def needs_uneven_chunks(num_layers: int, *, first: int = 0, last: int = 0) -> bool:
    """Whether a chain's blocks split evenly into the model chunks of no pipeline of 2 stages
    or more with 2 chunks per stage or more (neither of `interleaved_split`'s even forms, for
    any pp and v), though there are 4 blocks or more: DeepSeek-V3 with its multi-token
    prediction (61 blocks, the MTP block and two losses after them). Megatron-LM runs such a
    model's interleaved schedule only on chunks given one by one
    (--pipeline-model-parallel-layout), as Megatron-Bridge's DeepSeek-V3 recipes do; a model
    with an even split keeps to even splits."""
    blocks = num_layers - first - last
    return blocks >= 4 and not any(_even_split(num_layers, k, first, last)
                                   for k in range(4, num_layers + 1)
                                   if any(k % pp == 0 and k // pp >= 2
                                          for pp in range(2, k // 2 + 1)))


def balanced_chunks(weights, chunks: int, *, first: int = 0, last: int = 0) -> tuple[int, ...]:
    """`chunks` + 1 boundaries of the chain (`weights`: each layer's work, e.g. its forward
    FLOPs) into contiguous chunks of at least one block each, the embedding(s) with the first
    block and the head(s) with the last, each as near to an even share of the work left as
    whole blocks allow: from the front, a chunk takes the next block while that brings it
    nearer to (the work left) / (the chunks left), and one block at least, leaving one for
    each chunk after it. DeepSeek-V3 with MTP in 16 chunks: [embedding + 4 blocks],
    14 x [4 blocks], [1 block + MTP + losses], the layout its Megatron-Bridge recipes write
    ("Et*4|(t*4|)*14tmL")."""
    w = np.asarray(weights, dtype=float)
    blocks = len(w) - first - last
    if not 1 <= chunks <= blocks:
        raise ValueError(f"cannot split {blocks} blocks into {chunks} chunks of one at least")
    # units: the blocks, the embedding glued to the first and the head(s) to the last
    units = [float(x) for x in w[first:first + blocks]]
    units[0] += float(w[:first].sum())
    units[-1] += float(w[first + blocks:].sum())
    sizes, i, left = [], 0, float(sum(units))
    for k in range(chunks):
        if k == chunks - 1:
            n = len(units) - i                  # the last chunk takes what is left
        else:
            target = left / (chunks - k)
            most = len(units) - i - (chunks - k - 1)     # one block for each chunk after
            n, load = 1, units[i]
            while n < most and abs(load + units[i + n] - target) < abs(load - target):
                load += units[i + n]
                n += 1
        load = sum(units[i:i + n])
        sizes.append(n)
        i, left = i + n, left - load
    bounds = [0]
    for k, n in enumerate(sizes):
        bounds.append(bounds[-1] + n + (first if k == 0 else 0)
                      + (last if k == len(sizes) - 1 else 0))
    return tuple(bounds)


def interleaved_virtual_stages(num_layers: int, *, first: int = 0, last: int = 0,
                               most: int) -> tuple[int, ...]:
    """Every number of model chunks per stage, 1 to `most`, that splits the chain evenly
    (`interleaved_split`) on some pipeline of 2 stages or more, with 1 (plain 1F1B) first:
    the virtual stages a search of Megatron-LM's interleaved schedule can run (Llama 3 70B's
    80 blocks, up to 64: 2, 4, 5, 8, 10, 20, 40 and, with the embedding and head counted,
    41; amp_search's search stops at 8). A chain whose blocks split evenly on no pipeline
    (`needs_uneven_chunks`) runs uneven chunks, which any v allows: there, the powers of two
    (DeepSeek-V3 with MTP: 2, 4 and 8, the v of its Megatron-Bridge recipes), as each v
    multiplies the search."""
    if needs_uneven_chunks(num_layers, first=first, last=last):
        blocks = num_layers - first - last
        return (1,) + tuple(v for v in (2, 4, 8, 16, 32, 64) if v <= most and 2 * v <= blocks)
    return (1,) + tuple(v for v in range(2, most + 1) if any(
        interleaved_split(num_layers, v * pp, first=first, last=last)
        for pp in range(2, num_layers // v + 1)))


def stage_totals(per_layer, boundaries) -> np.ndarray:
    """Sum of per_layer[j, l] over stage j's layers boundaries[j] .. boundaries[j+1]-1.

    per_layer: [pp, L] (stage j's cost of layer l); boundaries: pp + 1 increasing indices."""
    per_layer = np.asarray(per_layer, dtype=float)
    b = np.asarray(boundaries, dtype=np.int64)
    prefix = np.concatenate([np.zeros((per_layer.shape[0], 1)), np.cumsum(per_layer, axis=1)],
                            axis=1)
    js = np.arange(per_layer.shape[0])
    return prefix[js, b[1:]] - prefix[js, b[:-1]]


def boundary_times(cut_s, boundaries) -> np.ndarray:
    """e_j for j = 1 .. pp-1: cut_s[j, i] is the P2P into stage j when it starts at layer i."""
    b = np.asarray(boundaries, dtype=np.int64)
    js = np.arange(1, len(b) - 1)
    return np.asarray(cut_s, dtype=float)[js, b[1:-1]]


def pipeline_time_s(stage_time_s, cut_time_s, gas: int) -> float:
    """AMP eq. 5: T_pp = (gas - 1) * max_i t_i + sum_i e_i + sum_i t_i.

    t_i: one micro-batch forward+backward on stage i; e_i: P2P between stages i and i+1."""
    t = np.asarray(stage_time_s, dtype=float)
    return float((gas - 1) * t.max() + np.sum(cut_time_s) + t.sum())


P2P_BLOCKING_SHARE = {"deepspeed": 1.0, "megatron": 0.5, "async": 0.0}
"""How much of the P2P at its boundaries a 1F1B stage waits for in every steady-state
micro-batch, as a share of e_in + e_out (e = activation forward + gradient backward, both one
transfer time d each: e = 2d).

- deepspeed: PipelineEngine's SendActivation, RecvGrad, SendGrad and RecvActivation are
  separate blocking `p2p.send` / `p2p.recv` calls (`dist.send` / `dist.recv`, which make the
  compute stream wait for the transfer): a stage pays all four transfers, e_in + e_out.
- megatron: `send_forward_recv_backward` and `send_backward_recv_forward` post the send and the
  receive of a boundary together (`batch_isend_irecv`, then wait) over a full-duplex link: one
  transfer time per boundary, (e_in + e_out) / 2 (Narayanan et al., SC'21, section 2.2: the
  steady state alternates one forward and one backward, each exchanging with its neighbours).
- async: sends that never block the sender (the schedule simulator's model); only the 1F1B
  cycle bound of `steady_state_period_s` remains."""


INTERLEAVED_BLOCKING_SHARE = P2P_BLOCKING_SHARE["async"]
"""The share of its steady-state P2P a device of Megatron-LM's interleaved schedule waits
for: none. With model chunks, Megatron-LM overlaps the P2P with the forward and backward
chunks (`overlap_p2p_comm`: on by default, `--no-overlap-p2p-communication` turns it off;
megatron-core's interleaved schedule posts each receive before the chunk that precedes its
use and waits for it only then); Megatron-Bridge sets it wherever pp > 1 and vp > 1
(`CommOverlapConfig`). The warm-up and flush stay blocking (the
`--overlap-p2p-communication-warmup-flush` default): the fill and drain pay each of the
v pp - 1 chunk boundaries once (`interleaved_1f1b_time_s`). A link still carries its transfers one after another
(`interleaved_steady_state_period_s`), and the schedule simulator's interleaved run sends the
same way (cost_models.simulator.simulate_interleaved, "async")."""


def steady_state_period_s(stage_time_s, cut_time_s, *, blocking_share: float) -> float:
    """The time per micro-batch of 1F1B's steady state (non-interleaved, as DeepSpeed and
    Megatron-LM run it): the largest of

    - t_j + blocking_share * (e_j + e_{j+1}): stage j's compute and the P2P at its two
      boundaries (e_j into it, e_{j+1} out of it; none past the ends) that it waits for;
    - (sum_{k>=i} t_k + sum of the e's between them) / (pp - i), for every stage i: in 1F1B
      stage i holds at most pp - i micro-batches in flight, so each needs its whole round trip
      through the stages after it, transfers included, once per pp - i micro-batches (the
      bound the schedule simulator shows with free-running sends: 2d (pp-1)/pp per
      micro-batch on uniform stages).

    With free P2P (e = 0) it is max_j t_j, eq. 5's bottleneck. stage_time_s: pp values;
    cut_time_s: the pp - 1 boundary times e (activation + gradient)."""
    t = np.asarray(stage_time_s, dtype=float)
    e = np.asarray(cut_time_s, dtype=float).reshape(-1)
    pp = t.shape[0]
    if e.shape[0] != max(pp - 1, 0):
        raise ValueError(f"{pp} stages need {pp - 1} boundary times, got {e.shape[0]}")
    padded = np.concatenate([[0.0], e, [0.0]])          # boundary j into stage j; none at ends
    own = t + blocking_share * (padded[:-1] + padded[1:])
    suffix_t = np.cumsum(t[::-1])[::-1]                  # sum_{k>=i} t_k
    suffix_e = np.concatenate([np.cumsum(e[::-1])[::-1], [0.0]])   # e's after stage i
    cycle = (suffix_t + suffix_e) / (pp - np.arange(pp))
    return float(max(own.max(), cycle.max()))


def pipeline_1f1b_time_s(stage_time_s, cut_time_s, gas: int, *,
                         blocking_share: float = P2P_BLOCKING_SHARE["deepspeed"]) -> float:
    """AMP eq. 5 with the P2P of every steady-state micro-batch on the critical path:

        T_pp = (gas - 1) * steady_state_period_s(t, e) + sum_i e_i + sum_i t_i

    The fill and drain pay each boundary once (eq. 5's sum e); each of the other gas - 1
    micro-batches pays the bottleneck's compute and the P2P it waits for. Equal to eq. 5 when
    P2P is free or gas is 1."""
    t = np.asarray(stage_time_s, dtype=float)
    period = steady_state_period_s(t, cut_time_s, blocking_share=blocking_share)
    return float((gas - 1) * period + np.sum(cut_time_s) + t.sum())


def iteration_time_s(pipeline_s: float, after_pipeline_s, step_overhead_s: float = 0.0) -> float:
    """AMP eq. 4: T = T_pp (the slowest replica) + the largest per-stage time spent after the
    pipeline drains (data-parallel sync and optimizer step) + a fixed cost per iteration."""
    return float(pipeline_s + np.max(after_pipeline_s, initial=0.0) + step_overhead_s)


def iteration_lower_bound_s(stage_layer_s, gas: int, virtual_stages: int = 1, *,
                            microbatch_overhead_s: float = 0.0, step_overhead_s: float = 0.0,
                            type_devices=None, devices_per_stage: int | None = None,
                            after_layer_s=None, after_fixed_s=None) -> float:
    """A time no split of the layers over the stages beats: a lower bound on the iteration
    time of `one_f_one_b_iteration` and `interleaved_iteration` (any partition, P2P, data-
    parallel sync and optimizer step >= 0), from per-stage layer costs that the stages' real
    `layer_s` is at least (stage_layer_s[j, l] <= layer_s[j, l]: the device passes, and the
    tensor-parallel time, without the host's share).

    Let m[l] = min_j stage_layer_s[j, l] and M = sum m. Stage j runs each layer at least
    a_j = min_l stage_layer_s[j, l] / m[l] times its cheapest cost, so within a bottleneck B
    it holds layers whose m adds up to at most B / a_j; all layers are held, so
    B >= M / sum_j (1 / a_j) (on stages of one speed, M / pp). With the per-micro-batch
    overhead o: max_j t_j >= X = B + o and sum_j t_j >= M + pp o = S, so

        1F1B (eq. 5 and 4):  T >= (gas - 1) X + S + step
        interleaved:         T >= (gas - 1/v) X + S / v + step

    (the interleaved form is (gas - 1) max t + max t + (sum t - max t) / v + ..., which
    grows with max t since gas >= 1/v).

    Before a placement, `type_devices` says that the rows are device types instead of
    stages, with so many devices of each, and stages of `devices_per_stage` devices: a stage
    runs at its slowest type's pace (its a_j at least that type's), so at most
    floor(n / devices_per_stage) stages have an a_j as small as a type's, n the devices of
    that type and of the types with smaller a.

    `after_layer_s` [pp, L] and `after_fixed_s` [pp]: what
    each stage spends after the pipeline (the data-parallel sync, at most what it is), whose
    slowest stage pays at least min_j fixed_j + sum_l min_j after_layer_s[j, l] / pp.

    The planner costs strategies in the order of this bound and stops where it exceeds the
    plans it keeps (amp_search.planner.cost_best_candidates)."""
    return bound_from_rows(lower_bound_rows(stage_layer_s), gas, virtual_stages,
                           microbatch_overhead_s=microbatch_overhead_s,
                           step_overhead_s=step_overhead_s, type_devices=type_devices,
                           devices_per_stage=devices_per_stage, after_layer_s=after_layer_s,
                           after_fixed_s=after_fixed_s)


@dataclass(frozen=True)
class BoundRows:
    """What `iteration_lower_bound_s` takes from its rows (`lower_bound_rows`): M, each
    row's a_j, the rows in order of a, and whether any layer costs anything."""

    total: float
    a: np.ndarray
    order: tuple[int, ...]
    held: bool
    count: int


def lower_bound_rows(stage_layer_s) -> BoundRows:
    """The part of `iteration_lower_bound_s` that depends on the rows alone (a caller that
    bounds many strategies on the same rows computes it once)."""
    r = np.asarray(stage_layer_s, dtype=float)
    m = r.min(axis=0)
    held = m > 0
    a = (r[:, held] / m[held]).min(axis=1) if held.any() else np.ones(r.shape[0])
    return BoundRows(total=float(m.sum()), a=a,
                     order=tuple(np.argsort(a, kind="stable").tolist()),
                     held=bool(held.any()), count=r.shape[0])


def bound_from_rows(rows: BoundRows, gas: int, virtual_stages: int = 1, *,
                    microbatch_overhead_s: float = 0.0, step_overhead_s: float = 0.0,
                    type_devices=None, devices_per_stage: int | None = None,
                    after_layer_s=None, after_fixed_s=None) -> float:
    """`iteration_lower_bound_s` from its rows' `lower_bound_rows`."""
    total, a = rows.total, rows.a
    if type_devices is None:
        pp = rows.count
        speed = float(np.sum(1.0 / a))              # sum_j 1 / a_j
    else:
        pp = int(np.sum(type_devices)) // devices_per_stage
        speed, stages, devices = 0.0, 0, 0
        for t in rows.order:
            devices += int(type_devices[t])
            k = min(pp, devices // devices_per_stage)
            speed += (k - stages) / a[t]
            stages = k
    bottleneck = total / speed if rows.held else 0.0
    x = bottleneck + microbatch_overhead_s
    s = total + pp * microbatch_overhead_s
    v = int(virtual_stages)
    pipeline = (gas - 1) * x + s if v == 1 else (gas - 1.0 / v) * x + s / v
    after = 0.0
    if after_layer_s is not None:
        after = float(np.min(after_fixed_s, initial=np.inf) if np.size(after_fixed_s) else 0.0)
        after = max(after, 0.0) + float(np.asarray(after_layer_s).min(axis=0).sum()) / pp
    return float(pipeline + after + step_overhead_s)


def exposed_time_s(time_s, overlap: float):
    """The part of a communication not hidden behind computation (overlap in [0, 1])."""
    return time_s * (1.0 - overlap)


# ----------------------------------------------------------------------------- interleaved 1F1B

def interleaved_bubble_fraction(pp: int, gas: int, virtual_stages: int) -> float:
    """The pipeline bubble of the interleaved 1F1B schedule as a fraction of the ideal time,
    (pp - 1) / (v * gas) (Narayanan et al., SC'21, "Efficient Large-Scale Language Model
    Training on GPU Clusters Using Megatron-LM", section 2.2.2); v = 1 is plain 1F1B's
    (pp - 1) / gas."""
    if pp < 1 or gas < 1 or virtual_stages < 1:
        raise ValueError(f"pp, gas and virtual_stages must be >= 1, got {pp}, {gas}, "
                         f"{virtual_stages}")
    return (pp - 1) / (virtual_stages * gas)


def interleaved_steady_state_period_s(stage_time_s, cut_time_s, virtual_stages: int, *,
                                      blocking_share: float, wrap_time_s: float = 0.0) -> float:
    """The time per micro-batch of the interleaved schedule's steady state: the largest
    t_j + blocking_share * (v_in e_in + v_out e_out) over the devices j, where t_j is device
    j's compute for one micro-batch over all its v chunks and e the boundary times
    (activation + gradient; `cut_time_s` the pp - 1 boundaries between device j and j+1,
    `wrap_time_s` the boundary from device pp-1 back to device 0). Device j exchanges each
    micro-batch v times with each neighbour (Narayanan et al., section 2.2.2: "the amount of
    communication also increases by v"), except over the wrap boundary, which the v chunks
    cross v - 1 times (chunk k on device pp-1 feeds chunk k+1 on device 0).

    However the transfers overlap with compute, each link carries v of e / 2 each way per
    micro-batch (the wrap v - 1): the period is at least the largest of those.

    Only each device's own compute and blocked P2P bound the period here: plain 1F1B's
    round-trip bound (`steady_state_period_s`, stage i holding pp - i micro-batches) is not
    carried over; the interleaved schedule holds about pp (1 + (pp-1)/(pp v)) micro-batches
    on the first device (`cost_models.activations.interleaved_in_flight_chunks`), so the round
    trip binds only when the P2P is comparable to the compute."""
    t = np.asarray(stage_time_s, dtype=float)
    e = np.asarray(cut_time_s, dtype=float).reshape(-1)
    pp, v = t.shape[0], int(virtual_stages)
    if e.shape[0] != max(pp - 1, 0):
        raise ValueError(f"{pp} stages need {pp - 1} boundary times, got {e.shape[0]}")
    if v < 1:
        raise ValueError(f"virtual_stages must be >= 1, got {virtual_stages}")
    wrap = float(wrap_time_s) * (v - 1) if pp > 1 else 0.0
    padded = np.concatenate([[wrap], v * e, [wrap]])
    # each link carries v transfers of e / 2 each way per micro-batch, however they overlap
    return float(max((t + blocking_share * (padded[:-1] + padded[1:])).max(),
                     padded.max() / 2.0))


def interleaved_1f1b_time_s(stage_time_s, cut_time_s, gas: int, virtual_stages: int, *,
                            blocking_share: float = INTERLEAVED_BLOCKING_SHARE,
                            wrap_time_s: float = 0.0) -> float:
    """The pipeline time of Megatron-LM's interleaved 1F1B schedule with v model chunks per
    device (Narayanan et al., SC'21, section 2.2.2), on per-device numbers:

        T_pp = (gas - 1) * period + max_j t_j + (sum_j t_j - max_j t_j) / v
               + v sum_j e_j + (v - 1) wrap

    t_j: device j's forward + backward of one micro-batch over all of its v chunks; period:
    `interleaved_steady_state_period_s` (max_j t_j with free P2P). The fill and drain run
    chunk by chunk, so each other device's share of them is t_j / v instead of eq. 5's t_j:
    on uniform devices T_pp = (gas + (pp - 1) / v) t, the bubble (pp - 1) t / v of the paper
    (`interleaved_bubble_fraction`); the simulator (cost_models.simulator.simulate_interleaved)
    plays exactly this with free links and uniform chunks, for gas a multiple of pp (Megatron's
    condition). The fill and drain pay the P2P of each of the v pp - 1 chunk boundaries once
    (the first micro-batch's forward and the last one's backward cross them all, one chunk
    after another): v sum_j e_j + (v - 1) wrap, eq. 5's sum e_j for v = 1; with async
    sends, what the simulator's interleaved run pays (within 0.4% of it on the
    Megatron-Bridge recipes with virtual stages). virtual_stages = 1 is
    `pipeline_1f1b_time_s`."""
    v = int(virtual_stages)
    if v == 1:
        return pipeline_1f1b_time_s(stage_time_s, cut_time_s, gas, blocking_share=blocking_share)
    t = np.asarray(stage_time_s, dtype=float)
    period = interleaved_steady_state_period_s(t, cut_time_s, v, blocking_share=blocking_share,
                                               wrap_time_s=wrap_time_s)
    return float((gas - 1) * period + t.max() + (t.sum() - t.max()) / v
                 + v * np.sum(cut_time_s) + (v - 1) * float(wrap_time_s))


def chunk_device_totals(per_layer, boundaries, pp: int) -> np.ndarray:
    """[pp]: per device stage j, the sum of per_layer[j, l] over the layers of its model
    chunks j, j + pp, j + 2 pp, ... (boundaries: v*pp + 1 indices, chunk k holding layers
    boundaries[k] .. boundaries[k+1]-1 on stage k mod pp). v = 1 is `stage_totals`."""
    per_layer = np.asarray(per_layer, dtype=float)
    chunks = len(boundaries) - 1
    if chunks % pp:
        raise ValueError(f"{chunks} chunks are not a multiple of pp = {pp}")
    rows = per_layer[np.arange(chunks) % pp]
    return stage_totals(rows, boundaries).reshape(chunks // pp, pp).sum(axis=0)


def chunk_boundary_times(cut_s, boundaries, pp: int) -> tuple[np.ndarray, float]:
    """(e [pp - 1], wrap): e_j the slowest P2P into stage j over its chunks' starts (cut_s[j, i]
    is the P2P into stage j when it starts at layer i, as `boundary_times`); wrap the P2P from
    stage pp - 1 back to stage 0 (into chunks pp, 2 pp, ...), taken as the slowest of the
    stage boundaries' at those layers (the cost arrays have no link from the last stage to the
    first). v = 1: (`boundary_times`, 0)."""
    cut = np.asarray(cut_s, dtype=float)
    b = np.asarray(boundaries, dtype=np.int64)
    starts = np.arange(1, len(b) - 1)           # chunks 1 .. V-1 start at b[k]
    e = np.zeros(max(pp - 1, 0))
    wrap = 0.0
    for k in starts.tolist():
        j = k % pp
        if j:
            e[j - 1] = max(e[j - 1], cut[j, b[k]])
        elif pp > 1:
            wrap = max(wrap, float(cut[1:, b[k]].max()))
    return e, wrap


@dataclass(frozen=True)
class StageCostArrays:
    """What the closed form needs of one strategy on its placement, before the layers are
    split: entry [j, l] is layer l run by stage j's devices (amp_search.costing builds them)."""

    layer_s: np.ndarray
    """[pp, L] what t_j sums: compute + tensor-parallel communication (or the host's time)."""
    tensor_parallel_s: np.ndarray
    """[pp, L] the tensor-parallel part of layer_s."""
    cut_s: np.ndarray
    """[pp, L + 1] P2P into stage j when it starts at layer i."""
    sync_s: np.ndarray
    """[pp, L] data-parallel sync of the layer's parameters (less the calibrated dp_overlap;
    what a bucketed reduction hides besides is `gradient_overlap`'s, `exposed_sync_s`)."""
    sync_fixed_s: np.ndarray
    """[pp] the sync's per-stage latency part."""
    optimizer_s: np.ndarray
    """[pp, L] one optimizer step over the layer's parameters."""
    microbatch_overhead_s: float
    step_overhead_s: float
    gradient_overlap: "GradientOverlap | None" = field(default=None, kw_only=True)
    """The part of sync_s reduced in buckets during the backward (None: none is)."""


@dataclass(frozen=True)
class GradientOverlap:
    """A gradient reduction overlapped with the backward pass (Megatron-LM's
    --overlap-grad-reduce, DeepSpeed's overlap_comm), per stage j with G_j gradient elements
    in buckets of B (`bucket_elements`): bucket i is reduced once the backward has produced
    it, one after another on the stage's data-parallel ring, while the backward goes on. With
    R_j the reduction's time (its part of the sync) and W_j the window (the backward of the
    last micro-batch, or of every micro-batch where each reduces its own: `windows`), the
    reduction ends after the backward by max over buckets of (the rest of R_j - the rest of
    W_j), for even rates at the two ends:

        exposed_j = max(R_j b_j, R_j - (1 - b_j) W_j),    b_j = min(1, B / G_j)

    the last bucket alone, or all of R_j less the window after the first bucket. One bucket
    (B >= G_j) hides nothing. The weights' all-gather after the optimizer step (ZeRO 1-2, the
    distributed optimizer) is not in R_j: it waits for the step."""

    reduce_s: np.ndarray
    """[pp, L] the gradient reduction's part of sync_s."""
    reduce_fixed_s: np.ndarray
    """[pp] its part of sync_fixed_s (the latencies)."""
    backward_s: np.ndarray
    """[pp, L] one micro-batch's backward (recomputation included), the window."""
    elements: np.ndarray
    """[L] the gradient elements of each layer one rank reduces."""
    bucket_elements: float
    windows: int = 1
    """Backward passes the reduction overlaps: 1 (the last micro-batch's) or gas (DeepSpeed's
    ZeRO 2 reduces each micro-batch's gradients in its own backward)."""


def exposed_sync_s(costs: StageCostArrays, totals) -> np.ndarray:
    """[pp] the data-parallel sync each stage waits for after its last backward:
    sync_fixed_s + totals(sync_s), less what `costs.gradient_overlap` hides. `totals`: per
    layer [pp, L] -> per stage [pp] (the split's `stage_totals` or `chunk_device_totals`)."""
    sync = costs.sync_fixed_s + totals(costs.sync_s)
    o = costs.gradient_overlap
    if o is None:
        return sync
    reduce = o.reduce_fixed_s + totals(o.reduce_s)
    window = totals(o.backward_s) * o.windows
    elements = totals(np.broadcast_to(o.elements, o.reduce_s.shape))
    first = np.minimum(1.0, o.bucket_elements / np.maximum(elements, 1.0))
    exposed = np.maximum(reduce * first, reduce - (1.0 - first) * window)
    return sync - reduce + np.minimum(exposed, reduce)


@dataclass(frozen=True)
class IterationTerms:
    """One strategy's iteration by the closed form (eq. 5 then eq. 4) and where its time goes:
    the bottleneck stage's compute and tensor-parallel time, the bubble, the P2P on the
    critical path, and the data-parallel sync and optimizer step of the stage finishing last."""

    iteration_s: float
    stage_time_s: np.ndarray
    """[pp] t_j, the per-micro-batch time of each (device) stage."""
    compute_s: float
    pipeline_bubble_s: float
    p2p_s: float
    tensor_parallel_s: float
    data_parallel_s: float
    optimizer_s: float


def one_f_one_b_iteration_s(costs: StageCostArrays, boundaries, gas: int, *,
                            blocking_share: float) -> float:
    """The non-interleaved 1F1B iteration time on the split `boundaries`:
    t_j = stage_totals(layer_s) + overhead, T_pp = pipeline_1f1b_time_s (eq. 5 with the
    steady state's P2P), T = iteration_time_s (eq. 4) over sync_j + step_j. What the
    partition's candidate splits are compared by; `one_f_one_b_iteration` gives the same time
    (up to rounding: it sums the sync and the step per stage separately) with its terms."""
    stage_time = stage_totals(costs.layer_s, boundaries) + costs.microbatch_overhead_s
    if costs.gradient_overlap is None:
        after = costs.sync_fixed_s + stage_totals(costs.sync_s + costs.optimizer_s, boundaries)
    else:
        after = exposed_sync_s(costs, lambda x: stage_totals(x, boundaries)) \
            + stage_totals(costs.optimizer_s, boundaries)
    return iteration_time_s(pipeline_1f1b_time_s(
        stage_time, boundary_times(costs.cut_s, boundaries), gas,
        blocking_share=blocking_share), after, costs.step_overhead_s)


def one_f_one_b_iteration(costs: StageCostArrays, boundaries, gas: int, *,
                          blocking_share: float) -> IterationTerms:
    """`one_f_one_b_iteration_s` with where the time goes."""
    stage_time = stage_totals(costs.layer_s, boundaries) + costs.microbatch_overhead_s
    stage_tp = stage_totals(costs.tensor_parallel_s, boundaries)
    stage_compute = stage_time - stage_tp       # device compute, or the host where longer
    cuts = boundary_times(costs.cut_s, boundaries)
    sync = exposed_sync_s(costs, lambda x: stage_totals(x, boundaries))
    step = stage_totals(costs.optimizer_s, boundaries)
    pipeline = pipeline_1f1b_time_s(stage_time, cuts, gas, blocking_share=blocking_share)
    total = iteration_time_s(pipeline, sync + step, costs.step_overhead_s)
    b = int(np.argmax(stage_time))              # the bottleneck stage
    # P2P on the critical path: each boundary once (fill and drain, eq. 5) and what the
    # steady state's gas - 1 micro-batches wait for beyond the bottleneck's compute
    steady_p2p = pipeline - pipeline_time_s(stage_time, cuts, gas)
    last = int(np.argmax(sync + step))          # the stage the iteration waits for last
    return IterationTerms(
        iteration_s=total, stage_time_s=stage_time,
        compute_s=float(gas * stage_compute[b] + costs.step_overhead_s),
        pipeline_bubble_s=float(stage_time.sum() - stage_time[b]),
        p2p_s=float(cuts.sum() + steady_p2p), tensor_parallel_s=float(gas * stage_tp[b]),
        data_parallel_s=float(sync[last]), optimizer_s=float(step[last]))


def interleaved_iteration(costs: StageCostArrays, boundaries, gas: int, pp: int,
                          virtual_stages: int, *, blocking_share: float) -> IterationTerms:
    """The same for v > 1 model chunks per stage (`boundaries`: v * pp + 1 of them, chunk k on
    stage k mod pp): per device stage, the chunks' totals (`chunk_device_totals`, with the
    per-micro-batch overhead once), the slowest P2P into each stage and the wrap-around from
    the last stage to the first (`chunk_boundary_times`), then interleaved_1f1b_time_s and
    eq. 4; the bubble is the non-interleaved one divided by v."""
    v = virtual_stages
    stage_time = chunk_device_totals(costs.layer_s, boundaries, pp) + costs.microbatch_overhead_s
    stage_tp = chunk_device_totals(costs.tensor_parallel_s, boundaries, pp)
    cuts, wrap = chunk_boundary_times(costs.cut_s, boundaries, pp)
    sync = exposed_sync_s(costs, lambda x: chunk_device_totals(x, boundaries, pp))
    step = chunk_device_totals(costs.optimizer_s, boundaries, pp)
    pipeline = interleaved_1f1b_time_s(stage_time, cuts, gas, v, blocking_share=blocking_share,
                                       wrap_time_s=wrap)
    total = iteration_time_s(pipeline, sync + step, costs.step_overhead_s)
    b = int(np.argmax(stage_time))
    bubble = float((stage_time.sum() - stage_time[b]) / v)
    steady_p2p = pipeline - (gas * stage_time[b] + bubble + cuts.sum())
    last = int(np.argmax(sync + step))
    return IterationTerms(
        iteration_s=total, stage_time_s=stage_time,
        compute_s=float(gas * (stage_time[b] - stage_tp[b]) + costs.step_overhead_s),
        pipeline_bubble_s=bubble, p2p_s=float(cuts.sum() + steady_p2p),
        tensor_parallel_s=float(gas * stage_tp[b]), data_parallel_s=float(sync[last]),
        optimizer_s=float(step[last]))
