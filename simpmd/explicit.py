"""``jit`` with Explicit shardings, simulated: each device's block, and the collectives the
compiler would insert, as JAX's sharding-in-types rules require them.

Since jax 0.9, ``jax.make_mesh`` gives *Explicit* axes: an array's sharding is part of its
type (``jax.typeof(x)`` prints ``float32[16@data,32@model]``), every operation has a rule
that gives its result's sharding from its operands', and where the rule is ambiguous JAX
raises and asks for ``out_sharding=``. The compiler then inserts whatever collectives
make each device's block of the result right.

This module does the same on simulated devices, with JAX's names::

    mesh = simpmd.make_mesh((2, 4), ('data', 'model'))      # Explicit axes
    with simpmd.set_mesh(mesh):
        x = simpmd.device_put(x_np, P('data', 'model'))
        w = simpmd.device_put(w_np, P('model', None))
        f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P('data', None)))
        y = f(x, w)
    simpmd.typeof(y)          # float32[16@data,8]
    print(f.trace)            # the all-reduce over 'model' that the matmul needed

A :class:`ShardedArray` holds every device's block, stacked as ``(*mesh shape, *block
shape)``. Each operation (the table :data:`RULES`) (1) gives the result's sharding by
JAX's rule, or raises where JAX raises; (2) moves operands into a layout where each device
can compute its block alone, logging each collective that takes; (3) computes every
device's block with NumPy; (4) combines partial sums (all-reduce or reduce-scatter).
Every collective lands in the per-device log as an ordinary :class:`simpmd.Event`, with
``params['inserted']`` naming the operation that needed it, so ``trace.draw()``, the text
views and ``simpmd.cost`` read it as they read a collective a learner wrote.

What this simulates is the *rule*: the simplest collectives that give each device its
block. XLA may choose others for the same rule (an all-to-all instead of a gather and a
slice, an all-reduce and a slice instead of a reduce-scatter); lesson 13 reads both. Auto
axes are not simulated: there, XLA's partitioner decides by heuristics.

This module never imports JAX and is independent of the pmap/shard_map engine.
"""
from __future__ import annotations

import contextlib
import contextvars
import inspect
import math
import os
import re
import sys
from dataclasses import dataclass

import numpy as np

from . import numpy as _core_numpy
from .core.collectives import COLLECTIVES as _ROWS
from .core.errors import SimpmdError
from .core.log import Event
from .api.trace import Trace
from .machine.mesh import AxisType, Mesh, NamedSharding, PartitionSpec, axis_types_of

WIRE_BYTES = {op: row.wire_bytes for op, row in _ROWS.items()}   # until jit joins the program

P = PartitionSpec


class ShardingTypeError(SimpmdError, TypeError):
    """An operation whose result sharding JAX's rules refuse (JAX's ``ShardingTypeError``)."""


# -- the current mesh: set_mesh ------------------------------------------------------------

_MESH: contextvars.ContextVar = contextvars.ContextVar("simpmd_explicit_mesh", default=None)


class set_mesh:
    """Make ``mesh`` the one that ``P(...)`` refers to, like ``jax.set_mesh``.

    Called alone it sets the mesh until changed; as ``with simpmd.set_mesh(mesh):`` it
    puts the previous mesh back at the end of the block.
    """

    def __init__(self, mesh: Mesh):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"set_mesh takes a simpmd Mesh (simpmd.make_mesh(...)), got {mesh!r}")
        self.mesh = mesh
        self._token = _MESH.set(mesh)

    def __enter__(self):
        return self.mesh

    def __exit__(self, *exc):
        _MESH.reset(self._token)
        return False


def get_mesh() -> Mesh | None:
    """The mesh set by :class:`set_mesh`, or None."""
    return _MESH.get()


# -- specs as tuples of axis names per dimension ---------------------------------------------

def _dims_of(spec, ndim: int) -> tuple:
    """A spec as one tuple of mesh axis names per dimension (``()`` = whole)."""
    if isinstance(spec, NamedSharding):
        spec = spec.spec
    if spec is None:
        spec = P()
    if not isinstance(spec, PartitionSpec):
        spec = P(*spec)
    if len(spec) > ndim:
        raise ShardingTypeError(f"the spec {spec} has {len(spec)} entries but the array has "
                                f"only {ndim} dimension(s); give at most one entry per dimension.")
    return tuple(spec.axes_of(d) for d in range(ndim))


def _spec_of(dims: tuple) -> PartitionSpec:
    return P(*[None if not a else (a[0] if len(a) == 1 else a) for a in dims])


def _dim_text(size, axes) -> str:
    if not axes:
        return str(size)
    return f"{size}@{axes[0]}" if len(axes) == 1 else f"{size}@({','.join(axes)})"


def _check_dims(dims, mesh: Mesh, shape, what: str):
    used = [a for d in dims for a in d]
    for a in used:
        if a not in mesh.axis_names:
            raise ShardingTypeError(f"{what}: {a!r} is not an axis of the mesh {mesh}; the mesh "
                                    f"has axes {mesh.axis_names}.")
    twice = sorted({a for a in used if used.count(a) > 1})
    if twice:
        raise ShardingTypeError(
            f"{what}: mesh axis {twice[0]!r} would split two dimensions of the same array "
            f"({_spec_of(dims)}). An axis can split one dimension only; choose another spec "
            f"(write out_sharding= or reshard first).")
    for d, (n, axes) in enumerate(zip(shape, dims)):
        k = math.prod(mesh.shape[a] for a in axes)
        if n % k:
            raise ShardingTypeError(
                f"{what}: dimension {d} has size {n}, which the {k} devices of {axes} cannot "
                f"split evenly. JAX requires even splits for Explicit shardings; pad the array "
                f"or split that dimension over fewer devices.")


# -- the type of an array ----------------------------------------------------------------------

@dataclass(frozen=True)
class ShapedArray:
    """What ``simpmd.typeof`` gives: shape, dtype and sharding, printed as JAX prints them."""
    shape: tuple
    dtype: np.dtype
    sharding: NamedSharding

    def str_short(self) -> str:
        types = axis_types_of(self.sharding.mesh)
        explicit = {n for n, t in zip(self.sharding.mesh.axis_names, types) if t is AxisType.Explicit}
        dims = _dims_of(self.sharding.spec, len(self.shape))
        return f"{np.dtype(self.dtype).name}[" + ",".join(
            _dim_text(n, tuple(a for a in axes if a in explicit)) for n, axes in zip(self.shape, dims)) + "]"

    def __str__(self):
        return self.str_short()

    def __repr__(self):
        return f"ShapedArray({self.str_short()})"


def typeof(x) -> ShapedArray:
    """The type of ``x`` with its sharding, like ``jax.typeof``: ``float32[16@data,32@model]``."""
    if isinstance(x, ShardedArray):
        return ShapedArray(x.shape, x.dtype, x.sharding)
    a = np.asarray(x)
    mesh = get_mesh()
    if mesh is None:
        mesh = Mesh(np.empty((0,), dtype=object), ("_",))
    return ShapedArray(a.shape, _jax_dtype(a.dtype), NamedSharding(mesh, P()))


