"""The primitives of a device's own arithmetic, one row each: JAX's ``lax`` names and params.

Every row computes all devices at once (``stacked``: each operand a NumPy array whose first
axis runs over the devices, so a per-device axis ``a`` is axis ``a + 1`` of the stack),
types its result (``abstract``), sends cotangents back (``vjp``, written with the same
primitives through :func:`bind`, so a gradient is a program too) and says what it costs
(``cost``: FLOPs and bytes on one device). The collectives live in ``collectives.py``, the
calls and branches in ``control.py``; the NumPy spelling that binds these rows
(``x @ w``, ``x.sum(0)``, ``snp.tanh``) is ``surface.py``.
"""
from __future__ import annotations

import math

import numpy as np

from . import dtypes
from .core import Aval, Primitive, aval_of, bind

def _shift(axes):
    """Per-device axes as axes of the stack (the device axis comes first)."""
    return tuple(a + 1 for a in axes)

def _size(aval) -> int:
    return math.prod(aval.shape)

def _bytes(ins, outs) -> int:
    return sum(_size(a) * a.dtype.itemsize for a in (*ins, *outs) if isinstance(a, Aval))

def _vma(avals):
    return frozenset().union(*(a.vma for a in avals))

def _layout_cost(ins, outs, **params):
    """Nothing: XLA fuses a layout change into its neighbours or makes it a view (what
    jax.experimental.roofline assumes for every primitive without a rule of its own)."""
    return 0, 0

# -- elementwise -----------------------------------------------------------------------------

def _lined_up(stacks):
    """Give lower-rank stacks length-1 axes after the device axis, so NumPy broadcasts each
    device's value against the others' as it would on that device alone."""
    rank = max(s.ndim for s in stacks)
    return [s if s.ndim == rank else s.reshape(s.shape[:1] + (1,) * (rank - s.ndim) + s.shape[1:])
            for s in stacks]

def _common(avals, name):
    shapes = [a.shape for a in avals]
    try:
        shape = np.broadcast_shapes(*shapes)
    except ValueError:
        raise TypeError(f"{name} got incompatible shapes for broadcasting: "
                        f"{', '.join(map(str, shapes))}.") from None
    dtype, weak = dtypes.promote(*[(a.dtype, a.weak_type) for a in avals])
    return shape, dtype, weak

def _elementwise_abstract(name, result=None):
    def abstract(*avals, **params):
        shape, dtype, weak = _common(avals, name)
        if result is not None:
            dtype, weak = np.dtype(result), False
        return Aval(shape, dtype, weak, _vma(avals))
    return abstract

def _elementwise_stacked(fn, compare=False):
    def stacked(*stacks, **params):
        dtype = dtypes.promote(*[(s.dtype, False) for s in stacks])[0]
        args = _lined_up([s.astype(dtype, copy=False) for s in stacks])
        out = fn(*args, **params)
        return out if compare else np.asarray(out, dtype=dtype)
    return stacked

def _elementwise_cost(ins, outs, **params):
    return _size(outs[0]), _bytes(ins, outs)

def _unbroadcast(ct, aval):
    """Sum a cotangent down to an operand's shape: the transpose of broadcasting."""
    if ct is None or aval_of(ct).shape == aval.shape:
        return ct
    shape = aval_of(ct).shape
    if not aval.shape:
        return bind(reduce_sum, ct, axes=tuple(range(len(shape))))
    summed = tuple(d for d, (a, b) in enumerate(zip(aval.shape, shape)) if a == 1 and b != 1)
    return bind(reshape, bind(reduce_sum, ct, axes=summed), new_sizes=aval.shape, dimensions=None)

def _ew_vjp(*partials):
    """A vjp from one function per operand: ``partial(ct, out, *ins)``, the cotangent before
    it is summed down to the operand's shape."""
    def vjp(ct, ins, outs, wants, **params):
        return [_unbroadcast(p(ct, outs[0], *ins), aval_of(x)) if w and p else None
                for p, x, w in zip(partials, ins, wants)]
    return vjp

def elementwise(name, fn, *partials, compare=False, result=None, **params):
    """A row for an elementwise primitive computed by NumPy's ``fn``."""
    return Primitive(name, _elementwise_stacked(fn, compare),
                     _elementwise_abstract(name, np.bool_ if compare else result),
                     vjp=_ew_vjp(*partials) if partials else None, cost=_elementwise_cost,
                     elementwise=True, **params)

def _mul(a, b): return bind(mul, a, b)
def _div(a, b): return bind(div, a, b)
def _neg(a): return bind(neg, a)
def _zero_like(ct, *rest): return None

def _int_div(a, b):
    if np.issubdtype(a.dtype, np.integer):          # lax.div rounds towards zero
        q = np.floor_divide(a, b)
        return q + ((np.remainder(a, b) != 0) & ((a < 0) ^ (b < 0)))
    return np.true_divide(a, b)

def _choose_half(which):
    """max/min: the cotangent goes to the chosen operand; a tie shares it, as in JAX."""
    def partial(ct, out, a, b):
        mine, other = (a, b) if which == 0 else (b, a)
        picked = bind(convert_element_type, bind(eq, out, mine), new_dtype=ct.dtype, weak_type=False)
        tie = bind(convert_element_type, bind(eq, a, b), new_dtype=ct.dtype, weak_type=False)
        return _mul(ct, bind(sub, picked, _mul(tie, 0.5)))
    return partial

