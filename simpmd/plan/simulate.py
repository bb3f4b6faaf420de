"""``plan.estimate``: a training step simulated on shapes, costed, and summed up.

The step of :mod:`simpmd.plan.step` runs as ``simpmd.shard_map`` over the layout's mesh
on ``ShapeDtypeStruct`` s (nothing is computed; every device's program, collectives
included, is traced and typed), then its program is costed as any program is: scheduled
on one device's streams for the time (:func:`simpmd.cost.predict.predict`, the products
of weights at the run's precision, the loop over the pipeline's ticks named so that its
idle ticks are the bubble), and walked kernel by kernel for the memory
(:func:`simpmd.cost.memory.peak_memory` with ``fused=True``; the step donates its
arguments, as a training step does).

The framework (:mod:`simpmd.plan.frameworks`) says which kernels run (XLA's fusions,
Transformer Engine's, eager PyTorch's one per operation), what a checkpoint reruns and
where gradients accumulate; the estimate lists it in ``Estimate.assumed``.

Memory is read off a second program, the same step with as many micro-batches as the
schedule keeps in flight: a 1F1B schedule (Narayanan et al. 2021) starts each
micro-batch's backward pass as soon as it can, so the first stage holds the activations
of ``pp * vp + pp - 1`` virtual stages' worth of ticks with the interleaved schedule and
of one micro-batch through all its layers without it, which is what the SPMD pipeline
holds with ``pp`` micro-batches (interleaved) or one. The SPMD program itself, run as
one forward and one backward scan, would keep every micro-batch's (GPipe's memory).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
import math

import numpy as np

from ..api.shapes import ShapeDtypeStruct
from ..api.shard_map import shard_map
from ..cost.hardware import NEW_HBM, SLICE_SHAPES, hardware_preset
from ..cost.memory import peak_memory
from ..cost.predict import predict
from ..cost.walk import Walker
from ..machine import devices as _devices
from ..machine.mesh import Mesh
from . import frameworks as F
from . import layers as L
from . import step as St
from .interval import VALIDATED, interval
from .layout import Layout, LayoutError, check, stage_split
from . import pipeline

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
    **NEW_HBM,            # H100 PCIe, H100 NVL, H100 96GB, GB200: cost/hardware.py's sources
}
LARGEST_V5P = (16, 16, 24)   # cloud.google.com/tpu/docs/v5p: the largest slice, 6,144 chips
# The path of the products of weights; in FP8 the program's casts say which run in FP8.
PATHS = {"bf16": "bf16", "fp16": "fp16", "fp8": None}
FRAMEWORKS = F.NAMES


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
    assumed: dict = field(default_factory=dict)   # the framework's defaults, in words
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
                f"{self.hbm_bytes / 1e9:.0f} GB"
                + "".join(f"\n  assumed {k}: {v}" for k, v in self.assumed.items()))


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


def trace_step(model, layout, hw_name: str, flash=True, framework="xla", precision="bf16",
               one_loss_at_a_time=False):
    """The step run on shapes over the layout's mesh: its per-device program
    (``one_loss_at_a_time``: :func:`simpmd.plan.step.train_step`'s, for the memory)."""
    platform = _devices._make_platform(layout.chips, hw_name, None)
    grid = np.empty(layout.chips, dtype=object)
    grid[:] = platform.devices
    mesh = Mesh(grid.reshape(tuple(layout.shape.values())), tuple(layout.shape))
    ins, outs = St.specs(model, layout)
    saved = _devices._platform
    try:
        _devices._platform = platform
        step = St.train_step(model, layout, flash, framework, precision, one_loss_at_a_time,
                             node_gpus(model, layout, hw_name))
        run = shard_map(step, mesh=mesh, in_specs=ins, out_specs=outs)
        run(*St.arguments(model, layout, ShapeDtypeStruct))
    finally:
        _devices._platform = saved
    return run.trace.program


def node_gpus(model, layout, hw_name):
    """GPUs per node of ``hw_name``'s cluster, for node-limited routing
    (``Transformer.route_nodes``; None otherwise, and on TPUs, which have no nodes)."""
    if getattr(model, "route_nodes", None) is None:
        return None
    hw = hardware_preset(hw_name)
    if hw.torus_rank is not None:
        return None
    return hw.topology(layout.chips).node.size


def scheduled_bubble(layout: Layout, terms: dict, step_s: float):
    """The bubble of ``layout.schedule``: the program's bubble, ``(pp - 1) / (m vp)`` of
    the busy time (the circular SPMD pipeline's, which is 1F1B's and GPipe's with one
    virtual stage and Megatron's interleaved schedule's with more), scaled to the idle
    over busy ticks of the schedule's own program (:mod:`simpmd.plan.pipeline`, its
    forward, input-gradient and weight-gradient passes one tick each, as the zero-bubble
    paper counts them). The memory is GPipe's (every micro-batch) for "gpipe" and the
    1F1B program's otherwise: ZB-H1 keeps ``pp``
    micro-batches in flight on every stage, 1F1B's first stage's count, and ZB-V ``2 pp``
    half-stages, the same; DualPipeV
    ``2 pp + 1`` half-stages, half a micro-batch more."""
    m = layout.microbatches
    try:
        grid = pipeline.schedule(layout.schedule, layout.pp, m, layout.vp)
    except pipeline.ScheduleError as exc:
        raise LayoutError(f"Layout(schedule={layout.schedule!r}): {exc}") from None
    busy = len(grid.grid) / layout.pp
    ratio = (grid.ticks - busy) / busy
    old = (layout.pp - 1) / (m * layout.vp)
    bubble = terms["bubble"] * ratio / old
    step_s += bubble - terms["bubble"]
    return dict(terms, bubble=bubble), step_s


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

    def program(self, model, layout, hw_name, flash, framework, precision, memory=False):
        key = (model, layout, hw_name, flash, framework, precision, memory)
        if key not in self.programs:
            self.programs[key] = trace_step(*key)
        return self.programs[key]

    def peak(self, model, layout, hw_name, flash, framework, precision):
        gpipe = layout.schedule == "gpipe"     # GPipe keeps every micro-batch: the step's
        layout = replace(layout, schedule=None)        # own program, one forward scan
        key = (model, layout if gpipe else in_flight(layout), hw_name, flash, framework,
               precision)
        if key not in self.peaks:
            program = self.program(*key, layout.pp > 1)
            f = F.FRAMEWORKS[framework]
            self.peaks[key] = peak_memory(
                program, fused=True, donate=True, accumulation_fusion=f.accumulation_fusion,
                walker=Walker(program, layout.shape, whole_recompute=f.whole_recompute,
                              eager=f.eager_fusion)
            ).peak + main_grad_extra(model, layout, f) \
                + pipeline_fsdp_gradients(model, layout, framework) \
                - fp8_params(model, layout, precision)
        return self.peaks[key]


def weight_elements(model, layout, which=None) -> int:
    """The elements of the weights one device uses (its stage's, its tensor-parallel and
    FSDP shares), before the distributed optimizer splits anything; ``which``: of the
    weights whose key it accepts only."""
    shapes = St.param_shapes(model, layout)
    return sum(math.prod(shape) // _ways(St._split(key, False, layout), layout)
               for key, shape in shapes.items() if which is None or which(key))


def _ways(spec, layout, but=()) -> int:
    """How many ways ``spec`` splits an array over ``layout``'s mesh, leaving out the axes
    in ``but``."""
    return math.prod(layout.shape[a] for a in St._named(spec) if a not in but)


def main_grad_extra(model, layout, framework) -> int:
    """Megatron-LM's gradients are float32 buffers (``main_grad``; its arguments.py makes
    bf16 training accumulate and reduce gradients in fp32, and the wgrad GEMM adds into
    them, ``gradient_accumulation_fusion``), where the program accumulates in the
    weights' 16-bit type: 2 more bytes per weight element held (Korthikanti et al.
    2022's Figure 1 counts 18 bytes a parameter: 2 + 4 + 12). None where the layout
    reduces in 16 bits (``grad_reduce_in_fp32=False``: Megatron-Core's grad buffer in the
    weights' type; Apex's DistributedFusedAdam with ``grad_sync_dtype=bf16``), as the
    program does, nor for a framework without ``main_grad``."""
    if not (framework.main_grad_fp32 and layout.grad_reduce_in_fp32):
        return 0
    return 2 * weight_elements(model, layout)


def fp8_params(model, layout, precision) -> int:
    """The bytes Megatron's ``--fp8-param-gather`` does not hold that the step's program
    does. With it the FP8 layers' weights are FP8 tensors (Transformer Engine's
    ``fp8_model_init``; Megatron-Bridge's FP8 recipes set it, ``fp8_param_gather=True`` in
    ``bf16_with_fp8_current_scaling_mixed``, src/megatron/bridge/training/mixed_precision.py
    at NVIDIA-NeMo/Megatron-Bridge 00b7660be0): the distributed optimizer's all-gather
    writes FP8 and the GEMMs read it and its transposed copy, with no 16-bit weight. The
    program keeps the 16-bit weights it gathered (its FP8 copies' cotangents go to them,
    :func:`simpmd.plan.fp8.operand`) through the backward pass: 2 bytes per element of
    the weights cast to FP8 that the device holds. Zero without the flag, outside FP8, and
    with FSDP (where each layer casts what it gathers and frees it)."""
    if not (layout.fp8_param_gather and precision == "fp8") or layout.fsdp > 1:
        return 0
    return 2 * weight_elements(model, layout, St.cast_to_fp8)


def stage_gathered_elements(model, layout) -> tuple:
    """(elements, layers): what one device's pipeline stage holds of its layers' matrices
    once FSDP has gathered them (:func:`simpmd.plan.layers.gather_stage`: each matrix whole
    over ``fsdp``, its tensor-parallel share, the unpadded d_model), over the layers of
    the stage's stack (``vp`` virtual stages of the fullest one's layers)."""
    shapes = St.param_shapes(model, layout)
    total = sum(math.prod(shapes[key]) // _ways(St._split(key, False, layout), layout, ("fsdp",))
                * model.d_model // shapes[key][3 + axis]
                for key, axis in L.MATRICES.items() if key in shapes)
    return total, layout.vp * max(stage_split(model, layout))


def pipeline_fsdp_gradients(model, layout, framework) -> int:
    """The bytes PyTorch's FSDP under a pipeline holds for a stage's gradients, less what
    the SPMD step's program holds for them, which the walk counts: the program gathers
    the stage's weights once per step (:func:`simpmd.plan.layers.gather_stage`) and its
    backward scan carries their gradients across the micro-batches in the weights'
    16-bit type, beside one tick's gradients of the whole stage (the scan over its layers
    stacks them), two buffers of the gathered stage's size ``G`` elements: ``4 G`` bytes.
    What PyTorch holds instead (autograd computes one layer's gradient at a time, ``G /
    layers`` elements in bf16, and adds it where FSDP keeps it):

    * ``gradient_sync="step"`` (torch.distributed.pipelining with FSDP2, torchtitan):
      the stage calls ``set_requires_gradient_sync(False)`` on every micro-batch's
      backward and reduces once after the last (``backward_maybe_with_nosync``,
      torch/distributed/pipelining/stage.py at pytorch/pytorch 88fa1e71), so FSDP2 keeps
      the unsharded gradients between micro-batches, upcast to its ``reduce_dtype``
      (``FSDPParam.to_accumulated_grad_if_needed``,
      torch/distributed/fsdp/_fully_shard/_fsdp_param.py at 17a7e1e0), float32 in
      torchtitan (``mixed_precision_reduce = "float32"``, torchtitan/config/job_config.py):
      ``4 G`` bytes, and the layer's ``2 G / layers``;
    * ``gradient_sync="microbatch"`` (the Llama 3 trainer, whose FSDP "shards optimizer
      states and gradients" and which "reduce[s]-scatter gradients in FP32", Dubey et al.
      2024, section 3.3.2): each layer's gradient is reduce-scattered as its backward makes
      it, its bf16 gradient and a float32 copy live while it is, ``6 G / layers`` bytes,
      and the float32 sharded gradients accumulated over the micro-batches, ``4 G`` over
      the ranks that split them (``fsdp``, and those of the distributed optimizer).

    Zero without a pipeline or without FSDP, and for frameworks that are not PyTorch's."""
    if not (framework.startswith("pytorch") and layout.pp > 1 and layout.fsdp > 1):
        return 0
    g, layers = stage_gathered_elements(model, layout)
    program = 2 * 2 * g
    if layout.gradient_sync == "step":
        return 4 * g + 2 * g // layers - program
    shards = layout.fsdp * math.prod(layout.shape[a] for a in St.optimizer_axes(layout))
    return 6 * g // layers + 4 * g // shards - program


def rematerialized(result: Estimate, full: Estimate) -> Estimate:
    """A step over HBM as XLA compiles it: its rematerialization pass recomputes values
    until the program fits the device's memory (``HloRematerialization``, which
    openxla/xla's GPU compiler runs in its post-scheduling 'remat-pipeline' against the
    memory limit, xla/service/gpu/gpu_compiler.cc; the TPU compiler is not public). Priced
    between the layout and its full recomputation: the share of the bytes between their
    peaks that must go, of the time between their steps. Unchanged where even full
    recomputation does not fit."""
    if full.peak_bytes > result.hbm_bytes or result.peak_bytes <= full.peak_bytes:
        return result
    share = (result.peak_bytes - result.hbm_bytes) / (result.peak_bytes - full.peak_bytes)
    extra = share * max(0.0, full.step_s - result.step_s)
    breakdown = dict(result.breakdown, recompute=result.breakdown["recompute"] + extra)
    said = dict(result.assumed, rematerialized=(
        f"XLA recomputes {(result.peak_bytes - result.hbm_bytes) / 1e9:.1f} GB more to fit "
        f"the {result.hbm_bytes / 1e9:.0f} GB (peak {result.peak_bytes / 1e9:.1f} GB as "
        f"laid out): {extra:.3g} s"))
    return replace(result, step_s=result.step_s + extra, breakdown=breakdown,
                   peak_bytes=int(result.hbm_bytes), assumed=said)


def memory_refusal(model, layout, result) -> str:
    """Why ``result`` does not fit and what would: the bytes, the weights' share, and the
    layouts that hold less (each axis that splits the weights, recomputation, a smaller
    micro-batch), with ``check_memory=False`` to see the estimate anyway."""
    peak, hbm = result.peak_bytes / 1e9, result.hbm_bytes / 1e9
    weights = weight_elements(model, layout) * 2 / 1e9
    over = peak / hbm
    n = 2 ** math.ceil(math.log2(over))
    ideas = [f"split the weights {n}x further (pp = {layout.pp * n}, tp = {layout.tp * n} "
             f"or fsdp = {layout.fsdp * n}, as the model's sizes allow)"]
    if not layout.distributed_optimizer and layout.replicas * layout.cp > 1:
        ideas.append("distributed_optimizer=True (ZeRO-1: the fp32 masters and moments over "
                     f"dp x cp = {layout.dp * layout.cp})")
    if layout.recompute != "full" or layout.recompute_layers is not None:
        ideas.append("recompute='full' (each layer's input only)")
    if layout.microbatch > 1:
        ideas.append(f"microbatch={layout.microbatch // 2}")
    if layout.tp > 1 and not layout.sequence_parallel:
        ideas.append("sequence_parallel=True")
    return (f"{peak:.1f} GB per chip at the peak, over the {hbm:.0f} GB of HBM a "
            f"{result.hardware} has ({over:.2f}x; the 16-bit weights alone {weights:.1f} GB): "
            f"{'; or '.join(ideas)}. Pass check_memory=False to get the estimate anyway "
            f"(Estimate.fits is then False).")


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


def _check_precision(precision, layout, hw):
    if precision not in PATHS:
        raise LayoutError(f"precision={precision!r}: choose one of {', '.join(PATHS)}")
    if layout.fp8_dispatch and precision != "fp8":
        raise LayoutError("Layout(fp8_dispatch=True) sends the dispatch's tokens in FP8, "
                          "with precision='fp8' (the experts' products in FP8)")
    if layout.fp8_param_gather and precision != "fp8":
        raise LayoutError("Layout(fp8_param_gather=True) keeps the layers' weights in FP8, "
                          "with precision='fp8' (their products in FP8): set both, or "
                          "neither")
    if precision == "fp8" and "fp8" not in hw.matmul_paths:
        raise LayoutError(f"{hw.name} has no FP8 matrix units; use precision='bf16'")


def _gemms(hw, framework: str):
    """The chip as the framework's matrix products run on it, and what that assumed: under
    XLA an H100's or H200's bf16 products at XLA's own measured rate (``under_xla``)."""
    xla = hw.under_xla() if framework == "xla" else hw
    if xla is hw:
        return hw, {}
    share = xla.sustained_matmul_flops("bf16") / xla.matmul_peak("bf16")
    return xla, {"matmuls": f"XLA's own GEMMs, {share:.0%} of the bf16 peak (timed under "
                            "jax.jit on an H200)"}


def estimate(model, layout: Layout, hardware="H100", chips: int | None = None,
             precision: str = "bf16", *, slices: int = 1, flash: bool = True,
             framework: str = "xla", check_memory: bool = True, memory: bool = True,
             reuse: Reuse | None = None, compile: bool = False) -> Estimate:
    """Simulate one training step of ``model`` laid out as ``layout`` on ``chips`` chips of
    ``hardware``, its matrix products in ``precision`` ("bf16", "fp16" or "fp8": the
    layers' linear products in FP8 as Transformer Engine runs them, :mod:`.fp8`, attention
    and the head in bf16; weights, gradients and Adam's moments are kept as mixed
    precision keeps them, float32 masters and moments). ``slices``: TPU slices joined by
    DCN. ``flash``: attention as one fused kernel (False: the scores kept, as before fused
    kernels). ``framework``: what runs the step, one of ``"xla"``, ``"megatron"``,
    ``"pytorch"`` (``compile=True``: under torch.compile) and ``"deepspeed"``
    (:mod:`simpmd.plan.frameworks`, whose kernels and defaults the estimate's
    ``assumed`` lists). Under ``"xla"`` a step over HBM is rematerialized to fit where
    full recomputation would fit (:func:`rematerialized`). Raises :class:`LayoutError`
    for a layout that cannot run, memory over the chip's HBM included, saying what would
    fit (``check_memory=False`` reports it instead; ``memory=False`` skips the memory
    walk, for a sweep of step times: ``peak_bytes`` is then 0)."""
    check(model, layout, chips)
    runs = F.framework(framework, compile)
    runs.check(layout)
    layout = runs.layout(layout)
    kernels = runs.name         # "pytorch+compile" under torch.compile; the family: framework
    hw, gemms = _gemms(hardware_preset(hardware), framework)
    _check_precision(precision, layout, hw)
    reuse = reuse or Reuse()
    ticks = layout.microbatches * layout.vp + layout.pp - 1      # step.py's pipeline loop
    traced = replace(layout, schedule=None)      # the schedule changes the bubble only
    program = reuse.program(model, traced, hw.name, flash, kernels, precision)
    p = predict(program, hw, topology=reuse.machine(hw, layout.chips, slices),
                walker=Walker(program, layout.shape, whole_recompute=runs.whole_recompute,
                              eager=runs.eager_fusion),
                precision=PATHS[precision], pipeline=(ticks, layout.pp - 1),
                accumulation_fusion=runs.accumulation_fusion,
                collective_times=reuse.collectives.setdefault((hw.name, layout.chips, slices),
                                                              {}),
                blocking=() if layout.all_to_all_overlapped else runs.blocking)
    terms, step_s = dict(p.terms), p.time_s
    if layout.schedule is not None and layout.pp > 1:
        terms, step_s = scheduled_bubble(layout, terms, step_s)
    memory = reuse.peak(model, layout, hw.name, flash, kernels, precision) if memory else 0
    capacity = HBM_CAPACITY.get(hw.name, float("inf"))
    result = Estimate(model, layout, hw.name, precision, step_s, terms, memory,
                      capacity, hw.matmul_peak(precision), tuple(p.collectives),
                      p.communication_s, p.flops, runs.assumed(layout, flash, model) | gemms)
    if framework == "xla" and memory and not result.fits and layout.recompute != "full":
        full = estimate(model, replace(layout, recompute="full", recompute_layers=None),
                        hardware, chips, precision, slices=slices, flash=flash,
                        framework=framework, check_memory=False, reuse=reuse)
        result = rematerialized(result, full)
    low, high, behind, _ = interval(result.step_s, framework, hw.name, layout)
    result = replace(result, interval_s=(low, high), validation_runs=behind)
    if check_memory and not result.fits:
        raise LayoutError(memory_refusal(model, layout, result))
    return result
