"""How long simpmd.plan takes: one LLaMA-3-70B estimate on 8,192 TPU v5p chips, and a sweep
over layouts with and without reusing what does not change between them.

    python benchmarks/plan_sweep.py            # 1 estimate, a sweep of 120 layouts
    python benchmarks/plan_sweep.py --quick    # 6 layouts
    python benchmarks/plan_sweep.py --json

The machine is two 16x16x16 v5p slices (4,096 chips each, a shape Google documents) over
DCN: data parallelism of 2 across the slices, FSDP x tensor parallelism inside each. Every
estimate builds the whole training step as a simpmd program on shapes, runs it with
shard_map over all 8,192 simulated chips, schedules its program and walks its memory.
The sweep runs the same layouts twice in one process: once through ``plan.sweep`` (one
machine, the collectives' times, the traced steps and the memory programs shared), once
as independent ``plan.estimate`` calls; the report is their ratio. Times are CPU seconds
of this process (time.process_time), so other work on a shared machine does not count.
"""
from __future__ import annotations

import argparse
import itertools
import json
import time


def layouts(quick: bool):
    """Splits of each 4,096-chip slice into FSDP x context x tensor parallelism (every one
    with context 1, 2, 4 or 8 and tensor 1 to 16: 20), at global batches of 4M to 16M
    tokens (sequences of 8,192), each with full or selective recomputation: 120 layouts
    (--quick: 6 splits at one batch, full recomputation); the ones that cannot run come
    back as their LayoutError."""
    from simpmd import plan
    splits = [(4096 // (c * t), c, t) for c in (1, 2, 4, 8) for t in (1, 2, 4, 8, 16)]
    if quick:
        splits = [(1024, 1, 4), (512, 2, 4), (256, 4, 4), (512, 1, 8), (2048, 1, 2),
                  (256, 2, 8)]
    batches = [512, 1024, 2048] if not quick else [1024]
    recompute = ["full", "selective"] if not quick else ["full"]
    return [plan.Layout(dp=2, fsdp=f, cp=c, tp=t, global_batch=b, recompute=r,
                        sequence_parallel=t > 1)
            for (f, c, t), b, r in itertools.product(splits, batches, recompute)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a sweep of 6 layouts")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    from simpmd import plan
    model = plan.LLAMA3_70B
    options = dict(hardware="TPU v5p", slices=2, check_memory=False)
    one = plan.Layout(dp=2, fsdp=1024, tp=4, global_batch=2048, recompute="full",
                      sequence_parallel=True)
    start = time.process_time()
    single = plan.estimate(model, one, **options)
    single_s = time.process_time() - start
    swept = layouts(args.quick)
    start = time.process_time()
    shared = plan.sweep(model, swept, **options)
    shared_s = time.process_time() - start
    alone = []
    start = time.process_time()
    for lay in swept:
        try:
            alone.append(plan.estimate(model, lay, **options))
        except plan.LayoutError as exc:
            alone.append(exc)
    alone_s = time.process_time() - start
    ran = [(a, b) for a, b in zip(shared, alone) if isinstance(a, plan.Estimate)]
    same = all(a.step_s == b.step_s and a.peak_bytes == b.peak_bytes for a, b in ran)
    row = {"estimate_s": single_s, "step_s": single.step_s, "mfu": single.mfu,
           "layouts": len(swept), "ran": len(ran), "sweep_s": shared_s, "independent_s": alone_s,
           "ratio": shared_s / alone_s, "same_results": same}
    if args.json:
        print(json.dumps(row, indent=2))
        return
    print(f"LLaMA 3-70B on 8,192 TPU v5p (2 x 4,096 over DCN), {one}:")
    print(f"  one estimate: {single_s:.2f} s of CPU (predicts {single.step_s:.2f} s per step, "
          f"MFU {single.mfu:.0%})")
    print(f"  a sweep of {len(swept)} layouts ({len(ran)} can run): {shared_s:.2f} s reusing, "
          f"{alone_s:.2f} s independent ({shared_s / alone_s:.2f}x); the same results: {same}")


if __name__ == "__main__":
    main()
