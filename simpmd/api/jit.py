"""``simpmd.jit``: a function traced once per signature into a program, whose values are
typed by their sharding, and run over every device of a mesh.

Since jax 0.9 ``jax.make_mesh`` gives *Explicit* axes: an array's sharding is part of its
type (``jax.typeof(x)`` prints ``float32[16@data,32@model]``), every primitive has a rule
that gives its result's sharding from its operands' (``partition.py``), and where the rule
cannot decide JAX raises and asks for ``out_sharding=``. The compiler then inserts the
collectives that make each device's block of every result right. simpmd does the same on
simulated devices, with JAX's names::

    mesh = simpmd.make_mesh((2, 4), ('data', 'model'))      # Explicit axes
    simpmd.set_mesh(mesh)
    x = simpmd.device_put(x_np, P('data', 'model'))
    f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P('data', None)))
    y = f(x, w)                   # traced once for this signature, then run
    simpmd.typeof(y)              # float32[16@data,8]
    print(f.trace)                # the all-reduce over 'model' the product needed

It is the one program of the engine: ``jit`` traces the body (``core/program.py``) on a
:class:`~simpmd.partitioner.sharded.ShardingRun`, whose abstract evaluation gives every
value its sharding; the partitioner (``simpmd/partitioner``) writes, once per signature,
the program each device runs, which the core's ``eval_program`` runs on every device's
block at once, and which ``lower().compile()``, the roofline and the timelines read.
This module is the front end: the mesh of ``set_mesh``, arrays placed on it
(``device_put``, :class:`ShardedArray`, whose operations outside jit run one by one, as
JAX's do), ``reshard``, ``typeof``, ``jit`` itself (the signature cache, ``lower`` and
``compile``), and ``grad`` of sharded arrays.
"""
from __future__ import annotations

import functools

import numpy as np

from ..core import bridge, errors
from ..core.core import context, running
from ..core.program import eval_program, trace
from ..core.values import StackedValue
from ..machine import devices as machine
from ..machine.mesh import PartitionSpec, ShardingError
from ..partitioner import sharding as R
from ..partitioner.partition import BlockRun, partitioned
from ..partitioner.sharded import ShardingRun
from ..partitioner.sharding import all_explicit, get_mesh
from . import shard_map_eqn, tree
from .jit_call import call_in_body, split_static, traced_call
from .spmd import record_trace
from .arrays import *  # noqa: F401,F403  (the arrays jit takes and gives)
from .arrays import (_mesh_of, _placed, _replicated, _trace_of,  # noqa: F401
                     ShardedArray, holds_sharded, reshard, run_partitioned, typeof)


# -- jit ---------------------------------------------------------------------------------------


def _annotations(shardings, values, what):
    """One sharding per leaf of ``values`` (``shardings`` is a pytree prefix of them); a
    bare P(...) needs the mesh of set_mesh (JAX raises a RuntimeError without one)."""
    specs = tree.broadcast_prefix(shardings, values, what)
    if get_mesh() is None and any(isinstance(s, PartitionSpec) for s in specs):
        raise JitMeshError(
            f"jit requires a non-empty mesh in context if you are passing `PartitionSpec`s to "
            f"{what} (JAX's words): call simpmd.set_mesh(mesh) first (or `with "
            f"simpmd.set_mesh(mesh):`), or pass simpmd.NamedSharding(mesh, P(...)).")
    return specs


class JitMeshError(errors.SimpmdError, RuntimeError):
    """``in_shardings``/``out_shardings`` of bare ``P(...)`` without a mesh set (JAX's
    RuntimeError)."""


def _placing_results(fun, out_shardings):
    """``fun`` whose results are resharded as ``out_shardings`` says, as jit's output
    annotations place them."""
    @functools.wraps(fun)
    def placed(*args, **kwargs):
        outs = fun(*args, **kwargs)
        leaves, treedef = tree.flatten(outs)
        specs = _annotations(out_shardings, outs, "out_shardings")
        for k, (x, spec) in enumerate(zip(leaves, specs)):
            inner = getattr(spec, "spec", spec)
            if spec is not None and len(tuple(inner)) > np.ndim(x):
                raise ShardingError(
                    f"One of pjit outputs with pytree key path result is incompatible with its "
                    f"sharding annotation (JAX's words): result {k} has rank {np.ndim(x)} and "
                    f"out_shardings gives it {inner!r}, {len(tuple(inner))} entries.")
        return tree.unflatten(treedef, [x if s is None else reshard(x, s)
                                        for x, s in zip(leaves, specs)])
    return placed


