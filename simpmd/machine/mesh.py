"""Meshes and partition specs: naming the axes of a grid of devices, and saying how an
array's dimensions are split over them.

Mirrors ``jax.sharding``. A :class:`Mesh` arranges simulated devices in an n-D grid with
a name per axis (``Mesh(devices.reshape(2, 4), ('data', 'model'))``). A
:class:`PartitionSpec` (``P``) has one entry per array dimension: ``None`` keeps that
dimension whole, a mesh axis name splits it over that axis, a tuple of names splits it
over their product (row-major, first name slowest). Mesh axes that a spec does not name
*replicate*: every device along them holds the same block. A :class:`NamedSharding`
pairs the two and answers "which device holds which block?" for a given global shape.
"""
from __future__ import annotations

from collections import OrderedDict
import enum
import math

import numpy as np

from .devices import SimDevice, devices as platform_devices
from ..core.errors import MappedAxisError, SimpmdError
from .devices import current_process


class ShardingError(SimpmdError, ValueError):
    """A mesh, spec or shard_map use that cannot work (unknown axis, replication claim, ...)."""


# -- the mesh ------------------------------------------------------------------------------

class AxisType(enum.Enum):
    """How a mesh axis is handled by ``jit``, as ``jax.sharding.AxisType``.

    ``Explicit``: the sharding is part of each array's type and every operation has a rule
    for it (``simpmd.jit`` follows them). ``Auto``: the compiler's partitioner chooses, by
    heuristics simpmd does not reproduce (it runs such programs with whole copies along
    those axes, and says so). ``Manual``: inside a ``shard_map`` body.
    """
    Auto = "Auto"
    Explicit = "Explicit"
    Manual = "Manual"

    def __repr__(self):
        return self.name


def axis_types_of(mesh) -> tuple:
    """The mesh's axis types as a tuple of :class:`AxisType` (``Auto`` where none was given).

    Accepts JAX's own ``AxisType`` members too (they are matched by name).
    """
    types = mesh.axis_types
    if types is None:
        return (AxisType.Auto,) * len(mesh.axis_names)
    if not isinstance(types, (tuple, list)):
        types = (types,) * len(mesh.axis_names)
    return tuple(AxisType[getattr(t, "name", str(t)).split(".")[-1]] for t in types)


