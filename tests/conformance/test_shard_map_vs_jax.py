"""simpmd.shard_map against jax.shard_map: the same programs on both, the same values.

Each case is one shard_map program: a mesh shape and axis names, a body written once for
both engines (operators and methods only; collectives through a ``lax`` parameter that
is simpmd.lax on one side and jax.lax on the other), and in/out specs written once for
both ``P`` classes. JAX runs it on 8 fake CPU devices over a ``jax.sharding.Mesh`` built
directly (``jax.make_mesh`` in jax 0.10 makes Explicit axes, which shard_map's
``in_specs`` would have to match).

simpmd always runs with its replication check on; ``jax_check_vma=False`` marks programs
whose outputs are replicated in value but not in JAX's static types (all_gather's output
still counts as varying over the gathered axis), which JAX rejects unless the check is off.
"""
import os

# conftest.py sets this too; repeated here so the module also works on its own.
if "--xla_force_host_platform_device_count=" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

from dataclasses import dataclass
import math
from typing import Callable

import numpy as np
import pytest

import simpmd

RTOL = ATOL = 1e-5


def f32(*shape):
    return np.arange(math.prod(shape), dtype=np.float32).reshape(shape)


@dataclass
class Case:
    name: str
    mesh: tuple                     # ((name, size), ...)
    make: Callable                  # make(lax) -> body
    in_specs: Callable              # in_specs(P) -> spec or pytree prefix
    out_specs: Callable             # out_specs(P) -> spec or pytree prefix
    args: Callable                  # () -> tuple of arguments
    jax_check_vma: bool = True


DM = (("data", 2), ("model", 4))
RING4 = [(i, (i + 1) % 4) for i in range(4)]
RING8 = [(i, (i + 1) % 8) for i in range(8)]

