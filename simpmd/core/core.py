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

    __slots__ = ("shape", "dtype", "weak_type", "vma", "sharding", "unreduced", "reduced")

    def __init__(self, shape, dtype, weak_type=False, vma=frozenset(), sharding=None,
                 unreduced=frozenset(), reduced=frozenset()):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        self.weak_type, self.vma, self.sharding = weak_type, frozenset(vma), sharding
        self.unreduced, self.reduced = frozenset(unreduced), frozenset(reduced)  # shard_map's

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
        text = f"{dtypes.short_name(self.dtype)}[{','.join(dims)}]{getattr(self.sharding, 'suffix', str)()}"
        sets = [f"{w}:" + (a[0] if len(a) == 1 else "(" + ",".join(a) + ")") for w, a in zip(
            "VUR", [sorted(s, key=str) for s in (self.vma, self.unreduced, self.reduced)]) if a]
        return text + ("{" + ", ".join(sets) + "}" if sets else "")  # f32[2]{V:y, U:x}

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
        self.aval = aval_of(value)
        if isinstance(value, np.ndarray) and value.dtype != self.aval.dtype:
            value = value.astype(self.aval.dtype)     # np.zeros' float64 is JAX's float32
        self.value = value

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

    def __str__(self):           # the printer is simpmd.api.printer's, registered in bridge
        return bridge.printer(self) if bridge.printer else object.__repr__(self)

    __repr__ = __str__

    _repr_pretty_ = lambda self, p, cycle: p.text(str(self))     # noqa: E731 (IPython's)

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

    Collectives, loops and calls add their own, each declared below with its default.
    """

    multiple_results = collective = elementwise = needs_run = same_names = by_axes = False
    by_position = unequal_groups = unreduces = same_bytes = unlogged = False
    linearize = named = reduction = op = lax_params = probe_keywords = math = hlo = wire_bytes = None

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
    recorders. (Inside a real JAX trace the front ends call JAX's own functions instead.)"""
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
