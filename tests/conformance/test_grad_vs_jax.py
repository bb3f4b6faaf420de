"""simpmd.grad against jax.grad: one body, four ways of mapping it, the same gradients.

Each case is a per-device body that takes gradients with ``grad`` and communicates with
``lax``. It runs under ``pmap`` and under ``shard_map`` with ``check_vma`` on and off, on
simpmd (simpmd.grad, simpmd.lax) and on real JAX (the very same simpmd.grad and simpmd.lax,
which hand over to jax.grad and jax.lax inside a JAX trace). The engines must agree in
every one of the four settings, including where the settings disagree with each other
(under pmap the gradient of a psum is axis-size times larger; under check_vma the gradient
of a replicated parameter comes out summed over the devices).
"""
import os

if "--xla_force_host_platform_device_count=" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import grad, lax, value_and_grad

N = 8
RING = [(i, (i + 1) % N) for i in range(N)]


def f32(*shape, start=1.0):
    return (np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + start) / 4


@dataclass
class Case:
    name: str
    body: Callable                  # per-device function of the per-device arguments
    args: Callable                  # () -> global arguments (mapped ones have N rows)
    in_axes: tuple                  # 0 (mapped) or None (replicated) per argument


def _mlp_loss(p, x, y):
    h = snp.tanh(x @ p["w1"] + p["b1"])
    out = h @ p["w2"]
    return ((out - y) ** 2).mean()


def _fsdp(w_shard, x):
    def loss(w_shard):
        w = lax.all_gather(w_shard, "i", tiled=True)          # (8, 3) from (1, 3) each
        return (snp.tanh(x @ w) ** 2).sum()
    return grad(loss)(w_shard)


def _tensor_parallel(w_col, x):
    def loss(w_col, x):                                        # column-parallel layer
        y = x @ w_col                                          # this device's columns
        return lax.psum((y ** 2).sum(), "i")
    return grad(loss, argnums=(0, 1))(w_col, x)


