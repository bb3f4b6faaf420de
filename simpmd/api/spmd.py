"""The driver under ``simpmd.shard_map`` and ``simpmd.pmap``: one body, a grid of devices.

``shard_map`` maps a body over every device of a mesh, and ``pmap`` is a front end over
the same machinery, as in JAX, where ``jax.pmap`` builds a one-axis mesh and calls
``jax.shard_map`` (``_cached_shard_map`` in jax/_src/pmap.py, since jax 0.8). Each front
end says how its arguments are cut and how the results go back together; this module
does the rest, the same way for both:

1. every mapped argument leaf arrives as a :class:`Piece`: all devices' pieces *stacked*
   along a leading device axis (row ``k`` belongs to device ``k`` of the grid, counted
   row-major over the axes);
2. the body is traced once per signature into a program (``core/program.py``), cached as
   JAX caches it, and the program runs over the stacks (``eager=True`` runs one copy of the
   body per device instead, ``simpmd/eager``);
3. the results come back stacked the same way, and the front end's ``assemble`` puts them
   together.

The log of the run (what each device received, every collective, what it returned) is
written here for both front ends, so their traces read alike.
"""
from __future__ import annotations

import builtins
import inspect

import numpy as np

from ..core import bridge, dtypes, errors
from . import tree
from ..core.core import Aval, aval_of, context, running
from .shapes import is_shape
from .trace import Trace
from ..core.program import cached, eval_program, store, trace
from ..core.run import Run
from ..core.values import StackedValue

_last_trace = None


def last_trace():
    """The trace of the most recent top-level run of pmap or shard_map (or None)."""
    return _last_trace


def record_trace(trace_):
    """Keep ``trace_`` as the one :func:`last_trace` returns; returns it."""
    global _last_trace
    _last_trace = trace_
    return trace_


class Piece:
    """One mapped argument leaf: every device's piece of it, stacked.

    ``stack[k]`` is what device ``k`` of the grid gets (None when the call runs on shapes
    alone); ``aval`` one device's type; ``detail(k)`` is the 'receive' row of its log;
    ``varies`` are the mesh axes the piece varies over (its type under
    ``shard_map(check_vma=True)``), or None.
    """

    __slots__ = ("stack", "detail", "varies", "aval")

    def __init__(self, stack, detail, varies=None, aval=None):
        self.stack, self.detail, self.varies = stack, detail, varies
        self.aval = aval if stack is None else Aval(stack.shape[1:], dtypes.canonical(stack.dtype))


class Traced:
    """What a call's signature traced to: the program and the results' structure."""

    __slots__ = ("program", "out_tree", "axes", "size", "static", "paths")

    def __init__(self, program, out_tree):
        self.program, self.out_tree = program, out_tree


def program_for(fun, run, args, kwargs, cache=None):
    """The program of ``fun`` for these arguments (``Piece`` leaves are the mapped ones):
    the cached one for this signature, or traced now on ``run``'s grid (types only)."""
    traced = cached(*cache) if cache is not None else None
    if traced is not None:
        return traced
    leaves, treedef = tree.flatten((args, kwargs))
    where = [k for k, x in enumerate(leaves) if type(x) is Piece]
    avals = [leaves[k].aval.update(vma=(leaves[k].varies or ()) if run.check_vma else ())
             for k in where]
    out_tree = []
    tracing = run.tracing()
    flat = tree.of_some_leaves(fun, treedef, leaves, where, out_tree, check=lambda out, out_def:
                               refuse_non_arrays(tracing.where(0), out, out_def))
    try:
        program, _ = trace(flat, avals, tracing)
    except Exception as exc:
        problem = explain_failure(tracing.where(0), run.devices[0].id if run.devices else None, exc)
        if problem is exc:
            raise
        problem.partial_program = getattr(exc, "partial_program", None)
        raise problem from exc
    traced = Traced(program, out_tree[0])
    if cache is not None:
        store(*cache, traced)
    return traced


