"""What a program would cost on real hardware: the network, the chips, the roofline, memory.

A package of modules, each one concern, none importing JAX, and no two importing each
other (``tests/test_purity.py``):

* :mod:`~simpmd.cost.topology`: how devices are wired (:class:`Torus`,
  :class:`FullyConnected`), and :mod:`~simpmd.cost.cluster`: nodes of them joined by a
  slower network (GPU nodes on InfiniBand, TPU slices on DCN), :class:`Cluster`;
* :mod:`~simpmd.cost.hardware`: the presets (:class:`Hardware`, :data:`HARDWARE`), every
  number with its source;
* :mod:`~simpmd.cost.network`: the time of each collective algorithm on them
  (:func:`estimate`, across nodes too), of a message-level run (:func:`time_run`) and of
  every collective of a trace (:func:`estimate_trace`);
* :mod:`~simpmd.cost.rows`: the cost model's columns of each primitive's row;
* :mod:`~simpmd.cost.walk`: the one walk over a program that every analysis shares (what
  a loop, a cond, a checkpoint count), and the counts of a run on values (:func:`taken_in`);
* :mod:`~simpmd.cost.roofline`: FLOPs, HBM and ICI bytes per equation and their time
  (:func:`roofline`, :func:`roofline_of`);
* :mod:`~simpmd.cost.memory`: the bytes a device holds as its program runs;
* :mod:`~simpmd.cost.fusion`: the kernels XLA makes of a program's equations;
* :mod:`~simpmd.cost.predict`: the one predictor of a program's time, its kernels on a
  device's streams (:func:`~simpmd.cost.predict.predict`; ``Roofline.predicted_s``, the
  timelines' ``draw_prediction`` and ``simpmd.plan`` use it);
* :mod:`~simpmd.cost.algorithms`: collective algorithms played message by message.

``simpmd.cost.X`` names what these modules define, as when they were one file.
"""
from . import algorithms, fusion, memory, predict
from .cluster import Cluster
from .hardware import (HARDWARE, NCCL_TESTS_H100, SLICE_SHAPES, Hardware, MeasuredFit,
                       hardware_preset)
from .network import (COLLECTIVES, COST_MODELS, NCCL_TESTS, CallEstimate,
                      CollectiveCost, Estimate, FullyConnected, GroupAxis, Ring, Torus, Torus2D,
                      Torus3D, TraceEstimate, busbw_factor, collective_of, estimate,
                      estimate_trace, nccl_size, step_time, time_run)
from .network import _columnar_log, _estimate_on, _hardware_of, _positions  # noqa: F401 (viz, tests)
from .roofline import EquationCost, Roofline, ici_bytes, peak_bytes, roofline, roofline_of
from .walk import JAX_UNARY, NESTED, NO_COST, Taken, live_equations, taken_in
from . import rows, walk                  # the modules (simpmd.cost.walk.walk walks)
