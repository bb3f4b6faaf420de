"""Collectives, before and after: what every device held, what it ends with, where it came from.

Each device is a row: its value before the collective on the left, after it on the right,
drawn to scale (one cell per element, the same cell size on both sides, so an all-gather's
result is p times as wide as its input and a reduce-scatter's p times narrower). 2-D values
are drawn as rows x columns grids. Cells are coloured by the device their data came from
(Okabe-Ito colours, safe for colour-blind readers), outlined in blocks by source device, and
carry their numbers where the numbers fit. Between the columns, each group is a band: its
members exchange data among themselves; how (ring, tree) is what ``viz.draw_algorithm`` shows.

What to colour, and how to link the two sides, is each collective's drawing, kept in this
module's own table keyed by the row (:data:`DRAWINGS`), as its math is a column of the row
itself (``simpmd.core.collectives``): the row is the same whether or not viz is imported.
"""
from __future__ import annotations

from collections.abc import Sequence

import textwrap
from dataclasses import dataclass
from typing import Callable

import numpy as np
from matplotlib.collections import LineCollection
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch, Rectangle

from ..core import collectives as K
from ..api import unreduced_ops as U
from ..api.text import needs_values
from .canvas import (INK, MIN_FONT, SUM, ZERO, device_color, dtype_shape, face_color,
                     elide, figure_and_axes, new_figure, number, tag)


# -- where each element of a value came from (or goes to) -------------------------------
# A *source map* has the shape of the value; each entry is a member index of the group, or
# SUM (a combination of every member), or ZERO (nobody sent anything here). Each function
# gets the event, its value, and the whole group's inputs in member order (pmax reads them).

def _own(e, x, group=None):
    return np.full(np.shape(x), e.member, dtype=int)


def _summed(e, x, group=None):
    return np.full(np.shape(x), SUM, dtype=int)


def _winner(e, x, group=None):
    """pmax/pmin: the member whose input supplied each element (the lowest on a tie)."""
    try:
        ins = np.stack([np.broadcast_to(np.asarray(v), np.shape(x)) for v in group])
    except (TypeError, ValueError):
        return _summed(e, x)
    hit = ins == np.asarray(x)[None]
    return np.where(hit.any(axis=0), np.argmax(hit, axis=0),
                    SUM).astype(int).reshape(np.shape(x))


def _blocks(shape, axis, p, tiled):
    """Block index along ``axis`` for every element: the member it belongs to."""
    if not shape:
        return np.zeros((), dtype=int)
    axis = axis % len(shape)
    index = np.arange(shape[axis])
    if tiled:
        index = index // max(shape[axis] // p, 1)
    view = [1] * len(shape)
    view[axis] = shape[axis]
    return np.broadcast_to(index.reshape(view), shape)


def _gathered(e, x, group=None):
    return _blocks(np.shape(x), e.params.get("axis", 0), len(e.group), e.params.get("tiled", False))


def _scattered_by_destination(e, x, group=None):
    return _blocks(np.shape(x), e.params.get("scatter_dimension", 0), len(e.group),
                   e.params.get("tiled", False))


def _split_blocks(e, x, group=None):
    axis = e.params.get("split_axis", e.params.get("axis", 0))
    return _blocks(np.shape(x), axis, len(e.group), e.params.get("tiled", False))


def _joined_by_source(e, x, group=None):
    axis = e.params.get("concat_axis", e.params.get("axis", 0))
    return _blocks(np.shape(x), axis, len(e.group), e.params.get("tiled", False))


def _permuted(e, x, group=None):
    senders = {int(d): int(s) for s, d in e.params.get("perm", ())}
    return np.full(np.shape(x), senders.get(e.member, ZERO), dtype=int)


