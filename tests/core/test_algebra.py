"""The algebra of the collectives, as properties over random shapes, axes, device counts
and group layouts (hypothesis). Everything runs through simpmd.pmap / simpmd.lax; every
expected value is a NumPy closed form over the stacked inputs, never simpmd itself.

The data is float64 and the run has x64 enabled (simpmd.config, as jax.config's
jax_enable_x64), so the closed forms can be held to 1e-12: these tests are about the
collectives' math, not about JAX's 32-bit default (tests/core/test_dtypes.py).
"""
from contextlib import contextmanager

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import simpmd
from simpmd import lax


@pytest.fixture(autouse=True)
def _x64():
    simpmd.config.update("jax_enable_x64", True)
    yield
    simpmd.config.update("jax_enable_x64", False)

SETTINGS = settings(max_examples=25, deadline=None, database=None)
DEFAULT_COUNT = 8


@contextmanager
def device_count(n):
    simpmd.set_device_count(n)
    try:
        yield
    finally:
        simpmd.set_device_count(DEFAULT_COUNT)


def data(seed, shape, dtype=np.float64):
    values = np.random.default_rng(seed).standard_normal(shape)
    return values.astype(dtype)


def run(body, *args, n_devices, **pmap_kw):
    """Run ``body`` on ``n_devices`` simulated devices over axis 'i'; stacked NumPy out."""
    with device_count(n_devices):
        out = simpmd.pmap(body, axis_name="i", **pmap_kw)(*args)
    if isinstance(out, tuple):
        return tuple(np.asarray(o) for o in out)
    return np.asarray(out)


# -- strategies ---------------------------------------------------------------------------

