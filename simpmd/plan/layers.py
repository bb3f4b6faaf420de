"""One device's share of a decoder layer, of the embedding and of the loss, for any layout.

Written with :mod:`simpmd.numpy` and :mod:`simpmd.lax`, so the same functions run on
simpmd's simulated devices (on values, or on shapes at a real model's size) and inside a
real ``jax.shard_map``. They run inside ``shard_map`` over a mesh with the axes of
:data:`~simpmd.plan.layout.AXES`; an axis of size 1 adds no collective.

Tensor parallelism is Megatron's (Shoeybi et al. 2019, arXiv:1909.08053): the query, key
and value projections and the MLP's input matrix are split by columns (heads, hidden
units), the output projections by rows, so each block needs one all-reduce of its output
forward and, as the transpose of using a replicated input on every chip, one backward:
four collectives per layer. With sequence parallelism (Korthikanti et al. 2022,
arXiv:2205.05198) the tokens outside the blocks are split over ``tp`` too and each
all-reduce becomes an all-gather before the block and a reduce-scatter after it. FSDP
gathers each weight just before use (``all_gather``), in the forward pass and again in
the backward pass, whose transpose reduce-scatters its gradient. Context parallelism
splits each sequence over ``cp``; attention gathers every chip's keys and values.
"""
from __future__ import annotations

from dataclasses import dataclass
import math

import numpy as np

from .. import lax
from .. import numpy as snp
from ..api.checkpoint import checkpoint, checkpoint_policies
from ..core import bridge
from ..core.core import aval_of
from ..cost.rows import column
from . import fp8
from .attention import flash_attention, materialized_attention
from .dropout import dropout, dropout_p
from .frameworks import FRAMEWORKS
from .loss import token_losses as trainer_losses


@dataclass(frozen=True)
class Shard:
    """What one device's functions need to know: the model, the axes' sizes, and how the
    layer runs (``recompute``, ``sequence_parallel``, ``flash``: a fused attention kernel;
    ``framework``: ``"xla"`` or ``"megatron"``, whose kernels differ where PyTorch runs an
    operation on its own; ``fp8``: the linear layers in FP8, as Transformer Engine runs
    them, :mod:`simpmd.plan.fp8`)."""

    model: object
    sizes: dict
    recompute: str = "none"
    sequence_parallel: bool = False
    flash: bool = True
    framework: str = "xla"
    fp8: bool = False
    recompute_layers: int | None = None    # full recomputation of this many per stage
    expert_load: float = 1.0               # Layout.expert_load: the busiest expert's load
    recompute_modules: tuple = ()          # Layout.recompute_modules: outputs discarded
    node_ranks: int | None = None          # expert-parallel ranks per node (None: all ep)
    fp8_dispatch: bool = False             # Layout.fp8_dispatch (with fp8)
    loss: str | None = None                # Layout.loss: the loss's kernels (plan/loss.py)

    @property
    def eager(self) -> bool:
        """PyTorch's eager kernels (Megatron-LM, FSDP, DeepSpeed), not XLA's fusion."""
        return FRAMEWORKS[self.framework].eager

    def size(self, axis: str) -> int:
        return self.sizes.get(axis, 1)

    def activation_axes(self) -> tuple:
        """The mesh axes activations vary over: all of them, but ``tp`` where each block's
        all-reduce leaves the tokens whole on every tensor-parallel device."""
        whole = self.size("tp") > 1 and not self.sequence_parallel
        return tuple(a for a in self.sizes if not (whole and a == "tp"))


def vary(x, axes):
    """``x`` typed as varying over each of ``axes`` (``lax.pcast`` of the ones it does not
    vary over yet, as JAX refuses a cast to an axis it already varies over)."""
    if bridge.inside_jax(x):
        import jax  # optional: JAX
        typed = jax.typeof(x)          # jax 0.7: .vma; from 0.10: .manual_axis_type.varying
        have = getattr(typed, "vma", None)
        if have is None:
            have = typed.manual_axis_type.varying
    else:
        have = aval_of(x).vma
    missing = tuple(a for a in axes if a not in have)
    return lax.pcast(x, missing, to="varying") if missing else x


# -- collectives that vanish on an axis of size 1 ---------------------------------------------

def gather_weight(s: Shard, w, axis: int):
    """FSDP: the whole of this device's tensor-parallel slice of ``w``, just in time."""
    if s.size("fsdp") == 1 or w.shape[axis] == s.model.d_model:   # (gathered already)
        return w
    whole = lax.all_gather(w, "fsdp", axis=axis, tiled=True)
    if whole.shape[axis] == s.model.d_model:
        return whole
    return whole[(slice(None),) * axis + (slice(0, s.model.d_model),)]   # the padding cut


def into_block(s: Shard, h):
    """Tokens entering a tensor-parallel block: sequence parallelism gathers them (and
    :func:`layers` gathers them again in the backward pass rather than keep the whole,
    Megatron's choice, Korthikanti et al. 2022, section 4.2.2)."""
    if s.size("tp") > 1 and s.sequence_parallel:
        return lax.all_gather(h, "tp", axis=1, tiled=True)
    return h


def out_of_block(s: Shard, y):
    """A block's partial sums over ``tp``: all-reduced, or reduce-scattered over tokens."""
    if s.size("tp") == 1:
        return y
    if s.sequence_parallel:
        return lax.psum_scatter(y, "tp", scatter_dimension=1, tiled=True)
    return lax.psum(y, "tp")


def residual(s: Shard, x, y, seed: int):
    """The residual stream ``x`` plus a block's output ``y`` after its dropout (Megatron-LM's
    fused bias-dropout-add: one kernel, as XLA fuses it too)."""
    return x + dropout(y, s.model.hidden_dropout, seed)


