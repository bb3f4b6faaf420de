"""Primitives that hold programs: ``cond`` (``lax.cond``/``lax.switch``), a pmap nested in a
body (``xla_pmap``), and ``debug_callback`` (``simpmd.debug.print``).

A branch or a nested body is traced once into a program of its own, which becomes a
parameter of one equation of the enclosing program, as JAX's higher-order primitives do.
Values the branch reads from the enclosing body without being passed them become extra
operands (closure conversion). Running the equation runs those programs: every branch
over every device, each device keeping its own branch's result, with the branch's
collectives run only for the devices that take it (a group split between branches is a
deadlock); a nested pmap over a grid of outer x inner devices.
"""
from __future__ import annotations

import numpy as np

from . import errors, tree
from .core import Aval, Primitive, Var, aval_of, bind, caller_source, context, running
from .program import eval_program, trace
from .values import StackedValue


def _values(stacks, avals):
    return [StackedValue(a, s) for a, s in zip(avals, stacks)]


# -- cond: one branch per device, every branch traced ------------------------------------------


def switch(index, branches, operands, what="switch"):
    """``lax.switch`` (and ``lax.cond``) on the run of this thread: in an eager run the
    device takes its branch; otherwise every branch is traced and one ``cond`` bound."""
    run = context.run
    if run is None or (run.eager and not _traced(index)):
        k = int(np.clip(int(np.asarray(getattr(index, "value", index))), 0, len(branches) - 1))
        return branches[k](*operands)
    if aval_of(index).shape != ():
        raise TypeError(
            f"lax.{what}'s {'predicate' if what == 'cond' else 'index'} must be a scalar on "
            f"each device, got shape {aval_of(index).shape}. Reduce it first (e.g. "
            f"x.sum() > 0), or choose elementwise with snp.where.")
    leaves, in_tree = tree.flatten(operands)
    tracing = run if run.abstract else run.tracing()
    programs, consts, out_trees = [], [], []
    for branch in branches:
        def flat(*xs, branch=branch):
            out, out_tree = tree.flatten(branch(*tree.unflatten(in_tree, xs)))
            out_trees.append(out_tree)
            return out
        program, lifted = trace(flat, [aval_of(x) for x in leaves], tracing)
        programs.append(program)
        consts.append(lifted)
    _check_branches(programs, out_trees, what)
    if what == "cond":
        index = bind(_convert, index, new_dtype=np.dtype(np.int32), weak_type=False)
    outs = bind(cond, index, *[c for cs in consts for c in cs], *leaves,
                branches=tuple(programs), n_consts=tuple(len(c) for c in consts),
                _what=what, _source=caller_source())
    return tree.unflatten(out_trees[0], outs)


def _traced(x):
    return isinstance(x, StackedValue) and x.stack is None


def _check_branches(programs, out_trees, what):
    first = programs[0]
    for program, out_tree in zip(programs[1:], out_trees[1:]):
        if out_tree != out_trees[0]:
            raise errors.BranchError(
                f"lax.{what}'s branches return different structures: {out_trees[0]} and "
                f"{out_tree}. Every branch must return the same pytree of arrays, with the "
                f"same shapes and dtypes (JAX compiles both).")
        for a, b in zip(first.out_avals, program.out_avals):
            if a.shape != b.shape:
                raise errors.BranchError(
                    f"lax.{what}'s branches return arrays of different shapes, {a.shape} and "
                    f"{b.shape}. Every branch must return the same shapes and dtypes (JAX "
                    f"compiles both); pad or reshape one of them.")


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
                 needs_run=True, cost=lambda ins, outs, **p: (0, 0))


# -- a pmap nested in a body ------------------------------------------------------------------


def _map_avals(avals, in_axes):
    """One inner device's types: each mapped argument without its mapped axis."""
    return [a if ax is None else a.update(shape=a.shape[:ax] + a.shape[ax + 1:])
            for a, ax in zip(avals, in_axes)]


