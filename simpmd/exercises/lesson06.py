"""Checks for the exercises of lesson 6 (how collectives run and what they cost).

Every expected value is worked out here by hand from the alpha-beta formulas and the
H100 preset's two constants (never with simpmd.cost or the lesson's reference solution); a check names the unit or factor that is off. Every
check returns True or False, so a reference solution can ``assert`` it.
"""
from __future__ import annotations

import math

from simpmd.course import check_against_mistakes, is_placeholder as _placeholder, say as _say

# The gradient of the exercises: N parameters in bf16 (2 bytes per value), all-reduced
# over P devices with a ring.
N_PARAMS = 300_000_000
P = 8
BF16_BYTES = 2

# The H100 preset (simpmd.cost.HARDWARE["H100"], cited there): one device sends at most
# 18 NVLinks x 25 GB/s = 450 GB/s in one direction through the NVSwitches, and every
# step costs a round 1 us of latency. These are the constants of the formulas
# (cost.estimate(..., algorithm="ring" or "tree")); the preset's default estimate follows
# published measurements instead (cost.MeasuredFit), which the exercises do not use.
# Written out here so the checks do not depend on the code they check;
# tests/course/test_exercises_lesson06.py keeps them equal to the preset.
H100_ALPHA_S = 1e-6
H100_BANDWIDTH = 450e9          # bytes/s, one GPU, one direction
H100_LINK = 25e9                # bytes/s, one NVLink, one direction

KIB, GIB = 2 ** 10, 2 ** 30



# Exercise 1 -------------------------------------------------------------------------------

def ring_bytes_expected() -> float:
    """2 (p-1)/p of the buffer: 2 x 7/8 x 300e6 values x 2 bytes = 1.05e9 bytes."""
    return 2 * (P - 1) / P * N_PARAMS * BF16_BYTES


