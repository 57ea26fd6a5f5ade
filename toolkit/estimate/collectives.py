"""One collective's cost over a process group of n ranks placed on nodes: NCCL's ring and tree shapes (bandwidth
term 2(n−1)/n·S/B for an all-reduce, a ring inside a node, a tree across nodes), the bus bandwidth a group
achieves and its start-up latency. No Job here: toolkit.estimate.comm counts a training step's collectives,
toolkit.estimate.moe its all-to-alls and toolkit.estimate.serving_time the serving step's, all three on these.
"""

from __future__ import annotations

import numpy as np

__all__ = ["ring_s", "placement", "bus_bw_bytes_per_s", "latency_s"]


def ring_s(volume_factor, size_bytes, n, bus_bw):
    """Bandwidth time of a ring collective moving volume_factor·(n−1)/n·size at bus bandwidth bus_bw (bytes/s,
    achieved: `bus_bw_bytes_per_s`)."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, volume_factor * np.maximum(n - 1, 0) / np.maximum(n, 1) * size_bytes / bus_bw, 0.0)


def placement(n, stride, gpus_per_node: int):
    """(ranks per node, nodes) of a process group of n ranks whose members sit `stride` global ranks apart (the
    product of the axes inside it: tp for cp, tp·cp for dp, ...), ranks filling nodes in order as Megatron and
    torch's DeviceMesh place them."""
    n, stride = np.asarray(n, dtype=float), np.asarray(stride, dtype=float)
    per_node = np.clip(np.floor(gpus_per_node / stride), 1, None)
    per_node = np.minimum(per_node, n)
    return per_node, np.ceil(n / per_node)


def bus_bw_bytes_per_s(n, stride, hw, a, kind: str = "all_reduce"):
    """Achieved bus bandwidth of a collective over a group (nccl-tests' busbw: the group's ranks each move
    vol·(n−1)/n of the buffer). Inside a node: the device's link at link_efficiency, or for an all-reduce the
    NVLink SHARP figure where the catalog row has one (the switch reduces). Across nodes each node must bring in
    or send out (k−1)/k of the data over the NICs of the group's r ranks on it, side by side, at
    network_efficiency; both legs pipeline, so the slower one sets the pace. (One rank a node, as dp beside tp
    8, gets one NIC; two nodes move half the data across and beat the NICs' own figure, as nccl-tests show.)
    tests/estimate/test_collectives.py checks this against published nccl-tests runs."""
    n = np.asarray(n, dtype=float)
    per_node, nodes = placement(n, stride, hw.gpus_per_node)
    intra = hw.intra_bw_bytes_per_s * a.link_efficiency
    if kind == "all_reduce" and hw.allreduce_bus_bw_bytes_per_s:
        intra = hw.allreduce_bus_bw_bytes_per_s
    nics = per_node * hw.inter_bw_bytes_per_s * a.network_efficiency
    across = nics * ((n - 1) / np.maximum(n, 1)) / np.maximum((nodes - 1) / nodes, 1e-9)
    return np.where(nodes > 1, np.minimum(intra, across), intra)


def latency_s(n, stride, gpus_per_node: int, a, kind: str = "all_reduce"):
    """Start-up cost of one collective over n ranks as NCCL picks its algorithm: a ring costs a hop per rank
    (twice round for an all-reduce: reduce-scatter then all-gather), a hop between nodes at latency_inter_s; an
    all-reduce across nodes may take a tree instead (a ring inside each node, log2(nodes) levels between nodes,
    up and down), whichever starts sooner. All-gather and reduce-scatter run on rings."""
    n = np.asarray(n, dtype=float)
    per_node, nodes = placement(n, stride, gpus_per_node)
    rounds = 2 if kind == "all_reduce" else 1
    across = np.where(nodes > 1, nodes * a.latency_inter_s, 0.0)  # the hops that leave a node
    ring = rounds * ((n - np.where(nodes > 1, nodes, 1)) * a.latency_intra_s + across)
    if kind == "all_reduce":
        tree = 2 * (per_node - 1) * a.latency_intra_s + 2 * np.ceil(np.log2(nodes)) * a.latency_inter_s
        ring = np.where(nodes > 1, np.minimum(ring, tree), ring)
    return np.where(n > 1, ring, 0.0)
