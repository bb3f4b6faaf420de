"""Pipeline schedules as SPMD programs (simpmd.plan.pipeline): each program's gradients
against jax.grad of the unsplit model, its bubble against the papers' formulas, and the
micro-batches each stage holds against closed forms worked by hand."""
import numpy as np
import pytest

import simpmd
from simpmd import P
from simpmd.plan import pipeline as pl
from simpmd import plan


SIZES = [(4, 8), (4, 16), (2, 4), (8, 16)]      # (p, m); the lesson shows p = 4, m = 8


@pytest.mark.parametrize("name", pl.NAMES)
def test_program_matches_jax_grad_of_the_unsplit_model(name):
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    from simpmd.jax import on_jax
    p, m, d, rows = 4, 8, 8, 4
    s = pl.schedule(name, p, m)
    rng = np.random.default_rng(1)
    W = (rng.standard_normal((s.layers, d, d)) / np.sqrt(d)).astype(np.float32)
    b = (0.1 * rng.standard_normal((s.layers, d))).astype(np.float32)
    X, Y = (rng.standard_normal((2, m, rows, d))).astype(np.float32)

    def unsplit(W, b):
        h = X
        for k in range(s.layers):
            h = jnp.tanh(h @ W[k] + b[k])
        return ((h - Y) ** 2).mean()

    with jax.default_matmul_precision("highest"):
        loss, (gW, gb) = jax.value_and_grad(unsplit, argnums=(0, 1))(W, b)
        mesh = simpmd.make_mesh((p,), ("stage",))
        run = simpmd.shard_map(s.program(), mesh=mesh,
                               in_specs=(P(None, "stage"), P(None, "stage"), P(), P()),
                               out_specs=(P(None, "stage"), P(None, "stage"), P()))
        dw, db, got = run(s.stack(W), s.stack(b), X, Y)
        jw, jb, jl = jax.jit(on_jax(run))(s.stack(W), s.stack(b), X, Y)
    close = dict(rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(s.unstack(dw), gW, **close)
    np.testing.assert_allclose(s.unstack(db), gb, **close)
    np.testing.assert_allclose(float(np.asarray(got)), float(loss), **close)
    np.testing.assert_allclose(np.asarray(jw), np.asarray(dw), **close)
    np.testing.assert_allclose(np.asarray(jb), np.asarray(db), **close)
    np.testing.assert_allclose(float(np.asarray(jl)), float(np.asarray(got)), **close)


@pytest.mark.parametrize("p,m", SIZES)
def test_bubble_equals_the_papers_formulas(p, m):
    # F, B and W one tick each; a stage's busy ticks: m (F + B + W) per chunk it holds
    expect = {
        "gpipe": (p - 1) / (m + p - 1),                 # Huang et al. 2019
        "1f1b": (p - 1) / (m + p - 1),                  # Narayanan et al. 2021, 2.2.1
        "interleaved": (p - 1) / (2 * m + p - 1),       # the same, v = 2 chunks, 2.2.2
        "zb-h1": (p - 1) / (3 * m + p - 1),             # (p-1)(F+B-W) idle: Qi et al. 2.1
        # ZB-V: two chunks of 3m ticks a stage, no gap inside a stage's span; the last
        # stage starts p - 1 ticks after the first, which ends p - 1 ticks after it
        "zb-v": (p - 1) / (6 * m + p - 1),
    }
    for name, want in expect.items():
        s = pl.schedule(name, p, m)
        assert s.bubble() == pytest.approx(want, abs=1e-12), name
        assert pl.paper_bubble(name, p, m) == pytest.approx(want, abs=1e-12), name
    # DualPipeV: the README's (PP/2 - 1)(F&B + B - 3W), PP = 2p stages, B the full
    # backward (2 ticks), F&B = F + B (3 ticks) run one after the other: 2(p - 1) idle
    # ticks a rank; the program's grid idles one tick fewer, 2p - 3, at every size here
    s = pl.schedule("dualpipev", p, m)
    busy = 2 * m * 3
    assert s.ticks - busy == 2 * p - 3
    assert s.bubble() == pytest.approx((2 * p - 3) / (busy + 2 * p - 3), abs=1e-12)
    assert pl.paper_bubble("dualpipev", p, m) == pytest.approx(
        2 * (p - 1) / (busy + 2 * (p - 1)), abs=1e-12)


@pytest.mark.parametrize("p,m", SIZES)
def test_micro_batches_held_per_stage(p, m):
    # GPipe: all m; 1F1B: p - s (p - s - 1 forwards to fill, one more before the first
    # backward); interleaved (v = 2): Megatron's warm-up 2(p - s - 1) + (v - 1)p forwards
    # and one more, in chunks; ZB-H1: p on every stage (its W lags B by s micro-batches);
    # DualPipeV: PP + 1 = 2p + 1 chunks on every rank (the DualPipe README's table)
    assert pl.schedule("gpipe", p, m).held() == [m] * p
    assert pl.schedule("1f1b", p, m).held() == [p - s for s in range(p)]
    assert pl.schedule("interleaved", p, m).held() == [2 * (p - s - 1) + p + 1
                                                       for s in range(p)]
    assert pl.schedule("zb-h1", p, m).held() == [p] * p
    # ZB-V: 2p chunks (p stages' worth, 1F1B's first stage) on every stage, m >= 2p - 1
    assert pl.schedule("zb-v", p, m).held() == [2 * p] * p
    assert pl.schedule("dualpipev", p, m).held() == [2 * p + 1] * p


def test_program_slots_are_the_most_any_stage_holds():
    for name in pl.NAMES:
        s = pl.schedule(name, 4, 8)
        assert s.tables["slots"]["stash"] == max(s.held()), name


def test_sizes_a_schedule_cannot_run_are_refused_naming_them():
    with pytest.raises(pl.ScheduleError, match="m >= 8"):
        pl.schedule("dualpipev", 4, 6)
    with pytest.raises(pl.ScheduleError, match="multiple of 4"):
        pl.schedule("interleaved", 4, 6)
    with pytest.raises(pl.ScheduleError, match="choose one of"):
        pl.schedule("zb-h2", 4, 8)


def test_planner_zero_bubble_schedules_below_1f1b_at_pp4_m8():
    pytest.importorskip("ml_dtypes")          # the planner's bfloat16 shapes
    model = plan.LLAMA3_8B
    base = dict(pp=4, dp=2, microbatch=1, global_batch=16, recompute="full")  # m = 8
    runs = {s: plan.estimate(model, plan.Layout(schedule=s, **base), "H100")
            for s in (None, "1f1b", "gpipe", "zb-h1", "zb-v", "dualpipev")}
    one = runs["1f1b"]
    assert runs[None].step_s == one.step_s and runs[None].breakdown == one.breakdown
    assert runs["gpipe"].breakdown["bubble"] == one.breakdown["bubble"]
    assert runs["gpipe"].peak_bytes > one.peak_bytes          # GPipe keeps all 8
    for s in ("zb-h1", "zb-v", "dualpipev"):
        assert runs[s].breakdown["bubble"] < one.breakdown["bubble"]
        assert runs[s].step_s < one.step_s
    # ZB-H1's bubble over 1F1B's, both over the same busy time: (F+B-W)/(F+B+W) = 1/3
    assert runs["zb-h1"].breakdown["bubble"] == pytest.approx(
        one.breakdown["bubble"] / 3, rel=1e-9)
    # ZB-V's, idle over busy: (p - 1) over 2m (F+B+W) = 6m ticks, a sixth of 1F1B's
    assert runs["zb-v"].breakdown["bubble"] == pytest.approx(
        one.breakdown["bubble"] / 6, rel=1e-9)
    busy = one.step_s - one.breakdown["bubble"]
    assert runs["zb-h1"].step_s == pytest.approx(busy + one.breakdown["bubble"] / 3, rel=1e-9)


def test_layout_refuses_an_unknown_or_mismatched_schedule():
    with pytest.raises(plan.LayoutError, match="choose one of"):
        plan.Layout(pp=4, schedule="zb-h2")
    with pytest.raises(plan.LayoutError, match="vp"):
        plan.Layout(pp=4, schedule="interleaved")
    with pytest.raises(plan.LayoutError, match="vp"):
        plan.Layout(pp=4, vp=2, schedule="zb-h1")