seeds = st.integers(0, 2**32 - 1)
# (devices on the platform, devices mapped): mapped size at most the device count
counts = st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n)))
shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def group_layouts(draw, min_groups=1):
    """(n, groups): a random partition of range(n) into equal groups in random order."""
    size = draw(st.sampled_from([1, 2, 3, 4]))
    n_groups = draw(st.integers(min_groups, max(min_groups, 8 // size)))
    n = size * n_groups
    order = draw(st.permutations(range(n)))
    return n, [sorted(order[g * size:(g + 1) * size]) if draw(st.booleans())
               else list(order[g * size:(g + 1) * size]) for g in range(n_groups)]


@st.composite
def split_concat(draw):
    """(n, per-device shape, split_axis, concat_axis, tiled), axes possibly negative."""
    n = draw(st.integers(1, 8))
    ndim = draw(st.integers(1, 3))
    split = draw(st.integers(0, ndim - 1))
    concat = draw(st.integers(0, ndim - 1))
    tiled = draw(st.booleans())
    shape = [draw(st.integers(1, 3)) for _ in range(ndim)]
    shape[split] = n * draw(st.integers(1, 2)) if tiled else n
    if draw(st.booleans()):
        split -= ndim
    if draw(st.booleans()):
        concat -= ndim
    return n, tuple(shape), split, concat, tiled


# -- reductions ---------------------------------------------------------------------------

@SETTINGS
@given(counts, shapes, seeds)
def test_psum_is_the_sum_of_shards(count, shape, seed):
    n_platform, n = count
    x = data(seed, (n,) + shape)
    out = run(lambda v: lax.psum(v, "i"), x, n_devices=n_platform)
    assert out.shape == x.shape
    np.testing.assert_allclose(out, np.broadcast_to(x.sum(axis=0), x.shape), rtol=1e-12, atol=1e-12)


@SETTINGS
@given(counts, shapes, seeds)
def test_pmean_pmax_pmin_are_numpy_mean_max_min(count, shape, seed):
    n_platform, n = count
    x = data(seed, (n,) + shape)
    mean, hi, lo = run(lambda v: (lax.pmean(v, "i"), lax.pmax(v, "i"), lax.pmin(v, "i")),
                       x, n_devices=n_platform)
    np.testing.assert_allclose(mean, np.broadcast_to(x.mean(0), x.shape), rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(hi, np.broadcast_to(x.max(0), x.shape))
    np.testing.assert_array_equal(lo, np.broadcast_to(x.min(0), x.shape))


@SETTINGS
@given(group_layouts(), shapes, seeds, st.sampled_from(["psum", "pmean", "pmax", "pmin"]))
def test_reductions_with_groups_reduce_each_group(layout, shape, seed, op):
    n, groups = layout
    x = data(seed, (n,) + shape)
    reduce = {"psum": np.sum, "pmean": np.mean, "pmax": np.max, "pmin": np.min}[op]
    out = run(lambda v: getattr(lax, op)(v, "i", axis_index_groups=groups), x, n_devices=n)
    want = np.empty_like(x)
    for g in groups:
        want[g] = reduce(x[g], axis=0)
    np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@SETTINGS
@given(counts, seeds)
def test_psum_of_a_pytree_sums_every_leaf(count, seed):
    n_platform, n = count
    tree = {"w": data(seed, (n, 2, 3)), "b": [data(seed + 1, (n,)), None]}
    with device_count(n_platform):
        out = simpmd.pmap(lambda t: lax.psum(t, "i"), axis_name="i")(tree)
    assert out["b"][1] is None
    np.testing.assert_allclose(np.asarray(out["w"]), np.broadcast_to(tree["w"].sum(0), (n, 2, 3)))
    np.testing.assert_allclose(np.asarray(out["b"][0]), np.full(n, tree["b"][0].sum()))


# -- gathering and scattering ---------------------------------------------------------

@SETTINGS
@given(counts, shapes, seeds, st.data())
def test_all_gather_then_axis_index_is_identity(count, shape, seed, draw):
    n_platform, n = count
    axis = draw.draw(st.integers(0, len(shape)), label="axis")
    tiled = draw.draw(st.booleans(), label="tiled") and len(shape) > 0
    if tiled:
        axis = min(axis, len(shape) - 1)
    x = data(seed, (n,) + shape)
    gathered, index = run(lambda v: (lax.all_gather(v, "i", axis=axis, tiled=tiled), lax.axis_index("i")),
                          x, n_devices=n_platform)
    np.testing.assert_array_equal(index, np.arange(n))
    whole = np.concatenate(list(x), axis=axis) if tiled else np.stack(list(x), axis=axis)
    np.testing.assert_array_equal(gathered, np.broadcast_to(whole, (n,) + whole.shape))
    for d in range(n):  # my own block of what I gathered is what I had
        mine = (np.split(gathered[d], n, axis=axis)[index[d]] if tiled
                else np.take(gathered[d], index[d], axis=axis))
        np.testing.assert_array_equal(mine, x[d])


@SETTINGS
@given(group_layouts(), st.integers(1, 3), seeds)
def test_all_gather_with_groups_gathers_group_members_in_group_order(layout, width, seed):
    n, groups = layout
    x = data(seed, (n, width))
    out = run(lambda v: lax.all_gather(v, "i", axis_index_groups=groups), x, n_devices=n)
    for g in groups:
        for d in g:
            np.testing.assert_array_equal(out[d], x[g])


@SETTINGS
@given(counts, shapes, seeds, st.booleans(), st.data())
def test_reduce_scatter_then_all_gather_is_all_reduce(count, shape, seed, tiled, draw):
    n_platform, n = count
    ndim = len(shape) + 1
    dim = draw.draw(st.integers(0, ndim - 1), label="scatter_dimension")
    per_device = list(shape)
    per_device.insert(dim, n * draw.draw(st.integers(1, 2), label="k") if tiled else n)
    x = data(seed, (n, *per_device))
    negative = draw.draw(st.booleans(), label="negative")
    sd = dim - ndim if negative else dim

    def body(v):
        scattered = lax.psum_scatter(v, "i", scatter_dimension=sd, tiled=tiled)
        return scattered, lax.all_gather(scattered, "i", axis=dim, tiled=tiled)

    scattered, regathered = run(body, x, n_devices=n_platform)
    total = x.sum(axis=0)
    blocks = np.split(total, n, axis=dim) if tiled else [np.take(total, d, axis=dim) for d in range(n)]
    np.testing.assert_allclose(scattered, np.stack(blocks), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(regathered, np.broadcast_to(total, x.shape), rtol=1e-12, atol=1e-12)


# -- all_to_all -----------------------------------------------------------------------

def np_all_to_all(stacked, split, concat, tiled):
    n, ndim = stacked.shape[0], stacked.ndim - 1
    split, concat = split % ndim, concat % ndim
    if tiled:
        return np.stack([np.concatenate([np.split(stacked[s], n, axis=split)[d] for s in range(n)],
                                        axis=concat) for d in range(n)])
    return np.stack([np.stack([np.take(stacked[s], d, axis=split) for s in range(n)], axis=concat)
                     for d in range(n)])


@SETTINGS
@given(split_concat(), seeds)
def test_all_to_all_twice_with_swapped_axes_is_identity(params, seed):
    n, shape, split, concat, tiled = params
    x = data(seed, (n,) + shape)

    def body(v):
        once = lax.all_to_all(v, "i", split, concat, tiled=tiled)
        return once, lax.all_to_all(once, "i", concat, split, tiled=tiled)

    once, twice = run(body, x, n_devices=n)
    np.testing.assert_array_equal(once, np_all_to_all(x, split, concat, tiled))
    np.testing.assert_array_equal(twice, x)


@SETTINGS
@given(group_layouts(), st.integers(1, 3), seeds)
def test_all_to_all_with_groups_stays_inside_each_group(layout, width, seed):
    n, groups = layout
    size = len(groups[0])
    x = data(seed, (n, size, width))
    out = run(lambda v: lax.all_to_all(v, "i", 0, 0, axis_index_groups=groups), x, n_devices=n)
    for g in groups:
        for pos, d in enumerate(g):  # member pos receives row pos of every member, in group order
            np.testing.assert_array_equal(out[d], x[g][:, pos])


# -- permutations ---------------------------------------------------------------------

@SETTINGS
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)))),
       shapes, seeds)
