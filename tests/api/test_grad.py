"""simpmd.grad on its own: finite differences, closed forms, the API, the backward trace.

Expected values never come from simpmd: central finite differences of the same NumPy
function in float64, or gradients worked out by hand (d/dv of psum(v.v) is 2v per device,
times the axis size under pmap; see tests/conformance/test_grad_vs_jax.py for real JAX).
"""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import grad, lax, value_and_grad
from simpmd.core.autodiff import NotDifferentiableError

N = 8


def finite_difference(f, x, eps=1e-6):
    """Central differences of scalar ``f`` at ``x`` (float64), one coordinate at a time."""
    x = np.array(x, dtype=np.float64)
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[i] = eps
        out[i] = (f(x + e) - f(x - e)) / (2 * eps)
    return out


rng = np.random.default_rng(0)
A = rng.normal(size=(3, 4))
B = rng.normal(size=(4,))

FUNCTIONS = {
    "add_sub_mul_div": lambda x: ((x + 1.5) * (x - 0.5) / (x * x + 2.0)).sum(),
    "matmul_tanh_mean": lambda x: snp.tanh(x @ A).mean(),
    "matmul_vector": lambda x: ((x[0] @ A) @ B) ** 2 + (A.T @ x[:, 1]).sum(),
    "broadcast_row": lambda x: (x * A[:1, :3].T).sum(),
    "exp_log_softmax": lambda x: snp.log(snp.exp(x).sum(axis=1)).sum(),
    "max_axis": lambda x: x.max(axis=0).sum() + snp.max(x * x),
    "maximum_relu": lambda x: snp.maximum(x, 0.1).sum() + snp.minimum(x, 0.2).sum(),
    "where": lambda x: snp.where(x > 0, x ** 3, -x).sum(),
    "reshape_transpose_index": lambda x: (x.T.reshape(-1)[2:7] ** 2).sum() + x[1, ::2].sum(),
    "sqrt_square_abs": lambda x: snp.sqrt(snp.square(x) + 1.0).sum() + snp.abs(x).sum(),
    "concatenate_stack": lambda x: (snp.concatenate([x, 2 * x], axis=1) ** 2).sum()
    + (snp.stack([x, x * x]) * 3).sum(),
    "sin_cos_power": lambda x: (snp.sin(x) * snp.cos(x) + (x * x) ** 1.5).sum(),
    "cumsum_prod_var": lambda x: (snp.cumsum(x, axis=1) ** 2).sum() + x.prod() + x.var(axis=0).sum(),
}


@pytest.fixture
def x64():
    """Closed forms and finite differences in float64: x64 on, as jax_enable_x64 would be
    (without it simpmd computes float64 inputs as float32, as JAX does)."""
    simpmd.config.update("jax_enable_x64", True)
    yield
    simpmd.config.update("jax_enable_x64", False)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_grad_matches_finite_differences(name, x64):
    f = FUNCTIONS[name]
    x = rng.normal(size=(3, 3)) + 0.05      # away from the kinks of max/abs/where
    got = grad(f)(x)
    np.testing.assert_allclose(got, finite_difference(f, x), rtol=1e-5, atol=1e-6)


def test_pytrees_argnums_has_aux(x64):
    def loss(p, x, scale):
        return scale * ((x @ p["w"] + p["b"]) ** 2).sum(), {"n": x.shape[0]}
    p = {"w": rng.normal(size=(2, 3)), "b": rng.normal(size=(3,))}
    x = rng.normal(size=(5, 2))
    (value, aux), (gp, gx) = value_and_grad(loss, argnums=(0, 1), has_aux=True)(p, x, 0.5)
    r = x @ p["w"] + p["b"]
    assert np.isclose(value, 0.5 * (r ** 2).sum()) and aux == {"n": 5}
    np.testing.assert_allclose(gp["w"], x.T @ r)          # d/dw 0.5|xw+b|^2 = x^T r
    np.testing.assert_allclose(gp["b"], r.sum(0))
    np.testing.assert_allclose(gx, r @ p["w"].T)
    g, aux2 = grad(loss, has_aux=True)(p, x, 0.5)
    assert set(g) == {"w", "b"} and aux2 == {"n": 5}


def test_unused_argument_gets_zeros_and_python_float_is_float32():
    assert grad(lambda a, b: a * 3.0, argnums=1)(2.0, 5.0) == 0.0
    g = grad(lambda a: a * a)(3.0)
    assert g.dtype == np.float32 and g == 6.0


def test_grad_of_grad_is_the_second_derivative():
    # d/dx sum(d/dy sum(y**3)) = d/dx sum(3 x**2) = 6x, worked by hand
    x = np.array([0.5, -1.0, 2.0], np.float32)
    np.testing.assert_allclose(grad(lambda x: grad(lambda y: (y ** 3).sum())(x).sum())(x), 6 * x,
                               rtol=1e-6)


def test_refusals_name_what_is_off():
    with pytest.raises(TypeError, match=r"scalar-output.*\(3,\)"):
        grad(lambda x: x * 2)(np.ones(3))
    with pytest.raises(TypeError, match="int32"):
        grad(lambda x: (x * 2).sum())(np.ones(3, dtype=np.int32))
    with pytest.raises(NotDifferentiableError, match="numpy.norm"):
        grad(lambda x: snp.linalg.norm(x))(np.ones(3))
    with pytest.raises(simpmd.ConcretizationTypeError, match="float"):
        grad(lambda x: float(x.sum()))(np.ones(3))


