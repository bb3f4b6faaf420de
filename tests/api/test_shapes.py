"""Shapes without values (issue 31): ShapeDtypeStruct, eval_shape, and every front end run
on types alone.

Expectations come from real JAX (jax.eval_shape, jax.ShapeDtypeStruct) or from the same
program run on arrays: a run on shapes must give the types and the log (shapes, dtypes,
bytes, groups) that the run on values gives, without computing anything.
"""
from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

import simpmd
import simpmd.cost
import simpmd.numpy as snp
from simpmd import P, lax

import jax_cases

S = simpmd.ShapeDtypeStruct


def _bf16():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    return np.dtype(ml_dtypes.bfloat16)


# -- the struct ------------------------------------------------------------------------------

def test_shape_dtype_struct_reads_and_prints_as_jaxs(jax8):
    for shape, dtype in (((4, 8), np.float32), ((), np.int32), ((2, 3, 5), "bfloat16")):
        ours, theirs = S(shape, dtype), jax8.ShapeDtypeStruct(shape, dtype)
        assert repr(ours) == repr(theirs)
        assert (ours.shape, ours.dtype, ours.ndim, ours.size) == (
            theirs.shape, theirs.dtype, theirs.ndim, theirs.size)
    assert S((2,), "bfloat16") == S((2,), snp.bfloat16) != S((2,), np.float16)
    assert len({S((2,), np.float32), S((2,), np.float32)}) == 1


