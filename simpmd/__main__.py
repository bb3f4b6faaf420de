"""``python -m simpmd``: a two-minute tour of the simulated mesh."""
import numpy as np

import simpmd
from simpmd import lax


def scaled_sum(x):
    return lax.psum(x * 2.0, axis_name="devices")


def inner(x, p):
    return lax.psum(x * p, "model") * 2


def outer(x, p):
    return lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data")


def main():
    print(f"simpmd {simpmd.__version__}: {simpmd.platform()}")
    print(f"devices: {simpmd.devices()}\n")

    print("1. One program on every device: psum(x * 2) over 8 devices")
    f = simpmd.pmap(scaled_sum, axis_name="devices")
    out = f(np.arange(8.0))
    print(f"   result: {np.asarray(out)}\n")
    print(f.trace.table("device 3"), "\n")

    print("2. Nested pmap on a 2x2 grid: psum over 'model', then over 'data'")
    g = simpmd.pmap(outer, axis_name="data")
    out = g(np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5))
    print(f"   result: {np.asarray(out).tolist()}  (6.0 everywhere)\n")
    print(g.trace, "\n")

    print("3. An error that teaches: mapping a scalar")
    try:
        simpmd.pmap(lambda lr, x: x * lr, axis_name="devices")(0.1, np.ones(8))
    except simpmd.MappedAxisError as err:
        print(f"   {type(err).__name__}: {err}")


if __name__ == "__main__":
    main()
