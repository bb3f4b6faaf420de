"""NVIDIA Megatron-Bridge (NeMo 25.11 container) on DGX-GB200, DGX-B200 and DGX-H100, FP8
with current scaling (framework ``"megatron"``)."""
from __future__ import annotations

from ..published import Run, _llama

SOURCE = ("NVIDIA-NeMo/Megatron-Bridge, docs/performance-summary.md at commit 00b7660be0: "
          "'25.11 NeMo Container', 'Pre-Training Performance', systems DGX-GB200, DGX-B200 "
          "and DGX-H100, the dense rows (LLAMA3_8B, LLAMA3_70B, LLAMA3.1_405B), precision "
          "FP8-CS, with #-GPUs, GBS, MBS, sequence length, FSDP (1: Megatron's FSDP), TP, PP, "
          "CP, VP and Tokens / sec / GPU as printed. Step time = GBS x sequence / "
          "(tokens/s/GPU x GPUs)")
NOTES = ("what the table does not print is taken as NeMo's recipes set it for these models "
         "(no recomputation, sequence parallelism with TP > 1, the distributed optimizer, "
         "flash attention), not checked against scripts/performance at that commit; FP8-CS "
         "is Transformer Engine's current scaling, which the planner prices as its delayed "
         "scaling, with the weights held in FP8 as its recipe sets (fp8_param_gather, "
         "checked at that commit)")
L3_8B = _llama(32, 4096, 32, 14336, 128256, 8192, kv_heads=8, name="LLaMA 3-8B")
L3_70B = _llama(80, 8192, 64, 28672, 128256, 8192, kv_heads=8, name="LLaMA 3-70B")
L31_405B = _llama(126, 16384, 128, 53248, 128256, 8192, kv_heads=8, name="LLaMA 3.1-405B")
ROWS = [  # system, model, GPUs, GBS, MBS, FSDP, TP, PP, CP, VP, tokens/s/GPU
    ("GB200", L3_8B, 8, 128, 2, 0, 1, 1, 1, 1, 31508),
    ("GB200", L3_70B, 64, 256, 2, 1, 1, 1, 1, 1, 4312),
    ("GB200", L31_405B, 256, 1536, 1, 0, 4, 16, 1, 4, 813),
    ("B200", L3_8B, 8, 128, 2, 0, 1, 1, 1, 1, 30624),
    ("B200", L31_405B, 128, 64, 1, 0, 4, 8, 2, 8, 661),
    ("H100", L3_8B, 8, 128, 1, 1, 1, 1, 1, 1, 14451),
    ("H100", L3_70B, 64, 128, 1, 0, 4, 8, 1, 5, 1602),
    ("H100", L31_405B, 1024, 512, 1, 0, 8, 8, 2, 8, 292),
]


def runs() -> list:
    out = []
    for system, model, gpus, gbs, mbs, fsdp, tp, pp, cp, vp, rate in ROWS:
        replicas = gpus // (tp * pp * cp)
        # FP8-CS is bf16_with_fp8_current_scaling_mixed (scripts/performance/utils/
        # precision.py at 00b7660be0), which sets fp8_param_gather=True
        # (src/megatron/bridge/training/mixed_precision.py): the weights held in FP8.
        axes = dict(tp=tp, pp=pp, cp=cp, vp=vp, microbatch=mbs, global_batch=gbs,
                    sequence_parallel=tp > 1, fp8_param_gather=True)
        axes.update(fsdp=replicas) if fsdp else axes.update(dp=replicas,
                                                             distributed_optimizer=True)
        if (system, model) == ("H100", L3_8B):
            # The recipe of this row recomputes 5 layers: LLAMA3_8B_PRETRAIN_CONFIG_H100_
            # FP8_CS_BASE_CONFIG sets recompute_num_layers=5 (scripts/performance/configs/
            # llama/llama3_workload_base_configs.py at 00b7660be0), which makes the
            # recompute granularity "full" with the "block" method
            # (scripts/performance/utils/overrides.py): Layout.recompute_layers.
            axes.update(recompute="full", recompute_layers=5)
        step = gbs * model.seq / (rate * gpus)
        out.append(Run(f"Megatron-Bridge {model.name}, {gpus} x {system}", model, axes, system,
                       "fp8", step, SOURCE,
                       f"{rate:,} tokens/s/GPU: {gbs} x {model.seq} / ({rate} x {gpus})",
                       framework="megatron", notes=NOTES))
    return out
