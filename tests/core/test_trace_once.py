"""Trace once: the body runs a single time over stacked values, and agrees with running it
once per device (``eager=True``, plain NumPy on each device: an independent oracle)."""
import warnings

import numpy as np
import pytest

import simpmd
from simpmd import lax
import simpmd.numpy as snp
from simpmd import P

RNG = np.random.default_rng(0)
X = RNG.standard_normal((8, 3, 4)).astype(np.float32)
V = RNG.standard_normal((8, 4)).astype(np.float32)
W = RNG.standard_normal((4, 5)).astype(np.float32)

# Bodies of one device's value x (shape (3, 4)), v (shape (4,)) and a shared w (4, 5).
BODIES = {
    "ufunc, ranks lined up": lambda x, v, w: x * v + snp.exp(v) - 1,
    "scalar and int promotion": lambda x, v, w: x * lax.axis_index("i") + 2 / (1 + lax.axis_index("i")),
    "reductions": lambda x, v, w: (x.sum(), x.sum(0), x.mean(axis=-1), x.max(axis=(0, 1)),
                                   x.argmax(), x.argmin(axis=1), x.cumsum(), x.std(1, keepdims=True),
                                   snp.sum(x, axis=1), snp.max(v)),
    "shape methods": lambda x, v, w: (x.reshape(4, 3), x.reshape(-1), x.T, x.transpose(1, 0),
                                      x.ravel(), x[None].squeeze(0), x.swapaxes(0, 1),
                                      snp.reshape(x, (2, 6)), snp.transpose(x), x.astype(np.int32)),
    "indexing": lambda x, v, w: (x[1], x[:, 2], x[..., 1:3], x[None, 0], x[[0, 2]],
                                 x[:, [1, 3]], v[::-1], x[1, [0, 2]]),
    "iteration and len": lambda x, v, w: [r * len(x) for r in x],
    "matmul, every rank": lambda x, v, w: (x @ w, v @ w, x @ v, v @ v, w.T @ v,
                                          snp.dot(x, v), snp.matmul(v, w)),
    "where, clip, concatenate, stack": lambda x, v, w: (
        snp.where(x > 0, x, v), snp.clip(x, -0.5, 0.5), v.clip(0, 1),
        snp.concatenate([x, x * 2], axis=1), snp.stack([v, v + 1]), snp.stack([v, np.ones(4)], axis=-1),
        snp.zeros_like(x), snp.ones_like(v, dtype=np.int32), snp.full_like(x, 3.0),
        snp.broadcast_to(v, (2, 4)), snp.broadcast_to(v.sum(), (3,)), snp.broadcast_to(x[:1], (3, 4))),
    "at updates": lambda x, v, w: (x.at[0].set(v), x.at[:, 1].add(1.0), v.at[[0, 0, 2]].add(1.0),
                                   x.at[1, 2].multiply(v[0])),
    "no rule: per-device fallback": lambda x, v, w: (snp.sort(v), snp.einsum("ij,j->i", x, v),
                                                     snp.linalg.norm(x, axis=0), snp.outer(v, v)),
    "collectives": lambda x, v, w: (
        lax.psum(x, "i"), lax.pmean(v, "i"), lax.pmax(v, "i"), lax.pmin(x, "i"),
        lax.all_gather(v, "i"), lax.all_gather(x, "i", axis=1, tiled=True),
        lax.psum_scatter(snp.ones((8, 2)) * v[0], "i"), lax.psum_scatter(snp.concatenate([x, x], axis=1), "i", scatter_dimension=1, tiled=True),
        lax.ppermute(v, "i", [(j, (j + 1) % 8) for j in range(8)]), lax.ppermute(v, "i", [(0, 3)]),
        lax.pshuffle(v, "i", [7, 6, 5, 4, 3, 2, 1, 0]),
        lax.all_to_all(snp.ones((8, 3)) * v[:3], "i", 0, 1),
        lax.psum(v, "i", axis_index_groups=[[0, 1, 2, 3], [4, 5, 6, 7]]),
        lax.psum(v, "i", axis_index_groups=[[0, 1, 2], [3, 4, 5, 6, 7]]),
        lax.all_gather(v, "i", axis_index_groups=[[0, 2, 4, 6], [1, 3, 5, 7]]),
        lax.psum(1, "i"), lax.psum(np.ones(2), "i"), lax.axis_size("i")),
}


