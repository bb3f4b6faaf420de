"""A mesh drawn with its hosts: which process drives each device, and whether the groups
of a collective over an axis stay inside hosts or cross them.

Each host is a shaded frame around its devices (a host's devices that do not sit side by
side in the mesh get one frame each); with ``highlight_axis`` the boxes are coloured by
the collective's groups, as in :func:`simpmd.viz.draw_mesh`, and the title says whether
the groups cross hosts (their data then leaves the host, over the slower network).
"""
from __future__ import annotations

import numpy as np
from matplotlib.patches import FancyBboxPatch

from .canvas import tag, tagged
from .mesh import BOX, _device_grid, draw_mesh, mesh_groups

HOST_FILL = (0.90, 0.90, 0.93)
HOST_EDGE = (0.2, 0.2, 0.3)


def _process_of(mesh):
    """Each device's process, shaped like the mesh."""
    devices = np.asarray(getattr(mesh, "devices", mesh), dtype=object)
    return np.vectorize(lambda d: int(getattr(d, "process_index", 0)), otypes=[int])(devices)


def _runs(positions):
    """Split (row, col) cells into blocks that sit side by side: rectangles of the grid."""
    cells = sorted(positions)
    blocks = []
    while cells:
        r0, c0 = cells[0]
        c1 = c0
        while (r0, c1 + 1) in cells:
            c1 += 1
        r1 = r0
        while all((r1 + 1, c) in cells for c in range(c0, c1 + 1)):
            r1 += 1
        block = {(r, c) for r in range(r0, r1 + 1) for c in range(c0, c1 + 1)}
        blocks.append((r0, c0, r1, c1))
        cells = [x for x in cells if x not in block]
    return blocks


def crossing_axes(mesh) -> dict:
    """{axis name: True if a collective over it joins devices of different processes}."""
    owners = _process_of(mesh)
    names = tuple(mesh.axis_names)
    out = {}
    for name in names:
        groups, n = mesh_groups(owners.shape, name, names)
        flat = owners.ravel()
        out[name] = any(len(set(flat[groups == g])) > 1 for g in range(n))
    return out


def draw_hosts(mesh, highlight_axis=None, *, title=None, ax=None):
    """Draw ``mesh`` (a 1-D or 2-D ``simpmd.Mesh``) with a frame around each host's
    devices, the process written in each box; ``highlight_axis`` colours the groups of a
    collective over that axis. Returns the Figure."""
    ids, _ = _device_grid(mesh)
    if ids.ndim > 2:
        raise ValueError("draw_hosts draws meshes of one or two axes")
    owners = _process_of(mesh)
    values = {int(i): f"host {p}" for i, p in zip(ids.ravel(), owners.ravel())}
    if title is None:
        dims = " x ".join(f"{n}={s}" for n, s in mesh.shape.items())
        title = f"mesh {dims} over {len(set(owners.ravel()))} hosts"
        if highlight_axis is not None:
            crosses = crossing_axes(mesh)
            axes = (highlight_axis,) if isinstance(highlight_axis, str) else highlight_axis
            across = any(crosses[a] for a in axes)
            title += (f"\na collective over {highlight_axis!r} "
                      f"{'crosses hosts' if across else 'stays inside each host'}")
    fig = draw_mesh(mesh, values=values, highlight_axis=highlight_axis, title=title, ax=ax)
    axes_ = fig.axes[0] if ax is None else ax
    corner = {}
    for box in tagged(fig, "device"):
        corner[int(box.get_gid().rsplit(":", 1)[1])] = box.get_xy()
    grid_ids = ids.reshape(ids.shape[0], -1) if ids.ndim == 2 else ids.reshape(1, -1)
    grid_owner = owners.reshape(grid_ids.shape)
    for p in sorted(set(grid_owner.ravel())):
        cells = {(r, c) for r, c in zip(*np.nonzero(grid_owner == p))}
        for r0, c0, r1, c1 in _runs(cells):
            x0, y_top = corner[int(grid_ids[r0, c0])]
            x1, y1 = corner[int(grid_ids[r1, c1])]
            pad = 0.11
            where = ((x0 - pad, y1 - pad), x1 - x0 + BOX + 2 * pad, y_top - y1 + BOX + 2 * pad)
            fill = FancyBboxPatch(*where, boxstyle="round,pad=0.02", facecolor=HOST_FILL,
                                  edgecolor="none", zorder=0.5)
            edge = FancyBboxPatch(*where, boxstyle="round,pad=0.02", facecolor="none",
                                  edgecolor=HOST_EDGE, linewidth=2.2, linestyle=(0, (4, 2)),
                                  zorder=5)
            tag(edge, "host", p)
            axes_.add_patch(fill)
            axes_.add_patch(edge)
    _clear_of_frames(fig, pad + 0.02)
    return fig


def _clear_of_frames(fig, margin):
    """Move the mesh's row and column indices out past the host frames (``margin`` beyond
    the device boxes), where the dashed border would otherwise run through them."""
    for label in tagged(fig, "row-index"):
        x, y = label.get_position()
        label.set_position((x - margin - 0.04, y))
    for label in tagged(fig, "column-index"):
        x, y = label.get_position()
        label.set_position((x, y + margin))


__all__ = ["crossing_axes", "draw_hosts"]
