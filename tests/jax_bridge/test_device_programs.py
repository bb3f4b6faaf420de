"""simpmd.jax.device_programs.measure_cpu: a CPU preset from rates measured with jax.jit.

The timer is replaced by one whose answers are known (each probe takes the cost of a call
plus its work at a chosen rate), so the preset's rates must come out as those rates: the
FLOPs of each probe are counted by hand here, not read from simpmd.
"""
import pytest

pytest.importorskip("jax")

from simpmd.jax import device_programs as dp  # noqa: E402

CALL = 7e-6                                       # s, a call's cost
F32, BF16, BYTES, VECTOR = 80e9, 40e9, 20e9, 50e9   # the rates the fake timer runs at


def _fake_time_on(fn, args, device, repeats=10):
    shapes = [(tuple(a.shape), str(a.dtype)) for a in args]
    if shapes == [((8,), "float32")]:
        return CALL
    if len(shapes) == 2:                              # an n x n matmul: 2 n^3 FLOPs
        n = shapes[0][0][0]
        return CALL + 2 * n**3 / (F32 if shapes[0][1] == "float32" else BF16)
    (count,), dtype = shapes[0]
    if count == 2**16:                                # the polynomial: 8 x (mul, add)
        return CALL + 16 * count / VECTOR
    return CALL + 4 * count / BYTES                   # the maximum reads every byte once


def test_the_measured_preset_has_the_rates_its_probes_ran_at(monkeypatch):
    monkeypatch.setattr(dp, "time_on", _fake_time_on)
    hw = dp.measure_cpu(n=256, stream_bytes=2**20)
    assert hw.dispatch_s == pytest.approx(CALL)
    assert hw.peak_fp32_flops == pytest.approx(F32)
    assert hw.peak_bf16_flops == pytest.approx(BF16)
    assert hw.hbm_bandwidth == pytest.approx(BYTES)
    assert hw.sustained_hbm_bandwidth == pytest.approx(BYTES)      # no fraction on top
    assert hw.vector_flops == pytest.approx(VECTOR)                # not the matmul rate
    assert hw.sustained_matmul_flops("fp32") == pytest.approx(F32)
    assert hw.platform == "cpu" and "measure_cpu" in hw.citations[0]


def test_a_streaming_program_is_predicted_from_the_measured_bandwidth(monkeypatch):
    """2x+1 over 2^20 bf16 values reads and writes 4 MiB: at 20 GB/s, 210 us, plus the call
    (its 2^21 FLOPs take 42 us at 50 GFLOP/s, so it waits on memory); at a tenth of that
    elementwise rate the same program waits on its arithmetic instead."""
    import jax
    import jax.numpy as jnp
    monkeypatch.setattr(dp, "time_on", _fake_time_on)
    hw = dp.measure_cpu(n=256, stream_bytes=2**20)
    x = jax.ShapeDtypeStruct((2**20,), jnp.bfloat16)
    predicted = dp.predict(lambda v: 2 * v + 1, (x,), hw).time_s
    assert predicted == pytest.approx(2 * 2 * 2**20 / BYTES + CALL, rel=0.02)
    slow = dp.replace(hw, elementwise_flops=VECTOR / 10)
    assert dp.predict(lambda v: 2 * v + 1, (x,), slow).time_s == pytest.approx(
        2 * 2**20 / (VECTOR / 10) + CALL, rel=0.02)