@pytest.mark.parametrize("name", list(BODIES))
def test_traced_once_agrees_with_one_program_per_device(name):
    body = BODIES[name]
    once = simpmd.pmap(body, "i", in_axes=(0, 0, None))
    per_device = simpmd.pmap(body, "i", in_axes=(0, 0, None), eager=True)
    got, expected = once(X, V, W), per_device(X, V, W)
    g_leaves, e_leaves = simpmd.api.tree.flatten(got)[0], simpmd.api.tree.flatten(expected)[0]
    assert len(g_leaves) == len(e_leaves)
    for g, e in zip(g_leaves, e_leaves):
        g, e = np.asarray(g), np.asarray(e)
        assert g.shape == e.shape and g.dtype == e.dtype, (name, g.shape, e.shape, g.dtype, e.dtype)
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)
    # the log reads as it does when every device runs on its own
    keys = lambda t: [(e.kind, e.program, e.op, e.group, e.member, e.detail, e.bytes_sent,
                       tuple(np.round(np.asarray(o, np.float64), 5).tolist() for o in e.outputs))
                      for e in t.events]
    assert sorted(map(str, keys(once.trace))) == sorted(map(str, keys(per_device.trace)))


def test_shapes_that_depend_on_values_are_refused_with_advice():
    """Refused while tracing, as JAX refuses it (NonConcreteBooleanIndexError), with the
    fixed-shape spelling to use instead."""
    with pytest.raises(simpmd.SimpmdError, match=r"boolean mask.*NonConcreteBooleanIndexError.*snp.where"):
        simpmd.pmap(lambda x: x[x > 0], "i")(X)


def test_python_side_effects_happen_once_and_debug_print_once_per_device(capsys):
    calls = []

    def body(x):
        calls.append(1)
        simpmd.debug.print("x={}", x)
        return x + 1
    simpmd.pmap(body, "i")(np.arange(8.0))
    assert len(calls) == 1
    printed = capsys.readouterr().out.splitlines()
    assert printed == [f"[device {k} (i={k})] x={float(k)}" for k in range(8)]
    simpmd.pmap(body, "i", eager=True)(np.arange(8.0))
    assert len(calls) == 1 + 8                 # eager: one program per device, as before


def test_a_python_counter_runs_as_on_jax_instead_of_deadlocking():
    calls = []

    def body(x):
        calls.append(1)
        return lax.psum(x, "i") if len(calls) == 1 else x
    out = simpmd.pmap(body, "i")(np.arange(8.0))
    assert np.allclose(np.asarray(out), 28.0)
    calls.clear()
    with pytest.raises(simpmd.DeadlockError):   # one program per device: only device 0 joins
        simpmd.pmap(body, "i", eager=True)(np.arange(8.0))


def test_shard_map_traced_once_agrees_with_one_program_per_device():
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    x = RNG.standard_normal((4, 8, 3)).astype(np.float32)

    def body(b):
        return (lax.psum(b, "model"), lax.all_gather(b, ("data", "model")), b * lax.axis_index("data"),
                lax.ppermute(b, ("data", "model"), [(k, (k + 3) % 8) for k in range(8)]),
                lax.pmean(b.sum(), ("data", "model")), lax.psum_scatter(b, "data", tiled=True))
    specs = dict(mesh=mesh, in_specs=P("data", "model"),
                 out_specs=(P("data", None), P(), P("data", "model"), P("model", "data"), P(),
                            P(("data", "model"))), check_vma=False)
    once = simpmd.shard_map(body, **specs)(x)
    per_device = simpmd.shard_map(body, eager=True, **specs)(x)
    for g, e in zip(once, per_device):
        np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=1e-6, atol=1e-6)
        assert np.asarray(g).shape == np.asarray(e).shape


