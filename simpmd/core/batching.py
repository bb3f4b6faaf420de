"""Trace once, as JAX does: the body runs a single time over values stacked by device.

Outside eager mode, Python control flow on device values is refused (see ``traced.py``),
so every device runs the same operations in the same order. simpmd therefore calls the
mapped function once, on :class:`StackedValue` values: each holds every device's value in one
NumPy array whose leading axis runs over the devices (row-major over the mesh). An
operation on a StackedValue value acts on all devices at once, with a batching rule in the
manner of ``jax.vmap`` (shift the axis arguments by one, line up the ranks); where no
rule exists it loops over the devices, so the answer is always right and only slower. A
collective is one NumPy call over the whole stack (``collectives.STACKED``). The
per-device log is written from the stacked values when someone reads it.

A Python side effect in the body (a print, a counter) therefore happens when the body
is traced, once per signature (later calls interpret the cached program, ``program.py``),
as under ``jax.pmap``; ``simpmd.debug.print`` prints once per device, as
``jax.debug.print`` does. ``eager=True`` keeps running one program per device
(``simpmd/eager/scheduler.py``), for programs that depend on the device in Python.
"""
from __future__ import annotations

import builtins
import contextlib
import functools
import math
from collections.abc import Sequence

import numpy as np

from . import collectives, context, errors, program, tree
from .trace import Event, current_phase
from .traced import (DeviceValue, _OPERATOR_UFUNCS, _jax_promotion, _no_new_float64, defers_to,
                     reduction_dtype,
                     install_operators, numpy_function_refused)


TRACE_ONCE = True        # False: every call runs one program per device (simpmd.eager), as eager does


# -- the stacked value ---------------------------------------------------------------------


class StackedValue(DeviceValue):
    """Every device's value of one array in the body, stacked along a leading device axis.

    It shows the shape of one device's value (``x.shape``), computes like a NumPy array
    and refuses what JAX refuses while tracing, exactly as :class:`DeviceValue` does.
    """

    __slots__ = ("_stack",)
    stacked_by_device = True          # how program.py recognises it

    def __init__(self, stacked):
        self._stack, self.eager = stacked, False

    @property
    def value(self):
        """The stack, one row per device of the grid now running. A value that the body of
        an inner (nested) pmap closes over from the outer body has a row per outer device;
        every inner device below an outer one sees that outer device's row, as in JAX. (An
        inner pmap's result, read back in the outer body, has more rows, and is left alone.)"""
        stack = self._stack
        task = getattr(context._local, "task", None)
        if type(task) is StackedRun and stack.shape[0] < task.n and task.outer is not None:
            return np.repeat(stack, task.n // stack.shape[0], axis=0)
        return stack

    def _with(self, stacked):
        return StackedValue(stacked)

    shape = property(lambda self: self.value.shape[1:])
    ndim = property(lambda self: self.value.ndim - 1)
    size = property(lambda self: math.prod(self.value.shape[1:]))
    dtype = property(lambda self: self.value.dtype)
    T = property(lambda self: self.transpose())

    # Operators compute through the batching rules (apply_ufunc); a NumPy function called
    # on a device value directly is refused, as on DeviceValue (and as JAX refuses it on a
    # tracer): simpmd.numpy reaches apply_ufunc / apply_function instead.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(defers_to(x) for x in inputs):
            return NotImplemented       # simpmd.grad's GradValue computes it on the whole value
        if (method == "__call__" and ufunc in _OPERATOR_UFUNCS and len(inputs) == 2
                and not isinstance(inputs[0], DeviceValue)):
            return apply_ufunc(ufunc, inputs, kwargs)     # ndarray + x: JAX allows it
        raise numpy_function_refused(f"np.{ufunc.__name__}", inputs)

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        if name in METHOD_RULES:
            return functools.partial(call_method, name, self)
        attr = getattr(self.value[0], name)
        if not callable(attr):
            return call_method(name, self) if name in ("real", "imag") else attr
        return functools.partial(call_method, name, self)

    def __len__(self):
        if self.ndim == 0:
            raise TypeError("len() of a 0-d array (a scalar): it has no length")
        return self.shape[0]

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    def __getitem__(self, index):
        return getitem(self, index if isinstance(index, tuple) else (index,))

    @property
    def at(self):
        return _BatchedUpdate(self)

    def __repr__(self):
        return f"Traced<{self.dtype}{list(self.shape)}> on {self.value.shape[0]} devices"

    __str__ = __repr__

    def __format__(self, spec):
        return format(str(self), spec)


def _describe_ufunc(ufunc, inputs, kwargs, method="__call__"):
    if ufunc is np.matmul:
        return "dot_general", {"dimension_numbers": _matmul_dimensions(*inputs)}
    name = program.UFUNC_PRIMITIVES.get(ufunc.__name__, ufunc.__name__)
    return (name if method == "__call__" else f"{name}.{method}"), {}


@program.operation(_describe_ufunc)
def apply_ufunc(ufunc, inputs, kwargs, method="__call__"):
    """NumPy's ``ufunc`` on every device at once, with JAX's dtypes (the batching rule of
    an elementwise function: line the ranks up, then one NumPy call)."""
    if kwargs.get("out") is not None:
        raise TypeError(
            f"np.{ufunc.__name__}(..., out=...) writes into an array in place; JAX arrays "
            "are immutable. Use the returned value instead.")
    if method != "__call__" or kwargs:
        return per_device(getattr(ufunc, method), inputs, kwargs)
    if _same_everywhere(inputs):      # e.g. a psum's result: compute it once, share it
        out = apply_ufunc(ufunc, tuple(StackedValue(v.value[:1]) if type(v) is StackedValue else v
                                       for v in inputs), {})
        return _broadcast(out, _n_of(inputs))
    if ufunc is np.matmul:
        return _matmul(*inputs)
    values = _lined_up(inputs)
    if len(values) > 1:
        values = _jax_promotion(values)
    return _batched(_no_new_float64(ufunc(*values), values))


install_operators(StackedValue, apply_ufunc)


def _describe_function(func, args, kwargs):
    name = getattr(func, "__name__", str(func))
    if name in METHOD_PRIMITIVES:
        return _describe_method(name, *args, **kwargs)
    elementwise = name in ("where", "clip") or isinstance(func, np.ufunc)
    return program.FUNCTION_PRIMITIVES.get(name, name), ({} if elementwise else {"_settings": True})


@program.operation(_describe_function)
def apply_function(func, args, kwargs):
    """The NumPy function ``func`` on every device: its batching rule, or a loop."""
    rule = FUNCTION_RULES.get(func)
    if rule is not None:
        out = rule(*args, **kwargs)
        if out is not NotImplemented:
            return out
    return per_device(func, args, kwargs)


def _same_everywhere(inputs) -> bool:
    """True when every stacked input holds one value for all devices (a stride-0 device
    axis: a broadcast argument, a psum's result), so the result is the same everywhere too."""
    stacked = [v.value for v in inputs if type(v) is StackedValue]
    return all(s.strides[0] == 0 and s.shape[0] > 1 for s in stacked)


def _broadcast(out, n):
    if type(out) is StackedValue:
        return StackedValue(np.broadcast_to(out.value, (n,) + out.value.shape[1:]))
    if isinstance(out, tuple):
        return tuple(_broadcast(o, n) for o in out)
    return out


def _is_basic(i) -> bool:
    return i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))


