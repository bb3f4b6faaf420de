"""Lesson 7's answer checks accept the right answers and say what is off in wrong ones."""
import functools

import numpy as np
import pytest

from simpmd.exercises import lesson07 as ex
from verdicts import verdict


# -- exercise 1 ----------------------------------------------------------------------------

def test_groups_right_answer_in_any_order(capsys):
    assert ex.check_data_groups([(1, 7, 5, 3), [6, 4, 2, 0]])
    verdict(capsys, True, "(0, 2, 4, 6)", "(1, 3, 5, 7)")


@pytest.mark.parametrize("answer, fragments", [
    (..., ["placeholder"]),
    ([(0, 1), (2, 3), (4, 5), (6, 7)], ["groups of a collective over 'model'"]),
    ([tuple(range(8))], ["('data', 'model') together"]),
    ([(0, 4), (1, 5), (2, 6), (3, 7)], ["2x4 mesh", "4x2"]),
    ([(0, 2, 4), (1, 3, 5, 7)], ["[6] are in no group"]),
    ([(0, 2, 4, 6), (1, 3, 5, 6)], ["[6] appear in more than one group"]),
    ([(0, 2, 4, 9), (1, 3, 5, 7)], ["devices 0-7", "9"]),
    ([(0, 2, 4, 7), (1, 3, 5, 6)], ["device 7 (data=3, model=1) is in the group of device 0",
                                     "(0, 2, 4, 6)"]),
    (5, ["list of groups"]),
])
def test_groups_wrong_answers_get_the_right_hint(capsys, answer, fragments):
    assert not ex.check_data_groups(answer)
    verdict(capsys, False, *fragments)


def test_expected_groups_come_from_the_layout_not_a_solution():
    assert ex.groups_along(np.arange(8).reshape(4, 2), 0) == {
        frozenset({0, 2, 4, 6}), frozenset({1, 3, 5, 7})}
    assert ex.groups_along(np.arange(8).reshape(4, 2), 1) == {
        frozenset({0, 1}), frozenset({2, 3}), frozenset({4, 5}), frozenset({6, 7})}


# -- exercise 2 ----------------------------------------------------------------------------

def test_worked_example_2x4_is_14_everywhere(capsys):
    np.testing.assert_array_equal(ex.expected_2x4(), np.full((2, 4), 14.0))   # by hand
    assert ex.check_worked_example_2x4(np.full((2, 4), 14.0))
    verdict(capsys, True, "14 on every device")


@pytest.mark.parametrize("answer, fragments", [
    (None, ["placeholder"]),
    (14.0, ["right value", "per device"]),
    (np.full((4, 2), 14.0), ["shape (4, 2)", "(2, 4)"]),
    (np.full((2, 4), 56.0), ["4 times too large", "12.0"]),
    (np.full((2, 4), 7.0), ["half", "multiplies by 2"]),
    (np.array([[3.0] * 4, [11.0] * 4]), ["after the psum over 'model'", "outer"]),
    (np.array([[14.0] * 4, [14.0, 14.0, 13.0, 14.0]]), ["device 6 (data=1, model=2)", "13"]),
    ("fourteen", ["array of numbers"]),
])
def test_worked_example_wrong_answers_get_the_right_hint(capsys, answer, fragments):
    assert not ex.check_worked_example_2x4(answer)
    verdict(capsys, False, *fragments)


# -- exercise 3 ----------------------------------------------------------------------------

def _pmap_of_vmap(jax, psum_axes=("data",)):
    def inner_body(x, p):           # the second psum is called here, where both names are bound
        return jax.lax.psum(jax.lax.psum(x * p, "model") * 2, psum_axes)

    def outer_body(x, p):
        return jax.vmap(inner_body, axis_name="model")(x, p)

    return lambda x, p: jax.pmap(outer_body, axis_name="data", devices=jax.devices()[:2])(x, p)


def test_modern_accepts_pmap_of_vmap(jax8, capsys):
    assert ex.check_modern(_pmap_of_vmap(jax8))
    verdict(capsys, True, "14 on every device")


def test_modern_refuses_nested_pmap_with_the_vmap_hint(jax8, capsys):
    inner = jax8.pmap(lambda x, p: jax8.lax.psum(x * p, "model") * 2, axis_name="model",
                      devices=jax8.devices()[:4])
    nested = jax8.pmap(lambda x, p: jax8.lax.psum(inner(x, p), "data"), axis_name="data",
                       devices=jax8.devices()[:2])
    assert not ex.check_modern(nested)
    verdict(capsys, False, "jax.pmap inside a jax.pmap", "jax.vmap")


def test_modern_names_a_sum_over_both_axes(jax8, capsys):
    assert not ex.check_modern(_pmap_of_vmap(jax8, ("data", "model")))
    verdict(capsys, False, "4 times too large")


@pytest.mark.parametrize("fn, fragments", [
    (None, ["placeholder"]),
    (lambda x, p: None, ["returned None"]),
    (lambda x, p: np.full((2, 4), 14.0), ["not a value worked out by hand"]),
    (lambda x, p: 1 / 0, ["ZeroDivisionError"]),
    (42, ["function of (x, p)"]),
])
def test_modern_other_mistakes(capsys, fn, fragments):
    assert not ex.check_modern(fn)
    verdict(capsys, False, *fragments)


def test_modern_unbound_axis_hint(jax8, capsys):
    fn = functools.partial(
        lambda jax, x, p: jax.pmap(lambda a, b: jax.lax.psum(a * b, "model"), axis_name="data",
                                   devices=jax.devices()[:2])(x, p), jax8)
    assert not ex.check_modern(fn)
    verdict(capsys, False, "Name the outer map 'data'")
