"""JAX's dtype rules: 32-bit by default, weak Python scalars, and its promotion lattice.

Without ``jax_enable_x64`` (JAX's default) a 64-bit NumPy input is computed as its 32-bit
kind. A Python number is *weak*: it takes the other operand's dtype (``x_f16 * 2.0`` stays
float16). Two arrays promote along JAX's lattice (``jnp.promote_types``), not NumPy's:
``uint8 + int8`` is int16. Decided in one place, a value's dtype never depends on the engine.
"""
from __future__ import annotations

import functools

import numpy as np

class _Config:
    """``simpmd.config``: as ``jax.config``, for the one setting that changes values."""
    jax_enable_x64 = False

    def update(self, name, value):
        if name != "jax_enable_x64":
            raise ValueError(f"simpmd.config knows only 'jax_enable_x64', not {name!r}")
        self.jax_enable_x64 = bool(value)

config = _Config()

_NARROW = {"f8": "f4", "i8": "i4", "u8": "u4", "c16": "c8"}

def canonical(dtype) -> np.dtype:
    """The dtype JAX computes ``dtype`` as: without x64, 64-bit numbers become 32-bit."""
    dtype = np.dtype(dtype)
    if config.jax_enable_x64:
        return dtype
    narrow = _NARROW.get(dtype.str[1:])
    return dtype if narrow is None else np.dtype(narrow)

def default(kind: str) -> np.dtype:
    """JAX's default dtype of a kind: 'b', 'i', 'f', 'c' (a weak Python number's)."""
    return canonical({"b": np.bool_, "i": np.int64, "f": np.float64, "c": np.complex128}[kind])

def inexact(dtype) -> bool:
    """A floating or complex dtype, ml_dtypes' bfloat16 and float8s included (NumPy files
    those under kind 'V', so ``dtype.kind in "fc"`` misses them)."""
    dtype = np.dtype(dtype)
    return dtype.kind in "fc" or dtype.name == "bfloat16" or dtype.name.startswith("float8")

def is_weak_scalar(x) -> bool:
    """A Python number (not a NumPy scalar): weakly typed, as in JAX."""
    return type(x) in (int, float, complex, bool)

def of_python(x) -> np.dtype:
    """The dtype JAX gives a constant: Python numbers their default, arrays canonical."""
    if type(x) is bool:
        return np.dtype(np.bool_)
    if type(x) is int:
        return default("i")
    if type(x) is float:
        return default("f")
    if type(x) is complex:
        return default("c")
    return canonical(np.asarray(x).dtype)

# -- the promotion lattice: each type and the types just above it (jax._src.dtypes) -----------
# 'i*', 'f*', 'c*' are the weak kinds of Python ints, floats and complex numbers.
_ABOVE = {
    "b1": ["i*"], "i*": ["u1", "i1"],
    "u1": ["i2", "u2"], "u2": ["i4", "u4"], "u4": ["i8", "u8"], "u8": ["f*"],
    "i1": ["i2"], "i2": ["i4"], "i4": ["i8"], "i8": ["f*"],
    "f*": ["bf2", "f2", "c*"], "bf2": ["f4"], "f2": ["f4"], "f4": ["f8", "c8"], "f8": ["c16"],
    "c*": ["c8"], "c8": ["c16"], "c16": [],
}

def _upper_bounds(above):
    bounds = {}
    for node in above:
        seen, todo = {node}, [node]
        while todo:
            for up in above[todo.pop()]:
                if up not in seen:
                    seen.add(up)
                    todo.append(up)
        bounds[node] = seen
    return bounds

_BOUNDS = _upper_bounds(_ABOVE)
_BOUNDS_X32 = _upper_bounds(dict(_ABOVE, u4=["i4", "u8"]))   # no 64-bit from 32-bit inputs

@functools.lru_cache(maxsize=None)        # every operation asks: answer each pair once
def _node(dtype, weak) -> str:
    dtype = np.dtype(dtype)
    if weak:
        return {"b": "b1", "i": "i*", "u": "i*", "f": "f*", "c": "c*"}[dtype.kind]
    if dtype.name == "bfloat16":       # ml_dtypes' (it comes with jaxlib; simpmd needs no JAX)
        return "bf2"
    return {"b": "b", "i": "i", "u": "u", "f": "f", "c": "c"}[dtype.kind] + str(dtype.itemsize)

def _dtype(node) -> np.dtype:
    if node.endswith("*"):
        return default(node[0])
    if node == "bf2":
        import ml_dtypes  # optional: JAX (ml_dtypes comes with it)
        return np.dtype(ml_dtypes.bfloat16)
    if node == "b1":
        return np.dtype(np.bool_)
    return np.dtype(node)

def promote(*typed) -> tuple[np.dtype, bool]:
    """The dtype of an operation on operands of (dtype, weak) ``typed``, and whether the
    result is weak (only Python numbers were involved), as ``jnp.result_type``."""
    return _promote(config.jax_enable_x64, *[(np.dtype(d), bool(w)) for d, w in typed])

@functools.lru_cache(maxsize=1024)
def _promote(x64, *typed):
    bounds = _BOUNDS if x64 else _BOUNDS_X32
    if len(set(typed)) == 1 and typed[0][0].kind == "V" and not typed[0][1]:
        return typed[0][0], False   # an ml_dtypes FP8 type: JAX joins it only to itself here
    nodes = {_node(d, w) for d, w in typed}
    common = set.intersection(*(bounds[n] for n in nodes))
    least = (common & nodes) or {c for c in common if common <= bounds[c]}
    if len(least) != 1:
        names = ", ".join(str(np.dtype(d)) for d, _ in typed)
        raise TypeError(f"no implicit dtype promotion path for ({names}); convert one "
                        f"operand with .astype first.")
    node = least.pop()
    return canonical(_dtype(node)), node.endswith("*")

def short_name(dtype) -> str:
    """'f32', as JAX writes a dtype inside a type (``f32[8,3]``)."""
    dtype = np.dtype(dtype)
    if dtype.name == "bfloat16":
        return "bf16"
    if dtype == np.bool_:
        return "bool"
    return {"f": "f", "i": "i", "u": "u", "c": "c"}[dtype.kind] + str(8 * dtype.itemsize)
