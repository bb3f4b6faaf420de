"""What one process holds of a global array, and how a process builds one from its data.

In multi-controller JAX an array over a mesh that spans hosts is *global*: its shape and
sharding are the whole array's, but each process holds only the blocks of the devices it
drives (its *addressable* shards). It can read those, and it cannot read the rest:
``np.asarray`` of such an array raises (unless every device holds the whole array), and
``multihost_utils.process_allgather`` is how a process gets the whole. A
:class:`ProcessArray` is that view: the array's type and layout, and the blocks of this
process's devices only. simpmd's rendezvous (``scheduler.py``) puts the processes' views
back together, each device's block from the process that drives it, before running a
computation over every device, and cuts the results into views again.

``make_array_from_process_local_data`` builds a global array from each process's part of
the data, following JAX's rules for the global shape (checked against jax 0.7.2, 0.10.2
and 0.12.0.1 on 4 processes x 2 CPU devices).
"""
from __future__ import annotations

import math

import numpy as np

from ..api.jit import ShardedArray, device_put, get_mesh, typeof
from ..partitioner.sharding import Sharding, all_explicit, explicit_axes, resolve
from ..core import dtypes
from ..core.core import Aval
from ..machine.array import Shard
from ..machine.mesh import (NamedSharding, PartitionSpec, block_slices, check_spec, join_blocks,
                            replica_id)
from ..machine import devices as machine
from ..partitioner.sharding import settings

NOT_ADDRESSABLE = (
    "Fetching value for `jax.Array` that spans non-addressable (non process local) devices "
    "is not possible. You can use `jax.experimental.multihost_utils.process_allgather` to "
    "print the global array or use `.addressable_shards` method of jax.Array to inspect the "
    "addressable (process local) shards.")       # JAX's words, jax 0.7.2 to 0.12.0.1


def owners(mesh) -> list:
    """The process that drives each device of ``mesh``, in its row-major order."""
    return [d.process_index for d in mesh.devices.flat]


class ProcessArray(ShardedArray):
    """One process's view of a global array: the whole array's type and sharding, and the
    blocks of the devices this process drives (``addressable_shards``), as a ``jax.Array``
    in a multi-process program. Reading the rest raises, as in JAX."""

    def __init__(self, aval, mesh, layout, blocks: dict, process: int):
        self.aval, self.mesh, self.layout = aval, mesh, tuple(layout)
        self._blocks, self.process = blocks, process

    @property
    def stack(self):
        raise RuntimeError(
            f"this array belongs to simulated process {self.process} of simpmd.run_processes; "
            f"use it inside that run (a computation over the mesh, process_allgather), or "
            f"read its .addressable_shards.")

    # -- what a process can see -------------------------------------------------------------
    @property
    def is_fully_addressable(self) -> bool:
        return len(self._blocks) == self.mesh.size

    @property
    def is_fully_replicated(self) -> bool:
        return self.sharding.is_fully_replicated

    @property
    def addressable_shards(self) -> list:
        spec = self.sharding.spec
        return [Shard(d, block_slices(spec, self.mesh, self.shape, self.mesh.coords_of(k)),
                      self._blocks[k], replica_id(spec, self.mesh, self.mesh.coords_of(k)))
                for k, d in enumerate(self.mesh.devices.flat) if k in self._blocks]

    def addressable_data(self, index: int) -> np.ndarray:
        return self.addressable_shards[index].data

    def block(self, device_id: int) -> np.ndarray:
        for k, d in enumerate(self.mesh.devices.flat):
            if d.id == device_id and k in self._blocks:
                return self._blocks[k]
        raise RuntimeError(f"device {device_id} is not addressable from process "
                           f"{self.process}: {NOT_ADDRESSABLE}")

    def __array__(self, dtype=None, copy=None):
        if self.is_fully_addressable:
            stack = np.stack([self._blocks[k] for k in range(self.mesh.size)])
            value = join_blocks(stack, self.sharding.spec, self.mesh)
        elif self.is_fully_replicated and self._blocks:
            value = np.array(next(iter(self._blocks.values())))     # a local copy of the whole
        else:
            raise RuntimeError(NOT_ADDRESSABLE)
        return value if dtype is None else value.astype(dtype)

    def __repr__(self):
        """As a ``jax.Array`` in a process prints: its values when this process can read
        them all, else only its shape and dtype."""
        if self.is_fully_addressable or self.is_fully_replicated:
            body = np.array2string(np.asarray(self), separator=", ", prefix="Array(")
            return f"Array({body}, dtype={np.dtype(self.dtype).name})"
        return f"Array(shape={self.shape}, dtype={np.dtype(self.dtype).name})"

    def __str__(self):
        """The values when readable; else the repr (jax 0.10 on), or JAX's error (0.7.2)."""
        if self.is_fully_addressable or self.is_fully_replicated:
            return str(np.asarray(self))
        if settings.version <= (0, 7, 2):
            raise RuntimeError(NOT_ADDRESSABLE)
        return repr(self)

    def value_in(self, run):
        return self.stack                   # raises: only a rendezvous may use the blocks


