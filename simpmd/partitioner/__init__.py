"""jit's partitioner: values typed by their sharding (``sharding.py``, ``sharded.py``), each
row's rule and plan (``rules.py``, ``plans.py``, registered in ``rows.py``), unreduced and
reduced values (``unreduced.py``), and the pass that writes the program one device runs
(``partition.py``, its moves in ``moves.py``). It imports nothing from ``simpmd.api``."""
from . import rows, unreduced

rows.attach()
unreduced.attach()
