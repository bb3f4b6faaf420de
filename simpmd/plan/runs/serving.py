"""Published, measured inference runs with their configurations: what ``plan.serve`` is
checked against (``docs/validation.md``, "Serving"; ``tests/plan/test_plan_serve.py``).

The source is NVIDIA's TensorRT-LLM performance page, ``docs/source/performance.md`` of
github.com/NVIDIA/TensorRT-LLM as stored at commit 138f96d45f90b9667426f7c47297d8c06bafac73
(its text: "This data has been updated for v0.6.1, unless specified", December 2023; the
"Low Latency" tables "from TensorRT-LLM v0.5"). Every run is ``gptSessionBenchmark``:
static batching, one batch of ``batch`` sequences of ``Input Length`` prompt tokens each
generating ``Output Length`` tokens, engines built with ``--enable_context_fmha``
(fused attention) and, on H100, ``--enable_fp8 --fp8_kv_cache`` (FP8 weights and
activations, an FP8 cache); on A100 float16 throughout. The page's build commands give the
models: Llama 2 7B (32 layers, d_model 4096, 32 heads, d_ff 11008, vocabulary 32000) and
Llama 2 70B (80 layers, 8192, 64 heads, 8 key/value heads, d_ff 28672, vocabulary 32000).

Two kinds of row:

* "Peak Throughput" tables: output tokens per second per GPU ("out tok/s/GPU" on H100;
  on A100 the column reads "out tok/s" under the same caption; read here as per GPU, as
  the H100 table of the same version says, which is a reading: see ``notes``). The
  measured quantity compared is the batch's whole time, ``batch * output / (rate * TP)``
  seconds;
* "Low Latency" tables: the first token's latency at batch 1 (the page measures it as a
  run generating one token), compared with ``ttft_s``.

The two kinds are from two releases: the throughput tables v0.6.1's, the "Low Latency"
tables v0.5's (the page's footnote). A v0.5 row is costed on its GPU's preset with the HBM
fraction v0.5's engines streamed at batch 1 (:func:`v05_memory_efficiency`, from NVIDIA's
blog on that release: GPT-J 6B's batch-1 tokens per second), a v0.6.1 row on the preset.

Falcon 180B and GPT-J 6B, on the same page, are left out: their blocks run attention and
the MLP side by side (a parallel block), which ``plan.Transformer`` does not describe.

The development / held-out split is drawn once by :func:`draw` with :data:`SEED` (the
protocol of :mod:`simpmd.plan.runs.split`, stratified by framework x chip generation x
parallelism x kind of row), committed below before ``plan.serve`` predicted these runs.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
import math

import numpy as np

from ...cost.hardware import hardware_preset
from ..families import family
from ..layout import Layout
from ..model import Transformer
from ..serve import _dtype, serve, weight_specs

SOURCE = ("NVIDIA TensorRT-LLM, docs/source/performance.md at commit 138f96d4 (github.com/"
          "NVIDIA/TensorRT-LLM; 'updated for v0.6.1', Dec 2023; low-latency rows from v0.5)")
SEED = 20261203

LLAMA2_7B = Transformer(layers=32, d_model=4096, heads=32, d_ff=11008, vocab=32000,
                        seq=4096, gated_mlp=True, name="Llama 2 7B")
LLAMA2_70B = Transformer(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                         vocab=32000, seq=4096, gated_mlp=True, name="Llama 2 70B")


@dataclass(frozen=True)
class ServingRun:
    """One measured serving run: the model, ``tp`` chips, the request, the precision (and
    the cache's type), what was measured (``metric``: ``"throughput"``, output tokens/s
    per GPU, or ``"ttft"``, seconds) and where it is printed."""

    name: str
    model: Transformer
    tp: int
    hardware: str
    precision: str
    kv_dtype: str
    batch: int
    prompt_len: int
    gen_len: int
    metric: str
    measured: float
    table: str
    source: str = SOURCE
    framework: str = "tensorrt-llm"
    notes: str = ""
    # The Llama engines are built without --paged_kv_cache (the page's build commands), and
    # TensorRT-LLM's grouped-query decode kernel (XQA) takes only a paged cache
    # (docs/source/gpt_attention.md, "XQA Optimization", support matrix: "Paged KV cache
    # (64 / 128 tokens per block)"; the section is absent from the v0.5 text): decode ran
    # the masked multi-head attention kernel, "a single CUDA thread-block per head" (the
    # same page, "Generation Phase"), each query head reading its key/value head's cache.
    grouped_kernel: bool = False
    # The release measured: "v0.5" (the "Low Latency" tables) streams HBM at the fraction
    # v05_memory_efficiency gives; "v0.6.1" (the "Peak Throughput" tables) at the preset's.
    release: str = "v0.6.1"

    @property
    def chip(self):
        """The hardware preset the run is costed on: for v0.5, at that release's HBM fraction."""
        hw = hardware_preset(self.hardware)
        if self.release == "v0.5":
            return replace(hw, memory_efficiency=v05_memory_efficiency(self.hardware))
        return hw

    def serve(self):
        """``plan.serve`` of this run's configuration."""
        return serve(self.model, self.layout, hardware=self.chip, batch=self.batch,
                     prompt_len=self.prompt_len, gen_len=self.gen_len,
                     precision=self.precision, kv_dtype=self.kv_dtype,
                     grouped_kernel=self.grouped_kernel, check_memory=False)

    @property
    def layout(self) -> Layout:
        return Layout(tp=self.tp)

    @property
    def axes(self) -> dict:
        return {"tp": self.tp}

    @property
    def chips(self) -> int:
        return self.tp

    @property
    def measured_s(self) -> float:
        """The seconds compared: the first token's latency, or the static batch's whole
        time, ``batch * gen_len / (tokens/s per GPU * GPUs)``."""
        if self.metric == "ttft":
            return self.measured
        return self.batch * self.gen_len / (self.measured * self.chips)

    def predicted_s(self, estimate) -> float:
        return estimate.ttft_s if self.metric == "ttft" else estimate.total_s


