"""``simpmd.pmap``: split the arguments, run the body over every device, stack the results.

The body runs once, over every device's shard stacked along a device axis, as JAX
traces a mapped function once (``batching.py``); with ``eager=True``, or when a pmap is
nested inside it, it runs as one program per device (``runtime.py``).

Mirrors ``jax.pmap``: ``in_axes``/``out_axes`` as an int, ``None`` (broadcast /
replicated) or a pytree prefix, ``static_broadcasted_argnums``, ``devices=`` and
``axis_size``. A pmap called inside a mapped function is *nested*: it maps a second axis
over a sub-grid of devices (devices are numbered row-major over the grid), with the
original JAX semantics that today's JAX no longer runs.
"""
from __future__ import annotations

import functools
import inspect
import sys
import warnings

import numpy as np

from .devices import device_count, devices as platform_devices
from . import errors, tree
from .array import Array
from .runtime import (Simulation, _refuse_non_arrays, current_task, flat_results,
                      user_stacklevel)
from .trace import Trace
from .traced import Traced
from . import batching
from .batching import Batch, Batched, NeedsPerDevice, _Named, run_once

_last_trace = None


def last_trace():
    """The trace of the most recent top-level run of pmap or shard_map (or None)."""
    return _last_trace


def record_trace(trace):
    """Keep ``trace`` as the one :func:`last_trace` returns; returns it."""
    global _last_trace
    _last_trace = trace
    return trace


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