def test_bfloat16_is_spelled_as_jax_spells_it_without_importing_jax():
    """simpmd.numpy.bfloat16 comes from ml_dtypes (which jaxlib brings) when JAX is absent."""
    _bf16()
    code = ("import sys, simpmd, simpmd.numpy as snp\n"
            "s = simpmd.ShapeDtypeStruct((2,), snp.bfloat16)\n"
            "print(s.dtype.name, 'jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["bfloat16", "False"]


# -- eval_shape --------------------------------------------------------------------------

def _programs(jnp_or_snp):
    n = jnp_or_snp
    return [
        (lambda x, w: (x @ w).sum(axis=0), ((8, 16), np.float32), ((16, 4), np.float32)),
        (lambda x, y: (x * 2.0 + y, {"m": n.maximum(x, 0.0)}), ((3, 4), "bfloat16"),
         ((3, 4), "bfloat16")),
        (lambda x, y: x + y, ((3, 4), np.int32), ((4,), np.float32)),
        (lambda x: (x.reshape(2, -1).T, x.astype(n.float16) * 3), ((4, 6), np.float32)),
        (lambda x, i: x[i], ((5, 3), np.float32), ((2,), np.int32)),
        (lambda x: n.exp(x).mean(), ((7,), np.float16)),
    ]


def test_eval_shape_agrees_with_jax(jax8):
    """Each program, on ShapeDtypeStructs: the same result types as jax.eval_shape's, and on
    simpmd with JAX's structs as arguments too."""
    import jax.numpy as jnp
    for (f, *specs), (g, *_) in zip(_programs(snp), _programs(jnp)):
        ours = simpmd.eval_shape(f, *[S(s, d) for s, d in specs])
        theirs = jax8.eval_shape(g, *[jax8.ShapeDtypeStruct(s, d) for s, d in specs])
        assert jax8.tree_util.tree_structure(ours) == jax8.tree_util.tree_structure(theirs)
        for a, b in zip(jax8.tree_util.tree_leaves(ours), jax8.tree_util.tree_leaves(theirs)):
            assert (a.shape, a.dtype) == (b.shape, b.dtype)
        again = simpmd.eval_shape(f, *[jax8.ShapeDtypeStruct(s, d) for s, d in specs])
        assert jax8.tree_util.tree_leaves(again) == jax8.tree_util.tree_leaves(ours)


def test_eval_shape_keeps_python_numbers_weak_as_jax(jax8):
    ours = simpmd.eval_shape(lambda x, y: (x, {"a": y}), 1.0, 2)
    theirs = jax8.eval_shape(lambda x, y: (x, {"a": y}), 1.0, 2)
    assert repr(ours) == repr(theirs)


def test_make_jaxpr_return_shape_gives_structs_as_jax(jax8):
    import jax.numpy as jnp
    f, *specs = _programs(snp)[0]
    g = _programs(jnp)[0][0]
    _, ours = simpmd.make_jaxpr(f, return_shape=True)(*[S(s, d) for s, d in specs])
    _, theirs = jax8.make_jaxpr(g, return_shape=True)(*[jax8.ShapeDtypeStruct(s, d) for s, d in specs])
    assert repr(ours) == repr(theirs)


# -- the front ends on shapes ---------------------------------------------------------------

_CASES = [c for c in jax_cases.CASES if c.nested is None and not c.refusal_ok
          and c.devices is None]


def _structs(tree):
    return simpmd.api.shapes.as_shapes(tree)


def _collectives(trace):
    return [(e.step, e.op, e.axes, e.group, e.member, e.bytes_sent, e.bytes_received,
             e.shapes_in, e.shapes_out, e.dtypes, e.phase)
            for e in trace.events if e.kind == "collective"]


@pytest.mark.parametrize("case", _CASES, ids=lambda c: c.name)
def test_pmap_on_shapes_gives_the_types_and_log_of_the_run_on_values(case):
    args = case.args()
    body = case.make(lax)
    f = simpmd.pmap(body, case.axis_name, **case.pmap_kwargs())
    try:
        values = f(*args)
    except simpmd.SimpmdError:
        pytest.skip("simpmd refuses this program on values")
    on_values = f.trace
    types = f(*_structs(args))
    leaves_v, tree_v = simpmd.api.tree.flatten(values)
    leaves_t, tree_t = simpmd.api.tree.flatten(types)
    assert tree_v == tree_t
    for v, t in zip(leaves_v, leaves_t):
        assert isinstance(t, S) and t.shape == np.shape(v) and t.dtype == np.asarray(v).dtype
    assert f.trace.shapes_only and not on_values.shapes_only
    assert _collectives(f.trace) == _collectives(on_values)
    assert all(not e.inputs and not e.outputs for e in f.trace.events)
    assert [e.detail for e in f.trace.events if e.kind != "collective"] == \
        [e.detail for e in on_values.events if e.kind != "collective"]


@pytest.mark.parametrize("case", [c for c in _CASES if c.jax == "pmap"][:20], ids=lambda c: c.name)
def test_pmap_on_shapes_agrees_with_jax_eval_shape(jax8, case):
    args = case.args()
    ours = simpmd.pmap(case.make(lax), case.axis_name, **case.pmap_kwargs())(*_structs(args))
    try:
        theirs = jax8.eval_shape(jax8.pmap(case.make(jax8.lax), case.axis_name,
                                           **case.pmap_kwargs()), *args)
    except Exception as exc:                       # a JAX bug or a refusal: not a reference
        pytest.skip(f"jax refuses: {type(exc).__name__}")
    for a, b in zip(jax8.tree_util.tree_leaves(ours), jax8.tree_util.tree_leaves(theirs)):
        assert (a.shape, a.dtype) == (b.shape, b.dtype)


def jax_specs(specs):
    """simpmd's PartitionSpecs (a pytree of them) as JAX's."""
    from jax.sharding import PartitionSpec
    if isinstance(specs, simpmd.PartitionSpec):
        return PartitionSpec(*specs)
    if isinstance(specs, (tuple, list)):
        return type(specs)(jax_specs(s) for s in specs)
    if isinstance(specs, dict):
        return {k: jax_specs(v) for k, v in specs.items()}
    return specs


def _shard_map_pair(jax8, body, specs, out_specs, mesh_shape=(2, 4), names=("a", "b")):
    from jax.sharding import Mesh
    mesh = simpmd.make_mesh(mesh_shape, names)
    jmesh = Mesh(np.array(jax8.devices()[:8]).reshape(mesh_shape), names)
    ours = simpmd.shard_map(body, mesh=mesh, in_specs=specs, out_specs=out_specs)
    theirs = jax8.shard_map(body, mesh=jmesh, in_specs=jax_specs(specs),
                            out_specs=jax_specs(out_specs))
    return ours, theirs


@pytest.mark.parametrize("which", range(4))
def test_shard_map_on_shapes_agrees_with_jax_and_with_its_run_on_values(jax8, which):
    body, specs, out_specs, args = [
        (lambda x: lax.psum(x, "b"), P("a", "b"), P("a"), (np.ones((4, 8), np.float32),)),
        (lambda x, w: lax.psum(x @ lax.all_gather(w, "a", axis=0, tiled=True), "b"),
         (P("a", "b"), P("a", None)), P("a"), (np.ones((4, 16), np.float32),
                                                 np.ones((4, 6), np.float32))),
        (lambda x: lax.psum_scatter(x, "a", tiled=True), P(None, "b"), P("a", "b"),
         (np.ones((8, 8), np.float32),)),
        (lambda x: (lax.ppermute(x, "b", [(k, (k + 1) % 4) for k in range(4)]),
                    lax.all_to_all(x, "b", 0, 0, tiled=True)), P(("a", "b")),
         (P(("a", "b")), P(("a", "b"))), (np.ones((32, 3), np.float32),)),
    ][which]
    # the bodies call simpmd.lax, which hands over to jax.lax inside a JAX trace
    ours, theirs = _shard_map_pair(jax8, body, specs, out_specs)
    on_values = ours(*args)
    trace_values = ours.trace
    types = ours(*_structs(args))
    expected = jax8.eval_shape(theirs, *[jax8.ShapeDtypeStruct(a.shape, a.dtype) for a in args])
    for t, v, j in zip(jax8.tree_util.tree_leaves(types), jax8.tree_util.tree_leaves(on_values),
                       jax8.tree_util.tree_leaves(expected)):
        assert (t.shape, t.dtype) == (j.shape, j.dtype) == (np.shape(v), np.asarray(v).dtype)
        assert t.sharding == v.sharding
    assert _collectives(ours.trace) == _collectives(trace_values)


def test_the_type_check_of_out_specs_holds_on_shapes():
    """Under check_vma an out_spec that leaves out an axis the result varies over is an
    error from the types alone, so a run on shapes refuses it as a run on values does."""
    mesh = simpmd.make_mesh((2, 4), ("a", "b"))
    f = simpmd.shard_map(lambda x: x * 2, mesh=mesh, in_specs=P("a", "b"), out_specs=P("a"))
    with pytest.raises(simpmd.machine.mesh.ShardingError, match="varies"):
        f(S((4, 8), np.float32))


def test_grad_inside_shard_map_on_shapes_logs_the_backward_collectives():
    """FSDP's all_gather turns into a reduce-scatter in the backward pass, on values and
    on shapes alike."""
    mesh = simpmd.make_mesh((8,), ("d",))

    def step(w, x):
        def loss(w):
            return (x @ lax.all_gather(w, "d", axis=0, tiled=True)).sum()
        return simpmd.grad(loss)(w)
    f = simpmd.shard_map(step, mesh=mesh, in_specs=(P("d"), P("d")), out_specs=P("d"))
    f(np.ones((16, 4), np.float32), np.ones((8, 16), np.float32))
    values = _collectives(f.trace)
    out = f(S((16, 4), np.float32), S((8, 16), np.float32))
    assert out == S((16, 4), np.float32, simpmd.NamedSharding(mesh, P("d")))
    assert _collectives(f.trace) == values
    assert [c[1] for c in values][::8] == ["all_gather", "psum_scatter"]


def test_eager_refuses_shapes_plainly():
    f = simpmd.pmap(lambda x: x * 2, "i", eager=True)
    with pytest.raises(TypeError, match="eager=True runs each device's Python on its values"):
        f(S((8, 2), np.float32))


def test_views_that_need_values_say_so_and_the_others_work():
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), "i")
    f(S((8, 1024), np.float32))
    text = str(f.trace)
    assert "SHAPES ONLY" in text and "float32[1024]" in text
    for draw in (simpmd.viz.draw_trace, simpmd.viz.draw_collective):
        with pytest.raises(ValueError, match="shapes alone"):
            draw(f.trace)
    with pytest.raises(ValueError, match="shapes alone"):
        simpmd.viz.draw_trace_mesh(f.trace, values="received")
    estimate = simpmd.cost.estimate_trace(f.trace, hardware="TPU v5e")
    f(np.ones((8, 1024), np.float32))
    assert estimate.total_time_s == simpmd.cost.estimate_trace(
        f.trace, hardware="TPU v5e").total_time_s > 0


