"""Mesh, PartitionSpec and shard_map on the simulated devices, without JAX.

Expected values are worked by hand or with plain NumPy; test_shard_map_vs_jax.py runs the
same kind of programs on jax.shard_map. The last section checks that nested pmap programs
and their shard_map forms compute the same thing with the same per-device collectives.
"""
import subprocess
import sys
import warnings

import numpy as np
import pytest

import simpmd
from simpmd import P, lax


@pytest.fixture
def mesh24():
    return simpmd.make_mesh((2, 4), ("data", "model"))


# -- Mesh and PartitionSpec --------------------------------------------------------------

def test_make_mesh_is_row_major_over_the_devices_and_prints_its_axes(mesh24):
    assert repr(mesh24) == "Mesh('data': 2, 'model': 4)"
    assert list(mesh24.shape.items()) == [("data", 2), ("model", 4)]
    assert mesh24.axis_names == ("data", "model") and mesh24.size == 8
    assert mesh24.shape_tuple == (("data", 2), ("model", 4)) and mesh24.axis_sizes == (2, 4)
    np.testing.assert_array_equal(mesh24.device_ids, [[0, 1, 2, 3], [4, 5, 6, 7]])
    assert mesh24.devices[1, 2] is simpmd.devices()[6]
    small = simpmd.make_mesh((2, 2), ("a", "b"))             # the first 4, as jax.make_mesh
    np.testing.assert_array_equal(small.device_ids, [[0, 1], [2, 3]])
    same = simpmd.Mesh(np.array(simpmd.devices()).reshape(2, 4), ("data", "model"))
    assert same == mesh24 and hash(same) == hash(mesh24)
    one = simpmd.Mesh(simpmd.devices(), "i")                  # a single name as a string
    assert repr(one) == "Mesh('i': 8)"


def test_mesh_errors():
    with pytest.raises(simpmd.MappedAxisError, match=r"needs 16 devices.*set_device_count\(16\)"):
        simpmd.make_mesh((4, 4), ("a", "b"))
    with pytest.raises(simpmd.ShardingError, match="one name per axis"):
        simpmd.Mesh(np.array(simpmd.devices()).reshape(2, 4), ("data",))
    with pytest.raises(simpmd.ShardingError, match="distinct"):
        simpmd.Mesh(np.array(simpmd.devices()).reshape(2, 4), ("a", "a"))
    with pytest.raises(TypeError, match="simpmd.devices"):
        simpmd.Mesh(np.arange(4), ("i",))


def test_partition_spec_mirrors_jax():
    assert repr(P("data", None)) == "P('data', None)"
    assert repr(P("data")) == "P('data',)" and repr(P()) == "P()"
    assert repr(P(("data", "model"),)) == "P(('data', 'model'),)"
    assert P(("data",)) == P("data")                 # a one-name tuple is the name
    assert P("data") != P("data", None) and hash(P("data")) == hash(P("data", None))
    assert len(P("a", None, ("b", "c"))) == 3 and list(P("a", ("b", "c"))) == ["a", ("b", "c")]
    assert simpmd.PartitionSpec is P
    with pytest.raises(TypeError, match="axis names only"):
        P(("a", None))


def test_named_sharding_indices_match_jax_layout(mesh24):
    # The indices and replica ids jax 0.10 reports for the same mesh and specs.
    s = simpmd.NamedSharding(mesh24, P("data", None))
    assert repr(s) == "NamedSharding(mesh=Mesh('data': 2, 'model': 4), spec=P('data', None))"
    idx = s.devices_indices_map((4, 8))
    assert idx[simpmd.devices()[2]] == (slice(0, 2), slice(None))
    assert idx[simpmd.devices()[5]] == (slice(2, 4), slice(None))
    idx = simpmd.NamedSharding(mesh24, P(None, ("model", "data"))).devices_indices_map((4, 8))
    assert [idx[d][1].start for d in simpmd.devices()] == [0, 2, 4, 6, 1, 3, 5, 7]
    assert s.shard_shape((4, 8)) == (2, 8) and not s.is_fully_replicated
    assert simpmd.NamedSharding(mesh24, P()).is_fully_replicated