@dataclass(frozen=True)
class Picture:
    """How to draw one collective.

    ``before``/``after`` give source maps (see above); ``split`` optionally marks block
    boundaries in the before value; ``link`` is ``'group'`` (the members of each group
    exchange among themselves: a band joins them) or ``'pairs'`` (one arrow per sender
    and receiver); ``symbol`` names the operation in the band; ``caption`` says what the
    colours mean (``{who}`` becomes "device" or "member of its group").
    """

    before: Callable
    after: Callable
    link: str
    symbol: str
    caption: str
    split: Callable | None = None
    words: tuple = ("from", "from")     # how a block's label names its member, before/after


_REDUCE = "colour = {who}; grey, hatched = combined from the whole group"
_BLOCKS = "colour = the {who} a block came from: block i of {who} j goes to {who} i"
# The drawing of each collective, keyed by its row (here, where drawings live).
DRAWINGS: dict = {}
DRAWINGS[K.psum] = Picture(_own, _summed, "group", "sum", "everyone's values are added; " + _REDUCE)
DRAWINGS[K.pmean] = Picture(_own, _summed, "group", "mean",
                            "everyone's values are averaged; " + _REDUCE)
DRAWINGS[K.pmax] = Picture(_own, _winner, "group", "max",
                           "elementwise maximum; colour = the {who} whose value won")
DRAWINGS[K.pmin] = Picture(_own, _winner, "group", "min",
                           "elementwise minimum; colour = the {who} whose value won")
DRAWINGS[K.all_gather] = Picture(
    _own, _gathered, "group", "gather",
    "colour = the {who} a block came from: everyone ends with every block")
DRAWINGS[K.reduce_scatter] = Picture(
    _scattered_by_destination, _own, "group", "sum + split",
    "colour = the {who} a block is summed onto: block i of every device is added and lands "
    "on {who} i", words=("to", "from"))
DRAWINGS[U.unreduced_psum] = DRAWINGS[K.psum]             # the same sum, of partial sums
DRAWINGS[U.all_gather_invariant] = DRAWINGS[K.all_gather]  # the same gather, typed invariant
DRAWINGS[K.all_to_all] = Picture(_own, _joined_by_source, "group", "all-to-all",
                                 _BLOCKS + " (a transpose)", split=_split_blocks)
DRAWINGS[K.ppermute] = Picture(_own, _permuted, "pairs", "",
                               "colour = the {who} the value came from; white = nobody sent "
                               "(zeros)")


def drawing_of(op):
    """The drawing of the collective whose lax name is ``op`` (its row's, in :data:`DRAWINGS`)."""
    return DRAWINGS.get(K.COLLECTIVES.get(op), _DEFAULT)


_DEFAULT = Picture(_own, _own, "group", "?", "colour = {who}")


# -- choosing what to draw ----------------------------------------------------------------

def _call_events(trace, call):
    """The events of one collective call: from an index, an op name, or the events given."""
    if isinstance(trace, Sequence):                  # a call's or a group's events
        events = list(trace)
    elif isinstance(call, (list, tuple)):
        events = list(call)
    else:
        calls = trace.calls()
        if not calls:
            raise ValueError("this trace has no collectives to draw; its program ran without "
                             "calling psum, all_gather or any other collective")
        if isinstance(call, str):
            found = [c for c in calls if c[0].op == call]
            if not found:
                ops = sorted({c[0].op for c in calls})
                raise ValueError(f"no {call!r} in this trace; its collectives are {ops}")
            events = found[0]
        else:
            if not -len(calls) <= call < len(calls):
                raise IndexError(f"call={call}, but the trace has {len(calls)} collective "
                                 f"call(s): use 0 to {len(calls) - 1}")
            events = calls[call]
    events = [e for e in events if e.kind == "collective"]
    if not events:
        raise ValueError("no collective events to draw")
    return events


def _order(events):
    """Rows grouped by instance (group), groups by their first device, members in order."""
    by_step: dict = {}
    for e in events:
        by_step.setdefault(e.step, []).append(e)
    groups = [sorted(g, key=lambda e: e.member) for g in by_step.values()]
    groups.sort(key=lambda g: min(_row_key(e) for e in g))
    return groups


