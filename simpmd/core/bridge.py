"""Where the core hands over to code outside it, registered from outside.

The core imports nothing of simpmd outside ``simpmd/core``. The packages above it register
themselves here when they are imported (``import simpmd`` imports them all):

* ``eager``: :mod:`simpmd.eager`, which runs one program per device (``eager=True``).
* ``jax``: :mod:`simpmd.jax.handoff`. An operation on JAX tracers sits inside a real JAX
  trace, and runs as JAX's own.
* ``printer``: :func:`simpmd.api.printer.pretty`, which prints a program in JAX's notation.
"""
from __future__ import annotations

import sys

from . import tree

eager = None
jax = None
printer = None

def holds_jax_tracer(value) -> bool:
    """True if a leaf of ``value`` is a JAX tracer: the call is inside a JAX trace."""
    module = sys.modules.get("jax")
    tracer = getattr(getattr(module, "core", None), "Tracer", None)
    return tracer is not None and any(isinstance(v, tracer) for v in tree.flatten(value)[0])

def inside_jax(value) -> bool:
    """True if the call with arguments ``value`` belongs to the JAX bridge."""
    return jax is not None and holds_jax_tracer(value)
