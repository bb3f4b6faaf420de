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
    """NCCL's ring across 2 nodes of 2 (tuning.cc's constants, by hand): Simple pays a base
    8.4 us, 4 NVLink steps of 3.4 us and 2 network steps of the cluster's 5 us, times 1.4
    for an all-reduce; its bus bytes 2(p-1)/p n go at min(port 100, 2 NICs x 10) GB/s."""
    n = 2**24
    e = C.estimate("psum", n, 4, topology=small_cluster(), algorithm="ring")
    simple = 1.4 * (8.4e-6 + 4 * 3.4e-6 + 2 * 5e-6) + 1.5 * n / 20e9
    ll = (6.6e-6 + 4 * 1.0e-6 + 2 * 2.7e-6) + 1.5 * n / 10e9     # half the bandwidth
    assert e.time_s == pytest.approx(min(simple, ll)) == pytest.approx(simple)
    # the tree on 2 nodes: 0.92 of the ring's bandwidth, 2 x (1 NVLink + 1 network step)
    tree = (8.4e-6 + 2 * (4.0e-6 + 5e-6)) + 1.5 * n / (0.92 * 20e9)
    assert C.estimate("psum", n, 4, topology=small_cluster(),
                      algorithm="tree").time_s == pytest.approx(tree)
    fastest = C.estimate("psum", n, 4, topology=small_cluster())
    assert fastest.algorithm == "ring" and fastest.time_s == pytest.approx(min(simple, tree))


def test_small_messages_take_the_short_protocol():
    """A 1 KiB all-reduce over 2 DGX A100 nodes: NCCL's LL tree, 6.8 us + 2 x (7 NVLink steps
    of 0.6 us + 1 network step of 5 us), plus the 4 us kernel launch; the bytes are nothing."""
    e = C.estimate("psum", 1024, 16, hardware="A100")
    assert e.algorithm == "tree" and "LL" in e.note
    bus = 2 * 15 / 16 * 1024                 # at LL's cap on 2 nodes, 39 GB/s
    assert e.time_s == pytest.approx(4e-6 + 6.8e-6 + 2 * (7 * 0.6e-6 + 5e-6) + bus / 39e9)


def test_nvls_tree_on_two_nodes_doubles_the_adapters():
    """B200 (NVLS): on 2 nodes NCCL's NVLSTree sends half a ring's bytes per adapter, so its
    bus bandwidth is min(900 GB/s x 0.74 x 2, 2 x 8 x 50 GB/s x 0.94) = 752 GB/s."""
    size = 2**34
    e = C.estimate("psum", size, 16, hardware="B200")
    assert e.algorithm == "nvls_tree"
    bus = 2 * 15 / 16 * size
    assert e.time_s == pytest.approx(4e-6 + 25e-6 + 2 * 20.9e-6 + bus / 752e9)
    assert e.busbw == pytest.approx(bus / e.time_s)


def test_all_gather_across_nodes_never_beats_the_adapters():
    """A ZeRO-3 gather of a 1.2 GB weight over whole DGX A100 nodes: each node must take in
    (m-1)/m of it through its 8 rails of 25 GB/s, so no estimate may be faster than that;
    the model's is that over the 94% NCCL reaches, plus its steps."""
    S = 1.2e9
    for nodes in (2, 8, 64, 128):
        p = 8 * nodes
        e = C.estimate("all_gather", S / p, p, hardware="A100")
        floor = (nodes - 1) / nodes * S / (8 * 25e9)
        assert e.time_s > floor and e.algbw < 8 * 25e9
        assert e.time_s > (p - 1) / p * S / (8 * 25e9 * 0.94)


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
    InfiniBand at 94% of its own 50 GB/s adapter (one 400 Gb/s NIC per GPU, the DGX H100
    datasheet); NCCL's ring pays 14 network steps of 14 us (and its 8.4 us base) x 1.4, and
    the kernel launch 4 us."""
    n = 2**30
    e = C.estimate("psum", n, devices=range(0, 64, 8), hardware="H100")
    ring = 4e-6 + 1.4 * (8.4e-6 + 14 * 14e-6) + 2 * 7 / 8 * n / (0.94 * 50e9)
    assert e.algorithm == "ring" and e.time_s == pytest.approx(ring)
    assert e.busbw == pytest.approx(2 * 7 / 8 * n / ring)


def test_groups_of_one_mesh_keep_their_own_rails():
    """Rails: a group with g GPUs in each node sends through those g GPUs' adapters, so the
    8 dp groups of a (dp=4, tp=8) mesh each get one adapter, and a group of 2 GPUs a node
    twice that; a node with 4 adapters for 8 GPUs gives each GPU half of one."""
    n = 2**30
    one = C.estimate("all_gather", n, devices=[0, 8, 16, 24], hardware="H100")
    two = C.estimate("all_gather", n, devices=[0, 1, 8, 9, 16, 17, 24, 25], hardware="H100")
    assert one.busbw == pytest.approx(0.94 * 50e9, rel=0.01)
    assert two.busbw == pytest.approx(2 * 0.94 * 50e9, rel=0.01)
    node = C.FullyConnected(8, link_bandwidth=25e9, hop_latency=1e-6, links=18)
    half = C.Cluster(node, 4, scale_out_bandwidth=4 * 50e9 / 8, scale_out_latency=14e-6)
    shared = C.estimate("all_gather", n, devices=[0, 8, 16, 24], topology=half)
    assert shared.busbw == pytest.approx(25e9, rel=0.01)
    # the same node from a preset: A100s with 4 x 100 Gb/s adapters for 8 GPUs
    p4 = C.hardware_preset("A100").cluster(4, adapters=4, adapter_bandwidth=12.5e9)
    assert p4.scale_out_bandwidth == 6.25e9
    whole = C.estimate("all_gather", n // 32, devices=range(32), topology=p4)
    assert whole.busbw == pytest.approx(8 * 6.25e9 * 0.94, rel=0.02)


def test_a_group_inside_one_node_is_unchanged():
    e = C.estimate("psum", 2**26, devices=range(8, 16), hardware="H100", topology=64)
    assert e.time_s == C.estimate("psum", 2**26, 8, hardware="H100").time_s


# Published multi-node nccl-tests runs (Voltage Park's 4 x 8 H100 among them) are in
# tests/nccl_across_nodes.py and checked by tests/cost/test_network_at_scale.py.


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
    with pytest.raises(ValueError, match=r"has the algorithms \['hierarchical', 'nvls_tree', "
                                         r"'ring', 'tree'\]"):
        C.estimate("psum", 8, 16, hardware="H100", algorithm="bogus")
    with pytest.raises(ValueError, match=r"\['hierarchical', 'ring'\]"):
        C.estimate("all_gather", 8, 16, hardware="H100", algorithm="tree")   # NCCL has none
    uneven = C.estimate("psum", 2**20, devices=[0, 1, 8], hardware="H100")
    assert "different numbers" in uneven.note
    assert math.isfinite(uneven.time_s)
