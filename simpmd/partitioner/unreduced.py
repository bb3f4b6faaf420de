"""Unreduced and reduced types under jit: which operations accept them, what they make of
them, and JAX's errors when they refuse.

``f32[4,2]{U:X}`` is *unreduced* over ``X``: every device along ``X`` holds a partial sum
(a full-shape block) and the array is their sum, a reduction not yet done, as a product
over a dimension split on ``X`` leaves it with ``out_sharding=P(..., unreduced={'X'})``.
Only linear operations make sense on it (the sum of partial sums of ``a + b`` is the sum
of the partial sums' sums; the cosine of a sum is not the sum of cosines); ``reshard`` to
an ordinary sharding does the reduction (an all-reduce, or a reduce-scatter).
``f32[4,2]{R:X}`` is *reduced* over ``X``: replicated, as after the reduction, and its
gradient comes out unreduced (JAX's cotangent map swaps the two), so that a replicated
weight's gradient can be summed once, where the program says.

JAX's rules grew release by release, row by row (jax 0.7.2 keeps a partial sum through
``add`` only; 0.10 adds transposes, sums, casts, ``where``, concatenation and products
with a reduced scalar; 0.11 reshapes and division; 0.12 ``sub`` and ``neg``, and names a
non-linear operation's refusal). So each row carries a tiny program (``unreduced_probe``)
that ``simpmd.jax.rules.on_operand`` runs on the running JAX, once per process, to see
what it does with an unreduced and a reduced operand: keep it, drop it, or which error it
raises. Without JAX the row's ``unreduced_newest`` column says what the newest JAX does.
"""
from __future__ import annotations

import sys

from ..core import errors
from .sharding import ShardingTypeError, reductions_of, settings, type_text
from ..core import loops, primitives as P
from ..core.core import PRIMITIVES
from ..core import bridge
from .columns import column, register

NO = (frozenset(), frozenset())
_KEEPS = ("keeps", "keeps")


def attach():
    """Give the core's rows their columns for unreduced and reduced operands:
    ``unreduced_rule`` (what the row makes of them when JAX keeps them: 'sum', 'scaled',
    'linear', 'extreme', 'unary', 'product', 'reshard' or 'body'), ``unreduced_probe``
    (the program that asks the running JAX: the operand's shape and a function of
    ``jnp``, ``lax``, the operand and a reduced scalar), ``unreduced_newest`` (the newest
    JAX's answer on an unreduced and on a reduced operand, in ``simpmd.jax.rules.word_of``'s
    words), ``unreduced_kind`` (an extreme's: 'max' or 'min'), ``unreduced_body`` (which
    parameter holds the program whose results' types a 'body' row's are),
    ``unreduced_word`` (the name JAX's message gives it) and ``divides`` (a quotient: its
    denominator, not its numerator, must be reduced). A row without a probe is asked as
    :func:`_asked_row` says."""
    one_operand = (P.abs_, P.acos, P.acosh, P.asin, P.asinh, P.atan, P.atanh, P.cbrt, P.ceil,
                   P.conj, P.cos, P.cosh, P.exp, P.exp2, P.expm1, P.floor, P.imag,
                   P.is_finite, P.log, P.log1p, P.logistic, P.not_, P.real,
                   P.round_, P.rsqrt, P.sign, P.sin, P.sinh, P.sqrt, P.square, P.tan, P.tanh)
    for row in one_operand:
        register(row, unreduced_rule="unary", unreduced_newest=("nonlinear", "keeps"))
    for row in (P.add, P.add_any, P.sub):
        register(row, unreduced_rule="sum", unreduced_newest=_KEEPS)
    register(P.add_any, unreduced_word="add")
    register(P.mul, unreduced_rule="scaled")
    register(P.div, unreduced_rule="scaled", divides=True)
    for row in (P.transpose, P.reduce_sum, P.convert_element_type, P.select_n, P.concatenate,
                P.squeeze, P.copy, P.neg, P.reshape):
        register(row, unreduced_rule="linear")
    for row in (P.mul, P.div) + tuple(r for r in PRIMITIVES.values()
                                       if column(r, "unreduced_rule") == "linear"):
        register(row, unreduced_newest=_KEEPS)
    for row, kind in ((P.reduce_max, "max"), (P.reduce_min, "min"), (P.argmax, "max"),
                      (P.argmin, "min")):
        register(row, unreduced_rule="extreme", unreduced_kind=kind, unreduced_newest=(
            ("kind", "keeps") if row.name.startswith("reduce") else ("pspec[...]", "pspec[...]")))
    register(P.integer_pow, unreduced_newest=("no rule", "no rule"))
    register(P.dot_general, unreduced_rule="product", unreduced_newest=("refused", "drops"))
    for row, body in ((loops.scan, "jaxpr"), (loops.remat, "jaxpr"), (loops.while_, "body_jaxpr")):
        register(row, unreduced_rule="body", unreduced_body=body)
    _attach_probes(P)


