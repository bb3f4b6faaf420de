"""``simpmd.lax.cond`` and ``switch``: each device takes its own branch, and a collective
reached by only some devices of its group is the deadlock it would be on hardware.

Expectations: real jax.pmap on 8 fake CPU devices for every program that does not hang
there, and hand-worked values.
"""
import numpy as np
import pytest

import simpmd
from simpmd import lax
import simpmd.numpy as snp

X8 = np.arange(8.0, dtype=np.float32)


def varying(x):
    return lax.cond(x > 3, lambda v: v * 2, lambda v: -v, x)


def three_way(x):
    return lax.switch(lax.axis_index("i") % 3, [lambda v: v + 1, lambda v: v * 10, lambda v: v - 5], x)


def uniform_with_psum(x):
    # the same predicate on every device: each group reaches the psum together
    return lax.cond(lax.psum(x, "i") > 0, lambda v: lax.psum(v, "i"), lambda v: lax.pmax(v, "i"), x)


@pytest.mark.parametrize("body", [varying, three_way, uniform_with_psum], ids=lambda f: f.__name__)
def test_cond_and_switch_agree_with_jax(jax8, body):
    expected = np.asarray(jax8.pmap(body, "i")(X8))
    got = np.asarray(simpmd.pmap(body, "i")(X8))
    np.testing.assert_allclose(got, expected)
    # and a cached call, on values that send the devices the other way
    again = simpmd.pmap(body, "i")
    again(X8)
    np.testing.assert_allclose(np.asarray(again(-X8 + 7)), np.asarray(jax8.pmap(body, "i")(-X8 + 7)))


def test_cond_by_hand():
    np.testing.assert_array_equal(np.asarray(simpmd.pmap(varying, "i")(X8)),
                                  [0, -1, -2, -3, 8, 10, 12, 14])
    np.testing.assert_array_equal(np.asarray(simpmd.pmap(three_way, "i")(X8)),
                                  [1, 10, -3, 4, 40, 0, 7, 70])


def test_a_collective_in_one_branch_is_a_deadlock_naming_both_sides():
    def f(x):
        return lax.cond(lax.axis_index("i") < 4,
                        lambda v: lax.psum(v, "i"), lambda v: v, x)
    with pytest.raises(simpmd.DeadlockError) as info:
        simpmd.pmap(f, axis_name="i")(X8)
    text = str(info.value)
    assert "devices 0-3" in text and "devices 4-7" in text
    assert "psum" in text and "'i'" in text and "test_cond.py" in text
    assert info.value.trace is not None


def test_the_same_deadlock_in_eager_mode():
    def f(x):
        return lax.cond(lax.axis_index("i") < 4, lambda v: lax.psum(v, "i"), lambda v: v, x)
    with pytest.raises(simpmd.DeadlockError):
        simpmd.pmap(f, axis_name="i", eager=True)(X8)


def test_groups_that_take_one_branch_together_do_not_deadlock():
    """The predicate varies over 'a' but not within a psum over 'b': each group of 'b'
    runs one branch together."""
    mesh = simpmd.make_mesh((2, 4), ("a", "b"))

    def body(v):
        return lax.cond(lax.axis_index("a") == 0, lambda u: lax.psum(u, "b"), lambda u: u * 0, v)
    f = simpmd.shard_map(body, mesh=mesh, in_specs=simpmd.P(("a", "b")), out_specs=simpmd.P(("a", "b")),
                         check_vma=False)
    got = np.asarray(f(X8))
    np.testing.assert_array_equal(got, [6, 6, 6, 6, 0, 0, 0, 0])      # 0+1+2+3 on row a=0
    events = [e for e in f.trace.events if e.kind == "collective"]
    assert sorted(e.device for e in events) == [0, 1, 2, 3]           # only row a=0 ran it


def test_both_branches_are_traced_once_as_in_jax(jax8):
    def count(pmap, cond):
        calls = []

        def body(x):
            def yes(v):
                calls.append("yes")
                return v + 1

            def no(v):
                calls.append("no")
                return v - 1
            return cond(x > 100, yes, no, x)
        g = pmap(body, "i")
        g(X8)
        g(X8)
        return sorted(calls)
    assert count(simpmd.pmap, lax.cond) == count(jax8.pmap, jax8.lax.cond) == ["no", "yes"]


def test_gradient_through_cond_matches_jax(jax8):
    def loss(w, x):
        return lax.cond(x.sum() > 0, lambda u: (u * x).sum() ** 2, lambda u: snp.exp(u).sum(), w)
    rng = np.random.default_rng(3)
    w = rng.standard_normal(4).astype(np.float32)
    xs = rng.standard_normal((8, 4)).astype(np.float32)
    mine = simpmd.pmap(simpmd.grad(loss), "i", in_axes=(None, 0))(w, xs)
    theirs = jax8.pmap(jax8.grad(loss), "i", in_axes=(None, 0))(w, xs)
    np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=1e-5)


def test_branches_must_agree_on_shapes():
    with pytest.raises(simpmd.core.errors.BranchError, match="the shapes do not match"):
        simpmd.pmap(lambda x: lax.cond(x > 0, lambda v: v, lambda v: snp.stack([v, v]), x), "i")(X8)


def test_outside_a_mapped_function_cond_is_a_python_choice():
    assert lax.cond(True, lambda v: v + 1, lambda v: v - 1, 1.0) == 2.0
    assert lax.switch(7, [lambda: "a", lambda: "b"]) == "b"          # clamped, as in JAX


def test_make_jaxpr_shows_both_branches():
    program = simpmd.make_jaxpr(varying, axis_env=[("i", 8)])(np.float32(1))
    names = [e.primitive.name for e in program.eqns]
    assert names.count("cond") == 1           # one equation, each branch a program of its own
    branches = program.eqns[names.index("cond")].params["branches"]
    inside = [[e.primitive.name for e in b.eqns] for b in branches]
    assert len(branches) == 2 and any("neg" in b for b in inside) and any("mul" in b for b in inside)
    assert "cond[" in str(program) and "branches=(" in str(program)


def _closing_over(L, np_):
    def loss(w, x):
        z = w * 2.0                 # read by two branches, w by a third: closure conversion
        return L.switch((x[0] > 0).astype(np_.int32) + 1,
                        [lambda v: (v * z).sum(), lambda v: (np_.sin(v) * w).sum(),
                         lambda v: (v * x * z).sum()], x)
    return loss


@pytest.mark.parametrize("where", ["pmap", "top level"])
def test_gradient_of_branches_that_close_over_values_matches_jax(jax8, where):
    """Every branch gets the values any branch reads, as in JAX; the gradient flows to
    them (w, through z and directly) under pmap and at the top level (plain NumPy)."""
    import jax.numpy as jnp
    w = np.arange(3.0, dtype=np.float32) - 1
    xs = np.array([[1.0, -2, 3], [-1.0, 2, 3]] * 4, np.float32)
    mine = simpmd.grad(_closing_over(lax, snp), argnums=(0, 1))
    theirs = jax8.grad(_closing_over(jax8.lax, jnp), argnums=(0, 1))
    if where == "pmap":
        pairs = [(simpmd.pmap(mine, "i", in_axes=(None, 0))(w, xs),
                  jax8.pmap(theirs, "i", in_axes=(None, 0))(w, xs))]
    else:
        pairs = [(mine(w, x), theirs(w, x)) for x in xs[:2]]
    for got, want in pairs:
        for g, e in zip(got, want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6, atol=1e-6)
