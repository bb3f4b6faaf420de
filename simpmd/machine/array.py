"""What a top-level ``simpmd.pmap`` returns: the stacked result plus where each shard lives.

It converts to NumPy with ``np.asarray`` and offers ``.addressable_shards``, ``.devices()``
and ``.sharding`` the way a ``jax.Array`` does, so a learner can ask "which device holds
which part?" of a simulated result just as of a real one.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin
from .mesh import Mesh, NamedSharding, PartitionSpec


@dataclass(frozen=True)
class Shard:
    """One device's piece of an :class:`Array`, like ``jax.Array.addressable_shards[i]``."""

    device: object          # a SimDevice
    index: tuple            # where the piece sits in the global array (slices)
    data: np.ndarray
    replica_id: int = 0


@dataclass(frozen=True)
class GridSharding:
    """How a nested pmap's result is laid out over the grid of outer x inner devices.

    (A top-level pmap's result has a ``NamedSharding``, as in JAX since 0.10; today's JAX
    has no nested pmap, so this layout has no JAX class to copy.)
    """

    devices: tuple
    mapped_axis: int | None

    @property
    def device_set(self):
        return set(self.devices)

    def __repr__(self):
        where = "replicated" if self.mapped_axis is None else f"axis {self.mapped_axis} split"
        return f"GridSharding({where} over {len(self.devices)} simulated devices)"


class HostArray(NDArrayOperatorsMixin):
    """A simulated result seen from the host: NumPy behaviour over ``self._value``.

    Subclasses say how the whole value is assembled from the devices and where each
    shard lives (``addressable_shards``).
    """

    __array_priority__ = 500
    _value: np.ndarray

    def devices(self) -> set:
        return set(self.sharding.device_set)

    def block_until_ready(self):
        return self            # a simulation has finished by the time it returns

    def __array__(self, dtype=None, copy=None):
        return self._value if dtype is None else self._value.astype(dtype)

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        inputs = tuple(i._value if isinstance(i, HostArray) else i for i in inputs)
        return getattr(ufunc, method)(*inputs, **kwargs)

    def __array_function__(self, func, types, args, kwargs):
        def plain(x):
            if isinstance(x, HostArray):
                return x._value
            if isinstance(x, (list, tuple)):
                return type(x)(plain(i) for i in x)
            return x
        return func(*plain(args), **plain(kwargs))

    def __getattr__(self, name):
        if name.startswith("_") or name == "sharding":
            raise AttributeError(name)
        return getattr(self._value, name)

    shape = property(lambda self: self._value.shape)
    dtype = property(lambda self: self._value.dtype)
    ndim = property(lambda self: len(self.shape))
    size = property(lambda self: int(np.prod(self.shape)))

    def __len__(self):
        return len(self._value)

    def __iter__(self):
        return iter(self._value)

    def __getitem__(self, index):
        return self._value[index]

    def __bool__(self):
        return bool(self._value)

    def __float__(self):
        return float(self._value)

    def __int__(self):
        return int(self._value)

    def __index__(self):
        return self._value.__index__()

    def __repr__(self):
        body = np.array2string(self._value, separator=", ", prefix="Array(")
        return f"Array({body}, dtype={self._value.dtype})"

    def __str__(self):
        return str(self._value)


class Array(HostArray):
    """A result of ``simpmd.pmap``: behaves like a NumPy array, and knows its shards."""

    def __init__(self, per_device: list, devices, mapped_axis: int | None, layout=None,
                 axis_name=None):
        # Like a jax.Array, the result stays "on the devices" (one value per device)
        # until the host asks for the whole: the stacked copy is made on first use.
        # ``layout`` ((device, index, replica_id), ...) overrides where shards live: a
        # nested pmap's outer result is spread over every device of the grid.
        # ``per_device`` is a list of arrays, or one array stacked along a device axis.
        self._per_device = per_device
        self._stacked = self._sharding = None
        self._layout = layout
        self.mapped_axis, self._axis_name = mapped_axis, axis_name
        self._devices = tuple(d for d, _, _ in layout) if layout else tuple(devices)

    @property
    def sharding(self):
        """As jax.pmap's results since jax 0.10: a NamedSharding over a one-axis mesh of the
        devices, whose spec names the mapped axis where out_axes put it (made when asked)."""
        if self._sharding is None and self._layout is not None:
            self._sharding = GridSharding(self._devices, self.mapped_axis)
        elif self._sharding is None:
            name = "_internal_pmap_axis_name" if self._axis_name is None else self._axis_name
            mesh = Mesh(np.array(self._devices, dtype=object), (name,))
            spec = PartitionSpec() if self.mapped_axis is None else PartitionSpec(
                *([None] * self.mapped_axis + [name]))
            self._sharding = NamedSharding(mesh, spec)
        return self._sharding

    @property
    def _value(self) -> np.ndarray:
        if self._stacked is None:
            ax = self.mapped_axis
            self._stacked = (np.array(self._per_device[0]) if ax is None
                             else np.stack(list(self._per_device), axis=ax))
        return self._stacked

    @property
    def addressable_shards(self) -> list[Shard]:
        if self._layout is not None:
            return [Shard(d, index, self._value[index], r) for d, index, r in self._layout]
        ax = self.mapped_axis
        shards = []
        for i, (d, v) in enumerate(zip(self._devices, self._per_device)):
            if ax is None:
                shards.append(Shard(d, (slice(None),) * v.ndim, v, replica_id=i))
            else:
                index = (slice(None),) * ax + (slice(i, i + 1),) + (slice(None),) * (v.ndim - ax)
                shards.append(Shard(d, index, np.expand_dims(v, ax)))
        return shards

    @property
    def shape(self):
        first, ax = self._per_device[0], self.mapped_axis
        if ax is None:
            return first.shape
        return first.shape[:ax] + (len(self._per_device),) + first.shape[ax:]

    dtype = property(lambda self: self._per_device[0].dtype)
