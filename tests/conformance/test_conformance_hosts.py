"""JAX's multi-process tests, ported: every case of cases_hosts.py on simpmd's simulated
processes and on 4 real JAX processes x 2 CPU devices, every process's view compared
(its results' addressable shards, values, what it printed, error or not).

The real processes start once for the whole module and run every case in one launch
(starting JAX in 4 processes takes seconds); each case is then its own test, so one
case's failure costs no other. A case that raises inside a process is an outcome, not a
crash of the launch (simpmd/jax/multiprocess.py's worker catches it).
"""
import pytest

from . import cases_hosts
from .cases_hosts import HOST_CASES


@pytest.fixture(scope="module")
def real_processes(jax8):
    from simpmd.jax.multiprocess import run_on_jax
    run = run_on_jax([c.main for c in HOST_CASES], 4, 2, timeout=240, hang_timeout=20)
    print(f"{len(HOST_CASES)} programs on 4 JAX processes x 2 CPU devices: {run.seconds:.1f} s")
    return run


def test_host_case_names_are_unique():
    names = [c.name for c in HOST_CASES]
    assert len(names) == len(set(names))
    assert all(getattr(cases_hosts, n) is c.main for n, c in zip(names, HOST_CASES))


@pytest.mark.parametrize("k", range(len(HOST_CASES)), ids=[c.name for c in HOST_CASES])
def test_every_process_agrees_with_jax(real_processes, k, request):
    from simpmd.jax.multiprocess import compare_outcomes, run_on_simpmd
    case = HOST_CASES[k]
    if case.xfail:
        request.applymarker(pytest.mark.xfail(strict=True, reason=case.xfail))
    real = real_processes.outcomes[k]
    assert k not in real_processes.hung, real_processes.hung[k]
    assert all(o is not None for o in real), f"{case.name}: a JAX process never got here"
    raised = [o.get("error") for o in real if "error" in o]
    assert bool(raised) == case.raises, (
        f"{case.name} expects JAX to {'raise' if case.raises else 'return'}; JAX's processes: "
        f"{[(o.get('error'), o.get('message')) for o in real]} (follows {case.follows})")
    sim = run_on_simpmd([case.main], 4, 2)[0]
    verdict, found = compare_outcomes(sim, real)
    assert not found, f"{case.name} (follows {case.follows}):\n  " + "\n  ".join(found[:8])
