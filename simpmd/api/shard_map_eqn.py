"""A ``shard_map`` called inside another body: one ``shard_map`` equation, as in JAX.

Called at the top level, ``simpmd.shard_map`` runs its body at once (``shard_map.py``).
Called where a body is being traced or run, it is one equation of that body's program,
holding its own body, traced once on one device's blocks (each typed by the mesh axes it
varies over): inside ``jit`` on the same mesh (manual over all axes, or over
``axis_names``), and wherever no mesh is set up yet (plain NumPy differentiated by
``grad``, a ``jit`` of NumPy arguments), where JAX places the operands on the
shard_map's mesh, whole, and brings the results back.

Its derivative is cut as JAX's partial evaluation cuts it (``loops.split_call``): the
forward shard_map also returns the residuals, one block per device (each laid out over
the axes it varies over, a scalar given a leading axis of 1), and the backward pass is a
second shard_map that takes them with the results' cotangents.
"""
from __future__ import annotations

import weakref

import numpy as np

from ..core import core, errors, loops
from ..partitioner.columns import register
from ..core import collectives as K
from ..core import primitives as P
from ..core.core import Aval, Equation, Primitive, Var, aval_of, bind, context, running
from ..core.program import eval_program, trace
from ..core.run import Run
from ..core.values import StackedValue
from ..machine.array import HostArray, Shard
from ..machine.mesh import (NamedSharding, PartitionSpec, block_slices, join_blocks,
                            replica_id)
from ..core.core import Program
from ..partitioner import sharding as R
from ..partitioner.partition import BODIES, BlockRun, partition
from ..partitioner.rows import MeshText
from ..partitioner.shard_map import partition_shard_map, sm_abstract as _sm_abstract
from ..partitioner.shard_map import sm_global as _sm_global, sm_rule as _sm_rule
from ..partitioner.sharded import ShardingRun
from ..partitioner.sharding import Sharding, ShardingTypeError, all_explicit, dims_of, whole
from . import tree
from .spmd import record_trace
from .trace import Trace


def shard_map_equation(mapped, args):
    """A ``simpmd.shard_map`` called in a body: its body traced once on the mesh's
    devices, one ``shard_map`` equation of the enclosing program. JAX places the operands
    by ``in_specs`` first (a reshard where they are laid out otherwise)."""
    run, mesh = context.run, mapped.mesh
    if run.axes and getattr(run, "mesh", None) != mesh:
        raise ShardingTypeError(f"shard_map over {mesh!r} inside jit over {run.mesh!r}: "
                                f"use the mesh of the jit's arrays (set_mesh).")
    # Inside another shard_map's body, the axes it is manual over stay manual here too.
    outer = set(getattr(run, "manual_axes", ()))
    manual = tuple(a for a in mesh.axis_names
                   if not mapped.axis_names or a in mapped.axis_names or a in outer)
    leaves, in_tree = tree.flatten(tuple(args))
    specs = tree.broadcast_prefix(mapped.in_specs if isinstance(mapped.in_specs, tuple)
                                  or len(args) != 1 else (mapped.in_specs,), tuple(args),
                                  what="in_specs")
    fixed = {k: x for k, (x, spec) in enumerate(zip(leaves, specs)) if spec is None}
    leaves, specs = ([v for k, v in enumerate(vs) if k not in fixed] for vs in (leaves, specs))
    _check_in_specs(specs, leaves, mesh, manual)       # (in_specs None: a static argument)
    body_avals = [_block_aval(aval_of(x), spec, mesh, mapped.check_vma, manual)
                  for x, spec in zip(leaves, specs)]
    out_tree = []

    def flat(*xs):
        it = iter(xs)
        full = [fixed[k] if k in fixed else next(it) for k in range(len(fixed) + len(xs))]
        out, treedef = tree.flatten(mapped._body(*tree.unflatten(in_tree, full)))
        out_tree.append(treedef)
        return out
    program, consts = trace(flat, body_avals, body_run(mesh, manual, mapped.check_vma))
    out_specs = tree.broadcast_prefix(mapped.out_specs, tree.unflatten(
        out_tree[0], [0] * len(program.outvars)), what="out_specs")
    _check_replication(program, out_specs, mapped.check_vma, outer)
    outs = bind(shard_map_p, *consts, *leaves, jaxpr=loops.closed(program),
                shard_mesh=MeshText(mesh), check_vma=mapped.check_vma, manual_axes=manual,
                _outer_axes=tuple(a for a in manual if a in outer),
                in_specs=tuple([PartitionSpec()] * len(consts) + list(specs)),
                out_specs=tuple(out_specs))
    return tree.unflatten(out_tree[0], outs)


