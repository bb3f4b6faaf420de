"""Where blocks travel: an all_to_all as a sender x receiver matrix, and a chain of ppermutes.

Two views of data movement that the before/after pictures of :mod:`.collectives` leave
implicit:

* :func:`draw_dispatch` draws one ``all_to_all`` call as a matrix: row *s* is what member
  *s* of the group sends, column *d* what member *d* receives, and each cell lists the
  values of that chunk (token ids, say, when the program sends an id array alongside the
  data, as a mixture-of-experts layer does). Padding values (``empty``) are left out, so a
  cell shows only what was really sent, and values a device kept back (``held_back``,
  e.g. tokens dropped for lack of capacity) get a column of their own.
* :func:`draw_permute_steps` draws a run of ``ppermute`` calls (a ring pass, a pipeline)
  as columns: which device's block each device holds before the first call and after each
  one, found by comparing the values with the first call's inputs, with an arrow per
  (source, destination) pair.

Both read a trace alone, as every view does.
"""
from __future__ import annotations

import textwrap

import numpy as np
from matplotlib.patches import FancyArrowPatch, Rectangle

from ..api.text import needs_values
from .canvas import INK, MIN_FONT, ZERO, face_color, figure_and_axes, number, tag
from .collectives import _call_events, _order, _row_label

HELD_BACK_FACE = (0.93, 0.93, 0.93)


def _chunks(value, axis: int, p: int) -> list:
    """``value`` cut into ``p`` equal blocks along ``axis`` (an all_to_all's split)."""
    a = np.asarray(value)
    if a.ndim == 0 or a.shape[axis % a.ndim] % p:
        raise ValueError(f"a value of shape {a.shape} cannot be cut into {p} blocks along "
                         f"axis {axis}")
    return np.split(a, p, axis=axis % a.ndim)


def _listing(values, empty, limit: int, value_text=None) -> tuple:
    """(the text of a chunk's values, how many were shown): padding left out, in order."""
    flat = np.asarray(values).ravel()
    if empty is not None:
        flat = flat[~np.isclose(flat, empty)] if flat.dtype.kind in "fc" else flat[flat != empty]
    words = [(value_text or number)(v) for v in flat[:limit]]
    if len(flat) > limit:
        words.append(f"+{len(flat) - limit}")
    return " ".join(words), len(flat)


def dispatch_matrix(trace, call="all_to_all", *, leaf: int = 0, group: int = 0, empty=None):
    """The values each member sends to each member in one all_to_all call, as a list of
    lists: ``m[s][d]`` is the 1-D array of values member ``s`` sends to member ``d`` (its
    ``d``-th block along ``split_axis``), with ``empty`` padding removed. ``group`` picks
    the group when the call has several (one per row of a 2-D mesh, say)."""
    needs_values(trace, "dispatch_matrix")
    events = _call_events(trace, call)
    if events[0].op not in ("all_to_all", "pswapaxes"):
        raise ValueError(f"call {call!r} is a {events[0].op}, not an all_to_all")
    groups = _order(events)
    if not -len(groups) <= group < len(groups):
        raise IndexError(f"group={group}, but this call has {len(groups)} group(s)")
    members = groups[group]
    p = len(members)
    out = []
    for e in members:
        if leaf >= len(e.inputs):
            raise IndexError(f"leaf={leaf}, but the call moved {len(e.inputs)} leaf(s)")
        axis = e.params.get("split_axis", e.params.get("axis", 0))
        row = []
        for chunk in _chunks(e.inputs[leaf], axis, p):
            flat = chunk.ravel()
            if empty is not None:
                flat = flat[flat != empty] if flat.dtype.kind not in "fc" else flat[~np.isclose(flat, empty)]
            row.append(flat)
        out.append(row)
    return out


