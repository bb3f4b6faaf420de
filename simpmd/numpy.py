"""``simpmd.numpy``: array functions for bodies that run on both engines.

One function body, written once, runs on simpmd's simulated devices (where each value is
a NumPy-backed ``simpmd.core.traced.DeviceValue``) and inside a real ``jax.pmap`` (where each value
is a JAX tracer). The rule for the device-local math:

* **Operators and array methods work on both engines as they are**: ``x * 2``, ``x @ w``,
  ``x.sum(0)``, ``x.reshape(2, -1)``, ``x.T``, ``x.at[0].set(1.0)``.
* **Functions go through simpmd.numpy**: ``import simpmd.numpy as snp`` then
  ``snp.exp(x)``, ``snp.tanh(x)``, ``snp.where(m, x, 0)``, ``snp.linalg.norm(x)``. Each
  call looks at its arguments (inside lists, tuples and dicts too): if any of them is a
  JAX array or tracer, it calls ``jax.numpy.<name>``; otherwise ``numpy.<name>``, which
  computes on simpmd's device values and keeps them simulated.
* Types and constants (``snp.float32``, ``snp.pi``, ``snp.newaxis``) are NumPy's, which
  JAX accepts too. Convert with ``x.astype(snp.float32)``; ``snp.float32(x)`` only works
  on simpmd's devices.

Calling ``jax.numpy`` directly on a simpmd value, or a NumPy function (``np.exp(x)``) on
a device value outside eager mode (real JAX refuses it on a tracer), raises a
``TracerArrayConversionError`` that points here, and a name that neither NumPy nor jax.numpy defines is an
``AttributeError`` that says so: a mistake is an error, never a silently wrong answer.
This module never imports JAX: it only uses it when JAX values reach it.
"""
import sys as _sys
import types as _types

import numpy as _np

from .core import dtypes as _dtypes
from .api import jit as _jit
from .api import spelling as _surface
from .core.values import StackedValue as _Traced

_MISSING = object()
# What simpmd.numpy forwards to for a few names, on simpmd's devices. np.asarray(x) asks
# x for a concrete array, which a device value (like a JAX tracer) refuses; snp.asarray(x)
# keeps it a device value instead, as jnp.asarray does for a tracer.
_KEEPS_DEVICE_VALUES = {"asarray", "array", "asanyarray"}
# Functions that make a new array from Python numbers: JAX gives them its default dtypes
# (float32, int32 without x64), where NumPy would give float64 and int64.
_MAKES_ARRAYS = {"zeros", "ones", "full", "empty", "arange", "linspace", "eye", "identity",
                 "array", "asarray", "zeros_like", "ones_like", "full_like", "empty_like",
                 "tri", "logspace", "geomspace"}


def uses_jax(value) -> bool:
    """True if ``value`` is (or contains, in lists, tuples and dicts) a JAX array or tracer."""
    jax = _sys.modules.get("jax")
    if jax is None:
        return False
    kinds = tuple(k for k in (getattr(jax, "Array", None),
                              getattr(getattr(jax, "core", None), "Tracer", None)) if k)
    return _contains(value, kinds) if kinds else False


def _contains(value, kinds) -> bool:
    if isinstance(value, kinds):
        return True
    if isinstance(value, (list, tuple)):
        return any(_contains(v, kinds) for v in value)
    if isinstance(value, dict):
        return any(_contains(v, kinds) for v in value.values())
    return False


def _holds_sharded(value) -> bool:
    """True if ``value`` holds an array placed on a mesh (simpmd.device_put, simpmd.jit)."""
    return _jit.holds_sharded(value)


def _holds_device_values(value) -> bool:
    """True if ``value`` is (or contains) a simpmd device value."""
    return _contains(value, (_Traced,))


def _lookup(namespace: tuple, name: str, jax_side: bool):
    """``numpy.<namespace>.<name>`` (or ``jax.numpy.<...>``), or _MISSING."""
    if jax_side:
        jax = _sys.modules.get("jax")
        if jax is None:
            return _MISSING
        import jax.numpy as target  # optional: JAX
    else:
        target = _np
    for part in namespace + (name,):
        target = getattr(target, part, _MISSING)
        if target is _MISSING:
            return _MISSING
    return target


def _dotted(namespace: tuple, name: str) -> str:
    return ".".join(namespace + (name,))


