"""Reading a ``jax.profiler`` trace (issue 47, item 20): hand-written trace files and HLO
text whose kernels are known, then a real trace of a jitted step on CPU."""
import gzip
import json

import pytest

from simpmd.jax import profiling as pr

HLO = """HloModule jit_step
%fused_computation (p: f32[8]) -> f32[] {
  %p = f32[8]{0} parameter(0)
  ROOT %reduce.1 = f32[] reduce(%p, %c), dimensions={0}
}
ENTRY %main (a: f32[8]) -> f32[] {
  %a = f32[8]{0} parameter(0)
  ROOT multiply_add_fusion = f32[] fusion(%a), kind=kLoop, calls=%fused_computation
}
"""


def _write(tmp_path, records):
    path = tmp_path / "plugins" / "profile" / "run1" / "host.trace.json.gz"
    path.parent.mkdir(parents=True)
    with gzip.open(path, "wt") as f:
        json.dump({"displayTimeUnit": "ns", "traceEvents": records}, f)
    return path


def _records():
    meta = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 9, "args": {"name": "tf_XLAEigen/3"}}]
    return meta + [
        {"ph": "X", "name": "multiply_add_fusion", "pid": 1, "tid": 9, "ts": 30.0, "dur": 5.0},
        {"ph": "X", "name": "PjitFunction(step)", "pid": 1, "tid": 7, "ts": 10.0, "dur": 40.0},
        {"ph": "X", "name": "end: multiply_add_fusion", "pid": 1, "tid": 9, "ts": 35.0, "dur": 0.0},
        {"ph": "X", "name": "a", "pid": 1, "tid": 8, "ts": 36.0, "dur": 1.0}]


def test_read_trace_names_threads_and_sorts_by_time(tmp_path):
    written = _write(tmp_path, _records())
    assert pr.trace_file(tmp_path) == written
    events = pr.read_trace(written)
    assert [(e.name, e.thread) for e in events] == [
        ("PjitFunction(step)", "python"), ("multiply_add_fusion", "tf_XLAEigen/3"),
        ("end: multiply_add_fusion", "tf_XLAEigen/3"), ("a", "8")]     # no name: its tid
    assert (events[1].start_us, events[1].duration_us) == (30.0, 5.0)


def test_instruction_names_of_hlo_text():
    assert pr.hlo_instruction_names(HLO) == {"p", "reduce.1", "a", "multiply_add_fusion"}


def test_kernels_are_instructions_of_the_program_not_end_markers(tmp_path):
    _write(tmp_path, _records())
    ran = pr.kernels(pr.read_trace(pr.trace_file(tmp_path)), HLO)
    assert [e.name for e in ran] == ["multiply_add_fusion", "a"]


def test_a_missing_trace_says_what_to_run(tmp_path):
    with pytest.raises(FileNotFoundError, match="jax.profiler.trace"):
        pr.trace_file(tmp_path)


def test_a_real_trace_of_a_jitted_step_shows_its_fused_kernels(jax8, tmp_path):
    jnp = jax8.numpy
    x = jnp.ones((64, 64))
    events, hlo = pr.profile_step(lambda x, w: jnp.tanh(x @ w).sum() * 2 + 1, (x, x),
                                  tmp_path, repeats=3)
    ran = pr.kernels(events, hlo)
    assert any("fusion" in e.name for e in ran)
    counts = {name: sum(e.name == name for e in ran) for name in {e.name for e in ran}}
    assert set(counts.values()) == {3}                         # each kernel once per call
    assert all(e.thread != "python" for e in ran)
    fig = pr.draw_profile(events, hlo)
    assert len(fig.axes[0].patches) == len(ran) + sum(e.name.startswith("PjitFunction")
                                                      for e in events)
