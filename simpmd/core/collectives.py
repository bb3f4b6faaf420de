"""The collectives, one row each: the math over a group, its checks, its type, its
derivative, and the bytes each member moves.

The math is pure: ``math(groups, **params)`` takes every group's values stacked as
``(number of groups, group size, ...)`` (member ``i`` is the device with index ``i`` along
the named axes, or within its ``axis_index_groups`` group) and returns what each member
ends up holding, so each collective can be read and tested on its own. Which devices form
the groups, the log and the deadlock check are the run's (``run.py``).

``wire_bytes(nbytes, p, member, **params)`` is what one member sends and receives with the
bandwidth-optimal algorithm (ring-based, as NCCL and TPU ICI use) for ``nbytes`` per member
in a group of ``p``. The derivative of a collective is a collective (``vjp``): ``psum``'s is
``psum`` (or, under ``shard_map(check_vma=True)``, no communication at all), ``all_gather``'s
is ``psum_scatter``, ``ppermute``'s the inverse permutation.
"""
from __future__ import annotations

import numpy as np

from . import bridge, errors
from .core import Aval, Primitive, aval_of, bind, context

class Settings:
    """Rules that changed between JAX releases, taken from the running JAX by the JAX
    bridge (``simpmd.jax``) once JAX is imported; without it, the newest JAX's rules.

    ``partial``: the reduction rows that accept a value varying over only some of their
    axes under ``shard_map(check_vma=True)``, making it vary over all of them first
    (``pvary``): jax 0.7.2 accepts psum, psum_scatter, pmax and pmin; 0.10.2 pmax and pmin;
    0.11.2 and 0.12 none.
    """
    _partial = None

    @property
    def partial(self) -> frozenset:
        if self._partial is None and bridge.jax is not None:
            self._partial = bridge.jax.followed_rules()
        return frozenset() if self._partial is None else self._partial

    @partial.setter
    def partial(self, value):
        self._partial = value

settings = Settings()

# -- the math, over many groups at once --------------------------------------------------------

def _psum(groups):
    dtype = np.dtype(np.int32) if groups.dtype == np.bool_ else groups.dtype  # JAX counts booleans
    if groups.shape[1] == 1:
        return groups.astype(dtype, copy=False)
    if groups.shape[0] == 1:                 # one group: the plain 2-D reduction, fastest
        return groups[0].sum(axis=0, dtype=dtype)[None, None]
    return groups.sum(axis=1, keepdims=True, dtype=dtype)

def _pmean(groups):
    total = _psum(groups)
    mean = total / groups.shape[1]
    return mean.astype(np.float32) if total.dtype.kind in "iub" else mean.astype(total.dtype)

def _all_gather(groups, all_gather_dimension=0, tiled=False, **params):
    axis = all_gather_dimension
    moved = np.moveaxis(groups, 1, axis + 1)                  # (G, ..., p, n_axis, ...)
    if tiled:                                                 # join p and n_axis
        joined = moved.shape[axis + 1] * moved.shape[axis + 2]   # (not -1: a size may be 0)
        moved = moved.reshape(moved.shape[:axis + 1] + (joined,) + moved.shape[axis + 3:])
    return moved[:, None]

