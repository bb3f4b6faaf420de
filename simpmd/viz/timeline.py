"""A run as a Gantt chart: one row per device, computing, waiting and communicating.

simpmd runs programs one at a time on one CPU, so it has no real clock to show. The
timeline is a *model* built from the trace:

* **communication**: each collective instance lasts what ``simpmd.cost.estimate_trace``
  says on the chosen hardware (all members of a group finish together). Without the cost
  model it falls back to the busiest member's logged bytes over a nominal 100 GB/s, and
  the chart says so.
* **compute**: between two collectives a device computes. simpmd does not see the
  arithmetic, so by default a segment lasts the time to write the values the device then
  hands to the collective (or returns) once through HBM: ``bytes / hbm_bandwidth``. That
  is a lower bound that fits elementwise code; a matmul takes far longer. Pass
  ``compute=`` (seconds per segment, or a function) for your own numbers, and
  ``slowdown={device: factor}`` to make a straggler.
* **waiting**: a collective starts when the last member of its group arrives; the others
  wait from their arrival until then. In a nested pmap an outer program spans several
  devices, and its collectives start when all of them are ready.
* **idle**: a compute segment whose result the program throws away (a pipeline stage
  that has no microbatch yet runs its layer on zeros, since every device runs the same
  program). Pass ``idle(device, k) -> bool`` to say which; they take the same time as
  compute but are drawn and counted as idle: the pipeline's *bubble*.

The order of the model is the order of the trace's events: a device's segments follow
its own log, and collective instances run in ``step`` order.
"""
from __future__ import annotations

from dataclasses import dataclass

from matplotlib.patches import Patch, Rectangle
from matplotlib.transforms import blended_transform_factory

import numpy as np

from .canvas import INK, MIN_FONT, OKABE_ITO, elide, figure_and_axes, font_size, tag, tint

FALLBACK_BANDWIDTH = 100e9      # bytes/s, used only when simpmd.cost is missing
FALLBACK_HBM = 1e12
MAX_ROWS = 16          # more devices than this: the middle ones are elided, with a note
MAX_PATCHES = 2000     # more segments than this: one bar collection per row and kind
ROW_IN = 0.32          # a row's height (inches) up to 24 rows; past that the least that keeps
FLOOR_ROW_IN = MIN_FONT / 26 + 0.005   # ... a 7 pt label on every row (canvas.font_size)
# Okabe-Ito colours (see canvas.OKABE_ITO): sky blue computes, grey hatched waits, and each
# collective op gets one of the other hues (the labels in the bars name them too)
COLORS = {"compute": tint(OKABE_ITO[1], 0.7), "wait": (0.93, 0.93, 0.93),
          "comm": tint(OKABE_ITO[0], 0.85), "idle": (1.0, 1.0, 1.0)}
KINDS = ("compute", "idle", "wait", "comm")
OP_COLORS = [tint(OKABE_ITO[k], 0.85) for k in (0, 2, 6, 3, 5, 4)]


@dataclass(frozen=True)
class Segment:
    """What one device does from ``start`` to ``stop`` (seconds): compute, idle, wait or comm."""

    device: int
    kind: str            # 'compute', 'idle', 'wait' or 'comm'
    start: float
    stop: float
    program: str
    label: str = ""
    step: int | None = None

    @property
    def duration(self) -> float:
        return self.stop - self.start


