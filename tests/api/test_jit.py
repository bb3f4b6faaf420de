"""simpmd.jit with Explicit shardings, checked against hand-worked blocks and NumPy.

Expectations are written out here (which rows and columns each device holds, which
collective the rule needs, the bytes a ring moves), never read from simpmd's own output.
"""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P
from simpmd import ShardingTypeError
from simpmd.jax import hlo_collective_counts
from simpmd.sharding import collective_counts


@pytest.fixture
def mesh():
    m = simpmd.make_mesh((2, 4), ("data", "model"))
    with simpmd.set_mesh(m):
        yield m


def arange(*shape):
    return np.arange(np.prod(shape), dtype=np.float32).reshape(shape)


def test_make_mesh_defaults_to_explicit_and_mesh_to_auto():
    m = simpmd.make_mesh((2, 4), ("data", "model"))
    assert simpmd.machine.mesh.axis_types_of(m) == (simpmd.AxisType.Explicit,) * 2
    raw = simpmd.Mesh(np.array(simpmd.devices()[:8]).reshape(2, 4), ("data", "model"))
    assert simpmd.machine.mesh.axis_types_of(raw) == (simpmd.AxisType.Auto,) * 2


def test_set_mesh_is_a_context_manager():
    m = simpmd.make_mesh((8,), ("i",))
    before = simpmd.get_mesh()
    with simpmd.set_mesh(m):
        assert simpmd.get_mesh() is m
    assert simpmd.get_mesh() is before


def test_typeof_prints_like_jax(mesh):
    x = simpmd.device_put(arange(16, 32), P("data", "model"))
    assert str(simpmd.typeof(x)) == "float32[16@data,32@model]"
    assert repr(simpmd.typeof(x)) == "ShapedArray(float32[16@data,32@model])"
    y = simpmd.device_put(arange(16, 32), P(None, ("data", "model")))
    assert str(simpmd.typeof(y)) == "float32[16,32@(data,model)]"
    assert str(simpmd.typeof(simpmd.device_put(np.ones(4)))) == "float32[4]"   # float64 -> float32


def test_device_put_blocks_by_hand(mesh):
    a = arange(16, 32)
    x = simpmd.device_put(a, P("data", "model"))
    # device 6 sits at data=1, model=2: rows 8-15, columns 16-23
    np.testing.assert_array_equal(x.block(6), a[8:16, 16:24])
    np.testing.assert_array_equal(np.asarray(x), a)
    w = simpmd.device_put(a, simpmd.NamedSharding(mesh, P("model")))
    np.testing.assert_array_equal(w.block(6), a[8:12])        # replicated over data
    np.testing.assert_array_equal(w.block(2), a[8:12])


def test_uneven_split_is_refused(mesh):
    with pytest.raises(ShardingTypeError, match="evenly"):
        simpmd.device_put(arange(6, 4), P("model"))


def test_ambiguous_contraction_raises_and_says_what_to_write(mesh):
    x = simpmd.device_put(arange(16, 32), P("data", "model"))
    w = simpmd.device_put(arange(32, 8), P("model", None))
    with pytest.raises(ShardingTypeError, match="out_sharding"):
        simpmd.jit(lambda x, w: x @ w)(x, w)


def test_all_reduce_for_a_replicated_result(mesh):
    a, b = arange(16, 32) / 100, arange(32, 8) / 100
    x = simpmd.device_put(a, P("data", "model"))
    w = simpmd.device_put(b, P("model", None))
    f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)))
    y = f(x, w)
    assert str(simpmd.typeof(y)) == "float32[16@data,8]"
    np.testing.assert_allclose(np.asarray(y), a @ b, rtol=1e-5)
    (call,) = f.trace.calls()
    assert {e.op for e in call} == {"psum"} and len(call) == 8
    e5 = next(e for e in call if e.device == 5)               # data=1, model=1
    assert e5.group == (4, 5, 6, 7) and e5.axes == ("model",)
    np.testing.assert_allclose(e5.inputs[0], a[8:16, 8:16] @ b[8:16], rtol=1e-5)   # its partial sum
    np.testing.assert_allclose(e5.outputs[0], (a @ b)[8:16], rtol=1e-5)
    assert e5.bytes_sent == 2 * 3 * (8 * 8 * 4) // 4           # ring all-reduce: 2(p-1)/p of the block
    assert e5.params["inserted"] == "jit: dot_general"
    assert e5.source.startswith("test_jit.py:")


