"""Explicit-sharding programs run on simpmd.jit and jax.jit (tests/conformance/test_explicit_vs_jax.py).

Each case: a name, the mesh ((name, size), ...), the arguments' shapes and specs, the
function (written for both engines), and ``xla_differs``: the collective counts XLA on
CPU is known to choose differently from simpmd's simplest rule (the specs and values
must still agree; the difference is reported, not hidden).
"""
from dataclasses import dataclass
import math
import random
from typing import Callable

import numpy as np

import simpmd
import simpmd.numpy as snp
from simpmd import P


@dataclass
class Case:
    name: str
    fun: Callable
    shapes: tuple
    specs: tuple
    mesh: tuple = (("data", 2), ("model", 4))
    xla_differs: str = ""           # why XLA's collectives differ from the rule's, if they do
    axis_types: tuple = ()          # Explicit on every axis unless said ('Auto')
    xla_varies: str = ""            # XLA's collectives differ between JAX releases: not compared

    def args(self):
        rng = np.random.default_rng(len(self.name))
        return [rng.standard_normal(s).astype(np.float32) for s in self.shapes]

    def make_mesh(self):
        types = tuple(getattr(simpmd.AxisType, t) for t in self.axis_types) or None
        return simpmd.make_mesh(tuple(s for _, s in self.mesh), tuple(n for n, _ in self.mesh),
                                axis_types=types)


DM = P("data", "model")

CASES = [
    Case("add_scalar", lambda x: x * 2.0 + 1.0, ((16, 32),), (DM,)),
    Case("add_row_whole", lambda x, b: x + b, ((16, 32), (32,)), (DM, P())),
    Case("add_row_split", lambda x, b: x + b, ((16, 32), (32,)), (DM, P("model"))),
    Case("add_conflict", lambda x, y: x + y, ((16, 32), (16, 32)), (DM, P("model", "data"))),
    Case("add_row_conflict", lambda x, b: x + b, ((16, 32), (32,)), (DM, P("data"))),
    Case("tanh_exp_where", lambda x: snp.where(x > 0, snp.tanh(x), snp.exp(x)), ((16, 32),), (DM,)),
    Case("matmul_free_split", lambda x, w: x @ w, ((16, 32), (32, 8)), (P("data", None), P(None, "model"))),
    Case("matmul_ambiguous", lambda x, w: x @ w, ((16, 32), (32, 8)), (DM, P("model", None))),
    Case("matmul_allreduce", lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)),
         ((16, 32), (32, 8)), (DM, P("model", None))),
    Case("matmul_reduce_scatter", lambda x, w: snp.matmul(x, w, out_sharding=P("data", "model")),
         ((16, 32), (32, 8)), (DM, P("model", None)),
         xla_differs="XLA on CPU: all-reduce, then each device slices (no reduce-scatter)"),
    Case("matmul_one_side_contract", lambda x, w: x @ w, ((16, 32), (32, 8)), (DM, P())),
    Case("dot_allreduce", lambda x, w: snp.dot(x, w, out_sharding=P("data", None)),
         ((16, 32), (32, 8)), (DM, P("model", None))),
    Case("einsum_batch", lambda x, w: snp.einsum("bij,bjk->bik", x, w),
         ((4, 8, 16), (4, 16, 8)), (P("data", None, None), P("data", None, "model"))),
    Case("einsum_contract", lambda x, w: snp.einsum("ij,jk->ik", x, w, out_sharding=P("data", None)),
         ((16, 32), (32, 8)), (DM, P("model", None))),
    Case("megatron_mlp", lambda x, w1, w2: snp.matmul(snp.tanh(x @ w1), w2, out_sharding=P("data", None)),
         ((16, 8), (8, 32), (32, 8)), (P("data", None), P(None, "model"), P("model", None))),
    Case("fsdp_layer", lambda x, w: x @ simpmd.reshard(w, P()), ((16, 32), (32, 8)),
         (P(("data", "model"), None), P(("data", "model"), None))),
    Case("sum_dim0", lambda x: x.sum(0), ((16, 32),), (DM,)),
    Case("sum_all", lambda x: x.sum(), ((16, 32),), (DM,)),
    Case("mean_dim1", lambda x: x.mean(1), ((16, 32),), (DM,)),
    Case("max_dim1", lambda x: x.max(1), ((16, 32),), (DM,)),
    Case("sum_whole_dim", lambda x: x.sum(1), ((16, 32),), (P("data", None),)),
    Case("transpose", lambda x: x.T, ((16, 32),), (DM,)),
    Case("reshape_split", lambda x: x.reshape(16, 4, 8), ((16, 32),), (DM,)),
    Case("reshape_merge", lambda x: x.reshape(16 * 32), ((16, 32),), (P("data", None),)),
    Case("reshape_unsupported", lambda x: x.reshape(32, 16), ((16, 32),), (DM,)),
    Case("slice_rows", lambda x: x[:8], ((16, 32),), (DM,)),
    Case("slice_cols", lambda x: x[:, :8], ((16, 32),), (DM,)),
    Case("index_split_dim", lambda x: x[3], ((16, 32),), (DM,)),
    Case("index_whole_dim", lambda x: x[:, 3], ((16, 32),), (P("data", None),)),
    Case("concat_whole_dim", lambda x: snp.concatenate([x, x], axis=1), ((16, 32),), (P("data", None),)),
    Case("concat_split_dim", lambda x: snp.concatenate([x, x], axis=0), ((16, 32),), (DM,),
         xla_differs="XLA on CPU: all-to-alls instead of all-gathers"),
    Case("concat_conflict", lambda x, y: snp.concatenate([x, y], axis=0), ((16, 32), (16, 32)),
         (DM, P("data", None))),
    Case("reshard_gather", lambda x: simpmd.reshard(x, P("data", None)), ((16, 32),), (DM,)),
    Case("reshard_move", lambda x: simpmd.reshard(x, P(None, "data")), ((16, 32),), (P("data", None),)),
    Case("reshard_swap", lambda x: simpmd.reshard(x, P("model", "data")), ((16, 32),), (DM,),
         xla_differs="XLA on CPU: an all-to-all and a collective-permute"),
    Case("reshard_flatten", lambda x: simpmd.reshard(x, P(None, ("data", "model"))), ((16, 32),), (DM,),
         xla_differs="XLA on CPU: one collective-permute"),
    Case("reshard_slice", lambda x: simpmd.reshard(x, DM), ((16, 32),), (P(),)),
]


