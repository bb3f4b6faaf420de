"""How devices are wired, as the collective formulas see them: a torus of nearest-neighbour
links (TPU ICI; :class:`Ring`, :class:`Torus2D`, :class:`Torus3D`) or one switch
(:class:`FullyConnected`: NVLink and NVSwitch in a GPU node), and the axes of the network a
group of devices uses (:class:`GroupAxis`). Nodes joined by a slower network are a
:class:`~simpmd.cost.cluster.Cluster`. What a collective costs on them is
:mod:`simpmd.cost.network`'s.
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np


@dataclass(frozen=True)
class GroupAxis:
    """One axis of the network a group of devices uses, as the cost formulas see it.

    ``size`` devices along it; ``bandwidth`` bytes/s that one device can send to ONE
    neighbour in ONE direction; ``wraps`` whether the ends are linked (a ring, not a
    line); ``switch`` whether every device reaches every other in one hop instead.
    ``axis``, ``offset`` and ``stride`` place it in the topology (for routing a
    permutation): a group that takes every ``stride``-th device along the axis.
    """

    size: int
    bandwidth: float
    wraps: bool = False
    switch: bool = False
    axis: int = 0
    offset: int = 0
    stride: int = 1


class Torus:
    """Devices on a grid, linked to their nearest neighbour along each axis (TPU ICI).

    ``dims`` the size of each axis; ``wraparound`` (one flag, or one per axis) whether
    the last device of an axis links back to the first; ``link_bandwidth`` bytes/s of one
    link in ONE direction (links are full duplex); ``hop_latency`` seconds per hop;
    ``links`` parallel links between two neighbours. Device ids are row-major in ``dims``.
    ``overlap``: a hop lasts max(latency, transfer), the Scaling Book's rule for ICI (see
    :func:`simpmd.cost.network.step_time`); False adds them.
    """

    kind = "torus"
    overlap = True

    def __init__(self, dims, wraparound=True, *, link_bandwidth: float, hop_latency: float,
                 links: int = 1, name: str = ""):
        self.dims = tuple(int(d) for d in dims)
        if not self.dims or min(self.dims) < 1:
            raise ValueError(f"a torus needs positive axis sizes, got {dims!r}")
        flags = (wraparound,) * len(self.dims) if np.ndim(wraparound) == 0 else tuple(wraparound)
        if len(flags) != len(self.dims):
            raise ValueError(f"give one wraparound flag per axis: {len(self.dims)} axes, "
                             f"{len(flags)} flags")
        self.wraparound = tuple(bool(w) for w in flags)
        self.link_bandwidth = float(link_bandwidth)
        self.hop_latency = float(hop_latency)
        self.links = int(links)
        self.name = name

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    def wraps(self, axis: int) -> bool:
        """True if this axis is a ring. Size 1 or 2 has nothing to wrap around."""
        return self.wraparound[axis] and self.dims[axis] > 2

    @property
    def axis_bandwidth(self) -> float:
        """Bytes/s from one device to one neighbour, one direction (all parallel links)."""
        return self.links * self.link_bandwidth

    def coords(self, device: int) -> tuple:
        return tuple(int(c) for c in np.unravel_index(int(device), self.dims))

    def group_axes(self, group_size: int, axes=None) -> list:
        """The axes a group of ``group_size`` devices spans.

        ``axes`` (topology axis indices) says which; by default a group as large as the
        topology spans every axis, and a smaller group takes the first axis of exactly
        its size, or else a stretch (no wraparound) of the first axis long enough.
        """
        if axes is not None:
            axes = (axes,) if np.ndim(axes) == 0 else tuple(int(a) for a in axes)
            if math.prod(self.dims[a] for a in axes) != group_size:
                raise ValueError(
                    f"axes {axes} of {self} hold {math.prod(self.dims[a] for a in axes)} "
                    f"devices, but the group has {group_size}")
            return [self._full_axis(a) for a in axes if self.dims[a] > 1]
        if group_size == self.size:
            return [self._full_axis(a) for a in range(len(self.dims)) if self.dims[a] > 1]
        if group_size == 1:
            return []
        for a, d in enumerate(self.dims):
            if d == group_size:
                return [self._full_axis(a)]
        for a, d in enumerate(self.dims):
            if d > group_size:
                return [GroupAxis(group_size, self.axis_bandwidth, False, axis=a)]
        raise ValueError(f"a group of {group_size} devices does not fit one axis of {self}; "
                         f"say which axes it spans with axes=(...)")

    def group_axes_of(self, devices):
        """The axes spanned by these device ids, or None if they do not form a sub-torus.

        Along an axis the group may take every s-th device (a mesh axis laid over part of
        a torus axis, another mesh axis taking the devices in between): it then shares each
        link of that stretch with the s - 1 groups interleaved with it, so it gets 1/s of
        the bandwidth, and wraps around when it spans the whole ring. (Each of its hops is
        s links long; the model charges one hop's latency.)"""
        coords = np.array([self.coords(d) for d in devices]).reshape(len(devices), -1)
        spans = []
        for a in range(len(self.dims)):
            values = np.unique(coords[:, a])
            if len(values) == 1:
                continue
            stride = int(values[1] - values[0])
            if not np.array_equal(values, values[0] + stride * np.arange(len(values))):
                return None
            full = len(values) * stride == self.dims[a]
            spans.append(GroupAxis(len(values), self.axis_bandwidth / stride,
                                   full and self.wraps(a), axis=a, offset=int(values[0]),
                                   stride=stride))
        if math.prod(s.size for s in spans) != len(set(map(int, devices))):
            return None
        return spans

    def _full_axis(self, a):
        return GroupAxis(self.dims[a], self.axis_bandwidth, self.wraps(a), axis=a)

    def __repr__(self):
        shape = "x".join(map(str, self.dims))
        wrap = "".join("W" if w else "-" for w in self.wraparound)
        label = f"{self.name} " if self.name else ""
        return (f"{type(self).__name__}({label}{shape}, wraparound {wrap}, "
                f"{self.link_bandwidth / 1e9:g} GB/s per link per direction, "
                f"{self.hop_latency * 1e6:g} us per hop)")


class Ring(Torus):
    """A 1-D torus: ``size`` devices in a line, closed into a ring if ``wraparound``."""

    def __init__(self, size: int, wraparound: bool = True, *, link_bandwidth: float,
                 hop_latency: float, links: int = 1, name: str = ""):
        super().__init__((size,), (wraparound,), link_bandwidth=link_bandwidth,
                         hop_latency=hop_latency, links=links, name=name)


class Torus2D(Torus):
    """A 2-D torus (TPU v5e, v6e): ``dims = (rows, cols)``, four neighbours per device."""

    def __init__(self, dims, wraparound=(True, True), *, link_bandwidth: float,
                 hop_latency: float, links: int = 1, name: str = ""):
        if len(dims) != 2:
            raise ValueError(f"Torus2D needs two axis sizes, got {dims!r}")
        super().__init__(dims, wraparound, link_bandwidth=link_bandwidth,
                         hop_latency=hop_latency, links=links, name=name)


class Torus3D(Torus):
    """A 3-D torus (TPU v4, v5p): six neighbours per device."""

    def __init__(self, dims, wraparound=(True, True, True), *, link_bandwidth: float,
                 hop_latency: float, links: int = 1, name: str = ""):
        if len(dims) != 3:
            raise ValueError(f"Torus3D needs three axis sizes, got {dims!r}")
        super().__init__(dims, wraparound, link_bandwidth=link_bandwidth,
                         hop_latency=hop_latency, links=links, name=name)


class FullyConnected:
    """Every device on one switch, one hop from every other (NVSwitch in an 8-GPU node).

    ``links`` per device into the switch, each ``link_bandwidth`` bytes/s per direction:
    a device can send ``links * link_bandwidth`` in total, to one peer or spread over many.
    A step costs latency plus transfer (``overlap = False``, NCCL's model; see :func:`simpmd.cost.network.step_time`).
    ``measured`` maps a collective to a :class:`~simpmd.cost.hardware.MeasuredFit` that ``algorithm=None`` uses
    instead of the formulas (a preset's topology carries its fits; one you build has none).
    """

    kind = "switch"
    overlap = False

    def __init__(self, size: int, *, link_bandwidth: float, hop_latency: float,
                 links: int = 1, name: str = "", measured=None):
        self.dims = (int(size),)
        self.link_bandwidth = float(link_bandwidth)
        self.hop_latency = float(hop_latency)
        self.links = int(links)
        self.name = name
        self.measured = dict(measured or {})     # collective -> MeasuredFit (see Hardware)

    @property
    def size(self) -> int:
        return self.dims[0]

    @property
    def port_bandwidth(self) -> float:
        """Bytes/s one device can send (and, at the same time, receive), all links together."""
        return self.links * self.link_bandwidth

    def group_axes(self, group_size: int, axes=None) -> list:
        if group_size > self.size:
            raise ValueError(f"a group of {group_size} devices does not fit {self}")
        return [GroupAxis(group_size, self.port_bandwidth, switch=True)] if group_size > 1 else []

    def group_axes_of(self, devices):
        return self.group_axes(len(set(map(int, devices))))

    def __repr__(self):
        label = f"{self.name} " if self.name else ""
        return (f"FullyConnected({label}{self.size} devices, {self.links} x "
                f"{self.link_bandwidth / 1e9:g} GB/s per direction each, "
                f"{self.hop_latency * 1e6:g} us per hop)")


def describe(topology) -> str:
    """A topology in a few words, as the estimates print it."""
    if topology.kind == "cluster":
        return (f"{topology.nodes} nodes of ({describe(topology.node)}) on "
                f"{topology.network}, {topology.scale_out_bandwidth / 1e9:g} GB/s per device")
    if topology.kind == "switch":
        return f"switch of {topology.size}"
    shape = "x".join(map(str, topology.dims))
    wrapping = [a for a in range(len(topology.dims)) if topology.wraps(a)]
    if not wrapping:
        return f"{shape} torus without wraparound"
    if len(wrapping) == len(topology.dims):
        return f"{shape} torus with wraparound"
    return f"{shape} torus with wraparound on axis {', '.join(map(str, wrapping))} only"