@dataclass
class Timeline:
    """The modelled run: segments per device, and what the numbers came from.

    A run on thousands of devices keeps the segments of a few ``watched`` devices only
    (the ones a drawing shows) and every device's totals per kind (``totals``); asking
    for another device's segments models the run again for it."""

    segments: list
    devices: list
    end: float
    comm_model: str
    compute_model: str
    hardware: str = ""      # what the communication times are for
    totals: dict | None = None      # kind -> seconds per device, in the order of ``devices``
    watched: frozenset | None = None
    remodel: object = None          # watch -> Timeline, for devices not watched
    roofline: object = None         # the Roofline its compute came from, if it did

    def of(self, device: int) -> list:
        if self.watched is not None and device not in self.watched:
            return self.remodel(self.watched | {device}).of(device)
        return [s for s in self.segments if s.device == device]

    def total(self, kind: str, device: int | None = None) -> float:
        if self.totals is not None:
            seconds = self.totals[kind]
            return float(seconds.sum() if device is None else seconds[self._position(device)])
        return sum(s.duration for s in self.segments
                   if s.kind == kind and (device is None or s.device == device))

    def _position(self, device):
        if getattr(self, "_positions", None) is None:
            self._positions = {d: k for k, d in enumerate(self.devices)}
        return self._positions[device]

    def most(self, kind: str):
        """(device, seconds): the device that spends most time on ``kind``."""
        if self.totals is not None:
            k = int(np.argmax(self.totals[kind])) if len(self.devices) else 0
            return (self.devices[k], float(self.totals[kind][k])) if self.devices else (None, 0.0)
        best = max(self.devices, key=lambda d: self.total(kind, d), default=None)
        return best, (self.total(kind, best) if best is not None else 0.0)

    def fraction(self, kind: str, device: int | None = None) -> float:
        """The share of the run spent on ``kind``: of ``device``'s time from 0 to ``end``,
        or of all devices' time together (``fraction('idle')`` is a pipeline's bubble)."""
        span = self.end * (1 if device is not None else len(self.devices))
        return self.total(kind, device) / span if span > 0 else 0.0


def _comm_times(trace, hardware, topology):
    """Seconds per collective step, the HBM bandwidth, and a label saying where they came from."""
    try:
        from .. import cost           # optional: a timeline without the cost model says so
        estimate = cost.estimate_trace(trace, hardware=hardware, topology=topology)
        machine = cost._hardware_of(hardware, trace)       # a preset, or a Hardware given
        hbm = machine.hbm_bandwidth
    except ImportError:
        times = {}
        for group in trace.collectives():
            busiest = max(max(e.bytes_sent, e.bytes_received) for e in group)
            times[group[0].step] = busiest / FALLBACK_BANDWIDTH
        return (times, FALLBACK_HBM,
                f"communication: busiest member's bytes / {FALLBACK_BANDWIDTH / 1e9:g} GB/s "
                f"(simpmd.cost is not available: not a hardware estimate)",
                f"{FALLBACK_HBM / 1e12:g} TB/s", f"{FALLBACK_BANDWIDTH / 1e9:g} GB/s links")
    times = _StepTimes(estimate)
    times.machine = machine
    return (times, hbm, f"communication: simpmd.cost on {estimate.hardware} ({estimate.topology})",
            f"{hbm / 1e12:g} TB/s HBM", str(estimate.hardware))


class _StepTimes(dict):
    """Seconds per collective step, read from an estimate when first asked (a columnar
    estimate of thousands of devices is read call by call instead)."""

    def __init__(self, estimate):
        super().__init__()
        self.estimate = estimate

    def get(self, step, default=None):
        if not self:
            self.update({c.step: c.time_s for c in self.estimate.collectives})
        return super().get(step, default)


def _roofline_segments(trace, hardware, fused=False, while_trips=None):
    """(seconds of each compute segment, the Roofline) from the program ``trace`` ran, or
    None when there is none (an eager run) or it does not line up with the log."""
    program = getattr(trace, "program", None)
    if program is None:
        return None
    try:
        from .. import cost           # optional; on values, the branches and trips each device ran
        r = cost.roofline_of(program, hardware, getattr(program, "axis_env", None),
                             taken=cost.taken_in(trace), while_trips=while_trips)
    except (ImportError, ValueError, KeyError):
        return None
    segs = r.segments(fused)
    log = _columnar(trace)
    if log is not None:
        counts = set(_collective_counts(log).tolist())
    else:
        per_program: dict = {}
        for e in trace.events:
            if e.kind == "collective":
                per_program[e.program] = per_program.get(e.program, 0) + 1
        counts = set(per_program.values())
    if counts - {len(segs) - 1}:
        return None                  # e.g. collectives in a cond branch some devices skip
    return segs, r


def _columnar(trace):
    """The trace's columnar log, read call by call (None for an eager or nested run)."""
    try:
        from ..cost import _columnar_log      # optional, as above
    except ImportError:
        return None
    return _columnar_log(trace)


def _collective_counts(log):
    """How many collectives each device of the run joined."""
    run = next((r.run for r in log.records), None)
    counts = np.zeros(run.n if run is not None else 0, dtype=np.int64)
    for r in log.records:
        if r.kind == "collective":
            for members in r.fields["sets"]:
                np.add.at(counts, members.ravel(), 1)
    return counts