def test_reduce_scatter_for_a_split_result(mesh):
    a, b = arange(16, 32) / 100, arange(32, 8) / 100
    x = simpmd.device_put(a, P("data", "model"))
    w = simpmd.device_put(b, P("model", None))
    f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P("data", "model")))
    y = f(x, w)
    assert str(simpmd.typeof(y)) == "float32[16@data,8@model]"
    assert collective_counts(f.trace) == {"reduce-scatter": 1}
    np.testing.assert_allclose(y.block(6), (a @ b)[8:16, 4:6], rtol=1e-5)


def test_one_sided_contraction_cuts_the_whole_operand_then_all_reduces(mesh):
    a, b = arange(16, 32), np.ones((32, 8), np.float32)
    x = simpmd.device_put(a, P("data", "model"))
    f = simpmd.jit(lambda x, w: x @ w)
    y = f(x, b)
    assert str(simpmd.typeof(y)) == "float32[16@data,8]"
    np.testing.assert_allclose(np.asarray(y), a @ b)
    assert collective_counts(f.trace) == {"all-reduce": 1}


def test_free_dims_keep_their_split_without_traffic(mesh):
    x = simpmd.device_put(arange(16, 32), P("data", None))
    w = simpmd.device_put(arange(32, 8), P(None, "model"))
    f = simpmd.jit(lambda x, w: x @ w)
    y = f(x, w)
    assert str(simpmd.typeof(y)) == "float32[16@data,8@model]"
    assert f.trace.calls() == []


def test_conflicting_elementwise_raises(mesh):
    x = simpmd.device_put(arange(16, 32), P("data", "model"))
    y = simpmd.device_put(arange(16, 32), P("model", "data"))
    with pytest.raises(ShardingTypeError, match="reshard"):
        x + y


def test_broadcast_takes_the_split_operand(mesh):
    a, b = arange(16, 32), arange(32)
    x = simpmd.device_put(a, P("data", "model"))
    y = simpmd.jit(lambda x, b: snp.tanh(x / 100) + b)(x, b)
    assert str(simpmd.typeof(y)) == "float32[16@data,32@model]"
    np.testing.assert_allclose(np.asarray(y), np.tanh(a / 100) + b, rtol=1e-6)


def test_reductions(mesh):
    a = arange(16, 32)
    x = simpmd.device_put(a, P("data", "model"))
    f = simpmd.jit(lambda x: x.sum())
    assert float(np.asarray(f(x))) == a.sum()
    assert collective_counts(f.trace) == {"all-reduce": 2}   # one per split dim
    g = simpmd.jit(lambda x: x.max(1))
    m = g(x)
    assert str(simpmd.typeof(m)) == "float32[16@data]"
    np.testing.assert_array_equal(np.asarray(m), a.max(1))
    assert {e.op for e in g.trace.events if e.kind == "collective"} == {"pmax"}
    np.testing.assert_allclose(np.asarray(x.mean(0)), a.mean(0))


