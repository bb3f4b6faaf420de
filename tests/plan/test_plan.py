"""simpmd.plan: the step it builds computes what one device computes, on simpmd and on real
JAX; its memory fits what the runs held (the scheduling and memory rules it is costed by are
simpmd.cost's, tested in tests/cost/test_predict.py on hand-worked programs); layouts that
cannot run are refused naming the limit.

Expectations are computed here independently: a one-device step of the same model (the
reference every layout must agree with), NumPy attention, the published parameter counts.
"""
from __future__ import annotations

import importlib.util
import math
from dataclasses import replace

import numpy as np
import pytest

import simpmd
from simpmd import lax, plan
from simpmd import numpy as snp
from simpmd.cost import hardware_preset
from simpmd.plan import attention as A, layers as L, step as St
from simpmd.plan.simulate import trace_step

S_ = simpmd.ShapeDtypeStruct
# plan.estimate's steps are in bfloat16, which ml_dtypes (jaxlib's) brings
needs_bf16 = pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None,
                                reason="the planner's steps are in bfloat16 (ml_dtypes)")
TINY = plan.Transformer(layers=4, d_model=32, heads=4, kv_heads=2, d_ff=48, vocab=64, seq=16,
                        gated_mlp=True)
ONE = plan.Layout(global_batch=8, microbatch=2)


# -- the model's counts ---------------------------------------------------------------------

def test_llama3_70b_parameters_and_flops_by_hand():
    m = plan.LLAMA3_70B
    layer = 2 * 8192 * 8192 + 2 * 8192 * 1024 + 3 * 8192 * 28672 + 2 * 8192
    total = 80 * layer + 2 * 128256 * 8192 + 8192
    assert m.params == total == 70_553_706_496
    assert m.flops_per_token() == 6 * total + 12 * 80 * 64 * 128 * 8192


# -- values: every layout computes the one-device step ------------------------------------

def _weights(model, layout, seed=0):
    rng = np.random.default_rng(seed)
    shapes = St.param_shapes(model, layout)
    return {k: np.ones(s, np.float32) if k.endswith("norm") else
            (rng.normal(size=s) / math.sqrt(s[-2])).astype(np.float32)
            for k, s in shapes.items()}


def _laid_out(value, key, model, layout):
    """A one-device weight (layers stacked [1, 1, L, ...]) as ``layout`` holds it: virtual
    stage r * pp + s on stage s, and the fused matrices' columns grouped by tensor-parallel
    rank (each rank's queries, keys and values; gate and up side by side)."""
    if key not in St.LAYER_SPLIT:
        return value
    flat = value[0, 0]
    if key in ("wqkv", "w_in") and layout.tp > 1:
        hd, tp = model.head_dim, layout.tp
        parts = ([model.heads * hd, model.kv_heads * hd, model.kv_heads * hd] if key == "wqkv"
                 else [model.d_ff, model.d_ff])
        pieces = np.split(flat, np.cumsum(parts)[:-1], axis=-1)
        flat = np.concatenate([np.split(p, tp, axis=-1)[r] for r in range(tp) for p in pieces],
                              axis=-1)
    per = model.layers // (layout.pp * layout.vp)
    out = np.empty((layout.pp, layout.vp, per) + flat.shape[1:], flat.dtype)
    for s in range(layout.pp):
        for r in range(layout.vp):
            j = r * layout.pp + s
            out[s, r] = flat[j * per:(j + 1) * per]
    return out


def _batch(layout, model=TINY, seed=1):
    rng = np.random.default_rng(seed)
    shape = (layout.microbatches, layout.replicas * layout.microbatch, model.seq)
    flat = rng.integers(0, model.vocab, (2,) + (layout.global_batch, model.seq))
    return [t.reshape(shape).astype(np.int32) for t in flat]