def _row_key(e):
    return (e.device if e.device is not None else (min(e.devices) if e.devices else 0), e.program)


def _row_label(e):
    if e.device is not None:
        return f"device {e.device}"
    ids = list(e.devices)
    span = (f"{ids[0]}-{ids[-1]}" if ids == list(range(ids[0], ids[-1] + 1)) else
            ",".join(map(str, ids))) if ids else ""
    return f"{e.program} [{span}]"


# -- a value as a grid of cells ---------------------------------------------------------------

MAX_SHOWN_ROWS, MAX_SHOWN_COLS = 128, 512   # larger values are drawn from evenly spaced samples
CELL_IN = 0.55        # a cell is at most this wide (inches) ...
CELL_H_IN = 0.27      # ... and this tall; a 2-D value's rows share at most ROW_CAP_IN
ROW_CAP_IN = 1.0
BOX_IN = 4.2          # the widest value in a call is at most this wide
LABEL_IN, GAP_IN, RIGHT_IN = 1.1, 1.6, 0.7
HEADER_IN = 1.0       # title, caption and column headings
ROW_PAD_IN, GROUP_GAP_IN = 0.11, 0.14
MIN_WIDTH_IN = 5.5     # room for the title and a wrapped caption
SUM_HATCH = "////"


def _grid(shape):
    """Rows x columns a value of ``shape`` is drawn as: a scalar is one cell, a vector one
    row, a matrix as it prints, a higher rank with its leading dimensions stacked as rows."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, int(shape[0])
    return int(np.prod(shape[:-1])), int(shape[-1])


def _sample(n, most):
    m = min(n, most)
    return (np.arange(m) * n) // m if m else np.arange(0)


@dataclass
class _Scale:
    """One call's cell size (inches), shared by every value before and after: to scale."""

    cw: float
    ch: float
    rows: int
    cols: int
    fs: float | None          # largest font size for numbers, or None: too many to print


def _scale_for(values, max_numbers):
    shapes = [_grid(np.shape(v)) for v in values] or [(1, 1)]
    rows = max(r for r, _ in shapes)
    cols = max(max(c for _, c in shapes), 1)
    cw = min(CELL_IN, BOX_IN / cols)
    ch = CELL_H_IN if rows == 1 else max(min(CELL_H_IN, ROW_CAP_IN / rows), 0.01)
    if rows > 1:                       # keep a grid's cells near square
        cw = min(cw, max(2.5 * ch, 0.3))
    small = all(np.size(v) <= max_numbers and np.asarray(v).dtype.kind in "biufc" for v in values)
    return _Scale(cw, ch, rows, cols, 9.0 if small and values else None)


def _number_size(texts, scale):
    """The font size at which the longest of ``texts`` fits a cell, or None below 7 pt."""
    if scale.fs is None or not texts:
        return None
    longest = max(len(t) for t in texts)
    size = min(scale.fs, scale.ch * 72 / 1.2, scale.cw * 72 / (0.63 * longest + 0.3))
    return size if size >= MIN_FONT else None


def _faces(src, p):
    """An RGB image of a source map."""
    out = np.empty(src.shape + (3,))
    for k in np.unique(src):
        out[src == k] = face_color(int(k), p)
    return out


def _boundaries(b, x0, ytop, w, h):
    """Line segments between neighbouring cells of different blocks (in sampled space)."""
    r, c = b.shape
    cx, cy = w / c, h / r
    segments = []
    for k in range(1, c):
        for i in np.flatnonzero(b[:, k] != b[:, k - 1]):
            segments.append([(x0 + k * cx, ytop - i * cy), (x0 + k * cx, ytop - (i + 1) * cy)])
    for i in range(1, r):
        for k in np.flatnonzero(b[i] != b[i - 1]):
            segments.append([(x0 + k * cx, ytop - i * cy), (x0 + (k + 1) * cx, ytop - i * cy)])
    return segments


