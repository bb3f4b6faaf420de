"""The simulator's core: NumPy only, and it imports nothing of simpmd outside this package.

Read it in the order a call of ``simpmd.pmap(f)(x)`` goes through it:

1. ``core.py``: types (``Aval``), programs as data (``Var``, ``Equation``, ``Program``),
   the ``Primitive`` row, the thread's context, and ``bind``, which every operation goes
   through.
2. ``values.py``: what a body holds (``StackedValue``: every device's value, or its type).
3. ``program.py``: ``trace`` (the body on types, written down as equations) and
   ``eval_program`` (the program run again, one ``bind`` per equation); the cache.
4. ``run.py``: a grid of devices with named axes that computes every operation for all of
   them at once, or types only; collectives over groups; the deadlock check.
5. The rows: ``primitives.py`` (a device's arithmetic), ``collectives.py``, ``control.py``
   (cond), ``loops.py`` (scan, while, checkpoint).
6. ``autodiff.py``: grad, one derivative rule per row, collectives included.
7. ``log.py``: the run's records, columnar (read as events by ``simpmd/api/events.py``).

Around it: ``dtypes.py`` (JAX's dtype rules), ``errors.py`` and ``bridge.py`` (where the
eager engine, the JAX hand-off and the printer register themselves). The front ends and
pytrees (``simpmd/api``), the machine (``simpmd/machine``) and the eager engine
(``simpmd/eager``) sit above it.
"""
