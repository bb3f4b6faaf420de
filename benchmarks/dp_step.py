"""Speed of simpmd beside real jax.pmap, on the same program and the same device counts.

    python benchmarks/dp_step.py            # 8 .. 1024 devices (+ 4096, 16384 simpmd only)
    python benchmarks/dp_step.py --quick    # 8 and 64 devices

Two measurements, each reported as a ratio against a baseline measured in the same run:

1. One data-parallel step (a local gradient on a 1024-float vector, a ``pmean`` over the
   devices, an update) on simpmd and on ``jax.pmap`` over as many fake CPU devices.
   JAX fixes its device count when its backend starts, so each JAX size runs in a
   fresh subprocess. simpmd keeps the run's values for its per-device log and writes
   the log out when it is read: the ``log`` column is the time that takes, once.
2. One ``psum`` of 1 MiB per device over 64 devices, beside the bare NumPy reduction of
   the same stacked data (``x.sum(axis=0)``: the memory-bandwidth floor).

The step body is written once and runs on both engines: ``simpmd.lax.pmean`` joins the
simulation on a simulated device and hands over to ``jax.lax.pmean`` inside jax.pmap.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

VECTOR = 1024
LEARNING_RATE = 0.1


def step(w, x):
    """One data-parallel step: the gradient of 0.5*|w - x|^2, averaged, then applied."""
    from simpmd import lax
    grad = w - x
    grad = lax.pmean(grad, "batch")
    return w - LEARNING_RATE * grad


def timed(fn, repeats):
    """(first call, best of the following calls) in seconds.

    The best of several calls is the least disturbed by whatever else the machine is
    doing; every engine and baseline here is measured the same way.
    """
    t = time.perf_counter()
    fn()
    first = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return first, min(times)


def simpmd_step(n, repeats):
    import simpmd
    simpmd.set_device_count(n)
    f = simpmd.pmap(step, axis_name="batch", in_axes=(None, 0))
    w = np.zeros(VECTOR, np.float32)
    x = np.random.default_rng(0).standard_normal((n, VECTOR)).astype(np.float32)
    first, steady = timed(lambda: f(w, x), repeats)
    expected = w - LEARNING_RATE * (w - x.mean(0))
    assert np.allclose(np.asarray(f(w, x))[0], expected, atol=1e-5)
    t = time.perf_counter()
    assert len(f.trace.events) == 4 * n          # receive w and x, pmean, return: per device
    return first, steady, time.perf_counter() - t


def jax_step(n, repeats):
    """Runs in a subprocess whose XLA_FLAGS give it n fake CPU devices."""
    import jax
    assert jax.device_count() >= n, jax.devices()
    f = jax.pmap(step, axis_name="batch", in_axes=(None, 0), devices=jax.devices()[:n])
    w = np.zeros(VECTOR, np.float32)
    x = np.random.default_rng(0).standard_normal((n, VECTOR)).astype(np.float32)
    return timed(lambda: f(w, x).block_until_ready(), repeats)


def run_jax(n, repeats):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") +
                        f" --xla_force_host_platform_device_count={n}").strip()
    code = (f"import sys, json; sys.path.insert(0, {os.path.dirname(__file__)!r}); "
            f"import dp_step; print(json.dumps(dp_step.jax_step({n}, {repeats})))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                             text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return None
    if out.returncode != 0:
        print(f"  (jax on {n} devices failed: {out.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(out.stdout.strip().splitlines()[-1])


def psum_vs_numpy(devices=64, mib=1, repeats=30):
    import simpmd
    from simpmd import lax
    simpmd.set_device_count(devices)
    per_device = mib * (1 << 20) // 8
    x = np.random.default_rng(0).standard_normal((devices, per_device))
    f = simpmd.pmap(lambda v: lax.psum(v, "i"), axis_name="i")
    assert np.allclose(np.asarray(f(x))[5], x.sum(axis=0))
    sim = bare = float("inf")
    for _ in range(repeats):        # alternated, so both see the same machine load
        sim = min(sim, timed(lambda: f(x), 1)[1])
        bare = min(bare, timed(lambda: x.sum(axis=0), 1)[1])
    return sim, bare


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 and 64 devices only")
    parser.add_argument("--no-jax", action="store_true", help="skip the JAX baseline")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    sizes = [8, 64] if args.quick else [8, 64, 256, 1024, 4096, 16384]

    sim, bare = psum_vs_numpy()

    print("1. data-parallel step (grad of a 1024-float vector, pmean, update)")
    print(f"{'devices':>8} {'simpmd first':>13} {'simpmd step':>12} {'log':>8} {'jax first':>10} "
          f"{'jax step':>9} {'simpmd/jax':>10}")
    rows = []
    for n in sizes:
        s_first, s_steady, log = simpmd_step(n, args.repeats)
        j = None if (args.no_jax or n > 1024) else run_jax(n, args.repeats)
        ratio = f"{s_steady / j[1]:10.2f}" if j else f"{'-':>10}"
        jf, js = (f"{j[0]:10.3f}", f"{j[1]:9.4f}") if j else (f"{'-':>10}", f"{'-':>9}")
        print(f"{n:>8} {s_first:13.3f} {s_steady:12.4f} {log:8.3f} {jf} {js} {ratio}")
        rows.append((n, s_steady, j))

    print("\n2. psum of 1 MiB per device over 64 devices (whole pmap call: split, psum, stack)")
    print(f"   simpmd {sim * 1e3:.1f} ms, bare NumPy x.sum(axis=0) {bare * 1e3:.1f} ms, "
          f"ratio {sim / bare:.2f}")
    return rows


if __name__ == "__main__":
    main()
