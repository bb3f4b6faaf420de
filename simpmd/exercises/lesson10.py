"""Answer checks for lesson 10: debugging SPMD programs.

Each checker prints what is right or what is off (which device, which collective, which
pair of a permutation) and returns True or False, so a reference solution can ``assert``
it. Expected values are NumPy closed forms or worked out by hand from the programs in the
lesson, never computed by running a solution.
"""
from __future__ import annotations

import numpy as np
from simpmd.course import is_placeholder as _placeholder, say as _say


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


def _run(fn, x, name, divergence_hint=None):
    """Run ``fn`` with simpmd.pmap over axis 'i': (result, None), or (None, what went wrong
    in a sentence that says how to write it instead). ``divergence_hint(exc)`` words a
    DeadlockError or DivergenceError for the exercise at hand."""
    import simpmd
    try:
        return simpmd.pmap(fn, axis_name="i")(x), None
    except simpmd.TracerBoolConversionError:
        return None, ("the function still branches in Python (if/else) on a device value, "
                      "which JAX refuses. Let every device call the same collectives and pick "
                      "one result with snp.where(lax.axis_index('i') == 3, ..., ...).")
    except (simpmd.TracerIntegerConversionError, simpmd.ConcretizationTypeError):
        return None, ("the function turns a device value into a Python number (int(), an "
                      "index into a list), which JAX refuses. Choose between values with "
                      "snp.where instead.")
    except simpmd.UnboundAxisError as exc:
        return None, f"{_first_line(exc)} (the mapped axis is named 'i')."
    except simpmd.TracerArrayConversionError as exc:
        if "jax.numpy function" in str(exc):
            return None, ("the function hands a simpmd device value to JAX (jax.lax.cond or "
                          "jax.numpy), which runs on JAX only. Use snp.where and simpmd.lax, "
                          "which run on both engines.")
        return None, ("the function applies a NumPy function (np.exp, np.where, ...) to a "
                      "device value, which real JAX refuses. Call it through simpmd.numpy "
                      "(snp.where, snp.exp), which works on both engines.")
    except (simpmd.DivergenceError, simpmd.DeadlockError) as exc:
        if divergence_hint:
            return None, divergence_hint(exc)
        return None, (f"the devices still reach different collectives: "
                      f"{type(exc).__name__}: {_first_line(exc)}")
    except simpmd.SimpmdError as exc:
        return None, f"simpmd raised {type(exc).__name__}: {_first_line(exc)}"
    except Exception as exc:                     # the learner's own code failed
        return None, f"{name} raised {type(exc).__name__}: {_first_line(exc)}"


def _eight_values(fn, name, x, what, divergence_hint=None):
    """Run the learner's ``fn`` over 'i' on simpmd: (one float per device, None), or
    (None, the verdict that says what stopped it)."""
    if _placeholder(fn):
        return None, _say(False, f"{name} is still a placeholder; define it as a function of x.")
    if not callable(fn):
        return None, _say(False, f"{name} should be a function of x, got {type(fn).__name__}.")
    out, problem = _run(fn, x, name, divergence_hint)
    if problem:
        return None, _say(False, problem)
    if out is None:
        return None, _say(False, f"{name} returned None; return {what}.")
    a = np.asarray(out, dtype=np.float64)
    if a.shape != (len(x),):
        return None, _say(False, f"the result has shape {a.shape}; each of the {len(x)} devices "
                          f"should return one number (the mapped result has shape ({len(x)},)).")
    return a, None


def _confirmed_on_jax(fn, x, correct: str):
    """Right on simpmd: cross-check on real JAX, then say ``correct`` or what disagrees."""
    if not _agrees_with_jax(fn, x):
        return _say(False, "simpmd gives the right values but real JAX does not agree (see the "
                    "report above): use simpmd.lax and simpmd.numpy in the body.")
    return _say(True, correct)

def _named_slip(a, slips):
    """The hint of the first (value, hint) in ``slips`` that ``a`` equals, or None."""
    return next((hint for value, hint in slips if np.allclose(a, value)), None)


def _agrees_with_jax(fn, *args) -> bool:
    """Cross-check ``fn`` on real JAX; print the report when the engines disagree."""
    import simpmd
    report = simpmd.crosscheck(fn, *args, axis_name="i")
    if not report.ok:
        print(report)
    return report.ok


# -- exercise 1: the divergent program, fixed ---------------------------------------------

XS = np.array([3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, -6.0], dtype=np.float32)


def expected_mixed() -> np.ndarray:
    """Device 3 gets the maximum over the axis, every other device the sum."""
    return np.where(np.arange(8) == 3, XS.max(), XS.sum()).astype(np.float32)


