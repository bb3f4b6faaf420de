"""The sharding rules: the layout of each primitive's results, from its operands', as JAX's
``_..._sharding_rule`` functions beside each primitive in jax/_src/lax/lax.py give it, or a
:class:`ShardingTypeError` where JAX raises one (``sharding.py`` says what a layout is)."""
from __future__ import annotations

import math

from ..core import primitives as P
from .sharding import ShardingTypeError, count, dims_of, resolve, settings, spec_text, whole


# -- the rules: each result's layout -----------------------------------------------------------


def _meshes(avals):
    found = {a.sharding.mesh for a in avals if a.sharding is not None}
    if len(found) > 1:
        raise ShardingTypeError(f"the operands live on different meshes ({', '.join(map(repr, found))}); "
                                f"device_put them onto one mesh first.")


def _broadcasting(name):
    """Elementwise: per dimension, the split the operands agree on; a dimension split on
    one operand and whole on another takes the split; two different splits raise."""
    def rule(mesh, avals, **params):
        _meshes(avals)
        shaped = [a for a in avals if a.shape]
        if not shaped:
            return [()]
        if len({a.ndim for a in shaped}) > 1:
            raise TypeError(f"{name}: arrays must have the same number of dimensions, got "
                            f"{', '.join(str(a.shape) for a in shaped)}.")
        out = []
        for d in range(shaped[0].ndim):
            ss = [dims_of(a)[d] for a in shaped]
            nontrivial = [s for s, a in zip(ss, shaped) if not (a.shape[d] == 1 and not s)]
            chosen = ()
            for s in (nontrivial or [()]):
                if s and chosen and s != chosen:
                    raise ShardingTypeError(
                        f"{name} got incompatible shardings for broadcasting: "
                        f"{', '.join(spec_text(dims_of(a)) for a in shaped)} (JAX's words). "
                        f"Dimension {d} is split differently on two operands, and JAX will "
                        f"not choose one for you: reshard one operand to the other's layout "
                        f"first, e.g. simpmd.reshard(y, x.sharding.spec).")
                chosen = chosen or s
            out.append(chosen)
        return [tuple(out)]
    return rule


def _first(mesh, avals, **params):
    return [dims_of(avals[0])]


def _convert(mesh, avals, new_dtype=None, weak_type=False, sharding=None):
    return [resolve(sharding, mesh, avals[0].ndim) if sharding is not None else dims_of(avals[0])]


def _select(mesh, avals, **params):
    pred, *cases = avals
    meshed = [a for a in cases if a.sharding is not None]
    first = dims_of(meshed[0]) if meshed else dims_of(cases[0])
    if any(dims_of(a) != first for a in meshed):
        raise ShardingTypeError(
            f"select cases must have the same shardings, got "
            f"[{', '.join(spec_text(dims_of(a)) for a in cases)}] (JAX's words). reshard "
            f"them to one layout first.")
    if pred.shape and pred.sharding is not None and dims_of(pred) != first:
        raise ShardingTypeError(
            f"select's predicate must be a scalar or have the cases' sharding, got "
            f"{spec_text(dims_of(pred))} and {spec_text(first)}.")
    return [first]


def _clamp(mesh, avals, **params):
    return [dims_of(avals[1])]


def _reduce(mesh, avals, axes, out_sharding=None, **params):
    if out_sharding is not None:
        return [resolve(out_sharding, mesh, avals[0].ndim - len(axes))]
    return [tuple(s for d, s in enumerate(dims_of(avals[0])) if d not in axes)]


def _cumulative(mesh, avals, axis, reverse=False):
    if dims_of(avals[0])[axis]:
        raise ShardingTypeError(
            f"Input should be unsharded over the axis being reduced (JAX's words): dimension "
            f"{axis} of {spec_text(dims_of(avals[0]))} is split. reshard it whole first.")
    return [dims_of(avals[0])]


def _sort(mesh, avals, dimension, **params):
    for a in avals:
        if dims_of(a)[dimension]:
            raise ShardingTypeError(
                f"Arguments to sort must be unsharded over the sorting dimension (JAX's "
                f"words): dimension {dimension} of {spec_text(dims_of(a))} is split.")
    return [dims_of(a) for a in avals]


