"""The math of every collective, as pure functions over a group's values.

Each function takes ``values``, the list of one array per member of the group in group
order (member ``i`` is the device with index ``i`` along the named axis, or within its
``axis_index_groups`` group), and returns the list of what each member ends up holding.
Nothing here knows about threads, devices or logs, so each collective can be read and
tested on its own.

The tables, keyed by collective name, hold one concern each:

* ``MATH[op](values, **params)``: what every member ends up holding;
* ``STACKED[op](groups, **params)``: the same, for many groups stacked in one array;
* ``WIRE_BYTES[op](nbytes, p, member, **params)``: the bytes one member sends and
  receives with the bandwidth-optimal algorithm (ring-based, as NCCL and TPU ICI use),
  for an input of ``nbytes`` per member in a group of ``p``.
"""
from __future__ import annotations

import functools

import numpy as np


# -- reductions: everyone ends with the same combination of everyone's value ------------

def _reduce(ufunc, values):
    out = np.array(values[0], copy=True)
    for v in values[1:]:
        ufunc(out, v, out=out)          # one pass, no stacked copy of the whole group
    return out


def psum(values):
    """Every member gets the elementwise sum of all members' values.

    Booleans are counted: JAX sums them as int32, so ``psum(x > 0)`` is how many devices
    hold a positive value (checked on jax 0.10.2). pmax and pmin keep booleans (any, all).
    """
    dtype = np.result_type(*values)
    if dtype == np.bool_:
        dtype = np.dtype(np.int32)
    if len(values) == 1:
        return [np.asarray(values[0], dtype=dtype)]
    total = _reduce(np.add, [np.asarray(v, dtype=dtype) for v in values])
    return [total] * len(values)


def pmean(values):
    """Every member gets the elementwise mean. Integers average to floats, as in JAX."""
    total = psum(values)[0]
    mean = total / len(values)
    if total.dtype.kind in "iub":
        mean = mean.astype(np.float32)    # JAX's default float, not NumPy's float64
    return [mean] * len(values)


def pmax(values):
    """Every member gets the elementwise maximum."""
    return [_reduce(np.maximum, values)] * len(values)


def pmin(values):
    """Every member gets the elementwise minimum."""
    return [_reduce(np.minimum, values)] * len(values)


# -- gathering and scattering ---------------------------------------------------------

def all_gather(values, axis=0, tiled=False):
    """Every member gets all values, stacked along a new ``axis`` (or joined if ``tiled``)."""
    joined = np.concatenate(values, axis=axis) if tiled else np.stack(values, axis=axis)
    return [joined] * len(values)


def psum_scatter(values, scatter_dimension=0, tiled=False):
    """Sum, then member ``i`` keeps block ``i`` of ``scatter_dimension`` (a reduce-scatter).

    Not tiled, the dimension's size equals the group size and is removed; tiled, it is
    split into equal blocks that are kept.
    """
    total = psum(values)[0]
    p = len(values)
    blocks = np.split(total, p, axis=scatter_dimension)
    if not tiled:
        blocks = [np.squeeze(b, axis=scatter_dimension) for b in blocks]
    return blocks


def all_to_all(values, split_axis, concat_axis, tiled=False):
    """Member ``j`` sends block ``i`` of its ``split_axis`` to member ``i``.

    Each member joins what it receives, in sender order, along ``concat_axis``. Not
    tiled, ``split_axis`` has the group's size and its blocks are single slices: the
    slice is dropped from the block and the received blocks are stacked as a new axis
    at ``concat_axis``. Tiled, blocks keep their axis and are concatenated.
    """
    p = len(values)
    if tiled:
        blocks = [np.split(v, p, axis=split_axis) for v in values]
        return [np.concatenate([blocks[j][i] for j in range(p)], axis=concat_axis)
                for i in range(p)]
    return [np.stack([np.take(values[j], i, axis=split_axis) for j in range(p)], axis=concat_axis)
            for i in range(p)]


def pswapaxes(values, axis):
    """Swap the mapped axis with the local ``axis``: all_to_all with split = concat = axis."""
    return all_to_all(values, axis, axis, tiled=False)


# -- point to point -------------------------------------------------------------------

def ppermute(values, perm):
    """Send ``values[src]`` to ``dst`` for each pair; a member nobody sends to gets zeros."""
    out = [np.zeros_like(v) for v in values]
    for src, dst in perm:
        out[dst] = values[src]
    return out


def pshuffle(values, perm):
    """Member ``i`` gets ``values[perm[i]]``: ppermute with pairs ``(perm[i], i)``."""
    return [values[src] for src in perm]


MATH = {
    "psum": psum,
    "pmean": pmean,
    "pmax": pmax,
    "pmin": pmin,
    "all_gather": all_gather,
    "psum_scatter": psum_scatter,
    "all_to_all": all_to_all,
    "pswapaxes": pswapaxes,
    "ppermute": ppermute,
    "pshuffle": pshuffle,
}


