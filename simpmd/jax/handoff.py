"""simpmd programs on real JAX: where the simulation hands over.

One function body, written with ``simpmd.lax`` and ``simpmd.numpy``, runs on both
engines. The simulation's core (``pmap.py``, ``shard_map.py``, ``lax.py``) looks at its
arguments once per call: when they are JAX tracers, the call sits inside a real JAX
transformation, and this module says what it means there:

* a ``simpmd.lax`` collective outside any simulated run is ``jax.lax``'s;
* a ``simpmd.shard_map`` called on tracers (inside ``jax.jit``, a cross-check) is the same
  program as a ``jax.shard_map`` (:func:`shard_map_on_jax`, also ``simpmd.shard_map.on_jax``);
* a ``simpmd.pmap`` called on tracers is the inner map of a nested program, which today's
  JAX spells ``jax.vmap`` with an axis name (:func:`pmap_inside_jax`).

Nothing here runs unless JAX is imported; the engine never imports it.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
import inspect
import re
import sys
from typing import Any

import numpy as np

from ..core import bridge
from . import printing  # noqa: F401  (how the running JAX prints: simpmd's printer asks)
from . import rules  # noqa: F401  (which sharding rules the running JAX follows: jit asks)
from ..api import tree
from ..core.core import context
from ..api.shard_map import shard_map
from ..machine.mesh import PartitionSpec
from ..numpy import uses_jax as _uses
from ..core.collectives import settings
from ..core.core import PRIMITIVES


holds_tracer = bridge.holds_jax_tracer       # True inside a JAX trace


def uses_jax(value) -> bool:
    """True if ``value`` holds a JAX array or tracer (inside lists, tuples and dicts too)."""
    return _uses(value)


def collective(name, *args, **kwargs):
    """``jax.lax.<name>``, for a ``simpmd.lax`` call made outside any simulated run, or
    NotImplemented when JAX is not in use."""
    jax = sys.modules.get("jax")
    if jax is None:
        return NotImplemented
    return getattr(jax.lax, name)(*args, **kwargs)


# -- which JAX is installed ----------------------------------------------------------------

def jax_version(jax) -> tuple:
    """``jax.__version__`` as a tuple of ints, e.g. (0, 10, 2)."""
    parts = re.findall(r"\d+", getattr(jax, "__version__", "0"))[:3]
    return tuple(int(p) for p in parts)


def find_shard_map(jax):
    """(shard_map, name of its 'do not check replication' keyword), or (None, None).

    ``jax.shard_map`` (check_vma) in current JAX; ``jax.experimental.shard_map`` (check_rep)
    in older releases.
    """
    fn = getattr(jax, "shard_map", None)
    if fn is None:
        try:
            from jax.experimental.shard_map import shard_map as fn  # optional: JAX
        except ImportError:
            return None, None
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    for name in ("check_vma", "check_rep"):
        if name in params:
            return fn, name
    return fn, None


# -- the rules that changed between releases, taken from the running JAX -----------------------

_followed = None


def follow_rules(jax, device=None) -> frozenset:
    """Which reduction rows the running JAX accepts on a value that varies over only some
    of their axes under ``shard_map(check_vma=True)`` (it makes the value vary over all of
    them first): found by tracing each row's lax function on JAX, never from a stored
    version number, and given to the rows (``collectives.settings.partial``). Asked once
    per process, on an abstract 1 x 1 mesh (no device, the backend not started), or on
    ``device`` where this JAX has no abstract meshes."""
    global _followed
    if _followed is not None:
        return _followed
    from jax.sharding import Mesh, PartitionSpec as JP  # optional: JAX
    try:
        from jax.sharding import AbstractMesh, AxisType  # optional: JAX
        mesh = AbstractMesh((1, 1), ("a", "b"), axis_types=(AxisType.Auto,) * 2)
    except Exception:
        mesh = Mesh(np.array([device or jax.devices()[0]]).reshape(1, 1), ("a", "b"))
    shard_map, check = find_shard_map(jax)
    accepted = set()
    for row in (r for r in PRIMITIVES.values() if getattr(r, "reduction", False)):
        op, keywords = getattr(jax.lax, row.op), row.probe_keywords or {}
        body = shard_map(lambda x, op=op, kw=keywords: op(x, ("a", "b"), **kw), mesh=mesh,
                         in_specs=JP("a"), out_specs=JP(("a", "b")),
                         **{check or "check_vma": True})
        try:
            jax.make_jaxpr(body)(np.ones(2, np.float32))
        except Exception:              # refused by its type, as simpmd refuses it
            continue
        accepted.add(row)
    settings.partial = _followed = frozenset(accepted)
    return _followed


def followed_rules():
    """The running JAX's rules once JAX is imported (asking starts no backend), or None.
    (A JAX without abstract meshes is asked once its backend is up.)"""
    jax = sys.modules.get("jax")
    if _followed is not None or jax is None:
        return _followed
    if not hasattr(getattr(jax, "sharding", None), "AbstractMesh"):
        try:
            from jax._src import xla_bridge  # optional: JAX
            if not xla_bridge.backends_are_initialized():
                return None
        except Exception:                  # a JAX without that function: ask its devices
            pass
    return follow_rules(jax)


# -- nested simpmd.pmap inside a JAX trace -------------------------------------------------

@dataclass
class Translation:
    """How a ``simpmd.pmap`` that meets JAX tracers is run (see :func:`pmap_inside_jax`)."""

    mode: str = "vmap"                   # 'vmap' or 'shard_map'
    inner_name: Any = None               # shard_map: the axis name the inner pmap maps
    inner_size: int | None = None
    mesh_axis: Any = None                # shard_map: the mesh axis standing for it
    calls: list = field(default_factory=list)    # (axis_name, size) of each translated pmap


_translation: Translation | None = None


def pmap_inside_jax(pmapped, args, kwargs):
    """The JAX meaning of a ``simpmd.pmap`` called inside a real JAX trace, or NotImplemented.

    A ``simpmd.pmap`` called on a simulated device is a nested pmap of the simulation. One
    called where no simulated device runs, on JAX tracers, sits inside a real JAX
    transformation: typically the outer ``jax.pmap`` of a nested program. Real JAX no
    longer nests pmap, so it becomes ``jax.vmap(fun, in_axes, out_axes, axis_name=...)``:
    the same named axis, mapped inside each device. Under crosscheck's shard_map
    translation the named axis is a mesh axis instead, and each device keeps its own
    slice of it. Anything else (plain NumPy arguments) returns NotImplemented: simulate.
    """
    if context.run is not None:
        return NotImplemented
    jax = sys.modules.get("jax")
    if jax is None or not holds_tracer((args, kwargs)):
        return NotImplemented
    translation = _translation or Translation()
    static, dynamic = _static_split(pmapped.static_argnums, len(args))
    per_arg = _per_arg_axes(pmapped.in_axes, len(args))
    size = pmapped.axis_size
    for i in dynamic:
        for leaf, ax in zip(tree.flatten(args[i])[0], tree.broadcast_prefix(per_arg[i], args[i])):
            if ax is not None and size is None:
                size = int(np.shape(leaf)[ax])
    translation.calls.append((pmapped.axis_name, size))
    if translation.mode == "shard_map":
        return _inner_on_mesh(jax, translation, pmapped, args, kwargs, static, per_arg, size)

    def with_static(*dyn, **kw):
        full = list(args)
        for i, v in zip(dynamic, dyn):
            full[i] = v
        return pmapped.fun(*full, **kw)

    in_axes = pmapped.in_axes
    if isinstance(in_axes, (list, tuple)):
        in_axes = tuple(in_axes[i] for i in dynamic)
    return jax.vmap(with_static, in_axes=in_axes, out_axes=pmapped.out_axes,
                    axis_name=pmapped.axis_name, axis_size=pmapped.axis_size)(
        *[args[i] for i in dynamic], **kwargs)


def _inner_on_mesh(jax, translation, pmapped, args, kwargs, static, per_arg, size):
    """Inside shard_map: this device's slice of the inner axis, gathered back afterwards."""
    name = pmapped.axis_name
    if name != translation.inner_name or size != translation.inner_size:
        raise ValueError(
            f"crosscheck's shard_map translation maps the inner axis "
            f"{translation.inner_name!r} of size {translation.inner_size}, but this nested "
            f"simpmd.pmap maps {name!r} of size {size}; only one inner pmap axis translates.")
    name = translation.mesh_axis
    index = jax.lax.axis_index(name)

    def my_slice(leaf, ax):
        if ax is None:
            return leaf
        return jax.lax.dynamic_index_in_dim(leaf, index, ax % np.ndim(leaf), keepdims=False)

    new_args = list(args)
    for i, a in enumerate(args):
        if i not in static:
            leaves, td = tree.flatten(a)
            axes = tree.broadcast_prefix(per_arg[i], a)
            new_args[i] = tree.unflatten(td, [my_slice(v, ax) for v, ax in zip(leaves, axes)])
    kw_leaves, kw_def = tree.flatten(kwargs)
    new_kwargs = tree.unflatten(kw_def, [my_slice(v, 0) for v in kw_leaves])
    out = pmapped.fun(*new_args, **new_kwargs)
    leaves, td = tree.flatten(out)
    axes = tree.broadcast_prefix(pmapped.out_axes, out, what="out_axes")
    import jax.numpy as jnp  # optional: JAX
    gathered = []
    for leaf, ax in zip(leaves, axes):
        leaf = jnp.asarray(leaf)
        gathered.append(leaf if ax is None else
                        jax.lax.all_gather(leaf, name, axis=ax % (leaf.ndim + 1)))
    return tree.unflatten(td, gathered)


