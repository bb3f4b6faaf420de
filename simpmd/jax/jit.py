"""A ``simpmd.jit`` program on real JAX: the same function under ``jax.jit``, on a mesh of
the same shape and axis types, compared three ways.

:func:`compare` runs ``fun`` with ``simpmd.jit`` on simulated sharded arrays and with
``jax.jit`` on real ones, and compares

1. the sharding type of every result (``jax.typeof``);
2. the values, each simulated device's block against the same slice of JAX's result;
3. the collectives: the kinds simpmd inserted against those in
   ``jax.jit(fun).lower(*args).compile().as_text()``, XLA's compiled HLO.

Where both raise, that agrees too. The function is written once, for both engines:
operators, methods, ``simpmd.numpy`` functions and ``simpmd.reshard`` hand over to JAX
when they meet JAX arrays. ``simpmd.crosscheck(simpmd.jit(f), *args)`` reports the same
comparison as a :class:`~simpmd.jax.crosscheck.CrossCheckReport`. This module is the
bridge: it imports JAX; the engine does not.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

from ..api import jit as J
from ..api import tree
from ..machine.mesh import AxisType, axis_types_of


def jax_has_explicit_axes() -> tuple:
    """(True, '') if the running JAX has what the comparison needs, else (False, what lacks)."""
    import jax  # optional: JAX
    missing = [name for name, ok in [
        ("jax.sharding.AxisType", hasattr(jax.sharding, "AxisType")),
        ("jax.set_mesh", hasattr(jax, "set_mesh")),
        ("jax.sharding.reshard", hasattr(jax.sharding, "reshard")),
        ("jax.typeof", hasattr(jax, "typeof"))] if not ok]
    return (not missing, ", ".join(missing))


_HLO_OP = re.compile(r"\s(all-reduce|reduce-scatter|all-gather|all-to-all|collective-permute)"
                     r"(?:-start)?\(")


def hlo_collective_counts(hlo_text: str) -> dict:
    """The collectives in compiled HLO text (``jax.jit(f).lower(*a).compile().as_text()``),
    by kind: ``{'all-reduce': 2}``."""
    counts: dict = {}
    for line in hlo_text.splitlines():
        found = _HLO_OP.search(line)
        if found and "=" in line.split(found.group(0))[0]:
            counts[found.group(1)] = counts.get(found.group(1), 0) + 1
    return dict(sorted(counts.items()))


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
    auto_axes: tuple = ()
    skipped: str = ""

    @property
    def raise_alike(self) -> bool:
        return (self.sim_error is None) == (self.jax_error is None)

    @property
    def types_agree(self) -> bool:
        return self.sim_error is None and self.jax_error is None and self.sim_types == self.jax_types

    specs_agree = types_agree

    @property
    def collectives_agree(self) -> bool:
        return self.sim_collectives == self.jax_collectives

    @property
    def collective_kinds_agree(self) -> bool:
        return set(self.sim_collectives) == set(self.jax_collectives)

    @property
    def ok(self) -> bool:
        """Raise alike, and where both run, the same types and values."""
        if self.skipped or not self.raise_alike:
            return not self.skipped and self.raise_alike
        return self.sim_error is not None or (self.types_agree and bool(self.values_agree))

    def __str__(self):
        if self.skipped:
            return f"{self.name}: simpmd only ({self.skipped})"
        if self.sim_error or self.jax_error:
            both = "both raise" if self.sim_error and self.jax_error else (
                f"simpmd {'raises' if self.sim_error else 'runs'}, JAX {'raises' if self.jax_error else 'runs'}")
            return f"{self.name}: {both}" + (" (agree)" if self.raise_alike else " (DIFFER)")
        xla = ("XLA chooses (Auto axes)" if self.auto_axes and not self.jax_collectives
               else f"XLA on CPU {_counts(self.jax_collectives)}")
        return "\n".join([
            f"{self.name}: {', '.join(self.sim_types)}",
            f"  sharding: {'same on JAX' if self.types_agree else 'JAX: ' + ', '.join(self.jax_types)}",
            f"  values, block by block: {'equal' if self.values_agree else 'DIFFER'}",
            f"  collectives: simpmd {_counts(self.sim_collectives)} | {xla}"])


def _counts(c: dict) -> str:
    return ", ".join(f"{n} {k}" for k, n in c.items()) if c else "none"


def type_text(y, mesh) -> str:
    """``float32[16@data,8]`` from a JAX array's spec, its Explicit axes only (the same
    text on every JAX version, and what ``jax.typeof`` prints)."""
    explicit = {n for n, t in zip(mesh.axis_names, axis_types_of(mesh)) if t is AxisType.Explicit}
    spec = list(y.sharding.spec) + [None] * y.ndim
    dims = []
    for n, p in zip(y.shape, spec[:y.ndim]):
        axes = tuple(a for a in ((p,) if isinstance(p, str) else tuple(p or ())) if a in explicit)
        dims.append(str(n) + ("" if not axes else "@" + (axes[0] if len(axes) == 1 else
                                                          f"({','.join(axes)})")))
    return f"{np.dtype(y.dtype).name}[{','.join(dims)}]"


def jax_mesh(mesh):
    """A JAX mesh of ``mesh``'s shape, names and axis types."""
    import jax  # optional: JAX
    kinds = [getattr(jax.sharding.AxisType, t.name) for t in axis_types_of(mesh)]
    return jax.make_mesh(tuple(mesh.axis_sizes), tuple(mesh.axis_names), axis_types=tuple(kinds))


