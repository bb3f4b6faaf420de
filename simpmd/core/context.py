"""What every run shares, whichever engine runs it: the program on this thread, where a
call came from in the learner's code, and the checks and messages both engines give.

The program on this thread is a ``batching.StackedRun`` (every device at once) or one
device's ``simpmd.eager.scheduler.Task``; both answer the questions ``simpmd.lax`` asks.
"""
from __future__ import annotations

import linecache
import math
import os
import sys
import threading

import numpy as np

from . import errors, program
from .program import replay_source


# Frames of these modules are the engine's own; the source of an event is the first
# frame outside them (so the tour in simpmd/__main__.py still counts as user code).
ENGINE_MODULES = {"simpmd.core." + m for m in (
    "lax", "context", "pmap", "traced", "debug", "collectives", "tree", "numpy", "shard_map",
    "batching", "autodiff", "spmd", "program")} | {"simpmd.jax.handoff", "simpmd.eager.scheduler"}


_local = threading.local()            # .task: the program this thread is running


def current_task():
    """The program running on this thread, or None outside a simulation."""
    return getattr(_local, "task", None)


class MappedRun:
    """What a mapped body may learn about the run it is part of (``simpmd.grad`` asks).

    ``axes``: ``((axis name, size), ...)`` of the mapped axes in scope. ``check_vma``:
    a ``shard_map(check_vma=True)`` run, where every value knows the mesh axes it varies
    over. ``input_vma(array)``: those axes for a body input (or a view of one), else None.
    """

    def __init__(self, axes, check_vma, inputs):
        self.axes, self.check_vma, self._inputs = tuple(axes), check_vma, inputs

    def axis_size(self, names) -> int:
        return math.prod(size for name, size in self.axes if name in names)

    def input_vma(self, array):
        while isinstance(array, np.ndarray):
            entry = self._inputs.get(id(array))
            if entry is not None and entry[0] is array:
                return entry[1]
            array = array.base
        return None


def mapped_run():
    """The :class:`MappedRun` of the body running on this thread, or None outside one."""
    task = current_task()
    if task is None:
        return None
    return MappedRun(((name, size) for name, _, size in task.coords),
                     task.check_vma, task.input_vma)


def coords_text(coords) -> str:
    """'data=1, model=0'; an unnamed axis (axis_name=None) shows as 'index 1'."""
    return ", ".join(f"index {i}" if n is None else f"{n}={i}" for n, i, _ in coords)


def axis_position(coords, axis_names, opname, where, maps_a_mesh=False):
    """(index, size) of the device at ``coords`` along ``axis_names`` combined row-major."""
    env = {n: (i, s) for n, i, s in coords}
    index, size = 0, 1
    for name in axis_names:
        if name not in env or name is None:
            raise errors.UnboundAxisError(errors.unbound_axis_message(
                opname, name, where, coords, maps_a_mesh))
        i, s = env[name]
        index, size = index * s + i, size * s
    return index, size


def user_stacklevel() -> int:
    """The ``stacklevel`` that makes a warning point at the user's code, not simpmd's."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_globals.get("__name__") in ENGINE_MODULES
                                 or frame.f_globals.get("__name__") == "simpmd.jax.crosscheck"):
        frame, level = frame.f_back, level + 1
    return level


def caller_source() -> tuple[str, str]:
    """('file.py:12', 'the code on that line') for the user code that called into simpmd."""
    replayed = replay_source()
    if replayed is not None:         # a cached program: the line that was traced
        return replayed
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in ENGINE_MODULES:
        frame = frame.f_back
    if frame is None:
        return "", ""
    key = (frame.f_code, frame.f_lineno)
    found = _sources.get(key)
    if found is None:
        filename, line = key[0].co_filename, key[1]
        code = linecache.getline(filename, line).strip()
        name = os.path.basename(filename)
        if "ipykernel" in filename or filename.startswith("<ipython"):
            name = "<cell>"          # notebook cells get temporary, machine-dependent names
        found = _sources[key] = (f"{name}:{line}", code)
    return found


_sources: dict = {}                  # (code object, line) -> (source, code): SPMD repeats them


program.where_called = caller_source


def explain_failure(where, device, exc, note=""):
    """The error to raise when the mapped function raised ``exc`` on ``where``."""
    if isinstance(exc, errors.SimpmdError):
        if where not in str(exc):
            exc.args = (f"on {where}: {exc}",) + exc.args[1:]
        return exc
    if any(k in str(exc) for k in ("__jax_array__", "simpmd.core.traced.DeviceValue", "simpmd.core.batching.StackedValue")):
        err = errors.TracerArrayConversionError(
            f"on {where}: a jax.numpy function was given a simpmd device value "
            f"({exc}). Call array functions through simpmd.numpy "
            f"(import simpmd.numpy as snp; snp.exp(x)): it works on both engines.")
        err.__cause__ = exc
        return err
    err = errors.DeviceError(
        f"the mapped function raised {type(exc).__name__} on {where}: {exc}.{note}",
        device=device, original=exc)
    err.__cause__ = exc
    return err


def refuse_non_arrays(places, results, treedef):
    """A result leaf must be an array or a number: JAX cannot return a string or an object."""
    for place, (leaves, _) in zip(places, results):
        for k, leaf in enumerate(leaves):
            if isinstance(leaf, (str, bytes)) or (
                    not isinstance(leaf, (np.ndarray, np.generic, int, float, complex))
                    and np.asarray(getattr(leaf, "value", leaf)).dtype.kind in "OUS"):
                where = "" if treedef.kind == "leaf" else f" at position {k} of its results"
                raise TypeError(
                    f"{place} returned {leaf!r} (a {type(leaf).__name__}){where}, which is "
                    f"not an array. A mapped function returns arrays (JAX: 'not a valid JAX "
                    f"type'). Return numbers or arrays; to show text from a device, use "
                    f"simpmd.debug.print inside the body, or compute the text on the host "
                    f"from the results.")


def check_groups(groups, size, op, where, axis_names):
    flat = sorted(i for g in groups for i in g)
    if flat != list(range(size)):
        raise errors.CollectiveArgumentError(
            f"{op} over {axis_names} on {where}: axis_index_groups={groups} must use every index of axis "
            f"{axis_names} (size {size}) exactly once; it covers {flat}. List each index "
            f"0..{size - 1} in exactly one group.")
    sizes = {len(g) for g in groups}
    if len(sizes) > 1 and op not in ("psum", "pmean", "pmax", "pmin"):
        raise errors.CollectiveArgumentError(
            f"{op} over {axis_names} on {where}: axis_index_groups={groups} has groups of sizes "
            f"{sorted(len(g) for g in groups)}; {op} needs groups of equal size. Split the "
            f"axis into groups of one size.")
