"""What a mapped body holds: every device's value of one array, stacked, or its type alone.

A :class:`StackedValue` has an :class:`~simpmd.core.core.Aval` (one device's shape and
dtype) and a ``stack``: a NumPy array whose first axis runs over the devices of the run
(one row in an eager run, where each device runs its own copy), or None while a body is
*traced*, as JAX traces it, on types alone. Its operators and methods are NumPy's
spelling, turned into primitives by ``simpmd/api/spelling.py`` (which installs them on
this class, as ``jax.numpy`` is built on ``jax.lax``) and applied by ``bind``.

Like a JAX tracer it refuses what needs a concrete value while tracing (``if x > 0:``,
``float(x)``, ``np.asarray(x)``), with JAX's error names; an eager run, on values, allows them.
"""
from __future__ import annotations

import numpy as np

from . import errors
from .core import Aval, context

_HINT = (
    "JAX traces a mapped function once for all devices, so the value of an array is not "
    "known while Python runs the body, and Python control flow cannot depend on it (real "
    "JAX raises {name} here). Use snp.where / lax.cond / lax.select for choices that depend "
    "on values, or pass the value as a static argument (static_broadcasted_argnums). "
    "simpmd.pmap(..., eager=True) runs it anyway, as a program real JAX cannot run.")

class StackedValue:
    """One array of a mapped body: every device's value stacked, or its type alone.
    (A pytree leaf, as an array is.)"""

    __slots__ = ("aval", "stack")
    __array_priority__ = 1000

    def __init__(self, aval: Aval, stack=None):
        self.aval, self.stack = aval, stack

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)

    @property
    def value(self):
        """One device's NumPy array, in an eager run (its only row)."""
        return self._concrete("value").reshape(self.shape)

    # -- NumPy's protocols: what JAX refuses on a tracer -------------------------------------
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

