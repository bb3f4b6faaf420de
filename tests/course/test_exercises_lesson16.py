"""The checks of lesson 16's exercises: right answers pass, typical wrong ones get the hint
that names what is off."""
import numpy as np
import pytest

import simpmd
from simpmd.exercises import lesson16 as ex


def said(capsys):
    return capsys.readouterr().out


def _mesh(jax):
    return jax.make_mesh((4, 2), ("hosts", "chips"))


# -- exercise 1: the global shape --------------------------------------------------------------

def test_global_shape_right(capsys):
    assert ex.check_global_shape((12, 6))
    assert ex.check_global_shape([12, 6])
    assert "Correct" in said(capsys)


def test_global_shape_agrees_with_a_run():
    """The checker's expectation, against simpmd's processes (themselves checked against
    real JAX processes in test_hosts.py)."""
    def main(jax):
        sharding = jax.NamedSharding(_mesh(jax), jax.P("hosts", "chips"))
        return jax.make_array_from_process_local_data(sharding, np.zeros((3, 6), np.float32)).shape
    run = simpmd.run_processes(main, 4, show=False)
    assert run.results == [(12, 6)] * 4
    assert ex.check_global_shape(run.results[0])


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"), ("twelve", "tuple of two sizes"), ((3, 6), "4 times its rows"),
    ((12, 12), "does not grow"), ((3, 12), "other way round"), ((24, 6), "not once per device"),
    ((24, 12), "count parts per process"), ((6, 6), "Dimension 0 is split over 'hosts'")])
def test_global_shape_wrong(capsys, answer, hint):
    assert not ex.check_global_shape(answer)
    assert hint in said(capsys)


# -- exercise 2: which collectives cross hosts ----------------------------------------------------

@pytest.mark.parametrize("answer", [{"b", "c"}, ["c", "b"], "b, c", {"a": False, "b": True, "c": True,
                                                                    "d": False}, "BC"])
def test_crossing_right(capsys, answer):
    assert ex.check_crossing(answer)
    assert "Correct" in said(capsys)


def test_crossing_agrees_with_the_hosts_table():
    simpmd.set_device_count(8, processes=4)
    grid = simpmd.mesh_utils.create_hybrid_device_mesh((1, 2), (4, 1), process_is_granule=True)
    mesh = simpmd.Mesh(grid, ("data", "model"))
    lax = simpmd.lax

    def body(v):
        v = lax.psum(v, "model") + lax.psum(v, "data")
        v = lax.all_gather(v, ("data", "model"), tiled=True)[:1]
        return lax.ppermute(v, "model", [(0, 1), (1, 0)])
    f = simpmd.shard_map(body, mesh=mesh, in_specs=simpmd.P("data", "model"),
                         out_specs=simpmd.P("data", "model"))
    f(np.ones((4, 2), np.float32))
    crosses = [r["crosses"] for r in simpmd.hosts.collective_calls(f.trace)]
    assert {k for k, c in zip("abcd", crosses) if c} == {"b", "c"}


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"), ({"b"}, "(c) all_gather over ('data', 'model') does cross"),
    ({"a", "b", "c"}, "(a) psum over 'model' does not cross"),
    ({"a", "d"}, "(b) psum over 'data' does cross"), ({"e"}, "not one of them"),
    (set(), "(b) psum over 'data' does cross")])
def test_crossing_wrong(capsys, answer, hint):
    assert not ex.check_crossing(answer)
    assert hint in said(capsys)


# -- exercise 3: report the loss without a deadlock ------------------------------------------------

def _loss_of(jax):
    from simpmd.exercises import lesson16 as lesson
    x = jax.make_array_from_process_local_data(jax.NamedSharding(_mesh(jax), jax.P("hosts")),
                                               lesson.local_rows(jax))
    return float(jax.jit(lambda v: (v * v).mean())(x))


def fixed(jax):
    value = _loss_of(jax)
    if jax.process_index() == 0:
        print("loss", value)


def deadlocked(jax):
    if jax.process_index() == 0:
        print("loss", _loss_of(jax))


def everyone_prints(jax):
    print("loss", _loss_of(jax))


def own_rows_only(jax):
    if jax.process_index() == 0:
        print("loss", float((ex.local_rows(jax) ** 2).mean()))


def wrong_format(jax):
    value = _loss_of(jax)
    if jax.process_index() == 0:
        print(f"the loss is {value}")


def placeholder(jax):
    ...


def raises(jax):
    raise ValueError("no mesh yet")


def test_fixed_report_right(capsys):
    assert ex.check_fixed_report(fixed)
    out = said(capsys)
    # the mean of x*x over the 8 rows of linspace(-1, 1, 24), worked out by hand:
    # sum_{k=0}^{23} (-1 + 2k/23)^2 / 24
    expected = sum((-1 + 2 * k / 23) ** 2 for k in range(24)) / 24
    assert "Correct" in out and f"{expected:.4f}" in out


@pytest.mark.parametrize("program, hint", [
    (deadlocked, "it still deadlocks"), (everyone_prints, "processes 1-3 printed too"),
    (own_rows_only, "process 0's own 2 rows only"), (wrong_format, "one line 'loss <value>'"),
    (placeholder, "still the placeholder"), (None, "placeholder"), (raises, "ValueError: no mesh")])
def test_fixed_report_wrong(capsys, program, hint):
    assert not ex.check_fixed_report(program)
    assert hint in said(capsys)


# -- exercise 4: what each host writes to a checkpoint -----------------------------------------------

WHOLE = 4096 * 1024 * 4


def test_checkpoint_bytes_right(capsys):
    assert ex.check_checkpoint_bytes([WHOLE, 0, 0, 0])
    assert "Correct" in said(capsys)


