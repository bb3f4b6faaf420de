"""simpmd.cost.predict: the predicted time of a program, checked by hand on small cases:
sustained rates and floors, collectives overlapped with independent compute (and not with
what waits on them), loops, conditionals, and terms that add up to the time."""
import pytest

from simpmd import cost as C

H100 = C.HARDWARE["H100"]
N = 4096


def matmul_s(n=N):
    """A bf16 n^3 matmul at the H100's sustained rate (compute-bound at this size)."""
    return 2 * n ** 3 / H100.sustained_matmul_flops("bf16")


def abstract(jax, *shapes):
    jnp = jax.numpy
    return [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in shapes]


def test_a_matmul_by_hand(jax8):
    program = jax8.make_jaxpr(lambda a, b: a @ b)(*abstract(jax8, (N, N), (N, N)))
    p = C.roofline_of(program, hardware="H100").prediction
    assert p.time_s == pytest.approx(matmul_s() + H100.dispatch_s)
    assert p.terms["compute"] == pytest.approx(matmul_s())
    assert p.bound == "compute" and sum(p.terms.values()) == pytest.approx(p.time_s)


def test_a_collective_hides_behind_independent_compute(jax8):
    lax = jax8.lax
    x_bytes = 2 * 2**26

    def step(a, b, g):
        return a @ b, lax.psum(g, "i")            # the gradient's psum needs no matmul
    program = jax8.make_jaxpr(step, axis_env=[("i", 8)])(
        *abstract(jax8, (N, N), (N, N), (2**26,)))
    psum = C.estimate("psum", x_bytes, 8, hardware="H100").time_s
    r = C.roofline_of(program, hardware="H100", axis_env=[("i", 8)])
    hidden, serial = r.predict(), r.predict(overlap=False)
    assert hidden.time_s == pytest.approx(max(matmul_s(), psum) + H100.dispatch_s)
    assert serial.time_s == pytest.approx(matmul_s() + psum + H100.dispatch_s)
    assert hidden.terms["communication"] == pytest.approx(max(0.0, psum - matmul_s()), abs=1e-9)
    assert serial.terms["communication"] == pytest.approx(psum)
    comm = [k for k in hidden.kernels if k.stream == "communication"]
    assert len(comm) == 1 and comm[0].start_s == 0.0       # issued at once, beside the matmul


def test_collectives_start_in_the_order_their_operands_are_ready(jax8):
    """psum(g) comes last in the program, but g is ready at once: it runs during the
    product, before the psum of the product's result (as XLA's scheduler issues it)."""
    lax = jax8.lax
    program = jax8.make_jaxpr(lambda a, b, g: (lax.psum(a @ b, "i"), lax.psum(g, "i")),
                              axis_env=[("i", 8)])(*abstract(jax8, (N, N), (N, N), (2**22,)))
    first = C.estimate("psum", 2 * 2**22, 8, hardware="H100").time_s
    second = C.estimate("psum", 2 * N * N, 8, hardware="H100").time_s
    assert first < matmul_s()
    p = C.roofline_of(program, hardware="H100", axis_env=[("i", 8)]).prediction
    assert p.time_s == pytest.approx(matmul_s() + second + H100.dispatch_s)
    starts = sorted((k.start_s, k.bytes) for k in p.kernels if k.stream == "communication")
    assert starts[0] == (0.0, 2 * 2 * 2**22)             # g, read and written, first
    assert starts[1][0] == pytest.approx(matmul_s())


def test_what_waits_on_a_collective_is_not_hidden(jax8):
    lax = jax8.lax
    program = jax8.make_jaxpr(lambda x, w: lax.psum(x, "i") @ w, axis_env=[("i", 8)])(
        *abstract(jax8, (N, N), (N, N)))
    psum = C.estimate("psum", 2 * N * N, 8, hardware="H100").time_s
    p = C.roofline_of(program, hardware="H100", axis_env=[("i", 8)]).prediction
    assert p.time_s == pytest.approx(psum + matmul_s() + H100.dispatch_s)


