"""What a gradient costs on simpmd: one data-parallel training step against its forward pass.

    python benchmarks/grad_step.py            # 8 and 1024 simulated devices
    python benchmarks/grad_step.py --quick    # 8 devices

Both programs run the same two-layer tanh network on each device's batch. The forward
step computes the loss and a ``pmean`` of it; the grad step computes the gradient with
``simpmd.grad``, a ``pmean`` of the gradients (the all-reduce of data parallelism) and
the update. The report is the ratio grad step / forward step, both measured in the same
run (best of several calls), so the machine's speed cancels out. Reverse mode on a
machine costs a small multiple of the forward pass; simpmd adds its tracer layer.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

HIDDEN, FEATURES, BATCH = 32, 16, 8


def loss(params, x, y):
    import simpmd.numpy as snp
    h = snp.tanh(x @ params["w1"] + params["b1"])
    return ((h @ params["w2"] - y) ** 2).mean()


def forward_step(params, x, y):
    from simpmd import lax
    return lax.pmean(loss(params, x, y), "batch")


def grad_step(params, x, y):
    import simpmd
    from simpmd import lax
    grads = lax.pmean(simpmd.grad(loss)(params, x, y), "batch")
    return {k: params[k] - 0.1 * grads[k] for k in params}


def timed(fn, repeats):
    fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(n, repeats):
    import simpmd
    simpmd.set_device_count(n)
    rng = np.random.default_rng(0)
    params = {"w1": rng.normal(size=(FEATURES, HIDDEN)).astype(np.float32) / 4,
              "b1": np.zeros(HIDDEN, np.float32),
              "w2": rng.normal(size=(HIDDEN, 1)).astype(np.float32) / 4}
    x = rng.normal(size=(n, BATCH, FEATURES)).astype(np.float32)
    y = rng.normal(size=(n, BATCH, 1)).astype(np.float32)
    fwd = simpmd.pmap(forward_step, "batch", in_axes=(None, 0, 0), out_axes=None)
    bwd = simpmd.pmap(grad_step, "batch", in_axes=(None, 0, 0), out_axes=None)
    t_fwd = timed(lambda: fwd(params, x, y), repeats)
    t_bwd = timed(lambda: bwd(params, x, y), repeats)
    return {"devices": n, "forward_s": t_fwd, "grad_step_s": t_bwd, "ratio": t_bwd / t_fwd}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 devices only")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    sizes = [8] if args.quick else [8, 1024]
    rows = [measure(n, repeats=5 if n <= 64 else 3) for n in sizes]
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(f"{'devices':>8}  {'forward step':>13}  {'grad step':>10}  {'grad / forward':>14}")
    for r in rows:
        print(f"{r['devices']:>8}  {r['forward_s'] * 1e3:>10.1f} ms  {r['grad_step_s'] * 1e3:>7.1f} ms"
              f"  {r['ratio']:>14.2f}")


if __name__ == "__main__":
    main()
