"""Trace to a program once per signature, as JAX does: cache it, replay it, print it.

Expectations come from real JAX (jax.pmap run beside simpmd on 8 fake CPU devices), from
hand-worked values, and from running the same body one program per device
(``eager=True``), which traces nothing and so is an independent oracle for what a cached
program computes.
"""
import numpy as np
import pytest

import simpmd
from simpmd import lax
import simpmd.numpy as snp

from test_trace_once import BODIES, V, W, X

X8 = np.arange(8.0, dtype=np.float32)


def _impure():
    calls = []

    def f(x):
        calls.append(1)
        if len(calls) == 1:          # impure: only the first trace reduces
            x = lax.psum(x, "i")
        return x
    return f, calls


def test_the_impure_program_traces_once_and_keeps_its_psum():
    f, calls = _impure()
    g = simpmd.pmap(f, axis_name="i")
    first, second = np.asarray(g(X8)), np.asarray(g(X8))
    assert len(calls) == 1
    np.testing.assert_array_equal(first, np.full(8, 28.0))     # 0 + 1 + ... + 7
    np.testing.assert_array_equal(second, np.full(8, 28.0))    # the traced psum, not Python's branch
    third = np.asarray(g(np.ones((8, 2), np.float32)))          # a new shape traces again
    assert len(calls) == 2
    np.testing.assert_array_equal(third, np.ones((8, 2)))      # ... and takes the other branch


def test_the_impure_program_on_jax_gives_the_same_answers(jax8):
    f, calls = _impure()
    g = jax8.pmap(f, axis_name="i")
    first, second = np.asarray(g(X8)), np.asarray(g(X8))
    third = np.asarray(g(np.ones((8, 2), np.float32)))
    s, s_calls = _impure()
    h = simpmd.pmap(s, axis_name="i")
    mine = [np.asarray(h(X8)), np.asarray(h(X8)), np.asarray(h(np.ones((8, 2), np.float32)))]
    for a, b in zip([first, second, third], mine):
        np.testing.assert_array_equal(a, b)
    assert len(calls) == len(s_calls) == 2


def test_what_makes_a_new_signature_matches_jax(jax8):
    """Counted on both engines: a second wrapper of the same function, float64 for float32
    (both become float32 without x64), an int argument, a new shape, a static argument."""
    def count(pmap):
        calls = []

        def f(x, k):
            calls.append(1)
            return x * k
        steps = [
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(X8, 2),
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(X8, 2),      # new wrapper
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(X8.astype(np.float64), 2),
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(np.arange(8), 2),
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(np.ones((8, 3), np.float32), 2),
            lambda: pmap(f, "i", static_broadcasted_argnums=1)(X8, 3),        # new static value
        ]
        seen = []
        for step in steps:
            step()
            seen.append(len(calls))
        return seen
    assert count(simpmd.pmap) == count(jax8.pmap)


def test_print_in_the_body_runs_once_per_signature_and_debug_print_every_call(capsys):
    def body(x):
        print("tracing")
        simpmd.debug.print("x={}", x)
        return x * 2
    g = simpmd.pmap(body, "i")
    g(X8)
    g(X8 + 1)
    out = capsys.readouterr().out.splitlines()
    assert out.count("tracing") == 1
    assert [line for line in out if "x=" in line][-8:] == [
        f"[device {k} (i={k})] x={float(k + 1)}" for k in range(8)]


@pytest.mark.parametrize("name", list(BODIES))
def test_a_cached_program_computes_what_each_device_would(name):
    """The second call runs the program recorded on the first, on other values; it must
    agree with running the body per device on those values."""
    body = BODIES[name]
    once = simpmd.pmap(body, "i", in_axes=(0, 0, None))
    once(X, V, W)
    x2, v2, w2 = X * 1.5 - 0.25, V[::-1].copy(), W * -2.0
    got = once(x2, v2, w2)
    expected = simpmd.pmap(body, "i", in_axes=(0, 0, None), eager=True)(x2, v2, w2)
    g_leaves, e_leaves = simpmd.api.tree.flatten(got)[0], simpmd.api.tree.flatten(expected)[0]
    assert len(g_leaves) == len(e_leaves)
    for g, e in zip(g_leaves, e_leaves):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, (name, g.shape, e.shape)
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_a_cached_call_logs_the_collectives_at_the_learners_line():
    def body(x):
        y = x * 2
        return lax.psum(y, "i")                 # the line the log must name
    g = simpmd.pmap(body, "i")
    g(X8)
    first = [(e.op, e.source, e.code) for e in g.trace.events if e.kind == "collective"]
    g(X8 + 1)
    second = [(e.op, e.source, e.code) for e in g.trace.events if e.kind == "collective"]
    assert second == first and len(second) == 8
    assert second[0][2] == 'return lax.psum(y, "i")                 # the line the log must name'
    assert [float(e.outputs[0]) for e in g.trace.events if e.kind == "collective"] == [72.0] * 8   # 2 * (1 + ... + 8)


