"""jit as a pass changes no result: for every pinned program (tests/partitioner/
pinned_cases.py) the compiled text, the collectives jit inserts and the roofline are those
recorded on the code before the pass (``pinned.json``, written at e1f1f26), except where
``CHANGED`` says why (each a result that now matches JAX, or a program that now compiles)."""
import json
import re
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from pinned_cases import all_cases, record     # noqa: E402

with open(os.path.join(os.path.dirname(__file__), "pinned.json")) as fh:
    PINNED = json.load(fh)

# (case, part) -> why it differs from what was recorded before the pass
CHANGED = {
    ('slice_rows', 'text'): 'the collective-permute slice: before, what each device cut and sent was computed outside the program (a loose f32[4,8] input); now it is equations (slice_piece, ppermute, add), costed',
    ('slice_rows', 'roofline'): 'the collective-permute slice: before, what each device cut and sent was computed outside the program (a loose f32[4,8] input); now it is equations (slice_piece, ppermute, add), costed',
    ('slice_cols', 'text'): 'as slice_rows',
    ('slice_cols', 'roofline'): 'as slice_rows',
    ('slice_cols_20', 'text'): 'as slice_rows',
    ('slice_cols_20', 'roofline'): 'as slice_rows',
    ('slice_cols_31', 'text'): 'as slice_rows',
    ('slice_cols_31', 'roofline'): 'as slice_rows',
    ('concat_whole_dim', 'text'): 'before, the argument used twice was listed twice among the inputs',
    ('concat_numpy_constant', 'text'): 'a NumPy constant is now a literal of the program, not an extra input (the peak no longer counts it)',
    ('concat_numpy_constant', 'roofline'): 'a NumPy constant is now a literal of the program, not an extra input (the peak no longer counts it)',
    ('concat_numpy_34', 'text'): 'as concat_numpy_constant',
    ('concat_numpy_34', 'roofline'): 'as concat_numpy_constant',
    ('shard_map_partial_manual', 'text'): "before, the body's equations before the by-hand collective were lost (the product and tanh on blocks were missing): now the whole body, costed",
    ('shard_map_partial_manual', 'roofline'): "before, the body's equations before the by-hand collective were lost (the product and tanh on blocks were missing): now the whole body, costed",
    ('grad_through_shard_map', 'text'): "before, the backward shard_map's residuals were loose inputs; now they are the forward body's values (one connected program)",
    ('grad_through_shard_map', 'roofline'): "before, the backward shard_map's residuals were loose inputs; now they are the forward body's values (one connected program)",
    ('reshard_3', 'text'): 'before, a result that is its argument had no input (the program read an unbound variable)',
    ('reshard_3', 'roofline'): 'before, a result that is its argument had no input (the program read an unbound variable)',
    ('reshape_5', 'text'): 'as reshard_3',
    ('reshape_5', 'roofline'): 'as reshard_3',
    ('scan_of_products', 'text'): "a scan's body is now partitioned into the per-device scan (before it was missing from the program: no flops)",
    ('scan_of_products', 'roofline'): "a scan's body is now partitioned into the per-device scan (before it was missing from the program: no flops)",
    ('cond_in_jit', 'text'): 'lower().compile() of a cond raised before (TypeError on the predicate without values); now a per-device cond',
    ('shard_map_tp_layer', 'text'): "issue 45 item 19: psum_invariant's parameters printed as the running JAX prints them (no axis_index_groups)",
    ('cond_in_jit', 'roofline'): 'lower().compile() of a cond raised before (TypeError on the predicate without values); now a per-device cond',
    ('step_slice_split_dim', 'text'): "the slice's parameters fit the line up to the closing bracket, so they stay on it, as JAX prints this slice (jax 0.10.2, 0.12.0.1; issue 45 item 19)",
}

CASES = all_cases()


def canonical(text):
    """A compiled program's text with its variables named in order of first use: the pass
    lists a program's inputs in the arguments' order, the code before it by first use."""
    if not isinstance(text, str) or not text.startswith("{"):
        return text
    head, _, body = text.partition(". let")
    names = set(re.findall(r"\b([a-z]+):(?=[a-z]+[0-9]*\[|bool\[)", text))
    order = {}

    def rename(m):
        return order.setdefault(m.group(0), f"v{len(order)}") if m.group(0) in names else m.group(0)
    inputs = sorted(re.sub(r"\{V:[^}]*\}", "", t) for t in re.findall(r":(\S+)", head))
    return inputs, re.sub(r"(?<!')\b[a-z]+\b(?![='])", rename, body)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partitioned_program_is_what_it_was(case):
    now, before = record(case), PINNED[case.name]
    for part in ("text", "inserted", "roofline"):
        if (case.name, part) in CHANGED:
            continue
        if part == "text":
            assert canonical(now[part]) == canonical(before[part]), (now[part], before[part])
        else:
            assert now[part] == before[part], (part, now[part], before[part])
