"""Hardware presets: one accelerator and its interconnect, every number with its source.

:class:`Hardware` holds what the cost model needs of a chip (HBM bandwidth, peak FLOP/s,
its links and their latency); :data:`HARDWARE` the presets learners name (TPU v2 to v6e,
A100, H100, H200, B200, a toy CPU), found loosely by :func:`hardware_preset`. A preset
may carry :class:`MeasuredFit` s: collectives fitted to published nccl-tests runs.
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

# -- fits to published measurements ----------------------------------------------------

@dataclass(frozen=True)
class MeasuredFit:
    """One collective on one GPU node as nccl-tests measures it, in the form nccl-tests'
    doc/PERFORMANCE.md gives for its time ("roughly equal to overhead + size / bw"):

        t = latency_s + S x factor / busbw

    with S and factor nccl-tests' size and bus-bandwidth factor (:data:`NCCL_TESTS`), so
    ``busbw`` is the bus bandwidth large messages approach and ``latency_s`` the time a
    call costs whatever its size.
    """

    latency_s: float
    busbw: float
    fitted_to: str = ""        # which measurements (a key of the preset's citations)

    def __str__(self):
        return (f"{self.latency_s * 1e6:g} us per call + bus bytes / {self.busbw / 1e9:g} GB/s "
                f"({self.fitted_to})")


# Published nccl-tests results on ONE node of 8 H100 SXM GPUs (NVLink 4 + NVSwitch), as
# (S, busbw) pairs in nccl-tests' units: S in bytes (the buffer of an all-reduce, the
# gathered output of an all-gather), busbw in bytes/s. The fits below are made from these;
# tests/test_cost_measured.py holds the model to each point.
NCCL_TESTS_H100 = {
    # Azure/AI-benchmarking-guide, "Azure Results/ND_H100_v5_results.md" (Microsoft Azure,
    # https://github.com/Azure/AI-benchmarking-guide), section "NCCL Bandwidth": one ND H100
    # v5 VM (8 x H100 80GB HBM3), NCCL 2.18.5, CUDA 12.6; Benchmarks/NCCLBandwidth.py runs
    # `NCCL_ALGO=NVLS ./build/all_reduce_perf -b 8 -e 8G -f 2 -g 8 -n 40` and reports the
    # in-place busbw. Its size labels (1K, 65K, 132K, 1M, 33M, 1G, ...) are the powers of two
    # that -b 8 -f 2 steps through; here from 1 KiB to 8 GiB.
    "all_reduce": tuple(zip(
        [2**k for k in range(10, 34)],
        [x * 1e9 for x in (0.07, 0.14, 0.27, 0.53, 0.95, 1.71, 2.72, 5.40, 10.86, 21.35,
                           43.70, 81.93, 128.73, 172.13, 234.45, 295.53, 361.78, 400.61,
                           423.38, 438.46, 466.35, 472.36, 475.54, 478.87)])),
    # Together AI, github.com/togethercomputer/together-nccl-tests, commit 6698e53 (March
    # 2026), benchmarks/H100/results/20260305_220043/all_gather_ring.out and
    # reduce_scatter_ring.out: one host (gpu-dp-2jvzl-pqq7p), 8 x NVIDIA H100 80GB HBM3 in one
    # process (nThread 1 nGpus 8), nccl-tests 2.17.9, NCCL 2.26.2 (nccl-library=22602); the
    # header reads minBytes 8 maxBytes 8589934592 step 2(factor), warmup 5, iters 20, i.e.
    # `all_gather_perf -b 8 -e 8G -f 2 -g 8 -w 5 -n 20`. "ring" is the label the repository's
    # benchmarks/run_nccl_sharp_test.sh gives NCCL_ALGO=RING NCCL_NVLS_ENABLE=0 (the stored
    # version of that script runs the all-reduce only, so the settings are read from the label
    # and the header); the same host's all_gather_nvls.out agrees within 4% at every size.
    # In-place busbw, as for the all-reduce, from 1 MiB to 8 GiB; S is the gathered output
    # (all-gather) or the input (reduce-scatter).
    "all_gather": tuple(zip(
        [2**k for k in range(20, 34)],
        [x * 1e9 for x in (22.12, 44.14, 88.35, 159.00, 214.29, 239.60, 281.35, 302.39,
                           323.86, 338.43, 347.57, 355.24, 359.51, 363.38)])) + (
        # NVIDIA/nccl-tests issue 326 (https://github.com/NVIDIA/nccl-tests/issues/326,
        # 2025-06): `./build/all_gather_perf -b 128M -e 16384M -f 2 -g 8` on 8 H100s with
        # NVLink, busbw "saturated at ~360 GB/s ... (16GB)"; S. Jeaugey (NCCL): "360 GB/s is
        # exactly what we'd expect on H100". Its per-size rows are screenshots: only this point.
        (16 * 2**30, 360e9),),
    "reduce_scatter": tuple(zip(
        [2**k for k in range(20, 34)],
        [x * 1e9 for x in (22.55, 43.09, 85.98, 145.98, 203.85, 247.78, 285.85, 309.12,
                           327.55, 337.74, 346.93, 353.15, 358.24, 364.13)])),
}

_AZURE_H100 = ("Azure/AI-benchmarking-guide, 'Azure Results/ND_H100_v5_results.md', section 'NCCL "
               "Bandwidth' (https://github.com/Azure/AI-benchmarking-guide): all_reduce_perf "
               "(NCCL_ALGO=NVLS, -g 8, in-place busbw) on one ND H100 v5 VM, 8 x H100 80GB HBM3, "
               "NCCL 2.18.5, 1 KiB to 8 GiB; busbw 43.7 GB/s at 1 MiB, 466 at 1 GiB, 479 at 8 GiB")
_NCCL_TESTS_326 = ("NVIDIA/nccl-tests issue 326 (https://github.com/NVIDIA/nccl-tests/issues/326): "
                   "all_gather_perf -b 128M -e 16384M -g 8 on 8 H100s (NVLink) saturates at ~360 "
                   "GB/s busbw; S. Jeaugey: '360 GB/s is exactly what we'd expect on H100'")
_TOGETHER_H100 = ("Together AI, github.com/togethercomputer/together-nccl-tests (commit 6698e53), "
                  "benchmarks/H100/results/20260305_220043/all_gather_ring.out and "
                  "reduce_scatter_ring.out: all_gather_perf / reduce_scatter_perf -b 8 -e 8G -f 2 -g 8 "
                  "-w 5 -n 20 (NCCL_ALGO=RING) on one host of 8 x H100 80GB HBM3, NCCL 2.26.2; "
                  "in-place busbw 22.1 GB/s at 1 MiB, 347.6 at 1 GiB, 363.4 at 8 GiB (all-gather)")
_NCCL_TESTS_212 = ("NVIDIA/nccl-tests issue 212 (https://github.com/NVIDIA/nccl-tests/issues/212), "
                   "S. Jeaugey: with ~20% protocol overhead NCCL gets ~370 GB/s of the 450 GB/s "
                   "NVLink line rate as busbw for non-allreduce operations; the all-reduce runs "
                   "in the switch (NVLink SHARP) and peaks near 480 GB/s busbw on 8 GPUs")

# The fits (tests/test_cost_measured.py redoes each from the published points): alpha and
# busbw that minimise the largest |log(model / measured)| over the 14 points from 1 MiB to
# 8 GiB. All-reduce, the Azure table: +-13% (the affine form cannot follow both the slow
# middle, 8-32 MiB, and the 479 GB/s reached at 8 GiB). All-gather and reduce-scatter,
# Together's tables: +-15% and +-9% (the time stays near 41 us up to 4 MiB, then grows with
# the bytes); issue 326's 16 GiB all-gather point is not fitted and the fit stays within 7%
# of it.
_H100_MEASURED = (
    ("all_reduce", MeasuredFit(42e-6, 425e9, fitted_to="Azure ND H100 v5, NVLS")),
    ("all_gather", MeasuredFit(34e-6, 384e9, fitted_to="Together AI H100 node, ring")),
    ("reduce_scatter", MeasuredFit(35e-6, 373e9, fitted_to="Together AI H100 node, ring")),
)


# -- hardware presets -------------------------------------------------------------------

@dataclass(frozen=True)
class Hardware:
    """One accelerator and its interconnect, with every number's source in ``citations``.

    Units: bandwidths in bytes/s, ONE direction of ONE link (a full-duplex link carries
    as much again the other way); latency in seconds per hop; FLOP/s dense (no sparsity).
    """

    name: str
    interconnect: str
    link_bandwidth: float          # bytes/s, one link, one direction
    links_per_device: int          # TPU: 2 per torus axis; H100: 18 NVLinks into the switches
    hop_latency: float             # s per hop (a round figure; see citations)
    hbm_bandwidth: float           # bytes/s
    peak_bf16_flops: float         # FLOP/s, dense: 16-bit floats (bf16, fp16) on the matmul units
    torus_rank: int | None = None  # 2 or 3 for a TPU torus; None for a switch
    node_size: int | None = None   # devices on one switch (GPU node)
    citations: tuple = ()
    pod_axis: int = 16             # 2-D TPUs: an axis this long has wraparound links
    aliases: tuple = ()            # other names learners use, e.g. the book's "TPU v4p"
    peak_fp32_flops: float | None = None   # FLOP/s, dense, exact float32 (see peak_flops)
    measured: tuple = ()           # (collective, MeasuredFit) pairs: fits to published runs

    def peak_flops(self, dtype) -> float:
        """Peak FLOP/s for arithmetic in ``dtype``.

        16-bit (and 8-bit) floats run at the bf16 rate of the matrix units; everything else
        (float32, integers) at the float32 rate: on a TPU, float32 matmuls at JAX's
        ``precision="highest"`` take 6 bf16 passes (``jax.lax.Precision`` docstring), on a
        GPU the datasheet's non-tensor FP32 rate. JAX's *default* precision is faster
        (bf16 on TPU, TF32 on A100/H100): pass 16-bit arrays to model that.
        """
        name = np.dtype(dtype).name if not isinstance(dtype, str) else dtype
        if name in ("bfloat16", "float16") or name.startswith("float8"):
            return self.peak_bf16_flops
        return self.peak_fp32_flops if self.peak_fp32_flops else self.peak_bf16_flops

    @property
    def critical_intensity(self) -> float:
        """FLOPs per HBM byte above which a bf16 operation is compute-bound (the Scaling
        Book's Part 1, "All About Rooflines": peak FLOP/s over HBM bandwidth, 240 on a v5e)."""
        return self.peak_bf16_flops / self.hbm_bandwidth

    @property
    def device_bandwidth(self) -> float:
        """Bytes/s one device can send over all its links at once, one direction."""
        return self.links_per_device * self.link_bandwidth

    def topology(self, shape=None):
        """The topology of ``shape`` devices (an int, or a tuple of axis sizes) on this hardware.

        TPU: a count becomes the standard slice shape (16 -> 4x4 on v5e, 2x2x4 on v4), and
        wraparound follows the slice rules of the scaling book (see ``wraparound_for``).
        GPU: one NVLink switch, at most ``node_size`` devices.
        """
        from .network import FullyConnected, Torus    # network.py imports this module
        if self.torus_rank is None:
            n = int(shape) if np.ndim(shape) == 0 else math.prod(shape)
            if self.node_size is not None and n > self.node_size:
                raise ValueError(
                    f"{self.name}: {n} devices span more than one NVLink node of "
                    f"{self.node_size}; simpmd models one node only (the network between "
                    f"nodes is not modelled). Pass topology=FullyConnected({n}, ...) to "
                    f"pretend that one switch joins them all.")
            return FullyConnected(n, link_bandwidth=self.link_bandwidth,
                                  hop_latency=self.hop_latency, links=self.links_per_device,
                                  name=self.name, measured=dict(self.measured))
        if np.ndim(shape) == 0 and int(shape) not in SLICE_SHAPES[self.torus_rank]:
            return Torus((int(shape),), False, link_bandwidth=self.link_bandwidth,
                         hop_latency=self.hop_latency, name=self.name)
        dims = (SLICE_SHAPES[self.torus_rank][int(shape)] if np.ndim(shape) == 0
                else tuple(int(d) for d in shape))
        return Torus(dims, self.wraparound_for(dims), link_bandwidth=self.link_bandwidth,
                     hop_latency=self.hop_latency, name=self.name)

    def wraparound_for(self, dims) -> tuple:
        """Which axes of a slice have wraparound links.

        2-D TPUs (v5e, v6e; v2, v3): only an axis of the full pod size (16; 32 on v3). 3-D TPUs (v4, v5p):
        every axis, when the slice is made of whole 4x4x4 cubes (the optical switches
        that close the rings exist only per cube), else none; a shape with fewer than
        three axes is not a real slice and gets none. (Scaling book, Part 2, "TPU
        Networking".) For another wiring, build a Torus yourself.
        """
        if self.torus_rank == 2:
            return tuple(d == self.pod_axis for d in dims)
        whole_cubes = len(dims) == 3 and all(d % 4 == 0 for d in dims)
        return tuple(whole_cubes for _ in dims)

    def __str__(self):
        lines = [f"{self.name}: {self.interconnect}",
                 f"  link bandwidth   {self.link_bandwidth / 1e9:g} GB/s per link, one direction "
                 f"({self.links_per_device} links: {self.device_bandwidth / 1e9:g} GB/s out of a device)",
                 f"  hop latency      {self.hop_latency * 1e6:g} us",
                 f"  HBM bandwidth    {self.hbm_bandwidth / 1e12:g} TB/s",
                 f"  peak bf16        {self.peak_bf16_flops / 1e12:g} TFLOP/s"]
        if self.peak_fp32_flops:
            lines.append(f"  peak fp32        {self.peak_fp32_flops / 1e12:.3g} TFLOP/s")
        for op, fit in self.measured:
            lines.append(f"  measured {op:14s} {fit}")
        return "\n".join(lines + ["  sources:"] + [f"    - {c}" for c in self.citations])


# Standard slice shapes for a device count (Cloud TPU docs list these 2-D v5e shapes and
# 3-D v5p shapes); another count becomes a 1-D line without wraparound.
SLICE_SHAPES = {
    2: {1: (1, 1), 4: (2, 2), 8: (2, 4), 16: (4, 4), 32: (4, 8), 64: (8, 8), 128: (8, 16),
        256: (16, 16)},
    3: {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 2, 2), 16: (2, 2, 4), 32: (2, 4, 4), 64: (4, 4, 4),
        128: (4, 4, 8), 256: (4, 8, 8), 512: (8, 8, 8), 1024: (8, 8, 16), 2048: (8, 16, 16),
        4096: (16, 16, 16)},
}

