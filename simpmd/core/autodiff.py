"""Reverse-mode differentiation of simulated programs: ``simpmd.grad`` and friends.

Built as in JAX's Autodidax. There are two ways in, one per engine:

* **On a program** (a body on the stacked engine, the default). ``grad(f)(w)`` runs ``f``
  on ``w`` while the body's :class:`program.Recorder` writes its operations down as
  equations, then walks those equations in reverse and applies one rule per primitive,
  ``TRANSPOSE_RULES[eqn.primitive]`` (``mul``, ``dot_general``, ``reduce_sum``, ``psum``,
  ``all_gather``, ...), as Autodidax's ``backward_pass`` applies its ``transpose_rules``.
  The rules compute with the public operations, so the backward equations join the same
  program: a cached call replays them, and ``make_jaxpr`` of a grad prints them. A body
  the engine runs without recording (``shard_map(check_vma=False)`` outside jit, an inner
  pmap) gets a recorder of grad's own, used for the gradient and then dropped.
* **On a tape** (the eager engine, which runs one program per device and records none,
  and plain NumPy outside any mapped body). ``grad(f)(w)`` wraps ``w`` in a
  :class:`GradValue`; each operation on it computes its primal value through the public
  operations and remembers the rule that sends a cotangent back (``VJP``, keyed by
  NumPy's names, and ``FUNCTION_VJP``), as micrograd does.

Both share ``TRANSPOSE``: one rule per collective, registered by ``simpmd.lax``. The
backward pass of a collective is another collective: ``all_gather`` becomes
``psum_scatter`` (FSDP's reduce-scatter), ``ppermute`` sends back along the inverse
permutation, ``psum`` becomes ``psum``. These run on the devices like any collective,
inside ``trace.backward_pass()``, so each device's log marks them as backward (and a
program's equations keep that mark, so a replayed call logs them as backward too).

Like JAX, the rules depend on how the body was mapped. Under ``pmap`` (and
``shard_map(check_vma=False)``) the transpose of ``psum`` is ``psum``: on 8 devices
``grad(lambda v: psum((v*v).sum(), 'i'))`` is ``8 * 2v``. Under ``shard_map`` with
``check_vma=True`` every value knows the mesh axes it *varies* over (its "vma"). A
``psum`` turns a varying value into an invariant one, and its transpose only hands the
cotangent back (``2v``). Combining an invariant value with a varying one first makes it
varying (JAX's ``pvary``), and the transpose of that is a ``psum``. That is why the
gradient of a replicated parameter comes out already summed over the devices. These
facts were checked on jax 0.10.2 with 8 CPU devices (tests/test_grad_vs_jax.py).
"""
from __future__ import annotations

import itertools

import numpy as np
from numpy.lib.mixins import NDArrayOperatorsMixin

from . import errors, tree
from . import program as prog
from . import numpy as snp           # NumPy on plain arrays and on simpmd's device values
from .context import mapped_run
from .trace import backward_pass
from .traced import DeviceValue

__all__ = ["grad", "value_and_grad", "GradValue", "NotDifferentiableError"]


class NotDifferentiableError(errors.SimpmdError, NotImplementedError):
    """An operation on a value being differentiated has no derivative rule here."""


_INSTEAD = ("Write the computation with operations it differentiates (arithmetic, @, sum, "
            "mean, max, reshape, indexing, exp, log, tanh, maximum, where, psum, pmean, "
            "all_gather, psum_scatter, ppermute, all_to_all), or take the gradient with jax.grad.")


def _refuse(name, why=""):
    raise NotDifferentiableError(
        f"simpmd.grad has no derivative rule for {name!r}{': ' + why if why else ''}. {_INSTEAD}")


def _no_collective_rule(op, where=""):
    """pmax, pmin: JAX has no derivative for them either, and says so in these words."""
    return NotDifferentiableError(
        f"Differentiation rule for {op!r} not implemented (as in JAX, which raises "
        f"NotImplementedError for grad of lax.{op}){where}. To take a maximum that gradients "
        f"flow through, all_gather the values and use .max() on them.")


def _group_size(run, axes, groups) -> int:
    """How many devices one group of a collective over ``axes`` holds."""
    if groups is not None:
        return len(groups[0])
    return run.axis_size(axes) if run else 1


_levels = itertools.count(1)