# -- shard_map: values -----------------------------------------------------------------------

def test_one_axis_mesh_splits_and_concatenates():
    mesh = simpmd.make_mesh((8,), ("i",))
    x = np.arange(16.0)
    f = simpmd.shard_map(lambda b: b * 2 + lax.axis_index("i"), mesh=mesh,
                         in_specs=P("i"), out_specs=P("i"))
    np.testing.assert_array_equal(np.asarray(f(x)), x * 2 + np.repeat(np.arange(8), 2))
    total = simpmd.shard_map(lambda b: lax.psum(b.sum(), "i"), mesh=mesh,
                             in_specs=P("i"), out_specs=P())(x)
    assert total.shape == () and float(total) == 120.0


def test_two_axis_mesh_collectives_over_each_axis_and_both(mesh24):
    x = np.arange(32.0).reshape(4, 8)          # device (d, m) holds x[2d:2d+2, 2m:2m+2]

    def body(b):
        return (lax.psum(b, "model"), lax.psum(b, "data"), lax.psum(b, ("data", "model")),
                lax.all_gather(b, "model", axis=1, tiled=True))
    # check_vma=False: the gathered rows are equal along 'model' in fact, but varying by
    # type, so JAX (and simpmd) refuse out_specs P("data") for them under check_vma=True
    by_model, by_data, both, gathered = simpmd.shard_map(
        body, mesh=mesh24, in_specs=P("data", "model"),
        out_specs=(P("data"), P(None, "model"), P(), P("data")), check_vma=False)(x)
    blocks = x.reshape(2, 2, 4, 2).transpose(0, 2, 1, 3)        # [d, m] -> its 2x2 block
    np.testing.assert_array_equal(np.asarray(by_model), np.concatenate(list(blocks.sum(1)), 0))
    np.testing.assert_array_equal(np.asarray(by_data), np.concatenate(list(blocks.sum(0)), 1))
    np.testing.assert_array_equal(np.asarray(both), blocks.sum((0, 1)))
    np.testing.assert_array_equal(np.asarray(gathered), x)       # gathering model rebuilds rows
    assert by_model.shape == (4, 2) and by_data.shape == (2, 8) and both.shape == (2, 2)


