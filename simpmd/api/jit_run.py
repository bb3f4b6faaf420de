"""The run of a ``jit`` program: every device of a mesh, each value a block per device.

A :class:`JitRun` is the run ``bind`` asks while a jit program runs (or is traced). A
value's type is its global shape with its sharding (``f32[16@data,64@model]``); its stack
holds every device's block. For each equation the run gives the result its sharding by
the row's rule (``partition.py``), then follows the row's plan: operands moved to the
layout the plan needs, the same primitive on blocks, partial sums combined, results moved
to the layout their type says. Moving is done with the core's collective rows on a plain
run over the same devices, so what jit inserts is logged, drawn and costed as a
collective a learner wrote (``params['inserted']`` names the primitive that needed it),
and each step is also written down as the program one device runs (``Jitted.lower``).

The rows jit adds live here too: ``jit`` (a jitted function called inside another body,
JAX's ``pjit``), ``reshard``, ``dynamic_slice`` (a device cutting its piece of its own
block) and ``shard_map`` (a shard_map called inside jit, manual over all axes or over
``axis_names``).
"""
from __future__ import annotations

import numpy as np

from ..core import core as C, dtypes, errors, loops
from . import tree
from ..core import collectives as K
from ..core.autodiff import backward
from ..core.core import Aval, Primitive, Var, aval_of, bind, context, running
from ..core.program import Equation, Recorder, cached, eval_program, store, trace
from ..core.run import Run
from ..core.values import StackedValue
from ..machine.mesh import PartitionSpec, axis_types_of
from . import partition as R
from . import reductions
from .partition import Sharding, ShardingTypeError, all_explicit, count, dims_of