def _check_in_shardings(in_shardings, args):
    """JAX refuses an argument placed otherwise than ``in_shardings`` says (a NumPy
    argument it places itself)."""
    for k, (x, spec) in enumerate(zip(tree.flatten(args)[0],
                                      _annotations(in_shardings, args, "in_shardings"))):
        if spec is None or not isinstance(x, ShardedArray):
            continue
        mesh = getattr(spec, "mesh", None) or get_mesh()
        want = R.resolve(getattr(spec, "spec", spec), all_explicit(mesh), len(x.shape),
                         "in_shardings")
        if want != x.layout:
            raise ShardingError(
                f"Sharding passed to jit does not match the sharding on the respective arg "
                f"(JAX's words): argument {k} is {typeof(x)} and in_shardings says {spec!r}. "
                f"reshard the argument first, or leave in_shardings out.")



class Jitted:
    """A function compiled for a mesh, like the result of ``jax.jit``: traced once per
    signature (the function, its static arguments, each argument's shape, dtype and
    sharding) into a program, which each call runs; ``.trace`` is the last call's log."""

    def __init__(self, fun, static_argnums=(), static_argnames=(), donate_argnums=(),
                 in_shardings=None, out_shardings=None):
        if not callable(fun):
            raise TypeError(f"jit needs a function, got {fun!r}.")
        functools.update_wrapper(self, fun)
        self.fun = fun if out_shardings is None else _placing_results(fun, out_shardings)
        self.in_shardings = in_shardings
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self.trace = None

    def __repr__(self):
        return f"<simpmd.jit of {getattr(self.fun, '__name__', self.fun)!r}>"

    def __get__(self, obj, objtype=None):        # a jitted method
        return self if obj is None else functools.partial(self, obj)

    # -- the program of a signature ----------------------------------------------------------
    def _statics(self):
        return self.static_argnums, self.static_argnames

    def _program(self, run, args, kwargs, leaves=None):
        """(program, results' tree, dynamic leaves) for this call, traced on ``run``'s grid
        the first time this signature is seen."""
        return traced_call(self.fun, run, args, kwargs, self._statics(), leaves)

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if bridge.inside_jax((args, kwargs)):
            import jax  # optional: JAX
            return jax.jit(self.fun, static_argnums=self.static_argnums,
                           static_argnames=self.static_argnames)(*args, **kwargs)
        if context.run is not None:               # inside another body: one jit equation
            return call_in_body(self.fun, args, kwargs, self._statics())
        if machine.intercepts():                # one process of simpmd.run_processes
            return machine.hosts.launch(self, args, kwargs)
        return self._run(args, kwargs)

    def _inputs(self, run, args, kwargs):
        _, leaves, _, _ = split_static(args, kwargs, self._statics())
        return [x.value_in(run) if isinstance(x, ShardedArray) else _replicated(run, x)
                for x in leaves]

    def _run(self, args, kwargs):
        if self.in_shardings is not None:
            _check_in_shardings(self.in_shardings, args)
        leaves = tree.flatten((args, kwargs))[0]
        mesh = _mesh_of(leaves)
        typing = ShardingRun(mesh)
        inputs = self._inputs(typing, args, kwargs)
        program, out_tree, inputs = self._program(typing, args, kwargs, inputs)  # (closed-over first)
        inner = _shard_map_mesh(program) if mesh.size == 1 and not holds_sharded(leaves) else None
        if inner is not None:         # NumPy arguments: JAX runs on the shard_map's mesh
            mesh, typing = inner, ShardingRun(inner)
            inputs = self._inputs(typing, args, kwargs)
            program, out_tree, inputs = self._program(typing, args, kwargs, inputs)
        local = partitioned(program, mesh)
        try:
            run, results = run_partitioned(program, local, inputs, mesh)
        except Exception as exc:
            self.trace = record_trace(exc.trace)
            raise
        self.trace = record_trace(_trace_of(run, local))
        self.trace.jaxpr = program
        return tree.unflatten(out_tree, results)

    # -- what JAX's jit also offers ---------------------------------------------------------------
    def traced(self, *args, **kwargs):
        """The program as ``make_jaxpr`` prints it: one ``jit`` equation holding the body."""
        mesh = _mesh_of(tree.flatten((args, kwargs))[0])
        avals = [x.aval for x in self._inputs(ShardingRun(mesh), args, kwargs)]
        out_tree = []

        def flat(*xs):
            out, treedef = tree.flatten(self._with(args, kwargs, xs))
            out_tree.append(treedef)
            return out
        program, _ = trace(flat, avals, ShardingRun(mesh))
        program.out_tree = out_tree[0]
        return program

    def _with(self, args, kwargs, leaves):
        """Call this function with the dynamic leaves of ``(args, kwargs)`` replaced."""
        _, _, treedef, static = split_static(args, kwargs, self._statics())
        dyn, kw = tree.unflatten(treedef, list(leaves))
        it = iter(dyn)
        full = [args[k] if k in static else next(it) for k in range(len(args))]
        return self(*full, **dict(kw, **{k: v for k, v in kwargs.items()
                                          if k in self.static_argnames}))

    def lower(self, *args, **kwargs):
        """The program and, with ``.compile()``, what each device runs: the equations on
        blocks and the collectives jit inserts (``.as_text()`` prints it)."""
        return Lowered(self, args, kwargs)