neg = elementwise("neg", np.negative, lambda ct, out, x: _neg(ct))
add = elementwise("add", np.add, lambda ct, *_: ct, lambda ct, *_: ct)
add_any = elementwise("add_any", np.add, lambda ct, *_: ct, lambda ct, *_: ct)
sub = elementwise("sub", np.subtract, lambda ct, *_: ct, lambda ct, *_: _neg(ct))
mul = elementwise("mul", np.multiply, lambda ct, out, x, y: _mul(ct, y),
                  lambda ct, out, x, y: _mul(ct, x))
div = elementwise("div", _int_div, lambda ct, out, x, y: _div(ct, y),
                  lambda ct, out, x, y: _neg(_div(_mul(ct, out), y)))
rem = elementwise("rem", np.fmod, lambda ct, *_: ct,
                  lambda ct, out, x, y: _neg(_mul(ct, bind(round_, _div(bind(sub, x, out), y),
                                                           rounding_method=0))))
pow_ = elementwise("pow", np.power,
                   lambda ct, out, x, y: _mul(ct, _mul(y, bind(pow_, x, bind(sub, y, 1)))),
                   lambda ct, out, x, y: _mul(ct, _mul(out, bind(log, x))))
max_ = elementwise("max", np.maximum, _choose_half(0), _choose_half(1))
min_ = elementwise("min", np.minimum, _choose_half(0), _choose_half(1))
atan2 = elementwise("atan2", np.arctan2,
                    lambda ct, out, x, y: _mul(ct, _div(y, bind(add, _mul(x, x), _mul(y, y)))),
                    lambda ct, out, x, y: _mul(ct, _div(_neg(x), bind(add, _mul(x, x), _mul(y, y)))))
nextafter = elementwise("nextafter", np.nextafter)
exp = elementwise("exp", np.exp, lambda ct, out, x: _mul(ct, out))
exp2 = elementwise("exp2", np.exp2, lambda ct, out, x: _mul(ct, _mul(out, math.log(2.0))))
log = elementwise("log", np.log, lambda ct, out, x: _div(ct, x))
log1p = elementwise("log1p", np.log1p, lambda ct, out, x: _div(ct, bind(add, x, 1.0)))
expm1 = elementwise("expm1", np.expm1, lambda ct, out, x: _mul(ct, bind(add, out, 1.0)))
tanh = elementwise("tanh", np.tanh,
                   lambda ct, out, x: _mul(ct, bind(sub, 1.0, _mul(out, out))))
logistic = elementwise("logistic", lambda x: 1 / (1 + np.exp(-x)),
                       lambda ct, out, x: _mul(ct, _mul(out, bind(sub, 1.0, out))))
sin = elementwise("sin", np.sin, lambda ct, out, x: _mul(ct, bind(cos, x)))
cos = elementwise("cos", np.cos, lambda ct, out, x: _neg(_mul(ct, bind(sin, x))))
tan = elementwise("tan", np.tan, lambda ct, out, x: _mul(ct, bind(add, 1.0, _mul(out, out))))
sinh = elementwise("sinh", np.sinh, lambda ct, out, x: _mul(ct, bind(cosh, x)))
cosh = elementwise("cosh", np.cosh, lambda ct, out, x: _mul(ct, bind(sinh, x)))
asin = elementwise("asin", np.arcsin,
                   lambda ct, out, x: _div(ct, bind(sqrt, bind(sub, 1.0, _mul(x, x)))))
acos = elementwise("acos", np.arccos,
                   lambda ct, out, x: _neg(_div(ct, bind(sqrt, bind(sub, 1.0, _mul(x, x))))))
atan = elementwise("atan", np.arctan, lambda ct, out, x: _div(ct, bind(add, 1.0, _mul(x, x))))
asinh = elementwise("asinh", np.arcsinh,
                    lambda ct, out, x: _div(ct, bind(sqrt, bind(add, _mul(x, x), 1.0))))
acosh = elementwise("acosh", np.arccosh,
                    lambda ct, out, x: _div(ct, bind(sqrt, bind(sub, _mul(x, x), 1.0))))
atanh = elementwise("atanh", np.arctanh, lambda ct, out, x: _div(ct, bind(sub, 1.0, _mul(x, x))))
sqrt = elementwise("sqrt", np.sqrt, lambda ct, out, x: _div(_mul(ct, 0.5), out))
rsqrt = elementwise("rsqrt", lambda x: 1 / np.sqrt(x),
                    lambda ct, out, x: _mul(_mul(ct, -0.5), _div(out, x)))
cbrt = elementwise("cbrt", np.cbrt, lambda ct, out, x: _div(ct, _mul(3.0, _mul(out, out))))
square = elementwise("square", np.square, lambda ct, out, x: _mul(ct, _mul(2.0, x)))
integer_pow = elementwise(
    "integer_pow", lambda x, y: x ** y,
    lambda ct, out, x, y=None: None)        # replaced below: it needs its parameter
abs_ = elementwise("abs", np.abs, lambda ct, out, x: bind(
    select_n, bind(ge, x, 0.0 if dtypes.inexact(x.dtype) else 0), _neg(ct), ct))
sign = elementwise("sign", np.sign, _zero_like)
floor = elementwise("floor", np.floor, _zero_like)
ceil = elementwise("ceil", np.ceil, _zero_like)
round_ = elementwise("round", lambda x, rounding_method=0: (
    np.where(x >= 0, np.floor(x + 0.5), np.ceil(x - 0.5)) if rounding_method == 0 else np.rint(x)),
    _zero_like)