def run(owner, fun, devices, axes, args, kwargs, assemble, *, eager=False, check_vma=False,
        maps_a_mesh=False, cache=None):
    """Run ``fun(*args, **kwargs)`` over the grid ``axes`` (``((name, size), ...)``) of
    ``devices``, and return ``assemble(results, treedef, run, program)``.

    Mapped leaves of ``args``/``kwargs`` are :class:`Piece` s; any other leaf reaches every
    device as it is. ``assemble`` gets each result leaf stacked over the devices (or, when
    a piece has no stack, the call running on shapes alone, each result's one-device
    :class:`Aval`), the results' treedef, the run (which names device ``k`` with
    ``where(k)`` and logs what each device returned with ``returned(stack, detail)``) and
    the program (None for an eager run). ``owner.trace`` is set to the run's trace.
    """
    if eager or (context.run is not None and context.run.eager):
        if any(type(x) is Piece and x.stack is None for x in tree.flatten((args, kwargs))[0]):
            raise TypeError(
                "eager=True runs each device's Python on its values, and ShapeDtypeStructs "
                "have none. Drop eager=True to run the program on shapes alone (traced once, "
                "as JAX runs it), or pass arrays.")
        return bridge.eager.run_per_device(owner, fun, devices, axes, args, kwargs, assemble,
                                           eager, check_vma, maps_a_mesh, context.run)
    leaves, _ = tree.flatten((args, kwargs))
    pieces = [x for x in leaves if type(x) is Piece]
    shapes_only = any(p.stack is None for p in pieces)
    grid = Run(devices, axes, abstract=shapes_only, check_vma=check_vma, maps_a_mesh=maps_a_mesh)
    grid.log.receive(grid, pieces)
    program = None
    try:
        try:                               # the body: traced (or cached), then run
            traced = program_for(fun, grid, args, kwargs, cache)
            program = traced.program
            inputs = [StackedValue(v.aval, None if shapes_only else _canonical(p.stack))
                      for v, p in zip(program.invars, pieces)]
            with running(grid):
                outs = eval_program(program, [], inputs)
        except Exception as exc:
            problem = explain_failure(grid.where(0), devices[0].id if devices else None, exc)
            grid.log.error(grid, f"{type(problem).__name__}: {problem}")
            if problem is exc:
                raise
            raise problem from exc
        results = [aval_of(o) if shapes_only else grid.stack_of(o, aval_of(o)) for o in outs]
        outputs = assemble(results, traced.out_tree, grid, program)
    except Exception as exc:               # the trace so far goes with the error
        if getattr(exc, "trace", None) is None:
            exc.trace = _trace_of(grid, getattr(exc, "partial_program", None), shapes_only)
        owner.trace = record_trace(exc.trace)
        _flush(grid)
        raise
    owner.trace = record_trace(_trace_of(grid, program, shapes_only))
    _flush(grid)
    return outputs


def _trace_of(grid, program, shapes_only):
    trace_ = Trace(log=grid.log, devices=grid.devices)
    trace_.program, trace_.shapes_only = program, shapes_only
    if shapes_only and program is not None:     # what a run on types cannot log
        trace_.unlogged = sorted({e.primitive.unlogged for e in program.eqns   # the rows'
                                  if e.primitive.unlogged})   # own words
    return trace_


def _canonical(stack):
    dtype = dtypes.canonical(stack.dtype)
    return stack if stack.dtype == dtype else stack.astype(dtype)


def _flush(grid):
    """debug.print's lines, printed once the run has returned, device by device."""
    for line in grid.log.prints:
        builtins.print(line)
    grid.log.prints = []


def explain_failure(where, device, exc, note=""):
    """The error to raise when the mapped function raised ``exc`` on ``where``."""
    if isinstance(exc, errors.SimpmdError):
        if where not in str(exc):
            exc.args = (f"on {where}: {exc}",) + exc.args[1:]
        return exc
    if any(k in str(exc) for k in ("__jax_array__", "StackedValue")):
        return errors.TracerArrayConversionError(
            f"on {where}: a jax.numpy function was given a simpmd device value ({exc}). Call "
            f"array functions through simpmd.numpy (import simpmd.numpy as snp; snp.exp(x)): "
            f"it works on both engines.")
    return errors.DeviceError(f"the mapped function raised {type(exc).__name__} on {where}: "
                              f"{exc}.{note}", device=device, original=exc)


# -- shared by the front ends ----------------------------------------------------------------


def leaf_label(treedef, k) -> str:
    """'[1]' or "['w']": how leaf ``k`` of a result tree is named in messages ('' for a leaf)."""
    return leaf_labels(treedef)[k]


def leaf_labels(treedef) -> list:
    """:func:`leaf_label` of every leaf, in order (one walk over the tree)."""
    if treedef.kind == "leaf":
        return [""]
    return tree.leaf_paths(tree.unflatten(treedef, list(range(treedef.num_leaves))))


def positional_names(fun) -> list:
    """The names of ``fun``'s positional parameters, for messages about arguments."""
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def as_array(x):
    """A NumPy array for ``x``: Python numbers get JAX's default dtypes (float32, int32)."""
    if isinstance(x, StackedValue):
        return x.value
    if isinstance(x, (np.generic, np.ndarray)):
        return np.asarray(x)
    if type(x) in (bool, int, float, complex):
        return np.asarray(x, dtype=dtypes.of_python(x))
    return np.asarray(x)


def value_or_shape(x):
    """An argument leaf as a NumPy array, or a ShapeDtypeStruct as it is (both have a
    ``shape``, ``ndim`` and ``dtype``, which is all a front end checks)."""
    return x if is_shape(x) else as_array(x)


def refuse_non_arrays(place, leaves, treedef):
    """A result leaf must be an array or a number: JAX cannot return a string or an object."""
    for k, leaf in enumerate(leaves):
        if isinstance(leaf, (str, bytes)) or (
                not isinstance(leaf, (np.ndarray, np.generic, int, float, complex, StackedValue))
                and np.asarray(leaf).dtype.kind in "OUS"):
            at = "" if treedef.kind == "leaf" else f" at position {k} of its results"
            raise errors.ResultTypeError(
                f"{place} returned {leaf!r} (a {type(leaf).__name__}){at}, which is not an "
                f"array. A mapped function returns arrays (JAX: 'not a valid JAX type'). "
                f"Return numbers or arrays; to show text from a device, use "
                f"simpmd.debug.print inside the body, or compute the text on the host from "
                f"the results.")
