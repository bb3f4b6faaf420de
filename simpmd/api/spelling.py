"""The NumPy spelling of an operation, turned into primitives before anything is computed.
(The core's :class:`~simpmd.core.values.StackedValue` gets its operators and methods here.)

This is what ``jax.numpy`` is to ``jax.lax``: ``x * 2`` promotes the dtypes by JAX's rules,
lines the ranks up with ``broadcast_in_dim`` and binds ``mul``; ``x.mean(0)`` binds
``reduce_sum`` then ``div``; ``x[0]`` binds ``slice`` then ``squeeze``; ``x @ w`` binds
``dot_general``. A mapped value's operators and methods (``values.py``) and
``simpmd.numpy``'s functions come here, so the program a body traces to reads as JAX's
does. A NumPy function with no such spelling runs on each device as it is (``numpy_call``).
"""
from __future__ import annotations

import math

import numpy as np

from ..core import dtypes, errors
from ..core import primitives as P
from ..core.core import Aval, aval_of, bind, context
from ..core.values import StackedValue
from .jit_call import call_in_body
from .printer import forms
from ..partitioner.rows import broadcast_sharding
from ..partitioner.sharding import Sharding, reductions_of, resolve
from ..core.collectives import pvary
from ..partitioner.sharding import check_placed
from ..partitioner.sharding import settings


def refused_numpy(name, args):
    """The error for a NumPy function applied to a traced value, pointing to simpmd.numpy."""
    first = next((a for a in _leaves(args) if isinstance(a, StackedValue)), None)
    what = f" of shape {first.shape} {first.dtype}" if first is not None else ""
    return errors.TracerArrayConversionError(
        f"{name}() was applied to a mapped value{what}. Real JAX refuses this "
        f"(TracerArrayConversionError): a NumPy function needs a concrete array, and a traced "
        f"value has none. Use simpmd.numpy, which runs NumPy on simpmd's devices and jax.numpy "
        f"inside real JAX: `import simpmd.numpy as snp` then `snp.{name.split('.', 1)[1]}(...)`. "
        f"Operators and methods (x * 2, x.sum()) work on both engines as they are.")


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    else:
        yield x



def is_value(x) -> bool:
    """A mapped value (every device's, or its type alone), rather than a constant."""
    return isinstance(getattr(x, "aval", None), Aval)


def _typed(x):
    a = aval_of(x)
    return a.dtype, a.weak_type


def convert(x, dtype, weak=False):
    """``x`` as ``dtype``: an equation for a mapped value, NumPy for a constant."""
    dtype = dtypes.canonical(dtype)
    if is_value(x):
        if x.aval.dtype == dtype and x.aval.weak_type == weak:
            return x
        return bind(P.convert_element_type, x, new_dtype=dtype, weak_type=weak)
    if dtypes.is_weak_scalar(x) and weak:
        return x
    return np.asarray(x, dtype=dtype)


def promoted(*xs, to_float=False, ranks=True):
    """The operands converted to their common dtype (JAX's lattice), ranks lined up
    (unless ``ranks`` is False: a matrix product has its own rules for them)."""
    dtype, weak = dtypes.promote(*[_typed(x) for x in xs])
    if to_float and dtype.kind in "biu":
        dtype, weak = dtypes.default("f"), False
    xs = [_as_type(x, dtype, weak) for x in xs]
    if not ranks:
        return xs
    rank = max(np.ndim(x) if not is_value(x) else x.aval.ndim for x in xs)
    return [_to_rank(x, rank) for x in xs]


def _as_type(x, dtype, weak):
    """An operand in the operation's dtype, as jnp promotes it: a value converted (weakly
    typed where the result is, as ``axis_index(...) * 0.01`` is), a Python number kept a
    weak literal of the result's kind, any other constant a NumPy array."""
    if is_value(x):
        return x if _typed(x) == (dtype, weak) else convert(x, dtype, weak)
    if weak and dtypes.is_weak_scalar(x):
        return {"f": float, "c": complex, "b": bool}.get(dtype.kind, int)(x)
    return np.asarray(x, dtype=dtype)


def _to_rank(x, rank):
    """Rank promotion, as jnp does it: leading length-1 axes (a scalar stays a scalar)."""
    ndim = x.aval.ndim if is_value(x) else np.ndim(x)
    if ndim == rank or ndim == 0:
        return x
    if not is_value(x):
        return np.reshape(x, (1,) * (rank - ndim) + np.shape(x))
    shape = (1,) * (rank - ndim) + x.aval.shape
    return bind(P.broadcast_in_dim, x, shape=shape,
                broadcast_dimensions=tuple(range(rank - ndim, rank)), sharding=None)


def binary(prim, to_float=False):
    def op(a, b):
        return bind(prim, *promoted(a, b, to_float=to_float))
    op.__name__ = prim.name
    return op


def unary(prim, to_float=False):
    def op(x):
        if to_float and aval_of(x).dtype.kind in "biu":
            x = convert(x, dtypes.default("f"))
        return bind(prim, x)
    op.__name__ = prim.name
    return op


