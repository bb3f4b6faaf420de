"""Loops and checkpoints: primitives that hold a program and run it many times, or twice.

``scan`` runs its body once per row of its stacked inputs, passing a carry from one
iteration to the next (``lax.scan``, and ``lax.fori_loop`` with static bounds); ``while``
runs its body as long as its predicate holds (``lax.while_loop``); ``remat2`` runs its body
once, and again in the backward pass (``simpmd.checkpoint``). As in JAX each is one
equation, its body a program traced once (by the front ends, ``simpmd/lax.py`` and
``simpmd/api/checkpoint.py``) and kept in its parameters. Running one runs the body over
every device at once, iteration by iteration; the log names the iteration of each event.
A ``while`` whose predicate differs between devices keeps looping only on the devices
where it holds, so a collective in its body that some devices of a group no longer reach
is reported as the deadlock it would be on hardware, as in a ``lax.cond`` branch.

Derivatives. A loop's backward pass reads values its body computed, one set per
iteration. :func:`partial_eval` traces a body's forward and backward passes into one
program and cuts it in two: the forward half, which also returns the values the backward
half reads (the *residuals*), and the backward half. ``autodiff.linearize`` asks each of
these rows to rewrite its equation that way (the row's ``linearize`` column) before the
forward pass runs, so a ``scan`` stacks its residuals over the iterations, as JAX's does;
its ``vjp`` is then a ``scan`` in reverse of the backward half, collectives and all. A
checkpoint keeps only the residuals its policy saves and computes the others again in the
backward pass: those equations are marked 'recompute', and so are their collectives in the
log. Every row that runs its body once (a checkpoint, ``jit``, ``shard_map``, a pmap, each
branch of a ``cond``) is cut by :func:`split_call` and differentiated by :func:`split_vjp`.
"""
from __future__ import annotations

import collections

import numpy as np

from . import core
from .autodiff import NotDifferentiableError, backward, differentiable, linearize
from .core import Equation, Primitive, Program, Var, aval_of, backward_pass, bind, context
from .program import eval_program, trace
from .values import StackedValue

def closed(program, lifted_first=0):
    """A traced body as a loop holds it: the values it closed over (``constvars``) become
    its first inputs, after the first ``lifted_first`` of its own (as JAX's closure
    conversion orders a scan's constants)."""
    ins = program.invars
    return Program(ins[:lifted_first] + program.constvars + ins[lifted_first:], program.eqns,
                   program.outvars, axis_env=program.axis_env)

class iterating:
    """``with iterating(i):`` tells the log which iteration of a loop is running."""

    def __init__(self, i):
        self.i = i

    def __enter__(self):
        self.outer, context.iteration = context.iteration, context.iteration + (self.i,)

    def __exit__(self, *exc):
        context.iteration = self.outer

def _run():
    return context.run or core.plain

def _stacks(values):
    run = _run()
    return [run.stack_of(v, aval_of(v)) for v in values]

# -- scan ------------------------------------------------------------------------------------

def _scan_stacked(*ops, jaxpr, length, reverse, num_consts, num_carry, **params):
    """The body once per iteration, over every device: row ``i`` of each ``xs`` in, row
    ``i`` of each ``ys`` out, the carry passed on."""
    n_in, run = num_consts + num_carry, _run()
    consts, carry = list(ops[:num_consts]), list(ops[num_consts:n_in])
    xs = _stacks(ops[n_in:])
    x_avals = jaxpr.in_avals[n_in:]
    ys = [np.zeros((run.n, length) + run.block_shape(a), a.dtype)
          for a in jaxpr.out_avals[num_carry:]]
    for step in range(length):
        i = length - 1 - step if reverse else step
        with iterating(i):
            outs = eval_program(jaxpr, [], consts + carry +
                                [StackedValue(a, x[:, i]) for a, x in zip(x_avals, xs)])
        carry = outs[:num_carry]
        for y, s in zip(ys, _stacks(outs[num_carry:])):
            y[:, i] = s
    return _stacks(carry) + ys