@contextlib.contextmanager
def translating(translation: Translation):
    """Within the block, ``simpmd.pmap`` calls on JAX tracers follow ``translation``."""
    global _translation
    previous, _translation = _translation, translation
    try:
        yield translation
    finally:
        _translation = previous


def _static_split(static_argnums, n_args):
    nums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    static = {a % n_args for a in nums} if n_args else set()
    return static, [i for i in range(n_args) if i not in static]


def _per_arg_axes(in_axes, n_args):
    if isinstance(in_axes, (list, tuple)):
        return list(in_axes)
    return [in_axes] * n_args


# -- a shard_map on real JAX ----------------------------------------------------------------

def shard_map_on_jax(shard_mapped, *, devices=None, check_vma=None):
    """``shard_mapped``'s program as a real ``jax.shard_map`` (for cross-checks).

    The JAX mesh has the simpmd mesh's shape and axis names and ``Auto`` axes; the specs
    become ``jax.sharding.PartitionSpec``s; the body is the same function, whose
    ``simpmd.lax`` calls hand over to ``jax.lax`` inside JAX's trace. ``devices`` are the
    JAX devices in the mesh's row-major order (default: the JAX devices with the simpmd
    mesh's device ids). ``check_vma`` defaults to the simpmd program's setting; JAX checks
    replication from types, so it refuses some programs that are replicated in value.
    """
    import jax  # optional: JAX
    from jax.sharding import Mesh as JaxMesh, PartitionSpec as JaxP

    if shard_mapped.eager:
        raise ValueError("this shard_map was made with eager=True: its body uses Python "
                         "control flow on values, which real JAX cannot trace.")
    mesh = shard_mapped.mesh
    check = shard_mapped.check_vma if check_vma is None else check_vma
    shard_map, check_kw = find_shard_map(jax)
    in_specs = _specs_for_jax(shard_mapped.in_specs, JaxP)
    out_specs = _specs_for_jax(shard_mapped.out_specs, JaxP)
    context_mesh = getattr(jax.sharding, "get_abstract_mesh", lambda: None)()
    if (devices is None and context_mesh is not None and not context_mesh.empty
            and tuple(context_mesh.axis_names) == tuple(mesh.axis_names)):
        # inside jax.jit on a mesh of the same axes (jax.set_mesh): JAX's shard_map takes
        # that mesh, as simpmd's does inside simpmd.jit
        manual = {"axis_names": set(shard_mapped.axis_names)} if shard_mapped.axis_names else {}
        return shard_map(shard_mapped.fun, in_specs=in_specs, out_specs=out_specs, **manual,
                         **{check_kw or "check_vma": check})
    if devices is None:
        available = jax.devices()
        ids = [d.id for d in mesh.devices.flat]
        if max(ids) >= len(available):
            raise ValueError(
                f"the mesh uses simpmd devices {ids}, but JAX has only {len(available)} "
                f"devices. Give JAX more (simpmd.use_jax_devices(n) before importing jax) "
                f"or pass devices=.")
        devices = [available[i] for i in ids]
    grid = np.empty(mesh.size, dtype=object)
    grid[:] = list(devices)
    jax_mesh = JaxMesh(grid.reshape(mesh.devices.shape), mesh.axis_names)
    return shard_map(shard_mapped.fun, mesh=jax_mesh, in_specs=in_specs, out_specs=out_specs,
                     **{check_kw or "check_vma": check})


def _specs_for_jax(specs, JaxP):
    """The same pytree of specs with simpmd's P replaced by JAX's (None kept: static)."""
    if isinstance(specs, PartitionSpec):
        return JaxP(*specs)
    if isinstance(specs, tuple) and hasattr(type(specs), "_fields"):
        return type(specs)(*(_specs_for_jax(s, JaxP) for s in specs))
    if isinstance(specs, (tuple, list)):
        return type(specs)(_specs_for_jax(s, JaxP) for s in specs)
    if isinstance(specs, dict):
        return {k: _specs_for_jax(v, JaxP) for k, v in specs.items()}
    return specs


# The core calls this module through simpmd.core.bridge (it never imports it), and the JAX
# translation of a shard_map is reachable from the function: simpmd.shard_map.on_jax(f).
bridge.jax = sys.modules[__name__]
shard_map.on_jax = shard_map_on_jax
