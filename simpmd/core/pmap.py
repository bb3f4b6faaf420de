"""``simpmd.pmap``: split the arguments along one axis, run the body on every device,
stack the results.

A front end over the driver that ``shard_map`` uses (``spmd.py``), as ``jax.pmap`` is a
front end over ``jax.shard_map``: the devices form a one-axis mesh named ``axis_name``,
and ``in_axes=a`` is the spec that splits axis ``a`` over it, with that axis dropped from
each device's piece (JAX squeezes it; ``out_axes`` puts it back). So device ``i`` gets
``x[i]`` for ``in_axes=0``, and the whole of ``x`` for ``in_axes=None``.

Mirrors ``jax.pmap``: ``in_axes``/``out_axes`` as an int, ``None`` (broadcast /
replicated) or a pytree prefix, ``static_broadcasted_argnums``, ``devices=`` and
``axis_size``. A pmap called inside a mapped function is *nested*: it maps a second axis
over a sub-grid of devices (devices are numbered row-major over the grid), with the
original JAX semantics that today's JAX no longer runs.
"""
from __future__ import annotations

import functools
import warnings

import numpy as np

from .devices import device_count, devices as platform_devices
from . import bridge, errors, program, spmd, tree
from .array import Array
from .batching import StackedValue
from .mesh import ShardingError
from .context import current_task, user_stacklevel
from .spmd import Piece, as_array, positional_names
from .trace import Trace
from .traced import DeviceValue


def pmap(fun=None, axis_name=None, *, in_axes=0, out_axes=0, static_broadcasted_argnums=(),
         devices=None, axis_size=None, eager=False, donate_argnums=(), backend=None):
    """Map ``fun`` over simulated devices, like ``jax.pmap``.

    ``eager=True`` (simpmd only) lets the body use Python control flow on array values,
    which real JAX refuses; runs made that way are labelled as such in their trace.
    """
    if fun is None or not callable(fun):
        raise TypeError(
            "pmap needs the function as its first argument. To give options in a decorator, "
            "write @functools.partial(simpmd.pmap, axis_name='i') (as with jax.pmap), or "
            "call simpmd.pmap(f, axis_name='i').")
    _check_static_argnums(static_broadcasted_argnums, fun)
    _check_in_axes(in_axes)
    return Pmapped(fun, axis_name, in_axes, out_axes, static_broadcasted_argnums, devices,
                   axis_size, eager)


def _check_static_argnums(nums, fun):
    """static_broadcasted_argnums must be positions (ints), as in JAX; a name is a mistake."""
    items = nums if isinstance(nums, (tuple, list)) else (nums,)
    for n in items:
        if isinstance(n, (int, np.integer)) and not isinstance(n, bool):
            continue
        names = positional_names(fun)
        hint = (f" {n!r} is argument {names.index(n)} of {getattr(fun, '__name__', 'f')}, so "
                f"write static_broadcasted_argnums=({names.index(n)},)."
                if isinstance(n, str) and n in names else "")
        raise TypeError(
            f"static_broadcasted_argnums={nums!r}: it takes the positions of the static "
            f"arguments (an int or a tuple of ints), not {type(n).__name__} {n!r}.{hint} "
            f"(jax.pmap has no static argument names.)")


def _check_in_axes(in_axes):
    """JAX reads in_axes as a pytree prefix of the argument tuple: a list does not match it."""
    if isinstance(in_axes, list):
        raise ValueError(
            f"in_axes={in_axes!r} is a list, but the arguments arrive as a tuple, and JAX "
            f"matches in_axes to them as a pytree prefix: a list is a different pytree node, "
            f"so real JAX refuses it ('pytree structure error'). Write a tuple: "
            f"in_axes={tuple(in_axes)!r}.")


