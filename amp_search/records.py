"""Typed records that flow out of the planner: strategies, estimates, plans.

Every record is a frozen dataclass with `to_dict()` giving the JSON form the CLI writes.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from functools import cache, cached_property

Placement = tuple[tuple[tuple[int, ...], ...], ...]
"""placement[stage][replica][tensor_rank] -> device id (devices numbered in spec order)."""


def micro_batches(global_batch_size: int, dp: int, mbs: int) -> int:
    """gas: the micro-batches each pipeline replica runs per iteration (gradient accumulation
    steps); the one place it is derived (the search's rules make dp * mbs divide the batch)."""
    return global_batch_size // (dp * mbs)


def pairs_micro_batches(pp: int, virtual_stages: int, full_recompute: bool) -> bool:
    """Whether megatron-core can pair one micro-batch's forward with another's backward
    layer by layer (its combined 1F1B, which --overlap-moe-expert-parallel-comm runs on):
    no pipeline or an interleaved one, and no full recomputation (its TransformerConfig
    asserts both). The one rule the cost model and the launch arguments share."""
    return (pp == 1 or virtual_stages > 1) and not full_recompute


@cache
def _field_names(cls) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls))


def _flat_dict(record) -> dict:
    """A record's fields by name: what dataclasses.asdict gives for one whose fields are
    scalars or tuples of scalars, without its recursive deep copy (a plan's JSON writes
    thousands of these)."""
    return {name: getattr(record, name) for name in _field_names(type(record))}


