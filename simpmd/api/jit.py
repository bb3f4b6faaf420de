"""``simpmd.jit``: a function traced once per signature into a program, whose values are
typed by their sharding, and run over every device of a mesh.

Since jax 0.9 ``jax.make_mesh`` gives *Explicit* axes: an array's sharding is part of its
type (``jax.typeof(x)`` prints ``float32[16@data,32@model]``), every primitive has a rule
that gives its result's sharding from its operands' (``partition.py``), and where the rule
cannot decide JAX raises and asks for ``out_sharding=``. The compiler then inserts the
collectives that make each device's block of every result right. simpmd does the same on
simulated devices, with JAX's names::

    mesh = simpmd.make_mesh((2, 4), ('data', 'model'))      # Explicit axes
    simpmd.set_mesh(mesh)
    x = simpmd.device_put(x_np, P('data', 'model'))
    f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P('data', None)))
    y = f(x, w)                   # traced once for this signature, then run
    simpmd.typeof(y)              # float32[16@data,8]
    print(f.trace)                # the all-reduce over 'model' the product needed

It is the one program of the engine: ``jit`` traces the body (``core/program.py``) on a
:class:`JitRun`, whose abstract evaluation gives every value its sharding, and runs the
program on a concrete one, where each value's stack holds every device's block and each
equation's plan moves blocks with the core's collective rows, so what jit inserts is
logged, drawn and costed as a collective a learner wrote (with ``params['inserted']``
naming the primitive that needed it). A jitted function called inside another body is one
``jit`` equation of that body's program (JAX's ``pjit``), which ``simpmd.grad``
differentiates; ``shard_map`` inside ``jit`` is a ``shard_map`` equation.
"""
from __future__ import annotations

import contextvars
import functools

import numpy as np

from ..core import bridge, core as C, dtypes, errors, tree
from ..core import collectives as K
from ..core.autodiff import backward, grad as _grad, value_and_grad as _value_and_grad
from ..core.core import Aval, Primitive, Var, aval_of, bind, context, running
from ..core.program import Equation, cached, eval_program, store, trace
from ..core.run import Run
from ..core.values import StackedValue
from ..machine.mesh import AxisType, Mesh, NamedSharding, PartitionSpec, axis_types_of
from . import partition as R
from .partition import Sharding, ShardingTypeError, count, dims_of, whole
from .spmd import record_trace
from .trace import Trace

R.attach()


# -- the mesh that P(...) refers to: set_mesh ----------------------------------------------------

_MESH: contextvars.ContextVar = contextvars.ContextVar("simpmd_mesh", default=None)


class set_mesh:
    """Make ``mesh`` the one that ``P(...)`` refers to, like ``jax.set_mesh``: called alone
    it sets the mesh until changed; ``with simpmd.set_mesh(mesh):`` puts the previous one
    back at the end of the block."""

    def __init__(self, mesh: Mesh):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"set_mesh takes a simpmd Mesh (simpmd.make_mesh(...)), got {mesh!r}")
        self.mesh, self._token = mesh, _MESH.set(mesh)

    def __enter__(self):
        return self.mesh

    def __exit__(self, *exc):
        _MESH.reset(self._token)
        return False


def get_mesh():
    """The mesh set by :class:`set_mesh`, or None."""
    return _MESH.get()


def _one_device_mesh():
    from ..machine.devices import devices
    return Mesh(np.array(devices()[0], dtype=object).reshape(()), ())


# -- the run: a mesh's devices, every value a block per device -------------------------------


