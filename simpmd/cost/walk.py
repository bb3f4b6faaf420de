"""The walk over a program: equations as one device runs them, nested bodies included.

A program is a list of equations shaped like JAX's (``.primitive``, ``.params``,
``.invars``/``.outvars`` with ``.aval``): simpmd's own, or a jaxpr of real JAX. The
helpers here read either kind; :func:`_walk` visits every equation, a ``scan`` body once
per iteration and a ``jit``/``shard_map`` body as what each device runs.
"""
from __future__ import annotations

from dataclasses import replace
import math

import numpy as np

from ..core.core import PRIMITIVES, Aval, Primitive

# Primitives with no row in simpmd: what JAX's roofline counts for them. A name in
# NO_COST costs nothing (JAX registers them with its zero rule); a name in JAX_UNARY
# one FLOP per element and its input and output bytes (JAX's unary rule).
NO_COST = frozenset("""
    axis_index axis_size pvary pcast sharding_constraint device_put optimization_barrier
    debug_callback split dynamic_slice dynamic_update_slice expand_dims bitcast_convert_type
    reduce_precision stop_gradient copy_p mesh_cast reshard while
""".split())
JAX_UNARY = frozenset("erf erfc erf_inv lgamma digamma bessel_i0e bessel_i1e log2".split())
# a JAX primitive name -> the row of simpmd that computes the same thing
JAX_ROWS = {"psum_invariant": "psum", "psum2": "psum", "all_gather_invariant": "all_gather",
            "psum_scatter": "reduce_scatter", "copy_p": "copy"}
MATMULS = frozenset({"dot_general", "conv_general_dilated"})
NESTED = ("jaxpr", "call_jaxpr", "fun_jaxpr")   # where pjit/jit, shard_map, custom_* keep theirs


def _primitive_name(eqn) -> str:
    prim = eqn.primitive
    return prim if isinstance(prim, str) else prim.name


def _row(eqn, name):
    """The row that costs ``eqn``: its own primitive, or simpmd's row of that name."""
    if isinstance(eqn.primitive, Primitive):
        return eqn.primitive
    return PRIMITIVES.get(JAX_ROWS.get(name, name))


def _typed(var):
    """A variable's or literal's type as simpmd's :class:`Aval` (None when it has none
    that counts in bytes, e.g. a PRNG key or a token)."""
    a = getattr(var, "aval", None)
    if a is None and hasattr(var, "val"):             # a JAX literal
        a = np.asarray(var.val)
    if isinstance(a, Aval) or a is None:
        return a
    try:
        return Aval(getattr(a, "shape", ()), np.dtype(a.dtype))
    except TypeError:
        return None


def _size(aval) -> int:
    return int(math.prod(aval.shape))


def _nbytes(aval) -> int:
    return 0 if aval is None else aval.nbytes


def _equation_list(program) -> list:
    """The equations of a ClosedJaxpr, a Jaxpr, or a list of equations."""
    inner = getattr(program, "jaxpr", program)
    return list(getattr(inner, "eqns", inner))


def _axis_sizes(axis_env) -> dict:
    """``[("i", 8)]``, ``{"i": 8}`` or a mesh (simpmd or JAX) -> ``{"i": 8}``."""
    if axis_env is None:
        return {}
    if isinstance(axis_env, dict):
        return {str(k): int(v) for k, v in axis_env.items()}
    shape = getattr(axis_env, "shape", None)
    if isinstance(shape, dict) or hasattr(shape, "items"):
        return {str(k): int(v) for k, v in shape.items()}
    names = getattr(axis_env, "axis_names", None)
    if names is not None:
        return dict(zip(map(str, names), map(int, np.shape(axis_env.devices))))
    return {str(k): int(v) for k, v in axis_env}



def _is_var(v) -> bool:
    return not hasattr(v, "val") and not hasattr(v, "value")     # a literal carries its value


def _walk(eqns, sizes, hw, topology, depth, rows):
    from .roofline import (EquationCost, _collective_cost, _equation_cost,  # it imports this
                           _shapes_text)
    for eqn in eqns:
        name = _primitive_name(eqn)
        if name == "scan":                                  # its body, `length` times over
            n, body = eqn.params["length"], []
            _walk(_equation_list(eqn.params["jaxpr"]), sizes, hw, topology, depth + 1, body)
            rows.append(EquationCost(f"scan x{n}", _shapes_text(eqn), "", 0, 0, 0.0, 0.0,
                                     depth=depth))
            rows += [replace(r, flops=r.flops * n, bytes=r.bytes * n, compute_s=r.compute_s * n,
                             memory_s=r.memory_s * n, comms_s=r.comms_s * n,
                             comm_bytes=r.comm_bytes * n) for r in body]
            continue
        inner = next((eqn.params[k] for k in NESTED if k in eqn.params), None)
        if inner is not None:
            here = dict(sizes)
            if name == "shard_map" and "mesh" in eqn.params:
                here.update(_axis_sizes(eqn.params["mesh"]))
            if name == "xla_pmap":
                here[str(eqn.params["axis_name"])] = int(eqn.params["axis_size"])
            rows.append(EquationCost(name, _shapes_text(eqn), "", 0, 0, 0.0, 0.0, depth=depth))
            _walk(_equation_list(inner), here, hw, topology, depth + 1, rows)
            continue
        row = _row(eqn, name)
        op = getattr(row, "op", None) if getattr(row, "collective", False) else None
        if op is not None and op != "axis_index":
            axes, wire, seconds = _collective_cost(eqn, op, sizes, hw, topology)
            rows.append(EquationCost(name, _shapes_text(eqn), "", 0, 0, 0.0, 0.0, seconds, wire,
                                     axes, depth))
            continue
        rows.append(_equation_cost(eqn, name, hw, depth))
    return rows
