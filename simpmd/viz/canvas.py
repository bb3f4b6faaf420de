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

DPI = 150        # at least 150 dpi, so that 7 pt text is legible on screen and paper
MIN_FONT = 7.0   # no text is drawn smaller than this (points)
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

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The PNG at 150 dpi, shown at the size a 100 dpi image would take (sharp on
        high-resolution screens, no larger on the page)."""
        data = self._repr_png_()
        width, height = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
        shown = {"width": round(width * 100 / DPI), "height": round(height * 100 / DPI)}
        return {"image/png": data}, {"image/png": shown}


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


# Okabe & Ito's colour-blind-safe palette ("Color Universal Design", 2008,
# https://jfly.uni-koeln.de/color/): orange, sky blue, bluish green, yellow, blue,
# vermillion, reddish purple, black. Every pair stays distinct under deuteranopia,
# protanopia and tritanopia, which tab10's green and red (pieces 2 and 3) do not.
OKABE_ITO = [to_rgb(c) for c in ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2",
                                 "#D55E00", "#CC79A7", "#000000")]
SUM_FACE = (0.87, 0.87, 0.87)      # combined from every member: light grey, hatched
_RAMP = colormaps["cividis"]       # beyond 8 members: a colour-blind-safe ramp


@functools.lru_cache(maxsize=8192)
def device_color(k: int, p: int):
    """The colour of member ``k`` of ``p``: Okabe-Ito hues up to 8, a cividis ramp beyond
    (where the drawings also write the member's number, since neighbours look alike)."""
    if k == SUM:
        return GREY
    if k == ZERO:
        return (1.0, 1.0, 1.0)
    if p <= len(OKABE_ITO):
        return OKABE_ITO[k % len(OKABE_ITO)]
    return to_rgb(_RAMP(0.05 + 0.9 * k / max(p - 1, 1)))


def face_color(k: int, p: int):
    """The fill of a cell that came from member ``k`` of ``p``: its colour, lightened so
    that black numbers stay readable; white for ZERO, light grey for SUM."""
    if k == SUM:
        return SUM_FACE
    if k == ZERO:
        return (1.0, 1.0, 1.0)
    color = device_color(k, p)
    return tint(color, 0.4 if max(color) < 0.2 else 0.55)    # black: a mid grey, not dark


def tint(color, amount: float):
    """``color`` mixed with white: amount 0 is white, 1 the colour itself."""
    r, g, b = to_rgb(color)
    return (1 - amount + amount * r, 1 - amount + amount * g, 1 - amount + amount * b)


def number(x) -> str:
    """A number as short text: ``6``, ``0.5``, ``2.333``, ``1.2e+06``, ``True``; a string
    (a label such as ``13→0``) as it is."""
    x = np.asarray(x).item() if np.ndim(x) == 0 else x
    if isinstance(x, str):
        return x
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


def elide(items, most: int):
    """What a drawing shows of ``items`` when there are more than ``most``: the first
    ``most - 4`` and the last 2, with ``None`` standing for the middle (drawn as a note
    that says how many were left out); and the elided items themselves. Below 6, the
    first and the last only (``most=2``: two rows and the note between them)."""
    if most is None or len(items) <= most:
        return list(items), []
    if most < 2:
        raise ValueError(f"max_rows={most}: a drawing shows at least 2 rows (the first and the last)")
    head, tail = (most - 4, 2) if most >= 6 else (1, 1)
    return list(items[:head]) + [None] + list(items[-tail:]), list(items[head:-tail])


def font_size(row_inches: float, largest: float = 9.0, smallest: float = MIN_FONT) -> float:
    """A font size that fits a row ``row_inches`` tall, never below the 7 pt floor."""
    return float(np.clip(row_inches * 26, smallest, largest))
