"""Lesson 9's answer checks accept the right answers and say what is off in wrong ones."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import lax
from simpmd.exercises import lesson09 as ex


def verdict(capsys, ok, *fragments):
    """The checker returned ``ok`` and its printed text contains every fragment."""
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    assert last.startswith("Correct: " if ok else "Not yet: "), out
    for fragment in fragments:
        assert fragment in out, (fragment, out)
    return out


# -- exercise 1 ----------------------------------------------------------------------------

def test_expected_mixed_by_hand():
    # XS sums to 7 and its largest value is 9.
    np.testing.assert_array_equal(ex.expected_mixed(), [7, 7, 7, 9, 7, 7, 7, 7])


def fixed(x):
    total = lax.psum(x, "i")
    top = lax.pmax(x, "i")
    return snp.where(lax.axis_index("i") == 3, top, total)


def test_fixed_mixed_accepted_on_both_engines(jax8, capsys):
    assert ex.check_fixed_mixed(fixed)
    verdict(capsys, True, "maximum (9)", "sum (7)", "real JAX agrees")


def still_branching(x):
    if lax.axis_index("i") == 3:
        return lax.pmax(x, "i")
    return lax.psum(x, "i")


def python_index(x):
    weights = [1.0] * 8
    return lax.psum(x, "i") * weights[lax.axis_index("i")]


@pytest.mark.parametrize("fn, fragments", [
    (None, ["placeholder"]),
    (lambda x: None, ["returned None"]),
    (still_branching, ["branches in Python", "snp.where"]),
    (python_index, ["Python number", "snp.where"]),
    (lambda x: lax.psum(x, "j"), ["'j'", "named 'i'"]),
    (lambda x: lax.psum(x, "i"), ["every device holds the sum (7)", "maximum (9)"]),
    (lambda x: lax.pmax(x, "i"), ["every device holds the maximum (9)", "only device 3"]),
    (lambda x: snp.where(lax.axis_index("i") == 3, lax.psum(x, "i"), lax.pmax(x, "i")),
     ["swapped"]),
    (lambda x: snp.where(lax.axis_index("i") == 2, lax.pmax(x, "i"), lax.psum(x, "i")),
     ["device 2 holds 9, expected 7"]),
    (lambda x: lax.psum(x, "i")[None], ["shape (8, 1)"]),
    (lambda x: 1 / 0, ["ZeroDivisionError"]),
    ("fixed_mixed", ["function of x"]),
])
def test_fixed_mixed_mistakes_get_the_right_hint(capsys, fn, fragments):
    assert not ex.check_fixed_mixed(fn)
    verdict(capsys, False, *fragments)


def test_fixed_mixed_with_a_numpy_function_is_refused_on_both_engines(capsys):
    def numpy_on_jax(x):              # np.exp on a JAX tracer fails; simpmd refuses it too
        return fixed(x) + np.exp(x) * 0
    with pytest.raises(simpmd.TracerArrayConversionError, match="simpmd.numpy"):
        simpmd.pmap(numpy_on_jax, "i")(ex.XS)
    assert not ex.check_fixed_mixed(numpy_on_jax)
    verdict(capsys, False, "NumPy function", "real JAX refuses", "simpmd.numpy")


# -- exercise 2 ----------------------------------------------------------------------------

def test_failed_run_expected_answer_matches_the_program_in_the_lesson():
    shard_sizes = [32, 32, 0, 32, 32, 32, 32, 32]

    def normalised(loss_sum):
        total = lax.psum(loss_sum, "i")
        weight = 1.0 / shard_sizes[lax.axis_index("i")]
        return lax.pmax(total * weight, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]])

    with pytest.raises(simpmd.DeviceError) as info:
        simpmd.pmap(normalised, axis_name="i", eager=True)(np.arange(8, dtype=np.float32))
    waiting = [e for e in info.value.trace.events
               if e.kind == "error" and e.detail.startswith("still waiting in pmax")]
    assert info.value.device == ex.FAILED_DEVICE
    assert tuple(sorted(e.device for e in waiting)) == ex.WAITING


def test_failed_run_right_answer(capsys):
    assert ex.check_failed_run({"failed_device": 2, "waiting": [3, 1, 0], "collective": "pmax"})
    verdict(capsys, True, "device 2 raised")


@pytest.mark.parametrize("answer, fragments", [
    (None, ["placeholder"]),
    ({"failed_device": ..., "waiting": ..., "collective": ...}, ["placeholders"]),
    ([2, [0, 1, 3], "pmax"], ["should be a dict"]),
    ({"failed_device": 2, "waiting": [0, 1, 3]}, ["missing", "collective"]),
    ({"failed_device": 5, "waiting": [0, 1, 3], "collective": "pmax"}, [".device"]),
    ({"failed_device": 2, "waiting": [0, 1, 2, 3], "collective": "pmax"},
     ["does not wait"]),
    ({"failed_device": 2, "waiting": [0, 1, 3, 4, 5, 6, 7], "collective": "pmax"},
     ["[4, 5, 6, 7] did not wait", "axis_index_groups"]),
    ({"failed_device": 2, "waiting": [0, 1], "collective": "pmax"}, ["you listed [0, 1]"]),
    ({"failed_device": 2, "waiting": [0, 1, 3], "collective": "psum"}, ["psum completed"]),
    ({"failed_device": 2, "waiting": [0, 1, 3], "collective": "ppermute"}, ["'ppermute'"]),
    ({"failed_device": "two", "waiting": [0, 1, 3], "collective": "pmax"}, ["device id"]),
])
def test_failed_run_mistakes_get_the_right_hint(capsys, answer, fragments):
    assert not ex.check_failed_run(answer)
    verdict(capsys, False, *fragments)


# -- exercise 3 ----------------------------------------------------------------------------

def test_ring_perm_right_answer_in_any_order(capsys):
    assert ex.check_ring_perm([(3, 0), (0, 1), (2, 3), (1, 2)])
    verdict(capsys, True, "ring shift to the right")


@pytest.mark.parametrize("perm, fragments", [
    (..., ["placeholder"]),
    ([(0, 1), (1, 2), (2, 3), (3, 3)], ["destination [3]", "must be unique"]),
    ([(0, 1), (0, 2), (2, 3), (3, 0)], ["source [0]"]),
    ([(1, 0), (2, 1), (3, 2), (0, 3)], ["to the left"]),
    ([(0, 1), (1, 2), (2, 3)], ["device 3 sends nothing", "device 0 receives zeros", "(3, 0)"]),
    ([(0, 1), (1, 2), (2, 3), (3, 4)], ["destination 4", "outside the axis"]),
    ([(0, 2), (1, 3), (2, 0), (3, 1)], ["pair (0, 2)", "should go to device 1"]),
    ([0, 1, 2, 3], ["(source, destination) pairs"]),
])
def test_ring_perm_mistakes_get_the_right_hint(capsys, perm, fragments):
    assert not ex.check_ring_perm(perm)
    verdict(capsys, False, *fragments)


# -- exercise 4 ----------------------------------------------------------------------------

def test_padded_length_right_answer(capsys):
    assert ex.check_padded_length(8)
    verdict(capsys, True, "2 per device", "2 zeros")


@pytest.mark.parametrize("answer, fragments", [
    (None, ["placeholder"]),
    (6, ["does not split into 4"]),
    (4, ["shorter than the 6 values"]),
    (12, ["not the smallest"]),
    (24, ["not the smallest"]),
    (10, ["does not split into 4"]),
    ("eight", ["number of values"]),
])
def test_padded_length_mistakes_get_the_right_hint(capsys, answer, fragments):
    assert not ex.check_padded_length(answer)
    verdict(capsys, False, *fragments)