def _model_columnar(log, estimate, roofline, compute, slowdown, watch, hbm, labels):
    """The model of :func:`model_timeline` for a columnar log: every device's clock at
    once, call by call; segments kept for the watched devices only (past 64 devices)."""
    run = next(r.run for r in log.records)
    ids = [d.id for d in run.devices]
    n, where = len(ids), {d: k for k, d in enumerate(ids)}
    if watch is None:
        watch = ids if n <= 64 else [d for d in elide(sorted(ids), MAX_ROWS)[0] if d is not None]
    watched = frozenset(watch) | frozenset(slowdown or ())
    keep = np.zeros(n, dtype=bool)
    keep[[where[d] for d in watched if d in where]] = True
    slow = np.ones(n)
    for d, factor in (slowdown or {}).items():
        slow[where[d]] = float(factor)
    segs = np.asarray(roofline[0]) if roofline is not None else None
    times = {id(c.record): c.set_times for c in estimate.calls}
    clock, count = np.zeros(n), np.zeros(n, dtype=np.int64)
    totals = {kind: np.zeros(n) for kind in KINDS}
    segments: list = []

    def work(rows, nbytes):
        if segs is not None:
            base = segs[np.minimum(count[rows], len(segs) - 1)]
        elif compute is None:
            base = np.full(len(rows), nbytes / hbm)
        else:
            base = np.full(len(rows), float(compute))
        t = base * slow[rows]
        for i in np.nonzero(keep[rows] & (t > 0))[0]:
            k = rows[i]
            segments.append(Segment(ids[k], "compute", clock[k], clock[k] + t[i], run.label(k)))
        clock[rows] += t
        totals["compute"][rows] += t
        count[rows] += 1

    returned = False
    for r in log.records:
        f = r.fields
        if r.kind == "collective" and f["sets"]:
            work(np.concatenate([m.ravel() for m in f["sets"]]), sum(a.nbytes for a in f["avals"]))
            _columnar_call(r, times[id(r)], clock, totals, keep, segments, (ids, run.label))
        elif r.kind == "return" and not returned:
            returned = True
            work(np.arange(n), sum(_returned_bytes(x) for x in log.records if x.kind == "return"))
    segments.sort(key=lambda s: (s.start, s.device))

    def remodel(more):
        return _model_columnar(log, estimate, roofline, compute, slowdown, more, hbm, labels)
    comm_label, compute_label, hardware_name = labels
    order = np.argsort(ids, kind="stable")               # rows by device id, as in the events
    return Timeline(segments, [ids[k] for k in order], float(clock.max()) if n else 0.0,
                    comm_label, compute_label, hardware_name,
                    {kind: seconds[order] for kind, seconds in totals.items()},
                    watched if n > 64 else None, remodel)


def _columnar_call(r, set_times, clock, totals, keep, segments, naming):
    """One collective call of a columnar log: each group starts when its last member
    arrives; the others wait; every member's clock moves past the call."""
    (ids, label), f, step = naming, r.fields, r.step
    for members, durations in zip(f["sets"], set_times):
        start = clock[members].max(axis=1)
        waits = start[:, None] - clock[members]
        totals["wait"][members] += waits
        totals["comm"][members] += durations[:, None]
        for g, pos in zip(*np.nonzero(keep[members])):
            k = members[g, pos]
            if waits[g, pos] > 0:
                segments.append(Segment(ids[k], "wait", clock[k], start[g], label(k),
                                        f"waits for {f['op']}", step + g))
            segments.append(Segment(ids[k], "comm", start[g], start[g] + durations[g], label(k),
                                    f["op"], step + g))
        clock[members] = (start + durations)[:, None]
        step += len(members)


def _returned_bytes(record):
    """Bytes one device returned in a 'return' record (with values or on shapes alone)."""
    aval = record.fields["aval"]
    return aval.nbytes if aval is not None else record.fields["stack"][0].nbytes


