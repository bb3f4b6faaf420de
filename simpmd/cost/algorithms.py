"""Collective algorithms as explicit messages between devices.

``simpmd.core.collectives`` computes what a collective returns in one NumPy call. Real
interconnects get there in *steps*: at each step every device sends a piece of its buffer
to another device, and the receiver either combines it into its own piece (a reduction)
or stores it (a copy). This module plays those steps one at a time, so that a learner
can watch an algorithm, count its bytes, check that it computes the same as ``psum``, and
draw it frame by frame.

An algorithm here is a *schedule*: a list of rounds, each a list of :class:`Send` saying
which slice of the flattened buffer goes from which device to which. :func:`play` runs a
schedule on per-device buffers and records every :class:`Message`. All messages of a
round are read before any is applied, because on hardware they travel at the same time.

Uneven sizes are accepted: a buffer of ``n`` elements is cut into ``p`` pieces the way
``np.array_split`` cuts it (the first ``n % p`` pieces are one element longer), so the
byte counts equal the textbook closed forms exactly when ``n`` divides evenly, and are
within one element per piece otherwise.

Algorithms (one table, :data:`ALGORITHMS`, keyed by collective):

* ring all-reduce: ring reduce-scatter (p-1 steps) then ring all-gather (p-1 steps),
  every device sending to its right-hand neighbour only;
* bidirectional ring all-reduce: every piece goes both ways round at once (the Scaling
  Book's scheme), so both directions of every link work and it takes floor(p/2) rounds
  per phase instead of p-1;
* line all-reduce: the same on a line with no wraparound link; partial sums sweep in from
  both ends, which also takes p-1 + p-1 steps but cannot use a second direction;
* tree all-reduce: a binomial tree, reduce to device 0 then broadcast back (2 log2 p
  steps, each sending the whole buffer);
* 2-D torus all-reduce: reduce-scatter along one axis, then along the other, then
  all-gather back in reverse order; run on two halves of the data at once (rows first
  and columns first, each ring both ways round) so every link of both axes is busy;
* ring all-gather and ring reduce-scatter on their own (or on a line, ``wraparound=False``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

REDUCERS = {"sum": np.add, "max": np.maximum, "min": np.minimum}


# -- what moves -------------------------------------------------------------------------

@dataclass(frozen=True)
class Send:
    """A planned transfer: elements ``[start, stop)`` of ``src``'s flat buffer go to ``dst``.

    ``kind`` is ``"reduce"`` (the receiver combines them into its own elements) or
    ``"copy"`` (the receiver overwrites its elements with them).
    """

    src: int
    dst: int
    start: int
    stop: int
    kind: str


@dataclass(frozen=True, eq=False)
class Message:
    """One message as it travelled: who sent which chunk to whom, and its contents."""

    src: int
    dst: int
    chunk: int               # index into ``AlgorithmRun.chunks``: the flat range it covers
    kind: str                # "reduce" or "copy"
    payload: np.ndarray

    @property
    def nbytes(self) -> int:
        return int(self.payload.nbytes)

    def __repr__(self):
        return f"Message({self.src}->{self.dst}, chunk {self.chunk}, {self.kind}, {self.nbytes} B)"


@dataclass(frozen=True)
class Step:
    """All messages that travel at the same time, and what the step is part of."""

    index: int
    label: str
    messages: tuple

    @property
    def nbytes(self) -> int:
        return sum(m.nbytes for m in self.messages)


@dataclass(eq=False)
class AlgorithmRun:
    """The result of playing an algorithm: final values, every step, and byte counters.

    ``outputs[i]`` is what device ``i`` ends with; ``steps`` the messages, step by step;
    ``chunks[k]`` the ``(start, stop)`` range of the flattened buffer that chunk ``k``
    covers; ``states[t][i]`` device ``i``'s flat buffer after step ``t`` (``states[0]`` is
    the start), for drawing frames; ``bytes_sent[i]``/``bytes_received[i]`` per device.
    """

    algorithm: str
    collective: str
    inputs: list
    outputs: list
    steps: list
    chunks: list
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    states: list = field(repr=False, default_factory=list)
    mesh_shape: tuple = ()

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_devices(self) -> int:
        return len(self.inputs)

    @property
    def num_messages(self) -> int:
        return sum(len(s.messages) for s in self.steps)

    def __repr__(self):
        return (f"<{self.algorithm} over {self.num_devices} device(s): {self.num_steps} steps, "
                f"{self.num_messages} messages, {int(self.bytes_sent.sum())} bytes sent in all, "
                f"at most {int(self.bytes_sent.max(initial=0))} by one device>")


# -- playing a schedule -----------------------------------------------------------------

def play(algorithm: str, collective: str, buffers, rounds, *, op: str = "sum",
         inputs=None, mesh_shape=()) -> AlgorithmRun:
    """Run ``rounds`` (a list of ``(label, [Send, ...])``) on copies of the flat ``buffers``.

    Returns an :class:`AlgorithmRun` whose ``outputs`` are the final flat buffers (the
    caller reshapes them). Empty sends (zero elements, from uneven splits) are skipped.
    """
    combine = _reducer(op)
    buffers = [np.array(b, copy=True) for b in buffers]
    p = len(buffers)
    sent = np.zeros(p, dtype=np.int64)
    received = np.zeros(p, dtype=np.int64)
    rounds = list(rounds)
    # Chunks are numbered in array order (chunk 0 starts the buffer), so a drawing can
    # colour them consistently.
    chunks = sorted({(s.start, s.stop) for _, sends in rounds for s in sends if s.stop > s.start})
    chunk_ids = {c: k for k, c in enumerate(chunks)}
    steps: list = []
    states = [[b.copy() for b in buffers]]
    for index, (label, sends) in enumerate(rounds):
        messages = []
        for s in sends:
            if s.stop <= s.start:
                continue
            messages.append(Message(s.src, s.dst, chunk_ids[(s.start, s.stop)], s.kind,
                                    buffers[s.src][s.start:s.stop].copy()))
        # Every payload was copied above, before any write: the messages of a step travel
        # together, so none of them may see another's effect.
        for m in messages:
            start, stop = chunks[m.chunk]
            target = buffers[m.dst][start:stop]
            if m.kind == "reduce":
                combine(target, m.payload, out=target)
            else:
                target[...] = m.payload
            sent[m.src] += m.nbytes
            received[m.dst] += m.nbytes
        steps.append(Step(index, label, tuple(messages)))
        states.append([b.copy() for b in buffers])
    return AlgorithmRun(algorithm, collective, list(inputs if inputs is not None else buffers),
                        buffers, steps, chunks, sent, received, states, tuple(mesh_shape))


def _reducer(op):
    if op not in REDUCERS:
        raise ValueError(f"unknown reduction {op!r}; choose one of {sorted(REDUCERS)}")
    return REDUCERS[op]


def pieces(start: int, stop: int, p: int) -> list:
    """``[start, stop)`` cut into ``p`` contiguous pieces, as ``np.array_split`` cuts it."""
    n = stop - start
    sizes = [n // p + (1 if k < n % p else 0) for k in range(p)]
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(int) + start
    return [(int(bounds[k]), int(bounds[k + 1])) for k in range(p)]


def concurrent_rounds(*schedules) -> list:
    """Unlabelled schedules that run at the same time: round ``t`` gathers every round ``t``."""
    return [[send for s in schedules if t < len(s) for send in s[t]]
            for t in range(max((len(s) for s in schedules), default=0))]


def side_by_side(*schedules) -> list:
    """Labelled schedules that run at the same time: round ``t`` holds every schedule's round ``t``."""
    merged = []
    for t in range(max((len(s) for s in schedules), default=0)):
        labels, sends = [], []
        for s in schedules:
            if t < len(s):
                if s[t][0] not in labels:
                    labels.append(s[t][0])
                sends.extend(s[t][1])
        merged.append((" | ".join(labels), sends))
    return merged