def test_a_gradient_in_the_body_is_part_of_the_program():
    def step(w, x):
        g = simpmd.grad(lambda w: ((x @ w) ** 2).sum())(w)
        return w - 0.1 * lax.pmean(g, "i")
    f = simpmd.pmap(step, "i", in_axes=(None, 0))
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 3)).astype(np.float32)
    xs = [rng.standard_normal((8, 5, 4)).astype(np.float32) for _ in range(2)]
    f(w, xs[0])
    got = np.asarray(f(w, xs[1]))               # replayed: forward and backward
    grads = [2 * x.T @ (x @ w) for x in xs[1]]  # d/dw sum((xw)^2) = 2 x^T x w, per device
    expected = w - 0.1 * np.mean(grads, axis=0)
    np.testing.assert_allclose(got, np.broadcast_to(expected, (8, 4, 3)), rtol=1e-5, atol=1e-5)


def test_a_nested_pmap_is_traced_once_and_replayed_with_the_outer_body():
    """As JAX traces a pmap-of-vmap once: both bodies run on the first call only, and the
    second call's values are the new ones (worked by hand: psum over 'j' of each row)."""
    calls = []

    def outer(x):
        calls.append("outer")
        return simpmd.pmap(lambda v: (calls.append("inner"), lax.psum(v, "j"))[1], "j")(x) \
            + lax.axis_index("i")
    f = simpmd.pmap(outer, "i")
    x = np.arange(8.0).reshape(2, 4)
    f(x)
    got = np.asarray(f(x * 10))
    assert calls == ["outer", "inner"]
    np.testing.assert_array_equal(got, np.array([[60.0] * 4, [221.0] * 4]))
    text = str(f.trace.program)               # the inner program printed inside, as jax 0.7 does
    assert "= xla_pmap[\n      axis_name=j\n      axis_size=4\n      call_jaxpr={ lambda" in text
    assert "psum[axes=('j',)" in text
    got = np.asarray(f(np.ones((2, 3))))                 # a new shape traces both again
    assert calls == ["outer", "inner"] * 2
    np.testing.assert_array_equal(got, np.array([[3.0] * 3, [4.0] * 3]))


def test_a_nested_body_that_closes_over_an_outer_value_gets_it_as_an_input():
    """The inner body reads ``y`` of the outer body without being passed it. As JAX does,
    simpmd traces both bodies once: ``y`` becomes an input of the inner program (a
    constvar, printed before the ';') and of the xla_pmap equation, so the second call
    computes with its own ``y``, not the first call's."""
    calls = []

    def outer(x):
        calls.append("outer")
        y = x.sum()
        return simpmd.pmap(lambda z: z + y, axis_name="j")(x)
    f = simpmd.pmap(outer, axis_name="i")
    x = np.arange(8.0).reshape(2, 4)
    f(x)
    got = np.asarray(f(x + 10))
    assert calls == ["outer"]
    expected = (x + 10) + (x + 10).sum(axis=1, keepdims=True)
    np.testing.assert_array_equal(got, expected)
    nested = f.trace.program.eqns[-1]
    assert nested.primitive.name == "xla_pmap" and len(nested.invars) == 2
    inner = nested.params["call_jaxpr"]
    assert str(inner).startswith("{ lambda a:f32[]; b:f32[]. let")   # float64 in, as JAX: float32


def test_three_nested_bodies_reading_both_outer_bodies_are_traced_once():
    calls = []

    def first(x):
        calls.append(1)
        a = x.sum()

        def second(y):
            calls.append(2)
            b = y.sum() * 10
            return simpmd.pmap(lambda z: z + a + b, axis_name="k")(y)
        return simpmd.pmap(second, axis_name="j")(x)
    f = simpmd.pmap(first, axis_name="i")
    x = np.arange(8.0).reshape(2, 2, 2)
    for shift in (0, 100):
        got = np.asarray(f(x + shift))
        v = x + shift
        expected = v + v.sum(axis=(1, 2), keepdims=True) + 10 * v.sum(axis=2, keepdims=True)
        np.testing.assert_array_equal(got, expected)
    assert calls == [1, 2]


def test_shard_map_outside_jit_traces_on_every_call_as_in_jax():
    calls = []
    mesh = simpmd.make_mesh((8,), ("i",))

    def body(v):
        calls.append(1)
        return lax.psum(v, "i")
    f = simpmd.shard_map(body, mesh=mesh, in_specs=simpmd.P("i"), out_specs=simpmd.P())
    f(X8)
    f(X8)
    assert len(calls) == 2


