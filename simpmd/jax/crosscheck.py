"""``simpmd.crosscheck``: run one function on simpmd and on real JAX, and compare.

The course's promise is that what simpmd shows is what JAX does. ``crosscheck(f, x,
axis_name='i')`` runs ``simpmd.pmap(f)`` and ``jax.pmap(f)`` on the same arguments (the
body is written once with ``simpmd.lax`` and ``simpmd.numpy``, which hand over to JAX
inside a JAX trace) and returns a :class:`CrossCheckReport`: per engine, the devices, the
output shapes, the largest difference and a verdict; where they differ, which output
leaf and which device's shard.

Three things need more than "run both":

* **Nested pmap.** Today's JAX rejects a ``jax.pmap`` inside another. A nested simpmd
  program is run on JAX in its modern spellings: the inner ``simpmd.pmap`` becomes
  ``jax.vmap(..., axis_name=...)`` inside the outer ``jax.pmap`` (what JAX's pmap
  migration guide suggests), and, separately, the whole program becomes a
  ``jax.shard_map`` over a 2-D ``Mesh`` (which can also express collectives over both
  axes at once). :func:`simpmd.jax.handoff.pmap_inside_jax` does the translation.
* **Known JAX bugs.** JAX before 0.11 cannot compile negative ``split_axis``,
  ``concat_axis``, ``scatter_dimension`` and ``pswapaxes`` axes (jax 0.10 sometimes
  aborts the whole process), so on those releases crosscheck looks for them in simpmd's
  trace and hands JAX the same axes counted from the front, saying so in a note that
  starts "On this JAX (version):"; a negative axis that still reaches the jaxpr (traced
  without compiling) keeps JAX from running. Negative ``in_axes``/``out_axes``, wrong on
  every release tested, always reach JAX counted from the front.
* **Float widths.** NumPy computes in float64 by default, JAX in float32: values are
  compared with a tolerance that fits the narrower dtype. The first report of a session
  says so in a note; later ones leave that note out while it reads the same (their dtype
  columns still show the widths), and repeat it when the values differ or the tolerance
  was chosen by hand.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import functools
import html
import io
import itertools
import os
import re
import sys
from typing import Any

import numpy as np

from ..core import collectives as K
from ..core import errors
from ..api import tree
from ..machine.array import Array
from ..machine.devices import device_count
from .devices import JaxDevicesError, chosen_devices, use_jax_devices
from .handoff import (Translation, find_shard_map, shard_map_on_jax, translating,
                     _per_arg_axes, _static_split)
from ..api.pmap import Pmapped, pmap as simpmd_pmap
from ..api.shard_map import ShardMapped
from ..api.jit import Jitted
from .. import api
from .jit import hlo_collective_counts, jax_mesh, type_text
from ..machine.mesh import AxisType, axis_types_of

# Collective parameters that jax < 0.11 cannot lower when negative (0.10 may abort the
# process): the rows' lax keywords, under the rows' names, simpmd's and lax's (trace events,
# and JAX's jaxprs, which name reduce_scatter so too).
NEGATIVE_AXIS_CRASHES = {name: axes for row, axes in (
    (K.all_to_all, ("split_axis", "concat_axis")), (K.reduce_scatter, ("scatter_dimension",)))
    for name in (row.name, row.op)}
NEGATIVE_AXIS_CRASHES["pswapaxes"] = ("axis",)      # (jax's own primitive; simpmd's is all_to_all)
FIXED_IN = (0, 11)          # (for the notes; whether this JAX has the bug is asked of it)
# The JAX releases the course is tested on (scripts/test_matrix.sh), for notes about bugs
# that all of them share.
CHECKED_VERSIONS = "0.7.2, 0.10.2 and 0.12.0.1"


# -- the report ----------------------------------------------------------------------------

AGREE = ("match", "both refused")


@dataclass
class EngineRun:
    """One engine's run of the program, and how it compares with simpmd's."""

    engine: str                          # 'simpmd.pmap', 'jax.pmap', 'jax.pmap + jax.vmap', ...
    devices: str = ""                    # '8 simulated', '8 CPU', '2x4 CPU mesh'
    outputs: Any = None                  # the result tree, leaves as NumPy arrays
    error: BaseException | None = None
    not_run: str = ""                    # why JAX was not run, if it was not
    verdict: str = ""
    max_abs_diff: float | None = None
    within_tolerance: bool = True
    differences: list = field(default_factory=list)
    optional: bool = False               # a translation that may not express every program

    @property
    def ran(self) -> bool:
        return not self.not_run

    def outputs_text(self, limit: int = 3) -> str:
        if self.not_run:
            return "-"
        if self.error is not None:
            if self.engine.startswith("jax"):   # its kind of error changes between releases
                return "refused"
            shown = getattr(self.error, "original", None) or self.error   # simpmd's DeviceError
            return f"raised {type(shown).__name__}"
        leaves = tree.flatten(self.outputs)[0]
        shown = [_shape_text(v) for v in leaves[:limit]]
        if len(leaves) > limit:
            shown.append(f"+{len(leaves) - limit} more")
        return ", ".join(shown) if shown else "(no arrays)"

    def diff_text(self) -> str:
        if self.max_abs_diff is None:
            return "-"
        if self.within_tolerance:     # "0" or not depends on the CPU's last bits: not shown
            return "within tol"
        return f"{self.max_abs_diff:.3g}"


class CrossCheckReport:
    """What :func:`crosscheck` found. ``ok`` says whether the engines agree; ``print`` or
    Jupyter shows a small table; :meth:`assert_match` raises with the differences."""

    def __init__(self, name, runs, notes):
        self.name = name
        self.runs: list[EngineRun] = runs
        self.notes: list[str] = notes

    @property
    def simpmd(self) -> EngineRun:
        return self.runs[0]

    @property
    def jax(self) -> list[EngineRun]:
        return self.runs[1:]

    @property
    def checked(self) -> bool:
        """True if JAX ran at least once (False when a known JAX bug kept it from running)."""
        return any(r.ran for r in self.jax)

    @property
    def ok(self) -> bool:
        """simpmd and JAX agree: on the outputs, or on refusing the program."""
        ran = [r for r in self.jax if r.ran]
        agreeing = [r for r in ran if r.verdict in AGREE]
        if not agreeing:
            return False
        # A translation that JAX refuses (pmap-of-vmap cannot express every nested
        # program) is tolerated when another translation agrees; nothing else is.
        return all(r.verdict in AGREE or (r.optional and r.verdict == "JAX refused")
                   for r in ran)

    @property
    def explained(self) -> str | None:
        """Why the engines may differ here, when the difference is understood, else None.

        Three cases are: JAX was kept from running by a known crash of the installed
        version; a known JAX bug gives a different value; or simpmd caught a divergence
        (devices of a group calling different collectives because of per-device Python
        state), which JAX cannot see because it traces the body once for all devices.
        """
        if self.ok:
            return None
        if not self.checked and any("known bug" in r.not_run for r in self.jax):
            return "known JAX bug kept JAX from running"
        if any("known JAX bug" in n for n in self.notes):
            return "known JAX bug"
        if isinstance(self.simpmd.error, (errors.DivergenceError, errors.DeadlockError)):
            return "simpmd caught a divergence that JAX's single trace cannot see"
        return None

    def headline(self) -> str:
        if self.ok and all(r.verdict.startswith("both refused") for r in self.jax if r.ran):
            return f"crosscheck of {self.name}: simpmd and JAX both refuse this program"
        if self.ok:
            return f"crosscheck of {self.name}: simpmd and JAX agree"
        if not self.checked:
            why = " (see below)" if self.details() else ""
            return f"crosscheck of {self.name}: not checked against JAX{why}"
        return f"crosscheck of {self.name}: simpmd and JAX DISAGREE"

    def assert_match(self):
        """Raise AssertionError (showing the whole report) unless the engines agree."""
        if not self.ok:
            raise AssertionError(str(self))
        return self

    # -- showing ------------------------------------------------------------------------
    _COLUMNS = ("engine", "devices", "outputs", "max |diff|", "verdict")

    def rows(self) -> list[tuple]:
        return [(r.engine, r.devices or "-", r.outputs_text(), r.diff_text(), r.verdict)
                for r in self.runs]

    def details(self) -> list[str]:
        """Errors, differences and notes, one line each, in the order the text shows them."""
        lines = []
        for r in self.runs:
            if r.error is not None and r.engine.startswith("jax"):
                # JAX's words change between releases: on a line the course's tests leave out
                version = getattr(sys.modules.get("jax"), "__version__", "?")
                lines.append(f"On this JAX ({version}): {r.engine} raised {_error_text(r.error)}")
            elif r.error is not None:
                lines.append(f"{r.engine} raised {_error_text(r.error)}")
            if r.not_run:
                lines.append(f"{r.engine}: not run on JAX: {r.not_run}")
            for d in r.differences:
                lines.append(f"{r.engine} vs simpmd: {d}")
        return lines + list(self.notes)

    def __str__(self):
        rows = [self._COLUMNS] + self.rows()
        widths = [max(len(row[i]) for row in rows) for i in range(len(self._COLUMNS))]
        lines = [self.headline()]
        for k, row in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if k == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        lines += [f"  - {d}" for d in self.details()]
        return "\n".join(lines)

    __repr__ = __str__

    def _repr_html_(self):
        esc = html.escape
        head = "".join(f"<th style='text-align:left'>{esc(c)}</th>" for c in self._COLUMNS)
        body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(c)}</td>" for c in row)
                       + "</tr>" for row in self.rows())
        colour = "#1a7f37" if self.ok else ("#9a6700" if not self.checked else "#cf222e")
        items = "".join(f"<li>{esc(d)}</li>" for d in self.details())
        return (f"<div><b style='color:{colour}'>{esc(self.headline())}</b>"
                f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
                + (f"<ul>{items}</ul>" if items else "") + "</div>")


def _shape_text(v) -> str:
    a = np.asarray(v)
    return f"{a.dtype}[{','.join(map(str, a.shape))}]"


def _error_text(exc: BaseException, limit: int = 240) -> str:
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    message = re.sub(r" at 0x[0-9a-fA-F]+", "", message)
    if len(message) > limit:
        message = message[:limit - 3] + "..."
    return f"{type(exc).__name__}: {message}"


# -- comparing ------------------------------------------------------------------------------

def _tolerance(dtypes, rtol, atol):
    """(rtol, atol) that fit the narrowest float among ``dtypes``, unless given."""
    floats = [np.dtype(d) for d in dtypes if np.dtype(d).kind in "fc"]
    bits = min((d.itemsize * 8 // (2 if d.kind == "c" else 1) for d in floats), default=64)
    auto = 1e-2 if bits <= 16 else (1e-5 if bits <= 32 else 1e-9)
    return (auto if rtol is None else rtol), (auto if atol is None else atol)


def _kind(dtype) -> str:
    k = np.dtype(dtype).kind
    return "int" if k in "iu" else {"b": "bool", "f": "float", "c": "complex"}.get(k, k)


def _compare(sim: EngineRun, other: EngineRun, leaf_axes, shard_label, rtol, atol, widths):
    """Fill in ``other``'s verdict, largest difference and differing leaves/shards."""
    if other.not_run:
        other.verdict = "not run"
        return
    if sim.error is not None or other.error is not None:
        if sim.error is not None and other.error is not None:
            other.verdict = "both refused"     # with which errors: see the report's details
        else:
            other.verdict = "JAX refused" if other.error is not None else "simpmd refused"
        return
    s_leaves, s_def = tree.flatten(sim.outputs)
    o_leaves, o_def = tree.flatten(other.outputs)
    if s_def != o_def:
        other.verdict = "mismatch"
        other.differences.append(f"result structure {o_def} where simpmd has {s_def}")
        return
    paths = tree.leaf_paths(sim.outputs, "out")
    worst, within = 0.0, True
    for path, s, o, ax in zip(paths, s_leaves, o_leaves, leaf_axes):
        s, o = np.asarray(s), np.asarray(o)
        if s.shape != o.shape:
            other.differences.append(f"{path}: shape {o.shape} where simpmd has {s.shape}")
            within = False
            continue
        if _kind(s.dtype) != _kind(o.dtype):
            other.differences.append(f"{path}: dtype {o.dtype} where simpmd has {s.dtype}")
            within = False
            continue
        if _kind(s.dtype) in ("float", "complex"):
            widths.add((str(s.dtype), str(o.dtype)))
            r, a = _tolerance([s.dtype, o.dtype], rtol, atol)
            s64, o64 = s.astype(np.complex128 if s.dtype.kind == "c" else np.float64), \
                o.astype(np.complex128 if o.dtype.kind == "c" else np.float64)
            close = np.isclose(s64, o64, rtol=r, atol=a, equal_nan=True)
            diff = np.abs(s64 - o64)
        else:
            close = s == o
            diff = np.abs(s.astype(np.float64) - o.astype(np.float64))
        finite = diff[np.isfinite(diff)]
        if finite.size:
            worst = max(worst, float(finite.max()))
        if not close.all():
            within = False
            other.differences.append(_where_different(path, s, o, close, ax, shard_label))
    other.max_abs_diff = worst
    other.within_tolerance = within
    other.verdict = "match" if within else "mismatch"