def test_a_scan_costs_its_body_per_iteration(jax8):
    lax = jax8.lax
    def loop(x, ws):
        return lax.scan(lambda c, w: (c @ w, None), x, ws)[0]
    program = jax8.make_jaxpr(loop)(*abstract(jax8, (N, N), (4, N, N)))
    p = C.roofline_of(program, hardware="H100").prediction
    assert p.time_s == pytest.approx(4 * matmul_s() + H100.dispatch_s)


def test_cond_costs_its_costliest_branch_and_while_needs_trips(jax8):
    lax, jnp = jax8.lax, jax8.numpy
    def branchy(p, a, b):
        return lax.cond(p, lambda a, b: a @ b, lambda a, b: a + b, a, b)
    program = jax8.make_jaxpr(branchy)(jax8.ShapeDtypeStruct((), jnp.bool_),
                                       *abstract(jax8, (N, N), (N, N)))
    p = C.roofline_of(program, hardware="H100").prediction
    # the predicate becomes the branch index in one tiny kernel, at the launch floor
    assert p.time_s == pytest.approx(matmul_s() + H100.kernel_launch_s + H100.dispatch_s)
    assert any("costliest branch" in n for n in p.notes)

    def loop(a, b, n):
        return lax.while_loop(lambda c: c[1] < n, lambda c: (c[0] @ b, c[1] + 1), (a, 0))[0]
    program = jax8.make_jaxpr(loop)(*abstract(jax8, (N, N), (N, N)),
                                    jax8.ShapeDtypeStruct((), jnp.int32))
    with pytest.raises(ValueError, match="while_trips"):   # the walk refuses, naming it
        C.roofline_of(program, hardware="H100")
    r = C.roofline_of(program, hardware="H100", while_trips=3)
    # each trip: the test, the matmul and the counter's increment (the two small ones a
    # kernel at the launch floor each); the test once more, when the loop ends
    trip = matmul_s() + 2 * H100.kernel_launch_s
    test = H100.kernel_launch_s
    assert r.predict().time_s == pytest.approx(3 * trip + test + H100.dispatch_s)
    assert r.predict(while_trips=4).time_s == pytest.approx(4 * trip + test + H100.dispatch_s)


def test_a_tiny_program_waits_on_launches(jax8):
    program = jax8.make_jaxpr(lambda x: x + 1)(*abstract(jax8, (8,)))
    p = C.roofline_of(program, hardware="H100").prediction
    assert p.bound == "launch"
    assert p.time_s == pytest.approx(H100.kernel_launch_s + H100.dispatch_s)


def test_shard_map_costs_what_each_device_runs(jax8):
    import simpmd
    import numpy as np
    mesh = simpmd.make_mesh((8,), ("i",))
    f = simpmd.shard_map(lambda a, b: a @ b, mesh=mesh, in_specs=(simpmd.P("i"), simpmd.P()),
                         out_specs=simpmd.P("i"))
    r = C.roofline(f, np.ones((8 * 512, 2048), np.float32), np.ones((2048, 2048), np.float32),
                   hardware="H100")
    one = C.roofline_of(jax8.make_jaxpr(lambda a, b: a @ b)(
        *[jax8.ShapeDtypeStruct(s, jax8.numpy.float32) for s in ((512, 2048), (2048, 2048))]),
        hardware="H100")
    assert r.predicted_s == pytest.approx(one.predicted_s)


def test_the_timeline_draws_collectives_beside_compute(jax8):
    import matplotlib
    matplotlib.use("Agg")
    from simpmd.viz.canvas import tagged
    from simpmd.viz.timeline import draw_prediction
    lax = jax8.lax
    program = jax8.make_jaxpr(lambda a, b, g: (a @ b, lax.psum(g, "i")), axis_env=[("i", 8)])(
        *abstract(jax8, (N, N), (N, N), (2**26,)))
    r = C.roofline_of(program, hardware="H100", axis_env=[("i", 8)])
    for overlap, lane in ((True, 1), (False, 0)):
        fig = draw_prediction(r.predict(overlap=overlap))
        (comm,) = tagged(fig, "comm")
        assert round(comm.get_y() + comm.get_height() / 2) == lane    # its own row, or not
        assert len(tagged(fig, "kernel")) == 1
        assert comm.get_x() == 0.0 if overlap else comm.get_x() > 0   # beside, or after


