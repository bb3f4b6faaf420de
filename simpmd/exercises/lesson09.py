"""Checks for lesson 9, model parallelism on the mesh.

Each check prints what is right or what is off (a block of columns, a device whose value
is wrong, a factor such as bf16's 2 bytes per value) and returns a Verdict (true or false), so
that a reference solution can ``assert`` it. Expected values come from NumPy closed forms and
the mesh's row-major layout, never from the lesson's reference solutions.
"""
from __future__ import annotations

import numpy as np

from simpmd.course import (Factor, Verdict, check_quantity, error_summary,
                           is_placeholder as _placeholder, say as _say)

__all__ = ["check_columns", "row_parallel_data",
           "check_row_parallel", "check_weight_bytes", "check_psum_bytes",
           "fsdp_gradients", "check_fsdp_backward"]




# -- exercise 1: which block of W1 a device holds ------------------------------------------

def check_columns(answer, *, device: int = 6, mesh_shape=(4, 2), hidden: int = 32) -> Verdict:
    """``answer`` = (start, stop) of the columns of W1 (shape (D, hidden), spec
    P(None, 'model')) that ``device`` holds on a row-major ('data', 'model') mesh (the
    exercise's 4x2 mesh by default: the lesson draws the 2x4 one)."""
    what = f"the columns of W1 on device {device}"
    if _placeholder(answer):
        return _say(False, f"{what} are still a placeholder; give (start, stop).")
    if isinstance(answer, slice):
        answer = (answer.start, answer.stop)
    try:
        start, stop = (int(v) for v in answer)
    except (TypeError, ValueError):
        return _say(False, f"give {what} as two integers (start, stop), e.g. (0, 8); got "
                    f"{answer!r}.")
    n_data, n_model = mesh_shape
    data, model = divmod(device, n_model)              # row-major: device = data * n_model + model
    width = hidden // n_model
    expected = (model * width, (model + 1) * width)
    if (start, stop) == expected:
        return _say(True, f"device {device} sits at data={data}, model={model}, so it holds "
                    f"columns {expected[0]}:{expected[1]} of W1 (as do all devices with "
                    f"model={model}).")
    if stop - start == width - 1 and start == expected[0]:
        return _say(False, f"({start}, {stop}) stops one column early: a Python slice "
                    f"start:stop excludes stop, so a block of {width} columns is "
                    f"{start}:{start + width}.")
    per_device = hidden // (n_data * n_model)
    if (start, stop) == (device * per_device, (device + 1) * per_device):
        return _say(False, f"you split W1 over all {n_data * n_model} devices. P(None, "
                    f"'model') splits the columns over the 'model' axis only ({n_model} blocks "
                    f"of {width}); devices that differ only in 'data' hold the same block.")
    t_data, t_model = divmod(device, n_data)          # the same device on the mesh turned round
    t_width = hidden // n_data
    if n_data != n_model and (start, stop) == (t_model * t_width, (t_model + 1) * t_width):
        return _say(False, f"({start}, {stop}) is device {device}'s block on a {n_model}x{n_data} "
                    f"mesh. This mesh is {n_data}x{n_model}: {n_data} devices along 'data' and "
                    f"{n_model} along 'model', so device {device} sits at data={data}, "
                    f"model={model}, and 'model' cuts the {hidden} columns into {n_model} "
                    f"blocks of {width}.")
    if (start, stop) == (data * width, (data + 1) * width):
        return _say(False, f"you used the device's 'data' coordinate ({data}); the columns "
                    f"are split over 'model', and device {device} has model={model}.")
    if stop - start != width:
        return _say(False, f"a block of W1 is {width} columns wide ({hidden} columns over "
                    f"{n_model} devices along 'model'), not {stop - start}.")
    return _say(False, f"({start}, {stop}) is another device's block. Device {device} sits at "
                f"data={data}, model={model} (device ids run row-major over the mesh).")


# -- exercise 2: the row-parallel half of the layer -----------------------------------------

