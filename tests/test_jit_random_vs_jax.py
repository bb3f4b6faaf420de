"""Random programs with sharding types on simpmd and on real JAX: both raise or neither,
and where both run, the same type and the same values on every device.

The programs (tests/explicit_cases.py, ``random_cases``) draw an operation (elementwise,
where, dot/matmul/einsum with and without out_sharding, reductions, transposes, reshapes,
slices with steps, indexing, concatenate with arrays and NumPy constants, reshard, and
gradients through them), random shapes and random shardings of its arguments over 1-D
and 2-D meshes, and run under jit and, for some, operation by operation. The collectives
are not compared here (XLA on CPU may route the same rule otherwise; the named cases of
test_explicit_vs_jax.py compare them).
"""
import os
import sys

if "--xla_force_host_platform_device_count=" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import pytest

jax = pytest.importorskip("jax")
if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices (XLA_FLAGS=--xla_force_host_platform_device_count=8)",
                allow_module_level=True)

sys.path.insert(0, os.path.dirname(__file__))
from explicit_cases import random_cases               # noqa: E402
from simpmd.jax.jit import compare, jax_has_explicit_axes   # noqa: E402

if not jax_has_explicit_axes()[0]:
    pytest.skip(f"this JAX lacks {jax_has_explicit_axes()[1]}", allow_module_level=True)

CASES = random_cases(240, seed=29)


def _check(r):
    assert r.raise_alike, (r.sim_error, r.jax_error)
    if r.sim_error is None:
        assert r.sim_types == r.jax_types
        assert r.values_agree


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_under_jit(case):
    _check(compare(case.fun, *case.args(), mesh=case.make_mesh(), in_specs=case.specs,
                   name=case.name, hlo=False))


@pytest.mark.parametrize("case", CASES[::4], ids=[c.name for c in CASES[::4]])
def test_operation_by_operation(case):
    _check(compare(case.fun, *case.args(), mesh=case.make_mesh(), in_specs=case.specs,
                   name=case.name, hlo=False, jit=False))
