"""The roofline of a program: what each equation computes, moves and sends, and its time.

The Scaling Book's Part 1 ("All About Rooflines", https://jax-ml.github.io/scaling-book/
roofline/): an operation takes at least FLOPs / peak FLOP/s (compute) and at least
bytes / HBM bandwidth (memory), and its arithmetic intensity FLOPs / bytes says which
bound wins: above the hardware's critical intensity (peak / bandwidth, 240 on a v5e) it
is compute-bound. A program is a list of equations shaped like JAX's jaxpr equations
(``.primitive``, ``.params``, ``.invars``/``.outvars`` with ``.aval.shape`` and
``.aval.dtype``): simpmd's own, or JAX's. Each equation costs what its primitive's row
says (the ``cost`` column of ``simpmd.core.PRIMITIVES``, found by name for a JAX
equation): FLOPs and bytes read and written as if nothing were fused, counted as
``jax.experimental.roofline`` counts its ``unfused_flops`` and ``unfused_hbm_bytes``.
Its ``flops`` and ``hbm_bytes`` count the matrix products alone (XLA fuses the rest into
them), and so does :attr:`Roofline.flops`. A collective's bytes on the wire follow
jax.experimental.roofline's rules per mesh axis (:func:`ici_bytes`); its time is
:func:`estimate`'s. See docs/cost_vs_scaling_book.md for where the two counts part.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import functools
import math

import numpy as np

from .hardware import Hardware
from .network import _bytes, _hardware_of, _seconds, estimate
from .precision import eqn_path
from .rows import by_lax_name, column
from .walk import (Walker, _axis_sizes, _dtype_name, _equation_list, _nbytes, _primitive_name,
                   _row, _typed, flops_and_bytes, is_collective, shapes_text, traced)
from .predict import predict
from .memory import peak_memory


@dataclass(frozen=True)
class EquationCost:
    """One equation's row of the roofline: what it computes, moves and communicates.

    ``flops`` and ``bytes`` are the equation's own, unfused (its row's ``cost``);
    ``compute_s = flops / peak`` (at its dtype's rate), ``memory_s = bytes / HBM
    bandwidth``; a collective's ``comms_s`` comes from :func:`estimate` and
    ``comm_bytes`` is what jax.experimental.roofline counts as its ``ici_bytes`` on each
    of ``axes``. ``depth`` is how deeply the equation is nested (jit, shard_map, a loop);
    an equation in a loop counts every iteration (``times``: how many). ``matmul``: a
    matrix product, what JAX's fused ``flops`` and ``hbm_bytes`` count.
    """

    primitive: str
    shapes: str
    dtype: str
    flops: int
    bytes: int
    compute_s: float
    memory_s: float
    comms_s: float = 0.0
    comm_bytes: int = 0
    axes: tuple = ()
    depth: int = 0
    matmul: bool = False
    times: float = 1

    @property
    def time_s(self) -> float:
        """The roofline: the larger of compute and memory, or the collective's time."""
        return max(self.compute_s, self.memory_s) + self.comms_s

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def bound(self) -> str:
        if self.comms_s > 0:
            return "communication"
        if not self.flops and not self.bytes:
            return ""
        return "compute" if self.compute_s >= self.memory_s else "memory"


@dataclass
class Roofline:
    """The roofline of a whole program on one device of ``hardware``.

    Counts, with jax.experimental.roofline's names and meanings: ``flops`` and
    ``hbm_bytes``, those of the matrix products (XLA fuses the elementwise work into
    them); ``unfused_flops`` and ``unfused_hbm_bytes``, every equation's on its own (also
    ``bytes``); ``ici_bytes`` (also ``comm_bytes``), per mesh axis; ``peak_hbm_bytes``,
    the most bytes alive at once as the program runs. Times: ``compute_s``, ``memory_s``,
    ``comms_s``, each summed over equations from the unfused counts; ``time_s`` is the
    Scaling Book's pair (lower, upper): everything overlapped (the largest of the three)
    and nothing overlapped (their sum). ``bound`` names the largest term. ``equations``
    is the per-equation table (:class:`EquationCost`). A loop counts every iteration
    (JAX's roofline counts a scan's body once); ``notes`` says what the walk chose where
    only shapes were known (a cond's costliest branch).
    """

    hardware: str
    equations: list = field(default_factory=list)
    critical_intensity: float = 0.0
    peak_hbm_bytes: int = 0
    context: tuple = ()          # (program, Hardware, topology, the walk)
    notes: list = field(default_factory=list)

    def predict(self, *, overlap: bool = True, while_trips=None, precision=None):
        """What the program will take on the machine (:func:`simpmd.cost.predict.predict`),
        read by the same walk as this roofline (the branches and trips a run on values
        counted, or ``while_trips``: then every while loop runs that many times)."""
        if not self.context:
            raise ValueError("this Roofline was built without its program: make it with "
                             "cost.roofline_of(program, ...) or cost.roofline(fun, ...)")
        program, hw, topology, walker = self.context
        if while_trips is not None:
            walker = Walker(program, walker.sizes, while_trips=while_trips)
        return predict(program, hw, topology=topology, overlap=overlap, walker=walker,
                       precision=precision)

    @property
    def prediction(self):
        """:meth:`predict` with collectives overlapped (computed once)."""
        if "_prediction" not in self.__dict__:
            self.__dict__["_prediction"] = self.predict()
        return self.__dict__["_prediction"]

    @property
    def predicted_s(self) -> float:
        """The model's time of one call of the program on the hardware, in seconds."""
        return self.prediction.time_s

    @property
    def terms(self) -> dict:
        """The predicted time's parts: compute, memory, exposed communication, launch."""
        return self.prediction.terms

    @property
    def flops(self) -> int:
        """FLOPs of the matrix products: JAX's ``flops``."""
        return sum(e.flops for e in self.equations if e.matmul)

    @property
    def hbm_bytes(self) -> int:
        """Bytes the matrix products read and write: JAX's ``hbm_bytes``."""
        return sum(e.bytes for e in self.equations if e.matmul)

    @property
    def unfused_flops(self) -> int:
        return sum(e.flops for e in self.equations)

    @property
    def bytes(self) -> int:
        """Every equation's bytes, unfused: JAX's ``unfused_hbm_bytes``."""
        return sum(e.bytes for e in self.equations)

    unfused_hbm_bytes = bytes

    @property
    def comm_bytes(self) -> dict:
        out: dict = {}
        for e in self.equations:
            for a in e.axes:
                out[a] = out.get(a, 0) + e.comm_bytes
        return out

    ici_bytes = comm_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per HBM byte of the whole program (unfused)."""
        return self.unfused_flops / self.bytes if self.bytes else 0.0

    @property
    def compute_s(self) -> float:
        return sum(e.compute_s for e in self.equations)

    @property
    def memory_s(self) -> float:
        return sum(e.memory_s for e in self.equations)

    @property
    def comms_s(self) -> float:
        return sum(e.comms_s for e in self.equations)

    @property
    def time_s(self) -> tuple:
        """(lower, upper): max(compute, memory, comms) if all overlap, their sum if none do."""
        parts = (self.compute_s, self.memory_s, self.comms_s)
        return max(parts), sum(parts)

    def segments(self, fused: bool = False) -> list:
        """Seconds of work before each collective and after the last, in program order:
        each segment's equations at their own roofline, max(compute, memory), summed
        (``fused=True``: the matrix products only, the rest taken as fused into them, as
        JAX's ``flops`` and ``hbm_bytes`` count). ``len(segments) == number of
        collectives + 1``; what a timeline draws between the collectives."""
        out, current = [], 0.0
        for e in self.equations:
            if e.axes:                                   # a collective closes the segment
                out.append(current)
                current = 0.0
            elif e.matmul or not fused:
                current += max(e.compute_s, e.memory_s)
        return out + [current]

    @property
    def bound(self) -> str:
        """The largest term of the prediction (:attr:`terms`): what the program waits on."""
        if self.context:
            return self.prediction.bound
        parts = {"compute": self.compute_s, "memory": self.memory_s,
                 "communication": self.comms_s}
        return max(parts, key=parts.get)

    def _predicted_text(self) -> str:
        try:
            p = self.prediction
        except ValueError as exc:                  # a while_loop needs while_trips=
            return f"predicted: {exc}"
        parts = ", ".join(f"{k} {_seconds(t) if t else '0 s'}" for k, t in p.terms.items())
        return (f"predicted {_seconds(p.time_s) if p.time_s else '0 s'} ({parts}), "
                f"{p.bound}-bound")

    def __str__(self):
        lower, upper = self.time_s
        lines = [f"Roofline on {self.hardware} (one device): {self.flops:.4g} FLOPs in matrix "
                 f"products ({self.unfused_flops:.4g} unfused), {_bytes(self.bytes)} HBM "
                 f"unfused, intensity {self.intensity:.3g} FLOPs/byte (critical "
                 f"{self.critical_intensity:.3g})",
                 f"  compute {_seconds(self.compute_s) if self.compute_s else '0 s'}, memory "
                 f"{_seconds(self.memory_s) if self.memory_s else '0 s'}, comms "
                 f"{_seconds(self.comms_s) if self.comms_s else '0 s'}: "
                 f"{_seconds(lower) if lower else '0 s'} to {_seconds(upper) if upper else '0 s'}",
                 f"  {self._predicted_text()}"]
        rows = [e for e in self.equations if e.flops or e.bytes or e.comms_s or e.depth == 0
                or not e.dtype]                 # headings of bodies, and collectives
        header = ("op", "shapes", "FLOPs", "bytes", "time", "bound")
        shown = rows[:60]
        table = [("  " * e.depth + e.primitive, e.shapes, f"{e.flops:.3g}", _bytes(e.bytes),
                  _seconds(e.time_s) if e.time_s else "0", e.bound) for e in shown]
        widths = [max(len(h), *(len(r[i]) for r in table)) if table else len(h)
                  for i, h in enumerate(header)]
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths)).rstrip())
        lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
        if len(rows) > len(shown):
            lines.append(f"... {len(rows) - len(shown)} more equation(s); see .equations")
        return "\n".join(lines + [f"  note: {n}" for n in self.notes])

    def __repr__(self):
        lower, upper = self.time_s
        return (f"<Roofline on {self.hardware}: {self.flops:.4g} FLOPs, {_bytes(self.bytes)}, "
                f"{_seconds(lower) if lower else '0 s'}..{_seconds(upper) if upper else '0 s'}; "
                f"{self._predicted_text()}>")


# -- bytes on the wire per mesh axis: jax.experimental.roofline's rules -------------------------

def ici_bytes(op: str, in_avals, axes, sizes: dict, perm=()) -> int:
    """The bytes ``jax.experimental.roofline`` counts as one collective's ``ici_bytes``
    (charged to each of ``axes``): ``op`` a jax.lax name (``'psum'``, ``'all_gather'``,
    ...), ``in_avals`` its operands' types, ``sizes`` every axis's size; the rule is the
    row's ``ici_rule`` column (simpmd/cost/rows.py). A group of one device sends nothing."""
    rule = column(by_lax_name().get(op), "ici_rule")
    if rule is None:
        raise ValueError(f"no ICI rule for the collective {op!r}")
    if math.prod(sizes[a] for a in axes) <= 1:
        return 0
    return rule(sum(_nbytes(a) for a in in_avals), in_avals, axes, sizes, perm)


def _collective_cost(eqn, row, sizes: dict, hw: Hardware, topology):
    """(group axes, ICI bytes, seconds) of one collective equation, priced by its row."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    axes = tuple(map(str, (axes,) if isinstance(axes, str) else axes))
    unknown = [a for a in axes if a not in sizes]
    if unknown:
        raise ValueError(f"{row.op} over axis {unknown[0]!r}, whose size the roofline does not "
                         f"know (known: {sizes or 'none'}): pass axis_env=[({unknown[0]!r}, size)]")
    groups = eqn.params.get("axis_index_groups")
    p = len(groups[0]) if groups else math.prod(sizes[a] for a in axes)
    avals = [a for a in map(_typed, eqn.invars) if a is not None]
    perm = [(int(s), int(d)) for s, d in eqn.params.get("perm", ())]
    wire = (column(row, "ici_rule")(sum(_nbytes(a) for a in avals), avals, axes, sizes, perm)
            if math.prod(sizes[a] for a in axes) > 1 else 0)
    family = column(row, "collective_family")
    moves = family != "collective_permute" or any(s != d for s, d in perm)
    if p <= 1 or not moves:
        return axes, wire, 0.0
    nbytes = sum(_nbytes(a) for a in avals)
    perm = tuple(perm) if family == "collective_permute" else None
    topology = tuple(topology) if isinstance(topology, list) else topology
    return axes, wire, _estimated_time(family, nbytes, p, hw, topology, perm)


@functools.lru_cache(maxsize=4096)        # a program repeats its collectives, layer by layer
def _estimated_time(family, nbytes, p, hw, topology, perm):
    return estimate(family, nbytes, p, hardware=hw, topology=topology,
                    perm=list(perm) if perm is not None else None).time_s


def _rate_dtype(eqn, matmul: bool):
    """The dtype whose peak rate applies: a matmul's inputs, else the first output."""
    vars_ = eqn.invars[:1] if matmul else (eqn.outvars or eqn.invars)
    a = _typed(vars_[0]) if vars_ else None
    return a.dtype if a is not None else np.dtype(np.float32)


def _equation_cost(eqn, name, hw, depth, row=None, times=1):
    """One compute equation's row, from its primitive's ``cost`` column, run ``times``
    times; a dot at the rate XLA runs its precision at."""
    row = row or _row(eqn, name)
    flops, nbytes = flops_and_bytes(eqn, row, name)
    matmul = column(row, "matmul")
    dtype = _rate_dtype(eqn, matmul)
    ins = [_typed(v) for v in eqn.invars]
    peak = (hw.matmul_peak(eqn_path(hw, eqn, ins)) if matmul and len(ins) > 1
            else hw.peak_flops(dtype))                  # a dot as XLA runs its precision
    return EquationCost(name, shapes_text(eqn), _dtype_name(dtype), int(flops * times),
                        int(nbytes * times), flops * times / peak if flops else 0.0,
                        nbytes * times / hw.hbm_bandwidth, depth=depth, matmul=matmul,
                        times=times)


def _cost_row(visit, hw, topology) -> EquationCost:
    """One visited equation's row of the roofline, every time the device runs it counted."""
    eqn, n, depth = visit.eqn, visit.times, visit.depth
    if visit.body:                        # an equation that holds bodies: a heading
        return EquationCost(visit.body, shapes_text(eqn), "", 0, 0, 0.0, 0.0, depth=depth,
                            times=n)
    if is_collective(visit.row):               # n == 0: its result is never read
        axes, wire, seconds = _collective_cost(eqn, visit.row, visit.sizes, hw, topology)
        return EquationCost(visit.name if n else f"{visit.name} (unread)", shapes_text(eqn),
                            "", 0, 0, 0.0, 0.0, seconds * n, int(wire * n), axes, depth, times=n)
    return _equation_cost(eqn, visit.name, hw, depth, visit.row, n)


def peak_bytes(program, walker=None) -> int:
    """The most bytes alive at once while ``program`` runs, as jax.experimental.roofline
    counts ``peak_hbm_bytes`` (``simpmd.cost.memory.peak_memory`` with ``like_jax=True``)."""
    return peak_memory(program, like_jax=True, walker=walker).peak


def roofline_of(program, hardware=None, axis_env=None, topology=None, *, while_trips=None,
                taken=None, device=None) -> Roofline:
    """The roofline of a program given as equations: a jaxpr, a ClosedJaxpr, or a list.

    ``jax.make_jaxpr(f)(*args)`` (with ``axis_env=[("i", 8)]`` for collectives, or of a
    ``shard_map``, whose mesh gives the axis sizes) is such a program, and so is
    ``simpmd.make_jaxpr``'s. Costs are per device: inside a shard_map or pmap the shapes
    are one device's shard. ``hardware`` a preset name or :class:`Hardware`; ``axis_env``
    the mapped axes' sizes (pairs, a dict or a mesh); ``topology`` passes on to
    :func:`estimate` for the collectives. The program is read by
    :func:`simpmd.cost.walk.walk`: equations nothing reads left out, a loop's body counted
    once per iteration, a cond's costliest branch on shapes (said in ``notes``);
    ``while_trips`` how many times a while loop runs (an int, or a dict by the loop's
    label), ``taken`` the counts of a run on values (``simpmd.cost.walk.taken_in``), of
    ``device`` (default: the busiest). An equation whose primitive has no rule raises
    ValueError rather than costing 0.
    """
    hw = _hardware_of(hardware)
    walker = Walker(program, _axis_sizes(axis_env), while_trips=while_trips, taken=taken,
                    device=device)
    rows = [_cost_row(v, hw, topology) for v in walker.visits()]
    bodies = [e.params["jaxpr"] for e in _equation_list(program) if "jaxpr" in e.params
              and ("mesh" in e.params or "shard_mesh" in e.params)]      # a shard_map's
    walked = bodies[-1] if bodies else program          # JAX's roofline reads the body
    peak = (peak_bytes(walked, walker) if hasattr(walked, "eqns") or hasattr(walked, "jaxpr")
            else 0)
    return Roofline(hw.name, rows, hw.critical_intensity, peak, (program, hw, topology, walker),
                    list(dict.fromkeys(walker.notes)))


def roofline(fun, *args, hardware=None, axis_env=None, topology=None, mesh=None,
             in_specs=None, out_specs=None, while_trips=None) -> Roofline:
    """How long ``fun(*args)`` takes on one device of ``hardware``, by the Scaling Book's
    roofline: every equation of its traced program costs FLOPs / peak and bytes / HBM
    bandwidth, every collective what :func:`estimate` says. See :class:`Roofline`.

    ``fun`` is traced on the arguments' types alone, whether they are arrays or
    ShapeDtypeStructs: a LLaMA-sized program costs milliseconds to seconds. Where the
    arguments are arrays and values decide what runs (a ``cond``, a ``while_loop``), the
    program also runs on them, and each device's branches and trips are counted (the
    busiest device is the one costed); on shapes a cond costs its costliest branch and a
    while loop ``while_trips`` iterations. As in ``jax.experimental.roofline.roofline``,
    ``mesh``, ``in_specs`` and ``out_specs`` wrap ``fun`` in ``simpmd.shard_map`` first
    (its shapes are then the whole arrays', and the costs one device's). Equations whose
    results nothing reads are left out, as JAX's roofline leaves them (:func:`live_equations`).
    A ``simpmd.jit`` function costs what each device runs, the collectives jit inserts
    included.
    """
    program, axis_env, taken = traced(fun, args, axis_env, mesh, in_specs, out_specs)
    return roofline_of(program, hardware, axis_env, topology, while_trips=while_trips,
                       taken=taken)