def _n_of(values) -> int:
    for v in values:
        if type(v) is StackedValue:
            return v.value.shape[0]
        if isinstance(v, (list, tuple)):
            n = _n_of(v)
            if n:
                return n
        if isinstance(v, dict):
            n = _n_of(tuple(v.values()))
            if n:
                return n
    return 0


def _lined_up(inputs):
    """The NumPy values of ``inputs`` for an elementwise call: a StackedValue value of lower
    rank gets length-1 axes after its device axis, so NumPy broadcasts each device's
    value against the others as it would on that device alone."""
    rank = max(np.ndim(v.value) - 1 if type(v) is StackedValue else np.ndim(_value(v)) for v in inputs)
    out = []
    for v in inputs:
        if type(v) is StackedValue:
            s = v.value
            if s.ndim - 1 < rank:
                s = s.reshape(s.shape[:1] + (1,) * (rank - s.ndim + 1) + s.shape[1:])
            out.append(s)
        else:
            out.append(_value(v))
    return tuple(out)


def _value(v):
    return v.value if isinstance(v, DeviceValue) else v


def _batched(x):
    if isinstance(x, np.ndarray):
        return StackedValue(x)
    if isinstance(x, tuple):
        return tuple(_batched(i) for i in x)
    return x


def at_device(x, i):
    """``x`` as device ``i`` sees it (recursing into lists, tuples and dicts)."""
    if type(x) is StackedValue:
        return x.value[i]
    if type(x) is DeviceValue:
        return x.value
    if isinstance(x, (list, tuple)):
        items = [at_device(v, i) for v in x]
        return type(x)(items) if type(x) in (list, tuple) else type(x)(*items)
    if isinstance(x, dict):
        return {k: at_device(v, i) for k, v in x.items()}
    return x


def _stack(results):
    """The per-device ``results`` of one call as one value: arrays stacked, static facts
    (a shape, a dimension count) kept as they are."""
    first = results[0]
    if isinstance(first, (np.ndarray, np.generic, DeviceValue)):
        values = [np.asarray(_value(r)) for r in results]
        shapes = {v.shape for v in values}
        if len(shapes) > 1:
            raise errors.DivergenceError(
                f"an operation gave results of different shapes on different devices "
                f"({', '.join(map(str, sorted(shapes)))}). A traced body gives every device the "
                f"same shapes, so real JAX refuses this too (a boolean mask such as x[x > 0] "
                f"raises NonConcreteBooleanIndexError). Keep the shape fixed, e.g. "
                f"snp.where(x > 0, x, 0), or run with eager=True.")
        return StackedValue(np.stack(values))
    if isinstance(first, (list, tuple)):
        parts = [_stack([r[k] for r in results]) for k in range(len(first))]
        return type(first)(parts) if type(first) in (list, tuple) else type(first)(*parts)
    return first


def per_device(fn, args, kwargs):
    """The fallback with no batching rule: call ``fn`` once per device and stack."""
    n = _n_of(args) or _n_of(tuple(kwargs.values()))
    return _stack([fn(*at_device(args, i), **at_device(kwargs, i)) for i in range(n)])


# -- batching rules: methods -----------------------------------------------------------------


def _shift(axis, ndim):
    """A per-device axis (int or tuple) as an axis of the stack."""
    if isinstance(axis, (tuple, list)):
        return tuple(_shift(a, ndim) for a in axis)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(axis, ndim)
    return axis % max(ndim, 1) + 1


def _reduction(name):
    def rule(x, axis=None, *args, **kwargs):
        if args or kwargs.get("out") is not None:
            return per_device(lambda v, *a, **k: getattr(v, name)(*a, **k),
                              (x, axis) + args, kwargs)
        v = x.value
        dtype = reduction_dtype(name, v.dtype, kwargs)
        if dtype is not None:
            kwargs = dict(kwargs, dtype=dtype)
        if axis is None and name in ("argmax", "argmin", "cumsum", "cumprod"):
            v, stack_axis = v.reshape(v.shape[0], -1), 1
        elif axis is None:
            stack_axis = tuple(range(1, v.ndim))
        else:
            stack_axis = _shift(axis, x.ndim)
        return StackedValue(np.asarray(getattr(v, name)(axis=stack_axis, **kwargs)))
    return rule


def _reshape(x, *shape, **kwargs):
    if kwargs:
        return per_device(lambda v: v.reshape(*shape, **kwargs), (x,), {})
    shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    return StackedValue(x.value.reshape(x.value.shape[:1] + shape))


def _transpose(x, *axes):
    axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)) else axes
    if axes is None or axes == ():
        axes = tuple(reversed(range(x.ndim)))
    return StackedValue(x.value.transpose((0,) + _shift(tuple(axes), x.ndim)))


def _squeeze(x, axis=None):
    if axis is None:
        return StackedValue(x.value.reshape(x.value.shape[:1] + tuple(s for s in x.shape if s != 1)))
    return StackedValue(x.value.squeeze(_shift(axis, x.ndim)))


def _axes_param(x, axis):
    ndim = x.ndim if hasattr(x, "ndim") else 0
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(int(a) % max(ndim, 1) for a in axes))


