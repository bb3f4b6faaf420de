"""One walk over a program (simpmd/cost/walk.py): what a cond, a loop and a checkpoint
count, the same for the roofline, memory's FLOPs and liveness, the timelines and the
prediction (and the planner's steps, which it costs).

Expectations: FLOPs counted by hand (2 m n k per matrix product, times the iterations or
branches a NumPy re-enactment of the program runs), and jax.experimental.roofline on the
same programs (its peak_hbm_bytes; its FLOPs, which count a scan's body once).
"""
import logging

import numpy as np
import pytest

from fuzz_seeds import seeds

import simpmd
import simpmd.cost as C
import simpmd.numpy as snp
from simpmd import lax, viz
from simpmd.cost.memory import flops, peak_memory

N = 256
A = np.full((N, N), 0.01, np.float32)
MATMUL = 2 * N ** 3                      # one N x N x N product, by hand


def _shapes(*arrays):
    return [simpmd.ShapeDtypeStruct(a.shape, a.dtype) for a in arrays]


def _in_cond(x):
    return lax.cond(x.sum() > 0, lambda y: y @ y, lambda y: y, x)


def _in_while(x):
    return lax.while_loop(lambda c: c[1] < 3, lambda c: (c[0] @ c[0], c[1] + 1), (x, 0))[0]


# -- the two disagreements the issue found, gone ------------------------------------------------

def test_a_matmul_inside_cond_costs_the_branch_taken_on_values():
    taken = C.roofline(_in_cond, A)                  # sum > 0: the matmul branch
    skipped = C.roofline(_in_cond, -A)               # sum < 0: the branch that returns y
    assert taken.flops == MATMUL and skipped.flops == 0
    program = simpmd.make_jaxpr(_in_cond)(A)
    for x, r in ((A, taken), (-A, skipped)):
        counts = C.walk.taken_on(program, (x,))
        assert flops(program, taken=counts) == r.unfused_flops
    assert taken.notes == [] and skipped.notes == []


def test_a_cond_on_values_costs_the_branch_taken_under_an_axis_env_too():
    """Every device of ``axis_env`` shares one copy of the input (issue 45 item 8): each
    still takes its own branch, as under pmap."""
    w = np.full((N, N), 0.5, np.float32)
    f = lambda x: lax.cond(x.sum() > 0, lambda y: y @ w, lambda y: y, x)
    taken = C.roofline(f, A, axis_env=[("i", 8)])
    skipped = C.roofline(f, -A, axis_env=[("i", 8)])
    assert (taken.flops, skipped.flops) == (MATMUL, 0)
    mapped = C.roofline(simpmd.pmap(f, axis_name="i"), np.broadcast_to(A, (8, N, N)))
    assert mapped.flops == taken.flops and mapped.unfused_flops == taken.unfused_flops


def test_a_matmul_inside_cond_costs_its_costliest_branch_on_shapes_and_says_so():
    r = C.roofline(_in_cond, *_shapes(A))
    assert r.flops == MATMUL
    assert r.unfused_flops == flops(simpmd.make_jaxpr(_in_cond)(*_shapes(A)))
    assert len(r.notes) == 1 and "costliest branch (1 of 2" in r.notes[0]
    assert "note: cond at test_cost_walk.py:" in str(r)


def test_a_matmul_inside_while_loop_costs_each_trip():
    on_values = C.roofline(_in_while, A)
    assert on_values.flops == 3 * MATMUL             # i = 0, 1, 2
    program = simpmd.make_jaxpr(_in_while)(A)
    assert flops(program, taken=C.walk.taken_on(program, (A,))) == on_values.unfused_flops
    with pytest.raises(ValueError, match=r"while_loop at test_cost_walk.py:\d+ .*while_trips"):
        C.roofline(_in_while, *_shapes(A))
    with pytest.raises(ValueError, match="while_trips"):
        flops(program)
    on_shapes = C.roofline(_in_while, *_shapes(A), while_trips=3)
    assert on_shapes.flops == 3 * MATMUL and on_shapes.unfused_flops == on_values.unfused_flops
    line = C.walk._source(program.eqns[-1])
    assert C.roofline(_in_while, *_shapes(A), while_trips={line: 5}).flops == 5 * MATMUL
    assert flops(program, while_trips=3) == on_values.unfused_flops


