"""``simpmd.mesh_utils``: ``jax.experimental.mesh_utils`` for simulated devices.

``create_hybrid_device_mesh`` lays a mesh out in two levels, as a model is laid out over a
cluster: ``mesh_shape`` within each *granule* (a slice of TPU chips joined by ICI, or, with
``process_is_granule=True``, the devices of one process: a host), ``dcn_mesh_shape``
across granules (the slower network between them). Each mesh axis has size
``mesh_shape[i] * dcn_mesh_shape[i]``, granules outermost: an axis that is 1 within and
``n`` across spans the hosts (data parallelism, whose one all-reduce a step can afford on
the slow network), an axis that is ``m`` within and 1 across stays inside each host
(tensor parallelism, whose collectives come every layer). Simulated devices, like JAX's
CPU devices, have no ``slice_index`` unless the platform was made with
``set_device_count(n, slices=k)`` (a multislice TPU job); without slices, pass
``process_is_granule=True`` to use processes as the granules.
"""
from __future__ import annotations

import math

import numpy as np

from .machine.devices import devices as all_devices

__all__ = ["create_device_mesh", "create_hybrid_device_mesh"]


def create_device_mesh(mesh_shape, devices=None, **unused):
    """The devices as a grid of ``mesh_shape``, in order (as JAX lays out devices that
    have no physical topology to follow, such as CPUs)."""
    devices = list(all_devices() if devices is None else devices)
    mesh_shape = tuple(int(s) for s in mesh_shape)
    if math.prod(mesh_shape) != len(devices):
        raise ValueError(f"Number of devices {len(devices)} must equal the product of "
                         f"mesh_shape {mesh_shape}")
    grid = np.empty(len(devices), dtype=object)
    grid[:] = devices
    return grid.reshape(mesh_shape)


def create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape, devices=None, *,
                              process_is_granule: bool = False,
                              should_sort_granules_by_key: bool = True,
                              allow_split_physical_axes: bool = False):
    """A mesh of ``mesh_shape`` within each granule and ``dcn_mesh_shape`` across them,
    like ``jax.experimental.mesh_utils.create_hybrid_device_mesh``: granule ``g`` (in the
    row-major order of ``dcn_mesh_shape``) fills the block at its place. Granules are
    slices (``slice_index``), or processes with ``process_is_granule=True``;
    ``allow_split_physical_axes`` is accepted for JAX's signature (simulated devices are
    laid out in id order, as JAX lays out CPU devices)."""
    devices = list(all_devices() if devices is None else devices)
    attr = "process_index" if process_is_granule else "slice_index"
    if not hasattr(devices[0], attr):
        raise ValueError(f"Device {devices[0]} does not have attribute {attr}. See "
                         f"`process_is_granule` option, or make the simulated platform "
                         f"with set_device_count(n, slices=k).")
    granules: dict = {}
    for d in devices:
        granules.setdefault(getattr(d, attr), []).append(d)
    keys = sorted(granules) if should_sort_granules_by_key else list(granules)
    if math.prod(dcn_mesh_shape) != len(keys):
        raise ValueError(f"Number of slices {len(keys)} must equal the product of "
                         f"dcn_mesh_shape {tuple(dcn_mesh_shape)}")
    blocks = [create_device_mesh(mesh_shape, granules[k]) for k in keys]
    layout = np.empty(len(blocks), dtype=object)
    layout[:] = blocks
    return np.block(layout.reshape(tuple(dcn_mesh_shape)).tolist())
