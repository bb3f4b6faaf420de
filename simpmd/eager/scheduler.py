"""Eager runs: one program per simulated device, meeting at collectives.

By default simpmd traces a body once and runs it over all devices at once (``simpmd/core``). With
``eager=True`` the body may branch on its values in Python, as real JAX cannot, so each
device must run its own copy: this module runs them (and the pmaps nested in such a body,
whose inner maps it runs per outer program). Every simulated device runs the user's
function on its own thread, but only one thread runs at a time: a device runs until it
reaches a collective (or finishes), then hands the *baton* to the next device in the run
queue. A collective is a *rendezvous*: the
last member of the group to arrive combines everyone's values in one NumPy call (see
``collectives.py``), hands each member its result and carries on; the others wake up in
turn. Running one device at a time makes every run deterministic, and it makes the two
failure modes of SPMD programs easy to see: when the run queue is empty but some devices
still wait, nobody can ever wake them (a deadlock), and a member that arrives with a
different collective than its group's (a divergence) is caught on arrival.

The threads are kept in a pool between runs.
"""
from __future__ import annotations

import builtins
from collections import deque
import math
import threading

import numpy as np

from ..core import dtypes, errors
from ..api import tree
from ..core.core import Aval, aval_of, caller_source, context
from ..api.events import Event
from ..api.trace import Trace
from ..core.run import Run, check_groups, coords_text
from ..core.values import StackedValue
from ..api.spmd import Piece, explain_failure, leaf_label, record_trace, refuse_non_arrays

_idle_workers: list = []              # parked worker threads, reused across runs
_WORKER_STACK = 1 << 20               # 1 MiB is plenty for a device's Python frames


def devices_text(ids, limit: int = 12) -> str:
    """'devices 0-511, 513-1023 (1023 devices)': any number of devices in a short line.

    A long list of scattered ids keeps its first ``limit`` runs and says how many more,
    so a message stays short at any scale.
    """
    ids = sorted(set(ids))
    if len(ids) == 1:
        return f"device {ids[0]}"
    runs = errors.id_ranges(ids).split(", ")
    shown = ", ".join(runs[:limit]) + (f", ... ({len(runs) - limit} more runs)"
                                       if len(runs) > limit else "")
    return f"devices {shown} ({len(ids)} devices)"



class _Cancelled(BaseException):
    """Unwinds a waiting device's program when a run is abandoned (not an Exception, so
    user code's ``except Exception`` cannot swallow it)."""


class _Worker:
    """A persistent thread that runs one program at a time, parked on its own lock."""

    def __init__(self):
        self.lock = threading.Lock()
        self.lock.acquire()
        self.task = None
        old = threading.stack_size()
        try:
            threading.stack_size(_WORKER_STACK)
            self.thread = threading.Thread(target=self._loop, name="simpmd-device", daemon=True)
            self.thread.start()
        finally:
            threading.stack_size(old)

    def _loop(self):
        while True:
            self.lock.acquire()
            self.task.sim._execute(self.task)


