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
  (tests/test_explicit_vs_jax.py, tests/test_jit_random_vs_jax.py).
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

from ..core import collectives as K
from ..core import control, errors, loops
from ..core import primitives as P
from ..core.collectives import ppermute as _ppermute
from ..core.core import PRIMITIVES


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
    plain). ``spec_rank_checked``: ``out_sharding=``/``reshard`` refuse a spec with more
    entries than the value has dimensions (0.11; before, trailing ``None`` entries
    passed). :meth:`ask` takes the rules of unreduced and reduced operands too
    (``simpmd.api.reductions``).
    """

    NEWEST = dict(batch_alike=True, matmul_batch=True, reshape_spread=True, strided_slice=True,
                  shard_map_checks=True, single_element=True, cotangent_swaps=True,
                  spec_rank_checked=True, contraction_sets="axes")

    def __init__(self):
        self.pinned = False

    def ask(self, question, *args):
        """The running JAX's answer to ``question`` (a function of simpmd.jax.rules), or
        the newest JAX's. ``on_operand(row, start)``'s newest answers are a column of the
        row (``unreduced_newest``)."""
        from ..core import bridge
        if not self.pinned and "jax" in sys.modules and bridge.jax is not None:
            try:
                return getattr(bridge.jax.rules, question)(*args)
            except bridge.jax.rules.Unavailable:       # a JAX too old to trace the probes
                pass
        if question == "on_operand":
            row, start = args
            return row.unreduced_newest[start == "reduced"]
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
    strided_slice = property(lambda self: self.ask("strided_slice"))
    shard_map_checks = property(lambda self: self.ask("shard_map_checks"))
    single_element = property(lambda self: self.ask("single_element"))
    cotangent_swaps = property(lambda self: self.ask("cotangent_swaps"))
    spec_rank_checked = property(lambda self: self.ask("spec_rank_checked"))

    @property
    def version(self) -> tuple:
        """The installed JAX's release from its package metadata (JAX is not imported), or
        (99,) without one: only for the multi-process rules, which one process cannot
        probe (``simpmd.hosts``)."""
        try:
            from importlib.metadata import version as installed
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
        from ..machine.mesh import Mesh
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
    from ..machine.mesh import PartitionSpec, ShardingError
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
        from ..machine.mesh import PartitionSpec
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
    from ..machine.mesh import AxisType, axis_types_of
    return tuple(n for n, t in zip(mesh.axis_names, axis_types_of(mesh))
                 if t is AxisType.Explicit)


class all_explicit:
    """A mesh seen as if every axis were Explicit (a placement may name any axis)."""

    def __init__(self, mesh):
        from ..machine.mesh import AxisType
        self.mesh, self.axis_names, self.shape = mesh, mesh.axis_names, mesh.shape
        self.axis_types = (AxisType.Explicit,) * len(mesh.axis_names)

    def __repr__(self):
        return repr(self.mesh)


def _within_rank(parts, ndim, spec, what):
    """A spec's entries for a value of rank ``ndim``: more entries than dimensions are
    refused, or, where the running JAX lets them pass (jax 0.10 and before), trailing
    ``None`` entries are dropped (others fail an assertion there)."""
    from ..machine.mesh import ShardingError
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


# -- the rules: each result's layout -----------------------------------------------------------


def _meshes(avals):
    found = {a.sharding.mesh for a in avals if a.sharding is not None}
    if len(found) > 1:
        raise ShardingTypeError(f"the operands live on different meshes ({', '.join(map(repr, found))}); "
                                f"device_put them onto one mesh first.")


def _broadcasting(name):
    """Elementwise: per dimension, the split the operands agree on; a dimension split on
    one operand and whole on another takes the split; two different splits raise."""
    def rule(mesh, avals, **params):
        _meshes(avals)
        shaped = [a for a in avals if a.shape]
        if not shaped:
            return [()]
        if len({a.ndim for a in shaped}) > 1:
            raise TypeError(f"{name}: arrays must have the same number of dimensions, got "
                            f"{', '.join(str(a.shape) for a in shaped)}.")
        out = []
        for d in range(shaped[0].ndim):
            ss = [dims_of(a)[d] for a in shaped]
            nontrivial = [s for s, a in zip(ss, shaped) if not (a.shape[d] == 1 and not s)]
            chosen = ()
            for s in (nontrivial or [()]):
                if s and chosen and s != chosen:
                    raise ShardingTypeError(
                        f"{name} got incompatible shardings for broadcasting: "
                        f"{', '.join(spec_text(dims_of(a)) for a in shaped)} (JAX's words). "
                        f"Dimension {d} is split differently on two operands, and JAX will "
                        f"not choose one for you: reshard one operand to the other's layout "
                        f"first, e.g. simpmd.reshard(y, x.sharding.spec).")
                chosen = chosen or s
            out.append(chosen)
        return [tuple(out)]
    return rule


def _first(mesh, avals, **params):
    return [dims_of(avals[0])]


def _convert(mesh, avals, new_dtype=None, weak_type=False, sharding=None):
    return [resolve(sharding, mesh, avals[0].ndim) if sharding is not None else dims_of(avals[0])]


def _select(mesh, avals, **params):
    pred, *cases = avals
    meshed = [a for a in cases if a.sharding is not None]
    first = dims_of(meshed[0]) if meshed else dims_of(cases[0])
    if any(dims_of(a) != first for a in meshed):
        raise ShardingTypeError(
            f"select cases must have the same shardings, got "
            f"[{', '.join(spec_text(dims_of(a)) for a in cases)}] (JAX's words). reshard "
            f"them to one layout first.")
    if pred.shape and pred.sharding is not None and dims_of(pred) != first:
        raise ShardingTypeError(
            f"select's predicate must be a scalar or have the cases' sharding, got "
            f"{spec_text(dims_of(pred))} and {spec_text(first)}.")
    return [first]


def _clamp(mesh, avals, **params):
    return [dims_of(avals[1])]


def _reduce(mesh, avals, axes, out_sharding=None, **params):
    if out_sharding is not None:
        return [resolve(out_sharding, mesh, avals[0].ndim - len(axes))]
    return [tuple(s for d, s in enumerate(dims_of(avals[0])) if d not in axes)]


def _cumulative(mesh, avals, axis, reverse=False):
    if dims_of(avals[0])[axis]:
        raise ShardingTypeError(
            f"Input should be unsharded over the axis being reduced (JAX's words): dimension "
            f"{axis} of {spec_text(dims_of(avals[0]))} is split. reshard it whole first.")
    return [dims_of(avals[0])]


def _sort(mesh, avals, dimension, **params):
    for a in avals:
        if dims_of(a)[dimension]:
            raise ShardingTypeError(
                f"Arguments to sort must be unsharded over the sorting dimension (JAX's "
                f"words): dimension {dimension} of {spec_text(dims_of(a))} is split.")
    return [dims_of(a) for a in avals]


def _transpose(mesh, avals, permutation):
    return [tuple(dims_of(avals[0])[p] for p in permutation)]


def _squeeze(mesh, avals, dimensions):
    return [tuple(s for d, s in enumerate(dims_of(avals[0])) if d not in dimensions)]


def _broadcast_in_dim(mesh, avals, shape, broadcast_dimensions, sharding=None):
    if sharding is not None:
        return [resolve(sharding, mesh, len(shape))]
    src = iter(dims_of(avals[0]))
    return [tuple(next(src) if d in broadcast_dimensions else () for d in range(len(shape)))]


def _concatenate(mesh, avals, dimension):
    meshed = [a for a in avals if a.sharding is not None]
    if not meshed:
        return [whole(avals[0].ndim)]
    if any(dims_of(a) != dims_of(meshed[0]) for a in meshed):
        raise ShardingTypeError(
            f"All operands should have the same sharding (JAX's words), got "
            f"{', '.join(spec_text(dims_of(a)) for a in meshed)}. reshard them to one "
            f"layout first.")
    return [dims_of(meshed[0])]


def _varying_shape(row, word):
    """slice, pad: the operand's layout, if each changed split dimension still divides."""
    def rule(mesh, avals, **params):
        a = avals[0]
        strides = params.get("strides") or ()
        if not settings.strided_slice and any(k != 1 and dims_of(a)[d] for d, k in enumerate(strides)):
            raise ShardingTypeError(
                "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the "
                "gather indexing (JAX's words): this JAX indexes x[::k] with a gather, which "
                "refuses a split dimension; reshard it whole first.")
        out = row.abstract(*avals, **params)
        if settings.single_element and all(m == 1 for m in out.shape):
            return [whole(len(out.shape))]          # one element: on every device
        for d, (n, m, axes) in enumerate(zip(a.shape, out.shape, dims_of(a))):
            if n != m and axes and m % count(mesh, axes):
                raise ShardingTypeError(
                    f"{word} on sharded dims where out "
                    f"dim ({m}) is not divisible by mesh axes ({count(mesh, axes)}) with spec "
                    f"({','.join(axes)}) is not implemented (JAX's words). Dimension {d} of "
                    f"{spec_text(dims_of(a))} is split; reshard it whole first, or keep a "
                    f"size the devices divide.")
        return [dims_of(a)]
    return rule