# -- the same math over many groups at once ---------------------------------------------
# ``STACKED[op](groups, **params)``: ``groups`` holds every group's values, shape
# (number of groups, group size, ...); the result is what each member ends up holding,
# of shape (number of groups, group size, ...) or broadcastable to it. A trace-once run
# (``batching.py``) calls these once per collective, through ``MATH[op].stacked``; an op
# without one falls back to ``MATH`` group by group.

def _stacked_psum(groups):
    dtype = np.dtype(np.int32) if groups.dtype == np.bool_ else groups.dtype   # counted, as psum
    if groups.shape[1] == 1:
        return groups.astype(dtype, copy=False)
    if groups.shape[0] == 1:                 # one group: the plain 2-D reduction, fastest
        return groups[0].sum(axis=0, dtype=dtype)[None, None]
    return groups.sum(axis=1, keepdims=True, dtype=dtype)


def _stacked_pmean(groups):
    total = _stacked_psum(groups)
    mean = total / groups.shape[1]
    return mean.astype(np.float32) if total.dtype.kind in "iub" else mean


def _stacked_all_gather(groups, axis=0, tiled=False):
    p, ndim = groups.shape[1], groups.ndim - 2
    if tiled:
        axis = axis % ndim
        moved = np.moveaxis(groups, 1, axis + 1)                 # (G, ..., p, n_axis, ...)
        shape = moved.shape[:axis + 1] + (p * groups.shape[axis + 2],) + moved.shape[axis + 3:]
        joined = moved.reshape(shape)
    else:
        joined = np.moveaxis(groups, 1, axis % (ndim + 1) + 1)
    return joined[:, None]