def test_checkpoint_bytes_agree_with_replica_ids():
    """A small array of the same layout: the bytes of replica 0 per host, scaled."""
    def main(jax):
        grid = jax.experimental.mesh_utils.create_hybrid_device_mesh(
            (1, 2), (4, 1), devices=jax.devices(), process_is_granule=True)
        mesh = jax.sharding.Mesh(grid, ("data", "model"))
        a = jax.device_put(np.zeros((16, 8), np.float32), jax.NamedSharding(mesh, jax.P(None, "model")))
        return sum(s.data.nbytes for s in a.addressable_shards if s.replica_id == 0)
    small = simpmd.run_processes(main, 4, show=False).results
    assert [b * (4096 * 1024) // (16 * 8) for b in small] == [WHOLE, 0, 0, 0]


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"), ([WHOLE] * 4, "only the copy with replica_id 0"),
    ([WHOLE // 2, 0, 0, 0], "holds both halves"), ([WHOLE // 4] * 4, "even split"),
    ([WHOLE // 2] * 4, "copies of each other's halves"), ([WHOLE // 2, WHOLE // 2, 0, 0], "one host's"),
    ([WHOLE * 2, 0, 0, 0], "looks like 8"), ([16, 0, 0, 0], "not MiB"), ([WHOLE, 0], "one number per host"),
    ("lots", "4 numbers"), ([3, 0, 0, 0], "which copy")])
def test_checkpoint_bytes_wrong(capsys, answer, hint):
    assert not ex.check_checkpoint_bytes(answer)
    assert hint in said(capsys)


# -- section 5's sentences, held to the cost model and to a traced MLP block -----------------

def test_an_mlp_block_all_reduces_once_forward_and_once_backward():
    """Megatron's MLP (column-split first product, row-split second): one psum over 'model'
    forward and one backward (the gradient of the replicated input), not four."""
    from simpmd import lax
    simpmd.set_device_count(4)
    mesh = simpmd.make_mesh((4,), ("model",))

    def loss(x, w1, w2):
        return (lax.psum(simpmd.numpy.tanh(x @ w1) @ w2, "model") ** 2).sum()
    split = (simpmd.P(), simpmd.P(None, "model"), simpmd.P("model", None))
    step = simpmd.shard_map(simpmd.grad(loss, argnums=(0, 1, 2)), mesh=mesh, in_specs=split,
                            out_specs=split)
    step(np.ones((8, 16), np.float32), np.ones((16, 32), np.float32) / 16,
         np.ones((32, 16), np.float32) / 32)
    reductions = [e for e in step.trace.program.eqns if e.primitive.name.startswith("psum")]
    assert len(reductions) == 2


def _section5_text():
    import json
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[2] / "notebooks" / "16_many_hosts.ipynb"
    cells = json.loads(path.read_text())["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells
                    if c["cell_type"] == "markdown")


def test_section5_says_what_the_cost_model_gives():
    """2 tensor-parallel all-reduces per layer of 32, one gradient all-reduce: 43 ms for the
    hybrid layout against 50 swapped, about a seventh less (issue 47, item 1; 42 against 46
    before the network across nodes became NCCL's tuning model)."""
    from simpmd.cost import estimate
    simpmd.set_device_count(16, hardware="H100", processes="hardware")
    activations, gradients = 8192 * 4096 * 2, 32 * 2 * 4096 * 16384 * 2 // 8
    hybrid = (estimate("psum", activations, hardware="H100", devices=list(range(8))).time_s,
              estimate("psum", gradients, hardware="H100", devices=[0, 8]).time_s)
    swapped = (estimate("psum", activations, hardware="H100", devices=[0, 1, 2, 3, 8, 9, 10, 11]).time_s,
               estimate("psum", gradients, hardware="H100", devices=[0, 4]).time_s)
    ms = [round((2 * 32 * tp + dp) * 1e3) for tp, dp in (hybrid, swapped)]
    text = _section5_text()
    assert f"{ms[0]} ms against {ms[1]}" in text and "64 small all-reduces" in text
    assert 0.05 < 1 - ms[0] / ms[1] < 0.15                  # "about a seventh"
    four = [(4 * 32 * tp + dp) for tp, dp in (hybrid, swapped)]
    assert 1 - four[0] / four[1] > 1 - ms[0] / ms[1]        # "the lead grows with them"


def test_section8_slurm_rule_is_jaxs(jax8):
    """Section 8's sentence: under SLURM the coordinator is the first node of the step's node
    list, on port 61440 + (job id mod 4096), as the running JAX's own SlurmCluster says."""
    import inspect
    import os
    from unittest import mock
    from jax._src.clusters import SlurmCluster
    unset = [None] * len(inspect.signature(SlurmCluster.get_coordinator_address).parameters)
    for job, nodes, first in (("123456", "gpu[017-020]", "gpu017"), ("7", "a1,b2", "a1"),
                              ("4096", "node[3,5-9]", "node3")):
        env = {"SLURM_JOB_ID": job, "SLURM_STEP_NODELIST": nodes, "SLURM_NTASKS": "4",
               "SLURM_PROCID": "2", "SLURM_LOCALID": "0"}
        with mock.patch.dict(os.environ, env):
            assert SlurmCluster.is_env_present()
            assert SlurmCluster.get_coordinator_address(*unset) == f"{first}:{61440 + int(job) % 4096}"
            assert (SlurmCluster.get_process_id(), SlurmCluster.get_process_count()) == (2, 4)
    text = _section5_text()
    assert "61440 + (job id mod 4096)" in " ".join(text.split())