def test_ppermute_then_inverse_is_identity(n_perm, shape, seed):
    n, perm = n_perm
    pairs = [(src, dst) for src, dst in enumerate(perm)]
    inverse = [(dst, src) for src, dst in pairs]
    x = data(seed, (n,) + shape)

    def body(v):
        moved = lax.ppermute(v, "i", pairs)
        return moved, lax.ppermute(moved, "i", inverse)

    moved, back = run(body, x, n_devices=n)
    want = np.empty_like(x)
    for src, dst in pairs:
        want[dst] = x[src]
    np.testing.assert_array_equal(moved, want)
    np.testing.assert_array_equal(back, x)


@SETTINGS
@given(st.integers(1, 8).flatmap(
    lambda n: st.tuples(st.just(n), st.permutations(range(n)), st.lists(st.booleans(), min_size=n, max_size=n))),
    seeds)
def test_partial_ppermute_gives_zeros_to_devices_that_receive_nothing(params, seed):
    n, perm, keep = params
    pairs = [(src, dst) for src, dst in enumerate(perm) if keep[src]]
    x = data(seed, (n, 3)) + 10.0          # no zeros in the data
    out = run(lambda v: lax.ppermute(v, "i", pairs), x, n_devices=n)
    want = np.zeros_like(x)
    for src, dst in pairs:
        want[dst] = x[src]
    np.testing.assert_array_equal(out, want)


@SETTINGS
@given(st.integers(1, 8).flatmap(lambda n: st.tuples(st.just(n), st.permutations(range(n)))), seeds)
def test_pshuffle_takes_from_perm(n_perm, seed):
    n, perm = n_perm
    x = data(seed, (n, 2))
    out = run(lambda v: lax.pshuffle(v, "i", list(perm)), x, n_devices=n)
    np.testing.assert_array_equal(out, x[list(perm)])   # device d gets device perm[d]'s value


# -- axis_index / axis_size -------------------------------------------------------------

@SETTINGS
@given(counts)
def test_axis_index_and_size(count):
    n_platform, n = count
    index, size = run(lambda v: (lax.axis_index("i"), lax.axis_size("i")), np.zeros(n), n_devices=n_platform)
    np.testing.assert_array_equal(index, np.arange(n))
    np.testing.assert_array_equal(size, np.full(n, n))


def test_device_count_is_restored():
    assert simpmd.device_count() == DEFAULT_COUNT
