"""Lesson 10's answer checks accept the right answers and say what is off in wrong ones."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import lax
from simpmd.exercises import lesson10 as ex


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


# -- exercise 3: the ppermute found wrong in the trace ------------------------------------------

def test_expected_smooth_by_hand():
    # squares 0, 1, 4, ..., 49; device 0's neighbours are devices 7 (49) and 1 (1)
    e = ex.expected_smooth()
    assert np.isclose(e[0], (49 + 0 + 1) / 3) and np.isclose(e[3], (4 + 9 + 16) / 3)
    assert np.isclose(e[7], (36 + 49 + 0) / 3)


def ring(x, to_right, to_left):
    from_left = lax.ppermute(x, "i", perm=to_right)
    from_right = lax.ppermute(x, "i", perm=to_left)
    return (x + from_left + from_right) / 3


RIGHT = [(j, (j + 1) % 8) for j in range(8)]            # device j's value goes to j + 1
LEFT = [((j + 1) % 8, j) for j in range(8)]             # device j + 1's value goes to j
BUGGY = [((j - 1) % 8, j) for j in range(8)]            # the lesson's slip: the same as RIGHT


def test_smooth_right_answer_on_both_engines(jax8, capsys):
    assert ex.check_smooth(lambda x: ring(x, RIGHT, LEFT))
    verdict(capsys, True, "(49 + 0 + 1) / 3", "real JAX agrees")


@pytest.mark.parametrize("fn, fragments", [
    (None, ["placeholder"]),
    (3, ["function of x"]),
    (lambda x: None, ["returned None"]),
    (lambda x: ring(x, RIGHT, BUGGY), ["device 7's value twice", "trace"]),
    (lambda x: ring(x, LEFT, LEFT), ["right neighbour's value"]),
    (lambda x: ring(x, RIGHT, LEFT) * 3, ["divide by 3"]),
    (lambda x: (lax.ppermute(x, "i", RIGHT) + lax.ppermute(x, "i", LEFT)) / 3, ["own value"]),
    (lambda x: (lax.ppermute(x, "i", RIGHT) + lax.ppermute(x, "i", LEFT)) / 2, ["two neighbours"]),
    (lambda x: ring(x, RIGHT, [(1, 0), (2, 0)]), ["raised"]),
    (lambda x: ring(x, RIGHT, LEFT) + (lax.axis_index("i") == 5), ["device 5 holds"]),
])
def test_smooth_mistakes_get_the_right_hint(capsys, fn, fragments):
    assert not ex.check_smooth(fn)
    verdict(capsys, False, *fragments)


# -- exercise 4: a psum every device reaches ------------------------------------------------------

def test_expected_top_half_total_by_hand():
    # HALF_X = 2, -1, 4, 3, 5, -2, 6, 1 sums to 18; devices 0-3 alone to 8
    np.testing.assert_array_equal(ex.expected_top_half_total(), [18, 18, 18, 18, 5, -2, 6, 1])


def test_top_half_total_right_answer_on_both_engines(jax8, capsys):
    fn = lambda x: snp.where(lax.axis_index("i") < 4, lax.psum(x, "i"), x)
    assert ex.check_top_half_total(fn)
    verdict(capsys, True, "sum (18)", "real JAX agrees")


def python_if_sum(x):
    if lax.axis_index("i") < 4:
        return lax.psum(x, "i")
    return x


def jax_cond_sum(x):
    import jax
    return jax.lax.cond(lax.axis_index("i") < 4, lambda v: lax.psum(v, "i"), lambda v: v, x)


@pytest.mark.parametrize("fn, fragments", [
    (None, ["placeholder"]),
    (lambda x: None, ["returned None"]),
    (python_if_sum, ["branches in Python"]),
    (jax_cond_sum, ["runs on JAX only"]),
    (lambda x: lax.psum(x, "i"), ["every device holds the sum (18)"]),
    (lambda x: snp.where(lax.axis_index("i") < 4,
                         lax.psum(snp.where(lax.axis_index("i") < 4, x, 0.0), "i"), x),
     ["hold 8, the sum of devices 0-3 only", "Mask the result"]),
    (lambda x: snp.where(lax.axis_index("i") < 4, x, lax.psum(x, "i")), ["swapped"]),
    (lambda x: x * 1.0, ["nothing was summed"]),
    (lambda x: snp.where(lax.axis_index("i") < 3, lax.psum(x, "i"), x), ["device 3 holds 3, expected 18"]),
])
def test_top_half_total_mistakes_get_the_right_hint(capsys, fn, fragments):
    if fn is jax_cond_sum:
        pytest.importorskip("jax", reason="the answer calls jax.lax.cond")
    assert not ex.check_top_half_total(fn)
    verdict(capsys, False, *fragments)


def test_top_half_total_names_simpmd_lax_cond_with_a_psum_inside_as_the_hazard(capsys):
    """The hazard written with simpmd.lax.cond: simpmd stops it with a DeadlockError (no
    eager run needed), and the check says so."""
    def cond_sum(x):
        return lax.cond(lax.axis_index("i") < 4, lambda v: lax.psum(v, "i"), lambda v: v, x)
    assert not ex.check_top_half_total(cond_sum)
    out = capsys.readouterr().out
    assert "Not yet" in out and "deadlock" in out.lower(), out


def test_top_half_total_names_a_deadlock_as_the_hazard(capsys):
    """A collective reached by only some devices: simpmd's eager run stops with a
    DeadlockError, which the check names as the lesson's hazard."""
    eager_half = simpmd.pmap(python_if_sum, axis_name="i", eager=True)
    with pytest.raises(simpmd.DeadlockError):
        eager_half(ex.HALF_X)

    class Raising:                      # stands for a body whose run deadlocks on simpmd
        def __call__(self, x):
            raise simpmd.DeadlockError("devices 0-3 wait in psum over 'i'")
    assert not ex.check_top_half_total(Raising())
    verdict(capsys, False, "DeadlockError", "section 3b", "snp.where")