class Task(Run):
    """One program: the user's function running on one device (or one outer nested body).

    It is the run ``bind`` asks on its thread: a run of one device, whose collectives wait
    for the rest of their group (a rendezvous) instead of computing all groups at once.
    """

    eager = True
    n, abstract, inner, outer = 1, False, None, None
    coords = ()                     # set per task: ((axis name, index, size), ...)

    def __init__(self, sim, fun, args, coords, parent=None):
        self.sim, self.fun, self.args, self.coords, self.parent = sim, fun, args, coords, parent
        self.children: list = []
        self.pending_children = 0
        self.state = "new"
        self.result = self.error = self.worker = self.inbox = self.waiting = None
        self.calls = self.calls_logged = 0
        self.cancelled = False
        self.device = None
        self.devices: tuple = ()
        self.label_text = ""
        self.flat_index = 0
        self.axes = tuple((name, size) for name, _, size in coords)
        self.branches = []
        self.log = _DeviceLog(self)
        self.eager = sim.eager

    check_vma = property(lambda self: self.sim.check_vma)
    maps_a_mesh = property(lambda self: self.sim.maps_a_mesh)
    all_devices = property(lambda self: self.sim.device_list)

    def coords_of(self, k=0):
        return self.coords

    def where(self, k=0) -> str:
        """'device 3 (data=1, model=1)': how error messages name this program."""
        coords = coords_text(self.coords)
        if self.children:
            leaf = self.children[0]
            while leaf.children:
                leaf = leaf.children[0]
            inner = ", ".join(f"{'index' if n is None else n}=0..{s - 1}"
                              for n, _, s in leaf.coords[len(self.coords):])
            return (f"the outer body at {coords} (devices "
                    f"{errors.id_ranges(leaf_device_ids(self))} at {inner})")
        return f"device {self.device.id} ({coords})"

    def label(self, k=0):
        return self.label_text

    def tracing(self):
        """A run of types only with this device's axes, named as this device (a grad's
        function is traced on it)."""
        twin = Run(self.all_devices, self.axes, abstract=True, check_vma=self.check_vma,
                   maps_a_mesh=self.maps_a_mesh)
        twin.where = self.where
        return twin

    def position(self, axis_names, op):
        """(index, size) of this device along ``axis_names`` combined row-major."""
        env = {n: (i, s) for n, i, s in self.coords}
        index, size = 0, 1
        for name in axis_names:
            if name not in env or name is None:
                raise errors.UnboundAxisError(errors.unbound_axis_message(
                    op, name, self.where(), self.coords, self.maps_a_mesh))
            i, s = env[name]
            index, size = index * s + i, size * s
        return index, size

    def axis_size(self, axis_names, op="axis_size") -> int:
        return self.position(axis_names, op)[1]

    def collective(self, prim, stacks, params, avals, out_avals):
        """Join the collective with this device's operands; wait for the group."""
        axes = tuple(params.get("axes") or _names(params.get("axis_name")))
        if getattr(prim, "by_position", False):          # axis_index: this device's index
            return [np.asarray([self.position(axes, prim.op)[0]], dtype=np.int32)]
        values = [s[0] for s in stacks]
        outs = self.sim.collective(self, prim, axes, values, params)
        return [np.asarray(o)[None] for o in outs]


class _DeviceLog:
    """Where debug.print's line of one device goes: printed now, and logged."""

    def __init__(self, task):
        self.task = task

    def print(self, run, texts, source):
        builtins.print(f"[{self.task.where()}] {texts[0]}")
        self.task.sim.log(self.task, "print", detail=texts[0], source=source[0], code=source[1])


def _names(axis_name):
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def leaf_device_ids(task) -> list:
    """The ids of the devices that run ``task``: its own, or those of its inner programs."""
    if not task.children:
        return [task.device.id]
    # several inner pmaps in one outer body run on the same sub-grid: name each device once
    return list(dict.fromkeys(i for child in task.children for i in leaf_device_ids(child)))


class _Rendezvous:
    """The members of one group that have arrived at one collective, waiting for the rest."""

    __slots__ = ("key", "prim", "op", "axes", "params", "size", "signature", "arrived",
                 "group_label", "phase", "iteration")

    def __init__(self, key, prim, axes, params, size, signature, group_label):
        self.key, self.prim, self.op, self.axes, self.params = key, prim, prim.op, axes, params
        self.size, self.signature, self.group_label = size, signature, group_label
        self.arrived: dict = {}          # member index -> (task, leaves, source, code)
        self.phase = "forward"           # or 'backward' (simpmd.grad's transposed collectives)
        # group_label: the whole axis_index_groups (tuple of tuples), or None