def _scan_abstract(*avals, jaxpr, length, num_carry, **params):
    outs = jaxpr.out_avals
    return outs[:num_carry] + [a.update(shape=(length,) + a.shape) for a in outs[num_carry:]]

def _depends(program, active) -> list:
    """Which outputs of ``program`` depend on its inputs marked in ``active``."""
    live = {v for v, a in zip(program.invars, active) if a}
    for e in program.eqns:
        if any(type(v) is Var and v in live for v in e.invars):
            live.update(v for v in e.outvars if differentiable(v))
    return [type(v) is Var and v in live and differentiable(v) for v in program.outvars]

def _scan_linearize(eqn, wants):
    """The scan, rewritten to also stack its residuals; its backward body in ``_vjp``."""
    p = eqn.params
    body, nc, nk = p["jaxpr"], p["num_consts"], p["num_carry"]
    active = [w and differentiable(v) for w, v in zip(wants, body.invars)]
    while True:                 # a carry that a differentiated value reaches is differentiated
        reached = _depends(body, active)
        grow = [nc + k for k in range(nk) if reached[k] and not active[nc + k]]
        if not grow:
            break
        for i in grow:
            active[i] = True
    body = linearize(body, [v for v, a in zip(body.invars, active) if a])
    with_ct = active[nc:nc + nk] + reached[nk:]
    accumulate = [i < nc for i in range(len(active))]
    joint, fwd, bwd, res = partial_eval(body, active, with_ct, accumulate)
    n_in, n_out = len(body.invars), len(body.outvars)
    primal, res = joint.invars[:n_in], dict(res)
    kind = {v: (0 if i < nc else 1 if i < nc + nk else 2) for i, v in enumerate(primal)}
    const_in = [i for i, v in enumerate(primal) if kind.get(v) == 0 and v in res]
    xs_in = [i for i, v in enumerate(primal) if kind.get(v) == 2 and v in res]
    saved = [v for v in res if kind.get(v, 1) == 1]          # carries, and computed values
    n_ct_carry = sum(with_ct[:nk])
    backward = Program([res[primal[i]] for i in const_in] + joint.invars[n_in:]
                       + [res[v] for v in saved] + [res[primal[i]] for i in xs_in], bwd,
                       joint.outvars[n_out:], axis_env=body.axis_env)
    forward = Program(primal, fwd, joint.outvars[:n_out] + saved, axis_env=body.axis_env)
    layout = (tuple(const_in), tuple(xs_in), tuple(active), tuple(with_ct), len(saved), n_ct_carry)
    res_vars = [Var(v.aval.update(shape=(p["length"],) + v.aval.shape)) for v in saved]
    return Equation(eqn.primitive, dict(p, jaxpr=forward, _vjp=(backward, layout)), eqn.invars,
                    eqn.outvars + res_vars, eqn.source, eqn.phase)

def _scan_vjp(cts, ins, outs, wants, *, jaxpr, length, reverse, num_consts, num_carry, unroll,
              _vjp=None, **params):
    """A scan in reverse of the backward body: the carries' cotangents carried backwards,
    the constants' summed over the iterations, the ``xs``' stacked."""
    backward, (const_in, xs_in, active, with_ct, n_saved, n_ct_carry) = _vjp
    n_out = len(outs) - n_saved
    acc = [zeros(aval_of(ins[i])) for i in range(num_consts) if active[i]]
    ct = [zeros(aval_of(outs[k])) if cts[k] is None else
          _like(cts[k], aval_of(outs[k])) for k in range(n_out) if with_ct[k]]
    got = bind(scan, *[ins[i] for i in const_in], *acc, *ct, *outs[n_out:],
               *[ins[i] for i in xs_in], jaxpr=backward, length=length, reverse=not reverse,
               num_consts=len(const_in), num_carry=len(acc) + n_ct_carry, unroll=unroll)
    it = iter(got)
    return [next(it) if a else None for a in active]

