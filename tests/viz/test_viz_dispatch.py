"""simpmd.viz.dispatch: the all_to_all matrix and the ppermute chain draw what the trace holds.

Expectations are worked out by hand from the programs (who sends which ids where, which
block sits where after k shifts of a ring), never read back from simpmd."""
import numpy as np
import pytest

import simpmd
from simpmd import lax, P

viz = pytest.importorskip("simpmd.viz")
pytest.importorskip("matplotlib")
from simpmd.viz.canvas import tagged  # noqa: E402


def cells(fig, role):
    return {a.get_gid().split(":", 2)[2]: a.get_label() for a in tagged(fig, role)}


def routed_ids(p=4, t=4):
    """Each device holds t token ids d*t .. d*t+t-1 and sends token j to device j % p,
    in a buffer of 2 slots per destination padded with -1."""
    def body(ids):
        return lax.all_to_all(ids, "i", split_axis=0, concat_axis=0, tiled=True)
    buffers = np.full((p, p, 2), -1, dtype=np.int32)
    for d in range(p):
        for j in range(t):
            token = d * t + j
            dest = j % p
            slot = int((buffers[d, dest] >= 0).sum())
            buffers[d, dest, slot] = token
    f = simpmd.shard_map(body, mesh=simpmd.make_mesh((p,), ("i",)), in_specs=P("i"),
                         out_specs=P("i"))
    f(buffers.reshape(p * p, 2))
    return f.trace


def test_dispatch_matrix_lists_what_each_sender_puts_in_each_block():
    m = viz.dispatch_matrix(routed_ids(), empty=-1)
    # device d sends token d*4 + j to device j (one token per destination here)
    for s in range(4):
        for d in range(4):
            assert m[s][d].tolist() == [s * 4 + d]
    raw = viz.dispatch_matrix(routed_ids())
    assert raw[0][1].tolist() == [1, -1]          # the padding is there unless asked away


def test_draw_dispatch_cells_held_back_column_and_empty_cells():
    trace = routed_ids()
    fig = viz.draw_dispatch(trace, empty=-1, held_back=[[], [5], [], [12, 13]],
                            labels=("device", "expert"))
    got = cells(fig, "cell")
    assert len(got) == 16
    assert got["2->3"] == "11" and got["0->0"] == "0"
    assert cells(fig, "held_back") == {"0": "", "1": "5", "2": "", "3": "12 13"}
    texts = [t.get_text() for t in fig.findobj(lambda a: type(a).__name__ == "Text")]
    assert "to expert 2" in texts and "not sent" in texts


def test_draw_dispatch_held_back_takes_labels():
    """A dropped token can say which expert it wanted: labels are drawn as they are."""
    fig = viz.draw_dispatch(routed_ids(), empty=-1, held_back=[[], ["5→1"], [], ["12→0", "13→0"]])
    assert cells(fig, "held_back") == {"0": "", "1": "5→1", "2": "", "3": "12→0 13→0"}


def test_draw_dispatch_refuses_what_is_not_an_all_to_all_and_wrong_held_back():
    f = simpmd.pmap(lambda x: lax.psum(x, "i"), axis_name="i")
    f(np.arange(4.0))
    with pytest.raises(ValueError, match="no 'all_to_all'"):
        viz.draw_dispatch(f.trace)
    with pytest.raises(ValueError, match="not an all_to_all"):
        viz.draw_dispatch(f.trace, call=0)
    with pytest.raises(ValueError, match="one list per sender"):
        viz.draw_dispatch(routed_ids(), held_back=[[1]])


def test_a_ring_of_shifts_moves_block_k_to_device_k_plus_steps():
    p = 4
    perm = [(j, (j + 1) % p) for j in range(p)]

    def body(x):
        for _ in range(p - 1):
            x = lax.ppermute(x, "i", perm=perm)
        return x
    f = simpmd.shard_map(body, mesh=simpmd.make_mesh((p,), ("i",)), in_specs=P("i"),
                         out_specs=P("i"))
    f(np.arange(8.0).reshape(p, 2) * 10)
    stages = viz.permute_steps(f.trace)
    assert stages == [[(d - k) % p for d in range(p)] for k in range(p)]
    fig = viz.draw_permute_steps(f.trace, block_labels=["K0", "K1", "K2", "K3"])
    held = cells(fig, "holds")
    assert held["0:2"] == "K2" and held["1:0"] == "K3" and held["3:1"] == "K2"
    assert len(tagged(fig, "message")) == 3 * p


def test_a_value_that_matches_no_starting_block_is_drawn_as_unknown():
    def body(x):
        return lax.ppermute(x + 1.0, "i", perm=[(0, 1), (1, 0)])     # a computed value moves
    f = simpmd.pmap(body, axis_name="i")
    f(np.arange(2.0))
    assert viz.permute_steps(f.trace) == [[0, 1], [1, 0]]    # x + 1 itself is the first input
    g = simpmd.pmap(lambda x: lax.ppermute(lax.ppermute(x, "i", perm=[(0, 1)]) * 3.0, "i",
                                            perm=[(0, 1), (1, 0)]), axis_name="i")
    g(np.array([1.0, 2.0]))
    # after the first call device 0 holds zeros (nobody sent); after the second, device 1
    # holds 3 x (device 0's zeros) = 0 and device 0 holds 3 x 1.0 = 3.0: neither a start block
    assert viz.permute_steps(g.trace) == [[0, 1], [None, 0], [None, None]]


def test_dispatch_totals_count_what_each_receiver_got_of_its_slots():
    # routed_ids: 16 tokens, token d*4 + j to device j, so every device receives 4 tokens
    # in 4 senders x 2 slots; value_text writes each id as the test asks
    fig = viz.draw_dispatch(routed_ids(), empty=-1, totals=True, value_text=lambda v: f"t{v}")
    assert cells(fig, "received") == {str(d): "4 of 8 slots" for d in range(4)}
    assert cells(fig, "cell")["1->2"] == "t6"
