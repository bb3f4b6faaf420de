"""The checks of lesson 4's exercises: right answers pass, typical wrong ones get the right hint."""
import pytest

from simpmd import lax
from simpmd.exercises import lesson04
from verdicts import verdict


# -- exercise 1: a mean without pmean ------------------------------------------------------

def test_global_mean_accepts_psum_over_axis_size(capsys):
    assert lesson04.check_global_mean(lambda x: lax.psum(x, "i") / lax.psum(1, "i"))
    verdict(capsys, True, "matches")
    assert lesson04.check_global_mean(lambda x: lax.psum(x / lax.axis_size("i"), "i"))
    verdict(capsys, True)


@pytest.mark.parametrize("body, hint", [
    (None, "placeholder"),
    (lambda x: None, "returns None"),
    (lambda x: lax.psum(x, "i"), "8 times the mean"),
    (lambda x: lax.pmean(x, "i"), "lax.pmean"),
    (lambda x: x, "its own x"),
    (lambda x: x / 8, "never summed"),
    (lambda x: lax.psum(x, "j"), "raised on simpmd: UnboundAxisError"),
    (lambda x: lax.psum(x, "i").sum() / 8, "shape ()"),
    (lambda x: lax.psum(x, "i") / 8 + lax.axis_index("i"), "device 1 holds"),
])
def test_global_mean_rejects_with_hint(capsys, body, hint):
    assert not lesson04.check_global_mean(body)
    verdict(capsys, False, hint)


def test_global_mean_refuses_a_hard_coded_device_count(capsys):
    # psum / 8 is right on the 8 devices of the exercise; on 4 devices the mean is the sum
    # over 4 rows divided by 4, and dividing by 8 gives half of it: the check runs both.
    assert not lesson04.check_global_mean(lambda x: lax.psum(x, "i") / 8)
    verdict(capsys, False, "right on 8 devices", "divides by 8", "lax.psum(1, 'i')")


def test_global_mean_divided_by_the_row_length_gets_a_hint(capsys):
    # Inside the body x has shape (3,): x.shape[0] is 3, so the result is the sum / 3.
    assert not lesson04.check_global_mean(lambda x: lax.psum(x, "i") / x.shape[0])
    verdict(capsys, False, "divided by 3", "x.shape[0] is not the number of devices")


# -- exercise 2: ring shift to the left ----------------------------------------------------

def test_shift_left_accepts_any_order_of_pairs(capsys):
    perm = [((j + 1) % 8, j) for j in range(8)]
    assert lesson04.check_shift_left(perm)
    verdict(capsys, True)
    assert lesson04.check_shift_left(list(reversed(perm)))
    verdict(capsys, True)


@pytest.mark.parametrize("perm, hint", [
    (..., "placeholder"),
    ([(j, (j + 1) % 8) for j in range(8)], "(source, destination): swap"),
    ([(j + 1, j) for j in range(7)], "add the pair (0, 7)"),
    ([(1, 0), (1, 2)], "more than once as source"),
    ([(j, j) for j in range(8)], "device 0 receives from device 0; it should receive from device 1"),
    ([(9, 0)], "outside 0..7"),
    ("ring", "(source, destination) pairs"),
])
def test_shift_left_rejects_with_hint(capsys, perm, hint):
    assert not lesson04.check_shift_left(perm)
    verdict(capsys, False, hint)


# -- exercise 3: shapes --------------------------------------------------------------------

def test_shapes_accepts_the_worked_shapes(capsys):
    assert lesson04.check_shapes(((4, 8, 16), (4, 128), (4, 2)))
    verdict(capsys, True)
    assert lesson04.check_shapes([[4, 8, 16], [4, 128], [4, 2]])     # lists are fine


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (((8, 4, 16), (4, 128), (4, 2)), "That is axis=0"),
    (((4, 128), (4, 128), (4, 2)), "shape 1"),
    (((4, 8, 16), (4, 8, 16), (4, 2)), "That is the untiled shape"),
    (((4, 8, 16), (32, 16), (4, 2)), "joins along axis 0"),
    (((4, 8, 16), (4, 128), (4,)), "With tiled=True the scattered dimension stays"),
    (((4, 8, 16), (4, 128), (4, 16)), "keeps only its own block"),
    (((4, 8, 16), (4, 128)), "2 shape(s)"),
    ((4, 8, 16), "three shapes"),
])
def test_shapes_rejects_with_hint(capsys, answer, hint):
    assert not lesson04.check_shapes(answer)
    verdict(capsys, False, hint)


# -- exercise 4: bytes of a bf16 ring all-reduce -------------------------------------------

def test_ring_bytes_accepts_14336(capsys):
    assert lesson04.check_ring_bytes(14336)            # 2 * 7/8 * 4096 values * 2 bytes
    verdict(capsys, True, "14336 bytes")
    assert lesson04.check_ring_bytes(2 * 7 / 8 * 8192.0)


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (28672, "4 bytes per value (float32); bf16 takes 2"),
    (7168, "half the answer"),
    (7168, "counting values instead of bytes"),
    (7168, "counting one phase of the ring"),
    (16384, "(p-1)/p of the buffer"),
    (8192, "size of the buffer itself"),
    (14336 * 8, "bits"),
    (14.336, "factor of 1000"),
    ("lots", "number of bytes"),
    (10000, "expected 14336 bytes"),
])
def test_ring_bytes_rejects_with_hint(capsys, answer, hint):
    assert not lesson04.check_ring_bytes(answer)
    verdict(capsys, False, hint)


def test_ring_bytes_seven_whole_buffers_is_not_called_a_float32_slip(capsys):
    # 7 ring steps each sending the whole buffer: 7 * 4096 values * 2 bytes = 57,344 bytes,
    # 4 times the answer, but by counting whole buffers, not by counting 4 bytes per value
    # (that slip gives 2 * 7/8 * 4096 * 4 = 28,672, twice the answer).
    assert 7 * 4096 * 2 == 57344 == 4 * 14336
    assert not lesson04.check_ring_bytes(57344)
    out = verdict(capsys, False, "p-1 whole buffers", "n/p values")
    assert "float32" not in out


def test_ring_bytes_7168_names_each_slip_once(capsys):
    # 7168 = 7/8 * 4096 * 2 (one phase, in bytes) = 2 * 7/8 * 4096 (both phases, in values):
    # one hint, naming both slips, and nothing else.
    assert 7 / 8 * 4096 * 2 == 2 * 7 / 8 * 4096 == 7168
    assert not lesson04.check_ring_bytes(7168)
    out = capsys.readouterr().out
    assert out.count("Not yet") == 1 and " Or " not in out
    assert out.index("values instead of bytes") < out.index("one phase")


def test_a_placeholder_gives_a_false_verdict_that_jupyter_does_not_show(capsys):
    verdict = lesson04.check_ring_bytes(...)
    assert not verdict and type(verdict).__name__ == "Verdict"
    assert verdict._ipython_display_() is None
    assert "Not yet" in capsys.readouterr().out
