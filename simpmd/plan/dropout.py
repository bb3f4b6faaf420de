"""Dropout as the published runs trained with it: a random mask and a product.

Dropout (Srivastava et al. 2014) zeroes each element of a value with probability ``rate``
and scales the rest by ``1 / (1 - rate)``. Megatron-LM's GPT models apply it to the
attention's probabilities after the softmax (``--attention-dropout``) and to each residual
branch's output before it is added to the residual stream (``--hidden-dropout``), both 0.1
by default (``megatron/arguments.py``); the backward pass multiplies the cotangent by the
same mask, so the mask is kept for it, one byte per element (Korthikanti et al. 2022,
arXiv:2205.05198, section 4.1: the softmax's dropout mask ``a s^2 b`` bytes and one
``s b h`` byte mask after each block in their count of activation memory).

Here a dropout is one equation, :data:`dropout_p`, whose results are the dropped value and
its mask (``bool``, a byte per element), and whose derivative, :data:`dropout_grad_p`,
multiplies the cotangent by the kept mask. How it fuses is the framework's:

* under XLA's rules both are elementwise (fused with their producers and consumers);
* Megatron-LM runs the attention's dropout as PyTorch's ``torch.nn.Dropout``, one kernel
  of its own forward (reading the probabilities, writing the dropped ones and the mask) and
  one backward: ``own_kernel=True``;
* Megatron-LM's residual dropout is its fused bias-dropout-add (``bias_dropout_add_fused_
  train``, a TorchScript function: one kernel reading the block's output and the residual,
  writing their sum and the mask), which is what XLA's rules make of it too.

A fused attention kernel applies its dropout inside (``flash_attention(dropout=)``), and
keeps no mask: it regenerates it from the random generator's state in the backward pass
(Dao et al. 2022, arXiv:2205.14135, section 3.1).

On values, the mask is drawn from NumPy's generator seeded with ``seed`` (one per call
site), so that a recomputed forward draws the same mask, as Megatron-LM restores the
generator's state when it recomputes (``CheckpointFunction``). Inside a JAX trace it is
``jax.random.bernoulli`` with the same seed.
"""
from __future__ import annotations

import numpy as np

from ..core import bridge
from ..core.core import Aval, Primitive, bind
from ..cost.rows import register

# The counter-based generator both PyTorch's CUDA dropout (cuRAND's Philox4_32_10) and the
# fused attention kernels use: Philox-4x32 (Salmon et al. 2011, "Parallel random numbers:
# as easy as 1, 2, 3", SC'11). Each round is two 32 x 32 -> 64-bit multiplies and four
# XORs, each round but the last bumps the two key words (flash-attention's
# csrc/flash_attn/src/philox.cuh writes it out): 6 operations a round, 2 between rounds.
ROUND_OPS, KEY_OPS = 6, 2


def philox_ops(rounds: int) -> int:
    """Integer operations of one Philox-4x32 call of ``rounds`` rounds."""
    return rounds * ROUND_OPS + (rounds - 1) * KEY_OPS


# PyTorch's dropout: Philox-4x32-10, four uniform numbers a call, then a comparison and a
# multiply per element.
TORCH_OPS_PER_ELEMENT = philox_ops(10) / 4 + 2


def _keep_mask(shape, rate, seed):
    return np.random.default_rng(seed).random(shape) >= rate


def _stacked(x, *, rate, seed, own_kernel=False, site="hidden"):
    mask = _keep_mask(x.shape, rate, seed)
    scale = np.asarray(1.0 / (1.0 - rate), dtype=np.float32)
    return [np.where(mask, x * scale, 0).astype(x.dtype), mask]


def _abstract(x, *, rate, seed, own_kernel=False, site="hidden"):
    return [Aval(x.shape, x.dtype, False, x.vma), Aval(x.shape, np.dtype(bool), False, x.vma)]


def _nbytes(*avals) -> int:
    return sum(a.nbytes for a in avals)


def _cost(ins, outs, *, rate, seed, own_kernel=False, site="hidden"):
    """The generator's operations, a comparison and a multiply per element; reads the
    value, writes the dropped value and the mask."""
    return int(TORCH_OPS_PER_ELEMENT * ins[0].size), _nbytes(ins[0], *outs)


def _vjp(cts, ins, outs, wants, *, rate, seed, own_kernel=False, site="hidden"):
    ct = cts[0]
    if ct is None or not wants[0]:
        return [None]
    return [bind(dropout_grad_p, ct, outs[1], rate=rate, own_kernel=own_kernel)]


def _grad_stacked(ct, mask, *, rate, own_kernel=False):
    scale = np.asarray(1.0 / (1.0 - rate), dtype=np.float32)
    return np.where(mask, ct * scale, 0).astype(ct.dtype)


def _grad_abstract(ct, mask, *, rate, own_kernel=False):
    return Aval(ct.shape, ct.dtype, False, ct.vma | mask.vma)


def _grad_cost(ins, outs, *, rate, own_kernel=False):
    return 2 * ins[0].size, _nbytes(*ins, *outs)


def _no_second_derivative(*args, **params):
    raise NotImplementedError("dropout_grad has no derivative of its own here")


def _fusion(params) -> str:
    """Its own kernel where the framework runs it as one (``own_kernel``), else fused."""
    return "opaque" if params.get("own_kernel") else "elementwise"


dropout_p = Primitive("dropout", _stacked, _abstract, vjp=_vjp, cost=_cost,
                      multiple_results=True)
dropout_grad_p = Primitive("dropout_grad", _grad_stacked, _grad_abstract,
                           vjp=_no_second_derivative, cost=_grad_cost)
register(dropout_p, fusion=_fusion)      # the cost model's column (cost/rows.py)
register(dropout_grad_p, fusion=_fusion)


def dropout(x, rate: float, seed: int, *, own_kernel: bool = False, site: str = "hidden"):
    """``x`` with each element zeroed with probability ``rate`` and the rest scaled by
    ``1 / (1 - rate)``; ``rate = 0`` returns ``x`` (no equation, as Flax's and PyTorch's
    dropout do nothing then). ``seed`` names the call site; ``own_kernel``: the framework
    runs it as a kernel of its own; ``site``: ``"attention"`` or ``"hidden"`` (what the
    checkpoint policies keep: :mod:`simpmd.plan.layers`)."""
    if not rate:
        return x
    if bridge.inside_jax(x):
        import jax  # optional: JAX
        keep = jax.random.bernoulli(jax.random.key(seed), 1.0 - rate, x.shape)
        return jax.numpy.where(keep, x / (1.0 - rate), 0).astype(x.dtype)
    return bind(dropout_p, x, rate=float(rate), seed=int(seed), own_kernel=bool(own_kernel),
                site=site)[0]