def draw_dispatch(trace, call="all_to_all", *, leaf: int = 0, group: int = 0, empty=None,
                  held_back=None, max_values: int = 12, labels=("device", "device"),
                  title=None, value_text=None, totals=False, ax=None):
    """Draw one all_to_all call as a sender x receiver matrix of the values it moves.

    ``call`` picks the call as :func:`draw_collective` does (an index into
    ``trace.calls()`` or an op name, default the first all_to_all); ``leaf`` the leaf of a
    pytree argument; ``group`` the group when there are several. Each cell lists the
    values sender ``s`` puts in block ``d`` (at most ``max_values``, then a count), without
    the ``empty`` padding value, and is coloured by the sender; an empty cell is white.
    ``held_back`` (a sequence with one list of values per sender, e.g. dropped token ids,
    or labels such as ``"13→0"``) adds a last column for what each sender did not send. ``labels`` name the rows and
    columns ("device", or "expert" for the receivers). Cells are tagged
    ``simpmd:cell:<s>-><d>`` (the text is the cell's listing), the held-back column
    ``simpmd:held_back:<s>``. ``value_text`` (a function of one value) writes each value
    (a token id with its expert, say); ``totals=True`` adds a last row saying, for each
    receiver, how many values arrived against the slots its buffer has (padding
    included), tagged ``simpmd:received:<d>``.
    """
    events = _call_events(trace, call)
    groups = _order(events) if events[0].op in ("all_to_all", "pswapaxes") else None
    matrix = dispatch_matrix(trace, call, leaf=leaf, group=group, empty=None)
    members = groups[group]
    p = len(members)
    if held_back is not None and len(held_back) != p:
        raise ValueError(f"held_back has {len(held_back)} entries; give one list per sender "
                         f"({p})")
    texts = [[_listing(chunk, empty, max_values, value_text) for chunk in row] for row in matrix]
    widest = max(len(t) for row in texts for t, _ in row)
    backs = None
    if held_back is not None:
        backs = [_listing(np.asarray(list(h)), None, max_values) for h in held_back]
        widest = max(widest, *(len(t) for t, _ in backs))
    cell_w, cell_h, label_w, head_h = float(np.clip(0.09 * widest + 0.35, 0.7, 2.6)), 0.42, 1.0, 0.7
    width = label_w + (p + (1 if backs is not None else 0)) * cell_w + 0.2
    height = head_h + (p + (1 if totals else 0)) * cell_h + 0.15
    fig, ax = figure_and_axes(ax, width, height)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    fs = max(MIN_FONT, 8.0)
    sender_word, receiver_word = labels
    top = _heads(ax, members, labels, title, (width, height, head_h, label_w, cell_w), p,
                 backs is not None, fs)
    for s, e in enumerate(members):
        y = top - (s + 1) * cell_h
        ax.text(label_w - 0.08, y + cell_h / 2, _row_label(e).replace("device", sender_word),
                ha="right", va="center", fontsize=fs, color=INK)
        for d in range(p):
            _cell(ax, (label_w + d * cell_w, y, cell_w, cell_h), texts[s][d], fs,
                  face_color(s, p) if texts[s][d][1] else face_color(ZERO, p), "cell", f"{s}->{d}")
        if backs is not None:
            _cell(ax, (label_w + p * cell_w, y, cell_w, cell_h), backs[s], fs, HELD_BACK_FACE,
                  "held_back", s, held=True)
    if totals:
        _totals(ax, matrix, texts, top - (p + 1) * cell_h, label_w, cell_w, cell_h, fs)
    return fig


def _heads(ax, members, labels, title, sizes, p, held, fs):
    """A dispatch matrix's title and column heads; returns the top of its first row."""
    width, height, head_h, label_w, cell_w = sizes
    sender_word, receiver_word = labels
    heading = title or (f"{members[0].op}({', '.join(map(repr, members[0].axes))}): row = the "
                        f"{sender_word} that sends, column = the {receiver_word} that receives")
    ax.text(0.05, height - 0.12, textwrap.fill(heading, int(width * 14)), fontsize=fs + 1,
            va="top", color=INK)
    top = height - head_h
    heads = [f"to {receiver_word} {d}" for d in range(p)] + (["not sent"] if held else [])
    for d, head in enumerate(heads):
        ax.text(label_w + d * cell_w + cell_w / 2, top + 0.08, head, ha="center", va="bottom",
                fontsize=fs, color=INK)
    return top


def _totals(ax, matrix, texts, y, label_w, cell_w, cell_h, fs):
    """The last row of a dispatch matrix: values received by each member, of its slots."""
    ax.text(label_w - 0.08, y + cell_h / 2, "received", ha="right", va="center", fontsize=fs,
            color=INK)
    for d in range(len(matrix)):
        got = sum(texts[s][d][1] for s in range(len(matrix)))
        slots = sum(int(np.size(row[d])) for row in matrix)
        _cell(ax, (label_w + d * cell_w, y, cell_w, cell_h), (f"{got} of {slots} slots", got),
              fs, HELD_BACK_FACE, "received", d)


def _cell(ax, box_at, listing, fs, face, kind, key, held=False):
    """One cell of the dispatch matrix: its box, tagged, and its listing of values (a
    held-back cell hatched when it holds any)."""
    (x, y, w, h), (text, count) = box_at, listing
    box = Rectangle((x, y), w, h, facecolor=face, edgecolor=(0.35, 0.35, 0.35), lw=0.8,
                    hatch="//" if held and count else None)
    ax.add_patch(box)
    tag(box, kind, key)
    box.set_label(text)
    ax.text(x + w / 2, y + h / 2, text or "-", ha="center", va="center", fontsize=fs,
            color=INK, bbox=dict(facecolor=HELD_BACK_FACE, edgecolor="none", pad=0.5)
            if held and count else None)


# -- a chain of ppermutes -------------------------------------------------------------------

