"""The course notebooks: committed executed, starting with the shared set-up cell.

nbval itself re-runs every notebook and compares its outputs (pytest --nbval, see
pyproject.toml); these tests check what nbval cannot: that nothing was committed
unexecuted, and that every lesson starts the same way.
"""
import json
import pathlib

import pytest

import simpmd.course

ROOT = pathlib.Path(__file__).parent.parent
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
    course = (copy / "simpmd" / "course.py").read_text()
    assert f'REPOSITORY = "{fork}"' in course
    for path in NOTEBOOKS:
        first = "".join(code_cells(copy / "notebooks" / path.name)[0]["source"])
        assert first == simpmd.course.SETUP_CELL.replace(old, fork)
    readme = (copy / "README.md").read_text()
    assert "github/someone/simpmd-fork/blob/main/notebooks/01_" in readme
    assert "github/simpmd/simpmd/blob" not in readme


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
