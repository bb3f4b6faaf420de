"""Every primitive has every column it needs: its stacked implementation, its type rule,
its cost and its printed form, a derivative unless it is declared not differentiable, and
for a collective its math, its bytes on the wire, its cost family, its drawing and its lax
keywords. A primitive missing a column fails here, instead of costing 0 s or printing
nothing without a word."""
import numpy as np
import pytest

import simpmd
from simpmd import cost
from simpmd.core import collectives, control, core, loops, primitives  # noqa: F401 (rows)
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
    "numpy_call", "debug_callback", "shard_slice"}


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
            assert row.op in drawings.DRAWING, "drawing"
    else:
        assert callable(row.stacked), "stacked implementation"


def test_the_cost_model_refuses_an_op_it_has_no_row_for():
    with pytest.raises(ValueError):
        cost.collective_of("pmystery")


def test_every_collective_simpmd_lax_exports_binds_a_row():
    """pshuffle and pswapaxes are a ppermute and an all_to_all, as in jax.lax."""
    control_flow = ("cond", "switch", "scan", "fori_loop", "while_loop", "pcast", "pvary")
    exported = {n for n in simpmd.lax.__all__ if n not in ("axis_index", "axis_size") + control_flow}
    assert exported - {"pshuffle", "pswapaxes"} == set(collectives.COLLECTIVES)
    assert np.all([callable(getattr(simpmd.lax, n)) for n in exported])
