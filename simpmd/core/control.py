"""``cond``, the primitive of ``lax.cond`` and ``lax.switch``: one branch per device.

Each branch is traced once (by ``simpmd/lax.py``) into a program of its own, which becomes
a parameter of one equation of the enclosing program, as JAX's higher-order primitives
do. Values a branch reads from the enclosing body without being passed them become extra
operands (closure conversion). Running the equation runs every branch over every device,
each device keeping its own branch's result, with a branch's collectives run only for
the devices that take it (a group split between branches is a deadlock).
"""
from __future__ import annotations

import numpy as np

from .core import Primitive, Var, aval_of, bind, context
from .program import eval_program, trace
from .values import StackedValue

def _split_operands(ops, n_consts):
    out, start = [], 0
    rest = len(ops) - sum(n_consts)
    for n in n_consts:
        out.append(list(ops[start:start + n]))
        start += n
    return out, list(ops[len(ops) - rest:])

def _cond_abstract(index, *ops, branches, n_consts, _what, _source):
    vma = frozenset().union(index.vma, *(a.vma for p in branches for a in p.out_avals))
    return [a.update(vma=vma) for a in branches[0].out_avals]

def _cond_stacked(index, *ops, branches, n_consts, _what, _source):
    """Every branch over every device; each device keeps its own branch's result."""
    run = context.run
    chosen = np.clip(np.asarray(index.stack if isinstance(index, StackedValue) else index,
                                dtype=np.int64).reshape(-1), 0, len(branches) - 1)
    chosen = np.broadcast_to(chosen, (run.n,))
    consts, leaves = _split_operands(ops, n_consts)
    result = None
    for k, (program, cs) in enumerate(zip(branches, consts)):
        mask = chosen == k
        run.branches.append((mask, (_what, k) + tuple(_source)))
        try:
            outs = eval_program(program, cs, leaves)
        finally:
            run.branches.pop()
        stacks = [run.stack_of(o, aval_of(o)) for o in outs]
        if result is None:
            result = [np.array(s) for s in stacks]
        else:
            for r, s in zip(result, stacks):
                r[mask] = s[mask]
    return result

def _operand_vars(program, k, n_consts, n_leaves):
    """Branch ``k``'s variable for each operand of the cond (None: another branch's)."""
    before, after = sum(n_consts[:k]), sum(n_consts[k + 1:])
    return [None] * before + program.constvars + [None] * after + program.invars[:n_leaves]

def _cond_vjp(cts, ins, outs, wants, branches, n_consts, _what, _source):
    """The derivative of a cond is a cond: each branch, run again, then sent backwards."""
    from .autodiff import backward, linearize
    index, ops = ins[0], ins[1:]
    cts = [ct if ct is not None else np.zeros(o.aval.shape, o.aval.dtype)
           for ct, o in zip(cts, outs)]
    wanted = [j for j, w in enumerate(wants[1:]) if w]
    n_leaves = len(ops) - sum(n_consts)
    backs = []
    for k, program in enumerate(branches):
        def flat(*xs, k=k, program=program):
            operands, ct_in = xs[:len(ops)], xs[len(ops):]
            consts, leaves = _split_operands(operands, n_consts)
            env = {}
            program = linearize(program, program.constvars + program.invars)
            eval_program(program, consts[k], leaves, env)
            got = backward(program.eqns, env, {v: c for v, c in zip(program.outvars, ct_in)
                                               if isinstance(v, Var)},
                           set(program.constvars + program.invars))
            mine = _operand_vars(program, k, n_consts, n_leaves)
            return [got[mine[j]] if mine[j] in got else
                    np.zeros(aval_of(operands[j]).shape, aval_of(operands[j]).dtype)
                    for j in wanted]
        run = context.run
        program, lifted = trace(flat, [aval_of(x) for x in list(ops) + cts],
                                run if run.abstract else run.tracing())
        backs.append((program, lifted))
    got = bind(cond, index, *[c for _, cs in backs for c in cs], *ops, *cts,
               branches=tuple(p for p, _ in backs), n_consts=tuple(len(cs) for _, cs in backs),
               _what=_what, _source=_source)
    out = [None] * len(ins)
    for j, g in zip(wanted, got):
        out[j + 1] = g
    return out

cond = Primitive("cond", _cond_stacked, _cond_abstract, vjp=_cond_vjp, multiple_results=True,
                 needs_run=True, cost=lambda ins, outs, **p: (0, 0),
                 show=lambda p: {"branches": p["branches"]})       # JAX's one parameter
