"""``simpmd.lax``: the collectives, spelled exactly as in ``jax.lax``.

Called in a body traced once (the default), each function combines every device's
value in one NumPy call (``batching.StackedRun.collective``); called on one device of an
eager run, it joins a rendezvous of that simulation (``simpmd.eager.scheduler``).
Called anywhere else (for instance inside a real ``jax.pmap`` trace) it hands over to
``jax.lax`` when JAX has been imported (``handoff.py``), so one function body runs on both
engines.
"""
from __future__ import annotations

import numbers

import numpy as np

from . import autodiff, bridge, errors, tree
from .context import current_task
from .traced import DeviceValue, choose_branch

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
           "pshuffle", "all_to_all", "pswapaxes", "axis_index", "axis_size", "cond", "switch"]


def _axes(axis_name) -> tuple:
    if isinstance(axis_name, (tuple, list)):
        return tuple(axis_name)
    return (axis_name,)


def _outside(name, *args, **kwargs):
    """Outside a simulation: JAX's own collective, when JAX is in use."""
    result = NotImplemented if bridge.jax is None else bridge.jax.collective(name, *args, **kwargs)
    if result is not NotImplemented:
        return result
    axis = args[0] if name in ("axis_index", "axis_size") else args[1]
    raise errors.UnboundAxisError(
        f"lax.{name} over axis {axis!r} was called outside any mapped function, so no axis "
        f"is bound ({axis!r} is bound only while a function mapped over it runs). Call it "
        f"inside a function mapped with simpmd.pmap(f, axis_name={axis!r}) or "
        f"simpmd.shard_map over a mesh with that axis.")


def _check_perm(perm, op):
    """A permutation is a list or tuple of Python ints, known before the program runs.

    It is part of the program, the same on every device, so it cannot be computed from a
    device value (lax.axis_index); floats are refused, as JAX refuses them, rather than
    truncated.
    """
    if not isinstance(perm, (list, tuple)):
        raise errors.CollectiveArgumentError(
            f"{op}'s perm is a {type(perm).__name__}; give a list or tuple (real JAX refuses "
            f"other iterables such as generators from 0.11.2): perm=[(0, 1), (1, 2), ...].")
    if op == "pshuffle":
        entries = [(i, i) for i in perm]
    else:
        for pair in perm:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise errors.CollectiveArgumentError(
                    f"ppermute's perm entry {pair!r} is not a (source, destination) pair; "
                    f"perm lists pairs, e.g. perm=[(i, (i + 1) % n) for i in range(n)].")
        entries = [(pair, i) for pair in perm for i in pair]
    for pair, i in entries:
        if isinstance(i, DeviceValue) or hasattr(i, "__jax_array__"):
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
                f"indices are ints (real JAX refuses {type(i).__name__}s too). Write "
                f"int indices, e.g. (0, 1).")


def _check_axis_name(axis_name, op):
    """A collective names its axis: None (the default of a pmap's axis_name) is no name."""
    if axis_name is None or (isinstance(axis_name, (tuple, list)) and None in axis_name):
        task = current_task()
        raise errors.UnboundAxisError(errors.unbound_axis_message(
            op, None, task.where(), task.coords, task.maps_a_mesh))


def _run(op, x, axis_name, params, groups=None, flat=None):
    """Join the collective ``op`` with ``x``'s leaves (``flat``: ``x`` already flattened)."""
    task = current_task()
    _check_axis_name(axis_name, op)
    leaves, treedef = flat or tree.flatten(x)
    groups = None if groups is None else [list(g) for g in groups]
    if groups is not None and task.maps_a_mesh and task.check_vma:
        raise errors.CollectiveArgumentError(
            f"lax.{op} got axis_index_groups inside shard_map with check_vma=True; real JAX "
            f"does not implement that combination (it raises NotImplementedError). Pass "
            f"check_vma=False to shard_map, use pmap, or split the mesh axis into two "
            f"axes and reduce over one of them.")
    if autodiff.holds_grad_value(leaves):        # a value simpmd.grad is differentiating
        return autodiff.collective(op, leaves, treedef, axis_name, params, groups,
                                   lambda primals: tree.flatten(_run(
                                       op, primals, axis_name, params, groups))[0])
    # The program answers: a StackedRun for every device at once, an eager Task for one.
    return tree.unflatten(treedef, task.collective(op, _axes(axis_name), leaves, params, groups))


