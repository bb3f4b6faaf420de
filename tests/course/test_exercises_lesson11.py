"""The checks of lesson 11's exercises: right answers pass, typical wrong ones get the hint
that names what is off."""
import numpy as np
import pytest

import simpmd
from simpmd import P, lax
from simpmd.exercises import lesson11 as ex


def said(capsys):
    return capsys.readouterr().out


# -- exercise 1: specs ---------------------------------------------------------------------

def test_specs_right(capsys):
    assert ex.check_specs((P("i"), P()), P())
    assert ex.check_specs([P("i", None), P(None)], P())        # trailing Nones are the same spec
    assert "Correct" in said(capsys)


def test_specs_accept_none_for_the_whole_w_and_say_p_is_the_usual_spelling(capsys):
    assert ex.check_specs((P("i"), None), P())
    out = said(capsys)
    assert out.startswith("Correct") and "None works too" in out and "P()" in out


def test_none_in_in_specs_passes_the_argument_whole_on_the_installed_jax():
    """What the checker tells the learner about None, held to the JAX that runs the tests
    (checked by hand on 0.7.2, 0.10.2 and 0.12.0.1): w with spec None reaches every device
    whole, and the result equals the one with P()."""
    jax = pytest.importorskip("jax")
    devices = simpmd.use_jax_devices(8, verbose=False)
    mesh = jax.sharding.Mesh(np.array(devices), ("i",))
    x, w = np.arange(24.0, dtype=np.float32).reshape(8, 3), np.array([1, 0.5, -1], np.float32)
    seen = []

    def body(xb, wb):
        seen.append(wb.shape)
        return jax.lax.psum((xb * wb).sum(), "i")
    run = jax.shard_map(body, mesh=mesh, in_specs=(jax.P("i"), None), out_specs=jax.P())
    assert float(jax.jit(run)(x, w)) == float((x * w).sum())
    assert seen == [(3,)]


def test_specs_accept_jax_partition_specs():
    pytest.importorskip("jax")
    from jax.sharding import PartitionSpec
    assert ex.check_specs((PartitionSpec("i"), PartitionSpec()), PartitionSpec())


@pytest.mark.parametrize("in_specs, out_specs, hint", [
    (..., ..., "placeholders"),
    (P("i"), P(), "one spec per argument"),
    ((P(), P()), P(), "its axis 0 is split"),
    ((P(None, "i"), P()), P(), "FIRST axis"),
    ((P("i"), P("i")), P(), "in_axes=None gives every device the whole"),
    ((P("i"), P()), P("i"), "out_axes=None returns ONE copy"),
    (("i", P()), P(), "P('i')"),
    ((None, P()), P(), "passes x whole to every device"),
    ((P("j"), P()), P(), "only axis is 'i'"),
    ((P("i"), P()), P(None, "i"), "along axis 1, like out_axes=1"),
    ((P("i"), P()), P("j"), "names no axis of this mesh"),
    ((P("i"), P()), None, "returned once, is P()"),
])
def test_specs_wrong(in_specs, out_specs, hint, capsys):
    assert not ex.check_specs(in_specs, out_specs)
    assert hint in said(capsys)


# -- exercise 2: block shapes ----------------------------------------------------------------

def test_block_shapes_right(capsys):
    assert ex.check_block_shapes((8, 6), (16, 3), [4, 24])
    assert said(capsys).count("Correct") == 3


def test_block_shapes_match_the_engine_and_the_spec_rules():
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    answers = {"a": (8, 6), "b": (16, 3), "c": (4, 24)}
    for label, (shape, entries) in ex.BLOCK_QUESTIONS.items():
        spec = P(*entries)
        assert simpmd.NamedSharding(mesh, spec).shard_shape(shape) == answers[label]


@pytest.mark.parametrize("answers, hints", [
    (((4, 12), (16, 3), (4, 24)), ["'data' has 2, 'model' 4", "24 / 4 = 6"]),
    (((8, 6), (16, 6), (4, 24)), ["2 x 4 = 8 blocks"]),
    (((8, 6), (16, 3), (8, 24)), ["'model', which has 4 devices"]),
    (((8, 6), (2, 3), (4, 24)), ["not split by", "keeps its size 16"]),
    (((8, 6), (16, 3), (24,)), ["pmap removes the mapped axis"]),
    (((8, 6, 1), (16, 3), (4, 24)), ["x has 2 dimensions"]),
    (((8, 6), "16x3", (4, 24)), ["shape tuple"]),
    (((8, 6), (16, 3), ...), ["placeholder"]),
])
def test_block_shapes_wrong(answers, hints, capsys):
    assert not ex.check_block_shapes(*answers)
    out = said(capsys)
    for h in hints:
        assert h in out


# -- exercise 3: porting a pmap program ------------------------------------------------------

MESH1 = simpmd.make_mesh((8,), ("i",))


def sm(body, out_specs=P("i"), **kw):
    return simpmd.shard_map(body, mesh=MESH1, in_specs=P("i"), out_specs=out_specs, **kw)


