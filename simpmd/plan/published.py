"""Published, measured training runs with their configurations: what the planner is
checked against (``docs/validation.md``, ``tests/plan/test_plan_validation.py``).

No number here chose any parameter of the planner: the hardware presets' rates come
from their own cited sources (``simpmd.cost.HARDWARE[...].citations``), and each run is
only compared with. Each :class:`Run` says where its numbers are printed, down to the
commit or table, and how its measured step time follows from what is printed.

The runs of this module are the 22 the planner's mechanisms were developed against; the
runs of :mod:`simpmd.plan.runs` (one module per source; ``runs.every()`` gives all 92)
were added for issue 44, before any of them was predicted, and
:mod:`simpmd.plan.runs.split` draws every run into a development half and a held-out
half (``docs/validation.md``).
"""
from __future__ import annotations

from dataclasses import dataclass
import math

from .layout import Layout
from .model import Transformer


@dataclass(frozen=True)
class Run:
    """One measured run: the model and layout, the machine, and the step time measured
    (seconds), with its source and the arithmetic that gives the step time from what the
    source prints. ``flash``: attention as a fused kernel; ``slices``: TPU slices;
    ``framework``: what ran it (``"xla"``, ``"megatron"``, ``"pytorch"`` or
    ``"deepspeed"``, as issue 44 names them, whether or not ``plan.estimate`` takes the
    name yet). ``axes``: the layout, a :class:`Layout` or the keywords of one (a layout
    ``Layout`` cannot build yet, such as k-layer recomputation, stays as keywords).
    ``missing``: what the source does not print that the configuration needs (empty: the
    configuration is complete); ``notes``: what was assumed and why; ``peak_gib``: the
    memory per device the source prints, if it does; ``compile``: the step ran under
    ``torch.compile`` (``framework="pytorch"``), as the source says."""

    name: str
    model: Transformer
    axes: object
    hardware: str
    precision: str
    measured_s: float
    source: str
    quoted: str
    flash: bool = True
    slices: int = 1
    framework: str = "xla"
    missing: str = ""
    notes: str = ""
    peak_gib: float | None = None
    compile: bool = False

    @property
    def layout(self) -> Layout:
        """The :class:`Layout`; raises :class:`LayoutError` where ``Layout`` cannot hold
        what the run did."""
        return self.axes if isinstance(self.axes, Layout) else Layout(**self.axes)

    @property
    def chips(self) -> int:
        axes = self.axes if isinstance(self.axes, dict) else self.axes.shape
        return math.prod(axes.get(a, 1) for a in ("dp", "fsdp", "tp", "pp", "cp", "ep"))

    @property
    def complete(self) -> bool:
        return not self.missing


# -- Korthikanti et al. 2022, Selene (DGX A100 80GB), Megatron-LM -------------------------

KORTHIKANTI = ("V. Korthikanti et al., 'Reducing Activation Recomputation in Large Transformer "
               "Models', arXiv:2205.05198 (2022): Table 5 (iteration times, 'full recompute' "
               "and 'present work' = sequence parallelism + selective recomputation) for the "
               "configurations of Table 3, on NVIDIA Selene (DGX A100 80GB, InfiniBand HDR), "
               "fp16. Transcribed as calculon-ai/calculon (commit caa4b11) does in "
               "calculon/llm/validation.py (seqsel_tab5) and validation/seqsel/tab5/*.json")


# Dropout of the GPT runs: Megatron-LM's --attention-dropout and --hidden-dropout, 0.1 by
# default (megatron/arguments.py at f602ac5, 2022-05-09, the Megatron-LM of Korthikanti et
# al.'s runs, whose section 4.1 counts the dropout masks in the activations); NeMo's
# GPT3-175B sets both to 0.1 (NeMo-Framework-Launcher's conf/training/gpt3/175b.yaml at
# c99374bb), its LLaMA configurations 0.0 (conf/training/llama/*.yaml), MaxText's base.yml
# dropout_rate 0 (at 76bd53b0f).
GPT_DROPOUT = 0.1


def _gpt(layers, d_model, heads, vocab=51200, seq=2048, name=""):
    """A GPT-3-style model: GELU MLP of 4 d_model, tied embeddings, LayerNorm (costed as
    RMSNorm: the same passes over memory), dropout on the attention's probabilities and
    the blocks' outputs."""
    return Transformer(layers, d_model, heads, 4 * d_model, vocab, seq, tied_embeddings=True,
                       name=name, attention_dropout=GPT_DROPOUT, hidden_dropout=GPT_DROPOUT)