def _transpose(mesh, avals, permutation):
    return [tuple(dims_of(avals[0])[p] for p in permutation)]


def _squeeze(mesh, avals, dimensions):
    return [tuple(s for d, s in enumerate(dims_of(avals[0])) if d not in dimensions)]


def _broadcast_in_dim(mesh, avals, shape, broadcast_dimensions, sharding=None):
    if sharding is not None:
        return [resolve(sharding, mesh, len(shape))]
    src = iter(dims_of(avals[0]))
    return [tuple(next(src) if d in broadcast_dimensions else () for d in range(len(shape)))]


def _concatenate(mesh, avals, dimension):
    meshed = [a for a in avals if a.sharding is not None]
    if not meshed:
        return [whole(avals[0].ndim)]
    if any(dims_of(a) != dims_of(meshed[0]) for a in meshed):
        raise ShardingTypeError(
            f"All operands should have the same sharding (JAX's words), got "
            f"{', '.join(spec_text(dims_of(a)) for a in meshed)}. reshard them to one "
            f"layout first.")
    return [dims_of(meshed[0])]


def _varying_shape(row, word):
    """slice, pad: the operand's layout, if each changed split dimension still divides."""
    def rule(mesh, avals, **params):
        a = avals[0]
        strides = params.get("strides") or ()
        if not settings.strided_slice and any(k != 1 and dims_of(a)[d] for d, k in enumerate(strides)):
            raise ShardingTypeError(
                "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the "
                "gather indexing (JAX's words): this JAX indexes x[::k] with a gather, which "
                "refuses a split dimension; reshard it whole first.")
        out = row.abstract(*avals, **params)
        if settings.single_element and all(m == 1 for m in out.shape):
            return [whole(len(out.shape))]          # one element: on every device
        for d, (n, m, axes) in enumerate(zip(a.shape, out.shape, dims_of(a))):
            if n != m and axes and m % count(mesh, axes):
                raise ShardingTypeError(
                    f"{word} on sharded dims where out "
                    f"dim ({m}) is not divisible by mesh axes ({count(mesh, axes)}) with spec "
                    f"({','.join(axes)}) is not implemented (JAX's words). Dimension {d} of "
                    f"{spec_text(dims_of(a))} is split; reshard it whole first, or keep a "
                    f"size the devices divide.")
        return [dims_of(a)]
    return rule


def _iota(mesh, avals, shape, sharding=None, **params):
    return [resolve(sharding, mesh, len(shape)) or whole(len(shape))]


def _dot_general(mesh, avals, dimension_numbers, out_sharding=None, **params):
    lhs, rhs = avals
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    if out_sharding is not None:
        free = lhs.ndim + rhs.ndim - len(lc) - len(rc) - nb
        return [resolve(out_sharding, mesh, free)]
    ld, rd = dims_of(lhs), dims_of(rhs)
    for what, ls, rs in (("lhs batch dimensions and rhs batch dimensions", lb, rb),
                         ("contracting dimensions", lc, rc)):
        for i, j in zip(ls, rs):
            alike = ls is lb and settings.batch_alike
            if (ld[i] != rd[j]) if alike else (ld[i] and rd[j] and ld[i] != rd[j]):
                raise ShardingTypeError(
                    f"dot_general requires {what} to have the consistent sharding, got "
                    f"{spec_text([ld[i] for i in ls])} and {spec_text([rd[j] for j in rs])} "
                    f"(JAX's words). reshard one operand first.")
    for i, j in zip(lc, rc):
        if ld[i] and rd[j]:
            raise ShardingTypeError(
                f"Contracting dimensions are sharded and it is ambiguous how the output "
                f"should be sharded (JAX's words): the summed-over dimension is split over "
                f"{ld[i]} on both operands, so each device ends with a partial sum. Say where "
                f"the sum goes with out_sharding=: P(...) without {ld[i][0]!r} sums onto every "
                f"device (an all-reduce); P(...) that splits a result dimension over "
                f"{ld[i][0]!r} leaves each device its slice of the sum (a reduce-scatter).")
    keep_l = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
    keep_r = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
    return [tuple([ld[i] for i in lb] + [ld[i] for i in keep_l] + [rd[j] for j in keep_r])]


