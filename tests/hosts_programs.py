"""Programs for simulated and real processes (tests/hosts/test_hosts.py runs them on both).

Each is a ``main(jax)`` for 4 processes x 2 devices, written against JAX's names: simpmd
runs it with ``simpmd`` as ``jax``, the real processes with ``jax`` itself. Each returns
what its process sees (arrays are compared shard by shard) and prints what it may print.
"""
import numpy as np


def _mesh(jax, axes=("hosts", "chips")):
    explicit = (jax.sharding.AxisType.Explicit,) * 2
    return jax.make_mesh((4, 2), axes, axis_types=explicit)


def _rows(jax, mesh, spec="hosts", width=2):
    """Each process loads its own rows: process p holds 2 rows starting at 2p."""
    p = jax.process_index()
    local = np.arange(2 * width, dtype=np.float32).reshape(2, width) + 10 * p
    return jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P(spec)), local)


def host_local_rows(jax):
    """make_array_from_process_local_data: the global shape, and each device's block."""
    x = _rows(jax, _mesh(jax))
    print("global", x.shape, "addressable", x.is_fully_addressable,
          "local blocks", [s.data.shape for s in x.addressable_shards])
    return x


def whole_dim_and_global_shape(jax):
    """Local data that is whole along an axis split within the host, and a given global shape."""
    mesh = _mesh(jax)
    p = jax.process_index()
    a = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P(None, "chips")),
                                               np.arange(8.0).reshape(2, 4) + p)
    b = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("hosts", "chips")),
                                               np.ones((3, 4)) * p, (12, 4))
    return a, b


def psum_across_hosts(jax):
    mesh = _mesh(jax)
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "hosts"), mesh=mesh,
                              in_specs=jax.P("hosts"), out_specs=jax.P()))
    return f(_rows(jax, mesh))


def psum_within_host(jax):
    mesh = _mesh(jax)
    x = _rows(jax, mesh, spec=("hosts", "chips"))
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "chips"), mesh=mesh,
                              in_specs=jax.P(("hosts", "chips")), out_specs=jax.P("hosts")))
    return f(x)


def all_gather_across_hosts(jax):
    mesh = _mesh(jax)
    f = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "hosts", tiled=True), mesh=mesh,
                              in_specs=jax.P("hosts"), out_specs=jax.P("hosts")))
    y = f(_rows(jax, mesh))
    print("shape", y.shape, "this process's first block", y.addressable_shards[0].data[:, 0].tolist())
    return y


def ring_across_hosts(jax):
    mesh = _mesh(jax)
    perm = [(i, (i + 1) % 4) for i in range(4)]
    f = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "hosts", perm), mesh=mesh,
                              in_specs=jax.P("hosts"), out_specs=jax.P("hosts")))
    return f(_rows(jax, mesh))


def jit_reduction(jax):
    """jit on Explicit shardings: the sum of a global array, which every process can read."""
    mesh = _mesh(jax)
    total = jax.jit(lambda v: (v * v).sum())(_rows(jax, mesh))
    print("total", float(total), "fully addressable", total.is_fully_addressable)
    return total


def jit_max_on_auto_axes(jax):
    """Issue 45 item 1: jit of a max over an array split on Auto axes across processes:
    every process gets the global max (simpmd once gave each process its own blocks')."""
    auto = (jax.sharding.AxisType.Auto,) * 2
    mesh = jax.make_mesh((2, 4), ("hosts", "local"), axis_types=auto)
    x = jax.make_array_from_callback((4, 4), jax.NamedSharding(mesh, jax.P("local")),
                                     lambda idx: np.arange(16.0, dtype=np.float32).reshape(4, 4)[idx])
    return float(np.asarray(jax.jit(lambda v: v.max())(x)))


def hybrid_matmul(jax):
    """A hybrid mesh: 'data' across hosts, 'model' within; y = x @ w under jit."""
    grid = jax.experimental.mesh_utils.create_hybrid_device_mesh(
        (1, 2), (4, 1), devices=jax.devices(), process_is_granule=True)
    mesh = jax.sharding.Mesh(grid, ("data", "model"),
                             axis_types=(jax.sharding.AxisType.Explicit,) * 2)
    p = jax.process_index()
    x = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("data")),
                                               np.arange(6.0).reshape(2, 3) + p)
    w = jax.device_put((np.arange(12.0).reshape(3, 4) / 10).astype(np.float32),
                       jax.NamedSharding(mesh, jax.P(None, "model")))
    y = jax.jit(lambda a, b: a @ b)(x, w)
    print("y", jax.typeof(y))
    return y


