"""Collectives across nodes (simpmd.cost.Cluster; network.cluster_estimate): hand-worked
formulas on a small cluster, published multi-node nccl-tests runs, and the groups a mesh
makes."""
import math

import numpy as np
import pytest

import simpmd
from simpmd import cost as C, lax


def small_cluster():
    """2 nodes x 2 devices: 100 GB/s ports and 1 us hops inside, 10 GB/s and 5 us between."""
    node = C.FullyConnected(2, link_bandwidth=100e9, hop_latency=1e-6)
    return C.Cluster(node, 2, scale_out_bandwidth=10e9, scale_out_latency=5e-6)


def test_hierarchical_all_reduce_by_hand():
    n = 2**24
    e = C.estimate("psum", n, 4, topology=small_cluster(), algorithm="hierarchical")
    # reduce-scatter in the node (1 step, half the buffer), all-reduce of the half across the
    # 2 nodes (a ring of 2: 2 steps of a quarter), all-gather in the node (1 step, a half)
    by_hand = (1e-6 + n / 2 / 100e9) + 2 * (5e-6 + n / 4 / 10e9) + (1e-6 + n / 2 / 100e9)
    assert e.time_s == pytest.approx(by_hand)
    assert e.algorithm == "hierarchical" and e.group_size == 4


def test_flat_ring_by_hand():
    n = 2**24
    e = C.estimate("psum", n, 4, topology=small_cluster(), algorithm="ring")
    # 2(p-1) = 6 steps of n/4, each at min(port 100 GB/s, 2 NICs x 10 GB/s), each waiting 5 us
    assert e.time_s == pytest.approx(6 * (5e-6 + n / 4 / 20e9))
    fastest = C.estimate("psum", n, 4, topology=small_cluster())
    assert fastest.time_s == min(e.time_s, C.estimate(
        "psum", n, 4, topology=small_cluster(), algorithm="hierarchical").time_s)


def test_gather_scatter_and_all_to_all_by_hand():
    n = 2**20
    ag = C.estimate("all_gather", n, 4, topology=small_cluster(), algorithm="hierarchical")
    # across the nodes first (1 step of n), then inside each node with the 2n gathered
    assert ag.time_s == pytest.approx((5e-6 + n / 10e9) + (1e-6 + 2 * n / 100e9))
    rs = C.estimate("reduce_scatter", n, 4, topology=small_cluster(), algorithm="hierarchical")
    assert rs.time_s == pytest.approx((1e-6 + n / 2 / 100e9) + (5e-6 + n / 4 / 10e9))
    a2a = C.estimate("all_to_all", n, 4, topology=small_cluster())
    # regroup inside the node by destination rank, then exchange with the other node
    assert a2a.time_s == pytest.approx((1e-6 + n / 2 / 100e9) + (5e-6 + n / 2 / 10e9))


def test_permute_across_nodes_uses_the_network():
    n = 2**20
    e = C.estimate("ppermute", n, 4, topology=small_cluster(), perm=[(0, 2), (2, 0)])
    assert e.time_s == pytest.approx(5e-6 + n / 10e9)
    inside = C.estimate("ppermute", n, 4, topology=small_cluster(), perm=[(0, 1), (1, 0)])
    assert inside.time_s == pytest.approx(1e-6 + n / 100e9)


def test_one_gpu_per_node_gets_its_own_nic():
    """Data parallelism across 8 DGX H100 nodes, one GPU of each: every byte crosses
    InfiniBand at 50 GB/s (one 400 Gb/s NIC per GPU, the DGX H100 datasheet)."""
    n = 2**30
    e = C.estimate("psum", n, devices=range(0, 64, 8), hardware="H100")
    ring = 2 * 7 * (6.6e-6 + n / 8 / 50e9)
    assert e.time_s == pytest.approx(ring)
    assert e.busbw == pytest.approx(2 * 7 / 8 * n / ring)


def test_a_group_inside_one_node_is_unchanged():
    e = C.estimate("psum", 2**26, devices=range(8, 16), hardware="H100", topology=64)
    assert e.time_s == C.estimate("psum", 2**26, 8, hardware="H100").time_s


