"""``simpmd.make_jaxpr`` and ``simpmd.eval_shape``: the program a function traces to, printed in
JAX's notation, and the types of its results, computed without values."""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from . import tree
from ..core.core import Aval, aval_of
from ..core.program import trace
from ..core.run import Run
from .shapes import aval_of_shape, as_shapes, is_shape, struct_of
from .spmd import refuse_non_arrays
from ..partitioner.sharded import ShardingRun
from ..machine.mesh import NamedSharding
from .arrays import placed_aval


def make_jaxpr(fun, static_argnums=(), axis_env=None, return_shape=False):
    """``jax.make_jaxpr``: ``make_jaxpr(f, axis_env=[("i", 8)])(x)`` traces ``f`` as one
    device would run it, inside a map over the named axes, and returns its program, which
    prints in JAX's notation (collectives included). ``f`` may also be a ``simpmd.pmap``-,
    ``jit``- or ``shard_map``-ed function: a shard_map is one ``shard_map`` equation holding
    its body, as JAX prints it (:func:`body_program` gives the body as each device runs
    it). Nothing is computed: the
    body runs on types alone; arguments may be arrays or ShapeDtypeStructs, and with
    ``return_shape=True`` the results' types come back as ShapeDtypeStructs, as in JAX.
    """
    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)

    def traced(*args, **kwargs):
        if hasattr(fun, "traced") and hasattr(fun, "fun") and not _shard_mapped(fun):
            # a pmap or jit (JAX traces a shard_map called directly as a call: one equation)
            program = fun.traced(*args, **kwargs)
            if not return_shape:
                return program
            return program, fun(*as_shapes(args), **as_shapes(kwargs))
        program, out_tree = trace_function(fun, args, kwargs, static, axis_env)
        if not return_shape:
            return program
        return program, tree.unflatten(out_tree, [struct_of(a) for a in program.out_avals])
    return traced


def _shard_mapped(fun) -> bool:
    """Whether ``fun`` is a ``simpmd.shard_map``-ed function (JAX traces it as a call)."""
    return getattr(fun, "runs_over_devices", False) and hasattr(fun, "out_specs")


def body_program(fun, *args):
    """The program a ``simpmd.pmap``- or ``shard_map``-ed function runs on each device,
    traced on ``args`` (arrays or ShapeDtypeStructs): what the cost walker reads. For
    another function, its ``make_jaxpr`` program."""
    if hasattr(fun, "traced") and hasattr(fun, "fun"):
        return fun.traced(*args)
    return make_jaxpr(fun)(*args)


def trace_function(fun, args, kwargs, static=(), axis_env=None, keep_weak=False):
    """Trace ``fun(*args, **kwargs)`` on types alone, inside a map over ``axis_env``'s
    named axes: its program, and its results' tree structure."""
    axes = tuple((name, int(size)) for name, size in (axis_env or ()))
    run = Run([], axes, abstract=True)
    placed = [x for x in tree.flatten((args, kwargs))[0] if _mesh_of(x) is not None]
    if placed and not axes:                # arrays on a mesh: their sharding types
        run = ShardingRun(_mesh_of(placed[0]))
    positions = {a % max(len(args), 1) for a in static}
    dynamic = [i for i in range(len(args)) if i not in positions]
    leaves, treedef = tree.flatten(([args[i] for i in dynamic], kwargs))
    arrays = [k for k, x in enumerate(leaves) if not isinstance(x, (str, bytes)) and x is not None]
    out_tree = []

    def with_statics(*dyn, **kw):          # the dynamic arguments back among the static ones
        full = list(args)
        for i, v in zip(dynamic, dyn):
            full[i] = v
        return fun(*full, **kw)
    flat = tree.of_some_leaves(with_statics, treedef, leaves, arrays, out_tree, check=lambda
                               out, out_def: refuse_non_arrays("the function", out, out_def))
    avals = [_aval(leaves[k], keep_weak) for k in arrays]
    program, _ = trace(flat, avals, run)
    return program, out_tree[0]


def _mesh_of(x):
    """The mesh an argument is laid out on: an array's, or a ShapeDtypeStruct's sharding's
    (as for ``jax.ShapeDtypeStruct(..., sharding=NamedSharding(mesh, P(...)))``)."""
    if hasattr(x, "layout"):
        return x.mesh
    if is_shape(x) and isinstance(getattr(x, "sharding", None), NamedSharding):
        return x.sharding.mesh
    return None


def _aval(x, keep_weak=False):
    """The type JAX gives an argument (64-bit numbers as 32-bit, without x64; a Python
    number weakly typed only where JAX keeps it so, as ``eval_shape`` does)."""
    if isinstance(getattr(x, "aval", None), Aval):             # an array on a mesh
        return x.aval
    if is_shape(x) and isinstance(getattr(x, "sharding", None), NamedSharding):
        s = x.sharding                                         # a type laid out on a mesh
        return placed_aval(x.shape, aval_of_shape(x).dtype, s.mesh, s.spec)
    if is_shape(x):
        return aval_of_shape(x)
    if hasattr(x, "shape") and hasattr(x, "dtype") and not isinstance(x, np.ndarray):
        return Aval(x.shape, dtypes.canonical(x.dtype))       # a value of another engine
    aval = aval_of(x)
    return aval if keep_weak else aval.update(weak_type=False)


def eval_shape(fun, *args, **kwargs):
    """``jax.eval_shape``: the shapes and dtypes ``fun(*args, **kwargs)`` would return, as
    ShapeDtypeStructs, computed on types alone (arrays among the arguments count by their
    type). ``fun`` may be a ``simpmd.pmap``- or ``shard_map``-ed function: its body then
    runs on every simulated device's types, and ``fun.trace`` logs its collectives."""
    if getattr(fun, "runs_over_devices", False):          # a pmap or a shard_map
        return fun(*as_shapes(args), **as_shapes(kwargs))
    program, out_tree = trace_function(fun, args, kwargs, keep_weak=True)
    return tree.unflatten(out_tree, [struct_of(a) for a in program.out_avals])