def _dispatching(namespace: tuple, name: str):
    """A function that calls numpy's or jax.numpy's ``name``, whichever fits its arguments."""
    qualified = _dotted(namespace, name)

    def call(*args, **kwargs):
        if not namespace and _holds_sharded((args, kwargs)):
            return _jit.call_numpy(name, _lookup(namespace, name, jax_side=False), args, kwargs)
        if ("out_sharding" in kwargs and not (uses_jax(args) or uses_jax(kwargs))
                and not _holds_device_values((args, kwargs))):
            return _jit.call_numpy(name, _lookup(namespace, name, jax_side=False), args, kwargs)
        if uses_jax(args) or uses_jax(kwargs):
            if "out_sharding" in kwargs:
                kwargs = dict(kwargs, out_sharding=_jit.to_jax_spec(kwargs["out_sharding"]))
            fn = _lookup(namespace, name, jax_side=True)
            if fn is _MISSING:
                raise AttributeError(
                    f"simpmd.numpy.{qualified} was called on JAX values (inside real JAX), but "
                    f"jax.numpy has no {qualified}. Write the computation with functions that "
                    f"jax.numpy has, so that it runs on both engines.")
            return fn(*args, **kwargs)
        fn = _lookup(namespace, name, jax_side=False)
        if fn is _MISSING:
            raise AttributeError(
                f"simpmd.numpy.{qualified} exists only in jax.numpy; NumPy has no "
                f"{qualified}, so simpmd's devices cannot run it. Write the computation with "
                f"functions that both NumPy and jax.numpy have.")
        if name in _KEEPS_DEVICE_VALUES and not namespace and args and isinstance(args[0], _Traced):
            dtype = kwargs.get("dtype", args[1] if len(args) > 1 else None)
            return args[0] if dtype is None else _surface.convert(args[0], dtype)
        if _holds_device_values(args) or _holds_device_values(kwargs):
            # Called directly, NumPy would refuse a device value (as it refuses a tracer):
            # simpmd spells the call with JAX's primitives, or runs it on each device.
            spelled = _surface.FUNCTIONS.get(name) if not namespace else None
            if spelled is not None:
                return spelled(*args, **kwargs)
            return _surface.numpy_function(fn, args, kwargs)
        if not namespace and name in _MAKES_ARRAYS and "dtype" not in kwargs:
            out = fn(*args, **kwargs)
            if isinstance(out, _np.ndarray):
                return out.astype(_dtypes.canonical(out.dtype), copy=False)
            return out
        return fn(*args, **kwargs)

    call.__name__ = name
    call.__qualname__ = call.__name__
    call.__module__ = __name__
    call.__doc__ = (f"numpy.{qualified} on simpmd's devices, jax.numpy.{qualified} on JAX "
                    f"values (see simpmd.numpy).")
    return call


def _resolve(namespace: tuple, name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    np_attr = _lookup(namespace, name, jax_side=False)
    if isinstance(np_attr, _types.ModuleType):
        return _Namespace(namespace + (name,))
    if np_attr is not _MISSING and (isinstance(np_attr, type) or not callable(np_attr)):
        return np_attr                      # a type or a constant: NumPy's serves both
    jnp_attr = _lookup(namespace, name, jax_side=True)
    if np_attr is _MISSING and jnp_attr is not _MISSING and (
            isinstance(jnp_attr, type) or not callable(jnp_attr)):
        return jnp_attr                     # e.g. bfloat16: a type only JAX has
    if np_attr is not _MISSING or jnp_attr is not _MISSING:
        return _dispatching(namespace, name)
    if not namespace and name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        try:                                # JAX's 16- and 8-bit floats without JAX
            import ml_dtypes  # optional: JAX (ml_dtypes comes with it)
            return getattr(ml_dtypes, name)
        except ImportError:
            pass
    where = "numpy" + "".join("." + p for p in namespace)
    jax_note = ("jax.numpy has no such name either" if "jax" in _sys.modules
                else "jax is not imported, so jax.numpy was not consulted")
    raise AttributeError(
        f"simpmd.numpy has no {_dotted(namespace, name)!r}: {where} has no such name "
        f"({jax_note}). Check the spelling against the NumPy / jax.numpy documentation.")


class _Namespace:
    """A sub-namespace such as ``simpmd.numpy.linalg``, dispatching the same way."""

    def __init__(self, path: tuple):
        self._path = path

    def __getattr__(self, name):
        return _resolve(self._path, name)

    def __repr__(self):
        return f"<simpmd.numpy.{'.'.join(self._path)}: numpy or jax.numpy, by argument>"


# Names already resolved. A dict of their own, not this module's globals: a name such as
# ``any`` or ``sum`` cached as a global would shadow the builtin that this module's own code
# calls, and break every later call.
_RESOLVED: dict = {}


def __getattr__(name):
    value = _RESOLVED.get(name, _MISSING)
    if value is not _MISSING:
        return value
    value = _resolve((), name)
    if _lookup((), name, jax_side=False) is not _MISSING:
        _RESOLVED[name] = value             # NumPy has it: the answer never changes
    return value


def __dir__():
    return sorted(set(globals()) | set(_RESOLVED)
                  | {n for n in dir(_np) if not n.startswith("_")})