class Simulation:
    """One run of a top-level pmap (and any pmaps nested inside it)."""

    maps_a_mesh = False                   # True for shard_map's runs (for error messages)

    def __init__(self, device_list, eager=False):
        self.device_list = list(device_list)
        self.eager = eager
        self.runq: deque = deque()
        self.main_lock = threading.Lock()
        self.main_lock.acquire()
        self.pending: dict = {}           # rendezvous key -> _Rendezvous
        self.events: list = []            # every event, in the order it happened
        self.step = 0
        self.failure = None               # the first (task, exception)
        self.tasks: list = []
        self.check_vma = False

    # -- creating programs --------------------------------------------------------------
    def new_tasks(self, fun, per_device_args, axes, parent=None):
        """One task per point of a new grid of mapped ``axes`` (``((name, size), ...)``).

        ``pmap`` adds one axis per level; ``shard_map`` adds all of a mesh's axes at once.
        Tasks are numbered row-major, below ``parent``'s position when nested, and task
        ``k`` runs on ``device_list[k]`` of the whole grid.
        """
        base = parent.coords if parent else ()
        base_index = parent.flat_index if parent else 0
        sizes = [s for _, s in axes]
        level = math.prod(sizes)
        made = []
        for k, args in enumerate(per_device_args):
            coords, rest = [], k
            for name, size in reversed(axes):          # row-major: last axis varies fastest
                rest, i = divmod(rest, size)
                coords.append((name, i, size))
            coords = base + tuple(reversed(coords))
            t = Task(self, fun, args, coords, parent)
            t.flat_index = base_index * level + k
            made.append(t)
        total = math.prod(s for _, _, s in made[0].coords) if made else 0
        if total > len(self.device_list):
            shape = " x ".join(f"{n}={s}" for n, _, s in made[0].coords)
            raise errors.MappedAxisError(
                f"nested pmap needs a grid of {shape} = {total} devices, but only "
                f"{len(self.device_list)} are available. Call simpmd.set_device_count({total}) "
                f"or map smaller sizes.")
        for t in made:
            t.device = self.device_list[t.flat_index]
            t.devices = (t.device,)
        self.tasks.extend(made)
        return made

    def log(self, task, kind, **fields):
        event = Event(kind=kind, program="", coords=task.coords, seq=task.calls_logged,
                      step=self.step, **fields)
        event._task = task
        task.calls_logged += 1
        self.events.append(event)
        return event

    # -- running --------------------------------------------------------------------------
    def run(self, tasks):
        """Run top-level ``tasks`` to completion (called from the user's thread).

        The caller logs what the programs returned, then calls :meth:`finalize`.
        """
        self.runq.extend(tasks)
        for t in tasks:
            t.state = "ready"
        self._switch()
        self.main_lock.acquire()           # woken when the run queue runs dry
        stuck = [t for t in self.tasks if t.state == "blocked"]
        if stuck or self.failure:
            problem = self._diagnose(stuck)
            self._cancel(stuck)
            self.finalize()
            problem.trace = Trace(self.events)
            raise problem

    def run_nested(self, parent, tasks):
        """Run ``tasks`` (an inner pmap) from inside ``parent``'s program; wait for them."""
        parent.children.extend(tasks)
        parent.pending_children = len(tasks)
        for t in tasks:
            t.state = "ready"
        self.runq.extend(tasks)
        parent.waiting = ("children", None)
        self._block(parent)

    def _switch(self):
        """Hand the baton to the next ready program, or back to the user's thread."""
        if self.runq:
            task = self.runq.popleft()
            task.state = "running"
            if task.worker is None:
                worker = _idle_workers.pop() if _idle_workers else _Worker()
                worker.task, task.worker = task, worker
            task.worker.lock.release()
        else:
            self.main_lock.release()

    def _block(self, task):
        """Park ``task`` until another program puts it back on the run queue."""
        task.state = "blocked"
        self._switch()
        task.worker.lock.acquire()
        if task.cancelled:
            raise _Cancelled()
        task.waiting = None

    def _wake(self, task):
        task.state = "ready"
        self.runq.append(task)

    def _execute(self, task):
        """Body of a worker's turn: run the program, record how it ended, pass the baton."""
        context.run = task
        try:
            task.result = task.fun(*task.args)
            task.state = "done"
        except _Cancelled:
            task.state = "cancelled"
        except BaseException as exc:               # reported after the run, with the logs
            task.state = "failed"
            task.error = exc
            if self.failure is None:
                self.failure = (task, exc)
            self.log(task, "error", detail=f"{type(exc).__name__}: {exc}")
        finally:
            context.run = None
        parent = task.parent
        if parent is not None and task.state != "cancelled":
            parent.pending_children -= 1
            if parent.pending_children == 0 and parent.state == "blocked" and not self.failure:
                self._wake(parent)
        worker = task.worker
        task.worker = worker.task = None
        _idle_workers.append(worker)
        self._switch()

    def _cancel(self, stuck):
        """Unwind every waiting program so its worker thread returns to the pool."""
        if not stuck:
            return
        for t in stuck:                 # the log says where each one was left waiting
            if t.waiting and t.waiting[0] == "collective":
                rv = t.waiting[1]
                source = next((a[2] for a in rv.arrived.values() if a[0] is t), "")
                self.log(t, "error", source=source, detail=(
                    f"still waiting in {rv.op} over {rv.axes} when the run stopped"))
            elif t.waiting:
                self.log(t, "error", detail="still waiting for its inner pmap when the run stopped")
        for t in stuck:
            t.cancelled = True
            self._wake(t)
        self._switch()
        self.main_lock.acquire()

    # -- collectives ----------------------------------------------------------------------
    def collective(self, task, prim, axis_names, leaves, params):
        """Join collective ``prim`` over ``axis_names``; return this member's output leaves."""
        op, groups = prim.op, params.get("axis_index_groups")
        index, size = task.position(axis_names, op)
        group_id, member, p = None, index, size
        if groups is not None:
            check_groups(groups, size, prim, task.where(), axis_names)
            group_id, member = _find_group(groups, index)
            p = len(groups[group_id])
        rest = tuple((n, i) for n, i, _ in task.coords if n not in axis_names)
        scope = tuple(n for n, _, _ in task.coords)
        key = (scope, axis_names, rest, None if groups is None else tuple(groups[group_id]))
        signature = (op, _freeze(prim.lax_params(params)),
                     tuple((np.shape(v), np.asarray(v).dtype.str) for v in leaves))
        source, code = caller_source()
        task.calls += 1
        rv = self.pending.get(key)
        if rv is None:
            label = tuple(tuple(g) for g in groups) if groups is not None else None
            rv = self.pending[key] = _Rendezvous(key, prim, axis_names, params, p, signature, label)
            rv.phase = context.phase         # read on the calling device's thread
            rv.iteration = context.iteration
        elif rv.signature != signature:
            first_task, _, first_source, _ = next(iter(rv.arrived.values()))
            raise errors.DivergenceError(
                f"devices of one group called different collectives: {first_task.where()} "
                f"called {_describe(rv.signature)} over {axis_names} at {first_source}, but "
                f"{task.where()} called {_describe(signature)} at {source}. Every device of a "
                f"group must call the same collectives, in the same order, with the same "
                f"shapes; look for Python control flow or state that differs between devices.")
        rv.arrived[member] = (task, leaves, source, code)
        if len(rv.arrived) < p:
            task.waiting = ("collective", rv)
            self._block(task)
            return task.inbox
        del self.pending[key]
        return self._complete(rv, task)

    def _complete(self, rv, me):
        members = [rv.arrived[m] for m in range(rv.size)]
        prim = rv.prim
        math_params = {k: v for k, v in rv.params.items() if not k.startswith("_")
                       and k not in ("axes", "axis_name", "axis_index_groups", "axis_size")}
        per_leaf = []
        for k in range(len(members[0][1])):
            groups = np.stack([np.asarray(m[1][k]) for m in members])[None]
            out = prim.math(groups, **math_params)
            per_leaf.append(np.broadcast_to(out, groups.shape[:2] + out.shape[2:])[0])
        group_tasks = tuple(m[0] for m in members)
        params = prim.lax_params(rv.params)
        if rv.group_label is not None:
            params["axis_index_groups"] = rv.group_label
        self.step += 1
        for pos, (task, leaves, source, code) in enumerate(members):
            outs = tuple(per_leaf[k][pos] for k in range(len(per_leaf)))
            sent = received = 0
            for leaf in leaves:
                s, r = prim.wire_bytes(np.asarray(leaf).nbytes, rv.size, pos, **rv.params)
                sent, received = sent + s, received + r
            event = self.log(task, "collective", call=task.calls, op=prim.op, axes=rv.axes,
                             member=pos, params=params, inputs=tuple(leaves),
                             outputs=outs, bytes_sent=sent, bytes_received=received,
                             source=source, code=code, phase=rv.phase,
                             iteration=rv.iteration)
            event._group = group_tasks
            if task is not me:
                task.inbox = outs
                self._wake(task)
        mine = group_tasks.index(me)
        return tuple(per_leaf[k][mine] for k in range(len(per_leaf)))

    # -- after the run ---------------------------------------------------------------------
    def finalize(self):
        """Name each program by its devices, now that nesting has settled who spans what."""
        for t in reversed(self.tasks):          # children were created after parents
            if t.children:
                t.devices = tuple(dict.fromkeys(d for c in t.children for d in c.devices))
                t.device = None
        ids = {}
        for t in self.tasks:
            t.label_text = coords_text(t.coords) if t.children else f"device {t.device.id}"
            ids[t] = tuple(d.id for d in t.devices)
        named: dict = {}                        # one group tuple shared by its members
        for e in self.events:
            t = e.__dict__.pop("_task")
            e.program = t.label_text
            e.device = None if t.children else t.device.id
            e.devices = ids[t]
            group = e.__dict__.pop("_group", None)
            if group is not None:
                if id(group) not in named:
                    named[id(group)] = (
                        tuple(g.device.id if not g.children else g.label_text for g in group),
                        tuple(g.label_text for g in group))
                e.group, e.group_programs = named[id(group)]

    def _diagnose(self, stuck):
        """The error that explains why the run could not finish."""
        if self.failure is not None:
            task, exc = self.failure
            waiting = [t for t in stuck if t.waiting and t.waiting[0] == "collective"]
            note = ""
            if waiting:
                note = (f" Meanwhile {len(waiting)} other program(s) waited for it at a "
                        f"collective; their logs are kept in the trace.")
            return explain_failure(task.where(), task.device.id if task.device is not None
                                   else None, exc, note)
        return errors.DeadlockError(deadlock_message(self.pending.values(), self.tasks))