def _draw_value(ax, x0, ytop, value, sources, split, p, scale, member, word="from"):
    """One value with its top-left corner at ``(x0, ytop)``; returns its width and height."""
    a = np.asarray(value)
    r, c = _grid(a.shape)
    w, h = c * scale.cw, r * scale.ch
    if a.size == 0:
        ax.text(x0, ytop - scale.ch / 2, "(empty)", ha="left", va="center", fontsize=MIN_FONT,
                color=INK)
        return 0.0, scale.ch
    src = np.broadcast_to(sources, a.shape).reshape(r, c)
    blocks = src if split is None else np.broadcast_to(split, a.shape).reshape(r, c)
    ri, ci = _sample(r, MAX_SHOWN_ROWS), _sample(c, MAX_SHOWN_COLS)
    s, b = src[np.ix_(ri, ci)], blocks[np.ix_(ri, ci)]
    ax.imshow(_faces(s, p), extent=(x0, x0 + w, ytop - h, ytop), interpolation="nearest",
              aspect="auto", zorder=1)
    sx, sy = w / s.shape[1], h / s.shape[0]
    for i in range(s.shape[0]):                       # hatch what every member combined
        runs = np.flatnonzero(np.diff(np.r_[0, (s[i] == SUM).astype(int), 0]))
        for k0, k1 in zip(runs[::2], runs[1::2]):
            ax.add_patch(Rectangle((x0 + k0 * sx, ytop - (i + 1) * sy), (k1 - k0) * sx, sy,
                                   fill=False, hatch=SUM_HATCH, edgecolor=(0.7, 0.7, 0.7),
                                   linewidth=0, zorder=1.5))
    full = len(ri) == r and len(ci) == c
    if full and scale.cw >= 0.07 and scale.ch >= 0.07:        # thin white lines between cells
        lines = [[(x0 + k * sx, ytop), (x0 + k * sx, ytop - h)] for k in range(1, c)]
        lines += [[(x0, ytop - i * sy), (x0 + w, ytop - i * sy)] for i in range(1, r)]
        ax.add_collection(LineCollection(lines, colors="white", linewidths=0.7, zorder=2))
    ax.add_collection(LineCollection(_boundaries(b, x0, ytop, w, h), colors=INK,
                                     linewidths=1.3, zorder=3))
    words = [number(v) for v in a.ravel()] if scale.fs is not None else []
    fs = _number_size(words, scale)
    if fs is not None:
        for k, word in enumerate(words):
            i, j = divmod(k, c)
            ax.text(x0 + (j + 0.5) * sx, ytop - (i + 0.5) * sy, word, ha="center", va="center",
                    fontsize=fs, color=INK, zorder=4)
    else:
        _label_blocks(ax, s, x0, ytop, sx, sy, member, word)
    return w, h


def _label_blocks(ax, s, x0, ytop, sx, sy, member, word):
    """Without numbers, write in each rectangular block the member its data came from
    (or goes to: ``word``), where colour alone would have to say it."""
    kinds = [int(k) for k in np.unique(s) if k >= 0]
    if kinds == [member]:
        return
    for k in kinds:
        rows, cols = np.nonzero(s == k)
        i0, i1, k0, k1 = rows.min(), rows.max() + 1, cols.min(), cols.max() + 1
        if not (s[i0:i1, k0:k1] == k).all():
            continue
        bw, bh = (k1 - k0) * sx, (i1 - i0) * sy
        if bh * 72 < MIN_FONT * 1.3:
            continue
        text = f"{word} {k}" if bw * 72 >= 0.6 * MIN_FONT * 7 else str(k)
        if bw * 72 < 0.6 * MIN_FONT * len(text) + 2:
            continue
        ax.text(x0 + (k0 + k1) / 2 * sx, ytop - (i0 + i1) / 2 * sy, text, ha="center",
                va="center", fontsize=MIN_FONT, color=INK, zorder=4,
                bbox=dict(boxstyle="round,pad=0.1", facecolor="white", edgecolor="none",
                          alpha=0.75))


