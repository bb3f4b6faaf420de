"""Every exercise checker of lessons 2 to 17, swept with many plausible wrong answers.

Whatever a learner types, a checker must say "Not yet" without raising, must never print a
factor that reads 1 ("off by a factor of 1": a near miss is called one), and must never
chain more than one "Also" (a hint made of three slips misleads more than it helps). The
right answers are worked out here by hand; each named slip of a checker built on
``check_against_mistakes`` or ``check_quantity`` is also made on purpose, one at a time,
and must be answered with its own hint. Last, the slips learners were seen to make
(issue 47) are each named for what they are, and not for a slip the learner did not make.
"""
import itertools
import math
import re

import numpy as np
import pytest

from simpmd import course
from simpmd.exercises import (lesson02, lesson03, lesson04, lesson05, lesson06, lesson07,
                              lesson08, lesson09, lesson10, lesson11, lesson12, lesson13,
                              lesson14, lesson15, lesson16, lesson17)

MIB = 2**20
# One device's K (or V) block in lesson 14: 32768 / 8 tokens x 32 heads x 128 x 2 bytes
BLOCK = 32768 // 8 * 32 * 128 * 2
_I = 9.9e14 / 3.35e12                       # H100: bf16 peak / HBM bandwidth, FLOPs per byte
_BUS = 2 * 7 / 8 * 64 * MIB                 # nccl-tests' bus bytes of a 64 MiB all-reduce

# (checker, the right answer, worked out by hand)
NUMERIC = {
    "lesson04.check_ring_bytes": (lesson04.check_ring_bytes, 2 * 7 * 4096 * 2 / 8),       # 14336
    "lesson05.check_grad_bytes": (lesson05.check_grad_bytes, 2 * 3 / 4 * 2_500_000 * 4),  # 15e6
    "lesson06.check_ring_bytes": (lesson06.check_ring_bytes, 2 * 7 / 8 * 300e6 * 2),      # 1.05e9
    # 14 steps of 1 us, and 2 x 7/8 of 600 MB at 450 GB/s
    "lesson06.check_ring_time": (lesson06.check_ring_time, 14e-6 + 1.05e9 / 450e9),
    # ring = tree: 14 a + 1.75 n / B = 6 a + 6 n / B, so n = 8 a B / 4.25
    "lesson06.check_crossover": (lesson06.check_crossover, 8 * 1e-6 * 450e9 / 4.25),
    "lesson07.check_busbw": (lesson07.check_busbw, _BUS / (42e-6 + _BUS / 425e9)),
    # 8 hops, each one shard of V / 16 over a 45 GB/s link: V / 9e10
    "lesson07.check_book_gather": (lesson07.check_book_gather, 2048 * 8192 * 2 / 9e10),
    "lesson07.check_compute_bound_batch": (lesson07.check_compute_bound_batch,
                                           _I * 4096**2 / (4096**2 - _I * 2 * 4096)),
    # RMSNorm of bf16 x[16384, 8192] as two kernels: x read twice and written once (6RC),
    # one float32 per row written and read (8R), the float32 weight read (4C)
    "lesson07.check_rms_norm_bytes": (lesson07.check_rms_norm_bytes,
                                      6 * 16384 * 8192 + 8 * 16384 + 4 * 8192),
    "lesson09.check_weight_bytes": (lesson09.check_weight_bytes, 2 * 4096 * 16384 * 2 / 4),
    "lesson09.check_psum_bytes": (lesson09.check_psum_bytes, 8192 / 2 * 4096 * 2 * 2 * 3 / 4),
    "lesson11.check_sharded_bytes": (lesson11.check_sharded_bytes, 4096 / 2 * 8192 * 2),
    "lesson12.check_fsdp_gather_bytes": (lesson12.check_fsdp_gather_bytes, 4096**2 * 2 * 7 / 8),
    "lesson13.check_bubble": (lesson13.check_bubble, 7 / 31),
    "lesson14.check_ring_bytes": (lesson14.check_ring_bytes, 2 * 7 * BLOCK),
    "lesson14.check_ulysses_bytes": (lesson14.check_ulysses_bytes, 4 * 7 / 8 * BLOCK),
    "lesson14.check_capacity": (lesson14.check_capacity, 80),
    "lesson15.check_param_count": (lesson15.check_param_count, 8_030_261_248),
    # NeMo's LLaMA 2-70B: 4 replicas of TP 4 x PP 4, 128 / 4 = 32 micro-batches, v = 20
    "lesson15.check_bubble": (lesson15.check_bubble, 3 / (32 * 20 + 3)),
    # LLaMA 3-8B's cache: K and V x 32 layers x 8 K/V heads x 128 x 2 bytes, per token; for
    # 32 sequences of 8192 on 16 chips, split min(16, 8) ways; LLaMA 3-70B's (80 layers) of
    # 4096 tokens over 5e10 bytes/s; the H100's bf16 peak over its HBM bandwidth
    "lesson17.check_cache_per_token": (lesson17.check_cache_per_token, 2 * 32 * 8 * 128 * 2),
    "lesson17.check_critical_batch": (lesson17.check_critical_batch, _I),
    "lesson17.check_cache_per_chip": (lesson17.check_cache_per_chip,
                                      2 * 32 * 8 * 128 * 2 * 8192 * 32 / 8),
    "lesson17.check_move_seconds": (lesson17.check_move_seconds, 2 * 80 * 8 * 128 * 2 * 4096 / 5e10),
}