def _stacked_psum_scatter(groups, scatter_dimension=0, tiled=False):
    p = groups.shape[1]
    total = groups.sum(axis=1, dtype=groups.dtype)             # (G, ...); booleans refused
    d = scatter_dimension % (total.ndim - 1) + 1
    shape = total.shape[:d] + (p, total.shape[d] // p) + total.shape[d + 1:]
    blocks = np.moveaxis(total.reshape(shape), d, 1)           # (G, p, ..., block, ...)
    return blocks if tiled else np.squeeze(blocks, axis=d + 1)


def _stacked_ppermute(groups, perm):
    out = np.zeros_like(groups)
    if perm:
        sources, destinations = zip(*perm)
        out[:, list(destinations)] = groups[:, list(sources)]
    return out


STACKED = {
    "psum": _stacked_psum,
    "pmean": _stacked_pmean,
    "pmax": lambda groups: groups.max(axis=1, keepdims=True),
    "pmin": lambda groups: groups.min(axis=1, keepdims=True),
    "all_gather": _stacked_all_gather,
    "psum_scatter": _stacked_psum_scatter,
    "ppermute": _stacked_ppermute,
    "pshuffle": lambda groups, perm: groups[:, list(perm)],
}
for _op, _stacked in STACKED.items():      # MATH stays the definition: a function replaced
    MATH[_op].stacked = _stacked           # there (a test's monkeypatch) loses its fast form


# -- bytes on the wire, per member, with the bandwidth-optimal algorithm ---------------

def _all_reduce_bytes(nbytes, p, member, **params):
    # Ring all-reduce = reduce-scatter + all-gather, each moving (p-1)/p of the data.
    b = 2 * (p - 1) * nbytes // p
    return b, b


def _all_gather_bytes(nbytes, p, member, **params):
    # Every member's shard must reach the p-1 others; a ring forwards one shard a step.
    b = (p - 1) * nbytes
    return b, b


def _reduce_scatter_bytes(nbytes, p, member, **params):
    b = (p - 1) * nbytes // p
    return b, b


def _all_to_all_bytes(nbytes, p, member, **params):
    # Each member keeps 1/p of its data and sends the rest, one block to each peer.
    b = (p - 1) * nbytes // p
    return b, b


def _permute_bytes(nbytes, p, member, perm=(), **params):
    senders, receivers = _movers(tuple(map(tuple, perm)))
    return (nbytes if member in senders else 0), (nbytes if member in receivers else 0)


@functools.lru_cache(maxsize=64)
def _movers(perm):
    """The members that send and that receive something other than their own value."""
    return ({s for s, d in perm if s != d}, {d for s, d in perm if s != d})


def _pshuffle_bytes(nbytes, p, member, perm=(), **params):
    return _permute_bytes(nbytes, p, member, perm=[(s, d) for d, s in enumerate(perm)])


def _no_bytes(nbytes, p, member, **params):
    return 0, 0


# Collectives whose every member sends and receives the same bytes (the log computes them once).
SAME_BYTES_FOR_EVERY_MEMBER = {"psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter",
                               "all_to_all", "pswapaxes"}

WIRE_BYTES = {
    "psum": _all_reduce_bytes,
    "pmean": _all_reduce_bytes,
    "pmax": _all_reduce_bytes,
    "pmin": _all_reduce_bytes,
    "all_gather": _all_gather_bytes,
    "psum_scatter": _reduce_scatter_bytes,
    "all_to_all": _all_to_all_bytes,
    "pswapaxes": _all_to_all_bytes,
    "ppermute": _permute_bytes,
    "pshuffle": _pshuffle_bytes,
    "axis_index": _no_bytes,
    "axis_size": _no_bytes,
}


# -- checks made on arrival, so a mistake is reported on the device that made it ---------

def _fail(op, where, axes, message):
    from .errors import CollectiveArgumentError
    raise CollectiveArgumentError(f"{op} over {axes} on {where}: {message}")


def _axis_in(axis, ndim, op, where, axes, what):
    if not -ndim <= axis < ndim:
        _fail(op, where, axes, f"{what}={axis} is out of range for a value with {ndim} "
              f"dimension(s); use an axis in {-ndim}..{ndim - 1}.")
    return axis % ndim


def _check_split(op, leaves, p, dim, tiled, where, axes, what):
    for leaf in leaves:
        shape = np.shape(leaf)
        d = _axis_in(dim, len(shape), op, where, axes, what)
        n = shape[d]
        if not tiled and n != p:
            _fail(op, where, axes, f"value of shape {shape} has size {n} along {what}={dim}, "
                  f"but without tiled=True that size must equal the group size {p}. Reshape "
                  f"so that dimension has size {p}, or pass tiled=True to split it into {p} "
                  f"equal blocks.")
        if tiled and n % p:
            _fail(op, where, axes, f"value of shape {shape} has size {n} along {what}={dim}, "
                  f"which does not split into {p} equal blocks (one per group member). Pad "
                  f"or reshape it to a multiple of {p}.")


def _check_all_gather(leaves, p, params, where, axes):
    for leaf in leaves:
        ndim = np.ndim(leaf)
        if params.get("tiled"):
            if ndim == 0:
                _fail("all_gather", where, axes, "tiled=True joins values along an existing "
                      "axis, but the value is a scalar; use tiled=False to stack scalars.")
            _axis_in(params.get("axis", 0), ndim, "all_gather", where, axes, "axis")
        else:
            axis = params.get("axis", 0)
            if not -(ndim + 1) <= axis <= ndim:
                _fail("all_gather", where, axes, f"axis={axis} is out of range: the value has "
                      f"shape {np.shape(leaf)} (rank {ndim}), and all_gather stacks the "
                      f"devices' values along a new axis, so the result has rank {ndim + 1} "
                      f"and axis must be in {-(ndim + 1)}..{ndim}. (With tiled=True it joins "
                      f"along an existing axis instead, in {-ndim}..{ndim - 1}.)")


def _check_psum_scatter(leaves, p, params, where, axes):
    if any(np.asarray(leaf).dtype == np.bool_ for leaf in leaves):
        _fail("psum_scatter", where, axes, "the value is boolean, and real JAX refuses to "
              "reduce-scatter booleans ('add does not accept dtype bool'). Convert first: "
              "x.astype(snp.int32) to count, as psum does for booleans.")
    _check_split("psum_scatter", leaves, p, params.get("scatter_dimension", 0),
                 params.get("tiled", False), where, axes, "scatter_dimension")


def _check_all_to_all(leaves, p, params, where, axes):
    tiled = params.get("tiled", False)
    _check_split("all_to_all", leaves, p, params["split_axis"], tiled, where, axes, "split_axis")
    for leaf in leaves:
        ndim = np.ndim(leaf)
        _axis_in(params["concat_axis"], ndim, "all_to_all", where, axes, "concat_axis")


def _check_pswapaxes(leaves, p, params, where, axes):
    _check_split("pswapaxes", leaves, p, params["axis"], False, where, axes, "axis")


def _check_ppermute(leaves, p, params, where, axes):
    perm = params["perm"]
    for pair in perm:
        if len(pair) != 2:
            _fail("ppermute", where, axes, f"perm entry {pair!r} is not a (source, destination) pair.")
        for i in pair:
            if not 0 <= i < p:
                wrap = (f" Real JAX accepts a negative index silently and counts it from the "
                        f"end ({i} means {i % p}); simpmd refuses it so that an off-by-one "
                        f"is not hidden. Write the index you mean, e.g. (j + 1) % {p}."
                        if -p <= i < 0 else "")
                _fail("ppermute", where, axes, f"perm entry {tuple(pair)} names index {i}, "
                      f"outside the axis (size {p}): indices run 0..{p - 1}.{wrap}")
    for pos, what in ((0, "source"), (1, "destination")):
        seen = [pair[pos] for pair in perm]
        dup = sorted({i for i in seen if seen.count(i) > 1})
        if dup:
            _fail("ppermute", where, axes, f"perm={list(map(tuple, perm))} repeats {what} {dup}; "
                  f"each device may send once and receive once. Split it into several ppermutes.")


def _check_pshuffle(leaves, p, params, where, axes):
    perm = list(params["perm"])
    if sorted(perm) != list(range(p)):
        _fail("pshuffle", where, axes, f"perm={perm} must be a permutation of 0..{p - 1} "
              f"(member i receives from perm[i]); use ppermute for partial exchanges.")


PRECHECK = {
    "all_gather": _check_all_gather,
    "psum_scatter": _check_psum_scatter,
    "all_to_all": _check_all_to_all,
    "pswapaxes": _check_pswapaxes,
    "ppermute": _check_ppermute,
    "pshuffle": _check_pshuffle,
}
