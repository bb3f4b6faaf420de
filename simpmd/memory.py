"""Memory per device, read off the program: moved to :mod:`simpmd.cost.memory`, and still
importable here (the course's lessons say ``from simpmd.memory import peak_memory``)."""
from .cost.memory import *  # noqa: F401,F403
from .cost.memory import __all__  # noqa: F401
