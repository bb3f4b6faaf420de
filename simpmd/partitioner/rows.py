"""The rows of the partitioner: every core row's ``sharding`` and ``partition`` columns,
registered here where jit owns them, and the rows jit adds (``jit``, ``reshard``)."""
from __future__ import annotations

from ..core import collectives as K
from ..core import control, loops
from ..core import primitives as P
from ..core.core import PRIMITIVES, Equation, Primitive, Var, aval_of, bind
from ..core.program import eval_program
from ..machine.mesh import PartitionSpec, axis_types_of
from .plans import (_as_is, _bid_plan, _changed, _dot_plan, _elementwise_plan, _reduce_plan,
                    _reshape_plan, _slice_plan, _whole_dims, computed_whole, reshard_plan)
from .rules import (_body, _branches, _broadcast_in_dim, _broadcasting, _clamp, _concatenate,
                    _convert, _cumulative, _dot_general, _first, _gather, _iota, _numpy_call,
                    _reduce, _reshape, _scan, _scatter, _select, _sort, _squeeze, _transpose,
                    _varying_shape, _while)
from .columns import column, register
from .sharding import dims_of, resolve, whole


# -- attaching the columns: by the row, as JAX registers its rules -----------------------------


def _rule(rows, sharding, partition, **columns):
    """Give each of ``rows`` its ``sharding`` and ``partition`` columns (and ``columns``)."""
    for row in rows:
        register(row, sharding=sharding, partition=partition, **columns)


def _sliced(avals, params):
    return [d for d, (n, k) in enumerate(zip(avals[0].shape, params["slice_sizes"])) if n != k]


def _updated(avals, params):
    return [d for d, (n, k) in enumerate(zip(avals[0].shape, avals[1].shape)) if n != k]


def attach():
    """Give every row of the core its ``sharding`` and ``partition`` columns, and jit's own:
    ``combine`` (the collective that adds up a reduction's partial results, which its plan
    uses), ``defers_sums``
    (a product's partial sums wait for their next use), ``carries_sums(in, out)`` (a
    layout-only, linear row passes pending partial sums on)."""
    for row in PRIMITIVES.values():
        if row.elementwise:
            _rule([row], _broadcasting(row.name), _elementwise_plan)
    _rule([P.convert_element_type], _convert, _elementwise_plan,
          carries_sums=lambda a, o: a.dtype.kind + o.dtype.kind == "ff")
    _rule([P.select_n], _select, _elementwise_plan)
    _rule([P.clamp], _clamp, _elementwise_plan)
    _rule([P.dot_general], _dot_general, _dot_plan, defers_sums=True)
    _rule([P.reshape], _reshape, _reshape_plan, carries_sums=lambda a, o: True)
    _rule([P.broadcast_in_dim], _broadcast_in_dim, _bid_plan)
    _rule([P.transpose], _transpose, _as_is, carries_sums=lambda a, o: True)
    _rule([P.squeeze], _squeeze, _as_is, carries_sums=lambda a, o: True)
    register(P.copy, carries_sums=lambda a, o: True)
    _rule([P.rev], _first, _whole_dims(_changed))
    _rule([P.concatenate], _concatenate, _whole_dims(lambda avals, p: [p["dimension"]]))
    _rule([P.pad], _varying_shape(P.pad, "padding"), _whole_dims(_changed))
    _rule([P.slice_], _varying_shape(P.slice_, "slicing"), _slice_plan)
    _rule([P.dynamic_slice], _varying_shape(P.dynamic_slice, "dynamic_slice"),
          _whole_dims(_sliced))
    _rule([P.dynamic_update_slice], _first, _whole_dims(_updated))
    _rule([P.iota], _iota, computed_whole)
    _rule([P.gather], _gather, computed_whole)
    _rule([P.sort], _sort, _as_is)
    _rule([P.numpy_call], _numpy_call, None)
    _rule([control.cond], _branches, None)
    _rule([loops.remat], _body, None)
    _rule([loops.name_p], _first, _as_is)
    for row, combine in ((P.reduce_sum, K.psum), (P.reduce_max, K.pmax), (P.reduce_min, K.pmin),
                         (P.reduce_and, K.pmin), (P.reduce_or, K.pmax), (P.reduce_prod, None),
                         (P.argmax, None), (P.argmin, None)):
        _rule([row], _reduce, _reduce_plan(combine), combine=combine)
    _rule([P.cumsum, P.cumprod, P.cummax, P.cummin], _cumulative, _as_is)
    _rule([P.scatter, P.scatter_add, P.scatter_mul, P.scatter_min, P.scatter_max], _scatter,
          computed_whole)
    register(loops.scan, sharding=_scan)
    register(loops.while_, sharding=_while)