scan = Primitive("scan", _scan_stacked, _scan_abstract, vjp=_scan_vjp, multiple_results=True,
                 needs_run=True, linearize=_scan_linearize, cost=lambda ins, outs, **p: (0, 0))

# -- while -----------------------------------------------------------------------------------

def _while_stacked(*ops, cond_jaxpr, body_jaxpr, cond_nconsts, body_nconsts, _source=("", "")):
    """The body while the predicate holds, on each device: a device whose predicate is
    false keeps its carry, and only the devices still looping take part in the body's
    collectives (a group split between the two is a deadlock)."""
    run = _run()
    cc, bc = list(ops[:cond_nconsts]), list(ops[cond_nconsts:cond_nconsts + body_nconsts])
    carry = list(ops[cond_nconsts + body_nconsts:])
    avals = body_jaxpr.out_avals
    looping, i = np.ones(run.n, bool), 0
    while True:
        run.branches.append((looping, ("while_loop", i) + tuple(_source)))
        try:
            with iterating(i):
                pred = _stacks(eval_program(cond_jaxpr, [], cc + carry))[0]
                looping = looping & np.broadcast_to(pred.reshape(-1), (run.n,))
                if not looping.any():
                    break
                run.branches[-1] = (looping, run.branches[-1][1])
                outs = eval_program(body_jaxpr, [], bc + carry)
        finally:
            run.branches.pop()
        old, new = _stacks(carry), _stacks(outs)
        carry = [StackedValue(a, n if looping.all() else
                              np.where(looping.reshape((-1,) + (1,) * len(a.shape)), n, o))
                 for a, o, n in zip(avals, old, new)]
        i += 1
    return _stacks(carry)

def _while_vjp(*args, **params):
    raise NotDifferentiableError(
        "Reverse-mode differentiation does not work for lax.while_loop or lax.fori_loop with "
        "dynamic start/stop values. Try using lax.scan, or using fori_loop with static "
        "start/stop. (JAX's words: the number of iterations is known only when the loop has "
        "run, so the values the backward pass needs cannot be laid out in advance.)")

while_ = Primitive("while", _while_stacked, lambda *avals, body_jaxpr, **p: body_jaxpr.out_avals,
                   vjp=_while_vjp, multiple_results=True, needs_run=True,
                   cost=lambda ins, outs, **p: (0, 0))

# -- checkpoint (remat) ------------------------------------------------------------------------

def _remat_stacked(*ops, jaxpr, **params):
    return _stacks(eval_program(jaxpr, [], list(ops)))

def _saveable(policy):
    """Whether a policy lets the forward pass keep an equation's results for the backward
    pass (``policy(primitive, *avals, **params)``, as jax.checkpoint_policies ask)."""
    if policy is None:
        return lambda e: False
    return lambda e: bool(policy(e.primitive, *[aval_of(v) for v in e.invars], **e.params))

# How a body run once was cut for a derivative: which of its inputs the backward half reads,
# how many residuals the forward half adds, which inputs are differentiated, which results
# get a cotangent.
Split = collections.namedtuple("Split", "used n_saved active with_ct")

def split_call(body, wants, saveable=None, every_input=False, with_ct=None):
    """A body that runs once (a checkpoint, a jit, a shard_map, a cond's branch) cut for
    its derivative, as JAX's partial evaluation cuts it: the forward half returns its
    results, then the residuals; the backward half takes the inputs it reads (all of them
    with ``every_input``), the residuals, then the cotangents of the results in
    ``with_ct`` (those the inputs reach, unless given), and returns the differentiated
    inputs' cotangents. One strategy for every such row."""
    active = [w and differentiable(v) for w, v in zip(wants, body.invars)]
    body = linearize(body, [v for v, a in zip(body.invars, active) if a])
    with_ct = _depends(body, active) if with_ct is None else with_ct
    joint, fwd, bwd, res = partial_eval(body, active, with_ct, saveable=saveable)
    n_in, n_out = len(body.invars), len(body.outvars)
    primal, res = joint.invars[:n_in], dict(res)
    saved = [v for v in res if v not in primal]
    used = list(range(n_in)) if every_input else [i for i, v in enumerate(primal) if v in res]
    forward = Program(primal, fwd, joint.outvars[:n_out] + saved, axis_env=body.axis_env)
    backward = Program([res.get(primal[i]) or Var(primal[i].aval) for i in used]
                       + [res[v] for v in saved] + joint.invars[n_in:], bwd,
                       joint.outvars[n_out:], axis_env=body.axis_env)
    return forward, backward, Split(used, len(saved), active, with_ct)

