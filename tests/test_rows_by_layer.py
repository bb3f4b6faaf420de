"""A row's columns do not depend on what was imported: each module that defines rows or
registers their columns, imported alone in a fresh process, leaves every row it can see
with the columns it has once the whole package is imported (issue 46 item 2).

The cost model's columns live in its own table (simpmd/cost/rows.py, read with
``column``), which is read here too, after the module, as any reader of it would.
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
WRITES_ROWS = re.compile(r"Primitive\(|register\(|attach\(|\.(drawing|show|printed) = ")

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

def shown(v):
    if callable(v) and hasattr(v, "__qualname__"):
        return f"{getattr(v, '__module__', '')}.{v.__qualname__}"
    return re.sub(r" at 0x[0-9a-f]+", "", repr(v))

json.dump({n: {**{k: shown(v) for k, v in vars(p).items()},
               **{"cost." + k: shown(v) for k, v in rows.TABLE.get(p, {}).items()}}
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
