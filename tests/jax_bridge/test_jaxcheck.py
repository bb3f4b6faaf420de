"""simpmd.crosscheck against real JAX (jax.pmap on 8 fake CPU devices), and simpmd.numpy.

Every program of tests/jax_cases.py is cross-checked in one call, as a learner would;
then the report itself: mismatches located by leaf and device, refusals on either side,
the known JAX crashes that must never reach JAX, nested programs on both translations.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd.core import collectives
from simpmd import lax
from simpmd.core.values import StackedValue as DeviceValue

try:
    from tests.jax_cases import CASES
except ImportError:  # tests/ on sys.path rather than the project root
    from jax_cases import CASES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(autouse=True)
def _jax(jax8):
    """Every test here needs real JAX with 8 devices (conftest's jax8)."""
    simpmd.set_device_count(8)
    return jax8


def case_function(case):
    """The case's program written once with simpmd.lax (nested: simpmd.pmap inside)."""
    body = case.make(lax)
    if not case.nested:
        return body
    inner, post = body
    post = post or (lambda y: y)

    def outer(*args):
        return post(simpmd.pmap(inner, axis_name=case.nested[1])(*args))
    outer.__name__ = case.name
    return outer


def crosscheck_case(case):
    return simpmd.crosscheck(case_function(case), *case.args(), axis_name=case.axis_name,
                             **case.pmap_kwargs())


# -- the issue's example -------------------------------------------------------------------

@pytest.fixture(autouse=True)
def fresh_session():
    """Each test starts as a fresh session would: no float note said yet."""
    from simpmd.jax import crosscheck as jaxcheck
    jaxcheck._FLOAT_NOTES_SAID.clear()
    yield
    jaxcheck._FLOAT_NOTES_SAID.clear()


def test_issue_example_agrees_and_says_both_compute_float32():
    """float64 in: both engines compute float32, as JAX does without x64."""
    def scaled_sum(x):
        return lax.psum(x * 2.0, axis_name="devices")

    report = simpmd.crosscheck(scaled_sum, np.arange(8.0), axis_name="devices")
    assert report.ok and report.checked
    assert report.assert_match() is report
    np.testing.assert_array_equal(report.simpmd.outputs, np.full(8, 56.0, np.float32))
    np.testing.assert_array_equal(report.jax[0].outputs, np.full(8, 56.0, np.float32))
    text = str(report)
    assert text.splitlines()[0] == "crosscheck of scaled_sum: simpmd and JAX agree"
    assert "simpmd.pmap  8 simulated  float32[8]" in text
    assert "jax.pmap     8 CPU        float32[8]" in text
    assert "both engines computed in float32" in text and "rtol=1e-05" in text
    assert repr(report) == text
    again = str(simpmd.crosscheck(scaled_sum, np.arange(8.0), axis_name="devices"))
    assert again == "\n".join(line for line in text.splitlines() if "computed in" not in line)
    assert "0x" not in text and "CpuDevice" not in text
    page = report._repr_html_()
    assert page.count("<tr>") == 3 and "scaled_sum" in page and "float32[8]" in page


# -- every program of the engine's cross-check set, in one call each -------------------------

RUNNABLE = [c for c in CASES if c.jax is not None and c.devices is None]


@pytest.mark.parametrize("case", RUNNABLE, ids=lambda c: c.name)
def test_every_case_crosschecks_in_one_call(case):
    report = crosscheck_case(case)
    report.assert_match()
    if case.nested:
        engines = {r.engine: r.verdict for r in report.jax}
        assert set(engines) == {"jax.pmap + jax.vmap", "jax.shard_map"}, engines
        assert engines["jax.shard_map"] == "match"
        if case.jax == "vmap":
            assert engines["jax.pmap + jax.vmap"] == "match"
        assert any("no longer runs a jax.pmap inside another" in n for n in report.notes)
    else:
        assert [r.verdict for r in report.jax] == ["match"]


def test_case_set_covers_every_collective_and_keyword():
    import inspect
    src = inspect.getsource(sys.modules[CASES[0].__module__])
    for word in ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
                 "pshuffle", "all_to_all", "pswapaxes", "axis_index", "axis_size",
                 "axis_index_groups", "tiled=True", "scatter_dimension", "out_axes=None",
                 "in_axes=1", "static_broadcasted_argnums", "namedtuple"):
        assert word in src
    assert len(RUNNABLE) >= 90 and len(NEGATIVE_AXIS) == 5


