"""The value a mapped function sees on one simulated device.

Real JAX never runs the Python body of a ``pmap``-ed function on numbers: it traces it
once with abstract *tracers*, so anything that needs a concrete value (``if x > 0``,
``int(x)``, ``range(n)`` with ``n`` an array) fails with ``TracerBoolConversionError``
and its relatives. simpmd runs the body on numbers: once for all devices, over values
stacked by device (``batching.StackedValue``, a kind of :class:`DeviceValue`), or, with
``pmap(..., eager=True)``, once per device on a :class:`DeviceValue` that holds one device's
value. Either computes like a NumPy array and refuses what JAX refuses while tracing;
``eager=True`` lifts the refusals, for programs that real JAX cannot run.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import errors

_BOOL_HINT = (
    "JAX traces a mapped function once for all devices, so the value of an array is not "
    "known while Python runs the body, and Python control flow cannot depend on it "
    "(real JAX raises {name} here). Use jnp.where / lax.cond / lax.select for choices "
    "that depend on values, or pass the value as a static argument "
    "(static_broadcasted_argnums). simpmd.pmap(..., eager=True) runs it anyway, as a "
    "program real JAX cannot run.")


def unwrap(x):
    """The NumPy value inside ``x`` (recursing into lists, tuples and dicts)."""
    if type(x) is DeviceValue:
        return x.value
    if isinstance(x, (list, tuple)):
        items = [unwrap(i) for i in x]
        return type(x)(items) if type(x) in (list, tuple) else type(x)(*items)
    if isinstance(x, dict):
        return {k: unwrap(v) for k, v in x.items()}
    return x


def wrap(x, eager: bool):
    """Wrap NumPy results (arrays, scalars, tuples of them) back into :class:`DeviceValue`."""
    if isinstance(x, np.ndarray):
        return DeviceValue(x, eager)
    if isinstance(x, (np.generic, bool)):
        return DeviceValue(np.asarray(x), eager)
    if isinstance(x, tuple) and not hasattr(type(x), "_fields"):
        return tuple(wrap(i, eager) for i in x)
    if isinstance(x, list):
        return [wrap(i, eager) for i in x]
    return x


def _jax_promotion(values):
    """Mixing integer and floating arrays gives the floating type, as JAX promotes.

    NumPy turns ``float32 * int32`` into float64; JAX keeps float32. Casting the integer
    arrays to the widest floating type among the inputs makes simpmd agree with JAX
    (``x * lax.axis_index('i')`` keeps the dtype of ``x``).
    """
    floats = [v.dtype for v in values if isinstance(v, np.ndarray) and v.dtype.kind in "fc"]
    if not floats:
        # An integer array times a Python float: JAX's float is float32 (x64 off).
        floats = [np.dtype(np.float32) for v in values if type(v) is float]
        floats += [np.dtype(np.complex64) for v in values if type(v) is complex]
    if not floats or not any(isinstance(v, np.ndarray) and v.dtype.kind in "iub" for v in values):
        return values
    target = np.result_type(*floats)
    return tuple(v.astype(target) if isinstance(v, np.ndarray) and v.dtype.kind in "iub" else v
                 for v in values)


def _no_new_float64(result, inputs):
    """Integers that become floats become float32, JAX's default float (x64 off).

    NumPy gives ``int32 / 2`` and ``np.exp(int32)`` as float64; JAX gives float32. A
    float64 that came from a float64 input stays float64 (NumPy's choice, kept).
    """
    if (isinstance(result, (np.ndarray, np.generic)) and result.dtype == np.float64 and
            not any(isinstance(v, (np.ndarray, np.generic)) and v.dtype.kind in "fc"
                    for v in inputs)):
        return result.astype(np.float32)
    return result


_ACCUMULATING = {"sum", "prod", "cumsum", "cumprod", "nansum", "nanprod"}
_AVERAGING = {"mean", "std", "var", "nanmean", "nanstd", "nanvar"}


def reduction_dtype(name, dtype, kwargs):
    """The dtype JAX gives a reduction of ``dtype`` (without x64), as ``dtype=`` for NumPy,
    or None to leave NumPy's. NumPy sums int32 and bool into int64 and averages integers
    into float64; JAX keeps 32 bits: int32 (uint32) and float32. 64-bit inputs, which JAX
    would not have, keep NumPy's choice (simpmd's documented float64 rule, traced.py)."""
    if kwargs.get("dtype") is not None:
        return None
    dtype = np.dtype(dtype)
    if name in _ACCUMULATING and (dtype.kind == "b" or (dtype.kind in "iu" and dtype.itemsize <= 4)):
        return np.dtype("uint32" if dtype.kind == "u" else "int32")
    if name in _AVERAGING and dtype.kind in "biu" and dtype.itemsize <= 4:
        return np.dtype("float32")
    return None


def _eager_of(args) -> bool:
    for a in args:
        if type(a) is DeviceValue:
            return a.eager
    return False


def apply_ufunc(ufunc, inputs, kwargs, method="__call__"):
    """Compute NumPy's ``ufunc`` on device values, with JAX's dtypes; returns device values."""
    if kwargs.get("out") is not None:
        raise TypeError(
            f"np.{ufunc.__name__}(..., out=...) writes into an array in place; JAX arrays "
            "are immutable. Use the returned value instead.")
    values = _jax_promotion(unwrap(inputs)) if len(inputs) > 1 else unwrap(inputs)
    result = getattr(ufunc, method)(*values, **unwrap(kwargs))
    return wrap(_no_new_float64(result, values), _eager_of(inputs))


def apply_function(func, args, kwargs):
    """Compute the NumPy function ``func`` on device values; returns device values."""
    name = getattr(func, "__name__", "")
    if args and name in _ACCUMULATING | _AVERAGING:
        dtype = reduction_dtype(name, np.asarray(unwrap(args[0])).dtype, kwargs)
        if dtype is not None:
            kwargs = dict(kwargs, dtype=dtype)
    result = func(*unwrap(args), **unwrap(kwargs))
    return wrap(result, _eager_of(args) or _eager_of(tuple(kwargs.values())))


def numpy_function_refused(name, args):
    """The error for a NumPy function applied to a device value, pointing to simpmd.numpy."""
    first = next((a for a in _leaves(args) if isinstance(a, DeviceValue)), None)
    what = f" of shape {first.shape} {first.dtype}" if first is not None else ""
    short = name.split(".", 1)[1]
    return errors.TracerArrayConversionError(
        f"{name}() was applied to a mapped value{what}. Real JAX refuses this "
        f"(TracerArrayConversionError): a NumPy function needs a concrete array, and a traced "
        f"value has none. Use simpmd.numpy, which runs NumPy on simpmd's devices and jax.numpy "
        f"inside real JAX: `import simpmd.numpy as snp` then `snp.{short}(...)`. Operators "
        f"and methods (x * 2, x.sum()) work on both engines as they are.")


def _leaves(x):
    if isinstance(x, (list, tuple)):
        for item in x:
            yield from _leaves(item)
    elif isinstance(x, dict):
        for item in x.values():
            yield from _leaves(item)
    else:
        yield x


_OPERATOR_UFUNCS = frozenset({
    np.add, np.subtract, np.multiply, np.matmul, np.true_divide, np.floor_divide,
    np.remainder, np.divmod, np.power, np.left_shift, np.right_shift, np.bitwise_and,
    np.bitwise_xor, np.bitwise_or, np.less, np.less_equal, np.equal, np.not_equal,
    np.greater, np.greater_equal})


def choose_branch(index, branches, operands):
    """``lax.switch`` where the index is concrete (one device's value, or no simulation)."""
    value = index.value if isinstance(index, DeviceValue) else index
    k = int(np.clip(int(np.asarray(value)), 0, len(branches) - 1))
    return branches[k](*operands)


class DeviceValue(NDArrayOperatorsMixin):
    """A per-device array inside a mapped function: NumPy arithmetic, JAX's refusals."""

    __slots__ = ("value", "eager")
    __array_priority__ = 1000

    def __init__(self, value, eager: bool = False):
        self.value = value if isinstance(value, np.ndarray) else np.asarray(value)
        self.eager = eager

    def _with(self, value):
        """A device value of the same kind holding ``value``."""
        return DeviceValue(value, self.eager)

    # -- computing -------------------------------------------------------------------
    # Operators (``x + 1``, ``x > 0``, ``abs(x)``) compute directly (see _operator below).
    # A NumPy function called on a device value is what real JAX refuses: np.exp(tracer)
    # asks the tracer for a concrete array. simpmd refuses it the same way, so a body that
    # runs here runs on JAX too; simpmd.numpy computes through apply_ufunc instead.
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if any(defers_to(x) for x in inputs):
            return NotImplemented
        if self.eager or (method == "__call__" and ufunc in _OPERATOR_UFUNCS
                          and len(inputs) == 2 and type(inputs[0]) is not DeviceValue):
            # `ndarray + x` and `np.float32(2) * x` reach here from NumPy's operators; JAX
            # allows them (its arrays take precedence over NumPy's).
            return apply_ufunc(ufunc, inputs, kwargs, method)
        raise numpy_function_refused(f"np.{ufunc.__name__}", inputs)

    def __array_function__(self, func, types, args, kwargs):
        if any(defers_to(x) for x in _leaves((args, kwargs))):
            return NotImplemented
        if self.eager:
            return apply_function(func, args, kwargs)
        # What NumPy does with an object that is not an array: np.sum(x) calls x.sum(), as
        # it does for a JAX tracer; anything that needs a concrete array asks __array__,
        # which refuses.
        implementation = getattr(func, "_implementation", None)
        if implementation is None:
            raise numpy_function_refused(f"np.{func.__name__}", args)
        try:
            return implementation(*args, **kwargs)
        except errors.TracerArrayConversionError:
            raise numpy_function_refused(f"np.{func.__name__}", args) from None

    # The commonest operators skip NumPy's dispatch for speed (a 1024-device step runs
    # them thousands of times); anything unusual falls back to the ufunc path above.
    def __add__(self, other): return _fast(np.add, self, other, False)
    def __radd__(self, other): return _fast(np.add, self, other, True)
    def __sub__(self, other): return _fast(np.subtract, self, other, False)
    def __rsub__(self, other): return _fast(np.subtract, self, other, True)
    def __mul__(self, other): return _fast(np.multiply, self, other, False)
    def __rmul__(self, other): return _fast(np.multiply, self, other, True)
    def __truediv__(self, other): return _fast(np.true_divide, self, other, False)
    def __rtruediv__(self, other): return _fast(np.true_divide, self, other, True)
    def __matmul__(self, other): return _fast(np.matmul, self, other, False)
    def __rmatmul__(self, other): return _fast(np.matmul, self, other, True)
    def __pow__(self, other): return _fast(np.power, self, other, False)
    def __neg__(self): return DeviceValue(-self.value, self.eager)

    # In-place operators rebind the name to a new value, as they do for JAX arrays.
    def __iadd__(self, other): return self + other
    def __isub__(self, other): return self - other
    def __imul__(self, other): return self * other
    def __itruediv__(self, other): return self / other
    def __ifloordiv__(self, other): return self // other
    def __ipow__(self, other): return self ** other
    def __imatmul__(self, other): return self @ other
    def __imod__(self, other): return self % other

    def __getattr__(self, name):
        if name.startswith("__"):     # keep NumPy from finding __array_interface__ etc.
            raise AttributeError(name)
        attr = getattr(self.value, name)
        if callable(attr):
            eager = self.eager
            dtype = self.value.dtype

            def method(*args, **kwargs):
                jax_dtype = reduction_dtype(name, dtype, kwargs)
                if jax_dtype is not None:
                    kwargs = dict(kwargs, dtype=jax_dtype)
                return wrap(attr(*unwrap(args), **unwrap(kwargs)), eager)
            method.__name__ = name
            return method
        return wrap(attr, self.eager)

    # Static facts: known to JAX while tracing, so plain Python values here too.
    shape = property(lambda self: self.value.shape)
    dtype = property(lambda self: self.value.dtype)
    ndim = property(lambda self: self.value.ndim)
    size = property(lambda self: self.value.size)
    T = property(lambda self: DeviceValue(self.value.T, self.eager))

    def __len__(self):
        if self.value.ndim == 0:
            raise TypeError("len() of a 0-d array (a scalar): it has no length")
        return len(self.value)

    def __iter__(self):
        return (DeviceValue(v, self.eager) for v in np.asarray(self.value)[...]) \
            if self.value.ndim else iter(())  # pragma: no branch

    def __getitem__(self, index):
        return wrap(self.value[unwrap(index)], self.eager)

    def __setitem__(self, index, v):
        raise TypeError(
            "Traced values are immutable, as JAX arrays are: `x[i] = v` is not allowed. "
            "Write `x = x.at[i].set(v)` instead (also .add, .multiply, .min, .max).")

    @property
    def at(self):
        return _IndexUpdateHelper(self)

    # -- what JAX refuses ------------------------------------------------------------
    def _concrete(self, kind, error, name):
        if self.eager:
            return kind(self.value)
        raise error(f"{kind.__name__}() of a mapped value of shape {self.shape} {self.dtype}: "
                    + _BOOL_HINT.format(name=name))

    def __bool__(self):
        return self._concrete(bool, errors.TracerBoolConversionError, "TracerBoolConversionError")

    def __float__(self):
        return self._concrete(float, errors.ConcretizationTypeError, "ConcretizationTypeError")

    def __complex__(self):
        return self._concrete(complex, errors.ConcretizationTypeError, "ConcretizationTypeError")

    def __int__(self):                  # JAX: ConcretizationTypeError, as for float()
        return self._concrete(int, errors.ConcretizationTypeError, "ConcretizationTypeError")

    def __index__(self):
        if self.eager:
            return self.value.__index__()
        raise errors.TracerIntegerConversionError(
            f"a mapped value of shape {self.shape} {self.dtype} was used as a Python index "
            "(list[x], range(x), slicing a Python sequence): " +
            _BOOL_HINT.format(name="TracerIntegerConversionError"))

    def item(self, *args):
        return self._concrete(lambda v: v.item(*args), errors.ConcretizationTypeError,
                              "ConcretizationTypeError") if not self.eager else self.value.item(*args)

    def tolist(self):
        if self.eager:
            return self.value.tolist()
        raise errors.ConcretizationTypeError(
            "tolist() needs concrete values: " + _BOOL_HINT.format(name="ConcretizationTypeError"))

    def __array__(self, dtype=None, copy=None):
        if self.eager:
            return np.asarray(self.value, dtype=dtype)
        raise errors.TracerArrayConversionError(
            f"np.asarray() / np.array() on a mapped value of shape {self.shape} {self.dtype}: "
            "real JAX raises TracerArrayConversionError here, because a traced value has no "
            "concrete NumPy array. Keep computing on the value itself (operators, methods, "
            "simpmd.numpy functions).")

    def __jax_array__(self):
        raise errors.TracerArrayConversionError(
            "a jax.numpy function was given a simpmd device value. Inside a function that "
            "runs on both engines, call array functions through simpmd.numpy (e.g. "
            "`import simpmd.numpy as snp; snp.exp(x)`): it uses NumPy on simpmd's devices "
            "and jax.numpy inside real jax.pmap.")

    def __hash__(self):
        raise TypeError("unhashable type: a mapped array value (as in JAX)")

    # -- showing ---------------------------------------------------------------------
    def __repr__(self):
        body = np.array2string(self.value, separator=", ", prefix="DeviceValue(")
        return f"DeviceValue({body}, dtype={self.dtype})"

    def __str__(self):
        return str(self.value)

    def __format__(self, spec):
        return format(self.value, spec) if spec else str(self.value)


_PLAIN = (int, float, bool, complex, np.ndarray, np.generic)


def defers_to(other) -> bool:
    """True for an operand that wraps device values in turn (simpmd.grad's GradValue, with a
    higher ``__array_priority__``): device values return NotImplemented to it, so that its
    own (reflected) operation runs and sees the device value whole."""
    priority = getattr(other, "__array_priority__", 0)   # a class (a dtype) has a descriptor
    return isinstance(priority, (int, float)) and priority > DeviceValue.__array_priority__


def _fast(ufunc, me, other, reflected):
    o = other.value if type(other) is DeviceValue else other
    if not isinstance(o, _PLAIN):
        if defers_to(o):
            return NotImplemented
        return apply_ufunc(ufunc, (other, me) if reflected else (me, other), {})
    a, b = (o, me.value) if reflected else (me.value, o)
    if type(o) is np.ndarray:
        if (a.dtype.kind in "fc") != (b.dtype.kind in "fc"):
            a, b = _jax_promotion((a, b))
    elif type(o) in (float, complex) and me.value.dtype.kind in "iub":
        a, b = _jax_promotion((a, b))
    r = ufunc(a, b)
    if r.dtype == np.float64 and me.value.dtype.kind in "iub" and (
            type(o) is not np.ndarray or o.dtype.kind in "iub"):
        r = r.astype(np.float32)                   # int / int is float32 in JAX
    return DeviceValue(r, me.eager)


BINARY_OPERATORS = [("add", np.add), ("sub", np.subtract), ("mul", np.multiply),
                    ("truediv", np.true_divide), ("floordiv", np.floor_divide),
                    ("mod", np.remainder), ("divmod", np.divmod), ("pow", np.power),
                    ("matmul", np.matmul), ("lshift", np.left_shift), ("rshift", np.right_shift),
                    ("and", np.bitwise_and), ("xor", np.bitwise_xor), ("or", np.bitwise_or)]
COMPARISONS = [("lt", np.less), ("le", np.less_equal), ("eq", np.equal),
               ("ne", np.not_equal), ("gt", np.greater), ("ge", np.greater_equal)]
UNARY_OPERATORS = [("neg", np.negative), ("pos", np.positive), ("abs", np.absolute),
                   ("invert", np.invert)]


def install_operators(cls, apply, skip=()):
    """Give ``cls`` the Python operators, each computing its ufunc through ``apply`` (NumPy's
    mixin would go through __array_ufunc__, which refuses explicit NumPy calls). Operators
    named in ``skip`` keep the class's own (faster) definitions."""
    def binary(ufunc, reflected):
        if reflected:
            return lambda self, other: (NotImplemented if defers_to(other) else
                                        apply(ufunc, (other, self), {}))
        return lambda self, other: (NotImplemented if defers_to(other) else
                                    apply(ufunc, (self, other), {}))
    for name, ufunc in BINARY_OPERATORS:
        if name not in skip:
            setattr(cls, f"__{name}__", binary(ufunc, False))
            setattr(cls, f"__r{name}__", binary(ufunc, True))
    for name, ufunc in COMPARISONS:
        setattr(cls, f"__{name}__", binary(ufunc, False))
    for name, ufunc in UNARY_OPERATORS:
        if name not in skip:
            setattr(cls, f"__{name}__", lambda self, _u=ufunc: apply(_u, (self,), {}))


# add, sub, mul, truediv, matmul, pow and neg have fast paths in the class itself.
install_operators(DeviceValue, apply_ufunc,
                  skip=("add", "sub", "mul", "truediv", "matmul", "pow", "neg"))


class _IndexUpdateHelper:
    """``x.at[idx].set(v)`` and friends, as on JAX arrays."""

    __slots__ = ("x",)

    def __init__(self, x):
        self.x = x

    def __getitem__(self, index):
        return _IndexUpdateRef(self.x, unwrap(index))


class _IndexUpdateRef:
    __slots__ = ("x", "index")

    def __init__(self, x, index):
        self.x, self.index = x, index

    def _apply(self, ufunc, v):
        out = np.array(self.x.value, copy=True)
        v = np.asarray(unwrap(v))
        if ufunc is None:
            out[self.index] = v
        else:
            ufunc.at(out, self.index, v)
        return DeviceValue(out, self.x.eager)

    def get(self):
        return DeviceValue(self.x.value[self.index], self.x.eager)

    def set(self, v): return self._apply(None, v)
    def add(self, v): return self._apply(np.add, v)
    def multiply(self, v): return self._apply(np.multiply, v)
    def min(self, v): return self._apply(np.minimum, v)
    def max(self, v): return self._apply(np.maximum, v)