def _where_different(path, s, o, close, ax, shard_label, limit=4) -> str:
    first = tuple(int(i) for i in np.argwhere(~close)[0])
    values = f"simpmd {_value_text(s[first])}, JAX {_value_text(o[first])}"
    at = f"first at {list(first)}: {values}" if s.ndim else values
    if ax is None:
        where = "(replicated output)"
    else:
        bad = np.moveaxis(~close, ax, 0).reshape(close.shape[ax], -1).any(axis=1)
        shards = [shard_label(i) for i in np.flatnonzero(bad)]
        shown = ", ".join(shards[:limit]) + (f" and {len(shards) - limit} more" if len(shards) > limit else "")
        where = f"differs on {shown}"
    return f"{path} {where}; {at}"


def _value_text(v) -> str:
    v = np.asarray(v)
    if v.dtype.kind == "f":
        return np.format_float_positional(float(v), precision=6, unique=True, trim="0")
    return str(v.item())


_NOTES_SAID: set[str] = set()           # the said-once notes this Python process has printed
_FLOAT_NOTES_SAID = _NOTES_SAID


def _once(key: str, note: str) -> str | None:
    """``note`` the first time this process meets ``key``, marked as said once; then None.

    Explanations that do not change from one report to the next (how a nested pmap was
    translated for JAX) are read once: under every report of a lesson they are noise.
    """
    if key in _NOTES_SAID:
        return None
    _NOTES_SAID.add(key)
    return note[:-1] + " (said once: later reports leave this note out)."


