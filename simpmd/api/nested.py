"""A pmap called inside a mapped body: one ``xla_pmap`` equation of the outer program, as
JAX's nested pmap is.

Its body is traced once, on the grid of outer x inner devices (``Run.nest``: the inner
axis below the outer ones, as a 2-D mesh), into a program of its own that becomes the
equation's ``call_jaxpr``; the outer body's values it reads become extra operands
(closure conversion). Running the equation spreads each outer device's operands over its
inner devices, runs the inner program on the whole grid at once and gathers the results
back along ``out_axes``. A pmap called where no axis is mapped (under ``jit``, ``grad``,
``checkpoint`` or a loop at the top level) is the same equation over its own devices.

Its derivative is cut as a ``jit``'s is (``loops.split_call``): the forward pmap also
returns each device's residuals (stacked along a new leading axis), the backward pmap takes
them with the results' cotangents; the cotangent of an argument every device shares
(``in_axes=None``) is summed over the mapped axis, as JAX's transpose sums it.
"""
from __future__ import annotations

import numpy as np

from ..core import collectives as K
from ..partitioner.columns import register
from ..core import core, loops
from ..core.core import Aval, Equation, Primitive, Var, aval_of, bind, context, running
from ..core.program import eval_program, trace
from ..core.values import StackedValue
from ..partitioner.sharding import whole


def _values(stacks, avals):
    return [StackedValue(a, s) for a, s in zip(avals, stacks)]


def _map_avals(avals, in_axes):
    """One inner device's types: each mapped argument without its mapped axis, and without
    the sharding a jit around it typed it with (a pmap body's values are per device)."""
    return [a.update(sharding=None) if ax is None else
            a.update(shape=a.shape[:ax] + a.shape[ax + 1:], sharding=None)
            for a, ax in zip(avals, in_axes)]


def nested_pmap(body_flat, args, in_axes, out_axes, axis_name, size, name, log=None,
                devices=None):
    """A pmap called in a body being traced: its body traced once on the grid of outer x
    inner devices, one ``xla_pmap`` equation of the outer program. ``out_axes`` may be a
    function of the traced program (the results' structure is known only then);
    ``devices``: a pmap's own devices, where the body around it maps no axis."""
    run = context.run
    inner = run.nest(((axis_name, size),), abstract=True, devices=devices)
    program, lifted = trace(body_flat, _map_avals([aval_of(x) for x in args], in_axes), inner)
    out_axes = out_axes(program) if callable(out_axes) else out_axes
    return bind(xla_pmap, *lifted, *args, call_jaxpr=program, axis_name=axis_name,
                axis_size=size, in_axes=tuple(in_axes), out_axes=tuple(out_axes),
                n_consts=len(lifted), name=name, _log=log, _devices=devices)


def _pmap_abstract(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                   _log=None, _devices=None, _vjp=None):
    out = []
    for a, ax in zip(call_jaxpr.out_avals, out_axes):
        shape = a.shape if ax is None else a.shape[:ax] + (axis_size,) + a.shape[ax:]
        out.append(Aval(shape, a.dtype, a.weak_type))
    return out


def _pmap_stacked(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                  _log=None, _devices=None, _vjp=None):
    """The inner program over the grid of outer x inner devices; ``_log`` (the front end's)
    writes what each inner device received and returned into the run's log."""
    run = context.run or core.plain
    inner = run.nest(((axis_name, axis_size),), abstract=False, devices=_devices)
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


def _pmap_linearize(eqn, wants):
    """The pmap cut in two: the forward one also returns every device's residuals."""
    p = eqn.params
    run = context.run or core.plain
    in_axes = (None,) * p["n_consts"] + tuple(p["in_axes"])
    grid = run.nest(((p["axis_name"], p["axis_size"]),), abstract=True, devices=p["_devices"]
                    if p["_devices"] is not None else run.all_devices or None)
    with running(grid):
        forward, backward, split = loops.split_call(loops.closed(p["call_jaxpr"]), wants)
    n_res = split.n_saved
    for k, (v, ax) in enumerate(zip(backward.outvars, [a for a, w in zip(in_axes, split.active)
                                                        if w])):
        if ax is None and type(v) is Var:     # shared by every device: the parts summed
            total = Var(v.aval)
            backward.eqns.append(Equation(K.psum, dict(axes=(p["axis_name"],),
                                                       axis_index_groups=None),
                                          [v], [total], phase="backward"))
            backward.outvars[k] = total
    common = dict(p, n_consts=0, _log=None)
    bwd = dict(common, call_jaxpr=backward, in_axes=tuple(in_axes[i] for i in split.used)
               + (0,) * n_res + tuple(a for a, w in zip(p["out_axes"], split.with_ct) if w),
               out_axes=tuple(a for a, w in zip(in_axes, split.active) if w))
    res = [Var(v.aval.update(shape=(p["axis_size"],) + v.aval.shape, vma=frozenset()))
           for v in forward.outvars[len(eqn.outvars):]]
    return Equation(eqn.primitive, dict(common, call_jaxpr=forward, in_axes=in_axes,
                                        out_axes=tuple(p["out_axes"]) + (0,) * n_res,
                                        _vjp=(bwd, split)),
                    eqn.invars, eqn.outvars + res, eqn.source, eqn.phase)


def _pmap_vjp(cts, ins, outs, wants, _vjp=None, **params):
    bwd, split = _vjp
    return loops.split_vjp(cts, ins, outs, split, lambda operands: bind(
        xla_pmap, *operands, **bwd))


xla_pmap = Primitive("xla_pmap", _pmap_stacked, _pmap_abstract, multiple_results=True,
                     needs_run=True, cost=lambda ins, outs, **p: (0, 0), vjp=_pmap_vjp,
                     linearize=_pmap_linearize, unlogged="nested pmaps",
                     show=lambda p: {k: p[k] for k in ("axis_name", "axis_size", "call_jaxpr",
                                                       "name")})
register(xla_pmap, sharding=lambda mesh, avals, call_jaxpr, **p: [   # its results come back
    whole(a.ndim) for a in xla_pmap.abstract(*avals, call_jaxpr=call_jaxpr, **p)])  # whole
