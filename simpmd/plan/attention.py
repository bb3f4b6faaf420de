"""Attention as training runs it: a fused kernel (FlashAttention) or the scores kept.

A fused attention kernel (FlashAttention, Dao et al. 2022, arXiv:2205.14135; FlashAttention-2,
Dao 2023, arXiv:2307.08691) is one operation on the accelerator: it reads the queries,
keys and values, computes the softmax of the scores block by block in on-chip memory, and
writes only the output and each query's log-sum-exp. Written as ``einsum``, ``softmax``
and ``einsum``, the cost walker would charge the T x T scores a round trip to HBM and keep
them for the backward pass, which the kernel never does. So here it is one primitive,
``flash_attention``, with its own row: values (NumPy), type, cost, and a derivative that
is the kernel's backward pass, ``flash_attention_bwd`` (another single operation, which
recomputes the scores from Q and K). Inside a JAX trace, :func:`flash_attention` is
``jax.nn.dot_product_attention``, so the same step runs on real JAX.

A causal kernel skips the blocks above the diagonal: it does ``(n + 1) / (2 n)`` of the
full work for ``n`` blocks of 128 queries (FlashAttention-2's block size on A100 and
H100), about half. With ``dropout`` the kernel drops probabilities as it computes them and
keeps no mask: its backward pass draws the same mask again from the generator's state
(Dao et al. 2022, section 3.1), each pass paying the generator's integer work on the
vector units beside the products (:data:`RNG_OPS`). :func:`materialized_attention` is the
other way, what Megatron ran before fused kernels (Korthikanti et al. 2022): the scores are
a product, a softmax and a product, kept for the backward pass unless recomputed.
"""
from __future__ import annotations

import math

import numpy as np

from .. import lax
from .. import numpy as snp
from ..core import bridge
from ..core.core import Aval, Primitive, bind
from ..cost.rows import register
from .dropout import _keep_mask, dropout as drop, philox_ops

BLOCK = 128      # FlashAttention-2's query and key block (its kernels' default tile)
# The generator's work per probability, in each pass: flash-attention's dropout
# (csrc/flash_attn/src/dropout.h) draws 16 one-byte numbers from one Philox call of 7
# rounds (philox.cuh), then compares and masks each probability.
RNG_OPS = philox_ops(7) / 16 + 2


def causal_fraction(t: int, s: int, causal: bool) -> float:
    """The share of the ``t x s`` query-key blocks a kernel computes: all without a mask;
    with the causal mask, the blocks on or below the diagonal when ``t == s``, and half
    when ``t < s`` (a context-parallel chunk of queries against every key, with chunks
    dealt out so that each chip gets the same share of the triangle, as Megatron's
    context parallelism does)."""
    if not causal:
        return 1.0
    if t < s:
        return 0.5
    n = max(1, math.ceil(t / BLOCK))
    return (n + 1) / (2 * n)


def _shapes(q, k):
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    return b, t, n, h, s, kv


def _flops(q, k, causal, matmuls):
    """FLOPs of ``matmuls`` products of the score size (2 forward: Q K^T and P V; 5 backward:
    Q K^T again, dP, dV, dQ and dK)."""
    b, t, n, h, s, _ = _shapes(q, k)
    return int(2 * matmuls * b * n * t * s * h * causal_fraction(t, s, causal))


def _rng_ops(q, k, causal, dropout) -> int:
    """The dropout's work on the vector units: :data:`RNG_OPS` per computed probability."""
    if not dropout:
        return 0
    b, t, n, _, s, _ = _shapes(q, k)
    return int(RNG_OPS * b * n * t * s * causal_fraction(t, s, causal))


def _nbytes(*avals) -> int:
    return sum(a.size * a.dtype.itemsize for a in avals)


