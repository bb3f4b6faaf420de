"""A run's log read as events: one device's rows written out from the columnar records
(``simpmd/core/log.py``) only when someone reads them, as :class:`Event` s, each collective
group's members as one sequence, and the totals a trace's header shows without writing
out any event. ``simpmd.Trace`` reads the log through these.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ..core.core import Aval


@dataclass
class Event:
    """One line of one program's log.

    ``kind`` is ``'receive'`` (a block of an argument arrived), ``'collective'`` (the
    program took part in a collective), ``'return'`` (a leaf of the result left),
    ``'print'`` or ``'error'``. A *program* is what runs on one simulated device; in a
    nested pmap the outer body is also a program, spanning the devices of its inner pmap.
    """

    kind: str
    program: str                       # 'device 3', or 'data=1' for an outer nested body
    coords: tuple                      # ((axis name, index, size), ...) outer to inner
    seq: int = 0                       # position in this program's log
    step: int = 0                      # global order; a collective's members share it
    call: int = 0                      # k-th collective call of the run (SPMD: same k = same call)
    device: int | None = None          # simulated device id (None for an outer nested body)
    devices: tuple = ()                # all devices this program spans
    op: str | None = None              # 'psum', 'all_gather', ... for collectives
    axes: tuple = ()                   # axis names the collective runs over
    group: tuple = ()                  # device ids (or program labels) of the group, in order
    group_programs: tuple = ()         # program labels of the group, in order
    member: int = 0                    # this program's position in ``group``
    params: dict = field(default_factory=dict)   # lax's keywords: axis, tiled, perm, ...
    inputs: tuple = ()                 # leaves before (NumPy arrays; none on shapes alone)
    outputs: tuple = ()                # leaves after
    in_avals: tuple = ()               # their types (shape, dtype), with or without values
    out_avals: tuple = ()
    bytes_sent: int = 0
    bytes_received: int = 0
    source: str = ""                   # 'file.py:12'
    code: str = ""                     # text of that source line
    detail: str = ""                   # e.g. "x[3], shape (2,), from x of shape (8, 2)"
    phase: str = "forward"             # 'backward' for a collective of a gradient's backward pass,
                                       # 'recompute' for one a checkpoint runs again there
    iteration: tuple = ()              # inside loops: the iteration of each, outermost first

    def __post_init__(self):          # an event written with values only: their types
        if self.inputs and not self.in_avals:
            self.in_avals = tuple(_aval_of(np.asarray(v)[None]) for v in self.inputs)
        if self.outputs and not self.out_avals:
            self.out_avals = tuple(_aval_of(np.asarray(v)[None]) for v in self.outputs)

    shapes_in = property(lambda self: tuple(a.shape for a in self.in_avals))
    shapes_out = property(lambda self: tuple(a.shape for a in self.out_avals))
    dtypes = property(lambda self: tuple(a.dtype for a in (self.in_avals or self.out_avals)))
    nbytes_in = property(lambda self: int(sum(a.nbytes for a in self.in_avals)))
    nbytes_out = property(lambda self: int(sum(a.nbytes for a in self.out_avals)))



def summary(log, devices):
    """What a trace's header and table need, without writing out every device's
    events: None when a nested pmap makes it complicated."""
    count = groups = sent = 0
    for r in log.records:
        if r.run.inner is not None or r.run.outer is not None:
            return None
        if r.kind == "receive":
            count += r.run.n * len(r.fields["pieces"])
        elif r.kind in ("return", "print"):
            count += r.run.n
        elif r.kind == "error":
            count += 1
        else:
            for members in r.fields["sets"]:
                g, p = members.shape
                count, groups = count + g * p, groups + g
                moved = bytes_moved(r.fields, p)
                same = getattr(r.fields["prim"], "same_bytes", True)
                sent += g * (p * moved(0)[0] if same else sum(moved(pos)[0] for pos in range(p)))
    return {"events": count, "collective_groups": groups, "bytes_sent": sent,
            "programs": [f"device {d.id}" for d in sorted(devices, key=lambda d: d.id)]}

def events(log, only=None, limit=None) -> list:
    """Every device's events, written out from the records: all of them, those of
    device ``only``, or the first ``limit``."""
    out, seq, known = [], {}, {}

    class Enough(Exception):
        pass

    def ids_of(run):                       # each run's device ids, listed once
        if id(run) not in known:
            known[id(run)] = _ids(run)
        return known[id(run)]

    def event(run, k, kind, step, **fields):
        ids = ids_of(run)
        if only is not None and ids[k] != only:
            return
        key = (id(run), k)
        e = Event(kind=kind, program=run.label(k), coords=run.coords_of(k),
                  seq=seq.get(key, 0), step=step, device=ids[k], devices=_spans(run, k),
                  **fields)
        seq[key] = e.seq + 1
        out.append(e)
        if limit is not None and len(out) >= limit:
            raise Enough
    try:
        for r in log.records:
            _write(r, event, only, ids_of(r.run))
    except Enough:
        pass
    return out

def _write(r, event, only, ids):
    run, f = r.run, r.fields
    ks = range(run.n) if only is None or r.kind == "collective" else \
        [k for k, i in enumerate(ids) if i == only]
    if r.kind == "receive":
        for k in ks:
            for piece in f["pieces"]:
                event(run, k, "receive", r.step, inputs=_row_of(piece.stack, k),
                      in_avals=(piece.aval,), detail=piece.detail(k))
    elif r.kind == "return":
        aval = f["aval"] or _aval_of(f["stack"])
        for k in ks:
            event(run, k, "return", r.step, outputs=_row_of(f["stack"], k),
                  out_avals=(aval,), detail=f["detail"](k))
    elif r.kind == "print":
        for k in ks:
            event(run, k, "print", r.step, detail=f["texts"][k], source=f["source"][0],
                  code=f["source"][1])
    elif r.kind == "error":
        event(run, 0, "error", r.step, detail=f["text"])
    else:
        step = r.step
        for members in f["sets"]:
            moved = bytes_moved(f, members.shape[1])
            for row in members.tolist():
                group, programs = _group(run, row, ids)
                if only is None or only in group:
                    for pos, k in enumerate(row):
                        if only is not None and ids[k] != only:
                            continue           # (what event() would drop, not made)
                        event(run, k, "collective", step, **_member_fields(
                            r, row, pos, k, group, programs, moved))
                step += 1

def collective_groups(log) -> list:
    """Each collective instance (one group's rendezvous) as a sequence of its members'
    events, made only when read: one pass over the records at any device count."""
    groups, counts, known = [], {}, {}  # counts: events so far of each program of a run
    for r in log.records:
        seen = counts.get(id(r.run))
        if seen is None:
            seen = counts[id(r.run)] = np.zeros(r.run.n, dtype=np.int64)
            known[id(r.run)] = _ids(r.run)
        if r.kind == "receive":
            seen += len(r.fields["pieces"])
        elif r.kind in ("return", "print"):
            seen += 1
        elif r.kind == "error":
            seen[0] += 1
        else:
            step = r.step
            for members in r.fields["sets"]:
                for row in members:
                    groups.append(_GroupEvents(r, row, step, seen[row], known[id(r.run)]))
                    step += 1
                np.add.at(seen, members.ravel(), 1)
    return sorted(groups, key=lambda g: g.step)


def _ids(run):
    """Device ids of the run's programs (None for outer bodies of a nested pmap)."""
    if run.inner is not None:
        return [None] * run.n
    return [d.id for d in run.devices]


def _row_of(stack, k):
    return () if stack is None else (stack[k, ...],)


def _aval_of(stack):
    """The type of one device's row of ``stack``."""
    return Aval(stack.shape[1:], stack.dtype)


def _spans(run, k):
    return tuple(run.leaf_ids(k))


def _group(run, row, ids):
    """(device ids, program labels) of a group's members: made once per group, shared by
    its members' events (once per member made the log quadratic in the devices)."""
    programs = tuple(run.label(j) for j in row)
    return (tuple(ids[j] for j in row) if run.inner is None else programs), programs

def _member_fields(r, row, pos, k, group, programs, moved):
    f = r.fields
    sent, received = moved(pos)
    values = (lambda stacks: tuple(s[k, ...] for s in stacks)) if f["stacks"] is not None else \
        (lambda stacks: ())
    return dict(call=f["call"], op=f["op"], axes=f["axes"], member=pos, params=f["params"],
                inputs=values(f["stacks"]), outputs=values(f["outputs"] or ()),
                in_avals=tuple(f["avals"]), out_avals=tuple(f["out_avals"]),
                bytes_sent=sent, bytes_received=received, source=f["source"][0],
                code=f["source"][1], group=group,
                group_programs=programs, phase=f["phase"],
                iteration=f["iteration"])


def bytes_moved(fields, p):
    """``pos -> (bytes sent, bytes received)`` of the member at ``pos`` of a group of
    ``p`` (all the collective's operands together), each position computed once."""
    wire, sizes, params = fields["prim"].wire_bytes, [a.nbytes for a in fields["avals"]], fields["raw"]

    @functools.lru_cache(maxsize=None)
    def moved(pos):
        pairs = [wire(b, p, pos, **params) for b in sizes]
        return sum(x for x, _ in pairs), sum(y for _, y in pairs)
    if getattr(fields["prim"], "same_bytes", True):      # every member moves the same
        return lambda pos: moved(0)
    return moved


class _GroupEvents(Sequence):
    """The events of one group of one collective, written out when read."""

    def __init__(self, record, row, step, seqs, ids):
        self.record, self.row, self.step, self.seqs, self.ids = record, row.tolist(), step, seqs, ids
        self._made: dict = {}
        self._shared = None          # (group, programs, bytes moved): made on first read

    def __len__(self):
        return len(self.row)

    def __getitem__(self, pos):
        if isinstance(pos, slice):
            return [self[i] for i in range(*pos.indices(len(self)))]
        pos = pos + len(self.row) if pos < 0 else pos
        if not 0 <= pos < len(self.row):
            raise IndexError(f"member {pos} of a group of {len(self.row)}")
        if pos not in self._made:
            r, k = self.record, self.row[pos]
            run = r.run
            if self._shared is None:
                self._shared = *_group(run, self.row, self.ids), bytes_moved(r.fields, len(self.row))
            group, programs, moved = self._shared
            self._made[pos] = Event(
                kind="collective", program=run.label(k), coords=run.coords_of(k),
                seq=int(self.seqs[pos]), step=self.step, device=self.ids[k],
                devices=_spans(run, k), **_member_fields(r, self.row, pos, k, group,
                                                         programs, moved))
        return self._made[pos]

    def __iter__(self):
        return (self[pos] for pos in range(len(self.row)))

    def __repr__(self):
        return repr(list(self))

    def __eq__(self, other):
        return list(self) == list(other)