class Mesh:
    """Simulated devices in an n-D grid with one name per axis, like ``jax.sharding.Mesh``.

    ``Mesh(np.array(simpmd.devices()).reshape(2, 4), ('data', 'model'))``. ``.shape`` maps
    each axis name to its size, in order; ``.devices`` is the grid itself.
    """

    def __init__(self, devices, axis_names, *, axis_types=None):
        grid = np.array(devices, dtype=object)
        if isinstance(axis_names, str):
            axis_names = (axis_names,)
        axis_names = tuple(axis_names)
        if grid.ndim != len(axis_names):
            raise ShardingError(
                f"Mesh got a device grid of shape {grid.shape} ({grid.ndim} axes) but "
                f"{len(axis_names)} axis name(s) {axis_names}; give one name per axis, e.g. "
                f"Mesh(np.array(simpmd.devices()).reshape(2, 4), ('data', 'model')).")
        if len(set(axis_names)) != len(axis_names):
            raise ShardingError(f"Mesh axis names must be distinct, got {axis_names}.")
        for d in grid.flat:
            if not isinstance(d, SimDevice):
                raise TypeError(
                    f"Mesh takes simulated devices (simpmd.devices()), got {d!r}. A JAX "
                    f"mesh is built from jax.devices(); a simpmd mesh from simpmd.devices().")
        ids = [d.id for d in grid.flat]
        if len(set(ids)) != len(ids):
            raise ShardingError(f"Mesh lists a device twice: device ids {ids}.")
        self.devices = grid
        self.axis_names = axis_names
        self.axis_types = axis_types

    @property
    def shape(self) -> "OrderedDict[str, int]":
        """Axis name -> size, in mesh order (an OrderedDict, as in JAX)."""
        return OrderedDict(zip(self.axis_names, self.devices.shape))

    @property
    def axis_sizes(self) -> tuple:
        return tuple(self.devices.shape)

    @property
    def shape_tuple(self) -> tuple:
        return tuple(zip(self.axis_names, self.devices.shape))

    @property
    def size(self) -> int:
        return int(self.devices.size)

    @property
    def local_mesh(self) -> "Mesh":
        """The part of the mesh this process drives, as JAX's ``mesh.local_mesh``: along
        each axis, the positions where its devices sit (in a process of
        ``simpmd.run_processes``; outside one, the whole mesh)."""
        host = current_process()
        if host is None:
            return self
        mine = np.vectorize(lambda d: d.process_index == host.index, otypes=[bool])(self.devices)
        where = [np.flatnonzero(mine.any(axis=tuple(a for a in range(mine.ndim) if a != ax)))
                 for ax in range(mine.ndim)]
        return Mesh(self.devices[np.ix_(*where)], self.axis_names, axis_types=self.axis_types)

    @property
    def empty(self) -> bool:
        return self.devices.size == 0

    @property
    def device_ids(self) -> np.ndarray:
        return np.vectorize(lambda d: d.id, otypes=[int])(self.devices)

    @property
    def local_devices(self) -> list:
        return list(self.devices.flat)

    def coords_of(self, k: int) -> dict:
        """{axis name: index} of the k-th device in row-major order."""
        index = np.unravel_index(k, self.devices.shape)
        return {n: int(i) for n, i in zip(self.axis_names, index)}

    def __eq__(self, other):
        return (isinstance(other, Mesh) and self.axis_names == other.axis_names
                and self.devices.shape == other.devices.shape
                and all(a.id == b.id for a, b in zip(self.devices.flat, other.devices.flat)))

    def __hash__(self):
        return hash((self.axis_names, self.devices.shape, tuple(d.id for d in self.devices.flat)))

    def __repr__(self):
        return "Mesh(" + ", ".join(f"{n!r}: {s}" for n, s in self.shape.items()) + ")"


def make_mesh(axis_shapes, axis_names, *, devices=None, axis_types=None) -> Mesh:
    """A mesh of the given shape over the first devices, row-major, like ``jax.make_mesh``.

    ``make_mesh((2, 4), ('data', 'model'))`` puts devices 0-3 on the first 'data' row and
    4-7 on the second. ``axis_types`` defaults to ``Explicit`` on every axis, as
    ``jax.make_mesh`` does from jax 0.9 (``Mesh(...)`` stays ``Auto``, as in JAX). Only
    ``simpmd.jit`` and the sharded arrays of ``simpmd.device_put`` read the types;
    ``shard_map`` bodies see the same blocks either way.
    """
    axis_shapes = tuple(int(s) for s in axis_shapes)
    if isinstance(axis_names, str):
        axis_names = (axis_names,)
    needed = math.prod(axis_shapes)
    if devices is None:
        available = platform_devices()
        if needed > len(available):
            raise MappedAxisError(
                f"make_mesh{axis_shapes} needs {needed} devices, but the simulated platform "
                f"has {len(available)}. Call simpmd.set_device_count({needed}) first, or "
                f"choose a smaller mesh.")
        devices = available[:needed]
    devices = list(devices)
    if len(devices) != needed:
        raise ShardingError(
            f"make_mesh{axis_shapes} needs exactly {needed} devices, but devices= lists "
            f"{len(devices)}.")
    grid = np.empty(needed, dtype=object)
    grid[:] = devices
    if axis_types is None:
        axis_types = (AxisType.Explicit,) * len(axis_shapes)
    elif not isinstance(axis_types, (tuple, list)):
        axis_types = (axis_types,) * len(axis_shapes)
    return Mesh(grid.reshape(axis_shapes), axis_names, axis_types=tuple(axis_types))


# -- the partition spec ----------------------------------------------------------------------

