"""``simpmd.checkpoint`` (alias ``simpmd.remat``): ``jax.checkpoint``, and its policies.

A gradient's backward pass reads values the forward pass computed (the *residuals*:
activations, mostly), so by default the forward pass keeps them all until the backward
pass has used them, and that is most of a large model's memory. ``checkpoint(f)`` keeps
only ``f``'s inputs, and the backward pass computes ``f`` again to get the rest: less
memory, more FLOPs. A *policy* says which results of ``f`` may be kept after all
(``dots_saveable``: the matrix products, the expensive ones to compute again).

As in JAX, ``checkpoint(f)`` traces ``f`` into one ``remat2`` equation
(``simpmd/core/loops.py``); ``simpmd.grad`` keeps what the policy saves, and the backward
pass's ``remat2[differentiated=True]`` recomputes the rest: those equations, and their
collectives in the log, are marked 'recompute'. ``simpmd.memory`` counts what each device
holds, with and without it.
"""
from __future__ import annotations

import functools
import types

import numpy as np

from ..core import bridge
from . import tree
from ..core import core as core_mod
from ..core import loops
from ..core.core import aval_of, bind, context
from ..core.program import trace
from .shard_map_eqn import host_result
from .printer import SHOWN, forms

__all__ = ["checkpoint", "remat", "checkpoint_policies", "checkpoint_name"]


# -- policies: which results the forward pass may keep -----------------------------------------
# Each is called as JAX calls its own, policy(primitive, *input types, **params) -> bool.


def everything_saveable(*_, **__) -> bool:
    """Keep everything: as if there were no checkpoint."""
    return True


def nothing_saveable(*_, **__) -> bool:
    """Keep nothing but the inputs: recompute every other value (the default)."""
    return False


everything_saveable.jax_made = ("everything_saveable", ())
nothing_saveable.jax_made = ("nothing_saveable", ())


def _dots(no_batch_dims):
    def policy(prim, *avals, **params):
        if prim.name != "dot_general":           # (JAX calls it with its own primitives)
            return False
        (_, _), (lhs_batch, rhs_batch) = params["dimension_numbers"]
        return not no_batch_dims or (not lhs_batch and not rhs_batch)
    policy.__name__ = policy.__qualname__ = ("dots_with_no_batch_dims_saveable" if no_batch_dims
                                             else "dots_saveable")
    policy.jax_made = (policy.__name__, ())
    return policy


dots_saveable = checkpoint_dots = _dots(False)
dots_with_no_batch_dims_saveable = checkpoint_dots_with_no_batch_dims = _dots(True)
dots_saveable.__doc__ = "Keep the results of matrix products (dot_general): recompute the rest."
dots_with_no_batch_dims_saveable.__doc__ = "Keep the matrix products that have no batch axes."


def _named(keep, names, label):
    def policy(prim, *_, **params):
        return prim.name == "name" and keep(params["name"] in names)
    policy.__qualname__ = f"{label}.<locals>.policy"
    policy.jax_made = (label, tuple(names))
    return policy


def save_only_these_names(*names):
    """Keep only values named with ``checkpoint_name(x, name)``, and only these names."""
    return _named(bool, names, "save_only_these_names")


def save_any_names_but_these(*names):
    """Keep the values named with ``checkpoint_name``, except these names."""
    return _named(lambda inside: not inside, names, "save_any_names_but_these")


def save_from_both_policies(policy_1, policy_2):
    """Keep what either policy keeps."""
    def policy(prim, *avals, **params):
        return bool(policy_1(prim, *avals, **params)) or bool(policy_2(prim, *avals, **params))
    return policy


checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable, nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable, checkpoint_dots=checkpoint_dots,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    checkpoint_dots_with_no_batch_dims=checkpoint_dots_with_no_batch_dims,
    save_only_these_names=save_only_these_names,
    save_any_names_but_these=save_any_names_but_these,
    save_from_both_policies=save_from_both_policies)


def checkpoint_name(x, name):
    """``jax.ad_checkpoint.checkpoint_name``: ``x`` itself, named for the policies
    ``save_only_these_names`` and ``save_any_names_but_these``."""
    if bridge.inside_jax(x):
        from jax.ad_checkpoint import checkpoint_name as on_jax  # optional: JAX
        return on_jax(x, name)
    leaves, treedef = tree.flatten(x)
    return tree.unflatten(treedef, [bind(loops.name_p, leaf, name=name) if hasattr(leaf, "aval")
                                    else leaf for leaf in leaves])


# -- checkpoint ---------------------------------------------------------------------------------


def checkpoint(fun=None, *, prevent_cse=True, policy=None, static_argnums=(),
               static_argnames=()):
    """``jax.checkpoint``: ``fun``, whose values the backward pass of a gradient computes
    again instead of keeping them from the forward pass, except those ``policy`` saves
    (``checkpoint_policies``; None keeps only the inputs). Usable as a decorator, also as
    ``@functools.partial(checkpoint, policy=...)``. Inside a real JAX trace it is
    ``jax.checkpoint`` itself."""
    if fun is None:
        return functools.partial(checkpoint, prevent_cse=prevent_cse, policy=policy,
                                 static_argnums=static_argnums, static_argnames=static_argnames)
    static = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)
    static_names = {static_argnames} if isinstance(static_argnames, str) else set(static_argnames)

    @functools.wraps(fun)
    def checkpointed(*args, **kwargs):
        if bridge.inside_jax((args, kwargs)):
            import jax  # optional: JAX
            given = {"static_argnames": static_argnames} if static_argnames else {}  # jax 0.7
            return jax.checkpoint(fun, prevent_cse=prevent_cse, policy=policy,  # has none
                                  static_argnums=static_argnums, **given)(*args, **kwargs)
        positions = {a % max(len(args), 1) for a in static}
        dynamic = ([a for i, a in enumerate(args) if i not in positions],
                   {k: v for k, v in kwargs.items() if k not in static_names})
        leaves, treedef = tree.flatten(dynamic)
        out_tree = []

        def flat(*xs):
            dyn_args, dyn_kwargs = tree.unflatten(treedef, xs)
            it = iter(dyn_args)
            full = [a if i in positions else next(it) for i, a in enumerate(args)]
            out, out_def = tree.flatten(fun(*full, **dyn_kwargs, **{
                k: v for k, v in kwargs.items() if k in static_names}))
            out_tree.append(out_def)
            return out
        run = context.run or core_mod.plain
        program, lifted = trace(flat, [aval_of(x) for x in leaves],
                                run if run.abstract else run.tracing())
        outs = bind(loops.remat, *lifted, *leaves, jaxpr=loops.closed(program),
                    prevent_cse=prevent_cse, differentiated=False, policy=policy)
        if context.run is None:               # outside any mapped body: NumPy arrays
            outs = [host_result(o.stack) for o in outs]
        return tree.unflatten(out_tree[0], outs)
    return checkpointed


remat = checkpoint


def _policy_text(policy) -> str:
    """A policy as the running JAX prints it in a jaxpr (the newest JAX's way without one)."""
    if policy is None:
        return "None"
    made = getattr(policy, "jax_made", None)
    shown = forms().policy_text(made) if made is not None else None
    if shown is not None:
        return shown
    address = "0xXXXXXXXXXXXX" if forms().masks_addresses() else hex(id(policy))
    return f"<function {policy.__qualname__} at {address}>"


SHOWN[loops.remat] = lambda p: {"differentiated": p["differentiated"], "jaxpr": p["jaxpr"],
                              "policy": _policy_text(p["policy"]),
                              "prevent_cse": p["prevent_cse"]}
