"""Issue 45's jit defects, each program run on simpmd and on the running JAX (8 fake CPU
devices): the same values, the same sharding, the same shards, or the same refusal."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax

jax = pytest.importorskip("jax")
if len(jax.devices()) < 8:
    pytest.skip("needs 8 JAX devices", allow_module_level=True)
jnp = jax.numpy
AUTO = jax.sharding.AxisType.Auto


def _shards(y):
    return sorted((tuple((s.start, s.stop) for s in sh.index), sh.data.shape)
                  for sh in y.addressable_shards)


def _spec(y):
    return tuple(y.sharding.spec)


def test_item3_jit_of_shard_map_returns_on_its_mesh():
    """``jit(shard_map(...))`` of a NumPy argument on an Auto mesh: the result lives on the
    shard_map's mesh, split as out_specs say (JAX: four (2,) shards, not one (8,))."""
    def run(eng, mesh):
        P = eng.sharding.PartitionSpec
        f = eng.jit(eng.shard_map(lambda v: v * 2, mesh=mesh, in_specs=P("x"), out_specs=P("x")))
        return f(np.arange(8.0, dtype=np.float32))
    ours = run(simpmd, simpmd.make_mesh((4,), ("x",), axis_types=(simpmd.AxisType.Auto,)))
    theirs = run(jax, jax.make_mesh((4,), ("x",), axis_types=(AUTO,)))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert _spec(ours) == _spec(theirs) == ("x",)
    assert ours.sharding.mesh.shape == dict(theirs.sharding.mesh.shape)
    assert _shards(ours) == _shards(theirs)


def test_item5_a_static_argument_of_shard_map_under_jit():
    """``in_specs=(P('x', 'y'), None)`` with the second argument static under jit."""
    def run(eng, mesh):
        P = eng.sharding.PartitionSpec
        f = eng.jit(eng.shard_map(lambda a, k: a * k, mesh=mesh, in_specs=(P("x", "y"), None),
                                  out_specs=P("x", "y")), static_argnums=1)
        return f(np.arange(32.0, dtype=np.float32).reshape(4, 8), 3.0)
    ours = run(simpmd, simpmd.make_mesh((2, 4), ("x", "y"), axis_types=(simpmd.AxisType.Auto,) * 2))
    theirs = run(jax, jax.make_mesh((2, 4), ("x", "y"), axis_types=(AUTO,) * 2))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))
    assert _spec(ours) == _spec(theirs)
    assert _shards(ours) == _shards(theirs)


def test_item6_a_product_over_an_empty_contracted_dimension():
    """``a @ b`` of f32[4,0] and f32[0,8], both split ``P(None, ('model', 'data'))``: zeros,
    typed ``float32[4,8@(model,data)]`` on both."""
    spec = P(None, ("model", "data"))
    a, b = np.zeros((4, 0), np.float32), np.zeros((0, 8), np.float32)
    mesh = simpmd.make_mesh((4, 2), ("model", "data"))
    with simpmd.set_mesh(mesh):
        ours = simpmd.jit(lambda a, b: a @ b)(simpmd.device_put(a, spec), simpmd.device_put(b, spec))
    jmesh = jax.make_mesh((4, 2), ("model", "data"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.sharding.use_mesh(jmesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(jmesh):
        jspec = jax.sharding.PartitionSpec(None, ("model", "data"))
        theirs = jax.jit(lambda a, b: a @ b)(jax.device_put(a, jspec), jax.device_put(b, jspec))
        their_type = str(jax.typeof(theirs))
    assert str(simpmd.typeof(ours)) == their_type == "float32[4,8@(model,data)]"
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


LOOPS = {
    "fori_loop": lambda L: lambda v: L.fori_loop(0, 2, lambda i, c: c * 2.0, v),
    "scan": lambda L: lambda v: L.scan(lambda c, _: (c * 2.0, None), v, None, length=2)[0],
    "while_loop": lambda L: lambda v: L.while_loop(lambda c: c.sum() < 100.0, lambda c: c * 2.0, v),
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_item12_a_loop_in_a_pmap_in_jit(loop):
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4) / 8
    ours = simpmd.jit(simpmd.pmap(LOOPS[loop](lax), axis_name="p"))(x)
    theirs = jax.jit(jax.pmap(LOOPS[loop](jax.lax), axis_name="p"))(x)
    np.testing.assert_allclose(np.asarray(ours), np.asarray(theirs))


def test_item16_a_reshape_merging_a_split_dim_with_a_whole_one():
    """``f32[8@a,4@b,6]`` to ``(8, 24, 1)``: jax 0.12 types it ``float32[8@a,24@b,1]``,
    jax 0.10.2 refuses it; simpmd asks the running JAX (and follows the newest without)."""
    x = np.arange(8 * 4 * 6, dtype=np.float32).reshape(8, 4, 6)
    mesh = simpmd.make_mesh((2, 4), ("a", "b"))
    with simpmd.set_mesh(mesh):
        try:
            ours = simpmd.jit(lambda v: v.reshape(8, 24, 1))(simpmd.device_put(x, P("a", "b", None)))
            ours = (str(simpmd.typeof(ours)), np.asarray(ours))
        except simpmd.ShardingTypeError:
            ours = "refused"
    jmesh = jax.make_mesh((2, 4), ("a", "b"), axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    with jax.sharding.use_mesh(jmesh) if hasattr(jax.sharding, "use_mesh") else jax.set_mesh(jmesh):
        try:
            y = jax.jit(lambda v: v.reshape(8, 24, 1))(
                jax.device_put(x, jax.sharding.PartitionSpec("a", "b", None)))
            theirs = (str(jax.typeof(y)), np.asarray(y))
        except Exception as exc:               # noqa: BLE001 (JAX's ShardingTypeError)
            assert "reshape is not supported" in str(exc)
            theirs = "refused"
    if theirs == "refused":
        assert ours == "refused"
    else:
        assert ours[0] == theirs[0] == "float32[8@a,24@b,1]"
        np.testing.assert_array_equal(ours[1], theirs[1])


def test_item16_without_jax_the_newest_rule():
    from simpmd.partitioner.sharding import settings
    x = np.arange(8 * 4 * 6, dtype=np.float32).reshape(8, 4, 6)
    with simpmd.set_mesh(simpmd.make_mesh((2, 4), ("a", "b"))), settings.newest():
        y = simpmd.jit(lambda v: v.reshape(8, 24, 1))(simpmd.device_put(x, P("a", "b", None)))
    assert str(simpmd.typeof(y)) == "float32[8@a,24@b,1]"
    np.testing.assert_array_equal(np.asarray(y), x.reshape(8, 24, 1))