def _check_static_positions(nums, n_args, fun_name):
    """Every static position must name one of the ``n_args`` positional arguments."""
    for a in nums:
        if not -n_args <= a < n_args:
            raise ValueError(
                f"{fun_name} has static_broadcasted_argnums={tuple(nums)} but was called with "
                f"{n_args} positional argument(s), so position {a} names no argument "
                f"(positions run 0..{n_args - 1}). Pass the static argument by position, "
                f"or fix the number.")


def _argnums(nums):
    return (nums,) if isinstance(nums, int) else tuple(nums)


class Pmapped:
    """A function mapped over simulated devices; ``.trace`` shows its last run."""

    def __init__(self, fun, axis_name, in_axes, out_axes, static_argnums, devices, axis_size,
                 eager):
        functools.update_wrapper(self, fun)
        self.fun, self.axis_name = fun, axis_name
        self.in_axes, self.out_axes = in_axes, out_axes
        self.static_argnums = _argnums(static_argnums)
        self.devices, self.axis_size, self.eager = devices, axis_size, eager
        self.trace: Trace | None = None
        self._param_names = positional_names(fun)

    def __repr__(self):
        return f"<simpmd.pmap of {getattr(self.fun, '__name__', self.fun)!r} over {self.axis_name!r}>"

    def _arg_name(self, i):
        names = self._param_names
        return names[i] if i < len(names) else f"argument {i}"

    # -- splitting ----------------------------------------------------------------------
    def _split(self, args, kwargs, max_devices):
        """Per-leaf mapped axes and the mapped size, with errors a learner can act on."""
        n_args = len(args)
        _check_static_positions(self.static_argnums, n_args,
                                f"pmap of {getattr(self.fun, '__name__', 'the function')}")
        static = {a % n_args for a in self.static_argnums}
        for a in static:
            try:
                hash(args[a])
            except TypeError:
                raise TypeError(
                    f"static_broadcasted_argnums names {self._arg_name(a)} (position {a}), but "
                    f"its value of type {type(args[a]).__name__} is not hashable. Static "
                    f"arguments must be hashable (JAX compiles once per value): pass a tuple "
                    f"instead of a list, or make it a regular (traced) argument.") from None
        if isinstance(self.in_axes, (tuple, list)):
            if len(self.in_axes) != n_args:
                raise ValueError(
                    f"in_axes has {len(self.in_axes)} entries but the function was called with "
                    f"{n_args} positional arguments; give one entry (int or None) per argument.")
            per_arg = list(self.in_axes)
        else:
            per_arg = [self.in_axes] * n_args
        leaves_by_arg, axes_by_arg, paths_by_arg, defs = [], [], [], []
        for i, a in enumerate(args):
            leaves, td = tree.flatten(a)
            defs.append(td)
            if i in static:
                leaves_by_arg.append(None); axes_by_arg.append(None); paths_by_arg.append(None)
                continue
            axes = tree.broadcast_prefix(per_arg[i], a, what=f"in_axes[{i}]")
            leaves_by_arg.append(leaves)
            axes_by_arg.append(axes)
            paths_by_arg.append([self._arg_name(i) + p for p in tree.leaf_paths(a)])
        kw_leaves, kw_def = tree.flatten(kwargs)
        kw_paths = tree.leaf_paths(kwargs, "kwargs")

        mapped = []             # (path, shape, axis) of every mapped leaf
        arrays = []
        for leaves, axes, paths in zip(leaves_by_arg + [kw_leaves], axes_by_arg + [[0] * len(kw_leaves)],
                                       paths_by_arg + [kw_paths]):
            if leaves is None:
                arrays.append(None)
                continue
            conv = []
            for leaf, ax, path in zip(leaves, axes, paths):
                value = leaf.value if type(leaf) is DeviceValue else as_array(leaf)
                if ax is not None:
                    if not isinstance(ax, (int, np.integer)):
                        raise TypeError(f"in_axes entry for {path} is {ax!r}; use an int or None.")
                    if isinstance(leaf, (str, bytes)) or value.dtype.kind in "OUS":
                        raise TypeError(
                            f"{path} is a {type(leaf).__name__} ({leaf!r}), not an array, so "
                            f"it cannot be split across devices or traced. Pass Python "
                            f"settings like this as static arguments: "
                            f"static_broadcasted_argnums=({path_position(path, self)},).")
                    if value.ndim == 0:
                        raise errors.MappedAxisError(
                            f"{path} is a scalar (shape ()), so it has no axis {ax} to split "
                            f"across devices. Real JAX refuses it too, with a message that does "
                            f"not name the argument (its words change between releases). To "
                            f"give every device the same value, mark it in_axes=None (e.g. "
                            f"in_axes=(None, 0)); if Python code decides on it (an `if`, a "
                            f"loop count), make it static instead "
                            f"(static_broadcasted_argnums); to give each device its own "
                            f"value, pass an array with one entry per device.")
                    if not -value.ndim <= ax < value.ndim:
                        raise errors.MappedAxisError(
                            f"{path} has shape {value.shape}, which has no axis {ax} to map "
                            f"(in_axes must be in {-value.ndim}..{value.ndim - 1}).")
                    ax = ax % value.ndim
                    mapped.append((path, value.shape, ax))
                conv.append((value, ax))
            arrays.append(conv)

        sizes = {shape[ax] for _, shape, ax in mapped}
        if len(sizes) > 1:
            listing = "\n".join(f"  {path}: shape {shape}, in_axes {ax} -> size {shape[ax]}"
                                for path, shape, ax in mapped)
            raise errors.MappedAxisError(
                "the mapped arguments disagree on the mapped size (the number of devices):\n"
                f"{listing}\nEvery mapped argument needs the same size along its mapped axis. "
                "Fix the shapes, or mark arguments that every device should see whole with "
                "in_axes=None. (Real JAX reports this as an IndivisibleError about shardings.)")
        if sizes:
            size = sizes.pop()
            if self.axis_size is not None and self.axis_size != size:
                raise errors.MappedAxisError(
                    f"axis_size={self.axis_size} but the mapped arguments have size {size} "
                    f"along their mapped axes; drop axis_size or make them agree.")
        elif self.axis_size is not None:
            size = int(self.axis_size)     # today's JAX refuses this; original pmap allowed it
        else:
            raise errors.MappedAxisError(
                "pmap requires at least one argument with a mapped axis (in_axes not None), "
                "or axis_size=n to say how many devices to use.")
        if size > max_devices:
            count = device_count()
            raise errors.MappedAxisError(
                f"the mapped axis has size {size}, but only {max_devices} simulated devices are "
                f"available ({count} on the platform). pmap runs one shard per device, so the "
                f"mapped size can be at most the device count. Call "
                f"simpmd.set_device_count({size}), or reshape the data to "
                f"({max_devices}, -1, ...) so each device takes several rows.")
        if size == 0:
            zero = [f"{path} (shape {shape}, in_axes {ax})" for path, shape, ax in mapped]
            raise errors.MappedAxisError(
                f"the mapped axis has size 0: {', '.join(zero) or 'axis_size=0'} gives no "
                f"device anything to run. pmap runs one shard per device, so the mapped axis "
                f"needs at least one entry: pass an array with one entry per device along the "
                f"mapped axis (e.g. shape ({device_count()}, ...)).")
        return static, defs, kw_def, arrays, paths_by_arg + [kw_paths], size

    def mapped_size(self, *args, **kwargs) -> int:
        """How many devices a call with these arguments maps over (checking them as a
        call would, without running anything)."""
        return self._split(args, kwargs, 1 << 30)[5]

    # -- calling --------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        parent = current_task()
        if parent is None and bridge.inside_jax((args, kwargs)):
            # Inside a real JAX trace (jax.pmap of a nested simpmd program): today's JAX
            # spells the inner pmap jax.vmap with the same axis name.
            return bridge.jax.pmap_inside_jax(self, args, kwargs)
        if parent is not None and parent.stacked:
            return _nested_call(self, args, kwargs)
        return self._call(parent, args, kwargs)

    def _call(self, parent, args, kwargs, closed=()):
        once = parent is not None and parent.stacked     # nested in a body traced once
        if parent is None:
            device_list = self._device_list()
        else:
            self._check_nesting(parent)
            device_list = [] if once else parent.sim.device_list
        # Nested in a body traced once, each argument leaf holds every outer device's value
        # stacked: the call is checked on the first outer device's, and all are split.
        outer = parent.n if once else 1
        seen = (_first_outer_device(args), _first_outer_device(kwargs)) if once else (args, kwargs)
        static, defs, kw_def, arrays, paths, size = self._split(
            *seen, len(device_list) if device_list else 1 << 30)     # else the grid is checked

        def piece(leaf, v, ax, path):
            whole = leaf.value if type(leaf) is StackedValue else np.broadcast_to(v, (outer,) + v.shape)
            if ax is None:
                stack = np.broadcast_to(whole[:, None], (outer, size) + v.shape)
                detail = (lambda k, t=f"{path} whole (in_axes=None)": t)
            else:
                stack = np.moveaxis(whole, ax + 1, 1)
                head, tail = f"{path}[{':, ' * ax}", received_from(path, v, ax)
                detail = (lambda k: f"{head}{k % size}{tail}")
            return Piece(stack.reshape((outer * size,) + stack.shape[2:]), detail)

        def pieces(value, conv, td, leaf_paths):
            return tree.unflatten(td, [piece(leaf, v, ax, path) for leaf, (v, ax), path
                                       in zip(tree.flatten(value)[0], conv, leaf_paths)])
        dynamic = [i for i in range(len(args)) if i not in static]
        mapped = [pieces(args[i], arrays[i], defs[i], paths[i]) for i in dynamic]
        kw = pieces(kwargs, arrays[-1], kw_def, paths[-1])

        def body(*dyn, **kw):
            full = list(args)                  # static arguments reach the body as they are
            for i, v in zip(dynamic, dyn):
                full[i] = v
            return self.fun(*full, **kw)
        cache = None
        if (parent is None or once) and not self.eager:
            # JAX's signature: the function, the static arguments, the axes, and each
            # argument's shape and dtype (64-bit numbers count as the 32-bit ones JAX makes).
            leaves = tuple((tuple(np.shape(v)), program.canonical_dtype(v.dtype), ax)
                           for conv in arrays if conv is not None for v, ax in conv)
            key = ("pmap", self.axis_name, repr(self.in_axes), repr(self.out_axes),
                   self.axis_size, size, outer, tuple(d.id for d in device_list),
                   tuple((i, type(args[i]), args[i]) for i in sorted(static)),
                   tuple(str(d) for d in defs), str(kw_def), leaves)
            cache = (self.fun, key)
        out = spmd.run(self, body, device_list, ((self.axis_name, size),), tuple(mapped), kw,
                       self._assemble, eager=self.eager, cache=cache, closed=closed)
        if once:
            inner = getattr(self.trace, "program", None)
            if inner is None or inner.broken:
                # The outer program replays this call: an inner body that could not be
                # traced into a program (the reason is on it) makes the outer body one that
                # is traced again on every call too.
                program.break_recording(
                    "a nested pmap's body cannot be traced once: "
                    + (inner.broken if inner is not None else "it was not traced"))
        return out

    def _check_nesting(self, parent):
        """A pmap inside another's body maps a sub-grid; inside shard_map it cannot."""
        if parent.maps_a_mesh:
            raise ShardingError(
                "a pmap was called inside a shard_map body. simpmd does not nest pmap "
                "inside shard_map (and real JAX no longer nests maps over devices either): "
                "a shard_map already maps every axis of its mesh. Add the inner axis to "
                "the mesh instead, e.g. make_mesh((2, 4), ('data', 'model')), and split "
                "the arguments over it in in_specs; collectives can then name either axis "
                "or both.")
        if self.eager and parent.stacked:
            raise errors.MappedAxisError(
                f"this pmap over {self.axis_name!r} has eager=True, but it is nested in a pmap "
                f"whose body is traced once, so it cannot run one program per device. Give "
                f"eager=True to the outermost pmap: the pmaps nested in its body then run "
                f"per device too.")
        if self.devices is not None:
            raise errors.MappedAxisError(
                "a nested pmap cannot take devices=: its devices are the sub-grid of the "
                "outer pmap's devices (choose them with devices= on the outer pmap)")

    def _device_list(self) -> list:
        """The devices a top-level call may use: ``devices=``, or all of the platform's."""
        device_list = list(self.devices) if self.devices is not None else platform_devices()
        if self.devices is not None and not device_list:
            raise ValueError(
                "pmap was given devices=[], an empty list, so there is no device to run on. "
                "Pass the devices to map over, e.g. devices=simpmd.devices()[:n] for the "
                "first n, or leave devices= out to use all of them.")
        for d in device_list:
            if type(d).__name__ != "SimDevice":
                raise TypeError(f"devices= must list simpmd.devices(), got {d!r}")
        ids = [d.id for d in device_list]
        repeated = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) < len(ids) else []
        if repeated:
            raise ValueError(
                f"devices= names device(s) {repeated} more than once; each shard needs a "
                f"device of its own. Pass distinct devices, e.g. simpmd.devices()[:n].")
        return device_list

    # -- stacking -------------------------------------------------------------------------
    def _assemble(self, stacks, treedef, run):
        """Each result leaf stacked along ``out_axes`` (one copy for ``None``), as an Array
        that knows its shards; inside an outer pmap, as each outer device's value.

        A nested pmap traced once runs the inner grids of all outer devices together:
        ``run.outer_n`` of them, of ``m`` devices each, one after the other."""
        g = run.outer_n
        m = run.n // g
        out_axes = tree.broadcast_prefix(self.out_axes, tree.unflatten(treedef, [s[0] for s in stacks]),
                                         what="out_axes")
        out = []
        for k, (s, ax) in enumerate(zip(stacks, out_axes)):
            first, label = s[0], f"out{spmd.leaf_label(treedef, k)}"
            per_outer = s.reshape((g, m) + s.shape[1:])
            if ax is None:
                same = (per_outer == per_outer[:, :1]).reshape(g, m, -1).all(axis=2)
                for o in np.nonzero(~same.all(axis=1))[0]:        # per outer program
                    _warn_not_replicated([run.where(o * m + j) for j in np.nonzero(~same[o])[0]],
                                         run.where(o * m))
                run.returned(s, lambda i, t=label + " whole (out_axes=None)": t)
            else:
                if not -(first.ndim + 1) <= ax <= first.ndim:
                    n = first.ndim
                    raise ValueError(
                        f"out_axes={ax} is out of range for result{spmd.leaf_label(treedef, k)} "
                        f"of shape {first.shape} on each device. out_axes says where the "
                        f"mapped axis goes in the stacked result, which has rank {n + 1}, so "
                        f"use an axis in {-(n + 1)}..{n} (0 stacks along the first axis), or "
                        f"None to return one copy of a result that is the same on every device.")
                ax = ax % (first.ndim + 1)
                run.returned(s, lambda i, a=f"{label}[{':, ' * ax}": f"{a}{i % m}]")
            if not run.nested:
                out.append(Array(s, run.devices, ax, _grid_layout(run, s, ax), self.axis_name))
            elif run.stacked:                # every outer device's value, stacked
                out.append(StackedValue(per_outer[:, 0] if ax is None else
                                   np.moveaxis(per_outer, 1, ax + 1)))
            else:                            # one outer program of a per-device run
                out.append(DeviceValue(first if ax is None else np.moveaxis(s, 0, ax), run.eager))
        return tree.unflatten(treedef, out)