# Slips of scale and of counting, alone and two at a time
_SLIPS = [2, 4, 8, 3, 7, 7 / 8, 8 / 7, 3 / 4, 4 / 3, 1.75, 1e3, 1e6, 1e9, 2**10, 2**20, 2**30,
          1.024, 2**20 / 1e6, 2**30 / 1e9, 16, 32, 64, 128]
_NEAR = [1 + d for d in (1e-5, 1e-4, 1e-3, 3e-3, 6e-3, 9.9e-3, 0.02, 0.04)]


def wrong_answers(right):
    """Several hundred numbers a learner might give instead of ``right``."""
    factors = set(_SLIPS) | {1 / f for f in _SLIPS}
    pairs = {a * b for a, b in itertools.combinations_with_replacement(sorted(factors), 2)}
    out = {right * f for f in factors | pairs}
    out |= {right * f for f in _NEAR} | {right / f for f in _NEAR}
    out |= {float(f"{right:.{k}g}") for k in range(1, 7)}                # rounded
    out |= {round(right, k) for k in range(0, 4)} | {right + 1, right - 1, -right, 0.0}
    return sorted(v for v in out if not math.isclose(v, right, rel_tol=1e-6))


_FACTOR = re.compile(r"factor of (?:about )?([0-9][0-9.e+-]*)")


def assert_readable(out):
    """The two properties every verdict keeps, whatever the answer."""
    assert out.count("Also") <= 1, out
    for match in _FACTOR.finditer(out):
        text = match.group(1).rstrip(".")
        try:
            value = float(text)
        except ValueError:
            continue
        assert abs(value - 1) >= 0.005, f"a factor that reads 1: {out}"


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_the_right_answer_is_accepted(name, capsys):
    checker, right = NUMERIC[name]
    assert checker(right), capsys.readouterr().out
    assert capsys.readouterr().out.startswith("Correct: ")


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_plausible_wrong_numbers_get_readable_hints(name, capsys):
    checker, right = NUMERIC[name]
    answers = wrong_answers(right)
    assert len(answers) > 300
    for answer in answers:
        verdict = checker(answer)
        out = capsys.readouterr().out
        if verdict:           # a checker with a tolerance (lesson 7: 7 %, or one row) may take it
            assert math.isclose(answer, right, rel_tol=0.07), (answer, out)
            continue
        assert out.startswith("Not yet: "), (answer, out)
        assert_readable(out)


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_near_misses_are_called_near_misses(name, capsys):
    """Within 1 % of the answer, or the answer rounded: "close but not exact"."""
    checker, right = NUMERIC[name]
    for answer in [right * 1.004, right * 0.996, float(f"{right:.4g}")]:
        if math.isclose(answer, right, rel_tol=1e-3):
            continue          # some checkers accept 0.1 %: nothing to say then
        if checker(answer):
            continue
        out = capsys.readouterr().out
        assert "close but not exact (did you round?)" in out, (answer, out)


