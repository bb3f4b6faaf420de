"""Simulated devices and the platform they belong to.

A learner asks ``jax.devices()`` what hardware they have; ``simpmd.devices()`` answers
the same question for the simulated machine. The platform also records what hardware
the simulated devices stand for (a label the cost model reads), how they are wired
(a physical topology such as a 4x4 torus), so that the same program can be costed on
a TPU slice or on a GPU node, and which process (host) each device belongs to: one
process by default, as a single Python process sees every device; several with
``set_device_count(n, processes=...)``, as on a TPU pod slice or a GPU cluster, where
``simpmd.run_processes`` runs one program per process (``simpmd/hosts/``).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import itertools
import math
import threading

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
    process_index: int = 0                # the host whose process drives it, as jax.Device's
    slice: int | None = field(default=None, repr=False)   # its TPU slice, None: no slices

    def __repr__(self) -> str:
        return f"SimDevice(id={self.id})"

    @property
    def device_kind(self) -> str:         # jax.Device has the same attribute
        return self.hardware

    @property
    def slice_index(self) -> int:
        """The TPU slice holding this device, as a multislice TPU device reports it. A
        platform made without ``slices=`` has none, like JAX's CPU and GPU devices (no
        such attribute), so ``create_hybrid_device_mesh`` then needs process granules."""
        if self.slice is None:
            raise AttributeError(
                f"{self!r} has no slice_index: the simulated platform has no slices, as JAX's "
                f"CPU devices have none. Make one with set_device_count(n, slices=k), or pass "
                f"process_is_granule=True to create_hybrid_device_mesh.")
        return self.slice


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
        hosts = f", {self.process_count} processes" if self.process_count > 1 else ""
        slices = f", {self.slice_count} slices" if self.slice_count > 1 else ""
        return (f"Platform({len(self.devices)} x {self.hardware!r}, topology {shape}"
                f"{hosts}{slices})")

    @property
    def process_count(self) -> int:
        return self.devices[-1].process_index + 1

    @property
    def slice_count(self) -> int:
        """How many TPU slices the devices form (1 when made without ``slices=``)."""
        last = self.devices[-1].slice
        return 1 if last is None else last + 1

    def process_devices(self, index: int) -> list:
        """The devices process ``index`` drives (its ``jax.local_devices()``)."""
        return [d for d in self.devices if d.process_index == index]

    def device_grid(self) -> np.ndarray:
        """The devices as an object array shaped like the physical topology."""
        grid = np.empty(len(self.devices), dtype=object)
        grid[:] = self.devices
        return grid.reshape(self.topology)


# Devices per host where the hardware fixes it, for ``processes="hardware"``:
# TPU v4 and v5p VMs hold 4 chips (https://cloud.google.com/tpu/docs/v4,
# https://cloud.google.com/tpu/docs/v5p); multi-host v5e slices are built of 8-chip hosts
# (the slice table of https://cloud.google.com/tpu/docs/v5e: 16 chips on 2 hosts, 256 on
# 32; smaller VMs of 1 or 4 chips exist too); a DGX or HGX H100 or A100 node holds 8 GPUs
# (https://docs.nvidia.com/dgx/dgxh100-user-guide/introduction-to-dgxh100.html).
DEVICES_PER_HOST = {"TPU v4": 4, "TPU v5p": 4, "TPU v5e": 8, "H100": 8, "H200": 8, "A100": 8}


def _process_sizes(count: int, hardware: str, processes) -> int:
    """How many devices each process drives, from ``processes`` (None: one process for
    all; an int: that many equal processes; "hardware": the host size of ``hardware``)."""
    if processes is None:
        return count
    if processes == "hardware":
        if hardware not in DEVICES_PER_HOST:
            raise ValueError(
                f"processes='hardware': no host size is known for {hardware!r} (known: "
                f"{', '.join(DEVICES_PER_HOST)}); give the number of processes instead.")
        per = min(DEVICES_PER_HOST[hardware], count)
    elif isinstance(processes, (int, np.integer)) and not isinstance(processes, bool):
        if not 1 <= processes <= count:
            raise ValueError(f"processes={processes}: a platform of {count} devices can have "
                             f"1 to {count} processes.")
        if count % int(processes):
            raise ValueError(
                f"{count} devices do not split evenly into {processes} processes; every host "
                f"of a slice or cluster drives the same number of devices.")
        per = count // int(processes)
    else:
        raise TypeError(f"processes must be None, an int or 'hardware', got {processes!r}")
    if count % per:
        raise ValueError(
            f"{count} devices do not split evenly into processes of {per}; every host of a "
            f"slice or cluster drives the same number of devices. Choose a device count "
            f"that {per} divides, or another number of processes.")
    return per


def _slice_size(count: int, per_process: int, slices) -> int | None:
    """How many devices each TPU slice holds, from ``slices`` (None: no slices), checking
    that every process (host) lies inside one slice, as a multislice job's hosts do."""
    if slices is None:
        return None
    if isinstance(slices, bool) or not isinstance(slices, (int, np.integer)) or slices < 1:
        raise TypeError(f"slices must be None or a positive int, got {slices!r}")
    if count % int(slices):
        raise ValueError(f"{count} devices do not split evenly into {slices} slices; every "
                         f"slice of a multislice job holds the same number of chips.")
    per = count // int(slices)
    if per_process < count and per % per_process:
        raise ValueError(
            f"slices={slices} of {per} devices each cut through processes of {per_process} "
            f"devices; a host belongs to one slice. Choose slices and processes so that "
            f"{per_process} divides the slice size.")
    return per


