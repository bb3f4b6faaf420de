"""``simpmd.grad`` and ``simpmd.value_and_grad``: JAX's signatures (``argnums``,
``has_aux``), their checks, and the hand-over to ``jax.grad`` inside a JAX trace, around the
core's reverse mode (``simpmd/core/autodiff.py``).
"""
from __future__ import annotations

import numpy as np

from ..core import bridge, dtypes
from . import tree
from ..core.autodiff import NotDifferentiableError, value_and_vjp
from ..core.core import aval_of, bind, context
from ..core.primitives import broadcast_in_dim as _bid, convert_element_type as _convert
from ..core.values import StackedValue
from .shard_map_eqn import host_result


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


def _value_and_grad(fun, argnums, has_aux, args, kwargs):
    many, nums = _check_argnums(argnums, len(args))
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

    outs, cts = value_and_vjp(flat_fun, leaves)
    grads, it = [], iter(cts)
    for (ls, treedef) in flat:
        gs = []
        for leaf in ls:
            c = next(it)
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
    """Outside any mapped body, a result is a NumPy array (the only device's value), or
    the MeshArray a shard_map laid it out as."""
    if context.run is None and isinstance(x, StackedValue):
        return host_result(x.stack)
    return x


def _uses_jax(value) -> bool:
    return bridge.jax is not None and bridge.jax.uses_jax(value)


def value_and_grad(fun, argnums=0, has_aux=False):
    """Like ``jax.value_and_grad``: a function returning ``(value, gradient)``
    (``((value, aux), gradient)`` with ``has_aux``), on simpmd's devices or in plain NumPy.
    Inside a real JAX trace it is ``jax.value_and_grad`` itself."""
    def value_and_grad_fun(*args, **kwargs):
        if _uses_jax((args, kwargs)):
            import jax  # optional: JAX
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
            import jax  # optional: JAX
            return jax.grad(fun, argnums, has_aux)(*args, **kwargs)
        _, aux, grads = _value_and_grad(fun, argnums, has_aux, args, kwargs)
        return (grads, aux) if has_aux else grads
    grad_fun.__name__ = f"grad({getattr(fun, '__name__', 'fun')})"
    return grad_fun
