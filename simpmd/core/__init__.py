"""The simulator's core: NumPy only, and it imports nothing of simpmd outside this package.

Read it in the order the data flows through a call of ``simpmd.pmap(f)(x)``:

1. ``pmap.py``, ``shard_map.py``: the front ends. They split the arguments by device and
   hand them to ``spmd.py``, which looks the function up in the program cache.
2. ``program.py``: a traced body as equations (JAX's primitive names, shapes, dtypes,
   the learner's source line), the cache keyed by signature, the jaxpr printer.
3. ``batching.py``: computes every operation once for all devices at once, over values
   stacked by device, and records the equations while the first call runs.
4. ``lax.py`` and ``collectives.py``: the collectives, each computed in one NumPy call.
5. ``autodiff.py``: reverse mode, the backward collectives included.
6. ``trace.py``: the log of a run, columnar, written out per device only when read.

Around it: ``errors.py``, ``tree.py`` (pytrees), ``devices.py`` and ``mesh.py`` (the
simulated platform), ``array.py`` (what a mapped call returns), ``context.py`` (the
program on this thread, the learner's source line, the checks both engines share),
``traced.py`` (the value one device holds in an eager run) and ``bridge.py`` (where the
eager scheduler, the JAX bridge and the drawings register themselves: the core imports
none of them). The eager run itself, one program per device meeting at collectives, is
``simpmd/eager/``.
"""
