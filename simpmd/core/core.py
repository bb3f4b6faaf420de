"""Primitives, programs as data, and the one ``bind`` every operation goes through.

As in JAX (and its from-scratch twin, Autodidax), every operation on a value in a mapped
body is a *primitive* applied with *parameters*: ``x * 2`` is ``mul`` of ``x`` and the
literal ``2.0``, ``lax.psum(x, 'i')`` is ``psum[axes=('i',)]`` of ``x``. A primitive is one
row of facts (:class:`Primitive`): how to compute it for every device at once, what type
its result has, its derivative, what it costs. :func:`bind` applies one, whatever is
running:

* the *run* on this thread (``context.run``) computes it: every device's value at once
  (a :class:`~simpmd.core.run.Run`), one device's value (an eager run), or only
  its type (shapes without values, which is how a body is traced);
* each active *recorder* (``context.recorders``) writes it down as an :class:`Equation`,
  which is how a body becomes a :class:`Program` that later calls replay.

A program is plain data: input variables, equations ``outvars = primitive[params](invars)``
and output variables, each variable typed by an :class:`Aval` (shape, dtype, and the mesh
axes it varies over). Replaying it is binding each equation's primitive again.
"""
from __future__ import annotations

import itertools
import linecache
import os
import sys
import threading

import numpy as np

from . import bridge, dtypes


# -- types ---------------------------------------------------------------------------------------


class Aval:
    """A value's type: one device's shape and dtype, whether it is a weak Python number, the
    mesh axes it varies over (``vma``, under ``shard_map(check_vma=True)``), and its
    sharding (under ``jit`` with Explicit axes). JAX calls it a ShapedArray."""

    __slots__ = ("shape", "dtype", "weak_type", "vma", "sharding")

    def __init__(self, shape, dtype, weak_type=False, vma=frozenset(), sharding=None):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.weak_type, self.vma, self.sharding = weak_type, frozenset(vma), sharding

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))
    nbytes = property(lambda self: self.size * self.dtype.itemsize)

    def update(self, **changes) -> "Aval":
        fields = {k: getattr(self, k) for k in self.__slots__}
        fields.update(changes)
        return Aval(**fields)

    def __eq__(self, other):
        return isinstance(other, Aval) and all(getattr(self, k) == getattr(other, k)
                                               for k in self.__slots__)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.vma))

    def str_short(self) -> str:
        """``f32[16,64]``, ``f32[2,4]{V:x}`` or ``f32[16@data,64]``, as JAX prints types."""
        dims = [str(d) for d in self.shape]
        if self.sharding is not None:
            dims = [d + self.sharding.dim_suffix(k) for k, d in enumerate(dims)]
        text = f"{dtypes.short_name(self.dtype)}[{','.join(dims)}]"
        if self.vma:
            axes = sorted(self.vma, key=str)
            text += "{V:" + (axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")") + "}"
        return text

    __repr__ = str_short


def aval_of(x) -> Aval:
    """The type of an operand: a value's own, or a constant's as JAX would type it."""
    aval = getattr(x, "aval", None)
    if isinstance(aval, Aval):
        return aval
    if dtypes.is_weak_scalar(x):
        return Aval((), dtypes.of_python(x), weak_type=type(x) is not bool)
    return Aval(np.shape(x), dtypes.of_python(x))


class Var:
    """A variable of a program, typed by its :class:`Aval`."""

    __slots__ = ("aval",)

    def __init__(self, aval):
        self.aval = aval

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)

    def __repr__(self):
        return f"Var({self.aval.str_short()})"


class Lit:
    """A constant operand of an equation (a Python number, a NumPy array)."""

    __slots__ = ("value", "aval")

    def __init__(self, value):
        self.value, self.aval = value, aval_of(value)

    def __repr__(self):
        return f"Lit({self.value!r})"


class Equation:
    """``outvars = primitive[params](invars)``, with where the learner wrote it
    (``source``: 'file.py:12' and that line's code) and its ``phase`` ('forward', or
    'backward' for a gradient's backward pass, which the log marks)."""

    __slots__ = ("primitive", "params", "invars", "outvars", "source", "phase")

    def __init__(self, primitive, params, invars, outvars, source=("", ""), phase="forward"):
        self.primitive, self.params = primitive, params
        self.invars, self.outvars = invars, outvars
        self.source, self.phase = source, phase

    def __repr__(self):
        return f"<Equation {self.primitive.name} at {self.source[0]}>"


class Program:
    """A traced body: typed inputs, equations in order, outputs (variables or literals).

    ``constvars`` are values the body read from an enclosing body without being passed
    them (a nested pmap's closure), given as extra first inputs; ``in_tree``/``out_tree``
    the pytree structures of the arguments and results; ``axis_env`` the mapped axes it
    was traced over. It prints as ``jax.make_jaxpr`` prints a jaxpr.
    """

    def __init__(self, invars, eqns, outvars, in_tree=None, out_tree=None, constvars=(),
                 axis_env=()):
        self.invars, self.eqns, self.outvars = list(invars), list(eqns), list(outvars)
        self.in_tree, self.out_tree = in_tree, out_tree
        self.constvars, self.axis_env = list(constvars), tuple(axis_env)

    # What code written for JAX's ClosedJaxpr reads.
    jaxpr = property(lambda self: self)
    consts = property(lambda self: [])
    in_avals = property(lambda self: [v.aval for v in self.invars])
    out_avals = property(lambda self: [v.aval for v in self.outvars])

    def __str__(self):
        return pretty(self)

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