# -- each named slip, made on purpose -------------------------------------------------------

def _tables(checker, right, monkeypatch):
    """The mistakes (or factors) a checker hands to the shared machinery, caught on the way."""
    module = __import__(checker.__module__, fromlist=["_"])
    caught = {}

    def against(answer, expected, mistakes, **kw):
        caught["mistakes"] = (expected, mistakes, kw)
        return course.check_against_mistakes(answer, expected, mistakes, **kw)

    def quantity(answer, factors, **kw):
        caught["factors"] = (factors, kw)
        return course.check_quantity(answer, factors, **kw)
    if hasattr(module, "check_against_mistakes"):
        monkeypatch.setattr(module, "check_against_mistakes", against)
    if hasattr(module, "check_quantity"):
        monkeypatch.setattr(module, "check_quantity", quantity)
    checker(right)
    return caught


# lesson 13's bubble and lesson 15's checkers hand over only the slips that match the answer
TABLED = [n for n in sorted(NUMERIC) if n != "lesson13.check_bubble" and not n.startswith("lesson15")]


@pytest.mark.parametrize("name", TABLED)
def test_each_named_slip_is_refused_with_its_own_hint(name, capsys, monkeypatch):
    checker, right = NUMERIC[name]
    caught = _tables(checker, right, monkeypatch)
    capsys.readouterr()
    slips = []
    if "mistakes" in caught:
        expected, mistakes, _ = caught["mistakes"]
        assert math.isclose(expected, right, rel_tol=1e-9)
        slips = [(wrong, hint) for wrong, hint in mistakes]
    else:
        factors, _ = caught["factors"]
        assert math.isclose(math.prod(f.right for f in factors), right, rel_tol=1e-9)
        for f in factors:
            for wrong, hint in f.wrong.items():
                slips.append((right / f.right * wrong, hint))
    assert slips, name
    for wrong, hint in slips:
        assert not checker(wrong)
        out = capsys.readouterr().out
        assert out.startswith("Not yet: ")
        # the hint, as printed (sentence-case first letter, a full stop added)
        core = hint.rstrip(".")[1:]
        assert core in out, (wrong, hint, out)
        assert_readable(out)


# -- checkers whose answers are not numbers ---------------------------------------------------

def _functions():
    """Functions a learner might hand in that do the wrong thing, each in its own way."""
    return [lambda *a, **k: None, lambda *a, **k: a[0], lambda *a, **k: a[0] * 0,
            lambda *a, **k: a[0] * 2, lambda *a, **k: 1 / 0, lambda *a, **k: "text",
            lambda *a, **k: np.zeros(3)]


_STRUCTURES = [None, ..., 0, 3.5, "all-gather", "", [], (), {}, [0, 1], [(0, 1), (1, 0)],
               ((1, 2), (3,), ()), {"a": "x"}, [[0, 1], [2, 3]], np.zeros((2, 4)), (0, 16)]

