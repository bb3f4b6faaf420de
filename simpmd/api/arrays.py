"""Arrays on a mesh of simulated devices, as ``jax.Array``s are: placed by a sharding
(``device_put``), typed by it (``typeof``), moved between layouts (``reshard``), and their
operations outside jit, each run on the mesh as JAX dispatches them op by op (``on_mesh``:
traced, partitioned and run as a jit program is). ``simpmd.jit`` is ``jit.py``."""
from __future__ import annotations

import functools

import numpy as np

from ..core import bridge, dtypes, errors
from ..core.core import Aval, Program, Var, bind, context, running
from ..core.program import eval_program, trace
from ..core.values import StackedValue
from ..machine import devices as machine
from ..machine.mesh import (AxisType, Mesh, NamedSharding, PartitionSpec, ShardingError,
                            axis_types_of, check_spec, join_blocks, stack_blocks)
from ..partitioner import sharding as R
from ..partitioner.partition import BlockRun, partition, partitioned
from ..partitioner.rows import reshard_p
from ..partitioner.rules import _expanded, _full_index
from ..partitioner.sharded import ShardingRun
from ..partitioner.sharding import (Sharding, ShardingTypeError, all_explicit, count, dims_of,
                                    get_mesh, set_mesh, whole)
from ..partitioner.sharding import UnreducedValueError, settings
from . import shard_map_eqn  # noqa: F401  (the shard_map row)
from . import spelling, tree
from .grad import grad as _grad, value_and_grad as _value_and_grad
from .jit_call import arg_aval, call_in_body, split_static, traced_call
from .spmd import record_trace
from .trace import Trace
from ..machine.devices import devices
from ..machine.array import Shard
from ..machine.mesh import block_slices, replica_id as replica_of
from .spmd import Piece

def _one_device_mesh():
    return Mesh(np.array(devices()[0], dtype=object).reshape(()), ())


# -- arrays on a mesh ---------------------------------------------------------------------------


class ShapedArray:
    """What ``simpmd.typeof`` gives: shape, dtype and sharding, printed as JAX prints them
    (``float32[16@data,32@model]``; Auto axes carry no ``@``)."""

    def __init__(self, aval):
        self.aval = aval
        self.shape, self.dtype = aval.shape, aval.dtype

    @property
    def sharding(self):
        s = self.aval.sharding
        return NamedSharding(s.mesh, s.spec) if s is not None else None

    def str_short(self) -> str:
        return R.type_text(self.aval)             # float32[8,32@model]{V:data}

    __str__ = str_short

    def __repr__(self):
        return f"ShapedArray({self.str_short()})"

    def __eq__(self, other):
        return isinstance(other, ShapedArray) and self.aval == other.aval

    __hash__ = None


def typeof(x) -> ShapedArray:
    """The type of ``x`` with its sharding, like ``jax.typeof``: ``float32[16@data,32@model]``
    (inside a jit body too, where it is the traced value's type)."""
    if bridge.inside_jax(x) or type(x).__module__.startswith("jax"):
        import jax  # optional: JAX
        return jax.typeof(x)
    if isinstance(x, (ShardedArray, StackedValue)):
        return ShapedArray(x.aval)
    return ShapedArray(arg_aval(x))


