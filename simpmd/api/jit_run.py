"""Moved: jit's rows to ``simpmd.partitioner.rows``, its calls to ``simpmd.api.jit_call``."""
from ..partitioner.rows import MeshText, jit_p, reshard_p  # noqa: F401
from .jit_call import arg_aval, call_in_body, split_static, traced_call  # noqa: F401
