"""A program printed as ``jax.make_jaxpr`` prints a jaxpr: the text a learner compares with
JAX's, equation by equation. The core's :class:`~simpmd.core.core.Program` prints through
:func:`pretty`, registered in ``simpmd.core.bridge``.
"""
from __future__ import annotations

import itertools

import numpy as np

from ..core import bridge, dtypes
from ..core.core import Program, Var


def _names():
    """a, b, ..., z, ba, bb, ...: JAX's variable names."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(1):
        for combo in itertools.product(letters, repeat=n):
            if n == 1 or combo[0] != "a":
                yield "".join(combo)


def _param_text(value, indent, nested) -> str:
    if isinstance(value, Program):          # a nested program, indented under its line
        return nested(value, indent)
    if isinstance(value, tuple) and value and all(isinstance(v, Program) for v in value):
        return "(\n" + ",\n".join(" " * indent + nested(v, indent) for v in value) + "\n)"
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return "(" + ", ".join(_param_text(v, indent, nested) for v in value) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, str):
        return value
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return repr(value)


def _literal(v, like) -> str:
    """A constant operand: a weak Python number in the dtype it meets (``like``)."""
    value = np.asarray(v.value)
    if value.ndim == 0:
        dtype = like if v.aval.weak_type and like is not None and like.kind != "b" else v.aval.dtype
        return f"{value.astype(dtype)[()]}:{dtypes.short_name(dtype)}[]"
    return f"<{v.aval.str_short()} constant>"


def _literal_dtype(eqn):
    """The dtype a weak literal operand of ``eqn`` is printed in: its first variable's (or
    result's); none for an equation that holds a body, whose operands keep their own."""
    if getattr(eqn.primitive, "needs_run", False):
        return None
    like = next((v.aval.dtype for v in eqn.invars if type(v) is Var), None)
    return like if like is not None else (eqn.outvars[0].aval.dtype if eqn.outvars else None)


def pretty(program, width=80, names=None) -> str:
    """The program as ``jax.make_jaxpr`` prints a jaxpr: variables named in order of
    appearance, nested programs included (on one line where it fits), and an equation's
    result that nothing reads shown as ``_``."""
    names = names if names is not None else {None: _names()}

    def name(v):
        if v not in names:
            names[v] = next(names[None])
        return names[v]

    def typed(v):
        return f"{name(v)}:{v.aval.str_short()}"

    def operand(v, like):
        return name(v) if type(v) is Var else _literal(v, like)

    def nested(inner, indent, key=""):
        rows = pretty(inner, width - indent, names).split("\n")
        flat = f"{rows[0]} {'; '.join(r.strip() for r in rows[1:-1])} {rows[-1].strip()}"
        if indent + len(key) + len(flat) <= width and len(rows) == len(inner.eqns) + 2:
            return flat
        return ("\n" + " " * indent).join(rows)

    def line(outs, prim_name, params, ins, indent=4):
        pad, head = " " * indent, f"{outs} = " if outs else ""
        pairs = params if isinstance(params, list) else sorted(params.items())   # (or in order)
        shown = " ".join(f"{k}={_param_text(v, indent + 4, nested)}" for k, v in pairs)
        one = f"{pad}{head}{prim_name}{f'[{shown}]' if shown else ''} {ins}".rstrip()
        if (len(one) <= width and "\n" not in one) or not shown:
            return [one]
        return ([f"{pad}{head}{prim_name}["]
                + [f"{pad}  {k}=" + _param_text(v, indent + 2, lambda p, i: nested(p, i, k + "="))
                   for k, v in pairs]
                + [f"{pad}] {ins}".rstrip()])

    read = {v for e in program.eqns for v in e.invars} | set(program.outvars)

    def result(v):
        return typed(v) if v in read else f"_:{v.aval.str_short()}"

    consts = " ".join(typed(v) for v in program.constvars)
    lines = [f"{{ lambda {consts}; {' '.join(typed(v) for v in program.invars)}. let"]
    for eqn in program.eqns:
        ins = " ".join(operand(v, _literal_dtype(eqn)) for v in eqn.invars)
        printed = getattr(eqn.primitive, "printed", None)
        if printed is not None:       # a row that JAX spells as several equations (pmean)
            for prim_name, params, text_ins, out_vars in printed(eqn, name, typed, ins):
                lines += line(out_vars, prim_name, params, text_ins)
            continue
        outs = " ".join(result(v) for v in eqn.outvars)
        lines += line(outs, eqn.primitive.name, eqn.primitive.show(eqn.params), ins)
    outs = ", ".join(name(v) if type(v) is Var else operand(v, None) for v in program.outvars)
    lines.append(f"  in ({outs}{',' if len(program.outvars) == 1 else ''}) }}")
    return "\n".join(lines)


bridge.printer = pretty
