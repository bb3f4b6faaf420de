"""jit as a pass: the global program, typed by sharding, partitioned once into the program
that one device runs.

The traced program's values are whole arrays typed by their sharding
(``f32[16@data,64@model]``). :func:`partition` walks its equations once and writes the
per-device program: for each equation its row's plan (``plans.py``) says the layout each
operand must be in, the primitive's parameters on blocks, and the partial sums to combine;
the pass writes the moves that bring the operands there (``moves.py``), the primitive on
blocks, the combining collectives, and the moves to the layout the result's type says.

A product's partial sums may wait for their next use: they live in the pass's
environment, beside the block's variable (a :class:`Slot` per program variable), and are
resolved at the first use that needs the sum (an all-reduce), at a ``reshard`` (a
reduce-scatter where the new layout splits over them) or at the outputs. Bodies (a jit
called inside, ``checkpoint``) are partitioned in line; those of ``cond``, ``scan``,
``while_loop`` and ``shard_map`` into bodies of their own, recursively.

The result is cached with the traced program (:func:`partitioned`) and run by the core's
ordinary ``eval_program`` on a :class:`BlockRun` over the mesh's devices; ``lower()``,
the roofline and the timelines read the same program.
"""
from __future__ import annotations

import weakref

from ..core import control, loops
from ..core.collectives import psum
from ..core.core import Lit, Program, Var
from ..core.run import Run
from .columns import column
from .moves import Moves, block_aval, unreduce
from .plans import computed_whole
from .rows import jit_p
from .sharded import by_hand
from .sharding import dims_of

PASSES = {"count": 0}        # how many times a program was partitioned (a test reads it)


class Slot:
    """One program variable on a device: its block (a variable of the per-device program,
    or a literal) and the partial sums over mesh axes still pending on it, with the
    equation that left them (where the collective that resolves them is reported)."""

    __slots__ = ("atom", "sums", "origin", "layout")

    def __init__(self, atom, sums=(), origin=None, layout=None):
        self.atom, self.sums, self.origin = atom, list(sums), origin
        self.layout = layout      # the block's layout where it is not its type's (Auto axes)


