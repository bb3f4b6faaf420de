"""simpmd's jit follows the sharding rules of the JAX running beside it, read from that JAX
by tiny programs (simpmd.jax.rules), and the newest JAX's rules where no JAX is imported.
Whether the rules read are JAX's is checked by the random programs compared with JAX
(tests/conformance/test_explicit_vs_jax.py, tests/partitioner/test_unreduced.py); here, how they are read."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUESTIONS = ["batch_alike", "matmul_batch", "single_element", "reshape_spread", "strided_slice",
             "spec_rank_checked",
             "shard_map_checks", "cotangent_swaps", "contraction_sets"]
WORDS = {"keeps", "drops", "partial", "no rule", "pspec[...]", "*pspec", "kind", "nonlinear",
         "refused"}


def _python(code):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_without_jax_imported_simpmd_keeps_the_newest_rules_and_imports_no_jax():
    out = _python(
        "import sys, numpy as np, simpmd, simpmd.numpy as snp\n"
        "from simpmd import P\n"
        "m = simpmd.make_mesh((2,), ('X',), axis_types=(simpmd.sharding.AxisType.Explicit,))\n"
        "with simpmd.set_mesh(m):\n"
        "    a = simpmd.device_put(np.ones((4, 4), np.float32), P(None, 'X'))\n"
        "    u = snp.einsum('ij,jk->ik', a, a.T, out_sharding=P(None, None, unreduced={'X'}))\n"
        "    print(simpmd.typeof(-u), simpmd.typeof(simpmd.jit(lambda b: b[0:1, 0:1])(a)))\n"
        "print('jax' in sys.modules)\n")
    # jax 0.12's rules: neg keeps a partial sum; one element of a split dim is replicated
    assert out.split("\n")[:2] == ["float32[4,4]{U:X} float32[1,1]", "False"]


def test_every_rule_is_read_from_this_jax_without_starting_its_backend():
    pytest.importorskip("jax")
    out = _python(
        "import jax, simpmd\n"
        "from jax._src import xla_bridge\n"
        "from simpmd.api.partition import settings\n"
        "from simpmd.core.core import PRIMITIVES\n"
        "from simpmd.partitioner.columns import column\n"
        f"for q in {QUESTIONS!r}:\n"
        "    print(q, settings.ask(q))\n"
        "for row in PRIMITIVES.values():\n"
        "    if column(row, 'unreduced_probe') is not None:\n"
        "        print(row.name, settings.ask('on_operand', row, 'unreduced'), '|',\n"
        "              settings.ask('on_operand', row, 'reduced'))\n"
        "from simpmd.core.collectives import settings as vma\n"
        "assert vma.partial <= set(PRIMITIVES.values())    # (shard_map's rules, asked too)\n"
        "print('backend started', xla_bridge.backends_are_initialized())\n")
    lines = out.strip().split("\n")
    assert lines[-1] == "backend started False"
    answers = dict(line.split(" ", 1) for line in lines[:len(QUESTIONS)])
    assert set(answers) == set(QUESTIONS)
    assert answers["contraction_sets"] in ("axes", "entries")
    for line in lines[len(QUESTIONS):-1]:
        row, words = line.split(" ", 1)
        assert set(words.split(" | ")) <= WORDS, line


def test_the_newest_answers_are_the_newest_jaxs(jax8):
    from simpmd.api.partition import settings
    from simpmd.core.core import PRIMITIVES
    from simpmd.jax.handoff import jax_version
    from simpmd.partitioner.columns import column
    from simpmd.jax import rules
    if jax_version(jax8) < (0, 12):
        pytest.skip(f"the newest answers are jax 0.12's; this is {jax8.__version__}")
    for q in QUESTIONS + ["empty_take_keeps_split"]:     # the last indexes a real array
        assert getattr(rules, q)() == settings.NEWEST[q], q
    for row in (r for r in PRIMITIVES.values() if column(r, "unreduced_probe") is not None):
        theirs = (rules.on_operand(row, "unreduced"), rules.on_operand(row, "reduced"))
        assert theirs == tuple(column(row, "unreduced_newest")), row.name


def test_newest_pins_the_newest_rules_inside_the_block(jax8):
    from simpmd.api.partition import settings
    from simpmd.core import primitives as P
    with settings.newest():
        assert settings.batch_alike is True
        assert settings.ask("on_operand", P.sub, "unreduced") == "keeps"
    assert settings.pinned is False


# -- a bare P(...) needs set_mesh; a spec has one entry per dimension (as the running JAX) --------

def _spec_programs(engine):
    """Programs that pass shardings: name -> a function of nothing, run on ``engine``
    (simpmd or jax) with the same names."""
    import numpy as np
    jnp = __import__(engine.__name__ + ".numpy", fromlist=["x"])
    P, NS = engine.sharding.PartitionSpec, engine.sharding.NamedSharding
    reshard = getattr(engine, "reshard", None) or engine.sharding.reshard
    mesh = engine.make_mesh((2, 4), ("a", "b"), axis_types=(engine.sharding.AxisType.Explicit,) * 2)
    x = np.arange(32.0, dtype=np.float32).reshape(8, 4)
    placed = engine.device_put(x, NS(mesh, P(None, "b")))
    jit = engine.jit
    outside = {
        "einsum": lambda: jnp.einsum("ij,jk->ik", placed, placed.T, out_sharding=P("a", None)),
        "jit einsum": lambda: jit(lambda a: jnp.einsum("ij,jk->ik", a, a.T, out_sharding=P("a", None)))(placed),
        "reshard": lambda: reshard(placed, P("a", None)),
        "jit reshard": lambda: jit(lambda a: reshard(a, P("a", None)))(placed),
        "reshape": lambda: jnp.reshape(placed, (32,), out_sharding=P("a")),
        "zeros": lambda: jnp.zeros((8, 4), out_sharding=P("a", None)),
        "device_put": lambda: engine.device_put(x, P("a", None)),
        "out_shardings": lambda: jit(lambda a: a * 2, out_shardings=P("a", None))(placed),
        "out_shardings named": lambda: jit(lambda a: a * 2, out_shardings=NS(mesh, P("a", None)))(placed),
        "in_shardings": lambda: jit(lambda a: a * 2, in_shardings=P(None, "b"))(placed)}
    inside = {}
    for n, extra in (("None", P("a", None, None)), ("'b'", P("a", None, "b"))):
        inside.update({
            f"reshard {n}": lambda s=extra: reshard(placed, s),
            f"jit reshard {n}": lambda s=extra: jit(lambda a: reshard(a, s))(placed),
            f"einsum {n}": lambda s=extra: jnp.einsum("ij,jk->ik", placed, placed.T, out_sharding=s),
            f"zeros {n}": lambda s=extra: jnp.zeros((8, 4), out_sharding=s),
            f"device_put {n}": lambda s=extra: engine.device_put(x, s),
            f"out_shardings {n}": lambda s=extra: jit(lambda a: a * 2, out_shardings=s)(placed)})
    inside.update({
        "zeros placed": lambda: jnp.zeros((8, 4), out_sharding=P("a", None)),
        "jit zeros placed": lambda: jit(lambda a: a + jnp.ones((8, 4), out_sharding=P("a", None)))(placed),
        "in_shardings numpy": lambda: jit(lambda a: a * 2, in_shardings=P("a", None))(x),
        "in_shardings differ": lambda: jit(lambda a: a * 2, in_shardings=P("a", None))(placed),
        "out_shardings tuple": lambda: jit(lambda a: (a * 2, a.sum(0)), out_shardings=(P("a", None), None))(placed)})
    return mesh, outside, inside


def _outcomes(engine):
    import numpy as np
    mesh, outside, inside = _spec_programs(engine)
    seen = {}

    def run(name, program):
        try:
            out = program()
            seen[name] = [f"{engine.typeof(v)} {float(np.asarray(v).sum())}"
                          for v in (out if isinstance(out, tuple) else (out,))]
        except Exception as exc:                    # the kind is compared, not the words
            seen[name] = "raised " + next(b.__name__ for b in (
                ValueError, RuntimeError, TypeError, AssertionError, Exception) if isinstance(exc, b))
    for name, program in outside.items():
        run(name, program)
    with engine.set_mesh(mesh):
        for name, program in inside.items():
            run(name, program)
    return seen


def test_shardings_need_a_mesh_and_one_entry_per_dimension_as_in_jax(jax8):
    import simpmd
    if not hasattr(jax8, "set_mesh"):
        pytest.skip(f"this JAX ({jax8.__version__}) has no set_mesh")
    mine, theirs = _outcomes(simpmd), _outcomes(jax8)
    # jax 0.10 and before fail an assertion on a spec naming an axis past the last dimension;
    # simpmd says what is wrong
    differ = {k: (mine[k], theirs[k]) for k in theirs if mine[k] != theirs[k]
              and (mine[k], theirs[k]) != ("raised ValueError", "raised AssertionError")}
    assert not differ, differ
    assert mine["einsum"] == "raised ValueError" and mine["out_shardings"] == "raised RuntimeError"
