"""The course notebooks: committed executed, starting with the shared set-up cell.

nbval itself re-runs every notebook and compares its outputs (pytest --nbval, see
pyproject.toml); these tests check what nbval cannot: that nothing was committed
unexecuted, and that every lesson starts the same way.
"""
import json
import pathlib

import pytest

import simpmd.course

NOTEBOOKS = sorted((pathlib.Path(__file__).parent.parent / "notebooks").glob("*.ipynb"))


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
