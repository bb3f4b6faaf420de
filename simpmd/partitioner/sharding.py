"""Sharding in the type under ``jit``: one rule per primitive, and how each device computes
its block of the result.

Under ``jit`` on a mesh with *Explicit* axes, a value's type carries its sharding
(``f32[16@data,64@model]``), as under ``shard_map`` it carries the axes it varies over.
Every primitive's row gets two columns here, attached from outside the core (as the
drawings are):

* ``sharding(mesh, avals, **params)``: the layout of each result, from the operands'
  layouts, or a :class:`ShardingTypeError` where JAX raises one. A layout is one tuple of
  mesh axes per dimension (``(('data',), ())`` is ``P('data', None)``). These are JAX's
  rules (the ``_..._sharding_rule`` functions beside each primitive in
  jax/_src/lax/lax.py), checked against the running JAX on named and random programs
  (tests/conformance/test_explicit_vs_jax.py, tests/test_jit_random_vs_jax.py).
* ``partition(avals, outs, **params)``: how each device computes its block, as a
  :class:`Plan`: the layout each operand must be in first (moving it there is what the
  compiler inserts: an all-gather, an all-to-all, or a slice each device cuts from what
  it already holds), the parameters of the same primitive on blocks, and the partial
  sums left to combine. A row without one is computed whole: its operands gathered, the
  result computed on every device, each device keeping its block (right, and slow).

The rule fixes the result's type, so what each device must end up holding; the plan is
simpmd's route there, the simplest collectives that do it. XLA may choose others for the
same rule (lesson 12 compares them).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
import sys

import numpy as np

from ..core import errors
from ..core import bridge
from .columns import column
from importlib.metadata import version as installed
from ..machine.mesh import Mesh
from ..machine.mesh import PartitionSpec, ShardingError
from ..machine.mesh import AxisType, axis_types_of


class ShardingTypeError(errors.SimpmdError, TypeError):
    """An operation whose result's sharding JAX's rules refuse (JAX's ``ShardingTypeError``)."""


class UnreducedValueError(errors.SimpmdError, NotImplementedError):
    """An unreduced array asked for its value (JAX refuses too, from jax 0.10)."""


class Settings:
    """The rules that changed between JAX releases. With JAX imported, each is asked of the
    running JAX the first time it matters (:mod:`simpmd.jax.rules` traces a tiny program on
    it, once per process); without JAX, or inside :meth:`newest`, they are the newest
    JAX's (jax 0.12).

    ``batch_alike``: dot_general's batch dims must be split alike on both operands (0.12;
    before, a whole dim agreed with a split one). ``matmul_batch``: ``jnp.matmul`` refuses
    batch dims split differently (0.10; 0.7 let dot_general decide). ``reshape_spread``:
    a reshape hands a split's axes out over the new dims, and merges dims split on
    several axes (0.10; 0.7 gave the whole split to the first new dim, and merged only a
    split first dim). ``strided_slice``: ``x[::k]`` of a split dim is a slice that keeps
    the split (0.10; 0.7 indexed with a gather, which refused it). ``shard_map_checks``:
    inside jit, shard_map refuses operands laid out otherwise than its in_specs (0.10;
    0.7 moved them). ``single_element``: a slice down to one element is replicated, whatever
    the operand's split (0.11; before, refused like any slice a split does not divide).
    ``cotangent_swaps``: a reduced operand's gradient is unreduced (0.10; 0.7 kept it
    plain). ``empty_take_keeps_split``: outside jit, an index whose result is empty
    (``x[2:2]``, ``x[1:1, 3]``) is no gather and keeps the splits of the dims it keeps
    (0.10; 0.7 gave a replicated empty array). ``spec_rank_checked``:
    ``out_sharding=``/``reshard`` refuse a spec with more
    entries than the value has dimensions (0.11; before, trailing ``None`` entries
    passed). ``reshape_ones``: a reshape finds its split or merge past dims of size 1
    (0.12; before, ``(8, 4, 6)`` to ``(8, 24, 1)`` was refused). ``unreduced_out_cast``:
    a shard_map result varying over an axis its out_specs call unreduced is taken as the
    parts of a sum (0.10; 0.12 wants it unreduced there already, ``lax.pcast``). :meth:`ask` takes the rules of unreduced and reduced operands too
    (``simpmd.api.reductions``).
    """

    NEWEST = dict(batch_alike=True, matmul_batch=True, reshape_spread=True, reshape_ones=True,
                  strided_slice=True, empty_take_keeps_split=True,
                  shard_map_checks=True, single_element=True, cotangent_swaps=True,
                  spec_rank_checked=True, contraction_sets="axes", unreduced_out_cast=False)

    def __init__(self):
        self.pinned = False

    def ask(self, question, *args):
        """The running JAX's answer to ``question`` (a function of simpmd.jax.rules), or
        the newest JAX's. ``on_operand(row, start)``'s newest answers are a column of the
        row (``unreduced_newest``)."""
        if not self.pinned and "jax" in sys.modules and bridge.jax is not None:
            try:
                return getattr(bridge.jax.rules, question)(*args)
            except bridge.jax.rules.Unavailable:       # a JAX too old to trace the probes
                pass
        if question == "on_operand":
            row, start = args
            return column(row, "unreduced_newest")[start == "reduced"]
        return self.NEWEST[question]

    @contextlib.contextmanager
    def newest(self):
        """The newest JAX's rules inside the block, whatever JAX is running."""
        before, self.pinned = self.pinned, True
        try:
            yield self
        finally:
            self.pinned = before

    batch_alike = property(lambda self: self.ask("batch_alike"))
    matmul_batch = property(lambda self: self.ask("matmul_batch"))
    reshape_spread = property(lambda self: self.ask("reshape_spread"))
    reshape_ones = property(lambda self: self.ask("reshape_ones"))
    strided_slice = property(lambda self: self.ask("strided_slice"))
    empty_take_keeps_split = property(lambda self: self.ask("empty_take_keeps_split"))
    shard_map_checks = property(lambda self: self.ask("shard_map_checks"))
    unreduced_out_cast = property(lambda self: self.ask("unreduced_out_cast"))
    single_element = property(lambda self: self.ask("single_element"))
    cotangent_swaps = property(lambda self: self.ask("cotangent_swaps"))
    spec_rank_checked = property(lambda self: self.ask("spec_rank_checked"))

    @property
    def version(self) -> tuple:
        """The installed JAX's release from its package metadata (JAX is not imported), or
        (99,) without one: only for the multi-process rules, which one process cannot
        probe (``simpmd.hosts``)."""
        try:
            return tuple(int(p) for p in installed("jax").split(".")[:3] if p.isdigit())
        except Exception:
            return (99,)


settings = Settings()


# -- the mesh that P(...) refers to: set_mesh ----------------------------------------------------

_MESH: contextvars.ContextVar = contextvars.ContextVar("simpmd_mesh", default=None)


class set_mesh:
    """Make ``mesh`` the one that ``P(...)`` refers to, like ``jax.set_mesh``: called alone
    it sets the mesh until changed; ``with simpmd.set_mesh(mesh):`` puts the previous one
    back at the end of the block."""

    def __init__(self, mesh):
        if not isinstance(mesh, Mesh):
            raise TypeError(f"set_mesh takes a simpmd Mesh (simpmd.make_mesh(...)), got {mesh!r}")
        self.mesh, self._token = mesh, _MESH.set(mesh)

    def __enter__(self):
        return self.mesh

    def __exit__(self, *exc):
        _MESH.reset(self._token)
        return False


def get_mesh():
    """The mesh set by :class:`set_mesh`, or None."""
    return _MESH.get()


def check_placed(spec, what="out_sharding"):
    """A bare ``P(...)`` a program passes (``out_sharding=``, ``reshard``, ``device_put``)
    names axes of the mesh set by ``set_mesh``; without one JAX refuses it, even where the
    operands' mesh would do (a ``NamedSharding`` carries its own mesh)."""
    if isinstance(spec, PartitionSpec) and get_mesh() is None:
        raise ShardingError(
            f"Using PartitionSpec when you are not under a mesh context is not allowed. Please "
            f"pass a NamedSharding instance or enter into a mesh context via `jax.set_mesh` "
            f"(JAX's words, for {what}={spec!r}): call simpmd.set_mesh(mesh) first (or "
            f"`with simpmd.set_mesh(mesh):`), or pass simpmd.NamedSharding(mesh, {spec!r}).")


# -- the type ------------------------------------------------------------------------------


class Sharding:
    """The sharding in a value's type: its mesh, per dimension the Explicit mesh axes that
    split it, and the mesh axes it is unreduced or reduced over (JAX's ``NamedSharding``
    in an aval). Prints in JAX's notation: ``f32[8@X,4]``, ``f32[4,2]{U:X}``."""

    __slots__ = ("mesh", "dims", "unreduced", "reduced")

    def __init__(self, mesh, dims, unreduced=frozenset(), reduced=frozenset()):
        self.mesh, self.dims = mesh, tuple(tuple(d) for d in dims)
        self.unreduced, self.reduced = frozenset(unreduced), frozenset(reduced)

    def dim_suffix(self, k) -> str:
        axes = self.dims[k]
        return "" if not axes else "@" + (axes[0] if len(axes) == 1 else f"({','.join(axes)})")

    def suffix(self) -> str:
        """``{U:X}``, ``{R:(X,Y)}``, ``{U:X, R:Y}``: what the type says beyond its dims."""
        parts = []
        for letter, axes in (("U", self.unreduced), ("R", self.reduced)):
            if axes:
                names = sorted(axes, key=self.mesh.axis_names.index)
                parts.append(f"{letter}:" + (names[0] if len(names) == 1 else f"({','.join(names)})"))
        return "{" + ", ".join(parts) + "}" if parts else ""

    def transpose(self, permutation) -> "Sharding":
        """The sharding of the value with its dimensions in ``permutation``'s order."""
        return Sharding(self.mesh, [self.dims[p] for p in permutation], self.unreduced,
                        self.reduced)

    def cotangent(self) -> "Sharding":
        """The type of this value's gradient: reduced and unreduced swap (JAX's cotangent
        map; jax 0.7.2 kept them as they were)."""
        if not settings.cotangent_swaps:
            return Sharding(self.mesh, self.dims)
        return Sharding(self.mesh, self.dims, self.reduced, self.unreduced)

    @property
    def spec(self):
        return PartitionSpec(*[None if not a else (a[0] if len(a) == 1 else a) for a in self.dims],
                             unreduced=self.unreduced, reduced=self.reduced)

    def __eq__(self, other):
        return isinstance(other, Sharding) and (self.mesh, self.dims, self.unreduced, self.reduced) \
            == (other.mesh, other.dims, other.unreduced, other.reduced)

    def __hash__(self):
        return hash((self.dims, self.unreduced, self.reduced))

    def __repr__(self):                 # as a parameter of an equation: the spec
        return repr(self.spec)


def type_text(aval) -> str:
    """A type as ``jax.typeof`` prints it: ``float32[16@data,32@model]``, ``~float32[]``
    for a weak type."""
    short = aval.str_short()
    weak = "~" if getattr(aval, "weak_type", False) else ""
    return weak + np.dtype(aval.dtype).name + short[short.index("["):]


def reductions_of(spec, mesh, what="reshard") -> tuple:
    """The (unreduced, reduced) axes a ``P(...)``/``NamedSharding``/:class:`Sharding` names,
    checked against the mesh (JAX's words when an axis is not there)."""
    if isinstance(spec, Sharding):
        return spec.unreduced, spec.reduced
    inner = getattr(spec, "spec", spec)
    found = (getattr(inner, "unreduced", frozenset()), getattr(inner, "reduced", frozenset()))
    for word, axes in zip(("Unreduced", "Reduced"), found):
        missing = sorted(a for a in axes if a not in mesh.axis_names)
        if missing:
            raise ValueError(f"{word} axes {', '.join(missing)} is not found in "
                             f"mesh.axis_names={tuple(mesh.axis_names)}. Got pspec={inner!r}")
    return frozenset(found[0]), frozenset(found[1])


def dims_of(aval):
    """An aval's layout; a constant (no mesh) is whole on every device."""
    s = aval.sharding
    return s.dims if s is not None else ((),) * aval.ndim


def whole(ndim):
    return ((),) * ndim


def count(mesh, axes) -> int:
    sizes = mesh.shape
    return math.prod(sizes[a] for a in axes)


def block_shape(shape, dims, mesh) -> tuple:
    return tuple(n // count(mesh, axes) for n, axes in zip(shape, dims))


def explicit_axes(mesh) -> tuple:
    return tuple(n for n, t in zip(mesh.axis_names, axis_types_of(mesh))
                 if t is AxisType.Explicit)


class all_explicit:
    """A mesh seen as if every axis were Explicit (a placement may name any axis)."""

    def __init__(self, mesh):
        self.mesh, self.axis_names, self.shape = mesh, mesh.axis_names, mesh.shape
        self.axis_types = (AxisType.Explicit,) * len(mesh.axis_names)

    def __repr__(self):
        return repr(self.mesh)


def _within_rank(parts, ndim, spec, what):
    """A spec's entries for a value of rank ``ndim``: more entries than dimensions are
    refused, or, where the running JAX lets them pass (jax 0.10 and before), trailing
    ``None`` entries are dropped (others fail an assertion there)."""
    if settings.spec_rank_checked or what in ("device_put", "in_specs", "out_specs") \
            or any(p is not None for p in parts[ndim:]):
        raise ShardingError(
            f"Length of sharding.spec ({len(parts)}) must be equal to aval's ndim ({ndim}) "
            f"(JAX's words): {what}={spec!r} has {len(parts)} entries for a value of rank "
            f"{ndim}; give one per dimension (trailing ones may be left out).")
    return parts[:ndim]


def resolve(spec, mesh, ndim, what="out_sharding"):
    """A ``P(...)``, ``NamedSharding`` or :class:`Sharding` as a layout of ``ndim`` dims."""
    if spec is None:
        return None
    if isinstance(spec, Sharding):
        return spec.dims
    inner = getattr(spec, "spec", spec)
    parts = list(inner) if inner is not None else []
    if len(parts) > ndim:
        parts = _within_rank(parts, ndim, inner, what)
    dims = tuple(() if p is None else (tuple(p) if isinstance(p, (tuple, list)) else (p,))
                 for p in parts + [None] * (ndim - len(parts)))
    explicit = explicit_axes(mesh)
    for a in (a for d in dims for a in d):
        if a not in mesh.axis_names:
            raise ShardingTypeError(f"{what}={inner!r} names {a!r}, which is not an axis of "
                                    f"the mesh {mesh!r}.")
        if a not in explicit:
            raise ShardingTypeError(
                f"{what}={inner!r} names the mesh axis {a!r}, which is not Explicit: only "
                f"Explicit axes can appear in a sharding type (JAX refuses it too); on Auto "
                f"axes the compiler decides.")
    return dims


def check_layout(mesh, shape, dims, name):
    """JAX's checks on a result's type: no mesh axis twice, every split even."""
    used = [a for d in dims for a in d]
    twice = sorted({a for a in used if used.count(a) > 1})
    if twice:
        raise ShardingTypeError(
            f"{name} would produce an illegally sharded result, with mesh axis {twice[0]!r} "
            f"splitting two dimensions ({spec_text(dims)}); an axis splits one dimension "
            f"only (JAX's words: 'produces an illegally sharded result'). reshard an "
            f"operand first, or give out_sharding=.")
    for d, (n, axes) in enumerate(zip(shape, dims)):
        if axes and n % count(mesh, axes):
            raise ShardingTypeError(
                f"{name}: dimension {d} of the result has size {n}, which the "
                f"{count(mesh, axes)} devices of {axes} cannot split evenly. JAX requires even "
                f"splits; pad the array or split that dimension over fewer devices.")


def spec_text(dims) -> str:
    parts = [None if not a else (a[0] if len(a) == 1 else a) for a in dims]
    return "P(" + ", ".join(repr(p) for p in parts) + ")"