class JitRun(Run):
    """The devices of a mesh running a jit program. A value's type is its global shape with
    its sharding; its stack holds every device's block. ``abstract`` runs give types only
    (how a body is traced); ``lowering`` ones also work out each equation's plan, so the
    collectives jit inserts are logged without values (``Jitted.lower``)."""

    def __init__(self, mesh, *, abstract=False, lowering=False, manual=(), check_vma=False):
        super().__init__(list(mesh.devices.flat), tuple(mesh.shape.items()), abstract=abstract,
                         maps_a_mesh=True, check_vma=check_vma)
        self.mesh, self.lowering = mesh, lowering
        self.manual_axes = tuple(manual)   # inside shard_map(axis_names=...): by hand
        self.manual = Run(self.all_devices, self.axes, abstract=abstract)   # blocks, by hand
        self.manual.log = self.log
        self.partial: dict = {}        # id(value) -> (value, pending sums, equation, phase)
        self.residuals: dict = {}      # a jit equation's forward values, for its vjp
        self.program = [] if not abstract or lowering else None   # what each device runs
        self.names: dict = {}          # id(value) -> (value, its Var in that program)

    def tracing(self) -> "JitRun":
        return JitRun(self.mesh, abstract=True, manual=self.manual_axes, check_vma=self.check_vma)

    def prepare(self, prim, args, params):
        return super().prepare(prim, args, params) if self.manual_axes else args

    def apply(self, prim, args, params):
        names = params.get("axes", params.get("axis_name"))
        names = names if isinstance(names, (tuple, list)) else (names,)
        if (prim.collective or prim.name == "pvary") and self.manual_axes and \
                set(names) <= set(self.manual_axes):      # by hand, over the manual axes
            outs = super().apply(prim, args, params)
            self._record(prim, params, args, outs)
            return outs
        if prim.collective or prim.name == "pvary":
            raise errors.UnboundAxisError(
                f"{prim.name} over {params.get('axes', params.get('axis_name'))} inside jit, "
                f"outside shard_map: under jit the compiler writes the collectives, and a "
                f"named axis exists only inside shard_map (real JAX: 'unbound axis name'). "
                f"Write the computation for whole arrays, or wrap the per-device part in "
                f"simpmd.shard_map.")
        rule = getattr(prim, "sharding", None)
        if rule is None:
            raise ShardingTypeError(f"{prim.name} has no sharding rule in simpmd, so it cannot "
                                    f"run under jit.")
        avals = [aval_of(x) for x in args]
        out = prim.abstract(*avals, **params)
        outs = list(out) if prim.multiple_results else [out]
        layouts = rule(self.mesh, avals, **params)
        outs = [o.update(vma=o.vma if self.manual_axes else frozenset(),
                         sharding=Sharding(self.mesh, d)) for o, d in zip(outs, layouts)]
        for o in outs:
            R.check_layout(self.mesh, o.shape, o.sharding.dims, prim.name)
        traced = self.abstract or any(isinstance(x, StackedValue) and x.stack is None for x in args)
        if traced and not self.lowering:
            return [StackedValue(o) for o in outs]
        if getattr(prim, "needs_run", False):         # it runs programs of its own, here
            self.returned_values = []
            results = [StackedValue(o, s) for o, s in zip(outs, prim.stacked(*args, **params))]
            for new, old in zip(results, self.returned_values):
                self.alias(new, old)
            return results
        return self._compute(prim, args, avals, outs, params)

    def stack_of(self, x, aval):
        if isinstance(x, StackedValue):
            return self.settle(x).stack
        return super().stack_of(x, aval)

    # -- one equation, device by device ---------------------------------------------------------
    def _compute(self, prim, args, avals, outs, params):
        """The equation's plan: operands moved to the layout it needs, the primitive on
        blocks, partial sums combined, results moved to the layout their type says."""
        found = self._pending(args[0]) if args else None
        if found is not None and not (prim.name == "reshard" or self._carries(prim, found, outs)):
            found = None
        args = [x if (k == 0 and found) or not isinstance(x, StackedValue) else self.settle(x)
                for k, x in enumerate(args)]
        plan = (getattr(prim, "partition", None) or R.computed_whole)(avals, outs, **params)
        cause = f"jit: {prim.name}"
        values = [self._block(x, a, want, cause, scatter=found if k == 0 else None)
                  for k, (x, a, want) in enumerate(zip(args, avals, plan.ins))]
        results = values if plan.params is None else self._local(prim, values, plan.params)
        if plan.then is not None:
            results = [plan.then(self, r, cause) for r in results]
        carried = list(found[1]) if found is not None and prim.name != "reshard" else []
        out = []
        for r, layout, o in zip(results, plan.out, outs):
            r, layout, pending = self._combine(r, layout, plan.sums, o.sharding.dims, cause,
                                               defer=prim.name == "dot_general")
            moved = self.move(r, o.shape, layout, o.sharding.dims, cause)
            value = StackedValue(o, moved.stack)
            self.alias(value, moved)
            if pending or carried:
                self.partial[id(value)] = (value, pending + carried) + (
                    found[2:] if carried else (context.eqn, context.phase))
            out.append(value)
        return out

    def _pending(self, x):
        found = self.partial.get(id(x)) if isinstance(x, StackedValue) else None
        return found if found is not None and found[0] is x else None

    def _carries(self, prim, found, outs):
        """A layout-only, linear primitive passes pending partial sums on (the transpose
        of a product's partial sums is the partial sums of its transpose)."""
        if prim.name not in _CARRY or (prim.name == "convert_element_type"
                                       and found[0].aval.dtype.kind + outs[0].dtype.kind != "ff"):
            return False
        used = {a for d in outs[0].sharding.dims for a in d}
        return not any(a in used for axes in found[1] for a in axes)

    def _block(self, x, aval, want, cause, scatter=None):
        """Operand ``x`` as blocks in layout ``want`` (a local value); ``scatter``: its
        pending sums, for a reshard to resolve."""
        cur = dims_of(aval)
        want = cur if want is None else tuple(want)
        if not isinstance(x, StackedValue):
            if want == cur or not aval.ndim:
                return x
            x = StackedValue(aval.update(sharding=None), self.stack_of(x, aval))
        local = StackedValue(Aval(R.block_shape(aval.shape, cur, self.mesh), aval.dtype,
                                  aval.weak_type), x.stack)
        self.alias(local, x)
        if scatter is not None and "reshard" in cause:
            local, cur = self._scatter(x, local, cur, want, scatter)
        return self.move(local, aval.shape, cur, want, cause)

    def _scatter(self, x, local, cur, want, found):
        """A reshard of pending partial sums: a reduce-scatter for each sum whose axes the
        new layout splits a dim over, an all-reduce for the others."""
        _, sums, eqn, phase = found
        del self.partial[id(x)]
        cur = [tuple(c) for c in cur]
        outer, context.eqn, context.phase = (context.eqn, context.phase), eqn, phase
        try:
            cause = f"jit: {eqn.primitive.name}" if eqn is not None else "jit"
            for axes in sums:
                d = next((d for d in range(len(cur)) if
                          want[d][:len(cur[d]) + len(axes)] == cur[d] + tuple(axes)), None)
                if d is None:
                    local = self.insert(K.psum, local, cause, axes=axes, axis_index_groups=None)
                    continue
                local = self.insert(K.reduce_scatter, local, cause, scatter_dimension=d,
                                    axis_name=axes, axis_index_groups=None,
                                    axis_size=count(self.mesh, axes), tiled=True)
                cur[d] = cur[d] + tuple(axes)
        finally:
            context.eqn, context.phase = outer
        return local, cur

    def settle(self, x):
        """``x`` with its pending partial sums added up (an all-reduce each)."""
        found = self.partial.get(id(x))
        if found is None or found[0] is not x:
            return x
        del self.partial[id(x)]
        local = StackedValue(Aval(R.block_shape(x.aval.shape, dims_of(x.aval), self.mesh),
                                  x.aval.dtype, x.aval.weak_type), x.stack)
        self.alias(local, x)
        outer, context.eqn, context.phase = (context.eqn, context.phase), found[2], found[3]
        try:
            cause = f"jit: {found[2].primitive.name}" if found[2] is not None else "jit"
            for axes in found[1]:
                local = self.insert(K.psum, local, cause, axes=axes, axis_index_groups=None)
        finally:
            context.eqn, context.phase = outer
        x.stack = local.stack
        self.alias(x, local)
        return x

    def _local(self, prim, values, params):
        with running(self.manual):
            outs = self.manual.apply(prim, values, params)
        self._record(prim, params, values, outs)
        return outs

    def _record(self, prim, params, ins, outs):
        """One step of the per-device program (what ``lower(...).compile()`` shows, and
        what the roofline and the timeline cost)."""
        if self.program is not None:
            invars = [self.var(x) for x in ins]
            outvars = []
            for o in outs:
                outvars.append(Var(aval_of(o)))
                self.names[id(o)] = (o, outvars[-1])
            self.program.append(Equation(prim, params, invars, outvars, C.caller_source(),
                                         context.phase))

    def var(self, x):
        """The per-device program's variable of block ``x`` (a literal for a constant)."""
        from ..core.core import Lit
        if not isinstance(x, StackedValue):
            return Lit(x)
        found = self.names.get(id(x))
        if found is None or found[0] is not x:
            found = self.names[id(x)] = (x, Var(aval_of(x)))
        return found[1]

    def alias(self, new, old):
        """``new`` holds the same blocks as ``old`` (a value and its blocks' view)."""
        if self.program is None or not isinstance(new, StackedValue):
            return
        found = self.names.get(id(old))
        if found is None or found[0] is not old:          # first seen: typed by its blocks
            found = self.names[id(old)] = (old, Var(aval_of(new)))
        self.names[id(new)] = (new, found[1])

    def insert(self, row, value, cause, **params):
        """Run the collective ``row`` on blocks, logged as inserted by jit for ``cause``."""
        with running(self.manual):
            out = self.manual.apply(row, [value], params)
        record = self.log.records[-1]
        record.fields["params"] = dict(record.fields["params"], inserted=cause)
        self._record(row, params, [value], out)
        return out[0]

    def move(self, v, shape, cur, want, cause):
        """Blocks ``v`` of a value of global ``shape`` from layout ``cur`` to ``want``: an
        axis leaving a dim is all-gathered, one moving to another dim goes in an
        all-to-all, and a finer split is a slice each device cuts from its own block."""
        cur, want = [list(a) for a in cur], [tuple(a) for a in want]
        for d in range(len(shape)):
            k = 0
            while k < min(len(cur[d]), len(want[d])) and cur[d][k] == want[d][k]:
                k += 1
            while len(cur[d]) > k:
                a = cur[d][-1]
                dest = next((e for e in range(len(shape)) if e != d and len(cur[e]) < len(want[e])
                             and want[e][:len(cur[e]) + 1] == tuple(cur[e]) + (a,)), None)
                if dest is not None and len(cur[d]) - k == 1:
                    v = self.insert(K.all_to_all, v, cause, split_axis=dest, concat_axis=d,
                                    axis_name=(a,), axis_index_groups=None, tiled=True)
                    cur[d].pop()
                    cur[dest].append(a)
                else:
                    leaving = tuple(cur[d][k:])
                    v = self.insert(K.all_gather, v, cause, all_gather_dimension=d,
                                    axis_name=leaving, axis_index_groups=None,
                                    axis_size=count(self.mesh, leaving), tiled=True)
                    cur[d] = cur[d][:k]
        for d in range(len(shape)):
            extra = want[d][len(cur[d]):]
            if extra:
                v = self.cut(v, d, extra)
        return v

    def cut(self, v, d, axes):
        """Each device keeps its piece of dim ``d`` of its block, by its position along
        ``axes``: no communication."""
        return self._local(shard_slice, [v], {"dimension": d, "axes": tuple(axes)})[0]

    def _combine(self, r, layout, sums, target, cause, defer=False):
        """A plan's partial sums: a reduce-scatter where the result keeps only a slice
        along the summed axes; else an all-reduce (psum, pmax, pmin). A psum whose axes
        the result's layout does not use is left pending: its next use decides (a
        reshard that splits over them turns it into a reduce-scatter): a product's only,
        as XLA's reduce-scatter creator finds them (an all-reduce, then a slice)."""
        layout, pending = list(layout), []
        used = {a for d in target for a in d}
        for op, axes in sums:
            axes = tuple(axes)
            d = next((d for d in range(len(target)) if op == "psum" and
                      target[d][:len(layout[d]) + len(axes)] == tuple(layout[d]) + axes), None)
            if d is not None:
                r = self.insert(K.reduce_scatter, r, cause, scatter_dimension=d, axis_name=axes,
                                axis_index_groups=None, axis_size=count(self.mesh, axes),
                                tiled=True)
                layout[d] = tuple(layout[d]) + axes
            elif op == "psum" and defer and not used & set(axes):
                pending.append(axes)
            else:
                r = self.insert(_ROWS[op], r, cause, axes=axes, axis_index_groups=None)
        return r, tuple(layout), pending