def test_centering_right(capsys):
    assert ex.check_centering(sm(lambda r: r - lax.pmean(r, "i")))
    assert "Correct" in said(capsys)


@pytest.mark.parametrize("centered, hint", [
    (..., "placeholder"),
    (simpmd.pmap(lambda r: r - lax.pmean(r, "i"), axis_name="i"), "is a simpmd.pmap"),
    (sm(lambda r: r - lax.pmean(r, "i"), out_specs=P()), "simpmd refused"),
    (sm(lambda r: r - lax.pmean(r, "i"), out_specs=P(), check_vma=False), "shape (1, 3)"),
    (sm(lambda r: (r - lax.pmean(r, "i"))[0], out_specs=P(), check_vma=False), "shape (3,)"),
    (sm(lambda r: r - lax.psum(r, "i")), "column SUMS"),
    (sm(lambda r: r), "unchanged"),
    (sm(lambda r: r - r.mean(axis=1, keepdims=True)), "each row's own mean"),
    (sm(lambda r: r - lax.pmean(r, "i") + lax.axis_index("i") * 0.0 + (lax.axis_index("i") == 3)),
     "rows [3] differ"),
    (sm(lambda r: r - lax.pmean(r, "j")), "raised"),
    (sm(lambda r: None), "returned None"),
    (lambda x: x - x.mean(0), "plain Python function, not a simpmd.shard_map"),
    (sm(lambda r: r - r.mean(0)), "mean of its own block"),
    (simpmd.shard_map(lambda r: r - r.mean(0), mesh=MESH1, in_specs=P(), out_specs=P()),
     "no collective ran"),
    (3.0, "should be a simpmd.shard_map"),
    # P(): every device has the whole x, so r - pmean(r) is zeros, for another reason
    (simpmd.shard_map(lambda r: r - lax.pmean(r, "i"), mesh=MESH1, in_specs=P(), out_specs=P()),
     "P() names no mesh axis"),
])
def test_centering_wrong(centered, hint, capsys):
    assert not ex.check_centering(centered)
    assert hint in said(capsys)


def test_centering_names_mesh_i_the_exercises_mesh(capsys):
    assert not ex.check_centering(simpmd.pmap(lambda r: r - lax.pmean(r, "i"), axis_name="i"))
    out = said(capsys)
    assert "mesh=mesh_i" in out and "mesh1" not in out


def test_centering_with_in_specs_p_explains_what_p_does(capsys):
    # in_specs=P(): every device gets the whole (8, 3) x; the pmean of 8 equal copies is x
    # itself, so each block is zeros, and out_specs=P('i') joins 8 blocks of (8, 3): (64, 3).
    whole = simpmd.shard_map(lambda r: r - lax.pmean(r, "i"), mesh=MESH1, in_specs=P(),
                             out_specs=P("i"))
    assert np.asarray(whole(ex.centering_data())).shape == (64, 3)
    assert not ex.check_centering(whole)
    out = said(capsys)
    assert "(64, 3)" in out and "P() names no mesh axis" in out and "P('i')" in out


# -- exercise 4: bytes of a sharded array ---------------------------------------------------

RIGHT = 4096 // 2 * 8192 * 2


def test_sharded_bytes_right(capsys):
    assert ex.check_sharded_bytes(RIGHT)
    assert "33,554,432" in said(capsys)


@pytest.mark.parametrize("answer, hints", [
    (RIGHT // 4, ["do not divide by 8"]),
    (RIGHT * 2, ["one of these", "4 is float32", "each holds half"]),
    (RIGHT // 2, ["not 'model' (4)"]),
    (RIGHT * 8, ["counts bits"]),
    (RIGHT / 2**20, ["not MiB"]),
])
def test_sharded_bytes_wrong(answer, hints, capsys):
    assert not ex.check_sharded_bytes(answer)
    out = said(capsys)
    for h in hints:
        assert h in out


@pytest.mark.parametrize("out_specs", [P("i"), P(None, "i"), P("j"), None])
def test_specs_each_wrong_out_spec_gets_its_own_hint(out_specs, capsys):
    # Each wrong out_specs is told what IT does, written as the learner wrote it.
    assert not ex.check_specs((P("i"), P()), out_specs)
    text = said(capsys)
    assert "P('i',)" not in text
    if out_specs is None:
        assert "in_specs" not in text
    else:
        assert f"out_specs is P({', '.join(repr(e) for e in out_specs)})" in text


def test_check_cells_show_no_bare_bool():
    # A checker's verdict is truthy/falsy for assert, but Jupyter shows nothing for it.
    verdict = ex.check_specs(..., ...)
    assert not verdict and verdict == False  # noqa: E712
    assert hasattr(verdict, "_ipython_display_") and verdict._ipython_display_() is None
    assert ex.check_specs((P("i"), P()), P()) and ex.check_block_shapes(..., ..., ...) == False  # noqa: E712
