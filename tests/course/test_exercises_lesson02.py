"""The checks of lesson 2's exercises accept the right answers and, for the usual wrong
ones, say what is off (a shape, which examples a device gets, the value on a device)."""
import numpy as np
import pytest

import simpmd.numpy as snp
from simpmd import lax
from simpmd.exercises import lesson02 as ex
from verdicts import verdict


# -- exercise 1: shapes ---------------------------------------------------------------------

def test_shapes_right(capsys):
    assert ex.check_shapes(((5, 3), (3,), (8, 3)))
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (((1, 5, 3), (3,), (8, 3)), "device i sees x[i], not x[i:i+1]"),
    (((8, 5, 3), (3,), (8, 3)), "only its own slice"),
    (((5, 3), (5,), (8, 3)), "old axis 1"),
    (((5, 3), (3,), (3,)), "new axis 0"),
    (((5, 3), (3,), (24,)), "not joined end to end"),
    (..., "placeholder"),
    ("(5, 3)", "three shapes"),
])
def test_shapes_wrong(capsys, answer, hint):
    assert not ex.check_shapes(answer)
    assert hint in verdict(capsys, False)


# -- exercise 2: reshaping a batch ----------------------------------------------------------

def test_batch_right(capsys):
    assert ex.check_batch(ex.BATCH.reshape(8, 4, 3))
    verdict(capsys, True)


@pytest.mark.parametrize("make, hint", [
    (lambda b: b.reshape(4, 8, 3), "only 4 devices"),
    (lambda b: b, "32 devices"),
    (lambda b: b.reshape(8, 12), "keep the features axis"),
    (lambda b: b.reshape(4, 8, 3).transpose(1, 0, 2), "every 8th example"),
    (lambda b: b[::-1].reshape(8, 4, 3), "device 0 would get examples [31, 30, 29, 28]"),
    (lambda b: ..., "placeholder"),
])
def test_batch_wrong(capsys, make, hint):
    assert not ex.check_batch(make(ex.BATCH))
    assert hint in verdict(capsys, False)


def test_batch_expected_is_consecutive_examples():
    expected = ex._batch_expected()
    assert expected.shape == (8, 4, 3)
    assert expected[1, 0, 0] == 12.0 and expected[7, 3, 2] == 95.0   # example 4 and 31


# -- exercise 3: the norm of a vector split across devices ---------------------------------

def test_global_norm_right(capsys):
    assert ex.NORM_SQUARED == 4324.0                       # 23 * 24 * 47 / 6
    assert ex.check_global_norm(lambda x: snp.sqrt(lax.psum((x * x).sum(), "i")))
    verdict(capsys, True)


@pytest.mark.parametrize("body, hint", [
    (lambda x: snp.sqrt((x * x).sum()), "its own row only"),
    (lambda x: lax.psum((x * x).sum(), "i"), "squared norm"),
    (lambda x: lax.psum(snp.sqrt((x * x).sum()), "i"), "Norms do not add"),
    (lambda x: snp.sqrt(lax.psum((x * x).sum(), "batch")), "called 'i' here"),
    (lambda x: snp.sqrt(lax.psum(x * x, "i")), "one number"),
    (lambda x: None, "returns None"),
    # NumPy's sqrt on a mapped value: the verdict keeps the fix, not only the first sentence
    (lambda x: np.sqrt(lax.psum((x * x).sum(), "i")), "snp.sqrt(...)"),
    (lambda x: lax.psum(x.sum(), "i"), "expected 65.7571"),
    (None, "placeholder"),
    (3.0, "should be a function"),
])
def test_global_norm_wrong(capsys, body, hint):
    assert not ex.check_global_norm(body)
    assert hint in verdict(capsys, False)
