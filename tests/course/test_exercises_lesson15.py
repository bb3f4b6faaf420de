"""The checks of lesson 15's exercises: right answers pass, each named wrong answer gets its
own hint, and hundreds of plausible wrong numbers get readable verdicts. Expectations are
worked out here by hand from the numbers the exercises give (a config, the chip's peak,
NeMo's schedule)."""
import importlib.util
import math

import pytest

from simpmd.exercises import lesson15 as ex
from test_checker_sweep import assert_readable, wrong_answers
from verdicts import verdict

# The planner's steps are in bfloat16, which ml_dtypes (jaxlib's) brings: without JAX the
# exercises that run the planner are skipped, as tests/plan/test_plan.py's are.
needs_bf16 = pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None,
                                reason="the planner's steps are in bfloat16 (ml_dtypes)")


# -- exercise 1: LLaMA 3-8B ---------------------------------------------------------------------

# By hand from config.json: attention 2*4096*4096 + 2*4096*1024 per layer, MLP 3*4096*14336,
# norms 2*4096; 32 layers; embeddings 2*128256*4096; a final norm of 4096.
EIGHT_B = 32 * (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096) \
    + 2 * 128256 * 4096 + 4096


def test_the_8b_count_is_8_billion():
    assert EIGHT_B == 8_030_261_248                       # the model card's "8B"


@pytest.mark.parametrize("answer", [EIGHT_B, EIGHT_B - 65 * 4096, 8.03e9])
def test_the_count_passes_with_or_without_the_norms(capsys, answer):
    assert ex.check_param_count(answer)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (EIGHT_B + 32 * 2 * 4096 * (4096 - 1024), "grouped-query attention"),
    (EIGHT_B - 128256 * 4096, "one embedding matrix"),
    (EIGHT_B - 32 * 4096 * 14336, "three"),
    (EIGHT_B - 2 * 128256 * 4096, "both vocabulary matrices"),
    (EIGHT_B - 32 * 4096 * 14336 - 128256 * 4096, "one embedding matrix"),   # two slips
])
def test_count_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_param_count(answer)
    verdict(capsys, False, hint)


def test_count_placeholder_says_not_yet(capsys):
    assert not ex.check_param_count(...)
    verdict(capsys, False, "placeholder")


# -- exercise 2: bytes per chip between steps ----------------------------------------------------

P70 = 70_553_706_496
NORMS = (2 * 80 + 1) * 8192                  # two norms per layer and the final one
RIGHT_2 = 14 * ((P70 - NORMS) / 4096 + NORMS)


def test_fourteen_bytes_per_parameter_over_a_slice_norms_whole(capsys):
    assert ex.check_state_per_chip(RIGHT_2, P70, NORMS)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (10 * ((P70 - NORMS) / 4096 + NORMS), "master copy"),            # the book's 10 bytes
    (16 * ((P70 - NORMS) / 4096 + NORMS), "gradients' 2 bytes"),
    (18 * ((P70 - NORMS) / 4096 + NORMS), "float32 gradients"),
    (12 * ((P70 - NORMS) / 4096 + NORMS), "leaves out the bf16 weights"),
    (2 * ((P70 - NORMS) / 4096 + NORMS), "bf16 weights alone"),
    (14 * ((P70 - NORMS) / 8192 + NORMS), "each of the two slices holds a whole copy"),
    (14 * ((P70 - NORMS) / 1024 + NORMS), "FSDP axis only"),
    (14 * P70, "whole model"),
    (14 * P70 / 4096, "splits the norms' scales too"),               # the 99.3 MB reading
    (14 * ((70.4e9 - NORMS) / 4096 + NORMS), "rounded 70.4e9"),
    (14 * 70.4e9 / 4096, "rounded 70.4e9"),                          # and norms split: two
    (RIGHT_2 / 2**20, "MiB"),
])
def test_state_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_state_per_chip(answer, P70, NORMS)
    verdict(capsys, False, hint)


# -- exercise 3: days ------------------------------------------------------------------------

PER_TOKEN = 6 * P70 + 12 * 80 * 64 * 128 * 2048      # PaLM's count at 2,048-token pieces
RIGHT_3 = 15e12 * PER_TOKEN / (8960 * 4.59e14 * 0.4) / 86400


def test_the_books_44_days(capsys):
    """The Scaling Book: 6 x 70e9 FLOPs per token, 15e12 tokens, 8960 chips at 4.59e14 and
    40% MFU: 3.8e6 s, 'about 44 days'."""
    days = 15e12 * 6 * 70e9 / (8960 * 4.59e14 * 0.4) / 86400
    assert days == pytest.approx(44, abs=0.5)
    assert ex.check_training_days(days, 6 * 70e9)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (RIGHT_3 * 0.4, "40% MFU"), (RIGHT_3 * 86400, "seconds"), (RIGHT_3 * 24, "hours"),
    (RIGHT_3 * 8960, "one chip"),
    (15e12 * 6 * P70 / (8960 * 4.59e14 * 0.4) / 86400, "6 x the parameters"),     # 44.6
    (RIGHT_3 * 8960 / 8192, "8,192 chips"),                                          # 50.7
])
def test_days_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_training_days(answer, PER_TOKEN, P70)
    verdict(capsys, False, hint)


# -- exercise 4: NeMo's bubble ------------------------------------------------------------------

