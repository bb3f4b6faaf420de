"""simpmd.lax.top_k and lax.ragged_dot, the routing and grouped product of a mixture-of-experts
layer, against jax.lax's own: values, gradients, and what each refuses.

The grouped product's expectation is also worked out with a plain NumPy loop over the groups."""
import numpy as np
import pytest

import simpmd
from simpmd import lax, P
from simpmd.jax import on_jax


def _loop_ragged_dot(x, w, sizes):
    out, start = np.zeros((x.shape[0], w.shape[2]), np.float64), 0
    for g, n in enumerate(sizes):
        stop = min(start + int(n), x.shape[0])
        out[start:stop] = x[start:stop] @ w[g]
        start = stop
    return out


SIZES = np.array([[3, 0, 5], [0, 0, 0], [10, 0, 0], [2, 2, 2]], np.int32)   # rows 8-9 of device 0 in no group


def _operands():
    rng = np.random.default_rng(0)
    return (rng.normal(size=(4, 10, 3)).astype(np.float32),
            rng.normal(size=(4, 3, 3, 2)).astype(np.float32))


def test_ragged_dot_multiplies_each_group_by_its_matrix_and_leaves_the_rest_zero(jax8):
    x, w = _operands()
    f = simpmd.shard_map(lambda x, w, s: lax.ragged_dot(x[0], w[0], s[0])[None],
                         mesh=simpmd.make_mesh((4,), ("i",)), in_specs=P("i"), out_specs=P("i"))
    got = np.asarray(f(x, w, SIZES))
    want = np.stack([_loop_ragged_dot(x[d], w[d], SIZES[d]) for d in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not got[0, 8:].any() and not got[1].any()
    np.testing.assert_allclose(np.asarray(jax8.jit(on_jax(f))(x, w, SIZES)), want, rtol=1e-5, atol=1e-5)


def test_ragged_dot_gradients_equal_jax_grad(jax8):
    x, w = _operands()

    def loss(x, w, s):
        return lax.psum((lax.ragged_dot(x[0], w[0], s[0]) ** 2).sum(), "i")
    f = simpmd.shard_map(lambda x, w, s: simpmd.grad(loss, argnums=(0, 1))(x, w, s),
                         mesh=simpmd.make_mesh((4,), ("i",)), in_specs=P("i"), out_specs=P("i"))
    got = f(x, w, SIZES)
    want = jax8.grad(lambda x, w: sum((jax8.lax.ragged_dot(x[d], w[d], SIZES[d]) ** 2).sum()
                                      for d in range(4)), argnums=(0, 1))(x, w)
    for g, r in zip(got, want):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-4, atol=1e-4)


def test_top_k_picks_as_jax_does_ties_and_integers_included(jax8):
    rng = np.random.default_rng(1)
    v = rng.normal(size=(4, 6, 5)).astype(np.float32)
    v[0, 0, 1] = v[0, 0, 3]                                        # a tie: the lower position first
    ints = rng.integers(-5, 5, size=(4, 7)).astype(np.int32)
    mesh = simpmd.make_mesh((4,), ("i",))
    f = simpmd.shard_map(lambda v, n: (lax.top_k(v, 3), lax.top_k(n, 4)), mesh=mesh,
                         in_specs=P("i"), out_specs=P("i"))
    (values, index), (ivalues, iindex) = f(v, ints)
    want_v, want_i = jax8.lax.top_k(v, 3)
    assert np.asarray(index).dtype == np.int32
    np.testing.assert_array_equal(np.asarray(index), np.asarray(want_i))
    np.testing.assert_array_equal(np.asarray(values), np.asarray(want_v))
    np.testing.assert_array_equal(np.asarray(iindex), np.asarray(jax8.lax.top_k(ints, 4)[1]))
    np.testing.assert_array_equal(np.asarray(ivalues), np.asarray(jax8.lax.top_k(ints, 4)[0]))


def test_top_k_gradient_reaches_the_chosen_entries_only(jax8):
    v = np.array([[1.0, 3.0, 2.5, 2.0]] * 4, np.float32)

    def loss(v):
        return lax.psum(lax.top_k(v, 2)[0].sum(), "i")
    f = simpmd.shard_map(lambda v: simpmd.grad(loss)(v), mesh=simpmd.make_mesh((4,), ("i",)),
                         in_specs=P("i"), out_specs=P("i"))
    np.testing.assert_array_equal(np.asarray(f(v))[0], [0.0, 1.0, 1.0, 0.0])   # 3.0 and 2.5


def test_bad_operands_are_refused_with_their_shapes():
    x, w = _operands()
    mesh = simpmd.make_mesh((4,), ("i",))
    floats = simpmd.shard_map(lambda x, w: lax.ragged_dot(x[0], w[0], np.array([1.0, 2.0, 3.0]))[None],
                              mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(Exception, match="integers"):
        floats(x, w)
    short = simpmd.shard_map(lambda x, w: lax.ragged_dot(x[0], w[0], np.array([1, 2], np.int32))[None],
                             mesh=mesh, in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(Exception, match=r"\(3, 3, 2\)"):
        short(x, w)
    too_many = simpmd.shard_map(lambda x: lax.top_k(x[0], 4)[0][None], mesh=mesh,
                                in_specs=P("i"), out_specs=P("i"))
    with pytest.raises(Exception, match="k=4"):
        too_many(x)