def _float_note(widths, rtol, atol, *, agreed: bool = True) -> str | None:
    """The note on float widths and tolerance, or None where it would only repeat itself.

    A lesson makes dozens of reports; the same sentence under each is noise. So a note is
    given the first time this process meets it, and again only when the values differ or
    ``rtol``/``atol`` were chosen by hand, where the tolerance is part of the answer.
    """
    note = _float_note_text(widths, rtol, atol)
    if note is None or not agreed or rtol is not None or atol is not None:
        return note
    if note in _FLOAT_NOTES_SAID:
        return None
    _FLOAT_NOTES_SAID.add(note)
    return note[:-1] + " (said once: later reports leave this note out while it holds)."


def _float_note_text(widths, rtol, atol) -> str | None:
    if not widths:
        return None
    sim_w = sorted({s for s, _ in widths})
    jax_w = sorted({j for _, j in widths})
    tols = sorted({_tolerance([s, j], rtol, atol) for s, j in widths})
    tol_text = "; ".join(f"rtol={r:g}, atol={a:g}" for r, a in tols)
    if sim_w == jax_w:
        return f"both engines computed in {'/'.join(sim_w)}; compared at {tol_text}."
    return (f"simpmd computed in {'/'.join(sim_w)}, JAX in {'/'.join(jax_w)}; "
            f"compared at {tol_text}.")


# -- running --------------------------------------------------------------------------------

def _device_text(devices) -> str:
    if not devices:
        return "-"
    platform = getattr(devices[0], "platform", "?")
    label = {"cpu": "CPU", "tpu": "TPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU"}.get(
        platform, str(platform).upper())
    return f"{len(devices)} {label}"


def _negative_axes_in_trace(trace) -> list[str]:
    found = []
    for e in (trace.events if trace is not None else ()):
        if e.kind == "collective":
            for p in NEGATIVE_AXIS_CRASHES.get(e.op, ()):
                v = e.params.get(p)
                if isinstance(v, (int, np.integer)) and v < 0:
                    found.append(f"{e.op}({p}={int(v)})")
    return sorted(set(found))


def _negative_axes_in_jaxpr(jaxpr) -> list[str]:
    """Collectives with negative axis parameters anywhere in a (closed) jaxpr."""
    found, seen = [], set()

    def walk(j):
        j = getattr(j, "jaxpr", j)
        if id(j) in seen or not hasattr(j, "eqns"):
            return
        seen.add(id(j))
        for eqn in j.eqns:
            name = getattr(eqn.primitive, "name", "")
            for p in NEGATIVE_AXIS_CRASHES.get(name, ()):
                v = eqn.params.get(p)
                if isinstance(v, (int, np.integer)) and v < 0:
                    found.append(f"{name}({p}={int(v)})")
            for v in eqn.params.values():
                for sub in (v if isinstance(v, (tuple, list)) else (v,)):
                    walk(sub)

    walk(jaxpr)
    return sorted(set(found))