_BOOK_TPU = ("J. Austin et al., 'How to Scale Your Model' (2025), Part 2 'How to Think About "
             "TPUs', section 'TPU Specs', https://jax-ml.github.io/scaling-book/tpus/ : "
             "HBM BW/chip, FLOPs/s/chip (bf16) and ICI BW/link (one-way) tables")
_BOOK_ICI_LATENCY = ("Scaling book Part 3 'Sharding', 'A note on ICI latency': each ICI hop "
                     "has an intrinsic overhead 'typically around 1us', "
                     "https://jax-ml.github.io/scaling-book/sharding/")
_BOOK_TORUS = ("Scaling book Part 2, 'TPU Networking': v5e/v6e are 2-D tori (4 neighbours) "
               "with wraparound only on a full axis of 16; v4/v5p are 3-D tori (6 neighbours) "
               "with wraparound when the slice is made of whole 4x4x4 cubes")
_BOOK_GPU = ("Scaling book, 'How to Think About GPUs', https://jax-ml.github.io/scaling-book/gpus/ : "
             "NVLink 4.0 (Hopper) has 18 links per GPU at 25 GB/s each way, 450 GB/s per "
             "GPU per direction; 8 GPUs per node on 4 NVSwitches; HBM BW and bf16 FLOPs/s "
             "table (H100 3.4e12 B/s, 9.9e14; H200 4.8e12 B/s, 9.9e14)")
