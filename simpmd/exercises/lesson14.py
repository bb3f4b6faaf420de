"""Checks for lesson 14, sequence and expert parallelism.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values come from NumPy computed here (a full softmax,
a loop over tokens) and closed forms written out factor by factor, never from the lesson's
solutions.
"""
from __future__ import annotations

import math

import numpy as np

from simpmd.course import (Factor, Verdict, check_against_mistakes, check_quantity, error_summary,
                           is_placeholder, say as _say)


__all__ = ["partial_softmax", "check_merge", "check_ring_bytes", "check_ulysses_bytes",
           "check_capacity", "check_keep_mask", "RING_SIZES"]


# -- exercise 1: merging two partial softmaxes ------------------------------------------------

def partial_softmax(scores, values):
    """``(m, l, o)`` of one block of keys: the row maxima of ``scores`` (queries x keys),
    the sums of exp(scores - m), and the UNnormalised output sum exp(scores - m) @ values."""
    s = np.asarray(scores, dtype=np.float64)
    m = s.max(axis=-1)
    p = np.exp(s - m[:, None])
    return m, p.sum(axis=-1), p @ np.asarray(values, dtype=np.float64)


def _merge_cases():
    """(scores, values) pairs split into two key blocks; the second case puts the larger
    scores in the second block, the third in the first, so that a merge that rescales only
    one side is caught either way."""
    rng = np.random.default_rng(12)
    cases = []
    for shift in (0.0, 4.0, -4.0):
        s = rng.normal(size=(3, 10))
        s[:, 5:] += shift
        cases.append((s, rng.normal(size=(10, 2))))
    return cases


def check_merge(merge) -> Verdict:
    """``merge((m1, l1, o1), (m2, l2, o2))`` must return the ``(m, l, o)`` of both key blocks
    together, so that ``o / l[:, None]`` is softmax(scores) @ values."""
    if is_placeholder(merge) or not callable(merge):
        return _say(False, "merge is still a placeholder; define merge(a, b) returning (m, l, o).")
    for k, (s, v) in enumerate(_merge_cases()):
        a, b = partial_softmax(s[:, :5], v[:5]), partial_softmax(s[:, 5:], v[5:])
        m, l, o = partial_softmax(s, v)
        try:
            got = merge(a, b)
            if got is None:
                return _say(False, "merge returned None; return the tuple (m, l, o).")
            gm, gl, go = (np.asarray(t, dtype=np.float64) for t in got)
        except Exception as exc:      # the learner's code: say what it raised
            return _say(False, f"merge raised {error_summary(exc)}")
        if gm.shape != m.shape or gl.shape != l.shape or go.shape != o.shape:
            return _say(False, f"merge returned shapes {gm.shape}, {gl.shape}, {go.shape}; "
                        f"expected {m.shape} (m), {l.shape} (l), {o.shape} (o): one number per "
                        f"query for m and l, one row per query for o.")
        if not np.allclose(gm, m):
            if np.allclose(gm, np.minimum(a[0], b[0])):
                return _say(False, "m is the smaller of the two maxima; the running max is the larger.")
            if np.allclose(gm, a[0] + b[0]):
                return _say(False, "m is the sum of the two maxima; it should be their maximum.")
            return _say(False, "m differs from the maximum of the two blocks' maxima.")
        if not np.allclose(gl, l):
            if np.allclose(gl, a[1] + b[1]):
                return _say(False, "l is l1 + l2 added as they are; each was summed relative to "
                            "its own block's max, so scale each by exp(m_i - m) first.")
            if np.allclose(gl, a[1] * np.exp(a[0] - m) + b[1]) or \
                    np.allclose(gl, a[1] + b[1] * np.exp(b[0] - m)):
                return _say(False, "l rescales only one block: both l1 and l2 were summed "
                            "relative to their own block's max, so scale each by its own "
                            "exp(m_i - m) (the factor is 1 only for the block whose max is m).")
            if np.allclose(gl, a[1] * np.exp(m - a[0]) + b[1] * np.exp(b[0] - m)) or \
                    np.allclose(gl, a[1] * np.exp(a[0] - m) + b[1] * np.exp(m - b[0])):
                return _say(False, "l rescales one block the wrong way round: the factor is "
                            "exp(m_i - m), which is at most 1 (m is the larger max).")
            return _say(False, "l differs from the sum of exp(score - m) over both blocks.")
        if not np.allclose(go, o):
            if np.allclose(go, o / l[:, None]):
                return _say(False, "o is already divided by l; keep it unnormalised, so that "
                            "later blocks can still be merged in (divide once, at the end).")
            if np.allclose(go, a[2] + b[2]):
                return _say(False, "o is o1 + o2 added as they are; scale each by exp(m_i - m) "
                            "first, as for l.")
            if np.allclose(go, a[2] * np.exp(a[0] - m)[:, None] + b[2]) or \
                    np.allclose(go, a[2] + b[2] * np.exp(b[0] - m)[:, None]):
                return _say(False, "o rescales only one block: scale both o1 and o2, each by "
                            "its own exp(m_i - m), as for l.")
            return _say(False, f"o differs from the merged output (case {k + 1} of 3): check "
                        f"that each o_i is scaled by the same factor as its l_i.")
    return _say(True, "merging two blocks gives the m, l and o of both together; "
                "o / l is the full softmax's output.")


