"""A LLaMA-3-shaped training step, written once for simpmd and for JAX (benchmarks/llama_step.py).

The model is the one the Scaling Book's "Training LLaMA 3 on TPUs" plans (J. Austin et al.,
"How to Scale Your Model", 2025, https://jax-ml.github.io/scaling-book/applied-training/):
token embeddings, ``layers`` decoder layers (RMSNorm, grouped-query attention with
``kv_heads`` key/value heads shared by ``heads`` query heads, RMSNorm, a gated MLP of
width ``ffw``), a final norm and an output projection onto the vocabulary. Rotary
position embeddings are left out: they are elementwise and cost no communication.

One training step runs inside ``shard_map`` over a mesh with axes ``('fsdp', 'tp')``:

* **FSDP** (the ``fsdp`` axis): every weight is split over the devices of the axis; a layer
  all-gathers its weights just before using them (``lax.all_gather``), and the gradient
  of that gather is a reduce-scatter (``psum_scatter``), so each device keeps only its
  shard of the gradient. The batch is split over the same axis.
* **Tensor parallelism** (the ``tp`` axis, Megatron's layout): the attention heads and the
  MLP's hidden units are split over the axis, so each device computes part of every layer
  and one ``psum`` per block adds the parts. With ``tp`` of size 1 this is pure FSDP.

The functions use ``simpmd.numpy`` and ``simpmd.lax``, so the same step runs on simpmd's
simulated devices and inside ``jax.shard_map`` (where they call jax.numpy and jax.lax).
The layers are a Python loop on purpose: the program has ``layers`` copies of the layer's
equations, so that ``jax.experimental.roofline``, which counts a loop's body once, counts
the whole step as simpmd does (the benchmark compares the two). Nothing is recomputed and
every gathered weight is kept for the backward pass. The planner, :mod:`simpmd.plan`,
builds the step a training run uses: the layers a ``lax.scan`` with ``simpmd.checkpoint``,
FSDP gathering the weights again in the backward pass, float32 master weights, pipelines
(lesson 15).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math

import numpy as np

from .. import lax
from .. import numpy as snp
from ..machine.mesh import PartitionSpec as P
from ..api.jit import grad, value_and_grad
from ..machine.devices import devices, platform


@dataclass(frozen=True)
class Config:
    """A decoder's sizes, named as in the Scaling Book's table (L, D, F, N, K, H, V)."""

    layers: int = 80          # L
    d_model: int = 8192       # D
    ffw: int = 28672          # F (= 3.5 D)
    heads: int = 64           # N, query heads
    kv_heads: int = 8         # K, key/value heads (grouped-query attention)
    head_dim: int = 128       # H
    vocab: int = 128256       # V
    dtype: str = "bfloat16"   # weights and activations


# The book's table for LLaMA 3-70B, from the model's config.json on Hugging Face.
LLAMA3_70B = Config()


def tiny(**changes) -> Config:
    """A small decoder with LLaMA's proportions, for runs with values (tests, a laptop)."""
    small = Config(layers=2, d_model=64, ffw=224, heads=8, kv_heads=4, head_dim=8, vocab=256,
                   dtype="float32")
    return replace(small, **changes)


# -- parameters: shapes and how they are split over the mesh ------------------------------

LAYER_KEYS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w1", "w3", "w2")


def param_shapes(cfg: Config) -> dict:
    """Every weight's global shape: a dict, with one dict per layer under ``'layers'``."""
    D, F, V = cfg.d_model, cfg.ffw, cfg.vocab
    NH, KH = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
    layer = {"attn_norm": (D,), "wq": (D, NH), "wk": (D, KH), "wv": (D, KH), "wo": (NH, D),
             "mlp_norm": (D,), "w1": (D, F), "w3": (D, F), "w2": (F, D)}
    return {"embed": (V, D), "layers": [dict(layer) for _ in range(cfg.layers)],
            "final_norm": (D,), "unembed": (D, V)}