class ShardedArray:
    """An array placed on a mesh of simulated devices: every device's block (``stack``,
    one row per device in the mesh's row-major order) and its type. ``x.block(6)`` is
    device 6's block; ``np.asarray(x)`` assembles the whole array, as for a ``jax.Array``;
    ``x.addressable_shards`` lists the blocks. Operators and methods run as JAX runs them
    outside jit: each operation compiled alone (its collectives in ``simpmd.last_trace()``)."""

    __array_priority__ = 1000

    def __init__(self, aval, stack, mesh, layout=None):
        self.aval, self.stack, self.mesh = aval, stack, mesh
        self.layout = dims_of(aval) if layout is None else tuple(layout)   # Auto axes too

    shape = property(lambda self: self.aval.shape)
    dtype = property(lambda self: self.aval.dtype)
    ndim = property(lambda self: self.aval.ndim)
    size = property(lambda self: self.aval.size)
    nbytes = property(lambda self: self.aval.nbytes)

    @property
    def sharding(self) -> NamedSharding:
        s = self.aval.sharding
        kinds = (s.unreduced, s.reduced) if s is not None else ()
        return NamedSharding(self.mesh, Sharding(self.mesh, self.layout, *kinds).spec)

    def block(self, device_id: int) -> np.ndarray:
        """The block that simulated device ``device_id`` holds."""
        ids = [d.id for d in self.mesh.devices.flat]
        if device_id not in ids:
            raise ValueError(f"device {device_id} is not in the mesh {self.mesh}")
        return self.stack[ids.index(device_id)]

    @property
    def addressable_shards(self) -> list:
        spec = self.sharding.spec
        return [Shard(d, block_slices(spec, self.mesh, self.shape, self.mesh.coords_of(k)),
                      self.stack[k], replica_of(spec, self.mesh, self.mesh.coords_of(k)))
                for k, d in enumerate(self.mesh.devices.flat)]

    def devices(self) -> set:
        return set(self.mesh.devices.flat)

    def __array__(self, dtype=None, copy=None):
        if getattr(self.aval.sharding, "unreduced", None):
            raise UnreducedValueError(
                f"{typeof(self)} holds partial sums, one per device along "
                f"{sorted(self.aval.sharding.unreduced)}: its value is their sum, which no "
                f"device has yet (JAX refuses to fetch it too). reshard it to a sharding "
                f"without unreduced axes first (that is the all-reduce), or read its "
                f".addressable_shards.")
        whole_ = join_blocks(np.asarray(self.stack), self.sharding.spec, self.mesh)
        return whole_ if dtype is None else whole_.astype(dtype)

    def value_in(self, run) -> StackedValue:
        """This array as a value of ``run``: its blocks as its type lays them out (a split
        over an Auto axis is the compiler's business: the blocks are whole along it)."""
        if run.mesh != self.mesh:
            raise ShardingTypeError(f"an array on {self.mesh!r} was used with arrays on "
                                    f"{run.mesh!r}; device_put it onto one mesh first.")
        stack = self.stack
        if self.layout != dims_of(self.aval):
            stack = stack_blocks(np.asarray(self), Sharding(self.mesh, dims_of(self.aval)).spec,
                                  self.mesh)
        return StackedValue(self.aval, stack)

    def __repr__(self):
        if getattr(self.aval.sharding, "unreduced", None):
            return f"ShardedArray(shape={self.shape}, type={typeof(self)})"
        body = np.array2string(np.asarray(self), separator=", ", prefix="ShardedArray(")
        return f"ShardedArray({body}, type={typeof(self)})"

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of an unsized array (a scalar)")
        return self.shape[0]

    def __iter__(self):
        return iter(np.asarray(self))

    def __bool__(self): return bool(np.asarray(self))
    def __float__(self): return float(np.asarray(self))
    def __int__(self): return int(np.asarray(self))
    def __index__(self): return int(np.asarray(self))
    def item(self, *args): return np.asarray(self).item(*args)
    def tolist(self): return np.asarray(self).tolist()
    def block_until_ready(self): return self
    T = property(lambda self: on_mesh(lambda v: v.T, (self,)))
    real = property(lambda self: on_mesh(lambda v: v.real, (self,)))
    imag = property(lambda self: on_mesh(lambda v: v.imag, (self,)))


def _install_operators():
    """Each operator and method of a traced value, run on the mesh at once (JAX runs each
    operation outside jit as a small program of its own)."""
    skip = {"__setitem__", "__len__", "__iter__", "__array_ufunc__", "__array_function__",
            "T", "real", "imag", "at", "__dict__", "__weakref__", "__module__", "__doc__",
            "__qualname__"}
    for name, method in vars(spelling.Spelled).items():
        if name in skip or not callable(method):
            continue

        def eager(self, *args, _method=method, **kwargs):
            return on_mesh(_method, (self,) + args, kwargs)
        eager.__name__ = name
        setattr(ShardedArray, name, eager)
    indexing = ShardedArray.__getitem__

    def getitem(self, index):
        empty = _empty_take(self, index)
        if empty is not None:
            return empty
        _refuse_eager_slice(self, index)
        return indexing(self, index)
    ShardedArray.__getitem__ = getitem


def _static_index(index):
    """``index`` as a tuple, or None where it holds more than ints, slices, None and ...
    (an array index is a gather: simpmd's jit rules answer for it)."""
    index = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))
               for i in index):
        return None
    return index