_NCCL_LATENCY = ("NVLink hop latency: a round 1 us, an assumption; NCCL's own tuning model "
                 "(NVIDIA/nccl src/graph/tuning.cc, table hwLat) charges 0.47-3.4 us per "
                 "NVLink ring step depending on protocol, in the version read")

_BOOK_V2 = ("Scaling book, 'How to Profile TPU Programs', https://jax-ml.github.io/scaling-book/"
            "profiling/ : a ReduceScatter on a 'TPUv2 4x2' runs on '1.2e11 bidirectional "
            "bandwidth' (6e10 one way per link); '23e12' bf16 FLOP/s per core, two cores per chip")
_JOUPPI_2020 = ("N. Jouppi et al., 'A Domain-Specific Supercomputer for Training Deep Neural "
                "Networks', CACM 63(7), 2020, Table 3: TPU v2 chip 46 TFLOP/s bf16, HBM 700 GB/s; "
                "2-D torus of 16x16 chips (v2 pod) and 32x32 (v3 pod)")
_A100 = ("NVIDIA A100 Tensor Core GPU datasheet (SXM 80GB): NVLink 600 GB/s (both directions "
         "together, 12 third-generation links), HBM2e 2,039 GB/s, BF16 312 TFLOPS dense, FP32 19.5 TFLOPS")
