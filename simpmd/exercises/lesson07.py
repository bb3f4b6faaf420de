"""Checks for the exercises of lesson 7 (the roofline, and what collectives measure).

Every expected value is worked out here by hand from the constants written below (the H100
preset's all-reduce fit, the TPU v5e's ICI links, the H100's peak FLOP/s and HBM
bandwidth), never with simpmd.cost or the lesson's reference solution;
tests/course/test_exercises_lesson07.py keeps the constants equal to the presets. A check names
the unit or factor that is off, and returns a Verdict (true or false), so that a reference
solution can ``assert`` it.
"""
from __future__ import annotations

from simpmd.course import check_against_mistakes

BF16_BYTES = 2
MIB = 2 ** 20


# Exercise 1 -------------------------------------------------------------------------------
# The H100 preset's fit to the published all-reduce measurements (cost.MeasuredFit, section
# 2 of the lesson): 42 us per call, plus nccl-tests' bus bytes over 425 GB/s.
H100_AR_LATENCY_S = 42e-6
H100_AR_BUSBW = 425e9           # bytes/s
BUSBW_P = 8
BUSBW_S = 64 * MIB              # nccl-tests' size: the all-reduce's buffer


def busbw_expected(size: float = BUSBW_S, p: int = BUSBW_P) -> float:
    """bus bytes = 2(p-1)/p S = 117,440,512; t = 42 us + bus bytes / 425 GB/s = 318.3 us;
    busbw = algbw x 2(p-1)/p = bus bytes / t = 3.689e11 bytes/s."""
    bus_bytes = 2 * (p - 1) / p * size
    return bus_bytes / (H100_AR_LATENCY_S + bus_bytes / H100_AR_BUSBW)


def _busbw_with(factor: float, latency: float = H100_AR_LATENCY_S) -> float:
    """busbw worked with a bus-bytes ``factor`` and a ``latency`` of the learner's: what a
    slip in either gives."""
    bus_bytes = factor * BUSBW_S
    return bus_bytes / (latency + bus_bytes / H100_AR_BUSBW)