# -- primitives ------------------------------------------------------------------------------


class Primitive:
    """One row of facts about an operation. The columns:

    * ``stacked(*stacks, **params)``: the result for every device at once, each operand a
      NumPy array whose first axis runs over the devices (length 1 for a value every
      device shares); returns one array, or a list when ``multiple_results``;
    * ``abstract(*avals, **params)``: the result's :class:`Aval` (a list likewise);
    * ``vjp(cts, ins, outs, **params)``: the cotangents of the inputs, computed with
      :func:`bind` from the outputs' cotangents ``cts`` (None where none arrived), the
      inputs and the outputs; None means not differentiable;
    * ``cost(ins, outs, **params)``: (FLOPs, bytes read and written) of one device, each
      operation on its own (unfused), counted as ``jax.experimental.roofline`` counts
      ``unfused_flops`` and ``unfused_hbm_bytes`` where it has a rule;
    * ``show(params)``: the parameters as ``jax.make_jaxpr`` prints them.

    Collectives, loops and calls add their own columns (see ``collectives.py``).
    """

    multiple_results = False
    collective = False          # a collective's stacked rule asks the run for its groups

    def __init__(self, name, stacked=None, abstract=None, *, vjp=None, cost=None, show=None,
                 multiple_results=False, **columns):
        self.name = name
        self.stacked, self.abstract, self.vjp, self.cost = stacked, abstract, vjp, cost
        self.show = show or _shown_params
        self.multiple_results = multiple_results
        for key, value in columns.items():
            setattr(self, key, value)
        PRIMITIVES[name] = self

    def bind(self, *args, **params):
        return bind(self, *args, **params)

    def __repr__(self):
        return self.name


PRIMITIVES: dict = {}       # name -> Primitive: every row (a test checks their columns)


def _shown_params(params) -> dict:
    return {k: v for k, v in params.items() if not k.startswith("_")}


# -- the context: what this thread is running, and who is recording --------------------------


class Context(threading.local):
    """Per thread: the run that computes (None: plain NumPy, one device, no axes), the
    recorders writing equations down (innermost last), the phase ('forward', 'backward',
    or 'recompute' for a checkpoint's forward pass done again), the equation being
    replayed (whose source line the log names) and the iteration of each loop running."""

    def __init__(self):
        self.run = None
        self.recorders = []
        self.phase = "forward"
        self.eqn = None
        self.iteration = ()


context = Context()


class running:
    """``with running(run):`` makes ``run`` compute the operations of this thread."""

    def __init__(self, run):
        self.run = run

    def __enter__(self):
        self.previous, context.run = context.run, self.run
        return self.run

    def __exit__(self, *exc):
        context.run = self.previous


class backward_pass:
    """``with backward_pass():`` marks what runs inside as a gradient's backward pass."""

    def __enter__(self):
        self.previous, context.phase = context.phase, "backward"

    def __exit__(self, *exc):
        context.phase = self.previous


def bind(prim, *args, **params):
    """Apply ``prim`` to ``args``: computed by the run on this thread, written down by the
    recorders. Inside a real JAX trace (an argument is a JAX tracer) JAX applies it."""
    if bridge.jax is not None and bridge.holds_jax_tracer(args):
        return bridge.jax.bind(prim, args, params)
    run = context.run or plain
    args = run.prepare(prim, args, params)
    outs = run.apply(prim, args, params)
    if context.recorders:
        context.recorders[-1].record(prim, params, args, outs)
    return outs if prim.multiple_results else outs[0]


plain = None          # the run outside any mapped body (run.py makes it): one device, no axes


# -- where the learner's code called from --------------------------------------------------

_sources: dict = {}         # (code object, line) -> (source, code): an SPMD body repeats them


def caller_source() -> tuple[str, str]:
    """('file.py:12', 'the code on that line'): the learner's line that is running, or the
    line an equation being replayed was traced from. Frames of simpmd's own engine and front
    ends are skipped (the tour in ``simpmd/__main__.py`` counts as the learner's)."""
    if context.eqn is not None:
        return context.eqn.source
    frame = sys._getframe(1)
    while frame is not None and _is_engine(frame.f_globals.get("__name__", "")):
        frame = frame.f_back
    if frame is None:
        return "", ""
    key = (frame.f_code, frame.f_lineno)
    found = _sources.get(key)
    if found is None:
        filename = frame.f_code.co_filename
        name = os.path.basename(filename)
        if "ipykernel" in filename or filename.startswith("<ipython"):
            name = "<cell>"          # notebook cells get temporary, machine-dependent names
        found = _sources[key] = (f"{name}:{frame.f_lineno}",
                                 linecache.getline(filename, frame.f_lineno).strip())
    return found


