"""Published nccl-tests (and equivalent) runs of collectives whose group spans nodes, each
with its source: the measurements tests/cost/test_network_at_scale.py holds simpmd's network
model to (docs/benchmarks.md, "Collectives across nodes"). No row here set a parameter of
the model, except the rows listed in CALIBRATION, which are kept apart and not tested.

A row: (source key, hardware preset, nodes, GPUs per node, collective, algorithm forced
with NCCL_ALGO (None: NCCL's own choice), nccl-tests size S in bytes (the buffer of an
all-reduce or reduce-scatter, the gathered output of an all-gather), measured busbw in
GB/s, or None with the time in us instead).
"""

GiB, MiB, KiB = 2**30, 2**20, 2**10

SOURCES = {
    "together-fa-0512": (
        "Together AI, github.com/togethercomputer/together-nccl-tests, commit 6fd65d1, "
        "baselines/flapping-airplanes/2026-05-12_nccl_collective_scaling_report.md: B200 "
        "cluster 'slinky', 8 GPUs a node, 8 ConnectX NDR 400 Gb/s compute rails a node, "
        "NCCL 2.28.9, -g 8, 5 warmup + 20 iterations; tables 'all_reduce busBW peak (GB/s) "
        "@ 32 GiB' (columns Ring, Tree, NVLS / NVLSTree at 2 nodes) and 'all_gather busBW "
        "peak (GB/s) @ 32 GiB' (column Ring)"),
    "together-fa-0711": (
        "Together AI, together-nccl-tests, commit 5fa38e7, baselines/flapping-airplanes/"
        "2026-07-11_nccl_collective_scaling_report.md: the same B200 cluster, 4 nodes, 8 "
        "NDR rails a node, NCCL 2.30.7; table 'peak busBW at 8 GiB', column Tuned, rows ring"),
    "together-use3a-0502": (
        "Together AI, together-nccl-tests, commit 0492bed, baselines/use3a-ss/"
        "2026-05-02_nccl_collective_scaling_report.md, section 'Re-run Results (Jobs "
        "87865-87935)': B200 DGXC cluster, 8 ConnectX-7 NDR 400 Gb/s HCAs a node, NCCL "
        "2.29.7, -g 1, peak busBW @ 16G; tables all_reduce (Ring, NVLSTree, Tree) and "
        "all_gather (Ring). (The 2026-07-11 report of the other cluster found ring runs "
        "20-25% low without five vendor NCCL_IB_* settings; this one does not list them.)"),
    "vp-h100": (
        "Voltage Park and Georgia Tech, github.com/ZiyanIshani/vpbenchmarking, commit "
        "e55fe74, results/nccl/nccl_multinode/nccl_allreduce_20260224_225706.txt and "
        "nccl_allgather_20260224_225706.txt: nccl-tests 2.17.9, NCCL 2.24.3, 4 nodes x 8 H100 "
        "80GB HBM3, InfiniBand 8 x 400 Gb/s a node, -g 1; in-place time (us)"),
    "nebius-h100": (
        "github.com/drmysore/nebius-h100-16gpu-benchmark, README.md (commit 21b4865), 'NCCL "
        "AllReduce Bandwidth (16 GPUs across 2 nodes)': 2 nodes x 8 H100 80GB on Nebius, "
        "NVLink + InfiniBand, NCCL 2.20.5, a PyTorch all-reduce timing (not nccl-tests), "
        "bandwidth at 1 GB 434.99 GB/s (its 1 MB row, 22.30 GB/s in 0.088 ms, matches "
        "busbw = 2(n-1)/n x 2^20 B / t)"),
    "mleng-p5en": (
        "S. Bekman, 'Machine Learning Engineering', github.com/stas00/ml-engineering, commit "
        "744d01e, network/README.md (footnote under 'Understanding why inter-node network "
        "speed...'): 4 nodes x 8 H200 (AWS p5en.48xlarge, EFA, 3.2 Tb/s a node), NCCL "
        "2.27.7, 4 GiB all-reduce over 32 ranks: NCCL_ALGO=allreduce:ring 364.65 GB/s, "
        "NCCL_ALGO=allreduce:nvlstree 310.07 GB/s busbw"),
    "mleng-p6": (
        "S. Bekman, ml-engineering, commit 744d01e, network/README.md, 'Inter-node speed "
        "depends on intra-node speed', table of all_reduce_bench.py busbw on 1 and 4 "
        "P6-B200 nodes (8 B200 a node, 8 x 400 Gb/s EFA v4), torch 2.9.1, NCCL 2.27.7, "
        "column '4 nodes' (AWS's ofi tuner chooses the algorithm)"),
    "mscclpp-ndmv4": (
        "microsoft/mscclpp, docs/performance-ndmv4.md (commit 7f3f366): Azure NDmv4 (8 x "
        "A100 80GB a VM, one 200 Gb/s HDR InfiniBand adapter a GPU), NCCL 2.17.1+cuda11.8, "
        "in-place numbers; tables '2 nodes, 8 gpus/node' and '2 nodes, 1 gpu/node', columns "
        "NCCL AllGather and NCCL AllReduce (BusBW at 1G and 4G, latency at 1K)"),
}

