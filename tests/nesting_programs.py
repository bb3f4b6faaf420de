"""Random programs that nest JAX's transformations, run on simpmd and on real JAX.

A program is a base function of one array (elementwise math, a reduction, a matrix
product, or a collective over an axis in scope) wrapped in two or three transformations
drawn from ``grad``, ``value_and_grad``, ``jit``, ``shard_map``, ``pmap``, ``scan``,
``fori_loop``, ``while_loop``, ``cond`` and ``checkpoint``, and, outermost, sometimes
``eval_shape`` or ``make_jaxpr``. Every layer keeps its function's signature (an array in,
an array of the same shape out), so any order composes: ``grad`` differentiates the sum,
``value_and_grad`` multiplies the two, ``pmap`` maps a reshaped leading dimension,
``shard_map`` splits the leading dimension over a 4-device mesh with Auto axes (on an
Explicit mesh JAX 0.10+ refuses NumPy arguments that ``in_specs`` would split, and simpmd's
top-level ``shard_map`` accepts them: a known difference, documented in docs/testing.md).

The same seed draws the same programs on every machine (``draw``). ``compare`` runs one
on both engines and says whether they agree: both raise, or both return the same values
(to float32 rounding) and the same type (``typeof``'s text); ``make_jaxpr`` programs
compare the result types, and count equal printed text on the side.

Not drawn, as designed: ``pmap`` inside ``shard_map`` or ``pmap`` (simpmd keeps the nested
pmap that JAX no longer runs), and ``make_jaxpr`` right around ``shard_map`` or ``pmap``
(simpmd's prints the body each device runs, JAX's the one equation that holds it).
"""
from __future__ import annotations

import dataclasses
import functools
import random
import subprocess
import sys

import numpy as np

LAYERS = ("grad", "value_and_grad", "jit", "shard_map", "pmap", "scan", "fori_loop",
          "while_loop", "cond", "checkpoint")
OUTERMOST = ("eval_shape", "make_jaxpr")
BASES = ("tanh", "sum", "matmul", "psum", "pmean", "ppermute", "pmax", "axis_index")
COLLECTIVE_BASES = {"psum", "pmean", "ppermute", "pmax", "axis_index"}
SHAPE = (8, 4)
MAPPED = 4                      # devices in the shard_map mesh and the pmap


@dataclasses.dataclass(frozen=True)
class Program:
    """Outermost layer first; the base function innermost; ``outer`` eval_shape,
    make_jaxpr or None; ``check_vma`` for every shard_map."""
    layers: tuple
    base: str
    outer: str | None = None
    check_vma: bool = True

    @property
    def family(self) -> str:
        return " . ".join(((self.outer,) if self.outer else ()) + self.layers)

    def __str__(self):
        vma = "" if self.check_vma or "shard_map" not in self.layers else " (check_vma=False)"
        return f"{self.family} . {self.base}{vma}"


def _allowed(layers, outer=None) -> bool:
    """pmap never inside shard_map or pmap (simpmd keeps nested pmap on purpose), and
    make_jaxpr never right around either (simpmd prints the body each device runs)."""
    if outer == "make_jaxpr" and layers[-1] in ("shard_map", "pmap"):
        return False
    mapped = False
    for name in layers:          # (innermost first)
        if name == "pmap" and mapped:
            return False
        mapped = mapped or name in ("pmap", "shard_map")
    return True


def draw(seed: int, count: int) -> list:
    """``count`` programs, the same for the same seed."""
    rng, out = random.Random(seed), []
    while len(out) < count:
        layers = tuple(rng.choice(LAYERS) for _ in range(rng.choice((2, 2, 3))))
        bound = "shard_map" in layers or "pmap" in layers
        bases = BASES if bound else tuple(b for b in BASES if b not in COLLECTIVE_BASES)
        base, outer = rng.choice(bases), rng.choice((None,) * 8 + OUTERMOST)
        check_vma = rng.random() < 0.8
        if _allowed(layers[::-1], outer):
            out.append(Program(layers, base, outer, check_vma))
    return out


# -- one engine's spelling of a program ------------------------------------------------------