def _run(layout, weights, model=TINY, flash=True, node_gpus=None):
    simpmd.set_device_count(layout.chips)
    mesh = simpmd.make_mesh(tuple(layout.shape.values()), tuple(layout.shape))
    ins, outs = St.specs(model, layout)
    opt = {"master": {k: w.copy() for k, w in weights.items()},
           "mu": {k: np.zeros_like(w) for k, w in weights.items()},
           "nu": {k: np.zeros_like(w) for k, w in weights.items()}}
    step = simpmd.shard_map(St.train_step(model, layout, flash, node_gpus=node_gpus),
                            mesh=mesh, in_specs=ins, out_specs=outs)
    return step(weights, opt, *_batch(layout, model))


@pytest.fixture(scope="module")
def reference():
    weights = _weights(TINY, ONE)
    return weights, {flash: _run(ONE, weights, flash=flash) for flash in (True, False)}


LAYOUTS = [
    plan.Layout(pp=2, vp=2, global_batch=8, microbatch=2),
    plan.Layout(dp=2, tp=2, pp=2, global_batch=8),
    plan.Layout(fsdp=2, tp=2, sequence_parallel=True, global_batch=8, microbatch=2),
    plan.Layout(cp=2, tp=2, global_batch=8, microbatch=2, recompute="selective"),
    plan.Layout(dp=2, tp=2, pp=2, vp=2, global_batch=8, recompute="full",
                distributed_optimizer=True),
    # one micro-batch a step: under XLA no loop over micro-batches (step.each_microbatch)
    plan.Layout(fsdp=2, global_batch=8, microbatch=4, recompute="full"),
]


@pytest.mark.parametrize("layout", LAYOUTS, ids=str)
@pytest.mark.parametrize("flash", [True, False], ids=["fused attention", "scores kept"])
def test_every_layout_computes_the_one_device_step(reference, layout, flash):
    """The loss, and Adam's first moment (the gradient times 1 - b1), equal the one-device
    step's for the same weights and tokens."""
    weights, outputs = reference
    _, opt, loss = outputs[flash]
    laid = {k: _laid_out(w, k, TINY, layout) for k, w in weights.items()}
    _, got_opt, got_loss = _run(layout, laid, flash=flash)
    assert float(got_loss) == pytest.approx(float(loss), rel=1e-5)
    for k in weights:
        np.testing.assert_allclose(np.asarray(got_opt["mu"][k]),
                                   _laid_out(np.asarray(opt["mu"][k]), k, TINY, layout),
                                   rtol=2e-4, atol=2e-7, err_msg=k)


def test_one_micro_batch_is_no_loop_under_xla():
    """XLA removes a loop of one trip (its while-loop simplifier), PyTorch and Megatron
    run one micro-batch without one: under "xla" a step of one micro-batch calls the
    function once, with no scan, and stacks what it returns; with more micro-batches, or
    under another framework, it is a scan. The values are the same either way."""
    xs = np.arange(6.0, dtype=np.float32).reshape(1, 2, 3)
    f = lambda x: snp.tanh(x) * 2.0
    for framework, loops in (("xla", False), ("megatron", True)):
        s = L.Shard(TINY, {}, framework=framework)
        program = simpmd.make_jaxpr(lambda x: St.each_microbatch(s, f, x))(xs)
        assert ("scan" in str(program)) is loops, framework
        np.testing.assert_allclose(np.asarray(St.each_microbatch(s, f, xs)), np.tanh(xs) * 2,
                                   rtol=1e-6)
    two = np.concatenate([xs, xs + 1])
    s = L.Shard(TINY, {}, framework="xla")
    assert "scan" in str(simpmd.make_jaxpr(lambda x: St.each_microbatch(s, f, x))(two))
    sums = St.each_microbatch(s, lambda a: a.sum(), two)
    np.testing.assert_allclose(np.asarray(sums), two.sum(axis=(1, 2)), rtol=1e-6)


def test_real_xla_compiles_a_scan_of_one_trip_without_a_loop(jax8):
    """What step.one_trip takes from XLA, checked on JAX's own compiler: a lax.scan of one
    trip compiles to no while loop, a scan of two to one."""
    import re
    jnp = jax8.numpy
    def f(xs):
        return jax8.lax.scan(lambda c, x: (c + jnp.tanh(x).sum(), jnp.tanh(x) * 2), 0.0, xs)
    for trips, loops in ((1, 0), (2, 1)):
        hlo = jax8.jit(f).lower(jnp.ones((trips, 4, 8))).compile().as_text()
        assert len(re.findall(r"= .*\bwhile\(", hlo)) == loops, trips


