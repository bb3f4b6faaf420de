"""Collectives over devices in several nodes: GPU nodes on InfiniBand, TPU slices on DCN.

Inside a node devices talk over a fast fabric (NVLink and NVSwitch in a GPU node, ICI in a
TPU slice); between nodes over a slower network, into which every device has its own share
(:attr:`Cluster.scale_out_bandwidth`): a DGX H100 has one 400 Gb/s InfiniBand adapter per
GPU (a "rail"), a TPU v5e host two 100 Gb/s NICs for its 8 chips. The share is what a device
gets when every device of its node sends across at once, as the groups of one SPMD program
do: on rails each GPU keeps its own adapter, so groups of one mesh that cross nodes at the
same time do not slow each other; a node with fewer adapters than devices (say 4 for 8)
gives each device that fraction of one. What a collective over devices in several nodes
costs is :mod:`simpmd.cost.network`'s (its section "across nodes").

Device ids are node-major: device ``d`` sits in node ``d // node.size``.
"""
from __future__ import annotations

import math

import numpy as np


class Cluster:
    """``nodes`` copies of ``node`` (a :class:`FullyConnected` GPU node or a :class:`Torus`
    TPU slice) joined by a network into which every device sends ``scale_out_bandwidth``
    bytes/s (one direction, the adapter's line rate), each step across it costing
    ``scale_out_latency`` seconds.

    ``scale_out_efficiency`` is the fraction of that line rate NCCL's large transfers reach;
    ``nvlink_sharp`` (None for none) the efficiency of the node's in-switch reduction (NVLS,
    Hopper and later), which NCCL's NVLSTree all-reduce uses across nodes; ``call_latency``
    the host's cost of submitting a collective's kernel, which nccl-tests' times include."""

    kind = "cluster"
    overlap = False

    def __init__(self, node, nodes: int, *, scale_out_bandwidth: float,
                 scale_out_latency: float, name: str = "", network: str = "network",
                 scale_out_efficiency: float = 1.0, nvlink_sharp: float | None = None,
                 call_latency: float = 0.0):
        if int(nodes) < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.node = node
        self.nodes = int(nodes)
        self.scale_out_bandwidth = float(scale_out_bandwidth)
        self.scale_out_latency = float(scale_out_latency)
        self.name = name or getattr(node, "name", "")
        self.network = network
        self.scale_out_efficiency = float(scale_out_efficiency)
        self.nvlink_sharp = nvlink_sharp
        self.call_latency = float(call_latency)

    @property
    def size(self) -> int:
        return self.nodes * self.node.size

    @property
    def dims(self) -> tuple:
        return (self.nodes,) + tuple(self.node.dims)

    @property
    def hop_latency(self) -> float:
        return self.node.hop_latency

    @property
    def measured(self) -> dict:
        return getattr(self.node, "measured", {})

    def node_of(self, device: int) -> int:
        """The node device ``device`` sits in."""
        return int(device) // self.node.size

    def __repr__(self):
        return (f"Cluster({self.nodes} nodes of {self.node!r}, {self.network} "
                f"{self.scale_out_bandwidth / 1e9:g} GB/s per device per direction "
                f"({self.scale_out_efficiency:.0%} reached), "
                f"{self.scale_out_latency * 1e6:g} us per step)")


def members_by_node(cluster: Cluster, devices) -> dict:
    """node -> the local ids (in member order) of ``devices`` in that node."""
    out: dict = {}
    for d in devices:
        out.setdefault(cluster.node_of(d), []).append(int(d) % cluster.node.size)
    return out


def shape_key(cluster: Cluster, devices: np.ndarray) -> dict:
    """Groups (rows of ``devices``) that cost the same: the same nodes relative to the
    first, and the same devices inside each node."""
    nodes = devices // cluster.node.size
    key = np.concatenate([nodes - nodes.min(axis=1, keepdims=True),
                          devices % cluster.node.size], axis=1)
    rows: dict = {}
    for k, row in enumerate(key):
        rows.setdefault(row.tobytes(), []).append(k)
    return {kb: np.array(ks) for kb, ks in rows.items()}


def devices_of(group_size: int, cluster: Cluster) -> list:
    """The first ``group_size`` devices: whole nodes, filled in order."""
    if group_size > cluster.size:
        raise ValueError(f"a group of {group_size} devices does not fit {cluster}")
    return list(range(int(group_size)))


def mesh_ids(sizes) -> np.ndarray:
    """A mesh laid over a cluster's devices in order: the last axis varies fastest, so it
    fills a node first (tensor parallelism inside a node, data parallelism across)."""
    return np.arange(math.prod(sizes)).reshape(sizes)
