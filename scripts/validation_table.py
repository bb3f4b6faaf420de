"""Print docs/validation.md's table: every published run, measured against predicted.

    python scripts/validation_table.py

One row per run of simpmd/plan/published.py: the run, its configuration, the measured
step time (from what its source prints), simpmd.plan's prediction, their ratio, and where
the predicted step goes; then the geometric-mean error. tests/test_plan_validation.py
holds the same numbers to the targets.
"""
from __future__ import annotations

import math

from simpmd import plan
from simpmd.plan import published


def _configuration(run) -> str:
    m, lay = run.model, run.layout
    return (f"{m.params / 1e9:.0f}B ({m.layers} x {m.d_model}, seq {m.seq}); "
            f"{run.chips} x {run.hardware}, {run.precision}; {lay}")


def main():
    print("| run | configuration | measured s | predicted s | predicted / measured | "
          "where the prediction goes |")
    print("|---|---|---:|---:|---:|---|")
    errors = []
    for run in published.runs():
        est = plan.estimate(run.model, run.layout, hardware=run.hardware,
                            precision=run.precision, flash=run.flash, slices=run.slices,
                            framework=run.framework, check_memory=False)
        ratio = est.step_s / run.measured_s
        errors.append(abs(math.log(ratio)))
        parts = ", ".join(f"{k} {v / est.step_s:.0%}" for k, v in est.breakdown.items()
                          if v / est.step_s >= 0.005)
        print(f"| {run.name} ({run.quoted}) | {_configuration(run)} | {run.measured_s:.3g} | "
              f"{est.step_s:.3g} | {ratio:.2f} | {parts}; {est.peak_bytes / 1e9:.0f} GB "
              f"per chip |")
    mean = math.exp(sum(errors) / len(errors)) - 1
    worst = math.exp(max(errors)) - 1
    print(f"\n{len(errors)} runs; geometric-mean error {mean:.1%}; largest {worst:.1%}; "
          f"{sum(e <= math.log(1.25) for e in errors)} within 25%.")
    memory_table()


# Korthikanti et al. 2022, Figure 1: memory per GPU (GiB) of weights and optimizer state,
# and of activations, with sequence parallelism and selective recomputation, as
# calculon-ai/calculon (commit caa4b11) transcribes it (calculon/llm/validation.py,
# seqsel_fig1).
FIGURE_1 = {"22B": (45.5625, 9.5625), "175B": (45.5625, 12.3515625),
            "530B": (31.640625, 23.076171875), "1T": (32.958984375, 26.5625)}


def memory_table():
    print("\n| run | Figure 1: weights + optimizer, GiB | activations, GiB | sum, GiB | "
          "simpmd's peak, GiB | peak / sum |")
    print("|---|---:|---:|---:|---:|---:|")
    for run in published.runs():
        size = run.name.split(",")[0]
        if size not in FIGURE_1 or "selective" not in run.name:
            continue
        est = plan.estimate(run.model, run.layout, hardware=run.hardware,
                            precision=run.precision, flash=run.flash, framework=run.framework,
                            check_memory=False)
        weights, acts = FIGURE_1[size]
        peak = est.peak_bytes / 2**30
        print(f"| {run.name} | {weights:.1f} | {acts:.1f} | {weights + acts:.1f} | {peak:.1f} | "
              f"{peak / (weights + acts):.2f} |")


if __name__ == "__main__":
    main()
