"""Transformations nested in any order JAX allows, on simpmd and on real JAX.

A quick draw of the nesting fuzzer (tests/nesting_programs.py; the long draw is
scripts/nesting_fuzz.py, its count in docs/testing.md), then the cases it found, each as a
regression test: the same program on both engines must raise on both, or return the same
values and types. Expectations come from the installed JAX on 8 fake CPU devices.
"""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax

import nesting_programs as N
from fuzz_seeds import seeds

QUICK, SEED = 60, 2026
X = np.random.RandomState(1).randn(8, 4).astype(np.float32)


@pytest.fixture(scope="module")
def engines(jax8):
    return N.Engine("jax"), N.Engine("simpmd")


@pytest.mark.parametrize("seed", seeds("nesting"))
def test_a_quick_draw_of_nested_programs_agrees_with_jax(engines, capsys, seed):
    results, differ = [], []
    count = QUICK if seed == SEED else QUICK // 2       # a new seed draws half as many
    for program in N.draw(seed, count):
        if N.crashes_jax(program):
            results.append((program, None))
            continue
        agreed, theirs, ours, why = N.compare(*engines, program)
        results.append((program, agreed))
        if agreed is False:
            differ.append(f"{program}: {why} (jax: {theirs.error or theirs.type_text}; "
                          f"simpmd: {ours.error or ours.type_text})")
    with capsys.disabled():
        print("\n" + N.report(results)[0])
    assert not differ, "\n".join(differ)
    families = {p.family for p, _ in results}
    assert len(families) > count // 2          # the draw nests many different ways


def test_the_same_seed_draws_the_same_programs():
    assert N.draw(5, 30) == N.draw(5, 30) and N.draw(5, 30) != N.draw(6, 30)


# -- the cases the fuzzer found, as regression tests -------------------------------------------


def both(jax8, make, types=True):
    """``make(J, L, np_, mesh, P)`` on each engine; both raise, or agree in value and type
    (``types=False``: in value only)."""
    theirs, ours = N.Engine("jax"), N.Engine("simpmd")
    got = []
    for E in (theirs, ours):
        try:
            out = make(E.J, E.lax, E.np, E.mesh, E.P)
            got.append((None, np.asarray(out), str(E.J.typeof(out))))
        except Exception as exc:            # which engine raised is what is compared
            got.append((f"{type(exc).__name__}: {exc}", None, None))
    (a_err, a, a_type), (b_err, b, b_type) = got
    assert (a_err is None) == (b_err is None), f"JAX: {a_err}; simpmd: {b_err}"
    if a_err is None:
        np.testing.assert_allclose(b, a, rtol=2e-5, atol=1e-6)
        assert b_type == a_type or not types
    return got


def _scan_body(L, J):
    def body(v):
        def step(c, a):
            return c + a * v.sum(), c
        c, ys = L.scan(step, 0.0 * v[0], v)
        return L.psum(c + ys.sum(), "i")
    return body


@pytest.mark.parametrize("order", ["jit(grad(shard_map(scan)))", "grad(jit(shard_map(scan)))",
                                   "grad(shard_map(scan))", "value_and_grad(shard_map)"])
def test_grad_of_a_shard_map_with_a_scan_inside_jit_or_not(jax8, order):
    def make(J, L, np_, mesh, P_):
        sm = J.shard_map(_scan_body(L, J), mesh=mesh, in_specs=P_("i"), out_specs=P_())
        if order.startswith("jit(grad"):
            return J.jit(J.grad(sm))(X[:, 0])
        if order.startswith("grad(jit"):
            return J.grad(J.jit(sm))(X[:, 0])
        if order.startswith("grad("):
            return J.grad(sm)(X[:, 0])
        value, g = J.value_and_grad(sm)(X[:, 0])
        return g * value
    both(jax8, make)


def test_jit_of_a_shard_map_takes_numpy_arguments_on_an_auto_mesh(jax8):
    both(jax8, lambda J, L, np_, mesh, P_: J.jit(J.shard_map(
        lambda v: L.psum((v * v).sum(), "i"), mesh=mesh, in_specs=P_("i"), out_specs=P_()))(X))