# -- one call ---------------------------------------------------------------------------------

MAX_ROWS = 16          # more rows than this: the middle ones are elided, with a note


def _plan(events, leaf, max_numbers, max_rows):
    """Where everything goes, in inches, before anything is drawn."""
    groups = _order(events)
    first = groups[0][0]
    n_leaves = max(len(first.inputs), len(first.outputs))
    if not 0 <= leaf < max(n_leaves, 1):
        raise IndexError(f"leaf={leaf}, but this collective moved {n_leaves} leaf/leaves")
    ordered = [e for g in groups for e in g]
    shown, elided = elide(ordered, max_rows)
    values = [v[leaf] for e in ordered for v in (e.inputs, e.outputs) if len(v) > leaf]
    scale = _scale_for(values, max_numbers)
    row_h = scale.rows * scale.ch + ROW_PAD_IN
    group_of = {id(e): gi for gi, g in enumerate(groups) for e in g}
    tops, y, previous = [], -HEADER_IN, None
    for e in shown:
        g = group_of[id(e)] if e is not None else previous
        if previous is not None and g != previous:
            y -= GROUP_GAP_IN
        tops.append(y)
        y -= row_h if e is not None else max(0.32, MIN_FONT * 2.2 / 72)
        previous = g
    def widest(side):
        return max([_grid(np.shape(getattr(e, side)[leaf]))[1] for e in ordered
                    if len(getattr(e, side)) > leaf] or [1]) * scale.cw

    def heading(side, word):      # the column heading's width, so that nothing covers it
        value = next((getattr(e, side)[leaf] for e in ordered if len(getattr(e, side)) > leaf), None)
        return len(f"{word}: {dtype_shape(value)} on each") * 9 * 0.6 / 72 if value is not None else 0

    box = max(widest("inputs"), heading("inputs", "before") - 0.2)
    x_before = LABEL_IN + 0.1
    x_after = x_before + box + GAP_IN
    width = max(x_after + widest("outputs") + RIGHT_IN, x_after + heading("outputs", "after") + 0.2,
                MIN_WIDTH_IN)
    return dict(groups=groups, first=first, shown=shown, elided=elided, scale=scale,
                tops=tops, row_h=row_h, x_before=x_before, x_after=x_after, box=box,
                width=width, height=-y + 0.15, n_leaves=n_leaves, group_of=group_of)


def _draw_call(ax, plan, *, leaf, title, index=None):
    groups, first = plan["groups"], plan["first"]
    picture = drawing_of(first.op)
    p = len(first.group)
    fs = float(np.clip(plan["row_h"] * 26, MIN_FONT + 0.5, 9.0))
    idle = _idle_members(first) if picture.link == "pairs" else set()
    centre, extent = {}, {}
    for e, top in zip(plan["shown"], plan["tops"]):
        if e is not None:
            _draw_member(ax, plan, e, top, leaf, picture, p, idle, fs, centre, extent)
    gap_y = {}
    for e, top in zip(plan["shown"], plan["tops"]):
        if e is None:
            note = _elision_note(plan["elided"])
            t = ax.text(plan["x_before"], top - 0.16, note, ha="left", va="center",
                        fontsize=MIN_FONT + 1, color=INK, style="italic")
            tag(t, "elided", len(plan["elided"]))
            for m in plan["elided"]:
                gap_y[(m.step, m.member)] = top - 0.16
    if picture.link == "pairs":
        _draw_pairs(ax, groups, centre, gap_y, extent, p, plan["x_before"] + plan["box"],
                    plan["x_after"], fs)
    else:
        _draw_groups(ax, plan, centre, extent, picture.symbol, fs)
    _call_words(ax, plan, leaf, picture, title, index, idle, p)
    ax.set_xlim(0, plan["width"])
    ax.set_ylim(-plan["height"], 0)
    ax.set_axis_off()


