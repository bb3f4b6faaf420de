"""Every primitive has every column it needs: its stacked implementation, its type rule,
its cost and its printed form, a derivative unless it is declared not differentiable, and
for a collective its math, its bytes on the wire, its cost family, its drawing and its lax
keywords. A primitive missing a column fails here, instead of costing 0 s or printing
nothing without a word."""
import ast
import pathlib

import numpy as np
import pytest

import simpmd
from simpmd import cost
from simpmd.core import collectives, control, core, loops, primitives  # noqa: F401 (rows)
import simpmd.plan  # noqa: F401  (the planner's rows: the list below is read at collection,
import simpmd.plan.serve  # noqa: F401  whichever test module was collected before this one)
from simpmd.viz import collectives as drawings

ROWS = sorted(core.PRIMITIVES)
# Not differentiable, as in JAX: integer and boolean results, pmax/pmin (JAX has no rule),
# the per-device NumPy tail and the callbacks, and the step of a jit
# program's per-device form that each device slices its block with.
NOT_DIFFERENTIABLE = {
    "eq", "ne", "lt", "le", "gt", "ge", "and", "or", "not", "xor", "shift_left",
    "shift_right_arithmetic", "shift_right_logical", "is_finite", "argmax", "argmin",
    "reduce_and", "reduce_or", "iota", "sort", "cumprod", "cummax", "cummin", "nextafter",
    "imag", "scatter-mul", "scatter-min", "scatter-max", "pmax", "pmin", "axis_index",
    "numpy_call", "debug_callback", "shard_slice", "slice_piece", "unreduce",
    "decode_attention"}  # plan.serve's inference-only attention (no backward pass is served)


@pytest.mark.parametrize("name", ROWS)
def test_every_primitive_has_every_column(name):
    row = core.PRIMITIVES[name]
    assert row.name == name
    assert callable(row.abstract), "type rule"
    assert callable(row.cost), "cost"
    assert callable(row.show), "printed parameters"
    assert (row.vjp is not None) != (name in NOT_DIFFERENTIABLE), "derivative"
    if row.collective:
        assert callable(row.wire_bytes) and callable(row.lax_params), "bytes, lax keywords"
        if name != "axis_index":
            assert callable(row.math), "math over a group"
            assert cost.collective_of(row.op) in cost.COLLECTIVES, "cost family"
            assert callable(drawings.DRAWINGS[row].after), "drawing"
    else:
        assert callable(row.stacked), "stacked implementation"


def test_the_cost_model_refuses_an_op_it_has_no_row_for():
    with pytest.raises(ValueError):
        cost.collective_of("pmystery")


def test_every_collective_simpmd_lax_exports_binds_a_row():
    """pshuffle and pswapaxes are a ppermute and an all_to_all, as in jax.lax."""
    control_flow = ("cond", "switch", "scan", "fori_loop", "while_loop", "pcast", "pvary")
    local = ("ragged_dot", "top_k")          # one device's arithmetic, not collectives
    exported = {n for n in simpmd.lax.__all__
                if n not in ("axis_index", "axis_size") + control_flow + local}
    assert exported - {"pshuffle", "pswapaxes"} == set(collectives.COLLECTIVES)
    assert np.all([callable(getattr(simpmd.lax, n)) for n in exported])


# -- one row per primitive across the package ----------------------------------------------------
# A fact about a primitive is a column of its row, set beside its definition or in the module
# that owns the concern (the sharding rules in api/partition.py, the drawings in
# viz/collectives.py, the costs in cost/), as JAX registers its rules by the primitive
# object. The modules below may still use primitives' names as keys, each for the reason given;
# anything else that keys a fact by a name fails the test below.
NAMED_FOR_A_REASON = {
    "api/spelling.py": "NumPy's function names (what a learner calls) mapped to their spellings",
    "api/checkpoint.py": "the checkpoint policies, which JAX calls with its own primitives",
    "sharding.py": "rules_table(): the sharding rules in words, keyed by what a learner writes",
    "jax/crosscheck.py": "a bug of JAX's own lax.pmean (unequal groups), looked for in a trace",
    "viz/dispatch.py": "the calls draw_dispatch draws, by the name the learner passes",
    "exercises/": "a lesson's checker asks the learner's trace which collectives ran",
    # the cost walker and the planner read JAX's programs as well as simpmd's, and know
    # JAX's primitives by name only (simpmd's own cost facts are columns: cost/rows.py)
    "cost/": "JAX's primitives in JAX's programs, and collective families by name",
    "plan/": "JAX's primitives in JAX's programs (flash attention, psum2, ...), by name",
}


def _names_in(node, names):
    elts = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return [e.value for e in elts if isinstance(e, ast.Constant) and e.value in names]


def name_keyed(source, names) -> set:
    """The primitives' names ``source`` uses as keys of a fact: a dict with two or more of
    them as keys, a module-level set, tuple or list of two or more, a comparison with a
    row's ``.name`` or ``.op``, or ``PRIMITIVES["..."]``."""
    tree, found = ast.parse(source), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant) and k.value in names]
            found.update(keys if len(keys) > 1 else ())
        elif isinstance(node, ast.Compare) and any(
                isinstance(x, ast.Attribute) and x.attr in ("name", "op")
                for x in [node.left] + node.comparators):
            for x in [node.left] + node.comparators:
                found.update(_names_in(x, names))
        elif isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "PRIMITIVES":
            found.update(_names_in(node.slice, names))
    for node in tree.body:
        if isinstance(node, ast.Assign) and not any(getattr(t, "id", "") == "__all__"
                                                     for t in node.targets):
            value = node.value.args[0] if isinstance(node.value, ast.Call) and node.value.args \
                else node.value
            listed = _names_in(value, names) if isinstance(value, (ast.Tuple, ast.List, ast.Set)) else []
            found.update(listed if len(listed) > 1 else ())
    return found


def test_the_name_keyed_detector_finds_what_it_should():
    names = {"psum", "pmax", "scan"}
    assert name_keyed('T = {"psum": 1, "pmax": 2}', names) == {"psum", "pmax"}
    assert name_keyed('if prim.name == "scan": pass', names) == {"scan"}
    assert name_keyed('if e.op in ("psum", "pmax"): pass', names) == {"psum", "pmax"}
    assert name_keyed('S = frozenset({"psum", "pmax"})', names) == {"psum", "pmax"}
    assert name_keyed('r = PRIMITIVES["scan"]', names) == {"scan"}
    assert name_keyed('f(x, "psum"); d = {"psum": 1}; __all__ = ["psum", "pmax"]', names) == set()


def test_no_module_keys_a_primitive_fact_by_its_name(capsys):
    root = pathlib.Path(simpmd.__file__).parent
    names = set(core.PRIMITIVES) | {getattr(r, "op", None) for r in core.PRIMITIVES.values()}
    by_primitive: dict = {}
    for path in sorted(root.rglob("*.py")):
        module = path.relative_to(root).as_posix()
        for name in name_keyed(path.read_text(), names - {None}):
            by_primitive.setdefault(name, []).append(module)
    with capsys.disabled():             # the table: for every primitive, who names it
        print("\n" + "\n".join(f"  {n:22s} {', '.join(m)}" for n, m in sorted(by_primitive.items())))
    stray = sorted({m for ms in by_primitive.values() for m in ms
                    if not any(m.startswith(prefix) for prefix in NAMED_FOR_A_REASON)})
    assert not stray, (f"{stray} key facts by a primitive's name: make each a column of the "
                       f"row, set on the primitive object (see NAMED_FOR_A_REASON)")
