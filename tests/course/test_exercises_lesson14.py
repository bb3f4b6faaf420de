"""The checks of lesson 14's exercises: right answers pass, typical wrong ones get the hint
that names what is off. Expectations are worked out here by hand or with plain NumPy."""
import numpy as np
import pytest

from simpmd.exercises import lesson14 as ex
from verdicts import verdict


# -- exercise 1: merge two partial softmaxes ---------------------------------------------------

def merge_right(a, b):
    (m1, l1, o1), (m2, l2, o2) = a, b
    m = np.maximum(m1, m2)
    c1, c2 = np.exp(m1 - m), np.exp(m2 - m)
    return m, c1 * l1 + c2 * l2, c1[:, None] * o1 + c2[:, None] * o2


def test_partial_softmax_is_a_softmax_in_pieces():
    s = np.array([[0.0, np.log(3.0)]])           # softmax = (1/4, 3/4)
    v = np.array([[4.0], [8.0]])
    m, l, o = ex.partial_softmax(s, v)
    assert m.tolist() == pytest.approx([np.log(3.0)])
    assert float(o[0, 0] / l[0]) == pytest.approx(1 + 6.0)     # 4/4 + 8*3/4


def test_merge_right_passes(capsys):
    assert ex.check_merge(merge_right)
    verdict(capsys, True, "full softmax")


def test_merge_right_by_hand_on_one_query(capsys):
    """Scores [0 | 1] and values [1 | 3]: softmax weights 1/(1+e), e/(1+e)."""
    a = ex.partial_softmax(np.array([[0.0]]), np.array([[1.0]]))
    b = ex.partial_softmax(np.array([[1.0]]), np.array([[3.0]]))
    m, l, o = merge_right(a, b)
    e = np.e
    assert float(m[0]) == 1.0 and float(l[0]) == pytest.approx(1 / e + 1)
    assert float(o[0, 0] / l[0]) == pytest.approx((1 + 3 * e) / (1 + e))


@pytest.mark.parametrize("wrong, hint", [
    (lambda a, b: (np.minimum(a[0], b[0]),) + merge_right(a, b)[1:], "smaller of the two maxima"),
    (lambda a, b: (np.maximum(a[0], b[0]), a[1] + b[1], merge_right(a, b)[2]), "added as they are"),
    (lambda a, b: (np.maximum(a[0], b[0]),
                   a[1] * np.exp(np.maximum(a[0], b[0]) - a[0]) + b[1] * np.exp(b[0] - np.maximum(a[0], b[0])),
                   merge_right(a, b)[2]), "wrong way round"),
    (lambda a, b: merge_right(a, b)[:2] + (merge_right(a, b)[2] / merge_right(a, b)[1][:, None],),
     "already divided by l"),
    (lambda a, b: merge_right(a, b)[:2] + (a[2] + b[2],), "o is o1 + o2"),
    (lambda a, b: merge_right(a, b)[:2] + (merge_right(a, b)[2][:, :1],), "shapes"),
    (lambda a, b: 1 / 0, "ZeroDivisionError"),
    (lambda a, b: None, "returned None"),
    (None, "placeholder"),
])
def test_merge_wrong(wrong, hint, capsys):
    assert not ex.check_merge(wrong)
    verdict(capsys, False, hint)


# -- exercises 2 and 3: bytes per device -------------------------------------------------------

S, H, D, PDEV, BF16 = 32768, 32, 128, 8, 2
BLOCK = S // PDEV * H * D * BF16             # one device's K (or V, or Q) in bytes: 32 MiB


def test_ring_bytes(capsys):
    assert BLOCK == 32 * 2**20
    assert ex.check_ring_bytes(2 * 7 * BLOCK)                  # K and V, 7 shifts: 448 MiB
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (7 * BLOCK, "not only K"),
    (2 * 8 * BLOCK, "7 shifts"),
    (2 * 7 * BLOCK * 2, "2 bytes per value"),
    (2 * 7 * BLOCK * PDEV, "not the whole sequence"),
    (2 * 7 * BLOCK // H, "multiply by heads"),
    (..., "placeholder"),
])
def test_ring_bytes_wrong(answer, hint, capsys):
    assert not ex.check_ring_bytes(answer)
    verdict(capsys, False, hint)


@pytest.mark.parametrize("answer, hints", [
    (448, ["not MiB (1,048,576 bytes)"]),                    # the lesson's own "448 MiB"
    (2 * 7 * BLOCK / 1e6, ["not MB"]),
    (2 * 7 * BLOCK / 2**30, ["not GiB"]),
    # bits: 8 times the bytes, which is also what forgetting to divide by 8 devices gives;
    # the check names both
    (2 * 7 * BLOCK * 8, ["one of these", "counts bits", "seq / devices"]),
    (2 * 7 * BLOCK * 2 / 2**20, ["2 bytes per value", "not MiB"]),
])
def test_ring_bytes_unit_slips(answer, hints, capsys):
    assert not ex.check_ring_bytes(answer)
    out = verdict(capsys, False, *hints)
    assert "9.54e-07" not in out