def _shard_map_mesh(program):
    """The one mesh the shard_maps of ``program`` run on (None if none, or several)."""
    meshes = {e.params["shard_mesh"].mesh for e in program.eqns
              if e.primitive is shard_map_eqn.shard_map_p}
    return meshes.pop() if len(meshes) == 1 and get_mesh() is None else None


class Lowered:
    """``jit(f).lower(*args)``: the traced program, and its partitioned form."""

    def __init__(self, jitted, args, kwargs):
        self.jitted, self.args, self.kwargs = jitted, args, kwargs

    def as_text(self) -> str:
        return str(self.jitted.traced(*self.args, **self.kwargs))

    def compile(self) -> "Compiled":
        jitted, args, kwargs = self.jitted, self.args, self.kwargs
        mesh = _mesh_of(tree.flatten((args, kwargs))[0])
        typing = ShardingRun(mesh)
        inputs = [StackedValue(x.aval) for x in jitted._inputs(typing, args, kwargs)]
        program, _, _ = jitted._program(typing, args, kwargs, inputs)
        local = partitioned(program, mesh)
        run = BlockRun(mesh, abstract=True)
        with running(run):                  # the collectives it inserts, logged on types
            eval_program(local, [], [StackedValue(v.aval) for v in local.invars])
        return Compiled(_trace_of(run, local))


class Compiled:
    """What every device runs (simpmd's stand-in for XLA's compiled HLO): the equations
    on blocks, with the collectives jit inserted, and their log (``trace``), all without
    values. ``cost.roofline`` and the timelines read ``program``."""

    def __init__(self, trace_):
        self.program, self.trace = trace_.program, trace_

    def as_text(self) -> str:
        return str(self.program)

    def collective_counts(self) -> dict:
        return self.trace.collective_counts()


def jit(fun=None, /, *, static_argnums=(), static_argnames=(), donate_argnums=(), **kwargs):
    """``jax.jit``: ``fun`` traced once per signature into a program of sharding-typed
    values, run on every device of the mesh its arguments live on. Usable as a decorator,
    with or without arguments."""
    places = {k: kwargs.get(k) for k in ("in_shardings", "out_shardings")}
    if fun is None:
        return lambda f: Jitted(f, static_argnums, static_argnames, donate_argnums, **places)
    return Jitted(fun, static_argnums, static_argnames, donate_argnums, **places)