def nested_pmap(body_flat, args, in_axes, out_axes, axis_name, size, name, log=None):
    """A pmap called in a body being traced: its body traced once on the grid of outer x
    inner devices, one ``xla_pmap`` equation of the outer program. ``out_axes`` may be a
    function of the traced program (the results' structure is known only then)."""
    run = context.run
    inner = run.nest(((axis_name, size),), abstract=True)
    program, lifted = trace(body_flat, _map_avals([aval_of(x) for x in args], in_axes), inner)
    out_axes = out_axes(program) if callable(out_axes) else out_axes
    return bind(xla_pmap, *lifted, *args, call_jaxpr=program, axis_name=axis_name,
                axis_size=size, in_axes=tuple(in_axes), out_axes=tuple(out_axes),
                n_consts=len(lifted), name=name, _log=log)


def _pmap_abstract(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                   _log=None):
    out = []
    for a, ax in zip(call_jaxpr.out_avals, out_axes):
        shape = a.shape if ax is None else a.shape[:ax] + (axis_size,) + a.shape[ax:]
        out.append(Aval(shape, a.dtype, a.weak_type))
    return out


def _pmap_stacked(*ops, call_jaxpr, axis_name, axis_size, in_axes, out_axes, n_consts, name,
                  _log=None):
    """The inner program over the grid of outer x inner devices; ``_log`` (the front end's)
    writes what each inner device received and returned into the run's log."""
    run = context.run
    inner = run.nest(((axis_name, axis_size),), abstract=False)
    size, n = axis_size, run.n

    def spread(x, ax):                      # outer rows -> rows of the inner grid
        stack = run.stack_of(x, aval_of(x))
        if ax is None:
            return np.repeat(stack, size, axis=0)
        moved = np.moveaxis(stack, ax + 1, 1)
        return moved.reshape((n * size,) + moved.shape[2:])
    consts, args = ops[:n_consts], ops[n_consts:]
    pieces = [spread(c, None) for c in consts] + [spread(x, ax) for x, ax in zip(args, in_axes)]
    avals = call_jaxpr.in_avals
    if _log is not None:
        _log.receive(inner, pieces[n_consts:])
    with running(inner):
        outs = eval_program(call_jaxpr, _values(pieces[:n_consts], [v.aval for v in call_jaxpr.constvars]),
                            _values(pieces[n_consts:], avals))
    stacks = [inner.stack_of(o, aval_of(o)) for o in outs]
    if _log is not None:
        _log.returned(inner, stacks, n)
    result = []
    for stack, ax in zip(stacks, out_axes):
        per_outer = stack.reshape((n, size) + stack.shape[1:])
        result.append(per_outer[:, 0] if ax is None else np.moveaxis(per_outer, 1, ax + 1))
    return result


xla_pmap = Primitive("xla_pmap", _pmap_stacked, _pmap_abstract, multiple_results=True,
                     needs_run=True, cost=lambda ins, outs, **p: (0, 0),
                     show=lambda p: {k: p[k] for k in ("axis_name", "axis_size", "call_jaxpr",
                                                       "name")})
"""(A pmap nested in a body is not differentiated here: take the gradient inside it.)"""


# -- debug.print --------------------------------------------------------------------------------


def debug_print(fmt, args, kwargs):
    """``simpmd.debug.print``: an equation that prints one line per device when it runs."""
    leaves, in_tree = tree.flatten((args, kwargs))
    bind(debug_callback, *leaves, fmt=fmt, in_tree=in_tree, _source=caller_source())


def _print_stacked(*ops, fmt, in_tree, _source):
    run = context.run
    stacks = [run.stack_of(x, aval_of(x)) for x in ops]
    texts = []
    for k in range(run.n):
        args, kwargs = tree.unflatten(in_tree, [s[k] for s in stacks])
        texts.append(fmt.format(*args, **kwargs))
    run.log.print(run, texts, _source)
    return []


debug_callback = Primitive(
    "debug_callback", _print_stacked, lambda *ops, **params: [], multiple_results=True,
    needs_run=True, cost=lambda ins, outs, **p: (0, 0),
    show=lambda p: {"callback": f"print({p['fmt']!r})"})

from .primitives import convert_element_type as _convert  # noqa: E402
