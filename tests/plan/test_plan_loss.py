"""The loss as trainers' kernels run it (simpmd.plan.loss): values against a closed form,
and the bytes each holds, worked by hand from what each kernel writes and reads."""
from __future__ import annotations

import numpy as np
import pytest

import simpmd
from simpmd.cost.memory import peak_memory
from simpmd.cost.walk import Walker
from simpmd.plan import Layout, LayoutError
from simpmd.plan import loss as Lo

B, T, V = 2, 4, 1000
N = B * T


def _closed_form(x, t):
    """The summed cross-entropy and its gradient, written out: lse - x[t], softmax - 1[t]."""
    m = x.max(-1, keepdims=True)
    lse = m[..., 0] + np.log(np.exp(x - m).sum(-1))
    loss = (lse - np.take_along_axis(x, t[..., None], -1)[..., 0]).sum()
    return loss, np.exp(x - lse[..., None]) - (t[..., None] == np.arange(x.shape[-1]))


@pytest.mark.parametrize("kind", Lo.LOSSES)
def test_each_loss_is_the_cross_entropy_and_its_gradient(kind):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(B, T, 7)).astype(np.float32)
    t = rng.integers(0, 7, size=(B, T)).astype(np.int32)
    value, grad = simpmd.value_and_grad(lambda x: Lo.token_losses(x, t, kind))(x)
    want, want_grad = _closed_form(x, t)
    assert float(value) == pytest.approx(float(want), rel=1e-6)
    np.testing.assert_allclose(np.asarray(grad), want_grad, atol=1e-6)


def _peak(kind):
    """The gradient of the loss of float16 logits [B, T, V] as eager PyTorch runs it,
    every operation its own kernel; the step's arguments donated."""
    targets = np.zeros((B, T), np.int32)
    program = simpmd.make_jaxpr(simpmd.grad(lambda x: Lo.token_losses(x, targets, kind)))(
        simpmd.ShapeDtypeStruct((B, T, V), "float16"))
    return peak_memory(program, fused=True, donate=True,
                       walker=Walker(program, eager=True)).peak


def test_pytorchs_cross_entropy_holds_three_float32_copies_in_its_backward_pass():
    """F.cross_entropy(logits.float()): the cast writes x (4NV bytes; the 16-bit logits,
    donated, die with it), log_softmax writes logp (4NV; x dies, its derivative reads
    nothing), nll_loss a loss per token. Backward: nll_loss_backward writes its dense
    gradient g1 (4NV), log_softmax's backward reads logp and g1 and writes g2 (4NV): 12NV
    at once, the peak (the cast of g2 back to 16 bits holds 4NV + 2NV after logp and g1
    have gone). The targets are the program's constant and the cotangent a broadcast of
    the scalar's (a view): neither is a buffer here."""
    assert _peak("log_softmax") == 12 * N * V


def test_a_fused_cross_entropy_holds_the_16_bit_logits_and_their_gradient():
    """flash-attention's kernel: the 16-bit logits (2NV) kept with each token's
    log-sum-exp (4N) for the backward kernel, which writes the 16-bit gradient (2NV) while
    it reads them: 4NV + 4N (the targets and the cotangent as above)."""
    assert _peak("fused") == 4 * N * V + 4 * N


def test_the_loss_as_written_holds_more_under_eager_pytorch():
    """The loss written as jnp operations, each its own kernel, keeps its intermediates for
    its derivative (the float32 logits, exp(x - max), the targets' mask): more than
    PyTorch's own kernels."""
    from simpmd.plan import layers as L
    from simpmd.plan.model import Transformer
    targets = np.zeros((B, T), np.int32)
    model = Transformer(1, 8, 1, 8, V, T, tied_embeddings=True)
    s = L.Shard(model, {}, framework="pytorch")

    def written(x):       # the tail of layers.token_losses after the head's product
        x = x.astype(simpmd.numpy.float32)
        m = x.max(axis=-1, keepdims=True)
        total = simpmd.numpy.exp(m[..., 0]) * simpmd.numpy.exp(x - m).sum(axis=-1)
        hit = targets[..., None] == np.arange(V, dtype=np.int32)
        return (simpmd.numpy.log(total) - simpmd.numpy.where(hit, x, 0.0).sum(-1)).sum()
    program = simpmd.make_jaxpr(simpmd.grad(written))(
        simpmd.ShapeDtypeStruct((B, T, V), "float16"))
    peak = peak_memory(program, fused=True, donate=True, walker=Walker(program, eager=True))
    assert s.loss is None and peak.peak > 12 * N * V + 8


def test_a_layout_names_its_loss_or_refuses():
    assert Layout(loss="fused").loss == "fused"
    assert "loss log_softmax" in str(Layout(fsdp=2, loss="log_softmax"))
    with pytest.raises(LayoutError, match="log_softmax"):
        Layout(loss="cross_entropy")