METHOD_PRIMITIVES = {"sum": "reduce_sum", "max": "reduce_max", "min": "reduce_min",
                     "prod": "reduce_prod", "any": "reduce_or", "all": "reduce_and",
                     "amax": "reduce_max", "amin": "reduce_min", "argmax": "argmax",
                     "argmin": "argmin", "cumsum": "cumsum", "cumprod": "cumprod",
                     "mean": "mean", "std": "std", "var": "var", "reshape": "reshape",
                     "transpose": "transpose", "squeeze": "squeeze", "astype":
                     "convert_element_type", "swapaxes": "transpose", "ravel": "reshape",
                     "flatten": "reshape", "copy": "copy", "real": "real", "imag": "imag",
                     "conj": "conj", "round": "round", "clip": "clamp"}


def _describe_method(name, x, *args, **kwargs):
    primitive = METHOD_PRIMITIVES.get(name, name)
    if primitive.startswith("reduce_") or name in ("argmax", "argmin", "mean", "std", "var"):
        axes = _axes_param(x, kwargs.get("axis", args[0] if args else None))
        if name == "mean":
            return primitive, {"axes": axes, "_divisor": math.prod(x.shape[a] for a in axes)}
        return primitive, {"axes": axes}
    if name == "transpose":
        axes = args[0] if len(args) == 1 and not isinstance(args[0], (int, np.integer)) else args
        axes = tuple(reversed(range(x.ndim))) if axes in (None, ()) else tuple(
            int(a) % x.ndim for a in axes)
        return primitive, {"permutation": axes}
    if name == "squeeze":
        axis = kwargs.get("axis", args[0] if args else None)
        dims = [d for d, s in enumerate(x.shape) if s == 1] if axis is None else _axes_param(x, axis)
        return primitive, {"dimensions": tuple(dims)}
    if name in ("cumsum", "cumprod"):
        return primitive, {"axis": kwargs.get("axis", args[0] if args else None)}
    if name == "astype":
        return primitive, {"new_dtype": np.dtype(kwargs.get("dtype", args[0] if args else None))}
    return primitive, {}


@program.operation(_describe_method, data_constants=False)
def call_method(name, x, *args, **kwargs):
    """``x.name(*args, **kwargs)`` on every device: its batching rule, or a loop."""
    rule = METHOD_RULES.get(name)
    if rule is not None:
        return rule(x, *args, **kwargs)
    if name in ("real", "imag"):
        return StackedValue(getattr(x.value, name))
    return per_device(lambda v, *a, **k: getattr(v, name)(*a, **k), (x,) + args, kwargs)


def _describe_index(x, index):
    if all(_is_basic(i) for i in index):
        return "slice", {}
    return "gather", {}


@program.operation(_describe_index, data_constants=False)
def getitem(x, index):
    """``x[index]`` on every device (one NumPy indexing of the stack where it can be)."""
    if not any(isinstance(i, DeviceValue) for i in index):
        arrays = [k for k, i in enumerate(index) if not _is_basic(i)]
        if not arrays or arrays == list(range(arrays[0], arrays[-1] + 1)):
            return StackedValue(x.value[(slice(None),) + index])
    return per_device(lambda v, *i: v[i], (x,) + index, {})


@program.operation(lambda x, *a, **k: ("convert_element_type",
                                       {"new_dtype": np.dtype(k.get("dtype", a[0] if a else x.dtype))}))
def as_device_value(x, *args, **kwargs):
    """``snp.asarray(x, dtype)`` of a stacked value: still a device value, converted."""
    return StackedValue(np.asarray(x.value, *args, **kwargs))


METHOD_RULES = {name: _reduction(name) for name in (
    "sum", "mean", "max", "min", "prod", "std", "var", "any", "all", "argmax", "argmin",
    "cumsum", "cumprod")}
METHOD_RULES.update(
    reshape=_reshape, transpose=_transpose, squeeze=_squeeze,
    astype=lambda x, *a, **k: StackedValue(x.value.astype(*a, **k)),
    copy=lambda x: StackedValue(x.value.copy()),
    flatten=lambda x: StackedValue(x.value.reshape(x.value.shape[0], -1)),
    ravel=lambda x: StackedValue(x.value.reshape(x.value.shape[0], -1)),
    swapaxes=lambda x, a, b: StackedValue(x.value.swapaxes(_shift(a, x.ndim), _shift(b, x.ndim))),
    clip=lambda x, *a, **k: apply_function(np.clip, (x,) + a, k),
    round=lambda x, decimals=0: StackedValue(np.round(x.value, decimals)),
    conj=lambda x: apply_ufunc(np.conjugate, (x,), {}),
)


# -- batching rules: NumPy functions ---------------------------------------------------------


def _elementwise(func):
    def rule(*args, **kwargs):
        if kwargs.get("out") is not None:
            return NotImplemented
        return _batched(func(*_lined_up(args), **kwargs))
    return rule


def _method_of(name):
    def rule(a, *args, **kwargs):
        if type(a) is not StackedValue:
            return NotImplemented
        return METHOD_RULES[name](a, *args, **kwargs)
    return rule


def _joined(func):
    """np.concatenate / np.stack: every operand stacked by device, the axis shifted."""
    def rule(arrays, axis=0, **kwargs):
        if kwargs or axis is None or not isinstance(arrays, (list, tuple)):
            return NotImplemented
        n = _n_of(arrays)
        parts = [a.value if type(a) is StackedValue else
                 np.broadcast_to(np.asarray(_value(a)), (n,) + np.shape(_value(a))) for a in arrays]
        ndim = parts[0].ndim - 1 + (func is np.stack)
        return StackedValue(func(parts, axis=_shift(axis, ndim)))
    return rule


def _matmul_dimensions(a, b):
    """dot_general's ((lhs contracting, rhs contracting), (lhs batch, rhs batch)) for a @ b."""
    na, nb = np.ndim(a) if type(a) is not StackedValue else a.ndim, np.ndim(b) if type(b) is not StackedValue else b.ndim
    if na == 1 or nb == 1:
        return (([na - 1], [0 if nb == 1 else nb - 2]), ([], []))
    batch = list(range(min(na, nb) - 2)) if na == nb else []
    return (([na - 1], [nb - 2]), (batch, batch))