def _jax_dtype(dtype) -> np.dtype:
    """The dtype JAX gives a NumPy array without jax_enable_x64 (float64 -> float32, ...)."""
    dtype = np.dtype(dtype)
    return {np.dtype("float64"): np.dtype("float32"), np.dtype("int64"): np.dtype("int32"),
            np.dtype("uint64"): np.dtype("uint32"), np.dtype("complex128"): np.dtype("complex64")
            }.get(dtype, dtype)


# -- the sharded array ---------------------------------------------------------------------------

@dataclass
class Shard:
    """One device's block, as in ``jax.Array.addressable_shards``."""
    device: object
    index: tuple
    data: np.ndarray
    replica_id: int = 0


class ShardedArray:
    """An array placed on a simulated mesh: every device's block, with its sharding type.

    ``blocks`` has shape ``(*mesh shape, *block shape)``: ``blocks[i, j]`` is what the
    device at mesh position ``(i, j)`` holds. ``np.asarray(x)`` assembles the global array
    (as ``np.asarray`` of a ``jax.Array`` does); ``x.addressable_shards`` lists the blocks.
    """

    __array_priority__ = 1000

    def __init__(self, blocks: np.ndarray, shape: tuple, mesh: Mesh, dims: tuple):
        self.blocks = blocks
        self.shape = tuple(int(n) for n in shape)
        self.mesh = mesh
        self.dims = tuple(tuple(a) for a in dims)

    # -- what JAX arrays have
    @property
    def dtype(self):
        return self.blocks.dtype

    @property
    def ndim(self):
        return len(self.shape)

    @property
    def size(self):
        return math.prod(self.shape)

    @property
    def sharding(self) -> NamedSharding:
        return NamedSharding(self.mesh, _spec_of(self.dims))

    @property
    def aval(self) -> ShapedArray:
        return typeof(self)

    def block(self, device_id: int) -> np.ndarray:
        """The block that simulated device ``device_id`` holds."""
        where = np.argwhere(self.mesh.device_ids == device_id)
        if not len(where):
            raise ValueError(f"device {device_id} is not in the mesh {self.mesh}")
        return self.blocks[tuple(where[0])]

    @property
    def addressable_shards(self) -> list:
        out = []
        for pos in np.ndindex(*self.mesh.devices.shape):
            coords = dict(zip(self.mesh.axis_names, pos))
            index = []
            for n, axes in zip(self.shape, self.dims):
                k, i = 1, 0
                for a in axes:
                    i, k = i * self.mesh.shape[a] + coords[a], k * self.mesh.shape[a]
                size = n // k
                index.append(slice(i * size, (i + 1) * size))
            out.append(Shard(self.mesh.devices[pos], tuple(index), self.blocks[pos]))
        return out

    def __array__(self, dtype=None, copy=None):
        out = np.empty(self.shape, dtype=self.dtype)
        for s in self.addressable_shards:
            out[s.index] = s.data
        return out if dtype is None else out.astype(dtype)

    def __repr__(self):
        return f"ShardedArray({np.asarray(self)!r}, type={typeof(self)})"

    def __len__(self):
        return self.shape[0]

    def __bool__(self):
        raise ShardingTypeError("the truth value of a sharded array is not known while jit "
                                "traces (real JAX raises a TracerBoolConversionError); use "
                                "simpmd.numpy.where for a choice per element.")

    # -- operators: each goes through the rule table
    def __add__(self, o): return elementwise(np.add, self, o)
    def __radd__(self, o): return elementwise(np.add, o, self)
    def __sub__(self, o): return elementwise(np.subtract, self, o)
    def __rsub__(self, o): return elementwise(np.subtract, o, self)
    def __mul__(self, o): return elementwise(np.multiply, self, o)
    def __rmul__(self, o): return elementwise(np.multiply, o, self)
    def __truediv__(self, o): return elementwise(np.true_divide, self, o)
    def __rtruediv__(self, o): return elementwise(np.true_divide, o, self)
    def __pow__(self, o): return elementwise(np.power, self, o)
    def __neg__(self): return elementwise(np.negative, self)
    def __gt__(self, o): return elementwise(np.greater, self, o)
    def __ge__(self, o): return elementwise(np.greater_equal, self, o)
    def __lt__(self, o): return elementwise(np.less, self, o)
    def __le__(self, o): return elementwise(np.less_equal, self, o)
    def __matmul__(self, o): return matmul(self, o)
    def __rmatmul__(self, o): return matmul(o, self)
    def __getitem__(self, index): return getitem(self, index)

    @property
    def T(self): return transpose(self)
    def transpose(self, *axes): return transpose(self, axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else (axes or None))
    def reshape(self, *shape, out_sharding=None):
        return reshape(self, shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape,
                       out_sharding=out_sharding)
    def sum(self, axis=None, keepdims=False): return reduce(np.sum, self, axis, keepdims)
    def mean(self, axis=None, keepdims=False): return reduce(np.mean, self, axis, keepdims)
    def max(self, axis=None, keepdims=False): return reduce(np.max, self, axis, keepdims)
    def min(self, axis=None, keepdims=False): return reduce(np.min, self, axis, keepdims)
    def astype(self, dtype): return ShardedArray(self.blocks.astype(dtype), self.shape, self.mesh, self.dims)


