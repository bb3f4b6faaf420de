"""Simulated processes: one thread per process, each running the same ``main``, meeting at
every global computation.

On a TPU pod slice or a GPU cluster every host runs its own Python process (JAX's
*multi-controller* model): each process runs the whole program, drives only its own
devices, and launches every computation over the global mesh itself; the computation's
collectives then wait until every process has launched it too. ``simpmd.run_processes``
plays this on one machine: each simulated process runs ``main`` on a thread of its own,
one thread at a time (a baton passes between them, as in ``simpmd/eager/``), so a run is
deterministic. A global computation (a ``jit`` or ``shard_map`` over devices of several
processes, an operation on a global array, ``process_allgather``, ``sync_global_devices``)
is a *rendezvous*: each process arrives with its own arguments and waits; the last to
arrive checks that all called the same thing, runs it once over every device (each
device's data taken from the process that drives it) and hands each process its own view
of the results.

When the threads have nowhere to go (some wait at a rendezvous that the others will never
reach, or the processes arrived at different computations) the run is a deadlock, which
real JAX shows as a hang: simpmd names the processes, their devices, what each waits in,
and the collectives of that computation.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import io
import re
import sys
import threading
import traceback

from ..core import errors
from ..core.core import caller_source
from ..machine import devices as machine


@dataclass
class Call:
    """What one process arrived with at a rendezvous: a global computation and its inputs."""

    kind: str                      # 'jit', 'shard_map', 'operation', 'process_allgather', ...
    name: str                      # the function's name, as the messages show it
    signature: tuple               # what must agree across processes
    run: object                    # run(calls) -> one result per process (see calls.py)
    args: tuple = ()
    source: str = ""               # the learner's line that called it
    collectives: object = None     # () -> text naming the computation's collectives


@dataclass
class Host:
    """One simulated process: its index, its devices, its thread and how it is doing."""

    index: int
    devices: list
    processes: "Processes"
    state: str = "new"             # ready, running, waiting, done, failed
    result: object = None
    error: BaseException | None = None
    steps: int = 0                 # global computations it has joined
    waiting: Call | None = None
    executing: bool = False        # running a rendezvous for everyone: calls pass through
    inbox: object = None
    printed: io.StringIO = field(default_factory=io.StringIO)
    baton: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))

    def where(self) -> str:
        """'process 1 (devices 2-3)': how messages name a process."""
        return f"process {self.index} ({device_text(d.id for d in self.devices)})"


def device_text(ids) -> str:
    ids = sorted(ids)
    return f"device {ids[0]}" if len(ids) == 1 else f"devices {errors.id_ranges(ids)}"


class _Printed(io.TextIOBase):
    """sys.stdout while processes run: what a process prints goes to its own buffer, as
    each host of a cluster writes to its own terminal or log file. While a computation runs
    once for every process, what it prints goes to every process (each would have traced
    it), except ``debug.print``'s lines, which go to the process that drives their device."""

    def __init__(self, original, processes):
        self.original, self.processes = original, processes

    def write(self, text):
        host = machine.current_process()
        if host is None:
            self.original.write(text)
        elif self.processes.broadcasting:
            for line in text.splitlines(keepends=True):
                owner = self._owner(line)
                for h in self.processes.hosts:
                    if owner is None or h.index == owner:
                        h.printed.write(line)
        else:
            host.printed.write(text)
        return len(text)

    def _owner(self, line):
        match = _DEVICE_LINE.match(line)
        if match is None:
            return None
        return machine.platform().devices[int(match.group(1))].process_index

    def flush(self):
        self.original.flush()


_DEVICE_LINE = re.compile(r"^\[device (\d+)\b")


