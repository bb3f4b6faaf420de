"""The program a mapped body traces to: equations, recorded once per signature, replayed.

JAX does not run a ``pmap``-ed body's Python on every call. On the first call for a
*signature* (the function, its static arguments, ``in_axes``/``out_axes``, and each
argument's shape and dtype) it traces the body into a jaxpr, a list of equations, and
caches it; later calls with the same signature run the cached program. A ``print`` or a
``list.append`` in the body therefore happens once per signature, and a body whose Python
state changes keeps computing what was traced.

simpmd does the same. The first call runs the body over values stacked by device
(``batching.py``) and, while it computes, a :class:`Recorder` writes down every operation
on a stacked value as an :class:`Equation`: the primitive (JAX's name where JAX has one),
its inputs (variables, or constants that the body closed over), its parameters, its
outputs with their shapes and dtypes, and the source line that made it. The equations are
a :class:`Program`; a later call with the same signature interprets it, one equation at a
time over the new stacked values, and runs none of the body's Python. Collectives are
equations too, so the log of a cached call still shows each of them, and
:func:`make_jaxpr` prints the program in JAX's notation.

A body that cannot be replayed faithfully (a stacked value is computed outside the
recorded operations) is marked so, with the reason, and is traced again on every call:
its results are always right. A nested pmap's body that reads the outer body's values is
not such a body: those values are lifted into inputs of its program (``constvars``).
"""
from __future__ import annotations

import functools
import itertools
import weakref

import numpy as np

from . import errors, tree
from .trace import backward_pass, current_phase


# -- variables, equations, programs ------------------------------------------------------------


class Var:
    """A value of the program: one device's shape and dtype (every device has the same)."""

    __slots__ = ("shape", "dtype", "count")
    _counter = itertools.count()

    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)
        self.count = next(Var._counter)

    @property
    def aval(self):           # JAX's name for a variable's abstract value
        return self

    def __repr__(self):
        return f"Var({type_text(self.shape, self.dtype)})"


class Primitive(str):
    """A primitive's name; ``.name`` as on JAX's primitives, so code reads both alike."""

    @property
    def name(self):
        return str(self)


class Equation:
    """``outputs = primitive[params](inputs)``, and how to compute it over stacked values.

    ``args``/``kwargs`` are the call that computed it, with each stacked input replaced by
    its :class:`Var`; ``fn`` is the function that was called. ``invars``/``outvars`` list
    the variables in order, as a jaxpr's equations do. ``data_constants`` says whether the
    call's scalar constants are data (``x * 2``, printed as literals) or settings
    (``x.reshape(3, 1)``, printed as parameters). ``phase`` is ``"backward"`` for an
    equation of a gradient's backward pass (a replay logs its collectives as backward).
    """

    __slots__ = ("primitive", "params", "fn", "args", "kwargs", "invars", "outvars",
                 "data_constants", "source", "code", "phase")

    def __init__(self, primitive, params, fn, args, kwargs, invars, outvars, data_constants,
                 source, code, phase="forward"):
        self.primitive, self.params, self.fn = Primitive(primitive), params, fn
        self.args, self.kwargs = args, kwargs
        self.invars, self.outvars, self.data_constants = invars, outvars, data_constants
        self.source, self.code, self.phase = source, code, phase

    def __repr__(self):
        return f"<Equation {self.primitive} at {self.source}>"