def check_busbw(answer) -> bool:
    """Exercise 1: the busbw, in bytes/s, nccl-tests would report for a 64 MiB all-reduce
    on 8 H100s if the preset's fit held."""
    s, p = BUSBW_S, BUSBW_P
    factor = 2 * (p - 1) / p
    expected = busbw_expected()
    t = s * factor / expected
    mistakes = [
        (s / t, f"that is algbw = S / t; busbw multiplies it by 2(p-1)/p = {factor:g}"),
        (2 * s / t, f"the factor is 2(p-1)/p = {factor:g} for p = {p}, not 2"),
        (H100_AR_BUSBW, "that leaves out the 42 us every call pays: at 64 MiB the latency is "
                        "an eighth of the time, so busbw stays below the fit's 425 GB/s"),
        (factor * s / (H100_AR_LATENCY_S + s / H100_AR_BUSBW),
         f"the transfer moves nccl-tests' bus bytes, 2(p-1)/p x S = {factor:g} S, not S"),
        (busbw_expected(64e6), "64 MiB is 2**26 = 67,108,864 bytes, not 64e6"),
        (expected / 2, f"(p-1)/p = {(p - 1) / p:g} is the factor of an all-gather or a "
                       f"reduce-scatter; an all-reduce is both, so its busbw is algbw x "
                       f"2(p-1)/p = {factor:g}"),
        (_busbw_with((p - 1) / p), f"that uses an all-gather's (p-1)/p = {(p - 1) / p:g} for the "
                                   f"bus bytes; an all-reduce moves 2(p-1)/p x S = {factor:g} S"),
        (_busbw_with(factor, latency=H100_AR_LATENCY_S * 1e3),
         "that takes the 42 us latency as 42 ms (0.042 s); a microsecond is 1e-6 s"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="busbw", unit="bytes/s",
                                  rtol=1e-3)


# Exercise 2 -------------------------------------------------------------------------------
# The Scaling Book's own terms: a TPU v5e 8x16 slice, mesh {'X': 8, 'Y': 16}, AllGather_Y
# of bf16[E_Y, F], each chip holding E_Y = 128 rows of F = 8192 (so E = 2048). The shard is
# given, not the whole array, so that gathering over the wrong axis (X, 8 chips) gives a
# different number. The numbers, written out here (simpmd.cost's TPU v5e preset holds the
# same, with its source): ICI 4.5e10 bytes/s one way per link ("How to Scale Your Model",
# Part 2, table of ICI bandwidths), 1 us per hop (Part 3, "A note on ICI latency"); the
# 16-long axis of a v5e has its wraparound link, the 8-long one does not (Part 2).
E_Y, F = 128, 8192
V5E_LINK = 4.5e10               # bytes/s, one ICI link, one direction
V5E_ALPHA_S = 1e-6
X_SIZE, Y_SIZE = 8, 16
E = E_Y * Y_SIZE


def book_gather_expected() -> float:
    """Both ways round: 16/2 = 8 hops, each carrying one shard (2 MiB) per link direction,
    each far above 1 us, so T = 8 x 2 MiB / 4.5e10 = V / 9e10 = 372.8 us."""
    shard = E_Y * F * BF16_BYTES
    return Y_SIZE // 2 * max(V5E_ALPHA_S, shard / V5E_LINK)


def check_book_gather(answer) -> bool:
    """Exercise 2: seconds for AllGather_Y([E_Y, F]) -> [E, F] on a v5e 8x16."""
    shard = E_Y * F * BF16_BYTES
    v = shard * Y_SIZE
    expected = book_gather_expected()
    mistakes = [
        (expected * 1e3, "that is milliseconds: the question asks for seconds"),
        (expected * 1e6, "that is microseconds: the question asks for seconds"),
        ((Y_SIZE - 1) * shard / V5E_LINK,
         "that sends one way round only (15 hops); the 16-long axis of a v5e wraps, so each "
         "shard goes both ways at once and arrives in 8 hops"),
        (v / V5E_LINK, "that puts the whole array through one link direction; both ways "
                       "round, each direction carries half of it"),
        (v / (2 * 2 * V5E_LINK), "9e10 bytes/s is already both directions of a link "
                                 "together; do not double it again"),
        (2 * expected, "that counts 4 bytes per value (float32); the array is bf16, 2 bytes"),
        (expected * 8, "that is bits: 1 byte is 8 bits"),
        (shard / V5E_LINK, "that is one hop; the shards need 8 hops to reach everyone"),
        (X_SIZE // 2 * shard / V5E_LINK,
         "that gathers over X, the axis of 8 chips, as if it wrapped: the array is sharded "
         "over Y, so its 16 shards travel the 16-long axis"),
        ((X_SIZE - 1) * shard / V5E_LINK,
         "that is a line of 8 chips, the X axis (7 hops one way): the array is sharded over "
         "Y, the 16-long axis, which wraps"),
        (Y_SIZE // 2 * shard / Y_SIZE / V5E_LINK,
         "that takes the shard for the whole array: each of the 16 chips holds 128 of its "
         "2,048 rows, and each hop carries one whole shard"),
    ]
    # 7%: the book's V / W_bidi, or the same with 8 us of latency added, or with the
    # (N-1)/N = 15/16 factor that a balanced ring saves, all pass.
    return check_against_mistakes(answer, expected, mistakes, what="the time of the gather",
                                  unit="s", rtol=0.07)


# Exercise 3 -------------------------------------------------------------------------------
# The roofline of one bf16 matmul [B, D] x [D, F] on an H100 (the preset's numbers, cited
# in simpmd.cost.HARDWARE["H100"]; tests keep them equal to the preset).

H100_PEAK_BF16 = 9.9e14         # FLOP/s, dense
H100_HBM = 3.35e12              # bytes/s
MM_D = MM_F = 4096
V5E_CRITICAL = 1.97e14 / 8.1e11


# What the H100 preset says large matmuls and streaming kernels sustain (lesson 7, section
# 5: S. Bekman's matmul table, 80.3%; a streaming kernel, 86.7%): a learner who read that
# section may use them where the exercise asks for the peaks.
H100_SUSTAINED_INTENSITY = H100_PEAK_BF16 * 0.803 / (H100_HBM * 0.867)


def _batch_at(i: float, d: int, f: int) -> float:
    """B = I D F / (D F - I (D + F)): where 2BDF / C = 2(BD + DF + BF) / W, for I = C / W."""
    return i * d * f / (d * f - i * (d + f))


def compute_bound_batch_expected(d: int = MM_D, f: int = MM_F) -> float:
    """The B where 2BDF / peak = 2(BD + DF + BF) / HBM bandwidth, solved by hand:
    B = I D F / (D F - I (D + F)) with I = peak / bandwidth (about 345.4 here)."""
    return _batch_at(H100_PEAK_BF16 / H100_HBM, d, f)


def check_compute_bound_batch(answer) -> bool:
    """Exercise 3: the smallest batch B at which the bf16 matmul is compute-bound on an H100."""
    expected = compute_bound_batch_expected()
    i = H100_PEAK_BF16 / H100_HBM
    d, f = MM_D, MM_F
    mistakes = [
        (i, "that is the critical intensity itself, the rule of thumb for B much smaller than "
            "D and F; here D = F = 4096 is only 14 times larger, so the bytes of X[B, D] and "
            "Z[B, F] count too: solve 2BDF / peak = 2(BD + DF + BF) / bandwidth for B"),
        (V5E_CRITICAL, "that is the TPU v5e's critical intensity; this exercise is on the H100"),
        (2 * i * d * f / (d * f - 2 * i * (d + f)),
         "that counts BDF FLOPs or 4 bytes per value: a multiply-add is 2 FLOPs, and bf16 "
         "has 2 bytes per value"),
        (i * d * f / (d * f - i * d), "that leaves out the bytes of one operand; a matmul reads "
                                      "X and W and writes Z"),
        (_batch_at(H100_SUSTAINED_INTENSITY, d, f),
         "that uses the sustained rates (80.3% of the matmul peak, 86.7% of the HBM "
         "bandwidth); the roofline of the book, and this exercise, use the peaks C and W"),
    ]
    # within one row of the exact solution: 345 and 346 both pass
    return check_against_mistakes(answer, expected, mistakes, what="the batch size",
                                  unit="rows", rtol=1.0 / expected)


# Exercise 4 -------------------------------------------------------------------------------
# RMSNorm of x[R, C] (bfloat16) with a float32 weight w[C], run by XLA as two kernels
# (section 5): one reads x and writes one float32 per row; the other reads x, those
# values and w, and writes the bfloat16 result.

RMS_R, RMS_C = 16384, 8192
F32_BYTES = 4


def rms_norm_bytes_expected(r: int = RMS_R, c: int = RMS_C) -> int:
    """First kernel: 2RC read + 4R written; second: 2RC + 4R + 4C read, 2RC written.
    6RC + 8R + 4C = 805,470,208 bytes."""
    first = BF16_BYTES * r * c + F32_BYTES * r
    second = BF16_BYTES * r * c + F32_BYTES * r + F32_BYTES * c + BF16_BYTES * r * c
    return first + second


def check_rms_norm_bytes(answer) -> bool:
    """Exercise 4: the bytes the two fused kernels of RMSNorm read and write together."""
    r, c = RMS_R, RMS_C
    expected = rms_norm_bytes_expected()
    x = BF16_BYTES * r * c
    mistakes = [
        (3 * x, "that counts x's three passes (read, read, write) but not the small values: "
                "the first kernel writes one float32 per row, the second reads them and w"),
        (2 * x + F32_BYTES * c, "that is one kernel reading x once and writing once; XLA "
                                "needs every row's mean square before it can scale the row, "
                                "so x is read twice"),
        (3 * F32_BYTES * r * c + 2 * F32_BYTES * r + F32_BYTES * c,
         "that counts x at 4 bytes per value: it is stored in bfloat16 (2 bytes); the float32 "
         "copy lives only inside the kernels"),
        (expected * 8, "that is bits: 1 byte is 8 bits"),
        (expected / 2**20, "that is MiB: the question asks for bytes"),
        (expected - F32_BYTES * c, "that leaves out w: the second kernel reads the float32 "
                                   "weight, 4C bytes"),
        (expected - F32_BYTES * r, "that counts the R float32 row values once; the first kernel "
                                   "writes them and the second reads them back, 4R bytes each way"),
        (expected - F32_BYTES * (r + c), "that leaves out w (4C bytes, read by the second kernel) "
                                         "and one pass over the row values (4R: written by the "
                                         "first kernel, read by the second)"),
        (expected - 2 * F32_BYTES * r, "that leaves out the R float32 row values: the first "
                                       "kernel writes them (4R bytes) and the second reads them (4R)"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the fused bytes",
                                  unit="bytes", rtol=1e-6)