def test_the_prediction_runs_the_trips_the_walk_counted():
    """Roofline.predicted_s prices a while loop with the walk's trips: those a run on
    values counted, or while_trips (an int, or by the loop's line) on shapes."""
    on_values = C.roofline(_in_while, A, hardware="H100")
    on_shapes = C.roofline(_in_while, *_shapes(A), hardware="H100", while_trips=3)
    line = C.walk._source(simpmd.make_jaxpr(_in_while)(A).eqns[-1])
    by_line = C.roofline(_in_while, *_shapes(A), hardware="H100", while_trips={line: 3})
    assert on_values.predicted_s == on_shapes.predicted_s == by_line.predicted_s
    assert on_values.predict(while_trips=4).time_s > on_values.predicted_s


def test_each_device_runs_its_own_branch_and_the_roofline_costs_the_busiest():
    """Device k multiplies k times (a while loop) and takes the matmul branch when k is odd:
    the busiest device, 3, runs 3 + 1 products; device 0 none."""
    def body(x):
        k = lax.axis_index("i")
        x = lax.while_loop(lambda c: c[1] < k, lambda c: (c[0] @ c[0], c[1] + 1), (x, 0))[0]
        return lax.cond(k % 2 == 1, lambda y: y @ y, lambda y: y, x)
    f = simpmd.pmap(body, axis_name="i")
    xs = np.stack([A] * 4)
    r = C.roofline(f, xs)
    assert r.flops == (3 + 1) * MATMUL
    taken = C.taken_in(f.trace)
    assert [C.roofline_of(f.trace.program, taken=taken, device=d).flops for d in range(4)] == [
        0, 2 * MATMUL, 2 * MATMUL, 4 * MATMUL]
    assert viz.model_timeline(f.trace, "H100").roofline.unfused_flops == r.unfused_flops


def test_the_gradient_of_a_bfloat16_scan_counts_its_flops(jax8):
    """It counted 0 (the derivative skipped bfloat16 carries, whose NumPy kind is 'V'): now
    2 n^3 per product, three products per iteration (forward, and the carry's and the
    weight's cotangents), as jax.experimental.roofline counts JAX's (its body once)."""
    pytest.importorskip("absl")
    import jax
    from jax.experimental import roofline
    L, n = 4, 64

    def loss(w, xs, L_=lax):
        c, _ = L_.scan(lambda c, x: (c @ w + x, None), xs[0], xs)
        return c.astype(np.float32).sum()
    w = jax.ShapeDtypeStruct((n, n), "bfloat16")
    xs = jax.ShapeDtypeStruct((L, n, n), "bfloat16")
    ours = C.roofline(simpmd.grad(loss), *_shapes(w, xs))
    logging.disable(logging.WARNING)
    try:
        _, theirs = roofline.roofline(jax.grad(lambda w, xs: loss(w, xs, jax.lax)))(w, xs)
    finally:
        logging.disable(logging.NOTSET)
    assert ours.flops == 3 * L * 2 * n ** 3 == L * theirs.flops
    rng = np.random.default_rng(0)
    wv = (rng.standard_normal((n, n)) * 0.05).astype(jax.numpy.bfloat16)
    xv = (rng.standard_normal((L, n, n)) * 0.05).astype(jax.numpy.bfloat16)
    mine = np.asarray(simpmd.grad(loss)(wv, xv), np.float32)
    theirs_g = np.asarray(jax.grad(lambda w, xs: loss(w, xs, jax.lax))(wv, xv), np.float32)
    assert np.abs(mine).max() > 0
    np.testing.assert_allclose(mine, theirs_g, rtol=0.05, atol=0.05 * np.abs(theirs_g).max())


# -- memory like JAX's roofline, on loop programs ---------------------------------------------