class Program:
    """A traced body: its inputs, its equations in order, and its outputs."""

    def __init__(self, invars, in_tree, eqns, outs, out_tree):
        self.invars, self.in_tree = invars, in_tree
        self.eqns, self.outs, self.out_tree = eqns, outs, out_tree
        # A nested pmap's body: the outer body's values it reads without being passed them,
        # lifted into inputs of their own (closure conversion), given to run() as ``closed``.
        self.constvars: list = []
        self.broken = None           # why it must be traced again on every call, if it must
        self.axis_env = ()           # the mapped axes it was traced over: ((name, size), ...)
        self.vma, self.why = {}, {}  # shard_map(check_vma=True): each value's type, and why

    @property
    def outvars(self):
        return [v for v in self.outs if type(v) is Var]

    # What code written for JAX's ClosedJaxpr reads.
    jaxpr = property(lambda self: self)
    consts = property(lambda self: [])
    in_avals = property(lambda self: [v for v in self.invars if v is not None])
    out_avals = property(lambda self: self.outvars)

    def run(self, inputs, closed=()):
        """Interpret the program over ``inputs`` (the body's argument leaves, stacked values
        where the body got stacked values) and ``closed`` (the values of its constvars);
        returns the body's result tree."""
        env = dict(zip(self.constvars, closed))
        for var, x in zip(self.invars, inputs):
            if var is not None:
                env[var] = x
        for eqn in self.eqns:
            args, kwargs = _substitute((eqn.args, eqn.kwargs), env)
            with replaying(eqn):
                if eqn.phase == "backward":
                    with backward_pass():
                        out = eqn.fn(*args, **kwargs)
                else:
                    out = eqn.fn(*args, **kwargs)
            leaves = _stacked_leaves(out)
            for var, value in zip(eqn.outvars, leaves):
                env[var] = value
        return tree.unflatten(self.out_tree, [env[v] if type(v) is Var else v for v in self.outs])

    def __str__(self):
        return pretty(self)

    def __repr__(self):
        return pretty(self)

    def _repr_pretty_(self, p, cycle):       # IPython shows the jaxpr-like text
        p.text(pretty(self))


# -- recording ----------------------------------------------------------------------------------


class Recorder:
    """Writes down the operations on stacked values while a body runs for the first time."""

    def __init__(self, track_vma=False, outside_constants=False):
        # outside_constants: a stacked value computed before recording began is a constant
        # of the equations that use it (simpmd.grad's own recorder, in a body that is not
        # being traced into a program), rather than a reason the program cannot be replayed.
        self.outside_constants = outside_constants
        # lifts: a nested pmap's body, whose reads of the outer body's stacked values become
        # inputs of its own (``lifted``: (Var, value) in order) instead of breaking it.
        self.lifts, self.lifted = False, []
        self.vars: dict = {}           # id(stacked value) -> (Var, value): values kept alive
        self.values: dict = {}         # Var -> its value on this first call (for simpmd.grad)
        self.eqns: list = []
        self.busy = 0                  # > 0 while inside a recorded operation
        self.broken = None             # why the program cannot be replayed, if it cannot
        # shard_map(check_vma=True): the mesh axes each value varies over (its type), and
        # for each (variable, axis) the equation that made it vary over that axis.
        self.track_vma = track_vma
        self.vma: dict = {}
        self.why: dict = {}

    def input(self, value, varies=None):
        """A stacked argument of the body: a new input variable (varying over ``varies``)."""
        var = self._new_var(value)
        if self.track_vma:
            self.vma[var] = frozenset(varies or ())
        return var

    def _new_var(self, value):
        stack = value.value
        var = Var(stack.shape[1:], stack.dtype)
        self.vars[id(value)] = (var, value)
        self.values[var] = value
        return var

    def alias(self, value, like):
        """A stand-in for the stacked ``like`` (its variable's type): a new variable that
        :meth:`rename` later folds back into ``like``'s. simpmd.grad differentiates with
        respect to its argument, not to other uses of the same value in the body."""
        var = self._new_var(value)
        orig = self.vars[id(like)][0]
        if self.track_vma:
            self.vma[var] = self.vma.get(orig, frozenset())
            for axis in self.vma[var]:
                self.why[var, axis] = self.why.get((orig, axis))
        return var

    def rename(self, start, names):
        """Replace variables by others (``names``: Var -> Var) in the equations from
        ``start`` on, and in what later operations will look up."""
        def swap(v):
            return names.get(v, v)
        for eqn in self.eqns[start:]:
            eqn.invars = [swap(v) for v in eqn.invars]
            eqn.args, eqn.kwargs = _map_leaves((eqn.args, eqn.kwargs), lambda v: type(v) is Var, swap)
        for key, (var, value) in list(self.vars.items()):
            if var in names:
                self.vars[key] = (names[var], value)

    def break_(self, why):
        if self.broken is None:
            self.broken = why

    def record(self, primitive, params, fn, args, kwargs, out, data_constants=True):
        invars = []

        def to_var(x):
            found = self.vars.get(id(x))
            if (found is None or found[1] is not x) and self.lifts and _known_outside(x, self):
                var = self._new_var(x)
                self.lifted.append((var, x))
                found = (var, x)
            if found is None or found[1] is not x:
                if not self.outside_constants:
                    self.break_("a stacked value was computed outside the recorded operations")
                return x
            invars.append(found[0])
            return found[0]
        args, kwargs = _map_stacked((args, kwargs), to_var)
        leaves = _stacked_leaves(out)
        outvars = [self._new_var(v) for v in leaves]
        source, code = where_called()
        if primitive == "reshape" and outvars:
            params = dict(params, new_sizes=outvars[0].shape, dimensions=None)
        if primitive == "dot_general" and outvars:
            params = dict(params, preferred_element_type=outvars[0].dtype)
        if self.track_vma:
            self._types(primitive, params, invars, outvars, source, code)
        self.eqns.append(Equation(primitive, params, fn, args, kwargs, invars, outvars,
                                  data_constants, source, code, current_phase()))

    def _types(self, primitive, params, invars, outvars, source, code):
        """Each output's vma, by the primitive's rule (``VMA_RULES``), as JAX types it."""
        ins = [self.vma.get(v, frozenset()) for v in invars]
        rule = VMA_RULES.get(primitive)
        for k, out in enumerate(outvars):
            if rule is None:                          # elementwise and the rest: the union
                vma = frozenset().union(*ins)
                for axis in vma:
                    self.why[out, axis] = next(self.why.get((v, axis)) for v, i in
                                               zip(invars, ins) if axis in i)
                self.vma[out] = vma
                continue
            mine = ins[k] if k < len(ins) else frozenset()
            src = invars[k] if k < len(invars) else None
            vma, made = rule(params, mine, primitive)
            self.vma[out] = vma
            for axis in vma:
                self.why[out, axis] = ((primitive, source, code) if axis in made
                                       else self.why.get((src, axis)))

    def finish(self, invars, in_tree, result):
        """The program, given the body's result (its ``broken`` says if it cannot be replayed)."""
        leaves, out_tree = tree.flatten(result)
        outs = []
        for v in leaves:
            if is_stacked(v):
                found = self.vars.get(id(v))
                if found is None or found[1] is not v:
                    self.break_("a result was computed outside the recorded operations")
                    outs.append(v)
                else:
                    outs.append(found[0])
            else:
                outs.append(v)
        program = Program(invars, in_tree, self.eqns, outs, out_tree)
        program.constvars = [var for var, _ in self.lifted]
        program.closed_values = [value for _, value in self.lifted]    # the first call's
        program.vma, program.why, program.broken = self.vma, self.why, self.broken
        self.vars, self.values = {}, {}    # let go of the first call's values
        return program