def _describe_nested(pmapped, inner):
    params = {"axis_name": pmapped.axis_name, "name": getattr(pmapped.fun, "__name__", "fun")}
    if inner is not None:
        params.update(axis_size=inner.axis_env[-1][1], call_jaxpr=inner)
    return "xla_pmap", params


def _nested_call(pmapped, args, kwargs, closed=()):
    """A pmap called in a body traced once: one equation of the outer program (``xla_pmap``,
    jax 0.7's name for a pmap in a jaxpr), whose own body is traced once into a program of its own and
    replayed with the outer one. The outer body's values that the inner body reads without
    being passed them (``closed``) become inputs of the equation and of the inner
    program, so a replay gives the inner program this call's values, not the first's."""
    rec = program.recording()
    if rec is None:                         # replaying, or not recording at all
        return pmapped._call(current_task(), args, kwargs, closed)
    rec.busy += 1
    try:
        out = pmapped._call(current_task(), args, kwargs, closed)
    finally:
        rec.busy -= 1
    inner = getattr(pmapped.trace, "program", None)
    lifted = list(getattr(inner, "closed_values", ()) or ())
    if inner is not None:
        inner.closed_values = None          # the first call's values: no longer needed
    primitive, params = _describe_nested(pmapped, inner)
    rec.record(primitive, params, _nested_call, (pmapped, args, kwargs, lifted), {}, out,
               data_constants=False)
    return out


