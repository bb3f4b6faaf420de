"""simpmd.use_jax_devices: which real devices JAX gets, tested without real accelerators.

The choice is tested on stand-ins for the jax module (TPU, GPU, CPU-only machines); the
real paths (a fresh import, jax imported but idle, jax already running with too few
devices) each run in a fresh interpreter, because a JAX backend starts once per process.
"""
import importlib.util
import os
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

import simpmd
from simpmd.jax import devices as jax_devices
from simpmd.jax.devices import (JaxDevicesError, backend_started, choose_devices,
                                flag_device_count, xla_flags_with_device_count)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FLAG = "--xla_force_host_platform_device_count"


# -- XLA_FLAGS -------------------------------------------------------------------------------

@pytest.mark.parametrize("before, n, after", [
    ("", 8, f"{FLAG}=8"),
    ("--xla_cpu_multi_thread_eigen=false", 8, f"--xla_cpu_multi_thread_eigen=false {FLAG}=8"),
    (f"--a=1 {FLAG}=2 --b=2", 8, f"--a=1 --b=2 {FLAG}=8"),        # smaller: replaced
    (f"--a=1 {FLAG}=16", 8, f"--a=1 {FLAG}=16"),                  # larger: kept as it is
    (f"{FLAG}=8", 8, f"{FLAG}=8"),
    (f"{FLAG}=lots --c", 4, f"--c {FLAG}=4"),                      # unreadable: replaced
])
def test_xla_flags_keep_other_flags_and_only_raise_the_count(before, n, after):
    assert xla_flags_with_device_count(before, n) == after
    assert flag_device_count(after) == max(n, flag_device_count(before))


# -- choosing, on stand-ins for the jax module ---------------------------------------------------

def fake_device(platform, i):
    return SimpleNamespace(platform=platform, id=i)


class FakeJax:
    """Just what choose_devices asks of jax: the default backend and device lists."""

    def __init__(self, default, accelerators=0, cpus=1):
        self.default = default
        self.accelerators = [fake_device(default, i) for i in range(accelerators)]
        self.cpus = [fake_device("cpu", i) for i in range(cpus)]

    def default_backend(self):
        return self.default

    def devices(self, backend=None):
        if backend == "cpu" or (backend is None and self.default == "cpu"):
            return self.cpus
        return self.accelerators


@pytest.mark.parametrize("default, label", [("tpu", "TPU"), ("gpu", "GPU"), ("cuda", "GPU"),
                                            ("rocm", "GPU")])
def test_enough_accelerators_are_used(default, label):
    devices, line = choose_devices(FakeJax(default, accelerators=16, cpus=1), 8)
    assert [d.id for d in devices] == list(range(8)) and devices[0].platform == default
    assert line == f"simpmd: using 8 {label} devices for real JAX"


def test_too_few_accelerators_fall_back_to_fake_cpu_devices():
    devices, line = choose_devices(FakeJax("gpu", accelerators=2, cpus=8), 8)
    assert {d.platform for d in devices} == {"cpu"} and len(devices) == 8
    assert line == ("simpmd: using 8 fake CPU devices for real JAX "
                    "(2 GPU device(s) found, fewer than 8)")


def test_no_accelerator_uses_cpu_devices():
    devices, line = choose_devices(FakeJax("cpu", cpus=8), 4)
    assert len(devices) == 4
    assert line == "simpmd: using 4 fake CPU devices for real JAX (no accelerator found)"


def test_too_few_cpu_devices_is_an_error():
    with pytest.raises(JaxDevicesError, match="only 1 CPU device"):
        choose_devices(FakeJax("cpu", cpus=1), 8)


def test_backend_started_is_feature_detected():
    def bridge(**attrs):
        return SimpleNamespace(_src=SimpleNamespace(xla_bridge=SimpleNamespace(**attrs)))
    assert backend_started(bridge(backends_are_initialized=lambda: True)) is True
    assert backend_started(bridge(backends_are_initialized=lambda: False)) is False
    assert backend_started(bridge(_backends={"cpu": object()})) is True      # older JAX
    assert backend_started(bridge(_backends={})) is False
    assert backend_started(SimpleNamespace()) is None                        # cannot tell


# -- in this process: JAX is already running with 8 CPU devices ---------------------------------

@pytest.fixture
def keep_choice(monkeypatch):
    """Give crosscheck's stored choice back after the test."""
    monkeypatch.setattr(jax_devices, "_chosen", jax_devices._chosen)


