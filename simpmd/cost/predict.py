"""How long a program will take on a machine: its kernels scheduled on one device's streams.

The Scaling Book's roofline (:class:`~simpmd.cost.roofline.Roofline`'s ``time_s``) prices
every equation at peak rates as if each made a round trip to HBM. A device does otherwise,
and this module follows what it does, each rate from the preset's published sources (its
``citations``):

* **kernels**: XLA runs chains of equations as one kernel (:mod:`simpmd.cost.fusion`:
  elementwise work fused between the matrix products and into their epilogues, calls
  inlined, accumulations done in place); a kernel takes the larger of its FLOPs at the
  sustained rate of the path its products run on (:mod:`simpmd.cost.precision`: TF32 for
  float32 on an H100, one bf16 pass on a TPU; ``precision=`` overrides the path of the
  products of weights, as Transformer Engine runs its linear layers in FP8) and its bytes
  at the sustained HBM bandwidth, and at least the floor of a kernel launch;
* **streams**: kernels run one after another on the compute stream, in program order;
  each collective runs on the stream of its mesh axes (NCCL's communicators, XLA's
  asynchronous collectives) as soon as its operands are ready, so it overlaps whatever
  compute does not need its result, and the compute stream waits for the rest
  (``overlap=False``: everything on the compute stream);
* **nested bodies**, read through the walk (:class:`simpmd.cost.walk.Walker`, one meaning
  everywhere): a ``scan`` (and a ``while_loop``) runs two iterations, the second's carry
  waiting on the first's, so that a collective of the next iteration whose operands are
  the loop's inputs (the next layer's FSDP gather) overlaps this one, then the rest at the
  steady period; a ``cond`` runs the branch the walk takes (each device's, on values; the
  costliest, on shapes); equations nothing reads are left out;
* the **call from Python** costs the preset's dispatch floor.

The prediction's :attr:`Prediction.terms` split the compute stream's time, which they add
up to: *compute* and *memory* (kernels by what bounds them), *recompute* (kernels whose
matrix products a checkpoint computes again in the backward pass), *communication* (time
the compute stream waits on a collective), *bubble* (a pipeline's idle ticks:
``pipeline=(ticks, idle)`` names the loop over the ticks) and *launch* (floors and the
call). The largest names what bounds the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
import heapq
import math

from .fusion import body_kernels
from .network import _hardware_of, _seconds, estimate
from .precision import eqn_path
from .rows import column
from .walk import (Walker, _axis_sizes, _primitive_name, _row, _typed, axes_in,
                   flops_and_bytes, nested, scan_split)

TERMS = ("compute", "memory", "recompute", "communication", "bubble", "launch")


@dataclass(frozen=True)
class KernelTime:
    """One kernel of the prediction: what it is, when it runs (``start_s``..``end_s`` on
    its ``stream``, ``'compute'`` or ``'communication'``; a collective's mesh ``axes``)
    and its parts; a loop or a conditional is one row, its body's terms in ``inner``."""

    name: str
    kind: str
    stream: str
    start_s: float
    end_s: float
    compute_s: float = 0.0
    memory_s: float = 0.0
    comm_s: float = 0.0
    launch_s: float = 0.0
    flops: float = 0.0
    bytes: int = 0
    path: str = ""
    inner: tuple = ()             # a loop or cond: its body's terms times its trips
    term: str = ""                # what its time counts as
    axes: tuple = ()

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def terms(self) -> dict:
        """The kernel's seconds by term (a collective's are all communication)."""
        if self.inner:
            return dict(self.inner)
        if self.comm_s:
            return {"communication": self.comm_s}
        return {self.term: max(self.compute_s, self.memory_s), "launch": self.launch_s}


@dataclass
class Prediction:
    """The predicted time of a program on one device of ``hardware``, and its parts.

    ``terms`` holds seconds of compute, memory, recompute, communication (the part of the
    collectives no compute hides), bubble and launch; they add up to ``time_s``.
    ``kernels`` lists the top-level kernels with their start and end (what a timeline
    draws); ``flops`` counts every equation the device runs, once per run, as the walk
    does; ``communication_s`` every collective's time, hidden or not; ``collectives``
    (op, axes, bytes, seconds) of each collective equation."""

    hardware: str
    time_s: float = 0.0
    terms: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    overlap: bool = True
    notes: list = field(default_factory=list)
    communication_s: float = 0.0
    flops: float = 0.0
    collectives: list = field(default_factory=list)

    @property
    def bound(self) -> str:
        """The largest term: what the program waits on."""
        return max(self.terms, key=self.terms.get) if self.time_s > 0 else ""

    @property
    def fused_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    def __str__(self):
        parts = ", ".join(f"{name} {_seconds(t)}" for name, t in self.terms.items() if t)
        head = (f"Predicted on {self.hardware}: {_seconds(self.time_s) if self.time_s else '0 s'}"
                f" ({parts or 'nothing'}), {self.bound}-bound; {len(self.kernels)} kernel(s)"
                f"{'' if self.overlap else ', no overlap'}")
        rows = [f"  {k.name:24s} {k.kind:10s} {_seconds(k.time_s) if k.time_s else '0':>10s}"
                f"{'  ' + k.path if k.path else ''}" for k in self.kernels[:40]]
        more = [f"  ... {len(self.kernels) - 40} more"] if len(self.kernels) > 40 else []
        return "\n".join([head] + rows + more + [f"  note: {n}" for n in self.notes])

    def __repr__(self):
        return (f"<Prediction on {self.hardware}: {_seconds(self.time_s) if self.time_s else '0 s'},"
                f" {self.bound}-bound>")


class _Sum:
    """Seconds of the compute stream by term, the FLOPs run, every collective's seconds."""

    __slots__ = ("terms", "flops", "collectives")

    def __init__(self):
        self.terms, self.flops, self.collectives = dict.fromkeys(TERMS, 0.0), 0.0, 0.0

    def add(self, other, times=1.0):
        for k, v in other.terms.items():
            self.terms[k] += times * v
        self.flops += times * other.flops
        self.collectives += times * other.collectives

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def busy(self) -> float:
        """Seconds the compute stream runs kernels (waits and idle ticks left out)."""
        return self.total - self.terms["communication"] - self.terms["bubble"]


class _Streams:
    """The clock of the compute stream and of each mesh axes' collectives, and when each
    value is ready."""

    def __init__(self):
        self.compute, self.comm, self.ready = 0.0, {}, {}

    def end(self) -> float:
        return max([self.compute, *self.comm.values()])

    def at(self, body, v) -> float:
        return self.ready.get(body.base(v), 0.0)


@dataclass(frozen=True)
class _Block:
    """A loop or a conditional as one piece of the compute stream: its seconds, their
    terms, the mesh axes its collectives used, and how it shows ('scan x8')."""

    seconds: float
    sum: _Sum
    axes: frozenset
    label: str


class _Predictor:
    """One prediction's rules and what it computed once: each body's kernels, each
    kernel's time, each loop's, each collective's."""

    def __init__(self, hw, walker, topology, overlap, precision, pipeline, cache,
                 accumulation_fusion=False, blocking=frozenset()):
        self.hw, self.walker, self.topology, self.overlap = hw, walker, topology, overlap
        self.blocking = frozenset(blocking)
        self.precision, self.pipeline = precision, pipeline
        self.accumulation_fusion = accumulation_fusion
        self.cache = {} if cache is None else cache
        self.bodies, self.times, self.blocks, self.flops, self.seen = {}, {}, {}, {}, {}

    def body(self, program, sizes, phase):
        key = (id(program), phase)
        if key not in self.bodies:
            self.bodies[key] = body_kernels(program, self.walker, sizes, phase,
                                            self.accumulation_fusion)
        return self.bodies[key]

    def eqn_flops(self, e) -> float:
        key = id(e.eqn)
        if key not in self.flops:
            row = _row(e.eqn)
            self.flops[key] = (0 if nested(e.eqn)[0] or column(row, "collective_family")
                               else flops_and_bytes(e.eqn, row)[0])
        return self.flops[key]

    # -- placing a body's kernels on the streams ----------------------------------------

    def run(self, body, streams, total, rows=None, depth=0):
        """Every kernel of ``body`` on ``streams``, adding to ``total``: compute kernels in
        program order; collectives issued in the order their operands become ready (as
        XLA's latency-hiding scheduler starts them as early as it can), each before the
        first kernel that reads its result; the equations of no kernel of their own
        (views, what readers compute again) count their FLOPs."""
        pending, waiting = [], {}            # (ready, order, collective); result -> ready
        for n, kernel in enumerate(body.kernels):
            if kernel.kind == "collective" and self.overlap and not self._blocks(kernel):
                ready = self._ready(kernel, body, streams)
                heapq.heappush(pending, (ready, n, kernel))
                waiting.update((o, ready) for e in kernel.eqns for o in e.outvars)
                continue
            needed = [waiting[body.base(v)] for v in kernel.reads if body.base(v) in waiting]
            self._issue(pending, body, streams, total, rows,
                        max(needed + [streams.compute, self._ready(kernel, body, streams)]))
            if kernel.kind == "block":
                self._place_block(kernel, body, streams, total, rows, depth)
            elif kernel.kind == "collective":
                self._place_collective(kernel, body, streams, total, rows)
            else:
                self._place_kernel(kernel, body, streams, total, rows)
        self._issue(pending, body, streams, total, rows, float("inf"))
        total.flops += sum(self.eqn_flops(e) for e in body.free) + sum(
            self.eqn_flops(e) for k in body.dropped for e in k.eqns)

    def _issue(self, pending, body, streams, total, rows, by):
        """The pending collectives ready by ``by``, in the order they became ready."""
        while pending and pending[0][0] <= by:
            self._place_collective(heapq.heappop(pending)[2], body, streams, total, rows)

    def _ready(self, kernel, body, streams) -> float:
        return max([streams.at(body, v) for v in kernel.reads] or [0.0])

    def _done(self, kernel, streams, at):
        for e in kernel.eqns:
            for o in e.outvars:
                streams.ready[o] = at

    def _place_kernel(self, kernel, body, streams, total, rows):
        t = self._timed(kernel, body)
        start = max(streams.compute, self._ready(kernel, body, streams))
        total.terms["communication"] += start - streams.compute
        total.terms[t.term] += t.time_s - t.launch_s
        total.terms["launch"] += t.launch_s
        total.flops += t.flops
        streams.compute = start + t.time_s
        self._done(kernel, streams, streams.compute)
        if rows is not None:
            rows.append(replace(t, start_s=start, end_s=streams.compute, stream="compute"))

    def _blocks(self, kernel) -> bool:
        """Whether the collective runs in the compute stream's order (``blocking``)."""
        return _primitive_name(kernel.eqns[0]) in self.blocking

    def _place_collective(self, kernel, body, streams, total, rows):
        e = kernel.eqns[0]
        seconds, axes = self._collective(e, body)
        ready = self._ready(kernel, body, streams)
        if self.overlap and not self._blocks(kernel):
            start = max(streams.comm.get(axes, 0.0), ready)
            streams.comm[axes] = start + seconds
        else:
            start = max(streams.compute, ready)
            total.terms["communication"] += start + seconds - streams.compute
            streams.compute = start + seconds
        total.collectives += seconds
        self._done(kernel, streams, start + seconds)
        if rows is not None:
            rows.append(KernelTime(kernel.name, "collective",
                                   "communication" if self.overlap else "compute", start,
                                   start + seconds, comm_s=seconds, bytes=kernel.bytes,
                                   term="communication", axes=axes))

    def _place_block(self, kernel, body, streams, total, rows, depth):
        block = self._block(kernel.eqns[0], body, depth)
        start = max(streams.compute, self._ready(kernel, body, streams))
        total.terms["communication"] += start - streams.compute
        total.add(block.sum)
        total.flops += sum(self.eqn_flops(e) for e in kernel.eqns[1:])   # added in place
        streams.compute = start + block.seconds
        for axes in block.axes:             # its collectives end before it does
            streams.comm[axes] = max(streams.comm.get(axes, 0.0), streams.compute)
        self._done(kernel, streams, streams.compute)
        if rows is not None:
            inner = tuple((k, v) for k, v in block.sum.terms.items() if v)
            rows.append(KernelTime(block.label, "loop body", "compute", start, streams.compute,
                                   comm_s=block.sum.collectives, flops=block.sum.flops,
                                   inner=inner or (("compute", 0.0),), term="compute"))

    # -- what one kernel and one collective take ----------------------------------------

    def _path(self, e, body) -> str:
        """The matrix-unit path of a product: ``precision`` for a product of a weight (a
        dot_general without batch dimensions: a linear layer), else as XLA runs the types
        of the buffers it reads (an FP8 copy read as a wider type runs on the FP8 path)."""
        if self.precision and _primitive_name(e) == "dot_general":
            (_, _), (batch, _) = e.params["dimension_numbers"]
            if not tuple(batch):
                return self.precision
        return eqn_path(self.hw, e.eqn, [_stored(v, body) for v in e.invars])

    def _timed(self, kernel, body) -> KernelTime:
        """The kernel's parts and duration (from 0): its products at the sustained rate of
        their path (a fused attention kernel's at its own, where the preset has one), other
        arithmetic on the vector units (what it computes again of other kernels included),
        its bytes at the sustained HBM bandwidth, at least a launch."""
        if id(kernel) in self.times:
            return self.times[id(kernel)]
        hw, compute, flops, path, again = self.hw, 0.0, 0.0, "", False
        own = {id(e) for e in kernel.eqns}
        for e in kernel.eqns + kernel.redo:
            f = self.eqn_flops(e)
            if column(_row(e.eqn), "matmul"):
                p, v = self._path(e, body), self._vector_flops(e)
                path = path or p
                rate = hw.sustained_attention_flops(column(_row(e.eqn), "attention_pass"), p)
                compute += (f - v) / rate + v / hw.vector_flops
                again = again or body.phase.get(id(e)) == "recompute"
            else:
                compute += f / hw.vector_flops
            flops += f if id(e) in own else 0.0
        memory = kernel.bytes / hw.sustained_hbm_bandwidth
        work = max(compute, memory)
        launch = max(0.0, hw.kernel_launch_s - work)
        term = "recompute" if again else "compute" if compute >= memory else "memory"
        self.times[id(kernel)] = KernelTime(kernel.name, kernel.kind, "compute", 0.0,
                                            work + launch, compute, memory, 0.0, launch,
                                            flops, kernel.bytes, path, term=term)
        return self.times[id(kernel)]

    def _vector_flops(self, e) -> float:
        """Of a matmul row's FLOPs, those on the vector units (its ``vector_flops`` column)."""
        rule = column(_row(e.eqn), "vector_flops")
        if rule is None:
            return 0.0
        ins = [a for a in map(_typed, e.eqn.invars) if a is not None]
        return float(rule(ins, [_typed(v) for v in e.eqn.outvars], **e.params))

    def _collective(self, e, body) -> tuple:
        """(seconds, mesh axes) of one collective: :func:`estimate` for its group (device
        0's: the mesh's devices numbered row-major, where the machine is given or the
        mesh spans several nodes)."""
        sizes, params = body.sizes[id(e)], e.params
        axes = params.get("axes", params.get("axis_name", ()))
        axes = tuple(map(str, (axes,) if isinstance(axes, str) else axes))
        family = column(_row(e.eqn), "collective_family")
        unknown = [a for a in axes if a not in sizes]
        if unknown:
            raise ValueError(f"{_primitive_name(e)} over axis {unknown[0]!r}, whose size the "
                             f"prediction does not know (known: {sizes or 'none'}): pass "
                             f"axis_env=[({unknown[0]!r}, size)]")
        groups = params.get("axis_index_groups")
        p = len(groups[0]) if groups else math.prod(sizes[a] for a in axes)
        perm = tuple((int(s), int(d)) for s, d in params.get("perm", ()))
        nbytes = sum(a.nbytes for a in map(_typed, e.eqn.invars) if a is not None)
        if p <= 1 or family is None or (perm and all(s == d for s, d in perm)) \
                or (family == "collective_permute" and not perm):
            return 0.0, axes
        devices = None if groups else self._group(axes, sizes)
        key = (family, nbytes, p, devices, perm or None, id(self.topology), self.hw.name)
        if key not in self.cache:
            self.cache[key] = estimate(family, nbytes, p, hardware=self.hw,
                                       topology=self.topology, devices=devices,
                                       perm=list(perm) if perm else None).time_s
        self.seen.setdefault(id(e.eqn), (_primitive_name(e), axes, nbytes, self.cache[key]))
        return self.cache[key], axes

    def _group(self, axes, sizes):
        """Device 0's group over ``axes``, the mesh's devices numbered row-major, where
        the machine is given or the mesh spans more than one node (or TPU pod); else None
        (the preset's own group of that size)."""
        total, hw = math.prod(sizes.values()) if sizes else 1, self.hw
        most = hw.node_size if hw.torus_rank is None else hw.pod_size
        if self.topology is None and (most is None or total <= most):
            return None
        names = list(sizes)
        ids = [0]
        for a in axes:
            stride = math.prod(sizes[b] for b in names[names.index(a) + 1:])
            ids = [i + k * stride for k in range(sizes[a]) for i in ids]
        return tuple(sorted(ids))

    # -- loops and conditionals -----------------------------------------------------------

    def _block(self, e, body, depth) -> _Block:
        if id(e.eqn) not in self.blocks:
            eqn, sizes = e.eqn, axes_in(e.eqn, body.sizes[id(e)])
            kind, bodies = nested(eqn)
            runs = self.walker.bodies(eqn, sizes)
            label = self.walker._heading(eqn, kind, len(bodies))
            phase = body.phase[id(e)]
            if kind == "branches":
                block = self._branches(runs, sizes, phase, depth, label)
            else:
                block = self._loop(eqn, kind, runs, sizes, phase, depth, label)
            self.blocks[id(e.eqn)] = block
        return self.blocks[id(e.eqn)]

    def _branches(self, runs, sizes, phase, depth, label) -> _Block:
        """A conditional: the branches the walk takes, each weighted by how often it runs."""
        out, seconds, axes = _Sum(), 0.0, set()
        for program, weight in runs:
            streams, part = _Streams(), _Sum()
            self.run(self.body(program, sizes, phase), streams, part, None, depth)
            end = streams.end()
            part.terms["communication"] += end - part.total
            seconds += weight * end
            out.add(part, weight)
            axes |= set(streams.comm)
        return _Block(seconds, out, frozenset(axes), label)

    def _loop(self, eqn, kind, runs, sizes, phase, depth, label) -> _Block:
        """A scan, or a while loop (its predicate, then its body, each trip; the
        predicate once more at the end): the iterations at their steady period."""
        if kind == "repeat":
            program, n = runs[0] if runs else (eqn.params["jaxpr"], 0)
            body = self.body(program, sizes, phase)
            skip, carry = scan_split(eqn)
            parts = [(body, body.invars[skip:skip + carry], body.outvars[:carry])]
            return self._iterate(parts, n, depth, label, None)
        cond = self.body(eqn.params["cond_jaxpr"], sizes, phase)
        body = self.body(eqn.params["body_jaxpr"], sizes, phase)
        n = runs[1][1] if len(runs) > 1 else 0
        parts = [(cond, cond.invars[int(eqn.params["cond_nconsts"]):], None),
                 (body, body.invars[int(eqn.params["body_nconsts"]):], body.outvars)]
        return self._iterate(parts, n, depth, label, cond)

    def _iteration(self, parts, streams, total, carry, depth) -> list:
        """One trip of a loop on ``streams`` (its carry ready at the times ``carry``
        says): the times its new carry is ready."""
        for body, carry_in, carry_out in parts:
            for v, t in zip(carry_in, carry):
                streams.ready[v] = t
            self.run(body, streams, total, None, depth + 1)
            if carry_out is not None:
                carry = [streams.at(body, v) for v in carry_out]
        return carry

    def _iterate(self, parts, n, depth, label, last) -> _Block:
        """``n`` trips: the first, the second as far as the first lets it start, the rest
        at the period between them (at least the second's own work); ``last``, a body run
        once more at the end (a while loop's predicate)."""
        streams, first, second = _Streams(), _Sum(), _Sum()
        carry = self._iteration(parts, streams, first, [], depth) if n else []
        end = streams.end()
        period = 0.0
        if n > 1:
            self._iteration(parts, streams, second, carry, depth)
            period = max(streams.end() - end, second.busy)
        length = end + max(n - 1, 0) * period
        out, axes = _Sum(), set(streams.comm)
        out.add(first, min(n, 1))
        out.add(second, max(n - 1, 0))
        if last is not None:
            tail, once = _Streams(), _Sum()
            self.run(last, tail, once, None, depth + 1)
            length += tail.end()
            out.add(once)
            axes |= set(tail.comm)
        out.terms["communication"] = 0.0
        out.terms["communication"] = max(0.0, length - out.total)
        ticks, idle = self.pipeline or (0, 0)
        if depth == 0 and idle and n == ticks:           # the pipeline's idle ticks: a
            for term in out.terms:                       # share of its time (what it
                out.terms[term] *= 1 - idle / n          # computes there, it computes)
            out.terms["bubble"] = idle / n * length
        return _Block(length, out, frozenset(axes), label)


def _stored(v, body):
    """The type of an operand as a product reads it: an FP8 buffer's, where the operand is
    a view of one (Transformer Engine's FP8 GEMMs, XLA's rewrite of a dequantized dot)."""
    own, stored = _typed(v), _typed(body.base(v))
    return stored if stored is not None and stored.dtype.name.startswith("float8") else own


def predict(program, hardware=None, axis_env=None, topology=None, *, overlap=True,
            while_trips=None, taken=None, device=None, walker=None, precision=None,
            pipeline=None, accumulation_fusion=False, collective_times=None,
            blocking=()) -> Prediction:
    """The predicted time of ``program`` (a jaxpr or simpmd program; per device inside a
    shard_map or pmap) on one device of ``hardware``, called once from Python: see the
    module's docstring.

    ``axis_env`` gives mapped axes' sizes as for the roofline (slowest first: the mesh's
    devices are numbered row-major), ``topology`` the machine they sit on; ``overlap``
    lets collectives run beside independent compute. The program is read as
    :class:`~simpmd.cost.walk.Walker` reads it (``walker``, or one made from
    ``while_trips``, ``taken`` and ``device``). ``precision`` ('fp8', 'bf16', ...) is the
    path of every product of a weight; ``pipeline=(ticks, idle)`` says that a loop of
    ``ticks`` iterations, not inside another, is a pipeline of which ``idle`` ticks are its
    bubble; ``accumulation_fusion`` adds gradients into their accumulators where they are
    computed, as Megatron-LM does (:mod:`simpmd.cost.fusion`); ``collective_times`` a dict
    of collectives' times, shared between predictions; ``blocking`` names collectives
    (``"all_to_all"``) that the compute stream issues in program order and waits for, as
    a framework that runs them synchronously does, where ``overlap`` would let them run
    beside independent compute."""
    hw = _hardware_of(hardware)
    walker = walker or Walker(program, _axis_sizes(axis_env), while_trips=while_trips,
                              taken=taken, device=device)
    p = _Predictor(hw, walker, topology, overlap, precision, pipeline, collective_times,
                   accumulation_fusion, blocking)
    streams, total, rows = _Streams(), _Sum(), []
    p.run(p.body(program, walker.sizes, "forward"), streams, total, rows, 0)
    makespan = streams.end()
    total.terms["communication"] += makespan - total.total
    total.terms["launch"] += hw.dispatch_s
    return Prediction(hw.name, makespan + hw.dispatch_s, dict(total.terms), rows, overlap,
                      list(dict.fromkeys(walker.notes)), total.collectives, total.flops,
                      list(p.seen.values()))