class Partitioner(Moves):
    """The pass over one program (``manual``: the axes of an enclosing
    ``shard_map(axis_names=...)``, whose collectives are the learner's, by hand)."""

    def __init__(self, mesh, manual=()):
        super().__init__(mesh)
        self.manual = tuple(manual)
        self.env: dict = {}

    # -- the environment ----------------------------------------------------------------------
    def slot(self, v) -> Slot:
        return Slot(v) if type(v) is not Var else self.env[v]

    def settled(self, v, keep_layout=False):
        """``v``'s block with its pending partial sums added up (an all-reduce each), in
        the layout its type says (unless ``keep_layout``: a result of the whole program)."""
        s = self.slot(v)
        if s.layout is not None and not keep_layout:
            s.atom, s.layout = self.move(s.atom, v.aval.shape, s.layout, dims_of(v.aval),
                                         "jit: shard_map"), None
        if s.sums:
            cause = f"jit: {s.origin[2]}" if s.origin[2] else "jit"
            for axes in s.sums:
                s.atom = self.insert(psum, s.atom, cause, s.origin[:2], axes=axes,
                                     axis_index_groups=None)
            s.sums = []
        return s.atom

    def block(self, atom, aval, want, cause, scatter=None):
        """Operand ``atom`` (a block of type ``aval``) in layout ``want``; ``scatter``: its
        pending sums, for a reshard to resolve."""
        cur = dims_of(aval)
        want = cur if want is None else tuple(want)
        if type(atom) is Lit and (want == cur or not aval.ndim):
            return atom
        if scatter is not None:
            sums, origin = scatter
            cause_ = f"jit: {origin[2]}" if origin[2] else "jit"
            atom, cur = self.scatter_sums(atom, cur, want, sums, cause_, origin[:2])
        return self.move(atom, aval.shape, cur, want, cause)

    # -- the program ----------------------------------------------------------------------------
    def body(self, program, keep_layout=False) -> Program:
        """``program`` partitioned into a program of its own: its inputs blocks in the
        layouts their types say, its outputs too (pending sums resolved)."""
        sub = self if keep_layout else Partitioner(self.mesh, self.manual)
        invars = [Var(block_aval(v.aval, self.mesh)) for v in program.constvars + program.invars]
        sub.env.update((g, Slot(v)) for g, v in zip(program.constvars + program.invars, invars))
        sub.run(program.eqns)
        outs = [sub.settled(v, keep_layout) for v in program.outvars]
        return Program(invars, sub.eqns, outs, axis_env=tuple(self.mesh.shape.items()))

    def run(self, eqns):
        for eqn in eqns:
            self.source, self.phase = eqn.source, eqn.phase
            handler = BODIES.get(eqn.primitive)
            if handler is not None:
                handler(self, eqn)
            elif by_hand(eqn.primitive, eqn.params, self.manual):
                outs = self.emit(eqn.primitive, eqn.params, [self.settled(v) for v in eqn.invars],
                                 by_hand=True)
                self.env.update((g, Slot(v)) for g, v in zip(eqn.outvars, outs))
            else:
                self.equation(eqn)

    def equation(self, eqn):
        """One equation by its row's plan: operands moved to the layout it needs, the
        primitive on blocks, partial sums combined, results moved to their types' layout."""
        prim, params = eqn.primitive, eqn.params
        avals, outs = [v.aval for v in eqn.invars], [v.aval for v in eqn.outvars]
        resolves = column(prim, "resolves_sums")         # reshard
        first = self.slot(eqn.invars[0]) if eqn.invars else None
        found = (first.sums, first.origin) if first is not None and first.sums else None
        if found is not None and not (resolves or self._carries(prim, avals[0], outs[0], found)):
            found = None
        if resolves:
            found = self._reducing(avals[0], outs[0], found)
        ins = [first.atom if k == 0 and found else self.settled(v)
               for k, v in enumerate(eqn.invars)]
        plan = (column(prim, "partition") or computed_whole)(avals, outs, **params)
        cause = f"jit: {prim.name}"
        values = [self.block(x, a, want, cause, scatter=found if resolves and k == 0 else None)
                  for k, (x, a, want) in enumerate(zip(ins, avals, plan.ins))]
        results = values if plan.params is None else self.emit(prim, plan.params, values)
        if plan.then is not None:
            results = [plan.then(self, r, cause) for r in results]
        carried = list(found[0]) if found is not None and not resolves else []
        for r, layout, o, var in zip(results, plan.out, outs, eqn.outvars):
            r, layout, pending = self.combine(r, layout, plan.sums, o.sharding.dims, cause,
                                              defer=column(prim, "defers_sums"))
            pending = [axes for axes in pending if not set(axes) <= o.sharding.unreduced]
            moved = self.move(r, o.shape, layout, o.sharding.dims, cause)
            if resolves:
                moved = self._unreducing(moved, avals[0], o)
            origin = found[1] if carried else (self.source, self.phase, prim.name)
            self.env[var] = Slot(moved, pending + carried, origin)

    def _carries(self, prim, aval, out, found):
        """A layout-only, linear primitive passes pending partial sums on (the transpose
        of a product's partial sums is the partial sums of its transpose)."""
        carries = column(prim, "carries_sums")
        if carries is None or not carries(aval, out):
            return False
        used = {a for d in out.sharding.dims for a in d}
        return not any(a in used for axes in found[0] for a in axes)

    def _reducing(self, aval, out, found):
        """A reshard from unreduced: the axes it leaves are summed, as pending sums are (a
        reduce-scatter where the new layout splits a dimension over them)."""
        leaving = getattr(aval.sharding, "unreduced", frozenset()) - out.sharding.unreduced
        if not leaving:
            return found
        axes = tuple(a for a in self.mesh.axis_names if a in leaving)
        return ([axes], (self.source, self.phase, "reshard"))

    def _unreducing(self, v, aval, out):
        """A reshard to unreduced: the value becomes partial sums over the new axes, each
        device's part in place (``moves.unreduce``), with no communication."""
        new = out.sharding.unreduced - getattr(aval.sharding, "unreduced", frozenset())
        if not new:
            return v
        return self.emit(unreduce, dict(dims=dims_of(aval), new=tuple(sorted(new)),
                                        shape=tuple(aval.shape)), [v])[0]


