"""The cost model's columns of each primitive's row, in the cost model's own table.

A primitive is one row of facts (``simpmd.core.core.Primitive``); the cost model keeps its
own columns of the rows it needs in :data:`TABLE`, keyed by the row object, as JAX keeps
its roofline rules in its own table (``jax.experimental.roofline``'s ``_rooflines``,
filled by ``register_roofline(prim)``): the row itself is the same whatever is imported.
The core's and the partitioner's rows are registered here; a row defined in a later layer
(the planner's fused kernels) registers its columns beside its definition, with
:func:`register`. The columns (:data:`DEFAULTS` is the schema: any other name is an error):

* ``jax_names``: the names ``jax.make_jaxpr`` gives this operation, so that a jaxpr of
  real JAX is costed by simpmd's row (JAX prints a vma-typed psum as ``psum_invariant``);
* ``lax_names``: the ``jax.lax`` spellings that bind this row (``pshuffle`` is a ppermute);
* ``matmul``: a matrix product, which JAX's fused ``flops`` and ``hbm_bytes`` count alone;
* ``collective_family``: the collective it performs on the wire (``'all_reduce'``, ...),
  what :func:`simpmd.cost.estimate` prices; None for one that sends nothing;
* ``ici_rule(nbytes, in_avals, axes, sizes, perm)``: the bytes ``jax.experimental.roofline``
  counts as its ``ici_bytes`` on each mesh axis it runs over
  (jax/experimental/roofline/rooflines.py, the same in jax 0.7.2, 0.10.2 and 0.12.0.1);
* ``same_buffer``: its result is its operand under a new type or name (``pvary``,
  ``checkpoint_name``): no new bytes, on hardware as in simpmd's memory walk;
* ``vector_flops(ins, outs, **params)``: of a matmul row's FLOPs, those its kernel runs on
  the vector units rather than the matrix units (a fused attention kernel's dropout);
* ``attention_pass``: ``'forward'`` or ``'backward'`` for a fused attention kernel, which a
  preset that has measured such kernels times at their rate, not large GEMMs'
  (:meth:`simpmd.cost.hardware.Hardware.sustained_attention_flops`).

* ``fusion``: how XLA's fusion treats it (``'view'``, ``'broadcast'``, ``'elementwise'``,
  ``'reduction'``, ``'matmul'``, ``'opaque'``, ``'in_place'``), or a rule of its parameters
  giving one; ``keeps(params, invars)``: the buffers a view keeps alive as long as its
  readers run; ``slice_view``: a slice its readers read where it lies; ``fuses_into_dot``:
  a layout move a product reads as part of its operand load and can write its result in;
  ``writes_transposed``: a product that can write its result in the transposed layout;
  ``accumulates``: an addition a producer of its operand's shape can do in place
  (``'sum'``; ``'gradients'``, autodiff's ``add_any``); ``selects``: a select whose
  constant predicate picks its case; ``eager_piece``: eager PyTorch's piece of a
  concatenation (autodiff's ``pad`` of a split's gradient). :mod:`simpmd.cost.fusion`
  says what XLA does with each.

A row without a column has none of these: no JAX name but its own, not a matmul, no
collective family, no ICI bytes (read with :func:`column`).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import collectives as C
from ..core import loops as L
from ..core import primitives as P
from ..core.core import PRIMITIVES
from ..partitioner.columns import Columns
from ..partitioner.moves import shard_slice
from ..partitioner.rows import reshard_p

_COLUMNS = Columns(
    "cost", "simpmd/cost/rows.py", jax_names=(), lax_names=(), matmul=False,
    collective_family=None, ici_rule=None, same_buffer=False, vector_flops=None,
    attention_pass=None, fusion=None, keeps=None, slice_view=False, fuses_into_dot=False,
    writes_transposed=False, accumulates=None, selects=False, eager_piece=False)
TABLE, DEFAULTS = _COLUMNS.table, _COLUMNS.defaults      # row -> {column: value}; the schema
register, column = _COLUMNS.register, _COLUMNS.column


def _ring(nbytes, axes, sizes, reduce):
    """JAX's ring rule: the data split evenly over the axes, each phase sending a shard
    (p - 1) times along one axis, largest axis first; every axis is charged the total."""
    shard = nbytes / math.prod(sizes[a] for a in axes) if reduce else nbytes
    order = sorted(axes, key=lambda a: sizes[a], reverse=True)
    shard //= len(order)
    total = 0
    for a in order:
        total += shard * (sizes[a] - 1)
        shard *= sizes[a]
    return total


def _all_reduce_ici(nbytes, avals, axes, sizes, perm):
    """A reduce-scatter and an all-gather."""
    return 2 * int(_ring(nbytes, axes, sizes, True))


def _max_ici(nbytes, avals, axes, sizes, perm):
    """JAX counts one element per operand for pmax and pmin."""
    return int(_ring(sum(a.dtype.itemsize for a in avals), axes, sizes, False))


def _all_to_all_ici(nbytes, avals, axes, sizes, perm):
    """Half the data crosses the bisection of the smallest axis (twice as wide when it
    has more than two devices, for the wraparound)."""
    size = nbytes * math.prod(sizes[a] for a in axes)
    smallest = sizes[sorted(axes, key=lambda a: sizes[a])[0]]
    bisection = smallest ** (len(axes) - 1) * (2 if smallest > 2 else 1)
    return int(size / 2 / bisection)


def _permute_ici(nbytes, avals, axes, sizes, perm):
    """The busiest link's load: each pair routed the short way round along each axis."""
    dims = [sizes.get(a, 1) for a in axes]
    load: dict = {}
    for src, dst in perm:
        if src == dst:
            continue
        here = [int(i) for i in np.unravel_index(src, dims)]
        there = [int(i) for i in np.unravel_index(dst, dims)]
        for i, q in enumerate(dims):
            step = 1 if (there[i] - here[i]) % q <= (here[i] - there[i]) % q else -1
            while here[i] != there[i]:
                nxt = list(here)
                nxt[i] = (here[i] + step) % q
                link = tuple(sorted([tuple(here), tuple(nxt)]))
                load[link] = load.get(link, 0) + 1
                here = nxt
    return int(nbytes * max(load.values(), default=0))