class PartitionSpec:
    """How each dimension of an array is split over mesh axes, like ``jax.sharding.PartitionSpec``.

    One entry per leading dimension: ``None`` (kept whole), a mesh axis name, or a tuple of
    names (split over their product, row-major). Dimensions past the last entry are kept
    whole; mesh axes the spec never names replicate the array. ``unreduced={'x'}``: every
    device along ``x`` holds a partial sum, the array being their sum (a reduction not yet
    done); ``reduced={'x'}``: replicated along ``x``, with unreduced gradients (JAX's
    "Autodiff and sharding", https://docs.jax.dev/en/latest/301/sharding-ad.html).
    """

    __slots__ = ("_partitions", "unreduced", "reduced")

    def __init__(self, *partitions, unreduced=frozenset(), reduced=frozenset()):
        parts = []
        for p in partitions:
            if isinstance(p, list):
                p = tuple(p)
            if isinstance(p, tuple):
                if len(p) == 0:
                    p = None
                elif len(p) == 1:
                    p = p[0]        # P(('a',)) is P('a'), as in JAX
                elif any(isinstance(n, (tuple, list)) or n is None for n in p):
                    raise TypeError(f"PartitionSpec entry {p!r}: a tuple entry lists mesh "
                                    f"axis names only (no None, no nested tuples).")
            parts.append(p)
        self._partitions = tuple(parts)
        self.unreduced, self.reduced = _axis_set(unreduced, "unreduced"), _axis_set(reduced, "reduced")
        named = {n for p in parts if p is not None for n in (p if isinstance(p, tuple) else (p,))}
        for word, axes in (("unreduced", self.unreduced), ("reduced", self.reduced)):
            if named & axes:
                raise ValueError(
                    f"partitions cannot overlap with {word} axes passed to PartitionSpec. Got "
                    f"partitions: {self._partitions} and {word} axes: {_fs(axes)}")
        if self.unreduced & self.reduced:
            raise ValueError(
                f"`unreduced` and `reduced` argument to PartitionSpec cannot overlap. Got "
                f"unreduced: {_fs(self.unreduced)} and reduced: {_fs(self.reduced)}")

    def __len__(self):
        return len(self._partitions)

    def __iter__(self):
        return iter(self._partitions)

    def __getitem__(self, i):
        return self._partitions[i]

    def __eq__(self, other):
        return (isinstance(other, PartitionSpec) and self._partitions == other._partitions
                and (self.unreduced, self.reduced) == (other.unreduced, other.reduced))

    def __hash__(self):
        parts = list(self._partitions)
        while parts and parts[-1] is None:     # as in JAX: P('a') and P('a', None) hash alike
            parts.pop()
        return hash(("PartitionSpec", tuple(parts), self.unreduced, self.reduced))

    def __repr__(self):
        inner = [repr(p) for p in self._partitions]
        sets = [f"{word}={{{', '.join(repr(a) for a in sorted(axes))}}}"
                for word, axes in (("unreduced", self.unreduced), ("reduced", self.reduced)) if axes]
        comma = "," if len(self._partitions) == 1 and not sets else ""
        return f"P({', '.join(inner + sets)}{comma})"

    def axes_of(self, dim: int) -> tuple:
        """The mesh axis names dimension ``dim`` is split over (``()`` if kept whole)."""
        if dim >= len(self._partitions) or self._partitions[dim] is None:
            return ()
        p = self._partitions[dim]
        return p if isinstance(p, tuple) else (p,)

    def mesh_axes(self) -> tuple:
        """Every mesh axis name the spec uses, in order of appearance."""
        return tuple(n for d in range(len(self._partitions)) for n in self.axes_of(d))


P = PartitionSpec


def _axis_set(axes, word) -> frozenset:
    """JAX takes the axes of ``unreduced=``/``reduced=`` as a set only."""
    if not isinstance(axes, (set, frozenset)):
        raise TypeError(f"{word} argument of PartitionSpec should of type `frozenset` or `set`. "
                        f"Got type {type(axes)}")
    return frozenset(axes)


def _fs(axes) -> str:
    """A frozenset as JAX prints it in its messages: frozenset({'x'})."""
    return "frozenset({" + ", ".join(repr(a) for a in sorted(axes)) + "})"


