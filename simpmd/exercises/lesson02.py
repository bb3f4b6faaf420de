"""Checks for the exercises of lesson 2 (pmap basics).

Each check compares the learner's answer with a value worked out here by hand or with
plain NumPy (never with the lesson's reference solution), runs programs on simpmd, and
prints what is off: a shape, which examples a device got, the value on one device.
Every check returns a Verdict (true or false), so a reference solution can ``assert`` it.
"""
from __future__ import annotations

import numpy as np

import simpmd
from simpmd.course import Verdict, check, error_summary, is_placeholder as _placeholder, say as _say

N_DEVICES = 8



def _as_shape(value):
    """``value`` as a tuple of ints, or None if it is not a shape."""
    try:
        return tuple(int(n) for n in value)
    except (TypeError, ValueError):
        return None


# Exercise 1 -------------------------------------------------------------------------------
# x has shape SHAPES_X; f = pmap(body) with body(x) = x.sum(axis=0).
SHAPES_X = (N_DEVICES, 5, 3)
SHAPES_WHAT = ("the shape of x inside the body", "the shape the body returns on one device",
               "the shape of f(x)")


def check_shapes(answer) -> Verdict:
    """Exercise 1: three shapes, as a tuple ``(inside, returned, result)``."""
    if _placeholder(answer):
        return _say(False, "answer is still a placeholder; give three shapes, e.g. ((1, 2), (3,), ()).")
    try:
        got = [_as_shape(s) for s in answer]
    except TypeError:
        got = [None]
    if len(got) != 3 or any(g is None for g in got):
        return _say(False, f"answer should be three shapes (tuples of ints), got {answer!r}.")
    n, rows, cols = SHAPES_X
    expected = [(rows, cols),        # the mapped axis 0 is gone inside the body
                (cols,),             # sum(axis=0) inside removes the axis of size 5
                (n, cols)]           # pmap stacks the 8 results along a new axis 0
    hints = [
        {(1, rows, cols): "The mapped axis is removed inside the body: device i sees x[i], "
                          "not x[i:i+1].",
         (n, rows, cols): "Each device sees only its own slice of x, not the whole array.",
         (n, cols): "That is axis 1 removed; pmap splits x along axis 0 (in_axes=0)."},
        {(rows,): "Inside the body, axis 0 is x's old axis 1 (size 5); sum(axis=0) removes "
                  "it and leaves the 3 columns.",
         (rows, cols): ("The sum over axis 0 removes one axis: the body returns fewer "
                        "dimensions than it got."),
         (1, cols): "The sum over axis 0 removes that axis; it does not keep it as size 1."},
        {(cols,): ("The pmapped function stacks the 8 per-device results along a new "
                  "axis 0 (out_axes=0)."),
         (n * cols,): "The per-device results are stacked along a new axis, not joined end to end.",
         (n, rows, cols): "Each device returned shape (3,); pmap adds only the device axis."},
    ]
    for k, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            hint = hints[k].get(g, "")
            return _say(False, f"{SHAPES_WHAT[k]} is {e}, not {g}. {hint}".rstrip())
    return _say(True, "all three shapes are right: " + ", ".join(map(str, expected)) + ".")


# Exercise 2 -------------------------------------------------------------------------------
# 32 examples of 3 features; device d must get examples PER_DEVICE*d ... PER_DEVICE*d + 3.
BATCH = np.arange(32 * 3, dtype=np.float64).reshape(32, 3)
PER_DEVICE = 32 // N_DEVICES


def _batch_expected():
    out = np.empty((N_DEVICES, PER_DEVICE, 3))
    for d in range(N_DEVICES):
        for j in range(PER_DEVICE):
            out[d, j] = BATCH[PER_DEVICE * d + j]
    return out