add, subtract, multiply = binary(P.add), binary(P.sub), binary(P.mul)
true_divide = binary(P.div, to_float=True)
power_float = binary(P.pow_)
maximum, minimum, arctan2 = binary(P.max_), binary(P.min_), binary(P.atan2, to_float=True)
equal, not_equal, less = binary(P.eq), binary(P.ne), binary(P.lt)
less_equal, greater, greater_equal = binary(P.le), binary(P.gt), binary(P.ge)
bitwise_and, bitwise_or, bitwise_xor = binary(P.and_), binary(P.or_), binary(P.xor)
left_shift, right_shift = binary(P.shift_left), binary(P.shift_right_arithmetic)
negative, absolute, sign = unary(P.neg), unary(P.abs_), unary(P.sign)
floor, ceil, invert, square = unary(P.floor), unary(P.ceil), unary(P.not_), unary(P.square)
real, imag, conjugate, isfinite = unary(P.real), unary(P.imag), unary(P.conj), unary(P.is_finite)
FLOAT_UNARY = {"exp": P.exp, "exp2": P.exp2, "log": P.log, "log1p": P.log1p, "expm1": P.expm1,
               "tanh": P.tanh, "sin": P.sin, "cos": P.cos, "tan": P.tan, "arcsin": P.asin,
               "arccos": P.acos, "arctan": P.atan, "sinh": P.sinh, "cosh": P.cosh,
               "arcsinh": P.asinh, "arccosh": P.acosh, "arctanh": P.atanh, "sqrt": P.sqrt,
               "cbrt": P.cbrt}
globals().update({name: unary(prim, to_float=True) for name, prim in FLOAT_UNARY.items()})


# -- jnp's functions that JAX itself jits: one ``jit`` equation each, named as JAX names it --


def jnp_jit(name):
    """Decorate a spelling that ``jax.numpy`` wraps in ``jax.jit`` (``remainder``,
    ``clip``, ``where``, ...): called on a traced value it is one ``jit`` equation named
    ``name``, whose body (traced once per signature) does what jnp's does, as
    ``make_jaxpr`` prints it; its Python-number arguments are weak-typed operands."""
    def wrap(fn):
        fn.__name__ = fn.__qualname__ = name

        def call(*args):
            run = context.run
            if run is None or run.eager or not any(is_value(a) for a in args):
                return fn(*args)
            return call_in_body(fn, args)
        call.__name__ = name
        return call
    return wrap


def _like(x, value):
    """A constant of ``x``'s dtype (jnp's ``_constant_like``): a strong literal."""
    return np.asarray(value, dtype=aval_of(x).dtype)


@jnp_jit("_where")
def _where(condition, x, y):
    x, y = promoted(x, y)
    condition = convert(condition, np.bool_)
    shaped = (condition, x, y) if aval_of(condition).ndim else (x, y)   # (a scalar
    rank = max(aval_of(v).ndim for v in shaped)        # condition selects without broadcasting)
    shaped = [_to_rank(v, rank) for v in shaped]
    shape = np.broadcast_shapes(*(aval_of(v).shape for v in shaped))
    layout = _broadcast_layout(*shaped)              # under jit: where jnp puts them
    shaped = [broadcast_to(v, shape, out_sharding=layout) for v in shaped]
    condition, x, y = shaped if len(shaped) == 3 else [condition] + shaped
    return bind(P.select_n, condition, y, x)


@jnp_jit("floor_divide")
def floor_divide(a, b):
    a, b = promoted(a, b)
    if aval_of(a).dtype.kind == "u":
        return bind(P.div, a, b)
    if aval_of(a).dtype.kind in "bi":
        quotient = bind(P.div, a, b)
        fix = bind(P.and_, bind(P.ne, bind(P.sign, a), bind(P.sign, b)),
                   bind(P.ne, bind(P.rem, a, b), _like(a, 0)))
        return _where(fix, bind(P.sub, quotient, _like(a, 1)), quotient)
    return _float_divmod(a, b)[0]


def _float_divmod(a, b):
    """jnp's float floor division (CPython's float_divmod): the quotient and the modulus."""
    mod = bind(P.rem, a, b)
    if forms().guards_zero_divisor():           # (the running JAX's body; jax 0.7 had none)
        div = bind(P.div, _where(bind(P.eq, b, _like(b, 0)), a, bind(P.sub, a, mod)), b)
    else:
        div = bind(P.div, bind(P.sub, a, mod), b)
    ind = bind(P.and_, bind(P.ne, mod, _like(mod, 0)),
               bind(P.ne, bind(P.sign, b), bind(P.sign, mod)))
    mod = bind(P.select_n, ind, mod, bind(P.add, mod, b))
    div = bind(P.select_n, ind, div, bind(P.sub, div, _like(div, 1)))
    return bind(P.round_, div, rounding_method=0), mod


@jnp_jit("remainder")
def remainder(a, b):
    a, b = promoted(a, b)
    if aval_of(b).dtype.kind in "iu":
        zero, ones = bind(P.eq, b, _like(b, 0)), _like(b, 1)   # (lax._ones: a broadcast)
        if aval_of(b).ndim:
            ones = bind(P.broadcast_in_dim, ones, shape=aval_of(b).shape, broadcast_dimensions=(),
                        sharding=None)
        b = _where(zero, ones, b)
    r = bind(P.rem, a, b)                          # the sign of the dividend; give it b's
    nonzero = bind(P.ne, r, _like(r, 0))
    fix = bind(P.and_, bind(P.ne, bind(P.lt, r, _like(r, 0)), bind(P.lt, b, _like(b, 0))),
               nonzero)
    return bind(P.select_n, fix, r, bind(P.add, r, b))


def power(a, b):
    if type(b) is int and dtypes.inexact(aval_of(a).dtype) or (
            type(b) is int and b >= 0):
        return bind(P.integer_pow, a, y=b)
    return power_float(a, b)


def logical_not(x):
    return bind(P.not_, convert(x, np.bool_))


def round_(x, decimals=0, out=None):
    refuse_out(out, "round")
    if decimals:
        factor = 10.0 ** decimals
        return true_divide(_round(multiply(x, factor)), factor)
    return _round(x)


@jnp_jit("round")
def _round(x):
    return bind(P.round_, x, rounding_method=1)


def clip(x, a_min=None, a_max=None, **kwargs):
    return _clip(x, kwargs.get("min", a_min), kwargs.get("max", a_max))


