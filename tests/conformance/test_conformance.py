"""JAX's own tests, ported: each case runs on simpmd and on real JAX (8 fake CPU devices)
and must agree on values, shapes, dtypes, sharding types and shardings, or both raise.

One parametrized test per case, so that one case's failure or crash costs no other. A case
whose JAX outcome is not the one the case expects (``raises``) fails too: a typo that makes
both engines raise must not pass as agreement. Where simpmd differs from JAX for a reason
filed in issue 45, the case is a strict xfail naming the item: the day it is fixed, the
marker must come off. docs/testing.md says which of JAX's test files each module follows.
"""
import pytest

import simpmd

from . import cases_control, cases_shard_map, cases_types, cases_unreduced
from .engines import differences, run_case

CASES = (cases_shard_map.CASES + cases_control.CASES + cases_types.CASES
         + cases_unreduced.CASES)


def test_case_names_are_unique():
    names = [c.name for c in CASES]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_agrees_with_jax(jax8, case, request):
    if case.needs is not None and case.needs(jax8):
        pytest.skip(f"{case.name}: {case.needs(jax8)}")
    reason = case.xfail_reason(jax8)
    if reason:
        request.applymarker(pytest.mark.xfail(strict=True, reason=reason))
    real = run_case(jax8, case)
    assert (real.error is not None) == case.expected_error(jax8), (
        f"the case expects JAX to {'raise' if case.expected_error(jax8) else 'return'}; "
        f"JAX {real.error or 'returned'} (follows {case.follows})")
    sim = run_case(simpmd, case)
    found = differences(sim, real, case)
    assert not found, f"{case.name} (follows {case.follows}):\n  " + "\n  ".join(found)
