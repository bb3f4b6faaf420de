"""What a mapped body holds: every device's value of one array, stacked, or its type alone.

A :class:`StackedValue` has an :class:`~simpmd.core.core.Aval` (one device's shape and
dtype) and a ``stack``: a NumPy array whose first axis runs over the devices of the run
(one row in an eager run, where each device runs its own copy), or None while a body is
*traced*, as JAX traces it, on types alone. Its operators and methods are NumPy's
spelling, turned into primitives by ``surface.py`` and applied by ``bind``.

Like a JAX tracer it refuses what needs a concrete value while tracing (``if x > 0:``,
``float(x)``, ``np.asarray(x)``), with JAX's error names; in an eager run, whose values
are concrete, it allows them.
"""
from __future__ import annotations

import numpy as np

from . import errors
from . import surface as S
from .core import Aval, context

_HINT = (
    "JAX traces a mapped function once for all devices, so the value of an array is not "
    "known while Python runs the body, and Python control flow cannot depend on it (real "
    "JAX raises {name} here). Use snp.where / lax.cond / lax.select for choices that depend "
    "on values, or pass the value as a static argument (static_broadcasted_argnums). "
    "simpmd.pmap(..., eager=True) runs it anyway, as a program real JAX cannot run.")

# NumPy's ufuncs a value may meet on the right of an ndarray operator (``ndarray + x``)
OPERATOR_UFUNCS = {np.add: S.add, np.subtract: S.subtract, np.multiply: S.multiply,
                   np.true_divide: S.true_divide, np.floor_divide: S.floor_divide,
                   np.remainder: S.remainder, np.power: S.power, np.matmul: S.matmul,
                   np.less: S.less, np.less_equal: S.less_equal, np.equal: S.equal,
                   np.not_equal: S.not_equal, np.greater: S.greater,
                   np.greater_equal: S.greater_equal, np.bitwise_and: S.bitwise_and,
                   np.bitwise_or: S.bitwise_or, np.bitwise_xor: S.bitwise_xor,
                   np.maximum: S.maximum, np.minimum: S.minimum}


def refused_numpy(name, args):
    """The error for a NumPy function applied to a traced value, pointing to simpmd.numpy."""
    first = next((a for a in _leaves(args) if isinstance(a, StackedValue)), None)
    what = f" of shape {first.shape} {first.dtype}" if first is not None else ""
    return errors.TracerArrayConversionError(
        f"{name}() was applied to a mapped value{what}. Real JAX refuses this "
        f"(TracerArrayConversionError): a NumPy function needs a concrete array, and a traced "
        f"value has none. Use simpmd.numpy, which runs NumPy on simpmd's devices and jax.numpy "
        f"inside real JAX: `import simpmd.numpy as snp` then `snp.{name.split('.', 1)[1]}(...)`. "
        f"Operators and methods (x * 2, x.sum()) work on both engines as they are.")


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    else:
        yield x


