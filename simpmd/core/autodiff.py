"""Reverse-mode differentiation, collectives included: the engine of ``simpmd.grad``.

As in Autodidax, a gradient is built from the program: ``grad(f)(w)`` traces ``f`` into a
program (``program.trace``), runs it (computing every device's values, or, inside a body
being traced, writing its equations into that body's program), then walks its equations
backwards, applying each primitive's ``vjp`` rule. The rules compute with ``bind`` too, so
the backward equations are a program of their own kind: inside a traced body a cached call
replays them, and ``make_jaxpr`` of a grad prints them. The same path serves every engine:
every device at once, one device of an eager run, and plain NumPy outside any mapped body.

The derivative of a collective is a collective: ``all_gather`` becomes ``psum_scatter``
(FSDP's reduce-scatter), ``ppermute`` sends back along the inverse permutation, ``psum``
is ``psum`` under ``pmap``; they run inside ``core.backward_pass()``, so the log marks
them as backward. Under ``shard_map(check_vma=True)`` every value's type says which mesh
axes it varies over; a ``psum`` makes a varying value invariant, and its derivative only
hands the cotangent back, while combining an invariant value with a varying one inserts
``pvary``, whose derivative is the ``psum``. So on 8 devices the gradient of
``psum((v*v).sum(), 'i')`` is ``8 * 2v`` under ``pmap`` and ``2v`` under ``shard_map``, as
in JAX (tests/conformance/test_grad_vs_jax.py).
"""
from __future__ import annotations

import numpy as np

from . import core, dtypes, errors
from .core import Var, aval_of, backward_pass, bind, context
from .program import eval_program, trace
from .values import StackedValue

__all__ = ["value_and_vjp", "NotDifferentiableError", "backward", "linearize", "differentiable"]

class NotDifferentiableError(errors.SimpmdError, NotImplementedError):
    """An operation on a value being differentiated has no derivative rule here."""

_INSTEAD = ("Write the computation with operations it differentiates (arithmetic, @, sum, "
            "mean, max, reshape, indexing, exp, log, tanh, maximum, where, psum, pmean, "
            "all_gather, psum_scatter, ppermute, all_to_all), or take the gradient with jax.grad.")

def _no_rule(eqn) -> NotDifferentiableError:
    name, (source, code) = eqn.primitive.name, eqn.source
    line = f" (at {source}: {code})" if source else ""
    if eqn.primitive.collective:
        return NotDifferentiableError(
            f"Differentiation rule for {eqn.primitive.op!r} not implemented (as in JAX, which "
            f"raises NotImplementedError for grad of lax.{eqn.primitive.op}){line}. To take a "
            f"maximum that gradients flow through, all_gather the values and use .max() on them.")
    name = eqn.primitive.named(eqn.params) if eqn.primitive.named else name
    return NotDifferentiableError(f"simpmd.grad has no derivative rule for {name!r}{line}. {_INSTEAD}")

def differentiable(var) -> bool:
    """A variable a cotangent can reach: floating or complex (bfloat16 included)."""
    return dtypes.inexact(var.aval.dtype)

def backward(eqns, env, cts, active):
    """Send the cotangents ``cts`` (Var -> value) back through ``eqns``, in reverse, from
    the variables in ``active`` (those the differentiated inputs flow into, which grows as
    the equations are walked). ``env`` holds every forward variable's value. Returns the
    cotangents of every variable reached."""
    flows = []
    for eqn in eqns:                   # which equations the inputs flow through
        if any(type(v) is Var and v in active for v in eqn.invars):
            outs = [v for v in eqn.outvars if differentiable(v)]
            if outs:
                active.update(outs)
                flows.append(eqn)
    needed, linear = set(cts), []      # ... and which of those the results depend on
    for eqn in reversed(flows):
        if any(v in needed for v in eqn.outvars):
            if eqn.primitive.vjp is None:
                raise _no_rule(eqn)
            needed.update(v for v in eqn.invars if type(v) is Var)
            linear.append(eqn)
    linear.reverse()
    with backward_pass():
        for eqn in reversed(linear):
            outs = [cts.pop(v, None) for v in eqn.outvars]
            if all(c is None for c in outs):
                continue
            ins = [env[v] if type(v) is Var else v.value for v in eqn.invars]
            wants = [type(v) is Var and v in active for v in eqn.invars]
            outer, context.eqn = context.eqn, eqn     # backward equations keep its line
            try:
                got = eqn.primitive.vjp(outs if eqn.primitive.multiple_results else outs[0],
                                        ins, [env[v] for v in eqn.outvars], wants, **eqn.params)
            finally:
                context.eqn = outer
            for v, c in zip(eqn.invars, got):
                if c is None or type(v) is not Var or v not in active:
                    continue
                cts[v] = c if v not in cts else bind(_add_any, cts[v], c)
    return cts

def linearize(program, active):
    """``program`` with each equation that holds a body (a loop, a checkpoint) and takes a
    differentiated value rewritten by its row's ``linearize(eqn, wants)`` to also return
    the values its backward pass reads (its residuals), as JAX's partial evaluation does.
    Done before the forward pass runs, so that the forward pass computes them once."""
    active, eqns = set(active), []
    for eqn in program.eqns:
        wants = [type(v) is Var and v in active for v in eqn.invars]
        if any(wants):
            rule = eqn.primitive.linearize
            eqn = eqn if rule is None else rule(eqn, wants)
            active.update(v for v in eqn.outvars if differentiable(v))
        eqns.append(eqn)
    return core.Program(program.invars, eqns, program.outvars, program.in_tree,
                        program.out_tree, program.constvars, program.axis_env)

def _seed(out):
    """The cotangent a scalar result starts with: 1, varying as the result does."""
    aval = aval_of(out)
    one = np.ones((), aval.dtype)
    return bind(_pvary, one, axes=tuple(sorted(aval.vma, key=str))) if aval.vma else one

def value_and_vjp(flat_fun, leaves):
    """Trace ``flat_fun`` on the types of ``leaves``, run it on this thread's run, and send
    1 back from its first result (a scalar): its results, and each leaf's cotangent (None
    where none arrives)."""
    run = context.run or core.plain
    if not run.abstract:             # concrete inputs: every device's value, as the run holds it
        leaves = [x if isinstance(x, StackedValue) else
                  StackedValue(aval_of(x), run.stack_of(x, aval_of(x))) for x in leaves]
    program, consts = trace(flat_fun, [aval_of(x) for x in leaves], run.tracing())
    active = {v for v in program.invars if differentiable(v)}
    program = linearize(program, active)
    env = {}
    outs = eval_program(program, consts, leaves, env)   # the forward, on this run
    cts = {}
    if type(program.outvars[0]) is Var:
        cts = backward(program.eqns, env, {program.outvars[0]: _seed(outs[0])}, set(active))
    return outs, [cts.get(v) for v in program.invars]

from .collectives import pvary as _pvary  # noqa: E402
from .primitives import add_any as _add_any  # noqa: E402
