"""simpmd against real JAX: every case in jax_cases.py runs on both and must agree.

JAX (jax.pmap on 8 fake CPU devices) is the ground truth: where the two differ, simpmd
is wrong. The exceptions are the few programs where JAX itself is wrong or crashes;
those are checked against NumPy closed forms instead, and test_jax_010_bugs_* pins down
the JAX behaviour that keeps them out of the cross-check.
"""
import os

# conftest.py sets this too; repeated here so the module also works on its own.
if "--xla_force_host_platform_device_count=" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()

import numpy as np
import pytest

try:
    from tests.jax_cases import CASES, Case, by_name
except ImportError:  # tests/ on sys.path rather than the project root
    from jax_cases import CASES, Case, by_name

RTOL = ATOL = 1e-5

JAX_CASES = [c for c in CASES if c.jax is not None]
NUMPY_ONLY_CASES = [c for c in CASES if c.jax is None]
EXPECTED_CASES = [c for c in CASES if c.expected is not None]


@pytest.fixture(autouse=True)
def _eight_simulated_devices():
    import simpmd
    simpmd.set_device_count(8)


# -- running one case on each engine ----------------------------------------------------

def run_simpmd(case: Case):
    import simpmd
    from simpmd import lax as simlax

    kw = case.pmap_kwargs()
    if case.devices is not None:
        kw["devices"] = [simpmd.devices()[i] for i in case.devices]
    body = case.make(simlax)
    if case.nested:
        outer, inner_name = case.nested
        inner, post = body
        post = post or (lambda y: y)

        def fun(*args):
            return post(simpmd.pmap(inner, axis_name=inner_name)(*args))

        return simpmd.pmap(fun, axis_name=outer, **kw)(*case.args())
    return simpmd.pmap(body, axis_name=case.axis_name, **kw)(*case.args())


def run_jax(jax, case: Case):
    kw = case.pmap_kwargs()
    if case.devices is not None:
        kw["devices"] = [jax.devices()[i] for i in case.devices]
    body = case.make(jax.lax)
    args = case.args()
    if case.jax == "pmap":
        return jax.pmap(body, axis_name=case.axis_name, **kw)(*args)
    outer, inner_name = case.nested
    inner, post = body
    if case.jax == "vmap":
        # The modern spelling of nested pmap: the inner axis becomes a named vmap axis.
        post = post or (lambda y: y)
        return jax.pmap(lambda *a: post(jax.vmap(inner, axis_name=inner_name)(*a)),
                        axis_name=outer, **kw)(*args)
    if case.jax == "shard_map":
        # shard_map over a 2-D mesh, one (1, 1, ...) block per device: what pmap-of-vmap
        # cannot express (collectives over both axes at once, axis_index_groups).
        assert post is None and kw == {"in_axes": 0, "out_axes": 0}, case.name
        from jax.sharding import Mesh, PartitionSpec as P
        import jax.numpy as jnp
        D, M = args[0].shape[:2]
        mesh = Mesh(np.array(jax.devices()[:D * M]).reshape(D, M), (outer, inner_name))

        def block_body(*blocks):
            out = inner(*[b[0, 0] for b in blocks])
            return jax.tree.map(lambda o: jnp.asarray(o)[None, None], out)

        spec = P(outer, inner_name)
        return jax.shard_map(block_body, mesh=mesh, in_specs=(spec,) * len(args),
                             out_specs=spec, check_vma=False)(*args)
    raise ValueError(f"unknown JAX reference {case.jax!r}")


# -- comparing two result trees ---------------------------------------------------------

def _flatten(tree):
    """Leaves (as NumPy arrays) and structure, with JAX's pytree rules (None is no leaf);
    simpmd's own pytree code where JAX is not installed (the Python 3.10 leg)."""
    try:
        from jax.tree_util import tree_flatten
    except ImportError:
        from simpmd.api.tree import flatten as tree_flatten
    leaves, treedef = tree_flatten(tree)
    return [np.asarray(leaf) for leaf in leaves], treedef


def assert_trees_match(got, want, *, exact_dtype=True, what="simpmd", against="jax"):
    got_leaves, got_def = _flatten(got)
    want_leaves, want_def = _flatten(want)
    assert got_def == want_def, f"{what} result structure {got_def} != {against} {want_def}"
    for k, (g, w) in enumerate(zip(got_leaves, want_leaves)):
        where = f"leaf {k}"
        assert g.shape == w.shape, f"{where}: {what} shape {g.shape} != {against} shape {w.shape}"
        assert g.dtype.kind == w.dtype.kind, (
            f"{where}: {what} dtype {g.dtype} is not the same kind as {against} {w.dtype}")
        if exact_dtype and w.dtype.kind == "f":
            assert g.dtype == w.dtype, f"{where}: {what} dtype {g.dtype} != {against} {w.dtype}"
        if w.dtype.kind in "iub":
            np.testing.assert_array_equal(g, w, err_msg=f"{where}: {what} vs {against}")
        else:
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL,
                                       err_msg=f"{where}: {what} vs {against}")


