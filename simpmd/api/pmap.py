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

from ..core import bridge, dtypes, errors
from . import tree
from ..core.core import Aval, aval_of, context, user_stacklevel
from ..core.run import Run
from ..core.values import StackedValue
from ..machine.array import Array
from ..machine.devices import device_count, devices as platform_devices, platform
from ..machine.mesh import ShardingError
from . import nested, spmd
from .shapes import aval_of_shape, is_shape, struct_of
from .spmd import Piece, as_array, positional_names, value_or_shape
from ..machine.devices import intercepts


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
    """JAX reads in_axes as a pytree prefix of the argument tuple: a list or a dict does not
    match it."""
    if isinstance(in_axes, dict):
        raise ValueError(
            f"in_axes={in_axes!r} is a dict, but JAX matches in_axes to the tuple of "
            f"arguments as a pytree prefix, and a dict is not a prefix of a tuple, so real "
            f"JAX refuses it ('pytree structure error'). To give the axes of one dict "
            f"argument, put the dict in a tuple with one entry per argument: "
            f"in_axes=({in_axes!r},).")
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

    runs_over_devices = True      # eval_shape and make_jaxpr run it as it is

    def __init__(self, fun, axis_name, in_axes, out_axes, static_argnums, devices, axis_size,
                 eager):
        functools.update_wrapper(self, fun)
        self.fun, self.axis_name = fun, axis_name
        self.in_axes, self.out_axes = in_axes, out_axes
        self.static_argnums = _argnums(static_argnums)
        self.devices, self.axis_size, self.eager = devices, axis_size, eager
        self.trace = None
        self._param_names = positional_names(fun)

    def __repr__(self):
        return f"<simpmd.pmap of {getattr(self.fun, '__name__', self.fun)!r} over {self.axis_name!r}>"

    def _arg_name(self, i):
        names = self._param_names
        return names[i] if i < len(names) else f"argument {i}"

    # -- splitting ----------------------------------------------------------------------
    def _split(self, args, kwargs, max_devices):
        """Per-leaf mapped axes and the mapped size, with errors a learner can act on."""
        static = self._static(args)
        per_arg = self._per_arg_axes(len(args))
        leaves_by_arg, axes_by_arg, paths_by_arg, defs = [], [], [], []
        for i, a in enumerate(args):
            leaves, td = tree.flatten(a)
            defs.append(td)
            if i in static:
                leaves_by_arg.append(None); axes_by_arg.append(None); paths_by_arg.append(None)
                continue
            axes_by_arg.append(tree.broadcast_prefix(per_arg[i], a, what=f"in_axes[{i}]"))
            leaves_by_arg.append(leaves)
            paths_by_arg.append([self._arg_name(i) + p for p in tree.leaf_paths(a)])
        kw_leaves, kw_def = tree.flatten(kwargs)
        kw_paths = tree.leaf_paths(kwargs, "kwargs")
        mapped, arrays = [], []          # (path, shape, axis) of every mapped leaf
        for leaves, axes, paths in zip(leaves_by_arg + [kw_leaves],
                                       axes_by_arg + [[0] * len(kw_leaves)],
                                       paths_by_arg + [kw_paths]):
            arrays.append(None if leaves is None else [
                self._mapped_leaf(leaf, ax, path, mapped) for leaf, ax, path in
                zip(leaves, axes, paths)])
        size = self._mapped_size(mapped, max_devices)
        return static, defs, kw_def, arrays, paths_by_arg + [kw_paths], size

    def _static(self, args) -> set:
        """The positions of the static arguments, each checked hashable (JAX compiles once
        per value)."""
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
        return static

    def _per_arg_axes(self, n_args) -> list:
        if not isinstance(self.in_axes, (tuple, list)):
            return [self.in_axes] * n_args
        if len(self.in_axes) != n_args:
            raise ValueError(
                f"in_axes has {len(self.in_axes)} entries but the function was called with "
                f"{n_args} positional arguments; give one entry (int or None) per argument.")
        return list(self.in_axes)

    def _mapped_leaf(self, leaf, ax, path, mapped):
        """(value or type, axis) of one argument leaf, its axis checked; a mapped leaf's
        (path, shape, axis) is added to ``mapped``."""
        value = leaf.aval if isinstance(leaf, StackedValue) else value_or_shape(leaf)
        if ax is None:
            return value, ax
        if not isinstance(ax, (int, np.integer)):
            raise TypeError(f"in_axes entry for {path} is {ax!r}; use an int or None.")
        if isinstance(leaf, (str, bytes)) or value.dtype.kind in "OUS":
            raise TypeError(
                f"{path} is a {type(leaf).__name__} ({leaf!r}), not an array, so it cannot be "
                f"split across devices or traced. Pass Python settings like this as static "
                f"arguments: static_broadcasted_argnums=({path_position(path, self)},).")
        if value.ndim == 0:
            raise errors.MappedAxisError(
                f"{path} is a scalar (shape ()), so it has no axis {ax} to split across "
                f"devices. Real JAX refuses it too, with a message that does not name the "
                f"argument (its words change between releases). To give every device the same "
                f"value, mark it in_axes=None (e.g. in_axes=(None, 0)); if Python code decides "
                f"on it (an `if`, a loop count), make it static instead "
                f"(static_broadcasted_argnums); to give each device its own value, pass an "
                f"array with one entry per device.")
        if not -value.ndim <= ax < value.ndim:
            raise errors.MappedAxisError(
                f"{path} has shape {value.shape}, which has no axis {ax} to map (in_axes must "
                f"be in {-value.ndim}..{value.ndim - 1}).")
        mapped.append((path, value.shape, ax % value.ndim))
        return value, ax % value.ndim

    def _mapped_size(self, mapped, max_devices) -> int:
        """The size every mapped leaf agrees on (or ``axis_size``), at most the devices."""
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
        _check_size(size, max_devices, mapped)
        return size

    def mapped_size(self, *args, **kwargs) -> int:
        """How many devices a call with these arguments maps over (checking them as a
        call would, without running anything)."""
        return self._split(args, kwargs, 1 << 30)[5]

    # -- calling --------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        run = context.run
        if run is None and bridge.inside_jax((args, kwargs)):
            # Inside a real JAX trace (jax.pmap of a nested simpmd program): today's JAX
            # spells the inner pmap jax.vmap with the same axis name.
            return bridge.jax.pmap_inside_jax(self, args, kwargs)
        if run is not None and not run.axes and not run.eager:
            return self._nested(args, kwargs, self._device_list())  # under jit, grad, a loop
        if run is not None:
            self._check_nesting(run)
            if not run.eager:
                return self._nested(args, kwargs)
        if intercepts():
            raise NotImplementedError(
                "simpmd.pmap inside simpmd.run_processes is not simulated (in multi-process "
                "JAX it maps over each process's local devices). Write the program as a "
                "jit or shard_map over a mesh of every process's devices.")
        return self._call(args, kwargs)

    def _signature(self, args, kwargs, devices):
        """JAX's cache key: the function's settings, the static arguments' values, the
        arguments' structure and each leaf's shape and dtype (64-bit as the 32-bit JAX
        makes of it), looked up before anything is checked."""
        n = len(args)
        static = tuple(sorted({a % n for a in self.static_argnums})) if n else ()
        leaves, treedef = tree.flatten(tuple(a for i, a in enumerate(args) if i not in static))
        kw_leaves, kw_def = tree.flatten(kwargs)
        try:
            shapes = tuple((tuple(x.shape), np.dtype(x.dtype)) if is_shape(x) else
                           (np.shape(x), dtypes.of_python(x)) for x in leaves + kw_leaves)
            statics = tuple((i, type(args[i]), args[i]) for i in static)
            hash(statics)
        except Exception:
            return None
        return ("pmap", self.axis_name, repr(self.in_axes), repr(self.out_axes), self.axis_size,
                _device_key(self.devices, devices), statics, treedef, kw_def, shapes)

    def _prepare(self, args, kwargs):
        """What a call needs before it runs: the devices, the signature's key, every mapped
        leaf's pieces, the body with the static arguments in place, the mapped size."""
        devices = self._device_list()
        key = None if self.eager else self._signature(args, kwargs, devices)
        found = spmd.cached(self.fun, key) if key is not None else None
        if found is not None and hasattr(found, "axes"):
            axes, size, static, paths = found.axes, found.size, found.static, found.paths
        else:
            static, defs, kw_def, arrays, paths, size = self._split(args, kwargs, len(devices))
            axes = [ax for conv in arrays if conv is not None for _, ax in conv]
            paths = [p for group in paths if group is not None for p in group]
        dynamic = [i for i in range(len(args)) if i not in static]
        leaves, treedef = tree.flatten(([args[i] for i in dynamic], kwargs))
        pieces = [_piece(leaf, ax, size, path) for leaf, ax, path in zip(leaves, axes, paths)]
        dyn_args, kw = tree.unflatten(treedef, pieces)

        def body(*dyn, **kw):
            full = list(args)                  # static arguments reach the body as they are
            for i, v in zip(dynamic, dyn):
                full[i] = v
            return self.fun(*full, **kw)
        cache = (self.fun, key) if key is not None else None
        remember = (axes, size, static, paths) if found is None else None
        return devices, cache, body, tuple(dyn_args), kw, size, remember

    def _call(self, args, kwargs):
        devices, cache, body, dyn_args, kw, size, remember = self._prepare(args, kwargs)
        out = spmd.run(self, body, devices, ((self.axis_name, size),), dyn_args, kw,
                       self._assemble, eager=self.eager, cache=cache)
        self._remember(cache, remember)
        return out

    def _remember(self, cache, remember):
        traced = spmd.cached(*cache) if cache is not None and remember else None
        if traced is not None:                   # what the signature decided, kept with it
            traced.axes, traced.size, traced.static, traced.paths = remember

    def traced(self, *args, **kwargs):
        """The body's program for these arguments (cached, or traced now), without running
        it: what ``make_jaxpr`` of a pmapped function prints."""
        devices, cache, body, dyn_args, kw, size, remember = self._prepare(args, kwargs)
        grid = Run(devices, ((self.axis_name, size),))
        traced = spmd.program_for(body, grid, dyn_args, kw, cache)
        self._remember(cache, remember)
        return traced.program

    def _nested(self, args, kwargs, devices=None):
        """A pmap called in a body being traced: one ``xla_pmap`` equation of the outer
        program, whose own body is traced once into a program of its own (the outer
        body's values it reads become inputs of both: closure conversion). ``devices``:
        its own, where the body around it maps no axis."""
        static, defs, kw_def, arrays, paths, size = self._split(
            args, kwargs, 1 << 30 if devices is None else len(devices))
        dynamic = [i for i in range(len(args)) if i not in static]
        leaves, treedef = tree.flatten(([args[i] for i in dynamic], kwargs))
        axes = [ax for conv in arrays if conv is not None for _, ax in conv]
        out_def = []

        def body(*xs):
            dyn, kw = tree.unflatten(treedef, xs)
            full = list(args)
            for i, v in zip(dynamic, dyn):
                full[i] = v
            out, td = tree.flatten(self.fun(*full, **kw))
            out_def.append(td)
            return out

        paths = [p for group in paths if group is not None for p in group]
        log = _NestedLog(paths, axes, [getattr(x, "shape", np.shape(x)) for x in leaves], size)

        def out_axes(program):
            placed = tree.unflatten(out_def[0], [object() for _ in program.out_avals])
            wanted = tree.broadcast_prefix(self.out_axes, placed, what="out_axes")
            log.out_axes = [None if ax is None else ax % (len(a.shape) + 1)
                            for ax, a in zip(wanted, program.out_avals)]
            return log.out_axes
        outs = nested.nested_pmap(body, leaves, axes, out_axes, self.axis_name, size,
                                  getattr(self.fun, "__name__", "fun"), log,
                                  None if devices is None else devices[:size])
        log.outputs(out_def[0])
        return tree.unflatten(out_def[0], outs)

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
        if self.eager and not parent.eager:
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
        if self.devices is None:          # the platform's own: nothing to check
            return platform_devices()
        device_list = list(self.devices)
        if not device_list:
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
    def _assemble(self, stacks, treedef, run, program=None):
        """Each result leaf stacked along ``out_axes`` (one copy for ``None``), as an Array
        that knows its shards; inside an eager outer pmap, as each outer device's value; on
        shapes alone (a result is one device's :class:`Aval`), as a ShapeDtypeStruct."""
        firsts = [s if isinstance(s, Aval) else s[0] for s in stacks]
        out_axes = tree.broadcast_prefix(self.out_axes, tree.unflatten(treedef, firsts),
                                         what="out_axes")
        out, labels = [], spmd.leaf_labels(treedef)
        for k, (s, first, ax) in enumerate(zip(stacks, firsts, out_axes)):
            label = f"out{labels[k]}"
            shapes_only = isinstance(s, Aval)
            stack = None if shapes_only else s
            if ax is None:
                if not shapes_only:
                    same = (s == s[:1]).reshape(s.shape[0], -1).all(axis=1) if s.size else \
                        np.ones(s.shape[0], bool)
                    if not same.all():
                        _warn_not_replicated([run.where(j) for j in np.nonzero(~same)[0]],
                                             run.where(0))
                run.returned(stack, lambda i, t=label + " whole (out_axes=None)": t,
                             first if shapes_only else None)
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
                run.returned(stack, lambda i, a=f"{label}[{':, ' * ax}": f"{a}{i}]",
                             first if shapes_only else None)
            if shapes_only:
                shape = first.shape if ax is None else first.shape[:ax] + (run.n,) + first.shape[ax:]
                out.append(struct_of(first.update(shape=shape, weak_type=False)))
            elif run.nested:                   # one outer device of an eager run
                value = first if ax is None else np.moveaxis(s, 0, ax)
                out.append(StackedValue(Aval(value.shape, value.dtype), value[None]))
            else:
                out.append(Array(s, run.devices, ax, _grid_layout(run, s, ax), self.axis_name))
        return tree.unflatten(treedef, out)