def _has_negative(axes) -> bool:
    return any(isinstance(a, (int, np.integer)) and a < 0 for a in tree.flatten(axes)[0])


def _non_negative_in_axes(in_axes, args, static):
    """``in_axes`` with every leaf's axis counted from the front (one tree per argument)."""
    per_arg = _per_arg_axes(in_axes, len(args))
    out = []
    for i, a in enumerate(args):
        if i in static:
            out.append(None)
            continue
        leaves, td = tree.flatten(a)
        axes = tree.broadcast_prefix(per_arg[i], a)
        out.append(tree.unflatten(td, [None if ax is None else int(ax) % max(np.ndim(v), 1)
                                       for v, ax in zip(leaves, axes)]))
    return tuple(out)


def _leaf_out_axes(out_axes, outputs):
    """One non-negative mapped axis (or None) per leaf of simpmd's stacked outputs."""
    leaves = tree.flatten(outputs)[0]
    axes = tree.broadcast_prefix(out_axes, outputs, what="out_axes")
    return [None if ax is None else int(ax) % max(np.ndim(v), 1) for v, ax in zip(leaves, axes)]


def _grid_from_trace(trace):
    """((outer name, size), (inner name, size)) for a two-level nested run, else None."""
    shapes = {tuple((n, s) for n, _, s in e.coords)
              for e in (trace.events if trace is not None else ()) if e.device is not None}
    if len(shapes) == 1:
        (shape,) = shapes
        if len(shape) == 2:
            return shape
    return None


def _to_numpy(value):
    return tree.tree_map(lambda v: np.asarray(v), value)


def _dry_trace_then_run(jax, program, args, guard_negative, static=()):
    """Trace ``program`` to a jaxpr (no compiling), refuse known crashes, then run it."""
    with quiet_jax():
        jaxpr = jax.make_jaxpr(program, static_argnums=tuple(sorted(static)))(*args)
        if guard_negative:
            bad = _negative_axes_in_jaxpr(jaxpr)
            if bad:
                return None, bad
        return _to_numpy(program(*args)), []


