"""simpmd.plan's layouts of issue 44: uneven pipeline stages, FSDP and the distributed
optimizer on any group size (padded), k-layer recomputation, ZeRO by stage, the frameworks
by name, the new presets, and a memory refusal that says what would fit.

Expectations are independent of the code under test: layer counts worked by hand from
Megatron-Core's rule, the one-device step's values (test_plan's reference), recompute
times in proportion to the layers recomputed, datasheet numbers.
"""
from __future__ import annotations

import importlib.util
from dataclasses import replace

import numpy as np
import pytest

from simpmd import plan
from simpmd.cost import hardware_preset
from simpmd.plan import step as St
from simpmd.plan.layout import stage_split
from test_plan import ONE, TINY, _laid_out, _run, _weights

needs_bf16 = pytest.mark.skipif(importlib.util.find_spec("ml_dtypes") is None,
                                reason="the planner's steps are in bfloat16 (ml_dtypes)")
LLAMA31_405B = plan.Transformer(126, 16384, 128, 53248, 128256, 8192, kv_heads=8,
                                gated_mlp=True, name="LLaMA 3.1-405B")


# -- how layers split over stages ---------------------------------------------------------

def test_405b_splits_as_megatron_core_counts_embedding_and_loss():
    """126 layers + the embedding + the loss = 128 = 8 x 8 x 2 and 16 x 8: the first and the
    last virtual stage build one layer fewer."""
    eight = stage_split(LLAMA31_405B, plan.Layout(pp=8, vp=8))
    assert eight == (1,) + (2,) * 62 + (1,) and sum(eight) == 126
    assert stage_split(LLAMA31_405B, plan.Layout(pp=16)) == (7,) + (8,) * 14 + (7,)


def test_layers_split_as_evenly_as_possible_or_as_given():
    m = plan.Transformer(10, 32, 4, 48, 64, 16)
    assert stage_split(m, plan.Layout(pp=4)) == (2, 3, 3, 2)    # 10 + 2 = 12 = 4 x 3
    assert stage_split(m, plan.Layout(pp=3)) == (3, 4, 3)       # 12 = 3 x 4
    odd = plan.Transformer(11, 32, 4, 48, 64, 16)               # 11 and 13 over 4: neither
    assert stage_split(odd, plan.Layout(pp=4)) == (3, 3, 3, 2)
    assert stage_split(m, plan.Layout(pp=2, stage_layers=(6, 4))) == (6, 4)
    with pytest.raises(plan.LayoutError, match="add up to 9 layers, not the model's 10"):
        plan.estimate(m, plan.Layout(pp=2, stage_layers=(5, 4)), hardware="H100")
    with pytest.raises(plan.LayoutError, match="one count of layers"):
        plan.Layout(pp=2, stage_layers=(10,))