def _example_ids(block):
    """Which examples of BATCH a block of rows holds (example k's first feature is 3k)."""
    return [int(v) // 3 for v in np.asarray(block).reshape(-1, 3)[:, 0]]


def check_batch(answer) -> Verdict:
    """Exercise 2: BATCH reshaped so that pmap gives each of 8 devices 4 consecutive examples."""
    if _placeholder(answer):
        return _say(False, "answer is still a placeholder; reshape `batch`.")
    try:
        a = np.asarray(answer, dtype=float)
    except (TypeError, ValueError):
        return _say(False, f"answer should be `batch` reshaped, an array of 32 x 3 numbers; "
                    f"got {answer!r:.60}.")
    expected = _batch_expected()
    if a.shape != expected.shape:
        hint = {
            (32, 3): "that is the batch unchanged: pmap would need 32 devices for axis 0.",
            (PER_DEVICE, N_DEVICES, 3): "axis 0 has size 4, so pmap would use only 4 devices; "
                                        "the device axis must come first, with size 8.",
            (N_DEVICES, PER_DEVICE * 3): "each device would get 12 loose numbers; keep the "
                                         "features axis: (8, 4, 3).",
        }.get(a.shape, "pmap splits axis 0 across the 8 devices; each device then holds 4 "
                       "examples of 3 features.")
        return _say(False, f"answer has shape {a.shape}, expected {expected.shape}: {hint}")
    if a.size and np.allclose(np.sort(a.ravel()), np.sort(BATCH.ravel())):
        for d in range(N_DEVICES):
            if not np.array_equal(a[d], expected[d]):
                got = _example_ids(a[d])
                want = _example_ids(expected[d])
                strided = ""
                if got == [d + N_DEVICES * j for j in range(PER_DEVICE)]:
                    strided = (" That is every 8th example (a reshape to (4, 8, 3) and a "
                               "transpose); the exercise asks for consecutive ones.")
                return _say(False, f"device {d} would get examples {got}; it should get "
                            f"examples {want}.{strided}")
    return check(a, expected, what="the reshaped batch")


# Exercise 3 -------------------------------------------------------------------------------
# Each device holds one row of NORM_DATA; the answer is the norm of the whole array.
NORM_DATA = np.arange(24, dtype=np.float64).reshape(N_DEVICES, 3)
NORM_SQUARED = sum(float(v) ** 2 for v in range(24))     # 0^2 + ... + 23^2 = 4324


def check_global_norm(body) -> Verdict:
    """Exercise 3: ``body(x)`` returns the Euclidean norm of the whole array on every device."""
    if _placeholder(body):
        return _say(False, "global_norm is still a placeholder; write the function.")
    if not callable(body):
        return _say(False, f"global_norm should be a function of x, got {type(body).__name__}.")
    f = simpmd.pmap(body, axis_name="i")
    try:
        out = f(NORM_DATA)
    except Exception as exc:                       # the learner's own error is the hint
        summary = error_summary(exc, first_sentence=True)
        hint = ""
        if summary.startswith("UnboundAxisError:"):
            hint = " The mapped axis is called 'i' here: use lax.psum(..., 'i')."
        elif summary.startswith("TracerArrayConversionError:"):
            hint = (" A NumPy function needs a concrete array, which a mapped value is not "
                    "(real JAX refuses it too). Use simpmd.numpy, which runs on both engines: "
                    "snp.sqrt(...) (with `import simpmd.numpy as snp`).")
        return _say(False, f"your function raised on simpmd: {summary}{hint}")
    if out is None:
        return _say(False, "your function returns None; return the norm (a scalar).")
    out = np.asarray(out, dtype=np.float64)
    if out.shape != (N_DEVICES,):
        return _say(False, f"f(x) has shape {out.shape}, expected ({N_DEVICES},): each device "
                    f"should return one number (shape ()), got shape {out.shape[1:]}.")
    norm = np.sqrt(NORM_SQUARED)
    expected = np.full(N_DEVICES, norm)
    collectives = [e for e in f.trace.events if e.kind == "collective"]
    row_norms = np.sqrt((NORM_DATA ** 2).sum(axis=1))
    if np.allclose(out, expected):
        return check(out, expected, what="the norm on every device")
    if not collectives or np.allclose(out, row_norms):
        return _say(False, f"device 3 returned {out[3]:.6g}, the norm of its own row only "
                    f"(expected {norm:.6g} on every device). Combine across devices with "
                    f"lax.psum(..., 'i').")
    if np.allclose(out, NORM_SQUARED):
        return _say(False, f"every device holds {out[0]:.6g}: that is the squared norm. Take "
                    f"the square root (snp.sqrt) of the psum.")
    if np.allclose(out, row_norms.sum()):
        return _say(False, f"every device holds {out[0]:.6g}, the sum of the 8 per-device norms. "
                    f"Norms do not add: psum the sums of squares, then take the root.")
    bad = int(np.argmax(~np.isclose(out, expected)))
    return _say(False, f"device {bad} holds {out[bad]:.6g}, expected {norm:.6g} (the norm of "
                f"all 24 numbers) on every device.")