def test_reshard_gather_move_and_slice(mesh):
    a = arange(16, 32)
    x = simpmd.device_put(a, P("data", "model"))
    f = simpmd.jit(lambda x: simpmd.reshard(x, P("data", None)))
    y = f(x)
    assert collective_counts(f.trace) == {"all-gather": 1}
    np.testing.assert_array_equal(y.block(5), a[8:16])
    r = simpmd.device_put(a, P("data", None))
    g = simpmd.jit(lambda x: simpmd.reshard(x, P(None, "data")))
    z = g(r)
    assert collective_counts(g.trace) == {"all-to-all": 1}
    np.testing.assert_array_equal(z.block(4), a[:, 16:32])
    h = simpmd.jit(lambda x: simpmd.reshard(x, P("data", "model")))
    h(simpmd.device_put(a, P()))
    assert h.trace.calls() == []                               # each device cuts its piece


def test_slice_moves_blocks_by_permutes(mesh):
    a = arange(16, 4)
    x = simpmd.device_put(a, P("data"))
    f = simpmd.jit(lambda x: x[:8])
    y = f(x)
    # rows 0-7 in two blocks of 4: device at data=0 keeps rows 0-3, data=1 gets rows 4-7 from data=0
    np.testing.assert_array_equal(y.block(4), a[4:8])
    (call,) = f.trace.calls()
    assert {e.op for e in call} == {"ppermute"} and call[0].params["perm"] == ((0, 1),)
    with pytest.raises(ShardingTypeError, match="not divisible"):
        simpmd.jit(lambda x: x[3])(x)
    with pytest.raises(ShardingTypeError, match="divis"):
        simpmd.jit(lambda x: x[:3])(x)
    with pytest.raises(ShardingTypeError, match="outside jit"):     # a gather, in JAX too
        x[:8]


def test_reshape_rules(mesh):
    a = arange(16, 32)
    x = simpmd.device_put(a, P("data", "model"))
    y = x.reshape(16, 4, 8)
    assert str(simpmd.typeof(y)) == "float32[16@data,4@model,8]"
    np.testing.assert_array_equal(np.asarray(y), a.reshape(16, 4, 8))
    with pytest.raises(ShardingTypeError, match="out_sharding"):
        x.reshape(32, 16)
    z = x.reshape(32, 16, out_sharding=P("data", None))
    np.testing.assert_array_equal(np.asarray(z), a.reshape(32, 16))


def test_einsum_and_transpose(mesh):
    a, b = arange(4, 8, 16) / 50, arange(4, 16, 8) / 50
    x = simpmd.device_put(a, P("data", None, None))
    w = simpmd.device_put(b, P("data", None, "model"))
    y = simpmd.jit(lambda x, w: snp.einsum("bij,bjk->bki", x, w))(x, w)
    assert str(simpmd.typeof(y)) == "float32[4@data,8@model,8]"
    np.testing.assert_allclose(np.asarray(y), np.einsum("bij,bjk->bki", a, b), rtol=1e-5)


def test_concatenate(mesh):
    a = arange(16, 32)
    x = simpmd.device_put(a, P("data", "model"))
    y = snp.concatenate([x, x], axis=0)
    assert str(simpmd.typeof(y)) == "float32[32@data,32@model]"
    np.testing.assert_array_equal(y.block(4), a[:, 0:8])       # data=1 holds rows 16-31 = a again
    with pytest.raises(ShardingTypeError, match="same|one sharding"):
        snp.concatenate([x, simpmd.device_put(a, P("data", None))])


def test_auto_axes_run_and_say_that_xla_chooses():
    raw = simpmd.Mesh(np.array(simpmd.devices()[:8]).reshape(2, 4), ("data", "model"))
    a = arange(16, 32)
    x = simpmd.device_put(a, simpmd.NamedSharding(raw, P("data", "model")))
    assert str(simpmd.typeof(x)) == "float32[16,32]"            # JAX prints no @ for Auto axes
    np.testing.assert_array_equal(x.block(6), a[8:16, 16:24])    # placed as asked
    f = simpmd.jit(lambda x: (x * 2).sum(0))
    y = f(x)
    assert str(simpmd.typeof(y)) == "float32[32]"
    np.testing.assert_array_equal(np.asarray(y), (a * 2).sum(0))
    assert f.trace.calls() == []                                # no collective over Auto axes
    assert "XLA's partitioner chooses" in str(f.trace)