def model_timeline(trace, hardware=None, *, compute=None, slowdown=None, topology=None,
                   idle=None, watch=None, fused=False, while_trips=None) -> Timeline:
    """Model the run of ``trace`` on ``hardware``; return a :class:`Timeline` of segments.

    ``hardware`` defaults to the platform's (``simpmd.set_device_count(n, hardware=...)``),
    as in ``simpmd.cost.estimate_trace``.

    ``compute``: None (the roofline of the run's traced program, segment by segment, see
    ``simpmd.cost.roofline``; for a run with no program, such as ``eager=True``, bytes
    written / HBM bandwidth, see the module docstring), a number
    (seconds for every compute segment), or ``f(program, k, event) -> seconds`` for the
    k-th segment of a program (``event`` is the collective that ends it, or None for the
    last segment, before the program returns). ``slowdown``: ``{device id: factor}``
    multiplies that device's compute. ``topology`` goes to ``simpmd.cost.estimate_trace``.
    ``idle``: ``f(device, k) -> bool``, true where the k-th compute segment of the program
    on ``device`` does no useful work; that segment becomes an 'idle' one. ``fused``: the
    roofline's segments count the matrix products alone, the elementwise work taken as
    fused into them (what XLA does, and what the Scaling Book's 6 x parameters x tokens
    counts); by default every equation counts on its own. ``while_trips``: how many times
    a while loop runs, for a run on shapes alone (as for ``simpmd.cost.roofline``).

    A run with a columnar log (no nested pmap) is modelled call by call with every
    device's clock at once; past 64 devices only the segments of the devices in
    ``watch`` (by default the first and last few) are kept, with every device's totals.
    """
    times, hbm, comm_label, hbm_label, hardware_name = _comm_times(trace, hardware, topology)
    estimate = getattr(times, "estimate", None)
    slowdown = dict(slowdown or {})
    roofline = (_roofline_segments(trace, getattr(times, "machine", hardware_name), fused,
                                   while_trips) if compute is None else None)
    compute_label = _compute_label(roofline, compute, fused, hbm_label)
    if idle is None and not callable(compute):
        log = _columnar(trace)
        if log is not None:
            timeline = _model_columnar(log, estimate, roofline, compute, slowdown, watch, hbm,
                                       (comm_label, compute_label, hardware_name))
            timeline.roofline = roofline[1] if roofline is not None else None
            return timeline
    clock = _EventClock(trace, roofline, compute, hbm, slowdown, idle)
    for e in trace.events:
        if e.kind == "collective" and e.step not in clock.done_steps:
            clock.collective(e, float(times.get(e.step, 0.0)))
        elif e.kind == "return" and e.program not in clock.done_programs:
            clock.done_programs.add(e.program)
            clock.run_compute(e.program, _spans(e), None, clock.returned.get(e.program, 0))
    end = max(clock.clock.values(), default=0.0)
    return Timeline(clock.segments, clock.devices, end, comm_label, compute_label, hardware_name,
                    roofline=roofline[1] if roofline is not None else None)


def _compute_label(roofline, compute, fused, hbm_label) -> str:
    """What the timeline's compute segments stand for."""
    if roofline is not None:
        r = roofline[1]
        return (f"compute: roofline of the traced program on {r.hardware}, "
                + (f"its matrix products ({r.flops:.3g} FLOPs, {r.hbm_bytes:.3g} B of "
                   f"HBM traffic per device; the rest taken as fused into them)" if fused
                   else f"every equation on its own ({r.unfused_flops:.3g} FLOPs, "
                        f"{r.bytes:.3g} B of HBM traffic per device)"))
    if compute is None:
        return (f"compute: bytes each device writes for its next collective or result / "
                f"{hbm_label} (a lower bound)")
    if callable(compute):
        return "compute: as given (compute=)"
    return f"compute: {_seconds(float(compute))} per segment (as given)"


