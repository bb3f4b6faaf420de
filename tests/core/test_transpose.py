"""simpmd.grad transposes the program: one rule per primitive, walked backwards.

Inside a body on the stacked engine, grad records the forward computation as equations of
the body's program and applies ``autodiff.TRANSPOSE_RULES[primitive]`` to them in reverse.
The expectations come from real JAX: ``jax.make_jaxpr(jax.grad(...))`` lists the backward
collectives, in order, and the matrix products a gradient needs; hand-worked values pin the
rest.
"""
import numpy as np
import pytest

import simpmd
from simpmd import lax
import simpmd.numpy as snp
from simpmd.core import autodiff, core  # noqa: F401
from simpmd.core.autodiff import NotDifferentiableError
from simpmd.api.jaxpr import body_program

N = 8
RING = [(k, (k + 1) % N) for k in range(N)]

# JAX's names for the collectives; under shard_map(check_vma=True) jax 0.10+ calls the psum
# of a varying value psum_invariant (0.7.2: psum2). pvary (pbroadcast) moves no data.
_SAME = {"psum_invariant": "psum", "psum2": "psum"}
COLLECTIVES = {"psum", "pmax", "pmin", "all_gather", "reduce_scatter", "ppermute", "all_to_all"}


def _jax_eqns(jaxpr):
    """Every equation of a jaxpr, those of its sub-jaxprs (shard_map's body) included."""
    for eqn in jaxpr.eqns:
        yield eqn
        for sub in eqn.params.values():
            inner = getattr(sub, "jaxpr", sub)
            if hasattr(inner, "eqns"):
                yield from _jax_eqns(inner)


def _summary(names_and_shapes):
    """The collectives in order (name, output shapes) and how many matrix products."""
    collectives = [(_SAME.get(n, n), shapes) for n, shapes in names_and_shapes
                   if _SAME.get(n, n) in COLLECTIVES]
    products = sum(1 for n, _ in names_and_shapes if n == "dot_general")
    return collectives, products


def _of_jax(closed):
    return _summary([(e.primitive.name, [tuple(v.aval.shape) for v in e.outvars])
                     for e in _jax_eqns(closed.jaxpr)])


def _of_simpmd(program):
    return _summary([("psum" if e.primitive.name == "pmean" else str(e.primitive),
                      [tuple(v.shape) for v in e.outvars]) for e in program.eqns])


# loss(w, x) for one device: w of shape (6, 8) unless said, x of shape (4, 6).
def _fsdp(lax, np_):
    return lambda w, x: np_.tanh(x @ lax.all_gather(w, "i", tiled=True)).sum()


def _ring(lax, np_):
    return lambda w, x: lax.psum((lax.ppermute(np_.tanh(x @ w), "i", RING) ** 2).sum(), "i")


def _all_to_all(lax, np_):
    return lambda w, x: (lax.all_to_all(x @ w, "i", 1, 1, tiled=True) ** 2).sum()


def _scatter_then_sum(lax, np_):
    return lambda w, x: lax.psum(np_.exp(lax.psum_scatter(x @ w, "i", scatter_dimension=1,
                                                          tiled=True)).sum(), "i")


