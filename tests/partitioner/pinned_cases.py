"""The jitted programs whose partitioned form is pinned (tests/partitioner/test_pinned.py):
the named and random programs of tests/explicit_cases.py, shard_map inside jit, and the
dot of issue 46. For each: the compiled text, the collectives jit inserts, the roofline.

``record(case)`` computes them on the current code; ``python tests/partitioner/
pinned_cases.py`` writes them to ``pinned.json`` (done once, before jit became a pass).
"""
import json
from unittest import mock
import os
import sys

import numpy as np

HERE = os.path.dirname(__file__)
sys.path.insert(0, os.path.dirname(HERE))

import simpmd                                      # noqa: E402
import simpmd.numpy as snp                         # noqa: E402
from simpmd import P, cost                         # noqa: E402
from simpmd.api import printer                     # noqa: E402
from simpmd.core.program import _cache as program_cache   # noqa: E402
from simpmd.partitioner.sharding import settings   # noqa: E402
from explicit_cases import CASES, SHARD_MAP_CASES, Case, random_cases   # noqa: E402

EXTRA = [
    Case("issue46_dot_out_sharding", lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)),
         ((8, 8), (8, 4)), (P("data", "model"), P("model", None))),
    Case("issue46_dot", lambda x, w: x @ w, ((8, 8), (8, 4)), (P("data", None), P())),
    Case("unreduced_then_reshard", lambda x, w: simpmd.reshard(
        snp.matmul(x, w, out_sharding=P(None, None, unreduced={"model"})), P("data", None)),
        ((16, 32), (32, 8)), (P("data", "model"), P("model", None))),
    Case("scan_of_products", lambda x, w: simpmd.lax.scan(
        lambda c, _: (snp.tanh(c @ w), None), x, None, length=3)[0],
        ((16, 8), (8, 8)), (P("data", None), P())),
    Case("cond_in_jit", lambda x: simpmd.lax.cond(x.sum() > 0, lambda y: y * 2.0,
                                                  lambda y: y - 1.0, x),
         ((16, 32),), (P("data", "model"),)),
]


def all_cases():
    return CASES + SHARD_MAP_CASES + random_cases(40, seed=46) + EXTRA


def _roofline(f, placed):
    r = cost.roofline(f, *placed, hardware="H100")
    return dict(flops=float(r.flops), hbm_bytes=float(r.hbm_bytes),
                unfused_flops=float(r.unfused_flops), unfused_hbm_bytes=float(r.unfused_hbm_bytes),
                ici_bytes={k: float(v) for k, v in sorted(dict(r.ici_bytes).items())},
                peak_hbm_bytes=float(r.peak_hbm_bytes))


def record(case) -> dict:
    """What simpmd makes of ``case`` under jit: each part, or the error's type."""
    out = {}
    program_cache.clear()     # (jnp functions traced earlier under the running JAX's rules)
    mesh = case.make_mesh()
    newest_forms = mock.patch.object(printer, "forms", lambda: printer.NewestForms)
    with simpmd.set_mesh(mesh), settings.newest(), newest_forms:   # (recorded without JAX)
        placed = [simpmd.device_put(a, s) for a, s in zip(case.args(), case.specs)]
        f = simpmd.jit(case.fun)
        for part, get in (("text", lambda: f.lower(*placed).compile().as_text()),
                          ("inserted", lambda: (f(*placed), dict(sorted(
                              f.trace.collective_counts().items())))[1]),
                          ("roofline", lambda: _roofline(f, placed))):
            try:
                out[part] = get()
            except Exception as exc:             # noqa: BLE001 (pinned as it is)
                out[part] = f"raises {type(exc).__name__}"
    return out


if __name__ == "__main__":
    pinned = {c.name: record(c) for c in all_cases()}
    with open(os.path.join(HERE, "pinned.json"), "w") as fh:
        json.dump(pinned, fh, indent=1, sort_keys=True)
    print(len(pinned), "cases")
