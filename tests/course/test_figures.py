"""`python -m simpmd.course.figures` writes every figure the README and the course show, and
writes the same bytes every time (run twice: once in a fresh interpreter, once here)."""
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("matplotlib")
from simpmd.course import figures  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXPECTED = {
    "mesh_2x4.png", "psum.png", "all_gather.png", "psum_scatter.png", "ppermute.png",
    "all_to_all.png", "nested_2x2.png", "timeline.png", "ring_allreduce.png",
    "tree_allreduce.png", "torus_allreduce.png", "ring_allreduce.gif", "grad_step.png",
}


def test_figures_command_writes_every_figure_twice_with_identical_bytes(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    result = subprocess.run([sys.executable, "-m", "simpmd.course.figures", "--out", str(first)],
                            cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert f"in {len(EXPECTED)} files" in result.stdout
    written = figures.build(second)
    assert {p.name for p in written} == EXPECTED
    assert {p.name for p in first.iterdir()} == EXPECTED
    for name in sorted(EXPECTED):
        a, b = (first / name).read_bytes(), (second / name).read_bytes()
        assert a == b, f"{name} differs between two runs: the figures are not deterministic"
        assert a[:4] in (b"\x89PNG", b"GIF8")
        assert b"Software" not in a[:2000] or name.endswith(".gif")
    sizes = {p.name: p.stat().st_size for p in written}
    assert sizes["ring_allreduce.gif"] < 1.5e6
    assert sum(sizes.values()) < 3e6
    from PIL import Image
    with Image.open(first / "ring_allreduce.gif") as gif:     # twice the old 430 x 370 px
        assert gif.size[0] >= 860 and gif.size[1] >= 740
    for name in sorted(EXPECTED - {"ring_allreduce.gif"}):
        with Image.open(first / name) as png:
            assert min(png.info["dpi"]) >= 149.9, f"{name} is saved below 150 dpi"


def test_the_figures_folder_holds_every_expected_figure():
    folder = ROOT / "figures"
    assert {p.name for p in folder.iterdir() if p.suffix in (".png", ".gif")} >= EXPECTED


def test_figures_leave_the_platform_as_they_found_it(tmp_path, monkeypatch):
    import simpmd
    simpmd.set_device_count(16, hardware="H100")
    monkeypatch.setattr(figures, "_figures", lambda: {"mesh_2x4.png": figures._mesh_figure})
    figures.build(tmp_path)
    assert simpmd.device_count() == 16 and simpmd.platform().hardware == "H100"
