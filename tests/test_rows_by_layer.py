"""A row's columns do not depend on what was imported: each module that defines rows or
registers their columns, imported alone in a fresh process, leaves every row it can see
with the columns it has once the whole package is imported (issue 46 item 2).

A later layer's columns live in its own table: the cost model's (simpmd/cost/rows.py, read
with ``column``), the partitioner's (simpmd/partitioner/columns.py, read with its ``column``)
and the printer's (``SHOWN`` and ``PRINTED`` in simpmd/api/printer.py); each is read here
too, after the module, as any reader of it would.
``SIMPMD_ROWS_ALL_MODULES=1`` checks every module of the package (slow: one process each).
"""
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simpmd"
WRITES_ROWS = re.compile(r"Primitive\(|register\(|attach\(|\bon\(|SHOWN\[|PRINTED\[|"
                        r"\.(drawing|show|printed) = ")

DUMP = r'''
import importlib, json, pkgutil, re, sys
import simpmd
names = sys.argv[1:]
if names == ["*"]:
    names = [m.name for m in pkgutil.walk_packages(simpmd.__path__, "simpmd.")]
for name in names:
    importlib.import_module(name)
from simpmd.core.core import PRIMITIVES
from simpmd.cost import rows
from simpmd.partitioner import columns
from simpmd.api import printer

def shown(v):
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(v))

json.dump({n: {**{k: shown(v) for k, v in vars(p).items()},
               **{"cost." + k: shown(v) for k, v in rows.TABLE.get(p, {}).items()},
               **{"partitioner." + k: shown(v) for k, v in columns.TABLE.get(p, {}).items()},
               **{"printer." + t: shown(table[p]) for t, table in
                  (("shown", printer.SHOWN), ("printed", printer.PRINTED)) if p in table}}
           for n, p in PRIMITIVES.items()}, sys.stdout)
'''


def _dump(*modules) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", DUMP, *modules], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def _modules() -> list:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if os.environ.get("SIMPMD_ROWS_ALL_MODULES") or WRITES_ROWS.search(path.read_text()):
            found.append(name)
    return ["simpmd", "simpmd.cost", *found]


def test_every_rows_columns_are_the_same_whatever_is_imported():
    everything = _dump("*")
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        alone = dict(zip(_modules(), pool.map(_dump, _modules())))
    differ = {}
    for module, seen in alone.items():
        for row, columns in seen.items():
            full = everything[row]
            changed = sorted(k for k in set(columns) | set(full) if columns.get(k) != full.get(k))
            if changed:
                differ.setdefault(module, {})[row] = changed
    assert not differ, f"imported alone, these rows have other columns than with everything: {differ}"


def test_every_row_holds_only_the_cores_declared_columns():
    """The schema is declared: the core's columns are the constructor's and those the
    ``Primitive`` class gives a default; with everything imported, no row holds another
    (a later layer's column lives in that layer's table); an undeclared column is an
    error to read, not a default."""
    import simpmd.plan, simpmd.viz, simpmd.jax  # noqa: F401  (every layer registered)
    from simpmd.core import primitives as P
    from simpmd.core.core import PRIMITIVES, Primitive
    from simpmd.partitioner.columns import TABLE, column, register
    declared = {k for k, v in vars(Primitive).items() if not k.startswith("_") and not callable(v)}
    declared |= {"name", "stacked", "abstract", "vjp", "cost", "show"}
    extra = {n: sorted(set(vars(r)) - declared) for n, r in PRIMITIVES.items()}
    assert not {n: e for n, e in extra.items() if e}, "columns no layer declared on the row"
    with pytest.raises(AttributeError):
        P.add.colour
    assert P.add.elementwise is True and P.dot_general.elementwise is False   # core, default
    assert column(P.dot_general, "defers_sums") is True
    assert column(P.add, "defers_sums") is False                             # its default
    assert "sharding" not in vars(P.add) and "sharding" in TABLE[P.add]
    with pytest.raises(KeyError, match="not a partitioner column"):
        register(P.add, elementwise=False)
    with pytest.raises(KeyError, match="not a partitioner column"):
        column(P.add, "colour")
