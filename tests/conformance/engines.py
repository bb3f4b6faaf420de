"""One case, two engines: run a conformance case on simpmd and on real JAX and say how the
outcomes differ.

A case is data (``Case``): a function ``program(jx, *inputs)`` written once against JAX's
names, where ``jx`` is the ``jax`` module or the ``simpmd`` module, and a function making
its NumPy inputs. The outcome of a run is either the error's class name or, for every leaf
of what the program returned, its shape, dtype, values, ``typeof`` text and sharding (the
mesh's axis sizes and the spec, trailing ``None`` dropped). Two outcomes agree when both
engines raise, or both return leaves that agree in all of those.

This module never imports JAX or simpmd: the test passes the modules in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import numpy as np


@dataclass(frozen=True)
class Case:
    """A program from JAX's tests, ported: what JAX test it follows, how the JAX versions
    differ on it (checked on the running JAX, never from a version number), and the
    issue item that makes simpmd disagree today (strict xfail) if any."""

    name: str
    program: Callable[..., Any]             # program(jx, *inputs) -> a pytree of results
    inputs: Callable[[], tuple] = lambda: ()
    follows: str = ""                       # "shard_map_test.py::test_all_gather"
    versions: str = ""                      # the JAX versions' differences, in words
    xfail: Any = ""                         # "issue 45 item N: ..." while simpmd differs,
                                            # or xfail(jax) -> that text ('' where it agrees)
    raises: Any = False                     # JAX raises here (or raises(jax) -> bool)
    needs: Callable[[Any], str] | None = None   # needs(jax) -> why this JAX cannot run it
    rtol: float = 1e-5
    atol: float = 1e-5
    shardings: bool = True                  # compare the results' shardings
    values: bool = True                     # compare values (False: JAX computes them wrongly)

    def expected_error(self, jax) -> bool:
        return self.raises(jax) if callable(self.raises) else bool(self.raises)

    def xfail_reason(self, jax) -> str:
        return self.xfail(jax) if callable(self.xfail) else self.xfail


# -- an outcome ---------------------------------------------------------------------------------

def _spec_text(spec) -> tuple:
    """A PartitionSpec as a tuple, one-name tuples unwrapped and trailing ``None`` dropped,
    so that P('x'), P(('x',)) and P('x', None) read alike, as they mean the same."""
    parts = [p[0] if isinstance(p, tuple) and len(p) == 1 else
             (tuple(p) if isinstance(p, (tuple, list)) else p)
             for p in tuple(getattr(spec, "partitions", spec))]
    while parts and parts[-1] is None:
        parts.pop()
    extra = []
    for key in ("unreduced", "reduced"):
        names = getattr(spec, key, None)
        if names:
            extra.append((key, tuple(sorted(names))))
    return tuple(parts) + tuple(extra)


def _sharding_text(leaf):
    sharding = getattr(leaf, "sharding", None)
    spec = getattr(sharding, "spec", None)
    if spec is None:
        return None
    mesh = getattr(sharding, "mesh", None)
    sizes = dict(getattr(mesh, "shape", {}) or {})
    if not sizes:                     # a mesh of no axes: one device, as JAX's SingleDeviceSharding
        return None
    return (tuple(sorted(sizes.items())), _spec_text(spec))


def describe_leaf(jx, leaf) -> dict:
    """What the comparison reads of one returned leaf."""
    if isinstance(leaf, (str, bool, int)) or leaf is None:
        return {"python": leaf}
    if isinstance(leaf, tuple) and all(isinstance(t, (int, str)) or t is None for t in leaf):
        return {"python": leaf}
    try:
        typ = str(jx.typeof(leaf))
    except Exception:                 # a NumPy value or a Python float: no sharding type
        typ = None
    values = np.asarray(leaf)
    return {"shape": tuple(values.shape), "dtype": str(values.dtype), "values": values,
            "type": typ, "sharding": _sharding_text(leaf)}


def flatten(tree) -> list:
    """The leaves of nested tuples, lists and dicts (dicts in key order)."""
    if isinstance(tree, dict):
        return [leaf for k in sorted(tree) for leaf in flatten(tree[k])]
    if isinstance(tree, (list, tuple)) and not (
            isinstance(tree, tuple) and tree and all(isinstance(t, (int, str)) for t in tree)):
        return [leaf for item in tree for leaf in flatten(item)]
    return [tree]


@dataclass
class Outcome:
    error: str | None = None          # the exception's class name and first line
    leaves: list | None = None


def run_case(jx, case: Case) -> Outcome:
    """Run ``case`` on one engine; an exception is an outcome, not a failure."""
    try:
        result = case.program(jx, *case.inputs())
        return Outcome(leaves=[describe_leaf(jx, leaf) for leaf in flatten(result)])
    except Exception as exc:          # compared: does the other engine raise too?
        first = (str(exc).strip().splitlines() or [""])[0][:300]
        return Outcome(error=f"{type(exc).__name__}: {first}")


# -- comparing two outcomes ----------------------------------------------------------------------

def _leaf_differences(k, a, b, case) -> list:
    if a.keys() != b.keys():
        return [f"leaf {k}: simpmd gives {a}, JAX gives {b}"]
    if "python" in a:
        return [] if a["python"] == b["python"] else [
            f"leaf {k}: simpmd {a['python']!r}, JAX {b['python']!r}"]
    keys = ("shape", "dtype", "type") + (("sharding",) if case.shardings else ())
    found = [f"leaf {k}: {key} {a[key]} on simpmd, {b[key]} on JAX"
             for key in keys if a[key] != b[key]]
    rtol, atol = case.rtol, case.atol
    if a["shape"] == b["shape"] and not found and case.values:
        x, y = a["values"], b["values"]
        same = (np.allclose(x, y, rtol=rtol, atol=atol, equal_nan=True)
                if x.dtype.kind in "fc" else np.array_equal(x, y))
        if not same:
            found.append(f"leaf {k}: values {np.round(x, 4).tolist()} on simpmd, "
                         f"{np.round(y, 4).tolist()} on JAX")
    return found


def differences(sim: Outcome, real: Outcome, case: Case) -> list:
    """How simpmd's outcome differs from JAX's, in words (empty when they agree)."""
    if (sim.error is None) != (real.error is None):
        return [f"simpmd {'raised ' + sim.error if sim.error else 'returned'}; "
                f"JAX {'raised ' + real.error if real.error else 'returned'}"]
    if sim.error is not None:
        return []
    if len(sim.leaves) != len(real.leaves):
        return [f"{len(sim.leaves)} leaves on simpmd, {len(real.leaves)} on JAX"]
    return [d for k, (a, b) in enumerate(zip(sim.leaves, real.leaves))
            for d in _leaf_differences(k, a, b, case)]
