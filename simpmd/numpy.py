"""``simpmd.numpy``: array functions for bodies that run on both engines.

``import simpmd.numpy as snp``, then ``snp.exp(x)``: NumPy on simpmd's devices, jax.numpy
on JAX values. The dispatch lives in :mod:`simpmd.core.numpy` (its docstring has the
rules); this module is its public path.
"""
from simpmd.core import numpy as _core
from simpmd.core.numpy import uses_jax  # noqa: F401


def __getattr__(name):
    value = getattr(_core, name)
    if name in vars(_core):
        globals()[name] = value             # cached there: the answer never changes
    return value


def __dir__():
    return _core.__dir__()