_recorders: list = []


def recording():
    """The recorder that should write down an operation now, or None."""
    if _recorders:
        rec = _recorders[-1]
        if rec.broken is None and rec.busy == 0:
            return rec
    return None


class recorder_active:
    """``with recorder_active(rec):`` records the operations run inside it into ``rec``."""

    def __init__(self, rec):
        self.rec = rec

    def __enter__(self):
        _recorders.append(self.rec)
        return self.rec

    def __exit__(self, *exc):
        _recorders.pop()


def _known_outside(value, rec):
    """True if a recorder below ``rec`` (an enclosing body's) has ``value`` as a variable."""
    for other in _recorders:
        if other is rec:
            break
        found = other.vars.get(id(value))
        if found is not None and found[1] is value:
            return True
    return False


def break_recording(why):
    """Mark the program being recorded (if any) as one to trace again on every call."""
    for rec in _recorders:
        rec.break_(why)


def operation(describe, data_constants=True):
    """Decorate a function on stacked values so that calling it records an equation.

    ``describe(*args, **kwargs)`` gives ``(primitive, params)`` for the printout. Nested
    calls (an operation implemented with others) record only the outermost one. With
    ``data_constants`` the call's scalar constants are data (``x * 2``) and print as
    literals; otherwise they are settings (``x.reshape(3, 1)``) and print as parameters.
    """
    def decorate(fn):
        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            rec = recording()
            if rec is None:
                return fn(*args, **kwargs)
            rec.busy += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                rec.busy -= 1
            primitive, params = describe(*args, **kwargs)
            rec.record(primitive, params, fn, args, kwargs, out, data_constants)
            return out
        recorded.__wrapped__ = fn
        return recorded
    return decorate