# -- the layer --------------------------------------------------------------------------------

def _rms_norm(x, scale):
    x32 = x.astype(snp.float32)
    var = (x32 * x32).mean(axis=-1, keepdims=True)
    return (x32 * (1.0 / snp.sqrt(var + 1e-5))).astype(x.dtype) * scale.astype(x.dtype)


def _swiglu(u):
    half = u.shape[-1] // 2
    gate, up = u[..., :half], u[..., half:]
    return gate * (1.0 / (1.0 + snp.exp(-gate))) * up


def _gelu(u):                                 # GELU, tanh form
    return 0.5 * u * (1.0 + snp.tanh(0.7978845608 * (u + 0.044715 * u * u * u)))


def _relu(u):
    return snp.maximum(u, 0)


# A fused kernel keeps its input for the backward pass and computes its intermediates
# again there (Megatron's fused bias-GELU and norm kernels; XLA's fusions): ``checkpoint``
# says the same, so only the input is a residual.
rms_norm = checkpoint(_rms_norm)
swiglu = checkpoint(_swiglu)
gelu = checkpoint(_gelu)
relu = checkpoint(_relu)


def output_discarded(*_, **__) -> bool:
    """The policy of a fused kernel whose output the layer does not keep either: nothing
    inside is kept (as ``checkpoint``'s default), and :func:`discarding` keeps its result
    out of the layer's residuals, so the backward pass runs the kernel again from its
    input: Megatron-Core's output-discarding recomputation (``--recompute-modules
    layernorm moe_act``, megatron/core/transformer/moe/README.md, 'Fine-grained
    Recomputation': the forward pass discards the module's output and the backward pass
    recomputes it)."""
    return False


DISCARDED = {"layernorm": {"norm": checkpoint(_rms_norm, policy=output_discarded)},
             "moe_act": {"swiglu": checkpoint(_swiglu, policy=output_discarded),
                         "gelu": checkpoint(_gelu, policy=output_discarded),
                         "relu": checkpoint(_relu, policy=output_discarded)}}


def norm(s: "Shard", x, scale):
    """A layer's norm (``input_layernorm`` or ``pre_mlp_layernorm``): its output discarded
    and recomputed where ``recompute_modules`` names ``"layernorm"``."""
    if "layernorm" in s.recompute_modules:
        return DISCARDED["layernorm"]["norm"](x, scale)
    return rms_norm(x, scale)


def activation(s: "Shard", u):
    """The MLP's activation: SwiGLU where the model's MLP is gated, else the model's
    (GELU or ReLU)."""
    if s.model.gated_mlp:
        return swiglu(u)
    return relu(u) if s.model.activation == "relu" else gelu(u)


def expert_activation(s: "Shard", u):
    """The routed experts' activation: its output discarded and recomputed where
    ``recompute_modules`` names ``"moe_act"``."""
    if "moe_act" in s.recompute_modules:
        return DISCARDED["moe_act"]["swiglu" if s.model.gated_mlp else s.model.activation](u)
    return activation(s, u)


def discarding(s: "Shard", keep):
    """``keep``, but never the result of a checkpoint under :func:`output_discarded`,
    where ``s`` discards any module's output (else ``keep`` itself)."""
    if keep is None or not s.recompute_modules:
        return keep

    def policy(prim, *avals, **params):
        return params.get("policy") is not output_discarded and keep(prim, *avals, **params)
    return policy


FP8, FP8T = "/fp8", "/fp8t"      # a weight's FP8 copy and its transpose, cast once per step


def weight(s: Shard, w, key: str, axis: int):
    """``w[key]`` as its product reads it: gathered by FSDP; in FP8, the copy the step cast
    once (Transformer Engine's weight cache) with its transpose, or with FSDP one cast
    after the gather."""
    if not s.fp8:
        return gather_weight(s, w[key], axis)
    if key + FP8 in w:
        return fp8.operand(w[key + FP8], w[key + FP8T], like=w[key])
    whole = gather_weight(s, w[key], axis)
    w8, w8t, _ = fp8.cast(whole, transpose=True, own_kernel=s.eager)
    return fp8.operand(w8, w8t, like=whole)


def column_linear(s: Shard, h, w, key: str):
    """A column-parallel product of a norm's output ``h`` (this device's tokens, gathered
    with sequence parallelism) and the amaxes of its casts. In FP8, Transformer Engine's
    ``LayerNormLinear``: the norm writes FP8, the FP8 tokens are gathered, and the backward
    pass casts the output's gradient with its transpose."""
    if not s.fp8:
        return into_block(s, h) @ weight(s, w, key, 0), []
    h8, _, amax = fp8.cast(h)
    y = fp8.operand(into_block(s, h8), dtype=h.dtype) @ weight(s, w, key, 0)
    return fp8.grad_cast(y, transpose=True, own_kernel=s.eager), [amax]


def row_linear(s: Shard, a, w, key: str):
    """A row-parallel product and its collective out of the block, and the amaxes of its
    casts. In FP8, Transformer Engine's ``Linear``: the input cast in a kernel of its own
    (with its transpose, but under sequence parallelism); the output's gradient cast before
    sequence parallelism gathers it (the gather moves FP8), else cast with its transpose."""
    if not s.fp8:
        return out_of_block(s, a @ weight(s, w, key, 1)), []
    a8, a8t, amax = fp8.cast(a, transpose=not s.sequence_parallel, own_kernel=s.eager)
    y = fp8.operand(a8, a8t, dtype=a.dtype) @ weight(s, w, key, 1)
    if s.sequence_parallel and s.size("tp") > 1:
        y = out_of_block(s, fp8.grad_cast(y, "dequant"))
        return fp8.grad_cast(y, "quant", own_kernel=s.eager), [amax]
    return out_of_block(s, fp8.grad_cast(y, transpose=True, own_kernel=s.eager)), [amax]


