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

__all__ = ["LLAMA3_8B", "NEMO", "check_param_count", "check_state_per_chip",
           "check_training_days", "check_bubble"]


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