def test_psum_gradient_under_pmap_is_axis_size_times_2v_and_marked_backward():
    v = np.arange(1.0, 9.0, dtype=np.float32).reshape(N, 1)
    f = simpmd.pmap(lambda v: grad(lambda v: lax.psum((v * v).sum(), "i"))(v), "i")
    np.testing.assert_allclose(np.asarray(f(v)), N * 2 * v)
    calls = f.trace.calls()
    assert [c[0].op for c in calls] == ["psum", "psum"]
    assert [c[0].phase for c in calls] == ["forward", "backward"]
    assert all(e.phase == "backward" for e in calls[1])
    assert "backward psum('i')" in str(f.trace)


def test_check_vma_replicated_gradient_is_the_global_gradient():
    """Under shard_map(check_vma=True) grad of the local loss w.r.t. a replicated w is the
    gradient of the sum of all devices' losses: finite differences of that global sum."""
    mesh = simpmd.make_mesh((N,), ("i",))
    x = rng.normal(size=(N, 4, 3)).astype(np.float32)
    w = rng.normal(size=(3,)).astype(np.float32)

    def body(xb, w):
        return grad(lambda w: snp.tanh(xb[0] @ w).sum())(w)[None]
    got = simpmd.shard_map(body, mesh=mesh, in_specs=(simpmd.P("i"), simpmd.P()),
                           out_specs=simpmd.P("i"))(x, w)
    want = finite_difference(lambda w: np.tanh(x.astype(np.float64) @ w).sum(), w)
    for row in np.asarray(got):
        np.testing.assert_allclose(row, want, rtol=1e-4, atol=1e-5)
    phases = [(c[0].op, c[0].phase) for c in simpmd.last_trace().calls()]
    assert phases == [("psum", "backward")]          # JAX's pvary, transposed


def test_fsdp_backward_is_a_reduce_scatter_of_the_gradients():
    """Parameters sharded by rows, all_gathered in the forward pass: each device's gradient
    is its rows of the sum over devices of the full gradients (finite differences)."""
    x = rng.normal(size=(N, 2, N)).astype(np.float32)
    w = rng.normal(size=(N, 1, 3)).astype(np.float32)

    def body(w_shard, xd):
        return grad(lambda s: (snp.tanh(xd @ lax.all_gather(s, "i", tiled=True)) ** 2).sum())(w_shard)
    f = simpmd.pmap(body, "i")
    got = np.asarray(f(w, x))
    full = w.reshape(N, 3).astype(np.float64)
    want = finite_difference(lambda W: sum((np.tanh(x[d] @ W) ** 2).sum() for d in range(N)), full)
    np.testing.assert_allclose(got.reshape(N, 3), want, rtol=1e-4, atol=1e-5)
    ops = [(c[0].op, c[0].phase) for c in f.trace.calls()]
    assert ops == [("all_gather", "forward"), ("psum_scatter", "backward")]


def test_ppermute_backward_runs_the_inverse_permutation():
    ring = [(i, (i + 1) % N) for i in range(N)]
    v = np.arange(N, dtype=np.float32).reshape(N, 1)
    f = simpmd.pmap(lambda v: grad(lambda v: (lax.ppermute(v, "i", ring)
                                               * (lax.axis_index("i") + 1.0)).sum())(v), "i")
    # device d's value goes to d+1, whose weight is d+2
    np.testing.assert_allclose(np.asarray(f(v)).ravel(), (np.arange(N) + 1) % N + 1)
    back = [c for c in f.trace.calls() if c[0].phase == "backward"]
    assert back[0][0].params["perm"] == tuple((d, s) for s, d in ring)


@pytest.mark.parametrize("eager", [False, True])
def test_a_body_sees_the_types_of_its_inputs(eager):
    """What simpmd.grad reads under shard_map(check_vma=True): each input's type says which
    mesh axes it varies over (a block split over 'x' and 'y' varies over both, a replicated
    argument over none), on both engines; without check_vma no value carries axes."""
    seen = []

    def body(a, b):
        seen.append((a.aval.vma, b.aval.vma, (a * 2).aval.vma))
        return a

    mesh = simpmd.make_mesh((2, 4), ("x", "y"))
    for check in (True, False):
        seen.clear()
        simpmd.shard_map(body, mesh=mesh, in_specs=(simpmd.P("x", "y"), simpmd.P()),
                         out_specs=simpmd.P("x", "y"), check_vma=check, eager=eager)(
            np.ones((4, 8), np.float32), np.ones(3, np.float32))
        assert len(seen) == (8 if eager else 1)       # once per device, or once in all
        both = frozenset({"x", "y"}) if check else frozenset()
        assert set(seen) == {(both, frozenset(), both)}


def test_grad_inside_a_nested_pmap_sums_over_the_named_axes():
    """A nested pmap runs per device (simpmd/eager): under pmap rules the gradient of a psum
    over both axes of a 2x4 grid is 8 * 2v, over the inner axis alone 4 * 2v."""
    v = np.arange(16.0, dtype=np.float32).reshape(2, 4, 2)
    for axes, size in ((("i", "j"), 8), ("j", 4)):
        f = simpmd.pmap(simpmd.pmap(
            lambda v: grad(lambda v: lax.psum((v * v).sum(), axes))(v), "j"), "i")
        np.testing.assert_allclose(np.asarray(f(v)), size * 2 * v)