def labelled(name: str, rounds) -> list:
    """Rounds of sends, labelled ``"name 1/k"`` ... ``"name k/k"``."""
    return [(f"{name} {t + 1}/{len(rounds)}", sends) for t, sends in enumerate(rounds)]


# -- schedules on one group of devices --------------------------------------------------
# Each returns a list of rounds (lists of Send). ``group`` lists device ids in ring or
# line order; the member at position k ends a reduce-scatter owning piece k of the
# range, and starts an all-gather owning piece k.

def ring_reduce_scatter_schedule(group, start, stop, direction=1):
    """p-1 rounds; each device passes one partial sum to its neighbour in ``direction``."""
    p = len(group)
    bounds = pieces(start, stop, p)
    rounds = []
    for s in range(p - 1):
        sends = []
        for k in range(p):
            piece = (k - direction * (s + 1)) % p
            sends.append(Send(group[k], group[(k + direction) % p], *bounds[piece], "reduce"))
        rounds.append(sends)
    return rounds


def ring_all_gather_schedule(group, start, stop, direction=1):
    """p-1 rounds; each device forwards the piece it received last round (first: its own)."""
    p = len(group)
    bounds = pieces(start, stop, p)
    rounds = []
    for s in range(p - 1):
        sends = []
        for k in range(p):
            piece = (k - direction * s) % p
            sends.append(Send(group[k], group[(k + direction) % p], *bounds[piece], "copy"))
        rounds.append(sends)
    return rounds