class Processes:
    """One ``run_processes``: its hosts, the baton, and the rendezvous under way."""

    def __init__(self, platform, main, argument):
        self.main, self.argument = main, argument
        self.hosts = [Host(p, platform.process_devices(p), self)
                      for p in range(platform.process_count)]
        self.queue: list = []
        self.arrived: dict = {}               # process index -> Call, at the current step
        self.finished = threading.Semaphore(0)
        self.log: list = []                   # (name, source, trace) per computation
        self.problem: BaseException | None = None
        self.broadcasting = False             # a computation for all prints to all
        self.crossing: dict = {}              # signature -> whether its collectives cross hosts

    # -- the baton --------------------------------------------------------------------------
    def start(self):
        """Run every process's ``main`` to the end, or until nothing can move."""
        self.threads = [threading.Thread(target=self._body, args=(h,), daemon=True,
                                         name=f"simpmd-process-{h.index}") for h in self.hosts]
        for host, thread in zip(self.hosts, self.threads):
            host.state = "ready"
            self.queue.append(host)
            thread.start()
        self._switch()
        self.finished.acquire()

    def join_threads(self, timeout: float = 5.0):
        """Wait for every process's thread to end (after :meth:`release_waiting`)."""
        for thread in self.threads:
            thread.join(timeout)

    def _body(self, host):
        host.baton.acquire()
        machine._process.host = host
        try:
            host.result = self.main(self.argument)
            host.state = "done"
        except _Abandoned:
            host.state = "abandoned"
        except BaseException as exc:          # reported after the run, with where it happened
            host.state, host.error = "failed", exc
        finally:
            machine._process.host = None
        self._switch()

    def _switch(self):
        """Hand the baton to the next ready process, or back to the caller of ``start``."""
        while self.queue:
            host = self.queue.pop(0)
            if host.state == "ready":
                host.state = "running"
                host.baton.release()
                return
        self.finished.release()

    def _wait(self, host):
        host.state = "waiting"
        self._switch()
        host.baton.acquire()
        if host.state == "abandoned":
            raise _Abandoned()

    # -- rendezvous ---------------------------------------------------------------------------
    def join(self, host, call: Call):
        """``host`` arrives at its next global computation; returns its share of the result
        (or raises what the computation raised, on every process alike)."""
        host.steps += 1
        host.waiting = call
        self.arrived[host.index] = call
        if len(self.arrived) < len(self.hosts):
            self._wait(host)
        else:
            self._complete(host)
        host.waiting = None
        outcome, host.inbox = host.inbox, None
        if isinstance(outcome, _Raised):
            raise outcome.exc
        return outcome

    def _complete(self, last):
        calls = [self.arrived[h.index] for h in self.hosts]
        self.arrived = {}
        if len({c.signature for c in calls}) > 1:
            self.problem = errors.DeadlockError(mismatch_message(self.hosts, calls))
            raise _Abandoned()
        last.executing = True
        try:
            outcomes = calls[0].run(calls)
        except Exception as exc:               # raised in every process, as JAX raises it
            outcomes = [_Raised(exc)] * len(self.hosts)
        finally:
            last.executing = False
        for h, outcome in zip(self.hosts, outcomes):
            h.inbox = outcome
            if h is not last:
                h.state = "ready"
                self.queue.append(h)
        # everyone resumes in process order; the last to arrive takes its turn in line
        self.queue.sort(key=lambda h: h.index)
        last.state = "ready"
        self.queue.append(last)
        self._wait_turn(last)

    def _wait_turn(self, host):
        self._switch()
        host.baton.acquire()
        host.state = "running"
        if self.problem is not None:
            raise _Abandoned()

    # -- after the run ------------------------------------------------------------------------
    def release_waiting(self):
        """Unwind every process still waiting, so that its thread ends."""
        stuck = [h for h in self.hosts if h.state in ("waiting", "ready")]
        for h in stuck:
            h.state = "abandoned"
            h.baton.release()

    def outcome_error(self) -> BaseException | None:
        """The error that explains why the run did not finish, or None."""
        if self.problem is not None:
            return self.problem
        failed = [h for h in self.hosts if h.state == "failed"]
        waiting = [h for h in self.hosts if h.state == "waiting"]
        if failed:
            return failure_error(failed, waiting)
        if waiting:
            return errors.DeadlockError(stranded_message(self.hosts, waiting))
        return None


