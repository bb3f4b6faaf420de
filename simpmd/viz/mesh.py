"""Meshes as grids of device boxes, with the groups of a collective over one axis.

A mesh gives every device a coordinate on each named axis. A collective over axis ``a``
runs once per *group*: the devices that agree on every coordinate except ``a``. On a
2x4 mesh with axes ``('data', 'model')``, a ``psum`` over ``'model'`` has two groups (the
rows) and one over ``'data'`` has four (the columns); :func:`draw_mesh` colours them.
"""
from __future__ import annotations

import math

import numpy as np
from matplotlib.patches import FancyBboxPatch, Rectangle

from ..api.text import needs_values
from .canvas import INK, MIN_FONT, device_color, figure_and_axes, short, tag, tint

BOX = 1.0         # a device box is BOX x BOX data units
GAP = 0.25        # between boxes
SLICE_GAP = 1.2   # between the 2-D slices of a 3-D (or larger) mesh
WRAP = 16         # a 1-D mesh longer than this is wrapped into rows of WRAP devices ...
MAX_WRAPPED_ROWS = 8   # ... and past this many rows, the middle rows are elided


def _device_grid(shape_or_devices):
    """An integer array of device ids shaped like the mesh, and axis names it may carry."""
    names = None
    thing = shape_or_devices
    if hasattr(thing, "devices") and hasattr(thing, "axis_names"):     # a Mesh-like object
        names = tuple(thing.axis_names)
        thing = thing.devices
    if isinstance(thing, (int, np.integer)):
        return np.arange(int(thing)), names
    if isinstance(thing, tuple) and all(isinstance(s, (int, np.integer)) for s in thing):
        return np.arange(math.prod(thing)).reshape(thing), names
    arr = np.asarray(thing, dtype=object)
    ids = np.vectorize(lambda d: int(getattr(d, "id", d)), otypes=[int])(arr) if arr.size else arr
    return np.asarray(ids, dtype=int).reshape(arr.shape), names


def mesh_groups(shape, highlight_axis, axis_names):
    """For each mesh position (row-major), the index of its group over ``highlight_axis``.

    ``highlight_axis`` is an axis name or a tuple of names (a collective over several
    axes at once). Positions that agree on every other axis share a group.
    """
    chosen = (highlight_axis,) if isinstance(highlight_axis, str) else tuple(highlight_axis)
    for name in chosen:
        if name not in axis_names:
            raise ValueError(f"highlight_axis {name!r} is not an axis of this mesh; its axes are "
                             f"{tuple(axis_names)}")
    others = [k for k, n in enumerate(axis_names) if n not in chosen]
    coords = np.indices(shape).reshape(len(shape), -1)
    other_shape = tuple(shape[k] for k in others)
    if not others:
        return np.zeros(coords.shape[1], dtype=int), 1
    return np.ravel_multi_index(tuple(coords[k] for k in others), other_shape), math.prod(other_shape)


def _wrapped_rows(n):
    """The rows of WRAP devices that a long 1-D mesh of ``n`` is drawn as: the first
    index on each drawn row, and how many rows were elided (drawn as one note row)."""
    starts = list(range(0, n, WRAP))
    if len(starts) <= MAX_WRAPPED_ROWS:
        return starts, 0
    keep = MAX_WRAPPED_ROWS - 2
    return starts[:keep] + [None] + starts[-1:], len(starts) - keep - 1


def _slices(shape):
    """The 2-D slices of an n-D mesh: (leading index tuple, rows, cols)."""
    if len(shape) == 1 and shape[0] > WRAP:
        return [((), len(_wrapped_rows(shape[0])[0]), WRAP)]
    if len(shape) == 1:
        return [((), 1, shape[0])]
    lead = shape[:-2]
    return [(idx, shape[-2], shape[-1]) for idx in np.ndindex(*lead)] if lead else [((), *shape)]