def _iota(mesh, avals, shape, sharding=None, **params):
    return [resolve(sharding, mesh, len(shape)) or whole(len(shape))]


def _dot_general(mesh, avals, dimension_numbers, out_sharding=None, **params):
    lhs, rhs = avals
    (lc, rc), (lb, rb) = dimension_numbers
    nb = len(lb)
    if out_sharding is not None:
        free = lhs.ndim + rhs.ndim - len(lc) - len(rc) - nb
        return [resolve(out_sharding, mesh, free)]
    ld, rd = dims_of(lhs), dims_of(rhs)
    for what, ls, rs in (("lhs batch dimensions and rhs batch dimensions", lb, rb),
                         ("contracting dimensions", lc, rc)):
        for i, j in zip(ls, rs):
            alike = ls is lb and settings.batch_alike
            if (ld[i] != rd[j]) if alike else (ld[i] and rd[j] and ld[i] != rd[j]):
                raise ShardingTypeError(
                    f"dot_general requires {what} to have the consistent sharding, got "
                    f"{spec_text([ld[i] for i in ls])} and {spec_text([rd[j] for j in rs])} "
                    f"(JAX's words). reshard one operand first.")
    for i, j in zip(lc, rc):
        if ld[i] and rd[j]:
            raise ShardingTypeError(
                f"Contracting dimensions are sharded and it is ambiguous how the output "
                f"should be sharded (JAX's words): the summed-over dimension is split over "
                f"{ld[i]} on both operands, so each device ends with a partial sum. Say where "
                f"the sum goes with out_sharding=: P(...) without {ld[i][0]!r} sums onto every "
                f"device (an all-reduce); P(...) that splits a result dimension over "
                f"{ld[i][0]!r} leaves each device its slice of the sum (a reduce-scatter).")
    keep_l = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
    keep_r = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
    return [tuple([ld[i] for i in lb] + [ld[i] for i in keep_l] + [rd[j] for j in keep_r])]


