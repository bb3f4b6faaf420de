"""The plans: how each device computes its block of a primitive's result (see
``sharding.py``): the layout each operand must be in, the primitive's parameters on
blocks, the partial sums left to combine."""
from __future__ import annotations

from ..core import collectives as K
from ..core.collectives import ppermute as _ppermute
from .rules import _assign
from .sharding import block_shape, count, dims_of, whole
from ..core import primitives as P
from .moves import slice_piece


# -- the plans: how each device computes its block -------------------------------------------


class Plan:
    """``ins``: the layout each operand must be in (None: as it is); ``params``: the
    primitive's parameters on blocks (None: the moved operands are the results);
    ``sums``: (collective, mesh axes) left to combine the blocks with; ``out``: the
    layout of each result after them."""

    __slots__ = ("ins", "params", "sums", "out", "then")

    def __init__(self, ins, params, out, sums=(), then=None):
        self.ins, self.params, self.out, self.sums = ins, params, out, list(sums)
        self.then = then          # (run, block, cause) -> block: a route of its own


def computed_whole(avals, outs, **params):
    """The fallback: every operand whole on every device, the result too (then sliced)."""
    return Plan([whole(a.ndim) for a in avals], params, [whole(o.ndim) for o in outs])


def _elementwise_plan(avals, outs, **params):
    out = dims_of(outs[0])
    ins = [tuple(() if a.shape[d] == 1 else out[d] for d in range(a.ndim)) if a.ndim else ()
           for a in avals]
    return Plan(ins, _local(params), [out])


def _local(params):
    return {k: (None if k in ("sharding", "out_sharding") else v) for k, v in params.items()}


def _as_is(avals, outs, **params):
    """Layout-only work that needs no traffic (transpose, squeeze): blocks as they are."""
    return Plan([dims_of(a) for a in avals], params, [dims_of(o) for o in outs])


def _reduce_plan(combine):
    """Each device reduces its block; ``combine`` (the row's collective, a column) adds the
    partial results up across the axes that split a reduced dim (without one, as for
    argmax, the reduced dims are made whole first)."""
    def plan(avals, outs, axes, **params):
        d = dims_of(avals[0])
        if combine is None:
            ins = tuple(() if k in axes else s for k, s in enumerate(d))
            return Plan([ins], _local(dict(params, axes=axes)),
                        [tuple(s for k, s in enumerate(ins) if k not in axes)])
        sums = [(combine, d[k]) for k in axes if d[k]]
        return Plan([d], _local(dict(params, axes=axes)),
                    [tuple(s for k, s in enumerate(d) if k not in axes)], sums)
    return plan


def _dot_plan(avals, outs, dimension_numbers, **params):
    """Each device multiplies its blocks: a contracting dim split (over axes C) on either
    side is split alike on both, the result's dims are laid out as the type says less
    those axes, and the partial sums over C are combined afterwards."""
    lhs, rhs = avals
    (lc, rc), (lb, rb) = dimension_numbers
    ld, rd, out = dims_of(lhs), dims_of(rhs), dims_of(outs[0])
    used, contract = set(), []
    for i, j in zip(lc, rc):
        axes = tuple(a for a in (ld[i] or rd[j]) if a not in used)
        holders = [s for s in out if set(s) & set(axes)]
        if any(s[len(s) - len(axes):] != axes for s in holders):
            axes = ()                     # the result wants them elsewhere: gather instead
        used |= set(axes)
        contract.append(axes)
    layout = [tuple(a for a in s if a not in used) for s in out]
    lw, rw = [()] * lhs.ndim, [()] * rhs.ndim
    for k, (i, j) in enumerate(zip(lb, rb)):
        lw[i] = rw[j] = layout[k]
    for k, (i, j) in enumerate(zip(lc, rc)):
        lw[i] = rw[j] = contract[k]
    keep_l = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
    keep_r = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
    for k, i in enumerate(keep_l):
        lw[i] = layout[len(lb) + k]
    for k, j in enumerate(keep_r):
        rw[j] = layout[len(lb) + len(keep_l) + k]
    return Plan([tuple(lw), tuple(rw)], _local(dict(params, dimension_numbers=dimension_numbers)),
                [tuple(layout)], [(K.psum, c) for c in contract if c])