def rows_without_rules() -> list:
    """Rows with no sharding column (a test keeps this to the collectives and calls)."""
    return sorted(n for n, p in PRIMITIVES.items() if column(p, "sharding") is None)


# -- the type of a whole program's arguments -------------------------------------------------


def reshard_rule(mesh, avals, dst_sharding):
    return [resolve(dst_sharding, mesh, avals[0].ndim, "reshard")]


def broadcast_sharding(mesh, avals):
    """The layout that broadcasting ``avals`` together gives (``jnp`` broadcasts a
    ``where``'s operands to it)."""
    rank = max(a.ndim for a in avals)
    lined = [a.update(shape=(1,) * (rank - a.ndim) + a.shape, sharding=None if a.sharding is None
                      else type(a.sharding)(a.sharding.mesh, whole(rank - a.ndim) + dims_of(a)))
             if a.ndim and a.ndim < rank else a for a in avals]
    return _broadcasting("broadcast_shardings")(mesh, lined)[0]


# -- the rows jit adds: a jit equation, and reshard ---------------------------------------------


def _jit_stacked(*args, jaxpr, name, ctx_mesh=None, _vjp=None):
    """The inner program on this run (a jit called where no mesh partitions it)."""
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


def _jit_show(p):
    mesh = [("ctx_mesh", p["ctx_mesh"])] if p.get("ctx_mesh") else []
    return [("name", p["name"])] + mesh + [("jaxpr", p["jaxpr"])]


jit_p = Primitive(
    "jit", _jit_stacked, lambda *avals, jaxpr, **p: [aval_of(v) for v in jaxpr.outvars],
    vjp=_jit_vjp, multiple_results=True, needs_run=True, cost=lambda ins, outs, **p: (0, 0),
    linearize=_jit_linearize, same_names=True, show=_jit_show)
register(jit_p, sharding=lambda mesh, avals, jaxpr, **p: [dims_of(aval_of(v))
                                                    for v in jaxpr.outvars])


def _reshard_vjp(ct, ins, outs, wants, dst_sharding):
    back = aval_of(ins[0]).sharding
    back = back.cotangent() if back is not None else PartitionSpec()   # reduced <-> unreduced
    return [bind(reshard_p, ct, dst_sharding=back) if wants[0] else None]


reshard_p = Primitive("reshard", lambda x, dst_sharding: x, lambda x, dst_sharding: x,
                      vjp=_reshard_vjp, cost=lambda ins, outs, **p: (0, 0), show=lambda p: {})
register(reshard_p, sharding=reshard_rule, partition=reshard_plan,
         resolves_sums=True,           # pending partial sums end here: a reduce-scatter each
         unreduced_rule="reshard")     # its destination says what is unreduced or reduced
register(jit_p, unreduced_rule="body", unreduced_body="jaxpr")


class MeshText:
    """How a jit equation prints its mesh: ``Mesh('data': 2, 'model': 4, axis_types=(...))``."""

    def __init__(self, mesh):
        self.mesh = mesh

    def __repr__(self):
        sizes = ", ".join(f"{n!r}: {s}" for n, s in self.mesh.shape.items())
        types = ", ".join(t.name for t in axis_types_of(self.mesh))
        return f"Mesh({sizes}, axis_types=({types}{',' if len(self.mesh.axis_names) == 1 else ''}))"