def check_ring_bytes(answer) -> bool:
    """Exercise 1: bytes ONE device sends in a ring all-reduce of the bf16 gradient."""
    n, p, expected = N_PARAMS, P, ring_bytes_expected()
    mistakes = [
        (expected * 2, "you counted 4 bytes per value (float32); the gradient is bf16, "
                       "2 bytes per value"),
        (expected * 4, "you counted 8 bytes per value (float64); bf16 takes 2 bytes per value"),
        (expected / 2, "that counts values, not bytes (bf16 = 2 bytes per value), or only one "
                       "of the two phases (reduce-scatter, then all-gather, each (p-1)/p of the "
                       "buffer)"),
        (2 * n * BF16_BYTES, "each phase sends (p-1)/p of the buffer, not all of it"),
        (n * BF16_BYTES, "that is the size of the gradient itself; the ring sends 2 (p-1)/p "
                         "times that"),
        (2 * (p - 1) * n * BF16_BYTES, "each step sends one piece, 1/p of the buffer, not "
                                       "the whole buffer: multiply by (p-1)/p, not (p-1)"),
        (expected * 8, "that is bits: 1 byte is 8 bits"),
        (expected / 1e9, "that is GB (10**9 bytes); give the answer in bytes"),
        (expected / GIB, "that is GiB (2**30 bytes); give the answer in bytes"),
        (expected / 2 ** 20, "that is MiB (2**20 bytes); give the answer in bytes"),
        (expected / 1e6, "that is MB (10**6 bytes); give the answer in bytes"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="bytes sent by one device",
                                  unit="bytes", rtol=1e-6)


# Exercise 2 -------------------------------------------------------------------------------

def ring_time_expected(nbytes: float = N_PARAMS * BF16_BYTES, p: int = P) -> float:
    """Ring all-reduce on one H100 node: 2(p-1) steps of alpha, plus 2(p-1)/p n / B."""
    return 2 * (p - 1) * H100_ALPHA_S + 2 * (p - 1) / p * nbytes / H100_BANDWIDTH


def check_ring_time(answer) -> bool:
    """Exercise 2: estimated time in SECONDS of that ring all-reduce on 8 H100s."""
    n, p = N_PARAMS * BF16_BYTES, P
    expected = ring_time_expected()
    latency = 2 * (p - 1) * H100_ALPHA_S
    moved = 2 * (p - 1) / p * n
    mistakes = [
        (expected * 1e3, "that is milliseconds: the question asks for seconds (divide by 1000)"),
        (expected * 1e6, "that is microseconds: the question asks for seconds"),
        (ring_time_expected(2 * n), "you counted 4 bytes per value (float32); bf16 takes 2"),
        ((ring_time_expected(2 * n)) * 1e3, "that is milliseconds, and with 4 bytes per value "
                                            "(float32); use seconds and bf16's 2 bytes"),
        (moved / H100_BANDWIDTH, "that is only the bandwidth part; add the latency of "
                                 f"2(p-1) = {2 * (p - 1)} steps of 1 us"),
        (latency + moved / H100_LINK, "25 GB/s is ONE NVLink; an H100 sends over 18 of them at "
                                      "once, 450 GB/s in one direction"),
        (latency + moved / (2 * H100_BANDWIDTH), "900 GB/s is the datasheet's figure for both "
                                                 "directions together; one direction carries "
                                                 "450 GB/s"),
        (latency + moved * 8 / H100_BANDWIDTH, "that divides bits by bytes per second "
                                               "(a factor of 8)"),
        (latency + n / H100_BANDWIDTH, "that sends the whole buffer once; a ring sends "
                                       "2 (p-1)/p of it"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the estimated time",
                                  unit="s", rtol=1e-3)


# Exercise 3 -------------------------------------------------------------------------------
SIZES = {"1 KiB": KIB, "1 GiB": GIB}
ALGORITHMS = ("ring", "tree")


def tree_time_expected(nbytes: float, p: int = P) -> float:
    """Binomial tree on one switch: log2 p levels up and down, each step the whole buffer."""
    levels = math.ceil(math.log2(p))
    return 2 * levels * H100_ALPHA_S + 2 * levels * nbytes / H100_BANDWIDTH


def winners_expected() -> dict:
    """For each size, the faster of ring and tree, from the closed forms."""
    return {label: ("ring" if ring_time_expected(n) < tree_time_expected(n) else "tree")
            for label, n in SIZES.items()}


def check_winners(answer) -> bool:
    """Exercise 3: ``{"1 KiB": "ring" or "tree", "1 GiB": ...}`` on 8 H100s."""
    if _placeholder(answer):
        return _say(False, 'answer is still a placeholder; give a dict such as '
                    '{"1 KiB": "ring", "1 GiB": "ring"}.')
    if not isinstance(answer, dict):
        return _say(False, f'answer should be a dict {{"1 KiB": ..., "1 GiB": ...}}, got '
                    f"{type(answer).__name__}.")
    missing = [k for k in SIZES if k not in answer]
    if missing:
        return _say(False, f"answer has no entry for {', '.join(map(repr, missing))}; its keys "
                    f"must be {list(SIZES)}.")
    for label in SIZES:
        if _placeholder(answer[label]):
            return _say(False, f"answer[{label!r}] is still a placeholder; write 'ring' or 'tree'.")
        if answer[label] not in ALGORITHMS:
            return _say(False, f"answer[{label!r}] is {answer[label]!r}; choose 'ring' or 'tree'.")
    expected = winners_expected()
    ring = {k: ring_time_expected(n) for k, n in SIZES.items()}
    tree = {k: tree_time_expected(n) for k, n in SIZES.items()}
    if all(answer[k] != expected[k] for k in SIZES):
        return _say(False, "both are swapped. A small message is latency-bound: the algorithm "
                    "with fewer steps wins (tree: 6 steps, ring: 14). A large one is "
                    "bandwidth-bound: the algorithm that sends fewer bytes wins (ring: 1.75 x "
                    "the buffer, tree: 6 x).")
    for k in SIZES:
        if answer[k] != expected[k]:
            win, lose = expected[k], answer[k]
            times = {"ring": ring[k], "tree": tree[k]}
            bound = "latency" if k == "1 KiB" else "bandwidth"
            return _say(False, f"for {k}, {win} takes {times[win] * 1e6:.4g} us and {lose} "
                        f"{times[lose] * 1e6:.4g} us: at this size the all-reduce is "
                        f"{bound}-bound.")
    return _say(True, f"1 KiB: tree ({tree['1 KiB'] * 1e6:.3g} us vs ring "
                f"{ring['1 KiB'] * 1e6:.3g} us); 1 GiB: ring ({ring['1 GiB'] * 1e3:.3g} ms vs tree "
                f"{tree['1 GiB'] * 1e3:.3g} ms).")


# Exercise 4 -------------------------------------------------------------------------------

def crossover_expected(p: int = P) -> float:
    """The size n where ring and tree take equal time on one H100 node.

    2(p-1) a + 2(p-1)/p n/B = 2 L a + 2 L n/B, with L = log2 p levels, so
    n = 2 (p-1-L) a B / (2 L - 2(p-1)/p). For p = 8: 8 a B / 4.25 = 847,059 bytes.
    """
    levels = math.ceil(math.log2(p))
    return (2 * (p - 1 - levels) * H100_ALPHA_S * H100_BANDWIDTH
            / (2 * levels - 2 * (p - 1) / p))


def check_crossover(answer) -> bool:
    """Exercise 4: the message size in BYTES (per device) where ring and tree tie."""
    expected = crossover_expected()
    p = P
    mistakes = [
        (expected / KIB, "that is in KiB (2**10 bytes); give bytes"),
        (expected / 1e3, "that is in kB (10**3 bytes); give bytes"),
        (expected / 2 ** 20, "that is in MiB (2**20 bytes); give bytes"),
        (expected / 1e6, "that is in MB (10**6 bytes); give bytes"),
        (expected / BF16_BYTES, "that is a number of bf16 values; the question asks for bytes"),
        (expected / 4, "that is a number of float32 values; the question asks for bytes"),
        (p * H100_ALPHA_S * H100_BANDWIDTH, "that is where the ring's own latency and bandwidth "
                                            "terms are equal (n = p alpha B), not where ring "
                                            "and tree tie"),
        (expected * 8, "that is bits: 1 byte is 8 bits"),
        (expected * H100_LINK / H100_BANDWIDTH,
         "25 GB/s is ONE NVLink; an H100 sends over 18 of them at once, 450 GB/s"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the crossover size",
                                  unit="bytes", rtol=1e-3)