_ROWS = {"psum": K.psum, "pmax": K.pmax, "pmin": K.pmin}
_CARRY = {"transpose", "copy", "reshape", "convert_element_type", "squeeze"}


def _cut(x, dimension, axes):
    run = context.run
    p, stack = run.axis_size(axes, "jit"), x.stack
    s = stack.reshape(stack.shape[:dimension + 1] + (p, -1) + stack.shape[dimension + 2:])
    return [np.moveaxis(s, dimension + 1, 1)[np.arange(run.n), run.positions(axes)]]


def _cut_abstract(x, dimension, axes):
    shape = list(x.shape)
    shape[dimension] //= context.run.axis_size(axes, "jit")
    return x.update(shape=shape)


shard_slice = Primitive(     # each device cuts its piece of its block: XLA's dynamic-slice
    "dynamic_slice", _cut, _cut_abstract, needs_run=True,
    cost=lambda ins, outs, **p: (0, sum(a.nbytes for a in (*ins, *outs))))


# -- the rows jit adds: a jit equation, and reshard ---------------------------------------------


def _jit_stacked(*args, jaxpr, name, ctx_mesh=None):
    """The inner program on this run; its forward values are kept for its vjp."""
    run = context.run or C.plain
    env: dict = {}
    outs = eval_program(jaxpr, [], list(args), env)
    stacks = [run.stack_of(o, aval_of(o)) for o in outs]
    if hasattr(run, "returned_values"):
        run.returned_values = outs
    if getattr(run, "residuals", None) is not None and stacks and stacks[0] is not None:
        run.residuals[id(stacks[0])] = env
    return stacks


def _jit_vjp(cts, ins, outs, wants, jaxpr, name, ctx_mesh=None):
    """The derivative of a jit equation: its program's equations sent backwards, from the
    forward values its run kept (while tracing, the forward is traced again, inline)."""
    run = context.run or C.plain
    first = outs[0] if outs else None
    key = id(first.stack) if isinstance(first, StackedValue) and first.stack is not None else None
    env = getattr(run, "residuals", {}).pop(key, None) if key is not None else None
    if env is None:
        env = {}
        eval_program(jaxpr, [], list(ins), env)
    seeds = {v: c for v, c in zip(jaxpr.outvars, cts) if type(v) is Var and c is not None}
    active = {v for v, w in zip(jaxpr.invars, wants) if w}
    got = backward(jaxpr.eqns, env, seeds, set(active))
    return [got.get(v) if w else None for v, w in zip(jaxpr.invars, wants)]


jit_p = Primitive(
    "jit", _jit_stacked, lambda *avals, jaxpr, name, ctx_mesh=None: [aval_of(v) for v in jaxpr.outvars],
    vjp=_jit_vjp, multiple_results=True, needs_run=True, cost=lambda ins, outs, **p: (0, 0),
    show=lambda p: [("name", p["name"])] + ([("ctx_mesh", p["ctx_mesh"])] if p.get("ctx_mesh") else [])
    + [("jaxpr", p["jaxpr"])])
jit_p.sharding = lambda mesh, avals, jaxpr, **p: [dims_of(aval_of(v)) for v in jaxpr.outvars]


