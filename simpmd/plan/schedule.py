"""How long one device takes to run its step: the program scheduled on its streams.

A device runs its program's kernels one after another on one compute stream, and each
collective on a stream of the mesh axes it spans (NCCL's communicators, XLA's async
collectives), as soon as its operands are ready: so a collective overlaps whatever
compute does not need its result, and the compute stream waits for the rest. Walking the
program in order with the time each value becomes ready gives the step's time, and what
the compute stream did with it:

* a kernel is a matrix product (``dot_general``, a fused attention), or a run of the
  elementwise equations between two of them, fused into one pass over memory as XLA and
  Megatron's fused kernels do (its bytes are what enters the run and what leaves it); a
  kernel takes the larger of its FLOPs at the chip's sustained matmul rate and its bytes
  at the sustained HBM bandwidth, and at least the floor of a kernel launch;
* a ``scan`` runs its body ``length`` times; two iterations are scheduled, so that a
  collective whose operands come from the loop's inputs (the next layer's FSDP gather)
  overlaps the iteration before it, and the loop takes its first iteration plus
  ``length - 1`` times the steady period;
* time the compute stream waits is *exposed communication*; matrix products a checkpoint
  computes again are *recomputation*; other matrix products are *compute*, the fused runs
  (recomputed ones included, as a fused kernel's backward recomputes its intermediates)
  *memory*; the pipeline's idle ticks are its *bubble*.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import math

from ..cost.network import estimate
from ..cost.walk import _is_var, _nbytes, _primitive_name, _row, _typed

MATMUL = frozenset({"dot_general", "flash_attention", "flash_attention_bwd"})
FREE = frozenset({"pvary", "axis_index", "iota", "reshape", "squeeze", "expand_dims",
                  "broadcast_in_dim", "name", "stop_gradient", "optimization_barrier"})
OWN_KERNEL = frozenset({"gather", "scatter", "scatter-add", "dynamic_slice",
                        "dynamic_update_slice"})
CATEGORIES = ("compute", "memory", "recompute", "communication", "bubble")


@dataclass
class Tally:
    """Seconds of the compute stream by what it did; they add up to the time taken."""

    compute: float = 0.0
    memory: float = 0.0
    recompute: float = 0.0
    communication: float = 0.0       # waiting for a collective's result
    bubble: float = 0.0              # pipeline ticks with nothing to do
    collectives: float = 0.0         # every collective's time, hidden or not (not a part
                                     # of the total: they run beside the compute stream)

    def add(self, other, times=1.0):
        for c in CATEGORIES + ("collectives",):
            setattr(self, c, getattr(self, c) + times * getattr(other, c))

    @property
    def busy(self) -> float:
        return self.compute + self.memory + self.recompute

    @property
    def total(self) -> float:
        return self.busy + self.communication + self.bubble

    def as_dict(self) -> dict:
        return {c: getattr(self, c) for c in CATEGORIES}

    def scaled(self, factor):
        out = Tally()
        out.add(self, factor)
        return out


@dataclass
class Costing:
    """What prices one device's equations: the chip (a :class:`~simpmd.cost.Hardware`),
    the matmul precision path (``"bf16"``, ``"fp8"``), the mesh's axes and sizes, slowest
    first, and the machine the mesh's devices sit on (ids row-major over the mesh)."""

    hardware: object
    path: str
    sizes: dict
    topology: object = None
    collectives: dict = field(default_factory=dict)     # what each collective costs
    seen: list = field(default_factory=list)            # (op, axes, bytes, seconds)
    pipeline_ticks: int = 0       # a top-level scan this long is the pipeline's ticks,
    bubble_ticks: int = 0         # of which this many are its bubble
    groups: dict = field(default_factory=dict)          # axes -> device 0's group

    def kernel_s(self, flops, nbytes, path=None) -> float:
        hw = self.hardware
        compute = flops / hw.sustained_matmul_flops(path or self.path) if flops else 0.0
        return max(compute, nbytes / hw.sustained_hbm_bandwidth, hw.kernel_launch_s)

    def group(self, axes) -> list:
        """Device 0's group over ``axes``: the ids it shares the collective with."""
        if axes in self.groups:
            return self.groups[axes]
        names = list(self.sizes)
        strides = {a: math.prod(self.sizes[b] for b in names[i + 1:]) for i, a in enumerate(names)}
        ids = [0]
        for a in axes:
            ids = [i + k * strides[a] for k in range(self.sizes[a]) for i in ids]
        self.groups[axes] = sorted(ids)
        return self.groups[axes]

    def collective_s(self, op, axes, nbytes, perm=None) -> float:
        members = self.group(axes)
        key = (op, tuple(members), nbytes, perm)
        if key not in self.collectives:
            seconds = 0.0
            if len(members) > 1 and nbytes:
                seconds = estimate(op, nbytes, len(members), hardware=self.hardware,
                                   topology=self.topology, devices=members,
                                   perm=list(perm) if perm else None).time_s
            self.collectives[key] = seconds
        return self.collectives[key]


# -- one program, scheduled -------------------------------------------------------------------