def permute_steps(trace, op: str = "ppermute", *, leaf: int = 0) -> list:
    """Whose block each member holds: a list with one entry per stage (before the first
    ``op`` call, then after each), each a list over members of the member whose input to
    the first call this value equals (None when it matches none: a computed value, or
    zeros where nobody sent)."""
    needs_values(trace, "permute_steps")
    calls = [c for c in trace.calls() if c[0].op == op]
    if not calls:
        ops = sorted({c[0].op for c in trace.calls()})
        raise ValueError(f"no {op!r} calls in this trace; its collectives are {ops}")
    if len({len(c) for c in calls}) != 1 or any(len({e.step for e in c}) > 1 for c in calls):
        raise ValueError(f"draw_permute_steps follows one group: these {op} calls run in "
                         f"several groups or with different members")
    start = sorted([e for e in calls[0] if e.kind == "collective"], key=_row_key_member)
    firsts = [np.asarray(e.inputs[leaf]) for e in start]

    def origin(value):
        v = np.asarray(value)
        for k, f in enumerate(firsts):
            if f.shape == v.shape and np.array_equal(f, v):
                return k
        return None

    stages = [list(range(len(start)))]
    for c in calls:
        members = sorted([e for e in c if e.kind == "collective"], key=_row_key_member)
        stages.append([origin(e.outputs[leaf]) for e in members])
    return stages


def _row_key_member(e):
    return (e.device if e.device is not None else 0, e.member)


def draw_permute_steps(trace, op: str = "ppermute", *, leaf: int = 0, block_labels=None,
                       title=None, ax=None):
    """Draw a run of ``op`` calls (a ring pass) as columns of whose block each device holds.

    Column 0 is before the first call; column k after the k-th. A cell is coloured by the
    device whose block it holds (see :func:`permute_steps`), and says so ("block 2", or
    ``block_labels[2]``); arrows join each sender to its receiver between columns. Cells
    are tagged ``simpmd:holds:<stage>:<device row>`` with the label as the artist's label.
    """
    stages = permute_steps(trace, op, leaf=leaf)
    calls = [c for c in trace.calls() if c[0].op == op]
    members = sorted([e for e in calls[0] if e.kind == "collective"], key=_row_key_member)
    p = len(members)
    cell_w, cell_h, gap = 1.0, 0.36, 0.55
    label_w, head_h = 1.0, 0.75
    n = len(stages)
    width = label_w + n * cell_w + (n - 1) * gap + 0.2
    height = head_h + p * cell_h + max(p - 1, 0) * 0.08 + 0.15
    fig, ax = figure_and_axes(ax, width, height)
    ax.set_xlim(0, width)
    ax.set_ylim(0, height)
    ax.set_axis_off()
    fs = max(MIN_FONT, 8.0)
    heading = title or (f"{n - 1} {op} call(s): whose block each device holds "
                        f"(colour = the device it started on)")
    ax.text(0.05, height - 0.1, textwrap.fill(heading, int(width * 14)), fontsize=fs + 1,
            va="top", color=INK)
    top = height - head_h

    def row_y(r):
        return top - (r + 1) * cell_h - r * 0.08

    for r, e in enumerate(members):
        ax.text(label_w - 0.08, row_y(r) + cell_h / 2, _row_label(e), ha="right",
                va="center", fontsize=fs, color=INK)
    for k, stage in enumerate(stages):
        x = label_w + k * (cell_w + gap)
        ax.text(x + cell_w / 2, top + 0.06, "start" if k == 0 else f"after {k}",
                ha="center", va="bottom", fontsize=fs, color=INK)
        for r, who in enumerate(stage):
            text = "?" if who is None else (str(block_labels[who]) if block_labels is not None
                                             else f"block {who}")
            face = face_color(ZERO, p) if who is None else face_color(who, p)
            box = Rectangle((x, row_y(r)), cell_w, cell_h, facecolor=face,
                            edgecolor=(0.35, 0.35, 0.35), lw=0.8)
            ax.add_patch(box)
            tag(box, "holds", f"{k}:{r}")
            box.set_label(text)
            ax.text(x + cell_w / 2, row_y(r) + cell_h / 2, text, ha="center", va="center",
                    fontsize=fs, color=INK)
        if k:
            _messages(ax, calls[k - 1][0], k, label_w + (k - 1) * (cell_w + gap) + cell_w, x,
                      row_y, cell_h)
    return fig


def _messages(ax, call, k, x_from, x_to, row_y, cell_h):
    """The arrows of one ppermute call, each sender's row to its receiver's."""
    for s, d in [(int(s), int(d)) for s, d in call.params.get("perm", ())]:
        arrow = FancyArrowPatch((x_from + 0.04, row_y(s) + cell_h / 2),
                                (x_to - 0.04, row_y(d) + cell_h / 2), arrowstyle="-|>",
                                mutation_scale=8, color=(0.4, 0.4, 0.4), lw=0.9)
        ax.add_patch(arrow)
        tag(arrow, "message", f"{k}:{s}->{d}")
