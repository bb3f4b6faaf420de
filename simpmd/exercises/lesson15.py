"""Checks for lesson 15, planning a LLaMA 3 training run by simulation.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values are closed forms written out factor by factor
from the numbers each exercise gives (a model's config, a chip's datasheet numbers, a
schedule), never from the lesson's simulation or its solutions. Each slip a learner may
make is the same closed form with one input changed (or two: the hint then names both).
"""
from __future__ import annotations

import itertools
import math

from simpmd.course import Verdict, check_against_mistakes, is_placeholder, say
from simpmd import plan
from dataclasses import replace

__all__ = ["LLAMA3_8B", "NEMO", "check_param_count", "check_state_per_chip",
           "check_training_days", "check_bubble", "check_layout_under_budget",
           "check_context_parallel", "check_run_cost"]


def _check_slips(answer, closed_form, right: dict, slips, *, what, unit, rtol):
    """Check ``answer`` against ``closed_form(**right)``; each slip ``(name, changes,
    hint)`` is the closed form with ``changes`` applied. An answer one slip explains gets
    that slip's hint; one that two slips of different inputs explain gets both (the
    first such pair listed); otherwise the unit hints of :func:`check`."""
    expected = closed_form(**right)
    found = {1: [], 2: []}
    for count in (1, 2):
        for combo in itertools.combinations(slips, count):
            if len({name for name, _, _ in combo}) < count:
                continue
            value = closed_form(**{**right, **{k: v for _, changes, _ in combo
                                                for k, v in changes.items()}})
            if not math.isclose(value, expected, rel_tol=rtol):
                found[count].append((value, ". Also: ".join(hint for _, _, hint in combo)))
    try:
        a = float(answer)
    except (TypeError, ValueError):
        a = None
    mistakes = []
    if a is not None:
        ones = [m for m in found[1] if math.isclose(a, m[0], rel_tol=rtol)]
        twos = [m for m in found[2] if math.isclose(a, m[0], rel_tol=rtol)]
        mistakes = ones or twos[:1]
    return check_against_mistakes(answer, expected, mistakes, what=what, unit=unit, rtol=rtol)


# -- exercise 1: LLaMA 3-8B's parameters ------------------------------------------------------
# meta-llama/Meta-Llama-3-8B, config.json on Hugging Face: hidden_size 4096,
# intermediate_size 14336, num_hidden_layers 32, num_attention_heads 32,
# num_key_value_heads 8, vocab_size 128256 (head_dim = 4096 / 32 = 128).

LLAMA3_8B = dict(layers=32, d_model=4096, ffw=14336, heads=32, kv_heads=8, head_dim=128,
                 vocab=128256)


def _params(layers, d_model, ffw, heads, kv_heads, head_dim, vocab, norms=True, vocabs=2,
            mlp=3, kv_mats=2, unit=1):
    D = d_model
    attention = 2 * D * heads * head_dim + kv_mats * D * kv_heads * head_dim
    per_layer = attention + mlp * D * ffw + (2 * D if norms else 0)
    return (layers * per_layer + vocabs * vocab * D + (D if norms else 0)) / unit


def check_param_count(answer):
    """Exercise 1: LLaMA 3-8B's parameter count (norms' scales counted or not: 0.003%)."""
    c = LLAMA3_8B
    slips = [
        ("kv_heads", dict(kv_heads=c["heads"]), "that gives the keys and values as many heads "
         "as the queries (32); LLaMA 3 uses grouped-query attention with 8 key/value heads"),
        ("vocabs", dict(vocabs=1), "that counts one embedding matrix; LLaMA 3's input "
         "embedding and output projection are two"),
        ("vocabs", dict(vocabs=0), "that leaves out both vocabulary matrices"),
        ("mlp", dict(mlp=2), "that counts two MLP matrices per layer; the gated MLP has three "
         "(gate, up and down)"),
        ("kv_mats", dict(kv_mats=1), "that counts one of the keys' and values' projections; "
         "K and V each have their own D x 8 x 128 matrix"),
        ("unit", dict(unit=1e9), "that is in billions; give the count itself, all its digits "
         "(8.03e9 is 8,030,...)"),
    ]
    return _check_slips(answer, _params, c, slips, what="the parameter count",
                        unit="parameters", rtol=1e-4)


