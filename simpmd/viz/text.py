"""Moved to :mod:`simpmd.api.text` (issue 46: ``api/`` comes before ``viz/``); kept importable."""
from ..api.text import *  # noqa: F401,F403