def _matmul(a, b):
    """Matrix product per device; a 1-D operand keeps NumPy's vector meaning."""
    x, y = _value(a), _value(b)
    a_vec = type(a) is StackedValue and a.ndim == 1
    b_vec = type(b) is StackedValue and b.ndim == 1
    if a_vec:
        x = x[:, None, :]
    if b_vec:
        y = y[:, :, None]
    if type(a) is StackedValue and type(b) is StackedValue and x.ndim != y.ndim:
        lo = min(x, y, key=np.ndim)
        pad = lo.reshape(lo.shape[:1] + (1,) * abs(x.ndim - y.ndim) + lo.shape[1:])
        x, y = (pad, y) if lo is x else (x, pad)
    values = _jax_promotion((x, y))
    out = np.matmul(*values)
    if b_vec:
        out = out[..., 0]
    if a_vec:
        out = out[..., 0] if b_vec else out[..., 0, :]
    return StackedValue(_no_new_float64(out, values))


def _broadcast_to(x, shape, **kwargs):
    """np.broadcast_to per device: line the ranks up after the device axis, then broadcast."""
    if type(x) is not StackedValue or kwargs:
        return NotImplemented
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    v = x.value
    v = v.reshape(v.shape[:1] + (1,) * (len(shape) - x.ndim) + v.shape[1:])
    return StackedValue(np.broadcast_to(v, v.shape[:1] + shape))


FUNCTION_RULES = {getattr(np, name): _method_of(name) for name in (
    "sum", "mean", "max", "min", "prod", "std", "var", "any", "all", "argmax", "argmin",
    "cumsum", "cumprod", "reshape", "transpose", "squeeze", "swapaxes")}
def _like(func):
    """np.zeros_like(x) and friends: the same call on the stack keeps the device axis."""
    def rule(a, *args, **kwargs):
        if type(a) is not StackedValue or kwargs.get("shape") is not None or len(args) > 2:
            return NotImplemented
        return StackedValue(func(a.value, *args, **kwargs))
    return rule


FUNCTION_RULES.update({np.zeros_like: _like(np.zeros_like), np.ones_like: _like(np.ones_like),
                       np.full_like: _like(np.full_like)})
FUNCTION_RULES.update({np.amax: _method_of("max"), np.amin: _method_of("min"),
                       np.where: _elementwise(np.where), np.clip: _elementwise(np.clip),
                       np.round: _elementwise(np.round),
                       np.concatenate: _joined(np.concatenate), np.stack: _joined(np.stack),
                       np.broadcast_to: _broadcast_to})


class _BatchedUpdate:
    """``x.at[idx].set(v)`` and friends on every device at once."""

    def __init__(self, x):
        self.x = x

    def __getitem__(self, index):
        return _BatchedUpdateRef(self.x, index if isinstance(index, tuple) else (index,))


class _BatchedUpdateRef:
    def __init__(self, x, index):
        self.x, self.index = x, index

    def _apply(self, ufunc, v):
        return _update(self.x, self.index, ufunc, v)

    def get(self):
        return self.x[self.index]

    def set(self, v): return self._apply(None, v)
    def add(self, v): return self._apply(np.add, v)
    def multiply(self, v): return self._apply(np.multiply, v)
    def min(self, v): return self._apply(np.minimum, v)
    def max(self, v): return self._apply(np.maximum, v)


@program.operation(lambda x, index, ufunc, v: (
    "scatter" if ufunc is None else f"scatter_{program.UFUNC_PRIMITIVES.get(ufunc.__name__, ufunc.__name__)}", {}))
def _update(x, index, ufunc, v):
    """``x.at[index].set(v)`` (``ufunc`` None) or ``.add``/``.multiply``/... on every device."""
    if all(_is_basic(i) for i in index):
        out = np.array(x.value, copy=True)
        where = (slice(None),) + index
        region = out[where]
        if type(v) is StackedValue:
            pad = region.ndim - v.value.ndim
            v = v.value.reshape(v.value.shape[:1] + (1,) * pad + v.value.shape[1:])
        else:
            v = np.asarray(_value(v))
        out[where] = v if ufunc is None else ufunc(region, v)
        return StackedValue(out)

    def one(value, v, *index):
        value = np.array(value, copy=True)
        if ufunc is None:
            value[index] = v
        else:
            ufunc.at(value, index, v)
        return value
    return per_device(one, (x, v) + index, {})


# -- lax.cond / lax.switch -----------------------------------------------------------------


def switch(batch, index, branches, operands, what):
    """``lax.switch`` in a body traced once: every branch is traced (as JAX traces them),
    each device's own branch is the one it runs, and the results are chosen per device.
    While a branch runs, its collectives run only for the devices that take it."""
    source, code = context.caller_source()
    last = len(branches) - 1
    if type(index) is StackedValue:
        if index.shape != ():
            raise TypeError(
                f"lax.{what}'s {'predicate' if what == 'cond' else 'index'} must be a scalar on "
                f"each device, got shape {index.shape}. Reduce it first (e.g. x.sum() > 0), or "
                f"choose elementwise with snp.where.")
        chosen = apply_ufunc(np.clip, (index.astype(np.int32), 0, last), {})
        masks = [chosen == k for k in range(len(branches))]
    else:
        k = int(np.clip(int(np.asarray(_value(index))), 0, last))
        masks = [np.full(batch.n, j == k) for j in range(len(branches))]
    results = []
    for k, branch in enumerate(branches):
        _enter_branch(masks[k], (what, k, source, code))
        try:
            results.append(branch(*operands))
        finally:
            _leave_branch()
    flat = [tree.flatten(r) for r in results]
    for k, (leaves, treedef) in enumerate(flat[1:], 1):
        if treedef != flat[0][1]:
            raise errors.BranchError(
                f"lax.{what}'s branches return different structures: {flat[0][1]} and "
                f"{treedef}. Every branch must return the same pytree of arrays, with the same "
                f"shapes and dtypes (JAX compiles both).")
        for a, b in zip(flat[0][0], leaves):
            sa, sb = (np.shape(_value(a)) if type(a) is not StackedValue else a.shape,
                      np.shape(_value(b)) if type(b) is not StackedValue else b.shape)
            if sa != sb:
                raise errors.BranchError(
                    f"lax.{what}'s branches return arrays of different shapes, {sa} and {sb}. "
                    f"Every branch must return the same shapes and dtypes (JAX compiles both); "
                    f"pad or reshape one of them.")
    chosen = list(flat[0][0])
    for k in range(1, len(branches)):
        mask = masks[k]
        chosen = [_choose(mask, b, a) for a, b in zip(chosen, flat[k][0])]
    return tree.unflatten(flat[0][1], chosen)