def deadlock_message(rendezvous, tasks, max_groups: int = 8) -> str:
    """Who waits where, and for whom: a few lines at any scale (device lists as ranges)."""

    def who(programs):
        programs = list(programs)
        if len(programs) <= 4:
            return ", ".join(t.where() for t in programs)
        if all(not t.children for t in programs):
            return (f"{devices_text(t.device.id for t in programs)}, from "
                    f"{programs[0].where()} to {programs[-1].where()}")
        return f"{len(programs)} programs, from {programs[0].where()} to {programs[-1].where()}"

    pending = list(rendezvous)
    lines = []
    for rv in pending[:max_groups]:
        arrived = sorted(rv.arrived)
        src = rv.arrived[arrived[0]][2]
        missing = [m for m in range(rv.size) if m not in rv.arrived]
        lines.append(f"- {who(rv.arrived[m][0] for m in arrived)} wait in {rv.op} over "
                     f"{rv.axes} at {src} for group member(s) {errors.id_ranges(missing)} of "
                     f"{rv.size}, which never arrive")
    if len(pending) > max_groups:
        waiting = sum(len(rv.arrived) for rv in pending[max_groups:])
        lines.append(f"- and {len(pending) - max_groups} more groups like these "
                     f"({waiting} more waiting programs)")
    finished = [t for t in tasks if t.state == "done" and not t.children]
    if finished:
        lines.append(f"- finished without joining: {who(finished)}")
    return ("deadlock: some devices wait at a collective that the rest of their group will "
            "never reach, so the run can never finish.\n" + "\n".join(lines) +
            "\nEvery device of a group must reach the same collectives in the same order; "
            "look for a collective inside Python control flow that differs between devices.")