# -- known JAX bugs ------------------------------------------------------------------------

NEGATIVE_AXIS = [c for c in CASES if c.jax is None and "segfaults" in c.jax_bug]


@pytest.mark.parametrize("case", NEGATIVE_AXIS, ids=lambda c: c.name)
def test_negative_collective_axes_reach_old_jax_counted_from_the_front(case, jax8, monkeypatch):
    """jax < 0.11 cannot compile negative collective axes (some abort the process), so
    crosscheck hands those releases the same axes counted from the front, and says so in a
    note that names the running version; newer releases get the program as it is."""
    from simpmd.jax.crosscheck import negative_axes_fail
    old = tuple(int(p) for p in jax8.__version__.split(".")[:2]) < (0, 11)
    assert negative_axes_fail(jax8) == old     # asked of JAX (before the spies below watch)
    seen = []
    for name in ("all_to_all", "psum_scatter", "pswapaxes"):
        original = getattr(jax8.lax, name)

        def spy(x, *args, _original=original, **kwargs):
            numbers = [a for a in list(args[1:]) + list(kwargs.values())
                       if isinstance(a, int) and not isinstance(a, bool)]
            seen.extend(numbers)
            return _original(x, *args, **kwargs)
        monkeypatch.setattr(jax8.lax, name, spy)
    report = crosscheck_case(case)
    assert report.ok, str(report)
    notes = [n for n in report.notes if n.startswith("On this JAX (")]
    if old:
        assert seen and min(seen) >= 0, seen
        assert len(notes) == 1 and f"({jax8.__version__})" in notes[0]
        assert "counted from the front" in notes[0]
    else:
        assert min(seen) < 0, seen
        assert notes == []