R.attach()
reductions.attach()


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
        # what each device runs, written down by the core's recorder as it runs
        self.blocks = Recorder(open_inputs=True) if not abstract or lowering else None

    def tracing(self) -> "JitRun":
        return JitRun(self.mesh, abstract=True, manual=self.manual_axes, check_vma=self.check_vma)

    def prepare(self, prim, args, params):
        return super().prepare(prim, args, params) if self.manual_axes else args

    def _by_hand(self, prim, params) -> bool:
        """A collective over the manual axes of a shard_map(axis_names=...) body."""
        names = params.get("axes", params.get("axis_name"))
        names = names if isinstance(names, (tuple, list)) else (names,)
        return (prim.collective or getattr(prim, "by_axes", False)) and bool(self.manual_axes) and \
            set(names) <= set(self.manual_axes)

    def apply(self, prim, args, params):
        if self._by_hand(prim, params):
            outs = super().apply(prim, args, params)
            self._record(prim, params, args, outs)
            return outs
        if prim.collective or getattr(prim, "by_axes", False):
            raise errors.UnboundAxisError(
                f"{prim.name} over {params.get('axes', params.get('axis_name'))} inside jit, "
                f"outside shard_map: under jit the compiler writes the collectives, and a "
                f"named axis exists only inside shard_map (real JAX: 'unbound axis name'). "
                f"Write the computation for whole arrays, or wrap the per-device part in "
                f"simpmd.shard_map.")
        rule = getattr(prim, "sharding", None)
        if rule is None:
            raise ShardingTypeError(f"{prim.name} has no sharding rule in simpmd, so it cannot "
                                    f"run under jit outside shard_map.")
        avals = [aval_of(x) for x in args]
        out = prim.abstract(*avals, **params)
        outs = list(out) if prim.multiple_results else [out]
        layouts = rule(self.mesh, avals, **params)
        kinds = reductions.types(prim, avals, params, len(outs), self.mesh)
        outs = [o.update(vma=o.vma if self.manual_axes else frozenset(),
                         sharding=Sharding(self.mesh, d, *k))
                for o, d, k in zip(outs, layouts, kinds)]
        for o in outs:
            R.check_layout(self.mesh, o.shape, o.sharding.dims, prim.name)
        traced = self.abstract or any(isinstance(x, StackedValue) and x.stack is None for x in args)
        if traced and not self.lowering:
            return [StackedValue(o) for o in outs]
        return self.compute(prim, args, params, avals, outs)

    def compute(self, prim, args, params, avals, out_avals) -> list:
        """Every device's block of ``prim``'s results, their types known (from the rule, or,
        replaying a program, from its equation)."""
        if self._by_hand(prim, params):
            outs = super().compute(prim, args, params, avals, out_avals)
            self._record(prim, params, args, outs)
            return outs
        if getattr(prim, "needs_run", False):         # it runs programs of its own, here
            results = []
            for o, r in zip(out_avals, prim.stacked(*args, **params)):
                body = isinstance(r, StackedValue)          # a body's result: its blocks
                results.append(StackedValue(o, self.stack_of(r, o) if body else r))
                self.alias(results[-1], r)
            return results
        return self._compute(prim, args, avals, out_avals, params)

    def block_shape(self, aval) -> tuple:
        return R.block_shape(aval.shape, dims_of(aval), self.mesh)

    def stack_of(self, x, aval):
        if isinstance(x, StackedValue):
            return self.settle(x).stack
        return super().stack_of(x, aval)

    # -- one equation, device by device ---------------------------------------------------------
    def _compute(self, prim, args, avals, outs, params):
        """The equation's plan: operands moved to the layout it needs, the primitive on
        blocks, partial sums combined, results moved to the layout their type says."""
        resolves = getattr(prim, "resolves_sums", False)         # reshard
        found = self._pending(args[0]) if args else None
        if found is not None and not (resolves or self._carries(prim, found, outs)):
            found = None
        if resolves:
            found = self._reducing(args[0], avals[0], outs[0], found)
        args = [x if (k == 0 and found) or not isinstance(x, StackedValue) else self.settle(x)
                for k, x in enumerate(args)]
        plan = (getattr(prim, "partition", None) or R.computed_whole)(avals, outs, **params)
        cause = f"jit: {prim.name}"
        resharding = found if resolves else None
        values = [self._block(x, a, want, cause, scatter=resharding if k == 0 else None)
                  for k, (x, a, want) in enumerate(zip(args, avals, plan.ins))]
        results = values if plan.params is None else self._local(prim, values, plan.params)
        if plan.then is not None:
            results = [plan.then(self, r, cause) for r in results]
        carried = list(found[1]) if found is not None and not resolves else []
        out = []
        for r, layout, o in zip(results, plan.out, outs):
            r, layout, pending = self._combine(r, layout, plan.sums, o.sharding.dims, cause,
                                               defer=getattr(prim, "defers_sums", False))
            pending = [axes for axes in pending if not set(axes) <= o.sharding.unreduced]
            moved = self.move(r, o.shape, layout, o.sharding.dims, cause)
            if resolves:
                moved = self._unreducing(moved, avals[0], o, cause)
            value = StackedValue(o, moved.stack)
            self.alias(value, moved)
            if pending or carried:
                self.partial[id(value)] = (value, pending + carried) + (
                    found[2:] if carried else (context.eqn, context.phase))
            out.append(value)
        return out

    def _reducing(self, x, aval, out, found):
        """A reshard from unreduced: the axes it leaves are summed, as pending sums are (a
        reduce-scatter where the new layout splits a dimension over them)."""
        leaving = getattr(aval.sharding, "unreduced", frozenset()) - out.sharding.unreduced
        if not leaving or not isinstance(x, StackedValue):
            return found
        axes = tuple(a for a in self.mesh.axis_names if a in leaving)
        return (x, [axes], context.eqn, context.phase)

    def _unreducing(self, v, aval, out, cause):
        """A reshard to unreduced: the value becomes partial sums over the new axes. As
        JAX does it (0.10 on), a dimension that was split over them keeps each device's
        block in its place, zeros elsewhere; a replicated value stays on the first device
        along them, zeros on the others. No communication."""
        new = out.sharding.unreduced - getattr(aval.sharding, "unreduced", frozenset())
        if not new or self.abstract or v.stack is None:
            return v
        src = dims_of(aval)
        stack = np.array(v.stack)
        sizes = dict(self.mesh.shape)
        keep = np.ones(len(stack), dtype=bool)
        for k in range(len(stack)):
            coords = self.mesh.coords_of(k)
            for d, axes in enumerate(src):
                split = [a for a in axes if a in new]
                if split:
                    pos = 0
                    for a in axes:
                        pos = pos * sizes[a] + coords[a]
                    n = aval.shape[d] // R.count(self.mesh, axes)
                    index = [slice(None)] * stack.ndim
                    index[d + 1] = np.r_[0:pos * n, (pos + 1) * n:aval.shape[d]]
                    stack[(k, *index[1:])] = 0
            alone = [a for a in new if not any(a in axes for axes in src)]
            if any(coords[a] for a in alone):
                keep[k] = False
        stack[~keep] = 0
        return StackedValue(v.aval, stack)

    def _pending(self, x):
        found = self.partial.get(id(x)) if isinstance(x, StackedValue) else None
        return found if found is not None and found[0] is x else None

    def _carries(self, prim, found, outs):
        """A layout-only, linear primitive passes pending partial sums on (the transpose
        of a product's partial sums is the partial sums of its transpose)."""
        carries = getattr(prim, "carries_sums", None)
        if carries is None or not carries(found[0].aval, outs[0]):
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
        if scatter is not None:
            local, cur = self._scatter(x, local, cur, want, scatter)
        return self.move(local, aval.shape, cur, want, cause)

    def _scatter(self, x, local, cur, want, found):
        """A reshard of pending partial sums: a reduce-scatter for each sum whose axes the
        new layout splits a dim over, an all-reduce for the others."""
        _, sums, eqn, phase = found          # (x itself stays a partial sum, for other uses)
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
        if self.blocks is not None:
            self.blocks.record(prim, params, ins, outs)

    def alias(self, new, old):
        """``new`` holds the same blocks as ``old`` (a value and its blocks' view)."""
        if self.blocks is not None and isinstance(new, StackedValue) and isinstance(old, StackedValue):
            self.blocks.alias(new, old)

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
        for row, axes in sums:
            axes = tuple(axes)
            d = next((d for d in range(len(target)) if row is K.psum and
                      target[d][:len(layout[d]) + len(axes)] == tuple(layout[d]) + axes), None)
            if d is not None:
                r = self.insert(K.reduce_scatter, r, cause, scatter_dimension=d, axis_name=axes,
                                axis_index_groups=None, axis_size=count(self.mesh, axes),
                                tiled=True)
                layout[d] = tuple(layout[d]) + axes
            elif row is K.psum and defer and not used & set(axes):
                pending.append(axes)
            else:
                r = self.insert(row, r, cause, axes=axes, axis_index_groups=None)
        return r, tuple(layout), pending




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
    "shard_slice", _cut, _cut_abstract, needs_run=True,
    cost=lambda ins, outs, **p: (0, sum(a.nbytes for a in (*ins, *outs))))


