"""Where the core hands over to code outside it, registered from outside.

The core imports nothing of simpmd outside ``simpmd/core``. The packages above it register
themselves here when they are imported (``import simpmd`` imports them all):

* ``eager``: :mod:`simpmd.eager`, which runs one program per device (``eager=True``).
* ``jax``: :mod:`simpmd.jax.handoff`. An operation on JAX tracers sits inside a real JAX
  trace, and runs as JAX's own.
* ``views``: :mod:`simpmd.viz`, which draws a trace; ``texts``: :mod:`simpmd.viz.text`,
  which writes it out as a table.
"""
from __future__ import annotations

import sys

from . import tree

eager = None
jax = None
views = None
texts = None


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


def text():
    """The module that writes a trace out as text (simpmd.viz.text)."""
    if texts is None:
        raise RuntimeError("a trace's text needs simpmd.viz.text: `import simpmd` first.")
    return texts