def _choose(mask, yes, no):
    """``yes`` on the devices where ``mask`` holds, ``no`` elsewhere."""
    if defers_to(yes) or defers_to(no):            # simpmd.grad's values: its own rule
        return np.where(mask, yes, no)
    mask = mask if type(mask) is StackedValue else StackedValue(np.asarray(mask))
    return apply_function(np.where, (mask, yes, no), {})


@program.operation(lambda mask, label: ("cond_branch", {"branch": label[1]}), data_constants=False)
def _enter_branch(mask, label):
    taking = np.asarray(mask.value if type(mask) is StackedValue else mask, dtype=bool).reshape(-1)
    context.current_task().branches.append((taking, label))


@program.operation(lambda: ("cond_branch_end", {}))
def _leave_branch():
    context.current_task().branches.pop()


# -- the program that stands for every device ------------------------------------------------


class StackedRun:
    """One trace-once run over a grid of devices: what ``simpmd.lax`` calls into, and the
    run's log, kept as stacked records until it is read.

    ``axes`` is ``((name, size), ...)``; device ``k`` of the grid (row-major) is
    ``devices[k]``. A pmap called inside the body makes an *inner* batch (:meth:`nest`):
    its grid has the outer axes and the inner one, the way a nested pmap is a 2-D mesh,
    and it writes into the same log.
    """

    eager = False

    def __init__(self, devices, axes, maps_a_mesh=False, outer=None):
        self.axes = tuple(axes)
        self.n = math.prod(s for _, s in self.axes)
        self.all_devices = list(devices)        # an inner pmap's grid may use more of them
        self.devices = self.all_devices[:self.n]
        self.grid = np.arange(self.n).reshape([s for _, s in self.axes])
        self._coords = {}
        self.maps_a_mesh = maps_a_mesh        # a shard_map's run (for error messages)
        # Inside lax.cond / lax.switch: (devices taking the branch, what to call it), innermost last
        self.branches: list = []
        # shard_map(check_vma=True) sets these: id(body input) -> (input, mesh axes it varies over)
        self.check_vma, self.input_vma = False, {}
        self.out_types = None       # [(vma, var)] of each result leaf, once typed
        # Nesting: ``outer`` is the batch whose body called this one's pmap; ``inner`` the
        # size of the grid a pmap in this body adds below each of its devices, and
        # ``inner_batch`` that pmap's batch.
        self.outer, self.inner, self.inner_batch = outer, 0, None
        self.root = self if outer is None else outer.root
        if outer is None:
            self.records: list = []       # (batch, 'kind', step, ...) in the order they happened
            self.step = self.calls = 0
            self.prints: list = []

    def nest(self, inner_axes) -> "StackedRun":
        """The batch of a pmap called inside this body: this grid with ``inner_axes`` below."""
        size = math.prod(s for _, s in inner_axes)
        if self.inner and self.inner != size:
            raise errors.MappedAxisError(
                f"two pmaps nested in one body map different sizes ({self.inner} and {size}); "
                f"simpmd lays a nested pmap out as a grid of devices, so an outer body's "
                f"inner pmaps must map the same size.")
        if self.n * size > len(self.all_devices):
            shape = " x ".join(f"{n}={s}" for n, s in self.axes + tuple(inner_axes))
            raise errors.MappedAxisError(
                f"nested pmap needs a grid of {shape} = {self.n * size} devices, but only "
                f"{len(self.all_devices)} are available. Call "
                f"simpmd.set_device_count({self.n * size}) or map smaller sizes.")
        self.inner = size
        self.inner_batch = StackedRun(self.all_devices, self.axes + tuple(inner_axes),
                                 self.maps_a_mesh, self)
        return self.inner_batch

    # -- naming devices --------------------------------------------------------------------
    @property
    def nested(self) -> bool:
        """True for an inner pmap's batch (its results go back into the outer body)."""
        return self.outer is not None

    @property
    def outer_n(self) -> int:
        """How many outer programs this grid's devices are split among (1 unless nested)."""
        return 1 if self.outer is None else self.outer.n

    @property
    def coords(self) -> tuple:
        """The first device's coordinates (error messages list the axes in scope)."""
        return self.coords_of(0)

    def coords_of(self, k) -> tuple:
        """((axis name, index, size), ...) of device ``k``."""
        found = self._coords.get(k)
        if found is None:                 # row-major over the grid, made when first asked
            index, rest = [], k
            for _, size in reversed(self.axes):
                rest, i = divmod(rest, size)
                index.append(i)
            found = self._coords[k] = tuple((name, i, size) for (name, size), i
                                            in zip(self.axes, reversed(index)))
        return found

    def sub_devices(self, k) -> list:
        """The devices of program ``k``'s inner grid (none unless a pmap nests inside)."""
        return self.all_devices[k * self.inner:(k + 1) * self.inner]

    def sub_grids(self):
        """Every program's inner devices, or None when no pmap nests inside."""
        return [self.sub_devices(k) for k in range(self.n)] if self.inner else None

    def label(self, k) -> str:
        """How the log names program ``k``: 'device 3', or 'i=1' for an outer body."""
        if self.inner:
            return context.coords_text(self.coords_of(k))
        return f"device {self.devices[k].id}"

    def where(self, k=0) -> str:
        """How error messages name device ``k``: 'device 3 (i=3)'. The body runs once for
        every device, so an error raised while tracing is reported on the first one."""
        coords = context.coords_text(self.coords_of(k))
        if self.inner:
            deepest = self
            while deepest.inner:
                deepest = deepest.inner_batch
            inner = ", ".join(f"{'index' if n is None else n}=0..{s - 1}"
                              for n, s in deepest.axes[len(self.axes):])
            return (f"the outer body at {coords} (devices {errors.id_ranges(self.leaf_ids(k))} "
                    f"at {inner})")
        return f"device {self.devices[k].id} ({coords})"

    def leaf_ids(self, k) -> list:
        """The ids of the devices that run program ``k``, inner grids included."""
        if not self.inner:
            return [self.devices[k].id]
        return [i for j in range(k * self.inner, (k + 1) * self.inner)
                for i in self.inner_batch.leaf_ids(j)]

    @contextlib.contextmanager
    def running(self):
        """Make this the program ``simpmd.lax`` sees while the body runs."""
        previous = context.current_task()
        context._local.task = self
        log = self.root
        try:
            yield self
        finally:
            context._local.task = previous
            if log is self:          # an inner pmap's lines wait for the outer body's
                for line in log.prints:
                    builtins.print(line)
                log.prints = []

    # -- what simpmd.lax asks (eager's Task answers them per device) ---------
    eager = False
    stacked = True                        # one body over every device's value at once

    def axis_size(self, axis_names, opname):
        return context.axis_position(self.coords_of(0), axis_names, opname, self.where(0),
                                      self.maps_a_mesh)[1]

    def axis_index(self, axis_names):
        """``lax.axis_index``: each device's position along ``axis_names``."""
        out = StackedValue(self.positions(axis_names))
        if program.recording() is not None:
            program.record("axis_index", {"axis_name": axis_names if len(axis_names) > 1
                                          else axis_names[0]},
                           functools.partial(replay_axis_index, axis_names), (), out)
        return out

    def positions(self, axis_names, opname="axis_index"):
        """Each device's position along ``axis_names`` (row-major over the names)."""
        context.axis_position(self.coords_of(0), axis_names, opname, self.where(0),
                                      self.maps_a_mesh)
        names = [n for n, _ in self.axes]
        index = np.zeros(self.grid.shape, dtype=np.int32)
        for name in axis_names:
            d = names.index(name)
            shape = [1] * len(names)
            shape[d] = self.axes[d][1]
            index = index * self.axes[d][1] + np.arange(self.axes[d][1], dtype=np.int32).reshape(shape)
        return index.reshape(self.n)

    def _groups(self, axis_names, op, groups):
        """The devices of every group, as arrays of shape (number of groups, group size)."""
        size = self.axis_size(axis_names, op)
        names = [n for n, _ in self.axes]
        rest = [d for d, n in enumerate(names) if n not in axis_names]
        members = self.grid.transpose(rest + [names.index(a) for a in axis_names]).reshape(-1, size)
        if groups is None:
            return [members], size
        context.check_groups(groups, size, op, self.where(0), axis_names)
        by_size: dict = {}
        for g in groups:
            by_size.setdefault(len(g), []).append(list(g))
        return [members[:, gs].reshape(-1, k) for k, gs in by_size.items()], size

    def collective(self, op, axis_names, leaves, params, groups):
        """Run ``op`` over ``axis_names`` for every group at once; the outputs, stacked."""
        sets, size = self._groups(axis_names, op, groups)
        logged_sets = self._taking_this_branch(sets, op, axis_names) if self.branches else sets
        stacks = [self._stacked(v) for v in leaves]
        check = collectives.PRECHECK.get(op)
        if check is not None:          # on device 0's values: every device has their shapes
            check([s[0] for s in stacks], sets[0].shape[1], params, self.where(0), axis_names)
        outputs = [_run_stacked(op, s, sets, params, self.n) for s in stacks]
        source, code = context.caller_source()
        results = [StackedValue(o) for o in outputs]
        if program.recording() is not None:       # (a replayed call records nothing)
            program.record(*_describe_collective(op, axis_names, params, groups, size),
                           functools.partial(_replay_collective, op, axis_names, params, groups),
                           (list(leaves),), results)
        if not logged_sets:             # a branch no device takes: traced, never run
            return results
        sets = logged_sets
        log = self.root
        log.calls += 1
        label = None if groups is None else tuple(tuple(g) for g in groups)
        logged = dict(params, axis_index_groups=label) if label is not None else params
        log.records.append((self, "collective", log.step + 1, op, axis_names, logged, params,
                            stacks, outputs, sets, log.calls, source, code, current_phase()))
        log.step += sum(m.shape[0] for m in sets)
        return results

    def _taking_this_branch(self, sets, op, axis_names):
        """The groups whose devices all take the branches now running (a collective
        there runs for them only); a group split between branches is a deadlock."""
        taking = np.logical_and.reduce([mask for mask, _ in self.branches])
        kept = []
        for members in sets:
            inside = taking[members]
            split = inside.any(axis=1) & ~inside.all(axis=1)
            if split.any():
                row = members[np.argmax(split)]
                raise errors.DeadlockError(self._deadlock_text(row, taking, op, axis_names))
            if inside.all(axis=1).any():
                kept.append(members[inside.all(axis=1)])
        return kept

    def _deadlock_text(self, row, taking, op, axis_names):
        _, (what, k, source, code) = self.branches[-1]
        ids = [self.devices[i].id for i in row]
        here = [self.devices[i].id for i in row if taking[i]]
        away = [i for i in ids if i not in here]
        axes = axis_names[0] if len(axis_names) == 1 else axis_names
        where, line = context.caller_source()
        branch = {("cond", 1): "the true branch", ("cond", 0): "the false branch"}.get(
            (what, k), f"branch {k}")
        return (f"deadlock: lax.{what} at {source} ({code}) sends devices "
                f"{errors.id_ranges(here)} into {branch}, which calls {op} over axis {axes!r} "
                f"at {where} ({line}); devices {errors.id_ranges(away)} of the same group take "
                f"another branch and never reach it. The {op} needs all {len(ids)} devices of "
                f"the group ({errors.id_ranges(ids)}), so on real hardware the devices that "
                f"reached it wait forever (jax.pmap hangs). Move the collective out of the "
                f"branch (compute it on every device, then choose with lax.cond or "
                f"snp.where), or make the predicate the same on every device of the group.")

    def _stacked(self, v):
        if type(v) is StackedValue:
            return v.value
        if hasattr(v, "__jax_array__") or type(v).__module__.startswith("jax"):
            raise errors.jax_array_in_collective()
        v = np.asarray(_value(v))
        return np.broadcast_to(v, (self.n,) + v.shape)

    def switch(self, index, branches, operands, what):
        """``lax.switch``/``lax.cond`` over every device at once (see :func:`switch`)."""
        return switch(self, index, branches, operands, what)

    def print(self, fmt, args, kwargs, source, code):
        """``simpmd.debug.print``: one line per device, printed when the body returns."""
        if program.recording() is not None:
            program.record("debug_callback", {"callback": f"print({fmt!r})"},
                           functools.partial(_replay_print, fmt, source, code), (args, kwargs),
                           None)
        texts = [fmt.format(*at_device(args, k), **at_device(kwargs, k)) for k in range(self.n)]
        log = self.root
        log.prints += [f"[{self.where(k)}] {t}" for k, t in enumerate(texts)]
        log.records.append((self, "print", log.step, texts, source, code))

    # -- the log ---------------------------------------------------------------------------
    def receive(self, pieces):
        """Log what each device received: ``pieces`` (``spmd.Piece``: a stack, and the
        detail of device ``k``'s row)."""
        self.root.records.append((self, "receive", self.root.step, pieces))

    def returned(self, stack, detail):
        self.root.records.append((self, "return", self.root.step, stack, detail))

    def error(self, text):
        self.root.records.append((self, "error", self.root.step, text))

    def summary(self):
        """What the trace's header and table need, read off the stacked records without
        writing out every device's events: None when an inner pmap makes it complicated."""
        if self.inner:
            return None
        count, groups, sent = 0, 0, 0
        for record in self.root.records:
            batch, kind = record[0], record[1]
            if kind == "receive":
                count += batch.n * len(record[3])
            elif kind in ("return",):
                count += batch.n
            elif kind == "print":
                count += len(record[3])
            elif kind == "error":
                count += 1
            else:
                op, params, stacks, sets = record[3], record[6], record[7], record[9]
                same = op in collectives.SAME_BYTES_FOR_EVERY_MEMBER
                for members in sets:
                    g, p = members.shape
                    count += g * p
                    groups += g
                    moved = _bytes_moved(op, params, stacks, p)
                    sent += g * (p * moved(0)[0] if same else
                                 sum(moved(pos)[0] for pos in range(p)))
        programs = [f"device {d.id}" for d in sorted(self.devices, key=lambda d: d.id)]
        return {"events": count, "collective_groups": groups, "bytes_sent": sent,
                "programs": programs}

    def events(self, only=None, limit=None) -> list:
        """The per-device log, written out from the stacked records (of every batch of
        the run, inner pmaps' included): every event, or those of device ``only``, or the
        first ``limit``."""
        out, seq, names = [], {}, {}

        def programs(batch):
            """(labels, device ids, devices spanned) of ``batch``'s programs."""
            if batch not in names:        # labels and spans: made for the programs read
                labels = _PerProgram(batch.label)
                if batch.inner:
                    spans = _PerProgram(lambda k: tuple(batch.leaf_ids(k)))
                    names[batch] = (labels, [None] * batch.n, spans, labels)
                else:
                    ids = [d.id for d in batch.devices]
                    names[batch] = (labels, ids, _PerProgram(lambda k: (ids[k],)), ids)
            return names[batch]

        class Enough(Exception):
            pass

        def writer(batch):
            labels, ids, spans, _ = programs(batch)

            def event(k, kind, step, **fields):
                if only is not None and ids[k] != only:
                    return None
                key = (id(batch), k)
                e = Event(kind=kind, program=labels[k], coords=batch.coords_of(k),
                          seq=seq.get(key, 0), step=step, device=ids[k], devices=spans[k],
                          **fields)
                seq[key] = e.seq + 1
                out.append(e)
                if limit is not None and len(out) >= limit:
                    raise Enough
                return e
            return event

        try:
            self._write(writer, programs, only)
        except Enough:
            pass
        return out

    def collective_groups(self) -> list:
        """Each collective instance (one group's rendezvous) as a sequence of its members'
        events, in order. A member's event is written out only when it is read, so asking
        for the groups of a 16384-device step costs one pass over the records."""
        groups, counts = [], {}           # counts: events so far of each program of a run
        for record in self.root.records:
            batch, kind = record[0], record[1]
            seen = counts.get(id(batch))
            if seen is None:
                seen = counts[id(batch)] = np.zeros(batch.n, dtype=np.int64)
            if kind == "receive":
                seen += len(record[3])
            elif kind in ("return", "print"):
                seen += 1
            elif kind == "error":
                seen[0] += 1
            else:
                step = record[2]
                for members in record[9]:
                    for row in members:
                        groups.append(_GroupEvents(batch, record[1:], row, step, seen[row]))
                        step += 1
                    np.add.at(seen, members.ravel(), 1)
        return sorted(groups, key=lambda g: g._step)

    def _write(self, writer, programs, only):
        for record in self.root.records:
            batch, kind, step = record[0], record[1], record[2]
            event = writer(batch)
            ks = range(batch.n)
            if only is not None and kind in ("receive", "return", "print"):
                _, ids, _, _ = programs(batch)
                ks = [k for k in ks if ids[k] == only]
            if kind == "receive":
                for k in ks:
                    for piece in record[3]:
                        event(k, "receive", step, inputs=(piece.stack[k, ...],),
                              detail=piece.detail(k))
            elif kind == "return":
                stack, detail = record[3], record[4]
                for k in ks:
                    event(k, "return", step, outputs=(stack[k, ...],), detail=detail(k))
            elif kind == "print":
                for k in ks:
                    text = record[3][k]
                    event(k, "print", step, detail=text, source=record[4], code=record[5])
            elif kind == "error":
                event(0, "error", step, detail=record[3])
            else:
                labels, _, _, members = programs(batch)
                _collective_events(record[1:], event, labels, members, only)


