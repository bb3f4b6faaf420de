"""simpmd.viz: every drawing runs on 1-D and 2-D meshes and every collective, and draws what
the trace holds. No pixel comparisons: the drawings tag their device boxes, hubs, arrows and
timeline segments (``simpmd:<role>:<name>`` gids), and the tests count those and read the
text artists."""
import collections
import gc
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import simpmd
from simpmd import algorithms, lax

viz = pytest.importorskip("simpmd.viz")
pytest.importorskip("matplotlib")
from simpmd.viz.canvas import Drawing, number, tagged  # noqa: E402


def gids(fig, role):
    return [a.get_gid().split(":", 2)[2] for a in tagged(fig, role)]


def texts(fig):
    return [t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text") and
                                              type(a).__name__ == "Text")]


# -- runs to draw -----------------------------------------------------------------------------

RING8 = [(i, (i + 1) % 8) for i in range(8)]
BODIES = {      # op -> body for a 1-D run over axis 'i' of 8 devices; x holds 8 numbers
    "psum": lambda x: lax.psum(x, "i"),
    "pmean": lambda x: lax.pmean(x, "i"),
    "pmax": lambda x: lax.pmax(x, "i"),
    "pmin": lambda x: lax.pmin(x, "i"),
    "all_gather": lambda x: lax.all_gather(x, "i"),
    "psum_scatter": lambda x: lax.psum_scatter(x, "i"),
    "ppermute": lambda x: lax.ppermute(x, "i", perm=RING8),
    "pshuffle": lambda x: lax.pshuffle(x, "i", perm=[7, 0, 1, 2, 3, 4, 5, 6]),
    "all_to_all": lambda x: lax.all_to_all(x, "i", 0, 0),
    "pswapaxes": lambda x: lax.pswapaxes(x, "i", 0),
}


def run_1d(op, n=8):
    f = simpmd.pmap(BODIES[op], axis_name="i")
    f(np.arange(8.0 * n).reshape(8, n))
    return f.trace


def run_2d(op, axis):
    """A nested pmap over data=2 x model=4; the collective runs over ``axis`` on 4-vectors."""
    size = {"data": 2, "model": 4}[axis]
    perm = [(k, (k + 1) % size) for k in range(size)]
    bodies = {
        "psum": lambda x: lax.psum(x, axis), "pmean": lambda x: lax.pmean(x, axis),
        "pmax": lambda x: lax.pmax(x, axis), "pmin": lambda x: lax.pmin(x, axis),
        "all_gather": lambda x: lax.all_gather(x, axis),
        "psum_scatter": lambda x: lax.psum_scatter(x, axis, tiled=True),
        "ppermute": lambda x: lax.ppermute(x, axis, perm=perm),
        "pshuffle": lambda x: lax.pshuffle(x, axis, perm=[(k + 1) % size for k in range(size)]),
        "all_to_all": lambda x: lax.all_to_all(x, axis, 0, 0, tiled=True),
        "pswapaxes": lambda x: lax.pswapaxes(x.reshape(size, -1), axis, 0),
    }
    inner = bodies[op]
    g = simpmd.pmap(lambda x: simpmd.pmap(inner, axis_name="model")(x), axis_name="data")
    g(np.arange(32.0).reshape(2, 4, 4))
    return g.trace


# -- packaging --------------------------------------------------------------------------------

