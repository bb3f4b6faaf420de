"""MaxText on TPU v4 (one to eight slices over DCN) and on A3 VMs of 8 H100 (framework
``"xla"``)."""
from __future__ import annotations

from ..layout import Layout
from ..model import Transformer
from ..published import Run, _llama

V4 = ("AI-Hypercomputer/maxtext, MaxText/configs/v4/README.md at commit 76bd53b0f "
      "(2023-12-15), TFLOP/sec/chip of the 22B (1x to 8x v4-128) and 52B (1x and 2x v4-384) "
      "rows, with MaxText/configs/v4/{22b,52b}.sh at that commit: 22B = 48 layers of 6,144, "
      "24 heads (of base.yml's 256), MLP 24,576, ici_fsdp_parallelism 64, "
      "per_device_batch_size 16; 52B = 32 layers of 12,288, 32 heads of 256, MLP 49,152, "
      "ici_fsdp_parallelism 192, per_device_batch_size 10; both remat_policy full, "
      "base.yml's ReLU MLP, vocabulary 32,768, logits via the embedding, sequences of 2,048, "
      "data parallelism over the slices. A v4-N slice has N/2 chips (megacore: one device "
      "a chip). TFLOP/s as train.py counts them at that commit: 6 N T + 6 L H Q T^2 per "
      "sequence, N every parameter")
A3 = ("AI-Hypercomputer/maxtext, MaxText/configs/a3/llama_2_7b/README.md at commit efb6d9e4a "
      "(2024-04-09), TFLOP/sec/chip on 1x to 16x A3 (8 H100 80GB a VM), with "
      "MaxText/configs/a3/llama_2_7b/{1,2,4,8,16}vm.sh at that commit: model_name llama2-7b "
      "(configs/models/llama2-7b.yml: 32 layers of 4,096, 32 heads of 128, SwiGLU MLP "
      "11,008, vocabulary 32,000, untied logits), ici_fsdp_parallelism 8 within a VM, "
      "dcn_data_parallelism over the VMs, per_device_batch_size 4, max_target_length 4096, "
      "attention cudnn_flash_te, remat_policy minimal_flash (keeps the matmuls: "
      "recompute='selective'), bf16. TFLOP/s as maxtext_utils.calculate_tflops_training_"
      "per_device counts them at that commit: 6 N T + 6 L H Q T^2 per sequence")
# The README names the VM 'A3 (h100-80gb-8)', xpk's device type for a3-highgpu-8g (the
# A3 High): its network between VMs is Google's GPUDirect-TCPX at 1,000 Gbps a VM, not a
# DGX H100's 8 x 400 Gb/s InfiniBand (simpmd.cost.hardware's 'H100 A3 High' cites both)
A3_VM = ("entered on the 'H100 A3 High' preset: the README's 'A3 (h100-80gb-8)' is xpk's device "
         "type for a3-highgpu-8g, whose VMs talk over GPUDirect-TCPX at 1,000 Gbps a VM "
         "(Google Cloud, 'Networking and GPU machines'), 15.6 GB/s per GPU, where the 'H100' "
         "preset's DGX H100 has 50 GB/s")


def _tflop_step(model, per_device, tflops):
    T, m = model.seq, model
    return (6 * m.params * T + 6 * m.layers * m.heads * m.head_dim * T * T) * per_device / (
        tflops * 1e12)


def _v4() -> list:
    b22 = Transformer(48, 6144, 24, 24576, 32768, 2048, head_dim=256, tied_embeddings=True,
                      activation="relu", name="MaxText 22B")
    b52 = Transformer(32, 12288, 32, 49152, 32768, 2048, head_dim=256, tied_embeddings=True,
                      activation="relu", name="MaxText 52B")
    rows = [(b22, 64, 16, {1: 156, 2: 152, 4: 149, 8: 146}),
            (b52, 192, 10, {1: 154, 2: 162})]
    out = []
    for model, chips, per_device, rates in rows:
        for slices, tflops in rates.items():
            layout = Layout(dp=slices, fsdp=chips, microbatch=per_device,
                            global_batch=per_device * chips * slices, recompute="full")
            out.append(Run(f"{model.name}, {slices}x v4-{2 * chips}", model, layout, "TPU v4",
                           "bf16", _tflop_step(model, per_device, tflops), V4,
                           f"{tflops} TFLOP/s/chip; step = (6 N T + 6 L H Q T^2) x "
                           f"{per_device} / {tflops}e12", slices=slices))
    return out


def _a3() -> list:
    model = _llama(32, 4096, 32, 11008, 32000, 4096, name="Llama 2 7B")
    out = []
    for vms, tflops in ((1, 492), (2, 422), (4, 407), (8, 409), (16, 375)):
        layout = Layout(dp=vms, fsdp=8, microbatch=4, global_batch=4 * 8 * vms,
                        recompute="selective")
        out.append(Run(f"MaxText Llama 2 7B, {8 * vms} x H100 (A3)", model, layout,
                       "H100 A3 High", "bf16", _tflop_step(model, 4, tflops), A3,
                       f"{tflops} TFLOP/s/chip; step = (6 N T + 6 L H Q T^2) x 4 / {tflops}e12",
                       notes=A3_VM))
    return out


def runs() -> list:
    return _v4() + _a3()