def param_specs(cfg: Config) -> dict:
    """How each weight is split: matrices over ``fsdp`` on one dimension and ``tp`` on the
    other (heads, hidden units or vocabulary), norms' scales kept whole on every device."""
    layer = {"attn_norm": P(), "wq": P("fsdp", "tp"), "wk": P("fsdp", "tp"),
             "wv": P("fsdp", "tp"), "wo": P("tp", "fsdp"), "mlp_norm": P(),
             "w1": P("fsdp", "tp"), "w3": P("fsdp", "tp"), "w2": P("tp", "fsdp")}
    return {"embed": P("tp", "fsdp"), "layers": [dict(layer) for _ in range(cfg.layers)],
            "final_norm": P(), "unembed": P("fsdp", "tp")}


def count_params(shapes) -> int:
    """The number of values in a tree of shapes (tuples) or of arrays and ShapeDtypeStructs."""
    if isinstance(shapes, dict):
        return sum(count_params(v) for v in shapes.values())
    if isinstance(shapes, list):
        return sum(count_params(v) for v in shapes)
    shape = getattr(shapes, "shape", shapes)
    return math.prod(shape)


def _tree(f, shapes, specs=None):
    if isinstance(shapes, dict):
        return {k: _tree(f, v, None if specs is None else specs[k]) for k, v in shapes.items()}
    if isinstance(shapes, list):
        return [_tree(f, v, None if specs is None else s) for v, s in
                zip(shapes, specs if specs is not None else [None] * len(shapes))]
    return f(shapes) if specs is None else f(shapes, specs)


def abstract_params(cfg: Config, struct) -> dict:
    """The weights as ``struct(shape, dtype)`` (e.g. ``simpmd.ShapeDtypeStruct``)."""
    return _tree(lambda s: struct(s, cfg.dtype), param_shapes(cfg))


def init_params(cfg: Config, seed: int = 0) -> dict:
    """Random weights (scaled by 1/sqrt(fan-in)), norms' scales at one: for runs with values."""
    rng = np.random.default_rng(seed)

    def one(shape):
        if len(shape) == 1:
            return np.ones(shape, np.float32)
        return (rng.normal(size=shape) / math.sqrt(shape[0])).astype(np.float32)
    return _tree(one, param_shapes(cfg))


# -- the model, as one device runs it inside shard_map -------------------------------------

def _gather(w, axis):
    """FSDP: the whole of this device's tensor-parallel slice of ``w``, just in time."""
    return lax.all_gather(w, "fsdp", axis=axis, tiled=True)


def _rms_norm(x, scale):
    x32 = x.astype(snp.float32)
    var = (x32 * x32).mean(axis=-1, keepdims=True)
    return (x32 * (1.0 / snp.sqrt(var + 1e-5))).astype(x.dtype) * scale.astype(x.dtype)


def _causal(t):
    return np.tril(np.ones((t, t), dtype=bool))


def _attention(cfg, x, p, causal):
    """Grouped-query attention over this device's heads (``heads / tp`` of them), causal
    within the device's tokens; one psum over ``tp`` adds the heads' contributions."""
    b, t, _ = x.shape
    wq, wk, wv = _gather(p["wq"], 0), _gather(p["wk"], 0), _gather(p["wv"], 0)
    kv = wk.shape[1] // cfg.head_dim                        # this device's key/value heads
    group = cfg.heads // cfg.kv_heads                       # query heads per key/value head
    q = (x @ wq).reshape(b, t, kv, group, cfg.head_dim)
    k = (x @ wk).reshape(b, t, kv, cfg.head_dim)
    v = (x @ wv).reshape(b, t, kv, cfg.head_dim)
    scores = snp.einsum("btkgh,bskh->bkgts", q, k) * (1.0 / math.sqrt(cfg.head_dim))
    scores = snp.where(causal, scores, -1e9).astype(snp.float32)
    weights = snp.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = (weights / weights.sum(axis=-1, keepdims=True)).astype(x.dtype)
    out = snp.einsum("bkgts,bskh->btkgh", weights, v).reshape(b, t, kv * group * cfg.head_dim)
    return lax.psum(out @ _gather(p["wo"], 1), "tp")


