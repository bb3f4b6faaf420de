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
from .network import _bytes, _hardware_of, _seconds, collective_of, estimate
from .precision import eqn_path
from .walk import (JAX_UNARY, MATMULS, NESTED, NO_COST, _axis_sizes, _equation_list, _is_var,
                   _nbytes, _primitive_name, _row, _size, _typed, _walk)


@dataclass(frozen=True)
class EquationCost:
    """One equation's row of the roofline: what it computes, moves and communicates.

    ``flops`` and ``bytes`` are the equation's own, unfused (its row's ``cost``);
    ``compute_s = flops / peak`` (at its dtype's rate), ``memory_s = bytes / HBM
    bandwidth``; a collective's ``comms_s`` comes from :func:`estimate` and
    ``comm_bytes`` is what jax.experimental.roofline counts as its ``ici_bytes`` on each
    of ``axes``. ``depth`` is how deeply the equation is nested (jit, shard_map).
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

    @property
    def time_s(self) -> float:
        """The roofline: the larger of compute and memory, or the collective's time."""
        return max(self.compute_s, self.memory_s) + self.comms_s

    @property
    def intensity(self) -> float:
        return self.flops / self.bytes if self.bytes else 0.0

    @property
    def matmul(self) -> bool:
        """A matrix product: what JAX's fused ``flops`` and ``hbm_bytes`` count."""
        return self.primitive.strip() in MATMULS

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
    is the per-equation table (:class:`EquationCost`).
    """

    hardware: str
    equations: list = field(default_factory=list)
    critical_intensity: float = 0.0
    peak_hbm_bytes: int = 0
    context: tuple = ()          # (program, Hardware, axis sizes, topology): for predict()

    def predict(self, *, overlap: bool = True, while_trips=None):
        """What the program will take on the machine: fused bytes, sustained rates,
        launch floors and overlapped collectives (:mod:`simpmd.cost.predict`)."""
        from .predict import predict
        if not self.context:
            raise ValueError("this Roofline was built without its program: make it with "
                             "cost.roofline_of(program, ...) or cost.roofline(fun, ...)")
        program, hw, sizes, topology = self.context
        return predict(program, hw, sizes, topology, overlap=overlap, while_trips=while_trips)

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
                or e.primitive.startswith(("scan", "shard_map", "pjit", "jit"))]
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
        return "\n".join(lines)

    def __repr__(self):
        lower, upper = self.time_s
        return (f"<Roofline on {self.hardware}: {self.flops:.4g} FLOPs, {_bytes(self.bytes)}, "
                f"{_seconds(lower) if lower else '0 s'}..{_seconds(upper) if upper else '0 s'}; "
                f"{self._predicted_text()}>")


# -- bytes on the wire per mesh axis: jax.experimental.roofline's rules --------------------
# (jax/experimental/roofline/rooflines.py, the same in jax 0.7.2, 0.10.2 and 0.12.0.1)

def _ring_ici(nbytes, axes, sizes, reduce):
    """JAX's ring rule: the data split evenly over the axes, each phase sending a shard
    (p - 1) times along one axis, largest axis first; every axis is charged the total."""
    shard = nbytes / math.prod(sizes[a] for a in axes) if reduce else nbytes
    order = sorted(axes, key=lambda a: sizes[a], reverse=True)
    shard //= len(order)
    total = 0
    for a in order:
        total += shard * (sizes[a] - 1)
        shard *= sizes[a]
    return total


def _all_to_all_ici(nbytes, axes, sizes):
    """Half the data crosses the bisection of the smallest axis (twice as wide when it
    has more than two devices, for the wraparound)."""
    size = nbytes * math.prod(sizes[a] for a in axes)
    smallest = sizes[sorted(axes, key=lambda a: sizes[a])[0]]
    bisection = smallest ** (len(axes) - 1) * (2 if smallest > 2 else 1)
    return size / 2 / bisection


def _permute_ici(nbytes, axes, sizes, perm):
    """The busiest link's load: each pair routed the short way round along each axis."""
    dims = [sizes.get(a, 1) for a in axes]
    load: dict = {}
    for src, dst in perm:
        if src == dst:
            continue
        here = [int(i) for i in np.unravel_index(src, dims)]
        there = [int(i) for i in np.unravel_index(dst, dims)]
        for i, q in enumerate(dims):
            step = 1 if (there[i] - here[i]) % q <= (here[i] - there[i]) % q else -1
            while here[i] != there[i]:
                nxt = list(here)
                nxt[i] = (here[i] + step) % q
                link = tuple(sorted([tuple(here), tuple(nxt)]))
                load[link] = load.get(link, 0) + 1
                here = nxt
    return nbytes * max(load.values(), default=0)