class _EventClock:
    """Each device's clock through a log read event by event (a nested pmap's, or with
    ``idle`` or a ``compute`` function): compute segments between collectives, a wait
    until the whole group arrives, then the collective."""

    def __init__(self, trace, roofline, compute, hbm, slowdown, idle):
        self.roofline, self.compute, self.hbm = roofline, compute, hbm
        self.slowdown, self.idle = slowdown, idle
        self.devices = sorted({e.device for e in trace.events if e.device is not None}
                              | {d for e in trace.events for d in e.devices})
        self.clock = {d: 0.0 for d in self.devices}
        self.segments, self.count, self.returned, self.by_step = [], {}, {}, {}
        for e in trace.events:
            if e.kind == "return":
                self.returned[e.program] = self.returned.get(e.program, 0) + e.nbytes_out
            if e.kind == "collective":
                self.by_step.setdefault(e.step, []).append(e)
        self.done_steps, self.done_programs = set(), set()

    def seconds(self, program, k, event, nbytes, width):
        if self.roofline is not None:
            segs = self.roofline[0]
            return segs[k] if k < len(segs) else 0.0
        if self.compute is None:
            return nbytes / self.hbm / width
        if callable(self.compute):
            return float(self.compute(program, k, event))
        return float(self.compute)

    def run_compute(self, program, spans, event, nbytes):
        k = self.count.get(program, 0)
        self.count[program] = k + 1
        base = self.seconds(program, k, event, nbytes, max(len(spans), 1))
        for d in spans:
            t = base * float(self.slowdown.get(d, 1.0))
            kind = "idle" if self.idle is not None and self.idle(d, k) else "compute"
            if t > 0:
                self.segments.append(Segment(d, kind, self.clock[d], self.clock[d] + t, program))
            self.clock[d] += t

    def collective(self, e, duration):
        """The members' compute up to collective ``e``, their waits, then the collective."""
        self.done_steps.add(e.step)
        members = sorted(self.by_step[e.step], key=lambda m: m.member)
        for m in members:
            self.run_compute(m.program, _spans(m), m, m.nbytes_in)
        start = max(self.clock[d] for m in members for d in _spans(m))
        for m in members:
            for d in _spans(m):
                if start > self.clock[d]:
                    self.segments.append(Segment(d, "wait", self.clock[d], start, m.program,
                                                 f"waits for {m.op}", e.step))
                self.segments.append(Segment(d, "comm", start, start + duration, m.program,
                                             m.op, e.step))
                self.clock[d] = start + duration


def _spans(e):
    return [e.device] if e.device is not None else list(e.devices)


def _seconds(t: float) -> str:
    if t == 0:
        return "0 s"
    unit, scale = _unit(t)
    return f"{t / scale:.3g} {unit}"


def _unit(t: float):
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if t >= scale:
            return unit, scale
    return "ns", 1e-9


def _rows(tl, most, keep):
    """The rows to draw: device ids, and lists of elided devices (one note row each).

    Past ``most`` devices the middle is elided, as in the other drawings, except the
    devices in ``keep``: a straggler, or the device that waits most, stays in view."""
    shown, _ = elide(tl.devices, most)
    shown = set(d for d in shown if d is not None) | set(keep)
    rows: list = []
    for d in tl.devices:
        if d in shown:
            rows.append(d)
        elif rows and isinstance(rows[-1], list):
            rows[-1].append(d)
        else:
            rows.append([d])
    # a lone hidden device is drawn instead: its note would take a row anyway
    return [r[0] if isinstance(r, list) and len(r) == 1 else r for r in rows]


def _draw_bars(ax, segments, row, op_color, scale):
    """Many segments at once: one ``broken_barh`` per row, kind and op (a rectangle each
    would take matplotlib minutes), tagged ``simpmd:<kind>:<device>``."""
    groups: dict = {}
    for s in segments:
        groups.setdefault((s.device, s.kind, s.label if s.kind == "comm" else ""), []).append(
            (s.start / scale, s.duration / scale))
    for (device, kind, label), spans in groups.items():
        color = op_color.get(label, COLORS["comm"]) if kind == "comm" else COLORS[kind]
        bars = ax.broken_barh(spans, (row[device] - 0.38, 0.76), facecolors=color,
                              edgecolors="none", hatch="///" if kind == "wait" else None,
                              zorder=2)
        tag(bars, kind, device)


def _elision_note(tl, hidden):
    if tl.totals is not None:
        waited = float(tl.totals["wait"][[tl._position(d) for d in hidden]].max())
    else:
        waited = max(tl.total("wait", d) for d in hidden)
    return (f"{len(hidden)} devices not drawn: devices {hidden[0]} to {hidden[-1]} "
            f"({'each waits at most ' + _seconds(waited) if waited else 'none of them waits'})")