def record(primitive, params, fn, args, out):
    """Record an equation computed by hand (collectives, axis_index, debug.print): ``fn(*args)``
    recomputes ``out`` on a later call, against whatever run is current then."""
    rec = recording()
    if rec is not None:
        rec.record(primitive, params, fn, args, {}, out)


def where_called():
    """(source, code) of the learner's line that is running; ``runtime`` installs the real
    one (``caller_source``), which walks the stack out of simpmd's own modules."""
    return "", ""


# Where a replayed equation came from: the log and errors name the learner's line.
_replaying: list = []


class replaying:
    def __init__(self, eqn):
        self.eqn = eqn

    def __enter__(self):
        _replaying.append(self.eqn)

    def __exit__(self, *exc):
        _replaying.pop()


def replay_source():
    """(source, code) of the equation being replayed, or None outside a replay."""
    if _replaying:
        eqn = _replaying[-1]
        return eqn.source, eqn.code
    return None


# -- walking call arguments -------------------------------------------------------------------


def is_stacked(x) -> bool:
    """True for a value stacked by device (``batching.StackedValue`` says so of itself)."""
    return getattr(type(x), "stacked_by_device", False)


def _map_leaves(x, is_leaf, f):
    """``x`` with every leaf ``is_leaf`` picks, inside lists, tuples and dicts, replaced by
    ``f(leaf)`` (the call arguments an equation keeps are such trees)."""
    if is_leaf(x):
        return f(x)
    if type(x) in (list, tuple):
        return type(x)(_map_leaves(i, is_leaf, f) for i in x)
    if isinstance(x, tuple) and hasattr(type(x), "_fields"):
        return type(x)(*(_map_leaves(i, is_leaf, f) for i in x))
    if type(x) is dict:
        return {k: _map_leaves(v, is_leaf, f) for k, v in x.items()}
    return x


def _map_stacked(x, f):
    """``x`` with every stacked value replaced by ``f(value)``."""
    return _map_leaves(x, is_stacked, f)


def _stacked_leaves(x) -> list:
    out = []
    _map_stacked(x, out.append)
    return out


def _substitute(x, env):
    """``x`` with each :class:`Var` replaced by its value in ``env``."""
    return _map_leaves(x, lambda v: type(v) is Var, env.__getitem__)


# JAX's primitive names for NumPy's ufuncs and functions (where JAX has the primitive).
UFUNC_PRIMITIVES = {
    "add": "add", "subtract": "sub", "multiply": "mul", "true_divide": "div", "divide": "div",
    "floor_divide": "floor_divide", "negative": "neg", "positive": "copy", "power": "pow",
    "float_power": "pow", "exp": "exp", "exp2": "exp2", "expm1": "expm1", "log": "log",
    "log1p": "log1p", "log2": "log2", "tanh": "tanh", "sin": "sin", "cos": "cos",
    "tan": "tan", "sinh": "sinh", "cosh": "cosh", "arctan": "atan", "arctan2": "atan2",
    "sqrt": "sqrt", "cbrt": "cbrt", "square": "square", "reciprocal": "div",
    "maximum": "max", "minimum": "min", "fmax": "max", "fmin": "min", "absolute": "abs",
    "fabs": "abs", "sign": "sign", "floor": "floor", "ceil": "ceil", "rint": "round",
    "remainder": "rem", "fmod": "rem", "mod": "rem", "greater": "gt", "greater_equal": "ge",
    "less": "lt", "less_equal": "le", "equal": "eq", "not_equal": "ne",
    "logical_and": "and", "logical_or": "or", "logical_xor": "xor", "logical_not": "not",
    "bitwise_and": "and", "bitwise_or": "or", "bitwise_xor": "xor", "invert": "not",
    "left_shift": "shift_left", "right_shift": "shift_right_arithmetic",
    "isnan": "ne", "conjugate": "conj", "matmul": "dot_general",
}
FUNCTION_PRIMITIVES = {
    "where": "select_n", "concatenate": "concatenate", "stack": "concatenate",
    "broadcast_to": "broadcast_in_dim", "zeros_like": "broadcast_in_dim",
    "ones_like": "broadcast_in_dim", "full_like": "broadcast_in_dim", "clip": "clamp",
    "dot": "dot_general", "einsum": "dot_general", "tensordot": "dot_general",
    "outer": "dot_general", "round": "round", "sort": "sort", "take": "gather",
    "take_along_axis": "gather", "expand_dims": "broadcast_in_dim", "tile": "broadcast_in_dim",
    "repeat": "gather", "roll": "concatenate", "flip": "rev", "pad": "pad",
    "split": "split", "array_split": "split", "triu": "select_n", "tril": "select_n",
}


