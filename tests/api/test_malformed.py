"""Malformed programs, written as the mistakes learners make: each gets a clear error.

Every test runs one mistake on simpmd and asserts that the message names what it must
(the device and its mesh coordinates, the axis, the shapes, the argument) and says what
to do. Where it helps, the same program runs on real JAX too (8 fake CPU devices), to pin
down that JAX refuses it as well, or, where simpmd refuses what JAX accepts, what JAX
does instead. Expected values are worked by hand.
"""
import functools
import os
import re

import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax

X = np.arange(1, 9, dtype=np.float32)            # one value per device, 1..8


def pmap(f, **kw):
    return simpmd.pmap(f, axis_name=kw.pop("axis_name", "i"), **kw)


def refused(exc_type, thunk, *fragments):
    """Run ``thunk``; it must raise ``exc_type`` whose message holds every fragment."""
    with pytest.raises(exc_type) as info:
        thunk()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} missing from:\n{message}"
    return message


def jax_refuses(jax8, thunk):
    """The same program on real JAX raises (any exception); returns it."""
    with pytest.raises(Exception) as info:
        thunk()
    return info.value


# -- accepted silently before: now refused, as JAX refuses them ----------------------------

def test_ppermute_perm_with_float_entries(jax8):
    body = lambda v: lax.ppermute(v, "i", [(0.0, 1.5), (1.0, 0.0)])
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X),
            "ppermute", "perm", "1.5", "float", "int")
    jax_refuses(jax8, lambda: jax8.pmap(body, axis_name="i")(X))


def test_collective_with_axis_name_none(jax8):
    # A pmap without axis_name binds no name; psum(x, None) must not quietly sum over it.
    for mapped in (lambda f: simpmd.pmap(f), lambda f: simpmd.pmap(f, axis_name="i")):
        refused(simpmd.UnboundAxisError, lambda: mapped(lambda v: lax.psum(v, None))(X),
                "psum", "device 0", "axis_name=None", "axis_name='i'")
    err = jax_refuses(jax8, lambda: jax8.pmap(lambda v: jax8.lax.psum(v, None))(X))
    assert "None" in str(err)


def test_in_axes_given_as_a_list(jax8):
    add = lambda a, b: a + b
    refused(ValueError, lambda: simpmd.pmap(add, in_axes=[0, None]),
            "in_axes=[0, None]", "list", "tuple", "in_axes=(0, None)")
    jax_refuses(jax8, lambda: jax8.pmap(add, in_axes=[0, None])(X, 1.0))
    # The tuple form works, and gives x + 1 on every device.
    np.testing.assert_array_equal(np.asarray(simpmd.pmap(add, in_axes=(0, None))(X, 1.0)), X + 1)


def test_body_that_returns_a_string(jax8):
    refused(TypeError, lambda: pmap(lambda v: "done")(X),
            "device 0 (i=0)", "'done'", "str", "not an array", "simpmd.debug.print")
    jax_refuses(jax8, lambda: jax8.pmap(lambda v: "done")(X))


def test_body_that_returns_a_string_inside_a_tuple():
    refused(TypeError, lambda: pmap(lambda v: (v, "label"))(X),
            "device 0 (i=0)", "'label'", "position 1")


@pytest.mark.parametrize("name, body", [
    ("np.exp", lambda v: np.exp(v)),
    ("np.absolute", lambda v: np.abs(v)),
    ("np.maximum", lambda v: np.maximum(v, 0)),
    ("np.add", lambda v: np.add(v, 1)),
    ("np.where", lambda v: np.where(v > 2, v, 0)),
    ("np.concatenate", lambda v: np.concatenate([v[None], v[None]])),
])
def test_numpy_function_on_a_device_value(jax8, name, body):
    message = refused(simpmd.TracerArrayConversionError, lambda: pmap(body)(X),
                      f"{name}()", "device 0 (i=0)", "of shape (", "simpmd.numpy", "snp.")
    assert "Real JAX refuses" in message
    err = jax_refuses(jax8, lambda: jax8.pmap(body)(X))
    assert "TracerArrayConversionError" in type(err).__name__