is_finite = elementwise("is_finite", np.isfinite, compare=True)
real = elementwise("real", np.real, lambda ct, *_: ct)
imag = elementwise("imag", np.imag)
conj = elementwise("conj", np.conjugate, lambda ct, *_: bind(conj, ct))
not_ = elementwise("not", lambda x: np.logical_not(x) if x.dtype == np.bool_ else np.invert(x))
and_ = elementwise("and", lambda a, b: np.logical_and(a, b) if a.dtype == np.bool_ else a & b)
or_ = elementwise("or", lambda a, b: np.logical_or(a, b) if a.dtype == np.bool_ else a | b)
xor = elementwise("xor", lambda a, b: np.logical_xor(a, b) if a.dtype == np.bool_ else a ^ b)
shift_left = elementwise("shift_left", np.left_shift)
shift_right_arithmetic = elementwise("shift_right_arithmetic", np.right_shift)
shift_right_logical = elementwise(
    "shift_right_logical",
    lambda a, b: (a.view(a.dtype.str.replace("i", "u")) >> b).view(a.dtype))
eq = elementwise("eq", np.equal, compare=True)
ne = elementwise("ne", np.not_equal, compare=True)
lt = elementwise("lt", np.less, compare=True)
le = elementwise("le", np.less_equal, compare=True)
gt = elementwise("gt", np.greater, compare=True)
ge = elementwise("ge", np.greater_equal, compare=True)

def _integer_pow_vjp(ct, ins, outs, wants, y):
    x, = ins
    if not wants[0]:
        return [None]
    factor = _mul(float(y), bind(integer_pow, x, y=y - 1)) if y != 1 else 1.0
    return [_mul(ct, factor)]

integer_pow.vjp = _integer_pow_vjp

def _convert_abstract(x, new_dtype, weak_type=False, sharding=None):
    return x.update(dtype=dtypes.canonical(new_dtype), weak_type=weak_type)

def _convert_vjp(ct, ins, outs, wants, new_dtype, weak_type=False, sharding=None):
    x = aval_of(ins[0])
    if not wants[0] or not dtypes.inexact(x.dtype):
        return [None]
    return [bind(convert_element_type, ct, new_dtype=x.dtype, weak_type=x.weak_type)]

convert_element_type = Primitive(
    "convert_element_type", lambda x, new_dtype, weak_type=False, sharding=None:
    x.astype(dtypes.canonical(new_dtype)), _convert_abstract, vjp=_convert_vjp,
    cost=_layout_cost,
    show=lambda p: {k: v for k, v in p.items() if k != "sharding" or v is not None})
copy = elementwise("copy", np.array, lambda ct, *_: ct)
copy.cost = _layout_cost

def _select_abstract(pred, *cases):
    if pred.dtype != np.bool_ and pred.dtype.kind not in "iu":
        raise TypeError(f"select_n's predicate must be boolean or an integer, got {pred.dtype}")
    shape, dtype, weak = _common(cases, "select_n")
    if pred.shape not in ((), shape) and np.broadcast_shapes(pred.shape, shape) != shape:
        raise TypeError(f"select_n's predicate has shape {pred.shape}, its cases {shape}.")
    return Aval(shape, dtype, weak, _vma((pred,) + cases))

def _select_stacked(pred, *cases):
    dtype = dtypes.promote(*[(c.dtype, False) for c in cases])[0]
    pred, *cases = _lined_up([pred] + [c.astype(dtype, copy=False) for c in cases])
    if len(cases) == 2:
        return np.where(pred, cases[1], cases[0])
    return np.choose(pred.astype(np.intp), cases)

def _select_vjp(ct, ins, outs, wants):
    pred, cases = ins[0], ins[1:]
    zeros = bind(broadcast_in_dim, 0.0, shape=aval_of(ct).shape, broadcast_dimensions=(),
                 sharding=aval_of(ct).sharding) if len(cases) > 1 else None
    zeros = bind(convert_element_type, zeros, new_dtype=ct.dtype, weak_type=False) if zeros is not None else None
    out = [None]
    for k, (c, w) in enumerate(zip(cases, wants[1:])):
        if not w:
            out.append(None)
            continue
        picks = [ct if j == k else zeros for j in range(len(cases))]
        out.append(_unbroadcast(bind(select_n, pred, *picks), aval_of(c)))
    return out

select_n = Primitive("select_n", _select_stacked, _select_abstract, vjp=_select_vjp,
                     cost=_elementwise_cost)

def _clamp_vjp(ct, ins, outs, wants):
    lo, x, hi = ins
    inside = bind(and_, bind(ge, x, lo), bind(le, x, hi))
    zeros = bind(mul, ct, 0.0)
    return [None, _unbroadcast(bind(select_n, inside, zeros, ct), aval_of(x)) if wants[1] else None,
            None]

clamp = Primitive("clamp", _elementwise_stacked(lambda lo, x, hi: np.minimum(np.maximum(x, lo), hi)),
                  _elementwise_abstract("clamp"), vjp=_clamp_vjp, cost=_elementwise_cost)

# -- reductions -------------------------------------------------------------------------------

def _reduce_abstract(x, axes, out_sharding=None, index_dtype=None):
    for a in axes:
        if not 0 <= a < x.ndim:
            raise ValueError(f"reduction axis {a} is out of range for a value of shape {x.shape}")
    shape = tuple(s for d, s in enumerate(x.shape) if d not in axes)
    dtype = x.dtype if index_dtype is None else index_dtype
    return Aval(shape, dtype, x.weak_type and index_dtype is None, x.vma)

def _reduction(name, method, vjp=None, cost=None):
    """A row for ``reduce_<op>``: NumPy's ``x.<method>`` over the axes, on every device."""
    def stacked(x, axes, out_sharding=None):
        kwargs = {"dtype": x.dtype} if method in ("sum", "prod") else {}
        return np.asarray(getattr(x, method)(axis=_shift(axes), **kwargs), dtype=x.dtype)
    return Primitive(name, stacked, _reduce_abstract, vjp=vjp, cost=cost or _reduce_cost)

