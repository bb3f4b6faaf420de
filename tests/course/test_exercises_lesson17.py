"""The checks of lesson 17's exercises: right answers pass, typical wrong ones get the hint
that names what is off. Expectations are worked out here by hand."""
import pytest

from simpmd.exercises import lesson17 as ex
from verdicts import verdict

# LLaMA 3-8B's cache of one token, by hand: K and V, 32 layers, 8 K/V heads of 128, bf16
TOKEN_8B = 2 * 32 * 8 * 128 * 2                # 131072 bytes = 128 KiB
# 32 sequences of 8192 positions, the 8 K/V heads split over at most 8 of the 16 chips
CHIP_8B = TOKEN_8B * 8192 * 32 // 8            # 4 GiB
# LLaMA 3-70B (80 layers, 8 K/V heads of 128), 4096 tokens over 5e10 bytes/s
MOVE_70B = 2 * 80 * 8 * 128 * 2 * 4096 / 5e10  # 0.0268 s


def test_hand_worked_values():
    assert TOKEN_8B == 128 * 2**10
    assert CHIP_8B == 4 * 2**30
    assert MOVE_70B == pytest.approx(0.026843545)


def test_cache_per_token_right(capsys):
    assert ex.check_cache_per_token(TOKEN_8B)
    verdict(capsys, True, "131,072")


@pytest.mark.parametrize("answer, hint", [
    (TOKEN_8B * 4, "not the 32 query heads"),              # MHA's 32 heads
    (TOKEN_8B // 2, "a key AND a value"),                   # only K
    (TOKEN_8B * 2, "not 4"),                                # float32
    (TOKEN_8B // 32, "every one of the 32 layers"),         # one layer
    (TOKEN_8B / 2**10, "KiB"),                              # in KiB
    (..., "placeholder"),
])
def test_cache_per_token_wrong(answer, hint, capsys):
    assert not ex.check_cache_per_token(answer)
    verdict(capsys, False, hint)


def test_critical_batch_right(capsys):
    assert ex.check_critical_batch(9.9e14 / 3.35e12)
    verdict(capsys, True)
    assert ex.check_critical_batch(295.52)                  # within 0.1 %
    capsys.readouterr()


@pytest.mark.parametrize("answer, hint", [
    (3.35e12 / 9.9e14, "upside down"),
    (2 * 9.9e14 / 3.35e12, "the 2s cancel"),
    (9.9e14 / 3.35e12 / 2, "not B / 2"),
    (1.97e14 / 8.1e11, "TPU v5e"),
    (..., "placeholder"),
])
def test_critical_batch_wrong(answer, hint, capsys):
    assert not ex.check_critical_batch(answer)
    verdict(capsys, False, hint)


def test_cache_per_chip_right(capsys):
    assert ex.check_cache_per_chip(CHIP_8B)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (CHIP_8B // 2, "divide by 8, not 16"),                  # split 16 ways
    (CHIP_8B * 8, "min(16, 8) = 8"),                        # not split at all
    (CHIP_8B * 4, "not the 32 query heads"),
    (CHIP_8B / 2**30, "GiB"),
    (CHIP_8B // 32, "all 32 sequences"),
])
def test_cache_per_chip_wrong(answer, hint, capsys):
    assert not ex.check_cache_per_chip(answer)
    verdict(capsys, False, hint)


def test_cache_per_chip_when_the_heads_go_round():
    """With as many chips as K/V heads or fewer, the split is the chip count."""
    assert ex.check_cache_per_chip(TOKEN_8B * 8192 * 32 // 4, chips=4)
    assert not ex.check_cache_per_chip(TOKEN_8B * 8192 * 32 // 8, chips=4)


def test_move_seconds_right(capsys):
    assert ex.check_move_seconds(MOVE_70B)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (MOVE_70B * 8, "no factor of 8"),                       # gigabits
    (MOVE_70B * 8, "not the 64 query heads"),               # 64 heads = 8 x 8 as well
    (MOVE_70B * 1e9, "5e10, not 50"),
    (MOVE_70B / 4096, "4096 tokens"),
    (MOVE_70B * 2, "not 4"),
    (..., "placeholder"),
])
def test_move_seconds_wrong(answer, hint, capsys):
    assert not ex.check_move_seconds(answer)
    verdict(capsys, False, hint)
