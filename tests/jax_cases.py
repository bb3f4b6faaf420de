"""Programs that run on simpmd and on real JAX, for the cross-check in test_vs_jax.py.

Each case is one small SPMD program written once: ``make(lax)`` builds the body from a
``lax`` module, so the very same Python function runs with ``simpmd.lax`` on the
simulated mesh and with ``jax.lax`` under ``jax.pmap``. The body only uses operators
and array methods (``x * 2``, ``x.sum()``, ``x.reshape(...)``), which both engines'
device values support.

Nested cases (``nested=(outer, inner)``) use the original nested-``pmap`` semantics on
simpmd: ``pmap(lambda *a: post(pmap(inner_body, inner)(*a)), outer)``. Real JAX 0.10 no
longer runs nested pmap, so the reference is either ``pmap(vmap(...))`` (``jax="vmap"``)
or ``shard_map`` over a 2-D mesh (``jax="shard_map"``, for what pmap-of-vmap cannot do:
``all_gather`` over a tuple of axes, ``axis_index_groups`` on the inner axis).

A few cases cannot be checked against JAX 0.10 because JAX itself is wrong there
(``jax=None``); each names the JAX bug and carries a NumPy closed form (``expected``)
instead. The NumPy closed forms below are written from the collectives' definitions in
the jax.lax documentation and never call simpmd; the test suite checks them against
JAX on the axes where JAX works, so they are trustworthy where it does not.

This module never imports JAX or simpmd.
"""
from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

Pair = namedtuple("Pair", "a b")


@dataclass(frozen=True)
class Case:
    name: str
    make: Callable[[Any], Any]        # make(lax) -> body, or (inner_body, post) if nested
    args: Callable[[], tuple]         # the program's arguments (NumPy arrays, pytrees)
    axis_name: Any = "i"
    in_axes: Any = 0
    out_axes: Any = 0
    static_broadcasted_argnums: tuple = ()
    devices: tuple | None = None      # indices into devices(), resolved per engine
    nested: tuple | None = None       # (outer_axis, inner_axis)
    jax: str | None = "pmap"          # "pmap", "vmap", "shard_map", or None (JAX bug)
    jax_bug: str = ""                 # why JAX is not the reference for this case
    expected: Callable | None = None  # NumPy closed form: expected(*args) -> result tree
    refusal_ok: bool = False          # simpmd may refuse (a clear error) instead of run
    exact_dtype: bool = True          # float results must match JAX's float width
    tags: tuple = field(default_factory=tuple)

    def pmap_kwargs(self) -> dict:
        kw = dict(in_axes=self.in_axes, out_axes=self.out_axes)
        if self.static_broadcasted_argnums:
            kw["static_broadcasted_argnums"] = self.static_broadcasted_argnums
        return kw


# -- inputs ------------------------------------------------------------------------------

def ar(*shape, start=0.0):
    """arange reshaped, float32: easy to read in a failure message."""
    return (np.arange(int(np.prod(shape)), dtype=np.float32) + start).reshape(shape)


