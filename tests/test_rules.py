"""simpmd's jit follows the sharding rules of the JAX running beside it, read from that JAX
by tiny programs (simpmd.jax.rules), and the newest JAX's rules where no JAX is imported.
Whether the rules read are JAX's is checked by the random programs compared with JAX
(tests/test_explicit_vs_jax.py, tests/test_unreduced.py); here, how they are read."""
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUESTIONS = ["batch_alike", "matmul_batch", "single_element", "reshape_spread", "strided_slice",
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
        f"for q in {QUESTIONS!r}:\n"
        "    print(q, settings.ask(q))\n"
        "for row in PRIMITIVES.values():\n"
        "    if hasattr(row, 'unreduced_probe'):\n"
        "        print(row.name, settings.ask('on_operand', row, 'unreduced'), '|',\n"
        "              settings.ask('on_operand', row, 'reduced'))\n"
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
    from simpmd.jax import rules
    if jax_version(jax8) < (0, 12):
        pytest.skip(f"the newest answers are jax 0.12's; this is {jax8.__version__}")
    for q in QUESTIONS:
        assert getattr(rules, q)() == settings.NEWEST[q], q
    for row in (r for r in PRIMITIVES.values() if hasattr(r, "unreduced_probe")):
        theirs = (rules.on_operand(row, "unreduced"), rules.on_operand(row, "reduced"))
        assert theirs == tuple(row.unreduced_newest), row.name


def test_newest_pins_the_newest_rules_inside_the_block(jax8):
    from simpmd.api.partition import settings
    from simpmd.core import primitives as P
    with settings.newest():
        assert settings.batch_alike is True
        assert settings.ask("on_operand", P.sub, "unreduced") == "keeps"
    assert settings.pinned is False