def _restore(ct, x_aval, axes):
    """A reduced cotangent broadcast back over the reduced axes."""
    kept = tuple(d for d in range(x_aval.ndim) if d not in axes)
    return bind(broadcast_in_dim, ct, shape=x_aval.shape, broadcast_dimensions=kept,
                sharding=x_aval.sharding)

def _sum_vjp(ct, ins, outs, wants, axes, out_sharding=None):
    return [_restore(ct, aval_of(ins[0]), axes) if wants[0] else None]

def _chooser_vjp(ct, ins, outs, wants, axes, out_sharding=None):
    """reduce_max/min: the cotangent is shared by the elements that attain the extreme."""
    x = ins[0]
    if not wants[0]:
        return [None]
    hits = bind(convert_element_type, bind(eq, x, _restore(outs[0], aval_of(x), axes)),
                new_dtype=ct.dtype, weak_type=False)
    counts = bind(reduce_sum, hits, axes=axes)
    return [_mul(hits, _restore(_div(ct, counts), aval_of(x), axes))]

def _prod_vjp(ct, ins, outs, wants, axes, out_sharding=None):
    x = ins[0]
    return [_mul(_restore(_mul(ct, outs[0]), aval_of(x), axes), bind(div, 1.0, x)) if wants[0] else None]

def _reduce_cost(ins, outs, **params):
    return _size(ins[0]), _bytes(ins, outs)

def _sum_cost(ins, outs, **params):
    """n - 1 additions per result for a sum of n, reading the input and writing the result
    at the input's width (jax.experimental.roofline's rule)."""
    x, out = ins[0], outs[0]
    n = _size(x) // max(_size(out), 1)
    return (n - 1) * _size(out), (_size(x) + _size(out)) * x.dtype.itemsize

reduce_sum = _reduction("reduce_sum", "sum", _sum_vjp, _sum_cost)
reduce_max = _reduction("reduce_max", "max", _chooser_vjp)
reduce_min = _reduction("reduce_min", "min", _chooser_vjp)
reduce_prod = _reduction("reduce_prod", "prod", _prod_vjp)
reduce_and = _reduction("reduce_and", "all")
reduce_or = _reduction("reduce_or", "any")
argmax = Primitive("argmax", lambda x, axes, index_dtype: x.argmax(axis=axes[0] + 1).astype(index_dtype),
                   _reduce_abstract, cost=_reduce_cost)
argmin = Primitive("argmin", lambda x, axes, index_dtype: x.argmin(axis=axes[0] + 1).astype(index_dtype),
                   _reduce_abstract, cost=_reduce_cost)

def _cumulative(name, ufunc, vjp=None):
    """A row for ``cum<op>``: NumPy's ``ufunc.accumulate`` along one axis (or reversed)."""
    def stacked(x, axis, reverse=False):
        a = axis + 1
        if reverse:
            return np.flip(ufunc.accumulate(np.flip(x, a), axis=a, dtype=x.dtype), a)
        return ufunc.accumulate(x, axis=a, dtype=x.dtype)
    return Primitive(name, stacked, lambda x, axis, reverse=False: x, vjp=vjp, cost=_reduce_cost)

def _cumsum_vjp(ct, ins, outs, wants, axis, reverse=False):
    return [bind(cumsum, ct, axis=axis, reverse=not reverse) if wants[0] else None]

cumsum = _cumulative("cumsum", np.add, _cumsum_vjp)
cumprod = _cumulative("cumprod", np.multiply)
cummax = _cumulative("cummax", np.maximum)
cummin = _cumulative("cummin", np.minimum)

# -- shapes and layout ------------------------------------------------------------------------

def _reshape_abstract(x, new_sizes, dimensions=None, sharding=None):
    if math.prod(new_sizes) != x.size:
        raise TypeError(f"cannot reshape a value of shape {x.shape} ({x.size} elements) into "
                        f"shape {tuple(new_sizes)} ({math.prod(new_sizes)} elements).")
    return x.update(shape=new_sizes)

reshape = Primitive(
    "reshape", lambda x, new_sizes, dimensions=None, sharding=None:
    x.reshape(x.shape[:1] + tuple(new_sizes)), _reshape_abstract,
    vjp=lambda ct, ins, outs, wants, **p: [
        bind(reshape, ct, new_sizes=aval_of(ins[0]).shape, dimensions=None,
             sharding=aval_of(ins[0]).sharding) if wants[0] else None],
    cost=_layout_cost)

def _bid_abstract(x, shape, broadcast_dimensions, sharding=None):
    dims = tuple(broadcast_dimensions)
    if len(dims) != x.ndim or any(x.shape[k] not in (1, shape[d]) for k, d in enumerate(dims)):
        raise TypeError(f"broadcast_in_dim cannot broadcast shape {x.shape} to {tuple(shape)} "
                        f"along dimensions {dims}.")
    return x.update(shape=shape, weak_type=x.weak_type)

def _bid_stacked(x, shape, broadcast_dimensions, sharding=None):
    expanded = [1] * len(shape)
    for k, d in enumerate(broadcast_dimensions):
        expanded[d] = x.shape[k + 1]
    return np.broadcast_to(x.reshape(x.shape[:1] + tuple(expanded)), x.shape[:1] + tuple(shape))

def _bid_vjp(ct, ins, outs, wants, shape, broadcast_dimensions, sharding=None):
    if not wants[0]:
        return [None]
    x = aval_of(ins[0])
    dims = tuple(broadcast_dimensions)
    new = tuple(d for d in range(len(shape)) if d not in dims)
    stretched = tuple(d for k, d in enumerate(dims) if x.shape[k] == 1 and shape[d] != 1)
    summed = bind(reduce_sum, ct, axes=tuple(sorted(new + stretched))) if new or stretched else ct
    return [bind(reshape, summed, new_sizes=x.shape, dimensions=None)
            if summed.aval.shape != x.shape else summed]

