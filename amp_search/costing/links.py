"""Which links each collective actually uses, and what bandwidth it gets on them.

A placement is an int array P[stage, replica, tensor_rank] of device ids. Three kinds of
traffic run over it:

- tensor-parallel rings: P[j, r, :]   (inside a layer, every micro-batch)
- data-parallel rings:   P[j, :, t]   (gradient sync, once per iteration)
- pipeline P2P flows:    P[j, r, t] -> P[j+1, r, t]

A ring edge inside a node uses the node's intra-node bandwidth (what collectives reach: the
figure written times its link kind's achievable share). An edge between nodes uses the
network, and all edges of the same traffic kind that leave (or enter) a node at the same time
share that node's inter-node bandwidth fairly (Proteus; cost_models.comm.shared_bandwidth).
A ring runs at the speed of its slowest edge (AMP: 'the lowest bandwidth in the group').
Everything here is vectorised over all groups at once: a 2048-device placement costs
microseconds, not a Python loop per device.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cost_models.comm import hierarchical_shares, shared_bandwidth

from ..spec import Cluster


@dataclass(frozen=True)
class ClusterArrays:
    """The cluster as dense arrays indexed by device id / node id. A node here is an NVLink
    domain (`Cluster.nvlink_domains`): one spec node, or consecutive nodes that a
    node group's nvlink_domain joins (a GB200 NVL72 rack's trays), whose links inside are
    NVLink and whose networks add up."""

    node_of: np.ndarray             # [device] -> node (NVLink domain) id
    intra_bytes_per_s: np.ndarray   # [node] intra-node GPU-to-GPU bandwidth collectives reach
    inter_bytes_per_s: np.ndarray   # [node] the same of the node's whole network
    num_nodes: int

    @classmethod
    def of(cls, cluster: Cluster) -> "ClusterArrays":
        """The bandwidths collectives reach: each as the spec wrote it (the data sheet's)
        times its link kind's achievable share (spec.LinkKind)."""
        domains = cluster.nvlink_domains
        domain_of = np.empty(len(cluster.nodes), dtype=np.int64)
        for k, ids in enumerate(domains):
            domain_of[list(ids)] = k
        nodes = cluster.nodes
        return cls(
            node_of=domain_of[np.array([d.node for d in cluster.devices], dtype=np.int64)],
            intra_bytes_per_s=np.array([nodes[ids[0]].intra_node_achievable_bytes_per_s
                                        for ids in domains]),
            inter_bytes_per_s=np.array([sum(nodes[i].inter_node_achievable_bytes_per_s
                                            for i in ids) for ids in domains]),
            num_nodes=len(domains))


    def with_links(self, intra_fit=None, inter_fit=None) -> "ClusterArrays":
        """A copy whose intra / inter bandwidths are those of measured link fits (objects with
        `bandwidth_bytes_per_s`); None keeps the spec's."""
        if intra_fit is None and inter_fit is None:
            return self
        return ClusterArrays(
            node_of=self.node_of,
            intra_bytes_per_s=self.intra_bytes_per_s if intra_fit is None else
            np.full_like(self.intra_bytes_per_s, intra_fit.bandwidth_bytes_per_s),
            inter_bytes_per_s=self.inter_bytes_per_s if inter_fit is None else
            np.full_like(self.inter_bytes_per_s, inter_fit.bandwidth_bytes_per_s),
            num_nodes=self.num_nodes)


@dataclass(frozen=True)
class GroupLinks:
    """Per group: the bandwidth its slowest edge gets, and whether it crosses nodes."""

    bandwidth_bytes_per_s: np.ndarray
    crosses_nodes: np.ndarray


def _edge_bandwidth(arr: ClusterArrays, src: np.ndarray, dst: np.ndarray,
                    intra_scale: float, inter_scale: float) -> tuple[np.ndarray, np.ndarray]:
    """Bandwidth of each edge src->dst (same shapes), with NIC sharing among all edges given."""
    ns, nd = arr.node_of[src], arr.node_of[dst]
    cross = ns != nd
    out_flows = np.bincount(ns[cross], minlength=arr.num_nodes)
    in_flows = np.bincount(nd[cross], minlength=arr.num_nodes)
    shared = np.minimum(shared_bandwidth(arr.inter_bytes_per_s[ns], out_flows[ns]),
                        shared_bandwidth(arr.inter_bytes_per_s[nd], in_flows[nd]))
    bw = np.where(cross, shared * inter_scale, arr.intra_bytes_per_s[ns] * intra_scale)
    return bw, cross


def ring_links(arr: ClusterArrays, groups: np.ndarray, *, intra_scale: float = 1.0,
               inter_scale: float = 1.0) -> GroupLinks:
    """Rings over the last axis of `groups` (shape [..., n]); all groups run concurrently."""
    n = groups.shape[-1]
    if n == 1:
        shape = groups.shape[:-1]
        return GroupLinks(np.full(shape, np.inf), np.zeros(shape, dtype=bool))
    bw, cross = _edge_bandwidth(arr, groups, np.roll(groups, -1, axis=-1),
                                intra_scale, inter_scale)
    return GroupLinks(bw.min(axis=-1), cross.any(axis=-1))


def p2p_links(arr: ClusterArrays, placement: np.ndarray, *, intra_scale: float = 1.0,
              inter_scale: float = 1.0) -> GroupLinks:
    """Per stage boundary j (between stage j and j+1): the slowest of its dp*tmp flows, with
    all boundaries' flows sharing NICs (in 1F1B steady state every stage sends at once)."""
    if placement.shape[0] == 1:
        return GroupLinks(np.zeros(0), np.zeros(0, dtype=bool))
    src, dst = placement[:-1], placement[1:]
    bw, cross = _edge_bandwidth(arr, src, dst, intra_scale, inter_scale)
    flat = bw.reshape(bw.shape[0], -1)
    return GroupLinks(flat.min(axis=1), cross.reshape(cross.shape[0], -1).any(axis=1))


@dataclass(frozen=True)
class AllToAllLinks:
    """Per group of an all-to-all (expert parallelism's token dispatch and combine): the
    seconds per byte of one rank's message on the group's slowest rank, and whether the
    group crosses nodes."""

    seconds_per_byte: np.ndarray
    crosses_nodes: np.ndarray


def all_to_all_links(arr: ClusterArrays, groups: np.ndarray, *, intra_scale: float = 1.0,
                     inter_scale: float = 1.0,
                     hierarchical: tuple[int, int] | None = None) -> AllToAllLinks:
    """All-to-alls over the last axis of `groups` ([g, n] device ids), all groups at once.
    A rank sends 1/n of its message to each other member: the share for members on its node
    over the node's intra-node bandwidth, the share for the others over the network, where
    every rank of the node that sends off the node at that moment shares the node's
    bandwidth (cost_models.comm.shared_bandwidth); the two run side by side, so a rank takes
    the longer, and the group its slowest rank's time. `hierarchical` (experts, top-k): a
    dispatcher that sends each token once over the network to each other node its experts
    are on and forwards it there over NVLink (DeepEP, Hybrid-EP;
    cost_models.comm.hierarchical_shares) moves those shares instead; inside one node the
    two are the same."""
    n = groups.shape[-1]
    if n == 1:
        shape = groups.shape[:-1]
        return AllToAllLinks(np.zeros(shape), np.zeros(shape, dtype=bool))
    node = arr.node_of[groups]                                        # [g, n]
    same = node[..., :, None] == node[..., None, :]
    local = same.sum(axis=-1)                                         # members on my node
    off = local < n
    senders = np.bincount(node[off], minlength=arr.num_nodes)
    share = shared_bandwidth(arr.inter_bytes_per_s[node], np.maximum(senders[node], 1))
    intra_share, inter_share = (local - 1) / n, (n - local) / n
    if hierarchical is not None and off.any():
        intra_share, inter_share = hierarchical_shares(same, *hierarchical)
    intra = intra_share / (arr.intra_bytes_per_s[node] * intra_scale)
    inter = np.where(off, inter_share / (share * inter_scale), 0.0)
    per_rank = np.maximum(intra, inter)
    return AllToAllLinks(per_rank.max(axis=-1), off.any(axis=-1))
