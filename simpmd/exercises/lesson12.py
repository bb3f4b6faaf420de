"""Checks for lesson 12, jit with Explicit shardings.

Each check prints what is right or what is off and returns a Verdict (true or false), so
that a reference solution can ``assert`` it. Expected values are worked out here by hand
from JAX's sharding rules and NumPy closed forms, never from the lesson's solutions.
"""
from __future__ import annotations

import re

import numpy as np

from simpmd.course import (Factor, Verdict, check_quantity, error_summary,
                           is_placeholder as _placeholder, say as _say)


__all__ = ["check_result_type", "megatron_data", "check_megatron", "check_reshard_collectives",
           "check_fsdp_gather_bytes"]


# -- exercise 1: the type of a result ---------------------------------------------------------

def _type_text(answer) -> str | None:
    if hasattr(answer, "str_short") or type(answer).__name__ == "ShapedArray":
        answer = str(answer)
    if not isinstance(answer, str):
        return None
    return re.sub(r"\s+", "", answer)


def check_result_type(answer) -> Verdict:
    """``x`` is ``float32[16@data,32@model]``; the type of ``x.T.sum(1)``.

    By hand: the transpose permutes the spec with the dims, giving
    ``float32[32@model,16@data]``; the sum over dim 1 removes that dim (and its axis) and
    keeps the other's, giving ``float32[32@model]``.
    """
    if _placeholder(answer):
        return _say(False, "answer_1 is still a placeholder; write the type as a string, e.g. "
                    "'float32[8@data]'.")
    text = _type_text(answer)
    if text is None:
        return _say(False, f"write the type as a string such as 'float32[8@data]', got {answer!r}.")
    hints = {
        "float32[32@model]": None,
        "float32[32@data]": "the transpose moves the spec with the dims: x.T is "
                            "float32[32@model,16@data], so dim 0 of the result keeps 'model'.",
        "float32[16@data]": "x.T has the 32 columns first; .sum(1) sums over the 16 rows of x.",
        "float32[32]": "a reduction removes only the summed dim's split; the kept dim keeps its axis.",
        "float32[32@model,1]": "sum without keepdims removes the summed dim.",
        "float32[32@(model,data)]": "the axis of the summed dim does not move to another dim: the "
                                    "partial sums are all-reduced over 'data', and the result "
                                    "is replicated along it.",
    }
    if text in hints and hints[text] is None:
        return _say(True, "x.T is float32[32@model,16@data], and summing dim 1 leaves "
                    "float32[32@model] (one all-reduce over 'data' combines the partial sums).")
    if text in hints:
        return _say(False, f"{hints[text]}")
    return _say(False, f"{answer!r} is not the type. Transpose first (the spec moves "
                "with the dims), then drop the summed dim.")


# -- exercise 2: the Megatron layer as x @ W1 @ W2 ----------------------------------------------

