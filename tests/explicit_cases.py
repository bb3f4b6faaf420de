"""Explicit-sharding programs run on simpmd.jit and jax.jit (tests/test_explicit_vs_jax.py).

Each case: a name, the mesh ((name, size), ...), the arguments' shapes and specs, the
function (written for both engines), and ``xla_differs``: the collective counts XLA on
CPU is known to choose differently from simpmd's simplest rule (the specs and values
must still agree; the difference is reported, not hidden).
"""
from dataclasses import dataclass
import math
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
