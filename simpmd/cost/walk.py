"""One walk over a program, which every cost analysis shares.

The roofline, memory's FLOPs and liveness, and the timelines all read a program through
:func:`walk`: its equations in order, as one device runs them, each with how many times
that device runs it. A program is a list of equations shaped like JAX's (``.primitive``,
``.params``, ``.invars``/``.outvars`` with ``.aval``): simpmd's own, or a jaxpr of real
JAX, which this module alone reads (the names of JAX's primitives that simpmd has no row
for are listed here). A nested body has one meaning everywhere:

* ``scan`` (and ``fori_loop`` with static bounds): its body once per iteration;
* ``while_loop``: its predicate ``trips + 1`` times and its body ``trips`` times, with
  ``trips`` counted on a run on values, else given by the caller (``while_trips=``);
  refused, naming the loop, when neither is known;
* ``cond``/``switch``: on values, the branch each device took; on shapes, the costliest
  branch (most FLOPs, then bytes), which the walk says in a note;
* ``checkpoint``: its body where it runs, once forward; the backward pass's own
  ``remat2`` holds what it computes again (its equations marked ``recompute``);
* ``jit``, ``shard_map``, a nested ``pmap`` (and JAX's ``pjit``, ``custom_jvp_call``,
  ``custom_vjp_call``): their body, as each device runs it.

A program is walked after dead-code removal (:func:`live_equations`), as
``jax.experimental.roofline`` and XLA remove what nothing reads. Values are known where a
run has them: :func:`taken_in` replays a run on the values its devices received and counts,
per device, how many times each equation ran (:class:`Taken`).
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from ..core.core import PRIMITIVES, Aval, Primitive, context
from .rows import by_jax_name, column
from ..core.core import Equation, Program
from ..core.core import running
from ..core.program import eval_program, recording
from ..core import dtypes
from ..core.run import Run
from ..core.values import StackedValue
from ..api import tree
from ..api.shapes import as_shapes
from ..api.jaxpr import body_program, make_jaxpr
from ..api.shard_map import shard_map

# Primitives of JAX that simpmd has no row for: what JAX's roofline counts for them.
# NO_COST cost nothing (JAX registers them with its zero rule); JAX_UNARY one FLOP per
# element and their input and output bytes (JAX's unary rule).
NO_COST = frozenset("""
    axis_size pcast sharding_constraint device_put optimization_barrier split
    dynamic_update_slice expand_dims bitcast_convert_type reduce_precision stop_gradient
    mesh_cast