@contextlib.contextmanager
def quiet_jax():
    """Within the block, what JAX prints is kept from the notebook: some releases print the
    source line of a sharding error on stdout as they raise it (jax 0.12), others do not,
    and a report must read the same on all of them."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _axes_for_jax(jax, in_axes, out_axes, args, static, sim, notes):
    """``in_axes``/``out_axes`` for jax.pmap: negative axes counted from the front instead."""
    jax_in_axes, jax_out_axes = in_axes, out_axes
    try:
        if _has_negative(in_axes):
            jax_in_axes = _non_negative_in_axes(in_axes, args, static)
        if _has_negative(out_axes) and sim.outputs is not None:
            treedef = tree.flatten(sim.outputs)[1]
            jax_out_axes = tree.unflatten(treedef, _leaf_out_axes(out_axes, sim.outputs))
    except Exception:                  # malformed axes: JAX will say so itself
        return in_axes, out_axes
    changed = [f"{k}={v!r}" for k, v, j in (("in_axes", in_axes, jax_in_axes),
                                             ("out_axes", out_axes, jax_out_axes)) if v is not j]
    if changed:
        notes.append(f"{', '.join(changed)} given to JAX counted from the front, the same "
                     f"axes: jax.pmap mishandles negative in_axes/out_axes (an error, or a "
                     f"result of the wrong shape; seen on jax {CHECKED_VERSIONS}).")
    return jax_in_axes, jax_out_axes


@contextlib.contextmanager
def _collective_axes_from_front(jax):
    """Within the block, ``jax.lax``'s all_to_all, psum_scatter and pswapaxes take negative
    axes counted from the end, as their documentation allows, by passing JAX the same axes
    counted from the front: releases before 0.11 cannot compile negative ones."""
    lax, tree_map = jax.lax, jax.tree_util.tree_map
    originals = {name: getattr(lax, name) for name in ("all_to_all", "psum_scatter", "pswapaxes")}

    def front(axis, leaf):
        return axis + leaf.ndim if isinstance(axis, int) and axis < 0 else axis

    def all_to_all(x, axis_name, split_axis, concat_axis, **kw):
        return tree_map(lambda v: originals["all_to_all"](
            v, axis_name, front(split_axis, v), front(concat_axis, v), **kw), x)

    def psum_scatter(x, axis_name, *, scatter_dimension=0, **kw):
        return tree_map(lambda v: originals["psum_scatter"](
            v, axis_name, scatter_dimension=front(scatter_dimension, v), **kw), x)

    def pswapaxes(x, axis_name, axis, **kw):
        return tree_map(lambda v: originals["pswapaxes"](v, axis_name, front(axis, v), **kw), x)

    for name, f in (("all_to_all", all_to_all), ("psum_scatter", psum_scatter),
                    ("pswapaxes", pswapaxes)):
        setattr(lax, name, f)
    try:
        yield
    finally:
        for name, f in originals.items():
            setattr(lax, name, f)


@functools.lru_cache(maxsize=None)
def negative_axes_fail(jax) -> bool:
    """Whether this JAX fails to lower a collective given a negative axis (a
    ``scatter_dimension``, ``split_axis``/``concat_axis``, ``pswapaxes``' axis: fixed together
    in jax 0.11), found once per process by compiling a ``psum_scatter`` over the last
    dimension on one CPU device (the host's, beside any accelerator: the verifier is
    XLA's own, and a CPU compile cannot take an accelerator's process down)."""
    from jax.sharding import Mesh, PartitionSpec as JP  # optional: JAX
    shard_map, check = find_shard_map(jax)
    mesh = Mesh(np.array(jax.devices("cpu")[:1]), ("i",))
    scatter = shard_map(lambda x: jax.lax.psum_scatter(x, "i", scatter_dimension=-1,
                                                       tiled=True),
                        mesh=mesh, in_specs=JP(), out_specs=JP(),
                        **{check or "check_vma": False})
    try:
        jax.jit(scatter).lower(np.ones((2, 2), np.float32)).compile()
        return False
    except Exception:                         # the verifier refuses the negative dimension
        return True


def _crash_reason(jax, found) -> str:
    return (f"known bug in jax {jax.__version__} (negative axis crashes the compiler; "
            f"fixed in 0.{FIXED_IN[1]}): {', '.join(found)}. Use the same axis counted from "
            f"the front to check this program on JAX.")


def crosscheck(fun, *args, axis_name=None, in_axes=0, out_axes=0, static_broadcasted_argnums=(),
               rtol=None, atol=None) -> CrossCheckReport:
    """Run ``fun`` with ``simpmd.pmap`` and with ``jax.pmap`` and compare the results.

    Same arguments as ``jax.pmap`` plus the call's positional arguments. ``rtol``/``atol``
    override the tolerance, which otherwise fits the narrower float dtype of each output.
    JAX runs on the devices chosen by :func:`simpmd.use_jax_devices` (called here with
    enough devices if it was not called before). A nested program (a ``simpmd.pmap``
    inside the body) runs on JAX as ``jax.pmap`` over ``jax.vmap`` and as
    ``jax.shard_map`` over a 2-D mesh. Never raises for the program's own errors: they
    are part of the report.
    """
    if isinstance(fun, ShardMapped):
        return _crosscheck_shard_map(fun, args, rtol, atol)
    if isinstance(fun, Jitted):
        return _crosscheck_jit(fun, args, rtol, atol)
    if isinstance(fun, Pmapped):
        raise TypeError("crosscheck takes the function itself, not a simpmd.pmap of it: "
                        "crosscheck(f, x, axis_name='i') maps f on both engines.")
    name = getattr(fun, "__name__", type(fun).__name__)
    static, _ = _static_split(static_broadcasted_argnums, len(args))
    notes: list[str] = []
    sim, trace, size, grid = _pmap_on_simpmd(fun, args, axis_name, in_axes, out_axes,
                                             static_broadcasted_argnums)
    runs = [sim]
    first = EngineRun("jax.pmap")
    runs.append(first)
    devices = _jax_devices_for(sim, first, grid, size, rtol, atol)
    if devices is None:
        return _logged(CrossCheckReport(name, runs, notes))
    import jax  # optional: JAX
    guard = negative_axes_fail(jax)
    # Known crashes: negative collective axes reach an old JAX counted from the front.
    found = _negative_axes_in_trace(trace) if guard else []
    if found:
        notes.append(f"On this JAX ({jax.__version__}): negative collective axes fail to "
                     f"compile (fixed in jax 0.{FIXED_IN[1]}), so crosscheck gave JAX the same "
                     f"axes counted from the front: {', '.join(found)}.")
    axes_from_front = (lambda: _collective_axes_from_front(jax)) if found else contextlib.nullcontext
    # Negative in_axes/out_axes reach JAX as the same axes counted from the front.
    jax_in_axes, jax_out_axes = _axes_for_jax(jax, in_axes, out_axes, args, static, sim, notes)
    jax_args = tuple(a if i in static else tree.tree_map(_plain_leaf, a) for i, a in enumerate(args))
    inner = _pmap_on_jax(jax, first, fun, jax_args, axis_name, (jax_in_axes, jax_out_axes),
                         static_broadcasted_argnums, devices, size, guard, axes_from_front)
    nested = bool(inner) or grid is not None
    if nested:         # also as jax.shard_map over a 2-D mesh
        _note_vmap(first, inner, grid, notes)
        with axes_from_front():
            runs.append(_run_on_mesh(jax, fun, jax_args, axis_name, jax_in_axes, out_axes, static,
                                     grid, inner, size, sim, notes, guard, use_jax_devices,
                                     device_count))
    _compare_pmap_runs(runs, out_axes, grid if nested else None, axis_name, nested, rtol, atol,
                       notes, trace)
    return _logged(CrossCheckReport(name, runs, notes))


def _pmap_on_simpmd(fun, args, axis_name, in_axes, out_axes, static_broadcasted_argnums):
    """simpmd first (its trace shows what the program does before JAX compiles it): the
    run, its trace, the mapped size, and a nested program's grid of axes."""
    mapped = simpmd_pmap(fun, axis_name, in_axes=in_axes, out_axes=out_axes,
                         static_broadcasted_argnums=static_broadcasted_argnums)
    sim = EngineRun("simpmd.pmap", verdict="reference")
    try:
        sim.outputs = _to_numpy(mapped(*args))
    except Exception as exc:           # the program's own error is part of the report
        sim.error = exc
    trace = mapped.trace if sim.error is None else getattr(sim.error, "trace", None)
    try:
        size = mapped.mapped_size(*args)
    except Exception:
        size = None
    grid = _grid_from_trace(trace)
    sim_count = len({e.device for e in trace.events if e.device is not None}) if trace else 0
    if grid:
        sim.devices = f"{grid[0][1]}x{grid[1][1]} simulated"
    elif sim_count or size:
        sim.devices = f"{sim_count or size} simulated"
    return sim, trace, size, grid


def _jax_devices_for(sim, first, grid, size, rtol, atol):
    """The JAX devices to run on, or None (``first`` then says why JAX did not run)."""
    needed = (grid[0][1] * grid[1][1]) if grid else (size or 1)
    devices = chosen_devices()
    try:
        if "jax" not in sys.modules or devices is None or len(devices) < needed:
            devices = use_jax_devices(max(needed, device_count()))
    except ImportError as exc:
        first.not_run = f"jax is not installed ({exc})"
        _compare(sim, first, [], str, rtol, atol, set())
        return None
    except JaxDevicesError as exc:
        # The outer pmap may still fit on the devices there are (a mesh needs more).
        devices = chosen_devices() or []
        # When simpmd refused the program (say, a mapped size above the device count),
        # JAX runs on the devices it has, to show its own refusal.
        if len(devices) < (size or 1) and (sim.error is None or not devices):
            first.not_run = str(exc)
            _compare(sim, first, [], str, rtol, atol, set())
            return None
    return devices