def test_shard_map_outside_jit_traces_on_every_call_on_jax(jax8):
    calls = []
    from jax.sharding import Mesh, PartitionSpec as JP
    mesh = Mesh(np.array(jax8.devices()[:8]), ("i",))

    def body(v):
        calls.append(1)
        return jax8.lax.psum(v, "i")
    shard_map = getattr(jax8, "shard_map", None)
    if shard_map is None:
        from jax.experimental.shard_map import shard_map
    f = shard_map(body, mesh=mesh, in_specs=JP("i"), out_specs=JP())
    f(X8)
    f(X8)
    assert len(calls) == 2


def test_pmap_with_no_devices_says_which_argument_and_what_to_pass():
    with pytest.raises(ValueError, match=r"devices=\[\].*simpmd.devices\(\)"):
        simpmd.pmap(lambda x: x, "i", devices=[])(X8)


# -- make_jaxpr beside jax.make_jaxpr ------------------------------------------------------------

COLLECTIVES = {"psum", "pmax", "pmin", "all_gather", "reduce_scatter", "ppermute", "all_to_all",
               "axis_index"}

# Bodies of one device's x (4, 6) and w (6, 8): not the ones simpmd's printer was written on.
JAXPR_BODIES = {
    "data-parallel step": lambda x, w: w - 0.1 * lax.pmean(x.T @ snp.tanh(x @ w), "i"),
    "sequence of collectives": lambda x, w: lax.ppermute(
        lax.all_gather(x.sum(0), "i", tiled=True), "i", [(k, (k + 1) % 8) for k in range(8)]),
    "reduce-scatter, max, index": lambda x, w: (
        lax.psum_scatter(snp.ones((8, 6), np.float32) * x[0], "i"),
        lax.pmax(x, "i") * lax.axis_index("i"), lax.pmin(w.max(), "i")),
    "all_to_all": lambda x, w: lax.all_to_all(snp.concatenate([x, x], axis=0), "i", 0, 1,
                                              tiled=True),
    "grad of a psum": lambda x, w: snp.exp(lax.psum((x @ w).sum(), "i")),
}


def _collectives_of_jax(jaxpr):
    found = []
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name in COLLECTIVES:
            found.append((name, [tuple(v.aval.shape) for v in eqn.outvars],
                          [str(v.aval.dtype) for v in eqn.outvars]))
        for sub in eqn.params.values():
            inner = getattr(sub, "jaxpr", None)
            if inner is not None and hasattr(inner, "eqns"):
                found += _collectives_of_jax(inner)
    return found


def _collectives_of_simpmd(program):
    found = []
    for eqn in program.eqns:
        name = "psum" if eqn.primitive.name == "pmean" else eqn.primitive.name
        if name in COLLECTIVES:
            found.append((name, [tuple(v.shape) for v in eqn.outvars],
                          [str(v.dtype) for v in eqn.outvars]))
    return found


@pytest.mark.parametrize("name", list(JAXPR_BODIES))
def test_make_jaxpr_lists_the_collectives_jax_lists(jax8, name):
    body = JAXPR_BODIES[name]
    rng = np.random.default_rng(2)
    x = rng.standard_normal((4, 6)).astype(np.float32)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    jax_body = body
    if name == "grad of a psum":          # the gradient of the same body, on both engines
        theirs = jax8.make_jaxpr(jax8.grad(lambda w, x: body(x, w).sum()), axis_env=[("i", 8)])(w, x)
        mine = simpmd.make_jaxpr(simpmd.grad(lambda w, x: body(x, w).sum()), axis_env=[("i", 8)])(w, x)
    else:
        theirs = jax8.make_jaxpr(jax_body, axis_env=[("i", 8)])(x, w)
        mine = simpmd.make_jaxpr(body, axis_env=[("i", 8)])(x, w)
    assert _collectives_of_simpmd(mine) == _collectives_of_jax(theirs.jaxpr), str(mine)
    # about as many equations (JAX adds conversions and broadcasts; simpmd fuses none away)
    n_jax, n_mine = len(theirs.jaxpr.eqns), len(mine.eqns)
    assert n_mine <= 2 * n_jax + 2 and n_jax <= 3 * n_mine + 2, (n_mine, n_jax, str(mine))


def test_make_jaxpr_prints_in_jaxs_notation():
    text = str(simpmd.make_jaxpr(lambda x: lax.psum(x * 2.0, "i"), axis_env=[("i", 8)])(
        np.ones(3, np.float32)))
    assert text == ("{ lambda ; a:f32[3]. let\n"
                    "    b:f32[3] = mul a 2.0:f32[]\n"
                    "    c:f32[3] = psum[axes=('i',) axis_index_groups=None] b\n"
                    "  in (c,) }")


def test_make_jaxpr_of_a_pmapped_function_shows_its_body():
    f = simpmd.pmap(lambda v: lax.all_gather(v, "i"), "i")
    program = simpmd.make_jaxpr(f)(np.ones((8, 3), np.float32))
    assert [e.primitive.name for e in program.eqns] == ["all_gather"]
    assert program.eqns[0].outvars[0].shape == (8, 3)
    assert [v.shape for v in program.in_avals] == [(3,)]
