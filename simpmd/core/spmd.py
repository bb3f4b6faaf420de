"""The driver under ``simpmd.shard_map`` and ``simpmd.pmap``: one body, a grid of devices.

``shard_map`` maps a body over every device of a mesh, and ``pmap`` is a front end over
the same machinery, as in JAX, where ``jax.pmap`` builds a one-axis mesh and calls
``jax.shard_map`` (``_cached_shard_map`` in jax/_src/pmap.py, since jax 0.8). Each front
end says in its own words how the arguments are cut and how the results go back
together; this module does the rest, the same way for both:

1. every mapped argument leaf arrives as a :class:`Piece`: all devices' pieces *stacked*
   along a leading device axis (row ``k`` belongs to device ``k`` of the grid, counted
   row-major over the axes);
2. the body runs one time over the stacks, as JAX traces it once (``batching.py``); a
   pmap nested inside it adds its axis below the outer ones, a grid of outer x inner
   devices, and is traced once too. With ``eager=True`` the body runs as one program per
   device instead (``simpmd/eager``), and so do pmaps nested inside it;
3. the results come back stacked the same way, one shape on every device, and the front
   end's ``assemble`` puts them together.

The log of the run (what each device received, every collective, what it returned)
is written here for both front ends, so their traces read alike.
"""
from __future__ import annotations

import inspect
import math

import numpy as np

from . import batching, bridge, program, tree
from .devices import SimDevice
from .batching import StackedRun, StackedValue, run_once
from .context import current_task, refuse_non_arrays
from .trace import Trace
from .traced import DeviceValue

_last_trace = None


def last_trace():
    """The trace of the most recent top-level run of pmap or shard_map (or None)."""
    return _last_trace


def record_trace(trace):
    """Keep ``trace`` as the one :func:`last_trace` returns; returns it."""
    global _last_trace
    _last_trace = trace
    return trace


class Piece:
    """One mapped argument leaf: every device's piece of it, stacked.

    ``stack[k]`` is what device ``k`` of the grid gets; ``detail(k)`` is the 'receive'
    row of its log; ``varies`` are the mesh axes the piece varies over (for
    ``simpmd.grad`` under ``shard_map(check_vma=True)``), or None.
    """

    __slots__ = ("stack", "detail", "varies")

    def __init__(self, stack, detail, varies=None):
        self.stack, self.detail, self.varies = stack, detail, varies


def run(owner, fun, devices, axes, args, kwargs, assemble, *, eager=False, check_vma=False,
        maps_a_mesh=False, cache=None, closed=()):
    """Run ``fun(*args, **kwargs)`` over the grid ``axes`` (``((name, size), ...)``) of
    ``devices``, and return ``assemble(stacks, treedef, run)``.

    Mapped leaves of ``args``/``kwargs`` are :class:`Piece`\\ s; any other leaf reaches
    every device as it is. ``assemble`` gets each result leaf stacked over the devices,
    the results' treedef, and the run, which tells it ``n``, ``devices``, ``where(k)`` (how
    messages name device ``k``), ``returned(stack, detail)`` (logs what each device
    returned), ``nested`` (the results go back into an outer body), ``outer_n`` (how many
    outer programs the grid's devices are split among) and ``sub_grids()`` (the devices
    of each program's inner pmap, if any). Called inside a running program, the grid is
    nested under it (a nested pmap). ``owner.trace`` is set to the run's trace, which
    :func:`last_trace` returns too.

    ``cache`` is ``(function, signature)`` for a front end that caches its programs as
    JAX does (pmap): the first call with a signature traces the body into a program
    (``program.py``), later ones run the program and none of the body's Python.
    """
    parent = current_task()
    if parent is not None and parent.stacked:
        # A pmap inside a body traced once: its grid nests below the outer one (a 2-D
        # mesh of outer x inner devices), and it is traced once too.
        return _run_once(owner, fun, parent.nest(axes), args, kwargs, assemble, cache, closed)
    if parent is None and not eager and batching.TRACE_ONCE:
        batch = StackedRun(devices, axes, maps_a_mesh=maps_a_mesh)
        batch.check_vma = check_vma
        return _run_once(owner, fun, batch, args, kwargs, assemble, cache)
    # One program per device (simpmd.eager registers it in bridge.py): eager=True, or a
    # pmap nested in an eager body.
    return bridge.eager.run_per_device(owner, fun, devices, axes, args, kwargs, assemble,
                                       eager, check_vma, maps_a_mesh, parent)