for _r in (C.psum, C.pmean):
    register(_r, collective_family="all_reduce", ici_rule=_all_reduce_ici)
for _r in (C.pmax, C.pmin):
    register(_r, collective_family="all_reduce", ici_rule=_max_ici)
register(C.psum, jax_names=("psum", "psum_invariant", "psum2"))
register(C.all_gather, jax_names=("all_gather", "all_gather_invariant"),
         collective_family="all_gather",
         ici_rule=lambda nbytes, avals, axes, sizes, perm: int(_ring(nbytes, axes, sizes, False)))
register(C.reduce_scatter, jax_names=("reduce_scatter", "psum_scatter"),
         collective_family="reduce_scatter",
         ici_rule=lambda nbytes, avals, axes, sizes, perm: int(_ring(nbytes, axes, sizes, True)))
register(C.all_to_all, lax_names=("all_to_all", "pswapaxes"), collective_family="all_to_all",
         ici_rule=_all_to_all_ici)
register(C.ppermute, lax_names=("ppermute", "pshuffle"), collective_family="collective_permute",
         ici_rule=_permute_ici)
register(P.dot_general, matmul=True)
register(P.copy, jax_names=("copy", "copy_p"))
register(C.pvary, same_buffer=True)
register(L.name_p, same_buffer=True)

# How XLA's fusion treats each row (simpmd.cost.fusion reads these).
for _rows, _kind in (
        ((P.reshape, P.squeeze, P.copy, C.pvary, C.axis_index, L.name_p, reshard_p), "view"),
        ((P.broadcast_in_dim,), "broadcast"),
        ((P.convert_element_type, P.select_n, P.clamp, P.transpose, P.slice_, P.pad, P.rev,
          P.concatenate, P.gather, P.iota, P.dynamic_slice, shard_slice), "elementwise"),
        ((P.reduce_sum, P.reduce_max, P.reduce_min, P.reduce_prod, P.reduce_and, P.reduce_or,
          P.argmax, P.argmin), "reduction"),
        ((P.dot_general,), "matmul"),
        ((P.sort, P.cumsum, P.cumprod, P.cummax, P.cummin, P.numpy_call), "opaque"),
        ((P.scatter, P.scatter_add, P.scatter_mul, P.scatter_min, P.scatter_max,
          P.dynamic_update_slice), "in_place")):
    for _r in _rows:
        register(_r, fusion=_kind)
for _r in (P.slice_, P.dynamic_slice, shard_slice, P.gather):
    register(_r, slice_view=True)
register(P.transpose, fuses_into_dot=True)
register(P.dot_general, writes_transposed=True)
register(P.add, accumulates="sum")
register(P.add_any, accumulates="gradients")
register(P.select_n, selects=True)
register(P.pad, eager_piece=True)

COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "collective_permute")


def by_jax_name() -> dict:
    """Every row under each name a jaxpr of real JAX (or simpmd) gives it."""
    found = {}
    for row in list(PRIMITIVES.values()):
        for name in (row.name, *column(row, "jax_names")):
            found.setdefault(name, row)
    return found


def by_lax_name() -> dict:
    """Every collective row under its ``jax.lax`` spellings (``'psum'``, ``'pshuffle'``)."""
    found = {}
    for row in list(PRIMITIVES.values()):
        if row.collective:
            for name in (row.op, row.name, *column(row, "lax_names")):
                found.setdefault(name, row)
    return found


def collective_of(op: str):
    """The collective a ``lax`` op performs (``'psum'`` -> ``'all_reduce'``), or None if none."""
    if op in COLLECTIVES:
        return op
    row = by_lax_name().get(op)
    if row is None:
        raise ValueError(f"unknown collective {op!r}; expected one of {sorted(COLLECTIVES)} "
                         f"or a jax.lax name such as {sorted(by_lax_name())}")
    return column(row, "collective_family")