def _check_size(size, max_devices, mapped):
    if size > max_devices:
        raise errors.MappedAxisError(
            f"the mapped axis has size {size}, but only {max_devices} simulated devices are "
            f"available ({device_count()} on the platform). pmap runs one shard per device, "
            f"so the mapped size can be at most the device count. Call "
            f"simpmd.set_device_count({size}), or reshape the data to "
            f"({max_devices}, -1, ...) so each device takes several rows.")
    if size == 0:
        zero = [f"{path} (shape {shape}, in_axes {ax})" for path, shape, ax in mapped]
        raise errors.MappedAxisError(
            f"the mapped axis has size 0: {', '.join(zero) or 'axis_size=0'} gives no "
            f"device anything to run. pmap runs one shard per device, so the mapped axis "
            f"needs at least one entry: pass an array with one entry per device along the "
            f"mapped axis (e.g. shape ({device_count()}, ...)).")


def _device_key(given, devices):
    """The devices in a signature: the platform's (by its generation, without walking
    thousands of devices on every call), or the ids of those given as devices=."""
    return ("platform", platform().generation) if given is None else tuple(d.id for d in devices)


class _NestedLog:
    """What the devices of a nested pmap's grid received and returned, for the log: the
    same rows as a top-level pmap's, each inner device numbered within its outer program."""

    def __init__(self, paths, axes, shapes, size):
        self.paths, self.axes, self.shapes, self.size = paths, axes, shapes, size
        self.labels, self.out_axes = [], []

    def outputs(self, out_def):
        self.labels = [f"out{label}" for label in spmd.leaf_labels(out_def)]

    def receive(self, inner, stacks):
        m, pieces = self.size, []
        for stack, ax, path, shape in zip(stacks, self.axes, self.paths, self.shapes):
            if ax is None:
                pieces.append(Piece(stack, lambda k, t=f"{path} whole (in_axes=None)": t))
            else:
                head, tail = f"{path}[{':, ' * ax}", received_from(path, _Shape(shape), ax)
                pieces.append(Piece(stack, lambda k, h=head, t=tail: f"{h}{k % m}{t}"))
        inner.log.receive(inner, pieces)

    def returned(self, inner, stacks, n_outer):
        m = self.size
        for stack, label, ax in zip(stacks, self.labels, self.out_axes):
            if ax is None:
                per_outer = stack.reshape((n_outer, m, -1))
                same = (per_outer == per_outer[:, :1]).all(axis=2)
                for o in np.nonzero(~same.all(axis=1))[0]:
                    _warn_not_replicated([inner.where(o * m + j) for j in np.nonzero(~same[o])[0]],
                                         inner.where(o * m))
                inner.returned(stack, lambda k, t=label + " whole (out_axes=None)": t)
            else:
                inner.returned(stack, lambda k, a=f"{label}[{':, ' * ax}": f"{a}{k % m}]")


class _Shape:
    """Just a shape, for the words of a log row."""

    def __init__(self, shape):
        self.shape, self.ndim = tuple(shape), len(shape)


def _piece(leaf, ax, size, path):
    """Every device's piece of one argument leaf, stacked (or only one device's type, for
    a ShapeDtypeStruct), and its row of the log."""
    if is_shape(leaf):
        whole, aval = leaf, aval_of_shape(leaf)
        stack = None
        if ax is not None:
            aval = aval.update(shape=aval.shape[:ax] + aval.shape[ax + 1:])
    else:
        whole, aval = as_array(leaf), None
        stack = (np.broadcast_to(whole, (size,) + whole.shape) if ax is None
                 else np.moveaxis(whole, ax, 0))
    if ax is None:
        return Piece(stack, lambda i, t=f"{path} whole (in_axes=None)": t, aval=aval)
    head, tail = f"{path}[{':, ' * ax}", received_from(path, whole, ax)
    return Piece(stack, lambda i: f"{head}{i}{tail}", aval=aval)


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