def _axes_of(eqn) -> tuple:
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    return tuple(map(str, (axes,) if isinstance(axes, str) else axes))


def _kind(eqn) -> str:
    name = _primitive_name(eqn)
    if name == "scan":
        return "scan"
    if name in ("remat2", "checkpoint", "pjit", "jit", "closed_call", "cond"):
        return "inline"
    if name == "while":
        raise ValueError("the planner's schedule cannot time a while_loop (its trip count is "
                         "not in the program): write the loop as a scan")
    row = _row(eqn, name)
    if getattr(row, "collective", False) and getattr(row, "op", None) != "axis_index":
        return "collective"
    if name in MATMUL:
        return "matmul"
    if name in FREE or name in OWN_KERNEL:
        return "free" if name in FREE else "own"
    return "fused"


class _Streams:
    """The clock of each stream and the time each value is ready."""

    def __init__(self):
        self.compute = 0.0
        self.comm: dict = {}
        self.ready: dict = {}

    def at(self, v) -> float:
        return self.ready.get(v, 0.0) if _is_var(v) else 0.0

    def run(self, seconds, inputs, outputs, tally, category):
        start = max([self.compute] + [self.at(v) for v in inputs])
        tally.communication += start - self.compute
        setattr(tally, category, getattr(tally, category) + seconds)
        self.compute = start + seconds
        for v in outputs:
            self.ready[v] = self.compute


def _category(eqns, default) -> str:
    """A product computed again is recomputation; a fused run's, part of its backward
    kernel (as a fused kernel recomputes its intermediates), memory."""
    again = any(getattr(e, "phase", "") == "recompute" for e in eqns)
    return "recompute" if again and default == "compute" else default


ACCUMULATED = frozenset({"dot_general", "scatter-add", "scatter", "scan", "remat2", "pad"})


def _accumulates(e, producer) -> bool:
    """An addition into a gradient produced by a matmul, a scatter, a loop or a checkpoint
    (a slice's gradient, padded or scattered into zeros): done in
    place by the producer (Megatron's gradient-accumulation fusion adds the weight
    gradient into its buffer inside the GEMM; XLA adds into a scatter's operand)."""
    return _primitive_name(e) in ("add_any", "add") and any(
        _is_var(v) and producer.get(v) in ACCUMULATED for v in e.invars)


def _operand_of_matmul(e, readers) -> bool:
    """A slice read only by matrix products: fused into their operand load (XLA fuses a
    dynamic-slice of weights into the dot that reads it)."""
    return _primitive_name(e) in ("gather", "dynamic_slice") and all(
        set(readers.get(v, ["x"])) == {"matmul"} for v in e.outvars)


def _regions(eqns) -> list:
    """The program's equations as kernels: ``(kind, [equations])``, each run of fused
    equations between two other kernels one kernel."""
    producer = {v: _primitive_name(e) for e in eqns for v in e.outvars}
    readers: dict = {}
    for e in eqns:
        for v in e.invars:
            if _is_var(v):
                readers.setdefault(v, []).append(_kind(e))
    out, run = [], []
    for e in eqns:
        kind = "free" if _accumulates(e, producer) or _operand_of_matmul(e, readers) \
            else _kind(e)
        if kind == "fused":
            run.append(e)
            continue
        if run and kind != "free":
            out.append(("fused", run))
            run = []
        out.append((kind, [e]))
    if run:
        out.append(("fused", run))
    return out


def _fused_cost(run, readers) -> tuple:
    """(FLOPs, bytes) of a fused run: what enters it from outside and what leaves it
    (``readers``: each variable's reading equations' ids; the program's results, -1)."""
    made = {v for e in run for v in e.outvars}
    inside = {id(e) for e in run}
    entering = {v for e in run for v in e.invars if _is_var(v) and v not in made}
    leaving = {v for v in made if readers.get(v, set()) - inside}
    flops = 0
    for e in run:
        row = _row(e, _primitive_name(e))
        if row is not None and row.cost is not None:
            ins = [a for a in map(_typed, e.invars) if a is not None]
            outs = [a for a in map(_typed, e.outvars) if a is not None]
            flops += row.cost(ins, outs, **e.params)[0]
    return flops, sum(_nbytes(_typed(v)) for v in entering | leaving)


def schedule(program, costing: Costing, streams: _Streams | None = None, depth: int = 0):
    """Run ``program``'s equations on ``streams`` (fresh ones by default): returns the
    streams (their clocks and values' ready times) and the compute stream's
    :class:`Tally`."""
    streams = streams or _Streams()
    eqns = list(getattr(getattr(program, "jaxpr", program), "eqns", program))
    outvars = getattr(getattr(program, "jaxpr", program), "outvars", [])
    reads = _reads_after(eqns, outvars)
    tally = Tally()
    for kind, group in _regions(eqns):
        _place(kind, group, costing, streams, tally, reads, depth)
    return streams, tally


def _reads_after(eqns, outvars) -> dict:
    """Each variable's readers: the ids of the equations that read it, -1 for the result."""
    readers: dict = {}
    for e in eqns:
        for v in e.invars:
            if _is_var(v):
                readers.setdefault(v, set()).add(id(e))
    for v in outvars:
        if _is_var(v):
            readers.setdefault(v, set()).add(-1)
    return readers


