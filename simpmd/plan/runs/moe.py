"""Published, measured mixture-of-experts training runs, entered before the planner could
predict any of them (issue 48), and their development / held-out draw.

Source: NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md at commit 00b7660be0,
'25.11 NeMo Container', 'Pre-Training Performance', systems DGX-GB200, DGX-B200 and
DGX-H100 (the MoE rows), plus the DGX-H100 Qwen3_235B_a22B row of the same container
from docs/performance-summary-archive.md at commit 0a25f911b2 (the current page's row lacks
its GBS). The table's note: in the MoE benchmarks the token distribution among experts is
force-balanced and every run is token-dropless, so the router's load imbalance of these
runs is 1 (the busiest expert gets the mean load). Megatron's data-parallel size is GPUs /
(TP x PP x CP) and the expert-parallel group is carved out of it, so in ``plan.Layout``'s
terms ``dp = GPUs / (TP x PP x CP x EP)`` (with EP > that data-parallel size, as in the
H100 Qwen3-235B row, the experts fold over TP too: Megatron-Core's expert tensor
parallelism of 1). Step time = GBS x sequence / (tokens/s/GPU x GPUs).

Models, from each one's config.json on Hugging Face: Qwen/Qwen3-30B-A3B (48 layers,
hidden 2048, 32 query and 4 key/value heads of 128, 128 experts of 768, 8 per token,
vocabulary 151936), Qwen/Qwen3-235B-A22B (94 layers, hidden 4096, 64 and 4 heads of 128,
128 experts of 1536, 8 per token), openai/gpt-oss-120b (36 layers, hidden 2880, 64 and 8
heads of 64, 128 experts of 2880, 4 per token, vocabulary 201088; every other layer's
attention is a 128-token sliding window, which the planner prices as full causal
attention: an approximation, said so in the rows' notes). DeepSeek-V3's rows are left
out: its multi-head latent attention is not a form ``plan.Transformer`` can state.

The draw below was made over the names alone, before ``plan.estimate`` had an
expert-parallel step. :func:`runs` gives the rows as :class:`simpmd.plan.published.Run` s
(framework ``"megatron"``); what the table does not print is taken from the performance
recipes at the table's commit where they say it (:data:`RECIPE`: recomputation, the
all_to_all's overlap, and two layouts the table prints against its recipe), else as NeMo's
recipes set it by default: the distributed optimizer, sequence parallelism with TP > 1,
flash attention, and the force-balanced router's ``expert_load`` of 1. They are kept apart from :func:`simpmd.plan.runs.every` (the dense
validation) and checked in tests/plan/test_plan_moe.py (tests/ before issue 46 item 5).
"""
from __future__ import annotations

from dataclasses import replace

from ..layout import Layout
from ..model import Transformer
from ..published import Run
from .split import draw

SOURCE = ("NVIDIA-NeMo/Megatron-Bridge docs/performance-summary.md at 00b7660be0, '25.11 "
          "NeMo Container', Pre-Training Performance (H100 Qwen3-235B: "
          "docs/performance-summary-archive.md at 0a25f911b2, same container)")

QWEN3_30B_A3B = Transformer(layers=48, d_model=2048, heads=32, kv_heads=4, head_dim=128,
                            d_ff=6144, vocab=151936, seq=4096, gated_mlp=True, experts=128,
                            top_k=8, expert_d_ff=768, name="Qwen3-30B-A3B")
QWEN3_235B_A22B = Transformer(layers=94, d_model=4096, heads=64, kv_heads=4, head_dim=128,
                              d_ff=12288, vocab=151936, seq=4096, gated_mlp=True,
                              experts=128, top_k=8, expert_d_ff=1536, name="Qwen3-235B-A22B")
GPT_OSS_120B = Transformer(layers=36, d_model=2880, heads=64, kv_heads=8, head_dim=64,
                           d_ff=2880, vocab=201088, seq=4096, gated_mlp=True, experts=128,
                           top_k=4, expert_d_ff=2880, name="gpt-oss-120b")

