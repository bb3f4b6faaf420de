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

from .core import bridge
from .api import tree
from .core.core import Primitive, aval_of, bind, caller_source, context


def print(fmt: str, *args, **kwargs) -> None:  # noqa: A001 (mirrors jax.debug.print)
    """Format ``fmt`` with the arguments' values and print it, once per device."""
    if context.run is None or bridge.inside_jax((args, kwargs)):
        if "jax" in sys.modules:
            import jax  # optional: JAX
            return jax.debug.print(fmt, *args, **kwargs)
        builtins.print(fmt.format(*args, **kwargs))
        return None
    leaves, in_tree = tree.flatten((args, kwargs))
    bind(debug_callback, *leaves, fmt=fmt, in_tree=in_tree, _source=caller_source())
    return None


def _print_stacked(*ops, fmt, in_tree, _source):
    run = context.run
    stacks = [run.stack_of(x, aval_of(x)) for x in ops]
    texts = []
    for k in range(run.n):
        args, kwargs = tree.unflatten(in_tree, [s[k] for s in stacks])
        texts.append(fmt.format(*args, **kwargs))
    run.log.print(run, texts, _source)
    return []


debug_callback = Primitive(
    "debug_callback", _print_stacked, lambda *ops, **params: [], multiple_results=True,
    needs_run=True, cost=lambda ins, outs, **p: (0, 0),
    show=lambda p: {"callback": f"print({p['fmt']!r})"})
