"""The answer checks every lesson shares (simpmd.course): a number checked against its
known slips, a quantity made of factors, and the factor hints, each fitting its unit."""
import pytest

from simpmd import course
from verdicts import verdict


# -- check_quantity: the factor search -------------------------------------------------------

def test_check_quantity_names_each_wrong_factor(capsys):
    factors = [course.Factor("a", 3, {5: "hint A"}), course.Factor("b", 7, {11: "hint B"})]
    assert course.check_quantity(21, factors, what="q", unit="bytes")
    verdict(capsys, True)
    assert not course.check_quantity(35, factors, what="q", unit="bytes")
    assert "hint B" not in verdict(capsys, False, "hint A")
    assert not course.check_quantity(55, factors, what="q", unit="bytes")
    verdict(capsys, False, "hint A", "hint B")


def test_check_quantity_lists_equally_simple_explanations(capsys):
    factors = [course.Factor("a", 2, {4: "hint A"}), course.Factor("b", 4, {8: "hint B"})]
    assert not course.check_quantity(16, factors, what="q", unit="bytes")
    verdict(capsys, False, "one of these", "hint A", "hint B")


def test_check_quantity_placeholder_string_and_unknown_factor(capsys):
    factors = [course.Factor("a", 10)]
    assert not course.check_quantity(..., factors, what="q", unit="bytes")
    verdict(capsys, False, "placeholder")
    assert not course.check_quantity("ten", factors, what="q", unit="bytes")
    verdict(capsys, False, "number of bytes")
    assert not course.check_quantity("10", factors, what="q", unit="bytes")   # a string, not a number
    verdict(capsys, False, "one number of bytes")
    assert not course.check_quantity(20, factors, what="q", unit="bytes")     # course.check's hint
    verdict(capsys, False, "factor of 2")


# A quantity in bytes: 3 x 2**20 (three MiB), made of two factors.
MIB3 = [course.Factor("count", 3 * 2**19, {3 * 2**20: "hint count"}), course.Factor("bytes", 2)]


@pytest.mark.parametrize("answer, fragments", [
    (3, ["not MiB (1,048,576 bytes)"]),                        # the answer in MiB
    (3 * 2**20 / 10**6, ["not MB (1,000,000 bytes)"]),
    (3 * 2**20 / 2**30, ["not GiB"]),
    (3 * 2**20 / 1024, ["not KiB"]),
    (3 * 2**20 * 8, ["counts bits"]),                           # bits: the unit, not a factor of 8
    (6, ["hint count", "not MiB"]),                             # a slip and a unit slip together
])
def test_check_quantity_in_bytes_knows_the_units(capsys, answer, fragments):
    assert not course.check_quantity(answer, MIB3, what="q", unit="bytes")
    verdict(capsys, False, *fragments)


def test_check_quantity_lists_bits_beside_a_factor_of_8_it_cannot_tell_apart(capsys):
    factors = [course.Factor("devices", 1 / 8, {1: "hint: each device holds 1/8"}), course.Factor("n", 64)]
    assert not course.check_quantity(64, factors, what="q", unit="bytes")
    verdict(capsys, False, "one of these", "hint: each device holds 1/8", "counts bits")


def test_check_quantity_leaves_units_alone_for_counts(capsys):
    factors = [course.Factor("n", 3 * 2**20)]
    assert not course.check_quantity(3, factors, what="q", unit="slots")
    out = verdict(capsys, False, "off by a factor of")
    assert "MiB" not in out


# -- check: factor hints that fit the unit --------------------------------------------------

@pytest.mark.parametrize("answer, expected, unit, fragments", [
    (448, 448 * 2**20, "bytes", ["too small by a factor of 2**20", "in MiB"]),
    (28, 28 * 2**20, "bytes", ["in MiB"]),
    (0.5, 0.5 * 2**30, "bytes", ["in GiB"]),
    (1.5, 1.5e9, "bytes", ["in GB"]),
    (80, 10, "bytes", ["too large by a factor of 8", "bits"]),
    (20, 10, "bytes", ["factor of 2", "bytes per value"]),
    (368.9, 368.9e9, "bytes/s", ["in GB", "bytes/s"]),
    (2.5, 2.5e-3, "s", ["milliseconds"]),
    (2500, 2.5e-3, "s", ["microseconds"]),
])
def test_check_names_the_factor_that_fits_the_unit(capsys, answer, expected, unit, fragments):
    assert not course.check(answer, expected, what="q", unit=unit)
    verdict(capsys, False, *fragments)