def _draw_member(ax, plan, e, top, leaf, picture, p, idle, fs, centre, extent):
    """One member's row: its value before and after (boxed, grey when idle), labelled."""
    cy = top - min(plan["row_h"] - ROW_PAD_IN, 2 * CELL_H_IN) / 2
    centre[(e.step, e.member)] = cy
    grey = e.member in idle
    group_inputs = [m.inputs[leaf] for m in _members(plan["groups"], e) if len(m.inputs) > leaf]
    for side, x0, vals, fn in (("before", plan["x_before"], e.inputs, picture.before),
                               ("after", plan["x_after"], e.outputs, picture.after)):
        if len(vals) <= leaf:
            continue
        value = vals[leaf]
        split = picture.split(e, value) if (side == "before" and picture.split) else None
        w, h = _draw_value(ax, x0, top, value, fn(e, value, group_inputs), split,
                           p, plan["scale"], e.member, picture.words[side == "after"])
        box = Rectangle((x0, top - h), w, h, fill=grey, facecolor=(0.85, 0.85, 0.85, 0.7),
                        edgecolor=INK, linewidth=0.9, zorder=5)
        tag(box, side, e.program)
        ax.add_patch(box)
        extent[(side, e.step, e.member)] = (x0 + w, top - min(h, 2 * CELL_H_IN) / 2)
    label_y = extent.get(("before", e.step, e.member), (0, cy))[1]
    ax.text(plan["x_before"] - 0.12, label_y, _row_label(e) + ("\n(idle)" if grey else ""),
            ha="right", va="center", fontsize=fs, color=(0.55, 0.55, 0.55) if grey else INK)


def _call_words(ax, plan, leaf, picture, title, index, idle, p):
    """The call's title, its caption, and the 'before' and 'after' headings."""
    groups, first = plan["groups"], plan["first"]
    axes = first.axes[0] if len(first.axes) == 1 else tuple(first.axes)
    params = ", ".join(f"{k}={v}" for k, v in first.params.items() if v not in (False, None)
                       and k not in ("perm", "axis_index_groups", "inserted"))
    if title is None:
        what = f"{first.op}({axes!r}{', ' + params if params else ''})"
        if first.params.get("inserted"):                          # what jit inserted it for
            what += f" inserted by {first.params['inserted']}"
        if getattr(first, "phase", "forward") == "backward":      # simpmd.grad's backward pass
            what = "backward pass: " + what
        title = (f"{'call ' + str(index) + ': ' if index is not None else ''}{what}: "
                 f"{len(groups)} group{'s' if len(groups) > 1 else ''} of {p}")
        if plan["n_leaves"] > 1:
            title += f"   (leaf {leaf} of {plan['n_leaves']})"
    who = "member of its group" if len(groups) > 1 else "device"
    caption = picture.caption.format(who=who)
    if idle:
        caption += "; grey rows are idle (they neither send nor receive)"
    if len(groups) > 1:
        caption += f" (member k of every group has colour k; the groups are {_groups_text(groups)})"
    chars = int(plan["width"] * 72 / (8.5 * 0.62))
    ax.text(0.12, -0.08, "\n".join(textwrap.wrap(title, chars - 8)), ha="left", va="top",
            fontsize=10.5, color=INK, fontweight="bold")
    ax.text(0.12, -0.42, "\n".join(textwrap.wrap(caption, chars)), ha="left", va="top",
            fontsize=8.5, color=INK)
    for x0, side, word in ((plan["x_before"], "inputs", "before"),
                           (plan["x_after"], "outputs", "after")):
        vals = [getattr(e, side)[leaf] for e in plan["shown"] if e is not None
                and len(getattr(e, side)) > leaf]
        shape = dtype_shape(vals[0]) if vals else "nothing"
        ax.text(x0, -HEADER_IN + 0.05, f"{word}: {shape} on each", ha="left", va="bottom",
                fontsize=9, color=INK)


def _members(groups, e):
    return next((g for g in groups if any(m is e for m in g)), [e])