def _pmap_on_jax(jax, first, fun, jax_args, axis_name, axes, static_broadcasted_argnums,
                 devices, size, guard, axes_from_front):
    """jax.pmap, nested simpmd.pmap calls as jax.vmap; returns those inner calls."""
    static, _ = _static_split(static_broadcasted_argnums, len(jax_args))
    pmap_devices = list(devices[:size]) if size else None
    program = jax.pmap(fun, axis_name, in_axes=axes[0], out_axes=axes[1],
                       static_broadcasted_argnums=static_broadcasted_argnums,
                       devices=pmap_devices,
                       backend=None if pmap_devices else getattr(devices[0], "platform", None))
    first.devices = _device_text(pmap_devices or devices)
    with axes_from_front(), translating(Translation("vmap")) as vmap_translation:
        try:
            first.outputs, bad = _dry_trace_then_run(jax, program, jax_args, guard, static)
            if bad:
                first.not_run = _crash_reason(jax, bad)
        except Exception as exc:
            first.error = exc
    return sorted({c for c in vmap_translation.calls}, key=repr)


def _note_vmap(first, inner, grid, notes):
    first.engine = "jax.pmap + jax.vmap"
    first.optional = True
    inner_name = inner[0][0] if inner else grid[1][0]
    note = _once("nested pmap as vmap", (
        f"nested pmap: today's JAX no longer runs a jax.pmap inside "
        f"another, so the inner simpmd.pmap(..., axis_name={inner_name!r}) ran as "
        f"jax.vmap(..., axis_name={inner_name!r}) inside the outer jax.pmap (as JAX's "
        f"pmap migration guide suggests)."))
    if note:
        notes.append(note)


def _compare_pmap_runs(runs, out_axes, grid, axis_name, nested, rtol, atol, notes, trace):
    """Each JAX run against simpmd's, shard by shard, and the notes that explain them."""
    sim, leaf_axes = runs[0], []
    if sim.outputs is not None:
        try:
            leaf_axes = _leaf_out_axes(out_axes, sim.outputs)
        except Exception:
            leaf_axes = [None] * len(tree.flatten(sim.outputs)[0])
    outer = grid[0][0] if grid else axis_name
    shard_label = (lambda i: f"{outer}={i}") if nested else (lambda i: f"device {i}")
    widths: set = set()
    for r in runs[1:]:
        _compare(sim, r, leaf_axes, shard_label, rtol, atol, widths)
    agreed = not any(r.verdict == "mismatch" for r in runs[1:])
    note = _float_note(widths, rtol, atol, agreed=agreed)
    if note:
        notes.append(note)
    for r in runs[1:]:
        if r.verdict == "JAX refused" and r.optional and any(o.verdict in AGREE for o in runs[1:]):
            notes.append(f"{r.engine} cannot express this program (JAX refused it); the other "
                         "translation agrees with simpmd.")
    notes += _engine_mixing_hints(sim, runs[1:])
    if _has_unequal_pmean(trace) and any(r.verdict == "mismatch" for r in runs[1:]):
        notes.append("pmean with axis_index_groups of unequal sizes: JAX divides every "
                     "group's sum by the size of the first group (a known JAX bug, seen on "
                     f"jax {CHECKED_VERSIONS}); simpmd divides by each group's own size.")


def _crosscheck_shard_map(program, args, rtol, atol) -> CrossCheckReport:
    """A ``simpmd.shard_map`` program against ``jax.shard_map`` over a JAX mesh of the same
    shape (see :func:`simpmd.shard_map.on_jax`); the values are compared whole."""

    mesh = program.mesh
    shape = "x".join(str(n) for n in mesh.devices.shape)
    name = getattr(program.fun, "__name__", "shard_map program")
    sim = EngineRun("simpmd.shard_map", devices=f"{shape} simulated mesh", verdict="reference")
    try:
        sim.outputs = _to_numpy(program(*args))
    except Exception as exc:
        sim.error = exc
    other = EngineRun("jax.shard_map")
    runs, notes, widths = [sim, other], [], set()
    try:
        devices = chosen_devices()
        if "jax" not in sys.modules or devices is None or len(devices) < mesh.size:
            devices = use_jax_devices(max(mesh.size, 8))
        devices = list(devices[:mesh.size])
        other.devices = f"{shape} {_device_text(devices).split()[-1]} mesh"
        if program.eager:
            other.not_run = "made with eager=True: real JAX cannot trace Python control flow on values"
        else:
            try:
                with quiet_jax():
                    on_jax = shard_map_on_jax(program, devices=devices)
                    if _all_arrays(program, args):      # compiled once, as jax.jit runs it
                        import jax  # optional: JAX
                        on_jax = jax.jit(on_jax)
                    other.outputs = _to_numpy(on_jax(*args))
            except Exception as exc:
                other.error = exc
    except (ImportError, JaxDevicesError) as exc:
        other.not_run = str(exc)
    leaves = tree.flatten(sim.outputs)[0] if sim.error is None else []
    _compare(sim, other, [None] * len(leaves), str, rtol, atol, widths)
    note = _float_note(widths, rtol, atol, agreed=other.verdict != "mismatch")
    if note:
        notes.append(note)
    return _logged(CrossCheckReport(name, runs, notes))


def _all_arrays(program, args) -> bool:
    """True when every argument is split by a spec (none is passed through as static)."""
    try:
        specs = tree.broadcast_prefix(program.in_specs, tuple(args), what="in_specs")
    except ValueError:
        return False
    return all(s is not None for s in specs)