STRUCTURED = {
    "lesson02.check_shapes": (lesson02.check_shapes, _STRUCTURES),
    "lesson02.check_batch": (lesson02.check_batch, _STRUCTURES + [np.zeros((8, 4, 3))]),
    "lesson02.check_global_norm": (lesson02.check_global_norm, _functions()),
    "lesson03.check_pytree_in_axes": (lesson03.check_pytree_in_axes,
                                      _STRUCTURES + [({"w": 0, "b": 0}, 0), (None, 0)]),
    "lesson03.check_other_axes": (lesson03.check_other_axes,
                                  _STRUCTURES + [dict(in_axes=0, out_axes=0),
                                                 dict(in_axes=1, out_axes=0)]),
    "lesson03.check_static": (lesson03.check_static, _STRUCTURES + _functions()),
    "lesson04.check_global_mean": (lesson04.check_global_mean, _functions()),
    "lesson04.check_shift_left": (lesson04.check_shift_left,
                                  _STRUCTURES + [[(j, (j + 1) % 8) for j in range(8)],
                                                 [(j, j) for j in range(8)]]),
    "lesson04.check_shapes": (lesson04.check_shapes,
                              _STRUCTURES + [((4, 8, 16), (4, 128), (4, 2, 1)),
                                             ((32, 16), (4, 128), (4, 2))]),
    "lesson05.check_in_axes": (lesson05.check_in_axes, _STRUCTURES + [(0, 0), (0, None)]),
    "lesson05.check_global_gradient": (lesson05.check_global_gradient, _functions()),
    "lesson05.check_mean_gradient": (lesson05.check_mean_gradient, _functions()),
    "lesson06.check_winners": (lesson06.check_winners,
                               _STRUCTURES + [{"1 KiB": "ring", "1 GiB": "tree"},
                                              {"1 KiB": "tree", "1 GiB": "tree"}]),
    "lesson08.check_data_groups": (lesson08.check_data_groups,
                                   _STRUCTURES + [[(0, 1), (2, 3), (4, 5), (6, 7)],
                                                  [(0, 2, 4, 6)]]),
    "lesson08.check_worked_example_2x4": (lesson08.check_worked_example_2x4,
                                          _STRUCTURES + [np.full((2, 4), 7.0),
                                                         np.full((2, 4), 28.0),
                                                         np.full((2, 4), 14.0 * 1.004)]),
    "lesson08.check_modern": (lesson08.check_modern, _functions()),
    "lesson09.check_columns": (lesson09.check_columns, _STRUCTURES[:-1]  # (0, 16) is right
                              + [(16, 32), (0, 8), (8, 16)]),
    "lesson09.check_row_parallel": (lesson09.check_row_parallel, _functions()),
    "lesson09.check_fsdp_backward": (lesson09.check_fsdp_backward, _functions()),
    "lesson10.check_fixed_mixed": (lesson10.check_fixed_mixed, _functions()[:3]),
    "lesson10.check_failed_run": (lesson10.check_failed_run,
                                  _STRUCTURES + [{"failed_device": 3, "waiting": [0, 1],
                                                  "collective": "psum"}]),
    "lesson10.check_smooth": (lesson10.check_smooth, _functions()[:3]),
    "lesson10.check_top_half_total": (lesson10.check_top_half_total, _functions()[:3]),
    "lesson11.check_specs": (lambda a: lesson11.check_specs(*a),
                             [(None, None), ((None, None), None), (("i", "i"), "i")]),
    "lesson11.check_block_shapes": (lambda a: lesson11.check_block_shapes(*a),
                                    [((8, 6), (16, 3), (4, 12)), ((16, 24),) * 3,
                                     ((2, 4), (1,), (3,)), (None, "x", 5)]),
    "lesson11.check_centering": (lesson11.check_centering, _STRUCTURES + _functions()),
    "lesson12.check_result_type": (lesson12.check_result_type,
                                   _STRUCTURES + ["float32[32@data]", "f32[16@data]",
                                                  "float32[32]", "bfloat16[32@model]"]),
    "lesson12.check_megatron": (lesson12.check_megatron, _functions()[:3]),
    "lesson12.check_reshard_collectives": (lesson12.check_reshard_collectives,
                                           _STRUCTURES + [{"a": "psum", "b": "x", "c": "y"},
                                                          {"a": None, "b": 3, "c": "no"}]),
    "lesson13.check_training_idle": (lesson13.check_training_idle, _functions()),
    "lesson13.check_send_perm": (lesson13.check_send_perm,
                                 _STRUCTURES + [[(0, 2), (2, 3)], [(3, 2), (2, 1), (1, 0)]]),
    "lesson13.check_activations_held": (lambda a: lesson13.check_activations_held(*a),
                                        [([32] * 8, [1] * 8), ([0] * 8, [0] * 8),
                                         ([32] * 8, [16 - s for s in range(8)])]),
    "lesson14.check_merge": (lesson14.check_merge, _functions()),
    "lesson14.check_keep_mask": (lesson14.check_keep_mask, _functions()),
}


