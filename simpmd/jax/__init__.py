"""The bridge to real JAX: simpmd never imports JAX unless one of these modules is used.

``handoff.py``   one body on both engines: a simpmd collective inside a JAX trace calls
                 ``jax.lax``; ``on_jax(f)`` runs a simpmd.shard_map program as ``jax.shard_map``
``devices.py``   which devices real JAX gets (fake CPU devices or the accelerator)
``crosscheck.py`` ``simpmd.crosscheck``: one function on both engines, compared
``jit.py``       the same for ``simpmd.jit`` with sharding types: ``compare_jit``
"""
from .handoff import shard_map_on_jax as on_jax
from .jit import compare as compare_jit, hlo_collective_counts

__all__ = ["on_jax", "compare_jit", "hlo_collective_counts"]
