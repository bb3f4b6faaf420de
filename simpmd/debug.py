"""``simpmd.debug.print``: per-device printing, spelled like ``jax.debug.print``.

In a mapped body it is an equation of the program (``debug_callback``, as JAX calls it):
it prints one line per device, prefixed with the device, every time the program runs,
once the run returns, and logs the lines in the trace. Inside a real JAX trace it hands
over to ``jax.debug.print``, so one body prints on both engines. (A plain ``print`` in a
traced body prints once, when the body is traced, and shows tracers, not values: that is
why JAX has ``jax.debug.print``.)
"""
from __future__ import annotations

import builtins
import sys

from .core import bridge, control
from .core.core import context


def print(fmt: str, *args, **kwargs) -> None:  # noqa: A001 (mirrors jax.debug.print)
    """Format ``fmt`` with the arguments' values and print it, once per device."""
    if context.run is None or bridge.inside_jax((args, kwargs)):
        if "jax" in sys.modules:
            import jax
            return jax.debug.print(fmt, *args, **kwargs)
        builtins.print(fmt.format(*args, **kwargs))
        return None
    control.debug_print(fmt, args, kwargs)
    return None