class StackedValue:
    """One array of a mapped body: every device's value stacked, or its type alone."""

    __slots__ = ("aval", "stack")
    __array_priority__ = 1000

    def __init__(self, aval: Aval, stack=None):
        self.aval, self.stack = aval, stack

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)
    T = property(lambda self: S.transpose(self))
    real = property(lambda self: S.real(self))
    imag = property(lambda self: S.imag(self))

    @property
    def value(self):
        """One device's NumPy array, in an eager run (its only row)."""
        return self._concrete("value").reshape(self.shape)

    # -- operators: NumPy's spelling, JAX's primitives --------------------------------------
    def __add__(self, o): return S.add(self, o)
    def __radd__(self, o): return S.add(o, self)
    def __sub__(self, o): return S.subtract(self, o)
    def __rsub__(self, o): return S.subtract(o, self)
    def __mul__(self, o): return S.multiply(self, o)
    def __rmul__(self, o): return S.multiply(o, self)
    def __truediv__(self, o): return S.true_divide(self, o)
    def __rtruediv__(self, o): return S.true_divide(o, self)
    def __floordiv__(self, o): return S.floor_divide(self, o)
    def __rfloordiv__(self, o): return S.floor_divide(o, self)
    def __mod__(self, o): return S.remainder(self, o)
    def __rmod__(self, o): return S.remainder(o, self)
    def __pow__(self, o): return S.power(self, o)
    def __rpow__(self, o): return S.power_float(o, self)
    def __matmul__(self, o): return S.matmul(self, o)
    def __rmatmul__(self, o): return S.matmul(o, self)
    def __and__(self, o): return S.bitwise_and(self, o)
    def __rand__(self, o): return S.bitwise_and(o, self)
    def __or__(self, o): return S.bitwise_or(self, o)
    def __ror__(self, o): return S.bitwise_or(o, self)
    def __xor__(self, o): return S.bitwise_xor(self, o)
    def __rxor__(self, o): return S.bitwise_xor(o, self)
    def __lshift__(self, o): return S.left_shift(self, o)
    def __rshift__(self, o): return S.right_shift(self, o)
    def __lt__(self, o): return S.less(self, o)
    def __le__(self, o): return S.less_equal(self, o)
    def __eq__(self, o): return S.equal(self, o)
    def __ne__(self, o): return S.not_equal(self, o)
    def __gt__(self, o): return S.greater(self, o)
    def __ge__(self, o): return S.greater_equal(self, o)
    def __neg__(self): return S.negative(self)
    def __pos__(self): return self
    def __abs__(self): return S.absolute(self)
    def __invert__(self): return S.invert(self)
    def __divmod__(self, o): return S.floor_divide(self, o), S.remainder(self, o)

    # In-place operators rebind the name to a new value, as they do for JAX arrays.
    __iadd__, __isub__, __imul__, __itruediv__ = __add__, __sub__, __mul__, __truediv__
    __ifloordiv__, __imod__, __ipow__, __imatmul__ = __floordiv__, __mod__, __pow__, __matmul__

    # -- methods ------------------------------------------------------------------------------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return S.sum_(self, axis, dtype, out, keepdims)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False):
        return S.prod(self, axis, dtype, out, keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return S.max_(self, axis, out=out, keepdims=keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return S.min_(self, axis, out=out, keepdims=keepdims)

    def mean(self, axis=None, dtype=None, keepdims=False): return S.mean(self, axis, dtype, keepdims)
    def var(self, axis=None, dtype=None, ddof=0, keepdims=False): return S.var(self, axis, dtype, ddof, keepdims)
    def std(self, axis=None, dtype=None, ddof=0, keepdims=False): return S.std(self, axis, dtype, ddof, keepdims)
    def all(self, axis=None, keepdims=False): return S.all_(self, axis, keepdims)
    def any(self, axis=None, keepdims=False): return S.any_(self, axis, keepdims)
    def argmax(self, axis=None, keepdims=False): return S.argmax(self, axis, keepdims)
    def argmin(self, axis=None, keepdims=False): return S.argmin(self, axis, keepdims)
    def cumsum(self, axis=None, dtype=None): return S.cumsum(self, axis, dtype)
    def cumprod(self, axis=None, dtype=None): return S.cumprod(self, axis, dtype)
    def reshape(self, *shape, order="C"): return S.reshape(self, *shape, order=order)
    def transpose(self, *axes): return S.transpose(self, *axes)
    def swapaxes(self, a, b): return S.swapaxes(self, a, b)
    def squeeze(self, axis=None): return S.squeeze(self, axis)
    def ravel(self): return S.ravel(self)
    flatten = ravel
    def astype(self, dtype, copy=False): return S.convert(self, dtype)
    def copy(self): return self
    def clip(self, min=None, max=None): return S.clip(self, min, max)
    def round(self, decimals=0): return S.round_(self, decimals)
    def conj(self): return S.conjugate(self)
    def dot(self, other): return S.dot(self, other)
    def take(self, indices, axis=None): return S.take(self, indices, axis)
    def sort(self, axis=-1): return S.sort(self, axis)
    def argsort(self, axis=-1): return S.argsort(self, axis)

    def __getitem__(self, index):
        return S.getitem(self, index)

    def __setitem__(self, index, v):
        raise TypeError(
            "Traced values are immutable, as JAX arrays are: `x[i] = v` is not allowed. "
            "Write `x = x.at[i].set(v)` instead (also .add, .multiply, .min, .max).")

    @property
    def at(self):
        return _At(self)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array (a scalar): it has no length")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array (a scalar)")
        return (self[i] for i in range(self.shape[0]))

    # -- NumPy's protocols: what JAX refuses on a tracer -------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "__call__" and not kwargs:
            if ufunc in OPERATOR_UFUNCS and len(inputs) == 2 and not isinstance(inputs[0], StackedValue):
                return OPERATOR_UFUNCS[ufunc](*inputs)    # ndarray + x: JAX allows it
            if self._eager():
                fn = S.FUNCTIONS.get(ufunc.__name__)
                if fn is not None:
                    return fn(*inputs)
        raise refused_numpy(f"np.{ufunc.__name__}", inputs)

    def __array_function__(self, func, types, args, kwargs):
        fn = S.FUNCTIONS.get(func.__name__)
        if self._eager() and fn is not None:
            return fn(*args, **kwargs)
        # As for a JAX tracer: np.sum(x) calls x.sum(); what needs a concrete array refuses.
        implementation = getattr(func, "_implementation", None)
        if implementation is None:
            raise refused_numpy(f"np.{func.__name__}", args)
        try:
            return implementation(*args, **kwargs)
        except errors.TracerArrayConversionError:
            raise refused_numpy(f"np.{func.__name__}", args) from None

    def __array__(self, dtype=None, copy=None):
        if self._eager():
            return np.asarray(self.value, dtype=dtype)
        raise errors.TracerArrayConversionError(
            f"np.asarray() / np.array() on a mapped value of shape {self.shape} {self.dtype}: "
            "real JAX raises TracerArrayConversionError here, because a traced value has no "
            "concrete NumPy array. Keep computing on the value itself (operators, methods, "
            "simpmd.numpy functions).")

    def __jax_array__(self):
        raise errors.TracerArrayConversionError(
            "a jax.numpy function was given a simpmd device value. Inside a function that "
            "runs on both engines, call array functions through simpmd.numpy (e.g. "
            "`import simpmd.numpy as snp; snp.exp(x)`): it uses NumPy on simpmd's devices "
            "and jax.numpy inside real jax.pmap.")

    def __hash__(self):
        raise TypeError("unhashable type: a mapped array value (as in JAX)")

    # -- concrete values: only in an eager run ------------------------------------------------
    def _eager(self) -> bool:
        run = context.run
        return self.stack is not None and run is not None and run.eager

    def _concrete(self, kind, error=errors.ConcretizationTypeError, name="ConcretizationTypeError"):
        if self._eager():
            return self.stack[0]
        raise error(f"{kind}() of a mapped value of shape {self.shape} {self.dtype}: "
                    + _HINT.format(name=name))

    def __bool__(self):
        return bool(self._concrete("bool", errors.TracerBoolConversionError,
                                   "TracerBoolConversionError"))

    def __float__(self): return float(self._concrete("float"))
    def __complex__(self): return complex(self._concrete("complex"))
    def __int__(self): return int(self._concrete("int"))
    def item(self, *args): return self._concrete("item").item(*args)
    def tolist(self): return self._concrete("tolist").tolist()

    def __index__(self):
        if self._eager():
            return self.stack[0].__index__()
        raise errors.TracerIntegerConversionError(
            f"a mapped value of shape {self.shape} {self.dtype} was used as a Python index "
            "(list[x], range(x), slicing a Python sequence): "
            + _HINT.format(name="TracerIntegerConversionError"))

    def __repr__(self):
        if self._eager():
            body = np.array2string(self.value, separator=", ", prefix="DeviceValue(")
            return f"DeviceValue({body}, dtype={self.dtype})"
        where = "" if self.stack is None else f" on {self.stack.shape[0]} devices"
        return f"Traced<{self.aval.str_short()}>{where}"

    def __str__(self):
        return str(self.value) if self._eager() else repr(self)

    def __format__(self, spec):
        return format(self.value, spec) if self._eager() and spec else format(str(self), spec)


class _At:
    """``x.at[index].set(v)`` and friends, as on a JAX array."""

    def __init__(self, x):
        self.x = x

    def __getitem__(self, index):
        return _AtIndex(self.x, index)


class _AtIndex:
    def __init__(self, x, index):
        self.x, self.index = x, index

    def get(self): return S.getitem(self.x, self.index)
    def set(self, v): return S.update(self.x, self.index, v, None)
    def add(self, v): return S.update(self.x, self.index, v, "add")
    def multiply(self, v): return S.update(self.x, self.index, v, "multiply")
    def min(self, v): return S.update(self.x, self.index, v, "min")
    def max(self, v): return S.update(self.x, self.index, v, "max")


DeviceValue = StackedValue           # the name one device's value has in an eager run's messages
