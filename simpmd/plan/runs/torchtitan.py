"""torchtitan (PyTorch-native: FSDP2, tensor, pipeline and context parallelism,
torch.compile, float8) on A100 80 GB and on H100 96 GB (framework ``"pytorch"``)."""
from __future__ import annotations

from dataclasses import replace

from ..published import Run, _llama

A100_SOURCE = ("pytorch/torchtitan, docs/performance.md at commit 0413364349: 'Llama 3 "
               "performance numbers' and 'Llama 2 performance numbers', FSDP2 on 64 A100 "
               "(80GB), WPS (tokens per second per GPU) at local batch sizes 1 and 2 (global "
               "batch = local x 64). Step time = local batch x sequence / WPS; sequences "
               "8,192 (Llama 3) and 4,096 (Llama 2), as the page says. 'selective op' is "
               "torchtitan's per-operator checkpointing (saves the matmuls' outputs but "
               "every second one), 'selective layer' checkpoints every n-th block (n not "
               "printed; torchtitan's configurations give 2)")
H100_SOURCE = ("pytorch/torchtitan, benchmarks/llama3_h100_202412_torchtitan.md at commit "
               "31a17bfdb7 (torch 1963fc8, torchao eab345c, torchtitan 9dec370, 2024-12): "
               "Grand Teton hosts, 8 H100 with 96 GB HBM2e at 2.4 TB/s and a 500 W limit, "
               "400 Gb/s RDMA per GPU; TPS/GPU read at the 90th iteration; Memory (GiB) the "
               "maximum over the GPUs. Step time = tokens per GPU per step / TPS/GPU, the "
               "tokens per GPU being global batch x sequence / GPUs")
L3_8B = _llama(32, 4096, 32, 14336, 128256, 8192, kv_heads=8, name="Llama 3 8B")
L3_70B = _llama(80, 8192, 64, 28672, 128256, 8192, kv_heads=8, name="Llama 3 70B")
L3_405B = _llama(126, 16384, 128, 53248, 128256, 8192, kv_heads=8, name="Llama 3.1 405B")
L2_13B = _llama(40, 5120, 40, 13824, 32000, 4096, name="Llama 2 13B")
L2_70B = _llama(80, 8192, 64, 28672, 32000, 4096, kv_heads=8, name="Llama 2 70B")
AC = {"no": "none", "full": "full", "selective op": "selective",
      "selective layer": "every second block"}


def _a100() -> list:
    rows = [(L3_8B, 1, "selective layer", 2904), (L3_8B, 1, "selective op", 2973),
            (L3_70B, 1, "full", 331), (L2_13B, 2, "no", 2162), (L2_13B, 2, "selective op", 1904),
            (L2_70B, 1, "selective op", 355), (L2_70B, 2, "full", 353)]
    out = []
    for model, local, ac, wps in rows:
        axes = dict(fsdp=64, microbatch=local, global_batch=64 * local, recompute=AC[ac])
        out.append(Run(f"torchtitan {model.name}, 64 x A100, {ac} AC, batch {local}", model,
                       axes, "A100", "bf16", local * model.seq / wps, A100_SOURCE,
                       f"{wps:,} WPS; step = {local} x {model.seq} / {wps}",
                       framework="pytorch",
                       missing=("the block-checkpoint frequency (entered as every second "
                                "block)" if ac == "selective layer" else ""),
                       notes="'selective op' entered as recompute='selective', which is "
                             "not what the planner's 'selective' means (issue 44)"))
    return out


def _h100() -> list:
    rows = [  # name, model, axes, sequence, precision, TPS/GPU, GiB
        ("Table 1, FSDP", L3_8B, dict(fsdp=8, microbatch=2, recompute="selective"), 8192,
         "bf16", 5762, 82.4),
        ("Table 1, FSDP + compile + Float8", L3_8B,
         dict(fsdp=8, microbatch=2, recompute="selective"), 8192, "fp8", 8532, 76.8),
        ("Table 3, FSDP", L3_8B, dict(fsdp=128, microbatch=2, recompute="selective"), 8192,
         "bf16", 5605, 67.0),
        ("Table 3, FSDP + compile + Float8", L3_8B,
         dict(fsdp=128, microbatch=2, recompute="selective"), 8192, "fp8", 8380, 61.8),
        ("Table 2, FSDP 8, CP 1", L3_8B, dict(fsdp=8, microbatch=1, recompute="full"), 32768,
         "fp8", 3890, 83.9),
        ("Table 2, FSDP 4, CP 2", L3_8B, dict(fsdp=4, cp=2, microbatch=1, recompute="full"),
         65536, "fp8", 2540, 84.2),
        ("Table 4, 2D", L3_70B, dict(fsdp=32, tp=8, microbatch=16, recompute="full",
                                     sequence_parallel=True), 8192, "fp8", 829, 71.9),
        ("Table 5, interleaved 1F1B", L3_405B,
         dict(fsdp=8, tp=8, pp=8, microbatch=1, global_batch=256, recompute="full",
              sequence_parallel=True), 8192, "fp8", 128, 72.7),
    ]
    out = []
    for name, model, axes, seq, precision, tps, gib in rows:
        model = replace(model, seq=seq)
        axes.setdefault("global_batch", axes["fsdp"] * axes["microbatch"])
        # torchtitan 9dec370's loss_fn: F.cross_entropy(pred.flatten(0, 1).float(), ...),
        # the 16-bit logits deleted before the backward pass (train.py): simpmd.plan.loss.
        # (The A100 rows' commit, 0413364349, casts in the model and keeps pred through
        # the backward pass: not modelled, those rows keep the loss as written.)
        axes["loss"] = "log_softmax"
        gpus = axes["fsdp"] * axes.get("tp", 1) * axes.get("pp", 1) * axes.get("cp", 1)
        tokens = axes["global_batch"] * seq / gpus
        out.append(Run(f"torchtitan {model.name}, {gpus} x H100 96GB, {name}", model, axes,
                       "H100 96GB", precision, tokens / tps, H100_SOURCE,
                       f"{tps:,} TPS/GPU; step = {tokens:,.0f} / {tps}", framework="pytorch",
                       peak_gib=gib, compile=precision == "fp8",
                       missing=("the virtual stages of the interleaved schedule (not printed)"
                                if "interleaved" in name else ""),
                       notes="the sequence of Tables 1, 3, 4 and 5 is torchtitan's Llama 3 "
                             "default (seq_len 8192), not printed in the table; 'Float8' is "
                             "torchao's float8 on nn.Linear (tensorwise scaling), entered as "
                             "precision='fp8'; every Float8 row ran under torch.compile (Table 1's and 3's rows "
                             "say so, and the headers of Tables 2, 4 and 5)"))
    return out


def runs() -> list:
    return _a100() + _h100()