CASES = [
    Case("psum_of_local_loss", lambda v: grad(lambda v: lax.psum((v * v).sum(), "i"))(v),
         lambda: (f32(N, 2),), (0,)),
    Case("pmean_of_local_loss", lambda v: grad(lambda v: lax.pmean((v * v).sum(), "i"))(v),
         lambda: (f32(N, 2),), (0,)),
    Case("local_loss", lambda v: grad(lambda v: (v * v).sum())(v), lambda: (f32(N, 2),), (0,)),
    Case("replicated_w_local_loss", lambda x, w: grad(lambda w: ((x * w) ** 2).sum())(w),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("replicated_w_psum_loss",
         lambda x, w: grad(lambda w: lax.psum(((x * w) ** 2).sum(), "i"))(w),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("replicated_w_pmean_loss",
         lambda x, w: grad(lambda w: lax.pmean(((x * w) ** 2).sum(), "i"))(w),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("grad_then_pmean",
         lambda x, w: lax.pmean(grad(lambda w: ((x * w) ** 2).sum())(w), "i"),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("psum_of_invariant", lambda x, w: grad(lambda w: lax.psum((w * w).sum(), "i"))(w),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("all_gather_stacked",
         lambda v: grad(lambda v: (lax.all_gather(v, "i") * f32(N, 2)).sum())(v),
         lambda: (f32(N, 2),), (0,)),
    Case("all_gather_tiled_then_psum",
         lambda v: grad(lambda v: lax.psum((lax.all_gather(v, "i", tiled=True) ** 2).sum(),
                                           "i"))(v),
         lambda: (f32(N, 2),), (0,)),
    Case("ppermute_ring",
         lambda v: grad(lambda v: (lax.ppermute(v, "i", RING) * (lax.axis_index("i") + 1.0))
                        .sum())(v),
         lambda: (f32(N, 2),), (0,)),
    Case("psum_scatter_tiled",
         lambda v: grad(lambda v: (lax.psum_scatter(v, "i", tiled=True) ** 3).sum())(v),
         lambda: (f32(N, 16),), (0,)),
    Case("all_to_all_tiled",
         lambda v: grad(lambda v: (lax.all_to_all(v, "i", 0, 0, tiled=True) * f32(16)).sum())(v),
         lambda: (f32(N, 16),), (0,)),
    Case("all_to_all_untiled",
         lambda v: grad(lambda v: (lax.all_to_all(v, "i", 0, 0) ** 2 * f32(N, 2)).sum())(v),
         lambda: (f32(N, N, 2),), (0,)),
    Case("pshuffle_reversed",
         lambda v: grad(lambda v: (lax.pshuffle(v, "i", list(range(N))[::-1]) ** 2
                                   * (lax.axis_index("i") + 1.0)).sum())(v),
         lambda: (f32(N, 2),), (0,)),
    Case("axis_index_weight", lambda v: grad(lambda v: (v * lax.axis_index("i")).sum())(v),
         lambda: (f32(N, 2),), (0,)),
    Case("mlp_dict_params_then_pmean",
         lambda p, x, y: lax.pmean(grad(_mlp_loss)(p, x, y), "i"),
         lambda: ({"w1": f32(3, 4) / 8, "b1": f32(4) / 8, "w2": f32(4, 1) / 8},
                  f32(N, 5, 3) / 10, f32(N, 5, 1) / 10),
         (None, 0, 0)),
    Case("value_and_grad_aux_argnums",
         lambda x, w: value_and_grad(lambda w, x: (snp.log(snp.exp(x @ w).sum()),
                                                   x.max()), argnums=(0, 1),
                                     has_aux=True)(w, x),
         lambda: (f32(N, 2, 3) / 10, f32(3, 2) / 10), (0, None)),
    Case("relu_max_where_indexing",
         lambda x, w: grad(lambda w: snp.where(x > 0.5, snp.maximum(x * w, 0.7), x).max()
                           + (w.T.reshape(-1)[1:] ** 2).sum())(w),
         lambda: (f32(N, 3), f32(3)), (0, None)),
    Case("fsdp_all_gather_forward_reduce_scatter_backward", _fsdp,
         lambda: (f32(N, 1, 3) / 10, f32(N, 2, N) / 20), (0, 0)),
    Case("outside_value_on_the_left",          # x2 is no tracer: x2 @ w must still be w's
         lambda x, w: grad(lambda w, x2=x * 2.0: ((x2 @ w) ** 2).sum())(w),
         lambda: (f32(N, 2, 3) / 10, f32(3) / 10), (0, None)),
    Case("numpy_function_of_a_device_value_and_a_tracer",   # snp.dot(x, w): w's rule
         lambda x, w: grad(lambda w: (snp.dot(x, w) ** 2).sum()
                           + snp.where(x > 0.3, w, 0.0).sum())(w),
         lambda: (f32(N, 2, 3) / 10, f32(3) / 10), (0, None)),
    Case("tensor_parallel_column_layer", _tensor_parallel,
         lambda: (f32(N, 3, 2).transpose(1, 0, 2).reshape(3, 2 * N).reshape(3, N, 2)
                  .transpose(1, 0, 2) / 10, f32(4, 3) / 10), (0, None)),
]


# axis_index_groups: pmap only (shard_map with check_vma=True refuses them, as in JAX).
PMAP_ONLY = [
    Case("psum_in_groups_of_4",
         lambda v: grad(lambda v: lax.psum((v ** 3).sum(), "i",
                                           axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]))(v),
         lambda: (f32(N, 2),), (0,)),
    Case("all_gather_in_pairs",
         lambda v: grad(lambda v: (lax.all_gather(v, "i", axis_index_groups=[
             [0, 1], [2, 3], [4, 5], [6, 7]]) * f32(2, 2)).sum())(v),
         lambda: (f32(N, 2),), (0,)),
]


def _map_leaves(fn, x):
    if isinstance(x, dict):
        return {k: _map_leaves(fn, v) for k, v in x.items()}
    if isinstance(x, (tuple, list)):
        return type(x)(_map_leaves(fn, v) for v in x)
    return fn(x)


def _leaves(x):
    if isinstance(x, dict):
        return [l for k in sorted(x) for l in _leaves(x[k])]
    if isinstance(x, (tuple, list)):
        return [l for v in x for l in _leaves(v)]
    return [np.asarray(x)]


def _as_shard_map(case, shard_map, P, mesh, check_vma):
    """The pmap body as a shard_map body: mapped arguments arrive as (1, ...) blocks."""
    def body(*blocks):
        args = [b[0] if a == 0 else b for b, a in zip(blocks, case.in_axes)]
        return _map_leaves(lambda o: o[None], case.body(*args))
    specs = tuple(P("i") if a == 0 else P() for a in case.in_axes)
    return shard_map(body, mesh=mesh, in_specs=specs, out_specs=P("i"), check_vma=check_vma)


def run_simpmd(case, mode, eager=False):
    args = case.args()
    if mode == "pmap":
        return simpmd.pmap(case.body, "i", in_axes=case.in_axes, eager=eager)(*args)
    mesh = simpmd.make_mesh((N,), ("i",))
    shard_map = lambda *a, **k: simpmd.shard_map(*a, **k, eager=eager)
    return _as_shard_map(case, shard_map, simpmd.P, mesh, mode == "check_vma")(*args)


_JAX_RESULTS: dict = {}         # (case, mode) -> JAX's gradients, shared by the tests below


def run_jax(jax, case, mode):
    key = (case.name, mode)
    if key not in _JAX_RESULTS:
        _JAX_RESULTS[key] = _leaves(_run_jax(jax, case, mode))
    return _JAX_RESULTS[key]


def _run_jax(jax, case, mode):
    args = case.args()
    if mode == "pmap":
        return jax.pmap(case.body, "i", in_axes=case.in_axes)(*args)
    from jax.sharding import Mesh, PartitionSpec
    mesh = Mesh(np.array(jax.devices()[:N]), ("i",))
    return _as_shard_map(case, jax.shard_map, PartitionSpec, mesh, mode == "check_vma")(*args)


MODES = ["pmap", "check_vma", "no_check_vma"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_grad_matches_jax(jax8, case, mode):
    got = _leaves(run_simpmd(case, mode))
    want = run_jax(jax8, case, mode)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (case.name, mode, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, err_msg=f"{case.name} {mode}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_eager_grad_matches_jax(jax8, case, mode):
    """eager=True runs one program per device (simpmd/eager), not the stacked trace: the
    gradients must be JAX's all the same."""
    got = _leaves(run_simpmd(case, mode, eager=True))
    want = run_jax(jax8, case, mode)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape, (case.name, mode, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, err_msg=f"{case.name} {mode}")


@pytest.mark.parametrize("case", PMAP_ONLY, ids=[c.name for c in PMAP_ONLY])
def test_grad_with_axis_index_groups_matches_jax_pmap(jax8, case):
    got, want = _leaves(run_simpmd(case, "pmap")), run_jax(jax8, case, "pmap")
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-6, err_msg=case.name)


@pytest.mark.parametrize("op", ["pmax", "pmin"])
def test_pmax_pmin_are_refused_on_both_engines(jax8, op):
    body = lambda v: grad(lambda v: getattr(lax, op)((v * v).sum(), "i"))(v)
    with pytest.raises(NotImplementedError, match=op):
        simpmd.pmap(body, "i")(f32(N, 2))
    with pytest.raises(NotImplementedError, match=op):
        jax8.pmap(body, "i")(f32(N, 2))


def test_crosscheck_compares_a_data_parallel_grad_step(jax8):
    def step(w, x, y):
        g = grad(lambda w: ((snp.tanh(x @ w) - y) ** 2).mean())(w)
        return w - 0.1 * lax.pmean(g, "i")
    rng = np.random.default_rng(0)
    w = rng.normal(size=(3,)).astype(np.float32)
    x, y = rng.normal(size=(N, 4, 3)).astype(np.float32), rng.normal(size=(N, 4)).astype(np.float32)
    report = simpmd.crosscheck(step, w, x, y, axis_name="i", in_axes=(None, 0, 0), out_axes=None)
    assert report.ok, str(report)


def test_untiled_all_to_all_across_axes_closed_form():
    """jax 0.10.2 cannot differentiate this one (jax.grad raises "Expected cotangent type
    float32[8,2,1] but got float32[8,1,2]"), so the expectation is worked out by hand:
    out_d[:, k] = v_k[d, :], so d/dv_k[d, j] of sum_d sum(out_d**2 * C) is 2 v_k[d, j] C[j, k]."""
    v, c = f32(N, N, 2), f32(2, N)
    got = np.asarray(simpmd.pmap(lambda v: grad(
        lambda v: (lax.all_to_all(v, "i", 0, 1) ** 2 * c).sum())(v), "i")(v))
    want = 2 * v * c.T[:, None, :]
    np.testing.assert_allclose(got, want, rtol=1e-5)
