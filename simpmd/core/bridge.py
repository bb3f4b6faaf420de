"""Where the core hands over to code outside it, registered from outside.

The core imports nothing of simpmd outside ``simpmd/core``. Three packages that sit above
it register themselves here when they are imported (``import simpmd`` imports them all):

* ``eager``: :mod:`simpmd.eager.scheduler`, which runs one program per device
  (``eager=True``, and the pmaps nested in such a body).
* ``jax``: :mod:`simpmd.jax.handoff`. A collective, a pmap or a shard_map called on JAX
  tracers sits inside a real JAX trace, and runs as JAX's own.
* ``views``: :mod:`simpmd.viz`, which draws a trace (``trace.draw()``).
"""
from __future__ import annotations

import sys

from . import tree

eager = None
jax = None
views = None


def holds_jax_tracer(value) -> bool:
    """True if a leaf of ``value`` is a JAX tracer: the call is inside a JAX trace."""
    module = sys.modules.get("jax")
    tracer = getattr(getattr(module, "core", None), "Tracer", None)
    return tracer is not None and any(isinstance(v, tracer) for v in tree.flatten(value)[0])


def inside_jax(value) -> bool:
    """True if the call with arguments ``value`` belongs to the JAX bridge."""
    return jax is not None and holds_jax_tracer(value)


def drawings():
    """The drawing module (simpmd.viz), or a clear error if it was never imported."""
    if views is None:
        raise RuntimeError("drawing needs simpmd.viz: `import simpmd` (or simpmd.viz) first.")
    return views