def test_the_trace_of_a_large_run_is_written_only_when_read():
    simpmd.set_device_count(1024)
    try:
        f = simpmd.pmap(lambda x: lax.pmean(x, "i"), "i")
        f(np.arange(1024.0 * 4).reshape(1024, 4))
        assert f.trace._events is None               # nothing written yet
        events = f.trace.events
        assert len(events) == 3 * 1024 and events[-1].outputs[0][0] == pytest.approx(2046.0)
    finally:
        simpmd.set_device_count(8)


def test_collectives_record_the_phase():
    from simpmd.core.core import backward_pass
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), "i")
    f(np.arange(8.0))
    assert {e.phase for e in f.trace.events if e.kind == "collective"} == {"forward"}
    with backward_pass():
        f(np.arange(8.0))
    assert {e.phase for e in f.trace.events if e.kind == "collective"} == {"backward"}
    assert "backward psum('i')" in f.trace.table()


def _log(trace):
    """Each program's log, in its own order: what both engines must agree on (how the
    programs' steps interleave differs)."""
    return [(e.program, e.seq, e.kind, e.coords, e.device, e.devices, e.detail, e.op, e.axes,
             e.group, [np.asarray(v).tolist() for v in e.inputs + e.outputs])
            for e in sorted(trace.events, key=lambda e: (e.program, e.seq))]


def test_a_nested_pmap_is_traced_once_as_a_grid_and_logs_as_one_program_per_device():
    calls = []

    def inner(y):
        calls.append("inner")              # a Python counter: once per trace, as on JAX
        return lax.psum(y, "j") + lax.axis_index("i") * 10.0
    def outer(x):
        calls.append("outer")
        z = simpmd.pmap(inner, "j", in_axes=(1,), out_axes=None)(x.T)
        return lax.pmax(z, "i"), simpmd.pmap(lambda y: y * 2, "j")(x)
    x = np.arange(24.0).reshape(2, 4, 3)
    traced = simpmd.pmap(outer, "i")
    out = traced(x)
    assert calls == ["outer", "inner"]
    eager = simpmd.pmap(outer, "i", eager=True)
    want = eager(x)
    # NumPy by hand: device (i, j) gets x[i, j]; psum over j sums x[i] over its rows.
    both = np.maximum(x[0].sum(0), x[1].sum(0) + 10)             # the same on i=0 and i=1
    np.testing.assert_allclose(np.asarray(out[0]), [both, both])
    np.testing.assert_allclose(np.asarray(out[1]), x * 2)
    for a, b in zip(out, want):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert [(s.device.id, s.index) for s in a.addressable_shards] == \
               [(s.device.id, s.index) for s in b.addressable_shards]
    assert _log(traced.trace) == _log(eager.trace)


NX = np.arange(48.0, dtype=np.float32).reshape(2, 4, 6)
RING = [(k, (k + 1) % 4) for k in range(4)]
# Outer bodies over 'i' (2 devices), each calling an inner pmap over 'j' (4 devices).
NESTED = {
    "in_axes None and a keyword": lambda x: simpmd.pmap(
        lambda y, w, *, z: y * w + z, "j", in_axes=(0, None))(x, x[0], z=x),
    "a static argument": lambda x: simpmd.pmap(
        lambda y, k: y * k, "j", static_broadcasted_argnums=1)(x, 3),
    "in_axes 1, out_axes 1": lambda x: simpmd.pmap(lambda y: y + 1, "j", in_axes=1, out_axes=1)(x.T),
    "out_axes -1": lambda x: simpmd.pmap(lambda y: y * 2, "j", out_axes=-1)(x),
    "out_axes None, replicated": lambda x: simpmd.pmap(lambda y: lax.psum(y, "j"), "j", out_axes=None)(x),
    "out_axes None, not replicated": lambda x: simpmd.pmap(lambda y: y, "j", out_axes=None)(x),
    "psum over both axes": lambda x: simpmd.pmap(lambda y: lax.psum(y, ("i", "j")), "j")(x),
    "all_gather over the outer axis": lambda x: simpmd.pmap(lambda y: lax.all_gather(y, "i"), "j")(x),
    "groups": lambda x: simpmd.pmap(
        lambda y: lax.psum(y, "j", axis_index_groups=[[0, 1], [2, 3]]), "j")(x),
    "ppermute and axis_index": lambda x: simpmd.pmap(
        lambda y: lax.ppermute(y, "j", RING) * lax.axis_index("i"), "j")(x),
    "a NumPy constant": lambda x: simpmd.pmap(lambda y, c: y + c, "j")(x, np.ones((4, 6), np.float32)),
    "an outer value closed over": lambda x: (lambda s: simpmd.pmap(
        lambda y: y * s + lax.axis_index("i"), "j")(x))(x.sum()),
    "a pytree result": lambda x: simpmd.pmap(lambda y: {"a": y, "b": (y.sum(), y.max())}, "j")(x),
    "axis_size, no arguments": lambda x: simpmd.pmap(lambda: lax.axis_index("j") * 1.0, "j", axis_size=4)(),
}


