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
    # the H100 gives the fit to measurements instead, lesson 6 section 7).
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


# -- exercise 5: the Scaling Book's gather ----------------------------------------------------

def test_book_gather_constants_and_value():
    hw = cost.HARDWARE["TPU v5e"]
    assert (L.V5E_LINK, L.V5E_ALPHA_S) == (hw.link_bandwidth, hw.hop_latency)
    # V = 2048 * 8192 * 2 = 33,554,432 bytes over W_bidi = 9e10 bytes/s
    assert math.isclose(L.book_gather_expected(), 33_554_432 / 9e10)
    e = cost.estimate("all_gather", array_nbytes=2 * 2048 * 8192, hardware="v5e",
                      mesh={"X": 8, "Y": 16}, axis_name="Y")
    assert math.isclose(e.time_s, L.book_gather_expected())


def test_book_gather_accepts(capsys):
    assert L.check_book_gather(33_554_432 / 9e10)
    assert L.check_book_gather(33_554_432 / 9e10 + 8e-6)           # latency added
    assert L.check_book_gather(15 / 16 * 33_554_432 / 9e10)        # the (N-1)/N factor
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (0.3728, "milliseconds"),
    (372.8, "microseconds"),
    (15 * 2_097_152 / 4.5e10, "one way round only"),
    (33_554_432 / 4.5e10, "whole array through one link direction"),
    (33_554_432 / 1.8e11, "already both directions"),
    (2 * 33_554_432 / 9e10, "float32"),
    (2_097_152 / 4.5e10, "one hop"),
])
def test_book_gather_rejects_with_hint(capsys, answer, hint):
    assert not L.check_book_gather(answer)
    verdict(capsys, False, hint)


# -- exercise 6: the roofline's compute-bound batch ----------------------------------------

def test_compute_bound_batch_constants_and_value():
    hw = cost.HARDWARE["H100"]
    assert (L.H100_PEAK_BF16, L.H100_HBM) == (hw.peak_bf16_flops, hw.hbm_bandwidth)
    assert math.isclose(L.V5E_CRITICAL, cost.HARDWARE["TPU v5e"].critical_intensity)
    i = 9.9e14 / 3.35e12                                  # by hand: 295.52
    assert math.isclose(L.compute_bound_batch_expected(), i * 4096 ** 2 / (4096 ** 2 - 2 * 4096 * i))
    assert 345 < L.compute_bound_batch_expected() < 346


def test_compute_bound_batch_agrees_with_the_roofline():
    """The roofline of the matmul flips from memory- to compute-bound between 345 and 346."""
    from types import SimpleNamespace as NS
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 comes with JAX's ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def matmul(B):
        var = lambda *shape: NS(aval=NS(shape=shape, dtype=bf16))
        return [NS(primitive="dot_general", params={"dimension_numbers": (((1,), (0,)), ((), ()))},
                   invars=[var(B, 4096), var(4096, 4096)], outvars=[var(B, 4096)])]
    assert cost.roofline_of(matmul(345), hardware="H100").bound == "memory"
    assert cost.roofline_of(matmul(346), hardware="H100").bound == "compute"


def test_compute_bound_batch_accepts(capsys):
    assert L.check_compute_bound_batch(346)
    assert L.check_compute_bound_batch(345.4)
    verdict(capsys, True, "rows")


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    (296, "critical intensity itself"),
    (243, "TPU v5e"),
    (831, "multiply-add is 2 FLOPs"),
    ("346", "one number"),
    (1000, "expected"),
])
def test_compute_bound_batch_rejects_with_hint(capsys, answer, hint):
    assert not L.check_compute_bound_batch(answer)
    verdict(capsys, False, hint)