@pytest.mark.parametrize("answer, expected, unit", [
    (160, 80, "slots"),       # twice the slots is not "bf16 takes 2 bytes"
    (8, 1, "rows"),           # not bits
    (2, 1, "s"),              # not bytes per value
])
def test_check_keeps_hints_to_the_units_they_fit(capsys, answer, expected, unit):
    assert not course.check(answer, expected, what="q", unit=unit)
    out = verdict(capsys, False, "off by a factor of")
    for wrong in ("bytes per value", "bits", "milliseconds", "MiB"):
        assert wrong not in out


def test_a_factor_of_1000_in_bytes_is_a_prefix_not_milliseconds(capsys):
    assert not course.check(2500, 2.5, what="q", unit="bytes")
    out = verdict(capsys, False, "1 kB is 1,000 bytes")
    assert "milliseconds" not in out


# -- check_against_mistakes ------------------------------------------------------------------

def test_check_against_mistakes_names_the_slip_then_falls_back_to_check(capsys):
    mistakes = [(20, "the slip")]
    assert course.check_against_mistakes(10, 10, mistakes, what="q", unit="bytes")
    verdict(capsys, True, "q = 10 bytes")
    assert not course.check_against_mistakes(20, 10, mistakes, what="q", unit="bytes")
    verdict(capsys, False, "q = 20 bytes is off. The slip.")
    assert not course.check_against_mistakes(80, 10, mistakes, what="q", unit="bytes")
    verdict(capsys, False, "bits")
    assert not course.check_against_mistakes([10], 10, mistakes, what="q", unit="bytes")
    verdict(capsys, False, "one number")
    assert course.check_against_mistakes(10.4, 10, mistakes, what="q", unit="bytes", rtol=0.05)
    verdict(capsys, True)


# -- near misses, and at most two slips named at once ------------------------------------------

@pytest.mark.parametrize("answer, expected", [
    (29.36e6, 29_360_128),          # 28 MiB, rounded to 4 figures
    (117.44e6, 117_440_512),        # 112 MiB, rounded to 5 figures
    (0.23, 7 / 31),                 # 0.2258 to two places: 1.9 % off, still a rounding
    (1.004e6, 1e6),                 # within 1 %, not a rounding
])
def test_a_near_miss_says_so_instead_of_a_factor_of_1(capsys, answer, expected):
    assert course.near_miss(answer, expected).startswith("close but not exact (did you round?)")
    assert not course.check(answer, expected, what="q", unit="bytes")
    out = verdict(capsys, False, "close but not exact (did you round?)")
    assert "factor of 1" not in out


@pytest.mark.parametrize("answer, expected", [(0.2, 7 / 31), (1.5e6, 1e6), (2e6, 1e6)])
def test_far_answers_are_not_near_misses(answer, expected):
    assert course.near_miss(answer, expected) is None


def test_three_slips_are_not_named(capsys):
    factors = [course.Factor("a", 2, {3: "hint A"}), course.Factor("b", 5, {7: "hint B"}),
               course.Factor("c", 11, {13: "hint C"})]
    assert not course.check_quantity(3 * 7 * 13, factors, what="q", unit="slots")
    out = verdict(capsys, False, "off by a factor of")
    assert "hint" not in out and "Also" not in out


def test_two_slips_are_named_once_the_earliest_listed_first(capsys):
    # 2 x 3 x 5 = 30, and 120 is a x 2 with b x 2 (b's second-listed slip) or a x 2 with
    # c x 2 (c's first-listed slip): the combination of earlier-listed slips is named
    factors = [course.Factor("a", 2, {4: "hint A"}), course.Factor("b", 3, {9: "B1", 6: "B2"}),
               course.Factor("c", 5, {10: "hint C"})]
    assert not course.check_quantity(120, factors, what="q", unit="slots")
    out = verdict(capsys, False, "hint A. Also: hint C.")
    assert "B2" not in out and "one of these" not in out


def test_tied_pairs_of_slips_name_none(capsys):
    # 30 -> 120 is a x 2 with b x 2, or a x 2 with c x 2 (each pair listed first): a tie
    factors = [course.Factor("a", 2, {4: "hint A"}), course.Factor("b", 3, {6: "hint B"}),
               course.Factor("c", 5, {10: "hint C"})]
    assert not course.check_quantity(120, factors, what="q", unit="slots")
    out = verdict(capsys, False)
    assert "Also" not in out and "hint" not in out
