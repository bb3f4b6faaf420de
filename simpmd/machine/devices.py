"""Simulated devices and the platform they belong to.

A learner asks ``jax.devices()`` what hardware they have; ``simpmd.devices()`` answers
the same question for the simulated machine. The platform also records what hardware
the simulated devices stand for (a label the cost model reads) and how they are wired
(a physical topology such as a 4x4 torus), so that the same program can be costed on
a TPU slice or on a GPU node.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import itertools
import math

import numpy as np

DEFAULT_DEVICE_COUNT = 8
DEFAULT_HARDWARE = "TPU v4"
MAX_DEVICE_COUNT = 65536


@dataclass(frozen=True)
class SimDevice:
    """One simulated accelerator. Prints like JAX's ``CpuDevice(id=0)``."""

    id: int
    hardware: str = DEFAULT_HARDWARE
    coords: tuple[int, ...] = ()          # position in the physical topology
    platform: str = "sim"

    def __repr__(self) -> str:
        return f"SimDevice(id={self.id})"

    @property
    def device_kind(self) -> str:         # jax.Device has the same attribute
        return self.hardware


_generations = itertools.count()       # each platform made gets a number of its own


@dataclass(frozen=True)
class Platform:
    """The simulated machine: how many devices, what they stand for, how they are wired."""

    devices: tuple[SimDevice, ...]
    hardware: str
    topology: tuple[int, ...]             # physical shape, e.g. (8,) or (2, 2, 2)
    generation: int = field(default_factory=lambda: next(_generations), compare=False)

    def __repr__(self) -> str:
        shape = "x".join(map(str, self.topology))
        return f"Platform({len(self.devices)} x {self.hardware!r}, topology {shape})"

    def device_grid(self) -> np.ndarray:
        """The devices as an object array shaped like the physical topology."""
        grid = np.empty(len(self.devices), dtype=object)
        grid[:] = self.devices
        return grid.reshape(self.topology)


def _make_platform(count: int, hardware: str, topology) -> Platform:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"set_device_count expects an int, got {count!r}")
    if not 1 <= count <= MAX_DEVICE_COUNT:
        raise ValueError(f"set_device_count: {count} devices is outside 1..{MAX_DEVICE_COUNT}")
    topology = (int(count),) if topology is None else tuple(int(t) for t in topology)
    if math.prod(topology) != count:
        raise ValueError(
            f"topology {topology} holds {math.prod(topology)} devices, but the platform has "
            f"{count}; choose a shape whose sizes multiply to {count}")
    coords = list(np.ndindex(*topology))
    devices = tuple(SimDevice(i, hardware, tuple(int(c) for c in coords[i])) for i in range(count))
    return Platform(devices, hardware, topology)


_platform = _make_platform(DEFAULT_DEVICE_COUNT, DEFAULT_HARDWARE, None)


def set_device_count(n: int, *, hardware: str | None = None, topology=None) -> Platform:
    """Choose how many simulated devices exist (1 to 65536), what they stand for and their wiring.

    ``hardware`` is a label such as ``"TPU v4"`` or ``"H100"`` that the cost model looks up;
    it keeps its previous value when omitted. ``topology`` is the physical shape (row-major
    device ids), e.g. ``(4, 4)`` for a 4x4 torus; by default the devices form a ring.
    """
    global _platform
    _platform = _make_platform(n, hardware or _platform.hardware, topology)
    return _platform


def platform() -> Platform:
    """The current simulated platform."""
    return _platform


def devices() -> list[SimDevice]:
    """All simulated devices, like ``jax.devices()``."""
    return list(_platform.devices)


def local_devices() -> list[SimDevice]:
    """Same as :func:`devices`: a simulation has a single host."""
    return list(_platform.devices)


def device_count() -> int:
    """How many simulated devices exist, like ``jax.device_count()``."""
    return len(_platform.devices)


local_device_count = device_count