def test_trace_is_costed_and_drawn(mesh):
    import matplotlib
    matplotlib.use("Agg")
    x = simpmd.device_put(arange(16, 32), P("data", "model"))
    w = simpmd.device_put(arange(32, 8), P("model", None))
    f = simpmd.jit(lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)))
    f(x, w)
    from simpmd import cost
    est = cost.estimate_trace(f.trace, hardware="TPU v4")
    assert len(est.collectives) == 2 and all(c.estimate.time_s > 0 and c.estimate.op == "all_reduce" for c in est.collectives)
    assert "psum('model') inserted by jit: dot_general" in str(f.trace)
    fig = f.trace.draw()
    assert fig is not None


def test_hlo_counts_read_tuple_all_to_all():
    text = """
  %all-to-all.2 = (f32[8,1]{1,0}, f32[8,1]{1,0}) all-to-all(%a, %b), channel_id=1
  %all-reduce = f32[] all-reduce(%x), channel_id=2
  ROOT %collective-permute = f32[4,16]{1,0} collective-permute(%c), channel_id=3
  %fusion = f32[8] fusion(%all-reduce), kind=kLoop
"""
    assert hlo_collective_counts(text) == {"all-reduce": 1, "all-to-all": 1, "collective-permute": 1}


def test_simpmd_numpy_routes_by_argument(mesh):
    a, b = arange(16, 32), np.ones((32, 8), np.float32)
    y = snp.matmul(a, b, out_sharding=P("data", None))          # NumPy inputs, a mesh set
    assert str(simpmd.typeof(y)) == "float32[16@data,8]"
    np.testing.assert_allclose(np.asarray(y), a @ b)
    assert isinstance(snp.tanh(a), np.ndarray)                 # plain NumPy stays NumPy
    with pytest.raises(ShardingTypeError, match="unsharded over the axis"):
        snp.cumsum(simpmd.device_put(a, P("data")), axis=0)


def test_eager_operations_log_their_collectives(mesh):
    x = simpmd.device_put(arange(16, 32), P("data", "model"))
    x.sum(0)
    assert collective_counts(simpmd.last_trace()) == {"all-reduce": 1}
    assert simpmd.last_trace().collective_counts() == {"all-reduce": 1}


# -- traced once per signature, and what each device runs ----------------------------------------

def test_traced_once_per_signature_static_arguments_included(mesh):
    calls = []

    def f(x, n):
        calls.append(n)
        return x * n
    g = simpmd.jit(f, static_argnums=1)
    x = simpmd.device_put(arange(8, 4), P("data"))
    g(x, 2), g(x, 2)
    assert calls == [2]
    np.testing.assert_array_equal(np.asarray(g(x, 3)), arange(8, 4) * 3)
    assert calls == [2, 3]                                       # a new static value
    g(simpmd.device_put(arange(16, 4), P("data")), 2)
    assert calls == [2, 3, 2]                                    # a new shape


def megatron_args():
    x = simpmd.device_put(arange(16, 8) / 100, P("data", None))
    w1 = simpmd.device_put(arange(8, 32) / 100, P(None, "model"))
    w2 = simpmd.device_put(arange(32, 8) / 100, P("model", None))
    return x, w1, w2


MLP = simpmd.jit(lambda x, w1, w2: snp.matmul(snp.tanh(x @ w1), w2, out_sharding=P("data", None)))


def test_compiled_program_is_what_each_device_runs(mesh):
    compiled = MLP.lower(*megatron_args()).compile()
    eqns = compiled.program.eqns
    assert [e.primitive.name for e in eqns] == ["dot_general", "tanh", "dot_general", "psum"]
    # each device: its (8, 8) rows of x times its (8, 8) columns of W1, then (8, 8) @ (8, 8)
    assert [v.aval.shape for v in eqns[0].invars] == [(8, 8), (8, 8)]
    assert eqns[3].params["axes"] == ("model",) and eqns[3].outvars[0].aval.shape == (8, 8)
    assert compiled.collective_counts() == {"all-reduce": 1}
    assert "psum[axes=('model',)" in compiled.as_text()
    assert "jit[" in MLP.lower(*megatron_args()).as_text()