broadcast_in_dim = Primitive(
    "broadcast_in_dim", _bid_stacked, _bid_abstract, vjp=_bid_vjp, cost=_layout_cost,
    show=lambda p: {k: v for k, v in p.items()
                    if (k == "broadcast_dimensions" and v) or k not in ("shape", "sharding",
                                                                          "broadcast_dimensions")})

def _transpose_vjp(ct, ins, outs, wants, permutation):
    return [bind(transpose, ct, permutation=tuple(int(i) for i in np.argsort(permutation)))
            if wants[0] else None]

transpose = Primitive(
    "transpose", lambda x, permutation: x.transpose((0,) + _shift(permutation)),
    lambda x, permutation: x.update(shape=tuple(x.shape[p] for p in permutation)),
    vjp=_transpose_vjp, cost=_layout_cost)

def _squeeze_abstract(x, dimensions):
    for d in dimensions:
        if x.shape[d] != 1:
            raise ValueError(f"cannot squeeze dimension {d} of shape {x.shape}: its size is not 1")
    return x.update(shape=tuple(s for d, s in enumerate(x.shape) if d not in dimensions))

squeeze = Primitive(
    "squeeze", lambda x, dimensions: x.reshape(x.shape[:1] + tuple(
        s for d, s in enumerate(x.shape[1:]) if d not in dimensions)),
    _squeeze_abstract, vjp=reshape.vjp, cost=_layout_cost)
rev = Primitive("rev", lambda x, dimensions: np.flip(x, _shift(dimensions)),
                lambda x, dimensions: x,
                vjp=lambda ct, ins, outs, wants, dimensions: [
                    bind(rev, ct, dimensions=dimensions) if wants[0] else None],
                cost=_layout_cost)

def _concat_abstract(*xs, dimension):
    first = xs[0]
    for x in xs[1:]:
        if x.ndim != first.ndim or any(a != b for d, (a, b) in enumerate(zip(x.shape, first.shape))
                                      if d != dimension):
            raise TypeError(f"concatenate needs equal shapes except along dimension {dimension}, "
                            f"got {', '.join(str(x.shape) for x in xs)}.")
    shape = list(first.shape)
    shape[dimension] = sum(x.shape[dimension] for x in xs)
    dtype, weak = dtypes.promote(*[(x.dtype, x.weak_type) for x in xs])
    return Aval(shape, dtype, weak, _vma(xs))

def _concat_vjp(ct, ins, outs, wants, dimension):
    out, start = [], 0
    for x, w in zip(ins, wants):
        size = aval_of(x).shape[dimension]
        if w:
            lo = [0] * aval_of(ct).ndim
            hi = list(aval_of(ct).shape)
            lo[dimension], hi[dimension] = start, start + size
            out.append(bind(slice_, ct, start_indices=tuple(lo), limit_indices=tuple(hi),
                            strides=None))
        else:
            out.append(None)
        start += size
    return out

def _concat_stacked(*xs, dimension):
    dtype = dtypes.promote(*[(x.dtype, False) for x in xs])[0]
    return np.concatenate([x.astype(dtype, copy=False) for x in xs], axis=dimension + 1)

concatenate = Primitive("concatenate", _concat_stacked, _concat_abstract, vjp=_concat_vjp,
                        cost=_layout_cost)

def _pad_stacked(x, padding_value, padding_config):
    """lax.pad: ``(low, high, interior)`` per dimension; low and high may be negative."""
    shape = [x.shape[0]]
    for n, (lo, hi, inner) in zip(x.shape[1:], padding_config):
        shape.append(max(lo + hi + n + max(n - 1, 0) * inner, 0))
    out = np.empty(shape, dtype=x.dtype)
    out[...] = padding_value.reshape(padding_value.shape[:1] + (1,) * (len(shape) - 1))
    src, dst = [slice(None)], [slice(None)]
    for n, (lo, hi, inner) in zip(x.shape[1:], padding_config):
        positions = lo + np.arange(n) * (inner + 1)
        keep = (positions >= 0) & (positions < shape[len(dst)])
        src.append(np.nonzero(keep)[0])
        dst.append(positions[keep])
    grids_src = np.ix_(*[np.arange(x.shape[0])] + src[1:])
    grids_dst = np.ix_(*[np.arange(x.shape[0])] + dst[1:])
    out[grids_dst] = x[grids_src]
    return out

def _pad_abstract(x, padding_value, padding_config):
    shape = [max(lo + hi + n + max(n - 1, 0) * inner, 0)
             for n, (lo, hi, inner) in zip(x.shape, padding_config)]
    return x.update(shape=shape)

def _pad_vjp(ct, ins, outs, wants, padding_config):
    if not wants[0]:
        return [None, None]
    x = aval_of(ins[0])
    lo = [-l for l, _, _ in padding_config]
    hi = [-h for _, h, _ in padding_config]
    unpadded = bind(pad, ct, 0.0, padding_config=tuple((a, b, 0) for a, b in zip(lo, hi)))
    strides = tuple(inner + 1 for _, _, inner in padding_config)
    return [bind(slice_, unpadded, start_indices=(0,) * x.ndim,
                 limit_indices=unpadded.aval.shape, strides=strides), None]

pad = Primitive("pad", _pad_stacked, _pad_abstract, vjp=_pad_vjp, cost=_layout_cost)