def split_vjp(cts, ins, outs, split, run_backward):
    """The cotangents of a split row's inputs: ``run_backward(operands)`` binds its
    backward half on the inputs it reads, the residuals and the results' cotangents."""
    if not any(split.active):
        return [None] * len(ins)
    n_out = len(outs) - split.n_saved
    ct = [cts[k] if cts[k] is not None else zeros(aval_of(outs[k]))
          for k in range(n_out) if split.with_ct[k]]
    got = iter(run_backward([ins[i] for i in split.used] + list(outs[n_out:]) + ct))
    return [next(got) if a else None for a in split.active]

def _remat_linearize(eqn, wants):
    p = eqn.params
    forward, backward, split = split_call(p["jaxpr"], wants, _saveable(p["policy"]),
                                          every_input=True)
    return Equation(eqn.primitive, dict(p, jaxpr=forward, _vjp=(backward, split)), eqn.invars,
                    eqn.outvars + [Var(v.aval) for v in forward.outvars[len(eqn.outvars):]],
                    eqn.source, eqn.phase)

def _remat_vjp(cts, ins, outs, wants, *, jaxpr, _vjp=None, **params):
    """The backward half, as one ``remat2[differentiated=True]``: what the policy did not
    save is computed again there."""
    backward, split = _vjp
    return split_vjp(cts, ins, outs, split, lambda operands: bind(
        remat, *operands, jaxpr=backward, differentiated=True, policy=params["policy"],
        prevent_cse=params["prevent_cse"]))

remat = Primitive("remat2", _remat_stacked, lambda *avals, jaxpr, **p: jaxpr.out_avals,
                  vjp=_remat_vjp, multiple_results=True, needs_run=True,
                  linearize=_remat_linearize, cost=lambda ins, outs, **p: (0, 0))

name_p = Primitive("name", lambda x, name: x, lambda x, name: x,     # jax.ad_checkpoint's
                   vjp=lambda ct, ins, outs, wants, name: [ct],      # checkpoint_name
                   cost=lambda ins, outs, **p: (0, 0))

# -- residuals: the forward half of a derivative, and what it hands the backward half ---------

def zeros(aval):
    """Zeros of type ``aval``, varying over the axes it varies over."""
    z = bind(_bid, np.zeros((), aval.dtype), shape=aval.shape, broadcast_dimensions=(),
             sharding=None)
    return _like(z, aval)

def _like(x, aval):
    """``x`` given ``aval``'s dtype and made to vary as it does (a cotangent, carried)."""
    if aval_of(x).dtype != aval.dtype:
        x = bind(_convert, x, new_dtype=aval.dtype, weak_type=False)
    missing = tuple(sorted(set(aval.vma) - set(aval_of(x).vma), key=str))
    run = _run()
    return bind(_pvary, x, axes=missing) if missing and run.check_vma else x

