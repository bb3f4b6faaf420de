"""Published, measured runs added for issue 44, one module per source, entered before any
of them was predicted (``docs/validation.md``).

Each module's ``runs()`` gives :class:`simpmd.plan.published.Run` s with the configuration
as its source prints it: the framework that ran it (``"pytorch"``, ``"deepspeed"`` as
well as ``"xla"`` and ``"megatron"``), the hardware (``"H100 96GB"``, ``"GB200"`` as
well), the layout (as keywords where ``Layout`` cannot build it yet). Whether the planner
can enter a run today is not stored but asked (:func:`blocker`), so a run becomes
enterable as soon as the planner learns what it needs.
"""
from __future__ import annotations

from .. import published
from . import (deepspeed_runs, llama3, llm_foundry, maxtext_more, maxtext_v5e, megatron_bridge,
               torchtitan)
from ...cost.hardware import hardware_preset
from .. import simulate
from ..layout import LayoutError, check


def every() -> list:
    """Every published run the planner is checked against: the 22 of
    :mod:`simpmd.plan.published`, then those added for issue 44."""
    return published.runs() + added()


def added() -> list:
    """Every run added for issue 44."""
    return (maxtext_v5e.runs() + maxtext_more.runs() + llm_foundry.runs() + torchtitan.runs()
            + megatron_bridge.runs() + deepspeed_runs.runs() + llama3.runs())


def blocker(run) -> str:
    """Why ``plan.estimate`` cannot take ``run`` as its source prints it today (empty: it
    can): the framework's name, the hardware, or the layout, checked as ``estimate``
    checks them, without tracing the step."""

    reasons = []
    if run.framework not in simulate.FRAMEWORKS:
        reasons.append(f"framework={run.framework!r} is not one plan.estimate takes "
                       f"({', '.join(simulate.FRAMEWORKS)})")
    try:
        hw = hardware_preset(run.hardware)
    except ValueError:
        hw = None
        reasons.append(f"no hardware preset {run.hardware!r}")
    try:
        check(run.model, run.layout)
        if hw is not None and hw.torus_rank is not None:
            simulate._slice_shape(hw, run.chips, run.slices)
    except (LayoutError, TypeError) as exc:
        reasons.append(f"the layout: {exc}")
    return "; ".join(reasons)