# -- bodies: in line, or partitioned into bodies of their own ------------------------------------


def _in_line(part, eqn):
    """A jit called inside (or a checkpoint): its equations partitioned in line, its
    operands' pending sums carried in, its results resolved."""
    inner = eqn.params["jaxpr"]
    for iv, ov in zip(inner.invars, eqn.invars):
        part.env[iv] = part.slot(ov)
    part.run(inner.eqns)
    for ov, iv in zip(eqn.outvars, inner.outvars):
        part.env[ov] = Slot(part.settled(iv))


def _typed(part, eqn, operands, wants):
    """The operands of a body, each a block in layout ``wants[k]`` (its body's input type)."""
    return [part.block(part.settled(v), v.aval, want, f"jit: {eqn.primitive.name}")
            for v, want in zip(operands, wants)]


def _emit_body(part, eqn, ins, **bodies):
    outs = part.emit(eqn.primitive, dict(eqn.params, **bodies), ins)
    part.env.update((g, Slot(v)) for g, v in zip(eqn.outvars, outs))


def _cond(part, eqn):
    branches = eqn.params["branches"]
    ins = [part.settled(eqn.invars[0])] + _typed(
        part, eqn, eqn.invars[1:], [dims_of(a) for a in branches[0].in_avals])
    _emit_body(part, eqn, ins, branches=tuple(part.body(b) for b in branches))


def _scan(part, eqn):
    p = eqn.params
    body, n = p["jaxpr"], p["num_consts"] + p["num_carry"]
    wants = [dims_of(a) if k < n else ((),) + dims_of(a) for k, a in enumerate(body.in_avals)]
    _emit_body(part, eqn, _typed(part, eqn, eqn.invars, wants), jaxpr=part.body(body))


def _while(part, eqn):
    p = eqn.params
    nc, nb = p["cond_nconsts"], p["body_nconsts"]
    cond, body = p["cond_jaxpr"], p["body_jaxpr"]
    wants = [dims_of(a) for a in cond.in_avals[:nc] + body.in_avals]
    _emit_body(part, eqn, _typed(part, eqn, eqn.invars, wants),
               cond_jaxpr=part.body(cond), body_jaxpr=part.body(body))


BODIES = {control.cond: _cond, loops.scan: _scan, loops.while_: _while, loops.remat: _in_line,
          jit_p: _in_line}


# -- the pass, cached with the traced program -----------------------------------------------------


def partition(program, mesh) -> Program:
    """The program each device of ``mesh`` runs for ``program``. Its ``out_layouts`` say
    how each result's blocks are laid out where that is not its type's (None): a
    shard_map's result over Auto axes stays split as its out_specs say, as XLA keeps it."""
    PASSES["count"] += 1
    part = Partitioner(mesh)
    local = part.body(program, keep_layout=True)
    local.out_layouts = [part.slot(v).layout for v in program.outvars]
    return local


_partitioned: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def partitioned(program, mesh) -> Program:
    """``partition(program, mesh)``, done once per traced program (traced for one mesh)."""
    found = _partitioned.get(program)
    if found is None:
        found = _partitioned[program] = partition(program, mesh)
    return found


class BlockRun(Run):
    """The run of a per-device program: every device of a mesh, each value its block; a
    collective jit inserted is logged with what inserted it."""

    def __init__(self, mesh, abstract=False):
        super().__init__(list(mesh.devices.flat), tuple(mesh.shape.items()), abstract=abstract,
                         maps_a_mesh=True)
        self.mesh, self.cause = mesh, None

    def apply(self, prim, args, params):          # (on types: the rows' own parameters)
        self.cause = params.get("_inserted")
        try:
            return super().apply(prim, args, {k: v for k, v in params.items() if k != "_inserted"})
        finally:
            self.cause = None

    def collective(self, prim, stacks, params, avals, out_avals):
        before, cause = len(self.log.records), params.get("_inserted") or self.cause
        out = super().collective(prim, stacks, params, avals, out_avals)
        if cause and len(self.log.records) > before:      # (its own dict: the log's copy)
            self.log.records[-1].fields["params"]["inserted"] = cause
        return out