class GradValue(NDArrayOperatorsMixin):
    """A value being differentiated: its primal value and how to send a cotangent back.

    ``parents`` are the tracers it was computed from; ``vjp(ct)`` returns one cotangent
    per parent. ``vma`` is the set of mesh axes the value varies over (used under
    ``shard_map(check_vma=True)`` only).
    """

    __slots__ = ("primal", "parents", "vjp", "vma", "level", "op")
    __array_priority__ = 2000

    def __init__(self, primal, parents=(), vjp=None, vma=frozenset(), level=0, op="input"):
        self.primal, self.parents, self.vjp = primal, parents, vjp
        self.vma, self.level, self.op = vma, level, op

    # -- static facts, as on any array ------------------------------------------------
    shape = property(lambda self: self.primal.shape)
    dtype = property(lambda self: self.primal.dtype)
    ndim = property(lambda self: self.primal.ndim)
    size = property(lambda self: self.primal.size)

    def __len__(self):
        return self.shape[0]

    def __repr__(self):
        return f"GradValue({self.primal!r}, op={self.op!r})"

    # -- computing: every route ends in ``_apply`` -------------------------------------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if method != "__call__" or kwargs.get("out") is not None:
            _refuse(f"numpy.{ufunc.__name__}.{method}")
        name = ufunc.__name__
        compute = getattr(snp, name)    # NumPy's ufunc, on plain or device values
        if name in CONSTANT_OUTPUT:
            return compute(*[_primal(x) for x in inputs], **kwargs)
        if name not in VJP:
            _refuse(f"numpy.{name}")
        return _apply(name, inputs, lambda *p: compute(*p, **kwargs))

    def __array_function__(self, func, types, args, kwargs):
        name = func.__name__
        if name in CONSTANT_OUTPUT:
            return getattr(snp, name)(*_primals(args), **_primals(kwargs))
        if name in ("concatenate", "stack"):
            return _join(name, getattr(snp, name), *args, **kwargs)
        if name not in FUNCTION_VJP:
            _refuse(f"numpy.{name}")
        return FUNCTION_VJP[name](*args, **kwargs)

    def sum(self, axis=None, keepdims=False, dtype=None):
        return _reduce("sum", self, axis, keepdims)

    def mean(self, axis=None, keepdims=False, dtype=None):
        return _reduce("mean", self, axis, keepdims)

    def max(self, axis=None, keepdims=False):
        return _reduce("max", self, axis, keepdims)

    def min(self, axis=None, keepdims=False):
        return _reduce("min", self, axis, keepdims)

    def reshape(self, *shape, **kwargs):
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        old = self.shape
        return _apply("reshape", (self,), lambda p: p.reshape(shape, **kwargs),
                      vjp=lambda ct, out, p: (ct.reshape(old),))

    def ravel(self):
        return self.reshape(-1)

    flatten = ravel

    def squeeze(self, axis=None):
        old = self.shape
        return _apply("squeeze", (self,), lambda p: p.squeeze(axis),
                      vjp=lambda ct, out, p: (ct.reshape(old),))

    def transpose(self, *axes):
        axes = axes[0] if len(axes) == 1 and isinstance(axes[0], (tuple, list)) else axes
        axes = tuple(axes) or tuple(reversed(range(self.ndim)))
        inverse = tuple(np.argsort(axes))
        return _apply("transpose", (self,), lambda p: p.transpose(axes),
                      vjp=lambda ct, out, p: (ct.transpose(inverse),))

    T = property(lambda self: self.transpose())

    def astype(self, dtype):
        if not np.issubdtype(np.dtype(dtype), np.inexact):
            return self.primal.astype(dtype)          # an integer copy carries no gradient
        old = self.dtype
        return _apply("astype", (self,), lambda p: p.astype(dtype),
                      vjp=lambda ct, out, p: (ct.astype(old),))

    def dot(self, other):
        return np.matmul(self, other)

    def __getitem__(self, index):
        index = _primals(index)
        return _apply("getitem", (self,), lambda p: p[index],
                      vjp=lambda ct, out, p: (_scatter_add(p, index, ct),))

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        _refuse(f".{name}", "method not differentiated")

    # -- what loses the gradient --------------------------------------------------------
    def _concrete(self, kind):
        raise errors.ConcretizationTypeError(
            f"{kind}() of a value that simpmd.grad is differentiating (shape {self.shape}): "
            f"a Python number carries no gradient, as in JAX. Keep computing with arrays; "
            f"for a value you only want to look at, return it as aux (has_aux=True).")

    def __bool__(self): return self._concrete("bool")
    def __float__(self): return self._concrete("float")
    def __int__(self): return self._concrete("int")
    def __index__(self): return self._concrete("index")

    def __array__(self, dtype=None, copy=None):
        raise errors.TracerArrayConversionError(
            f"np.asarray() of a value that simpmd.grad is differentiating (shape "
            f"{self.shape}): the gradient cannot flow through a NumPy array. Use operators, "
            f"array methods and simpmd.numpy functions instead.")

    def __hash__(self):
        raise TypeError("unhashable type: a value being differentiated (as in JAX)")


def _is_grad_value(x) -> bool:
    return type(x) is GradValue


def holds_grad_value(leaves) -> bool:
    """True if any of ``leaves`` is a value being differentiated (the hook lax uses)."""
    return any(type(v) is GradValue for v in leaves)


def _primal(x):
    return x.primal if type(x) is GradValue else x


def _primals(x):
    """``x`` with every tracer replaced by its primal (inside lists, tuples and dicts too)."""
    if type(x) is GradValue:
        return x.primal
    if isinstance(x, (list, tuple)) and not hasattr(type(x), "_fields"):
        return type(x)(_primals(v) for v in x)
    if isinstance(x, dict):
        return {k: _primals(v) for k, v in x.items()}
    return x


# -- the mapping context: pmap-style rules, or shard_map's varying-axes rules --------------

def _uses_vma() -> bool:
    """True inside a ``shard_map(check_vma=True)`` body: values track their varying axes."""
    run = mapped_run()
    return run is not None and run.check_vma


def _vma(x):
    """The mesh axes ``x`` varies over, under ``check_vma``.

    A tracer knows its own. For a body input (or a view of one) the engine knows it
    (``context.mapped_run().input_vma``). A Python or NumPy constant varies over none. Any
    other device value is taken to vary over every manual axis, as a value computed from
    sharded inputs does. (Device values defer to a tracer, so one on the left of an
    operator, ``x2 @ w``, reaches the tracer whole, not as a bare NumPy array.)
    """
    if type(x) is GradValue:
        return x.vma
    run = mapped_run()
    if run is None or not run.check_vma or not isinstance(x, (DeviceValue, np.ndarray)):
        return frozenset()
    vma = run.input_vma(x.value if isinstance(x, DeviceValue) else x)
    if vma is not None:
        return vma
    return frozenset(name for name, _ in run.axes) if isinstance(x, DeviceValue) else frozenset()


def _apply(op, inputs, forward, vjp=None, out_vma=None):
    """Compute ``forward`` on the primals of ``inputs``; return a tracer that remembers ``vjp``.

    ``vjp(ct, out_primal, *input_primals)`` returns one cotangent per input. Under
    ``check_vma`` an input that varies over fewer axes than the result was implicitly
    made varying (``pvary``); its cotangent is summed over the missing axes (``psum``).
    """
    levels = {x.level for x in inputs if type(x) is GradValue}
    if len(levels) > 1:
        raise NotDifferentiableError(
            f"{op!r} mixes values from two different simpmd.grad calls: simpmd.grad does "
            f"not nest (grad of grad). Use jax.grad for higher derivatives.")
    primals = [_primal(x) for x in inputs]
    out = forward(*primals)
    uses_vma = _uses_vma()
    vma = frozenset()
    if uses_vma:
        vma = out_vma if out_vma is not None else frozenset().union(*(_vma(x) for x in inputs))
    rule = vjp or VJP[op]
    parents = tuple((k, x) for k, x in enumerate(inputs) if type(x) is GradValue)

    def backward(ct):
        cts = rule(ct, out, *primals)
        result = []
        for k, x in parents:
            c = cts[k]
            missing = tuple(a for a in sorted(vma, key=str) if a not in x.vma) if uses_vma else ()
            if missing and c is not None:
                c = TRANSPOSE["pvary"](c, missing, {}, None)
            result.append(c)
        return result

    return GradValue(out, tuple(x for _, x in parents), backward, vma, levels.pop(), op)