@jnp_jit("clip")
def _clip(x, a_min, a_max):
    if a_min is not None:
        x = maximum(a_min, x)
    if a_max is not None:
        x = minimum(a_max, x)
    return x


def where(condition, x=None, y=None):
    if x is None or y is None:
        raise TypeError("where(condition) alone gives data-dependent shapes, which a traced "
                        "body cannot have (JAX refuses it too); pass where(condition, x, y).")
    return _where(condition, x, y)


def _broadcast_layout(*xs):
    """Under jit, the sharding broadcasting ``xs`` together gives (jnp broadcasts every
    operand of ``where`` to it); None elsewhere."""
    mesh = getattr(context.run, "mesh", None)
    if mesh is None or all(aval_of(x).sharding is None for x in xs):
        return None
    return Sharding(mesh, broadcast_sharding(mesh, [aval_of(x) for x in xs]))


# -- shapes ------------------------------------------------------------------------------------


def _axis(axis, ndim):
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise np.exceptions.AxisError(axis, ndim)
    return axis % max(ndim, 1)


def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return tuple(sorted(_axis(int(a), ndim) for a in axes))


def reshape(x, *shape, order="C", out_sharding=None):
    _needs_mesh(out_sharding)
    if order != "C":
        raise NotImplementedError("reshape with order other than 'C'")
    shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], (int, np.integer)) else shape
    shape = [int(s) for s in ((shape,) if isinstance(shape, (int, np.integer)) else shape)]
    size = x.aval.size
    if shape.count(-1) == 1:
        known = math.prod(s for s in shape if s != -1)
        shape[shape.index(-1)] = size // known if known and size % known == 0 else -1
    if -1 in shape or math.prod(shape) != size:
        raise TypeError(f"cannot reshape a value of shape {x.aval.shape} ({size} elements) "
                        f"into shape {tuple(shape)}.")
    if tuple(shape) == x.aval.shape and out_sharding is None:
        return x
    return bind(P.reshape, x, new_sizes=tuple(shape), dimensions=None, sharding=out_sharding)


def transpose(x, *axes):
    axes = axes[0] if len(axes) == 1 and not isinstance(axes[0], (int, np.integer)) else axes
    ndim = x.aval.ndim
    perm = tuple(reversed(range(ndim))) if axes in (None, ()) else tuple(_axis(a, ndim) for a in axes)
    if perm == tuple(range(ndim)):
        return x
    return bind(P.transpose, x, permutation=perm)


def swapaxes(x, a, b):
    perm = list(range(x.aval.ndim))
    a, b = _axis(a, len(perm)), _axis(b, len(perm))
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


def moveaxis(x, source, destination):
    perm = [d for d in range(x.aval.ndim) if d != _axis(source, x.aval.ndim)]
    perm.insert(_axis(destination, x.aval.ndim), _axis(source, x.aval.ndim))
    return transpose(x, perm)


def squeeze(x, axis=None):
    shape = x.aval.shape
    dims = tuple(d for d, s in enumerate(shape) if s == 1) if axis is None else _axes(axis, len(shape))
    return bind(P.squeeze, x, dimensions=dims) if dims else x


def expand_dims(x, axis):
    ndim = aval_of(x).ndim + (len(axis) if isinstance(axis, (tuple, list)) else 1)
    new = _axes(axis, ndim)
    shape, it = [], iter(aval_of(x).shape)
    for d in range(ndim):
        shape.append(1 if d in new else next(it))
    kept = tuple(d for d in range(ndim) if d not in new)
    return bind(P.broadcast_in_dim, x, shape=tuple(shape), broadcast_dimensions=kept,
                sharding=None)


def ravel(x):
    return reshape(x, -1)


def broadcast_to(x, shape, out_sharding=None):
    _needs_mesh(out_sharding)
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    if not is_value(x):
        return np.broadcast_to(x, shape) if np.shape(x) != shape else x
    if x.aval.shape == shape:
        return x
    ndim = x.aval.ndim
    return bind(P.broadcast_in_dim, x, shape=shape,
                broadcast_dimensions=tuple(range(len(shape) - ndim, len(shape))),
                sharding=out_sharding)


def astype(x, dtype, copy=False):
    return convert(x, dtype)


def concatenate(arrays, axis=0, dtype=None):
    arrays = list(arrays)
    ndim = aval_of(arrays[0]).ndim
    if axis is None:
        arrays, axis = [ravel(a) if is_value(a) else np.ravel(a) for a in arrays], 0
    arrays = promoted(*arrays)
    if dtype is not None:
        arrays = [convert(a, dtype) for a in arrays]
    return bind(P.concatenate, *arrays, dimension=_axis(axis, max(ndim, 1)))


def stack(arrays, axis=0):
    arrays = list(arrays)
    ndim = aval_of(arrays[0]).ndim + 1
    return concatenate([expand_dims(a, _axis(axis, ndim)) if is_value(a) else
                        np.expand_dims(a, _axis(axis, ndim)) for a in arrays], axis=axis)


def flip(x, axis=None):
    return bind(P.rev, x, dimensions=_axes(axis, x.aval.ndim))


def full_like(x, fill_value, dtype=None, shape=None):
    aval = aval_of(x)
    dtype = dtypes.canonical(dtype or aval.dtype)
    value = convert(fill_value, dtype)
    out = bind(P.broadcast_in_dim, value, shape=aval.shape if shape is None else tuple(shape),
               broadcast_dimensions=(), sharding=None)
    run = context.run
    if aval.vma and run is not None and run.check_vma:        # as jnp: it varies as x does
        out = bind(pvary, out, axes=tuple(a for a, _ in run.axes if a in aval.vma))
    return out


def zeros_like(x, dtype=None, shape=None):
    return full_like(x, 0, dtype, shape)


