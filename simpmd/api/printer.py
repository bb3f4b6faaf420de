"""A program printed as ``jax.make_jaxpr`` prints a jaxpr: the text a learner compares with
JAX's, equation by equation. The core's :class:`~simpmd.core.core.Program` prints through
:func:`pretty`, registered in ``simpmd.core.bridge``.
"""
from __future__ import annotations

import itertools
import sys

import numpy as np

from ..core import bridge, dtypes
from ..core import collectives as K
from ..core import primitives as P
from ..core.core import Aval, Program, Var
from . import shard_map_eqn


class NewestForms:
    """How the newest JAX prints where releases differ (when no JAX is running)."""

    scan_form = staticmethod(lambda: "ft")
    hoists_long_bodies = staticmethod(lambda: True)
    masks_addresses = staticmethod(lambda: True)
    normalizes_slice_starts = staticmethod(lambda: True)
    shows_default_params = staticmethod(lambda: False)
    drops_unused = staticmethod(lambda: "top")
    guards_zero_divisor = staticmethod(lambda: True)
    policy_text = staticmethod(lambda made: None)
    shard_map_text = staticmethod(lambda: ("newly_manual_axes", False))


# The printer's own tables, keyed by row (the rows themselves are the core's or their
# layer's): a row whose parameters the running JAX prints otherwise than its ``show``
# (SHOWN: params -> what is printed), and one JAX spells as several equations (PRINTED).
SHOWN: dict = {}
PRINTED: dict = {}


def forms():
    """The printed forms of the running JAX (``simpmd.jax.printing``, which prints tiny
    programs on it), or the newest ones when JAX is not imported."""
    if "jax" in sys.modules and bridge.jax is not None:
        return bridge.jax.printing
    return NewestForms


def _names():
    """a, b, ..., z, ba, bb, ...: JAX's variable names."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    for n in itertools.count(1):
        for combo in itertools.product(letters, repeat=n):
            if n == 1 or combo[0] != "a":
                yield "".join(combo)


def _param_text(value, indent, nested, width=80) -> str:
    if isinstance(value, Program):          # a nested program, indented under its line
        return nested(value, indent)
    if isinstance(value, tuple) and value and all(isinstance(v, Program) for v in value):
        items = [nested(v, indent + 2, "") for v in value]      # each on its own line
        if all("\n" not in t for t in items) and indent + 2 + sum(len(t) + 1 for t in items) <= width:
            return "(" + " ".join(items) + ")"
        pad = " " * indent
        return "(\n" + "\n".join(pad + "  " + t for t in items) + "\n" + pad + ")"
    if isinstance(value, tuple) and value and all(isinstance(v, tuple) for v in value):
        return "(" + ", ".join(_param_text(v, indent, nested, width) for v in value) + ")"
    if isinstance(value, np.dtype):
        return value.name
    if isinstance(value, str):
        return value
    if isinstance(value, type) and issubclass(value, np.generic):
        return np.dtype(value).name
    return repr(value)


def _literal(v, like, weak=False) -> str:
    """A constant operand: a weak Python number in the dtype it meets (``like``)."""
    value = np.asarray(v.value)
    if value.ndim == 0:
        dtype = like if v.aval.weak_type and like is not None and \
            like.kind == v.aval.dtype.kind else v.aval.dtype
        scalar = value.astype(dtype)[()]
        # JAX prints a float as the Python float its dtype holds (0.05 in float32 is
        # 0.05000000074505806), or, met by another weak value, as the Python number it
        # still is (0.01); integers and booleans as they are.
        floating = np.dtype(dtype).kind == "f" or dtype.name in (
            "bfloat16", "float8_e4m3fn", "float8_e5m2")
        text = (repr(float(value)) if floating and weak and v.aval.weak_type
                else repr(float(scalar)) if floating else str(scalar))
        return f"{text}:{dtypes.short_name(dtype)}[]"
    return f"<{v.aval.str_short()} constant>"


def _literal_dtype(eqn):
    """The dtype a weak literal operand of ``eqn`` is printed in: its first variable's (or
    result's); none for an equation that holds a body, whose operands keep their own."""
    if eqn.primitive.needs_run:
        return None
    like = next((v.aval.dtype for v in eqn.invars if type(v) is Var), None)
    return like if like is not None else (eqn.outvars[0].aval.dtype if eqn.outvars else None)


def _meets_weak(eqn) -> bool:
    """Whether a literal of ``eqn`` meets a weak value (its first variable operand is
    weak): JAX then keeps the literal the Python number it was."""
    var = next((v for v in eqn.invars if type(v) is Var), None)
    return var is not None and var.aval.weak_type and not eqn.primitive.needs_run