def positional_names(fun) -> list[str]:
    """The names of ``fun``'s positional parameters, for messages about arguments."""
    try:
        params = inspect.signature(fun).parameters.values()
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]


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
                value = leaf.value if type(leaf) is Traced else as_array(leaf)
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
                            f"across devices. Real JAX says only 'IndexError: tuple index out of "
                            f"range' or 'pmap requires at least one argument with a mapped "
                            f"axis' here. To give every device the same value, mark it "
                            f"in_axes=None (e.g. in_axes=(None, 0)); if Python code decides "
                            f"on it (an `if`, a loop count), make it static instead "
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
        if type(parent) is Batch:
            raise NeedsPerDevice()
        if parent is None and "jax" in sys.modules:
            # Inside a real JAX trace (jax.pmap of a nested simpmd program), the inner pmap
            # means jax.vmap with the same axis name: real JAX no longer nests pmap.
            from .jaxcheck import pmap_inside_jax
            result = pmap_inside_jax(self, args, kwargs)
            if result is not NotImplemented:
                return result
        if parent is not None and self.devices is not None:
            raise errors.MappedAxisError(
                "a nested pmap cannot take devices=: its devices are the sub-grid of the "
                "outer pmap's devices (choose them with devices= on the outer pmap)")
        if parent is None:
            device_list = list(self.devices) if self.devices is not None else platform_devices()
            for d in device_list:
                if type(d).__name__ != "SimDevice":
                    raise TypeError(f"devices= must list simpmd.devices(), got {d!r}")
            ids = [d.id for d in device_list]
            repeated = sorted({i for i in ids if ids.count(i) > 1}) if len(set(ids)) < len(ids) else []
            if repeated:
                raise ValueError(
                    f"devices= names device(s) {repeated} more than once; each shard needs a "
                    f"device of its own. Pass distinct devices, e.g. simpmd.devices()[:n].")
            sim = Simulation(device_list, eager=self.eager)
            max_devices = len(device_list)
        else:
            sim = parent.sim
            max_devices = len(sim.device_list)
        static, defs, kw_def, arrays, paths, size = self._split(args, kwargs, max_devices)
        if parent is None and not self.eager and batching.TRACE_ONCE:
            try:
                return self._call_once(device_list, args, defs, kw_def, arrays, paths, size)
            except NeedsPerDevice:
                pass          # a pmap nested in the body: run one program per device instead

        eager = sim.eager
        # Each device's shard of each leaf, made once: it goes to the device's arguments
        # and to the device's 'receive' log line.
        shards = [[[_take(v, ax, i) for v, ax in conv] if conv is not None else None
                   for conv in arrays] for i in range(size)]
        per_device = []
        for i in range(size):
            dev_args = [args[a] if conv is None else
                        tree.unflatten(td, [Traced(x, eager) for x in shards[i][a]])
                        for a, (conv, td) in enumerate(zip(arrays[:-1], defs))]
            kw = tree.unflatten(kw_def, [Traced(x, eager) for x in shards[i][-1]])
            per_device.append((dev_args, kw))

        fun = self.fun
        run_one = (lambda a, k: fun(*a, **k))
        tasks = sim.new_tasks(run_one, per_device, ((self.axis_name, size),), parent)
        received = []                 # (argument, leaf, whole value or None, detail text)
        for a, (conv, leaf_paths) in enumerate(zip(arrays, paths)):
            for k, ((v, ax), path) in enumerate(zip(conv or (), leaf_paths or ())):
                if ax is None:
                    received.append((a, k, v, f"{path} whole (in_axes=None)"))
                else:
                    received.append((a, k, None, (f"{path}[{':, ' * ax}", received_from(path, v, ax))))
        for i, t in enumerate(tasks):
            for a, k, whole, detail in received:
                if whole is None:
                    sim.log(t, "receive", inputs=(shards[i][a][k],), detail=f"{detail[0]}{i}{detail[1]}")
                else:
                    sim.log(t, "receive", inputs=(whole,), detail=detail)

        if parent is None:
            try:
                sim.run(tasks)
            except errors.SimpmdError as exc:
                self.trace = record_trace(exc.trace)
                raise
            outputs = self._stack(sim, tasks, nested=False)
            sim.finalize()
            self.trace = record_trace(Trace(sim.events, eager=eager))
            return outputs
        sim.run_nested(parent, tasks)
        return self._stack(sim, tasks, nested=True)

    # -- tracing once ---------------------------------------------------------------------
    def _call_once(self, device_list, args, defs, kw_def, arrays, paths, size):
        """Run the body one time over every device's shard, stacked (see batching.py)."""
        batch = Batch(device_list, ((self.axis_name, size),))

        def stacked(v, ax):
            return Batched(np.broadcast_to(v, (size,) + v.shape) if ax is None else np.moveaxis(v, ax, 0))
        dev_args = [args[a] if conv is None else tree.unflatten(td, [stacked(v, ax) for v, ax in conv])
                    for a, (conv, td) in enumerate(zip(arrays[:-1], defs))]
        kw = tree.unflatten(kw_def, [stacked(v, ax) for v, ax in arrays[-1]])
        received = []               # (stacked shards or None, whole value, detail(device))
        for conv, leaf_paths in zip(arrays, paths):
            for (v, ax), path in zip(conv or (), leaf_paths or ()):
                if ax is None:
                    received.append((None, v, lambda k, t=f"{path} whole (in_axes=None)": t))
                else:
                    received.append((np.moveaxis(v, ax, 0), None,
                                     lambda k, a=f"{path}[{':, ' * ax}", b=received_from(path, v, ax):
                                     f"{a}{k}{b}"))
        batch.receive(received)
        try:
            result = run_once(batch, self.fun, dev_args, kw)
            outputs = self._stack_once(batch, result)
        except errors.SimpmdError as exc:
            if getattr(exc, "trace", None) is None:
                exc.trace = Trace(batch.events)
            self.trace = record_trace(exc.trace)
            raise
        self.trace = record_trace(Trace(batch.events))
        return outputs

    def _stack_once(self, batch, result):
        """The stacked results as pmap's Arrays, each device's part logged as returned."""
        leaves, treedef = tree.flatten(result)
        _refuse_non_arrays([_Named(batch.where(0))], [(leaves, treedef)], treedef)
        stacks = [v.value if type(v) is Batched else
                  np.broadcast_to(_plain(v), (batch.n,) + np.shape(_plain(v))) for v in leaves]
        out_axes = tree.broadcast_prefix(self.out_axes, tree.unflatten(treedef, [s[0] for s in stacks]),
                                         what="out_axes")
        out = []
        for k, (s, ax) in enumerate(zip(stacks, out_axes)):
            first = s[0]
            if ax is None:
                differ = np.nonzero(~(s == first).reshape(batch.n, -1).all(axis=1))[0]
                if len(differ):
                    _warn_not_replicated([batch.where(i) for i in differ], batch.where(0))
            else:
                if not -(first.ndim + 1) <= ax <= first.ndim:
                    n = first.ndim
                    raise ValueError(
                        f"out_axes={ax} is out of range for result{_leaf_label(treedef, k)} "
                        f"of shape {first.shape} on each device. out_axes says where the "
                        f"mapped axis goes in the stacked result, which has rank {n + 1}, so "
                        f"use an axis in {-(n + 1)}..{n} (0 stacks along the first axis), or "
                        f"None to return one copy of a result that is the same on every device.")
                ax = ax % (first.ndim + 1)
            label = f"out{_leaf_label(treedef, k)}"
            if ax is None:
                batch.returned(s, lambda i, t=label + " whole (out_axes=None)": t)
            else:
                batch.returned(s, lambda i, a=f"{label}[{':, ' * ax}": f"{a}{i}]")
            out.append(Array(s, batch.devices, ax))
        return tree.unflatten(treedef, out)

    # -- stacking -------------------------------------------------------------------------
    def _stack(self, sim, tasks, nested):
        results, treedef = flat_results(tasks)
        out_axes = tree.broadcast_prefix(self.out_axes, tree.unflatten(treedef, results[0][0]),
                                         what="out_axes")
        leaves = []
        devices = [t.device for t in tasks]
        for k, ax in enumerate(out_axes):
            values = [_plain(r[0][k]) for r in results]
            shapes = {(v.shape, v.dtype) for v in values}
            if len(shapes) > 1 and ax is not None:
                odd, v = next((t, v) for t, v in zip(tasks, values)
                              if (v.shape, v.dtype) != (values[0].shape, values[0].dtype))
                raise errors.DivergenceError(
                    f"result{_leaf_label(treedef, k)} has shape {values[0].shape} "
                    f"{values[0].dtype} on {tasks[0].where()} but shape {v.shape} {v.dtype} "
                    f"on {odd.where()}; every device must return the same shapes and dtypes "
                    f"to be stacked (JAX compiles one program for all of them). Pad or slice "
                    f"to a shape every device shares, and mask the unused part.")
            if ax is None:
                differ = [t.where() for t, v in zip(tasks[1:], values[1:]) if v is not values[0]
                          and (v.shape != values[0].shape or not np.array_equal(v, values[0]))]
                if differ:
                    _warn_not_replicated(differ, tasks[0].where())
            else:
                if not -(values[0].ndim + 1) <= ax <= values[0].ndim:
                    n = values[0].ndim
                    raise ValueError(
                        f"out_axes={ax} is out of range for result{_leaf_label(treedef, k)} "
                        f"of shape {values[0].shape} on each device. out_axes says where the "
                        f"mapped axis goes in the stacked result, which has rank {n + 1}, so "
                        f"use an axis in {-(n + 1)}..{n} (0 stacks along the first axis), or "
                        f"None to return one copy of a result that is the same on every device.")
                ax = ax % (values[0].ndim + 1)
            label = f"out{_leaf_label(treedef, k)}"
            for i, (t, v) in enumerate(zip(tasks, values)):
                where = " whole (out_axes=None)" if ax is None else f"[{':, ' * ax}{i}]"
                sim.log(t, "return", outputs=(v,), detail=label + where)
            if nested:
                stacked = values[0] if ax is None else np.stack(values, axis=ax)
                leaves.append(Traced(stacked, sim.eager))
            else:
                leaves.append(Array(values, devices, ax, _grid_layout(tasks, values, ax)))
        return tree.unflatten(treedef, leaves)


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