CASES = [
    # -- one mesh axis of a 2-D mesh ------------------------------------------------------
    Case("psum_model", DM, lambda lax: lambda b: lax.psum(b, "model"),
         lambda P: P("data", "model"), lambda P: P("data"), lambda: (f32(4, 8),)),
    Case("pmean_data", DM, lambda lax: lambda b: lax.pmean(b, "data"),
         lambda P: P("data", "model"), lambda P: P(None, "model"), lambda: (f32(4, 8),)),
    Case("pmax_pmin_model", DM, lambda lax: lambda b: (lax.pmax(b, "model"), lax.pmin(b * -1, "model")),
         lambda P: P("data", "model"), lambda P: (P("data"), P("data")), lambda: (f32(4, 8),)),
    Case("all_gather_model_tiled", DM,
         lambda lax: lambda b: lax.all_gather(b, "model", axis=1, tiled=True),
         lambda P: P("data", "model"), lambda P: P("data"), lambda: (f32(4, 8),),
         jax_check_vma=False),
    Case("all_gather_model_stacked", DM, lambda lax: lambda b: lax.all_gather(b, "model"),
         lambda P: P("data", "model"), lambda P: P(None, "data"), lambda: (f32(4, 8),),
         jax_check_vma=False),
    Case("ppermute_model_ring", DM, lambda lax: lambda b: lax.ppermute(b, "model", RING4),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(4, 8),)),
    Case("psum_scatter_model_tiled", DM,
         lambda lax: lambda b: lax.psum_scatter(b, "model", scatter_dimension=1, tiled=True),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(4, 32),)),
    Case("psum_scatter_model_untiled", DM,
         lambda lax: lambda b: lax.psum_scatter(b, "model"),
         lambda P: P(None, "model"), lambda P: P("model"), lambda: (f32(4, 8),),
         jax_check_vma=False),
    Case("all_to_all_model", DM, lambda lax: lambda b: lax.all_to_all(b, "model", 0, 1, tiled=True),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(8, 8),)),
    Case("axis_index_each_axis", DM,
         lambda lax: lambda b: (b * 0 + lax.axis_index("data"), b * 0 + lax.axis_index("model")),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(2, 4),)),
    Case("psum_groups_model", DM,
         lambda lax: lambda b: lax.psum(b, "model", axis_index_groups=[[0, 1], [2, 3]]),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(4, 8),),
         jax_check_vma=False),
    # -- both axes at once ----------------------------------------------------------------
    Case("psum_both", DM, lambda lax: lambda b: lax.psum(b, ("data", "model")),
         lambda P: P("data", "model"), lambda P: P(), lambda: (f32(4, 8),)),
    Case("all_gather_both", DM, lambda lax: lambda b: lax.all_gather(b, ("data", "model")),
         lambda P: P("data", "model"), lambda P: P(), lambda: (f32(4, 8),),
         jax_check_vma=False),
    Case("ppermute_both_ring", DM, lambda lax: lambda b: lax.ppermute(b, ("data", "model"), RING8),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(4, 8),)),
    Case("psum_scatter_both", DM,
         lambda lax: lambda b: lax.psum_scatter(b, ("data", "model"), scatter_dimension=1, tiled=True),
         lambda P: P(), lambda P: P(None, ("data", "model")), lambda: (f32(8, 8),)),
    Case("all_to_all_both", DM,
         lambda lax: lambda b: lax.all_to_all(b, ("data", "model"), 1, 0, tiled=True),
         lambda P: P(("data", "model")), lambda P: P(None, ("data", "model")), lambda: (f32(8, 8),)),
    Case("axis_index_tuples", DM,
         lambda lax: lambda b: (b * 0 + lax.axis_index(("data", "model")),
                                b * 0 + lax.axis_index(("model", "data"))),
         lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (f32(2, 4),)),
    # -- specs: tuples, replication, pytrees, static arguments ----------------------------
    Case("tuple_spec_model_major", DM, lambda lax: lambda b: b * 10 + lax.axis_index("model"),
         lambda P: P(("model", "data")), lambda P: P(("model", "data")), lambda: (f32(16),)),
    Case("replicated_weights_data_parallel", DM,
         lambda lax: lambda x, w: lax.pmean((x @ w).sum(0, keepdims=True), "data"),
         lambda P: (P("data"), P()), lambda P: P(), lambda: (f32(4, 3), f32(3, 5) / 10)),
    Case("tensor_parallel_matmul", DM,
         lambda lax: lambda x, w: lax.psum(x @ w, "model"),
         lambda P: (P("data", "model"), P("model", None)), lambda P: P("data"),
         lambda: (f32(4, 8) / 10, f32(8, 3) / 10)),
    Case("pytrees_and_static", DM,
         lambda lax: lambda p, x, s: ({"y": x * p["w"] * s, "n": lax.psum(p["b"], "data")},
                                      lax.axis_index("model") + x[:1, :1] * 0),
         lambda P: ({"w": P("model"), "b": P("data")}, P("data", "model"), None),
         lambda P: ({"y": P("data", "model"), "n": P("data")}, P("data", "model")),
         lambda: ({"w": f32(8), "b": f32(2)}, f32(4, 8), 3.0)),
    # -- a 1-D mesh -------------------------------------------------------------------------
    Case("one_axis_psum_ppermute_gather", (("i", 8),),
         lambda lax: lambda b: (lax.psum(b, "i"), lax.ppermute(b, "i", RING8),
                                lax.all_gather(b, "i", tiled=True)),
         lambda P: P("i"), lambda P: (P(), P("i"), P()), lambda: (f32(16),),
         jax_check_vma=False),
]


def by_name(name):
    return next(c for c in CASES if c.name == name)


# -- the two engines -----------------------------------------------------------------------

def jax_shard_map(jax, f, mesh, in_specs, out_specs, check):
    """jax.shard_map where it exists (jax >= 0.7), else the experimental one."""
    if hasattr(jax, "shard_map"):
        return jax.shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_vma=check)
    from jax.experimental.shard_map import shard_map
    return shard_map(f, mesh=mesh, in_specs=in_specs, out_specs=out_specs, check_rep=check)


