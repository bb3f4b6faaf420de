"""Global computations inside ``simpmd.run_processes``: what a process's call of ``jit``,
``shard_map``, an operation on a global array or ``device_put`` becomes.

A call whose mesh holds devices of other processes is a rendezvous (``scheduler.py``):
every process must make it, and it runs once over every device. A call whose devices all
belong to this process runs at once, as JAX runs a computation on local devices, without
the others. The front ends (``simpmd.jit``, ``simpmd.shard_map``, ``device_put`` and the
operators of an array) hand a process's calls here.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np

from ..api import tree
from ..core import dtypes
from ..api.jit import ShardedArray, _placed, get_mesh
from ..api.spmd import last_trace
from ..api.shard_map import MeshArray
from ..machine import devices as machine
from ..machine.mesh import Mesh, NamedSharding, PartitionSpec
from . import arrays
from .scheduler import Call, _Raised, where_called
from ..partitioner.sharding import dims_of
from .crossing import collective_calls
from .crossing import calls_text
from ..core import program
from ..partitioner.sharding import settings


@contextlib.contextmanager
def passing_through():
    """Calls made here run directly, not as a process's rendezvous (the rendezvous itself
    runs the computation for everyone this way)."""
    host = machine.current_process()
    if host is None or host.executing:
        yield
        return
    host.executing = True
    try:
        yield
    finally:
        host.executing = False


def _function_of(fn):
    """The learner's Python function under jit, shard_map and functools.partial wrappers."""
    seen = 0
    while hasattr(fn, "fun") and seen < 8:
        fn, seen = fn.fun, seen + 1
    while hasattr(fn, "func") and seen < 16:
        fn, seen = fn.func, seen + 1
    return fn


def _identity(fn) -> tuple:
    """What names a computation across processes: its code's place (each process makes its
    own function objects, but from the same lines)."""
    inner = _function_of(fn)
    code = getattr(inner, "__code__", None)
    if code is None:
        return (getattr(inner, "__name__", type(inner).__name__),)
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _name(fn) -> str:
    inner = _function_of(fn)
    kind = "jit" if type(fn).__name__ == "Jitted" else \
        "shard_map" if type(fn).__name__ == "ShardMapped" else "operation"
    return f"{kind}({getattr(inner, '__name__', repr(inner))})"


def _leaf_type(x):
    if isinstance(x, ShardedArray):
        return ("array", x.aval, x.mesh, x.layout)
    if isinstance(x, (np.ndarray, np.generic, int, float, complex, bool)):
        a = np.asarray(x)
        return ("value", a.shape, a.dtype.str)
    return ("other", type(x).__name__)


def _meshes(fn, leaves) -> list:
    found = [x.mesh for x in leaves if isinstance(x, ShardedArray)]
    inner = fn
    while inner is not None:
        if isinstance(getattr(inner, "mesh", None), Mesh):
            found.append(inner.mesh)
        inner = getattr(inner, "fun", None)
    if get_mesh() is not None:
        found.append(get_mesh())
    return found


def launch(fn, args, kwargs, *, kind=None):
    """``fn(*args, **kwargs)`` as process ``current_process()`` makes it: at once when only
    its own devices take part, else as a rendezvous of every process."""
    host = machine.current_process()
    leaves, treedef = tree.flatten((tuple(args), dict(kwargs)))
    meshes = _meshes(fn, leaves)
    mine = {d.id for d in host.devices}
    if all({d.id for d in m.devices.flat} <= mine for m in meshes):
        with passing_through():
            return _local(fn, args, kwargs, host)
    call = Call(kind or _name(fn).split("(")[0], _name(fn),
                (_identity(fn), treedef, tuple(_leaf_type(x) for x in leaves)),
                lambda calls: _run_global(fn, calls, meshes[0]), (leaves, treedef),
                where_called())
    call.collectives = lambda: _collectives_of(fn, call)
    if not _reads_other_hosts(leaves, mine) and not _crosses_hosts(fn, call, host):
        with passing_through(), np.errstate(all="ignore"):
            return share(_stand_in_run(fn, call), len(host.processes.hosts))[host.index]
    return host.processes.join(host, call)


