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
import types
from simpmd import P


__all__ = ["check_result_type", "megatron_data", "check_megatron", "check_reshard_collectives",
           "check_fsdp_gather_bytes"]


# -- exercise 1: the type of a result ---------------------------------------------------------

def _type_text(answer) -> str | None:
    """The type as text without spaces or quotes, in the long dtype names that
    ``typeof`` prints: ``f32[32@model]`` (a jaxpr's spelling) reads as float32[32@model]."""
    if hasattr(answer, "str_short") or type(answer).__name__ == "ShapedArray":
        answer = str(answer)
    if not isinstance(answer, str):
        return None
    text = re.sub(r"[\s'\"]+", "", answer)
    short = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64",
             "i32": "int32", "i64": "int64"}
    m = re.match(r"([a-z]+\d+)\[", text)
    if m and m.group(1) in short:
        text = short[m.group(1)] + text[len(m.group(1)):]
    return text


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


def _modules_used(fn) -> set:
    """The array modules ``fn`` reads by name ('numpy', 'jax.numpy'), from its code and
    the code of functions defined in it: ``np.tanh`` names np and ``tanh`` imported from
    jax.numpy names tanh, each looked up in fn's globals and closure; an import inside fn
    names the module itself."""
    scope = dict(getattr(fn, "__globals__", {}))
    for name, cell in zip(getattr(getattr(fn, "__code__", None), "co_freevars", ()),
                          getattr(fn, "__closure__", None) or ()):
        try:
            scope[name] = cell.cell_contents
        except ValueError:
            pass
    names, codes = set(), [getattr(fn, "__code__", None)]
    while codes:
        code = codes.pop()
        if code is None:
            continue
        names |= set(code.co_names) | set(code.co_freevars)
        codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    used = {name for name in names if name in ("numpy", "jax.numpy")}     # imported in fn
    for name in names:
        value = scope.get(name)
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", "") or ""
        if module == "numpy" or module.startswith("numpy."):
            used.add("numpy")
        elif module == "jax.numpy" or module.startswith(("jax.numpy.", "jax._src.numpy")):
            used.add("jax.numpy")
    return used


_USE_SIMPMD_NUMPY = ("under simpmd.jit write the layer with simpmd.numpy, whose functions "
                     "keep the shardings: snp.tanh(x @ w1), then snp.matmul(h, w2, "
                     "out_sharding=P('data', None))")


def _megatron_error(e, used) -> Verdict:
    """The hint for a layer that raised under jit."""
    if "jax.numpy" in used or "valid JAX type" in str(e):
        return _say(False, "the layer calls jax.numpy (jnp), whose functions take JAX "
                    f"arrays, not simpmd's sharded ones; {_USE_SIMPMD_NUMPY}.")
    if "numpy" in used:
        return _say(False, "the layer calls a NumPy function (np.tanh, np.matmul), which "
                    "jit refuses on a traced array, as JAX does, and NumPy has no "
                    f"out_sharding; {_USE_SIMPMD_NUMPY}.")
    if "out_sharding" in str(e):
        return _say(False, "the second product sums over the dim split on "
                    "'model' on both sides, so JAX asks where the sum goes. Pass "
                    "out_sharding=P('data', None) to snp.matmul.")
    return _say(False, f"the layer raised {error_summary(e, first_sentence=True)}")


def _megatron_traffic(calls) -> Verdict:
    """The hint for the right values reached with more collectives than the one psum."""
    ops = [op for op, _ in calls]
    by = [why.removeprefix("jit: ") for _, why in calls]
    if by[0] in ("dot_general", "matmul") and "reshard" in by:
        return _say(False, f"the right values, but jit inserted {ops}: the product left "
                    f"each device a slice of the sum ({ops[0]}), and the reshard of the "
                    f"output gathered it again ({ops[by.index('reshard')]}). Ask for the "
                    f"layout in the product itself, out_sharding=P('data', None): one "
                    f"all-reduce (psum) over 'model'.")
    if by[:1] == ["reshard"]:
        return _say(False, f"the right values, but jit inserted {ops}: a reshard moved an "
                    f"input (x, W1 or W2) before the products. The given splits need no "
                    f"reshard: only the second product's partial sums meet, in one "
                    f"all-reduce (psum) over 'model'.")
    return _say(False, f"the right values, but jit inserted {ops}: the layer needs one "
                f"all-reduce (psum) over 'model' and nothing else.")