def _reshard_vjp(ct, ins, outs, wants, dst_sharding):
    back = aval_of(ins[0]).sharding or PartitionSpec()
    return [bind(reshard_p, ct, dst_sharding=back) if wants[0] else None]


reshard_p = Primitive("reshard", lambda x, dst_sharding: x, lambda x, dst_sharding: x,
                      vjp=_reshard_vjp, cost=lambda ins, outs, **p: (0, 0), show=lambda p: {})
reshard_p.sharding, reshard_p.partition = R.reshard_rule, R.reshard_plan


class MeshText:
    """How a jit equation prints its mesh: ``Mesh('data': 2, 'model': 4, axis_types=(...))``."""

    def __init__(self, mesh):
        self.mesh = mesh

    def __repr__(self):
        sizes = ", ".join(f"{n!r}: {s}" for n, s in self.mesh.shape.items())
        types = ", ".join(t.name for t in axis_types_of(self.mesh))
        return f"Mesh({sizes}, axis_types=({types}{',' if len(self.mesh.axis_names) == 1 else ''}))"


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
        short = self.aval.str_short()             # f32[8,32@model]{V:data}
        return np.dtype(self.dtype).name + short[short.index("["):]

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
        import jax
        return jax.typeof(x)
    if isinstance(x, (ShardedArray, StackedValue)):
        return ShapedArray(x.aval)
    return ShapedArray(_arg_aval(x))


def _arg_aval(x):
    """The type JAX gives a plain argument (64-bit numbers as 32-bit, without x64)."""
    if dtypes.is_weak_scalar(x):
        return aval_of(x)
    a = np.asarray(x)
    return Aval(a.shape, dtypes.canonical(a.dtype))


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
        return NamedSharding(self.mesh, Sharding(self.mesh, self.layout).spec)

    def block(self, device_id: int) -> np.ndarray:
        """The block that simulated device ``device_id`` holds."""
        ids = [d.id for d in self.mesh.devices.flat]
        if device_id not in ids:
            raise ValueError(f"device {device_id} is not in the mesh {self.mesh}")
        return self.stack[ids.index(device_id)]

    @property
    def addressable_shards(self) -> list:
        from ..machine.array import Shard
        from ..machine.mesh import block_slices, replica_id
        spec = self.sharding.spec
        return [Shard(d, block_slices(spec, self.mesh, self.shape, self.mesh.coords_of(k)),
                      self.stack[k], replica_id(spec, self.mesh, self.mesh.coords_of(k)))
                for k, d in enumerate(self.mesh.devices.flat)]

    def devices(self) -> set:
        return set(self.mesh.devices.flat)

    def __array__(self, dtype=None, copy=None):
        from .shard_map import _join_blocks
        whole_ = _join_blocks(np.asarray(self.stack), self.sharding.spec, self.mesh)
        return whole_ if dtype is None else whole_.astype(dtype)

    def value_in(self, run) -> StackedValue:
        """This array as a value of ``run``: its blocks as its type lays them out (a split
        over an Auto axis is the compiler's business: the blocks are whole along it)."""
        if run.mesh != self.mesh:
            raise ShardingTypeError(f"an array on {self.mesh!r} was used with arrays on "
                                    f"{run.mesh!r}; device_put it onto one mesh first.")
        stack = self.stack
        if self.layout != dims_of(self.aval):
            from .shard_map import _stack_blocks
            stack = _stack_blocks(np.asarray(self), Sharding(self.mesh, dims_of(self.aval)).spec,
                                  self.mesh)
        return StackedValue(self.aval, stack)

    def __repr__(self):
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
    from .spelling import Spelled
    skip = {"__setitem__", "__len__", "__iter__", "__array_ufunc__", "__array_function__",
            "T", "real", "imag", "at", "__dict__", "__weakref__", "__module__", "__doc__",
            "__qualname__"}
    for name, method in vars(Spelled).items():
        if name in skip or not callable(method):
            continue

        def eager(self, *args, _method=method, **kwargs):
            return on_mesh(_method, (self,) + args, kwargs)
        eager.__name__ = name
        setattr(ShardedArray, name, eager)
    indexing = ShardedArray.__getitem__

    def getitem(self, index):
        _refuse_eager_slice(self, index)
        return indexing(self, index)
    ShardedArray.__getitem__ = getitem


def _refuse_eager_slice(x, index):
    """Outside jit, JAX indexes with a gather, which refuses to cut a split dimension
    (under jit the same index is a slice, which keeps the split): checked on jax 0.10.2
    and 0.12.0.1."""
    index = index if isinstance(index, tuple) else (index,)
    if not all(i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice)) for i in index):
        return
    entries = [i for i in R._full_index(index, x.ndim)]
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
    from ..machine.mesh import check_spec
    from .shard_map import _stack_blocks
    value = np.asarray(value)
    value = value.astype(dtypes.canonical(value.dtype), copy=False)
    check_spec(spec, mesh, f"the spec for an array of shape {value.shape}", value.ndim)
    layout = R.resolve(spec, _all_explicit(mesh), value.ndim, "device_put")
    for d, (n, axes) in enumerate(zip(value.shape, layout)):
        if axes and n % count(mesh, axes):
            raise ShardingTypeError(
                f"device_put: dimension {d} has size {n}, which the {count(mesh, axes)} "
                f"devices of {axes} cannot split evenly. JAX requires even splits for a "
                f"sharded array; pad the array or split that dimension over fewer devices.")
    explicit = R.explicit_axes(mesh)
    typed = tuple(tuple(a for a in axes if a in explicit) for axes in layout)
    aval = Aval(value.shape, value.dtype, sharding=Sharding(mesh, typed))
    return ShardedArray(aval, _stack_blocks(value, spec, mesh), mesh, layout)


class _all_explicit:
    """A mesh seen as if every axis were Explicit (a placement may name any axis)."""

    def __init__(self, mesh):
        self.mesh, self.axis_names, self.shape = mesh, mesh.axis_names, mesh.shape
        self.axis_types = (AxisType.Explicit,) * len(mesh.axis_names)

    def __repr__(self):
        return repr(self.mesh)


