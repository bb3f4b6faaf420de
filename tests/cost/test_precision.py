"""Which path of the matrix units a dot runs on (simpmd.cost.precision), from what real
JAX writes into the jaxpr: its operand types, precision and preferred_element_type."""
import pytest

from simpmd import cost as C
from simpmd.cost.precision import dot_path


def test_float32_as_xla_runs_it():
    """jax.lax.Precision's docstring: on TPU DEFAULT is one bf16 pass, HIGH three, HIGHEST
    six; on GPU DEFAULT and HIGH use TF32 where the chip has it, HIGHEST float32."""
    h100, t4, v5e = (C.HARDWARE[n] for n in ("H100", "T4", "TPU v5e"))
    f32 = "float32"
    assert [dot_path(h100, f32, f32, p) for p in (None, ("HIGH", "HIGH"), ("HIGHEST", "HIGHEST"))] \
        == ["tf32", "tf32", "fp32"]
    assert [dot_path(v5e, f32, f32, p) for p in (None, ("HIGH", "HIGH"), ("HIGHEST", "HIGHEST"))] \
        == ["bf16", "bf16x3", "bf16x6"]
    assert dot_path(t4, f32, f32) == "fp32"               # Turing has no TF32
    assert dot_path(h100, f32, f32, ("DEFAULT", "HIGHEST")) == "fp32"   # the higher operand's


def test_sixteen_and_eight_bit():
    h100, a100, t4, l4 = (C.HARDWARE[n] for n in ("H100", "A100", "T4", "L4"))
    assert dot_path(h100, "bfloat16", "bfloat16") == "bf16"
    # no bf16 tensor cores on sm_75: XLA computes in float32, the T4's bf16 rate is its FP32
    assert t4.matmul_peak(dot_path(t4, "bfloat16", "bfloat16")) == t4.matmul_peak("fp32") == 8.1e12
    assert t4.matmul_peak(dot_path(t4, "float16", "float16")) == 6.5e13
    assert dot_path(h100, "float8_e4m3fn", "float8_e4m3fn") == "fp8"
    assert dot_path(l4, "float8_e4m3fn", "float8_e5m2") == "fp8"
    assert dot_path(a100, "float8_e4m3fn", "float8_e4m3fn") == "bf16"  # Ampere has no fp8
    assert dot_path(h100, "bfloat16", "float32") == "tf32"    # promoted to float32


def test_rates_of_the_paths():
    """Dense datasheet rates (sparsity halved): H100 TF32 494.7, FP8 1,979 TFLOP/s; a TPU's
    three bf16 passes take three times as long as one."""
    h100, v5e = C.HARDWARE["H100"], C.HARDWARE["TPU v5e"]
    assert h100.matmul_peak("tf32") == pytest.approx(4.947e14)
    assert h100.matmul_peak("fp8") == pytest.approx(1.979e15)
    assert v5e.matmul_peak("bf16x3") == pytest.approx(1.97e14 / 3)
    assert C.HARDWARE["A100"].matmul_peak("fp8") == C.HARDWARE["A100"].matmul_peak("bf16")
    # sustained: the bf16 fraction for TF32 (MAMF has no TF32 row), fp8's own on H200
    assert h100.sustained_matmul_flops("tf32") == pytest.approx(4.947e14 * 0.803)
    assert C.HARDWARE["H200"].sustained_matmul_flops("fp8") == pytest.approx(1.979e15 * 0.734)


@pytest.mark.parametrize("context, h100, v5e", [
    (None, "tf32", "bf16"), ("highest", "fp32", "bf16x6"), ("tensorfloat32", "tf32", "bf16x3"),
    ("bfloat16", "tf32", "bf16"), ("float32", "fp32", "bf16x6")])
def test_what_jax_writes_into_the_jaxpr(jax8, context, h100, v5e):
    """jax.default_matmul_precision is recorded in the traced dot_general (checked on jax
    0.7.2, 0.10.2, 0.12.0.1), so the path follows it."""
    import contextlib
    jnp = jax8.numpy
    ctx = jax8.default_matmul_precision(context) if context else contextlib.nullcontext()
    with ctx:
        program = jax8.make_jaxpr(lambda a, b: a @ b)(jnp.ones((8, 8)), jnp.ones((8, 8)))
    (eqn,) = program.jaxpr.eqns
    lhs, rhs = (v.aval.dtype for v in eqn.invars)
    paths = [dot_path(C.HARDWARE[n], lhs, rhs, eqn.params["precision"],
                      eqn.params["preferred_element_type"]) for n in ("H100", "TPU v5e")]
    assert paths == [h100, v5e]


def test_algorithm_presets_name_their_path(jax8):
    lax, jnp = jax8.lax, jax8.numpy
    for preset, path in (("BF16_BF16_F32_X6", "bf16x6"), ("TF32_TF32_F32", "tf32"),
                         ("F32_F32_F32", "fp32"), ("BF16_BF16_F32", "bf16")):
        program = jax8.make_jaxpr(lambda a, b: lax.dot(a, b, precision=preset))(
            jnp.ones((8, 8)), jnp.ones((8, 8)))
        eqn = program.jaxpr.eqns[-1]
        assert dot_path(C.HARDWARE["H100"], "float32", "float32", eqn.params["precision"]) == path


def test_the_roofline_prices_a_dot_at_its_path(jax8):
    """The f32 8192^3 matmul the issue measured on an H200 in 3.18 ms: at the FP32 CUDA-core
    rate the book's 'lower bound' was 16.4 ms; at XLA's TF32 it is 2.2 ms."""
    jax, jnp = jax8, jax8.numpy
    S = jax.ShapeDtypeStruct
    program = jax.make_jaxpr(lambda a, b: a @ b)(S((8192, 8192), jnp.float32),
                                                 S((8192, 8192), jnp.float32))
    r = C.roofline_of(program, hardware="H200")
    assert r.compute_s == pytest.approx(2 * 8192 ** 3 / 4.947e14)
    assert r.time_s[0] < 3.18e-3


def test_xla_runs_its_own_gemms_at_the_rate_measured_on_an_h200():
    """Under XLA an H100's or H200's bf16 products run at what jax.jit of a 4096 x 8192 @
    8192 x 28672 product took on an H200 (2.89 ms, less the 31.5 us call floor): 2 x 4096 x
    8192 x 28672 / 2.8585 ms = 673 TFLOP/s; FP8 and every other chip keep their fractions."""
    from simpmd.cost import HARDWARE
    h100 = HARDWARE["H100"]
    rate = 2 * 4096 * 8192 * 28672 / (2.89e-3 - 31.5e-6)
    for name in ("H100", "H200"):
        xla = HARDWARE[name].under_xla()
        assert xla.sustained_matmul_flops("bf16") == pytest.approx(rate, rel=1e-9)
        assert xla.sustained_matmul_flops("fp8") == HARDWARE[name].sustained_matmul_flops("fp8")
    assert h100.sustained_matmul_flops("bf16") == pytest.approx(0.803 * h100.matmul_peak("bf16"))
    assert HARDWARE["A100"].under_xla() is HARDWARE["A100"]
