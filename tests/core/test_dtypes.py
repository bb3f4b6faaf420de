"""JAX's dtype rules, decided in one place (simpmd/core/dtypes.py) and held to real JAX.

Without ``jax_enable_x64`` (JAX's default) a float64 input is computed as float32 and an
int64 as int32; a Python number is *weak* (it takes the other operand's dtype); arrays
promote along JAX's lattice, not NumPy's (``uint8 + int8`` is int16, ``int32 * float16``
float16). Random pairs of operand kinds, every operation, compared with jax.pmap on 8 fake
CPU devices; then the constructors, ``where`` with Python scalars, a collective of a
Python scalar, and what ``make_jaxpr`` prints.
"""
import itertools

import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import lax

N = 8
DTYPES = ["bool", "int8", "int16", "int32", "uint8", "uint32", "float16", "bfloat16",
          "float32", "float64", "int64"]
SCALARS = [2, 2.5, True, np.float32(2), np.int8(3), np.float64(1.5)]
OPS = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "true_divide": lambda a, b: a / b,
    "maximum": lambda a, b: snp.maximum(a, b),
    "less": lambda a, b: a < b,
    "where": lambda a, b: snp.where(a > 0, a, b),
}


def _array(dtype, seed=0):
    if dtype == "bfloat16":
        import ml_dtypes
        dtype = ml_dtypes.bfloat16
    values = np.random.default_rng(seed).integers(1, 4, size=(N, 3))
    return values.astype(dtype)


def _dtypes_of(pmap, fn, *args):
    try:
        return str(np.asarray(pmap(fn, "i")(*args)).dtype)
    except Exception as exc:          # noqa: BLE001 (a refusal is compared by kind)
        return f"refused ({type(exc).__name__})"


@pytest.mark.parametrize("op", sorted(OPS))
def test_two_arrays_promote_as_jax_promotes(jax8, op):
    fn = OPS[op]
    pairs = list(itertools.product(DTYPES, repeat=2))
    rng = np.random.default_rng(len(op))
    for k in rng.choice(len(pairs), size=24, replace=False):
        a, b = pairs[k]
        x, y = _array(a, 1), _array(b, 2)
        want = _dtypes_of(jax8.pmap, fn, x, y)
        got = _dtypes_of(simpmd.pmap, fn, x, y)
        assert got == want, (op, a, b)


@pytest.mark.parametrize("op", sorted(OPS))
def test_python_and_numpy_scalars_are_weak_or_not_as_in_jax(jax8, op):
    fn = OPS[op]
    for a, c in itertools.product(["int8", "int32", "uint8", "float16", "float32", "bool"], SCALARS):
        x = _array(a)
        want = _dtypes_of(jax8.pmap, lambda v: fn(v, c), x)
        got = _dtypes_of(simpmd.pmap, lambda v: fn(v, c), x)
        assert got == want, (op, a, repr(c))
        want = _dtypes_of(jax8.pmap, lambda v: fn(c, v), x)
        got = _dtypes_of(simpmd.pmap, lambda v: fn(c, v), x)
        assert got == want, (op, repr(c), a)


CONSTANTS = {
    "zeros": lambda v: snp.zeros(3) + v[0],
    "ones int": lambda v: snp.ones(3, dtype=int) * 2,
    "arange": lambda v: snp.arange(3) + v[0],
    "arange float": lambda v: snp.arange(3.0),
    "full": lambda v: snp.full((3,), 1.5),
    "eye": lambda v: snp.eye(3)[0] * v[0],
    "linspace": lambda v: snp.linspace(0, 1, 3),
    "where scalars": lambda v: snp.where(v > 1, 1, 0),
    "where float scalar": lambda v: snp.where(v > 1, v, 0.5),
    "psum of a python number": lambda v: lax.psum(1.0, "i") * snp.ones_like(v),
    "psum of an int": lambda v: lax.psum(2, "i") + v,
    "mean of ints": lambda v: v.astype(np.int32).mean(),
    "sum of bools": lambda v: (v > 1).sum(),
    "int power": lambda v: v.astype(np.int32) ** 2,
    "int true divide": lambda v: v.astype(np.int32) / 2,
}


@pytest.mark.parametrize("name", sorted(CONSTANTS))
def test_constants_and_python_numbers_get_jax_dtypes(jax8, name):
    fn = CONSTANTS[name]
    x = _array("float32")
    snp_jax = fn        # the same body: simpmd.numpy hands over to jax.numpy on JAX values
    want = _dtypes_of(jax8.pmap, snp_jax, x)
    got = _dtypes_of(simpmd.pmap, fn, x)
    assert got == want, name


def test_float64_inputs_are_float32_and_x64_keeps_them(jax8):
    x = np.arange(8.0)
    assert np.asarray(simpmd.pmap(lambda v: v * 2, "i")(x)).dtype == np.float32
    text = str(simpmd.make_jaxpr(lambda v: v * 2)(1.0))
    assert "f32[]" in text and "f64" not in text
    simpmd.config.update("jax_enable_x64", True)
    try:
        assert np.asarray(simpmd.pmap(lambda v: v * 2, "i")(x)).dtype == np.float64
        assert np.asarray(simpmd.pmap(lambda v: v + 1, "i")(np.arange(8))).dtype == np.int64
    finally:
        simpmd.config.update("jax_enable_x64", False)


def test_grad_of_abs_at_zero_is_one_as_in_jax(jax8):
    x = np.array([0.0, -1.0, 2.0], np.float32)
    want = np.asarray(jax8.grad(lambda v: jax8.numpy.abs(v).sum())(x))
    got = np.asarray(simpmd.grad(lambda v: snp.abs(v).sum())(x))
    np.testing.assert_array_equal(got, want)
    assert got[0] == 1.0


def test_a_bare_dict_in_axes_is_refused_as_jax_refuses_it(jax8):
    xs = {"a": np.ones(8), "b": np.ones(8)}
    with pytest.raises(ValueError):
        jax8.pmap(lambda d: d["a"], "i", in_axes={"a": 0, "b": 0})(xs)
    with pytest.raises(ValueError, match=r"a dict.*in_axes=\(\{'a': 0, 'b': 0\},\)"):
        simpmd.pmap(lambda d: d["a"], "i", in_axes={"a": 0, "b": 0})(xs)
    np.testing.assert_array_equal(        # the tuple the message suggests works on both
        np.asarray(simpmd.pmap(lambda d: d["a"], "i", in_axes=({"a": 0, "b": 0},))(xs)),
        np.asarray(jax8.pmap(lambda d: d["a"], "i", in_axes=({"a": 0, "b": 0},))(xs)))


def test_an_error_in_the_body_names_each_device_shape_not_the_stack():
    """The body sees (2, 4) per device; the message must not show the (8, 2, 4) stack."""
    with pytest.raises(simpmd.SimpmdError) as info:
        simpmd.pmap(lambda v: v @ v, "i")(np.ones((8, 2, 4)))
    text = str(info.value)
    assert "(2, 4)" in text and "(8, 2, 4)" not in text