def device_put(x, sharding=None):
    """Place ``x`` on the mesh, like ``jax.device_put(x, sharding)``: a ``NamedSharding``,
    or a ``P(...)`` over the mesh of ``set_mesh``; None replicates it over that mesh.
    Float64 becomes float32, as JAX does without ``jax_enable_x64``."""
    if bridge.inside_jax(x) or type(x).__module__.startswith("jax"):
        import jax
        return jax.device_put(x, sharding)
    if isinstance(sharding, NamedSharding):
        mesh, spec = sharding.mesh, sharding.spec
    else:
        mesh, spec = get_mesh(), sharding if sharding is not None else PartitionSpec()
        if mesh is None:
            raise ShardingTypeError(
                "device_put(x, P(...)) needs a mesh to refer to: call simpmd.set_mesh(mesh) "
                "first (or `with simpmd.set_mesh(mesh):`), or pass "
                "simpmd.NamedSharding(mesh, P(...)).")
    if isinstance(x, StackedValue):
        return reshard(x, NamedSharding(mesh, spec))
    if isinstance(x, ShardedArray):
        if x.mesh == mesh:
            return reshard(x, NamedSharding(mesh, spec))
        x = np.asarray(x)
    return _placed(x, mesh, spec)


def reshard(x, spec):
    """``x`` with another sharding, like ``jax.sharding.reshard(x, P(...))``: an axis
    leaving a dimension is an all-gather, an axis moving to another dimension an
    all-to-all, a finer split a slice each device cuts from its own block."""
    if bridge.inside_jax(x) or type(x).__module__.startswith("jax"):
        import jax
        return jax.sharding.reshard(x, to_jax_spec(spec))
    if isinstance(x, ShardedArray):
        return on_mesh(reshard, (x, spec))
    if not isinstance(x, StackedValue):
        return device_put(x, spec)
    run = context.run
    if not isinstance(run, JitRun):
        raise ShardingTypeError("reshard moves an array between layouts of a mesh: call it "
                                "under simpmd.jit, or on a simpmd.device_put array.")
    dst = Sharding(run.mesh, R.resolve(spec, run.mesh, x.aval.ndim, "reshard"))
    return bind(reshard_p, x, dst_sharding=dst)


def to_jax_spec(spec):
    """simpmd's ``P(...)`` as ``jax.sharding.PartitionSpec`` (other values pass through)."""
    if isinstance(spec, PartitionSpec):
        from jax.sharding import PartitionSpec as JaxP
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
    aval = _arg_aval(x).update(sharding=Sharding(run.mesh, whole(np.ndim(x))))
    value = np.asarray(x, dtype=aval.dtype)
    return StackedValue(aval, np.broadcast_to(value, (run.n,) + value.shape))


def per_device_program(run, outs=()):
    """What each device of ``run`` ran, as a program: its inputs are the blocks no step
    made, its results the blocks of ``outs``."""
    from ..core.core import Program
    eqns = run.program or []
    made = {v for e in eqns for v in e.outvars}
    invars = []
    for e in eqns:
        invars += [v for v in e.invars if type(v) is Var and v not in made and v not in invars]
    outvars = [run.var(o) for o in outs if isinstance(o, StackedValue)]
    return Program(invars, eqns, outvars, axis_env=tuple(run.mesh.shape.items()))


def holds_sharded(value) -> bool:
    return any(isinstance(x, ShardedArray) for x in tree.flatten(value)[0])


def _results(run, out):
    """A run's results as arrays on its mesh (pending partial sums added up first)."""
    def one(v):
        if not isinstance(v, StackedValue):
            return v
        v = run.settle(v)
        return ShardedArray(v.aval, v.stack, run.mesh)
    return tree.tree_map(one, out)


def on_mesh(fn, args, kwargs=None):
    """``fn(*args, **kwargs)`` run at once on the mesh of its sharded arguments (or of
    ``set_mesh``): JAX's op-by-op dispatch. Its collectives are ``simpmd.last_trace()``."""
    leaves, treedef = tree.flatten((tuple(args), dict(kwargs or {})))
    mesh = _mesh_of(leaves)
    run = JitRun(mesh)
    values = [x.value_in(run) if isinstance(x, ShardedArray) else
              _replicated(run, x) if isinstance(x, np.ndarray) else x for x in leaves]
    a, kw = tree.unflatten(treedef, values)
    with running(run):
        out = fn(*a, **kw)
    result = _results(run, out)
    record_trace(_trace_of(run, [v for v in tree.flatten(out)[0] if isinstance(v, StackedValue)]))
    return result


def _trace_of(run, outs=()):
    trace_ = Trace(log=run.log, devices=run.devices)
    trace_.program = per_device_program(run, outs)
    auto = [n for n, t in zip(run.mesh.axis_names, axis_types_of(run.mesh)) if t is AxisType.Auto]
    if auto and run.mesh.size > 1:
        trace_.notes = [
            f"Auto axes {', '.join(map(repr, auto))}: the sharding types leave them out, and "
            f"XLA's partitioner chooses how arrays split over them and which collectives "
            f"move them; simpmd does not guess its choice (the values are computed with "
            f"each device holding whole copies along them, and no collective over them is "
            f"shown). Read XLA's choice from jax.jit(f).lower(...).compile().as_text()."]
    return trace_


# -- jit ---------------------------------------------------------------------------------------