# -- exercises 2 and 3: bytes on the wire -------------------------------------------------------

RING_SIZES = dict(seq=32768, heads=32, head_dim=128, devices=8, bytes_per_value=2)


def _block(seq, heads, head_dim, devices):
    return Factor("tokens per device", seq / devices, {seq: "each device holds seq / devices "
                  "tokens of K and V, not the whole sequence"}), \
        Factor("values per token", heads * head_dim, {head_dim: "every head's K and V travel: "
               "multiply by heads as well as head_dim"})


def check_ring_bytes(answer, *, seq=32768, heads=32, head_dim=128, devices=8,
                     bytes_per_value=2, kv_heads=None) -> Verdict:
    """Bytes ONE device sends in a whole ring-attention pass (K and V, bf16).

    ``kv_heads`` (grouped-query attention) is the number of K/V heads, when it differs
    from the ``heads`` of the queries: only K and V travel, so only it counts.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    tokens, width = _block(seq, kv_heads, head_dim, devices)
    if kv_heads != heads:
        width.wrong[heads * head_dim] = (f"only K and V travel, and with grouped-query "
                                         f"attention they have {kv_heads} heads, not the "
                                         f"{heads} of the queries")
    n = devices
    factors = [
        Factor("K and V", 2, {1: "both K and V travel the ring, not only K",
                              3: "Q stays where it is (each device keeps its queries); only "
                                 "K and V travel: 2 blocks per shift, not 3"}),
        Factor("shifts", n - 1, {
            n: f"the block that arrives last is used where it lands: {n} devices need "
               f"{n - 1} shifts, not {n}",
            n - 2: f"each device must see the other {n - 1} blocks, and each shift brings one: "
                   f"{n - 1} shifts, not {n - 2}"}),
        tokens, width,
        Factor("bytes per value", bytes_per_value, _bytes_slips(bytes_per_value)),
    ]
    return check_quantity(answer, factors, what="bytes sent per device", unit="bytes")


def _bytes_slips(right):
    """The wrong bytes per value a learner may use, for bf16 (2) or float32 (4) values."""
    if right == 4:
        return {2: "float32 takes 4 bytes per value, not 2", 8: "float32 takes 4 bytes per value, not 8"}
    return {4: "bf16 takes 2 bytes per value, not 4", 1: "bf16 takes 2 bytes per value, not 1"}


def check_ulysses_bytes(answer, *, seq=32768, heads=32, head_dim=128, devices=8,
                        bytes_per_value=2, kv_heads=None) -> Verdict:
    """Bytes ONE device sends in DeepSpeed-Ulysses attention: all_to_alls of Q, K and V to
    a head split, and of the output back to a sequence split (bf16).

    ``kv_heads`` (grouped-query attention): K and V have that many heads, Q and the output
    ``heads``; the four all_to_alls then move 2 x heads + 2 x kv_heads heads' worth.
    """
    kv_heads = heads if kv_heads is None else kv_heads
    tokens, _ = _block(seq, heads, head_dim, devices)
    n = devices
    if kv_heads == heads:
        moved = Factor("all_to_alls", 4, {
            3: "the output goes back to a sequence split too: that is a fourth all_to_all",
            2: "Q, K and V each need an all_to_all in, and the output one back: 4 in all",
            1: "Q, K and V each need an all_to_all to the head split, and the output one "
               "back to the sequence split: 4, not 1"})
        width = Factor("values per token", heads * head_dim, {
            head_dim: "every head's values travel: multiply by heads as well as head_dim"})
    else:
        moved = Factor("heads moved", 2 * heads + 2 * kv_heads, {
            4 * heads: f"K and V have {kv_heads} heads (grouped-query attention), not "
                       f"{heads}: the all_to_alls move Q and the output with {heads} heads "
                       f"each, K and V with {kv_heads}",
            4 * kv_heads: f"Q and the output keep all {heads} heads; only K and V have "
                          f"{kv_heads}",
            heads + 2 * kv_heads: "the output goes back to a sequence split too: add its "
                                  "all_to_all"})
        width = Factor("values per head", head_dim)
    factors = [
        moved,
        Factor("share sent", (n - 1) / n, {
            1: f"a device keeps the 1/{n} of its block that is its own: it sends "
               f"({n} - 1)/{n} of it",
            1 / n: f"1/{n} is the piece a device keeps (or sends to each ONE other device); "
                   f"it sends {n - 1} such pieces, ({n} - 1)/{n} of its block",
            n - 1: f"each all_to_all sends {n - 1} pieces of 1/{n} of the block, one to each "
                   f"other device: ({n} - 1)/{n} of one block, not {n - 1} blocks"}),
        tokens, width,
        Factor("bytes per value", bytes_per_value, _bytes_slips(bytes_per_value)),
    ]
    return check_quantity(answer, factors, what="bytes sent per device", unit="bytes")


# -- exercises 4 and 5: capacity and dropped tokens ----------------------------------------------

def check_capacity(answer, *, tokens=4096, experts=64, capacity_factor=1.25) -> Verdict:
    """Slots per expert for ``tokens`` tokens (one device's batch), ``experts`` experts and
    a capacity factor, as the Switch Transformer defines it (rounded up to whole slots)."""
    exact = capacity_factor * tokens / experts
    expected = math.ceil(exact)
    mistakes = [(tokens / experts, "that is tokens / experts, the share of a perfectly "
                 "balanced router; the capacity factor multiplies it"),
                (capacity_factor * tokens, "divide by the number of experts: each expert gets "
                 "its share of the tokens"),
                (capacity_factor * experts / tokens, "the ratio is upside down: tokens / "
                 "experts, times the capacity factor")]
    for k in (2, 4):
        mistakes.append((math.ceil(k * exact), f"that is {k} x the answer: capacity = k x "
                         f"capacity factor x tokens / experts counts a slot for each of the k "
                         f"experts a token goes to (top-{k} routing); this router is top-1, "
                         f"and the lesson's formula, capacity factor x tokens / experts, has "
                         f"no k"))
    if exact != expected:
        mistakes.append((exact, "round up to a whole number of slots"))
    else:
        for wrong, what in ((expected + 1, "adds one"), (expected - 1, "drops one")):
            mistakes.append((wrong, f"capacity factor x tokens / experts = {capacity_factor:g} x "
                             f"{tokens} / {experts} = {expected} exactly, already a whole number "
                             f"of slots: there is nothing to round ({wrong} {what} slot)"))
    return check_against_mistakes(answer, expected, mistakes, what="capacity", unit="slots")


def _reference_keep(expert_of_token, num_experts, capacity):
    counts = [0] * num_experts
    kept = []
    for e in expert_of_token:
        kept.append(counts[e] < capacity)
        counts[e] += 1
    return np.array(kept)


KEEP_CASES = [([0, 1, 0, 0, 2, 0, 1], 3, 2), ([3, 3, 3, 3], 4, 1), ([1, 0, 1, 2, 1, 1, 0, 2], 3, 3),
              ([0, 1, 2], 3, 1),
              # 64 tokens over 4 experts: long enough that an unstable sort (np.argsort's
              # default) reorders the tokens of one expert, which short cases may not show
              ([(7 * t + t // 5) % 4 for t in range(64)], 4, 12)]


def check_keep_mask(keep_mask) -> Verdict:
    """``keep_mask(expert_of_token, num_experts, capacity)``: a boolean array, True for the
    tokens that find a free slot, first come first served in token order."""
    if is_placeholder(keep_mask) or not callable(keep_mask):
        return _say(False, "keep_mask is still a placeholder; define keep_mask(expert_of_token, "
                    "num_experts, capacity).")
    for choice, n, cap in KEEP_CASES:
        want = _reference_keep(choice, n, cap)
        try:
            got = keep_mask(np.array(choice), n, cap)
            if got is None:
                return _say(False, "keep_mask returned None; return one True/False per token.")
            got = np.asarray(got)
        except Exception as exc:
            return _say(False, f"keep_mask raised {error_summary(exc)}")
        case = f"for experts {choice} with capacity {cap}"
        if got.shape != want.shape:
            return _say(False, f"{case}, keep_mask returned shape {got.shape}; expected one "
                        f"entry per token, {want.shape}.")
        if got.dtype != bool and not np.isin(got, (0, 1)).all():
            return _say(False, f"{case}, keep_mask returned {got.tolist()}: give True/False "
                        f"per token.")
        got = got.astype(bool)
        if np.array_equal(got, want):
            continue
        if np.array_equal(got, _reference_keep(choice, n, cap + 1)):
            return _say(False, f"{case}, keep_mask keeps {int(got.sum())} tokens: one too many per "
                        f"full expert. A token's position among its expert's tokens starts at "
                        f"0, and it fits if that position is < capacity.")
        if cap > 1 and np.array_equal(got, _reference_keep(choice, n, cap - 1)):
            return _say(False, f"{case}, keep_mask keeps {int(got.sum())} tokens: one too few per "
                        f"full expert, as a position counted from 1 gives. A token's position "
                        f"among its expert's tokens starts at 0 (the first token has 0 before "
                        f"it), and it fits if that position is < capacity.")
        if np.array_equal(got, np.arange(len(choice)) < cap):
            return _say(False, f"{case}, keep_mask counts all tokens together; each expert has "
                        f"its own {cap} slot(s).")
        late = _reference_keep(choice[::-1], n, cap)[::-1]
        if np.array_equal(got, late):
            return _say(False, f"{case}, keep_mask keeps the LAST tokens of each expert; slots "
                        f"go to the first tokens, in order.")
        counts = np.bincount(choice, minlength=n)
        if np.array_equal(got, counts[choice] <= cap):
            return _say(False, f"{case}, keep_mask drops every token of an expert that got more "
                        f"than {cap}; such an expert still fills its {cap} slot(s) with its "
                        f"first tokens, and only the later ones are dropped.")
        kept_per_expert = np.bincount(np.asarray(choice)[got], minlength=n)
        if np.array_equal(kept_per_expert, np.minimum(counts, cap)):
            return _say(False, f"{case}, keep_mask keeps the right number of tokens per expert, "
                        f"but not the first ones: {got.astype(int).tolist()} instead of "
                        f"{want.astype(int).tolist()}. If you rank the tokens by sorting, sort "
                        f"stably (np.argsort(..., kind='stable')), so that the tokens of one "
                        f"expert keep their order.")
        return _say(False, f"{case}, keep_mask gives {got.astype(int).tolist()}, expected "
                    f"{want.astype(int).tolist()} (1 = kept).")
    return _say(True, "each expert keeps its first `capacity` tokens and drops the rest.")