def _attach_probes(P):
    """Each probe is the operation as a JAX program spells it, on ``v`` (4 x 4, or 1 x 4
    for squeeze) and ``two``, a scalar reduced over the mesh axis."""
    square = (4, 4)
    for row, program in (
            (P.add, lambda jnp, lax, v, two: v + v), (P.sub, lambda jnp, lax, v, two: v - v),
            (P.mul, lambda jnp, lax, v, two: v * two), (P.div, lambda jnp, lax, v, two: v / two),
            (P.neg, lambda jnp, lax, v, two: -v), (P.transpose, lambda jnp, lax, v, two: v.T),
            (P.reduce_sum, lambda jnp, lax, v, two: v.sum(0)),
            (P.convert_element_type, lambda jnp, lax, v, two: v.astype(jnp.int32)),
            (P.select_n, lambda jnp, lax, v, two: jnp.where(True, v, v)),
            (P.concatenate, lambda jnp, lax, v, two: jnp.concatenate([v, v])),
            (P.copy, lambda jnp, lax, v, two: lax.copy_p.bind(v)),
            (P.reshape, lambda jnp, lax, v, two: v.reshape(-1)),
            (P.reduce_max, lambda jnp, lax, v, two: v.max(0)),
            (P.reduce_min, lambda jnp, lax, v, two: v.min(0)),
            (P.argmax, lambda jnp, lax, v, two: v.argmax(0)),
            (P.argmin, lambda jnp, lax, v, two: v.argmin(0)),
            (P.tanh, lambda jnp, lax, v, two: jnp.tanh(v)),
            (P.integer_pow, lambda jnp, lax, v, two: lax.integer_pow(v, 3)),
            (P.dot_general, lambda jnp, lax, v, two: v @ jnp.eye(4, dtype=v.dtype))):
        register(row, unreduced_probe=(square, program))
    register(P.squeeze, unreduced_probe=((1, 4), lambda jnp, lax, v, two: lax.squeeze(v, (0,))))


def _asked_row(prim, start, arrays):
    """The row whose probe answers for ``prim``: its own; else, on an unreduced operand,
    an elementwise row answers as ``tanh`` (and any other refuses, no rule); on a reduced
    one, an elementwise row of one operand as ``tanh``, of several as ``add``, any other
    row of one operand as ``transpose``."""
    if column(prim, "unreduced_probe") is not None:
        return prim
    if prim is P.add_any:
        return P.add
    elementwise = prim.elementwise
    if start == "unreduced":
        return P.tanh if elementwise or column(prim, "unreduced_rule") == "unary" else None
    if len(arrays) > 1:
        return P.add
    return P.tanh if elementwise else P.transpose


def _word(prim, start, avals, arrays) -> str:
    """What the running JAX (or the newest) does with ``prim`` on these operands."""
    row = _asked_row(prim, start, arrays)
    word = settings.ask("on_operand", row, start) if row is not None else "no rule"
    if word == "pspec[...]" and not avals[0].ndim:      # a scalar's spec has nothing to index
        return "keeps"
    return word


def _u(aval):
    """The axes ``aval`` holds partial sums over: by its sharding under jit, by its own
    type inside shard_map (``f32[2]{U:x}``)."""
    return getattr(aval.sharding, "unreduced", frozenset()) | getattr(aval, "unreduced", frozenset())


def _r(aval):
    """The axes ``aval`` is reduced over: by its sharding under jit, by its own type inside
    shard_map (``f32[2]{R:x}``, made by ``lax.pcast(x, 'x', to='reduced')``)."""
    return getattr(aval.sharding, "reduced", frozenset()) | getattr(aval, "reduced", frozenset())


def _type(aval) -> str:
    """A type as jax.typeof prints it: float32[4,4]{U:X}."""
    return type_text(aval)


def _fs(axes) -> str:
    return "frozenset({" + ", ".join(repr(a) for a in sorted(axes)) + "})"


class UnreducedRuleError(errors.SimpmdError, NotImplementedError):
    """JAX has no rule for this operation on an unreduced value (its NotImplementedError)."""


def _no_rule(name):
    """JAX's refusal of an operation that has no rule for unreduced or reduced operands, in
    its words (without its advice to file an issue with JAX: this is no bug of JAX's) and
    what to do instead."""
    return UnreducedRuleError(
        f"unreduced rule for {name} is not implemented (JAX's words): JAX defines no result "
        f"type for {name} of a value that is unreduced or reduced over a mesh axis, so it "
        f"refuses it. reshard the value to an ordinary sharding first (simpmd.reshard(x, "
        f"P(...)) sums the partial values, as jax.reshard does), then apply {name}.")