def _block_shape(shape, dims, mesh) -> tuple:
    return tuple(n // math.prod(mesh.shape[a] for a in axes) for n, axes in zip(shape, dims))


def _place(value, mesh: Mesh, dims) -> np.ndarray:
    """The stacked blocks of a global array under ``dims`` (each device cuts its own: no traffic)."""
    value = np.asarray(value)
    blocks = np.broadcast_to(value, mesh.devices.shape + value.shape)
    for d, axes in enumerate(dims):
        if axes:
            blocks = _slice_in(blocks, mesh, axes, d)
    return np.ascontiguousarray(blocks)


def device_put(x, sharding=None) -> ShardedArray:
    """Place ``x`` on the mesh, like ``jax.device_put(x, sharding)``.

    ``sharding`` is a ``NamedSharding`` or a ``P(...)`` over the mesh of ``set_mesh``; None
    replicates ``x`` over the current mesh. Float64 becomes float32, as JAX does without
    ``jax_enable_x64``.
    """
    if isinstance(sharding, NamedSharding):
        mesh, spec = sharding.mesh, sharding.spec
    else:
        mesh, spec = get_mesh(), sharding
        if mesh is None:
            raise ShardingTypeError(
                "device_put(x, P(...)) needs a mesh to refer to: call simpmd.set_mesh(mesh) "
                "first (or use it as `with simpmd.set_mesh(mesh):`), or pass "
                "simpmd.NamedSharding(mesh, P(...)).")
    if isinstance(x, ShardedArray):
        if x.mesh == mesh:
            return reshard(x, spec)
        x = np.asarray(x)
    value = np.asarray(x)
    value = value.astype(_jax_dtype(value.dtype))
    dims = _dims_of(spec, value.ndim)
    _check_dims(dims, mesh, value.shape, "device_put")
    return ShardedArray(_place(value, mesh, dims), value.shape, mesh, dims)


# -- the log: collectives inserted by jit ---------------------------------------------------------

class _Log:
    """The events of one ``jit`` call (or of operations run outside jit), in order."""

    def __init__(self):
        self.events: list = []
        self.calls = 0
        self.steps = 0
        self.seq: dict = {}

    def add(self, event: Event):
        event.seq = self.seq.get(event.program, 0)
        self.seq[event.program] = event.seq + 1
        self.events.append(event)


_LOG: contextvars.ContextVar = contextvars.ContextVar("simpmd_explicit_log", default=None)
_EAGER = _Log()
_CAUSE: contextvars.ContextVar = contextvars.ContextVar("simpmd_explicit_cause", default=None)


def eager_trace(reset: bool = True) -> Trace:
    """The collectives of operations run outside ``simpmd.jit`` (JAX compiles each alone)."""
    global _EAGER
    trace = Trace(list(_EAGER.events))
    if reset:
        _EAGER = _Log()
    return trace


def _log() -> _Log:
    return _LOG.get() or _EAGER


_HERE = os.path.dirname(os.path.abspath(__file__))


def _user_line() -> tuple:
    """'file.py:12' and the text of the first frame outside simpmd: the line that caused it."""
    frame = inspect.currentframe()
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(_HERE):
            info = inspect.getframeinfo(frame, context=1)
            code = info.code_context[0].strip() if info.code_context else ""
            name = os.path.basename(path)
            if "ipykernel" in path or "<ipython" in path:
                name = "<cell>"      # notebook cells get temporary, machine-dependent names
            return f"{name}:{frame.f_lineno}", code
        frame = frame.f_back
    return "", ""


@contextlib.contextmanager
def _cause(op: str):
    """Name the operation whose rule is running: the collectives it inserts carry the name."""
    token = _CAUSE.set(_CAUSE.get() or op)
    try:
        yield
    finally:
        _CAUSE.reset(token)


def _coords(mesh: Mesh, pos) -> tuple:
    return tuple((n, int(i), int(s)) for n, i, s in zip(mesh.axis_names, pos, mesh.devices.shape))


def _groups(mesh: Mesh, axes: tuple) -> list:
    """The groups of mesh positions that differ only along ``axes``, members in row-major order."""
    ids = np.arange(mesh.size).reshape(mesh.devices.shape)
    grouped, _ = _to_groups(ids, mesh, axes)
    flat = grouped.reshape(grouped.shape[0], -1)
    shape = mesh.devices.shape
    return [[np.unravel_index(int(k), shape) for k in flat[:, c]] for c in range(flat.shape[1])]


def _record(op: str, mesh: Mesh, axes: tuple, before: np.ndarray, after: np.ndarray, **params):
    """Log one inserted collective: an Event per device, a step per group."""
    log = _log()
    source, code = _user_line()
    call = log.calls
    log.calls += 1
    params = dict(params, inserted=f"jit: {_CAUSE.get() or op}")
    for group in _groups(mesh, axes):
        step = log.steps
        log.steps += 1
        ids = tuple(int(mesh.devices[pos].id) for pos in group)
        for member, pos in enumerate(group):
            nbytes = int(before[pos].nbytes)
            wire = {k: v for k, v in params.items() if k == "perm"}
            sent, received = WIRE_BYTES[op](nbytes, len(group), member, **wire)
            device = int(mesh.devices[pos].id)
            log.add(Event(
                kind="collective", program=f"device {device}", coords=_coords(mesh, pos),
                step=step, call=call, device=device, devices=(device,), op=op, axes=tuple(axes),
                group=ids, group_programs=tuple(f"device {i}" for i in ids), member=member,
                params=dict(params), inputs=(np.array(before[pos]),), outputs=(np.array(after[pos]),),
                bytes_sent=int(sent), bytes_received=int(received), source=source, code=code,
                detail=f"inserted by jit for {_CAUSE.get() or op}"))


# -- moving blocks: the collectives themselves, on stacked blocks ---------------------------------

def _to_groups(blocks: np.ndarray, mesh: Mesh, axes: tuple):
    """Blocks with the mesh dims of ``axes`` first, flattened into one group dim (row-major)."""
    m = len(mesh.axis_names)
    idx = [mesh.axis_names.index(a) for a in axes]
    rest = [i for i in range(m) if i not in idx]
    order = idx + rest + list(range(m, blocks.ndim))
    moved = np.transpose(blocks, order)
    g = math.prod(mesh.devices.shape[i] for i in idx)
    return moved.reshape((g,) + moved.shape[len(idx):]), order


def _from_groups(grouped: np.ndarray, mesh: Mesh, axes: tuple, order) -> np.ndarray:
    sizes = tuple(mesh.shape[a] for a in axes)
    moved = grouped.reshape(sizes + grouped.shape[1:])
    return np.transpose(moved, np.argsort(order))


def _gather_in(blocks, mesh, axes, dim) -> np.ndarray:
    """Every member of each group gets the concatenation of the group's blocks along ``dim``."""
    m = len(mesh.axis_names)
    g, order = _to_groups(blocks, mesh, axes)
    whole = np.concatenate(list(g), axis=(m - len(axes)) + dim)
    return _from_groups(np.broadcast_to(whole, (g.shape[0],) + whole.shape), mesh, axes, order)


def _slice_in(blocks, mesh, axes, dim) -> np.ndarray:
    """Member k of each group keeps the k-th of ``len(group)`` equal pieces of ``dim`` (no traffic)."""
    m = len(mesh.axis_names)
    g, order = _to_groups(blocks, mesh, axes)
    pieces = np.split(g, g.shape[0], axis=1 + (m - len(axes)) + dim)
    kept = np.stack([pieces[k][k] for k in range(g.shape[0])])
    return _from_groups(kept, mesh, axes, order)


def _reduce_in(blocks, mesh, axes, ufunc) -> np.ndarray:
    g, order = _to_groups(blocks, mesh, axes)
    total = ufunc.reduce(g, axis=0)
    return _from_groups(np.broadcast_to(total, g.shape), mesh, axes, order)


# -- reshard: from one layout to another, with the fewest simple collectives -----------------------

def _move(x: ShardedArray, target: tuple) -> ShardedArray:
    """``x`` with the layout ``target`` (one axes tuple per dim), logging each collective.

    Per dimension, the axes past the longest common prefix with the target leave it: an
    axis that the target puts next on another dimension moves there in one all-to-all,
    the others are all-gathered. Then each dimension is cut further where the target
    splits it more: each device keeps its piece, which needs no communication.
    """
    mesh, blocks, cur = x.mesh, x.blocks, [tuple(a) for a in x.dims]
    target = [tuple(a) for a in target]
    for d in range(x.ndim):
        k = 0
        while k < min(len(cur[d]), len(target[d])) and cur[d][k] == target[d][k]:
            k += 1
        while len(cur[d]) > k:
            a = cur[d][-1]
            dest = next((e for e in range(x.ndim) if e != d and len(cur[e]) < len(target[e])
                         and target[e][:len(cur[e]) + 1] == cur[e] + (a,)), None)
            if dest is not None and len(cur[d]) - k == 1:
                after = _slice_in(_gather_in(blocks, mesh, (a,), d), mesh, (a,), dest)
                _record("all_to_all", mesh, (a,), blocks, after,
                        split_axis=dest, concat_axis=d, tiled=True)
                cur[d], cur[dest] = cur[d][:-1], cur[dest] + (a,)
            else:
                leaving = cur[d][k:]
                after = _gather_in(blocks, mesh, leaving, d)
                _record("all_gather", mesh, leaving, blocks, after, axis=d, tiled=True)
                cur[d] = cur[d][:k]
            blocks = after
    for d in range(x.ndim):
        for a in target[d][len(cur[d]):]:
            blocks = _slice_in(blocks, mesh, (a,), d)
            cur[d] = cur[d] + (a,)
    return ShardedArray(np.ascontiguousarray(blocks), x.shape, mesh, tuple(cur))


def reshard(x, spec) -> ShardedArray:
    """``x`` with another sharding, like ``jax.sharding.reshard(x, P(...))``.

    An axis leaving a dimension is an all-gather; an axis moving from one dimension to
    another is an all-to-all; a finer split is a slice each device takes of what it holds.
    """
    if _is_jax(x):
        import jax
        return jax.sharding.reshard(x, to_jax_spec(spec))
    if not isinstance(x, ShardedArray):
        return device_put(x, spec)
    mesh = spec.mesh if isinstance(spec, NamedSharding) else x.mesh
    if mesh != x.mesh:
        raise ShardingTypeError(f"reshard keeps the mesh: {x.mesh} vs {mesh}; use device_put "
                                f"to move to another mesh.")
    dims = _dims_of(spec, x.ndim)
    _check_dims(dims, mesh, x.shape, "reshard")
    with _cause("reshard"):
        return _move(x, dims)


def _is_jax(x) -> bool:
    import sys
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, (jax.Array, jax.core.Tracer))