@pytest.mark.parametrize("answer, hint", [
    (3 * 7 * BLOCK, "Q stays where it is"),                  # Q, K and V around the ring
    (2 * 6 * BLOCK, "7 shifts, not 6"),                      # n - 2 shifts
])
def test_ring_bytes_named_slips_beyond_a_bare_factor(answer, hint, capsys):
    assert not ex.check_ring_bytes(answer)
    out = verdict(capsys, False, hint)
    assert "off by a factor" not in out


def test_ring_bytes_with_grouped_query_attention():
    """8 K/V heads of 128 (Llama 3-70B's GQA) instead of 32: a quarter of the bytes."""
    assert ex.check_ring_bytes(2 * 7 * 4096 * 8 * 128 * 2, kv_heads=8)
    assert not ex.check_ring_bytes(2 * 7 * BLOCK, kv_heads=8)


def test_ulysses_bytes_with_grouped_query_attention(capsys):
    """Q and the output with 32 heads, K and V with 8: 80 heads' worth of 4 all_to_alls."""
    right = (32 + 8 + 8 + 32) * 7 / 8 * 4096 * 128 * 2
    assert ex.check_ulysses_bytes(right, kv_heads=8)
    verdict(capsys, True)
    assert not ex.check_ulysses_bytes(4 * BLOCK * 7 / 8, kv_heads=8)
    verdict(capsys, False, "K and V have 8 heads")
    assert not ex.check_ulysses_bytes((32 + 8 + 8) * 7 / 8 * 4096 * 128 * 2, kv_heads=8)
    verdict(capsys, False, "sequence split too")


@pytest.mark.parametrize("answer", [14_680_064, 29_360_128, 58_720_256])
def test_no_hint_lists_garbled_alternatives(answer, capsys):
    """The answers a learner met with four alternatives, "Also: ... Also: ...": now at most
    one combination of two slips, or none."""
    ex.check_ulysses_bytes(answer)
    ex.check_ring_bytes(answer)
    for line in capsys.readouterr().out.splitlines():
        assert line.count("Also") <= 1 and "(4)" not in line


def test_ulysses_bytes_rounded_is_a_near_miss(capsys):
    assert not ex.check_ulysses_bytes(117.44e6)              # 112 MiB = 117,440,512 bytes
    out = verdict(capsys, False, "close but not exact (did you round?)")
    assert "factor of 1" not in out


def test_ulysses_bytes(capsys):
    assert ex.check_ulysses_bytes(4 * BLOCK * 7 / 8)          # 112 MiB
    verdict(capsys, True)


@pytest.mark.parametrize("answer, hint", [
    (3 * BLOCK * 7 / 8, "fourth all_to_all"),
    (4 * BLOCK, "sends (8 - 1)/8"),
    (4 * BLOCK * 7 / 8 * 2, "2 bytes per value"),
    (BLOCK * 7 / 8, "4, not 1"),                             # one all_to_all
    (4 * BLOCK * 7, "not 7 blocks"),
])
def test_ulysses_bytes_wrong(answer, hint, capsys):
    assert not ex.check_ulysses_bytes(answer)
    verdict(capsys, False, hint)


# -- exercises 4 and 5: capacity and dropped tokens ------------------------------------------

def test_capacity(capsys):
    assert ex.check_capacity(80)             # 1.25 x 4096 / 64 = 80 exactly
    verdict(capsys, True)
    assert ex.check_capacity(3, tokens=8, experts=4, capacity_factor=1.25)    # 2.5 -> 3
    verdict(capsys, True)


@pytest.mark.parametrize("answer, kwargs, hint", [
    (160, {}, "top-1"),                                  # k x cf x T/E with k = 2
    (160, {}, "has no k"),
    (64, {}, "the capacity factor multiplies it"),
    (5120, {}, "ivide by the number of experts"),
    (2.5, dict(tokens=8, experts=4, capacity_factor=1.25), "ound up"),
    (None, {}, "placeholder"),
])
def test_capacity_wrong(answer, kwargs, hint, capsys):
    assert not ex.check_capacity(answer, **kwargs)
    out = verdict(capsys, False, hint)
    assert "bytes" not in out                            # slots are not bytes


def keep_by_order(expert_of_token, num_experts, capacity, order):
    """A learner's way: with the tokens in ``order`` (sorted by expert), rank each within
    its expert and keep the first ``capacity``."""
    grouped = np.asarray(expert_of_token)[order]
    first = np.searchsorted(grouped, np.arange(num_experts))
    rank = np.empty(len(order), int)
    rank[order] = np.arange(len(order)) - first[grouped]
    return rank < capacity


