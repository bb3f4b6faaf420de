"""simpmd's predicted time of each program against jax.jit on this machine's accelerator.

    python benchmarks/roofline_vs_device.py              # full sizes on a GPU or TPU
    python benchmarks/roofline_vs_device.py --size 16    # dimensions / 16 (what a CPU runs)
    python benchmarks/roofline_vs_device.py --only matmul --repeats 50

The programs (simpmd.jax.device_programs): matmuls in bf16, fp8 and f32 at DEFAULT and
HIGHEST precision at several sizes, elementwise work, GELU, a reduction, a transpose,
RMSNorm, layernorm, softmax, attention, a SwiGLU MLP and a LLaMA-sized transformer layer,
and gradients. Each is timed with jax.jit on the default accelerator (the median of
--repeats calls from Python, each waited for, after one that compiles), and predicted with
simpmd.cost (Roofline.predicted_s) for the preset that matches the device's kind. The table
gives predicted, measured, their ratio and what the prediction says the program waits on;
programs under 50 us are reported as launch-bound and left out of the geometric mean.
At a reduced --size each row says what ran (the inputs' shapes and bytes), since the
program's name gives its full size. docs/benchmarks.md holds the full-size table measured
on an NVIDIA H200 with jax 0.11.2 (2026-11-28; ten programs within 0.59-1.23x of their
predictions, geometric mean 0.81); no preset number was chosen from those times.

On a CPU no datasheet preset matches: the script measures one first
(simpmd.jax.device_programs.measure_cpu: the CPU's matmul, streaming, elementwise and
per-call rates, from four small probes none of which is a program of the table) and
compares with it. --preset names a preset to compare with instead; --no-overlap turns off
overlapping collectives with compute.
"""
from __future__ import annotations

import argparse
import json
import sys


def sized_name(name, args, size):
    """The program's name at full size; at a reduced ``size``, the name followed by what
    ran: its inputs' shapes and their bytes ("[ran bf16[2097152]: 4 MiB]"), so that no row
    reads as 1 GiB in half a millisecond on a CPU."""
    if size == 1:
        return name
    import jax
    import numpy as np
    leaves = jax.tree_util.tree_leaves(args)
    short = {"bfloat16": "bf16", "float32": "f32", "float16": "f16", "float8_e4m3fn": "fp8"}
    shapes = [f"{short.get(str(a.dtype), str(a.dtype))}[{','.join(map(str, a.shape))}]"
              for a in leaves[:2]]
    more = f" +{len(leaves) - 2}" if len(leaves) > 2 else ""
    total = sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize for a in leaves)
    size_text = f"{total / 2**20:.3g} MiB" if total >= 2**20 else f"{total / 2**10:.3g} KiB"
    return f"{name} [ran {' '.join(shapes)}{more}: {size_text}]"


def run(size, repeats, only=None, preset=None, overlap=True, out=print):
    """Time and predict every program (whose name contains ``only``); the rows."""
    import jax
    from simpmd.jax import device_programs as dp
    device = dp.accelerator()
    preset = preset or dp.preset_for(device)
    out(f"device: {device.device_kind} ({device.platform}); jax {jax.__version__}; "
        f"sizes divided by {size}")
    label = preset
    if preset is None and device.platform == "cpu":    # a CPU has no preset: measure one
        preset, label = dp.measure_cpu(device), "this CPU, measured"
        out(f"preset: {preset.citations[0]}")
    else:
        out(f"preset: {preset}" if preset else
            "preset: none matches this device: measured times only")
    rows = []
    for program in dp.programs():
        if only and only.lower() not in program.name.lower():
            continue
        fn, args = program.at(size)
        try:
            measured = dp.time_on(fn, args, device, repeats)
        except Exception as exc:                 # e.g. fp8 on a chip without it
            out(f"{program.name:52s} not run here: {type(exc).__name__}: {str(exc)[:80]}")
            continue
        p = dp.predict(fn, args, preset, overlap=overlap) if preset else None
        rows.append(dp.Row(sized_name(program.name, args, size), p.time_s if p else None, measured,
                           p.bound if p else ""))
    out(dp.table(rows, label))
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=None,
                        help="divide every dimension by this (default: 1 on an accelerator, "
                             "16 on a CPU)")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--only", default=None, help="programs whose name contains this")
    parser.add_argument("--preset", default=None, help="compare with this preset")
    parser.add_argument("--no-overlap", action="store_true")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON too")
    args = parser.parse_args(argv)
    from simpmd.jax import device_programs as dp
    on_cpu = dp.accelerator().platform == "cpu"
    size = args.size or (16 if on_cpu else 1)
    repeats = args.repeats or (3 if on_cpu else 20)
    rows = run(size, repeats, args.only, args.preset, not args.no_overlap)
    if args.json:
        print(json.dumps([dict(name=r.name, predicted_s=r.predicted_s, measured_s=r.measured_s,
                               bound=r.bound) for r in rows], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