def _empty_take(x, index):
    """Outside jit, an index whose result is empty, as JAX answers it before any gather:
    an array of zeros that keeps the splits of the dimensions it keeps (jax 0.10 and
    newer; 0.7 replicated it). None where the result is not empty."""
    index = _static_index(index)
    if index is None:
        return None
    shape = np.empty(x.shape, dtype=np.bool_)[index].shape
    if 0 not in shape:
        return None
    keep = settings.empty_take_keeps_split
    kept = []
    dims = iter(range(x.ndim))
    for i in _expanded(index, x.ndim):
        if i is None:
            kept.append(None)
            continue
        d = next(dims)
        if isinstance(i, slice):
            axes = x.layout[d] if keep else ()
            kept.append(axes if axes else None)
    return _placed(np.zeros(shape, x.dtype), x.mesh, PartitionSpec(*kept))


def _refuse_eager_slice(x, index):
    """Outside jit, JAX indexes with a gather, which refuses to cut a split dimension
    (under jit the same index is a slice, which keeps the split): checked on jax 0.10.2
    and 0.12.0.1."""
    index = _static_index(index)
    if index is None:
        return
    entries = [i for i in _full_index(index, x.ndim)]
    for d, (i, axes) in enumerate(zip(entries, dims_of(x.aval))):
        if axes and not (isinstance(i, slice) and i.indices(x.shape[d]) == (0, x.shape[d], 1)):
            raise ShardingTypeError(
                f"x[{index}] outside jit cuts dimension {d} of {typeof(x)}, which is split "
                f"over {axes}: JAX indexes outside jit with a gather, which refuses that "
                f"('Use `.at[...].get(out_sharding=)` ...', JAX's words). Index under "
                f"simpmd.jit (a slice there keeps the split), or reshard that dimension "
                f"whole first.")


def _placed(value, mesh, spec):
    """A NumPy value as a ShardedArray laid out by ``spec`` on ``mesh`` (no traffic)."""
    value = np.asarray(value)
    value = value.astype(dtypes.canonical(value.dtype), copy=False)
    check_spec(spec, mesh, f"the spec for an array of shape {value.shape}", value.ndim)
    layout = R.resolve(spec, all_explicit(mesh), value.ndim, "device_put")
    for d, (n, axes) in enumerate(zip(value.shape, layout)):
        if axes and n % count(mesh, axes):
            raise ShardingTypeError(
                f"device_put: dimension {d} has size {n}, which the {count(mesh, axes)} "
                f"devices of {axes} cannot split evenly. JAX requires even splits for a "
                f"sharded array; pad the array or split that dimension over fewer devices.")
    aval = placed_aval(value.shape, value.dtype, mesh, spec)
    unreduced = aval.sharding.unreduced
    stack = stack_blocks(value, spec, mesh)
    if unreduced:           # as reshard places it: the value on the first device, zeros after
        first = [all(mesh.coords_of(k)[a] == 0 for a in unreduced) for k in range(mesh.size)]
        stack = np.where(np.reshape(first, (-1,) + (1,) * value.ndim), stack, 0)
    return ShardedArray(aval, stack, mesh, layout)

def placed_aval(shape, dtype, mesh, spec) -> Aval:
    """The type of an array of ``shape`` laid out by ``spec`` on ``mesh``: its Explicit
    axes in the type (``f32[8@data]``), its Auto ones the compiler's business."""
    layout = R.resolve(spec, all_explicit(mesh), len(shape), "device_put")
    explicit = R.explicit_axes(mesh)
    typed = tuple(tuple(a for a in axes if a in explicit) for axes in layout)
    unreduced, reduced = R.reductions_of(spec, mesh)
    return Aval(shape, dtype, sharding=Sharding(mesh, typed, unreduced, reduced))


def device_put(x, sharding=None):
    """Place ``x`` on the mesh, like ``jax.device_put(x, sharding)``: a ``NamedSharding``,
    or a ``P(...)`` over the mesh of ``set_mesh``; None replicates it over that mesh.
    Float64 becomes float32, as JAX does without ``jax_enable_x64``."""
    if bridge.inside_jax(x) or type(x).__module__.startswith("jax"):
        import jax  # optional: JAX
        return jax.device_put(x, sharding)
    if isinstance(sharding, NamedSharding):
        mesh, spec = sharding.mesh, sharding.spec
    else:
        mesh, spec = get_mesh(), sharding if sharding is not None else PartitionSpec()
        if mesh is None:
            raise ShardingError(
                "Please set a mesh via `jax.set_mesh` if a PartitionSpec is passed to "
                "device_put (JAX's words): device_put(x, P(...)) needs a mesh to refer to: "
                "call simpmd.set_mesh(mesh) first (or `with simpmd.set_mesh(mesh):`), or pass "
                "simpmd.NamedSharding(mesh, P(...)).")
    if isinstance(x, StackedValue):
        return reshard(x, NamedSharding(mesh, spec))
    if isinstance(x, ShardedArray):
        if x.mesh == mesh:
            return reshard(x, NamedSharding(mesh, spec))
        x = np.asarray(x)
    if machine.intercepts():                    # one process of simpmd.run_processes
        return machine.hosts.placed_on_mesh(x, NamedSharding(mesh, spec))
    return _placed(x, mesh, spec)


