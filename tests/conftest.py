"""Shared test set-up: 8 fake CPU devices for JAX, and a fresh simulated platform per test.

JAX reads XLA_FLAGS and its platform list once, when its backend first starts, so they are
set here at import time, before any test module can import jax, by the same function the
course uses (simpmd.jax.devices.prepare). On a machine with one GPU or one TPU core that
makes the CPU, with its 8 fake devices, JAX's default backend, as in the lessons. test.sh
exports the flag as well; setting it here too lets a bare `python -m pytest` behave the same.
"""
import os
import sys

import pytest

FAKE_DEVICES = 8
_FLAG = "--xla_force_host_platform_device_count"


def _with_fake_devices(xla_flags: str, count: int = FAKE_DEVICES) -> str:
    """XLA_FLAGS with the fake-device flag appended, unless it is already there."""
    if _FLAG + "=" in xla_flags:
        return xla_flags
    return f"{xla_flags} {_FLAG}={count}".strip()


os.environ["XLA_FLAGS"] = _with_fake_devices(os.environ.get("XLA_FLAGS", ""))
try:
    from simpmd.jax.devices import prepare
except ImportError:                  # simpmd half-written: the engine tests will say so
    pass
else:
    prepare(FAKE_DEVICES)


@pytest.fixture(scope="session")
def jax8():
    """The jax module, with at least 8 devices to run the cross-checks on.

    Skips only when jax is not installed at all (test.sh always installs it); fails when
    jax is there but has fewer than 8 devices, because that means the flag above came too
    late (something imported jax and ran a computation before this conftest).
    """
    try:
        import jax
    except ImportError as exc:
        message = (f"SKIPPED CROSS-CHECK: jax is not installed ({exc}); "
                   "run `bash test.sh`, which installs it")
        print(message, file=sys.stderr)
        pytest.skip(message)
    count = jax.device_count()
    from simpmd.jax.handoff import follow_rules
    follow_rules(jax, jax.devices()[0])     # simpmd's type rules: those of the JAX running
    if count < FAKE_DEVICES:
        pytest.fail(
            f"jax sees {count} device(s) ({jax.devices()}), the cross-checks need "
            f"{FAKE_DEVICES}. XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}; the fake-device "
            "flag only works if it is set before jax's backend starts.")
    return jax


@pytest.fixture(autouse=True)
def _default_platform():
    """Give every test the default simulated platform back (8 devices, default hardware),
    whatever the previous test changed."""
    yield
    try:
        import simpmd
        set_device_count = simpmd.set_device_count
    except Exception:  # simpmd missing or half-written: nothing to reset
        return
    hardware = getattr(sys.modules.get("simpmd.machine.devices"), "DEFAULT_HARDWARE", None)
    if hardware is None:
        set_device_count(FAKE_DEVICES)
    else:
        set_device_count(FAKE_DEVICES, hardware=hardware)