def _same_names(eqn, names, name):
    """A jit equation's body reuses the names of the operands and results it stands for, as
    JAX's printer suggests them (``JaxprPpContext.suggest_same_var_names``): each outer
    variable once, and only for a body variable not named yet."""
    body = eqn.params["jaxpr"]
    for inner, outer in ((body.invars, eqn.invars), (body.outvars, eqn.outvars)):
        used = set()
        for i, o in zip(inner, outer) if len(inner) == len(outer) else ():
            if type(i) is Var and type(o) is Var and i not in names and o not in used:
                used.add(o)
                names[i] = name(o)


def _shared(program, hoists_long) -> dict:
    """The nested programs JAX prints once, before the program, as ``let name = {...} in``
    (``core.pp_toplevel_jaxpr``): those used more than once, and from jax 0.10.2 on those
    of more than 10 equations where the running JAX does so. Named by the equation's ``name`` (``<lambda>`` as
    ``lambda``), else ``jaxpr``, numbered when a name repeats."""
    counts, labels, todo = {}, {}, [program]
    while todo:
        prog = todo.pop(0)
        counts[prog] = counts.get(prog, 0) + 1 + (
            prog is not program and len(prog.eqns) > 10 and hoists_long)
        for eqn in prog.eqns:
            shown = [v for k, v in eqn.params.items() if not k.startswith("_")]
            inner = [v for v in shown if isinstance(v, Program)]
            inner += [p for v in shown if isinstance(v, tuple) for p in v if isinstance(p, Program)]
            todo += inner
            if isinstance(eqn.params.get("name"), str):
                for p in inner:
                    labels.setdefault(p, eqn.params["name"].strip("<>"))
    shared, seen = {}, {}
    for prog, n in counts.items():
        if n > 1:
            label = labels.get(prog, "jaxpr")
            k = seen.get(label, 0)
            seen[label] = k + 1
            shared[prog] = label + (str(k) if k else "")
            seen[shared[prog]] = seen.get(shared[prog], 0) + (1 if k else 0)
    return shared


def pretty(program, width=80) -> str:
    """The program as ``jax.make_jaxpr`` prints a jaxpr: variables named in order of
    appearance, nested programs included (on one line where they fit, or printed first
    when shared), and an equation's result that nothing reads shown as ``_``."""
    names, shared = {None: _names()}, _shared(program, forms().hoists_long_bodies())
    out = [_skeleton(p, width, names, shared, f"let {label} = ", " in")
           for p, label in shared.items()]
    return "\n".join(out + [_skeleton(program, width, names, shared, top=True)])


def _skeleton(program, width, names, shared, before="", after="", top=False) -> str:
    """``{ lambda consts; ins. let eqns in outs }``: on one line if it fits, else one
    equation a line."""
    rows = _rows(program, width, names, shared, top)
    flat = _flat(rows, program)
    if flat is not None and len(before + flat + after) <= width:
        return before + flat + after
    return before + "\n".join(rows) + after


def _flat(rows, program):
    """The printed program on one line (equations joined by '; '), or None when one of its
    equations already took several."""
    if len(rows) != len(program.eqns) + 2:
        return None
    return f"{rows[0]} {'; '.join(r.strip() for r in rows[1:-1])} {rows[-1].strip()}"


def _rows(program, width, names, shared, top=False) -> list:
    def name(v):
        if v not in names:
            names[v] = next(names[None])
        return names[v]

    def typed(v):
        return f"{name(v)}:{v.aval.str_short()}"

    def operand(v, like, weak=False):
        return name(v) if type(v) is Var else _literal(v, like, weak)

    def nested(inner, indent, key=""):
        if inner in shared:
            return shared[inner]
        rows = _rows(inner, width - indent, names, shared)
        flat = _flat(rows, inner)
        if flat is not None and indent + len(key) + len(flat) <= width:
            return flat
        return ("\n" + " " * indent).join(rows)

    def line(outs, prim_name, params, ins, indent=4):
        pad, head = " " * indent, f"{outs} = " if outs else ""
        pairs = params if isinstance(params, list) else sorted(params.items())   # (or in order)
        shown = " ".join(f"{k}={_param_text(v, indent + 4, nested, width)}" for k, v in pairs)
        one = f"{pad}{head}{prim_name}{f'[{shown}]' if shown else ''} {ins}"   # (no operands:
        # a trailing space, as JAX prints one)
        # (as JAX's printer: the line must fit up to the closing bracket, not the operands)
        if (len(one) - len(ins) - 1 <= width and "\n" not in one) or not shown:
            return [one]
        return ([f"{pad}{head}{prim_name}["]
                + [f"{pad}  {k}=" + _param_text(
                    v, indent + 2, lambda p, i, key=k + "=": nested(p, i, key), width)
                   for k, v in pairs]
                + [f"{pad}] {ins}"])

    read = {v for e in program.eqns for v in e.invars} | set(program.outvars)
    mode = forms().drops_unused()                # which programs print the unused as '_'
    if not (mode == "all" or mode == "top" and top):
        read |= {v for e in program.eqns for v in e.outvars}

    def result(v):
        return typed(v) if v in read else f"_:{v.aval.str_short()}"

    consts = " ".join(typed(v) for v in program.constvars)
    lines = [f"{{ lambda {consts}; {' '.join(typed(v) for v in program.invars)}. let"]
    for eqn in program.eqns:
        ins = " ".join(operand(v, _literal_dtype(eqn), _meets_weak(eqn)) for v in eqn.invars)
        printed = PRINTED.get(eqn.primitive)
        if printed is not None:       # a row that JAX spells as several equations (pmean)
            for prim_name, params, text_ins, out_vars in printed(eqn, name, typed, ins):
                lines += line(out_vars, prim_name, params, text_ins)
            continue
        if eqn.primitive.same_names and eqn.params["jaxpr"] not in shared:
            _same_names(eqn, names, name)
        outs = " ".join(result(v) for v in eqn.outvars)
        lines += line(outs, eqn.primitive.name, SHOWN.get(eqn.primitive, eqn.primitive.show)(eqn.params), ins)
    outs = ", ".join(name(v) if type(v) is Var else operand(v, None) for v in program.outvars)
    lines.append(f"  in ({outs}{',' if len(program.outvars) == 1 else ''}) }}")
    return "\n".join(lines).split("\n")         # one row per printed line