def test_the_interleaved_bubble(capsys):
    """64 GPUs in replicas of TP 4 x PP 4 = 16: 4 replicas, 128 / 4 = 32 micro-batches each,
    32 x 20 + 3 ticks of which 3 are idle."""
    assert ex.check_bubble(3 / 643)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (3 / (128 * 20 + 3), "all 128 micro-batches through one replica"),
    (3 / (2 * 20 + 3), "all 64 GPUs"),
    (3 / (32 * 80 + 3), "v = 80 counts the layers"),
    (3 / (32 + 3), "GPipe's bubble"),
    (3 / 640, "over the useful ticks"),
    (3 / (128 * 80 + 3), "v = 80"),                                  # two slips
])
def test_bubble_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_bubble(answer)
    verdict(capsys, False, hint)


def test_bubble_placeholder_asks_for_a_fraction(capsys):
    assert not ex.check_bubble(None)
    verdict(capsys, False, "fraction between 0 and 1")


# -- every checker, many wrong numbers ---------------------------------------------------------

CHECKS = {
    "param_count": (ex.check_param_count, EIGHT_B),
    "state_per_chip": (lambda a: ex.check_state_per_chip(a, P70, NORMS), RIGHT_2),
    "training_days": (lambda a: ex.check_training_days(a, PER_TOKEN, P70), RIGHT_3),
    "bubble": (ex.check_bubble, 3 / 643),
}


@pytest.mark.parametrize("name", sorted(CHECKS))
def test_plausible_wrong_numbers_get_readable_hints(name, capsys):
    checker, right = CHECKS[name]
    for answer in wrong_answers(right):
        if checker(answer):
            assert math.isclose(answer, right, rel_tol=0.01), answer     # the days: 1 %
            capsys.readouterr()
            continue
        out = capsys.readouterr().out
        assert out.startswith("Not yet: "), (answer, out)
        assert_readable(out)


# -- exercises 5 to 7: the planner itself ------------------------------------------------------

def _model(seq=2048):
    from dataclasses import replace
    from simpmd import plan
    return replace(plan.LLAMA3_70B, seq=seq)


def _layout(**axes):
    from simpmd import plan
    return plan.Layout(**{**dict(dp=2, fsdp=1024, tp=4, global_batch=2048, recompute="selective",
                                 sequence_parallel=True), **axes})


@needs_bf16
def test_budget_exercise_the_fastest_layout_that_fits_is_full_recomputation_at_tp4(capsys):
    """Exercise 5 and its solution's text: under 8 GB, tp=4 with full recomputation beats
    every other of the six layouts that fits (selective at tp=4 does not fit)."""
    from simpmd import plan
    model = _model()
    options = [_layout(fsdp=4096 // tp, tp=tp, recompute=r) for tp in (4, 8)
               for r in ("none", "selective", "full")]
    results = plan.sweep(model, options, hardware="TPU v5p", slices=2, check_memory=False)
    fits = {(o.tp, o.recompute): r.step_s for o, r in zip(options, results) if r.peak_bytes <= 8e9}
    assert (4, "selective") not in fits and min(fits, key=fits.get) == (4, "full")
    assert ex.check_layout_under_budget(_layout(recompute="full"), model)
    assert "the fastest" in capsys.readouterr().out


@needs_bf16
@pytest.mark.parametrize("layout, words", [
    (..., "placeholder"), ("tp=4", "plan.Layout"),
    (dict(recompute="selective"), "over the 8 GB budget"),
    (dict(fsdp=512, tp=8, recompute="selective"), "tp=4 with recompute='full' also fits"),
    (dict(fsdp=512, recompute="full"), "4,096 chips"),
    (dict(global_batch=1024, recompute="full"), "2,048 sequences of 2,048 tokens")])
def test_budget_exercise_says_what_is_off(capsys, layout, words):
    answer = _layout(**layout) if isinstance(layout, dict) else layout
    assert not ex.check_layout_under_budget(answer, _model())
    out = capsys.readouterr().out
    assert out.startswith("Not yet: ") and words in out, out


@needs_bf16
def test_context_parallel_exercise(capsys):
    """512 sequences of 8,192 tokens: 256 FSDP ranks per slice, cp = 8192 / (2 x 256 x 4) = 4."""
    long = _model(8192)
    assert ex.check_context_parallel(_layout(fsdp=256, cp=4, global_batch=512), long)
    assert "cp=4" in capsys.readouterr().out
    for layout, words in ((_layout(global_batch=512), "only 512 sequences"),
                          (_layout(), "512 sequences of 8,192 tokens"),
                          (_layout(fsdp=256, global_batch=512), "2,048 chips")):
        assert not ex.check_context_parallel(layout, long)
        assert words in capsys.readouterr().out
    assert not ex.check_context_parallel(_layout(fsdp=256, cp=4, global_batch=512), _model())
    assert "8,192 tokens" in capsys.readouterr().out


def test_run_cost_by_hand(capsys):
    """15e12 tokens / 4,194,304 a step = 3,576,279 steps; at 0.9 s a step on 8,192 chips,
    7.3 million chip-hours at $4.2."""
    steps = 15e12 / (2048 * 2048)
    right = steps * 0.9 / 3600 * 8192 * 4.2
    assert 3.0e7 < right < 3.2e7
    assert ex.check_run_cost(right, 0.9)
    for wrong, words in ((right / 8192, "one chip"), (right * 3600, "3,600"),
                         (right * 1.2 / 4.2, "v5e"), (right * 8960 / 8192, "8,960"),
                         (right * 2048, "2,048 sequences of 2,048 tokens")):
        assert not ex.check_run_cost(wrong, 0.9)
        assert words in capsys.readouterr().out