class Jitted:
    """A function compiled for a mesh, like the result of ``jax.jit``: traced once per
    signature (the function, its static arguments, each argument's shape, dtype and
    sharding) into a program, which each call runs; ``.trace`` is the last call's log."""

    def __init__(self, fun, static_argnums=(), static_argnames=(), donate_argnums=()):
        if not callable(fun):
            raise TypeError(f"jit needs a function, got {fun!r}.")
        functools.update_wrapper(self, fun)
        self.fun = fun
        self.static_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        self.static_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self.trace = None

    def __repr__(self):
        return f"<simpmd.jit of {getattr(self.fun, '__name__', self.fun)!r}>"

    def __get__(self, obj, objtype=None):        # a jitted method
        return self if obj is None else functools.partial(self, obj)

    # -- the program of a signature ----------------------------------------------------------
    def _split(self, args, kwargs):
        n = len(args)
        static = {a % n for a in self.static_argnums} if n else set()
        fixed = tuple((k, args[k]) for k in sorted(static))
        fixed += tuple((k, kwargs[k]) for k in sorted(kwargs) if k in self.static_argnames)
        dynamic = ([a for k, a in enumerate(args) if k not in static],
                   {k: v for k, v in kwargs.items() if k not in self.static_argnames})
        leaves, treedef = tree.flatten(dynamic)
        return fixed, leaves, treedef, static

    def _program(self, run, args, kwargs, leaves=None):
        """(program, results' tree, dynamic leaves) for this call, traced on ``run``'s grid
        the first time this signature is seen."""
        fixed, found, treedef, static = self._split(args, kwargs)
        leaves = found if leaves is None else leaves
        avals = tuple(aval_of(x) if isinstance(x, StackedValue) else _arg_aval(x) for x in leaves)
        where = (type(run).__name__, run.axes, run.check_vma, getattr(run, "mesh", None))
        key = ("jit", fixed, treedef, avals, where)
        entry = cached(self.fun, key)
        if entry is None:
            out_trees = []

            def flat(*xs):
                dyn, kw = tree.unflatten(treedef, list(xs))
                it = iter(dyn)
                full = [args[k] if k in static else next(it) for k in range(len(args))]
                kw = dict(kw, **{k: v for k, v in kwargs.items() if k in self.static_argnames})
                out, out_tree = tree.flatten(self.fun(*full, **kw))
                out_trees.append(out_tree)
                return out
            program, _ = trace(flat, list(avals), run.tracing())
            entry = (program, out_trees[0])
            store(self.fun, key, entry)
        return entry[0], entry[1], leaves

    # -- calling -----------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if bridge.inside_jax((args, kwargs)):
            import jax
            return jax.jit(self.fun, static_argnums=self.static_argnums,
                           static_argnames=self.static_argnames)(*args, **kwargs)
        run = context.run
        if run is not None:                        # inside another body: one jit equation
            program, out_tree, leaves = self._program(run, args, kwargs)
            mesh = getattr(run, "mesh", None)
            outs = bind(jit_p, *leaves, jaxpr=program, name=getattr(self.fun, "__name__", "fun"),
                        ctx_mesh=MeshText(mesh) if mesh is not None and mesh.axis_names else None)
            return tree.unflatten(out_tree, outs)
        return self._run(args, kwargs)

    def _inputs(self, run, args, kwargs):
        _, leaves, _, _ = self._split(args, kwargs)
        return [x.value_in(run) if isinstance(x, ShardedArray) else _replicated(run, x)
                for x in leaves]

    def _run(self, args, kwargs):
        mesh = _mesh_of(tree.flatten((args, kwargs))[0])
        run = JitRun(mesh)
        inputs = self._inputs(run, args, kwargs)
        program, out_tree, _ = self._program(run, args, kwargs, inputs)
        run.log.receive(run, [_piece(run, x, f"argument {k}") for k, x in enumerate(inputs)])
        try:
            with running(run):
                outs = eval_program(program, [], inputs)
                results = _results(run, outs)
        except Exception as exc:
            if getattr(exc, "trace", None) is None:
                exc.trace = _trace_of(run)
            self.trace = record_trace(exc.trace)
            raise
        for k, y in enumerate(results):
            if isinstance(y, ShardedArray):
                run.returned(y.stack, _piece(run, y, f"result {k}").detail)
        self.trace = record_trace(_trace_of(run, outs))
        self.trace.jaxpr = program
        return tree.unflatten(out_tree, results)

    # -- what JAX's jit also offers ---------------------------------------------------------------
    def traced(self, *args, **kwargs):
        """The program as ``make_jaxpr`` prints it: one ``jit`` equation holding the body."""
        mesh = _mesh_of(tree.flatten((args, kwargs))[0])
        avals = [x.aval for x in self._inputs(JitRun(mesh), args, kwargs)]
        out_tree = []

        def flat(*xs):
            out, treedef = tree.flatten(self._with(args, kwargs, xs))
            out_tree.append(treedef)
            return out
        program, _ = trace(flat, avals, JitRun(mesh, abstract=True))
        program.out_tree = out_tree[0]
        return program

    def _with(self, args, kwargs, leaves):
        """Call this function with the dynamic leaves of ``(args, kwargs)`` replaced."""
        _, _, treedef, static = self._split(args, kwargs)
        dyn, kw = tree.unflatten(treedef, list(leaves))
        it = iter(dyn)
        full = [args[k] if k in static else next(it) for k in range(len(args))]
        return self(*full, **dict(kw, **{k: v for k, v in kwargs.items()
                                          if k in self.static_argnames}))

    def lower(self, *args, **kwargs):
        """The program and, with ``.compile()``, what each device runs: the equations on
        blocks and the collectives jit inserts (``.as_text()`` prints it)."""
        return Lowered(self, args, kwargs)


def _piece(run, x, what):
    from ..machine.mesh import block_slices
    from .spmd import Piece
    spec, shape = Sharding(run.mesh, dims_of(x.aval)).spec, x.aval.shape
    text = str(ShapedArray(x.aval))

    def detail(k):
        index = block_slices(spec, run.mesh, shape, run.mesh.coords_of(k))
        rows = ", ".join(f"{s.start}:{s.stop}" if s.start is not None else f"0:{n}"
                         for s, n in zip(index, shape))
        return f"{what} [{rows}] of {text}" if shape else f"{what} of {text}"
    return Piece(x.stack, detail)


class Lowered:
    """``jit(f).lower(*args)``: the traced program, and its partitioned form."""

    def __init__(self, jitted, args, kwargs):
        self.jitted, self.args, self.kwargs = jitted, args, kwargs

    def as_text(self) -> str:
        return str(self.jitted.traced(*self.args, **self.kwargs))

    def compile(self) -> "Compiled":
        jitted, args, kwargs = self.jitted, self.args, self.kwargs
        mesh = _mesh_of(tree.flatten((args, kwargs))[0])
        run = JitRun(mesh, abstract=True, lowering=True)
        run.program = []
        inputs = [StackedValue(x.aval) for x in jitted._inputs(JitRun(mesh), args, kwargs)]
        program, _, _ = jitted._program(run, args, kwargs, inputs)
        with running(run):
            outs = eval_program(program, [], inputs)
            for o in outs:
                if isinstance(o, StackedValue):
                    run.settle(o)
        return Compiled(run, outs)


class Compiled:
    """What every device runs (simpmd's stand-in for XLA's compiled HLO): the equations
    on blocks, with the collectives jit inserted, and their log (``trace``), all without
    values. ``cost.roofline`` and the timelines read ``program``."""

    def __init__(self, run, outs):
        trace_ = _trace_of(run, outs)
        self.program, self.trace = trace_.program, trace_

    def as_text(self) -> str:
        return str(self.program)

    def collective_counts(self) -> dict:
        return collective_counts(self.trace)


def jit(fun=None, /, *, static_argnums=(), static_argnames=(), donate_argnums=(), **kwargs):
    """``jax.jit``: ``fun`` traced once per signature into a program of sharding-typed
    values, run on every device of the mesh its arguments live on. Usable as a decorator,
    with or without arguments."""
    if fun is None:
        return lambda f: Jitted(f, static_argnums, static_argnames, donate_argnums)
    return Jitted(fun, static_argnums, static_argnames, donate_argnums)