def _check_in_specs(specs, leaves, mesh, manual):
    for spec in specs:
        if set(spec.mesh_axes()) - set(manual):
            raise ShardingTypeError(
                f"shard_map in_specs argument must refer to an axis marked as manual "
                f"({set(manual)}), got {spec!r} (JAX's words): the other axes belong to the "
                f"compiler inside this body, and the arrays' types carry them.")
    for x, spec in zip(leaves, specs):
        _check_in_spec(spec, aval_of(x), mesh, manual)


def _check_in_spec(spec, aval, mesh, manual):
    """JAX's shard_map takes its operands as their types lay them out over the manual
    Explicit axes (jax 0.7 resharded them; later releases refuse): a NumPy array is whole,
    so an Explicit mesh refuses to split it, while on Auto axes the compiler places it."""
    if not R.settings.shard_map_checks:
        return
    explicit = set(R.explicit_axes(mesh)) & set(manual)
    given = [tuple(a for a in d if a in explicit)
             for d in R.resolve(spec, all_explicit(mesh), aval.ndim, "in_specs")]
    layout = dims_of(aval) if aval.sharding is not None and aval.sharding.mesh == mesh \
        else whole(aval.ndim)
    have = [tuple(a for a in d if a in explicit) for d in layout]
    held = aval.sharding.unreduced if aval.sharding is not None and aval.sharding.mesh == mesh \
        else frozenset()
    if spec.unreduced != held:
        raise ShardingTypeError(
            f"in_specs containing unreduced {spec!r} passed to shard_map should be equal to "
            f"the unreduced present on the in_aval {R.type_text(aval)} (JAX's words). An "
            f"unreduced in_specs hands each device its part of a sum, so the operand must "
            f"hold partial sums over exactly those axes: "
            + (f"reshard it to {spec!r} first." if not held else
               f"write in_specs=P(..., unreduced={set(held)!r})."))
    if given != have:
        raise ShardingTypeError(
            f"in_specs passed to shard_map: {spec!r} does not match the specs of the input: "
            f"{Sharding(mesh, have).spec!r} for arg: {R.type_text(aval)} (JAX's words). "
            f"shard_map takes its operands as their types lay them out over Explicit axes: "
            f"reshard (or device_put) them to {spec!r} first.")


def body_run(mesh, manual, check_vma):
    """The run a shard_map body is traced on: by hand over every mesh axis (a plain run of
    blocks), or over ``manual`` only, the others still typed by sharding."""
    if set(manual) == set(mesh.axis_names):
        return Run(list(mesh.devices.flat), tuple(mesh.shape.items()), abstract=True,
                   check_vma=check_vma, maps_a_mesh=True)
    return ShardingRun(mesh, manual=manual, check_vma=check_vma)


def _block_aval(aval, spec, mesh, check_vma, manual):
    """One device's block of an operand: cut along ``spec`` (manual axes), still typed by
    its sharding over the others."""
    dims = R.resolve(spec, all_explicit(mesh), aval.ndim, "in_specs")
    own = dims_of(aval) if aval.sharding is not None and aval.sharding.mesh == mesh \
        else whole(aval.ndim)
    rest = [tuple(a for a in d if a not in manual) for d in own]
    sharding = Sharding(mesh, rest) if set(manual) != set(mesh.axis_names) else None
    held = getattr(aval.sharding, "unreduced", frozenset()) & frozenset(spec.unreduced)
    return Aval(R.block_shape(aval.shape, dims, mesh), aval.dtype, aval.weak_type,
                vma=aval.vma | frozenset(a for d in dims for a in d) if check_vma else frozenset(),
                sharding=sharding, unreduced=held & set(manual) if check_vma else frozenset())


