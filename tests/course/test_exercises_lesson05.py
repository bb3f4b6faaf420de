"""The checks of lesson 5's exercises: right answers pass, typical wrong ones get the right hint."""
import numpy as np
import pytest

import simpmd
from simpmd import lax
from simpmd.exercises import lesson05
from verdicts import verdict


# -- exercise 1: in_axes for scalar parameters ---------------------------------------------

def test_expected_step_is_the_full_batch_step_worked_by_hand():
    # w = 0.5, b = 0, x evenly spaced on [-1, 1] (32 points), y = 3x - 1, lr = 0.1:
    # r = -2.5x + 1, mean(r x) = -2.5 mean(x^2), mean(r) = 1, since mean(x) = 0.
    x = np.linspace(-1, 1, 32)
    mean_x2 = np.mean(x ** 2)
    expected = lesson05._seed_expected()
    assert np.isclose(expected["w"], 0.5 - 0.1 * 2 * (-2.5 * mean_x2))
    assert np.isclose(expected["b"], 0.0 - 0.1 * 2 * 1.0)


@pytest.mark.parametrize("in_axes", [(None, 0), ({"w": None, "b": None}, 0),
                                     (None, {"x": 0, "y": 0})])
def test_in_axes_accepts_broadcast_params(capsys, in_axes):
    assert lesson05.check_in_axes(in_axes)
    verdict(capsys, True, "full-batch step")


@pytest.mark.parametrize("in_axes, hint", [
    (..., "placeholder"),
    ((0, 0), "params is still mapped"),
    (0, "params is still mapped"),
    ((None, None), "nothing is mapped"),
    ((None, 1), "ran on [4] device(s)"),
    ((None, 0, 0), "pmap refused"),
    ([None, 0], "in_axes=(None, 0)"),          # a list: JAX refuses it, as simpmd does
])
def test_in_axes_rejects_with_hint(capsys, in_axes, hint):
    assert not lesson05.check_in_axes(in_axes)
    verdict(capsys, False, hint)


# -- exercise 2: the mean gradient over uneven slices --------------------------------------

def test_counts_are_uneven_and_expected_mean_is_by_examples():
    assert lesson05.COUNTS.sum() == 7 * 32 + 8
    means = lesson05.GRAD_SUMS / lesson05.COUNTS[:, None]
    assert not np.allclose(means.mean(0), lesson05.GRAD_SUMS.sum(0) / 232)


@pytest.mark.parametrize("body", [
    lambda g, c: lax.psum(g, "batch") / lax.psum(c, "batch"),
    lambda g, c: lax.pmean(g, "batch") / lax.pmean(c, "batch"),
    lambda g, c: lax.psum(g / lax.psum(c, "batch"), "batch"),
])
def test_global_gradient_accepts(capsys, body):
    assert lesson05.check_global_gradient(body)
    verdict(capsys, True)


@pytest.mark.parametrize("body, hint", [
    (None, "placeholder"),
    (lambda g, c: None, "returns None"),
    (lambda g, c: lax.pmean(g / c, "batch"), "averaged the per-device means"),
    (lambda g, c: lax.psum(g, "batch") / lax.psum(1, "batch"), "number of devices (8)"),
    (lambda g, c: lax.psum(g, "batch"), "that is the sum over all 232 examples"),
    (lambda g, c: lax.psum(g, "batch") / c, "its own count"),
    (lambda g, c: g / c, "nothing was combined"),
    (lambda g, c: lax.psum(g, "batch").sum() / lax.psum(c, "batch"), "shape ()"),
    (lambda g, c: lax.psum(g, "model") / c, "UnboundAxisError"),
    (lambda g, c: lax.psum(g, "batch") / lax.psum(c, "batch") + lax.axis_index("batch"),
     "device 1 holds"),
    # 8 * 32 = 256 on the first devices, but 7 * 32 + 8 = 232 examples in all
    (lambda g, c: lax.psum(g, "batch") / (8 * c), "8 times its own count"),
    (lambda g, c: lax.psum(g, "batch") / (8 * c), "lax.psum(count, 'batch')"),
    (lambda g, c: lax.psum(g, "batch") / 200.0, "two psums"),
])
def test_global_gradient_rejects_with_hint(capsys, body, hint):
    assert not lesson05.check_global_gradient(body)
    verdict(capsys, False, hint)


# -- exercise 3: bytes of the gradient all-reduce ------------------------------------------

def test_grad_bytes_accepts_15_million(capsys):
    assert lesson05.check_grad_bytes(15_000_000)       # 2 * 3/4 * 2.5e6 values * 4 bytes
    verdict(capsys, True)
    assert lesson05.check_grad_bytes(1.5e7)


def test_grad_bytes_matches_simpmd_trace_for_a_small_gradient():
    f = simpmd.pmap(lambda g: lax.pmean(g, "batch"), axis_name="batch")
    f(np.ones((4, 2500), dtype=np.float32))             # 1/1000 of the question's gradient
    sent = [e.bytes_sent for e in f.trace.events if e.kind == "collective"]
    assert sent == [15_000] * 4


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (7.5e6, "2 bytes per value (bf16)"),
    (7.5e6, "two phases"),
    (17.5e6, "That is for 8 devices"),
    (20e6, "not all of it"),
    (10e6, "size of the gradient itself"),
    (3.75e6, "counts values, not bytes"),
    (120e6, "bits"),
    (15, "factor of a million"),
    (15e3, "factor of 1000"),
    ("15 MB", "number of bytes"),
    (1e6, "expected 1.5e+07 bytes"),
])
def test_grad_bytes_rejects_with_hint(capsys, answer, hint):
    assert not lesson05.check_grad_bytes(answer)
    verdict(capsys, False, hint)


# -- exercise 4: the mean gradient under shard_map(check_vma=True) -------------------------

def test_mean_gradient_under_check_vma(capsys):
    grad = simpmd.grad
    assert lesson05.check_mean_gradient(
        lambda w, x, y: grad(lesson05.vma_loss)(w, x, y) / lax.axis_size("batch"))
    verdict(capsys, True, "mean gradient")
    assert not lesson05.check_mean_gradient(lambda w, x, y: grad(lesson05.vma_loss)(w, x, y))
    verdict(capsys, False, "8 times the mean gradient")
    assert not lesson05.check_mean_gradient(lambda w, x, y: lax.pmean(grad(lesson05.vma_loss)(w, x, y), "batch"))
    verdict(capsys, False, "already sums")
    assert not lesson05.check_mean_gradient(lambda w, x, y: grad(lesson05.vma_loss)(w, x, y) / 64)
    verdict(capsys, False, "once too often")
    assert not lesson05.check_mean_gradient(None)
    verdict(capsys, False, "placeholder")
    assert not lesson05.check_mean_gradient(lambda w, x, y: None)
    verdict(capsys, False, "returned None")
