"""The engine on its own: platform, pmap's arguments, nesting, traces, and its errors.

Expected values are worked by hand or with plain NumPy; the comparison with real JAX
lives in test_vs_jax.py.
"""
import collections
import functools
import subprocess
import sys
import threading

import numpy as np
import pytest

import simpmd
from simpmd import lax


def run_with_deadline(fn, seconds=60):
    """Run fn in a thread; fail (instead of hanging the suite) if it does not return."""
    box = {}

    def target():
        try:
            box["value"] = fn()
        except BaseException as exc:     # handed back to the test
            box["error"] = exc
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"simulation did not return within {seconds} s (a hang)"
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- the platform --------------------------------------------------------------------------

def test_default_platform_has_eight_devices_that_print_like_jax():
    assert simpmd.device_count() == 8
    assert [repr(d) for d in simpmd.devices()[:2]] == ["SimDevice(id=0)", "SimDevice(id=1)"]
    assert simpmd.devices()[3].id == 3


def test_device_count_from_1_to_4096_and_hardware_label_and_topology():
    simpmd.set_device_count(1)
    assert simpmd.device_count() == 1
    simpmd.set_device_count(4096, hardware="H100")
    assert simpmd.device_count() == 4096
    assert simpmd.devices()[4095].hardware == "H100"
    simpmd.set_device_count(8, topology=(2, 4))        # the label stays when not given
    assert simpmd.platform().hardware == "H100"
    assert simpmd.devices()[5].coords == (1, 1)        # row-major: 5 = 1*4 + 1
    assert simpmd.platform().device_grid().shape == (2, 4)
    with pytest.raises(ValueError, match="outside 1"):
        simpmd.set_device_count(0)
    with pytest.raises(ValueError, match="multiply to 8"):
        simpmd.set_device_count(8, topology=(3, 3))


# -- the first program ---------------------------------------------------------------------

def test_readme_example_and_its_trace():
    f = simpmd.pmap(lambda x: lax.psum(x * 2.0, axis_name="devices"), axis_name="devices")
    out = f(np.arange(8.0))
    np.testing.assert_array_equal(np.asarray(out), np.full(8, 56.0))   # 2 * (0+...+7)
    events = f.trace.events
    assert [e.kind for e in events].count("receive") == 8
    coll = [e for e in events if e.kind == "collective"]
    assert len(coll) == 8 and {e.op for e in coll} == {"psum"}
    assert all(e.group == tuple(range(8)) for e in coll)
    # device 3 sent its 2*3 = 6 and got 56 back
    e3 = next(e for e in coll if e.device == 3)
    assert float(e3.inputs[0]) == 6.0 and float(e3.outputs[0]) == 56.0
    # float64 in, float32 computed (JAX's default, x64 off); a ring all-reduce of one
    # float32 over 8 devices: 2 * 7/8 * 4 bytes = 7 bytes each way
    assert e3.inputs[0].dtype == np.float32
    assert (e3.bytes_sent, e3.bytes_received) == (7, 7)
    assert e3.source.startswith("test_engine.py:") and "lax.psum" in e3.code
    text = str(f.trace)
    assert "psum('devices')" in text and "device 7" in text
    assert "<table" in f.trace._repr_html_()
    assert "== device 3 ==" in f.trace.per_device()
    assert simpmd.last_trace() is f.trace


def test_trace_is_deterministic_from_run_to_run():
    def body(x):
        y = lax.ppermute(x, "i", [(j, (j + 1) % 8) for j in range(8)])
        return lax.all_gather(y, "i")
    f = simpmd.pmap(body, "i")
    x = np.arange(16.0).reshape(8, 2)
    first = str(f(x) is not None and f.trace)
    second = str(f(x) is not None and f.trace)
    assert first == second


def test_result_knows_its_shards_like_a_jax_array():
    f = simpmd.pmap(lambda x: x + 1, "i", devices=simpmd.devices()[4:])
    out = f(np.arange(8.0).reshape(4, 2))
    assert out.shape == (4, 2)
    shards = out.addressable_shards
    assert [s.device.id for s in shards] == [4, 5, 6, 7]
    assert shards[1].index == (slice(1, 2), slice(None))     # as jax.Array reports it
    np.testing.assert_array_equal(shards[1].data, [[3.0, 4.0]])
    assert out.devices() == set(simpmd.devices()[4:])
    assert repr(out).startswith("Array([[1., 2.],")
    np.testing.assert_array_equal(out + 1, np.arange(8.0).reshape(4, 2) + 2)


