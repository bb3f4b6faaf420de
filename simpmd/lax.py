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
import re
import sys

import numpy as np

from .core import bridge, control, dtypes, errors, loops
from .api import tree
from .core import collectives as C
from .api import unreduced_ops as U
from .core import core as core_mod
from .core import primitives as P
from .core.core import aval_of, bind, caller_source, context
from .core.program import trace as program_trace
from .core.values import StackedValue
from .api import spelling as S
from .api.printer import SHOWN, forms

__all__ = ["psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
           "pshuffle", "all_to_all", "pswapaxes", "axis_index", "axis_size", "cond", "switch",
           "scan", "fori_loop", "while_loop", "pcast", "pvary", "ragged_dot", "top_k"]


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
    leaves = [_unreduced_psum(leaf, axes, axis_index_groups) for leaf in leaves]
    todo = [k for k, leaf in enumerate(leaves) if not isinstance(leaf, _Summed)]
    summed = iter(bind(C.psum, *[leaves[k] for k in todo], axes=axes,
                       axis_index_groups=_groups(axis_index_groups, "psum")) if todo else [])
    return tree.unflatten(treedef, [leaf.value if isinstance(leaf, _Summed) else next(summed)
                                    for leaf in leaves])


class _Summed:
    def __init__(self, value):
        self.value = value