def _groups_text(groups):
    parts = []
    for g in groups[:4]:
        parts.append("{" + ", ".join(str(d) for d in g[0].group) + "}")
    return ", ".join(parts) + (f" and {len(groups) - 4} more" if len(groups) > 4 else "")


def _elision_note(elided):
    names = f"{_row_label(elided[0])} to {_row_label(elided[-1])}"
    return f"⋮  {len(elided)} rows not drawn\n    ({names}): the same pattern"


def _idle_members(e):
    """Members of a ppermute that neither send nor receive."""
    busy = {int(v) for pair in _pairs_of(e) for v in pair}
    return {k for k in range(len(e.group)) if k not in busy}


def _draw_pairs(ax, groups, centre, gap_y, extent, p, x_from, x_to, fs):
    """One arrow per (source, destination) pair; thin lines when there are many. An end
    in the elided middle points at the note that stands for it."""
    pairs = [(g[0].step, int(s), int(d)) for g in groups for s, d in _pairs_of(g[0])]
    many = len(pairs) > 32
    for step, s, d in pairs:
        y0 = centre.get((step, s), gap_y.get((step, s)))
        y1 = centre.get((step, d), gap_y.get((step, d)))
        if y0 is None or y1 is None or ((step, s) not in centre and (step, d) not in centre):
            continue
        start, y0 = extent.get(("before", step, s), (x_from, y0))
        y1 = extent.get(("after", step, d), (0, y1))[1]
        arrow = FancyArrowPatch((start + 0.06, y0), (x_to - 0.06, y1),
                                arrowstyle="-" if many else "-|>", mutation_scale=10,
                                color=device_color(s, p), lw=0.8 if many else 1.5,
                                shrinkA=0, shrinkB=0, zorder=6)
        tag(arrow, "link", f"{step}:{s}->{d}")
        ax.add_patch(arrow)


def _pairs_of(e):
    return list(e.params.get("perm", ()))


def _draw_groups(ax, plan, centre, extent, symbol, fs):
    """Each group as a band between the columns, spanning its members: they exchange data
    among themselves (no central node: the real algorithms are rings and trees). Each
    member's row enters the band and leaves it for the same device's result."""
    x0 = plan["x_before"] + plan["box"] + 0.3
    x1 = plan["x_after"] - 0.3
    for gi, g in enumerate(plan["groups"]):
        ys = [centre[(e.step, e.member)] for e in g if (e.step, e.member) in centre]
        if not ys:
            continue
        half = plan["row_h"] / 2 - 0.03
        top, bottom = max(ys) + half, min(ys) - half
        band = FancyBboxPatch((x0, bottom), x1 - x0, top - bottom,
                              boxstyle="round,pad=0,rounding_size=0.08", facecolor=(0.95, 0.95, 0.95),
                              edgecolor=(0.55, 0.55, 0.55), linewidth=0.9, zorder=2)
        tag(band, "group", g[0].step)
        ax.add_patch(band)
        n = f"{len(g)} {'devices' if g[0].device is not None else 'programs'}"
        label = f"{symbol}\n{'group ' + str(gi) + chr(10) if len(plan['groups']) > 1 else ''}{n}"
        if top - bottom < 0.4:
            label = label.replace("\n", " ")
        ax.text((x0 + x1) / 2, (top + bottom) / 2, label, ha="center", va="center",
                fontsize=MIN_FONT + 1, color=INK, zorder=7,
                bbox=dict(boxstyle="round,pad=0.15", facecolor=(0.95, 0.95, 0.95), edgecolor="none"))
        for e in g:
            if (e.step, e.member) not in centre:
                continue
            y = centre[(e.step, e.member)]
            start = extent.get(("before", e.step, e.member), (x0 - 0.3, y))[0]
            y_in = extent.get(("before", e.step, e.member), (0, y))[1]
            y_out = extent.get(("after", e.step, e.member), (0, y))[1]
            ax.plot([start + 0.05, x0], [y_in, y_in], color=device_color(e.member, len(e.group)),
                    lw=1.4, solid_capstyle="butt", zorder=3)
            ax.annotate("", xy=(plan["x_after"] - 0.05, y_out), xytext=(x1, y_out),
                        arrowprops=dict(arrowstyle="-|>", color=(0.4, 0.4, 0.4), lw=1.0,
                                        shrinkA=0, shrinkB=0, mutation_scale=9), zorder=3)


