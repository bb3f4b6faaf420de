"""Llama 3 405B's pre-training on 8,192 and 16,384 H100 (Meta's PyTorch trainer: FSDP,
tensor, pipeline and context parallelism; framework ``"pytorch"``)."""
from __future__ import annotations

from dataclasses import replace

from ..published import Run, _llama

SOURCE = ("Llama Team, AI @ Meta, 'The Llama 3 Herd of Models', arXiv:2407.21783 (2024), "
          "Table 4, as P. Balaji's SC'24 talk 'Herding Llamas' shows it and "
          "glennklockwood.com/garden/llama-3.1 transcribes it: 8,192 GPUs at TP 8, CP 1, "
          "PP 16, 430 TFLOP/s per GPU; 16,384 at TP 8, CP 1, PP 16, 400; 16,384 at TP 8, "
          "CP 16, PP 16, 380; 16M tokens a batch; BF16 on H100 80GB (700 W). Step time = "
          "16 x 2^20 tokens x the PaLM count (6 N + 12 L H Q T per token) / (TFLOP/s x GPUs)")
MODEL = _llama(126, 16384, 128, 53248, 128256, 8192, kv_heads=8, name="Llama 3 405B")


def runs() -> list:
    out = []
    for gpus, cp, seq, tflops in ((8192, 1, 8192, 430), (16384, 1, 8192, 400),
                                  (16384, 16, 131072, 380)):
        model = replace(MODEL, seq=seq)
        tokens = 16 * 2**20
        dp = gpus // (8 * 16 * cp)
        axes = dict(fsdp=dp, tp=8, pp=16, cp=cp, microbatch=1, global_batch=tokens // seq,
                    sequence_parallel=True, gradient_sync="microbatch")
        step = tokens * model.flops_per_token() / (tflops * 1e12 * gpus)
        out.append(Run(f"Llama 3 405B, {gpus:,} x H100, CP {cp}", model, axes, "H100",
                       "bf16", step, SOURCE, f"{tflops} TFLOP/s per GPU", framework="pytorch",
                       missing="the FLOP count behind TFLOP/s (entered as the PaLM count), the "
                               "micro-batch and recomputation, the exact tokens a batch",
                       notes="126 layers over 16 stages: Meta's trainer splits them unevenly; "
                             "its FSDP shards the gradients (section 3.3.2: 'Our use of FSDP "
                             "for Llama 3 shards optimizer states and gradients'), entered as "
                             "gradient_sync='microbatch'"))
    return out