def test_the_timeline_tells_a_hidden_collective_from_an_exposed_one(jax8):
    """Lesson 7's picture: a gradient all-reduce that needs nothing runs beside the matmuls
    and is labelled hidden; the psum of the matmul's product starts after it, so the
    compute row waits (a hatched gap) and its label says it is exposed; a fused kernel's
    '+8' reads as fused equations."""
    import matplotlib
    matplotlib.use("Agg")
    from simpmd.viz.timeline import draw_prediction, prediction_label
    lax = jax8.lax
    program = jax8.make_jaxpr(lambda a, b, g: (lax.psum(jax8.nn.gelu(a @ b), "i"),
                                               lax.psum(g, "i")), axis_env=[("i", 8)])(
        *abstract(jax8, (N, N), (N, N), (2**22,)))
    p = C.roofline_of(program, hardware="H100", axis_env=[("i", 8)]).predict()
    busy = [(k.start_s, k.end_s) for k in p.kernels if k.stream == "compute"]
    labels = sorted(prediction_label(k, busy) for k in p.kernels if k.stream == "communication")
    assert labels == ["psum over i: exposed: compute waits", "psum over i: hidden behind compute"]
    (matmul,) = [k for k in p.kernels if k.stream == "compute"]
    assert "+" in matmul.name and " fused equations" in prediction_label(matmul, busy)
    fig = draw_prediction(p)
    hatched = [r for r in fig.axes[0].patches if r.get_hatch() == "///"]
    assert len(hatched) == 1 and hatched[0].get_x() > 0


def test_every_kind_of_program_the_roofline_takes_has_a_prediction(jax8):
    """Calls, custom derivatives, checkpoints, loops, conditionals, every collective, sorts,
    gathers and scatters: predicted_s exists, and its terms add up to it."""
    jax, jnp, lax = jax8, jax8.numpy, jax8.lax
    x = jax.ShapeDtypeStruct((64, 64), jnp.float32)
    i32 = jax.ShapeDtypeStruct((8,), jnp.int32)
    cases = [
        (lambda a: jax.jit(jnp.tanh)(a) + jax.jit(jnp.tanh)(a), (x,)),   # one body, twice
        (lambda a: jax.nn.relu(a) + jax.nn.gelu(a), (x,)),
        (jax.grad(lambda a: jax.checkpoint(lambda b: jnp.sin(b) @ b)(a).sum()), (x,)),
        (lambda a: lax.fori_loop(0, 3, lambda k, c: c @ a, a), (x,)),
        (lambda a: lax.switch(0, [jnp.sin, jnp.cos, lambda b: b @ b], a), (x,)),
        (lambda a, k: (jnp.sort(a, axis=0), a[k], a.at[k].add(1.0), jnp.cumsum(a, 0)), (x, i32)),
        (lambda a: (lax.all_gather(a, "i"), lax.psum_scatter(a, "i", tiled=True),
                    lax.all_to_all(a, "i", 0, 0, tiled=True), lax.pmax(a, "i"),
                    lax.ppermute(a, "i", [(j, (j + 1) % 8) for j in range(8)]),
                    lax.axis_index("i")), (x,)),
    ]
    for fn, args in cases:
        program = jax.make_jaxpr(fn, axis_env=[("i", 8)])(*args)
        for hw in ("H100", "TPU v5e", "T4"):
            r = C.roofline_of(program, hardware=hw, axis_env=[("i", 8)])
            assert r.predicted_s > 0
            assert sum(r.terms.values()) == pytest.approx(r.predicted_s)
            assert r.bound in r.terms


# -- the rules the planner's steps are costed by, on small programs --------------------------
# simpmd's own programs in float16 (bfloat16's size and rate on the presets, NumPy's own
# type); every expected time written out from the preset's rates and cost.estimate.