def test_import_simpmd_viz_does_not_import_matplotlib_until_a_drawing_is_asked_for():
    code = textwrap.dedent("""
        import sys, simpmd, simpmd.viz as viz
        assert 'matplotlib' not in sys.modules, 'import simpmd.viz imported matplotlib'
        assert callable(viz.draw_mesh) and 'matplotlib' in sys.modules
        assert sorted(viz.__all__) == viz.__all__ and 'draw_timeline' in dir(viz)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


def test_figures_are_figures_that_show_themselves_in_jupyter():
    fig = viz.draw_mesh(4, "i")
    from matplotlib.figure import Figure
    assert isinstance(fig, Figure) and isinstance(fig, Drawing)
    assert fig._repr_png_().startswith(b"\x89PNG")
    with pytest.raises(AttributeError, match="no attribute 'draw_everything'"):
        viz.draw_everything


def test_number_text():
    assert [number(x) for x in (6.0, 0.5, 7 / 3, 3, np.int32(-4), True, 1.5e7, 0.0)] == \
        ["6", "0.5", "2.333", "3", "-4", "T", "1.5e+07", "0"]


# -- meshes -----------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,names,axis,groups", [
    (8, "i", None, 0),
    (8, ("i",), "i", 1),
    ((2, 4), ("data", "model"), "model", 2),          # the rows
    ((2, 4), ("data", "model"), "data", 4),           # the columns
    ((4, 2), ("data", "model"), ("data", "model"), 1),
    ((2, 2, 2), ("x", "y", "z"), "z", 4),
])
def test_draw_mesh_has_one_box_per_device_and_outlines_the_groups(shape, names, axis, groups):
    fig = viz.draw_mesh(shape, names, highlight_axis=axis)
    n = int(np.prod(shape))
    assert sorted(map(int, gids(fig, "device"))) == list(range(n))
    assert len(gids(fig, "group")) == groups
    for name in ((names,) if isinstance(names, str) else names):
        assert any(t == name or t.startswith(name + "=") for t in texts(fig))


def test_mesh_groups_agree_with_the_engine():
    """The devices the picture puts in one group are the devices a psum adds together."""
    groups, count = viz.mesh_groups((2, 4), "data", ("data", "model"))
    assert count == 4 and list(groups) == [0, 1, 2, 3, 0, 1, 2, 3]
    trace = run_2d("psum", "data")
    for e in trace.events:
        if e.kind == "collective":
            assert len({groups[d] for d in e.group}) == 1


def test_draw_mesh_values_mesh_objects_and_errors():
    fig = viz.draw_mesh((2, 2), ("data", "model"), values=["a", "b", np.arange(2.0), np.zeros((4, 8))])
    assert {"a", "b", "[0 1]", "float64[4,8]"} <= set(texts(fig))
    fig = viz.draw_mesh(8, "i", values={3: "three"})
    assert "three" in texts(fig)
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    fig = viz.draw_mesh(mesh, highlight_axis="model")
    assert len(gids(fig, "device")) == 8 and "model" in texts(fig)
    fig = viz.draw_mesh(simpmd.platform().device_grid(), "devices")
    assert len(gids(fig, "device")) == 8
    with pytest.raises(ValueError, match="not an axis of this mesh"):
        viz.draw_mesh((2, 4), ("data", "model"), highlight_axis="batch")
    with pytest.raises(ValueError, match="one name per axis"):
        viz.draw_mesh((2, 4), ("data",))
    with pytest.raises(ValueError, match="one per device"):
        viz.draw_mesh(4, "i", values=[1, 2])


def test_draw_trace_mesh_reads_the_grid_from_the_coords():
    trace = run_2d("psum", "model")
    fig = viz.draw_trace_mesh(trace, highlight_axis="auto", values="returned")
    assert sorted(map(int, gids(fig, "device"))) == list(range(8))
    assert len(gids(fig, "group")) == 2                   # psum over 'model': the two rows
    assert "over 'model' runs in 2 groups of 4" in " ".join(texts(fig))
    returned = [e for e in trace.events if e.kind == "return" and e.device is not None]
    assert all(viz.mesh.short(e.outputs[0]) in texts(fig) for e in returned)
    fig = viz.draw_trace_mesh(run_1d("psum", n=1), values="received")
    assert {"[0]", "[7]"} <= set(texts(fig))
    with pytest.raises(ValueError, match="'received', 'returned'"):
        viz.draw_trace_mesh(trace, values="sent")


# -- collectives ------------------------------------------------------------------------------

@pytest.mark.parametrize("op", sorted(BODIES))
def test_draw_collective_1d_every_kind(op):
    trace = run_1d(op)
    fig = viz.draw_collective(trace, 0)
    programs = [f"device {d}" for d in range(8)]
    assert sorted(gids(fig, "before")) == sorted(programs)
    assert sorted(gids(fig, "after")) == sorted(programs)
    if op in ("ppermute", "pshuffle"):
        assert len(gids(fig, "link")) == 8 and not gids(fig, "group")
    else:
        assert len(gids(fig, "group")) == 1


@pytest.mark.parametrize("op", sorted(BODIES))
@pytest.mark.parametrize("axis", ["model", "data"])
def test_draw_collective_2d_every_kind_one_band_or_arrow_set_per_group(op, axis):
    trace = run_2d(op, axis)
    # as in jax.lax, pshuffle runs as a ppermute and pswapaxes as an all_to_all
    fig = viz.draw_collective(trace, {"pshuffle": "ppermute", "pswapaxes": "all_to_all"}.get(op, op))
    assert len(gids(fig, "before")) == len(gids(fig, "after")) == 8
    groups = 2 if axis == "model" else 4
    if op in ("ppermute", "pshuffle"):
        assert len(gids(fig, "link")) == 8
    else:
        assert len(gids(fig, "group")) == groups


def test_the_numbers_drawn_are_the_numbers_in_the_trace():
    """Every value before and after, on every device, appears as text (small arrays)."""
    for op in ("psum", "all_gather", "ppermute", "all_to_all", "psum_scatter"):
        n = 1 if op == "all_gather" else 8          # at most 8 numbers per box
        f = simpmd.pmap(BODIES[op], axis_name="i")
        f(np.arange(8.0 * n).reshape(8, n) % 13)
        fig = viz.draw_collective(f.trace, 0)
        shown = collections.Counter(texts(fig))
        expected = collections.Counter(
            number(v) for e in f.trace.events if e.kind == "collective"
            for leaf in (e.inputs[0], e.outputs[0]) for v in np.ravel(leaf))
        missing = expected - shown
        assert not missing, f"{op}: values in the trace but not drawn: {dict(missing)}"


def test_provenance_colours_follow_the_collective():
    """all_gather: block j of every result is coloured like device j; ppermute: like its sender."""
    from simpmd.viz.collectives import drawing_of
    e = next(e for e in run_1d("all_gather", n=1).events if e.kind == "collective")
    assert drawing_of("all_gather").after(e, e.outputs[0]).ravel().tolist() == list(range(8))
    e = next(e for e in run_1d("ppermute", n=1).events if e.kind == "collective" and e.member == 3)
    assert drawing_of("ppermute").after(e, e.outputs[0]).ravel().tolist() == [2]
    e = next(e for e in run_1d("all_to_all").events if e.kind == "collective" and e.member == 0)
    assert drawing_of("all_to_all").after(e, e.outputs[0]).ravel().tolist() == list(range(8))


def test_draw_collective_choosing_and_errors():
    trace = run_1d("psum")
    assert len(gids(viz.draw_collective(trace, -1), "after")) == 8
    events = trace.calls()[0]
    assert len(gids(viz.draw_collective(events), "before")) == 8
    group = trace.collectives()[0][:3]                  # part of a group is drawable too
    assert len(gids(viz.draw_collective(group), "before")) == 3
    with pytest.raises(IndexError, match="1 collective call"):
        viz.draw_collective(trace, 5)
    with pytest.raises(ValueError, match="no 'all_gather'"):
        viz.draw_collective(trace, "all_gather")
    quiet = simpmd.pmap(lambda x: x + 1, axis_name="i")
    quiet(np.zeros(8))
    with pytest.raises(ValueError, match="no collectives"):
        viz.draw_trace(quiet.trace)


def test_pytrees_heat_strips_and_draw_trace():
    f = simpmd.pmap(lambda x, y: (lax.psum((x, y), "i"), lax.all_gather(y, "i")), axis_name="i")
    f(np.ones((8, 3)), np.arange(8.0 * 100).reshape(8, 100))
    fig = viz.draw_collective(f.trace, 0, leaf=1)
    assert fig.axes[0].images                            # 100 numbers: heat strips, not text
    assert "(leaf 1 of 2)" in " ".join(texts(fig))
    fig = viz.draw_trace(f.trace)
    assert len(fig.axes) == 2 and len(gids(fig, "after")) == 16
    assert len(gids(viz.draw_trace(run_2d("all_gather", "data")), "before")) == 8


def test_nested_outer_programs_are_drawn_with_the_devices_they_span():
    def outer(x):
        return lax.psum(simpmd.pmap(lambda v: lax.psum(v, "model"), axis_name="model")(x), "data")
    g = simpmd.pmap(outer, axis_name="data")
    g(np.arange(8.0).reshape(2, 4))
    fig = viz.draw_trace(g.trace)
    assert sorted(gids(fig, "before")) == sorted([f"device {d}" for d in range(8)] + ["data=0", "data=1"])
    assert "data=1 [4-7]" in texts(fig)


def test_two_rows_draw_the_first_and_the_last_device_of_a_group():
    """max_rows=2 (or up to 5): the first row, the note, the last row; below 2 it refuses."""
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(8 * 4.0).reshape(8, 4))
    for most in (2, 5):
        fig = viz.draw_collective(f.trace, 0, max_rows=most)
        assert gids(fig, "before") == gids(fig, "after") == ["device 0", "device 7"]
        assert gids(fig, "elided") == ["6"]
    assert gids(viz.draw_trace(f.trace, max_rows=2), "before") == ["device 0", "device 7"]
    with pytest.raises(ValueError, match="at least 2 rows"):
        viz.draw_collective(f.trace, 0, max_rows=1)


def test_64_devices_every_view():
    simpmd.set_device_count(64)
    ring = [(i, (i + 1) % 64) for i in range(64)]
    f = simpmd.pmap(lambda x: (lax.psum_scatter(x, "i", tiled=True), lax.ppermute(x, "i", ring)),
                    axis_name="i")
    f(np.arange(64 * 128.0).reshape(64, 128))
    shown = [f"device {d}" for d in list(range(12)) + [62, 63]]   # the middle is elided
    for fig in (viz.draw_collective(f.trace, 0), viz.draw_collective(f.trace, 1)):
        assert gids(fig, "before") == gids(fig, "after") == shown
        assert gids(fig, "elided") == ["50"]
        assert any("50 rows not drawn" in t and "device 12 to device 61" in t for t in texts(fig))
    assert len(gids(viz.draw_collective(f.trace, 0, max_rows=64), "before")) == 64
    fig = viz.draw_trace(f.trace)
    fig.canvas.draw()                                     # renders without error
    assert len(gids(fig, "after")) == 2 * len(shown)
    assert len(gids(viz.draw_trace_mesh(f.trace), "device")) == 64
    assert len(gids(viz.draw_mesh((4, 4, 4), ("x", "y", "z"), highlight_axis="y"), "device")) == 64
    assert gids(viz.draw_timeline(f.trace), "device") == [str(d) for d in list(range(12)) + [62, 63]]
    assert len(gids(viz.draw_timeline(f.trace, max_rows=None), "device")) == 64


def test_ax_argument_draws_into_a_given_axes():
    from simpmd.viz.canvas import new_figure
    fig = new_figure(8, 4)
    left, right = fig.add_axes((0, 0, 0.5, 1)), fig.add_axes((0.5, 0, 0.5, 1))
    assert viz.draw_mesh((2, 2), ("a", "b"), ax=left) is fig
    assert viz.draw_collective(run_1d("psum"), ax=right) is fig
    assert len(gids(fig, "device")) == 4 and len(gids(fig, "before")) == 8


# -- algorithms -------------------------------------------------------------------------------

def frame_count(run):
    """How many frames the run's animation would play; then drop it without matplotlib's
    warning that it was never shown (it fires when collected, so collect it here)."""
    anim = viz.animate_algorithm(run)
    count = len(list(anim.new_frame_seq()))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "Animation was deleted")
        del anim
        gc.collect()
    return count


@pytest.mark.parametrize("p", [2, 4, 8])
def test_ring_all_reduce_frames_and_animation(p):
    run = algorithms.ring_all_reduce([np.full(p, float(d)) for d in range(p)])
    assert frame_count(run) == 2 * (p - 1) + 1
    fig = viz.draw_algorithm(run)
    frames = 2 * (p - 1) + 1
    assert len(gids(fig, "device")) == p * frames
    step = viz.draw_algorithm_step(run, 1)
    assert len(gids(step, "device")) == p and len(gids(step, "message")) == p
    held = viz.sources(run)
    assert len(held) == frames
    assert all(s == frozenset(range(p)) for row in held[-1] for s in row)     # everyone has all
    assert all(s == frozenset({i}) for i, row in enumerate(held[0]) for s in row)


def test_sources_read_from_the_messages_match_the_values():
    """Device inputs 2**d: each piece's value, in binary, names the devices it holds."""
    p = 4
    run = algorithms.ring_all_reduce([np.full(8, 2.0 ** d) for d in range(p)])
    segs = viz.algorithms._segments(run)
    for t, frame in enumerate(viz.sources(run)):
        for i, row in enumerate(frame):
            for (a, _), held in zip(segs, row):
                assert int(run.states[t][i][a]) == sum(1 << d for d in held)


def test_tree_torus_and_gather_runs_draw():
    tree = algorithms.tree_all_reduce([np.full(4, float(d)) for d in range(8)])
    assert frame_count(tree) == 2 * 3 + 1
    torus = algorithms.torus_all_reduce([np.full(16, float(d)) for d in range(8)], (2, 4))
    fig = viz.draw_algorithm_step(torus, 1)
    assert len(gids(fig, "device")) == 8 and gids(fig, "message")
    gather = algorithms.ring_all_gather([np.full(2, float(d)) for d in range(4)])
    held = viz.sources(gather)
    assert held[0][1] == [frozenset(), frozenset({1}), frozenset(), frozenset()]
    assert all(s == frozenset({k}) for row in held[-1] for k, s in enumerate(row))
    fig = viz.draw_algorithm(gather, frames=[0, 3], show="values")
    assert len(gids(fig, "device")) == 8
    with pytest.raises(IndexError, match="frames 0 to 3"):
        viz.draw_algorithm_step(gather, 4)
    with pytest.raises(TypeError, match="simpmd.algorithms"):
        viz.draw_algorithm([1, 2])


def _segments_of(arrow):
    """The straight pieces of an arrow as drawn (shaft and head), in inches."""
    return [(a, b) for line in arrow.get_path().to_polygons(closed_only=False)
            for a, b in zip(line[:-1], line[1:])]


def _crossings(p, q):
    """Which of segments p [n, 2, 2] cross or touch which of q [m, 2, 2] ([n, m] booleans;
    the orientation test, worked by hand, on every pair at once)."""
    a, b = p[:, None, 0], p[:, None, 1]
    c, d = q[None, :, 0], q[None, :, 1]

    def side(u, v, w):
        return np.sign((v[..., 0] - u[..., 0]) * (w[..., 1] - u[..., 1])
                       - (v[..., 1] - u[..., 1]) * (w[..., 0] - u[..., 0]))
    apart = (side(a, b, c) * side(a, b, d) > 0) | (side(c, d, a) * side(c, d, b) > 0)
    overlap = np.ones(apart.shape, bool)
    for k in (0, 1):        # the boxes meet along both coordinates
        overlap &= (np.minimum(a[..., k], b[..., k]) <= np.maximum(c[..., k], d[..., k]))
        overlap &= (np.minimum(c[..., k], d[..., k]) <= np.maximum(a[..., k], b[..., k]))
    return ~apart & overlap


def test_crossings_by_hand():
    seg = lambda *xy: np.array(xy, float).reshape(-1, 2, 2)
    x = seg((0, 0), (2, 2))
    assert _crossings(x, seg((0, 2), (2, 0))).all()            # an X
    assert _crossings(x, seg((2, 2), (3, 0))).all()            # touching at an end
    assert not _crossings(x, seg((0, 1), (1, 2))).any()        # parallel, beside it
    assert not _crossings(x, seg((3, 3), (4, 4))).any()        # on its line, past its end
    assert _crossings(seg((0, 0), (1, 0), (5, 5), (6, 5)), seg((0.5, -1), (0.5, 1))).tolist() \
        == [[True], [False]]


@pytest.mark.parametrize("shape", [(4, 4), (2, 4), (4, 3), (8, 8)])
def test_torus_wraparounds_cross_no_row_or_column_link(shape):
    """A wraparound (between the two ends of a row or a column) runs round the outside
    of the grid: none of its segments meets a link between neighbours."""
    rows, cols = shape
    p = rows * cols
    run = algorithms.torus_all_reduce([np.full(2 * p, float(d)) for d in range(p)], shape)
    wraps_seen = 0
    for t in (1, run.num_steps // 2 + 1):
        fig = viz.draw_algorithm_step(run, t)
        wraps, links = [], []
        for arrow in tagged(fig, "message"):
            src, dst = map(int, arrow.get_gid().rsplit(":", 1)[1].split("->"))
            (r0, c0), (r1, c1) = divmod(src, cols), divmod(dst, cols)
            wrap = (r0 == r1 and abs(c1 - c0) > 1) or (c0 == c1 and abs(r1 - r0) > 1)
            (wraps if wrap else links).append(_segments_of(arrow))
        assert links
        wraps_seen += len(wraps)
        pieces = np.array([seg for link in links for seg in link], float)
        for wrap in wraps:
            assert not _crossings(np.array(wrap, float), pieces).any()
    assert wraps_seen >= 2 * rows        # every row's wraparound, both ways, was checked


@pytest.mark.parametrize("p", [17, 64])
def test_a_long_ring_elides_its_middle_with_a_note(p):
    """As long collective calls do (16 rows at most: the first 12, a note, the last 2)."""
    run = algorithms.ring_all_reduce([np.full(p, float(d)) for d in range(p)])
    shown = list(range(12)) + [p - 2, p - 1]
    hidden = [d for d in range(p) if d not in shown]
    for t in (0, 1, run.num_steps):
        fig = viz.draw_algorithm_step(run, t)
        assert sorted(map(int, gids(fig, "device"))) == shown
        assert gids(fig, "elided") == [str(p - 14)]
        assert any(f"{p - 14} devices not drawn: devices 12 to {p - 3}" in x for x in texts(fig))
        # a message is drawn when either end is drawn; those among hidden devices are not
        sent = {(m.src, m.dst) for m in run.steps[t - 1].messages} if t else set()
        expected = {f"{t}:{a}->{b}" for a, b in sent if a in shown or b in shown}
        assert set(gids(fig, "message")) == expected
        assert not expected or len(expected) < len(sent) == p
    fig = viz.draw_algorithm(run, frames=[0, 1])
    assert len(gids(fig, "device")) == 2 * 14 and gids(fig, "elided") == [str(len(hidden))] * 2
    assert len(gids(viz.draw_algorithm_step(algorithms.ring_all_reduce(
        [np.full(16, float(d)) for d in range(16)]), 1), "device")) == 16     # 16: all drawn


def test_animation_to_html_and_gif(tmp_path):
    from PIL import Image
    run = algorithms.ring_all_reduce([np.full(3, float(d)) for d in range(3)])
    html = viz.algorithm_html(run)
    assert "<script" in getattr(html, "data", html)
    path = viz.save_algorithm_gif(run, tmp_path / "ring.gif", hold=2, fps=2)
    with Image.open(path) as gif:        # Pillow merges the held copies into the last frame
        assert gif.n_frames == 2 * 2 + 1
        gif.seek(gif.n_frames - 1)
        assert gif.info["duration"] == 3 * 500


# -- timeline ---------------------------------------------------------------------------------

def test_timeline_segments_waits_and_stragglers():
    trace = run_1d("psum")
    tl = viz.model_timeline(trace, "TPU v4", compute=1e-5, slowdown={5: 3.0})
    assert tl.devices == list(range(8)) and "simpmd.cost" in tl.comm_model
    for d in range(8):
        kinds = [s.kind for s in tl.of(d)]
        assert kinds == (["compute", "comm", "compute"] if d == 5 else
                         ["compute", "wait", "comm", "compute"])
    assert tl.total("wait", 0) == pytest.approx(2e-5)     # device 5 arrives 20 us late
    comm = {(s.start, s.stop) for s in tl.segments if s.kind == "comm"}
    assert len(comm) == 1                                 # the group communicates together
    from simpmd import cost
    assert tl.total("comm", 0) == pytest.approx(cost.estimate_trace(trace, "TPU v4").total_time_s)
    fig = viz.draw_timeline(trace, "TPU v4", compute=1e-5, slowdown={5: 3.0})
    assert sorted(map(int, gids(fig, "device"))) == list(range(8))
    assert len(tagged(fig, "wait")) == 7 and len(tagged(fig, "comm")) == 8
    assert not viz.model_timeline(trace, "H100").total("wait")   # same work everywhere: nobody waits


def test_timeline_defaults_to_the_platforms_hardware():
    from simpmd import cost
    simpmd.set_device_count(8, hardware="H100")         # conftest restores the default
    trace = run_1d("psum")
    tl = viz.model_timeline(trace, compute=1e-5)
    assert "H100" in tl.comm_model
    # the H100 preset's own estimate (not TPU v4's, the old default)
    assert tl.total("comm", 0) == pytest.approx(cost.estimate_trace(trace, "H100").total_time_s)
    assert tl.total("comm", 0) != pytest.approx(cost.estimate_trace(trace, "TPU v4").total_time_s)
    title = texts(viz.draw_timeline(trace, compute=1e-5))
    assert any(t.startswith("estimated run on H100:") for t in title)   # not "on None"


def _shift_chain(steps, p=4):
    """A shard_map program that computes, then passes its value one device on, ``steps``
    times (a pipeline's forward pass without the layers)."""
    from simpmd import P
    mesh = simpmd.make_mesh((p,), ("stage",))

    def body(x):
        for _ in range(steps):
            x = lax.ppermute(x * 2.0, "stage", [(j, j + 1) for j in range(p - 1)])
        return x
    f = simpmd.shard_map(body, mesh=mesh, in_specs=P("stage"), out_specs=P("stage"))
    f(np.ones((p, 3), dtype=np.float32))
    return f.trace


def test_timeline_marks_idle_segments_and_reads_off_the_bubble():
    # 4 stages, 3 microbatches: 6 steps of 1 ms; device d works at steps d..d+2, so each
    # device idles 3 of 6 steps: (p-1)/(m+p-1) = 3/6 of its compute time
    trace = _shift_chain(5)
    busy = lambda d, k: d <= k < d + 3
    tl = viz.model_timeline(trace, "TPU v5e", compute=1e-3, idle=lambda d, k: not busy(d, k))
    for d in range(4):
        kinds = [s.kind for s in tl.of(d) if s.kind in ("compute", "idle")]
        assert kinds == ["compute" if busy(d, k) else "idle" for k in range(6)]
        assert tl.total("idle", d) == pytest.approx(3e-3)
    comm = tl.total("comm", 0)
    assert comm > 0 and tl.end == pytest.approx(6e-3 + comm)
    assert tl.fraction("idle") == pytest.approx(3e-3 / (6e-3 + comm))
    assert tl.fraction("idle", 2) == pytest.approx(tl.fraction("idle"))
    assert not tl.total("wait")                 # idle is not waiting: every stage runs every step
    fig = viz.draw_timeline(trace, "TPU v5e", compute=1e-3, idle=lambda d, k: not busy(d, k))
    assert len(tagged(fig, "idle")) == 12 and len(tagged(fig, "compute")) == 12
    assert any("idle (no useful work)" in t for t in texts(fig))
    assert any("idle 49." in t or "idle 50.0%" in t for t in texts(fig))
    # without idle=, the same run is all compute, as before
    plain = viz.model_timeline(trace, "TPU v5e", compute=1e-3)
    assert not plain.total("idle") and plain.total("compute") == pytest.approx(4 * 6e-3)


def test_draw_timeline_takes_a_timeline_built_by_hand():
    Segment, Timeline = viz.Segment, viz.Timeline
    segs = [Segment(0, "compute", 0.0, 1.0, "stage 0", "F0"), Segment(0, "idle", 1.0, 3.0, "stage 0"),
            Segment(1, "idle", 0.0, 1.0, "stage 1"), Segment(1, "compute", 1.0, 3.0, "stage 1", "F0")]
    tl = Timeline(segs, [0, 1], 3.0, "no communication", "compute: units", "a schedule")
    assert tl.fraction("idle") == pytest.approx(3.0 / 6.0)
    fig = viz.draw_timeline(tl, title="hand-made")
    assert len(tagged(fig, "compute")) == 2 and len(tagged(fig, "idle")) == 2
    assert texts(fig).count("F0") == 2 and "hand-made" in texts(fig)


def test_timeline_default_compute_model_and_nested_runs():
    def outer(x):
        return lax.psum(simpmd.pmap(lambda v: lax.psum(v, "model"), axis_name="model")(x), "data")
    g = simpmd.pmap(outer, axis_name="data")
    g(np.ones((2, 4, 1000)))
    tl = viz.model_timeline(g.trace, "TPU v4")
    for d in range(8):             # inner psum, then the outer one spanning all 4 of its devices
        assert [s.label for s in tl.of(d) if s.kind == "comm"] == ["psum", "psum"]
    first = next(s for s in tl.of(0) if s.kind == "compute")
    assert first.duration == pytest.approx(4000 / 1.2e12)   # 1000 float32s / TPU v4's HBM
    # (np.ones gives float64, which JAX, and so simpmd, computes as float32 without x64)
    fig = viz.draw_timeline(g.trace, "TPU v4")
    assert len(gids(fig, "device")) == 8


def _row_labels(fig):
    """The timeline's row labels that are drawn (visible, with text), and their sizes."""
    fig.canvas.draw()
    ax = fig.axes[0]
    return [(t.get_text(), t.get_fontsize()) for t in ax.get_yticklabels()
            if t.get_visible() and t.get_text()]


def test_a_64_device_timeline_labels_every_row_it_draws():
    """Past 16 devices the middle rows are elided, as in draw_collective (the first 12, a
    note, the last 2); a straggler or the device that waits most stays in view; every
    drawn row carries its label at 7 pt or more (the old chart hid every other label)."""
    p = 64
    simpmd.set_device_count(p)
    ring = [(i, (i + 1) % p) for i in range(p)]
    f = simpmd.pmap(lambda x: lax.psum(lax.ppermute(x, "i", ring), "i"), axis_name="i")
    f(np.arange(p * 4.0).reshape(p, 4))

    fig = viz.draw_timeline(f.trace, compute=2e-6)
    labels = _row_labels(fig)
    drawn = list(range(12)) + [62, 63]
    assert [t for t, _ in labels] == [f"device {d}" for d in drawn[:12]] + ["⋮"] + \
        [f"device {d}" for d in drawn[12:]]
    assert min(size for _, size in labels) >= 7.0
    assert gids(fig, "device") == [str(d) for d in drawn]
    assert gids(fig, "elided") == ["50"]
    assert any("50 devices not drawn: devices 12 to 61 (none of them waits)" in t for t in texts(fig))
    assert {g.split(":")[0] for g in gids(fig, "comm")} == {str(d) for d in drawn}

    # device 30 computes 3 x 2 µs before each of the 2 collectives, the others 2 µs: each
    # of them waits 4 µs twice, 8 µs in all; device 30 stays in view, between two notes
    fig = viz.draw_timeline(f.trace, compute=2e-6, slowdown={30: 3.0})
    assert [t for t, _ in _row_labels(fig)] == [f"device {d}" for d in range(12)] + \
        ["⋮", "device 30", "⋮", "device 62", "device 63"]
    assert gids(fig, "elided") == ["18", "31"]
    notes = [t for t in texts(fig) if "devices not drawn" in t]
    assert notes == ["⋮  18 devices not drawn: devices 12 to 29 (each waits at most 8 µs)",
                     "⋮  31 devices not drawn: devices 31 to 61 (each waits at most 8 µs)"]

    fig = viz.draw_timeline(f.trace, compute=2e-6, max_rows=None)     # every row, taller
    labels = _row_labels(fig)
    assert [t for t, _ in labels] == [f"device {d}" for d in range(p)]
    assert min(size for _, size in labels) >= 7.0
    row_height_pt = fig.axes[0].get_window_extent().height / p * 72 / fig.dpi
    assert row_height_pt >= 7.0 and not gids(fig, "elided")

    simpmd.set_device_count(8)
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(8.0))
    assert len(_row_labels(viz.draw_timeline(f.trace))) == 8 == len(gids(viz.draw_timeline(f.trace), "device"))


def test_timeline_without_the_cost_model_says_so(monkeypatch):
    monkeypatch.setitem(sys.modules, "simpmd.cost", None)
    monkeypatch.delattr(simpmd, "cost", raising=False)
    tl = viz.model_timeline(run_1d("psum"))
    assert "not a hardware estimate" in tl.comm_model
    assert tl.total("comm", 0) == pytest.approx(56 / 100e9)     # 2*7/8 * 32 B at 100 GB/s


def test_backward_collectives_are_drawn_with_a_backward_title():
    import matplotlib
    matplotlib.use("Agg")
    from simpmd.course import figures
    trace = figures.grad_step_run()
    assert [(c[0].op, c[0].phase) for c in trace.calls()] == [
        ("all_gather", "forward"), ("psum_scatter", "backward"), ("pmean", "forward")]
    fig = simpmd.viz.draw_trace(trace)
    titles = [t.get_text() for ax in fig.axes for t in ax.texts if "psum_scatter" in t.get_text()]
    assert titles and titles[0].startswith("call 1: backward pass: psum_scatter")
    # the reduce-scatter hands device d the sum of everyone's block d: 2 (d + 1) here
    back = trace.calls()[1]
    assert [float(e.outputs[0][0]) for e in back] == [2.0 * (d + 1) for d in range(8)]


# -- reading at a glance ----------------------------------------------------------------------

def _boxes(fig, role):
    """Tagged before/after boxes by program: (width, height) in data units (inches)."""
    return {a.get_gid().split(":", 2)[2]: (a.get_width(), a.get_height()) for a in tagged(fig, role)}


def test_values_are_drawn_to_scale_and_2d_values_as_grids():
    """Cell size is shared by both sides of a call: all_gather's result of 8 scalars is 8
    times as wide as its input; psum_scatter's result an eighth; an [8,2] result is a
    grid 8 rows tall and 2 wide, not a strip like [16]."""
    f = simpmd.pmap(BODIES["all_gather"], axis_name="i")
    f(np.arange(8.0))                                          # scalars -> [8]
    fig = viz.draw_collective(f.trace)
    (w0, h0), (w1, h1) = _boxes(fig, "before")["device 3"], _boxes(fig, "after")["device 3"]
    assert w1 == pytest.approx(8 * w0) and h1 == pytest.approx(h0)
    fig = viz.draw_collective(run_1d("psum_scatter"))
    (w0, h0), (w1, h1) = _boxes(fig, "before")["device 0"], _boxes(fig, "after")["device 0"]
    assert w0 == pytest.approx(8 * w1)
    fig = viz.draw_collective(run_1d("all_gather", n=2))      # [2] -> [8, 2]
    (w0, h0), (w1, h1) = _boxes(fig, "before")["device 0"], _boxes(fig, "after")["device 0"]
    assert w1 == pytest.approx(w0) and h1 == pytest.approx(8 * h0)


def test_pmax_and_pmin_colour_each_element_by_the_device_that_won():
    from simpmd.viz.collectives import drawing_of
    x = np.array([[5.0, 0.0], [1.0, 9.0], [7.0, 2.0], [0.0, 1.0]])
    for op, expected in (("pmax", [2, 1]), ("pmin", [3, 0])):
        f = simpmd.pmap(BODIES[op], axis_name="i")
        f(x)
        e = next(e for e in f.trace.events if e.kind == "collective")
        ins = [m.inputs[0] for m in f.trace.collectives()[0]]
        assert drawing_of(op).after(e, e.outputs[0], ins).tolist() == expected


def test_grouped_legends_say_colour_is_the_position_in_the_group():
    f = simpmd.pmap(lambda x: lax.psum(x, "i", axis_index_groups=[[0, 2], [1, 3]]), axis_name="i")
    f(np.arange(4.0))
    words = " ".join(texts(viz.draw_collective(f.trace)))
    assert "colour = member of its group" in words and "colour = device" not in words
    assert "{0, 2}" in words and "{1, 3}" in words
    words = " ".join(texts(viz.draw_collective(run_1d("psum"))))
    assert "colour = device" in words


def test_titles_carry_no_source_lines_and_idle_devices_are_marked():
    f = simpmd.pmap(lambda x: lax.ppermute(x, "i", perm=[(0, 1), (1, 0)]), axis_name="i")
    f(np.arange(8.0))
    fig = viz.draw_collective(f.trace)
    words = texts(fig)
    assert not any(".py:" in t or "<cell>" in t for t in words)
    assert sum("(idle)" in t for t in words) == 6                 # devices 2..7 do nothing
    assert len(gids(fig, "link")) == 2


def test_the_palette_is_okabe_ito_and_stays_distinct_for_colour_blind_readers():
    """Under a deuteranopia simulation (Machado, Oliveira & Fernandes 2009, severity 1.0),
    every pair of the 8 device colours stays apart, which tab10's green and red do not."""
    from matplotlib import colormaps
    from simpmd.viz.canvas import device_color
    deutan = np.array([[0.367322, 0.860646, -0.227968], [0.280085, 0.672501, 0.047413],
                       [-0.011820, 0.042940, 0.968881]])

    def seen(rgb):
        linear = np.where(np.asarray(rgb) <= 0.04045, np.asarray(rgb) / 12.92,
                          ((np.asarray(rgb) + 0.055) / 1.055) ** 2.4)
        return np.clip(deutan @ linear, 0, 1)

    ours = [seen(device_color(k, 8)) for k in range(8)]
    closest = min(np.linalg.norm(a - b) for i, a in enumerate(ours) for b in ours[i + 1:])
    tab = [seen(colormaps["tab10"](k)[:3]) for k in (2, 3)]
    assert closest > 2 * np.linalg.norm(tab[0] - tab[1])
    assert device_color(1, 8) == pytest.approx((0x56 / 255, 0xB4 / 255, 0xE9 / 255))


def test_long_1d_meshes_wrap_into_rows_and_elide_the_middle():
    fig = viz.draw_mesh(64, ("i",), highlight_axis="i")
    boxes = {int(a.get_gid().split(":")[2]): a for a in tagged(fig, "device")}
    assert sorted(boxes) == list(range(64)) and not gids(fig, "elided")
    rows = {round(b.get_y(), 6) for b in boxes.values()}
    assert len(rows) == 4                                   # 64 devices: 4 rows of 16
    assert boxes[16].get_x() == pytest.approx(boxes[0].get_x())
    assert boxes[16].get_y() < boxes[0].get_y()
    fig = viz.draw_mesh(512, ("i",))
    shown = sorted(int(g) for g in gids(fig, "device"))
    assert shown == list(range(96)) + list(range(496, 512))   # 6 rows, a note, the last row
    assert gids(fig, "elided") == ["400"]
    assert any("devices 96 to 495" in t for t in texts(fig))


def test_value_boxes_name_the_device_once():
    """Device i returns i: the box says 'device 3' and '3', not three bare 3s."""
    f = simpmd.pmap(lambda x: lax.axis_index("i"), axis_name="i")
    f(np.zeros(8))
    words = texts(viz.draw_trace_mesh(f.trace, values="returned"))
    assert words.count("3") == 1 and words.count("device 3") == 1


def test_the_tree_all_reduce_is_drawn_level_by_level():
    """A binomial tree over 8: 0 on top; 1, 2, 4 one level down; 3, 5, 6 next; 7 last. Each
    parent sits above the middle of its children."""
    run = algorithms.tree_all_reduce([np.full(4, float(d)) for d in range(8)])
    fig = viz.draw_algorithm_step(run, 0)
    box = {int(a.get_gid().split(":")[2]): a for a in tagged(fig, "device")}
    y = {d: round(b.get_y(), 6) for d, b in box.items()}
    levels = [sorted(d for d in y if y[d] == level) for level in sorted(set(y.values()), reverse=True)]
    assert levels == [[0], [1, 2, 4], [3, 5, 6], [7]]
    x = {d: b.get_x() for d, b in box.items()}
    assert x[4] == pytest.approx((x[5] + x[6]) / 2) and x[6] == pytest.approx(x[7])


def test_text_is_never_smaller_than_seven_points():
    trace = run_1d("all_to_all")
    run = algorithms.torus_all_reduce([np.full(16, float(d)) for d in range(8)], (2, 4))
    simpmd.set_device_count(64)
    f = simpmd.pmap(lambda x: lax.all_gather(x, "i"), axis_name="i")
    f(np.arange(64.0))
    ring = algorithms.ring_all_reduce([np.full(64, float(d)) for d in range(64)])
    for fig in (viz.draw_collective(trace), viz.draw_algorithm(run), viz.draw_collective(f.trace),
                viz.draw_mesh(64, ("i",)), viz.draw_timeline(f.trace),
                viz.draw_algorithm_step(ring, 1)):
        sizes = [t.get_fontsize() for t in fig.findobj(lambda a: type(a).__name__ == "Text")
                 if t.get_text()]
        assert min(sizes) >= 7.0


def test_draw_trace_puts_narrow_panels_side_by_side():
    f = simpmd.pmap(lambda v: (lax.psum(v, "i"), lax.pmean(v, "i"), lax.pmax(v, "i"),
                               lax.pmin(v, "i")), axis_name="i")
    f(np.arange(16.0).reshape(8, 2))
    fig = viz.draw_trace(f.trace)
    lefts = sorted({round(ax.get_position().x0, 6) for ax in fig.axes})
    bottoms = sorted({round(ax.get_position().y0, 6) for ax in fig.axes})
    assert len(fig.axes) == 4 and len(lefts) == 2 and len(bottoms) == 2
    assert len(viz.draw_trace(f.trace, ncols=1).axes) == 4
    one = viz.draw_trace(f.trace, ncols=1)
    assert len({round(ax.get_position().x0, 6) for ax in one.axes}) == 1


def test_schedule_labels_fit_their_bars_and_short_chunks_are_labelled_close_up():
    """Lesson 13's interleaved 1F1B: a bar's label is drawn only where it fits inside the
    bar, and a close-up window labels the short forward chunks (F03) the whole step cannot
    (issue 47, item 18)."""
    from simpmd import viz
    from simpmd.viz.canvas import tagged
    segments, clock = [], 0.0
    for k in range(60):                       # 0.5 ms forwards and 1 ms backwards, one row
        kind, t = ("F", 0.5e-3) if k % 3 else ("B", 1e-3)
        segments.append(viz.Segment(0, "compute", clock, clock + t, "s", f"{kind}{k % 2}{k % 8}"))
        clock += t
    tl = viz.Timeline(segments, [0], clock, "communication left out", "", "s")
    for window in (None, (0, 12e-3)):
        fig = viz.draw_timeline(tl, window=window)
        renderer = fig.canvas.get_renderer()
        ax = fig.axes[0]
        bars = [b.get_window_extent(renderer) for b in tagged(fig, "compute")]
        labels = [t for t in ax.texts if t.get_text()[:1] in "FB" and len(t.get_text()) == 3]
        for text in labels:
            box = text.get_window_extent(renderer)
            assert any(b.x0 <= box.x0 and box.x1 <= b.x1 for b in bars), text.get_text()
        forwards = {t.get_text() for t in labels if t.get_text().startswith("F")}
        assert bool(forwards) == (window is not None), (window, forwards)
