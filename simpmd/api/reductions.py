"""Moved to ``simpmd.partitioner.unreduced``."""
from ..partitioner.unreduced import *  # noqa: F401,F403