def _mlp(x, p):
    """The gated MLP (SwiGLU) over this device's hidden units; one psum over ``tp``."""
    h = x @ _gather(p["w1"], 0)
    gate = h * (1.0 / (1.0 + snp.exp(-h)))                 # silu
    return lax.psum((gate * (x @ _gather(p["w3"], 0))) @ _gather(p["w2"], 1), "tp")


def _embed(cfg, table, tokens):
    """Vocabulary-parallel lookup: each ``tp`` device holds V / tp rows and looks up the
    tokens in its range; a psum over ``tp`` completes every embedding."""
    table = _gather(table, 1)
    rows = table.shape[0]
    local = tokens - lax.axis_index("tp") * rows
    inside = (local >= 0) & (local < rows)
    found = table[snp.clip(local, 0, rows - 1)]
    return lax.psum(snp.where(inside[..., None], found, 0.0).astype(table.dtype), "tp")


def _cross_entropy(logits, targets):
    """Mean next-token loss with the vocabulary split over ``tp``: each device's
    logsumexp of its slice, combined with a psum (a production version subtracts the
    global maximum first, ``lax.pmax`` under ``lax.stop_gradient``)."""
    logits = logits.astype(snp.float32)
    rows = logits.shape[-1]
    local_max = logits.max(axis=-1, keepdims=True)
    local_sum = snp.exp(logits - local_max).sum(axis=-1)
    total = lax.psum(snp.exp(local_max[..., 0]) * local_sum, "tp")
    local = targets - lax.axis_index("tp") * rows          # out of range: another's slice
    hit = local[..., None] == snp.arange(rows, dtype=snp.int32)
    target_logit = lax.psum(snp.where(hit, logits, 0.0).sum(axis=-1), "tp")
    return (snp.log(total) - target_logit).mean()


def decoder(cfg: Config, layers, x):
    """The decoder layers on activations ``x`` ``[b, t, D]`` (one device's tokens)."""
    causal = _causal(x.shape[1])                 # one mask for every layer
    for p in layers:
        x = x + _attention(cfg, _rms_norm(x, p["attn_norm"]), p, causal)
        x = x + _mlp(_rms_norm(x, p["mlp_norm"]), p)
    return x


def loss(cfg: Config, params, tokens, targets):
    """This device's mean next-token loss on its tokens ``[b, t]`` (int32)."""
    x = decoder(cfg, params["layers"], _embed(cfg, params["embed"], tokens))
    logits = _rms_norm(x, params["final_norm"]) @ _gather(params["unembed"], 0)
    return _cross_entropy(logits, targets)


def _adam(p, g, m, v, lr=1e-4, b1=0.9, b2=0.95, eps=1e-8):
    g32 = g.astype(snp.float32)
    m = b1 * m + (1 - b1) * g32
    v = b2 * v + (1 - b2) * g32 * g32
    new = p.astype(snp.float32) - lr * m / (snp.sqrt(v) + eps)
    return new.astype(p.dtype), m, v


def train_step(cfg: Config):
    """``step(params, opt, tokens, targets) -> (params, opt, loss)`` for one device, to be
    shard_mapped: the loss's gradient (FSDP's reduce-scatters, TP's psums), then an Adam
    update of this device's shard, with ``opt = {'m': ..., 'v': ...}`` in float32 (the
    book's 8 bytes of optimizer state per parameter; no float32 master weights, which
    simpmd.plan's step keeps)."""
    def step(params, opt, tokens, targets):
        value, grads = _value_and_grad(cfg, params, tokens, targets)
        flat_p, flat_g = _leaves(params), _leaves(grads)
        flat_m, flat_v = _leaves(opt["m"]), _leaves(opt["v"])
        new = [_adam(p, g, m, v) for p, g, m, v in zip(flat_p, flat_g, flat_m, flat_v)]
        rebuild = _rebuilder(params)
        return (rebuild([n[0] for n in new]),
                {"m": rebuild([n[1] for n in new]), "v": rebuild([n[2] for n in new])},
                lax.pmean(value, "fsdp"))
    return step