""".split())
JAX_UNARY = frozenset("erf erfc erf_inv lgamma digamma bessel_i0e bessel_i1e log2".split())
NESTED = ("jaxpr", "call_jaxpr", "fun_jaxpr")   # where pjit/jit, shard_map, custom_* keep theirs
# How XLA fuses JAX's primitives that no simpmd row gives a ``fusion`` column (read by
# :func:`jax_fusion`, for :mod:`simpmd.cost.fusion`, which reads rows alone).
JAX_VIEWS = frozenset("""expand_dims bitcast_convert_type stop_gradient pcast
    sharding_constraint device_put optimization_barrier mesh_cast reshard copy_p
    random_wrap random_unwrap axis_index axis_size""".split())
JAX_ELEMENTWISE = JAX_UNARY | frozenset("""reduce_precision
    threefry2x32 random_bits erf_inv population_count clz""".split())
JAX_IN_PLACE = frozenset("dynamic_update_slice scatter scatter-add scatter_add".split())


# -- reading either kind of program --------------------------------------------------------

def _primitive_name(eqn) -> str:
    prim = eqn.primitive
    return prim if isinstance(prim, str) else prim.name


def jax_fusion(eqn) -> str:
    """How XLA fuses ``eqn``, a primitive of JAX's whose row (if any) has no ``fusion``
    column, by JAX's name: ``'in_place'``, ``'view'``, ``'elementwise'``, ``'reduction'``
    or ``'opaque'``."""
    name = _primitive_name(eqn)
    if name in JAX_IN_PLACE:
        return "in_place"
    if name in JAX_VIEWS or (name in NO_COST and name not in ("while", "split")):
        return "view"
    if name in JAX_ELEMENTWISE:
        return "elementwise"
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        return "reduction"
    return "opaque"


_JAX_NAMES: dict = {}      # a name -> its row; under None, how many rows there were then


def _row(eqn, name=None):
    """The row that costs ``eqn``: its own primitive, or simpmd's row JAX's name stands for."""
    if isinstance(eqn.primitive, Primitive):
        return eqn.primitive
    name = name or _primitive_name(eqn)
    if _JAX_NAMES.get(None) != len(PRIMITIVES):          # a row was added since: read again
        _JAX_NAMES.clear()
        _JAX_NAMES.update(by_jax_name())
        _JAX_NAMES[None] = len(PRIMITIVES)
    return _JAX_NAMES.get(name)


def _typed(var):
    """A variable's or literal's type as simpmd's :class:`Aval` (None when it has none
    that counts in bytes, e.g. a token)."""
    a = getattr(var, "aval", None)
    if a is None and hasattr(var, "val"):             # a JAX literal
        a = np.asarray(var.val)
    if isinstance(a, Aval) or a is None:
        return a
    try:
        return Aval(getattr(a, "shape", ()), np.dtype(a.dtype))
    except TypeError:
        return None


def _size(aval) -> int:
    return int(math.prod(aval.shape))


def _nbytes(aval) -> int:
    return 0 if aval is None else aval.nbytes


def var_bytes(v) -> int:
    """The bytes of a variable (a PRNG key counts its key data, as JAX's roofline does)."""
    a = getattr(v, "aval", None)
    if type(a) is Aval:
        return a.dtype.itemsize * math.prod(a.shape)
    a = _typed(v)
    if a is not None:
        return a.nbytes
    aval = getattr(v, "aval", None)
    width = getattr(getattr(aval, "dtype", None), "itemsize", 0) or 0
    return int(np.prod(getattr(aval, "shape", ()), dtype=np.int64)) * int(width)


def _equation_list(program) -> list:
    """The equations of a ClosedJaxpr, a Jaxpr, or a list of equations."""
    inner = getattr(program, "jaxpr", program)
    return list(getattr(inner, "eqns", inner))


def _axis_sizes(axis_env) -> dict:
    """``[("i", 8)]``, ``{"i": 8}`` or a mesh (simpmd or JAX) -> ``{"i": 8}``."""
    if axis_env is None:
        return {}
    if isinstance(axis_env, dict):
        return {str(k): int(v) for k, v in axis_env.items()}
    shape = getattr(axis_env, "shape", None)
    if isinstance(shape, dict) or hasattr(shape, "items"):
        return {str(k): int(v) for k, v in shape.items()}
    names = getattr(axis_env, "axis_names", None)
    if names is not None:
        return dict(zip(map(str, names), map(int, np.shape(axis_env.devices))))
    return {str(k): int(v) for k, v in axis_env}


def _is_var(v) -> bool:
    return not hasattr(v, "val") and not hasattr(v, "value")     # a literal carries its value


def _source(eqn) -> str:
    """Where the learner wrote ``eqn`` ('file.py:12'), or '' for a jaxpr of real JAX."""
    source = getattr(eqn, "source", None)
    return source[0] if isinstance(source, tuple) and source and source[0] else ""


_NAMES: dict = {}


def _dtype_name(dtype) -> str:
    """``dtype.name``, which NumPy works out afresh on every call."""
    name = _NAMES.get(dtype)
    if name is None:
        name = _NAMES[dtype] = dtype.name
    return name


def shapes_text(eqn) -> str:
    """``float32[8, 16],float32[16] -> float32[8]``: an equation's operands, as read."""
    def one(v):
        a = _typed(v)
        return "?" if a is None else f"{_dtype_name(a.dtype)}{list(a.shape)}"
    ins = ",".join(one(v) for v in eqn.invars)
    return f"{ins} -> {','.join(one(v) for v in eqn.outvars)}"


# -- what one equation computes and moves --------------------------------------------------

def flops_and_bytes(eqn, row=None, name=None) -> tuple:
    """(FLOPs, bytes read and written) of one equation on its own, unfused: its row's
    ``cost`` column, as ``jax.experimental.roofline`` counts ``unfused_flops`` and
    ``unfused_hbm_bytes``. A literal such as ``2.0`` next to a bfloat16 value counts as
    bfloat16. A primitive with no rule raises rather than costing 0."""
    name = name or _primitive_name(eqn)
    row = row or _row(eqn, name)
    outs = [_typed(v) for v in eqn.outvars]
    ins = [_typed(v) for v in eqn.invars]
    like = next((a.dtype for v, a in zip(eqn.invars, ins) if _is_var(v) and a is not None),
                outs[0].dtype if outs and outs[0] is not None else None)
    ins = [a.update(dtype=like) if a is not None and a.weak_type and not _is_var(v) and like
           is not None else a for v, a in zip(eqn.invars, ins)]   # 2.0 next to bf16 is bf16
    if row is not None and row.cost is not None:
        flops, nbytes = row.cost([a for a in ins if a is not None],
                                 [a for a in outs if a is not None], **eqn.params)
        return int(flops), int(nbytes)
    if name in NO_COST:
        return 0, 0
    if name in JAX_UNARY:
        return _size(outs[0]), _nbytes(ins[0]) + _nbytes(outs[0])
    raise ValueError(
        f"the cost model has no rule for the primitive {name!r} (in {shapes_text(eqn)}): "
        f"simpmd has no row for it (simpmd.core.PRIMITIVES, or a row's jax_names in "
        f"simpmd/cost/rows.py); add its name to simpmd.cost.walk.NO_COST (costs nothing) or "
        f"JAX_UNARY (one FLOP per element), or give it a row: a silent 0 would hide its cost")


def is_collective(row) -> bool:
    """A collective that sends bytes (axis_index, though a collective row, sends none)."""
    return column(row, "collective_family") is not None


# -- nested bodies -------------------------------------------------------------------------

def nested(eqn):
    """(kind, bodies) of an equation that holds programs, by the parameters it keeps them
    in (the same for simpmd's programs and JAX's): ``'branches'`` (a cond's), ``'until'``
    (a while loop's predicate and body), ``'repeat'`` (a scan's body), ``'call'`` (one body
    run once); or (None, [])."""
    params = eqn.params
    if "branches" in params:
        return "branches", list(params["branches"])
    if "cond_jaxpr" in params and "body_jaxpr" in params:
        return "until", [params["cond_jaxpr"], params["body_jaxpr"]]
    if "jaxpr" in params and "length" in params:
        return "repeat", [params["jaxpr"]]
    inner = next((params[k] for k in NESTED if k in params and hasattr(
        getattr(params[k], "jaxpr", params[k]), "eqns")), None)
    return ("call", [inner]) if inner is not None else (None, [])


def scan_split(eqn) -> tuple:
    """(constants, carries) of a scan's operands, the rest its xs: counts in its
    parameters (simpmd, jax before 0.12), or the groups of jax 0.12's ``ft_in`` tree."""
    params = eqn.params
    if "num_consts" in params:
        return int(params["num_consts"]), int(params["num_carry"])
    consts, carry, _ = params["ft_in"].update(list(range(len(eqn.invars)))).unpack()
    return len(list(consts)), len(list(carry))


def axes_in(eqn, sizes: dict) -> dict:
    """The mesh axes in scope inside ``eqn``'s body: a shard_map's mesh, a nested pmap's axis."""
    here = dict(sizes)
    mesh = eqn.params.get("mesh", eqn.params.get("shard_mesh"))
    if mesh is not None and "jaxpr" in eqn.params:
        here.update(_axis_sizes(mesh))
    if "axis_size" in eqn.params and "call_jaxpr" in eqn.params:
        here[str(eqn.params["axis_name"])] = int(eqn.params["axis_size"])
    return here


def live_equations(program, keep_recompute=False):
    """``program`` without the equations whose results nothing reads (a gradient's loss
    value, say), as ``jax.experimental.roofline`` drops them (``dce_jaxpr``) and XLA does
    when it compiles; an equation with no results (a debug print) or with an effect stays,
    and with ``keep_recompute`` one a checkpoint runs again (phase ``'recompute'``)."""
    inner = getattr(program, "jaxpr", program)
    if not hasattr(inner, "outvars"):            # a list of equations: no results to read
        return Program([], list(inner), [])
    if type(inner).__module__.startswith("jax"):
        inner = _jax_dce(inner)
    used = {v for v in inner.outvars if _is_var(v)}
    kept = []
    for eqn in reversed(list(inner.eqns)):
        if (not eqn.outvars or getattr(eqn, "effects", None)
                or any(v in used for v in eqn.outvars)
                or (keep_recompute and getattr(eqn, "phase", "") == "recompute")):
            kept.append(eqn)
            used.update(v for v in eqn.invars if _is_var(v))
    return Program(inner.invars, kept[::-1], inner.outvars, getattr(program, "in_tree", None),
                   getattr(program, "out_tree", None), getattr(inner, "constvars", ()),
                   getattr(program, "axis_env", ()))


def _jax_dce(jaxpr):
    """A jaxpr of real JAX after JAX's own dead-code removal (``dce_jaxpr``: its rules also
    drop a loop's unread results), as ``jax.experimental.roofline`` removes it."""
    from jax._src.interpreters.partial_eval import dce_jaxpr  # optional: JAX made this program
    return dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))[0]


