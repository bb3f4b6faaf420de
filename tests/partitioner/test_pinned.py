"""jit as a pass changes no result: for every pinned program (tests/partitioner/
pinned_cases.py) the compiled text, the collectives jit inserts and the roofline are those
recorded on the code before the pass (``pinned.json``, written at e1f1f26), except where
``CHANGED`` says why (each a result that now matches JAX, or a program that now compiles)."""
import json
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pinned_cases import all_cases, record     # noqa: E402

with open(os.path.join(os.path.dirname(__file__), "pinned.json")) as fh:
    PINNED = json.load(fh)

# (case, part) -> why it differs from what was recorded before the pass
CHANGED = {
}

CASES = all_cases()


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partitioned_program_is_what_it_was(case):
    now, before = record(case), PINNED[case.name]
    for part in ("text", "inserted", "roofline"):
        if (case.name, part) in CHANGED:
            continue
        assert now[part] == before[part], (part, now[part], before[part])