# reshape: JAX's rule follows a split when one dimension is cut into several (the axes go
# to the leading new dims that take them whole) or several merged into one.

def _split_on_one_axis(old, new):
    """JAX's ``_split_on_one_axis``: each old dim as its new size or the list of new sizes
    it is cut into; None when more than one dim is cut, (False,) when it is no split."""
    if len(new) <= len(old):
        return False
    ones = 0
    while old and new and old[-1] == 1 and new[-1] == 1:
        ones, old, new = ones + 1, old[:-1], new[:-1]
    i = j = cuts = 0
    out = []
    while j < len(new):
        if i >= len(old):
            return False
        if old[i] == new[j]:
            out.append(old[i])
        else:
            cuts += 1
            if cuts > 1:
                return None
            part, nj, ni = [new[j]], j + 1, i + 1
            while math.prod(part) != old[i] or (nj < len(new) and new[nj] == 1):
                if math.prod(part) > old[i]:
                    return False
                if math.prod(part) == old[i] and ni < len(old) and new[nj] == old[ni]:
                    break
                j += 1
                if j >= len(new):
                    return False
                part.append(new[j])
                nj += 1
            out.append(part)
        i, j = i + 1, j + 1
    return out + [1] * ones


def _assign(mesh, axes, sizes, fail):
    """JAX's ``split_partitions``: give the axes, in order, to the sizes, each taking
    whole axes while it can."""
    it, out = iter(axes), []
    for n in sizes:
        got = []
        while n > 1:
            a = next(it, None)
            if a is None:
                break
            n, rem = divmod(n, mesh.shape[a])
            if rem:
                fail()
            got.append(a)
        out.append(tuple(got))
    if next(it, None) is not None:
        fail()
    return out