def _run_once(owner, fun, batch, args, kwargs, assemble, cache=None, closed=()):
    """The body, one time, over every device's piece stacked (see batching.py), or its
    cached program (see program.py)."""
    leaves, treedef = tree.flatten((args, kwargs))
    pieces = [x for x in leaves if type(x) is Piece]
    for x in pieces:
        if x.varies is not None:
            batch.input_vma[id(x.stack)] = (x.stack, x.varies)
    batch.receive(pieces)
    inputs = [StackedValue(x.stack) if type(x) is Piece else x for x in leaves]
    args, kwargs = tree.unflatten(treedef, inputs)
    traced = None if cache is None else program.cached(*cache)
    if _capturing:                       # make_jaxpr of a mapped function: trace it anew
        cache, traced = None, None
    if isinstance(traced, program.Program) and len(traced.constvars) != len(closed):
        traced = None                    # traced in another body, reading its values
    try:
        if isinstance(traced, program.Program):
            result = run_once(batch, traced.run, (inputs, closed), {})
        elif (cache is not None and traced is None) or _capturing or batch.check_vma:
            varies = [x.varies if type(x) is Piece else None for x in leaves]
            result, traced = trace(batch, fun, args, kwargs, inputs, treedef, cache, varies)
        else:
            result = run_once(batch, fun, args, kwargs)
        out, out_def = tree.flatten(result)
        refuse_non_arrays([batch.where(0)], [(out, out_def)], out_def)
        stacks = [v.value if type(v) is StackedValue else _everywhere(plain(v), batch.n) for v in out]
        outputs = assemble(stacks, out_def, batch)
    except Exception as exc:               # the trace so far goes with the error
        if getattr(exc, "trace", None) is None:
            exc.trace = Trace(batch.events)
        owner.trace = record_trace(exc.trace)
        raise
    owner.trace = record_trace(Trace(batch.events, log=batch))
    owner.trace.program = traced if isinstance(traced, program.Program) else None
    return outputs


def trace(batch, fun, args, kwargs, inputs, treedef, cache=None, varies=None):
    """Run the body once while recording its program; cache the program under ``cache``
    (or, if it cannot be replayed, that it must be traced on every call). Under
    ``shard_map(check_vma=True)`` the program also types each value with the mesh axes it
    varies over (``varies``: each input's), and ``batch.out_types`` gets the results'.
    Returns the body's result and the program; ``program.last_traced`` keeps the program
    too, for ``make_jaxpr`` of a mapped function, which reaches this through its front end."""
    rec = program.Recorder(track_vma=batch.check_vma)
    rec.lifts = batch.outer is not None    # a nested pmap's body: lift the outer values it reads
    varies = varies or [None] * len(inputs)
    invars = [rec.input(v, a) if type(v) is StackedValue else None for v, a in zip(inputs, varies)]
    with program.recorder_active(rec):
        result = run_once(batch, fun, args, kwargs)
    traced = rec.finish(invars, treedef, result)
    traced.axis_env = tuple((name, size) for name, size in batch.axes if name is not None)
    if batch.check_vma and rec.broken is None:    # else: types unknown, values are checked
        batch.out_types = [(traced.vma.get(v, frozenset()), v) if type(v) is program.Var
                           else (frozenset(), None) for v in traced.outs]
        batch.why = traced.why
    if cache is not None:
        program.store(*cache, traced if rec.broken is None else program.UNCACHEABLE)
    program.last_traced = traced
    return result, traced


