"""How fast simpmd answers a malformed program, beside the same program written right.

    python benchmarks/errors.py            # the mistakes on 8 devices; deadlocks up to 16384
    python benchmarks/errors.py --quick    # deadlocks up to 1024 devices

Two measurements, each reported as a ratio against a baseline measured in the same run:

1. Time to each error of tests/api/test_malformed.py's mistakes on 8 devices, beside the time
   of a correct program of the same kind (``pmap(lambda v: lax.psum(v, 'i'))``): a ratio
   near 1 or below means a mistake costs no more than a run.
2. Deadlock detection with ``eager=True`` (the threaded per-device runtime) on up to 16384
   devices: one device skips a psum that all the others wait in. Beside it, the same run
   in which every device joins the psum. Detection is instant when the ratio stays near 1
   (nothing waits for a timeout), and the message stays short (its length is printed).
   The time simpmd spends finding the deadlock and writing its message, once the run
   queue is empty, is printed apart ("diagnosis"); the rest is the run up to the deadlock
   and unwinding the waiting devices' threads, which grow with the device count as the
   correct run does.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax
from simpmd.eager import scheduler

_diagnosis = []                      # seconds spent in Simulation._diagnose, per call


def _timed_diagnose(original):
    def diagnose(self, stuck):
        t = time.perf_counter()
        try:
            return original(self, stuck)
        finally:
            _diagnosis.append(time.perf_counter() - t)
    return diagnose


scheduler.Simulation._diagnose = _timed_diagnose(scheduler.Simulation._diagnose)


def timed(fn, repeats):
    """Best of ``repeats`` calls in seconds (``fn`` may raise; that is what is timed)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        try:
            fn()
        except Exception:
            pass
        best = min(best, time.perf_counter() - t)
    return best


def mistakes():
    """(name, thunk) for each mistake; every thunk must raise."""
    x = np.arange(1, 9, dtype=np.float32)
    pm = lambda f, **kw: simpmd.pmap(f, axis_name="i", **kw)
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    return [
        ("ppermute perm with floats", lambda: pm(lambda v: lax.ppermute(v, "i", [(0.0, 1.5)]))(x)),
        ("collective with axis_name=None", lambda: pm(lambda v: lax.psum(v, None))(x)),
        ("in_axes as a list", lambda: simpmd.pmap(lambda a, b: a + b, in_axes=[0, None])(x, 1.0)),
        ("body returns a string", lambda: pm(lambda v: "done")(x)),
        ("np.exp on a device value", lambda: pm(lambda v: np.exp(v))(x)),
        ("static argnums as a name",
         lambda: simpmd.pmap(lambda v, n: v * n, static_broadcasted_argnums="n")(x, 2)),
        ("static argnums out of range",
         lambda: simpmd.pmap(lambda v, n: v * n, static_broadcasted_argnums=(2,))(x, 2)),
        ("unknown axis in shard_map",
         lambda: simpmd.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("data"),
                                  out_specs=P("data"))(x)),
        ("out_axes structure", lambda: pm(lambda v: (v, v), out_axes=(0, 0, 0))(x)),
        ("all_gather axis out of range",
         lambda: pm(lambda v: lax.all_gather(v, "i", axis=2))(x.reshape(8, 1))),
        ("result shapes differ", lambda: pm(lambda v: snp.zeros(int(v)), eager=True)(x)),
        ("perm from axis_index",
         lambda: pm(lambda v: lax.ppermute(v, "i", [(lax.axis_index("i"), 0)]))(x)),
        ("out_axes out of range", lambda: pm(lambda v: v, out_axes=3)(x)),
        ("mapped axis of size 0", lambda: pm(lambda v: v)(np.zeros((0, 3)))),
        ("shard_map not replicated",
         lambda: simpmd.shard_map(lambda v: v, mesh=mesh, in_specs=P(("data", "model")),
                                  out_specs=P())(x)),
        ("ppermute pair (0, -1)", lambda: pm(lambda v: lax.ppermute(v, "i", [(0, -1)]))(x)),
        ("psum_scatter of booleans",
         lambda: pm(lambda v: lax.psum_scatter(snp.stack([v > 0] * 8), "i"))(x)),
    ]


def time_to_errors(repeats):
    x = np.arange(1, 9, dtype=np.float32)
    correct = simpmd.pmap(lambda v: lax.psum(v, "i"), axis_name="i")
    base = timed(lambda: correct(x), repeats)
    print(f"Time to each error on 8 devices, as a ratio to a correct psum run "
          f"(baseline {base * 1e3:.2f} ms, best of {repeats})")
    for name, thunk in mistakes():
        try:
            thunk()
        except Exception as exc:
            length = len(str(exc))
            kind = type(exc).__name__
        else:
            raise AssertionError(f"{name}: the mistake ran without an error")
        t = timed(thunk, repeats)
        print(f"  {name:32s} {t / base:6.2f}x  {kind:28s} {length:5d} chars")


def deadlock_detection(sizes, repeats):
    print("\nDeadlock detection with eager=True: one device skips a psum the others wait in;"
          "\nratio to the same run in which every device joins the psum")

    def skip_one(v):
        if lax.axis_index("i") != 1:
            return lax.psum(v, "i")
        return v

    for n in sizes:
        simpmd.set_device_count(n)
        x = np.ones(n, dtype=np.float32)
        good = simpmd.pmap(lambda v: lax.psum(v, "i"), axis_name="i", eager=True)
        bad = simpmd.pmap(skip_one, axis_name="i", eager=True)
        try:
            bad(x)
        except simpmd.DeadlockError as exc:
            length = len(str(exc))
        else:
            raise AssertionError("the deadlock was not detected")
        t_good = timed(lambda: good(x), repeats)
        _diagnosis.clear()
        t_bad = timed(lambda: bad(x), repeats)
        print(f"  {n:6d} devices: correct {t_good:7.3f} s, deadlock reported in {t_bad:7.3f} s "
              f"({t_bad / t_good:4.2f}x; diagnosis {min(_diagnosis) * 1e3:6.1f} ms), "
              f"message {length} chars")
        assert length < 3000, f"the deadlock message on {n} devices is {length} characters"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="deadlocks up to 1024 devices")
    args = parser.parse_args()
    time_to_errors(repeats=5)
    sizes = [8, 1024] if args.quick else [8, 1024, 4096, 16384]
    deadlock_detection(sizes, repeats=2 if args.quick else 1)


if __name__ == "__main__":
    main()
