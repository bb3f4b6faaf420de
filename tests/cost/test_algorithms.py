"""The message-level algorithms compute what the collectives compute, with the bytes the
literature says they move.

Closed forms (n = bytes one device holds, p devices): a ring all-reduce sends 2(p-1)/p * n
per device in 2(p-1) steps; an all-gather (p-1)/p of its output; a reduce-scatter (p-1)/p
of its input (NVIDIA nccl-tests, doc/PERFORMANCE.md; Patarasuk & Yuan, "Bandwidth optimal
all-reduce algorithms for clusters of workstations", JPDC 2009).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from simpmd import algorithms as A

PS = [1, 2, 3, 4, 5, 8, 16]
ONE_AXIS_ALL_REDUCE = ["ring", "bidirectional_ring", "line", "tree"]


def random_inputs(p, n, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    if np.issubdtype(dtype, np.integer):
        return [rng.integers(-100, 100, size=n).astype(dtype) for _ in range(p)]
    return [rng.standard_normal(n).astype(dtype) for _ in range(p)]


# -- the outputs equal the direct NumPy result -------------------------------------------

@pytest.mark.parametrize("name", ONE_AXIS_ALL_REDUCE)
@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("n", [0, 1, 7, 13, 64])   # 7, 13: not divisible by most p
def test_all_reduce_equals_sum(name, p, n):
    xs = random_inputs(p, n, seed=p * 100 + n)
    run = A.ALGORITHMS["all_reduce"][name](xs)
    expected = np.sum(xs, axis=0)
    for out in run.outputs:
        np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ONE_AXIS_ALL_REDUCE)
@pytest.mark.parametrize("op, reduce", [("sum", np.sum), ("max", np.max), ("min", np.min)])
def test_all_reduce_integers_exactly_and_other_reductions(name, op, reduce):
    xs = [x.reshape(3, 4) for x in random_inputs(5, 12, seed=1, dtype=np.int32)]
    run = A.ALGORITHMS["all_reduce"][name](xs, op=op)
    for out in run.outputs:
        assert out.shape == (3, 4) and out.dtype == np.int32
        np.testing.assert_array_equal(out, reduce(np.stack(xs), axis=0))


TORUS_SHAPES = [(1, 1), (1, 4), (4, 1), (2, 2), (2, 3), (3, 4), (4, 4), (2, 8)]


@pytest.mark.parametrize("shape", TORUS_SHAPES)
@pytest.mark.parametrize("wraparound", [(True, True), (False, False), (True, False)])
@pytest.mark.parametrize("n", [5, 96])
def test_torus_all_reduce_equals_sum(shape, wraparound, n):
    p = shape[0] * shape[1]
    xs = random_inputs(p, n, seed=n + p)
    run = A.torus_all_reduce(xs, shape, wraparound=wraparound)
    for out in run.outputs:
        np.testing.assert_allclose(out, np.sum(xs, axis=0), rtol=1e-12, atol=1e-12)
    assert run.mesh_shape == shape


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("wraparound", [True, False])
@pytest.mark.parametrize("shard_shape", [(3,), (2, 5), ()])
def test_all_gather_equals_stack(p, wraparound, shard_shape):
    rng = np.random.default_rng(p)
    xs = [rng.standard_normal(shard_shape) for _ in range(p)]
    run = A.ring_all_gather(xs, wraparound=wraparound)
    for out in run.outputs:
        np.testing.assert_array_equal(out, np.stack(xs))    # copies: exact


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("wraparound", [True, False])
@pytest.mark.parametrize("n", [1, 10, 48])
def test_reduce_scatter_equals_split_sum(p, wraparound, n):
    xs = random_inputs(p, n, seed=n)
    run = A.ring_reduce_scatter(xs, wraparound=wraparound)
    for out, piece in zip(run.outputs, np.array_split(np.sum(xs, axis=0), p)):
        np.testing.assert_allclose(out, piece, rtol=1e-12, atol=1e-12)


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 12), n=st.integers(0, 40), seed=st.integers(0, 2**16))
def test_any_length_works(p, n, seed):
    """Uneven lengths are accepted (cut like np.array_split), never silently wrong."""
    xs = random_inputs(p, n, seed=seed)
    expected = np.sum(xs, axis=0)
    for name in ONE_AXIS_ALL_REDUCE:
        for out in A.ALGORITHMS["all_reduce"][name](xs).outputs:
            np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


# -- the bytes and steps equal the closed forms -----------------------------------------

@pytest.mark.parametrize("p", PS)
def test_ring_all_reduce_bytes_and_steps(p):
    xs = random_inputs(p, 32 * 3 * 5 * 7, dtype=np.float32)   # halves divide by every p
    n = xs[0].nbytes
    two_way = 2 * (p // 2) if p > 2 else 2 * (p - 1)   # floor(p/2) rounds per phase
    for run, steps in ((A.ring_all_reduce(xs), 2 * (p - 1)),
                       (A.bidirectional_ring_all_reduce(xs), two_way)):
        assert run.num_steps == steps
        assert np.all(run.bytes_sent == 2 * (p - 1) * n // p)
        assert np.all(run.bytes_received == 2 * (p - 1) * n // p)


@pytest.mark.parametrize("p", PS)
def test_ring_all_reduce_talks_to_neighbours_only(p):
    run = A.ring_all_reduce(random_inputs(p, 4 * p))
    for step in run.steps:
        assert len(step.messages) == p                # everyone sends exactly one piece
        assert all(m.dst == (m.src + 1) % p for m in step.messages)
    run = A.bidirectional_ring_all_reduce(random_inputs(p, 4 * p))
    for step in run.steps:
        assert all(m.dst in ((m.src + 1) % p, (m.src - 1) % p) for m in step.messages)


@pytest.mark.parametrize("p", PS)
def test_line_all_reduce_bytes(p):
    """Hand count on a line: the reduce-scatter sends p-1 pieces from every device; the
    all-gather sends 1 piece from each end and p+1 from each middle device (it forwards
    both ways). Pieces are n/p bytes."""
    xs = random_inputs(p, 32 * 3 * 5 * 7, dtype=np.float32)
    n = xs[0].nbytes
    run = A.line_all_reduce(xs)
    assert run.num_steps == 2 * (p - 1)
    piece = n // p
    expected = [(p - 1) * piece + (1 if i in (0, p - 1) else p + 1) * piece for i in range(p)]
    if p == 1:
        expected = [0]
    np.testing.assert_array_equal(run.bytes_sent, expected)
    assert run.bytes_sent.sum() == 2 * (p - 1) * n   # every piece crosses 2(p-1) links in all
    for step in run.steps:                           # neighbours only, no wraparound link
        assert all(abs(m.dst - m.src) == 1 for m in step.messages)


@pytest.mark.parametrize("p", PS)
def test_tree_all_reduce_bytes_and_steps(p):
    xs = random_inputs(p, 24)
    n = xs[0].nbytes
    run = A.tree_all_reduce(xs)
    levels = math.ceil(math.log2(p)) if p > 1 else 0
    assert run.num_steps == 2 * levels
    assert run.bytes_sent.sum() == 2 * (p - 1) * n    # p-1 sends up, p-1 down, whole buffers
    assert run.bytes_sent.max(initial=0) == levels * n  # the root sends to one child per level


@pytest.mark.parametrize("p", PS)
def test_all_gather_bytes(p):
    xs = random_inputs(p, 6, dtype=np.float32)
    out_bytes = p * xs[0].nbytes                      # N: the gathered output
    run = A.ring_all_gather(xs)
    assert run.num_steps == p - 1
    assert np.all(run.bytes_sent == (p - 1) * out_bytes // p)
    assert np.all(run.bytes_received == (p - 1) * out_bytes // p)


@pytest.mark.parametrize("p", PS)
@pytest.mark.parametrize("wraparound", [True, False])
def test_reduce_scatter_bytes(p, wraparound):
    xs = random_inputs(p, 16 * 3 * 5 * 7, dtype=np.float32)
    n = xs[0].nbytes
    run = A.ring_reduce_scatter(xs, wraparound=wraparound)
    assert run.num_steps == p - 1
    assert np.all(run.bytes_sent == (p - 1) * n // p)   # balanced on a line as on a ring


@pytest.mark.parametrize("shape", [(2, 2), (3, 3), (4, 4), (2, 4), (3, 5)])
def test_torus_all_reduce_bytes_and_steps(shape):
    """With wraparound, every device sends 2(p-1)/p * n, as on a ring, in only
    2 floor(rows/2) + 2 floor(cols/2) steps (an axis of 2 has no ring: 1 step)."""
    rows, cols = shape
    p = rows * cols
    xs = random_inputs(p, 4 * p * 3, dtype=np.float32)
    n = xs[0].nbytes
    run = A.torus_all_reduce(xs, shape)
    per_axis = [q // 2 if q > 2 else q - 1 for q in shape]
    assert run.num_steps == 2 * sum(per_axis)
    assert np.all(run.bytes_sent == 2 * (p - 1) * n // p)
    for step in run.steps:                            # torus neighbours only
        for m in step.messages:
            (r1, c1), (r2, c2) = divmod(m.src, cols), divmod(m.dst, cols)
            assert (r1 == r2 and (c2 - c1) % cols in (1, cols - 1)) or \
                   (c1 == c2 and (r2 - r1) % rows in (1, rows - 1))


@pytest.mark.parametrize("p", [3, 5, 8])
def test_uneven_sizes_move_every_element_the_same_number_of_times(p):
    xs = random_inputs(p, 7 * p + 3, dtype=np.float32)
    run = A.ring_all_reduce(xs)
    n = xs[0].nbytes
    assert run.bytes_sent.sum() == 2 * (p - 1) * n
    itemsize = 4
    low, high = 2 * (p - 1) * (n // itemsize // p), 2 * (p - 1) * -(-n // itemsize // p)
    assert np.all((low * itemsize <= run.bytes_sent) & (run.bytes_sent <= high * itemsize))


# -- the record a drawing reads ---------------------------------------------------------

def test_states_frames_and_chunks():
    xs = random_inputs(4, 8)
    run = A.ring_all_reduce(xs)
    assert len(run.states) == run.num_steps + 1
    for before, x in zip(run.states[0], xs):
        np.testing.assert_array_equal(before, x)
    for after, out in zip(run.states[-1], run.outputs):
        np.testing.assert_array_equal(after, out)
    assert run.chunks == [(0, 2), (2, 4), (4, 6), (6, 8)]
    first = run.steps[0]
    assert first.label == "reduce-scatter 1/3" and run.steps[-1].label == "all-gather 3/3"
    m = first.messages[0]
    assert m.kind == "reduce" and m.nbytes == 2 * 8 and m.chunk in range(4)
    np.testing.assert_array_equal(m.payload, xs[m.src][slice(*run.chunks[m.chunk])])
    assert "ring all-reduce over 4 device(s)" in repr(run)


def test_messages_of_a_step_are_simultaneous():
    """A step's messages carry the values from before the step, never each other's."""
    xs = [np.array([float(i)]) for i in range(3)]
    rounds = [("swap", [A.Send(0, 1, 0, 1, "copy"), A.Send(1, 0, 0, 1, "copy")])]
    run = A.play("swap", "collective_permute", xs, rounds)
    assert [float(o[0]) for o in run.outputs] == [1.0, 0.0, 2.0]


def test_single_device_does_nothing():
    run = A.ring_all_reduce([np.arange(5.0)])
    assert run.num_steps == 0 and run.bytes_sent.tolist() == [0]
    np.testing.assert_array_equal(run.outputs[0], np.arange(5.0))


# -- errors say what to do ---------------------------------------------------------------

def test_errors():
    with pytest.raises(ValueError, match="at least one device"):
        A.ring_all_reduce([])
    with pytest.raises(ValueError, match="device 1 holds float64\\[3\\].*same shape"):
        A.ring_all_reduce([np.zeros(2), np.zeros(3)])
    with pytest.raises(ValueError, match="2x3 torus has 6 devices, but 4"):
        A.torus_all_reduce(random_inputs(4, 4), (2, 3))
    with pytest.raises(ValueError, match="unknown reduction 'prod'"):
        A.tree_all_reduce(random_inputs(2, 2), op="prod")