# Published: nccl-tests 2.17.9 with NCCL 2.24.3 on 4 nodes x 8 H100 80GB HBM3, InfiniBand
# "3.2 Tbps" per node (8 x 400 Gb/s), in-place time in us (Voltage Park and Georgia Tech,
# github.com/ZiyanIshani/vpbenchmarking, results/nccl/nccl_multinode/
# nccl_allreduce_20260224_225706.txt and nccl_allgather_20260224_225706.txt). No parameter
# of the presets was chosen from these runs.
MULTINODE_H100 = {
    "psum": {2**20: 92.01, 2**24: 270.22, 2**27: 932.64, 2**30: 6427.04, 2**33: 50415.3},
    "all_gather": {2**20: 109.01, 2**24: 235.19, 2**27: 745.11, 2**30: 3229.61, 2**33: 25438.7},
}


def test_multinode_h100_against_nccl_tests():
    ratios = {}
    for op, rows in MULTINODE_H100.items():
        for size, measured_us in rows.items():
            per_device = size if op == "psum" else size // 32    # nccl-tests' S
            model = C.estimate(op, per_device, 32, hardware="H100").time_s
            ratios[op, size] = model / (measured_us * 1e-6)
    # from 128 MiB the network's bandwidth dominates: within 0.67-1.5 of each measurement
    assert all(0.67 <= r <= 1.5 for (op, size), r in ratios.items() if size >= 2**27), ratios
    assert all(0.67 <= r <= 1.5 for (op, size), r in ratios.items() if op == "psum"), ratios
    # known miss: small all-gathers are latency-bound and the model's latencies (6.6 us per
    # step across nodes, the 8-GPU fit inside) come to about half the measured time
    small = [r for (op, size), r in ratios.items() if op == "all_gather" and size < 2**27]
    assert all(0.4 <= r < 1 for r in small), ratios


def test_tpu_multislice_goes_over_dcn():
    one = C.estimate("psum", 2**28, 256, hardware="TPU v5e")
    two = C.estimate("psum", 2**28, 512, hardware="TPU v5e")
    assert "across 2 nodes" in two.note and "DCN" in two.topology
    # the DCN phase alone: a ring of 2 slices over the shard each chip keeps after the
    # slice's reduce-scatter, at 3.125 GB/s per chip (2 x 100 Gbps per 8-chip host)
    dcn = 2 * (1e-5 + 2**28 / 256 / 2 / 3.125e9)
    assert two.time_s == pytest.approx(one.time_s + dcn, rel=0.05)


def test_mesh_groups_on_nodes():
    """A dict mesh lies over the devices in order (its last axis fills a node first), so a
    psum over 'dp' joins one GPU of each node; 'tp' stays inside a node."""
    mesh = {"dp": 4, "tp": 8}
    dp = C.estimate("psum", 2**26, hardware="H100", mesh=mesh, axis_name="dp")
    assert dp.time_s == C.estimate("psum", 2**26, devices=[0, 8, 16, 24], hardware="H100").time_s
    tp = C.estimate("psum", 2**26, hardware="H100", mesh=mesh, axis_name="tp")
    assert tp.time_s == C.estimate("psum", 2**26, 8, hardware="H100").time_s


def test_trace_on_two_nodes():
    before = simpmd.machine.devices.platform()
    simpmd.set_device_count(16, hardware="H100")
    try:
        f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
        f(np.ones((16, 1024), np.float32))
        t = C.estimate_trace(f.trace)
        assert t.total_time_s == pytest.approx(C.estimate("psum", 4096, 16, hardware="H100").time_s)
        assert "2 nodes" in t.topology
    finally:
        simpmd.set_device_count(len(before.devices), hardware=before.hardware,
                                topology=before.topology)


def test_clear_errors():
    with pytest.raises(ValueError, match="no network between nodes is modelled for this preset"):
        C.estimate("psum", 8, 16, hardware="T4")
    with pytest.raises(ValueError, match="'hierarchical' and 'ring'"):
        C.estimate("psum", 8, 16, hardware="H100", algorithm="tree")
    uneven = C.estimate("psum", 2**20, devices=[0, 1, 8], hardware="H100")
    assert "different numbers" in uneven.note
    assert math.isfinite(uneven.time_s)