def test_axis_index_over_mesh_axes_and_tuples(mesh24):
    def body(b):
        z = b * 0
        return (z + lax.axis_index("data"), z + lax.axis_index("model"),
                z + lax.axis_index(("data", "model")), z + lax.axis_index(("model", "data")),
                z + lax.axis_size(("data", "model")))
    outs = simpmd.shard_map(body, mesh=mesh24, in_specs=P("data", "model"),
                            out_specs=P("data", "model"))(np.zeros((2, 4)))
    data, model, dm, md, size = (np.asarray(o) for o in outs)
    np.testing.assert_array_equal(data, [[0, 0, 0, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(model, [[0, 1, 2, 3], [0, 1, 2, 3]])
    np.testing.assert_array_equal(dm, [[0, 1, 2, 3], [4, 5, 6, 7]])
    np.testing.assert_array_equal(md, [[0, 2, 4, 6], [1, 3, 5, 7]])
    np.testing.assert_array_equal(size, np.full((2, 4), 8))


def test_tuple_entries_split_one_dimension_over_several_axes_row_major(mesh24):
    x = np.arange(8.0)
    # P(('data', 'model')): block = data * 4 + model, so device k holds x[k]
    f = simpmd.shard_map(lambda b: b * 0 + lax.axis_index("data"), mesh=mesh24,
                         in_specs=P(("data", "model")), out_specs=P(("data", "model")))
    np.testing.assert_array_equal(np.asarray(f(x)), [0, 0, 0, 0, 1, 1, 1, 1])
    # P(('model', 'data')): block = model * 2 + data, so device (d, m) holds x[2m + d]
    g = simpmd.shard_map(lambda b: b * 0 + lax.axis_index("data"), mesh=mesh24,
                         in_specs=P(("model", "data")), out_specs=P(("model", "data")))
    np.testing.assert_array_equal(np.asarray(g(x)), [0, 1, 0, 1, 0, 1, 0, 1])
    received = {e.device: e.detail for e in g.trace.events if e.kind == "receive"}
    assert received[1] == "b[2:3], shape (1,), from b of shape (8,)"
    assert received[4] == "b[1:2], shape (1,), from b of shape (8,)"


def test_unnamed_mesh_axes_replicate_the_argument(mesh24):
    x = np.arange(8.0).reshape(2, 4)
    f = simpmd.shard_map(lambda b: b * 10, mesh=mesh24, in_specs=P("data"), out_specs=P("data"))
    np.testing.assert_array_equal(np.asarray(f(x)), x * 10)
    received = {e.device: e.detail for e in f.trace.events if e.kind == "receive"}
    assert {received[i] for i in range(4)} == {"b[0:1, :], shape (1, 4), from b of shape (2, 4)"}
    assert {received[i] for i in range(4, 8)} == {"b[1:2, :], shape (1, 4), from b of shape (2, 4)"}
    w = simpmd.shard_map(lambda b: b + 1, mesh=mesh24, in_specs=P(), out_specs=P())(x)
    np.testing.assert_array_equal(np.asarray(w), x + 1)


def test_result_knows_its_shards_like_a_jax_array(mesh24):
    out = simpmd.shard_map(lambda b: b * 2, mesh=mesh24, in_specs=P("data"),
                           out_specs=P("data"))(np.arange(32.0).reshape(4, 8))
    assert repr(out).startswith("Array([[ 0.,  2.,")
    assert out.sharding == simpmd.NamedSharding(mesh24, P("data"))
    shards = out.addressable_shards
    assert [s.device.id for s in shards] == list(range(8))
    assert shards[1].index == (slice(0, 2), slice(None)) and shards[1].replica_id == 1
    assert shards[4].index == (slice(2, 4), slice(None)) and shards[4].replica_id == 0
    np.testing.assert_array_equal(shards[5].data, np.arange(16.0, 32.0).reshape(2, 8) * 2)
    assert out.devices() == set(simpmd.devices())
    np.testing.assert_array_equal(out + 1, np.arange(32.0).reshape(4, 8) * 2 + 1)


def test_pytrees_static_arguments_and_decorator_form(mesh24):
    params = {"w": np.arange(4.0), "b": np.float64(1.0)}

    @simpmd.shard_map(mesh=mesh24, in_specs=({"w": P("model"), "b": P()}, P("data"), None),
                      out_specs={"y": P("data", "model"), "n": P()})
    def f(p, x, scale):
        return {"y": (x * p["w"] + p["b"]) * scale, "n": lax.psum(1, ("data", "model"))}
    x = np.ones((2, 1))
    out = f(params, x, 3.0)
    np.testing.assert_array_equal(np.asarray(out["y"]), (np.ones((2, 4)) * np.arange(4.0) + 1) * 3)
    assert int(out["n"]) == 8
    details = [e.detail for e in f.trace.device(5).events if e.kind == "receive"]
    assert details == ["p['b'] whole (P())", "p['w'][1:2], shape (1,), from p['w'] of shape (4,)",
                       "x[1:2, :], shape (1, 1), from x of shape (2, 1)"]


def test_body_sees_local_blocks_and_refuses_what_jax_refuses(mesh24):
    shapes = []

    def body(b):
        shapes.append(b.shape)
        return b
    simpmd.shard_map(body, mesh=mesh24, in_specs=P("data", "model"),
                     out_specs=P("data", "model"))(np.zeros((4, 8)))
    assert shapes == [(2, 2)]          # traced once for all 8 devices, as in JAX
    with pytest.raises(simpmd.TracerBoolConversionError, match="device 0"):
        simpmd.shard_map(lambda b: b if b.sum() > 0 else -b, mesh=mesh24, in_specs=P("data"),
                         out_specs=P("data"))(np.ones((2, 2)))
    out = simpmd.shard_map(lambda b: b if b.sum() > 0 else -b, mesh=mesh24, in_specs=P("data"),
                           out_specs=P("data"), eager=True)(np.ones((2, 2)))
    np.testing.assert_array_equal(np.asarray(out), np.ones((2, 2)))


# -- shard_map: errors that teach ----------------------------------------------------------

def test_out_specs_replication_is_checked_and_names_the_devices(mesh24):
    f = simpmd.shard_map(lambda b: b * 2, mesh=mesh24, in_specs=P("data", "model"),
                         out_specs=P("data"))
    with pytest.raises(simpmd.ShardingError) as info:
        f(np.arange(32.0).reshape(4, 8))
    msg = str(info.value)
    assert "leaves out mesh axis 'model'" in msg
    assert "device 1 (data=0, model=1) holds" in msg and "device 0 (data=0, model=0) holds" in msg
    assert "lax.psum(..., 'model')" in msg and "P('data', 'model')" in msg
    assert info.value.trace is f.trace and [e.kind for e in f.trace.events] == ["receive"] * 8
    # only the axis that really varies is suggested for the reduction
    with pytest.raises(simpmd.ShardingError, match="varies along 'data':.*lax.psum\\(\\.\\.\\., 'data'\\)"):
        simpmd.shard_map(lambda b: b.sum(), mesh=mesh24, in_specs=P("data"),
                         out_specs=P())(np.arange(8.0).reshape(2, 4))
    # a psum over the axis makes the promise true
    out = simpmd.shard_map(lambda b: lax.psum(b, "model"), mesh=mesh24,
                           in_specs=P("data", "model"), out_specs=P("data"))(np.ones((4, 8)))
    np.testing.assert_array_equal(np.asarray(out), np.full((4, 2), 4.0))


def test_nans_in_the_same_places_are_replicated_values(mesh24):
    """A NaN equals nothing, itself included, but every device holding NaN in the same
    place holds the same value: out_specs=P('data') over the 'model' axis accepts it
    (without check_vma, where the values are what is checked) with no warning, and a NaN
    in one copy only is named in the warning."""
    x = np.where(np.arange(32).reshape(4, 8) % 3 == 0, np.nan, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = simpmd.shard_map(lambda b: lax.all_gather(b, "model", axis=1, tiled=True),
                               mesh=mesh24, in_specs=P("data", "model"), out_specs=P("data"),
                               check_vma=False)(x)
    np.testing.assert_array_equal(np.asarray(out), x)       # assert_array_equal: NaN == NaN
    y = np.ones((4, 8))
    y[0, 2] = np.nan                                        # on device 1 (data=0, model=1)
    with pytest.warns(UserWarning, match=r"device 1 \(data=0, model=1\) holds \[nan"):
        simpmd.shard_map(lambda b: b.sum(axis=1, keepdims=True), mesh=mesh24,
                         in_specs=P("data", "model"), out_specs=P("data"),
                         check_vma=False)(y)


def test_check_vma_false_warns_and_returns_the_first_copy(mesh24):
    x = np.arange(8.0).reshape(2, 4)
    with pytest.warns(UserWarning, match="first device's copy"):
        out = simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P("data"), out_specs=P(),
                               check_vma=False)(x)
    np.testing.assert_array_equal(np.asarray(out), x[:1])   # what jax 0.10 returns too
    with pytest.warns(UserWarning):
        simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P("data"), out_specs=P(),
                         check_rep=False)(x)


def test_indivisible_dimensions_name_argument_dimension_and_axis_sizes(mesh24):
    with pytest.raises(simpmd.MappedAxisError) as info:
        simpmd.shard_map(lambda a, b: a, mesh=mesh24, in_specs=(P(), P("model", "data")),
                         out_specs=P())(np.ones(3), np.ones((2, 3)))
    msg = str(info.value)
    assert "b of shape (2, 3): dimension 0 has size 2" in msg
    assert "'model' (size 4) = 4 blocks, but 4 does not divide 2" in msg
    assert "dimension 1 has size 3" in msg and "'data' (size 2)" in msg
    with pytest.raises(simpmd.MappedAxisError, match=r"'data' \(size 2\) x 'model' \(size 4\) = 8"):
        simpmd.shard_map(lambda a: a, mesh=mesh24, in_specs=P(("data", "model")),
                         out_specs=P())(np.ones(12))


def test_unknown_axis_names_list_the_mesh_axes(mesh24):
    with pytest.raises(simpmd.ShardingError,
                       match="names 'batch'.*no such axis.*'data' \\(size 2\\), 'model' \\(size 4\\)"):
        simpmd.shard_map(lambda a: a, mesh=mesh24, in_specs=P("batch"), out_specs=P("data"))(np.ones(8))
    with pytest.raises(simpmd.ShardingError, match="out_specs for out.*'batch'"):
        simpmd.shard_map(lambda a: a, mesh=mesh24, in_specs=P("data"), out_specs=P("batch"))(np.ones(8))
    with pytest.raises(simpmd.UnboundAxisError,
                       match="'batch'.*mesh has no such axis.*'data' \\(size 2\\), 'model'"):
        simpmd.shard_map(lambda a: lax.psum(a, "batch"), mesh=mesh24, in_specs=P("data"),
                         out_specs=P("data"))(np.ones(8))


@pytest.mark.parametrize("kwargs, args, error, pattern", [
    (dict(in_specs=P("data", "data"), out_specs=P()), (np.ones((2, 2)),), simpmd.ShardingError,
     "more than one dimension"),
    (dict(in_specs=P("data", None, None), out_specs=P()), (np.ones((2, 2)),), simpmd.ShardingError,
     "3 entries, but the array has rank 2"),
    (dict(in_specs=P("data"), out_specs=P("data")), (np.ones((2, 2)), np.ones(2)), None, None),
    (dict(in_specs=(P("data"), P()), out_specs=P()), (np.ones(2),), simpmd.ShardingError,
     "in_specs has 2 entries but the function was called with 1"),
    (dict(in_specs=("data",), out_specs=P()), (np.ones(2),), TypeError, "Write P\\('data'\\)"),
])
def test_bad_specs(mesh24, kwargs, args, error, pattern):
    body = (lambda *a: a[0].sum())
    if error is None:        # a single P covers every argument (a pytree prefix)
        with pytest.raises(simpmd.ShardingError, match="rank 0"):
            simpmd.shard_map(body, mesh=mesh24, **kwargs)(*args)
        return
    with pytest.raises(error, match=pattern):
        simpmd.shard_map(body, mesh=mesh24, **kwargs)(*args)


def test_in_specs_left_out_are_inferred_on_explicit_axes_and_refused_on_auto(mesh24):
    """As JAX's ``Infer``: make_mesh's Explicit axes type a NumPy argument as replicated."""
    body = lambda a: a.sum()
    assert float(np.asarray(simpmd.shard_map(body, mesh=mesh24, out_specs=P())(np.ones(2)))) == 2.0
    auto = simpmd.Mesh(np.array(simpmd.devices()).reshape(2, 4), ("data", "model"))
    with pytest.raises(TypeError, match="of type AxisType.Auto"):
        simpmd.shard_map(body, mesh=auto, out_specs=P())(np.ones(2))


def test_nesting_is_refused_with_the_mesh_form_as_advice(mesh24):
    inner = simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P(), out_specs=P())
    with pytest.raises(simpmd.ShardingError, match="inside a mapped function.*one mesh") as info:
        simpmd.pmap(lambda v: inner(v), "i")(np.ones((2, 3)))
    assert "device 0 (i=0)" in str(info.value)
    with pytest.raises(simpmd.ShardingError, match="pmap was called inside a shard_map body"):
        simpmd.shard_map(lambda b: simpmd.pmap(lambda w: w, "x")(b), mesh=mesh24,
                         in_specs=P("data"), out_specs=P("data"))(np.ones((2, 2)))
    with pytest.raises(TypeError, match="positional arguments only"):
        simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P(), out_specs=P())(b=np.ones(2))