def draw_timeline(trace, hardware=None, *, compute=None, slowdown=None, topology=None,
                  title=None, max_rows: int | None = MAX_ROWS, ax=None, idle=None,
                  window=None, fused=False):
    """Draw the modelled run as a Gantt chart, one row per device; return the Figure.

    Blue: compute; orange: communication (one colour per collective op when a run uses
    several kinds); grey: waiting for the last member of a group. See :func:`model_timeline` for
    the model and its limits. Past ``max_rows`` devices the middle rows are elided with a
    note (``max_rows=None`` draws every row, in a taller figure), but the devices in
    ``slowdown`` and the one that waits most stay; every row is labelled, at 7 pt or more.
    Rows are tagged ``simpmd:device:<id>``, segments ``simpmd:<kind>:<device>:<k>``, the
    notes ``simpmd:elided:<count>``. White, dotted: idle (see ``idle`` in
    :func:`model_timeline`). ``trace`` may also be a :class:`Timeline` already modelled
    (or built by hand, e.g. for a schedule); a compute segment's ``label`` is then written
    in its bar. ``window=(start, stop)`` (seconds) draws only that stretch of the run, e.g.
    one layer of a long training step; a run of thousands of segments per row is drawn
    as one bar collection per row and kind (tagged ``simpmd:<kind>:<device>``).
    """
    if isinstance(trace, Timeline):
        tl = trace
    else:
        tl = model_timeline(trace, hardware, compute=compute, slowdown=slowdown,
                            topology=topology, idle=idle, fused=fused)
    waits_most, waited = tl.most("wait")
    keep = set(slowdown or {}) | ({waits_most} if waited > 0 else set())
    rows = _rows(tl, max_rows, keep & set(tl.devices)) if tl.devices else []
    drawn = {d for d in rows if not isinstance(d, list)}
    if tl.watched is not None and not drawn <= tl.watched:
        tl = tl.remodel(frozenset(drawn))
    n = len(rows)
    row_in = ROW_IN if n <= 24 else FLOOR_ROW_IN
    fig, ax = figure_and_axes(ax, 10.0, n * row_in + 1.6)
    if ax.get_position().width > 0.9:        # our own figure: leave room for labels
        ax.set_position((0.1, 1.05 / (n * row_in + 1.6), 0.87, n * row_in / (n * row_in + 1.6)))
    ax.set_axis_on()
    begin, end = (0.0, tl.end) if window is None else (float(window[0]), float(window[1]))
    end = end if end > begin else begin + 1e-9
    unit, scale = _unit(end - begin)
    row = {d: k for k, d in enumerate(rows) if not isinstance(d, list)}
    ops = sorted({s.label for s in tl.segments if s.kind == "comm"})
    op_color = {op: OP_COLORS[k % len(OP_COLORS)] for k, op in enumerate(ops)}
    fs = font_size(row_in, largest=8.5)
    _row_backs(ax, tl, rows, (begin, end, scale), fs)
    visible = [s for s in tl.segments if s.device in row and s.stop >= begin and s.start <= end]
    if len(visible) > MAX_PATCHES:
        _draw_bars(ax, visible, row, op_color, scale)
    elif visible:
        _draw_segments(ax, tl, row, op_color, (begin, end, scale), fs, n)
    ax.set_xlim(begin / scale, begin / scale + (end - begin) / scale * 1.01)
    ax.set_ylim(n - 0.5, -0.5)
    ax.set_yticks(range(n))
    ax.set_yticklabels(["⋮" if isinstance(d, list) else f"device {d}" for d in rows], fontsize=fs)
    ax.set_xlabel(f"time ({unit}), modelled" + ("" if window is None else
                  f"; the run lasts {_seconds(tl.end)}, this is {_seconds(begin)} to "
                  f"{_seconds(end)}"), fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    _legend_and_title(fig, ax, tl, ops, op_color, title, waited)
    return fig


def _row_backs(ax, tl, rows, span, fs):
    """Each drawn row's background, tagged by its device; a note where rows are elided."""
    begin, end, scale = span
    across = blended_transform_factory(ax.transAxes, ax.transData)
    for k, d in enumerate(rows):
        if isinstance(d, list):
            note = ax.text(0.01, k, "⋮  " + _elision_note(tl, d), transform=across, ha="left",
                           va="center", fontsize=max(fs, MIN_FONT + 0.5), color=INK,
                           style="italic", zorder=3)
            tag(note, "elided", len(d))
            continue
        back = Rectangle((begin / scale, k - 0.5), (end - begin) / scale, 1.0,
                         facecolor=(0.985, 0.985, 0.985), edgecolor="none", zorder=0)
        tag(back, "device", d)
        ax.add_patch(back)


def _draw_segments(ax, tl, row, op_color, span, fs, n):
    """Every segment of the drawn rows within ``span`` (begin, end, time scale), one bar
    each, tagged, with its label where it is wide enough."""
    begin, end, scale = span
    counters: dict = {}
    for s in tl.segments:
        k = counters.get((s.kind, s.device), 0)
        counters[(s.kind, s.device)] = k + 1
        if s.device not in row or s.stop < begin or s.start > end:
            continue
        color = op_color.get(s.label, COLORS["comm"]) if s.kind == "comm" else COLORS[s.kind]
        edge = {"wait": (0.6, 0.6, 0.6), "idle": (0.45, 0.45, 0.45)}.get(s.kind, "white")
        rect = Rectangle((s.start / scale, row[s.device] - 0.38), s.duration / scale, 0.76,
                         facecolor=color, edgecolor=edge, linewidth=0.4 if s.kind != "idle" else 0.8,
                         linestyle=":" if s.kind == "idle" else "-",
                         hatch="///" if s.kind == "wait" else None, zorder=2)
        tag(rect, s.kind, f"{s.device}:{k}")
        ax.add_patch(rect)
        size = max(fs * 0.85, MIN_FONT)
        if s.label and s.kind in ("comm", "compute") and n <= 16 and \
                _label_fits(ax, s, end - begin, size):
            ax.text((s.start + s.stop) / 2 / scale, row[s.device], s.label, ha="center",
                    va="center", fontsize=size, color=INK, zorder=3)


def _label_fits(ax, segment, span, size) -> bool:
    """Whether ``segment``'s label, at ``size`` points, fits inside its bar: a collective's
    bar must also be 6% of the span (their names are long and many); a compute bar need
    only hold its text, so that a schedule's short chunks (F03) are labelled too."""
    share = segment.duration / span
    if segment.kind == "comm":
        return share > 0.06
    fig_width_in = ax.figure.get_size_inches()[0] * ax.get_position().width
    text_in = len(segment.label) * size * 0.62 / 72 + 0.04
    return share > 0.01 and share * fig_width_in >= text_in


def _legend_and_title(fig, ax, tl, ops, op_color, title, waited):
    handles = [Patch(facecolor=COLORS["compute"], label="compute")]
    if any(s.kind == "idle" for s in tl.segments):
        handles.append(Patch(facecolor=COLORS["idle"], edgecolor=(0.45, 0.45, 0.45),
                             linestyle=":", label="idle (no useful work)"))
    handles.append(Patch(facecolor=COLORS["wait"], edgecolor=(0.6, 0.6, 0.6), hatch="///",
                         label="waiting for the group"))
    handles += [Patch(facecolor=op_color[op], label=op) for op in ops]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(handles),
              fontsize=8, frameon=False)
    if title is None:
        title = (f"estimated run on {tl.hardware}: {_seconds(tl.end) if tl.end else '0 s'}; "
                 + (f"the device that waits most waits {_seconds(waited)}" if waited
                    else "no device waits"))
        if tl.total("idle"):
            title += f"; idle {tl.fraction('idle'):.1%} of all device time"
    fig.text(0.01, 0.995, title, ha="left", va="top", fontsize=10, fontweight="bold", color=INK)
    fig.text(0.01, 0.005, tl.comm_model + "\n" + tl.compute_model, ha="left", va="bottom",
             fontsize=7.5, color=INK)