def _loop_programs(jax):
    def scan_f(w, x):
        return lax.scan(lambda h, wi: (snp.tanh(h @ wi), None), x, w)[0]

    def remat_f(checkpoint):
        return lambda w, x: lax.scan(lambda h, wi: (checkpoint(
            lambda h, wi: snp.tanh(h @ wi))(h, wi), None), x, w)[0]

    def grad_of(grad, f):
        return lambda w, x: grad(lambda w: (f(w, x) ** 2).sum())(w)
    return {
        "scan": (scan_f, scan_f),
        "grad of a scan": (grad_of(simpmd.grad, scan_f), grad_of(jax.grad, scan_f)),
        "checkpoint in a scan": (remat_f(simpmd.checkpoint), remat_f(jax.checkpoint)),
        "grad of a checkpoint in a scan": (grad_of(simpmd.grad, remat_f(simpmd.checkpoint)),
                                           grad_of(jax.grad, remat_f(jax.checkpoint))),
        "fori_loop": ((lambda w, x: lax.fori_loop(0, 4, lambda i, h: snp.tanh(h @ w[i]), x)),) * 2,
        "while_loop": ((lambda w, x: lax.while_loop(
            lambda c: c[1] < 4, lambda c: (snp.tanh(c[0] @ w[c[1]]), c[1] + 1), (x, 0))[0]),) * 2,
        "cond": ((lambda w, x: lax.cond(x.sum() > 0, lambda h: snp.tanh(h @ w[0]) @ w[1],
                                        lambda h: h * 2.0, x)),) * 2,
    }


@pytest.mark.parametrize("name", ["scan", "grad of a scan", "checkpoint in a scan",
                                  "grad of a checkpoint in a scan", "fori_loop", "while_loop",
                                  "cond"])
def test_memory_like_jax_is_jax_roofline_peak_on_loop_programs(jax8, name):
    """peak_memory(like_jax=True) of JAX's own jaxpr is peak_hbm_bytes; of simpmd's program
    too, where the two programs hold the same values (simpmd's fori_loop carries its
    counter as JAX's does not; JAX before 0.12 keeps more residuals in a scan's gradient,
    both tanh(x) and 1 - tanh(x): there simpmd's peak is below)."""
    pytest.importorskip("absl")
    from jax.experimental import roofline
    mine, theirs = _loop_programs(jax8)[name]
    shapes = [jax8.ShapeDtypeStruct((4, 64, 64), "float32"),
              jax8.ShapeDtypeStruct((16, 64), "float32")]
    logging.disable(logging.WARNING)
    try:
        _, r = roofline.roofline(theirs)(*shapes)
    finally:
        logging.disable(logging.NOTSET)
    jaxpr = jax8.make_jaxpr(theirs)(*shapes)
    assert peak_memory(jaxpr, like_jax=True).peak == r.peak_hbm_bytes
    program = simpmd.make_jaxpr(mine)(*_shapes(*[np.empty(s.shape, s.dtype) for s in shapes]))

    def stacked(p):           # what the scans return: the carries, and what they keep
        return sorted(tuple(v.aval.shape) for e in C.walk._equation_list(p)
                      if "length" in e.params for v in e.outvars)
    if name == "fori_loop":
        pass
    elif stacked(program) == stacked(jaxpr):
        assert peak_memory(program, like_jax=True).peak == r.peak_hbm_bytes
        assert C.roofline_of(program, while_trips=4).peak_hbm_bytes == r.peak_hbm_bytes
    else:
        assert peak_memory(program, like_jax=True).peak < r.peak_hbm_bytes
    assert peak_memory(program, while_trips=4).peak >= r.peak_hbm_bytes     # simpmd's own rules


def test_memory_like_jax_drops_an_input_nothing_reads_as_jax_does(jax8):
    """JAX's dead-code removal drops an unread argument before its walk: 16 x 64 + 4 x 64 x
    64 float32 are live at the start, not the 4 MiB nobody reads."""
    pytest.importorskip("absl")
    from jax.experimental import roofline

    def f(a, unused, w):
        return jax8.lax.scan(lambda h, wi: (jax8.numpy.tanh(h @ wi), None), a, w)[0]
    shapes = [jax8.ShapeDtypeStruct(s, "float32") for s in ((16, 64), (1024, 1024), (4, 64, 64))]
    logging.disable(logging.WARNING)
    try:
        _, r = roofline.roofline(f)(*shapes)
    finally:
        logging.disable(logging.NOTSET)
    assert peak_memory(jax8.make_jaxpr(f)(*shapes), like_jax=True).peak == r.peak_hbm_bytes \
        == 4 * (16 * 64 + 4 * 64 * 64)