def compare(fun, *args, mesh, in_specs, name: str | None = None, rtol=1e-4, atol=1e-4,
            hlo: bool = True, jit: bool = True) -> Comparison:
    """Run ``fun(*args)`` (NumPy arrays placed by ``in_specs`` on ``mesh``) on both engines,
    under ``jit`` (``jit=False``: operation by operation, as JAX runs code outside jit).
    ``fun`` may be a ``simpmd.jit`` function or a plain one."""
    import jax  # optional: JAX
    body = getattr(fun, "fun", fun)
    name = name or getattr(body, "__name__", "program")
    report = Comparison(name, auto_axes=tuple(n for n, t in zip(mesh.axis_names, axis_types_of(mesh))
                                               if t is AxisType.Auto))
    with J.set_mesh(mesh):
        placed = [J.device_put(a, s) for a, s in zip(args, in_specs)]
        jitted = fun if isinstance(fun, J.Jitted) or not jit else J.jit(fun)
        try:
            sim_out = jitted(*placed)
        except Exception as e:              # noqa: BLE001 - the comparison reports it
            sim_out, report.sim_error = None, f"{type(e).__name__}: {e}"
    sim_leaves = tree.flatten(sim_out)[0] if sim_out is not None else []
    if sim_out is not None:
        report.sim_types = [str(J.typeof(y)) for y in sim_leaves]
        if jit:
            report.sim_collectives = jitted.trace.collective_counts()
    ok, lacking = jax_has_explicit_axes()
    if not ok:
        report.skipped = f"this JAX ({jax.__version__}) lacks {lacking}"
        return report
    jmesh = jax_mesh(mesh)
    with jax.set_mesh(jmesh):
        jargs = [jax.device_put(np.asarray(a).astype(J.dtypes.canonical(np.asarray(a).dtype)),
                                jax.sharding.NamedSharding(jmesh, J.to_jax_spec(s)))
                 for a, s in zip(args, in_specs)]
        try:
            jax_out = jax.jit(body)(*jargs) if jit else body(*jargs)
            if hlo and jit:
                text = jax.jit(body).lower(*jargs).compile().as_text()
                report.jax_collectives = hlo_collective_counts(text)
        except Exception as e:              # noqa: BLE001
            jax_out, report.jax_error = None, f"{type(e).__name__}: {e}"
            if (isinstance(e, AssertionError) and "Unexpected XLA sharding override" in str(e)
                    and any(0 in y.shape for y in sim_leaves)):
                report.skipped = (f"known JAX bug (jax {jax.__version__}): jit of a program "
                                  f"whose result is empty and split asserts 'Unexpected XLA "
                                  f"sharding override' (jax 0.10 runs it)")
    if jax_out is None or sim_out is None:
        return report
    jl = jax.tree_util.tree_leaves(jax_out)
    report.jax_types = [type_text(y, mesh) for y in jl]
    report.values_agree = len(jl) == len(sim_leaves) and all(
        _same_blocks(j, s, rtol, atol) for j, s in zip(jl, sim_leaves))
    return report


def _same_blocks(j, s, rtol, atol) -> bool:
    """Every simulated device's block equals the same slice of JAX's result."""
    whole = np.asarray(j)
    if whole.shape != tuple(s.shape):
        return False
    return all(np.allclose(whole[shard.index], shard.data, rtol=rtol, atol=atol)
               for shard in s.addressable_shards)


__all__ = ["compare", "Comparison", "hlo_collective_counts", "jax_has_explicit_axes"]
