"""FP8 training as Transformer Engine runs it: casts, and the bookkeeping of their scales.

NVIDIA's Transformer Engine (TE; the NeMo 24.07 runs: NeMo's Dockerfile.ci pins TE at
7d576ed, 1.8.0.dev0) runs each linear layer of a transformer block in FP8 inside
``fp8_autocast``, with *delayed scaling*
(``transformer_engine/pytorch/module/linear.py``, ``layernorm_linear.py``, ``fp8.py``):

* the forward pass casts each GEMM's input to FP8 (E4M3) with the scale of the previous
  iteration, recording the input's largest magnitude (its *amax*) as it casts. A
  ``LayerNormLinear`` writes its norm's output in FP8 directly; a ``Linear`` casts its
  input in a kernel of its own, writing the transposed copy the weight gradient's GEMM reads
  too (``fp8_cast_transpose_fused``; with sequence parallelism it casts only, and gathers
  the FP8 tokens);
* weights are cast once per step, on the first micro-batch, with their transposed copy, and
  kept (``is_first_microbatch``: Megatron-core's ``TELinear`` passes it, ``set_is_first_
  microbatch`` sets it each step, ``megatron/core/transformer/custom_layers/
  transformer_engine.py``);
* the backward pass casts each GEMM's output gradient to FP8 (E5M2 with the ``hybrid``
  format), with its transposed copy, before the data-gradient and weight-gradient GEMMs;
  a row-parallel layer with sequence parallelism casts before it gathers, so the gather
  moves FP8 (``grad_output_preprocess``, ``module/base.py``);
* when an ``fp8_autocast`` region ends (Megatron-core wraps each model chunk's layers in
  one, ``transformer_block.py``), TE all-reduces the region's amaxes (a maximum over the
  tensor-, data- and context-parallel ranks, ``get_amax_reduction_group``) and updates each
  tensor's amax history and scale in one kernel (``reduce_and_update_fp8_tensors``,
  ``fused_amax_and_scale_update_after_reduction``); the backward pass does the same for the
  gradients' amaxes when the region's backward ends.

Here each of those is an equation. :data:`fp8_cast_p` casts (its results: the FP8 value,
its transposed copy when asked, the amax); :data:`fp8_operand_p` is an FP8 value as a GEMM
reads it, typed as the value it stands for (XLA's GEMM rewriter and TE's ``fp8_gemm``
read the FP8 buffer with its scale: a view, not a kernel), keeping the transposed copy
alive for the backward pass and handing its cotangent straight to the value it stands for
(the derivative of a rounding, as FP8 training takes it); :data:`fp8_grad_p` is the
identity forward and casts the cotangent backward. A product whose operands are FP8 copies
runs on the chip's FP8 path (:mod:`simpmd.cost.precision`): the LM head, which Megatron
computes outside ``fp8_autocast``, stays in bf16. On values the casts round through
ml_dtypes' FP8 types with a scale of 1 (the simulation's values are not a numerics study).
"""
from __future__ import annotations

import numpy as np

from .. import lax
from .. import numpy as snp
from ..core.core import Aval, Primitive, aval_of, bind
from ..cost.rows import register

FORWARD, BACKWARD = "float8_e4m3fn", "float8_e5m2"    # TE's "hybrid" format
AMAX_HISTORY = 1024        # TE's DelayedScaling default amax_history_len (NeMo's 1024 or 1)
AMAX_AXES = ("dp", "cp", "tp")   # Megatron-core's amax reduction group
# An amax is held as its float32 bits read as an unsigned integer: for values that are not
# negative the order is the same, so the maximum is too, and no gradient flows through it.
AMAX = np.dtype(np.uint32)


def _fp8(dtype):
    import ml_dtypes  # optional: JAX (ml_dtypes comes with it)
    return np.dtype(getattr(ml_dtypes, dtype))


def _transposed(shape) -> tuple:
    """The transposed copy's shape: the last two axes swapped (TE transposes the 2-D
    ``[tokens, features]`` view of an activation, and each weight)."""
    return tuple(shape[:-2]) + (shape[-1], shape[-2])


# -- the cast -------------------------------------------------------------------------------