def _place(kind, group, costing, streams, tally, reads, depth=0):
    e = group[0]
    if kind == "free":
        when = max([streams.at(v) for v in e.invars] or [0.0])
        for v in e.outvars:
            streams.ready[v] = when
    elif kind == "collective":
        axes = _axes_of(e)
        nbytes = sum(_nbytes(_typed(v)) for v in e.invars if _typed(v) is not None)
        perm = tuple((int(s), int(d)) for s, d in e.params.get("perm", ())) or None
        seconds = costing.collective_s(_primitive_name(e), axes, nbytes, perm)
        start = max([streams.comm.get(axes, 0.0)] + [streams.at(v) for v in e.invars])
        streams.comm[axes] = start + seconds
        tally.collectives += seconds
        costing.seen.append((_primitive_name(e), axes, nbytes, seconds))
        for v in e.outvars:
            streams.ready[v] = start + seconds
    elif kind in ("matmul", "own"):
        ins = [a for a in map(_typed, e.invars) if a is not None]
        outs = [a for a in map(_typed, e.outvars) if a is not None]
        flops, nbytes = _row(e, _primitive_name(e)).cost(ins, outs, **e.params)
        path = "bf16" if _primitive_name(e).startswith("flash") else None
        seconds = costing.kernel_s(flops if kind == "matmul" else 0, nbytes, path)
        streams.run(seconds, e.invars, e.outvars, tally,
                    _category(group, "compute" if kind == "matmul" else "memory"))
    elif kind == "fused":
        flops, nbytes = _fused_cost(group, reads)
        if nbytes or flops:
            seconds = costing.kernel_s(0, nbytes)
            inputs = [v for x in group for v in x.invars]
            streams.run(seconds, inputs, [v for x in group for v in x.outvars], tally,
                        _category(group, "memory"))
        else:
            for x in group:
                for v in x.outvars:
                    streams.ready[v] = max([streams.at(u) for u in x.invars] or [0.0])
    elif kind == "scan":
        _place_scan(e, costing, streams, tally, depth)
    else:
        _place_inline(e, costing, streams, tally, depth)


def _body(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return getattr(eqn.params[key], "jaxpr", eqn.params[key])
    if "branches" in eqn.params:
        return None
    raise ValueError(f"no body in {eqn}")


def _place_inline(eqn, costing, streams, tally, depth):
    """A checkpoint, a jit or a cond: its body's equations, in place (a cond: its
    costliest branch, as the walker prices a branch it cannot see the value of)."""
    bodies = [getattr(b, "jaxpr", b) for b in eqn.params["branches"]] if "branches" in \
        eqn.params else [_body(eqn)]
    best = None
    for body in bodies:
        inner = _Streams()
        inner.compute, inner.comm = streams.compute, dict(streams.comm)
        skip = len(eqn.invars) - len(body.invars)
        for outer, v in zip(eqn.invars[skip:], body.invars):
            inner.ready[v] = streams.at(outer)
        inner, t = schedule(body, costing, inner, depth)
        if best is None or inner.compute > best[0].compute:
            best = (inner, t, body)
    inner, t, body = best
    tally.add(t)
    streams.compute, streams.comm = inner.compute, inner.comm
    for outer, v in zip(eqn.outvars, body.outvars):
        streams.ready[outer] = inner.at(v)


def _place_scan(eqn, costing, streams, tally, depth):
    """A scan: two iterations scheduled (the second's carry ready when the first's is),
    the rest at the steady period; the loop runs as one block of the compute stream."""
    body = _body(eqn)
    n = int(eqn.params["length"])
    n_consts, n_carry = int(eqn.params["num_consts"]), int(eqn.params["num_carry"])
    inner = _Streams()
    begin = max([streams.compute] + [streams.at(v) for v in eqn.invars])
    inner.compute = 0.0
    carry_vars = body.invars[n_consts:n_consts + n_carry]
    one, t1 = schedule(body, costing, inner, depth + 1)
    end1 = max([one.compute] + list(one.comm.values()))
    if n > 1:
        second = _Streams()
        second.compute, second.comm = one.compute, dict(one.comm)
        for v, out in zip(carry_vars, body.outvars[:n_carry]):
            second.ready[v] = one.at(out)
        second, t2 = schedule(body, costing, second, depth + 1)
        period = max([second.compute] + list(second.comm.values())) - end1
    else:
        period, t2 = 0.0, t1
    period = max(period, t2.busy)
    length = end1 + (n - 1) * period
    steady = Tally()
    steady.add(t2, n - 1)
    steady.add(t1)
    steady.communication = max(0.0, length - steady.busy)
    if depth == 0 and n == costing.pipeline_ticks and costing.bubble_ticks:
        idle = costing.bubble_ticks / n              # ticks a stage has nothing to do in
        steady = steady.scaled(1 - idle)
        steady.bubble = idle * length
    tally.communication += begin - streams.compute
    tally.add(steady)
    streams.compute = begin + length
    for v in eqn.outvars:
        streams.ready[v] = streams.compute
