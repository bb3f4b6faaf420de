"""Collective algorithms step by step: frames, a grid of frames, an animation, a GIF.

The runs come from :mod:`simpmd.algorithms`, which plays an algorithm message by message
and keeps every device's buffer after every step. A frame shows the devices (on a ring;
level by level for a tree; on their grid for a 2-D torus), each with its buffer cut into
pieces; each piece is coloured by where it sits in the buffer (a key in the frame's corner
numbers them), pale while it holds few devices' data, strong once it holds everyone's, and
says whose data it holds. Arrows are the messages of that step: solid when the receiver
adds the piece into its own, dashed when it copies it. Devices that neither send nor
receive in a step are greyed. A torus's wraparound links run round the outside of its
grid, clear of the links between neighbours. A ring of more than 16 devices shows the
first 12 and the last 2, with a note for the middle, as the collective drawings do.

Frame ``t`` shows the buffers after step ``t`` and the messages of step ``t``; frame 0 is
the start. A ring all-reduce over ``p`` devices has ``2(p-1)`` steps, so ``2(p-1) + 1``
frames. Frames are laid out in inches, so the 7 pt text floor holds on paper and screen.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.path import Path
from matplotlib.patches import FancyArrowPatch, Rectangle

from .canvas import (INK, MIN_FONT, OKABE_ITO, device_color, elide, figure_and_axes,
                     new_figure, number, tag, tint)

HATCHES = ("", "xx", "..", "\\\\\\\\")    # the 2nd, 3rd and 4th run of 8 piece colours


def _piece_color(s, n):
    """Pieces: Okabe-Ito hues, repeated with a hatch (:func:`_piece_hatch`) past 8, and
    a colour-blind-safe ramp past 32 (never light/dark pairs of one hue, which would read
    as 'partial' and 'complete')."""
    if n <= 4 * len(OKABE_ITO):
        return OKABE_ITO[s % len(OKABE_ITO)]
    return device_color(s, n)


def _piece_hatch(s, n):
    return HATCHES[s // len(OKABE_ITO)] if n <= 4 * len(OKABE_ITO) else ""


# -- which devices' data each piece holds ---------------------------------------------------

def _segments(run):
    """The finest cut of the flat buffer that every chunk boundary respects."""
    n = int(np.asarray(run.states[0][0]).size) if run.states else 0
    bounds = sorted({0, n} | {b for chunk in run.chunks for b in chunk})
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def sources(run):
    """``sources(run)[t][i][s]``: the set of devices whose data piece ``s`` of device ``i``
    holds after step ``t`` (``t = 0``: the start), with the pieces of ``_segments(run)``.

    Read from the messages alone (a reduce adds the sender's set to the receiver's, a copy
    replaces it), in the order :func:`simpmd.algorithms.play` applies them; the values
    themselves are in ``run.states``.
    """
    segs = _segments(run)
    p = run.num_devices
    gathered = run.collective == "all_gather"
    block = len(segs) and int(np.asarray(run.states[0][0]).size) // p
    start = []
    for i in range(p):
        if gathered:       # an all-gather's buffer starts with only the device's own block
            start.append([frozenset({i}) if i * block <= a < (i + 1) * block else frozenset()
                          for a, _ in segs])
        else:
            start.append([frozenset({i})] * len(segs))
    out = [start]
    for step in run.steps:
        old = out[-1]
        new = [list(row) for row in old]
        for m in step.messages:
            a, b = run.chunks[m.chunk]
            for s, (sa, sb) in enumerate(segs):
                if a <= sa and sb <= b:
                    new[m.dst][s] = (new[m.dst][s] | old[m.src][s]) if m.kind == "reduce" else old[m.src][s]
        out.append(new)
    return out



# -- where the devices go (in inches) ---------------------------------------------------------

HEAD_IN = 0.75        # the frame's title lines and piece key
MAX_RING = 16         # a ring of more devices is drawn with its middle elided, with a note
FOOT_IN = 0.45        # the bytes moved and the piece key


def _tree(run):
    """A tree run's parent of each device (who it first reduces into), read from its
    messages; the root has none."""
    parent = {}
    for step in run.steps:
        for m in step.messages:
            if m.kind == "reduce":
                parent.setdefault(m.src, m.dst)
    return parent


def _tree_places(run):
    """(x slot, level) of each device: the root on top, children one level down, each
    parent centred over its children and the leaves side by side (a tidy tree)."""
    parent = _tree(run)
    children: dict = {}
    for child, up in sorted(parent.items()):
        children.setdefault(up, []).append(child)
    roots = [d for d in range(run.num_devices) if d not in parent]
    places, next_leaf = {}, [0.0]

    def place(d, level):
        kids = children.get(d, [])
        for k in kids:
            place(k, level + 1)
        if kids:
            x = (places[kids[0]][0] + places[kids[-1]][0]) / 2
        else:
            x, next_leaf[0] = next_leaf[0], next_leaf[0] + 1
        places[d] = (x, level)

    for r in roots:
        place(r, 0)
    return places


def _layout(run, n_pieces):
    """Device centres, box width and height, the plot limits and the kind of layout."""
    shape = tuple(run.mesh_shape) or (run.num_devices,)
    p = run.num_devices
    if len(shape) == 2 and shape[0] > 1:
        rows, cols = shape
        w = float(np.clip(0.25 * n_pieces, 1.6, 2.6))
        h = 0.34
        sx, sy = w + 0.9, 1.25
        centres = {r * cols + c: (c * sx, -r * sy) for r in range(rows) for c in range(cols)}
        lanes = _torus_lanes(run)
        side = LANE_IN * (lanes[0] + lanes[1]) + (0.2 if any(lanes) else 0.0)
        limits = (-w / 2 - 0.1 - side, (cols - 1) * sx + w / 2 + max(0.55, side + 0.1),
                  -(rows - 1) * sy - h / 2 - (side + 0.1 if side else 0.75), h / 2 + 0.3 + side)
        return centres, w, h, limits, "grid"
    if "tree" in run.algorithm:
        places = _tree_places(run)
        w = float(np.clip(0.22 * n_pieces, 0.62, 1.6))
        h, sx, sy = 0.32, w + 0.7, 0.8           # room for the label at each box's left
        centres = {d: (x * sx, -level * sy) for d, (x, level) in places.items()}
        width = max(x for x, _ in places.values())
        levels = max(level for _, level in places.values())
        limits = (-w / 2 - 0.6, width * sx + w / 2 + 0.1, -levels * sy - h / 2 - 0.3,
                  h / 2 + 0.25)
        return centres, w, h, limits, "tree"
    slots, elided = _ring_slots(p)          # past MAX_RING, the middle takes two slots
    n = len(slots) + (1 if elided else 0)
    w = float(np.clip(0.42 * n_pieces, 1.2, 2.0)) if n <= 8 else max(0.45, 11.0 / n)
    h = 0.34 if n <= 16 else 0.22
    radius = max(1.3, n * (w + 0.2) / (2 * math.pi), (h + 0.35) * n / (2 * math.pi) * 1.6)
    def place(k):
        return radius * math.sin(2 * math.pi * k / n), radius * math.cos(2 * math.pi * k / n)

    gap = slots.index(None) if elided else n
    centres = {i: place(k if k < gap else k + 1) for k, i in enumerate(slots) if i is not None}
    for i in elided:                        # their messages end in the middle of the gap
        centres[i] = place(gap + 0.5)
    pad = w / 2 + 0.1 + (0.6 if n > 8 else 0.0)     # room for labels beside the boxes
    limits = (-radius - pad, radius + pad, -radius - h / 2 - 0.3, radius + h / 2 + 0.3)
    return centres, w, h, limits, "ring"


def _edge(centre, toward, w, h):
    """Where the line from a box's centre towards a point leaves the ``w`` x ``h`` box.

    (Computed here rather than by matplotlib's patch clipping, which is slow.)"""
    (cx, cy), (tx, ty) = centre, toward
    dx, dy = tx - cx, ty - cy
    scale = min((w / 2) / abs(dx) if dx else np.inf, (h / 2) / abs(dy) if dy else np.inf)
    scale = min(scale, 1.0)
    return cx + dx * scale, cy + dy * scale


def _ring_slots(p):
    """The devices drawn round a ring of ``p``, with ``None`` for the elided middle (past
    MAX_RING devices, as the collective drawings do with rows), and the elided devices."""
    return elide(list(range(p)), MAX_RING)


def _draw_gap(ax, centre, elided, radius):
    """The elided middle of a ring: a dotted stretch of ring and a note inside it."""
    angle = math.atan2(centre[0], centre[1])
    arc = np.linspace(angle - 0.16, angle + 0.16, 9)
    ax.plot(radius * np.sin(arc), radius * np.cos(arc), linestyle=(0, (1, 2.5)), lw=2.5,
            color=INK, zorder=3)
    inward = 0.72
    note = ax.text(centre[0] * inward, centre[1] * inward,
                   f"⋮  {len(elided)} devices not drawn: devices {elided[0]} to {elided[-1]}\n"
                   f"(their messages end at the dotted stretch)",
                   ha="left" if centre[0] < 0 else "right", va="center",
                   fontsize=MIN_FONT + 1, color=INK, style="italic", zorder=6)
    tag(note, "elided", len(elided))


def _frame_count(run):
    return run.num_steps + 1


# -- one frame --------------------------------------------------------------------------------

def _cell_text(held, p, value, show):
    if show == "values":
        return number(value)
    if not held:
        return ""
    if len(held) == p:
        return "all"
    if p <= 4:
        return "+".join(str(d) for d in sorted(held))
    return f"{len(held)}/{p}"


def _fits(text, width_in, fs=MIN_FONT):
    return len(text) * 0.6 * fs / 72 + 0.03 <= width_in


def _busy(run, t):
    if t == 0:
        return set(range(run.num_devices))
    return {d for m in run.steps[t - 1].messages for d in (m.src, m.dst)}


def _draw_frame(ax, run, t, held, segs, show):
    centres, w, h, limits, kind = _layout(run, len(segs))
    busy = _busy(run, t)
    slots, elided = _ring_slots(run.num_devices) if kind == "ring" else (list(centres), [])
    if elided:
        _draw_gap(ax, centres[elided[0]], elided, math.hypot(*centres[0]))
    for i in (d for d in slots if d is not None):
        idle = i not in busy
        _draw_buffer(ax, run, t, i, centres[i], (w, h), held, segs, show, idle)
        _device_label(ax, i, centres[i], (w, h), kind, len(slots), idle)
    if kind == "tree":                   # the tree itself, faint, in every frame
        for child, up in _tree(run).items():
            (cx, cy), (ux, uy) = centres[child], centres[up]
            ax.plot([ux, cx], [uy - h / 2, cy + h / 2], color=(0.82, 0.82, 0.82), lw=2.5,
                    zorder=0, solid_capstyle="round")
    if t > 0:
        step = run.steps[t - 1]
        _draw_messages(ax, run, t, step, centres, w, h, kind, segs)
        what = f"step {t}/{run.num_steps}: {step.label}"
        moved = f"{len(step.messages)} message(s), {step.nbytes} B"
    else:
        what = "start: every device holds its own data"
        moved = ""
    x0, x1, y0, y1 = limits
    ax.text(x0, y1 + HEAD_IN - 0.08, run.algorithm, ha="left", va="top", fontsize=9.5,
            fontweight="bold", color=INK)
    ax.text(x0, y1 + HEAD_IN - 0.33, what, ha="left", va="top", fontsize=8.5, color=INK)
    ax.text(x0, y0 - 0.05, moved, ha="left", va="top", fontsize=MIN_FONT + 0.5, color=INK)
    if len(segs) > 1:
        _piece_key(ax, segs, x1, y0 - 0.05, room=x1 - x0 - 1.9)
    ax.set_xlim(x0 - 0.1, x1 + 0.1)
    ax.set_ylim(y0 - FOOT_IN, y1 + HEAD_IN)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()


def _draw_buffer(ax, run, t, i, centre, size, held, segs, show, idle):
    """Device ``i``'s buffer at step ``t``: a box of pieces, each as full as the share of
    the devices' data it holds (faded when the device is idle this step)."""
    (cx, cy), (w, h), p = centre, size, run.num_devices
    n = max((b for _, b in segs), default=0)
    x0, y0 = cx - w / 2, cy - h / 2
    box = Rectangle((x0, y0), w, h, fill=False, edgecolor=(0.6, 0.6, 0.6) if idle else INK,
                    linewidth=1.0, zorder=3)
    tag(box, "device", i)
    ax.add_patch(box)
    state = np.asarray(run.states[t][i]).ravel()
    for s, (a, b) in enumerate(segs):
        frac = len(held[t][i][s]) / p
        face = tint(_piece_color(s, len(segs)), 0.15 + 0.85 * frac) if frac else (1, 1, 1)
        if idle:
            face = tint(face, 0.45)
        cell = Rectangle((x0 + w * a / n, y0), w * (b - a) / n, h, facecolor=face,
                         edgecolor="white", linewidth=0.5, zorder=2,
                         hatch=_piece_hatch(s, len(segs)) or None)
        ax.add_artist(cell)   # inside the box, whose add_patch set the limits: updating them
        #                       cell by cell was most of a 64-device frame's 8 s
        text = _cell_text(held[t][i][s], p, state[a], show)
        if text and _fits(text, w * (b - a) / n):
            strong = frac == 1 and max(_piece_color(s, len(segs))) < 0.75
            ax.text(x0 + w * (a + b) / (2 * n), cy, text, ha="center", va="center",
                    fontsize=MIN_FONT, color="white" if strong else INK, zorder=4)


def _device_label(ax, i, centre, size, kind, n_slots, idle):
    """A device's name, where the arrows of its layout do not arrive."""
    (cx, cy), (w, h) = centre, size
    x0, y0 = cx - w / 2, cy - h / 2
    label = f"device {i}" if n_slots <= 16 else str(i)
    colour = (0.6, 0.6, 0.6) if idle else INK
    if kind == "tree":               # at the left: arrows attach at the top and bottom
        ax.text(x0 - 0.05, cy, label, ha="right", va="center", fontsize=MIN_FONT, color=colour)
    elif kind == "grid":             # above, at the left: the arrows attach right of it
        ax.text(x0, y0 + h + 0.03, label, ha="left", va="bottom", fontsize=MIN_FONT,
                color=colour)
    elif n_slots > 8 and abs(cx) > 1.2 * abs(cy):   # a crowded ring's sides: outside
        ax.text(x0 - 0.05 if cx < 0 else x0 + w + 0.05, cy, label, va="center",
                ha="right" if cx < 0 else "left", fontsize=MIN_FONT, color=colour)
    else:                            # at the outer end, clear of the arrows that arrive
        below = cy < -1e-9
        side = "left" if cx < -1e-9 else ("right" if cx > 1e-9 else "center")
        lx = {"left": x0, "right": x0 + w, "center": cx}[side]
        ax.text(lx, y0 - 0.03 if below else y0 + h + 0.03, label, ha=side,
                va="top" if below else "bottom", fontsize=MIN_FONT, color=colour)


def _piece_key(ax, segs, x_right, y_top, room=np.inf):
    """A row of small swatches at the bottom right: piece k of the buffer, numbered;
    narrower swatches when 0.2 inch each would not fit in ``room`` inches."""
    size = min(0.2, room / len(segs))
    y_top -= 0.14                        # the numbers go above the swatches
    for k in range(len(segs)):
        x = x_right - (len(segs) - k) * size
        ax.add_patch(Rectangle((x, y_top - size), size, size, facecolor=_piece_color(k, len(segs)),
                               edgecolor="white", linewidth=0.5,
                               hatch=_piece_hatch(k, len(segs)) or None))
        if len(segs) <= 24:
            ax.text(x + size / 2, y_top + 0.01, str(k), ha="center", va="bottom",
                    fontsize=MIN_FONT, color=INK)
    ax.text(x_right - len(segs) * size - 0.05, y_top - size / 2, "pieces", ha="right",
            va="center", fontsize=MIN_FONT, color=INK)


def _draw_messages(ax, run, t, step, centres, w, h, kind, segs):
    p = run.num_devices
    pairs: dict = {}
    for m in step.messages:
        pairs.setdefault((m.src, m.dst), []).append(m)
    cols = run.mesh_shape[-1] if kind == "grid" else 1
    rows = p // cols if kind == "grid" else 1
    lanes = _torus_lanes(run) if kind == "grid" else (0, 0)
    for (src, dst), msgs in pairs.items():
        first = run.chunks[msgs[0].chunk][0]
        s = next(k for k, (a, b) in enumerate(segs) if a <= first < b)
        style = dict(arrowstyle="-|>", mutation_scale=10, lw=1.5, zorder=5,
                     color=_piece_color(s, len(segs)),
                     linestyle="-" if msgs[0].kind == "reduce" else (0, (3, 2)))
        (sx, sy), (dx, dy) = centres[src], centres[dst]
        if kind == "grid":
            arrow, (mx, my) = _grid_arrow(src, dst, centres, w, h, rows, cols, style, lanes)
        elif kind == "tree":             # along the tree's edge, beside its faint line
            up, down = (sx, sy - h / 2), (dx, dy + h / 2)
            if sy < dy:
                up, down = (sx, sy + h / 2), (dx, dy - h / 2)
            arrow = FancyArrowPatch(up, down, connectionstyle="arc3,rad=0.15", **style)
            mx, my = (sx + dx) / 2, (sy + dy) / 2
        elif centres[src] == centres[dst]:     # both in a ring's elided middle: not drawn
            continue
        else:
            near = (dst - src) % p in (1, p - 1)
            arrow = FancyArrowPatch(_edge((sx, sy), (dx, dy), w, h), _edge((dx, dy), (sx, sy), w, h),
                                    connectionstyle=f"arc3,rad={0.12 if near else 0.3}", **style)
            mx, my = (sx + dx) / 2, (sy + dy) / 2
        tag(arrow, "message", f"{t}:{src}->{dst}")
        ax.add_patch(arrow)
        if len(msgs) > 1:
            ax.text(mx, my, f"×{len(msgs)}", fontsize=MIN_FONT, color=INK, ha="center",
                    va="center", zorder=6,
                    bbox=dict(boxstyle="round,pad=0.05", facecolor="white", edgecolor="none"))


LANE_IN = 0.09         # between two wraparound lanes of a torus


def _is_wrap(src, dst, rows, cols):
    """A torus message between the two ends of a row or a column (not between neighbours)."""
    (r0, c0), (r1, c1) = divmod(src, cols), divmod(dst, cols)
    return (r0 == r1 and abs(c1 - c0) > 1) or (c0 == c1 and abs(r1 - r0) > 1)


def _torus_lanes(run):
    """How many wraparound lanes a torus frame needs in each margin: (for rows, for columns).

    Half the rows' wraparounds run over the top of the grid, half under it; half the
    columns' round the left, half round the right; two lanes (one per direction) a line."""
    rows, cols = run.mesh_shape
    wraps = [(m.src, m.dst) for step in run.steps for m in step.messages
             if _is_wrap(m.src, m.dst, rows, cols)]
    row_wraps = any(s // cols == d // cols for s, d in wraps)
    col_wraps = any(s % cols == d % cols for s, d in wraps)
    return (2 * math.ceil(rows / 2) if row_wraps else 0,
            2 * math.ceil(cols / 2) if col_wraps else 0)


def _grid_arrow(src, dst, centres, w, h, rows, cols, style, lanes=(0, 0)):
    """A message between torus neighbours: straight between adjacent boxes (the two
    directions side by side, right of the device label). A wraparound link runs round
    the outside of the grid, so that it crosses no link between neighbours: a row's from
    its right end out to the right, over the top (or under the bottom) and in at its left
    end; a column's from its bottom end down, round the left (or right) side and in at
    its top. ``lanes`` is :func:`_torus_lanes`; outer rows and columns take outer lanes,
    so that the wraparounds of one side nest without crossing one another."""
    (sx, sy), (dx, dy) = centres[src], centres[dst]
    r0, c0, r1, c1 = src // cols, src % cols, dst // cols, dst % cols
    if r0 == r1 and abs(c1 - c0) == 1:               # along a row
        off = 0.07 if c1 > c0 else -0.07
        a = (sx + np.sign(c1 - c0) * w / 2, sy + off)
        b = (dx - np.sign(c1 - c0) * w / 2, dy + off)
        return FancyArrowPatch(a, b, **style), ((a[0] + b[0]) / 2, a[1] + 0.1 * np.sign(off))
    if c0 == c1 and abs(r1 - r0) == 1:               # along a column
        off = 0.12 if r1 > r0 else 0.3
        a = (sx + off, sy - np.sign(r1 - r0) * h / 2)
        b = (dx + off, dy + np.sign(r1 - r0) * h / 2)
        return FancyArrowPatch(a, b, **style), (a[0] + 0.12, (a[1] + b[1]) / 2)
    n_row, n_col = lanes
    left, right = -w / 2, centres[cols - 1][0] + w / 2
    top, bottom = h / 2 + 0.25, centres[(rows - 1) * cols][1] - h / 2 - 0.15
    if r0 == r1:                                     # a row's wraparound
        over = r0 < rows / 2                         # over the top, else under the bottom
        rank = r0 if over else rows - 1 - r0         # rows nearer that side: inner lanes
        back = c1 < c0                               # from the right end to the left end
        k = 2 * rank + (0 if back else 1)
        y = sy + (0.07 if back != over else -0.07)   # the inner lane's end nearer the side
        lane_x = 0.15 + k * LANE_IN                  # in the side margins: inside the columns'
        lane_y = (n_col + k) * LANE_IN               # above and below: outside the columns'
        ly = top + lane_y if over else bottom - lane_y
        verts = [(right, y), (right + lane_x, y), (right + lane_x, ly), (left - lane_x, ly),
                 (left - lane_x, y), (left, y)]
        if not back:
            verts = verts[::-1]
    else:                                            # a column's wraparound
        west = c0 < cols / 2                         # round the left, else round the right
        rank = c0 if west else cols - 1 - c0
        up = r1 < r0                                 # from the bottom end to the top end
        k = 2 * rank + (0 if up else 1)
        x = sx + (0.12 if up == west else 0.3)       # outer lanes drop further from the side
        lane_x = 0.15 + (n_row + k) * LANE_IN        # in the side margins: outside the rows'
        lane_y = k * LANE_IN                         # above and below: inside the rows'
        lx = left - lane_x if west else right + lane_x
        low, high = centres[(rows - 1) * cols][1] - h / 2, h / 2
        verts = [(x, low), (x, bottom - lane_y), (lx, bottom - lane_y), (lx, top + lane_y),
                 (x, top + lane_y), (x, high)]
        if not up:
            verts = verts[::-1]
    path = Path(verts, [Path.MOVETO] + [Path.LINETO] * (len(verts) - 1))
    mid = ((verts[2][0] + verts[3][0]) / 2, (verts[2][1] + verts[3][1]) / 2)
    return FancyArrowPatch(path=path, **style), mid


def _frame_inches(run):
    """A frame's size in inches: the layout's data units are inches."""
    _, _, _, (x0, x1, y0, y1), _ = _layout(run, len(_segments(run)))
    return (x1 - x0) + 0.2, (y1 - y0) + HEAD_IN + FOOT_IN


# -- public -----------------------------------------------------------------------------------

def _check(run, show):
    if not hasattr(run, "states") or not hasattr(run, "steps"):
        raise TypeError("expected a run from simpmd.algorithms (e.g. ring_all_reduce(values)); "
                        f"got {type(run).__name__}")
    if show not in ("sources", "values"):
        raise ValueError(f"show={show!r}: choose 'sources' (which devices' data each piece "
                         f"holds) or 'values' (the numbers)")


def draw_algorithm_step(run, t: int, *, show: str = "sources", ax=None):
    """Draw frame ``t`` of an algorithm run (0: the start; t: after step t); return the Figure.

    ``show='sources'`` writes in each piece which devices' data it holds (``0+1``, or a
    count beyond 4 devices, ``all`` when complete); ``show='values'`` writes the first
    number of the piece. Device boxes are tagged ``simpmd:device:<id>``, arrows
    ``simpmd:message:<t>:<src>-><dst>`` and a long ring's note ``simpmd:elided:<count>``.
    """
    _check(run, show)
    if not 0 <= t <= run.num_steps:
        raise IndexError(f"t={t}, but this run has frames 0 to {run.num_steps}")
    fig, ax = figure_and_axes(ax, *_frame_inches(run))
    _draw_frame(ax, run, t, sources(run), _segments(run), show)
    return fig



def draw_algorithm(run, *, frames=None, ncols: int | None = None, show: str = "sources"):
    """Draw several frames of a run side by side (all ``num_steps + 1`` by default), ``ncols``
    per row (as many as fit in about 22 inches); a free slot explains the colours. Return the Figure."""
    _check(run, show)
    fw, fh = _frame_inches(run)
    frames = list(range(_frame_count(run))) if frames is None else list(frames)
    if ncols is None:          # as few rows as fit, then as few empty slots as those rows allow
        widest = max(1, min(4, int(22 // fw)))
        slots = len(frames) + 1
        rows = math.ceil(slots / widest)
        ncols = next(c for c in range(1, widest + 1) if math.ceil(slots / c) == rows)
    ncols = max(1, min(ncols, len(frames)))
    nrows = math.ceil(len(frames) / ncols)
    fig = new_figure(fw * ncols, fh * nrows)
    held, segs = sources(run), _segments(run)
    for k, t in enumerate(frames):
        r, c = divmod(k, ncols)
        ax = fig.add_axes((c / ncols, 1 - (r + 1) / nrows, 1 / ncols, 1 / nrows))
        _draw_frame(ax, run, t, held, segs, show)
    if len(frames) < nrows * ncols:
        k = len(frames)
        r, c = divmod(k, ncols)
        ax = fig.add_axes((c / ncols, 1 - (r + 1) / nrows, 1 / ncols, 1 / nrows))
        _legend(ax, fh)
    return fig


def _legend(ax, height_in):
    lines = ["How to read a frame",
             "",
             "a box = one device's buffer, cut in pieces",
             "colour = which piece of the buffer (key: 'pieces')",
             "pale: one device's data; strong: everyone's",
             "text: whose data the piece holds (0+2, 3/8, all)",
             "grey box: the device is idle in this step",
             "",
             "solid arrow: the piece is added in",
             "dashed arrow: the piece is copied"]
    step = 0.17 / max(height_in, 1e-9)
    for k, line in enumerate(lines):
        ax.text(0.04, 0.9 - k * step, line, transform=ax.transAxes, fontsize=8.5, color=INK,
                fontweight="bold" if k == 0 else "normal", va="top")
    ax.set_axis_off()


def animate_algorithm(run, *, interval: int = 900, show: str = "sources", hold: int = 0):
    """A ``matplotlib.animation.FuncAnimation`` of the run: ``num_steps + 1`` frames (plus
    ``hold`` repeats of the last). Show it with :func:`algorithm_html` in Jupyter."""
    _check(run, show)
    fig = new_figure(*_frame_inches(run))
    ax = fig.add_axes((0, 0, 1, 1))
    held, segs = sources(run), _segments(run)
    order = list(range(_frame_count(run))) + [run.num_steps] * hold

    def update(t):
        ax.clear()
        _draw_frame(ax, run, t, held, segs, show)
        return []

    return FuncAnimation(fig, update, frames=order, init_func=lambda: [], interval=interval,
                         blit=False, repeat=True, cache_frame_data=False)


def algorithm_html(run, *, interval: int = 900, show: str = "sources"):
    """The run as an animation with play controls, for Jupyter (``IPython.display.HTML``;
    the HTML text itself when IPython is not installed)."""
    text = animate_algorithm(run, interval=interval, show=show).to_jshtml()
    try:
        from IPython.display import HTML  # optional: IPython
    except ImportError:
        return text
    return HTML(text)


def save_algorithm_gif(run, path, *, fps: float = 1.2, dpi: int = 200, hold: int = 2,
                       show: str = "sources"):
    """Write the run as an animated GIF (Pillow, which matplotlib brings); return ``path``."""
    anim = animate_algorithm(run, show=show, hold=hold)
    anim.save(str(path), writer=PillowWriter(fps=fps), dpi=dpi)
    return path