_capturing: list = []


def make_jaxpr(fun, static_argnums=(), axis_env=None, return_shape=False):
    """``jax.make_jaxpr``: ``make_jaxpr(f, axis_env=[("i", 8)])(x)`` traces ``f`` as one
    device would run it, inside a map over the named axes, and returns its program, which
    prints in JAX's notation (collectives included). ``f`` may also be a ``simpmd.pmap``-ed
    or ``shard_map``-ed function: then the program is its body's, as each device runs it
    (JAX prints the same body inside a ``shard_map`` equation).
    """
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def traced(*args, **kwargs):
        if hasattr(fun, "trace") and hasattr(fun, "fun"):      # a pmap or shard_map
            _capturing.append(True)
            program.last_traced = None
            try:
                out = fun(*args, **kwargs)
            finally:
                _capturing.pop()
            jaxpr = program.last_traced
            return (jaxpr, _shapes(out)) if return_shape else jaxpr
        axes = tuple((name, int(size)) for name, size in (axis_env or ()))
        n = math.prod(size for _, size in axes)
        batch = StackedRun([SimDevice(i) for i in range(n)], axes)
        dynamic = [i for i in range(len(args)) if i not in {a % max(len(args), 1) for a in static}]
        leaves, treedef = tree.flatten(([args[i] for i in dynamic], kwargs))
        inputs = []
        for x in leaves:
            if isinstance(x, (str, bytes)) or x is None:
                inputs.append(x)                   # not an array: reaches the body as it is
            else:           # as JAX sees it without x64: 64-bit numbers become 32-bit
                a = plain(x)
                a = a.astype(program.canonical_dtype(a.dtype), copy=False)
                inputs.append(StackedValue(np.broadcast_to(a, (n,) + a.shape)))
        dyn, kw = tree.unflatten(treedef, inputs)

        def body(*dyn, **kw):
            full = list(args)
            for i, v in zip(dynamic, dyn):
                full[i] = v
            return fun(*full, **kw)
        result, jaxpr = trace(batch, body, dyn, kw, inputs, treedef)
        return (jaxpr, _shapes(result)) if return_shape else jaxpr
    return traced


def _shapes(out):
    """The shape and dtype of each result leaf (``return_shape=True``)."""
    leaves, treedef = tree.flatten(out)
    return tree.unflatten(treedef, [(tuple(np.shape(plain(v))), plain(v).dtype) for v in leaves])


def _everywhere(value, n):
    """A result that is the same on every device (a constant), stacked ``n`` times (a view)."""
    return np.broadcast_to(value, (n,) + value.shape)


# -- shared by the front ends ----------------------------------------------------------------


def leaf_label(treedef, k) -> str:
    """'[1]' or "['w']": how leaf ``k`` of a result tree is named in messages ('' for a leaf)."""
    if treedef.kind == "leaf":
        return ""
    dummy = tree.unflatten(treedef, list(range(treedef.num_leaves)))
    return tree.leaf_paths(dummy)[k]


def positional_names(fun) -> list[str]:
    """The names of ``fun``'s positional parameters, for messages about arguments."""
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


def plain(x):
    """The NumPy value of a result or argument leaf."""
    if isinstance(x, DeviceValue):
        return x.value
    return as_array(x)


def as_array(x):
    """A NumPy array for ``x``; Python numbers get JAX's default 32-bit dtypes.

    JAX (without x64) turns a Python float into float32 and an int into int32, while
    NumPy would pick 64 bits; arrays keep their own dtype.
    """
    if isinstance(x, (np.generic, np.ndarray)):
        return np.asarray(x)
    if isinstance(x, bool):
        return np.asarray(x, dtype=bool)
    if isinstance(x, int):
        return np.asarray(x, dtype=np.int32)
    if isinstance(x, float):
        return np.asarray(x, dtype=np.float32)
    if isinstance(x, complex):
        return np.asarray(x, dtype=np.complex64)
    return np.asarray(x)