# -- one walk: the roofline, memory and the timeline agree --------------------------------------

D, M, K = 4, 8, 16          # devices, rows of x, width


def _random_program(seed, grad):
    """A pmap over D devices of a chain of blocks on x [M, K] with weights w [3, K, K]; and
    a NumPy re-enactment counting each device's matrix products (without grad)."""
    rng = np.random.default_rng(seed)
    kinds = ["matmul", "cond", "scan", "checkpoint"] + ([] if grad else ["while"])
    blocks = list(rng.choice(kinds, size=int(rng.integers(2, 5))))
    blocks.insert(int(rng.integers(0, len(blocks) + 1)), "cond")

    def body(w, x):
        for kind in blocks:
            if kind == "matmul":
                x = snp.tanh(x @ w[0])
            elif kind == "cond":
                x = lax.cond(x.sum() > 0, lambda h: snp.tanh(h @ w[1]) @ w[2],
                             lambda h: h * 0.5, x)
            elif kind == "scan":
                x = lax.scan(lambda h, wi: (snp.tanh(h @ wi), None), x, w)[0]
            elif kind == "checkpoint":
                x = simpmd.checkpoint(lambda h: snp.tanh(h @ w[1]) @ w[0])(x)
            else:
                x = lax.while_loop(lambda c: c[1] < 2,
                                   lambda c: (snp.tanh(c[0] @ w[2]), c[1] + 1), (x, 0))[0]
        return x

    def products(w, x, costliest=False):    # NumPy, one device: the matrix products it runs
        count = 0
        for kind in blocks:
            if kind == "matmul":
                x, count = np.tanh(x @ w[0]), count + 1
            elif kind == "cond":
                x, count = ((np.tanh(x @ w[1]) @ w[2], count + 2) if costliest or x.sum() > 0
                            else (x * 0.5, count))
            elif kind == "scan":
                for wi in w:
                    x = np.tanh(x @ wi)
                count += len(w)
            elif kind == "checkpoint":
                x, count = np.tanh(x @ w[1]) @ w[0], count + 2
            else:
                for _ in range(2):
                    x = np.tanh(x @ w[2])
                count += 2
        return count
    f = (lambda w, x: simpmd.grad(lambda w: (body(w, x) ** 2).sum())(w)) if grad else body
    return simpmd.pmap(f, axis_name="i", in_axes=(None, 0)), products, blocks


def _four_flops(f, args, while_trips=None):
    """(the roofline's FLOPs, memory's, the timeline's, the prediction's: what its kernels
    compute, each equation once per run) of f on args, and the roofline."""
    r = C.roofline(f, *args, while_trips=while_trips)
    f(*args)
    taken = C.taken_in(f.trace)
    mem = flops(f.trace.program, taken=taken, while_trips=while_trips)
    line = viz.model_timeline(f.trace, "TPU v5e", while_trips=while_trips).roofline
    predicted = C.predict.predict(f.trace.program, "TPU v5e", taken=taken,
                                  while_trips=while_trips).flops
    return (r.unfused_flops, mem, line.unfused_flops, round(r.prediction.flops),
            round(predicted)), r


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("seed", seeds("cost_walk"))
def test_random_programs_cost_the_same_flops_in_every_analysis(seed, grad):
    f, products, blocks = _random_program(seed, grad)
    rng = np.random.default_rng(100 + seed)
    w = (rng.standard_normal((3, K, K)) * 0.3).astype(np.float32)
    shift = rng.choice([-0.3, 0.3], size=(D, 1, 1))        # each device's conds differ
    x = (rng.standard_normal((D, M, K)) + shift).astype(np.float32)
    on_values, r = _four_flops(f, (w, x))
    on_shapes, s = _four_flops(f, _shapes(w, x), while_trips=2)
    assert len(set(on_values)) == 1 and len(set(on_shapes)) == 1, blocks
    assert on_values[0] <= on_shapes[0]        # the costliest branch bounds the one taken
    if not grad:
        busiest = max(products(w, x[d]) for d in range(D))
        assert r.flops == busiest * 2 * M * K * K, blocks
        costliest = products(w, x[0], costliest=True)      # every cond: its matmul branch
        assert s.flops == costliest * 2 * M * K * K, blocks