def test_a_relu_mlp_is_max_of_zero_and_maxtexts_runs_use_it():
    """MaxText's base.yml at 76bd53b0f has mlp_activations ["relu"]: Transformer(
    activation="relu") runs max(u, 0) (GELU's tanh form otherwise), and every MaxText
    model entered from that commit says so; an unknown activation is refused."""
    from simpmd.plan.runs import every
    u = np.linspace(-2, 2, 9).astype(np.float32)
    relu = plan.Transformer(2, 32, 4, 64, 64, 16, activation="relu")
    np.testing.assert_array_equal(np.asarray(L.activation(L.Shard(relu, {}), u)),
                                  np.maximum(u, 0))
    gelu = np.asarray(L.activation(L.Shard(replace(relu, activation="gelu"), {}), u))
    np.testing.assert_allclose(gelu, 0.5 * u * (1 + np.tanh(0.7978845608 * (u + 0.044715 * u**3))),
                               rtol=1e-5, atol=1e-6)
    maxtext = [r for r in every() if r.source.startswith("AI-Hypercomputer/maxtext")
               and "76bd53b0f" in r.source]
    assert len(maxtext) >= 20
    assert {r.model.activation for r in maxtext} == {"relu"}
    with pytest.raises(ValueError, match="'gelu' or 'relu'"):
        plan.Transformer(2, 32, 4, 64, 64, 16, activation="swish")


def test_the_step_runs_on_real_jax_with_the_same_results(jax8, reference):
    """The same step function under jax.shard_map on 8 CPU devices (pipeline, tensor and
    sequence parallelism, the distributed optimizer): JAX's loss and moments are simpmd's."""
    from jax.sharding import Mesh
    from test_shapes import jax_specs
    layout = plan.Layout(dp=2, tp=2, pp=2, vp=2, global_batch=8, sequence_parallel=True,
                         distributed_optimizer=True)
    weights = {k: _laid_out(w, k, TINY, layout) for k, w in reference[0].items()}
    ours = _run(layout, weights)
    devices = np.array(jax8.devices()[:8]).reshape(tuple(layout.shape.values()))
    ins, outs = St.specs(TINY, layout)
    opt = {"master": weights, "mu": {k: np.zeros_like(w) for k, w in weights.items()},
           "nu": {k: np.zeros_like(w) for k, w in weights.items()}}
    theirs = jax8.jit(jax8.shard_map(St.train_step(TINY, layout), mesh=Mesh(devices, AXES_OF(layout)),
                                     in_specs=jax_specs(ins), out_specs=jax_specs(outs)))(
        weights, opt, *_batch(layout))
    assert float(theirs[2]) == pytest.approx(float(ours[2]), rel=1e-5)
    for k in weights:
        np.testing.assert_allclose(np.asarray(theirs[1]["mu"][k]), np.asarray(ours[1]["mu"][k]),
                                   rtol=2e-4, atol=2e-7, err_msg=k)


def AXES_OF(layout):
    return tuple(layout.shape)


# -- fused attention ------------------------------------------------------------------------

def _numpy_attention(q, k, v, offset=0):
    g = q.shape[2] // k.shape[2]
    k, v = np.repeat(k, g, axis=2), np.repeat(v, g, axis=2)
    s = np.einsum("btnh,bsnh->bnts", q, k) / math.sqrt(q.shape[-1])
    seen = (offset + np.arange(q.shape[1]))[:, None] >= np.arange(k.shape[1])[None]
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bnts,bsnh->btnh", p / p.sum(-1, keepdims=True), v)


