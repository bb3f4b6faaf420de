"""How long would this collective take on real hardware? An alpha-beta cost model.

Every algorithm here moves data in *steps*. A step crosses some hops, each with a fixed
latency (alpha, seconds), and keeps the busiest link busy for its bytes divided by that
link's bandwidth (beta is 1/bandwidth). Small messages are latency-bound (time ~ hops x
alpha); large ones are bandwidth-bound (time ~ bytes / bandwidth). The model ignores
compute for the reductions, congestion beyond what the algorithm itself causes, and
protocol overheads, so real runs are slower (the Scaling Book measures 680 us where its
theory says 560 us, and ~370 GB/s where 450 GB/s is the peak of an H100's NVLink).

What changes the answer, and how the model captures it (the Scaling Book is J. Austin et
al., "How to Scale Your Model", 2025; docs/cost_vs_scaling_book.md checks its answers):

* **Topology.** :class:`Ring`, :class:`Torus2D`, :class:`Torus3D` link each device to its
  nearest neighbours along each axis (TPU ICI); :class:`FullyConnected` puts every device
  on one switch (NVLink + NVSwitch inside an 8-GPU node).
* **Wraparound.** With the wraparound link a torus axis is a ring, and every piece goes
  both ways round at once, reaching everyone in floor(p/2) hops instead of p-1 (the
  book's Part 3 "Sharding"); without it the algorithm is a line with sweeps from both
  ends (``algorithms.line_all_reduce``), p-1 hops and twice the bandwidth term. An axis
  of size 2 has nothing to wrap around.
* **Latency per hop.** On ICI a hop lasts the larger of its latency and its transfer (the
  book's T_hop = max[T_min, bytes / W]); on a GPU switch the two add, as in NCCL's model.
  :func:`step_time` is the rule.
* **One axis or several.** A collective over several torus axes splits the data into one
  part per axis and runs the per-axis phases in a rotated order for each part, so every
  axis's links are busy at once (the book: the bandwidth grows with the number of axes).
  Exact when the axes have equal sizes and the same wraparound; a few percent optimistic
  otherwise (the parts then reach each axis at different times).
* **Point-to-point.** A permute splits each send over one shortest route per axis it
  crosses, using that many ports (the book's Part 2, Worked Problem 5).
* **Algorithm.** ``algorithm="fastest"`` picks the fastest formula, as NCCL's tuner does: a
  tree wins for tiny messages, a ring for large ones. ``algorithm=None`` (the default) does
  the same, except where a preset carries a fit to published measurements.
* **Measured, not only modelled.** The formulas know no protocol overheads, and real runs
  are slower. The H100 preset therefore carries a :class:`MeasuredFit` per collective,
  fitted to published nccl-tests results on one 8-GPU node (:data:`NCCL_TESTS_H100`): a
  per-call latency plus the bus bytes over the bus bandwidth NCCL achieves. It is what
  ``algorithm=None`` (and so ``estimate_trace``, the roofline and the timelines) uses on a
  GPU switch of that hardware; ``algorithm="ring"`` or ``"tree"`` still give the formulas.

Where simpmd departs from the book on purpose: it keeps the (N-1)/N factor the book drops
wherever the schedule really saves it (one-way rings, lines, switches, odd rings, several
axes at once); on one even ring it sends as the book does and gets the book's V / W_bidi.

Sizes follow simpmd's trace: ``nbytes`` is what ONE device holds before the call (its
shard for an all-gather, its whole array for an all-reduce or reduce-scatter); or give the
book's whole-array V as ``array_nbytes``. Reported bandwidths follow NVIDIA nccl-tests
(doc/PERFORMANCE.md): ``algbw = S / t`` with ``S`` the size nccl-tests reports for that
collective (see :data:`NCCL_TESTS`), and ``busbw = algbw x factor``, which for a
bandwidth-bound ring equals the link bandwidth whatever the group size, so simulated
numbers can sit beside measured ones.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
import math

import numpy as np

from .cluster import Cluster, devices_of, members_by_node, mesh_ids, shape_key
from .hardware import Hardware, MeasuredFit, hardware_preset
from .rows import COLLECTIVES, collective_of  # noqa: F401 (the families, by each row's column)
from .topology import (FullyConnected, GroupAxis, Ring, Torus, Torus2D,  # noqa: F401 (their
                       Torus3D, describe)                       # names, where the formulas were)
from ..machine.devices import platform
from ..api.events import bytes_moved as _bytes_moved


# -- nccl-tests conventions: which size S, which bus-bandwidth factor --------------------
# NVIDIA/nccl-tests, doc/PERFORMANCE.md: algbw = S / t; busbw = algbw * factor, with factor
# 2(n-1)/n for AllReduce, (n-1)/n for ReduceScatter, AllGather and AlltoAll, 1 for
# Broadcast and Reduce; src/sendrecv.cu uses 1 for SendRecv. For ReduceScatter and
# AllGather, S is "the total array" (recvcount*n resp. sendcount*n elements): the input of
# a reduce-scatter, the output of an all-gather. Entries: (S from per-device nbytes and
# group size p, factor from p).

NCCL_TESTS = {
    "all_reduce": (lambda nbytes, p: nbytes, lambda p: 2 * (p - 1) / p),
    "reduce_scatter": (lambda nbytes, p: nbytes, lambda p: (p - 1) / p),
    "all_gather": (lambda nbytes, p: nbytes * p, lambda p: (p - 1) / p),
    "all_to_all": (lambda nbytes, p: nbytes, lambda p: (p - 1) / p),
    "collective_permute": (lambda nbytes, p: nbytes, lambda p: 1.0),   # like SendRecv
    "broadcast": (lambda nbytes, p: nbytes, lambda p: 1.0),
    "reduce": (lambda nbytes, p: nbytes, lambda p: 1.0),
}


def _nccl_entry(op: str):
    return NCCL_TESTS[op] if op in NCCL_TESTS else NCCL_TESTS[collective_of(op)]


def nccl_size(op: str, nbytes: int, group_size: int) -> int:
    """The size S nccl-tests prints for this collective, from the bytes one device holds."""
    return int(_nccl_entry(op)[0](nbytes, group_size))


def busbw_factor(op: str, group_size: int) -> float:
    """nccl-tests' correction from algorithm bandwidth to bus bandwidth."""
    return float(_nccl_entry(op)[1](max(group_size, 1)))



# -- the result -------------------------------------------------------------------------

@dataclass(frozen=True)
class Estimate:
    """The estimated time of one collective, split into its latency and bandwidth parts.

    ``nbytes`` is what one device holds before the call; ``bytes_sent_per_device`` the
    most any one device sends under this algorithm; ``steps`` the hops paid for in latency
    (``latency_s = steps * hop latency``; ``bandwidth_s`` the transfers alone). With
    ``overlap`` (TPU ICI, the Scaling Book's rule) a hop lasts the larger of the two, so
    ``time_s`` is less than their sum; without it (a GPU switch) it is the sum.
    ``algbw`` and ``busbw`` are nccl-tests' numbers. For ``algorithm == "nccl"`` (a
    :class:`MeasuredFit`) the latency is the fit's, one per call (``steps`` is 0), and the
    bytes sent are nccl-tests' bus bytes, S x factor.
    """

    op: str
    algorithm: str
    nbytes: int
    group_size: int
    time_s: float
    latency_s: float
    bandwidth_s: float
    steps: int
    bytes_sent_per_device: float
    hardware: str = ""
    topology: str = ""
    note: str = ""
    overlap: bool = False        # the hop rule: max(latency, transfer) per hop, not the sum

    @property
    def nccl_size(self) -> int:
        return nccl_size(self.op, self.nbytes, self.group_size) if self.op in NCCL_TESTS else 0

    @property
    def algbw(self) -> float:
        """nccl-tests' algorithm bandwidth S / t, bytes/s (0 when nothing moves)."""
        return self.nccl_size / self.time_s if self.time_s > 0 else 0.0

    @property
    def busbw(self) -> float:
        """nccl-tests' bus bandwidth, algbw times the collective's factor, bytes/s."""
        return self.algbw * busbw_factor(self.op, self.group_size) if self.op in NCCL_TESTS else 0.0

    @property
    def bound(self) -> str:
        """Which part dominates: ``'latency'`` or ``'bandwidth'``."""
        return "latency" if self.latency_s > self.bandwidth_s else "bandwidth"

    def __repr__(self):
        where = " on ".join(x for x in (self.hardware, self.topology) if x)
        head = (f"{self.op} of {_bytes(self.nbytes)}/device over {self.group_size} device(s), "
                f"{self.algorithm}{' on ' + where if where else ''}")
        if self.time_s == 0:
            return f"<Estimate {head}: no communication>"
        hops = (f"{self.steps} hops" if self.algorithm != "nccl" else
                "per call, fitted to measurements")
        parts = (f"{_seconds(self.latency_s)} latency ({hops}), "
                 f"{_seconds(self.bandwidth_s)} transfer, the larger per hop" if self.overlap else
                 f"{_seconds(self.latency_s)} latency ({hops}) + "
                 f"{_seconds(self.bandwidth_s)} bandwidth")
        return (f"<Estimate {head}: {_seconds(self.time_s)} = {parts}, {self.bound}-bound; "
                f"sends {_bytes(self.bytes_sent_per_device)}/device; algbw "
                f"{self.algbw / 1e9:.3g} GB/s, busbw {self.busbw / 1e9:.3g} GB/s"
                f"{'; ' + self.note if self.note else ''}>")