def test_what_jax_accepts_of_numpy_still_runs(jax8):
    """Operators with a NumPy value on the left, and NumPy functions that call the array's
    own method (np.sum calls x.sum()), run on JAX's tracers, so simpmd runs them too."""
    body = lambda v: np.float32(2) * v + np.sum(v) - np.ones((), np.float32) + abs(-v) // 1
    expected = 2 * X + X - 1 + X                  # by hand: sum of a scalar is itself
    np.testing.assert_allclose(np.asarray(pmap(body)(X)), expected)
    np.testing.assert_allclose(np.asarray(jax8.pmap(body)(X)), expected)


def test_simpmd_numpy_computes_what_numpy_refuses():
    out = pmap(lambda v: snp.where(v > 2, snp.exp(v * 0), snp.maximum(v, 5)))(X)
    np.testing.assert_array_equal(np.asarray(out), [5, 5, 1, 1, 1, 1, 1, 1])
    assert out.dtype == np.float32


def test_eager_bodies_may_use_numpy():
    # eager=True runs programs real JAX cannot run; NumPy functions are allowed there.
    out = simpmd.pmap(lambda v: np.exp(v * 0), eager=True)(X)
    np.testing.assert_array_equal(np.asarray(out), np.ones(8))


# -- misleading or incomplete messages, now clear ------------------------------------------

def test_static_broadcasted_argnums_given_as_a_name(jax8):
    scale = lambda v, n: v * n
    refused(TypeError, lambda: simpmd.pmap(scale, static_broadcasted_argnums="n"),
            "static_broadcasted_argnums='n'", "positions", "static_broadcasted_argnums=(1,)")
    jax_refuses(jax8, lambda: jax8.pmap(scale, static_broadcasted_argnums="n")(X, 2))


def test_static_broadcasted_argnums_out_of_range(jax8):
    scale = lambda v, n: v * n
    refused(ValueError, lambda: simpmd.pmap(scale, static_broadcasted_argnums=(2,))(X, 2),
            "static_broadcasted_argnums=(2,)", "2 positional argument(s)", "0..1")
    jax_refuses(jax8, lambda: jax8.pmap(scale, static_broadcasted_argnums=(2,))(X, 2))


def test_deadlock_on_1024_devices_is_summarised_as_ranges():
    simpmd.set_device_count(1024)

    def skip_one(v):                   # device 512 skips the psum: everyone else waits
        if lax.axis_index("i") != 512:
            return lax.psum(v, "i")
        return v
    message = refused(simpmd.DeadlockError,
                      lambda: pmap(skip_one, eager=True)(np.ones(1024, np.float32)),
                      "devices 0-511, 513-1023 (1023 devices)", "device 0 (i=0)",
                      "device 1023 (i=1023)", "psum", "member(s) 512 of 1024",
                      "finished without joining: device 512 (i=512)", "same order")
    assert len(message) < 3000


def test_deadlock_in_many_groups_stays_short():
    simpmd.set_device_count(1024)

    def odd_ones_skip(v):              # 512 groups of two; in each the odd device skips
        if lax.axis_index("i") % 2 == 0:
            return lax.psum(v, "i", axis_index_groups=[[k, k + 1] for k in range(0, 1024, 2)])
        return v
    message = refused(simpmd.DeadlockError,
                      lambda: pmap(odd_ones_skip, eager=True)(np.ones(1024, np.float32)),
                      "device 0 (i=0)", "504 more groups", "psum")
    assert len(message) < 3000


