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
    # each trip: the matmul, the counter's increment and the test, each a tiny kernel
    trip = matmul_s() + 2 * H100.kernel_launch_s
    assert r.predict().time_s == pytest.approx(3 * trip + H100.dispatch_s)
    assert r.predict(while_trips=4).time_s == pytest.approx(4 * trip + H100.dispatch_s)


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
