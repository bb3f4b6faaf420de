"""The columnar log: what `trace.collectives()` and `trace.device(k)` read from the stacked
records equals the per-device events written out the long way, field by field, and the
numbers in it are the hand-worked ones."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd import P, lax

X8 = np.arange(8.0)
RING = [(k, (k + 1) % 8) for k in range(8)]


def _programs():
    mesh = simpmd.make_mesh((2, 4), ("a", "b"))
    return {
        "psum and pmax": (simpmd.pmap(lambda v: lax.psum(v, "i") + lax.pmax(v, "i"),
                                      axis_name="i"), X8),
        "ppermute": (simpmd.pmap(lambda v: lax.ppermute(v, "i", RING), axis_name="i"), X8),
        "groups": (simpmd.pmap(lambda v: lax.psum(v, "i", axis_index_groups=[[0, 1, 2, 3],
                                                                               [4, 5, 6, 7]]),
                               axis_name="i"), X8),
        "nested pmap": (simpmd.pmap(simpmd.pmap(lambda v: lax.psum(v, "j") * lax.psum(v, "i"),
                                                axis_name="j"), axis_name="i"),
                        X8.reshape(2, 4)),
        "grad": (simpmd.pmap(lambda v: simpmd.grad(lambda w: lax.psum((w * w).sum(), "i"))(v),
                             axis_name="i"), X8.reshape(8, 1)),
        "gather and scatter": (simpmd.pmap(lambda v: lax.all_gather(v, "i").sum()
                                           + lax.psum_scatter(snp.ones(8), "i"),
                                           axis_name="i"), X8),
        "shard_map all_to_all": (simpmd.shard_map(
            lambda v: lax.psum(v, "a") + lax.all_to_all(v, "b", 1, 1, tiled=True), mesh=mesh,
            in_specs=P("a", "b"), out_specs=P("a", "b")), np.arange(128.0).reshape(4, 32)),
    }


def _same(a, b):
    assert a.__dataclass_fields__ == b.__dataclass_fields__
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if name in ("inputs", "outputs"):
            assert len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y)), name
        else:
            assert x == y, (name, x, y)


@pytest.mark.parametrize("name", list(_programs()))
def test_collectives_read_from_the_records_equal_the_written_out_events(name):
    f, x = _programs()[name]
    f(x)
    f(x)                                  # a cached call logs the same way as the first
    trace = f.trace
    groups = [list(g) for g in trace.collectives()]         # before anything is written out
    by_step = {}
    for e in trace.events:                                  # now every event is written out
        if e.kind == "collective":
            by_step.setdefault(e.step, []).append(e)
    expected = [sorted(v, key=lambda e: e.member) for _, v in sorted(by_step.items())]
    assert [len(g) for g in groups] == [len(g) for g in expected]
    for got, want in zip(groups, expected):
        for a, b in zip(got, want):
            _same(a, b)


@pytest.mark.parametrize("name", ["psum and pmax", "nested pmap", "shard_map all_to_all"])
def test_one_device_read_from_the_records_equals_its_written_out_events(name):
    f, x = _programs()[name]
    f(x)
    trace = f.trace
    device = 5
    one = list(trace.device(device).events)
    everything = [e for e in trace.events if e.device == device]
    assert len(one) == len(everything) > 0
    for a, b in zip(one, everything):
        _same(a, b)


def test_a_psum_group_by_hand():
    """psum of one float over 8 devices, then pmax: two groups of 8, members in device
    order, each after the device's one 'receive' event, ring bytes 2(p-1)/p * 4 = 7 (the
    float64 input is computed as float32, as JAX does without x64)."""
    f, x = _programs()["psum and pmax"]
    f(x)
    psum, pmax = f.trace.collectives()
    assert len(psum) == len(pmax) == 8
    assert [e.op for e in (psum[0], pmax[0])] == ["psum", "pmax"]
    assert [e.device for e in psum] == list(range(8)) and psum[3].group == tuple(range(8))
    assert [e.seq for e in psum] == [1] * 8 and [e.seq for e in pmax] == [2] * 8
    assert psum[2].bytes_sent == psum[2].bytes_received == 7
    assert float(psum[6].inputs[0]) == 6.0 and float(psum[6].outputs[0]) == 28.0
    assert psum[-1].program == "device 7" and psum[1:3][1].member == 2


@pytest.mark.parametrize("read", ["trace.events", "trace.collectives()"])
def test_reading_the_log_does_work_linear_in_the_devices(read, monkeypatch):
    """Writing out every event of a pmean over all devices labels each program a bounded
    number of times: 4x the devices, at most about 4x the labels (made once per member,
    the group's labels cost n per member and reading grew as n squared: 148 s at 16384
    devices in benchmarks/dp_step.py). Counted, not timed."""
    from simpmd.core.run import Run
    calls = []
    label = Run.label
    monkeypatch.setattr(Run, "label", lambda self, k: calls.append(k) or label(self, k))

    def labels(n):
        simpmd.set_device_count(n)
        f = simpmd.pmap(lambda v: v - lax.pmean(v, "i"), axis_name="i")
        f(np.ones((n, 2), np.float32))
        calls.clear()
        events = (list(f.trace.events) if read == "trace.events"
                  else [e for g in f.trace.collectives() for e in g])
        assert len(events) == (3 * n if read == "trace.events" else n)
        return len(calls)
    small, large = labels(64), labels(256)       # (conftest puts the device count back)
    assert small >= 64 and large <= 4.5 * small, (small, large)
