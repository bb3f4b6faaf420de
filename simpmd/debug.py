"""``simpmd.debug.print``, spelled like ``jax.debug.print`` (it lives in :mod:`simpmd.core.debug`)."""
from simpmd.core.debug import print  # noqa: A004 (mirrors jax.debug.print)

__all__ = ["print"]
