"""``simpmd.lax``: the collectives, spelled exactly as in ``jax.lax``.

In a mapped body each function binds a collective primitive (``simpmd/core/collectives.py``),
which the run combines over every group of devices in one NumPy call. Called on JAX values
(inside a real ``jax.pmap`` or ``jax.jit``), or outside any simulated run when JAX is in
use, each is ``jax.lax``'s own, so one function body runs on both engines.
"""
from __future__ import annotations

import functools
import inspect
import numbers
import sys

import numpy as np

from .core import bridge, control, errors, tree
from .core import collectives as C
from .core.core import aval_of, bind, context

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
           "pshuffle", "all_to_all", "pswapaxes", "axis_index", "axis_size", "cond", "switch"]


def _names(axis_name) -> tuple:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _on_either_engine(fn):
    """simpmd's collective in a simulated run; ``jax.lax``'s on JAX values, or outside
    any run when JAX is in use; otherwise an error that says which axis is unbound."""
    name, signature = fn.__name__, inspect.signature(fn)

    @functools.wraps(fn)
    def collective(*args, **kwargs):
        axis = signature.bind(*args, **kwargs).arguments.get("axis_name")
        if context.run is None or bridge.inside_jax((args, kwargs)):
            jax = sys.modules.get("jax")
            if jax is not None:
                return getattr(jax.lax, name)(*args, **kwargs)
            raise errors.UnboundAxisError(
                f"lax.{name} over axis {axis!r} was called outside any mapped function, so no "
                f"axis is bound ({axis!r} is bound only while a function mapped over it "
                f"runs). Call it inside a function mapped with simpmd.pmap(f, "
                f"axis_name={axis!r}) or simpmd.shard_map over a mesh with that axis.")
        _check_axis_name(axis, name)
        return fn(*args, **kwargs)
    return collective


def _check_axis_name(axis_name, op):
    """A collective names its axis: None (the default of a pmap's axis_name) is no name."""
    if axis_name is None or (isinstance(axis_name, (tuple, list)) and None in axis_name):
        run = context.run
        raise errors.UnboundAxisError(errors.unbound_axis_message(
            op, None, run.where(), run.coords, run.maps_a_mesh))


def _groups(axis_index_groups, op):
    if axis_index_groups is None:
        return None
    run = context.run
    if run.maps_a_mesh and run.check_vma:
        raise errors.CollectiveArgumentError(
            f"lax.{op} got axis_index_groups inside shard_map with check_vma=True; real JAX "
            f"does not implement that combination (it raises NotImplementedError). Pass "
            f"check_vma=False to shard_map, use pmap, or split the mesh axis into two axes "
            f"and reduce over one of them.")
    return tuple(tuple(int(i) for i in g) for g in axis_index_groups)


def _each_leaf(x, fn):
    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, [fn(leaf) for leaf in leaves])


def _all_leaves(x, prim, **params):
    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, bind(prim, *leaves, **params) if leaves else [])


@_on_either_engine
def psum(x, axis_name, *, axis_index_groups=None):
    """Sum ``x`` over the devices of ``axis_name``; every device gets the total."""
    axes = _names(axis_name)
    leaves, treedef = tree.flatten(x)
    if leaves and axis_index_groups is None and all(
            isinstance(v, numbers.Number) and not isinstance(v, np.generic) for v in leaves):
        # A Python constant is known to every device: JAX folds psum(1, 'i') to the axis
        # size without communicating, and returns a Python number.
        size = context.run.axis_size(axes, "psum")
        return tree.unflatten(treedef, [v * size for v in leaves])
    return _all_leaves(x, C.psum, axes=axes, axis_index_groups=_groups(axis_index_groups, "psum"))


@_on_either_engine
def pmean(x, axis_name, *, axis_index_groups=None):
    """Mean of ``x`` over the devices of ``axis_name``."""
    axes, groups = _names(axis_name), _groups(axis_index_groups, "pmean")
    return _all_leaves(x, C.pmean, axes=axes, axis_index_groups=groups,
                       _size=C.group_size(axes, groups) if groups else
                       context.run.axis_size(axes, "pmean"))


