"""A cached ``simpmd.jit`` call beside a cached ``simpmd.pmap`` call of the same matmul.

    python benchmarks/jit_dot.py            # best of 2000 calls each, printed as a ratio

Issue 46's example: ``x @ w`` for ``x`` f32[8,8] and ``w`` f32[8,4] on a (2, 4) mesh of
simulated devices, under ``jit`` with ``out_sharding=P('data', None)`` (``x`` split
``P('data', 'model')``, ``w`` ``P('model', None)``: a product on blocks and an all-reduce
over 'model') and without it (``x`` ``P('data', None)``, ``w`` replicated: a product on
blocks), beside ``pmap`` over the 8 devices of the same rows (``x`` as 8 rows of one, ``w``
broadcast). Each call is cached (traced and partitioned on the first call), so what is
timed is what a cached call does: run the per-device program and log it. The target is a
jit call at most 2x the pmap call.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import simpmd
import simpmd.numpy as snp
from simpmd import P


def best(call, repeats):
    """The fastest of ``repeats`` calls, in seconds (after one warm-up call)."""
    call()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        call()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(repeats=2000) -> dict:
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((8, 8)).astype(np.float32), rng.standard_normal((8, 4)).astype(np.float32)
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    with simpmd.set_mesh(mesh):
        xs, ws = simpmd.device_put(x, P("data", "model")), simpmd.device_put(w, P("model", None))
        xr, wr = simpmd.device_put(x, P("data", None)), simpmd.device_put(w, P())
        with_out = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)))
        without = simpmd.jit(lambda x, w: x @ w)
        rows = simpmd.pmap(lambda x, w: x @ w, in_axes=(0, None))
        x8 = x.reshape(8, 1, 8)
        for got in (with_out(xs, ws), without(xr, wr), rows(x8, w).reshape(8, 4)):
            np.testing.assert_allclose(np.asarray(got), x @ w, rtol=1e-5)
        return {"pmap": best(lambda: rows(x8, w), repeats),
                "jit, out_sharding": best(lambda: with_out(xs, ws), repeats),
                "jit": best(lambda: without(xr, wr), repeats)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2000)
    times = measure(parser.parse_args().repeats)
    for name, t in times.items():
        print(f"{name:20s} {t * 1e6:8.1f} us   {t / times['pmap']:.2f}x pmap")


if __name__ == "__main__":
    main()