# -- the differences issue 29 listed, each now a case -------------------------------------------

CASES += [
    Case("reshape_merge_two_splits", lambda x: x.reshape(32), ((8, 4),), (P("model", "data"),)),
    Case("reshape_flatten_two_splits", lambda x: x.reshape(512), ((16, 32),), (DM,)),
    Case("einsum_axis_on_batch_and_contract",
         lambda x, w: snp.einsum("bij,bjk->bik", x, w),
         ((8, 4, 16), (8, 16, 4)), (P(("data", "model"), None, None), P(None, "data", None)),
         xla_differs="XLA on CPU: an all-to-all and a collective-permute"),
    Case("concat_numpy_constant", lambda x: snp.concatenate([x, np.ones((16, 32), np.float32)]),
         ((16, 32),), (DM,), xla_differs="XLA on CPU: all-to-alls instead of all-gathers"),
    Case("matmul_out_sharding_skips_checks",
         lambda x, w: snp.matmul(x, w, out_sharding=P("data", None)),
         ((16, 32), (32, 8)), (P("data", "model"), P("data", None)),
         xla_differs="XLA on CPU: an all-to-all and an all-reduce"),
    Case("matmul_batch_split_one_side", lambda x, w: snp.matmul(x, w),
         ((4, 8, 16), (4, 16, 8)), (P("data", None, None), P(None, None, None))),
    Case("reshard_to_auto_axis", lambda x: simpmd.reshard(x, P("model")), ((16, 32),),
         (P("data"),), mesh=(("data", 2), ("model", 4)), axis_types=("Explicit", "Auto")),
    Case("auto_mesh_matmul", lambda x, w: snp.tanh(x @ w), ((16, 32), (32, 8)),
         (P("data", "model"), P("model", None)), axis_types=("Auto", "Auto")),
    Case("mixed_mesh_matmul", lambda x, w: snp.matmul(x, w), ((16, 32), (32, 8)),
         (P("data", "model"), P("model", None)), axis_types=("Explicit", "Auto")),
    Case("step_slice_split_dim", lambda x: x[::2], ((16, 32),), (DM,)),
]