@pytest.mark.parametrize("name", sorted(STRUCTURED))
def test_other_checkers_refuse_wrong_answers_readably(name, capsys):
    checker, answers = STRUCTURED[name]
    for answer in answers:
        verdict = checker(answer)
        out = capsys.readouterr().out
        assert not verdict, (name, answer, out)
        assert "Not yet" in out, (name, answer, out)
        assert_readable(out)


# -- slips a learner made, each named for what it is (issue 47) -------------------------------
# (checker, a wrong answer worked out here by hand, words the verdict must hold, words it
# must not hold: the slip another mistake would have named)

_RMS = 6 * 16384 * 8192 + 8 * 16384 + 4 * 8192
_SHARD = 128 * 8192 * 2                       # lesson 7, exercise 2: one chip's bf16[128, 8192]
_I_SUSTAINED = 9.9e14 * 0.803 / (3.35e12 * 0.867)


# LLaMA 3-8B by hand (config.json): 32 layers of Q and O (D x 32 x 128 each), K and V
# (D x 8 x 128 each), three MLP matrices and two norms, two vocabulary matrices, a last norm
_LLAMA8B = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) \
    + 2 * 128256 * 4096 + 4096
# LLaMA 3-70B the same way (80 layers, D 8192, F 28672, 64 heads, 8 kv heads), and PaLM's
# FLOPs per token, 6N + 12 L H Q T, at T tokens; days on 8,960 v5p chips at 40 % MFU
_N70 = 80 * (2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192) \
    + 2 * 128256 * 8192 + 8192


def _PER_TOKEN(t):
    return 6 * _N70 + 12 * 80 * 64 * 128 * t


def _DAYS(per_token):
    return 15e12 * per_token / (8960 * 4.59e14 * 0.4) / 86400


# 15e12 tokens in steps of 2,048 x 2,048, 0.9 s each, on 8,192 chips at $4.2 a chip-hour
_COST = 15e12 / (2048 * 2048) * 0.9 / 3600 * 8192 * 4.2


def _busbw(factor, latency=42e-6):
    bus = factor * 64 * MIB
    return bus / (latency + bus / 425e9)