def bidirectional_ring_reduce_scatter_schedule(group, start, stop, balanced=False):
    """floor(p/2) rounds: the partial sums of each piece flow to its owner from both sides.

    The Scaling Book's bidirectional ring ("How to Scale Your Model", Part 3 "Sharding"):
    piece c is summed clockwise by the h = floor(p/2) devices before c and counter-clockwise
    by the p-1-h devices after it, both sweeps arriving at c together. Each link direction
    carries at most one piece per round; each device sends (p-1)/p of its buffer, as on a
    one-way ring, in about half the rounds. ``balanced`` (even p): the device half-way
    round starts both sweeps with half of its piece each, so the counter-clockwise sweep
    is as long as the clockwise one and no link direction carries more than (p-1)/2 pieces.
    """
    p = len(group)
    if p <= 2:
        return ring_reduce_scatter_schedule(group, start, stop)
    bounds, h = pieces(start, stop, p), p // 2
    split = balanced and p % 2 == 0
    back = h if split else p - 1 - h           # the counter-clockwise sweep's length
    rounds = []
    for t in range(1, h + 1):
        sends = []
        for c in range(p):
            first = second = bounds[c]
            if split and t == 1:               # the device half-way round halves its piece
                first, second = pieces(*bounds[c], 2)
            src = (c - h + t - 1) % p          # clockwise sweep: c-h, ..., c-1
            sends.append(Send(group[src], group[(src + 1) % p], *first, "reduce"))
            k = t - (h - back)                 # it starts later when it is shorter
            if k >= 1:
                src = (c + back - k + 1) % p   # counter-clockwise sweep: c+back, ..., c+1
                sends.append(Send(group[src], group[(src - 1) % p], *second, "reduce"))
        rounds.append(sends)
    return rounds


def bidirectional_ring_all_gather_schedule(group, start, stop, balanced=False):
    """floor(p/2) rounds: every piece spreads from its owner both ways round at once.

    The Scaling Book's bidirectional AllGather (Part 3 "Sharding": "|X| / 2 hops"): h =
    floor(p/2) devices get piece c clockwise, the other p-1-h counter-clockwise.
    ``balanced`` (even p): the device half-way round gets half the piece from each side.
    """
    p = len(group)
    if p <= 2:
        return ring_all_gather_schedule(group, start, stop)
    bounds, h = pieces(start, stop, p), p // 2
    split = balanced and p % 2 == 0
    back = h if split else p - 1 - h
    rounds = []
    for t in range(1, h + 1):
        sends = []
        for c in range(p):
            first = second = bounds[c]
            if split and t == h:               # both sides reach the device half-way round
                first, second = pieces(*bounds[c], 2)
            src = (c + t - 1) % p
            sends.append(Send(group[src], group[(src + 1) % p], *first, "copy"))
            if t <= back:
                src = (c - t + 1) % p
                sends.append(Send(group[src], group[(src - 1) % p], *second, "copy"))
        rounds.append(sends)
    return rounds