# -- rows JAX prints as other equations, or with other parameters: the tables above ---------


def _psum_name(eqn):
    """JAX names the psum of a vma-typed value (shard_map with check_vma) psum_invariant."""
    return "psum_invariant" if any(getattr(v.aval, "vma", ()) for v in eqn.invars) else "psum"


def _psum_params(eqn, prim_name) -> dict:
    """A psum's parameters as the running JAX prints them: ``psum_invariant`` leaves out
    ``axis_index_groups`` after jax 0.7."""
    params = {k: v for k, v in eqn.params.items() if not k.startswith("_")}
    if prim_name == "psum_invariant" and not forms().shard_map_text()[1]:
        params.pop("axis_index_groups", None)
    return params


def _psum_printed(eqn, name, typed, ins):
    prim_name = _psum_name(eqn)
    return [(prim_name, _psum_params(eqn, prim_name), ins,
             " ".join(typed(v) for v in eqn.outvars))]


def _pmean_printed(eqn, name, typed, ins):
    """JAX has no pmean primitive: it sums (psum), then divides by the group's size."""
    sums = [Var(v.aval) for v in eqn.outvars]
    prim_name = _psum_name(eqn)
    lines = [(prim_name, _psum_params(eqn, prim_name), ins, " ".join(typed(v) for v in sums))]
    for total, out in zip(sums, eqn.outvars):
        divisor = f"{out.aval.dtype.type(eqn.params['_size'])}:{out.aval.str_short().split('[')[0]}[]"
        if out.aval.vma:                  # the divisor is made to vary as the sum does
            varying = Var(Aval((), out.aval.dtype, vma=out.aval.vma))
            lines.append(("pvary", {"axes": tuple(sorted(out.aval.vma))}, divisor, typed(varying)))
            divisor = name(varying)
        lines.append(("div", {}, f"{name(total)} {divisor}", typed(out)))
    return lines


PRINTED[K.psum], PRINTED[K.pmean] = _psum_printed, _pmean_printed


def _broadcast_shown(params, short=P.broadcast_in_dim.show):
    """broadcast_in_dim's parameters: all of them where the running JAX prints its
    defaults too (``shape``, ``sharding=None``), else only those JAX shows."""
    return params if forms().shows_default_params() else short(params)


SHOWN[P.broadcast_in_dim] = _broadcast_shown


def _shard_map_shown(p) -> list:
    """A shard_map's parameters as the running JAX prints them, in its (alphabetical)
    order: the axes it makes manual (not those of an enclosing shard_map) as a frozenset,
    named ``newly_manual_axes`` (``manual_axes`` up to jax 0.7)."""
    newly = [a for a in p["manual_axes"] if a not in p.get("_outer_axes", ())]
    manual = "frozenset({" + ", ".join(repr(a) for a in newly) + "})"
    shown = [("check_vma", p["check_vma"]), ("in_specs", p["in_specs"]), ("jaxpr", p["jaxpr"]),
             ("mesh", p["shard_mesh"]), ("out_specs", p["out_specs"]),
             (forms().shard_map_text()[0], manual)]
    return sorted(shown, key=lambda item: item[0])


SHOWN[shard_map_eqn.shard_map_p] = _shard_map_shown
bridge.printer = pretty