# -- pmap's arguments ----------------------------------------------------------------------

def test_in_axes_none_broadcasts_and_prefix_pytrees_map_leaves():
    def f(params, x):
        return params["w"] * x + params["b"]
    params = {"w": np.float64(3.0), "b": np.arange(4.0)}
    out = simpmd.pmap(f, "i", in_axes=({"w": None, "b": 0}, 0))(params, np.arange(4.0))
    np.testing.assert_array_equal(np.asarray(out), 3.0 * np.arange(4.0) + np.arange(4.0))


def test_in_axes_other_and_negative_axes_and_out_axes():
    x = np.arange(24.0).reshape(2, 4, 3)                  # map the size-4 axis
    out = simpmd.pmap(lambda v: v * 10, "i", in_axes=1)(x)
    np.testing.assert_array_equal(np.asarray(out), np.moveaxis(x, 1, 0) * 10)
    out = simpmd.pmap(lambda v: v, "i", in_axes=-2, out_axes=1)(x)
    np.testing.assert_array_equal(np.asarray(out), x)    # in at axis 1, out at axis 1
    # negative out_axes counts from the end of the stacked result (jax 0.10 gets this wrong)
    out = simpmd.pmap(lambda v: v, "i", out_axes=-1)(np.arange(8.0).reshape(8, 1))
    assert out.shape == (1, 8)
    np.testing.assert_array_equal(np.asarray(out)[0], np.arange(8.0))


def test_out_axes_none_returns_one_copy_and_warns_when_devices_differ():
    out = simpmd.pmap(lambda v: lax.psum(v, "i"), "i", out_axes=None)(np.arange(8.0))
    assert out.shape == () and float(out) == 28.0
    with pytest.warns(UserWarning, match="out_axes=None"):
        out = simpmd.pmap(lambda v: v * 2, "i", out_axes=None)(np.arange(8.0))
    assert float(out) == 0.0                                 # device 0's value, as JAX returns


def test_out_axes_none_warning_counts_the_devices_it_does_not_list():
    # Devices 1-7 all differ from device 0: four are named, the other three counted.
    with pytest.warns(UserWarning) as caught:
        simpmd.pmap(lambda v: v * 2, "i", out_axes=None)(np.arange(8.0))
    text = str(caught[0].message)
    assert "device 4" in text and "device 5" not in text and "and 3 more" in text


def test_pytrees_in_and_out():
    Pair = collections.namedtuple("Pair", "a b")

    def f(tree):
        return {"sum": lax.psum(tree[0].a, "i"), "same": tree[1], "none": None,
                "pair": Pair(tree[0].b, [tree[0].a])}
    x = np.arange(4.0)
    out = simpmd.pmap(f, "i")((Pair(x, x * 2), [x + 1]))
    assert set(out) == {"sum", "same", "none", "pair"} and out["none"] is None
    np.testing.assert_array_equal(np.asarray(out["sum"]), np.full(4, 6.0))
    np.testing.assert_array_equal(np.asarray(out["same"][0]), x + 1)
    assert isinstance(out["pair"], Pair)
    np.testing.assert_array_equal(np.asarray(out["pair"].b[0]), x)


def test_static_broadcasted_argnums_are_plain_python_values():
    def f(x, mode):
        if mode == "double":          # fine: a static argument is a Python value
            return x * 2
        return x
    g = simpmd.pmap(f, "i", static_broadcasted_argnums=1)
    np.testing.assert_array_equal(np.asarray(g(np.arange(4.0), "double")), np.arange(4.0) * 2)
    with pytest.raises(TypeError, match="not hashable"):
        simpmd.pmap(lambda x, s: x, "i", static_broadcasted_argnums=(1,))(np.ones(2), [1, 2])


def test_axis_size_without_mapped_arguments():
    out = simpmd.pmap(lambda v: v + lax.axis_index("i"), "i", in_axes=None, axis_size=4)(np.zeros(2))
    np.testing.assert_array_equal(np.asarray(out), [[0, 0], [1, 1], [2, 2], [3, 3]])


