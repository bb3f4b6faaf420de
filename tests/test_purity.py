"""simpmd's engine depends on NumPy alone: importing it, or running a program on the
simulated mesh, must not import JAX or matplotlib (those are for the cross-checks and the
pictures, and are optional installs). Each check runs in a fresh interpreter, because this
test process has other tests' imports in it."""
import json
import pathlib
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

# A tiny program on the simulated mesh: a psum over 8 devices.
PMAP_PROGRAM = """
import numpy
out = simpmd.pmap(lambda x: simpmd.lax.psum(x, 'i'), axis_name='i')(numpy.arange(8.))
assert numpy.allclose(numpy.asarray(out), 28.0), numpy.asarray(out)
"""


def run_fresh(code: str) -> subprocess.CompletedProcess:
    """Run code in a new interpreter from the repository root; fail with its stderr."""
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        pytest.fail(f"the child interpreter failed:\n{result.stdout}\n{result.stderr}")
    return result


def heavy_modules_after(code: str) -> list[str]:
    """Which of jax, jaxlib and matplotlib are in sys.modules after running code."""
    result = run_fresh(code + """
import json, sys
print(json.dumps(sorted(m for m in sys.modules
                        if m.split('.')[0] in ('jax', 'jaxlib', 'matplotlib'))))
""")
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_import_simpmd_imports_no_jax_and_no_matplotlib():
    assert heavy_modules_after("import simpmd") == []


def test_running_a_pmap_program_imports_no_jax_and_no_matplotlib():
    assert heavy_modules_after("import simpmd" + PMAP_PROGRAM) == []


def test_engine_imports_only_numpy_and_the_standard_library():
    """Every top-level module that `import simpmd` and a pmap program add to sys.modules
    is simpmd itself, NumPy, or part of Python's standard library."""
    result = run_fresh("""
import json, sys
before = set(sys.modules)
import simpmd
""" + PMAP_PROGRAM + """
added = {m.split('.')[0] for m in set(sys.modules) - before}
print(json.dumps(sorted(added)))
""")
    added = set(json.loads(result.stdout.strip().splitlines()[-1]))
    allowed = {"simpmd", "numpy"} | set(sys.stdlib_module_names)
    assert sorted(added - allowed) == []


# The core: simpmd/core/, NumPy only. The JAX bridge, the drawings, the cost model and the
# course sit on top of it and register what the core calls (simpmd.core.bridge).
CORE = sorted(p.stem for p in (ROOT / "simpmd" / "core").glob("*.py") if p.stem != "__init__")


def _core_imports(module: str) -> tuple[set, set]:
    """(core modules, simpmd modules outside the core) that core/``module`` imports, at the
    top or inside a function."""
    import ast
    tree = ast.parse((ROOT / "simpmd" / "core" / f"{module}.py").read_text())
    inside, outside = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            names = [node.module] if node.module else [a.name for a in node.names]
            inside |= {n.split(".")[0] for n in names}
        elif isinstance(node, ast.ImportFrom) and node.level > 1:
            outside.add("." * node.level + (node.module or ""))
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("simpmd"):
            outside.add(node.module)
        elif isinstance(node, ast.Import):
            outside |= {a.name for a in node.names if a.name.startswith("simpmd")}
    return inside & set(CORE), outside


def test_the_core_imports_nothing_outside_itself():
    assert {"core", "program", "collectives", "run", "autodiff"} <= set(CORE)
    assert _core_imports("autodiff")[0] >= {"core", "program"}       # the walk sees imports
    leaks = {m: sorted(_core_imports(m)[1]) for m in CORE if _core_imports(m)[1]}
    assert leaks == {}, f"core modules that import simpmd outside simpmd/core: {leaks}"


def _circles(graph: dict) -> list:
    """Every import path of ``graph`` (module -> modules it imports) that comes back to its
    start, found depth-first from each module, sorted."""
    circles = set()
    for start in graph:
        stack = [(start, [start])]
        while stack:
            node, path = stack.pop()
            for nxt in graph[node]:
                if nxt == start:
                    circles.add(" -> ".join(path + [start]))
                elif nxt not in path:
                    stack.append((nxt, path + [nxt]))
    return sorted(circles)


def test_the_core_reads_top_down_without_import_circles():
    graph = {m: _core_imports(m)[0] for m in CORE}
    assert "core" in graph["run"]
    circles = _circles(graph)
    assert not circles, "modules that import each other:\n" + "\n".join(circles[:10])


def test_the_bridges_register_themselves():
    """`import simpmd` fills in what the core calls outside itself."""
    result = run_fresh("""
import simpmd
from simpmd.core import bridge
print(bridge.eager.__name__, bridge.jax.__name__, simpmd.shard_map.on_jax.__name__)
""")
    assert result.stdout.split() == ["simpmd.eager.scheduler", "simpmd.jax.handoff", "shard_map_on_jax"]


def test_no_function_of_the_package_is_longer_than_60_lines():
    """The package is read in an afternoon or two: every function fits on a screen."""
    import ast
    long = []
    for path in sorted((ROOT / "simpmd").rglob("*.py")):
        module = path.relative_to(ROOT / "simpmd").as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > 60:
                    long.append(f"{module}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over 60 lines: " + ", ".join(long)


def _package_imports() -> dict:
    """simpmd's modules and the simpmd modules each imports, at the top or inside a
    function. An import of the package itself (``import simpmd``, as the course does to
    reach the public names) is not an edge: the package only gathers its modules' names."""
    import ast
    paths = {}
    for path in (ROOT / "simpmd").rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        paths[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for module, path in paths.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = (".".join(package[:len(package) - node.level + 1] + [node.module or ""])
                        if node.level else node.module or "").rstrip(".")
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in paths else base
                            for a in node.names}
            elif isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
        graph[module] = {t for t in targets if t in paths and t not in (module, "simpmd")}
    return graph


def test_the_package_reads_top_down_without_import_circles():
    graph = _package_imports()
    assert "simpmd.api.jit_call" in graph["simpmd.api.jit"]      # the walk sees imports,
    assert "simpmd.partitioner.sharded" in graph["simpmd.api.jaxpr"]   # inside functions too
    circles = _circles(graph)
    assert not circles, "modules that import each other:\n" + "\n".join(circles[:10])


def test_the_core_fits_in_3000_lines():
    """Issue 28's budget: the whole of simpmd/core, docstrings and blank lines counted, is at
    most 3,000 lines (it was 6,994 before the one-table core)."""
    counts = {p.name: len(p.read_text().splitlines())
              for p in (ROOT / "simpmd" / "core").glob("*.py")}
    assert 2000 < sum(counts.values()) <= 3000, counts


def test_the_core_sees_a_jax_tracer_in_a_nested_argument():
    """The front ends hand a call to JAX when any argument, however nested, is a JAX tracer
    (bridge.inside_jax; the core walks tuples, lists and dicts itself: pytrees live outside
    it)."""
    jax = pytest.importorskip("jax")
    from simpmd.core import bridge
    seen = []

    def f(x):
        seen.append([bridge.holds_jax_tracer(v) for v in
                     (x, [1.0, {"a": (x,)}], {"b": [2.0]}, (), 3.0)])
        return x
    jax.jit(f)(1.0)
    assert seen == [[True, True, False, False, False]]
