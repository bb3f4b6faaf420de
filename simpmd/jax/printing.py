"""How the running JAX prints a jaxpr where its releases differ, read from it.

simpmd's ``make_jaxpr`` prints what the JAX beside it prints. Where releases print
differently (a scan's parameters, which nested programs come first as ``let``, a
checkpoint policy), this module asks the running JAX: it prints a tiny program once and
reads the answer off the text, never off a version number. simpmd's printer asks through
``simpmd.api.printer.forms()``; without JAX imported it prints the newest forms.
"""
from __future__ import annotations

import functools
import re
import sys

import numpy as np


def _jax():
    return sys.modules["jax"]


@functools.lru_cache(maxsize=None)
def scan_form() -> str:
    """How a scan's parameters print: 'ft' (``ft_in``/``ft_out``, the flat trees of its
    inputs and outputs), 'counts' (``num_carry``/``num_consts``), or 'linear' (those, with
    ``linear`` and ``_split_transpose``)."""
    jax = _jax()
    text = str(jax.make_jaxpr(lambda x: jax.lax.scan(lambda c, r: (c + r, c), x[0], x))(
        np.ones(2, np.float32)))
    return "ft" if "ft_in=" in text else "linear" if "_split_transpose" in text else "counts"


@functools.lru_cache(maxsize=None)
def hoists_long_bodies() -> bool:
    """Whether a nested program of more than 10 equations, used once, is printed first as
    ``let name = ... in``."""
    jax = _jax()

    def long(x):
        for _ in range(11):
            x = x * 2.0
        return x
    inner = jax.jit(long)
    return str(jax.make_jaxpr(lambda x: inner(x))(np.float32(1))).startswith("let ")


@functools.lru_cache(maxsize=None)
def policy_text(made) -> str:
    """A checkpoint policy as this JAX prints it in a ``remat2`` equation; ``made`` names
    the policy of ``jax.checkpoint_policies`` and the arguments its maker was given."""
    jax = _jax()
    name, args = made
    policy = getattr(jax.checkpoint_policies, name)
    if args:
        policy = policy(*args)
    program = jax.make_jaxpr(jax.checkpoint(lambda v: v * 2.0, policy=policy))(np.float32(1))
    return re.search(r"policy=(.*)$", str(program), re.M).group(1).strip()


def masks_addresses() -> bool:
    """Whether a function's address prints masked (``0xXXXXXXXXXXXX``) in a jaxpr."""
    return "0xXXXXXXXXXXXX" in policy_text(("nothing_saveable", ()))


@functools.lru_cache(maxsize=None)
def normalizes_slice_starts() -> bool:
    """Whether ``w[:, i]`` with a traced ``i`` normalizes the slice's start (``lt 0 0``,
    ``add``, ``select_n``) as it does an integer index, or passes it as it is."""
    jax = _jax()
    text = str(jax.make_jaxpr(lambda w, i: w[:, i])(np.ones((2, 2), np.float32), np.int32(0)))
    return "lt 0:i32[] 0:i32[]" in text


@functools.lru_cache(maxsize=None)
def shows_default_params() -> bool:
    """Whether ``broadcast_in_dim`` prints all its parameters (``shape``, ``sharding=None``)
    or only those that differ from what its operands imply."""
    jax = _jax()
    text = str(jax.make_jaxpr(lambda x: jax.numpy.broadcast_to(x, (2,)))(np.float32(1)))
    return "shape=(2,)" in text


@functools.lru_cache(maxsize=None)
def drops_unused() -> str:
    """Which programs print a result nothing reads as ``_``: 'top' (the printed program
    only; nested ones name every variable), 'all', or 'none'."""
    jax = _jax()
    inner = jax.jit(lambda x: (x * 2.0, x)[1])
    text = str(jax.make_jaxpr(lambda x: (inner(x) * 3.0, x)[1])(np.float32(1)))
    return {0: "none", 1: "top"}.get(text.count("_:f32[]"), "all")


@functools.lru_cache(maxsize=None)
def guards_zero_divisor() -> bool:
    """Whether jnp's float floor division guards a zero divisor (a ``_where`` in its body)."""
    jax = _jax()
    return "_where" in str(jax.make_jaxpr(lambda x: x // 3)(np.ones(2, np.float32)))


@functools.lru_cache(maxsize=None)
def shard_map_text() -> tuple:
    """How a shard_map equation prints what is JAX-version specific: the name of the
    parameter that holds the axes it makes manual ('newly_manual_axes', or 'manual_axes'
    up to 0.7), and whether ``psum_invariant`` prints ``axis_index_groups=None``. Read off
    a shard_map over an abstract one-device mesh (no device is used)."""
    jax = _jax()
    from jax.sharding import AbstractMesh, AxisType, PartitionSpec  # optional: JAX
    mesh = AbstractMesh((1,), ("i",), axis_types=(AxisType.Auto,))
    mapped = jax.shard_map(lambda x: jax.lax.psum(x, "i"), mesh=mesh,
                           in_specs=PartitionSpec("i"), out_specs=PartitionSpec())
    text = str(jax.make_jaxpr(mapped)(np.ones(2, np.float32)))
    name = "newly_manual_axes" if "newly_manual_axes=" in text else "manual_axes"
    return name, "psum_invariant[axes=('i',) axis_index_groups" in text