class _PerProgram(dict):
    """``f(k)`` for program ``k``, computed when first asked for."""

    def __init__(self, f):
        super().__init__()
        self.f = f

    def __missing__(self, k):
        value = self[k] = self.f(k)
        return value


class _GroupEvents(Sequence):
    """The events of one group of one stacked collective, written out when read."""

    def __init__(self, batch, record, row, step, seqs):
        self._batch, self._record, self._row = batch, record, row.tolist()
        self._step, self._seqs, self._made = step, seqs, {}
        self._common = None                 # what every member's event shares, made once

    def __len__(self):
        return len(self._row)

    def __getitem__(self, pos):
        if isinstance(pos, slice):
            return [self[i] for i in range(*pos.indices(len(self)))]
        if pos < 0:
            pos += len(self._row)
        if not 0 <= pos < len(self._row):
            raise IndexError(f"member {pos} of a group of {len(self._row)}")
        found = self._made.get(pos)
        if found is None:
            found = self._made[pos] = self._event(pos)
        return found

    def __iter__(self):
        return (self[pos] for pos in range(len(self._row)))

    def __repr__(self):
        return repr(list(self))

    def __eq__(self, other):
        return list(self) == list(other)

    def _shared(self):
        batch, row = self._batch, self._row
        (_, _, op, axes, logged, params, stacks, _, _, call, source, code,
         phase) = self._record
        programs = tuple(batch.label(k) for k in row)
        group = programs if batch.inner else tuple(batch.devices[k].id for k in row)
        self._common = (dict(kind="collective", step=self._step, call=call, op=op, axes=axes,
                             params=logged, source=source, code=code, group=group,
                             group_programs=programs, phase=phase),
                        _bytes_moved(op, params, stacks, len(row)))
        return self._common

    def _event(self, pos):
        common, moved = self._common or self._shared()
        batch, k = self._batch, self._row[pos]
        stacks, outputs = self._record[6], self._record[7]
        if batch.inner:
            ident, spans = None, tuple(batch.leaf_ids(k))
        else:
            ident = common["group"][pos]
            spans = (ident,)
        sent, received = moved(pos)
        return Event(program=common["group_programs"][pos], coords=batch.coords_of(k),
                     seq=int(self._seqs[pos]), device=ident, devices=spans, member=pos,
                     inputs=tuple(s[k, ...] for s in stacks),
                     outputs=tuple(o[k, ...] for o in outputs), bytes_sent=sent,
                     bytes_received=received, **common)