def test_jit_of_a_shard_map_on_numpy_arguments_and_an_explicit_mesh_as_this_jax_does(jax8):
    from jax.sharding import AxisType
    jmesh = jax8.make_mesh((4,), ("i",), axis_types=(AxisType.Explicit,))
    smesh = simpmd.make_mesh((4,), ("i",), axis_types=(simpmd.AxisType.Explicit,))

    def make(J, L, np_, mesh, P_):
        mesh = jmesh if J is jax8 else smesh
        return J.jit(J.grad(J.shard_map(lambda v: L.psum((v * v).sum(), "i"), mesh=mesh,
                                        in_specs=P_("i"), out_specs=P_())))(X[:, 0])
    # jax 0.10 on refuses, in the words simpmd repeats; jax 0.7 runs it and types the result
    # by the mesh (float32[8@i]), where simpmd's comes back whole (docs/testing.md)
    (a_err, _, _), (b_err, _, _) = both(jax8, make, types=False)
    if a_err:
        assert "does not match the specs of the input" in b_err


def test_eval_shape_of_jit_of_grad(jax8):
    def make(J, L, np_, mesh, P_):
        out = J.eval_shape(J.jit(J.grad(lambda v: (np_.tanh(v) * v).sum())), X)
        return np.zeros(out.shape, out.dtype)
    both(jax8, make)


def test_grad_of_grad_and_pmap_under_jit_and_grad(jax8):
    both(jax8, lambda J, L, np_, mesh, P_: J.grad(
        lambda x: J.grad(lambda y: (np_.tanh(y) * y * y).sum())(x).sum())(X))
    both(jax8, lambda J, L, np_, mesh, P_: J.jit(J.pmap(
        lambda v: v * L.psum(v, "p"), axis_name="p"))(X[:4]))
    both(jax8, lambda J, L, np_, mesh, P_: J.grad(lambda x: J.pmap(
        lambda v: np_.sin(v) * L.psum(v, "p"), axis_name="p")(x).sum())(X[:4]))


# -- loops under jit on an Explicit mesh -----------------------------------------------------


def _explicit(J):
    from jax.sharding import AxisType
    if J is simpmd:
        return simpmd.make_mesh((2, 4), ("a", "b"), axis_types=(simpmd.AxisType.Explicit,) * 2)
    return J.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Explicit,) * 2)


@pytest.mark.parametrize("loop", ["scan", "fori_loop", "fori_loop, traced bound", "while_loop",
                                  "grad of fori_loop", "scan changing the carry's sharding",
                                  "while_loop changing the carry's sharding",
                                  "scan over a split dimension"])
def test_loops_under_jit_on_an_explicit_mesh(jax8, loop):
    W = np.random.RandomState(2).randn(4, 4).astype(np.float32) / 3

    def make(J, L, np_, _, P_):
        mesh = _explicit(J)
        named = (jax8.sharding.NamedSharding if J is jax8 else simpmd.NamedSharding)
        reshard = jax8.sharding.reshard if J is jax8 else simpmd.reshard
        x = J.device_put(X, named(mesh, P_("a", "b")))
        w = J.device_put(W, named(mesh, P_(None, "b")))
        f = {
            "scan": lambda x, w: L.scan(lambda c, r: (c @ w, c), x, None, length=3)[0],
            "fori_loop": lambda x, w: L.fori_loop(0, 3, lambda i, c: c * 2.0 + i, x),
            "fori_loop, traced bound": lambda x, w: L.fori_loop(
                0, (x[0, 0] * 0).astype(np_.int32) + 3, lambda i, c: c @ w, x),
            "while_loop": lambda x, w: L.while_loop(lambda c: c.sum() < 1e4,
                                                    lambda c: c * 2.0 + 1.0, x),
            "grad of fori_loop": lambda x, w: J.grad(
                lambda x: L.fori_loop(0, 3, lambda i, c: np_.tanh(c @ w), x).sum())(x),
            "scan changing the carry's sharding": lambda x, w: L.scan(
                lambda c, _: (reshard(c, P_()), c), x, None, length=2)[0],
            "while_loop changing the carry's sharding": lambda x, w: L.while_loop(
                lambda c: c.sum() < 1e4, lambda c: reshard(c, P_()), x),
            "scan over a split dimension": lambda x, w: L.scan(
                lambda c, r: (c + r.sum(), r), 0.0, x)[1],
        }[loop]
        with (J.set_mesh(mesh) if hasattr(J, "set_mesh") else jax8.sharding.use_mesh(mesh)):
            return J.jit(f)(x, w)
    both(jax8, make)


# -- vma, and the axis names of a collective --------------------------------------------------