def _scores(q, k, scale, causal, offset=None):
    """[dev, b, kv, g, t, s] float32 scores of stacked q [dev,b,t,n,h] and k [dev,b,s,kv,h];
    with ``causal``, query ``i`` of a device sees the keys up to ``offset + i`` (its
    position in the whole sequence)."""
    d, b, t, n, h = q.shape
    kv, s = k.shape[3], k.shape[2]
    qg = q.astype(np.float32).reshape(d, b, t, kv, n // kv, h)
    sc = np.einsum("dbtkgh,dbskh->dbkgts", qg, k.astype(np.float32)) * scale
    if causal:
        start = np.zeros(d, int) if offset is None else np.broadcast_to(
            np.asarray(offset).reshape(-1), (d,))
        seen = (start[:, None, None] + np.arange(t)[None, :, None]) >= np.arange(s)[None, None]
        sc = np.where(seen[:, None, None, None], sc, -np.inf)
    return sc


def _softmax(sc):
    p = np.exp(sc - sc.max(axis=-1, keepdims=True))
    return p / p.sum(axis=-1, keepdims=True)


def _dropped(p, dropout, seed):
    """The probabilities with the kernel's dropout applied (the same mask in both passes)."""
    if not dropout:
        return p
    return np.where(_keep_mask(p.shape, dropout, seed), p / (1.0 - dropout), 0.0)


def _forward_stacked(q, k, v, *offset, causal, scale, dropout=0.0, seed=0):
    p = _dropped(_softmax(_scores(q, k, scale, causal, *offset)), dropout, seed)
    d, b, t, n, h = q.shape
    out = np.einsum("dbkgts,dbskh->dbtkgh", p, v.astype(np.float32))
    return out.reshape(d, b, t, n, h).astype(q.dtype)


def _backward_stacked(q, k, v, out, ct, *offset, causal, scale, dropout=0.0, seed=0):
    """dq, dk, dv: the softmax's derivative, written out (what the kernel's backward does),
    through the dropout's mask drawn again."""
    d, b, t, n, h = q.shape
    kv = k.shape[3]
    p = _softmax(_scores(q, k, scale, causal, *offset))
    g = ct.astype(np.float32).reshape(d, b, t, kv, n // kv, h)
    dv = np.einsum("dbkgts,dbtkgh->dbskh", _dropped(p, dropout, seed), g)
    dp = _dropped(np.einsum("dbtkgh,dbskh->dbkgts", g, v.astype(np.float32)), dropout, seed)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq = np.einsum("dbkgts,dbskh->dbtkgh", ds, k.astype(np.float32)).reshape(d, b, t, n, h)
    dk = np.einsum("dbkgts,dbtkgh->dbskh", ds, q.astype(np.float32).reshape(d, b, t, kv, n // kv, h))
    return [dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype)]


def _vma(*avals):
    return frozenset().union(*(a.vma for a in avals))


def _forward_abstract(q, k, v, *offset, causal, scale, dropout=0.0, seed=0):
    if k.shape != v.shape or q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        raise TypeError(f"flash_attention takes q [batch, tokens, heads, width] and k, v "
                        f"[batch, keys, kv_heads, width] of one width; got {q.shape}, "
                        f"{k.shape}, {v.shape}")
    if q.shape[2] % k.shape[2]:
        raise TypeError(f"flash_attention: {q.shape[2]} query heads do not share {k.shape[2]} "
                        f"key/value heads evenly")
    return Aval(q.shape, q.dtype, False, _vma(q, k, v))


def _forward_cost(ins, outs, *, causal, scale, dropout=0.0, seed=0):
    q, k, v = ins[:3]
    return (_flops(q, k, causal, 2) + _rng_ops(q, k, causal, dropout),
            _nbytes(q, k, v, outs[0]))


def _forward_vjp(ct, ins, outs, wants, *, causal, scale, dropout=0.0, seed=0):
    if ct is None:
        return [None] * len(ins)
    q, k, v, *offset = ins
    return bind(flash_attention_bwd, q, k, v, outs[0], ct, *offset, causal=causal,
                scale=scale, dropout=dropout, seed=seed) + [None] * len(offset)


def _backward_abstract(q, k, v, out, ct, *offset, causal, scale, dropout=0.0, seed=0):
    vma = _vma(q, k, v, out, ct)
    return [Aval(a.shape, a.dtype, False, vma) for a in (q, k, v)]


def _backward_cost(ins, outs, *, causal, scale, dropout=0.0, seed=0):
    q, k = ins[0], ins[1]
    return (_flops(q, k, causal, 5) + _rng_ops(q, k, causal, dropout),
            _nbytes(*ins, *outs))


def _vector_ops(ins, outs, *, causal, scale, dropout=0.0, seed=0):
    """The part of a kernel's FLOPs on the vector units: its dropout's generator."""
    return _rng_ops(ins[0], ins[1], causal, dropout)


def _no_second_derivative(*args, **params):
    raise NotImplementedError("flash_attention_bwd has no derivative of its own (a "
                              "fused kernel's backward pass): second derivatives of "
                              "attention need the unfused form, materialized_attention")


flash_attention_p = Primitive(
    "flash_attention", _forward_stacked, _forward_abstract, vjp=_forward_vjp,
    cost=_forward_cost)
flash_attention_bwd = Primitive(
    "flash_attention_bwd", _backward_stacked, _backward_abstract, vjp=_no_second_derivative,
    cost=_backward_cost, multiple_results=True)
# The cost model's column (simpmd/cost/rows.py): both kernels are matrix products, on the
# matrix units at the path their operands' types choose (bf16 for bf16 q, k, v).
for _row in (flash_attention_p, flash_attention_bwd):
    register(_row, matmul=True, vector_flops=_vector_ops)
# A fused attention kernel sustains less of the matrix units than a large GEMM, its backward
# pass less than its forward: a preset with published measurements times each pass at them
# (``Hardware.attention_efficiency``).
register(flash_attention_p, attention_pass="forward")
register(flash_attention_bwd, attention_pass="backward")


def flash_attention(q, k, v, causal=True, q_offset=None, dropout=0.0, seed=0):
    """Fused attention of ``q`` [batch, tokens, heads, width] over ``k``, ``v`` [batch,
    keys, kv_heads, width], scaled by 1/sqrt(width): one operation, as the kernel is.
    ``q_offset`` (a scalar) is the first query's position among the keys, for a chunk of
    a sequence (context parallelism); ``dropout`` the probability of dropping each of
    the attention's probabilities, inside the kernel (``seed`` names the call site). Inside
    a JAX trace it is ``jax.nn.dot_product_attention`` (without dropout, which it has not)."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    if bridge.inside_jax((q, k, v)):
        if dropout:
            raise NotImplementedError("jax.nn.dot_product_attention has no dropout: plan "
                                      "a model with attention_dropout=0 to run it on JAX")
        import jax  # optional: JAX
        if q_offset is None:
            return jax.nn.dot_product_attention(q, k, v, scale=scale, is_causal=causal)
        seen = (q_offset + np.arange(q.shape[1]))[:, None] >= np.arange(k.shape[1])[None]
        return jax.nn.dot_product_attention(q, k, v, scale=scale, mask=seen[None, None])
    offset = () if q_offset is None else (q_offset,)
    extra = dict(dropout=float(dropout), seed=int(seed)) if dropout else {}
    return bind(flash_attention_p, q, k, v, *offset, causal=bool(causal), scale=scale, **extra)


def materialized_attention(q, k, v, causal=True, q_offset=None, dropout=0.0, seed=0,
                           own_kernel=False):
    """The same attention as products and a softmax whose T x T scores live in memory, as
    Megatron computed it before fused kernels; under ``checkpoint`` the backward pass
    computes them again (selective recomputation). ``dropout`` drops the probabilities
    after the softmax (:func:`simpmd.plan.dropout.dropout`; ``own_kernel``: as its own
    kernel, as Megatron-LM runs ``torch.nn.Dropout``)."""
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    qg = q.reshape(b, t, kv, n // kv, h)
    scores = snp.einsum("btkgh,bskh->bkgts", qg, k) * (1.0 / math.sqrt(h))
    if causal:
        seen = np.tril(np.ones((t, s), bool)) if q_offset is None else \
            (q_offset + snp.arange(t))[:, None] >= snp.arange(s)[None]
        scores = snp.where(seen, scores, -1e9)
    scores = scores.astype(snp.float32)
    weights = snp.exp(scores - scores.max(axis=-1, keepdims=True))
    weights = (weights / weights.sum(axis=-1, keepdims=True)).astype(q.dtype)
    weights = drop(weights, dropout, seed, own_kernel=own_kernel, site="attention")
    return snp.einsum("bkgts,bskh->btkgh", weights, v).reshape(b, t, n, h)