_BOOK_ROOFLINE = ("Scaling book Part 1 'All About Rooflines', https://jax-ml.github.io/scaling-book/"
                  "roofline/ : a v5e does 1.97e14 bf16 FLOP/s from 8.2e11 B/s of HBM, critical "
                  "intensity 240 (the Part 2 table says 8.1e11 B/s, kept here: 243)")
_FP32_TPU = ("float32 rate: bf16 rate / 6, JAX's lax.Precision docstring: HIGHEST 'performs "
             "float32 computations in 6 bfloat16' passes on TPU")
_B200 = ("NVIDIA HGX B200 / DGX B200 datasheet: fifth-generation NVLink 1.8 TB/s per GPU (both "
         "directions together, 18 links), HBM3e 8 TB/s per GPU; BF16 2.25 PFLOPS dense per "
         "GPU (half the 4.5 PFLOPS sparse figure); FP32 600 TFLOPS per 8-GPU board, 75 per GPU")

HARDWARE = {
    "TPU v2": Hardware(
        "TPU v2", "ICI, 2-D torus", link_bandwidth=6e10, links_per_device=4,
        hop_latency=1e-6, hbm_bandwidth=7e11, peak_bf16_flops=4.6e13, peak_fp32_flops=4.6e13 / 6, torus_rank=2,
        citations=(_FP32_TPU, _BOOK_V2, _JOUPPI_2020, _BOOK_ICI_LATENCY), aliases=("v2", "TPUv2")),
    "TPU v3": Hardware(
        "TPU v3", "ICI, 2-D torus", link_bandwidth=1e11, links_per_device=4,
        hop_latency=1e-6, hbm_bandwidth=9e11, peak_bf16_flops=1.4e14, peak_fp32_flops=1.4e14 / 6, torus_rank=2,
        pod_axis=32,
        citations=(_FP32_TPU, _BOOK_TPU + " (row 'TPU v3': 9.0e11 B/s, 1.4e14 FLOP/s, 1e11 B/s; pod 32x32)",
                   _JOUPPI_2020, _BOOK_ICI_LATENCY), aliases=("v3", "TPUv3")),
    "TPU v4": Hardware(
        "TPU v4", "ICI, 3-D torus", link_bandwidth=4.5e10, links_per_device=6,
        hop_latency=1e-6, hbm_bandwidth=1.2e12, peak_bf16_flops=2.75e14, peak_fp32_flops=2.75e14 / 6, torus_rank=3,
        citations=(_FP32_TPU, _BOOK_TPU + " (row 'TPU v4p': 1.2e12 B/s, 2.75e14 FLOP/s, 4.5e10 B/s)",
                   _BOOK_ICI_LATENCY, _BOOK_TORUS), aliases=("TPU v4p", "v4", "v4p", "TPUv4")),
    "TPU v5e": Hardware(
        "TPU v5e", "ICI, 2-D torus", link_bandwidth=4.5e10, links_per_device=4,
        hop_latency=1e-6, hbm_bandwidth=8.1e11, peak_bf16_flops=1.97e14, peak_fp32_flops=1.97e14 / 6, torus_rank=2,
        citations=(_FP32_TPU, _BOOK_TPU + " (8.1e11 B/s, 1.97e14 FLOP/s, 4.5e10 B/s)", _BOOK_ROOFLINE,
                   "Cloud TPU docs, 'TPU v5e', https://cloud.google.com/tpu/docs/v5e : 197 "
                   "TFLOPs bf16, 819 GBps HBM", _BOOK_ICI_LATENCY, _BOOK_TORUS),
        aliases=("v5e", "TPU v5 lite", "v5litepod", "TPUv5e")),
    "TPU v5p": Hardware(
        "TPU v5p", "ICI, 3-D torus", link_bandwidth=9e10, links_per_device=6,
        hop_latency=1e-6, hbm_bandwidth=2.8e12, peak_bf16_flops=4.59e14, peak_fp32_flops=4.59e14 / 6, torus_rank=3,
        citations=(_FP32_TPU, _BOOK_TPU + " (2.8e12 B/s, 4.59e14 FLOP/s, 9e10 B/s)",
                   "Cloud TPU docs, 'TPU v5p', https://cloud.google.com/tpu/docs/v5p : 459 "
                   "TFLOPs bf16 per chip", _BOOK_ICI_LATENCY, _BOOK_TORUS),
        aliases=("v5p", "TPU v5", "TPUv5p")),
    "TPU v6e": Hardware(
        "TPU v6e", "ICI, 2-D torus", link_bandwidth=9e10, links_per_device=4,
        hop_latency=1e-6, hbm_bandwidth=1.6e12, peak_bf16_flops=9.2e14, peak_fp32_flops=9.2e14 / 6, torus_rank=2,
        citations=(_FP32_TPU, _BOOK_TPU + " (1.6e12 B/s, 9.2e14 FLOP/s, 9e10 B/s)",
                   _BOOK_ICI_LATENCY, _BOOK_TORUS), aliases=("v6e", "Trillium", "TPUv6e")),
    "A100": Hardware(
        "A100", "NVLink 3.0 + NVSwitch", link_bandwidth=25e9, links_per_device=12,
        hop_latency=1e-6, hbm_bandwidth=2.039e12, peak_bf16_flops=3.12e14, peak_fp32_flops=1.95e13, node_size=8,
        citations=(_A100, _NCCL_LATENCY), aliases=("NVIDIA A100", "A100 SXM")),
    "H100": Hardware(
        "H100", "NVLink 4.0 + NVSwitch", link_bandwidth=25e9, links_per_device=18,
        hop_latency=1e-6, hbm_bandwidth=3.35e12, peak_bf16_flops=9.9e14, peak_fp32_flops=6.7e13, node_size=8,
        citations=(_BOOK_GPU, "NVIDIA H100 datasheet (SXM): NVLink 900 GB/s (both directions "
                   "together), HBM3 3.35 TB/s, BF16 1,979 TFLOPS with sparsity (989 dense; simpmd keeps "
                   "the book table's 9.9e14), "
                   "FP32 67 TFLOPS", _NCCL_LATENCY, _AZURE_H100, _TOGETHER_H100, _NCCL_TESTS_326,
                   _NCCL_TESTS_212),
        measured=_H100_MEASURED,
        aliases=("NVIDIA H100", "H100 SXM", "H800")),
    "H200": Hardware(
        "H200", "NVLink 4.0 + NVSwitch", link_bandwidth=25e9, links_per_device=18,
        hop_latency=1e-6, hbm_bandwidth=4.8e12, peak_bf16_flops=9.9e14, peak_fp32_flops=6.7e13, node_size=8,
        citations=(_BOOK_GPU, "NVIDIA H200 datasheet (SXM): NVLink 900 GB/s (both directions "
                   "together), HBM3e 4.8 TB/s, FP32 67 TFLOPS", _NCCL_LATENCY), aliases=("NVIDIA H200",)),
    "B200": Hardware(
        "B200", "NVLink 5.0 + NVSwitch", link_bandwidth=50e9, links_per_device=18,
        hop_latency=1e-6, hbm_bandwidth=8e12, peak_bf16_flops=2.25e15, peak_fp32_flops=7.5e13, node_size=8,
        citations=(_B200, _NCCL_LATENCY), aliases=("NVIDIA B200",)),
    "CPU": Hardware(
        "CPU", "toy: processes on one switch", link_bandwidth=1e10, links_per_device=1,
        hop_latency=1e-5, hbm_bandwidth=5e10, peak_bf16_flops=1e12, peak_fp32_flops=1e12,
        citations=("Invented round numbers for a slow toy machine, not a measurement: "
                   "10 GB/s, 10 us, 50 GB/s memory, 1 TFLOP/s",)),
}


def _key(name: str) -> str:
    return "".join(ch for ch in str(name).lower() if ch.isalnum())


# Every name and alias, spelled loosely: "TPU v4p", "tpu-v4p", "v4p" all find TPU v4.
_BY_KEY = {_key(alias): hw for hw in HARDWARE.values() for alias in (hw.name, *hw.aliases)}


def hardware_preset(hardware) -> Hardware:
    """A :class:`Hardware` from its name or an alias (``"TPU v5e"``, ``"v4p"``, ``"H100"``) or itself."""
    if isinstance(hardware, Hardware):
        return hardware
    if _key(hardware) not in _BY_KEY:
        raise ValueError(f"unknown hardware {hardware!r}; presets are {sorted(HARDWARE)} "
                         f"(also known as: {', '.join(a for h in HARDWARE.values() for a in h.aliases)}), "
                         f"or pass a Hardware(...) of your own")
    return _BY_KEY[_key(hardware)]

