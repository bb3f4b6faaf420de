"""Every collective has a row in every table that a collective needs: its math, the bytes
it puts on the wire, its cost family, its drawing, its transpose, its type rule and its
name in a printed program. A collective missing from the cost table used to cost 0.0 s
without a word; now a missing row fails here, and the cost model raises."""
import numpy as np
import pytest

import simpmd
from simpmd.core import autodiff, collectives, program
from simpmd import cost
from simpmd.core.batching import _describe_collective
from simpmd.viz import collectives as drawings

OPS = sorted(collectives.MATH)
NOT_DIFFERENTIABLE = {"pmax", "pmin"}   # no transpose in simpmd.grad (the gradient of a max is refused)


@pytest.mark.parametrize("op", OPS)
def test_every_collective_has_every_row(op):
    assert op in collectives.WIRE_BYTES, "bytes on the wire"
    assert cost.collective_of(op) in cost.COLLECTIVES, "cost family"
    assert op in drawings.DRAWING, "drawing"
    assert op in autodiff.TRANSPOSE or op in NOT_DIFFERENTIABLE, "transpose for simpmd.grad"
    params = {"axis": 0, "tiled": False, "scatter_dimension": 0, "perm": ((0, 1),),
              "split_axis": 0, "concat_axis": 0}
    name, printed = _describe_collective(op, ("i",), params, None, 8)
    assert name in program.VMA_RULES, "vma rule under shard_map(check_vma=True)"


def test_the_cost_model_refuses_an_op_it_has_no_row_for():
    with pytest.raises(ValueError):
        cost.collective_of("pmystery")


def test_the_list_of_collectives_is_the_list_simpmd_lax_exports():
    exported = {n for n in simpmd.lax.__all__ if n not in ("axis_index", "axis_size", "cond", "switch")}
    assert exported == set(OPS)
    assert np.all([callable(getattr(simpmd.lax, n)) for n in OPS])