def test_exception_on_one_device_names_its_mesh_position(mesh24):
    def body(b):
        if lax.axis_index("model") == 2:
            raise ValueError("bad block")
        return b
    with pytest.raises(simpmd.DeviceError, match=r"ValueError on device 2 \(data=0, model=2\)"):
        simpmd.shard_map(body, mesh=mesh24, in_specs=P("data", "model"),
                         out_specs=P("data", "model"), eager=True)(np.ones((2, 4)))


# -- the trace ---------------------------------------------------------------------------------

def test_trace_says_which_block_each_device_received_and_returned(mesh24):
    f = simpmd.shard_map(lambda b: lax.psum(b, "model"), mesh=mesh24,
                         in_specs=P("data", "model"), out_specs=P("data"))
    out = f(np.arange(64.0).reshape(4, 16))
    assert out.shape == (4, 4)
    received = {e.device: e.detail for e in f.trace.events if e.kind == "receive"}
    blocks = {0: "0:2, 0:4", 1: "0:2, 4:8", 2: "0:2, 8:12", 3: "0:2, 12:16",
              4: "2:4, 0:4", 5: "2:4, 4:8", 6: "2:4, 8:12", 7: "2:4, 12:16"}
    assert received == {d: f"b[{b}], shape (2, 4), from b of shape (4, 16)" for d, b in blocks.items()}
    e5 = next(e for e in f.trace.events if e.kind == "receive" and e.device == 5)
    np.testing.assert_array_equal(e5.inputs[0], np.arange(64.0).reshape(4, 16)[2:4, 4:8])
    assert e5.coords == (("data", 1, 2), ("model", 1, 4))
    returned = {e.device: e.detail for e in f.trace.events if e.kind == "return"}
    assert returned[1] == "out[0:2, :], shape (2, 4), into out of shape (4, 4)"
    assert returned[6] == "out[2:4, :], shape (2, 4), into out of shape (4, 4)"
    coll = [e for e in f.trace.events if e.kind == "collective"]
    assert {e.group for e in coll} == {(0, 1, 2, 3), (4, 5, 6, 7)}
    assert all(e.source.startswith("test_shard_map.py:") and "lax.psum" in e.code for e in coll)
    assert simpmd.last_trace() is f.trace
    text = str(f.trace)
    assert "receive b[2:4, 12:16], shape (2, 4), from b of shape (4, 16)" in text and "psum('model')" in text
    again = f(np.arange(64.0).reshape(4, 16)) is not None and str(f.trace)
    assert again == text                                       # deterministic


