"""``simpmd.multihost_utils``: ``jax.experimental.multihost_utils`` for simulated processes.

Inside ``simpmd.run_processes`` each is a rendezvous of every process, as in JAX, where
each runs a small collective over all hosts. Outside it there is one process, and each
returns at once what JAX returns on one process. Behaviour checked against jax 0.7.2,
0.10.2 and 0.12.0.1 on 4 processes x 2 CPU devices (differences noted where they are).
"""
from __future__ import annotations

import zlib

import numpy as np

from .api import tree
from .hosts import arrays
from .partitioner.sharding import all_explicit, resolve, settings
from .hosts.calls import rendezvous, unequal
from .hosts.scheduler import _Raised
from .api.jit import device_put
from .machine import devices as machine
from .machine.mesh import NamedSharding, join_blocks

__all__ = ["assert_equal", "broadcast_one_to_all", "global_array_to_host_local_array",
           "host_local_array_to_global_array", "process_allgather", "sync_global_devices"]


def _gathered(values, tiled: bool):
    """One leaf from every process, gathered as JAX gathers it."""
    first = values[0]
    if isinstance(first, arrays.ProcessArray) and not first.is_fully_addressable:
        if not tiled and settings.version > (0, 7, 2):     # jax 0.7.2 gathers it all the same
            raise ValueError("Gathering global non-fully-addressable arrays only supports "
                             "tiled=True")
        return np.asarray(arrays.merge(values))
    parts = [np.asarray(v) for v in values]
    if tiled and parts[0].ndim > 0:
        return np.concatenate(parts, axis=0)
    return np.stack(parts)


def process_allgather(in_tree, tiled: bool = False):
    """Every process's value, gathered onto every process as NumPy: a global array whole
    (needs ``tiled=True``, as in JAX), a host-local value stacked along a new first axis
    (or, with ``tiled``, concatenated along the first)."""
    leaves, treedef = tree.flatten(in_tree)
    if machine.current_process() is None:
        return tree.unflatten(treedef, [_gathered([x], tiled) for x in leaves])

    def run(calls):
        out = [_gathered([c.args[j] for c in calls], tiled) for j in range(len(leaves))]
        return [tree.unflatten(treedef, out)] * len(calls)
    kinds = tuple(type(x).__name__ for x in leaves)
    return rendezvous("process_allgather", (treedef, kinds, tiled), run, tuple(leaves))


def sync_global_devices(name: str):
    """A barrier of every process: each waits until all have reached it. JAX checks that
    they passed the same ``name`` (with ``assert_equal`` of its hash): a process that sees
    another name raises an AssertionError (every process from jax 0.10; on 0.7.2 those
    whose name differs from process 0's)."""
    if machine.current_process() is None:
        return None

    def run(calls):
        names = [c.args for c in calls]
        hashes = [np.asarray(zlib.crc32(n.encode()), np.uint32) for n in names]
        return [_Raised(AssertionError(
            f"sync_global_devices name mismatch ({n!r}): the processes passed "
            f"{', '.join(repr(m) for m in names)} (process 0 first)")) if why else None
            for n, why in zip(names, unequal(hashes))]
    return rendezvous("sync_global_devices", (), run, name)


def assert_equal(in_tree, fail_message: str = ""):
    """Raise an AssertionError in each process whose value is not what JAX finds the
    others hold (``simpmd.hosts.calls.unequal`` says how each version compares)."""
    if machine.current_process() is None:
        return None
    leaves, treedef = tree.flatten(in_tree)

    def run(calls):
        per_leaf = [unequal([np.asarray(c.args[j]) for c in calls]) for j in range(len(leaves))]
        return [_Raised(AssertionError(f"{fail_message}. Got: {[np.asarray(x).tolist() for x in c.args]}"
                                       f" ({next(w[p] for w in per_leaf if w[p])})"))
                if any(w[p] for w in per_leaf) else None for p, c in enumerate(calls)]
    return rendezvous("assert_equal", (treedef,), run, tuple(leaves))


def broadcast_one_to_all(in_tree, is_source: bool | None = None):
    """Process 0's value (or the source's) on every process, as NumPy."""
    leaves, treedef = tree.flatten(in_tree)
    if machine.current_process() is None:
        return tree.unflatten(treedef, [np.asarray(x) for x in leaves])
    mine = machine.process_index() == 0 if is_source is None else bool(is_source)

    def run(calls):
        sources = [c for c in calls if c.args[0]]
        if len(sources) != 1:
            raise ValueError(f"broadcast_one_to_all needs exactly one source process, got "
                             f"{len(sources)}.")
        out = tree.unflatten(treedef, [np.asarray(x) for x in sources[0].args[1]])
        return [out] * len(calls)
    return rendezvous("broadcast_one_to_all", (treedef,), run, (mine, tuple(leaves)))


# -- host-local and global arrays --------------------------------------------------------------


def _per_leaf(convert, inputs, global_mesh, pspecs, what):
    leaves, treedef = tree.flatten(inputs)
    specs = tree.broadcast_prefix(pspecs, inputs, what=what)
    for spec in specs:
        if spec is None:
            raise ValueError(f"{what} cannot be None: give a PartitionSpec for every array "
                             f"(P() for one every device holds whole).")
    return tree.unflatten(treedef, [convert(x, global_mesh, spec)
                                    for x, spec in zip(leaves, specs)])


def _to_global(x, global_mesh, spec):
    if isinstance(x, arrays.ProcessArray) and not x.is_fully_addressable:
        return x                                  # already global, as JAX returns it
    return arrays.make_array_from_process_local_data(NamedSharding(global_mesh, spec),
                                                     np.asarray(x))


def _to_host_local(x, global_mesh, spec):
    if not isinstance(x, arrays.ProcessArray):
        return device_put(x, NamedSharding(global_mesh, spec))
    layout = resolve(spec, all_explicit(global_mesh), x.ndim, "pspecs")
    if x.mesh != global_mesh or tuple(x.layout) != tuple(layout):
        x = device_put(x, NamedSharding(global_mesh, spec))     # resharded first, as in JAX
    mesh = global_mesh.local_mesh
    ids = {d.id: k for k, d in enumerate(global_mesh.devices.flat)}
    stack = np.stack([x._blocks[ids[d.id]] for d in mesh.devices.flat])
    return device_put(join_blocks(stack, spec, mesh), NamedSharding(mesh, spec))


def host_local_array_to_global_array(local_inputs, global_mesh, pspecs):
    """Each process's local data (a pytree) as global arrays over ``global_mesh``, laid
    out by ``pspecs`` (a pytree prefix): along a dimension the spec splits over several
    processes, each process's data is its own part (as
    ``make_array_from_process_local_data``); an array already global is returned as is."""
    return _per_leaf(_to_global, local_inputs, global_mesh, pspecs, "pspecs")


def global_array_to_host_local_array(global_inputs, global_mesh, pspecs):
    """Global arrays as each process's own part: an array over the process's local mesh
    (``global_mesh.local_mesh``) holding the blocks its devices hold, laid out by ``pspecs``; the
    global array is resharded to ``pspecs`` first where it is laid out otherwise."""
    return _per_leaf(_to_host_local, global_inputs, global_mesh, pspecs, "pspecs")
