"""The course notebooks: committed executed, starting with the shared set-up cell.

nbval itself re-runs every notebook and compares its outputs (pytest --nbval, see
pyproject.toml); these tests check what nbval cannot: that nothing was committed
unexecuted, and that every lesson starts the same way.
"""
import json
import pathlib
import re

import pytest

import simpmd.course

ROOT = pathlib.Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def code_cells(path):
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def test_there_is_a_course():
    assert len(NOTEBOOKS) >= 1, "notebooks/ holds no lesson"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_executed(path):
    cells = code_cells(path)
    unexecuted = [i for i, c in enumerate(cells) if c["source"] and c["execution_count"] is None]
    assert not unexecuted, f"{path.name}: code cells {unexecuted} were committed unexecuted"
    counts = [c["execution_count"] for c in cells if c["source"]]
    assert counts == sorted(counts), f"{path.name}: cells were run out of order"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_a_unique_id(path):
    """nbformat 4.5 gives every cell an id (nbformat warns without one, and will refuse)."""
    nb = json.loads(path.read_text())
    ids = [c.get("id") for c in nb["cells"]]
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), path.name
    assert None not in ids, f"{path.name}: cells {[i for i, x in enumerate(ids) if x is None]} have no id"
    assert len(set(ids)) == len(ids), f"{path.name}: repeated cell ids"


# What runs a lesson's program on real JAX: simpmd.crosscheck (logged for course.sh), the
# multi-process cross-check, or a JAX transformation the lesson calls and compares itself.
RUNS_ON_JAX = re.compile(r"crosscheck\(|crosscheck_processes\(|on_jax\(|jax_roofline\.|"
                         r"\bjax\.(shard_map|pmap|jit|eval_shape|grad|value_and_grad|vmap)\(")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_runs_its_programs_on_real_jax_too(path):
    """Every lesson cross-checks against real JAX (course.sh counts the simpmd.crosscheck
    calls; a lesson with none compares in cells of its own, found here)."""
    code = "\n".join("".join(c["source"]) for c in code_cells(path))
    assert RUNS_ON_JAX.search(code), f"{path.name}: no program of this lesson runs on real JAX"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_starts_with_the_shared_setup_cell(path):
    first = "".join(code_cells(path)[0]["source"])
    assert first == simpmd.course.SETUP_CELL, (
        f"{path.name}: the first code cell must be simpmd.course.SETUP_CELL, word for word")


def test_readme_opens_every_lesson_in_colab_from_the_repository_constant():
    readme = (ROOT / "README.md").read_text()
    for path in NOTEBOOKS:
        assert f"]({simpmd.course.colab_url(path.name)})" in readme, \
            f"README has no Colab link to {path.name} built from simpmd.course.REPOSITORY"
    assert simpmd.course.colab_url("x.ipynb", "https://github.com/you/fork.git") == \
        "https://colab.research.google.com/github/you/fork/blob/main/notebooks/x.ipynb"


def test_readme_lists_every_lesson_in_order_with_its_api_and_a_route_through_todays_jax():
    readme = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d\d) [^|]+\|[^|]+\| ([^|]+) \| \[open\]\(([^)]+)\) \|$", readme, flags=re.M)
    assert [n for n, _, _ in rows] == [p.name[:2] for p in NOTEBOOKS]
    assert [url for _, _, url in rows] == [simpmd.course.colab_url(p.name) for p in NOTEBOOKS]
    marked = {n for n, api, _ in rows if api.startswith("**pmap**")}
    assert {"02", "03"} <= marked and not marked & {"11", "12", "13", "14", "15"}
    route = re.search(r"\*\*Today's JAX first: ([\d →]+)\*\*", readme).group(1).strip()
    lessons = [int(n) for n in route.split(" → ")]
    assert lessons == sorted(lessons) and {1, 11, 12} <= set(lessons)
    assert all(f"{n:02d}" in [r[0] for r in rows] for n in lessons)


