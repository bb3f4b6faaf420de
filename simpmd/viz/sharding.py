"""Pictures of shardings: which simulated device holds which block of a global array.

``draw_sharding((8, 8), mesh, P('data', 'model'))`` draws the array as a grid of blocks,
each labelled with the ids of the devices that hold it (several ids when the block is
replicated), the way ``jax.debug.visualize_array_sharding`` prints a jax.Array.
``draw_sharding(result)`` draws the layout of a ``shard_map`` or ``pmap`` result.
``sharding_text`` gives the same picture as text. (To draw a mesh itself, with its axis
names and the groups of a collective, use ``simpmd.viz.draw_mesh(mesh)``.) matplotlib is
imported only when drawing.
"""
from __future__ import annotations

import numpy as np

from ..machine.mesh import Mesh, NamedSharding, PartitionSpec


def sharding_blocks(shape_or_array, mesh: Mesh | None = None, spec: PartitionSpec | None = None):
    """The layout as plain data: ``(shape, {block: [device ids]})`` where a block is a
    tuple of ``(start, stop)`` per dimension, in the array's index space."""
    if mesh is None and spec is None:
        array = shape_or_array
        shape = tuple(np.shape(array))
        pairs = [(s.device, s.index) for s in array.addressable_shards]
    else:
        if mesh is None or spec is None:
            raise TypeError("give a shape, a mesh and a spec (draw_sharding((8, 8), mesh, "
                            "P('data'))), or a single result array")
        shape = tuple(shape_or_array) if not hasattr(shape_or_array, "shape") \
            else tuple(shape_or_array.shape)
        pairs = list(NamedSharding(mesh, spec).devices_indices_map(shape).items())
    blocks: dict = {}
    for device, index in pairs:
        key = tuple(sl.indices(n)[:2] for sl, n in zip(index, shape))
        blocks.setdefault(key, []).append(device.id)
    return shape, blocks


def _as_2d(shape, blocks):
    """Rows and columns of the picture: a 1-D array is one row; a scalar one cell."""
    if len(shape) > 2:
        raise ValueError(f"draw_sharding draws 1-D and 2-D arrays; this one has shape {shape}. "
                         f"Draw a 2-D slice's layout, e.g. shape[:2] with the spec's first "
                         f"two entries.")
    out = {}
    for key, ids in blocks.items():
        if len(shape) == 0:
            key2 = ((0, 1), (0, 1))
        elif len(shape) == 1:
            key2 = ((0, 1), key[0])
        else:
            key2 = key
        out[key2] = ids
    rows = shape[0] if len(shape) == 2 else 1
    cols = shape[-1] if len(shape) >= 1 else 1
    return rows, cols, out


def _label(ids) -> str:
    ids = sorted(ids)
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def sharding_text(shape_or_array, mesh=None, spec=None, width: int = 8) -> str:
    """The layout as a text grid, one cell per block, listing the devices that hold it."""
    shape, blocks = sharding_blocks(shape_or_array, mesh, spec)
    _, _, cells = _as_2d(shape, blocks)
    row_edges = sorted({k[0] for k in cells})
    col_edges = sorted({k[1] for k in cells})
    labels = {k: _label(v) for k, v in cells.items()}
    w = max(width, max(len(s) for s in labels.values()) + 2)
    line = "+" + "+".join("-" * w for _ in col_edges) + "+"
    out = [line]
    for r in row_edges:
        out.append("|" + "|".join(labels[(r, c)].center(w) for c in col_edges) + "|")
        out.append(line)
    title = f"shape {shape}" + (f", {spec!r} on {mesh!r}" if spec is not None else "")
    return title + "\n" + "\n".join(out)


def draw_sharding(shape_or_array, mesh=None, spec=None, *, ax=None, title=None):
    """Draw a 1-D or 2-D global array as blocks labelled with the devices holding them.

    Call as ``draw_sharding((8, 8), mesh, P('data', 'model'))`` or ``draw_sharding(result)``
    for a ``shard_map``/``pmap`` result. Returns the matplotlib Axes.
    """
    import matplotlib.pyplot as plt  # optional: matplotlib
    from matplotlib.patches import Rectangle

    shape, blocks = sharding_blocks(shape_or_array, mesh, spec)
    rows, cols, cells = _as_2d(shape, blocks)
    if ax is None:
        aspect = rows / cols if cols else 1
        _, ax = plt.subplots(figsize=(5, max(1.2, min(5, 5 * aspect))))
    from .canvas import OKABE_ITO, tint  # optional: matplotlib
    groups = sorted({tuple(sorted(v)) for v in cells.values()})
    for (r, c), ids in sorted(cells.items()):
        # Okabe-Ito hues, lightened so the labels stay readable (safe for colour-blind readers)
        color = tint(OKABE_ITO[groups.index(tuple(sorted(ids))) % len(OKABE_ITO)], 0.45)
        ax.add_patch(Rectangle((c[0], r[0]), c[1] - c[0], r[1] - r[0], facecolor=color,
                               edgecolor="black", linewidth=1.5))
        word = "device" if len(ids) == 1 else "devices"
        ax.text((c[0] + c[1]) / 2, (r[0] + r[1]) / 2, f"{word}\n{_label(ids)}",
                ha="center", va="center", fontsize=9)
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)              # row 0 at the top, as the array prints
    ax.set_aspect("auto")
    ax.set_xticks(sorted({c[0] for _, c in cells} | {cols}))
    ax.set_yticks(sorted({r[0] for r, _ in cells} | {rows}) if len(shape) == 2 else [])
    ax.tick_params(labelsize=8)
    if title is None:
        sharding = getattr(shape_or_array, "sharding", None) if spec is None else None
        spec_text = repr(spec) if spec is not None else repr(getattr(sharding, "spec", sharding))
        title = f"{shape} as {spec_text}"
    ax.set_title(title, fontsize=10)
    ax.figure.tight_layout()
    return ax
