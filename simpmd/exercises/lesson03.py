"""Checks for the exercises of lesson 3 (in_axes, out_axes, static arguments, devices=).

Each check reads the learner's answer, runs it on simpmd where it is a program, compares
with values worked out here with plain NumPy (never with the lesson's reference
solution), and prints what is off: which leaf is mapped or broadcast, where the device
axis ended up, which value a device computed. Every check returns True or False, so a
reference solution can ``assert`` it.
"""
from __future__ import annotations

import numpy as np

import simpmd
from simpmd.course import check, error_summary, is_placeholder as _placeholder, is_pmapped, say as _say

N_DEVICES = 8



def _error_text(exc) -> str:
    return error_summary(exc, first_sentence=True)


def _axis_ok(a) -> bool:
    return a is None or (isinstance(a, (int, np.integer)) and not isinstance(a, bool))


# Exercise 1 -------------------------------------------------------------------------------
# predict(params, x) = x @ params['w'] + params['b'], on 8 devices; w is shared by every
# device, b holds one bias per device, x one example per device.
PARAMS = {"w": np.array([1.0, 2.0, 3.0]), "b": np.arange(N_DEVICES) * 10.0}
X = np.arange(N_DEVICES * 3, dtype=np.float64).reshape(N_DEVICES, 3)


def predict(params, x):
    return x @ params["w"] + params["b"]


def _predict_expected():
    w, b = PARAMS["w"], PARAMS["b"]
    return np.array([sum(X[d, k] * w[k] for k in range(3)) + b[d] for d in range(N_DEVICES)])


def _leaf_axes(answer):
    """{'w': axis, 'b': axis, 'x': axis} that ``answer`` (pmap's in_axes) gives each leaf,
    or a sentence saying why it cannot be read."""
    if _axis_ok(answer):
        return {"w": answer, "b": answer, "x": answer}
    if not isinstance(answer, (tuple, list)):
        return (f"in_axes should be a tuple with one entry per argument (params, x), got "
                f"{answer!r}.")
    if len(answer) != 2:
        return (f"in_axes has {len(answer)} entries, but predict takes 2 arguments "
                f"(params, x): give one entry for each.")
    p, x = answer
    if not _axis_ok(x):
        return f"the entry for x should be an int or None, got {x!r}."
    if _axis_ok(p):
        return {"w": p, "b": p, "x": x}
    if not isinstance(p, dict):
        return (f"the entry for params should be an int, None, or a dict like params "
                f"({{'w': ..., 'b': ...}}), got {p!r}.")
    if set(p) != {"w", "b"}:
        return (f"the dict for params has keys {sorted(p)}; it must have the same keys as "
                f"params: ['b', 'w'].")
    if not (_axis_ok(p["w"]) and _axis_ok(p["b"])):
        return "each entry of the params dict should be an int or None."
    return {"w": p["w"], "b": p["b"], "x": x}