def split(array: ShardedArray, processes: int) -> list:
    """Each process's view of a global array the engine computed."""
    own = owners(array.mesh)
    return [ProcessArray(array.aval, array.mesh, array.layout,
                         {k: array.stack[k] for k in range(array.mesh.size) if own[k] == p}, p)
            for p in range(processes)]


def merge(views: list) -> ShardedArray:
    """The global array whose blocks the processes hold: each device's from its owner.

    Every process must pass the same type and sharding (JAX compiles one program for all);
    a difference is refused, naming the processes."""
    first = views[0]
    for v in views[1:]:
        if (v.aval, v.mesh, v.layout) != (first.aval, first.mesh, first.layout):
            raise ValueError(
                f"process {first.process} passed {typeof(first)} with {first.sharding}, but "
                f"process {v.process} passed {typeof(v)} with {v.sharding}: every process must "
                f"pass arrays of the same shape, dtype and sharding to a computation.")
    by_process = {v.process: v for v in views}
    own = owners(first.mesh)
    rows = [by_process[own[k]]._blocks[k] for k in range(first.mesh.size)]
    return ShardedArray(first.aval, np.stack(rows), first.mesh, first.layout)


def view_of(array: ShardedArray, process: int) -> ProcessArray:
    return split(array, process + 1)[process]


# -- building a global array from each process's data ------------------------------------------


def _sharding(sharding, what) -> NamedSharding:
    if isinstance(sharding, PartitionSpec):
        mesh = get_mesh()
        if mesh is None:
            raise ValueError(f"{what} got {sharding!r} without a mesh: pass "
                             f"NamedSharding(mesh, spec), or call set_mesh(mesh) first.")
        return NamedSharding(mesh, sharding)
    if not isinstance(sharding, NamedSharding):
        raise TypeError(f"{what} takes a NamedSharding (or a P(...) with set_mesh), got "
                        f"{sharding!r}.")
    return sharding


def _dim_slices(sharding, ndim, dim) -> dict:
    """{process: set of (start, stop)} that its devices hold of dimension ``dim``, on a
    shape every block count divides (JAX's universal shape: the device count per dim)."""
    mesh = sharding.mesh
    shape = (mesh.size,) * ndim
    out: dict = {}
    for k, d in enumerate(mesh.devices.flat):
        sl = block_slices(sharding.spec, mesh, shape, mesh.coords_of(k))[dim]
        out.setdefault(d.process_index, set()).add(sl.indices(mesh.size)[:2])
    return out


def processes_along(sharding, ndim, dim, process) -> int | None:
    """How many different parts of dimension ``dim`` the processes hold (this process's
    local data is one of them), or None where the split is not uniform across processes
    (JAX's ``get_process_index_and_count``)."""
    if len(set(owners(sharding.mesh))) == 1 or sharding.is_fully_replicated:
        return 1
    per_process = _dim_slices(sharding, ndim, dim)
    sizes = {len(s) for s in per_process.values()}
    unique = {frozenset(s) for s in per_process.values()}
    every = set().union(*per_process.values())
    if len(sizes) != 1 or sum(len(u) for u in unique) != len(every):
        return None
    return len(unique)


def make_array_from_process_local_data(sharding, local_data, global_shape=None):
    """A global array from this process's part of the data, like
    ``jax.make_array_from_process_local_data``.

    Along a dimension split across processes each process passes its own part; along a
    dimension its devices hold whole (or split among its own devices only), the whole.
    Without ``global_shape`` it is inferred: each dimension's local size times the number of
    different parts the processes hold. Outside ``simpmd.run_processes`` there is one
    process, and this is ``device_put``.
    """
    sharding = _sharding(sharding, "make_array_from_process_local_data")
    local = np.asarray(local_data)
    local = local.astype(dtypes.canonical(local.dtype), copy=False)
    host = machine.current_process()
    if host is None:
        if global_shape is not None and tuple(global_shape) != local.shape:
            raise ValueError(
                f"When calling `make_array_from_process_local_data` on a single process, "
                f"global_shape should be None or equal to local_data.shape. Got "
                f"global_shape={tuple(global_shape)} and local_data.shape={local.shape}.")
        return device_put(local, sharding)
    shape = _global_shape(sharding, local.shape, global_shape, host.index)
    mesh = sharding.mesh
    layout = resolve(sharding.spec, all_explicit(mesh), len(shape), "make_array_from_process_local_data")
    explicit = explicit_axes(mesh)
    typed = tuple(tuple(a for a in axes if a in explicit) for axes in layout)
    aval = Aval(shape, local.dtype, sharding=Sharding(mesh, typed))
    return ProcessArray(aval, mesh, layout, _local_blocks(sharding, local, shape, host.index),
                        host.index)