# -- the walk ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Visit:
    """One equation as one device runs it: ``times`` over the run (every loop around it
    counted), ``depth`` how deeply it is nested, ``sizes`` the mesh axes in scope, ``phase``
    'forward', 'backward' or 'recompute' (a body inherits its equation's). An equation
    that holds bodies is visited first, with ``body`` saying how they are counted
    ('scan x8'), then its bodies' equations."""

    eqn: object
    name: str
    row: object
    times: float
    depth: int
    sizes: dict
    phase: str = "forward"
    body: str = ""


class Walker:
    """One walk over ``program``: see :func:`walk`. ``bodies`` says what a nested equation
    runs (one meaning, shared by every analysis); ``notes`` what the walk chose. With
    ``whole_recompute``, a checkpoint that saves nothing runs its whole forward again in
    the backward pass, as an eager framework's does (:func:`_rerun`), not only what the
    backward pass reads. With ``eager``, the kernels are eager PyTorch's, one per
    operation (:mod:`simpmd.cost.fusion`), not XLA's fusions."""

    def __init__(self, program, sizes=None, *, while_trips=None, taken=None, device=None,
                 whole_recompute=False, eager=False):
        self.program, self.sizes, self.eager = program, dict(sizes or {}), eager
        self.whole = _checkpoint_forwards(program) if whole_recompute else {}
        self.while_trips, self.taken = while_trips, taken
        self.device = taken.busiest() if taken is not None and device is None else device
        self.notes: list = []
        self.labels = _while_labels(program)
        self._live: dict = {}             # id(program) -> its live equations
        self._totals: dict = {}           # id(body) -> (FLOPs, bytes): the costliest branch

    def live(self, program):
        """``program`` without what nothing reads (:func:`live_equations`; a jaxpr of JAX
        loses its unread inputs too, as JAX's dead-code removal drops them)."""
        self._read(program)
        return self._live[id(program)][1]

    def _read(self, program) -> tuple:
        """(the equations to visit, the live ones): a program of simpmd keeps its dead
        collectives, which its run logged (a timeline's segments end at each), at no cost."""
        key = id(program)
        if key not in self._live:
            if key in self.whole:                   # a checkpoint's backward, run eagerly
                program = _rerun(program, *self.whole[key])
            live = live_equations(program, key in self.whole)
            every = _equation_list(program)
            kept = {id(e) for e in live.eqns}
            visit = ([e for e in every if id(e) in kept or is_collective(_row(e))]
                     if kept <= {id(e) for e in every} else live.eqns)   # JAX's DCE: new ones
            self._live[key] = (program, live, kept, visit)
        return self._live[key][3], self._live[key][1].eqns, self._live[key][2]

    def visits(self):
        """Every live equation as the device runs it, bodies included (:class:`Visit`)."""
        yield from self._visits(self.program, 1, 0, self.sizes, "forward")

    def _visits(self, program, times, depth, sizes, phase):
        visit, _, live = self._read(program)
        for eqn in visit:
            name = _primitive_name(eqn)
            here = phase if getattr(eqn, "phase", "forward") == "forward" else eqn.phase
            count = times if self.taken is None else self.taken.of(eqn, self.device)
            if id(eqn) not in live:                 # a dead collective: it ran, costs nothing
                if count:
                    yield Visit(eqn, name, _row(eqn, name), 0, depth, sizes, here)
                continue
            if not count:
                continue
            kind, bodies = nested(eqn)
            if kind is None:
                yield Visit(eqn, name, _row(eqn, name), count, depth, sizes, here)
                continue
            inner = axes_in(eqn, sizes)
            runs = self.bodies(eqn, inner, count)
            yield Visit(eqn, name, _row(eqn, name), count, depth, sizes, here,
                        self._heading(eqn, kind, len(bodies)))
            for body, n in runs:
                yield from self._visits(body, n, depth + 1, inner, here)

    def bodies(self, eqn, sizes=None, count=1) -> list:
        """(body, times it runs) for each body of ``eqn``, run ``count`` times: on shapes,
        by the rules above; on values, the bodies the device ran, as often as it ran them."""
        kind, bodies = nested(eqn)
        if self.taken is not None:
            return self._ran(eqn, bodies, count)
        if kind == "repeat":
            return [(bodies[0], count * int(eqn.params["length"]))]
        if kind == "until":
            trips = self.trips(eqn)
            return [(bodies[0], count * (trips + 1)), (bodies[1], count * trips)]
        if kind == "branches" and len(bodies) > 1:
            costs = [self._total(b, sizes or self.sizes) for b in bodies]
            k = max(range(len(bodies)), key=lambda i: (costs[i], -i))
            if len(set(costs)) > 1:
                self.notes.append(f"cond at {_source(eqn) or 'a cond'}: on shapes, its "
                                  f"costliest branch ({k} of {len(bodies)}: "
                                  f"{costs[k][0]:.4g} FLOPs) is counted")
            return [(bodies[k], count)]
        return [(bodies[0], count)] if bodies else []

    def _ran(self, eqn, bodies, count) -> list:
        """On values: each body the device ran, with how many times it ran per run of
        ``eqn`` (a scan's length, a while loop's trips, a branch's share), times ``count``."""
        runs, out = self.taken.of(eqn, self.device), []
        for body in bodies:
            n = max((self.taken.of(e, self.device) for e in _equation_list(body)), default=0)
            if n:
                out.append((body, count * n / runs if runs else 0))
        return out

    def _heading(self, eqn, kind, n) -> str:
        """How an equation that holds bodies shows: 'scan x8', 'while x3', 'cond (2 branches)'."""
        name = _primitive_name(eqn)
        if kind == "repeat":
            return f"{name} x{eqn.params['length']}"
        if kind == "until":
            return f"{name} x{self.trips(eqn)}"
        return f"{name} ({n} branches)" if kind == "branches" else name

    def trips(self, eqn) -> int:
        """How many times a while loop runs its body each time it runs: counted on values
        (this device's), else the caller's ``while_trips``."""
        if self.taken is not None:
            runs = self.taken.of(eqn, self.device)
            first = next(iter(_equation_list(eqn.params["body_jaxpr"])), None)
            return self.taken.of(first, self.device) // runs if runs and first else 0
        key = self.labels.get(id(eqn), "while_loop #1")
        given = self.while_trips
        if isinstance(given, dict):
            given = given.get(key)
        if given is None:
            where = f"at {key}" if _source(eqn) else key.replace("while_loop ", "")
            raise ValueError(
                f"the while_loop {where} runs a number of times that depends on values, and "
                f"only shapes are known ({shapes_text(eqn)}). Pass while_trips=N (every "
                f"while_loop runs N times) or while_trips={{{key!r}: N}}, or give arrays, so "
                f"that a run counts its iterations.")
        return int(given)

    def _total(self, body, sizes) -> tuple:
        """(FLOPs, bytes) of one run of ``body``, walked with the same rules."""
        key = id(body)
        if key not in self._totals:
            flops = nbytes = 0
            for v in self._visits(body, 1, 0, sizes, "forward"):
                if not v.body and not is_collective(v.row):
                    f, b = flops_and_bytes(v.eqn, v.row, v.name)
                    flops, nbytes = flops + f * v.times, nbytes + b * v.times
            self._totals[key] = (flops, nbytes)
        return self._totals[key]