# (source, hardware, nodes, gpus per node, collective, algorithm, S bytes, busbw GB/s, time us)
ROWS = [
    # B200, Together 'flapping-airplanes' 2026-05-12, 32 GiB
    *[("together-fa-0512", "B200", n, 8, "all_reduce", "ring", 32 * GiB, bw, None)
      for n, bw in ((2, 388.41), (4, 389.30), (8, 389.20), (16, 388.30), (32, 389.98),
                    (64, 389.81))],
    *[("together-fa-0512", "B200", n, 8, "all_reduce", "tree", 32 * GiB, bw, None)
      for n, bw in ((2, 338.52), (4, 192.25), (8, 194.53), (16, 195.82), (32, 195.43),
                    (64, 195.90))],
    ("together-fa-0512", "B200", 2, 8, "all_reduce", "nvls_tree", 32 * GiB, 719.70, None),
    *[("together-fa-0512", "B200", n, 8, "all_gather", "ring", 32 * GiB, bw, None)
      for n, bw in ((2, 371.44), (4, 376.91), (8, 380.62), (16, 382.83), (32, 378.50),
                    (64, 380.15))],
    # B200, the same cluster 2026-07-11, 4 nodes, 8 GiB
    ("together-fa-0711", "B200", 4, 8, "all_reduce", "ring", 8 * GiB, 384.0, None),
    ("together-fa-0711", "B200", 4, 8, "all_gather", "ring", 8 * GiB, 376.2, None),
    ("together-fa-0711", "B200", 4, 8, "reduce_scatter", "ring", 8 * GiB, 384.1, None),
    # B200, Together 'use3a-ss' 2026-05-02 re-run, 16 GiB
    *[("together-use3a-0502", "B200", n, 8, "all_reduce", "ring", 16 * GiB, bw, None)
      for n, bw in ((2, 344.7), (4, 334.8), (8, 322.6), (16, 306.3), (32, 304.4), (46, 291.4))],
    *[("together-use3a-0502", "B200", n, 8, "all_gather", "ring", 16 * GiB, bw, None)
      for n, bw in ((2, 342.9), (4, 323.9), (8, 311.5), (16, 304.9), (32, 302.3), (46, 293.3))],
    *[("together-use3a-0502", "B200", n, 8, "all_reduce", "nvls_tree", 16 * GiB, bw, None)
      for n, bw in ((2, 717.2), (4, 288.9), (8, 274.3), (16, 290.7), (32, 280.7), (46, 274.9))],
    ("together-use3a-0502", "B200", 2, 8, "all_reduce", "tree", 16 * GiB, 335.2, None),
    # B200 on EFA, ml-engineering, 4 nodes, NCCL's (AWS tuner's) choice, by payload
    *[("mleng-p6", "B200", 4, 8, "all_reduce", None, size, bw, None)
      for size, bw in ((16 * MiB, 64.43), (64 * MiB, 156.74), (256 * MiB, 229.09),
                       (1 * GiB, 361.99), (16 * GiB, 381.80))],
    # H100, Voltage Park, 4 nodes, NCCL's choice, in-place time
    *[("vp-h100", "H100", 4, 8, "all_reduce", None, size, None, us)
      for size, us in ((1 * MiB, 92.01), (16 * MiB, 270.22), (128 * MiB, 932.64),
                       (1 * GiB, 6427.04), (8 * GiB, 50415.3))],
    *[("vp-h100", "H100", 4, 8, "all_gather", None, size, None, us)
      for size, us in ((1 * MiB, 109.01), (16 * MiB, 235.19), (128 * MiB, 745.11),
                       (1 * GiB, 3229.61), (8 * GiB, 25438.7))],
    # H100, Nebius, 2 nodes, NCCL's choice
    ("nebius-h100", "H100", 2, 8, "all_reduce", None, 1 * GiB, 434.99, None),
    # H200 on EFA, ml-engineering, 4 nodes, 4 GiB
    ("mleng-p5en", "H200", 4, 8, "all_reduce", "ring", 4 * GiB, 364.65, None),
    ("mleng-p5en", "H200", 4, 8, "all_reduce", "nvls_tree", 4 * GiB, 310.07, None),
    # A100, Azure NDmv4 (mscclpp's tables), 2 nodes
    ("mscclpp-ndmv4", "A100", 2, 8, "all_gather", None, 1 * GiB, 177.05, None),
    ("mscclpp-ndmv4", "A100", 2, 8, "all_gather", None, 4 * GiB, 186.01, None),
    ("mscclpp-ndmv4", "A100", 2, 8, "all_reduce", None, 1 * GiB, 183.82, None),
    ("mscclpp-ndmv4", "A100", 2, 8, "all_reduce", None, 4 * GiB, 188.18, None),
    ("mscclpp-ndmv4", "A100", 2, 8, "all_gather", None, 1 * KiB, None, 33.74),
    ("mscclpp-ndmv4", "A100", 2, 8, "all_reduce", None, 1 * KiB, None, 35.85),
    ("mscclpp-ndmv4", "A100", 2, 1, "all_gather", None, 1 * GiB, 15.84, None),
    ("mscclpp-ndmv4", "A100", 2, 1, "all_reduce", None, 1 * GiB, 18.65, None),
    ("mscclpp-ndmv4", "A100", 2, 1, "all_gather", None, 1 * KiB, None, 16.08),
    ("mscclpp-ndmv4", "A100", 2, 1, "all_reduce", None, 1 * KiB, None, 21.27),
]

# Rows that set a parameter (simpmd.cost.network.TREE_BANDWIDTH): never tested.
CALIBRATION = [
    ("together-use3a-0502", "B200", n, 8, "all_reduce", "tree", 16 * GiB, bw, None)
    for n, bw in ((4, 190.7), (8, 192.6), (16, 193.4), (32, 193.5), (46, 193.2))
]