def keep_by_sorting(expert_of_token, num_experts, capacity, kind=None):
    """Sorted with np.argsort, its default kind (unstable) unless ``kind`` says."""
    order = np.argsort(expert_of_token, **({"kind": kind} if kind else {}))
    return keep_by_order(expert_of_token, num_experts, capacity, order)


def keep_shuffled_ties(expert_of_token, num_experts, capacity):
    """An unstable sort made deterministic: ties in the order of (3 t + 1) mod T, neither
    first-come nor last-come."""
    t = np.arange(len(expert_of_token))
    order = np.lexsort(((3 * t + 1) % len(t), expert_of_token))
    return keep_by_order(expert_of_token, num_experts, capacity, order)


def drop_overfull_experts(expert_of_token, num_experts, capacity):
    return np.bincount(expert_of_token, minlength=num_experts)[expert_of_token] <= capacity


def test_keep_mask_by_sorting_stably_is_right(capsys):
    assert ex.check_keep_mask(lambda c, n, cap: keep_by_sorting(c, n, cap, kind="stable"))
    verdict(capsys, True)


@pytest.mark.parametrize("wrong, hints", [
    (drop_overfull_experts, ["drops every token of an expert that got more than"]),
    (keep_shuffled_ties, ["right number of tokens per expert, but not the first ones", "kind='stable'"]),
])
def test_keep_mask_names_the_slip(wrong, hints, capsys):
    assert not ex.check_keep_mask(wrong)
    out = verdict(capsys, False, *hints)
    assert "(1 = kept)" not in out                       # not the generic hint


def test_keep_mask_catches_numpys_default_unstable_argsort(capsys):
    case = np.array([(7 * t + t // 5) % 4 for t in range(64)])
    if np.array_equal(np.argsort(case), np.argsort(case, kind="stable")):
        pytest.skip("this NumPy's default argsort happens to keep ties in order here")
    assert not ex.check_keep_mask(keep_by_sorting)
    verdict(capsys, False, "kind='stable'")


def keep_right(expert_of_token, num_experts, capacity):
    onehot = np.eye(num_experts, dtype=int)[expert_of_token]
    position = (np.cumsum(onehot, axis=0) - 1)[np.arange(len(expert_of_token)), expert_of_token]
    return position < capacity


def test_keep_mask_by_hand():
    # experts 0 1 0 0 2 0 1, 2 slots each: the third and fourth token of expert 0 drop
    assert keep_right(np.array([0, 1, 0, 0, 2, 0, 1]), 3, 2).tolist() == \
        [True, True, True, False, True, False, True]


def test_keep_mask_right(capsys):
    assert ex.check_keep_mask(keep_right)
    verdict(capsys, True)


@pytest.mark.parametrize("wrong, hint", [
    (lambda c, n, cap: keep_right(c, n, cap + 1), "one too many"),
    (lambda c, n, cap: np.arange(len(c)) < cap, "counts all tokens together"),
    (lambda c, n, cap: keep_right(c[::-1], n, cap)[::-1], "LAST tokens"),
    (lambda c, n, cap: keep_right(c, n, cap)[:-1], "one entry per token"),
    (lambda c, n, cap: np.ones(len(c), bool), "expected"),
    (lambda c, n, cap: np.where(keep_right(c, n, cap), 2, 0), "True/False"),
    (lambda c, n, cap: c[len(c)], "IndexError"),
    (lambda c, n, cap: None, "returned None"),
    ("keep", "placeholder"),
])
def test_keep_mask_wrong(wrong, hint, capsys):
    assert not ex.check_keep_mask(wrong)
    verdict(capsys, False, hint)


# -- the lesson's claims about causal ring attention, counted here ----------------------------

def test_causal_pairs_total_136_and_the_zig_zag_order_gives_each_device_34():
    """16 tokens on 4 devices: query i sees keys j <= i, 16 x 17 / 2 = 136 pairs in all
    (8.5 blocks of 4 x 4); in the zig-zag order (chunks d and 7 - d of 2 tokens) every
    device's queries see 34 of them, in the consecutive order 10, 26, 42 and 58."""
    seq, n = 16, 4
    chunks = np.arange(seq).reshape(2 * n, -1)
    orders = {"consecutive": np.arange(seq),
              "zig-zag": np.concatenate([np.r_[chunks[d], chunks[2 * n - 1 - d]] for d in range(n)])}
    per_device = {}
    for name, order in orders.items():
        owned = order.reshape(n, -1)
        per_device[name] = [sum(int(k <= i) for i in owned[d] for k in range(seq)) for d in range(n)]
    assert sum(per_device["consecutive"]) == sum(per_device["zig-zag"]) == 136 == 16 * 17 // 2
    assert per_device["zig-zag"] == [34] * 4
    assert per_device["consecutive"] == [10, 26, 42, 58]
