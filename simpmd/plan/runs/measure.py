"""The planner against the runs: each enterable run's prediction over its measured step,
and what a set of them says (geometric-mean error, the largest, how many within
0.8-1.25x, the bias), for ``scripts/validation_table.py``, the stored spreads and the
tests."""
from __future__ import annotations

import math

from .. import simulate
from ..families import of_run
from . import blocker

WITHIN = 1.25


def estimate(run, memory: bool = False, reuse=None):
    """``plan.estimate`` of ``run`` as its source prints it (``check_memory=False``);
    ``reuse``: a :class:`~simpmd.plan.simulate.Reuse` that estimates of the same run share
    (its traced step and its collectives' times)."""
    return simulate.estimate(run.model, run.layout, hardware=run.hardware,
                             precision=run.precision, flash=run.flash, slices=run.slices,
                             framework=run.framework, check_memory=False, memory=memory,
                             compile=run.compile, reuse=reuse)


def ratios(runs) -> dict:
    """{name: predicted / measured} of the runs the planner can enter today."""
    return {run.name: estimate(run).step_s / run.measured_s for run in runs
            if not blocker(run)}


def summary(values) -> dict:
    """What a set of ratios says: n, geometric-mean error exp(mean |ln r|) - 1, the largest
    error, how many lie within 1/1.25..1.25, and the bias mean ln r (negative: too fast)."""
    logs = [math.log(r) for r in values]
    if not logs:
        return dict(n=0, error=float("nan"), largest=float("nan"), within=0,
                    bias=float("nan"))
    return dict(n=len(logs), error=math.exp(sum(map(abs, logs)) / len(logs)) - 1,
                largest=math.exp(max(map(abs, logs))) - 1,
                within=sum(abs(x) <= math.log(WITHIN) for x in logs),
                bias=sum(logs) / len(logs))


def spread(logs) -> tuple:
    """(n, mean, standard deviation) of ln(predicted / measured); the deviation with one
    degree of freedom taken (0 for fewer than two)."""
    n = len(logs)
    mean = sum(logs) / n if n else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else 0.0
    return n, round(mean, 4), round(sd, 4)


def spreads(runs, ratio: dict) -> dict:
    """The spreads :mod:`simpmd.plan.interval` reads, from the ratios of ``runs`` (the
    development half): by family, by framework pooled, and over every run pooled."""
    by_family, by_framework, every = {}, {}, []
    for run in runs:
        if run.name not in ratio:
            by_family.setdefault(of_run(run), [])
            continue
        x = math.log(ratio[run.name])
        by_family.setdefault(of_run(run), []).append(x)
        by_framework.setdefault(run.framework, []).append(x)
        every.append(x)
    return dict(families={k: spread(v) for k, v in sorted(by_family.items())},
                frameworks={k: spread(v) for k, v in sorted(by_framework.items())},
                pooled=spread(every))
