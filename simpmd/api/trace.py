"""``simpmd.Trace``: the log of one run, as a learner reads it.

``print(trace)`` shows the merged log, ``trace.device(3)`` one device's, ``trace.events``
every :class:`~simpmd.api.events.Event`, ``trace.collectives()`` each collective's group;
in Jupyter it shows as an HTML table, and ``trace.draw()`` draws the collectives. It reads
the run's columnar records (``simpmd/core/log.py``): nothing is written out until asked.
"""
from __future__ import annotations

from collections.abc import Sequence

from . import events as _events
from ..core.collectives import COLLECTIVES
from . import text as _text

VIEWS = None      # simpmd.viz, which sets itself here when imported: it comes after api/


def _views():
    """The pictures of a trace: :mod:`simpmd.viz`, a later layer than this one."""
    if VIEWS is None:
        raise RuntimeError("trace.draw() and trace.draw_timeline() are drawn by simpmd.viz, "
                           "which is not imported: import simpmd (or simpmd.viz) first")
    return VIEWS


class _EventList(Sequence):
    """``trace.events`` of a columnar log: its length is known at once, and the events are
    written out the first time one is read."""

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
    """The log of one run: ``print(trace)`` shows the merged log, ``trace.device(3)`` one
    device's, ``trace.events`` the records, ``trace.collectives()`` each collective's group;
    in Jupyter it shows as an HTML table, and ``trace.draw()`` draws the collectives."""

    def __init__(self, events=(), eager=False, max_rows=64, log=None, devices=()):
        self._events = None if log is not None else list(events)
        self._log, self._devices = log, list(devices)
        self.eager, self.max_rows = eager, max_rows
        self._summary = None
        self.program = None          # the traced program the run interpreted, if any
        self.shapes_only = False     # run on ShapeDtypeStructs: types, bytes, no values
        self.unlogged = []           # on shapes alone: equations whose collectives are not logged

    def _columnar(self):
        if self._log is None or self._events is not None:
            return None
        if self._summary is None:
            self._summary = _events.summary(self._log, self._devices) or False
        return self._summary or None

    def _written_out(self) -> list:
        if self._events is None:
            self._events = _events.events(self._log)
        return self._events

    @property
    def events(self):
        summary = self._columnar()
        return _EventList(self, summary["events"]) if summary else self._written_out()

    @events.setter
    def events(self, events):
        self._events = list(events)

    @property
    def programs(self) -> list:
        summary = self._columnar()
        if summary:
            return list(summary["programs"])
        seen: dict = {}
        for e in self.events:
            seen.setdefault(e.program, e.device if e.device is not None else -1)
        return sorted(seen, key=lambda p: (seen[p] == -1, seen[p], p))

    def for_program(self, program: str) -> list:
        return [e for e in self.events if e.program == program]

    def device(self, device_id: int) -> "Trace":
        """The log of one simulated device, as a Trace of its own."""
        if self._columnar():
            return Trace(_events.events(self._log, only=device_id), self.eager, self.max_rows)
        return Trace([e for e in self.events if e.device == device_id], self.eager, self.max_rows)

    def collectives(self) -> list:
        """Each collective instance (one group's rendezvous) as its members' events."""
        if self._log is not None:
            return _events.collective_groups(self._log)
        by_step: dict = {}
        for e in self.events:
            if e.kind == "collective":
                by_step.setdefault(e.step, []).append(e)
        return [sorted(v, key=lambda e: e.member) for _, v in sorted(by_step.items())]

    def calls(self) -> list:
        """Each collective call of the program (all its groups together), in order."""
        by_call: dict = {}
        for e in self.events:
            if e.kind == "collective":
                by_call.setdefault((len(e.coords), e.call), []).append(e)
        return [v for _, v in sorted(by_call.items(), key=lambda kv: min(e.step for e in kv[1]))]

    def collective_counts(self) -> dict:
        """The run's collectives by XLA's names, one per call: ``{'all-reduce': 1}``."""
        return collective_counts(self)

    def head(self, limit):
        """The first ``limit`` events (the columnar log writes out only those)."""
        if self._columnar():
            return _events.events(self._log, limit=limit)
        return list(self.events)[:limit]

    def __len__(self):
        summary = self._columnar()
        return summary["events"] if summary else len(self.events)

    def __iter__(self):
        return iter(self.events)

    # -- views: simpmd.viz makes them ---------------------------------------------------------
    def table(self, program=None) -> str:
        return _text.table(self, program)

    def per_device(self) -> str:
        return "\n\n".join(f"== {p} ==\n{self.table(p)}" for p in self.programs)

    def draw(self, call=None, **kwargs):
        """Draw the run's collectives, before and after (``call=k``: only the k-th)."""
        return _views().draw_trace(self, **kwargs) if call is None else \
            _views().draw_collective(self, call, **kwargs)

    def draw_timeline(self, hardware="TPU v4", **kwargs):
        """The modelled per-device timeline of this run (see simpmd.viz.draw_timeline)."""
        return _views().draw_timeline(self, hardware, **kwargs)

    def __str__(self):
        return _text.text(self)

    def _repr_html_(self):
        return _text.html_table(self)

    def __repr__(self):
        return f"<Trace of {len(self)} events over {len(self.programs)} program(s)>"


def collective_counts(trace_) -> dict:
    """How many collectives of each HLO kind a run did (one per call, all its groups
    together), e.g. ``{'all-reduce': 1}``: the numbers to hold beside XLA's HLO. The kind
    is each row's ``hlo`` column."""
    counts: dict = {}
    for call in trace_.calls():
        kind = COLLECTIVES[call[0].op].hlo
        counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))
