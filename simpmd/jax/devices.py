"""Choosing the real JAX devices that simpmd's programs are cross-checked on.

``simpmd.use_jax_devices(8)``, called before jax is imported, gives real JAX 8 devices to
run on: the accelerators when at least 8 exist (a Colab TPU, a node of GPUs), otherwise
8 *fake* CPU devices. Fake CPU devices are how JAX itself tests multi-device code on a
laptop: the flag ``--xla_force_host_platform_device_count=8`` in ``XLA_FLAGS`` (or the
newer ``jax_num_cpu_devices`` option) splits the CPU into 8 devices. Both are read once,
when JAX starts its backend (its first computation or device query); after that, only a
fresh Python process can change the count, so this module says so instead of failing
later. It never installs or upgrades JAX (on Colab, JAX comes preinstalled and matched to
the runtime's TPU or GPU).

A machine with fewer accelerators than the program needs (Colab's one GPU, or its TPU
v5e-1) is the common case. There the CPU is made JAX's *default* backend, with the fake
devices, and the accelerator stays reachable beside it (``jax_platforms="cpu,cuda"`` or
``"cpu,tpu"``), so that plain ``jax.pmap(f)``, ``jax.make_mesh`` and ``jax.jit`` run on the
8 CPU devices as they do on a laptop. Which accelerator there is, and how many devices it
has, is asked of JAX in a short-lived child process (only when an accelerator plugin is
installed), because the answer is needed before this process's JAX may start.
"""
from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys

from ..core.errors import SimpmdError
from .handoff import follow_rules

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
ACCELERATOR_PLATFORMS = {"tpu": "TPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU"}

_chosen: list | None = None       # what use_jax_devices picked, for crosscheck
_accelerators: dict | None = None # {"cuda": 1}: what the probe found (None: not asked)

# Asked of JAX in the child process: how many devices each accelerator platform has.
_PROBE = """
import json, jax
found = {}
for name in ("tpu", "cuda", "rocm"):
    try:
        found[name] = len(jax.devices(name))
    except Exception:
        pass
print(json.dumps(found))
"""


class JaxDevicesError(SimpmdError, RuntimeError):
    """JAX cannot give the requested number of devices in this Python process.

    The message's first line says what JAX has (it depends on the machine: no accelerator,
    or a GPU or TPU with too few devices); the lines after it say what to do."""


def chosen_devices() -> list | None:
    """The JAX devices picked by the last :func:`use_jax_devices` call (None before)."""
    return _chosen


def xla_flags_with_device_count(flags: str, n: int) -> str:
    """``flags`` (an ``XLA_FLAGS`` value) asking for at least ``n`` fake CPU devices.

    Other flags are kept as they are; an existing device-count flag is kept if it already
    asks for ``n`` or more devices, and replaced otherwise.
    """
    tokens = flags.split()
    counts = [t for t in tokens if t.startswith(DEVICE_COUNT_FLAG + "=")]
    if counts:
        try:
            existing = int(counts[-1].split("=", 1)[1])
        except ValueError:
            existing = 0
        if existing >= n:
            return flags
        tokens = [t for t in tokens if not t.startswith(DEVICE_COUNT_FLAG + "=")]
    return " ".join(tokens + [f"{DEVICE_COUNT_FLAG}={n}"])


def flag_device_count(flags: str) -> int:
    """The fake CPU device count ``flags`` asks for (0 if it does not say)."""
    for token in reversed(flags.split()):
        if token.startswith(DEVICE_COUNT_FLAG + "="):
            try:
                return int(token.split("=", 1)[1])
            except ValueError:
                return 0
    return 0


def accelerator_plugins_installed() -> bool:
    """Whether JAX could find a TPU or GPU here: libtpu, or a ``jax_plugins`` package (the
    CUDA and ROCm plugins), is installed. Answered without importing JAX."""
    if importlib.util.find_spec("libtpu") is not None:
        return True
    try:
        import jax_plugins  # optional, as JAX is; a namespace package: it runs no plugin code
    except ImportError:
        return False
    return any(True for _ in pkgutil.iter_modules(getattr(jax_plugins, "__path__", [])))


