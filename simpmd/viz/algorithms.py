"""Collective algorithms step by step: frames, a grid of frames, an animation, a GIF.

The runs come from :mod:`simpmd.algorithms`, which plays an algorithm message by message
and keeps every device's buffer after every step. A frame shows the devices (on a ring,
or on their grid for a 2-D torus), each with its buffer cut into pieces; each piece is
coloured by where it sits in the buffer, and pale while it holds few devices' data,
strong once it holds everyone's. Arrows are the messages of that step: solid when the
receiver adds the piece into its own, dashed when it copies it.

Frame ``t`` shows the buffers after step ``t`` and the messages of step ``t``; frame 0 is
the start. A ring all-reduce over ``p`` devices has ``2(p-1)`` steps, so ``2(p-1) + 1``
frames.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.animation import FuncAnimation, PillowWriter
from matplotlib.patches import FancyArrowPatch, Rectangle

from matplotlib import colormaps
from matplotlib.colors import to_rgb

from .canvas import INK, device_color, figure_and_axes, new_figure, number, tag, tint


_TURBO = colormaps["turbo"]


def _piece_color(s, n):
    """Pieces: distinct hues when few, a ramp along the buffer when many (never light/dark
    pairs, which would read as 'partial' and 'complete')."""
    if n <= 9:
        return device_color(s, n)
    return to_rgb(_TURBO(0.08 + 0.84 * s / max(n - 1, 1)))


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


# -- where the devices go -------------------------------------------------------------------

def _layout(run):
    """Device centres, the box size, and the plot limits."""
    shape = tuple(run.mesh_shape) or (run.num_devices,)
    p = run.num_devices
    if len(shape) == 2 and shape[0] > 1:
        rows, cols = shape
        w = 1.5
        sx, sy = w * 1.6, 1.7
        centres = {r * cols + c: (c * sx, -r * sy) for r in range(rows) for c in range(cols)}
        limits = (-w * 1.1, (cols - 1) * sx + w * 1.1, -(rows - 1) * sy - 0.9, 0.9)
        return centres, w, 0.42, limits, "grid"
    w = 1.9 if p <= 4 else (1.25 if p <= 8 else max(0.5, 10.0 / p))
    radius = max(1.45, p * w * 1.2 / (2 * math.pi))
    centres = {i: (radius * math.sin(2 * math.pi * i / p), radius * math.cos(2 * math.pi * i / p))
               for i in range(p)}
    pad = w * 0.75 + 0.2
    return centres, w, min(0.42, w * 0.34), (-radius - pad, radius + pad, -radius - 0.55, radius + 0.55), "ring"


def _edge(centre, toward, w, h):
    """Where the line from a box's centre towards a point leaves the ``w`` x ``h`` box.

    (Computed here rather than by matplotlib's patch clipping, which is slow.)"""
    (cx, cy), (tx, ty) = centre, toward
    dx, dy = tx - cx, ty - cy
    scale = min((w / 2) / abs(dx) if dx else np.inf, (h / 2) / abs(dy) if dy else np.inf)
    scale = min(scale, 1.0)
    return cx + dx * scale, cy + dy * scale


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


def _draw_frame(ax, run, t, held, segs, show):
    centres, w, h, limits, kind = _layout(run)
    p = run.num_devices
    n = max((b for _, b in segs), default=0)
    fs = 7.5 if w >= 1.2 else max(4.0, w * 6)
    for i, (cx, cy) in centres.items():
        x0, y0 = cx - w / 2, cy - h / 2
        box = Rectangle((x0, y0), w, h, fill=False, edgecolor=INK, linewidth=1.0, zorder=3)
        tag(box, "device", i)
        ax.add_patch(box)
        state = np.asarray(run.states[t][i]).ravel()
        for s, (a, b) in enumerate(segs):
            frac = len(held[t][i][s]) / p
            face = tint(_piece_color(s, len(segs)), 0.12 + 0.88 * frac) if frac else (1, 1, 1)
            cell = Rectangle((x0 + w * a / n, y0), w * (b - a) / n, h, facecolor=face,
                             edgecolor="white", linewidth=0.5, zorder=2)
            ax.add_patch(cell)
            if w * (b - a) / n >= 0.3:
                ax.text(x0 + w * (a + b) / (2 * n), cy, _cell_text(held[t][i][s], p, state[a], show),
                        ha="center", va="center", fontsize=fs * 0.8, color=INK, zorder=4)
        below = kind == "ring" and cy < -1e-9
        if kind == "grid":       # at the left, clear of the arrows from the row above
            ax.text(x0, y0 + h + 0.04, f"device {i}", ha="left", va="bottom", fontsize=fs * 0.9,
                    color=INK)
        else:                    # at the outer end, clear of the arrows that arrive
            side = "left" if cx < -1e-9 else ("right" if cx > 1e-9 else "center")
            lx = {"left": x0, "right": x0 + w, "center": cx}[side]
            ax.text(lx, y0 - 0.04 if below else y0 + h + 0.04, f"device {i}", ha=side,
                    va="top" if below else "bottom", fontsize=fs, color=INK)

    if t > 0:
        step = run.steps[t - 1]
        pairs: dict = {}
        for m in step.messages:
            pairs.setdefault((m.src, m.dst), []).append(m)
        for (src, dst), msgs in pairs.items():
            first = run.chunks[msgs[0].chunk][0]
            s = next(k for k, (a, b) in enumerate(segs) if a <= first < b)
            (ax_, ay), (bx, by) = centres[src], centres[dst]
            style = dict(arrowstyle="-|>", mutation_scale=11, lw=1.6, zorder=5,
                         color=_piece_color(s, len(segs)),
                         linestyle="-" if msgs[0].kind == "reduce" else (0, (3, 2)))
            cols = run.mesh_shape[-1] if kind == "grid" else 1
            wraps = kind == "grid" and (abs(src // cols - dst // cols) > 1
                                        or abs(src % cols - dst % cols) > 1)
            if wraps:
                # a torus wraparound link: leave through one edge, come back through the other
                ux, uy = np.sign(ax_ - bx), np.sign(ay - by)
                out_end = (ax_ + ux * (w / 2 + 0.45), ay + uy * (h / 2 + 0.45))
                in_start = (bx - ux * (w / 2 + 0.45), by - uy * (h / 2 + 0.45))
                shift = (0.12 * uy, 0.12 * ux)          # keep the two directions apart
                leave = _edge((ax_ + shift[0], ay + shift[1]), out_end, w, h)
                enter = _edge((bx + shift[0], by + shift[1]), in_start, w, h)
                arrow = FancyArrowPatch(leave, (out_end[0] + shift[0], out_end[1] + shift[1]),
                                        **style)
                ax.add_patch(FancyArrowPatch((in_start[0] + shift[0], in_start[1] + shift[1]),
                                             enter, **style))
            else:
                near = kind == "grid" or (dst - src) % p in (1, p - 1)
                arrow = FancyArrowPatch(_edge((ax_, ay), (bx, by), w, h),
                                        _edge((bx, by), (ax_, ay), w, h),
                                        connectionstyle=f"arc3,rad={0.15 if near else 0.35}",
                                        **style)
            tag(arrow, "message", f"{t}:{src}->{dst}")
            ax.add_patch(arrow)
            if len(msgs) > 1:
                mx, my = (ax_ + bx) / 2, (ay + by) / 2
                ax.text(mx, my, f"×{len(msgs)}", fontsize=fs * 0.8, color=INK, ha="center",
                        va="center", zorder=6)
        what = f"step {t}/{run.num_steps}: {step.label}"
        moved = f"{len(step.messages)} message(s), {step.nbytes} B"
    else:
        what = "start: every device holds its own data"
        moved = ""
    x0, x1, y0, y1 = limits
    ax.text(x0, y1 + 0.55, run.algorithm, ha="left", va="bottom", fontsize=9, fontweight="bold",
            color=INK)
    ax.text(x0, y1 + 0.2, what, ha="left", va="bottom", fontsize=8.5, color=INK)
    ax.text(x0, y0 - 0.12, moved, ha="left", va="top", fontsize=7.5, color=INK)
    ax.set_xlim(x0 - 0.2, x1 + 0.05)
    ax.set_ylim(y0 - 0.45, y1 + 1.05)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()


def _frame_inches(run):
    _, _, _, (x0, x1, y0, y1), kind = _layout(run)
    scale = (4.2 if kind == "ring" else 6.0) / max(x1 - x0 + 0.25, y1 - y0 + 1.5)
    return (x1 - x0 + 0.25) * scale + 0.1, (y1 - y0 + 1.5) * scale + 0.1


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
    number of the piece. Device boxes are tagged ``simpmd:device:<id>`` and arrows
    ``simpmd:message:<t>:<src>-><dst>``.
    """
    _check(run, show)
    if not 0 <= t <= run.num_steps:
        raise IndexError(f"t={t}, but this run has frames 0 to {run.num_steps}")
    fig, ax = figure_and_axes(ax, *_frame_inches(run))
    _draw_frame(ax, run, t, sources(run), _segments(run), show)
    return fig


def draw_algorithm(run, *, frames=None, ncols: int | None = None, show: str = "sources"):
    """Draw several frames of a run side by side (all ``num_steps + 1`` by default), ``ncols``
    per row (4 for a ring, 2 for a torus); the last free slot explains the colours. Return the Figure."""
    _check(run, show)
    if ncols is None:
        ncols = 4 if _layout(run)[4] == "ring" else 2
    frames = list(range(_frame_count(run))) if frames is None else list(frames)
    ncols = max(1, min(ncols, len(frames)))
    nrows = math.ceil(len(frames) / ncols)
    fw, fh = _frame_inches(run)
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
        _legend(ax)
    return fig


def _legend(ax):
    lines = ["How to read a frame",
             "",
             "a box = one device's buffer, cut in pieces",
             "colour = which piece of the buffer",
             "pale: one device's data; strong: all",
             "text: whose data the piece holds",
             "",
             "solid arrow: the piece is added in",
             "dashed arrow: the piece is copied"]
    for k, line in enumerate(lines):
        ax.text(0.06, 0.86 - k * 0.085, line, transform=ax.transAxes, fontsize=8.5, color=INK,
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
        from IPython.display import HTML
    except ImportError:
        return text
    return HTML(text)


def save_algorithm_gif(run, path, *, fps: float = 1.2, dpi: int = 100, hold: int = 2,
                       show: str = "sources"):
    """Write the run as an animated GIF (Pillow, which matplotlib brings); return ``path``."""
    anim = animate_algorithm(run, show=show, hold=hold)
    anim.save(str(path), writer=PillowWriter(fps=fps), dpi=dpi)
    return path