def psum(x, axis_name, *, axis_index_groups=None):
    """Sum ``x`` over the devices of ``axis_name``; every device gets the total."""
    task = current_task()
    if task is None:
        return _outside("psum", x, axis_name, axis_index_groups=axis_index_groups)
    _check_axis_name(axis_name, "psum")
    leaves, treedef = tree.flatten(x)
    if leaves and axis_index_groups is None and all(
            isinstance(v, numbers.Number) and not isinstance(v, np.generic) for v in leaves):
        # A Python constant is known to every device: JAX folds psum(1, 'i') to the axis
        # size without communicating, and returns a Python number.
        size = _size(task, _axes(axis_name), "psum")
        return tree.unflatten(treedef, [v * size for v in leaves])
    return _run("psum", x, axis_name, {}, axis_index_groups, flat=(leaves, treedef))


def pmean(x, axis_name, *, axis_index_groups=None):
    """Mean of ``x`` over the devices of ``axis_name``."""
    if current_task() is None:
        return _outside("pmean", x, axis_name, axis_index_groups=axis_index_groups)
    return _run("pmean", x, axis_name, {}, axis_index_groups)


def pmax(x, axis_name, *, axis_index_groups=None):
    """Elementwise maximum of ``x`` over the devices of ``axis_name``."""
    if current_task() is None:
        return _outside("pmax", x, axis_name, axis_index_groups=axis_index_groups)
    return _run("pmax", x, axis_name, {}, axis_index_groups)


def pmin(x, axis_name, *, axis_index_groups=None):
    """Elementwise minimum of ``x`` over the devices of ``axis_name``."""
    if current_task() is None:
        return _outside("pmin", x, axis_name, axis_index_groups=axis_index_groups)
    return _run("pmin", x, axis_name, {}, axis_index_groups)


def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False):
    """Every device gets all devices' ``x``, stacked on a new ``axis`` (joined if ``tiled``)."""
    if current_task() is None:
        return _outside("all_gather", x, axis_name, axis_index_groups=axis_index_groups,
                        axis=axis, tiled=tiled)
    return _run("all_gather", x, axis_name, {"axis": axis, "tiled": bool(tiled)},
                axis_index_groups)


def psum_scatter(x, axis_name, *, scatter_dimension=0, axis_index_groups=None, tiled=False):
    """Sum over ``axis_name``; device ``i`` keeps block ``i`` of ``scatter_dimension``."""
    if current_task() is None:
        return _outside("psum_scatter", x, axis_name, scatter_dimension=scatter_dimension,
                        axis_index_groups=axis_index_groups, tiled=tiled)
    return _run("psum_scatter", x, axis_name,
                {"scatter_dimension": scatter_dimension, "tiled": bool(tiled)}, axis_index_groups)


def ppermute(x, axis_name, perm):
    """Send ``x`` along each ``(source, destination)`` pair; non-receivers get zeros."""
    if current_task() is None:
        return _outside("ppermute", x, axis_name, perm)
    _check_perm(perm, "ppermute")
    perm = tuple(tuple(int(i) for i in pair) for pair in perm)
    return _run("ppermute", x, axis_name, {"perm": perm})


def pshuffle(x, axis_name, perm):
    """Device ``i`` receives ``x`` from device ``perm[i]``."""
    if current_task() is None:
        return _outside("pshuffle", x, axis_name, perm)
    _check_perm(perm, "pshuffle")
    return _run("pshuffle", x, axis_name, {"perm": tuple(int(i) for i in perm)})


def all_to_all(x, axis_name, split_axis, concat_axis, *, axis_index_groups=None, tiled=False):
    """Block ``i`` of every device's ``split_axis`` goes to device ``i``, joined on ``concat_axis``."""
    if current_task() is None:
        return _outside("all_to_all", x, axis_name, split_axis, concat_axis,
                        axis_index_groups=axis_index_groups, tiled=tiled)
    return _run("all_to_all", x, axis_name, {"split_axis": split_axis,
                "concat_axis": concat_axis, "tiled": bool(tiled)}, axis_index_groups)


