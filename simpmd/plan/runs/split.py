"""The development half and the held-out half of the validation runs, drawn once by a
seeded generator before the planner predicted any run added for issue 44.

Mechanisms are chosen by the development half only; the held-out half is the headline
(``docs/validation.md``, which logs each time it was looked at). The draw is stratified
by family (:mod:`simpmd.plan.families`): within each family the runs are permuted by
``numpy.random.default_rng(SEED)``, taken family by family in sorted order, and the first
half goes to development (an odd family's extra run to either half by the same
generator's coin). ``tests/plan/test_plan_validation.py`` redraws it from ``SEED`` and checks
it is the one stored here. Runs added later are drawn by :func:`draw` among themselves,
with a seed of their own, and appended, so that no run already held out changes half.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from ..families import of_run

SEED = 20261202


def draw(runs, seed: int = SEED) -> tuple:
    """(development names, held-out names), each sorted, drawn from ``runs``."""
    rng = np.random.default_rng(seed)
    by_family = defaultdict(list)
    for run in runs:
        by_family[of_run(run)].append(run.name)
    development, held_out = [], []
    for key in sorted(by_family):
        names = sorted(by_family[key])
        order = [names[i] for i in rng.permutation(len(names))]
        half = len(names) // 2 + (int(rng.integers(2)) if len(names) % 2 else 0)
        development += order[:half]
        held_out += order[half:]
    return tuple(sorted(development)), tuple(sorted(held_out))


# The draw at SEED over the 92 runs of simpmd.plan.runs.every() at this commit
# (2026-12-02), before the planner predicted any run added for issue 44.
DEVELOPMENT = (
    '1024B, v5p-2048',
    '128B, v5p-512',
    '1T, full recompute',
    '1T, selective + sequence parallel',
    '22B, full recompute',
    '32B, v5p-128',
    '530B, full recompute',
    '64B, v5p-128',
    'GPT3-175B, 128 GPUs',
    'LLAMA2-13B, 16 GPUs',
    'LLAMA3-8B, 8 GPUs',
    'Llama 3 405B, 16,384 x H100, CP 1',
    'Llama 3 405B, 16,384 x H100, CP 16',
    'Llama 3 405B, 8,192 x H100, CP 1',
    'MT-NLG 530B, 2800 x A100',
    'MT-NLG 530B, 3360 x A100',
    'MaxText 128B, 32x v5e-256',
    'MaxText 16B, 32x v5e-256',
    'MaxText 22B, 2x v4-128',
    'MaxText 22B, 8x v4-128',
    'MaxText 32B, 1x v5e-256',
    'MaxText 32B, 32x v5e-256',
    'MaxText 52B, 1x v4-384',
    'MaxText 64B, 1x v5e-256',
    'MaxText 64B, 4x v5e-256',
    'MaxText Llama 2 7B, 32 x H100 (A3)',
    'MaxText Llama 2 7B, 64 x H100 (A3)',
    'Megatron-Bridge LLaMA 3-70B, 64 x GB200',
    'Megatron-Bridge LLaMA 3-8B, 8 x B200',
    'Megatron-Bridge LLaMA 3-8B, 8 x H100',
    'Megatron-Bridge LLaMA 3.1-405B, 1024 x H100',
    'Megatron-Bridge LLaMA 3.1-405B, 256 x GB200',
    'llm-foundry MPT-13B, 32 x A100 40GB, bf16',
    'llm-foundry MPT-13B, 8 x A100, bf16',
    'llm-foundry MPT-1B, 8 x H100, bf16',
    'llm-foundry MPT-30B, 128 x A100 40GB, bf16',
    'llm-foundry MPT-3B, 128 x A100 40GB, bf16',
    'llm-foundry MPT-3B, 8 x H100, fp8',
    'llm-foundry MPT-70B, 128 x A100 40GB, bf16',
    'llm-foundry MPT-70B, 64 x H100, bf16',
    'llm-foundry MPT-7B, 8 x A100, bf16',
    'torchtitan Llama 2 13B, 64 x A100, no AC, batch 2',
    'torchtitan Llama 2 13B, 64 x A100, selective op AC, batch 2',
    'torchtitan Llama 3 70B, 256 x H100 96GB, Table 4, 2D',
    'torchtitan Llama 3 8B, 128 x H100 96GB, Table 3, FSDP',
    'torchtitan Llama 3 8B, 128 x H100 96GB, Table 3, FSDP + compile + Float8',
    'torchtitan Llama 3 8B, 64 x A100, selective layer AC, batch 1',
    'torchtitan Llama 3 8B, 8 x H100 96GB, Table 1, FSDP + compile + Float8',
)
HELD_OUT = (
    '1024B, v5p-4096',
    '128B, v5p-256',
    '175B, full recompute',
    '175B, selective + sequence parallel',
    '22B, selective + sequence parallel',
    '256B, v5p-1024',
    '512B, v5p-1024',
    '530B, selective + sequence parallel',
    'BLOOM 176B, 384 x A100',
    'LLAMA2-70B, 64 GPUs',
    'LLAMA2-7B, 8 GPUs',
    'LLAMA3-70B, 64 GPUs',
    'MT-NLG 530B, 2240 x A100',
    'MaxText 128B, 1x v5e-256',
    'MaxText 128B, 4x v5e-256',
    'MaxText 16B, 1x v5e-256',
    'MaxText 16B, 4x v5e-256',
    'MaxText 22B, 1x v4-128',
    'MaxText 22B, 4x v4-128',
    'MaxText 32B, 4x v5e-256',
    'MaxText 52B, 2x v4-384',
    'MaxText 64B, 32x v5e-256',
    'MaxText Llama 2 7B, 128 x H100 (A3)',
    'MaxText Llama 2 7B, 16 x H100 (A3)',
    'MaxText Llama 2 7B, 8 x H100 (A3)',
    'Megatron-Bridge LLaMA 3-70B, 64 x H100',
    'Megatron-Bridge LLaMA 3-8B, 8 x GB200',
    'Megatron-Bridge LLaMA 3.1-405B, 128 x B200',
    'llm-foundry MPT-13B, 8 x H100, bf16',
    'llm-foundry MPT-1B, 8 x A100, bf16',
    'llm-foundry MPT-30B, 32 x H100, bf16',
    'llm-foundry MPT-30B, 8 x A100, bf16',
    'llm-foundry MPT-3B, 64 x H100, bf16',
    'llm-foundry MPT-70B, 64 x A100, bf16',
    'llm-foundry MPT-7B, 64 x A100 40GB, bf16',
    'llm-foundry MPT-7B, 8 x H100, bf16',
    'torchtitan Llama 2 70B, 64 x A100, full AC, batch 2',
    'torchtitan Llama 2 70B, 64 x A100, selective op AC, batch 1',
    'torchtitan Llama 3 70B, 64 x A100, full AC, batch 1',
    'torchtitan Llama 3 8B, 64 x A100, selective op AC, batch 1',
    'torchtitan Llama 3 8B, 8 x H100 96GB, Table 1, FSDP',
    'torchtitan Llama 3 8B, 8 x H100 96GB, Table 2, FSDP 4, CP 2',
    'torchtitan Llama 3 8B, 8 x H100 96GB, Table 2, FSDP 8, CP 1',
    'torchtitan Llama 3.1 405B, 512 x H100 96GB, Table 5, interleaved 1F1B',
)