def walk(program, sizes=None, *, while_trips=None, taken=None, device=None, notes=None):
    """Every live equation of ``program`` as one device runs it, in program order
    (:class:`Visit` s): see the module's docstring for what a nested body counts.

    ``sizes`` the mesh axes in scope; ``while_trips`` an int (every while loop) or a dict
    from a loop's source line ('file.py:12', or 'while_loop #k' in a jaxpr of JAX) to its
    trips; ``taken`` the counts of a run on values (:func:`taken_in`), of ``device``
    (default: :meth:`Taken.busiest`). ``notes``, a list, receives what the walk chose
    (the costliest branch of a cond)."""
    walker = Walker(program, sizes, while_trips=while_trips, taken=taken, device=device)
    yield from walker.visits()
    if notes is not None:
        notes += list(dict.fromkeys(walker.notes))


def _checkpoint_forwards(program) -> dict:
    """id(a checkpoint's backward body) -> (its forward body, how many inputs that has), for
    each outermost checkpoint of ``program`` that saves nothing for the backward pass
    (simpmd's ``remat2`` keeps its backward half in its ``_vjp`` parameter; a checkpoint
    inside another stands for a fused kernel, which recomputes what it reads)."""
    found, stack = {}, [_equation_list(program)]
    while stack:
        for eqn in stack.pop():
            vjp = eqn.params.get("_vjp")
            if _primitive_name(eqn) == "remat2":
                if vjp is not None and eqn.params.get("policy") is None:
                    forward = eqn.params["jaxpr"]
                    found[id(vjp[0])] = (forward, len(getattr(forward, "jaxpr",
                                                              forward).invars))
                continue
            stack += [_equation_list(b) for b in nested(eqn)[1]]
    return found


