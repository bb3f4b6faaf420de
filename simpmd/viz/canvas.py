"""What every drawing shares: a fresh figure, device colours, numbers as text, and tags.

Drawings are made on a :class:`Drawing` (a matplotlib ``Figure`` with its own Agg
canvas), not through ``pyplot``: nothing is left open in pyplot's registry, a notebook
shows the returned figure exactly once, and the same code runs headless in tests.
"""
from __future__ import annotations

import functools
import io

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

DPI = 100
TAG = "simpmd"
SUM = -1          # a cell that holds a combination of every member's values
ZERO = -2         # a cell nobody sent anything to (ppermute fills it with zeros)
GREY = (0.62, 0.62, 0.62)
INK = (0.15, 0.15, 0.15)


class Drawing(Figure):
    """A matplotlib Figure that shows itself in Jupyter without pyplot."""

    def _repr_png_(self):
        buffer = io.BytesIO()
        self.savefig(buffer, format="png", bbox_inches="tight")
        return buffer.getvalue()


def new_figure(width: float, height: float) -> Drawing:
    fig = Drawing(figsize=(width, height), dpi=DPI)
    FigureCanvasAgg(fig)
    return fig


def figure_and_axes(ax, width: float, height: float):
    """Draw into ``ax`` when given (its figure is returned), else into a new figure."""
    if ax is not None:
        return ax.figure, ax
    fig = new_figure(width, height)
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    ax.set_axis_off()
    return fig, ax


def tag(artist, role: str, name) -> None:
    """Label an artist so that tests (and curious users) can find it: ``simpmd:role:name``."""
    artist.set_gid(f"{TAG}:{role}:{name}")


def tagged(fig, role: str | None = None) -> list:
    """Every artist of ``fig`` tagged by simpmd (with ``role``, e.g. ``'device'``), in drawing order."""
    prefix = f"{TAG}:" if role is None else f"{TAG}:{role}:"
    return [a for a in fig.findobj(lambda a: (a.get_gid() or "").startswith(prefix))]


# tab10 and tab20 without their greys, which mean "combined from everyone" here
_FEW = [to_rgb(colormaps["tab10"](i)) for i in (0, 1, 2, 3, 4, 5, 6, 8, 9)]
_SOME = [to_rgb(colormaps["tab20"](i)) for i in range(20) if i not in (14, 15)]


_TURBO = colormaps["turbo"]


@functools.lru_cache(maxsize=8192)
def device_color(k: int, p: int):
    """The colour of member ``k`` of ``p``: distinct hues up to 18, a smooth ramp beyond."""
    if k == SUM:
        return GREY
    if k == ZERO:
        return (1.0, 1.0, 1.0)
    if p <= len(_FEW):
        return _FEW[k % len(_FEW)]
    if p <= len(_SOME):
        return _SOME[k % len(_SOME)]
    return to_rgb(_TURBO(0.08 + 0.84 * k / max(p - 1, 1)))


def tint(color, amount: float):
    """``color`` mixed with white: amount 0 is white, 1 the colour itself."""
    r, g, b = to_rgb(color)
    return (1 - amount + amount * r, 1 - amount + amount * g, 1 - amount + amount * b)


def number(x) -> str:
    """A number as short text: ``6``, ``0.5``, ``2.333``, ``1.2e+06``, ``True``."""
    x = np.asarray(x).item() if np.ndim(x) == 0 else x
    if isinstance(x, (bool, np.bool_)):
        return "T" if x else "F"
    if isinstance(x, (int, np.integer)):
        return str(int(x)) if abs(int(x)) < 100000 else f"{float(x):.2g}"
    if isinstance(x, complex):
        return f"{x.real:.3g}{x.imag:+.3g}j"
    x = float(x)
    if not np.isfinite(x):
        return str(x)
    if x != 0 and not 1e-3 <= abs(x) < 1e5:
        return f"{x:.2g}"
    return np.format_float_positional(x, precision=3, trim="-")


def dtype_shape(value) -> str:
    """``float32[4,2]``: what a shard is, in the notation of JAX's error messages."""
    a = np.asarray(value)
    return f"{a.dtype}[{','.join(map(str, a.shape))}]"


def short(value, limit: int = 4) -> str:
    """A value as box text: a few numbers when small, else its dtype and shape."""
    if isinstance(value, str):
        return value
    a = np.asarray(value)
    if a.size <= limit and a.dtype.kind in "biufc":
        if a.ndim == 0:
            return number(a)
        return "[" + " ".join(number(v) for v in a.ravel()) + "]"
    return dtype_shape(a)


def font_size(row_inches: float, largest: float = 9.0, smallest: float = 4.0) -> float:
    """A font size that fits a row ``row_inches`` tall."""
    return float(np.clip(row_inches * 26, smallest, largest))
