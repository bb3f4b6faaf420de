"""The data moves jit inserts, as equations of the per-device program, and the rows that only
a per-device program has.

A value's block moves from one layout to another (one tuple of mesh axes per dimension)
by the simplest collectives that do it: an axis leaving a dimension is an all-gather, an
axis moving to another dimension an all-to-all, a finer split a slice each device cuts
from its own block (``shard_slice``, no communication). Partial sums are combined by an
all-reduce, or by a reduce-scatter where the result keeps only a slice along the summed
axes. Each move is written by :class:`Moves` (the partitioner's half that emits
equations); ``_inserted`` names the equation of the global program that needed it, which
the log shows as "inserted by jit: dot_general".
"""
from __future__ import annotations

import numpy as np

from ..core import collectives as K
from ..core.core import Primitive, context, running
from ..core.run import Run
from .sharding import block_shape, count
from ..core.core import Equation, Var
from ..core.core import Aval
from .sharding import dims_of


class Moves:
    """Emitting the per-device program's equations: a primitive on blocks, a collective
    jit inserts, a move between layouts, the combining of partial sums."""

    def __init__(self, mesh):
        self.mesh = mesh
        self.blocks = Run(list(mesh.devices.flat), tuple(mesh.shape.items()), abstract=True)
        self.eqns: list = []
        self.source, self.phase = ("", ""), "forward"    # the global equation's

    def emit(self, prim, params, ins, cause=None, origin=None, by_hand=False) -> list:
        """``prim[params](ins)`` on blocks: its result variables, typed on one device
        (without the axes a shard_map body's values vary over, but ``by_hand``)."""
        avals = [a.aval if by_hand else a.aval.update(vma=frozenset()) for a in ins]
        with running(self.blocks):
            out = prim.abstract(*avals, **params)
        outs = [Var(a) for a in (out if prim.multiple_results else [out])]
        if cause is not None:
            params = dict(params, _inserted=cause)
        source, phase = origin or (self.source, self.phase)
        self.eqns.append(Equation(prim, params, list(ins), outs, source, phase))
        return outs

    def insert(self, row, value, cause, origin=None, **params):
        """The collective ``row`` on a block, inserted by jit for ``cause``."""
        return self.emit(row, params, [value], cause, origin)[0]

    def cut(self, v, d, axes):
        """Each device keeps its piece of dim ``d`` of its block, by its position along
        ``axes``: no communication."""
        return self.emit(shard_slice, {"dimension": d, "axes": tuple(axes)}, [v])[0]

    def move(self, v, shape, cur, want, cause):
        """Block ``v`` of a value of global ``shape`` from layout ``cur`` to ``want``: an
        axis leaving a dim is all-gathered, one moving to another dim goes in an
        all-to-all, and a finer split is a slice each device cuts from its own block."""
        cur, want = [list(a) for a in cur], [tuple(a) for a in want]
        for d in range(len(shape)):
            k = 0
            while k < min(len(cur[d]), len(want[d])) and cur[d][k] == want[d][k]:
                k += 1
            while len(cur[d]) > k:
                a = cur[d][-1]
                dest = next((e for e in range(len(shape)) if e != d and len(cur[e]) < len(want[e])
                             and want[e][:len(cur[e]) + 1] == tuple(cur[e]) + (a,)), None)
                if dest is not None and len(cur[d]) - k == 1:
                    v = self.insert(K.all_to_all, v, cause, split_axis=dest, concat_axis=d,
                                    axis_name=(a,), axis_index_groups=None, tiled=True)
                    cur[d].pop()
                    cur[dest].append(a)
                else:
                    leaving = tuple(cur[d][k:])
                    v = self.insert(K.all_gather, v, cause, all_gather_dimension=d,
                                    axis_name=leaving, axis_index_groups=None,
                                    axis_size=count(self.mesh, leaving), tiled=True)
                    cur[d] = cur[d][:k]
        for d in range(len(shape)):
            extra = want[d][len(cur[d]):]
            if extra:
                v = self.cut(v, d, extra)
        return v

    def combine(self, r, layout, sums, target, cause, defer=False):
        """A plan's partial sums: a reduce-scatter where the result keeps only a slice
        along the summed axes; else an all-reduce (psum, pmax, pmin). A psum whose axes
        the result's layout does not use is left pending (returned): its next use decides
        (a reshard that splits over them turns it into a reduce-scatter): a product's
        only, as XLA's reduce-scatter creator finds them (an all-reduce, then a slice)."""
        layout, pending = list(layout), []
        used = {a for d in target for a in d}
        for row, axes in sums:
            axes = tuple(axes)
            d = next((d for d in range(len(target)) if row is K.psum and
                      target[d][:len(layout[d]) + len(axes)] == tuple(layout[d]) + axes), None)
            if d is not None:
                r = self.reduce_scatter(r, d, axes, cause)
                layout[d] = tuple(layout[d]) + axes
            elif row is K.psum and defer and not used & set(axes):
                pending.append(axes)
            else:
                r = self.insert(row, r, cause, axes=axes, axis_index_groups=None)
        return r, tuple(layout), pending

    def reduce_scatter(self, r, d, axes, cause, origin=None):
        return self.insert(K.reduce_scatter, r, cause, origin, scatter_dimension=d,
                           axis_name=axes, axis_index_groups=None,
                           axis_size=count(self.mesh, axes), tiled=True)

    def scatter_sums(self, local, cur, want, sums, cause, origin):
        """A reshard of pending partial sums: a reduce-scatter for each sum whose axes the
        new layout splits a dim over, an all-reduce for the others."""
        cur = [tuple(c) for c in cur]
        for axes in sums:
            d = next((d for d in range(len(cur)) if
                      want[d][:len(cur[d]) + len(axes)] == cur[d] + tuple(axes)), None)
            if d is None:
                local = self.insert(K.psum, local, cause, origin, axes=axes, axis_index_groups=None)
                continue
            local = self.reduce_scatter(local, d, axes, cause, origin)
            cur[d] = cur[d] + tuple(axes)
        return local, cur