# -- primitive rules -----------------------------------------------------------------------

def _unbroadcast(ct, shape):
    """Sum ``ct`` down to ``shape``: the transpose of NumPy broadcasting."""
    shape = tuple(shape)
    if tuple(ct.shape) == shape:
        return ct
    extra = ct.ndim - len(shape)
    if extra:
        ct = ct.sum(axis=tuple(range(extra)))
    kept = tuple(d for d, n in enumerate(shape) if n == 1 and ct.shape[d] != 1)
    if kept:
        ct = ct.sum(axis=kept, keepdims=True)
    return ct


def _shape(x):
    return np.shape(x) if not hasattr(x, "shape") else x.shape


def _binary(rule):
    """A rule for a broadcasting binary ufunc, given its two unreduced cotangents."""
    def vjp(ct, out, a, b):
        ca, cb = rule(ct, out, a, b)
        return (_unbroadcast(ca, _shape(a)) if ca is not None else None,
                _unbroadcast(cb, _shape(b)) if cb is not None else None)
    return vjp


def _matmul_vjp(ct, out, a, b):
    a_nd, b_nd = len(_shape(a)), len(_shape(b))
    if a_nd == 1 and b_nd == 1:
        return ct * b, ct * a
    if a_nd == 1:
        return b @ ct, _unbroadcast(a.reshape(-1, 1) * ct.reshape(1, -1), _shape(b))
    if b_nd == 1:
        return ct.reshape(-1, 1) * b.reshape(1, -1), a.T @ ct
    return (_unbroadcast(ct @ snp.swapaxes(b, -1, -2), _shape(a)),
            _unbroadcast(snp.swapaxes(a, -1, -2) @ ct, _shape(b)))


def _chooser(ct, out, a, b):
    """maximum/minimum: the gradient goes to the chosen input; ties share it, as in JAX."""
    return ct * (out == a) * ((a != b) + 0.5 * (a == b)), ct * (out == b) * ((a != b) + 0.5 * (a == b))


VJP = {                     # keyed by NumPy's names (np.true_divide is np.divide)
    "add": _binary(lambda ct, out, a, b: (ct, ct)),
    "subtract": _binary(lambda ct, out, a, b: (ct, -ct)),
    "multiply": _binary(lambda ct, out, a, b: (ct * b, ct * a)),
    "divide": _binary(lambda ct, out, a, b: (ct / b, -ct * out / b)),
    "power": _binary(lambda ct, out, a, b: (
        ct * b * a ** (b - 1),
        None if isinstance(b, (int, float)) else ct * out * snp.log(snp.where(a > 0, a, 1)))),
    "maximum": _binary(_chooser),
    "minimum": _binary(_chooser),
    "matmul": _matmul_vjp,
    "negative": lambda ct, out, a: (-ct,),
    "positive": lambda ct, out, a: (ct,),
    "square": lambda ct, out, a: (2 * a * ct,),
    "sqrt": lambda ct, out, a: (ct / (2 * out),),
    "exp": lambda ct, out, a: (ct * out,),
    "log": lambda ct, out, a: (ct / a,),
    "log1p": lambda ct, out, a: (ct / (1 + a),),
    "tanh": lambda ct, out, a: (ct * (1 - out * out),),
    "sin": lambda ct, out, a: (ct * snp.cos(a),),
    "cos": lambda ct, out, a: (-ct * snp.sin(a),),
    "absolute": lambda ct, out, a: (ct * snp.sign(a),),
}

# Operations whose result carries no gradient (JAX gives it a zero cotangent).
CONSTANT_OUTPUT = {"greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
                   "sign", "floor", "ceil", "rint", "isfinite", "isnan", "argmax", "argmin",
                   "zeros_like", "ones_like", "shape", "ndim", "size", "result_type",
                   "logical_and", "logical_or", "logical_not"}