@pytest.mark.parametrize("offset", [None, 4])
def test_flash_attention_values_and_gradients(offset):
    """Forward against NumPy; gradients against the scores-kept form's (finite-difference
    checked elsewhere, and a different program)."""
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 4, 4, 8)).astype(np.float32)
    k, v = (rng.normal(size=(2, 8 if offset else 4, 2, 8)).astype(np.float32) for _ in "kv")
    simpmd.set_device_count(1)

    def loss(attend):
        def f(q, k, v):
            return (attend(q, k, v, True, offset) ** 2).sum()
        return simpmd.shard_map(simpmd.value_and_grad(f, argnums=(0, 1, 2)),
                                mesh=simpmd.make_mesh((1,), ("i",)),
                                in_specs=(simpmd.P(),) * 3, out_specs=simpmd.P())(q, k, v)
    (value, grads), (value2, grads2) = loss(A.flash_attention), loss(A.materialized_attention)
    expected = (_numpy_attention(q, k, v, offset or 0) ** 2).sum()
    assert float(value) == pytest.approx(expected, rel=1e-5)
    assert float(value2) == pytest.approx(expected, rel=1e-5)
    for a, b in zip(grads, grads2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def test_flash_attention_cost_is_the_kernels():
    """Forward: 2 products over the causal blocks, reading Q, K, V and writing O; backward:
    5 products (QK^T again, dP, dV, dQ, dK)."""
    q, k = simpmd.core.core.Aval((1, 4096, 8, 128), "float16"), \
        simpmd.core.core.Aval((1, 4096, 2, 128), "float16")
    blocks = 4096 // 128
    full = 2 * 8 * 4096 * 4096 * 128
    flops, nbytes = A.flash_attention_p.cost([q, k, k], [q], causal=True, scale=1.0)
    assert flops == int(2 * full * (blocks + 1) / (2 * blocks))
    assert nbytes == 2 * (2 * q.size + 2 * k.size)
    assert A.flash_attention_bwd.cost([q, k, k, q, q], [q, k, k], causal=False, scale=1.0)[0] \
        == 5 * full


# -- dropout --------------------------------------------------------------------------------

def _one_device(f, n):
    simpmd.set_device_count(1)
    return simpmd.shard_map(f, mesh=simpmd.make_mesh((1,), ("i",)), in_specs=(simpmd.P(),) * n,
                            out_specs=simpmd.P())


def test_dropout_keeps_a_mask_and_scales_what_it_keeps():
    """Each element is zeroed with probability 0.25 (4,096 draws: within 4 sigma), the rest
    divided by 0.75; the gradient is the cotangent through the same mask; the same seed
    draws the same mask (a recomputed forward agrees with the first)."""
    from simpmd.plan.dropout import dropout
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 64)).astype(np.float32) + 10.0       # no element is 0
    c = rng.normal(size=x.shape).astype(np.float32)
    y = np.asarray(_one_device(lambda x: dropout(x, 0.25, 7), 1)(x))
    kept = y != 0
    assert abs(kept.mean() - 0.75) < 4 * math.sqrt(0.75 * 0.25 / x.size)
    np.testing.assert_allclose(y[kept], x[kept] / 0.75, rtol=1e-6)
    g = np.asarray(_one_device(simpmd.grad(lambda x: (dropout(x, 0.25, 7) * c).sum()), 1)(x))
    np.testing.assert_allclose(g, np.where(kept, c / 0.75, 0.0), rtol=1e-6)
    again = np.asarray(_one_device(lambda x: dropout(x, 0.25, 7), 1)(x))
    assert np.array_equal(again != 0, kept)