# -- the cross-check ---------------------------------------------------------------------

@pytest.mark.parametrize("case", JAX_CASES, ids=lambda c: c.name)
def test_matches_jax(jax8, case):
    want = run_jax(jax8, case)
    got = run_simpmd(case)
    assert_trees_match(got, want, exact_dtype=case.exact_dtype)


@pytest.mark.parametrize("case", [c for c in EXPECTED_CASES if c.jax is not None], ids=lambda c: c.name)
def test_closed_form_matches_jax(jax8, case):
    """The NumPy closed forms agree with JAX wherever JAX works, so they can stand in for
    it where it does not (the NUMPY_ONLY_CASES below)."""
    want = run_jax(jax8, case)
    closed = case.expected(*case.args())
    assert_trees_match(closed, want, exact_dtype=False, what="closed form")


@pytest.mark.parametrize("case", NUMPY_ONLY_CASES, ids=lambda c: c.name)
def test_matches_closed_form_where_jax_is_wrong(case):
    """JAX crashes or is wrong on these (case.jax_bug says how); simpmd must match the
    NumPy closed form, or (where case.refusal_ok) refuse with an explanation."""
    assert case.jax_bug, "a case kept out of the cross-check must name the JAX bug"
    if case.refusal_ok:
        try:
            got = run_simpmd(case)
        except (ValueError, TypeError, NotImplementedError) as exc:
            assert len(str(exc)) > 30, f"refusal without an explanation: {exc!r}"
            return
    else:
        got = run_simpmd(case)
    assert_trees_match(got, case.expected(*case.args()), exact_dtype=False, against="closed form")


@pytest.mark.parametrize("case", [c for c in EXPECTED_CASES if c.jax is not None], ids=lambda c: c.name)
def test_simpmd_matches_closed_form(case):
    assert_trees_match(run_simpmd(case), case.expected(*case.args()), exact_dtype=False,
                       against="closed form")


def test_worked_check_is_six(jax8):
    """Outer 'data' over inner 'model': psum(x * 0.5, 'model') * 2 gives 1 and 5 on the two
    data rows, psum over 'data' gives 6 (adding all four devices would give 12); 6 on both."""
    case = by_name("nested_worked_check_2x2")
    six = np.full((2, 2), 6.0, dtype=np.float32)
    np.testing.assert_array_equal(np.asarray(run_simpmd(case)), six)
    np.testing.assert_array_equal(np.asarray(run_jax(jax8, case)), six)


def test_case_list_covers_every_collective():
    import inspect
    src = inspect.getsource(__import__(Case.__module__, fromlist=["x"]))
    for op in ("psum", "pmean", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute",
               "pshuffle", "all_to_all", "pswapaxes", "axis_index", "axis_size",
               "axis_index_groups", "tiled=True", "scatter_dimension", "static_broadcasted_argnums",
               "devices=", "out_axes=None", "in_axes=1"):
        assert f"{op}" in src, f"no case uses {op}"
    assert 60 <= len(JAX_CASES) <= 130, len(JAX_CASES)


# -- the JAX bugs that keep cases out of the cross-check ---------------------------------
# These run JAX only and hold on every release the course is tested on (0.7.2, 0.10.2,
# 0.12.0.1; scripts/test_matrix.sh). When one fails on a new release, JAX fixed the bug:
# say so in the course and move the case into the cross-check (set its `jax`).

def test_jax_bug_out_axes_negative_is_refused_or_gives_a_wrong_shape(jax8):
    x = np.ones((8, 3, 5), np.float32)
    try:
        shape = jax8.pmap(lambda v: v * 2, "i", out_axes=-1)(x).shape
    except AssertionError:                    # jax 0.7
        return
    assert shape == (24, 5, 1)                # jax 0.10 and 0.12; the right answer is (3, 5, 8)


def test_jax_bug_in_axes_negative_raises(jax8):
    x = np.ones((3, 5, 8), np.float32)
    with pytest.raises(Exception):            # AssertionError (0.7), IndivisibleError (0.10+)
        jax8.pmap(lambda v: v.sum(0), "i", in_axes=-1)(x)


def test_jax_bug_pmean_unequal_groups_divides_by_first_group(jax8):
    x = np.arange(8 * 3, dtype=np.float32).reshape(8, 3)
    out = np.asarray(jax8.pmap(
        lambda v: jax8.lax.pmean(v, "i", axis_index_groups=[[0, 1, 2], [3, 4, 5, 6, 7]]), "i")(x))
    assert out[0, 0] == 3.0 and out[3, 0] == 25.0   # the right answer is 3.0 and 15.0
