"""simpmd: a NumPy simulation of a mesh of accelerators that runs jax.pmap-style programs.

    import numpy as np, simpmd
    from simpmd import lax
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(8.0)); print(f.trace)
"""
from . import lax
from .core.array import Array, Shard
from .core.devices import (SimDevice, Platform, device_count, devices, local_device_count,
                           local_devices, platform, set_device_count)
from .core.errors import (ConcretizationTypeError, DeadlockError, DeviceError, DivergenceError,
                          MappedAxisError, SimpmdError, TracerArrayConversionError,
                          TracerBoolConversionError, TracerIntegerConversionError,
                          UnboundAxisError, CollectiveArgumentError)
from .core.pmap import pmap
from .core.spmd import last_trace, make_jaxpr
from .core.trace import Event, Trace
from . import eager                                    # eager=True: one program per device

__version__ = "0.1.0"

# -- features built on the engine (each line added by the feature's own change) ----------
from .core.mesh import (AxisType, Mesh, NamedSharding, P, PartitionSpec, ShardingError,
                        make_mesh)
from .explicit import ShardedArray, ShardingTypeError, device_put, jit, reshard, set_mesh, typeof
from .core.shard_map import shard_map
from . import numpy                                    # functions for bodies that run on both engines
from . import course                                   # what the course notebooks share
from . import debug                                    # debug.print, like jax.debug.print
from .jax.devices import JaxDevicesError, use_jax_devices
from .jax.crosscheck import CrossCheckReport, crosscheck
from .core.autodiff import grad, value_and_grad         # reverse mode, collectives included
from . import viz                                      # pictures; matplotlib loads on first drawing
