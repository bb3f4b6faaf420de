"""``simpmd.lax``: the collectives and control flow of ``jax.lax`` that a mapped body calls.

The functions live in :mod:`simpmd.core.lax`; this module is their public path, as
``jax.lax`` is for ``jax._src.lax``.
"""
from simpmd.core.lax import (all_gather, all_to_all, axis_index, axis_size, cond, pmax, pmean,
                             pmin, ppermute, pshuffle, psum, psum_scatter, pswapaxes, switch)

__all__ = ["all_gather", "all_to_all", "axis_index", "axis_size", "cond", "pmax", "pmean",
           "pmin", "ppermute", "pshuffle", "psum", "psum_scatter", "pswapaxes", "switch"]