# reshape: JAX's rule follows a split when one dimension is cut into several (the axes go
# to the leading new dims that take them whole) or several merged into one.

def _split_on_one_axis(old, new):
    """JAX's ``_split_on_one_axis``: each old dim as its new size or the list of new sizes
    it is cut into; None when more than one dim is cut, (False,) when it is no split."""
    if len(new) <= len(old):
        return False
    ones = 0
    while old and new and old[-1] == 1 and new[-1] == 1:
        ones, old, new = ones + 1, old[:-1], new[:-1]
    i = j = cuts = 0
    out = []
    while j < len(new):
        if i >= len(old):
            return False
        if old[i] == new[j]:
            out.append(old[i])
        else:
            cuts += 1
            if cuts > 1:
                return None
            part, nj, ni = [new[j]], j + 1, i + 1
            while math.prod(part) != old[i] or (nj < len(new) and new[nj] == 1):
                if math.prod(part) > old[i]:
                    return False
                if math.prod(part) == old[i] and ni < len(old) and new[nj] == old[ni]:
                    break
                j += 1
                if j >= len(new):
                    return False
                part.append(new[j])
                nj += 1
            out.append(part)
        i, j = i + 1, j + 1
    return out + [1] * ones


def _assign(mesh, axes, sizes, fail):
    """JAX's ``split_partitions``: give the axes, in order, to the sizes, each taking
    whole axes while it can."""
    it, out = iter(axes), []
    for n in sizes:
        got = []
        while n > 1:
            a = next(it, None)
            if a is None:
                break
            n, rem = divmod(n, mesh.shape[a])
            if rem:
                fail()
            got.append(a)
        out.append(tuple(got))
    if next(it, None) is not None:
        fail()
    return out


def _reshape(mesh, avals, new_sizes, dimensions=None, sharding=None):
    a = avals[0]
    if sharding is not None:
        return [resolve(sharding, mesh, len(new_sizes))]
    dims = dims_of(a)
    if not any(dims):
        return [whole(len(new_sizes))]

    def fail():
        raise ShardingTypeError(
            f"This reshape is not supported (JAX's words): {a.str_short()} to "
            f"{tuple(new_sizes)}. JAX follows a split only when one dimension is cut into "
            f"several or several are merged into one; say the result's layout with "
            f"x.reshape(..., out_sharding=P(...)), or reshard x whole first.")
    if [n for n in a.shape if n != 1] == [n for n in new_sizes if n != 1]:
        kept = iter(s for n, s in zip(a.shape, dims) if n != 1)
        return [tuple(() if n == 1 else next(kept) for n in new_sizes)]
    if settings.reshape_ones and (1 in a.shape or 1 in new_sizes):   # (jax 0.12) past 1s
        return [_past_ones(mesh, a, dims, new_sizes)]
    split = _split_on_one_axis(tuple(a.shape), tuple(new_sizes))
    if split is None:
        fail()
    if split:
        out = []
        for part, s in zip(split, dims):
            if not isinstance(part, list):
                out.append(s)
            elif not s:
                out += [()] * len(part)
            elif not settings.reshape_spread:        # the first new dim takes the split
                if part[0] % count(mesh, s):
                    fail()
                out += [s] + [()] * (len(part) - 1)
            else:
                out += _assign(mesh, s, part, fail)
        return [tuple(out)]
    merge = _split_on_one_axis(tuple(new_sizes), tuple(a.shape))
    if not merge:
        fail()
    out, src = [], iter(dims)
    for n, part in zip(new_sizes, merge):
        if not isinstance(part, list):
            out.append(next(src))
            continue
        if not settings.reshape_spread:              # only a split first dim merges
            parts = [next(src) for _ in part]
            if any(parts[1:]):
                fail()
            out.append(parts[0])
            continue
        axes = [x for _ in part for x in (next(src) or (None,))]
        while axes and axes[-1] is None:
            axes.pop()
        if not axes:
            out.append(())
        elif None in axes:
            fail()
        else:
            out += _assign(mesh, axes, [n], fail)
    return [tuple(out)]