def _check_replication(program, out_specs, check_vma, outer=()):
    """Under check_vma, a result must not vary over a newly manual axis its out_specs
    leaves out (the axes of an enclosing shard_map stay varying outside)."""
    for k, (v, spec) in enumerate(zip(program.outvars, out_specs)):
        if check_vma and spec.unreduced != aval_of(v).unreduced:
            raise ShardingTypeError(
                f"out_specs passed to shard_map should be equal to the unreduced present on "
                f"the out_aval. Got out_specs={spec!r} and out_aval={aval_of(v).str_short()} "
                f"(JAX's words). " + (
                    f"Result {k} holds partial sums over {sorted(aval_of(v).unreduced)}: name "
                    f"them in out_specs (P(..., unreduced={set(aval_of(v).unreduced)!r})) or "
                    f"sum them first (lax.psum)." if aval_of(v).unreduced else
                    f"Make result {k} the parts of a sum first: lax.pcast(x, "
                    f"{tuple(sorted(spec.unreduced))!r}, to='unreduced')."))
        missing = sorted((aval_of(v).vma | aval_of(v).unreduced | aval_of(v).reduced)
                         - set(spec.mesh_axes()) - set(spec.unreduced) - set(spec.reduced)
                         - set(outer)) if check_vma else []
        if missing:
            raise errors.SimpmdError(
                f"shard_map's out_specs {spec!r} for result {k} leaves out mesh axis "
                f"{missing[0]!r}, over which its type says it "
                f"{'is reduced' if missing[0] in aval_of(v).reduced else 'varies'}: JAX "
                f"refuses this too ('out_specs which require replication which can't be "
                f"statically inferred'). Reduce it over {missing[0]!r} (lax.psum) or name the "
                f"axis in out_specs" + (f" (P(reduced={{{missing[0]!r}}}))." if missing[0] in
                                        aval_of(v).reduced else "."))


# -- the row -------------------------------------------------------------------------------


def _sm_stacked(*args, jaxpr, shard_mesh, in_specs, out_specs, check_vma, manual_axes,
                _vjp=None, _outer_axes=()):
    """A shard_map where no jit partitions it (plain NumPy under ``grad``, a jit of NumPy
    arguments): the operands, whole, placed on the shard_map's mesh as JAX places them;
    the equation partitioned and run there; the results brought back whole."""
    run = context.run or core.plain
    params = dict(jaxpr=jaxpr, shard_mesh=shard_mesh, in_specs=in_specs, out_specs=out_specs,
                  check_vma=check_vma, manual_axes=manual_axes)
    mesh = shard_mesh.mesh
    invars = [Var(aval_of(x).update(sharding=Sharding(mesh, whole(aval_of(x).ndim))))
              for x in args]
    dims = _sm_rule(mesh, [], jaxpr, in_specs, out_specs, shard_mesh)
    outvars = [Var(a.update(sharding=Sharding(mesh, d)))
               for a, d in zip(_sm_abstract(jaxpr=jaxpr, shard_mesh=shard_mesh,
                                            out_specs=out_specs), dims)]
    local = partition(Program(invars, [Equation(shard_map_p, params, invars, outvars)], outvars),
                      mesh)
    inner = BlockRun(mesh)
    if isinstance(run, BlockRun):             # its collectives join the jit's log
        inner.log = run.log
    values = []
    for x, v in zip(args, local.invars):
        stack = run.stack_of(x, aval_of(x))[:1]
        values.append(StackedValue(v.aval, np.broadcast_to(stack, (inner.n,) + stack.shape[1:])))
    with running(inner):
        stacks = [inner.stack_of(o, aval_of(o)) for o in eval_program(local, [], values)]
    out = []
    for d, s, kept in zip(dims, stacks, local.out_layouts):
        value = join_blocks(np.asarray(s), Sharding(mesh, kept or d).spec, mesh)
        out.append(np.broadcast_to(value, (run.n,) + value.shape))
    if not isinstance(run, BlockRun):
        record_trace(Trace(log=inner.log, devices=inner.devices))
        for stack, spec in zip(out, out_specs):
            _place(stack, spec, mesh)
    return out