def test_running_jax_with_enough_devices_is_used_as_it_is(jax8, keep_choice, capsys, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--unchanged")
    found = jax_devices.accelerators(jax8)        # what this machine has, read from JAX
    if len(found) >= 4 and jax8.default_backend() != "cpu":
        pytest.skip(f"{len(found)} accelerators are JAX's default backend here: they are used")
    devices = simpmd.use_jax_devices(4)
    assert devices == jax8.devices("cpu")[:4] and jax_devices.chosen_devices() == devices
    label = {"gpu": "GPU", "cuda": "GPU", "rocm": "GPU", "tpu": "TPU"}
    reason = (f"{len(found)} {label.get(found[0].platform, found[0].platform.upper())} "
              f"device(s) found, fewer than 4" if found else "no accelerator found")
    assert capsys.readouterr().out == (
        f"simpmd: using 4 fake CPU devices for real JAX ({reason})\n")
    assert os.environ["XLA_FLAGS"] == "--unchanged"      # too late to matter: left alone


def test_running_jax_with_too_few_devices_says_to_restart(jax8, keep_choice):
    before = jax_devices.chosen_devices()
    with pytest.raises(JaxDevicesError) as info:
        simpmd.use_jax_devices(64)
    message = str(info.value)
    assert "Restart the kernel" in message and "simpmd.use_jax_devices(64)" in message
    assert "before importing jax" in message
    assert jax_devices.chosen_devices() is before


def test_accelerators_of_the_running_jax_are_preferred(jax8, keep_choice, monkeypatch, capsys):
    tpus = [fake_device("tpu", i) for i in range(8)]
    cpus = jax8.devices("cpu")
    monkeypatch.setattr(jax8, "default_backend", lambda: "tpu")
    monkeypatch.setattr(jax8, "devices", lambda backend=None: cpus if backend == "cpu" else tpus)
    assert simpmd.use_jax_devices(8, verbose=False) == tpus
    assert capsys.readouterr().out == ""


def test_count_must_be_a_positive_int():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="positive int"):
            simpmd.use_jax_devices(bad)


# -- machines with fewer accelerators than a lesson needs (Colab's one GPU, TPU v5e-1) -----------

@pytest.mark.parametrize("found, platforms", [
    ({}, None),                                  # a laptop: JAX's default is the CPU anyway
    ({"cuda": 1}, "cpu,cuda"),                   # Colab GPU runtime
    ({"tpu": 1}, "cpu,tpu"),                     # Colab TPU v5e-1
    ({"tpu": 8}, None),                          # TPU v5e-8 / v4-8: everything on the TPU
    ({"cuda": 16}, None),
])
def test_the_cpu_becomes_the_default_backend_only_where_accelerators_are_too_few(found, platforms):
    assert jax_devices.platforms_for(8, found) == platforms


@pytest.fixture
def fresh_prepare(monkeypatch):
    """prepare() with this process's environment restored afterwards and no probe cached."""
    monkeypatch.setattr(jax_devices, "_accelerators", None)
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "")
    monkeypatch.setitem(sys.modules, "jax", None)      # as if jax were not imported yet


def test_prepare_on_a_one_gpu_machine_puts_the_cpu_first(fresh_prepare):
    jax_devices.prepare(8, probe=lambda: {"cuda": 1})
    assert os.environ["JAX_PLATFORMS"] == "cpu,cuda"
    assert flag_device_count(os.environ["XLA_FLAGS"]) == 8


def test_prepare_leaves_enough_accelerators_and_a_users_choice_alone(fresh_prepare, monkeypatch):
    jax_devices.prepare(8, probe=lambda: {"tpu": 8})
    assert "JAX_PLATFORMS" not in os.environ
    monkeypatch.setattr(jax_devices, "_accelerators", None)
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    asked = []
    jax_devices.prepare(8, probe=lambda: asked.append(1) or {"cuda": 1})
    assert os.environ["JAX_PLATFORMS"] == "cuda" and asked == []


def test_no_accelerator_plugin_means_no_probe_and_no_jax_started():
    """On this CPU-only machine the probe answers at once, without starting JAX."""
    if jax_devices.accelerator_plugins_installed():
        pytest.skip("an accelerator plugin is installed here")
    assert jax_devices.probe_accelerators() == {}


def test_cpu_default_with_a_gpu_beside_it_says_so():
    class CpuFirst(FakeJax):
        def devices(self, backend=None):
            if backend in (None, "cpu"):
                return self.cpus
            if backend == "cuda":
                return [fake_device("gpu", 0)]
            raise RuntimeError(f"Unknown backend {backend}")
    devices, line = choose_devices(CpuFirst("cpu", cpus=8), 8)
    assert [d.platform for d in devices] == ["cpu"] * 8
    assert line == "simpmd: using 8 fake CPU devices for real JAX (1 GPU device(s) found, fewer than 8)"


# -- fresh interpreters: the real first-import paths ---------------------------------------------

needs_jax = pytest.mark.skipif(importlib.util.find_spec("jax") is None,
                               reason="JAX is not installed (the Python 3.10 leg runs without it)")


