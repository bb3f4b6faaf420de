"""Real multi-process JAX on this machine, beside simpmd's simulated processes.

``crosscheck_processes(programs, 4)`` runs each program (a ``main(jax)`` written against
JAX's names) twice: on ``simpmd.run_processes`` with 4 simulated processes, and as 4 real
JAX processes started here, each with its own CPU devices, joined by
``jax.distributed.initialize("localhost:PORT", num_processes=4, process_id=i)`` (JAX's
CPU collectives run between them, over gloo). Then it compares each process's view: what
its ``main`` returned (for an array, each addressable shard: which local device, which
block, its values) and what it printed.

All programs of a call share one launch (starting JAX in 4 processes takes seconds). The
processes are started in sessions of their own and always ended (on success, failure,
timeout or a hang), so a notebook never waits forever: a process that stops making
progress while the others have moved on is a hang, reported with every process's output.
The engine-neutral view (:func:`describe`) and the worker live here too: a worker is
``python -m simpmd.jax.multiprocess SPEC PROCESS_ID``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import importlib
import inspect
import io
import json
import os
import pathlib
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import contextlib

import numpy as np

from .devices import DEVICE_COUNT_FLAG
import importlib.metadata as metadata
from ..core.errors import DeadlockError
from ..hosts import ProcessError, run_processes
from ..machine import devices as machine
from .crosscheck import log_verdict

# -- a process's view, the same on both engines -----------------------------------------------


def describe(value, local_devices) -> object:
    """What one process sees of ``value``: arrays as their addressable shards (the local
    device's position among this process's devices, the block's place, its values, its
    replica id), containers as containers, anything else as a NumPy value."""
    if isinstance(value, dict):
        return {"dict": {str(k): describe(v, local_devices) for k, v in sorted(value.items())}}
    if isinstance(value, (list, tuple)):
        return {"seq": [describe(v, local_devices) for v in value]}
    if value is None:
        return {"none": None}
    if hasattr(value, "addressable_shards"):
        positions = {d.id: k for k, d in enumerate(local_devices)}
        shards = []
        for s in value.addressable_shards:
            index = tuple(sl.indices(n)[:2] for sl, n in zip(s.index, value.shape))
            shards.append((positions.get(s.device.id, -1), index, np.asarray(s.data),
                           int(s.replica_id)))
        shards.sort(key=lambda t: (t[0], t[1]))
        return {"array": {"shape": tuple(value.shape), "dtype": str(np.dtype(value.dtype)),
                          "fully_addressable": bool(getattr(value, "is_fully_addressable", True)),
                          "shards": shards}}
    return {"value": np.asarray(value)}


def differences(sim, real, path="result") -> list:
    """Where two descriptions differ, in words (empty when they agree)."""
    (kind, a), (other, b) = next(iter(sim.items())), next(iter(real.items()))
    if kind != other:
        return [f"{path}: simpmd has {kind}, JAX has {other}"]
    if kind == "dict":
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a)} against {sorted(b)}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    if kind == "seq":
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for k, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{k}]")]
    if kind == "value":
        return [] if _close(a, b) else [f"{path}: {a.tolist()} against {b.tolist()}"]
    if kind == "array":
        return _array_differences(a, b, path)
    return []


def _close(a, b) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape:
        return False
    if a.dtype.kind in "fc" or b.dtype.kind in "fc":
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(a, b))


def _array_differences(a, b, path) -> list:
    found = []
    for key in ("shape", "dtype", "fully_addressable"):
        if a[key] != b[key]:
            found.append(f"{path}: {key} {a[key]} against {b[key]}")
    if len(a["shards"]) != len(b["shards"]):
        return found + [f"{path}: {len(a['shards'])} addressable shards against "
                        f"{len(b['shards'])}"]
    for (p, i, x, r), (q, j, y, s) in zip(a["shards"], b["shards"]):
        if (p, i, r) != (q, j, s):
            found.append(f"{path}: shard on local device {p} holds block {i} (replica {r}), "
                         f"against local device {q}, block {j} (replica {s})")
        elif not _close(x, y):
            found.append(f"{path}: local device {p}'s block {i} holds {x.tolist()} against "
                         f"{y.tolist()}")
    return found


# -- a program, as a worker gets it ------------------------------------------------------------


def program_spec(main) -> dict:
    """How a worker finds ``main``: by module and name when it can import it, else by its
    source (a function defined in a notebook), run with NumPy imported as ``np``."""
    name = getattr(main, "__name__", "main")
    module = getattr(main, "__module__", None)
    qualname = getattr(main, "__qualname__", name)
    if module not in (None, "__main__") and "<" not in qualname:
        try:
            if getattr(importlib.import_module(module), qualname, None) is main:
                return {"name": name, "module": module, "qualname": qualname}
        except ImportError:
            pass
    try:
        source = textwrap.dedent(inspect.getsource(main))
    except (OSError, TypeError) as exc:
        raise ValueError(f"crosscheck_processes cannot send {name!r} to the JAX processes: "
                         f"it is neither importable by name nor has readable source "
                         f"({exc}). Define it with def, in a module or a notebook cell.") from exc
    return {"name": name, "source": source}


def _load(spec):
    if "module" in spec:
        return getattr(importlib.import_module(spec["module"]), spec["qualname"])
    namespace = {"np": np, "numpy": np, "__name__": "__simpmd_program__"}
    exec(compile(spec["source"], f"<program {spec['name']}>", "exec"), namespace)
    return namespace[spec["name"]]


# -- the worker: one real JAX process ----------------------------------------------------------


def _outcome(main, jax) -> dict:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            result = main(jax)
        outcome = {"result": describe(result, jax.local_devices())}
    except Exception as exc:                  # compared with simpmd's: the kind of error
        lines = str(exc).strip().splitlines()
        outcome = {"error": type(exc).__name__, "message": lines[0] if lines else ""}
    outcome["printed"] = printed.getvalue()
    return outcome


def worker(spec_path: str, process_id: int) -> None:
    """One JAX process: join the others, run every program, write down each outcome."""
    spec = json.loads(pathlib.Path(spec_path).read_text())
    folder = pathlib.Path(spec["folder"])
    with open(folder / f"progress{process_id}", "a", buffering=1) as progress:
        progress.write("starting\n")
        import jax  # optional: JAX
        import jax.experimental.mesh_utils          # as simpmd.experimental has them, so that
        import jax.experimental.multihost_utils  # optional: JAX; a program may spell it
        jax.config.update("jax_platforms", "cpu")
        jax.distributed.initialize(f"localhost:{spec['port']}", num_processes=spec["processes"],
                                   process_id=process_id,
                                   initialization_timeout=spec["initialization_timeout"])
        progress.write("initialized\n")
        for k, program in enumerate(spec["programs"]):
            progress.write(f"start {k}\n")
            outcome = _outcome(_load(program), jax)
            (folder / f"outcome{process_id}_{k}.pickle").write_bytes(pickle.dumps(outcome))
            progress.write(f"done {k}\n")
        progress.write("finished\n")
        jax.distributed.shutdown()
        progress.write("shut down\n")


# -- launching them ------------------------------------------------------------------------------


class MultiProcessError(RuntimeError):
    """The real JAX processes could not run: one failed to start, the port was taken, or
    they ran past the time allowed. The message shows every process's output."""