def line_reduce_scatter_schedule(group, start, stop):
    """p-1 rounds on a line (no wraparound): partial sums sweep in from both ends.

    Piece c is summed left to right from device 0 up to device c, and right to left from
    device p-1 down to device c, which adds both partials to its own. Each round, each
    direction of each link carries at most one piece.
    """
    p = len(group)
    bounds = pieces(start, stop, p)
    rounds = []
    for s in range(1, p):
        sends = []
        for i in range(p):
            right = p - s + i              # rightward sweep: piece p-s+i leaves device i
            if i + 1 <= right <= p - 1:
                sends.append(Send(group[i], group[i + 1], *bounds[right], "reduce"))
            left = i + s - p               # leftward sweep, the mirror image
            if 0 <= left <= i - 1:
                sends.append(Send(group[i], group[i - 1], *bounds[left], "reduce"))
        rounds.append(sends)
    return rounds


def line_all_gather_schedule(group, start, stop):
    """p-1 rounds on a line: every piece spreads outwards from its owner in both directions."""
    p = len(group)
    bounds = pieces(start, stop, p)
    rounds = []
    for s in range(1, p):
        sends = []
        for i in range(p):
            right = i - s + 1              # piece that reached device i from the left
            if 0 <= right and i + 1 <= p - 1:
                sends.append(Send(group[i], group[i + 1], *bounds[right], "copy"))
            left = i + s - 1               # piece that reached device i from the right
            if left <= p - 1 and i >= 1:
                sends.append(Send(group[i], group[i - 1], *bounds[left], "copy"))
        rounds.append(sends)
    return rounds


def tree_reduce_schedule(group, start, stop):
    """ceil(log2 p) rounds: at round k, member i (i = 2^k mod 2^(k+1)) sends all to i - 2^k."""
    p = len(group)
    rounds, k = [], 0
    while (1 << k) < p:
        half = 1 << k
        rounds.append([Send(group[i], group[i - half], start, stop, "reduce")
                       for i in range(half, p, 2 * half)])
        k += 1
    return rounds


def tree_broadcast_schedule(group, start, stop):
    """The reduce tree run backwards: member 0's buffer reaches everyone in ceil(log2 p) rounds."""
    p = len(group)
    levels = len(tree_reduce_schedule(group, start, stop))
    rounds = []
    for k in reversed(range(levels)):
        half = 1 << k
        rounds.append([Send(group[i], group[i + half], start, stop, "copy")
                       for i in range(0, p, 2 * half) if i + half < p])
    return rounds


def axis_reduce_scatter_schedule(group, start, stop, wraparound):
    """Reduce-scatter along one torus axis: both ways round, balanced, if it wraps around;
    else a line."""
    if wraparound and len(group) > 2:
        return bidirectional_ring_reduce_scatter_schedule(group, start, stop, balanced=True)
    return line_reduce_scatter_schedule(group, start, stop)


def axis_all_gather_schedule(group, start, stop, wraparound):
    """All-gather along one torus axis: both ways round, balanced, if it wraps around;
    else a line."""
    if wraparound and len(group) > 2:
        return bidirectional_ring_all_gather_schedule(group, start, stop, balanced=True)
    return line_all_gather_schedule(group, start, stop)


# -- inputs -----------------------------------------------------------------------------

def _flat_inputs(inputs, name):
    """Check that every device holds an array of one shape and dtype; return flat copies."""
    arrays = [np.asarray(x) for x in inputs]
    if not arrays:
        raise ValueError(f"{name} needs at least one device's array; got an empty list")
    shape, dtype = arrays[0].shape, arrays[0].dtype
    for i, a in enumerate(arrays):
        if a.shape != shape or a.dtype != dtype:
            raise ValueError(
                f"{name}: device {i} holds {a.dtype}{list(a.shape)} but device 0 holds "
                f"{dtype}{list(shape)}; every device must hold the same shape and dtype")
    return [a.reshape(-1).copy() for a in arrays], shape


# -- all-reduce -------------------------------------------------------------------------

def _two_phase_all_reduce(title, inputs, op, first, second) -> AlgorithmRun:
    """An all-reduce over the whole buffer of every device: ``first`` then ``second``, each
    a (label, schedule function) pair, e.g. ring reduce-scatter then ring all-gather."""
    flat, shape = _flat_inputs(inputs, title.replace(" ", "_").replace("-", "_"))
    _reducer(op)
    group, n = list(range(len(flat))), flat[0].size
    rounds = (labelled(first[0], first[1](group, 0, n))
              + labelled(second[0], second[1](group, 0, n)))
    return _finish(play(title, "all_reduce", flat, rounds, op=op,
                        inputs=inputs, mesh_shape=(len(flat),)), shape)


