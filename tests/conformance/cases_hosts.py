"""Many processes, after JAX's tests/multiprocess/multihost_utils_test.py (process_allgather,
broadcast_one_to_all, sync_global_devices, assert_equal, host-local arrays) and the
multi-process tests of tests/array_test.py (make_array_from_process_local_data,
make_array_from_callback, addressable shards) and of tests/pjit_test.py.

Each case is a ``main(jax)`` for 4 processes x 2 CPU devices, defined at the top level so
that the real JAX processes can import it by name; ``HOST_CASES`` holds what the test needs
to know of it (the JAX test it follows, whether JAX raises, the versions' differences, the
issue item while simpmd differs). test_conformance_hosts.py runs all of them in ONE launch
of 4 real JAX processes, and each on simpmd's simulated processes.
"""
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

MH = "multiprocess/multihost_utils_test.py::"
AR = "array_test.py::"


@dataclass(frozen=True)
class HostCase:
    main: Callable[[Any], Any]
    follows: str
    raises: bool = False
    versions: str = ""
    xfail: str = ""

    @property
    def name(self):
        return self.main.__name__


HOST_CASES = []


def case(follows, **kw):
    def register(main):
        HOST_CASES.append(HostCase(main, follows, **kw))
        return main
    return register


def _mesh(jax, kind="explicit", shape=(4, 2), names=("hosts", "chips")):
    t = jax.sharding.AxisType.Explicit if kind == "explicit" else jax.sharding.AxisType.Auto
    return jax.make_mesh(shape, names, axis_types=(t,) * len(shape))


def _mu(jax):
    return jax.experimental.multihost_utils


def _local_rows(jax, mesh, spec=("hosts",)):
    """Process p's rows 10p + [[0, 1], [2, 3]], placed as ``spec`` of a global array."""
    local = np.arange(4, dtype=np.float32).reshape(2, 2) + 10 * jax.process_index()
    return jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P(*spec)), local)


# -- what each process sees ---------------------------------------------------------------------

@case(MH + "test_process_index",
      versions="device ids are not compared: JAX's CPU devices in process p are numbered "
               "1024p + k, simpmd's (like a TPU slice's) 2p + k")
def process_view(jax):
    return (jax.process_index(), jax.process_count(), jax.device_count(), jax.local_device_count(),
            [d.process_index for d in jax.devices()],
            [d in jax.devices() for d in jax.local_devices()])


# -- process_allgather: test_process_allgather_* --------------------------------------------------

@case(MH + "test_gather_host_local_untiled")
def allgather_host_values(jax):
    return _mu(jax).process_allgather(np.array([jax.process_index(), 7], np.int32))


@case(MH + "test_gather_host_local_tiled")
def allgather_host_values_tiled(jax):
    return _mu(jax).process_allgather(np.arange(3.0) + jax.process_index(), tiled=True)


@case(MH + "test_gather_scalar")
def allgather_scalars(jax):
    return _mu(jax).process_allgather(np.float32(jax.process_index() * 1.5))


@case(MH + "test_gather_pytree")
def allgather_pytree(jax):
    p = jax.process_index()
    return _mu(jax).process_allgather({"a": np.ones(2) * p, "b": (np.int32(p), np.zeros((1, 2)) + p)})


@case(MH + "test_gather_bool")
def allgather_bools(jax):
    return _mu(jax).process_allgather(np.array([jax.process_index() % 2 == 0]))


@case(MH + "test_gather_global_array",
      versions="process_allgather of a global jax.Array gathers the whole array with "
               "tiled=True on every version checked")
def allgather_global_array_tiled(jax):
    return _mu(jax).process_allgather(_local_rows(jax, _mesh(jax)), tiled=True)


@case(MH + "test_gather_global_array_2d")
def allgather_global_array_split_both_axes(jax):
    return _mu(jax).process_allgather(_local_rows(jax, _mesh(jax), ("hosts", "chips")), tiled=True)


# -- broadcast_one_to_all: test_broadcast_one_to_all -----------------------------------------

@case(MH + "test_broadcast_one_to_all")
def broadcast_from_process_0(jax):
    return _mu(jax).broadcast_one_to_all(np.arange(4.0) * (jax.process_index() + 1))


@case(MH + "test_broadcast_one_to_all_is_source")
def broadcast_from_process_2(jax):
    p = jax.process_index()
    return _mu(jax).broadcast_one_to_all(np.full((2, 2), p, np.int32), is_source=p == 2)


@case(MH + "test_broadcast_one_to_all_pytree")
def broadcast_pytree(jax):
    p = jax.process_index()
    return _mu(jax).broadcast_one_to_all({"step": np.int32(100 + p), "w": np.ones(3) * p})


# -- barriers and checks: test_sync_global_devices, test_assert_equal -------------------------

@case(MH + "test_sync_global_devices")
def barrier_then_value(jax):
    _mu(jax).sync_global_devices("conformance barrier")
    return jax.process_index()


@case(MH + "test_assert_equal")
def assert_equal_on_equal_values(jax):
    _mu(jax).assert_equal(np.arange(3), "the same on every process")
    return "equal"


@case(MH + "test_assert_equal_fails", raises=True,
      versions="whether assert_equal compares every process's value or process 0's differs "
               "between releases; each process raises on the versions checked")
def assert_equal_on_different_values(jax):
    _mu(jax).assert_equal(np.arange(3) + jax.process_index(), "differs on each process")
    return "equal"


# -- host-local arrays: test_host_local_array_to_global_array --------------------------------