def megatron_data(seed: int = 0):
    """x (16, 8), W1 (8, 32), W2 (32, 8), float32."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((16, 8)).astype(np.float32)
    w1 = (rng.standard_normal((8, 32)) / np.sqrt(8)).astype(np.float32)
    w2 = (rng.standard_normal((32, 8)) / np.sqrt(32)).astype(np.float32)
    return x, w1, w2


def check_megatron(layer) -> Verdict:
    """``layer(x, w1, w2)`` under ``simpmd.jit``, with x split P('data', None), W1 split
    P(None, 'model') and W2 split P('model', None) on the 2x4 mesh: it must compute
    ``tanh(x @ W1) @ W2``, return ``float32[16@data,8]``, and need one all-reduce only."""
    import simpmd
    from simpmd import P
    if _placeholder(layer) or not callable(layer):
        return _say(False, "layer is still a placeholder; write def layer(x, w1, w2): ...")
    x, w1, w2 = megatron_data()
    expected = np.tanh(x @ w1) @ w2
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    with simpmd.set_mesh(mesh):
        args = [simpmd.device_put(x, P("data", None)), simpmd.device_put(w1, P(None, "model")),
                simpmd.device_put(w2, P("model", None))]
        jitted = simpmd.jit(layer)
        try:
            y = jitted(*args)
        except Exception as e:                  # noqa: BLE001 - the hint names it
            if "out_sharding" in str(e):
                return _say(False, "the second product sums over the dim split on "
                            "'model' on both sides, so JAX asks where the sum goes. Pass "
                            "out_sharding=P('data', None) to snp.matmul.")
            return _say(False, f"the layer raised {error_summary(e)}")
    if y is None or not hasattr(y, "shape"):
        return _say(False, "layer returns nothing; return the layer's output.")
    if tuple(y.shape) != (16, 8):
        return _say(False, f"the result has shape {tuple(y.shape)}; tanh(x @ W1) @ W2 is (16, 8).")
    if not np.allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5):
        if np.allclose(np.asarray(y), (x @ w1) @ w2, rtol=1e-4, atol=1e-5):
            return _say(False, "the values miss the tanh between the two products.")
        return _say(False, "the values differ from tanh(x @ W1) @ W2.")
    kind = str(simpmd.typeof(y))
    calls = [c[0].op for c in jitted.trace.calls()]
    if kind != "float32[16@data,8]":
        return _say(False, f"the result is {kind}: ask for rows split over 'data', whole "
                    f"columns (out_sharding=P('data', None)), as the Megatron layer returns.")
    if calls != ["psum"]:
        return _say(False, f"the right values, but jit inserted {calls}: the layer needs one "
                    f"all-reduce (psum) over 'model' and nothing else; did a reshard move W1 or W2?")
    return _say(True, "x @ W1 is float32[16@data,32@model] with no traffic, tanh is "
                "local, and the second product's partial sums meet in one all-reduce over 'model'.")


# -- exercise 3: which collective a reshard is ---------------------------------------------------

_KINDS = {"allgather": "all-gather", "all-gather": "all-gather", "all_gather": "all-gather",
          "alltoall": "all-to-all", "all-to-all": "all-to-all", "all_to_all": "all-to-all",
          "allreduce": "all-reduce", "all-reduce": "all-reduce", "psum": "all-reduce",
          "reducescatter": "reduce-scatter", "reduce-scatter": "reduce-scatter",
          "none": "none", "nothing": "none", "slice": "none", "": "none",
          "ppermute": "collective-permute", "permute": "collective-permute",
          "collective-permute": "collective-permute"}

RESHARDS = {"a": ("P('data', 'model')", "P('data', None)", "all-gather"),
            "b": ("P('data', None)", "P(None, 'data')", "all-to-all"),
            "c": ("P()", "P('data', 'model')", "none")}


def check_reshard_collectives(answers) -> Verdict:
    """A dict {'a': ..., 'b': ..., 'c': ...}: the collective each reshard of :data:`RESHARDS`
    needs ('all-gather', 'all-to-all', 'all-reduce', 'reduce-scatter' or 'none')."""
    if isinstance(answers, dict) and any(v is Ellipsis for v in answers.values()):
        return _say(False, "answer_3 still holds placeholders (...); name a collective for "
                    "each of (a), (b) and (c), or 'none'.")
    if _placeholder(answers) or not isinstance(answers, dict):
        return _say(False, "answer_3 should be a dict such as {'a': 'all-gather', 'b': ..., 'c': ...}.")
    wrong = []
    for key, (src, dst, right) in RESHARDS.items():
        given = answers.get(key)
        kind = _KINDS.get(re.sub(r"\s+", "", str(given if given is not None else "none")).lower())
        if kind != right:
            why = {"a": "'model' leaves the columns and goes nowhere: every device gathers the "
                        "other column blocks of its row band.",
                   "b": "'data' leaves the rows and moves to the columns: each device sends "
                        "the pieces of its block that the others keep, one exchange.",
                   "c": "every device already holds the whole array; it keeps its own piece "
                        "and sends nothing."}[key]
            wrong.append(f"({key}) {src} -> {dst}: {why}")
    if wrong:
        return _say(False, "\n  " + "\n  ".join(wrong))
    return _say(True, "(a) all-gather, (b) all-to-all, (c) no communication at all.")


# -- exercise 4: FSDP's all-gather, in bytes ------------------------------------------------------

def check_fsdp_gather_bytes(answer) -> Verdict:
    """Bytes ONE device receives when a bf16 weight of shape (4096, 4096), split over all 8
    devices (P(('data', 'model'), None)), is resharded to P() (a ring all-gather)."""
    factors = [
        Factor("values", 4096 * 4096),
        Factor("bytes per value", 2, {4: "bf16 takes 2 bytes per value (4 is float32)."}),
        Factor("share received", 7 / 8, {
            1: "each device already holds its own eighth; it receives the other 7/8.",
            1 / 8: "1/8 is the block a device holds; it receives the 7 blocks it lacks.",
            7: "7 blocks of 1/8 each, not 7 whole weights."}),
    ]
    return check_quantity(answer, factors, what="bytes received per device", unit="bytes")
