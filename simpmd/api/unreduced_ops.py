"""The collectives of partial sums inside ``shard_map`` (JAX's unreduced types): a cast
from varying to unreduced, the sum of unreduced parts, and an ``all_gather`` whose result
is invariant. They are rows like the core's collectives, built from its pieces, and kept
here so the core stays within its budget (tests/test_purity.py)."""

from __future__ import annotations

import numpy as np

from ..core import errors
from ..core.collectives import (_all_gather, _all_gather_bytes, _all_reduce_bytes, _collective,
                                _gather_abstract, _psum, _pvary_ct, axis_index)
from ..core.core import Primitive, aval_of, bind, context
from ..core.primitives import dynamic_slice, mul, squeeze


def _unreduced_cast_abstract(x, *, axes):
    """``pcast(x, axes, to='unreduced')``: each device's value, varying over ``axes``, is
    now typed as its part of a sum over them (JAX's ``vary_unreduced_cast``)."""
    if not x.vma & set(axes):
        raise errors.VmaError(
            f"vary_unreduced_cast is a Varying->Unreduced collective. This means that the "
            f"axis names mentioned in `axes` passed to `vary_unreduced_cast` must be present "
            f"in `jax.typeof(x).mat.varying`. Got axes={axes} and "
            f"jax.typeof(x).mat.varying={set(x.vma) or 'frozenset()'} (JAX's words)")
    return x.update(vma=x.vma - set(axes), unreduced=x.unreduced | set(axes))

def _reduced_ct(ct, axes):
    """The cotangent of a cast between varying and unreduced: the same value, varying
    again (JAX's transposes pass through its reduced type, which simpmd does not keep
    inside shard_map)."""
    if ct is None or context.run is None or not context.run.check_vma:
        return ct
    return _pvary_ct(ct, axes)

vary_unreduced_cast = Primitive(   # no data moves: the blocks are now the parts of a sum
    "vary_unreduced_cast", lambda x, axes: x, _unreduced_cast_abstract,
    vjp=lambda ct, ins, outs, wants, axes: [_reduced_ct(ct, axes)] if wants[0] else [None],
    cost=lambda ins, outs, **p: (0, 0), show=lambda p: {"axes": p["axes"]},
    by_axes=True, unreduces=True)

def _unreduced_psum_abstract(x, *, axes):
    """The sum of partial sums over ``axes``: the same total on every device (JAX's
    ``unreduced_psum``, Unreduced -> Invariant)."""
    if not x.unreduced & set(axes):
        raise errors.VmaError(
            f"unreduced_psum is a Unreduced -> Invariant collective. This means that the "
            f"axes={axes} passed to `unreduced_psum` must be present in "
            f"jax.typeof(x).mat.unreduced={set(x.unreduced) or 'frozenset()'} (JAX's words)")
    if x.vma & set(axes):
        raise errors.VmaError(
            f"unreduced_psum's input cannot be varying across the  axis_name provided. Got "
            f"x={x.str_short()} and axes={axes} (JAX's words)")
    return x.update(unreduced=x.unreduced - set(axes), weak_type=False)

unreduced_psum = _collective(
    "unreduced_psum", "psum", lambda g: _psum(g), _unreduced_psum_abstract, _all_reduce_bytes,
    lambda ct, ins, outs, wants, axes: [ct] if wants[0] else [None],
    hlo="all-reduce", unreduces=True, reduction=True)
unreduced_psum.show = lambda p: {"axes": p["axes"]}

def _gather_invariant_abstract(x, **params):
    out = _gather_abstract(x, **params)
    return out.update(vma=x.vma - set(params["axis_name"]) if context.run is not None
                      and context.run.check_vma else frozenset())