@case(MH + "test_host_local_array_to_global_array")
def host_local_to_global(jax):
    mesh = _mesh(jax, "auto")
    local = np.arange(4.0).reshape(2, 2) + 10 * jax.process_index()
    return _mu(jax).host_local_array_to_global_array(local, mesh, jax.P("hosts"))


@case(MH + "test_global_array_to_host_local_array")
def global_to_host_local(jax):
    x = _local_rows(jax, _mesh(jax, "auto"))
    return _mu(jax).global_array_to_host_local_array(x, x.sharding.mesh, jax.P("hosts"))


@case(MH + "test_host_local_array_to_global_array")
def host_local_tree_to_global_and_back(jax):
    """A pytree under a prefix of specs: rows over hosts and chips, and a replicated one."""
    mesh = _mesh(jax, "auto")
    local = (np.arange(8.0, dtype=np.float32).reshape(4, 2) + 10 * jax.process_index(),
             np.arange(3.0, dtype=np.float32))
    specs = (jax.P(("hosts", "chips")), jax.P())
    mu = _mu(jax)
    x = mu.host_local_array_to_global_array(local, mesh, specs)
    return x, mu.global_array_to_host_local_array(x, mesh, specs)


# -- global arrays from local data: array_test.py's multi-process tests --------------------------

@case(AR + "test_make_array_from_process_local_data")
def local_data_split_over_hosts(jax):
    return _local_rows(jax, _mesh(jax))


@case(AR + "test_make_array_from_process_local_data")
def local_data_split_over_hosts_and_chips(jax):
    return _local_rows(jax, _mesh(jax), ("hosts", "chips"))


@case(AR + "test_make_array_from_process_local_data_global_shape")
def local_data_with_global_shape(jax):
    mesh = _mesh(jax)
    local = np.ones((3, 2), np.float32) * jax.process_index()
    return jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("hosts")), local, (12, 2))


@case(AR + "test_make_array_from_callback")
def array_from_callback(jax):
    whole = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    return jax.make_array_from_callback((8, 4), jax.NamedSharding(_mesh(jax), jax.P("hosts", "chips")),
                                        lambda index: whole[index])


@case(AR + "test_make_array_from_callback_replicated")
def array_from_callback_replicated_over_chips(jax):
    whole = np.arange(8.0, dtype=np.float32)
    return jax.make_array_from_callback((8,), jax.NamedSharding(_mesh(jax), jax.P("hosts")),
                                        lambda index: whole[index])


@case(AR + "test_non_addressable_read", raises=True)
def reading_a_global_array_is_refused(jax):
    return np.asarray(_local_rows(jax, _mesh(jax)))


# -- programs across processes: pjit_test.py's multi-process cases ------------------------------

@case("pjit_test.py::PJitTest::testMultiProcessExplicit")
def jit_sum_explicit(jax):
    x = _local_rows(jax, _mesh(jax))
    return jax.jit(lambda v: (v * 2).sum(axis=1))(x)


@case("pjit_test.py::PJitTest::testMultiProcessExplicit")
def jit_max_explicit(jax):
    x = _local_rows(jax, _mesh(jax))
    return float(np.asarray(_mu(jax).process_allgather(jax.jit(lambda v: v.max())(x), tiled=True)))


@case("pjit_test.py::PJitTest::testMultiProcessAuto")
def jit_max_auto(jax):
    mesh = _mesh(jax, "auto", (2, 4), ("hosts", "local"))
    x = jax.make_array_from_callback((4, 4), jax.NamedSharding(mesh, jax.P("local")),
                                     lambda index: np.arange(16.0).reshape(4, 4)[index])
    return float(np.asarray(jax.jit(lambda v: v.max())(x)))


@case("pjit_test.py::PJitTest::testMultiProcessOutShardings")
def jit_out_shardings_replicated_auto(jax):
    mesh = _mesh(jax, "auto")
    x = _local_rows(jax, mesh)
    y = jax.jit(lambda v: v + 1, out_shardings=jax.NamedSharding(mesh, jax.P()))(x)
    return y


@case("shard_map_test.py::test_multiprocess_psum")
def shard_map_psum_across_hosts_explicit(jax):
    mesh = _mesh(jax)
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "hosts"), mesh=mesh,
                              in_specs=jax.P("hosts"), out_specs=jax.P()))
    return f(_local_rows(jax, mesh))


@case("shard_map_test.py::test_multiprocess_ppermute")
def shard_map_ppermute_across_hosts_explicit(jax):
    mesh = _mesh(jax)
    perm = [(i, (i + 1) % 4) for i in range(4)]
    f = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "hosts", perm), mesh=mesh,
                              in_specs=jax.P("hosts"), out_specs=jax.P("hosts")))
    return f(_local_rows(jax, mesh))


@case("shard_map_test.py::test_multiprocess_auto")
def shard_map_psum_auto_mesh(jax):
    mesh = _mesh(jax, "auto")
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "chips"), mesh=mesh,
                              in_specs=jax.P("hosts", "chips"), out_specs=jax.P("hosts")))
    return f(_local_rows(jax, mesh, ("hosts", "chips")))


@case("shard_map_test.py::test_multiprocess_all_gather")
def shard_map_all_gather_within_host(jax):
    mesh = _mesh(jax)
    f = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "chips", tiled=True), mesh=mesh,
                              in_specs=jax.P("hosts", "chips"), out_specs=jax.P("hosts", "chips")))
    return f(_local_rows(jax, mesh, ("hosts", "chips")))
