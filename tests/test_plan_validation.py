"""The planner against published, measured training runs (docs/validation.md): one test
per run, the predicted step time within 25% of the measured one, and the geometric-mean
error, exp(mean |ln(predicted / measured)|) - 1, at most 12%.

No run chose any parameter: every rate comes from the hardware presets' cited sources
(simpmd/cost/hardware.py), every configuration and measurement from the run's source
(simpmd/plan/published.py). A run the model misses is marked so, with the reason the
docs give, and the mark is strict: if the model comes within 25% the test says so.
"""
from __future__ import annotations

import math

import pytest

pytest.importorskip("ml_dtypes", reason="the planner's steps are in bfloat16, which ml_dtypes "
                                        "(jaxlib's) brings")

from simpmd import plan  # noqa: E402
from simpmd.plan import published  # noqa: E402

RUNS = published.runs()
WITHIN = 1.25
# Misses, with what the model leaves out (docs/validation.md, "What the model misses").
MISSES = {
    "LLAMA2-7B, 8 GPUs": "FP8 at d_model 4096, not explained by the GEMMs' shapes (the "
                         "70B runs' per-GPU GEMMs are the same size) nor, with attention at "
                         "cuDNN's measured rates, by attention's efficiency alone",
    "LLAMA3-8B, 8 GPUs": "the same, with attention over 8,192 tokens and a 128,256-word LM "
                         "head in bf16",
}


def predicted(run):
    return plan.estimate(run.model, run.layout, hardware=run.hardware, precision=run.precision,
                         flash=run.flash, slices=run.slices, framework=run.framework,
                         check_memory=False,
                         memory=False).step_s


@pytest.fixture(scope="module")
def ratios():
    return {run.name: predicted(run) / run.measured_s for run in RUNS}


@pytest.mark.parametrize("run", [
    pytest.param(r, marks=pytest.mark.xfail(reason=MISSES[r.name], strict=True))
    if r.name in MISSES else r for r in RUNS], ids=lambda r: r.name)
def test_each_published_run_within_25_percent(ratios, run):
    ratio = ratios[run.name]
    assert 1 / WITHIN <= ratio <= WITHIN, f"{run.name}: predicted / measured = {ratio:.3f}"


def test_the_geometric_mean_error_is_at_most_12_percent(ratios):
    errors = [abs(math.log(r)) for r in ratios.values()]
    assert math.exp(sum(errors) / len(errors)) - 1 <= 0.12


def test_the_runs_cover_two_generations_and_three_sizes():
    assert {r.hardware for r in RUNS} >= {"A100", "H100", "TPU v5p"}
    assert len({round(r.model.params, -9) for r in RUNS}) >= 3
    assert len(RUNS) >= 8


def test_measured_step_times_follow_from_what_the_sources_print():
    """The arithmetic from each source's printed number to a step time, redone by hand
    for one row of each source."""
    by_name = {r.name: r for r in RUNS}
    assert by_name["175B, selective + sequence parallel"].measured_s == 13.75
    assert by_name["LLAMA2-70B, 64 GPUs"].measured_s == pytest.approx(128 * 4096 / (1728 * 64))
    run = by_name["32B, v5p-128"]                        # 32 layers, D 10240, 32 heads of 256
    n = 32 * (4 * 10240 * 8192 + 2 * 10240 * 32768 + 2 * 10240) + 32768 * 10240 + 10240
    assert run.model.params == n
    flops = (6 * n * 2048 + 6 * 32 * 32 * 256 * 2048 ** 2) * 8
    assert run.measured_s == pytest.approx(flops / 328e12)


def test_lesson15_says_what_the_validation_finds(ratios):
    """Lesson 15, section 8, in words: the NeMo LLaMA 2-70B run predicted within 3% of its
    measured step (+3%); over the 22 runs a geometric-mean error of 9.3% with 20 within
    25%; the two misses (the 7-8B FP8 runs) predicted at 0.78 and 0.75 of their measured
    steps. If the planner moves these, the lesson's text must move with them."""
    assert round(100 * (ratios["LLAMA2-70B, 64 GPUs"] - 1)) == 3
    errors = [abs(math.log(r)) for r in ratios.values()]
    assert round(100 * (math.exp(sum(errors) / len(errors)) - 1), 1) == 9.3
    assert sum(e <= math.log(WITHIN) for e in errors) == 20
    assert [round(ratios[name], 2) for name in MISSES] == [0.78, 0.75]