_PLACED: dict = {}      # id(stack) -> (a weak reference to it, its mesh and spec)


def _place(stack, spec, mesh):
    """Remember that a plain run's shard_map left ``stack`` laid out by ``spec`` on
    ``mesh``: JAX's result is an array sharded so, which grad and checkpoint hand back."""
    key = id(stack)
    _PLACED[key] = (weakref.ref(stack, lambda _, key=key: _PLACED.pop(key, None)), (mesh, spec))


def placement(stack):
    """(mesh, spec) of a stack a plain run's shard_map returned, or None."""
    entry = _PLACED.get(id(stack))
    return entry[1] if entry is not None and entry[0]() is stack else None


class MeshArray(HostArray):
    """A result of ``simpmd.shard_map``: a NumPy-like global array laid out by a
    :class:`~simpmd.core.mesh.NamedSharding`, with ``.addressable_shards`` like a ``jax.Array``."""

    def __init__(self, value: np.ndarray, sharding: NamedSharding):
        self._value = value
        self.sharding = sharding

    @property
    def addressable_shards(self) -> list:
        mesh, spec, v = self.sharding.mesh, self.sharding.spec, self._value
        shards = []
        for k, d in enumerate(mesh.devices.flat):
            coords = mesh.coords_of(k)
            index = block_slices(spec, mesh, v.shape, coords)
            shards.append(Shard(d, index, v[index], replica_id(spec, mesh, coords)))
        return shards


def host_result(stack):
    """A plain run's result seen from the host: one device's NumPy array, or, where a
    shard_map left it laid out on its mesh, a MeshArray sharded so (as JAX's grad and
    checkpoint of an eager shard_map return arrays sharded by its specs)."""
    value = np.asarray(stack[0])
    placed = placement(stack)
    if placed is None:
        return value
    mesh, spec = placed
    return MeshArray(value, NamedSharding(mesh, spec))


# -- its derivative ------------------------------------------------------------------------


def _sm_linearize(eqn, wants):
    """The shard_map cut in two: the forward one also returns the residuals, a block per
    device laid out over the axes each varies over (every manual axis without
    ``check_vma``), a scalar given a leading axis of 1, as JAX lays them out."""
    p = eqn.params
    mesh, manual = p["shard_mesh"].mesh, p["manual_axes"]
    with running(body_run(mesh, manual, p["check_vma"])):
        forward, backward, split = loops.split_call(p["jaxpr"], wants)
    n_out, n_used = len(p["jaxpr"].outvars), len(split.used)
    res_specs = []
    for k, v in enumerate(forward.outvars[n_out:]):
        axes = [a for a in manual if a in v.aval.vma or not p["check_vma"]]
        res_specs.append(PartitionSpec(tuple(axes) if len(axes) > 1 else
                                       axes[0] if axes else None))
        if not v.aval.shape:
            forward.outvars[n_out + k] = _leading_axis(forward, v)
            backward.invars[n_used + k] = _without_leading_axis(backward, backward.invars[n_used + k])
    if not p["check_vma"]:
        newly = tuple(a for a in manual if a not in p.get("_outer_axes", ()))
        _sum_unmentioned(backward, [s for s, a in zip(p["in_specs"], split.active) if a], newly)
    bwd = dict(p, jaxpr=backward, in_specs=tuple(p["in_specs"][i] for i in split.used)
               + tuple(res_specs) + tuple(s for s, w in zip(p["out_specs"], split.with_ct) if w),
               out_specs=tuple(s for s, a in zip(p["in_specs"], split.active) if a))
    outvars = [Var(_sm_global(v.aval, s, mesh)) for v, s in zip(forward.outvars[n_out:], res_specs)]
    return Equation(eqn.primitive, dict(p, jaxpr=forward, out_specs=p["out_specs"] + tuple(res_specs),
                                        _vjp=(bwd, split)),
                    eqn.invars, eqn.outvars + outvars, eqn.source, eqn.phase)


