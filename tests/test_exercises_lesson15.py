"""The checks of lesson 15's exercises: right answers pass, each named wrong answer gets its
own hint, and hundreds of plausible wrong numbers get readable verdicts. Expectations are
worked out here by hand from the numbers the exercises give (a config, the chip's peak,
NeMo's schedule)."""
import math

import pytest

from simpmd.exercises import lesson15 as ex
from test_checker_sweep import assert_readable, wrong_answers
from verdicts import verdict


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
