"""The log of a run: what each device received, which collectives it joined, what it returned.

The log is *columnar*: one record per event of the whole run (every device's values of a
collective stay stacked in one record), and one device's rows are written out as events
only when someone reads them (``simpmd/api/events.py``), so a 16384-device step logs as
fast as it computes. The learner reads it through a ``simpmd.Trace``.
"""
from __future__ import annotations

class _Record:
    """One event of the whole run: ``kind``, the run it happened in, its global step, and
    what it needs (``fields``): every device's values stacked."""

    __slots__ = ("kind", "run", "step", "fields")

    def __init__(self, kind, run, step, **fields):
        self.kind, self.run, self.step, self.fields = kind, run, step, fields

class Log:
    """The records of one run (a nested pmap's inner runs write into the same one)."""

    def __init__(self):
        self.records: list = []
        self.step = self.calls = 0
        self.prints: list = []       # debug.print lines, printed when the run returns

    def receive(self, run, pieces):
        """What each device received: ``pieces`` with ``stack`` and ``detail(k)``."""
        self.records.append(_Record("receive", run, self.step, pieces=pieces))

    def returned(self, run, stack, detail, aval=None):
        """What each device returned: ``stack`` (None on shapes alone) of type ``aval``."""
        self.records.append(_Record("return", run, self.step, stack=stack, detail=detail,
                                    aval=aval))

    def print(self, run, texts, source):
        self.prints += [f"[{run.where(k)}] {t}" for k, t in enumerate(texts)]
        self.records.append(_Record("print", run, self.step, texts=texts, source=source))

    def error(self, run, text):
        self.records.append(_Record("error", run, self.step, text=text))

    def collective(self, run, prim, axes, params, avals, out_avals, stacks, outputs, sets,
                   source, phase, iteration=()):
        self.calls += 1
        logged = prim.lax_params(params)
        if params.get("axis_index_groups") is not None:
            logged["axis_index_groups"] = tuple(tuple(g) for g in params["axis_index_groups"])
        self.records.append(_Record(
            "collective", run, self.step + 1, prim=prim, op=prim.op, axes=axes, params=logged,
            raw=params, avals=avals, out_avals=out_avals, stacks=stacks, outputs=outputs, sets=sets,
            call=self.calls, source=source, phase=phase, iteration=iteration))
        self.step += sum(m.shape[0] for m in sets)