def run_fresh(code, **env):
    """Run code in a new interpreter without this process's XLA_FLAGS, CPU only."""
    child_env = {k: v for k, v in os.environ.items()
                 if k not in ("XLA_FLAGS", "JAX_NUM_CPU_DEVICES")}
    child_env.update(JAX_PLATFORMS="cpu", **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT,
                          env=child_env, capture_output=True, text=True, timeout=120)


@needs_jax
def test_fresh_import_makes_fake_cpu_devices_and_keeps_user_flags():
    out = run_fresh("""
        import os, sys, simpmd
        assert "jax" not in sys.modules
        devices = simpmd.use_jax_devices(4)
        import jax
        print(len(devices), jax.device_count(), os.environ["XLA_FLAGS"])
    """, XLA_FLAGS=f"--xla_cpu_multi_thread_eigen=false {FLAG}=2")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "simpmd: using 4 fake CPU devices for real JAX (no accelerator found)",
        f"4 4 --xla_cpu_multi_thread_eigen=false {FLAG}=4"]


@needs_jax
def test_jax_imported_but_idle_still_gets_its_devices_and_config_is_raised():
    out = run_fresh("""
        import jax, simpmd
        devices = simpmd.use_jax_devices(8, verbose=False)
        print(len(devices), jax.device_count())
    """, JAX_NUM_CPU_DEVICES="2")        # a smaller jax_num_cpu_devices set beforehand
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["8", "8"]


@needs_jax
def test_jax_already_running_with_one_device_gives_the_restart_advice():
    out = run_fresh("""
        import jax, simpmd
        jax.numpy.ones(3).sum()                  # JAX has started, with 1 CPU device
        try:
            simpmd.use_jax_devices(8)
        except simpmd.JaxDevicesError as exc:
            print(exc)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("JAX has only 1 CPU device(s) and no accelerator found; "
                                 "8 devices are needed.\nJAX was already running")
    assert "Restart the kernel" in out.stdout and "simpmd.use_jax_devices(8)` first" in out.stdout


@needs_jax
def test_crosscheck_chooses_devices_itself_when_not_told():
    out = run_fresh("""
        import numpy as np, simpmd
        from simpmd import lax
        report = simpmd.crosscheck(lambda x: lax.psum(x, "i"), np.arange(8.0), axis_name="i")
        print(report.ok, report.jax[0].devices)
    """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        "simpmd: using 8 fake CPU devices for real JAX (no accelerator found)", "True 8 CPU"]


# -- Colab's shape: one accelerator beside the CPU, lesson 1 compared as nbval compares it --------

def _sanitized(text):
    """``text`` with the replacements nbval makes before it compares (tests/nbval_sanitize.cfg)."""
    import configparser
    import re
    parser = configparser.RawConfigParser()
    parser.read(os.path.join(ROOT, "tests", "nbval_sanitize.cfg"))
    for section in parser.sections():
        text = re.sub(parser[section]["regex"], parser[section]["replace"], text)
    return text


def _lesson_1_cells(*markers):
    import json
    with open(os.path.join(ROOT, "notebooks", "01_devices_and_meshes.ipynb"), encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    found = []
    for marker in markers:
        cell = next(c for c in cells if c["cell_type"] == "code" and marker in "".join(c["source"]))
        stored = "".join("".join(o.get("text", "")) for o in cell["outputs"]
                         if o.get("output_type") == "stream")
        found.append(("".join(cell["source"]), stored))
    return found


@pytest.mark.parametrize("platform, kind", [("gpu", "Tesla T4"), ("tpu", "TPU v5 lite")])
def test_lesson_1_reads_the_same_beside_one_accelerator(jax8, keep_choice, monkeypatch, capsys,
                                                         platform, kind):
    """On Colab (one GPU or one TPU v5e, the CPU made JAX's default with 8 fake devices),
    lesson 1's cells that show what JAX found must compare equal to the stored CPU output
    once sanitised: the accelerator is named only where the sanitiser replaces it."""
    real = jax8.devices
    accelerator = [SimpleNamespace(platform=platform, device_kind=kind, id=0, process_index=0)]
    names = ("cuda", "gpu") if platform == "gpu" else ("tpu",)

    def devices(backend=None):
        if backend in names:
            return accelerator
        if backend in ("cuda", "gpu", "rocm", "tpu"):
            raise RuntimeError(f"Unknown backend {backend}")
        return real(backend) if backend else real()
    monkeypatch.setattr(jax8, "devices", devices)
    namespace = {"simpmd": simpmd}
    for source, stored in _lesson_1_cells("accelerator_text", "use_jax_devices(16)"):
        exec(source, namespace)
        shown = capsys.readouterr().out
        assert ("1 GPU" in shown or "1 TPU" in shown), shown        # it did see the accelerator
        assert _sanitized(shown) == _sanitized(stored), (shown, stored)
