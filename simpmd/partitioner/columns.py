"""The partitioner's columns of each row, in the partitioner's own table (as the cost model
keeps its own in ``simpmd/cost/rows.py``): a row of the core is the same object whatever is
imported, and its partitioner columns are read with :func:`column`. The columns and
their defaults:

* ``sharding(mesh, avals, **params)``: the result's shardings from the operands' (``rules.py``);
* ``partition(avals, outs, **params)``: the plan that says which blocks each device computes
  and what it moves (``plans.py``);
* ``combine``: the collective that adds up a reduction's partial results;
* ``defers_sums``: a product's partial sums wait for their next use;
* ``carries_sums(in, out)``: a layout-only, linear row passes pending partial sums on;
* ``resolves_sums``: pending partial sums end here (``reshard``);
* ``unreduced_rule``, ``unreduced_probe``, ``unreduced_newest``, ``unreduced_kind``,
  ``unreduced_body``, ``unreduced_word``, ``divides``: what a row makes of unreduced and
  reduced operands (``unreduced.py`` says each).
"""
from __future__ import annotations

DEFAULTS = dict(sharding=None, partition=None, combine=None, defers_sums=False,
                carries_sums=None, resolves_sums=False, unreduced_rule=None,
                unreduced_probe=None, unreduced_newest=None, unreduced_kind=None,
                unreduced_body=None, unreduced_word=None, divides=False)

TABLE: dict = {}     # row -> {column: value}, the columns it was registered with


def _known(name):
    if name not in DEFAULTS:
        raise KeyError(f"{name!r} is not a partitioner column of a row; they are "
                       f"{', '.join(DEFAULTS)} (simpmd/partitioner/columns.py)")


def register(row, **columns):
    """Give ``row`` these partitioner columns (each one of :data:`DEFAULTS`'s names)."""
    for name in columns:
        _known(name)
    TABLE.setdefault(row, {}).update(columns)


def column(row, name):
    """Row ``row``'s partitioner column ``name``, or its default where it has none."""
    _known(name)
    return TABLE.get(row, {}).get(name, DEFAULTS[name])


class on:
    """``on(row).sharding = rule``: the same as ``register(row, sharding=rule)``."""

    __slots__ = ("_row",)

    def __init__(self, row):
        object.__setattr__(self, "_row", row)

    def __setattr__(self, key, value):
        register(self._row, **{key: value})