# -- the rows jit adds: a jit equation, and reshard ---------------------------------------------


def _jit_stacked(*args, jaxpr, name, ctx_mesh=None, _vjp=None):
    """The inner program on this run: its results (values, whose blocks a jit run keeps)."""
    return eval_program(jaxpr, [], list(args))


def _jit_linearize(eqn, wants):
    """The jit, cut as JAX's partial evaluation cuts a ``pjit``: the forward jit also
    returns the residuals, and its derivative is a second jit of the same name."""
    forward, backward, split = loops.split_call(eqn.params["jaxpr"], wants)
    return Equation(eqn.primitive, dict(eqn.params, jaxpr=forward, _vjp=(backward, split)),
                    eqn.invars, eqn.outvars + [Var(v.aval) for v in
                                               forward.outvars[len(eqn.outvars):]],
                    eqn.source, eqn.phase)


def _jit_vjp(cts, ins, outs, wants, jaxpr, name, ctx_mesh=None, _vjp=None):
    """The backward half of a linearized jit equation, as a jit equation of its own."""
    backward, split = _vjp
    return loops.split_vjp(cts, ins, outs, split, lambda operands: bind(
        jit_p, *operands, jaxpr=backward, name=name, ctx_mesh=ctx_mesh))


jit_p = Primitive(
    "jit", _jit_stacked, lambda *avals, jaxpr, **p: [aval_of(v) for v in jaxpr.outvars],
    vjp=_jit_vjp, multiple_results=True, needs_run=True, cost=lambda ins, outs, **p: (0, 0),
    linearize=_jit_linearize, same_names=True, show=lambda p: [("name", p["name"])] + ([("ctx_mesh", p["ctx_mesh"])] if p.get("ctx_mesh") else [])
    + [("jaxpr", p["jaxpr"])])
jit_p.sharding = lambda mesh, avals, jaxpr, **p: [dims_of(aval_of(v)) for v in jaxpr.outvars]


def _reshard_vjp(ct, ins, outs, wants, dst_sharding):
    back = aval_of(ins[0]).sharding
    back = back.cotangent() if back is not None else PartitionSpec()   # reduced <-> unreduced
    return [bind(reshard_p, ct, dst_sharding=back) if wants[0] else None]


reshard_p = Primitive("reshard", lambda x, dst_sharding: x, lambda x, dst_sharding: x,
                      vjp=_reshard_vjp, cost=lambda ins, outs, **p: (0, 0), show=lambda p: {})
reshard_p.sharding, reshard_p.partition = R.reshard_rule, R.reshard_plan
reshard_p.resolves_sums = True       # pending partial sums end here: a reduce-scatter each
reshard_p.unreduced_rule = "reshard"   # its destination says what is unreduced or reduced
jit_p.unreduced_rule, jit_p.unreduced_body = "body", "jaxpr"


