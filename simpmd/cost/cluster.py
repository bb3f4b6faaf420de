"""Collectives over devices in several nodes: GPU nodes on InfiniBand, TPU slices on DCN.

Inside a node devices talk over a fast fabric (NVLink and NVSwitch in a GPU node, ICI in a
TPU slice); between nodes over a slower network, into which every device has its own share
(:attr:`Cluster.scale_out_bandwidth`): a DGX H100 has one 400 Gb/s InfiniBand NIC per GPU,
a TPU v5e host two 100 Gb/s NICs for its 8 chips. A collective whose group spans nodes is
costed two ways, and the faster is taken, as NCCL's tuner picks among its algorithms:

* **hierarchical**, as NCCL's tree-like schemes and XLA's multislice collectives do it: a
  reduce-scatter inside each node, an all-reduce of the node's shard across nodes (each
  device with its peers of the same local rank, over its own NIC, all ranks at once), an
  all-gather inside each node; an all-gather or reduce-scatter keeps its half of that;
  an all-to-all regroups inside the node by destination rank, then exchanges across
  nodes (NCCL's PXN). Few latency steps across the slow network.
* **ring** (GPU nodes): NCCL's flat ring through every device, one ring per NIC in use,
  so each step is limited by the slower of a device's NVLink port and the node's NICs
  the group uses. Many steps, each paying the network's latency.

Device ids are node-major: device ``d`` sits in node ``d // node.size``. Sizes follow
:func:`simpmd.cost.estimate`: ``nbytes`` is what one device holds before the call.
"""
from __future__ import annotations

from dataclasses import replace
import math

import numpy as np

from .network import (Estimate, GroupAxis, _describe, _estimate_group, _estimate_on,
                      _group_on)


class Cluster:
    """``nodes`` copies of ``node`` (a :class:`FullyConnected` GPU node or a :class:`Torus`
    TPU slice) joined by a network into which every device sends ``scale_out_bandwidth``
    bytes/s (one direction), each step across it costing ``scale_out_latency`` seconds."""

    kind = "cluster"
    overlap = False

    def __init__(self, node, nodes: int, *, scale_out_bandwidth: float,
                 scale_out_latency: float, name: str = "", network: str = "network"):
        if int(nodes) < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        self.node = node
        self.nodes = int(nodes)
        self.scale_out_bandwidth = float(scale_out_bandwidth)
        self.scale_out_latency = float(scale_out_latency)
        self.name = name or getattr(node, "name", "")
        self.network = network

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
                f"{self.scale_out_bandwidth / 1e9:g} GB/s per device per direction, "
                f"{self.scale_out_latency * 1e6:g} us per step)")


def describe(cluster: Cluster) -> str:
    return (f"{cluster.nodes} nodes of ({_describe(cluster.node)}) on {cluster.network}, "
            f"{cluster.scale_out_bandwidth / 1e9:g} GB/s per device")


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


def cluster_estimate(collective, nbytes, devices, cluster: Cluster, algorithm=None,
                     pairs=None, hardware="", note="") -> Estimate:
    """The estimate of one collective over ``devices`` (ids on ``cluster``, in member order).

    A group inside one node costs what the node's own topology says (measured fits
    included); one that spans nodes costs the faster of :func:`hierarchical` and
    :func:`flat_ring` (``algorithm`` may name either)."""
    by_node = members_by_node(cluster, devices)
    label = describe(cluster)
    if len(by_node) == 1:
        local = next(iter(by_node.values()))
        axes, inner_note = _group_on(cluster.node, local)
        return _estimate_on(collective, nbytes, axes, cluster.node.hop_latency, algorithm,
                            pairs, hardware, label, note or inner_note, cluster.node.overlap,
                            cluster.measured)
    counts = {len(v) for v in by_node.values()}
    if len(counts) > 1:
        note = (note + "; " if note else "") + ("nodes hold different numbers of the group's "
                                                "devices: costed with the smallest")
    group = (cluster, by_node, min(counts), len(by_node))
    names = {"hierarchical": hierarchical, "ring": flat_ring}
    if algorithm not in (None, "fastest", *names):
        raise ValueError(f"a {collective} across {len(by_node)} nodes has the algorithms "
                         f"'hierarchical' and 'ring' (GPU nodes); or None for the faster")
    chosen = [algorithm] if algorithm in names else list(names)
    found = [names[a](collective, float(nbytes), group, pairs, devices) for a in chosen]
    found = [e for e in found if e is not None]
    if not found:
        raise ValueError(f"no algorithm for a {collective} across nodes of {cluster.node!r}: "
                         f"'ring' needs GPU nodes")
    best = min(found, key=lambda e: (e.time_s, e.bandwidth_s))
    return replace(best, hardware=hardware, topology=label,
                   note="; ".join(x for x in (best.note, note) if x))


def _inner(collective, nbytes, group):
    cluster, by_node, g, _ = group
    local = next(v for v in by_node.values() if len(v) == g)
    axes, _ = _group_on(cluster.node, local)
    return _estimate_on(collective, nbytes, axes, cluster.node.hop_latency, None, None,
                        overlap=cluster.node.overlap, measured=cluster.measured)