def test_running_a_shard_map_program_imports_no_jax_and_no_matplotlib():
    code = ("import sys, numpy as np, simpmd\n"
            "mesh = simpmd.make_mesh((2, 4), ('data', 'model'))\n"
            "f = simpmd.shard_map(lambda b: simpmd.lax.psum(b, 'model'), mesh=mesh,\n"
            "                     in_specs=simpmd.P('data', 'model'), out_specs=simpmd.P('data'))\n"
            "f(np.ones((4, 8)))\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('jax', 'matplotlib')))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- pictures ------------------------------------------------------------------------------

def test_sharding_text_lists_the_devices_of_each_block(mesh24):
    from simpmd.viz.sharding import sharding_text
    assert sharding_text((8, 8), mesh24, P("data")) == "\n".join([
        "shape (8, 8), P('data',) on Mesh('data': 2, 'model': 4)",
        "+--------+", "|  0-3   |", "+--------+", "|  4-7   |", "+--------+"])
    text = sharding_text((16,), mesh24, P(("model", "data")))
    assert "|   0    |   4    |   1    |   5    |" in text
    out = simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P(None, "model"),
                           out_specs=P(None, "model"))(np.ones((2, 8)))
    assert "|  0,4   |  1,5   |  2,6   |  3,7   |" in sharding_text(out)