def _unreduced_psum(leaf, axes, groups):
    """A leaf holding partial sums over ``axes`` (``f32[4]{U:x}``, inside shard_map) is
    summed by JAX's ``unreduced_psum`` (Unreduced -> Invariant); others are left to psum."""
    aval = getattr(leaf, "aval", None)
    if aval is None or not getattr(aval, "unreduced", None) or not set(axes) & aval.unreduced:
        return leaf
    if _pcast_from(aval, axes, "jax.lax.psum") != "unreduced":
        return leaf
    if groups is not None:
        raise NotImplementedError(
            f"psum with axis_index_groups of a value unreduced over {axes}: JAX has no such "
            f"sum either (NotImplementedError). Sum over the whole axes.")
    order = tuple(n for n, _ in context.run.axes if n in axes)
    return _Summed(bind(U.unreduced_psum, leaf, axes=order))


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
def all_gather(x, axis_name, *, axis_index_groups=None, axis=0, tiled=False, to="varying"):
    """Every device gets all devices' ``x``, stacked on a new ``axis`` (joined if ``tiled``).
    ``to='invarying'``: under ``check_vma`` the result is typed as the same on every device
    (JAX's ``all_gather_invariant``), and its gradient is each device's slice, with no
    communication."""
    allowed = {"varying", "reduced", "invarying"}
    if to not in allowed:
        raise errors.CollectiveArgumentError(
            f"Got unexpected `to` value for `jax.lax.all_gather`. Allowed `to` values are: "
            f"{allowed} (JAX's words); got to={to!r}.")
    if to == "reduced":
        raise NotImplementedError(
            "lax.all_gather(..., to='reduced') types its result as reduced inside "
            "shard_map; simpmd types reduced values under jit with Explicit axes, not yet "
            "inside shard_map. Use to='invarying' (the same values, typed as the same on "
            "every device) or run this program on JAX.")
    if to == "invarying" and axis_index_groups is not None:
        raise NotImplementedError(
            "lax.all_gather(..., to='invarying') with axis_index_groups: JAX has no such "
            "gather either (NotImplementedError). Gather over whole axes, or keep "
            "to='varying'.")
    axes, groups = _names(axis_name), _groups(axis_index_groups, "all_gather")
    size = C.group_size(axes, groups) if groups else context.run.axis_size(axes, "all_gather")
    row = U.all_gather_invariant if to == "invarying" else C.all_gather
    return _each_leaf(x, lambda leaf: bind(
        row, leaf, all_gather_dimension=_gather_axis(leaf, axis, tiled, axes),
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
    return _all_leaves(x, C.ppermute, axis_name=_permuted_axes(_names(axis_name), "ppermute"),
                       perm=pairs)


def _permuted_axes(axes, op):
    """The axes a ppermute numbers its devices over. Out of the mesh's order, what the
    running JAX does (``simpmd.jax.rules.ppermute_out_of_mesh_order``), and without JAX
    what the newest release does: refuse, since older releases silently numbered the
    devices in the mesh's order instead (a wrong answer)."""
    run = context.run
    order = [name for name, _ in run.axes]
    known = [a for a in axes if a in order]
    in_order = tuple(sorted(known, key=order.index))
    if len(known) < 2 or tuple(known) == in_order:
        return axes
    rule = (bridge.jax.rules.ppermute_out_of_mesh_order()
            if bridge.jax is not None and "jax" in sys.modules else "refuses")
    if rule == "follows":
        return axes
    if rule == "mesh order":
        return in_order
    raise errors.CollectiveArgumentError(
        f"lax.{op} over {axes} on {run.where()}: the axes are not in the order the mesh "
        f"declares them, {in_order}. JAX refuses this (from 0.11.2: 'Make sure that the "
        f"axis_name passed to jax.lax.ppermute is in the same order as the axis_names "
        f"declared on the mesh'); up to 0.10 it numbered the devices in the mesh's order "
        f"whatever the order given, a silently different permutation. Pass "
        f"axis_name={in_order} and number the devices in that order (the last axis "
        f"fastest), or, on JAX, allow the given order with "
        f"jax.config.update('jax_raise_on_ppermute_sort_diff', False).")


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
    return _all_leaves(x, C.ppermute, axis_name=_permuted_axes(_names(axis_name), "pshuffle"),
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
        import jax  # optional: JAX
        return jax.lax.cond(pred, true_fun, false_fun, *operands)
    return _branching(pred, (false_fun, true_fun), operands, "cond")


def switch(index, branches, *operands):
    """``branches[index](*operands)``, per device (``index`` clamped into range), as
    ``jax.lax.switch``."""
    branches = list(branches)
    if not branches:
        raise ValueError("lax.switch needs at least one branch")
    if bridge.inside_jax((index, operands)):
        import jax  # optional: JAX
        return jax.lax.switch(index, branches, *operands)
    dtype = aval_of(index).dtype if isinstance(index, StackedValue) else np.result_type(index)
    if dtype.kind not in "iu":
        raise TypeError(f"lax.switch's index must be an integer, got {dtype} (JAX raises "
                        f"'Index type must be an integer'). Convert it, e.g. index.astype(int).")
    if len(branches) == 1:                 # as in JAX: no cond at all
        return branches[0](*operands)
    return _branching(index, branches, operands, "switch")


def _branching(index, branches, operands, what="switch"):
    """``lax.switch`` (and ``lax.cond``) on the run of this thread: in an eager run the
    device takes its branch; otherwise every branch is traced and one ``cond`` bound."""
    run, traced = context.run, isinstance(index, StackedValue) and index.stack is None
    if run is None or (run.eager and not traced):
        k = int(np.clip(int(np.asarray(getattr(index, "value", index))), 0, len(branches) - 1))
        return branches[k](*operands)
    if aval_of(index).shape != ():
        raise TypeError(
            f"lax.{what}'s {'predicate' if what == 'cond' else 'index'} must be a scalar on "
            f"each device, got shape {aval_of(index).shape}. Reduce it first (e.g. "
            f"x.sum() > 0), or choose elementwise with snp.where.")
    leaves, in_tree = tree.flatten(operands)
    tracing = run if run.abstract else run.tracing()
    traced, out_trees = [None] * len(branches), [None] * len(branches)
    order = range(len(branches))[::-1] if what == "cond" else range(len(branches))
    for k in order:                        # JAX traces cond's true_fun first
        def flat(*xs, k=k):
            out, out_trees[k] = tree.flatten(branches[k](*tree.unflatten(in_tree, xs)))
            return out
        traced[k] = program_trace(flat, [aval_of(x) for x in leaves], tracing)
    programs, consts = control.common_consts(traced, order)
    _check_branches(programs, out_trees, what)
    if what == "cond" or aval_of(index).dtype != np.int32:
        index = bind(P.convert_element_type, index, new_dtype=np.dtype(np.int32), weak_type=False)
    if what == "switch":                   # JAX clamps the index into range, as an equation
        index = bind(P.clamp, np.int32(0), index, np.int32(len(branches) - 1))
    outs = bind(control.cond, index, *consts, *leaves, branches=tuple(programs), _what=what,
                _source=caller_source())
    return tree.unflatten(out_trees[0], outs)


def _branch_names(what, count) -> list:
    """The branches' names in JAX's messages, in the order ``programs`` holds them."""
    return ["false_fun", "true_fun"] if what == "cond" else [
        "branch 0" if k == 0 else f"branch{k}" for k in range(count)]


def _check_branches(programs, out_trees, what):
    """Every branch returns the same structure and types as the first (``true_fun`` for a
    cond): JAX's typematch, varying manual axes included, and JAX's TypeError if not."""
    names = _branch_names(what, len(programs))
    first = 1 if what == "cond" else 0
    for k, (program, out_tree) in enumerate(zip(programs, out_trees)):
        if k == first:
            continue
        if out_tree != out_trees[first]:
            raise errors.BranchError(
                f"lax.{what}'s branches return different structures: {out_trees[first]} and "
                f"{out_tree}. Every branch must return the same pytree of arrays, with the "
                f"same shapes and dtypes (JAX compiles both).")
        diffs, fixes = _branch_type_diffs(programs[first].out_avals, program.out_avals,
                                          names[first], names[k])
        if diffs:
            raise errors.BranchError(
                f"{what} branches must have equal output types but they differ: "
                f"{_differences_said(diffs, fixes)} Revise {names[first]} and/or "
                f"{names[k]} so that all output types match (JAX compiles every branch "
                f"for one type of result).")


def _differences_said(diffs, fixes) -> str:
    """The differences as one capitalised sentence, then JAX's "This might be fixed by"."""
    text = "; ".join(diffs)
    fix = (" This might be fixed by " + "; ".join(fixes) + ".") if fixes else ""
    return f"{text[0].upper() + text[1:]}.{fix}"


def _branch_type_diffs(avals1, avals2, name1, name2):
    """What differs between two branches' result types, and the pcast that would fix a
    difference of varying manual axes (JAX's wording)."""
    diffs, fixes = [], []
    for k, (a, b) in enumerate(zip(avals1, avals2)):
        if _same_type(a, b):
            continue
        why = [w for w, bad in (("the dtypes do not match", a.dtype != b.dtype),
                                ("the shapes do not match", a.shape != b.shape),
                                ("the manual axis types do not match", a.vma != b.vma),
                                ("the shardings do not match",
                                 a.shape == b.shape and _layout(a) != _layout(b)))
               if bad]
        where = f" (result {k})" if len(avals1) > 1 else ""
        diffs.append(f"the output of {name1}{where} has type {_type_text(a)} but the "
                     f"corresponding output of {name2} has type {_type_text(b)}, so "
                     f"{', '.join(why)}")
        for name, mine, other in ((name1, a, b), (name2, b, a)):
            missing = tuple(sorted(other.vma - mine.vma, key=str))
            if missing:
                fixes.append(f"applying lax.pcast(..., {missing}, to='varying') (on JAX 0.7, "
                             f"lax.pvary(..., {missing})) to the output of {name}{where}")
    return diffs, fixes


# -- loops: scan, fori_loop, while_loop ------------------------------------------------------
# Each traces its body once, on types alone, into a program that one equation of the
# enclosing program holds (simpmd/core/loops.py runs it); the checks of a body's result
# and the printed forms, which change between JAX releases, are this front end's.


def _on_jax(*values) -> bool:
    return bridge.inside_jax(values)


def _traced_body(flat, avals):
    """The program of ``flat`` on values of types ``avals``, and the values it closed over."""
    run = context.run or core_mod.plain
    return program_trace(flat, avals, run if run.abstract else run.tracing())


def _type_text(aval) -> str:
    """How JAX's messages write a type: float32[3]{V:i}, float32[8@a,4]."""
    short = aval.str_short()
    return aval.dtype.name + short[short.index("["):]


def _layout(aval):
    return aval.sharding.dims if aval.sharding is not None else ((),) * aval.ndim


def _same_type(a, b) -> bool:
    """JAX's typematch: shape, dtype, vma and sharding (a weak type matches its strong
    one)."""
    return a.shape == b.shape and a.dtype == b.dtype and a.vma == b.vma and \
        _layout(a) == _layout(b)


def _carry_name(fun) -> str:
    try:
        names = list(inspect.signature(fun).parameters)
    except (TypeError, ValueError):
        names = []
    return names[0] if names else ""


def _check_carry(what, fun, init_tree, out_tree, in_avals, out_avals):
    """The carry keeps its structure and types, as JAX requires (its message, and what to
    do about a carry that starts invariant and comes out varying under check_vma)."""
    name = _carry_name(fun)
    if out_tree != init_tree:
        raise errors.CarryTypeError(
            f"{what} function carry input and carry output must have the same pytree "
            f"structure, but they differ: the input carry {name} is {init_tree} and the "
            f"carry output is {out_tree}. Revise the function so that the carry output has "
            f"the same pytree structure as the carry input.")
    paths = tree.leaf_paths(tree.unflatten(init_tree, range(init_tree.num_leaves)))
    diffs, fixes = [], []
    for path, a, b in zip(paths, in_avals, out_avals):
        if _same_type(a, b):
            continue
        why = [w for w, bad in (("the dtypes do not match", a.dtype != b.dtype),
                                ("the shapes do not match", a.shape != b.shape),
                                ("the varying manual axes do not match", a.vma != b.vma),
                                ("the shardings do not match", _layout(a) != _layout(b)))
               if bad]
        where = f"the input carry component {name}{path}" if path else f"the input carry {name}"
        diffs.append(f"{where} has type {_type_text(a)} but the corresponding output carry "
                     f"component has type {_type_text(b)}, so {' and '.join(why)}")
        missing = tuple(sorted(b.vma - a.vma, key=str))
        if missing and a.vma <= b.vma:
            fixes.append(f"applying lax.pcast(..., {missing}, to='varying') (on JAX 0.7, "
                         f"lax.pvary(..., {missing})) to the initial value of {where}, so that "
                         f"it varies over {missing} from the first iteration, as after it")
    if diffs:
        raise errors.CarryTypeError(
            f"{what} function carry input and carry output must have equal types, but they "
            f"differ: {_differences_said(diffs, fixes)} Revise the function so that all "
            f"output types match the corresponding input types (JAX raises the same "
            f"TypeError: the body is compiled once, for one type of carry).")


def _carried(flat, init, more_avals, fun, what, init_tree, out_trees):
    """Trace a loop body on its carry's types (then ``more_avals``): a Python number in the
    carry whose type the body changes is converted and the body traced again, as JAX
    does; then the carry must keep its types. Returns (program, lifted, init)."""
    init = list(init)
    for attempt in range(2):
        out_trees.clear()
        program, lifted = _traced_body(flat, [aval_of(x) for x in init] + list(more_avals))
        outs = program.out_avals[:len(init)]
        if out_trees[-1][0] != init_tree:
            break
        changed = False
        for k, (x, a, b) in enumerate(zip(init, map(aval_of, init), outs)):
            if a.weak_type and not _same_type(a, b) and a.shape == b.shape:
                dtype = dtypes.promote((a.dtype, True), (b.dtype, b.weak_type))[0]
                init[k] = (bind(P.convert_element_type, x, new_dtype=dtype, weak_type=False)
                           if hasattr(x, "aval") else np.asarray(x, dtype))
                changed = True
        if not changed:
            break
    _check_carry(what, fun, init_tree, out_trees[-1][0], [aval_of(x) for x in init],
                 program.out_avals[:len(init)])
    return program, lifted, init


def _results(values):
    """Outside any mapped body a loop returns NumPy arrays (the only device's values)."""
    if context.run is not None:
        return values
    return [np.asarray(v.stack[0]) if hasattr(v, "stack") and v.stack is not None else v
            for v in values]


def _scan_length(leaves, length):
    lengths = []
    for x in leaves:
        shape = aval_of(x).shape
        if not shape:
            raise ValueError(f"scan got value with no leading axis to scan over: {x!r}. Each "
                             f"leaf of xs is scanned over its first axis.")
        lengths.append(shape[0])
    if length is not None:
        if isinstance(length, StackedValue):
            raise errors.ConcretizationTypeError(
                "The `length` argument to `scan` expects a concrete `int` value. For "
                "scan-like iteration with a dynamic length, use `while_loop` or `fori_loop`.")
        if any(n != int(length) for n in lengths):
            raise ValueError(f"scan got `length` argument of {length} which disagrees with "
                             f"leading axis sizes {lengths}.")
        return int(length)
    if len(set(lengths)) > 1:
        raise ValueError(f"scan got values with different leading axis sizes: "
                         f"{', '.join(map(str, lengths))}.")
    if not lengths:
        raise ValueError("scan got no values to scan over and `length` not provided.")
    return lengths[0]


def scan(f, init, xs=None, length=None, reverse=False, unroll=1, _split_transpose=False):
    """``jax.lax.scan``: ``carry, y = f(carry, x)`` for each row ``x`` of ``xs`` (or
    ``length`` times), returning the last carry and the ``y`` s stacked.

    The body is traced once, on types, into a program; the scan is one equation of the
    enclosing program (``make_jaxpr`` prints ``scan[jaxpr={...} length=...]``), and running
    it runs the body once per row, over every device at once, collectives included: each
    event of the log names its iteration. ``simpmd.grad`` differentiates it as JAX does:
    the forward scan stacks what the backward pass reads, and the backward pass is a scan
    in reverse.
    """
    if _on_jax(init, xs):
        import jax  # optional: JAX
        return jax.lax.scan(f, init, xs, length=length, reverse=reverse, unroll=unroll)
    x_leaves, x_tree = tree.flatten(xs)
    length = _scan_length(x_leaves, length)
    unroll = max(length, 1) if unroll is True else 1 if unroll is False else int(unroll)
    init_leaves, init_tree = tree.flatten(init)
    n = len(init_leaves)
    out_trees = []

    def flat(*leaves):
        out = f(tree.unflatten(init_tree, leaves[:n]), tree.unflatten(x_tree, leaves[n:]))
        if not (isinstance(out, (tuple, list)) and len(out) == 2):
            raise TypeError(f"scan body output must be a pair, got {out!r}: the body returns "
                            f"(new carry, y).")
        carry, carry_tree = tree.flatten(out[0])
        ys, y_tree = tree.flatten(out[1])
        out_trees.append((carry_tree, y_tree))
        return carry + ys
    x_avals = [_row_type(aval_of(x)) for x in x_leaves]
    program, lifted, init_leaves = _carried(flat, init_leaves, x_avals, f, "scan body",
                                            init_tree, out_trees)
    body, consts, kept, ys_forwarded = _forwarded(program, lifted, init_leaves, n)
    outs = bind(loops.scan, *consts, *[init_leaves[k] for k in kept], *x_leaves, jaxpr=body,
                length=length, reverse=bool(reverse), unroll=unroll, num_consts=len(consts),
                num_carry=len(kept), _ys_forwarded=tuple(f is not None for f in ys_forwarded))
    outs = iter(outs)
    carry_out = [next(outs) if k in kept else init_leaves[k] for k in range(n)]
    ys = [x_leaves[f] if f is not None else next(outs) for f in ys_forwarded]
    carry_tree, y_tree = out_trees[-1]
    return (tree.unflatten(carry_tree, _results(carry_out)),
            tree.unflatten(y_tree, _results(ys)))


def _row_type(aval):
    """The type of one row of a scanned array: under jit its leading dimension must be
    whole on every device (JAX's rule), and the row keeps the others' sharding."""
    sharding = aval.sharding
    if sharding is None:
        return aval.update(shape=aval.shape[1:])
    if sharding.dims[0]:
        raise ValueError(
            f"0th dimension of all xs should be replicated. Got {sharding.spec!r} (JAX's "
            f"words): scan hands each iteration one row of xs, so the dimension it scans "
            f"over must be whole on every device. reshard it first, e.g. "
            f"simpmd.reshard(xs, P(None, ...)).")
    return aval.update(shape=aval.shape[1:], sharding=type(sharding)(sharding.mesh,
                                                                      sharding.dims[1:]))


def _forwarded(program, lifted, init, n):
    """JAX's two shortcuts, which show in its printed program: a carry the body passes on
    unchanged becomes a constant, and a ``y`` that is an ``x`` is not copied. Returns the
    body (its inputs: moved carries, closed-over values, carries, xs), the constants, the
    carries kept, and for each ``y`` the ``xs`` leaf it is (None if none)."""
    ins, outs = program.invars, program.outvars
    moved = [k for k in range(n) if outs[k] is ins[k]]
    kept = [k for k in range(n) if k not in moved]
    xs_in = ins[n:]
    ys_forwarded = [next((j for j, v in enumerate(xs_in) if v is y), None) for y in outs[n:]]
    body = core_mod.Program([ins[k] for k in moved] + program.constvars
                            + [ins[k] for k in kept] + xs_in,
                            program.eqns, [outs[k] for k in kept]
                            + [y for y, f in zip(outs[n:], ys_forwarded) if f is None],
                            axis_env=program.axis_env)
    return body, [init[k] for k in moved] + list(lifted), kept, ys_forwarded


def fori_loop(lower, upper, body_fun, init_val, *, unroll=None):
    """``jax.lax.fori_loop``: ``val = body_fun(i, val)`` for ``i`` from ``lower`` to
    ``upper - 1``. With bounds known before the program runs (Python ints) it is a
    ``scan`` over the pair (i, val), as in JAX, and can be differentiated; with bounds that
    are device values it is a ``while_loop``, which cannot."""
    if _on_jax(lower, upper, init_val):
        import jax  # optional: JAX
        return jax.lax.fori_loop(lower, upper, body_fun, init_val, unroll=unroll)
    if _static_int(lower) and _static_int(upper):
        def scanned(carry, _):
            i, x = carry
            return (i + 1, body_fun(i, x)), None
        (_, result), _ = scan(scanned, (int(lower), init_val), None,
                              length=max(int(upper) - int(lower), 0), unroll=unroll or False)
        return result
    if unroll is not None and unroll is not False and unroll != 1:
        raise ValueError("Can only use `unroll` in `fori_loop` if the loop bounds are "
                         "statically known.")

    def body(carry):
        i, hi, x = carry
        return i + 1, hi, body_fun(i, x)
    return while_loop(lambda carry: bind(P.lt, carry[0], carry[1]), body,
                      (lower, upper, init_val))[2]


def _static_int(x) -> bool:
    return (isinstance(x, (int, np.integer)) and not isinstance(x, bool)) or (
        isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iu")


def while_loop(cond_fun, body_fun, init_val):
    """``jax.lax.while_loop``: ``val = body_fun(val)`` while ``cond_fun(val)``.

    Each device loops while its own predicate holds, as on hardware, so devices may run
    different numbers of iterations; a collective in the body that some devices of its
    group no longer reach is a :class:`DeadlockError` (real JAX hangs). ``simpmd.grad``
    refuses it, as ``jax.grad`` does: use ``scan`` or a ``fori_loop`` with static bounds.
    """
    if _on_jax(init_val):
        import jax  # optional: JAX
        return jax.lax.while_loop(cond_fun, body_fun, init_val)
    leaves, init_tree = tree.flatten(init_val)
    out_trees = []

    def body_flat(*xs):
        out, out_tree = tree.flatten(body_fun(tree.unflatten(init_tree, xs)))
        out_trees.append((out_tree,))
        return out

    def cond_flat(*xs):
        pred = cond_fun(tree.unflatten(init_tree, xs))
        a = aval_of(pred)
        if a.shape != () or a.dtype != np.bool_:
            raise TypeError(f"cond_fun must return a boolean scalar, but got output type(s) "
                            f"[{_type_text(a)}]. Compare to make a boolean (e.g. x < 10), "
                            f"and reduce an array first (x.sum() < 10).")
        return [pred]
    cond_program, cond_lifted = _traced_body(cond_flat, [aval_of(x) for x in leaves])
    body_program, body_lifted, leaves = _carried(body_flat, leaves, [], body_fun,
                                                 "while_loop body", init_tree, out_trees)
    if [aval_of(x) for x in leaves] != cond_program.in_avals:       # a carry was promoted
        cond_program, cond_lifted = _traced_body(cond_flat, [aval_of(x) for x in leaves])
    outs = bind(loops.while_, *cond_lifted, *body_lifted, *leaves,
                cond_jaxpr=loops.closed(cond_program), body_jaxpr=loops.closed(body_program),
                cond_nconsts=len(cond_lifted), body_nconsts=len(body_lifted),
                _source=caller_source())
    return tree.unflatten(init_tree, _results(outs))


PCAST_TO = ("varying", "unreduced", "reduced")


class AxisNameTypeError(errors.SimpmdError, TypeError):
    """An axis name given as a type JAX does not take there (a set, whose order is not defined)."""


def pcast(x, axis_name, *, to):
    """``jax.lax.pcast(x, axis_name, to='varying')``: the same value, typed as varying over
    ``axis_name`` (under ``shard_map(check_vma=True)``); no data moves."""
    jax = sys.modules.get("jax")
    if jax is not None and (context.run is None or _on_jax(x)):      # inside a JAX trace
        if not hasattr(jax.lax, "pcast") and to == "varying":       # jax 0.7
            return jax.lax.pvary(x, axis_name)
        return jax.lax.pcast(x, axis_name, to=to)
    axes = _pcast_axes(axis_name, "pcast")
    if not axes:
        return x
    if to not in PCAST_TO:
        raise errors.CollectiveArgumentError(
            f"Got unexpected `to` value {to!r}. Allowed `to` values are: {set(PCAST_TO)} "
            f"(JAX's words): to='varying' types a replicated value as varying over the axes.")
    if to == "reduced":
        return _each_leaf(x, lambda leaf: _reduce(leaf, axes))
    if to == "unreduced":
        return _each_leaf(x, lambda leaf: _unreduce(leaf, axes))
    return _each_leaf(x, lambda leaf: _vary(leaf, axes, "jax.lax.pcast"))


def _unsupported(start, to, axes, leaf, run):
    """JAX's refusal of a pcast between two states it has no cast for."""
    can = {"invarying": "varying or reduced", "varying": "unreduced", "reduced": "varying",
           "unreduced": "nothing (lax.psum sums it)"}[start]
    return errors.VmaError(
        f"Unsupported pcast from={start}, to={to!r} (JAX's words): on {run.where()} the "
        f"value of type {_type_text(aval_of(leaf))} is {start} over {axes}, and a "
        f"{start} value can be cast to {can} only.")


def _reduce(leaf, axes):
    """``pcast(leaf, axes, to='reduced')``: a value the same on every device along ``axes``
    typed as reduced over them (JAX's ``preduced``; no data moves). Its cotangent comes out
    as the parts of a sum, which the transpose adds once (``unreduced_psum``)."""
    run = context.run
    run.axis_size(axes, "pcast")
    if not run.check_vma:                 # JAX: nothing to type without check_vma
        return leaf
    start = _pcast_from(aval_of(leaf), axes, "jax.lax.pcast")
    if start != "invarying":
        raise _unsupported(start, "reduced", axes, leaf, run)
    return bind(U.preduced, leaf, axes=tuple(n for n, _ in run.axes if n in axes))


def _pcast_from(aval, axes, name) -> str:
    """What ``axes`` are to a value of type ``aval``: all 'varying', all 'unreduced' or
    all 'invarying' (JAX's ``_get_from``; a mixture is refused, in JAX's words)."""
    states = {"varying" if a in aval.vma else "unreduced" if a in aval.unreduced
              else "reduced" if a in aval.reduced else "invarying" for a in axes}
    if len(states) > 1:
        raise errors.VmaError(
            f"{name} can only accept axis_name which corresponds to one of varying, "
            f"unreduced, reduced or invarying state of the input. Got input type: "
            f"{_type_text(aval)}, axes: {axes} and input state: {states} (JAX's words). "
            f"Pass the axes of one state at a time.")
    return states.pop()


def _unreduce(leaf, axes):
    """``pcast(leaf, axes, to='unreduced')``: each device's value, varying over ``axes``,
    becomes its part of a sum over them (no data moves; a psum adds the parts)."""
    run = context.run
    run.axis_size(axes, "pcast")
    start = _pcast_from(aval_of(leaf), axes, "jax.lax.pcast")
    if start != "varying":
        raise _unsupported(start, "unreduced", axes, leaf, run)
    order = tuple(n for n, _ in run.axes if n in axes)
    return bind(U.vary_unreduced_cast, leaf, axes=order)


def pvary(x, axis_name):
    """``jax.lax.pvary`` (jax < 0.8; later ``lax.pcast(x, axis_name, to='varying')``)."""
    jax = sys.modules.get("jax")
    if jax is not None and (context.run is None or _on_jax(x)):      # inside a JAX trace
        fn = getattr(jax.lax, "pvary", None)
        return fn(x, axis_name) if fn else jax.lax.pcast(x, axis_name, to="varying")
    axes = _pcast_axes(axis_name, "pvary")
    return _each_leaf(x, lambda leaf: _vary(leaf, axes, "jax.lax.pvary")) if axes else x


def _pcast_axes(axis_name, op):
    """pcast's axes as JAX takes them: a name or a tuple of names, never a set (whose
    order is not defined)."""
    if isinstance(axis_name, (set, frozenset, list)):
        words = "a tuple or a str"
        raise AxisNameTypeError(
            f"axis_name={axis_name!r} must be {words}. Got {axis_name!r} (JAX's words for a "
            f"set; JAX fails on a list too). Write lax.{op}(x, "
            f"{tuple(sorted(axis_name, key=str))!r}, ...).")
    return axis_name if isinstance(axis_name, tuple) else (axis_name,)


def _vary(leaf, axes, name):
    """``leaf`` typed as varying over ``axes``, which it must not vary over yet (JAX's
    rule: a pcast from varying to varying is refused); nothing to do without check_vma."""
    run = context.run
    run.axis_size(axes, name.rsplit(".", 1)[-1])            # each axis must be bound
    if not run.check_vma:
        return leaf
    vma = aval_of(leaf).vma
    if name == "jax.lax.pcast" and _pcast_from(aval_of(leaf), axes, name) == "reduced":
        return bind(U.reduced_vary_cast, leaf, axes=tuple(n for n, _ in run.axes if n in axes))
    already = tuple(a for a in axes if a in vma)
    if already and len(already) < len(axes):
        raise errors.VmaError(
            f"{name} can only accept axis_name which corresponds to one of varying, "
            f"unreduced, reduced or invarying state of the input (JAX's words). Got input "
            f"type {_type_text(aval_of(leaf))} on {run.where()}, axes {axes}: it already "
            f"varies over {already}. Pass only the axes it does not vary over yet, "
            f"{tuple(a for a in axes if a not in vma)}.")
    if already:
        raise errors.VmaError(
            f"Unsupported pcast from=varying, to='varying' (JAX's words): on {run.where()} "
            f"the value of type {_type_text(aval_of(leaf))} already varies over {axes}. "
            f"Drop the {name.rsplit('.', 1)[-1]}: it is needed only for a value that does "
            f"not vary over an axis yet.")
    return bind(C.pvary, leaf, axes=axes)


# -- operations of a mixture-of-experts layer: top_k routing and grouped matrix products ------


def _jax_lax_or_none(values):
    """jax.lax where the call belongs to JAX (JAX values, or no simulated run while JAX is
    in use), else None."""
    jax = sys.modules.get("jax")
    if jax is not None and (bridge.inside_jax(values) or context.run is None):
        return jax.lax
    return None


def top_k(operand, k):
    """The ``k`` largest entries along the last axis and their positions (int32), largest
    first, ties to the lower position and NaN counted largest: ``jax.lax.top_k``. Built
    from a stable sort, so its gradient reaches the chosen entries only, as JAX's does."""
    real = _jax_lax_or_none((operand,))
    if real is not None:
        return real.top_k(operand, k)
    x = operand if isinstance(operand, StackedValue) else np.asarray(operand)
    shape, dtype = tuple(aval_of(x).shape) if isinstance(x, StackedValue) else x.shape, \
        aval_of(x).dtype if isinstance(x, StackedValue) else x.dtype
    if not shape:
        raise TypeError(f"lax.top_k needs an operand with at least one axis, got shape () "
                        f"(a scalar): it picks the largest entries along the last axis.")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 0 <= k <= shape[-1]:
        raise ValueError(f"lax.top_k: k={k!r} must be an integer from 0 to the size of the "
                         f"last axis, {shape[-1]} (the operand has shape {shape}).")
    if isinstance(x, np.ndarray):
        key = ~x if dtype.kind in "iu" else np.where(np.isnan(x), -np.inf, -x)
        index = np.argsort(key, axis=-1, kind="stable")[..., :k].astype(np.int32)
        return np.take_along_axis(x, index, axis=-1), index
    # descending order as an ascending key: ~x reverses integers without overflow; a NaN
    # sorts first, as in XLA's comparator
    key = ~x if dtype.kind in "iu" else S.where(x != x, -np.inf, -x)
    index = S.argsort(key, axis=-1)[..., :k]
    picks = index[..., None] == S.FUNCTIONS["reshape"](
        bind(P.iota, dtype=np.dtype(np.int32), shape=(shape[-1],), dimension=0, sharding=None),
        (1,) * len(shape) + (shape[-1],))
    values = S.where(picks, x[..., None, :], S.zeros_like(x[..., None, :])).sum(axis=-1)
    return values, index


def ragged_dot(lhs, rhs, group_sizes, precision=None, preferred_element_type=None,
               group_offset=None):
    """A grouped matrix product, ``jax.lax.ragged_dot``: ``lhs`` (m, k) holds consecutive
    groups of rows, ``group_sizes[g]`` of them for group ``g``, and each group is multiplied
    by its own matrix ``rhs[g]`` (``rhs``: (groups, k, n)); rows after the last group give
    zeros. A mixture-of-experts layer's experts, on rows sorted by expert.

    simpmd computes it as JAX does where no grouped kernel exists (on CPU): each group's
    rows masked out of ``lhs`` and one batched product over the groups, ``groups`` times
    the arithmetic of the rows themselves. Its gradient comes from those operations."""
    real = _jax_lax_or_none((lhs, rhs, group_sizes))
    if real is not None:
        return real.ragged_dot(lhs, rhs, group_sizes, precision=precision,
                               preferred_element_type=preferred_element_type,
                               group_offset=group_offset)
    if group_offset is not None:
        raise NotImplementedError("lax.ragged_dot: group_offset (a slice of the groups) is not "
                                  "simulated; pass all the groups' matrices in rhs.")
    avals = [aval_of(v) if isinstance(v, StackedValue) else np.asarray(v)
             for v in (lhs, rhs, group_sizes)]
    (ls, rs, gs), kinds = ([tuple(a.shape) for a in avals], [a.dtype.kind for a in avals])
    if len(ls) != 2 or len(rs) != 3 or len(gs) != 1:
        raise TypeError(f"lax.ragged_dot takes lhs (rows, k), rhs (groups, k, n) and "
                        f"group_sizes (groups,); got shapes {ls}, {rs} and {gs}.")
    if kinds[2] not in "iu":
        raise TypeError(f"lax.ragged_dot: group_sizes must hold integers (how many rows each "
                        f"group has), got {avals[2].dtype}.")
    if gs[0] != rs[0] or ls[1] != rs[1]:
        raise TypeError(f"lax.ragged_dot: lhs {ls}, rhs {rs} and group_sizes {gs} do not fit: "
                        f"rhs needs one (k, n) matrix per group ({gs[0]}) and k = lhs's "
                        f"{ls[1]} columns.")
    sizes = S.convert(group_sizes, np.int32) if isinstance(group_sizes, StackedValue) \
        else np.asarray(group_sizes, np.int32)
    ends = S.cumsum(sizes, axis=0) if isinstance(sizes, StackedValue) else np.cumsum(sizes)
    starts = ends - sizes
    row = np.arange(ls[0], dtype=np.int32)[None, :]
    inside = (row >= starts[:, None]) & (row < ends[:, None])           # (groups, rows)
    if not any(isinstance(v, StackedValue) for v in (lhs, rhs, inside)):
        out = np.einsum("gmk,gkn->mn", np.where(inside[:, :, None], lhs, 0), rhs)
        return out.astype(preferred_element_type or np.result_type(avals[0], avals[1]))
    a, b = S.promoted(lhs, rhs, ranks=False)
    masked = S.where(inside[:, :, None], a[None], S.zeros_like(a[None]))  # (groups, rows, k)
    out = S.einsum("gmk,gkn->gmn", masked, b).sum(axis=0)
    return out if preferred_element_type is None else S.convert(out, preferred_element_type)


# -- how make_jaxpr prints a loop: as the installed JAX does --------------------------------


def _tuple_text(items) -> str:
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def _scan_shown(params) -> dict:
    """As the running JAX prints them: ft_in and ft_out, the flat trees of its inputs and
    outputs (jax 0.11 on); num_carry and num_consts (0.8-0.10); those with
    _split_transpose and linear (0.7)."""
    body, nc, nk = params["jaxpr"], params["num_consts"], params["num_carry"]
    shown = {k: params[k] for k in ("jaxpr", "length", "reverse", "unroll")}
    form = forms().scan_form()
    if form == "ft":
        n_x, n_y = len(body.invars) - nc - nk, len(body.outvars) - nk
        forwarded = params.get("_ys_forwarded") or ()
        ys = [f"RightsOnly({'Left' if f else 'Right'}(None))" for f in forwarded]
        ys += ["RightsOnly(Right(None))"] * (n_y - sum(1 for f in forwarded if not f))
        nones = [_tuple_text(["None"] * k) for k in (nc, nk, n_x)]
        shown.update(ft_in=_tuple_text(nones),
                     ft_out=_tuple_text([_tuple_text(["None"] * nk), _tuple_text(ys)]))
        return shown
    shown.update(num_carry=nk, num_consts=nc)
    if form == "linear":
        shown.update(_split_transpose=False, linear=(False,) * len(body.invars))
    return shown


SHOWN[loops.scan] = _scan_shown