def _value_and_grad(cfg, params, tokens, targets):
    return value_and_grad(lambda p: loss(cfg, p, tokens, targets))(params)


def _leaves(tree):
    if isinstance(tree, dict):
        return [x for k in sorted(tree) for x in _leaves(tree[k])]
    if isinstance(tree, list):
        return [x for item in tree for x in _leaves(item)]
    return [tree]


def _rebuilder(like):
    def rebuild(flat):
        it = iter(flat)

        def walk(t):
            if isinstance(t, dict):
                return {k: walk(t[k]) for k in sorted(t)}
            if isinstance(t, list):
                return [walk(x) for x in t]
            return next(it)
        return walk(like)
    return rebuild


def layers_step(cfg: Config):
    """``step(layers, x) -> gradients`` for one device, to be shard_mapped: forward and
    backward through ``cfg.layers`` decoder layers on activations ``x`` (no embeddings; the
    loss is the outputs' sum), with the layers' collectives and nothing else. The per-layer
    cost that the Scaling Book's formulas count, or one pipeline stage's."""

    def step(layers, x):
        return grad(lambda ls: decoder(cfg, ls, x).astype(snp.float32).sum())(layers)
    return step


def layers_specs(cfg: Config):
    """``(in_specs, out_specs)`` of :func:`layers_step` for shard_map."""
    specs = param_specs(cfg)["layers"]
    return (specs, P("fsdp")), specs


def torus_mesh(fsdp: int, tp: int, make_mesh):
    """A ``('fsdp', 'tp')`` mesh over the platform's devices laid out as a 3-D torus
    (``simpmd.set_device_count(n, topology=(X, Y, Z))``): each tensor-parallel group is a
    block of neighbours (a pair along the first axis for ``tp = 2``, a 2 x 2 square in the
    first two axes for ``tp = 4``); an FSDP group then takes every ``tp``-th block. Pass
    ``make_mesh=simpmd.Mesh``."""
    shape = platform().topology
    grid = np.empty(len(devices()), dtype=object)
    grid[:] = devices()
    if tp == 1:
        return make_mesh(grid.reshape(fsdp, 1), ("fsdp", "tp"))
    X, Y, Z = shape
    if tp == 2:
        grid = grid.reshape(X // 2, 2, Y, Z).transpose(0, 2, 3, 1)
    elif tp == 4:
        grid = grid.reshape(X // 2, 2, Y // 2, 2, Z).transpose(0, 2, 4, 1, 3)
    else:
        raise ValueError(f"torus_mesh lays out tp = 1, 2 or 4, not {tp}")
    return make_mesh(grid.reshape(fsdp, tp), ("fsdp", "tp"))


def step_specs(cfg: Config):
    """``(in_specs, out_specs)`` of :func:`train_step` for shard_map."""
    specs = param_specs(cfg)
    batch = P("fsdp")
    return ((specs, {"m": specs, "v": specs}, batch, batch),
            (specs, {"m": specs, "v": specs}, P()))


def abstract_step_args(cfg: Config, tokens: int, sequences: int, struct):
    """The arguments of one step as ShapeDtypeStructs (``struct``): weights in ``cfg.dtype``,
    optimizer state in float32, ``sequences x tokens`` int32 tokens and targets."""
    params = abstract_params(cfg, struct)
    opt = _tree(lambda s: struct(s, "float32"), param_shapes(cfg))
    batch = struct((sequences, tokens), "int32")
    return params, {"m": opt, "v": _tree(lambda s: struct(s, "float32"), param_shapes(cfg))}, batch, batch