def _cast_stacked(x, *, dtype, transpose=False, own_kernel=False):
    q = x.astype(np.float32).astype(_fp8(dtype))
    amax = np.abs(x.astype(np.float32)).reshape(x.shape[0], -1).max(axis=1).view(np.uint32)
    return [q, np.ascontiguousarray(np.swapaxes(q, -1, -2)), amax] if transpose else [q, amax]


def _cast_abstract(x, *, dtype, transpose=False, own_kernel=False):
    q = Aval(x.shape, _fp8(dtype), False, x.vma)
    extra = [Aval(_transposed(x.shape), _fp8(dtype), False, x.vma)] if transpose else []
    return [q] + extra + [Aval((), AMAX, False, x.vma)]


def _cast_cost(ins, outs, *, dtype, transpose=False, own_kernel=False):
    """A scale and a running maximum per element; reads the value, writes its FP8 copies
    (a byte per element each) and the amax."""
    return 2 * ins[0].size, ins[0].nbytes + sum(o.nbytes for o in outs)


def _straight(cts, ins, outs, wants, **params):
    """The derivative of a rounding, as FP8 training takes it: the FP8 value's cotangent
    (in the GEMM's output type) is the cast value's."""
    return [cts[0]]


def _no_cotangent(cts, ins, outs, wants, **params):
    return [None] * len(ins)


def _kernel(params) -> str:
    return "opaque" if params.get("own_kernel") else "elementwise"


fp8_cast_p = Primitive("fp8_cast", _cast_stacked, _cast_abstract, vjp=_straight,
                       cost=_cast_cost, multiple_results=True)
register(fp8_cast_p, fusion=_kernel)   # the cost model's column (cost/rows.py)


def cast(x, *, dtype=FORWARD, transpose=False, own_kernel=False):
    """``(x8, x8t or None, amax)``: ``x`` cast to FP8 (its transposed copy with
    ``transpose``), and its amax; ``own_kernel``: a kernel of its own (TE's cast of a
    ``Linear``'s input), else fused with what makes ``x`` (a ``LayerNormLinear``'s norm)."""
    outs = bind(fp8_cast_p, x, dtype=dtype, transpose=bool(transpose),
                own_kernel=bool(own_kernel))
    return (outs[0], outs[1], outs[2]) if transpose else (outs[0], None, outs[1])


# -- an FP8 value as a GEMM reads it ---------------------------------------------------------

def _operand_stacked(x8, *rest, dtype, to):
    return x8.astype(np.float32).astype(np.dtype(dtype))


def _operand_abstract(x8, *rest, dtype, to):
    return Aval(x8.shape, np.dtype(dtype), False, x8.vma)


def _operand_cost(ins, outs, *, dtype, to):
    return 0, 0                        # read by the GEMM where it lies


def _operand_vjp(ct, ins, outs, wants, *, dtype, to):
    """The cotangent, to the operand ``to`` names (the FP8 value, or the value it is a copy
    of)."""
    return [ct if i == to else None for i in range(len(ins))]


def _kept(params, invars) -> list:
    """The operands a GEMM reading this view also needs kept (the transposed copy)."""
    return list(invars[params["to"] + 1:])


fp8_operand_p = Primitive("fp8_operand", _operand_stacked, _operand_abstract,
                          vjp=_operand_vjp, cost=_operand_cost)
register(fp8_operand_p, fusion="view", keeps=_kept)   # the cost model's columns (cost/rows.py)


def operand(x8, *kept, like=None, dtype=None):
    """``x8`` as a GEMM reads it, typed as ``like`` (a value ``x8`` is a copy of, which
    receives its cotangent) or as ``dtype`` (its cotangent goes to ``x8``); ``kept`` (the
    transposed copy) lives as long as it does."""
    kept = tuple(k for k in kept if k is not None)
    if like is not None:
        return bind(fp8_operand_p, x8, like, *kept, dtype=aval_of(like).dtype.name, to=1)
    return bind(fp8_operand_p, x8, *kept, dtype=np.dtype(dtype).name, to=0)


# -- the gradient's cast ---------------------------------------------------------------------