def _rerun(backward, forward, n):
    """A checkpoint's backward body as PyTorch's checkpoint runs it (Megatron-LM's
    ``CheckpointFunction``): the whole forward again, reading the backward body's first
    ``n`` inputs (the forward's), marked ``'recompute'``; then the backward equations,
    reading what it computed (the equations the backward body recomputes are copies of
    forward ones, in order, with the same parameters: their results are those)."""
    inner = getattr(backward, "jaxpr", backward)
    names = dict(zip(getattr(forward, "jaxpr", forward).invars, inner.invars[:n]))
    again = [e for e in inner.eqns if e.phase == "recompute"]
    redo = []
    for e in _equation_list(forward):
        if again and again[0].params is e.params and again[0].primitive is e.primitive:
            names.update(zip(again.pop(0).outvars, e.outvars))
        redo.append(Equation(e.primitive, e.params, [names.get(v, v) for v in e.invars],
                             e.outvars, e.source, "recompute"))
    rest = [Equation(e.primitive, e.params, [names.get(v, v) for v in e.invars], e.outvars,
                     e.source, e.phase) for e in inner.eqns if e.phase != "recompute"]
    return Program(inner.invars, redo + rest, [names.get(v, v) for v in inner.outvars],
                   constvars=getattr(inner, "constvars", ()),
                   axis_env=getattr(backward, "axis_env", ()))