def check_pytree_in_axes(answer) -> bool:
    """Exercise 1: the in_axes that shares w, and gives each device its own b and x."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; give in_axes for (params, x).")
    axes = _leaf_axes(answer)
    if isinstance(axes, str):
        return _say(False, axes)
    if axes["w"] is not None:
        return _say(False, f"w gets in_axes {axes['w']}: it would be split across devices, but w "
                    f"(shape (3,)) is shared: every device needs all of it. Mark it None.")
    if axes["b"] is None:
        return _say(False, "b gets in_axes None: every device would see all 8 biases (shape (8,)) "
                    "and return 8 numbers. b holds one bias per device: map it over axis 0.")
    if axes["x"] is None:
        return _say(False, "x gets in_axes None: every device would see all 8 examples. Map x "
                    "over axis 0, one example per device.")
    for name, value in (("b", PARAMS["b"]), ("x", X)):
        ax = axes[name]
        if not -value.ndim <= ax < value.ndim or ax % value.ndim != 0:
            return _say(False, f"{name} (shape {value.shape}) is mapped over axis {ax}, but its "
                        f"device axis is the first one: use 0.")
    try:
        out = simpmd.pmap(predict, in_axes=answer)(PARAMS, X)
    except Exception as exc:
        return _say(False, f"simpmd.pmap with these in_axes raised {_error_text(exc)}")
    return check(out, _predict_expected(), what="predict on every device")


# Exercise 2 -------------------------------------------------------------------------------
# 4 features x 8 examples, one example (a column) per device; normalise each column so it
# sums to 1 and keep the (features, examples) layout.
FEATURES = np.arange(1.0, 33.0).reshape(4, N_DEVICES)


def normalise(column):
    return column / column.sum()


def _normalise_expected():
    out = np.empty_like(FEATURES)
    for j in range(N_DEVICES):
        out[:, j] = FEATURES[:, j] / sum(FEATURES[:, j])
    return out


def check_other_axes(answer) -> bool:
    """Exercise 2: ``dict(in_axes=..., out_axes=...)`` mapping the columns of FEATURES."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; give dict(in_axes=..., out_axes=...).")
    if not isinstance(answer, dict) or set(answer) != {"in_axes", "out_axes"}:
        return _say(False, f"your answer should be dict(in_axes=..., out_axes=...), got {answer!r}.")
    ia, oa = answer["in_axes"], answer["out_axes"]
    if ia is Ellipsis or oa is Ellipsis:
        return _say(False, "your answer still has a placeholder (...); give both in_axes and out_axes.")
    if not (_axis_ok(ia) and _axis_ok(oa)):
        return _say(False, "in_axes and out_axes should each be an int or None here.")
    if ia is None:
        return _say(False, "in_axes=None gives every device the whole array; nothing is split.")
    if ia % 2 == 0:
        return _say(False, f"in_axes={ia} splits axis 0, the 4 features, over 4 devices; the "
                    f"8 examples are the columns, axis 1.")
    if oa is None:
        return _say(False, "out_axes=None keeps one device's column only; the columns differ, "
                    "so keep the device axis: out_axes=1.")
    try:
        out = np.asarray(simpmd.pmap(normalise, in_axes=ia, out_axes=oa)(FEATURES))
    except Exception as exc:
        return _say(False, f"simpmd.pmap with these axes raised {_error_text(exc)}")
    expected = _normalise_expected()
    if out.shape == (N_DEVICES, 4):
        return _say(False, f"the result has shape {out.shape}: out_axes={oa} puts the device axis "
                    f"first, so the examples became rows. Use out_axes=1 to put it back as "
                    f"axis 1, shape (4, 8).")
    ok = check(out, expected, what="the normalised array")
    if ok and oa < 0:
        print("Note: simpmd counts out_axes=-1 from the end, as the docs of vmap describe; "
              "jax.pmap mishandles negative out_axes (a wrong shape, or an error, depending on "
              "the release), so write out_axes=1 for JAX.")
    return ok


# Exercise 3 -------------------------------------------------------------------------------
# halve(x, times) halves x `times` times in a Python loop: `range(times)` needs a Python int.
HALVE_X = np.arange(N_DEVICES * 2, dtype=np.float64).reshape(N_DEVICES, 2)


def check_static(answer) -> bool:
    """Exercise 3: ``answer`` is a simpmd.pmap of halve(x, times) that runs for any int times."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; write the simpmd.pmap(...) call.")
    if not is_pmapped(answer):
        if callable(answer):
            return _say(False, "your answer is a plain function; wrap it: simpmd.pmap(halve, ...). "
                        "(The check runs it on simpmd.)")
        return _say(False, f"your answer should be simpmd.pmap(halve, ...), got {type(answer).__name__}.")
    for times in (3, 1):
        expected = HALVE_X / 2.0 ** times
        try:
            out = answer(HALVE_X, times)
        except Exception as exc:
            return _say(False, f"answer(x, {times}) raised {_error_text(exc)} `times` is a "
                        f"Python int that range() needs while the body runs: it cannot be "
                        f"split across devices (in_axes=0) or be a traced value (in_axes=None). "
                        f"Mark it static: static_broadcasted_argnums=1.")
        if np.shape(out) != expected.shape or not np.allclose(out, expected):
            return check(out, expected, what=f"answer(x, {times})")
    return _say(True, "answer(x, 3) and answer(x, 1) both match: each value of `times` is a "
                "plain Python int inside the body.")
