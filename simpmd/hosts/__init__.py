"""Many hosts: one program per process, each driving its own devices, as multi-controller
JAX runs on a TPU pod slice or a GPU cluster.

    def main(jax):                       # written against JAX's names
        mesh = jax.make_mesh((4, 2), ("hosts", "chips"))
        x = jax.make_array_from_process_local_data(
            jax.NamedSharding(mesh, jax.P("hosts")), np.arange(2.0) + 2 * jax.process_index())
        return jax.jit(lambda v: v.sum())(x)

    run = simpmd.run_processes(main, 4)  # 4 simulated processes of 2 devices each
    simpmd.jax.multiprocess.crosscheck_processes([main], 4)   # and as 4 real JAX processes

``run_processes`` calls ``main(simpmd)`` once per simulated process (``scheduler.py``); inside
it simpmd answers as JAX does in that process: ``process_index()``, ``local_devices()``,
arrays that hold only this process's blocks (``arrays.py``), computations that every
process must launch (``calls.py``), and ``multihost_utils`` (``simpmd.multihost_utils``).
``crossing.py`` says which collectives cross hosts.
"""
from __future__ import annotations

import sys

from ..machine import devices as machine
from .arrays import ProcessArray, make_array_from_callback, make_array_from_process_local_data
from .crossing import collective_calls, hosts_table
from .scheduler import ProcessError, Processes, install_stdout
from . import calls

machine.hosts = calls               # the front ends hand a process's calls to it


class ProcessRun:
    """What ``run_processes`` gives back: each process's result and printed text, and the
    global computations they launched together (``computations``: name, line, trace)."""

    def __init__(self, processes: Processes):
        self.results = [h.result for h in processes.hosts]
        self.errors = [h.error for h in processes.hosts]
        self.printed = [h.printed.getvalue() for h in processes.hosts]
        self.devices = [list(h.devices) for h in processes.hosts]
        self.computations = list(processes.log)

    def __len__(self):
        return len(self.results)

    def __str__(self):
        blocks = []
        for p, text in enumerate(self.printed):
            ids = [d.id for d in self.devices[p]]
            head = f"process {p} (devices {ids[0]}-{ids[-1]})" if len(ids) > 1 else \
                f"process {p} (device {ids[0]})"
            lines = text.rstrip("\n").splitlines() or ["(printed nothing)"]
            blocks.append(head + ":\n" + "\n".join("    " + line for line in lines))
        return "\n".join(blocks)

    def __repr__(self):
        return (f"<ProcessRun of {len(self.results)} processes, "
                f"{len(self.computations)} global computation(s)>")

    def collectives(self) -> str:
        """Every global computation's collectives, with the hosts each group spans."""
        parts = []
        for name, source, trace in self.computations:
            if trace is not None and trace.calls():
                parts.append(f"{name} at {source}:\n{hosts_table(trace)}")
        return "\n\n".join(parts) if parts else "no collectives"


def run_processes(main, num_processes: int | None = None, *, show: bool = True) -> ProcessRun:
    """Run ``main(simpmd)`` once per simulated process, as each host of a cluster runs the
    same program; returns a :class:`ProcessRun`.

    ``num_processes`` splits the platform's devices among that many processes (in id order,
    as ``set_device_count(n, processes=...)`` does, and kept afterwards, as
    ``jax.distributed.initialize`` is); None keeps the platform's. What each process prints
    is kept apart and shown per process at the end (``show=False``: not shown). A process
    that raises, or processes that do not launch the same global computations in the same
    order (a deadlock on real hardware), end the run with an error that names them.
    """
    platform = machine.platform()
    if num_processes is not None and num_processes != platform.process_count:
        platform = machine.set_device_count(len(platform.devices), hardware=platform.hardware,
                                            topology=platform.topology, processes=num_processes)
    if machine.current_process() is not None:
        raise RuntimeError("run_processes was called inside a simulated process; each "
                           "process runs main once, and main does not start processes.")
    processes = Processes(platform, main, sys.modules["simpmd"])
    original = install_stdout(processes)
    try:
        processes.start()
        error = processes.outcome_error()
        processes.release_waiting()
        processes.join_threads()
    finally:
        sys.stdout = original
    run = ProcessRun(processes)
    if show and any(run.printed):
        print(run)
    if error is not None:
        error.run = run
        raise error
    return run


__all__ = ["ProcessArray", "ProcessError", "ProcessRun", "collective_calls",
           "hosts_table", "make_array_from_callback",
           "make_array_from_process_local_data",
           "run_processes"]
