"""Hardware presets: one accelerator and its interconnect, every number with its source.

:class:`Hardware` holds what the cost model needs of a chip (HBM bandwidth, peak FLOP/s,
its links and their latency); :data:`HARDWARE` the presets learners name (TPU v2 to v6e,
A100, H100, H200, B200, a toy CPU), found loosely by :func:`hardware_preset`. A preset
may carry :class:`MeasuredFit` s: collectives fitted to published nccl-tests runs.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math

import numpy as np

from .cluster import Cluster
from .topology import FullyConnected, Torus


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
# tests/cost/test_cost_measured.py holds the model to each point.
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

# The fits (tests/cost/test_cost_measured.py redoes each from the published points): alpha and
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

# A path a chip lacks runs as the next slower one XLA would convert it to.
_SLOWER_PATH = {"fp8": "bf16", "int8": "bf16", "fp16": "bf16", "bf16": "fp32", "tf32": "fp32",
                "fp64": "fp32"}

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
    # The network between nodes (GPU: InfiniBand, one NIC per GPU) or slices (TPU: DCN),
    # see simpmd.cost.cluster; None: not modelled (a group must fit one node).
    scale_out_bandwidth: float | None = None   # bytes/s per device, one direction
    scale_out_latency: float = 0.0             # s per step across the network
    scale_out_efficiency: float = 1.0          # fraction of the line rate NCCL's transfers reach
    nvlink_sharp: float | None = None          # NVLS (in-switch reduction) efficiency; None: none
    pod_size: int | None = None    # TPU: the most chips one ICI slice holds
    # What the chip really does with a program (simpmd.cost.predict): (path, FLOP/s) of the
    # matrix units per operand precision ("bf16", "fp16", "tf32", "fp32", "fp8", "int8"),
    # the fraction of those that large matmuls and of HBM bandwidth that streaming kernels
    # sustain, and the time floors of a kernel and of a call from Python.
    matmul_peaks: tuple = ()
    matmul_efficiency: tuple = ()  # (path, fraction); a path not listed uses "bf16"'s
    # (path, fraction) XLA's own GEMMs were measured to sustain on the chip, where they are
    # not the kernel libraries' (matmul_efficiency): what a program jit-compiled by XLA
    # gets (:meth:`under_xla`); a path not listed keeps matmul_efficiency's
    xla_matmul_efficiency: tuple = ()
    # (pass, fraction of the bf16 peak) a fused attention kernel sustains, "forward" and
    # "backward", measured on 16-bit operands; a pass not listed runs as a large matmul
    attention_efficiency: tuple = ()
    memory_efficiency: float | None = None
    kernel_launch_s: float = 0.0
    dispatch_s: float = 0.0
    elementwise_flops: float | None = None   # FLOP/s of arithmetic off the matrix units, where
    #                          it is not the fp32 rate (a CPU's, measured by measure_cpu)

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
    def platform(self) -> str:
        """``'tpu'``, ``'gpu'`` or ``'cpu'``: how XLA runs a dot's precision on it."""
        if self.torus_rank is not None:
            return "tpu"
        return "cpu" if self.name == "CPU" else "gpu"

    def matmul_peak(self, path: str) -> float:
        """Peak FLOP/s of the matrix units on ``path`` (see :func:`simpmd.cost.predict.dot_path`):
        ``'bf16x3'`` is three bf16 passes, a third of the bf16 rate."""
        base, _, passes = path.partition("x")
        peaks = self.matmul_paths
        while base not in peaks and base in _SLOWER_PATH:
            base = _SLOWER_PATH[base]
        return peaks.get(base, self.vector_flops) / int(passes or 1)

    @property
    def matmul_paths(self) -> dict:
        """path -> peak FLOP/s: bf16 (and fp16) at ``peak_bf16_flops``, fp32 at
        ``peak_fp32_flops`` (so ``replace(hw, peak_bf16_flops=...)`` changes them), and
        the preset's table of its other paths (TF32, FP8, int8; a T4's fp16)."""
        return {"bf16": self.peak_bf16_flops, "fp16": self.peak_bf16_flops,
                "fp32": self.peak_fp32_flops or self.peak_bf16_flops, **dict(self.matmul_peaks)}

    def has_path(self, path: str) -> bool:
        """Whether the matrix units take ``path``'s operands natively (a T4 has no bf16)."""
        return path in self.matmul_paths

    def sustained_matmul_flops(self, path: str) -> float:
        """The FLOP/s large matmuls on ``path`` sustain: the peak times the preset's
        published fraction (1 where none is known)."""
        fractions = dict(self.matmul_efficiency)
        base = path.split("x")[0]
        return self.matmul_peak(path) * fractions.get(base, fractions.get("bf16", 1.0))

    def under_xla(self) -> "Hardware":
        """The chip as a program XLA compiled runs on it: its matmul fractions replaced by
        XLA's measured ones (``xla_matmul_efficiency``) where it has them."""
        if not self.xla_matmul_efficiency:
            return self
        return replace(self, matmul_efficiency=tuple(
            {**dict(self.matmul_efficiency), **dict(self.xla_matmul_efficiency)}.items()))

    def sustained_attention_flops(self, attention_pass, path: str) -> float:
        """The FLOP/s a fused attention kernel's ``attention_pass`` (``'forward'``,
        ``'backward'``, or None for any other product) sustains on ``path``: the preset's
        measured fraction of the 16-bit peak where it has one for that pass and ``path`` is
        bf16 or fp16 (what was measured), else a large matmul's rate."""
        fraction = dict(self.attention_efficiency).get(attention_pass)
        if fraction is None or path not in ("bf16", "fp16"):
            return self.sustained_matmul_flops(path)
        return self.matmul_peak(path) * fraction

    @property
    def sustained_hbm_bandwidth(self) -> float:
        """The HBM bytes/s streaming kernels sustain (the peak where no fraction is known)."""
        return self.hbm_bandwidth * (self.memory_efficiency or 1.0)

    @property
    def vector_flops(self) -> float:
        """FLOP/s of the elementwise units (a GPU's CUDA cores: its FP32 rate; a CPU
        measured by :func:`simpmd.jax.device_programs.measure_cpu`: its own)."""
        return self.elementwise_flops or self.peak_fp32_flops or self.peak_bf16_flops

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
        GPU: one NVLink switch, at most ``node_size`` devices. More devices than one node
        (GPU) or one pod (TPU, a count) hold become a :meth:`cluster` of whole nodes.
        """
        n = int(shape) if np.ndim(shape) == 0 else math.prod(shape)
        most = self.node_size if self.torus_rank is None else self.pod_size
        if most is not None and n > most and (self.torus_rank is None or np.ndim(shape) == 0):
            return self.cluster(-(-n // most))
        if self.torus_rank is None:
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

    def cluster(self, nodes: int, node=None, adapters: int | None = None,
                adapter_bandwidth: float | None = None):
        """``nodes`` GPU nodes (or TPU slices) of this hardware on its network between
        nodes: a :class:`~simpmd.cost.cluster.Cluster`. ``node`` is one node's device
        count or shape (default: a full node of ``node_size``, or a full TPU pod).
        ``adapters`` and ``adapter_bandwidth`` (bytes/s each way) describe a node other than
        the preset's DGX-style rails, e.g. 4 x 100 Gb/s for 8 GPUs: each device then gets
        adapters x adapter_bandwidth / devices of the node."""
        if self.scale_out_bandwidth is None:
            raise ValueError(
                f"{self.name}: no network between nodes is modelled for this preset (a "
                f"group must fit one node of {self.node_size or self.pod_size}); build a "
                f"simpmd.cost.Cluster(node, nodes, scale_out_bandwidth=..., "
                f"scale_out_latency=...) to give one")
        size = node if node is not None else (self.node_size or self.pod_size)
        inner = self.topology(size)
        network = "InfiniBand" if self.torus_rank is None else "DCN"
        share = self.scale_out_bandwidth
        if adapters is not None or adapter_bandwidth is not None:
            if adapters is None or adapter_bandwidth is None:
                raise ValueError("give both adapters= (per node) and adapter_bandwidth= "
                                 "(bytes/s each way, per adapter)")
            share = adapters * adapter_bandwidth / inner.size
        return Cluster(inner, nodes, scale_out_bandwidth=share,
                       scale_out_latency=self.scale_out_latency, name=self.name,
                       network=network, scale_out_efficiency=self.scale_out_efficiency,
                       nvlink_sharp=self.nvlink_sharp,
                       call_latency=self.kernel_launch_s if self.torus_rank is None else 0.0)

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
        if self.scale_out_bandwidth:
            lines.append(f"  between nodes    {self.scale_out_bandwidth / 1e9:g} GB/s per device "
                         f"({self.scale_out_efficiency:.0%} reached), "
                         f"{self.scale_out_latency * 1e6:g} us per step")
        for path, flops in self.matmul_peaks:
            lines.append(f"  matmul {path:5s}     {flops / 1e12:g} TFLOP/s peak, sustained "
                         f"{self.sustained_matmul_flops(path) / 1e12:.4g}")
        for attention_pass, _ in self.attention_efficiency:
            lines.append(f"  fused attention  {attention_pass}, sustained "
                         f"{self.sustained_attention_flops(attention_pass, 'bf16') / 1e12:.4g}"
                         f" TFLOP/s (bf16)")
        if self.memory_efficiency:
            lines.append(f"  HBM sustained    {self.sustained_hbm_bandwidth / 1e12:.4g} TB/s")
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

_A100_40GB = ("NVIDIA A100 Tensor Core GPU datasheet (SXM 40GB, the part Colab's A100 runtime "
              "has): HBM2 1,555 GB/s; NVLink 600 GB/s; BF16 312, TF32 156, FP32 19.5 TFLOPS dense")
_L4 = ("NVIDIA L4 Tensor Core GPU datasheet: FP32 30.3 TFLOPS; TF32 120, BF16/FP16 242, FP8 485 "
       "TFLOPS with sparsity (half that dense: 60, 121, 242.5); GDDR6 300 GB/s; PCIe Gen4 x16 "
       "64 GB/s (both directions together)")
_T4 = ("NVIDIA T4 Tensor Core GPU datasheet: FP32 8.1 TFLOPS, mixed FP16/FP32 65 TFLOPS, INT8 "
       "130 TOPS, GDDR6 320 GB/s, PCIe Gen3 x16 32 GB/s (both directions together); Turing "
       "(sm_75) tensor cores take FP16 and INT8, neither bfloat16 nor TF32, so XLA runs a "
       "bf16 or f32 dot at the FP32 rate")
_PCIE_NODE = ("PCIe cards: up to 8 in one host, the devices joined through the host's PCIe "
              "(an assumption: a cloud VM's count varies; no NVLink)")

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
        aliases=("NVIDIA H100", "H100 SXM")),
    "H200": Hardware(
        "H200", "NVLink 4.0 + NVSwitch", link_bandwidth=25e9, links_per_device=18,
        hop_latency=1e-6, hbm_bandwidth=4.8e12, peak_bf16_flops=9.9e14, peak_fp32_flops=6.7e13, node_size=8,
        citations=(_BOOK_GPU, "NVIDIA H200 datasheet (SXM): NVLink 900 GB/s (both directions "
                   "together), HBM3e 4.8 TB/s, FP32 67 TFLOPS", _NCCL_LATENCY), aliases=("NVIDIA H200",)),
    "B200": Hardware(
        "B200", "NVLink 5.0 + NVSwitch", link_bandwidth=50e9, links_per_device=18,
        hop_latency=1e-6, hbm_bandwidth=8e12, peak_bf16_flops=2.25e15, peak_fp32_flops=7.5e13, node_size=8,
        citations=(_B200, _NCCL_LATENCY), aliases=("NVIDIA B200",)),
    "A100 40GB": Hardware(
        "A100 40GB", "NVLink 3.0 + NVSwitch", link_bandwidth=25e9, links_per_device=12,
        hop_latency=1e-6, hbm_bandwidth=1.555e12, peak_bf16_flops=3.12e14,
        peak_fp32_flops=1.95e13, node_size=8,
        citations=(_A100_40GB, _NCCL_LATENCY),
        aliases=("A100-SXM4-40GB", "A100 40GB SXM", "NVIDIA A100-SXM4-40GB")),
    "L4": Hardware(
        "L4", "PCIe Gen4 x16", link_bandwidth=32e9, links_per_device=1, hop_latency=1e-6,
        hbm_bandwidth=3e11, peak_bf16_flops=1.21e14, peak_fp32_flops=3.03e13, node_size=8,
        citations=(_L4, _PCIE_NODE, _NCCL_LATENCY), aliases=("NVIDIA L4",)),
    "T4": Hardware(
        "T4", "PCIe Gen3 x16", link_bandwidth=16e9, links_per_device=1, hop_latency=1e-6,
        hbm_bandwidth=3.2e11, peak_bf16_flops=8.1e12, peak_fp32_flops=8.1e12, node_size=8,
        citations=(_T4, _PCIE_NODE, _NCCL_LATENCY), aliases=("Tesla T4", "NVIDIA T4")),
    "CPU": Hardware(
        "CPU", "toy: processes on one switch", link_bandwidth=1e10, links_per_device=1,
        hop_latency=1e-5, hbm_bandwidth=5e10, peak_bf16_flops=1e12, peak_fp32_flops=1e12,
        citations=("Invented round numbers for a slow toy machine, not a measurement: "
                   "10 GB/s, 10 us, 50 GB/s memory, 1 TFLOP/s",)),
}


# -- what each chip does with a program (simpmd.cost.predict) and between nodes -----------
# Every number from a published source, none chosen from the measurements
# tests/cost/test_predictions_vs_measured.py holds (docs/benchmarks.md, "Predicted against
# measured"). Where a preset has no source of its own, the note says whose number it takes.

_MAMF = ("S. Bekman, 'Machine Learning Engineering', compute/accelerator/README.md, 'Maximum "
         "Achievable Matmul FLOPS comparison table' (https://github.com/stas00/ml-engineering): "
         "the best mean torch.matmul TFLOPS over a search of shapes; BF16: A100 SXM 271.2 of 312 "
         "(86.9%), H100 SXM 794.5 of 989 (80.3%, 'H200 is the same'), B200 1745 of 2250 (77.6%); "
         "FP8: H100 SXM 1402.6 of 1979 (70.9%), H200 1453.4 (73.4%), B200 3432.5 of 4500 (76.3%). "
         "TF32 and FP32 dots take the BF16 fraction (no published figure found)")
# XLA's own bf16 GEMMs on Hopper: jax.jit of a 4096x8192 @ 8192x28672 product timed on an
# H200 with jax 0.11.2 (docs/DESIGN.md, 'What XLA runs, measured on a real H200';
# simpmd.jax.device_programs.RECORDED): 2.89 ms, less the preset's 31.5 us call floor, is
# 673 TFLOP/s, 68.0% of the preset's 990 (8192^3 reached 64.2%: the larger is taken, as
# _MAMF's is the best of its shapes); the H100 has the H200's SMs and clocks
_XLA_HOPPER_BF16 = 2 * 4096 * 8192 * 28672 / (2.89e-3 - 3.15e-5) / 9.9e14  # of the peak
_XLA_H200 = ("XLA's GEMMs (programs jit-compiled by XLA, framework 'xla'): a bf16 4096x8192 @ "
             "8192x28672 product under jax.jit on an H200, jax 0.11.2, 2026-11-28 (issue 36; "
             "docs/DESIGN.md): 2.89 ms, 673 TFLOP/s after the 31.5 us call floor, 68.0% of the "
             "preset's 990 (8192^3: 1.76 ms, 64.2%), where torch.matmul's best shape in Bekman's "
             "table reaches 80.3%; taken for the H100 too (the same SMs); FP8 keeps Bekman's "
             "fraction (no XLA measurement of it)")
_MAMF_V5E = ("JAX docs, Pallas TPU 'Matrix Multiplication' guide (docs/pallas/tpu/matmul.ipynb, "
             "https://docs.jax.dev/en/latest/pallas/tpu/matmul.html): XLA's bf16 8192^3 matmul on "
             "a TPU v5e reaches 92.3% of the 197 TFLOP/s peak; the other TPUs take v5e's fraction "
             "(no published figure found); 1024^3 timed from Python takes 119 us where the math "
             "is 11 us: about 108 us to dispatch a call and wait for it")
_ATTENTION_H100 = (
    "Fused attention (simpmd.plan's flash_attention and its backward): cuDNN's, the kernel "
    "Transformer Engine runs on Hopper (from v1.5, DotProductAttention disables "
    "flash-attn on compute capability 9.0 when cuDNN's F16_arbitrary_seqlen backend "
    "applies, 'for performance'). Shah et al. 2024, 'FlashAttention-3' (arXiv:2407.08608), "
    "H100 80GB SXM5, BF16/FP16, head dim 128, 16k tokens a batch, FLOPs counted as "
    "4 x seqlen^2 x head dim x heads forward (halved with the causal mask), 2.5 times that "
    "backward: Figure 5(d), forward with the causal mask (also Dao-AILab/flash-attention's "
    "assets/flash3_fp16_fwd.png), cuDNN 484 / 518 / 529 TFLOP/s at "
    "sequence 2k / 4k / 8k; Figure 6(b), backward without a causal mask (the paper gives no "
    "causal backward), cuDNN 465 / 499 / 518. simpmd takes the 4k column, the NeMo runs' "
    "queries per GPU: 518 and 499 of 989 dense (52.4% forward, 50.5% backward); the "
    "other presets but Blackwell's (_ATTENTION_B200) time attention as a large matmul (no "
    "source read for them)")
_ATTENTION_B200 = (
    "Fused attention on Blackwell (B200, GB200): cuDNN's, as Transformer Engine runs it. "
    "Zadouri, Dao et al. 2026, 'FlashAttention-4' (arXiv:2603.05451), abstract: on B200 in "
    "BF16 FlashAttention-4 reaches 'up to 1613 TFLOPs/s (71% utilization)' and 'up to 1.3x "
    "speedup over cuDNN 9.13': simpmd takes cuDNN at 1613 / 1.3 = 1,241 TFLOP/s of the "
    "2,250 dense (55.1%; GB200 the same fraction of its 2,500) for the forward pass, and for "
    "the backward pass too (no backward "
    "figure read; on H100 cuDNN's backward is within 4% of its forward, _ATTENTION_H100)")
_HBM_H100 = ("HBM sustained: NVBench device-to-device copy on an 8 x H100 80GB HBM3 node, 2,903 "
             "GB/s of 3,350 (86.7%), its best at a 13 MB transfer (Voltage Park and Georgia Tech, "
             "github.com/ZiyanIshani/vpbenchmarking, results/stream_nvbench/"
             "stream_nvbench_summary.md); the other NVIDIA presets take the H100's fraction (no "
             "published figure of their own found); TPUs: peak (none found)")
_LAUNCH_GPU = ("Kernel floor: 'about 4-6 us' for the CPU to submit one kernel through the driver "
               "and runtime ('pegainfer (3): From Launch Overhead to CUDA Graph', "
               "https://susun-blog.com/blog/pegainfer-3-cuda-graph, RTX 5070 Ti, CUDA 13.0): "
               "simpmd charges a fused kernel at least 4 us")
_DISPATCH_GPU = ("Call floor: JAX's dispatch benchmarks (https://github.com/jax-ml/jax/pull/4128): "
                 "calling a trivial jitted function and waiting for its result took 31.5 us "
                 "('jit_trivial'), the call alone 28.9 us")
_IB_NDR = ("Between nodes: DGX H100, DGX H200 and DGX B200 datasheets, 8 single-port ConnectX-7 "
           "400 Gb/s InfiniBand NICs per 8-GPU system, one per GPU (rails): 50 GB/s per GPU each "
           "way; NCCL reaches 94% of it: its developers expect '46-48GB/s per NIC' of NDR in "
           "nccl-tests (https://github.com/NVIDIA/nccl-tests/issues/290), 47 of 50")
_IB_HDR = ("Between nodes: DGX A100 datasheet, 8 single-port ConnectX-6 200 Gb/s HDR InfiniBand "
           "NICs for the compute fabric, one per GPU: 25 GB/s per GPU each way; NDR's 94% "
           "assumed reached (no published per-NIC figure for HDR found)")
_NET_STEP = ("A step across InfiniBand: 14 us, NCCL's tuning model for a ring step over the "
             "network with its Simple protocol (NVIDIA/nccl src/graph/tuning.cc at 5067397, "
             "ncclTunerConstantsDefaults.hwLatencies[NET][Ring][Simple]); the model's other "
             "constants are simpmd.cost.network.NCCL_TUNING's")
_NVLS = ("NVLink SHARP (NVLS): NCCL's efficiency of the in-switch reduction, 0.85 on Hopper and "
         "0.74 on Blackwell (NVIDIA/nccl src/graph/tuning.cc at 5067397, nvlsEfficiency)")
_DCN = ("Between slices (DCN): Cloud TPU docs 'TPU v5e' (https://cloud.google.com/tpu/docs/v5e), "
        "2 x 100 Gbps NICs per host of 8 chips: 3.125 GB/s per chip each way; the Scaling Book "
        "(Part 2, 'TPU Specs') puts DCN at about 2.5e10 bytes/s per host, whose 'host size' is "
        "2x2x1 (4 chips) on v4p/v5p: 6.25 GB/s per chip; 10 us per step, an assumption (no "
        "published figure found)")
_POD = ("Pod sizes: Scaling Book Part 2 'TPU Specs' table: v3 32x32, v4p 16x16x16, v5p "
        "16x20x28, v5e and v6e 16x16; v2 16x16 (Jouppi et al. 2020)")
_PRECISION = ("Precision: jax.lax.Precision's docstring: on TPU a float32 dot at DEFAULT is one "
              "bfloat16 pass, HIGH 3 passes, HIGHEST 6; on GPU DEFAULT and HIGH use TF32 where "
              "the chip has it (A100, H100), HIGHEST float32")
_PATHS_H100 = ("NVIDIA H100 and H200 datasheets (SXM): TF32 989 TFLOPS, FP8 3,958, INT8 3,958 "
               "TOPS, all with sparsity (dense: half)")
_PATHS_A100 = "NVIDIA A100 datasheet: TF32 156 TFLOPS dense, INT8 624 TOPS dense; no FP8"
_PATHS_B200 = ("NVIDIA DGX B200 datasheet: FP8 training 72 PFLOPS and TF32 18 PFLOPS per 8 GPUs, "
               "with sparsity: 4.5 and 1.1 PFLOPS dense per GPU")
_PATHS_TPU = "int8: the Scaling Book's Part 2 table (FLOPs/s/chip int8); no fp8 on these chips"

_HOPPER = (("tf32", 4.947e14), ("fp8", 1.979e15), ("int8", 1.979e15))
_AMPERE = (("tf32", 1.56e14), ("int8", 6.24e14))
_GPU_FLOORS = dict(kernel_launch_s=4e-6, dispatch_s=3.15e-5, memory_efficiency=0.867)
_TPU_FLOORS = dict(kernel_launch_s=0.0, dispatch_s=1.08e-4, matmul_efficiency=(("bf16", 0.923),))


def _tpu(int8, chips_per_host, pod):
    return dict(matmul_peaks=(("int8", int8),), pod_size=pod,
                scale_out_bandwidth=2.5e10 / chips_per_host, scale_out_latency=1e-5,
                **_TPU_FLOORS)


_MACHINE = {
    "TPU v2": (_tpu(4.6e13, 8, 256), (_PRECISION, _MAMF_V5E, _DCN, _POD)),
    "TPU v3": (_tpu(1.4e14, 8, 1024), (_PRECISION, _MAMF_V5E, _DCN, _POD, _PATHS_TPU)),
    "TPU v4": (_tpu(2.75e14, 4, 4096), (_PRECISION, _MAMF_V5E, _DCN, _POD, _PATHS_TPU)),
    "TPU v5p": (_tpu(9.18e14, 4, 8960), (_PRECISION, _MAMF_V5E, _DCN, _POD, _PATHS_TPU)),
    "TPU v5e": (dict(_tpu(3.94e14, 8, 256), scale_out_bandwidth=3.125e9),
                (_PRECISION, _MAMF_V5E, _DCN, _POD, _PATHS_TPU)),
    "TPU v6e": (_tpu(1.84e15, 8, 256), (_PRECISION, _MAMF_V5E, _DCN, _POD, _PATHS_TPU)),
    "A100": (dict(matmul_peaks=_AMPERE, matmul_efficiency=(("bf16", 0.869),),
                  scale_out_bandwidth=2.5e10, scale_out_latency=1.4e-5,
                  scale_out_efficiency=0.94, **_GPU_FLOORS),
             (_PRECISION, _PATHS_A100, _MAMF, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU, _IB_HDR,
              _NET_STEP)),
    "A100 40GB": (dict(matmul_peaks=_AMPERE, matmul_efficiency=(("bf16", 0.869),),
                       scale_out_bandwidth=2.5e10, scale_out_latency=1.4e-5,
                  scale_out_efficiency=0.94, **_GPU_FLOORS),
                  (_PRECISION, _PATHS_A100, _MAMF, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU,
                   _IB_HDR, _NET_STEP)),
    "H100": (dict(matmul_peaks=_HOPPER, matmul_efficiency=(("bf16", 0.803), ("fp8", 0.709)),
                  xla_matmul_efficiency=(("bf16", _XLA_HOPPER_BF16),),
                  attention_efficiency=(("forward", 518 / 989), ("backward", 499 / 989)),
                  scale_out_bandwidth=5e10, scale_out_latency=1.4e-5, scale_out_efficiency=0.94,
                  nvlink_sharp=0.85, **_GPU_FLOORS),
             (_PRECISION, _PATHS_H100, _MAMF, _XLA_H200, _ATTENTION_H100, _HBM_H100, _LAUNCH_GPU,
              _DISPATCH_GPU, _IB_NDR, _NET_STEP, _NVLS)),
    "H200": (dict(matmul_peaks=_HOPPER, matmul_efficiency=(("bf16", 0.803), ("fp8", 0.734)),
                  xla_matmul_efficiency=(("bf16", _XLA_HOPPER_BF16),),
                  scale_out_bandwidth=5e10, scale_out_latency=1.4e-5, scale_out_efficiency=0.94,
                  nvlink_sharp=0.85, **_GPU_FLOORS),
             (_PRECISION, _PATHS_H100, _MAMF, _XLA_H200, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU,
              _IB_NDR,
              _NET_STEP, _NVLS)),
    "B200": (dict(matmul_peaks=(("tf32", 1.1e15), ("fp8", 4.5e15), ("int8", 4.5e15)),
                  matmul_efficiency=(("bf16", 0.776), ("fp8", 0.763)),
                  attention_efficiency=(("forward", 1613 / 1.3 / 2250),
                                        ("backward", 1613 / 1.3 / 2250)),
                  scale_out_bandwidth=5e10, scale_out_latency=1.4e-5, scale_out_efficiency=0.94,
                  nvlink_sharp=0.74, **_GPU_FLOORS),
             (_PRECISION, _PATHS_B200, _MAMF, _ATTENTION_B200, _HBM_H100, _LAUNCH_GPU,
              _DISPATCH_GPU, _IB_NDR,
              _NET_STEP, _NVLS)),
    "L4": (dict(matmul_peaks=(("tf32", 6.0e13), ("fp8", 2.425e14), ("int8", 2.425e14)),
                **_GPU_FLOORS),
           (_PRECISION, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU,
            "L4, T4: no published matmul fraction found: their peaks")),
    "T4": (dict(matmul_peaks=(("fp16", 6.5e13), ("int8", 1.3e14)),
                **_GPU_FLOORS),
           (_PRECISION, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU)),
    "CPU": (dict(dispatch_s=1e-5), ("Toy call floor: 10 us, an invented round number",)),
}
HARDWARE = {name: replace(hw, citations=hw.citations + _MACHINE[name][1], **_MACHINE[name][0])
            for name, hw in HARDWARE.items()}

# -- the other Hopper and Blackwell parts (simpmd.plan's presets of issue 44) -------------
# Their chips' numbers from NVIDIA's datasheets; their network fields (links, latency,
# the network between nodes, the floors) copied from the closest preset, as named.

_H100_PCIE = ("NVIDIA H100 PCIe product brief PB-11133-001_v02 (November 2022): 350 W, HBM2e "
              "'greater than 2,000 gigabytes per second'; NVIDIA H100 datasheet, PCIe column "
              "(as hpctech.co.jp's copy of it lists): 80 GB HBM2e at 2,000 GB/s, FP32 51 TFLOPS, "
              "TF32 756, BF16 1,513, FP8 3,026 TFLOPS with sparsity (half dense), 300-350 W, "
              "NVLink bridge 600 GB/s, PCIe Gen5 128 GB/s")
_H100_NVL = ("NVIDIA H100 datasheet, H100 NVL column: 94 GB HBM3 at 3.9 TB/s, FP32 60 TFLOPS, "
             "TF32 835, BF16 1,671, FP8 3,341 TFLOPS with sparsity (half dense), 350-400 W, "
             "NVLink bridge 600 GB/s (pairs of cards), PCIe Gen5 128 GB/s")
_H100_96 = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md (commit 31a17bf): "
            "Grand Teton's H100 'is equipped with 96GB HBM2e with 2.4 TB/sec peak memory "
            "bandwidth', run at 'the default 500W power limit'; its footnote: the part is an "
            "'HBM2e-based SXM H100 with lower TDP, the actual peak TFLOPs number is between "
            "SXM and NVL, and we don't know its exact value'. simpmd takes the middle of that "
            "range: (989 + 835.5) / 2 = 912 TFLOPS dense BF16 (NVIDIA H100 datasheet, SXM and "
            "NVL columns), FP8 and TF32 in the same proportion")
_GH200 = ("NVIDIA GH200 Grace Hopper Superchip datasheet: the H100 of a GH200 has 96 GB of HBM3 "
          "at 4 TB/s, with the H100 SXM's compute (FP8 3,958 TFLOPS, BF16 1,979 with "
          "sparsity) and 900 GB/s NVLink")
_GB200 = ("NVIDIA GB200 NVL72 datasheet, per rack of 72 Blackwell GPUs: HBM3e 13.4 TB at 576 "
          "TB/s (186 GB and 8 TB/s per GPU), FP8 720 PFLOPS, FP16/BF16 360 PFLOPS, TF32 180 "
          "PFLOPS with sparsity (5, 2.5 and 1.25 PFLOPS dense per GPU), FP32 5,760 TFLOPS "
          "(80 per GPU), fifth-generation NVLink 130 TB/s (1.8 TB/s per GPU, 18 links) in one "
          "NVLink domain of 72 GPUs")
_H100_96_PEAK = (9.89e14 + 8.355e14) / 2     # _H100_96: between the SXM's and the NVL's
_COPIED = "network fields (links, latency, the network between nodes, floors) copied from "

HARDWARE.update({
    "H100 PCIe": replace(
        HARDWARE["H100"], name="H100 PCIe", interconnect="PCIe Gen5 x16 (NVLink bridge pairs)",
        link_bandwidth=HARDWARE["L4"].link_bandwidth * 2, links_per_device=1,
        hbm_bandwidth=2.0e12, peak_bf16_flops=7.565e14, peak_fp32_flops=5.1e13,
        matmul_peaks=(("tf32", 3.78e14), ("fp8", 1.513e15), ("int8", 1.513e15)),
        attention_efficiency=(), measured=(),
        citations=(_H100_PCIE, _COPIED + "H100 (SXM), the PCIe link as the L4's at Gen5's "
                   "double rate", _PRECISION, _MAMF, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU,
                   _IB_NDR, _NET_STEP),
        aliases=("NVIDIA H100 PCIe", "H100-PCIE-80GB")),
    "H100 NVL": replace(
        HARDWARE["H100"], name="H100 NVL", interconnect="PCIe Gen5 x16 (NVLink bridge pairs)",
        link_bandwidth=HARDWARE["L4"].link_bandwidth * 2, links_per_device=1,
        hbm_bandwidth=3.9e12, peak_bf16_flops=8.355e14, peak_fp32_flops=6.0e13,
        matmul_peaks=(("tf32", 4.175e14), ("fp8", 1.6705e15), ("int8", 1.6705e15)),
        attention_efficiency=(), measured=(),
        citations=(_H100_NVL, _COPIED + "H100 (SXM), the PCIe link as the H100 PCIe's",
                   _PRECISION, _MAMF, _HBM_H100, _LAUNCH_GPU, _DISPATCH_GPU, _IB_NDR,
                   _NET_STEP),
        aliases=("NVIDIA H100 NVL", "H100 94GB")),
    "H100 96GB": replace(
        HARDWARE["H100"], name="H100 96GB", hbm_bandwidth=2.4e12,
        peak_bf16_flops=_H100_96_PEAK, peak_fp32_flops=6.7e13 * _H100_96_PEAK / 9.89e14,
        matmul_peaks=tuple((path, peak * _H100_96_PEAK / 9.89e14) for path, peak in _HOPPER),
        measured=(),
        citations=(_H100_96, _COPIED + "H100 (SXM)") + HARDWARE["H100"].citations[1:],
        aliases=("H100 96 GB", "H100 HBM2e")),
    "GH200": replace(
        HARDWARE["H100"], name="GH200", hbm_bandwidth=4.0e12, measured=(),
        citations=(_GH200, _COPIED + "H100 (SXM)") + HARDWARE["H100"].citations[1:],
        aliases=("NVIDIA GH200", "GH200 96GB")),
    "GB200": replace(
        HARDWARE["B200"], name="GB200", hbm_bandwidth=8e12, peak_bf16_flops=2.5e15,
        peak_fp32_flops=8e13, node_size=72,
        matmul_peaks=(("tf32", 1.25e15), ("fp8", 5e15), ("int8", 5e15)),
        citations=(_GB200, _COPIED + "B200 (its NVLink 5 links; the NVLink domain of 72 GPUs "
                   "is the datasheet's)", _PRECISION, _MAMF, _ATTENTION_B200, _HBM_H100, _LAUNCH_GPU,
                   _DISPATCH_GPU, _IB_NDR, _NET_STEP),
        aliases=("NVIDIA GB200", "GB200 NVL72")),
})
# The H800 (issue 48): the H100 SXM for China, its NVLink cut to 400 GB/s.
_H800 = ("NVIDIA H800 Tensor Core GPU datasheet (SXM): 80 GB HBM3 at 3.35 TB/s, FP8 3,958 "
         "TFLOPS and BF16 1,979 TFLOPS with sparsity (the H100 SXM's), NVLink 400 GB/s (both "
         "directions together: 8 of the H100's 18 links, 200 GB/s each way); DeepSeek-AI, "
         "'DeepSeek-V3 Technical Report' (arXiv:2412.19437, 2024), section 3.2.2: in its H800 "
         "cluster 'NVLink offers a bandwidth of 160 GB/s, roughly 3.2 times that of IB (50 "
         "GB/s)', eight GPUs a node (section 3.1), InfiniBand across nodes: the H100's "
         "400 Gb/s NDR per GPU")
HARDWARE["H800"] = replace(
    HARDWARE["H100"], name="H800", links_per_device=8, measured=(),
    citations=(_H800, _COPIED + "H100 (SXM), but its NVLink links") + HARDWARE["H100"].citations[1:],
    aliases=("NVIDIA H800", "H800 SXM"))
# Google Cloud's A3 High VM (a3-highgpu-8g): eight H100 SXM, whose network between VMs is
# not a DGX H100's eight 400 Gb/s adapters.
_A3_HIGH = ("Google Cloud, 'Networking and GPU machines' "
            "(cloud.google.com/compute/docs/gpus/gpu-network-bandwidth), its overview table: "
            "A3 High, NVIDIA H100 80GB, 1,000 Gbps maximum total bandwidth, GPUDirect-TCPX "
            "(A3 Mega 1,800 Gbps, A3 Ultra 3,600 Gbps). Taken whole for the GPUs: 1,000 / 8 = "
            "125 Gb/s = 15.6 GB/s per GPU per direction, an upper bound (part of it is the "
            "VM's general-purpose NIC); xpk's device type 'h100-80gb-8' is a3-highgpu-8g "
            "(AI-Hypercomputer/xpk, its system characteristics)")
HARDWARE["H100 A3 High"] = replace(
    HARDWARE["H100"], name="H100 A3 High", scale_out_bandwidth=1e12 / 8 / 8,
    citations=(_A3_HIGH, "every field but the bandwidth between VMs copied from H100 (SXM), "
               "the latency and efficiency of its InfiniBand among them (none published for "
               "TCPX)") + tuple(c for c in HARDWARE["H100"].citations[1:] if c is not _IB_NDR),
    aliases=("a3-highgpu-8g", "A3 High", "h100-80gb-8"))
# The capacity of each new part's HBM, bytes (the datasheets above).
NEW_HBM = {"H100 PCIe": 80e9, "H100 NVL": 94e9, "H100 96GB": 96e9, "GH200": 96e9,
           "GB200": 186e9, "H800": 80e9, "H100 A3 High": 80e9}


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



# What jax.devices()[0].device_kind says on each chip -> the preset (first match wins).
_DEVICE_KINDS = (("gh200", "GH200"), ("h200", "H200"), ("h100 nvl", "H100 NVL"),
                 ("h100 pcie", "H100 PCIe"), ("h100", "H100"), ("h800", "H800"),
                 ("gb200", "GB200"), ("b200", "B200"),
                 ("a100", None), ("l4", "L4"), ("t4", "T4"), ("tpu v6 lite", "TPU v6e"),
                 ("tpu v6e", "TPU v6e"), ("tpu v5 lite", "TPU v5e"), ("tpu v5e", "TPU v5e"),
                 ("tpu v5p", "TPU v5p"), ("tpu v5", "TPU v5p"), ("tpu v4", "TPU v4"),
                 ("tpu v3", "TPU v3"), ("tpu v2", "TPU v2"))


def preset_for_device_kind(kind: str):
    """The preset for a device's ``device_kind`` ("NVIDIA H100 80GB HBM3", "Tesla T4",
    "TPU v5 lite"), or None when none matches (a CPU, a chip simpmd has no preset for)."""
    text = str(kind).lower()
    for key, name in _DEVICE_KINDS:
        if key in text:
            if key == "a100":
                return "A100 40GB" if "40gb" in text.replace(" ", "") else "A100"
            return name
    return None