def attention_block(s: Shard, x, w):
    """Norm, the fused query/key/value projection, attention over this device's heads,
    the output projection and its collective; and the amaxes of its FP8 casts."""
    m = s.model
    qkv, amaxes = column_linear(s, norm(s, x, w["attn_norm"]), w, "wqkv")
    b, t, _ = qkv.shape
    nq, nkv = m.heads // s.size("tp"), m.kv_heads // s.size("tp")
    q = qkv[..., :nq * m.head_dim].reshape(b, t, nq, m.head_dim)
    k = qkv[..., nq * m.head_dim:(nq + nkv) * m.head_dim].reshape(b, t, nkv, m.head_dim)
    v = qkv[..., (nq + nkv) * m.head_dim:].reshape(b, t, nkv, m.head_dim)
    offset = None
    if s.size("cp") > 1:
        k = lax.all_gather(k, "cp", axis=1, tiled=True)
        v = lax.all_gather(v, "cp", axis=1, tiled=True)
        offset = lax.axis_index("cp") * t
    def core(q, k, v, *at):
        if s.flash:
            return flash_attention(q, k, v, q_offset=at[0] if at else None,
                                   dropout=m.attention_dropout, seed=1)
        return materialized_attention(q, k, v, True, at[0] if at else None,
                                      dropout=m.attention_dropout, seed=1, own_kernel=s.eager)
    if s.recompute == "selective" and s.framework == "megatron":
        core = checkpoint(core)      # Megatron's checkpoint_core_attention: see policy()
    o = core(q, k, v, *(() if offset is None else (offset,)))
    y, more = row_linear(s, o.reshape(b, t, nq * m.head_dim), w, "wo")
    return residual(s, x, y, seed=2), amaxes + more


def mlp_block(s: Shard, x, w):
    """Norm, the MLP's input matrix (gate and up side by side when gated), SwiGLU or
    GELU, the output matrix and its collective; and the amaxes of its FP8 casts."""
    u, amaxes = column_linear(s, norm(s, x, w["mlp_norm"]), w, "w_in")
    u = activation(s, u)
    y, more = row_linear(s, u, w, "w_out")
    return residual(s, x, y, seed=3), amaxes + more


MATRICES = {"wqkv": 0, "wo": 1, "w_in": 0, "w_out": 1}    # each one's FSDP-split axis


def flat_fsdp(s: Shard) -> bool:
    """Whether the layers' weights are FSDP's flat parameters (PyTorch FSDP over >1 rank)."""
    return s.framework.startswith("pytorch") and s.size("fsdp") > 1


def flattened(stacked, lead: int):
    """The stacked layers' matrices as one flat parameter per layer, each rank's shards side
    by side (``lead``: the stacking axes), and each matrix's per-layer shape: FSDP holds its
    shard of a layer flat between steps; here the stage's shards are laid out flat once per
    micro-batch, before the layers run, so that each layer's gather can start early."""
    keys = [k for k in MATRICES if k in stacked]
    shapes = {k: stacked[k].shape[lead:] for k in keys}
    lead_shape = stacked[keys[0]].shape[:lead]
    flat = snp.concatenate([stacked[k].reshape(lead_shape + (-1,)) for k in keys], axis=-1)
    rest = {k: w for k, w in stacked.items() if k not in keys}
    return {**rest, "flat": flat}, shapes


def gather_flat(s: Shard, w, shapes=None) -> dict:
    """PyTorch FSDP's gather: the layer's matrices as one flat parameter, each rank's shard
    of every matrix side by side, gathered in one all-gather (and, as the checkpoint
    gathers again, once more in the backward pass, whose transpose reduce-scatters the
    layer's flat gradient): FSDP wraps each decoder layer as one FlatParameter (Zhao et al.
    2023, arXiv:2304.11277, section 3.2.1), where ZeRO-3 gathers parameter by parameter.
    Each matrix is then a view of the gathered buffer, cut to d_model."""
    if shapes is None:                    # one layer's matrices, not yet flat
        keys = [k for k in MATRICES if k in w]
        shapes = {k: w[k].shape for k in keys}
        w = {**{k: v for k, v in w.items() if k not in keys},
             "flat": snp.concatenate([w[k].reshape(-1) for k in keys])}
    whole = lax.all_gather(w["flat"], "fsdp", axis=0, tiled=False)   # [fsdp, flat shard]
    f, start = s.size("fsdp"), 0
    out = {k: v for k, v in w.items() if k != "flat"}
    for k, local in shapes.items():
        n = int(np.prod(local))
        part = whole[:, start:start + n].reshape((f,) + tuple(local))
        start += n
        if MATRICES[k] == 0:
            full = part.reshape((f * local[0], local[1]))
        else:
            full = part.transpose(1, 0, 2).reshape((local[0], f * local[1]))
        axis = MATRICES[k]
        out[k] = full[(slice(None),) * axis + (slice(0, s.model.d_model),)] \
            if full.shape[axis] != s.model.d_model else full
    return out


# -- a mixture of experts' MLP ----------------------------------------------------------------

def expert_group(s: Shard) -> tuple:
    """The axes a token's experts may be on: ``ep``, and ``tp`` where the experts fold over
    it (:func:`simpmd.plan.step.expert_axes`)."""
    return tuple(a for a in ("ep", "tp") if s.size(a) > 1)