def ones_like(x, dtype=None, shape=None):
    return full_like(x, 1, dtype, shape)


# -- reductions -----------------------------------------------------------------------------


def refuse_out(out, name):
    """NumPy's ``out=`` writes in place, which JAX arrays cannot: JAX accepts only
    ``out=None`` (what NumPy's functions pass on to an array's methods)."""
    if out is not None:
        raise NotImplementedError(
            f"The 'out' argument to jnp.{name} is not supported: JAX arrays (and simpmd's "
            f"device values) are immutable. Use the returned value instead.")


def _reducer(prim, accumulate=False):
    def reduce(x, axis=None, dtype=None, out=None, keepdims=False, **kwargs):
        refuse_out(out, prim.name.replace("reduce_", ""))
        axes = _axes(axis, x.aval.ndim)
        narrow = accumulate and dtype is None and _half(x) and axes
        if accumulate and (dtype is not None or x.aval.dtype.kind in "biu"):
            target = dtype or (np.int32 if x.aval.dtype.kind in "bi" else np.uint32)
            x = convert(x, target)
        out = bind(prim, convert(x, np.float32) if narrow else x, axes=axes,
                   out_sharding=None) if axes else x
        out = convert(out, x.aval.dtype) if narrow else out
        return _keep(out, x.aval.shape, axes) if keepdims else out
    return reduce


def _half(x) -> bool:
    """A 16-bit float, which jax.numpy sums and multiplies in float32 and rounds back."""
    return dtypes.inexact(x.aval.dtype) and x.aval.dtype.itemsize == 2


def _keep(out, shape, axes):
    return reshape(out, tuple(1 if d in axes else s for d, s in enumerate(shape)))


sum_ = _reducer(P.reduce_sum, accumulate=True)
prod = _reducer(P.reduce_prod, accumulate=True)
max_ = _reducer(P.reduce_max)
min_ = _reducer(P.reduce_min)


def all_(x, axis=None, out=None, keepdims=False):
    refuse_out(out, "all")
    return _reducer(P.reduce_and)(convert(x, np.bool_), axis, keepdims=keepdims)


def any_(x, axis=None, out=None, keepdims=False):
    refuse_out(out, "any")
    return _reducer(P.reduce_or)(convert(x, np.bool_), axis, keepdims=keepdims)


def mean(x, axis=None, dtype=None, out=None, keepdims=False):
    refuse_out(out, "mean")
    axes = _axes(axis, x.aval.ndim)
    if x.aval.dtype.kind in "biu" or dtype is not None:
        x = convert(x, dtype or dtypes.default("f"))
    count = math.prod(x.aval.shape[a] for a in axes)
    if _half(x) and dtype is None:                  # in float32, as jax.numpy does
        return convert(true_divide(sum_(convert(x, np.float32), axes, keepdims=keepdims),
                                   float(count)), x.aval.dtype)
    return true_divide(sum_(x, axes, keepdims=keepdims), float(count))


