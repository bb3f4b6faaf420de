"""Many hosts: simulated processes (simpmd.run_processes) against hand-worked cases, and
against real multi-process JAX (4 processes x 2 CPU devices on this machine)."""
import os
import socket
import time

import numpy as np
import pytest

import simpmd
from simpmd import P
from simpmd.core.errors import DeadlockError
from simpmd.hosts import ProcessError, hosts_table
from simpmd.mesh_utils import create_hybrid_device_mesh

import hosts_programs


def _mesh(jax):
    return jax.make_mesh((4, 2), ("hosts", "chips"))


# -- the platform's processes ----------------------------------------------------------------

def test_default_platform_is_one_process():
    assert simpmd.process_count() == 1 and simpmd.process_index() == 0
    assert simpmd.local_devices() == simpmd.devices()


@pytest.mark.parametrize("count, hardware, processes, per_host", [
    (16, "TPU v4", "hardware", 4), (16, "TPU v5e", "hardware", 8), (16, "H100", "hardware", 8),
    (8, "TPU v4", 4, 2), (8, "TPU v4", None, 8), (4, "H100", "hardware", 4)])
def test_processes_of_a_platform(count, hardware, processes, per_host):
    p = simpmd.set_device_count(count, hardware=hardware, processes=processes)
    assert p.process_count == count // per_host
    assert [d.process_index for d in p.devices] == [i // per_host for i in range(count)]
    assert simpmd.process_count() == count // per_host


@pytest.mark.parametrize("processes, words", [(3, "do not split evenly"), (0, "1 to 8"),
                                              ("x", "must be None")])
def test_bad_processes_are_refused(processes, words):
    with pytest.raises((ValueError, TypeError), match=words):
        simpmd.set_device_count(8, processes=processes)


def test_hardware_without_a_host_size_is_refused():
    with pytest.raises(ValueError, match="no host size"):
        simpmd.set_device_count(8, hardware="TPU v3", processes="hardware")


# -- what each process sees -----------------------------------------------------------------------

def test_each_process_sees_its_index_and_devices():
    def main(jax):
        return jax.process_index(), jax.process_count(), [d.id for d in jax.local_devices()], \
            jax.local_device_count(), jax.device_count()
    run = simpmd.run_processes(main, 4, show=False)
    assert run.results == [(p, 4, [2 * p, 2 * p + 1], 2, 8) for p in range(4)]
    assert simpmd.process_index() == 0 and len(simpmd.local_devices()) == 8   # from above


@pytest.mark.parametrize("spec, local_shape, global_shape", [
    (P("hosts"), (3,), (12,)), (P(None, "hosts"), (2, 4), (2, 16)),
    (P("hosts", "chips"), (2, 4), (8, 4)), (P("chips"), (4,), (4,)), (P(), (2, 3), (2, 3)),
    (P(("hosts", "chips")), (2,), (8,))])
def test_global_shape_from_local_data(spec, local_shape, global_shape):
    """Hand-worked: a dim split over 'hosts' (one part per process) grows 4 times; one
    split only over 'chips' (within each process) or whole stays as given."""
    def main(jax):
        x = jax.make_array_from_process_local_data(jax.NamedSharding(_mesh(jax), spec),
                                                   np.zeros(local_shape, np.float32))
        return x.shape, x.is_fully_addressable
    run = simpmd.run_processes(main, 4, show=False)
    assert run.results == [(global_shape, False)] * 4


def test_local_data_lands_on_the_right_devices():
    """Process p passes rows [10p, 10p + 1]; split over 'hosts' they are global rows 2p and
    2p + 1, whole on both of its devices; split over ('hosts', 'chips'), one row each."""
    def main(jax):
        mesh = _mesh(jax)
        rows = np.array([10.0, 11.0]) + 10 * jax.process_index()
        a = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, P("hosts")), rows)
        b = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, P(("hosts", "chips"))), rows)
        return ([(s.device.id, s.index[0].start, s.data.tolist()) for s in a.addressable_shards],
                [(s.device.id, s.index[0].start, s.data.tolist()) for s in b.addressable_shards])
    run = simpmd.run_processes(main, 4, show=False)
    for p, (a, b) in enumerate(run.results):
        rows = [10.0 * p + 10, 10.0 * p + 11]
        assert a == [(2 * p, 2 * p, rows), (2 * p + 1, 2 * p, rows)]
        assert b == [(2 * p, 2 * p, rows[:1]), (2 * p + 1, 2 * p + 1, rows[1:])]


