"""The family of a run or an estimate, as issue 44 groups the validation: what ran it
(the framework), the chip's generation, and the kinds of parallelism it used."""
from __future__ import annotations

KINDS = ("dp", "fsdp", "tp", "pp", "cp", "ep")
# A chip's generation: the parts of one generation share a family (their kernels and
# their frameworks' defaults are the same; their memories and clocks are not).
GENERATIONS = {"A100": "A100", "A100 40GB": "A100", "H100": "H100", "H100 96GB": "H100",
               "H100 A3 High": "H100", "GH200": "H100",
               "H100 NVL": "H100", "H100 PCIe": "H100", "H200": "H100", "B200": "Blackwell",
               "GB200": "Blackwell"}


def generation(hardware: str) -> str:
    return GENERATIONS.get(hardware, hardware)


def kinds(axes) -> str:
    """The kinds of parallelism of a layout (a ``Layout`` or its keywords), e.g. "pp+tp";
    "one chip" for none."""
    sizes = axes if isinstance(axes, dict) else axes.shape
    used = [k for k in KINDS if sizes.get(k, 1) > 1]
    return "+".join(used) or "one chip"


def family(framework: str, hardware: str, axes) -> str:
    """``"framework | generation | kinds"``, e.g. ``"megatron | A100 | pp+tp"``."""
    return f"{framework} | {generation(hardware)} | {kinds(axes)}"


def of_run(run) -> str:
    return family(run.framework, run.hardware, run.axes)
