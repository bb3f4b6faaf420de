"""The checks of lesson 12's exercises: right answers pass, typical wrong ones get the hint
that names what is off."""
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P
from simpmd.exercises import lesson12 as ex


def said(capsys):
    return capsys.readouterr().out


def test_result_type(capsys):
    assert ex.check_result_type("float32[32@model]")
    assert ex.check_result_type(" float32[32 @model] ")
    out = said(capsys)
    assert out.startswith("Correct: ") and "Correct: Correct" not in out


@pytest.mark.parametrize("answer, hint", [
    (..., "placeholder"), ("float32[32@data]", "transpose moves"), ("float32[16@data]", "16 rows"),
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
    assert "one all-reduce" in said(capsys)


def test_megatron_placeholder(capsys):
    assert not ex.check_megatron(...)
    assert "placeholder" in said(capsys)


def test_reshard_collectives(capsys):
    assert ex.check_reshard_collectives({"a": "all-gather", "b": "all_to_all", "c": None})
    assert ex.check_reshard_collectives({"a": "allgather", "b": "all-to-all", "c": "none"})
    out = said(capsys)
    assert out.startswith("Correct: ") and "Correct: Correct" not in out


def test_reshard_collectives_wrong(capsys):
    assert not ex.check_reshard_collectives({"a": "all-reduce", "b": "all-gather", "c": "none"})
    out = said(capsys)
    assert "(a)" in out and "(b)" in out and "(c)" not in out
    assert not ex.check_reshard_collectives({"a": "all-gather", "b": "all-to-all", "c": "all-gather"})
    assert "sends nothing" in said(capsys)
    assert not ex.check_reshard_collectives(...)


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
