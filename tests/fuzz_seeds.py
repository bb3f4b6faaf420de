"""Seeds for the random-program generators: the committed regression seeds, and one new
seed per run.

Every generator of random programs in tests/ draws from a seed. The seeds in
``REGRESSION`` are committed: the programs they draw must agree, and a failure fails CI.
Each run also draws from a NEW seed, the same for every generator and every pytest worker:
``SIMPMD_FUZZ_SEED`` when it is set (to replay a run), otherwise a random one that
tests/conftest.py chooses once, exports for the xdist workers and prints. A test drawn from
the new seed carries the ``new_seed`` mark: when it fails, conftest reports it as an
expected failure and in the run's summary (with the line that replays it), without failing
CI; whoever sees it fixes the cause and adds the seed to ``REGRESSION`` here.
"""
import os

import pytest

ENV = "SIMPMD_FUZZ_SEED"

# generator -> the seeds every run draws (docs/testing.md: how to add one)
REGRESSION = {
    "nesting": [2026],             # tests/nesting_programs.py, test_nesting_vs_jax.py
    "explicit": [29, 114241280],   # tests/explicit_cases.py random_cases, test_explicit_vs_jax.py
    "unreduced": [0],              # tests/unreduced_cases.py, test_unreduced.py
    "vma": [5],                    # test_vma.py programs (the shape-derived seeds stay too)
    "scan": list(range(20)),       # test_loops.py random_body
    "cost_walk": list(range(5)),   # test_cost_walk.py _random_program
}


def new_seed() -> int:
    """This run's new seed (set by tests/conftest.py before collection)."""
    value = os.environ.get(ENV)
    if value is None:              # outside pytest (a script importing a test module)
        return 0
    return int(value)


def new_seed_param(value_of=lambda seed: seed, id_of=lambda seed: f"new-seed{seed}") -> list:
    """This run's new seed alone, as a one-item list of pytest params marked ``new_seed``."""
    fresh = new_seed()
    return [pytest.param(value_of(fresh), id=id_of(fresh), marks=pytest.mark.new_seed)]


def seeds(generator: str) -> list:
    """The regression seeds of ``generator``, then this run's new seed, marked ``new_seed``
    (as pytest params; a new seed equal to a regression seed is left out)."""
    fixed = REGRESSION[generator]
    params = [pytest.param(s, id=f"seed{s}") for s in fixed]
    fresh = new_seed()
    if fresh not in fixed:
        params.append(pytest.param(fresh, id=f"new-seed{fresh}", marks=pytest.mark.new_seed))
    return params
