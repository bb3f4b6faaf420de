"""Megatron-DeepSpeed runs on A100 80 GB: MT-NLG 530B and BLOOM 176B, Megatron's tensor
parallelism inside DeepSpeed's pipeline engine (framework ``"deepspeed"``)."""
from __future__ import annotations

from ..model import Transformer
from ..published import GPT_DROPOUT, Run, _gpt

MTNLG = ("S. Smith et al., 'Using DeepSpeed and Megatron to Train Megatron-Turing NLG 530B', "
         "arXiv:2201.11990 (2022), section 2.4, as cli99/llm-analysis transcribes it "
         "(examples/megatron-turing-nlg/README.md at commit eb2d5c035c, run_train.sh at "
         "b60b392f74): global batch 1,920 sequences of 2,048 on 280, 350 and 420 DGX A100 "
         "servers, 60.1, 50.2 and 44.4 s per iteration (126, 121, 113 TFLOP/s per GPU); "
         "8-way tensor and 35-way pipeline parallelism, activation checkpointing; 105 "
         "layers of 20,480 with 128 heads, vocabulary 50,272")
BLOOM = ("bigscience-workshop/bigscience, train/tr11-176B-ml/tr11-176B-ml.slurm at commit "
         "003b25057e: 48 nodes of 8 A100 80GB, TP_SIZE 4, PP_SIZE 12, MICRO_BATCH_SIZE 2, "
         "GLOBAL_BATCH_SIZE 2048, 70 layers of 14,336 with 112 heads, sequences of 2,048, "
         "vocabulary padded to 250,880, bf16, --checkpoint-activations, ZeRO stage 0 with "
         "the bf16 optimizer (its own stage-1 equivalent), --pp-partition-method "
         "'type:transformer|embedding' (the embeddings count as pipeline layers); throughput "
         "'about 150 TFLOPs' per GPU (BigScience's model page, "
         "bigscience.notion.site/BigScience-176B-Model-ad073ca07cdf479398d5f95d88e218c4). "
         "Step time = Megatron-DeepSpeed's FLOP count with recomputation, 96 B s l h^2 "
         "(1 + s / 6h + V / (16 l h)), over 150e12 x 384")


def _mtnlg() -> list:
    model = Transformer(105, 20480, 128, 4 * 20480, 50272, 2048, tied_embeddings=True,
                        name="MT-NLG 530B", attention_dropout=GPT_DROPOUT,
                        hidden_dropout=GPT_DROPOUT)
    out = []
    for nodes, seconds, tflops in ((280, 60.1, 126), (350, 50.2, 121), (420, 44.4, 113)):
        gpus = 8 * nodes
        axes = dict(dp=gpus // 280, tp=8, pp=35, microbatch=1, global_batch=1920,
                    recompute="full")
        out.append(Run(f"MT-NLG 530B, {gpus} x A100", model, axes, "A100", "bf16", seconds,
                       MTNLG, f"{seconds} s per iteration ({tflops} TFLOP/s per GPU)",
                       flash=False, framework="deepspeed",
                       missing="the micro-batch size (entered as 1, Korthikanti et al.'s "
                               "for the same model on the same machine)",
                       notes="dropout 0.1 as Megatron-LM's GPT default"))
    return out


def _bloom() -> list:
    model = _gpt(70, 14336, 112, vocab=250880, name="BLOOM 176B")
    B, s, l, h, V = 2048, 2048, 70, 14336, 250880
    flops = 96 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))
    axes = dict(dp=8, tp=4, pp=12, microbatch=2, global_batch=2048, recompute="full",
                distributed_optimizer=True)
    return [Run("BLOOM 176B, 384 x A100", model, axes, "A100", "bf16", flops / (150e12 * 384),
                BLOOM, "about 150 TFLOP/s per GPU", flash=False, framework="deepspeed",
                notes="the throughput is printed as 'about 150'; the 70 layers split over 12 "
                      "stages with the embeddings counted as layers")]


def runs() -> list:
    return _mtnlg() + _bloom()