def test_a_real_models_layer_on_thousands_of_devices_runs_in_seconds():
    """A LLaMA-3-70B MLP block (D = 8192, F = 28672) in bfloat16, FSDP over 2048 devices
    and tensor parallelism over 4: 8192 simulated devices, nothing computed. (Speed is
    measured in benchmarks/, as a ratio; this only checks that it finishes and logs the
    right bytes.)"""
    _bf16()
    simpmd.set_device_count(8192)
    mesh = simpmd.make_mesh((2048, 4), ("fsdp", "tp"))
    D, F, T = 8192, 28672, 2048 * 2048

    def mlp(x, w1, w2):
        h = x @ lax.all_gather(w1, "fsdp", axis=0, tiled=True)
        return lax.psum(h @ lax.all_gather(w2, "fsdp", axis=1, tiled=True), "tp")
    f = simpmd.shard_map(mlp, mesh=mesh, in_specs=(P("fsdp"), P("fsdp", "tp"), P("tp", "fsdp")),
                         out_specs=P("fsdp"))
    start = time.perf_counter()
    out = f(S((T, D), "bfloat16"), S((D, F), "bfloat16"), S((F, D), "bfloat16"))
    assert time.perf_counter() - start < 60
    assert out.shape == (T, D) and out.dtype == _bf16()
    gather = next(e for e in f.trace.collectives()[0])
    shard = D // 2048 * F // 4 * 2                         # one device's block of w1, bytes
    assert gather.op == "all_gather" and gather.bytes_sent == 2047 * shard