def _axes_of(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axis = axis if isinstance(axis, tuple) else (axis,)
    return tuple(a % ndim for a in axis)


def _reduce(op, x, axis, keepdims):
    """sum, mean, max, min over ``axis``; the cotangent spreads back over what was reduced."""
    shape = x.shape
    axes = _axes_of(axis, len(shape))
    kept = tuple(1 if d in axes else n for d, n in enumerate(shape))
    count = int(np.prod([shape[d] for d in axes])) if axes else 1

    def forward(p):
        return getattr(p, op)(axis=axis, keepdims=keepdims)

    def vjp(ct, out, p):
        ct = ct.reshape(kept)
        if op == "sum":
            return (snp.broadcast_to(ct, shape) * 1,)
        if op == "mean":
            return (snp.broadcast_to(ct / count, shape) * 1,)
        chosen = p == out.reshape(kept)                    # ties share, as in JAX
        return (ct * chosen / chosen.sum(axis=axes, keepdims=True),)

    if not isinstance(x, GradValue):
        return forward(x)
    return _apply(op, (x,), forward, vjp)


def _where(cond, x=None, y=None):
    if x is None:
        _refuse("numpy.where with one argument")
    # A condition that varies makes the result vary (JAX pvary's the branches to match it).
    out_vma = frozenset().union(_vma(cond), _vma(x), _vma(y)) if _uses_vma() else None
    cond = _primal(cond)

    def vjp(ct, out, px, py):
        zero = ct * 0
        return (_unbroadcast(snp.where(cond, ct, zero), _shape(px)),
                _unbroadcast(snp.where(cond, zero, ct), _shape(py)))
    return _apply("where", (x, y), lambda px, py: snp.where(cond, px, py), vjp, out_vma)


def _join(name, func, arrays, axis=0, **kwargs):
    arrays = list(arrays)
    shapes = [_shape(_primal(a)) for a in arrays]

    def vjp(ct, out, *ps):
        if name == "stack":
            return tuple(snp.take(ct, i, axis=axis) for i in range(len(ps)))
        bounds = np.cumsum([s[axis] for s in shapes])[:-1]
        return tuple(snp.split(ct, bounds, axis=axis))
    return _apply(name, arrays, lambda *ps: func(list(ps), axis=axis, **kwargs), vjp)


def _scatter_add(p, index, ct):
    """A zero array shaped like ``p`` with ``ct`` added at ``index``: the transpose of indexing."""
    zeros = snp.zeros_like(p)
    if hasattr(zeros, "at"):
        return zeros.at[index].add(ct)
    np.add.at(zeros, index, ct)
    return zeros


FUNCTION_VJP = {                     # keyed by NumPy's names (np.true_divide is np.divide)
    "sum": lambda x, axis=None, keepdims=False, **kw: _reduce("sum", x, axis, keepdims),
    "mean": lambda x, axis=None, keepdims=False, **kw: _reduce("mean", x, axis, keepdims),
    "max": lambda x, axis=None, keepdims=False, **kw: _reduce("max", x, axis, keepdims),
    "amax": lambda x, axis=None, keepdims=False, **kw: _reduce("max", x, axis, keepdims),
    "min": lambda x, axis=None, keepdims=False, **kw: _reduce("min", x, axis, keepdims),
    "amin": lambda x, axis=None, keepdims=False, **kw: _reduce("min", x, axis, keepdims),
    "reshape": lambda x, *shape, **kw: x.reshape(*shape, **kw),
    "transpose": lambda x, axes=None: x.transpose(*(axes or ())),
    "squeeze": lambda x, axis=None: x.squeeze(axis),
    "ravel": lambda x: x.ravel(),
    "dot": lambda a, b: _apply("matmul", (a, b), snp.dot),
    "where": _where,
}


# -- collectives: one transpose rule each -----------------------------------------------------

# op -> (ct, axes, params, groups) -> the cotangent of the input, itself a collective.
# simpmd.lax fills it in, as jax.lax registers its primitives' transpose rules with JAX's
# autodiff, so this module calls no collective itself. "pvary" is the implicit broadcast
# of an invariant value over the axes it meets (JAX's pvary); its transpose is a psum.
TRANSPOSE: dict = {}


# Under check_vma: the invariant-making collectives divide the cotangent among the devices
# that held the varying value, without communicating (JAX's pvary is local).
_VMA_TRANSPOSES = {
    "psum": lambda ct, axes, p, g, n: ct,
    "pmean": lambda ct, axes, p, g, n: ct / n,
}


def collective(op, leaves, treedef, axis_name, params, groups, run):
    """A collective on values being differentiated: forward with ``run``, then remember
    its transpose. ``run(primal_leaves)`` performs the forward collective (lax's own path)."""
    if op not in TRANSPOSE:
        raise _no_collective_rule(op)
    axes = tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)
    outs = run([_primal(v) for v in leaves])
    run = mapped_run()
    uses_vma = run is not None and run.check_vma
    size = _group_size(run, axes, groups)
    results = []
    for leaf, out in zip(leaves, outs):
        if type(leaf) is not GradValue:
            results.append(out)
            continue
        vma_in = leaf.vma | frozenset(axes) if uses_vma else frozenset()
        vma_out = vma_in - frozenset(axes) if op in ("psum", "pmean") else vma_in

        def backward(ct, leaf=leaf, vma_in=vma_in):
            with backward_pass():
                if uses_vma and op in _VMA_TRANSPOSES:
                    c = _VMA_TRANSPOSES[op](ct, axes, params, groups, size)
                else:
                    c = TRANSPOSE[op](ct, axes, params, groups)
                missing = tuple(a for a in sorted(vma_in, key=str) if a not in leaf.vma)
                if missing:                  # the implicit pvary of an invariant input
                    c = TRANSPOSE["pvary"](c, missing, {}, None)
            return [c]
        results.append(GradValue(out, (leaf,), backward, vma_out, leaf.level, op))
    return tree.unflatten(treedef, results)


# -- the program path: transpose the forward equations, one rule per primitive ----------------
# Inside a body that the stacked engine traces into a program (the default engine), grad
# does not build a tape. It records the forward computation as equations of the body's
# program, then walks those equations backwards and applies TRANSPOSE_RULES[primitive] to
# each, as Autodidax's ``backward_pass`` applies its ``transpose_rules``. Each rule computes
# with the public operations, so the backward equations are recorded into the same program
# (a cached call replays them, and make_jaxpr prints them), and its collectives run inside
# ``trace.backward_pass()``, so the log marks them backward.
#
# A rule is ``rule(cts, call) -> [(operand, cotangent), ...]``: ``cts`` holds one cotangent
# per output of the equation (None where none reached it); ``call`` is the recorded call,
# its arguments both as recorded (``call.recorded``, variables in place of stacked values)
# and as computed on this first call (``call.args``), and its outputs (``call.outs``).
# For a nonlinear primitive (mul, exp, ...) the rule is the transpose of its linearization
# at the recorded values, which is what JAX's JVP-then-transpose gives.


class _Call:
    __slots__ = ("eqn", "recorded", "args", "kwargs", "outs", "active")

    def __init__(self, eqn, values, active):
        self.eqn, self.recorded, self.active = eqn, eqn.args, active
        self.args, self.kwargs = prog._substitute((eqn.args, eqn.kwargs), values)
        self.outs = [values[v] for v in eqn.outvars]

    def needs(self, operand) -> bool:
        """True if ``operand`` (as recorded) is a variable the differentiated inputs reach."""
        return type(operand) is prog.Var and operand in self.active

    @property
    def primitive(self):
        return str(self.eqn.primitive)

    def made_by(self, name):
        """True if the equation was recorded by batching's operation ``name``."""
        return getattr(self.eqn.fn, "__name__", None) == name

    def numpy_name(self):
        """The NumPy function or method name behind an apply_function/call_method equation."""
        if self.made_by("call_method"):
            return self.args[0]
        if self.made_by("apply_function"):
            return getattr(self.args[0], "__name__", str(self.args[0]))
        if self.made_by("apply_ufunc"):
            return self.args[0].__name__
        return self.eqn.fn.__name__

    def method(self):
        """(recorded x, x, args, kwargs) of ``x.name(*args, **kwargs)`` or ``np.name(x, ...)``."""
        if self.made_by("call_method"):
            return self.recorded[1], self.args[1], self.args[2:], self.kwargs
        if self.made_by("apply_function"):
            return self.recorded[1][0], self.args[1][0], self.args[1][1:], self.args[2]
        if self.made_by("as_device_value"):
            return self.recorded[0], self.args[0], self.args[1:], self.kwargs
        raise _unsupported(self)