def _korthikanti():
    sizes = {"22B": (_gpt(48, 6144, 64, name="GPT 22B"), dict(tp=8, microbatch=4,
                                                              global_batch=4)),
             "175B": (_gpt(96, 12288, 96, name="GPT-3 175B"), dict(tp=8, pp=8, vp=3,
                                                                  global_batch=64)),
             "530B": (_gpt(105, 20480, 128, name="MT-NLG 530B"), dict(tp=8, pp=35, vp=3,
                                                                     global_batch=280)),
             "1T": (_gpt(128, 25600, 160, name="GPT 1T"), dict(tp=8, pp=64, global_batch=512))}
    times = {"22B": (1.42, 1.10), "175B": (18.13, 13.75), "530B": (49.05, 37.83),
             "1T": (94.42, 71.49)}
    runs = []
    for size, (model, axes) in sizes.items():
        full, present = times[size]
        runs.append(Run(f"{size}, full recompute", model,
                        Layout(recompute="full", **axes), "A100", "fp16", full, KORTHIKANTI,
                        f"{full} s per iteration", flash=False, framework="megatron"))
        runs.append(Run(f"{size}, selective + sequence parallel", model,
                        Layout(recompute="selective", sequence_parallel=True, **axes), "A100",
                        "fp16", present, KORTHIKANTI, f"{present} s per iteration",
                        flash=False, framework="megatron"))
    return runs


# -- NVIDIA NeMo 24.07 on DGX H100, FP8 ---------------------------------------------------

NEMO = ("NVIDIA/NeMo, docs/source/performance/performance_summary.md at commit 8e3d65dcfe "
        "(2024-09-09, '24.07 perf numbers'): 'Pretraining', NeMo 24.07 container, DGX-H100, "
        "FP8, tokens/sec/GPU. Per-model settings not in the table (no activation "
        "recomputation, sequence parallelism with TP > 1, the distributed optimizer, flash "
        "attention, the vocabulary padded to a multiple of 128 x TP) are NVIDIA/NeMo-"
        "Framework-Launcher's launcher_scripts/conf/training/{llama,gpt3}/*.yaml at commit "
        "c99374bb (2024-08-06), and its FP8 examples (examples/training/{llama,gpt}/h100/"
        "*_fp8*.sh: optim.grad_sync_dtype=bf16)")


def _llama(layers, d_model, heads, d_ff, vocab, seq, kv_heads=None, name=""):
    return Transformer(layers, d_model, heads, d_ff, vocab, seq, kv_heads=kv_heads,
                       gated_mlp=True, name=name)


def _nemo():
    rows = [  # name, model, gpus, gbs, tp, pp, cp, vp, tokens/s/GPU
        ("GPT3-175B", _gpt(96, 12288, 96, vocab=50688, name="GPT-3 175B"), 128, 256, 4, 8,
         1, 6, 716),
        ("LLAMA2-7B", _llama(32, 4096, 32, 11008, 32000, 4096, name="LLaMA 2-7B"), 8, 128,
         1, 1, 1, 1, 16934),
        ("LLAMA2-13B", _llama(40, 5120, 40, 13824, 32000, 4096, name="LLaMA 2-13B"), 16, 128,
         1, 4, 1, 10, 8715),
        ("LLAMA2-70B", _llama(80, 8192, 64, 28672, 32000, 4096, kv_heads=8,
                              name="LLaMA 2-70B"), 64, 128, 4, 4, 1, 20, 1728),
        ("LLAMA3-8B", _llama(32, 4096, 32, 14336, 128256, 8192, kv_heads=8,
                             name="LLaMA 3-8B"), 8, 128, 1, 1, 2, 1, 12273),
        ("LLAMA3-70B", _llama(80, 8192, 64, 28672, 128256, 8192, kv_heads=8,
                              name="LLaMA 3-70B"), 64, 128, 4, 4, 2, 5, 1524),
    ]
    runs = []
    for name, model, gpus, gbs, tp, pp, cp, vp, rate in rows:
        dp = gpus // (tp * pp * cp)
        # NeMo's optimizer is Apex's DistributedFusedAdam (optim.name distributed_fused_adam,
        # megatron_amp_O2, bf16: conf/training/*/*.yaml at c99374bb); with bf16 weights and
        # float32 state NeMo sets store_param_remainders (MegatronBaseModel.
        # setup_optimization, nemo/collections/nlp/models/language_modeling/
        # megatron_base_model.py at NVIDIA/NeMo 8e3d65dcfe); the launcher's FP8 examples
        # (examples/training/{llama,gpt}/h100/*_fp8*.sh at c99374bb) add
        # optim.grad_sync_dtype=bf16: gradients held and reduced in bf16.
        layout = Layout(dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, global_batch=gbs,
                        sequence_parallel=tp > 1, distributed_optimizer=True,
                        master_weights="remainders", grad_reduce_in_fp32=False)
        step = gbs * model.seq / (rate * gpus)
        runs.append(Run(f"{name}, {gpus} GPUs", model, layout, "H100", "fp8", step, NEMO,
                        f"{rate:,} tokens/s/GPU: {gbs} x {model.seq} / ({rate} x {gpus})",
                        framework="megatron"))
    return runs


