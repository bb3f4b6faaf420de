"""Per-device logs: what each simulated device received, exchanged and returned.

The runtime appends :class:`Event` records; everything else (the text and HTML views
here, the pictures in ``simpmd.viz``, the estimates in ``simpmd.cost``) only reads them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Sequence
import contextlib
import contextvars
import html

import numpy as np

from . import bridge


_PHASE = contextvars.ContextVar("simpmd_phase", default="forward")


def current_phase() -> str:
    return _PHASE.get()


@contextlib.contextmanager
def backward_pass():
    token = _PHASE.set("backward")
    try:
        yield
    finally:
        _PHASE.reset(token)


@dataclass
class Event:
    """One line of one program's log.

    ``kind`` is ``'receive'`` (a shard of an argument arrived), ``'collective'`` (the
    program took part in a collective), ``'return'`` (a leaf of the result left) or
    ``'error'``. A *program* is what runs on one simulated device; in a nested pmap the
    outer body is also a program, spanning the devices of its inner pmap.
    """

    kind: str
    program: str                       # 'device 3', or 'data=1' for an outer nested body
    coords: tuple                      # ((axis name, index, size), ...) outer to inner
    seq: int = 0                       # position in this program's log
    step: int = 0                      # global order; a collective's members share it
    call: int = 0                      # k-th collective call of this program (SPMD: same k = same call)
    device: int | None = None          # simulated device id (None for an outer nested body)
    devices: tuple = ()                # all devices this program spans
    op: str | None = None              # 'psum', 'all_gather', ... for collectives
    axes: tuple = ()                   # axis names the collective runs over
    group: tuple = ()                  # device ids (or program labels) of the group, in order
    group_programs: tuple = ()         # program labels of the group, in order
    member: int = 0                    # this program's position in ``group``
    params: dict = field(default_factory=dict)   # keywords: axis, tiled, perm, groups, ...
    inputs: tuple = ()                 # leaves before (NumPy arrays)
    outputs: tuple = ()                # leaves after
    bytes_sent: int = 0
    bytes_received: int = 0
    source: str = ""                   # 'file.py:12'
    code: str = ""                     # text of that source line
    detail: str = ""                   # e.g. "x[3] of argument 0 (shape (8, 2))"
    phase: str = "forward"             # 'backward' for a collective of a gradient's backward pass

    @property
    def shapes_in(self):
        return tuple(np.shape(v) for v in self.inputs)

    @property
    def shapes_out(self):
        return tuple(np.shape(v) for v in self.outputs)

    @property
    def dtypes(self):
        return tuple(np.asarray(v).dtype for v in (self.inputs or self.outputs))

    @property
    def nbytes_in(self) -> int:
        return int(sum(np.asarray(v).nbytes for v in self.inputs))

    @property
    def nbytes_out(self) -> int:
        return int(sum(np.asarray(v).nbytes for v in self.outputs))


def summarize(value, limit: int = 6) -> str:
    """A short, deterministic description of an array for a log line."""
    a = np.asarray(value)
    if a.size == 0:
        return f"{a.dtype}{list(a.shape)} (empty)"
    if a.size <= limit:
        flat = np.array2string(a.ravel(), separator=" ", precision=4, suppress_small=True,
                               max_line_width=200)
        return flat if a.ndim <= 1 else f"{flat} as {list(a.shape)}"
    if np.issubdtype(a.dtype, np.number):
        return (f"{a.dtype}{list(a.shape)} min {_num(a.min())} max {_num(a.max())} "
                f"mean {_num(a.mean())}")
    return f"{a.dtype}{list(a.shape)}"


def _num(x) -> str:
    return np.format_float_positional(float(x), precision=4, trim="-")


def _leaves_summary(values) -> str:
    return "; ".join(summarize(v) for v in values)


def _bytes(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _params_text(e: Event) -> str:
    keep = {k: v for k, v in e.params.items() if v is not False and v is not None}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def _row(e: Event) -> dict:
    """The columns a log line shows, as text."""
    if e.kind == "receive":
        what, moved = "receive " + e.detail, summarize(e.inputs[0])
        group = sent = recv = ""
    elif e.kind == "return":
        what, moved = "return " + e.detail, summarize(e.outputs[0])
        group = sent = recv = ""
    elif e.kind in ("error", "print"):
        what, moved, group, sent, recv = e.kind, e.detail, "", "", ""
    else:
        axes = e.axes[0] if len(e.axes) == 1 else e.axes
        params = _params_text(e)
        what = f"{e.op}({axes!r}{', ' + params if params else ''})"
        if e.phase == "backward":
            what = "backward " + what
        moved = f"{_leaves_summary(e.inputs)} -> {_leaves_summary(e.outputs)}"
        group = _group_text(e.group)
        sent, recv = _bytes(e.bytes_sent), _bytes(e.bytes_received)
    return {"step": str(e.step), "program": e.program, "what": what, "group": group,
            "values": moved, "sent": sent, "recv": recv, "source": e.source}


def _group_text(group) -> str:
    ids = list(group)
    if len(ids) > 2 and all(isinstance(i, int) for i in ids) and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    if len(ids) > 8:
        return ",".join(map(str, ids[:6])) + f",... ({len(ids)})"
    return ",".join(map(str, ids))


_COLUMNS = ("step", "program", "what", "group", "values", "sent", "recv", "source")


def _table(rows: list[dict], columns=_COLUMNS, max_width: int = 60) -> str:
    def clip(s):
        return s if len(s) <= max_width else s[:max_width - 3] + "..."
    cells = [[clip(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


class _EventList(Sequence):
    """``trace.events`` of a columnar log: its length is known at once, and every device's
    events are written out the first time one of them is read."""

    def __init__(self, trace, n):
        self._trace, self._n = trace, n

    def __len__(self):
        return self._n

    def __getitem__(self, index):
        return self._trace._written_out()[index]

    def __iter__(self):
        return iter(self._trace._written_out())

    def __eq__(self, other):
        return list(self) == list(other)

    def __repr__(self):
        return repr(self._trace._written_out())


class Trace:
    """The logs of one run: every event, per program and merged.

    ``print(trace)`` shows the merged log; ``trace.device(3)`` one device's log;
    ``trace.events`` the plain records; in Jupyter the trace shows as an HTML table.
    ``events`` may also be a function that makes the list: a run traced once keeps its
    values stacked, and writes the per-device records only when someone reads them.
    """

    def __init__(self, events, eager: bool = False, max_rows: int = 64, log=None):
        self._events = events if callable(events) else list(events)
        self.eager = eager
        self.max_rows = max_rows
        # A run traced once keeps its log columnar (one record per collective call, every
        # device's values stacked); ``log`` answers the header and the first rows, and
        # one device's rows, without writing out every device's events.
        self._log = log
        self._summary = None
        self.program = None          # the traced program the run interpreted, if any

    def _columnar(self):
        """The columnar log's summary, while the events have not been written out."""
        if self._log is None or not callable(self._events):
            return None
        if self._summary is None:
            self._summary = self._log.summary() or False
        return self._summary or None

    @property
    def events(self) -> list[Event]:
        summary = self._columnar()
        if summary is not None:              # written out when first looked into
            return _EventList(self, summary["events"])
        return self._written_out()

    def _written_out(self) -> list:
        if callable(self._events):
            self._events = list(self._events())
        return self._events

    @events.setter
    def events(self, events):
        self._events = list(events)

    # -- plain data -----------------------------------------------------------------------
    @property
    def programs(self) -> list[str]:
        summary = self._columnar()
        if summary is not None:
            return list(summary["programs"])
        seen: dict = {}
        for e in self.events:
            seen.setdefault(e.program, e.device if e.device is not None else -1)
        return sorted(seen, key=lambda p: (seen[p] == -1, seen[p], p))

    def for_program(self, program: str) -> list[Event]:
        return [e for e in self.events if e.program == program]

    def device(self, device_id: int) -> "Trace":
        """The log of one simulated device, as a Trace of its own."""
        if self._columnar() is not None:
            return Trace(self._log.events(only=device_id), self.eager, self.max_rows)
        return Trace([e for e in self.events if e.device == device_id], self.eager, self.max_rows)

    def collectives(self) -> list[list[Event]]:
        """Each collective instance (one group's rendezvous) as its members' events."""
        if self._columnar() is not None:    # each member's event written out when read
            return self._log.collective_groups()
        by_step: dict = {}
        for e in self.events:
            if e.kind == "collective":
                by_step.setdefault(e.step, []).append(e)
        return [sorted(v, key=lambda e: e.member) for _, v in sorted(by_step.items())]

    def calls(self) -> list[list[Event]]:
        """Each collective call of the program (all its groups together), in order."""
        by_call: dict = {}
        for e in self.events:
            if e.kind == "collective":
                by_call.setdefault((len(e.coords), e.call), []).append(e)
        return [v for _, v in sorted(by_call.items(), key=lambda kv: min(e.step for e in kv[1]))]

    def __len__(self):
        summary = self._columnar()
        return summary["events"] if summary is not None else len(self.events)

    def __iter__(self):
        return iter(self.events)

    # -- views ----------------------------------------------------------------------------
    def _header(self) -> str:
        n = len(self.programs)
        summary = self._columnar()
        if summary is not None:
            ncoll, sent = summary["collective_groups"], summary["bytes_sent"]
        else:
            ncoll = len(self.collectives())
            sent = sum(e.bytes_sent for e in self.events)
        head = f"Trace: {n} program(s), {ncoll} collective group(s), {_bytes(sent)} sent in all"
        if self.eager:
            head += "\nEAGER RUN: Python control flow on values was allowed; real JAX cannot run this program."
        return head

    def table(self, program: str | None = None) -> str:
        """Text table of one program's log (``program='device 3'``) or of all, merged."""
        summary = self._columnar() if program is None else None
        if summary is not None:
            events, total = self._log.events(limit=self.max_rows), summary["events"]
        else:
            events = self.events if program is None else self.for_program(program)
            total = len(events)
        rows = [_row(e) for e in events[:self.max_rows]]      # only the rows shown
        cut = ""
        if total > self.max_rows:
            cut = f"\n... {total - self.max_rows} more event(s); see trace.events or trace.device(i)"
        cols = _COLUMNS if program is None else _COLUMNS[:1] + _COLUMNS[2:]
        return _table(rows, cols) + cut

    def per_device(self) -> str:
        """One text table per program, one after the other."""
        return "\n\n".join(f"== {p} ==\n{self.table(p)}" for p in self.programs)

    def draw(self, call=None, **kwargs):
        """Draw the run's collectives, before and after (``call=k``: only the k-th); needs matplotlib."""
        views = bridge.drawings()
        if call is None:
            return views.draw_trace(self, **kwargs)
        return views.draw_collective(self, call, **kwargs)

    def draw_timeline(self, hardware="TPU v4", **kwargs):
        """The modelled per-device timeline of this run (see simpmd.viz.draw_timeline)."""
        return bridge.drawings().draw_timeline(self, hardware, **kwargs)

    def __str__(self):
        return self._header() + "\n" + self.table()

    def __repr__(self):
        return f"<Trace of {len(self)} events over {len(self.programs)} program(s)>"

    def _repr_html_(self):
        summary = self._columnar()
        shown = (self._log.events(limit=self.max_rows) if summary is not None
                 else self.events[:self.max_rows])
        rows = [_row(e) for e in shown]
        head = "".join(f"<th>{c}</th>" for c in _COLUMNS)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(r[c])}</td>" for c in _COLUMNS) + "</tr>"
                       for r in rows)
        more = len(self) - len(rows)
        note = f"<p>... {more} more event(s)</p>" if more > 0 else ""
        return (f"<div><pre>{html.escape(self._header())}</pre>"
                f"<table style='font-family:monospace;font-size:90%'><thead><tr>{head}</tr></thead>"
                f"<tbody>{body}</tbody></table>{note}</div>")