def flat_results(tasks):
    """Each task's result as (leaves, treedef), and the treedef they all share.

    Every device must return the same structure: a program that does not is refused
    here, naming the first device that differs.
    """
    results = [tree.flatten(t.result) for t in tasks]
    treedef = results[0][1]
    for t, (_, td) in zip(tasks, results):
        if td != treedef:
            raise errors.DivergenceError(
                f"{t.where()} returned a result of structure {td}, but {tasks[0].where()} "
                f"returned {treedef}; every device must return the same structure.")
    for t, (leaves, td) in zip(tasks, results):
        refuse_non_arrays(t.where(), leaves, td)
    return results, treedef


def run_per_device(owner, fun, devices, axes, args, kwargs, assemble, eager, check_vma,
                   maps_a_mesh, parent):
    """One program per device, nested under ``parent`` if there is one: the eager half of
    ``simpmd.api.spmd.run``, which calls it through ``bridge.eager``."""
    if parent is None:
        sim = Simulation(devices, eager=eager)
        sim.maps_a_mesh, sim.check_vma = maps_a_mesh, check_vma
    else:
        sim = parent.sim
    leaves, treedef = tree.flatten((args, kwargs))
    pieces = [x for x in leaves if type(x) is Piece]
    n = math.prod(size for _, size in axes)
    per_device = []
    for k in range(n):
        mine = [_device_value(x, k, check_vma) if type(x) is Piece else x for x in leaves]
        per_device.append(tree.unflatten(treedef, mine))
    tasks = sim.new_tasks(lambda a, kw: fun(*a, **kw), per_device, axes, parent)
    for k, t in enumerate(tasks):
        for x in pieces:
            sim.log(t, "receive", inputs=(x.stack[k],), detail=x.detail(k))

    if parent is not None:
        sim.run_nested(parent, tasks)
        stacks, out_def = _stacked_results(tasks)
        return assemble(stacks, out_def, PerDeviceRun(sim, tasks, nested=True))
    try:
        sim.run(tasks)
    except errors.SimpmdError as exc:
        owner.trace = record_trace(exc.trace)
        raise
    error = None
    try:
        stacks, out_def = _stacked_results(tasks)
        outputs = assemble(stacks, out_def, PerDeviceRun(sim, tasks, nested=False))
    except Exception as exc:             # raised below, with the run's trace attached
        error = exc
    sim.finalize()
    owner.trace = record_trace(Trace(sim.events, eager=sim.eager))
    if error is not None:
        if isinstance(error, errors.SimpmdError):
            error.trace = owner.trace
        raise error
    return outputs