# -- reading a trace call by call -------------------------------------------------------------

@pytest.mark.parametrize("case", _CASES[::3], ids=lambda c: c.name)
def test_estimate_trace_reads_the_columnar_log_as_it_reads_the_events(case):
    """Call by call (the columnar log, once per shape of group) and event by event: the
    same instances, groups, bytes and times."""
    f = simpmd.pmap(case.make(lax), case.axis_name, **case.pmap_kwargs())
    try:
        f(*case.args())
    except simpmd.SimpmdError:
        pytest.skip("simpmd refuses this program on values")
    by_call = simpmd.cost.estimate_trace(f.trace, hardware="TPU v4")
    by_event = simpmd.cost.estimate_trace(list(f.trace.events), hardware="TPU v4")
    assert len(by_call) == len(by_event)
    for a, b in zip(by_call, by_event):
        assert (a.step, a.call, a.op, a.axes, a.group, a.bytes_sent, a.bytes_received) == (
            b.step, b.call, b.op, b.axes, b.group, b.bytes_sent, b.bytes_received)
        assert a.time_s == pytest.approx(b.time_s)
    assert by_call.total_time_s == pytest.approx(by_event.total_time_s)


@pytest.mark.parametrize("case", _CASES[::4], ids=lambda c: c.name)
@pytest.mark.parametrize("kwargs", [{}, {"compute": 2e-6, "slowdown": {3: 2.5}}])
def test_the_timeline_models_the_columnar_log_as_it_models_the_events(case, kwargs):
    """Every device's clock at once, call by call, gives the segments that the model
    event by event gives (the same devices, kinds, starts and stops)."""
    from simpmd.viz.timeline import model_timeline
    f = simpmd.pmap(case.make(lax), case.axis_name, **case.pmap_kwargs())
    try:
        f(*case.args())
    except simpmd.SimpmdError:
        pytest.skip("simpmd refuses this program on values")
    events = simpmd.Trace(list(f.trace.events))
    events.program = f.trace.program
    fast = model_timeline(f.trace, "TPU v4", **kwargs)
    slow = model_timeline(events, "TPU v4", **kwargs)
    key = lambda s: (s.device, s.start, s.kind)
    assert [(s.device, s.kind, s.label, s.step) for s in sorted(fast.segments, key=key)] == \
        [(s.device, s.kind, s.label, s.step) for s in sorted(slow.segments, key=key)]
    for a, b in zip(sorted(fast.segments, key=key), sorted(slow.segments, key=key)):
        assert (a.start, a.stop) == pytest.approx((b.start, b.stop))
    assert fast.end == pytest.approx(slow.end)
    for kind in ("compute", "wait", "comm"):
        assert fast.total(kind, 0) == pytest.approx(slow.total(kind, 0))