def draw_mesh(shape_or_devices, axis_names=None, highlight_axis=None, values=None, *,
              title=None, ax=None):
    """Draw a mesh of devices as a grid of boxes; return the matplotlib Figure.

    ``shape_or_devices``: a device count (1-D), a shape tuple such as ``(2, 4)`` (device
    ids numbered row-major), or an array of device ids or devices (e.g.
    ``simpmd.platform().device_grid()``). ``axis_names`` name the mesh axes, outer to
    inner (the last axis runs along a row). ``highlight_axis`` (a name or tuple of names)
    colours the groups a collective over that axis would form. ``values`` puts text in
    the boxes: a dict from device id to value, or a sequence in row-major mesh order;
    strings are shown as they are, arrays as numbers when small, else dtype and shape.

    Meshes of three or more axes are drawn as 2-D slices side by side, one per index of
    the leading axes. Each device box is tagged ``simpmd:device:<id>``.
    """
    ids, carried = _device_grid(shape_or_devices)
    shape = ids.shape
    axis_names = _checked_names(axis_names, carried, shape, ids)
    flat_ids = ids.ravel()
    text = _value_text(values, flat_ids)
    groups, n_groups = (None, 0)
    if highlight_axis is not None:
        groups, n_groups = mesh_groups(shape, highlight_axis, axis_names)
    frame = _Frame(shape)
    fig, ax = figure_and_axes(ax, frame.total_w * frame.scale, frame.total_h * frame.scale)
    boxes = {}
    for s, (lead, nr, nc) in enumerate(frame.slices):
        ox, oy = frame.origin(s)
        if lead:
            label = ", ".join(f"{axis_names[k]}={i}" for k, i in enumerate(lead))
            ax.text(ox + frame.slice_w / 2 - GAP / 2, oy + 0.85, label, ha="center",
                    va="bottom", fontsize=frame.fs, color=INK, fontweight="bold")
        for r in range(nr):
            if frame.starts is not None and frame.starts[r] is None:
                _elided_row(ax, frame, ox, oy, r)
                continue
            for c in range(nc):
                flat = frame.position(lead, r, c)
                if flat is not None:
                    boxes[flat] = _device_box(ax, frame, ox + c * (BOX + GAP),
                                              oy - r * (BOX + GAP) - BOX, int(flat_ids[flat]),
                                              text.get(flat, "") if text else None,
                                              None if groups is None else (int(groups[flat]), n_groups))
        _axis_labels(ax, shape, axis_names, ox, oy, nr, nc, frame.fs, frame.starts, flat_ids)
    if groups is not None:
        _group_outlines(ax, groups, n_groups, boxes)
    if title is None:
        title = _mesh_title(shape, axis_names, ids.size, highlight_axis, n_groups)
    ax.text(frame.margin_left - GAP, 0.2, title, ha="left", va="top",
            fontsize=max(frame.fs * 1.05, 9.0), color=INK)
    ax.set_xlim(0, frame.total_w)
    ax.set_ylim(-frame.total_h + 0.5, 0.5)
    ax.set_aspect("equal", adjustable="box")
    ax.set_axis_off()
    return fig


def _checked_names(axis_names, carried, shape, ids) -> tuple:
    if axis_names is None:
        axis_names = carried or tuple(f"axis {k}" for k in range(len(shape)))
    axis_names = (axis_names,) if isinstance(axis_names, str) else tuple(axis_names)
    if len(axis_names) != len(shape):
        raise ValueError(f"the mesh has {len(shape)} axes {shape} but {len(axis_names)} axis "
                         f"name(s) were given: {axis_names}; give one name per axis")
    if ids.size == 0:
        raise ValueError("draw_mesh: the mesh has no devices")
    return axis_names


