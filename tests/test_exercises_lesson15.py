"""The checks of lesson 15's exercises: right answers pass, typical wrong ones get the hint
that names what is off. Expectations are worked out here by hand from the numbers the
exercises give (a config, the chip's peak, NeMo's schedule)."""
import pytest

from simpmd.exercises import lesson15 as ex
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
])
def test_count_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_param_count(answer)
    verdict(capsys, False, hint)


def test_count_placeholder_says_not_yet(capsys):
    assert not ex.check_param_count(...)
    verdict(capsys, False, "placeholder")


# -- exercise 2: bytes per chip ------------------------------------------------------------

P70 = 70_553_706_496


def test_ten_bytes_per_parameter_over_every_chip(capsys):
    assert ex.check_memory_per_chip(P70 * 10 / 8192, P70)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (P70 * 2 / 8192, "weights alone"),
    (P70 * 12 / 8192, "float32"),
    (P70 * 10, "whole model"),
    (P70 * 10 / 2048, "'tp' too"),
    (P70 * 10 / 8192 / 2**20, "MiB"),
])
def test_memory_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_memory_per_chip(answer, P70)
    verdict(capsys, False, hint)


# -- exercise 3: days ------------------------------------------------------------------------

def test_the_books_44_days(capsys):
    """The Scaling Book: 6 x 70e9 FLOPs per token, 15e12 tokens, 8960 chips at 4.59e14 and
    40% MFU: 3.8e6 s, 'about 44 days'."""
    days = 15e12 * 6 * 70e9 / (8960 * 4.59e14 * 0.4) / 86400
    assert days == pytest.approx(44, abs=0.5)
    assert ex.check_training_days(days, 6 * 70e9)
    verdict(capsys, True)


@pytest.mark.parametrize("factor, hint", [(0.4, "40% MFU"), (86400, "seconds"), (24, "hours"),
                                          (8960, "one chip")])
def test_days_mistakes_are_named(capsys, factor, hint):
    days = 15e12 * 4.3e11 / (8960 * 4.59e14 * 0.4) / 86400
    assert not ex.check_training_days(days * factor, 4.3e11)
    verdict(capsys, False, hint)


# -- exercise 4: NeMo's schedule ----------------------------------------------------------------

def test_tokens_per_second_with_the_interleaved_bubble(capsys):
    """64 GPUs in replicas of TP 4 x PP 4 = 16: 4 replicas, 128 / 4 = 32 micro-batches each,
    bubble 3 / (32 x 20) = 3/640; a micro-batch of 4096 tokens every 0.1 s per stage."""
    assert ex.check_h100_tokens(4096 * (1 - 3 / 640) / (0.1 * 16), 0.1)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (4096 / (0.1 * 16), "bubble"),
    (4096 * (1 - 3 / 35) / (0.1 * 16), "GPipe"),
    (4096 * (1 - 3 / 640) / 0.1, "16 GPUs"),
    (4096 * (1 - 3 / 640) / (0.1 * 4), "TP group only"),
    (4096 * (1 - 3 / 640) / (0.1 * 64), "all 64"),
])
def test_tokens_mistakes_are_named(capsys, answer, hint):
    assert not ex.check_h100_tokens(answer, 0.1)
    verdict(capsys, False, hint)