def probe_accelerators(timeout: float = 300.0) -> dict:
    """``{"cuda": 1}``: the accelerator platforms JAX finds here and their device counts,
    asked of JAX in a child process so that this process's JAX has not started yet.
    Empty when no accelerator plugin is installed, or when the child fails."""
    if not accelerator_plugins_installed():
        return {}
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "XLA_FLAGS")}
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"     # take no GPU memory to count devices
    try:
        run = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                             text=True, timeout=timeout)
        found = json.loads(run.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, OSError, ValueError, IndexError):
        return {}
    return {name: int(count) for name, count in found.items() if int(count) > 0}


def platforms_for(n: int, accelerators: dict) -> str | None:
    """The ``jax_platforms`` value that gives programs of ``n`` devices a default backend
    with enough devices: ``"cpu,cuda"`` when the GPUs are fewer than ``n`` (the CPU, with
    its fake devices, first), None when the accelerators suffice or there are none."""
    if not accelerators or max(accelerators.values()) >= n:
        return None
    return ",".join(["cpu"] + sorted(accelerators))


def prepare(n: int, probe=probe_accelerators) -> None:
    """Before JAX starts: ask for ``n`` fake CPU devices and, on a machine whose
    accelerators are fewer than ``n``, make the CPU JAX's default backend.

    A ``JAX_PLATFORMS`` the user set is left alone. Safe to call again."""
    global _accelerators
    os.environ["XLA_FLAGS"] = xla_flags_with_device_count(os.environ.get("XLA_FLAGS", ""), n)
    if os.environ.get("JAX_PLATFORMS"):
        return
    if _accelerators is None:
        _accelerators = probe()
    platforms = platforms_for(n, _accelerators)
    if platforms is None:
        return
    os.environ["JAX_PLATFORMS"] = platforms
    jax = sys.modules.get("jax")        # imported but not started: its config reads the
    if jax is not None:                 # environment only once, so tell it directly
        try:
            jax.config.update("jax_platforms", platforms)
        except Exception:
            pass


def accelerators(jax) -> list:
    """The TPU/GPU devices of the running ``jax``, whether or not one is its default."""
    found = []
    for name in ("tpu", "cuda", "rocm", "gpu"):
        try:
            found += [d for d in jax.devices(name) if d not in found]
        except Exception:
            pass
    return found


def accelerator_text(jax) -> str:
    """'1 GPU (NVIDIA H100 80GB HBM3)', or 'none': the accelerators beside the CPU."""
    found = accelerators(jax)
    if not found:
        return "none"
    label = _platform_label(found[0].platform)
    return f"{len(found)} {label} ({found[0].device_kind})"


def backend_started(jax) -> bool | None:
    """Whether ``jax`` has started its backends (so device counts are fixed), if it can tell.

    JAX has no public question for this; its ``xla_bridge`` module has answered it as
    ``backends_are_initialized()`` and, earlier, through its ``_backends`` cache.
    Returns None when neither exists.
    """
    bridge = getattr(getattr(jax, "_src", None), "xla_bridge", None)
    ask = getattr(bridge, "backends_are_initialized", None)
    if callable(ask):
        return bool(ask())
    cache = getattr(bridge, "_backends", None)
    if isinstance(cache, dict):
        return bool(cache)
    return None


def _ask_config_for(jax, n: int) -> None:
    """Raise the ``jax_num_cpu_devices`` option to ``n`` where this JAX has it.

    When set (>= 0) it overrides the XLA flag, so a smaller value set earlier would win.
    """
    config = getattr(jax, "config", None)
    values = getattr(config, "values", {})
    if config is None or "jax_num_cpu_devices" not in values:
        return
    current = getattr(config, "jax_num_cpu_devices", -1)
    if isinstance(current, int) and 0 <= current < n:
        try:
            config.update("jax_num_cpu_devices", n)
        except RuntimeError:      # backend already started: the count check below says so
            pass


