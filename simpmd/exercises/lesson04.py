"""Checks for the exercises of lesson 4 (named axes and collectives).

Each check runs the learner's answer (on simpmd when the answer is a program), compares
it with a value worked out here with NumPy or by hand, never with the lesson's reference
solution, and prints what is off: a shape, the value on one device, a factor or a unit.
Every check returns True or False, so a reference solution can ``assert`` it.
"""
from __future__ import annotations

import numpy as np

import simpmd
from simpmd.course import (check, check_against_mistakes, error_summary,
                           is_placeholder as _placeholder, say as _say)

N_DEVICES = 8

# Exercise 1 -------------------------------------------------------------------------------
# Every device holds a row of MEAN_DATA; the answer is the column means on every device.
MEAN_DATA = np.random.default_rng(0).integers(-9, 10, size=(N_DEVICES, 3)).astype(np.float64)
FEWER_DEVICES = 4          # the check runs the answer on 4 devices too: no hard-coded 8



def _run(body, x, axis_name="i"):
    """Run ``body`` with simpmd.pmap; (result as NumPy or None, trace, error text or None)."""
    f = simpmd.pmap(body, axis_name=axis_name)
    try:
        out = f(x)
    except Exception as exc:                       # the learner's own error is the hint
        return None, getattr(exc, "trace", None), error_summary(exc)
    return (None if out is None else np.asarray(out)), f.trace, None


# NumPy's reductions, called as np.mean(x) or x.mean(): inside a device they reduce that
# device's own values, never across devices.
_REDUCTIONS = ("mean", "average", "sum", "nanmean", "nansum")
_COLLECTIVES = ("psum", "pmean", "all_gather", "psum_scatter", "ppermute", "all_to_all")


def _numpy_reduction(body):
    """The NumPy reduction ``body`` names ('mean', 'sum', ...) when it names no collective:
    a learner reaching for np.mean where lax.psum was meant. None otherwise."""
    code = getattr(body, "__code__", None)
    names = set(code.co_names) if code is not None else set()
    if names & set(_COLLECTIVES):
        return None
    return next((n for n in _REDUCTIONS if n in names), None)


def _reduction_hint(name):
    return _say(False, f"it calls NumPy's {name} (np.{name}(x) or x.{name}()), which reduces "
                "inside one device: each device holds only its own x, so it combines that "
                "device's own values, never values across devices. Reaching across devices takes a "
                "collective: lax.psum(x, 'i'), divided by the device count lax.psum(1, 'i').")


def _first_bad_device(out, expected):
    for d in range(expected.shape[0]):
        if not np.allclose(out[d], expected[d]):
            return d
    return None


