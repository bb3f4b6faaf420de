"""The checks of lesson 9's exercises: right answers pass, typical wrong ones get the hint
that names what is off."""
import numpy as np
import pytest

import simpmd
from simpmd import lax
from simpmd.exercises import lesson09 as ex


def said(capsys):
    return capsys.readouterr().out


# -- exercise 1 -----------------------------------------------------------------------------

@pytest.mark.parametrize("answer, hint", [
    ((16, 23), "excludes stop"),
    ((24, 28), "over all 8 devices"),
    ((8, 16), "'data' coordinate"),
    ((16, 20), "8 columns wide"),
    ((0, 8), "another device's block"),
    ("16:24", "two integers"),
    (None, "placeholder"),
])
def test_columns_wrong(answer, hint, capsys):          # on the 2x4 mesh the lesson draws
    assert not ex.check_columns(answer, mesh_shape=(2, 4))
    assert hint in said(capsys)


def test_columns_right(capsys):
    assert ex.check_columns((16, 24), mesh_shape=(2, 4))
    assert ex.check_columns(slice(16, 24), mesh_shape=(2, 4))
    assert "data=1, model=2" in said(capsys)


def test_the_exercise_asks_about_the_4x2_mesh_the_lesson_does_not_draw(capsys):
    # device 6 of a row-major 4x2 mesh: data = 6 // 2 = 3, model = 6 % 2 = 0; 32 columns
    # over 2 'model' blocks of 16: columns 0:16
    assert ex.check_columns((0, 16))
    assert "data=3, model=0" in said(capsys)
    assert not ex.check_columns((16, 24))              # read off the 2x4 figure
    assert "2x4 mesh" in said(capsys)
    assert not ex.check_columns((16, 32))
    assert "another device's block" in said(capsys)


@pytest.mark.parametrize("shape", [(2, 4), (4, 2)])
def test_columns_agrees_with_the_sharding_itself(shape):
    mesh = simpmd.make_mesh(shape, ("data", "model"))
    index = simpmd.NamedSharding(mesh, simpmd.P(None, "model")).devices_indices_map((8, 32))
    for dev, (_, cols) in index.items():
        assert ex.check_columns((cols.start, cols.stop), device=dev.id, mesh_shape=shape)


# -- exercise 2 -----------------------------------------------------------------------------

def test_row_parallel_right(capsys):
    assert ex.check_row_parallel(lambda h, w: lax.psum(h @ w, "model"))
    assert "Correct" in said(capsys)


@pytest.mark.parametrize("fn, hint", [
    (None, "placeholder"),
    (lambda h, w: None, "returned None"),
    (lambda h, w: h @ w, "partial product"),
    (lambda h, w: lax.pmean(h @ w, "model"), "pmean"),
    (lambda h, w: lax.all_gather(h @ w, "model"), "all_gather"),
    (lambda h, w: lax.psum_scatter(h @ w, "model", tiled=True), "psum_scatter"),
    (lambda h, w: lax.psum(h @ w, "data"), "raised"),
    (lambda h, w: lax.psum(h @ w, "model") + 1.0, "differs"),
    (lambda h, w: lax.psum(h @ w, "model").T, "shape"),
])
def test_row_parallel_wrong(fn, hint, capsys):
    assert not ex.check_row_parallel(fn)
    assert hint in said(capsys)


# -- exercise 3 -----------------------------------------------------------------------------

RIGHT_WEIGHTS = 2 * 4096 * 16384 * 2 // 4


def test_weight_bytes_right(capsys):
    assert ex.check_weight_bytes(RIGHT_WEIGHTS)
    assert "67,108,864" in said(capsys)