def _reads_other_hosts(leaves, mine) -> bool:
    """Whether an argument is split over Auto axes across processes: its type says it is
    whole, so every device reads the blocks of the others, which XLA gathers across the
    processes (simpmd's program holds it whole; a process alone would see zeros)."""
    return any(isinstance(x, ShardedArray) and tuple(x.layout) != dims_of(x.aval)
               and not {d.id for d in x.mesh.devices.flat} <= mine for x in leaves)


def _crosses_hosts(fn, call, host) -> bool:
    """Whether the computation's collectives join devices of different processes (found
    once per signature, from a run on stand-in values). One whose collectives all stay
    within hosts needs no other process: in JAX, a process that skips it leaves the others
    running (checked on jax 0.7.2 and 0.10.2)."""
    known = host.processes.crossing.get(call.signature)
    if known is None:
        try:
            with _trial():
                _stand_in_run(fn, call)
            known = any(r["crosses"] for r in collective_calls(last_trace()))
        except Exception:                   # raised: every process must see it raised
            known = True
        host.processes.crossing[call.signature] = known
    return known


def _local(fn, args, kwargs, host):
    """A computation on this process's devices alone; a result JAX would place on the
    process's first device is placed there (simpmd's jit uses device 0 otherwise)."""
    leaves, treedef = tree.flatten((tuple(args), dict(kwargs)))
    leaves = [arrays.merge([x]) if isinstance(x, arrays.ProcessArray) else x for x in leaves]
    a, kw = tree.unflatten(treedef, leaves)
    out = fn(*a, **kw)
    first = host.devices[0]

    def move(y):
        if isinstance(y, ShardedArray) and y.mesh.size == 1 and y.mesh.devices.flat[0] != first:
            mesh = Mesh(np.array(first, dtype=object).reshape(y.mesh.devices.shape),
                        y.mesh.axis_names, axis_types=y.mesh.axis_types)
            y = ShardedArray(y.aval, y.stack, mesh, y.layout)
        return arrays.view_of(y, host.index) if isinstance(y, ShardedArray) else y
    return tree.tree_map(move, out)


def global_inputs(calls, mesh):
    """Each argument leaf with every device's block from the process that drives it."""
    per_process = [c.args[0] for c in calls]
    treedef = calls[0].args[1]
    merged = []
    for j in range(len(per_process[0])):
        values = [leaves[j] for leaves in per_process]
        merged.append(_merge_leaf(values, mesh))
    return tree.unflatten(treedef, merged)


def _merge_leaf(values, mesh):
    first = values[0]
    if isinstance(first, arrays.ProcessArray):
        return arrays.merge(values)
    if not isinstance(first, (np.ndarray, np.generic, int, float, complex, bool)):
        return first
    if all(np.array_equal(np.asarray(v), np.asarray(first)) for v in values[1:]):
        return first
    # processes passed different values for one argument: as in JAX, each device computes
    # with the value of the process that drives it (no check, no error)
    rows = [np.asarray(values[d.process_index]) for d in mesh.devices.flat]
    whole = _placed(np.asarray(first), mesh, PartitionSpec())
    return ShardedArray(whole.aval, np.stack(rows).astype(whole.stack.dtype), mesh, whole.layout)


def _run_global(fn, calls, mesh):
    """Run the computation once over every device; each process gets its view."""
    args, kwargs = global_inputs(calls, mesh)
    host = machine.current_process()
    host.processes.broadcasting = True
    try:
        out = fn(*args, **kwargs)
    finally:
        host.processes.broadcasting = False
    host.processes.log.append((calls[0].name, calls[0].source, last_trace()))
    return share(out, len(calls))


def share(out, processes: int) -> list:
    """Each process's view of a computation's results."""
    views = [[] for _ in range(processes)]
    leaves, treedef = tree.flatten(out)
    for y in leaves:
        if isinstance(y, MeshArray):
            y = _placed(np.asarray(y), y.sharding.mesh, y.sharding.spec)
        parts = arrays.split(y, processes) if isinstance(y, ShardedArray) else [y] * processes
        for p in range(processes):
            views[p].append(parts[p])
    return [tree.unflatten(treedef, v) for v in views]


