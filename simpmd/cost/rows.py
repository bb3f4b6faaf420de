"""The cost model's columns of each primitive's row, set on the row itself.

A primitive is one row of facts (``simpmd.core.core.Primitive``); the cost model adds its
own columns to the rows it needs, here, by the row object, as JAX registers a roofline
rule beside its primitive (``register_roofline(prim)``). The columns:

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

* ``fusion``, ``keeps``, ``slice_view``, ``fuses_into_dot``, ``writes_transposed``,
  ``accumulates``, ``selects``, ``eager_piece``: how XLA's fusion treats it, set and
  described in :mod:`simpmd.cost.fusion`.

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

DEFAULTS = {"jax_names": (), "lax_names": (), "matmul": False, "collective_family": None,
            "ici_rule": None, "same_buffer": False, "vector_flops": None,
            "attention_pass": None, "fusion": None, "keeps": None, "slice_view": False,
            "fuses_into_dot": False, "writes_transposed": False, "accumulates": None,
            "selects": False, "eager_piece": False}


def column(row, name):
    """Row ``row``'s cost column ``name``, or its default when the row has none (or no row)."""
    return getattr(row, name, DEFAULTS[name]) if row is not None else DEFAULTS[name]


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


def _columns(row, **columns):
    for key, value in columns.items():
        setattr(row, key, value)


for _r in (C.psum, C.pmean):
    _columns(_r, collective_family="all_reduce", ici_rule=_all_reduce_ici)
for _r in (C.pmax, C.pmin):
    _columns(_r, collective_family="all_reduce", ici_rule=_max_ici)
_columns(C.psum, jax_names=("psum", "psum_invariant", "psum2"))
_columns(C.all_gather, jax_names=("all_gather", "all_gather_invariant"),
         collective_family="all_gather",
         ici_rule=lambda nbytes, avals, axes, sizes, perm: int(_ring(nbytes, axes, sizes, False)))
_columns(C.reduce_scatter, jax_names=("reduce_scatter", "psum_scatter"),
         collective_family="reduce_scatter",
         ici_rule=lambda nbytes, avals, axes, sizes, perm: int(_ring(nbytes, axes, sizes, True)))
_columns(C.all_to_all, lax_names=("all_to_all", "pswapaxes"), collective_family="all_to_all",
         ici_rule=_all_to_all_ici)
_columns(C.ppermute, lax_names=("ppermute", "pshuffle"), collective_family="collective_permute",
         ici_rule=_permute_ici)
_columns(P.dot_general, matmul=True)
_columns(P.copy, jax_names=("copy", "copy_p"))
_columns(C.pvary, same_buffer=True)
_columns(L.name_p, same_buffer=True)

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
        if getattr(row, "collective", False):
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