def _unsupported(call, what=None):
    return NotDifferentiableError(
        f"simpmd.grad has no transpose rule for {call.primitive!r} made by "
        f"{what or call.numpy_name()!r}{_line(call.eqn)}. {_INSTEAD}")


def _line(eqn):
    return f" (at {eqn.source}: {eqn.code.strip()})" if eqn.source else ""


def _ufunc(cts, call):
    """An elementwise primitive made by a NumPy ufunc (and ``@``): one rule per operand, so
    that only the cotangents of operands the inputs flow into are computed (as in JAX)."""
    if not call.made_by("apply_ufunc") or call.args[2] or call.args[3:] not in ((), ("__call__",)):
        raise _unsupported(call)
    name = call.args[0].__name__
    name = _UFUNC_ALIASES.get(name, name)
    ct, out, operands = cts[0], call.outs[0], call.args[1]
    if len(operands) == 2 and name in BINARY_PARTS:
        pairs = []
        for k, var in enumerate(call.recorded[1]):
            if call.needs(var):
                c = BINARY_PARTS[name](k, ct, out, *operands)
                pairs.append((var, c if name == "matmul" else _unbroadcast(c, _shape(operands[k]))))
        return pairs
    vjp = VJP.get(name)
    if vjp is None or len(operands) != 1:
        raise _unsupported(call, f"numpy.{call.args[0].__name__}")
    return list(zip(call.recorded[1], vjp(ct, out, *operands)))


_UFUNC_ALIASES = {"true_divide": "divide", "fabs": "absolute", "fmax": "maximum",
                  "fmin": "minimum", "float_power": "power"}
VJP["reciprocal"] = lambda ct, out, a: (-ct * out * out,)


def _swap_last(x):
    """``x`` with its last two axes swapped (a matrix transposed), as one transpose."""
    nd = len(_shape(x))
    perm = tuple(range(nd - 2)) + (nd - 1, nd - 2)
    return x.transpose(perm) if prog.is_stacked(x) else np.transpose(x, perm)


def _matmul_part(k, ct, out, a, b):
    """The cotangent of ``a`` (k = 0) or ``b`` (k = 1) of ``a @ b``."""
    a_nd, b_nd = len(_shape(a)), len(_shape(b))
    if a_nd == 1 and b_nd == 1:
        return ct * b if k == 0 else ct * a
    if a_nd == 1:
        return b @ ct if k == 0 else _unbroadcast(a.reshape(-1, 1) * ct.reshape(1, -1), _shape(b))
    if b_nd == 1:
        return ct.reshape(-1, 1) * b.reshape(1, -1) if k == 0 else _swap_last(a) @ ct
    if k == 0:
        return _unbroadcast(ct @ _swap_last(b), _shape(a))
    return _unbroadcast(_swap_last(a) @ ct, _shape(b))


def _pow_part(k, ct, out, a, b):
    if k == 0:
        if isinstance(b, (int, float)) and b == 2:
            return ct * (2 * a)                        # as JAX's integer_pow rule writes it
        return ct * (b * a ** (b - 1))
    return ct * out * snp.log(snp.where(a > 0, a, 1))


def _choice_part(k, ct, out, a, b):
    """maximum/minimum: the gradient goes to the chosen input; ties share it, as in JAX."""
    return ct * (out == (a, b)[k]) * ((a != b) + 0.5 * (a == b))


BINARY_PARTS = {             # (operand k, ct, out, a, b) -> the cotangent of operand k
    "add": lambda k, ct, out, a, b: ct,
    "subtract": lambda k, ct, out, a, b: ct if k == 0 else -ct,
    "multiply": lambda k, ct, out, a, b: ct * b if k == 0 else ct * a,
    "divide": lambda k, ct, out, a, b: ct / b if k == 0 else -ct * out / b,
    "power": _pow_part,
    "maximum": _choice_part,
    "minimum": _choice_part,
    "matmul": _matmul_part,
}


def _dot_general(cts, call):
    if call.made_by("apply_ufunc"):
        return _ufunc(cts, call)
    if call.made_by("apply_function") and call.numpy_name() == "dot" and not call.args[2]:
        a, b = call.args[1]
        if len(_shape(a)) <= 2 and len(_shape(b)) <= 2:      # np.dot is a @ b there
            return [(v, _matmul_part(k, cts[0], call.outs[0], a, b))
                    for k, v in enumerate(call.recorded[1]) if call.needs(v)]
    raise _unsupported(call)


def _zero(cts, call):
    """sign, floor, round, ...: a derivative that is zero wherever it exists (as in JAX)."""
    return []


def _kept_shape(x, axes):
    return tuple(1 if d in axes else n for d, n in enumerate(_shape(x)))


def _spread(ct, x, axes, keepdims):
    """The cotangent of a reduction over ``axes`` of ``x``, spread back over ``x``'s shape."""
    if not keepdims and ct.ndim and axes != tuple(range(len(axes))):
        ct = ct.reshape(_kept_shape(x, axes))
    return snp.broadcast_to(ct, _shape(x))


def _reduction(kind):
    def rule(cts, call):
        xv, x, args, kwargs = call.method()
        if args[1:] or set(kwargs) - {"axis", "keepdims"}:
            raise _unsupported(call)
        axes = call.eqn.params["axes"]
        keepdims = kwargs.get("keepdims", False)
        ct = cts[0]
        if kind == "sum":
            return [(xv, _spread(ct, x, axes, keepdims))]
        if kind == "mean":
            return [(xv, _spread(ct / call.eqn.params["_divisor"], x, axes, keepdims))]
        out = call.outs[0]                                   # max, min: ties share, as in JAX
        if not keepdims and axes:
            out, ct = out.reshape(_kept_shape(x, axes)), ct.reshape(_kept_shape(x, axes))
        chosen = x == out
        return [(xv, ct * chosen / chosen.sum(axis=axes, keepdims=True))]
    return rule