def test_draw_sharding(mesh24):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from simpmd.viz.sharding import draw_sharding
    ax = draw_sharding((8, 8), mesh24, P("data", "model"))
    labels = sorted(t.get_text() for t in ax.texts)
    assert labels == sorted(f"device\n{i}" for i in range(8)) and len(ax.patches) == 8
    ax = draw_sharding(simpmd.shard_map(lambda b: b, mesh=mesh24, in_specs=P("model"),
                                        out_specs=P("model"))(np.ones(8)))
    assert sorted(t.get_text() for t in ax.texts) == [f"devices\n{i},{i + 4}" for i in range(4)]
    with pytest.raises(ValueError, match="1-D and 2-D"):
        draw_sharding((2, 2, 2), mesh24, P("data"))
    plt.close("all")


# -- nested pmap and its shard_map form ---------------------------------------------------------

def _leaf_collectives(trace):
    """Per leaf device, its collectives in order: what they were and what moved."""
    out = {}
    for e in trace.events:
        if e.kind == "collective" and e.device is not None:
            out.setdefault(e.device, []).append(
                (e.op, e.axes, e.group, e.member, sorted(e.params.items()),
                 [np.asarray(v).tolist() for v in e.inputs],
                 [np.asarray(v).tolist() for v in e.outputs], e.bytes_sent, e.bytes_received))
    return out