def jax_mesh(jax, axes):
    from jax.sharding import Mesh
    shape = tuple(s for _, s in axes)
    devices = np.array(jax.devices()[:math.prod(shape)]).reshape(shape)
    return Mesh(devices, tuple(n for n, _ in axes))      # Auto axes, as shard_map expects


def run_jax(jax, case):
    from jax.sharding import PartitionSpec
    return jax_shard_map(jax, case.make(jax.lax), jax_mesh(jax, case.mesh),
                         case.in_specs(PartitionSpec), case.out_specs(PartitionSpec),
                         case.jax_check_vma)(*case.args())


def run_simpmd(case, **kwargs):
    mesh = simpmd.make_mesh(tuple(s for _, s in case.mesh), tuple(n for n, _ in case.mesh))
    f = simpmd.shard_map(case.make(simpmd.lax), mesh=mesh, in_specs=case.in_specs(simpmd.P),
                         out_specs=case.out_specs(simpmd.P), **kwargs)
    return f(*case.args()), f


def assert_same(jax, got, want):
    got_leaves, got_def = jax.tree_util.tree_flatten(got)
    want_leaves, want_def = jax.tree_util.tree_flatten(want)
    assert got_def == want_def, f"simpmd result structure {got_def} != jax {want_def}"
    for k, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        g, w = np.asarray(g), np.asarray(w)
        assert g.shape == w.shape, f"leaf {k}: simpmd shape {g.shape} != jax shape {w.shape}"
        assert g.dtype == w.dtype, f"leaf {k}: simpmd dtype {g.dtype} != jax dtype {w.dtype}"
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"leaf {k}")


# -- the cross-check -------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_shard_map_matches_jax(jax8, case):
    want = run_jax(jax8, case)
    got, _ = run_simpmd(case, check_vma=case.jax_check_vma)
    assert_same(jax8, got, want)


@pytest.mark.parametrize("case", [c for c in CASES if not c.jax_check_vma], ids=lambda c: c.name)
def test_under_check_vma_simpmd_refuses_what_jax_refuses(jax8, case):
    """The cases the conformance run gives JAX check_vma=False, run with check_vma=True on
    both engines: both refuse, or both accept and agree. (Most return a value that is
    replicated in fact but varying by type, an all_gather's result, with out_specs that
    claim replication: JAX refuses them from the types, and so does simpmd.)"""
    from jax.sharding import PartitionSpec
    try:
        want = jax_shard_map(jax8, case.make(jax8.lax), jax_mesh(jax8, case.mesh),
                             case.in_specs(PartitionSpec), case.out_specs(PartitionSpec),
                             True)(*case.args())
    except (ValueError, NotImplementedError) as exc:
        with pytest.raises(simpmd.SimpmdError):
            run_simpmd(case, check_vma=True)
        if "replication" in str(exc):
            with pytest.raises(simpmd.ShardingError, match="type says it varies"):
                run_simpmd(case, check_vma=True)
    else:
        got, _ = run_simpmd(case, check_vma=True)
        assert_same(jax8, got, want)


@pytest.mark.parametrize("name", ["psum_model", "tuple_spec_model_major", "all_to_all_both"])
def test_result_shards_sit_where_jax_puts_them(jax8, name):
    """Same device ids, block indices and replica ids as the jax.Array's shards."""
    case = by_name(name)
    want = run_jax(jax8, case)
    got, _ = run_simpmd(case)
    norm = lambda index, shape: tuple(s.indices(n)[:2] for s, n in zip(index, shape))
    jax_shards = [(s.device.id, norm(s.index, want.shape), s.replica_id) for s in want.addressable_shards]
    sim_shards = [(s.device.id, norm(s.index, got.shape), s.replica_id) for s in got.addressable_shards]
    assert sorted(sim_shards) == sorted(jax_shards)
    for s in got.addressable_shards:
        np.testing.assert_allclose(s.data, np.asarray(want)[s.index])


