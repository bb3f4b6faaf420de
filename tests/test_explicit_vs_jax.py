"""simpmd.jit with Explicit shardings against jax.jit: 37 programs, compared three ways.

For each program of tests/explicit_cases.py: both raise or neither; the result's sharding
type (jax.typeof(y).sharding.spec); the values, block by block; and the collectives,
counted by kind, in JAX's compiled HLO on 8 fake CPU devices. Where XLA on CPU chooses
other collectives than the simplest rule (``xla_differs``), the counts are not asserted
equal, but the test checks that they still differ, so that the note stays true.
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
from explicit_cases import CASES, SHARD_MAP_CASES     # noqa: E402
from simpmd.jax.jit import compare, jax_has_explicit_axes   # noqa: E402

if not jax_has_explicit_axes()[0]:
    pytest.skip(f"this JAX lacks {jax_has_explicit_axes()[1]}", allow_module_level=True)


@pytest.mark.parametrize("case", CASES + SHARD_MAP_CASES,
                         ids=[c.name for c in CASES + SHARD_MAP_CASES])
def test_same_as_jax(case):
    r = compare(case.fun, *case.args(), mesh=case.make_mesh(), in_specs=case.specs, name=case.name)
    assert r.raise_alike, (r.sim_error, r.jax_error)
    if r.jax_error:
        assert any(k in r.jax_error for k in ("ShardingTypeError", "TypeError", "ValueError"))
        return
    assert r.sim_types == r.jax_types
    assert r.values_agree
    if "Auto" in case.axis_types or case.xla_varies:   # XLA chooses, or its choice changes
        return
    if case.xla_differs:
        assert r.sim_collectives != r.jax_collectives, "XLA now agrees: drop the xla_differs note"
    else:
        assert r.sim_collectives == r.jax_collectives
