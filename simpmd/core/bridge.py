"""Where the core hands over to code outside it, registered from outside.

The core imports nothing of simpmd outside ``simpmd/core``. The packages above it register
themselves here when they are imported (``import simpmd`` imports them all):

* ``eager``: :mod:`simpmd.eager`, which runs one program per device (``eager=True``).
* ``jax``: :mod:`simpmd.jax.handoff`. An operation on JAX tracers sits inside a real JAX
  trace, and runs as JAX's own.
* ``printer``: :func:`simpmd.api.printer.pretty`, which prints a program in JAX's notation.
* ``unreduced``: the unreduced axes of results in ``shard_map`` (partitioner.unreduced.manual).
"""
from __future__ import annotations

import sys

eager = None
jax = None
printer = None
unreduced = None

def holds_jax_tracer(value) -> bool:
    """True if ``value``, or anything in its tuples, lists and dicts, is a JAX tracer: the
    call is inside a JAX trace."""
    tracer = getattr(getattr(sys.modules.get("jax"), "core", None), "Tracer", None)
    todo = [value]
    while tracer is not None and todo:
        v = todo.pop()
        if isinstance(v, tracer):
            return True
        todo.extend(v.values() if isinstance(v, dict) else v if isinstance(v, (tuple, list)) else ())
    return False

def inside_jax(value) -> bool:
    """True if the call with arguments ``value`` belongs to the JAX bridge."""
    return jax is not None and holds_jax_tracer(value)
