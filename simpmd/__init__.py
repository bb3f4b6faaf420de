"""simpmd: a NumPy simulation of a mesh of accelerators that runs jax.pmap-style programs.

    import numpy as np, simpmd
    from simpmd import lax
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(8.0)); print(f.trace)
"""
from .api import spelling as _spelling                 # NumPy's spelling on mapped values
from .api import printer as _printer                   # a program printed as JAX prints a jaxpr
from . import lax
from .core.dtypes import config
from .core.errors import (ConcretizationTypeError, DeadlockError, DeviceError, DivergenceError,
                          MappedAxisError, SimpmdError, TracerArrayConversionError,
                          TracerBoolConversionError, TracerIntegerConversionError,
                          UnboundAxisError, CollectiveArgumentError)
from .api.events import Event
from .api.trace import Trace
from .api.checkpoint import checkpoint, checkpoint_name, checkpoint_policies, remat
from .machine.array import Array, Shard
from .machine.devices import (SimDevice, Platform, device_count, devices, local_device_count,
                               local_devices, platform, process_count, process_index,
                               set_device_count)
from .machine.mesh import (AxisType, Mesh, NamedSharding, P, PartitionSpec, ShardingError,
                            make_mesh)
from .api.pmap import pmap
from .api.shard_map import shard_map
from .api.spmd import last_trace
from .api.jaxpr import eval_shape, make_jaxpr           # shapes without values, as in JAX
from .api.shapes import ShapeDtypeStruct
from . import eager                                    # eager=True: one program per device
from . import viz                                      # pictures; matplotlib loads on first drawing
from .api import text as _text                         # a trace as text (print(trace))

__version__ = "0.1.0"

from .api.jit import (ShardedArray, ShapedArray, ShardingTypeError, device_put, get_mesh, jit,
                      reshard, set_mesh, typeof)
from .api.jit import grad, value_and_grad          # reverse mode, collectives included
from . import numpy                                    # functions for bodies that run on both engines
from . import sharding                                 # jax.sharding's names, and jit's rules
from . import course                                   # what the course notebooks share
from . import debug                                    # debug.print, like jax.debug.print
from .hosts import (ProcessError, make_array_from_callback, make_array_from_process_local_data,
                    run_processes)
from . import multihost_utils, mesh_utils, experimental    # jax.experimental's names
from .jax.devices import JaxDevicesError, use_jax_devices
from .jax.crosscheck import CrossCheckReport, crosscheck