# -- what the trace of a jit run says, by HLO kind -----------------------------------------------

HLO_NAME = {"psum": "all-reduce", "pmax": "all-reduce", "pmin": "all-reduce", "pmean": "all-reduce",
            "psum_scatter": "reduce-scatter", "all_gather": "all-gather",
            "all_to_all": "all-to-all", "ppermute": "collective-permute"}


def collective_counts(trace_) -> dict:
    """How many collectives of each HLO kind a run did (one per call, all its groups
    together), e.g. ``{'all-reduce': 1}``: the numbers to hold beside XLA's HLO."""
    counts: dict = {}
    for call in trace_.calls():
        kind = HLO_NAME[call[0].op]
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


# -- grad of sharded arrays, and simpmd.numpy's functions on them --------------------------------


def grad(fun, argnums=0, has_aux=False):
    """``jax.grad`` (see ``simpmd.core.autodiff``); on sharded arrays outside any body it
    runs on their mesh, as JAX runs it op by op."""
    inner = _grad(fun, argnums, has_aux)

    @functools.wraps(inner)
    def grad_fun(*args, **kwargs):
        if context.run is None and holds_sharded((args, kwargs)):
            return on_mesh(inner, args, kwargs)
        return inner(*args, **kwargs)
    return grad_fun


def value_and_grad(fun, argnums=0, has_aux=False):
    """``jax.value_and_grad``; on sharded arrays outside any body it runs on their mesh."""
    inner = _value_and_grad(fun, argnums, has_aux)

    @functools.wraps(inner)
    def vg_fun(*args, **kwargs):
        if context.run is None and holds_sharded((args, kwargs)):
            return on_mesh(inner, args, kwargs)
        return inner(*args, **kwargs)
    return vg_fun


def call_numpy(name, fn, args, kwargs):
    """``simpmd.numpy.<name>`` on sharded arrays, or with ``out_sharding=`` on NumPy
    arrays while a mesh is set: the operation run on the mesh at once."""
    from . import spelling
    spelled = spelling.FUNCTIONS.get(name)
    if spelled is None:
        return on_mesh(lambda *a, **k: spelling.numpy_function(fn, a, k), args, kwargs)
    return on_mesh(spelled, args, kwargs)


_install_operators()


# -- shard_map inside jit: a shard_map equation ----------------------------------------------------


def shard_map_in_jit(mapped, args):
    """A ``simpmd.shard_map`` called in a jit body: its body traced once on the mesh's
    devices (each value one device's block, typed by the axes it varies over), one
    ``shard_map`` equation of the jit program. JAX places the operands by ``in_specs``
    first (a reshard where they are laid out otherwise)."""
    run = context.run
    if mapped.mesh != run.mesh:
        raise ShardingTypeError(f"shard_map over {mapped.mesh!r} inside jit over {run.mesh!r}: "
                                f"use the mesh of the jit's arrays (set_mesh).")
    manual = tuple(a for a in run.mesh.axis_names if not mapped.axis_names or a in mapped.axis_names)
    leaves, in_tree = tree.flatten(tuple(args))
    specs = tree.broadcast_prefix(mapped.in_specs if isinstance(mapped.in_specs, tuple)
                                  or len(args) != 1 else (mapped.in_specs,), tuple(args),
                                  what="in_specs")
    for spec in specs:
        if set(spec.mesh_axes()) - set(manual):
            raise ShardingTypeError(
                f"shard_map in_specs argument must refer to an axis marked as manual "
                f"({set(manual)}), got {spec!r} (JAX's words): the other axes belong to the "
                f"compiler inside this body, and the arrays' types carry them.")
    for x, spec in zip(leaves, specs):
        _check_in_spec(spec, aval_of(x), run.mesh, manual)
    body_avals = [_block_aval(aval_of(x), spec, run.mesh, mapped.check_vma, manual)
                  for x, spec in zip(leaves, specs)]
    out_tree = []

    def flat(*xs):
        out, treedef = tree.flatten(mapped.fun(*tree.unflatten(in_tree, list(xs))))
        out_tree.append(treedef)
        return out
    program, consts = trace(flat, body_avals, _body_run(run, manual, mapped.check_vma, True))
    out_specs = tree.broadcast_prefix(mapped.out_specs, tree.unflatten(
        out_tree[0], [0] * len(program.outvars)), what="out_specs")
    _check_replication(program, out_specs, mapped.check_vma)
    outs = bind(shard_map_p, *consts, *leaves, jaxpr=program, shard_mesh=MeshText(run.mesh),
                in_specs=tuple([PartitionSpec()] * len(consts) + list(specs)),
                out_specs=tuple(out_specs), check_vma=mapped.check_vma, manual_axes=manual)
    return tree.unflatten(out_tree[0], outs)


def _check_in_spec(spec, aval, mesh, manual):
    """JAX's shard_map inside jit takes its operands as their types lay them out over the
    manual axes (jax 0.7 resharded them; later releases refuse)."""
    if aval.sharding is None or not R.settings.shard_map_checks:
        return
    given = R.resolve(spec, _all_explicit(mesh), aval.ndim, "in_specs")
    have = [tuple(a for a in d if a in manual) for d in dims_of(aval)]
    if [tuple(d) for d in given] != have:
        raise ShardingTypeError(
            f"in_specs passed to shard_map: {spec!r} does not match the specs of the input: "
            f"{Sharding(mesh, have).spec!r} (JAX's words). Inside jit, shard_map takes its "
            f"operands as they are laid out: reshard them to {spec!r} first.")


def _body_run(run, manual, check_vma, abstract):
    """The run of a shard_map body: by hand over every mesh axis (a plain run of blocks),
    or over ``manual`` only, the others still typed by sharding (a jit run)."""
    if set(manual) == set(run.mesh.axis_names):
        body = Run(run.all_devices, run.axes, abstract=abstract, check_vma=check_vma,
                   maps_a_mesh=True)
    else:
        body = JitRun(run.mesh, abstract=abstract, manual=manual, check_vma=check_vma)
        body.program = run.program
    body.log = run.log
    if isinstance(body, JitRun):
        body.manual.log = run.log
    return body


def _block_aval(aval, spec, mesh, check_vma, manual):
    """One device's block of an operand: cut along ``spec`` (manual axes), still typed by
    its sharding over the others."""
    dims = R.resolve(spec, _all_explicit(mesh), aval.ndim, "in_specs")
    rest = [tuple(a for a in d if a not in manual) for d in dims_of(aval)]
    sharding = Sharding(mesh, rest) if set(manual) != set(mesh.axis_names) else None
    return Aval(R.block_shape(aval.shape, dims, mesh), aval.dtype, aval.weak_type,
                vma=frozenset(a for d in dims for a in d) if check_vma else frozenset(),
                sharding=sharding)