@pytest.mark.parametrize("answer, hints", [
    (RIGHT_WEIGHTS * 4, ["split 4 ways"]),
    (RIGHT_WEIGHTS // 2, ["two weight matrices", "do not divide by 8"]),
    (RIGHT_WEIGHTS * 2, ["4 is float32", "not over 'data'"]),
    (RIGHT_WEIGHTS * 8, ["counts bits"]),
    (RIGHT_WEIGHTS / 2**20, ["not MiB"]),
    (RIGHT_WEIGHTS * 4 / 2**20, ["split 4 ways", "not MiB"]),
])
def test_weight_bytes_wrong(answer, hints, capsys):
    assert not ex.check_weight_bytes(answer)
    out = said(capsys)
    for h in hints:
        assert h in out


# -- exercise 4 -----------------------------------------------------------------------------

RIGHT_PSUM = 4096 * 4096 * 2 * 1.5


def test_psum_bytes_right(capsys):
    assert ex.check_psum_bytes(RIGHT_PSUM)
    assert "50,331,648" in said(capsys)


@pytest.mark.parametrize("answer, hints", [
    (RIGHT_PSUM / 1.5, ["not the buffer once"]),
    (RIGHT_PSUM / 1.5 * 0.75 * 2 / 2, ["reduce-scatter AND an all-gather"]),
    (RIGHT_PSUM / 1.5 * 1.75, ["p = 4, not 8"]),
    (RIGHT_PSUM / 1.5 * 3, ["not p-1 whole buffers"]),
    (RIGHT_PSUM / 4, ["do not split them over 'model'"]),
    (RIGHT_PSUM * 8, ["counts bits"]),
    (RIGHT_PSUM / 2**20, ["not MiB"]),
])
def test_psum_bytes_wrong(answer, hints, capsys):
    assert not ex.check_psum_bytes(answer)
    out = said(capsys)
    for h in hints:
        assert h in out


def test_psum_ring_factor_is_what_simpmd_logs():
    """The checker's 2(p-1)/p is the engine's accounting for a psum over 4 devices."""
    f = simpmd.pmap(lambda v: lax.psum(v, "model"), axis_name="model")
    f(np.ones((4, 256), dtype=np.float32))
    sent = [e.bytes_sent for e in f.trace.events if e.kind == "collective"]
    assert sent == [256 * 4 * 2 * 3 // 4] * 4


# -- exercise 5: FSDP's backward reduce-scatter ------------------------------------------------

def test_fsdp_backward_right_and_typical_mistakes(capsys):
    from verdicts import verdict
    g = ex.fsdp_gradients()
    want = g.sum(0).reshape(4, 2, 3)                     # summed by hand, blocks of 2 rows
    assert ex.check_fsdp_backward(lambda x: lax.psum_scatter(x, "data", tiled=True))
    verdict(capsys, True, "reduce-scatter")
    assert np.allclose(np.asarray(simpmd.pmap(lambda x: lax.psum_scatter(
        x, "data", tiled=True), "data")(g)), want)
    assert not ex.check_fsdp_backward(lambda x: lax.psum(x, "data"))
    verdict(capsys, False, "psum, an all-reduce")
    assert not ex.check_fsdp_backward(lambda x: x.reshape(4, 2, 3)[lax.axis_index("data")])
    verdict(capsys, False, "OWN gradient")
    assert not ex.check_fsdp_backward(
        lambda x: lax.psum_scatter(x, "data", tiled=True) / 4)
    verdict(capsys, False, "4 times too small")
    assert not ex.check_fsdp_backward(lambda x: lax.psum_scatter(x, "data"))
    verdict(capsys, False, "raised")
    assert not ex.check_fsdp_backward(
        lambda x: lax.psum_scatter(x, "data", tiled=True)[::-1])
    verdict(capsys, False, "device 0")
    assert not ex.check_fsdp_backward(None)
    verdict(capsys, False, "placeholder")


def test_fsdp_backward_is_what_grad_makes_of_all_gather():
    """The checker's right answer is the transpose simpmd.grad runs for a tiled all_gather."""
    g = ex.fsdp_gradients()

    def body(w_shard, g_full):
        return simpmd.grad(lambda s: (lax.all_gather(s, "data", tiled=True) * g_full).sum())(w_shard)
    got = np.asarray(simpmd.pmap(body, "data")(np.zeros((4, 2, 3), np.float32), g))
    assert np.allclose(got, g.sum(0).reshape(4, 2, 3))


def test_fsdp_backward_refuses_an_all_reduce_then_a_slice(capsys):
    """psum, then each device slicing its own rows, gives the right numbers through the
    all-reduce the lesson warns against: the trace shows the psum, and the check refuses it."""
    from verdicts import verdict
    g = ex.fsdp_gradients()
    sliced = lambda x: lax.psum(x, "data").reshape(4, 2, 3)[lax.axis_index("data")]
    # the values alone would pass: device d's rows 2d, 2d+1 of the sum, worked with NumPy
    out = np.asarray(simpmd.pmap(sliced, "data")(g))
    assert np.allclose(out, g.sum(0).reshape(4, 2, 3))
    assert not ex.check_fsdp_backward(sliced)
    verdict(capsys, False, "the trace shows psum", "psum_scatter")


def test_row_parallel_all_gather_first_gets_a_hint_not_numpys_error(capsys):
    """Gathering h before the product: W2's block has 4 rows, the gathered h 16 columns."""
    from verdicts import verdict
    gather_first = lambda h, w: lax.all_gather(h, "model", axis=1, tiled=True) @ w
    assert not ex.check_row_parallel(gather_first)
    out = verdict(capsys, False, "all_gather", "h_k @ W2_k")
    assert "gufunc" not in out
    # untiled: (4, 8, 4) @ (4, 4) runs, giving h_j @ W2_k, which are not the partial products
    assert not ex.check_row_parallel(lambda h, w: lax.all_gather(h, "model") @ w)
    verdict(capsys, False, "not the partial products")
    assert not ex.check_row_parallel(lambda h, w: lax.all_gather(h @ w, "model"))
    verdict(capsys, False, "does not add them")
