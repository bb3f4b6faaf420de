"""A run: the devices a body runs on, their named axes, and how each operation is computed.

A :class:`Run` is what ``bind`` asks. It holds a grid of devices with named axes (a 2x4
mesh, or the 8 devices of a pmap), counted row-major, and computes an operation for all
of them at once: each operand is a stack of every device's value, and a collective
combines each group's rows in one NumPy call. A run may also be *abstract*: then it
computes types only (how a body is traced, and how a program runs at a real model's size
without values). Collectives leave one record each in the run's log (``log.py``).

While a ``lax.cond`` branch runs, its collectives take part only for the devices that take
the branch; a group split between branches is a deadlock, reported with the devices on
each side (real hardware hangs). A pmap called inside a body adds its axis below the
outer ones (:meth:`Run.nest`): a grid of outer x inner devices, as a 2-D mesh.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from . import bridge, core, errors
from .core import Aval, aval_of, context
from .log import Log
from .values import StackedValue
from .collectives import pvary, settings

def coords_text(coords) -> str:
    """'data=1, model=0'; an unnamed axis (axis_name=None) shows as 'index 1'."""
    return ", ".join(f"index {i}" if n is None else f"{n}={i}" for n, i, _ in coords)

class Run:
    """A grid of devices with named axes (``axes``: ``((name, size), ...)``), computing for
    all of them at once; ``abstract`` runs compute types only."""

    eager = False

    def __init__(self, devices, axes, *, abstract=False, check_vma=False, maps_a_mesh=False,
                 outer=None):
        self.axes = tuple(axes)
        self.n = math.prod(s for _, s in self.axes)
        self.all_devices = list(devices)
        self.devices = self.all_devices[:self.n]
        self.abstract, self.check_vma, self.maps_a_mesh = abstract, check_vma, maps_a_mesh
        self.outer, self.inner = outer, None        # a nested pmap's run, and its own
        self.log = Log() if outer is None else outer.log
        self.branches: list = []       # inside lax.cond: (devices taking it, label), innermost last
        self._coords: dict = {}

    # -- naming devices -------------------------------------------------------------------------
    def coords_of(self, k) -> tuple:
        """((axis name, index, size), ...) of device ``k``, row-major over the grid."""
        found = self._coords.get(k)
        if found is None:
            index, rest = [], k
            for _, size in reversed(self.axes):
                rest, i = divmod(rest, size)
                index.append(i)
            found = self._coords[k] = tuple((name, i, size) for (name, size), i
                                            in zip(self.axes, reversed(index)))
        return found

    @property
    def coords(self):
        return self.coords_of(0)

    def where(self, k=0) -> str:
        """How messages name device ``k``: 'device 3 (i=3)'; an outer nested body spans the
        devices of its inner grid. (A traced body is reported on the first device.)"""
        coords = coords_text(self.coords_of(k))
        if self.inner is not None:
            return (f"the outer body at {coords} (devices "
                    f"{errors.id_ranges(self.leaf_ids(k))} at {self.inner_text()})")
        return f"device {self.devices[k].id if self.devices else k} ({coords})"

    def inner_text(self):
        deepest = self
        while deepest.inner is not None:
            deepest = deepest.inner
        return ", ".join(f"{'index' if n is None else n}=0..{s - 1}"
                         for n, s in deepest.axes[len(self.axes):])

    def label(self, k) -> str:
        """How the log names program ``k``: 'device 3', or 'i=1' for an outer body."""
        if self.inner is not None:
            return coords_text(self.coords_of(k))
        return f"device {self.devices[k].id}"

    def leaf_ids(self, k) -> list:
        """The ids of the devices that run program ``k``, inner grids included."""
        if self.inner is None:
            return [self.devices[k].id]
        m = self.inner.n // self.n
        return [i for j in range(k * m, (k + 1) * m) for i in self.inner.leaf_ids(j)]

    # -- axes ----------------------------------------------------------------------------------
    def axis_size(self, axis_names, op="axis_size") -> int:
        """How many devices ``axis_names`` span, refusing a name that is not in scope."""
        sizes = dict(self.axes)
        for name in axis_names:
            if name is None or name not in sizes:
                raise errors.UnboundAxisError(errors.unbound_axis_message(
                    op, name, self.where(0), self.coords, self.maps_a_mesh))
        return math.prod(sizes[name] for name in axis_names)

    def positions(self, axis_names) -> np.ndarray:
        """Each device's index along ``axis_names`` (row-major over the names), as int32."""
        names = [n for n, _ in self.axes]
        grid = np.zeros([s for _, s in self.axes], dtype=np.int32)
        for name in axis_names:
            d = names.index(name)
            shape = [1] * len(names)
            shape[d] = self.axes[d][1]
            grid = grid * self.axes[d][1] + np.arange(self.axes[d][1], dtype=np.int32).reshape(shape)
        return grid.reshape(self.n)

    def groups(self, axis_names, axis_index_groups, prim):
        """The devices of every group of collective ``prim``, as arrays of shape (number of
        groups, group size); groups of unequal sizes (``axis_index_groups``) come as one
        array per size."""
        size = self.axis_size(axis_names, prim.op)
        if axis_index_groups is not None:
            check_groups(axis_index_groups, size, prim, self.where(0), axis_names)
        return _groups(self.axes, tuple(axis_names), axis_index_groups)

    # -- computing ----------------------------------------------------------------------------
    def prepare(self, prim, args, params):
        """Under ``check_vma``, an operand that varies over fewer mesh axes than another
        is first made to vary over them (``pvary``), as JAX inserts it; so is the operand of
        a reduction over axes it does not vary over (``psum`` of a replicated value)."""
        if not self.check_vma or prim.needs_run:   # a body keeps its types
            return args
        if prim.collective:
            return self._vary_for(prim, args, params)
        if len(args) < 2:
            return args
        vmas = [aval_of(x).vma for x in args]
        union = frozenset().union(*vmas)
        if all(v == union for v in vmas):
            return args
        cast = core.PRIMITIVES.get("reduced_vary_cast")   # for a value reduced over the rest
        return [core.bind(cast if cast and aval_of(x).reduced == union - v else pvary, x,
                          axes=tuple(a for a in self._order(union) if a not in v))
                if v != union else x for x, v in zip(args, vmas)]

    def _vary_for(self, prim, args, params):
        """A collective's operand is made to vary over its axes first; a reduction's that
        varies over some of them only if the running JAX allows it (the type rule refuses
        it otherwise)."""
        if prim.by_position:
            return args
        axes = tuple(params.get("axes") or _names(params.get("axis_name")))
        self.axis_size(axes, prim.op)           # an unknown name first: it says which
        out = []
        for x in args:
            missing = tuple(a for a in axes if a not in aval_of(x).vma
                            and not (a in aval_of(x).unreduced and prim.unreduces))
            if missing and (len(missing) == len(axes) or not prim.reduction
                            or prim in settings.partial):
                x = core.bind(pvary, x, axes=missing)
            out.append(x)
        return out

    def _order(self, axes):
        return [n for n, _ in self.axes if n in axes]

    def apply(self, prim, args, params) -> list:
        """``prim`` on ``args``: its type always, its values when the run has them."""
        avals = [aval_of(x) for x in args]
        out = prim.abstract(*avals, **params)
        out_avals = out if prim.multiple_results else [out]
        if any(a.unreduced or a.reduced for a in avals) and not prim.unreduces:
            sets = bridge.unreduced(prim, avals, params, len(out_avals))  # JAX's rules
            out_avals = [a.update(unreduced=u, reduced=r) for a, (u, r) in zip(out_avals, sets)]
        if self.abstract or any(isinstance(x, StackedValue) and x.stack is None for x in args):
            if prim.collective:
                self.collective(prim, None, params, avals, out_avals)
            return [StackedValue(a) for a in out_avals]
        return self.compute(prim, args, params, avals, out_avals)

    def compute(self, prim, args, params, avals, out_avals) -> list:
        """``prim``'s values for every device, its result types known (from the abstract
        evaluation, or, replaying a program, from its equation)."""
        if prim.needs_run:     # it runs programs: it gets the values
            results = prim.stacked(*args, **params)   # (stacks, or its body's values)
            return [StackedValue(a, self.stack_of(r, a) if isinstance(r, StackedValue) else r)
                    for a, r in zip(out_avals, results)]
        stacks = [self.stack_of(x, a) for x, a in zip(args, avals)]
        if prim.collective:
            results = self.collective(prim, stacks, params, avals, out_avals)
        elif not stacks or (self.n > 1 and all(s.strides[0] == 0 for s in stacks)):
            # the same value on every device: compute it once, share it (a stride-0 view)
            one = prim.stacked(*(s[:1] for s in stacks), **params) if stacks else \
                [np.asarray(prim.stacked(**params))[None]]
            one = one if prim.multiple_results or not stacks else [one]
            results = [np.broadcast_to(r, (self.n,) + r.shape[1:]) for r in one]
        else:
            results = prim.stacked(*stacks, **params)
        results = results if prim.multiple_results or isinstance(results, list) else [results]
        return [StackedValue(a, r) for a, r in zip(out_avals, results)]

    def block_shape(self, aval) -> tuple:
        """The shape of one device's value of type ``aval`` (its block, under jit)."""
        return aval.shape

    def stack_of(self, x, aval):
        """Every device's value of an operand: a value's stack, or a constant shared by all."""
        if isinstance(x, StackedValue):
            return x.stack
        value = np.asarray(x, dtype=aval.dtype)
        return np.broadcast_to(value, (self.n,) + value.shape)

    def collective(self, prim, stacks, params, avals, out_avals):
        """Run ``prim`` for every group at once; log it; the outputs, stacked (None when
        the run has types only)."""
        axes = tuple(params.get("axes") or _names(params.get("axis_name")))
        if prim.by_position:
            return [np.asarray(self.positions(axes))] if stacks is not None else None
        sets = self.groups(axes, params.get("axis_index_groups"), prim)
        logged = self._taking_branch(sets, prim.op, axes) if self.branches else sets
        outputs = None
        if stacks is not None:
            outputs = [_combine(prim, s, sets, params, self.n) for s in stacks]
        if logged:                    # (a branch no device takes: traced, never run)
            source = core.caller_source()
            self.log.collective(self, prim, axes, params, avals, out_avals, stacks, outputs,
                                logged, source, context.phase, context.iteration)
        return outputs

    # -- lax.cond: devices taking a branch ----------------------------------------------------
    def _taking_branch(self, sets, op, axis_names):
        taking = np.logical_and.reduce([mask for mask, _ in self.branches])
        kept = []
        for members in sets:
            inside = taking[members]
            split = inside.any(axis=1) & ~inside.all(axis=1)
            if split.any():
                raise errors.DeadlockError(self._deadlock_text(
                    members[np.argmax(split)], taking, op, axis_names))
            if inside.all(axis=1).any():
                kept.append(members[inside.all(axis=1)])
        return kept

    def _deadlock_text(self, row, taking, op, axis_names):
        _, (what, k, source, code) = self.branches[-1]
        ids = [self.devices[i].id for i in row]
        here = [self.devices[i].id for i in row if taking[i]]
        away = [i for i in ids if i not in here]
        axes = axis_names[0] if len(axis_names) == 1 else axis_names
        where, line = core.caller_source()
        branch = {("cond", 1): "the true branch", ("cond", 0): "the false branch"}.get(
            (what, k), f"branch {k}")
        into, others, instead = (f"into {branch}", "take another branch", (
            "branch (compute it on every device, then choose with lax.cond or snp.where)"))
        if what == "while_loop":
            into, others, instead = (f"into iteration {k} of its body", "have left the loop "
                                     "(their predicate is false)", "loop")
        return (f"deadlock: lax.{what} at {source} ({code}) sends devices "
                f"{errors.id_ranges(here)} {into}, which calls {op} over axis {axes!r} "
                f"at {where} ({line}); devices {errors.id_ranges(away)} of the same group "
                f"{others} and never reach it. The {op} needs all {len(ids)} devices of "
                f"the group ({errors.id_ranges(ids)}), so on real hardware the devices that "
                f"reached it wait forever (jax.pmap hangs). Move the collective out of the "
                f"{instead}, or make the predicate the same on every device of the group.")

    # -- what a front end asks ------------------------------------------------------------------
    nested, outer_n = False, 1

    def returned(self, stack, detail, aval=None):
        """Log what each device returned (``detail(k)``: device ``k``'s row; ``stack`` None
        and its type ``aval`` on shapes alone)."""
        self.log.returned(self, stack, detail, aval)

    def sub_grids(self):
        """The devices of each program's inner pmap grid, or None when none nests inside."""
        if self.inner is None:
            return None
        m = self.inner.n // self.n
        return [self.all_devices[k * m:(k + 1) * m] for k in range(self.n)]

    # -- related runs -------------------------------------------------------------------------
    def tracing(self) -> "Run":
        """A run over the same grid that computes types only (to trace a body on it)."""
        return Run(self.all_devices, self.axes, abstract=True, check_vma=self.check_vma,
                   maps_a_mesh=self.maps_a_mesh)

    def nest(self, inner_axes, abstract=None, devices=None) -> "Run":
        """The run of a pmap called inside this body: this grid with ``inner_axes`` below
        (over ``devices``, a pmap's own, where this body maps no axis)."""
        size = math.prod(s for _, s in inner_axes)
        if devices is not None:
            return Run(devices, tuple(inner_axes), check_vma=self.check_vma,
                       abstract=self.abstract if abstract is None else abstract)
        if self.inner is not None and self.inner.n != self.n * size:
            raise errors.MappedAxisError(
                f"two pmaps nested in one body map different sizes ({self.inner.n // self.n} "
                f"and {size}); simpmd lays a nested pmap out as a grid of devices, so an outer "
                f"body's inner pmaps must map the same size.")
        if self.all_devices and self.n * size > len(self.all_devices):
            shape = " x ".join(f"{n}={s}" for n, s in self.axes + tuple(inner_axes))
            raise errors.MappedAxisError(
                f"nested pmap needs a grid of {shape} = {self.n * size} devices, but only "
                f"{len(self.all_devices)} are available. Call "
                f"simpmd.set_device_count({self.n * size}) or map smaller sizes.")
        self.inner = Run(self.all_devices, self.axes + tuple(inner_axes),
                         abstract=self.abstract if abstract is None else abstract,
                         check_vma=self.check_vma, maps_a_mesh=self.maps_a_mesh, outer=self)
        return self.inner