def _uncovered(start: float, end: float, busy) -> float:
    """Seconds of ``start..end`` that no interval of ``busy`` ((start, end) pairs) covers."""
    return sum(e - s for s, e in _gaps(start, end, busy))


def prediction_label(kernel, busy) -> str:
    """What a bar of :func:`draw_prediction` says: a kernel's first equation and how many
    more XLA fused into it ('dot_general + 8 fused equations'); a collective's op, mesh axes and how
    much of it the compute stream (``busy``) does not hide, which tells a gradient
    all-reduce that overlaps from a tensor-parallel one that the next kernel waits for."""
    if kernel.stream != "communication":
        first, _, more = kernel.name.partition("+")
        return f"{first} + {more} fused equations" if more.isdigit() else kernel.name
    axes = ",".join(map(str, kernel.axes))
    exposed = _uncovered(kernel.start_s, kernel.end_s, busy)
    where = ("hidden behind compute" if exposed < 0.01 * kernel.time_s else
             "exposed: compute waits" if exposed > 0.99 * kernel.time_s else
             f"{_seconds(exposed)} exposed")
    return f"{kernel.name} over {axes}: {where}" if axes else f"{kernel.name}: {where}"


def _prediction_bars(ax, rows, end, scale, most_labels):
    """The kernels and collectives of :func:`draw_prediction`, labelled, and hatched gaps
    where the compute stream waits for a collective."""
    lane = {"compute": 0, "communication": 1}
    memory = tint(OKABE_ITO[2], 0.7)
    labelled = sorted(rows, key=lambda k: -k.time_s)[:most_labels]
    busy = [(k.start_s, k.end_s) for k in rows if k.stream == "compute"]
    for n, k in enumerate(rows):
        color = (COLORS["comm"] if k.comm_s and not k.inner else
                 memory if k.memory_s > k.compute_s else COLORS["compute"])
        rect = Rectangle((k.start_s / scale, lane[k.stream] - 0.36), k.time_s / scale, 0.72,
                         facecolor=color, edgecolor="white", linewidth=0.4, zorder=2)
        tag(rect, "comm" if k.comm_s and not k.inner else "kernel", n)
        ax.add_patch(rect)
        if k in labelled and k.time_s / end > 0.05:
            ax.text((k.start_s + k.end_s) / 2 / scale, lane[k.stream],
                    prediction_label(k, busy)[:44], ha="center", va="center",
                    fontsize=MIN_FONT, color=INK, zorder=3)
        if k.stream == "communication":
            for s, e in _gaps(k.start_s, k.end_s, busy):
                ax.add_patch(Rectangle((s / scale, -0.36), (e - s) / scale, 0.72,
                                       facecolor=COLORS["wait"], edgecolor="0.55",
                                       hatch="///", linewidth=0.4, zorder=1))
    return memory