def _crosscheck_jit(jitted, args, rtol, atol) -> CrossCheckReport:
    """A ``simpmd.jit`` program against ``jax.jit`` on a mesh of the same shape and axis
    types, its arguments placed as simpmd's are: the values, the result types, and the
    kinds of collectives, simpmd's inserted ones against those in XLA's compiled HLO."""
    J = api.jit
    name = getattr(jitted.fun, "__name__", "jit program")
    mesh = J._mesh_of(tree.flatten(args)[0])
    shape = "x".join(str(n) for n in mesh.devices.shape) or "1"
    sim = EngineRun("simpmd.jit", devices=f"{shape} simulated mesh", verdict="reference")
    other, notes, widths = EngineRun("jax.jit"), [], set()
    sim_types = kinds = None
    try:
        with J.set_mesh(mesh):                  # as the JAX run below, under jax.set_mesh
            out = jitted(*args)
        sim.outputs = _to_numpy(out)
        sim_types = [str(J.typeof(y)) for y in tree.flatten(out)[0]]
        kinds = set(jitted.trace.collective_counts())
    except Exception as exc:
        sim.error = exc
    try:
        import jax  # optional: JAX
        devices = chosen_devices()
        if devices is None or len(devices) < mesh.size:
            use_jax_devices(max(mesh.size, 8))
        jmesh = jax_mesh(mesh)
        other.devices = f"{shape} {_device_text(jax.devices()).split()[-1]} mesh"
        placed = [jax.device_put(np.asarray(x), jax.sharding.NamedSharding(
            jmesh, J.to_jax_spec(x.sharding.spec))) if isinstance(x, J.ShardedArray) else x
            for x in tree.flatten(args)[0]]
        jargs = tree.unflatten(tree.flatten(args)[1], placed)
        with quiet_jax(), jax.set_mesh(jmesh):
            try:
                jout = jax.jit(jitted.fun)(*jargs)
                other.outputs = _to_numpy(jout)
                hlo = jax.jit(jitted.fun).lower(*jargs).compile().as_text()
                jax_kinds = set(hlo_collective_counts(hlo))
                jax_types = [type_text(y, mesh) for y in jax.tree_util.tree_leaves(jout)]
            except Exception as exc:
                other.error = exc
    except (ImportError, JaxDevicesError) as exc:
        other.not_run = str(exc)
    leaves = tree.flatten(sim.outputs)[0] if sim.error is None else []
    _compare(sim, other, [None] * len(leaves), str, rtol, atol, widths)
    if sim.error is None and other.error is None and not other.not_run:
        if sim_types != jax_types:
            other.verdict = "mismatch"
            other.differences.append(f"result types: simpmd {', '.join(sim_types)}; JAX "
                                     f"{', '.join(jax_types)}")
        else:
            notes.append(f"result types on both: {', '.join(sim_types)}")
        notes.append(_collectives_note(kinds, jax_kinds, mesh))
    note = _float_note(widths, rtol, atol, agreed=other.verdict != "mismatch")
    if note:
        notes.append(note)
    return _logged(CrossCheckReport(name, [sim, other], notes))


def _collectives_note(sim, xla, mesh) -> str:
    text = lambda kinds: ", ".join(sorted(kinds)) or "none"        # noqa: E731
    line = f"collectives: simpmd inserted {text(sim)}; XLA on CPU compiled {text(xla)}"
    if any(t is AxisType.Auto for t in axis_types_of(mesh)):
        return line + " (on Auto axes XLA chooses; simpmd shows none over them)"
    if sim != xla:
        return line + " (the same rule, another route: XLA's choice on this backend)"
    return line


