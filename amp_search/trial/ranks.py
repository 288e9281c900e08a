"""Which process runs where: global rank <-> (stage, replica, tensor rank) <-> device.

DeepSpeed's `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)` orders its axes
(pipe, data, model), model fastest, so the *global rank* of a coordinate is

    g = stage * (dp * tmp) + replica * tmp + tensor          (ranks_test checks it)

and megatron-core's default order "tp-cp-ep-dp-pp" gives the same tensor / data / pipeline
groups, so megatron's tensor rank of g equals DeepSpeed's slice-parallel rank. With context
parallelism (megatron only) the replicas are the dp x cp ranks, replica = d * cp + c, which is
megatron's order with cp between tp and dp.

The plan's placement[stage][replica][tensor] names the device of each coordinate, hence of
each global rank. Launchers do not number processes that way: they number them node after node
(hostfile / node-rank order), and inside a node in the order of the local devices. That number
is the *launch rank* (torchrun's RANK, the deepspeed launcher's RANK, SLURM_PROCID). So:

- `launch_order[launch_rank] = global rank`: the global ranks sorted by (node position in
  the launch, local device);
- each node runs as many processes as it has placed devices; its i-th process (LOCAL_RANK i)
  drives the i-th of its placed local devices, ascending;
- the trial process (`amp_search.trial.run`) reads its launch rank, looks up its global rank
  and device in the config, and initializes torch.distributed with that global rank. Global
  rank 0 hosts the rendezvous store, so MASTER_ADDR is the host of global rank 0.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..records import Strategy


@dataclass(frozen=True, kw_only=True)
class RankAssignment:
    """Where one global rank runs."""

    rank: int
    """Global (DeepSpeed topology) rank."""
    stage: int
    replica: int
    tensor: int
    device: int
    """Device id in the spec's numbering."""
    node: int
    """Node id in the spec's numbering."""
    local_device: int
    """Index of the device inside its node (CUDA ordinal on a GPU node)."""
    host: str
    """Hostname that runs it ('localhost' for the local launcher)."""

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "RankAssignment":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__})


def global_rank(stage: int, replica: int, tensor: int, *, dp: int, tmp: int) -> int:
    """DeepSpeed's PipeModelDataParallelTopology rank of a (pipe, data, model) coordinate."""
    return (stage * dp + replica) * tmp + tensor


def coords(rank: int, *, dp: int, tmp: int) -> tuple[int, int, int]:
    """(stage, replica, tensor) of a global rank; the inverse of `global_rank`."""
    return rank // (dp * tmp), (rank // tmp) % dp, rank % tmp


def assign_ranks(strategy: Strategy, device_node: dict[int, tuple[int, int]],
                 node_host: dict[int, str]) -> tuple[RankAssignment, ...]:
    """One RankAssignment per global rank, in rank order.

    device_node: device id -> (node id, local device index); node_host: node id -> host."""
    out = []
    for g in range(strategy.num_devices):
        j, r, t = coords(g, dp=strategy.replicas, tmp=strategy.tmp)
        dev = strategy.placement[j][r][t]
        node, local = device_node[dev]
        out.append(RankAssignment(rank=g, stage=j, replica=r, tensor=t, device=dev, node=node,
                                  local_device=local, host=node_host[node]))
    return tuple(out)


def launch_nodes(ranks: tuple[RankAssignment, ...]) -> tuple[int, ...]:
    """The nodes a trial uses, in launch order (spec order: the hostfile order)."""
    return tuple(sorted({a.node for a in ranks}))


def launch_order(ranks: tuple[RankAssignment, ...]) -> tuple[int, ...]:
    """launch rank -> global rank: node by node (launch_nodes order), local devices ascending."""
    return tuple(a.rank for a in sorted(ranks, key=lambda a: (a.node, a.local_device)))


def node_devices(ranks: tuple[RankAssignment, ...], node: int) -> tuple[int, ...]:
    """The local devices one node runs, ascending (LOCAL_RANK i drives the i-th)."""
    return tuple(sorted(a.local_device for a in ranks if a.node == node))