@needs_bf16
def test_405b_enters_at_pp8_vp8_and_pp16_priced_at_the_fullest_stage():
    """Each stage's program holds as many layers as the fullest virtual stage: the products
    of 2 x 8 (pp 8 x vp 8) and 8 (pp 16) layers per stage, per micro-batch."""
    for layout, per_stage in ((plan.Layout(tp=8, pp=8, vp=8, dp=4, cp=2, global_batch=512,
                                           sequence_parallel=True, distributed_optimizer=True),
                               16),
                              (plan.Layout(tp=8, pp=16, dp=4, global_batch=512,
                                           sequence_parallel=True,
                                           distributed_optimizer=True), 8)):
        e = plan.estimate(LLAMA31_405B, layout, hardware="H100", precision="fp8",
                          framework="megatron", check_memory=False, memory=False)
        assert e.step_s > 0 and f"the fullest, {per_stage // layout.vp}" in e.assumed["stages"]
        shapes = St.param_shapes(LLAMA31_405B, layout)
        assert shapes["wo"][:3] == (layout.pp, layout.vp, per_stage // layout.vp)


# -- FSDP and the distributed optimizer on any group size -----------------------------------

@needs_bf16
def test_fsdp_1120_at_d_model_20480_enters_padded():
    """20,480 over 1,120 ranks: 19 rows each (21,280 padded), gathered and cut to 20,480."""
    m = plan.Transformer(105, 20480, 128, 81920, 51200, 2048, tied_embeddings=True)
    layout = plan.Layout(fsdp=1120, global_batch=1120, recompute="full")
    assert St.param_shapes(m, layout)["wqkv"][3] == 21280
    e = plan.estimate(m, layout, hardware="A100", precision="fp16", check_memory=False,
                      memory=False)
    assert e.step_s > 0


@needs_bf16
def test_a_padded_fsdp_step_computes_the_one_device_step():
    """TINY's d_model 32 over fsdp = 3 (padded to 33 with zeros): the loss and Adam's first
    moment equal the one-device step's, the padding's moment zero."""
    weights = _weights(TINY, ONE)
    _, opt, loss = _run(ONE, weights)
    layout = plan.Layout(fsdp=3, global_batch=6, microbatch=2)
    one = plan.Layout(global_batch=6, microbatch=2)
    _, ref_opt, ref_loss = _run(one, weights)
    shapes = St.param_shapes(TINY, layout)
    laid = {}
    for k, w in weights.items():
        w = _laid_out(w, k, TINY, layout)
        laid[k] = np.pad(w, [(0, a - b) for a, b in zip(shapes[k], w.shape)])
    _, got_opt, got_loss = _run(layout, laid)
    assert float(got_loss) == pytest.approx(float(ref_loss), rel=1e-5)
    for k in weights:
        want = _laid_out(np.asarray(ref_opt["mu"][k]), k, TINY, layout)
        got = np.asarray(got_opt["mu"][k])
        np.testing.assert_allclose(got[tuple(slice(0, n) for n in want.shape)], want,
                                   rtol=2e-4, atol=2e-7, err_msg=k)
        assert not np.any(got[tuple(slice(0, n) for n in want.shape[:-1])][..., want.shape[-1]:])


# -- recomputation of k layers, ZeRO by stage -----------------------------------------------

@needs_bf16
def test_recomputing_k_layers_recomputes_k_layers():
    """The recompute term grows by one layer's forward per layer recomputed: k of a stage's
    4 layers cost k / 4 of full recomputation's; the step's values do not change."""
    m = plan.Transformer(8, 256, 4, 1024, 512, 2048)
    runs = {k: plan.estimate(m, plan.Layout(pp=2, global_batch=8, microbatch=8,
                                            recompute="full", recompute_layers=k),
                             hardware="H100") for k in (1, 2, 4)}
    full = runs[4].breakdown["recompute"]
    for k in (1, 2):
        assert runs[k].breakdown["recompute"] == pytest.approx(full * k / 4, rel=0.02)
    assert runs[1].peak_bytes > runs[2].peak_bytes > runs[4].peak_bytes
    weights = _weights(TINY, ONE)
    _, opt, loss = _run(ONE, weights)
    layout = plan.Layout(pp=2, global_batch=8, microbatch=2, recompute="full",
                         recompute_layers=1)
    laid = {k: _laid_out(w, k, TINY, layout) for k, w in weights.items()}
    _, _, got = _run(layout, laid)
    assert float(got) == pytest.approx(float(loss), rel=1e-5)
    with pytest.raises(plan.LayoutError, match="with recompute='full'"):
        plan.Layout(recompute_layers=2)


def test_zero_stages_by_name():
    assert plan.Layout(dp=8, zero=1).distributed_optimizer
    assert plan.Layout(dp=8, zero=2).distributed_optimizer
    three = plan.Layout(dp=8, zero=3)
    assert (three.dp, three.fsdp) == (1, 8) and "ZeRO-3" in str(three)
    with pytest.raises(plan.LayoutError, match="ZeRO's stages are 1"):
        plan.Layout(zero=4)


@needs_bf16
def test_the_distributed_optimizer_splits_over_dp_and_cp():
    """Megatron's distributed optimizer over the data-parallel group with context
    parallelism: with cp = 2 each rank holds half the masters and moments it holds at cp 1."""
    base = dict(dp=2, global_batch=4, distributed_optimizer=True)
    ins = {cp: St.specs(TINY, plan.Layout(cp=cp, **base))[0][1]["master"]["wo"]
           for cp in (1, 2)}
    assert "cp" not in str(ins[1]) and "cp" in str(ins[2])


# -- frameworks, presets, refusals ---------------------------------------------------------

@needs_bf16
def test_frameworks_by_name_and_what_they_assumed():
    for name in ("xla", "megatron", "pytorch", "deepspeed"):
        e = plan.estimate(TINY, ONE, hardware="H100", framework=name)
        assert e.assumed["framework"] == name and "assumed kernels" in str(e)
    assert plan.estimate(TINY, ONE, hardware="H100", framework="pytorch",
                         compile=True).assumed["framework"] == "pytorch+compile"
    with pytest.raises(plan.LayoutError, match="'xla', 'megatron', 'pytorch', 'deepspeed'"):
        plan.estimate(TINY, ONE, framework="jax")
    with pytest.raises(plan.LayoutError, match="compile=True is torch.compile"):
        plan.estimate(TINY, ONE, framework="xla", compile=True)
    with pytest.raises(plan.LayoutError, match="1F1B without virtual stages"):
        plan.estimate(TINY, plan.Layout(pp=2, vp=2, global_batch=4), framework="deepspeed")
    with pytest.raises(plan.LayoutError, match="ZeRO-1 at most"):
        plan.estimate(TINY, plan.Layout(pp=2, dp=2, zero=3, global_batch=4),
                      framework="deepspeed")


@needs_bf16
def test_xla_on_hopper_says_it_runs_its_own_gemms():
    """Under XLA an H100 estimate says it priced XLA's GEMMs (68% of the bf16 peak, from
    2 x 4096 x 8192 x 28672 FLOPs in 2.89 ms less a 31.5 us floor); Megatron's on the same
    chip and XLA's on an A100 say nothing of it. The step's compute term grows with it."""
    xla = plan.estimate(TINY, ONE, hardware="H100", framework="xla")
    rate = 2 * 4096 * 8192 * 28672 / (2.89e-3 - 31.5e-6) / 9.9e14
    assert f"{rate:.0%}" == "68%" and "XLA's own GEMMs, 68%" in xla.assumed["matmuls"]
    assert "assumed matmuls: XLA's own GEMMs" in str(xla)
    assert "matmuls" not in plan.estimate(TINY, ONE, hardware="H100",
                                          framework="megatron").assumed
    assert "matmuls" not in plan.estimate(TINY, ONE, hardware="A100", framework="xla").assumed
    big = plan.Transformer(layers=2, d_model=4096, heads=32, d_ff=16384, vocab=32000, seq=4096)
    layout = plan.Layout(global_batch=1)
    h100 = hardware_preset("H100")
    mamf = replace(h100, xla_matmul_efficiency=())          # the same chip at MAMF's 80.3%
    slower = (plan.estimate(big, layout, hardware=h100, check_memory=False).breakdown["compute"]
              / plan.estimate(big, layout, hardware=mamf, check_memory=False).breakdown["compute"])
    assert 1.1 < slower <= 0.803 / rate + 1e-9     # the products slow by 80.3 / 68.0 at most


def test_new_presets_hold_their_datasheets_numbers():
    """Dense rates: half the datasheets' with-sparsity figures."""
    assert hardware_preset("H100 PCIe").matmul_peak("bf16") == pytest.approx(1513e12 / 2)
    assert hardware_preset("H100 NVL").matmul_peak("fp8") == pytest.approx(3341e12 / 2)
    assert hardware_preset("H100 NVL").hbm_bandwidth == 3.9e12
    assert hardware_preset("GB200").matmul_peak("fp8") == pytest.approx(720e15 / 72 / 2)
    assert hardware_preset("GB200").hbm_bandwidth == pytest.approx(576e12 / 72)
    assert hardware_preset("GH200").name == "GH200"
    assert hardware_preset("GH200").hbm_bandwidth == 4e12
    # torchtitan's benchmark page: 96GB HBM2e at 2.4 TB/s, peak between SXM and NVL
    assert hardware_preset("H100 96GB").hbm_bandwidth == 2.4e12
    assert 835.5e12 < hardware_preset("H100 96GB").matmul_peak("bf16") < 989e12
    # FlashAttention-4 (arXiv:2603.05451): up to 1,613 TFLOP/s on B200, up to 1.3x cuDNN 9.13
    for name in ("B200", "GB200"):
        rate = hardware_preset(name).sustained_attention_flops("forward", "bf16")
        assert rate == pytest.approx(1613e12 / 1.3 * hardware_preset(name).matmul_peak("bf16")
                                     / 2250e12)
        assert rate < hardware_preset(name).sustained_matmul_flops("bf16")
    from simpmd.plan.simulate import HBM_CAPACITY
    assert HBM_CAPACITY["H100 NVL"] == 94e9 and HBM_CAPACITY["GB200"] == 186e9


@needs_bf16
def test_an_a3_high_vm_is_an_h100_whose_network_is_googles():
    """Google Cloud's A3 High: eight H100 SXM a VM and 1,000 Gbps between VMs, so 1e12 / 8
    bits / 8 GPUs = 15.6 GB/s per GPU (the DGX H100's 400 Gb/s adapters: 50). Inside a VM
    nothing changes; across VMs a gradient all-reduce takes longer, by no more than the
    bandwidths' ratio, 3.2x."""
    a3, dgx = hardware_preset("a3-highgpu-8g"), hardware_preset("H100")
    assert a3.name == "H100 A3 High" and a3.scale_out_bandwidth == 1e12 / 8 / 8
    assert a3.matmul_peak("bf16") == dgx.matmul_peak("bf16") and a3.link_bandwidth == \
        dgx.link_bandwidth
    from simpmd.plan import families
    from simpmd.plan.simulate import HBM_CAPACITY
    assert HBM_CAPACITY["H100 A3 High"] == 80e9 and families.generation(a3.name) == "H100"
    model = plan.Transformer(layers=2, d_model=1024, heads=8, d_ff=4096, vocab=32000, seq=1024)
    one_vm = plan.Layout(fsdp=8, global_batch=8)
    two_vms = plan.Layout(dp=2, fsdp=8, global_batch=16)
    same = [plan.estimate(model, one_vm, hardware=h).step_s for h in (a3, dgx)]
    assert same[0] == pytest.approx(same[1], rel=1e-12)
    slow, fast = (plan.estimate(model, two_vms, hardware=h).communication_s for h in (a3, dgx))
    assert 1.2 * fast < slow < 3.2 * fast


@needs_bf16
def test_a_memory_refusal_names_check_memory_and_what_would_fit():
    big = plan.Transformer(48, 6144, 64, 24576, 51200, 2048)
    with pytest.raises(plan.LayoutError) as refused:
        plan.estimate(big, plan.Layout(dp=2, global_batch=2), hardware="H100")
    words = str(refused.value)
    e = plan.estimate(big, plan.Layout(dp=2, global_batch=2), hardware="H100",
                      check_memory=False)
    assert f"{e.peak_bytes / 1e9:.1f} GB per chip" in words and "check_memory=False" in words
    assert "distributed_optimizer=True" in words and "recompute='full'" in words
    n = 2 ** int(np.ceil(np.log2(e.peak_bytes / e.hbm_bytes)))
    assert f"pp = {n}" in words


# -- memory against Korthikanti et al. 2022, Figure 1 -------------------------------------

# weights + optimizer state and activations per GPU, GiB (calculon-ai/calculon at caa4b11,
# calculon/llm/validation.py, seqsel_fig1), for the Table 5 layouts with sequence
# parallelism and selective recomputation
FIGURE_1 = {"22B": 45.5625 + 9.5625, "175B": 45.5625 + 12.3515625,
            "530B": 31.640625 + 23.076171875, "1T": 32.958984375 + 26.5625}


@needs_bf16
@pytest.mark.parametrize("size", sorted(FIGURE_1))
def test_peak_within_10_percent_of_korthikanti_figure_1(size):
    from simpmd.plan import published
    run = next(r for r in published.runs() if r.name == f"{size}, selective + sequence parallel")
    e = plan.estimate(run.model, run.layout, hardware=run.hardware, precision=run.precision,
                      flash=run.flash, framework=run.framework)
    assert e.peak_bytes / 2**30 == pytest.approx(FIGURE_1[size], rel=0.10)


@needs_bf16
def test_eager_pytorch_moves_more_bytes_and_torch_compile_fuses_as_xla():
    """Eager PyTorch writes every operation's result: more of the step bound by memory and
    more launches than XLA's fused kernels; under torch.compile (recomputing nothing, so
    that the checkpoint's rerun does not differ) the step is XLA's. (Two micro-batches a
    rank: with one, XLA's step has no loop over them and PyTorch's keeps it,
    step.one_trip.)"""
    layout = plan.Layout(dp=2, global_batch=8, microbatch=2)
    xla, eager, compiled = (plan.estimate(TINY, layout, hardware="H100", framework=f,
                                          compile=c)
                            for f, c in (("xla", False), ("pytorch", False), ("pytorch", True)))
    assert eager.breakdown["memory"] > xla.breakdown["memory"]
    assert eager.breakdown["launch"] > xla.breakdown["launch"]
    assert compiled.step_s == pytest.approx(xla.step_s)


def _pytorch_layer_collectives(layout):
    import simpmd
    from test_plan import _collectives
    S_ = simpmd.ShapeDtypeStruct
    ins, outs, (weights, x) = St.layer_specs(TINY, layout)
    simpmd.set_device_count(layout.chips)
    mesh = simpmd.make_mesh(tuple(layout.shape.values()), tuple(layout.shape))
    step = simpmd.shard_map(St.layer_step(TINY, layout, framework="pytorch"), mesh=mesh,
                            in_specs=ins, out_specs=outs)
    step({k: S_(s, "float32") for k, s in weights.items()}, S_(x, "float32"))
    return _collectives(step.trace.program)


def test_pytorch_fsdp_gathers_each_layer_as_one_flat_parameter():
    """FSDP wraps a decoder layer as one FlatParameter: one all-gather of the layer's four
    matrices forward, again backward, one reduce-scatter of its gradient (per weight:
    8 and 4, test_plan's test_fsdp_gathers_each_weight_in_both_passes)."""
    calls = _pytorch_layer_collectives(plan.Layout(fsdp=2))
    assert calls.count(("all_gather", ("fsdp",))) == 2
    assert calls.count(("reduce_scatter", ("fsdp",))) == 1


@needs_bf16
def test_pytorch_fsdp_step_computes_the_one_device_step():
    """The flat gather is a re-layout: the loss and Adam's first moments are the one-device
    step's."""
    import simpmd
    weights = _weights(TINY, ONE)
    _, opt, loss = _run(ONE, weights)
    layout = plan.Layout(fsdp=2, global_batch=8, microbatch=2)
    laid = {k: _laid_out(w, k, TINY, layout) for k, w in weights.items()}
    simpmd.set_device_count(layout.chips)
    mesh = simpmd.make_mesh(tuple(layout.shape.values()), tuple(layout.shape))
    ins, outs = St.specs(TINY, layout)
    state = {"master": {k: w.copy() for k, w in laid.items()},
             "mu": {k: np.zeros_like(w) for k, w in laid.items()},
             "nu": {k: np.zeros_like(w) for k, w in laid.items()}}
    from test_plan import _batch
    step = simpmd.shard_map(St.train_step(TINY, layout, True, "pytorch"), mesh=mesh,
                            in_specs=ins, out_specs=outs)
    _, got_opt, got = step(laid, state, *_batch(layout))
    assert float(got) == pytest.approx(float(loss), rel=1e-5)
    for k in weights:
        np.testing.assert_allclose(np.asarray(got_opt["mu"][k]),
                                   _laid_out(np.asarray(opt["mu"][k]), k, TINY, layout),
                                   rtol=2e-4, atol=2e-7, err_msg=k)


@needs_bf16
def test_master_weights_as_remainders_hold_two_bytes_a_weight_less():
    """NeMo's DistributedFusedAdam keeps the 16 bits a bf16 weight lacks of its fp32
    master: each rank's share of the masters (here TINY's weights over dp = 2) takes 2
    bytes a weight instead of 4, and the step's time does not change."""
    base = dict(dp=2, global_batch=4, distributed_optimizer=True)
    fp32, rem = (plan.estimate(TINY, plan.Layout(master_weights=m, **base), hardware="H100")
                 for m in ("fp32", "remainders"))
    assert fp32.peak_bytes - rem.peak_bytes == 2 * TINY.params // 2
    assert rem.step_s == pytest.approx(fp32.step_s, rel=1e-3)
    with pytest.raises(plan.LayoutError, match="'fp32', 'remainders'"):
        plan.Layout(master_weights="bf16")


@needs_bf16
def test_gradients_reduced_in_bf16_move_and_hold_half():
    """NeMo's FP8 runs reduce their gradients in bf16 (Apex's grad_sync_dtype=bf16): each
    weight's reduce-scatter over dp moves its elements at 2 bytes, where the default moves
    them at 4 (the stacked wqkv of 4 layers at d_model 256: 4 x 256 x 768 elements), and
    Megatron holds no float32 main_grad: 2 bytes a parameter less at the peak."""
    model = plan.Transformer(4, 256, 4, 512, 1000, 128)
    def est(fp32):
        return plan.estimate(model, plan.Layout(dp=2, global_batch=4, distributed_optimizer=True,
                                                grad_reduce_in_fp32=fp32),
                             hardware="H100", framework="megatron", check_memory=False)
    fp32, bf16 = est(True), est(False)
    sent = lambda e: {c[2] for c in e.collectives if c[0] == "reduce_scatter" and c[1] == ("dp",)}
    assert 4 * 256 * 768 * 4 in sent(fp32) and 4 * 256 * 768 * 2 in sent(bf16)
    assert max(sent(bf16)) == 4 * 256 * 768 * 2
    assert fp32.peak_bytes - bf16.peak_bytes == 2 * model.params
    assert "bf16" in bf16.assumed["gradients"] and "float32" in fp32.assumed["gradients"]
    assert "gradients reduced in bf16" in str(plan.Layout(grad_reduce_in_fp32=False))


@needs_bf16
def test_fp8_param_gather_holds_no_16_bit_copy_of_the_fp8_weights():
    """Megatron-Bridge's FP8 recipes keep the layers' weights in FP8 only
    (``fp8_param_gather``): the peak holds 2 bytes less for each element of the matrices
    cast to FP8 (4 layers x (256 x 768 + 256 x 256 + 2 x 256 x 512) over tp 2; not the
    embedding, the head or the norms), the step's time is the same, and without FP8 the
    flag is refused."""
    model = plan.Transformer(4, 256, 4, 512, 1000, 128)
    def est(flag, precision="fp8"):
        return plan.estimate(model, plan.Layout(dp=2, tp=2, global_batch=4,
                                                distributed_optimizer=True,
                                                fp8_param_gather=flag),
                             hardware="H100", framework="megatron", precision=precision,
                             check_memory=False)
    kept, fp8_only = est(False), est(True)
    assert kept.peak_bytes - fp8_only.peak_bytes == 2 * 4 * (
        256 * 768 + 256 * 256 + 2 * 256 * 512) // 2
    assert fp8_only.step_s == pytest.approx(kept.step_s, rel=1e-9)
    assert "FP8" in fp8_only.assumed["FP8 weights"] and "FP8 weights" not in kept.assumed
    with pytest.raises(plan.LayoutError, match="precision='fp8'"):
        est(True, "bf16")


@needs_bf16
def test_pytorch_fsdp_under_a_pipeline_gathers_each_stage_once_per_step():
    """torchtitan with pipeline parallelism keeps FSDP's weights gathered across the
    micro-batches (``reshard_after_forward = not pp_enabled``): the step's FSDP gathers of
    the layers are the stage's whole matrices, where without a pipeline each layer gathers
    its own flat parameter. 4 layers over pp 2 at d_model 256, FSDP over 2, bf16: a stage's
    wqkv shard is 2 layers x 128 x 768 x 2 bytes; one layer's flat shard is
    (256 x 768 + 256 x 256 + 2 x 256 x 512) / 2 x 2 bytes."""
    model = plan.Transformer(4, 256, 4, 512, 1000, 128)
    def gathers(layout, framework="pytorch"):
        est = plan.estimate(model, layout, hardware="H100", framework=framework,
                            check_memory=False, memory=False)
        return {c[2] for c in est.collectives if c[0] == "all_gather" and c[1] == ("fsdp",)}
    staged = gathers(plan.Layout(fsdp=2, pp=2, global_batch=8))
    assert 2 * 128 * 768 * 2 in staged
    assert (256 * 768 + 256 * 256 + 2 * 256 * 512) // 2 * 2 not in staged
    flat = gathers(plan.Layout(fsdp=4, global_batch=8))     # no pipeline: layer by layer
    assert (256 * 768 + 256 * 256 + 2 * 256 * 512) // 4 * 2 in flat
    assert 128 * 768 * 2 in gathers(plan.Layout(fsdp=2, pp=2, global_batch=8), "xla")


@needs_bf16
def test_fsdp_under_a_pipeline_holds_its_gradients_as_pytorch_does():
    """The gradients FSDP under a pipeline holds, worked by hand: 4 layers over pp 2 at
    d_model 256 (wqkv 256 x 768, wo 256 x 256, w_in 256 x 512, w_out 512 x 256: 524,288
    elements a layer), FSDP over 4, so a stage's gathered matrices are G = 2 x 524,288
    elements over 2 layers. The step's program holds two 16-bit buffers of G (the
    accumulator and one tick's gradients of the whole stage), 4 G bytes. torchtitan's
    (gradient_sync="step") holds the float32 accumulator, 4 G, and one layer's bf16
    gradient, 2 G / 2: G bytes more than the program. The Llama 3 trainer's
    ("microbatch") holds one layer's bf16 gradient and its float32 copy, 6 G / 2, and the
    float32 sharded gradients, 4 G / 4: 4 G, as much as the program."""
    from simpmd.plan import simulate
    model = plan.Transformer(4, 256, 4, 512, 1000, 128)
    G = 2 * (256 * 768 + 256 * 256 + 256 * 512 + 512 * 256)
    step = plan.Layout(fsdp=4, pp=2, global_batch=16)
    micro = plan.Layout(fsdp=4, pp=2, global_batch=16, gradient_sync="microbatch")
    assert simulate.stage_gathered_elements(model, step) == (G, 2)
    assert simulate.pipeline_fsdp_gradients(model, step, "pytorch") == G
    assert simulate.pipeline_fsdp_gradients(model, micro, "pytorch") == 0
    for other in ("xla", "megatron"):
        assert simulate.pipeline_fsdp_gradients(model, step, other) == 0
    assert simulate.pipeline_fsdp_gradients(model, plan.Layout(fsdp=8, global_batch=16),
                                            "pytorch") == 0
    peak = {lay.gradient_sync: plan.estimate(model, lay, hardware="H100",
                                             framework="pytorch").peak_bytes
            for lay in (step, micro)}
    assert peak["step"] - peak["microbatch"] == G
    assert "gradients reduce-scattered per micro-batch" in str(micro)
    with pytest.raises(plan.LayoutError, match="'step', 'microbatch'"):
        plan.Layout(gradient_sync="layer")


@needs_bf16
def test_pytorch_fsdp_with_context_parallelism_shards_over_cp_too():
    """torchtitan applies fully_shard over dp_shard x cp: the weights and the optimizer's
    state split over fsdp x cp, which the planner holds as its distributed optimizer over
    cp (the float32 masters' spec names cp); XLA's layouts stay as given. On one device
    the masters and moments then take 12 bytes a weight element over 4 ranks, not 2: the
    peak is lower by at least 12 x (the layers' matrices, 4 x 524,288 elements) / 4."""
    model = plan.Transformer(4, 256, 4, 512, 1000, 128)
    lay = plan.Layout(fsdp=2, cp=2, global_batch=8)
    est = plan.estimate(model, lay, hardware="H100", framework="pytorch")
    assert est.layout.distributed_optimizer and "FSDP over cp" in est.assumed
    assert not plan.estimate(model, lay, hardware="H100").layout.distributed_optimizer
    assert "cp" in str(St.specs(model, est.layout)[0][1]["master"]["wqkv"])
    assert "cp" not in str(St.specs(model, lay)[0][1]["master"]["wqkv"])
    from simpmd.plan import simulate
    alone = simulate.Reuse().peak(model, lay, "H100", True, "pytorch", "bf16")
    assert alone - est.peak_bytes >= 12 * 4 * 524288 // 4