def to_jax_spec(spec):
    """simpmd's ``P(...)`` as ``jax.sharding.PartitionSpec`` (other values pass through)."""
    if isinstance(spec, PartitionSpec):
        from jax.sharding import PartitionSpec as JaxP
        return JaxP(*spec)
    return spec


# -- the operands of an operation ---------------------------------------------------------------

def _mesh_of(args) -> Mesh:
    meshes = [a.mesh for a in args if isinstance(a, ShardedArray)]
    for m in meshes[1:]:
        if m != meshes[0]:
            raise ShardingTypeError(f"the operands live on different meshes ({meshes[0]} and {m}); "
                                    f"device_put them onto one mesh first.")
    mesh = meshes[0] if meshes else get_mesh()
    types = axis_types_of(mesh)
    if any(t is not AxisType.Explicit for t in types):
        raise ShardingTypeError(
            f"the mesh {mesh} has axis types {types}: simpmd simulates Explicit axes only. On "
            f"Auto axes, XLA's partitioner (GSPMD/Shardy) chooses the collectives by heuristics "
            f"that simpmd does not reproduce; build the mesh with "
            f"axis_types=(simpmd.AxisType.Explicit, ...) (simpmd.make_mesh's default), or read "
            f"JAX's choice from jax.jit(f).lower(...).compile().as_text().")
    return mesh


def _as_sharded(x, mesh: Mesh, ndim: int | None = None) -> ShardedArray:
    """A constant (NumPy array, Python number) as an array every device holds whole."""
    if isinstance(x, ShardedArray):
        return x
    value = np.asarray(x)
    if not isinstance(x, np.ndarray) and value.dtype.kind in "fi":
        value = value.astype(np.float32 if value.dtype.kind == "f" else np.int32)
    elif isinstance(x, np.ndarray):
        value = value.astype(_jax_dtype(value.dtype))
    dims = ((),) * value.ndim
    return ShardedArray(_place(value, mesh, dims), value.shape, mesh, dims)


def _python_scalar(x) -> bool:
    return isinstance(x, (int, float, bool)) and not isinstance(x, np.generic)


# -- rule: elementwise and broadcasting ---------------------------------------------------------

def _broadcast_dims(name, operands) -> tuple:
    """JAX's broadcasting rule: per dimension, the one sharding the operands agree on."""
    shape = np.broadcast_shapes(*[o.shape for o in operands])
    nd = len(shape)
    aligned = [(((1,) * (nd - o.ndim) + o.shape), (((),) * (nd - o.ndim)) + o.dims) for o in operands]
    out = []
    for d in range(nd):
        specs = {dims[d] for sh, dims in aligned if not (sh[d] == 1 and not dims[d])}
        specs.discard(())
        if len(specs) > 1:
            text = ", ".join(str(_spec_of(dims)) for _, dims in aligned)
            raise ShardingTypeError(
                f"{name}: the operands are split differently along dimension {d} ({text}), and "
                f"JAX will not choose one for you (its words: 'incompatible shardings for "
                f"broadcasting'). reshard one operand to the other's spec first, e.g. "
                f"simpmd.reshard(y, x.sharding.spec).")
        out.append(specs.pop() if specs else ())
    return shape, tuple(out)


def elementwise(fn, *args, name: str | None = None):
    """``fn`` (a NumPy ufunc or function of arrays) applied block by block.

    Rule: the result takes, per dimension, the sharding its operands agree on (an operand
    kept whole there is cut locally). Two different shardings of one dimension raise.
    """
    name = name or getattr(fn, "__name__", "elementwise")
    mesh = _mesh_of(args)
    ops = [_as_sharded(a, mesh) if not _python_scalar(a) else a for a in args]
    arrays = [o for o in ops if isinstance(o, ShardedArray)]
    shape, dims = _broadcast_dims(name, arrays)
    _check_dims(dims, mesh, shape, name)
    m = len(mesh.axis_names)
    local = []
    with _cause(name):
        for o in ops:
            if not isinstance(o, ShardedArray):
                local.append(o)
                continue
            lead = len(shape) - o.ndim
            want = tuple(dims[lead + d] if o.shape[d] != 1 else () for d in range(o.ndim))
            moved = _move(o, want) if want != o.dims else o
            b = moved.blocks
            local.append(b.reshape(b.shape[:m] + (1,) * lead + b.shape[m:]))
    out = np.asarray(fn(*local))
    out = np.broadcast_to(out, mesh.devices.shape + _block_shape(shape, dims, mesh))
    return ShardedArray(np.ascontiguousarray(out), shape, mesh, dims)


def where(condition, x, y):
    """``where(condition, x, y)`` with the elementwise rule over all three operands."""
    return elementwise(np.where, condition, x, y, name="where")


# -- rule: dot_general (matmul, dot, einsum) ------------------------------------------------------

def _merge_pair(name, what, l, r):
    if l and r and l != r:
        raise ShardingTypeError(
            f"{name}: the {what} dimensions are split differently ({_spec_of((l,))} on the left, "
            f"{_spec_of((r,))} on the right). JAX requires them to agree; reshard one operand.")
    return l or r


