"""The next-token loss as a trainer's kernels run it: what each holds of the logits.

The loss over a large vocabulary is a training step's largest values: ``tokens x vocab``
logits (16.8 GB in float32 for 32,768 tokens of Llama 3's 128,256). Written as
``jnp``-style operations (:func:`simpmd.plan.layers.token_losses`, the default,
``Layout(loss=None)``), XLA fuses them; eager PyTorch would run each as its own kernel and
keep what each operation's derivative reads. What trainers run instead
(``Layout.loss``, :data:`LOSSES`):

* ``"log_softmax"``: PyTorch's ``F.cross_entropy`` on the logits cast to float32, as
  torchtitan calls it (``loss_fn``: ``cross_entropy(pred.flatten(0, 1).float(), ...)``,
  ``train.py`` at pytorch/torchtitan 9dec370, the commit its H100 benchmarks name; it
  ``del pred`` s the 16-bit logits before ``loss.backward()``). For class-index targets
  ATen's ``cross_entropy_loss`` is ``nll_loss_nd(log_softmax(self, class_dim), ...)``
  (``aten/src/ATen/native/LossNLL.cpp`` in pytorch/pytorch, ``cross_entropy_loss_symint``);
  ``log_softmax`` is one kernel writing its float32 result, the one value its derivative
  reads (``_log_softmax: self: _log_softmax_backward_data(grad, result, dim, ...)``,
  ``tools/autograd/derivatives.yaml``); ``nll_loss`` reads the targeted entries, and its
  backward (``nll_loss_backward``) writes a dense zero-filled gradient with the targets'
  entries set. So the forward pass keeps one float32 copy (the log-probabilities) and
  the backward pass holds three at once: the log-probabilities, ``nll_loss``'s gradient
  and ``log_softmax``'s (then the cast back to 16 bits: the ``.float()``'s derivative).
* ``"fused"``: one kernel each way on the 16-bit logits, flash-attention's cross-entropy
  (``flash_attn/losses/cross_entropy.py`` at Dao-AILab/flash-attention v1.0.9:
  ``xentropy_cuda_lib.forward`` returns each token's loss and log-sum-exp in float32 and
  the function saves ``logits, lse, labels``; the backward kernel writes the gradient in
  the logits' type, ``at::empty_like(logits_)`` unless ``inplace_backward``,
  ``csrc/xentropy/xentropy_kernel.cu``), llm-foundry's default ``loss_fn:
  fused_crossentropy`` (``llmfoundry/models/mpt/modeling_mpt.py`` at mosaicml/llm-foundry
  061f2c7ce6, which pins ``xentropy-cuda-lib`` from flash-attention v1.0.9 in
  ``setup.py``). No float32 copy of the logits at all.

Each kernel is a primitive with its own row (values in NumPy, type, cost), and a kernel
of its own for the fusion (``'opaque'``): the memory walk then holds what these kernels
hold. With the vocabulary split over ``tp`` (a vocabulary-parallel loss), the loss stays
as written: these rows are one device's whole-vocabulary kernels.
"""
from __future__ import annotations

import numpy as np

from ..core.core import Aval, Primitive, bind
from ..cost.rows import register

LOSSES = ("log_softmax", "fused")


def _vma(*avals):
    return frozenset().union(*(a.vma for a in avals))


def _log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def _picked(x, targets):
    """``x[..., targets]`` of stacked ``x`` [dev, b, t, V] and ``targets`` [dev, b, t]."""
    return np.take_along_axis(x, targets[..., None].astype(np.int64), axis=-1)[..., 0]


def _one_hot(targets, vocab, dtype):
    return (targets[..., None] == np.arange(vocab)).astype(dtype)


# -- PyTorch's F.cross_entropy: log_softmax, then nll_loss ----------------------------------

def _ls_abstract(x):
    return Aval(x.shape, x.dtype, False, x.vma)


def _ls_vjp(ct, ins, outs, wants):
    return [None if ct is None else bind(log_softmax_bwd_p, ct, outs[0])]


def _ls_bwd_stacked(g, logp):
    return g - np.exp(logp) * g.sum(axis=-1, keepdims=True)


def _ls_bwd_abstract(g, logp):
    return Aval(logp.shape, logp.dtype, False, _vma(g, logp))


def _nll_stacked(logp, targets):
    return -_picked(logp, targets)


def _nll_abstract(logp, targets):
    return Aval(logp.shape[:-1], logp.dtype, False, _vma(logp, targets))