def test_shard_map_in_specs_given_as_a_list(jax8):
    mesh = simpmd.make_mesh((8,), ("i",))
    f = simpmd.shard_map(lambda a, b: a * b, mesh=mesh, in_specs=[P("i"), P()], out_specs=P("i"))
    refused(simpmd.ShardingError, lambda: f(X, np.float32(2)),
            "in_specs=[", "list", "tuple", "in_specs=(P('i',), P())")
    from jax.sharding import Mesh, PartitionSpec as JP
    from simpmd.jax.handoff import find_shard_map
    shard_map, check = find_shard_map(jax8)
    jax_mesh = Mesh(np.array(jax8.devices()[:8]), ("i",))
    jax_refuses(jax8, lambda: shard_map(lambda a, b: a * b, mesh=jax_mesh, in_specs=[JP("i"), JP()],
                                        out_specs=JP("i"), **{check: False})(X, np.float32(2)))


def test_shard_map_out_specs_given_as_a_list_for_a_tuple(jax8):
    mesh = simpmd.make_mesh((8,), ("i",))
    f = simpmd.shard_map(lambda a: (a, a), mesh=mesh, in_specs=P("i"), out_specs=[P("i"), P("i")])
    refused(simpmd.ShardingError, lambda: f(X), "out_specs=[", "list", "returned a tuple",
            "out_specs=(P('i',), P('i',))")
    from jax.sharding import Mesh, PartitionSpec as JP
    from simpmd.jax.handoff import find_shard_map
    shard_map, check = find_shard_map(jax8)
    jax_mesh = Mesh(np.array(jax8.devices()[:8]), ("i",))
    jax_refuses(jax8, lambda: shard_map(lambda a: (a, a), mesh=jax_mesh, in_specs=JP("i"),
                                        out_specs=[JP("i"), JP("i")], **{check: False})(X))


def test_unknown_axis_inside_shard_map_names_the_mesh_axes(jax8):
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    f = simpmd.shard_map(lambda v: lax.psum(v, "i"), mesh=mesh, in_specs=P("data"),
                         out_specs=P("data"))
    message = refused(simpmd.UnboundAxisError, lambda: f(X),
                      "psum", "device 0 (data=0, model=0)", "'i'", "mesh",
                      "'data' (size 2), 'model' (size 4)")
    assert "to the pmap" not in message


def test_out_axes_structure_blames_the_results():
    message = refused(ValueError, lambda: pmap(lambda v: (v, v), out_axes=(0, 0, 0))(X),
                      "out_axes", "results' structure", "one out_axes entry per result")
    assert "arguments" not in message


def test_out_specs_structure_blames_the_results():
    mesh = simpmd.make_mesh((8,), ("i",))
    f = simpmd.shard_map(lambda v: (v, v), mesh=mesh, in_specs=P("i"),
                         out_specs=(P("i"), P("i"), P("i")))
    message = refused(ValueError, lambda: f(X), "out_specs", "results' structure", "P(...)")
    assert "arguments" not in message


def test_all_gather_axis_out_of_range_states_the_rank(jax8):
    body = lambda v: lax.all_gather(v, "i", axis=2)
    # Each device holds shape (1,): rank 1; the gathered result has rank 2, axes -2..1.
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X.reshape(8, 1)),
            "all_gather", "device 0 (i=0)", "axis=2", "shape (1,) (rank 1)", "rank 2",
            "-2..1")
    jax_refuses(jax8, lambda: jax8.pmap(body, axis_name="i")(X.reshape(8, 1)))


def test_results_of_different_shapes_name_both_shapes():
    body = lambda v: snp.zeros(int(v), np.float32)      # device k returns k + 1 zeros
    refused(simpmd.DivergenceError, lambda: pmap(body, eager=True)(X),
            "shape (1,) float32 on device 0 (i=0)", "shape (2,) float32 on device 1 (i=1)",
            "Pad or slice")


def test_ppermute_perm_built_from_axis_index(jax8):
    body = lambda v: lax.ppermute(v, "i", [(lax.axis_index("i"), 0)])
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X),
            "ppermute", "perm", "device value", "lax.axis_index", "device 0 (i=0)",
            "for i in range(n)")
    jax_refuses(jax8, lambda: jax8.pmap(body, axis_name="i")(X))