NAMED_SLIPS = {
    # 11: the all-gather's (p-1)/p where the all-reduce's 2(p-1)/p belongs, not "2 bytes"
    "7.1 busbw x (p-1)/p": (lesson07.check_busbw, _busbw(1.75) / 2, ["all-gather"],
                            ["bytes per value"]),
    "7.1 bus bytes (p-1)/p S": (lesson07.check_busbw, _busbw(7 / 8), ["all-gather"],
                                ["bytes per value"]),
    "7.1 latency in ms": (lesson07.check_busbw, _busbw(1.75, 42e-3), ["42 ms"], []),
    # 16: 7.2 over the 8-axis (4 hops as if it wrapped, or 7 hops of a line): now a number
    # of its own, since the shard is given
    "7.2 the 8-axis as a ring": (lesson07.check_book_gather, 4 * _SHARD / 4.5e10,
                                 ["axis of 8"], []),
    "7.2 the 8-axis as a line": (lesson07.check_book_gather, 7 * _SHARD / 4.5e10,
                                 ["line of 8"], ["one way round only"]),
    "7.2 the shard as the array": (lesson07.check_book_gather, 8 * _SHARD / 16 / 4.5e10,
                                   ["shard for the whole array"], []),
    # 16: 7.3 with the sustained rates of section 5 instead of the peaks
    "7.3 sustained rates": (lesson07.check_compute_bound_batch,
                            _I_SUSTAINED * 4096**2 / (4096**2 - 2 * _I_SUSTAINED * 4096),
                            ["sustained rates"], []),
    # 12: w's 4C bytes, or one pass over the R row values, left out: not "did you round?"
    "7.4 without w": (lesson07.check_rms_norm_bytes, _RMS - 4 * 8192, ["leaves out w"],
                      ["did you round"]),
    "7.4 row values once": (lesson07.check_rms_norm_bytes, _RMS - 4 * 16384,
                            ["row values once"], ["did you round"]),
    "7.4 no row values": (lesson07.check_rms_norm_bytes, _RMS - 8 * 16384,
                          ["leaves out the R float32 row values"], ["did you round"]),
    # 16: 13.1 p = 8 and m = 24 swapped
    "13.1 p and m swapped": (lesson13.check_bubble, 23 / 31, ["swaps p and m"], []),
    # 16: 14.3 the 1/n a device keeps, for the (n-1)/n it sends
    "14.3 1/n sent": (lesson14.check_ulysses_bytes, 4 * BLOCK / 8, ["1/8 is the piece"], []),
    # 16: 14.4 off by one slot where 1.25 x 4096 / 64 = 80 exactly
    "14.4 81": (lesson14.check_capacity, 81, ["nothing to round"], []),
    "14.4 79": (lesson14.check_capacity, 79, ["nothing to round"], []),
    # 16: 15.1 in billions, and V's projection left out
    "15.1 in billions": (lesson15.check_param_count, _LLAMA8B / 1e9, ["in billions"],
                         ["factor"]),
    "15.1 V forgotten": (lesson15.check_param_count, _LLAMA8B - 32 * 4096 * 8 * 128,
                         ["one of the keys' and values'"], []),
    # 6: the 6N hint says how much attention adds at the lesson's 2,048 tokens, and at 8,192
    "15.3 6N at 2,048 tokens": (lambda a: lesson15.check_training_days(a, _PER_TOKEN(2048), _N70),
                                _DAYS(6 * _N70), ["3.8% more"], ["11%"]),
    "15.3 6N at 8,192 tokens": (lambda a: lesson15.check_training_days(a, _PER_TOKEN(8192), _N70),
                                _DAYS(6 * _N70), ["15.2% more"], ["11%"]),
    # 16: 15.3 the MFU as 40, and the v5e's peak
    "15.3 MFU as 40": (lambda a: lesson15.check_training_days(a, _PER_TOKEN(2048), _N70),
                       _DAYS(_PER_TOKEN(2048)) / 100, ["MFU as 40"], []),
    "15.3 v5e peak": (lambda a: lesson15.check_training_days(a, _PER_TOKEN(2048), _N70),
                      _DAYS(_PER_TOKEN(2048)) * 4.59e14 / 1.97e14, ["TPU v5e"], []),
    # 13: 15.4 m = 128 / 16 = 8 is its own slip; percentages are called percentages
    "15.4 m = 8": (lesson15.check_bubble, 3 / (8 * 20 + 3), ["128 / 16"],
                   ["all 64 GPUs", "counts the layers", "Also"]),
    "15.4 a percentage": (lesson15.check_bubble, 100 * 3 / (32 * 20 + 3), ["percentage"],
                          ["factor of 100"]),
    "15.4 a percentage x 100": (lesson15.check_bubble, 1e4 * 3 / (32 * 20 + 3), ["percentage"],
                                ["factor of"]),
    # 15.7 (issue 47, item 21): the run's cost, at 0.9 s a step
    "15.7 one chip's hours": (lambda a: lesson15.check_run_cost(a, 0.9), _COST / 8192,
                              ["one chip"], []),
    "15.7 seconds x price per hour": (lambda a: lesson15.check_run_cost(a, 0.9), _COST * 3600,
                                      ["3,600"], ["factor"]),
    # 16: 15.4 p idle ticks for p - 1
    "15.4 p for p - 1": (lesson15.check_bubble, 4 / (32 * 20 + 3), ["not p"], []),
}


def _refused_naming(name, checker, answer, said, unsaid, capsys) -> str:
    """``checker`` refuses ``answer`` with a message that says each of ``said`` and none
    of ``unsaid`` (a slip the learner did not make); the message, for further checks."""
    assert not checker(answer)
    out = capsys.readouterr().out
    assert out.startswith("Not yet: "), out
    for words in said:
        assert words in out, (name, out)
    for words in unsaid:
        assert words not in out, (name, out)
    return out