A100_PER_GPU = ("the A100 table's column reads 'Throughput (out tok/s)', the H100 table's "
                "'(out tok/s/GPU)'; read as per GPU")

# (model, batch, tp, input, output, tokens/s per GPU): "Peak Throughput" tables.
_H100 = ((LLAMA2_7B, 768, 1, 128, 128, 19694), (LLAMA2_7B, 112, 1, 128, 2048, 6818),
         (LLAMA2_7B, 80, 1, 2048, 128, 2244), (LLAMA2_7B, 48, 1, 2048, 2048, 2740),
         (LLAMA2_70B, 1024, 2, 128, 128, 2657), (LLAMA2_70B, 480, 4, 128, 2048, 1486),
         (LLAMA2_70B, 96, 2, 2048, 128, 306), (LLAMA2_70B, 64, 2, 2048, 2048, 547))
_A100 = ((LLAMA2_7B, 384, 1, 128, 128, 5586), (LLAMA2_7B, 60, 1, 128, 2048, 1928),
         (LLAMA2_7B, 52, 1, 2048, 128, 591), (LLAMA2_7B, 64, 2, 2048, 2048, 782),
         (LLAMA2_70B, 1280, 4, 128, 128, 670), (LLAMA2_70B, 240, 4, 128, 2048, 525),
         (LLAMA2_70B, 120, 4, 2048, 128, 79))
# (model, tp, input, first-token ms): "Low Latency" tables, batch 1.
_TTFT_H100 = ((LLAMA2_7B, 1, 128, 7), (LLAMA2_7B, 1, 2048, 36), (LLAMA2_70B, 4, 128, 26),
              (LLAMA2_70B, 4, 2048, 109))
_TTFT_A100 = ((LLAMA2_7B, 1, 128, 16), (LLAMA2_7B, 1, 2048, 133), (LLAMA2_70B, 4, 128, 47),
              (LLAMA2_70B, 4, 2048, 377))

_GPU = {"H100": ("fp8", "fp8", "FP8"), "A100": ("fp16", "fp16", "FP16")}

# The "Low Latency" rows are TensorRT-LLM v0.5's, the "Peak Throughput" rows v0.6.1's. What
# v0.5's engines streamed from HBM at batch 1 is measured by the same vendor in the same
# release on the same GPUs: NVIDIA's blog "H100 has 4.6x A100 Performance in TensorRT-LLM"
# (docs/source/blogs/H100vsA100.md of NVIDIA/TensorRT-LLM at commit 15ed7809, "H100 FP8,
# A100 FP16, SXM 80GB GPUs, ... TP1, ... BS=1 1st token latency. TensorRT-LLM v0.5.0,
# TensorRT 9.1"), table "Max Throughput & Min Latency": GPT-J 6B at batch 1, 128 tokens in,
# 185 output tokens/s on H100 and 111 on A100. GPT-J is no validation run (its block is
# parallel), and its batch-1 rate is printed on the blog only.
GPTJ_6B = Transformer(layers=28, d_model=4096, heads=16, d_ff=16384, vocab=50400, seq=2048,
                      gated_mlp=False, name="GPT-J 6B")
V05_BATCH1_TOKENS_PER_S = {"H100": 185.0, "A100": 111.0}
V05_SOURCE = ("NVIDIA/TensorRT-LLM docs/source/blogs/H100vsA100.md at 15ed7809 (TensorRT-LLM "
              "v0.5.0, TensorRT 9.1): GPT-J 6B, batch 1, 128 in, 185 out tok/s on H100 FP8, "
              "111 on A100 FP16")