def check_fixed_mixed(fn) -> bool:
    """Exercise 1: ``fn`` (mapped over axis 'i' on 8 devices) gives device 3 the pmax and
    every other device the psum, on simpmd and on real JAX."""
    a, verdict = _eight_values(fn, "fixed_mixed", XS, "the value each device should hold")
    if verdict is not None:
        return verdict
    e = expected_mixed().astype(np.float64)
    total, top = float(XS.sum()), float(XS.max())
    if not np.allclose(a, e):
        if np.allclose(a, total):
            return _say(False, f"every device holds the sum ({total:g}); device 3 should hold "
                        f"the maximum ({top:g}).")
        if np.allclose(a, top):
            return _say(False, f"every device holds the maximum ({top:g}); only device 3 should, "
                        f"the others hold the sum ({total:g}).")
        if np.isclose(a[3], total) and np.allclose(np.delete(a, 3), top):
            return _say(False, "sum and maximum are swapped: device 3 should hold the maximum "
                        "and the others the sum.")
        k = int(np.argwhere(~np.isclose(a, e))[0][0])
        return _say(False, f"device {k} holds {a[k]:g}, expected {e[k]:g} "
                    f"({'the maximum' if k == 3 else 'the sum'} over the 8 devices).")
    if not _agrees_with_jax(fn, XS):
        return _say(False, "simpmd gives the right values but real JAX does not agree (see the "
                    "report above): use simpmd.lax and simpmd.numpy (snp) in the body, which "
                    "work on both engines.")
    return _say(True, f"device 3 holds the maximum ({top:g}), the others the sum ({total:g}), "
                "and real JAX agrees.")


# -- exercise 2: reading a failed run -----------------------------------------------------

# Worked out by hand from the program in the lesson: every device joins the psum over all
# 8 devices; then device 2 divides by its empty shard's size and raises; the pmax runs in
# groups [0, 1, 2, 3] and [4, 5, 6, 7], so devices 4-7 complete theirs and finish, while
# 0, 1 and 3 wait in theirs for device 2, which never comes.
FAILED_DEVICE = 2
WAITING = (0, 1, 3)
WAITING_IN = "pmax"


def check_failed_run(answer) -> bool:
    """Exercise 2: ``{'failed_device': int, 'waiting': [ids], 'collective': name}``."""
    if _placeholder(answer):
        return _say(False, "answer is still a placeholder; replace it with the dictionary.")
    if not isinstance(answer, dict):
        return _say(False, "answer should be a dict with keys 'failed_device', 'waiting' and "
                    "'collective'.")
    missing = [k for k in ("failed_device", "waiting", "collective") if k not in answer]
    if missing:
        return _say(False, f"answer is missing the key(s) {missing}.")
    failed, waiting, op = answer["failed_device"], answer["waiting"], answer["collective"]
    if _placeholder(failed) or _placeholder(waiting) or _placeholder(op):
        return _say(False, "some entries are still placeholders (...).")
    try:
        failed = int(failed)
        waiting_set = {int(i) for i in waiting}
    except (TypeError, ValueError):
        return _say(False, "'failed_device' should be a device id and 'waiting' a list of ids.")
    if failed != FAILED_DEVICE:
        return _say(False, f"device {failed} is not the one that raised: the error's .device "
                    f"attribute (and the 'error' event with the exception) names it.")
    if FAILED_DEVICE in waiting_set:
        return _say(False, f"device {FAILED_DEVICE} raised an exception: it does not wait for "
                    f"anything. List only the devices left waiting at a collective.")
    others = waiting_set - set(WAITING)
    if others & {4, 5, 6, 7}:
        return _say(False, f"devices {sorted(others & {4, 5, 6, 7})} did not wait: the pmax uses "
                    f"axis_index_groups, and devices 4-7 form their own group, which completed "
                    f"(look for their pmax events in trace.collectives()).")
    if waiting_set != set(WAITING):
        return _say(False, f"the devices left waiting are the ones with a 'still waiting in ...' "
                    f"event in the error's trace; you listed {sorted(waiting_set)}.")
    if str(op).strip().lower() != WAITING_IN:
        if str(op).strip().lower() == "psum":
            return _say(False, "the psum completed: all 8 devices joined it before device 2 "
                        "failed. Which collective do the 'still waiting in ...' events name?")
        return _say(False, f"{op!r} is not the collective they wait in; read the 'still waiting "
                    f"in ...' events of the trace.")
    return _say(True, f"device {FAILED_DEVICE} raised; devices {list(WAITING)} wait in "
                f"{WAITING_IN} for it, while its other group (4-7) completed.")


# -- exercise 3: find the wrong ppermute with the trace, and fix it ------------------------

# Each device holds one number; the answer is the mean of a device's number and those of its
# two neighbours on the ring. Squares, so that every neighbour's value is told apart.
SMOOTH_X = (np.arange(8) ** 2).astype(np.float32)       # 0, 1, 4, ..., 49