def test_flash_attention_with_dropout_is_the_scores_kept_form_with_dropout():
    """The kernel's dropout (the mask drawn again in its backward pass) against the
    probabilities dropped as a separate equation: the same loss and gradients; and the
    forward against NumPy attention with that mask."""
    from simpmd.plan.dropout import _keep_mask
    rng = np.random.default_rng(0)
    q = rng.normal(size=(2, 8, 4, 8)).astype(np.float32)
    k, v = (rng.normal(size=(2, 8, 2, 8)).astype(np.float32) for _ in "kv")

    def loss(attend):
        f = lambda q, k, v: (attend(q, k, v, True, None, 0.2, 3) ** 2).sum()
        return _one_device(simpmd.value_and_grad(f, argnums=(0, 1, 2)), 3)(q, k, v)
    (value, grads), (value2, grads2) = loss(A.flash_attention), loss(A.materialized_attention)
    s = np.einsum("btkgh,bskh->bkgts", q.reshape(2, 8, 2, 2, 8), k) / math.sqrt(8)
    s = np.where(np.tril(np.ones((8, 8), bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p = np.where(_keep_mask((1,) + p.shape, 0.2, 3)[0], p / p.sum(-1, keepdims=True) / 0.8, 0)
    expected = (np.einsum("bkgts,bskh->btkgh", p, v) ** 2).sum()
    assert float(value) == pytest.approx(expected, rel=1e-5)
    assert float(value2) == pytest.approx(expected, rel=1e-5)
    for a, b in zip(grads, grads2):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-5)


def _kernels_of(f, *shapes):
    from simpmd.cost.fusion import fuse
    program = simpmd.make_jaxpr(f)(*[S_(s, d) for s, d in shapes])
    return fuse(program.eqns, program.outvars)


def test_dropout_kernels_are_the_frameworks():
    """Megatron-LM's attention dropout (torch.nn.Dropout) is a kernel of its own, reading
    the fp16 probabilities, writing the dropped ones (2 bytes) and the mask (1 byte); under
    XLA's rules it joins the softmax's kernel; a residual dropout is one kernel with the
    residual add (Megatron-LM's bias-dropout-add): reads the block's output and the
    residual, writes the sum and the mask."""
    from simpmd.plan.dropout import dropout, dropout_p
    shape = (4, 64, 64)
    probs = lambda own: (lambda s: dropout(snp.exp(s - s.max(axis=-1, keepdims=True)), 0.1, 1,
                                           own_kernel=own, site="attention"))
    own = _kernels_of(probs(True), (shape, "float16"))
    mine = [k for k in own if [e.primitive.name for e in k.eqns] == ["dropout"]]
    assert len(mine) == 1 and mine[0].kind == "opaque"
    assert mine[0].bytes == (2 + 2 + 1) * math.prod(shape)
    fused = _kernels_of(probs(False), (shape, "float16"))
    assert not any(k.kind == "opaque" for k in fused)
    def add(x, y):                      # the mask returned, as a backward pass reads it
        dropped, mask = dropout_p.bind(y, rate=0.1, seed=2, own_kernel=False, site="hidden")
        return x + dropped, mask
    ks = _kernels_of(add, (shape, "float16"), (shape, "float16"))
    assert len(ks) == 1 and ks[0].bytes == (2 + 2 + 2 + 1) * math.prod(shape)


@needs_bf16
def test_fused_attention_dropout_keeps_no_mask_and_pays_the_generator():
    """With dropout the kernel moves the same bytes (no mask) and computes RNG_OPS more per
    computed probability, on the vector units: the prediction grows by those over the
    chip's vector rate."""
    from simpmd.cost.predict import predict
    q, k = S_((1, 1024, 8, 128), "bfloat16"), S_((1, 1024, 2, 128), "bfloat16")
    times = {}
    for rate in (0.0, 0.1):
        program = simpmd.make_jaxpr(lambda q, k, v: A.flash_attention(q, k, v, dropout=rate))(
            q, k, k)
        times[rate] = predict(program, "H100").kernels[0]
    assert times[0.1].bytes == times[0.0].bytes
    blocks = 1024 // 128
    probabilities = 8 * 1024 * 1024 * (blocks + 1) / (2 * blocks)
    extra = int(A.RNG_OPS * probabilities)
    assert times[0.1].flops - times[0.0].flops == extra
    hw = hardware_preset("H100")
    assert times[0.1].compute_s - times[0.0].compute_s == pytest.approx(
        extra / hw.vector_flops, rel=1e-6)


@needs_bf16
def test_fused_attention_runs_at_the_measured_attention_rate():
    """H100: cuDNN's fused attention (what Transformer Engine runs on Hopper) measured by
    Shah et al. 2024 (FlashAttention-3, arXiv:2407.08608) at head dim 128 and 4k tokens:
    518 TFLOP/s forward with the causal mask (Figure 5d), 499 backward (Figure 6b), of the
    989 dense. The forward kernel of a causal 4,096-token attention does 2 products over
    the 33 of 64 block rows' share (32 blocks of 128), the backward 5; each kernel's compute
    time is its FLOPs over that fraction of simpmd's peak. A100 (no source read): a large
    matmul's 86.9% of 312 TFLOP/s for both."""
    from simpmd.cost.predict import predict
    t, heads, width = 4096, 8, 128
    q, k = S_((1, t, heads, width), "bfloat16"), S_((1, t, 2, width), "bfloat16")
    loss = lambda q, k, v: A.flash_attention(q, k, v).astype(snp.float32).sum()
    program = simpmd.make_jaxpr(simpmd.grad(loss, argnums=(0, 1, 2)))(q, k, k)
    causal_flops = 2 * heads * t * t * width * 33 / 64
    rates = {"H100": (990e12 * 518 / 989, 990e12 * 499 / 989),
             "A100": (312e12 * 0.869, 312e12 * 0.869)}
    for chip, (forward, backward) in rates.items():
        kernels = {r.name: r for r in predict(program, chip).kernels if "flash" in r.name}
        fwd = next(r for n, r in kernels.items() if "bwd" not in n)
        bwd = next(r for n, r in kernels.items() if "bwd" in n)
        assert fwd.flops == pytest.approx(2 * causal_flops, rel=1e-6)
        assert bwd.flops == pytest.approx(5 * causal_flops, rel=1e-6)
        assert fwd.compute_s == pytest.approx(2 * causal_flops / forward, rel=1e-6), chip
        assert bwd.compute_s == pytest.approx(5 * causal_flops / backward, rel=1e-6), chip


def test_megatrons_selective_recomputation_keeps_the_residual_masks():
    """Korthikanti et al.'s selective recomputation recomputes the attention's core (its
    dropout mask drawn again) and keeps the rest, the residual dropouts' masks included:
    the policy keeps those, not the attention's; XLA's keeps neither."""
    from simpmd.plan.dropout import dropout_p
    from simpmd.plan import layers as L
    s = L.Shard(TINY, {}, "selective", framework="megatron")
    keep = L.policy(s)
    assert keep(dropout_p, site="hidden") and not keep(dropout_p, site="attention")
    assert not L.policy(replace(s, framework="xla"))(dropout_p, site="hidden")


# -- memory ---------------------------------------------------------------------------------

@needs_bf16
def test_the_in_flight_memory_of_the_interleaved_schedule():
    """Korthikanti et al. 2022, Table 5's 175B layout with selective recomputation and
    sequence parallelism: the peak includes the weights and optimizer state of a stage
    (16 bytes per parameter here: bf16 weights and gradients, fp32 masters and moments)
    and less than the 80 GB of an A100."""
    m = plan.Transformer(96, 12288, 96, 49152, 51200, 2048, tied_embeddings=True)
    layout = plan.Layout(tp=8, pp=8, vp=3, global_batch=64, recompute="selective",
                         sequence_parallel=True)
    result = plan.estimate(m, layout, hardware="A100", precision="fp16", flash=False)
    per_device = 96 * 12 * 12288 ** 2 / 64
    assert 16 * per_device < result.peak_bytes < 80e9


# -- what cannot run --------------------------------------------------------------------------

@needs_bf16
@pytest.mark.parametrize("layout, chips, words", [
    (plan.Layout(tp=3), 3, "heads = 4 do not split over tp = 3"),
    (plan.Layout(pp=2, stage_layers=(3, 2)), 2, "add up to 5 layers, not the model's 4"),
    (plan.Layout(dp=2, microbatch=3, global_batch=8), 2, "global_batch = 8"),
    (plan.Layout(cp=3), 3, "seq = 16 tokens do not split over cp = 3"),
    (plan.Layout(tp=2), 4, "4 chips, but the layout's axes make"),
    (plan.Layout(pp=2, vp=2, global_batch=1), 2, "fewer than pp = 2"),
])
def test_what_cannot_run_is_refused_naming_the_limit(layout, chips, words):
    with pytest.raises(plan.LayoutError, match=words.replace("(", r"\(")):
        plan.estimate(TINY, layout, hardware="H100", chips=chips)


@needs_bf16
def test_memory_over_the_chips_hbm_is_refused():
    big = plan.Transformer(48, 6144, 64, 24576, 51200, 2048)
    with pytest.raises(plan.LayoutError, match="over the 80 GB of HBM a H100 has"):
        plan.estimate(big, plan.Layout(global_batch=1), hardware="H100")
    assert not plan.estimate(big, plan.Layout(global_batch=1), hardware="H100",
                             check_memory=False).fits


@needs_bf16
def test_a_tpu_slice_must_be_one_google_documents():
    layout = plan.Layout(fsdp=2048, tp=4, global_batch=2048)
    with pytest.raises(plan.LayoutError, match="16x16x24"):
        plan.estimate(plan.LLAMA3_70B, layout, hardware="TPU v5p")
    two = plan.estimate(plan.LLAMA3_70B, plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=2048,
                                                     recompute="full", sequence_parallel=True),
                        hardware="TPU v5p", slices=2)
    assert two.chips == 8192 and two.step_s > 0


@needs_bf16
def test_the_breakdown_adds_up_and_mfu_follows_palm():
    layout = plan.Layout(tp=2, pp=2, vp=2, dp=2, global_batch=16, sequence_parallel=True)
    result = plan.estimate(TINY, layout, hardware="H100")
    assert sum(result.breakdown.values()) == pytest.approx(result.step_s)
    peak = hardware_preset("H100").matmul_peak("bf16")   # the preset's dense bf16 peak
    assert result.mfu == pytest.approx(TINY.flops_per_token() * 16 * 16 / result.step_s
                                       / 8 / peak)


# -- lesson 15's claims, held to the planner --------------------------------------------------

def _lesson(seq):
    from dataclasses import replace
    return replace(plan.LLAMA3_70B, seq=seq)


@needs_bf16
def test_lesson15_one_layer_counts_equal_jax_roofline(jax8):
    """Section 3: one layer of the chosen layout, forward and backward, as the step's scan
    repeats it: FLOPs, HBM bytes and ICI bytes per axis equal jax.experimental.roofline's."""
    pytest.importorskip("absl")
    from jax.experimental import roofline as jr
    from jax.sharding import AbstractMesh, AxisType
    from test_shapes import jax_specs
    model = _lesson(2048)
    layout = plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=2048, recompute="selective",
                         sequence_parallel=True)
    ins, outs, (weights, x) = St.layer_specs(model, layout)
    step = St.layer_step(model, layout, flash=False)
    mesh = AbstractMesh(tuple(layout.shape.values()), tuple(layout.shape),
                        axis_types=(AxisType.Auto,) * 5)
    _, theirs = jr.roofline(step, mesh=mesh, in_specs=jax_specs(ins), out_specs=jax_specs(outs))(
        {k: jax8.ShapeDtypeStruct(s, "bfloat16") for k, s in weights.items()},
        jax8.ShapeDtypeStruct(x, "bfloat16"))
    simpmd.set_device_count(layout.chips)
    ours = simpmd.cost.roofline(step, {k: S_(s, "bfloat16") for k, s in weights.items()},
                                S_(x, "bfloat16"), in_specs=ins, out_specs=outs,
                                mesh=simpmd.make_mesh(tuple(layout.shape.values()),
                                                      tuple(layout.shape)))
    assert (ours.flops, ours.hbm_bytes) == (theirs.flops, theirs.hbm_bytes)
    assert ours.ici_bytes == dict(theirs.ici_bytes)