def v05_memory_efficiency(hardware: str) -> float:
    """The fraction of the HBM peak TensorRT-LLM v0.5's engines streamed at batch 1 on
    ``hardware``: the weights a decode step of GPT-J 6B reads (every matrix and norm, in the
    page's precision as ``plan.serve`` lays them out, but the embedding table, of which a
    step looks up one row) once per token at the blog's batch-1 rate, over
    ``hbm_bandwidth``. The rate counts the first token's prefill too, so the time per token
    is at most 1 / rate and the fraction at least this."""
    precision = _GPU[hardware][0]
    read = sum(math.prod(shape) * np.dtype(_dtype(dtype)).itemsize for name, (shape, dtype, _)
               in weight_specs(GPTJ_6B, Layout(), precision).items() if name != "embed")
    return read * V05_BATCH1_TOKENS_PER_S[hardware] / hardware_preset(hardware).hbm_bandwidth


def runs() -> list:
    out = []
    for hw, rows in (("H100", _H100), ("A100", _A100)):
        precision, cache, label = _GPU[hw]
        for model, batch, tp, isl, osl, rate in rows:
            out.append(ServingRun(
                f"{model.name}, {tp} x {hw} {label}, batch {batch}, {isl}/{osl}", model, tp,
                hw, precision, cache, batch, isl, osl, "throughput", float(rate),
                f"'Peak Throughput', '{hw} GPUs ({label})' table",
                notes=A100_PER_GPU if hw == "A100" else ""))
    for hw, rows in (("H100", _TTFT_H100), ("A100", _TTFT_A100)):
        precision, cache, label = _GPU[hw]
        for model, tp, isl, ms in rows:
            out.append(ServingRun(
                f"{model.name}, {tp} x {hw} {label}, first token, {isl} in", model, tp, hw,
                precision, cache, 1, isl, 1, "ttft", ms / 1e3,
                f"'Low Latency', '{hw} GPUs ({label})' table (v0.5), '1st Token Latency (ms)'",
                release="v0.5"))
    return out


def stratum(run) -> str:
    """framework | chip generation | parallelism | kind of row."""
    return f"{family(run.framework, run.hardware, run.axes)} | {run.metric}"


def draw(rows, seed: int = SEED) -> tuple:
    """(development names, held-out names), each sorted: within each stratum, in sorted
    order of strata, the names permuted by ``numpy.random.default_rng(seed)`` and the
    first half to development (an odd stratum's extra run to either half by the same
    generator's coin), as :func:`simpmd.plan.runs.split.draw` does."""
    rng = np.random.default_rng(seed)
    by = defaultdict(list)
    for run in rows:
        by[stratum(run)].append(run.name)
    development, held_out = [], []
    for key in sorted(by):
        names = sorted(by[key])
        order = [names[i] for i in rng.permutation(len(names))]
        half = len(names) // 2 + (int(rng.integers(2)) if len(names) % 2 else 0)
        development += order[:half]
        held_out += order[half:]
    return tuple(sorted(development)), tuple(sorted(held_out))


def development() -> list:
    return [r for r in runs() if r.name in DEVELOPMENT]


def held_out() -> list:
    return [r for r in runs() if r.name in HELD_OUT]


# The draw at SEED over the 23 runs of runs() (2026-12-02), committed before plan.serve
# predicted any of them.
DEVELOPMENT = (
    'Llama 2 70B, 2 x H100 FP8, batch 1024, 128/128',
    'Llama 2 70B, 2 x H100 FP8, batch 96, 2048/128',
    'Llama 2 70B, 4 x A100 FP16, batch 120, 2048/128',
    'Llama 2 70B, 4 x A100 FP16, batch 240, 128/2048',
    'Llama 2 70B, 4 x A100 FP16, first token, 2048 in',
    'Llama 2 70B, 4 x H100 FP8, first token, 128 in',
    'Llama 2 7B, 1 x A100 FP16, batch 52, 2048/128',
    'Llama 2 7B, 1 x A100 FP16, batch 60, 128/2048',
    'Llama 2 7B, 1 x A100 FP16, first token, 128 in',
    'Llama 2 7B, 1 x H100 FP8, batch 112, 128/2048',
    'Llama 2 7B, 1 x H100 FP8, batch 80, 2048/128',
    'Llama 2 7B, 1 x H100 FP8, first token, 128 in',
)
HELD_OUT = (
    'Llama 2 70B, 2 x H100 FP8, batch 64, 2048/2048',
    'Llama 2 70B, 4 x A100 FP16, batch 1280, 128/128',
    'Llama 2 70B, 4 x A100 FP16, first token, 128 in',
    'Llama 2 70B, 4 x H100 FP8, batch 480, 128/2048',
    'Llama 2 70B, 4 x H100 FP8, first token, 2048 in',
    'Llama 2 7B, 1 x A100 FP16, batch 384, 128/128',
    'Llama 2 7B, 1 x A100 FP16, first token, 2048 in',
    'Llama 2 7B, 1 x H100 FP8, batch 48, 2048/2048',
    'Llama 2 7B, 1 x H100 FP8, batch 768, 128/128',
    'Llama 2 7B, 1 x H100 FP8, first token, 2048 in',
    'Llama 2 7B, 2 x A100 FP16, batch 64, 2048/2048',
)