def _first_outer_device(value):
    """``value`` with each stacked leaf (every outer device's) cut to the first device's."""
    leaves, td = tree.flatten(value)
    return tree.unflatten(td, [DeviceValue(v.value[0]) if type(v) is StackedValue else v for v in leaves])


def _warn_not_replicated(differ, first):
    warnings.warn(
        f"out_axes=None returns one copy of a result that should be the same on "
        f"every device, but {', '.join(differ[:4])}"
        f"{f' and {len(differ) - 4} more' if len(differ) > 4 else ''} hold(s) a different value "
        f"than {first}. simpmd returns the first device's value, as "
        f"JAX does (JAX does not check). Reduce it first (e.g. lax.pmean).",
        stacklevel=user_stacklevel())


def received_from(path, value, ax) -> str:
    """'], shape (3,), from x of shape (8, 3)': how a device's row of the trace ends, saying
    both what the device got and the whole argument it was cut from."""
    block = value.shape[:ax] + value.shape[ax + 1:]
    return f"], shape {block}, from {path} of shape {value.shape}"


def path_position(path, pmapped) -> str:
    """The positional index of the argument a leaf path starts with (for advice)."""
    names = pmapped._param_names
    for i, name in enumerate(names):
        if path == name or path.startswith(name + "[") or path.startswith(name + "."):
            return str(i)
    return path.split()[-1].split("[")[0] if path.startswith("argument") else "i"


def _grid_layout(run, values, ax):
    """Where the shards of a nested pmap's result live: every device of the grid.

    Row ``i`` of the outer result was computed by the devices of outer program ``i``.
    When its leading axis is the inner mapped axis (the inner pmap's own result), block
    ``(i, j)`` lives on inner device ``j``; otherwise each of them holds a copy of row ``i``.
    Returns None for a pmap that is not nested.
    """
    subs = run.sub_grids()
    if subs is None:
        return None
    layout = []
    for i, (v, children) in enumerate(zip(values, subs)):
        outer = (slice(None),) * (ax or 0) + (slice(i, i + 1),)
        rest = (slice(None),) * max(v.ndim - 1, 0)
        split = ax == 0 and v.ndim >= 1 and v.shape[0] == len(children)
        for j, device in enumerate(children):
            if ax is None:
                layout.append((device, (slice(None),) * v.ndim, i * len(children) + j))
            elif split:
                layout.append((device, outer + (slice(j, j + 1),) + rest, 0))
            else:
                layout.append((device, outer + (slice(None),) * v.ndim, j))
    return layout
