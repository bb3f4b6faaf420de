"""MaxText on TPU v5e, one to 32 slices of 256 chips over DCN (framework ``"xla"``)."""
from __future__ import annotations

from ..layout import Layout
from ..published import Run, _maxtext_model

SOURCE = ("AI-Hypercomputer/maxtext, MaxText/configs/v5e/README.md at commit 76bd53b0f "
          "(2023-12-15), TFLOP/sec/chip of the 16B, 32B, 64B and 128B models on 1x, 4x and "
          "32x v5e-256, with MaxText/configs/v5e/{16b,32b,64b,128b}.sh and configs/base.yml "
          "at that commit: per_device_batch_size 6, 4, 2, 1; remat_policy full; "
          "max_target_length 2048; attention 'flash'; ICI FSDP over the 256 chips of a "
          "slice (128b: ici_fsdp_parallelism 16 x ici_tensor_parallelism 16), data "
          "parallelism over the slices (dcn_data_parallelism -1). The models are "
          "global_parameter_scale over base.yml's base model (pyconfig.get_individual_scales: "
          "scale 16 doubles the heads and MLP twice, the embedding and the layers once). "
          "TFLOP/s counted as train.py's calculate_training_tflops at that commit: "
          "6 N T + 6 L H Q T^2 per sequence, N every parameter")
# scale -> per-device batch, ICI tensor parallelism (MaxText/configs/v5e/*.sh at 76bd53b0f)
CONFIGS = {16: (6, 1), 32: (4, 1), 64: (2, 1), 128: (1, 16)}
# README.md at 76bd53b0f: slices -> TFLOP/s per chip for 16B, 32B, 64B, 128B
TFLOPS = {1: (120, 132, 118, 110), 4: (117, 126, 110, 108), 32: (108, 119, 99, 91)}


def runs() -> list:
    out = []
    for slices, rates in TFLOPS.items():
        for (scale, (per_device, tp)), tflops in zip(CONFIGS.items(), rates):
            model, chips = _maxtext_model(scale), 256 * slices
            layout = Layout(dp=slices, fsdp=256 // tp, tp=tp, global_batch=per_device * chips,
                            microbatch=per_device * tp, sequence_parallel=tp > 1,
                            recompute="full")
            T, m = model.seq, model
            flops = (6 * m.params * T + 6 * m.layers * m.heads * m.head_dim * T * T) * per_device
            out.append(Run(f"MaxText {scale}B, {slices}x v5e-256", model, layout, "TPU v5e",
                           "bf16", flops / (tflops * 1e12), SOURCE,
                           f"{tflops} TFLOP/s/chip; step = (6 N T + 6 L H Q T^2) x "
                           f"{per_device} sequences / {tflops}e12", slices=slices))
    return out
