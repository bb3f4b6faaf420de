"""Meshes and inputs the conformance cases share, built the same way on either engine."""
from __future__ import annotations

import numpy as np


def mesh(jx, shape=(4, 2), names=("x", "y"), types="auto"):
    """``jx.make_mesh`` with every axis Auto or every axis Explicit, said outright: the
    default changed in jax 0.9 (Explicit from then, Auto before)."""
    kind = jx.sharding.AxisType.Explicit if types == "explicit" else jx.sharding.AxisType.Auto
    return jx.make_mesh(shape, names, axis_types=(kind,) * len(shape))


def ar(*shape, start=0.0, dtype=np.float32):
    """0, 1, 2, ... in ``shape``: easy to read in a failure message."""
    return (np.arange(int(np.prod(shape))) + start).astype(dtype).reshape(shape)


def rnd(*shape, seed=0):
    """Standard normal float32 values: no symmetry to hide a wrong axis."""
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def put(jx, x, m, *spec):
    """``x`` placed on mesh ``m`` as ``P(*spec)``."""
    return jx.device_put(x, jx.NamedSharding(m, jx.P(*spec)))


def pcast_varying(jx, x, axes):
    """``x`` marked varying over ``axes``: ``lax.pcast(..., to='varying')`` where the running
    JAX has it, ``lax.pvary`` where it has not (jax 0.7.2)."""
    if hasattr(jx.lax, "pcast"):
        return jx.lax.pcast(x, axes, to="varying")
    return jx.lax.pvary(x, axes)


def vma(jx, x) -> tuple:
    """``x``'s type without its varying axes, and those axes sorted, read from the type's
    text: jax 0.7.2 prints them as ``float32[2]{y,x}`` (in a set's order, and has
    ``typeof(x).vma``), 0.10 and later as ``float32[2]{V:(x,y)}`` (and ``typeof(x).mat``)."""
    text = str(jx.typeof(x))
    head, _, tail = text.partition("{")
    names = tail.rstrip("}").replace("V:", "").strip("()").replace("(", "").replace(")", "")
    return head, tuple(sorted(n for n in names.split(",") if n))


def has_unreduced(jax) -> str:
    """Why this JAX cannot run unreduced cases ('' when it can): PartitionSpec without
    ``unreduced=`` (jax 0.7.2)."""
    try:
        jax.P(unreduced={"x"})
    except TypeError as exc:
        return f"this JAX has no unreduced types ({exc})"
    return ""


def refused_by_jax(program, inputs):
    """``raises`` for a case whose refusal differs between JAX releases: whether the
    running JAX raises on it (asked once per process)."""
    answer = {}

    def raises(jax):
        if "raised" not in answer:
            try:
                program(jax, *inputs())
                answer["raised"] = False
            except Exception:
                answer["raised"] = True
        return answer["raised"]
    return raises