def types(prim, avals, params, n_outs, mesh, manual=False) -> list:
    """(unreduced, reduced) axes of each result of ``prim`` on ``avals``, or JAX's error
    where it refuses them (``manual``: inside shard_map, where every operand counts)."""
    kind = column(prim, "unreduced_rule")
    if kind == "reshard":
        return [reductions_of(params["dst_sharding"], mesh)]
    if kind == "out_specs":            # a shard_map's results are as its out_specs say
        return [reductions_of(spec, mesh, "out_specs") for spec in params["out_specs"]]
    if kind == "product":
        return [_dot(prim, avals, params, mesh)]
    if kind == "body":                 # a body's results keep the types they were traced with
        return [(_u(a), _r(a)) for a in params[column(prim, "unreduced_body")].out_avals]
    arrays = [a for a in avals if a.sharding is not None]
    if any(_u(a) for a in avals):
        return [_unreduced(prim, avals, arrays)] * n_outs
    arrays = list(avals) if manual else arrays
    if any(_r(a) for a in arrays):
        return [_reduced(prim, avals, arrays, scalars_join=not manual)] * n_outs
    return [NO] * n_outs


def _dot(prim, avals, params, mesh):
    lhs, rhs = avals
    if _u(lhs) or _u(rhs):
        if settings.ask("on_operand", prim, "unreduced") == "drops":
            return NO
        raise ShardingTypeError(f"lhs or rhs passed to dot_general cannot be unreduced. Got "
                                f"lhs=ShapedArray({_type(lhs)}) and rhs=ShapedArray({_type(rhs)})")
    out = params.get("out_sharding")
    if out is None:
        return NO
    unreduced, reduced = reductions_of(out, mesh, "out_sharding")
    if not unreduced:
        return frozenset(), reduced
    (lc, _), _ = params["dimension_numbers"]
    dims = lhs.sharding.dims if lhs.sharding is not None else ((),) * lhs.ndim
    entries = tuple(dims[d] if len(dims[d]) != 1 else dims[d][0] for d in lc if dims[d])
    axes = frozenset(a for d in lc for a in dims[d])
    named = frozenset(entries) if settings.ask("contraction_sets") == "entries" else axes
    if unreduced != named:
        raise ShardingTypeError(
            f"out_sharding's unreduced axes should be equal to the contracting specs. Got "
            f"unreduced axes={_fs(unreduced)} and contracting spec={entries!r}")
    return unreduced, reduced


def _unreduced(prim, avals, arrays):
    """The rule for an operation one of whose operands is unreduced."""
    word = _word(prim, "unreduced", avals, arrays)
    if word == "drops":
        return NO
    if word != "keeps":
        raise _refusal(word, prim, next(a for a in avals if _u(a)))
    kind = column(prim, "unreduced_rule")
    if kind == "sum":
        return _sum_of_partial_sums(column(prim, "unreduced_word") or prim.name, avals)
    if kind == "scaled":
        return _scaled(prim, avals)
    return next(_u(a) for a in avals if _u(a)), frozenset()


def _refusal(word, prim, shown):
    """JAX's error for a refusal of ``prim`` on ``shown``, in :func:`_word`'s words."""
    name = prim.name
    if word in ("pspec[...]", "*pspec"):
        how = "pspec[...]" if word == "pspec[...]" else "*pspec"
        use = "spec.partitions[...]" if word == "pspec[...]" else "*spec.partitions"
        return ValueError(f"Using {how} is dangerous when PartitionSpec has non-empty "
                          f"unreduced/reduced set. Please use {use}")
    kind = column(prim, "unreduced_kind")
    if word == "kind":
        return ValueError(f"Expected unreduced_kind=UnreducedKind.{kind} but "
                          f"got UnreducedKind.sum")
    if word == "nonlinear":
        return ShardingTypeError(f"{name} is a non-linear operation and cannot accept input "
                                 f"that is unreduced. Got {_type(shown)}")
    if word == "partial":
        version = getattr(sys.modules.get("jax"), "__version__", "?")
        return UnreducedRuleError(
            f"the {kind} of partial sums is not the {kind} of "
            f"their sum ({name} of {_type(shown)}). This JAX ({version}) accepts it as an "
            f"unreduced {kind} and reshard then takes the "
            f"{kind} of the partial results, a wrong value; simpmd refuses. "
            f"reshard the value to an ordinary sharding first.")
    if word == "refused":
        return ShardingTypeError(f"{name} refuses an operand of type {_type(shown)} on this "
                                 f"JAX (reshard it to an ordinary sharding first)")
    return _no_rule(name)


