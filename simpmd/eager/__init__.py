"""Eager runs (``eager=True``): one Python program per simulated device, each on its own
thread, meeting at every collective, so that a body may branch on its values, deadlock
or diverge, as real JAX cannot show (``scheduler.py``).

The core calls it through ``simpmd.core.bridge`` and never imports it.
"""
from ..core import bridge
from . import scheduler

bridge.eager = scheduler
