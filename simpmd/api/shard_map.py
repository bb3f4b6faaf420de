"""``simpmd.shard_map``: cut the arguments into blocks over a mesh, run the body over
every device's block, and put the result blocks back together.

This module says how the arguments are cut into blocks and how the result blocks go back
together; the driver it shares with ``pmap`` (``spmd.py``) runs the body once over all
blocks stacked in the mesh's row-major device order, as JAX traces it once
(``simpmd/core``), or with ``eager=True`` one program per device.

Mirrors ``jax.shard_map(f, mesh=..., in_specs=..., out_specs=...)``. Where ``pmap`` maps
one axis per call (and nests for more), ``shard_map`` maps every axis of a mesh at once:
the device at mesh position ``(data=1, model=2)`` runs ``f`` on its own block of each
argument, and collectives inside ``f`` can name any mesh axis or tuple of axes. Each
device's log says which block it received and which block of the result it returned,
as ``pmap``'s does.

Two rules of ``jax.shard_map`` get plain-words errors here: a split dimension must divide
evenly over its mesh axes, and an output whose ``out_specs`` leaves out a mesh axis must
be the same on every device along that axis (simpmd compares the values and names the
devices that differ).
"""
from __future__ import annotations

import copy
import functools
import math
import warnings

import numpy as np

from ..core import bridge, errors
from . import tree
from ..core.collectives import pvary
from ..core.core import Aval, Var, bind, context
from ..core.run import Run
from ..machine import devices as machine
from ..machine.mesh import (Mesh, NamedSharding, PartitionSpec, ShardingError, block_counts,
                             block_slices, check_spec, join_blocks, replica_id, slices_text,
                             stack_blocks)
from . import spmd
from .jit import jit as _jit
from .partition import explicit_axes, get_mesh
from .shard_map_eqn import MeshArray, shard_map_equation
from .shapes import aval_of_shape, is_shape, struct_of
from .spmd import Piece, positional_names, value_or_shape
from .text import summarize
from .unreduced_ops import vary_unreduced_cast
from ..partitioner.sharding import settings

_REQUIRED = object()
_INFER = object()            # in_specs left out: read from the arguments' types, as JAX's Infer


def shard_map(f=None, /, *, out_specs=_REQUIRED, in_specs=_INFER, mesh=None,
              axis_names=frozenset(), check_vma=True, check_rep=None, eager=False):
    """Map ``f`` over the blocks of its arguments on a mesh of simulated devices, like
    ``jax.shard_map``.

    ``in_specs`` / ``out_specs`` are ``P(...)`` specs or pytree prefixes of the arguments
    / results; ``None`` in ``in_specs`` passes that argument through untouched (static).
    ``check_vma`` (``check_rep`` in older JAX) makes an output that ``out_specs`` calls
    replicated an error when its values differ; with ``False`` simpmd warns and returns
    the first device's copy, as JAX does without checking. ``eager=True`` (simpmd only)
    lets the body branch on array values, which real JAX refuses.
    """
    check = check_vma if check_rep is None else check_rep
    kwargs = dict(mesh=mesh, in_specs=in_specs, out_specs=out_specs, axis_names=axis_names,
                  check_vma=bool(check), eager=eager)
    if f is None:
        return lambda g: ShardMapped(g, **kwargs)
    return ShardMapped(f, **kwargs)


def _refuse_nesting(task):
    raise ShardingError(
        f"shard_map was called inside a mapped function (on {task.where()}). simpmd runs "
        f"shard_map only at the top level, not inside pmap or another shard_map. Put every "
        f"axis into one mesh instead: a Mesh with the outer and the inner axes, e.g. "
        f"make_mesh((2, 2), ('data', 'model')), and one shard_map whose specs name both "
        f"(P('data', 'model')); collectives inside can name either axis or both. The "
        f"nested-pmap form of the same program still runs with simpmd.pmap.")


