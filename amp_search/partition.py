"""Pipeline layer assignment (AMP §3.5, with the sync term of AMP eq. 4 and per-stage memory
budgets): an exact and fast minimiser.

A chain of L layers is cut into pp consecutive, non-empty stages; stage j runs
on its own devices, so it has its own per-layer values.  With boundaries
0 = b_0 < b_1 < ... < b_pp = L, stage j holds layers [b_j, b_{j+1}) and

    T_j    = sum_{l in stage j} stage_layer_time_s[j, l]
    sync_j = sync_fixed_s[j] + sum_{l in stage j} sync_layer_s[j, l]     (0 without sync)
    mem_j  = sum_{l in stage j} memory_layer_bytes[j, l]

    objective = (gas - 1) * max_j T_j + sum_j T_j + sum_{j>=1} cut_cost_s[j, b_j]   (AMP eq. 5)
                + max_j sync_j                       (AMP eq. 4: T = T_pp + max_d T_dpsync)
    subject to mem_j <= memory_budget_bytes[j] for every stage j.

``optimal_partition`` returns an optimal split (``PartitionResult``), exactly: not a
heuristic, and up to float rounding only.  Instead of AMP's table over every possible
stage time (eq. 6-8, O(pp * L^4)), it runs a branch and bound over the bottleneck
M = max_j T_j and the sync D = max_j sync_j whose nodes are O(pp * L) sliding-window
DPs; amp_search.partition_kernels holds those numba kernels, their plain-Python twins
and the argument.  ``pipeline_objective`` evaluates the objective for given boundaries
in plain numpy, and ``uniform_partition`` gives Megatron's even split.
``kernels_cached`` and ``KERNELS_WHAT`` (the kernels' numba cache, for amp_search.kernels)
come from amp_search.partition_kernels.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from cost_models.pipeline import balanced_chunks, interleaved_split

from .partition_kernels import GROUP, KERNELS_WHAT, kernels_cached

__all__ = ["KERNELS_WHAT", "PartitionResult", "kernels_cached", "optimal_partition",
           "pipeline_objective", "uniform_partition", "interleaved_partition"]


@dataclass(frozen=True)
class PartitionResult:
    """A pipeline layer assignment and its cost per step, in seconds: AMP eq. 5 plus, when
    sync arrays were given, the data-parallel sync term of AMP eq. 4."""

    boundaries: tuple[int, ...]  # len pp+1, 0 = b_0 < ... < b_pp = L; stage j holds [b_j, b_{j+1})
    objective_s: float  # eq. 5 + max_j sync_j for these boundaries
    stage_time_s: tuple[float, ...]  # T_j per stage
    sync_s: float = 0.0  # max_j sync_j (0.0 without sync arrays)

    @property
    def num_stages(self) -> int:
        return len(self.boundaries) - 1

    @property
    def layers_per_stage(self) -> tuple[int, ...]:
        return tuple(b - a for a, b in zip(self.boundaries[:-1], self.boundaries[1:]))

    def to_dict(self) -> dict:
        return {
            "boundaries": list(self.boundaries),
            "layers_per_stage": list(self.layers_per_stage),
            "objective_s": self.objective_s,
            "stage_time_s": list(self.stage_time_s),
            "sync_s": self.sync_s,
        }


def _check_inputs(stage_layer_time_s, cut_cost_s, gas):
    """Validated float64 copies of the inputs; ValueError on a broken invariant."""
    times = np.ascontiguousarray(stage_layer_time_s, dtype=np.float64)
    cuts = np.ascontiguousarray(cut_cost_s, dtype=np.float64)
    if times.ndim != 2:
        raise ValueError(f"stage_layer_time_s must be 2-D (pp, L), got shape {times.shape}")
    pp, L = times.shape
    if pp < 1:
        raise ValueError("need at least one pipeline stage (pp >= 1), got pp=0")
    if L < pp:
        raise ValueError(f"cannot split {L} layers into {pp} non-empty stages (need pp <= L)")
    if cuts.shape != (pp, L + 1):
        raise ValueError(
            f"cut_cost_s must have shape (pp, L+1) = {(pp, L + 1)}, got {cuts.shape}"
        )
    # min() is nan when any entry is, and sum() of finite values >= 0 is finite
    if not (times.min() >= 0.0 and np.isfinite(times.sum())):
        raise ValueError("stage_layer_time_s must be finite and >= 0")
    used_cuts = cuts[1:, 1:L]  # cut[j, i] is only read for j >= 1, 1 <= i <= L-1
    if used_cuts.size and not (used_cuts.min() >= 0.0 and np.isfinite(used_cuts.sum())):
        raise ValueError("cut_cost_s[1:, 1:L] must be finite and >= 0")
    if isinstance(gas, (bool, np.bool_)) or int(gas) != gas or gas < 1:
        raise ValueError(f"gas (micro-batches per step) must be an integer >= 1, got {gas!r}")
    return times, cuts, int(gas)


def _check_pair(per_layer, per_stage, pp, L, layer_name, stage_name, *, stage_inf_ok):
    """Validated float64 copies of a (pp, L) per-layer array and its (pp,) per-stage array,
    or dummies (and False) when both are None; ValueError on a broken invariant.
    """
    if per_layer is None and per_stage is None:
        return np.zeros((0, 0)), np.zeros(pp), False  # the kernels never read them
    if per_layer is None or per_stage is None:
        missing = layer_name if per_layer is None else stage_name
        given = stage_name if per_layer is None else layer_name
        raise ValueError(f"{given} was given without {missing}: pass both or neither")
    layer = np.ascontiguousarray(per_layer, dtype=np.float64)
    stage = np.ascontiguousarray(per_stage, dtype=np.float64)
    if layer.shape != (pp, L):
        raise ValueError(f"{layer_name} must have shape (pp, L) = {(pp, L)}, got {layer.shape}")
    if stage.shape != (pp,):
        raise ValueError(f"{stage_name} must have shape (pp,) = {(pp,)}, got {stage.shape}")
    if not (layer.min() >= 0.0 and np.isfinite(layer.sum())):
        raise ValueError(f"{layer_name} must be finite and >= 0")
    if stage_inf_ok:  # a budget: any finite value (a negative one fits nothing) or +inf
        if np.isnan(stage).any() or (stage == -np.inf).any():
            raise ValueError(f"{stage_name} must be finite or +inf")
    elif not (stage.min() >= 0.0 and np.isfinite(stage.sum())):
        raise ValueError(f"{stage_name} must be finite and >= 0")
    return layer, stage, True


def optimal_partition(
    stage_layer_time_s: np.ndarray,
    cut_cost_s: np.ndarray,
    gas: int,
    *,
    use_numba: bool = True,
    sync_layer_s: np.ndarray | None = None,
    sync_fixed_s: np.ndarray | None = None,
    memory_layer_bytes: np.ndarray | None = None,
    memory_budget_bytes: np.ndarray | None = None,
    checked: bool = True,
) -> PartitionResult | None:
    """Exact minimiser of AMP eq. 5 + max_j sync_j over the memory-feasible splits into pp
    consecutive non-empty stages; None when no split fits in memory.

    stage_layer_time_s[j, l] (pp, L): forward+backward time of layer l on stage j's
    devices for one micro-batch.  cut_cost_s[j, i] (pp, L+1): p2p time between
    stages j-1 and j when stage j starts at layer i (row 0 is ignored).  gas >= 1:
    micro-batches per step.

    sync_layer_s[j, l] (pp, L) >= 0 and sync_fixed_s[j] (pp,) >= 0, given together: the
    data-parallel gradient sync of stage j is sync_j = sync_fixed_s[j] + sum of
    sync_layer_s[j, l] over its layers, and max_j sync_j (AMP eq. 4's second term) is
    added to the objective.  Without them the objective is eq. 5 alone.

    memory_layer_bytes[j, l] (pp, L) >= 0 and memory_budget_bytes[j] (pp,), given
    together: stage j must satisfy sum of memory_layer_bytes[j, l] over its layers <=
    memory_budget_bytes[j] (any finite value, a negative one fitting nothing, or +inf for
    no limit).  Integer byte counts compare exactly.  Without them memory is not
    constrained and the result is never None.

    Instead of AMP's dp[i][j][m] table (eq. 6-8, O(pp * L^4)), this runs a
    branch and bound over the bottleneck M = max_j T_j and the sync D = max_j sync_j.
    Each node is an O(pp * L) sliding-window DP for min sum_j (T_j + cut_j) with every
    T_j <= M, sync_j <= D and stage in memory, and min-max DPs bound M and D from below.
    amp_search.partition_kernels has the argument.  gas == 1 without sync takes one
    O(pp * L) pass.  On a 130-layer chain, eq. 5 alone typically takes 3 to 15 solves and
    ~10-150 us per call; with sync and memory, 10 to 35 solves and ~25-250 us (median
    per pp; p90 up to ~0.6 ms, ~2 ms at worst when the objective is nearly flat along
    both M and D; benchmarks/partition_dp.py).  Ties: any optimal split may be
    returned.  ``use_numba=False`` runs the same kernels as plain Python.

    ``checked=False``: the caller vouches for the shapes and values above (the cost model,
    whose arrays are built to them), and only their dtype and layout are made the kernels'
    (the checks took about half of a call's 50 us on the search's small chains).
    """
    if checked:
        times, cuts, gas = _check_inputs(stage_layer_time_s, cut_cost_s, gas)
        pp, L = times.shape
        sync_layer, sync_fixed, has_sync = _check_pair(
            sync_layer_s, sync_fixed_s, pp, L, "sync_layer_s", "sync_fixed_s",
            stage_inf_ok=False)
        mem_layer, mem_budget, has_mem = _check_pair(
            memory_layer_bytes, memory_budget_bytes, pp, L, "memory_layer_bytes",
            "memory_budget_bytes", stage_inf_ok=True)
    else:
        def f64(x):
            return np.ascontiguousarray(x, dtype=np.float64)
        times, cuts, gas = f64(stage_layer_time_s), f64(cut_cost_s), int(gas)
        pp = times.shape[0]
        has_sync, has_mem = sync_layer_s is not None, memory_layer_bytes is not None
        sync_layer, sync_fixed = (f64(sync_layer_s), f64(sync_fixed_s)) if has_sync \
            else (np.zeros((0, 0)), np.zeros(pp))
        mem_layer, mem_budget = (f64(memory_layer_bytes), f64(memory_budget_bytes)) \
            if has_mem else (np.zeros((0, 0)), np.zeros(pp))
    kernel = GROUP.kernel("solve", use_numba)
    bounds, stage_time, stage_sync, objective, _ = kernel(
        times, cuts, gas, sync_layer, sync_fixed, has_sync, mem_layer, mem_budget, has_mem)
    if bounds.size == 0:
        return None
    return PartitionResult(
        boundaries=tuple(bounds.tolist()),
        objective_s=float(objective),
        stage_time_s=tuple(stage_time.tolist()),
        sync_s=float(stage_sync.max()),
    )


def pipeline_objective(stage_layer_time_s, cut_cost_s, gas, boundaries, *,
                       sync_layer_s=None, sync_fixed_s=None) -> float:
    """AMP eq. 5 for given boundaries, (gas-1) * max_j T_j + sum_j T_j + sum_{j>=1}
    cut[j, b_j], plus max_j (sync_fixed_s[j] + sum of sync_layer_s[j, l] over stage j)
    when the sync arrays are given (see optimal_partition).  Memory is not checked.

    Plain numpy, independent of the kernels (the tests check them against it).
    """
    times, cuts, gas = _check_inputs(stage_layer_time_s, cut_cost_s, gas)
    pp, L = times.shape
    sync_layer, sync_fixed, has_sync = _check_pair(
        sync_layer_s, sync_fixed_s, pp, L, "sync_layer_s", "sync_fixed_s", stage_inf_ok=False)
    b = [int(x) for x in boundaries]
    if len(b) != pp + 1 or b[0] != 0 or b[-1] != L:
        raise ValueError(f"boundaries must run 0 .. {L} with {pp + 1} entries, got {tuple(b)}")
    if any(lo >= hi for lo, hi in zip(b[:-1], b[1:])):
        raise ValueError(f"boundaries must be strictly increasing, got {tuple(b)}")
    stage_time = np.array([times[j, b[j]:b[j + 1]].sum() for j in range(pp)])
    comm = sum(cuts[j, b[j]] for j in range(1, pp))
    value = float((gas - 1) * stage_time.max() + stage_time.sum() + comm)
    if has_sync:
        value += max(sync_fixed[j] + sync_layer[j, b[j]:b[j + 1]].sum() for j in range(pp))
    return value


def uniform_partition(
    num_layers: int, pp: int, *, first: int = 0, last: int = 0
) -> tuple[int, ...]:
    """Megatron-style uniform split of the layers between stages, as boundaries.

    The chain is ``first`` leading non-block layers (e.g. the embedding),
    ``num_layers - first - last`` transformer blocks, and ``last`` trailing
    non-block layers (e.g. the LM head).  The blocks are split as evenly as
    possible.  When they do not divide evenly, the earliest stages get one extra
    block, because the last stage already holds the head, usually the heaviest
    layer.  The leading layers then join stage 0 and the trailing layers join
    stage pp-1.  Example: uniform_partition(10, 3, first=1, last=1) splits 8
    blocks as 3+3+2 and returns (0, 4, 7, 10).
    """
    if first < 0 or last < 0:
        raise ValueError(f"first and last must be >= 0, got first={first}, last={last}")
    if pp < 1:
        raise ValueError(f"need at least one pipeline stage (pp >= 1), got pp={pp}")
    blocks = num_layers - first - last
    if pp > blocks:
        raise ValueError(
            f"cannot give each of {pp} stages a block: {num_layers} layers minus "
            f"first={first} and last={last} leave {blocks}"
        )
    base, extra = divmod(blocks, pp)
    sizes = [base + (1 if j < extra else 0) for j in range(pp)]
    sizes[0] += first
    sizes[-1] += last
    return tuple(itertools.accumulate(sizes, initial=0))


def interleaved_partition(num_layers: int, chunks: int, *, first: int = 0,
                          last: int = 0, weights=None) -> tuple[int, ...]:
    """The model chunks of Megatron-LM's interleaved schedule, as v*pp + 1 boundaries: the
    blocks split evenly into `chunks` (--num-layers-per-virtual-pipeline-stage), the embedding
    with chunk 0 and the head with the last; else, where the blocks plus a single embedding
    and a single head split evenly, every layer counted alike, so the first chunk holds one
    block fewer and the last too (--account-for-embedding-in-pipeline-split and
    --account-for-loss-in-pipeline-split, how Llama 3.1 405B's 126 blocks run in 8 x 4, 8 x 8
    or 16 x 8 chunks; in the last, the first chunk holds the embedding alone and the last the
    head alone); else, for a chain whose blocks split evenly on no pipeline
    (cost_models.pipeline.needs_uneven_chunks: DeepSeek-V3 with MTP), uneven chunks as even
    as whole blocks make them by `weights` (each layer's work; None: a block 1, the rest 0;
    cost_models.pipeline.balanced_chunks), run as --pipeline-model-parallel-layout.
    ValueError when none of these splits it."""
    how = interleaved_split(num_layers, chunks, first=first, last=last)
    if how == "blocks":
        return uniform_partition(num_layers, chunks, first=first, last=last)
    if how == "layers":
        return uniform_partition(num_layers, chunks)
    if how == "layout":
        if weights is None:
            weights = [0.0] * first + [1.0] * (num_layers - first - last) + [0.0] * last
        return balanced_chunks(weights, chunks, first=first, last=last)
    blocks = num_layers - first - last
    raise ValueError(f"the {blocks} transformer blocks do not split into {chunks} equal "
                     f"chunks of at least one block, with or without the embedding and the "
                     f"head counted as one layer each")