def _past_ones(mesh, a, dims, new_sizes):
    """jax 0.12's reshape: the split or merge found on the dims other than 1; a new dim of
    size 1 keeps the split of an old one of size 1 at its place."""
    core = a.update(shape=tuple(n for n in a.shape if n != 1), sharding=type(a.sharding)(
        mesh, tuple(s for n, s in zip(a.shape, dims) if n != 1)))
    kept = iter(_reshape(mesh, [core], tuple(n for n in new_sizes if n != 1))[0])
    return tuple((dims[i] if i < a.ndim and a.shape[i] == 1 else ()) if n == 1 else next(kept)
                 for i, n in enumerate(new_sizes))


def _gather(mesh, avals, indexer, mode=None):
    """NumPy's indexing by arrays: the indexed dims must be whole (as JAX asks); the
    dims a ``:`` keeps keep their split; the index arrays' dims are whole."""
    x, xd = avals[0], dims_of(avals[0])
    out_ndim = P.gather.abstract(*avals, indexer=indexer, mode=mode).ndim
    entries = _expanded(indexer, x.ndim)
    advanced = [k for k, e in enumerate(entries) if e is not None and not isinstance(e, slice)]
    together = advanced == list(range(advanced[0], advanced[-1] + 1)) if advanced else True
    n_adv = out_ndim - sum(1 for e in entries if e is None or isinstance(e, slice))
    split = any(a.sharding is not None and any(dims_of(a)) for a in avals[1:])
    out, d = ([] if together else [()] * n_adv), 0
    for k, e in enumerate(entries):
        if e is None:
            out.append(())
            continue
        full = isinstance(e, slice) and e == slice(None)
        split = split or (bool(xd[d]) and not full)
        if isinstance(e, slice):
            out.append(xd[d])
        elif together and k == advanced[0]:
            out += [()] * n_adv
        d += 1
    if split:
        raise ShardingTypeError(
            "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the gather "
            "indexing as out sharding could not be resolved unambiguously (JAX's words): an "
            "indexed dimension, or the index, is split. reshard it whole first.")
    return [tuple(out)]


def _expanded(indexer, ndim):
    used = sum(1 for i in indexer if i is not None and i is not Ellipsis)
    out = []
    for i in indexer:
        out += [slice(None)] * (ndim - used) if i is Ellipsis else [i]
    return out + [slice(None)] * (ndim + sum(1 for i in out if i is None) - len(out))


def _full_index(indexer, ndim):
    return [i for i in _expanded(indexer, ndim) if i is not None]


def _scatter(mesh, avals, indexer):
    x = avals[0]
    touched = [d for d, i in enumerate(_full_index(indexer, x.ndim))
               if not (isinstance(i, slice) and i == slice(None))]
    if any(dims_of(x)[d] for d in touched):
        raise ShardingTypeError("x.at[...] on a split dimension: simpmd asks for that dimension "
                                "whole (reshard it first).")
    return [dims_of(x)]


def _numpy_call(mesh, avals, name, **params):
    raise ShardingTypeError(
        f"numpy.{name} has no JAX primitive, so no sharding rule: under jit write it with "
        f"simpmd.numpy functions that JAX has (arithmetic, reductions, reshapes, indexing).")


def _branches(mesh, avals, branches, **params):
    return [dims_of(a) for a in branches[0].out_avals]


def _body(mesh, avals, jaxpr, **params):
    """A checkpoint: its body's results, typed when the body was traced."""
    return [dims_of(a) for a in jaxpr.out_avals]


def _scan(mesh, avals, jaxpr, num_carry, **params):
    """A scan: the carry keeps the type it was traced with (the front end checks that the
    body returns it unchanged, JAX's TypeError otherwise); the stacked ``ys`` add a
    leading dimension, whole on every device."""
    outs = jaxpr.out_avals
    return [dims_of(a) for a in outs[:num_carry]] + [((),) + dims_of(a) for a in outs[num_carry:]]


def _while(mesh, avals, body_jaxpr, **params):
    return [dims_of(a) for a in body_jaxpr.out_avals]
