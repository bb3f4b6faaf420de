"""Checks for the exercises of lesson 5 (data-parallel training).

Each check runs the learner's answer on simpmd where it is a program, compares it with
a value worked out here with NumPy or by hand (never with the lesson's reference
solution), and prints what is off. Every check returns True or False, so a reference
solution can ``assert`` it.
"""
from __future__ import annotations

import numpy as np

import simpmd
from simpmd import lax
from simpmd.course import (check, check_against_mistakes, error_summary,
                           is_placeholder as _placeholder, say as _say)

N_DEVICES = 8



_error_text = error_summary


# Exercise 1 -------------------------------------------------------------------------------
# A one-feature model with scalar parameters: y = w x + b.
SEED_PARAMS = {"w": np.float32(0.5), "b": np.float32(0.0)}
_x = np.linspace(-1.0, 1.0, N_DEVICES * 4, dtype=np.float32)
SEED_BATCH = {"x": _x.reshape(N_DEVICES, 4), "y": (3.0 * _x - 1.0).reshape(N_DEVICES, 4)}
SEED_LR = 0.1


def seed_step(params, batch):
    """One SGD step on the scalar model, gradients averaged over the axis 'batch'."""
    x, y = batch["x"], batch["y"]
    r = params["w"] * x + params["b"] - y
    grads = {"w": 2.0 * (r * x).mean(), "b": 2.0 * r.mean()}
    grads = lax.pmean(grads, "batch")
    return {k: params[k] - SEED_LR * grads[k] for k in params}


def _seed_expected():
    """The same step on the whole batch at once, in float64 NumPy."""
    x = SEED_BATCH["x"].astype(np.float64).ravel()
    y = SEED_BATCH["y"].astype(np.float64).ravel()
    w, b = float(SEED_PARAMS["w"]), float(SEED_PARAMS["b"])
    r = w * x + b - y
    return {"w": w - SEED_LR * 2 * np.mean(r * x), "b": b - SEED_LR * 2 * np.mean(r)}


def check_in_axes(in_axes) -> bool:
    """Exercise 1: ``in_axes`` for ``pmap(seed_step)(SEED_PARAMS, SEED_BATCH)``."""
    if _placeholder(in_axes):
        return _say(False, "in_axes is still a placeholder; give one entry per argument, "
                    "e.g. (0, 0).")
    try:
        f = simpmd.pmap(seed_step, axis_name="batch", in_axes=in_axes)
        out = f(SEED_PARAMS, SEED_BATCH)
    except simpmd.MappedAxisError as exc:
        text = str(exc)
        if "is a scalar" in text and text.startswith("params"):
            return _say(False, "params is still mapped over axis 0, but its leaves are scalars: "
                        "there is nothing to split. Give params the entry None, so that every "
                        "device gets the whole of it.")
        if "at least one argument with a mapped axis" in text:
            return _say(False, "nothing is mapped, so pmap does not know how many devices to use. "
                        "Map the batch (entry 0 for the second argument).")
        return _say(False, f"pmap refused these in_axes: {text}")
    except Exception as exc:
        return _say(False, f"pmap refused these in_axes: {_error_text(exc)}")
    new = {k: np.asarray(v) for k, v in out.items()}
    devices = {v.shape[0] if v.ndim else 1 for v in new.values()}
    if devices != {N_DEVICES}:
        return _say(False, f"the step ran on {sorted(devices)} device(s); split the batch's "
                    f"leading axis (size {N_DEVICES}) so that each device gets 4 examples.")
    expected = _seed_expected()
    for k in ("w", "b"):
        for d in range(N_DEVICES):
            if not np.isclose(new[k][d], expected[k], rtol=1e-5, atol=1e-6):
                return _say(False, f"after the step, device {d} holds {k} = {float(new[k][d]):.6g}; "
                            f"one full-batch step gives {expected[k]:.6g}.")
    return _say(True, f"every device holds w = {expected['w']:.4f}, b = {expected['b']:.4f}: "
                "the full-batch step.")


# Exercise 2 -------------------------------------------------------------------------------
# Per device: the sum of per-example gradients (3 values) and how many real examples it
# had (the last device got a short, padded batch).
COUNTS = np.array([32, 32, 32, 32, 32, 32, 32, 8], dtype=np.int32)
GRAD_SUMS = (np.random.default_rng(0).normal(size=(N_DEVICES, 3)) * COUNTS[:, None]).round(3)