def test_decorator_forms():
    @simpmd.pmap
    def double(x):
        return x * 2
    np.testing.assert_array_equal(np.asarray(double(np.arange(3.0))), [0.0, 2.0, 4.0])

    @functools.partial(simpmd.pmap, axis_name="i")
    def total(x):
        return lax.psum(x, "i")
    np.testing.assert_array_equal(np.asarray(total(np.arange(3.0))), [3.0, 3.0, 3.0])
    with pytest.raises(TypeError, match="functools.partial"):
        simpmd.pmap(axis_name="i")


def test_psum_of_a_python_constant_is_the_axis_size():
    out = simpmd.pmap(lambda v: v * 0 + lax.psum(1, "i"), "i")(np.arange(5.0))
    np.testing.assert_array_equal(np.asarray(out), np.full(5, 5.0))


# -- nested pmap -----------------------------------------------------------------------------

def nested_worked_example():
    def inner(x, p):
        return lax.psum(x * p, "model") * 2

    def outer(x, p):
        return lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data")
    return simpmd.pmap(outer, axis_name="data")


def test_nested_worked_example_gives_six_not_twelve():
    # By hand: devices hold x*p = 0, .5 | 1, 1.5; psum over 'model' (rows) gives .5 and 2.5,
    # times 2 gives 1 and 5; psum over 'data' adds the two rows column by column: 6.
    f = nested_worked_example()
    out = f(np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5))
    np.testing.assert_array_equal(np.asarray(out), np.full((2, 2), 6.0))
    groups = {e.group for e in f.trace.events if e.op == "psum" and e.axes == ("model",)}
    assert groups == {(0, 1), (2, 3)}                      # row-major device grid


def test_nested_collectives_over_inner_outer_and_both_axes_on_2x4():
    x = np.arange(8.0).reshape(2, 4)

    def inner(v):
        return (lax.psum(v, "model"), lax.psum(v, "data"), lax.psum(v, ("data", "model")),
                lax.axis_index(("data", "model")), lax.all_gather(v, ("data", "model")))
    out = simpmd.pmap(lambda v: simpmd.pmap(inner, "model")(v), "data")(x)
    by_model, by_data, both, index, gathered = (np.asarray(o) for o in out)
    np.testing.assert_array_equal(by_model, np.repeat(x.sum(1, keepdims=True), 4, 1))
    np.testing.assert_array_equal(by_data, np.repeat(x.sum(0, keepdims=True), 2, 0))
    np.testing.assert_array_equal(both, np.full((2, 4), 28.0))
    np.testing.assert_array_equal(index, np.arange(8).reshape(2, 4))     # row-major
    np.testing.assert_array_equal(gathered, np.broadcast_to(np.arange(8.0), (2, 4, 8)))


def test_nested_grid_larger_than_the_platform_is_refused():
    simpmd.set_device_count(4)
    f = simpmd.pmap(lambda v: simpmd.pmap(lambda w: w, "model")(v), "data")
    with pytest.raises(simpmd.MappedAxisError, match="2 x model=4 = 8 devices"):
        f(np.zeros((2, 4)))


# -- refusing what JAX refuses -------------------------------------------------------------

@pytest.mark.parametrize("body, error", [
    (lambda x: x if x.sum() > 0 else -x, simpmd.TracerBoolConversionError),
    (lambda x: x * int(x[0]), simpmd.ConcretizationTypeError),       # as JAX 0.10 raises
    (lambda x: x * float(x[0]), simpmd.ConcretizationTypeError),
    (lambda x: x * [1.0, 2.0][lax.axis_index("i")], simpmd.TracerIntegerConversionError),
    (lambda x: np.asarray(x), simpmd.TracerArrayConversionError),
])
def test_value_dependent_python_is_refused_as_in_jax(body, error):
    with pytest.raises(error) as info:
        simpmd.pmap(body, "i")(np.ones((2, 3)))
    assert "device 0" in str(info.value) and "JAX" in str(info.value)


def test_eager_mode_runs_it_and_says_so():
    f = simpmd.pmap(lambda x: x if x.sum() > 0 else -x, "i", eager=True)
    np.testing.assert_array_equal(np.asarray(f(np.array([-1.0, 2.0]))), [1.0, 2.0])
    assert "EAGER RUN" in str(f.trace)


def test_values_are_immutable_and_at_updates_work():
    with pytest.raises(simpmd.DeviceError, match="at\\[i\\].set"):
        simpmd.pmap(lambda x: x.__setitem__(0, 1.0), "i")(np.zeros((2, 2)))
    out = simpmd.pmap(lambda x: x.at[0].set(5.0).at[1].add(1.0), "i")(np.zeros((2, 2)))
    np.testing.assert_array_equal(np.asarray(out), [[5.0, 1.0], [5.0, 1.0]])