def _seconds(t: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.4g} {unit}"
    return f"{t / 1e-9:.4g} ns"


def _bytes(n: float) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:.4g} B"


# -- the formulas -----------------------------------------------------------------------
# A _Cost lists steps. Every formula below takes the group's axes (list of GroupAxis) and
# the per-device bytes, and says how many steps it takes, how many hops each step
# crosses, and how long the busiest link direction is busy per step. The hop rule of the
# topology (see step_time) then turns steps into seconds.

@dataclass
class _Cost:
    phases: tuple = ()            # (count, hops, transfer_s): `count` alike steps
    sent: float = 0.0             # most bytes one device sends

    def __add__(self, other):
        return _Cost(self.phases + other.phases, self.sent + other.sent)

    @property
    def steps(self) -> int:
        """Hops paid for in latency, over all steps."""
        return sum(count * hops for count, hops, _ in self.phases)

    @property
    def bandwidth_s(self) -> float:
        return sum(count * transfer for count, _, transfer in self.phases)

    def time(self, step_time) -> float:
        return sum(count * step_time(hops, transfer) for count, hops, transfer in self.phases)


def step_time(hops: int, transfer_s: float, latency: float, overlap: bool) -> float:
    """Seconds of one step that crosses ``hops`` links and keeps the busiest link busy
    ``transfer_s``.

    ``overlap=True`` is the Scaling Book's rule for ICI (Part 3 "Sharding", "A note on ICI
    latency": T_hop = max[T_min, bytes / W]): a hop lasts the larger of its latency and
    its transfer, and a route of several hops pays the latency of the others on top
    (Part 2 "TPUs", Worked Problem 5: "the first byte will arrive in about 6us and the
    total transfer will take 188 + 6 = 194us"). ``overlap=False`` is the plain alpha-beta
    sum, hops x latency + transfer, the form of NCCL's tuning model (NVIDIA/nccl
    src/graph/tuning.cc: time = latency + size / bandwidth) used for GPU switches.
    """
    if hops == 0:
        return transfer_s
    if overlap:
        return (hops - 1) * latency + max(latency, transfer_s)
    return hops * latency + transfer_s


def _one_way_phase(ax: GroupAxis, piece: float) -> _Cost:
    """q-1 steps, one piece per link direction per step (a one-way ring, a line, a switch)."""
    q = ax.size
    return _Cost(((q - 1, 1, piece / ax.bandwidth),), 0.0)