def check_global_gradient(body) -> bool:
    """Exercise 2: ``body(g_sum, count)`` returns the mean gradient over all examples."""
    if _placeholder(body):
        return _say(False, "global_gradient is still a placeholder; write the function.")
    if not callable(body):
        return _say(False, f"global_gradient should be a function, got {type(body).__name__}.")
    f = simpmd.pmap(body, axis_name="batch")
    try:
        out = f(GRAD_SUMS, COUNTS)
    except Exception as exc:
        return _say(False, f"your function raised on simpmd: {_error_text(exc)}")
    if out is None:
        return _say(False, "your function returns None; return the mean gradient (shape (3,)).")
    out = np.asarray(out, dtype=np.float64)
    total = COUNTS.sum()
    expected = np.broadcast_to(GRAD_SUMS.sum(axis=0) / total, GRAD_SUMS.shape)
    if out.shape != expected.shape:
        return _say(False, f"each device returns shape {out.shape[1:]}; expected {expected.shape[1:]}.")
    means = GRAD_SUMS / COUNTS[:, None]
    wrong = [
        (np.broadcast_to(means.mean(axis=0), expected.shape),
         "you averaged the per-device means: the last device, with 8 examples, then weighs as "
         "much as a device with 32. Sum the gradient sums and the counts over devices, then divide."),
        (np.broadcast_to(GRAD_SUMS.sum(axis=0) / N_DEVICES, expected.shape),
         f"you divided by the number of devices ({N_DEVICES}); divide by the number of examples "
         f"over all devices ({total}), lax.psum(count, 'batch')."),
        (np.broadcast_to(GRAD_SUMS.sum(axis=0), expected.shape),
         f"that is the sum over all {total} examples; divide by their number."),
        (GRAD_SUMS.sum(axis=0) / COUNTS[:, None],
         "each device divided by its own count; divide by the count summed over devices."),
        (means, "every device returns its own mean: nothing was combined across devices."),
        (GRAD_SUMS.sum(axis=0) / (N_DEVICES * COUNTS[:, None]),
         f"each device divided the summed gradient by {N_DEVICES} times its own count, as if "
         f"every device held as many examples as it does: right only when all counts are "
         f"equal. Here the last device has {COUNTS[-1]} and the others {COUNTS[0]}, {total} in "
         f"all: divide by the count summed over devices, lax.psum(count, 'batch')."),
    ]
    if not np.allclose(out, expected):
        for value, hint in wrong:
            if np.allclose(out, value):
                return _say(False, hint)
        for d in range(N_DEVICES):
            if not np.allclose(out[d], expected[d]):
                return _say(False, f"device {d} holds {np.round(out[d], 4)}, but the mean "
                            f"gradient over all {total} examples is {np.round(expected[d], 4)}: "
                            f"the gradient sums added over devices, divided by the counts "
                            f"added over devices (two psums).")
    return check(out, expected, what="the mean gradient on every device")


# Exercise 3 -------------------------------------------------------------------------------
GRAD_PARAMS = 2_500_000        # float32 parameters
GRAD_DEVICES = 4


def check_grad_bytes(answer) -> bool:
    """Exercise 3: bytes each device sends per step to pmean the float32 gradients (ring)."""
    n, p = GRAD_PARAMS, GRAD_DEVICES
    expected = 2 * (p - 1) * n * 4 / p            # by hand: 2 * 3/4 * 10 MB = 15,000,000
    mistakes = [
        (2 * (p - 1) * n * 2 / p, "you counted 2 bytes per value (bf16); these gradients are "
                                  "float32, 4 bytes per value"),
        ((p - 1) * n * 4 / p, "a ring all-reduce has two phases (reduce-scatter, then "
                              "all-gather), each sending (p-1)/p of the buffer; count both"),
        (2 * (8 - 1) * n * 4 / 8, "that is for 8 devices; this question has 4"),
        (2 * n * 4, "each phase sends (p-1)/p of the buffer, not all of it"),
        (n * 4, "that is the size of the gradient itself; the ring sends 2 (p-1)/p times that"),
        (2 * (p - 1) * n / p, "that counts values, not bytes: float32 takes 4 bytes per value"),
        (expected * 8, "that is bits: divide by 8 for bytes"),
    ]
    return check_against_mistakes(answer, expected, mistakes,
                                  what="bytes sent per device per step", unit="bytes")


# Exercise 4 -------------------------------------------------------------------------------
# grad under shard_map(check_vma=True): the gradient of a replicated parameter arrives
# already summed over the devices (JAX's pvary, transposed into a psum).
VMA_X = np.random.default_rng(5).normal(size=(N_DEVICES * 4, 3)).astype(np.float32)
VMA_Y = (VMA_X @ np.array([1.0, -2.0, 0.5], np.float32)).astype(np.float32)
VMA_W = np.zeros(3, np.float32)


def vma_loss(w, x, y):
    """The mean squared error of a linear model on one device's rows."""
    r = x @ w - y
    return (r * r).mean()


def check_mean_gradient(body) -> bool:
    """Run ``body(w, x, y)`` under ``simpmd.shard_map(check_vma=True)`` over 8 devices along
    'batch' (w replicated, x and y split by rows); it must return the gradient of the
    whole batch's mean loss, on every device: 2/N X^T (X w - y), worked out here in NumPy."""
    if body is None or body is Ellipsis:
        return _say(False, "mean_gradient is still a placeholder; define the function.")
    mesh = simpmd.make_mesh((N_DEVICES,), ("batch",))
    P = simpmd.P
    n = len(VMA_X)
    want = 2.0 / n * VMA_X.T @ (VMA_X @ VMA_W - VMA_Y)
    try:
        mapped = simpmd.shard_map(body, mesh=mesh, in_specs=(P(), P("batch"), P("batch")),
                                  out_specs=P())
        out = mapped(VMA_W, VMA_X, VMA_Y)
    except Exception as exc:                  # the learner's error is the message
        return _say(False, f"running it under shard_map raised {error_summary(exc)}")
    if out is None:
        return _say(False, "mean_gradient returned None; return the gradient (shape (3,)).")
    got = np.asarray(out, dtype=np.float64)
    if got.shape != want.shape:
        return _say(False, f"the gradient has shape {got.shape}; w has shape {want.shape}.")
    if np.allclose(got, want, rtol=1e-4, atol=1e-5):
        return _say(True, "the mean gradient of the whole batch, on every device.")
    if np.allclose(got, N_DEVICES * want, rtol=1e-4, atol=1e-5):
        return _say(False, f"this is {N_DEVICES} times the mean gradient: under check_vma=True, "
                    f"grad of a replicated w already sums the {N_DEVICES} devices' gradients "
                    f"(and a pmean of a value that is the same everywhere changes nothing). "
                    f"Divide by the number of devices, lax.axis_size('batch').")
    if np.allclose(got, want / N_DEVICES, rtol=1e-4, atol=1e-5):
        return _say(False, f"this is the mean gradient divided by {N_DEVICES} once too often.")
    return _say(False, f"the gradient is {np.round(got, 4)}; expected {np.round(want, 4)}.")