def device_put_of_float64(jax):
    """JAX checks that every process passes device_put the same value by comparing what it
    gathered (float32) with the float64 given: 0.1 fails, though all processes agree."""
    mesh = _mesh(jax)
    jax.device_put(np.full(4, 0.5), jax.NamedSharding(mesh, jax.P()))      # exact in float32
    return jax.device_put(np.full(4, 0.1), jax.NamedSharding(mesh, jax.P()))


def gather_to_host(jax):
    """process_allgather: a global array whole (tiled), host-local values stacked."""
    mesh = _mesh(jax)
    x = _rows(jax, mesh)
    mu = jax.experimental.multihost_utils
    whole = mu.process_allgather(x, tiled=True)
    try:
        mu.process_allgather(x)
        refused = "no"
    except ValueError:
        refused = "ValueError"
    mine = np.array([jax.process_index(), 7])
    return whole, mu.process_allgather(mine), mu.process_allgather(mine, tiled=True), refused


def what_a_process_can_read(jax):
    mesh = _mesh(jax)
    x = _rows(jax, mesh)
    try:
        np.asarray(x)
        read = "read"
    except RuntimeError:
        read = "RuntimeError"
    print("asarray of a split global array:", read)
    print("its shards here:", [s.index for s in x.addressable_shards])
    return read


def printing_arrays(jax):
    """What print shows of a global array: values when the process holds them all."""
    mesh = _mesh(jax)
    x = _rows(jax, mesh)
    total = jax.jit(lambda v: v.sum(0))(x)
    print(repr(total), str(total), repr(x))
    try:
        print(str(x))
    except RuntimeError:
        print("str: RuntimeError")
    print(repr(jax.jit(lambda v: v * 2)(np.arange(3.0, dtype=np.float32))))
    return total


def skip_within_host(jax):
    """A computation whose collectives stay within each host: process 0 may skip it."""
    mesh = _mesh(jax)
    x = _rows(jax, mesh, spec=("hosts", "chips"))
    f = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "chips"), mesh=mesh,
                              in_specs=jax.P(("hosts", "chips")), out_specs=jax.P("hosts")))
    if jax.process_index() == 0:
        return None
    return f(x)


def numpy_differs_per_process(jax):
    """A NumPy argument that differs between processes: each device uses its own process's."""
    mesh = _mesh(jax)
    bias = np.full((2,), 100.0 * jax.process_index(), np.float32)
    return jax.jit(lambda v, b: v + b)(_rows(jax, mesh), bias)


def local_computation(jax):
    """jit of NumPy values alone runs on this process's first device, without the others."""
    return jax.jit(lambda v: v * 2)(np.arange(3.0) + jax.process_index())


def barrier_and_operation(jax):
    mesh = _mesh(jax)
    x = _rows(jax, mesh)
    jax.experimental.multihost_utils.sync_global_devices("before")
    return x * 2 + 1


def barrier_names_differ(jax):
    """sync_global_devices with a name that differs on odd processes."""
    name = "step" if jax.process_index() % 2 == 0 else "other"
    try:
        jax.experimental.multihost_utils.sync_global_devices(name)
        return "passed"
    except AssertionError:
        return "AssertionError"


def train_step_data_parallel(jax):
    """One step of linear regression, the batch split across hosts."""
    mesh = _mesh(jax, ("batch", "chips"))
    p = jax.process_index()
    rng = np.random.default_rng(p)
    xs = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("batch")),
                                                rng.normal(size=(4, 3)).astype(np.float32))
    ys = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, jax.P("batch")),
                                                rng.normal(size=(4,)).astype(np.float32))
    w = jax.device_put(np.zeros(3, np.float32), jax.NamedSharding(mesh, jax.P()))

    def loss(w, x, y):
        r = x @ w - y
        return (r * r).mean()

    step = jax.jit(lambda w, x, y: w - 0.1 * jax.grad(loss)(w, x, y))
    return step(w, xs, ys)


PROGRAMS = [host_local_rows, whole_dim_and_global_shape, psum_across_hosts, psum_within_host,
            all_gather_across_hosts, ring_across_hosts, jit_reduction, jit_max_on_auto_axes,
            hybrid_matmul,
            device_put_of_float64, gather_to_host, what_a_process_can_read, printing_arrays, skip_within_host,
            numpy_differs_per_process,
            local_computation, barrier_and_operation, barrier_names_differ,
            train_step_data_parallel]


def deadlock_skipped_psum(jax):
    """Process 0 skips a collective across hosts: the others wait for ever (JAX hangs)."""
    mesh = _mesh(jax)
    x = _rows(jax, mesh)
    total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "hosts"), mesh=mesh,
                                  in_specs=jax.P("hosts"), out_specs=jax.P()))
    if jax.process_index() == 0:
        return None
    return total(x)


def dies_in_process_1(jax):
    """Not a lesson: a process that ends abruptly, for the launcher's error."""
    import os
    if jax.process_index() == 1:
        os._exit(3)
    return 0
