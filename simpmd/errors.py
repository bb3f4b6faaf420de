"""The errors simpmd raises. Each message says what went wrong, where, and what to do.

Some mirror JAX's own error names (``TracerBoolConversionError`` and friends) so that a
learner who meets one here recognises it when real JAX raises it.
"""
from __future__ import annotations


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