class _Abandoned(BaseException):
    """Unwinds a process's ``main`` when the run is given up (not an Exception, so that a
    learner's ``except Exception`` cannot swallow it)."""


@dataclass
class _Raised:
    exc: BaseException


def where_called() -> str:
    """The learner's line that called into simpmd, for messages."""
    return caller_source()[0]


def processes_text(hosts) -> str:
    """'processes 0-2 (devices 0-5)': several processes in one phrase."""
    hosts = list(hosts)
    if len(hosts) == 1:
        return hosts[0].where()
    ids = errors.id_ranges([h.index for h in hosts])
    return f"processes {ids} ({device_text(d.id for h in hosts for d in h.devices)})"


def _call_text(call: Call) -> str:
    text = f"{call.name} at {call.source}" if call.source else call.name
    if call.collectives is not None:
        try:
            found = call.collectives()
        except Exception:              # naming them is a courtesy; the deadlock stands
            found = ""
        if found:
            text += f", whose collectives are {found}"
    return text


def mismatch_message(hosts, calls) -> str:
    """The processes arrived at different computations at the same step."""
    groups: dict = {}
    for h, c in zip(hosts, calls):
        groups.setdefault(c.signature, []).append((h, c))
    step = hosts[0].steps
    lines = [f"- {processes_text(h for h, _ in members)} called {_call_text(members[0][1])}"
             for members in groups.values()]
    return (f"deadlock across processes: at their global computation number {step} the "
            f"processes called different things, so their collectives can never meet.\n"
            + "\n".join(lines) +
            "\nEvery process must launch the same computations, in the same order, with the "
            "same shapes and shardings. Real JAX does not check this: it hangs (or, where the "
            "two programs' collectives happen to line up, mixes their data). Look for Python "
            "control flow that depends on jax.process_index() or on data only one process has.")


def stranded_message(hosts, waiting) -> str:
    """Some processes wait at a computation that the others finished without calling."""
    call = waiting[0].waiting
    done = [h for h in hosts if h.state == "done"]
    verb, their = ("waits", "its") if len(waiting) == 1 else ("wait", "their")
    lines = [f"- {processes_text(waiting)} {verb} in {_call_text(call)} ({their} global "
             f"computation number {waiting[0].steps})"]
    if done:
        steps = sorted({h.steps for h in done})
        lines.append(f"- {processes_text(done)} finished main after "
                     f"{' or '.join(map(str, steps))} global computation(s), without launching it")
    return ("deadlock across processes: some processes wait for others that will never "
            "launch the same computation.\n" + "\n".join(lines) +
            "\nEvery process must launch the same computations in the same order. Real JAX "
            "hangs here, until a timeout of its distributed runtime (if any) ends it. Look "
            "for Python control flow that depends on jax.process_index().")


def failure_error(failed, waiting) -> BaseException:
    """A process raised: name it, say what it raised and who was left waiting."""
    first = failed[0]
    exc = first.error
    frames = traceback.extract_tb(exc.__traceback__)
    line = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    same = [h for h in failed[1:] if type(h.error) is type(exc) and str(h.error) == str(exc)]
    others = f" ({processes_text(same)} raised the same)" if same else ""
    note = (f" Meanwhile {processes_text(waiting)} waited in {_call_text(waiting[0].waiting)}, "
            f"which real JAX shows as a hang." if waiting else "")
    error = ProcessError(f"{first.where()} raised {type(exc).__name__}{line}: {exc}{others}."
                         f"{note}")
    error.process, error.original = first.index, exc
    return error


class ProcessError(errors.SimpmdError, RuntimeError):
    """A simulated process's ``main`` raised; ``.original`` is what it raised."""


def install_stdout(processes):
    """Route what each process prints to its own buffer; returns the original stdout."""
    original = sys.stdout
    sys.stdout = _Printed(original, processes)
    return original