def reshard(x, spec):
    """``x`` with another sharding, like ``jax.sharding.reshard(x, P(...))``: an axis
    leaving a dimension is an all-gather, an axis moving to another dimension an
    all-to-all, a finer split a slice each device cuts from its own block."""
    if bridge.inside_jax(x) or type(x).__module__.startswith("jax"):
        import jax  # optional: JAX
        return jax.sharding.reshard(x, to_jax_spec(spec))
    R.check_placed(spec, "reshard")
    if isinstance(x, ShardedArray):
        return on_mesh(reshard, (x, spec))
    run = context.run
    if not isinstance(x, StackedValue) and not isinstance(run, ShardingRun):
        return device_put(x, spec)
    if not isinstance(run, ShardingRun):
        raise ShardingTypeError("reshard moves an array between layouts of a mesh: call it "
                                "under simpmd.jit, or on a simpmd.device_put array.")
    dst = Sharding(run.mesh, R.resolve(spec, run.mesh, np.ndim(x), "reshard"),
                   *R.reductions_of(spec, run.mesh))
    return bind(reshard_p, x, dst_sharding=dst)


def to_jax_spec(spec):
    """simpmd's ``P(...)`` as ``jax.sharding.PartitionSpec`` (other values pass through)."""
    if isinstance(spec, PartitionSpec):
        from jax.sharding import PartitionSpec as JaxP  # optional: JAX
        return JaxP(*spec)
    return spec


def _mesh_of(leaves):
    meshes = []
    for x in leaves:
        m = x.mesh if isinstance(x, ShardedArray) else None
        if m is not None and m not in meshes:
            meshes.append(m)
    if len(meshes) > 1:
        raise ShardingTypeError(f"the arrays live on different meshes ({meshes[0]!r} and "
                                f"{meshes[1]!r}); device_put them onto one mesh first.")
    return meshes[0] if meshes else (get_mesh() or _one_device_mesh())


def _replicated(run, x):
    """A NumPy array or a number given to a jitted function (or to an operation outside
    jit): an array on the mesh, whole on every device, as JAX places it."""
    aval = arg_aval(x).update(sharding=Sharding(run.mesh, whole(np.ndim(x))))
    value = np.asarray(x, dtype=aval.dtype)
    return StackedValue(aval, np.broadcast_to(value, (run.n,) + value.shape))

def holds_sharded(value) -> bool:
    return any(isinstance(x, ShardedArray) for x in tree.flatten(value)[0])


def run_partitioned(program, local, inputs, mesh):
    """Run the per-device program ``local`` of ``program`` on ``mesh``'s devices: the run,
    and the results as arrays on the mesh (a literal result as it is)."""
    run = BlockRun(mesh)
    run.log.receive(run, [_piece(run, x, f"argument {k}") for k, x in enumerate(inputs)])
    try:
        with running(run):
            outs = eval_program(local, [], [StackedValue(v.aval, x.stack)
                                            for v, x in zip(local.invars, inputs)])
    except Exception as exc:
        if getattr(exc, "trace", None) is None:
            exc.trace = _trace_of(run, local)
        raise
    results = [ShardedArray(g.aval, o.stack, mesh, layout) if type(g) is Var else o
               for g, o, layout in zip(program.outvars, outs, local.out_layouts)]
    for k, y in enumerate(results):
        if isinstance(y, ShardedArray):
            run.returned(y.stack, _piece(run, y, f"result {k}").detail)
    return run, results


