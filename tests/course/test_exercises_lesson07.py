"""The checks of lesson 7's exercises: right answers pass, typical wrong ones get the right hint."""
import math

import numpy as np
import pytest

from simpmd import cost
from simpmd.exercises import lesson07 as L
from verdicts import verdict


# -- exercise 1: busbw from the H100 preset's fit ---------------------------------------------

def test_busbw_constants_match_the_h100_fit():
    fit = dict(cost.HARDWARE["H100"].measured)["all_reduce"]
    assert (L.H100_AR_LATENCY_S, L.H100_AR_BUSBW) == (fit.latency_s, fit.busbw)


def test_busbw_worked_by_hand_and_by_the_cost_model():
    bus_bytes = 2 * 7 / 8 * 2**26                        # 117,440,512 bytes
    t = 42e-6 + bus_bytes / 425e9                        # 318.33 us
    assert math.isclose(L.busbw_expected(), 2**26 / t * 1.75)
    assert 3.689e11 < L.busbw_expected() < 3.690e11
    assert math.isclose(cost.estimate("psum", 2**26, 8, hardware="H100").busbw, L.busbw_expected())


def test_busbw_accepts(capsys):
    assert L.check_busbw(3.689e11)
    assert L.check_busbw(2 * 7 / 8 * 2**26 / (42e-6 + 2 * 7 / 8 * 2**26 / 425e9))
    verdict(capsys, True, "bytes/s")


ALGBW = 2**26 / (42e-6 + 1.75 * 2**26 / 425e9)


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    ("368.9e9", "one number"),
    (ALGBW, "algbw = S / t"),
    (2 * ALGBW, "not 2"),
    (425e9, "leaves out the 42 us"),
    (1.75 * 2**26 / (42e-6 + 2**26 / 425e9), "bus bytes"),
    (1.75 * 64e6 / (42e-6 + 1.75 * 64e6 / 425e9), "not 64e6"),
    (368.926, "in GB"),                                  # GB/s for bytes/s
    (368.926e9 * 8, "bits"),
    (3e11, "expected 3.68926e+11 bytes/s"),
])
def test_busbw_rejects_with_hint(capsys, answer, hint):
    assert not L.check_busbw(answer)
    verdict(capsys, False, hint)


# -- exercise 2: the Scaling Book's gather ----------------------------------------------------

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


# -- exercise 3: the roofline's compute-bound batch ----------------------------------------

def test_compute_bound_batch_constants_and_value():
    hw = cost.HARDWARE["H100"]
    assert (L.H100_PEAK_BF16, L.H100_HBM) == (hw.peak_bf16_flops, hw.hbm_bandwidth)
    assert math.isclose(L.V5E_CRITICAL, cost.HARDWARE["TPU v5e"].critical_intensity)
    i = 9.9e14 / 3.35e12                                  # by hand: 295.52
    assert math.isclose(L.compute_bound_batch_expected(), i * 4096 ** 2 / (4096 ** 2 - 2 * 4096 * i))
    assert 345 < L.compute_bound_batch_expected() < 346


def test_compute_bound_batch_agrees_with_the_roofline():
    """The book's roofline of the matmul (peak rates, every operand once) flips from
    memory- to compute-bound between 345 and 346."""
    from types import SimpleNamespace as NS
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 comes with JAX's ml_dtypes")
    bf16 = np.dtype(ml_dtypes.bfloat16)

    def matmul(B):
        var = lambda *shape: NS(aval=NS(shape=shape, dtype=bf16))
        return [NS(primitive="dot_general", params={"dimension_numbers": (((1,), (0,)), ((), ()))},
                   invars=[var(B, 4096), var(4096, 4096)], outvars=[var(B, 4096)])]
    below, above = (cost.roofline_of(matmul(b), hardware="H100") for b in (345, 346))
    assert below.compute_s < below.memory_s and above.compute_s >= above.memory_s


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


def test_rms_norm_bytes_by_hand_and_by_the_fusion(jax8):
    """6RC + 8R + 4C by hand, and what simpmd's fusion of the lesson's RMSNorm moves."""
    from simpmd.cost.fusion import fuse
    from simpmd.jax.device_programs import find
    R, C = L.RMS_R, L.RMS_C
    assert L.rms_norm_bytes_expected() == 6 * R * C + 8 * R + 4 * C == 805_470_208
    fn, args = find("RMSNorm 16384x8192 bf16").at(1)
    program = jax8.make_jaxpr(fn)(*args)
    assert sum(k.bytes for k in fuse(program.jaxpr.eqns, program.jaxpr.outvars)) == \
        L.rms_norm_bytes_expected()


