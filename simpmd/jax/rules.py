"""Which sharding rules the running JAX follows where its releases differ, read from it.

simpmd's ``jit`` types values by sharding as JAX does, and some of JAX's rules changed
between releases (which operations keep a partial sum, how a reshape follows a split,
when ``dot_general`` refuses batch dimensions split differently). Each question here is
answered by tracing a tiny program on the running JAX, once per process, never from a
version number. The programs run on an abstract 2 x 2 mesh of Explicit axes ``X`` and
``Y`` (``jax.eval_shape`` on ShapeDtypeStructs: no device is used and JAX's backend is
not started), on a thread of their own, so that no mesh the caller has set up interferes.
``simpmd.partitioner.sharding.settings`` asks; without JAX imported it uses the newest answers.
"""
from __future__ import annotations

import functools
import sys
import threading

import numpy as np

from ..partitioner.columns import column


class Unavailable(Exception):
    """This JAX cannot trace the probes (no abstract meshes or Explicit axes)."""


def _jax():
    return sys.modules["jax"]


def _mesh():
    jax = _jax()
    try:
        from jax.sharding import AbstractMesh, AxisType  # optional: JAX
        return AbstractMesh((2, 2), ("X", "Y"), axis_types=(AxisType.Explicit,) * 2)
    except Exception as exc:
        raise Unavailable(f"jax {getattr(jax, '__version__', '?')}: {exc}") from exc


def typed(shape, *spec, dtype=np.float32, **sets):
    """A ShapeDtypeStruct on the probes' mesh laid out as ``P(*spec, **sets)``."""
    jax = _jax()
    sharding = jax.sharding.NamedSharding(_mesh(), jax.sharding.PartitionSpec(*spec, **sets))
    return jax.ShapeDtypeStruct(tuple(shape), dtype, sharding=sharding)


def _in_thread(probe):
    """``probe()`` run in a thread of its own (outside any trace of the caller's), its
    result or the exception it raised; an Unavailable, AttributeError or ImportError means
    this JAX cannot answer, and is raised as Unavailable."""
    box = []

    def run():
        try:
            box.append(probe())
        except Exception as exc:                 # the answer, or Unavailable below
            box.append(exc)
    thread = threading.Thread(target=run, name="simpmd-rule-probe")
    thread.start()
    thread.join()
    if isinstance(box[0], (Unavailable, AttributeError, ImportError)):
        raise Unavailable(str(box[0]))
    return box[0]


def _traced(fun, *args):
    """The result types of ``fun`` on ``args``, or the exception JAX raised."""
    jax = _jax()

    def trace():
        with jax.sharding.use_abstract_mesh(_mesh()):
            return jax.eval_shape(fun, *args)
    return _in_thread(trace)


def _refuses(fun, *args) -> bool:
    return isinstance(_traced(fun, *args), Exception)


def _spec(fun, *args):
    out = _traced(fun, *args)
    return None if isinstance(out, Exception) else out.sharding.spec


# -- jit's sharding rules ------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def batch_alike() -> bool:
    """Whether dot_general wants each batch dimension split alike on both operands, or
    lets a whole one meet a split one."""
    jax = _jax()
    return _refuses(lambda a, b: jax.lax.dot_general(a, b, (((2,), (1,)), ((0,), (0,)))),
                    typed((2, 4, 4), "X"), typed((2, 4, 4)))


@functools.lru_cache(maxsize=None)
def matmul_batch() -> bool:
    """Whether ``jnp.matmul`` itself refuses batch dimensions split differently."""
    jax = _jax()
    return _refuses(jax.numpy.matmul, typed((2, 4, 4), "X"), typed((2, 4, 4)))


@functools.lru_cache(maxsize=None)
def single_element() -> bool:
    """Whether a slice down to one element of a split dimension is replicated (or refused
    as any slice the split does not divide)."""
    return not _refuses(lambda a: a[0:1], typed((8,), "X"))


@functools.lru_cache(maxsize=None)
def reshape_spread() -> bool:
    """Whether a reshape merges dimensions split on several axes and hands a split out
    over new dimensions (or follows a split only into the first new dimension)."""
    return not _refuses(lambda a: a.reshape(8), typed((2, 4), "X", "Y"))