def pswapaxes(x, axis_name, axis, *, axis_index_groups=None):
    """Swap the mapped axis ``axis_name`` with the local dimension ``axis``."""
    if current_task() is None:
        return _outside("pswapaxes", x, axis_name, axis, axis_index_groups=axis_index_groups)
    return _run("pswapaxes", x, axis_name, {"axis": axis}, axis_index_groups)


def axis_index(axis_name):
    """This device's position along ``axis_name`` (row-major over a tuple of names)."""
    task = current_task()
    if task is None:
        return _outside("axis_index", axis_name)
    _check_axis_name(axis_name, "axis_index")
    return task.axis_index(_axes(axis_name))


def axis_size(axis_name):
    """How many devices ``axis_name`` spans (a Python int, known before anything runs)."""
    task = current_task()
    if task is None:
        return _outside("axis_size", axis_name)
    _check_axis_name(axis_name, "axis_size")
    return _size(task, _axes(axis_name), "axis_size")


def _size(task, axes, opname):
    return task.axis_size(axes, opname)


# -- control flow on device values ----------------------------------------------------------


def cond(pred, true_fun, false_fun, *operands):
    """``true_fun(*operands)`` where ``pred`` is true, ``false_fun(*operands)`` elsewhere.

    As ``jax.lax.cond``: the choice may depend on a device value, so different devices
    can take different branches. That is how a collective gets past tracing into only
    some devices' programs: under ``jax.pmap`` such a program hangs. simpmd traces both
    branches, runs each device's own, and stops with a :class:`DeadlockError` that names
    the devices in each branch if a collective is reached by only some of its group.
    """
    return switch(pred, (false_fun, true_fun), *operands, _what="cond")


def switch(index, branches, *operands, _what="switch"):
    """``branches[index](*operands)``, per device (``index`` clamped into range), as
    ``jax.lax.switch``."""
    branches = list(branches)
    if not branches:
        raise ValueError("lax.switch needs at least one branch")
    if bridge.inside_jax((index, operands)):      # inside a JAX trace: JAX's own
        import jax
        if _what == "cond":
            return jax.lax.cond(index, branches[1], branches[0], *operands)
        return jax.lax.switch(index, branches, *operands)
    task = current_task()
    if task is None:                              # no simulation: a concrete choice
        return choose_branch(index, branches, operands)
    return task.switch(index, branches, operands, _what)


# -- the transposes, for simpmd.grad ---------------------------------------------------------
# The backward pass of a collective is a collective. Each is registered with autodiff.py
# here, as jax.lax registers its primitives' transpose rules with JAX's autodiff.

def _inverse(perm):
    return [(dst, src) for src, dst in perm]


def _pshuffle_inverse(perm):
    inverse = [0] * len(perm)
    for i, source in enumerate(perm):
        inverse[source] = i
    return inverse


# op -> (ct, axes, params, groups) -> the cotangent of the input.
autodiff.TRANSPOSE.update({
    "psum": lambda ct, axes, p, g: psum(ct, axes, axis_index_groups=g),
    "pmean": lambda ct, axes, p, g: pmean(ct, axes, axis_index_groups=g),
    "all_gather": lambda ct, axes, p, g: psum_scatter(
        ct, axes, scatter_dimension=p["axis"], tiled=p["tiled"], axis_index_groups=g),
    "psum_scatter": lambda ct, axes, p, g: all_gather(
        ct, axes, axis=p["scatter_dimension"], tiled=p["tiled"], axis_index_groups=g),
    "ppermute": lambda ct, axes, p, g: ppermute(ct, axes, _inverse(p["perm"])),
    "pshuffle": lambda ct, axes, p, g: pshuffle(ct, axes, _pshuffle_inverse(p["perm"])),
    "all_to_all": lambda ct, axes, p, g: all_to_all(
        ct, axes, p["concat_axis"], p["split_axis"], tiled=p["tiled"], axis_index_groups=g),
    "pswapaxes": lambda ct, axes, p, g: pswapaxes(ct, axes, p["axis"], axis_index_groups=g),
    "pvary": lambda ct, axes, p, g: psum(ct, axes),
})