def _reshape(cts, call):
    xv, x, _, _ = call.method()
    return [(xv, cts[0].reshape(_shape(x)))]


def _transpose(cts, call):
    xv, x, args, _ = call.method()
    if call.numpy_name() == "swapaxes":             # its own inverse, as one transpose
        a, b = (int(i) % len(_shape(x)) for i in args[:2])
        perm = list(range(len(_shape(x))))
        perm[a], perm[b] = b, a
        return [(xv, cts[0].transpose(tuple(perm)))]
    perm = call.eqn.params["permutation"]
    return [(xv, cts[0].transpose(tuple(int(i) for i in np.argsort(perm))))]


def _convert(cts, call):
    xv, x, _, _ = call.method()
    if not np.issubdtype(x.dtype, np.inexact):
        return []
    return [(xv, cts[0].astype(x.dtype) if cts[0].dtype != x.dtype else cts[0])]


def _copy(cts, call):
    if call.made_by("apply_ufunc"):
        return _ufunc(cts, call)
    xv, _, _, _ = call.method()
    return [(xv, cts[0])]


def _broadcast_in_dim(cts, call):
    name = call.numpy_name()
    if name in ("zeros_like", "ones_like", "empty_like", "full_like"):
        return []               # the values of x do not matter (the engine's fill is a constant)
    if name == "broadcast_to" and not call.args[2]:
        xv, x = call.recorded[1][0], call.args[1][0]
        return [(xv, _unbroadcast(cts[0], _shape(x)))]
    if name == "expand_dims":
        xv, x = call.recorded[1][0], call.args[1][0]
        return [(xv, cts[0].reshape(_shape(x)))]
    raise _unsupported(call)


def _select_n(cts, call):
    if call.numpy_name() != "where" or call.args[2] or len(call.args[1]) != 3:
        raise _unsupported(call)
    cond, x, y = call.args[1]
    _, xv, yv = call.recorded[1]
    ct = cts[0]
    zero = ct * 0
    return [(xv, _unbroadcast(snp.where(cond, ct, zero), _shape(x))),
            (yv, _unbroadcast(snp.where(cond, zero, ct), _shape(y)))]


def _concatenate(cts, call):
    name = call.numpy_name()
    if name not in ("concatenate", "stack") or set(call.args[2]) - {"axis"}:
        raise _unsupported(call)
    arrays = list(call.args[1][0])
    recorded = list(call.recorded[1][0])
    axis = call.args[1][1] if len(call.args[1]) > 1 else call.args[2].get("axis", 0)
    ct = cts[0]
    if name == "stack":
        return [(v, snp.take(ct, i, axis=axis)) for i, v in enumerate(recorded)]
    bounds = np.cumsum([_shape(a)[axis] for a in arrays])[:-1]
    return list(zip(recorded, snp.split(ct, bounds, axis=axis)))


def _clamp(cts, call):
    xv, x, args, kwargs = call.method()
    lo = args[0] if args else kwargs.get("a_min", kwargs.get("min"))
    hi = args[1] if len(args) > 1 else kwargs.get("a_max", kwargs.get("max"))
    ct = cts[0]
    keep = (x >= lo) if lo is not None else None
    if hi is not None:
        keep = (x <= hi) if keep is None else keep * (x <= hi)
    return [(xv, ct if keep is None else snp.where(keep, ct, ct * 0))]


def _index(cts, call):
    """slice and gather (``x[index]``): the cotangent is added back at ``index`` (JAX: pad
    for a slice, scatter-add for a gather)."""
    if not call.made_by("getitem"):
        raise _unsupported(call)
    x, index = call.args
    zeros = snp.zeros_like(x)
    return [(call.recorded[0], zeros.at[index].add(cts[0]))]


def _scatter(cts, call):
    """``x.at[index].set(v)`` / ``.add(v)``: x's cotangent (zero where set), v's gathered."""
    if not call.made_by("_update") or call.args[2] not in (None, np.add):
        raise _unsupported(call)
    x, index, ufunc, v = call.args
    ct = cts[0]
    ct_x = ct if ufunc is np.add else ct.at[index].set(0)
    pairs = [(call.recorded[0], ct_x)]
    if type(call.recorded[3]) is prog.Var:
        pairs.append((call.recorded[3], _unbroadcast(ct[index], _shape(v))))
    return pairs


def _collective(cts, call):
    """A collective's transpose is a collective (``TRANSPOSE``, registered by simpmd.lax);
    under ``shard_map(check_vma=True)`` psum and pmean only hand the cotangent back."""
    op, axes, params, groups = call.eqn.fn.args
    if op not in TRANSPOSE:
        raise _no_collective_rule(op, _line(call.eqn))
    run = mapped_run()
    uses_vma = run is not None and run.check_vma
    size = _group_size(run, axes, groups)
    pairs = []
    for var, ct in zip(call.recorded[0], cts):
        if ct is None:
            continue
        if uses_vma and op in _VMA_TRANSPOSES:
            pairs.append((var, _VMA_TRANSPOSES[op](ct, axes, params, groups, size)))
        else:
            pairs.append((var, TRANSPOSE[op](ct, axes, params, groups)))
    return pairs


COLLECTIVE_PRIMITIVES = frozenset({"psum", "pmean", "pmax", "pmin", "all_gather",
                                   "reduce_scatter", "ppermute", "pshuffle", "all_to_all",
                                   "pswapaxes"})

# One rule per primitive of the program (program.py's names, which are JAX's where JAX has
# the primitive), as JAX's ad.primitive_transposes and Autodidax's transpose_rules.
TRANSPOSE_RULES = {
    **{name: _ufunc for name in ("add", "sub", "mul", "div", "neg", "pow", "max", "min",
                                 "exp", "log", "log1p", "tanh", "sin", "cos", "sqrt",
                                 "square", "abs")},
    "dot_general": _dot_general,
    "copy": _copy,
    **{name: _zero for name in ("sign", "floor", "ceil", "round")},
    "reduce_sum": _reduction("sum"),
    "mean": _reduction("mean"),
    "reduce_max": _reduction("max"),
    "reduce_min": _reduction("min"),
    "reshape": _reshape,
    "squeeze": _reshape,
    "transpose": _transpose,
    "convert_element_type": _convert,
    "broadcast_in_dim": _broadcast_in_dim,
    "select_n": _select_n,
    "concatenate": _concatenate,
    "clamp": _clamp,
    "slice": _index,
    "gather": _index,
    "scatter": _scatter,
    "scatter_add": _scatter,
    **{name: _collective for name in ("psum", "pmean", "all_gather", "reduce_scatter",
                                      "ppermute", "pshuffle", "all_to_all", "pswapaxes")},
}