def check_megatron(layer) -> Verdict:
    """``layer(x, w1, w2)`` under ``simpmd.jit``, with x split P('data', None), W1 split
    P(None, 'model') and W2 split P('model', None) on the 2x4 mesh: it must compute
    ``tanh(x @ W1) @ W2``, return ``float32[16@data,8]``, and need one all-reduce only."""
    import simpmd
    if _placeholder(layer) or not callable(layer):
        return _say(False, "layer is still a placeholder; write def layer(x, w1, w2): ...")
    used = _modules_used(layer)
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
            return _megatron_error(e, used)
    if y is None or not hasattr(y, "shape"):
        return _say(False, "layer returns nothing; return the layer's output.")
    if tuple(y.shape) != (16, 8):
        return _say(False, f"the result has shape {tuple(y.shape)}; tanh(x @ W1) @ W2 is (16, 8).")
    if not np.allclose(np.asarray(y), expected, rtol=1e-4, atol=1e-5):
        if np.allclose(np.asarray(y), (x @ w1) @ w2, rtol=1e-4, atol=1e-5):
            return _say(False, "the values miss the tanh between the two products.")
        return _say(False, "the values differ from tanh(x @ W1) @ W2.")
    kind = str(simpmd.typeof(y))
    calls = [(c[0].op, str(c[0].params.get("inserted", ""))) for c in jitted.trace.calls()]
    if "numpy" in used and kind != "float32[16@data,8]":
        return _say(False, f"the result is {kind}: a NumPy function (np.tanh, np.matmul) turns "
                    f"a sharded array into a plain, whole NumPy array, and NumPy has no "
                    f"out_sharding; {_USE_SIMPMD_NUMPY}.")
    if kind != "float32[16@data,8]":
        return _say(False, f"the result is {kind}: ask for rows split over 'data', whole "
                    f"columns (out_sharding=P('data', None)), as the Megatron layer returns.")
    if [op for op, _ in calls] != ["psum"]:
        return _megatron_traffic(calls)
    return _say(True, "x @ W1 is float32[16@data,32@model] with no traffic, tanh is "
                "local, and the second product's partial sums meet in one all-reduce over 'model'.")


# -- exercise 3: which collective a reshard is ---------------------------------------------------

# Each answer is read without case, spaces, '-' or '_', and without a leading "lax." or
# "jax.lax.": JAX's names (all_gather, psum_scatter), XLA's (all-gather, dynamic-slice) and
# the lesson's words (a local slice) all count.
_KINDS = {"allgather": "all-gather", "alltoall": "all-to-all",
          "allreduce": "all-reduce", "psum": "all-reduce",
          "reducescatter": "reduce-scatter", "psumscatter": "reduce-scatter",
          "ppermute": "collective-permute", "permute": "collective-permute",
          "collectivepermute": "collective-permute",
          "none": "none", "nothing": "none", "no": "none", "noneneeded": "none",
          "nocollective": "none", "nocommunication": "none", "nocollectiveneeded": "none",
          "notraffic": "none", "slice": "none", "localslice": "none", "local": "none",
          "dynamicslice": "none", "noop": "none"}


def _kind(answer) -> str | None:
    """The collective an answer names, or None when it names none of them."""
    text = re.sub(r"[\s_\-]+", "", str(answer)).lower()
    text = re.sub(r"^(jax\.)?lax\.", "", text)
    return _KINDS.get(text)

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
    unanswered = [key for key in RESHARDS if answers.get(key) is None
                  or (isinstance(answers.get(key), str) and not answers[key].strip())]
    if unanswered:
        return _say(False, f"{', '.join(f'({k})' for k in unanswered)} has no answer "
                    f"({', '.join(repr(answers.get(k)) for k in unanswered)}); name a "
                    f"collective for each, or write 'none' where no device needs to send.")
    wrong = []
    for key, (src, dst, right) in RESHARDS.items():
        given = answers[key]
        kind = _kind(given)
        if kind is None:
            wrong.append(f"({key}) {given!r} is not a collective this checker knows: write "
                         f"'all-gather', 'all-to-all', 'all-reduce', 'reduce-scatter' or "
                         f"'none' (JAX's names such as 'all_gather' count too).")
            continue
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
    return _say(True, "(a) all-gather, (b) all-to-all, (c) no communication at all: each "
                "device slices its own block out of the copy it holds (XLA writes a "
                "dynamic-slice).")


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