# -- exercise 2: weights and optimizer state per chip -----------------------------------------

def _state(params, norms, split, bytes_per_param, norms_whole=True):
    matrices = params - norms
    held = matrices / split + (norms if norms_whole else norms / split)
    return bytes_per_param * held


def check_state_per_chip(answer, params: int, norms: int, split: int = 4096):
    """Exercise 2: bytes of weights and optimizer state one chip holds between steps: every
    weight matrix split over ``split`` chips (FSDP x TP), the norms' ``norms`` scales whole
    on every chip, 14 bytes per parameter (bf16 weights, fp32 masters, Adam's m and v)."""
    right = dict(params=params, norms=norms, split=split, bytes_per_param=2 + 4 + 4 + 4)
    slips = [
        ("bytes", dict(bytes_per_param=2 + 4 + 4), "that counts the bf16 weights and Adam's "
         "two float32 moments (the book's 10 bytes); mixed-precision training also keeps a "
         "float32 master copy of every weight, which the update changes and the bf16 weights "
         "are cast from: 2 + 4 + 4 + 4 bytes"),
        ("bytes", dict(bytes_per_param=2 + 4 + 4 + 4 + 2), "that adds the gradients' 2 "
         "bytes: the step makes them and uses them up; between steps a chip holds weights, "
         "masters and moments: 14 bytes"),
        ("bytes", dict(bytes_per_param=2 + 4 + 4 + 4 + 4), "that adds float32 gradients "
         "(Megatron's 18 bytes hold them during the step); between steps a chip holds "
         "weights, masters and moments: 14 bytes"),
        ("bytes", dict(bytes_per_param=4 + 4 + 4), "that leaves out the bf16 weights (or "
         "keeps the weights in float32 only): the step computes with a bf16 copy and updates "
         "a float32 master, 2 + 4 + 4 + 4 bytes"),
        ("bytes", dict(bytes_per_param=2), "that counts the bf16 weights alone; the masters "
         "and Adam's moments are 12 bytes more"),
        ("split", dict(split=2 * split), f"that divides by all {2 * split:,} chips; each of "
         f"the two slices holds a whole copy of the model (data parallelism over DCN): the "
         f"weights are split over the {split:,} chips of one slice"),
        ("split", dict(split=split // 4), "that divides by the FSDP axis only; tensor "
         "parallelism splits each matrix 4 ways too"),
        ("split", dict(split=1), "that is the whole model's state; FSDP and TP split every "
         "weight matrix over the chips"),
        ("norms", dict(norms_whole=False), "that splits the norms' scales too; the plan "
         "holds them whole on every chip (their specs name no mesh axis)"),
        ("params", dict(params=70.4e9), "that uses the book's rounded 70.4e9; use the exact "
         "count, `total`"),
    ]
    return _check_slips(answer, _state, right, slips, what="the bytes per chip",
                        unit="bytes", rtol=1e-6)


# -- exercise 3: how many days --------------------------------------------------------------
V5P_PEAK = 4.59e14       # bf16 FLOP/s per TPU v5p chip (Cloud TPU docs, the Scaling Book)
V5E_PEAK = 1.97e14       # and per TPU v5e chip: a peak a learner may take by mistake


def _days(tokens, per_token, chips, peak, mfu, unit_s=86400):
    return tokens * per_token / (chips * peak * mfu) / unit_s


def check_training_days(answer, flops_per_token: float, params: float | None = None,
                        tokens: float = 15e12, chips: int = 8960, mfu: float = 0.4):
    """Exercise 3: days to train on ``tokens`` at ``mfu`` of the chips' peak, with
    ``flops_per_token`` (PaLM's 6N + 12LHQT) for a model of ``params`` parameters."""
    right = dict(tokens=tokens, per_token=flops_per_token, chips=chips, peak=V5P_PEAK, mfu=mfu)
    slips = [
        ("mfu", dict(mfu=1.0), f"that assumes every chip runs at its peak; at {mfu:.0%} MFU "
         f"the chips do {mfu} of it, so it takes 1 / {mfu} as long"),
        ("unit", dict(unit_s=1), "that is in seconds; the question asks for days"),
        ("unit", dict(unit_s=3600), "that is in hours; the question asks for days"),
        ("chips", dict(chips=1), "that is one chip's time; the work is split over all chips"),
        ("chips", dict(chips=8192), f"that uses 8,192 chips (the planned two slices); the "
         f"question is the book's, on {chips:,} chips"),
    ]
    slips += [
        ("mfu", dict(mfu=100 * mfu), f"that writes the MFU as {100 * mfu:g}; {mfu:.0%} is the "
         f"fraction {mfu}"),
        ("peak", dict(peak=V5E_PEAK), "that uses the TPU v5e's 1.97e14 FLOP/s; the chips are "
         "TPU v5p, 4.59e14 bf16 FLOP/s each"),
    ]
    if params is not None:
        more = flops_per_token / (6 * params) - 1
        slips.append(("per_token", dict(per_token=6 * params), f"that uses 6 x the "
                      f"parameters per token; PaLM's count (per_token) adds attention's "
                      f"12 L H Q T: {more:.1%} more at this sequence length"))
    return _check_slips(answer, _days, right, slips, what="the training time", unit="days",
                        rtol=0.01)


# -- exercise 4: the bubble of NeMo's schedule ----------------------------------------------
# NVIDIA NeMo's performance summary (docs/source/performance/performance_summary.md at
# commit 8e3d65dcfe, NeMo 24.07, DGX-H100, FP8): LLAMA2-70B on 64 GPUs, global batch 128,
# micro-batch 1, sequences of 4096 tokens, TP 4, PP 4, VP 20 (virtual stages per GPU),
# 1728 tokens/s/GPU measured.

NEMO = dict(gpus=64, global_batch=128, micro_batch=1, sequence=4096, tp=4, pp=4, vp=20,
            layers=80, tokens_per_s_per_gpu=1728)


def _bubble(gpus, global_batch, micro_batch, tp, pp, vp, per_gpu=False, gpipe=False,
            useful=False, per_replica_gpus=False, idle=None, percent=1):
    replicas = gpus if per_gpu else tp * pp if per_replica_gpus else gpus // (tp * pp)
    m = global_batch // (micro_batch * replicas)
    idle = pp - 1 if idle is None else idle
    if gpipe:
        return percent * idle / (m + pp - 1)
    return percent * (idle / (m * vp) if useful else idle / (m * vp + pp - 1))


def check_bubble(answer):
    """Exercise 4: the fraction of the interleaved schedule's ticks that are its bubble:
    ``pp - 1`` of ``m * vp + pp - 1``, with ``m`` micro-batches per pipeline replica."""
    if is_placeholder(answer):
        say(False, "the bubble's share of the ticks is still a placeholder; give a fraction "
                   "between 0 and 1.")
        return Verdict(False)
    n = NEMO
    right = {k: n[k] for k in ("gpus", "global_batch", "micro_batch", "tp", "pp", "vp")}
    slips = [
        ("m", dict(gpus=n["tp"] * n["pp"]), f"that runs all {n['global_batch']} "
         f"micro-batches through one replica; the {n['gpus']} GPUs make "
         f"{n['gpus'] // (n['tp'] * n['pp'])} replicas of TP {n['tp']} x PP {n['pp']}, "
         f"each with a quarter of the batch"),
        ("m", dict(per_gpu=True), f"that divides the batch by all {n['gpus']} GPUs; the "
         f"{n['tp'] * n['pp']} GPUs of a replica (TP x PP) share each micro-batch"),
        ("m", dict(per_replica_gpus=True), f"that takes m = {n['global_batch']} / "
         f"{n['tp'] * n['pp']}, which divides the batch by the {n['tp'] * n['pp']} GPUs of one replica; the batch is "
         f"shared among the {n['gpus'] // (n['tp'] * n['pp'])} replicas (whose GPUs all work "
         f"on the same micro-batches): m = {n['global_batch']} / "
         f"{n['gpus'] // (n['tp'] * n['pp'])}"),
        ("idle", dict(idle=n["pp"]), f"a pipeline of p = {n['pp']} stages idles p - 1 = "
         f"{n['pp'] - 1} ticks, not p: the first stage starts at once, the last after p - 1"),
        ("percent", dict(percent=100), "that looks like a percentage; give the fraction "
         "(a percentage divided by 100)"),
        ("percent", dict(percent=1e4), "that looks like a percentage multiplied by 100 once "
         "more; give the fraction, between 0 and 1"),
        ("vp", dict(vp=n["layers"]), f"v = {n['layers']} counts the layers; v is the "
         f"virtual stages each GPU holds (VP = {n['vp']})"),
        ("vp", dict(vp=1), "that is the bubble without interleaving; with v virtual stages "
         "per GPU there are m v + p - 1 ticks, and still p - 1 of them idle"),
        ("form", dict(gpipe=True), "that is GPipe's bubble, (p - 1) / (m + p - 1); the "
         "interleaved schedule's ticks are m v + p - 1"),
        ("form", dict(useful=True), "that is the bubble over the useful ticks, (p - 1) / "
         "(m v) (Narayanan et al.'s ratio); the question asks for its share of all m v + "
         "p - 1 ticks"),
    ]
    return _check_slips(answer, _bubble, right, slips, what="the bubble's share",
                        unit="of the ticks", rtol=1e-6)


# -- exercises 5 to 7: the planner itself -----------------------------------------------------
# These ask the learner to use simpmd.plan; their checks run the planner on the answer (does
# it fit? does it run?) and on the alternatives the question names, and work out every
# count by hand.

BUDGET_BYTES = 8e9              # exercise 5: the HBM a chip may give the training
BUDGET_LAYOUTS = [dict(fsdp=4096 // tp, tp=tp, recompute=r) for tp in (4, 8)
                  for r in ("none", "selective", "full")]


def _estimate(model, layout, **options):
    return plan.estimate(model, layout, hardware="TPU v5p", slices=2, **options)


def _layout_problem(layout, chips: int, global_batch: int, seq: int):
    """A sentence about what makes ``layout`` the wrong shape for the question, or None."""
    if is_placeholder(layout):
        return "the layout is still a placeholder; give a plan.Layout(...)"
    if not isinstance(layout, plan.Layout):
        return f"give a plan.Layout(...), got {type(layout).__name__}"
    if layout.chips != chips:
        return (f"that layout uses {layout.chips:,} chips (dp x fsdp x tp x cp x pp); the two "
                f"slices have {chips:,}")
    if layout.global_batch != global_batch:
        return (f"global_batch={layout.global_batch}: LLaMA 3's 4M tokens per step are "
                f"{global_batch:,} sequences of {seq:,} tokens")
    return None


def check_layout_under_budget(layout, model) -> Verdict:
    """Exercise 5: the fastest layout of section 2's step whose peak memory per chip stays
    under :data:`BUDGET_BYTES`, among FSDP x TP 4 or 8 with any recomputation."""
    problem = _layout_problem(layout, 8192, 2048, model.seq)
    if problem:
        return say(False, problem + ".")
    try:
        mine = _estimate(model, layout, check_memory=False)
    except plan.LayoutError as exc:
        return say(False, f"the planner cannot run that layout: {exc}")
    gb = BUDGET_BYTES / 1e9
    if mine.peak_bytes > BUDGET_BYTES:
        return say(False, f"its peak is {mine.peak_bytes / 1e9:.2f} GB per chip, over the "
                   f"{gb:g} GB budget: recompute more in the backward pass, or split the "
                   f"activations over more chips (tp).")
    base = plan.Layout(dp=2, global_batch=2048, sequence_parallel=True)
    options = [replace(base, **axes) for axes in BUDGET_LAYOUTS]
    fitting = [(e.step_s, lay) for lay, e in zip(options, plan.sweep(
        model, options, hardware="TPU v5p", slices=2, check_memory=False))
        if not isinstance(e, plan.LayoutError) and e.peak_bytes <= BUDGET_BYTES]
    best_s, best = min(fitting, key=lambda pair: pair[0])
    if mine.step_s > best_s * 1.005:
        return say(False, f"it fits ({mine.peak_bytes / 1e9:.2f} GB) but a step takes "
                   f"{mine.step_s:.3f} s; tp={best.tp} with recompute={best.recompute!r} "
                   f"also fits and takes {best_s:.3f} s. Compare what each way of saving "
                   f"memory costs in time: more recomputation, or more tensor parallelism.")
    return say(True, f"{mine.peak_bytes / 1e9:.1f} GB per chip, under {gb:g} GB, in "
               f"{mine.step_s:.3f} s a step: the fastest of the layouts that fit.")


CP_SEQ, CP_SEQUENCES = 8192, 512        # exercise 6: 4M tokens of 8,192-token sequences


def check_context_parallel(layout, model) -> Verdict:
    """Exercise 6: LLaMA 3's 8,192-token sequences, 4M tokens a step, on both slices with
    dp=2 and tp=4: each FSDP rank needs whole sequences, so 512 sequences allow at most
    256 FSDP ranks per slice, and cp = 8192 / (2 x 256 x 4) = 4 splits each sequence."""
    if getattr(model, "seq", None) != CP_SEQ:
        return say(False, f"the model's sequences should be {CP_SEQ:,} tokens: "
                   f"replace(plan.LLAMA3_70B, seq={CP_SEQ})")
    problem = _layout_problem(layout, 8192, CP_SEQUENCES, CP_SEQ)
    if problem:
        return say(False, problem + ".")
    ranks = layout.dp * layout.fsdp
    if ranks > CP_SEQUENCES:
        return say(False, f"dp x fsdp = {ranks:,} ranks, but there are only {CP_SEQUENCES} "
                   f"sequences and each rank needs whole ones: split each sequence over cp "
                   f"chips instead (cp = 8192 / (dp x fsdp x tp)).")
    try:
        mine = _estimate(model, layout)
    except plan.LayoutError as exc:
        return say(False, f"the planner cannot run that layout: {exc}")
    return say(True, f"cp={layout.cp} splits each {CP_SEQ:,}-token sequence over {layout.cp} "
               f"chips ({CP_SEQ // layout.cp:,} tokens each), {ranks} ranks of whole "
               f"sequences: {mine.peak_bytes / 1e9:.1f} GB per chip, a step in "
               f"{mine.step_s:.3f} s, MFU {mine.mfu:.0%}.")


# Exercise 7: what the run costs. Google Cloud's on-demand price of a TPU v5p chip, USD per
# chip-hour, as the Scaling Book's Part 8 ("Serving LLaMA 3-70B on TPUs", applied-inference.md
# of jax-ml/scaling-book at commit 04d8de5) tabulates it from cloud.google.com/tpu/pricing;
# and the v5e's, a price a learner may take by mistake.
V5P_PRICE, V5E_PRICE = 4.2, 1.2


def _cost(tokens, tokens_per_step, step_s, chips, price, unit_s=3600):
    return tokens / tokens_per_step * step_s * chips / unit_s * price


def check_run_cost(answer, step_s: float, tokens: float = 15e12, chips: int = 8192,
                   tokens_per_step: int = 2048 * 2048):
    """Exercise 7: dollars for ``tokens`` tokens at ``step_s`` a step of
    ``tokens_per_step`` tokens on ``chips`` chips, at :data:`V5P_PRICE` a chip-hour."""
    right = dict(tokens=tokens, tokens_per_step=tokens_per_step, step_s=step_s, chips=chips,
                 price=V5P_PRICE)
    slips = [
        ("chips", dict(chips=1), f"that is the hours of the run times the price of one chip; "
         f"every one of the {chips:,} chips is billed for those hours"),
        ("chips", dict(chips=8960), f"that prices 8,960 chips (the book's pod); the plan runs "
         f"on {chips:,}"),
        ("unit", dict(unit_s=1), "that multiplies seconds by a price per hour: divide the "
                                 "seconds by 3,600 first"),
        ("unit", dict(unit_s=86400), "that divides by the seconds of a day; the price is per "
                                     "chip-hour (3,600 s)"),
        ("tokens_per_step", dict(tokens_per_step=2048), "that counts 2,048 tokens a step: a "
         "step is 2,048 sequences of 2,048 tokens"),
        ("price", dict(price=V5E_PRICE), "that is the TPU v5e's $1.2 a chip-hour; these chips "
         "are v5p, $4.2"),
    ]
    return _check_slips(answer, _cost, right, slips, what="the cost", unit="dollars",
                        rtol=1e-3)