def test_local_data_of_the_wrong_size_is_refused_in_jax_words():
    def main(jax):
        jax.make_array_from_process_local_data(jax.NamedSharding(_mesh(jax), P("hosts")),
                                               np.zeros(3), (8,))
    with pytest.raises(ProcessError, match="Invalid host data.*process data has 3 elements"):
        simpmd.run_processes(main, 4, show=False)


def test_outside_processes_it_is_device_put():
    mesh = simpmd.make_mesh((8,), ("x",))
    x = simpmd.make_array_from_process_local_data(simpmd.NamedSharding(mesh, P("x")), np.arange(8.0))
    assert np.array_equal(np.asarray(x), np.arange(8.0))
    with pytest.raises(ValueError, match="global_shape should be None"):
        simpmd.make_array_from_process_local_data(simpmd.NamedSharding(mesh, P("x")),
                                                  np.arange(8.0), (16,))


def test_a_process_reads_only_what_it_holds():
    def main(jax):
        mesh = _mesh(jax)
        x = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, P("hosts")),
                                                   np.ones(2, np.float32) * jax.process_index())
        total = jax.jit(lambda v: v.sum())(x)
        try:
            np.asarray(x)
            read = "read"
        except RuntimeError as exc:
            read = str(exc)
        return read, float(total), repr(x)
    run = simpmd.run_processes(main, 4, show=False)
    for read, total, text in run.results:
        assert read.startswith("Fetching value for `jax.Array` that spans non-addressable")
        assert total == 2 * (0 + 1 + 2 + 3)
        assert text == "Array(shape=(8,), dtype=float32)"


def test_allgather_stacks_host_values_and_gathers_global_arrays():
    mu = simpmd.multihost_utils

    def main(jax):
        x = jax.make_array_from_process_local_data(jax.NamedSharding(_mesh(jax), P("hosts")),
                                                   np.array([1.0, 2.0]) + 2 * jax.process_index())
        mine = np.array([jax.process_index(), 5])
        return (mu.process_allgather(mine), mu.process_allgather(mine, tiled=True),
                mu.process_allgather(x, tiled=True), mu.process_allgather(jax.process_index()))
    run = simpmd.run_processes(main, 4, show=False)
    for stacked, tiled, whole, scalars in run.results:
        assert stacked.tolist() == [[p, 5] for p in range(4)]
        assert tiled.tolist() == [v for p in range(4) for v in (p, 5)]
        assert whole.tolist() == [float(v) for v in range(1, 9)]
        assert scalars.tolist() == [0, 1, 2, 3]


def test_barrier_names_must_agree():
    def main(jax):
        jax.experimental.multihost_utils.sync_global_devices(f"n{jax.process_index() % 2}")
    with pytest.raises(ProcessError, match="sync_global_devices name mismatch"):
        simpmd.run_processes(main, 4, show=False)


def test_what_each_process_prints_is_kept_apart(capsys):
    def main(jax):
        print("I am process", jax.process_index())
    run = simpmd.run_processes(main, 2)
    assert run.printed == ["I am process 0\n", "I am process 1\n"]
    out = capsys.readouterr().out
    assert "process 0 (devices 0-3):\n    I am process 0" in out
    assert "process 1 (devices 4-7):\n    I am process 1" in out


def test_pmap_inside_a_process_is_refused():
    def main(jax):
        jax.pmap(lambda v: v)(np.arange(8.0))
    with pytest.raises(ProcessError, match="not simulated"):
        simpmd.run_processes(main, 2, show=False)


# -- deadlocks across processes ---------------------------------------------------------------------

def test_a_skipped_collective_is_a_deadlock_named_within_5_seconds():
    begun = time.monotonic()
    with pytest.raises(DeadlockError) as caught:
        simpmd.run_processes(hosts_programs.deadlock_skipped_psum, 4, show=False)
    took = time.monotonic() - begun
    text = str(caught.value)
    assert "processes 1-3 (devices 2-7) wait in jit(<lambda>)" in text
    assert "psum over 'hosts' (2 groups of 4 devices, each across 4 processes)" in text
    assert "process 0 (devices 0-1) finished main" in text
    assert took < 5.0, f"the deadlock took {took:.1f} s to name"


