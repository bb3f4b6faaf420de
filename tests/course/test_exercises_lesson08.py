"""Lesson 8's answer checks accept the right answers and say what is off in wrong ones."""
import functools

import numpy as np
import pytest

from simpmd.exercises import lesson08 as ex
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


# -- exercise 3: pmap over 'model' (axis 1 of x), vmap over 'data' ---------------------------

def _program(jax, psum_axes=("data",)):
    def body(x, p):                 # one grid position; both names are bound here
        return jax.lax.psum(jax.lax.psum(x * p, "model") * 2, psum_axes)
    return body


def _pmap_model_of_vmap_data(jax, psum_axes=("data",), out_axes=1):
    body = jax.vmap(_program(jax, psum_axes), axis_name="data")
    return lambda x, p: jax.pmap(body, axis_name="model", in_axes=1, out_axes=out_axes,
                                 devices=jax.devices()[:4])(x, p)


def _pmap_data_of_vmap_model(jax):  # section 5a's port: 'data' on devices
    def inner_body(x, p):
        return jax.lax.psum(x * p, "model") * 2

    def outer_body(x, p):
        return jax.lax.psum(jax.vmap(inner_body, axis_name="model")(x, p), "data")

    return lambda x, p: jax.pmap(outer_body, axis_name="data", devices=jax.devices()[:2])(x, p)


def test_modern_accepts_pmap_over_model_of_vmap_over_data(jax8, capsys):
    assert ex.check_modern(_pmap_model_of_vmap_data(jax8))
    verdict(capsys, True, "14 on every device")


def test_modern_refuses_section_5a_copied(jax8, capsys):
    """Right values (14 everywhere, by hand in exercise 2), but 'data' on the devices."""
    assert np.allclose(np.asarray(_pmap_data_of_vmap_model(jax8)(ex.X_2x4, ex.P_2x4)), 14.0)
    assert not ex.check_modern(_pmap_data_of_vmap_model(jax8))
    verdict(capsys, False, "section 5a", "put 'model' on the 4 devices")


def test_modern_refuses_a_shard_map(jax8, capsys):
    from jax.sharding import Mesh, PartitionSpec as P
    mesh = Mesh(np.array(jax8.devices()[:8]).reshape(2, 4), ("data", "model"))
    spec = P("data", "model")
    sm = jax8.shard_map(_program(jax8), mesh=mesh, in_specs=(spec, spec), out_specs=spec)
    assert np.allclose(np.asarray(sm(ex.X_2x4, ex.P_2x4)), 14.0)
    assert not ex.check_modern(sm)
    verdict(capsys, False, "both axes run on devices", "jax.vmap over 'data'")


def test_modern_refuses_simpmds_own_result(capsys):
    import simpmd
    from simpmd import lax
    body = lambda x, p: lax.psum(lax.psum(x * p, "model") * 2, "data")
    via_simpmd = lambda x, p: simpmd.pmap(simpmd.pmap(body, axis_name="model"),
                                          axis_name="data")(x, p)
    assert not ex.check_modern(via_simpmd)
    out = verdict(capsys, False, "simpmd's result", "real JAX")
    assert "worked out by hand" not in out


def test_modern_names_the_transposed_result(jax8, capsys):
    assert not ex.check_modern(_pmap_model_of_vmap_data(jax8, out_axes=0))
    verdict(capsys, False, "(4, 2)", "out_axes=1")


def test_modern_refuses_nested_pmap_with_the_vmap_hint(jax8, capsys):
    inner = jax8.pmap(lambda x, p: jax8.lax.psum(x * p, "model") * 2, axis_name="model",
                      devices=jax8.devices()[:4])
    nested = jax8.pmap(lambda x, p: jax8.lax.psum(inner(x, p), "data"), axis_name="data",
                       devices=jax8.devices()[:2])
    assert not ex.check_modern(nested)
    verdict(capsys, False, "jax.pmap inside a jax.pmap", "jax.vmap")


def test_modern_names_a_sum_over_both_axes(jax8, capsys):
    assert not ex.check_modern(_pmap_model_of_vmap_data(jax8, ("data", "model")))
    verdict(capsys, False, "4 times too large")


@pytest.mark.parametrize("fn, fragments", [
    (None, ["placeholder"]),
    (lambda x, p: None, ["returned None"]),
    (lambda x, p: np.full((2, 4), 14.0), ["made outside JAX"]),
    (lambda x, p: 1 / 0, ["ZeroDivisionError"]),
    (42, ["function of (x, p)"]),
])
def test_modern_other_mistakes(capsys, fn, fragments):
    assert not ex.check_modern(fn)
    verdict(capsys, False, *fragments)


def test_modern_unbound_axis_hint(jax8, capsys):
    fn = functools.partial(
        lambda jax, x, p: jax.pmap(lambda a, b: jax.lax.psum(a * b, "data"), axis_name="model",
                                   in_axes=1, out_axes=1, devices=jax.devices()[:4])(x, p), jax8)
    assert not ex.check_modern(fn)
    verdict(capsys, False, "Name the jax.pmap's axis 'model'")