class _Frame:
    """Where a mesh's 2-D slices go on the figure, and how large it is drawn."""

    def __init__(self, shape):
        self.shape, self.slices = shape, _slices(shape)
        rows, cols = self.slices[0][1], self.slices[0][2]
        self.slice_w, self.slice_h = cols * (BOX + GAP), rows * (BOX + GAP)
        n = len(self.slices)
        per_row = max(1, min(n, math.ceil(math.sqrt(n * self.slice_h / max(self.slice_w, 1e-9)))))
        self.per_row = n if n <= 4 else per_row
        self.gap_y = SLICE_GAP if len(shape) > 2 else 0
        self.margin_left, self.margin_top = 1.3, 1.5
        self.total_w = self.margin_left + self.per_row * (self.slice_w + SLICE_GAP)
        self.total_h = (self.margin_top + math.ceil(n / self.per_row) * (self.slice_h + self.gap_y)
                        + 0.9)
        self.scale = min(0.85, 11.0 / self.total_w, 9.0 / self.total_h)
        self.fs = float(np.clip(self.scale * 13 * BOX, MIN_FONT, 12))
        wrapped = len(shape) == 1 and shape[0] > WRAP
        self.starts = _wrapped_rows(shape[0])[0] if wrapped else None

    def origin(self, s):
        return (self.margin_left + (s % self.per_row) * (self.slice_w + SLICE_GAP),
                -(self.margin_top + (s // self.per_row) * (self.slice_h + self.gap_y)))

    def position(self, lead, r, c):
        """The row-major index of the device drawn at row ``r``, column ``c`` of a slice
        (None past the end of a wrapped 1-D mesh)."""
        if self.starts is not None:
            if self.starts[r] + c >= self.shape[0]:
                return None
            pos = (self.starts[r] + c,)
        else:
            pos = (*lead, r, c) if len(self.shape) > 1 else (c,)
        return int(np.ravel_multi_index(pos, self.shape))


def _elided_row(ax, frame, ox, oy, r):
    skipped = _wrapped_rows(frame.shape[0])[1]
    first, last = frame.starts[r - 1] + WRAP, frame.starts[r + 1] - 1
    note = ax.text(ox, oy - r * (BOX + GAP) - BOX / 2,
                   f"⋮   {skipped} rows not drawn: devices {first} to {last}",
                   ha="left", va="center", fontsize=frame.fs, color=INK, style="italic")
    tag(note, "elided", skipped * WRAP)


def _device_box(ax, frame, x, y, device, words, group):
    """One device's box at (x, y): its id, and ``words`` (what it holds) when given,
    coloured by its ``group`` (index, count) when a collective's groups are shown."""
    fs, face, edge = frame.fs, (0.96, 0.96, 0.96), INK
    if group is not None:
        face, edge = tint(device_color(*group), 0.35), device_color(*group)
    box = Rectangle((x, y), BOX, BOX, facecolor=face, edgecolor=edge, linewidth=1.2)
    tag(box, "device", device)
    ax.add_patch(box)
    if words is None:
        ax.text(x + BOX / 2, y + BOX * 0.5, str(device), ha="center", va="center",
                fontsize=fs * 1.2, fontweight="bold", color=INK)
        return x, y
    # the device small at the top, what it holds large below
    ax.text(x + 0.06, y + BOX - 0.06, f"device {device}", ha="left", va="top",
            fontsize=max(fs * 0.62, MIN_FONT), color=INK)
    lines = words.count("\n") + 1
    width = max((len(w) for w in words.split("\n")), default=1)
    size = min(fs * 1.1, fs * 0.62 * 3 / lines, fs * 0.62 * 11 / max(width, 1))
    ax.text(x + BOX / 2, y + BOX * 0.4, words, ha="center", va="center",
            fontsize=max(size, MIN_FONT), color=INK, family="monospace", linespacing=1.1)
    return x, y


def _mesh_title(shape, axis_names, size, highlight_axis, n_groups) -> str:
    dims = " x ".join(f"{n}={s}" for n, s in zip(axis_names, shape))
    title = f"mesh {dims} ({size} devices)"
    if highlight_axis is not None:
        over = highlight_axis if isinstance(highlight_axis, str) else tuple(highlight_axis)
        title += (f"\na collective over {over!r} runs in {n_groups} group"
                  f"{'s' if n_groups > 1 else ''} of {size // n_groups}")
    return title


def _value_text(values, flat_ids):
    if values is None:
        return {}
    if isinstance(values, dict):
        where = {int(d): k for k, d in enumerate(flat_ids)}
        return {where[int(d)]: short(v) for d, v in values.items() if int(d) in where}
    values = list(values)
    if len(values) != len(flat_ids):
        raise ValueError(f"values has {len(values)} entries but the mesh has {len(flat_ids)} "
                         f"devices; give one per device (row-major) or a dict by device id")
    return {k: short(v) for k, v in enumerate(values)}


def _axis_labels(ax, shape, axis_names, ox, oy, nr, nc, fs, starts=None, flat_ids=None):
    """Axis names along the top (the inner axis) and the left (the next one out). Index
    numbers are left out where they would only repeat the device ids in the boxes."""
    inner = axis_names[-1]
    right = ox + nc * (BOX + GAP) - GAP
    ax.annotate("", xy=(right, oy + 0.45), xytext=(ox, oy + 0.45),
                arrowprops=dict(arrowstyle="->", color=INK, lw=1))
    name = inner + (f"   ({WRAP} per row, continuing on the next)" if starts else "")
    ax.text(ox, oy + 0.55, name, ha="left", va="bottom", fontsize=fs, color=INK, style="italic")
    if starts:
        for r, first in enumerate(starts):
            if first is not None:
                ax.text(ox - 0.12, oy - r * (BOX + GAP) - BOX / 2, f"{inner}={first}",
                        ha="right", va="center", fontsize=max(fs * 0.8, MIN_FONT), color=INK)
        return
    same = len(shape) == 1 and list(flat_ids) == list(range(len(flat_ids)))
    for c in range(nc if not same else 0):
        tag(ax.text(ox + c * (BOX + GAP) + BOX / 2, oy + 0.12, str(c), ha="center", va="bottom",
                    fontsize=max(fs * 0.8, MIN_FONT), color=INK), "column-index", c)
    if len(shape) > 1:
        outer = axis_names[-2]
        bottom = oy - nr * (BOX + GAP) + GAP
        ax.annotate("", xy=(ox - 0.45, bottom), xytext=(ox - 0.45, oy),
                    arrowprops=dict(arrowstyle="->", color=INK, lw=1))
        ax.text(ox - 0.55, (oy + bottom) / 2, outer, ha="right", va="center", fontsize=fs,
                color=INK, style="italic", rotation=90)
        for r in range(nr):
            tag(ax.text(ox - 0.12, oy - r * (BOX + GAP) - BOX / 2, str(r), ha="right",
                        va="center", fontsize=max(fs * 0.8, MIN_FONT), color=INK), "row-index", r)


def _group_outlines(ax, groups, n_groups, boxes):
    """A rounded outline around each group's boxes that form a rectangle in one slice."""
    pad = GAP * 0.38
    for g in range(n_groups):
        members = [boxes[k] for k in sorted(boxes) if groups[k] == g]
        xs = sorted({x for x, _ in members})
        ys = sorted({y for _, y in members})
        if len(members) != len(xs) * len(ys) or len(members) < 2:
            continue
        x0, y0 = xs[0], ys[0]
        w = xs[-1] + BOX - x0
        h = ys[-1] + BOX - y0
        if w > (len(xs) - 1) * (BOX + GAP) + BOX + 1e-9 or h > (len(ys) - 1) * (BOX + GAP) + BOX + 1e-9:
            continue                       # spread over several slices: colour alone shows it
        outline = FancyBboxPatch((x0 - pad, y0 - pad), w + 2 * pad, h + 2 * pad,
                                 boxstyle="round,pad=0,rounding_size=0.12", fill=False,
                                 edgecolor=device_color(g, n_groups), linewidth=2.4)
        tag(outline, "group", g)
        ax.add_patch(outline)


def draw_trace_mesh(trace, highlight_axis=None, values=None, *, title=None, ax=None):
    """Draw the mesh a run used, read from its events' coordinates; return the Figure.

    The grid comes from the device programs' ``coords`` (``(axis name, index, size)``
    tuples, outer to inner), so a nested pmap over ``data`` then ``model`` draws as a
    ``data x model`` grid. ``highlight_axis`` colours the groups over an axis (``'auto'``:
    the axes of the run's first collective). ``values`` is ``'received'`` (each device's
    first received shard), ``'returned'`` (its first returned leaf), or as in
    :func:`draw_mesh`.
    """
    where = {}
    for e in trace.events:
        if e.device is not None and e.coords:
            where.setdefault(e.device, e.coords)
    if not where:
        raise ValueError("draw_trace_mesh: the trace has no events of simulated devices to place")
    first = next(iter(where.values()))
    names = tuple(n for n, _, _ in first)
    shape = tuple(s for _, _, s in first)
    grid = np.full(shape, -1, dtype=int)
    for device, coords in where.items():
        if tuple(n for n, _, _ in coords) != names:
            raise ValueError(f"draw_trace_mesh: devices disagree on the mesh axes ({names} vs "
                             f"{tuple(n for n, _, _ in coords)}); draw one pmap level at a time")
        grid[tuple(i for _, i, _ in coords)] = device
    if (grid < 0).any():
        raise ValueError("draw_trace_mesh: the run left some mesh positions without a device")
    if highlight_axis == "auto":
        calls = [c for c in trace.calls() if c[0].device is not None]
        axes = tuple(calls[0][0].axes) if calls else ()
        highlight_axis = (axes[0] if len(axes) == 1 else axes) or None
    if isinstance(values, str):
        needs_values(trace, f"draw_trace_mesh(values={values!r})")
        kind = {"received": "receive", "returned": "return"}.get(values)
        if kind is None:
            raise ValueError(f"values={values!r}: choose 'received', 'returned', a dict or a list")
        found = {}
        for e in trace.events:
            if e.kind == kind and e.device is not None and e.device not in found:
                found[e.device] = (e.inputs or e.outputs)[0]
        values = found
    return draw_mesh(grid, names, highlight_axis, values, title=title, ax=ax)