@pytest.mark.parametrize("name", sorted(NAMED_SLIPS))
def test_a_slip_is_named_for_what_it_is(name, capsys):
    assert_readable(_refused_naming(name, *NAMED_SLIPS[name], capsys))


def _report_sum(jax):
    """Lesson 16, exercise 3, with `.sum()` where `.mean()` was meant."""
    mesh = jax.make_mesh((4, 2), ("hosts", "chips"))
    x = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("hosts")),
                                               lesson16.local_rows(jax))
    value = float(jax.jit(lambda v: (v * v).sum())(x))
    if jax.process_index() == 0:
        print("loss", value)


def _merge_rescaling_one_block(first):
    """Lesson 14, exercise 1, scaling only one block's l and o by exp(m_i - m)."""
    def merge(a, b):
        (m1, l1, o1), (m2, l2, o2) = a, b
        m = np.maximum(m1, m2)
        s1, s2 = (np.exp(m1 - m), 1.0) if first else (1.0, np.exp(m2 - m))
        return m, l1 * s1 + l2 * s2, o1 * np.asarray(s1)[..., None] + o2 * np.asarray(s2)[..., None]
    return merge


def _keep_from_one(expert_of_token, num_experts, capacity):
    """Lesson 14, exercise 5, counting a token's position among its expert's from 1."""
    counts = np.zeros(num_experts, int)
    keep = []
    for e in expert_of_token:
        counts[e] += 1
        keep.append(counts[e] < capacity)
    return np.array(keep)


def _numpy_mean(x):
    """Lesson 4, exercise 1, with NumPy's mean where a collective was meant."""
    return np.mean(x)


def _method_mean(x):
    return x.mean()


PROGRAM_SLIPS = {
    # 15: a NumPy reduction where a collective was meant, whether the engine raises on it
    # or runs it (the test below runs both)
    "4.1 np.mean(x)": (lesson04.check_global_mean, _numpy_mean, ["NumPy's mean", "lax.psum"],
                       ["raised", "Spelled"]),
    "4.1 x.mean()": (lesson04.check_global_mean, _method_mean, ["NumPy's mean", "lax.psum"],
                     ["shape"]),
    "14.1 only block 1 rescaled": (lesson14.check_merge, _merge_rescaling_one_block(True),
                                   ["rescales only one block"], ["differs from the sum"]),
    "14.1 only block 2 rescaled": (lesson14.check_merge, _merge_rescaling_one_block(False),
                                   ["rescales only one block"], ["differs from the sum"]),
    "14.5 positions from 1": (lesson14.check_keep_mask, _keep_from_one, ["one too few"], []),
    # 14: the sum for the mean is not "is every host's data in it?"
    "16.3 .sum() for .mean()": (lesson16.check_fixed_report, _report_sum, ["`.sum()`"],
                                ["every host's data in it"]),
}


@pytest.mark.parametrize("name", sorted(PROGRAM_SLIPS))
def test_a_program_slip_is_named_for_what_it_is(name, capsys):
    _refused_naming(name, *PROGRAM_SLIPS[name], capsys)


@pytest.mark.parametrize("engine", ["raises", "runs"])
def test_a_numpy_reduction_is_named_whatever_the_engine_does(engine, capsys, monkeypatch):
    """Lesson 4, exercise 1: np.mean(x) in the body is named as a NumPy reduction both where
    the engine refuses np.mean on a traced value and where it runs it (each device's own
    mean, no collective in the trace)."""
    import types
    if engine == "raises":
        def run(body, x, axis_name="i"):
            return None, None, "TypeError: Spelled.mean() got an unexpected keyword argument 'out'"
    else:
        def run(body, x, axis_name="i"):
            return x.mean(axis=1), types.SimpleNamespace(events=[]), None
    monkeypatch.setattr(lesson04, "_run", run)
    assert not lesson04.check_global_mean(_numpy_mean)
    out = capsys.readouterr().out
    assert "NumPy's mean" in out and "lax.psum" in out, out
    assert "Spelled" not in out and "shape" not in out, out
