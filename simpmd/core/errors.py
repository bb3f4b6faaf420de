"""The errors simpmd raises. Each message says what went wrong, where, and what to do.

Some mirror JAX's own error names (``TracerBoolConversionError`` and friends) so that a
learner who meets one here recognises it when real JAX raises it.
"""
from __future__ import annotations

import difflib

class SimpmdError(Exception):
    """Base class of every error simpmd raises on purpose."""

    trace = None          # the trace of the failed run, when there is one

class MappedAxisError(SimpmdError, ValueError):
    """An argument cannot be split along the requested axis (rank 0, size mismatch, too big)."""

class UnboundAxisError(SimpmdError, NameError):
    """A collective names an axis that no enclosing pmap binds."""

class CollectiveArgumentError(SimpmdError, ValueError):
    """A collective's arguments do not fit its group (sizes that do not divide, bad perm)."""

class DivergenceError(SimpmdError):
    """Devices of one group called different collectives, or the same one with other shapes."""

class BranchError(SimpmdError, TypeError):
    """The branches of lax.cond / lax.switch return different structures, shapes or dtypes."""

class CarryTypeError(SimpmdError, TypeError):
    """A loop body returns a carry of another structure or type than it was given."""

class DeadlockError(SimpmdError):
    """Some devices wait at a collective that the rest of their group will never join."""

class DeviceError(SimpmdError):
    """The function raised on one simulated device; the original exception is the cause."""

    def __init__(self, message, device=None, original=None):
        super().__init__(message)
        self.device = device
        self.original = original

class ConcretizationTypeError(SimpmdError, TypeError):
    """A Python value was needed from an array that JAX would only know abstractly."""

class TracerBoolConversionError(ConcretizationTypeError):
    """``if x:`` / ``while x:`` / ``and`` / ``or`` on an array value inside a mapped function."""

class TracerIntegerConversionError(SimpmdError, TypeError):
    """``int(x)``, ``range(x)`` or ``list[x]`` with an array value inside a mapped function."""

class TracerArrayConversionError(SimpmdError, TypeError):
    """Converting a mapped value to a NumPy array inside the function, or mixing engines."""

# -- wording shared by the messages -------------------------------------------------------

def id_ranges(ids) -> str:
    """'0-511, 513-1023': sorted ids, runs of consecutive ones written as ranges."""
    ids = sorted(set(ids))
    runs, start = [], None
    for k, i in enumerate(ids):
        if start is None:
            start = i
        if k + 1 == len(ids) or ids[k + 1] != i + 1:
            runs.append(str(start) if start == i else f"{start}-{i}")
            start = None
    return ", ".join(runs)

def unbound_axis_message(opname, name, where, coords, under_shard_map) -> str:
    """Why a collective's axis name is unknown here, and which names the learner can use.

    ``coords`` are the caller's ``(axis name, index, size)`` triples: the axes in scope.
    """
    scope = ", ".join(f"{n!r} (size {s})" for n, _, s in coords if n is not None) or "none"
    close = difflib.get_close_matches(str(name), [str(n) for n, _, _ in coords if n is not None], 1)
    guess = f"Did you mean {close[0]!r}? " if close else ""
    if name is None:
        return (f"{opname} on {where} was given axis_name=None. A collective must name the "
                f"axis it runs over (real JAX raises 'unbound axis name: None'). Give the map "
                f"a name, e.g. simpmd.pmap(f, axis_name='i'), and pass the same name: "
                f"lax.{opname}(x, 'i'). Axis names in scope: {scope}.")
    if under_shard_map:
        return (f"{opname} on {where} names axis {name!r}, but the shard_map's mesh has no "
                f"such axis: its axes are {scope}. {guess}Use one of the mesh's axis names (or a "
                f"tuple of them), or build the mesh with an axis called {name!r}, e.g. "
                f"simpmd.make_mesh((2, 4), ({name!r}, 'other')).")
    if any(n is None for n, _, _ in coords):
        scope += "; a pmap here was given no axis_name"
    return (f"{opname} on {where} names axis {name!r}, but no enclosing pmap binds it. "
            f"Axis names in scope: {scope}. {guess}Pass axis_name={name!r} to the pmap that maps "
            f"this axis, or use one of the names in scope.")

class VmaError(SimpmdError, ValueError):
    """Under shard_map(check_vma=True), a collective's axes are partly varying and partly
    invariant for its input (JAX refuses it); raised while tracing."""

class ResultTypeError(SimpmdError, TypeError):
    """A mapped function returned something that is not an array (a string, an object)."""

class UnexpectedTracerError(SimpmdError, TypeError):
    """A value of a traced body was used after its trace ended (JAX's UnexpectedTracerError)."""