def _platform_label(platform: str) -> str:
    return ACCELERATOR_PLATFORMS.get(platform, platform.upper())


def choose_devices(jax, n: int) -> tuple[list, str]:
    """Pick ``n`` devices from ``jax`` (the module, or anything with its ``default_backend``
    and ``devices``): accelerators if the default backend has ``n`` of them, else ``n`` CPU
    devices. Returns the devices and the one line that says what was chosen.
    """
    platform = jax.default_backend()
    if platform in ACCELERATOR_PLATFORMS:
        found = list(jax.devices())
        label = _platform_label(platform)
        if len(found) >= n:
            return found[:n], f"simpmd: using {n} {label} devices for real JAX"
        reason = f"{len(found)} {label} device(s) found, fewer than {n}"
    else:
        found = accelerators(jax)
        reason = (f"{len(found)} {_platform_label(found[0].platform)} device(s) found, "
                  f"fewer than {n}" if found else "no accelerator found")
    try:
        cpus = list(jax.devices("cpu"))
    except RuntimeError:
        cpus = []
    if len(cpus) >= n:
        return cpus[:n], f"simpmd: using {n} fake CPU devices for real JAX ({reason})"
    raise JaxDevicesError(
        f"JAX has only {len(cpus)} CPU device(s) and {reason}; {n} devices are needed.")


def use_jax_devices(n: int = 8, *, verbose: bool = True) -> list:
    """Give real JAX ``n`` devices for cross-checks; call it before importing jax.

    Uses the accelerators (TPU, GPU) when the default backend has at least ``n``,
    otherwise arranges ``n`` fake CPU devices through ``XLA_FLAGS`` (keeping the flags
    already there) and ``jax_num_cpu_devices`` where JAX has it, and makes the CPU JAX's
    default backend where an accelerator has fewer than ``n`` devices (see
    :func:`prepare`). Prints one line saying
    what it chose and returns the chosen ``jax.Device`` list (``crosscheck`` uses it).
    Raises :class:`JaxDevicesError`, saying what to do, if JAX already started with too
    few devices.
    """
    global _chosen
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"use_jax_devices needs a positive int, got {n!r}")
    already = sys.modules.get("jax")
    started = backend_started(already) if already is not None else False
    if not started:
        prepare(n)
    try:
        import jax  # optional: JAX
    except ImportError as exc:
        raise ImportError(
            f"simpmd.use_jax_devices needs JAX ({exc}). Install it with `pip install jax` "
            "(on Colab it is preinstalled: do not reinstall it there).") from None
    if not started:
        _ask_config_for(jax, max(n, flag_device_count(os.environ["XLA_FLAGS"])))
    try:
        devices, line = choose_devices(jax, n)
    except JaxDevicesError as exc:
        if started or started is None:
            raise JaxDevicesError(
                f"{exc}\nJAX was already running in this Python process, and the number of "
                f"fake CPU devices can only be chosen before JAX starts (its first "
                f"computation or device query). Restart the kernel (Jupyter: Kernel > "
                f"Restart; Colab: Runtime > Restart session), then run `import simpmd; "
                f"simpmd.use_jax_devices({n})` first, before importing jax or anything that "
                f"uses it.") from None
        raise JaxDevicesError(
            f"{exc}\nXLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} was set before JAX started, "
            f"but JAX still made fewer CPU devices: something else (JAX_NUM_CPU_DEVICES, "
            f"jax_platforms) may override it.") from None
    _chosen = devices
    follow_rules(jax, devices[0])      # simpmd's type rules are those of the JAX running
    if verbose:
        print(line)
    return devices
