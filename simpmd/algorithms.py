"""Collective algorithms as explicit messages between devices: moved to
:mod:`simpmd.cost.algorithms`, and still importable here (``from simpmd import algorithms``)."""
from .cost.algorithms import *  # noqa: F401,F403