def _bytes_moved(op, params, stacks, p):
    """``pos -> (bytes sent, bytes received)`` of the member at ``pos`` of a group of ``p``
    in one stacked collective (all its leaves together), each position computed once; a
    collective whose members all move the same bytes computes them once for all."""
    wire, sizes = collectives.WIRE_BYTES[op], [s[0].nbytes for s in stacks]

    @functools.lru_cache(maxsize=None)
    def moved(pos):
        pairs = [wire(b, p, pos, **params) for b in sizes]
        return sum(x for x, _ in pairs), sum(y for _, y in pairs)
    if op in collectives.SAME_BYTES_FOR_EVERY_MEMBER:
        return lambda pos: moved(0)
    return moved


def _collective_events(record, event, labels, members_of, only=None):
    """One event per member of every group of one stacked collective (of device ``only``'s
    group alone, if given)."""
    (_, step, op, axes, logged, params, stacks, outputs, sets, call, source, code,
     phase) = record
    for members in sets:
        moved = _bytes_moved(op, params, stacks, members.shape[1])
        for row in members.tolist():
            group = tuple(members_of[k] for k in row)
            if only is not None and only not in group:
                step += 1
                continue
            programs = tuple(labels[k] for k in row)
            for pos, k in enumerate(row):
                if only is not None and members_of[k] != only:
                    continue
                event(k, "collective", step, call=call, op=op, axes=axes, member=pos,
                      params=logged, inputs=tuple(s[k, ...] for s in stacks),
                      outputs=tuple(o[k, ...] for o in outputs), bytes_sent=moved(pos)[0],
                      bytes_received=moved(pos)[1], source=source, code=code,
                      group=group, group_programs=programs, phase=phase)
            step += 1