def _nll_vjp(ct, ins, outs, wants):
    logp, targets = ins
    if ct is None:
        return [None, None]
    return [bind(nll_bwd_p, ct, targets, vocab=int(logp.shape[-1])), None]


def _nll_bwd_stacked(ct, targets, *, vocab):
    return -_one_hot(targets, vocab, ct.dtype) * ct[..., None]


def _nll_bwd_abstract(ct, targets, *, vocab):
    return Aval(tuple(ct.shape) + (vocab,), ct.dtype, False, _vma(ct, targets))


def _nbytes(*avals) -> int:
    return sum(a.size * a.dtype.itemsize for a in avals)


def _pass_cost(ins, outs, **params):
    """A max, an exponential, a sum and a subtraction per element (a softmax's work, or
    its derivative's); the operands read once and the results written once."""
    return 4 * outs[0].size, _nbytes(*ins, *outs)


def _nll_cost(ins, outs):
    """One entry read per token."""
    return 0, _nbytes(ins[1], outs[0]) + outs[0].size * ins[0].dtype.itemsize


def _nll_bwd_cost(ins, outs, *, vocab):
    """The zero-filled gradient written, the targets' entries set."""
    return 0, _nbytes(*ins, *outs)


def _no_second_derivative(*args, **params):
    raise NotImplementedError("a loss kernel's backward pass has no derivative of its own")


log_softmax_p = Primitive("log_softmax", _log_softmax, _ls_abstract, vjp=_ls_vjp,
                          cost=_pass_cost)
log_softmax_bwd_p = Primitive("log_softmax_backward", _ls_bwd_stacked, _ls_bwd_abstract,
                              vjp=_no_second_derivative, cost=_pass_cost)
nll_p = Primitive("nll_loss", _nll_stacked, _nll_abstract, vjp=_nll_vjp, cost=_nll_cost)
nll_bwd_p = Primitive("nll_loss_backward", _nll_bwd_stacked, _nll_bwd_abstract,
                      vjp=_no_second_derivative, cost=_nll_bwd_cost)


# -- flash-attention's fused cross-entropy --------------------------------------------------

def _fused_stacked(logits, targets):
    x = logits.astype(np.float32)
    m = x.max(axis=-1)
    lse = m + np.log(np.exp(x - m[..., None]).sum(axis=-1))
    return [lse - _picked(x, targets), lse]


def _fused_abstract(logits, targets):
    vma = _vma(logits, targets)
    return [Aval(logits.shape[:-1], np.dtype(np.float32), False, vma) for _ in range(2)]


def _fused_vjp(cts, ins, outs, wants):
    logits, targets = ins
    if cts[0] is None:
        return [None, None]
    return [bind(fused_bwd_p, cts[0], logits, outs[1], targets), None]


def _fused_bwd_stacked(ct, logits, lse, targets):
    p = np.exp(logits.astype(np.float32) - lse[..., None])
    g = (p - _one_hot(targets, logits.shape[-1], np.float32)) * ct[..., None]
    return g.astype(logits.dtype)


def _fused_bwd_abstract(ct, logits, lse, targets):
    return Aval(logits.shape, logits.dtype, False, _vma(ct, logits, lse, targets))


fused_p = Primitive("fused_cross_entropy", _fused_stacked, _fused_abstract, vjp=_fused_vjp,
                    cost=_pass_cost, multiple_results=True)
fused_bwd_p = Primitive("fused_cross_entropy_backward", _fused_bwd_stacked,
                        _fused_bwd_abstract, vjp=_no_second_derivative, cost=_pass_cost)

# Each is a kernel of its own (simpmd/cost/rows.py's fusion column): it writes what it
# returns, and nothing fuses into it.
for _row in (log_softmax_p, log_softmax_bwd_p, nll_p, nll_bwd_p, fused_p, fused_bwd_p):
    register(_row, fusion="opaque")


def token_losses(logits, targets, kind: str):
    """The summed loss of ``logits`` [b, t, V] (16-bit, the head's output) at ``targets``
    [b, t], as the kernels of ``kind`` (:data:`LOSSES`) compute it."""
    if kind == "log_softmax":
        return bind(nll_p, bind(log_softmax_p, logits.astype(np.float32)), targets).sum()
    if kind == "fused":
        return bind(fused_p, logits, targets)[0].sum()
    raise ValueError(f"loss={kind!r}: choose one of {', '.join(map(repr, LOSSES))}")