def _outer(collective, nbytes, group, perm=None):
    """``collective`` among one device of each node (all local ranks at once, each on its
    own share of the network): the network is a switch as the formulas see it."""
    cluster, _, _, m = group
    axes = [GroupAxis(m, cluster.scale_out_bandwidth, switch=True)]
    return _estimate_on(collective, nbytes, axes, cluster.scale_out_latency, "fastest", perm)


def _chain(collective, nbytes, p, algorithm, phases, words) -> Estimate:
    """One estimate made of phases run one after another."""
    phases = [(e, w) for e, w in zip(phases, words) if e.time_s > 0]
    return Estimate(collective, algorithm, int(nbytes), p, sum(e.time_s for e, _ in phases),
                    sum(e.latency_s for e, _ in phases), sum(e.bandwidth_s for e, _ in phases),
                    sum(e.steps for e, _ in phases),
                    sum(e.bytes_sent_per_device for e, _ in phases),
                    note=" + ".join(f"{w} ({e.algorithm})" for e, w in phases))


def hierarchical(collective, nbytes, group, pairs, devices):
    """Inside each node, then across nodes, then inside again (XLA's multislice scheme,
    NCCL's tree-like algorithms): see the module's docstring."""
    cluster, by_node, g, m = group
    p = g * m
    if collective == "all_reduce":
        phases = [_inner("reduce_scatter", nbytes, group),
                  _outer("all_reduce", nbytes / g, group),
                  _inner("all_gather", nbytes / g, group)]
        words = ["reduce-scatter in each node", f"all-reduce across {m} nodes",
                 "all-gather in each node"]
    elif collective == "all_gather":
        phases = [_outer("all_gather", nbytes, group), _inner("all_gather", m * nbytes, group)]
        words = [f"all-gather across {m} nodes", "all-gather in each node"]
    elif collective == "reduce_scatter":
        phases = [_inner("reduce_scatter", nbytes, group),
                  _outer("reduce_scatter", nbytes / g, group)]
        words = ["reduce-scatter in each node", f"reduce-scatter across {m} nodes"]
    elif collective == "all_to_all":
        phases = [_inner("all_to_all", nbytes, group), _outer("all_to_all", nbytes, group)]
        words = ["all-to-all in each node (by destination rank)", f"all-to-all across {m} nodes"]
    else:
        return _permute_across(collective, nbytes, group, pairs, devices)
    return _chain(collective, nbytes, p, "hierarchical", phases, words)


def _permute_across(collective, nbytes, group, pairs, devices):
    """A permute whose pairs cross nodes: each device sends over its own share of the
    network, the busiest device's sends and receives setting the time."""
    cluster, _, _, _ = group
    pairs = pairs or [(i, (i + 1) % len(devices)) for i in range(len(devices))]
    node = [cluster.node_of(d) for d in devices]
    across = [(s, d) for s, d in pairs if node[s] != node[d]]
    if not across:                      # every pair inside a node: the nodes at once
        first = node[pairs[0][0]]
        here = [k for k, n in enumerate(node) if n == first]
        local = [int(devices[k]) % cluster.node.size for k in here]
        inside = [(here.index(s), here.index(d)) for s, d in pairs if node[s] == first]
        return _estimate_group(cluster.node, local, collective, nbytes, inside, "")
    busiest = max(max(sum(1 for s, _ in across if s == x) for x, _ in across),
                  max(sum(1 for _, d in across if d == y) for _, y in across))
    transfer = busiest * nbytes / cluster.scale_out_bandwidth
    latency = cluster.scale_out_latency
    return Estimate(collective, "direct", int(nbytes), len(devices), latency + transfer, latency,
                    transfer, 1, busiest * nbytes, note=f"{len(across)} pair(s) across nodes")


def flat_ring(collective, nbytes, group, pairs, devices):
    """NCCL's ring through all p devices of GPU nodes, one ring per NIC the group uses in a
    node: each step moves one piece per device, limited by the slower of a device's
    NVLink port and the node's NICs, and waits on the network's latency."""
    cluster, _, g, m = group
    if cluster.node.kind != "switch" or collective not in ("all_reduce", "all_gather",
                                                           "reduce_scatter"):
        return None
    p = g * m
    rate = min(cluster.node.port_bandwidth, g * cluster.scale_out_bandwidth)
    steps = 2 * (p - 1) if collective == "all_reduce" else p - 1
    piece = nbytes if collective == "all_gather" else nbytes / p
    latency = steps * cluster.scale_out_latency
    transfer = steps * piece / rate
    return Estimate(collective, "ring", int(nbytes), p, latency + transfer, latency, transfer,
                    steps, steps * piece, note=f"{min(g, 64)} ring(s) through {m} nodes")


def devices_of(group_size: int, cluster: Cluster) -> list:
    """The first ``group_size`` devices: whole nodes, filled in order."""
    if group_size > cluster.size:
        raise ValueError(f"a group of {group_size} devices does not fit {cluster}")
    return list(range(int(group_size)))


def mesh_ids(sizes) -> np.ndarray:
    """A mesh laid over a cluster's devices in order: the last axis varies fastest, so it
    fills a node first (tensor parallelism inside a node, data parallelism across)."""
    return np.arange(math.prod(sizes)).reshape(sizes)
