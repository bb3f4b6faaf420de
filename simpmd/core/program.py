"""Tracing a body into a program, running a program, caching one per signature, printing one.

JAX does not run a mapped body's Python on every call. On the first call for a
*signature* (the function, its static arguments, the axes, each argument's shape and
dtype) it traces the body on types alone into a jaxpr, and caches it; later calls run
the cached program. A ``print`` or a ``list.append`` in the body happens once per
signature, and a body whose Python state changes keeps computing what was traced.

simpmd does the same. :func:`trace` runs the body on values that carry only their type,
with a :class:`Recorder` on this thread writing down every ``bind`` as an equation.
:func:`eval_program` runs a program by binding each equation's primitive again, on
whatever run is current: every device's values at once, one device's, or types only.
"""
from __future__ import annotations

import weakref

from . import errors
from .core import Equation, Lit, Program, Var, aval_of, bind, caller_source, context, running
from .values import StackedValue

class Recorder:
    """Writes down the operations bound on this thread, while a body is traced.

    A value the body reads from an enclosing traced body without being passed it (a
    closure) becomes an extra input of the program (``lifted``: a constvar, as JAX's
    closure conversion makes it), so a replay uses the value of that call.
    """

    def __init__(self):
        self.vars: dict = {}          # id(value) -> (Var, value): the value kept alive
        self.values: dict = {}        # Var -> value, for simpmd.grad
        self.eqns: list = []
        self.lifted: list = []        # (Var, the enclosing body's value), in order

    def input(self, value) -> Var:
        var = Var(value.aval)
        self.vars[id(value)] = (var, value)
        self.values[var] = value
        return var

    def var_of(self, x):
        """The variable of operand ``x``, or a literal for a constant."""
        if not isinstance(x, StackedValue):
            return Lit(x)
        found = self.vars.get(id(x))
        if found is not None and found[1] is x:
            return found[0]
        for outer in context.recorders:
            if outer is not self and outer.vars.get(id(x), (None, None))[1] is x:
                var = self.input(x)
                self.lifted.append((var, x))
                return var
        if x.stack is not None and x.stack.shape[0] == 1:     # a concrete value: a constant
            return Lit(x.stack[0])
        if x.stack is not None:           # every device's own concrete value: an input
            var = self.input(x)
            self.lifted.append((var, x))
            return var
        raise errors.UnexpectedTracerError(
            f"a traced value {x!r} was used outside the body it belongs to (it leaked out "
            f"of an earlier trace, e.g. through a global or a list). Real JAX raises "
            f"UnexpectedTracerError. Pass values in as arguments and out as results.")

    def record(self, prim, params, args, outs):
        invars = [self.var_of(x) for x in args]
        outvars = []
        for out in outs:
            var = Var(out.aval)
            self.vars[id(out)] = (var, out)
            self.values[var] = out
            outvars.append(var)
        self.eqns.append(Equation(prim, params, invars, outvars, caller_source(), context.phase))

class recording:
    """``with recording(rec):`` writes the operations bound inside it into ``rec``."""

    def __init__(self, rec):
        self.rec = rec

    def __enter__(self):
        context.recorders.append(self.rec)
        return self.rec

    def __exit__(self, *exc):
        context.recorders.pop()

def trace(flat_fun, in_avals, run):
    """Trace ``flat_fun`` (a function of a list of leaves, returning a list of leaves) on
    values of types ``in_avals``, on ``run`` (abstract). Returns the program and the
    enclosing bodies' values it closed over (to pass as its constvars)."""
    rec = Recorder()
    inputs = [StackedValue(a) for a in in_avals]
    invars = [rec.input(x) for x in inputs]
    eqn, context.eqn = context.eqn, None          # the learner's lines, not a replay's
    try:
        with recording(rec), running(run):
            outs = flat_fun(*inputs)
            outvars = [rec.var_of(x) for x in outs]
    except Exception as exc:             # what was traced before it failed goes with it
        if getattr(exc, "partial_program", None) is None:
            exc.partial_program = Program(invars, rec.eqns, [])
        raise
    finally:
        context.eqn = eqn
    program = Program(invars, rec.eqns, outvars, constvars=[v for v, _ in rec.lifted],
                      axis_env=tuple((n, s) for n, s in run.axes if n is not None))
    return program, [x for _, x in rec.lifted]

def eval_program(program, consts, args, env=None):
    """Run ``program`` on the run of this thread: bind each equation again. ``env``, if
    given, receives every variable's value (simpmd.grad reads the forward values)."""
    env = {} if env is None else env
    env.update(zip(program.constvars, consts))
    env.update(zip(program.invars, args))
    outer, phase = context.eqn, context.phase
    try:
        run = context.run
        known = run is not None and not run.abstract and not context.recorders
        for eqn in program.eqns:
            context.eqn, context.phase = eqn, phase if eqn.phase == "forward" else eqn.phase
            ins = [env[v] if type(v) is Var else v.value for v in eqn.invars]
            if known:       # values only: the types are the equation's, found when traced
                outs = run.compute(eqn.primitive, ins, eqn.params, [aval_of(x) for x in ins],
                                   [v.aval for v in eqn.outvars])
            else:
                outs = bind(eqn.primitive, *ins, **eqn.params)
                outs = outs if eqn.primitive.multiple_results else (outs,)
            env.update(zip(eqn.outvars, outs))
    finally:
        context.eqn, context.phase = outer, phase
    return [env[v] if type(v) is Var else v.value for v in program.outvars]

def call(program, consts, args, run):
    """Run ``program`` on ``run`` (making it this thread's run while it computes)."""
    with running(run):
        return eval_program(program, consts, args)

# -- the cache: one program per function and signature ----------------------------------------

_cache: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

def cached(fun, key):
    """The program traced for ``fun`` with signature ``key``, or None."""
    try:
        return _cache.get(fun, {}).get(key)
    except TypeError:                  # fun cannot be weakly referenced, or key not hashable
        return None

def store(fun, key, entry):
    try:
        _cache.setdefault(fun, {})[key] = entry
    except TypeError:
        pass