def test_roofline_and_timeline_of_a_jit_function(mesh):
    import matplotlib
    matplotlib.use("Agg")
    from simpmd import cost
    r = cost.roofline(MLP, *megatron_args(), hardware="TPU v5e")
    rows = {e.primitive: e for e in r.equations}
    assert rows["dot_general"].flops == 2 * 8 * 8 * 8             # one device's block product
    assert rows["psum"].axes == ("model",) and rows["psum"].comm_bytes == 2 * 3 / 4 * 8 * 8 * 4
    MLP(*megatron_args())
    from simpmd.viz.timeline import model_timeline
    tl = model_timeline(MLP.trace, "TPU v5e")
    assert "roofline" in tl.compute_model
    comm = [s for s in tl.segments if s.kind == "comm"]
    assert len(comm) == 8 and {s.label for s in comm} == {"psum"}
    assert MLP.trace.draw_timeline("TPU v5e") is not None


def test_every_row_has_a_sharding_rule_but_collectives_and_calls():
    from simpmd.api import partition
    planner = {"flash_attention", "flash_attention_bwd",   # (simpmd.plan's, once it is
               "dropout", "dropout_grad", "fp8_cast",      # imported)
               "fp8_operand", "fp8_grad", "fp8_scale_update", "fp8_after", "fp8_region",
               "decode_attention",                          # (plan.serve's, in shard_map only)
               "log_softmax", "log_softmax_backward", "nll_loss", "nll_loss_backward",
               "fused_cross_entropy", "fused_cross_entropy_backward"}   # (plan.loss's)
    assert [n for n in partition.rows_without_rules() if n not in planner] == sorted([
        "all_gather", "all_gather_invariant", "all_to_all", "axis_index", "debug_callback",
        "shard_slice", "pmax", "pmean", "pmin", "ppermute", "preduced", "psum", "pvary",
        "reduce_scatter", "reduced_vary_cast", "slice_piece", "unreduce", "unreduced_psum",
        "vary_unreduced_cast"])          # (the partitioner's rows on blocks; shard_map's by hand)


def test_a_collective_inside_jit_needs_shard_map(mesh):
    x = simpmd.device_put(arange(8, 4), P("data"))
    with pytest.raises(simpmd.UnboundAxisError, match="shard_map"):
        simpmd.jit(lambda x: simpmd.lax.psum(x, "data"))(x)


def test_a_jitted_function_inside_a_pmap_body_is_a_jit_equation():
    calls = []

    @simpmd.jit
    def inner(x):
        calls.append(1)
        return x * 2.0
    f = simpmd.pmap(lambda x: simpmd.lax.psum(inner(x), "i"), axis_name="i")
    np.testing.assert_allclose(np.asarray(f(np.arange(8.0))), np.full(8, 2 * 28.0))
    assert calls == [1]
    assert "jit[" in str(simpmd.make_jaxpr(f)(np.arange(8.0)))
    g = simpmd.grad(lambda x: inner(x).sum())(np.ones(3, np.float32))
    np.testing.assert_allclose(g, np.full(3, 2.0))


def test_a_partial_sum_resharded_and_used_again_is_summed_for_each_use(mesh):
    all8 = P(("data", "model"), None)
    a, b = arange(32, 16) / 100, arange(32, 8) / 100

    def f(x, y):
        g = snp.matmul(x.T, y, out_sharding=P())      # each device: a partial sum
        return simpmd.reshard(g, all8), g + 1.0      # one use keeps a slice, one the whole
    split, whole = simpmd.jit(f)(simpmd.device_put(a, all8), simpmd.device_put(b, all8))
    np.testing.assert_allclose(np.asarray(split), a.T @ b, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(whole), a.T @ b + 1, rtol=1e-5)
    assert collective_counts(simpmd.last_trace()) == {"all-reduce": 1, "reduce-scatter": 1}