def check_global_mean(body) -> bool:
    """Exercise 1: ``body(x)`` returns the mean over all devices, without ``lax.pmean``."""
    if _placeholder(body):
        return _say(False, "global_mean is still a placeholder; write the function.")
    if not callable(body):
        return _say(False, f"global_mean should be a function of x, got {type(body).__name__}.")
    x = MEAN_DATA
    out, trace, error = _run(body, x)
    reduction = _numpy_reduction(body)
    if error:
        return _reduction_hint(reduction) if reduction else \
            _say(False, f"your function raised on simpmd: {error}")
    if out is None:
        return _say(False, "your function returns None; return the mean (an array of shape (3,)).")
    ops = sorted({e.op for e in trace.events if e.kind == "collective"})
    if reduction and not ops:
        return _reduction_hint(reduction)
    if "pmean" in ops:
        return _say(False, "it uses lax.pmean; build the mean from lax.psum and the axis size "
                    "lax.psum(1, 'i') instead.")
    expected = np.broadcast_to(x.mean(axis=0), x.shape)
    if out.shape != expected.shape:
        return _say(False, f"each device returns shape {out.shape[1:]}; expected {expected.shape[1:]}, "
                    f"the shape of the device's own x (average over devices, not within a device).")
    if np.allclose(out, x):
        return _say(False, "every device still holds its own x: nothing was summed across devices.")
    if np.allclose(out, expected * N_DEVICES):
        return _say(False, f"the result is {N_DEVICES} times the mean: that is the sum. Divide by "
                    f"the number of devices, lax.psum(1, 'i').")
    if np.allclose(out, x / N_DEVICES):
        return _say(False, "each device divided its own x by the device count but never summed "
                    "over devices: psum the values too.")
    row_length = x.shape[1]
    if np.allclose(out, expected * N_DEVICES / row_length):
        return _say(False, f"the sum was divided by {row_length}, the length of the device's own "
                    f"x: inside pmap the mapped axis is gone, so x.shape[0] is not the number "
                    f"of devices. Count the devices with lax.psum(1, 'i').")
    bad = _first_bad_device(out, expected)
    if bad is not None:
        return _say(False, f"device {bad} holds {out[bad]}, but the mean over devices is "
                    f"{expected[bad]}.")
    # Right on 8 devices; a hard-coded 8 shows on another device count.
    fewer = x[:FEWER_DEVICES]
    out_fewer, _, error = _run(body, fewer)
    want_fewer = np.broadcast_to(fewer.mean(axis=0), fewer.shape)
    if error:
        return _say(False, f"right on {N_DEVICES} devices, but on {FEWER_DEVICES} devices your "
                    f"function raised: {error}")
    if out_fewer is None or out_fewer.shape != want_fewer.shape or not np.allclose(out_fewer,
                                                                                 want_fewer):
        if out_fewer is not None and np.allclose(out_fewer,
                                                 want_fewer * FEWER_DEVICES / N_DEVICES):
            return _say(False, f"right on {N_DEVICES} devices, but on {FEWER_DEVICES} devices "
                        f"it divides by {N_DEVICES}: the device count is written into the code. "
                        f"Let the program count them: lax.psum(1, 'i').")
        return _say(False, f"right on {N_DEVICES} devices, but not on {FEWER_DEVICES}: the mean "
                    f"should follow the number of devices the function is mapped over "
                    f"(lax.psum(1, 'i')).")
    return check(out, expected, what="the mean on every device")


# Exercise 2 -------------------------------------------------------------------------------

def _perm_problem(perm, p):
    """A sentence about what makes ``perm`` unusable for ppermute, or None."""
    try:
        pairs = [tuple(int(i) for i in pair) for pair in perm]
    except (TypeError, ValueError):
        return ("perm should be a list of (source, destination) pairs of device indices, "
                f"got {perm!r}.")
    for pair in pairs:
        if len(pair) != 2:
            return f"{pair} is not a (source, destination) pair."
        if not all(0 <= i < p for i in pair):
            return f"{pair} names a device outside 0..{p - 1}."
    for pos, what in ((0, "source"), (1, "destination")):
        seen = [pair[pos] for pair in pairs]
        dup = sorted({i for i in seen if seen.count(i) > 1})
        if dup:
            return (f"device(s) {dup} appear more than once as {what}; ppermute lets each "
                    f"device send once and receive once (JAX raises a ValueError).")
    return None


def check_shift_left(perm) -> bool:
    """Exercise 2: a ``perm`` for lax.ppermute with which device i receives from device i+1."""
    if _placeholder(perm):
        return _say(False, "perm is still a placeholder; give a list of (source, destination) pairs.")
    p = N_DEVICES
    problem = _perm_problem(perm, p)
    if problem:
        return _say(False, problem)
    source_of = {int(dst): int(src) for src, dst in perm}
    wanted = {d: (d + 1) % p for d in range(p)}
    if source_of == {d: (d - 1) % p for d in range(p)}:
        return _say(False, "this shifts to the right (device i receives from i-1). Each pair is "
                    "(source, destination): swap the two.")
    for d in range(p):
        got = source_of.get(d)
        if got is None:
            return _say(False, f"no pair sends to device {d}, so ppermute gives it zeros; it should "
                        f"receive from device {wanted[d]}: add the pair ({wanted[d]}, {d}).")
        if got != wanted[d]:
            return _say(False, f"device {d} receives from device {got}; it should receive from "
                        f"device {wanted[d]}.")
    # The permutation is right; run it to be sure the pairs mean what we think.
    x = np.arange(p) * 10.0
    out, _, error = _run(lambda v: simpmd.lax.ppermute(v, "i", perm), x)
    if error:
        return _say(False, f"ppermute with this perm raised on simpmd: {error}")
    return check(out, np.roll(x, -1), what="what each device received")