def check_spec(spec, mesh: Mesh, what: str, ndim: int | None = None) -> None:
    """Raise a teaching error if ``spec`` cannot describe an array of rank ``ndim`` on ``mesh``."""
    if not isinstance(spec, PartitionSpec):
        hint = ""
        if isinstance(spec, str):
            hint = f" Write P({spec!r}) (from simpmd import P) instead of the bare name."
        elif type(spec).__name__ in ("PartitionSpec", "P"):
            hint = " This looks like JAX's PartitionSpec; use simpmd.P with a simpmd mesh."
        raise TypeError(f"{what} must be a simpmd.P(...) partition spec, got {spec!r}.{hint}")
    used = spec.mesh_axes()
    for word, axes in (("Unreduced", spec.unreduced), ("Reduced", spec.reduced)):
        missing = sorted(a for a in axes if a not in mesh.axis_names)
        if missing:
            raise ShardingError(f"{word} axes {', '.join(missing)} is not found in "
                                f"mesh.axis_names={mesh.axis_names}. Got pspec={spec!r}")
    unknown = [n for n in used if n not in mesh.axis_names]
    if unknown:
        axes = ", ".join(f"{n!r} (size {s})" for n, s in mesh.shape.items())
        raise ShardingError(
            f"{what} is {spec!r}, which names {', '.join(map(repr, unknown))}, but the mesh "
            f"{mesh!r} has no such axis. Its axes are: {axes}. Name one of these, or build "
            f"the mesh with the axis you meant.")
    repeated = sorted({n for n in used if used.count(n) > 1}, key=used.index)
    if repeated:
        raise ShardingError(
            f"{what} is {spec!r}, which uses mesh axis {', '.join(map(repr, repeated))} for "
            f"more than one dimension. A mesh axis can split at most one dimension of an "
            f"array (JAX raises DuplicateSpecError); to split one dimension over several "
            f"axes, put them in a tuple: P(('data', 'model')).")
    if ndim is not None and len(spec) > ndim:
        hint = (" For a scalar, use P(); to concatenate per-device scalars, give them a "
                "length-1 axis first (x[None]).") if ndim == 0 else ""
        raise ShardingError(
            f"{what} is {spec!r}, which has {len(spec)} entries, but the array has rank "
            f"{ndim}; a spec can have at most one entry per dimension.{hint}")


# -- which device holds which block ------------------------------------------------------------

def block_counts(spec: PartitionSpec, mesh: Mesh, ndim: int) -> tuple:
    """How many blocks each dimension is cut into."""
    sizes = mesh.shape
    return tuple(math.prod(sizes[n] for n in spec.axes_of(d)) for d in range(ndim))


def block_position(spec: PartitionSpec, mesh: Mesh, ndim: int, coords: dict) -> tuple:
    """Which block (per dimension) the device at mesh ``coords`` holds: row-major over the
    names of each dimension's entry."""
    sizes = mesh.shape
    out = []
    for d in range(ndim):
        i = 0
        for n in spec.axes_of(d):
            i = i * sizes[n] + coords[n]
        out.append(i)
    return tuple(out)


def block_slices(spec, mesh, shape, coords) -> tuple:
    """The device's block as a tuple of slices, JAX-style: ``slice(None)`` for a dimension
    kept whole, ``slice(start, stop)`` for a split one."""
    counts = block_counts(spec, mesh, len(shape))
    pos = block_position(spec, mesh, len(shape), coords)
    out = []
    for size, n, i in zip(shape, counts, pos):
        if n == 1:
            out.append(slice(None))
        else:
            step = size // n
            out.append(slice(i * step, (i + 1) * step))
    return tuple(out)


def replica_id(spec: PartitionSpec, mesh: Mesh, coords: dict) -> int:
    """Row-major index of the device over the mesh axes the spec does not name (JAX's
    ``Shard.replica_id``): 0 for the first copy of each block."""
    used = set(spec.mesh_axes())
    i = 0
    for n, s in mesh.shape.items():
        if n not in used:
            i = i * s + coords[n]
    return i


