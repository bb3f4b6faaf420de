"""``simpmd.make_jaxpr``: the program a function traces to, printed in JAX's notation."""
from __future__ import annotations

import numpy as np

from ..core import dtypes, tree
from ..core.core import Aval, aval_of
from ..core.program import trace
from ..core.run import Run
from .spmd import refuse_non_arrays


def make_jaxpr(fun, static_argnums=(), axis_env=None, return_shape=False):
    """``jax.make_jaxpr``: ``make_jaxpr(f, axis_env=[("i", 8)])(x)`` traces ``f`` as one
    device would run it, inside a map over the named axes, and returns its program, which
    prints in JAX's notation (collectives included). ``f`` may also be a ``simpmd.pmap``-ed
    or ``shard_map``-ed function: then the program is its body's, as each device runs it
    (JAX prints the same body inside a ``shard_map`` equation). Nothing is computed: the
    body runs on types alone.
    """
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def traced(*args, **kwargs):
        if hasattr(fun, "traced") and hasattr(fun, "fun"):     # a pmap or shard_map
            program = fun.traced(*args, **kwargs)
            if not return_shape:
                return program
            out = fun(*args, **kwargs)
            return program, tree.tree_map(lambda v: (tuple(np.shape(v)), np.asarray(v).dtype), out)
        axes = tuple((name, int(size)) for name, size in (axis_env or ()))
        run = Run([], axes, abstract=True)
        placed = [x for x in tree.flatten((args, kwargs))[0] if hasattr(x, "layout")]
        if placed and not axes:                # arrays on a mesh: their sharding types
            from .jit_run import JitRun
            run = JitRun(placed[0].mesh, abstract=True)
        positions = {a % max(len(args), 1) for a in static}
        dynamic = [i for i in range(len(args)) if i not in positions]
        leaves, treedef = tree.flatten(([args[i] for i in dynamic], kwargs))
        arrays = [k for k, x in enumerate(leaves) if not isinstance(x, (str, bytes)) and x is not None]
        out_tree = []

        def flat(*xs):
            full_leaves = list(leaves)
            for k, x in zip(arrays, xs):
                full_leaves[k] = x
            dyn, kw = tree.unflatten(treedef, full_leaves)
            full = list(args)
            for i, v in zip(dynamic, dyn):
                full[i] = v
            out, out_def = tree.flatten(fun(*full, **kw))
            refuse_non_arrays("the function", out, out_def)
            out_tree.append(out_def)
            return out
        avals = [_aval(leaves[k]) for k in arrays]
        program, _ = trace(flat, avals, run)
        if not return_shape:
            return program
        shapes = [(a.shape, a.dtype) for a in program.out_avals]
        return program, tree.unflatten(out_tree[0], shapes)
    return traced


def _aval(x):
    """The type JAX gives an argument (64-bit numbers as 32-bit, without x64)."""
    if isinstance(getattr(x, "aval", None), Aval):             # an array on a mesh
        return x.aval
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):
        return Aval(x.shape, dtypes.canonical(x.dtype))       # a ShapeDtypeStruct or a value
    return aval_of(x).update(weak_type=False)
