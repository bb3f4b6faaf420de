"""``plan.estimate``: a training step simulated on shapes, costed, and summed up.

The step of :mod:`simpmd.plan.step` runs as ``simpmd.shard_map`` over the layout's mesh
on ``ShapeDtypeStruct`` s (nothing is computed; every device's program, collectives
included, is traced and typed), then its program is costed as any program is: scheduled
on one device's streams for the time (:func:`simpmd.cost.predict.predict`, the products
of weights at the run's precision, the loop over the pipeline's ticks named so that its
idle ticks are the bubble), and walked kernel by kernel for the memory
(:func:`simpmd.cost.memory.peak_memory` with ``fused=True``; the step donates its
arguments, as a training step does).

Memory is read off a second program, the same step with as many micro-batches as the
schedule keeps in flight: a 1F1B schedule (Narayanan et al. 2021) starts each
micro-batch's backward pass as soon as it can, so the first stage holds the activations
of ``pp * vp + pp - 1`` virtual stages' worth of ticks with the interleaved schedule and
of one micro-batch through all its layers without it, which is what the SPMD pipeline
holds with ``pp`` micro-batches (interleaved) or one. The SPMD program itself, run as
one forward and one backward scan, would keep every micro-batch's (GPipe's memory).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math

import numpy as np

from ..api.shapes import ShapeDtypeStruct
from ..api.shard_map import shard_map
from ..cost.hardware import SLICE_SHAPES, hardware_preset
from ..cost.memory import peak_memory
from ..cost.predict import predict
from ..cost.walk import Walker
from ..machine import devices as _devices
from ..machine.mesh import Mesh
from . import step as St
from .interval import VALIDATED, interval
from .layout import Layout, LayoutError, check

# HBM per chip, bytes: each vendor's table.
HBM_CAPACITY = {
    "TPU v5p": 95e9,      # cloud.google.com/tpu/docs/v5p: "HBM2e capacity ... 95 GB"
    "TPU v5e": 16e9,      # cloud.google.com/tpu/docs/v5e: "HBM2 capacity ... 16 GB"
    "TPU v4": 32 * 2**30,  # cloud.google.com/tpu/docs/v4: 32 GiB of HBM per chip
    "TPU v6e": 32e9,      # cloud.google.com/tpu/docs/v6e: 32 GB of HBM per chip
    "A100": 80e9,         # NVIDIA A100 datasheet, SXM 80GB
    "A100 40GB": 40e9,
    "H100": 80e9,         # NVIDIA H100 datasheet, SXM: 80 GB
    "H200": 141e9,        # NVIDIA H200 datasheet: 141 GB
    "B200": 180e9,        # NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs
    "L4": 24e9,           # NVIDIA L4 datasheet: 24 GB GDDR6
    "T4": 16e9,           # NVIDIA T4 datasheet: 16 GB GDDR6
}
LARGEST_V5P = (16, 16, 24)   # cloud.google.com/tpu/docs/v5p: the largest slice, 6,144 chips
# The path of the products of weights; in FP8 the program's casts say which run in FP8.
PATHS = {"bf16": "bf16", "fp16": "fp16", "fp8": None}
FRAMEWORKS = ("xla", "megatron")


@dataclass(frozen=True)
class Estimate:
    """What :func:`estimate` found for one layout: seconds per step and where they go
    (``breakdown``, the prediction's terms: compute, memory, recomputation, exposed
    communication, the pipeline's bubble and kernel launches, which add up to
    ``step_s``), the most bytes one device holds at once (``peak_bytes``) against its
    HBM, and the rates that follow."""

    model: object
    layout: Layout
    hardware: str
    precision: str
    step_s: float
    breakdown: dict
    peak_bytes: int
    hbm_bytes: float
    peak_flops: float
    collectives: tuple = ()
    communication_s: float = 0.0      # every collective's time in the step, hidden or not
    flops: float = 0.0                # what one device computes in the step
    interval_s: tuple = (0.0, math.inf)   # where the measured step should lie (.interval)
    validation_runs: int = 0          # development runs of its family behind interval_s

    @property
    def chips(self) -> int:
        return self.layout.chips

    @property
    def tokens_per_step(self) -> int:
        return self.layout.global_batch * self.model.seq

    @property
    def tokens_per_s_per_chip(self) -> float:
        return self.tokens_per_step / self.step_s / self.chips

    @property
    def mfu(self) -> float:
        """Model FLOPs (PaLM's 6N + 12LHQT per token) per second over the chips' peak at
        the step's precision."""
        return (self.model.flops_per_token() * self.tokens_per_s_per_chip) / self.peak_flops

    def days(self, tokens: float) -> float:
        """Days to train on ``tokens`` tokens at this rate."""
        return tokens / (self.tokens_per_s_per_chip * self.chips) / 86400

    @property
    def products_s(self) -> float:
        """Seconds of matrix products (recomputation included)."""
        return self.breakdown["compute"] + self.breakdown["recompute"]

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.hbm_bytes

    def __str__(self):
        parts = ", ".join(f"{k} {v:.3g} s" for k, v in self.breakdown.items()
                          if v > 5e-4 * self.step_s)
        return (f"{self.model.name or 'model'} on {self.chips} x {self.hardware} "
                f"({self.precision}), {self.layout}:\n"
                f"  step {self.step_s:.3g} s ({parts})\n"
                f"  measured step expected in {self.interval_s[0]:.3g}-"
                f"{self.interval_s[1]:.3g} s ({self.validation_runs} development "
                f"run{'s' * (self.validation_runs != 1)} of its family"
                + ("" if self.validation_runs >= VALIDATED else
                   "; unvalidated here: a pooled spread, widened") + ")\n" +
                f"  {self.tokens_per_s_per_chip:,.0f} tokens/s per chip, MFU {self.mfu:.1%}\n"
                f"  peak memory {self.peak_bytes / 1e9:.1f} GB per chip of "
                f"{self.hbm_bytes / 1e9:.0f} GB")


def _slice_shape(hw, chips: int, slices: int):
    """The torus of one TPU slice of ``chips / slices`` chips: a shape Google documents."""
    per = chips // slices
    if per * slices != chips:
        raise LayoutError(f"{chips} chips do not split into {slices} equal slices")
    shapes = dict(SLICE_SHAPES[hw.torus_rank])
    if hw.torus_rank == 3:
        shapes[math.prod(LARGEST_V5P)] = LARGEST_V5P
    if per not in shapes:
        raise LayoutError(
            f"{per} chips is not a {hw.name} slice Google documents (e.g. "
            f"{', '.join(str(n) for n in sorted(shapes)[-4:])} chips; the largest v5p slice is "
            f"16x16x24 = 6,144): use a documented size, or several slices over DCN (slices=)")
    return shapes[per]


def machine(hw, chips: int, slices: int = 1):
    """The chips' network: GPU nodes on InfiniBand, or TPU slices (on DCN when several)."""
    if hw.torus_rank is None:
        return hw.topology(chips)
    shape = _slice_shape(hw, chips, slices)
    return hw.topology(shape) if slices == 1 else hw.cluster(slices, shape)


def trace_step(model, layout, hw_name: str, flash=True, framework="xla", precision="bf16"):
    """The step run on shapes over the layout's mesh: its per-device program."""
    platform = _devices._make_platform(layout.chips, hw_name, None)
    grid = np.empty(layout.chips, dtype=object)
    grid[:] = platform.devices
    mesh = Mesh(grid.reshape(tuple(layout.shape.values())), tuple(layout.shape))
    ins, outs = St.specs(model, layout)
    saved = _devices._platform
    try:
        _devices._platform = platform
        step = St.train_step(model, layout, flash, framework, precision)
        run = shard_map(step, mesh=mesh, in_specs=ins, out_specs=outs)
        run(*St.arguments(model, layout, ShapeDtypeStruct))
    finally:
        _devices._platform = saved
    return run.trace.program


def in_flight(layout: Layout) -> Layout:
    """The layout with as many micro-batches as a 1F1B schedule keeps in flight."""
    m = layout.pp if layout.vp > 1 else 1
    return replace(layout, global_batch=m * layout.replicas * layout.microbatch)


class Reuse:
    """What estimates of one model on one machine share, kept between them by
    :func:`sweep`: the machine's network, each collective's time (by its group of devices
    and its bytes), and each traced step (by its layout; layouts that differ only in the
    global batch share the memory program of their micro-batches in flight)."""

    def __init__(self):
        self.machines, self.collectives, self.programs, self.peaks = {}, {}, {}, {}

    def machine(self, hw, chips, slices):
        key = (hw.name, chips, slices)
        if key not in self.machines:
            self.machines[key] = machine(hw, chips, slices)
        return self.machines[key]

    def program(self, model, layout, hw_name, flash, framework, precision):
        key = (model, layout, hw_name, flash, framework, precision)
        if key not in self.programs:
            self.programs[key] = trace_step(*key)
        return self.programs[key]

    def peak(self, model, layout, hw_name, flash, framework, precision):
        key = (model, in_flight(layout), hw_name, flash, framework, precision)
        if key not in self.peaks:
            program = self.program(*key)
            megatron = framework == "megatron"
            self.peaks[key] = peak_memory(
                program, fused=True, donate=True, accumulation_fusion=megatron,
                walker=Walker(program, layout.shape, whole_recompute=megatron)).peak
        return self.peaks[key]


def sweep(model, layouts, hardware="H100", precision: str = "bf16", **options) -> list:
    """``estimate`` of each of ``layouts`` (one model, one machine), reusing what does not
    change between them (:class:`Reuse`): a list of :class:`Estimate` s, with the
    :class:`LayoutError` in place of a layout that cannot run."""
    reuse, out = Reuse(), []
    for layout in layouts:
        try:
            out.append(estimate(model, layout, hardware, precision=precision, reuse=reuse,
                                **options))
        except LayoutError as exc:
            out.append(exc)
    return out


def estimate(model, layout: Layout, hardware="H100", chips: int | None = None,
             precision: str = "bf16", *, slices: int = 1, flash: bool = True,
             framework: str = "xla", check_memory: bool = True, memory: bool = True,
             reuse: Reuse | None = None) -> Estimate:
    """Simulate one training step of ``model`` laid out as ``layout`` on ``chips`` chips of
    ``hardware``, its matrix products in ``precision`` ("bf16", "fp16" or "fp8": the
    layers' linear products in FP8 as Transformer Engine runs them, :mod:`.fp8`, attention
    and the head in bf16; weights, gradients and Adam's moments are kept as mixed
    precision keeps them, float32 masters and moments). ``slices``: TPU slices joined by
    DCN. ``flash``: attention as one fused kernel (False: the scores kept, as before fused
    kernels). ``framework``: what runs the
    step, ``"xla"`` (JAX: a checkpoint recomputes what the backward pass reads; the
    gradients of a loop over micro-batches or pipeline ticks are added to their
    accumulators when it ends) or ``"megatron"`` (Megatron-LM on PyTorch: full
    recomputation runs each layer's whole forward again, as PyTorch's checkpoint does;
    each weight gradient is added into its buffer where it is computed). Raises
    :class:`LayoutError` for a layout that cannot run, memory over the chip's HBM
    included (``check_memory=False`` reports it instead; ``memory=False`` skips the memory
    walk, for a sweep of step times: ``peak_bytes`` is then 0)."""
    check(model, layout, chips)
    if precision not in PATHS:
        raise LayoutError(f"precision={precision!r}: choose one of {', '.join(PATHS)}")
    if framework not in FRAMEWORKS:
        raise LayoutError(f"framework={framework!r}: choose one of {', '.join(FRAMEWORKS)}")
    hw = hardware_preset(hardware)
    if precision == "fp8" and "fp8" not in hw.matmul_paths:
        raise LayoutError(f"{hw.name} has no FP8 matrix units; use precision='bf16'")
    reuse = reuse or Reuse()
    ticks = layout.microbatches * layout.vp + layout.pp - 1      # step.py's pipeline loop
    program = reuse.program(model, layout, hw.name, flash, framework, precision)
    megatron = framework == "megatron"
    p = predict(program, hw, topology=reuse.machine(hw, layout.chips, slices),
                walker=Walker(program, layout.shape, whole_recompute=megatron),
                precision=PATHS[precision], pipeline=(ticks, layout.pp - 1),
                accumulation_fusion=megatron,
                collective_times=reuse.collectives.setdefault((hw.name, layout.chips, slices),
                                                              {}))
    memory = reuse.peak(model, layout, hw.name, flash, framework, precision) if memory else 0
    capacity = HBM_CAPACITY.get(hw.name, float("inf"))
    result = Estimate(model, layout, hw.name, precision, p.time_s, dict(p.terms), memory,
                      capacity, hw.matmul_peak(precision), tuple(p.collectives),
                      p.communication_s, p.flops)
    low, high, runs, _ = interval(p.time_s, framework, hw.name, layout)
    result = replace(result, interval_s=(low, high), validation_runs=runs)
    if check_memory and not result.fits:
        raise LayoutError(
            f"{memory / 1e9:.1f} GB per chip at the peak, over the {capacity / 1e9:.0f} GB of "
            f"HBM a {hw.name} has: recompute more (recompute='selective' or 'full'), split "
            f"the weights further (fsdp, tp, pp, distributed_optimizer) or use smaller "
            f"micro-batches")
    return result
