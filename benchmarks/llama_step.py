"""A LLaMA-3-70B training step on 8192 simulated TPU v5p chips, on shapes alone, against
jax.experimental.roofline on the same program.

    python benchmarks/llama_step.py            # all 80 layers (about a minute in all)
    python benchmarks/llama_step.py --quick    # 8 layers
    python benchmarks/llama_step.py --json

The step is lesson 15's (simpmd/course/llama.py): the embedding, 80 decoder layers (a
Python loop; grouped-query attention, the MLP with F = 28672), the 128,256-token output
layer and its loss, the backward pass and an Adam update, for a batch of 2048 sequences
of 2048 tokens, as shard_map over a ('fsdp', 'tp') = (2048, 4) mesh laid on a 16 x 16 x 32
torus. On ShapeDtypeStructs nothing is computed: simpmd traces the step, runs it on types
over all 8192 devices (logging every collective), and then costs it (the roofline of its
program, every collective on the torus, the timeline). JAX's roofline traces the same
function (simpmd.numpy and simpmd.lax call jax.numpy and jax.lax inside a JAX trace) over
an AbstractMesh of the same shape and costs it. Both are timed in the same run, so the
report is a ratio: simpmd's whole simulation over JAX's roofline, and simpmd's roofline of the
traced step alone (``roofline_of``, the one walk) over JAX's. Times are CPU seconds of
this process (time.process_time), so that other work on a shared machine does not count.
jax 0.7.2's roofline raises for a primitive it has no rule for (`axis_index`, which the
vocabulary-parallel embedding uses), so there simpmd's time is reported alone.
"""
from __future__ import annotations

import argparse
import json
import time


def simulate(layers):
    """Seconds for simpmd to run the step on shapes and to cost it, and what it found."""
    import simpmd
    import simpmd.cost as C
    from simpmd.course import llama
    from simpmd.viz.timeline import model_timeline
    cfg = llama.Config(layers=layers)
    simpmd.set_device_count(8192, hardware="TPU v5p", topology=(16, 16, 32))
    start = time.process_time()
    mesh = llama.torus_mesh(2048, 4, simpmd.Mesh)
    ins, outs = llama.step_specs(cfg)
    step = simpmd.shard_map(llama.train_step(cfg), mesh=mesh, in_specs=ins, out_specs=outs)
    step(*llama.abstract_step_args(cfg, 2048, 2048, simpmd.ShapeDtypeStruct))
    ran = time.process_time()
    roofline = C.roofline_of(step.trace.program, axis_env=mesh)
    costed = time.process_time()
    estimate = C.estimate_trace(step.trace)
    timeline = model_timeline(step.trace, fused=True)
    done = time.process_time()
    return {"run_s": ran - start, "cost_s": done - ran, "simpmd_s": done - start,
            "roofline_s": costed - ran,
            "flops": roofline.flops, "ici_bytes": roofline.ici_bytes,
            "collective_calls": len(estimate.calls),
            "step_s_modelled": timeline.end, "compute_s": timeline.total("compute", 0),
            "comm_s": timeline.total("comm", 0)}


def jax_roofline(layers):
    """Seconds for jax.experimental.roofline on the same step, and its counts."""
    import jax
    from jax.experimental import roofline as jr
    from jax.sharding import AbstractMesh, AxisType, PartitionSpec
    import simpmd
    from simpmd.course import llama
    cfg = llama.Config(layers=layers)

    def jax_specs(tree):
        if isinstance(tree, simpmd.PartitionSpec):
            return PartitionSpec(*tree)
        if isinstance(tree, (list, tuple)):
            return type(tree)(jax_specs(t) for t in tree)
        if isinstance(tree, dict):
            return {k: jax_specs(v) for k, v in tree.items()}
        return tree
    ins, outs = llama.step_specs(cfg)
    start = time.process_time()
    mesh = AbstractMesh((2048, 4), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
    _, result = jr.roofline(llama.train_step(cfg), mesh=mesh, in_specs=jax_specs(ins),
                            out_specs=jax_specs(outs))(
        *llama.abstract_step_args(cfg, 2048, 2048, jax.ShapeDtypeStruct))
    return {"jax_s": time.process_time() - start, "flops": result.flops,
            "ici_bytes": dict(result.ici_bytes)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 layers instead of 80")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    import logging
    logging.getLogger("absl").setLevel(logging.ERROR)     # JAX warns of rules it lacks
    layers = 8 if args.quick else 80
    ours = simulate(layers)
    try:
        theirs = jax_roofline(layers)
    except NotImplementedError as exc:        # jax 0.7.2 raises for a primitive without a rule
        theirs = {"jax_s": None, "refused": str(exc).splitlines()[0]}
    row = {"layers": layers, "devices": 8192, **ours, "jax_s": theirs["jax_s"],
           "jax_refused": theirs.get("refused")}
    if theirs["jax_s"] is not None:
        row.update(ratio=ours["simpmd_s"] / theirs["jax_s"],
                   roofline_ratio=ours["roofline_s"] / theirs["jax_s"],
                   same_flops=ours["flops"] == theirs["flops"],
                   same_ici_bytes=ours["ici_bytes"] == theirs["ici_bytes"])
    if args.json:
        print(json.dumps(row, indent=2))
        return
    if theirs["jax_s"] is None:
        print(f"jax.experimental.roofline refuses the step on this jax: {row['jax_refused']}")
        print(f"simpmd: {row['simpmd_s']:.1f} s")
        return
    print(f"LLaMA-3-70B step, {layers} layers, 8192 simulated TPU v5p (2048-way FSDP x 4-way TP), "
          f"shapes only")
    print(f"  simpmd: run {row['run_s']:.1f} s + cost {row['cost_s']:.1f} s = {row['simpmd_s']:.1f} s "
          f"({row['collective_calls']} collective calls)")
    print(f"  jax.experimental.roofline: {row['jax_s']:.1f} s")
    print(f"  ratio simpmd / jax: {row['ratio']:.2f}; simpmd's roofline alone "
          f"({row['roofline_s']:.1f} s) / jax: {row['roofline_ratio']:.2f}")
    print(f"  same matmul FLOPs as JAX: {row['same_flops']}; same ICI bytes per axis: "
          f"{row['same_ici_bytes']}")
    print(f"  modelled step: {row['step_s_modelled']:.2f} s ({row['compute_s']:.2f} s computing, "
          f"{row['comm_s']:.2f} s communicating per chip, not overlapped)")


if __name__ == "__main__":
    main()
