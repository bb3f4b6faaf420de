"""``simpmd.sharding``: ``jax.sharding``'s names for simulated meshes, and what the course
reads from a ``simpmd.jit`` run.

    from simpmd.sharding import P, NamedSharding, reshard, rules_table, collective_counts

``collective_counts(trace)`` counts a run's collectives by XLA's names (``{'all-reduce':
1}``), to hold beside the compiled HLO (``simpmd.jax.hlo_collective_counts``);
``rules_table()`` prints, one line per operation, how its result's sharding follows from
its operands' and what that costs in communication.
"""
from .api.jit import ShapedArray, get_mesh, reshard, set_mesh
from .api.trace import collective_counts
from .partitioner.sharding import Sharding, ShardingTypeError
from .machine.mesh import AxisType, Mesh, NamedSharding, P, PartitionSpec

RULES = {
    "elementwise (+ - * / **, tanh, exp, where, ...)":
        "per dim, the split the operands agree on; a whole operand is cut locally; two "
        "different splits of one dim raise",
    "matmul / dot / einsum (dot_general)":
        "batch dims, then left free dims, then right free dims, each keeping its split; a "
        "contracting dim split on both sides raises unless out_sharding says: without the "
        "axis = all-reduce, splitting a result dim over it = reduce-scatter",
    "sum / mean / max / min (reduce_*)":
        "reduced dims leave the spec; a split reduced dim = one all-reduce over its axes",
    "transpose": "the spec is permuted with the dims; no traffic",
    "reshape": "size-1 dims in or out, one dim cut into several (the axes go to the leading "
               "new dims) or several merged; else raise and ask for out_sharding",
    "slicing x[a:b], x[::k]": "a split dim keeps its split if the devices divide the new size "
                              "(else raise); blocks move by collective permutes",
    "indexing x[i]": "fine on whole dims; on a split dim JAX raises",
    "concatenate": "the operands with a mesh must share one sharding, which the result keeps",
    "reshard": "an axis leaving a dim = all-gather; moving to another dim = all-to-all; a "
               "finer split = a local slice",
}


def rules_table() -> str:
    """The rules, one operation a line."""
    width = max(len(k) for k in RULES)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in RULES.items())


__all__ = ["AxisType", "Mesh", "NamedSharding", "P", "PartitionSpec", "ShapedArray", "Sharding",
           "ShardingTypeError", "collective_counts", "get_mesh", "reshard", "rules_table",
           "set_mesh"]
