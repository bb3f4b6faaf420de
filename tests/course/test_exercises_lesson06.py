"""The checks of lesson 6's exercises: right answers pass, typical wrong ones get the right hint."""
import math

import numpy as np
import pytest

from simpmd import algorithms, cost
from simpmd.exercises import lesson06 as L
from verdicts import verdict


# -- the constants and closed forms, checked against simpmd itself ------------------------

def test_constants_match_the_h100_preset():
    hw = cost.HARDWARE["H100"]
    assert L.H100_ALPHA_S == hw.hop_latency
    assert L.H100_BANDWIDTH == hw.device_bandwidth
    assert L.H100_LINK == hw.link_bandwidth


def test_expected_values_worked_by_hand():
    assert L.ring_bytes_expected() == 1_050_000_000                     # 2 * 7/8 * 300e6 * 2
    assert math.isclose(L.ring_time_expected(), 14e-6 + 1.05e9 / 450e9)
    assert L.winners_expected() == {"1 KiB": "tree", "1 GiB": "ring"}
    assert math.isclose(L.crossover_expected(), 8e-6 * 450e9 / 4.25)


def test_closed_forms_agree_with_the_simulated_ring_and_the_cost_model():
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 comes with JAX's ml_dtypes")
    run = algorithms.ring_all_reduce(list(np.zeros((8, 3000), dtype=ml_dtypes.bfloat16)))
    assert set(run.bytes_sent) == {2 * 7 / 8 * 3000 * 2}
    n = L.N_PARAMS * L.BF16_BYTES
    assert math.isclose(cost.estimate("psum", n, 8, hardware="H100", algorithm="ring").time_s,
                        L.ring_time_expected())
    for label, size in L.SIZES.items():
        assert math.isclose(cost.estimate("psum", size, 8, hardware="H100", algorithm="tree").time_s,
                            L.tree_time_expected(size))
        fastest = cost.estimate("psum", size, 8, hardware="H100", algorithm="fastest")
        assert fastest.algorithm == L.winners_expected()[label]
    # The exercises are about the formulas: "fastest" picks among them (algorithm=None on
    # the H100 gives the fit to measurements instead, lesson 7 section 2).
    x = L.crossover_expected()
    assert cost.estimate("psum", 0.99 * x, 8, hardware="H100", algorithm="fastest").algorithm == "tree"
    assert cost.estimate("psum", 1.01 * x, 8, hardware="H100", algorithm="fastest").algorithm == "ring"


# -- exercise 1: bytes ---------------------------------------------------------------------

def test_ring_bytes_accepts(capsys):
    assert L.check_ring_bytes(2 * 7 / 8 * 300_000_000 * 2)
    assert L.check_ring_bytes(1_050_000_000)
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (None, "placeholder"),
    ("1.05e9", "one number"),
    (2.1e9, "4 bytes per value (float32)"),
    (5.25e8, "counts values, not bytes"),
    (5.25e8, "only one of the two phases"),
    (1.2e9, "(p-1)/p of the buffer, not all"),
    (6e8, "size of the gradient itself"),
    (8.4e9, "bits"),
    (1.05, "GB (10**9 bytes)"),
    (1.05e9 / 2**30, "GiB"),
    (1.05e9 * 1.1, "expected 1.05e+09"),
])
def test_ring_bytes_rejects_with_hint(capsys, answer, hint):
    assert not L.check_ring_bytes(answer)
    verdict(capsys, False, hint)


# -- exercise 2: time ----------------------------------------------------------------------

def test_ring_time_accepts(capsys):
    assert L.check_ring_time(2 * 7 * 1e-6 + 2 * 7 / 8 * 6e8 / 450e9)
    assert L.check_ring_time(cost.estimate("psum", 6e8, 8, hardware="H100", algorithm="ring").time_s)
    verdict(capsys, True, " s.")


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (2.347333, "milliseconds"),
    (2347.333, "microseconds"),
    (14e-6 + 2.1e9 / 450e9, "4 bytes per value (float32)"),
    (1.05e9 / 450e9, "only the bandwidth part"),
    (14e-6 + 1.05e9 / 25e9, "ONE NVLink"),
    (14e-6 + 1.05e9 / 900e9, "both directions"),
    (14e-6 + 6e8 / 450e9, "whole buffer once"),
    (1.0, "expected 0.00234733 s"),
])
def test_ring_time_rejects_with_hint(capsys, answer, hint):
    assert not L.check_ring_time(answer)
    verdict(capsys, False, hint)


# -- exercise 3: which algorithm wins ------------------------------------------------------

def test_winners_accepts(capsys):
    assert L.check_winners({"1 KiB": "tree", "1 GiB": "ring"})
    verdict(capsys, True, "1 KiB: tree", "1 GiB: ring")


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    ({"1 KiB": ..., "1 GiB": ...}, "still a placeholder"),
    (["tree", "ring"], "should be a dict"),
    ({"1 KiB": "tree"}, "no entry for '1 GiB'"),
    ({"1 KiB": "tree", "1 GiB": "bidirectional_ring"}, "choose 'ring' or 'tree'"),
    ({"1 KiB": "ring", "1 GiB": "tree"}, "both are swapped"),
    ({"1 KiB": "ring", "1 GiB": "ring"}, "latency-bound"),
    ({"1 KiB": "tree", "1 GiB": "tree"}, "bandwidth-bound"),
])
def test_winners_rejects_with_hint(capsys, answer, hint):
    assert not L.check_winners(answer)
    verdict(capsys, False, hint)


# -- exercise 4: the crossover -------------------------------------------------------------

def test_crossover_accepts(capsys):
    assert L.check_crossover(8e-6 * 450e9 / 4.25)
    assert L.check_crossover(847_059)
    verdict(capsys, True, "bytes")


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (847_059 / 1024, "KiB"),
    (847.059, "kB"),
    (0.847059, "MB"),
    (847_059 / 2, "bf16 values"),
    (3.6e6, "n = p alpha B"),
    (847_059 * 8, "bits"),
    (847_059 / 18, "ONE NVLink"),
    (1e6, "expected 847059 bytes"),
])
def test_crossover_rejects_with_hint(capsys, answer, hint):
    assert not L.check_crossover(answer)
    verdict(capsys, False, hint)