def _replay_collective(op, axis_names, params, groups, leaves):
    return context.current_task().collective(op, axis_names, leaves, params, groups)


def _replay_print(fmt, source, code, args, kwargs):
    context.current_task().print(fmt, args, kwargs, source, code)


def replay_axis_index(axis_names):
    return StackedValue(context.current_task().positions(axis_names))


def _describe_collective(op, axes, params, groups, size):
    """JAX's primitive name and parameters for a collective (as ``jax.make_jaxpr`` prints them)."""
    groups = None if groups is None else tuple(tuple(g) for g in groups)
    name = axes if len(axes) > 1 else axes[0]
    if op in ("psum", "pmax", "pmin"):
        return op, {"axes": axes, "axis_index_groups": groups}
    if op == "pmean":
        return "pmean", {"axes": axes, "axis_index_groups": groups, "_divisor": size}
    if op == "all_gather":
        return op, {"all_gather_dimension": params["axis"], "axis_index_groups": groups,
                    "axis_name": axes, "axis_size": size, "tiled": params["tiled"]}
    if op == "psum_scatter":
        return "reduce_scatter", {"axis_index_groups": groups, "axis_name": axes,
                                  "axis_size": size, "scatter_dimension": params["scatter_dimension"],
                                  "tiled": params["tiled"]}
    if op == "all_to_all":
        return op, {"axis_index_groups": groups, "axis_name": name,
                    "concat_axis": params["concat_axis"], "split_axis": params["split_axis"],
                    "tiled": params["tiled"]}
    if op == "ppermute":
        return op, {"axis_name": axes, "perm": params["perm"]}
    return op, dict(params, axis_name=axes, axis_index_groups=groups)



def _run_stacked(op, stack, sets, params, n):
    """``op`` over each group of devices: gather the groups' rows, combine, scatter back."""
    rule = getattr(collectives.MATH[op], "stacked", None)
    if len(sets) == 1 and sets[0].shape[0] == 1 and np.array_equal(sets[0][0], np.arange(n)):
        return _combine(rule, op, stack[None], params)[0]      # one group of every device
    out = None
    for members in sets:
        combined = _combine(rule, op, stack[members], params)
        if out is None:
            out = np.empty((n,) + combined.shape[2:], combined.dtype)
        out[members] = combined
    return out


def _combine(rule, op, groups, params):
    """``groups`` of shape (number of groups, group size, ...) -> what each member gets."""
    if rule is not None:
        out = rule(groups, **params)
        return np.broadcast_to(out, groups.shape[:2] + out.shape[2:])
    return np.stack([np.stack(collectives.MATH[op](list(g), **params)) for g in groups])


def run_once(batch, fun, args, kwargs):
    """Call ``fun`` once with stacked ``args``; errors become simpmd's, with the log."""
    try:
        with batch.running():
            return fun(*args, **kwargs)
    except Exception as exc:
        if getattr(exc, "trace", None) is not None:
            raise                     # already explained, by a pmap nested in the body
        batch.error(f"{type(exc).__name__}: {exc}")
        problem = context.explain_failure(batch.where(0), batch.devices[0].id, exc)
        from .trace import Trace
        problem.trace = Trace(batch.events)
        if problem is exc:
            raise
        raise problem from exc