def test_set_repository_points_every_copy_at_a_fork(tmp_path):
    """scripts/set_repository.py, run on a copy of the repository, changes the constant,
    every notebook's set-up cell and the README's links, and nothing else."""
    import shutil
    import subprocess
    import sys
    copy = tmp_path / "repo"
    for part in ("simpmd", "notebooks", "scripts"):
        shutil.copytree(ROOT / part, copy / part, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "README.md", copy / "README.md")
    fork = "https://github.com/someone/simpmd-fork"
    run = subprocess.run([sys.executable, str(copy / "scripts" / "set_repository.py"), fork],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    old = simpmd.course.REPOSITORY
    course = (copy / "simpmd" / "course" / "__init__.py").read_text()
    assert f'REPOSITORY = "{fork}"' in course
    for path in NOTEBOOKS:
        first = "".join(code_cells(copy / "notebooks" / path.name)[0]["source"])
        assert first == simpmd.course.SETUP_CELL.replace(old, fork)
    readme = (copy / "README.md").read_text()
    assert "github/someone/simpmd-fork/blob/main/notebooks/01_" in readme
    assert "github/simpmd/simpmd/blob" not in readme
    assert f"git clone {fork}\n  cd simpmd-fork\n  bash course.sh --open" in readme
    assert "github.com/simpmd/simpmd" not in readme


def test_setup_cell_says_in_one_sentence_what_to_do_when_the_install_fails():
    """Run the set-up cell where simpmd is 'missing' and the repository cannot be reached:
    it must stop with one sentence, not pip's output or a traceback."""
    import subprocess
    import sys
    pretend_missing = ("import importlib.util\n_find = importlib.util.find_spec\n"
                       "importlib.util.find_spec = lambda name, *a: None if name == 'simpmd' "
                       "else _find(name, *a)\n")
    cell = simpmd.course.SETUP_CELL.replace(simpmd.course.REPOSITORY, "file:///nonexistent/simpmd")
    run = subprocess.run([sys.executable, "-c", pretend_missing + cell], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1
    assert run.stderr.strip().splitlines() == [
        "Could not install simpmd from file:///nonexistent/simpmd: check that this runtime is "
        "online and that the address is right, then run this cell again."]
    assert run.stdout == ""


# -- exercises: answers out of sight (see simpmd.course's docstring for the pattern) -------------
# Lessons that keep their reference solutions in a "Solutions" section at the end. The
# others still put a solution right after its exercise; add each lesson here as it adopts
# the pattern.
SOLUTIONS_AT_THE_END = ["02_pmap_basics.ipynb", "03_in_axes_out_axes.ipynb",
                        "04_named_axes_collectives.ipynb", "05_data_parallel_training.ipynb",
                        "06_collective_algorithms_and_cost.ipynb",
                        "07_roofline_and_measured_collectives.ipynb",
                        "08_nested_pmap_2d_meshes.ipynb", "09_model_parallelism.ipynb",
                        "10_debugging_spmd.ipynb", "11_shard_map_and_jit.ipynb",
                        "12_explicit_sharding_and_jit.ipynb",
                        "13_pipeline_parallelism.ipynb",
                        "14_sequence_and_expert_parallelism.ipynb",
                        "15_plan_a_training_run.ipynb", "17_serving.ipynb"]


def _top_level_names(source):
    """The names a cell's code assigns or defines at the top level."""
    import ast
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    names = set()
    for node in ast.parse("\n".join(lines)).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def _sections(path):
    """(exercise cells, solution cells): from '## Exercises' to '## Solutions', and after."""
    cells = json.loads(path.read_text())["cells"]
    heads = ["".join(c["source"]) if c["cell_type"] == "markdown" else "" for c in cells]
    start = next(i for i, h in enumerate(heads) if "## Exercises" in h)
    solutions = [i for i, h in enumerate(heads) if h.startswith("## Solutions")]
    assert len(solutions) == 1, f"{path.name}: needs one '## Solutions' section"
    later = [h.splitlines()[0] for h in heads[solutions[0] + 1:] if h.startswith("## ")]
    assert not later, f"{path.name}: the Solutions section must be the last, but {later} follow"
    return cells[start:solutions[0]], cells[solutions[0]:]


@pytest.mark.parametrize("name", SOLUTIONS_AT_THE_END)
def test_solutions_never_overwrite_the_learners_answers(name):
    exercises, solutions = _sections(ROOT / "notebooks" / name)
    learner = set().union(*(_top_level_names("".join(c["source"])) for c in exercises
                            if c["cell_type"] == "code"))
    for c in solutions:
        if c["cell_type"] == "code":
            clash = _top_level_names("".join(c["source"])) & learner
            assert not clash, f"{name}: the Solutions section redefines the learner's {sorted(clash)}"
    # Each reference solution goes through its exercise's checker, whose "Correct: ..." is
    # in the stored output, so that nbval fails the day a solution stops passing. (A bare
    # call or an assert; learners read the call more easily.)
    checked = [c for c in solutions if c["cell_type"] == "code" and "solution_exercise_" in
               "".join(c["source"]) and re.search(r"\.check_\w+\(", "".join(c["source"]))]
    assert checked, f"{name}: each reference solution should be run through its checker"
    for c in checked:
        said = "".join("".join(out.get("text", "")) for out in c.get("outputs", []))
        assert "Correct: " in said, f"{name}: a reference solution's check did not say Correct"


@pytest.mark.parametrize("name", SOLUTIONS_AT_THE_END)
def test_placeholders_say_not_yet_and_check_cells_show_no_bare_bool(name):
    exercises, _ = _sections(ROOT / "notebooks" / name)
    said = ""
    for c in exercises:
        for out in c.get("outputs", []):
            assert out["output_type"] != "error", f"{name}: an exercise cell raised on its placeholder"
            plain = "".join(out.get("data", {}).get("text/plain", ""))
            assert plain not in ("True", "False"), f"{name}: a check cell shows a bare {plain}"
            said += "".join(out.get("text", ""))
    assert "Not yet" in said and "Correct" not in said, (
        f"{name}: the exercises, left as placeholders, should each print 'Not yet: ...'")


@pytest.mark.parametrize("stored, fresh", [
    # a report's note that only one release prints, at the end and in the middle
    ("agree\n  - On this JAX (0.10.2): negative axes counted from the front", "agree"),
    ("agree\n  - On this JAX (0.10.2): a note\n  - float note\n", "agree\n  - float note\n"),
    # show_error's outcome line: what JAX did differs by release, the label does not
    ("jax.pmap:\n    On this JAX (0.10.2): raised IndivisibleError: ...\n",
     "jax.pmap:\n    On this JAX (0.7.2): raised AssertionError: ...\n"),
    # a cell whose first line is a release's own words
    ("On this JAX (0.10.2): returns shape (24, 1)\ngives the (3, 8) result: False\n",
     "On this JAX (0.7.2): raises AssertionError\ngives the (3, 8) result: False\n"),
    # the HTML form of a report, with that note as its only one
    ("</table><ul><li>On this JAX (0.10.2): a note</li></ul></div>", "</table></div>"),
])
def test_lines_about_the_running_jax_release_are_left_out_of_the_comparison(stored, fresh):
    """What only some JAX releases print sits on lines starting 'On this JAX (version):';
    tests/nbval_sanitize.cfg must make a lesson's outputs from two releases compare equal."""
    import re
    from nbval.plugin import get_sanitize_patterns
    patterns = get_sanitize_patterns((ROOT / "tests" / "nbval_sanitize.cfg").read_text())

    def sanitized(text):
        for regex, replacement in patterns:
            text = re.sub(regex, replacement, text)
        return text
    assert sanitized(stored) == sanitized(fresh)
    assert "agree" not in stored or "agree" in sanitized(stored)    # the verdict stays compared


def test_lesson_12s_programs_agree_with_jax_as_its_text_says():
    """Lesson 12 section 7 runs twelve programs on both engines and says, in words, that
    where both run the types and values agree on each and the collective counts on seven;
    this holds the words to the stored reports (nbval holds the reports to a fresh run)."""
    cells = json.loads((ROOT / "notebooks" / "12_explicit_sharding_and_jit.ipynb").read_text())["cells"]
    cell = next(c for c in cells if c["cell_type"] == "code" and "reports = [run_both(" in "".join(c["source"]))
    out = "".join("".join(o.get("text", "")) for o in cell["outputs"])
    reports = re.split(r"\n(?=\S)", out.strip())
    assert len(reports) == 12
    ran = [r for r in reports if "both raise" not in r]
    assert len(reports) - len(ran) == 2 and all("(agree)" in r for r in reports if r not in ran)
    assert all("sharding: same on JAX" in r and "values, block by block: equal" in r for r in ran)
    counts = [re.search(r"collectives: simpmd (.*) \| XLA on CPU (.*)", r).groups() for r in ran]
    assert sum(a == b for a, b in counts) == 7
    assert "the collective counts agree on seven" in "".join(
        "".join(c["source"]) for c in cells if c["cell_type"] == "markdown").replace("\n", " ")


# -- how long a lesson takes -----------------------------------------------------------------
# A careful learner's time, estimated from the notebook: its markdown at 120 words a minute,
# 6 s per line of code (reading it, running it, reading what it prints), 5 minutes per
# exercise; the Solutions section is left out. One learner's measured hour for the pipeline
# lesson (issue 32; the model gives 64 minutes) is what the rates were checked against.

def _careful_minutes(path):
    cells = json.loads(path.read_text())["cells"]
    end = next((i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                and "".join(c["source"]).startswith("## Solutions")), len(cells))
    body = cells[:end]
    words = sum(len(re.sub(r"[`*$]", "", "".join(c["source"])).split())
                for c in body if c["cell_type"] == "markdown")
    code = sum(1 for c in body if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()
               if line.strip() and not line.strip().startswith("#"))
    exercises = sum(len(re.findall(r"^### Exercise", "".join(c["source"]), flags=re.M))
                    for c in body if c["cell_type"] == "markdown")
    return words / 120 + code * 6 / 60 + 5 * exercises


def _stated_minutes(path):
    top = "".join(json.loads(path.read_text())["cells"][0]["source"])
    assert "**Prerequisites:**" in top, f"{path.name} does not say what it builds on"
    return int(re.search(r"\*\*Time:\*\* about (\d+) minutes", top).group(1))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_lesson_states_prerequisites_and_a_time_that_fits_its_length(path):
    stated, estimate = _stated_minutes(path), _careful_minutes(path)
    assert abs(stated - estimate) <= max(5, 0.1 * estimate), (
        f"{path.name} says about {stated} minutes; its length gives {estimate:.0f}")


def test_readme_gives_the_lessons_total_time_and_range():
    readme = (ROOT / "README.md").read_text()
    times = [_stated_minutes(p) for p in NOTEBOOKS]
    hours = int(re.search(r"take about (\d+) hours in all", readme).group(1))
    assert abs(hours - sum(times) / 60) <= 0.5
    low, high = map(int, re.search(r"\((\d+) to (\d+) minutes\)", readme).groups())
    assert (low, high) == (min(times), max(times))
