"""The checks of lesson 13's exercises: right answers pass, typical wrong ones get the hint
that names what is off. Expectations are worked out here: the bubble by counting steps, the
idle segments of a training step from a real simpmd run's timeline, the pipeline's output
from a NumPy loop, and the activations held from hand-worked schedules."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax
from simpmd.exercises import lesson13 as ex


def said(capsys):
    return capsys.readouterr().out


# -- exercise 1: the bubble ----------------------------------------------------------------

def test_bubble_right(capsys):
    # 8 stages, 24 microbatches: 31 steps, of which each stage idles 7
    steps = 24 + 8 - 1
    assert ex.check_bubble(7 / steps)
    assert ex.check_bubble(0.2258)                 # rounded to 4 places
    assert ex.check_bubble(1 / 5, p=4, m=12)       # 3 of 15
    assert "7/31" in said(capsys)


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"),
    ("a lot", "number between 0 and 1"),
    (7 / 24, "divides by all m+p-1 = 31"),
    (24 / 31, "BUSY"),
    (8 / 31, "not p"),
    (8 / 32, "p-1 = 7 of m+p-1 = 31"),
    (7 / 32, "the step lasts m+p-1 = 31"),
    (14 / 31, "the fraction stays the same"),
    (100 * 7 / 31, "percentage"),
    (0.5, "count the steps"),
    (0.23, "close but not exact (did you round?)"),         # 7/31 = 0.2258 to two places
    (0.225, "close but not exact (did you round?)"),        # within 1 %, not a rounding
])
def test_bubble_wrong(answer, hint, capsys):
    assert not ex.check_bubble(answer)
    assert hint in said(capsys)


# -- exercise 2: idle segments of the training step -----------------------------------------

def forward_steps(d, m, p):
    """The forward steps in which stage d has a microbatch, by walking microbatches down."""
    return {j + d for j in range(m)}


def right_idle(d, k, m, p=4):
    steps = m + p - 1
    order = list(range(steps)) + list(reversed(range(steps)))    # forward, then backward
    return order[k] not in forward_steps(d, m, p)


def test_training_idle_right(capsys):
    assert ex.check_training_idle(right_idle)
    assert "Correct" in said(capsys)


def _training_trace(m, p=4, width=3):
    """The lesson's training program (GPipe forward, psum'd loss, simpmd.grad) run once."""
    mesh = simpmd.make_mesh((p,), ("stage",))

    def body(w, x, y):
        w = w[0]
        stage = lax.axis_index("stage")
        arrived, outs = snp.zeros_like(x[0]), []
        for t in range(m + p - 1):
            h = snp.tanh(snp.where(stage == 0, x[min(t, m - 1)], arrived) @ w)
            if t >= p - 1:
                outs.append(h)
            if t < m + p - 2:
                arrived = lax.ppermute(h, "stage", [(j, j + 1) for j in range(p - 1)])
        mine = ((snp.stack(outs) - y) ** 2).mean()
        return lax.psum(snp.where(stage == p - 1, mine, 0.0), "stage")

    grad = simpmd.shard_map(lambda w, x, y: simpmd.grad(body)(w, x, y), mesh=mesh,
                            in_specs=(P("stage"), P(), P()), out_specs=P("stage"))
    rng = np.random.default_rng(0)
    grad(rng.standard_normal((p, width, width)), rng.standard_normal((m, 2, width)),
         rng.standard_normal((m, 2, width)))
    return grad.trace


@pytest.mark.parametrize("m", [2, 5])
def test_the_numbering_matches_a_real_training_run(m):
    """The segments the checker numbers are those simpmd's timeline makes of the training
    program: 2(m+p-1) per device; with them, the idle share is (p-1)/(m+p-1) when every
    segment costs the same and the communication is nearly free."""
    viz = pytest.importorskip("simpmd.viz")
    p = 4
    trace = _training_trace(m, p)
    tl = viz.model_timeline(trace, "TPU v5e", compute=1.0, idle=lambda d, k: right_idle(d, k, m))
    for d in range(p):
        work = [s for s in tl.of(d) if s.kind in ("compute", "idle")]
        assert len(work) == 2 * (m + p - 1)
        assert sum(s.kind == "idle" for s in work) == 2 * (p - 1)
    assert tl.fraction("idle") == pytest.approx((p - 1) / (m + p - 1), rel=1e-4)


@pytest.mark.parametrize("fn, hint", [
    (..., "placeholder"),
    (lambda d, k, m: None, "returns None"),
    (lambda d, k, m: not 0 <= k - d < m, "every backward segment is idle"),
    (lambda d, k, m: not 0 <= (k if k < m + 3 else k - m - 3) - d < m, "forward's order"),
    (lambda d, k, m: not 0 <= (k if k < m + 3 else 2 * (m + 3) - k) - d < m, "one step off"),
    (lambda d, k, m: k < m + 3 and not 0 <= k - d < m, "has its bubble too"),
    (lambda d, k, m: right_idle(d, k, m) if k >= m + 3 else not 0 <= k - d <= m,
     "the forward segments are off"),
    (lambda d, k, m: k % 2 == 0, "Number the segments"),
    (lambda d, k, m: 1 / 0, "raised ZeroDivisionError"),
])
def test_training_idle_wrong(fn, hint, capsys):
    assert not ex.check_training_idle(fn)
    assert hint in said(capsys)


# -- exercise 3: the send pairs ---------------------------------------------------------------

def test_the_checkers_pipeline_is_the_model():
    w, b, x = ex.pipeline_data()
    h = x.astype(np.float64)
    for k in range(4):
        h = np.tanh(h @ w[k] + b[k])
    out = np.asarray(ex._gpipe_with([(0, 1), (1, 2), (2, 3)])(w, b, x))
    assert out.shape == (4, 4, 2, 8)
    np.testing.assert_allclose(out[-1], h, rtol=1e-5, atol=1e-6)


def test_send_perm_right(capsys):
    assert ex.check_send_perm([(0, 1), (1, 2), (2, 3)])
    assert ex.check_send_perm(((2, 3), (0, 1), (1, 2)))      # any order, tuples
    assert said(capsys).count("Correct") == 2


@pytest.mark.parametrize("perm, hint", [
    (..., "placeholder"),
    ("0->1", "pairs"),
    ([(1, 0), (2, 1), (3, 2)], "backwards"),
    ([(0, 1), (1, 2), (2, 3), (3, 0)], "closes a ring"),
    ([(0, 1), (2, 3)], "pairs [(1, 2)] are missing"),
    ([(0, 2), (1, 3)], "do not go from a stage to the next"),
    ([(0, 1), (0, 2), (2, 3)], "raised"),             # two sends from one device: refused
])
def test_send_perm_wrong(perm, hint, capsys):
    assert not ex.check_send_perm(perm)
    assert hint in said(capsys)


# -- exercise 4: activations held --------------------------------------------------------------

def test_activations_held_right(capsys):
    assert ex.check_activations_held([32] * 8, [8, 7, 6, 5, 4, 3, 2, 1])
    # p = 4 as in Narayanan et al. 2021, figure 4 (top): the first stage holds 4
    assert ex.check_activations_held([8] * 4, [4, 3, 2, 1], p=4, m=8)
    # fewer microbatches than stages: the fill stops at m
    assert ex.check_activations_held([2] * 4, [2, 2, 2, 1], p=4, m=2)
    assert said(capsys).count("Correct") == 6


@pytest.mark.parametrize("gpipe, one_f_one_b, hint", [
    (..., ..., "placeholder"),
    ([32] * 8, [7, 6, 5, 4, 3, 2, 1, 0], "one short on every stage"),
    ([32] * 8, [1, 2, 3, 4, 5, 6, 7, 8], "reversed"),
    ([32] * 8, [8] * 8, "only stage 0 holds p"),
    ([32] * 8, [32] * 8, "that is GPipe"),
    ([8, 7, 6, 5, 4, 3, 2, 1], [8, 7, 6, 5, 4, 3, 2, 1], "that is 1F1B's profile"),
    ([32 - s for s in range(8)], [8, 7, 6, 5, 4, 3, 2, 1], "not only the first"),
    ([32] * 7, [8, 7, 6, 5, 4, 3, 2, 1], "give one per stage, 8"),
    ([32] * 8, "8..1", "list of 8 numbers"),
    # the lock-step SPMD program of section 5: stage s keeps microbatch j from tick j+s to
    # tick j+2(p-1)-s, 2(p-1-s)+1 inputs, in a buffer of 2p-1 slots on every stage
    ([32] * 8, [15, 13, 11, 9, 7, 5, 3, 1], "lock-step SPMD program"),
    ([32] * 8, [15] * 8, "buffer of the lock-step SPMD program"),
])
def test_activations_held_wrong(gpipe, one_f_one_b, hint, capsys):
    assert not ex.check_activations_held(gpipe, one_f_one_b)
    assert hint in said(capsys)



# -- the lesson's claims about its training programs, counted here rather than in the lesson --

def _lesson_training(mesh_shape, names, x_spec):
    """The lesson's GPipe training program (weights and biases, the loss psum'd over 'stage',
    and over 'data' a pmean when there is such an axis), as a simpmd.shard_map."""
    p, m, width, rows = 4, 4, 8, 4
    mesh = simpmd.make_mesh(mesh_shape, names)

    def gpipe(w, b, x):
        w, b = w[0], b[0]
        stage = lax.axis_index("stage")
        arrived, outs = snp.zeros_like(x[0]), []
        for t in range(m + p - 1):
            y = snp.tanh(snp.where(stage == 0, x[min(t, m - 1)], arrived) @ w + b)
            if t >= p - 1:
                outs.append(y)
            if t < m + p - 2:
                arrived = lax.ppermute(y, "stage", [(j, j + 1) for j in range(p - 1)])
        return snp.stack(outs)

    def loss(w, b, x, y):
        stage = lax.axis_index("stage")
        mine = lax.psum(snp.where(stage == p - 1, ((gpipe(w, b, x) - y) ** 2).mean(), 0.0), "stage")
        return lax.pmean(mine, "data") if "data" in names else mine

    def gradients(w, b, x, y):
        return simpmd.grad(loss, argnums=(0, 1))(w, b, x, y)

    rng = np.random.default_rng(0)
    args = ((rng.standard_normal((p, width, width)) / np.sqrt(width)).astype(np.float32),
            (0.1 * rng.standard_normal((p, width))).astype(np.float32),
            rng.standard_normal((m, rows, width)).astype(np.float32),
            rng.standard_normal((m, rows, width)).astype(np.float32))
    train = simpmd.shard_map(gradients, mesh=mesh, in_specs=(P("stage"), P("stage"), x_spec, x_spec),
                             out_specs=(P("stage"), P("stage")))
    train(*args)
    return train, args


def _tally(trace, device):
    from collections import Counter
    return Counter((e.phase, e.op, tuple(e.axes)) for e in trace.device(device).events
                   if e.kind == "collective")


def test_the_loss_psum_on_4_stages_sends_6_bytes():
    train, _ = _lesson_training((4,), ("stage",), P())
    psums = [e for e in train.trace.device(1).events if e.kind == "collective" and e.op == "psum"]
    assert [e.bytes_sent for e in psums] == [2 * 3 / 4 * 4]          # ring: 2(p-1)/p x 4 bytes
    assert _tally(train.trace, 1) == {("forward", "ppermute", ("stage",)): 6,
                                      ("forward", "psum", ("stage",)): 1,
                                      ("backward", "ppermute", ("stage",)): 6}


def test_the_2x4_training_step_sums_each_use_of_the_weights_over_data_14_times():
    train, args = _lesson_training((2, 4), ("data", "stage"), P(None, "data"))
    assert _tally(train.trace, 5) == {("forward", "ppermute", ("stage",)): 6,
                                      ("forward", "psum", ("stage",)): 1,
                                      ("forward", "pmean", ("data",)): 1,
                                      ("backward", "psum", ("data",)): 14,    # 2 uses x 7 steps
                                      ("backward", "ppermute", ("stage",)): 6}
    x5 = [e for e in train.trace.device(5).events if e.kind == "receive"][2]
    assert x5.inputs[0].shape == (4, 2, 8)


def test_jax_writes_the_same_14_psums_over_data_plus_the_pmean():
    import re
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8:
        pytest.skip("needs 8 JAX devices")
    from simpmd.jax import on_jax
    train, args = _lesson_training((2, 4), ("data", "stage"), P(None, "data"))
    jaxpr = str(jax.make_jaxpr(on_jax(train))(*args))
    assert len(re.findall(r"psum\w*\[\s*axes=\('data',\)", jaxpr)) == 15


def test_a_ring_of_sends_moves_a_third_more_bytes_than_the_chain():
    w, b, x = ex.pipeline_data()
    chain, ring = ex._gpipe_with([(0, 1), (1, 2), (2, 3)]), ex._gpipe_with([(j, (j + 1) % 4) for j in range(4)])
    chain(w, b, x), ring(w, b, x)
    sent = [sum(e.bytes_sent for e in f.trace.events if e.kind == "collective") for f in (chain, ring)]
    assert sent[1] * 3 == sent[0] * 4


def test_the_lock_step_1f1b_program_gives_stage_0_its_first_backward_at_tick_6_holding_7():
    """Lesson 13's reading of its chart, from the program's rule (stage s: forward of t - s,
    backward of t - 2(p - 1) + s, the forward slot first): stage 0 runs forwards alone in
    ticks 0 to 5, its first backward comes at tick 6 after that tick's forward, and it then
    holds 2p - 1 = 7 inputs; ticks 6 and 7 run both, ticks 8 to 13 backwards only."""
    p, m, s = 4, 8, 0
    ticks = []
    for t in range(m + 2 * (p - 1)):
        f, b = t - s, t - 2 * (p - 1) + s
        ticks.append(("F" if 0 <= f < m else "") + ("B" if 0 <= b < m else ""))
    assert ticks == ["F"] * 6 + ["FB"] * 2 + ["B"] * 6
    held, most = 0, 0
    for work in ticks:
        held += "F" in work
        most = max(most, held)
        held -= "B" in work
    assert most == 2 * p - 1 == 7