@pytest.mark.parametrize("name", NESTED)
def test_nested_pmaps_traced_once_agree_with_one_program_per_device(name):
    """Results, shards, warnings and each program's log: the grid traced once against the
    per-device runtime (eager=True), which runs each outer program's inner pmap itself."""
    runs = []
    for eager in (False, True):
        f = simpmd.pmap(NESTED[name], "i", eager=eager)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = simpmd.api.tree.flatten(f(NX))[0]
        runs.append(([np.asarray(v) for v in out],
                     [[(s.device.id, s.index, s.replica_id) for s in v.addressable_shards] for v in out],
                     [str(w.message) for w in caught], _log(f.trace)))
    (values, shards, warned, log), (want, want_shards, want_warned, want_log) = runs
    for a, b in zip(values, want):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    assert shards == want_shards and warned == want_warned and log == want_log


def test_a_nested_pmap_under_an_outer_axis_of_one_device():
    """The outer grid has a single device: the inner result still goes back into the outer
    body as that device's stacked value (a per-device value would be taken for a constant)."""
    def outer(x):
        return lax.psum(simpmd.pmap(lambda v: lax.psum(v, "j"), "j")(x) * 2, "i")
    x = np.arange(4.0).reshape(1, 4)
    got, want = simpmd.pmap(outer, "i")(x), simpmd.pmap(outer, "i", eager=True)(x)
    np.testing.assert_array_equal(np.asarray(got), [[12.0] * 4])       # (0+1+2+3) * 2
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


@pytest.mark.parametrize("innermost", [lambda z: z, lambda z: lax.psum(z, ("i", "j", "k"))],
                         ids=["identity", "psum over all three axes"])
def test_three_nested_pmaps_agree_with_one_program_per_device(innermost, capsys):
    def middle(y):
        return simpmd.pmap(innermost, "k")(y) * (1 + lax.axis_index("j"))
    def outer(x):
        out = simpmd.pmap(middle, "j")(x) + lax.axis_index("i")
        simpmd.debug.print("sum {}", out.sum())       # names the outer body and its devices
        return out
    x = np.arange(8.0).reshape(2, 2, 2)
    traced, eager = simpmd.pmap(outer, "i"), simpmd.pmap(outer, "i", eager=True)
    got = traced(x)
    printed = capsys.readouterr().out
    want = eager(x)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert _log(traced.trace) == _log(eager.trace)
    assert printed == capsys.readouterr().out
    assert "[the outer body at i=1 (devices 4-7 at j=0..1, k=0..1)]" in printed


def test_an_eager_pmap_nested_in_a_traced_one_says_where_eager_goes():
    with pytest.raises(simpmd.MappedAxisError, match="outermost pmap"):
        simpmd.pmap(lambda x: simpmd.pmap(lambda y: y, "j", eager=True)(x), "i")(np.ones((2, 4)))


def test_a_nested_pmap_prints_once_per_program(capsys):
    def outer(x):
        simpmd.debug.print("outer {}", x.sum())
        return simpmd.pmap(lambda y: lax.psum(y, "j"), "j")(x)
    out = simpmd.pmap(outer, "i")(np.arange(8.0).reshape(2, 4))
    np.testing.assert_allclose(np.asarray(out), [[6.0] * 4, [22.0] * 4])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].endswith("outer 6.0") and lines[1].endswith("outer 22.0")