def ici_bytes(op: str, in_avals, axes, sizes: dict, perm=()) -> int:
    """The bytes ``jax.experimental.roofline`` counts as one collective's ``ici_bytes``
    (charged to each of ``axes``): ``op`` a jax.lax name (``'psum'``, ``'all_gather'``,
    ...), ``in_avals`` its operands' types, ``sizes`` every axis's size. A group of one
    device sends nothing."""
    if math.prod(sizes[a] for a in axes) <= 1:
        return 0
    nbytes = sum(_nbytes(a) for a in in_avals)
    if op in ("psum", "pmean"):               # a reduce-scatter and an all-gather
        return 2 * int(_ring_ici(nbytes, axes, sizes, True))
    if op in ("pmax", "pmin"):                # JAX counts one element per operand
        return int(_ring_ici(sum(a.dtype.itemsize for a in in_avals), axes, sizes, False))
    if op in ("all_gather", "psum_scatter"):
        return int(_ring_ici(nbytes, axes, sizes, op == "psum_scatter"))
    if op in ("all_to_all", "pswapaxes"):
        return int(_all_to_all_ici(nbytes, axes, sizes))
    if op in ("ppermute", "pshuffle"):
        return int(_permute_ici(nbytes, axes, sizes, perm))
    raise ValueError(f"no ICI rule for the collective {op!r}")


def _collective_cost(eqn, op: str, sizes: dict, hw: Hardware, topology):
    """(group axes, ICI bytes, seconds) of one collective equation."""
    axes = eqn.params.get("axes", eqn.params.get("axis_name", ()))
    axes = tuple(map(str, (axes,) if isinstance(axes, str) else axes))
    unknown = [a for a in axes if a not in sizes]
    if unknown:
        raise ValueError(f"{op} over axis {unknown[0]!r}, whose size the roofline does not know "
                         f"(known: {sizes or 'none'}): pass axis_env=[({unknown[0]!r}, size)]")
    groups = eqn.params.get("axis_index_groups")
    p = len(groups[0]) if groups else math.prod(sizes[a] for a in axes)
    avals = [a for a in map(_typed, eqn.invars) if a is not None]
    perm = [(int(s), int(d)) for s, d in eqn.params.get("perm", ())]
    if op == "pshuffle":
        perm = [(int(s), d) for d, s in enumerate(eqn.params.get("perm", ()))]
    wire = ici_bytes(op, avals, axes, sizes, perm)
    moves = collective_of(op) != "collective_permute" or any(s != d for s, d in perm)
    if p <= 1 or not moves:
        return axes, wire, 0.0
    nbytes = sum(_nbytes(a) for a in avals)
    perm = tuple(perm) if collective_of(op) == "collective_permute" else None
    topology = tuple(topology) if isinstance(topology, list) else topology
    return axes, wire, _estimated_time(op, nbytes, p, hw, topology, perm)


@functools.lru_cache(maxsize=4096)        # a program repeats its collectives, layer by layer
def _estimated_time(op, nbytes, p, hw, topology, perm):
    return estimate(op, nbytes, p, hardware=hw, topology=topology,
                    perm=list(perm) if perm is not None else None).time_s


