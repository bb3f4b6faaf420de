"""A whole training step as one SPMD program: the pipeline, the gradients, the optimizer.

:func:`train_step` is the function one device runs inside ``shard_map`` over the
layout's mesh (axes ``pp, dp, fsdp, cp, tp``); :func:`specs` and :func:`arguments` give
its inputs' shardings and shapes. Every device holds its pipeline stage's layers stacked
as ``[vp, layers per virtual stage, ...]`` and runs the same program:

* **The pipeline, as SPMD** (the circular schedule of GSPMD and MaxText): a ``lax.scan``
  over ``microbatches * vp + pp - 1`` ticks. At each tick every stage runs one virtual
  stage's layers (a ``scan`` over them, with ``checkpoint`` as ``recompute`` says) on
  the micro-batch in front of it and ``ppermute`` s the result to the next stage; the
  first stage takes a new micro-batch, or one coming round from the last stage for its
  next virtual stage. The first ``pp - 1`` ticks of the last stage, and the last of the
  first, work on nothing: that is the pipeline's bubble, ``(pp - 1) / (microbatches *
  vp)`` of the useful ticks, the same as Megatron's interleaved schedule (Narayanan et
  al. 2021, arXiv:2104.04473). With ``pp = 1`` the ticks are the micro-batches, whose
  gradients the scan's backward pass accumulates.
* **Gradients**: ``simpmd.grad`` of the summed loss. The weights are cast to vary over
  the axes they are replicated on before the gradient is taken, so that each gradient is
  reduced once per step, in float32, after the backward pass (Megatron's data-parallel
  all-reduce, or a reduce-scatter with the distributed optimizer), not once per use.
* **The optimizer**: Adam on float32 master weights and moments (mixed-precision
  training: Micikevicius et al. 2018, arXiv:1710.03740), the bfloat16 weights cast from
  the updated masters.
"""
from __future__ import annotations

import numpy as np

from .. import lax
from .. import numpy as snp
from ..machine.mesh import PartitionSpec as P
from . import fp8
from . import layers as L
from .layout import LayoutError, stage_split
from ..api.grad import value_and_grad
from ..api.grad import grad

LAYER_SPLIT = {"attn_norm": (None, None), "mlp_norm": (None, None), "wqkv": ("fsdp", "tp"),
               "wo": ("tp", "fsdp"), "w_in": ("fsdp", "tp"), "w_out": ("tp", "fsdp"),
               # a mixture of experts' layer: the router, and the routed experts' matrices
               # stacked [experts, ...], split over the expert-parallel ranks (EXPERTS)
               "router": ("fsdp", None), "e_in": ("E", "fsdp", None),
               "e_out": ("E", None, "fsdp")}
EXPERT_KEYS = ("router", "e_in", "e_out")


def expert_axes(layout) -> tuple:
    """The mesh axes the routed experts are split over: ``ep``, and ``tp`` too (Megatron-
    Core's expert tensor parallelism of 1, where the experts fold over the tensor-parallel
    ranks, each routing its own sequence-parallel tokens)."""
    return tuple(a for a in ("ep", "tp") if layout.shape.get(a, 1) > 1)


def layer_shapes(model) -> dict:
    """One layer's weights as the step stores them: :meth:`Transformer.layer_shapes`; in a
    mixture of experts the MLP's matrices are the shared experts' (``shared_experts x
    expert_d_ff`` wide, absent without them), beside the router [d_model, experts] and the
    routed experts' [experts, d_model, gate and up] and [experts, expert_d_ff, d_model]."""
    shapes = model.layer_shapes()
    if not model.moe:
        return shapes
    D, F, E, gates = model.d_model, model.expert_d_ff, model.experts, model.mlp_matrices - 1
    del shapes["w_in"], shapes["w_out"]
    if model.shared_experts:
        shapes["w_in"] = (D, gates * model.shared_experts * F)
        shapes["w_out"] = (model.shared_experts * F, D)
    shapes.update(router=(D, E), e_in=(E, D, gates * F), e_out=(E, F, D))
    return shapes