class Engine:
    """What a program needs of an engine: its jit, grad, ..., lax, numpy, mesh and P."""

    def __init__(self, name):
        self.name = name
        if name == "jax":
            import jax
            import jax.numpy as jnp
            from jax.sharding import AxisType, PartitionSpec
            self.J, self.lax, self.np, self.P = jax, jax.lax, jnp, PartitionSpec
            self.mesh = jax.make_mesh((MAPPED,), ("i",), axis_types=(AxisType.Auto,))
        else:
            import simpmd
            import simpmd.numpy as snp
            self.J, self.lax, self.np, self.P = simpmd, simpmd.lax, snp, simpmd.P
            self.mesh = simpmd.make_mesh((MAPPED,), ("i",), axis_types=(simpmd.AxisType.Auto,))


_W = np.random.RandomState(7).randn(SHAPE[1], SHAPE[1]).astype(np.float32) / 2


def _base(E, name, axes):
    np_, lax = E.np, E.lax
    ax = axes[-1] if axes else None
    return {
        "tanh": lambda x: np_.tanh(x * 1.5) + 0.1 * x * x,
        "sum": lambda x: np_.sin(x) * 0.5 + x.mean() * 0.1,
        "matmul": lambda x: np_.tanh(x @ _W) + x,
        "psum": lambda x: x * 0.5 + lax.psum(x, ax) * 0.1,
        "pmean": lambda x: lax.pmean(x * x, ax) + x,
        "ppermute": lambda x: lax.ppermute(x, ax, [(k, (k + 1) % MAPPED) for k in range(MAPPED)]) * x,
        "pmax": lambda x: x * lax.pmax(x, ax),
        "axis_index": lambda x: x + lax.axis_index(ax) * 0.01,
    }[name]


