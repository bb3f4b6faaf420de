"""The run a jit body is traced on: values typed by their sharding.

A :class:`ShardingRun` computes types only, as JAX's abstract evaluation under Explicit
axes does: each result's type is its global shape with the sharding its row's rule gives
(``rules.py``: ``f32[16@data,64@model]``), or the error JAX raises. What each device then
computes is decided once, afterwards, by the pass (``partition.py``). Inside
``shard_map(axis_names=...)`` the manual axes are by hand: collectives over them are the
learner's, and values vary over them as under shard_map.
"""
from __future__ import annotations

from ..core import errors
from ..core.core import aval_of
from ..core.run import Run
from ..core.values import StackedValue
from .columns import column
from . import unreduced
from .sharding import Sharding, ShardingTypeError, block_shape, check_layout, dims_of


class ShardingRun(Run):
    """The devices of ``mesh``, computing types typed by sharding (``manual``: the axes of
    an enclosing ``shard_map(axis_names=...)``, by hand)."""

    def __init__(self, mesh, *, manual=(), check_vma=False):
        super().__init__(list(mesh.devices.flat), tuple(mesh.shape.items()), abstract=True,
                         maps_a_mesh=True, check_vma=check_vma)
        self.mesh, self.manual_axes = mesh, tuple(manual)

    def tracing(self) -> "ShardingRun":
        return ShardingRun(self.mesh, manual=self.manual_axes, check_vma=self.check_vma)

    def prepare(self, prim, args, params):
        return super().prepare(prim, args, params) if self.manual_axes else args

    def by_hand(self, prim, params) -> bool:
        """A collective over the manual axes of a shard_map(axis_names=...) body."""
        return by_hand(prim, params, self.manual_axes)

    def block_shape(self, aval) -> tuple:
        return block_shape(aval.shape, dims_of(aval), self.mesh)

    def apply(self, prim, args, params):
        if self.by_hand(prim, params):
            return super().apply(prim, args, params)
        if prim.collective or prim.by_axes:
            raise errors.UnboundAxisError(
                f"{prim.name} over {params.get('axes', params.get('axis_name'))} inside jit, "
                f"outside shard_map: under jit the compiler writes the collectives, and a "
                f"named axis exists only inside shard_map (real JAX: 'unbound axis name'). "
                f"Write the computation for whole arrays, or wrap the per-device part in "
                f"simpmd.shard_map.")
        rule = column(prim, "sharding")
        if rule is None:
            raise ShardingTypeError(f"{prim.name} has no sharding rule in simpmd, so it cannot "
                                    f"run under jit outside shard_map.")
        avals = [aval_of(x) for x in args]
        out = prim.abstract(*avals, **params)
        outs = list(out) if prim.multiple_results else [out]
        layouts = rule(self.mesh, avals, **params)
        kinds = unreduced.types(prim, avals, params, len(outs), self.mesh)
        outs = [o.update(vma=o.vma if self.manual_axes else frozenset(),
                         sharding=Sharding(self.mesh, d, *k))
                for o, d, k in zip(outs, layouts, kinds)]
        for o in outs:
            check_layout(self.mesh, o.shape, o.sharding.dims, prim.name)
        return [StackedValue(o) for o in outs]


def by_hand(prim, params, manual) -> bool:
    """Whether ``prim`` is a collective over the manual axes ``manual`` only."""
    names = params.get("axes", params.get("axis_name"))
    names = names if isinstance(names, (tuple, list)) else (names,)
    return (prim.collective or prim.by_axes) and bool(manual) and \
        set(names) <= set(manual)
