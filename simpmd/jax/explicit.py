"""The same Explicit-sharding program on simpmd and on real JAX, compared three ways.

:func:`compare` runs ``fun`` with ``simpmd.jit`` over simulated sharded arrays and with
``jax.jit`` over real ones, on a mesh of the same shape with Explicit axes, and compares:

1. the sharding type of every result (``jax.typeof(y).sharding.spec``);
2. the values, device block by device block (matched by the slice each block covers,
   so device numbering does not matter);
3. the collectives: simpmd's inserted ones, counted by HLO kind, beside the ones in
   ``jax.jit(fun).lower(*args).compile().as_text()``.

Where both raise, that agrees too. The function must be written for both engines:
operators, methods, ``simpmd.numpy`` functions and ``simpmd.reshard`` (each hands over to
JAX when it meets JAX values). This module is the bridge: it imports JAX, the core does not.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .. import explicit
from ..machine.mesh import P, PartitionSpec


def jax_has_explicit_axes() -> tuple:
    """(True, '') if the running JAX has what the comparison needs, else (False, what lacks)."""
    import jax
    missing = [name for name, ok in [
        ("jax.sharding.AxisType", hasattr(jax.sharding, "AxisType")),
        ("jax.set_mesh", hasattr(jax, "set_mesh")),
        ("jax.sharding.reshard", hasattr(jax.sharding, "reshard")),
        ("jax.typeof", hasattr(jax, "typeof"))] if not ok]
    return (not missing, ", ".join(missing))


def _dims(spec, ndim) -> tuple:
    parts = list(spec) + [None] * (ndim - len(spec))
    return tuple(() if p is None else (tuple(p) if isinstance(p, (tuple, list)) else (p,))
                 for p in parts[:ndim])


def _spec_text(dims) -> str:
    return str(explicit._spec_of(dims))


def _leaves(tree):
    return explicit._leaves(tree)


def _short_error(exc) -> str:
    return f"{type(exc).__name__}"


@dataclass
class Comparison:
    """What :func:`compare` found; ``str()`` gives lines that do not depend on JAX's version."""
    name: str
    sim_types: list = field(default_factory=list)
    jax_types: list = field(default_factory=list)
    sim_error: str | None = None
    jax_error: str | None = None
    values_agree: bool | None = None
    sim_collectives: dict = field(default_factory=dict)
    jax_collectives: dict = field(default_factory=dict)
    skipped: str = ""

    @property
    def specs_agree(self) -> bool:
        return self.sim_error is None and self.jax_error is None and self.sim_types == self.jax_types

    @property
    def raise_alike(self) -> bool:
        return (self.sim_error is None) == (self.jax_error is None)

    @property
    def collectives_agree(self) -> bool:
        return self.sim_collectives == self.jax_collectives

    @property
    def collective_kinds_agree(self) -> bool:
        return set(self.sim_collectives) == set(self.jax_collectives)

    def __str__(self):
        if self.skipped:
            return f"{self.name}: simpmd only ({self.skipped})"
        if self.sim_error or self.jax_error:
            both = "both raise" if self.sim_error and self.jax_error else (
                f"simpmd {'raises' if self.sim_error else 'runs'}, JAX {'raises' if self.jax_error else 'runs'}")
            return f"{self.name}: {both}" + (" (agree)" if self.raise_alike else " (DIFFER)")
        types = ", ".join(self.sim_types)
        lines = [f"{self.name}: {types}",
                 f"  sharding: {'same on JAX' if self.specs_agree else 'JAX: ' + ', '.join(self.jax_types)}",
                 f"  values, block by block: {'equal' if self.values_agree else 'DIFFER'}",
                 f"  collectives: simpmd {_counts(self.sim_collectives)} | "
                 f"XLA on CPU {_counts(self.jax_collectives)}"]
        return "\n".join(lines)


def _counts(c: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in c.items()) if c else "none"


def compare(fun, *args, mesh, in_specs, name: str | None = None, rtol=1e-4, atol=1e-4,
            hlo: bool = True) -> Comparison:
    """Run ``fun(*args)`` (NumPy arrays placed by ``in_specs`` on ``mesh``) on both engines."""
    import jax
    name = name or getattr(fun, "__name__", "program")
    report = Comparison(name)
    # simpmd
    with explicit.set_mesh(mesh):
        placed = [explicit.device_put(a, s) for a, s in zip(args, in_specs)]
        jitted = explicit.jit(fun)
        try:
            sim_out = jitted(*placed)
        except Exception as e:              # noqa: BLE001 - the comparison reports it
            sim_out, report.sim_error = None, f"{type(e).__name__}: {e}"
    if sim_out is not None:
        report.sim_types = [str(explicit.typeof(y)) for y in _leaves(sim_out)]
        report.sim_collectives = explicit.collective_counts(jitted.trace)
    ok, lacking = jax_has_explicit_axes()
    if not ok:
        report.skipped = f"this JAX ({jax.__version__}) lacks {lacking}"
        return report
    AxisType = jax.sharding.AxisType
    jmesh = jax.make_mesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names),
                          axis_types=(AxisType.Explicit,) * len(mesh.axis_names))
    with jax.set_mesh(jmesh):
        jargs = [jax.device_put(np.asarray(a).astype(explicit._jax_dtype(np.asarray(a).dtype)),
                                jax.sharding.NamedSharding(jmesh, explicit.to_jax_spec(s)))
                 for a, s in zip(args, in_specs)]
        try:
            jax_out = jax.jit(fun)(*jargs)
            if hlo:
                text = jax.jit(fun).lower(*jargs).compile().as_text()
                report.jax_collectives = explicit.hlo_collective_counts(text)
        except Exception as e:              # noqa: BLE001
            jax_out, report.jax_error = None, f"{type(e).__name__}: {e}"
    if jax_out is None or sim_out is None:
        return report
    jl, sl = _leaves(jax_out), _leaves(sim_out)
    report.jax_types = [str(_type_text(y)) for y in jl]
    agree = len(jl) == len(sl)
    for j, s in zip(jl, sl):
        if tuple(j.shape) != tuple(s.shape):
            agree = False
            continue
        blocks = {tuple((sl_.start, sl_.stop) for sl_ in sh.index): sh.data for sh in s.addressable_shards}
        for shard in j.addressable_shards:
            key = tuple(slice(0, n).indices(n)[:2] if ix == slice(None) else (ix.start or 0, n if ix.stop is None else ix.stop)
                        for ix, n in zip(shard.index, j.shape))
            mine = blocks.get(key)
            if mine is None or not np.allclose(np.asarray(shard.data), mine, rtol=rtol, atol=atol):
                agree = False
    report.values_agree = agree
    return report


def _type_text(y) -> str:
    """``float32[16@data,8]`` from a JAX array's spec (the same text on every JAX version)."""
    dims = _dims(y.sharding.spec, y.ndim)
    return f"{np.dtype(y.dtype).name}[" + ",".join(
        explicit._dim_text(n, d) for n, d in zip(y.shape, dims)) + "]"