# -- rows of the per-device program ---------------------------------------------------------------


def _stack(x, run):
    if hasattr(x, "stack"):
        return x.stack
    value = np.asarray(x)
    return np.broadcast_to(value, (run.n,) + value.shape)


def _cut(x, dimension, axes):
    run = context.run
    p, stack = run.axis_size(axes, "jit"), _stack(x, run)
    s = stack.reshape(stack.shape[:dimension + 1] + (p, -1) + stack.shape[dimension + 2:])
    return [np.moveaxis(s, dimension + 1, 1)[np.arange(run.n), run.positions(axes)]]


def _cut_abstract(x, dimension, axes):
    shape = list(x.shape)
    shape[dimension] //= context.run.axis_size(axes, "jit")
    return x.update(shape=shape)


shard_slice = Primitive(     # each device cuts its piece of its block: XLA's dynamic-slice
    "shard_slice", _cut, _cut_abstract, needs_run=True,
    cost=lambda ins, outs, **p: (0, sum(a.nbytes for a in (*ins, *outs))))


def _piece(x, dimension, start, block, size, axes, wanted):
    """Each device's cut of length ``size`` along ``dimension`` of its block for the
    slice's block ``wanted[position]`` (zeros where that is -1)."""
    run = context.run
    pos, stack = run.positions(axes), _stack(x, run)
    out = np.zeros((run.n,) + stack.shape[1:dimension + 1] + (size,) + stack.shape[dimension + 2:],
                   stack.dtype)
    for k in range(run.n):
        i = wanted[pos[k]]
        if i >= 0:
            lo = start + i * size - pos[k] * block
            out[k] = np.take(stack[k], np.arange(lo, lo + size), axis=dimension)
    return [out]


def _piece_abstract(x, dimension, size, **params):
    shape = list(x.shape)
    shape[dimension] = size
    return x.update(shape=shape)


slice_piece = Primitive(     # a device cuts the part of its block that a slice's block needs
    "slice_piece", _piece, _piece_abstract, needs_run=True,
    cost=lambda ins, outs, **p: (0, sum(a.nbytes for a in (*ins, *outs))))


def _unreduce(x, dims, new, shape):
    """A value made partial sums over axes ``new``: a dim split over them keeps each
    device's own block in its place and zeros elsewhere; along an axis that splits no
    dim the first device keeps the value, the others zeros (JAX's placement, 0.10 on)."""
    run = context.run
    stack = np.array(_stack(x, run))
    keep = np.ones(run.n, dtype=bool)
    for d, axes in enumerate(dims):
        if any(a in new for a in axes):
            pos, n = run.positions(axes), shape[d] // run.axis_size(axes, "jit")
            for k in range(run.n):
                index = [slice(None)] * stack.ndim
                index[d + 1] = np.r_[0:pos[k] * n, (pos[k] + 1) * n:shape[d]]
                stack[(k, *index[1:])] = 0
    alone = tuple(a for a in new if not any(a in axes for axes in dims))
    if alone:
        keep &= run.positions(alone) == 0
    stack[~keep] = 0
    return [stack]


unreduce = Primitive(        # no communication: each device's part of a partial sum
    "unreduce", _unreduce, lambda x, **p: x, needs_run=True,
    cost=lambda ins, outs, **p: (0, 0))


def block_aval(aval, mesh):
    """One device's block of a value of type ``aval`` (its shape cut by its sharding)."""
    return Aval(block_shape(aval.shape, dims_of(aval), mesh), aval.dtype, aval.weak_type)