def _joint(body, active, with_ct, accumulate):
    """The function of (primals, accumulators, output cotangents) that runs ``body``
    forward, then backward: (outputs, cotangents of the active inputs)."""
    n_in = len(body.invars)
    acc_at = [i for i in range(n_in) if active[i] and accumulate[i]]

    def joint(*xs):
        primals, accs = xs[:n_in], xs[n_in:n_in + len(acc_at)]
        phase, context.phase = context.phase, "forward"
        env = {}
        try:
            outs = eval_program(body, [], list(primals), env)
        finally:
            context.phase = phase
        joint.forward = len(context.recorders[-1].eqns)   # (a body's own backward equations,
        with backward_pass():                             # a grad inside it, are forward here)
            seed = {}
            for v, c in zip([v for v, w in zip(body.outvars, with_ct) if w], xs[n_in + len(acc_at):]):
                if type(v) is Var:
                    seed[v] = c if v not in seed else bind(_add_any, seed[v], c)
            got = backward(body.eqns, env, seed, {v for v, a in zip(body.invars, active) if a})
            grads = []
            for i, v in enumerate(body.invars):
                if active[i]:
                    g = _like(got[v], v.aval) if v in got else zeros(v.aval)
                    grads.append(bind(_add_any, accs[acc_at.index(i)], g) if i in acc_at else g)
        return list(outs) + grads
    avals = (body.in_avals + [body.invars[i].aval for i in acc_at]
             + [v.aval.update(weak_type=False) for v, w in zip(body.outvars, with_ct) if w])
    return joint, avals

def partial_eval(body, active, with_ct, accumulate=None, saveable=None):
    """Trace ``body`` forward and backward into one program, and cut it in two.

    ``active``: which inputs are differentiated; ``with_ct``: which outputs receive a
    cotangent; ``accumulate``: which inputs' cotangents are added to an accumulator input
    (a scan's constants). The joint program's inputs are (primals, accumulators,
    cotangents), its outputs (the body's outputs, the active inputs' cotangents). Returns
    (joint program, forward equations, backward equations, residuals): the residuals are
    the forward values (primal inputs included) the backward equations read, each paired
    with the variable the backward equations (and the joint's outputs) read it as. With
    ``saveable(eqn)``, only the results of equations it accepts may be residuals; the
    forward equations the others need run again in the backward half, marked 'recompute'.
    """
    joint, avals = _joint(body, active, with_ct, accumulate or [False] * len(active))
    run = _run()
    program, _ = trace(joint, avals, run if run.abstract else run.tracing())
    fwd, bwd = program.eqns[:joint.forward], program.eqns[joint.forward:]
    made = {v: e for e in fwd for v in e.outvars}
    kept = (lambda v: True) if saveable is None else (lambda v: v not in made or saveable(made[v]))
    grads = [v for v in program.outvars[len(body.outvars):] if type(v) is Var]
    todo, again = [v for v in _reads(bwd) + grads if v in made and not kept(v)], set()
    while todo:
        e = made[todo.pop()]
        if e not in again:
            again.add(e)
            todo += [v for v in e.invars if type(v) is Var and v in made and not kept(v)]
    redo = [e for e in fwd if e in again]
    forward = set(program.invars[:len(body.invars)]) | set(made)
    res = [v for v in dict.fromkeys(_reads(redo + bwd) + grads)
           if v in forward and made.get(v) not in again]
    fresh = {v: Var(v.aval) for v in res + [v for e in redo for v in e.outvars]}
    bwd = [Equation(e.primitive, e.params, [fresh.get(v, v) for v in e.invars],    # own names
                    [fresh.get(v, v) for v in e.outvars], e.source,
                    "recompute" if e in again else e.phase) for e in redo + bwd]
    outs = program.outvars[:len(body.outvars)] + [fresh.get(v, v) for v in
                                                  program.outvars[len(body.outvars):]]
    joint = Program(program.invars, program.eqns, outs, axis_env=program.axis_env)
    return joint, fwd, bwd, [(v, fresh[v]) for v in res]

def _reads(eqns) -> list:
    return [v for e in eqns for v in e.invars if type(v) is Var]

from .collectives import pvary as _pvary  # noqa: E402
from .primitives import add_any as _add_any, broadcast_in_dim as _bid  # noqa: E402
from .primitives import convert_element_type as _convert  # noqa: E402
