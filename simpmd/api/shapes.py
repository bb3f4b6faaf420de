"""Shapes without values: ``simpmd.ShapeDtypeStruct`` and ``simpmd.eval_shape``, with JAX's names.

A :class:`ShapeDtypeStruct` is an array that has a shape and a dtype but no numbers, as
``jax.ShapeDtypeStruct`` is. Give one (or a ``jax.ShapeDtypeStruct``) to any front end,
``simpmd.pmap``, ``simpmd.shard_map``, ``simpmd.make_jaxpr`` or :func:`eval_shape`, and the
program runs on types alone: every operation computes only its result's type (the rows'
``abstract`` column), each collective is logged with its shapes, dtypes and bytes, and the
results come back as ShapeDtypeStructs. Nothing is computed, so a LLaMA-sized layer on
thousands of simulated devices takes as long to run as a toy one, and its trace still
feeds ``simpmd.cost.estimate_trace``, the roofline and the timelines.
"""
from __future__ import annotations

import numpy as np

from ..core import dtypes
from . import tree
from ..core.core import Aval


def dtype_of(dtype) -> np.dtype:
    """A NumPy dtype, with JAX's 16-bit ``"bfloat16"`` found in ml_dtypes (which comes with
    jaxlib; simpmd itself does not need JAX)."""
    if isinstance(dtype, str) and dtype in ("bfloat16", "bf16"):
        try:
            import ml_dtypes  # optional: JAX (ml_dtypes comes with it)
        except ImportError:
            raise TypeError("bfloat16 needs the ml_dtypes package (pip install ml_dtypes; it "
                            "comes with jaxlib).") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(dtype)


class ShapeDtypeStruct:
    """An array's type without its values: ``shape``, ``dtype`` and an optional
    ``sharding`` (a ``NamedSharding``), like ``jax.ShapeDtypeStruct``."""

    __slots__ = ("shape", "dtype", "sharding", "weak_type")

    def __init__(self, shape, dtype, sharding=None, *, weak_type=False):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = dtype_of(dtype)
        self.sharding, self.weak_type = sharding, bool(weak_type)

    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape, dtype=np.int64)))

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of unsized object")
        return self.shape[0]

    def __eq__(self, other):
        return (isinstance(other, ShapeDtypeStruct) and self.shape == other.shape
                and self.dtype == other.dtype and self.sharding == other.sharding
                and self.weak_type == other.weak_type)

    def __hash__(self):
        return hash((self.shape, self.dtype, self.weak_type))

    def __repr__(self):
        extra = f", sharding={self.sharding!r}" if self.sharding is not None else ""
        extra += ", weak_type=True" if self.weak_type else ""
        return f"ShapeDtypeStruct(shape={self.shape}, dtype={self.dtype.name}{extra})"


def is_shape(x) -> bool:
    """True for a type without values: simpmd's or JAX's ShapeDtypeStruct."""
    return isinstance(x, ShapeDtypeStruct) or (
        type(x).__name__ == "ShapeDtypeStruct" and hasattr(x, "shape") and hasattr(x, "dtype"))


def aval_of_shape(x) -> Aval:
    """The type JAX gives a ShapeDtypeStruct (64-bit as 32-bit, without x64)."""
    return Aval(x.shape, dtypes.canonical(dtype_of(getattr(x.dtype, "name", x.dtype))),
                weak_type=bool(getattr(x, "weak_type", False)))


def struct_of(aval, sharding=None) -> ShapeDtypeStruct:
    return ShapeDtypeStruct(aval.shape, aval.dtype, sharding, weak_type=aval.weak_type)


def as_shapes(args):
    """Every array leaf of ``args`` as its ShapeDtypeStruct (what a roofline traces on);
    Python numbers and other leaves stay as they are (a static argument keeps its value)."""
    def one(x):
        if is_shape(x) or not (hasattr(x, "shape") and hasattr(x, "dtype")):
            return x
        return ShapeDtypeStruct(np.shape(x), dtypes.canonical(np.dtype(x.dtype)))
    return tree.tree_map(one, args)