@needs_bf16
def test_lesson15_memory_and_the_crossover():
    """Sections 4 and 6: at 512 tokens per chip every recomputation fits in a v5p's 95 GB,
    keeping less the more it recomputes; pure FSDP turns compute-bound near the book's 850
    tokens per chip, and FSDP 1024 x TP 4 is communication-bound at 512."""
    model = _lesson(2048)
    base = plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=2048, sequence_parallel=True)
    peaks = [plan.estimate(model, replace(base, recompute=r), hardware="TPU v5p",
                           slices=2).peak_bytes for r in ("none", "selective", "full")]
    assert peaks[0] > peaks[1] > peaks[2] and peaks[0] < 95e9
    pieces = _lesson(512)
    fsdp = plan.estimate(pieces, plan.Layout(dp=2, fsdp=4096, global_batch=8192),
                         hardware="TPU v5p", slices=2, memory=False)
    assert 700 < 512 * fsdp.communication_s / fsdp.products_s < 900
    mixed = plan.estimate(pieces, plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=8192,
                                              microbatch=4, sequence_parallel=True),
                          hardware="TPU v5p", slices=2, memory=False)
    assert mixed.communication_s > mixed.products_s


@needs_bf16
def test_lesson15_selective_stops_fitting_at_8192_tokens_per_chip():
    """Section 7's plot: selective recomputation fits at 4,096 tokens per chip as laid out;
    at 8,192 it does not, and XLA's rematerialization recomputes more to fit the 95 GB
    (the estimate says so, and costs more recomputation per token)."""
    pieces = _lesson(512)
    small, big = [plan.estimate(pieces, plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=n,
                                                    microbatch=n // 2048,
                                                    recompute="selective",
                                                    sequence_parallel=True),
                                hardware="TPU v5p", slices=2, check_memory=False)
                  for n in (4096 * 16, 8192 * 16)]
    assert "rematerialized" not in small.assumed and small.fits
    assert "rematerialized" in big.assumed and big.peak_bytes == 95e9
    assert big.breakdown["recompute"] > 2 * small.breakdown["recompute"]