def _groups(old, new):
    """Runs of old and new dims with equal products (a reshape's independent parts)."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        oi, nj = [], []
        po = pn = 1
        while True:
            if po <= pn and i < len(old):
                oi.append(i)
                po *= old[i]
                i += 1
            elif j < len(new):
                nj.append(j)
                pn *= new[j]
                j += 1
            else:
                break
            if po == pn and (i == len(old) or old[i] != 1) and (j == len(new) or new[j] != 1):
                break
        groups.append((oi, nj))
    return groups


def _contiguous(shape, dims, mesh):
    """The axes, in order, that split the flattened run of ``dims``, if every device's
    block is one contiguous piece of it; else None."""
    axes, blocked = [], False
    for n, s in zip(shape, dims):
        b = n // count(mesh, s)
        if blocked and (s or b != n):
            return None
        axes += list(s)
        if b != 1:
            blocked = True
    return axes


def _reshape_plan(avals, outs, new_sizes, **params):
    """Local where each device's block is the same contiguous piece before and after.
    Elsewhere the old dims are first laid out along the result's axes in order (an
    all-to-all, as XLA does), or, where that cannot be, gathered whole."""
    a, mesh = avals[0], outs[0].sharding.mesh
    ins, out = list(dims_of(a)), list(dims_of(outs[0]))
    for oi, nj in _groups(a.shape, new_sizes):
        old, new = [a.shape[i] for i in oi], [new_sizes[j] for j in nj]
        before = _contiguous(old, [ins[i] for i in oi], mesh)
        after = _contiguous(new, [out[j] for j in nj], mesh)
        if before is not None and before == after:
            continue
        axes = after if after is not None else [x for j in nj for x in out[j]]
        try:
            lay_in, lay_out = (_assign(mesh, axes, sizes, _cannot) for sizes in (old, new))
        except ValueError:
            lay_in, lay_out = [()] * len(oi), [()] * len(nj)
        for i, s in zip(oi, lay_in):
            ins[i] = s
        for j, s in zip(nj, lay_out):
            out[j] = s
    local = block_shape(new_sizes, out, mesh)
    return Plan([tuple(ins)], dict(params, new_sizes=local, sharding=None), [tuple(out)])


def _cannot():
    raise ValueError


def _bid_plan(avals, outs, shape, broadcast_dimensions, **params):
    a, out = avals[0], dims_of(outs[0])
    mesh = outs[0].sharding.mesh
    ins = tuple(() if a.shape[k] == 1 and shape[d] != 1 else out[d]
                for k, d in enumerate(broadcast_dimensions))
    return Plan([ins], dict(params, shape=block_shape(shape, out, mesh),
                            broadcast_dimensions=broadcast_dimensions, sharding=None), [out])


def _whole_dims(touched):
    """A plan computing locally once the dims ``touched(avals, params)`` are whole (in
    every operand of the result's rank; a padding value or a scalar as it is)."""
    def plan(avals, outs, **params):
        dims = set(touched(avals, params))
        out = tuple(() if d in dims else s for d, s in enumerate(dims_of(outs[0])))
        ins = [out if a.ndim == len(out) else None for a in avals]
        return Plan(ins, params, [out] * len(outs))
    return plan


def _changed(avals, params):
    a = avals[0]
    if "padding_config" in params:
        return [d for d, c in enumerate(params["padding_config"]) if tuple(c) != (0, 0, 0)]
    if "dimension" in params:
        return [params["dimension"]]
    if "dimensions" in params:
        return list(params["dimensions"])
    strides = params.get("strides") or (1,) * a.ndim
    return [d for d in range(a.ndim) if (params["start_indices"][d], params["limit_indices"][d],
                                          strides[d]) != (0, a.shape[d], 1)]


def _slice_plan(avals, outs, start_indices, limit_indices, strides=None):
    """A slice on blocks. A split dim it shortens keeps its split: where each new block
    lies within one old block, that block's device cuts it and sends it on (collective
    permutes, as XLA does); otherwise the dim is gathered whole, sliced, and cut again."""
    a, mesh = avals[0], outs[0].sharding.mesh
    ad, changed = dims_of(a), _changed(avals, dict(start_indices=start_indices,
                                                   limit_indices=limit_indices, strides=strides))
    steps = strides or (1,) * a.ndim
    local_dims = {}                 # split dims each device slices from its own block
    for d in changed:
        if ad[d]:
            ib, ob = a.shape[d] // count(mesh, ad[d]), outs[0].shape[d] // count(mesh, ad[d])
            if steps[d] * ob == ib and start_indices[d] + steps[d] * (ob - 1) < ib:
                local_dims[d] = (start_indices[d], start_indices[d] + steps[d] * (ob - 1) + 1)
    changed = [d for d in changed if d not in local_dims]
    split = [d for d in changed if ad[d]]
    route = None
    if len(split) == 1 and steps[split[0]] == 1:
        d = split[0]
        g = count(mesh, ad[d])
        ib, ob, start = a.shape[d] // g, (limit_indices[d] - start_indices[d]) // g, start_indices[d]
        source = [(start + i * ob) // ib for i in range(g)]
        if all((start + (i + 1) * ob - 1) // ib == source[i] for i in range(g)):
            route = _permuted_slice(d, ad[d], start, ib, ob, source)
    plan = _whole_dims(lambda *_: [d for d in changed if route is None or d != split[0]])(
        avals, outs)
    local = block_shape(a.shape, plan.ins[0], mesh)
    starts, limits = list(start_indices), list(limit_indices)
    for d, s in enumerate(plan.ins[0]):
        if s:                                        # split, and kept: all of its block
            starts[d], limits[d] = local_dims.get(d, (0, local[d]))
    plan.params = dict(start_indices=tuple(starts), limit_indices=tuple(limits), strides=strides)
    plan.then = route
    return plan


def _permuted_slice(d, axes, start, ib, ob, source):
    """Block ``i`` of the slice along dim ``d`` comes from the device at position
    ``source[i]`` along ``axes``, which cuts it from its block; one collective permute
    per round, each device sending at most once a round. A device receives at most once,
    and its other rounds bring zeros, so the pieces add up to its block."""

    def route(moves, v, cause):
        def cut(wanted):
            return moves.emit(slice_piece, dict(dimension=d, start=start, block=ib, size=ob,
                                                axes=tuple(axes), wanted=tuple(wanted)), [v])[0]
        g = len(source)
        sends = {}
        for i, j in enumerate(source):
            if i != j:
                sends.setdefault(j, []).append(i)
        out = cut([p if source[p] == p else -1 for p in range(g)])
        for r in range(max((len(t) for t in sends.values()), default=0)):
            pairs = tuple((j, dests[r]) for j, dests in sorted(sends.items()) if len(dests) > r)
            sent = cut([dict(pairs).get(p, -1) for p in range(g)])
            got = moves.insert(_ppermute, sent, cause, axis_name=tuple(axes), perm=pairs)
            out = moves.emit(P.add, {}, [out, got])[0]
        return out
    return route


def reshard_plan(avals, outs, **params):
    return Plan([dims_of(outs[0])], None, [dims_of(outs[0])])