def slices_text(index, shape) -> str:
    """'0:2, :' for (slice(0, 2), slice(None)) on any shape."""
    parts = []
    for sl, size in zip(index, shape):
        start, stop, _ = sl.indices(size)
        parts.append(":" if (start, stop) == (0, size) and sl.start is None else f"{start}:{stop}")
    return ", ".join(parts)


class NamedSharding:
    """A mesh and a partition spec: the layout of a global array, like ``jax.sharding.NamedSharding``."""

    def __init__(self, mesh: Mesh, spec: PartitionSpec):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"NamedSharding needs a simpmd.Mesh, got {mesh!r}")
        check_spec(spec, mesh, "the spec")
        self.mesh, self.spec = mesh, spec

    @property
    def device_set(self) -> set:
        return set(self.mesh.devices.flat)

    @property
    def num_devices(self) -> int:
        return self.mesh.size

    @property
    def is_fully_replicated(self) -> bool:
        return all(self.mesh.shape[n] == 1 for n in self.spec.mesh_axes())

    def shard_shape(self, global_shape) -> tuple:
        counts = block_counts(self.spec, self.mesh, len(global_shape))
        return tuple(s // n for s, n in zip(global_shape, counts))

    def devices_indices_map(self, global_shape) -> dict:
        """{device: tuple of slices}: the block of a ``global_shape`` array each device holds."""
        global_shape = tuple(global_shape)
        check_spec(self.spec, self.mesh, "the spec", len(global_shape))
        return {d: block_slices(self.spec, self.mesh, global_shape, self.mesh.coords_of(k))
                for k, d in enumerate(self.mesh.devices.flat)}

    addressable_devices_indices_map = devices_indices_map

    def __eq__(self, other):
        return (isinstance(other, NamedSharding) and self.mesh == other.mesh
                and self.spec == other.spec)

    def __hash__(self):
        return hash((self.mesh, self.spec))

    def __repr__(self):
        return f"NamedSharding(mesh={self.mesh!r}, spec={self.spec!r})"


# -- an array's blocks on a mesh ----------------------------------------------------------

def _split_shape(shape, spec, mesh):
    """``shape`` with each split dimension cut into (its mesh axes..., block): the axis
    positions by mesh axis name, and the positions of the block dimensions."""
    sizes, cut, position, blocks = mesh.shape, [], {}, []
    for d, size in enumerate(shape):
        names = spec.axes_of(d)
        for name in names:
            position[name] = len(cut)
            cut.append(sizes[name])
        blocks.append(len(cut))
        cut.append(size // math.prod(sizes[n] for n in names))
    return cut, position, blocks


def stack_blocks(value, spec, mesh):
    """Every device's block of ``value``, stacked in the mesh's row-major device order."""
    cut, position, blocks = _split_shape(value.shape, spec, mesh)
    v = value.reshape(cut + [1] * (len(mesh.axis_names) - len(position)))
    free = iter(range(len(cut), v.ndim))
    order = [position[n] if n in position else next(free) for n in mesh.axis_names] + blocks
    v = np.broadcast_to(v.transpose(order), tuple(mesh.shape.values()) + tuple(cut[b] for b in blocks))
    return v.reshape((mesh.size,) + v.shape[len(mesh.axis_names):])


def join_blocks(stack, spec, mesh):
    """The global array whose blocks ``stack`` holds (the first copy of each block)."""
    grid = stack.reshape(tuple(mesh.shape.values()) + stack.shape[1:])
    used = spec.mesh_axes()
    names = [n for n in mesh.axis_names if n in used]
    grid = grid[tuple(slice(None) if n in used else 0 for n in mesh.axis_names)]
    order, shape = [], []
    for d, size in enumerate(stack.shape[1:]):
        axes = spec.axes_of(d)
        order += [names.index(n) for n in axes] + [len(names) + d]
        shape.append(size * math.prod(mesh.shape[n] for n in axes))
    return np.array(grid.transpose(order).reshape(shape))
