"""``python -m simpmd.course.figures [--out figures]``: draw every figure the README and the course show.

Each figure comes from a real simpmd run (or a run of ``simpmd.algorithms``) on the
default 8 simulated devices, so the pictures always match what the code does. Output is
deterministic: the same code gives the same bytes (PNG metadata carries no software
version or date, and nothing random is drawn), so regenerating ``figures/`` only changes
files whose picture changed.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

import simpmd
from simpmd import algorithms, lax
import simpmd.numpy as snp
from simpmd import viz

DPI = 150                  # with the drawings' 7 pt floor, the smallest text is ~15 px high
GIF_DPI = 200              # the README's animation: 2x the 100 dpi it had, about 920 px wide
RING_DEVICES = 4           # 4 devices keep every piece's label readable in the frames


# -- the runs ---------------------------------------------------------------------------------
# One small program per collective. Values are small integers chosen so that the numbers in
# the boxes tell the story: device i holds i (or 10 i + k), so every sum can be checked by eye.

def psum_run():
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(16.0).reshape(8, 2))                           # device i holds [2i, 2i+1]
    return f.trace


def all_gather_run():
    f = simpmd.pmap(lambda x: lax.all_gather(x, "i"), axis_name="i")
    f(np.arange(8.0))                                          # device i holds i
    return f.trace


def psum_scatter_run():
    f = simpmd.pmap(lambda x: lax.psum_scatter(x, "i"), axis_name="i")
    f(np.arange(8.0)[:, None] + np.arange(8.0))                 # device i holds i + [0..7]
    return f.trace


def ppermute_run():
    shift = [(i, (i + 1) % 8) for i in range(8)]
    f = simpmd.pmap(lambda x: lax.ppermute(x, "i", perm=shift), axis_name="i")
    f(np.arange(8.0) * 10)                                     # device i holds 10 i
    return f.trace


def all_to_all_run():
    f = simpmd.pmap(lambda x: lax.all_to_all(x, "i", 0, 0), axis_name="i")
    f(10 * np.arange(8.0)[:, None] + np.arange(8.0))            # block k of device i is 10 i + k
    return f.trace


def nested_run():
    """The tour's 2x2 grid: psum over the inner 'model' axis, then over the outer 'data' axis."""
    def inner(x, p):
        return lax.psum(x * p, "model") * 2

    def outer(x, p):
        return lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data")

    g = simpmd.pmap(outer, axis_name="data")
    g(np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5))
    return g.trace


def training_step_run():
    """One step of a data-parallel layer: gather the weights, compute, pass activations on,
    average the gradients. 4 MiB of activations per device."""
    ring = [(i, (i + 1) % 8) for i in range(8)]

    def step(w, x):
        w_full = lax.all_gather(w, "i", tiled=True)
        h = lax.ppermute(x * w_full.mean(), "i", perm=ring)
        return lax.pmean(h, "i")

    f = simpmd.pmap(step, axis_name="i")
    f(np.ones((8, 1 << 16), np.float32), np.ones((8, 1 << 20), np.float32))
    return f.trace


def grad_step_run():
    """One FSDP training step: the sharded weights are all-gathered in the forward pass,
    their gradients reduce-scattered in the backward pass; the replicated bias's gradient
    is all-reduced (pmean) after. Device i holds weight i + 1."""

    def step(w_row, b, x):
        def loss(w_row, b):
            w = lax.all_gather(w_row, "i", tiled=True)           # (8,) from (1,) each
            return ((snp.dot(x, w) + b) ** 2).sum()
        g_w, g_b = simpmd.grad(loss, argnums=(0, 1))(w_row, b)
        return w_row - 0.01 * g_w, b - 0.01 * lax.pmean(g_b, "i")

    f = simpmd.pmap(step, axis_name="i", in_axes=(0, None, 0))
    # device d's batch selects weight d: its full gradient is 2 (d + 1) at position d only
    f(np.arange(1.0, 9.0, dtype=np.float32).reshape(8, 1), np.zeros(1, np.float32),
      np.eye(8, dtype=np.float32)[:, None, :])
    return f.trace