# -- errors that teach ---------------------------------------------------------------------

def test_mismatched_mapped_sizes_name_each_argument():
    with pytest.raises(simpmd.MappedAxisError) as info:
        simpmd.pmap(lambda a, b: a + b, "i")(np.ones(4), np.ones((2, 3)))
    msg = str(info.value)
    assert "a: shape (4,)" in msg and "b: shape (2, 3)" in msg and "in_axes=None" in msg


def test_rank0_mapped_argument_explains_itself():
    with pytest.raises(simpmd.MappedAxisError, match="scalar.*Real JAX refuses it too.*in_axes=None"):
        simpmd.pmap(lambda lr, x: x * lr, "i")(0.1, np.ones(8))


def test_mapped_size_larger_than_device_count():
    with pytest.raises(simpmd.MappedAxisError, match=r"size 9.*only 8.*set_device_count\(9\)"):
        simpmd.pmap(lambda x: x, "i")(np.ones(9))


def test_unbound_axis_lists_names_in_scope():
    with pytest.raises(simpmd.UnboundAxisError, match="'batch'.*in scope: 'i'"):
        simpmd.pmap(lambda x: lax.psum(x, "batch"), "i")(np.ones(8))


def test_divergent_collectives_name_both_devices():
    def body(x):
        if lax.axis_index("i") == 3:
            return lax.pmax(x, "i")
        return lax.psum(x, "i")
    with pytest.raises(simpmd.DivergenceError, match="device 0.*psum.*device 3.*pmax"):
        run_with_deadline(lambda: simpmd.pmap(body, "i", eager=True)(np.ones(8)))


def test_same_collective_with_different_shapes_diverges():
    def body(x):
        y = x[:1] if lax.axis_index("i") == 1 else x
        return lax.psum(y, "i")
    with pytest.raises(simpmd.DivergenceError, match=r"float32\[2\].*float32\[1\]"):
        run_with_deadline(lambda: simpmd.pmap(body, "i", eager=True)(np.ones((4, 2))))


def test_deadlock_is_reported_not_waited_on():
    def body(x):
        if lax.axis_index("i") < 4:
            return lax.psum(x, "i")
        return x
    with pytest.raises(simpmd.DeadlockError) as info:
        run_with_deadline(lambda: simpmd.pmap(body, "i", eager=True)(np.ones(8)))
    msg = str(info.value)
    assert "device 0 (i=0)" in msg and "psum" in msg and "member(s) 4-7 of 8" in msg
    assert "finished without joining: device 4" in msg


@pytest.mark.parametrize("body, pattern", [
    (lambda x: lax.ppermute(x, "i", [(0, 1), (2, 1)]), "repeats destination \\[1\\]"),
    (lambda x: lax.ppermute(x, "i", [(0, 1), (0, 2)]), "repeats source \\[0\\]"),
    (lambda x: lax.ppermute(x, "i", [(0, 9)]), "outside the axis \\(size 4\\)"),
    (lambda x: lax.pshuffle(x, "i", [0, 0, 1, 2]), "permutation of 0..3"),
    (lambda x: lax.psum_scatter(x, "i", tiled=True), "does not split into 4"),
    (lambda x: lax.psum_scatter(x, "i"), "must equal the group size 4"),
    (lambda x: lax.all_to_all(x, "i", 0, 0), "must equal the group size 4"),
    (lambda x: lax.psum(x, "i", axis_index_groups=[[0, 1], [1, 2]]), "exactly once"),
    (lambda x: lax.all_gather(x, "i", axis_index_groups=[[0], [1, 2, 3]]), "equal size"),
])
def test_bad_collective_arguments(body, pattern):
    with pytest.raises(simpmd.CollectiveArgumentError, match=pattern) as info:
        run_with_deadline(lambda: simpmd.pmap(body, "i")(np.ones((4, 6))))
    assert "device 0" in str(info.value) and "('i',)" in str(info.value)


