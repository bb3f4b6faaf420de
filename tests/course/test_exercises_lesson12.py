"""The checks of lesson 12's exercises: right answers pass, typical wrong ones get the hint
that names what is off."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P
from simpmd.exercises import lesson12 as ex


def said(capsys):
    return capsys.readouterr().out


@pytest.mark.parametrize("answer", ["float32[32@model]", " float32[32 @model] ",
                                    "f32[32@model]",            # a jaxpr's spelling (lesson 2)
                                    "float32[32@'model']"])
def test_result_type(capsys, answer):
    assert ex.check_result_type(answer)
    out = said(capsys)
    assert out.startswith("Correct: ") and "Correct: Correct" not in out


def test_result_type_accepts_what_jax_typeof_returns(capsys):
    jax = pytest.importorskip("jax")
    if len(jax.devices()) < 8 or not hasattr(jax, "set_mesh"):
        pytest.skip("needs 8 JAX devices and jax.set_mesh")
    from jax.sharding import AxisType
    mesh = jax.make_mesh((2, 4), ("data", "model"), axis_types=(AxisType.Explicit,) * 2)
    with jax.set_mesh(mesh):
        x = jax.device_put(np.zeros((16, 32), np.float32), jax.P("data", "model"))
        assert ex.check_result_type(jax.typeof(jax.jit(lambda a: a.T.sum(1))(x)))
    assert said(capsys).startswith("Correct: ")


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"), ("float32[32@data]", "transpose moves"), ("float32[16@data]", "16 rows"),
    ("f32[32@data]", "transpose moves"), ("f32[16@data]", "16 rows"),
    ("float32[32]", "keeps its axis"), ("float64[3]", "not the type"), (3, "string")])
def test_result_type_wrong(capsys, answer, hint):
    assert not ex.check_result_type(answer)
    assert hint in said(capsys)


def test_megatron_right(capsys):
    def layer(x, w1, w2):
        return snp.matmul(snp.tanh(x @ w1), w2, out_sharding=P("data", None))
    assert ex.check_megatron(layer)
    out = said(capsys)
    assert out.startswith("Correct: ") and "Correct: Correct" not in out


def test_megatron_without_out_sharding(capsys):
    assert not ex.check_megatron(lambda x, w1, w2: snp.tanh(x @ w1) @ w2)
    assert "out_sharding=P('data', None)" in said(capsys)


def test_megatron_without_tanh(capsys):
    assert not ex.check_megatron(lambda x, w1, w2: snp.matmul(x @ w1, w2, out_sharding=P("data", None)))
    assert "tanh" in said(capsys)


def test_megatron_split_result(capsys):
    assert not ex.check_megatron(
        lambda x, w1, w2: snp.matmul(snp.tanh(x @ w1), w2, out_sharding=P("data", "model")))
    assert "float32[16@data,8@model]" in said(capsys)


def test_megatron_gathering_the_weights(capsys):
    def layer(x, w1, w2):
        return snp.tanh(x @ simpmd.reshard(w1, P())) @ simpmd.reshard(w2, P())
    assert not ex.check_megatron(layer)
    out = said(capsys)
    assert "one all-reduce" in out and "moved an input" in out


def test_megatron_in_jax_numpy_is_told_to_use_simpmd_numpy(capsys):
    jnp = pytest.importorskip("jax.numpy")
    assert not ex.check_megatron(lambda x, w1, w2: jnp.tanh(x @ w1) @ w2)
    out = said(capsys)
    assert "jax.numpy (jnp)" in out and "snp.matmul(h, w2, out_sharding=P('data', None))" in out
    assert "ShardedArray" not in out                      # no array repr as the hint

    def layer(x, w1, w2):                                 # the names imported one by one
        from jax.numpy import matmul, tanh
        return matmul(tanh(x @ w1), w2)
    assert not ex.check_megatron(layer)
    assert "jax.numpy (jnp)" in said(capsys)


def test_megatron_in_plain_numpy_is_not_told_to_pass_out_sharding_to_numpy(capsys):
    assert not ex.check_megatron(lambda x, w1, w2: np.tanh(x @ w1) @ w2)
    out = said(capsys)
    assert "NumPy has no out_sharding" in out and "simpmd.numpy" in out
    assert not ex.check_megatron(lambda x, w1, w2: np.matmul(snp.tanh(x @ w1), w2))
    assert "NumPy has no out_sharding" in said(capsys)


def test_megatron_resharding_the_output_is_named_as_such(capsys):
    def layer(x, w1, w2):
        y = snp.matmul(snp.tanh(x @ w1), w2, out_sharding=P("data", "model"))
        return simpmd.reshard(y, P("data", None))
    assert not ex.check_megatron(layer)
    out = said(capsys)
    assert "reshard of the output" in out and "W1 or W2" not in out


def test_megatron_placeholder(capsys):
    assert not ex.check_megatron(...)
    assert "placeholder" in said(capsys)


@pytest.mark.parametrize("a, b, c", [
    ("all-gather", "all-to-all", "none"),
    ("all_gather", "all_to_all", "nothing"),              # JAX's names
    ("allgather", "alltoall", "no communication"),
    ("AllGather", "AllToAll", "local slice"),             # the lesson's rules table
    ("all gather", "all to all", "dynamic-slice"),        # what XLA writes for (c)
    ("lax.all_gather", "jax.lax.all_to_all", "slice"),
    ("all-gather", "all-to-all", "dynamic slice"),
    ("all-gather", "all-to-all", "no"),                   # as short as 'nothing'
    ("all-gather", "all-to-all", "No"),
    ("all-gather", "all-to-all", "none needed"),
    ("all-gather", "all-to-all", "no collective"),
])
def test_reshard_collectives(capsys, a, b, c):
    assert ex.check_reshard_collectives({"a": a, "b": b, "c": c})
    out = said(capsys)
    assert out.startswith("Correct: ") and "Correct: Correct" not in out


@pytest.mark.parametrize("answers", [
    {"a": "all-gather", "b": "all-to-all"},               # (c) left out
    {"a": "all-gather", "b": "all-to-all", "c": None},
    {"a": "all-gather", "b": "all-to-all", "c": ""},
    {"a": "all-gather", "b": "all-to-all", "c": "  "},
])
def test_reshard_collectives_unanswered(capsys, answers):
    assert not ex.check_reshard_collectives(answers)
    out = said(capsys)
    assert out.startswith("Not yet: ") and "(c) has no answer" in out and "'none'" in out


def test_reshard_collectives_unknown_word(capsys):
    assert not ex.check_reshard_collectives({"a": "gather", "b": "all-to-all", "c": "none"})
    assert "'gather' is not a collective this checker knows" in said(capsys)


def test_reshard_collectives_wrong(capsys):
    assert not ex.check_reshard_collectives({"a": "all-reduce", "b": "all-gather", "c": "none"})
    out = said(capsys)
    assert "(a)" in out and "(b)" in out and "(c)" not in out
    assert not ex.check_reshard_collectives({"a": "all-gather", "b": "all-to-all", "c": "all-gather"})
    assert "sends nothing" in said(capsys)
    assert not ex.check_reshard_collectives(...)


@pytest.mark.parametrize("answer, hints", [
    (4096 * 4096 * 2 * 7 / 8 / 2**20, ["not MiB"]),          # 28: the answer in MiB
    (4096 * 4096 * 2 * 7 / 8 / 1e6, ["not MB"]),
    (4096 * 4096 * 2 * 7 / 8 * 8, ["counts bits"]),
    (4096 * 4096 * 4 * 7 / 8 / 2**20, ["4 is float32", "not MiB"]),
])
def test_fsdp_bytes_unit_slips(capsys, answer, hints):
    assert not ex.check_fsdp_gather_bytes(answer)
    out = said(capsys)
    assert out.startswith("Not yet: ") and "9.54e-07" not in out
    for hint in hints:
        assert hint in out


@pytest.mark.parametrize("answer", [29.36e6, 29_360_000, 2.936e7, 29_400_000])
def test_fsdp_bytes_rounded_is_a_near_miss_not_a_factor_of_1(capsys, answer):
    """28 MiB is 29,360,128 bytes: 29.36e6 is it rounded (to 4 figures), 29.4e6 to 3."""
    assert 4096 * 4096 * 2 * 7 // 8 == 29_360_128
    assert not ex.check_fsdp_gather_bytes(answer)
    out = said(capsys)
    assert "close but not exact (did you round?)" in out and "factor of 1" not in out


def test_fsdp_bytes(capsys):
    assert ex.check_fsdp_gather_bytes(4096 * 4096 * 2 * 7 // 8)
    assert not ex.check_fsdp_gather_bytes(4096 * 4096 * 2)
    assert "7/8" in said(capsys)
    assert not ex.check_fsdp_gather_bytes(4096 * 4096 * 4 * 7 // 8)
    assert "2 bytes" in said(capsys)
    assert not ex.check_fsdp_gather_bytes(4096 * 4096 * 2 // 8)
    assert "receives the 7 blocks" in said(capsys)


def test_reshard_collectives_placeholders(capsys):
    assert not ex.check_reshard_collectives({"a": ..., "b": ..., "c": ...})
    assert "placeholders" in said(capsys)