def test_ppermute_perm_as_a_generator():
    body = lambda v: lax.ppermute(v, "i", ((k, (k + 1) % 8) for k in range(8)))
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X),
            "ppermute", "perm", "generator", "list or tuple")


def test_out_axes_out_of_range_says_what_to_use(jax8):
    # Each device returns a scalar: the stacked result has rank 1, so out_axes in -1..0.
    refused(ValueError, lambda: pmap(lambda v: v * 2, out_axes=3)(X),
            "out_axes=3", "shape ()", "rank 1", "-1..0", "None")
    jax_refuses(jax8, lambda: jax8.pmap(lambda v: v * 2, out_axes=3)(X))


def test_collective_called_outside_any_map_names_the_axis():
    # jax may be imported by other tests; simpmd then hands over to jax.lax (which raises
    # its own NameError). Without jax in the picture, simpmd's message is checked.
    import sys
    if "jax" in sys.modules:
        jax_free = ("import numpy as np; from simpmd import lax\n"
                    "try:\n    lax.psum(np.ones(3), 'batch')\n"
                    "except Exception as e:\n    print(type(e).__name__, e)\n")
        import subprocess
        out = subprocess.run([sys.executable, "-c", jax_free], capture_output=True, text=True,
                             check=True).stdout
    else:
        with pytest.raises(simpmd.UnboundAxisError) as info:
            lax.psum(np.ones(3), "batch")
        out = f"{type(info.value).__name__} {info.value}"
    for fragment in ("UnboundAxisError", "lax.psum over axis 'batch'", "outside any mapped",
                     "axis_name='batch'"):
        assert fragment in out, out


def test_mapped_axis_of_size_zero_names_the_argument(jax8):
    def body(batch):
        return batch * 2
    refused(simpmd.MappedAxisError, lambda: simpmd.pmap(body)(np.zeros((0, 3))),
            "size 0", "batch (shape (0, 3), in_axes 0)", "at least one entry")
    # jax 0.7.2 aborts the whole process here (0.10 and 0.12 raise): ask it in a child.
    import subprocess, sys
    child = subprocess.run(
        [sys.executable, "-c", "import numpy as np, jax\n"
         "jax.pmap(lambda b: b * 2)(np.zeros((0, 3)))\nprint('ran')"],
        capture_output=True, text=True, timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert child.returncode != 0 and "ran" not in child.stdout


def test_nested_outer_body_is_named_by_its_devices():
    def outer(v):
        inner = simpmd.pmap(lambda w: w * 2, axis_name="j")(v)
        return inner + lax.psum(v, "k")            # 'k' is bound by no pmap
    message = refused(simpmd.UnboundAxisError,
                      lambda: simpmd.pmap(outer, axis_name="i")(np.ones((2, 4))),
                      "the outer body at i=0 (devices 0-3 at j=0..3)", "'k'", "'i'")
    assert "SimDevice" not in message


def test_shard_map_replication_error_says_replicated():
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    f = simpmd.shard_map(lambda v: v, mesh=mesh, in_specs=P(("data", "model")), out_specs=P())
    refused(simpmd.ShardingError, lambda: f(X),
            "replicated along 'data' and 'model'", "not replicated",
            "device 1 (data=0, model=1)", "device 0 (data=0, model=0)", "lax.psum")


# -- refused where JAX accepts: the message says what JAX would do -------------------------

def test_ppermute_negative_index_is_refused_and_says_jax_wraps(jax8):
    body = lambda v: lax.ppermute(v, "i", [(0, -1)])
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X),
            "ppermute", "device 0 (i=0)", "(0, -1)", "0..7", "Real JAX", "-1 means 7")
    # What JAX does: device 7 receives device 0's value (1.0), everyone else zeros.
    out = np.asarray(jax8.pmap(body, axis_name="i")(X))
    np.testing.assert_array_equal(out, [0, 0, 0, 0, 0, 0, 0, 1])