def test_exception_on_one_device_names_it_and_keeps_the_other_logs():
    def body(x):
        if lax.axis_index("i") == 3:
            raise ZeroDivisionError("bad shard")
        return lax.psum(x, "i")
    before = threading.active_count()
    for _ in range(3):                                   # worker threads are reused, not leaked
        with pytest.raises(simpmd.DeviceError, match="ZeroDivisionError on device 3") as info:
            run_with_deadline(lambda: simpmd.pmap(body, "i", eager=True)(np.ones(8)))
    assert isinstance(info.value.original, ZeroDivisionError) and info.value.device == 3
    waiting = [e for e in info.value.trace.events if "still waiting in psum" in e.detail]
    assert sorted(e.device for e in waiting) == [0, 1, 2, 4, 5, 6, 7]
    assert threading.active_count() <= before + 8
    # and the engine still works afterwards
    np.testing.assert_array_equal(
        np.asarray(simpmd.pmap(lambda x: lax.psum(x, "i"), "i")(np.ones(8))), np.full(8, 8.0))


def test_lax_outside_a_simulation_without_jax_says_where_to_call_it():
    code = ("import simpmd, sys\n"
            "try:\n    simpmd.lax.psum(1.0, 'i')\n"
            "except simpmd.UnboundAxisError as e:\n    print('OK', 'jax' in sys.modules, e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.startswith("OK False") and "simpmd.pmap" in out.stdout


def test_jax_numpy_on_a_simulated_value_points_to_simpmd_numpy(jax8):
    import jax.numpy as jnp
    with pytest.raises(simpmd.TracerArrayConversionError, match="simpmd.numpy") as info:
        simpmd.pmap(lambda x: jnp.exp(x), "i")(np.ones(8))
    assert "device 0" in str(info.value)
    out = simpmd.pmap(lambda x: simpmd.numpy.exp(x), "i")(np.zeros(8))
    np.testing.assert_array_equal(np.asarray(out), np.ones(8))


def test_debug_print_prints_per_device_and_logs_it(capsys):
    def body(x):
        simpmd.debug.print("x = {}", x)
        return x
    f = simpmd.pmap(body, "i")
    f(np.arange(3.0))
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[device 0 (i=0)] x = 0.0", "[device 1 (i=1)] x = 1.0",
                     "[device 2 (i=2)] x = 2.0"]
    assert [e.detail for e in f.trace.events if e.kind == "print"] == ["x = 0.0", "x = 1.0", "x = 2.0"]


def test_nested_result_shards_live_on_the_grid_devices():
    f = simpmd.pmap(lambda x: simpmd.pmap(lambda v: lax.psum(v, "model"), "model")(x), "data")
    out = f(np.arange(4.0).reshape(2, 2))
    placed = {s.device.id: (s.index, float(s.data.ravel()[0])) for s in out.addressable_shards}
    assert placed[2] == ((slice(1, 2), slice(0, 1)), 5.0)      # row data=1 ran on devices 2, 3
    assert {d.id for d in out.devices()} == {0, 1, 2, 3}


def test_repeated_devices_are_refused():
    with pytest.raises(ValueError, match=r"device\(s\) \[0\] more than once"):
        simpmd.pmap(lambda x: x, "i", devices=[simpmd.devices()[0]] * 4)(np.arange(4.0))


def test_axis_index_groups_appear_in_the_trace():
    f = simpmd.pmap(lambda x: lax.pmax(x, "i", axis_index_groups=[[0, 1], [2, 3]]), "i")
    f(np.arange(4.0))
    e = next(e for e in f.trace.events if e.op == "pmax")
    assert e.params["axis_index_groups"] == ((0, 1), (2, 3)) and e.group == (0, 1)
    assert "axis_index_groups" in str(f.trace)


def test_two_groupings_of_one_axis_in_one_program():
    simpmd.set_device_count(4)

    def body(x):
        return (lax.psum(x, "i", axis_index_groups=[[0, 1], [2, 3]]),
                lax.psum(x, "i", axis_index_groups=[[0, 2], [1, 3]]))
    pairs, strided = simpmd.pmap(body, "i")(np.array([1.0, 10.0, 100.0, 1000.0]))
    np.testing.assert_array_equal(np.asarray(pairs), [11.0, 11.0, 1100.0, 1100.0])
    np.testing.assert_array_equal(np.asarray(strided), [101.0, 1010.0, 101.0, 1010.0])


def test_trace_shows_zero_valued_parameters():
    f = simpmd.pmap(lambda x: lax.all_to_all(x, "i", 0, 1), "i")
    f(np.zeros((4, 4, 2)))
    assert "split_axis=0" in str(f.trace)