def ring_all_reduce(inputs, *, op: str = "sum") -> AlgorithmRun:
    """Ring all-reduce: reduce-scatter then all-gather, each p-1 steps, one direction.

    Every device sends 2(p-1)/p of its buffer: the bandwidth-optimal amount.
    """
    return _two_phase_all_reduce("ring all-reduce", inputs, op,
                                 ("reduce-scatter", ring_reduce_scatter_schedule),
                                 ("all-gather", ring_all_gather_schedule))


def bidirectional_ring_all_reduce(inputs, *, op: str = "sum") -> AlgorithmRun:
    """Reduce-scatter then all-gather, each piece going both ways round at once.

    The Scaling Book's bidirectional ring: 2 floor(p/2) rounds instead of 2(p-1), the same
    2(p-1)/p of the buffer sent per device, and each link direction carrying one piece per
    round: with a wraparound link it takes half the time of a one-way ring.
    """
    return _two_phase_all_reduce("bidirectional ring all-reduce", inputs, op,
                                 ("reduce-scatter", bidirectional_ring_reduce_scatter_schedule),
                                 ("all-gather", bidirectional_ring_all_gather_schedule))


def line_all_reduce(inputs, *, op: str = "sum") -> AlgorithmRun:
    """All-reduce on a line with no wraparound link (e.g. a TPU axis shorter than a full pod).

    Reduce-scatter by two sweeps from the ends, then all-gather outwards: 2(p-1) steps, each
    link direction carrying one piece per step, as a one-way ring would. Without the
    wraparound the second direction cannot be used to halve the time.
    """
    return _two_phase_all_reduce("line all-reduce", inputs, op,
                                 ("reduce-scatter", line_reduce_scatter_schedule),
                                 ("all-gather", line_all_gather_schedule))


def tree_all_reduce(inputs, *, op: str = "sum") -> AlgorithmRun:
    """Binomial-tree all-reduce: reduce to device 0, then broadcast (not recursive doubling).

    2 ceil(log2 p) steps instead of 2(p-1), but every step sends the whole buffer: better
    for tiny, latency-bound messages, worse for large ones. Not pipelined (NCCL's trees
    cut the buffer into chunks and pipeline them; this one does not).
    """
    return _two_phase_all_reduce("tree all-reduce", inputs, op,
                                 ("reduce", tree_reduce_schedule),
                                 ("broadcast", tree_broadcast_schedule))


def torus_all_reduce(inputs, shape, *, wraparound=(True, True), op: str = "sum") -> AlgorithmRun:
    """All-reduce on a 2-D torus of ``shape = (rows, cols)``; device ``r * cols + c`` sits at (r, c).

    The usual 2-D scheme: reduce-scatter along one axis, then along the other on the piece
    each device now owns, then all-gather back in reverse order. The data is cut into two
    halves run at the same time, one rows-first and one columns-first, so both axes'
    links are busy from the first step. An axis with its wraparound link runs the
    bidirectional ring (each piece both ways round, balanced); without it, the line.
    """
    flat, data_shape = _flat_inputs(inputs, "torus_all_reduce")
    _reducer(op)
    rows, cols = (int(d) for d in shape)
    if rows * cols != len(flat):
        raise ValueError(f"torus_all_reduce: a {rows}x{cols} torus has {rows * cols} devices, "
                         f"but {len(flat)} arrays were given; give one array per device")
    wrap = (bool(wraparound), bool(wraparound)) if np.ndim(wraparound) == 0 else tuple(map(bool, wraparound))
    sizes = (rows, cols)
    # lines[a] = the groups along axis a, as (coordinate on the other axis, members in order)
    lines = {0: [(c, [r * cols + c for r in range(rows)]) for c in range(cols)],
             1: [(r, [r * cols + c for c in range(cols)]) for r in range(rows)]}
    names = {0: "columns", 1: "rows"}       # moving along axis 0 stays within a column
    n = flat[0].size
    halves = pieces(0, n, 2)
    plans = [(1, 0), (0, 1)]
    schedules = []
    for (first, second), (q0, q1) in zip(plans, halves):
        owned = pieces(q0, q1, sizes[first])      # after phase 1, coordinate k owns piece k
        phase1 = concurrent_rounds(*[axis_reduce_scatter_schedule(g, q0, q1, wrap[first])
                                for _, g in lines[first]])
        phase2 = concurrent_rounds(*[axis_reduce_scatter_schedule(g, *owned[k], wrap[second])
                                for k, g in lines[second]])
        phase3 = concurrent_rounds(*[axis_all_gather_schedule(g, *owned[k], wrap[second])
                                for k, g in lines[second]])
        phase4 = concurrent_rounds(*[axis_all_gather_schedule(g, q0, q1, wrap[first])
                                for _, g in lines[first]])
        schedules.append(labelled(f"reduce-scatter {names[first]}", phase1)
                         + labelled(f"reduce-scatter {names[second]}", phase2)
                         + labelled(f"all-gather {names[second]}", phase3)
                         + labelled(f"all-gather {names[first]}", phase4))
    wraps = "with" if all(wrap) else ("without" if not any(wrap) else "with some")
    return _finish(play(f"2-D torus all-reduce ({rows}x{cols}, {wraps} wraparound)", "all_reduce",
                        flat, side_by_side(*schedules), op=op, inputs=inputs,
                        mesh_shape=(rows, cols)), data_shape)