# -- booleans in collectives: values checked against real JAX ------------------------------

POSITIVE = np.array([1, -1, 2, 3, -2, 0, 5, -4], dtype=np.float32)      # 4 positive


@pytest.mark.parametrize("op, expected, dtype", [
    (lambda v: lax.psum(v > 0, "i"), np.full(8, 4), np.int32),           # a count
    (lambda v: lax.pmean(v > 0, "i"), np.full(8, 0.5), np.float32),      # a fraction
    (lambda v: lax.pmax(v > 0, "i"), np.full(8, True), np.bool_),        # any
    (lambda v: lax.pmin(v > 0, "i"), np.full(8, False), np.bool_),       # all
    (lambda v: lax.psum(v > 0, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
     np.array([3, 3, 3, 3, 1, 1, 1, 1]), np.int32),
    (lambda v: lax.all_gather(v > 0, "i"), np.tile(POSITIVE > 0, (8, 1)), np.bool_),
    (lambda v: lax.ppermute(v > 0, "i", [(k, (k + 1) % 8) for k in range(8)]),
     np.roll(POSITIVE > 0, 1), np.bool_),
])
def test_collectives_on_booleans_match_jax(jax8, op, expected, dtype):
    out = pmap(op)(POSITIVE)
    assert out.dtype == dtype
    np.testing.assert_array_equal(np.asarray(out), expected)
    real = jax8.pmap(op, axis_name="i")(POSITIVE)
    assert real.dtype == dtype
    np.testing.assert_array_equal(np.asarray(real), expected)


def test_psum_scatter_of_booleans_is_refused_as_in_jax(jax8):
    body = lambda v: lax.psum_scatter(snp.stack([v > 0] * 8), "i")
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(POSITIVE),
            "psum_scatter", "device 0 (i=0)", "boolean", "astype")
    jax_refuses(jax8, lambda: jax8.pmap(body, axis_name="i")(POSITIVE))


# -- more mistakes of our own --------------------------------------------------------------

def test_axis_index_with_axis_name_none():
    refused(simpmd.UnboundAxisError, lambda: simpmd.pmap(lambda v: lax.axis_index(None))(X),
            "axis_index", "axis_name=None")


def test_unknown_axis_under_pmap_lists_the_names_in_scope():
    refused(simpmd.UnboundAxisError, lambda: pmap(lambda v: lax.psum(v, "j"))(X),
            "device 0 (i=0)", "'j'", "'i' (size 8)", "axis_name='j'")


def test_pshuffle_with_float_entries():
    body = lambda v: lax.pshuffle(v, "i", [1.0, 0, 2, 3, 4, 5, 6, 7])
    refused(simpmd.CollectiveArgumentError, lambda: pmap(body)(X), "pshuffle", "float")


def test_static_argnums_as_a_float():
    refused(TypeError, lambda: simpmd.pmap(lambda v, n: v * n, static_broadcasted_argnums=1.0),
            "static_broadcasted_argnums=1.0", "float")


def test_every_message_is_one_that_names_a_fix():
    """A sample of the messages above, checked for an instruction (a verb of advice)."""
    cases = [
        lambda: pmap(lambda v: lax.ppermute(v, "i", [(0.0, 1.0)]))(X),
        lambda: simpmd.pmap(lambda v: lax.psum(v, None))(X),
        lambda: pmap(lambda v: "x")(X),
        lambda: pmap(lambda v: np.exp(v))(X),
        lambda: pmap(lambda v: v, out_axes=2)(X),
    ]
    for case in cases:
        with pytest.raises(Exception) as info:
            case()
        assert re.search(r"\b(Use|use|Write|write|Give|give|Pass|pass|Return|Call|Convert)\b",
                         str(info.value)), str(info.value)