def test_the_planners_step_computes_the_flops_the_walk_counts():
    """plan.estimate's prediction of a step (a pipeline of ticks, layers in a scan under
    checkpoint, tensor and sequence parallelism, Adam) computes what memory.flops counts on
    the same program, and its recomputation what the walk marks 'recompute'."""
    pytest.importorskip("ml_dtypes", reason="the planner's steps are in bfloat16")
    from simpmd import plan
    from simpmd.plan.simulate import trace_step
    model = plan.Transformer(layers=4, d_model=32, heads=4, kv_heads=2, d_ff=48, vocab=64,
                             seq=16, gated_mlp=True)
    layout = plan.Layout(tp=2, pp=2, vp=2, dp=2, global_batch=16, sequence_parallel=True,
                         recompute="full")
    est = plan.estimate(model, layout, hardware="H100", memory=False)
    program = trace_step(model, layout, "H100")
    assert est.flops == flops(program) > 0
    again = C.predict.predict(program, "H100", layout.shape)
    assert again.flops == est.flops and flops(program, "recompute") > 0
    eager = plan.estimate(model, layout, hardware="H100", memory=False, framework="megatron")
    assert eager.flops == _walked(program, whole_recompute=True) > est.flops


def _walked(program, phase=None, **options):
    walker = C.walk.Walker(program, **options)
    return sum(C.walk.flops_and_bytes(v.eqn, v.row, v.name)[0] * v.times
               for v in walker.visits() if not v.body and (phase is None or v.phase == phase))


def test_a_checkpoint_run_again_whole_as_an_eager_framework_does():
    """sin(x @ w) @ w under a checkpoint that saves nothing: XLA's backward pass recomputes
    x @ w and its sine (what the derivatives read), not the last product, whose result only
    the loss reads; PyTorch's checkpoint (whole_recompute) runs all of it again. The
    prediction computes what the walk counts, either way."""
    n = 64
    w, x = np.full((n, n), 0.01, np.float32), np.full((n, n), 0.02, np.float32)

    def loss(w, x):
        return simpmd.checkpoint(lambda x: snp.sin(x @ w) @ w)(x).sum()
    program = simpmd.make_jaxpr(simpmd.grad(loss))(*_shapes(w, x))
    xla, eager = _walked(program, "recompute"), _walked(program, "recompute",
                                                        whole_recompute=True)
    assert xla == 2 * n ** 3 + n * n                  # x @ w and its sine (one per element)
    assert eager == xla + 2 * n ** 3                  # and the last product
    for whole in (False, True):
        walker = C.walk.Walker(program, whole_recompute=whole)
        assert C.predict.predict(program, "H100", walker=walker).flops == _walked(
            program, whole_recompute=whole)


# -- the cost columns: the cost model's table, keyed by row ----------------------------------------

def test_the_cost_facts_are_columns_of_the_rows():
    from simpmd.core import collectives, primitives
    from simpmd.cost import rows, walk
    assert rows.column(collectives.psum, "collective_family") == "all_reduce"
    assert C.collective_of("pshuffle") == "collective_permute"      # a ppermute, by its row
    assert C.collective_of("pswapaxes") == "all_to_all"
    assert rows.column(primitives.dot_general, "matmul") and not rows.column(primitives.add, "matmul")
    assert not hasattr(primitives.dot_general, "matmul")    # the row is the core's alone
    with pytest.raises(KeyError, match="not a cost column"):
        rows.column(primitives.add, "matmull")               # the schema names every column
    with pytest.raises(KeyError, match="not a cost column"):
        rows.register(primitives.add, fusoin="view")
    assert walk._row(type("E", (), {"primitive": "psum_invariant", "params": {}})()) \
        is collectives.psum
    for row in collectives.COLLECTIVES.values():
        assert rows.column(row, "collective_family") in rows.COLLECTIVES
        assert callable(rows.column(row, "ici_rule")), row.name
