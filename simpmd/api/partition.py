"""Moved to ``simpmd.partitioner`` (its sharding types, rules, plans and rows)."""
from ..partitioner.rows import *  # noqa: F401,F403
from ..partitioner.sharding import *  # noqa: F401,F403