def _no_rule(eqn):
    name = str(eqn.primitive)
    if name in COLLECTIVE_PRIMITIVES:
        return _no_collective_rule(name, _line(eqn))
    return NotDifferentiableError(
        f"simpmd.grad has no transpose rule for the primitive {name!r}{_line(eqn)}. {_INSTEAD}")


def _missing_axes(eqn, var, vma):
    """Under check_vma: the axes over which ``var`` was implicitly made varying (JAX's
    pvary) by ``eqn``, whose cotangent must therefore be summed over them."""
    mine = vma.get(var, frozenset())
    if eqn.primitive in COLLECTIVE_PRIMITIVES:
        wanted = mine | frozenset(eqn.fn.args[1])         # the collective's axes
    else:
        wanted = frozenset().union(*(vma.get(v, frozenset()) for v in eqn.outvars))
    return tuple(a for a in sorted(wanted, key=str) if a not in mine)


def _is_float(var) -> bool:
    return var.dtype.kind in "fc"


def transpose_program(rec, start, in_vars, out_var, seed):
    """Send ``seed`` back from ``out_var`` through the equations ``rec.eqns[start:]``;
    returns each reached variable's cotangent (those of ``in_vars`` included)."""
    active, linear = set(in_vars), []
    for eqn in rec.eqns[start:]:                 # which equations the inputs flow through
        if any(v in active for v in eqn.invars):
            outs = [v for v in eqn.outvars if _is_float(v)]
            if outs:
                if eqn.primitive not in TRANSPOSE_RULES:
                    raise _no_rule(eqn)
                active.update(outs)
                linear.append(eqn)
    cts = {}
    if out_var not in active:
        return cts
    cts[out_var] = seed
    vma = rec.vma if rec.track_vma else None
    with backward_pass():
        for eqn in reversed(linear):
            outs = [cts.pop(v, None) for v in eqn.outvars]
            if all(c is None for c in outs):
                continue
            call = _Call(eqn, rec.values, active)
            for var, c in TRANSPOSE_RULES[eqn.primitive](outs, call):
                if c is None or type(var) is not prog.Var or var not in active:
                    continue
                if vma is not None:
                    missing = _missing_axes(eqn, var, vma)
                    if missing:
                        c = TRANSPOSE["pvary"](c, missing, {}, None)
                if tuple(_shape(c)) != var.shape:
                    c = snp.broadcast_to(c, var.shape)
                before = cts.get(var)
                cts[var] = c if before is None else before + c
    return cts


_program_grads = []          # the program-path grads whose forward is running


def _program_recorder(args, nums):
    """The recorder to differentiate on, and whether grad made it itself; (None, False) if
    grad must build its tape instead.

    In a body being traced into a program, the body's recorder, if it knows every
    differentiated leaf. In a body that the stacked engine runs without recording (a
    ``shard_map(check_vma=False)`` body outside jit, an inner pmap), a recorder of grad's
    own, whose program is dropped once the gradient is computed. Elsewhere (the eager
    engine, plain NumPy, a differentiated value that is not stacked) there is no program.
    """
    leaves = [leaf for a in nums for leaf in tree.flatten(args[a])[0]]
    if not leaves or not all(prog.is_stacked(leaf) for leaf in leaves):
        return None, False
    rec = prog.recording()
    if rec is not None:
        for leaf in leaves:
            found = rec.vars.get(id(leaf))
            if found is None or found[1] is not leaf:
                return None, False
        return rec, False
    run = mapped_run()
    if run is None or run.check_vma:     # check_vma bodies are always traced into a program
        return None, False
    rec = prog.Recorder(outside_constants=True)
    for leaf in leaves:
        if id(leaf) not in rec.vars:
            rec.input(leaf)
    return rec, True


def _check_input(leaf, a):
    if not np.issubdtype(leaf.dtype, np.inexact):
        raise TypeError(
            f"grad requires real- or complex-valued inputs (input dtype that is a "
            f"sub-dtype of np.inexact), but got {leaf.dtype.name} for argument "
            f"{a}. If you want to use integer-valued inputs, convert them to float "
            f"first (as JAX says).")


def _value_and_grad_program(rec, fun, many, nums, has_aux, args, kwargs):
    """grad on the program: record the forward, then transpose its equations."""
    if _program_grads:
        raise NotDifferentiableError(
            "simpmd.grad was called inside a function another simpmd.grad is "
            "differentiating: simpmd.grad does not nest. Use jax.grad for higher "
            "derivatives.")
    start = len(rec.eqns)
    args = list(args)
    wrapped, names = [], {}
    for a in nums:
        leaves, treedef = tree.flatten(args[a])
        stand_ins = []
        for leaf in leaves:
            _check_input(leaf, a)
            alias = leaf._with(leaf._stack)          # a fresh variable for this argument
            names[rec.alias(alias, leaf)] = rec.vars[id(leaf)][0]
            stand_ins.append(alias)
        wrapped.append((stand_ins, treedef))
        args[a] = tree.unflatten(treedef, stand_ins)
    _program_grads.append(rec)
    try:
        result = fun(*args, **kwargs)
    finally:
        _program_grads.pop()
    out, aux = _split_aux(result, has_aux)
    if _shape(out) != ():
        raise TypeError(f"Gradient only defined for scalar-output functions. Output had "
                        f"shape: {_shape(out)}.")
    if rec.broken is not None or prog.recording() is not rec:
        raise NotDifferentiableError(
            f"simpmd.grad could not record the function it differentiates as a program "
            f"({rec.broken or 'the recording stopped'}).")
    cts = {}
    found = rec.vars.get(id(out)) if prog.is_stacked(out) else None
    if found is not None and found[1] is out:
        in_vars = [rec.vars[id(s)][0] for stand_ins, _ in wrapped for s in stand_ins]
        cts = transpose_program(rec, start, in_vars, found[0], snp.ones_like(out))
    grads = []
    for stand_ins, treedef in wrapped:
        leaves = []
        for s in stand_ins:
            c = cts.get(rec.vars[id(s)][0])
            c = snp.zeros_like(s) if c is None else c
            leaves.append(c.astype(s.dtype) if c.dtype != s.dtype else c)
        grads.append(tree.unflatten(treedef, leaves))
    rec.rename(start, names)
    return out, aux, (tuple(grads) if many else grads[0])


