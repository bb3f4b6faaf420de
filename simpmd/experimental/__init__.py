"""``simpmd.experimental``: where ``jax.experimental``'s ``multihost_utils`` and
``mesh_utils`` are found, so that a program written against ``jax`` runs on simpmd when
given ``simpmd`` instead."""
from .. import mesh_utils, multihost_utils

__all__ = ["mesh_utils", "multihost_utils"]