def test_received_blocks_are_the_blocks_jax_hands_each_device(jax8):
    """What each simulated device logs as received is what that JAX device's body sees."""
    from jax.sharding import NamedSharding, PartitionSpec
    case = by_name("tensor_parallel_matmul")
    x = case.args()[0]
    _, f = run_simpmd(case)
    arr = jax8.device_put(x, NamedSharding(jax_mesh(jax8, case.mesh), PartitionSpec("data", "model")))
    jax_blocks = {s.device.id: np.asarray(s.data) for s in arr.addressable_shards}
    received = {e.device: e.inputs[0] for e in f.trace.events
                if e.kind == "receive" and e.detail.startswith("x[")}
    assert received.keys() == jax_blocks.keys()
    for d in received:
        np.testing.assert_array_equal(received[d], jax_blocks[d])


def test_replication_jax_refuses_statically_simpmd_refuses_by_value(jax8):
    """out_specs that leave out an axis the output varies along: JAX refuses from the
    program's types, simpmd from the values, and both point at check_vma."""
    case = Case("unreduced", DM, lambda lax: lambda b: b * 2, lambda P: P("data", "model"),
                lambda P: P("data"), lambda: (f32(4, 8),))
    with pytest.raises(ValueError, match="check_vma"):
        run_jax(jax8, case)
    with pytest.raises(simpmd.ShardingError, match="check_vma=False"):
        run_simpmd(case)


def test_worked_example_nested_pmap_equals_jax_shard_map(jax8):
    """The nested-pmap worked example (6.0, not 12) on simpmd equals its shard_map form on
    JAX and on simpmd."""
    x, p = np.arange(4.0, dtype=np.float32).reshape(2, 2), np.full((2, 2), 0.5, np.float32)

    def make(lax):
        def inner(x, p):
            return lax.psum(x * p, "model") * 2
        return inner

    inner = make(simpmd.lax)
    nested = simpmd.pmap(lambda a, b: simpmd.lax.psum(simpmd.pmap(inner, axis_name="model")(a, b),
                                                       "data"), axis_name="data")(x, p)
    case = Case("worked", (("data", 2), ("model", 2)),
                lambda lax: lambda xb, pb: lax.psum(make(lax)(xb[0, 0], pb[0, 0]), "data")[None, None],
                lambda P: P("data", "model"), lambda P: P("data", "model"), lambda: (x, p))
    want = run_jax(jax8, case)
    got, _ = run_simpmd(case)
    np.testing.assert_array_equal(np.asarray(want), np.full((2, 2), 6.0))
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    np.testing.assert_array_equal(np.asarray(nested), np.asarray(want))


def test_case_list_covers_every_collective_over_one_axis_and_two():
    names = " ".join(c.name for c in CASES)
    for op in ("psum", "pmean", "pmax", "all_gather", "ppermute", "psum_scatter", "all_to_all",
               "axis_index"):
        assert op in names, op
    for op in ("psum", "all_gather", "ppermute", "psum_scatter", "all_to_all"):
        assert f"{op}_both" in names or f"{op}_model" in names, op
        assert f"{op}_both" in names, op


@pytest.mark.parametrize("name", ["psum_model", "pytrees_and_static", "all_to_all_both"])
def test_on_jax_runs_the_simpmd_program_on_jax_shard_map(jax8, name):
    """simpmd.shard_map's on_jax (what a cross-check calls) is the same JAX program."""
    from simpmd.jax import on_jax
    case = by_name(name)
    got, f = run_simpmd(case)
    want = on_jax(f, check_vma=case.jax_check_vma)(*case.args())
    assert_same(jax8, got, want)
    assert_same(jax8, want, run_jax(jax8, case))


def test_inside_a_jax_trace_simpmd_shard_map_hands_over_to_jax(jax8):
    case = by_name("tensor_parallel_matmul")
    got, f = run_simpmd(case)
    jitted = jax8.jit(lambda x, w: f(x, w) * 1)        # f now meets JAX tracers
    assert_same(jax8, got, jitted(*case.args()))