def _sum_of_partial_sums(name, avals):
    lhs, rhs = avals
    if _u(lhs) == _u(rhs):
        return _u(lhs), frozenset()
    side, other = ("lhs", "rhs") if _u(lhs) else ("rhs", "lhs")
    raise ShardingTypeError(
        f"{side} is unreduced while {other} is not. `{name}` operation does not allow this "
        f"because there will be implicit communication. Please reduce {side} via `reshard` "
        f"before calling `{name}`.")


def _scaled(prim, avals):
    """A partial sum times (or over) a value that is the same everywhere: still a partial
    sum, provided that value is reduced along the same axes."""
    lhs, rhs = avals
    if column(prim, "divides"):                  # over a value reduced alike
        if _r(rhs) >= _u(lhs) and not _u(rhs):
            return _u(lhs), frozenset()
        raise ValueError(f"Denominator should be reduced along the same axes numerator is "
                         f"unreduced on. Got x=ShapedArray({_type(lhs)}), "
                         f"y=ShapedArray({_type(rhs)})")
    if _u(lhs) and _u(rhs):
        raise ShardingTypeError(f"lhs and rhs to `mul` cannot be unreduced since mul is "
                                f"bilinear. Got lhs={_fs(_u(lhs))}, rhs={_fs(_u(rhs))}")
    scaled, scale, side = (lhs, rhs, "RHS") if _u(lhs) else (rhs, lhs, "LHS")
    if _r(scale) >= _u(scaled):
        return _u(scaled), frozenset()
    other = "LHS" if side == "RHS" else "RHS"
    raise ShardingTypeError(
        f"{side} should be reduced along the same axes {other} is unreduced on. Got "
        f"lhs={_type(lhs)} and rhs={_type(rhs)}")


def _reduced(prim, avals, arrays, scalars_join=True):
    """The rule for an operation on reduced values (nothing unreduced): an operation of
    one operand, or a linear one (its first operand's), keeps the type where JAX keeps
    it; one of several operands only when they are reduced alike (under jit a replicated
    scalar joins them, as JAX reshards it; inside shard_map it does not)."""
    word = _word(prim, "reduced", avals, arrays)
    if word == "drops":
        return NO
    if word != "keeps":
        raise _refusal(word, prim, next(a for a in arrays if _r(a)))
    if column(prim, "unreduced_rule") == "linear" or len(arrays) == 1:
        return frozenset(), _r(arrays[0])
    sets = {_r(a) for a in arrays}
    if len(sets - {frozenset()}) > 1:
        raise ShardingTypeError(f"All inputs should be reduced across the same mesh axes. Got "
                                f"specs: {{{', '.join(_fs(s) for s in sets)}}}")
    reduced = next(iter(sets - {frozenset()}))
    bare = next((a for a in arrays if not _r(a) and (a.ndim or not scalars_join)), None)
    if bare is not None:
        raise ShardingTypeError(f"Inputs cannot be replicated on the same axes that another "
                                f"input is reduced on. Got input type: {_type(bare)} and "
                                f"reduced spec: {_fs(reduced)}")
    return frozenset(), reduced


def manual(prim, avals, params, n_outs) -> list:
    """Inside ``shard_map(check_vma=True)``: the unreduced axes of each result of ``prim``
    where an operand holds partial sums (``f32[2]{U:x}``), by the rules JAX types them
    with under jit; a collective refuses an operand unreduced over its axes (JAX's
    ``check_unreduced_args``), and keeps partial sums over other axes."""
    if prim.collective or prim.by_axes:
        names = params.get("axes", params.get("axis_name"))
        axes = set(names) if isinstance(names, (tuple, list)) else {names}
        for a in avals:
            if _u(a) & axes:
                raise ValueError(
                    f"{prim.name} cannot accept args which are unreduced. Got "
                    f"{a.str_short()} and axes={axes} (JAX's words): the value holds "
                    f"partial sums over {sorted(_u(a) & axes)}. Sum them first "
                    f"(lax.psum(x, {tuple(sorted(_u(a) & axes))!r})).")
            if _r(a) & axes:
                raise ValueError(
                    f"{prim.name} cannot accept args which are reduced. Got "
                    f"{a.str_short()} and axes={axes} (JAX's words): cast it to varying "
                    f"first (lax.pcast(x, {tuple(sorted(_r(a) & axes))!r}, to='varying')).")
        return [(frozenset().union(*(_u(a) for a in avals)),
                 frozenset().union(*(_r(a) for a in avals)))] * n_outs
    return types(prim, avals, params, n_outs, None, manual=True)


def _register():
    bridge.unreduced = manual


_register()