def rnd(*shape, seed=0):
    """Standard normal float32 values: no symmetry that could hide a wrong axis."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- NumPy closed forms (from the jax.lax docs; never simpmd) ------------------------------

def np_all_to_all(stacked, split_axis, concat_axis, tiled=False, groups=None):
    """all_to_all over the leading (device) axis of ``stacked``.

    Member ``d`` of a group of ``n`` receives chunk ``d`` of every member's value (split
    along ``split_axis`` into ``n`` chunks) and joins them in member order along
    ``concat_axis``; without ``tiled`` the split axis (of size ``n``) disappears and a
    new axis of size ``n`` appears at ``concat_axis``.
    """
    stacked = np.asarray(stacked)
    n_dev, ndim = stacked.shape[0], stacked.ndim - 1
    groups = groups or [list(range(n_dev))]
    s, c = split_axis % ndim, concat_axis % ndim
    out = [None] * n_dev
    for group in groups:
        n = len(group)
        for d_pos, d in enumerate(group):
            if tiled:
                parts = [np.split(stacked[src], n, axis=s)[d_pos] for src in group]
                out[d] = np.concatenate(parts, axis=c)
            else:
                parts = [np.take(stacked[src], d_pos, axis=s) for src in group]
                out[d] = np.stack(parts, axis=c)
    return np.stack(out)


def np_psum_scatter(stacked, scatter_dimension, tiled=False):
    """Sum over devices, then device ``d`` keeps block ``d`` along ``scatter_dimension``."""
    stacked = np.asarray(stacked, dtype=np.float64)
    n = stacked.shape[0]
    total = stacked.sum(axis=0)
    dim = scatter_dimension % total.ndim
    if tiled:
        return np.stack(np.split(total, n, axis=dim)).astype(np.float32)
    return np.stack([np.take(total, d, axis=dim) for d in range(n)]).astype(np.float32)


def np_pswapaxes(stacked, axis):
    """pswapaxes(x, name, axis) is all_to_all(x, name, axis, axis): the size of ``axis``
    must equal the axis size, and element ``[.., j, ..]`` of device ``d`` goes to device
    ``j``, at ``[.., d, ..]``."""
    return np_all_to_all(stacked, axis, axis)


def np_group_mean(stacked, groups):
    stacked = np.asarray(stacked, dtype=np.float64)
    out = np.empty_like(stacked)
    for g in groups:
        out[g] = stacked[g].mean(axis=0)
    return out.astype(np.float32)


# -- the cases ----------------------------------------------------------------------------

CASES: list[Case] = []


def case(name, make, args, **kw):
    CASES.append(Case(name, make, args, **kw))


CONTIG = [[0, 1, 2, 3], [4, 5, 6, 7]]
INTERLEAVED = [[0, 2, 4, 6], [1, 3, 5, 7]]
PAIRS = [[0, 1], [2, 3], [4, 5], [6, 7]]
UNEQUAL = [[0, 1, 2], [3, 4, 5, 6, 7]]
UNEQUAL_SCATTERED = [[5], [0, 1, 2, 3, 4, 6, 7]]

# reductions on arrays
case("psum_scaled_issue_example", lambda lax: lambda x: lax.psum(x * 2.0, "devices"),
     lambda: (np.arange(8.0, dtype=np.float32),), axis_name="devices",
     expected=lambda x: np.full(8, 56.0, np.float32))
case("psum_array", lambda lax: lambda x: lax.psum(x, "i"), lambda: (rnd(8, 3, 4),))
case("pmean_array", lambda lax: lambda x: lax.pmean(x, "i"), lambda: (rnd(8, 3, 4, seed=1),))
case("pmax_array", lambda lax: lambda x: lax.pmax(x, "i"), lambda: (rnd(8, 3, 4, seed=2),))
case("pmin_array", lambda lax: lambda x: lax.pmin(x, "i"), lambda: (rnd(8, 3, 4, seed=3),))
case("psum_scalar_shards", lambda lax: lambda x: lax.psum(x, "i"), lambda: (ar(8),))

# reductions on pytrees
case("psum_dict", lambda lax: lambda t: lax.psum(t, "i"),
     lambda: ({"w": rnd(8, 3, 2), "b": rnd(8, seed=1)},))
case("pmean_list", lambda lax: lambda t: lax.pmean(t, "i"),
     lambda: ([rnd(8, 2), rnd(8, 3, 1, seed=1)],))
case("pmax_tuple", lambda lax: lambda a, b: lax.pmax((a, b * 2), "i"),
     lambda: (rnd(8, 4), rnd(8, 2, 2, seed=1)))
case("pmin_namedtuple", lambda lax: lambda t: lax.pmin(t, "i"),
     lambda: (Pair(rnd(8, 3), rnd(8, seed=1)),))
case("psum_none_leaves", lambda lax: lambda t: lax.psum(t, "i"),
     lambda: ({"a": ar(8, 2), "b": None, "c": [None, rnd(8, 3)]},))
case("psum_namedtuple_in_dict_out", lambda lax: lambda t: {"s": lax.psum(t, "i"), "m": lax.pmax(t.a, "i")},
     lambda: (Pair(rnd(8, 3, seed=4), rnd(8, 2, seed=5)),))

# axis_index_groups
case("psum_groups_contiguous", lambda lax: lambda x: lax.psum(x, "i", axis_index_groups=CONTIG),
     lambda: (rnd(8, 3),))
case("psum_groups_interleaved", lambda lax: lambda x: lax.psum(x, "i", axis_index_groups=INTERLEAVED),
     lambda: (rnd(8, 3, seed=1),))
case("psum_groups_unequal", lambda lax: lambda x: lax.psum(x, "i", axis_index_groups=UNEQUAL),
     lambda: (ar(8, 3),), tags=("unequal_groups",))
case("psum_groups_unequal_scattered",
     lambda lax: lambda x: lax.psum(x, "i", axis_index_groups=UNEQUAL_SCATTERED),
     lambda: (ar(8, 2),), tags=("unequal_groups",))
case("pmean_groups_pairs", lambda lax: lambda x: lax.pmean(x, "i", axis_index_groups=PAIRS),
     lambda: (rnd(8, 3, seed=2),), expected=lambda x: np_group_mean(x, PAIRS))
case("pmax_groups_interleaved", lambda lax: lambda x: lax.pmax(x, "i", axis_index_groups=INTERLEAVED),
     lambda: (rnd(8, 3, seed=3),))
case("pmin_groups_contiguous", lambda lax: lambda x: lax.pmin(x, "i", axis_index_groups=CONTIG),
     lambda: (rnd(8, 3, seed=4),))
case("psum_groups_pytree", lambda lax: lambda t: lax.psum(t, "i", axis_index_groups=INTERLEAVED),
     lambda: ({"a": rnd(8, 2), "b": [rnd(8, seed=1)]},))
# jax 0.10 bug: pmean with unequal axis_index_groups divides every group's sum by the size
# of the FIRST group (psum 9, 75 over [[0,1,2],[3..7]] -> 3, 25 instead of 3, 15). JAX is
# not the reference; simpmd must give the true per-group mean or refuse unequal groups.
case("pmean_groups_unequal", lambda lax: lambda x: lax.pmean(x, "i", axis_index_groups=UNEQUAL),
     lambda: (ar(8, 3),), jax=None, refusal_ok=True,
     jax_bug="jax 0.10 pmean with unequal axis_index_groups divides by len(groups[0])",
     expected=lambda x: np_group_mean(x, UNEQUAL))

# constants, ints, axis_index, axis_size
case("psum_python_int", lambda lax: lambda x: lax.psum(1, "i"), lambda: (ar(8),), exact_dtype=False)
case("psum_python_float", lambda lax: lambda x: lax.psum(2.5, "i"), lambda: (ar(8),))
case("pmean_ints", lambda lax: lambda x: lax.pmean(x, "i"),
     lambda: (np.arange(8, dtype=np.int32) * 3,), exact_dtype=False)
case("pmax_ints", lambda lax: lambda x: lax.pmax(x, "i"),
     lambda: (np.array([3, -1, 7, 2, 7, 0, -5, 1], dtype=np.int32),), exact_dtype=False)
case("axis_index", lambda lax: lambda x: lax.axis_index("i"), lambda: (ar(8),), exact_dtype=False)
case("axis_size", lambda lax: lambda x: lax.axis_size("i"), lambda: (ar(8),), exact_dtype=False)
# JAX: float32 * axis_index (int32) stays float32; plain NumPy would promote to float64.
case("axis_index_arith", lambda lax: lambda x: x * lax.axis_index("i") + lax.axis_size("i"),
     lambda: (rnd(8, 3),))

# all_gather
for _ax in (0, 1, 2, -1):
    for _tiled in (False, True):
        case(f"all_gather_axis{_ax}{'_tiled' if _tiled else ''}",
             (lambda a, t: lambda lax: lambda x: lax.all_gather(x, "i", axis=a, tiled=t))(_ax, _tiled),
             (lambda a: lambda: (rnd(8, 2, 3, 4, seed=10 + a),))(_ax))
case("all_gather_groups_interleaved_axis1",
     lambda lax: lambda x: lax.all_gather(x, "i", axis=1, axis_index_groups=INTERLEAVED),
     lambda: (rnd(8, 2, 3),))
case("all_gather_groups_contiguous_tiled",
     lambda lax: lambda x: lax.all_gather(x, "i", axis_index_groups=CONTIG, tiled=True),
     lambda: (rnd(8, 2, 3, seed=1),))
case("all_gather_pytree", lambda lax: lambda t: lax.all_gather(t, "i"),
     lambda: ({"a": rnd(8, 2), "b": rnd(8, seed=1)},))

# psum_scatter
case("psum_scatter_dim0", lambda lax: lambda x: lax.psum_scatter(x, "i"), lambda: (rnd(8, 8, 3),),
     expected=lambda x: np_psum_scatter(x, 0))
case("psum_scatter_dim1",
     lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=1), lambda: (rnd(8, 3, 8, 2, seed=1),),
     expected=lambda x: np_psum_scatter(x, 1))
case("psum_scatter_dim0_tiled",
     lambda lax: lambda x: lax.psum_scatter(x, "i", tiled=True), lambda: (rnd(8, 16, 3, seed=2),),
     expected=lambda x: np_psum_scatter(x, 0, tiled=True))
case("psum_scatter_dim1_tiled",
     lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=1, tiled=True),
     lambda: (rnd(8, 3, 16, seed=3),), expected=lambda x: np_psum_scatter(x, 1, tiled=True))
case("psum_scatter_dim2_tiled",
     lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=2, tiled=True),
     lambda: (rnd(8, 2, 3, 24, seed=4),))
case("psum_scatter_groups_contiguous",
     lambda lax: lambda x: lax.psum_scatter(x, "i", axis_index_groups=CONTIG), lambda: (rnd(8, 4, 3, seed=5),))
case("psum_scatter_groups_interleaved_tiled_dim1",
     lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=1, axis_index_groups=INTERLEAVED,
                                            tiled=True),
     lambda: (rnd(8, 3, 8, seed=6),))

# ppermute / pshuffle
RING = [(i, (i + 1) % 8) for i in range(8)]
case("ppermute_ring", lambda lax: lambda x: lax.ppermute(x, "i", RING), lambda: (ar(8, 3),))
case("ppermute_ring_back3", lambda lax: lambda x: lax.ppermute(x, "i", [(i, (i - 3) % 8) for i in range(8)]),
     lambda: (rnd(8, 2, 2),))
case("ppermute_partial", lambda lax: lambda x: lax.ppermute(x, "i", [(0, 3), (5, 1)]),
     lambda: (ar(8, 3, start=1.0),))
case("ppermute_partial_swaps_and_self", lambda lax: lambda x: lax.ppermute(x, "i", [(0, 1), (1, 0), (6, 6), (4, 7)]),
     lambda: (ar(8, 2, start=1.0),))
case("ppermute_pytree", lambda lax: lambda t: lax.ppermute(t, "i", RING[::-1]),
     lambda: ({"a": rnd(8, 2), "b": (rnd(8, seed=1),)},))
case("pshuffle", lambda lax: lambda x: lax.pshuffle(x, "i", [3, 1, 4, 0, 7, 2, 6, 5]),
     lambda: (ar(8, 2, 3),))
case("pshuffle_reverse", lambda lax: lambda x: lax.pshuffle(x, "i", list(range(7, -1, -1))),
     lambda: (rnd(8, 3),))

# all_to_all: 3-D per-device values whose dims all differ, so a wrong axis shows
_A2A_SHAPES = {  # (split, concat, tiled) -> per-device shape
    (0, 0, False): (8, 3, 5), (0, 0, True): (16, 3, 5),
    (0, 1, False): (8, 3, 5), (0, 1, True): (16, 3, 5),
    (1, 0, False): (3, 8, 5), (1, 0, True): (3, 16, 5),
    (1, 2, False): (3, 8, 5), (1, 2, True): (3, 16, 5),
    (2, 0, True): (3, 5, 8), (0, 2, False): (8, 3, 5),
}
for (_s, _c, _t), _shape in _A2A_SHAPES.items():
    case(f"all_to_all_{_s}{_c}{'_tiled' if _t else ''}",
         (lambda s, c, t: lambda lax: lambda x: lax.all_to_all(x, "i", s, c, tiled=t))(_s, _c, _t),
         (lambda shp, seed: lambda: (rnd(8, *shp, seed=seed),))(_shape, 20 + _s * 3 + _c),
         expected=(lambda s, c, t: lambda x: np_all_to_all(x, s, c, t))(_s, _c, _t))
case("all_to_all_groups_contiguous_01",
     lambda lax: lambda x: lax.all_to_all(x, "i", 0, 1, axis_index_groups=CONTIG),
     lambda: (rnd(8, 4, 3, 2),), expected=lambda x: np_all_to_all(x, 0, 1, groups=CONTIG))
case("all_to_all_groups_interleaved_tiled_10",
     lambda lax: lambda x: lax.all_to_all(x, "i", 1, 0, axis_index_groups=INTERLEAVED, tiled=True),
     lambda: (rnd(8, 3, 8, 2, seed=1),),
     expected=lambda x: np_all_to_all(x, 1, 0, tiled=True, groups=INTERLEAVED))
case("pswapaxes_axis1", lambda lax: lambda x: lax.pswapaxes(x, "i", 1), lambda: (rnd(8, 3, 8, 2),),
     expected=lambda x: np_pswapaxes(x, 1))
case("pswapaxes_axis0", lambda lax: lambda x: lax.pswapaxes(x, "i", 0), lambda: (ar(8, 8, 2),),
     expected=lambda x: np_pswapaxes(x, 0))
case("pswapaxes_groups", lambda lax: lambda x: lax.pswapaxes(x, "i", 1, axis_index_groups=CONTIG),
     lambda: (rnd(8, 2, 4, 3, seed=2),))

# Negative collective axes: jax 0.10 SEGFAULTS the whole process while lowering these
# (fixed in jax 0.11), so they are never run on JAX in-process; NumPy closed forms instead.
_NEG_BUG = "jax 0.10 segfaults lowering negative split_axis/concat_axis/scatter_dimension/pswapaxes axis"
case("all_to_all_neg_axes", lambda lax: lambda x: lax.all_to_all(x, "i", -3, -1),
     lambda: (rnd(8, 8, 3, 5, seed=30),), jax=None, jax_bug=_NEG_BUG,
     expected=lambda x: np_all_to_all(x, 0, 2))
case("all_to_all_neg_axes_tiled", lambda lax: lambda x: lax.all_to_all(x, "i", -2, -3, tiled=True),
     lambda: (rnd(8, 3, 16, 5, seed=31),), jax=None, jax_bug=_NEG_BUG,
     expected=lambda x: np_all_to_all(x, 1, 0, tiled=True))
case("psum_scatter_neg_dim", lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=-1),
     lambda: (rnd(8, 3, 8, seed=32),), jax=None, jax_bug=_NEG_BUG,
     expected=lambda x: np_psum_scatter(x, 1))
case("psum_scatter_neg_dim_tiled", lambda lax: lambda x: lax.psum_scatter(x, "i", scatter_dimension=-2, tiled=True),
     lambda: (rnd(8, 16, 3, seed=33),), jax=None, jax_bug=_NEG_BUG,
     expected=lambda x: np_psum_scatter(x, 0, tiled=True))
case("pswapaxes_neg_axis", lambda lax: lambda x: lax.pswapaxes(x, "i", -1),
     lambda: (rnd(8, 3, 8, seed=34),), jax=None, jax_bug=_NEG_BUG,
     expected=lambda x: np_pswapaxes(x, 1))

# pmap keywords
case("in_axes_broadcast_none", lambda lax: lambda x, w: lax.psum(x * w, "i"),
     lambda: (rnd(8, 3), rnd(3, seed=1)), in_axes=(0, None))
case("in_axes_1", lambda lax: lambda x: (x.sum(0), lax.axis_index("i")),
     lambda: (rnd(3, 8, 5),), in_axes=1)
case("in_axes_dict_prefix", lambda lax: lambda d: d["a"] * d["b"].sum() + lax.pmax(d["a"], "i"),
     lambda: ({"a": rnd(8, 3), "b": rnd(3, seed=1)},), in_axes=({"a": 0, "b": None},))
case("in_axes_nested_prefix", lambda lax: lambda p, z: p[0] * p[1] + z.sum(),
     lambda: ((rnd(8, 3), rnd(3, seed=1)), rnd(2, 8, seed=2)), in_axes=((0, None), 1))
case("out_axes_1", lambda lax: lambda x: x * 2 - x.mean(0), lambda: (rnd(8, 3, 5),), out_axes=1)
case("out_axes_2", lambda lax: lambda x: x * 2, lambda: (rnd(8, 3, 5),), out_axes=2)
case("out_axes_none_replicated", lambda lax: lambda x: lax.psum(x, "i"), lambda: (rnd(8, 3, 5),),
     out_axes=None)
case("out_axes_tuple_prefix", lambda lax: lambda x: (x * 2, lax.pmean(x, "i")), lambda: (rnd(8, 3),),
     out_axes=(1, None))
case("static_broadcasted_argnums", lambda lax: lambda x, n, shape: lax.psum(x * n, "i").reshape(shape),
     lambda: (rnd(8, 6), 3, (2, 3)), static_broadcasted_argnums=(1, 2))
case("devices_subset", lambda lax: lambda x: (lax.psum(x, "i"), lax.axis_index("i")),
     lambda: (rnd(4, 3),), devices=(2, 3, 4, 5))
case("mapped_size_4_of_8", lambda lax: lambda x: lax.ppermute(lax.psum(x, "i") * x, "i", [(0, 1), (1, 2), (2, 3), (3, 0)]),
     lambda: (rnd(4, 3),))
case("mapped_size_4_all_gather", lambda lax: lambda x: lax.all_gather(x, "i", axis=1),
     lambda: (rnd(4, 2, 3),))
case("mapped_size_1", lambda lax: lambda x: lax.psum(x, "i") * lax.axis_size("i"), lambda: (rnd(1, 3),))
case("no_axis_name", lambda lax: lambda x, y: (x @ y, x.T.sum(axis=0)),
     lambda: (rnd(8, 2, 3), rnd(8, 3, 4, seed=1)), axis_name=None)

# Negative in_axes/out_axes: JAX documents them as unsupported; jax 0.10 returns a wrong
# shape for out_axes=-1 ((24, 5, 1) instead of (3, 5, 8)) and raises IndivisibleError for
# in_axes=-1. simpmd may refuse them with a clear error, or must get them right.
case("out_axes_neg1", lambda lax: lambda x: x * 2, lambda: (ar(8, 3, 5),), out_axes=-1,
     jax=None, refusal_ok=True, jax_bug="jax 0.10 pmap(out_axes=-1) returns shape (24, 5, 1)",
     expected=lambda x: np.moveaxis(x * 2, 0, -1))
case("in_axes_neg1", lambda lax: lambda x: x.sum(0), lambda: (ar(3, 5, 8),), in_axes=-1,
     jax=None, refusal_ok=True, jax_bug="jax 0.10 pmap(in_axes=-1) raises IndivisibleError",
     expected=lambda x: np.moveaxis(x, -1, 0).sum(1))

# nested pmap: outer 'data' over inner 'model'
NEST = ("data", "model")


def nested_case(name, make, args, jax="vmap", **kw):
    case(name, make, args, axis_name="data", nested=NEST, jax=jax, **kw)


# The worked check: psum(x * p, 'model') * 2 is 2*(0.5*(0+1)) = 1 and 2*(0.5*(2+3)) = 5
# for the two data rows; psum over 'data' gives 1 + 5 = 6 everywhere (not 12).
nested_case("nested_worked_check_2x2",
            lambda lax: (lambda x: lax.psum(x * 0.5, "model") * 2, lambda y: lax.psum(y, "data")),
            lambda: (np.arange(4.0, dtype=np.float32).reshape(2, 2),),
            expected=lambda x: np.full((2, 2), 6.0, np.float32))
nested_case("nested_psum_inner_2x4", lambda lax: (lambda x: lax.psum(x, "model"), None),
            lambda: (rnd(2, 4, 3),))
nested_case("nested_psum_outer_from_inner_2x4", lambda lax: (lambda x: lax.psum(x, "data"), None),
            lambda: (rnd(2, 4, 3, seed=1),))
nested_case("nested_psum_both_2x4", lambda lax: (lambda x: lax.psum(x, ("data", "model")), None),
            lambda: (rnd(2, 4, 3, seed=2),))
nested_case("nested_pmean_both_reversed_2x2", lambda lax: (lambda x: lax.pmean(x, ("model", "data")), None),
            lambda: (rnd(2, 2, 3, seed=3),))
nested_case("nested_pmax_outer_2x4", lambda lax: (lambda x: lax.pmax(x, "data"), None),
            lambda: (rnd(2, 4, 2, seed=4),))
nested_case("nested_pmin_both_2x4", lambda lax: (lambda x: lax.pmin(x, ("data", "model")), None),
            lambda: (rnd(2, 4, 2, seed=5),))
nested_case("nested_inner_then_outer_post_2x4",
            lambda lax: (lambda x: lax.pmean(x * x, "model"), lambda y: lax.psum(y, "data") - y),
            lambda: (rnd(2, 4, 3, seed=6),))
nested_case("nested_axis_index_inner_outer_2x4",
            lambda lax: (lambda x: (lax.axis_index("model"), lax.axis_index("data"),
                                    lax.axis_size("model"), lax.axis_size("data")), None),
            lambda: (rnd(2, 4),), exact_dtype=False)
nested_case("nested_axis_index_tuple_2x4",
            lambda lax: (lambda x: (lax.axis_index(("data", "model")), lax.axis_size(("data", "model"))), None),
            lambda: (rnd(2, 4),), exact_dtype=False)
nested_case("nested_axis_index_tuple_reversed_2x4",
            lambda lax: (lambda x: lax.axis_index(("model", "data")), None),
            lambda: (rnd(2, 4),), jax="shard_map", exact_dtype=False)
nested_case("nested_all_gather_inner_2x4", lambda lax: (lambda x: lax.all_gather(x, "model", axis=1), None),
            lambda: (rnd(2, 4, 3),))
nested_case("nested_all_gather_outer_2x4", lambda lax: (lambda x: lax.all_gather(x, "data"), None),
            lambda: (rnd(2, 4, 3, seed=1),))
nested_case("nested_all_gather_both_2x4", lambda lax: (lambda x: lax.all_gather(x, ("data", "model")), None),
            lambda: (ar(2, 4, 3),), jax="shard_map")
nested_case("nested_all_gather_both_tiled_2x4",
            lambda lax: (lambda x: lax.all_gather(x, ("data", "model"), tiled=True), None),
            lambda: (rnd(2, 4, 3, seed=2),), jax="shard_map")
nested_case("nested_all_gather_both_reversed_2x2",
            lambda lax: (lambda x: lax.all_gather(x, ("model", "data"), axis=1), None),
            lambda: (ar(2, 2, 3),), jax="shard_map")
nested_case("nested_ppermute_inner_ring_2x4",
            lambda lax: (lambda x: lax.ppermute(x, "model", [(i, (i + 1) % 4) for i in range(4)]), None),
            lambda: (ar(2, 4, 3),))
nested_case("nested_ppermute_outer_2x4",
            lambda lax: (lambda x: lax.ppermute(x, "data", [(0, 1), (1, 0)]), None),
            lambda: (ar(2, 4, 3),))
nested_case("nested_ppermute_both_ring_2x4",
            lambda lax: (lambda x: lax.ppermute(x, ("data", "model"), [(i, (i + 1) % 8) for i in range(8)]), None),
            lambda: (ar(2, 4, 3),), jax="shard_map")
nested_case("nested_psum_inner_groups_2x4",
            lambda lax: (lambda x: lax.psum(x, "model", axis_index_groups=[[0, 1], [2, 3]]), None),
            lambda: (rnd(2, 4, 3, seed=3),), jax="shard_map")
nested_case("nested_psum_scatter_inner_2x4",
            lambda lax: (lambda x: lax.psum_scatter(x, "model", scatter_dimension=1, tiled=True), None),
            lambda: (rnd(2, 4, 3, 8, seed=4),), jax="shard_map")
nested_case("nested_all_to_all_inner_2x4",
            lambda lax: (lambda x: lax.all_to_all(x, "model", 0, 1), None),
            lambda: (rnd(2, 4, 4, 3, seed=5),), jax="shard_map")
nested_case("nested_two_args_matmul_2x2",
            lambda lax: (lambda x, w: lax.psum(x @ w, "model"), lambda y: lax.pmean(y, "data")),
            lambda: (rnd(2, 2, 3, seed=6), rnd(2, 2, 3, 4, seed=7)))


def by_name(name: str) -> Case:
    for c in CASES:
        if c.name == name:
            return c
    raise KeyError(name)


assert len({c.name for c in CASES}) == len(CASES), "case names must be unique"
