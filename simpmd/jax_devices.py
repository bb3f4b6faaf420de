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
"""
from __future__ import annotations

import os
import sys

from .errors import SimpmdError

DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"
ACCELERATOR_PLATFORMS = {"tpu": "TPU", "gpu": "GPU", "cuda": "GPU", "rocm": "GPU"}

_chosen: list | None = None       # what use_jax_devices picked, for crosscheck


class JaxDevicesError(SimpmdError, RuntimeError):
    """JAX cannot give the requested number of devices in this Python process."""


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
        accelerators = list(jax.devices())
        label = _platform_label(platform)
        if len(accelerators) >= n:
            return accelerators[:n], f"simpmd: using {n} {label} devices for real JAX"
        reason = f"{len(accelerators)} {label} device(s) found, fewer than {n}"
    else:
        reason = "no accelerator found"
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
    already there) and ``jax_num_cpu_devices`` where JAX has it. Prints one line saying
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
        os.environ["XLA_FLAGS"] = xla_flags_with_device_count(os.environ.get("XLA_FLAGS", ""), n)
    try:
        import jax
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
                f"{exc} JAX was already running in this Python process, and the number of "
                f"fake CPU devices can only be chosen before JAX starts (its first "
                f"computation or device query). Restart the kernel (Jupyter: Kernel > "
                f"Restart; Colab: Runtime > Restart session), then run `import simpmd; "
                f"simpmd.use_jax_devices({n})` first, before importing jax or anything that "
                f"uses it.") from None
        raise JaxDevicesError(
            f"{exc} XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r} was set before JAX started, "
            f"but JAX still made fewer CPU devices: something else (JAX_NUM_CPU_DEVICES, "
            f"jax_platforms) may override it.") from None
    _chosen = devices
    if verbose:
        print(line)
    return devices