def _program(f, *shapes, axes=(("tp", 2),)):
    import simpmd
    return simpmd.make_jaxpr(f, axis_env=list(axes))(
        *[simpmd.ShapeDtypeStruct(s, "float16") for s in shapes])


def _on_h100(program, sizes, **options):
    import math
    return C.predict.predict(program, "H100", sizes, H100.topology(math.prod(sizes.values())),
                             **options)


def _kernel_s(m, k, n):
    """One float16 m x k x n product: the larger of its FLOPs at the sustained rate and its
    bytes at the sustained bandwidth, at least a launch."""
    return max(2 * m * k * n / H100.sustained_matmul_flops("fp16"),
               2 * (m * k + k * n + m * n) / H100.sustained_hbm_bandwidth, H100.kernel_launch_s)


def _collective_s(op, nbytes, group):
    return C.estimate(op, nbytes, len(group), hardware="H100", devices=group,
                      topology=H100.topology(max(group) + 1)).time_s


def test_a_collective_whose_result_is_needed_next_is_exposed():
    from simpmd import lax
    program = _program(lambda x, w: lax.psum(x @ w, "tp") @ w, (N, N), (N, N))
    p = _on_h100(program, {"tp": 2})
    psum = _collective_s("psum", N * N * 2, [0, 1])
    assert psum > 0
    assert p.terms["compute"] == pytest.approx(2 * _kernel_s(N, N, N))
    assert p.terms["communication"] == pytest.approx(psum)
    assert p.time_s == pytest.approx(2 * _kernel_s(N, N, N) + psum + H100.dispatch_s)
    assert sum(p.terms.values()) == pytest.approx(p.time_s)


def test_a_collective_beside_independent_work_overlaps_it():
    """psum(x @ w) is not needed by the next product: the step takes the longer of the two
    streams, not their sum."""
    from simpmd import lax
    program = _program(lambda x, w: (lax.psum(x @ w, "tp"), x @ w @ w), (N, N), (N, N))
    p = _on_h100(program, {"tp": 2})
    psum, one = _collective_s("psum", N * N * 2, [0, 1]), _kernel_s(N, N, N)
    assert p.terms["communication"] == 0
    assert p.time_s == pytest.approx(max(3 * one, one + psum) + H100.dispatch_s)


def test_a_blocking_all_to_all_holds_the_compute_stream():
    """An all_to_all nothing after it needs runs beside the next products (the longer of
    the two streams); named ``blocking``, as Megatron-Core's synchronous dispatch runs it,
    the compute stream waits for it first (their sum)."""
    from simpmd import lax
    program = _program(lambda x, w: (lax.all_to_all(x, "ep", 0, 0, tiled=True), x @ w @ w),
                       (N, N), (N, N), axes=(("ep", 8),))
    a2a, one = _collective_s("all_to_all", N * N * 2, list(range(8))), _kernel_s(N, N, N)
    free = _on_h100(program, {"ep": 8})
    held = _on_h100(program, {"ep": 8}, blocking=("all_to_all",))
    assert free.time_s == pytest.approx(max(2 * one, a2a) + H100.dispatch_s)
    assert held.time_s == pytest.approx(a2a + 2 * one + H100.dispatch_s)
    assert held.terms["communication"] == pytest.approx(a2a)