def _leading_axis(program, v):
    out = Var(v.aval.update(shape=(1,)))
    program.eqns.append(Equation(P.broadcast_in_dim, dict(
        shape=(1,), broadcast_dimensions=(), sharding=None), [v], [out]))
    return out


def _without_leading_axis(program, v):
    one = Var(v.aval.update(shape=(1,)))
    program.eqns.insert(0, Equation(P.squeeze, dict(dimensions=(0,)), [one], [v],
                                    phase="backward"))
    return one


def _sum_unmentioned(program, specs, manual):
    """Without ``check_vma`` each device's cotangent of an input its in_specs replicate
    over some axes is a part of the whole: JAX sums the parts over those axes."""
    for k, (v, spec) in enumerate(zip(program.outvars, specs)):
        axes = _unmentioned(spec, manual)
        if axes and type(v) is Var:
            total = Var(v.aval)
            program.eqns.append(Equation(K.psum, dict(axes=axes, axis_index_groups=None),
                                         [v], [total], phase="backward"))
            program.outvars[k] = total


def _unmentioned(spec, manual) -> tuple:
    """The manual axes a cotangent of ``spec`` is replicated over (JAX's ``_unmentioned2``
    of the cotangent's spec, in which ``reduced`` axes become unreduced)."""
    return tuple(a for a in manual if a not in spec.mesh_axes() and a not in spec.reduced)


def _split_replicated_cts(cts, out_specs, mesh, manual):
    """Without ``check_vma``, JAX divides a result's cotangent by the size of the axes its
    out_specs replicate it over: every device then holds its share, and the backward body
    (psum's transpose is a psum there) adds the shares up to the whole once, not once per
    device."""
    out = list(cts)
    for k, spec in enumerate(out_specs):
        size = int(np.prod([mesh.shape[a] for a in _unmentioned(spec, manual)]))
        if out[k] is not None and size != 1 and np.issubdtype(aval_of(out[k]).dtype, np.inexact):
            out[k] = out[k] / np.asarray(size, aval_of(out[k]).dtype)
    return out


def _sm_vjp(cts, ins, outs, wants, _vjp=None, **params):
    """The backward shard_map: the residuals and the cotangents arrive in their specs'
    blocks, the inputs' cotangents leave in in_specs' blocks."""
    bwd, split = _vjp
    if not params["check_vma"]:
        newly = tuple(a for a in params["manual_axes"] if a not in params.get("_outer_axes", ()))
        cts = _split_replicated_cts(cts, params["out_specs"], params["shard_mesh"].mesh, newly)
    return loops.split_vjp(cts, ins, outs, split, lambda operands: bind(
        shard_map_p, *operands, **bwd))


shard_map_p = Primitive(
    "shard_map", _sm_stacked, _sm_abstract, vjp=_sm_vjp, multiple_results=True, needs_run=True,
    linearize=_sm_linearize, cost=lambda ins, outs, **p: (0, 0),
    show=lambda p: [("check_vma", p["check_vma"]), ("in_specs", p["in_specs"]),
                    ("jaxpr", p["jaxpr"]), ("manual_axes", p["manual_axes"]),
                    ("mesh", p["shard_mesh"]), ("out_specs", p["out_specs"])])
register(shard_map_p, sharding=_sm_rule,
         unreduced_rule="out_specs")      # its results are unreduced as out_specs say
BODIES[shard_map_p] = partition_shard_map