OTHER_SPLIT = {"embed": ("tp", "fsdp"), "head": ("fsdp", "tp"), "final_norm": (None,)}


def param_shapes(model, layout) -> dict:
    """Every weight's global shape; the layers stacked ``[pp, vp, layers per virtual
    stage, ...]``, as many as the fullest virtual stage holds (:func:`stage_split`: with
    uneven stages every stage runs the slowest one's program, as SPMD does). A dimension
    split over more ranks than divide it is padded to a multiple of them (GSPMD pads an
    uneven sharding, Xu et al. 2021, arXiv:2105.04663, section 3.3; FSDP pads its flat
    parameter to a multiple of the ranks, Zhao et al. 2023, arXiv:2304.11277, section
    3.2.1), and each use reads the unpadded part."""
    per = max(stage_split(model, layout))
    lead = (layout.pp, layout.vp, per)
    shapes = {k: lead + s for k, s in layer_shapes(model).items()}
    shapes.update(model.other_shapes())
    return {k: _padded(k, shape, layout) for k, shape in shapes.items()}


def _padded(key, shape, layout) -> tuple:
    """``shape`` with the dimension FSDP and the distributed optimizer split (d_model)
    padded to a multiple of the ranks that split it."""
    spec = _split(key, True, layout)
    dim = _fsdp_dim(spec, len(shape)) if "fsdp" in _named(spec) or layout.distributed_optimizer \
        else None
    if dim is None or dim >= len(spec) or spec[dim] is None:
        return shape
    axes = (spec[dim],) if isinstance(spec[dim], str) else spec[dim]
    q = int(np.prod([layout.shape[a] for a in axes]))
    return shape[:dim] + (-(-shape[dim] // q) * q,) + shape[dim + 1:]


def _named(spec) -> set:
    return {a for d in spec for a in ((d,) if isinstance(d, str) else (d or ()))}


def unpadded(w, axis: int, size: int):
    """``w`` cut to ``size`` along ``axis``: the weight without the padding
    :func:`param_shapes` added."""
    if w.shape[axis] == size:
        return w
    return w[(slice(None),) * axis + (slice(0, size),)]


def optimizer_axes(layout, key=None) -> tuple:
    """The axes the distributed optimizer splits the optimizer's state over: every rank
    that holds the same weights, ``dp`` and ``cp`` (Megatron-LM builds its distributed
    optimizer on ``get_data_parallel_group(with_context_parallel=True)``:
    megatron/core/optimizer/__init__.py, ``get_megatron_optimizer``, at d086a2e3), and
    ``ep`` for every weight but the routed experts' (theirs is the expert data-parallel
    group, ``dp``)."""
    if not layout.distributed_optimizer:
        return ()
    ep = ("ep",) if layout.ep > 1 and key not in ("e_in", "e_out") else ()
    return ("dp",) + ep + (("cp",) if layout.cp > 1 else ())


def _one(axes):
    return axes if len(axes) > 1 else axes[0]


def _split(key, optimizer_state, layout):
    """A weight's PartitionSpec; the optimizer's state is split over :func:`optimizer_axes`
    too with the distributed optimizer (along the dimension FSDP splits)."""
    if key in LAYER_SPLIT:
        dims = ("pp", None, None) + LAYER_SPLIT[key][:1 if key.endswith("norm") else 3]
        experts = expert_axes(layout)
        dims = tuple((_one(experts) if experts else None) if d == "E" else d for d in dims)
    else:
        dims = OTHER_SPLIT[key]
    if optimizer_state and layout.distributed_optimizer:
        more = optimizer_axes(layout, key)
        fsdp_dim = dims.index("fsdp") if "fsdp" in dims else len(dims) - 1
        dims = tuple(("fsdp",) + more if d == "fsdp" else more if i == fsdp_dim and d is None
                     else d for i, d in enumerate(dims))
    return P(*dims)


def specs(model, layout):
    """``(in_specs, out_specs)`` of :func:`train_step` for ``shard_map``."""
    keys = param_shapes(model, layout)
    state = {k: _split(k, True, layout) for k in keys}
    weights = state if layout.distributed_optimizer else {k: _split(k, False, layout)
                                                           for k in keys}
    batch = P(None, ("dp", "fsdp") + (("ep",) if layout.ep > 1 else ()), "cp")
    ins = (weights, {"master": state, "mu": state, "nu": state}, batch, batch)
    return ins, (weights, {"master": state, "mu": state, "nu": state}, P())


def arguments(model, layout, struct, dtype="bfloat16"):
    """The step's arguments as ``struct(shape, dtype)`` (``simpmd.ShapeDtypeStruct``):
    weights in ``dtype``, masters and moments in float32, tokens and targets as int32
    ``[micro-batches, sequences, seq]``."""
    shapes = param_shapes(model, layout)
    weights = {k: struct(s, dtype) for k, s in shapes.items()}
    state = lambda kind="float32": {k: struct(s, kind) for k, s in shapes.items()}
    batch = struct((layout.microbatches, layout.replicas * layout.microbatch, model.seq),
                   "int32")
    return weights, {"master": state(MASTER[layout.master_weights]), "mu": state(),
                     "nu": state()}, batch, batch


# The type the master weights are held in: float32, or (Apex's DistributedFusedAdam with
# store_param_remainders, which NeMo sets for bf16 models) the 16 bits a bf16 weight lacks
# of its float32 master, held here as a 16-bit array: on values the master is then bf16.
MASTER = {"fp32": "float32", "remainders": "bfloat16"}


# -- the pipeline -----------------------------------------------------------------------------

def one_trip(s, xs) -> bool:
    """Whether the loop over the micro-batches of ``xs`` (its leading axis counts them) is
    no loop: under XLA, with one micro-batch. XLA's while-loop simplifier removes a loop of
    one trip (``TryRemoveWhileLoop``, xla/hlo/transforms/simplifiers/while_loop_simplifier.cc
    in openxla/xla), so the values of a step without gradient accumulation (MaxText's) are
    not a loop's stacked outputs: the loss's residuals, say, are not held through the
    layers' backward pass. (PyTorch runs one micro-batch without a loop too; there the loop
    stays, as the loss and the head run eagerly where torch.compile fuses only the blocks,
    which is not modelled apart.)"""
    return xs.shape[0] == 1 and s.framework == "xla"


def each_microbatch(s, f, xs):
    """``f`` of each micro-batch of ``xs``, stacked: a ``lax.scan``, or ``f`` of the one
    micro-batch where the loop is no loop (:func:`one_trip`)."""
    if one_trip(s, xs):
        return snp.expand_dims(f(xs[0]), 0)
    return lax.scan(lambda c, x: (c, f(x)), None, xs)[1]


def _stage_ticks(s, lay, stacked, x0):
    """The circular pipeline over ``pp`` stages: outputs [m, b, t, D] of the last virtual
    stage (right on the last stage; every stage computes them, as SPMD does)."""
    m, pp, vp = lay.microbatches, lay.pp, lay.vp
    if pp == 1:
        chunk = {k: w[0] for k, w in stacked.items()}
        return each_microbatch(s, lambda x: L.layers(s, x, chunk), x0)
    stage = lax.axis_index("pp")
    ring = [(j, (j + 1) % pp) for j in range(pp)]
    only = {k: w[0] for k, w in stacked.items()} if vp == 1 else None

    def tick(carry, t):
        state, loop = carry                # loop: on the first stage, what came round
        back = (t - pp) % m                # from the last; on the last, its outputs
        loop = loop.at[back].set(snp.where(stage == 0, state, loop[back]))
        g = t - stage                                    # this stage's step of its work
        r, i = snp.clip(g // m, 0, vp - 1), g % m        # virtual stage, micro-batch
        first = snp.where(r == 0, x0[i], loop[i])
        x = snp.where(stage == 0, first, state)
        y = L.layers(s, x, only) if vp == 1 else L.layers(s, x, stacked, virtual=r)
        loop = loop.at[i].set(snp.where(stage == pp - 1, y, loop[i]))
        return (lax.ppermute(y, "pp", ring), loop), None

    start = L.vary(snp.zeros_like(x0[0]), s.activation_axes())
    loop = L.vary(snp.zeros_like(x0), s.activation_axes())
    (_, loop), _ = lax.scan(tick, (start, loop), snp.arange(m * vp + pp - 1))
    return loop


def loss(s, lay, params, tokens, targets, copies=None, one_at_a_time=False):
    """This device's share of the step's mean loss: embeddings, the pipeline, the head's
    loss for each micro-batch (a ``scan``), on the last stage. ``copies``: the layers'
    weights' FP8 copies (:func:`fp8_weights`)."""
    x0 = each_microbatch(s, lambda tok: L.embed(s, params["embed"], tok), tokens)
    x0 = L.vary(x0, s.activation_axes())
    stacked = {k: w[0] for k, w in params.items() if k in LAYER_SPLIT}
    stacked.update(copies or {})
    if lay.pp > 1 and L.flat_fsdp(s):          # PyTorch's pipeline: once per step
        stacked = L.gather_stage(s, stacked)
    ys = _stage_ticks(s, lay, stacked, x0)
    head = {k: params[k] for k in ("final_norm", "head", "embed") if k in params}
    summed = tuple(a for a in lay.shape if not (a == "tp" and s.size("tp") > 1))
    losses = lambda y, h, t: L.token_losses(s, y, h, t)
    if one_at_a_time:
        losses = L.checkpoint(losses)
    zero = L.vary(snp.zeros((), snp.float32), summed)
    if one_trip(s, targets):
        total = zero + losses(ys[0], head, targets[0])
    else:
        total = lax.scan(lambda c, yt: (c + losses(yt[0], head, yt[1]), None), zero,
                         (ys, targets))[0]
    if lay.pp > 1:
        total = lax.psum(snp.where(lax.axis_index("pp") == lay.pp - 1, total, 0.0), "pp")
    return total / (lay.global_batch * s.model.seq)


def cast_to_fp8(key) -> bool:
    """Whether the layers' weight ``key`` is a GEMM's and cast to FP8 (not a norm's, not
    the router's)."""
    return key in LAYER_SPLIT and not key.endswith("norm") and key != "router"


def fp8_weights(s, params) -> dict:
    """In FP8 without FSDP, the FP8 copies of the stage's layers' weights and their
    transposes, cast once per step (Transformer Engine casts a weight on the step's first
    micro-batch and keeps the copies), outside the gradient: a product reading a copy hands
    its cotangent to the weight itself. With FSDP each layer casts what it gathers."""
    if not s.fp8 or s.size("fsdp") > 1:
        return {}
    out = {}
    for k, w in params.items():
        if cast_to_fp8(k):
            out[k + L.FP8], out[k + L.FP8T], _ = fp8.cast(w[0], transpose=True,
                                                          own_kernel=s.eager)
    return out


# -- gradients and the optimizer ----------------------------------------------------------

def _replicated(spec, lay, smallest=2) -> tuple:
    """The mesh axes (of ``smallest`` devices or more) a weight with ``spec`` is held
    whole on."""
    named = {a for d in spec for a in ((d,) if isinstance(d, str) else (d or ()))}
    return tuple(a for a in lay.shape if a not in named and lay.shape[a] >= smallest)


def _reduce(g, spec, lay, key=None):
    """A weight's gradient, in float32 (or in its own type where the layout reduces in
    it, ``Layout.grad_reduce_in_fp32=False``), summed over the ranks that share it: a
    reduce-scatter over ``dp`` with the distributed optimizer, an all-reduce otherwise.
    The ranks that share a weight are those its spec does not split it over: a routed
    expert's gradient is summed over ``dp`` (and ``cp``), not over ``ep``, whose ranks
    hold other experts; every other weight's over ``dp`` and ``ep`` both."""
    axes = _replicated(spec, lay, 1)          # size-1 axes too, to make the type invariant
    if lay.grad_reduce_in_fp32:
        g = g.astype(snp.float32)
    split = optimizer_axes(lay, key)
    if split and set(split) <= set(axes):
        dims = [d for d in spec] + [None] * (g.ndim - len(spec))
        dim = dims.index("fsdp") if "fsdp" in dims else g.ndim - 1
        g = lax.psum_scatter(g, split if len(split) > 1 else split[0],
                             scatter_dimension=dim, tiled=True)
        axes = tuple(a for a in axes if a not in split)
    return lax.psum(g, axes) if axes else g


def _adam(master, mu, nu, g, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8):
    mu = b1 * mu + (1 - b1) * g
    nu = b2 * nu + (1 - b2) * g * g
    return master - lr * mu / (snp.sqrt(nu) + eps), mu, nu


def train_step(model, layout, flash=True, framework="xla", precision="bf16",
               one_loss_at_a_time=False, node_gpus=None):
    """``step(params, opt, tokens, targets) -> (params, opt, loss)``: one device's training
    step, to be ``shard_map`` ped with :func:`specs`. With the distributed optimizer each
    data-parallel rank holds a slice of the weights too, as Megatron's does between steps,
    and gathers them over ``dp`` as the step begins. ``framework``: what runs it
    (``plan.estimate``'s: the kernels PyTorch runs on their own); ``precision="fp8"``: the
    layers' products in FP8, cast as Transformer Engine casts (:mod:`simpmd.plan.fp8`).
    ``one_loss_at_a_time``: the loss of each micro-batch under a checkpoint that keeps
    only its input, for the memory of a pipeline: a 1F1B schedule runs each
    micro-batch's loss and its backward pass together on the last stage (Narayanan et al.
    2021), which holds one micro-batch's logits at a time, where the SPMD step keeps every
    micro-batch's until its backward scan. ``node_gpus``: the devices of a node (a GPU
    cluster's), which node-limited routing's dispatch needs (``Transformer.route_nodes``);
    None: every expert-parallel rank on one node."""
    s = L.Shard(model, layout.shape, layout.recompute, layout.sequence_parallel, flash,
                framework, precision == "fp8", layout.recompute_layers, layout.expert_load,
                layout.recompute_modules, node_ranks(model, layout, node_gpus),
                layout.fp8_dispatch and precision == "fp8", layout.loss)
    whole = {k: _split(k, False, layout) for k in param_shapes(model, layout)}

    def _gathered(k, w):
        split = optimizer_axes(layout, k)
        if int(np.prod([layout.shape[a] for a in split])) == 1:
            return w
        return lax.all_gather(w, _one(split), axis=_fsdp_dim(whole[k], w.ndim), tiled=True)

    def step(params, opt, tokens, targets):
        if layout.distributed_optimizer and layout.dp * layout.cp * layout.ep > 1:
            params = {k: _gathered(k, w) for k, w in params.items()}  # this rank's slice
            params = {k: w if layout.fsdp > 1 and "fsdp" in _named(whole[k]) else unpadded(
                w, _fsdp_dim(whole[k], w.ndim), model.d_model) for k, w in params.items()}
        varying = {k: L.vary(w, _replicated(whole[k], layout, 1)) for k, w in params.items()}
        copies = fp8_weights(s, varying)
        value, grads = value_and_grad(lambda p: loss(s, layout, p, tokens, targets, copies,
                                                     one_loss_at_a_time))(varying)
        new, state = {}, {"master": {}, "mu": {}, "nu": {}}
        for k in sorted(params):
            g = _reduce(grads[k], whole[k], layout, k)
            held = opt["master"][k]
            master, mu, nu = _adam(held.astype(snp.float32), opt["mu"][k], opt["nu"][k], g)
            new[k] = master.astype(params[k].dtype)
            state["master"][k], state["mu"][k], state["nu"][k] = \
                master.astype(held.dtype), mu, nu
        summed = tuple(a for a in layout.shape if a not in ("tp", "pp") or layout.shape[a] == 1)
        return new, state, lax.psum(value, summed)
    return step


def node_ranks(model, layout, node_gpus):
    """The expert-parallel ranks on one node: ``ep`` ranks lie ``cp x tp`` devices apart
    (:data:`~simpmd.plan.layout.AXES`' order), so a node of ``node_gpus`` holds ``node_gpus
    / (cp x tp)`` of them (at least 1, at most ``ep``). None unless the model routes
    node-limited (``route_nodes``) and the node is known. Raises :class:`LayoutError`
    where the ranks do not fill whole nodes alike (``ep`` not a multiple of them, or
    ``cp x tp`` neither a divisor nor a multiple of the node), which
    :func:`~simpmd.plan.layers.node_limited`'s rotations assume."""
    if getattr(model, "route_nodes", None) is None or not node_gpus:
        return None
    apart = layout.cp * layout.tp
    g = max(1, min(layout.ep, node_gpus // apart))
    uneven = node_gpus % apart and apart % node_gpus
    if uneven or layout.ep % g:
        held = f"{node_gpus} / {apart}, not a whole number," if uneven else str(g)
        raise LayoutError(
            f"route_nodes = {model.route_nodes} with ep = {layout.ep}: a node of {node_gpus} "
            f"GPUs holds {held} expert-parallel rank(s) (they lie cp x tp = {apart} devices "
            f"apart), which do not tile ep = {layout.ep}: node-limited routing sends a token "
            f"to whole nodes of ep ranks. Choose "
            + (f"cp x tp a divisor or a multiple of {node_gpus}" if uneven else
               f"ep a multiple of {g} (or at most {g}, inside one node)"))
    return g


def _fsdp_dim(spec, ndim) -> int:
    dims = [d for d in spec] + [None] * (ndim - len(spec))
    return dims.index("fsdp") if "fsdp" in dims else ndim - 1


def layer_step(model, layout, flash=True, framework="xla"):
    """``step(weights, x) -> (gradients, dx, y)`` for one device: one decoder layer, under
    its checkpoint, forward and backward on activations ``x`` (its loss the sum of its
    output ``y``, which is returned too, as the next layer would read it), without the
    loop around it: what the step's scan repeats, written out so that a roofline that
    counts a loop's body once (``jax.experimental.roofline``) counts what simpmd counts."""
    s = L.Shard(model, layout.shape, layout.recompute, layout.sequence_parallel, flash,
                framework)
    one = {k: P(*_split(k, False, layout)[3:]) for k in LAYER_SPLIT}   # one layer's split
    run = L.checkpointed_layer(s)

    def step(weights, x):
        w = {k: L.vary(v[0, 0, 0], _replicated(one[k], layout, 1)) for k, v in weights.items()}
        x = L.vary(x, s.activation_axes())
        def loss(w, x):
            y = run(x, w)
            return y.astype(snp.float32).sum(), y
        (grads, dx), y = grad(loss, argnums=(0, 1), has_aux=True)(w, x)
        return {k: _reduce(g, one[k], layout) for k, g in grads.items()}, dx, y
    return step


def layer_specs(model, layout):
    """``(in_specs, out_specs)`` and the global shapes (weights, ``x``) of
    :func:`layer_step`, for one layer's weights and ``microbatch`` sequences per rank."""
    one = type(model)(**{**model.__dict__, "layers": layout.pp * layout.vp})
    shapes = {k: v for k, v in param_shapes(one, layout).items() if k in LAYER_SPLIT}
    weights = {k: _split(k, False, layout) for k in shapes}
    tokens = "tp" if layout.sequence_parallel and layout.tp > 1 else None
    ranks = ("pp", "dp", "fsdp") + (("tp",) if layout.tp == 1 else ())  # x varies over all
    x = P(ranks, ("cp", tokens) if tokens else "cp")                     # but a whole tp
    outs = ({k: P(*[d for d in spec][3:]) for k, spec in weights.items()}, x, x)
    x_shape = (layout.pp * layout.replicas * layout.microbatch, model.seq, model.d_model)
    return (weights, x), outs, (shapes, x_shape)