@functools.lru_cache(maxsize=256)
def _groups(axes, axis_names, axis_index_groups):
    names = [n for n, _ in axes]
    rest = [d for d, n in enumerate(names) if n not in axis_names]
    grid = np.arange(math.prod(s for _, s in axes)).reshape([s for _, s in axes])
    size = math.prod(dict(axes)[a] for a in axis_names)
    members = grid.transpose(rest + [names.index(a) for a in axis_names]).reshape(-1, size)
    if axis_index_groups is None:
        return [members]
    by_size: dict = {}
    for g in axis_index_groups:
        by_size.setdefault(len(g), []).append(list(g))
    return [members[:, gs].reshape(-1, k) for k, gs in by_size.items()]

def _names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)

def _combine(prim, stack, sets, params, n):
    """``prim``'s math over each group of devices: gather the groups' rows, combine,
    scatter back."""
    math_params = {k: v for k, v in params.items() if not k.startswith("_")
                   and k not in ("axes", "axis_name", "axis_index_groups", "axis_size")}
    if len(sets) == 1 and sets[0].shape[0] == 1 and _every_device(sets[0]):
        out = prim.math(stack[None], **math_params)               # one group of every device
        return np.broadcast_to(out, (1, n) + out.shape[2:])[0]
    out = None
    for members in sets:
        groups = stack[members]
        combined = prim.math(groups, **math_params)
        combined = np.broadcast_to(combined, groups.shape[:2] + combined.shape[2:])
        if out is None:
            out = np.empty((n,) + combined.shape[2:], combined.dtype)
        out[members] = combined
    return out

def _every_device(members):
    """True for one group of every device in order (the cached groups are reused)."""
    known = _ORDERED.get(id(members))
    if known is None or known[0] is not members:
        known = _ORDERED[id(members)] = (members, bool((members[0] == np.arange(members.shape[1])).all()))
    return known[1]

_ORDERED: dict = {}

def check_groups(groups, size, prim, where, axis_names):
    op, flat = prim.op, sorted(i for g in groups for i in g)
    if flat != list(range(size)):
        raise errors.CollectiveArgumentError(
            f"{op} over {axis_names} on {where}: axis_index_groups={groups} must use every "
            f"index of axis {axis_names} (size {size}) exactly once; it covers {flat}. List "
            f"each index 0..{size - 1} in exactly one group.")
    sizes = {len(g) for g in groups}
    if len(sizes) > 1 and not prim.unequal_groups:
        raise errors.CollectiveArgumentError(
            f"{op} over {axis_names} on {where}: axis_index_groups={groups} has groups of sizes "
            f"{sorted(len(g) for g in groups)}; {op} needs groups of equal size. Split the "
            f"axis into groups of one size.")

core.plain = Run([], (), abstract=False)      # no mapped body: one device, no axes
del Aval