def _finish(run: AlgorithmRun, shape) -> AlgorithmRun:
    run.outputs = [b.reshape(shape) for b in run.outputs]
    return run


# -- all-gather and reduce-scatter on their own -----------------------------------------

def ring_all_gather(inputs, *, wraparound: bool = True) -> AlgorithmRun:
    """Each device starts with its shard; after p-1 steps all hold every shard.

    ``outputs[i]`` has shape ``(p, *shard_shape)``, like ``lax.all_gather(x, axis)``. Every
    device sends (p-1)/p of the output (the whole gathered array) on a ring; on a line
    (``wraparound=False``) the middle devices forward more and the ends less.
    """
    flat, shape = _flat_inputs(inputs, "ring_all_gather")
    p, m = len(flat), flat[0].size
    buffers = []
    for k, shard in enumerate(flat):
        b = np.zeros(p * m, dtype=shard.dtype)
        b[k * m:(k + 1) * m] = shard
        buffers.append(b)
    group = list(range(p))
    if wraparound:
        name, rounds = "ring all-gather", ring_all_gather_schedule(group, 0, p * m)
    else:
        name, rounds = "line all-gather", line_all_gather_schedule(group, 0, p * m)
    run = play(name, "all_gather", buffers, labelled("all-gather", rounds),
               inputs=inputs, mesh_shape=(p,))
    run.outputs = [b.reshape((p,) + shape) for b in run.outputs]
    return run


def ring_reduce_scatter(inputs, *, wraparound: bool = True, op: str = "sum") -> AlgorithmRun:
    """After p-1 steps device k holds piece k of the reduced, flattened array.

    Pieces are cut as ``np.array_split(total.ravel(), p)`` cuts them, so any length works.
    Every device sends (p-1)/p of its input, on a ring or on a line.
    """
    flat, _ = _flat_inputs(inputs, "ring_reduce_scatter")
    _reducer(op)
    p, n = len(flat), flat[0].size
    group = list(range(p))
    if wraparound:
        name, rounds = "ring reduce-scatter", ring_reduce_scatter_schedule(group, 0, n)
    else:
        name, rounds = "line reduce-scatter", line_reduce_scatter_schedule(group, 0, n)
    run = play(name, "reduce_scatter", flat, labelled("reduce-scatter", rounds), op=op,
               inputs=inputs, mesh_shape=(p,))
    run.outputs = [run.outputs[k][a:b].copy() for k, (a, b) in enumerate(pieces(0, n, p))]
    return run


# -- the table: collective -> algorithm name -> function ---------------------------------

ALGORITHMS = {
    "all_reduce": {
        "ring": ring_all_reduce,
        "bidirectional_ring": bidirectional_ring_all_reduce,
        "line": line_all_reduce,
        "tree": tree_all_reduce,
        "torus": torus_all_reduce,
    },
    "all_gather": {"ring": ring_all_gather},
    "reduce_scatter": {"ring": ring_reduce_scatter},
}
