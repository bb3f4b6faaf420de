"""Pytrees: nested containers of arrays, flattened to a list of leaves and back.

Follows JAX's rules: tuples, lists, dicts (keys sorted) and namedtuples are containers,
``None`` is an empty container, everything else is a leaf.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ..core.values import StackedValue

@dataclass(frozen=True)
class TreeDef:
    """The shape of a pytree without its leaves."""

    kind: str                    # 'leaf', 'none', 'tuple', 'list', 'dict', 'namedtuple'
    node_type: Any = None        # the namedtuple class, for 'namedtuple'
    keys: tuple = ()             # dict keys in sorted order, for 'dict'
    children: tuple = ()

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def __str__(self) -> str:
        if self.kind == "leaf":
            return "*"
        if self.kind == "none":
            return "None"
        inner = ", ".join(str(c) for c in self.children)
        if self.kind == "dict":
            inner = ", ".join(f"{k!r}: {c}" for k, c in zip(self.keys, self.children))
            return "{" + inner + "}"
        if self.kind == "list":
            return "[" + inner + "]"
        if self.kind == "namedtuple":
            return f"{self.node_type.__name__}({inner})"
        return "(" + inner + ("," if len(self.children) == 1 else "") + ")"

LEAF = TreeDef("leaf")
_LEAVES = {int, float, complex, bool, str, bytes, np.ndarray, StackedValue}   # known leaves, fast

def _is_namedtuple(x) -> bool:
    return isinstance(x, tuple) and hasattr(type(x), "_fields")

def _children(x):
    """(kind, node_type, keys, child values) of a container, or None for a leaf."""
    if type(x) in _LEAVES:
        return None
    if x is None:
        return "none", None, (), ()
    if _is_namedtuple(x):
        return "namedtuple", type(x), (), tuple(x)
    if isinstance(x, tuple):
        return "tuple", None, (), x
    if isinstance(x, list):
        return "list", None, (), tuple(x)
    if isinstance(x, dict):
        try:
            keys = tuple(sorted(x))
        except TypeError:
            keys = tuple(x)
        return "dict", None, keys, tuple(x[k] for k in keys)
    return None

def flatten(tree) -> tuple[list, TreeDef]:
    """The leaves of ``tree`` in order, and its structure."""
    leaves: list = []

    def walk(x) -> TreeDef:
        node = _children(x)
        if node is None:
            leaves.append(x)
            return LEAF
        kind, node_type, keys, kids = node
        return TreeDef(kind, node_type, keys, tuple(walk(k) for k in kids))

    treedef = walk(tree)
    return leaves, treedef

def unflatten(treedef: TreeDef, leaves) -> Any:
    """Rebuild a pytree of structure ``treedef`` from ``leaves``."""
    it = iter(leaves)

    def build(td: TreeDef):
        if td.kind == "leaf":
            return next(it)
        if td.kind == "none":
            return None
        kids = [build(c) for c in td.children]
        if td.kind == "tuple":
            return tuple(kids)
        if td.kind == "list":
            return kids
        if td.kind == "dict":
            return dict(zip(td.keys, kids))
        return td.node_type(*kids)

    return build(treedef)

def tree_map(f, tree, *rest):
    """Apply ``f`` leaf by leaf to ``tree`` and trees of the same structure."""
    leaves, treedef = flatten(tree)
    others = [flatten(r)[0] for r in rest]
    return unflatten(treedef, [f(*xs) for xs in zip(leaves, *others)])

def leaf_paths(tree, prefix: str = "") -> list[str]:
    """A readable path for every leaf, e.g. ``[0]['w']``, in flatten order."""
    node = _children(tree)
    if node is None:
        return [prefix]
    kind, node_type, keys, kids = node
    if kind == "dict":
        labels = [f"[{k!r}]" for k in keys]
    elif kind == "namedtuple":
        labels = [f".{name}" for name in node_type._fields]
    else:
        labels = [f"[{i}]" for i in range(len(kids))]
    return [p for label, kid in zip(labels, kids) for p in leaf_paths(kid, prefix + label)]

def broadcast_prefix(prefix, tree, what: str = "in_axes") -> list:
    """Expand ``prefix`` (a pytree prefix of ``tree``) to one value per leaf of ``tree``.

    This is how ``in_axes=(0, None)`` or ``in_axes={'w': None, 'b': 0}`` reaches every
    leaf. A leaf of ``prefix`` covers a whole subtree of ``tree``; ``None`` in ``prefix``
    is a leaf (meaning "not mapped"), not an empty container.
    """
    out: list = []

    def walk(p, t, path):
        if p is None or _children(p) is None:
            out.extend([p] * len(flatten(t)[0]))
            return
        pkind, _, pkeys, pkids = _children(p)
        tnode = _children(t)
        if tnode is None or tnode[0] != pkind or len(tnode[3]) != len(pkids) or tnode[2] != pkeys:
            things, thing = (("results", "result") if what.startswith("out")
                             else ("arguments", "argument"))
            single = "P(...)" if what.endswith("specs") else "int/None"
            raise ValueError(
                f"{what} is not a prefix of the {things}' structure at {path or 'the top'}: "
                f"{what} has {flatten(p)[1]} where the {thing} is {flatten(t)[1]}. Give one "
                f"{what} entry per {thing}, or a single {single} for a whole subtree.")
        labels = [f"[{k!r}]" for k in pkeys] if pkind == "dict" else [f"[{i}]" for i in range(len(pkids))]
        for label, pk, tk in zip(labels, pkids, tnode[3]):
            walk(pk, tk, path + label)

    walk(prefix, tree, "")
    return out


def of_some_leaves(fun, treedef: TreeDef, leaves, where, out_trees: list, check=None):
    """``fun`` as a function of the leaves at positions ``where`` alone, the others held at
    ``leaves``' values: ``fun`` is called as ``fun(*args, **kwargs)`` with ``treedef``
    describing ``(args, kwargs)``, and the new function returns the flat leaves of its
    result, appending their structure to ``out_trees`` (after ``check(leaves, structure)``
    when given). The form every tracer needs: a program's inputs are the traced leaves."""
    def flat(*xs):
        full = list(leaves)
        for k, x in zip(where, xs):
            full[k] = x
        args, kwargs = unflatten(treedef, full)
        out, out_def = flatten(fun(*args, **kwargs))
        if check is not None:
            check(out, out_def)
        out_trees.append(out_def)
        return out
    return flat