def _stand_in_run(fn, call):
    """The computation with this process's arguments: its own blocks, and zeros for the
    other processes' blocks."""
    leaves, treedef = call.args
    stand_in = []
    for x in leaves:
        if isinstance(x, arrays.ProcessArray):
            rows = np.zeros((x.mesh.size,) + x.sharding.shard_shape(x.shape), x.dtype)
            for k, block in x._blocks.items():
                rows[k] = block
            stand_in.append(ShardedArray(x.aval, rows, x.mesh, x.layout))
        else:
            stand_in.append(x)
    a, kw = tree.unflatten(treedef, stand_in)
    return fn(*a, **kw)


def _collectives_of(fn, call) -> str:
    """The collectives the computation would run, read off a run on stand-in values: the
    deadlock message names them."""
    with _trial():
        _stand_in_run(fn, call)
    return calls_text(last_trace())


@contextlib.contextmanager
def _trial():
    """A run only to read its collectives: it prints nothing, and the programs it traces
    are forgotten, so that the real run traces them (and prints what tracing prints) in
    the process that makes it, as each JAX process traces for itself."""
    before = {f: dict(entries) for f, entries in program._cache.items()}
    try:
        with passing_through(), contextlib.redirect_stdout(io.StringIO()), \
                np.errstate(all="ignore"):
            yield
    finally:
        for f in list(program._cache.keys()):
            if f in before:
                program._cache[f] = before[f]
            else:
                del program._cache[f]


# -- what jax.experimental.multihost_utils does -------------------------------------------------


def rendezvous(kind, signature, run, args=()):
    """A rendezvous of every process that is not a computation over a mesh (allgather,
    barrier, broadcast): ``run(calls)`` gives each process its outcome."""
    host = machine.current_process()
    call = Call(kind, kind, (kind,) + tuple(signature), run, args, where_called())
    return host.processes.join(host, call)


def placed_on_mesh(value, sharding: NamedSharding):
    """``device_put`` of a host value in a process: local when the mesh is the process's
    own; else every process must pass the same value, which JAX checks with
    ``multihost_utils.assert_equal`` (see :func:`unequal`)."""
    host = machine.current_process()
    mesh = sharding.mesh
    if {d.id for d in mesh.devices.flat} <= {d.id for d in host.devices}:
        return arrays.view_of(_placed(value, mesh, sharding.spec), host.index)
    value = np.asarray(value)

    def run(calls):
        values = [c.args for c in calls]
        views = arrays.split(_placed(values[0], mesh, sharding.spec), len(calls))
        kind = f"<class 'numpy.{type(values[0]).__name__}'>"
        return [_Raised(AssertionError(
            f"{kind} passed to device_put is not the same on each process. Make sure you "
            f"are passing the same value of {kind} on each process. ({why})")) if why else view
                for view, why in zip(views, unequal(values))]
    return rendezvous("device_put", (value.shape, value.dtype.str, mesh, sharding.spec), run,
                      value)


def unequal(values) -> list:
    """Per process, why JAX's ``assert_equal`` of these host values fails there ('' where
    it passes). JAX gathers the values as the arrays it would make (float64 becomes
    float32 without x64) and compares each process's own value with them: with every
    process's from jax 0.10 (all fail when any differs), with process 0's on 0.7.2 (checked
    on 0.7.2, 0.10.2, 0.12.0.1). So a float64 value that float32 cannot hold exactly (0.1)
    fails even when every process passes the same one."""
    gathered = [v.astype(dtypes.canonical(v.dtype)) for v in values]
    against = gathered if settings.version > (0, 7, 2) else gathered[:1]
    out = []
    for v in values:
        if any(g.shape != v.shape or not np.array_equal(g, v) for g in against):
            exact = np.array_equal(v.astype(dtypes.canonical(v.dtype)), v)
            out.append("the processes passed different values" if exact else
                       f"JAX compares the {v.dtype} value with the "
                       f"{dtypes.canonical(v.dtype)} it gathered, which cannot hold it "
                       f"exactly: pass {dtypes.canonical(v.dtype)}")
        else:
            out.append("")
    return out