# -- the collectives of a layer -----------------------------------------------------------

def _layer_collectives(layout, model=TINY):
    ins, outs, (weights, x) = St.layer_specs(model, layout)
    simpmd.set_device_count(layout.chips)
    mesh = simpmd.make_mesh(tuple(layout.shape.values()), tuple(layout.shape))
    step = simpmd.shard_map(St.layer_step(model, layout), mesh=mesh, in_specs=ins,
                            out_specs=outs)
    step({k: S_(s, "float32") for k, s in weights.items()}, S_(x, "float32"))
    return _collectives(step.trace.program)


def _collectives(program):
    """(name, axes) of every collective of a program, nested bodies (checkpoints) included."""
    found = []
    for e in program.eqns:
        if getattr(e.primitive, "collective", False):
            axes = e.params.get("axes", e.params.get("axis_name", ()))
            found.append((e.primitive.name, (axes,) if isinstance(axes, str) else tuple(axes)))
        for key in ("jaxpr", "call_jaxpr"):
            if key in e.params:
                found += _collectives(getattr(e.params[key], "jaxpr", e.params[key]))
    return found


def test_megatron_tensor_parallelism_has_four_collectives_per_layer():
    """Two all-reduces forward (after attention, after the MLP) and two backward (the
    gradients of the replicated inputs of the column-split products), besides the
    once-a-step reduction of the norms' gradients."""
    calls = _layer_collectives(plan.Layout(tp=2))
    assert calls.count(("psum", ("tp",))) == 4


def test_sequence_parallelism_gathers_and_scatters_and_gathers_again():
    """An all-gather before each block and a reduce-scatter after it, forward; backward the
    transposes (a reduce-scatter and an all-gather each) and the gathers again (the tokens
    are not kept): 4 + 6 per layer instead of 4 all-reduces."""
    calls = [name for name, axes in _layer_collectives(plan.Layout(tp=2, sequence_parallel=True))
             if axes == ("tp",)]
    assert sorted(calls) == ["all_gather"] * 6 + ["reduce_scatter"] * 4


def test_fsdp_gathers_each_weight_in_both_passes():
    """Four matrices per layer: each gathered forward and again backward, its gradient
    reduce-scattered once."""
    calls = _layer_collectives(plan.Layout(fsdp=2))
    assert calls.count(("all_gather", ("fsdp",))) == 8
    assert calls.count(("reduce_scatter", ("fsdp",))) == 4