# system, model, precision, GPUs, GBS, MBS, seq, TP, PP, CP, VP, EP, tokens/s/GPU
ROWS = [
    ("GB200", GPT_OSS_120B, "bf16", 64, 1280, 1, 8192, 1, 1, 1, 1, 64, 15876),
    ("GB200", QWEN3_30B_A3B, "fp8", 8, 512, 4, 4096, 1, 1, 1, 1, 8, 23766),
    ("GB200", QWEN3_235B_A22B, "bf16", 256, 8192, 1, 4096, 1, 8, 1, 3, 32, 4916),
    ("B200", GPT_OSS_120B, "bf16", 64, 512, 4, 4096, 1, 1, 1, 1, 8, 8213),
    ("B200", QWEN3_30B_A3B, "fp8", 8, 512, 1, 4096, 1, 1, 1, 1, 8, 9299),
    ("B200", QWEN3_235B_A22B, "fp8", 64, 1024, 1, 4096, 1, 8, 1, 2, 8, 3269),
    ("H100", GPT_OSS_120B, "bf16", 64, 512, 4, 4096, 1, 4, 1, 1, 8, 5630),
    ("H100", QWEN3_30B_A3B, "fp8", 16, 512, 2, 4096, 1, 2, 1, 24, 8, 5275),
    ("H100", QWEN3_235B_A22B, "fp8", 256, 2048, 1, 4096, 2, 8, 1, 4, 32, 1575),
]


def name(row) -> str:
    system, model, precision, gpus = row[:4]
    return f"Megatron-Bridge {model.name}, {gpus} x {system}, {precision}"


def step_s(row) -> float:
    """The measured step: GBS x sequence / (tokens/s/GPU x GPUs)."""
    gpus, gbs, seq, rate = row[3], row[4], row[6], row[-1]
    return gbs * seq / (rate * gpus)


SEED = 20261248      # this set's own seed (split.py's protocol: a new seed per added set)


class _Named:        # what split.draw reads of a run: its name and (for its family) source
    def __init__(self, row):
        self.name, self.model, self.framework, self.hardware = (
            name(row), row[1], "megatron", row[0])
        self.axes = dict(tp=row[7], pp=row[8], cp=row[9], ep=row[11])


def redraw() -> tuple:
    """(development, held-out) names, drawn as :func:`simpmd.plan.runs.split.draw` draws."""
    return draw([_Named(r) for r in ROWS], SEED)


# The draw at SEED over the 9 rows above (2026-12-02), made before any of them was
# predicted; tests/plan/test_plan_moe.py redraws it. Tune on DEVELOPMENT only.
DEVELOPMENT = (
    'Megatron-Bridge Qwen3-235B-A22B, 256 x GB200, bf16',
    'Megatron-Bridge gpt-oss-120b, 64 x B200, bf16',
    'Megatron-Bridge gpt-oss-120b, 64 x GB200, bf16',
    'Megatron-Bridge gpt-oss-120b, 64 x H100, bf16',
)
HELD_OUT = (
    'Megatron-Bridge Qwen3-235B-A22B, 256 x H100, fp8',
    'Megatron-Bridge Qwen3-235B-A22B, 64 x B200, fp8',
    'Megatron-Bridge Qwen3-30B-A3B, 16 x H100, fp8',
    'Megatron-Bridge Qwen3-30B-A3B, 8 x B200, fp8',
    'Megatron-Bridge Qwen3-30B-A3B, 8 x GB200, fp8',
)


NOTES = ("the distributed optimizer, sequence parallelism with TP > 1 and flash attention "
         "taken as NeMo's recipes' defaults; recomputation as the recipes at the table's commit "
         "set it (RECIPE: none for Qwen3, the norms' and the experts' activation's outputs for "
         "gpt-oss); the router force-balanced, so expert_load = 1 (the table's note); FP8 is "
         "Megatron's current scaling, priced as Transformer Engine's delayed scaling; "
         "gpt-oss's sliding-window layers and attention sinks priced as full causal attention")

