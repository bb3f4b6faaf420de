"""A pmap called inside a mapped body: one ``xla_pmap`` equation of the outer program, as
JAX's nested pmap is.

Its body is traced once, on the grid of outer x inner devices (``Run.nest``: the inner
axis below the outer ones, as a 2-D mesh), into a program of its own that becomes the
equation's ``call_jaxpr``; the outer body's values it reads become extra operands
(closure conversion). Running the equation spreads each outer device's operands over its
inner devices, runs the inner program on the whole grid at once and gathers the results
back along ``out_axes``. (A nested pmap is not differentiated: take the gradient inside
it.)
"""
from __future__ import annotations

import numpy as np

from ..core.core import Aval, Primitive, aval_of, bind, context, running
from ..core.program import eval_program, trace
from ..core.values import StackedValue


def _values(stacks, avals):
    return [StackedValue(a, s) for a, s in zip(avals, stacks)]


def _map_avals(avals, in_axes):
    """One inner device's types: each mapped argument without its mapped axis."""
    return [a if ax is None else a.update(shape=a.shape[:ax] + a.shape[ax + 1:])
            for a, ax in zip(avals, in_axes)]


def nested_pmap(body_flat, args, in_axes, out_axes, axis_name, size, name, log=None):
    """A pmap called in a body being traced: its body traced once on the grid of outer x
    inner devices, one ``xla_pmap`` equation of the outer program. ``out_axes`` may be a
    function of the traced program (the results' structure is known only then)."""
    run = context.run
    inner = run.nest(((axis_name, size),), abstract=True)
    program, lifted = trace(body_flat, _map_avals([aval_of(x) for x in args], in_axes), inner)
    out_axes = out_axes(program) if callable(out_axes) else out_axes
    return bind(xla_pmap, *lifted, *args, call_jaxpr=program, axis_name=axis_name,
                axis_size=size, in_axes=tuple(in_axes), out_axes=tuple(out_axes),
                n_consts=len(lifted), name=name, _log=log)


def _pmap_abstract(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                   _log=None):
    out = []
    for a, ax in zip(call_jaxpr.out_avals, out_axes):
        shape = a.shape if ax is None else a.shape[:ax] + (axis_size,) + a.shape[ax:]
        out.append(Aval(shape, a.dtype, a.weak_type))
    return out


def _pmap_stacked(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                  _log=None):
    """The inner program over the grid of outer x inner devices; ``_log`` (the front end's)
    writes what each inner device received and returned into the run's log."""
    run = context.run
    inner = run.nest(((axis_name, axis_size),), abstract=False)
    size, n = axis_size, run.n

    def spread(x, ax):                      # outer rows -> rows of the inner grid
        stack = run.stack_of(x, aval_of(x))
        if ax is None:
            return np.repeat(stack, size, axis=0)
        moved = np.moveaxis(stack, ax + 1, 1)
        return moved.reshape((n * size,) + moved.shape[2:])
    consts, args = ops[:n_consts], ops[n_consts:]
    pieces = [spread(c, None) for c in consts] + [spread(x, ax) for x, ax in zip(args, in_axes)]
    avals = call_jaxpr.in_avals
    if _log is not None:
        _log.receive(inner, pieces[n_consts:])
    with running(inner):
        outs = eval_program(call_jaxpr, _values(pieces[:n_consts], [v.aval for v in call_jaxpr.constvars]),
                            _values(pieces[n_consts:], avals))
    stacks = [inner.stack_of(o, aval_of(o)) for o in outs]
    if _log is not None:
        _log.returned(inner, stacks, n)
    result = []
    for stack, ax in zip(stacks, out_axes):
        per_outer = stack.reshape((n, size) + stack.shape[1:])
        result.append(per_outer[:, 0] if ax is None else np.moveaxis(per_outer, 1, ax + 1))
    return result


xla_pmap = Primitive("xla_pmap", _pmap_stacked, _pmap_abstract, multiple_results=True,
                     needs_run=True, cost=lambda ins, outs, **p: (0, 0),
                     show=lambda p: {k: p[k] for k in ("axis_name", "axis_size", "call_jaxpr",
                                                       "name")})