def expected_smooth() -> np.ndarray:
    """(x[d-1] + x[d] + x[d+1]) / 3 on a ring of 8, by NumPy's roll."""
    x = SMOOTH_X.astype(np.float64)
    return (np.roll(x, 1) + x + np.roll(x, -1)) / 3


def check_smooth(fn) -> bool:
    """Exercise 3: ``fn`` gives every device the mean of its value and its two ring
    neighbours' (8 devices, axis 'i'), on simpmd and on real JAX."""
    a, verdict = _eight_values(fn, "smooth_fixed", SMOOTH_X, "the smoothed value")
    if verdict is not None:
        return verdict
    e = expected_smooth()
    x = SMOOTH_X.astype(np.float64)
    left, right = np.roll(x, 1), np.roll(x, -1)            # device d's neighbours d-1 and d+1
    if not np.allclose(a, e):
        hints = [
            ((x + 2 * left) / 3, "device 0 still gets device 7's value twice: both ppermutes "
             "send every device's value to its right. In the trace (run.trace.collectives()), "
             "compare what device 0 received in each. The second should bring the right "
             "neighbour's value: device j + 1 sends to device j."),
            ((x + 2 * right) / 3, "both ppermutes now bring the right neighbour's value (device "
             "0 gets device 1's twice); one of them should bring the left neighbour's."),
            (x + left + right, "that is the sum of the three values; divide by 3 for the mean."),
            ((left + right) / 3, "the device's own value is missing from the mean."),
            ((left + right) / 2, "that is the mean of the two neighbours; the device's own value "
             "belongs in the mean too."),
        ]
        hint = _named_slip(a, hints)
        if hint:
            return _say(False, hint)
        k = int(np.argwhere(~np.isclose(a, e))[0][0])
        return _say(False, f"device {k} holds {a[k]:g}, expected {e[k]:g} = ({left[k]:g} + "
                    f"{x[k]:g} + {right[k]:g}) / 3; read what it received in the trace.")
    return _confirmed_on_jax(fn, SMOOTH_X, f"every device holds the mean of itself and its two "
                             f"neighbours (device 0: ({left[0]:g} + {x[0]:g} + {right[0]:g}) / 3 "
                             f"= {e[0]:g}), and real JAX agrees.")


# -- exercise 4: a collective that every device reaches ------------------------------------

HALF_X = np.array([2.0, -1.0, 4.0, 3.0, 5.0, -2.0, 6.0, 1.0], dtype=np.float32)


def expected_top_half_total() -> np.ndarray:
    """Devices 0-3: the sum over all 8 devices; devices 4-7: their own value."""
    return np.where(np.arange(8) < 4, HALF_X.sum(), HALF_X).astype(np.float64)


def check_top_half_total(fn) -> bool:
    """Exercise 4: devices 0-3 get the psum over all 8 devices, devices 4-7 keep their own
    value, and every device reaches the psum (no collective inside a branch)."""
    def hazard(exc):
        return (f"simpmd stopped with {type(exc).__name__}: only some devices reach the "
                f"collective. That is the hazard of section 3b, and on real JAX it hangs. "
                f"Call the psum on every device, outside any branch, and choose each "
                f"device's result afterwards with snp.where.")
    a, verdict = _eight_values(fn, "top_half_total", HALF_X, "each device's value", hazard)
    if verdict is not None:
        return verdict
    e = expected_top_half_total()
    x = HALF_X.astype(np.float64)
    total, top4 = float(x.sum()), float(x[:4].sum())
    low = np.arange(8) < 4
    if not np.allclose(a, e):
        hints = [
            (np.full(8, total), f"every device holds the sum ({total:g}); devices 4-7 should "
             f"keep their own value."),
            (np.where(low, top4, x), f"devices 0-3 hold {top4:g}, the sum of devices 0-3 only: "
             f"the psum should add all 8 values ({total:g}). Mask the result, not the input."),
            (np.where(low, x, total), "the two cases are swapped: devices 0-3 should get the "
             "sum, devices 4-7 their own value."),
            (x, "every device kept its own value: nothing was summed."),
        ]
        hint = _named_slip(a, hints)
        if hint:
            return _say(False, hint)
        k = int(np.argwhere(~np.isclose(a, e))[0][0])
        return _say(False, f"device {k} holds {a[k]:g}, expected {e[k]:g} "
                    f"({'the sum over all 8 devices' if k < 4 else 'its own value'}).")
    return _confirmed_on_jax(fn, HALF_X, f"devices 0-3 hold the sum ({total:g}), devices 4-7 "
                             f"their own values, every device reached the psum, and real JAX "
                             f"agrees.")
