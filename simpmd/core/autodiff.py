"""Reverse-mode differentiation, collectives included: ``simpmd.grad`` and friends.

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
in JAX (tests/test_grad_vs_jax.py).
"""
from __future__ import annotations

import numpy as np

from . import core, dtypes, errors, tree
from .core import Var, aval_of, backward_pass, bind, context
from .program import eval_program, trace
from .values import StackedValue

__all__ = ["grad", "value_and_grad", "NotDifferentiableError", "backward", "linearize"]


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
    if name == "numpy_call":
        name = f"numpy.{eqn.params['name']}"
    return NotDifferentiableError(f"simpmd.grad has no derivative rule for {name!r}{line}. {_INSTEAD}")


def _float(var) -> bool:
    return dtypes.inexact(var.aval.dtype)


def backward(eqns, env, cts, active):
    """Send the cotangents ``cts`` (Var -> value) back through ``eqns``, in reverse, from
    the variables in ``active`` (those the differentiated inputs flow into, which grows as
    the equations are walked). ``env`` holds every forward variable's value. Returns the
    cotangents of every variable reached."""
    flows = []
    for eqn in eqns:                   # which equations the inputs flow through
        if any(type(v) is Var and v in active for v in eqn.invars):
            outs = [v for v in eqn.outvars if _float(v)]
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
            rule = getattr(eqn.primitive, "linearize", None)
            eqn = eqn if rule is None else rule(eqn, wants)
            active.update(v for v in eqn.outvars if _float(v))
        eqns.append(eqn)
    return core.Program(program.invars, eqns, program.outvars, program.in_tree,
                        program.out_tree, program.constvars, program.axis_env)


def _seed(out):
    """The cotangent a scalar result starts with: 1, varying as the result does."""
    aval = aval_of(out)
    one = np.ones((), aval.dtype)
    return bind(_pvary, one, axes=tuple(sorted(aval.vma, key=str))) if aval.vma else one


def _check_argnums(argnums, nargs):
    many = isinstance(argnums, (tuple, list))
    nums = tuple(argnums) if many else (argnums,)
    for a in nums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise TypeError(f"argnums={argnums!r} does not fit a call with {nargs} positional "
                            f"argument(s): each must be an int in [{-nargs}, {nargs}).")
    return many, tuple(a % nargs for a in nums)


def _check_input(leaf, a):
    dtype = aval_of(leaf).dtype
    if not dtypes.inexact(dtype):
        raise TypeError(
            f"grad requires real- or complex-valued inputs (input dtype that is a sub-dtype "
            f"of np.inexact), but got {dtype.name} for argument {a}. If you want to use "
            f"integer-valued inputs, convert them to float first (as JAX says).")


class _Differentiating:
    depth = 0