def _stacked_results(tasks):
    """Every device's results, stacked per leaf; a device whose shapes differ is named."""
    results, treedef = flat_results(tasks)
    stacks = []
    for j in range(treedef.num_leaves):
        values = [_plain(r[0][j]) for r in results]
        first = values[0]
        for t, v in zip(tasks, values):
            if v.shape != first.shape or v.dtype != first.dtype:
                label = leaf_label(treedef, j)
                raise errors.DivergenceError(
                    f"result{label} has shape {first.shape} {first.dtype} on "
                    f"{tasks[0].where()} but shape {v.shape} {v.dtype} on {t.where()}; every "
                    f"device must return the same shapes and dtypes to be stacked (JAX "
                    f"compiles one program for all of them). Pad or slice to a shape every "
                    f"device shares, and mask the unused part.")
        stacks.append(np.stack(values))
    return stacks, treedef


class PerDeviceRun:
    """The programs of one mapped call run one per device: what a front end's ``assemble``
    asks of a run (``simpmd.core.run.Run`` answers the same questions for stacked values)."""

    outer_n = 1                          # a nested call here is one outer program's
    stacked = False

    def __init__(self, sim, tasks, nested):
        self.sim, self.tasks, self.nested = sim, tasks, nested
        self.n = len(tasks)
        self.devices = [t.device for t in tasks]
        self.eager = sim.eager

    def sub_grids(self):
        """Every program's inner devices (each once: several inner pmaps in one body run on
        the same sub-grid), or None when no pmap nested inside."""
        if not any(t.children for t in self.tasks):
            return None
        return [list(dict.fromkeys(c.device for c in t.children)) for t in self.tasks]

    def where(self, k=0) -> str:
        return self.tasks[k].where()

    def returned(self, stack, detail, aval=None):
        for k, t in enumerate(self.tasks):
            self.sim.log(t, "return", outputs=(stack[k],), detail=detail(k))


def _device_value(piece, k, check_vma):
    """Device ``k``'s value of a mapped argument: one row, typed as the traced body's are."""
    row = piece.stack[k]
    dtype = dtypes.canonical(row.dtype)
    return StackedValue(Aval(row.shape, dtype, vma=(piece.varies or ()) if check_vma else ()),
                        np.asarray(row, dtype=dtype)[None])


def _plain(x):
    """The NumPy value of one device's result leaf."""
    if isinstance(x, StackedValue):
        return x.stack[0]
    return np.asarray(x, dtype=aval_of(x).dtype)


def _find_group(groups, index):
    for g, members in enumerate(groups):
        if index in members:
            return g, list(members).index(index)
    raise errors.CollectiveArgumentError(f"axis index {index} is in no axis_index_groups group")


def _freeze(params):
    def f(v):
        if isinstance(v, (list, tuple)):
            return tuple(f(i) for i in v)
        return v
    return tuple(sorted((k, f(v)) for k, v in params.items()))


def _describe(signature):
    op, params, shapes = signature
    kw = ", ".join(f"{k}={v}" for k, v in params)
    shp = ", ".join(f"{np.dtype(d).name}{list(s)}" for s, d in shapes)
    return f"{op}({shp}{', ' + kw if kw else ''})"