def _gather_invariant_vjp(ct, ins, outs, wants, *, all_gather_dimension, axis_name,
                          axis_size, tiled, axis_index_groups=None):
    """The cotangent is the same on every device; each takes back its own slice (JAX
    transposes all_gather_invariant to a dynamic_slice at its axis_index)."""
    if not wants[0] or ct is None:
        return [None]
    d = all_gather_dimension
    size = aval_of(ct).shape[d] // axis_size
    start = bind(mul, bind(axis_index, axis_name=tuple(axis_name)), np.int32(size))
    starts = [start if k == d else np.int32(0) for k in range(aval_of(ct).ndim)]
    sizes = tuple(size if k == d else n for k, n in enumerate(aval_of(ct).shape))
    out = bind(dynamic_slice, ct, *starts, slice_sizes=sizes)
    return [out if tiled else bind(squeeze, out, dimensions=(d,))]

all_gather_invariant = _collective(   # all_gather(..., to='invarying'): Varying -> Invariant
    "all_gather_invariant", "all_gather", _all_gather, _gather_invariant_abstract,
    _all_gather_bytes, _gather_invariant_vjp,
    lambda p: {"axis": p["all_gather_dimension"], "tiled": p["tiled"]}, hlo="all-gather")
all_gather_invariant.show = lambda p: {k: p[k] for k in (
    "all_gather_dimension", "axis_name", "axis_size", "tiled")}

def _preduced_abstract(x, *, axes):
    """``pcast(x, axes, to='reduced')``: an invariant value typed as reduced over ``axes``,
    the same on every device as after a sum over them (JAX's ``preduced``; its cotangent
    is then the parts of a sum, summed once by ``unreduced_psum``)."""
    if x.vma & set(axes):
        raise errors.VmaError(
            f"preduced is a Invariant->Reduced collective. This means that the axis names "
            f"mentioned in `axes` passed to `preduced` must not be present in "
            f"`jax.typeof(inp).mat.varying`. Got axes={axes} and jax.typeof(inp).mat.varying="
            f"{set(x.vma)} (JAX's words)")
    if x.reduced & set(axes):
        raise errors.VmaError(f"preduced input cannot be reduced across the axis_name "
                              f"provided. Got x={x.str_short()} and axis_name={axes} (JAX's words)")
    return x.update(reduced=x.reduced | set(axes))

def _summed_ct(ct, axes):
    """preduced's transpose: the cotangent's parts, one per device, summed (unreduced_psum);
    a cotangent that is no sum of parts (check_vma=False) passes as it is."""
    if ct is None or not aval_of(ct).unreduced & set(axes):
        return ct
    return bind(unreduced_psum, ct, axes=axes)

preduced = Primitive(   # no data moves: the type now says reduced over axes
    "preduced", lambda x, axes: x, _preduced_abstract,
    vjp=lambda ct, ins, outs, wants, axes: [_summed_ct(ct, axes)] if wants[0] else [None],
    cost=lambda ins, outs, **p: (0, 0), show=lambda p: {"axes": p["axes"]},
    by_axes=True, unreduces=True)

def _reduced_vary_abstract(x, *, axes):
    """A reduced value typed as varying over ``axes`` (JAX's ``reduced_vary_cast``, which
    JAX inserts where a reduced value meets one varying over the same axes)."""
    if not x.reduced >= set(axes):
        raise errors.VmaError(f"reduced_vary_cast casts a value reduced over {axes}; got "
                              f"{x.str_short()}")
    return x.update(reduced=x.reduced - set(axes), vma=x.vma | set(axes))

reduced_vary_cast = Primitive(   # no data moves; its transpose makes the parts of a sum
    "reduced_vary_cast", lambda x, axes: x, _reduced_vary_abstract,
    vjp=lambda ct, ins, outs, wants, axes: [
        None if ct is None else bind(vary_unreduced_cast, ct, axes=axes)] if wants[0] else [None],
    cost=lambda ins, outs, **p: (0, 0), show=lambda p: {"axes": p["axes"]},
    by_axes=True, unreduces=True)