def test_collectives_in_a_different_order_are_a_deadlock():
    def main(jax):
        mesh = _mesh(jax)
        x = jax.make_array_from_process_local_data(jax.NamedSharding(mesh, P("hosts")), np.ones(2))
        total = jax.jit(jax.shard_map(lambda v: jax.lax.psum(v, "hosts"), mesh=mesh,
                                      in_specs=P("hosts"), out_specs=P()))
        gather = jax.jit(jax.shard_map(lambda v: jax.lax.all_gather(v, "hosts", tiled=True),
                                       mesh=mesh, in_specs=P("hosts"), out_specs=P("hosts")))
        if jax.process_index() == 2:
            return gather(x), total(x)
        return total(x), gather(x)
    with pytest.raises(DeadlockError) as caught:
        simpmd.run_processes(main, 4, show=False)
    text = str(caught.value)
    assert "processes 0-1, 3 (devices 0-3, 6-7) called jit(<lambda>)" in text
    assert "process 2 (devices 4-5) called jit(<lambda>)" in text
    assert "all_gather over 'hosts'" in text and "psum over 'hosts'" in text


def test_skipping_a_computation_that_stays_within_hosts_is_no_deadlock():
    run = simpmd.run_processes(hosts_programs.skip_within_host, 4, show=False)
    assert run.results[0] is None
    # process p's rows [10p, 10p + 1] and [10p + 2, 10p + 3], one per device, summed
    assert [np.asarray(r.addressable_shards[0].data).tolist() for r in run.results[1:]] == \
        [[[20.0 * p + 2, 20.0 * p + 4]] for p in (1, 2, 3)]


def test_a_process_that_raises_is_named():
    def main(jax):
        if jax.process_index() == 3:
            raise KeyError("batch")
        return 1
    with pytest.raises(ProcessError, match=r"process 3 \(devices 6-7\) raised KeyError"):
        simpmd.run_processes(main, 4, show=False)


# -- which collectives cross hosts, and the hybrid mesh --------------------------------------------

def test_hosts_table_says_which_collectives_cross_hosts():
    simpmd.set_device_count(8, processes=4)
    mesh = simpmd.make_mesh((4, 2), ("hosts", "chips"))
    f = simpmd.shard_map(lambda v: simpmd.lax.psum(simpmd.lax.psum(v, "chips"), "hosts"),
                         mesh=mesh, in_specs=P("hosts", "chips"), out_specs=P())
    f(np.ones((4, 2)))
    rows = hosts_table(f.trace).splitlines()[2:]
    assert rows[0].split()[:2] == ["psum", "chips"] and rows[0].endswith("no")
    assert rows[1].split()[:2] == ["psum", "hosts"] and rows[1].endswith("yes")


def test_hybrid_mesh_puts_the_slow_axis_across_processes():
    simpmd.set_device_count(8, processes=4)
    grid = create_hybrid_device_mesh((1, 2), (4, 1), process_is_granule=True)
    assert [[d.id for d in row] for row in grid] == [[0, 1], [2, 3], [4, 5], [6, 7]]
    grid = create_hybrid_device_mesh((2, 1), (1, 4), process_is_granule=True)
    assert [[d.id for d in row] for row in grid] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    with pytest.raises(ValueError, match="does not have attribute slice_index"):
        create_hybrid_device_mesh((1, 2), (4, 1))       # no slices, as JAX CPU devices


# -- against real JAX processes ---------------------------------------------------------------------

def test_worker_environment_sets_its_own_device_count(monkeypatch):
    from simpmd.jax.multiprocess import worker_environment
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_dump_to=/tmp/x")
    env = worker_environment(2)
    assert env["XLA_FLAGS"].split() == ["--xla_dump_to=/tmp/x",
                                        "--xla_force_host_platform_device_count=2"]
    assert env["JAX_NUM_CPU_DEVICES"] == "2" and env["JAX_PLATFORMS"] == "cpu"


def test_a_taken_port_is_named():
    from simpmd.jax.multiprocess import MultiProcessError, run_on_jax
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(MultiProcessError, match=f"port {s.getsockname()[1]} on localhost is taken"):
            run_on_jax([hosts_programs.host_local_rows], port=s.getsockname()[1])