def _layer(E, name, g, check_vma):
    J, lax = E.J, E.lax
    if name == "jit":
        return J.jit(g)
    if name == "grad":
        return lambda x: J.grad(lambda y: g(y).sum())(x)
    if name == "value_and_grad":
        return lambda x: (lambda vg: vg[1] * vg[0])(J.value_and_grad(lambda y: g(y).sum())(x))
    if name == "shard_map":
        return J.shard_map(g, mesh=E.mesh, in_specs=E.P("i"), out_specs=E.P("i"),
                           check_vma=check_vma)
    if name == "pmap":
        mapped = J.pmap(g, axis_name="p")
        return lambda x: mapped(x.reshape((MAPPED, x.shape[0] // MAPPED) + x.shape[1:])).reshape(
            x.shape)
    if name == "scan":
        return lambda x: lax.scan(lambda c, _: (g(c), None), x, None, length=2)[0]
    if name == "fori_loop":
        return lambda x: lax.fori_loop(0, 2, lambda i, c: g(c), x)
    if name == "while_loop":
        return lambda x: lax.while_loop(lambda ic: ic[0] < 2, lambda ic: (ic[0] + 1, g(ic[1])),
                                        (0, x))[1]
    if name == "cond":
        return lambda x: lax.cond(x.sum() * 0.0 >= 0.0, g, lambda y: y * 0.5, x)
    if name == "checkpoint":
        return J.checkpoint(g)
    raise ValueError(name)


def build(E, program):
    """The program as a function of one array, on engine ``E``."""
    axes = [{"shard_map": "i", "pmap": "p"}[n] for n in program.layers
            if n in ("shard_map", "pmap")]
    g = _base(E, program.base, axes)
    for name in reversed(program.layers):
        g = _layer(E, name, g, program.check_vma)
    if program.outer == "eval_shape":
        return lambda x: E.J.eval_shape(g, x)
    if program.outer == "make_jaxpr":
        return lambda x: E.J.make_jaxpr(g)(x)
    return g


# -- running one on both ------------------------------------------------------------------------

_CRASH_PROBE = """
import numpy as np, jax
from jax.sharding import PartitionSpec as P
mesh = jax.sharding.Mesh(np.array(jax.devices()[:4]), ("i",))
body = lambda x: jax.lax.scan(lambda c, _: (c + jax.lax.axis_index("i") * 0.01, None), x, None,
                              length=2)[0]
print(jax.shard_map(body, mesh=mesh, in_specs=P("i"), out_specs=P("i"))(np.ones(8, np.float32)))
"""


@functools.lru_cache(maxsize=None)
def xla_crashes_on_axis_index_in_loops() -> bool:
    """Whether this JAX's CPU compiler aborts the process (an LLVM error, not an
    exception) on ``axis_index`` and a loop in one ``shard_map`` or ``pmap`` program (jax
    0.7.2 does): asked once, of a child process, so those programs can be left out."""
    done = subprocess.run([sys.executable, "-c", _CRASH_PROBE], capture_output=True, timeout=120)
    return done.returncode != 0


def crashes_jax(program) -> bool:
    """A program this JAX cannot run without its process dying (not compared): on such a
    JAX, ``axis_index`` with a loop anywhere around it or inside its map."""
    return program.base == "axis_index" and xla_crashes_on_axis_index_in_loops() and any(
        n in ("scan", "fori_loop", "while_loop") for n in program.layers)


@dataclasses.dataclass
class Outcome:
    """What one engine did: its error (type and first line), or its result."""
    error: str | None = None
    value: np.ndarray | None = None
    type_text: str | None = None
    text: str | None = None          # make_jaxpr's printed program


def run(E, program, x) -> Outcome:
    try:
        out = build(E, program)(x)
    except Exception as exc:           # which step raised is what is compared
        first = (str(exc).strip().splitlines() or [""])[0]
        return Outcome(error=f"{type(exc).__name__}: {first[:200]}")
    if program.outer == "make_jaxpr":
        avals = out.out_avals if hasattr(out, "out_avals") else out.jaxpr.out_avals
        return Outcome(type_text=" ".join(f"{a.dtype.name}{list(a.shape)}" for a in avals),
                       text=str(out))
    if program.outer == "eval_shape":
        return Outcome(type_text=f"{np.dtype(out.dtype).name}{list(out.shape)}")
    return Outcome(value=np.asarray(out), type_text=str(E.J.typeof(out)))


def compare(jax_engine, simpmd_engine, program, x=None):
    """(agreed, jax's outcome, simpmd's outcome, why they differ or ''); agreed is None
    where JAX fails an assertion of its own (a bug of that JAX, not a refusal)."""
    x = np.random.RandomState(0).randn(*SHAPE).astype(np.float32) if x is None else x
    theirs, ours = run(jax_engine, program, x), run(simpmd_engine, program, x)
    if theirs.error and theirs.error.startswith("AssertionError") and not ours.error:
        return None, theirs, ours, "JAX's own assertion failed"
    if (theirs.error is None) != (ours.error is None):
        why = "simpmd raised" if ours.error else "JAX raised"
        return False, theirs, ours, why
    if theirs.error:
        return True, theirs, ours, ""
    if theirs.type_text != ours.type_text:
        return False, theirs, ours, "types differ"
    if theirs.value is not None and not close(theirs.value, ours.value):
        return False, theirs, ours, "values differ"
    return True, theirs, ours, ""


def close(a, b) -> bool:
    """Equal to float32 rounding, measured against the largest magnitude: a value times its
    gradient, iterated, amplifies rounding (one such program differs from float64 by 1.6e-4
    of its largest value on both engines alike, and the engines agree to 2e-13 in float64)."""
    if a.shape != b.shape:
        return False
    finite = np.abs(a[np.isfinite(a)])
    scale = max(1.0, float(finite.max())) if finite.size else 1.0
    with np.errstate(invalid="ignore"):
        same = (np.abs(a - b) <= 1e-3 * scale) | (a == b) | (np.isnan(a) & np.isnan(b))
    return bool(same.all())


def report(results) -> str:
    """Counts per family (the layers, outer to inner) and per transformation; ``agreed``
    None for a program this JAX cannot run (its process dies, or its own assertion fails:
    left out of the counts)."""
    by_family, by_layer = {}, {}
    skipped = sum(1 for _, agreed in results if agreed is None)
    results = [(p, a) for p, a in results if a is not None]
    for program, agreed in results:
        for key, table in ((program.family, by_family),):
            seen = table.setdefault(key, [0, 0])
            seen[0] += agreed
            seen[1] += 1
        for name in set(program.layers) | ({program.outer} if program.outer else set()):
            seen = by_layer.setdefault(name, [0, 0])
            seen[0] += agreed
            seen[1] += 1
    lines = [f"{sum(a for _, a in results)}/{len(results)} programs agree"
             + (f" ({skipped} more left out: this JAX cannot run them)" if skipped else "")]
    lines += [f"  {name:15s} {a}/{n}" for name, (a, n) in sorted(by_layer.items())]
    return "\n".join(lines), by_family