def row_parallel_data():
    """The checker's test data: h (8, 16), W2 (16, 4), and their blocks for 4 devices."""
    rng = np.random.default_rng(8)
    tokens, hidden, d_model, m = 8, 16, 4, 4
    h = rng.standard_normal((tokens, hidden)).astype(np.float32)
    w2 = rng.standard_normal((hidden, d_model)).astype(np.float32)
    h_blocks = np.stack(np.split(h, m, axis=1))          # device k: columns of h
    w2_blocks = np.stack(np.split(w2, m, axis=0))        # device k: the matching rows of W2
    return h, w2, h_blocks, w2_blocks


def check_row_parallel(fn) -> Verdict:
    """Run ``fn(h_block, w2_block)`` on 4 simulated devices along 'model' and compare
    with the full product h @ W2 on every device."""
    import simpmd
    if fn is None or fn is Ellipsis:
        return _say(False, "row_parallel is still a placeholder; define the function.")
    h, w2, h_blocks, w2_blocks = row_parallel_data()
    m = len(h_blocks)
    want = h @ w2
    try:
        out = simpmd.pmap(fn, axis_name="model")(h_blocks, w2_blocks)
    except Exception as exc:                  # the learner's error is the message
        if "all_gather" in _collectives_of(getattr(exc, "trace", None)):
            return _say(False, f"the body gathered h with all_gather, and the product that "
                        f"followed failed: the gathered h has all {w2.shape[0]} hidden "
                        f"columns, but a device holds only the {w2_blocks.shape[1]} rows of W2 "
                        f"that match its own columns of h. Multiply the blocks "
                        f"the device has (h_k @ W2_k), then add the {m} partial products "
                        f"with one collective.")
        return _say(False, f"running it on {m} simulated devices raised {error_summary(exc)}")
    if out is None:
        return _say(False, "row_parallel returned None; return the layer output.")
    got = np.asarray(out)
    partial = np.einsum("kth,khd->ktd", h_blocks, w2_blocks)
    if got.shape == (m, *want.shape):
        if np.allclose(got, want, rtol=1e-5, atol=1e-5):
            return _say(True, f"every device along 'model' holds the full output h @ W2 "
                        f"(shape {want.shape}).")
        if np.allclose(got, partial, rtol=1e-5, atol=1e-5):
            return _say(False, "each device returned only its partial product h_k @ W2_k. "
                        "The output is the SUM of the partial products over 'model': combine "
                        "them with a collective.")
        if np.allclose(got * m, want, rtol=1e-5, atol=1e-5):
            return _say(False, f"the output is {m} times too small: pmean divides the sum by "
                        f"the {m} devices. The partial products add up to the output: psum.")
        bad = [k for k in range(m) if not np.allclose(got[k], want, rtol=1e-5, atol=1e-5)]
        return _say(False, f"the output differs from h @ W2 on device(s) {bad}; e.g. device "
                    f"{bad[0]} holds {np.round(got[bad[0]].ravel()[:3], 4)} ... where "
                    f"{np.round(want.ravel()[:3], 4)} ... is expected.")
    if got.shape == (m, m, *want.shape) and not np.allclose(got, partial[None], rtol=1e-5,
                                                            atol=1e-5):
        return _say(False, f"each device gathered the {m} blocks of h with all_gather (shape "
                    f"{got.shape[1:]}) and multiplied each by its own block of W2: those are not "
                    f"the partial products. Multiply the blocks the device has (h_k @ W2_k) "
                    f"first, then add the partial products over 'model' with one collective.")
    if got.shape == (m, m, *want.shape):
        return _say(False, f"each device holds all {m} partial products stacked (shape "
                    f"{got.shape[1:]}): all_gather collects them but does not add them. "
                    f"Use psum, which adds them in one collective.")
    if got.shape == (m, want.shape[0] // m, want.shape[1]):
        return _say(False, f"each device holds {want.shape[0] // m} of the {want.shape[0]} "
                    f"tokens: that is psum_scatter, the sequence-sharded variant. Here the "
                    f"layer's output must be whole on every device: psum.")
    return _say(False, f"the result has shape {got.shape[1:]} on each device; expected "
                f"{want.shape} (tokens x d_model).")


def _collectives_of(trace) -> set:
    """The names of the collectives a simpmd trace (or None) records, run or only traced
    (a body that fails while it is traced has run none of them)."""
    if trace is None:
        return set()
    program = getattr(trace, "program", None)
    traced = {e.primitive.op for e in program.eqns
              if e.primitive.collective and e.primitive.op != "axis_index"} if program else set()
    return {e.op for e in trace.events if e.kind == "collective"} | traced


# -- exercise 3: weight bytes per device ----------------------------------------------------

def check_weight_bytes(answer, *, d_model: int = 4096, hidden: int = 16384,
                       mesh_shape=(2, 4)) -> Verdict:
    """Bytes of W1 (d_model x hidden) and W2 (hidden x d_model), bf16, that ONE device
    holds when both are split over 'model' and replicated over 'data'."""
    n_data, n_model = mesh_shape
    factors = [
        Factor("values", 2 * d_model * hidden, {
            d_model * hidden: "there are two weight matrices, W1 and W2, of d_model x hidden "
                              "values each."}),
        Factor("bytes per value", 2, {
            4: "bf16 takes 2 bytes per value (4 is float32).",
            1: "bf16 takes 2 bytes per value (16 bits)."}),
        Factor("share", 1 / n_model, {
            1: f"each device holds only its block: the weights are split {n_model} ways "
               f"along 'model'.",
            1 / (n_data * n_model): f"the weights are split over 'model' only ({n_model} "
               f"blocks); along 'data' they are replicated, so do not divide by "
               f"{n_data * n_model}.",
            1 / n_data: f"the weights are split over 'model' ({n_model} devices), not over "
               f"'data' ({n_data})."}),
    ]
    return check_quantity(answer, factors, what="weight bytes per device", unit="bytes")


# -- exercise 4: bytes one device sends in the forward psum ---------------------------------

def check_psum_bytes(answer, *, tokens: int = 8192, d_model: int = 4096,
                     mesh_shape=(2, 4)) -> Verdict:
    """Bytes ONE device sends in the forward psum over 'model' of the 2-D layer (bf16
    activations of shape (tokens / n_data, d_model)), with a ring all-reduce."""
    n_data, n_model = mesh_shape
    p = n_model
    factors = [
        Factor("tokens", tokens / n_data, {
            tokens: f"the 'model' group of a device works on its 'data' block only: "
                    f"{tokens} / {n_data} = {tokens // n_data} tokens.",
            tokens / (n_data * n_model): "the activations being summed are whole along "
                    "tokens on every device of the 'model' group: do not split them over "
                    "'model' as well."}),
        Factor("d_model", d_model),
        Factor("bytes per value", 2, {
            4: "bf16 takes 2 bytes per value (4 is float32)."}),
        Factor("ring factor", 2 * (p - 1) / p, {
            (p - 1) / p: "a ring all-reduce is a reduce-scatter AND an all-gather: each "
                         f"phase sends (p-1)/p of the buffer, 2(p-1)/p = {2 * (p - 1) / p:g} "
                         "in all.",
            1: f"a ring all-reduce sends 2(p-1)/p = {2 * (p - 1) / p:g} times the buffer, "
               "not the buffer once.",
            2: f"the ring factor is 2(p-1)/p = {2 * (p - 1) / p:g} for p = {p}, slightly "
               "less than 2.",
            2 * (n_data * n_model - 1) / (n_data * n_model):
               f"the psum runs over 'model' only: p = {p}, not {n_data * n_model}.",
            p - 1: f"in a ring each device sends 2(p-1) chunks of 1/p of the buffer, "
                   f"2(p-1)/p = {2 * (p - 1) / p:g} buffers, not p-1 whole buffers."}),
    ]
    return check_quantity(answer, factors, what="bytes sent per device", unit="bytes")


# -- exercise 5: FSDP's backward collective, by hand ------------------------------------------

def fsdp_gradients(devices: int = 4, rows: int = 8, cols: int = 3):
    """The checker's data: each device's gradient of the WHOLE weight matrix, stacked
    (devices, rows, cols), with small integers so that sums can be read by eye."""
    rng = np.random.default_rng(11)
    return rng.integers(-4, 5, size=(devices, rows, cols)).astype(np.float32)


def _fsdp_shape(got, total, sizes):
    """The verdict on a result of the wrong shape (None when it is right)."""
    n, rows, cols, k = sizes
    if got.shape == (n, rows, cols):
        if all(np.allclose(got[d], total) for d in range(n)):
            return _say(False, f"every device holds the whole summed gradient ({rows} rows): "
                        f"that is psum, an all-reduce. In FSDP each device keeps only the "
                        f"gradient of its own shard, {k} rows: psum_scatter(..., tiled=True) "
                        f"sums and splits in one collective, and sends half the bytes.")
        return _say(False, f"each device returned {rows} rows; it should keep only its own "
                    f"{k} rows of the summed gradient (shape ({k}, {cols})).")
    if got.shape != (n, k, cols):
        hint = ""
        if got.shape == (n, cols) or got.shape == (n, 1, cols):
            hint = (" A psum_scatter without tiled=True wants the scattered axis to have "
                    f"exactly {n} entries and drops it; use tiled=True to keep blocks of rows.")
        return _say(False, f"the result has shape {got.shape[1:]} on each device; expected "
                    f"({k}, {cols}): device d's {k} rows of the summed gradient.{hint}")
    return None


def check_fsdp_backward(fn) -> Verdict:
    """Run ``fn(g_full)`` on 4 simulated devices along 'data': every device passes its
    gradient of the whole weight matrix and must keep the sum over the devices of its own
    rows (device d: rows 2d, 2d+1 of 8), as the reduce-scatter of FSDP's backward pass."""
    import simpmd
    if fn is None or fn is Ellipsis:
        return _say(False, "fsdp_backward is still a placeholder; define the function.")
    g = fsdp_gradients()
    n, rows, cols = g.shape
    k = rows // n
    total = g.sum(axis=0)                                          # the summed gradient
    want = total.reshape(n, k, cols)                               # device d keeps block d
    run = simpmd.pmap(fn, axis_name="data")
    try:
        out = run(g)
    except Exception as exc:                  # the learner's error is the message
        return _say(False, f"running it on {n} simulated devices raised {error_summary(exc)}")
    if out is None:
        return _say(False, "fsdp_backward returned None; return this device's gradient shard.")
    got = np.asarray(out)
    wrong_shape = _fsdp_shape(got, total, (n, rows, cols, k))
    if wrong_shape is not None:
        return wrong_shape
    ops = _collectives_of(run.trace)
    if np.allclose(got, want) and "psum_scatter" not in ops:
        used = ", ".join(sorted(ops)) or "no collective"
        return _say(False, f"the shards are right, but the trace shows {used}, not a "
                    f"reduce-scatter: every device received the whole summed gradient "
                    f"({rows} rows) and then kept {k}. That is the all-reduce the lesson warns "
                    f"against, twice the bytes on the wire; psum_scatter(..., tiled=True) sums "
                    f"and splits in one collective.")
    if np.allclose(got, want):
        return _say(True, f"each of the {n} devices keeps rows of the gradient summed over "
                    f"all devices, {k} of {rows}: the reduce-scatter that grad makes of "
                    f"FSDP's forward all_gather.")
    own = g.reshape(n, n, k, cols)[np.arange(n), np.arange(n)]     # device d's own block d
    if np.allclose(got, own):
        return _say(False, "each device kept the right rows of its OWN gradient, without "
                    "the other devices' contributions. The weights were shared by every "
                    "device's batch, so their gradient is the sum over the devices.")
    if np.allclose(got * n, want):
        return _say(False, f"the shards are {n} times too small: that is a mean. The loss "
                    f"of the whole batch is the sum of the devices' losses, so its gradient "
                    f"is the sum (psum_scatter, not a division by {n}).")
    for d in range(n):
        if not np.allclose(got[d], want[d]):
            match = [b for b in range(n) if np.allclose(got[d], want[b])]
            where = f" (rows of device {match[0]}'s block)" if match else ""
            return _say(False, f"device {d} holds {got[d].ravel()[:3]} ...{where}; expected "
                        f"rows {d * k}-{d * k + k - 1} of the summed gradient, "
                        f"{want[d].ravel()[:3]} ....")
    return _say(False, "the shards differ from the summed gradient's rows.")