# -- vma: the mesh axes a value varies over, as shard_map(check_vma=True) types it ------------
# Each rule takes (params, the input's vma, primitive) and gives (the output's vma, the axes
# this equation made it vary over). Primitives not listed (elementwise, reductions, shapes)
# give the union of their inputs'. Checked against jax.make_jaxpr of shard_map bodies
# (tests/test_vma.py).


def _axes_of(params):
    axes = params.get("axes", params.get("axis_name"))
    return tuple(axes) if isinstance(axes, (tuple, list)) else (axes,)


class VmaError(errors.SimpmdError, ValueError):
    """A collective's axes are partly varying and partly invariant for its input (JAX
    refuses psum there); raised while tracing."""


def _reducing(params, vma, primitive):
    axes = set(_axes_of(params))
    inside, outside = axes & vma, axes - vma
    if inside and outside:
        raise VmaError(
            f"{primitive} over {tuple(_axes_of(params))} of a value that varies over "
            f"{sorted(inside)} but not over {sorted(outside)}: under shard_map(check_vma=True) "
            f"JAX's psum, pmax and pmin need the value to vary over all of the axes they "
            f"reduce or over none of them (JAX: 'psum can only accept axis_name which "
            f"corresponds to one of varying ... or invarying state of the input'; seen on "
            f"jax 0.10.2 and 0.12.0.1, while 0.7.2 accepts it, making the value vary first). Reduce "
            f"over {tuple(sorted(inside))} only, or make the value vary over every axis first "
            f"(lax.pcast(x, {tuple(sorted(outside))}, to='varying') on JAX).")
    return vma - axes, frozenset()


def _spreading(params, vma, primitive):
    axes = frozenset(_axes_of(params))
    return vma | axes, axes            # its result varies over its axes, whatever the values


VMA_RULES = {
    "psum": _reducing, "pmean": _reducing, "pmax": _reducing, "pmin": _reducing,
    "all_gather": _spreading, "reduce_scatter": _spreading, "ppermute": _spreading,
    "pshuffle": _spreading, "all_to_all": _spreading, "pswapaxes": _spreading,
    "axis_index": lambda params, vma, p: (frozenset(_axes_of(params)),) * 2,
}


# -- the cache: one program per function and signature ----------------------------------------

_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
UNCACHEABLE = object()      # a signature whose body must be traced again on every call


def cached(fun, key):
    """The program traced for ``fun`` with signature ``key``, UNCACHEABLE, or None."""
    try:
        return _cache.get(fun, {}).get(key)
    except TypeError:                  # fun cannot be weakly referenced, or key not hashable
        return None


def store(fun, key, program):
    try:
        _cache.setdefault(fun, {})[key] = program
    except TypeError:
        pass


def clear_cache():
    """Forget every traced program (the next call of each function traces again)."""
    _cache.clear()


def canonical_dtype(dtype):
    """The dtype JAX gives an argument without x64: 64-bit numbers become 32-bit."""
    dtype = np.dtype(dtype)
    return {"f8": np.dtype("f4"), "i8": np.dtype("i4"), "u8": np.dtype("u4"),
            "c16": np.dtype("c8")}.get(dtype.str[1:], dtype)


# -- printing in JAX's notation ----------------------------------------------------------------

_SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16",
          "int32": "i32", "int64": "i64", "int16": "i16", "int8": "i8", "uint8": "u8",
          "uint32": "u32", "uint64": "u64", "bool": "bool", "complex64": "c64",
          "complex128": "c128"}


def type_text(shape, dtype) -> str:
    """``f32[8,3]``, as JAX writes a value's type."""
    name = _SHORT.get(np.dtype(dtype).name, np.dtype(dtype).name)
    return f"{name}[{','.join(str(s) for s in shape)}]"