def dot_general(lhs, rhs, contract, batch=((), ()), out_sharding=None, name="dot_general"):
    """The contraction ``lhs . rhs`` over ``contract`` dims, with ``batch`` dims paired.

    Rule (JAX's ``_dot_general_sharding_rule``): batch dims must be split alike; contracting
    dims must be split alike; if both sides of a contracting dim are split, JAX cannot know
    whether to sum onto every device or to leave the sum split, and asks for
    ``out_sharding``. Otherwise the result is batch dims (the left's sharding), then the
    left's free dims, then the right's, each keeping its sharding.

    Simulation: a dim split on one side only is cut locally on the other; each device
    multiplies its blocks; partial sums over a split contracting dim are then all-reduced
    (a psum), or reduce-scattered where ``out_sharding`` splits a result dim over that axis.
    """
    mesh = _mesh_of((lhs, rhs))
    lhs, rhs = _as_sharded(lhs, mesh), _as_sharded(rhs, mesh)
    (lc, rc), (lb, rb) = contract, batch
    lc, rc, lb, rb = [tuple(d % n for d in ds) for ds, n in
                      ((lc, lhs.ndim), (rc, rhs.ndim), (lb, lhs.ndim), (rb, rhs.ndim))]
    for i, j in zip(lc + lb, rc + rb):
        if lhs.shape[i] != rhs.shape[j]:
            raise ValueError(f"{name}: sizes do not match: {lhs.shape} and {rhs.shape}")
    batch_dims = [_merge_pair(name, "batch", lhs.dims[i], rhs.dims[j]) for i, j in zip(lb, rb)]
    contract_dims = [_merge_pair(name, "contracting", lhs.dims[i], rhs.dims[j]) for i, j in zip(lc, rc)]
    lfree = [i for i in range(lhs.ndim) if i not in lc + lb]
    rfree = [j for j in range(rhs.ndim) if j not in rc + rb]
    shape = tuple([lhs.shape[i] for i in lb] + [lhs.shape[i] for i in lfree] + [rhs.shape[j] for j in rfree])
    both = [(lhs.dims[i], rhs.dims[j]) for i, j in zip(lc, rc) if lhs.dims[i] and rhs.dims[j]]
    if out_sharding is None:
        if both:
            l_spec = _spec_of(tuple(lhs.dims[i] for i in lc))
            r_spec = _spec_of(tuple(rhs.dims[j] for j in rc))
            raise ShardingTypeError(
                f"{name}: the summed-over (contracting) dimension is split over "
                f"{both[0][0]} on both operands (left {l_spec}, right {r_spec}), so each device "
                f"ends with a partial sum, and JAX will not guess what you want (its words: "
                f"'Contracting dimensions are sharded and it is ambiguous how the output should "
                f"be sharded'). Say it with out_sharding=: P(...) without {both[0][0][0]!r} sums "
                f"onto every device (an all-reduce); P(...) that splits a result dimension over "
                f"{both[0][0][0]!r} leaves each device its slice of the sum (a reduce-scatter).")
        target = tuple([lhs.dims[i] for i in lb] + [lhs.dims[i] for i in lfree] + [rhs.dims[j] for j in rfree])
    else:
        target = _dims_of(out_sharding, len(shape))
    _check_dims(target, mesh, shape, name)
    # the layout each device computes in: free dims as they are, shared dims merged
    used = [a for t in batch_dims + contract_dims for a in t]
    free_l = [tuple(a for a in lhs.dims[i] if a not in used) for i in lfree]
    free_r = [tuple(a for a in rhs.dims[j] if a not in used + [x for t in free_l for x in t]) for j in rfree]
    l_want = [()] * lhs.ndim
    r_want = [()] * rhs.ndim
    for k, (i, j) in enumerate(zip(lb, rb)):
        l_want[i] = r_want[j] = batch_dims[k]
    for k, (i, j) in enumerate(zip(lc, rc)):
        l_want[i] = r_want[j] = contract_dims[k]
    for k, i in enumerate(lfree):
        l_want[i] = free_l[k]
    for k, j in enumerate(rfree):
        r_want[j] = free_r[k]
    with _cause(name):
        lm = _move(lhs, tuple(l_want)) if tuple(l_want) != lhs.dims else lhs
        rm = _move(rhs, tuple(r_want)) if tuple(r_want) != rhs.dims else rhs
        m = len(mesh.axis_names)
        letters = iter("abcdefghijklmnopqrstuvwxyz")
        mesh_l = [next(letters) for _ in range(m)]
        ll = [next(letters) for _ in range(lhs.ndim)]
        rl = [next(letters) for _ in range(rhs.ndim)]
        for i, j in zip(lc + lb, rc + rb):
            rl[j] = ll[i]
        out_l = [ll[i] for i in lb] + [ll[i] for i in lfree] + [rl[j] for j in rfree]
        spec_text = f"{''.join(mesh_l + ll)},{''.join(mesh_l + rl)}->{''.join(mesh_l + out_l)}"
        partial = np.einsum(spec_text, lm.blocks, rm.blocks)
        dims = list(batch_dims + free_l + free_r)
        blocks = partial
        for axes in contract_dims:
            if not axes:
                continue
            o = next((o for o in range(len(shape)) if target[o][:len(dims[o]) + len(axes)] == dims[o] + axes
                      and len(target[o]) >= len(dims[o]) + len(axes)), None)
            summed = _reduce_in(blocks, mesh, axes, np.add)
            if o is not None:
                after = _slice_in(summed, mesh, axes, o) if len(axes) == 1 else summed
                if len(axes) == 1:
                    _record("psum_scatter", mesh, axes, blocks, after, scatter_dimension=o, tiled=True)
                    dims[o] = dims[o] + axes
                    blocks = after
                    continue
            _record("psum", mesh, axes, blocks, summed)
            blocks = summed
        out = ShardedArray(np.ascontiguousarray(blocks), shape, mesh, tuple(dims))
        if out.dims != tuple(target):
            out = _move(out, target)
    return out


def _plain(x):
    return x if isinstance(x, ShardedArray) else np.asarray(x)


def matmul(a, b, *, out_sharding=None, preferred_element_type=None):
    """``a @ b`` as ``jnp.matmul``: the last dim of ``a`` with the second-to-last of ``b``
    (leading dims are batch dims; 1-D operands are treated as vectors)."""
    a, b = _plain(a), _plain(b)
    if a.ndim == 1 and b.ndim == 1:
        return dot_general(a, b, ((0,), (0,)), out_sharding=out_sharding, name="matmul")
    if b.ndim == 1:
        return dot_general(a, b, ((a.ndim - 1,), (0,)), out_sharding=out_sharding, name="matmul")
    if a.ndim == 1:
        return dot_general(a, b, ((0,), (b.ndim - 2,)), out_sharding=out_sharding, name="matmul")
    if a.ndim != b.ndim:
        raise ShardingTypeError("simpmd's matmul on sharded arrays takes operands of equal rank "
                                "(or 1-D); reshape one first, or use einsum.")
    nb = a.ndim - 2
    return dot_general(a, b, ((a.ndim - 1,), (b.ndim - 2,)),
                       (tuple(range(nb)), tuple(range(nb))), out_sharding=out_sharding, name="matmul")


