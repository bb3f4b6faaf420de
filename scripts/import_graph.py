"""Measure simpmd's import graph between its folders (issue 46 item 3).

Every module of the package is parsed with ``ast``; each import of a simpmd module, at the
top of the file or inside a function, is an edge from the importing module's *node* to the
imported one's. A node is a folder of the package (``core``, ``api``, ...) or a top-level
module (``lax``, ``numpy``, ...); the package's own ``__init__`` is the node ``simpmd``.

    python scripts/import_graph.py            # folder edges, with counts, and the circles
    python scripts/import_graph.py --modules  # each cross-folder import, file and line

``tests/test_layers.py`` reads :func:`imports` and holds the order written in
``docs/engine.md``.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "simpmd"


@dataclasses.dataclass(frozen=True)
class Import:
    source: str          # the importing module, dotted
    target: str          # the imported simpmd module, dotted
    line: int
    local: bool          # inside a function (run when it is called, not at import)
    path: str            # the importing file, relative to the repository


def modules() -> dict:
    """Every module of the package, dotted name -> path."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _walk(tree):
    """Every import node of ``tree`` with whether it lies inside a function."""
    def visit(node, local):
        for child in ast.iter_child_nodes(node):
            inner = local or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                yield child, local
            yield from visit(child, inner)
    yield from visit(tree, False)


def imports() -> list:
    """Every import of a simpmd module by a simpmd module, as :class:`Import` rows."""
    paths = modules()
    rows = []
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        for node, local in _walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (".".join(package[:len(package) - node.level + 1] + [node.module or ""])
                        if node.level else node.module or "").rstrip(".")
                targets = {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                           for a in node.names}
            else:
                targets = {a.name for a in node.names}
            for target in sorted(t for t in targets if t in paths and t != module):
                rows.append(Import(module, target, node.lineno, local,
                                   path.relative_to(ROOT).as_posix()))
    return rows


def node(module: str) -> str:
    """The folder (or top-level module) a dotted module name belongs to."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "simpmd"


def edges(rows=None) -> dict:
    """(from node, to node) -> [module-level count, function-level count], across nodes."""
    counts = collections.defaultdict(lambda: [0, 0])
    for r in rows if rows is not None else imports():
        a, b = node(r.source), node(r.target)
        if a != b and a != "simpmd":
            counts[a, b][r.local] += 1
    return dict(counts)


def circles(graph: dict) -> list:
    """Every simple cycle of ``graph`` (node -> nodes), each written from its least node."""
    found = set()
    for start in graph:
        stack = [(start, [start])]
        while stack:
            here, path = stack.pop()
            for nxt in graph.get(here, ()):
                if nxt == start and start == min(path):
                    found.add(" -> ".join(path + [start]))
                elif nxt not in path and nxt > start:
                    stack.append((nxt, path + [nxt]))
    return sorted(found)


def back_to_package(rows=None) -> list:
    """Imports of a package's own ``__init__`` by a module inside that package."""
    paths = modules()
    return [r for r in (rows if rows is not None else imports())
            if paths[r.target].name == "__init__.py" and r.source.startswith(r.target + ".")]


def main(argv):
    rows = imports()
    counts = edges(rows)
    print(f"{len(rows)} imports of simpmd modules, {sum(r.local for r in rows)} inside functions")
    print(f"{'from':>12} -> {'to':<12} module-level  in-function")
    for (a, b), (top, local) in sorted(counts.items()):
        print(f"{a:>12} -> {b:<12} {top:>12} {local:>12}")
    graph = collections.defaultdict(set)
    for a, b in counts:
        graph[a].add(b)
    cycles = circles(graph)
    print(f"{len(cycles)} folder-level circles")
    for c in cycles[:40]:
        print("  ", c)
    back = back_to_package(rows)
    print(f"{len(back)} imports of a package by its own submodule")
    for r in back:
        print(f"   {r.path}:{r.line} {r.source} -> {r.target}{' (in a function)' if r.local else ''}")
    if "--modules" in argv:
        for r in rows:
            if node(r.source) != node(r.target) and node(r.source) != "simpmd":
                print(f"{r.path}:{r.line} {node(r.source)} -> {node(r.target)} "
                      f"{r.target}{' (in a function)' if r.local else ''}")


if __name__ == "__main__":
    main(sys.argv[1:])
