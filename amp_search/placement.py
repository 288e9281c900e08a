"""Device placement: which device runs virtual rank (stage, replica, tensor rank).

Megatron's order (AMP section 3.6): consecutive devices form a tensor-parallel group (so it
stays inside a node when tmp divides the node size), then data-parallel replicas, then
pipeline stages:  rank = (stage * dp + replica) * tmp + tensor_rank.

The device list it walks is the cluster's nodes in three orders; the best per strategy is kept:
- listed:        as the spec lists them;
- fastest-first: nodes sorted by their GPU's peak throughput, fastest first;
- slowest-first: the reverse.
On a homogeneous cluster the three coincide and only one is evaluated.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .spec import Cluster

PLACEMENT_ORDERS = ("listed", "fastest-first", "slowest-first")


@dataclass(frozen=True)
class DeviceOrder:
    name: str
    devices: np.ndarray  # device ids in placement order


def device_orders(cluster: Cluster, precision: str) -> list[DeviceOrder]:
    """The distinct device orders to try (duplicates dropped)."""
    def speed(node):
        return node.gpu.peak_flops_per_s.get(precision) or 0.0

    listed = list(cluster.nodes)
    fastest = sorted(listed, key=lambda n: (-speed(n), n.id))   # stable inside a speed
    slowest = sorted(listed, key=lambda n: (speed(n), n.id))
    out: list[DeviceOrder] = []
    seen: set[tuple[int, ...]] = set()
    for name, nodes in zip(PLACEMENT_ORDERS, (listed, fastest, slowest)):
        devices = tuple(d for n in nodes for d in n.devices)
        if devices not in seen:
            seen.add(devices)
            out.append(DeviceOrder(name, np.array(devices, dtype=np.int64)))
    return out


def megatron_placement(order: DeviceOrder, pp: int, dp: int, tmp: int) -> np.ndarray:
    """P[stage, replica, tensor_rank] = order[(stage * dp + replica) * tmp + tensor_rank]."""
    return order.devices.reshape(pp, dp, tmp)


def as_tuple(placement: np.ndarray) -> tuple:
    return tuple(tuple(map(tuple, s)) for s in placement.tolist())