def _manual_spec(leaf, mesh, manual) -> PartitionSpec:
    """The spec of ``leaf``'s type over ``mesh``, keeping only the ``manual`` axes (JAX's
    ``_manual_spec``); a value placed nowhere (a NumPy array) is replicated."""
    sharding = getattr(getattr(leaf, "aval", None), "sharding", None)
    if sharding is None or sharding.mesh != mesh:
        return PartitionSpec()
    parts = []
    for dim in sharding.dims:
        kept = tuple(a for a in dim if a in manual)
        parts.append(None if not kept else kept[0] if len(kept) == 1 else kept)
    while parts and parts[-1] is None:
        parts.pop()
    return PartitionSpec(*parts)


def _spec_axes(spec) -> frozenset:
    """The mesh axes a PartitionSpec splits over: what a block of it varies over."""
    return frozenset(spec.mesh_axes())


class ShardMapped:
    """A function mapped over a mesh of simulated devices; ``.trace`` shows its last run."""

    runs_over_devices = True      # eval_shape and make_jaxpr run it as it is

    def __init__(self, fun, *, mesh, in_specs, out_specs, axis_names, check_vma, eager):
        if not callable(fun):
            raise TypeError(f"shard_map needs a function as its first argument, got {fun!r}.")
        if out_specs is _REQUIRED:
            raise TypeError("shard_map needs out_specs=: a P(...) per output (or a pytree "
                            "prefix of the outputs), saying how the blocks are put together.")
        if mesh is not None and not isinstance(mesh, Mesh):
            raise TypeError(f"shard_map's mesh= must be a simpmd.Mesh, got {mesh!r}. Build it "
                            f"from simpmd.devices() (simpmd.make_mesh), not from jax.devices().")
        if not isinstance(axis_names, (set, frozenset)):
            raise TypeError(f"axis_names must be a set of mesh axis names, got {axis_names!r}")
        functools.update_wrapper(self, fun)
        self.fun, self._mesh, self.axis_names = fun, mesh, frozenset(axis_names)
        if mesh is not None:
            self._check_axis_names(mesh)
        self.in_specs, self.out_specs = in_specs, out_specs
        self.check_vma, self.eager = check_vma, eager
        self.trace = None
        self._param_names = positional_names(fun)

    @property
    def mesh(self) -> Mesh:
        """The mesh given as ``mesh=``, or else JAX's context mesh when called: the one the
        enclosing ``jit`` or ``shard_map`` runs over, or the one of ``set_mesh``."""
        if self._mesh is not None:
            return self._mesh
        mesh = getattr(context.run, "mesh", None) or get_mesh()
        if mesh is None:
            raise ShardingError(
                "The context mesh cannot be empty. Use `jax.set_mesh(mesh)` to enter into a "
                "mesh context (JAX's words): this shard_map was given no mesh=, and none is "
                "set. Pass mesh=simpmd.make_mesh(...), or call simpmd.set_mesh(mesh) (or "
                "`with simpmd.set_mesh(mesh):`) before calling it.")
        self._check_axis_names(mesh)
        return mesh

    def _inferring(self, args, kwargs):
        """in_specs left out: as JAX's ``Infer``, each argument's spec is the one its type
        has over the manual axes, which must all be Explicit."""
        mesh = self.mesh
        manual = self.axis_names or frozenset(mesh.axis_names)
        auto = [a for a in mesh.axis_names if a in manual and a not in explicit_axes(mesh)]
        if auto:
            raise TypeError(
                f"shard_map in_specs argument must be a pytree of `jax.sharding.PartitionSpec` "
                f"instances, but it was `None` when axis_names={set(manual)} are of type "
                f"AxisType.Auto (JAX's words): only arguments typed by Explicit axes say how "
                f"they are split. Pass in_specs= (a P(...) per argument), or build the mesh "
                f"with axis_types=(AxisType.Explicit,) * {len(mesh.axis_names)}.")
        leaves, treedef = tree.flatten(tuple(args))
        specs = tree.unflatten(treedef, [_manual_spec(leaf, mesh, manual) for leaf in leaves])
        inferred = copy.copy(self)
        inferred.in_specs = specs
        try:
            return inferred(*args, **kwargs)
        finally:
            self.trace = inferred.trace

    def _refuse_inner_mesh(self, parent):
        """Inside a shard_map body, JAX's context mesh has that body's axes Manual, which no
        mesh one can pass matches: an inner shard_map takes the context mesh."""
        raise ShardingError(
            f"The context mesh {parent.mesh!r} (axes {tuple(parent.manual_axes)} Manual) "
            f"should match the mesh passed to shard_map {self._mesh!r} (JAX's words): this "
            f"shard_map is called inside the body of another one, manual over "
            f"{tuple(parent.manual_axes)}. Leave mesh= out of the inner shard_map, which then "
            f"runs over the enclosing mesh, and name the axes it maps in axis_names=.")

    def _check_axis_names(self, mesh):
        if self.axis_names and not set(self.axis_names) <= set(mesh.axis_names):
            raise ShardingError(f"axis_names={set(self.axis_names)} must be a subset of the "
                                f"mesh's axes {mesh.axis_names}.")

    def __repr__(self):
        over = repr(self._mesh) if self._mesh is not None else "the context mesh"
        return f"<simpmd.shard_map of {getattr(self.fun, '__name__', self.fun)!r} over {over}>"

    def _arg_name(self, i):
        names = self._param_names
        return names[i] if i < len(names) else f"args[{i}]"

    # -- splitting -------------------------------------------------------------------------
    def _split(self, args):
        """Per leaf: (path, value, spec) with spec None for a static leaf; errors that teach."""
        in_specs = self.in_specs
        if isinstance(in_specs, list):
            raise ShardingError(
                f"in_specs={in_specs!r} is a list, but the arguments arrive as a tuple, and JAX "
                f"matches in_specs to them as a pytree prefix: a list is a different pytree "
                f"node, so real JAX refuses it ('pytree structure error'). Write a tuple: "
                f"in_specs={tuple(in_specs)!r}.")
        if isinstance(in_specs, tuple) and len(in_specs) != len(args):
            raise ShardingError(
                f"in_specs has {len(in_specs)} entries but the function was called with "
                f"{len(args)} argument(s); give one P(...) per argument (or a single P for all).")
        specs = tree.broadcast_prefix(in_specs, args, what="in_specs")
        leaves, _ = tree.flatten(args)
        paths = [p for i, a in enumerate(args)
                 for p in (self._arg_name(i) + q for q in tree.leaf_paths(a))]
        mesh, out, indivisible = self.mesh, [], []
        for leaf, spec, path in zip(leaves, specs, paths):
            if spec is None:
                out.append((path, leaf, None))
                continue
            value = value_or_shape(leaf)   # Python numbers get JAX's 32-bit dtypes
            check_spec(spec, mesh, f"in_specs for {path} (shape {value.shape})", value.ndim)
            counts = block_counts(spec, mesh, value.ndim)
            for d, (size, n) in enumerate(zip(value.shape, counts)):
                if size % n:
                    axes = spec.axes_of(d)
                    over = " x ".join(f"{a!r} (size {mesh.shape[a]})" for a in axes)
                    indivisible.append(
                        f"  {path} of shape {value.shape}: dimension {d} has size {size}, "
                        f"which {spec!r} splits over mesh axis {over} = {n} blocks, but "
                        f"{n} does not divide {size}")
            out.append((path, value, spec))
        if indivisible:
            raise errors.MappedAxisError(
                f"shard_map needs every split dimension to divide evenly over its mesh axes "
                f"(the mesh is {mesh!r}):\n" + "\n".join(indivisible) + "\nPad the array, "
                "change the mesh's axis sizes, or split that dimension over other axes "
                "(or None to keep it whole).")
        return out, tree.flatten(args)[1]

    # -- calling ---------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self.in_specs is _INFER:
            return self._inferring(args, kwargs)
        parent = context.run
        if parent is not None and (hasattr(parent, "mesh") or not (parent.axes or parent.eager)):
            # inside jit, or under grad, eval_shape or make_jaxpr: one equation
            if self._mesh is not None and getattr(parent, "manual_axes", ()):
                self._refuse_inner_mesh(parent)
            return shard_map_equation(self, args)
        if parent is not None:
            _refuse_nesting(parent)
        if bridge.inside_jax(args):
            # Inside a real JAX trace (jax.jit, a cross-check): this is jax.shard_map's job.
            return bridge.jax.shard_map_on_jax(self)(*args)
        if machine.intercepts():                   # one process of simpmd.run_processes
            return machine.hosts.launch(self, args, kwargs)
        if (self.axis_names and self.axis_names != set(self.mesh.axis_names)) or \
                _names_unreduced(self.in_specs) or _names_unreduced(self.out_specs):
            # Manual over some axes only: the compiler handles the others, as JAX's eager
            # shard_map has each operation on them compiled; simpmd's compiler is its jit.
            # So for partial sums in or out: the arrays that hold them are jit's.
            return _jit(self)(*args, **kwargs)
        if kwargs:
            raise TypeError(
                f"shard_map'd functions take positional arguments only (as in JAX), got "
                f"keyword(s) {', '.join(kwargs)}. Pass them by position, with one in_specs "
                f"entry each.")
        devices, axes, inputs, assemble = self._prepare(args)
        return spmd.run(self, self._body, devices, axes, inputs, {}, assemble, eager=self.eager,
                        check_vma=self.check_vma, maps_a_mesh=True)

    def _prepare(self, args):
        """The devices, the mesh's axes, every argument leaf's blocks, and how the results
        go back together."""
        leaves, treedef = self._split(args)
        mesh = self.mesh
        coords = [mesh.coords_of(k) for k in range(mesh.size)]

        def piece(path, value, spec):
            def detail(k):
                return _block_detail(path, value.shape, spec,
                                     block_slices(spec, mesh, value.shape, coords[k]))
            if is_shape(value):         # shapes alone: one device's block, as a type
                counts = block_counts(spec, mesh, value.ndim)
                aval = aval_of_shape(value)
                aval = aval.update(shape=[n // c for n, c in zip(aval.shape, counts)])
                return Piece(None, detail, _spec_axes(spec), aval)
            return Piece(stack_blocks(value, spec, mesh), detail, _spec_axes(spec))
        inputs = [value if spec is None else piece(path, value, spec)
                  for path, value, spec in leaves]

        def assemble(stacks, out_def, run, program=None):
            return self._assemble(stacks, out_def, run, coords, program)
        return (list(mesh.devices.flat), tuple(mesh.shape.items()),
                tree.unflatten(treedef, inputs), assemble)

    def traced(self, *args):
        """The body's program for these arguments, traced now (as JAX traces a shard_map
        outside jit on every call): what ``make_jaxpr`` of a shard_mapped function prints."""
        devices, axes, inputs, _ = self._prepare(args)
        grid = Run(devices, axes, check_vma=self.check_vma, maps_a_mesh=True)
        return spmd.program_for(self._body, grid, inputs, {}).program

    def _body(self, *args):
        """The learner's body; under check_vma, a result that does not vary over a mesh
        axis its out_specs splits it over is made to (pvary), as JAX does."""
        out = self.fun(*args)
        if not self.check_vma or context.run is None or context.run.eager:
            return out
        leaves, treedef = tree.flatten(out)
        try:
            specs = tree.broadcast_prefix(self.out_specs, out, what="out_specs")
        except ValueError:                # a malformed out_specs: refused once it returns
            return out
        made = []
        for leaf, spec in zip(leaves, specs):
            vma = getattr(getattr(leaf, "aval", None), "vma", frozenset())
            missing = tuple(n for n in self.mesh.axis_names if isinstance(spec, PartitionSpec)
                            and n in spec.mesh_axes() and n not in vma)
            made.append(bind(pvary, leaf, axes=missing) if missing and hasattr(leaf, "aval") else leaf)
        return tree.unflatten(treedef, [_as_unreduced(leaf, spec) for leaf, spec in zip(made, specs)])

    # -- putting the blocks together -------------------------------------------------------
    def _assemble(self, stacks, treedef, run, coords, program=None):
        """The result blocks, stacked in device order, as MeshArrays laid out by out_specs."""
        mesh = self.mesh
        out_specs = self.out_specs
        if isinstance(out_specs, list) and treedef.kind == "tuple":
            raise ShardingError(
                f"out_specs={out_specs!r} is a list, but the function returned a tuple, and "
                f"JAX matches out_specs to the results as a pytree prefix: a list is a "
                f"different pytree node, so real JAX refuses it ('pytree structure error'). "
                f"Write a tuple: out_specs={tuple(out_specs)!r}.")
        firsts = [s if isinstance(s, Aval) else s[0] for s in stacks]
        specs = tree.broadcast_prefix(out_specs, tree.unflatten(treedef, firsts),
                                      what="out_specs")
        out_leaves, labels = [], spmd.leaf_labels(treedef)
        for j, (stack, spec) in enumerate(zip(stacks, specs)):
            name = f"out{labels[j]}"
            if isinstance(stack, Aval):          # shapes alone: the type says it all
                out_leaves.append(self._assemble_type(stack, spec, name, run, coords, program, j))
                continue
            first = stack[0]
            check_spec(spec, mesh, f"out_specs for {name} (a result of shape {first.shape})",
                       first.ndim)
            if self.check_vma and program is not None:   # JAX decides from the value's type
                self._check_types(program, j, stack, spec, name, first.ndim, run, coords)
            elif not _replicated(stack, spec, mesh):
                where = [run.where(k) for k in range(run.n)]
                self._check_replicated(where, list(stack), coords, spec, name, first.ndim)
            whole = join_blocks(stack, spec, mesh)
            run.returned(stack, lambda k, name=name, shape=whole.shape, spec=spec: _block_detail(
                name, shape, spec, block_slices(spec, mesh, shape, coords[k]), "into"))
            out_leaves.append(MeshArray(whole, NamedSharding(mesh, spec)))
        return tree.unflatten(treedef, out_leaves)

    def _assemble_type(self, aval, spec, name, run, coords, program, j):
        """A result on shapes alone: its global type, laid out by ``spec``, as a
        ShapeDtypeStruct. Under check_vma its type is checked as with values; without it
        there are no values to compare, and (as JAX) nothing is checked."""
        mesh = self.mesh
        check_spec(spec, mesh, f"out_specs for {name} (a result of shape {aval.shape})", aval.ndim)
        if self.check_vma and program is not None:
            self._check_types(program, j, None, spec, name, aval.ndim, run, coords)
        counts = block_counts(spec, mesh, aval.ndim)
        shape = tuple(n * c for n, c in zip(aval.shape, counts))
        run.returned(None, lambda k: _block_detail(name, shape, spec, block_slices(
            spec, mesh, shape, coords[k]), "into"), aval)
        return struct_of(aval.update(shape=shape, vma=frozenset(), weak_type=False),
                         NamedSharding(mesh, spec))

    def _check_types(self, program, j, stack, spec, name, ndim, run, coords):
        """Under check_vma, an out_spec may leave out a mesh axis only if the result's type
        says it does not vary over it, whatever its values are (as JAX checks)."""
        var = program.outvars[j]
        missing = sorted(var.aval.vma - set(spec.mesh_axes()))
        if not missing:
            return
        if stack is not None and not _replicated(stack, spec, self.mesh):   # values differ too
            where = [run.where(k) for k in range(run.n)]
            self._check_replicated(where, list(stack), coords, spec, name, ndim)
        causes = []
        for axis in missing:
            made = _why(program, var, axis)
            if made is None:
                causes.append(f"over {axis!r} because an input split over {axis!r} by in_specs "
                              f"flows into it")
            else:
                primitive, source, code = made
                causes.append(f"over {axis!r} because of {primitive} at {source}"
                              + (f" ({code})" if code else ""))
        axes = " and ".join(repr(a) for a in missing)
        over = repr(missing[0]) if len(missing) == 1 else repr(tuple(missing))
        equal = stack is not None and _replicated(stack, spec, self.mesh)
        fact = (f" Its values happen to be equal along {axes} here, but JAX does not look at "
                f"values: it decides from the type, before anything runs, and the type says "
                f"varying (an all_gather's or ppermute's result, or axis_index, stays varying "
                f"over its axis even when every device ends up with the same numbers)."
                if equal else "")
        raise ShardingError(
            f"out_specs {spec!r} for {name} leaves out mesh axis {axes}, which declares it "
            f"replicated there, but under check_vma=True its type says it varies "
            f"{'; '.join(causes)}.{fact} Real JAX refuses this too ('out_specs which require "
            f"replication which can't be statically inferred'). Either reduce it over "
            f"{axes} (lax.psum(..., {over}) or lax.pmean), or {_suggest(spec, missing, ndim)} "
            f"to keep each device's block, or pass check_vma=False to skip the check.")

    def _check_replicated(self, places, values, coords, spec, name, ndim):
        """Along every mesh axis ``spec`` leaves out, all devices must hold the same value."""
        mesh = self.mesh
        free = [n for n in mesh.axis_names if n not in spec.mesh_axes()]
        if not free:
            return
        first_copy = {}                  # named-axes coordinates -> (place, value) of replica 0
        for t, v, c in zip(places, values, coords):
            key = tuple(c[n] for n in mesh.axis_names if n not in free)
            first_copy.setdefault(key, (t, v))
        differ = []
        for t, v, c in zip(places, values, coords):
            t0, v0 = first_copy[tuple(c[n] for n in mesh.axis_names if n not in free)]
            if t != t0 and not np.array_equal(v, v0, equal_nan=v.dtype.kind in "fc"):
                differ.append((t, t0))
        if not differ:
            return
        # The axes along which the values really vary: two devices that differ only in
        # that axis's coordinate hold different values.
        by_coords = {tuple(c[n] for n in mesh.axis_names): v for v, c in zip(values, coords)}
        varying = []
        for n in free:
            for v, c in zip(values, coords):
                base = tuple(0 if m == n else c[m] for m in mesh.axis_names)
                if c[n] and not np.array_equal(v, by_coords[base], equal_nan=v.dtype.kind in "fc"):
                    varying.append(n)
                    break
        word = "axis" if len(free) == 1 else "axes"
        axes = " and ".join(repr(n) for n in free)
        vary = " and ".join(repr(n) for n in varying)
        over = repr(varying[0]) if len(varying) == 1 else repr(tuple(varying))
        t, t0 = differ[0]
        v, v0 = values[places.index(t)], values[places.index(t0)]
        others = ", ".join(u for u, _ in differ[1:5])
        more = f" (and {len(differ) - 5} more)" if len(differ) > 5 else ""
        also = f" Also different: {others}{more}." if others else ""
        message = (
            f"out_specs {spec!r} for {name} leaves out mesh {word} {axes}, which declares "
            f"{name} replicated along {axes} (the same on every device along them), but it "
            f"is not replicated: it varies along {vary}: "
            f"{t} holds {summarize(v)} while {t0} holds {summarize(v0)}."
            f"{also} Either reduce it over {vary} first (lax.psum(..., {over}) or lax.pmean), "
            f"or {_suggest(spec, varying, ndim)} to concatenate the devices' blocks instead.")
        if self.check_vma:
            raise ShardingError(
                message + " (Real JAX checks this from the program, before running it; "
                "check_vma=False turns the check off.)")
        warnings.warn(message + " With check_vma=False simpmd returns the first device's "
                      "copy, as JAX does (JAX does not check).", stacklevel=4)


def _names_unreduced(specs) -> bool:
    """Whether a spec of ``specs`` (a pytree prefix of specs) names unreduced (or reduced)
    axes, which only jit's arrays hold in their types."""
    leaves = tree.flatten(specs)[0] if not isinstance(specs, PartitionSpec) else [specs]
    return any(isinstance(s, PartitionSpec) and (s.unreduced or s.reduced) for s in leaves)


def _as_unreduced(leaf, spec):
    """jax 0.10 takes a result varying over an axis its out_specs call unreduced as the
    parts of a sum over it (a ``vary_unreduced_cast``); later releases refuse it unless
    the body made it so (``lax.pcast(x, axis, to='unreduced')``)."""
    aval = getattr(leaf, "aval", None)
    if not isinstance(spec, PartitionSpec) or aval is None or not spec.unreduced:
        return leaf
    new = tuple(a for a, _ in context.run.axes if a in spec.unreduced and a not in aval.unreduced)
    if not new or not settings.unreduced_out_cast:
        return leaf
    return bind(vary_unreduced_cast, leaf, axes=new)


def _why(program, var, axis):
    """(primitive, source, code) of the equation that made ``var`` vary over ``axis``, or
    None when a body input split over ``axis`` flows into it."""
    made = {v: e for e in program.eqns for v in e.outvars}
    while isinstance(var, Var) and var in made:
        eqn = made[var]
        varying = [v for v in eqn.invars if isinstance(v, Var) and axis in v.aval.vma]
        spreads = eqn.primitive.collective and axis in _axes_of(eqn.params)
        if not varying or spreads:      # a gather, a permute, axis_index: varying by type
            return eqn.primitive.name, eqn.source[0], eqn.source[1]
        # follow a real input before one that a pvary only retyped
        varying.sort(key=lambda v: v in made and made[v].primitive is pvary)
        var = varying[0]
    return None


def _axes_of(params):
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


def _suggest(spec, free, ndim) -> str:
    """How out_specs could name the ``free`` axes too (for the replication error)."""
    if ndim == 0:
        return ("give the result a length-1 axis (out[None]) and name the axes in out_specs "
                f"(e.g. P({tuple(free) if len(free) > 1 else free[0]!r}))")
    entries = [spec[d] if d < len(spec) else None for d in range(ndim)]
    free = tuple(free)
    if len(spec) < ndim and len(free) == 1:
        entries[len(spec)] = free[0]          # the next dimension, kept whole so far
    else:
        last = entries[-1]
        names = () if last is None else (last if isinstance(last, tuple) else (last,))
        names = names + free
        entries[-1] = names[0] if len(names) == 1 else names
    while entries and entries[-1] is None:
        entries.pop()
    axes = " and ".join(repr(n) for n in free)
    return f"name {axes} in out_specs (e.g. {PartitionSpec(*entries)!r})"



def _replicated(stack, spec, mesh) -> bool:
    """True if every device holds the same value along the mesh axes ``spec`` leaves out."""
    used = spec.mesh_axes()
    if all(n in used for n in mesh.axis_names):
        return True
    grid = stack.reshape(tuple(mesh.shape.values()) + stack.shape[1:])
    first = np.broadcast_to(
        grid[tuple(slice(None) if n in used else slice(0, 1) for n in mesh.axis_names)],
        grid.shape)
    # the plain comparison first: NaN-aware equality makes four more arrays of the stack's
    # size, so it is asked only when the values differ somewhere (a NaN, or a real split)
    return np.array_equal(grid, first) or (
        stack.dtype.kind in "fc" and np.array_equal(grid, first, equal_nan=True))


def _block_detail(path, shape, spec, index, whole="from") -> str:
    """'x[0:2, :], shape (2, 16), from x of shape (4, 16)', or 'w whole (P())' when nothing
    is split: the device's block, and the whole array it was cut from (or, for a result,
    goes ``whole="into"``)."""
    if all(sl == slice(None) for sl in index):
        return f"{path} whole ({spec!r})"
    block = tuple(len(range(*sl.indices(n))) for sl, n in zip(index, shape))
    return (f"{path}[{slices_text(index, shape)}], shape {block}, "
            f"{whole} {path} of shape {tuple(shape)}")