def on_mesh(fn, args, kwargs=None):
    """``fn(*args, **kwargs)`` run at once on the mesh of its sharded arguments (or of
    ``set_mesh``): JAX's op-by-op dispatch. Its collectives are ``simpmd.last_trace()``."""
    leaves, treedef = tree.flatten((tuple(args), dict(kwargs or {})))
    if isinstance(context.run, ShardingRun):   # inside jit or grad's trace: part of its program
        a, kw = tree.unflatten(treedef, [x.value_in(context.run) if isinstance(x, ShardedArray)
                                         else x for x in leaves])
        return fn(*a, **kw)
    if machine.intercepts():                    # one process of simpmd.run_processes
        return machine.hosts.launch(_Operation(fn), args, kwargs or {})
    mesh = _mesh_of(leaves)
    typing = ShardingRun(mesh)
    values = [x.value_in(typing) if isinstance(x, ShardedArray) else
              _replicated(typing, x) if isinstance(x, np.ndarray) else x for x in leaves]
    arrays = [k for k, x in enumerate(values) if isinstance(x, StackedValue)]
    out_tree = []
    flat = tree.of_some_leaves(fn, treedef, values, arrays, out_tree)
    program, lifted = trace(flat, [values[k].aval for k in arrays], typing)
    inputs = list(lifted) + [values[k] for k in arrays]
    program = Program(program.constvars + program.invars, program.eqns, program.outvars)
    local = partition(program, mesh)
    run, results = run_partitioned(program, local, inputs, mesh)
    record_trace(_trace_of(run, local))
    return tree.unflatten(out_tree[0], results)


def _trace_of(run, program=None):
    trace_ = Trace(log=run.log, devices=run.devices)
    trace_.program = program
    types = run.mesh.axis_types               # (meshes alike but for their axis types are equal)
    trace_.notes = list(_auto_note(run.mesh, tuple(types) if isinstance(types, list) else types))
    return trace_


@functools.lru_cache(maxsize=64)
def _auto_note(mesh, axis_types) -> tuple:
    auto = [n for n, t in zip(mesh.axis_names, axis_types_of(mesh)) if t is AxisType.Auto]
    if not auto or mesh.size == 1:
        return ()
    return (f"Auto axes {', '.join(map(repr, auto))}: the sharding types leave them out, and "
            f"XLA's partitioner chooses how arrays split over them and which collectives "
            f"move them; simpmd does not guess its choice (the values are computed with "
            f"each device holding whole copies along them, and no collective over them is "
            f"shown). Read XLA's choice from jax.jit(f).lower(...).compile().as_text().",)


class _Operation:
    """An operation run outside jit (``x + 1``), as simpmd.run_processes names it."""

    def __init__(self, fn):
        self.fun = fn

    def __call__(self, *args, **kwargs):
        return on_mesh(self.fun, args, kwargs)




def _piece(run, x, what):
    """What each device holds of ``x``, described when the log is read."""
    aval = x.aval

    def detail(k):
        spec, shape, text = Sharding(run.mesh, dims_of(aval)).spec, aval.shape, str(ShapedArray(aval))
        index = block_slices(spec, run.mesh, shape, run.mesh.coords_of(k))
        rows = ", ".join(f"{s.start}:{s.stop}" if s.start is not None else f"0:{n}"
                         for s, n in zip(index, shape))
        return f"{what} [{rows}] of {text}" if shape else f"{what} of {text}"
    return Piece(x.stack, detail)


# -- grad of sharded arrays, and simpmd.numpy's functions on them --------------------------------


def grad(fun, argnums=0, has_aux=False):
    """``jax.grad`` (see ``simpmd.api.grad``); on sharded arrays outside any body it
    runs on their mesh, as JAX runs it op by op."""
    return _on_their_mesh(_grad(fun, argnums, has_aux))


def value_and_grad(fun, argnums=0, has_aux=False):
    """``jax.value_and_grad``; on sharded arrays outside any body it runs on their mesh."""
    return _on_their_mesh(_value_and_grad(fun, argnums, has_aux))


def _on_their_mesh(inner):
    @functools.wraps(inner)
    def on_their_mesh(*args, **kwargs):
        if context.run is None and holds_sharded((args, kwargs)):
            return on_mesh(inner, args, kwargs)
        return inner(*args, **kwargs)
    return on_their_mesh


def call_numpy(name, fn, args, kwargs):
    """``simpmd.numpy.<name>`` on sharded arrays, or with ``out_sharding=`` on NumPy
    arrays while a mesh is set: the operation run on the mesh at once."""
    R.check_placed(kwargs.get("out_sharding"))          # a bare P(...) needs set_mesh
    spelled = spelling.FUNCTIONS.get(name)
    if spelled is None:                 # NumPy's function, then placed as out_sharding says
        kwargs = dict(kwargs)
        spec = kwargs.pop("out_sharding", None)
        made = lambda *a, **k: spelling.numpy_function(fn, a, k)
        spelled = made if spec is None else lambda *a, **k: reshard(made(*a, **k), spec)
    if isinstance(context.run, ShardingRun):           # under jit: part of the program
        return spelled(*args, **kwargs)
    return on_mesh(spelled, args, kwargs)


_install_operators()
