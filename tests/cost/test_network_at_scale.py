"""simpmd's network model across nodes against published nccl-tests runs it was not fitted to
(tests/nccl_across_nodes.py holds each row and its source): the predicted time of each
measured collective within 0.8-1.25x of the measured one, or a strict xfail that says by how
much it misses. docs/benchmarks.md, "Collectives across nodes", prints the table."""
import pytest

from simpmd import cost as C
from simpmd.cost.network import busbw_factor

from nccl_across_nodes import CALIBRATION, ROWS, SOURCES

BAND = (0.8, 1.25)


def predicted_and_measured(row):
    """(predicted seconds, measured seconds, bus bytes) of one row: the group is the first
    ``gpus`` GPUs of each of ``nodes`` DGX-style nodes (GPU k of node n is device 8n + k)."""
    source, hardware, nodes, gpus, collective, algorithm, size, busbw, time_us = row
    p = nodes * gpus
    per_device = size // p if collective == "all_gather" else size     # simpmd's nbytes
    devices = [8 * n + k for n in range(nodes) for k in range(gpus)]
    e = C.estimate(collective, per_device, devices=devices, hardware=hardware,
                   topology=8 * nodes, algorithm=algorithm)
    bus = size * busbw_factor(collective, p)
    measured = time_us * 1e-6 if time_us is not None else bus / (busbw * 1e9)
    return e.time_s, measured, bus


# Where the model misses, by how much (predicted / measured time) and why, as of this commit.
MISSES = {
    ("together-use3a-0502", 8, 8, "all_reduce", "nvls_tree", 16): "0.73: NVLSTree on 4+ "
        "nodes measured 274-291 GB/s, below this cluster's own ring; the model gives the ring's",
    ("together-use3a-0502", 46, 8, "all_reduce", "nvls_tree", 16): "0.73: as at 8 nodes",
    ("together-use3a-0502", 4, 8, "all_reduce", "nvls_tree", 16): "0.77: as at 8 nodes",
    ("together-use3a-0502", 16, 8, "all_reduce", "nvls_tree", 16): "0.77: as at 8 nodes",
    ("together-use3a-0502", 32, 8, "all_reduce", "nvls_tree", 16): "0.75: as at 8 nodes",
    ("mleng-p6", 4, 8, "all_reduce", None, 16 / 1024): "0.39: a 16 MiB all-reduce over 4 "
        "nodes, between latency and bandwidth, is 2.5x slower than NCCL's model of it",
    ("mleng-p6", 4, 8, "all_reduce", None, 64 / 1024): "0.55: the middle of the size ramp",
    ("mleng-p6", 4, 8, "all_reduce", None, 256 / 1024): "0.66: the middle of the size ramp",
    ("vp-h100", 4, 8, "all_reduce", None, 1 / 1024): "1.28: a 1 MiB all-reduce, the model's "
        "NVLSTree latency (25 us + 2 x 2 x 20.9 us) above the 92 us measured",
    ("vp-h100", 4, 8, "all_reduce", None, 16 / 1024): "0.74: the middle of the size ramp",
    ("vp-h100", 4, 8, "all_gather", None, 128 / 1024): "0.66: the middle of the size ramp",
    ("nebius-h100", 2, 8, "all_reduce", None, 1): "0.59: the model picks NVLSTree at twice "
        "a ring's bandwidth on 2 nodes (as B200 runs show); this PyTorch timing got a ring's",
    ("mscclpp-ndmv4", 2, 1, "all_gather", None, 1): "0.67: one GPU per node reaches 63% of "
        "its 200 Gb/s adapter (15.8 GB/s), the model 94%",
    ("mscclpp-ndmv4", 2, 1, "all_reduce", None, 1): "0.79: one GPU per node, as the all-gather",
}


def _key(row):
    return (row[0], row[2], row[3], row[4], row[5], row[6] / 2**30)


def _param(row):
    miss = MISSES.get(_key(row))
    marks = [pytest.mark.xfail(strict=True, reason=f"predicted/measured {miss}")] if miss else []
    name = f"{row[0]}-{row[1]}-{row[2]}n{row[3]}-{row[4]}-{row[5] or 'default'}-{row[6]}"
    return pytest.param(row, marks=marks, id=name)


@pytest.mark.parametrize("row", [_param(r) for r in ROWS])
def test_against_published_measurement(row):
    model, measured, _ = predicted_and_measured(row)
    ratio = model / measured
    assert BAND[0] <= ratio <= BAND[1], f"predicted/measured {ratio:.2f} ({SOURCES[row[0]]})"


def test_every_row_has_a_source_and_no_calibration_row_is_tested():
    assert {r[0] for r in ROWS + CALIBRATION} <= set(SOURCES)
    assert not set(map(_key, CALIBRATION)) & set(map(_key, ROWS))
    assert set(MISSES) <= set(map(_key, ROWS))


def test_three_node_counts_per_generation_where_published():
    counts = {}
    for r in ROWS:
        counts.setdefault(r[1], set()).add(r[2])
    assert len(counts["B200"]) >= 3
    # under-checked (docs/benchmarks.md): Hopper at 2 and 4 nodes, A100 at 2 only
    assert counts["H100"] | counts["H200"] == {2, 4} and counts["A100"] == {2}