def test_a_timeline_of_hundreds_of_devices_keeps_few_segments_and_every_total():
    """Past 64 devices the model keeps the segments of the watched devices only; another
    device's segments are modelled again when asked, and every device's totals are those
    of the model event by event."""
    from simpmd.viz.timeline import model_timeline
    simpmd.set_device_count(256)
    f = simpmd.pmap(lambda x: lax.psum(lax.ppermute(x, "i", [(k, (k + 1) % 256)
                                                             for k in range(256)]), "i"), "i")
    f(S((256, 4096), np.float32))
    fast = model_timeline(f.trace, "TPU v4", slowdown={100: 3.0})
    events = simpmd.Trace(list(f.trace.events))
    events.program = f.trace.program
    slow = model_timeline(events, "TPU v4", slowdown={100: 3.0})
    assert fast.watched is not None and 100 in fast.watched and 77 not in fast.watched
    assert {s.device for s in fast.segments} == set(fast.watched)
    assert fast.devices == list(range(256))
    for d in (0, 77, 100, 255):
        assert fast.total("wait", d) == pytest.approx(slow.total("wait", d))
        assert [(s.kind, round(s.start, 12)) for s in fast.of(d)] == \
            [(s.kind, round(s.start, 12)) for s in slow.of(d)]
    assert fast.most("wait")[0] == slow.most("wait")[0] != 100     # the straggler waits least
    fig = simpmd.viz.draw_timeline(f.trace, "TPU v4", slowdown={100: 3.0}, max_rows=6,
                                   window=(0, fast.end / 2))
    rows = {a.get_gid().split(":")[-1] for a in simpmd.viz.tagged(fig, "device")}
    assert {"0", "100", "255"} <= rows and len(rows) <= 7


def test_thousands_of_segments_are_drawn_as_one_bar_collection_per_row_and_kind():
    def body(x):
        for _ in range(400):
            x = lax.psum(x * 0.5, "i")
        return x
    f = simpmd.pmap(body, "i")
    f(S((8, 64), np.float32))
    fig = simpmd.viz.draw_timeline(f.trace, "TPU v4")
    bars = simpmd.viz.tagged(fig, "comm")
    assert len(bars) == 8 and all(len(b.get_paths()) == 400 for b in bars)
    assert {b.get_gid() for b in bars} == {f"simpmd:comm:{d}" for d in range(8)}


def test_a_trace_on_shapes_says_which_collectives_it_could_not_log():
    """Which branch of a lax.cond each device takes depends on values, so on shapes alone
    its branches' collectives are not run; the trace says so instead of undercounting
    silently."""
    f = simpmd.pmap(lambda x: lax.cond(x.sum() > 0, lambda v: lax.psum(v, "i"),
                                       lambda v: v, x), "i")
    f(S((8, 3), np.float32))
    assert "NOT LOGGED: the collectives inside lax.cond branches" in str(f.trace)
    g = simpmd.pmap(lambda x: lax.psum(x, "i"), "i")
    g(S((8, 3), np.float32))
    assert "NOT LOGGED" not in str(g.trace)