def _is_engine(module: str) -> bool:
    return (module.startswith("simpmd.") and module not in ("simpmd.__main__",)
            and not module.startswith(("simpmd.exercises", "simpmd.course")))


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the learner's code, not simpmd's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and _is_engine(frame.f_globals.get("__name__", "")):
        frame, level = frame.f_back, level + 1
    return level


# -- printing in JAX's notation ----------------------------------------------------------------


def _names():
    """a, b, ..., z, ba, bb, ...: JAX's variable names."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(1):
        for combo in itertools.product(letters, repeat=n):
            if n == 1 or combo[0] != "a":
                yield "".join(combo)


def _param_text(value, indent, nested) -> str:
    if isinstance(value, Program):          # a nested program, indented under its line
        return nested(value, indent)
    if isinstance(value, tuple) and value and all(isinstance(v, Program) for v in value):
        return "(\n" + ",\n".join(" " * indent + nested(v, indent) for v in value) + "\n)"
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return "(" + ", ".join(_param_text(v, indent, nested) for v in value) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, str):
        return value
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return repr(value)


def _literal(v, like) -> str:
    """A constant operand: a weak Python number in the dtype it meets (``like``)."""
    value = np.asarray(v.value)
    if value.ndim == 0:
        dtype = like if v.aval.weak_type and like is not None and like.kind != "b" else v.aval.dtype
        return f"{value.astype(dtype)[()]}:{dtypes.short_name(dtype)}[]"
    return f"<{v.aval.str_short()} constant>"


def _literal_dtype(eqn):
    """The dtype a weak literal operand of ``eqn`` is printed in: its first variable's (or
    result's); none for an equation that holds a body, whose operands keep their own."""
    if getattr(eqn.primitive, "needs_run", False):
        return None
    like = next((v.aval.dtype for v in eqn.invars if type(v) is Var), None)
    return like if like is not None else (eqn.outvars[0].aval.dtype if eqn.outvars else None)


def pretty(program, width=80, names=None) -> str:
    """The program as ``jax.make_jaxpr`` prints a jaxpr: variables named in order of
    appearance, nested programs included (on one line where it fits), and an equation's
    result that nothing reads shown as ``_``."""
    names = names if names is not None else {None: _names()}

    def name(v):
        if v not in names:
            names[v] = next(names[None])
        return names[v]

    def typed(v):
        return f"{name(v)}:{v.aval.str_short()}"

    def operand(v, like):
        return name(v) if type(v) is Var else _literal(v, like)

    def nested(inner, indent, key=""):
        rows = pretty(inner, width - indent, names).split("\n")
        flat = f"{rows[0]} {'; '.join(r.strip() for r in rows[1:-1])} {rows[-1].strip()}"
        if indent + len(key) + len(flat) <= width and len(rows) == len(inner.eqns) + 2:
            return flat
        return ("\n" + " " * indent).join(rows)

    def line(outs, prim_name, params, ins, indent=4):
        pad, head = " " * indent, f"{outs} = " if outs else ""
        pairs = params if isinstance(params, list) else sorted(params.items())   # (or in order)
        shown = " ".join(f"{k}={_param_text(v, indent + 4, nested)}" for k, v in pairs)
        one = f"{pad}{head}{prim_name}{f'[{shown}]' if shown else ''} {ins}".rstrip()
        if (len(one) <= width and "\n" not in one) or not shown:
            return [one]
        return ([f"{pad}{head}{prim_name}["]
                + [f"{pad}  {k}=" + _param_text(v, indent + 2, lambda p, i: nested(p, i, k + "="))
                   for k, v in pairs]
                + [f"{pad}] {ins}".rstrip()])

    read = {v for e in program.eqns for v in e.invars} | set(program.outvars)

    def result(v):
        return typed(v) if v in read else f"_:{v.aval.str_short()}"

    consts = " ".join(typed(v) for v in program.constvars)
    lines = [f"{{ lambda {consts}; {' '.join(typed(v) for v in program.invars)}. let"]
    for eqn in program.eqns:
        ins = " ".join(operand(v, _literal_dtype(eqn)) for v in eqn.invars)
        printed = getattr(eqn.primitive, "printed", None)
        if printed is not None:       # a row that JAX spells as several equations (pmean)
            for prim_name, params, text_ins, out_vars in printed(eqn, name, typed, ins):
                lines += line(out_vars, prim_name, params, text_ins)
            continue
        outs = " ".join(result(v) for v in eqn.outvars)
        lines += line(outs, eqn.primitive.name, eqn.primitive.show(eqn.params), ins)
    outs = ", ".join(name(v) if type(v) is Var else operand(v, None) for v in program.outvars)
    lines.append(f"  in ({outs}{',' if len(program.outvars) == 1 else ''}) }}")
    return "\n".join(lines)