# -- public ---------------------------------------------------------------------------------

def draw_collective(trace, call=0, *, leaf: int = 0, max_numbers: int = 64, max_rows: int = MAX_ROWS,
                    title=None, ax=None):
    """Draw one collective call, before and after, one row per device; return the Figure.

    ``trace`` is a :class:`simpmd.Trace` (then ``call`` picks the call: its index in
    ``trace.calls()``, negative from the end, or an op name such as ``'all_gather'`` for
    the first one) or a list of the events of one call or one group. Values are drawn to
    scale as grids of cells coloured by source; values of at most ``max_numbers``
    elements carry their numbers when those fit. More than ``max_rows`` rows: the middle
    ones are elided, with a note. ``leaf`` picks the leaf of a pytree argument. Device
    boxes are tagged ``simpmd:before:<program>`` and ``simpmd:after:<program>``, the
    groups' bands ``simpmd:group:<step>``.
    """
    needs_values(trace, "draw_collective")
    events = _call_events(trace, call)
    index = None
    if not isinstance(trace, Sequence) and isinstance(call, int):
        index = call % len(trace.calls())
    plan = _plan(events, leaf, max_numbers, max_rows)
    fig, ax = figure_and_axes(ax, plan["width"], plan["height"])
    _draw_call(ax, plan, leaf=leaf, title=title, index=index)
    return fig


def draw_trace(trace, *, leaf: int = 0, max_numbers: int = 64, max_rows: int = MAX_ROWS,
               max_calls: int = 12, ncols: int | None = None):
    """Draw every collective call of a run, one panel per call, in reading order; return the Figure.

    The first ``max_calls`` calls are drawn (a note says how many were left out); each
    panel is :func:`draw_collective` of that call. Narrow panels sit ``ncols`` to a row
    (by default as many as fit in about 16 inches), so that a run of small calls is not
    one tall column.
    """
    needs_values(trace, "draw_trace")
    calls = trace.calls()
    if not calls:
        raise ValueError("this trace has no collectives to draw; its program ran without "
                         "calling psum, all_gather or any other collective")
    shown = calls[:max_calls]
    leaves = [min(leaf, len(c[0].inputs) - 1) if c[0].inputs else 0 for c in shown]
    plans = [_plan([e for e in c if e.kind == "collective"], k, max_numbers, max_rows)
             for c, k in zip(shown, leaves)]
    slot = max(pl["width"] for pl in plans)
    if ncols is None:
        ncols = max(1, int(16.5 // slot))
    ncols = max(1, min(ncols, len(plans)))
    rows = [plans[k:k + ncols] for k in range(0, len(plans), ncols)]
    heights = [max(pl["height"] for pl in row) for row in rows]
    note = 0.3 if len(calls) > len(shown) else 0.0
    width = slot * ncols
    total = sum(heights) + note + 0.1
    fig = new_figure(width, total)
    top = total - 0.05
    for r, (row, h_row) in enumerate(zip(rows, heights)):
        for c, pl in enumerate(row):
            k = r * ncols + c
            h = pl["height"]
            ax = fig.add_axes((c * slot / width, (top - h) / total, pl["width"] / width, h / total))
            _draw_call(ax, pl, leaf=leaves[k], title=None, index=k)
        top -= h_row
    if note:
        fig.text(0.01, 0.1 / total, f"... {len(calls) - len(shown)} more call(s); "
                 f"draw_collective(trace, call=k) draws any one", fontsize=8, color=INK)
    return fig