def _shapes_text(eqn) -> str:
    """``float32[8, 16],float32[16] -> float32[8]``: an equation's operands as a reader sees them."""
    def one(v):
        a = _typed(v)
        return "?" if a is None else f"{a.dtype.name}{list(a.shape)}"
    ins = ",".join(one(v) for v in eqn.invars)
    return f"{ins} -> {','.join(one(v) for v in eqn.outvars)}"


def _rate_dtype(eqn, name: str):
    """The dtype whose peak rate applies: a matmul's inputs, else the first output."""
    vars_ = eqn.invars[:1] if name in MATMULS else (eqn.outvars or eqn.invars)
    a = _typed(vars_[0]) if vars_ else None
    return a.dtype if a is not None else np.dtype(np.float32)


def _equation_cost(eqn, name, hw, depth):
    """One compute equation's row, from its primitive's ``cost`` column."""
    row = _row(eqn, name)
    outs = [_typed(v) for v in eqn.outvars]
    ins = [_typed(v) for v in eqn.invars]
    like = next((a.dtype for v, a in zip(eqn.invars, ins) if _is_var(v) and a is not None),
                outs[0].dtype if outs and outs[0] is not None else None)
    ins = [a.update(dtype=like) if a is not None and a.weak_type and not _is_var(v) and like
           is not None else a for v, a in zip(eqn.invars, ins)]   # 2.0 next to bf16 is bf16
    if row is not None and row.cost is not None:
        flops, nbytes = row.cost([a for a in ins if a is not None],
                                 [a for a in outs if a is not None], **eqn.params)
    elif name in NO_COST:
        flops, nbytes = 0, 0
    elif name in JAX_UNARY:
        flops, nbytes = _size(outs[0]), _nbytes(ins[0]) + _nbytes(outs[0])
    else:
        raise ValueError(
            f"the roofline has no rule for the primitive {name!r} (in {_shapes_text(eqn)}): "
            f"simpmd has no row of that name in simpmd.core.PRIMITIVES; add its name to "
            f"simpmd.cost.NO_COST (costs nothing) or JAX_UNARY (one FLOP per element), or "
            f"give it a row: a silent 0 would hide its cost")
    dtype = _rate_dtype(eqn, name)
    peak = (hw.matmul_peak(eqn_path(hw, eqn, ins)) if name in MATMULS and len(ins) > 1
            else hw.peak_flops(dtype))                  # a dot as XLA runs its precision
    return EquationCost(name, _shapes_text(eqn), str(dtype), int(flops), int(nbytes),
                        flops / peak if flops else 0.0, nbytes / hw.hbm_bandwidth, depth=depth)


def peak_bytes(program) -> int:
    """The most bytes alive at once while ``program`` runs, as jax.experimental.roofline
    counts ``peak_hbm_bytes``: the inputs, then each equation's outputs added and the
    operands it was the last to read freed (the results are never freed); a nested
    program's own peak counts where it is larger."""
    inner = getattr(program, "jaxpr", program)
    eqns = _equation_list(program)
    live = {v: _nbytes(_typed(v)) for v in (*getattr(inner, "constvars", ()),
                                               *getattr(inner, "invars", ()))}
    last = {v: None for v in getattr(inner, "outvars", ()) if _is_var(v)}
    for eqn in reversed(eqns):
        for v in eqn.invars:
            if _is_var(v) and v not in last:
                last[v] = eqn
    current = peak = sum(live.values())
    nested = 0
    for eqn in eqns:
        sub = next((eqn.params[k] for k in NESTED if k in eqn.params), None)
        if sub is not None:
            nested = max(nested, peak_bytes(sub))
        current += sum(_nbytes(_typed(v)) for v in eqn.outvars)
        current -= sum(_nbytes(_typed(v)) for v in eqn.invars if _is_var(v) and last.get(v) is eqn)
        peak = max(peak, current)
    return max(peak, nested)