def _reshape(mesh, avals, new_sizes, dimensions=None, sharding=None):
    a = avals[0]
    if sharding is not None:
        return [resolve(sharding, mesh, len(new_sizes))]
    dims = dims_of(a)
    if not any(dims):
        return [whole(len(new_sizes))]

    def fail():
        raise ShardingTypeError(
            f"This reshape is not supported (JAX's words): {a.str_short()} to "
            f"{tuple(new_sizes)}. JAX follows a split only when one dimension is cut into "
            f"several or several are merged into one; say the result's layout with "
            f"x.reshape(..., out_sharding=P(...)), or reshard x whole first.")
    if [n for n in a.shape if n != 1] == [n for n in new_sizes if n != 1]:
        kept = iter(s for n, s in zip(a.shape, dims) if n != 1)
        return [tuple(() if n == 1 else next(kept) for n in new_sizes)]
    split = _split_on_one_axis(tuple(a.shape), tuple(new_sizes))
    if split is None:
        fail()
    if split:
        out = []
        for part, s in zip(split, dims):
            if not isinstance(part, list):
                out.append(s)
            elif not s:
                out += [()] * len(part)
            elif not settings.reshape_spread:        # the first new dim takes the split
                if part[0] % count(mesh, s):
                    fail()
                out += [s] + [()] * (len(part) - 1)
            else:
                out += _assign(mesh, s, part, fail)
        return [tuple(out)]
    merge = _split_on_one_axis(tuple(new_sizes), tuple(a.shape))
    if not merge:
        fail()
    out, src = [], iter(dims)
    for n, part in zip(new_sizes, merge):
        if not isinstance(part, list):
            out.append(next(src))
            continue
        if not settings.reshape_spread:              # only a split first dim merges
            parts = [next(src) for _ in part]
            if any(parts[1:]):
                fail()
            out.append(parts[0])
            continue
        axes = [x for _ in part for x in (next(src) or (None,))]
        while axes and axes[-1] is None:
            axes.pop()
        if not axes:
            out.append(())
        elif None in axes:
            fail()
        else:
            out += _assign(mesh, axes, [n], fail)
    return [tuple(out)]


def _gather(mesh, avals, indexer, mode=None):
    """NumPy's indexing by arrays: the indexed dims must be whole (as JAX asks); the
    dims a ``:`` keeps keep their split; the index arrays' dims are whole."""
    x, xd = avals[0], dims_of(avals[0])
    out_ndim = P.gather.abstract(*avals, indexer=indexer, mode=mode).ndim
    entries = _expanded(indexer, x.ndim)
    advanced = [k for k, e in enumerate(entries) if e is not None and not isinstance(e, slice)]
    together = advanced == list(range(advanced[0], advanced[-1] + 1)) if advanced else True
    n_adv = out_ndim - sum(1 for e in entries if e is None or isinstance(e, slice))
    split = any(a.sharding is not None and any(dims_of(a)) for a in avals[1:])
    out, d = ([] if together else [()] * n_adv), 0
    for k, e in enumerate(entries):
        if e is None:
            out.append(())
            continue
        full = isinstance(e, slice) and e == slice(None)
        split = split or (bool(xd[d]) and not full)
        if isinstance(e, slice):
            out.append(xd[d])
        elif together and k == advanced[0]:
            out += [()] * n_adv
        d += 1
    if split:
        raise ShardingTypeError(
            "Use `.at[...].get(out_sharding=)` to provide output PartitionSpec for the gather "
            "indexing as out sharding could not be resolved unambiguously (JAX's words): an "
            "indexed dimension, or the index, is split. reshard it whole first.")
    return [tuple(out)]


def _expanded(indexer, ndim):
    used = sum(1 for i in indexer if i is not None and i is not Ellipsis)
    out = []
    for i in indexer:
        out += [slice(None)] * (ndim - used) if i is Ellipsis else [i]
    return out + [slice(None)] * (ndim + sum(1 for i in out if i is None) - len(out))


def _full_index(indexer, ndim):
    return [i for i in _expanded(indexer, ndim) if i is not None]


def _scatter(mesh, avals, indexer):
    x = avals[0]
    touched = [d for d, i in enumerate(_full_index(indexer, x.ndim))
               if not (isinstance(i, slice) and i == slice(None))]
    if any(dims_of(x)[d] for d in touched):
        raise ShardingTypeError("x.at[...] on a split dimension: simpmd asks for that dimension "
                                "whole (reshard it first).")
    return [dims_of(x)]