def _grid_layout(tasks, values, ax):
    """Where the shards of a nested pmap's result live: every device of the grid.

    Row ``i`` of the outer result was computed by the devices of outer program ``i``.
    When its leading axis is the inner mapped axis (the inner pmap's own result), block
    ``(i, j)`` lives on inner device ``j``; otherwise each of them holds a copy of row ``i``.
    Returns None for a pmap that is not nested.
    """
    if not any(t.children for t in tasks):
        return None
    layout = []
    for i, (t, v) in enumerate(zip(tasks, values)):
        outer = (slice(None),) * (ax or 0) + (slice(i, i + 1),)
        rest = (slice(None),) * max(v.ndim - 1, 0)
        split = ax == 0 and v.ndim >= 1 and v.shape[0] == len(t.children)
        for j, child in enumerate(t.children):
            if ax is None:
                layout.append((child.device, (slice(None),) * v.ndim, i * len(t.children) + j))
            elif split:
                layout.append((child.device, outer + (slice(j, j + 1),) + rest, 0))
            else:
                layout.append((child.device, outer + (slice(None),) * v.ndim, j))
    return layout


def _leaf_label(treedef, k):
    if treedef.kind == "leaf":
        return ""
    dummy = tree.unflatten(treedef, list(range(treedef.num_leaves)))
    return tree.leaf_paths(dummy)[k]


def _take(value, axis, i):
    if axis is None:
        return value
    return value[(slice(None),) * axis + (i,)]


def _plain(x):
    if type(x) is Traced:
        return x.value
    return as_array(x)


def as_array(x):
    """A NumPy array for ``x``; Python numbers get JAX's default 32-bit dtypes.

    JAX (without x64) turns a Python float into float32 and an int into int32, while
    NumPy would pick 64 bits; arrays keep their own dtype.
    """
    if isinstance(x, (np.generic, np.ndarray)):
        return np.asarray(x)
    if isinstance(x, bool):
        return np.asarray(x, dtype=bool)
    if isinstance(x, int):
        return np.asarray(x, dtype=np.int32)
    if isinstance(x, float):
        return np.asarray(x, dtype=np.float32)
    if isinstance(x, complex):
        return np.asarray(x, dtype=np.complex64)
    return np.asarray(x)