# What the table does not print, or prints against its own recipe, from the performance
# recipes at the table's commit (NVIDIA-NeMo/Megatron-Bridge at 00b7660be0, the same as at
# the 25.11 release v0.2.0): scripts/performance/configs/gpt_oss/
# gpt_oss_workload_base_configs.py sets recompute_modules=["layernorm", "moe_act"] for
# gpt-oss-120b on GB200, B200 and H100 (output-discarding recomputation:
# plan.Layout(recompute_modules=...)); qwen3_llm_pretrain.py sets recompute_granularity=None
# for every Qwen3 run; qwen/qwen3_workload_base_configs.py sets moe_a2a_overlap=True
# (--overlap-moe-expert-parallel-comm, overrides.py) for Qwen3-235B-A22B on B200 and H100
# and Qwen3-30B-A3B on H100, and no recipe of the other rows does (Megatron-Core's
# all_to_alls then hold the compute stream: plan.Layout(overlap_all_to_all=...)). Two gpt-oss rows print a layout their recipe does not set, and it
# is the recipe's that is taken (checked 2026-12-03, before the held-out half was looked at
# again, on the development rows' configurations, not their ratios):
# * B200: the table prints EP 8, the recipe sets expert_model_parallel_size=64 (MBS 4, GBS
#   512, as the table); at EP 8 the step holds 221 GB per GPU of the B200's 180 GB
#   (plan.estimate's memory; 190 GB even with bf16 gradient buffers), at EP 64 171 GB;
#   the 26.02 table (docs/performance-summary.md at c0b9a0003) prints EP 64 for the same
#   model on 64 B200s at 8,047 tokens/s/GPU against this row's 8,213.
# * H100: the table prints MBS 4 (and GA 2, which its own GBS 512, PP 4 and 64 GPUs
#   contradict: 512 / (4 x 16) = 8), the recipe keeps the base micro_batch_size=1; at MBS 4
#   the step holds 142 GB per GPU of the H100's 80 GB, at MBS 1 71 GB.
RECIPE = {
    ("GB200", "gpt-oss-120b"): dict(recompute_modules=("layernorm", "moe_act")),
    ("B200", "gpt-oss-120b"): dict(recompute_modules=("layernorm", "moe_act"), ep=64),
    ("H100", "gpt-oss-120b"): dict(recompute_modules=("layernorm", "moe_act"), microbatch=1),
    ("B200", "Qwen3-235B-A22B"): dict(overlap_all_to_all=True),
    ("H100", "Qwen3-235B-A22B"): dict(overlap_all_to_all=True),
    ("H100", "Qwen3-30B-A3B"): dict(overlap_all_to_all=True),
}


def layout(row) -> Layout:
    """The row's layout: ``dp = GPUs / (TP x PP x CP x EP)``; where EP is more than
    Megatron's data-parallel size, the experts fold over TP (``ep = EP / TP``); and what
    :data:`RECIPE` sets for the row."""
    gpus, gbs, mbs, _, tp, pp, cp, vp, ep = row[3:12]
    recipe = dict(RECIPE.get((row[0], row[1].name), {}))
    ep, mbs = recipe.pop("ep", ep), recipe.pop("microbatch", mbs)
    if gpus % (tp * pp * cp * ep):
        ep //= tp
    return Layout(dp=gpus // (tp * pp * cp * ep), tp=tp, pp=pp, cp=cp, vp=vp, ep=ep,
                  microbatch=mbs, global_batch=gbs, sequence_parallel=tp > 1,
                  distributed_optimizer=True, **recipe)


def runs() -> list:
    """The rows as :class:`Run` s, each model at its row's sequence length."""
    return [Run(name(r), replace(r[1], seq=r[6]), layout(r), r[0], r[2], step_s(r), SOURCE,
                f"{r[-1]:,} tokens/s/GPU: {r[4]} x {r[6]} / ({r[-1]} x {r[3]})",
                framework="megatron", notes=NOTES) for r in ROWS]