def _numpy_call(mesh, avals, name, **params):
    raise ShardingTypeError(
        f"numpy.{name} has no JAX primitive, so no sharding rule: under jit write it with "
        f"simpmd.numpy functions that JAX has (arithmetic, reductions, reshapes, indexing).")


def _branches(mesh, avals, branches, **params):
    return [dims_of(a) for a in branches[0].out_avals]


def _body(mesh, avals, jaxpr, **params):
    """A checkpoint: its body's results, typed when the body was traced."""
    return [dims_of(a) for a in jaxpr.out_avals]


def _scan(mesh, avals, jaxpr, num_carry, **params):
    """A scan: the carry keeps the type it was traced with (the front end checks that the
    body returns it unchanged, JAX's TypeError otherwise); the stacked ``ys`` add a
    leading dimension, whole on every device."""
    outs = jaxpr.out_avals
    return [dims_of(a) for a in outs[:num_carry]] + [((),) + dims_of(a) for a in outs[num_carry:]]


def _while(mesh, avals, body_jaxpr, **params):
    return [dims_of(a) for a in body_jaxpr.out_avals]


# -- the plans: how each device computes its block -------------------------------------------


class Plan:
    """``ins``: the layout each operand must be in (None: as it is); ``params``: the
    primitive's parameters on blocks (None: the moved operands are the results);
    ``sums``: (collective, mesh axes) left to combine the blocks with; ``out``: the
    layout of each result after them."""

    __slots__ = ("ins", "params", "sums", "out", "then")

    def __init__(self, ins, params, out, sums=(), then=None):
        self.ins, self.params, self.out, self.sums = ins, params, out, list(sums)
        self.then = then          # (run, block, cause) -> block: a route of its own


def computed_whole(avals, outs, **params):
    """The fallback: every operand whole on every device, the result too (then sliced)."""
    return Plan([whole(a.ndim) for a in avals], params, [whole(o.ndim) for o in outs])


def _elementwise_plan(avals, outs, **params):
    out = dims_of(outs[0])
    ins = [tuple(() if a.shape[d] == 1 else out[d] for d in range(a.ndim)) if a.ndim else ()
           for a in avals]
    return Plan(ins, _local(params), [out])


def _local(params):
    return {k: (None if k in ("sharding", "out_sharding") else v) for k, v in params.items()}


def _as_is(avals, outs, **params):
    """Layout-only work that needs no traffic (transpose, squeeze): blocks as they are."""
    return Plan([dims_of(a) for a in avals], params, [dims_of(o) for o in outs])


def _reduce_plan(combine):
    """Each device reduces its block; ``combine`` (the row's collective, a column) adds the
    partial results up across the axes that split a reduced dim (without one, as for
    argmax, the reduced dims are made whole first)."""
    def plan(avals, outs, axes, **params):
        d = dims_of(avals[0])
        if combine is None:
            ins = tuple(() if k in axes else s for k, s in enumerate(d))
            return Plan([ins], _local(dict(params, axes=axes)),
                        [tuple(s for k, s in enumerate(ins) if k not in axes)])
        sums = [(combine, d[k]) for k in axes if d[k]]
        return Plan([d], _local(dict(params, axes=axes)),
                    [tuple(s for k, s in enumerate(d) if k not in axes)], sums)
    return plan


def _dot_plan(avals, outs, dimension_numbers, **params):
    """Each device multiplies its blocks: a contracting dim split (over axes C) on either
    side is split alike on both, the result's dims are laid out as the type says less
    those axes, and the partial sums over C are combined afterwards."""
    lhs, rhs = avals
    (lc, rc), (lb, rb) = dimension_numbers
    ld, rd, out = dims_of(lhs), dims_of(rhs), dims_of(outs[0])
    used, contract = set(), []
    for i, j in zip(lc, rc):
        axes = tuple(a for a in (ld[i] or rd[j]) if a not in used)
        holders = [s for s in out if set(s) & set(axes)]
        if any(s[len(s) - len(axes):] != axes for s in holders):
            axes = ()                     # the result wants them elsewhere: gather instead
        used |= set(axes)
        contract.append(axes)
    layout = [tuple(a for a in s if a not in used) for s in out]
    lw, rw = [()] * lhs.ndim, [()] * rhs.ndim
    for k, (i, j) in enumerate(zip(lb, rb)):
        lw[i] = rw[j] = layout[k]
    for k, (i, j) in enumerate(zip(lc, rc)):
        lw[i] = rw[j] = contract[k]
    keep_l = [d for d in range(lhs.ndim) if d not in tuple(lc) + tuple(lb)]
    keep_r = [d for d in range(rhs.ndim) if d not in tuple(rc) + tuple(rb)]
    for k, i in enumerate(keep_l):
        lw[i] = layout[len(lb) + k]
    for k, j in enumerate(keep_r):
        rw[j] = layout[len(lb) + len(keep_l) + k]
    return Plan([tuple(lw), tuple(rw)], _local(dict(params, dimension_numbers=dimension_numbers)),
                [tuple(layout)], [(K.psum, c) for c in contract if c])