@dataclass(frozen=True, kw_only=True)
class Strategy:
    """One 3D-parallel training configuration (AMP eq. 2, plus ZeRO and recomputation)."""

    pp: int
    """Pipeline stages."""
    dp: int
    """Data-parallel replicas."""
    tmp: int
    """Tensor-parallel degree."""
    mbs: int
    """Micro-batch size (samples per micro-batch per replica)."""
    global_batch_size: int
    """Samples per iteration over all replicas."""
    partition: tuple[int, ...]
    """Layer boundaries, len v*pp+1 (v = virtual_stages): model chunk k runs layers
    partition[k] .. partition[k+1]-1 on stage k mod pp; with v = 1, stage j runs layers
    partition[j] .. partition[j+1]-1."""
    placement: Placement
    """Device id of each (stage, replica, tensor rank); the replicas are dp x cp, a data
    replica's cp context-parallel ranks side by side (replica d * cp + c)."""
    placement_order: str = "listed"
    """Which node order the placement came from: listed | fastest-first | slowest-first | given."""
    zero_stage: int = 0
    """DeepSpeed ZeRO stage 0-3."""
    activation_checkpointing: bool = False
    """Full recomputation of each block's forward in backward."""
    selective_recompute: bool = False
    """Selective recomputation: only the attention core is re-run in backward (Korthikanti et
    al. 2022); never together with activation_checkpointing."""
    sequence_parallel: bool = False
    """Sequence parallelism over the tensor group (Korthikanti et al. 2022); tmp > 1 only."""
    virtual_stages: int = 1
    """Model chunks per pipeline stage: v > 1 runs Megatron-LM's interleaved 1F1B schedule
    (Narayanan et al., SC'21, section 2.2.2); 1 is plain 1F1B."""
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks (Megatron-LM's ring
    attention, --context-parallel-size); 1 is none."""
    ep: int = 1
    """Expert-parallel degree (a model with experts): groups of ep consecutive ranks of a
    stage split the experts (--expert-model-parallel-size, expert tensor parallelism 1)."""

    def stage_layer_ranges(self, stage: int) -> tuple[tuple[int, int], ...]:
        """The (first, end) layer ranges pipeline stage `stage` runs: its v model chunks
        stage, stage + pp, ..., in the order of the model."""
        b = self.partition
        return tuple((b[k], b[k + 1]) for k in range(stage, len(b) - 1, self.pp))

    def stage_layers(self, stage: int) -> tuple[int, ...]:
        """Every layer index pipeline stage `stage` runs."""
        return tuple(i for a, z in self.stage_layer_ranges(stage) for i in range(a, z))

    @property
    def recompute(self) -> str:
        """none | selective | full: what training.activation_checkpointing calls it."""
        if self.activation_checkpointing:
            return "full"
        return "selective" if self.selective_recompute else "none"

    @property
    def gas(self) -> int:
        """Micro-batches per iteration per replica (gradient accumulation steps); 0 where dp or
        mbs is below 1 (an invalid strategy, which validation names, never a division by
        zero)."""
        if self.dp < 1 or self.mbs < 1:
            return 0
        return micro_batches(self.global_batch_size, self.dp, self.mbs)

    @property
    def replicas(self) -> int:
        """Replicas of the placement, dp x cp (search_space.Candidate.replicas)."""
        return self.dp * self.cp

    @property
    def num_devices(self) -> int:
        return self.pp * self.replicas * self.tmp

    def layout_text(self) -> str:
        """The degrees and micro-batch as a summary line writes them: 'pp2 dp8 tmp1 mbs2',
        with cp, ep and v where they are above 1 (pp x dp x cp x tmp are the devices)."""
        return f"pp{self.pp} dp{self.dp}" + (f" cp{self.cp}" if self.cp > 1 else "") + (
            f" tmp{self.tmp}") + (f" ep{self.ep}" if self.ep > 1 else "") + (
            f" mbs{self.mbs}") + (f" v{self.virtual_stages}" if self.virtual_stages > 1 else "")

    def label(self) -> str:
        return f"pp{self.pp}-dp{self.dp}-tmp{self.tmp}-mbs{self.mbs}-z{self.zero_stage}" + (
            "-ckpt" if self.activation_checkpointing else "") + (
            "-sel" if self.selective_recompute and not self.activation_checkpointing else "") + (
            "-sp" if self.sequence_parallel else "") + (
            f"-v{self.virtual_stages}" if self.virtual_stages > 1 else "") + (
            f"-cp{self.cp}" if self.cp > 1 else "") + (
            f"-ep{self.ep}" if self.ep > 1 else "")

    def to_dict(self) -> dict:
        d = _flat_dict(self)
        d["partition"] = list(self.partition)
        d["placement"] = [[list(r) for r in s] for s in self.placement]
        d["gas"] = self.gas
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Strategy":
        return cls(
            pp=int(d["pp"]), dp=int(d["dp"]), tmp=int(d["tmp"]), mbs=int(d["mbs"]),
            global_batch_size=int(d["global_batch_size"]),
            partition=tuple(int(x) for x in d["partition"]),
            placement=tuple(tuple(tuple(int(x) for x in r) for r in s) for s in d["placement"]),
            placement_order=str(d.get("placement_order", "given")),
            zero_stage=int(d.get("zero_stage", 0)),
            activation_checkpointing=bool(d.get("activation_checkpointing", False)),
            selective_recompute=bool(d.get("selective_recompute",
                                           d.get("recompute") == "selective")),
            sequence_parallel=bool(d.get("sequence_parallel", False)),
            virtual_stages=int(d.get("virtual_stages", 1)),
            cp=int(d.get("cp", 1)),
            ep=int(d.get("ep", 1)),
        )


@dataclass(frozen=True, kw_only=True)
class Breakdown:
    """Where the closed-form iteration time goes; the six parts sum to AMP eq. 5 + 4
    (`Estimate.analytic_iteration_time_s`; a simulated time has `Estimate.simulation`).

    With b the bottleneck stage (largest t_j = compute_j + tp_j):
    compute = gas * compute_b, tensor_parallel = gas * tp_b, pipeline_bubble = sum of the other
    stages' t_j (fill and drain), p2p = sum of e_j; then, on the stage whose gradient sync plus
    optimizer step is longest, data_parallel = its sync and optimizer = its step.
    """

    compute_s: float
    pipeline_bubble_s: float
    p2p_s: float
    tensor_parallel_s: float
    data_parallel_s: float
    optimizer_s: float = 0.0

    def to_dict(self) -> dict:
        return _flat_dict(self)


@dataclass(frozen=True, kw_only=True)
class StageMemory:
    """Predicted peak memory of the most loaded device of one pipeline stage."""

    stage: int
    parameter_bytes: int
    gradient_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    overhead_bytes: int
    peak_bytes: int
    """The weights, gradients, optimizer states and overhead, plus the larger of the
    activations and `step_bytes` (never held at once)."""
    capacity_bytes: int
    """Usable capacity (device memory minus headroom) of the smallest device in the stage."""
    step_bytes: int = 0
    """Held during the optimizer step only (Megatron-LM's fp32 copies of 16-bit gradients)."""

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.capacity_bytes

    def to_dict(self) -> dict:
        d = _flat_dict(self)
        d["fits"] = self.fits
        return d


@dataclass(frozen=True, kw_only=True)
class CriticalSegment:
    """A run of consecutive critical-path tasks of one stage and kind (simulated)."""

    stage: int
    kind: str
    """forward, recompute, backward, optimizer, send (P2P, on the sending stage), allreduce,
    reduce_scatter or allgather (data-parallel)."""
    tasks: int
    start_s: float
    end_s: float
    time_s: float
    """The part of the iteration it accounts for (the runs' times sum to the makespan)."""

    def to_dict(self) -> dict:
        return _flat_dict(self)


@dataclass(frozen=True, kw_only=True)
class SimulationBreakdown:
    """Where the simulated iteration's time goes, per pipeline stage (amp_search.simulate)."""

    schedule: str
    iteration_time_s: float
    busy_s: tuple[float, ...]
    """Time the stage's compute stream computes (forward, recompute, backward, step)."""
    idle_s: tuple[float, ...]
    """Makespan - busy: the bubble, exposed communication included."""
    exposed_comm_s: tuple[float, ...]
    """Time one of the stage's transfers or collectives is in flight while it computes
    nothing."""
    stage_end_s: tuple[float, ...]
    critical_runs: tuple[tuple[int, str, int, float, float, float], ...] = ()
    """The critical path's runs as (stage, kind, tasks, start_s, end_s, time_s), first run
    first: `critical_path` gives them as records, when asked (an interleaved schedule's
    path has thousands of runs, and a plan simulates dozens of strategies)."""

    @cached_property
    def critical_path(self) -> tuple[CriticalSegment, ...]:
        """The critical path as runs of consecutive tasks of one stage and kind."""
        return tuple(CriticalSegment(stage=a, kind=k, tasks=n, start_s=t0, end_s=t1, time_s=dt)
                     for a, k, n, t0, t1, dt in self.critical_runs)

    def critical_time_by_kind(self) -> dict[str, float]:
        """Critical-path time per kind, largest first."""
        out: dict[str, float] = {}
        for _, kind, _, _, _, time_s in self.critical_runs:
            out[kind] = out.get(kind, 0.0) + time_s
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def to_dict(self) -> dict:
        return {"schedule": self.schedule, "iteration_time_s": self.iteration_time_s,
                "stages": [{"stage": j, "busy_s": b, "idle_s": i, "exposed_comm_s": x,
                            "ends_at_s": t}
                           for j, (b, i, x, t) in enumerate(zip(
                               self.busy_s, self.idle_s, self.exposed_comm_s,
                               self.stage_end_s))],
                "critical_path_time_by_kind_s": self.critical_time_by_kind(),
                "critical_path": [dict(zip(_CRITICAL_RUN_KEYS, run))
                                  for run in self.critical_runs]}


_CRITICAL_RUN_KEYS = ("stage", "kind", "tasks", "start_s", "end_s", "time_s")
"""CriticalSegment's fields, in SimulationBreakdown.critical_runs' order."""


@dataclass(frozen=True, kw_only=True)
class Estimate:
    """The cost model's prediction for one strategy."""

    strategy: Strategy
    iteration_time_s: float
    breakdown: Breakdown
    stage_time_s: tuple[float, ...]
    """t_j: one micro-batch forward+backward on stage j (slowest device), TP comm included."""
    memory: tuple[StageMemory, ...] = ()
    timing_sources: tuple[str, ...] = ()
    """Where each stage's layer times came from (e.g. 'analytic:V100-16GB', 'profile:...')."""
    analytic_iteration_time_s: float | None = None
    """AMP eq. 5 + 4, the closed form (given None: iteration_time_s, which is then it)."""
    time_source: str = "analytic"
    """What iteration_time_s is: 'simulated' (amp_search.simulate), 'analytic', or
    'analytic (why it was not simulated)'."""
    simulation: SimulationBreakdown | None = None
    """The simulated iteration's per-stage breakdown, where simulated."""
    backend: str = "deepspeed"
    """The framework it was costed for (training.backend: deepspeed | megatron)."""

    def __post_init__(self):
        if self.analytic_iteration_time_s is None:
            object.__setattr__(self, "analytic_iteration_time_s", self.iteration_time_s)

    @property
    def simulated(self) -> bool:
        return self.time_source == "simulated"

    @property
    def not_simulated_because(self) -> str | None:
        """Why the simulator left this strategy to the closed form, where time_source says
        ('analytic (why)'); None otherwise."""
        prefix = "analytic ("
        if self.time_source.startswith(prefix) and self.time_source.endswith(")"):
            return self.time_source[len(prefix):-1]
        return None

    @staticmethod
    def analytic_because(why: str) -> str:
        """The time_source of a strategy the simulator leaves to the closed form, and why."""
        return f"analytic ({why})"

    @property
    def fits(self) -> bool:
        return all(m.fits for m in self.memory)

    @property
    def samples_per_s(self) -> float:
        return self.strategy.global_batch_size / self.iteration_time_s

    def to_dict(self) -> dict:
        s = self.strategy
        return {
            "pp": s.pp, "dp": s.dp, "tmp": s.tmp, "mbs": s.mbs, "gas": s.gas,
            "zero_stage": s.zero_stage,
            "activation_checkpointing": s.activation_checkpointing,
            "recompute": s.recompute, "sequence_parallel": s.sequence_parallel,
            "virtual_stages": s.virtual_stages, "cp": s.cp, "ep": s.ep,
            "backend": self.backend,
            "partition": list(s.partition),
            "placement": [[list(r) for r in st] for st in s.placement],
            "placement_order": s.placement_order,
            "iteration_time_s": self.iteration_time_s,
            "analytic_iteration_time_s": self.analytic_iteration_time_s,
            "time_source": self.time_source,
            "samples_per_s": self.samples_per_s,
            "breakdown": self.breakdown.to_dict(),
            "stage_time_s": list(self.stage_time_s),
            "memory": {
                "stages": [m.to_dict() for m in self.memory],
                "peak_bytes": max((m.peak_bytes for m in self.memory), default=0),
            },
            "fits": self.fits,
            "timing_sources": list(self.timing_sources),
            "simulation": None if self.simulation is None else self.simulation.to_dict(),
        }


@dataclass(frozen=True, kw_only=True)
class Plan:
    """A ranked search result."""

    strategies: tuple[Estimate, ...]
    """Feasible strategies, fastest first: those `plan` keeps (its `keep` fastest layouts
    and those within `keep_within` of the best; every one with keep=None), the others
    counted in `pruned` under slower_than_the_kept_plans; the CLI shows the top-k."""
    baseline: Estimate | None
    """Megatron's heuristic (AMP section 4.1), for the predicted gain over it."""
    search_time_s: float
    candidates: int
    """(pp, dp, tmp, mbs, zero, recompute, placement) combinations looked at."""
    evaluated: int
    """Candidates costed (each with an exact layer assignment)."""
    pruned: dict[str, int] = field(default_factory=dict)
    """Candidates dropped before ranking, by reason."""
    backends: tuple[str, ...] = ()
    """The frameworks planned, where more than one (the spec names no training.backend;
    each strategy's `Estimate.backend` says which); () for one."""
    backend_notes: tuple[str, ...] = ()
    """Why a backend the spec could mean is not in the plan (one line each)."""

    @property
    def best(self) -> Estimate:
        return self.strategies[0]

    def speedup(self, e: Estimate) -> float | None:
        if self.baseline is None:
            return None
        return self.baseline.iteration_time_s / e.iteration_time_s

    def to_dict(self, top_k: int | None = None) -> dict:
        rows = self.strategies if top_k is None else self.strategies[:top_k]
        out = []
        for rank, e in enumerate(rows, 1):
            d = {"rank": rank, **e.to_dict()}
            d["speedup_over_megatron"] = self.speedup(e)
            out.append(d)
        return {
            "strategies": out,
            "megatron_baseline": None if self.baseline is None else self.baseline.to_dict(),
            "search_time_s": self.search_time_s,
            "candidates": self.candidates,
            "evaluated": self.evaluated,
            "pruned": dict(self.pruned),
            "num_ranked": len(self.strategies),
            **({"backends": list(self.backends), "backend_notes": list(self.backend_notes)}
               if self.backends else {}),
        }


@dataclass(frozen=True, kw_only=True)
class GroupAlone:
    """The best plan of one node group of a mixed cluster on its own, the other groups idle:
    whether the slower devices help or hold the others back."""

    group: int
    """Index into the spec's cluster.nodes."""
    gpu: str
    nodes: int
    gpus: int
    best: Estimate | None
    """None where nothing fits on this group alone."""
    reason: str = ""
    """Why nothing fits (the search's prune counts)."""

    def samples_per_s(self, global_batch_size: int) -> float | None:
        return None if self.best is None else global_batch_size / self.best.iteration_time_s

    def to_dict(self, global_batch_size: int) -> dict:
        return {"group": self.group, "gpu": self.gpu, "nodes": self.nodes, "gpus": self.gpus,
                "best": None if self.best is None else self.best.to_dict(),
                "samples_per_s": self.samples_per_s(global_batch_size),
                "reason": self.reason or None}


@dataclass(frozen=True, kw_only=True)
class SubsetPlan:
    """The best plan on a subset of the cluster's devices, the rest idle (`planner.plan_subsets`):
    which devices to rent or use, at what time, cost and GPU-time."""

    uses: tuple[tuple[int, int], ...]
    """Per node group of the spec: (nodes used, GPUs used on each), the first ones as listed;
    (0, 0) leaves the group out."""
    gpus: int
    """Devices used."""
    best: Estimate | None
    """The fastest plan on them, its placement in the whole cluster's device ids; None where
    nothing fits."""
    price_per_hour: float | None = None
    """What the nodes used cost per hour (a node counts whole however many of its GPUs run);
    None where a node group used has no price_per_hour."""
    whole: bool = False
    """Every device of the cluster (the plan's own best)."""
    reason: str = ""
    """Why nothing fits, or what beats every plan here."""
    dominated: bool = False
    """Not searched to the end: every plan that fits here is slower than a plan found on
    another part of the cluster that also uses no more GPU-seconds and costs no more
    (`planner.plan_subsets`); `best` is None."""
    cutoff_s: float | None = None
    """Where `dominated`: the predicted time (s per iteration) that every plan here takes
    at least."""

    @property
    def iteration_time_s(self) -> float | None:
        return None if self.best is None else self.best.iteration_time_s

    @property
    def cost_per_iteration(self) -> float | None:
        """iteration time x price per hour / 3600, in the prices' currency."""
        if self.best is None or self.price_per_hour is None:
            return None
        return self.best.iteration_time_s * self.price_per_hour / 3600.0

    def gpu_seconds_per_sample(self, global_batch_size: int) -> float | None:
        """GPU-seconds per sample (DeepPool's GPU-time efficiency, lower is better): iteration
        time x GPUs used / global batch."""
        if self.best is None:
            return None
        return self.best.iteration_time_s * self.gpus / global_batch_size

    def objective_value(self, objective: str, global_batch_size: int) -> float | None:
        """What training.objective minimizes: time (s per iteration), cost (per iteration) or
        gpu_seconds (per sample); None where it is not known."""
        if objective == "cost":
            return self.cost_per_iteration
        if objective == "gpu_seconds":
            return self.gpu_seconds_per_sample(global_batch_size)
        return self.iteration_time_s

    def to_dict(self, global_batch_size: int) -> dict:
        return {"uses": [{"nodes": n, "gpus_per_node": k} for n, k in self.uses],
                "gpus": self.gpus, "whole": self.whole,
                "iteration_time_s": self.iteration_time_s,
                "price_per_hour": self.price_per_hour,
                "cost_per_iteration": self.cost_per_iteration,
                "gpu_seconds_per_sample": self.gpu_seconds_per_sample(global_batch_size),
                "best": None if self.best is None else self.best.to_dict(),
                "dominated": self.dominated, "cutoff_s": self.cutoff_s,
                "reason": self.reason or None}