# -- MaxText on TPU v5p ------------------------------------------------------------------

MAXTEXT = ("AI-Hypercomputer/maxtext, MaxText/configs/v5p/README.md at commit 76bd53b0f "
           "(2023-12-15), TFLOP/sec/chip of the 1x-slice rows, with the configurations of "
           "MaxText/configs/v5p/{32b,...,1024b}.sh and MaxText/configs/base.yml at that "
           "commit (global_parameter_scale over base_emb_dim 2560, 8 heads of 256, MLP "
           "8192 with ReLU, 16 layers, vocabulary 32,768, logits via the embedding; "
           "pyconfig.get_individual_scales). v5p-N has N/2 chips. The TFLOP/s count is "
           "train.py's calculate_training_tflops at that commit: 6 N T + 6 L H Q T^2 "
           "(causal attention) per sequence, N every parameter. base.yml's "
           "logical_axis_rules shard 'activation_embed' over 'tensor': the residual stream "
           "is split over tp between blocks, with Megatron's sequence parallelism's memory "
           "and traffic (split along the model dimension instead of the tokens); "
           "remat_policy 'minimal' keeps the matmuls' results: 'selective' here")
# global_parameter_scale -> (emb, heads, mlp, layers) multipliers, pyconfig at 76bd53b0f
# (get_individual_scales; 16 is the v5e 16B's)
_SCALES = {16: (2, 4, 4, 2),
           32: (4, 4, 4, 2), 64: (4, 4, 4, 4), 128: (4, 8, 8, 4), 256: (8, 8, 8, 4),
           512: (8, 8, 8, 8), 1024: (8, 16, 16, 8)}


def _maxtext_model(scale):
    e, h, f, n = _SCALES[scale]
    return Transformer(16 * n, 2560 * e, 8 * h, 8192 * f, 32768, 2048, head_dim=256,
                       tied_embeddings=True, activation="relu", name=f"MaxText {scale}B")


def _maxtext():
    rows = [  # scale, v5p-N, tp, per-device batch, remat, TFLOP/s/chip
        (32, 128, 4, 8, "minimal", 328), (64, 128, 4, 4, "minimal", 323),
        (128, 256, 8, 2, "minimal", 315), (128, 512, 8, 2, "minimal", 316),
        (256, 1024, 8, 2, "minimal", 308), (512, 1024, 16, 2, "full", 294),
        (1024, 2048, 16, 2, "full", 254), (1024, 4096, 16, 2, "full", 297)]
    runs = []
    for scale, cores, tp, per_device, remat, tflops in rows:
        model, chips = _maxtext_model(scale), cores // 2
        fsdp = chips // tp
        layout = Layout(fsdp=fsdp, tp=tp, global_batch=per_device * chips,
                        microbatch=per_device * tp, sequence_parallel=True,
                        recompute="full" if remat == "full" else "selective")
        T, m = model.seq, model
        flops = (6 * m.params * T + 6 * m.layers * m.heads * m.head_dim * T * T) * per_device
        runs.append(Run(f"{scale}B, v5p-{cores}", model, layout, "TPU v5p", "bf16",
                        flops / (tflops * 1e12), MAXTEXT,
                        f"{tflops} TFLOP/s/chip, remat_policy={remat}"))
    return runs


def runs() -> list:
    """The 22 runs the planner's mechanisms were developed against (before issue 44);
    :func:`simpmd.plan.runs.every` adds the runs added for it."""
    return _korthikanti() + _nemo() + _maxtext()