@dataclass
class RealRun:
    """What the real processes did: per program, each process's outcome (None where it
    never got there), and the program where some hung, if any."""

    outcomes: list
    hung: dict = field(default_factory=dict)      # program index -> text
    seconds: float = 0.0
    version: str = ""
    pids: list = field(default_factory=list)


def free_port() -> int:
    """A TCP port on localhost that nothing listens on now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def worker_environment(local_device_count: int) -> dict:
    """The caller's environment, with this process's CPU device count (whatever the
    caller's XLA_FLAGS ask for), CPU only, and simpmd importable."""
    env = dict(os.environ)
    flags = [t for t in env.get("XLA_FLAGS", "").split() if not t.startswith(DEVICE_COUNT_FLAG + "=")]
    env["XLA_FLAGS"] = " ".join(flags + [f"{DEVICE_COUNT_FLAG}={local_device_count}"])
    env["JAX_NUM_CPU_DEVICES"] = str(local_device_count)
    env["JAX_PLATFORMS"] = "cpu"
    root = str(pathlib.Path(__file__).resolve().parents[2])
    here = [p for p in sys.path if p and os.path.isdir(p)]     # where main's module was found
    paths = [root, os.getcwd()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + here
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return env


class Launch:
    """N real JAX processes running the same programs: started, watched, always ended."""

    def __init__(self, programs, processes, local_device_count, port, timeout, hang_timeout):
        self.n, self.count = processes, local_device_count
        self.timeout, self.hang_timeout = timeout, hang_timeout
        self.folder = pathlib.Path(tempfile.mkdtemp(prefix="simpmd-processes-"))
        self.specs = [program_spec(p) for p in programs]
        self.port = port
        self.popen: list = []
        self.hung: dict = {}

    def start(self):
        spec = {"folder": str(self.folder), "port": self.port, "processes": self.n,
                "programs": self.specs, "initialization_timeout": int(max(10, self.timeout))}
        path = self.folder / "spec.json"
        path.write_text(json.dumps(spec))
        env = worker_environment(self.count)
        for i in range(self.n):
            log = open(self.folder / f"output{i}", "w")
            self.popen.append(subprocess.Popen(
                [sys.executable, "-m", "simpmd.jax.multiprocess", str(path), str(i)],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True))
            log.close()

    def lines(self, i) -> list:
        path = self.folder / f"progress{i}"
        return path.read_text().splitlines() if path.exists() else []

    def output(self, i, limit: int = 15) -> str:
        path = self.folder / f"output{i}"
        text = path.read_text(errors="replace") if path.exists() else ""
        keep = [line for line in text.splitlines() if line.strip()][-limit:]
        return "\n".join("      " + line for line in keep) or "      (no output)"

    def outputs(self) -> str:
        return "\n".join(f"  process {i} (last step: {(self.lines(i) or ['not started'])[-1]}):\n"
                         f"{self.output(i)}" for i in range(self.n))

    def watch(self):
        """Wait until every process has finished its programs; stop them all at the first
        failure, hang or the timeout."""
        begun, seen = time.monotonic(), {}
        while True:
            now = time.monotonic()
            codes = [p.poll() for p in self.popen]
            steps = [self.lines(i) for i in range(self.n)]
            if all("finished" in s for s in steps):
                return
            for i, (code, s) in enumerate(zip(codes, steps)):
                if code is not None and "finished" not in s:
                    raise MultiProcessError(self._failed_text(i, code))
                last = s[-1] if s else ""
                if seen.get(i, ("",))[0] != last:
                    seen[i] = (last, now)
            if self._hang(steps, seen, now):
                return
            if now - begun > self.timeout:
                raise MultiProcessError(
                    f"the {self.n} JAX processes ran past the {self.timeout:.0f} s allowed; "
                    f"all were stopped. Their last steps and output:\n{self.outputs()}")
            time.sleep(0.05)

    def _failed_text(self, i, code) -> str:
        text = self.output(i, 40)
        if "Address already in use" in text or "Failed to bind" in text:
            return (f"port {self.port} on localhost is taken: JAX process {i} could not "
                    f"listen on it. Pass another port (or port=None to find a free one).")
        return (f"JAX process {i} of {self.n} stopped with exit code {code} before finishing "
                f"its programs; the others were stopped. Every process's output:\n"
                f"{self.outputs()}")

    def _hang(self, steps, seen, now) -> bool:
        """A process that started program k and has not finished it ``hang_timeout``
        seconds after another process did (or after it started, if later) is hung."""
        for k in range(len(self.specs)):
            done = [i for i in range(self.n) if f"done {k}" in steps[i]]
            stuck = [i for i in range(self.n) if steps[i] and steps[i][-1] == f"start {k}"]
            if done and stuck:
                first_done = min(seen[i][1] for i in done if seen[i][0] != f"start {k}") \
                    if any(seen[i][0] != f"start {k}" for i in done) else now
                waited = now - max(max(seen[i][1] for i in stuck), first_done)
                if waited > self.hang_timeout:
                    self.hung[k] = (f"processes {', '.join(map(str, stuck))} hung in program "
                                    f"{self.specs[k]['name']!r} while processes "
                                    f"{', '.join(map(str, done))} had finished it "
                                    f"(no progress for {self.hang_timeout:.0f} s); all were stopped")
                    return True
        return False

    def stop(self):
        """End every process still running (its whole session), and wait for it."""
        for p in self.popen:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in self.popen:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def outcomes(self) -> list:
        out = []
        for k in range(len(self.specs)):
            row = []
            for i in range(self.n):
                path = self.folder / f"outcome{i}_{k}.pickle"
                row.append(pickle.loads(path.read_bytes()) if path.exists() else None)
            out.append(row)
        return out


def run_on_jax(programs, num_processes: int = 4, local_device_count: int = 2, *,
               port: int | None = None, timeout: float = 120.0,
               hang_timeout: float = 5.0) -> RealRun:
    """Run ``programs`` (each a ``main(jax)``) in ``num_processes`` real JAX processes of
    ``local_device_count`` CPU devices each, one after the other in one launch.

    ``port`` (a free one is found when None) is where process 0 serves the others. Raises
    :class:`MultiProcessError` when a process fails to start or dies, the port is taken,
    or the whole takes longer than ``timeout`` seconds; a program where some processes
    stop making progress for ``hang_timeout`` seconds while others have finished it is
    recorded as hung (the rest of the programs are not run). Every process is ended
    before this returns."""
    if port is not None and not port_is_free(port):
        raise MultiProcessError(f"port {port} on localhost is taken (another program listens "
                                f"on it); pass another port, or port=None to find a free one.")
    launch = Launch(programs, num_processes, local_device_count, port or free_port(),
                    timeout, hang_timeout)
    begun = time.monotonic()
    try:
        launch.start()
        launch.watch()
        outcomes = launch.outcomes()
    except MultiProcessError as exc:
        exc.pids = [p.pid for p in launch.popen]
        raise
    finally:
        launch.stop()
        pids = [p.pid for p in launch.popen]
        shutil.rmtree(launch.folder, ignore_errors=True)
    return RealRun(outcomes, dict(launch.hung), time.monotonic() - begun,
                   metadata.version("jax"), pids)


# -- the same programs on simpmd, and the comparison ---------------------------------------------


def run_on_simpmd(programs, num_processes: int = 4, local_device_count: int = 2) -> list:
    """Each program on ``simpmd.run_processes``: per program, each process's outcome in
    the form the workers write (a deadlock is every process's outcome ``hung``)."""
    out = []
    with machine.platform_for(num_processes * local_device_count, processes=num_processes):
        for main in programs:
            try:
                run = run_processes(main, show=False)
            except DeadlockError as exc:
                out.append([{"hung": str(exc)}] * num_processes)
                continue
            except ProcessError as exc:
                run = exc.run
            row = []
            for p in range(num_processes):
                error = run.errors[p]
                if error is not None:
                    lines = str(error).strip().splitlines()
                    outcome = {"error": type(error).__name__, "message": lines[0] if lines else ""}
                else:
                    outcome = {"result": describe(run.results[p], run.devices[p])}
                outcome["printed"] = run.printed[p]
                row.append(outcome)
            out.append(row)
    return out


def _summary(row) -> str:
    """One engine's outcome of one program, in a few words."""
    if row is None:
        return "-"
    if any(o is not None and "hung" in o for o in row):
        return "deadlock" if all(o is not None and "hung" in o for o in row) else "hung"
    errors = sorted({o["error"] for o in row if o is not None and "error" in o})
    if errors:
        return f"raised {', '.join(errors)}"
    return "returned" if len(row) == 1 else f"{len(row)} returned"


def compare_outcomes(sim_row, real_row, hung_text=None) -> tuple:
    """(verdict, differences) for one program: every process's view, compared."""
    if hung_text is not None:
        real_row = [{"hung": hung_text}] * len(sim_row)
    sim_stuck = all("hung" in o for o in sim_row)
    real_stuck = real_row is not None and all(o is None or "hung" in o for o in real_row)
    if sim_stuck or real_stuck:
        if sim_stuck and real_stuck:
            return "both hang", []
        return "mismatch", [f"simpmd: {_summary(sim_row)}; JAX: {_summary(real_row)}"]
    found = []
    for p, (a, b) in enumerate(zip(sim_row, real_row)):
        if b is None:
            found.append(f"process {p}: JAX never got here")
        elif ("error" in a) != ("error" in b):
            said = a if "error" in a else b
            found.append(f"process {p}: simpmd {_summary([a])}, JAX {_summary([b])} "
                         f"({said['error']}: {said['message'][:300]})")
        elif "error" in a and a["error"] != b["error"]:
            found.append(f"process {p}: simpmd raised {a['error']}, JAX {b['error']}")
        elif "result" in a:
            found += [f"process {p}: {d}" for d in differences(a["result"], b["result"])]
        if b is not None and a["printed"] != b["printed"]:
            found.append(f"process {p} printed {a['printed']!r} on simpmd, {b['printed']!r} on JAX")
    if found:
        return "mismatch", found
    return ("both raised" if all("error" in o for o in sim_row) else "match"), []


AGREE = ("match", "both raised", "both hang")      # the verdicts of a program that agrees


class ProcessCheckReport:
    """Per program: what simpmd's and JAX's processes did, and whether every process's
    view agrees. ``print`` shows a table (no timings: ``seconds`` has the launch's)."""

    def __init__(self, names, sim, real: RealRun, processes, local_device_count):
        self.names, self.sim, self.real = names, sim, real
        self.processes, self.local_device_count = processes, local_device_count
        self.seconds = real.seconds
        self.rows = []
        for k, name in enumerate(names):
            verdict, found = compare_outcomes(sim[k], real.outcomes[k], real.hung.get(k))
            self.rows.append((name, _summary(sim[k]),
                              "hung" if k in real.hung else _summary(real.outcomes[k]),
                              verdict, found))

    @property
    def ok(self) -> bool:
        return all(r[3] in AGREE for r in self.rows)

    def assert_match(self):
        if not self.ok:
            raise AssertionError(str(self))
        return self

    def printed(self, name: str, engine: str = "jax") -> str:
        """What each process printed in program ``name``, on ``engine`` ('jax' or 'simpmd')."""
        k = self.names.index(name)
        row = (self.real.outcomes if engine == "jax" else self.sim)[k]
        blocks = []
        for p, o in enumerate(row):
            text = "(never got there)" if o is None else o.get("printed", "").rstrip("\n")
            lines = text.splitlines() or ["(printed nothing)"]
            blocks.append(f"process {p}:\n" + "\n".join("    " + line for line in lines))
        return "\n".join(blocks)

    def __str__(self):
        what = "agree" if self.ok else "DISAGREE"
        head = (f"crosscheck of {len(self.names)} program(s) on {self.processes} processes x "
                f"{self.local_device_count} CPU devices: simpmd and JAX {what} on every "
                f"process's view")
        table = [("program", "simpmd", "JAX processes", "verdict")] + [r[:4] for r in self.rows]
        widths = [max(len(t[i]) for t in table) for i in range(4)]
        lines = [head]
        for j, t in enumerate(table):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(t, widths)).rstrip())
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        for name, _, _, _, found in self.rows:
            lines += [f"  - {name}: {d}" for d in found[:6]]
        return "\n".join(lines)

    __repr__ = __str__


def crosscheck_processes(programs, num_processes: int = 4, local_device_count: int = 2, *,
                         port: int | None = None, timeout: float = 120.0,
                         hang_timeout: float = 5.0) -> ProcessCheckReport:
    """Run each program (a ``main(jax)``) on simpmd's simulated processes and on as many
    real JAX processes, and compare every process's view (its results' addressable shards,
    its values, what it printed). One launch of JAX processes serves every program; a
    program that deadlocks on simpmd must hang on JAX (put it last: the launch stops at a
    hang)."""
    programs = list(programs)
    sim = run_on_simpmd(programs, num_processes, local_device_count)
    real = run_on_jax(programs, num_processes, local_device_count, port=port, timeout=timeout,
                      hang_timeout=hang_timeout)
    names = [getattr(p, "__name__", f"program {k}") for k, p in enumerate(programs)]
    report = ProcessCheckReport(names, sim, real, num_processes, local_device_count)
    for name, _, _, verdict, _ in report.rows:
        log_verdict(verdict in AGREE, f"{name}: simpmd and {num_processes} JAX processes x "
                                      f"{local_device_count} CPU devices, {verdict}")
    return report


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]))
