"""Pictures of simulated runs, drawn with matplotlib from a run's trace alone.

    import simpmd.viz as viz
    viz.draw_trace_mesh(f.trace)           # the mesh the run used
    viz.draw_trace(f.trace)                # every collective call: before / after
    viz.draw_timeline(f.trace, "TPU v4")   # who computes, talks and waits, when
    viz.draw_dispatch(f.trace)             # an all_to_all as a sender x receiver matrix
    viz.draw_permute_steps(f.trace)        # whose block each device holds along a ring

and, for the algorithms of :mod:`simpmd.algorithms` (message by message)::

    from simpmd import algorithms
    run = algorithms.ring_all_reduce([np.full(8, float(d)) for d in range(4)])
    viz.draw_algorithm(run)                # every step, as a grid of frames
    viz.algorithm_html(run)                # the same, animated, in Jupyter

Every function returns a matplotlib ``Figure`` (or an animation) and accepts ``ax=`` to
draw into an existing Axes. Importing this package does not import matplotlib: each name
loads its module on first use, so ``import simpmd`` stays NumPy-only.
"""
from __future__ import annotations

import importlib
import sys

from ..api import trace as _trace

_WHERE = {
    "draw_mesh": "mesh",
    "draw_trace_mesh": "mesh",
    "mesh_groups": "mesh",
    "draw_collective": "collectives",
    "draw_trace": "collectives",
    "drawing_of": "collectives",
    "draw_algorithm_step": "algorithms",
    "draw_algorithm": "algorithms",
    "animate_algorithm": "algorithms",
    "algorithm_html": "algorithms",
    "save_algorithm_gif": "algorithms",
    "sources": "algorithms",
    "draw_timeline": "timeline",
    "model_timeline": "timeline",
    "Segment": "timeline",
    "Timeline": "timeline",
    "tagged": "canvas",
    "draw_dispatch": "dispatch",
    "dispatch_matrix": "dispatch",
    "draw_permute_steps": "dispatch",
    "permute_steps": "dispatch",
    "draw_hosts": "hosts",
    "crossing_axes": "hosts",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module 'simpmd.viz' has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + __all__)



_trace.VIEWS = sys.modules[__name__]      # trace.draw() draws with this package
