"""A ``shard_map`` inside jit, partitioned: its operands moved to the blocks its
``in_specs`` give each device, its body in line (by hand over its manual axes; over the
others still typed by sharding, and partitioned as jit's), its results' blocks moved to
the layouts their types say. The row itself is ``simpmd.api.shard_map_eqn``'s."""
from __future__ import annotations

from ..core.core import Aval, Equation, aval_of
from .partition import Slot
from .sharding import all_explicit, count, dims_of, explicit_axes, resolve, whole


def sm_global(aval, spec, mesh):
    """A result's global type, from its block's type in the body and its out_specs."""
    dims = resolve(spec, all_explicit(mesh), aval.ndim, "out_specs")
    return Aval(tuple(n * count(mesh, d) for n, d in zip(aval.shape, dims)), aval.dtype,
                aval.weak_type)


def sm_abstract(*avals, jaxpr, shard_mesh, out_specs, _outer_axes=(), **params):
    """The results' global types; inside an enclosing shard_map, still varying over its
    axes where the body's results do."""
    return [sm_global(aval_of(v), s, shard_mesh.mesh).update(
        vma=aval_of(v).vma & frozenset(_outer_axes)) for v, s in zip(jaxpr.outvars, out_specs)]


def sm_rule(mesh, avals, jaxpr, in_specs, out_specs, shard_mesh, **params):
    """A result's type: split over the Explicit axes its out_specs name (major), then over
    those its type in the body had (minor); whole when the jit around it has no mesh."""
    if mesh != shard_mesh.mesh:
        return [whole(aval_of(v).ndim) for v in jaxpr.outvars]
    explicit = set(explicit_axes(mesh))
    return [tuple(tuple(a for a in d if a in explicit) + inner for d, inner in zip(
        resolve(s, all_explicit(mesh), aval_of(v).ndim, "out_specs"), dims_of(aval_of(v))))
        for v, s in zip(jaxpr.outvars, out_specs)]


def partition_shard_map(part, eqn):
    """The shard_map equation ``eqn`` written into the per-device program of ``part``."""
    p, mesh = eqn.params, part.mesh
    if mesh != p["shard_mesh"].mesh:          # a jit without the mesh: run it where it is
        return part.equation(eqn)
    body, manual = p["jaxpr"], p["manual_axes"]
    for v, spec, bv in zip(eqn.invars, p["in_specs"], body.invars):
        a = v.aval
        want = [d + tuple(b for b in own if b not in manual) for d, own in
                zip(resolve(spec, all_explicit(mesh), a.ndim, "in_specs"), dims_of(a))]
        part.env[bv] = Slot(part.block(part.settled(v), a, want, "jit: shard_map"))
    if set(manual) == set(mesh.axis_names):    # by hand: its equations are on blocks already
        _copied(part, body.eqns)
    else:
        outer, part.manual = part.manual, tuple(manual)
        try:
            part.run(body.eqns)
        finally:
            part.manual = outer
    dims = sm_rule(mesh, [], body, p["in_specs"], p["out_specs"], p["shard_mesh"])
    explicit = set(explicit_axes(mesh))
    for var, o, spec, d in zip(eqn.outvars, body.outvars, p["out_specs"], dims):
        a = aval_of(o)
        have = [s + inner for s, inner in
                zip(resolve(spec, all_explicit(mesh), a.ndim, "out_specs"), dims_of(a))]
        if [tuple(x for x in h if x in explicit) for h in have] == [tuple(x) for x in d]:
            part.env[var] = Slot(part.settled(o), layout=None if have == list(d) else have)
            continue                 # split over Auto axes too: moved where a use needs it
        part.env[var] = Slot(part.move(part.settled(o), sm_global(a, spec, mesh).shape, have, d,
                                       "jit: shard_map"))


def _copied(part, eqns):
    """A body written by hand, in line: each equation with its operands' blocks."""
    for e in eqns:
        ins = [part.slot(v).atom for v in e.invars]
        part.eqns.append(Equation(e.primitive, e.params, ins, e.outvars, e.source, e.phase))
        part.env.update((v, Slot(v)) for v in e.outvars)
