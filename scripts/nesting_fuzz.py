"""The long draw of the nesting fuzzer: random programs that nest JAX's transformations,
run on simpmd and on real JAX (8 fake CPU devices), and how many agree.

    python scripts/nesting_fuzz.py [count] [seed]      # default: 1000 programs, seed 0

Prints the count of agreeing programs, the count per transformation and per family
(the layers, outer to inner), and every program that differs with what each engine did.
docs/testing.md holds the last run's numbers. tests/conformance/test_nesting_vs_jax.py runs a quick
draw of the same generator in the test suite.
"""
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

import numpy as np  # noqa: E402

import simpmd  # noqa: E402
from simpmd.jax.devices import prepare  # noqa: E402

prepare(8)
import jax  # noqa: E402

import nesting_programs as N  # noqa: E402


def main(count=1000, seed=0):
    from simpmd.jax.handoff import follow_rules
    follow_rules(jax, jax.devices()[0])
    theirs, ours = N.Engine("jax"), N.Engine("simpmd")
    results, differ, start = [], [], time.time()
    for k, program in enumerate(N.draw(seed, count)):
        if os.environ.get("NESTING_VERBOSE"):
            print(f"#{k} {program}", file=sys.stderr, flush=True)
        if N.crashes_jax(program):
            results.append((program, None))
            continue
        agreed, a, b, why = N.compare(theirs, ours, program)
        results.append((program, agreed))
        if agreed is None:
            print(f"  #{k} {program}: left out, {why}: {a.error}", file=sys.stderr)
        elif not agreed:
            differ.append((k, program, why, a, b))
    summary, by_family = N.report(results)
    print(f"jax {jax.__version__}, seed {seed}, {time.time() - start:.0f} s")
    print(summary)
    print("families:")
    for family, (a, n) in sorted(by_family.items()):
        print(f"  {a}/{n}  {family}")
    print(f"{len(differ)} differ:")
    for k, program, why, a, b in differ:
        print(f"  #{k} {program}: {why}\n      jax:    {a.error or a.type_text}\n"
              f"      simpmd: {b.error or b.type_text}")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
