"""Shared test set-up: 8 fake CPU devices for JAX, and a fresh simulated platform per test.

JAX reads XLA_FLAGS and its platform list once, when its backend first starts, so they are
set here at import time, before any test module can import jax, by the same function the
course uses (simpmd.jax.devices.prepare). On a machine with one GPU or one TPU core that
makes the CPU, with its 8 fake devices, JAX's default backend, as in the lessons. test.sh
exports the flag as well; setting it here too lets a bare `python -m pytest` behave the same.

The tests sit in folders that mirror the package (tests/core, tests/api, ..., docs/testing.md
lists them). The shared case modules stay here in tests/, and every folder that is not a
package is put on sys.path, so a test module imports another's helpers by name whichever
was collected first (a package's, such as conformance's, by its dotted name).
"""
import os
import pathlib
import random
import sys

import pytest

_HERE = pathlib.Path(__file__).resolve().parent
for _folder in sorted(p for p in _HERE.iterdir() if p.is_dir() and p.name[0] not in "._"
                      and not (p / "__init__.py").exists()):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

from fuzz_seeds import ENV as FUZZ_SEED_ENV

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


# -- random programs: this run's new seed, and what a failing new seed does ----------------------

def pytest_configure(config):
    """Choose this run's new fuzz seed once, before collection, and export it, so that every
    xdist worker (started after this, with this environment) draws the same programs."""
    config.addinivalue_line("markers", "new_seed: a test drawn from this run's new fuzz seed "
                                       "(its failure is reported, not fatal; tests/fuzz_seeds.py)")
    if FUZZ_SEED_ENV not in os.environ:
        os.environ[FUZZ_SEED_ENV] = str(random.SystemRandom().randrange(1, 2**31))


def pytest_report_header(config):
    return (f"random programs: new seed {FUZZ_SEED_ENV}={os.environ[FUZZ_SEED_ENV]} "
            "(set it to replay this run's draw; committed seeds in tests/fuzz_seeds.py)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failing test drawn from the new seed becomes an expected failure whose reason says
    how to replay it; the summary lists it (see pytest_terminal_summary)."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed or item.get_closest_marker("new_seed") is None:
        return
    seed = os.environ[FUZZ_SEED_ENV]
    first = str(call.excinfo.value).strip().splitlines()[:1] if call.excinfo else []
    replay = f"{FUZZ_SEED_ENV}={seed} bash test.sh '{item.nodeid}'"
    report.outcome = "skipped"
    report.wasxfail = (f"NEW FUZZ SEED {seed} FAILED (not fatal; replay: {replay}): "
                       f"{first[0][:300] if first else call.excinfo.typename}")
    report.user_properties.append(("new_seed_failure", f"{item.nodeid}\n    replay: {replay}\n"
                                   f"    {first[0][:300] if first else ''}"))


def pytest_terminal_summary(terminalreporter):
    failed = [text for rep in terminalreporter.stats.get("xfailed", [])
              for key, text in getattr(rep, "user_properties", []) if key == "new_seed_failure"]
    seed = os.environ.get(FUZZ_SEED_ENV)
    if failed:
        terminalreporter.section(f"new fuzz seed {seed}: {len(failed)} failing test(s), not fatal")
        for text in failed:
            terminalreporter.write_line(text)
        terminalreporter.write_line("Fix the cause, then add the seed to tests/fuzz_seeds.py "
                                    "REGRESSION (docs/testing.md).")
    else:
        drawn = sum(1 for key in ("passed", "failed") for rep in terminalreporter.stats.get(key, [])
                    if rep.when == "call" and "new_seed" in getattr(rep, "keywords", {}))
        said = f"{drawn} test(s) drawn from it passed" if drawn else "no test of this run drew from it"
        terminalreporter.write_line(f"random programs: new seed {FUZZ_SEED_ENV}={seed}, {said}")
