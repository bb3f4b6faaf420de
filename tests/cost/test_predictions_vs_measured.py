"""simpmd's predicted times against times measured on real GPUs (simpmd.jax.device_programs.
RECORDED: an H200 and an H100 with jax 0.11.2, recorded in issue 36 and docs/DESIGN.md).

No parameter of the presets was chosen from these measurements: the sustained rates, the
floors and the network come from the published sources each preset cites. The target
(issue 36): every program within 0.67-1.5x of its measured time, the geometric mean within
1.25x, programs under 50 us left out. Where a program misses, the miss is written down
here (KNOWN_MISSES) and in docs/benchmarks.md, not tuned away.
"""
import math

import pytest

from simpmd import cost as C
from simpmd.cost.roofline import _rate_dtype
from simpmd.jax import device_programs as dp

# A recorded program is pinned when the lower bound the issue printed for it (simpmd's roofline
# before this work) is what that roofline gives for our program: then it is the program that
# ran. The LLaMA layers were not written down in full, and ours give another lower bound.
NOT_PINNED = {"transformer layer, 4096 tokens (LLaMA-70B sizes)", "gradient: transformer layer"}
KNOWN_MISSES = {
    # memory-bound: streaming 2 GiB at the H100's published 86.7% of peak HBM bandwidth
    # applied to the H200's 4.8 TB/s predicts 0.55 ms; XLA's kernel took 0.85 ms (2.5 TB/s)
    "elementwise 2x+1, 1 GiB bf16": (0.55, 0.67),
    # a call from Python: JAX's published dispatch benchmark (31.5 us) is half of the 60 us
    "bf16 matmul 1024^3": (0.5, 0.67),
}


def _every_equation(program):
    for eqn in C.walk._equation_list(program):
        kind, bodies = C.walk.nested(eqn)
        yield from ([eqn] if kind is None else (e for b in bodies for e in _every_equation(b)))


def _old_lower_bound(program, hw):
    """The Scaling Book's lower bound as simpmd computed it before (dots at their dtype's
    rate, every equation's bytes, the ones nothing reads too): what issue 36 printed."""
    compute = nbytes = 0.0
    for eqn in _every_equation(program):
        flops, b = C.walk.flops_and_bytes(eqn)
        matmul = C.rows.column(C.walk._row(eqn), "matmul")
        compute += flops / hw.peak_flops(_rate_dtype(eqn, matmul)) if flops else 0.0
        nbytes += b
    return max(compute, nbytes / hw.hbm_bandwidth)


@pytest.fixture(scope="module")
def rows(jax8):
    out = []
    for name, preset, measured, version, source, issue_lower_ms in dp.RECORDED:
        fn, args = dp.find(name).at(1)
        program = jax8.make_jaxpr(fn)(*args)
        r = C.roofline_of(program, hardware=preset)
        lower = _old_lower_bound(program, C.HARDWARE[preset])
        pinned = issue_lower_ms is None or abs(lower * 1e3 / issue_lower_ms - 1) < 0.02
        out.append(dict(name=name, preset=preset, measured=measured, predicted=r.predicted_s,
                        pinned=pinned, bound=r.bound))
    return out


def test_every_recorded_program_is_the_one_that_ran(rows):
    assert {r["name"] for r in rows if not r["pinned"]} == NOT_PINNED


def test_each_program_within_the_target(rows):
    ratios = {r["name"]: r["predicted"] / r["measured"] for r in rows if r["pinned"]}
    for name, ratio in ratios.items():
        low, high = KNOWN_MISSES.get(name, (0.67, 1.5))
        assert low <= ratio <= high, (name, ratio)


def test_geometric_mean_within_target(rows):
    judged = [r["predicted"] / r["measured"] for r in rows
              if r["pinned"] and r["measured"] >= dp.LAUNCH_BOUND_S]
    g = math.exp(sum(map(math.log, judged)) / len(judged))
    assert 1 / 1.25 <= g <= 1.25, g


def test_the_bound_verdicts(rows):
    """What each program waits on: big matmuls on compute, streaming on memory, the
    1024^3 matmul from Python on the call itself."""
    bound = {r["name"]: r["bound"] for r in rows}
    assert bound["bf16 matmul 8192^3"] == bound["f32 matmul 8192^3 (DEFAULT)"] == "compute"
    assert bound["RMSNorm 16384x8192 bf16"] == bound["sum of 1 GiB f32"] == "memory"
    assert bound["bf16 matmul 1024^3"] == "launch"