def _check_replication(program, out_specs, check_vma):
    for k, (v, spec) in enumerate(zip(program.outvars, out_specs)):
        missing = sorted(aval_of(v).vma - set(spec.mesh_axes())) if check_vma else []
        if missing:
            raise errors.SimpmdError(
                f"shard_map's out_specs {spec!r} for result {k} leaves out mesh axis "
                f"{missing[0]!r}, over which its type says it varies: JAX refuses this too "
                f"('out_specs which require replication which can't be statically "
                f"inferred'). Reduce it over {missing[0]!r} (lax.psum) or name the axis in "
                f"out_specs.")


def _sm_global(aval, spec, mesh):
    dims = R.resolve(spec, _all_explicit(mesh), aval.ndim, "out_specs")
    return Aval(tuple(n * count(mesh, d) for n, d in zip(aval.shape, dims)), aval.dtype,
                aval.weak_type)


def _sm_abstract(*avals, jaxpr, shard_mesh, in_specs, out_specs, check_vma, manual_axes):
    return [_sm_global(aval_of(v), s, shard_mesh.mesh) for v, s in zip(jaxpr.outvars, out_specs)]


def _sm_rule(mesh, avals, jaxpr, in_specs, out_specs, **params):
    """A result's type: split over the Explicit axes its out_specs name (major), then over
    those its type in the body had (minor)."""
    explicit = set(R.explicit_axes(mesh))
    return [tuple(tuple(a for a in d if a in explicit) + inner for d, inner in zip(
        R.resolve(s, _all_explicit(mesh), aval_of(v).ndim, "out_specs"), dims_of(aval_of(v))))
        for v, s in zip(jaxpr.outvars, out_specs)]


def _sm_stacked(*args, jaxpr, shard_mesh, in_specs, out_specs, check_vma, manual_axes):
    """Each operand moved to its ``in_specs`` blocks, the body run on the blocks (its
    collectives logged as the learner's), the results' blocks laid out as their types."""
    run, mesh = context.run, context.run.mesh
    blocks = []
    for x, spec, var in zip(args, in_specs, jaxpr.constvars + jaxpr.invars):
        a = aval_of(x)
        want = [d + tuple(b for b in own if b not in manual_axes) for d, own in
                zip(R.resolve(spec, _all_explicit(mesh), a.ndim, "in_specs"), dims_of(a))]
        v = run._block(x, a, want, "jit: shard_map")
        blocks.append(StackedValue(var.aval, v.stack if isinstance(v, StackedValue) else
                                   run.manual.stack_of(v, var.aval)))
    body = _body_run(run, manual_axes, check_vma, run.abstract)
    n = len(jaxpr.constvars)
    with running(body):
        outs = eval_program(jaxpr, blocks[:n], blocks[n:])
        outs = [body.settle(o) if isinstance(body, JitRun) and isinstance(o, StackedValue)
                else o for o in outs]
    if run.program is not None and not isinstance(body, JitRun):
        run.program.extend(jaxpr.eqns)
    stacks = []
    for o, spec, dims in zip(outs, out_specs, _sm_rule(mesh, [], jaxpr, in_specs, out_specs)):
        a = aval_of(o)
        have = [d + inner for d, inner in
                zip(R.resolve(spec, _all_explicit(mesh), a.ndim, "out_specs"), dims_of(a))]
        local = StackedValue(Aval(R.block_shape(a.shape, dims_of(a), mesh), a.dtype, a.weak_type),
                             body.stack_of(o, a) if not run.abstract else None)
        if isinstance(body, JitRun):
            body.alias(local, o)
        elif run.program is not None:
            run.names[id(local)] = (local, o_var(jaxpr, outs, o))
        moved = run.move(local, _sm_global(a, spec, mesh).shape, have, dims, "jit: shard_map")
        stacks.append(moved.stack)
        run.returned_values.append(moved)
    return stacks


def o_var(jaxpr, outs, o):
    """The body program's variable that result ``o`` came from."""
    return jaxpr.outvars[[id(x) for x in outs].index(id(o))]


def _sm_vjp(cts, ins, outs, wants, jaxpr, shard_mesh, in_specs, out_specs, check_vma,
            manual_axes):
    """The derivative of a shard_map is a shard_map: its body run again on the blocks,
    then sent backwards (the cotangents arrive in out_specs' blocks, leave in in_specs')."""
    run = context.run
    cts = [ct if ct is not None else _zeros_like(o) for ct, o in zip(cts, outs)]
    n, invars = len(ins), jaxpr.constvars + jaxpr.invars
    wanted = [k for k, w in enumerate(wants) if w]

    def flat(*xs):
        env: dict = {}
        k = len(jaxpr.constvars)
        eval_program(jaxpr, list(xs[:k]), list(xs[k:n]), env)
        seeds = {v: c for v, c in zip(jaxpr.outvars, xs[n:]) if type(v) is Var}
        got = backward(jaxpr.eqns, env, seeds, {invars[k] for k in wanted})
        return [got.get(invars[k], np.zeros(invars[k].aval.shape, invars[k].aval.dtype))
                for k in wanted]
    body = _body_run(run, manual_axes, check_vma, True)
    program, _ = trace(flat, [v.aval for v in invars] + [aval_of(v) for v in jaxpr.outvars], body)
    got = bind(shard_map_p, *ins, *cts, jaxpr=program, shard_mesh=shard_mesh,
               in_specs=tuple(in_specs) + tuple(out_specs),
               out_specs=tuple(in_specs[k] for k in wanted), check_vma=check_vma,
               manual_axes=manual_axes)
    out = [None] * n
    for k, g in zip(wanted, got):
        out[k] = g
    return out


def _zeros_like(x):
    a = aval_of(x)
    from ..core import primitives as P
    return bind(P.broadcast_in_dim, np.zeros((), a.dtype), shape=a.shape, broadcast_dimensions=(),
                sharding=a.sharding)


shard_map_p = Primitive(
    "shard_map", _sm_stacked, _sm_abstract, vjp=_sm_vjp, multiple_results=True, needs_run=True,
    cost=lambda ins, outs, **p: (0, 0),
    show=lambda p: [("check_vma", p["check_vma"]), ("in_specs", p["in_specs"]),
                    ("jaxpr", p["jaxpr"]), ("manual_axes", p["manual_axes"]),
                    ("mesh", p["shard_mesh"]), ("out_specs", p["out_specs"])])
shard_map_p.sharding = _sm_rule
