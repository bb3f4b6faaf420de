"""Collectives, before and after: what every device held, what it ends with, where it came from.

Each device is a row: its value before the collective on the left, after it on the right.
Small arrays show their numbers; larger ones a heat strip (values as colours) over a thin
band that says where each part came from. Colours name devices (member ``k`` of a group
always has the same colour), so an all-gather's result shows every colour in order, and
an all-to-all turns one-coloured rows into rainbows: a transpose.

What to colour, and how to link the two sides, is one row per collective in
:data:`DRAWING`, as the math is one row of ``simpmd.collectives.MATH``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.patches import FancyArrowPatch, Rectangle

from .canvas import (INK, SUM, ZERO, device_color, dtype_shape, figure_and_axes, font_size,
                     new_figure, number, tag, tint)


# -- where each element of a value came from (or goes to) -------------------------------
# A *source map* has the shape of the value; each entry is a member index of the group, or
# SUM (a combination of every member), or ZERO (nobody sent anything here).

def _own(e, x):
    return np.full(np.shape(x), e.member, dtype=int)


def _summed(e, x):
    return np.full(np.shape(x), SUM, dtype=int)


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


def _gathered(e, x):
    return _blocks(np.shape(x), e.params.get("axis", 0), len(e.group), e.params.get("tiled", False))


def _scattered_by_destination(e, x):
    return _blocks(np.shape(x), e.params.get("scatter_dimension", 0), len(e.group),
                   e.params.get("tiled", False))


def _split_blocks(e, x):
    axis = e.params.get("split_axis", e.params.get("axis", 0))
    return _blocks(np.shape(x), axis, len(e.group), e.params.get("tiled", False))


def _joined_by_source(e, x):
    axis = e.params.get("concat_axis", e.params.get("axis", 0))
    return _blocks(np.shape(x), axis, len(e.group), e.params.get("tiled", False))


def _permuted(e, x):
    senders = {int(d): int(s) for s, d in e.params.get("perm", ())}
    return np.full(np.shape(x), senders.get(e.member, ZERO), dtype=int)


def _shuffled(e, x):
    return np.full(np.shape(x), int(e.params["perm"][e.member]), dtype=int)


@dataclass(frozen=True)
class Picture:
    """How to draw one collective.

    ``before``/``after`` give source maps (see above); ``split`` optionally marks block
    boundaries in the before value; ``link`` is ``'hub'`` (every member's value meets at a
    node: reductions and gathers) or ``'pairs'`` (one arrow per sender and receiver);
    ``symbol`` labels the hub; ``caption`` says what the colours mean.
    """

    before: Callable
    after: Callable
    link: str
    symbol: str
    caption: str
    split: Callable | None = None


_REDUCE = "colour = device; grey = combined from every device of the group"
DRAWING = {
    "psum": Picture(_own, _summed, "hub", "Σ", "everyone's values are added; " + _REDUCE),
    "pmean": Picture(_own, _summed, "hub", "mean", "everyone's values are averaged; " + _REDUCE),
    "pmax": Picture(_own, _summed, "hub", "max", "elementwise maximum; " + _REDUCE),
    "pmin": Picture(_own, _summed, "hub", "min", "elementwise minimum; " + _REDUCE),
    "all_gather": Picture(_own, _gathered, "hub", "gather",
                          "colour = device the block came from: everyone ends with every block"),
    "psum_scatter": Picture(_scattered_by_destination, _own, "hub", "Σ split",
                            "colour = device a block is summed onto: block i of every device "
                            "is added and lands on device i"),
    "all_to_all": Picture(_own, _joined_by_source, "hub", "a2a",
                          "colour = device the block came from: block i of device j goes to "
                          "device i (a transpose)", split=_split_blocks),
    "pswapaxes": Picture(_own, _joined_by_source, "hub", "swap",
                         "colour = device the block came from: block i of device j goes to "
                         "device i", split=_split_blocks),
    "ppermute": Picture(_own, _permuted, "pairs", "",
                        "colour = device the value came from; white = nobody sent (zeros)"),
    "pshuffle": Picture(_own, _shuffled, "pairs", "", "colour = device the value came from"),
}
_DEFAULT = Picture(_own, _own, "hub", "?", "colour = device")


# -- choosing what to draw ----------------------------------------------------------------

def _call_events(trace, call):
    """The events of one collective call: from an index, an op name, or the events given."""
    if isinstance(trace, (list, tuple)):
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


# -- the values in one box ------------------------------------------------------------------

STRIP_COLUMNS = 256    # a heat strip shows at most this many columns (evenly spaced samples)
HEAT = "viridis"


def _as_real(a):
    a = np.asarray(a)
    if a.dtype.kind == "c":
        return np.abs(a)
    if a.dtype.kind in "biuf":
        return a.astype(float)
    return np.zeros(a.shape)


def _column_norm(arrays):
    finite = [v[np.isfinite(v)] for v in (_as_real(a).ravel() for a in arrays) if v.size]
    finite = [v for v in finite if v.size]
    if not finite:
        return Normalize(0, 1)
    lo = min(float(v.min()) for v in finite)
    hi = max(float(v.max()) for v in finite)
    if hi <= lo:
        lo, hi = lo - 1, hi + 1
    return Normalize(lo, hi)


def _draw_value(ax, x, y, w, h, value, sources, split, p, norm, max_numbers, fs):
    """One value in the box ``[x, x+w] x [y, y+h]``: numbers, or a heat strip and a band."""
    a = np.asarray(value)
    src = np.broadcast_to(sources, a.shape).ravel()
    blocks = src if split is None else np.broadcast_to(split, a.shape).ravel()
    n = a.size
    if n == 0:
        ax.text(x + w / 2, y + h / 2, "(empty)", ha="center", va="center", fontsize=fs, color=INK)
        return
    if n <= max_numbers:
        cw = w / n
        for k in range(n):
            s = int(src[k])
            face = (1, 1, 1) if s == ZERO else tint(device_color(s, p), 0.45 if s != SUM else 0.55)
            ax.add_patch(Rectangle((x + k * cw, y), cw, h, facecolor=face, edgecolor="white",
                                   linewidth=0.6))
            ax.text(x + (k + 0.5) * cw, y + h / 2, number(a.flat[k]), ha="center", va="center",
                    fontsize=fs, color=INK)
        for k in range(1, n):
            if blocks[k] != blocks[k - 1]:
                ax.plot([x + k * cw] * 2, [y, y + h], color=INK, lw=1.0)
        return
    m = min(n, STRIP_COLUMNS)
    pick = (np.arange(m) * n) // m
    heat = _as_real(a).ravel()[pick][None, :]
    shown = src[pick]
    palette = {int(s): device_color(int(s), p) for s in np.unique(shown)}
    band = np.array([[palette[int(s)] for s in shown]])
    ax.imshow(heat, extent=(x, x + w, y + 0.3 * h, y + h), cmap=HEAT, norm=norm, aspect="auto",
              interpolation="nearest")
    ax.imshow(band, extent=(x, x + w, y, y + 0.26 * h), aspect="auto", interpolation="nearest")


# -- one call in one Axes ---------------------------------------------------------------------

LABEL_W, BOX_W, GAP_W, RIGHT_W = 2.6, 6.0, 2.8, 1.6
HEADER_INCHES = 1.0    # title, caption and column headings, whatever the row height
GROUP_GAP = 0.35
BOX_H = 0.78
MANY = 24              # more rows than this: links are summarised


def _call_units(events, row_in):
    groups = _order(events)
    rows = sum(len(g) for g in groups)
    return HEADER_INCHES / row_in + rows + GROUP_GAP * (len(groups) - 1) + 0.3


def _row_inches(rows):
    return 0.42 if rows <= 16 else max(0.11, 7.5 / rows)


def _draw_call(ax, events, *, leaf, max_numbers, row_in, title, index=None):
    groups = _order(events)
    first = groups[0][0]
    picture = DRAWING.get(first.op, _DEFAULT)
    p = len(first.group)
    rows = sum(len(g) for g in groups)
    fs = font_size(row_in)
    n_leaves = max(len(first.inputs), len(first.outputs))
    if not 0 <= leaf < max(n_leaves, 1):
        raise IndexError(f"leaf={leaf}, but this collective moved {n_leaves} leaf/leaves")

    x_before = LABEL_W
    x_after = LABEL_W + BOX_W + GAP_W
    x_hub = LABEL_W + BOX_W + GAP_W / 2
    ins = [e.inputs[leaf] for g in groups for e in g if len(e.inputs) > leaf]
    outs = [e.outputs[leaf] for g in groups for e in g if len(e.outputs) > leaf]
    norm_in, norm_out = _column_norm(ins), _column_norm(outs)

    header = HEADER_INCHES / row_in
    centre = {}             # (step, member) -> row centre y
    y = -header
    for gi, g in enumerate(groups):
        for e in g:
            y_top = y
            yb = y_top - 0.5 - BOX_H / 2
            centre[(e.step, e.member)] = y_top - 0.5
            ax.text(x_before - 0.15, y_top - 0.5, _row_label(e), ha="right", va="center",
                    fontsize=fs, color=INK)
            for side, x0, vals, norm, fn in (("before", x_before, e.inputs, norm_in, picture.before),
                                             ("after", x_after, e.outputs, norm_out, picture.after)):
                box = Rectangle((x0, yb), BOX_W, BOX_H, fill=False, edgecolor=INK, linewidth=0.8,
                                zorder=3)
                tag(box, side, e.program)
                ax.add_patch(box)
                if len(vals) > leaf:
                    split = picture.split(e, vals[leaf]) if (side == "before" and picture.split) else None
                    _draw_value(ax, x0, yb, BOX_W, BOX_H, vals[leaf], fn(e, vals[leaf]), split, p,
                                norm, max_numbers, fs)
            y -= 1
        if len(groups) > 1 and rows <= MANY * 2:
            ys = [centre[(e.step, e.member)] for e in g]
            ax.text(x_after + BOX_W + 0.2, (max(ys) + min(ys)) / 2, f"group {gi}", ha="left",
                    va="center", fontsize=fs * 0.9, color=INK, rotation=90 if len(g) > 2 else 0)
        y -= GROUP_GAP

    if picture.link == "pairs":
        _draw_pairs(ax, groups, centre, p, x_before + BOX_W, x_after, rows, fs)
    else:
        _draw_hubs(ax, groups, centre, p, x_before + BOX_W, x_after, x_hub, rows, picture.symbol, fs)

    # headings
    top = -0.06 / row_in
    axes = first.axes[0] if len(first.axes) == 1 else tuple(first.axes)
    params = ", ".join(f"{k}={v}" for k, v in first.params.items()
                       if v not in (False, None) and k != "perm")
    if title is None:
        what = f"{first.op}({axes!r}{', ' + params if params else ''})"
        if getattr(first, "phase", "forward") == "backward":      # simpmd.grad's backward pass
            what = "backward pass: " + what
        title = (f"{'call ' + str(index) + ': ' if index is not None else ''}{what}: "
                 f"{len(groups)} group{'s' if len(groups) > 1 else ''} of {p}"
                 f"{'   ' + first.source if first.source else ''}")
        if n_leaves > 1:
            title += f"   (leaf {leaf} of {n_leaves})"
    head_fs = 9.0
    ax.text(0.1, top, title, ha="left", va="top", fontsize=head_fs * 1.1, color=INK,
            fontweight="bold")
    ax.text(0.1, top - 0.3 / row_in, picture.caption, ha="left", va="top",
            fontsize=head_fs * 0.9, color=INK)
    for x0, vals, word in ((x_before, ins, "before"), (x_after, outs, "after")):
        shape = dtype_shape(vals[0]) if vals else "nothing"
        ax.text(x0 + BOX_W / 2, -header + 0.04 / row_in, f"{word}: {shape} on each", ha="center",
                va="bottom", fontsize=head_fs, color=INK)
    ax.set_xlim(0, x_after + BOX_W + RIGHT_W)
    ax.set_ylim(y + GROUP_GAP - 0.3, 0)
    ax.set_axis_off()


def _draw_pairs(ax, groups, centre, p, x_from, x_to, rows, fs):
    """One arrow per (source, destination) pair; thin lines when there are many."""
    pairs = [(g[0].step, int(s), int(d)) for g in groups for s, d in _pairs_of(g[0])]
    many = len(pairs) > 32
    for step, s, d in pairs:
        if (step, s) not in centre or (step, d) not in centre:
            continue
        arrow = FancyArrowPatch((x_from + 0.1, centre[(step, s)]), (x_to - 0.1, centre[(step, d)]),
                                arrowstyle="-" if many else "-|>", mutation_scale=max(fs * 1.1, 4),
                                color=device_color(s, p), lw=0.6 if many else 1.4,
                                alpha=0.7 if many else 1.0, shrinkA=0, shrinkB=0)
        tag(arrow, "link", f"{step}:{s}->{d}")
        ax.add_patch(arrow)


def _pairs_of(e):
    if e.op == "pshuffle":
        return [(src, dst) for dst, src in enumerate(e.params.get("perm", ()))]
    return list(e.params.get("perm", ()))


def _draw_hubs(ax, groups, centre, p, x_from, x_to, x_hub, rows, symbol, fs):
    """Each group meets at one node: lines in from every member, out to every member."""
    for g in groups:
        ys = [centre[(e.step, e.member)] for e in g]
        y_hub = (max(ys) + min(ys)) / 2
        if rows <= MANY:
            for e, yy in zip(g, ys):
                ax.plot([x_from + 0.05, x_hub - 0.35], [yy, y_hub], color=device_color(e.member, p),
                        lw=1.2, solid_capstyle="round")
                ax.annotate("", xy=(x_to - 0.05, yy), xytext=(x_hub + 0.35, y_hub),
                            arrowprops=dict(arrowstyle="-|>", color=(0.45, 0.45, 0.45), lw=0.9,
                                            shrinkA=0, shrinkB=0, mutation_scale=max(fs, 5)))
        else:
            for x_bar, x_end in ((x_from + 0.25, x_hub - 0.35), (x_to - 0.25, x_hub + 0.35)):
                ax.plot([x_bar, x_bar], [min(ys), max(ys)], color=INK, lw=1.0)
                ax.plot([x_bar, x_end], [y_hub, y_hub], color=INK, lw=1.0)
        hub = ax.text(x_hub, y_hub, symbol, ha="center", va="center", fontsize=max(fs, 6),
                      color=INK, zorder=4,
                      bbox=dict(boxstyle="round,pad=0.25", facecolor="white", edgecolor=INK, lw=0.9))
        tag(hub, "hub", g[0].step)


# -- public ---------------------------------------------------------------------------------

def draw_collective(trace, call=0, *, leaf: int = 0, max_numbers: int = 8, title=None, ax=None):
    """Draw one collective call, before and after, one row per device; return the Figure.

    ``trace`` is a :class:`simpmd.Trace` (then ``call`` picks the call: its index in
    ``trace.calls()``, negative from the end, or an op name such as ``'all_gather'`` for
    the first one) or a list of the events of one call or one group. Values of at most
    ``max_numbers`` elements are printed; larger ones show as a heat strip (evenly spaced
    samples, at most 256 columns) above a band coloured by where each part came from.
    ``leaf`` picks the leaf of a pytree argument. Device boxes are tagged
    ``simpmd:before:<program>`` and ``simpmd:after:<program>``.
    """
    events = _call_events(trace, call)
    index = None
    if not isinstance(trace, (list, tuple)) and isinstance(call, int):
        index = call % len(trace.calls())
    rows = len(events)
    row_in = _row_inches(rows)
    units = _call_units(events, row_in)
    fig, ax = figure_and_axes(ax, 10.0, units * row_in + 0.2)
    _draw_call(ax, events, leaf=leaf, max_numbers=max_numbers, row_in=row_in, title=title,
               index=index)
    return fig


def draw_trace(trace, *, leaf: int = 0, max_numbers: int = 8, max_calls: int = 12):
    """Draw every collective call of a run, one panel per call, top to bottom; return the Figure.

    The first ``max_calls`` calls are drawn (a note says how many were left out); each
    panel is :func:`draw_collective` of that call.
    """
    calls = trace.calls()
    if not calls:
        raise ValueError("this trace has no collectives to draw; its program ran without "
                         "calling psum, all_gather or any other collective")
    shown = calls[:max_calls]
    row_in = min(_row_inches(len(c)) for c in shown)
    heights = [_call_units(c, row_in) * row_in for c in shown]
    note = 0.3 if len(calls) > len(shown) else 0.0
    total = sum(heights) + note + 0.1
    fig = new_figure(10.0, total)
    top = total - 0.05
    for k, (c, h) in enumerate(zip(shown, heights)):
        ax = fig.add_axes((0.0, (top - h) / total, 1.0, h / total))
        _draw_call(ax, c, leaf=min(leaf, len(c[0].inputs) - 1) if c[0].inputs else 0,
                   max_numbers=max_numbers, row_in=row_in, title=None, index=k)
        top -= h
    if note:
        fig.text(0.01, 0.1 / total, f"... {len(calls) - len(shown)} more call(s); "
                 f"draw_collective(trace, call=k) draws any one", fontsize=8, color=INK)
    return fig