def _printed_programs(jit, L, np_):
    inner = jit(lambda x: (x, x * 2.0))
    other = jit(lambda x: np_.sin(x) * 2.0)

    def long(x):                                   # 11 equations: printed first from jax 0.10.2
        for _ in range(11):
            x = np_.sin(x)
        return x
    return {
        "one call": lambda x, w: jit(lambda a, b: np_.tanh(a @ b))(x, w),
        "a result that is an argument": lambda x, w: inner(x[0]),
        "an argument passed twice": lambda x, w: jit(lambda a, b: a + b)(w, w),
        "a literal argument": lambda x, w: jit(lambda a, b: a * b)(x, 3.0),
        "nested, closing over": lambda x, w: jit(lambda a: jit(lambda b: np_.sin(b) + a)(a * 2.0))(x),
        "called twice": lambda x, w: inner(x[0])[1] + inner(x[1])[0],
        "two shared lambdas": lambda x, w: other(inner(x[0])[1]) + other(inner(x[1])[0]),
        "a long body": lambda x, w: jit(long)(x),
        "a one-line program": lambda x, w: x * 2.0,
        "cond": lambda x, w: L.cond(x[0, 0] > 0, np_.sin, np_.cos, x),
        "cond, a long branch": lambda x, w: L.cond(x[0, 0] > 0, long, np_.cos, x),
        "scan, a long body": lambda x, w: L.scan(lambda c, r: (long(c), c), x[0], None, length=2),
        "cond, closing over": lambda x, w: L.cond(
            x[0, 0] > 0, lambda v: v + w[0], lambda v: v * x[1] + w[0], x[0]),
        "switch, an int16 index": lambda x, w: L.switch(
            (x[0, 0] > 0).astype(np_.int16), [np_.sin, np_.cos, np_.tanh], x),
        "switch, one branch": lambda x, w: L.switch(x[0, 0].astype(np_.int32), [np_.sin], x),
        "switch, closing over": lambda x, w: L.switch(
            1, [lambda v: v * w[1], lambda v: v + x[1], lambda v: v - w[1] * x[0]], x[0]),
    }


@pytest.mark.parametrize("name", list(_printed_programs(simpmd.jit, simpmd.lax, snp)))
def test_make_jaxpr_prints_nested_programs_as_jax_does(jax8, name):
    """The body of a jit equation reuses the names of its operands and results, each once
    (JAX's printer suggests them); a body used twice (or, from jax 0.10.2, longer than 10
    equations) is printed once, first; what fits on a line is printed on one."""
    import jax.numpy as jnp
    x, w = np.arange(6.0, dtype=np.float32).reshape(2, 3), np.ones((3, 3), np.float32)
    mine = _printed_programs(simpmd.jit, simpmd.lax, snp)[name]
    theirs = _printed_programs(jax8.jit, jax8.lax, jnp)[name]
    assert str(simpmd.make_jaxpr(mine)(x, w)) == str(jax8.make_jaxpr(theirs)(x, w))


def test_switch_refuses_a_float_index_as_jax_does(jax8):
    import jax.numpy as jnp
    x = np.arange(3.0, dtype=np.float32)
    with pytest.raises(TypeError, match="Index type must be an integer"):
        jax8.make_jaxpr(lambda v: jax8.lax.switch(v[0], [jnp.sin, jnp.cos], v))(x)
    with pytest.raises(TypeError, match="Index type must be an integer"):
        simpmd.make_jaxpr(lambda v: simpmd.lax.switch(v[0], [snp.sin, snp.cos], v))(x)
