"""MosaicML llm-foundry's MPT benchmarks: Composer's FSDP (FULL_SHARD) on A100 40 GB,
A100 80 GB and H100 (framework ``"pytorch"``)."""
from __future__ import annotations

from ..model import Transformer
from ..published import Run

SOURCE = ("mosaicml/llm-foundry, scripts/train/benchmarking/README.md at commit 061f2c7ce6 "
          "('H100 80GB BF16', 'H100 80GB FP8', 'A100 80GB with 1600 Gbps node-node "
          "interconnect (RoCE)', 'A100 40GB ...' tables): Composer with PyTorch FSDP, "
          "Sharding Strategy FULL_SHARD over every GPU, Activation Checkpointing as printed "
          "(True: each block recomputed), flash attention, Precision amp_bf16 / bf16 / "
          "amp_fp8 (Transformer Engine). Step time = GlobalBatchSize (T) / Throughput (T/s), "
          "both printed. The MPT models are scripts/train/yamls/pretrain/mpt-*.yaml: "
          "d_model and n_layers as there (the printed NumParams, 12 L d^2 + vocab x d "
          "within 0.3%, confirm them), heads of 128, a 4 d_model GELU MLP, vocabulary "
          "50,368, embeddings tied")
# name -> layers, d_model
MPT = {"1b": (24, 2048), "3b": (32, 2560), "7b": (32, 4096), "13b": (40, 5120),
       "30b": (48, 7168), "70b": (80, 8192)}
HARDWARE = {"h100_80gb": "H100", "a100_80gb": "A100", "a100_40gb": "A100 40GB"}
ROWS = [  # model, GPUs, GPU, micro-batch, global batch, T/s, global batch (T), AC, precision
    ("70b", 64, "h100_80gb", 8, 2048, 66523, 4194304, True, "bf16"),
    ("30b", 32, "h100_80gb", 14, 1344, 73860, 2752512, True, "bf16"),
    ("13b", 8, "h100_80gb", 2, 16, 38336, 32768, False, "bf16"),
    ("7b", 8, "h100_80gb", 6, 48, 85144, 98304, False, "bf16"),
    ("3b", 64, "h100_80gb", 6, 1152, 1441663, 2359296, False, "bf16"),
    ("1b", 8, "h100_80gb", 14, 112, 363645, 229376, False, "bf16"),
    ("3b", 8, "h100_80gb", 10, 480, 244692, 983040, False, "fp8"),
    ("70b", 64, "a100_80gb", 8, 2048, 26274, 4194304, True, "bf16"),
    ("30b", 8, "a100_80gb", 3, 504, 7330, 1032192, True, "bf16"),
    ("13b", 8, "a100_80gb", 2, 48, 18097, 98304, False, "bf16"),
    ("7b", 8, "a100_80gb", 6, 96, 37130, 196608, False, "bf16"),
    ("1b", 8, "a100_80gb", 14, 448, 164109, 917504, False, "bf16"),
    ("70b", 128, "a100_40gb", 4, 512, 48194, 1048576, True, "bf16"),
    ("30b", 128, "a100_40gb", 6, 768, 110803, 1572864, True, "bf16"),
    ("13b", 32, "a100_40gb", 14, 448, 63946, 917504, True, "bf16"),
    ("7b", 64, "a100_40gb", 18, 1152, 234614, 2359296, True, "bf16"),
    ("3b", 128, "a100_40gb", 6, 768, 1220885, 1572864, False, "bf16"),
]


def mpt(size: str) -> Transformer:
    layers, d = MPT[size]
    return Transformer(layers, d, d // 128, 4 * d, 50368, 2048, tied_embeddings=True,
                       name=f"MPT-{size.upper()}")


def runs() -> list:
    out = []
    for size, gpus, gpu, micro, batch, tps, tokens, ac, precision in ROWS:
        # The loss: the model's default loss_fn, fused_crossentropy (flash-attention's
        # cross-entropy kernel on the 16-bit logits; modeling_mpt.py at 061f2c7ce6, whose
        # benchmark yamls do not set loss_fn): simpmd.plan.loss.
        axes = dict(fsdp=gpus, microbatch=micro, global_batch=batch,
                    recompute="full" if ac else "none", loss="fused")
        out.append(Run(f"llm-foundry MPT-{size.upper()}, {gpus} x {HARDWARE[gpu]}, {precision}",
                       mpt(size), axes, HARDWARE[gpu], precision, tokens / tps, SOURCE,
                       f"{tps:,} tokens/s; step = {tokens:,} / {tps:,}", framework="pytorch",
                       notes="the heads (d_model / 128) are the yamls'; the benchmark's "
                             "NumParams grow by seq x d_model with the sequence, as a learned "
                             "position embedding would (left out: 0.03% of the FLOPs)"))
    return out
