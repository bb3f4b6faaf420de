"""How long a program will take on a machine: the roofline with what the hardware really does.

The Scaling Book's roofline (:class:`~simpmd.cost.roofline.Roofline`'s ``time_s``) prices
every equation at peak rates as if each made a round trip to HBM. A real chip differs in
four ways, each modelled here from published numbers (the preset's ``citations``):

* **precision**: a dot runs on the matrix-unit path its types and ``precision`` choose
  (:mod:`simpmd.cost.precision`: TF32 for float32 on an H100, one bf16 pass on a TPU);
* **fusion**: XLA runs chains of equations as one kernel (:mod:`simpmd.cost.fusion`), which
  reads its inputs once and writes only what later kernels read;
* **sustained rates**: large matmuls reach a fraction of the peak, streaming kernels a
  fraction of the HBM bandwidth; every kernel costs at least a launch, and a call from
  Python a dispatch;
* **overlap**: a collective runs beside the compute that does not depend on it, as XLA's
  asynchronous collectives (and Megatron's overlap) do; ``overlap=False`` runs everything
  one after another.

Each kernel takes the larger of its compute time and its memory time (at sustained rates),
and at least the launch floor; kernels run one after another on the compute stream,
collectives on their own stream as soon as their operands are ready. The prediction's
:attr:`Prediction.terms` (compute, memory, exposed communication, launch) add up to its
time, and the largest names what bounds the program.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import heapq
import math

from .fusion import Eqn, Kernel, fuse, ref
from .network import _hardware_of, _seconds, estimate
from .precision import eqn_path
from .walk import (MATMULS, _axis_sizes, _equation_list, _is_var, _primitive_name, _row, _typed)

CALLS = {"pjit": "jaxpr", "jit": "jaxpr", "closed_call": "call_jaxpr", "core_call": "call_jaxpr",
         "custom_jvp_call": "call_jaxpr", "custom_vjp_call": "call_jaxpr",
         "custom_vjp_call_jaxpr": "fun_jaxpr", "remat2": "jaxpr", "checkpoint": "jaxpr",
         "remat": "jaxpr", "shard_map": "jaxpr", "xla_pmap": "call_jaxpr"}
PER_DEVICE = ("shard_map", "xla_pmap")       # bodies whose operands are one device's shards


@dataclass(frozen=True)
class KernelTime:
    """One kernel of the prediction: what it is, when it runs (``start_s``..``end_s`` on
    its ``stream``, ``'compute'`` or ``'communication'``) and its parts."""

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

    @property
    def time_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def terms(self) -> dict:
        """The kernel's seconds by what bounds them (a collective's are all communication)."""
        if self.inner:
            return dict(self.inner)
        if self.comm_s:
            return {"communication": self.comm_s}
        if self.compute_s >= self.memory_s:
            return {"compute": self.compute_s, "launch": self.launch_s}
        return {"memory": self.memory_s, "launch": self.launch_s}


@dataclass
class Prediction:
    """The predicted time of a program on one device of ``hardware``, and its parts.

    ``terms`` holds seconds of compute (kernels bound by their arithmetic), memory
    (kernels bound by HBM traffic), communication (the part of the collectives no compute
    hides) and launch (kernel floors and the call from Python); they add up to ``time_s``.
    ``kernels`` lists each kernel with its start and end (what a timeline draws)."""

    hardware: str
    time_s: float = 0.0
    terms: dict = field(default_factory=dict)
    kernels: list = field(default_factory=list)
    overlap: bool = True
    notes: list = field(default_factory=list)
    communication_s: float = 0.0          # every collective's time, hidden or not

    @property
    def bound(self) -> str:
        """The largest term: ``'compute'``, ``'memory'``, ``'communication'`` or ``'launch'``."""
        return max(self.terms, key=self.terms.get) if self.time_s > 0 else ""

    @property
    def fused_bytes(self) -> int:
        return sum(k.bytes for k in self.kernels)

    def __str__(self):
        parts = ", ".join(f"{name} {_seconds(t) if t else '0 s'}" for name, t in self.terms.items())
        head = (f"Predicted on {self.hardware}: {_seconds(self.time_s) if self.time_s else '0 s'}"
                f" ({parts}), {self.bound}-bound; {len(self.kernels)} kernel(s)"
                f"{'' if self.overlap else ', no overlap'}")
        rows = [f"  {k.name:24s} {k.kind:10s} {_seconds(k.time_s) if k.time_s else '0':>10s}"
                f"{'  ' + k.path if k.path else ''}" for k in self.kernels[:40]]
        more = [f"  ... {len(self.kernels) - 40} more"] if len(self.kernels) > 40 else []
        return "\n".join([head] + rows + more + [f"  note: {n}" for n in self.notes])

    def __repr__(self):
        return (f"<Prediction on {self.hardware}: {_seconds(self.time_s) if self.time_s else '0 s'},"
                f" {self.bound}-bound>")


class _Flat:
    """A program's equations as one device runs them: calls inlined (XLA inlines them),
    loops and conditionals as blocks with their own predictions."""

    def __init__(self, hw, topology, while_trips, overlap):
        self.hw, self.topology, self.while_trips, self.overlap = hw, topology, while_trips, overlap
        self.eqns, self.alias, self.sizes, self.blocks, self.notes = [], {}, {}, {}, []
        self.scopes = 0

    def add(self, program, sizes, scope=0):
        for eqn in _equation_list(program):
            name = _primitive_name(eqn)
            key = CALLS.get(name)
            if key is not None and key in eqn.params:
                self._inline(eqn, name, key, sizes, scope)
            elif name in ("scan", "while", "cond"):
                self._block(eqn, name, sizes, scope)
            else:
                self.eqns.append((eqn, scope))
                self.sizes[id(eqn)] = sizes

    def _inline(self, eqn, name, key, sizes, scope):
        inner = eqn.params[key]
        jaxpr = getattr(inner, "jaxpr", inner)
        here = dict(sizes)
        if name == "shard_map" and "mesh" in eqn.params:
            here.update(_axis_sizes(eqn.params["mesh"]))
        if name == "xla_pmap":
            here[str(eqn.params["axis_name"])] = int(eqn.params["axis_size"])
        self.scopes += 1
        inner_scope = self.scopes
        if name not in PER_DEVICE:                     # same shapes: the caller's values
            for i, o in zip(jaxpr.invars, eqn.invars):
                self.alias[ref(i, inner_scope)] = ref(o, scope)
        for o, i in zip(eqn.outvars, jaxpr.outvars):
            self.alias[ref(o, scope)] = ref(i, inner_scope)
        self.add(jaxpr, here, inner_scope)

    def _block(self, eqn, name, sizes, scope):
        """A loop or conditional: one block whose time is its body's prediction times the
        trips (the costliest branch of a cond)."""
        if name == "scan":
            trips, bodies = int(eqn.params["length"]), [eqn.params["jaxpr"]]
        elif name == "while":
            trips, bodies = self._trips(eqn), [eqn.params["body_jaxpr"], eqn.params["cond_jaxpr"]]
        else:
            trips, bodies = 1, list(eqn.params["branches"])
        subs = [predict_body(b, self.hw, sizes, self.topology, self.while_trips, self.overlap)
                for b in bodies]
        sub = max(subs, key=lambda p: p.time_s) if name == "cond" else _merge(subs)
        if name == "cond" and len(subs) > 1:
            self.notes.append("a cond on shapes costs its costliest branch")
        self.notes += sub.notes
        self.eqns.append((eqn, scope))
        self.sizes[id(eqn)] = sizes
        self.blocks[id(eqn)] = (sub, trips)

    def _trips(self, eqn):
        if callable(self.while_trips):       # the walk's count (simpmd.cost.walk.Walker.trips)
            return int(self.while_trips(eqn))
        if self.while_trips is None:
            raise ValueError(
                "a while_loop's trip count is not known from shapes: pass while_trips=N (the "
                "number of iterations) to the roofline or the prediction; a fori_loop with "
                "constant bounds traces to a scan, which needs none")
        return int(self.while_trips)


def _merge(predictions):
    """Predictions run one after another (a while loop's body and its condition)."""
    out = Prediction(predictions[0].hardware, overlap=predictions[0].overlap)
    for p in predictions:
        out.time_s += p.time_s
        out.communication_s += p.communication_s
        for k, v in p.terms.items():
            out.terms[k] = out.terms.get(k, 0.0) + v
        out.kernels += p.kernels
    return out


def _flops_of(eqn, hw):
    """(matmul FLOPs, other FLOPs, path) of one equation, from its row's cost column."""
    from .roofline import _equation_cost          # roofline.py imports the walk, as we do
    name = _primitive_name(eqn)
    flops = _equation_cost(eqn, name, hw, 0).flops
    if name in MATMULS:
        return flops, 0, eqn_path(hw, eqn, [_typed(v) for v in eqn.invars])
    return 0, flops, ""


def _kernel_parts(kernel: Kernel, flat: _Flat):
    """(compute_s, memory_s, comm_s, flops, path) of one kernel at sustained rates."""
    hw = flat.hw
    if kernel.kind == "collective":
        comm = sum(_collective_s(e, flat) for e in kernel.eqns)
        return 0.0, 0.0, comm, 0.0, ""
    compute, flops, path = 0.0, 0.0, ""
    for eqn in kernel.eqns:
        mm, other, p = _flops_of(eqn, hw)
        path = path or p
        compute += (mm / hw.sustained_matmul_flops(p) if mm else 0.0) + other / hw.vector_flops
        flops += mm + other
    return compute, kernel.bytes / hw.sustained_hbm_bandwidth, 0.0, flops, path


def _collective_s(eqn, flat: _Flat) -> float:
    from .roofline import _collective_cost
    sizes = flat.sizes[id(eqn.eqn)]
    row = _row(eqn, _primitive_name(eqn))
    op = getattr(row, "op", None) if row is not None else _primitive_name(eqn)
    devices = _group_devices(eqn, sizes, flat.hw, flat.topology)
    if devices is None:
        return _collective_cost(eqn, row, sizes, flat.hw, flat.topology)[2]
    nbytes = sum(a.nbytes for a in map(_typed, eqn.invars) if a is not None)
    return estimate(op, nbytes, devices=devices, hardware=flat.hw).time_s


def _group_devices(eqn, sizes, hw, topology):
    """The device ids of the first group of a collective over mesh axes, where the mesh
    (its axes in order, the last varying fastest) spans several nodes; else None."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    axes = tuple(map(str, (axes,) if isinstance(axes, str) else axes))
    total = math.prod(sizes.values()) if sizes else 1
    most = hw.node_size if hw.torus_rank is None else hw.pod_size
    if topology is not None or most is None or total <= most or not axes or \
            eqn.params.get("axis_index_groups") or any(a not in sizes for a in axes):
        return None
    names = list(sizes)
    strides = {a: math.prod(sizes[b] for b in names[names.index(a) + 1:]) for a in names}
    ids = [0]
    for a in axes:                        # row-major over the axes named, as the members
        ids = [i + k * strides[a] for i in ids for k in range(sizes[a])]
    return ids


def _schedule(kernels, flat: _Flat, made_by):
    """Start and end of each kernel: compute kernels one after another on the compute
    stream, of those ready when it is free the first in program order; collectives on
    their own stream in the order they become ready, each as soon as its operands are
    (everything on the compute stream, in program order, when overlap is off)."""
    n_k = len(kernels)
    deps = [{made_by[v] for v in k.reads if v in made_by} - {n} for n, k in enumerate(kernels)]
    users = [[] for _ in range(n_k)]
    for n, d in enumerate(deps):
        for m in d:
            users[m].append(n)
    timed = [_timed(k, flat) for k in kernels]
    side = [bool(t.comm_s and not t.inner and flat.overlap) for t in timed]
    queue = _Ready(side)
    left = [len(d) for d in deps]
    for n in range(n_k):
        if not left[n]:
            queue.add(0.0, n)
    ends, rows = [0.0] * n_k, [None] * n_k
    free = {"compute": 0.0, "communication": 0.0}
    for _ in range(n_k):
        at, n = queue.pop(free["compute"])
        stream = "communication" if side[n] else "compute"
        start = max(at, free[stream])
        ends[n] = free[stream] = start + timed[n].end_s
        rows[n] = KernelTime(**{**timed[n].__dict__, "stream": stream, "start_s": start,
                                "end_s": ends[n]})
        for m in users[n]:
            left[m] -= 1
            if not left[m]:
                queue.add(max(ends[d] for d in deps[m]), m)
    return rows


class _Ready:
    """Kernels whose operands are ready, by when: collectives first when ready before the
    compute stream is next free (in time order); then compute kernels ready by then, in
    program order; else whatever is ready soonest."""

    def __init__(self, side):
        self.side, self.comm, self.later, self.now = side, [], [], []

    def add(self, at, n):
        heapq.heappush(self.comm if self.side[n] else self.later, (at, n))

    def pop(self, now):
        while self.later and self.later[0][0] <= now:
            at, n = heapq.heappop(self.later)
            heapq.heappush(self.now, (n, at))
        if self.comm and (self.comm[0][0] <= now or not (self.now or self.later)):
            return heapq.heappop(self.comm)
        if self.now:
            n, at = heapq.heappop(self.now)
            return at, n
        if self.comm and self.comm[0][0] <= self.later[0][0]:
            return heapq.heappop(self.comm)
        return heapq.heappop(self.later)


def _timed(kernel: Kernel, flat: _Flat) -> KernelTime:
    """The kernel's parts, its duration as ``end_s`` (from 0)."""
    eqn = kernel.eqns[0].eqn
    if len(kernel.eqns) == 1 and id(eqn) in flat.blocks:
        sub, trips = flat.blocks[id(eqn)]
        inner = tuple((k, trips * v) for k, v in sub.terms.items())
        return KernelTime(f"{kernel.name} x{trips}", "loop body", "compute", 0.0,
                          trips * sub.time_s, inner=inner,
                          comm_s=trips * sub.communication_s)
    compute, memory, comm, flops, path = _kernel_parts(kernel, flat)
    if comm:
        return KernelTime(kernel.name, kernel.kind, "", 0.0, comm, comm_s=comm)
    work = max(compute, memory)
    launch = max(0.0, flat.hw.kernel_launch_s - work)
    return KernelTime(kernel.name, kernel.kind, "", 0.0, work + launch, compute, memory, 0.0,
                      launch, flops, kernel.bytes, path)


def predict_body(program, hardware, sizes=None, topology=None, while_trips=None, overlap=True):
    """The prediction of a program without the call from Python (a loop's body)."""
    hw = _hardware_of(hardware)
    flat = _Flat(hw, topology, while_trips, overlap)
    flat.add(program, dict(sizes or {}))
    inner = getattr(program, "jaxpr", program)
    outs = list(getattr(inner, "outvars", ()))
    kernels = _kernels(flat, outs)
    made_by = {v: n for n, k in enumerate(kernels) for e in k.eqns for v in e.outvars}
    rows = _schedule(kernels, flat, made_by)
    out = Prediction(hw.name, overlap=overlap, kernels=rows, notes=list(dict.fromkeys(flat.notes)))
    makespan = max((r.end_s for r in rows), default=0.0)
    on_compute = [r for r in rows if r.stream == "compute"]
    out.terms = {name: sum(r.terms.get(name, 0.0) for r in on_compute)
                 for name in ("compute", "memory", "communication", "launch")}
    out.terms["communication"] += makespan - sum(r.time_s for r in on_compute)
    out.communication_s = sum(r.comm_s for r in rows)
    out.time_s = makespan
    return out


def _kernels(flat: _Flat, outs):
    """The fused kernels of the flat program, with the calls' renamed variables resolved."""
    def resolve(v):
        while _is_var(v) and v in flat.alias:
            v = flat.alias[v]
        return v
    return fuse([Eqn(e, resolve, scope) for e, scope in flat.eqns], [resolve(ref(v)) for v in outs])


def predict(program, hardware=None, axis_env=None, topology=None, *, overlap=True,
            while_trips=None) -> Prediction:
    """The predicted time of ``program`` (a jaxpr or simpmd program; per device inside a
    shard_map or pmap) on ``hardware``, called once from Python: see the module's
    docstring. ``axis_env`` gives mapped axes' sizes as for the roofline; ``overlap``
    lets collectives run beside independent compute; ``while_trips`` is the trip count
    of any ``while_loop`` (which shapes alone do not tell)."""
    hw = _hardware_of(hardware)
    out = predict_body(program, hw, _axis_sizes(axis_env), topology, while_trips, overlap)
    out.terms["launch"] += hw.dispatch_s
    out.time_s += hw.dispatch_s
    return out
