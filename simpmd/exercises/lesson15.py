"""Checks for lesson 15, planning a LLaMA 3 training run by simulation.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values are closed forms written out factor by factor
from the numbers each exercise gives (a model's config, a chip's datasheet numbers, a
schedule), never from the lesson's simulation or its solutions.
"""
from __future__ import annotations

from simpmd.course import Factor, Verdict, check_against_mistakes, check_quantity

__all__ = ["LLAMA3_8B", "check_param_count", "check_memory_per_chip", "check_training_days",
           "check_h100_tokens", "NEMO"]


# -- exercise 1: LLaMA 3-8B's parameters ------------------------------------------------------
# meta-llama/Meta-Llama-3-8B, config.json on Hugging Face: hidden_size 4096,
# intermediate_size 14336, num_hidden_layers 32, num_attention_heads 32,
# num_key_value_heads 8, vocab_size 128256 (head_dim = 4096 / 32 = 128).

LLAMA3_8B = dict(layers=32, d_model=4096, ffw=14336, heads=32, kv_heads=8, head_dim=128,
                 vocab=128256)


def _params(layers, d_model, ffw, heads, kv_heads, head_dim, vocab, norms=True):
    D = d_model
    attention = 2 * D * heads * head_dim + 2 * D * kv_heads * head_dim
    per_layer = attention + 3 * D * ffw + (2 * D if norms else 0)
    return layers * per_layer + 2 * vocab * D + (D if norms else 0)


def check_param_count(answer) -> Verdict:
    """Exercise 1: LLaMA 3-8B's parameter count (norms' scales counted or not: 0.003%)."""
    c = LLAMA3_8B
    expected = _params(**c)
    no_gqa = dict(c, kv_heads=c["heads"])
    mistakes = [
        (_params(**no_gqa), "that gives the keys and values as many heads as the queries "
                            "(32); LLaMA 3 uses grouped-query attention with 8 key/value heads"),
        (expected - c["vocab"] * c["d_model"], "that counts one embedding matrix; LLaMA 3's "
                                               "input embedding and output projection are two"),
        (expected - c["layers"] * c["d_model"] * c["ffw"], "that counts two MLP matrices per "
                                                           "layer; the gated MLP has three "
                                                           "(gate, up and down)"),
        (expected - 2 * c["vocab"] * c["d_model"], "that leaves out both vocabulary matrices"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the parameter count",
                                  unit="parameters", rtol=1e-4)


# -- exercise 2: weights and optimizer state per chip -----------------------------------------

def check_memory_per_chip(answer, params: int, chips: int = 8192) -> Verdict:
    """Exercise 2: bytes of bf16 weights plus float32 Adam state (m and v) on one chip, when
    FSDP x TP split every weight over all ``chips``."""
    factors = [
        Factor("parameters", params),
        Factor("bytes per parameter", 2 + 4 + 4, {
            2: "that counts the bf16 weights alone; Adam keeps two float32 moments, m and v, "
               "4 bytes each: 2 + 4 + 4 bytes per parameter",
            2 + 4: "that counts one of Adam's two moments; m and v are 4 bytes each",
            4 + 4 + 4: "that stores the weights in float32; the step keeps them in bfloat16 "
                       "(2 bytes)",
            8: "that counts the optimizer state alone; the weights (2 bytes each) are on the "
               "chip too"}),
        Factor("chips", 1 / chips, {
            1: "that is the whole model's state; FSDP and TP split every weight and its "
               "state over all the chips",
            1 / (chips // 4): "that divides by the FSDP groups' size only; the weights are "
                              "split over 'tp' too (P('fsdp', 'tp'))"}),
    ]
    return check_quantity(answer, factors, what="the bytes per chip", unit="bytes")


# -- exercise 3: how many days --------------------------------------------------------------
V5P_PEAK = 4.59e14       # bf16 FLOP/s per TPU v5p chip (the Scaling Book's table)


def check_training_days(answer, flops_per_token: float, tokens: float = 15e12,
                        chips: int = 8960, mfu: float = 0.4) -> Verdict:
    """Exercise 3: days to train on ``tokens`` at ``mfu`` of the chips' peak."""
    expected = tokens * flops_per_token / (chips * V5P_PEAK * mfu) / 86400
    mistakes = [(expected * mfu, "that assumes every chip runs at its peak; at 40% MFU the "
                                 "chips do 0.4 of it, so it takes 1 / 0.4 as long"),
                (expected * 86400, "that is in seconds; the question asks for days"),
                (expected * 24, "that is in hours; the question asks for days"),
                (expected * chips, "that is one chip's time; the work is split over all chips")]
    return check_against_mistakes(answer, expected, mistakes, what="the training time",
                                  unit="days", rtol=0.01)


# -- exercise 4: the H100 prediction ----------------------------------------------------------
# NVIDIA NeMo's performance summary (docs/source/performance/performance_summary.md, NeMo
# 24.07, DGX-H100, FP8): LLAMA2-70B on 64 GPUs, global batch 128, micro-batch 1, sequences
# of 4096 tokens, TP 4, PP 4, VP 20 (virtual stages per GPU), 1707 tokens/s/GPU measured.

NEMO = dict(gpus=64, global_batch=128, micro_batch=1, sequence=4096, tp=4, pp=4, vp=20,
            tokens_per_s_per_gpu=1707, model_tflops_per_gpu=759)


def check_h100_tokens(answer, stage_seconds: float) -> Verdict:
    """Exercise 4: tokens per second per GPU when one micro-batch takes ``stage_seconds``
    on each pipeline stage, with the interleaved schedule's bubble."""
    n = NEMO
    per_replica = n["tp"] * n["pp"]                        # GPUs that share each micro-batch
    replicas = n["gpus"] // per_replica
    m = n["global_batch"] // (n["micro_batch"] * replicas)  # micro-batches per replica
    p, v = n["pp"], n["vp"]
    tokens = n["micro_batch"] * n["sequence"]
    bubble = (p - 1) / (m * v)
    expected = tokens * (1 - bubble) / (stage_seconds * per_replica)
    mistakes = [
        (tokens / (stage_seconds * per_replica), "that leaves out the pipeline bubble: "
         "(p - 1) / (m v) of the time with the interleaved schedule"),
        (tokens * (1 - (p - 1) / (m + p - 1)) / (stage_seconds * per_replica),
         "that is GPipe's bubble, (p - 1) / (m + p - 1); the interleaved schedule, with v = "
         "20 virtual stages per GPU, has (p - 1) / (m v)"),
        (tokens * (1 - bubble) / stage_seconds, "that is a whole pipeline replica's rate; "
         "it has TP x PP = 16 GPUs"),
        (tokens * (1 - bubble) / (stage_seconds * n["tp"]), "that divides by the TP group "
         "only; a micro-batch passes through PP = 4 stages of 4 GPUs each"),
        (tokens * (1 - bubble) / (stage_seconds * n["gpus"]), "that divides one replica's "
         "rate by all 64 GPUs; the 4 replicas work on their micro-batches at once"),
    ]
    return check_against_mistakes(answer, expected, mistakes, what="the tokens per second "
                                  "per GPU", unit="tokens/s", rtol=1e-3)
