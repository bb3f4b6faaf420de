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

JAX's rules grew between releases (checked on jax 0.7.2, 0.10.2 and 0.12.0.1, by running
each operation on 2 and 4 CPU devices; a release in between takes the rule of the next
checked one): 0.7.2 has rules for ``add`` and the product only; 0.10 adds transposes,
sums, dtype casts, ``where``, concatenation and products with a reduced scalar, and gives
reduced types their rules; 0.12 adds ``sub``, ``neg``, ``reshape``, division by a reduced
value and names a nonlinear operation's refusal. :func:`types` follows the installed JAX
(``partition.settings``), the newest without one.
"""
from __future__ import annotations

from ..core import errors
from .partition import ShardingTypeError, reductions_of, settings, type_text

NO = (frozenset(), frozenset())
_FILE = "Please file an issue at https://github.com/jax-ml/jax/issues"


def attach():
    """Give the core's rows their columns for unreduced and reduced operands:
    ``unreduced_rule`` (how the row treats them: 'sum', 'scaled', 'linear', 'extreme',
    'unary', 'product', 'reshard' or 'body'), ``unreduced_since`` (the last JAX release
    without the rule), ``unreduced_kind`` (an extreme's: 'max' or 'min'),
    ``unreduced_body`` (which parameter holds the program whose results' types a 'body'
    row's are), ``keeps_reduced`` (its result stays reduced on every release;
    ``keeps_reduced_since``: up to that release, then the rule of several operands),
    ``spec_indexed`` (jax 0.10 indexed its operand's spec, and refused a reduced or
    unreduced one), ``unreduced_word`` (the name JAX's message gives it) and ``divides``
    (a quotient: its denominator, not its numerator, must be reduced)."""
    from ..core import loops, primitives as P
    one_operand = (P.abs_, P.acos, P.acosh, P.asin, P.asinh, P.atan, P.atanh, P.cbrt, P.ceil,
                   P.conj, P.cos, P.cosh, P.exp, P.exp2, P.expm1, P.floor, P.imag,
                   P.integer_pow, P.is_finite, P.log, P.log1p, P.logistic, P.not_, P.real,
                   P.round_, P.rsqrt, P.sign, P.sin, P.sinh, P.sqrt, P.square, P.tan, P.tanh)
    for row in one_operand:
        row.unreduced_rule, row.keeps_reduced = "unary", True
    for row in (P.add, P.add_any, P.sub):
        row.unreduced_rule = "sum"
    P.sub.unreduced_since, P.add_any.unreduced_word = (0, 10, 2), "add"
    P.mul.unreduced_rule = P.div.unreduced_rule = "scaled"
    P.div.unreduced_since, P.div.divides = (0, 10, 2), True
    for row, since in ((P.transpose, (0, 7, 2)), (P.reduce_sum, (0, 7, 2)),
                       (P.convert_element_type, (0, 7, 2)), (P.select_n, (0, 7, 2)),
                       (P.concatenate, (0, 7, 2)), (P.squeeze, (0, 7, 2)), (P.copy, (0, 7, 2)),
                       (P.neg, (0, 10, 2)), (P.reshape, (0, 10, 2))):
        row.unreduced_rule, row.unreduced_since = "linear", since
    for row in (P.convert_element_type, P.copy, P.neg):
        row.keeps_reduced = True
    P.select_n.keeps_reduced_since = P.concatenate.keeps_reduced_since = (0, 7, 2)
    P.reshape.spec_indexed = True
    for row, kind in ((P.reduce_max, "max"), (P.reduce_min, "min"), (P.argmax, "max"),
                      (P.argmin, "min")):
        row.unreduced_rule, row.unreduced_kind = "extreme", kind
    P.dot_general.unreduced_rule = "product"
    for row, body in ((loops.scan, "jaxpr"), (loops.remat, "jaxpr"), (loops.while_, "body_jaxpr")):
        row.unreduced_rule, row.unreduced_body = "body", body


def _u(aval):
    return getattr(aval.sharding, "unreduced", frozenset())


def _r(aval):
    return getattr(aval.sharding, "reduced", frozenset())


def _type(aval) -> str:
    """A type as jax.typeof prints it: float32[4,4]{U:X}."""
    return type_text(aval)


def _fs(axes) -> str:
    return "frozenset({" + ", ".join(repr(a) for a in sorted(axes)) + "})"


class UnreducedRuleError(errors.SimpmdError, NotImplementedError):
    """JAX has no rule for this operation on an unreduced value (its NotImplementedError)."""


def _no_rule(name):
    return UnreducedRuleError(f"unreduced rule for {name} is not implemented. {_FILE}")


def types(prim, avals, params, n_outs, mesh) -> list:
    """(unreduced, reduced) axes of each result of ``prim`` on ``avals``, or JAX's error
    where it refuses them."""
    kind = getattr(prim, "unreduced_rule", None)
    if kind == "reshard":
        return [reductions_of(params["dst_sharding"], mesh)]
    if kind == "product":
        return [_dot(avals, params, mesh)]
    if kind == "body":                 # a body's results keep the types they were traced with
        return [(_u(a), _r(a)) for a in params[prim.unreduced_body].out_avals]
    arrays = [a for a in avals if a.sharding is not None]
    if any(_u(a) for a in avals):
        return [_unreduced(prim, avals)] * n_outs
    if any(_r(a) for a in arrays):
        return [_reduced(prim, avals, arrays)] * n_outs
    return [NO] * n_outs


def _dot(avals, params, mesh):
    lhs, rhs = avals
    if _u(lhs) or _u(rhs):
        if settings.version <= (0, 7, 2):
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
    agree = unreduced == (frozenset(entries) if settings.version <= (0, 7, 2) else axes)
    if not agree:
        raise ShardingTypeError(
            f"out_sharding's unreduced axes should be equal to the contracting specs. Got "
            f"unreduced axes={_fs(unreduced)} and contracting spec={entries!r}")
    return unreduced, reduced


def _unreduced(prim, avals):
    """The rule for an operation one of whose operands is unreduced."""
    v, name, kind = settings.version, prim.name, getattr(prim, "unreduced_rule", None)
    since = getattr(prim, "unreduced_since", None)
    if kind == "sum" and (since is None or v > since):
        return _sum_of_partial_sums(getattr(prim, "unreduced_word", name), avals)
    if kind == "scaled":
        return _scaled(prim, avals)
    if kind == "linear":
        indexed = getattr(prim, "spec_indexed", False) and v > (0, 7, 2)
        if v <= since and not (indexed and not avals[0].ndim):
            if indexed:
                raise ValueError("Using pspec[...] is dangerous when PartitionSpec has "
                                 "non-empty unreduced/reduced set. Please use "
                                 "spec.partitions[...]")
            raise _no_rule(name)
        return next(_u(a) for a in avals if _u(a)), frozenset()
    if kind == "extreme":
        if v > (0, 10, 2):
            raise ValueError(f"Expected unreduced_kind=UnreducedKind.{prim.unreduced_kind} but "
                             f"got UnreducedKind.sum")
        if v > (0, 7, 2):
            raise ValueError("Using *pspec is dangerous when PartitionSpec has non-empty "
                             "unreduced/reduced set. Please use *spec.partitions")
        raise _no_rule(name)
    if v > (0, 10, 2) and (kind == "unary" or getattr(prim, "elementwise", False)):
        shown = next(a for a in avals if _u(a))
        raise ShardingTypeError(f"{name} is a non-linear operation and cannot accept input "
                                f"that is unreduced. Got {_type(shown)}")
    raise _no_rule(name)


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
    sum, provided that value is reduced along the same axes (jax 0.10; division 0.12)."""
    v, name = settings.version, prim.name
    if v <= getattr(prim, "unreduced_since", (0, 7, 2)):
        raise _no_rule(name)
    lhs, rhs = avals
    if getattr(prim, "divides", False):                  # over a value reduced alike
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


def _reduced(prim, avals, arrays):
    """The rule for an operation on reduced values (nothing unreduced): elementwise
    operations of one operand keep the type on every release; from jax 0.10 so do those of
    several operands that agree, and transposes and sums (and reshapes from 0.12)."""
    v, name, kind = settings.version, prim.name, getattr(prim, "unreduced_rule", None)
    if getattr(prim, "keeps_reduced", False) or v <= getattr(prim, "keeps_reduced_since", ()):
        return frozenset(), _r(arrays[0])
    if v <= (0, 7, 2) or kind == "product":
        return NO
    if kind == "extreme" and v <= (0, 10, 2):
        raise ValueError("Using *pspec is dangerous when PartitionSpec has non-empty "
                         "unreduced/reduced set. Please use *spec.partitions")
    if getattr(prim, "spec_indexed", False) and v <= (0, 10, 2) and avals[0].ndim:
        raise ValueError("Using pspec[...] is dangerous when PartitionSpec has non-empty "
                         "unreduced/reduced set. Please use spec.partitions[...]")
    if kind == "linear" or len(arrays) == 1:
        return frozenset(), _r(arrays[0])
    sets = {_r(a) for a in arrays}
    if len(sets - {frozenset()}) > 1:
        raise ShardingTypeError(f"All inputs should be reduced across the same mesh axes. Got "
                                f"specs: {{{', '.join(_fs(s) for s in sets)}}}")
    reduced = next(iter(sets - {frozenset()}))
    bare = next((a for a in arrays if not _r(a) and a.ndim), None)   # a scalar may join
    if bare is not None:
        raise ShardingTypeError(f"Inputs cannot be replicated on the same axes that another "
                                f"input is reduced on. Got input type: {_type(bare)} and "
                                f"reduced spec: {_fs(reduced)}")
    return frozenset(), reduced