def _gaps(start: float, end: float, busy):
    """The pieces of ``start..end`` that no interval of ``busy`` covers."""
    out, at = [], start
    for s, e in sorted(busy):
        if s > at and at < end:
            out.append((at, min(s, end)))
        at = max(at, e)
    if at < end:
        out.append((at, end))
    return [(s, e) for s, e in out if e > s]


def draw_prediction(prediction, *, title=None, ax=None, most_labels: int = 12):
    """Draw a :class:`simpmd.cost.predict.Prediction` of one device: its compute stream
    (kernels, blue where compute-bound, green where memory-bound) and, below, its
    collectives, which run beside the compute that does not need them (XLA's asynchronous
    collectives); a hatched gap in the compute row is communication nothing hid, and each
    collective's label says how much of it was exposed. Predict with ``overlap=False`` to
    draw everything on one stream. Kernels are tagged ``simpmd:kernel:<k>``, collectives
    ``simpmd:comm:<k>``; return the Figure."""
    rows = prediction.kernels
    end = max((k.end_s for k in rows), default=0.0) or 1e-9
    unit, scale = _unit(end)
    fig, ax = figure_and_axes(ax, 10.0, 2.6)
    if ax.get_position().width > 0.9:
        ax.set_position((0.17, 0.3, 0.8, 0.45))
    ax.set_axis_on()
    memory = _prediction_bars(ax, rows, end, scale, most_labels)
    ax.set_xlim(0, end / scale * 1.01)
    ax.set_ylim(1.6, -0.6)
    ax.set_yticks([0, 1])
    ax.set_yticklabels(["compute stream", "collectives"], fontsize=8.5)
    ax.set_xlabel(f"time ({unit}), predicted; the call from Python adds "
                  f"{_seconds(prediction.time_s - end) if prediction.time_s > end else '0 s'}",
                  fontsize=8.5)
    ax.tick_params(axis="x", labelsize=8)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(facecolor=COLORS["compute"], label="compute-bound kernel"),
               Patch(facecolor=memory, label="memory-bound kernel"),
               Patch(facecolor=COLORS["comm"], label="collective"),
               Patch(facecolor=COLORS["wait"], edgecolor="0.55", hatch="///",
                     label="compute waits for a collective")]
    ax.legend(handles=handles, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=4, fontsize=8,
              frameon=False)
    terms = ", ".join(f"{name} {_seconds(t)}" for name, t in prediction.terms.items() if t)
    fig.text(0.01, 0.995, title or f"predicted on {prediction.hardware}: "
             f"{_seconds(prediction.time_s)} ({terms}); {prediction.bound}-bound"
             f"{'' if prediction.overlap else ', collectives not overlapped'}",
             ha="left", va="top", fontsize=10, fontweight="bold", color=INK)
    return fig