def log_verdict(ok: bool, headline: str, explained: str = "") -> None:
    """Append one cross-check's verdict to $SIMPMD_CROSSCHECK_LOG, when set.

    ``course.sh`` sets it while it runs the notebooks, and prints every cross-check of
    the course at the end (``crosscheck`` and ``crosscheck_processes`` both write here).
    """
    path = os.environ.get("SIMPMD_CROSSCHECK_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            verdict = "ok       " if ok else ("EXPLAINED" if explained else "NOT OK   ")
            reason = f" ({explained})" if explained else ""
            log.write(f"{verdict} {headline}{reason}\n")


def _logged(report: CrossCheckReport) -> CrossCheckReport:
    log_verdict(report.ok, report.headline(), report.explained)
    return report


def _engine_mixing_hints(sim, jax_runs) -> list[str]:
    """Plain-words advice when the body mixed up NumPy and jax.numpy functions."""
    hints = []
    error = getattr(sim.error, "original", None) or sim.error
    text = f"{error} {error.__context__}" if error is not None else ""
    if "StackedValue" in text or "__jax_array__" in text or "simpmd.numpy" in text:
        hints.append("simpmd refused because a jax.numpy (or jax) function was given a simpmd "
                     "device value: call array functions through simpmd.numpy "
                     "(import simpmd.numpy as snp; snp.exp(x)), which picks NumPy on simpmd "
                     "and jax.numpy on JAX.")
    if sim.error is None and any(type(r.error).__name__ == "TracerArrayConversionError"
                                 for r in jax_runs):
        hints.append("JAX refused because a NumPy function (np.exp, np.asarray, ...) was given "
                     "a JAX tracer: call array functions through simpmd.numpy "
                     "(import simpmd.numpy as snp; snp.exp(x)), which picks jax.numpy on JAX.")
    return hints


def _has_unequal_pmean(trace) -> bool:
    sizes = {len(e.group) for e in (trace.events if trace is not None else ())
             if e.kind == "collective" and e.op == "pmean"}
    return len(sizes) > 1


def _plain_leaf(v):
    return np.asarray(v) if isinstance(v, Array) else v


def _run_on_mesh(jax, fun, args, axis_name, in_axes, out_axes, static, grid, inner, size, sim,
                 notes, guard, use_jax_devices, device_count) -> EngineRun:
    """The nested program as one jax.shard_map over a (outer, inner) mesh of devices."""
    run = EngineRun("jax.shard_map", optional=True)
    shard_map, check_kw = find_shard_map(jax)
    axes = _mesh_axes(run, jax, shard_map, grid, inner, axis_name, size)
    if axes is None:
        return run
    (outer_name, outer_size), (inner_name, inner_size) = axes
    count = outer_size * inner_size
    devices = chosen_devices() or []
    if len(devices) < count:
        try:
            devices = use_jax_devices(max(count, device_count()))
        except JaxDevicesError:
            run.not_run = f"the {outer_size}x{inner_size} mesh needs {count} JAX devices"
            return run
    from jax.sharding import Mesh  # optional: JAX
    mesh = Mesh(np.array(devices[:count], dtype=object).reshape(outer_size, inner_size),
                (outer_name, inner_name))
    run.devices = f"{outer_size}x{inner_size} {_device_text(devices[:1]).split(' ', 1)[1]} mesh"
    flat, specs, in_leaf_axes, defs = _mesh_inputs(args, in_axes, static, outer_name)
    placed = _mesh_out_specs(sim, out_axes, outer_name)
    if placed is None:
        run.not_run = "needs simpmd's result to place pytree or negative out_axes"
        return run
    out_leaf_axes, out_specs = placed
    out_def = {}
    body = _mesh_body(fun, args, defs, in_leaf_axes, out_leaf_axes, out_axes, out_def)
    kw = {check_kw: False} if check_kw else {}
    program = shard_map(body, mesh=mesh, in_specs=tuple(specs), out_specs=out_specs, **kw)
    translation = Translation("shard_map", inner_name=grid[1][0] if grid else inner[0][0],
                              inner_size=inner_size, mesh_axis=inner_name)
    with translating(translation):
        try:
            outputs, bad = _dry_trace_then_run(jax, program, flat, guard)
            if bad:
                run.not_run = _crash_reason(jax, bad)
            else:
                run.outputs = tree.unflatten(out_def["treedef"], list(outputs))
        except Exception as exc:
            run.error = exc
    note = _once("nested pmap as shard_map", (
        f"jax.shard_map over a {outer_size}x{inner_size} Mesh ({outer_name!r}, {inner_name!r}): "
        f"each device runs the outer body on its {outer_name!r} slice, and the inner "
        f"simpmd.pmap takes the device's own {inner_name!r} slice, runs the inner body, and "
        f"all_gathers the results over {inner_name!r}. This spelling also expresses what "
        f"pmap-of-vmap cannot (collectives over both axes at once, axis_index_groups or "
        f"psum_scatter on the inner axis)."))
    if note:
        notes.append(note)
    return run


def _mesh_axes(run, jax, shard_map, grid, inner, axis_name, size):
    """((outer name, size), (inner name, size)) of the 2-D mesh, or None (``run`` then
    says why it cannot run)."""
    sizes, names = {s for _, s in inner}, {n for n, _ in inner}
    if grid is not None:
        (outer_name, outer_size), (inner_name, inner_size) = grid
    elif len(names) == 1 and len(sizes) == 1 and size:
        outer_name, outer_size = axis_name, size
        inner_name, inner_size = next(iter(names)), next(iter(sizes))
    else:
        run.not_run = "the nesting is not one outer and one inner axis of fixed sizes"
        return None
    if shard_map is None:
        run.not_run = f"this jax ({jax.__version__}) has no shard_map"
        return None
    if len(names) > 1 or len(sizes) > 1:
        run.not_run = "the body maps more than one inner axis; the mesh has two axes"
        return None
    return (("outer" if outer_name is None else outer_name, outer_size),
            ("inner" if inner_name is None else inner_name, inner_size))


def _mesh_inputs(args, in_axes, static, outer_name):
    """Every leaf of every non-static argument, split along its outer mapped axis: the
    leaves, their specs, their mapped axes, and each argument's (treedef, leaf count)."""
    from jax.sharding import PartitionSpec as P  # optional: JAX
    import jax.numpy as jnp
    per_arg = _per_arg_axes(in_axes, len(args))
    flat, specs, axes, defs = [], [], [], []
    for i, a in enumerate(args):
        if i in static:
            defs.append(None)
            continue
        leaves, td = tree.flatten(a)
        defs.append((td, len(leaves)))
        for leaf, ax in zip(leaves, tree.broadcast_prefix(per_arg[i], a)):
            k = None if ax is None else int(ax) % np.ndim(leaf)
            flat.append(jnp.asarray(leaf) if k is None else np.asarray(leaf))
            specs.append(P() if k is None else P(*([None] * k), outer_name))
            axes.append(k)
    return flat, specs, axes, defs


def _mesh_out_specs(sim, out_axes, outer_name):
    """(each output leaf's axis or None, out_specs): one spec per leaf from simpmd's
    result, or one for all if out_axes is plain; None when neither can say."""
    from jax.sharding import PartitionSpec as P  # optional: JAX
    if sim.outputs is not None:
        leaf_axes = _leaf_out_axes(out_axes, sim.outputs)
        return leaf_axes, tuple(P() if k is None else P(*([None] * k), outer_name)
                                for k in leaf_axes)
    if out_axes is None or (isinstance(out_axes, int) and out_axes >= 0):
        return None, P() if out_axes is None else P(*([None] * out_axes), outer_name)
    return None


def _mesh_body(fun, args, defs, in_leaf_axes, out_leaf_axes, out_axes, out_def):
    """The shard_map body: each block without its outer axis, the function, each result
    given the axis back."""
    import jax.numpy as jnp  # optional: JAX

    def body(*blocks):
        it = iter(zip(blocks, in_leaf_axes))
        full = []
        for i, a in enumerate(args):
            if defs[i] is None:
                full.append(a)
                continue
            td, n = defs[i]
            full.append(tree.unflatten(td, [b if k is None else jnp.squeeze(b, k)
                                            for b, k in itertools.islice(it, n)]))
        leaves, td = tree.flatten(fun(*full))
        out_def["treedef"] = td
        ks = out_leaf_axes or [None if out_axes is None else out_axes] * len(leaves)
        return tuple(jnp.asarray(v) if k is None else jnp.expand_dims(jnp.asarray(v), k)
                     for v, k in zip(leaves, ks))
    return body