def roofline_of(program, hardware=None, axis_env=None, topology=None) -> Roofline:
    """The roofline of a program given as equations: a jaxpr, a ClosedJaxpr, or a list.

    ``jax.make_jaxpr(f)(*args)`` (with ``axis_env=[("i", 8)]`` for collectives, or of a
    ``shard_map``, whose mesh gives the axis sizes) is such a program, and so is
    ``simpmd.make_jaxpr``'s. Costs are per device: inside a shard_map or pmap the shapes
    are one device's shard. ``hardware`` a preset name or :class:`Hardware`; ``axis_env``
    the mapped axes' sizes (pairs, a dict or a mesh); ``topology`` passes on to
    :func:`estimate` for the collectives. An equation whose primitive has no rule raises
    ValueError rather than costing 0.
    """
    hw = _hardware_of(hardware)
    eqns = _equation_list(program)
    rows = _walk(eqns, _axis_sizes(axis_env), hw, topology, 0, [])
    bodies = [e.params["jaxpr"] for e in eqns if _primitive_name(e) == "shard_map"]
    walked = bodies[-1] if bodies else program          # JAX's roofline reads the body
    peak = peak_bytes(walked) if hasattr(walked, "eqns") or hasattr(walked, "jaxpr") else 0
    return Roofline(hw.name, rows, hw.critical_intensity, peak,
                    (program, hw, _axis_sizes(axis_env), topology))


def roofline(fun, *args, hardware=None, axis_env=None, topology=None, mesh=None,
             in_specs=None, out_specs=None) -> Roofline:
    """How long ``fun(*args)`` takes on one device of ``hardware``, by the Scaling Book's
    roofline: every equation of its traced program costs FLOPs / peak and bytes / HBM
    bandwidth, every collective what :func:`estimate` says. See :class:`Roofline`.

    ``fun`` is traced on the arguments' types alone, whether they are arrays or
    ShapeDtypeStructs: nothing is computed, so a LLaMA-sized program costs milliseconds
    to seconds. As in ``jax.experimental.roofline.roofline``, ``mesh``, ``in_specs`` and
    ``out_specs`` wrap ``fun`` in ``simpmd.shard_map`` first (its shapes are then the
    whole arrays', and the costs one device's). Equations whose results nothing reads are
    left out, as JAX's roofline leaves them (:func:`live_equations`).
    A ``simpmd.jit`` function costs what each device runs, the collectives jit inserts
    included.
    """
    import simpmd
    from ..api.shapes import as_shapes
    if mesh is not None:
        fun = simpmd.shard_map(fun, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    if hasattr(fun, "lower"):    # a simpmd.jit function: its compiled per-device program
        program = fun.lower(*args).compile().program
    else:
        program = simpmd.make_jaxpr(fun, axis_env=axis_env)(*as_shapes(args))
    if axis_env is None:         # a pmapped or shard_mapped function: the axes it ran over
        axis_env = getattr(program, "axis_env", None)
    return roofline_of(live_equations(program), hardware, axis_env, topology)


def live_equations(program):
    """``program`` without the equations whose results nothing reads (a gradient's loss
    value, say), as ``jax.experimental.roofline`` drops them (``dce_jaxpr``) and XLA does
    when it compiles; an equation with an effect (a debug print) stays."""
    from ..core.core import Program
    used = {v for v in program.outvars if _is_var(v)}
    kept = []
    for eqn in reversed(program.eqns):
        if any(v in used for v in eqn.outvars) or _primitive_name(eqn) in _EFFECTS:
            kept.append(eqn)
            used.update(v for v in eqn.invars if _is_var(v))
    return Program(program.invars, kept[::-1], program.outvars, program.in_tree,
                   program.out_tree, program.constvars, program.axis_env)


_EFFECTS = frozenset({"debug_callback"})
