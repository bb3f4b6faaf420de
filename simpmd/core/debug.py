"""``simpmd.debug.print``: per-device printing, spelled like ``jax.debug.print``.

It prints the formatted line once per simulated device, prefixed with the device (and
logs it in the trace). In a body traced once the lines appear when the body returns,
device by device, as JAX prints when the computation runs; inside a real JAX trace it hands over to ``jax.debug.print``, so one
body prints on both engines. (A plain ``print`` inside a JAX-traced body shows tracers,
not values: that is why JAX has ``jax.debug.print``.)
"""
from __future__ import annotations

import builtins
import sys

from .context import caller_source, current_task


def print(fmt: str, *args, **kwargs) -> None:  # noqa: A001 (mirrors jax.debug.print)
    """Format ``fmt`` with the arguments' values and print it, once per device."""
    task = current_task()
    if task is None:
        if "jax" in sys.modules:
            import jax
            return jax.debug.print(fmt, *args, **kwargs)
        builtins.print(fmt.format(*args, **kwargs))
        return None
    source, code = caller_source()
    task.print(fmt, args, kwargs, source, code)      # a StackedRun or one device's Task
    return None