def expert_nodes(s: Shard) -> int:
    """The nodes the expert-parallel ranks span (``ep / node_ranks``; 1 without a node
    size)."""
    ep = s.size("ep")
    return ep // min(ep, s.node_ranks) if s.node_ranks else 1


def node_slots(s: Shard, tokens: int) -> int:
    """Slots for one rank's tokens on each node of its experts, node-limited routing's
    dispatch buffer (:func:`node_limited`): each token goes to ``min(route_nodes, nodes)``
    of the ``nodes``, so the mean is ``tokens x min(M, nodes) / nodes``, times the
    ``expert_load`` the expert slots are sized for (capped at every token)."""
    nodes = expert_nodes(s)
    M = min(s.model.route_nodes, nodes)
    return min(tokens, max(1, math.ceil(tokens * M / nodes * s.expert_load)))


def expert_slots(s: Shard, tokens: int) -> int:
    """Slots each expert has for one rank's ``tokens``: the mean load, ``tokens x top_k /
    experts``, times the capacity factor (tokens past it dropped), or for dropless routing
    times ``expert_load``, the busiest expert's load over the mean, which every expert's
    slots are sized for (a static program's buffers; a synchronous step waits for the
    rank with the busiest experts, and a rank's load is never more uneven than its busiest
    expert's). The runs validated here force a balanced load, ``expert_load = 1``
    (Megatron-Bridge's performance summary says so); a learned router's imbalance is
    the user's to state, from a measurement of their own."""
    m = s.model
    factor = m.capacity_factor if m.capacity_factor is not None else s.expert_load
    return max(1, math.ceil(tokens * m.top_k / m.experts * factor))