def _groups(old, new):
    """Runs of old and new dims with equal products (a reshape's independent parts)."""
    groups, i, j = [], 0, 0
    while i < len(old) or j < len(new):
        oi, nj = [], []
        po = pn = 1
        while True:
            if po <= pn and i < len(old):
                oi.append(i)
                po *= old[i]
                i += 1
            elif j < len(new):
                nj.append(j)
                pn *= new[j]
                j += 1
            else:
                break
            if po == pn and (i == len(old) or old[i] != 1) and (j == len(new) or new[j] != 1):
                break
        groups.append((oi, nj))
    return groups


def _contiguous(shape, dims, mesh):
    """The axes, in order, that split the flattened run of ``dims``, if every device's
    block is one contiguous piece of it; else None."""
    axes, blocked = [], False
    for n, s in zip(shape, dims):
        b = n // count(mesh, s)
        if blocked and (s or b != n):
            return None
        axes += list(s)
        if b != 1:
            blocked = True
    return axes


def _reshape_plan(avals, outs, new_sizes, **params):
    """Local where each device's block is the same contiguous piece before and after.
    Elsewhere the old dims are first laid out along the result's axes in order (an
    all-to-all, as XLA does), or, where that cannot be, gathered whole."""
    a, mesh = avals[0], outs[0].sharding.mesh
    ins, out = list(dims_of(a)), list(dims_of(outs[0]))
    for oi, nj in _groups(a.shape, new_sizes):
        old, new = [a.shape[i] for i in oi], [new_sizes[j] for j in nj]
        before = _contiguous(old, [ins[i] for i in oi], mesh)
        after = _contiguous(new, [out[j] for j in nj], mesh)
        if before is not None and before == after:
            continue
        axes = after if after is not None else [x for j in nj for x in out[j]]
        try:
            lay_in, lay_out = (_assign(mesh, axes, sizes, _cannot) for sizes in (old, new))
        except ValueError:
            lay_in, lay_out = [()] * len(oi), [()] * len(nj)
        for i, s in zip(oi, lay_in):
            ins[i] = s
        for j, s in zip(nj, lay_out):
            out[j] = s
    local = block_shape(new_sizes, out, mesh)
    return Plan([tuple(ins)], dict(params, new_sizes=local, sharding=None), [tuple(out)])


def _cannot():
    raise ValueError


def _bid_plan(avals, outs, shape, broadcast_dimensions, **params):
    a, out = avals[0], dims_of(outs[0])
    mesh = outs[0].sharding.mesh
    ins = tuple(() if a.shape[k] == 1 and shape[d] != 1 else out[d]
                for k, d in enumerate(broadcast_dimensions))
    return Plan([ins], dict(params, shape=block_shape(shape, out, mesh),
                            broadcast_dimensions=broadcast_dimensions, sharding=None), [out])


def _whole_dims(touched):
    """A plan computing locally once the dims ``touched(avals, params)`` are whole (in
    every operand of the result's rank; a padding value or a scalar as it is)."""
    def plan(avals, outs, **params):
        dims = set(touched(avals, params))
        out = tuple(() if d in dims else s for d, s in enumerate(dims_of(outs[0])))
        ins = [out if a.ndim == len(out) else None for a in avals]
        return Plan(ins, params, [out] * len(outs))
    return plan


def _changed(avals, params):
    a = avals[0]
    if "padding_config" in params:
        return [d for d, c in enumerate(params["padding_config"]) if tuple(c) != (0, 0, 0)]
    if "dimension" in params:
        return [params["dimension"]]
    if "dimensions" in params:
        return list(params["dimensions"])
    strides = params.get("strides") or (1,) * a.ndim
    return [d for d in range(a.ndim) if (params["start_indices"][d], params["limit_indices"][d],
                                          strides[d]) != (0, a.shape[d], 1)]