def _while_labels(program) -> dict:
    """id(while equation) -> the key ``while_trips`` names it by: its source line
    ('file.py:12'), else its place among the program's while loops ('while_loop #2')."""
    labels, count = {}, 0
    stack = [_equation_list(program)]
    while stack:
        for eqn in stack.pop(0):
            kind, bodies = nested(eqn)
            if kind == "until":
                count += 1
                labels[id(eqn)] = _source(eqn) or f"while_loop #{count}"
            stack += [_equation_list(b) for b in bodies]
    return labels


# -- values: how many times each device ran each equation ----------------------------------

class Taken:
    """How many times each device of a run ran each equation of its program, counted on
    a replay on values (:func:`taken_in`): what a cond's branches and a while loop's trips
    decide, per device."""

    def __init__(self, n: int):
        self.n, self.counts = n, {}

    def add(self, eqn, devices):
        found = self.counts.get(id(eqn))
        if found is None:
            found = self.counts[id(eqn)] = (eqn, np.zeros(self.n, np.int64))
        found[1][devices] += 1

    def of(self, eqn, device) -> int:
        found = self.counts.get(id(eqn))
        return int(found[1][device]) if found is not None else 0

    def busiest(self) -> int:
        """The device that computes the most (FLOPs, then bytes): the one a step waits for."""
        flops, nbytes = np.zeros(self.n), np.zeros(self.n)
        for eqn, times in self.counts.values():
            row = _row(eqn)
            if nested(eqn)[0] is None and not is_collective(row):
                f, b = flops_and_bytes(eqn, row)
                flops, nbytes = flops + f * times, nbytes + b * times
        return int(np.lexsort((-np.arange(self.n), nbytes, flops))[-1])


class _Counting:
    """A recorder that writes nothing down: it counts, for every equation of the program
    being replayed, the devices that run it (the devices of every enclosing cond branch
    and while loop still running, ``run.branches``)."""

    def __init__(self, run, taken):
        self.run, self.taken, self.vars = run, taken, {}

    def record(self, prim, params, args, outs):
        eqn, run = context.eqn, context.run
        if eqn is None or run is not self.run or prim is not eqn.primitive:
            return
        devices = (np.logical_and.reduce([mask for mask, _ in run.branches]) if run.branches
                   else slice(None))
        self.taken.add(eqn, devices)


