"""``cond``, the primitive of ``lax.cond`` and ``lax.switch``: one branch per device.

Each branch is traced once (by ``simpmd/lax.py``) into a program of its own, which becomes
a parameter of one equation of the enclosing program, as JAX's higher-order primitives
do. Values any branch reads from the enclosing body without being passed them become the
first operands of every branch (:func:`common_consts`, JAX's closure conversion). Running
the equation runs every branch over every device, each device keeping its own branch's
result, with a branch's collectives run only for the devices that take it (a group split
between branches is a deadlock). Its derivative cuts each branch as every row that runs a
body once is cut (``loops.split_call``): a cond of forward halves, then one of backward halves.
"""
from __future__ import annotations

import numpy as np

from . import core
from .autodiff import differentiable
from .core import Primitive, Program, Var, aval_of, bind, context
from .program import eval_program, trace
from .values import StackedValue
from .loops import Split, _depends, split_call, zeros
from .loops import split_vjp

def common_consts(traced, order):
    """Branches as JAX's closure conversion leaves them: the values any branch read from
    the enclosing body (``traced``: each branch's program and those values), each once in
    the order ``order`` traced them, become the first inputs of every branch, unused where
    a branch does not read one. Returns (programs, those values)."""
    consts, where = [], {}
    for k in order:
        for c in traced[k][1]:
            if id(c) not in where:
                where[id(c)] = len(consts)
                consts.append(c)
    programs = []
    for program, lifted in traced:
        mine = {where[id(c)]: v for c, v in zip(lifted, program.constvars)}
        ins = [mine[j] if j in mine else Var(aval_of(c)) for j, c in enumerate(consts)]
        programs.append(Program(ins + program.invars, program.eqns, program.outvars,
                                axis_env=program.axis_env))
    return programs, consts

def _cond_abstract(index, *ops, branches, _what, _source, _vjp=None):
    """Each result typed by its own branches' outputs, varying wherever the choice does."""
    return [a.update(vma=frozenset().union(index.vma, *(p.out_avals[k].vma for p in branches)))
            for k, a in enumerate(branches[0].out_avals)]

def _cond_stacked(index, *ops, branches, _what, _source, _vjp=None):
    """Every branch over every device; each keeps its own branch's result (a result shared
    by all, a leading axis of 1, as each one's; outside any mapped body, ``core.plain``'s)."""
    run = context.run or core.plain
    chosen = np.clip(np.asarray(index.stack if isinstance(index, StackedValue) else index,
                                dtype=np.int64).reshape(-1), 0, len(branches) - 1)
    chosen, stacks = np.broadcast_to(chosen, (run.n,)), []
    for k, program in enumerate(branches):
        run.branches.append((chosen == k, (_what, k) + tuple(_source)))
        try:
            stacks.append([run.stack_of(o, aval_of(o)) for o in eval_program(program, [], ops)])
        finally:
            run.branches.pop()
    return [np.stack([np.broadcast_to(s, (run.n,) + np.shape(s)[1:]) for s in col])
            [chosen, np.arange(run.n)] for col in zip(*stacks)]

def _cond_linearize(eqn, wants):
    """Each branch cut by ``loops.split_call``; the cond also returns every branch's
    residuals, a branch filling the others' with zeros (as JAX joins them), and its
    derivative is a cond of the backward halves."""
    branches, n_out, n_ops = eqn.params["branches"], len(eqn.outvars), len(eqn.invars) - 1
    active = [w and differentiable(v) for w, v in zip(wants[1:], branches[0].invars)]
    with_ct = [any(c) for c in zip(*(_depends(b, active) for b in branches))]
    cuts = [split_call(b, wants[1:], every_input=True, with_ct=with_ct)[:2] for b in branches]
    res = [v.aval for f, _ in cuts for v in f.outvars[n_out:]]
    run = context.run or core.plain

    def slots(k, own, other):                # branch k's residuals among every branch's
        first = sum(len(f.outvars) - n_out for f, _ in cuts[:k])
        return [own[j - first] if first <= j < first + len(own) else other(a)
                for j, a in enumerate(res)]
    forwards = [trace(lambda *xs, k=k, f=f: (lambda o: o[:n_out] + slots(k, o[n_out:], zeros))(
        eval_program(f, [], list(xs))), b.in_avals, run if run.abstract else run.tracing())[0]
        for k, ((f, _), b) in enumerate(zip(cuts, branches))]
    cut = [n_ops + len(f.outvars) - n_out for f, _ in cuts]     # where the cotangents start
    backwards = tuple(Program(b.invars[:n_ops] + slots(k, b.invars[n_ops:cut[k]], Var)
                              + b.invars[cut[k]:], b.eqns, b.outvars, axis_env=b.axis_env)
                      for k, (_, b) in enumerate(cuts))
    params = dict(eqn.params, branches=tuple(forwards),
                  _vjp=(backwards, Split(list(range(n_ops)), len(res), active, with_ct)))
    return core.Equation(eqn.primitive, params, eqn.invars,
                         eqn.outvars + [Var(a) for a in res], eqn.source, eqn.phase)

def _cond_vjp(cts, ins, outs, wants, branches, _what, _source, _vjp):
    """A cond of the backward halves on the inputs, the residuals and the cotangents."""
    backwards, split = _vjp
    return [None] + split_vjp(cts, ins[1:], outs, split, lambda operands: bind(
        cond, ins[0], *operands, branches=backwards, _what=_what, _source=_source))

cond = Primitive("cond", _cond_stacked, _cond_abstract, vjp=_cond_vjp, multiple_results=True,
                 linearize=_cond_linearize, needs_run=True, cost=lambda ins, outs, **p: (0, 0),
                 unlogged="lax.cond branches (which branch a device takes depends on values)")