def _slice_plan(avals, outs, start_indices, limit_indices, strides=None):
    """A slice on blocks. A split dim it shortens keeps its split: where each new block
    lies within one old block, that block's device cuts it and sends it on (collective
    permutes, as XLA does); otherwise the dim is gathered whole, sliced, and cut again."""
    a, mesh = avals[0], outs[0].sharding.mesh
    ad, changed = dims_of(a), _changed(avals, dict(start_indices=start_indices,
                                                   limit_indices=limit_indices, strides=strides))
    steps = strides or (1,) * a.ndim
    local_dims = {}                 # split dims each device slices from its own block
    for d in changed:
        if ad[d]:
            ib, ob = a.shape[d] // count(mesh, ad[d]), outs[0].shape[d] // count(mesh, ad[d])
            if steps[d] * ob == ib and start_indices[d] + steps[d] * (ob - 1) < ib:
                local_dims[d] = (start_indices[d], start_indices[d] + steps[d] * (ob - 1) + 1)
    changed = [d for d in changed if d not in local_dims]
    split = [d for d in changed if ad[d]]
    route = None
    if len(split) == 1 and steps[split[0]] == 1:
        d = split[0]
        g = count(mesh, ad[d])
        ib, ob, start = a.shape[d] // g, (limit_indices[d] - start_indices[d]) // g, start_indices[d]
        source = [(start + i * ob) // ib for i in range(g)]
        if all((start + (i + 1) * ob - 1) // ib == source[i] for i in range(g)):
            route = _permuted_slice(d, ad[d], start, ib, ob, source)
    plan = _whole_dims(lambda *_: [d for d in changed if route is None or d != split[0]])(
        avals, outs)
    local = block_shape(a.shape, plan.ins[0], mesh)
    starts, limits = list(start_indices), list(limit_indices)
    for d, s in enumerate(plan.ins[0]):
        if s:                                        # split, and kept: all of its block
            starts[d], limits[d] = local_dims.get(d, (0, local[d]))
    plan.params = dict(start_indices=tuple(starts), limit_indices=tuple(limits), strides=strides)
    plan.then = route
    return plan


def _permuted_slice(d, axes, start, ib, ob, source):
    """Block ``i`` of the slice along dim ``d`` comes from the device at position
    ``source[i]`` along ``axes``, which cuts it from its block; one collective permute
    per round, each device sending at most once a round."""
    def route(run, v, cause):
        pos = run.manual.positions(axes)
        sends = {}
        for i, j in enumerate(source):
            if i != j:
                sends.setdefault(j, []).append(i)

        def piece(stack, k, i):                   # device k's cut for position i
            lo = start + i * ob - pos[k] * ib
            return np.take(stack[k], np.arange(lo, lo + ob), axis=d)
        shape = v.aval.shape[:d] + (ob,) + v.aval.shape[d + 1:]
        out = None if v.stack is None else np.stack(
            [piece(v.stack, k, pos[k]) if source[pos[k]] == pos[k] else np.zeros(shape, v.aval.dtype)
             for k in range(run.n)])
        for r in range(max((len(t) for t in sends.values()), default=0)):
            pairs = tuple((j, dests[r]) for j, dests in sorted(sends.items()) if len(dests) > r)
            sent = None if v.stack is None else np.stack(
                [piece(v.stack, k, dict(pairs)[pos[k]]) if pos[k] in dict(pairs) else
                 np.zeros(shape, v.aval.dtype) for k in range(run.n)])
            got = run.insert(_ppermute, type(v)(v.aval.update(shape=shape), sent), cause,
                             axis_name=tuple(axes), perm=pairs)
            if out is not None:
                mine = np.isin(pos, [i for _, i in pairs])
                out[mine] = got.stack[mine]
        return type(v)(v.aval.update(shape=shape), out)
    return route


def reshard_plan(avals, outs, **params):
    return Plan([dims_of(outs[0])], None, [dims_of(outs[0])])


# -- attaching the columns: by the row, as JAX registers its rules -----------------------------


def _rule(rows, sharding, partition, **columns):
    """Give each of ``rows`` its ``sharding`` and ``partition`` columns (and ``columns``)."""
    for row in rows:
        row.sharding, row.partition = sharding, partition
        for key, value in columns.items():
            setattr(row, key, value)


def _sliced(avals, params):
    return [d for d, (n, k) in enumerate(zip(avals[0].shape, params["slice_sizes"])) if n != k]


def _updated(avals, params):
    return [d for d, (n, k) in enumerate(zip(avals[0].shape, avals[1].shape)) if n != k]


def attach():
    """Give every row of the core its ``sharding`` and ``partition`` columns, and jit's own:
    ``combine`` (the collective that adds up a reduction's partial results, which its plan
    uses), ``defers_sums``
    (a product's partial sums wait for their next use), ``carries_sums(in, out)`` (a
    layout-only, linear row passes pending partial sums on)."""
    from .nested import xla_pmap
    for row in PRIMITIVES.values():
        if getattr(row, "elementwise", False):
            _rule([row], _broadcasting(row.name), _elementwise_plan)
    _rule([P.convert_element_type], _convert, _elementwise_plan,
          carries_sums=lambda a, o: a.dtype.kind + o.dtype.kind == "ff")
    _rule([P.select_n], _select, _elementwise_plan)
    _rule([P.clamp], _clamp, _elementwise_plan)
    _rule([P.dot_general], _dot_general, _dot_plan, defers_sums=True)
    _rule([P.reshape], _reshape, _reshape_plan, carries_sums=lambda a, o: True)
    _rule([P.broadcast_in_dim], _broadcast_in_dim, _bid_plan)
    _rule([P.transpose], _transpose, _as_is, carries_sums=lambda a, o: True)
    _rule([P.squeeze], _squeeze, _as_is, carries_sums=lambda a, o: True)
    P.copy.carries_sums = lambda a, o: True
    _rule([P.rev], _first, _whole_dims(_changed))
    _rule([P.concatenate], _concatenate, _whole_dims(lambda avals, p: [p["dimension"]]))
    _rule([P.pad], _varying_shape(P.pad, "padding"), _whole_dims(_changed))
    _rule([P.slice_], _varying_shape(P.slice_, "slicing"), _slice_plan)
    _rule([P.dynamic_slice], _varying_shape(P.dynamic_slice, "dynamic_slice"),
          _whole_dims(_sliced))
    _rule([P.dynamic_update_slice], _first, _whole_dims(_updated))
    _rule([P.iota], _iota, computed_whole)
    _rule([P.gather], _gather, computed_whole)
    _rule([P.sort], _sort, _as_is)
    _rule([P.numpy_call], _numpy_call, None)
    _rule([control.cond], _branches, None)
    _rule([loops.remat], _body, None)
    _rule([loops.name_p], _first, _as_is)
    for row, combine in ((P.reduce_sum, K.psum), (P.reduce_max, K.pmax), (P.reduce_min, K.pmin),
                         (P.reduce_and, K.pmin), (P.reduce_or, K.pmax), (P.reduce_prod, None),
                         (P.argmax, None), (P.argmin, None)):
        _rule([row], _reduce, _reduce_plan(combine), combine=combine)
    _rule([P.cumsum, P.cumprod, P.cummax, P.cummin], _cumulative, _as_is)
    _rule([P.scatter, P.scatter_add, P.scatter_mul, P.scatter_min, P.scatter_max], _scatter,
          computed_whole)
    loops.scan.sharding, loops.while_.sharding = _scan, _while
    xla_pmap.sharding = lambda mesh, avals, call_jaxpr, **p: [   # its results come back whole
        whole(a.ndim) for a in xla_pmap.abstract(*avals, call_jaxpr=call_jaxpr, **p)]


def rows_without_rules() -> list:
    """Rows with no sharding column (a test keeps this to the collectives and calls)."""
    return sorted(n for n, p in PRIMITIVES.items() if getattr(p, "sharding", None) is None)


# -- the type of a whole program's arguments -------------------------------------------------


def reshard_rule(mesh, avals, dst_sharding):
    return [resolve(dst_sharding, mesh, avals[0].ndim, "reshard")]


def broadcast_sharding(mesh, avals):
    """The layout that broadcasting ``avals`` together gives (``jnp`` broadcasts a
    ``where``'s operands to it)."""
    rank = max(a.ndim for a in avals)
    lined = [a.update(shape=(1,) * (rank - a.ndim) + a.shape, sharding=None if a.sharding is None
                      else type(a.sharding)(a.sharding.mesh, whole(rank - a.ndim) + dims_of(a)))
             if a.ndim and a.ndim < rank else a for a in avals]
    return _broadcasting("broadcast_shardings")(mesh, lined)[0]