# -- random programs ---------------------------------------------------------------------------

MESHES = [(("i", 8),), (("data", 2), ("model", 4)), (("a", 4), ("b", 2))]


def _spec(rng, mesh, shape):
    """A random spec for ``shape`` on ``mesh``: each dim whole, or split over one or two
    unused axes that divide it."""
    sizes, free, parts = dict(mesh), [n for n, _ in mesh], []
    for n in shape:
        choice = rng.random()
        axes = []
        if choice < 0.55 and free:
            for a in rng.sample(free, min(len(free), 1 if choice < 0.4 else 2)):
                if n % (math.prod(sizes[b] for b in axes) * sizes[a]) == 0:
                    axes.append(a)
        for a in axes:
            free.remove(a)
        parts.append(None if not axes else (axes[0] if len(axes) == 1 else tuple(axes)))
    while parts and parts[-1] is None:
        parts.pop()
    return P(*parts)


def _templates(rng, mesh):
    """(name, shapes, function of a spec maker) for one random program."""
    spec = lambda shape: _spec(rng, mesh, shape)           # noqa: E731
    axis = rng.randint(0, 1)
    shape = rng.choice([(16, 32), (32, 16), (8, 8)])
    reshaped = rng.choice([(shape[0] * shape[1],), (2, shape[0] // 2, shape[1]),
                           (shape[0], 2, shape[1] // 2), (shape[1], shape[0]),
                           (shape[0] // 2, 2 * shape[1]), (2, shape[0] * shape[1] // 2)])
    lo = rng.choice([0, 1, 2, 4, 8])
    hi = rng.choice([lo + 1, lo + 2, lo + 4, shape[0]])
    step = rng.choice([1, 1, 2, 4])
    k = rng.randint(0, 5)
    out2, out3, to, to_reshaped = (spec((shape[0], 8)), spec((4, 8, 8)), spec(shape),
                                   spec(reshaped))
    return rng.choice([
        ("mul_add", [shape, shape], lambda x, y: x * y + 1.0),
        ("tanh_add_row", [shape, shape[1:]], lambda x, b: snp.tanh(x) + b),
        ("where_arrays", [shape, shape], lambda x, y: snp.where(x > 0, x, y)),
        ("where_scalar", [shape], lambda x: snp.where(x > 0, x, 0.0)),
        ("exp_max", [shape, shape], lambda x, y: snp.maximum(snp.exp(x), y)),
        ("matmul", [shape, (shape[1], 8)], lambda x, w: x @ w),
        ("matmul_out", [shape, (shape[1], 8)],
         lambda x, w: snp.matmul(x, w, out_sharding=out2)),
        ("dot_tanh_sum", [shape, (shape[1], 8)], lambda x, w: snp.tanh(snp.dot(x, w)).sum(axis)),
        ("einsum_batch", [(4, 8, 16), (4, 16, 8)], lambda x, w: snp.einsum("bij,bjk->bik", x, w)),
        ("einsum_out", [(4, 8, 16), (4, 16, 8)],
         lambda x, w: snp.einsum("bij,bjk->bki", x, w, out_sharding=out3)),
        ("sum_axis", [shape], lambda x: x.sum(axis)),
        ("mean_all", [shape], lambda x: x.mean()),
        ("max_keepdims", [shape], lambda x: x.max(axis, keepdims=True)),
        ("min_axis", [shape], lambda x: x.min(axis)),
        ("transpose", [shape], lambda x: x.T * 2.0),
        ("reshape", [shape], lambda x: x.reshape(reshaped)),
        ("reshape_out", [shape], lambda x: snp.reshape(x, reshaped, out_sharding=to_reshaped)),
        ("slice_rows", [shape], lambda x: x[lo:hi:step]),
        ("slice_cols", [shape], lambda x: x[:, lo:hi]),
        ("index_row", [shape], lambda x: x[k]),
        ("index_col", [shape], lambda x: x[:, k]),
        ("new_axis", [shape], lambda x: x[None] + 1.0),
        ("concat", [shape], lambda x: snp.concatenate([x, x], axis=axis)),
        ("concat_two", [shape, shape], lambda x, y: snp.concatenate([x, y], axis=axis)),
        ("concat_numpy", [shape], lambda x: snp.concatenate([x, np.ones(shape, np.float32)], axis=axis)),
        ("reshard", [shape], lambda x: simpmd.reshard(x, to)),
        ("reshard_sum", [shape], lambda x: simpmd.reshard(x, to).sum(axis)),
        ("mlp", [shape, (shape[1], 16), (16, 8)],
         lambda x, w1, w2: snp.matmul(snp.tanh(x @ w1), w2, out_sharding=out2)),
        ("grad_mlp", [shape, (shape[1], 16)],
         lambda x, w: simpmd.grad(lambda w, x: snp.tanh(x @ w).sum(), argnums=(0, 1))(w, x)),
        ("grad_fsdp", [shape, (shape[1], 8)],
         lambda x, w: simpmd.grad(lambda w, x: snp.tanh(x @ simpmd.reshard(w, P())).sum())(w, x)),
        ("grad_where", [shape, shape],
         lambda x, y: simpmd.grad(lambda x, y: (snp.where(x > 0, x, y) ** 2).mean(), (0, 1))(x, y)),
        ("grad_reshape", [shape],
         lambda x: simpmd.grad(lambda x: (x.reshape(reshaped) ** 2).sum())(x)),
    ])


def random_cases(n, seed=0) -> list:
    """``n`` random programs over the meshes above (names say the template and seed)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        mesh = MESHES[k % len(MESHES)]
        name, shapes, fun = _templates(rng, mesh)
        specs = tuple(_spec(rng, mesh, s) for s in shapes)
        out.append(Case(f"{name}_{k}", fun, tuple(shapes), specs, mesh=mesh))
    return out


# -- shard_map inside jit ------------------------------------------------------------------------

def _tp_body(x, w1, w2):
    return simpmd.lax.psum(snp.tanh(x @ w1) @ w2, "model")


def _partial_body(x, w):
    return simpmd.lax.psum(snp.tanh(x @ w).sum(0), "data")


_MESH24 = simpmd.make_mesh((2, 4), ("data", "model"))
SHARD_MAP_CASES = [
    Case("shard_map_tp_layer", lambda x, w1, w2: simpmd.shard_map(
        _tp_body, mesh=_MESH24, in_specs=(P("data", None), P(None, "model"), P("model", None)),
        out_specs=P("data", None))(x, w1, w2) * 2.0,
        ((16, 8), (8, 32), (32, 8)), (P("data", None), P(None, "model"), P("model", None))),
    Case("shard_map_reshards_its_operands", lambda x, w1, w2: simpmd.shard_map(
        _tp_body, mesh=_MESH24, in_specs=(P("data", None), P(None, "model"), P("model", None)),
        out_specs=P("data", None))(x, w1, w2),
        ((16, 8), (8, 32), (32, 8)), (P(), P(None, "model"), P()),
        xla_differs=""),
    Case("shard_map_partial_manual", lambda x, w: simpmd.shard_map(
        _partial_body, mesh=_MESH24, in_specs=(P("data", None), P()), out_specs=P(),
        axis_names={"data"})(x, w), ((16, 8), (8, 32)), (P("data", None), P(None, "model")),
        xla_varies="jax 0.10.2: two all-gathers and an all-reduce; 0.7.2 and 0.12.0.1: one all-reduce"),
    Case("grad_through_shard_map", lambda x, w1, w2: simpmd.grad(
        lambda w1, w2: simpmd.shard_map(
            _tp_body, mesh=_MESH24, in_specs=(P("data", None), P(None, "model"), P("model", None)),
            out_specs=P("data", None))(x, w1, w2).sum(), argnums=(0, 1))(w1, w2),
        ((16, 8), (8, 32), (32, 8)), (P("data", None), P(None, "model"), P("model", None)),
        xla_differs="XLA on CPU combines and moves differently"),
]