def test_worked_example_nested_pmap_and_shard_map_agree():
    """Outer 'data' over inner 'model': psum(x * p, 'model') * 2, then psum over 'data':
    6.0 everywhere, on nested pmap and on shard_map over a 2x2 mesh."""
    x, p = np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5)

    def inner(x, p):
        return lax.psum(x * p, "model") * 2

    nested = simpmd.pmap(lambda x, p: lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data"),
                         axis_name="data")
    want = nested(x, p)

    mesh = simpmd.make_mesh((2, 2), ("data", "model"))
    # each device's block is 1x1: take its element, and give the result its block shape back
    sharded = simpmd.shard_map(lambda xb, pb: lax.psum(inner(xb[0, 0], pb[0, 0]), "data")[None, None],
                               mesh=mesh, in_specs=P("data", "model"), out_specs=P("data", "model"))
    got = sharded(x, p)
    np.testing.assert_array_equal(np.asarray(want), np.full((2, 2), 6.0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    # The leaf devices' psum over 'model' is the same collective on both engines ...
    model_events = lambda t: {d: evs[:1] for d, evs in _leaf_collectives(t).items()}
    assert model_events(sharded.trace) == model_events(nested.trace)
    assert model_events(sharded.trace)[3][0][:3] == ("psum", ("model",), (2, 3))
    # ... and nested pmap's outer psum over 'data' (one per outer program, on its row of
    # inner results) carries the same numbers as shard_map's per-device psums over 'data'.
    outer = [e for e in nested.trace.events if e.kind == "collective" and e.device is None]
    assert [e.program for e in outer] == ["data=0", "data=1"]
    per_device = {e.device: e for e in sharded.trace.events
                  if e.kind == "collective" and e.axes == ("data",)}
    for e in outer:
        row = int(e.program[-1])
        np.testing.assert_array_equal(e.inputs[0], [per_device[2 * row + m].inputs[0].item()
                                                    for m in range(2)])
        np.testing.assert_array_equal(e.outputs[0], [per_device[2 * row + m].outputs[0].item()
                                                     for m in range(2)])
    assert {e.group for e in per_device.values()} == {(0, 2), (1, 3)}


def test_nested_pmap_and_shard_map_give_identical_leaf_logs():
    """When every collective is in the inner body, the two forms are the same program:
    same results, and every leaf device logs the same collectives with the same values."""
    x = np.arange(24.0).reshape(2, 4, 3)

    def inner(v):
        a = lax.psum(v, "model")
        b = lax.pmax(v, "data")
        c = lax.all_gather(v, ("data", "model"))
        d = lax.ppermute(v, "model", [(i, (i + 1) % 4) for i in range(4)])
        e = lax.psum_scatter(c.reshape(8, 3), ("data", "model"), tiled=True)
        return a + b + d + e.reshape(3) * lax.axis_index(("data", "model"))

    nested = simpmd.pmap(lambda v: simpmd.pmap(inner, axis_name="model")(v), axis_name="data")
    want = nested(x)
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    sharded = simpmd.shard_map(lambda blk: inner(blk[0, 0])[None, None], mesh=mesh,
                               in_specs=P("data", "model"), out_specs=P("data", "model"))
    got = sharded(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _leaf_collectives(sharded.trace) == _leaf_collectives(nested.trace)
    assert len(_leaf_collectives(sharded.trace)[5]) == 5


def test_a_simpmd_mesh_draws_with_simpmd_viz(mesh24):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    viz = pytest.importorskip("simpmd.viz")
    viz.draw_mesh(mesh24, highlight_axis="model")        # axis names come from the mesh
    plt.close("all")
