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


class Columns:
    """One layer's columns of the rows, in a table of its own: ``defaults`` names them (the
    schema: any other name is an error) with each one's default; ``register(row, ...)``
    writes a row's, ``column(row, name)`` reads one (the default where the row has none, or
    for no row). The partitioner's table is :data:`TABLE`; the cost model keeps its own
    (``simpmd/cost/rows.py``), as JAX's interpreters keep theirs."""

    def __init__(self, layer: str, where: str, **defaults):
        self.layer, self.where, self.defaults, self.table = layer, where, defaults, {}

    def _known(self, name):
        if name not in self.defaults:
            raise KeyError(f"{name!r} is not a {self.layer} column of a row; the {self.layer} "
                           f"columns are {', '.join(self.defaults)} ({self.where})")

    def register(self, row, **columns):
        """Give ``row`` these columns (each one of the table's names)."""
        for name in columns:
            self._known(name)
        self.table.setdefault(row, {}).update(columns)

    def column(self, row, name):
        """Row ``row``'s column ``name``, or its default when the row has none (or no row)."""
        self._known(name)
        found = self.table.get(row, {}) if row is not None else {}
        return found.get(name, self.defaults[name])


_COLUMNS = Columns(
    "partitioner", "simpmd/partitioner/columns.py", sharding=None, partition=None,
    combine=None, defers_sums=False, carries_sums=None, resolves_sums=False,
    unreduced_rule=None, unreduced_probe=None, unreduced_newest=None, unreduced_kind=None,
    unreduced_body=None, unreduced_word=None, divides=False)
TABLE, DEFAULTS = _COLUMNS.table, _COLUMNS.defaults      # row -> {column: value}; the schema
register, column = _COLUMNS.register, _COLUMNS.column