def _value_and_grad(fun, argnums, has_aux, args, kwargs):
    many, nums = _check_argnums(argnums, len(args))
    if _Differentiating.depth:
        raise NotDifferentiableError(
            "simpmd.grad was called inside a function another simpmd.grad is "
            "differentiating: simpmd.grad does not nest. Use jax.grad for higher derivatives.")
    flat = [tree.flatten(args[a]) for a in nums]
    leaves = [leaf for ls, _ in flat for leaf in ls]
    for a, (ls, _) in zip(nums, flat):
        for leaf in ls:
            _check_input(leaf, a)
    shape = {}

    def flat_fun(*xs):
        full, it = list(args), iter(xs)
        for a, (ls, treedef) in zip(nums, flat):
            full[a] = tree.unflatten(treedef, [next(it) for _ in ls])
        result = fun(*full, **kwargs)
        out, aux = result if has_aux else (result, None)
        if has_aux and not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError("has_aux=True needs the function to return a pair (output, "
                            f"auxiliary data), got {type(result).__name__}.")
        if aval_of(out).shape != ():
            raise TypeError(f"Gradient only defined for scalar-output functions. Output had "
                            f"shape: {aval_of(out).shape}.")
        aux_leaves, shape["aux"] = tree.flatten(aux)
        return [out] + aux_leaves

    run = context.run or core.plain
    if not run.abstract:             # concrete inputs: every device's value, as the run holds it
        leaves = [x if isinstance(x, StackedValue) else
                  StackedValue(aval_of(x), run.stack_of(x, aval_of(x))) for x in leaves]
    _Differentiating.depth += 1
    try:
        program, consts = trace(flat_fun, [aval_of(x) for x in leaves], run.tracing())
    finally:
        _Differentiating.depth -= 1
    active = {v for v in program.invars if _float(v)}
    program = linearize(program, active)
    env = {}
    outs = eval_program(program, consts, leaves, env)   # the forward, on this run
    cts = {}
    if type(program.outvars[0]) is Var:
        cts = backward(program.eqns, env, {program.outvars[0]: _seed(outs[0])}, set(active))
    grads, it = [], iter(program.invars)
    for (ls, treedef) in flat:
        gs = []
        for leaf in ls:
            var = next(it)
            c = cts.get(var)
            gs.append(_as_result(_zeros(leaf) if c is None else _cast(c, aval_of(leaf))))
        grads.append(tree.unflatten(treedef, gs))
    value = _as_result(outs[0])
    aux = tree.unflatten(shape["aux"], [_as_result(x) for x in outs[1:]]) if has_aux else None
    return value, aux, (tuple(grads) if many else grads[0])


def _zeros(leaf):
    aval = aval_of(leaf)
    return bind(_bid, np.zeros((), aval.dtype), shape=aval.shape, broadcast_dimensions=(),
                sharding=aval.sharding)


def _cast(c, aval):
    if aval_of(c).dtype == aval.dtype:
        return c
    return bind(_convert, c, new_dtype=aval.dtype, weak_type=False)


def _as_result(x):
    """Outside any mapped body, a result is a NumPy array (the only device's value)."""
    if context.run is None and isinstance(x, StackedValue):
        return np.asarray(x.stack[0])
    return x


def _uses_jax(value) -> bool:
    from . import bridge
    return bridge.jax is not None and bridge.jax.uses_jax(value)


def value_and_grad(fun, argnums=0, has_aux=False):
    """Like ``jax.value_and_grad``: a function returning ``(value, gradient)``
    (``((value, aux), gradient)`` with ``has_aux``), on simpmd's devices or in plain NumPy.
    Inside a real JAX trace it is ``jax.value_and_grad`` itself."""
    def value_and_grad_fun(*args, **kwargs):
        if _uses_jax((args, kwargs)):
            import jax
            return jax.value_and_grad(fun, argnums, has_aux)(*args, **kwargs)
        value, aux, grads = _value_and_grad(fun, argnums, has_aux, args, kwargs)
        return ((value, aux), grads) if has_aux else (value, grads)
    value_and_grad_fun.__name__ = f"value_and_grad({getattr(fun, '__name__', 'fun')})"
    return value_and_grad_fun


def grad(fun, argnums=0, has_aux=False):
    """Like ``jax.grad``: the gradient of a scalar function, through collectives too.

    ``argnums`` picks the differentiated argument(s) (an int or a tuple); ``has_aux``
    means ``fun`` returns ``(loss, aux)`` and the result is ``(gradient, aux)``. Inside a
    real JAX trace it is ``jax.grad`` itself, so one body runs on both engines.
    """
    def grad_fun(*args, **kwargs):
        if _uses_jax((args, kwargs)):
            import jax
            return jax.grad(fun, argnums, has_aux)(*args, **kwargs)
        _, aux, grads = _value_and_grad(fun, argnums, has_aux, args, kwargs)
        return (grads, aux) if has_aux else grads
    grad_fun.__name__ = f"grad({getattr(fun, '__name__', 'fun')})"
    return grad_fun


from .collectives import pvary as _pvary  # noqa: E402
from .primitives import add_any as _add_any, broadcast_in_dim as _bid  # noqa: E402
from .primitives import convert_element_type as _convert  # noqa: E402