def test_a_loop_gathers_the_next_weights_during_this_iteration():
    """A scan whose all_gather reads only its xs (FSDP's weights): after the first
    iteration the gather of the next overlaps the product of this one."""
    from simpmd import lax

    def f(x, ws):
        return lax.scan(lambda h, w: (h @ lax.all_gather(w, "fsdp", axis=0, tiled=True), None),
                        x, ws)[0]
    program = _program(f, (2 * N, N), (6, N // 8, N), axes=(("fsdp", 8),))
    p = _on_h100(program, {"fsdp": 8})
    gather = _collective_s("all_gather", N // 8 * N * 2, list(range(8)))
    one = _kernel_s(2 * N, N, N)
    assert p.time_s == pytest.approx(gather + one + 5 * max(gather, one) + H100.dispatch_s)
    assert p.terms["compute"] == pytest.approx(6 * one)


def test_a_fused_chain_moves_what_enters_and_what_leaves():
    """x * 2 + 1 then tanh: one pass, reading x and writing the result."""
    import simpmd
    program = _program(lambda x: simpmd.numpy.tanh(x * 2.0 + 1.0), (N, N))
    p = _on_h100(program, {"tp": 2})
    assert p.terms["memory"] == pytest.approx(2 * N * N * 2 / H100.sustained_hbm_bandwidth)


def test_the_pipeline_bubble_is_its_idle_ticks():
    from simpmd import lax

    def f(x, w):
        return lax.scan(lambda h, _: (h @ w, None), x, None, length=7)[0]
    p = _on_h100(_program(f, (N, N), (N, N)), {"tp": 2}, pipeline=(7, 3))
    assert p.terms["bubble"] == pytest.approx(3 * _kernel_s(N, N, N))
    assert p.terms["compute"] == pytest.approx(4 * _kernel_s(N, N, N))


def test_precision_prices_the_products_of_weights_only():
    """precision='fp8' runs x @ w (no batch dimension: a linear layer) on the FP8 path; a
    batched product (attention's) keeps the path of its types."""
    import simpmd
    program = _program(lambda x, w, q: (x @ w, simpmd.numpy.einsum("bij,bjk->bik", q, q)),
                       (N, N), (N, N), (8, 1024, 1024))
    p = _on_h100(program, {"tp": 2}, precision="fp8")
    assert sorted(k.path for k in p.kernels) == ["fp16", "fp8"]
    fp8 = 2 * N ** 3 / H100.sustained_matmul_flops("fp8")
    assert next(k for k in p.kernels if k.path == "fp8").compute_s == pytest.approx(fp8)


def test_a_gradient_accumulated_in_a_loop_is_added_in_place_with_accumulation_fusion():
    """The gradient of weights a scan reads as constants is accumulated in the loop's carry
    (from zeros), then added (add_any) to the gradient of their other use: with Megatron's
    gradient-accumulation fusion neither the zeros nor the addition is a pass over memory."""
    import simpmd
    from simpmd import lax

    def loss(w, x):
        h = lax.scan(lambda c, _: (simpmd.numpy.tanh(c @ w), None), x, None, length=4)[0]
        return (h @ w).sum()
    program = _program(simpmd.grad(loss), (N, N), (N, N))
    xla, fused = (_on_h100(program, {"tp": 2}, accumulation_fusion=a) for a in (False, True))
    # what the fused prediction leaves out: zeros written, then read, added and written
    assert xla.terms["memory"] - fused.terms["memory"] == pytest.approx(
        4 * N * N * 2 / H100.sustained_hbm_bandwidth, rel=0.01)


# -- memory, kernel by kernel -----------------------------------------------------------------

def test_a_fused_chain_holds_only_its_input_and_result():
    import simpmd
    program = _program(lambda x: simpmd.numpy.tanh(x * 2.0 + 1.0), (1024, 1024))
    assert C.memory.peak_memory(program, fused=True).peak == 2 * 1024 * 1024 * 2
    # equation by equation, x, 2x and 2x + 1 are live while the add runs
    assert C.memory.peak_memory(program).peak == 3 * 1024 * 1024 * 2


def test_a_product_is_held_until_its_last_reader():
    """y = x @ w is read last by the third product. Each value is 1024 x 1024 float16 (a
    unit): x, w and y are live at the first product (x, donated, is freed after it), w,
    y and z at the second (w freed after it), y, z and the result at the third: 3 units;
    keeping the arguments (x and w to the end), the third holds 5."""
    program = _program(lambda x, w: (lambda y: (y @ w) @ y)(x @ w), (1024, 1024), (1024, 1024))
    unit = 1024 * 1024 * 2
    assert C.memory.peak_memory(program, fused=True, donate=True).peak == 3 * unit
    assert C.memory.peak_memory(program, fused=True).peak == 5 * unit