def dot(a, b, *, out_sharding=None, preferred_element_type=None):
    """``jnp.dot``: for 2-D (or 1-D) operands the same as matmul."""
    a, b = _plain(a), _plain(b)
    if a.ndim > 2 or b.ndim > 2:
        raise ShardingTypeError("simpmd's dot on sharded arrays takes 1-D or 2-D operands; use "
                                "matmul or einsum for more dimensions.")
    out = matmul(a, b, out_sharding=out_sharding)
    return out


def einsum(subscripts: str, a, b, *, out_sharding=None, preferred_element_type=None):
    """``jnp.einsum`` of two operands, as one dot_general (no repeated letters in one operand).

    Letters in both operands and in the output are batch dims, in both but not in the
    output contracting dims. The result's dims follow the dot_general order (batch, left
    free, right free); a different output order is a transpose, as in jnp.einsum.
    """
    a, b = _plain(a), _plain(b)
    ins, out = subscripts.replace(" ", "").split("->")
    la, lb = ins.split(",")
    if len(set(la)) != len(la) or len(set(lb)) != len(lb):
        raise ShardingTypeError("simpmd's einsum does not take a letter twice in one operand.")
    batch = [c for c in la if c in lb and c in out]
    contract = [c for c in la if c in lb and c not in out]
    for c in la + lb:
        if c not in out and c not in contract:
            raise ShardingTypeError(f"simpmd's einsum: {c!r} is summed within one operand; "
                                    f"sum it first (x.sum(axis)).")
    natural = batch + [c for c in la if c not in lb] + [c for c in lb if c not in la]
    out_natural = None
    if out_sharding is not None:
        dims = _dims_of(out_sharding, len(out))
        out_natural = _spec_of(tuple(dims[out.index(c)] for c in natural))
    y = dot_general(a, b, (tuple(la.index(c) for c in contract), tuple(lb.index(c) for c in contract)),
                    (tuple(la.index(c) for c in batch), tuple(lb.index(c) for c in batch)),
                    out_sharding=out_natural, name="einsum")
    if natural != list(out):
        y = transpose(y, tuple(natural.index(c) for c in out))
    return y


# -- rule: reductions ---------------------------------------------------------------------------

_COMBINE = {"sum": (np.add, "psum"), "mean": (np.add, "psum"), "max": (np.maximum, "pmax"),
            "min": (np.minimum, "pmin")}


def reduce(fn, x, axis=None, keepdims=False):
    """``sum``, ``mean``, ``max`` or ``min`` over ``axis``.

    Rule: the reduced dims disappear from the spec, the others keep theirs. Each device
    reduces its block; a reduced dim that was split leaves a partial result per device,
    combined by one all-reduce over that dim's axes (mean divides the sum by the count).
    """
    name = fn.__name__.replace("amax", "max").replace("amin", "min")
    mesh = _mesh_of((x,))
    x = _as_sharded(x, mesh)
    axes = tuple(range(x.ndim)) if axis is None else tuple(
        a % x.ndim for a in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    m = len(mesh.axis_names)
    ufunc, collective = _COMBINE[name]
    local_fn = np.sum if name in ("sum", "mean") else fn
    with _cause(name):
        blocks = local_fn(x.blocks, axis=tuple(m + a for a in axes))
        if name == "sum" and blocks.dtype != x.dtype and x.dtype.kind == "f":
            blocks = blocks.astype(x.dtype)
        for a in axes:
            if x.dims[a]:
                combined = _reduce_in(blocks, mesh, x.dims[a], ufunc)
                _record(collective, mesh, x.dims[a], blocks, combined)
                blocks = combined
        if name == "mean":
            blocks = (blocks / math.prod(x.shape[a] for a in axes)).astype(
                x.dtype if x.dtype.kind == "f" else np.float32)
    dims = tuple(d for i, d in enumerate(x.dims) if i not in axes)
    shape = tuple(n for i, n in enumerate(x.shape) if i not in axes)
    out = ShardedArray(np.ascontiguousarray(blocks), shape, mesh, dims)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else n for i, n in enumerate(x.shape)))
    return out


# -- rule: transpose, reshape -----------------------------------------------------------------------

def transpose(x, axes=None):
    """Rule: the spec is permuted with the dims; each device transposes its block (no traffic)."""
    x = _as_sharded(x, _mesh_of((x,)))
    perm = tuple(range(x.ndim))[::-1] if axes is None else tuple(a % x.ndim for a in axes)
    m = len(x.mesh.axis_names)
    blocks = np.transpose(x.blocks, tuple(range(m)) + tuple(m + p for p in perm))
    return ShardedArray(blocks, tuple(x.shape[p] for p in perm), x.mesh, tuple(x.dims[p] for p in perm))


def _groups_of_reshape(old, new):
    """Pair runs of old dims with runs of new dims of equal product, or None."""
    groups, i, j = [], 0, 0
    while i < len(old) and j < len(new):
        oi, nj, po, pn = [i], [j], old[i], new[j]
        while po != pn:
            if po < pn:
                i += 1
                if i >= len(old):
                    return None
                oi.append(i)
                po *= old[i]
            else:
                j += 1
                if j >= len(new):
                    return None
                nj.append(j)
                pn *= new[j]
        groups.append((oi, nj))
        i, j = i + 1, j + 1
    return groups if i == len(old) and j == len(new) else None


def _reshape_error(x, shape):
    return ShardingTypeError(
        f"reshape of {typeof(x)} to {tuple(shape)}: JAX's rule cannot say how the result is "
        f"split (it only follows a split dimension when one dimension is cut into several, or "
        f"several merged into one with the split on the first). Write "
        f"x.reshape(..., out_sharding=P(...)) to say it, or reshard x to replicated first.")


def reshape(x, shape, *, out_sharding=None):
    """Rule (JAX's ``_reshape_sharding_rule``): an unsplit array stays unsplit; inserting or
    dropping size-1 dims keeps the others' specs; cutting one dim into several gives its
    axes to the leading new dims (each must divide); merging dims keeps the leading dims'
    axes. Anything else raises, asking for ``out_sharding``. Each device reshapes its block."""
    mesh = _mesh_of((x,))
    x = _as_sharded(x, mesh)
    shape = list(shape)
    if -1 in shape:
        k = shape.index(-1)
        shape[k] = x.size // max(1, math.prod(n for n in shape if n != -1))
    shape = tuple(int(n) for n in shape)
    if math.prod(shape) != x.size:
        raise ValueError(f"cannot reshape {x.shape} to {shape}")
    m = len(mesh.axis_names)
    if out_sharding is not None:
        dims = _dims_of(out_sharding, len(shape))
        _check_dims(dims, mesh, shape, "reshape")
        with _cause("reshape"):
            whole = _move(x, ((),) * x.ndim)
        blocks = whole.blocks.reshape(mesh.devices.shape + shape)
        out = ShardedArray(blocks, shape, mesh, ((),) * len(shape))
        return _move(out, dims)
    if not any(x.dims):
        dims = ((),) * len(shape)
    elif [n for n in x.shape if n != 1] == [n for n in shape if n != 1]:
        it = iter([d for n, d in zip(x.shape, x.dims) if n != 1])
        dims = tuple(() if n == 1 else next(it) for n in shape)
    else:
        groups = _groups_of_reshape(x.shape, shape)
        if groups is None:
            raise _reshape_error(x, shape)
        kinds = {("split" if len(o) == 1 and len(n) > 1 else "merge" if len(n) == 1 and len(o) > 1
                  else "same" if len(o) == len(n) == 1 else "mixed") for o, n in groups}
        if "mixed" in kinds or {"split", "merge"} <= kinds:
            raise _reshape_error(x, shape)
        dims = [()] * len(shape)
        for o, n in groups:
            axes = tuple(a for i in o for a in x.dims[i])
            if len(o) > 1:
                spec = [x.dims[i] for i in o]
                while spec and not spec[-1]:
                    spec.pop()
                if any(not s for s in spec):
                    raise _reshape_error(x, shape)
            pool = list(axes)
            for j in n:
                left, got = shape[j], []
                while left > 1 and pool:
                    a = pool.pop(0)
                    left, rem = divmod(left, mesh.shape[a])
                    if rem:
                        raise _reshape_error(x, shape)
                    got.append(a)
                dims[j] = tuple(got)
            if pool:
                raise _reshape_error(x, shape)
        dims = tuple(dims)
    _check_dims(dims, mesh, shape, "reshape")
    blocks = x.blocks.reshape(mesh.devices.shape + _block_shape(shape, dims, mesh))
    return ShardedArray(blocks, shape, mesh, dims)