@pytest.mark.parametrize("op", ["pmax", "pmin", "psum"])
def test_a_reduction_over_axes_the_value_varies_over_only_in_part(jax8, op):
    # whether it runs (JAX inserting a pvary) depends on the JAX: simpmd follows it
    from jax.sharding import AxisType

    def make(J, L, np_, _, P_):
        mesh = (simpmd.make_mesh((2, 4), ("a", "b"), axis_types=(simpmd.AxisType.Auto,) * 2)
                if J is simpmd else J.make_mesh((2, 4), ("a", "b"), axis_types=(AxisType.Auto,) * 2))
        return J.shard_map(lambda v: getattr(L, op)(v, ("a", "b")), mesh=mesh,
                           in_specs=P_("a"), out_specs=P_())(X[:2, 0])
    both(jax8, make)


def test_an_axis_typo_inside_a_tuple_is_named_with_the_nearest_axis(jax8):
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    f = simpmd.shard_map(lambda v: lax.psum(v, ("data", "modle")), mesh=mesh,
                         in_specs=P("data", "model"), out_specs=P())
    with pytest.raises(simpmd.UnboundAxisError) as info:
        f(np.ones((2, 4), np.float32))
    for fragment in ("'modle'", "'data' (size 2), 'model' (size 4)", "Did you mean 'model'?"):
        assert fragment in str(info.value)


# -- make_jaxpr prints what JAX prints ---------------------------------------------------------


PRINTED = {
    "a traced index": (lambda np_, L: lambda w, i: w[i], "wi"),
    "a traced index and a slice": (lambda np_, L: lambda w, i: w[i, 1:], "wi"),
    "a traced column": (lambda np_, L: lambda w, i: w[:, i], "wi"),
    "x % 3": (lambda np_, L: lambda w, i: w % 3, "wi"),
    "integer x % 3": (lambda np_, L: lambda w, i: (w * 0).astype(np_.int32) % 3 + i, "wi"),
    "3 % x": (lambda np_, L: lambda w, i: 3 % (i + w.astype(np_.int32)), "wi"),
    "x // 3": (lambda np_, L: lambda w, i: w // 3, "wi"),
    "clip": (lambda np_, L: lambda w, i: np_.clip(w, 0.0, 1.0), "wi"),
    "where": (lambda np_, L: lambda w, i: np_.where(w > 0, w, 0.0), "wi"),
    "round": (lambda np_, L: lambda w, i: np_.round(w), "wi"),
    "a weak type": (lambda np_, L: lambda w, i: w + L.axis_index("i") * 0.01, "wi"),
}


@pytest.mark.parametrize("name", list(PRINTED))
def test_make_jaxpr_prints_what_this_jax_prints(jax8, name):
    import jax.numpy as jnp
    make, _ = PRINTED[name]
    w, i = np.arange(12, dtype=np.float32).reshape(4, 3) - 5, np.int32(2)
    theirs = jax8.make_jaxpr(make(jnp, jax8.lax), axis_env=[("i", 4)])(w, i)
    ours = simpmd.make_jaxpr(make(snp, lax), axis_env=[("i", 4)])(w, i)
    assert str(ours) == str(theirs)
    for k in (np.int32(-1), np.int32(3)):
        if name != "a weak type":
            np.testing.assert_array_equal(np.asarray(simpmd.jit(make(snp, lax))(w, k)),
                                          np.asarray(jax8.jit(make(jnp, jax8.lax))(w, k)))


def test_conds_under_grad_with_jit_or_shard_map_agree_with_jax(engines):
    """cond's derivative is cut as every body run once is (loops.split_call): a draw of
    conds differentiated under jit, shard_map or pmap, compared with jax.grad's."""
    nested = ("jit", "shard_map", "pmap")
    draw = [p for p in N.draw(38, 2000) if "cond" in p.layers and set(p.layers) & set(nested)
            and {"grad", "value_and_grad"} & set(p.layers)][:16]
    assert len(draw) == 16 and {l for p in draw for l in p.layers} >= set(nested)
    differ = []
    for program in draw:
        if N.crashes_jax(program):
            continue
        agreed, theirs, ours, why = N.compare(*engines, program)
        if agreed is False:
            differ.append(f"{program}: {why} (jax: {theirs.error or theirs.type_text}; "
                          f"simpmd: {ours.error or ours.type_text})")
    assert not differ, "\n".join(differ)
