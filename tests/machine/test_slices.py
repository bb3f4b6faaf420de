"""TPU slices on the simulated platform, and hybrid meshes whose granules are slices
(issue 47, item 22). Expected layouts are worked by hand, and checked against real JAX's
``create_hybrid_device_mesh`` run on simpmd's devices (JAX's function reads only
``slice_index``, ``process_index``, ``platform`` and ``device_kind`` of what it is given)."""
import numpy as np
import pytest

import simpmd
from simpmd.mesh_utils import create_hybrid_device_mesh


def _ids(grid):
    return np.vectorize(lambda d: d.id)(grid).tolist()


def test_slices_number_devices_in_id_order_and_each_host_lies_in_one():
    p = simpmd.set_device_count(8, hardware="TPU v4", processes="hardware", slices=2)
    assert [d.slice_index for d in p.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert [d.process_index for d in p.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert p.slice_count == 2 and "2 slices" in repr(p)


def test_a_platform_without_slices_has_no_slice_index_as_jax_cpu_devices(jax8):
    assert not hasattr(simpmd.devices()[0], "slice_index")
    assert not hasattr(jax8.devices()[0], "slice_index")
    assert simpmd.platform().slice_count == 1
    from jax.experimental import mesh_utils
    with pytest.raises(ValueError, match="does not have attribute slice_index"):
        mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1), devices=jax8.devices())
    with pytest.raises(ValueError, match="does not have attribute slice_index"):
        create_hybrid_device_mesh((1, 4), (2, 1))


@pytest.mark.parametrize("slices, processes, words", [
    (3, None, "do not split evenly into 3 slices"), (4, 2, "a host belongs to one slice"),
    (0, None, "positive int"), (True, None, "positive int")])
def test_bad_slices_are_refused(slices, processes, words):
    with pytest.raises((ValueError, TypeError), match=words):
        simpmd.set_device_count(8, slices=slices, processes=processes)


@pytest.mark.parametrize("mesh_shape, dcn_mesh_shape, expected", [
    ((1, 4), (2, 1), [[0, 1, 2, 3], [4, 5, 6, 7]]),        # rows are the slices
    ((4, 1), (1, 2), [[0, 4], [1, 5], [2, 6], [3, 7]]),    # columns are the slices
    ((2, 2), (2, 1), [[0, 1], [2, 3], [4, 5], [6, 7]])])   # slice 1 below slice 0
def test_hybrid_mesh_of_two_slices(jax8, mesh_shape, dcn_mesh_shape, expected):
    simpmd.set_device_count(8, processes=2, slices=2)
    grid = create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape)
    assert _ids(grid) == expected
    from jax.experimental import mesh_utils
    theirs = mesh_utils.create_hybrid_device_mesh(mesh_shape, dcn_mesh_shape,
                                                  devices=simpmd.devices())
    assert _ids(theirs) == expected


def test_granules_keep_the_order_given_without_sorting(jax8):
    simpmd.set_device_count(8, slices=2)
    given = simpmd.devices()[4:] + simpmd.devices()[:4]       # slice 1 first
    from jax.experimental import mesh_utils
    for sort, first in ((True, 0), (False, 4)):
        ours = create_hybrid_device_mesh((1, 4), (2, 1), given, should_sort_granules_by_key=sort)
        theirs = mesh_utils.create_hybrid_device_mesh((1, 4), (2, 1), given,
                                                      should_sort_granules_by_key=sort)
        assert _ids(ours) == _ids(theirs) and _ids(ours)[0][0] == first


def test_the_wrong_number_of_slices_is_named():
    simpmd.set_device_count(8, slices=2)
    with pytest.raises(ValueError, match="Number of slices 2 must equal the product of"):
        create_hybrid_device_mesh((1, 2), (4, 1))
    with pytest.raises(ValueError, match="Number of devices 4 must equal the product"):
        create_hybrid_device_mesh((1, 8), (2, 1))


def test_which_mesh_axis_crosses_slices():
    simpmd.set_device_count(8, processes=2, slices=2)
    mesh = simpmd.Mesh(create_hybrid_device_mesh((1, 4), (2, 1)), ("data", "model"))
    slice_of = np.vectorize(lambda d: d.slice_index)(mesh.devices)
    assert (slice_of[0] == 0).all() and (slice_of[1] == 1).all()       # 'data' crosses DCN
    assert simpmd.viz.crossing_axes(mesh) == {"data": True, "model": False}