def _gone(pid) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_every_process_view_agrees_with_real_jax_processes(jax8):
    """4 real JAX processes x 2 CPU devices, every program of hosts_programs (collectives
    within and across hosts, host-local data, a hybrid mesh, allgather, barriers) and a
    deadlock last, in one launch; every process's view compared; none left behind."""
    from simpmd.jax.multiprocess import crosscheck_processes
    programs = hosts_programs.PROGRAMS + [hosts_programs.deadlock_skipped_psum]
    report = crosscheck_processes(programs, 4, 2, hang_timeout=3)
    print(f"{len(programs)} programs on 4 JAX processes: {report.seconds:.1f} s")
    report.assert_match()
    assert len(report.rows) >= 10 and report.rows[-1][3] == "both hang"
    assert all(_gone(pid) for pid in report.real.pids)


def test_a_process_that_dies_is_reported_and_the_others_stopped(jax8):
    from simpmd.jax.multiprocess import MultiProcessError, run_on_jax
    launch_pids = []
    with pytest.raises(MultiProcessError, match="JAX process 1 of 2 stopped with exit code 3") as caught:
        try:
            run_on_jax([hosts_programs.dies_in_process_1], 2, 2, timeout=60)
        except MultiProcessError as exc:
            launch_pids.extend(exc.pids)
            raise
    assert "process 0" in str(caught.value)
    assert launch_pids and all(_gone(pid) for pid in launch_pids)


def test_collectives_across_hosts_cost_the_network_between_nodes():
    """On 2 DGX H100 nodes (2 processes of 8), a psum over the axis that spans the hosts
    is costed on InfiniBand (simpmd.cost's cluster), one over the axis inside them on
    NVLink; each equals simpmd.cost.estimate of its group."""
    from simpmd.cost import estimate, estimate_trace
    simpmd.set_device_count(16, hardware="H100", processes="hardware")
    grid = create_hybrid_device_mesh((1, 8), (2, 1), process_is_granule=True)
    mesh = simpmd.Mesh(grid, ("data", "model"))
    lax = simpmd.lax
    f = simpmd.shard_map(lambda v: lax.psum(lax.psum(v, "model"), "data"), mesh=mesh,
                         in_specs=P("data", "model"), out_specs=P())
    f(simpmd.ShapeDtypeStruct((2 * 1024, 8 * 1024), np.float32))
    calls = {c.axes: c for c in estimate_trace(f.trace).calls}      # ('model',), ('data',)
    nbytes = 1024 * 1024 * 4                                         # each device's block
    inside = estimate("psum", nbytes, hardware="H100", devices=list(range(8))).time_s
    across = estimate("psum", nbytes, hardware="H100", devices=[0, 8]).time_s
    assert calls[("model",)].time_s == pytest.approx(inside)
    assert calls[("data",)].time_s == pytest.approx(across)
    assert across > inside


def test_the_drawing_frames_each_host_and_says_which_axes_cross():
    pytest.importorskip("matplotlib")
    from simpmd.viz import crossing_axes, draw_hosts, tagged
    simpmd.set_device_count(8, processes=4)
    mesh = simpmd.make_mesh((4, 2), ("hosts", "chips"))
    assert crossing_axes(mesh) == {"hosts": True, "chips": False}
    fig = draw_hosts(mesh, "hosts")
    frames = [a.get_gid() for a in tagged(fig, "host")]
    assert sorted(frames) == [f"simpmd:host:{p}" for p in range(4)]
    assert "crosses hosts" in fig.axes[0].texts[-1].get_text() or any(
        "crosses hosts" in t.get_text() for t in fig.axes[0].texts)


def test_the_mesh_indices_stay_clear_of_the_host_frames():
    """Lesson 16's pictures: the row indices sit left of every dashed host frame and the
    column indices above it, not under its border (issue 47, item 19)."""
    pytest.importorskip("matplotlib")
    from simpmd.viz import draw_hosts, tagged
    simpmd.set_device_count(8, processes=4)
    for shape, names in (((4, 2), ("hosts", "chips")), ((2, 4), ("data", "model"))):
        fig = draw_hosts(simpmd.make_mesh(shape, names), names[0])
        renderer = fig.canvas.get_renderer()
        frames = [f.get_window_extent(renderer) for f in tagged(fig, "host")]
        rows, columns = tagged(fig, "row-index"), tagged(fig, "column-index")
        assert len(rows) == shape[0] and len(columns) == shape[1]
        left, top = min(f.x0 for f in frames), max(f.y1 for f in frames)
        assert all(t.get_window_extent(renderer).x1 < left for t in rows)
        assert all(t.get_window_extent(renderer).y0 > top for t in columns)
