"""Checks for lesson 17, serving a model.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values are closed forms written out factor by factor
(the cache of one token, the critical batch, the cache's split over chips, a transfer's
time), never taken from the lesson's solutions or from simpmd's programs.
"""
from __future__ import annotations

from simpmd.course import Factor, Verdict, check_against_mistakes, check_quantity


__all__ = ["check_cache_per_token", "check_critical_batch", "check_cache_per_chip",
           "check_move_seconds"]


def _bf16(right=2):
    return Factor("bytes per value", right, {4: "bf16 takes 2 bytes per value, not 4 (that is "
                                                "float32)",
                                             1: "bf16 takes 2 bytes per value; 1 byte is an "
                                                "int8 or fp8 cache"})


def _token_factors(layers, heads, kv_heads, head_dim):
    """The factors of one token's cache: K and V, every layer, every K/V head's values."""
    return [
        Factor("K and V", 2, {1: "the cache keeps a key AND a value per head: count both"}),
        Factor("layers", layers, {1: f"every one of the {layers} layers keeps its own keys and "
                                     f"values"}),
        Factor("K/V heads", kv_heads, {heads: f"with grouped-query attention only the {kv_heads} "
                                              f"K/V heads are cached, not the {heads} query heads"}),
        Factor("head width", head_dim, {1: f"each head's key (and value) has {head_dim} values"}),
    ]


def check_cache_per_token(answer, *, layers=32, heads=32, kv_heads=8, head_dim=128) -> Verdict:
    """Bytes of KV cache one token takes in bf16 (LLaMA 3-8B by default)."""
    factors = _token_factors(layers, heads, kv_heads, head_dim) + [_bf16()]
    return check_quantity(answer, factors, what="the cache of one token", unit="bytes")


def check_critical_batch(answer, *, peak=9.9e14, bandwidth=3.35e12) -> Verdict:
    """The batch at which a decode step's bf16 weight product turns compute-bound: its
    intensity, 2 B D F FLOPs over 2 D F bytes, is B, so B = peak / bandwidth."""
    expected = peak / bandwidth
    mistakes = [
        (bandwidth / peak, "that is bandwidth / peak, upside down: the intensity B must reach "
                           "peak FLOP/s divided by bytes/s"),
        (2 * expected, "the product does 2 B D F FLOPs and reads 2 D F bytes (bf16): the 2s "
                       "cancel, so the intensity is B, not 2 B's worth"),
        (expected / 2, "the product does 2 B D F FLOPs (a multiply and an add per weight and "
                       "sequence) over 2 D F bytes: the intensity is B, not B / 2"),
        (1.97e14 / 8.1e11, "that is the TPU v5e's ratio; the question is about the H100"),
        (expected / 4, "bf16 weights take 2 bytes each, not 4, and a multiply-add is 2 FLOPs: "
                       "the intensity is B"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the critical batch",
                                  unit="sequences", rtol=1e-3)


def check_cache_per_chip(answer, *, layers=32, heads=32, kv_heads=8, head_dim=128,
                         sequences=32, positions=8192, chips=16) -> Verdict:
    """Bytes of cache ONE chip holds when tensor parallelism splits the K/V heads over
    ``chips`` chips: at most ``kv_heads`` ways, each head kept whole on a chip."""
    ways = min(chips, kv_heads)
    factors = _token_factors(layers, heads, kv_heads, head_dim) + [
        _bf16(),
        Factor("positions", positions, {1: f"every sequence caches all its {positions} "
                                           f"positions"}),
        Factor("sequences", sequences, {1: f"all {sequences} sequences have a cache"}),
        Factor("split", 1 / ways, {
            1 / chips: f"{kv_heads} K/V heads split the cache at most {kv_heads} ways: on "
                       f"{chips} chips two chips hold each head, so divide by {ways}, not "
                       f"{chips}",
            1: f"tensor parallelism splits the K/V heads over the chips: divide by "
               f"min({chips}, {kv_heads}) = {ways}"}),
    ]
    return check_quantity(answer, factors, what="the cache per chip", unit="bytes")


def check_move_seconds(answer, *, layers=80, heads=64, kv_heads=8, head_dim=128, tokens=4096,
                       bandwidth=5e10) -> Verdict:
    """Seconds to send one prompt's bf16 cache (LLaMA 3-70B by default) over a link of
    ``bandwidth`` bytes/s."""
    factors = _token_factors(layers, heads, kv_heads, head_dim) + [
        _bf16(),
        Factor("tokens", tokens, {1: f"the whole prompt's {tokens} tokens are cached and sent"}),
        Factor("per byte", 1 / bandwidth, {
            8 / bandwidth: "50 GB/s is 5e10 bytes per second already; no factor of 8 (that "
                           "would be gigabits)",
            1 / (bandwidth / 1e9): "divide by the bandwidth in bytes per second, 5e10, not 50"}),
    ]
    return check_quantity(answer, factors, what="the time to move the cache", unit="seconds")