def route(s: Shard, flat, router):
    """The router: logits [tokens, experts] in float32, their softmax, the ``top_k``
    experts of each token with their gates (renormalized over the chosen, as Qwen3's
    ``norm_topk_prob`` does), the count of each token's choices per expert, and the
    load-balancing loss of Switch Transformer (Fedus et al. 2021, arXiv:2101.03961,
    eq. 4: experts x sum over experts of the fraction routed times the mean probability)."""
    m = s.model
    logits = (flat @ gather_weight(s, router, 0)).astype(snp.float32)
    e = snp.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = e / e.sum(axis=-1, keepdims=True)
    nodes = expert_nodes(s)
    if getattr(m, "route_nodes", None) is not None and nodes > m.route_nodes:
        per = probs.reshape(probs.shape[0], nodes, m.experts // nodes)
        best, _ = lax.top_k(per, m.top_k // m.route_nodes)   # each node's best affinities
        _, picked = lax.top_k(best.sum(axis=-1), m.route_nodes)             # [tokens, M]
        on = (picked[..., None] == np.arange(nodes, dtype=np.int32)).astype(snp.float32)
        allowed = snp.repeat(on.sum(axis=1), m.experts // nodes, axis=1) > 0.5
        gates, chosen = lax.top_k(snp.where(allowed, probs, -1.0), m.top_k)
    else:
        gates, chosen = lax.top_k(probs, m.top_k)
    gates = gates / gates.sum(axis=-1, keepdims=True)
    hits = (chosen[..., None] == np.arange(m.experts, dtype=np.int32)).astype(snp.float32)
    per_expert = hits.sum(axis=1)                                  # [tokens, experts]
    aux = m.experts * (per_expert.mean(axis=0) / m.top_k * probs.mean(axis=0)).sum()
    return gates, chosen, per_expert, aux


def grouped(s: Shard, tokens, w, key: str, axis: int):
    """The grouped product of every local expert's tokens [experts, slots, D] with its own
    matrix (one batched product: the groups are the experts, each the same number of slots;
    ``lax.ragged_dot`` is the same product on rows of uneven groups). In FP8 the tokens are
    cast with their transpose and the output's gradient cast, as Transformer Engine's
    ``GroupedLinear`` runs it; and its amaxes."""
    if not s.fp8:
        return snp.einsum("ecd,edf->ecf", tokens, weight(s, w, key, axis)), []
    t8, t8t, amax = fp8.cast(tokens, transpose=True, own_kernel=s.eager)
    y = snp.einsum("ecd,edf->ecf", fp8.operand(t8, t8t, dtype=tokens.dtype),
                   weight(s, w, key, axis))
    return fp8.grad_cast(y, transpose=True, own_kernel=s.eager), [amax]


def _rotations(ranks: int, group: int, across: bool) -> list:
    """The ``ppermute`` s of a two-level exchange over ``ranks`` ranks in nodes of ``group``
    consecutive ranks: for each offset o (0, the rank itself, needs none), the pairs that
    send to the rank of the same local index o nodes on (``across``), or to the rank o
    places on within the node. Returned as (offset, pairs)."""
    out = []
    count = ranks // group if across else group
    for o in range(1, count):
        if across:
            pairs = [(r, (r // group + o) % count * group + r % group) for r in range(ranks)]
        else:
            pairs = [(r, r // group * group + (r % group + o) % group) for r in range(ranks)]
        out.append((o, pairs))
    return out


def _exchange(blocks, axis, moves, forward=True):
    """Block o of ``blocks`` (a list, or an array's first axis) sent along ``moves``'
    rotation by o (block 0 stays; ``forward=False``: each rotation's inverse, sending back
    what it brought): the blocks received, in the same order of offsets."""
    got = [blocks[0]]
    for o, pairs in moves:
        got.append(lax.ppermute(blocks[o], axis, pairs if forward else
                                [(b, a) for a, b in pairs]))
    return got


def _fp8_payload(s: Shard, x):
    """The dispatch's tokens in FP8 (E4M3) with a scale per 1x128 tile, an integral power
    of 2 (DeepSeek-V3 report, section 3.3: fine-grained quantization, and for this
    activation power-of-2 scales; the dispatch in FP8, the combine in BF16), as
    ``(x8, scales)`` (float32 [..., D / 128], sent beside the tokens); ``(x, None)`` unless
    asked (``Layout.fp8_dispatch``). The scale's exponent is an integer, so no gradient
    flows through it; the cast's is straight through (:mod:`.fp8`)."""
    if not (s.fp8 and s.fp8_dispatch):
        return x, None
    D = x.shape[-1]
    tile = min(128, D)
    tiles = x.astype(snp.float32).reshape(x.shape[:-1] + (D // tile, tile))
    amax = snp.maximum(snp.abs(tiles).max(axis=-1), 1e-30)
    exponent = snp.ceil(snp.log(amax / 448.0) / math.log(2.0)).astype(snp.int32)
    scale = snp.exp(exponent.astype(snp.float32) * math.log(2.0))     # 2 ** exponent
    x8, _, _ = fp8.cast((tiles / scale[..., None]).reshape(x.shape).astype(x.dtype))
    return x8, scale


def _dequantized(x8, scale, dtype):
    """FP8 tokens ``x8`` [..., D] times their tiles' ``scale`` [..., D / tile], in ``dtype``."""
    D = x8.shape[-1]
    tiles = scale.shape[-1]
    x = fp8.operand(x8, dtype=dtype).reshape(x8.shape[:-1] + (tiles, D // tiles))
    return (x * scale[..., None].astype(dtype)).reshape(x8.shape)


def _zeros_like(x, rows: int):
    """Zeros [rows, x's last axis], typed as ``x`` (varying where it varies): the buffer a
    scatter-add sums into."""
    return snp.broadcast_to(snp.zeros_like(x.reshape(-1, x.shape[-1])[:1]),
                            (rows, x.shape[-1]))


def node_limited(s: Shard, flat, token, filled, gate, chosen, experts):
    """Node-limited routing's dispatch and combine (DeepSeek-V3 report, arXiv:2412.19437,
    section 3.2.2): a token crosses the network (IB) once to each node it has experts on,
    to the rank of its local index there, which forwards it over NVLink to its experts'
    ranks; the combine comes back so, the forwarding rank summing the weighted outputs.
    As ``ppermute`` s over ``ep``: ``nodes - 1`` rotations across nodes of [node_slots, D]
    tokens (:func:`node_slots`) with each slot's token and gate, then ``node_ranks - 1``
    within the node, giving what the ``all_to_all`` gives. ``token``, ``filled``, ``gate``:
    [experts, slots]; ``experts``: the grouped products. Returns [tokens, D] and amaxes."""
    n, D = flat.shape
    E, C = token.shape
    ep = s.size("ep")
    N = expert_nodes(s)
    g = ep // N                                                 # ranks per node
    En, El, U = E // N, E // ep, node_slots(s, n)
    node, local = lax.axis_index("ep") // g, lax.axis_index("ep") % g
    # Everything is held in the order of the rotations that move it: block o of what a
    # rank sends goes o nodes (or o places within the node) on, block o of what it gets
    # came from o back, and the combine sends each block back the way it came.
    place, tok, valid, ahead = _node_tokens(chosen, En, N, U, node)
    # each expert slot's token, as its place among what its node gets (-1: none)
    slot_node = (np.arange(E, dtype=np.int32) // En)[:, None]              # [E, 1]
    at = place.reshape(n * N)[token * N + slot_node]                       # [E, C]
    index = snp.where(filled & (at < U), at, -1).astype(snp.int32).reshape(N, En, C)
    gate = snp.where(index.reshape(E, C) >= 0, gate, 0.0).reshape(N, En, C)
    across, within = _rotations(ep, g, True), _rotations(ep, g, False)
    # over the network: each expert slot's token and gate, then the tokens
    got_index = snp.stack(_exchange(index[ahead], "ep", across))     # [N from o back, En, C]
    got_gate = snp.stack(_exchange(gate[ahead], "ep", across))
    # the forwarding rank's expert slots, grouped by the local rank o places on
    there = (local + np.arange(g, dtype=np.int32)) % g
    slots_index = got_index.reshape(N, g, El, C).transpose(1, 2, 0, 3)[there]  # [g, El, N, C]
    slots_gate = got_gate.reshape(N, g, El, C).transpose(1, 2, 0, 3)[there]
    rows = (np.arange(N, dtype=np.int32) * U)[None, None, :, None]
    on = slots_index >= 0

    def forwarded(x):               # [N, U, w] over IB, into [El, ep x C, w] over NVLink
        got = snp.stack(_exchange(x, "ep", across)).reshape(N * U, x.shape[-1])
        slots = got[rows + snp.clip(slots_index, 0, U - 1)]             # [g, El, N, C, w]
        slots = slots.reshape(g, El, N * C, x.shape[-1])  # (an empty slot holds a token
        return snp.concatenate(_exchange(slots, "ep", within), axis=1)  # combined nowhere)

    sent, scale = _fp8_payload(s, flat[tok])      # (past a node's count: combined nowhere)
    sent = forwarded(sent)
    if scale is not None:
        sent = _dequantized(sent, forwarded(scale), flat.dtype)
    y, amaxes = experts(sent)                                           # [El, ep x C, D]
    # combine: back within the node, each token's outputs summed at the forwarding rank
    # (weighted by its gates), back over the network once
    back = [y[:, o * N * C:(o + 1) * N * C] for o in range(g)]
    home = snp.stack(_exchange(back, "ep", within, forward=False))      # [g, El, N x C, D]
    outs = home.reshape(g, El, N, C, D) * slots_gate[..., None].astype(y.dtype)
    where = snp.where(on, rows + slots_index, N * U)
    summed = _zeros_like(outs, N * U + 1).at[where.reshape(-1)].add(
        outs.reshape(-1, D))[:N * U].reshape(N, U, D)                   # [N from o back..]
    result = snp.stack(_exchange(summed, "ep", across, forward=False))  # [N o on, U, D]
    to = snp.where(valid, tok, n).reshape(N * U)
    return _zeros_like(result, n + 1).at[to].add(result.reshape(N * U, D))[:n], amaxes


def _node_tokens(chosen, En, N, U, node):
    """Which of a rank's tokens go to each node (``chosen``: each token's experts, ``En``
    experts a node): each token's place among those its node gets ([tokens, N]), and for
    node o on from this rank's (``node``), the tokens it gets ([N, U]: the first U,
    :func:`node_slots`), which of those places hold one, and the nodes' order."""
    n = chosen.shape[0]
    to_node = (chosen[..., None] // En == np.arange(N, dtype=np.int32)).astype(snp.int32)
    to_node = (to_node.sum(axis=1) > 0).astype(snp.int32)                 # [tokens, N]
    place = snp.cumsum(to_node, axis=0) - 1                               # [tokens, N]
    key = (1 - to_node.T) + 2 * np.arange(N, dtype=np.int32)[:, None]      # [N, tokens]
    first = snp.argsort(key.reshape(N * n)).reshape(N, n)[:, :U]
    tok = first - (np.arange(N, dtype=np.int32) * n)[:, None]              # [N, U]
    valid = np.arange(U, dtype=np.int32)[None, :] < to_node.sum(axis=0)[:, None]
    ahead = (node + np.arange(N, dtype=np.int32)) % N                     # node o on
    return place, tok[ahead], valid[ahead], ahead                         # [N offset, U]


def moe_block(s: Shard, x, w):
    """A mixture of experts' MLP, dropless or with a capacity, over expert parallelism:
    norm; the router (:func:`route`); the *permutation*, each token copied into the slots
    of its ``top_k`` experts in expert order (a stable sort of the choices, a gather: the
    kernel Megatron-Core's ``permute`` runs); the *dispatch* ``all_to_all`` over the
    expert-parallel ranks, after which each rank holds its own experts' slots from every
    rank; the grouped products and activation; the *combine* ``all_to_all`` back; the
    *unpermutation*, each token's outputs gathered and weighted by its gates; the shared
    experts beside them. Slots beyond an expert's count hold zeros (:func:`expert_slots`
    sizes them). The load-balancing loss is added to the output times zero, so that its kernels run forward
    and backward (as Megatron-Core's ``MoEAuxLossAutoScaler`` injects its gradient): the
    layer's value and gradient unchanged, its cost the same."""
    m = s.model
    h = norm(s, x, w["mlp_norm"])
    b, t, D = h.shape
    n, k, E = b * t, m.top_k, m.experts
    flat = h.reshape(n, D)
    gates, chosen, per_expert, aux = route(s, flat, w["router"])
    C = expert_slots(s, n)
    choice = chosen.reshape(n * k)
    order = snp.argsort(choice)                            # by expert, then token
    counts = per_expert.sum(axis=0).astype(snp.int32)     # [experts]
    starts = snp.cumsum(counts) - counts
    slot = np.arange(C, dtype=np.int32)
    token = order[snp.clip(starts[:, None] + slot[None, :], 0, n * k - 1)] // k
    filled = slot[None, :] < counts[:, None]                           # [experts, slots]
    group = expert_group(s)

    def experts(sent):
        u, amaxes = grouped(s, sent, w, "e_in", 1)
        y, more = grouped(s, expert_activation(s, u), w, "e_out", 2)
        return y, amaxes + more

    if getattr(m, "route_nodes", None) is not None and group == ("ep",):
        pick = order[snp.clip(starts[:, None] + slot[None, :], 0, n * k - 1)]  # its choice
        gate = snp.where(filled, gates.reshape(n * k)[pick], 0.0).astype(h.dtype)
        out, amaxes = node_limited(s, flat, token, filled, gate, chosen, experts)
        out = out.reshape(b, t, D)
    else:
        sent = snp.where(filled[..., None], flat[token], snp.zeros((), h.dtype))
        if group:
            axes = group if len(group) > 1 else group[0]
            sent, scale = _fp8_payload(s, sent)
            sent = lax.all_to_all(sent, axes, 0, 1, tiled=True)
            if scale is not None:
                sent = _dequantized(sent, lax.all_to_all(scale, axes, 0, 1, tiled=True),
                                    h.dtype)
        y, amaxes = experts(sent)
        if group:
            y = lax.all_to_all(y, group if len(group) > 1 else group[0], 1, 0, tiled=True)
        place = snp.argsort(order) - starts[choice]      # each choice's slot of its expert
        kept = place < C
        back = y.reshape(E * C, D)[snp.clip(choice * C + place, 0, E * C - 1)]
        weights = snp.where(kept, gates.reshape(n * k), 0.0).astype(h.dtype)
        out = (back * weights[:, None]).reshape(n, k, D).sum(axis=1).reshape(b, t, D)
    if m.shared_experts:
        shared, more = _shared_experts(s, h, w)
        out, amaxes = out + shared, more + amaxes
    out = out + (0.0 * aux).astype(out.dtype)
    return residual(s, x, out, seed=3), amaxes


def _shared_experts(s: Shard, h, w):
    """The shared experts: an MLP every token runs, tensor-parallel as the dense one."""
    u, first = column_linear(s, h, w, "w_in")
    shared, second = row_linear(s, activation(s, u), w, "w_out")
    return shared, first + second


def gather_stage(s: Shard, stacked) -> dict:
    """A pipeline stage's layers' weights gathered over ``fsdp`` once per step, before its
    micro-batches run (``stacked``: [vp, layers, ...] per matrix), where without a pipeline
    each layer gathers its own as it runs: torchtitan does not reshard after the forward
    pass when pipeline parallelism is on ("For PP, by default do not reshard after forward
    to avoid per-microbatch all-gathers", ``reshard_after_forward = not pp_enabled`` in
    ``apply_fsdp``, torchtitan/models/llama3/infra/parallelize.py), and PyTorch's pipeline
    stage skips the backward's reshard and gradient reduce-scatter on every micro-batch but
    the last (``backward_maybe_with_nosync``, torch/distributed/pipelining/stage.py); the
    Llama 3 paper (Dubey et al. 2024, section 3.3.2) keeps its FSDP weights gathered
    between the forward and backward passes too. The gather's transpose, outside the
    micro-batch loop, is the step's one reduce-scatter of the stage's gradients."""
    out = dict(stacked)
    for k, axis in MATRICES.items():
        if k in stacked and stacked[k].shape[-2 + axis] != s.model.d_model:
            whole = lax.all_gather(stacked[k], "fsdp", axis=stacked[k].ndim - 2 + axis,
                                   tiled=True)
            cut = [slice(None)] * whole.ndim
            cut[whole.ndim - 2 + axis] = slice(0, s.model.d_model)
            out[k] = whole[tuple(cut)]
    return out


def gathered(s: Shard, stacked) -> bool:
    """Whether ``stacked``'s matrices are whole over ``fsdp`` already (:func:`gather_stage`)."""
    return "wqkv" in stacked and stacked["wqkv"].shape[-2] == s.model.d_model


def layer(s: Shard, x, w):
    """One decoder layer: its output, and the amaxes of its FP8 casts (None without)."""
    if flat_fsdp(s) and "wqkv" in w and w["wqkv"].shape[0] != s.model.d_model:
        w = gather_flat(s, w)                          # (one layer on its own)
    x, first = attention_block(s, x, w)
    x, second = (moe_block if s.model.moe else mlp_block)(s, x, w)
    return x, (snp.stack(first + second) if s.fp8 else None)


# Gradient amaxes a layer's backward pass records: two per product (Transformer Engine's
# GRAD_OUTPUT1 and GRAD_INPUT1 of each module's backward scaling).
GRAD_AMAXES = 2 * 4


REGATHERED = frozenset({"all_gather", "gather", "dynamic_slice"})


def keep_all_but_gathers(prim, *avals, **params) -> bool:
    """A checkpoint policy (JAX's signature): keep every value for the backward pass but
    what a gather made, which the backward pass gathers again: FSDP's weights (the
    book's FSDP gathers in both passes), the tokens sequence parallelism gathers
    (Megatron's choice, Korthikanti et al. 2022, section 4.2.2) and a virtual stage's
    weights picked out of the stage's; nor a view (a reshape, a squeeze, an FP8 value as a
    product reads it: the cost model's ``fusion`` column), which is its operand's buffer:
    computing it again is free, and keeping it would keep a copy of each weight a view
    picks, once per micro-batch."""
    return getattr(prim, "name", "") not in REGATHERED and column(prim, "fusion") != "view"


REDUCED = frozenset({"psum", "psum2", "psum_invariant", "psum_scatter", "reduce_scatter"})


def keep_products(prim, *avals, **params) -> bool:
    """A checkpoint policy: keep the weights' products (``dot_general`` without batch
    axes, JAX's ``dots_with_no_batch_dims_saveable``) and their sums over ``tp`` (the
    all-reduce or reduce-scatter after a row-split product, which GSPMD counts as part of
    the product); compute everything else again in the backward pass."""
    name = getattr(prim, "name", "")
    return name in REDUCED or checkpoint_policies.dots_with_no_batch_dims_saveable(
        prim, *avals, **params)


def keep_all_but_the_attention_core(prim, *avals, **params) -> bool:
    """Megatron-LM's selective recomputation: every value kept but the attention's core
    (its products with the scores, softmax and dropout), which the layer runs under a
    checkpoint of its own that keeps only its inputs, q, k and v (Korthikanti et al.
    2022, section 5; Megatron-LM's ``checkpoint_core_attention`` when
    ``recompute_granularity='selective'``, megatron/core/transformer/attention.py).
    Under a fused attention kernel that saves nothing: the kernel's forward runs again."""
    return not (prim is dropout_p and params.get("site") == "attention") and \
        keep_all_but_gathers(prim, *avals, **params)


def keep_all_but_gathers_and_their_views(prim, *avals, **params) -> bool:
    """:func:`keep_all_but_gathers`, keeping none of the slices and transposes that cut
    FSDP's gathered flat parameter into its weights either (FSDP's FULL_SHARD frees the
    unsharded parameter after the forward pass and gathers it again for the backward)."""
    return getattr(prim, "name", "") not in ("slice", "transpose") and keep_all_but_gathers(
        prim, *avals, **params)


POLICIES = {"none": keep_all_but_gathers, "selective": keep_products, "full": None}


def policy(s: Shard):
    """The checkpoint policy of each layer: :data:`POLICIES`'s; Megatron-LM's selective
    recomputation, which recomputes only the attention's core; PyTorch FSDP's, which
    gathers its flat parameters again for the backward pass; with ``recompute_modules``,
    none of the discarded modules' outputs kept (:func:`discarding`)."""
    if s.recompute == "selective" and s.framework == "megatron":
        keep = keep_all_but_the_attention_core
    elif s.recompute == "none" and s.framework.startswith("pytorch") and s.size("fsdp") > 1:
        keep = keep_all_but_gathers_and_their_views
    else:
        keep = POLICIES[s.recompute]
    return discarding(s, keep)


def layers(s: Shard, x, stacked, virtual=None):
    """The layers whose weights are stacked along the first axis of each of ``stacked``'s
    arrays, as one ``lax.scan``, each layer a ``checkpoint`` whose policy is what
    ``recompute`` keeps for the backward pass: ``"none"``, all but what
    :func:`keep_all_but_gathers` gathers again; ``"selective"``, what
    :func:`keep_products` keeps (the attention's scores, softmax and output, the norms
    and activations are computed again: MaxText's 'minimal'), or under Megatron all but
    the attention's core (:func:`keep_all_but_the_attention_core`, Korthikanti et al.'s);
    ``"full"``, only the layer's input.
    ``virtual``: the index of a virtual stage, whose layers are ``stacked[k][virtual]``."""
    shapes = None
    if flat_fsdp(s) and not gathered(s, stacked):     # FSDP's flat parameters, once
        stacked, shapes = flattened(stacked, 1 if virtual is None else 2)

    def one(h, w):
        return layer(s, h, gather_flat(s, w, shapes) if shapes else w)

    if virtual is None and s.recompute_layers is not None:   # pick layers by index, so
        stacked, virtual = {k: w[None] for k, w in stacked.items()}, 0   # both scans

    def picked(h, i):
        w = {k: ws[virtual, i] for k, ws in stacked.items()}
        return one(h, w)
    body = one if virtual is None else picked
    count = next(iter(stacked.values())).shape[0 if virtual is None else 1]
    xs = stacked if virtual is None else snp.arange(count)
    if s.fp8:
        x = fp8.region(x, GRAD_AMAXES * count, s.sizes)   # its backward's end: the
    y, amaxes = _scans(s, body, x, xs, count)             # gradients' amaxes reduced
    return fp8.sync(y, amaxes, s.sizes) if s.fp8 else y   # the forward's end: the amaxes


def _scans(s: Shard, body, x, xs, count):
    """The layers as one scan under :func:`policy`, or, with ``recompute_layers = k``, a
    scan of the first ``k`` recomputed whole and one of the rest keeping what
    ``recompute="none"`` keeps (Megatron-LM's block method: the first k layers of each
    virtual stage, megatron/core/transformer/transformer_block.py). The layers' FP8
    amaxes, stacked."""
    k = s.recompute_layers
    if k is None or k >= count:
        return lax.scan(checkpoint(body, policy=policy(s)), x, xs)
    parts = [(slice(0, k), None), (slice(k, count), discarding(s, keep_all_but_gathers))]
    amaxes = []
    for part, keep in parts:
        if part.stop == part.start:
            continue
        x, a = lax.scan(checkpoint(body, policy=keep), x, xs[part])
        amaxes.append(a)
    return x, (snp.concatenate(amaxes, axis=0) if s.fp8 else None)


def checkpointed_layer(s: Shard):
    """``layer(x, w)`` under the checkpoint that :func:`layers` puts around each layer."""
    return checkpoint(lambda x, w: layer(s, x, w)[0], policy=policy(s))


# -- embedding and loss -----------------------------------------------------------------------

def embed(s: Shard, table, tokens):
    """Vocabulary-parallel lookup (Megatron's): each ``tp`` device holds V / tp rows and
    looks up the tokens in its range; a psum over ``tp`` (a reduce-scatter over tokens,
    with sequence parallelism) completes every embedding; then the embedding's dropout
    (Megatron-LM's ``torch.nn.Dropout`` at ``--hidden-dropout``)."""
    table = gather_weight(s, table, 1)
    if s.size("tp") == 1:
        found = table[tokens]
    else:
        rows = table.shape[0]
        local = tokens - lax.axis_index("tp") * rows
        inside = (local >= 0) & (local < rows)
        found = table[snp.clip(local, 0, rows - 1)]   # (times a [b, t, 1] mask: the
        found = out_of_block(s, found * inside[..., None].astype(table.dtype))   # one kept)
    return dropout(found, s.model.hidden_dropout, 0, own_kernel=s.eager)


def token_losses(s: Shard, x, params, targets):
    """The summed next-token loss of this device's tokens ``x`` [b, t, D], with the
    vocabulary split over ``tp``: each device's log-sum-exp of its slice combined with a
    psum (a production kernel subtracts the global maximum first). With ``s.loss`` (and
    the vocabulary whole on the device) the trainer's own loss kernels,
    :mod:`simpmd.plan.loss`."""
    h = into_block(s, rms_norm(x, params["final_norm"]))
    if "head" in params:
        logits = h @ gather_weight(s, params["head"], 0)
    else:                                      # tied: the embedding table, transposed
        logits = snp.einsum("btd,vd->btv", h, gather_weight(s, params["embed"], 1))
    if s.loss is not None and s.size("tp") == 1 and not bridge.inside_jax(logits):
        return trainer_losses(logits, targets, s.loss)      # the trainer's own kernels
    logits = logits.astype(snp.float32)
    rows = logits.shape[-1]
    local_max = logits.max(axis=-1, keepdims=True)
    total = (snp.exp(local_max[..., 0]) * snp.exp(logits - local_max).sum(axis=-1))
    local = targets - (lax.axis_index("tp") * rows if s.size("tp") > 1 else 0)
    hit = local[..., None] == np.arange(rows, dtype=np.int32)
    target = snp.where(hit, logits, 0.0).sum(axis=-1)
    if s.size("tp") > 1:
        total, target = lax.psum(total, "tp"), lax.psum(target, "tp")
    return (snp.log(total) - target).sum()