@functools.lru_cache(maxsize=None)
def reshape_ones() -> bool:
    """Whether a reshape looks past dimensions of size 1 to find its split or merge
    (``f32[2@X,2@Y,3]`` to ``(2, 6, 1)`` is a merge), or refuses it."""
    return not _refuses(lambda a: a.reshape(2, 6, 1), typed((2, 2, 3), "X", "Y", None))


@functools.lru_cache(maxsize=None)
def strided_slice() -> bool:
    """Whether ``x[::2]`` of a split dimension is a slice that keeps the split (or a
    gather, which refuses it)."""
    return not _refuses(lambda a: a[::2], typed((8,), "X"))


@functools.lru_cache(maxsize=None)
def empty_take_keeps_split() -> bool:
    """Whether an index outside jit whose result is empty (``x[2:2]``) keeps the operand's
    splits on the dimensions it keeps (jax 0.10: ``lax.full_like(..., sharding=)``), or
    gives a replicated empty array (0.7). JAX takes that path before its gather, so the
    answer shows only on a real array: two devices are needed to see it."""
    jax = _jax()
    try:
        from jax.sharding import AxisType, NamedSharding, PartitionSpec  # optional: JAX
        cpus = jax.devices("cpu")
    except Exception as exc:
        raise Unavailable(str(exc)) from exc
    if len(cpus) < 2:
        raise Unavailable("one CPU device: no split array to index")

    def take():
        mesh = jax.sharding.Mesh(np.array(cpus[:2]), ("X",), axis_types=(AxisType.Explicit,))
        x = jax.device_put(np.zeros((2,), np.float32), NamedSharding(mesh, PartitionSpec("X")))
        with jax.set_mesh(mesh):
            return tuple(x[1:1].sharding.spec) == ("X",)
    answer = _in_thread(take)
    if isinstance(answer, Exception):            # a JAX that cannot run the probe
        raise Unavailable(str(answer))
    return answer


@functools.lru_cache(maxsize=None)
def shard_map_checks() -> bool:
    """Whether shard_map refuses an operand laid out otherwise than its in_specs (or
    moves it there)."""
    jax = _jax()
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        raise Unavailable("no jax.shard_map")
    P = jax.sharding.PartitionSpec
    return _refuses(lambda a: shard_map(lambda v: v * 2, mesh=_mesh(), in_specs=P("X"),
                                        out_specs=P("X"))(a), typed((8,)))


@functools.lru_cache(maxsize=None)
def unreduced_out_cast() -> bool:
    """Whether shard_map takes a result that varies over an axis its out_specs call
    unreduced as the parts of a sum over it (jax 0.10: typed ``{U:X}``), or refuses it
    unless the result is unreduced there already (0.12)."""
    jax = _jax()
    shard_map = getattr(jax, "shard_map", None)
    if shard_map is None:
        raise Unavailable("no jax.shard_map")
    P = jax.sharding.PartitionSpec
    out = _traced(lambda a: shard_map(lambda v: v.sum(), mesh=_mesh(), in_specs=P("X"),
                                      out_specs=P(unreduced={"X"}))(a), typed((8,), "X"))
    if isinstance(out, Exception):
        return False
    if not getattr(out.sharding.spec, "unreduced", None):
        raise Unavailable("this JAX drops the unreduced type of a shard_map's result")
    return True


@functools.lru_cache(maxsize=None)
def cotangent_swaps() -> bool:
    """Whether the gradient of a reduced operand of a product comes out unreduced (JAX's
    cotangent types swap reduced and unreduced), or plain."""
    jax = _jax()
    spec = _spec(jax.grad(lambda w, x: (x @ w).sum()), typed((4, 4), None, None, reduced={"X"}),
                 typed((8, 4), "X", None))
    return bool(spec is not None and getattr(spec, "unreduced", None))


@functools.lru_cache(maxsize=None)
def spec_rank_checked() -> bool:
    """Whether ``reshard`` refuses a spec with more entries than the value has dimensions
    (or lets trailing ``None`` entries pass)."""
    jax = _jax()
    reshard = getattr(jax, "reshard", None) or jax.sharding.reshard
    P = jax.sharding.PartitionSpec
    return _refuses(lambda a: reshard(a, P(None, None, None)), typed((4, 4)))


# -- unreduced and reduced values ------------------------------------------------------------