def _identity(x, **params):
    """The value itself (on blocks and on types alike)."""
    return x


def _grad_vjp(ct, ins, outs, wants, *, stage, dtype, transpose, own_kernel):
    """``'both'``: the cotangent cast to FP8 (E5M2) and read as the GEMMs read it;
    ``'quant'``: cast only (the FP8 cotangent goes on, to be gathered); ``'dequant'``: an
    FP8 cotangent read as the GEMMs read it."""
    if ct is None:
        return [None]
    if stage == "dequant":
        return [operand(ct, dtype=dtype)]
    g8, g8t, _ = cast(ct, dtype=BACKWARD, transpose=transpose, own_kernel=own_kernel)
    return [g8 if stage == "quant" else operand(g8, g8t, dtype=dtype)]


fp8_grad_p = Primitive("fp8_grad", _identity, _identity, vjp=_grad_vjp,
                       cost=lambda ins, outs, **params: (0, 0))
register(fp8_grad_p, fusion="view")


def grad_cast(y, stage="both", *, transpose=False, own_kernel=False):
    """``y``, whose cotangent the backward pass casts to FP8 (``stage``: see the rule)."""
    return bind(fp8_grad_p, y, stage=stage, dtype=aval_of(y).dtype.name,
                transpose=bool(transpose), own_kernel=bool(own_kernel))


# -- delayed scaling: the amaxes reduced, the histories and scales updated --------------------

def _update_stacked(amax, *, history):
    return np.ones(amax.shape, np.float32)


def _update_abstract(amax, *, history):
    return Aval(amax.shape, np.dtype(np.float32), False, amax.vma)


def _update_cost(ins, outs, *, history):
    """TE's fused update: each tensor's history rolled and its maximum taken (read and
    written), its scale computed."""
    n = ins[0].size
    return 2 * n * history, 2 * 4 * n * history + 2 * ins[0].nbytes


fp8_scale_update_p = Primitive("fp8_scale_update", _update_stacked, _update_abstract,
                               vjp=_no_cotangent, cost=_update_cost)
register(fp8_scale_update_p, fusion="opaque")


def _after_vjp(ct, ins, outs, wants, **params):
    return [ct, None]


fp8_after_p = Primitive("fp8_after", lambda x, token: x, lambda x, token: x, vjp=_after_vjp,
                        cost=lambda ins, outs: (0, 0))
register(fp8_after_p, fusion="view")   # ``x``, once ``token`` is computed: an order, no work


def _reduced(amaxes, sizes):
    """The amaxes all-reduced (a maximum) over the amax group, then the update kernel."""
    axes = tuple(a for a in AMAX_AXES if sizes.get(a, 1) > 1)
    if axes:
        missing = tuple(a for a in axes if a not in aval_of(amaxes).vma)   # (simpmd only:
        if missing:                                       # these equations have no JAX rule)
            amaxes = lax.pcast(amaxes, missing, to="varying")
        amaxes = lax.pmax(amaxes, axes)
    return bind(fp8_scale_update_p, amaxes, history=AMAX_HISTORY)


def sync(x, amaxes, sizes):
    """End of a forward region: ``x`` once its casts' ``amaxes`` are reduced and the
    scales updated (TE's ``fp8_autocast`` exit)."""
    return bind(fp8_after_p, x, _reduced(amaxes.reshape(-1), sizes))


def _region_vjp(ct, ins, outs, wants, *, count, axes):
    """The region's backward ends: its ``count`` gradient amaxes reduced, scales updated."""
    if ct is None:
        return [None]
    return [bind(fp8_after_p, ct, _reduced(snp.zeros((count,), AMAX), dict(axes)))]


fp8_region_p = Primitive("fp8_region", _identity, _identity, vjp=_region_vjp,
                         cost=lambda ins, outs, **params: (0, 0))
register(fp8_region_p, fusion="view")


def region(x, count, sizes):
    """Start of a region whose backward pass casts ``count`` gradients: ``x``, whose
    cotangent's arrival ends the region's backward (:func:`_region_vjp`)."""
    return bind(fp8_region_p, x, count=int(count), axes=tuple(sorted(sizes.items())))