def var(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    refuse_out(out, "var")
    centred = subtract(x, mean(x, axis, dtype, keepdims=True))
    axes = _axes(axis, x.aval.ndim)
    count = math.prod(x.aval.shape[a] for a in axes) - ddof
    return true_divide(sum_(square(centred), axes, keepdims=keepdims), float(count))


def std(x, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
    refuse_out(out, "std")
    return sqrt(var(x, axis, dtype, None, ddof, keepdims))  # noqa: F821 (made above)


def _arg(prim):
    def arg(x, axis=None, out=None, keepdims=False):
        refuse_out(out, prim.name)
        if axis is None:
            x, axis = ravel(x), 0
        axis = _axis(axis, x.aval.ndim)
        out = bind(prim, x, axes=(axis,), index_dtype=np.dtype(np.int32))
        return _keep(out, x.aval.shape, (axis,)) if keepdims else out
    return arg


argmax, argmin = _arg(P.argmax), _arg(P.argmin)


def _cumulative(prim):
    def cumulative(x, axis=None, dtype=None, out=None):
        refuse_out(out, prim.name)
        if axis is None:
            x, axis = ravel(x), 0
        if dtype is not None or x.aval.dtype.kind == "b":
            x = convert(x, dtype or np.int32)
        return bind(prim, x, axis=_axis(axis, x.aval.ndim), reverse=False)
    return cumulative


cumsum, cumprod = _cumulative(P.cumsum), _cumulative(P.cumprod)


def sort(x, axis=-1):
    return bind(P.sort, x, dimension=_axis(axis, x.aval.ndim), is_stable=True, num_keys=1)[0]


def argsort(x, axis=-1):
    axis = _axis(axis, x.aval.ndim)
    index = bind(P.iota, dtype=np.dtype(np.int32), shape=x.aval.shape, dimension=axis,
                 sharding=None)
    return bind(P.sort, x, index, dimension=axis, is_stable=True, num_keys=1)[1]


# -- products ---------------------------------------------------------------------------------


def _needs_mesh(out_sharding):
    """A bare P(...) as out_sharding names the axes of the mesh set by set_mesh."""
    if out_sharding is not None:
        check_placed(out_sharding)


def matmul(a, b, out_sharding=None, preferred_element_type=None):
    _needs_mesh(out_sharding)
    a, b = promoted(a, b, ranks=False)
    na, nb = aval_of(a).ndim, aval_of(b).ndim
    if na == 0 or nb == 0:
        raise ValueError("matmul: a scalar operand is not allowed (use *)")
    if na == 1 or nb <= 2:         # a matrix on the right: no batch, as jnp.matmul binds it
        dims = (([na - 1], [0 if nb == 1 else nb - 2]), ([], []))
        return bind(P.dot_general, a, b, dimension_numbers=dims,
                    preferred_element_type=aval_of(a).dtype, out_sharding=out_sharding)
    if na != nb:                   # line the batch dimensions up
        rank = max(na, nb)
        a, b = _to_rank(a, rank), _to_rank(b, rank)
        na = nb = rank
    shape_a, shape_b = aval_of(a).shape, aval_of(b).shape
    batch = np.broadcast_shapes(shape_a[:-2], shape_b[:-2])
    a, b = broadcast_to(a, batch + shape_a[-2:]), broadcast_to(b, batch + shape_b[-2:])
    nbatch = list(range(na - 2))
    _check_batch_shardings(a, b, nbatch)
    return bind(P.dot_general, a, b, dimension_numbers=(([na - 1], [nb - 2]), (nbatch, nbatch)),
                preferred_element_type=aval_of(a).dtype, out_sharding=out_sharding)


def _check_batch_shardings(a, b, batch):
    """Under jit, jnp.matmul wants each batch dim split alike on both operands."""
    sa, sb = aval_of(a).sharding, aval_of(b).sharding
    if (sa is None and sb is None) or not settings.matmul_batch:
        return
    da = sa.dims if sa is not None else ((),) * aval_of(a).ndim
    db = sb.dims if sb is not None else ((),) * aval_of(b).ndim
    if any(aval_of(a).shape[d] != 1 and da[d] != db[d] for d in batch):
        raise ValueError(
            f"Incompatible types for matmul arguments: {aval_of(a).str_short()} and "
            f"{aval_of(b).str_short()} (JAX's words): a batch dimension is split on one "
            f"operand and not alike on the other. reshard one operand so they agree.")


def dot(a, b, out_sharding=None, preferred_element_type=None):
    if aval_of(a).ndim == 0 or aval_of(b).ndim == 0:
        return multiply(a, b)
    if aval_of(b).ndim <= 2:
        return matmul(a, b, out_sharding=out_sharding)
    return tensordot(a, b, ([aval_of(a).ndim - 1], [aval_of(b).ndim - 2]),
                     out_sharding=out_sharding)


def tensordot(a, b, axes=2, out_sharding=None):
    _needs_mesh(out_sharding)
    a, b = promoted(a, b, ranks=False)
    na, nb = aval_of(a).ndim, aval_of(b).ndim
    if isinstance(axes, int):
        axes = (list(range(na - axes, na)), list(range(axes)))
    la, lb = ([axes[0]] if isinstance(axes[0], int) else list(axes[0]),
              [axes[1]] if isinstance(axes[1], int) else list(axes[1]))
    return bind(P.dot_general, a, b, dimension_numbers=(([_axis(x, na) for x in la],
                                                        [_axis(x, nb) for x in lb]), ([], [])),
                preferred_element_type=aval_of(a).dtype, out_sharding=out_sharding)


def outer(a, b):
    return multiply(expand_dims(ravel(a) if is_value(a) else np.ravel(a), 1),
                    ravel(b) if is_value(b) else np.ravel(b))


def einsum(subscripts, *operands, out_sharding=None, **kwargs):
    """Two operands as one dot_general (and transposes), as jnp.einsum does."""
    _needs_mesh(out_sharding)
    if len(operands) != 2 or "->" not in subscripts or "." in subscripts or kwargs:
        return numpy_function(np.einsum, (subscripts,) + operands, kwargs)
    ins, out = subscripts.replace(" ", "").split("->")
    sa, sb = ins.split(",")
    a, b = promoted(*operands, ranks=False)
    for letters, x in ((sa, a), (sb, b)):
        if len(set(letters)) != len(letters) or len(letters) != aval_of(x).ndim:
            return numpy_function(np.einsum, (subscripts,) + operands, {})
    batch = [c for c in sa if c in sb and c in out]
    contract = [c for c in sa if c in sb and c not in out]
    a = sum_(a, tuple(i for i, c in enumerate(sa) if c not in sb and c not in out)) \
        if any(c not in sb and c not in out for c in sa) else a
    sa = "".join(c for c in sa if c in sb or c in out)
    b = sum_(b, tuple(i for i, c in enumerate(sb) if c not in sa and c not in out)) \
        if any(c not in sa and c not in out for c in sb) else b
    sb = "".join(c for c in sb if c in sa or c in out)
    dims = (([sa.index(c) for c in contract], [sb.index(c) for c in contract]),
            ([sa.index(c) for c in batch], [sb.index(c) for c in batch]))
    got = batch + [c for c in sa if c not in sb] + [c for c in sb if c not in sa]
    mesh = getattr(context.run, "mesh", None)
    if out_sharding is not None and mesh is not None:    # the product's dims: `got`'s order
        layout = resolve(out_sharding, mesh, len(out))
        out_sharding = Sharding(mesh, [layout[out.index(c)] for c in got],
                                *reductions_of(out_sharding, mesh, "out_sharding"))
    y = bind(P.dot_general, a, b, dimension_numbers=dims, preferred_element_type=aval_of(a).dtype,
             out_sharding=out_sharding)
    return transpose(y, [got.index(c) for c in out])


# -- indexing -------------------------------------------------------------------------------


def _basic(i):
    return i is None or i is Ellipsis or isinstance(i, (slice, int, np.integer)) and not isinstance(i, bool)


def getitem(x, index):
    """``x[index]``: slices, reversals and squeezes for basic indexing (as jnp does), one
    gather for indexing with arrays."""
    index = index if isinstance(index, tuple) else (index,)
    if any(_traced_int(i) for i in index) and all(
            _traced_int(i) or _basic(i) and getattr(i, "step", None) in (None, 1) for i in index):
        return _dynamic_index(x, index)
    if not all(_basic(i) for i in index):
        return _gather(x, index)
    index = _expand_ellipsis(index, x.aval.ndim)
    starts, limits, strides, flips, squeezed, new_axes = [], [], [], [], [], []
    d = out_d = 0
    for i in index:
        if i is None:
            new_axes.append(out_d)
            out_d += 1
            continue
        n = x.aval.shape[d]
        if isinstance(i, slice):
            picked = range(*i.indices(n))
            step = picked.step
            if step < 0:                   # a reversed slice: slice the other way, then rev
                flips.append(d)
                picked = picked[::-1]
            start = picked.start if picked else 0
            starts.append(start)
            limits.append(picked[-1] + 1 if picked else 0)
            strides.append(abs(step))
            out_d += 1
        else:
            if not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {n}")
            i = int(i) % n
            starts.append(i)
            limits.append(i + 1)
            strides.append(1)
            squeezed.append(d)
        d += 1
    for rest in range(d, x.aval.ndim):
        starts.append(0)
        limits.append(x.aval.shape[rest])
        strides.append(1)
    if starts != [0] * len(starts) or limits != list(x.aval.shape) or any(s != 1 for s in strides):
        x = bind(P.slice_, x, start_indices=tuple(starts), limit_indices=tuple(limits),
                 strides=None if all(s == 1 for s in strides) else tuple(strides))
    if flips:
        x = bind(P.rev, x, dimensions=tuple(flips))
    if squeezed:
        x = bind(P.squeeze, x, dimensions=tuple(squeezed))
    for axis in new_axes:
        x = expand_dims(x, axis)
    return x


def _traced_int(i) -> bool:
    return is_value(i) and not i.aval.shape and i.aval.dtype.kind in "iu"


def _dynamic_index(x, index):
    """``x[i]`` with a traced integer ``i``, as jnp indexes it: each start normalized (a
    negative one counts from the end), one ``dynamic_slice``, the indexed dims squeezed.
    (Whether a slice's start is normalized too is the running JAX's choice.)"""
    every = forms().normalizes_slice_starts()
    index = _expand_ellipsis(index, x.aval.ndim)
    starts, sizes, squeezed, new_axes, d = [], [], [], [], 0
    for i in index:
        if i is None:
            new_axes.append(d - len(squeezed) + len(new_axes))
            continue
        n = x.aval.shape[d]
        if isinstance(i, slice):
            picked = range(*i.indices(n))
            starts.append(_normalized(picked.start if picked else 0, n) if every else
                          (picked.start if picked else 0))
            sizes.append(len(picked))
        else:
            if not is_value(i) and not -n <= i < n:
                raise IndexError(f"index {i} is out of bounds for axis {d} with size {n}")
            starts.append(_normalized(i if is_value(i) else int(i), n))
            sizes.append(1)
            squeezed.append(d)
        d += 1
    for n in x.aval.shape[d:]:
        starts.append(_normalized(0, n) if every else 0)
        sizes.append(n)
    x = bind(P.dynamic_slice, x, *starts, slice_sizes=tuple(sizes))
    if squeezed:
        x = bind(P.squeeze, x, dimensions=tuple(squeezed))
    for axis in new_axes:
        x = expand_dims(x, axis)
    return x


def _normalized(i, n):
    """``i`` counted from the start: ``i + n`` where it is negative. JAX adds ``n`` as
    a constant of ``i``'s dtype, not weakly typed, so a weakly typed ``i`` (a fori_loop
    counter from Python bounds) is converted first, as its program shows."""
    negative, shifted = bind(P.lt, i, 0), i
    if is_value(i) and i.aval.weak_type:
        shifted = bind(P.convert_element_type, i, new_dtype=i.aval.dtype, weak_type=False)
    return bind(P.select_n, negative, i, bind(P.add, shifted, n))


def _expand_ellipsis(index, ndim):
    used = sum(1 for i in index if i is not None and i is not Ellipsis)
    k = next((k for k, i in enumerate(index) if i is Ellipsis), None)   # (not ==: values)
    if k is not None:
        return index[:k] + (slice(None),) * (ndim - used) + index[k + 1:]
    return index


def _indexer(x, index):
    """The index with each array replaced by its position among the operands."""
    arrays, entries = [], []
    for i in index:
        if _basic(i):
            entries.append(i)
            continue
        if not is_value(i):
            i = np.asarray(i)
            if i.dtype == np.bool_:
                raise TypeError(
                    "indexing with a boolean mask gives a shape that depends on the values "
                    "(real JAX raises NonConcreteBooleanIndexError); use snp.where(mask, x, 0) "
                    "to keep the shape, or run with eager=True.")
            i = i.astype(np.int32) if i.dtype.kind in "iu" else i
        elif i.aval.dtype == np.bool_:
            raise TypeError(
                "indexing with a boolean mask gives a shape that depends on the values, which "
                "real JAX refuses while tracing (NonConcreteBooleanIndexError). Keep the "
                "shape fixed, e.g. snp.where(mask, x, 0), or run with eager=True.")
        entries.append(("array", len(arrays)))
        arrays.append(i)
    return tuple(entries), arrays


def _gather(x, index):
    indexer, arrays = _indexer(x, index)
    return bind(P.gather, x, *arrays, indexer=indexer)


def update(x, index, v, how):
    """``x.at[index].set(v)`` (``how`` None), ``.add``, ``.multiply``, ``.min``, ``.max``."""
    index = index if isinstance(index, tuple) else (index,)
    indexer, arrays = _indexer(x, index)
    prim = {None: P.scatter, "add": P.scatter_add, "multiply": P.scatter_mul,
            "min": P.scatter_min, "max": P.scatter_max}[how]
    v = convert(v, x.aval.dtype)
    return bind(prim, x, v, *arrays, indexer=indexer)


def take(x, indices, axis=None):
    if axis is None:
        return getitem(ravel(x), (indices,))
    axis = _axis(axis, x.aval.ndim)
    return getitem(x, (slice(None),) * axis + (indices,))


def numpy_function(fn, args, kwargs):
    """A NumPy function without a JAX spelling here: run on each device as it is."""
    values = [a for a in args if is_value(a)]
    static = [a for a in args if not is_value(a)]
    positions = [k for k, a in enumerate(args) if is_value(a)]

    def call(*vs, **kw):
        full = list(args)
        for k, v in zip(positions, vs):
            full[k] = v
        return fn(*full, **kw)
    if not values:
        return fn(*args, **kwargs)
    del static
    return bind(P.numpy_call, *values, fn=call, kwargs=tuple(sorted(kwargs.items())),
                name=getattr(fn, "__name__", "function"))


# What a mapped value's methods and ``simpmd.numpy``'s functions call, by NumPy's names.
FUNCTIONS = {
    "add": add, "subtract": subtract, "multiply": multiply, "divide": true_divide,
    "true_divide": true_divide, "floor_divide": floor_divide, "remainder": remainder,
    "mod": remainder, "power": power, "maximum": maximum, "minimum": minimum,
    "arctan2": arctan2, "equal": equal, "not_equal": not_equal, "less": less,
    "less_equal": less_equal, "greater": greater, "greater_equal": greater_equal,
    "logical_and": lambda a, b: bitwise_and(convert(a, np.bool_), convert(b, np.bool_)),
    "logical_or": lambda a, b: bitwise_or(convert(a, np.bool_), convert(b, np.bool_)),
    "logical_xor": lambda a, b: bitwise_xor(convert(a, np.bool_), convert(b, np.bool_)),
    "logical_not": logical_not, "bitwise_and": bitwise_and, "bitwise_or": bitwise_or,
    "bitwise_xor": bitwise_xor, "left_shift": left_shift, "right_shift": right_shift,
    "negative": negative, "positive": lambda x: x, "absolute": absolute, "abs": absolute,
    "fabs": absolute, "sign": sign, "floor": floor, "ceil": ceil, "invert": invert,
    "square": square, "real": real, "imag": imag, "conjugate": conjugate, "conj": conjugate,
    "isfinite": isfinite, "round": round_, "around": round_, "rint": round_,
    "clip": clip, "where": where, "reshape": reshape, "transpose": transpose,
    "swapaxes": swapaxes, "moveaxis": moveaxis, "squeeze": squeeze, "expand_dims": expand_dims,
    "ravel": ravel, "broadcast_to": broadcast_to, "concatenate": concatenate, "stack": stack,
    "flip": flip, "full_like": full_like, "zeros_like": zeros_like, "ones_like": ones_like,
    "sum": sum_, "prod": prod, "max": max_, "amax": max_, "min": min_, "amin": min_,
    "all": all_, "any": any_, "mean": mean, "var": var, "std": std, "argmax": argmax,
    "argmin": argmin, "cumsum": cumsum, "cumprod": cumprod, "sort": sort, "argsort": argsort,
    "matmul": matmul, "dot": dot, "tensordot": tensordot, "outer": outer, "einsum": einsum,
    "take": take, "astype": astype,
    **{name: globals()[name] for name in FLOAT_UNARY},
}


# -- a mapped value's operators and methods, installed on the core's StackedValue ----------------

OPERATOR_UFUNCS = {np.add: add, np.subtract: subtract, np.multiply: multiply,
                   np.true_divide: true_divide, np.floor_divide: floor_divide,
                   np.remainder: remainder, np.power: power, np.matmul: matmul,
                   np.less: less, np.less_equal: less_equal, np.equal: equal,
                   np.not_equal: not_equal, np.greater: greater,
                   np.greater_equal: greater_equal, np.bitwise_and: bitwise_and,
                   np.bitwise_or: bitwise_or, np.bitwise_xor: bitwise_xor,
                   np.maximum: maximum, np.minimum: minimum}


class Spelled:
    """What NumPy's spelling means on a mapped value (copied onto StackedValue)."""

    T = property(lambda self: transpose(self))
    real = property(lambda self: real(self))
    imag = property(lambda self: imag(self))

    def __add__(self, o): return add(self, o)
    def __radd__(self, o): return add(o, self)
    def __sub__(self, o): return subtract(self, o)
    def __rsub__(self, o): return subtract(o, self)
    def __mul__(self, o): return multiply(self, o)
    def __rmul__(self, o): return multiply(o, self)
    def __truediv__(self, o): return true_divide(self, o)
    def __rtruediv__(self, o): return true_divide(o, self)
    def __floordiv__(self, o): return floor_divide(self, o)
    def __rfloordiv__(self, o): return floor_divide(o, self)
    def __mod__(self, o): return remainder(self, o)
    def __rmod__(self, o): return remainder(o, self)
    def __pow__(self, o): return power(self, o)
    def __rpow__(self, o): return power_float(o, self)
    def __matmul__(self, o): return matmul(self, o)
    def __rmatmul__(self, o): return matmul(o, self)
    def __and__(self, o): return bitwise_and(self, o)
    def __rand__(self, o): return bitwise_and(o, self)
    def __or__(self, o): return bitwise_or(self, o)
    def __ror__(self, o): return bitwise_or(o, self)
    def __xor__(self, o): return bitwise_xor(self, o)
    def __rxor__(self, o): return bitwise_xor(o, self)
    def __lshift__(self, o): return left_shift(self, o)
    def __rshift__(self, o): return right_shift(self, o)
    def __lt__(self, o): return less(self, o)
    def __le__(self, o): return less_equal(self, o)
    def __eq__(self, o): return equal(self, o)
    def __ne__(self, o): return not_equal(self, o)
    def __gt__(self, o): return greater(self, o)
    def __ge__(self, o): return greater_equal(self, o)
    def __neg__(self): return negative(self)
    def __pos__(self): return self
    def __abs__(self): return absolute(self)
    def __invert__(self): return invert(self)
    def __divmod__(self, o): return floor_divide(self, o), remainder(self, o)

    # In-place operators rebind the name to a new value, as they do for JAX arrays.
    __iadd__, __isub__, __imul__, __itruediv__ = __add__, __sub__, __mul__, __truediv__
    __ifloordiv__, __imod__, __ipow__, __imatmul__ = __floordiv__, __mod__, __pow__, __matmul__

    # -- methods ------------------------------------------------------------------------------
    def sum(self, axis=None, dtype=None, out=None, keepdims=False):
        return sum_(self, axis, dtype, out, keepdims)

    def prod(self, axis=None, dtype=None, out=None, keepdims=False):
        return prod(self, axis, dtype, out, keepdims)

    def max(self, axis=None, out=None, keepdims=False):
        return max_(self, axis, out=out, keepdims=keepdims)

    def min(self, axis=None, out=None, keepdims=False):
        return min_(self, axis, out=out, keepdims=keepdims)

    # JAX's signatures, ``out=None`` included: NumPy's np.mean(x) calls x.mean(out=None).
    def mean(self, axis=None, dtype=None, out=None, keepdims=False):
        return mean(self, axis, dtype, out, keepdims)
    def var(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        return var(self, axis, dtype, out, ddof, keepdims)
    def std(self, axis=None, dtype=None, out=None, ddof=0, keepdims=False):
        return std(self, axis, dtype, out, ddof, keepdims)
    def all(self, axis=None, out=None, keepdims=False): return all_(self, axis, out, keepdims)
    def any(self, axis=None, out=None, keepdims=False): return any_(self, axis, out, keepdims)
    def argmax(self, axis=None, out=None, keepdims=False): return argmax(self, axis, out, keepdims)
    def argmin(self, axis=None, out=None, keepdims=False): return argmin(self, axis, out, keepdims)
    def cumsum(self, axis=None, dtype=None, out=None): return cumsum(self, axis, dtype, out)
    def cumprod(self, axis=None, dtype=None, out=None): return cumprod(self, axis, dtype, out)
    def reshape(self, *shape, order="C", out_sharding=None):
        return reshape(self, *shape, order=order, out_sharding=out_sharding)
    def transpose(self, *axes): return transpose(self, *axes)
    def swapaxes(self, a, b): return swapaxes(self, a, b)
    def squeeze(self, axis=None): return squeeze(self, axis)
    def ravel(self): return ravel(self)
    flatten = ravel
    def astype(self, dtype, copy=False): return convert(self, dtype)
    def copy(self): return self
    def clip(self, min=None, max=None): return clip(self, min, max)
    def round(self, decimals=0, out=None): return round_(self, decimals, out)
    def conj(self): return conjugate(self)
    def dot(self, other): return dot(self, other)
    def take(self, indices, axis=None): return take(self, indices, axis)
    def sort(self, axis=-1): return sort(self, axis)
    def argsort(self, axis=-1): return argsort(self, axis)

    def __getitem__(self, index):
        return getitem(self, index)

    def __setitem__(self, index, v):
        raise TypeError(
            "Traced values are immutable, as JAX arrays are: `x[i] = v` is not allowed. "
            "Write `x = x.at[i].set(v)` instead (also .add, .multiply, .min, .max).")

    @property
    def at(self):
        return _At(self)

    def __len__(self):
        if not self.shape:
            raise TypeError("len() of a 0-d array (a scalar): it has no length")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("iteration over a 0-d array (a scalar)")
        return (self[i] for i in range(self.shape[0]))

    # -- NumPy's protocols: what JAX refuses on a tracer -------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method == "__call__" and not kwargs:
            if ufunc in OPERATOR_UFUNCS and len(inputs) == 2 and not isinstance(inputs[0], StackedValue):
                return OPERATOR_UFUNCS[ufunc](*inputs)    # ndarray + x: JAX allows it
            if self._eager():
                fn = FUNCTIONS.get(ufunc.__name__)
                if fn is not None:
                    return fn(*inputs)
        raise refused_numpy(f"np.{ufunc.__name__}", inputs)

    def __array_function__(self, func, types, args, kwargs):
        fn = FUNCTIONS.get(func.__name__)
        if self._eager() and fn is not None:
            return fn(*args, **kwargs)
        # As for a JAX tracer: np.sum(x) calls x.sum(); what needs a concrete array refuses.
        implementation = getattr(func, "_implementation", None)
        if implementation is None:
            raise refused_numpy(f"np.{func.__name__}", args)
        try:
            return implementation(*args, **kwargs)
        except errors.TracerArrayConversionError:
            raise refused_numpy(f"np.{func.__name__}", args) from None



for _name, _attr in list(vars(Spelled).items()):
    if _name not in ("__dict__", "__weakref__", "__module__", "__doc__", "__qualname__"):
        setattr(StackedValue, _name, _attr)


class _At:
    """``x.at[index].set(v)`` and friends, as on a JAX array."""

    def __init__(self, x):
        self.x = x

    def __getitem__(self, index):
        return _AtIndex(self.x, index)


class _AtIndex:
    def __init__(self, x, index):
        self.x, self.index = x, index

    def get(self): return getitem(self.x, self.index)
    def set(self, v): return update(self.x, self.index, v, None)
    def add(self, v): return update(self.x, self.index, v, "add")
    def multiply(self, v): return update(self.x, self.index, v, "multiply")
    def min(self, v): return update(self.x, self.index, v, "min")
    def max(self, v): return update(self.x, self.index, v, "max")


DeviceValue = StackedValue           # the name one device's value has in an eager run's messages