def _split_aux(result, has_aux):
    if has_aux:
        if not (isinstance(result, tuple) and len(result) == 2):
            raise TypeError("has_aux=True needs the function to return a pair "
                            f"(output, auxiliary data), got {type(result).__name__}.")
        return result
    return result, None


# -- the backward pass and the API ---------------------------------------------------------

def _backward(out: GradValue, seed):
    """Send ``seed`` back from ``out`` through the graph; return each node's cotangent."""
    order, seen = [], set()
    stack = [(out, False)]
    while stack:                                # iterative depth-first topological sort
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        stack.extend((p, False) for p in node.parents)
    cts = {id(out): seed}
    with backward_pass():
        for node in reversed(order):            # each value before the values it came from
            ct = cts.get(id(node))
            if ct is None or not node.parents:  # unreached, or an input: keep its cotangent
                continue
            del cts[id(node)]
            for parent, c in zip(node.parents, node.vjp(ct)):
                if c is not None:
                    before = cts.get(id(parent))
                    cts[id(parent)] = c if before is None else before + c
    return cts


def _uses_jax(args, kwargs) -> bool:
    return snp.uses_jax(args) or snp.uses_jax(kwargs)


def _check_argnums(argnums, nargs):
    many = isinstance(argnums, (tuple, list))
    nums = tuple(argnums) if many else (argnums,)
    for a in nums:
        if not isinstance(a, int) or not -nargs <= a < nargs:
            raise TypeError(f"argnums={argnums!r} does not fit a call with {nargs} positional "
                            f"argument(s): each must be an int in [{-nargs}, {nargs}).")
    return many, tuple(a % nargs for a in nums)


def _value_and_grad_impl(fun, argnums, has_aux, args, kwargs):
    many, nums = _check_argnums(argnums, len(args))
    rec, own = _program_recorder(args, nums)
    if rec is not None and own:
        with prog.recorder_active(rec):
            return _value_and_grad_program(rec, fun, many, nums, has_aux, args, kwargs)
    if rec is not None:
        return _value_and_grad_program(rec, fun, many, nums, has_aux, args, kwargs)
    level = next(_levels)
    args = list(args)
    wrapped = []
    for a in nums:
        leaves, treedef = tree.flatten(args[a])
        tracers = []
        for leaf in leaves:
            if type(leaf) is GradValue:
                raise NotDifferentiableError(
                    "simpmd.grad was called on a value another simpmd.grad is already "
                    "differentiating: simpmd.grad does not nest. Use jax.grad for higher "
                    "derivatives.")
            value = leaf if isinstance(leaf, DeviceValue) else np.asarray(leaf)
            _check_input(value, a)
            if not isinstance(value, DeviceValue) and type(leaf) in (float, int):
                value = value.astype(np.float32)              # JAX's default float
            tracers.append(GradValue(value, vma=_vma(leaf), level=level))
        wrapped.append((tracers, treedef))
        args[a] = tree.unflatten(treedef, tracers)
    out, aux = _split_aux(fun(*args, **kwargs), has_aux)
    value = _primal(out)
    if _shape(value) != ():
        raise TypeError(f"Gradient only defined for scalar-output functions. Output had "
                        f"shape: {_shape(value)}.")
    cts = {}
    if type(out) is GradValue:
        cts = _backward(out, snp.ones_like(value))
    grads = []
    for tracers, treedef in wrapped:
        leaves = [cts.get(id(t)) for t in tracers]
        leaves = [snp.zeros_like(t.primal) if c is None else c for t, c in zip(tracers, leaves)]
        leaves = [c.astype(t.dtype) if c.dtype != t.dtype else c for t, c in zip(tracers, leaves)]
        grads.append(tree.unflatten(treedef, leaves))
    grads = tuple(grads) if many else grads[0]
    aux_leaves, aux_tree = tree.flatten(aux)        # aux carries no gradient, as in JAX
    aux = tree.unflatten(aux_tree, [_primal(v) for v in aux_leaves])
    return value, aux, grads


def value_and_grad(fun, argnums=0, has_aux=False):
    """Like ``jax.value_and_grad``: a function returning ``(value, gradient)``
    (``((value, aux), gradient)`` with ``has_aux``), on simpmd's devices or in plain NumPy.
    Inside a real JAX trace it is ``jax.value_and_grad`` itself."""
    def value_and_grad_fun(*args, **kwargs):
        if _uses_jax(args, kwargs):
            import jax
            return jax.value_and_grad(fun, argnums, has_aux)(*args, **kwargs)
        value, aux, grads = _value_and_grad_impl(fun, argnums, has_aux, args, kwargs)
        return ((value, aux), grads) if has_aux else (value, grads)
    value_and_grad_fun.__name__ = f"value_and_grad({getattr(fun, '__name__', 'fun')})"
    return value_and_grad_fun


def grad(fun, argnums=0, has_aux=False):
    """Like ``jax.grad``: the gradient of a scalar function, through collectives too.

    ``argnums`` picks the differentiated argument(s) (an int or a tuple); ``has_aux``
    means ``fun`` returns ``(loss, aux)`` and the result is ``(gradient, aux)``. Inside a
    real JAX trace it is ``jax.grad`` itself, so one body runs on both engines.
    """
    def grad_fun(*args, **kwargs):
        if _uses_jax(args, kwargs):
            import jax
            return jax.grad(fun, argnums, has_aux)(*args, **kwargs)
        _, aux, grads = _value_and_grad_impl(fun, argnums, has_aux, args, kwargs)
        return (grads, aux) if has_aux else grads
    grad_fun.__name__ = f"grad({getattr(fun, '__name__', 'fun')})"
    return grad_fun
