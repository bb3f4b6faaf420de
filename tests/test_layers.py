"""simpmd's folders form layers (issue 46 item 3): each folder, and each top-level module,
imports only from those before it in the order written in docs/engine.md, counting
imports inside functions too; no package is imported back by a module inside it; and an
import inside a function is left only where it keeps an optional dependency optional,
saying so. The graph is read with ``ast`` by ``scripts/import_graph.py``."""
import collections
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import import_graph as graph  # noqa: E402

ORDER = re.search(r"^Layers: (.+)$", (ROOT / "docs/engine.md").read_text(), re.M).group(1)
ORDER = [name.strip() for name in ORDER.split(",")]
OPTIONAL = ("jax", "jaxlib", "jax_plugins", "matplotlib", "rich", "IPython", "ml_dtypes")


def _public(row) -> bool:
    """The course's ``import simpmd``: the public names, as a learner reaches them."""
    return row.target == "simpmd" and graph.node(row.source) in ("course", "exercises",
                                                                  "__main__")


def test_the_walk_sees_imports_inside_functions():
    rows = graph.imports()
    assert any(r.local and r.source == "simpmd.viz.timeline" and r.target == "simpmd.cost"
               for r in rows)
    assert graph.circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a -> b -> c -> a"]


def test_every_folder_and_top_level_module_has_a_place_in_the_order():
    nodes = {graph.node(m) for m in graph.modules()}
    assert sorted(nodes - set(ORDER)) == [], "add these to the Layers line of docs/engine.md"
    assert sorted(set(ORDER) - nodes) == []


def test_each_folder_imports_only_from_folders_before_it():
    place = {name: k for k, name in enumerate(ORDER)}
    upward = collections.defaultdict(list)
    for r in graph.imports():
        a, b = graph.node(r.source), graph.node(r.target)
        if a != b and place[b] > place[a] and not _public(r):
            upward[f"{a} -> {b}"].append(f"{r.path}:{r.line}")
    assert not upward, f"imports of a later layer: {dict(upward)}"


def test_no_folder_level_circle():
    edges = collections.defaultdict(set)
    for (a, b) in graph.edges():
        edges[a].add(b)
    assert graph.circles(edges) == []


def test_no_package_is_imported_back_by_its_own_modules():
    top = collections.defaultdict(set)
    for r in graph.imports():
        top[r.source].add(r.target)

    def reaches(a, b, seen=()):
        return a == b or any(reaches(n, b, seen + (a,)) for n in top[a] if n not in seen)
    back = [f"{r.path}:{r.line} imports {r.target}" for r in graph.back_to_package()
            if not _public(r) and reaches(r.target, r.source)]
    assert back == []


def test_imports_inside_functions_only_keep_an_optional_dependency_optional():
    import ast
    left = []
    for module, path in graph.modules().items():
        lines = path.read_text().splitlines()
        for node, local in graph._walk(ast.parse(path.read_text())):
            if not local:
                continue
            said = "optional" in lines[node.end_lineno - 1] or "optional" in lines[node.lineno - 2]
            named = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else ["." if node.level else node.module])
            optional = all(n.split(".")[0] in OPTIONAL for n in named)
            cost = module == "simpmd.viz.timeline"         # a timeline without simpmd.cost
            public = named == ["simpmd"] and graph.node(module) in ("course", "exercises")
            ours = all(n == "." or n.startswith("simpmd") for n in named)   # loads matplotlib
            if not (public or (said and (optional or cost or ours))):
                left.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert left == [], f"imports inside functions that keep nothing optional: {left}"