def test_rms_norm_bytes_accepts_and_names_mistakes(capsys):
    assert L.check_rms_norm_bytes(805_470_208)
    verdict(capsys, True, "bytes")
    R, C = L.RMS_R, L.RMS_C
    for wrong, words in ((3 * 2 * R * C, "small values"), (4 * R * C + 4 * C, "read twice"),
                         (805_470_208 * 8, "bits"), (805_470_208 / 2**20, "MiB")):
        assert not L.check_rms_norm_bytes(wrong)
        assert words in capsys.readouterr().out
    assert not L.check_rms_norm_bytes(...)
    assert "placeholder" in capsys.readouterr().out


def test_book_gather_is_given_a_shard_so_the_wrong_axis_differs():
    """The exercise gives each chip's shard (128 of 2,048 rows): over the 16-long axis the
    answer is V / 9e10; over the 8-long one it would be 4 or 7 shard-hops, not the same."""
    shard = 128 * 8192 * 2
    assert (L.E_Y * L.Y_SIZE, L.F) == (2048, 8192)
    assert math.isclose(L.book_gather_expected(), 16 * shard / 9e10)
    for hops in (4, 7):
        assert not math.isclose(hops * shard / 4.5e10, L.book_gather_expected(), rel_tol=0.07)


# -- the lesson's sentences, held to the code that computes their numbers ---------------------

def _lesson_text():
    """The markdown of lesson 7, its line breaks read as spaces."""
    import json
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / \
        "07_roofline_and_measured_collectives.ipynb"
    cells = json.loads(path.read_text())["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells
                    if c["cell_type"] == "markdown")


def _h200_rows(jax):
    from simpmd.jax import device_programs as dp
    rows = []
    for name, preset, measured, *_ in dp.RECORDED:
        if preset == "H200":
            fn, args = dp.find(name).at(1)
            r = cost.roofline_of(jax.make_jaxpr(fn)(*args), hardware=preset)
            rows.append((name, r, measured))
    return rows


def test_lesson_claims_about_the_h200_hold(jax8):
    """Sections 5's sentences: the geometric mean (said twice), the range of ratios, the
    fractions of the book's lower bound RMSNorm and attention took, and the bandwidth the
    unfused RMSNorm would have needed (issue 47, items 2, 3, 5)."""
    from simpmd.cost.fusion import fuse
    from simpmd.jax import device_programs as dp
    text = _lesson_text()
    rows = _h200_rows(jax8)
    ratios = [r.predicted_s / m for _, r, m in rows]
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios))
    assert math.isclose(gm, dp.geomean([dp.Row(n, r.predicted_s, m) for n, r, m in rows]))
    assert f"geometric mean is {gm:.2f}" in text and f"(geometric mean {gm:.2f})" in text
    assert f"within {min(ratios):.2f}–{max(ratios):.2f}" in text
    lower = {n: m / r.time_s[0] for n, r, m in rows}
    assert 0.30 < lower["RMSNorm 16384x8192 bf16"] < 0.37          # "a third"
    assert 0.23 < lower["attention 64 heads x 4096 x 128"] < 0.28   # "about a quarter"
    assert "RMSNorm took a third of its *lower* end and attention about a quarter" in text
    (_, norm, took), = [row for row in rows if row[0] == "RMSNorm 16384x8192 bf16"]
    fn, args = dp.find("RMSNorm 16384x8192 bf16").at(1)
    program = jax8.make_jaxpr(fn)(*args)
    fused = sum(k.bytes for k in fuse(program.jaxpr.eqns, program.jaxpr.outvars))
    peak = cost.HARDWARE["H200"].hbm_bandwidth
    assert f"{fused / 2**20:.0f} MiB at {fused / took / 1e12:.1f} TB/s" in text
    assert f"needed {norm.bytes / took / 1e12:.1f} TB/s, three times the peak" in text
    assert round(norm.bytes / took / peak) == 3


def test_lesson_marks_the_rates_no_measurement_gave():
    """Section 5's table says 'peak*' where a preset keeps its datasheet's peak, and the text
    names exactly those (issue 47, item 4)."""
    kept = {(name, what) for name in ("H100", "H200", "TPU v5e", "T4")
            for what, sustained, peak in (
                ("matmuls", cost.HARDWARE[name].sustained_matmul_flops("bf16"),
                 cost.HARDWARE[name].matmul_peak("bf16")),
                ("HBM bandwidth", cost.HARDWARE[name].sustained_hbm_bandwidth,
                 cost.HARDWARE[name].hbm_bandwidth)) if sustained == peak}
    assert kept == {("TPU v5e", "HBM bandwidth"), ("T4", "matmuls")}
    assert "the TPU v5e's HBM bandwidth, the T4's matmuls" in _lesson_text()


def test_lesson_cites_what_a_learner_can_look_up():
    """No 'issue 36' or 'earlier session': the measurements are docs/benchmarks.md's
    (issue 47, item 8)."""
    text = _lesson_text()
    assert "issue 36" not in text and "earlier session" not in text
    assert "2026-11-28" in text and "docs/benchmarks.md" in text