def _ring_run():
    return algorithms.ring_all_reduce([np.full(RING_DEVICES, float(d + 1)) for d in range(RING_DEVICES)])


# -- the figures ------------------------------------------------------------------------------

def _mesh_figure():
    from simpmd.viz import draw_mesh  # optional: matplotlib
    from simpmd.viz.canvas import new_figure  # optional: matplotlib
    fig = new_figure(12.0, 4.2)
    for k, axis in enumerate(("model", "data")):
        ax = fig.add_axes((k / 2, 0.0, 0.5, 1.0))
        draw_mesh((2, 4), ("data", "model"), highlight_axis=axis, ax=ax,
                  title=f"psum over {axis!r}: the {'rows' if axis == 'model' else 'columns'} "
                        f"are its groups")
    return fig


def _figures():
    """Name -> a function drawing that figure (PNG) or writing that file (GIF)."""
    return {
        "mesh_2x4.png": _mesh_figure,
        "psum.png": lambda: viz.draw_collective(psum_run(), 0),
        "all_gather.png": lambda: viz.draw_collective(all_gather_run(), 0),
        "psum_scatter.png": lambda: viz.draw_collective(psum_scatter_run(), 0),
        "ppermute.png": lambda: viz.draw_collective(ppermute_run(), 0),
        "all_to_all.png": lambda: viz.draw_collective(all_to_all_run(), 0),
        "nested_2x2.png": lambda: viz.draw_trace(nested_run()),
        "timeline.png": lambda: viz.draw_timeline(
            training_step_run(), "TPU v4", slowdown={5: 2.0},
            title="one training step on 8 TPU v4 chips: device 5 computes twice as slowly "
                  "(compute: the roofline of each segment of the traced program)"),
        "grad_step.png": lambda: viz.draw_trace(grad_step_run()),
        "ring_allreduce.png": lambda: viz.draw_algorithm(_ring_run()),
        "tree_allreduce.png": lambda: viz.draw_algorithm(
            algorithms.tree_all_reduce([np.full(4, float(d + 1)) for d in range(8)])),
        "torus_allreduce.png": lambda: viz.draw_algorithm(
            algorithms.torus_all_reduce([np.full(8, float(d + 1)) for d in range(8)], (2, 4)),
            frames=[0, 1, 2, 3, 4, 6]),
    }


def save_png(fig, path) -> None:
    """Save without the metadata that would change between runs (software version, date)."""
    fig.savefig(path, dpi=DPI, bbox_inches="tight", pad_inches=0.15, facecolor="white",
                metadata={"Software": None})


def build(out="figures") -> list:
    """Write every figure into ``out``; return the paths written, in order."""
    out = pathlib.Path(out)
    out.mkdir(parents=True, exist_ok=True)
    before = simpmd.platform()
    simpmd.set_device_count(8, hardware="TPU v4")
    written = []
    try:
        for name, draw in _figures().items():
            path = out / name
            save_png(draw(), path)
            written.append(path)
        gif = out / "ring_allreduce.gif"
        viz.save_algorithm_gif(_ring_run(), gif, fps=1.0, dpi=GIF_DPI, hold=2)
        written.append(gif)
    finally:
        simpmd.set_device_count(len(before.devices), hardware=before.hardware,
                                topology=before.topology)
    return written


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simpmd.course.figures",
                                     description="Regenerate the figures of the README and the course.")
    parser.add_argument("--out", default="figures", help="folder to write into (default: figures)")
    args = parser.parse_args(argv)
    paths = build(args.out)
    total = 0
    for path in paths:
        size = path.stat().st_size
        total += size
        print(f"{size / 1024:8.1f} KiB  {path}")
    print(f"{total / 1024:8.1f} KiB  in {len(paths)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