def _slice_abstract(x, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * x.ndim
    shape = []
    for n, a, b, s in zip(x.shape, start_indices, limit_indices, strides):
        if not 0 <= a <= b <= n:
            raise IndexError(f"slice [{a}:{b}] is out of bounds for a dimension of size {n}")
        shape.append(len(range(a, b, s)))
    return x.update(shape=shape)

def _slice_stacked(x, start_indices, limit_indices, strides=None):
    strides = strides or (1,) * len(start_indices)
    return x[(slice(None),) + tuple(slice(a, b, s) for a, b, s in
                                    zip(start_indices, limit_indices, strides))]

def _slice_vjp(ct, ins, outs, wants, start_indices, limit_indices, strides=None):
    if not wants[0]:
        return [None]
    x = aval_of(ins[0])
    strides = strides or (1,) * x.ndim
    config = []
    for n, a, b, s, m in zip(x.shape, start_indices, limit_indices, strides, aval_of(ct).shape):
        last = a + (m - 1) * s if m else a - 1
        config.append((a, n - last - 1, s - 1))
    return [bind(pad, ct, bind(convert_element_type, 0.0, new_dtype=ct.dtype, weak_type=False),
                 padding_config=tuple(config))]

slice_ = Primitive("slice", _slice_stacked, _slice_abstract, vjp=_slice_vjp, cost=_layout_cost)

# -- dynamic slices: a window whose start is a value (``x[i]`` with a traced ``i``) -----------

def _window(x, starts, sizes):
    """Each device's window: its starts clamped into range, as XLA clamps them."""
    at = [np.clip(np.broadcast_to(np.asarray(s).reshape(-1), x.shape[:1]), 0, n - k)
          for s, n, k in zip(starts, x.shape[1:], sizes)]
    return [(k,) + tuple(slice(a[k], a[k] + m) for a, m in zip(at, sizes))
            for k in range(x.shape[0])]

def _dslice_stacked(x, *starts, slice_sizes):
    return np.stack([x[w] for w in _window(x, starts, slice_sizes)])

def _dslice_vjp(ct, ins, outs, wants, slice_sizes):
    x = aval_of(ins[0])
    zero = bind(broadcast_in_dim, np.zeros((), x.dtype), shape=x.shape, broadcast_dimensions=(),
                sharding=x.sharding)
    return [bind(dynamic_update_slice, zero, ct, *ins[1:]) if wants[0] else None] + \
        [None] * (len(ins) - 1)

def _dupdate_stacked(x, v, *starts):
    out = np.array(x, copy=True)
    for w in _window(out, starts, v.shape[1:]):
        out[w] = v[w[0]]
    return out

def _dupdate_vjp(ct, ins, outs, wants):
    v, starts = aval_of(ins[1]), ins[2:]
    hole = bind(broadcast_in_dim, np.zeros((), v.dtype), shape=v.shape, broadcast_dimensions=(),
                sharding=None)
    return [bind(dynamic_update_slice, ct, hole, *starts) if wants[0] else None,
            bind(dynamic_slice, ct, *starts, slice_sizes=v.shape) if wants[1] else None] + \
        [None] * len(starts)

dynamic_slice = Primitive(
    "dynamic_slice", _dslice_stacked, lambda x, *starts, slice_sizes: x.update(
        shape=slice_sizes, vma=_vma((x,) + starts)), vjp=_dslice_vjp, cost=_layout_cost)
dynamic_update_slice = Primitive(
    "dynamic_update_slice", _dupdate_stacked, lambda x, v, *starts: x.update(
        vma=_vma((x, v) + starts)), vjp=_dupdate_vjp, cost=_layout_cost, show=lambda p: {})

iota = Primitive(        # no operand: one device's value, which every device shares
    "iota", lambda *, dtype, shape, dimension, sharding=None: np.arange(
        shape[dimension], dtype=dtype).reshape(
        [shape[dimension] if d == dimension else 1 for d in range(len(shape))]) + np.zeros(
        shape, dtype), lambda *, dtype, shape, dimension, sharding=None: Aval(shape, dtype),
    cost=_layout_cost)

# -- matrix products ------------------------------------------------------------------------

def _dot_dims(dimension_numbers):
    (lc, rc), (lb, rb) = dimension_numbers
    return tuple(lc), tuple(rc), tuple(lb), tuple(rb)

def _dot_abstract(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                  out_sharding=None):
    lc, rc, lb, rb = _dot_dims(dimension_numbers)
    for a, b in zip(lc + lb, rc + rb):
        if lhs.shape[a] != rhs.shape[b]:
            raise TypeError(
                f"dot_general requires contracting and batch dimensions to have the same "
                f"size, got {lhs.shape} and {rhs.shape} along dimensions {a} and {b}.")
    free_l = [s for d, s in enumerate(lhs.shape) if d not in lc + lb]
    free_r = [s for d, s in enumerate(rhs.shape) if d not in rc + rb]
    dtype = preferred_element_type or dtypes.promote((lhs.dtype, lhs.weak_type),
                                                     (rhs.dtype, rhs.weak_type))[0]
    return Aval([lhs.shape[d] for d in lb] + free_l + free_r, dtype, False,
                lhs.vma | rhs.vma)

def _dot_stacked(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None,
                 out_sharding=None):
    """Every device's dot_general as one batched matmul: the device axis is a batch axis."""
    lc, rc, lb, rb = _dot_dims(dimension_numbers)
    dtype = np.dtype(preferred_element_type or dtypes.promote((lhs.dtype, False), (rhs.dtype, False))[0])
    lhs, rhs = lhs.astype(dtype, copy=False), rhs.astype(dtype, copy=False)
    lc, rc, lb, rb = (_shift(d) for d in (lc, rc, lb, rb))
    lf = [d for d in range(1, lhs.ndim) if d not in lc + lb]
    rf = [d for d in range(1, rhs.ndim) if d not in rc + rb]
    batch = [lhs.shape[0]] + [lhs.shape[d] for d in lb]
    m = math.prod(lhs.shape[d] for d in lf)
    k = math.prod(lhs.shape[d] for d in lc)
    n = math.prod(rhs.shape[d] for d in rf)
    if rhs.strides[0] == 0 and not rb:              # a weight every device shares
        a = lhs.transpose([0] + list(lb) + lf + list(lc)).reshape(math.prod(batch) * m, k)
        b = rhs[0].transpose([d - 1 for d in rc] + [d - 1 for d in rf]).reshape(k, n)
        out = a @ b
    else:
        a = lhs.transpose([0] + list(lb) + lf + list(lc)).reshape(batch + [m, k])
        b = rhs.transpose([0] + list(rb) + list(rc) + rf).reshape(batch + [k, n])
        out = np.matmul(a, b)
    shape = batch + [lhs.shape[d] for d in lf] + [rhs.shape[d] for d in rf]
    return out.reshape(shape)

def _dot_vjp(ct, ins, outs, wants, dimension_numbers, precision=None,
             preferred_element_type=None, out_sharding=None):
    """The transposes of dot_general (jax's _dot_general_transpose_lhs/rhs)."""
    lhs, rhs = aval_of(ins[0]), aval_of(ins[1])
    lc, rc, lb, rb = _dot_dims(dimension_numbers)
    nb = len(lb)

    def one(x, y, xc, yc, xb, yb, x_first):
        x_free = [d for d in range(x.ndim) if d not in xc + xb]
        y_free = [d for d in range(y.ndim) if d not in yc + yb]
        # ct's dims: batch, lhs free, rhs free
        ct_free_y = list(range(nb + (len(x_free) if x_first else 0),
                               nb + (len(x_free) if x_first else 0) + len(y_free)))
        ct_free_x = list(range(nb + (0 if x_first else len(y_free)),
                               nb + (0 if x_first else len(y_free)) + len(x_free)))
        dims = ((tuple(ct_free_y), tuple(y_free)), (tuple(range(nb)), tuple(yb)))
        y_val = ins[1] if x_first else ins[0]
        # prod's dims: batch, x free (in ct order), y's contracting dims (in order of yc sorted)
        y_rest = [d for d in range(y.ndim) if d not in yb and d not in y_free]
        placed = list(xb) + x_free + [xc[list(yc).index(d)] for d in y_rest]
        prod = bind(dot_general, ct, y_val, dimension_numbers=dims, preferred_element_type=x.dtype,
                    out_sharding=x.sharding and x.sharding.cotangent().transpose(placed))
        perm = tuple(int(i) for i in np.argsort(placed))
        return bind(transpose, prod, permutation=perm) if perm != tuple(range(len(perm))) else prod
    return [one(lhs, rhs, lc, rc, lb, rb, True) if wants[0] else None,
            one(rhs, lhs, rc, lc, rb, lb, False) if wants[1] else None]

def _dot_cost(ins, outs, dimension_numbers, **params):
    lc, _, lb, _ = _dot_dims(dimension_numbers)
    lhs, rhs = ins
    shared = math.prod(lhs.shape[d] for d in lc + lb)
    return 2 * _size(lhs) * _size(rhs) // max(shared, 1), _bytes(ins, outs)

dot_general = Primitive(
    "dot_general", _dot_stacked, _dot_abstract, vjp=_dot_vjp, cost=_dot_cost,
    show=lambda p: {k: v for k, v in p.items() if v is not None or k == "preferred_element_type"})

# -- indexing by arrays: NumPy's advanced indexing, JAX's gather and scatter ------------------
# ``indexer`` is the index with each array replaced by its position among the operands
# (``("array", k)``); the arrays follow the indexed value as operands.

def _resolve(indexer, arrays):
    return tuple(arrays[i[1]] if isinstance(i, tuple) and i and i[0] == "array" else i
                 for i in indexer)

def _kept_dims(indexer, ndim) -> list:
    """The dimensions an index keeps whole (``:`` or left out), when it has no ``None``
    or ``...``; else None."""
    if any(i is None or i is Ellipsis for i in indexer):
        return None
    return [d for d in range(ndim) if d >= len(indexer) or indexer[d] == slice(None)]

def _gather_abstract(x, *arrays, indexer, mode=None):
    # A probe with the kept dimensions emptied: NumPy gives the result's shape without
    # allocating it (the result of a lookup can be gigabytes), then those sizes go back.
    kept = _kept_dims(indexer, len(x.shape)) if isinstance(indexer, tuple) else None
    empty = [0 if kept and d in kept else n for d, n in enumerate(x.shape)]
    probe = np.broadcast_to(np.zeros((), x.dtype), tuple(empty) if kept else x.shape)
    fakes = [np.zeros(a.shape, a.dtype) for a in arrays]
    try:
        shape = probe[_resolve(indexer, fakes)].shape
        if kept:
            zeros = [k for k, n in enumerate(shape) if n == 0]
            if len(zeros) == len(kept):
                shape = tuple(x.shape[kept[zeros.index(k)]] if k in zeros else n
                              for k, n in enumerate(shape))
            else:                             # an index of size 0 too: look again, whole
                shape = np.broadcast_to(np.zeros((), x.dtype), x.shape)[
                    _resolve(indexer, fakes)].shape
    except IndexError as exc:
        raise IndexError(f"index {indexer} does not fit a value of shape {x.shape}: {exc}") from None
    return Aval(shape, x.dtype, x.weak_type, _vma((x,) + arrays))

def _per_device(fn, *stacks):
    return np.stack([fn(*(s[k] for s in stacks)) for k in range(stacks[0].shape[0])])

def _gather_stacked(x, *arrays, indexer, mode=None):
    if all(a.strides[0] == 0 for a in arrays):             # the same index on every device
        index = _resolve(indexer, [a[0] for a in arrays])
        adjacent = [k for k, i in enumerate(index) if not _basic(i)]
        if not adjacent or adjacent == list(range(adjacent[0], adjacent[-1] + 1)):
            return x[(slice(None),) + index]
    return _per_device(lambda v, *a: v[_resolve(indexer, a)], x, *arrays)

def _basic(i):
    return i is None or i is Ellipsis or isinstance(i, (int, np.integer, slice))

def _gather_vjp(ct, ins, outs, wants, indexer, mode=None):
    if not wants[0]:
        return [None] * len(ins)
    x = aval_of(ins[0])
    zeros = bind(broadcast_in_dim, bind(convert_element_type, 0.0, new_dtype=ct.dtype,
                                        weak_type=False),
                 shape=x.shape, broadcast_dimensions=(), sharding=x.sharding)
    return [bind(scatter_add, zeros, ct, *ins[1:], indexer=indexer)] + [None] * (len(ins) - 1)

def _gather_cost(ins, outs, mode=None, **params):
    """A copy of the result's size plus the indices read (jax.experimental.roofline); with
    ``mode`` fill-or-drop, four checks per index and a select per result element."""
    out, indices = _size(outs[0]), sum(_size(a) for a in ins[1:])
    flops = 4 * indices + out if "FILL" in str(mode).upper() else 0
    return flops, 2 * out * outs[0].dtype.itemsize + _bytes(ins[1:], ())

gather = Primitive("gather", _gather_stacked, _gather_abstract, vjp=_gather_vjp,
                   cost=_gather_cost)

def _scatter_stacked(how):
    def stacked(x, v, *arrays, indexer):
        out = np.array(x, copy=True)
        v = v.astype(x.dtype, copy=False)
        for k in range(out.shape[0]):
            index = _resolve(indexer, [a[k] for a in arrays])
            if how is None:
                out[k][index] = v[k]
            else:
                how.at(out[k], index, v[k])
        return out
    return stacked

def _scatter_abstract(x, v, *arrays, indexer):
    return x.update(vma=_vma((x, v) + arrays))

def _scatter_vjp(how):
    def vjp(ct, ins, outs, wants, indexer):
        v, arrays = ins[1], ins[2:]
        out = [None] * len(ins)
        if wants[0]:           # .set overwrites the region, so its cotangent stops there
            out[0] = ct if how == "add" else bind(
                scatter, ct, bind(mul, bind(gather, ct, *arrays, indexer=indexer), 0.0),
                *arrays, indexer=indexer)
        if wants[1]:
            out[1] = _unbroadcast(bind(gather, ct, *arrays, indexer=indexer), aval_of(v))
        return out
    return vjp

def _scatter_cost(combines):
    """Reading and writing the updated region and the updates (3 x the updates) plus the
    indices; one FLOP per update where it is combined (jax.experimental.roofline)."""
    def cost(ins, outs, **params):
        if "indexer" in params:                  # simpmd's operands: x, updates, *indices
            updates, indices = ins[1], ins[2:]
        else:                                    # JAX's: operand, indices, updates
            indices, updates = ins[1:2], ins[2]
        flops = _size(updates) if combines else 0
        return flops, 3 * _size(updates) * updates.dtype.itemsize + _bytes(indices, ())
    return cost

def _scatter(name, how, vjp=None):
    """A row for ``scatter`` (``how`` None: set) or ``scatter-<op>`` (``how.at``)."""
    return Primitive(name, _scatter_stacked(how), _scatter_abstract, vjp=vjp,
                     cost=_scatter_cost(how is not None))

scatter = _scatter("scatter", None, _scatter_vjp("set"))
scatter_add = _scatter("scatter-add", np.add, _scatter_vjp("add"))
scatter_mul = _scatter("scatter-mul", np.multiply)
scatter_min = _scatter("scatter-min", np.minimum)
scatter_max = _scatter("scatter-max", np.maximum)

def _sort_stacked(*xs, dimension, is_stable=True, num_keys=1):
    order = np.argsort(xs[0], axis=dimension + 1, kind="stable")
    return [np.take_along_axis(x, order, axis=dimension + 1) for x in xs]

sort = Primitive("sort", _sort_stacked,
                 lambda *xs, dimension, is_stable=True, num_keys=1: list(xs),
                 cost=_reduce_cost, multiple_results=True)

# -- the long tail: a NumPy function run on each device -------------------------------------

def _call_stacked(*xs, fn, kwargs, name):
    return _per_device(lambda *v: np.asarray(fn(*v, **dict(kwargs))), *xs)

def _call_abstract(*xs, fn, kwargs, name):
    if sum(x.size for x in xs) > 1 << 20:
        raise NotImplementedError(
            f"numpy.{name} has no shape rule in simpmd, and its operands are too large to "
            f"find its result's shape by running it on zeros. Use operations with JAX "
            f"primitives (arithmetic, reductions, reshapes, indexing) in a program run on "
            f"shapes only.")
    out = np.asarray(fn(*(np.zeros(x.shape, x.dtype) for x in xs), **dict(kwargs)))
    return Aval(out.shape, dtypes.canonical(out.dtype), False, _vma(xs))

numpy_call = Primitive("numpy_call", _call_stacked, _call_abstract, cost=_elementwise_cost,
                       show=lambda p: {"fn": f"numpy.{p['name']}"}, named=lambda p: f"numpy.{p['name']}")