def _reduce_scatter(groups, scatter_dimension=0, tiled=False, **params):
    p = groups.shape[1]
    total = groups.sum(axis=1, dtype=groups.dtype)             # (G, ...)
    d = scatter_dimension % (total.ndim - 1) + 1               # (JAX allows axes from the end)
    shape = total.shape[:d] + (p, total.shape[d] // p) + total.shape[d + 1:]
    blocks = np.moveaxis(total.reshape(shape), d, 1)           # (G, p, ..., block, ...)
    return blocks if tiled else np.squeeze(blocks, axis=d + 1)

def _all_to_all(groups, split_axis, concat_axis, tiled=False, **params):
    p, ndim = groups.shape[1], groups.ndim - 2
    s, c = split_axis % ndim + 2, concat_axis % ndim + 2        # axes of (G, p, ...)
    if not tiled:                             # the split axis has size p: one slice each
        moved = np.moveaxis(groups, s, 2)                      # (G, sender, receiver, ...)
        swapped = np.swapaxes(moved, 1, 2)                     # (G, receiver, sender, ...)
        return np.moveaxis(swapped, 2, c)
    shape = groups.shape[:s] + (p, groups.shape[s] // p) + groups.shape[s + 1:]
    blocks = np.moveaxis(groups.reshape(shape), s, 2)          # (G, sender, receiver, ...)
    swapped = np.swapaxes(blocks, 1, 2)                        # (G, receiver, sender, ...)
    joined = np.moveaxis(swapped, 2, c)                        # sender just before concat
    shape = joined.shape[:c] + (p * joined.shape[c + 1],) + joined.shape[c + 2:]
    return joined.reshape(shape)

def _ppermute(groups, perm, **params):
    out = np.zeros_like(groups)
    if perm:
        sources, destinations = zip(*perm)
        out[:, list(destinations)] = groups[:, list(sources)]
    return out

# -- bytes on the wire, per member ---------------------------------------------------------------

def _all_reduce_bytes(nbytes, p, member, **params):
    b = 2 * (p - 1) * nbytes // p          # ring all-reduce = reduce-scatter + all-gather
    return b, b

def _all_gather_bytes(nbytes, p, member, **params):
    b = (p - 1) * nbytes                   # every member's shard reaches the p-1 others
    return b, b

def _scatter_bytes(nbytes, p, member, **params):
    b = (p - 1) * nbytes // p              # each keeps 1/p and sends the rest, a block a peer
    return b, b

def _permute_bytes(nbytes, p, member, perm=(), **params):
    sends = any(s == member and d != s for s, d in perm)
    receives = any(d == member and d != s for s, d in perm)
    return (nbytes if sends else 0), (nbytes if receives else 0)

# -- checks on arrival, so a mistake is reported where it was made -------------------------------

def _fail(op, axes, message):
    run = context.run
    where = run.where(0) if run is not None else "the host"
    raise errors.CollectiveArgumentError(f"{op} over {tuple(axes)} on {where}: {message}")

def _axis_in(op, axes, axis, ndim, what):
    if not -ndim <= axis < ndim:
        _fail(op, axes, f"{what}={axis} is out of range for a value with {ndim} dimension(s); use "
                  f"an axis in {-ndim}..{ndim - 1}.")
    return axis % ndim

def _check_split(op, axes, shape, p, dim, tiled, what):
    d = _axis_in(op, axes, dim, len(shape), what)
    n = shape[d]
    if not tiled and n != p:
        _fail(op, axes, f"value of shape {shape} has size {n} along {what}={dim}, but without "
                  f"tiled=True that size must equal the group size {p}. Reshape so that "
                  f"dimension has size {p}, or pass tiled=True to split it into {p} equal blocks.")
    if tiled and n % p:
        _fail(op, axes, f"value of shape {shape} has size {n} along {what}={dim}, which does not "
                  f"split into {p} equal blocks (one per group member). Pad or reshape it to "
                  f"a multiple of {p}.")
    return d

def check_perm(perm, p, axes, op="ppermute"):
    """The pairs of a ppermute: (source, destination) indices on the axis, each at most once."""
    for pair in perm:
        for i in pair:
            if not 0 <= i < p:
                wrap = (f" Real JAX accepts a negative index silently and counts it from the "
                        f"end ({i} means {i % p}); simpmd refuses it so that an off-by-one is "
                        f"not hidden. Write the index you mean, e.g. (j + 1) % {p}."
                        if -p <= i < 0 else "")
                _fail(op, axes, f"perm entry {tuple(pair)} names index {i}, outside the axis (size "
                          f"{p}): indices run 0..{p - 1}.{wrap}")
    for pos, what in ((0, "source"), (1, "destination")):
        seen = [pair[pos] for pair in perm]
        dup = sorted({i for i in seen if seen.count(i) > 1})
        if dup:
            _fail(op, axes, f"perm={list(map(tuple, perm))} repeats {what} {dup}; each device may "
                      f"send once and receive once. Split it into several ppermutes.")

# -- the rows ----------------------------------------------------------------------------------

def group_size(axes, groups=None) -> int:
    """How many devices one group of a collective over ``axes`` holds."""
    if groups is not None:
        return len(groups[0])
    return context.run.axis_size(axes, "collective")

def _axes(params):
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)

def _vma_reducing(name, x, axes):
    """A reduction's input must vary over all of its axes or none (JAX's rule); the axes
    it varies over are gone from its result."""
    inside, outside = set(axes) & x.vma, set(axes) - x.vma
    if inside and outside and name not in {row.op for row in settings.partial}:
        raise errors.VmaError(
            f"{name} over {axes} of a value that varies over {sorted(inside)} but not over "
            f"{sorted(outside)}: under shard_map(check_vma=True) JAX's {name} needs the "
            f"value to vary over all of the axes it reduces or over none of them (JAX: "
            f"'can only accept axis_name which corresponds to one of varying ... or "
            f"invarying state of the input'). Reduce over {tuple(sorted(inside))} only, or "
            f"make the value vary over every axis first (lax.pcast(x, "
            f"{tuple(sorted(outside))}, to='varying') on JAX).")

def _typed(x, vma=None, **changes):
    run = context.run
    vma = x.vma if vma is None else vma
    return x.update(vma=vma if run is not None and run.check_vma else frozenset(), **changes)

def _reduce_abstract(name):
    def abstract(*xs, axes, axis_index_groups=None, _size=None):
        out = []
        for x in xs:
            if context.run is not None and context.run.check_vma:
                _vma_reducing(name, x, axes)
            dtype = np.dtype(np.int32) if name in ("psum", "pmean") and x.dtype == np.bool_ else x.dtype
            if name == "pmean" and dtype.kind in "iub":
                dtype = np.dtype(np.float32)
            out.append(_typed(x, x.vma - set(axes), dtype=dtype, weak_type=False))
        return out
    return abstract

def _pvary_ct(ct, axes):
    """Under check_vma: the cotangent of an invariant result handed back as varying."""
    missing = tuple(a for a in axes if a not in aval_of(ct).vma)
    return bind(pvary, ct, axes=missing) if missing else ct

def _psum_vjp(cts, ins, outs, wants, axes, axis_index_groups=None, _size=None):
    if aval_of(ins[0]).vma:         # typed by vma: the sum's pieces, no communication
        return [_pvary_ct(ct, axes) if w and ct is not None else None for ct, w in zip(cts, wants)]
    live = [ct for ct, w in zip(cts, wants) if w and ct is not None]
    summed = iter(bind(psum, *live, axes=axes, axis_index_groups=axis_index_groups) if live else [])
    return [next(summed) if w and ct is not None else None for ct, w in zip(cts, wants)]

def _pmean_vjp(cts, ins, outs, wants, axes, axis_index_groups=None, _size=None):
    if aval_of(ins[0]).vma:
        n = float(_size)
        return [bind(_div, _pvary_ct(ct, axes), n) if w and ct is not None else None
                for ct, w in zip(cts, wants)]
    live = [ct for ct, w in zip(cts, wants) if w and ct is not None]
    means = iter(bind(pmean, *live, axes=axes, axis_index_groups=axis_index_groups, _size=_size)
                 if live else [])
    return [next(means) if w and ct is not None else None for ct, w in zip(cts, wants)]

def _no_flops(ins, outs, **params):
    """A collective computes nothing worth counting: its cost is the wire's (cost.py)."""
    return 0, 0

def _collective(name, op, math, abstract, wire, vjp=None, lax_params=None, variadic=False,
                **columns):
    return Primitive(name, None, abstract, vjp=vjp, collective=True, op=op, math=math,
                     wire_bytes=wire, multiple_results=variadic, cost=_no_flops,
                     lax_params=lax_params or (lambda params: {}), **columns)

# ``reduction``: it reduces over its axes (the vma rule above); ``unequal_groups``: its
# axis_index_groups may have different sizes (as jax.lax's all-reduces allow); ``hlo``:
# the kind of collective XLA's compiled program calls it.
psum = _collective("psum", "psum", _psum, _reduce_abstract("psum"), _all_reduce_bytes,
                   _psum_vjp, variadic=True, reduction=True,
                   unequal_groups=True, hlo="all-reduce")
pmean = _collective("pmean", "pmean", _pmean, _reduce_abstract("pmean"), _all_reduce_bytes,
                    _pmean_vjp, variadic=True, reduction=True,
                    unequal_groups=True, hlo="all-reduce")
pmax = _collective("pmax", "pmax", lambda g: g.max(axis=1, keepdims=True),
                   _reduce_abstract("pmax"), _all_reduce_bytes, variadic=True, reduction=True,
                   unequal_groups=True, hlo="all-reduce")
pmin = _collective("pmin", "pmin", lambda g: g.min(axis=1, keepdims=True),
                   _reduce_abstract("pmin"), _all_reduce_bytes, variadic=True, reduction=True,
                   unequal_groups=True, hlo="all-reduce")

def _gather_abstract(x, *, all_gather_dimension, axis_name, axis_index_groups=None,
                     axis_size, tiled):
    shape = list(x.shape)
    if tiled:
        if not shape:
            _fail("all_gather", axis_name, "tiled=True joins values along an existing axis, but the value "
                                "is a scalar; use tiled=False to stack scalars.")
        shape[all_gather_dimension] *= axis_size
    else:
        shape.insert(all_gather_dimension, axis_size)
    return _typed(x, x.vma | set(axis_name), shape=shape)

all_gather = _collective(
    "all_gather", "all_gather", _all_gather, _gather_abstract, _all_gather_bytes,
    lambda ct, ins, outs, wants, **p: [bind(
        reduce_scatter, ct, scatter_dimension=p["all_gather_dimension"],
        axis_name=p["axis_name"], axis_index_groups=p["axis_index_groups"],
        axis_size=p["axis_size"], tiled=p["tiled"])] if wants[0] else [None],
    lambda p: {"axis": p["all_gather_dimension"], "tiled": p["tiled"]}, hlo="all-gather")

def _scatter_abstract(x, *, scatter_dimension, axis_name, axis_index_groups=None, axis_size,
                      tiled):
    if x.dtype == np.bool_:
        _fail("psum_scatter", axis_name, "the value is boolean, and real JAX refuses to reduce-scatter "
                              "booleans ('add does not accept dtype bool'). Convert first: "
                              "x.astype(snp.int32) to count, as psum does for booleans.")
    if context.run is not None and context.run.check_vma:
        _vma_reducing("psum_scatter", x, tuple(axis_name))
    d = _check_split("psum_scatter", axis_name, x.shape, axis_size, scatter_dimension, tiled,
                     "scatter_dimension")
    shape = list(x.shape)
    if tiled:
        shape[d] //= axis_size
    else:
        del shape[d]
    return _typed(x, x.vma | set(axis_name), shape=shape)

reduce_scatter = _collective(
    "reduce_scatter", "psum_scatter", _reduce_scatter, _scatter_abstract, _scatter_bytes,
    lambda ct, ins, outs, wants, **p: [bind(
        all_gather, ct, all_gather_dimension=p["scatter_dimension"], axis_name=p["axis_name"],
        axis_index_groups=p["axis_index_groups"], axis_size=p["axis_size"],
        tiled=p["tiled"])] if wants[0] else [None],
    lambda p: {"scatter_dimension": p["scatter_dimension"], "tiled": p["tiled"]},
    reduction=True, probe_keywords={"tiled": True}, hlo="reduce-scatter")

def _a2a_abstract(x, *, split_axis, concat_axis, axis_name, axis_index_groups=None, tiled):
    axes = _axes({"axis_name": axis_name})
    p = group_size(axes, axis_index_groups)
    s = _check_split("all_to_all", axes, x.shape, p, split_axis, tiled, "split_axis")
    c = _axis_in("all_to_all", axes, concat_axis, x.ndim, "concat_axis")
    shape = list(x.shape)
    if tiled:
        shape[s] //= p
        shape[c] *= p
    else:                      # the split axis (one slice per member) moves to concat_axis
        del shape[s]
        shape.insert(c, p)
    return _typed(x, x.vma | set(_axes({"axis_name": axis_name})), shape=shape)

all_to_all = _collective(
    "all_to_all", "all_to_all", _all_to_all, _a2a_abstract, _scatter_bytes,
    lambda ct, ins, outs, wants, **p: [bind(
        all_to_all, ct, split_axis=p["concat_axis"], concat_axis=p["split_axis"],
        axis_name=p["axis_name"], axis_index_groups=p["axis_index_groups"],
        tiled=p["tiled"])] if wants[0] else [None],
    lambda p: {"split_axis": p["split_axis"], "concat_axis": p["concat_axis"],
               "tiled": p["tiled"]}, hlo="all-to-all")

def _ppermute_abstract(*xs, axis_name, perm):
    check_perm(perm, group_size(tuple(axis_name)), tuple(axis_name))
    return [_typed(x, x.vma | set(axis_name)) for x in xs]

def _ppermute_vjp(cts, ins, outs, wants, axis_name, perm):
    live = [ct for ct, w in zip(cts, wants) if w and ct is not None]
    back = iter(bind(ppermute, *live, axis_name=axis_name,
                     perm=tuple((d, s) for s, d in perm)) if live else [])
    return [next(back) if w and ct is not None else None for ct, w in zip(cts, wants)]

ppermute = _collective("ppermute", "ppermute", _ppermute, _ppermute_abstract, _permute_bytes,
                       _ppermute_vjp, lambda p: {"perm": p["perm"]}, variadic=True,
                       same_bytes=False, hlo="collective-permute")

def _pvary_abstract(x, *, axes, axis_index_groups=None):
    if x.unreduced & set(axes):
        raise errors.VmaError(                # JAX's words, then what to do
            f"pvary cannot accept args which are unreduced. Got {x.str_short()} and axes="
            f"{set(axes)}: sum the partial sums first (lax.psum), then vary the total.")
    return _typed(x, x.vma | set(axes))

pvary = Primitive(          # no data moves: the value's type now says it varies over axes
    "pvary", lambda x, axes, axis_index_groups=None: x, _pvary_abstract,
    vjp=lambda ct, ins, outs, wants, axes, axis_index_groups=None: [
        bind(psum, ct, axes=axes, axis_index_groups=None)[0]] if wants[0] else [None],
    cost=lambda ins, outs, **p: (0, 0), show=lambda p: {"axes": p["axes"]},
    by_axes=True)             # (it names mesh axes, as a collective does)

def _index_abstract(*, axis_name):
    axes = axis_name if isinstance(axis_name, tuple) else (axis_name,)
    context.run.axis_size(axes, "axis_index")          # an unknown axis is refused here
    return _typed(Aval((), np.int32), frozenset(axes))

axis_index = Primitive("axis_index", None, _index_abstract, cost=lambda ins, outs, **p: (0, 0),
                       collective=True, op="axis_index", math=None,
                       wire_bytes=lambda nbytes, p, member, **params: (0, 0),
                       lax_params=lambda p: {}, by_position=True)   # each device's index

from .primitives import div as _div  # noqa: E402  (pmean's derivative divides)

COLLECTIVES = {row.op: row for row in (psum, pmean, pmax, pmin, all_gather, reduce_scatter,
                                       all_to_all, ppermute)}