def _two_way_phases(ax: GroupAxis, piece: float, balanced: bool = False) -> _Cost:
    """The Scaling Book's bidirectional ring (Part 3 "Sharding", "How is an AllGather
    actually performed?"): every piece goes both ways round at once, so it reaches every
    device in floor(q/2) hops instead of q-1, each hop carrying one piece per link
    direction. On an even ring one way is a hop longer than the other, so the time is
    q/2 pieces over one link: exactly the book's V / W_bidi for one axis.

    ``balanced`` splits the piece for the device half-way round, half each way, so both
    directions carry (q-1)/2 pieces: the (q-1)/q factor of a one-way ring comes back.
    simpmd does this for several axes at once, where the book states only the total,
    V / (W_bidi x n_axes), which the unbalanced ring would miss by up to 25% on 4x4.
    """
    q = ax.size
    if balanced and q % 2 == 0:
        return _Cost(((q // 2 - 1, 1, piece / ax.bandwidth), (1, 1, piece / 2 / ax.bandwidth)), 0.0)
    return _Cost(((q // 2, 1, piece / ax.bandwidth),), 0.0)


def _reduce_scatter_phase(ax: GroupAxis, data: float, bidirectional: bool,
                          balanced: bool = False) -> _Cost:
    """Reduce-scatter ``data`` bytes per device along one axis; each device sends (q-1)/q of it."""
    q = ax.size
    if q == 1:
        return _Cost()
    piece = data / q
    steps = (_two_way_phases(ax, piece, balanced) if bidirectional and ax.wraps and not ax.switch
             else _one_way_phase(ax, piece))
    return replace(steps, sent=(q - 1) * piece)


def _all_gather_phase(ax: GroupAxis, block: float, bidirectional: bool,
                      balanced: bool = False) -> _Cost:
    """All-gather along one axis, each device starting with ``block`` bytes."""
    q = ax.size
    if q == 1:
        return _Cost()
    if bidirectional and ax.wraps and not ax.switch:
        return replace(_two_way_phases(ax, block, balanced), sent=(q - 1) * block)
    # On a line the middle devices forward pieces both ways: q+1 blocks instead of q-1.
    forwarded = q + 1 if (not ax.wraps and not ax.switch and q > 2) else q - 1
    return replace(_one_way_phase(ax, block), sent=forwarded * block)


def _as_one_ring(axes: list) -> GroupAxis:
    """Several torus axes walked as one ring (a snake through the grid).

    A closed snake (Hamiltonian cycle) exists when some axis has even size and every
    axis has at least 2; otherwise the snake is an open line. Its links are those of the
    slowest axis.
    """
    if len(axes) == 1:
        return axes[0]
    p = math.prod(a.size for a in axes)
    closed = p % 2 == 0 and all(a.size >= 2 for a in axes)
    return GroupAxis(p, min(a.bandwidth for a in axes), closed)


def _ring_all_reduce(axes, nbytes, bidirectional):
    ax = _as_one_ring(axes)
    return (_reduce_scatter_phase(ax, nbytes, bidirectional)
            + _all_gather_phase(ax, nbytes / ax.size, bidirectional))


def _rotations(axes):
    """One order of the axes per part of the data: (a0, a1, ...), (a1, a2, ..., a0), ..."""
    return [axes[k:] + axes[:k] for k in range(len(axes))]


def _torus(axes, nbytes, timing, collective):
    """The multi-axis scheme: one part of the data per rotation of the axes, all at once.

    Each part reduce-scatters along its axes in turn (the data shrinking by each axis's
    size), and/or all-gathers (back in reverse order, for an all-reduce). The slowest part
    sets the time; a device sends for every part.
    """
    per_order = []
    balanced = len(axes) > 1
    for order in _rotations(axes):
        cost, size = _Cost(), nbytes / len(axes)
        if collective in ("reduce_scatter", "all_reduce"):
            for ax in order:
                cost = cost + _reduce_scatter_phase(ax, size, True, balanced)
                size /= ax.size
        if collective in ("all_gather", "all_reduce"):
            for ax in (reversed(order) if collective == "all_reduce" else order):
                cost = cost + _all_gather_phase(ax, size, True, balanced)
                size *= ax.size
        per_order.append(cost)
    worst = max(per_order, key=lambda c: c.time(timing))
    return replace(worst, sent=sum(c.sent for c in per_order))


def _hops(axes, a: int, b: int) -> int:
    """Hops between group positions ``a`` and ``b`` (row-major over the group's axes)."""
    if a == b:
        return 0
    if any(ax.switch for ax in axes):
        return 1
    ca = np.unravel_index(a, [ax.size for ax in axes])
    cb = np.unravel_index(b, [ax.size for ax in axes])
    total = 0
    for ax, x, y in zip(axes, ca, cb):
        d = abs(int(x) - int(y))
        total += min(d, ax.size - d) if ax.wraps else d
    return total


def _tree_all_reduce(axes, nbytes):
    """Binomial tree: ceil(log2 p) levels up, as many down, each sending the whole buffer."""
    p = math.prod(ax.size for ax in axes)
    bandwidth = min(ax.bandwidth for ax in axes)
    cost, k = _Cost(), 0
    while (1 << k) < p:
        half = 1 << k
        hops = max(_hops(axes, i, i - half) for i in range(half, p, 2 * half))
        cost = cost + _Cost(((2, hops, nbytes / bandwidth),), 0.0)
        k += 1
    return replace(cost, sent=k * nbytes)        # the root sends to k children on the way down


def _pairs_per_link(q: int, wraps: bool) -> float:
    """All-to-all along one axis of q devices: pieces on the busiest link direction.

    Shortest paths on a ring spread the q * sum(min(d, q-d)) piece-hops over 2q link
    directions; on a line the middle link carries floor(q/2) * ceil(q/2) pieces each way.
    """
    if wraps:
        return sum(min(d, q - d) for d in range(1, q)) / 2
    return (q // 2) * ((q + 1) // 2)


def _all_to_all(axes, nbytes):
    """Every device sends nbytes/p to each other device along shortest paths.

    With dimension-ordered routing on a torus, a link of axis a carries p/q_a times what
    a 1-D all-to-all over that axis would put on it; on a switch each device just sends
    (p-1)/p of its buffer through its port.
    """
    p = math.prod(ax.size for ax in axes)
    if axes[0].switch:
        return _Cost(((1, 1, (p - 1) / p * nbytes / axes[0].bandwidth),), (p - 1) / p * nbytes)
    bandwidth_s = max(_pairs_per_link(ax.size, ax.wraps) * nbytes / (ax.size * ax.bandwidth)
                      for ax in axes)
    diameter = sum(ax.size // 2 if ax.wraps else ax.size - 1 for ax in axes)
    return _Cost(((1, diameter, bandwidth_s),), (p - 1) / p * nbytes)


def _route(axes, a: int, b: int, order=None) -> list:
    """The directed links from group position a to b: axis by axis (in ``order``, by
    default the axes' own), the short way round."""
    sizes = [ax.size for ax in axes]
    here = list(np.unravel_index(a, sizes))
    there = np.unravel_index(b, sizes)
    links = []
    for i in (range(len(axes)) if order is None else order):
        ax = axes[i]
        d = (int(there[i]) - int(here[i])) % ax.size if ax.wraps else int(there[i]) - int(here[i])
        step = 1
        if ax.wraps and d > ax.size - d:
            d, step = ax.size - d, -1
        elif d < 0:
            d, step = -d, -1
        for _ in range(d):
            links.append((i, tuple(int(c) for c in here), step))
            here[i] = (here[i] + step) % ax.size
    return links


def _routes(axes, a: int, b: int) -> list:
    """Edge-disjoint shortest routes from a to b: one per axis the send must cross.

    The Scaling Book splits a point-to-point send across them (Part 2 "TPUs", Worked
    Problem 5: on a v5e 4x4, TPU{0,0} to TPU{3,3} sends "half the array right and half
    down" at 2 x 4.5e10 bytes/s). Route k crosses the axes in the order rotated by k, so
    each leaves the source through a different port and enters the destination through a
    different one.
    """
    ca = np.unravel_index(a, [ax.size for ax in axes])
    cb = np.unravel_index(b, [ax.size for ax in axes])
    moving = [i for i in range(len(axes)) if int(ca[i]) != int(cb[i])]
    if not moving:
        return []
    return [_route(axes, a, b, moving[k:] + moving[:k]) for k in range(len(moving))]


def _collective_permute(axes, nbytes, perm):
    """Each pair sends nbytes, split over its disjoint shortest routes; the busiest link
    and the longest route decide. On a switch every pair is one hop through the ports."""
    pairs = [(int(s), int(d)) for s, d in perm if int(s) != int(d)]
    if not pairs:
        return _Cost()
    sends = max(sum(1 for s, _ in pairs if s == x) for x, _ in pairs)
    if axes[0].switch:
        into = max(sum(1 for _, d in pairs if d == y) for _, y in pairs)
        return _Cost(((1, 1, max(sends, into) * nbytes / axes[0].bandwidth),), sends * nbytes)
    load: dict = {}
    longest = 0
    for s, d in pairs:
        routes = _routes(axes, s, d)
        for route in routes:
            longest = max(longest, len(route))
            for link in route:
                load[link] = load.get(link, 0.0) + nbytes / len(routes)
    bandwidth_s = max(b / axes[link[0]].bandwidth for link, b in load.items())
    return _Cost(((1, longest, bandwidth_s),), sends * nbytes)


# One table per concern, keyed by collective: the algorithms each collective can use.
# Each entry: name -> f(axes, nbytes, timing, perm) -> _Cost, where timing(hops, transfer_s)
# is the topology's step_time.
COST_MODELS = {
    "all_reduce": {
        "ring": lambda axes, n, timing, perm: _ring_all_reduce(axes, n, False),
        "bidirectional_ring": lambda axes, n, timing, perm: _ring_all_reduce(axes, n, True),
        "torus": lambda axes, n, timing, perm: _torus(axes, n, timing, "all_reduce"),
        "tree": lambda axes, n, timing, perm: _tree_all_reduce(axes, n),
    },
    "all_gather": {
        "ring": lambda axes, n, timing, perm: _all_gather_phase(_as_one_ring(axes), n, False),
        "bidirectional_ring": lambda axes, n, timing, perm: _all_gather_phase(_as_one_ring(axes), n, True),
        "torus": lambda axes, n, timing, perm: _torus(axes, n, timing, "all_gather"),
    },
    "reduce_scatter": {
        "ring": lambda axes, n, timing, perm: _reduce_scatter_phase(_as_one_ring(axes), n, False),
        "bidirectional_ring": lambda axes, n, timing, perm: _reduce_scatter_phase(_as_one_ring(axes), n, True),
        "torus": lambda axes, n, timing, perm: _torus(axes, n, timing, "reduce_scatter"),
    },
    "all_to_all": {
        "direct": lambda axes, n, timing, perm: _all_to_all(axes, n),
    },
    "collective_permute": {
        "direct": lambda axes, n, timing, perm: _collective_permute(axes, n, perm),
    },
}


def _measured_estimate(collective, nbytes, p, fit: MeasuredFit, hardware="", topology="",
                       note="") -> Estimate:
    """The estimate a :class:`MeasuredFit` gives: its latency plus nccl-tests' bus bytes
    (S x factor, what busbw counts) over the fitted bus bandwidth."""
    bus_bytes = nccl_size(collective, nbytes, p) * busbw_factor(collective, p)
    transfer = bus_bytes / fit.busbw
    return Estimate(collective, "nccl", int(nbytes), p, fit.latency_s + transfer, fit.latency_s,
                    transfer, 0, bus_bytes, hardware, topology, note)


def _estimate_on(collective, nbytes, axes, alpha, algorithm=None, perm=None,
                 hardware="", topology="", note="", overlap=False, measured=None) -> Estimate:
    """The estimate for a group occupying ``axes``; the common core of the public entry points.

    ``measured`` (collective -> MeasuredFit, from the topology) answers ``algorithm=None``
    and ``"nccl"`` for a group on a switch; ``"fastest"`` and the named formulas ignore it.
    """
    p = math.prod(ax.size for ax in axes) if axes else 1
    if collective is None or p == 1:
        return Estimate(collective or "none", "none", int(nbytes), p, 0.0, 0.0, 0.0, 0, 0.0,
                        hardware, topology, note)
    models = COST_MODELS[collective]
    fit = (measured or {}).get(collective) if all(ax.switch for ax in axes) else None
    if fit is not None and algorithm in (None, "nccl"):
        return _measured_estimate(collective, nbytes, p, fit, hardware, topology, note)
    if collective == "collective_permute" and perm is None:
        perm = [(i, (i + 1) % p) for i in range(p)]     # the usual ring shift
    if algorithm in (None, "fastest"):
        candidates = list(models)
    elif algorithm in models:
        candidates = [algorithm]
    else:
        fitted = " or 'nccl' (the fit to measurements)" if fit is not None else ""
        raise ValueError(f"{collective} has no algorithm {algorithm!r} here; choose one of "
                         f"{sorted(models)}{fitted}, 'fastest' for the fastest of those, or "
                         f"None for the hardware's default")
    def timing(hops, transfer_s):
        return step_time(hops, transfer_s, alpha, overlap)

    best = None
    for name in candidates:
        c = models[name](axes, float(nbytes), timing, perm)
        e = Estimate(collective, name, int(nbytes), p, c.time(timing), c.steps * alpha,
                     c.bandwidth_s, c.steps, c.sent, hardware, topology, note, overlap)
        # on a tie (latency-bound), the algorithm that moves fewer bytes
        if best is None or (e.time_s, e.bandwidth_s) < (best.time_s, best.bandwidth_s):
            best = e
    return best



def _resolve_topology(hardware: Hardware, topology, group_size):
    if topology is None:
        return hardware.topology(group_size if group_size is not None else 1)
    if getattr(topology, "kind", None) in ("torus", "switch", "cluster"):
        return topology
    return hardware.topology(topology)          # a device count or a shape


def _platform(trace=None):
    """The simulated platform a trace ran on (its own, if it carries one, else the current)."""
    plat = getattr(trace, "platform", None)
    if plat is None:
        plat = platform()
    return plat


def _platform_topology(hardware: Hardware, plat, count: int):
    """The wiring ``set_device_count(..., topology=...)`` chose, on this hardware.

    A shape of two or more axes is used as given; the default one-axis shape stands for
    "no wiring chosen", and becomes the hardware's standard slice of ``count`` devices.
    """
    shape = tuple(getattr(plat, "topology", ()) or ())
    if len(shape) > 1 and math.prod(shape) >= count:
        return hardware.topology(shape)
    return hardware.topology(count)


def _hardware_of(hardware, trace=None) -> Hardware:
    return hardware_preset(_platform(trace).hardware if hardware is None else hardware)


def _group_on(topology, devices):
    """The topology axes a group of device ids spans, and a note when it spans none cleanly."""
    if len(devices) < 2:
        return [], ""
    if None in devices or max(devices) >= topology.size:
        return ([GroupAxis(len(devices), _link_of(topology), False)],
                "devices not on the topology: costed as a line")
    axes = topology.group_axes_of(devices)
    if axes is None:
        return [GroupAxis(len(devices), _link_of(topology), False)], "irregular group: costed as a line"
    return axes, ""


def _per_device_bytes(collective, array_nbytes, p) -> float:
    """The Scaling Book's V (bytes of the whole array) as the bytes one device holds.

    AllGather: V is the gathered result, so each device starts with V/p. AllToAll and a
    permute: V is the array sharded over the group, V/p per device. AllReduce and
    ReduceScatter: V is the (unreduced) array each device holds in full.
    """
    if collective in ("all_gather", "all_to_all", "collective_permute"):
        return array_nbytes / p
    return float(array_nbytes)


def _mesh_group(mesh, axis_name, hardware, topology):
    """(topology, group axes, group size, device ids, note) for a collective over named mesh axes.

    ``mesh`` is a dict of axis sizes, the book's ``Mesh({'X': 8, 'Y': 4})``, laid out as the
    physical slice of that shape; or a ``simpmd.Mesh``, whose devices sit where the
    platform (or ``topology``) puts them.
    """
    names = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name or ())
    if isinstance(mesh, dict):
        mesh_names, sizes = list(mesh), tuple(int(v) for v in mesh.values())
    else:
        mesh_names, sizes = list(mesh.axis_names), tuple(np.shape(mesh.devices))
    unknown = [n for n in names if n not in mesh_names]
    if not names or unknown:
        raise ValueError(f"axis_name {axis_name!r} is not an axis of the mesh; its axes are "
                         f"{dict(zip(mesh_names, sizes))}: name one or a tuple of them")
    where = [mesh_names.index(n) for n in names]
    group_size = math.prod(sizes[i] for i in where)
    if isinstance(mesh, dict):
        topo = _resolve_topology(hardware, sizes if topology is None else topology, None)
        if topo.kind == "cluster":         # the mesh laid over the nodes in device order
                return _mesh_members(mesh_ids(sizes), where, sizes, topo, group_size)
        if tuple(topo.dims) != sizes and topo.kind != "switch":
            raise ValueError(f"the mesh {dict(zip(mesh_names, sizes))} does not match the "
                             f"topology {topo}; give the mesh the slice's shape, or pass a "
                             f"simpmd.Mesh built on the platform's devices")
        if topo.kind == "switch":
            return topo, topo.group_axes(group_size), group_size, None, ""
        return topo, topo.group_axes(group_size, tuple(where)), group_size, None, ""
    ids = np.vectorize(lambda d: int(getattr(d, "id", d)), otypes=[int])(mesh.devices)
    topo = (_resolve_topology(hardware, topology, None) if topology is not None
            else _platform_topology(hardware, _platform(), int(ids.max()) + 1))
    return _mesh_members(ids, where, sizes, topo, group_size)


def _mesh_members(ids, where, sizes, topo, group_size):
    """(topology, group axes, size, device ids, note) of the first group over mesh axes
    ``where`` of the device ids ``ids`` (the members in the order of the names given:
    position = row-major over those axes). On a cluster the axes are left to
    :func:`cluster_estimate` (None)."""
    index = tuple(slice(None) if i in where else 0 for i in range(len(sizes)))
    kept = [i for i in range(len(sizes)) if i in where]
    group = np.transpose(ids[index], [kept.index(i) for i in where]).reshape(-1).tolist()
    if topo.kind == "cluster":
        return topo, None, group_size, group, ""
    axes, note = _group_on(topo, group)
    return topo, axes, group_size, group, note


def estimate(op: str, nbytes: float | None = None, group_size: int | None = None,
             hardware=None, topology=None, algorithm: str | None = None, axes=None,
             perm=None, *, array_nbytes: float | None = None, mesh=None,
             axis_name=None, devices=None) -> Estimate:
    """Estimated time of one collective over ``group_size`` devices.

    ``op`` is a collective (``'all_reduce'``, ``'all_gather'``, ``'reduce_scatter'``,
    ``'all_to_all'``, ``'collective_permute'``) or a ``jax.lax`` name (``'psum'``, ...).
    Size: ``nbytes`` is what ONE device holds before the call, as simpmd's trace logs it;
    or ``array_nbytes`` the bytes of the whole array, as the Scaling Book counts V (the
    gathered result of an all-gather, the unreduced array of an all-reduce or a
    reduce-scatter, the sharded array of an all-to-all or a permute).
    ``hardware`` is a preset name or alias (``"TPU v4p"``, ``"v5e"``, ``"H100"``) or a
    :class:`Hardware`, by default the one ``simpmd.set_device_count`` chose.
    ``topology`` a :class:`Torus`/:class:`FullyConnected`, a shape, or None for the
    hardware's standard slice of ``group_size`` devices. ``axes`` says which torus axes
    the group spans (default: all of them if the group fills the topology); or name them:
    ``mesh`` (a dict such as the book's ``{'X': 8, 'Y': 4}``, laid out as a slice of that
    shape, or a ``simpmd.Mesh``) and ``axis_name`` (one name or a tuple, e.g. ``("X",
    "Y")`` for a gather over both).
    ``algorithm`` names one of ``COST_MODELS[collective]``; ``"fastest"`` picks the fastest
    of them; None (the default) does the same, except on a preset with a fit to published
    measurements (the H100's all-reduce, all-gather and reduce-scatter, see
    :class:`MeasuredFit`), where it gives the fit, as ``"nccl"`` does.
    ``perm`` (collective permute) lists (source, destination) group positions; default a
    shift by one. For example ``estimate("psum", 2**20, 8, hardware="H100")`` is a 1 MiB
    all-reduce inside one 8-GPU node, and ``estimate("all_gather", array_nbytes=2**23,
    hardware="v5e", mesh={"X": 8, "Y": 4}, axis_name="Y")`` gathers an 8 MiB array along
    the 4-long axis of a v5e 8x4 slice.

    **Across nodes.** A group larger than one GPU node (``node_size``, 8 on the DGX-style
    presets) or one TPU pod spans several, joined by InfiniBand or DCN (a
    :class:`~simpmd.cost.cluster.Cluster`; the preset's ``scale_out_bandwidth``): see
    :func:`cluster_estimate`. ``devices`` (ids on the topology, node-major: device d sits
    in node d // node_size) says which devices form the group, e.g. ``devices=range(0, 64,
    8)``, one GPU in each of 8 nodes; by default the first ``group_size`` devices, whole
    nodes first. ``estimate("psum", 2**30, 64, hardware="H100")`` all-reduces 1 GiB over
    8 DGX H100 nodes.
    """
    hw = _hardware_of(hardware)
    collective = collective_of(op)
    topo, group, group_size, devices, note = _group_of(hw, group_size, topology, axes, mesh,
                                                       axis_name, devices)
    if (nbytes is None) == (array_nbytes is None):
        raise ValueError("give the size once: nbytes= (what one device holds) or array_nbytes= "
                         "(the whole array, as the Scaling Book counts it)")
    if nbytes is None:
        nbytes = _per_device_bytes(collective, array_nbytes, max(int(group_size), 1))
    if topo.kind == "cluster":
        e = cluster_estimate(collective, nbytes, devices, topo, algorithm, perm,
                             _label(hw, topology, topo), note)
        return e if collective else replace(e, op=op)
    if perm is not None and devices is not None and not note and topo.kind != "switch":
        where = _positions(group, topo, devices)
        perm = [(where[s], where[d]) for s, d in perm]
    e = _estimate_on(collective, nbytes, group, topo.hop_latency, algorithm, perm,
                     _label(hw, topology, topo), describe(topo), note, topo.overlap,
                     getattr(topo, "measured", None))
    return e if collective else replace(e, op=op)


def _group_of(hw, group_size, topology, axes, mesh, axis_name, devices):
    """(topology, group axes, size, device ids, note) from :func:`estimate`'s ways of naming
    a group: ``devices``, ``mesh`` with ``axis_name``, or ``group_size`` with ``axes``. On a
    cluster the axes are None and the device ids say which nodes the group spans."""
    if devices is not None:
        if mesh is not None or axes is not None:
            raise ValueError("give the group once: devices=, or mesh= and axis_name=, or "
                             "group_size= and axes=")
        devices = [int(d) for d in devices]
        if group_size is not None and group_size != len(devices):
            raise ValueError(f"group_size={group_size} but {len(devices)} devices are named")
        topo = _resolve_topology(hw, topology if topology is not None else max(devices) + 1, None)
        group, note = (None, "") if topo.kind == "cluster" else _group_on(topo, devices)
        return topo, group, len(devices), devices, note
    if mesh is not None:
        if axes is not None or group_size is not None:
            raise ValueError("give either mesh= and axis_name=, or group_size= and axes=, not both")
        return _mesh_group(mesh, axis_name, hw, topology)
    if axis_name is not None:
        raise ValueError(f"axis_name={axis_name!r} needs mesh=: the mesh whose axes it names")
    topo = _resolve_topology(hw, topology, group_size)
    group_size = topo.size if group_size is None else group_size
    if topo.kind == "cluster":
        return topo, None, group_size, devices_of(int(group_size), topo), ""
    return topo, topo.group_axes(int(group_size), axes), group_size, None, ""


def _label(hardware: Hardware, asked, topology) -> str:
    """The hardware name to print: a topology passed in speaks for itself."""
    return topology.name if getattr(asked, "kind", None) else hardware.name


def time_run(run, topology, hardware: str = "") -> Estimate:
    """The time of a message-level run (``simpmd.algorithms``) replayed on a topology.

    Each step crosses the longest route's hops and keeps the busiest link direction
    (torus, routed axis by axis the short way) or the busiest switch port busy for its
    bytes over its bandwidth; :func:`step_time` combines the two by the topology's rule. Device ids of the run are the
    topology's device ids. This is how the tests check that the closed forms of
    :func:`estimate` are what the simulated algorithms actually cost.
    """
    if topology.kind == "cluster":
        raise ValueError("time_run replays messages on one node's topology (a Torus or a "
                         "FullyConnected); for several nodes use estimate(..., devices=...)")
    latency_s = bandwidth_s = time_s = 0.0
    steps = 0
    for step in run.steps:
        if not step.messages:
            continue
        if topology.kind == "switch":
            out: dict = {}
            into: dict = {}
            for m in step.messages:
                out[m.src] = out.get(m.src, 0) + m.nbytes
                into[m.dst] = into.get(m.dst, 0) + m.nbytes
            hops, busiest = 1, max(max(out.values()), max(into.values())) / topology.port_bandwidth
        else:
            axes = [GroupAxis(d, topology.axis_bandwidth, topology.wraps(a), axis=a)
                    for a, d in enumerate(topology.dims)]
            load: dict = {}
            hops = 0
            for m in step.messages:
                route = _route(axes, m.src, m.dst)
                hops = max(hops, len(route))
                for link in route:
                    load[link] = load.get(link, 0) + m.nbytes
            busiest = max(load.values()) / topology.axis_bandwidth
        steps += hops
        latency_s += hops * topology.hop_latency
        bandwidth_s += busiest
        time_s += step_time(hops, busiest, topology.hop_latency, topology.overlap)
    p = run.num_devices
    nbytes = int(np.asarray(run.inputs[0]).nbytes)
    return Estimate(run.collective, run.algorithm, nbytes, p, time_s, latency_s,
                    bandwidth_s, steps, float(run.bytes_sent.max(initial=0)), hardware,
                    describe(topology), "replayed message by message", topology.overlap)


# -- a whole trace ----------------------------------------------------------------------

@dataclass(frozen=True)
class CollectiveCost:
    """The estimate for one collective instance (one group's rendezvous) of a trace."""

    step: int
    call: tuple                  # (nesting depth, k-th collective call of the program)
    op: str                      # the jax.lax name, e.g. 'psum'
    axes: tuple
    group: tuple
    source: str
    estimate: Estimate
    bytes_sent: tuple            # per member, as the engine logged them
    bytes_received: tuple

    @property
    def time_s(self) -> float:
        return self.estimate.time_s


@dataclass
class CallEstimate:
    """One collective call of a columnar trace, every group of it at once: its ``groups``
    instances cost ``times`` seconds each (in the trace's order), the slowest
    ``time_s`` (its ``estimate``); each member sends ``bytes_sent`` (the most any does)."""

    step: int
    call: tuple
    op: str
    axes: tuple
    source: str
    phase: str
    estimate: Estimate
    times: np.ndarray
    bytes_sent: int
    record: object = None        # the log's record (how a timeline finds its groups)
    set_times: list = field(default_factory=list)     # per group set of the record

    @property
    def groups(self) -> int:
        return len(self.times)

    @property
    def time_s(self) -> float:
        return float(self.times.max()) if len(self.times) else 0.0


class _Instances(Sequence):
    """The instances of a columnar trace's calls, as CollectiveCosts made when read."""

    def __init__(self, calls):
        self._calls = calls
        self._ends = np.cumsum([c.groups for c in calls])

    def __len__(self):
        return int(self._ends[-1]) if len(self._ends) else 0

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(i)
        n = int(np.searchsorted(self._ends, i, side="right"))
        c, k = self._calls[n], i - (int(self._ends[n - 1]) if n else 0)
        r = c.record
        rows = [row for members in r.fields["sets"] for row in members]
        ids = _ids_of(r.run)
        est = c.estimate if c.times[k] == c.time_s else replace(c.estimate, time_s=float(c.times[k]))
        moved = _log_bytes(r, len(rows[k]))
        return CollectiveCost(c.step + k, c.call, c.op, c.axes, tuple(int(ids[j]) for j in rows[k]),
                              c.source, est, tuple(moved(p)[0] for p in range(len(rows[k]))),
                              tuple(moved(p)[1] for p in range(len(rows[k]))))


@dataclass
class TraceEstimate:
    """Every collective of a run with its estimated time, and the total.

    ``collectives`` holds one :class:`CollectiveCost` per instance; ``calls`` one
    :class:`CallEstimate` per call (all its groups). Instances of the same call
    (different groups, e.g. one per row) run at the same time, and calls run one after
    another, so ``total_time_s`` sums, over calls, the slowest instance of each.
    A trace of thousands of devices is estimated call by call, once per shape of group
    (groups that are translates of each other on the torus cost the same), and its
    instances are written out only when read.
    """

    hardware: str
    topology: str
    collectives: Sequence = field(default_factory=list)
    columnar: list = None

    @property
    def calls(self) -> list:
        if self.columnar is not None:
            return self.columnar
        out = []
        for group in self.per_call():
            first = group[0]
            slowest = max(group, key=lambda c: c.time_s)
            out.append(CallEstimate(first.step, first.call, first.op, first.axes, first.source,
                                    "", slowest.estimate, np.array([c.time_s for c in group]),
                                    max(max(c.bytes_sent) for c in group)))
        return out

    def per_call(self) -> list:
        """Lists of the instances of each call, in program order."""
        calls: dict = {}
        for c in self.collectives:
            calls.setdefault(c.call, []).append(c)
        return list(calls.values())

    @property
    def total_time_s(self) -> float:
        if self.columnar is not None:
            return float(sum(c.time_s for c in self.columnar))
        return sum(max(c.time_s for c in call) for call in self.per_call())

    def by_axes(self) -> dict:
        """Per tuple of mesh axes: how many calls, the seconds they take (the slowest group
        of each, summed) and the bytes each device sends over them."""
        out: dict = {}
        for c in self.calls:
            row = out.setdefault(c.axes, {"calls": 0, "seconds": 0.0, "bytes_sent": 0})
            row["calls"] += 1
            row["seconds"] += c.time_s
            row["bytes_sent"] += c.bytes_sent
        return out

    def __len__(self):
        return len(self.collectives)

    def __iter__(self):
        return iter(self.collectives)

    def __getitem__(self, i):
        return self.collectives[i]

    def __str__(self, most: int = 64):
        lines = [f"Estimated on {self.hardware} ({self.topology}): {len(self.collectives)} "
                 f"collective(s), {_seconds(self.total_time_s) if self.total_time_s else '0 s'} in all"]
        header = ("step", "op", "axes", "group", "per device", "algorithm", "time", "bound",
                  "busbw GB/s")
        rows = []
        for c in self.collectives[:most]:
            e = c.estimate
            rows.append((str(c.step), c.op, ",".join(map(str, c.axes)), _group_text(c.group),
                         _bytes(e.nbytes), e.algorithm,
                         _seconds(e.time_s) if e.time_s else "0", e.bound if e.time_s else "",
                         f"{e.busbw / 1e9:.3g}" if e.time_s else ""))
        widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h)
                  for i, h in enumerate(header)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        if len(self.collectives) > most:
            lines.append(f"... {len(self.collectives) - most} more; .calls has one row per call "
                         f"({len(self.calls)}), .by_axes() the totals per mesh axis")
        return "\n".join(lines)

    def __repr__(self):
        return (f"<TraceEstimate: {len(self.collectives)} collective(s) on {self.hardware}, "
                f"{_seconds(self.total_time_s) if self.total_time_s else '0 s'} in all>")


def _group_text(group) -> str:
    ids = list(group)
    if len(ids) > 6:
        return ",".join(map(str, ids[:4])) + f",... ({len(ids)})"
    return ",".join(map(str, ids))


def _member_device(event):
    if event.device is not None:
        return int(event.device)
    return int(event.devices[0]) if event.devices else None


def _positions(axes, topology, devices) -> list:
    """Each device's row-major position within the group's axes."""
    sizes = [ax.size for ax in axes]
    out = []
    for d in devices:
        c = topology.coords(d)
        out.append(int(np.ravel_multi_index([(c[ax.axis] - ax.offset) // ax.stride for ax in axes],
                                            sizes)))
    return out


def _perm_of(event) -> list:
    """The (source, destination) member pairs of a permute (lax.pshuffle binds one too)."""
    return _pairs(event.op, event.params)


def _pairs(op, params) -> list:
    return [(int(s), int(d)) for s, d in params.get("perm", ())]


def _estimate_group(topo, devices, collective, nbytes, pairs, label):
    """The estimate of one group (its device ids, in member order) on ``topo``."""
    if topo.kind == "cluster":
        return cluster_estimate(collective, nbytes, devices, topo, None, pairs or None, label)
    axes, note = _group_on(topo, devices)
    perm = None
    if collective == "collective_permute":
        if note or topo.kind == "switch":
            perm = pairs
        else:
            where = _positions(axes, topo, devices)
            perm = [(where[s], where[d]) for s, d in pairs]
    return _estimate_on(collective, nbytes, axes, topo.hop_latency, None, perm, label,
                        describe(topo), note, topo.overlap, getattr(topo, "measured", None))


# -- across nodes -----------------------------------------------------------------------
# A collective whose group spans nodes (a Cluster's: simpmd/cost/cluster.py). On GPU nodes it
# is costed as NCCL runs it, with the structure and constants of NCCL's own tuning model
# (NVIDIA/nccl src/graph/tuning.cc, read at commit 5067397, June 2026), and the fastest
# (algorithm, protocol) is taken, as NCCL's tuner does:
#
# * **ring** (all-reduce, all-gather, reduce-scatter; NCCL has no tree for the last two): one
#   ring per channel through all p = g x m devices (g of the group in each of m nodes). Every
#   ring enters and leaves each node once, and the channels spread over the g adapters of the
#   group's GPUs (DGX rails: one adapter per GPU), so the node's g adapters carry the group's
#   traffic together while NVLink carries the hops inside: nccl-tests' bus bandwidth is
#   min(NVLink's ring rate, g x adapter x the fraction NCCL reaches). Its latency is NCCL's:
#   a base, plus a step per hop, the (m-1) hops across nodes (2(m-1) for an all-reduce) at the
#   network's step latency and the others at NVLink's; an all-reduce across nodes pays its
#   latency 1.4 times (the "plateau effect of ring" in ncclTopoGetAlgoTime).
# * **tree** (all-reduce only): NCCL's double binary tree across nodes, a chain inside:
#   latency 2((g-1) NVLink steps + floor(log2 m) network steps). Its bandwidth is 0.92 of the
#   ring's on two nodes (tuning.cc: busBw * .92) and TREE_BANDWIDTH of it on more.
# * **nvls_tree** (all-reduce, on nodes whose switch reduces, NVLS: Hopper and later, more than
#   4 GPUs of the node in the group): reduce inside the node in the NVSwitch, a tree across
#   nodes, broadcast back; pipelined, so the slower of the two sets the rate, and on two nodes
#   each adapter carries half what a ring's does (tuning.cc: "Handle 2 node case of
#   NVLSTree", interBw * 2).
# * protocols: Simple (full bandwidth, long steps) and LL (half the bandwidth of a ring, a
#   3.8th of a tree's, at most LL_MAX_BUSBW, short steps): small messages take LL, large ones
#   Simple. LL128 (92% of the bandwidth with short steps in NCCL's model) is left out: the
#   measured runs of 16-256 MiB are slower than even Simple's model (docs/benchmarks.md).
#
# Groups of one mesh that cross nodes at once each use their own GPUs' adapters (rails), so
# they do not share one; Cluster.scale_out_bandwidth is a device's share of its node's
# adapters when every device sends at once (cluster.py). An all-to-all and a permute across
# nodes keep the hierarchical and direct forms below, as do TPU slices over DCN (XLA's
# multislice scheme: inside each slice, then across, then inside again).

# NCCL's constants (tuning.cc at 5067397, ncclTunerConstantsDefaults), in seconds. "nvlink"
# is a step over NVLink ("max(hwLatencies[NVLINK], net overhead)" across nodes: 1 us for LL on
# an Intel host), "net" a step over the network (Simple's is the Cluster's scale_out_latency,
# 14 us in the presets); "share" the protocol's fraction of the bandwidth.
NCCL_TUNING = {
    "Simple": {"base": {"ring": 8.4e-6, "tree": 8.4e-6}, "nvlink": {"ring": 3.4e-6, "tree": 4.0e-6},
               "net": {"ring": None, "tree": None}, "share": {"ring": 1.0, "tree": 1.0}},
    "LL": {"base": {"ring": 6.6e-6, "tree": 6.8e-6}, "nvlink": {"ring": 1.0e-6, "tree": 0.6e-6},
           "net": {"ring": 2.7e-6, "tree": 5.0e-6}, "share": {"ring": 0.5, "tree": 1 / 3.8}},
}
# LL's bus bandwidth across nodes is capped (llMaxBws, an Intel host: 39 GB/s on 2 nodes,
# 20.4 on more)
LL_MAX_BUSBW = {2: 39.0e9, 3: 20.4e9}
NVLS_TREE_LATENCY = {"nvlink": 25e-6, "net": 20.9e-6}   # hwLatencies[..][NVLS_TREE][Simple]
RING_PLATEAU = 1.4             # ncclTopoGetAlgoTime: an all-reduce ring across nodes, Simple
# NCCL's tree all-reduce across more than two nodes reaches half the ring's bus bandwidth.
# Calibrated on ONE source, Together AI's use3a-ss B200 report (NCCL_ALGO=Tree at 16 GiB,
# 4-46 nodes: 190.7-193.5 GB/s where the model's ring gives 376), and checked on the others
# (tests/nccl_across_nodes.py); NCCL's own model says 0.92 of it, which the runs contradict.
TREE_BANDWIDTH = 0.5


def cluster_estimate(collective, nbytes, devices, cluster: Cluster, algorithm=None,
                     pairs=None, hardware="", note="") -> Estimate:
    """The estimate of one collective over ``devices`` (ids on ``cluster``, in member order).

    A group inside one node costs what the node's own topology says (measured fits
    included); one that spans nodes costs what NCCL's fastest algorithm takes on GPU nodes
    (``algorithm`` may name ``'ring'``, ``'tree'``, ``'nvls_tree'`` or ``'hierarchical'``), or
    :func:`hierarchical` on TPU slices."""
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
    found = _across(collective, float(nbytes), group, pairs, devices)
    if algorithm not in (None, "fastest", *found):
        raise ValueError(f"a {collective} across {len(by_node)} nodes of {cluster.node!r} has "
                         f"the algorithms {sorted(found)}; or None for the fastest")
    # NCCL has no hierarchical form of these three (but NVLSTree): named, not chosen
    chosen = ([found[algorithm]] if algorithm in found else
              [e for name, e in found.items() if name != "hierarchical" or len(found) == 1])
    best = min(chosen, key=lambda e: (e.time_s, e.bandwidth_s))
    return replace(best, hardware=hardware, topology=label,
                   note="; ".join(x for x in (best.note, note) if x))


def _across(collective, nbytes, group, pairs, devices) -> dict:
    """name -> Estimate of every algorithm that runs ``collective`` across these nodes."""
    cluster = group[0]
    out = {"hierarchical": hierarchical(collective, nbytes, group, pairs, devices)}
    if cluster.node.kind != "switch" or collective not in ("all_reduce", "all_gather",
                                                           "reduce_scatter"):
        return out
    named = {"ring": _ring_costs(collective, group)}
    if collective == "all_reduce":
        named["tree"] = _tree_costs(group)
        if cluster.nvlink_sharp and group[2] > 4:
            named["nvls_tree"] = {"Simple": _nvls_tree_cost(group)}
    found = {name: min((_nccl_estimate(collective, nbytes, group, name, proto, cost)
                        for proto, cost in costs.items()), key=lambda e: e.time_s)
             for name, costs in named.items()}
    return {**found, **out}


def network_rate(cluster: Cluster, g: int) -> float:
    """Bytes/s a group with ``g`` GPUs in each node sends out of a node: its g adapters (one
    per GPU, each the device's share) at the fraction of line rate NCCL reaches."""
    return g * cluster.scale_out_bandwidth * cluster.scale_out_efficiency


def _nvlink_ring_rate(cluster: Cluster, g: int) -> float:
    """The bus bandwidth of a ring's hops inside a node: unlimited for one GPU per node (no
    hop), else the node's measured ring all-gather where the preset has one (NVLink's ring
    rate), else its port bandwidth."""
    if g == 1:
        return math.inf
    fit = cluster.measured.get("all_gather")
    return fit.busbw if fit is not None else cluster.node.port_bandwidth


def _ring_costs(collective, group) -> dict:
    """protocol -> (latency s, bus bandwidth bytes/s, steps) of NCCL's ring across nodes."""
    cluster, _, g, m = group
    p = g * m
    steps, inter = (2 * (p - 1), 2 * (m - 1)) if collective == "all_reduce" else (p - 1, m - 1)
    rate = min(_nvlink_ring_rate(cluster, g), network_rate(cluster, g))
    out = {}
    for proto, c in NCCL_TUNING.items():
        net = (cluster.scale_out_latency if proto == "Simple" else
               c["net"]["tree" if g == 1 else "ring"])       # one GPU a node: the tree's
        latency = c["base"]["ring"] + (steps - inter) * c["nvlink"]["ring"] + inter * net
        if collective == "all_reduce" and proto == "Simple":
            latency *= RING_PLATEAU
        out[proto] = (latency, _capped(proto, rate * c["share"]["ring"], m), steps)
    return out


def _capped(proto, rate, m):
    return min(rate, LL_MAX_BUSBW[min(m, 3)]) if proto == "LL" else rate


def _tree_costs(group) -> dict:
    """protocol -> (latency, bus bandwidth, steps) of NCCL's tree all-reduce across nodes."""
    cluster, _, g, m = group
    ring = min(_nvlink_ring_rate(cluster, g), network_rate(cluster, g))
    rate = ring * (0.92 if m <= 2 else TREE_BANDWIDTH)
    levels = int(math.floor(math.log2(m)))
    out = {}
    for proto, c in NCCL_TUNING.items():
        net = cluster.scale_out_latency if proto == "Simple" else c["net"]["tree"]
        latency = c["base"]["tree"] + 2 * ((g - 1) * c["nvlink"]["tree"] + levels * net)
        out[proto] = (latency, _capped(proto, rate * c["share"]["tree"], m),
                      2 * (g - 1 + levels))
    return out


def _nvls_tree_cost(group):
    """(latency, bus bandwidth, steps) of NCCL's NVLSTree all-reduce: the switch reduces
    inside the node (port x NVLS efficiency, twice over, as NCCL pipelines two operations),
    a tree crosses the nodes (twice a ring's rate per adapter on two nodes)."""
    cluster, _, g, m = group
    intra = cluster.node.port_bandwidth * cluster.nvlink_sharp * 2
    rate = min(intra, network_rate(cluster, g) * (2 if m <= 2 else 1))
    levels = int(math.floor(math.log2(m)))
    latency = NVLS_TREE_LATENCY["nvlink"] + 2 * levels * NVLS_TREE_LATENCY["net"]
    return latency, rate, 1 + 2 * levels


def _nccl_estimate(collective, nbytes, group, name, proto, cost) -> Estimate:
    """nccl-tests' form: t = latency + bus bytes (S x factor) / bus bandwidth, the latency
    NCCL's model's plus the host's launch of the kernel (Cluster.call_latency)."""
    cluster, _, g, m = group
    p = g * m
    latency, rate, steps = cost
    latency += cluster.call_latency
    bus = nccl_size(collective, nbytes, p) * busbw_factor(collective, p)
    transfer = bus / rate
    return Estimate(collective, name, int(nbytes), p, latency + transfer, latency, transfer,
                    steps, bus, note=(f"NCCL {proto} protocol; {m} nodes x {g} GPU(s), "
                                      f"{network_rate(cluster, g) / 1e9:.3g} GB/s out of "
                                      f"each node"))


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
    axes = [GroupAxis(m, cluster.scale_out_bandwidth * cluster.scale_out_efficiency,
                      switch=True)]
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
    """Inside each node, then across nodes (each device with its peers of the same local
    rank, on its own share of the network), then inside again: XLA's multislice scheme over
    DCN, and on GPU nodes the all-to-all (NCCL's PXN regroups by destination rank) and a
    form named by ``algorithm="hierarchical"`` only (see the section's comment)."""
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
    transfer = busiest * nbytes / (cluster.scale_out_bandwidth * cluster.scale_out_efficiency)
    latency = cluster.scale_out_latency
    return Estimate(collective, "direct", int(nbytes), len(devices), latency + transfer, latency,
                    transfer, 1, busiest * nbytes, note=f"{len(across)} pair(s) across nodes")


def estimate_trace(trace_or_events, hardware=None, topology=None) -> TraceEstimate:
    """One estimate per collective instance in a simpmd trace (a Trace or a list of Events).

    Instances are the events sharing a ``step``. ``hardware`` defaults to the one given to
    ``simpmd.set_device_count`` (the platform's), and the physical topology to the shape
    given there (e.g. ``topology=(8, 16)``); without a shape of two or more axes, to the
    hardware's standard slice for the devices the trace uses. ``topology`` (a Topology or
    a shape) overrides both. A group that fills a block of the torus uses those axes (with
    wraparound only where it covers a whole wrapping axis); one that takes every s-th
    device along an axis shares that axis's links with the groups interleaved with it; an
    irregular group is costed as a line and says so in the estimate's note. A trace's
    columnar log (a run with no nested pmap) is read call by call, without writing out its
    events, so a run on thousands of devices is estimated in about the time it ran.
    """
    hw = _hardware_of(hardware, trace_or_events)
    log = _columnar_log(trace_or_events)
    if log is not None:
        return _estimate_columnar(log, hw, topology, trace_or_events)
    events = getattr(trace_or_events, "events", trace_or_events)
    events = [e for e in events if e.kind == "collective"]
    by_step: dict = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    used = {_member_device(e) for e in events} - {None}
    topo = _topology_for(hw, topology, trace_or_events, max(used) + 1 if used else 1)
    label = _label(hw, topology, topo)
    result = TraceEstimate(label, describe(topo))
    for step in sorted(by_step):
        members = sorted(by_step[step], key=lambda e: e.member)
        first = members[0]
        collective = collective_of(first.op)     # an op with no row raises, never costs 0 s
        nbytes = max(e.nbytes_in for e in members)
        e = _estimate_group(topo, [_member_device(m) for m in members], collective, nbytes,
                            _perm_of(first), label)
        result.collectives.append(CollectiveCost(
            step, (len(first.coords), first.call), first.op, tuple(first.axes),
            tuple(first.group), first.source, replace(e, op=collective or first.op),
            tuple(m.bytes_sent for m in members), tuple(m.bytes_received for m in members)))
    return result


def _topology_for(hw, topology, trace, count):
    return (_resolve_topology(hw, topology, count) if topology is not None
            else _platform_topology(hw, _platform(trace), count))


def _columnar_log(trace):
    """The trace's columnar log, when it has one that is read call by call (no nested pmap,
    events not replaced by hand), else None."""
    log = getattr(trace, "_log", None)
    if log is None or getattr(trace, "_events", None) is not None:
        return None
    if any(r.run.inner is not None or r.run.outer is not None for r in log.records):
        return None
    return log


def _ids_of(run) -> np.ndarray:
    ids = run.__dict__.get("_device_ids")
    if ids is None:
        ids = run._device_ids = np.array([d.id for d in run.devices], dtype=np.int64)
    return ids


def _log_bytes(record, p):
    return _bytes_moved(record.fields, p)


def _estimate_columnar(log, hw, topology, trace) -> TraceEstimate:
    records = [r for r in log.records if r.kind == "collective" and r.fields["sets"]]
    used = max((int(_ids_of(r.run).max()) for r in records if r.run.devices), default=0)
    topo = _topology_for(hw, topology, trace, used + 1)
    label = _label(hw, topology, topo)
    cache: dict = {}
    calls = []
    for r in records:
        f = r.fields
        collective = collective_of(f["op"])
        nbytes = sum(a.nbytes for a in f["avals"])
        pairs = _pairs(f["op"], f["params"])
        ids = _ids_of(r.run)
        set_times, slowest = [], None
        for members in f["sets"]:
            devices = ids[members]
            times = np.empty(len(devices))
            for key, rows in _by_shape(topo, devices).items():
                known = cache.get((key, collective, nbytes, tuple(pairs)))
                if known is None:
                    known = cache[(key, collective, nbytes, tuple(pairs))] = replace(
                        _estimate_group(topo, devices[rows[0]].tolist(), collective, nbytes,
                                        pairs, label), op=collective or f["op"])
                times[rows] = known.time_s
                if slowest is None or known.time_s > slowest.time_s:
                    slowest = known
            set_times.append(times)
        sent = max(_log_bytes(r, m.shape[1])(pos)[0] for m in f["sets"] for pos in
                   range(m.shape[1] if collective == "collective_permute" else 1))
        calls.append(CallEstimate(r.step, (len(r.run.axes), f["call"]), f["op"], tuple(f["axes"]),
                                  f["source"][0], f["phase"], slowest, np.concatenate(set_times),
                                  int(sent), r, set_times))
    return TraceEstimate(label, describe(topo), _Instances(calls), calls)


def _by_shape(topo, devices) -> dict:
    """The rows of ``devices`` (groups x members) by the group's shape on the topology:
    groups that are translates of each other cost the same."""
    if topo.kind == "cluster" and devices.max() < topo.size:
        return shape_key(topo, devices)
    if topo.kind == "switch" or devices.max() >= topo.size:
        return {("any", devices.shape[1]): np.arange(len(devices))}
    coords = np.stack(np.unravel_index(devices, topo.dims), axis=-1)      # groups x p x axes
    rel = (coords - coords[:, :1]).reshape(len(devices), -1)
    if (rel == rel[0]).all():                       # the usual case: one shape of group
        return {rel[0].tobytes(): np.arange(len(devices))}
    rows: dict = {}
    for k, shape in enumerate(rel):
        rows.setdefault(shape.tobytes(), []).append(k)
    return {key: np.array(ks) for key, ks in rows.items()}


def _link_of(topology) -> float:
    if topology.kind == "cluster":
        return topology.scale_out_bandwidth
    return topology.port_bandwidth if topology.kind == "switch" else topology.axis_bandwidth