def _global_shape(sharding, local_shape, global_shape, process) -> tuple:
    """The global shape, given or inferred, each dimension checked as JAX checks it."""
    ndim = len(local_shape)
    if global_shape is None:
        counts = [processes_along(sharding, ndim, d, process) for d in range(ndim)]
        if None in counts:
            partial = tuple(None if c is None else n * c for n, c in zip(local_shape, counts))
            raise ValueError(f"Unable to compute global_shape due to non-uniform sharding. "
                             f"Specify global shape directly. Partially computed "
                             f"global_shape={partial}.")
        global_shape = tuple(n * c for n, c in zip(local_shape, counts))
    global_shape = tuple(int(n) for n in global_shape)
    check_spec(sharding.spec, sharding.mesh, "the sharding", len(global_shape))
    for d, size in enumerate(global_shape):
        parts = math.prod(sharding.mesh.shape[a] for a in sharding.spec.axes_of(d))
        if size % parts:
            raise ValueError(
                f"{sharding} implies that array axis {d} is partitioned {parts} times, but the "
                f"dimension size is {size} (full shape: {global_shape}): JAX's "
                f"IndivisibleError. Give each process data that splits evenly.")
    for d, (n, size) in enumerate(zip(local_shape, global_shape)):
        counts = [len(range(*sl.indices(size))) for sl in _held(sharding, global_shape, process, d)]
        held = sum(counts)
        if n != size and n != held:
            raise ValueError(
                f"Invalid host data, each dimension should match either global or process "
                f"shape. In dimension {d}, the process data has {n} elements. Process "
                f"addresses {held} elements and global_shape={global_shape}.")
    return global_shape


def _held(sharding, shape, process, dim) -> list:
    """The different slices of dimension ``dim`` this process's devices hold, in order."""
    mesh = sharding.mesh
    found = {}
    for k, d in enumerate(mesh.devices.flat):
        if d.process_index == process:
            sl = block_slices(sharding.spec, mesh, shape, mesh.coords_of(k))[dim]
            found[sl.indices(shape[dim])[:2]] = sl
    return [found[key] for key in sorted(found)]


def _local_blocks(sharding, local, shape, process) -> dict:
    """{row of the mesh: block} for this process's devices, cut from its local data: a
    dimension given whole is cut at the block's place, a dimension given in part at the
    place of the block among the parts this process holds."""
    mesh = sharding.mesh
    block = sharding.shard_shape(shape)
    starts = [[sl.indices(shape[d])[0] for sl in _held(sharding, shape, process, d)]
              for d in range(len(shape))]
    blocks = {}
    for k, d in enumerate(mesh.devices.flat):
        if d.process_index != process:
            continue
        index = block_slices(sharding.spec, mesh, shape, mesh.coords_of(k))
        cut = []
        for dim, sl in enumerate(index):
            if local.shape[dim] == shape[dim]:
                cut.append(sl)
            else:
                at = starts[dim].index(sl.indices(shape[dim])[0]) * block[dim]
                cut.append(slice(at, at + block[dim]))
        blocks[k] = np.array(local[tuple(cut)])
    return blocks


def make_array_from_callback(shape, sharding, data_callback, dtype=None):
    """A global array whose every block ``data_callback(index)`` gives (``index`` a tuple
    of slices into the global shape), like ``jax.make_array_from_callback``: in a process
    of ``simpmd.run_processes`` only the blocks of its own devices are asked for (how a
    checkpoint is read back, each host reading the pieces its devices hold)."""
    sharding = _sharding(sharding, "make_array_from_callback")
    shape = tuple(int(n) for n in shape)
    check_spec(sharding.spec, sharding.mesh, "the sharding", len(shape))
    mesh = sharding.mesh
    host = machine.current_process()
    rows = {}
    for k, d in enumerate(mesh.devices.flat):
        if host is None or d.process_index == host.index:
            index = block_slices(sharding.spec, mesh, shape, mesh.coords_of(k))
            block = np.asarray(data_callback(index))
            rows[k] = block if dtype is None else block.astype(dtype)
    first = np.asarray(next(iter(rows.values())))
    value_dtype = dtypes.canonical(first.dtype)
    layout = resolve(sharding.spec, all_explicit(mesh), len(shape), "make_array_from_callback")
    explicit = explicit_axes(mesh)
    typed = tuple(tuple(a for a in axes if a in explicit) for axes in layout)
    aval = Aval(shape, value_dtype, sharding=Sharding(mesh, typed))
    rows = {k: np.asarray(v, dtype=value_dtype) for k, v in rows.items()}
    if host is None:
        return ShardedArray(aval, np.stack([rows[k] for k in range(mesh.size)]), mesh, layout)
    return ProcessArray(aval, mesh, layout, rows, host.index)
