"""A jitted function's call: its static and dynamic arguments, its program traced once per
signature (``traced_call``), and a jitted function called inside another body, one ``jit``
equation (``call_in_body``)."""
from __future__ import annotations

import numpy as np

from ..core import dtypes, loops
from ..core.core import Aval, aval_of, bind, context
from ..core.program import cached, store, trace
from ..core.values import StackedValue
from ..partitioner.rows import MeshText, jit_p
from . import tree


def arg_aval(x):
    """The type JAX gives a plain argument (64-bit numbers as 32-bit, without x64)."""
    if dtypes.is_weak_scalar(x):
        return aval_of(x)
    a = np.asarray(x)
    return Aval(a.shape, dtypes.canonical(a.dtype))


def split_static(args, kwargs, statics):
    """(the static arguments, as a key), the dynamic leaves, their tree, and the static
    positions, for ``statics`` = (static_argnums, static_argnames)."""
    argnums, argnames = statics
    n = len(args)
    static = {a % n for a in argnums} if n else set()
    fixed = tuple((k, args[k]) for k in sorted(static))
    fixed += tuple((k, kwargs[k]) for k in sorted(kwargs) if k in argnames)
    dynamic = ([a for k, a in enumerate(args) if k not in static],
               {k: v for k, v in kwargs.items() if k not in argnames})
    leaves, treedef = tree.flatten(dynamic)
    return fixed, leaves, treedef, static


def traced_call(fun, run, args, kwargs, statics=((), ()), leaves=None):
    """(program, results' tree, dynamic leaves) for ``fun(*args, **kwargs)``, traced on
    ``run``'s grid the first time its signature (the static arguments, the leaves' types,
    the run) is seen; values it closes over become its first inputs, as JAX passes them."""
    fixed, found, treedef, static = split_static(args, kwargs, statics)
    leaves = found if leaves is None else leaves
    avals = tuple(aval_of(x) if isinstance(x, StackedValue) else arg_aval(x) for x in leaves)
    where = (type(run).__name__, run.axes, run.check_vma, getattr(run, "mesh", None))
    key = ("jit", fixed, treedef, avals, where)
    entry = cached(fun, key)
    if entry is not None:
        return entry[0], entry[1], leaves
    out_trees = []

    def flat(*xs):
        dyn, kw = tree.unflatten(treedef, list(xs))
        it = iter(dyn)
        full = [args[k] if k in static else next(it) for k in range(len(args))]
        kw = dict(kw, **{k: v for k, v in kwargs.items() if k in statics[1]})
        out, out_tree = tree.flatten(fun(*full, **kw))
        out_trees.append(out_tree)
        return out
    program, lifted = trace(flat, list(avals), run.tracing())
    if lifted:        # it closed over an enclosing body's values: JAX passes them first
        return loops.closed(program), out_trees[0], list(lifted) + list(leaves)
    store(fun, key, (program, out_trees[0]))
    return program, out_trees[0], leaves


def call_in_body(fun, args, kwargs=None, statics=((), ()), name=None):
    """``fun`` called inside another body (jit's, or a jnp function JAX jits): one ``jit``
    equation, named ``name`` (the function's own by default)."""
    run = context.run
    program, out_tree, leaves = traced_call(fun, run, args, kwargs or {}, statics)
    mesh = getattr(run, "mesh", None)
    outs = bind(jit_p, *leaves, jaxpr=program, name=name or getattr(fun, "__name__", "fun"),
                ctx_mesh=MeshText(mesh) if mesh is not None and mesh.axis_names else None)
    return tree.unflatten(out_tree, outs)