# Exercise 3 -------------------------------------------------------------------------------
# Each of 8 devices holds x of shape SHAPES_INPUT.
SHAPES_INPUT = (4, 16)
SHAPES_QUESTIONS = (
    "all_gather(x, 'i', axis=1)",
    "all_gather(x, 'i', axis=1, tiled=True)",
    "psum_scatter(x, 'i', scatter_dimension=1, tiled=True)",
)


def _shapes_expected():
    rows, cols = SHAPES_INPUT
    p = N_DEVICES
    return ((rows, p, cols),            # a new axis of size p at position 1
            (rows, p * cols),           # the p blocks joined along axis 1
            (rows, cols // p))          # axis 1 summed, then cut in p blocks: keep one


def check_shapes(answer) -> bool:
    """Exercise 3: the per-device shapes of three collectives, as a tuple of three tuples."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; give three shapes, e.g. ((1, 2), (3,), ()).")
    try:
        got = [tuple(int(n) for n in shape) for shape in answer]
    except (TypeError, ValueError):
        return _say(False, f"your answer should be three shapes (tuples of ints), got {answer!r}.")
    if len(got) != 3:
        return _say(False, f"your answer has {len(got)} shape(s); give one for each of the three calls.")
    expected = _shapes_expected()
    rows, cols = SHAPES_INPUT
    p = N_DEVICES
    hints = [
        {(p, rows, cols): "That is axis=0: the new device axis goes where axis= says, here "
                          "position 1.",
         (rows, p * cols): "That is the tiled shape: without tiled=True the device axis is a "
                           "new axis, not joined into axis 1."},
        {(rows, p, cols): "That is the untiled shape: tiled=True joins the 8 blocks into axis 1.",
         (p * rows, cols): "That joins along axis 0; axis=1 joins along axis 1."},
        {(rows, cols): "Each device keeps only its own block of the sum, not all of it.",
         (rows,): "With tiled=True the scattered dimension stays (as a block of 16/8 = 2); only "
                  "tiled=False removes it (and then needs its size to equal the device count).",
         (rows, p * cols): "That is all_gather's shape; psum_scatter shrinks the dimension."},
    ]
    for k, (g, e) in enumerate(zip(got, expected)):
        if g != e:
            hint = hints[k].get(g, "")
            return _say(False, f"shape {k + 1}, of {SHAPES_QUESTIONS[k]}, is {g}; expected {e}. "
                        f"{hint}".rstrip())
    return _say(True, "all three shapes are right: " + ", ".join(map(str, expected)) + ".")


# Exercise 4 -------------------------------------------------------------------------------
RING_VALUES = 4096          # bf16 values per device
RING_DEVICES = 8


def check_ring_bytes(answer) -> bool:
    """Exercise 4: bytes each device sends for psum of 4096 bf16 values over 8 devices."""
    n, p = RING_VALUES, RING_DEVICES
    expected = 2 * (p - 1) * n * 2 / p          # worked by hand: 2 * 7 * 4096 * 2 / 8 = 14336
    mistakes = [
        (2 * (p - 1) * n * 4 / p, "you counted 4 bytes per value (float32); bf16 takes 2"),
        # One phase in bytes and both phases in values give the same number (7168), so one
        # hint names both slips, the more common one (values, not bytes) first.
        ((p - 1) * n * 2 / p, "it is half the answer, which is what either of two slips gives: "
                              "counting values instead of bytes (bf16 takes 2 bytes per value), "
                              "or counting one phase of the ring (a ring all-reduce is a "
                              "reduce-scatter and then an all-gather, each sending (p-1)/p of "
                              "the buffer)"),
        (2 * n * 2, "each phase sends (p-1)/p of the buffer, not all of it (a device keeps its "
                    "own block)"),
        (n * 2, "that is the size of the buffer itself; the ring sends almost twice that"),
        (expected * 8, "that is bits: divide by 8 for bytes"),
        ((p - 1) * n * 2, "that is p-1 whole buffers: a ring step sends one block of the "
                          "buffer, n/p values, not all of it; and there are two phases of "
                          "p-1 steps"),
        (2 * (p - 1) * n * 2, "that is 2(p-1) whole buffers: each of the 2(p-1) ring steps "
                              "sends one block of the buffer, n/p values, not all of it"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="bytes sent per device",
                                  unit="bytes")