def _start(start, shape):
    """(a function of the operands, the operands) that makes a value of ``shape`` unreduced
    over X (a product over a dimension split on X) or reduced over X, inside the probe."""
    jax = _jax()
    P, whole = jax.sharding.PartitionSpec, [None] * len(shape)
    if start == "reduced":
        reshard = getattr(jax, "reshard", None) or jax.sharding.reshard
        return lambda w: reshard(w, P(*whole, reduced={"X"})), (typed(shape, *whole),)
    left, right = typed(tuple(shape[:-1]) + (2,), *whole[:-1], "X"), typed((2, shape[-1]), "X", None)
    return (lambda a, b: jax.numpy.einsum("...j,jk->...k", a, b,
                                          out_sharding=P(*whole, unreduced={"X"})),
            (left, right))


def word_of(result, start) -> str:
    """An outcome in few words: 'keeps' (the partial sum, or the reduced type, goes on),
    'drops' (a plain result), 'partial' (an unreduced max or min: what JAX makes of the
    max of partial sums, a wrong value), or how JAX refused: 'no rule'
    (NotImplementedError), 'pspec[...]' and '*pspec' (its ValueError about indexing a
    spec with unreduced axes), 'kind' (an unreduced kind other than sum expected),
    'nonlinear' (its ShardingTypeError naming a non-linear operation) or 'refused'."""
    if isinstance(result, NotImplementedError):
        return "no rule"
    if isinstance(result, Exception):
        text = str(result)
        for word, mark in (("pspec[...]", "pspec[...]"), ("*pspec", "*pspec"),
                           ("nonlinear", "non-linear"), ("kind", "unreduced_kind")):
            if mark in text:
                return word
        return "refused"
    spec = result.sharding.spec
    if start == "unreduced" and getattr(spec, "unreduced", None):
        kind = getattr(getattr(spec, "unreduced_kind", None), "name", "sum")
        return "keeps" if kind == "sum" else "partial"
    return "keeps" if getattr(spec, start, None) else "drops"


@functools.lru_cache(maxsize=None)
def on_operand(row, start) -> str:
    """What the running JAX does with ``row`` on a value unreduced or reduced (``start``)
    over X, in the words of :func:`word_of`. The program is the row's ``unreduced_probe``
    column: (the operand's shape, a function of ``jax.numpy``, ``jax.lax``, the operand
    and a scalar reduced over X)."""
    jax = _jax()
    shape, program = column(row, "unreduced_probe")
    jnp, P = jax.numpy, jax.sharding.PartitionSpec
    reshard = getattr(jax, "reshard", None) or jax.sharding.reshard

    def two():
        return reshard(jnp.asarray(np.float32(2.0)), P(reduced={"X"}))
    make, operands = _start(start, shape)
    return word_of(_traced(lambda *xs: program(jnp, jax.lax, make(*xs), two()), *operands), start)


@functools.lru_cache(maxsize=None)
def contraction_sets() -> str:
    """How a product's ``out_sharding`` names the unreduced axes of a dimension split on
    several: 'axes' (``{'X', 'Y'}``) or 'entries' (the spec's entry, ``{('X', 'Y')}``)."""
    jnp, P = _jax().numpy, _jax().sharding.PartitionSpec
    return "entries" if _refuses(
        lambda a, b: jnp.einsum("ij,jk->ik", a, b, out_sharding=P(None, None, unreduced={"X", "Y"})),
        typed((4, 4), None, ("X", "Y")), typed((4, 4), ("X", "Y"), None)) else "axes"


# -- collectives ---------------------------------------------------------------------------

def ppermute_out_of_mesh_order() -> str:
    """What the running JAX does with a ``ppermute`` over a tuple of axes out of the
    mesh's order: 'refuses' (from 0.11.2, while ``jax_raise_on_ppermute_sort_diff`` is on:
    a RuntimeError when it lowers), 'follows' (that flag turned off: the devices are
    numbered in the given order) or 'mesh order' (a JAX without the flag, up to 0.10: the
    devices are numbered in the mesh's order, whatever the order given). Read at every
    call, since the flag can change."""
    flag = getattr(_jax().config, "jax_raise_on_ppermute_sort_diff", None)
    if flag is None:
        return "mesh order"
    return "refuses" if flag else "follows"