BODIES = {                         # name -> (loss maker, w's shape, x's shape)
    "fsdp: all_gather forward, reduce_scatter backward": (_fsdp, (1, 6), (4, 8)),
    "ppermute then psum": (_ring, (6, 8), (4, 6)),
    "all_to_all": (_all_to_all, (6, 8), (4, 6)),
    "psum_scatter then psum": (_scatter_then_sum, (6, 8), (4, 6)),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_the_backward_collectives_are_jaxs_in_jaxs_order(jax8, name):
    make, w_shape, x_shape = BODIES[name]
    rng = np.random.default_rng(3)
    w = rng.standard_normal(w_shape).astype(np.float32)
    x = rng.standard_normal(x_shape).astype(np.float32)
    theirs = jax8.make_jaxpr(jax8.grad(make(jax8.lax, jax8.numpy)), axis_env=[("i", N)])(w, x)
    mine = simpmd.make_jaxpr(simpmd.grad(make(lax, snp)), axis_env=[("i", N)])(w, x)
    want, got = _of_jax(theirs), _of_simpmd(mine)
    assert got == want, str(mine)
    # the forward's collectives come first, then the backward's, marked so
    phases = [e.phase for e in mine.eqns if str(e.primitive) in COLLECTIVES | {"pmean"}]
    assert phases == sorted(phases, key=["forward", "backward"].index) and "backward" in phases


def test_shard_map_check_vma_transposes_psum_to_nothing_and_pvary_to_psum(jax8):
    """A replicated w meets a varying x: JAX pvary's w, whose transpose is a psum; the
    forward psum of the loss transposes to no communication at all."""
    from jax.sharding import Mesh, PartitionSpec

    def make(lax_, np_, grad):
        def body(w, x):
            return grad(lambda w: lax_.psum(np_.tanh(x @ w).sum(), "i"))(w)
        return body
    rng = np.random.default_rng(4)
    w = rng.standard_normal((6, 8)).astype(np.float32)
    x = rng.standard_normal((4 * N, 6)).astype(np.float32)
    jmesh = Mesh(np.array(jax8.devices()[:N]), ("i",))
    theirs = jax8.make_jaxpr(jax8.shard_map(make(jax8.lax, jax8.numpy, jax8.grad), mesh=jmesh,
                                            in_specs=(PartitionSpec(), PartitionSpec("i")),
                                            out_specs=PartitionSpec(), check_vma=True))(w, x)
    mesh = simpmd.make_mesh((N,), ("i",))
    f = simpmd.shard_map(make(lax, snp, simpmd.grad), mesh=mesh, in_specs=(simpmd.P(), simpmd.P("i")),
                         out_specs=simpmd.P(), check_vma=True)
    mine = body_program(f, w, x)
    assert _of_simpmd(mine) == _of_jax(theirs) == ([("psum", [()]), ("psum", [(6, 8)])], 2)
    # and the values: d/dw sum over devices of sum(tanh(x_k w)) = sum_k x_k^T (1 - tanh^2)
    got = np.asarray(f(w, x))
    t = np.tanh(x @ w)
    np.testing.assert_allclose(got, x.T @ (1 - t * t), rtol=1e-4, atol=1e-4)


def test_the_gradient_reads_only_what_it_needs():
    """grad with respect to w of sum((x @ w)^2): one product forward, one backward (x's
    cotangent is never computed, as in JAX's jaxpr: two dot_generals)."""
    x = np.ones((5, 4), np.float32)
    w = np.ones((4, 3), np.float32)
    mine = simpmd.make_jaxpr(simpmd.grad(lambda w, x: ((x @ w) ** 2).sum()),
                             axis_env=[("i", N)])(w, x)
    assert [str(e.primitive) for e in mine.eqns].count("dot_general") == 2, str(mine)


@pytest.mark.parametrize("primitive, loss", [
    ("tanh", lambda w: lax.psum(snp.tanh(w).sum(), "i")),
    ("mul", lambda w: lax.psum((w * w).sum(), "i")),
    ("reduce_sum", lambda w: lax.psum((w * w).sum(), "i")),
    ("psum", lambda w: lax.psum((w * w).sum(), "i")),
    ("all_gather", lambda w: (lax.all_gather(w, "i") ** 2).sum()),
])
def test_each_rule_comes_from_the_table(monkeypatch, primitive, loss):
    v = np.arange(2.0 * N, dtype=np.float32).reshape(N, 2) / 10
    f = simpmd.pmap(lambda v: simpmd.grad(loss)(v), "i")
    assert np.all(np.isfinite(np.asarray(f(v))))                 # with the rule: a gradient
    monkeypatch.setattr(core.PRIMITIVES[primitive], "vjp", None)      # the row loses its rule
    g = simpmd.pmap(lambda v: simpmd.grad(loss)(v), "i")
    with pytest.raises(NotDifferentiableError, match=f"'{primitive}'"):
        g(v)


def test_a_primitive_without_a_rule_is_named():
    v = np.ones((N, 3), np.float32)
    f = simpmd.pmap(lambda v: simpmd.grad(lambda v: snp.linalg.norm(v))(v), "i")
    with pytest.raises(NotDifferentiableError, match="'numpy.norm'"):
        f(v)          # a NumPy function simpmd runs per device, with no rule of its own
    g = simpmd.pmap(lambda v: simpmd.grad(lambda v: lax.pmax(v, "i").sum())(v), "i")
    with pytest.raises(NotDifferentiableError, match="'pmax' not implemented"):
        g(v)


def test_the_argument_not_its_other_uses_is_differentiated():
    """grad(lambda v: sum(v * w))(w): JAX differentiates with respect to the argument, so the
    gradient is w, not 2w, although the body closes over the same w."""
    w = np.arange(2.0 * N, dtype=np.float32).reshape(N, 2)
    f = simpmd.pmap(lambda w: simpmd.grad(lambda v: (v * w).sum())(w), "i")
    np.testing.assert_allclose(np.asarray(f(w)), w)
    np.testing.assert_allclose(np.asarray(f(w + 1)), w + 1)     # replayed


def test_a_replayed_backward_collective_is_still_logged_as_backward():
    f = simpmd.pmap(lambda v: simpmd.grad(lambda v: lax.psum((v * v).sum(), "i"))(v), "i")
    v = np.arange(2.0 * N, dtype=np.float32).reshape(N, 2)
    for call in range(2):                                        # traced, then replayed
        got = np.asarray(f(v))
        np.testing.assert_allclose(got, N * 2 * v)               # pmap: psum's transpose is psum
        assert [(c[0].op, c[0].phase) for c in f.trace.calls()] == [
            ("psum", "forward"), ("psum", "backward")], call


def test_grad_in_a_body_that_is_not_recorded_uses_its_own_program():
    """shard_map(check_vma=False) outside jit traces on every call and records no program;
    grad records its own, and the backward psum is logged as backward."""
    mesh = simpmd.make_mesh((N,), ("i",))
    v = np.arange(2.0 * N, dtype=np.float32).reshape(N, 2)
    f = simpmd.shard_map(lambda v: simpmd.grad(lambda v: lax.psum((v * v).sum(), "i"))(v),
                         mesh=mesh, in_specs=simpmd.P("i"), out_specs=simpmd.P("i"),
                         check_vma=False)
    np.testing.assert_allclose(np.asarray(f(v)), N * 2 * v)      # psum's transpose is psum
    assert [(c[0].op, c[0].phase) for c in f.trace.calls()] == [
        ("psum", "forward"), ("psum", "backward")]


def test_the_same_value_passed_twice_gets_two_gradients():
    """argnums=(0, 1) with w given twice: d/da sum(a * b * w) at a = b = w is (b*w, a*w)."""
    w = np.arange(1.0, 2.0 * N + 1, dtype=np.float32).reshape(N, 2)
    f = simpmd.pmap(lambda w: simpmd.grad(lambda a, b: (a * b * w).sum(), argnums=(0, 1))(w, w), "i")
    ga, gb = f(w)
    np.testing.assert_allclose(np.asarray(ga), w * w)
    np.testing.assert_allclose(np.asarray(gb), w * w)


def test_grad_of_grad_inside_pmap_is_the_second_derivative():
    # on every device: d/dx sum(d/dy sum(y**3)) = 6x, worked by hand
    v = np.arange(N * 3, dtype=np.float32).reshape(N, 3) / 10
    f = simpmd.pmap(lambda v: simpmd.grad(
        lambda x: simpmd.grad(lambda y: (y ** 3).sum())(x).sum())(v), "i")
    np.testing.assert_allclose(np.asarray(f(v)), 6 * v, rtol=1e-5)
