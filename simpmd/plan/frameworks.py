"""What runs a training step: the frameworks ``plan.estimate`` knows, and what each one's
kernels and defaults are, so that an estimate can say what it assumed.

* ``"xla"``: JAX (MaxText): XLA fuses elementwise chains into their neighbours; a
  ``checkpoint`` recomputes only what the backward pass reads; gradients of a loop over
  micro-batches are added to their accumulators when it ends.
* ``"megatron"``: Megatron-LM, NeMo, Megatron-Bridge on PyTorch with Transformer Engine:
  the operations PyTorch runs on their own are kernels of their own; full recomputation
  reruns each layer's whole forward (``torch.utils.checkpoint``); the weight-gradient
  GEMM adds into a float32 ``main_grad`` (``gradient_accumulation_fusion``); "selective"
  is Korthikanti et al.'s (the attention's core recomputed, the dropout masks kept).
* ``"pytorch"``: eager PyTorch with FSDP: its operations as kernels of their own, as
  Megatron's are, a checkpoint rerunning the whole forward, gradients added by autograd
  (no accumulation fusion); with ``compile=True``, ``torch.compile`` (Inductor) fuses
  the elementwise operations as XLA does.
* ``"deepspeed"``: DeepSpeed (ZeRO stages 1-3, ``Layout(zero=...)``): PyTorch's eager
  kernels, as ``"pytorch"``; its pipeline engine runs 1F1B without virtual stages and
  with ZeRO-1 at most (:meth:`Framework.check`).

What is not modelled yet is said in :attr:`Framework.not_modelled`, which the estimate's
``assumed`` carries: FSDP's and ZeRO-3's gathers are one per weight (FSDP gathers a
layer's flat parameter at once; ZeRO-3 in ``stage3_prefetch_bucket_size`` buckets), and
ZeRO-2's gradients are held whole through the backward pass as ZeRO-1's.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from .layout import LayoutError, stage_split


@dataclass(frozen=True)
class Framework:
    """One framework's kernels and defaults (see the module's docstring)."""

    name: str
    eager: bool                  # PyTorch's own kernels where it runs an operation alone
    whole_recompute: bool        # a checkpoint reruns the whole forward of its region
    accumulation_fusion: bool    # the wgrad GEMM adds into the gradient's buffer
    main_grad_fp32: bool         # gradients held in float32 buffers (Megatron's main_grad)
    selective: str               # what recompute="selective" keeps
    not_modelled: str = ""
    eager_fusion: bool = False   # no fusion at all: every operation its own kernel
    # Collectives the compute stream waits for in program order (simpmd.cost.predict's
    # ``blocking``), unless the layout overlaps them (Layout.overlap_all_to_all)
    blocking: tuple = ()


    def check(self, layout):
        """Refuse a layout this framework cannot run, naming its limit: DeepSpeed's
        PipelineEngine runs ``TrainSchedule`` (1F1B, no virtual stages) and asserts "ZeRO-2
        and ZeRO-3 are incompatible with pipeline parallelism" (deepspeedai/DeepSpeed,
        deepspeed/runtime/pipe/engine.py at 03f6f75c)."""
        if self.name != "deepspeed" or layout.pp == 1:
            return
        if layout.vp > 1:
            raise LayoutError(f"framework='deepspeed' with vp = {layout.vp}: DeepSpeed's "
                              f"pipeline engine runs 1F1B without virtual stages; use vp=1, "
                              f"or framework='megatron' for the interleaved schedule")
        if layout.fsdp > 1 or layout.zero in (2, 3):
            raise LayoutError(f"framework='deepspeed' with pp = {layout.pp} and "
                              f"{'ZeRO-' + str(layout.zero) if layout.zero else 'fsdp'}: "
                              f"DeepSpeed's pipeline engine takes ZeRO-1 at most (zero=1)")

    def layout(self, layout):
        """``layout`` as this framework runs it: PyTorch's FSDP with context parallelism
        shards the weights, their gradients and the optimizer's state over the
        context-parallel ranks too, which hold the same weights (torchtitan applies
        ``fully_shard`` over the ``dp_shard_cp`` mesh, "apply FSDP or HSDP, potentially
        with Context Parallel": torchtitan/models/llama3/infra/parallelize.py): the
        planner's distributed optimizer over ``cp`` (split over ``fsdp x cp`` between
        steps, gathered over ``cp`` once per step). Other layouts as given."""
        if self._fsdp_with_cp(layout) and layout.dp == 1 and not layout.distributed_optimizer:
            return replace(layout, distributed_optimizer=True)
        return layout

    def _fsdp_with_cp(self, layout) -> bool:
        """PyTorch's FSDP beside context parallelism (what :meth:`layout` shards over
        ``cp`` too)."""
        return self.name.startswith("pytorch") and layout.cp > 1 and layout.fsdp > 1

    def assumed(self, layout, flash: bool, model=None) -> dict:
        """What an estimate under this framework assumed, in words."""
        out = {"framework": self.name,
               "kernels": ("eager PyTorch: every operation its own kernel, at HBM "
                           "bandwidth, a launch each" if self.eager_fusion else
                           "Transformer Engine's and PyTorch's fused kernels; an operation "
                           "PyTorch runs alone is its own" if self.eager else
                           "elementwise chains fused into their neighbours ("
                           + ("TorchInductor" if self.name.startswith("pytorch") else "XLA")
                           + ")"),
               "attention": "one fused kernel (flash)" if flash else "scores kept in HBM",
               "gradients": ("in bf16, reduced in bf16" if not layout.grad_reduce_in_fp32
                             else "float32 main_grad, wgrad added in place"
                             if self.main_grad_fp32
                             else "the weights' type, accumulated by the step's loop")}
        if layout.fp8_param_gather:
            out["FP8 weights"] = ("held in FP8 only, with their transposes; their gather "
                                  "and cast priced as the bf16 weights'")
        if layout.recompute == "selective":
            out["selective"] = self.selective
        if layout.recompute == "full":
            out["full"] = ("each layer's whole forward again" if self.whole_recompute
                           else "what the backward pass reads, again")
        if layout.tp > 1:
            out["sequence parallel"] = "on" if layout.sequence_parallel else "off"
        split = stage_split(model, layout) if model is not None and layout.pp > 1 else ()
        if len(set(split)) > 1:
            out["stages"] = (f"layers per virtual stage {list(split)}: every stage priced "
                             f"at the fullest, {max(split)}")
        if self.name.startswith("pytorch") and layout.pp > 1 and layout.fsdp > 1:
            out["FSDP under the pipeline"] = (
                "the stage's weights gathered once per step; its gradients "
                + ("reduce-scattered as each micro-batch makes them (the reduce-scatters "
                   "priced once per step)" if layout.gradient_sync == "microbatch" else
                   "held whole in float32 (FSDP2's reduce_dtype) until the last micro-batch"))
        if self._fsdp_with_cp(layout) and layout.distributed_optimizer:
            out["FSDP over cp"] = "weights and optimizer state split over fsdp x cp"
        if layout.zero == 2:
            out["ZeRO-2"] = "gradients held whole through the backward pass, as ZeRO-1's"
        if self.not_modelled:
            out["not modelled"] = self.not_modelled
        return out


_SELECTIVE_MEGATRON = ("Korthikanti et al. 2022: the attention's core (scores, softmax, "
                       "dropout, products with them) recomputed, everything else kept")
_SELECTIVE_PRODUCTS = "the weights' products kept, the rest recomputed (JAX's dots saveable)"
_GATHERS = ("FSDP's and ZeRO-3's gathers one per weight, not per layer or per bucket; "
            "ZeRO-2's gradients held whole through the backward pass")

FRAMEWORKS = {
    "xla": Framework("xla", False, False, False, False, _SELECTIVE_PRODUCTS),
    # Megatron-Core's token dispatchers exchange tokens with a synchronous
    # torch.distributed.all_to_all_single, forward and backward (_AllToAll in
    # megatron/core/tensor_parallel/mappings.py at core_v0.15.0, 0d7e02bd): the compute
    # stream waits for each; --overlap-moe-expert-parallel-comm hides them (its MoE README)
    "megatron": Framework("megatron", True, True, True, True, _SELECTIVE_MEGATRON,
                          blocking=("all_to_all",)),
    "pytorch": Framework("pytorch", True, True, False, False, _SELECTIVE_PRODUCTS, _GATHERS,
                         eager_fusion=True),
    "pytorch+compile": Framework("pytorch+compile", False, True, False, False,
                                 _SELECTIVE_PRODUCTS, _GATHERS),
    "deepspeed": Framework("deepspeed", True, True, False, False, _SELECTIVE_PRODUCTS,
                           _GATHERS, eager_fusion=True),
}
NAMES = ("xla", "megatron", "pytorch", "deepspeed")


def framework(name: str, compile: bool = False) -> Framework:
    """The :class:`Framework` called ``name``; ``compile``: PyTorch under torch.compile.
    An unknown name raises, listing the ones there are."""
    if name not in NAMES:
        raise LayoutError(f"framework={name!r}: choose one of {', '.join(map(repr, NAMES))}")
    if compile and name != "pytorch":
        raise LayoutError(f"compile=True is torch.compile, for framework='pytorch' (not "
                          f"{name!r})")
    return FRAMEWORKS["pytorch+compile" if compile else name]
