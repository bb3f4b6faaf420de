"""The LLaMA-3-shaped training step of lesson 15 (simpmd/course/llama.py).

Its values are JAX's (the same function run by jax.shard_map on a small decoder), its
parameter count is the Scaling Book's hand count, its matrix-product FLOPs, HBM bytes and
ICI bytes are jax.experimental.roofline's, and at the real size it runs on thousands of
simulated devices on shapes alone.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import simpmd
import simpmd.cost as C
from simpmd.course import llama

from test_shapes import jax_specs


def _opt(cfg):
    zeros = lambda: llama._tree(lambda s: np.zeros(s, np.float32), llama.param_shapes(cfg))
    return {"m": zeros(), "v": zeros()}


def _batch(cfg, sequences=4, tokens=16):
    rng = np.random.default_rng(1)
    return (rng.integers(0, cfg.vocab, (sequences, tokens)).astype(np.int32),
            rng.integers(0, cfg.vocab, (sequences, tokens)).astype(np.int32))


def test_the_parameter_count_is_the_books():
    """[scaling-book applied-training] 'Counting Parameters': FFW 56.3e9, vocabulary 2.1e9,
    attention 12e9, 70.4e9 in all (the book leaves the norms' 1.3e6 scales out)."""
    cfg = llama.LLAMA3_70B
    shapes = llama.param_shapes(cfg)
    L, D, F, V = cfg.layers, cfg.d_model, cfg.ffw, cfg.vocab
    N, K, H = cfg.heads, cfg.kv_heads, cfg.head_dim
    ffw = D * F * 3 * L
    attention = L * (2 * D * N * H + 2 * D * K * H)
    vocab = 2 * V * D
    norms = (2 * L + 1) * D
    assert llama.count_params(shapes) == ffw + attention + vocab + norms
    assert (round(ffw / 1e9, 1), round(vocab / 1e9, 1), round(attention / 1e9)) == (56.4, 2.1, 12)
    assert llama.count_params(shapes) == pytest.approx(70.4e9, rel=0.005)


def test_a_step_computes_what_jax_computes(jax8):
    """The same step function, shard_mapped over a (2, 4) (fsdp, tp) mesh by simpmd and by
    JAX, on a small decoder in float32: the same loss and the same updated weights."""
    from jax.sharding import Mesh
    cfg = llama.tiny()
    params, opt, (tokens, targets) = llama.init_params(cfg), _opt(cfg), _batch(cfg)
    ins, outs = llama.step_specs(cfg)
    ours = simpmd.shard_map(llama.train_step(cfg), mesh=simpmd.make_mesh((2, 4), ("fsdp", "tp")),
                            in_specs=ins, out_specs=outs)(params, opt, tokens, targets)
    mesh = Mesh(np.array(jax8.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    theirs = jax8.jit(jax8.shard_map(llama.train_step(cfg), mesh=mesh, in_specs=jax_specs(ins),
                                     out_specs=jax_specs(outs)))(params, opt, tokens, targets)
    for a, b in zip(jax8.tree_util.tree_leaves(ours), jax8.tree_util.tree_leaves(theirs)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    assert float(ours[2]) == pytest.approx(math.log(cfg.vocab), rel=0.2)   # untrained: ~ln V


def test_the_step_costs_what_jax_roofline_says(jax8):
    """On ShapeDtypeStructs: the matrix products' FLOPs and HBM bytes, and the ICI bytes per
    axis, of the whole training step (embedding, layers, loss, backward, Adam)."""
    pytest.importorskip("absl")
    from jax.experimental import roofline as jr
    from jax.sharding import Mesh
    cfg = llama.tiny(dtype="bfloat16")
    ins, outs = llama.step_specs(cfg)
    mesh = Mesh(np.array(jax8.devices()[:8]).reshape(2, 4), ("fsdp", "tp"))
    try:
        _, theirs = jr.roofline(llama.train_step(cfg), mesh=mesh, in_specs=jax_specs(ins),
                                out_specs=jax_specs(outs))(
            *llama.abstract_step_args(cfg, 64, 8, jax8.ShapeDtypeStruct))
    except NotImplementedError as exc:      # jax 0.7.2: no rule for axis_index, and it raises
        pytest.skip(f"this jax's roofline refuses the step: {str(exc).splitlines()[0]}")
    ours = C.roofline(llama.train_step(cfg), *llama.abstract_step_args(
        cfg, 64, 8, simpmd.ShapeDtypeStruct), mesh=simpmd.make_mesh((2, 4), ("fsdp", "tp")),
        in_specs=ins, out_specs=outs)
    assert (ours.flops, ours.hbm_bytes) == (theirs.flops, theirs.hbm_bytes)
    assert ours.ici_bytes == dict(theirs.ici_bytes)


def test_the_70b_step_runs_on_shapes_on_8192_devices():
    """Two of the 80 layers (the benchmark times all 80), FSDP 2048 x TP 4 on a TPU v5p
    16 x 16 x 32 slice: the step's collectives per axis, by hand."""
    pytest.importorskip("ml_dtypes", reason="the step is in bfloat16, which ml_dtypes (jaxlib's) brings")
    cfg = llama.Config(layers=2)
    simpmd.set_device_count(8192, hardware="TPU v5p", topology=(16, 16, 32))
    mesh = llama.torus_mesh(2048, 4, simpmd.Mesh)
    ins, outs = llama.step_specs(cfg)
    step = simpmd.shard_map(llama.train_step(cfg), mesh=mesh, in_specs=ins, out_specs=outs)
    new_params, _, loss = step(*llama.abstract_step_args(cfg, 2048, 2048, simpmd.ShapeDtypeStruct))
    assert loss == simpmd.ShapeDtypeStruct((), np.float32, simpmd.NamedSharding(mesh, simpmd.P()))
    assert new_params["layers"][1]["w1"].shape == (8192, 28672)
    calls = C.estimate_trace(step.trace).calls
    gathers = [c for c in calls if c.op == "all_gather"]
    scatters = [c for c in calls if c.op == "psum_scatter"]
    # 7 weight matrices per layer and the two embeddings: gathered once, scattered once
    assert len(gathers) == len(scatters) == 7 * 2 + 2
    assert all(c.axes == ("fsdp",) and c.groups == 4 for c in gathers + scatters)
    tp = [c for c in calls if c.axes == ("tp",)]
    assert tp and all(c.op == "psum" and c.groups == 2048 for c in tp)
    # a TP group is a 2 x 2 square of neighbours: every group the same shape, one estimate
    assert len({c.time_s for c in tp if c.bytes_sent == tp[0].bytes_sent}) == 1


def test_torus_mesh_puts_each_tensor_parallel_group_on_neighbours():
    simpmd.set_device_count(64, topology=(4, 4, 4))
    mesh = llama.torus_mesh(16, 4, simpmd.Mesh)
    coords = np.array([[d.coords for d in row] for row in mesh.devices])     # fsdp x tp x 3
    for group in coords:                     # one tp group: a 2 x 2 square, same z
        assert len({tuple(c[:2] // 2) for c in group}) == 1 and len({c[2] for c in group}) == 1
    assert sorted(d.id for d in mesh.devices.flat) == list(range(64))


def test_two_full_size_layers_cost_what_jax_roofline_says(jax8):
    """Lesson 15's cross-check: forward and backward of two LLaMA 3-70B layers over an
    abstract 2048 x 4 mesh, 2048 tokens per FSDP group. simpmd leaves out the equations
    nothing reads (the loss's value), as JAX's roofline does (dce_jaxpr)."""
    pytest.importorskip("absl")
    from dataclasses import replace
    from jax.experimental import roofline as jr
    from jax.sharding import AbstractMesh, AxisType
    two = replace(llama.LLAMA3_70B, layers=2)
    ins, outs = llama.layers_specs(two)
    shape = (2048, 2048, two.d_model)
    mesh = AbstractMesh((2048, 4), ("fsdp", "tp"), axis_types=(AxisType.Auto,) * 2)
    _, theirs = jr.roofline(llama.layers_step(two), mesh=mesh, in_specs=jax_specs(ins),
                            out_specs=jax_specs(outs))(
        llama.abstract_params(two, jax8.ShapeDtypeStruct)["layers"],
        jax8.ShapeDtypeStruct(shape, "bfloat16"))
    simpmd.set_device_count(8192)
    ours = C.roofline(llama.layers_step(two), llama.abstract_params(two, simpmd.ShapeDtypeStruct)[
        "layers"], simpmd.ShapeDtypeStruct(shape, "bfloat16"),
        mesh=simpmd.make_mesh((2048, 4), ("fsdp", "tp")), in_specs=ins, out_specs=outs)
    assert (ours.flops, ours.hbm_bytes) == (theirs.flops, theirs.hbm_bytes)
    assert ours.ici_bytes == dict(theirs.ici_bytes)
