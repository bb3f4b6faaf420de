"""``cond``, the primitive of ``lax.cond`` and ``lax.switch``: one branch per device.

Each branch is traced once (by ``simpmd/lax.py``) into a program of its own, which becomes
a parameter of one equation of the enclosing program, as JAX's higher-order primitives
do. Values any branch reads from the enclosing body without being passed them become the
first operands of every branch (:func:`common_consts`, JAX's closure conversion). Running the equation runs every branch over every device,
each device keeping its own branch's result, with a branch's collectives run only for
the devices that take it (a group split between branches is a deadlock).
"""
from __future__ import annotations

import numpy as np

from . import core
from .core import Primitive, Program, Var, aval_of, bind, context
from .program import eval_program, trace
from .values import StackedValue

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

def _cond_abstract(index, *ops, branches, _what, _source):
    vma = frozenset().union(index.vma, *(a.vma for p in branches for a in p.out_avals))
    return [a.update(vma=vma) for a in branches[0].out_avals]

def _cond_stacked(index, *ops, branches, _what, _source):
    """Every branch over every device; each device keeps its own branch's result (outside
    any mapped body, as under plain NumPy ``grad``, the one device of ``core.plain``)."""
    run = context.run or core.plain
    chosen = np.clip(np.asarray(index.stack if isinstance(index, StackedValue) else index,
                                dtype=np.int64).reshape(-1), 0, len(branches) - 1)
    chosen = np.broadcast_to(chosen, (run.n,))
    result = None
    for k, program in enumerate(branches):
        mask = chosen == k
        run.branches.append((mask, (_what, k) + tuple(_source)))
        try:
            outs = eval_program(program, [], ops)
        finally:
            run.branches.pop()
        stacks = [run.stack_of(o, aval_of(o)) for o in outs]
        if result is None:
            result = [np.array(s) for s in stacks]
        else:
            for r, s in zip(result, stacks):
                r[mask] = s[mask]
    return result

def _cond_vjp(cts, ins, outs, wants, branches, _what, _source):
    """The derivative of a cond is a cond: each branch, run again, then sent backwards."""
    from .autodiff import backward, linearize
    index, ops = ins[0], ins[1:]
    cts = [ct if ct is not None else np.zeros(o.aval.shape, o.aval.dtype)
           for ct, o in zip(cts, outs)]
    wanted = [j for j, w in enumerate(wants[1:]) if w]
    backs = []
    for program in branches:
        def flat(*xs, program=program):
            operands, ct_in = xs[:len(ops)], xs[len(ops):]
            env = {}
            program = linearize(program, program.invars)
            eval_program(program, [], operands, env)
            got = backward(program.eqns, env, {v: c for v, c in zip(program.outvars, ct_in)
                                               if isinstance(v, Var)}, set(program.invars))
            return [got[program.invars[j]] if program.invars[j] in got else
                    np.zeros(aval_of(operands[j]).shape, aval_of(operands[j]).dtype)
                    for j in wanted]
        run = context.run or core.plain
        backs.append(trace(flat, [aval_of(x) for x in list(ops) + cts],
                           run if run.abstract else run.tracing()))
    programs, consts = common_consts(backs, range(len(backs)))
    got = bind(cond, index, *consts, *ops, *cts, branches=tuple(programs), _what=_what,
               _source=_source)
    out = [None] * len(ins)
    for j, g in zip(wanted, got):
        out[j + 1] = g
    return out

cond = Primitive("cond", _cond_stacked, _cond_abstract, vjp=_cond_vjp, multiple_results=True,
                 needs_run=True, cost=lambda ins, outs, **p: (0, 0),   # (on shapes alone, not
                 unlogged="lax.cond branches (which branch a device takes depends on values)")
