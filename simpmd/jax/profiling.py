"""What ``jax.profiler.trace`` recorded: which compiled kernels ran, on which thread, when.

``jax.profiler.trace(logdir)`` writes ``logdir/plugins/profile/<run>/<host>.trace.json.gz``
(Chrome's trace-event JSON, the file Perfetto opens) beside ``<host>.xplane.pb`` (the
protocol buffer that TensorBoard's profile plugin, xprof, reads). jax 0.7.2, 0.10.2 and
0.12.0.1 all write both; the JSON one needs only ``gzip`` and ``json`` to read, so this
module reads that one and needs no profiler plugin. A kernel is an event whose name is an
instruction of the compiled program (``compiled.as_text()``): XLA names each thunk it runs
after the HLO instruction, e.g. ``multiply_add_fusion``.
"""
from __future__ import annotations

from dataclasses import dataclass
import gzip
import json
import pathlib
import re

__all__ = ["TraceEvent", "trace_file", "read_trace", "hlo_instruction_names", "kernels",
           "profile_step", "draw_profile"]


@dataclass(frozen=True)
class TraceEvent:
    """One complete event ("ph": "X") of a trace: what ran, on which thread, from when
    (microseconds from the trace's start) and for how long."""

    name: str
    thread: str
    start_us: float
    duration_us: float


def trace_file(logdir) -> pathlib.Path:
    """The newest ``*.trace.json.gz`` that ``jax.profiler.trace(logdir)`` wrote."""
    found = sorted(pathlib.Path(logdir).glob("plugins/profile/*/*.trace.json.gz"))
    if not found:
        raise FileNotFoundError(
            f"no plugins/profile/*/*.trace.json.gz under {logdir}: run the step inside "
            f"`with jax.profiler.trace({str(logdir)!r}):` first (the file is written when "
            f"the block ends).")
    return found[-1]


def read_trace(path) -> list[TraceEvent]:
    """The complete events of a trace-event file (``.json.gz`` or ``.json``), in time
    order, each with the name of its thread (from the file's ``thread_name`` records)."""
    path = pathlib.Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        raw = json.load(f)
    records = raw["traceEvents"] if isinstance(raw, dict) else raw
    threads = {(e.get("pid"), e.get("tid")): e.get("args", {}).get("name", "")
               for e in records if e.get("ph") == "M" and e.get("name") == "thread_name"}
    events = [TraceEvent(e["name"], threads.get((e.get("pid"), e.get("tid")), str(e.get("tid"))),
                         float(e["ts"]), float(e.get("dur", 0.0)))
              for e in records if e.get("ph") == "X"]
    return sorted(events, key=lambda e: e.start_us)


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=", re.MULTILINE)


def hlo_instruction_names(hlo_text: str) -> set[str]:
    """The names of every instruction in an HLO module's text (``%name = ...`` lines)."""
    return set(_INSTRUCTION.findall(hlo_text))


def kernels(events, hlo_text: str) -> list[TraceEvent]:
    """The events that are kernels of the compiled program: named after one of its
    instructions (the profiler's ``end: name`` markers are not kernels)."""
    names = hlo_instruction_names(hlo_text)
    return [e for e in events if e.name in names]


def profile_step(fn, args, logdir, *, repeats: int = 3):
    """Run ``jax.jit(fn)(*args)`` ``repeats`` times under ``jax.profiler.trace(logdir)``
    (compiled and run once before, so the trace holds no compilation), and return the
    trace's events and the compiled program's HLO text."""
    import jax  # optional: JAX

    step = jax.jit(fn)
    compiled = step.lower(*args).compile()
    jax.block_until_ready(step(*args))
    with jax.profiler.trace(str(logdir)):
        for _ in range(repeats):
            jax.block_until_ready(step(*args))
    return read_trace(trace_file(logdir)), compiled.as_text()


def draw_profile(events, hlo_text: str, *, ax=None):
    """A timeline of a profiled step: one row per thread that ran a kernel, plus the
    Python thread's dispatch (``PjitFunction`` events); kernels whose name holds "fusion"
    in one colour, other kernels in another. Returns the Figure."""
    import matplotlib.pyplot as plt  # optional: matplotlib

    ran = kernels(events, hlo_text)
    dispatch = [e for e in events if e.name.startswith("PjitFunction")]
    rows = sorted({e.thread for e in dispatch}) + sorted({e.thread for e in ran} - {e.thread for e in dispatch})
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 0.6 * len(rows) + 1.2))
    origin = min(e.start_us for e in dispatch + ran)
    span = max(e.start_us + e.duration_us for e in dispatch + ran) - origin
    for e in dispatch + ran:
        colour = ("#bbbbbb" if e in dispatch else
                  "#d62728" if "fusion" in e.name else "#1f77b4")
        row, left = rows.index(e.thread), e.start_us - origin
        ax.barh(row, max(e.duration_us, 0.5), left=left, color=colour, height=0.6,
                edgecolor="white", linewidth=0.5)
        if e in ran and e.duration_us > 0.12 * span:         # a label where it fits
            ax.text(left + e.duration_us / 2, row, e.name, ha="center", va="center",
                    fontsize=7, color="white")
    ax.set_yticks(range(len(rows)), [r if len(r) < 24 else r[:21] + "..." for r in rows])
    ax.invert_yaxis()
    ax.set_xlabel("microseconds from the first call")
    ax.set_title("jax.profiler trace: jit dispatch (grey), fused kernels (red), "
                 "other kernels (blue)", fontsize=9)
    return ax.figure
