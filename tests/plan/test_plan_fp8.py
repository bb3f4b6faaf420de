"""simpmd.plan's FP8 linear layers (Transformer Engine's, simpmd/plan/fp8.py): the casts round
as E4M3 forward and E5M2 backward, the gradients pass straight through them, a product of
FP8 copies runs on the chip's FP8 path and its cast kernel moves what TE's does, the
transposed copy lives as long as the GEMM that keeps it, and the planner casts only where
a run trained in FP8.

Expectations are worked by hand: values chosen so that their FP8 roundings are exact
(E4M3 keeps 3 mantissa bits, E5M2 2), byte counts from the shapes, rates from the preset.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import simpmd
from simpmd import plan
from simpmd.cost import hardware_preset
from simpmd.cost.memory import peak_memory
from simpmd.cost.predict import predict

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None,
                                reason="FP8 values need ml_dtypes (jaxlib's)")

S_ = simpmd.ShapeDtypeStruct
H100 = hardware_preset("H100")
TINY = plan.Transformer(layers=4, d_model=32, heads=4, kv_heads=2, d_ff=48, vocab=64, seq=16,
                        gated_mlp=True)


def _one_device(f, n):
    simpmd.set_device_count(1)
    return simpmd.shard_map(f, mesh=simpmd.make_mesh((1,), ("i",)), in_specs=(simpmd.P(),) * n,
                            out_specs=simpmd.P())


def test_a_cast_rounds_to_e4m3_keeps_the_transpose_and_records_the_amax():
    """0.3 = 1.2 x 2^-2 rounds to 1.25 x 2^-2 = 0.3125 (E4M3's mantissa steps are 1/8);
    0.1 = 1.6 x 2^-4 to 1.625 x 2^-4 = 0.1015625; -2 and 1 are exact. The amax is the
    largest magnitude, 2, held as its float32 bits."""
    from simpmd.plan import fp8
    x = np.array([[0.3, -2.0, 1.0], [0.1, 0.3, 1.0]], np.float32)
    q, qt, amax = _one_device(lambda x: fp8.cast(x, transpose=True), 1)(x)
    expected = np.array([[0.3125, -2.0, 1.0], [0.1015625, 0.3125, 1.0]])
    assert np.asarray(q).dtype.name == "float8_e4m3fn"
    np.testing.assert_array_equal(np.asarray(q).astype(np.float64), expected)
    np.testing.assert_array_equal(np.asarray(qt).astype(np.float64), expected.T)
    assert np.asarray(amax).astype(np.uint32).view(np.float32).item() == 2.0


def test_an_fp8_linear_layer_rounds_forward_and_backward_and_passes_gradients_through():
    """y = q4(x) @ q4(w), its cotangent rounded to E5M2 before both GEMMs: with x all 0.3
    (0.3125), w all 0.1 (0.1015625) and the cotangent all 0.2 (E5M2: 1.6 x 2^-3 rounds
    to 1.5 x 2^-3 = 0.1875), y = 8 x 0.3125 x 0.1015625, dw = 4 x 0.3125 x 0.1875 and
    dx = 6 x 0.1875 x 0.1015625 (the derivative of a rounding taken as 1)."""
    from simpmd.plan import fp8

    def loss(x, w, c):
        x8, x8t, _ = fp8.cast(x, transpose=True)
        w8, w8t, _ = fp8.cast(w, transpose=True)
        y = fp8.operand(x8, x8t, dtype="float32") @ fp8.operand(w8, w8t, like=w)
        y = fp8.grad_cast(y, transpose=True)
        return (y * c).sum(), y
    x, w, c = (np.full(s, v, np.float32) for s, v in (((4, 8), 0.3), ((8, 6), 0.1),
                                                       ((4, 6), 0.2)))
    (_, y), (dx, dw) = _one_device(simpmd.value_and_grad(loss, argnums=(0, 1), has_aux=True),
                                   3)(x, w, c)
    np.testing.assert_array_equal(np.asarray(y), np.full((4, 6), 8 * 0.3125 * 0.1015625))
    np.testing.assert_array_equal(np.asarray(dw), np.full((8, 6), 4 * 0.3125 * 0.1875))
    np.testing.assert_array_equal(np.asarray(dx), np.full((4, 8), 6 * 0.1875 * 0.1015625))


N = 4096


def _linear(own_kernel):
    from simpmd.plan import fp8

    def f(x, w8):                      # w8: a weight's FP8 copy, cast once a step
        x8, x8t, _ = fp8.cast(x, transpose=True, own_kernel=own_kernel)
        return fp8.operand(x8, x8t, dtype="bfloat16") @ fp8.operand(w8, dtype="bfloat16")
    return simpmd.make_jaxpr(f)(S_((N, N), "bfloat16"), S_((N, N), "float8_e4m3fn"))


def test_a_product_of_fp8_copies_runs_on_the_fp8_path_and_the_cast_moves_te_s_bytes():
    """TE's cast of a Linear's input in its own kernel reads the bf16 input (2 bytes an
    element), writes the FP8 copy and its transpose (1 byte each) and the 4-byte amax; the
    product reads both FP8 operands where they lie and runs at the FP8 rate: 2 N^3 over
    H100's sustained FP8 FLOP/s. The same product of bf16 values runs on the bf16 path."""
    p = predict(_linear(True), "H100")
    cast = next(k for k in p.kernels if k.kind == "opaque")
    assert cast.bytes == N * N * (2 + 1 + 1) + 4
    product = next(k for k in p.kernels if k.path)
    assert product.path == "fp8"
    assert product.compute_s == pytest.approx(2 * N ** 3 / H100.sustained_matmul_flops("fp8"))
    plain = predict(simpmd.make_jaxpr(lambda x, w: x @ w)(S_((N, N), "bfloat16"),
                                                           S_((N, N), "bfloat16")), "H100")
    assert [k.path for k in plain.kernels] == ["bf16"]


def test_the_transposed_copy_lives_as_long_as_the_gemm_that_keeps_it():
    """x (2 bytes an element) and w8 (1) live to the end; the cast writes x8, x8t (1 byte
    each) and the amax; the product, reading x8 and keeping x8t for the backward pass,
    adds y: at the product x, w8, x8, x8t and y are live, 2 + 1 + 1 + 1 + 2 bytes an
    element (the amax, which nothing reads, is not)."""
    peak = peak_memory(_linear(True), fused=True).peak
    assert peak == N * N * (2 + 1 + 1 + 1 + 2)


def _casts(program) -> int:
    """The FP8 casts of a program, each loop body and checkpoint counted once."""
    found = 0
    for e in program.eqns:
        found += e.primitive.name == "fp8_cast"
        for key in ("jaxpr", "call_jaxpr"):
            if key in e.params:
                found += _casts(getattr(e.params[key], "jaxpr", e.params[key]))
    return found


@pytest.mark.parametrize("precision, expected", [
    ("bf16", 0),
    # 4 weights cast once a step; forward, the 4 products' inputs; backward, the 4 products'
    # output gradients (the layers' scan body and its transpose, each counted once)
    ("fp8", 4 + 4 + 4)])
def test_the_planner_casts_only_where_a_run_trained_in_fp8(precision, expected):
    from simpmd.plan.simulate import trace_step
    program = trace_step(TINY, plan.Layout(global_batch=2), "H100", framework="megatron",
                         precision=precision)
    assert _casts(program) == expected


def test_the_published_fp8_runs_are_nemos_and_only_they():
    """NeMo 24.07's performance table is measured in FP8 (its 'Pretraining' heading);
    Korthikanti et al. trained in fp16 on A100, MaxText in bf16 on TPU v5p."""
    from simpmd.plan import published
    runs = published.runs()
    assert {r.name for r in runs if r.precision == "fp8"} == {
        r.name for r in runs if r.source == published.NEMO}
    assert sum(r.precision == "fp8" for r in runs) == 6