def _names():
    """a, b, ..., z, ba, bb, ...: JAX's variable names."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(1):
        for combo in itertools.product(letters, repeat=n):
            word = "".join(combo)
            if n > 1 and word[0] == "a":
                continue
            yield word


def _param_text(value) -> str:
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return "(" + ", ".join(_param_text(v) for v in value) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, str):
        return value
    if isinstance(value, Program):      # a nested program (call_jaxpr), indented under its line
        return pretty(value).replace("\n", "\n        ")
    return repr(value)


def pretty(program, width=80) -> str:
    """The program as ``jax.make_jaxpr`` prints a jaxpr."""
    names, counter = {}, _names()

    def name(v):
        if v not in names:
            names[v] = next(counter)
        return names[v]

    vma = dict(getattr(program, "vma", None) or {})

    def typed(v):
        text = f"{name(v)}:{type_text(v.shape, v.dtype)}"
        axes = sorted(vma.get(v, ()))
        if axes:           # as jax 0.10+ prints a value's varying mesh axes
            text += "{V:" + (axes[0] if len(axes) == 1 else "(" + ",".join(axes) + ")") + "}"
        return text

    def operand(x, like=None):
        if type(x) is Var:
            return name(x)
        value = np.asarray(x)
        if value.ndim == 0:
            weak = isinstance(x, (int, float, complex)) and like is not None
            dtype = like if weak and not (like.kind == "b") else canonical_dtype(value.dtype)
            if weak and dtype.kind in "fc":
                value = value.astype(dtype)
            return f"{value.item()!r}:{type_text((), dtype)}"
        return f"<{type_text(value.shape, value.dtype)} constant>"

    def line(outs, primitive, params, ins):
        shown = " ".join(f"{k}={_param_text(v)}" for k, v in sorted(params.items())
                         if not k.startswith("_"))
        one_line = f"    {outs} = {primitive}{f'[{shown}]' if shown else ''} {ins}".rstrip()
        if len(one_line) <= width or not shown:
            return [one_line]
        return ([f"    {outs} = {primitive}["]
                + [f"      {k}={_param_text(v)}" for k, v in sorted(params.items())
                   if not k.startswith("_")]
                + [f"    ] {ins}".rstrip()])

    invars = [v for v in program.invars if v is not None]
    consts = " ".join(typed(v) for v in getattr(program, "constvars", ()))
    header = " ".join(typed(v) for v in invars)
    lines = [f"{{ lambda {consts}; {header}. let"]
    for eqn in program.eqns:
        like = (eqn.invars[0].dtype if eqn.invars else
                eqn.outvars[0].dtype if eqn.outvars else None)
        ins = " ".join(operand(v, like) for v in _operands(eqn))
        divisor = eqn.params.get("_divisor")
        if divisor is not None and len(eqn.outvars) == 1:
            # JAX has no pmean or mean primitive: it sums (psum, reduce_sum), then divides.
            v = eqn.outvars[0]
            total = Var(v.shape, v.dtype)
            total.count = -1
            vma[total] = vma.get(v, frozenset())       # the sum already has the result's type
            summed = typed(total)
            types = [typed(v)]
            lines += line(summed, "psum" if eqn.primitive == "pmean" else "reduce_sum",
                          eqn.params, ins)
            lines += line(types[0], "div", {}, f"{name(total)} {operand(float(divisor), v.dtype)}")
            continue
        outs = " ".join(typed(v) for v in eqn.outvars) or "_"
        lines += line(outs, eqn.primitive, eqn.params, ins)
    outs = ", ".join(name(v) if type(v) is Var else operand(v) for v in program.outs)
    lines.append(f"  in ({outs}{',' if len(program.outs) == 1 else ''}) }}")
    return "\n".join(lines)


def _operands(eqn):
    """The inputs an equation prints: its variables, and scalar constants in their place."""
    shown = []

    def visit(x):
        if type(x) is Var:
            shown.append(x)
        elif isinstance(x, (list, tuple)) and type(x) in (list, tuple):
            for i in x:
                visit(i)
        elif isinstance(x, (int, float, complex, np.generic)) and not isinstance(x, bool):
            shown.append(x)
        elif isinstance(x, np.ndarray):
            shown.append(x)
    if not eqn.data_constants or eqn.params.get("_settings"):   # constants are settings
        return list(eqn.invars)
    for a in eqn.args:
        visit(a)
    return shown