# -- rule: slicing, indexing, concatenate ------------------------------------------------------------

def _slice_dim(x: ShardedArray, d: int, start: int, stop: int) -> ShardedArray:
    """Rows ``start:stop`` of dim ``d``, keeping its split (each new block from the one
    device that holds it, by collective permutes); JAX requires the new size to divide."""
    mesh, axes = x.mesh, x.dims[d]
    m = len(mesh.axis_names)
    if not axes:
        blocks = np.take(x.blocks, np.arange(start, stop), axis=m + d)
        return ShardedArray(blocks, x.shape[:d] + (stop - start,) + x.shape[d + 1:], mesh, x.dims)
    g = math.prod(mesh.shape[a] for a in axes)
    size = stop - start
    if size % g:
        raise ShardingTypeError(
            f"slicing dimension {d} of {typeof(x)} to {size} element(s): that dimension is split "
            f"over {g} devices ({axes}), and JAX keeps the split, so the new size must divide "
            f"evenly (its words: 'not divisible by mesh axes ... is not implemented'). Reshard "
            f"to P(None) on that dimension first, or take a slice whose size {g} divides.")
    ib, ob = x.shape[d] // g, size // g
    source = [(start + i * ob) // ib for i in range(g)]
    if any((start + (i + 1) * ob - 1) // ib != source[i] for i in range(g)):
        with _cause("slice"):
            whole = _move(x, x.dims[:d] + ((),) + x.dims[d + 1:])
        cut = _slice_dim(whole, d, start, stop)
        return _move(cut, x.dims)
    grouped, order = _to_groups(x.blocks, mesh, axes)
    bd = 1 + (m - len(axes)) + d
    out = np.stack([np.take(grouped[source[i]], np.arange(start + i * ob - source[i] * ib,
                                                         start + i * ob - source[i] * ib + ob),
                            axis=bd - 1) for i in range(g)])
    after = _from_groups(out, mesh, axes, order)
    # the moves: each source sends to its destinations, one one-to-one permute per round
    outgoing: dict = {}
    for i, j in enumerate(source):
        if i != j:
            outgoing.setdefault(j, []).append(i)
    rounds = max((len(v) for v in outgoing.values()), default=0)
    with _cause("slice"):
        for r in range(rounds):
            pairs = tuple((j, dests[r]) for j, dests in sorted(outgoing.items()) if len(dests) > r)
            sent = np.zeros_like(out)
            for j, i in pairs:
                sent[j] = out[i]
            _record("ppermute", mesh, axes, _from_groups(sent, mesh, axes, order), after, perm=pairs)
    return ShardedArray(np.ascontiguousarray(after), x.shape[:d] + (size,) + x.shape[d + 1:], mesh, x.dims)


def getitem(x, index):
    """``x[...]`` with integers and slices (step 1 on split dims). Rule: a sliced dim keeps its
    split if the devices divide its new size (else JAX raises); an integer removes a dim,
    which on a split dim is a slice of size 1, so JAX raises there too."""
    mesh = _mesh_of((x,))
    if not isinstance(index, tuple):
        index = (index,)
    if any(i is Ellipsis for i in index):
        k = index.index(Ellipsis)
        index = index[:k] + (slice(None),) * (x.ndim - len(index) + 1) + index[k + 1:]
    index = index + (slice(None),) * (x.ndim - len(index))
    out, drop = x, []
    for d, i in enumerate(index):
        if isinstance(i, slice):
            start, stop, step = i.indices(x.shape[d])
            if step != 1:
                if x.dims[d]:
                    raise ShardingTypeError("simpmd slices split dimensions with step 1 only; "
                                            "reshard that dimension to None first.")
                m = len(mesh.axis_names)
                blocks = np.take(out.blocks, np.arange(start, stop, step), axis=m + d)
                out = ShardedArray(blocks, out.shape[:d] + (blocks.shape[m + d],) + out.shape[d + 1:],
                                   mesh, out.dims)
            elif (start, stop) != (0, x.shape[d]):
                out = _slice_dim(out, d, start, stop)
        elif isinstance(i, (int, np.integer)):
            k = int(i) % x.shape[d]
            if x.dims[d]:
                raise ShardingTypeError(
                    f"x[{i}] on dimension {d} of {typeof(x)}: an index keeps one element of a "
                    f"dimension split over {x.dims[d]}, which JAX refuses (a size-1 slice of a "
                    f"split dimension). Reshard that dimension to None first: "
                    f"simpmd.reshard(x, P(...None there...)).")
            out = _slice_dim(out, d, k, k + 1)
            drop.append(d)
        else:
            raise TypeError(f"simpmd indexes sharded arrays with integers and slices; got {i!r}")
    if drop:
        keep = [d for d in range(out.ndim) if d not in drop]
        out = reshape(out, tuple(out.shape[d] for d in keep))
    return out


def concatenate(arrays, axis=0):
    """Rule (JAX's ``_concatenate_sharding_rule``): every operand must have the same sharding,
    which the result keeps. Along a split dim the blocks must be regrouped: simulated as an
    all-gather of each operand along it, then each device keeps its block (XLA on CPU uses
    all-to-alls for the same move)."""
    mesh = _mesh_of(arrays)
    ops = [_as_sharded(a, mesh) for a in arrays]
    specs = {o.dims for o in ops if any(o.dims)} | {o.dims for o in ops}
    if len(specs) > 1:
        raise ShardingTypeError(
            "concatenate: the operands have different shardings ("
            + ", ".join(str(_spec_of(o.dims)) for o in ops)
            + "); JAX requires one sharding for all. reshard them to one spec first.")
    dims = ops[0].dims
    d = axis % ops[0].ndim
    m = len(mesh.axis_names)
    shape = ops[0].shape[:d] + (sum(o.shape[d] for o in ops),) + ops[0].shape[d + 1:]
    if not dims[d]:
        blocks = np.concatenate([o.blocks for o in ops], axis=m + d)
        return ShardedArray(blocks, shape, mesh, dims)
    with _cause("concatenate"):
        wholes = [_move(o, dims[:d] + ((),) + dims[d + 1:]) for o in ops]
    joined = ShardedArray(np.concatenate([w.blocks for w in wholes], axis=m + d), shape, mesh,
                          dims[:d] + ((),) + dims[d + 1:])
    return _move(joined, dims)


# -- jit ------------------------------------------------------------------------------------------

def _map_leaves(fn, tree):
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(_map_leaves(fn, t) for t in tree)
    if isinstance(tree, tuple):
        return type(tree)(*[_map_leaves(fn, t) for t in tree])
    if isinstance(tree, dict):
        return {k: _map_leaves(fn, v) for k, v in tree.items()}
    return fn(tree)


def _leaves(tree):
    out = []
    _map_leaves(lambda v: out.append(v), tree)
    return out


class jit:
    """``jax.jit`` for Explicit shardings, simulated: runs ``fun`` on the sharded arrays, by
    the sharding rules, and keeps the collectives the compiler would insert in ``.trace``.

    (JAX traces once and compiles; here the function runs at every call, so that each
    call's log holds every device's values.) NumPy arguments become arrays replicated on
    the mesh of ``set_mesh``.
    """

    def __init__(self, fun, **kwargs):
        self.fun = fun
        self.trace: Trace | None = None
        self.__name__ = getattr(fun, "__name__", "jitted")
        self.__doc__ = getattr(fun, "__doc__", None)

    def __call__(self, *args, **kwargs):
        log = _Log()
        token = _LOG.set(log)
        try:
            mesh = get_mesh()
            args = _map_leaves(lambda v: (_as_sharded(v, mesh) if mesh is not None and
                                          isinstance(v, np.ndarray) else v), args)
            for k, leaf in enumerate(_leaves(args)):
                if isinstance(leaf, ShardedArray):
                    self._log_blocks(log, "receive", leaf, f"argument {k}")
            with _cause(None):
                out = self.fun(*args, **kwargs)
            for k, leaf in enumerate(_leaves(out)):
                if isinstance(leaf, ShardedArray):
                    self._log_blocks(log, "return", leaf, f"result {k}")
        finally:
            _LOG.reset(token)
        self.trace = Trace(log.events)
        return out

    @staticmethod
    def _log_blocks(log, kind, x, what):
        for s, pos in zip(x.addressable_shards, np.ndindex(*x.mesh.devices.shape)):
            device = int(s.device.id)
            rows = ", ".join(f"{sl.start}:{sl.stop}" for sl in s.index)
            log.add(Event(kind=kind, program=f"device {device}", coords=_coords(x.mesh, pos),
                          device=device, devices=(device,),
                          inputs=(s.data,) if kind == "receive" else (),
                          outputs=(s.data,) if kind == "return" else (),
                          detail=f"{what} [{rows}] of {typeof(x)}"))


# -- reading the log as HLO counts ------------------------------------------------------------------

HLO_NAME = {"psum": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce",
            "psum_scatter": "reduce-scatter", "all_gather": "all-gather",
            "all_to_all": "all-to-all", "ppermute": "collective-permute"}


def collective_counts(trace: Trace) -> dict:
    """How many collectives of each HLO kind a simulated run inserted (one per call, all
    groups together), e.g. ``{'all-reduce': 1}``: the numbers to hold beside JAX's HLO."""
    counts: dict = {}
    for call in trace.calls():
        kind = HLO_NAME[call[0].op]
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


_HLO_OP = re.compile(r"\s(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)"
                     r"(?:-start)?\(")


def hlo_collective_counts(hlo_text: str) -> dict:
    """The collectives in compiled HLO text (``jax.jit(f).lower(*a).compile().as_text()``)."""
    counts: dict = {}
    for line in hlo_text.splitlines():
        found = _HLO_OP.search(line)
        if found and "=" in line.split(found.group(0))[0]:
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return dict(sorted(counts.items()))


# -- the table: each operation and its rule ----------------------------------------------------------

RULES = {
    "elementwise (+ - * / **, tanh, exp, log, maximum, ...)":
        "per dim, the sharding the operands agree on; a whole operand is cut locally; "
        "two different splits of one dim raise",
    "where": "the elementwise rule over condition, x and y",
    "matmul / dot / einsum (dot_general)":
        "batch dims (alike on both sides), then left free dims, then right free dims; a "
        "contracting dim split on both sides raises unless out_sharding says: without the "
        "axis = all-reduce, splitting a result dim over it = reduce-scatter",
    "sum / mean / max / min": "reduced dims leave the spec; a split reduced dim = one all-reduce over its axes",
    "transpose": "the spec is permuted with the dims; no traffic",
    "reshape": "size-1 dims in or out, one dim cut into several (axes go to the leading new "
               "dims) or several merged (axes of the leading dims); else raise and ask for out_sharding",
    "slicing x[a:b]": "a split dim keeps its split if the devices divide the new size (else "
                      "raise); blocks move by collective permutes",
    "indexing x[i]": "fine on whole dims; on a split dim JAX raises",
    "concatenate": "all operands must share one sharding, which the result keeps",
    "reshard": "an axis leaving a dim = all-gather; moving to another dim = all-to-all; a "
               "finer split = a local slice",
}


def rules_table() -> str:
    """The rule table as text, one operation a line."""
    width = max(len(k) for k in RULES)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in RULES.items())


# -- simpmd.numpy's door: functions of sharded arrays --------------------------------------------------

_FUNCTIONS = {
    "matmul": matmul, "dot": dot, "einsum": einsum, "where": where, "transpose": transpose,
    "reshape": lambda x, shape, **k: reshape(x, shape, **k), "concatenate": concatenate,
    "sum": lambda x, axis=None, keepdims=False: reduce(np.sum, x, axis, keepdims),
    "mean": lambda x, axis=None, keepdims=False: reduce(np.mean, x, axis, keepdims),
    "max": lambda x, axis=None, keepdims=False: reduce(np.max, x, axis, keepdims),
    "min": lambda x, axis=None, keepdims=False: reduce(np.min, x, axis, keepdims),
}


def holds_sharded(value) -> bool:
    if isinstance(value, ShardedArray):
        return True
    if isinstance(value, (list, tuple)):
        return any(holds_sharded(v) for v in value)
    if isinstance(value, dict):
        return any(holds_sharded(v) for v in value.values())
    return False


def call_numpy(name: str, fn, args, kwargs):
    """``simpmd.numpy.<name>`` on sharded arrays: the rule table, or a ufunc elementwise."""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name](*args, **kwargs)
    if isinstance(fn, np.ufunc) and not kwargs:
        return elementwise(fn, *args, name=name)
    raise ShardingTypeError(
        f"simpmd.numpy.{name} has no sharding rule in simpmd.explicit; the operations it "
        f"simulates are: {', '.join(sorted(_FUNCTIONS))} and NumPy's elementwise functions.")


# simpmd.numpy calls on ShardedArrays (and with out_sharding=) follow this module's rules.
_core_numpy.sharded_engine = sys.modules[__name__]