def test_negative_axis_found_in_jaxpr_when_simpmd_stops_first():
    """simpmd's trace cannot show a collective it never reached; the jaxpr (traced, not
    compiled) still does. Run in a child process, so a regression cannot abort pytest."""
    code = textwrap.dedent("""
        import numpy as np, simpmd
        from simpmd import lax
        from simpmd.core.values import StackedValue as DeviceValue
        simpmd.use_jax_devices(8, verbose=False)

        def f(x):
            if isinstance(x, DeviceValue):
                raise RuntimeError("simpmd stops before the collective")
            return lax.all_to_all(x, "i", -1, 0)

        r = simpmd.crosscheck(f, np.ones((8, 8, 8)), axis_name="i")
        import jax
        print(jax.__version__, "|", r.jax[0].verdict, "|", r.jax[0].not_run)
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    version = tuple(int(p) for p in out.stdout.split("|")[0].split(".")[:2])
    if version < (0, 11):
        assert "| not run | known bug in jax" in out.stdout
        assert "all_to_all(split_axis=-1)" in out.stdout
    else:                                  # JAX compiles negative axes: it runs the program
        assert "| simpmd refused |" in out.stdout


@pytest.mark.parametrize("name", ["in_axes_neg1", "out_axes_neg1"])
def test_negative_in_and_out_axes_run_on_jax_as_the_same_axes_from_the_front(name):
    case = next(c for c in CASES if c.name == name)
    report = crosscheck_case(case).assert_match()
    assert any("counted from the front" in n for n in report.notes)


def test_pmean_unequal_groups_mismatch_names_the_jax_bug():
    case = next(c for c in CASES if c.name == "pmean_groups_unequal")
    report = crosscheck_case(case)
    assert not report.ok and report.jax[0].verdict == "mismatch"
    assert any("divides every group's sum by the size of the first group" in n
               for n in report.notes)


# -- pytrees and static arguments ------------------------------------------------------------

def test_pytree_in_and_out_and_static_arguments():
    def step(params, batch, scale, names):
        grads = {k: lax.pmean(batch * v * scale, "i") for k, v in params.items()}
        return {"grads": grads, "names": names and None, "n": lax.psum(1, "i")}

    params = {"w": np.float32(2.0) * np.ones((8, 3), np.float32), "b": np.ones((8, 3), np.float32)}
    report = simpmd.crosscheck(step, params, np.arange(24.0).reshape(8, 3), 0.5, ("w", "b"),
                               axis_name="i", static_broadcasted_argnums=(2, 3))
    report.assert_match()
    assert report.simpmd.outputs["grads"]["w"].shape == (8, 3)


def test_out_axes_pytree_prefix_and_in_axes_none():
    report = simpmd.crosscheck(lambda x, w: (x @ w, lax.psum(x, "i")),
                               np.ones((4, 2, 3)), np.arange(6.0).reshape(3, 2),
                               axis_name="i", in_axes=(0, None), out_axes=(1, None))
    report.assert_match()
    assert "4 simulated" in str(report) and "4 CPU" in str(report)


# -- nested programs: both translations ------------------------------------------------------

def test_nested_worked_example_is_six_on_both_translations():
    def inner(x, p):
        return lax.psum(x * p, "model") * 2

    def outer(x, p):
        return lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data")

    report = simpmd.crosscheck(outer, np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5),
                               axis_name="data").assert_match()
    six = np.full((2, 2), 6.0)
    np.testing.assert_array_equal(report.simpmd.outputs, six)
    vmap_run, mesh_run = report.jax
    assert (vmap_run.engine, vmap_run.devices) == ("jax.pmap + jax.vmap", "2 CPU")
    assert (mesh_run.engine, mesh_run.devices) == ("jax.shard_map", "2x2 CPU mesh")
    np.testing.assert_array_equal(vmap_run.outputs, six)
    np.testing.assert_array_equal(mesh_run.outputs, six)
    text = str(report)
    assert "simpmd.pmap(..., axis_name='model') ran as jax.vmap(..., axis_name='model')" in text
    assert "jax.shard_map over a 2x2 Mesh ('data', 'model')" in text


def test_nested_translation_notes_are_said_once_per_session():
    """Lesson 8 cross-checks a dozen nested programs: the two notes on how a nested pmap
    was translated for JAX come under the first report only."""
    def inner(x, p):
        return lax.psum(x * p, "model") * 2

    def outer(x, p):
        return lax.psum(simpmd.pmap(inner, axis_name="model")(x, p), "data")

    args = (np.arange(4.0).reshape(2, 2), np.full((2, 2), 0.5))
    first = str(simpmd.crosscheck(outer, *args, axis_name="data").assert_match())
    second = simpmd.crosscheck(outer, *args, axis_name="data").assert_match()
    assert "ran as jax.vmap" in first and "jax.shard_map over a 2x2 Mesh" in first
    assert first.count("said once") >= 2
    assert "ran as jax.vmap" not in str(second) and "Mesh ('data'" not in str(second)
    assert [r.engine for r in second.jax] == ["jax.pmap + jax.vmap", "jax.shard_map"]


def test_nested_2x4_inner_outer_and_both_axes():
    def inner(v):
        return (lax.psum(v, "model"), lax.psum(v, "data"), lax.psum(v, ("data", "model")),
                lax.pmax(v, ("model", "data")), lax.axis_index("model") + 10 * lax.axis_index("data"))

    def outer(v):
        y = simpmd.pmap(inner, "model")(v)
        return y[0] * 2, lax.pmean(y[1], "data"), y[2:]

    report = simpmd.crosscheck(outer, np.arange(8.0).reshape(2, 4), axis_name="data")
    report.assert_match()
    assert [r.verdict for r in report.jax] == ["match", "match"]
    np.testing.assert_array_equal(report.jax[1].outputs[2][0], np.full((2, 4), 28.0))


def test_nested_program_pmap_of_vmap_cannot_express_is_still_checked_by_shard_map():
    inner = lambda v: lax.all_gather(v, ("data", "model"))   # noqa: E731
    report = simpmd.crosscheck(lambda v: simpmd.pmap(inner, "model")(v),
                               np.arange(8.0).reshape(2, 4), axis_name="data")
    assert report.ok
    assert [r.verdict for r in report.jax] == ["JAX refused", "match"]
    assert "cannot express this program" in str(report)


def test_nested_with_inner_in_axes_out_axes_and_static_argument():
    def inner(x, w, k):
        return x * w + k

    def outer(x, w):
        y = simpmd.pmap(inner, "model", in_axes=(1, None, None), out_axes=1,
                        static_broadcasted_argnums=2)(x, w, 3)
        return lax.psum(y, "data")

    report = simpmd.crosscheck(outer, np.arange(24.0).reshape(2, 3, 4), np.ones(3),
                               axis_name="data", in_axes=(0, None))
    report.assert_match()
    assert report.simpmd.outputs.shape == (2, 3, 4)


# -- disagreements are reported, located, and raised by assert_match ----------------------------

def test_a_wrong_collective_is_a_mismatch_naming_the_leaf_and_devices(monkeypatch):
    right = collectives.ppermute.math

    def swapped_3_and_5(groups, perm):         # members 3 and 5 get each other's values
        out = right(groups, perm)
        out[:, [3, 5]] = out[:, [5, 3]]
        return out
    monkeypatch.setattr(collectives.ppermute, "math", swapped_3_and_5)

    ring = [(i, (i + 1) % 8) for i in range(8)]
    report = simpmd.crosscheck(lambda x: {"moved": lax.ppermute(x, "i", ring), "same": x},
                               np.arange(16.0).reshape(8, 2), axis_name="i")
    assert not report.ok and report.checked
    (run,) = report.jax
    assert run.verdict == "mismatch" and run.max_abs_diff == 4.0
    assert run.differences == ["out['moved'] differs on device 3, device 5; "
                               "first at [3, 0]: simpmd 8.0, JAX 4.0"]
    with pytest.raises(AssertionError) as info:
        report.assert_match()
    message = str(info.value)
    assert "simpmd and JAX DISAGREE" in message and "device 3, device 5" in message
    assert "mismatch" in report._repr_html_()


def test_per_device_python_state_is_a_mismatch():
    calls = []

    def counts_its_calls(x):          # simpmd runs the body once per device, JAX traces it
        calls.append(None)
        return x * len(calls)

    report = simpmd.crosscheck(counts_its_calls, np.ones(8), axis_name="i")
    assert not report.ok and report.jax[0].verdict == "mismatch"
    assert "device 0" in report.jax[0].differences[0]


def test_tolerance_fits_the_dtype_and_can_be_overridden(monkeypatch):
    """simpmd with x64 on computes float64 inputs as float64, JAX (x64 off) as float32:
    they agree within float32's tolerance, not exactly."""
    monkeypatch.setattr(simpmd.config, "jax_enable_x64", True)
    f = lambda x: lax.psum(x * 0.1, "i")          # noqa: E731
    x = np.arange(8.0) + 1 / 3
    assert simpmd.crosscheck(f, x, axis_name="i").ok
    strict = simpmd.crosscheck(f, x, axis_name="i", rtol=0, atol=0)
    assert not strict.ok and "rtol=0, atol=0" in str(strict)
    same_width = simpmd.crosscheck(f, x.astype(np.float32), axis_name="i")
    assert "both engines computed in float32" in str(same_width)


def test_the_float_note_is_said_once_unless_it_matters(monkeypatch):
    """With x64 on in simpmd (not in JAX) the engines compute at different widths."""
    monkeypatch.setattr(simpmd.config, "jax_enable_x64", True)
    f = lambda x: lax.psum(x * 0.1, "i")          # noqa: E731
    x = np.arange(8.0) + 1 / 3
    first = str(simpmd.crosscheck(f, x, axis_name="i"))
    assert "simpmd computed in float64, JAX in float32" in first and "said once" in first
    second = str(simpmd.crosscheck(f, x, axis_name="i"))
    assert "computed in" not in second and "float64[8]" in second      # dtype columns stay
    # Another width pair is news: said once too.
    assert "both engines computed in float32" in str(simpmd.crosscheck(f, x.astype(np.float32),
                                                                       axis_name="i"))
    # A hand-chosen tolerance, or a disagreement, always shows it.
    assert "rtol=0.001" in str(simpmd.crosscheck(f, x, axis_name="i", rtol=1e-3))
    strict = simpmd.crosscheck(f, x, axis_name="i", rtol=0, atol=0)
    assert not strict.ok and "computed in float64" in str(strict)
    from simpmd.jax.crosscheck import _float_note
    widths = {("float64", "float32")}
    assert _float_note(widths, None, None) is None                     # said above
    assert "compared at rtol=1e-05" in _float_note(widths, None, None, agreed=False)


# -- refusals ------------------------------------------------------------------------------

def test_both_refuse_python_control_flow_on_values():
    report = simpmd.crosscheck(lambda x: x if x.sum() > 0 else -x, np.ones((8, 2)),
                               axis_name="i")
    assert report.ok and report.jax[0].verdict == "both refused"
    assert type(report.simpmd.error).__name__ == "TracerBoolConversionError"
    assert type(report.jax[0].error).__name__ == "TracerBoolConversionError"
    text = str(report)
    assert "simpmd.pmap raised TracerBoolConversionError" in text
    assert "jax.pmap raised TracerBoolConversionError" in text


def test_numpy_function_on_a_tracer_both_refuse_and_simpmd_numpy_fixes_it():
    report = simpmd.crosscheck(lambda x: np.exp(x), np.ones(8), axis_name="i")
    assert report.ok and report.jax[0].verdict == "both refused"
    assert type(report.simpmd.error).__name__ == "TracerArrayConversionError"
    assert type(report.jax[0].error).__name__ == "TracerArrayConversionError"
    assert "simpmd.numpy" in str(report.simpmd.error)
    simpmd.crosscheck(lambda x: snp.exp(x), np.ones(8), axis_name="i").assert_match()


@pytest.mark.parametrize("which", ["exp", "where", "concatenate"])
def test_jax_numpy_on_a_simpmd_value_simpmd_refuses_and_says_why(jax8, which):
    """jnp.concatenate reaches DeviceValue.__jax_array__ (simpmd's clear error); jnp.exp and
    jnp.where, wrapped in jax.jit, refuse in JAX's words first: the report explains both."""
    jnp = jax8.numpy
    body = {"exp": lambda x: jnp.exp(x), "where": lambda x: jnp.where(x > 0, x, 0.0),
            "concatenate": lambda x: jnp.concatenate([x, x])}[which]
    report = simpmd.crosscheck(body, np.ones((8, 2)), axis_name="i")
    assert not report.ok and report.jax[0].verdict == "simpmd refused"
    assert "call array functions through simpmd.numpy" in str(report)
def test_both_refuse_with_different_kinds_of_error_still_agree_and_show_both(jax8):
    # A shape error is a ValueError in NumPy and a TypeError in JAX: both engines refuse
    # the program, which is agreement; the report shows both messages side by side.
    report = simpmd.crosscheck(lambda x: x + np.ones(3), np.ones((8, 2)), axis_name="i")
    assert report.ok and report.jax[0].verdict == "both refused"
    assert "both refuse this program" in report.headline()
    text = str(report)
    assert "simpmd.pmap raised DeviceError" in text
    assert f"On this JAX ({jax8.__version__}): jax.pmap raised TypeError" in text


def test_mapped_size_above_the_device_count_is_refused_by_both():
    report = simpmd.crosscheck(lambda x: x * 2, np.arange(9.0), axis_name="i")
    assert report.checked and report.ok, str(report)


def test_crosscheck_takes_the_unmapped_function():
    with pytest.raises(TypeError, match="the function itself"):
        simpmd.crosscheck(simpmd.pmap(lambda x: x, "i"), np.ones(8))


# -- simpmd.numpy ---------------------------------------------------------------------------

def test_simpmd_numpy_dispatches_on_both_engines():
    def body(x):
        y = snp.tanh(x) + snp.where(x > 2, x, 0.0) + snp.linalg.norm(x)
        z = snp.concatenate([y, snp.exp(-x)], axis=0)
        return lax.pmean(z * snp.asarray(2.0, snp.float32), "i") + snp.pi

    simpmd.crosscheck(body, np.arange(16.0).reshape(8, 2) / 4, axis_name="i").assert_match()


def test_simpmd_numpy_outside_any_engine(jax8):
    jnp = jax8.numpy
    assert type(snp.exp(np.zeros(2))) is np.ndarray
    assert isinstance(snp.exp(jnp.zeros(2)), jax8.Array)
    assert isinstance(snp.stack([np.zeros(2), jnp.zeros(2)]), jax8.Array)  # any JAX leaf
    assert snp.float32 is np.float32 and snp.newaxis is None
    assert snp.bfloat16 is jnp.bfloat16              # a type only JAX has
    assert snp.uses_jax({"a": [1, (np.ones(1), jnp.ones(1))]})
    assert not snp.uses_jax([np.ones(1), DeviceValue(np.ones(1))])


def test_simpmd_numpy_names_are_checked(jax8):
    with pytest.raises(AttributeError, match="simpmd.numpy has no 'expp'.*jax.numpy has no"):
        snp.expp
    with pytest.raises(AttributeError, match="jax.numpy has no array2string"):
        snp.array2string(jax8.numpy.ones(2))


def test_jax_numpy_on_a_simpmd_device_value_points_to_simpmd_numpy(jax8):
    """jnp functions that convert their arguments reach DeviceValue.__jax_array__, whose error
    says what to do (jit-wrapped ones such as jnp.exp refuse in JAX's words first; the
    crosscheck report adds the advice then, see above)."""
    with pytest.raises(simpmd.TracerArrayConversionError, match="simpmd.numpy"):
        simpmd.pmap(lambda x: jax8.numpy.concatenate([x, x]), "i")(np.ones((8, 2)))


def test_crosscheck_takes_shard_map_programs():
    mesh = simpmd.make_mesh((2, 4), ("data", "model"))
    f = simpmd.shard_map(lambda x: simpmd.lax.psum(x, "model") * 2, mesh=mesh,
                         in_specs=simpmd.P("data", "model"), out_specs=simpmd.P("data", None))
    x = np.arange(32.0, dtype=np.float32).reshape(4, 8)
    report = simpmd.crosscheck(f, x)
    assert report.ok and report.jax[0].engine == "jax.shard_map", str(report)
    assert report.jax[0].devices == "2x4 CPU mesh"
    wrong = simpmd.shard_map(lambda x: simpmd.lax.psum(x, "data") * 2, mesh=mesh,
                             in_specs=simpmd.P("data", "model"), out_specs=simpmd.P(None, "model"))
    # same body on JAX, but simpmd's result monkeypatched to differ: a mismatch is reported
    import simpmd.jax.crosscheck as jc
    real = jc._to_numpy
    calls = []

    def tamper(value):
        out = real(value)
        calls.append(1)
        return out + 1 if len(calls) == 1 else out
    jc._to_numpy = tamper
    try:
        bad = simpmd.crosscheck(wrong, x)
    finally:
        jc._to_numpy = real
    assert not bad.ok and bad.jax[0].verdict == "mismatch"


def test_understood_differences_are_explained(tmp_path, monkeypatch):
    log = tmp_path / "checks.log"
    monkeypatch.setenv("SIMPMD_CROSSCHECK_LOG", str(log))
    groups = [[0, 1, 2], [3, 4, 5, 6, 7]]       # pmean over unequal groups: a known JAX bug
    report = simpmd.crosscheck(lambda x: simpmd.lax.pmean(x, "i", axis_index_groups=groups),
                               np.arange(8, dtype=np.float32), axis_name="i")
    assert not report.ok and report.explained == "known JAX bug"
    agreeing = simpmd.crosscheck(lambda x: x * 2, np.ones(8, np.float32), axis_name="i")
    assert agreeing.explained is None
    lines = log.read_text().splitlines()
    assert lines[0].startswith("EXPLAINED") and lines[1].startswith("ok")
