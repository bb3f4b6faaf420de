"""The checks of lesson 3's exercises accept the right answers and, for the usual wrong
ones, say what is off (which leaf is mapped or broadcast, where the device axis went,
which argument must be static)."""
import warnings

import numpy as np
import pytest

import simpmd
from simpmd.exercises import lesson03 as ex
from verdicts import verdict


# -- exercise 1: in_axes for a dict of parameters -------------------------------------------

def test_expected_prediction_by_hand():
    # device 2: x[2] = [6, 7, 8], w = [1, 2, 3], b[2] = 20  ->  6 + 14 + 24 + 20 = 64
    assert ex._predict_expected()[2] == 64.0


@pytest.mark.parametrize("answer", [({"w": None, "b": 0}, 0), ({"w": None, "b": -1}, -2)])
def test_pytree_in_axes_right(capsys, answer):
    assert ex.check_pytree_in_axes(answer)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (0, "w gets in_axes 0"),
    ((0, 0), "w gets in_axes 0"),
    ((None, 0), "b gets in_axes None"),
    (({"w": None, "b": None}, 0), "b gets in_axes None"),
    (({"w": None, "b": 0}, None), "x gets in_axes None"),
    (({"w": None, "b": 1}, 0), "b (shape (8,)) is mapped over axis 1"),
    (({"w": None, "b": 0}, -1), "x (shape (8, 3)) is mapped over axis -1"),
    (({"w": None, "b": 0}, 1), "use 0"),
    (({"w": None}, 0), "same keys"),
    ((None,), "give one entry for each"),
    ("w", "should be a tuple"),
    (..., "placeholder"),
])
def test_pytree_in_axes_wrong(capsys, answer, hint):
    assert not ex.check_pytree_in_axes(answer)
    assert hint in verdict(capsys, False)


# -- exercise 2: other axes -------------------------------------------------------------------

def test_other_axes_right(capsys):
    assert ex.check_other_axes(dict(in_axes=1, out_axes=1))
    verdict(capsys, True)
    expected = ex._normalise_expected()
    assert np.allclose(expected.sum(axis=0), 1.0) and expected[0, 0] == 1.0 / 52.0  # 1+9+17+25


def test_other_axes_negative_accepted_with_a_note_about_jax(capsys):
    assert ex.check_other_axes(dict(in_axes=-1, out_axes=-1))
    out = verdict(capsys, True)
    assert "jax.pmap mishandles negative out_axes" in out and "out_axes=1" in out


@pytest.mark.parametrize("answer, hint", [
    (dict(in_axes=1, out_axes=0), "examples became rows"),
    (dict(in_axes=0, out_axes=0), "splits axis 0, the 4 features"),
    (dict(in_axes=None, out_axes=1), "nothing is split"),
    (dict(in_axes=1, out_axes=None), "keep the device axis"),
    (dict(in_axes=1, out_axes=5), "raised"),
    (dict(in_axes=..., out_axes=...), "placeholder"),
    ((1, 1), "dict(in_axes=..., out_axes=...)"),
])
def test_other_axes_wrong(capsys, answer, hint):
    with warnings.catch_warnings():
        warnings.simplefilter("error")         # the check itself must not warn
        assert not ex.check_other_axes(answer)
    assert hint in verdict(capsys, False)


# -- exercise 3: a static loop count ---------------------------------------------------------

def halve(x, times):
    for _ in range(times):
        x = x / 2
    return x


def test_static_right(capsys):
    assert ex.check_static(simpmd.pmap(halve, axis_name="i", static_broadcasted_argnums=1))
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (simpmd.pmap(halve), "static_broadcasted_argnums=1"),
    (simpmd.pmap(halve, in_axes=(0, None)), "static_broadcasted_argnums=1"),
    (simpmd.pmap(lambda x, times: x / 2, static_broadcasted_argnums=1), "differs"),
    (halve, "wrap it"),
    (3, "got int"),
    (None, "placeholder"),
])
def test_static_wrong(capsys, answer, hint):
    assert not ex.check_static(answer)
    assert hint in verdict(capsys, False)