def replay(program, run, inputs) -> Taken:
    """Run ``program`` on ``run`` with ``inputs`` (StackedValues), counting what each
    device runs."""
    taken = Taken(run.n)
    with recording(_Counting(run, taken)), running(run):
        eval_program(program, [], list(inputs))
    return taken


def decides(program) -> bool:
    """Whether values decide what ``program`` runs (it holds a cond or a while loop), and a
    replay can count it (it holds no nested pmap, whose devices are another run's)."""
    kinds, stack = set(), [_equation_list(program)]
    while stack:
        for eqn in stack.pop():
            kind, bodies = nested(eqn)
            kinds.add("pmap" if "axis_size" in eqn.params and "call_jaxpr" in eqn.params
                      else kind)
            stack += [_equation_list(b) for b in bodies]
    return bool(kinds & {"branches", "until"}) and "pmap" not in kinds


def taken_in(trace):
    """The counts of the run ``trace`` logged (its program replayed on the values its
    devices received), or None when they are not known: a run on shapes alone, an eager
    run, a nested pmap's run, or a program that no value decides."""
    program, log = getattr(trace, "program", None), getattr(trace, "_log", None)
    if program is None or log is None or getattr(trace, "shapes_only", True) \
            or not decides(program):
        return None
    receive = next((r for r in log.records if r.kind == "receive"), None)
    if receive is None or receive.run.outer is not None or receive.run.inner is not None:
        return None
    was = receive.run
    run = Run(was.all_devices, was.axes, check_vma=was.check_vma, maps_a_mesh=was.maps_a_mesh)
    stacks = [p.stack for p in receive.fields["pieces"]]
    if any(s is None for s in stacks) or len(stacks) != len(program.invars):
        return None
    inputs = [StackedValue(v.aval, s.astype(dtypes.canonical(s.dtype), copy=False))
              for v, s in zip(program.invars, stacks)]
    return replay(program, run, inputs)


def taken_on(program, args, axis_env=None):
    """The counts of ``program`` (traced from a function of ``args``) run on ``args``,
    every device of ``axis_env`` given the same values, as ``make_jaxpr`` traced it."""
    axes = tuple((str(k), int(v)) for k, v in _axis_sizes(axis_env).items())
    n = math.prod(s for _, s in axes)
    run = Run([_Device(k) for k in range(n)], axes)
    leaves = [np.asarray(x) for x in tree.flatten(args)[0]]
    inputs = [StackedValue(v.aval, x.reshape((1,) + x.shape).astype(v.aval.dtype, copy=False))
              for v, x in zip(program.invars, leaves)]
    return replay(program, run, inputs)


@dataclass(frozen=True)
class _Device:
    """A device of a replay that no platform holds (a make_jaxpr's axis_env)."""

    id: int


def traced(fun, args, axis_env=None, mesh=None, in_specs=None, out_specs=None) -> tuple:
    """(program, axis_env, taken) of ``fun(*args)``: its program traced on the arguments'
    types (a ``simpmd.jit`` function: its compiled per-device program; ``mesh``,
    ``in_specs``, ``out_specs``: ``fun`` wrapped in ``shard_map`` first), and where the
    arguments are values and they decide what runs (a cond, a while loop), the counts of
    a run on them (``fun`` called, when it is a pmap or shard_map)."""
    if mesh is not None:
        fun = shard_map(fun, mesh=mesh, in_specs=in_specs, out_specs=out_specs)
    if hasattr(fun, "lower"):    # a simpmd.jit function: its compiled per-device program
        program = fun.lower(*args).compile().program
    elif hasattr(fun, "traced") and hasattr(fun, "fun"):  # a pmap or shard_map: its body
        program = body_program(fun, *as_shapes(args))
    else:
        program = make_jaxpr(fun, axis_env=axis_env)(*as_shapes(args))
    if axis_env is None:         # a pmapped or shard_mapped function: the axes it ran over
        axis_env = getattr(program, "axis_env", None)
    valued = all(hasattr(x, "__array__") or isinstance(x, (int, float, complex, np.generic))
                 for x in tree.flatten(args)[0])
    if not valued or hasattr(fun, "lower") or not decides(program):
        return program, axis_env, None
    if hasattr(fun, "trace"):    # a pmap or shard_map: what its devices received, replayed
        fun(*args)
        return fun.trace.program, axis_env, taken_in(fun.trace)
    return program, axis_env, taken_on(program, args, axis_env)
