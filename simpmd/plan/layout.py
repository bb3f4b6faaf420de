"""How a training step is split over chips: a :class:`Layout`, and the checks that say
which layouts cannot run, naming the limit.

The axes are the field's: data parallelism (``dp``, each replica holds every weight),
fully sharded data parallelism (``fsdp``, weights split and gathered just in time),
tensor parallelism (``tp``, Megatron's split of heads and hidden units), pipeline
parallelism (``pp`` stages, each holding ``vp`` virtual stages of layers), context
parallelism (``cp``, each sequence split) and, for a mixture of experts, expert
parallelism (``ep``: the routed experts split over ``ep`` ranks, each token sent to its
experts' ranks and back by two ``all_to_all`` s; attention, the router and every dense
weight stay data-parallel over ``dp x ep``). Batches count sequences, as Megatron's
micro and global batch sizes do.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

from .loss import LOSSES

RECOMPUTE = ("none", "selective", "full")
# Megatron-Core's output-discarding recomputation of single modules (``--recompute-modules``
# with ``--recompute-granularity selective``, megatron/core/transformer/moe/README.md,
# 'Fine-grained Recomputation'): the forward pass drops the module's output, the backward
# pass computes it again from the input it keeps. The two a fused kernel computes:
RECOMPUTE_MODULES = ("layernorm", "moe_act")
# How the optimizer holds the fp32 master weights: "fp32", or "remainders", the 16 bits a
# bf16 weight lacks (Apex's DistributedFusedAdam, store_param_remainders=True, which NeMo's
# MegatronBaseModel.setup_optimization sets for a bf16 model with distributed_fused_adam).
MASTER_WEIGHTS = ("fp32", "remainders")
# When FSDP under a pipeline reduce-scatters a stage's gradients: once per step, after the
# last micro-batch ("step": torch.distributed.pipelining's stage turns FSDP's gradient sync
# off on every micro-batch's backward and runs the reduction after the last), or as each
# micro-batch's backward makes them ("microbatch": the Llama 3 trainer's FSDP "shards
# optimizer states and gradients", Dubey et al. 2024, section 3.3.2).
GRADIENT_SYNC = ("step", "microbatch")
AXES = ("pp", "dp", "fsdp", "ep", "cp", "tp")  # the mesh's axes, slowest-varying first
# ``ep`` is on the mesh only where ep > 1 (a dense step's program is then unchanged); it
# sits inside ``dp`` and outside ``cp`` and ``tp``, as Megatron-Core orders its ranks
# (tp-cp-ep-dp-pp, tp fastest: megatron/core/parallel_state.py, ``initialize_model_parallel``
# with ``order="tp-cp-ep-dp-pp"``), so an expert-parallel group of 8 is one node's GPUs.
# Pipeline schedules (simpmd.plan.pipeline); None: 1F1B, interleaved where vp > 1.
SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev")


class LayoutError(ValueError):
    """A layout that cannot run this model on these chips; the message names the limit."""


@dataclass(frozen=True)
class Layout:
    """A parallel layout of a training step.

    ``microbatch`` sequences go through the layers at once on each data-parallel rank;
    ``global_batch`` sequences make one step, so each rank runs ``global_batch / (dp *
    fsdp * microbatch)`` micro-batches and accumulates their gradients. ``recompute`` is
    what the backward pass computes again instead of keeping: ``"none"``, ``"selective"``
    (the attention's score matrices, Korthikanti et al. 2022) or ``"full"`` (each layer
    from its input). ``sequence_parallel`` splits the norms' and residual's tokens over
    ``tp`` too (all-gathers and reduce-scatters instead of all-reduces).
    ``distributed_optimizer`` splits the fp32 masters and Adam moments over ``dp`` and
    ``cp`` (Megatron's distributed optimizer, ZeRO stage 1; ``zero=1|2|3`` names ZeRO's
    stages). ``stage_layers``: the layers of each virtual stage, where not the even (or
    Megatron-Core's) split; ``recompute_layers``: with ``recompute="full"``, how many of
    each virtual stage's layers are recomputed (Megatron's block method);
    ``master_weights``: :data:`MASTER_WEIGHTS`. ``ep``: expert parallelism, the routed
    experts of a mixture of experts split over ``ep`` ranks (and over ``tp`` too: expert
    tensor parallelism 1), every other weight data-parallel over ``dp x ep``;
    ``expert_load``: the busiest expert's tokens over the mean load, which the experts'
    slots are sized for (dropless routing). ``gradient_sync``: :data:`GRADIENT_SYNC`, when
    PyTorch's FSDP under a pipeline reduce-scatters a stage's gradients (the memory they
    hold between micro-batches: :func:`simpmd.plan.simulate.pipeline_fsdp_gradients`).
    ``recompute_modules``: of :data:`RECOMPUTE_MODULES`, the modules whose outputs the
    forward pass discards and the backward pass computes again (Megatron-Core's
    ``--recompute-modules``): ``"layernorm"`` the two norms of each layer, ``"moe_act"``
    the routed experts' activation.
    ``overlap_all_to_all``: whether the expert-parallel ``all_to_all`` s run beside
    independent compute (Megatron-Core's ``--overlap-moe-expert-parallel-comm``, priced
    as the scheduler's overlap within a micro-batch) or hold the compute stream until
    they end, as Megatron-Core's synchronous dispatch does (``framework="megatron"``
    only; XLA's collectives are asynchronous); None: overlapped under the DualPipeV
    schedule, whose point it is (DeepSeek-V3 report, section 3.2.1), else not.
    ``loss``: the kernels of the loss (:data:`simpmd.plan.loss.LOSSES`: PyTorch's
    ``F.cross_entropy`` on float32 logits, or a fused cross-entropy kernel); None, the
    loss as written, fused as the framework fuses. ``grad_reduce_in_fp32``: whether the
    gradients are reduced (and, under ``framework="megatron"``, held) in float32 or in
    the weights' 16-bit type; ``fp8_param_gather``: in FP8, the layers' weights kept in
    FP8 only (Megatron's ``--fp8-param-gather``)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    microbatch: int = 1
    global_batch: int | None = None
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False
    stage_layers: tuple | None = None
    recompute_layers: int | None = None
    zero: int | None = None
    master_weights: str = "fp32"
    schedule: str | None = None     # SCHEDULES; its bubble from simpmd.plan.pipeline
    ep: int = 1                     # expert parallelism (a mixture of experts only)
    # The busiest expert's routed tokens over the mean load (1: balanced). Every
    # rank's grouped products and all_to_all buffers are sized for it (the step waits for
    # the busiest expert); state where it comes from (see simpmd.plan.layers.expert_slots).
    expert_load: float = 1.0
    gradient_sync: str = "step"     # GRADIENT_SYNC
    recompute_modules: tuple = ()
    overlap_all_to_all: bool | None = None
    # With precision="fp8": the dispatch's tokens sent in FP8 (E4M3) with a float32 scale
    # per 1x128 tile, the combine in bf16 (DeepSeek-V3 report, section 3.3, "Low-Precision
    # Communication"); off: bf16 both ways (Megatron-Core's dispatch, the validated runs').
    fp8_dispatch: bool = False
    # The loss's kernels: None, the loss as written (simpmd.plan.layers.token_losses,
    # fused as the framework fuses); or a trainer's own (simpmd.plan.loss.LOSSES).
    loss: str | None = None
    # Gradients reduced across the data-parallel ranks in float32 (True: the step's own
    # reduction, and Megatron's float32 main_grad buffers), or in the weights' 16-bit type
    # and held in it (False: Megatron-Core's grad_reduce_in_fp32=False; Apex's
    # DistributedFusedAdam with grad_sync_dtype=bf16, which NeMo's FP8 examples set).
    grad_reduce_in_fp32: bool = True
    # With precision="fp8": the FP8 layers' weights held in FP8 between steps and gathered
    # in FP8 (Megatron's --fp8-param-gather, Transformer Engine's fp8_model_init): no
    # 16-bit copy beside the FP8 one and its transpose (simpmd.plan.simulate.fp8_params).
    fp8_param_gather: bool = False

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or value < 1):
                raise LayoutError(f"Layout({f.name}={value!r}): each axis and batch size is "
                                  f"a whole number, at least 1")
        if self.recompute not in RECOMPUTE:
            raise LayoutError(f"Layout(recompute={self.recompute!r}): choose one of "
                              f"{', '.join(map(repr, RECOMPUTE))}")
        if self.gradient_sync not in GRADIENT_SYNC:
            raise LayoutError(f"Layout(gradient_sync={self.gradient_sync!r}): choose one of "
                              f"{', '.join(map(repr, GRADIENT_SYNC))}")
        if self.loss is not None and self.loss not in LOSSES:
            raise LayoutError(f"Layout(loss={self.loss!r}): choose None (the loss as "
                              f"written) or one of {', '.join(map(repr, LOSSES))}")
        if self.master_weights not in MASTER_WEIGHTS:
            raise LayoutError(f"Layout(master_weights={self.master_weights!r}): choose one of "
                              f"{', '.join(map(repr, MASTER_WEIGHTS))}")
        object.__setattr__(self, "recompute_modules", tuple(self.recompute_modules))
        unknown = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if unknown:
            raise LayoutError(f"Layout(recompute_modules={list(self.recompute_modules)}): "
                              f"{unknown[0]!r} is not one of {', '.join(map(repr, RECOMPUTE_MODULES))}")
        if not self.expert_load >= 1.0:
            raise LayoutError(f"Layout(expert_load={self.expert_load!r}): the busiest expert's "
                              f"tokens over the mean, at least 1")
        self._zero_stage()
        self._partial_recompute()
        self._schedule()
        if self.stage_layers is not None:
            object.__setattr__(self, "stage_layers", tuple(int(n) for n in self.stage_layers))
            if len(self.stage_layers) != self.pp * self.vp or min(self.stage_layers) < 0:
                raise LayoutError(f"Layout(stage_layers={list(self.stage_layers)}): one count "
                                  f"of layers (0 or more) per virtual stage, pp x vp = "
                                  f"{self.pp} x {self.vp} = {self.pp * self.vp} of them, in "
                                  f"the pipeline's order")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.replicas * self.microbatch)
        if self.vp > 1 and self.pp == 1:
            raise LayoutError(f"Layout(vp={self.vp}, pp=1): virtual stages interleave a "
                              f"pipeline; with one stage there is nothing to interleave")

    def _zero_stage(self):
        """ZeRO by stage (Rajbhandari et al. 2020, arXiv:1910.02054, section 5): 1 splits
        the optimizer's state over the data-parallel ranks (``distributed_optimizer``), 2
        the gradients too, 3 the weights too (FSDP over the ``dp`` ranks: ``fsdp`` takes
        them)."""
        if self.zero is None:
            return
        if self.zero not in (1, 2, 3):
            raise LayoutError(f"Layout(zero={self.zero!r}): ZeRO's stages are 1 (optimizer "
                              f"state), 2 (and gradients) and 3 (and weights)")
        if self.zero == 3:
            object.__setattr__(self, "fsdp", self.fsdp * self.dp)
            object.__setattr__(self, "dp", 1)
        else:
            object.__setattr__(self, "distributed_optimizer", True)

    def _schedule(self):
        """``schedule``: one of :data:`SCHEDULES`, or None (1F1B; interleaved with
        ``vp > 1``). Only the interleaved schedule runs virtual stages."""
        if self.schedule is None:
            return
        if self.schedule not in SCHEDULES:
            raise LayoutError(f"Layout(schedule={self.schedule!r}): choose one of "
                              f"{', '.join(map(repr, SCHEDULES))}")
        if (self.schedule == "interleaved") != (self.vp > 1):
            raise LayoutError(f"Layout(schedule={self.schedule!r}, vp={self.vp}): the "
                              f"interleaved schedule runs vp > 1 virtual stages, the others "
                              f"one: set vp, or choose the schedule that matches it")

    def _partial_recompute(self):
        """Megatron-LM's ``--recompute-method block --recompute-num-layers k``: the first
        ``k`` layers of each virtual stage recomputed whole, the rest kept."""
        k = self.recompute_layers
        if k is None:
            return
        if self.recompute != "full" or not isinstance(k, int) or k < 0:
            raise LayoutError(f"Layout(recompute={self.recompute!r}, recompute_layers={k!r}): "
                              f"recompute_layers counts the layers of each virtual stage "
                              f"recomputed whole (a whole number, 0 or more), with "
                              f"recompute='full' (Megatron's --recompute-num-layers)")

    @property
    def all_to_all_overlapped(self) -> bool:
        """:attr:`overlap_all_to_all`, its None resolved (True under "dualpipev")."""
        if self.overlap_all_to_all is None:
            return self.schedule == "dualpipev"
        return self.overlap_all_to_all

    @property
    def chips(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp * self.cp * self.ep

    @property
    def replicas(self) -> int:
        """Ranks that take different sequences: data parallel, FSDP and expert parallel
        (outside the experts an expert-parallel rank is one more data-parallel rank)."""
        return self.dp * self.fsdp * self.ep

    @property
    def microbatches(self) -> int:
        """Micro-batches each rank runs per step."""
        return self.global_batch // (self.replicas * self.microbatch)

    @property
    def shape(self) -> dict:
        """The mesh: every axis with its size, slowest-varying first (``tp`` innermost,
        so a tensor-parallel group is neighbouring chips, as Megatron orders its ranks)."""
        return {a: getattr(self, a) for a in AXES if a != "ep" or self.ep > 1}

    def __str__(self):
        parts = [f"{a}={getattr(self, a)}" for a in ("dp", "fsdp", "tp", "pp", "vp", "cp", "ep")
                 if getattr(self, a) > 1]
        extras = [f"recompute={self.recompute}"] if self.recompute != "none" else []
        if self.recompute_layers is not None:
            extras[-1] += f" ({self.recompute_layers} layers per virtual stage)"
        extras += [f"recomputed {'+'.join(self.recompute_modules)}"] * bool(self.recompute_modules)
        extras += [f"ZeRO-{self.zero}"] * (self.zero is not None)
        extras += ["master weights as bf16 remainders"] * (self.master_weights == "remainders")
        if self.stage_layers is not None:
            extras.append(f"stage layers {list(self.stage_layers)}")
        extras += [f"schedule {self.schedule}"] * (self.schedule is not None)
        extras += [f"busiest expert {self.expert_load:g}x the mean load"] * (
            self.expert_load != 1.0)
        extras += ["gradients reduce-scattered per micro-batch"] * (
            self.gradient_sync == "microbatch")
        if self.overlap_all_to_all is not None:
            extras.append(f"all_to_all {'' if self.overlap_all_to_all else 'not '}overlapped")
        extras += ["FP8 dispatch"] * self.fp8_dispatch
        extras += ["gradients reduced in bf16"] * (not self.grad_reduce_in_fp32)
        extras += ["weights held in FP8"] * self.fp8_param_gather
        extras += [f"loss {self.loss}"] * (self.loss is not None)
        extras += ["sequence parallel"] * self.sequence_parallel
        extras += ["distributed optimizer"] * self.distributed_optimizer
        return (f"{' x '.join(parts) or 'one chip'}, micro-batch {self.microbatch}, global "
                f"batch {self.global_batch}" + "".join(f", {e}" for e in extras))


def check(model, layout: Layout, chips: int | None = None):
    """Raise :class:`LayoutError` naming the first limit ``layout`` breaks for ``model``
    on ``chips`` chips (None: as many as the layout's axes make)."""
    m, lay = model, layout
    if chips is not None and chips != lay.chips:
        raise LayoutError(f"{chips} chips, but the layout's axes make dp x fsdp x tp x pp x "
                          f"cp x ep = {lay.dp} x {lay.fsdp} x {lay.tp} x {lay.pp} x {lay.cp} "
                          f"x {lay.ep} = {lay.chips}: the axes must multiply to the chip count")
    _check_experts(m, lay)
    limits = [
        (m.heads % lay.tp, f"heads = {m.heads} do not split over tp = {lay.tp}: tensor "
                           f"parallelism gives each chip whole heads"),
        (m.kv_heads % lay.tp, f"kv_heads = {m.kv_heads} do not split over tp = {lay.tp}: each "
                              f"chip needs whole key/value heads (Megatron's rule)"),
        (m.d_ff % lay.tp, f"d_ff = {m.d_ff} does not split over tp = {lay.tp}"),
        (m.vocab % lay.tp, f"vocab = {m.vocab} does not split over tp = {lay.tp} (the "
                           f"vocabulary-parallel embedding); pad the vocabulary"),
        (sum(stage_split(m, lay)) != m.layers,
         f"stage_layers = {list(lay.stage_layers or ())} add up to "
         f"{sum(lay.stage_layers or ())} layers, not the model's {m.layers}"),
        (lay.global_batch % (lay.replicas * lay.microbatch),
         f"global_batch = {lay.global_batch} sequences is not a whole number of micro-batches "
         f"of {lay.microbatch} on each of dp x fsdp = {lay.replicas} ranks "
         f"({lay.replicas * lay.microbatch} sequences per round)"),
        (m.seq % (lay.cp * (lay.tp if lay.sequence_parallel else 1)),
         f"seq = {m.seq} tokens do not split over cp = {lay.cp}"
         + (f" x tp = {lay.tp} (sequence parallelism)" if lay.sequence_parallel else "")),
    ]
    for broken, message in limits:
        if broken:
            raise LayoutError(message)
    if lay.vp > 1 and lay.microbatches < lay.pp:
        raise LayoutError(f"{lay.microbatches} micro-batches per rank, fewer than pp = "
                          f"{lay.pp} stages: the interleaved schedule needs at least one "
                          f"micro-batch per stage")


def _check_experts(m, lay):
    """Expert parallelism's limits: experts to split, whole experts on each rank, and (with
    tensor parallelism) sequence parallelism, whose tokens the experts route."""
    if not getattr(m, "experts", 0):
        if lay.ep > 1:
            raise LayoutError(f"Layout(ep={lay.ep}) splits a mixture of experts' experts; "
                              f"{m.name or 'this model'} is dense")
        return
    group = lay.ep * lay.tp
    if m.experts % group:
        raise LayoutError(f"experts = {m.experts} do not split over ep x tp = {lay.ep} x "
                          f"{lay.tp}: each rank holds whole experts (expert tensor "
                          f"parallelism 1: the experts fold over tp too)")
    if getattr(m, "route_nodes", None) is not None and lay.tp > 1:
        raise LayoutError(f"route_nodes = {m.route_nodes} with tp = {lay.tp}: node-limited "
                          f"routing's dispatch is written for experts over ep alone "
                          f"(DeepSeek-V3 trains without tensor parallelism)")
    if lay.tp > 1 and not lay.sequence_parallel:
        raise LayoutError(f"a mixture of experts with tp = {lay.tp} needs "
                          f"sequence_parallel=True: each tensor-parallel rank routes its own "
                          f"tokens (Megatron-Core's rule for MoE with tensor parallelism)")
    tokens = lay.microbatch * m.seq // (lay.cp * lay.tp)
    if tokens * m.top_k % m.experts and lay.expert_load == 1.0 and m.capacity_factor is None:
        raise LayoutError(f"{tokens} tokens per rank x top_k = {m.top_k} do not split evenly "
                          f"over {m.experts} experts: a balanced dropless load needs a whole "
                          f"number per expert (state expert_load > 1 to pad)")


def stage_split(model, layout) -> tuple:
    """Transformer layers per virtual stage, in the pipeline's order (virtual stage ``v``
    of stage ``r`` is ``v * pp + r``): ``layout.stage_layers`` where given; else equal
    shares where they divide; else Megatron-Core's split with the embedding and the loss
    each counted as a layer (``account_for_embedding_in_pipeline_split`` and
    ``account_for_loss_in_pipeline_split``, which Megatron-Bridge's LLaMA-3.1-405B recipes
    set: megatron/core/transformer/transformer_block.py, ``get_num_layers_to_build``, adds
    one layer for each, divides by pp x vp, and builds one fewer on the first and on the
    last virtual stage) where that divides; else as evenly as possible, the first
    stages taking one more. The slowest virtual stage is what the SPMD step prices."""
    n, L = layout.pp * layout.vp, model.layers
    if layout.stage_layers is not None:
        return layout.stage_layers
    if L % n == 0:
        return (L // n,) * n
    if n > 1 and (L + 2) % n == 0 and (L + 2) // n >= 2:
        per = (L + 2) // n
        return (per - 1,) + (per,) * (n - 2) + (per - 1,)
    q, r = divmod(L, n)
    return (q + 1,) * r + (q,) * (n - r)