def _make_platform(count: int, hardware: str, topology, processes=None,
                   slices=None) -> Platform:
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"set_device_count expects an int, got {count!r}")
    if not 1 <= count <= MAX_DEVICE_COUNT:
        raise ValueError(f"set_device_count: {count} devices is outside 1..{MAX_DEVICE_COUNT}")
    topology = (int(count),) if topology is None else tuple(int(t) for t in topology)
    if math.prod(topology) != count:
        raise ValueError(
            f"topology {topology} holds {math.prod(topology)} devices, but the platform has "
            f"{count}; choose a shape whose sizes multiply to {count}")
    per = _process_sizes(count, hardware, processes)
    per_slice = _slice_size(count, per, slices)
    coords = list(np.ndindex(*topology))
    devices = tuple(SimDevice(i, hardware, tuple(int(c) for c in coords[i]), process_index=i // per,
                              slice=None if per_slice is None else i // per_slice)
                    for i in range(count))
    return Platform(devices, hardware, topology)


_platform = _make_platform(DEFAULT_DEVICE_COUNT, DEFAULT_HARDWARE, None)


def set_device_count(n: int, *, hardware: str | None = None, topology=None,
                     processes=None, slices=None) -> Platform:
    """Choose how many simulated devices exist (1 to 65536), what they stand for, their
    wiring, and the processes (hosts) that drive them.

    ``hardware`` is a label such as ``"TPU v4"`` or ``"H100"`` that the cost model looks up;
    it keeps its previous value when omitted. ``topology`` is the physical shape (row-major
    device ids), e.g. ``(4, 4)`` for a 4x4 torus; by default the devices form a ring.
    ``processes`` is None (one process drives every device: the default), a number of
    processes (devices split among them in id order), or ``"hardware"`` (as many devices per
    process as one host of that hardware holds: 4 TPU v4 chips, 8 H100s). ``slices`` (None:
    none) splits the devices, in id order, into that many TPU slices joined by the
    data-centre network: each device then has a ``slice_index``, as on a multislice TPU
    job, and every process lies in one slice.
    """
    global _platform
    _platform = _make_platform(n, hardware or _platform.hardware, topology, processes, slices)
    return _platform


def platform() -> Platform:
    """The current simulated platform."""
    return _platform


@contextlib.contextmanager
def platform_for(count: int, *, processes=None, hardware: str | None = None, slices=None):
    """A platform of ``count`` devices for the length of a ``with`` block; the previous
    one is put back after it."""
    global _platform
    before = _platform
    set_device_count(count, hardware=hardware, processes=processes, slices=slices)
    try:
        yield _platform
    finally:
        _platform = before


def devices() -> list[SimDevice]:
    """All simulated devices, like ``jax.devices()``."""
    return list(_platform.devices)


# Which simulated process the calling thread runs as (simpmd.run_processes sets it).
_process = threading.local()


def current_process():
    """The simulated process (a ``simpmd.hosts`` process) the caller runs in, or None
    outside ``simpmd.run_processes``."""
    return getattr(_process, "host", None)


# How a simulated process's call of jit, shard_map or device_put joins the other processes':
# simpmd.hosts registers its calls module here when imported (the front ends sit below it).
hosts = None


def intercepts() -> bool:
    """True when a front end's call is a simulated process's own, to hand to ``hosts``
    (a rendezvous running the computation for every process passes through)."""
    host = current_process()
    return host is not None and not host.executing


def process_index() -> int:
    """Which process this is, like ``jax.process_index()``: 0 outside ``run_processes``."""
    host = current_process()
    return 0 if host is None else host.index


def process_count() -> int:
    """How many processes drive the devices, like ``jax.process_count()``."""
    return _platform.process_count


def local_devices() -> list[SimDevice]:
    """The devices this process drives, like ``jax.local_devices()``. Outside
    ``simpmd.run_processes`` simpmd looks from above and sees every device."""
    host = current_process()
    return list(_platform.devices) if host is None else list(host.devices)


def device_count() -> int:
    """How many simulated devices exist, like ``jax.device_count()``."""
    return len(_platform.devices)


def local_device_count() -> int:
    """How many devices this process drives, like ``jax.local_device_count()``."""
    return len(local_devices())