@_on_either_engine
def pmax(x, axis_name, *, axis_index_groups=None):
    """Elementwise maximum of ``x`` over the devices of ``axis_name``."""
    return _all_leaves(x, C.pmax, axes=_names(axis_name),
                       axis_index_groups=_groups(axis_index_groups, "pmax"))


@_on_either_engine
def pmin(x, axis_name, *, axis_index_groups=None):
    """Elementwise minimum of ``x`` over the devices of ``axis_name``."""
    return _all_leaves(x, C.pmin, axes=_names(axis_name),
                       axis_index_groups=_groups(axis_index_groups, "pmin"))


def _gather_axis(leaf, axis, tiled, axes):
    ndim = aval_of(leaf).ndim
    if tiled:
        return axis % max(ndim, 1) if -max(ndim, 1) <= axis < max(ndim, 1) else axis
    if not -(ndim + 1) <= axis <= ndim:
        run = context.run
        raise errors.CollectiveArgumentError(
            f"all_gather over {axes} on {run.where(0)}: axis={axis} is out of "
            f"range: the value has shape {aval_of(leaf).shape} (rank {ndim}), and all_gather "
            f"stacks the devices' values along a new axis, so the result has rank {ndim + 1} "
            f"and axis must be in {-(ndim + 1)}..{ndim}. (With tiled=True it joins along an "
            f"existing axis instead, in {-ndim}..{ndim - 1}.)")
    return axis % (ndim + 1)


@_on_either_engine
def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False):
    """Every device gets all devices' ``x``, stacked on a new ``axis`` (joined if ``tiled``)."""
    axes, groups = _names(axis_name), _groups(axis_index_groups, "all_gather")
    size = C.group_size(axes, groups) if groups else context.run.axis_size(axes, "all_gather")
    return _each_leaf(x, lambda leaf: bind(
        C.all_gather, leaf, all_gather_dimension=_gather_axis(leaf, axis, tiled, axes),
        axis_name=axes, axis_index_groups=groups, axis_size=size, tiled=bool(tiled)))