# -- a jitted function called inside another body: one jit equation ------------------------------


def arg_aval(x):
    """The type JAX gives a plain argument (64-bit numbers as 32-bit, without x64)."""
    if dtypes.is_weak_scalar(x):
        return aval_of(x)
    a = np.asarray(x)
    return Aval(a.shape, dtypes.canonical(a.dtype))


def split_static(args, kwargs, statics):
    """(the static arguments, as a key), the dynamic leaves, their tree, and the static
    positions, for ``statics`` = (static_argnums, static_argnames)."""
    argnums, argnames = statics
    n = len(args)
    static = {a % n for a in argnums} if n else set()
    fixed = tuple((k, args[k]) for k in sorted(static))
    fixed += tuple((k, kwargs[k]) for k in sorted(kwargs) if k in argnames)
    dynamic = ([a for k, a in enumerate(args) if k not in static],
               {k: v for k, v in kwargs.items() if k not in argnames})
    leaves, treedef = tree.flatten(dynamic)
    return fixed, leaves, treedef, static


def traced_call(fun, run, args, kwargs, statics=((), ()), leaves=None):
    """(program, results' tree, dynamic leaves) for ``fun(*args, **kwargs)``, traced on
    ``run``'s grid the first time its signature (the static arguments, the leaves' types,
    the run) is seen; values it closes over become its first inputs, as JAX passes them."""
    fixed, found, treedef, static = split_static(args, kwargs, statics)
    leaves = found if leaves is None else leaves
    avals = tuple(aval_of(x) if isinstance(x, StackedValue) else arg_aval(x) for x in leaves)
    where = (type(run).__name__, run.axes, run.check_vma, getattr(run, "mesh", None))
    key = ("jit", fixed, treedef, avals, where)
    entry = cached(fun, key)
    if entry is not None:
        return entry[0], entry[1], leaves
    out_trees = []

    def flat(*xs):
        dyn, kw = tree.unflatten(treedef, list(xs))
        it = iter(dyn)
        full = [args[k] if k in static else next(it) for k in range(len(args))]
        kw = dict(kw, **{k: v for k, v in kwargs.items() if k in statics[1]})
        out, out_tree = tree.flatten(fun(*full, **kw))
        out_trees.append(out_tree)
        return out
    program, lifted = trace(flat, list(avals), run.tracing())
    if lifted:        # it closed over an enclosing body's values: JAX passes them first
        return loops.closed(program), out_trees[0], list(lifted) + list(leaves)
    store(fun, key, (program, out_trees[0]))
    return program, out_trees[0], leaves


def call_in_body(fun, args, kwargs=None, statics=((), ()), name=None):
    """``fun`` called inside another body (jit's, or a jnp function JAX jits): one ``jit``
    equation, named ``name`` (the function's own by default)."""
    run = context.run
    program, out_tree, leaves = traced_call(fun, run, args, kwargs or {}, statics)
    mesh = getattr(run, "mesh", None)
    outs = bind(jit_p, *leaves, jaxpr=program, name=name or getattr(fun, "__name__", "fun"),
                ctx_mesh=MeshText(mesh) if mesh is not None and mesh.axis_names else None)
    return tree.unflatten(out_tree, outs)


class MeshText:
    """How a jit equation prints its mesh: ``Mesh('data': 2, 'model': 4, axis_types=(...))``."""

    def __init__(self, mesh):
        self.mesh = mesh

    def __repr__(self):
        sizes = ", ".join(f"{n!r}: {s}" for n, s in self.mesh.shape.items())
        types = ", ".join(t.name for t in axis_types_of(self.mesh))
        return f"Mesh({sizes}, axis_types=({types}{',' if len(self.mesh.axis_names) == 1 else ''}))"


def per_device_program(run, outs=()):
    """What each device of ``run`` ran, as a program: its inputs are the blocks no step
    made, its results the blocks of ``outs``."""
    from ..core.core import Program
    eqns = run.blocks.eqns if run.blocks is not None else []
    made = {v for e in eqns for v in e.outvars}
    invars = []
    for e in eqns:
        invars += [v for v in e.invars if type(v) is Var and v not in made and v not in invars]
    outvars = [run.blocks.var_of(o) for o in outs if isinstance(o, StackedValue)] \
        if run.blocks is not None else []
    return Program(invars, eqns, outvars, axis_env=tuple(run.mesh.shape.items()))