@_on_either_engine
def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Sum over ``axis_name``; device ``i`` keeps block ``i`` of ``scatter_dimension``."""
    axes, groups = _names(axis_name), _groups(axis_index_groups, "psum_scatter")
    size = C.group_size(axes, groups) if groups else context.run.axis_size(axes, "psum_scatter")
    return _each_leaf(x, lambda leaf: bind(
        C.reduce_scatter, leaf, scatter_dimension=scatter_dimension,
        axis_name=axes, axis_index_groups=groups, axis_size=size, tiled=bool(tiled)))


def _check_perm(perm, op):
    """A permutation is a list or tuple of Python ints, known before the program runs."""
    if not isinstance(perm, (list, tuple)):
        raise errors.CollectiveArgumentError(
            f"{op}'s perm is a {type(perm).__name__}; give a list or tuple (real JAX refuses "
            f"other iterables such as generators from 0.11.2): perm=[(0, 1), (1, 2), ...].")
    if op == "ppermute":
        for pair in perm:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise errors.CollectiveArgumentError(
                    f"ppermute's perm entry {pair!r} is not a (source, destination) pair; "
                    f"perm lists pairs, e.g. perm=[(i, (i + 1) % n) for i in range(n)].")
        entries = [(pair, i) for pair in perm for i in pair]
    else:
        entries = [(i, i) for i in perm]
    for pair, i in entries:
        if hasattr(i, "aval") or hasattr(i, "__jax_array__"):
            raise errors.CollectiveArgumentError(
                f"{op}'s perm entry {pair!r} holds a device value (from lax.axis_index or "
                f"another array), but perm is part of the program: the same Python ints on "
                f"every device, known before it runs (real JAX: 'parameter perm was not "
                f"hashable'). List every pair, with n = lax.axis_size(axis): e.g. "
                f"perm=[(i, (i + 1) % n) for i in range(n)] sends each device's value to "
                f"the next.")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise errors.CollectiveArgumentError(
                f"{op}'s perm entry {pair!r} holds {i!r}, a {type(i).__name__}; device "
                f"indices are ints (real JAX refuses {type(i).__name__}s too). Write int "
                f"indices, e.g. (0, 1).")


@_on_either_engine
def ppermute(x, axis_name, perm):
    """Send ``x`` along each ``(source, destination)`` pair; non-receivers get zeros."""
    _check_perm(perm, "ppermute")
    pairs = tuple(tuple(int(i) for i in pair) for pair in perm)
    return _all_leaves(x, C.ppermute, axis_name=_names(axis_name), perm=pairs)


@_on_either_engine
def pshuffle(x, axis_name, perm):
    """Device ``i`` receives ``x`` from device ``perm[i]`` (a ppermute, as in JAX)."""
    _check_perm(perm, "pshuffle")
    perm = [int(i) for i in perm]
    p = context.run.axis_size(_names(axis_name), "pshuffle")
    if sorted(perm) != list(range(p)):
        raise errors.CollectiveArgumentError(
            f"pshuffle over {_names(axis_name)} on {context.run.where(0)}: perm={perm} must be "
            f"a permutation of 0..{p - 1} (member i receives from perm[i]); use ppermute for "
            f"partial exchanges.")
    return _all_leaves(x, C.ppermute, axis_name=_names(axis_name),
                       perm=tuple((src, dst) for dst, src in enumerate(perm)))


@_on_either_engine
def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Block ``i`` of every device's ``split_axis`` goes to device ``i``, joined on
    ``concat_axis``."""
    axes = _names(axis_name)
    name = axes if len(axes) > 1 else axes[0]
    groups = _groups(axis_index_groups, "all_to_all")
    return _each_leaf(x, lambda leaf: bind(
        C.all_to_all, leaf, split_axis=split_axis, concat_axis=concat_axis, axis_name=name,
        axis_index_groups=groups,
        tiled=bool(tiled)))


@_on_either_engine
def pswapaxes(x, axis_name, axis, *, axis_index_groups=None):
    """Swap the mapped axis ``axis_name`` with the local dimension ``axis`` (an all_to_all
    with ``split_axis = concat_axis = axis``, as in JAX)."""
    return all_to_all(x, axis_name, axis, axis, axis_index_groups=axis_index_groups)


@_on_either_engine
def axis_index(axis_name):
    """This device's position along ``axis_name`` (row-major over a tuple of names)."""
    axes = _names(axis_name)
    return bind(C.axis_index, axis_name=axes if len(axes) > 1 else axes[0])


@_on_either_engine
def axis_size(axis_name):
    """How many devices ``axis_name`` spans (a Python int, known before anything runs)."""
    return context.run.axis_size(_names(axis_name), "axis_size")


def cond(pred, true_fun, false_fun, *operands):
    """``true_fun(*operands)`` where ``pred`` is true, ``false_fun(*operands)`` elsewhere.

    As ``jax.lax.cond``: the choice may depend on a device value, so different devices can
    take different branches. That is how a collective gets past tracing into only some
    devices' programs: under ``jax.pmap`` such a program hangs. simpmd traces both
    branches, runs each device's own, and stops with a :class:`DeadlockError` that names
    the devices in each branch if a collective is reached by only some of its group.
    """
    if bridge.inside_jax((pred, operands)):
        import jax
        return jax.lax.cond(pred, true_fun, false_fun, *operands)
    return control.switch(pred, (false_fun, true_fun), operands, "cond")


def switch(index, branches, *operands):
    """``branches[index](*operands)``, per device (``index`` clamped into range), as
    ``jax.lax.switch``."""
    branches = list(branches)
    if not branches:
        raise ValueError("lax.switch needs at least one branch")
    if bridge.inside_jax((index, operands)):
        import jax
        return jax.lax.switch(index, branches, *operands)
    return control.switch(index, branches, operands, "switch")
