"""What the course notebooks share: the set-up cell, the version banner, answer checks.

Every notebook starts with the same set-up cell, :data:`SETUP_CELL` (a test keeps the
notebooks' copies identical to it), so where simpmd is installed from is configured in
one place. Exercises end with :func:`check`, which says what is wrong with an answer
instead of only "wrong": a shape, a dtype, a value on one device, or a unit or factor
that is off (bf16's 2 bytes per value is a classic).

How a lesson lays out an exercise, so that running it top to bottom (as CI does) never
overwrites the learner's answer and never shows the answer early:

* an exercise cell holds the learner's name set to a placeholder (``answer_1 = ...`` or a
  ``def`` that returns None), and the next cell checks it (``ex.check_x(answer_1)``); a
  placeholder prints "Not yet: ..." and raises nothing;
* checkers return a :class:`Verdict`: true or false like a bool, so ``assert`` works, but
  shown as nothing in Jupyter, since the verdict was already printed;
* the reference solutions sit in a "Solutions" section at the end of the lesson, under
  other names (``solution_exercise_1``), each checked with the same checker in an
  ``assert``, so CI proves that every reference solution passes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
import itertools
import math
import sys

import numpy as np
import os
import warnings
from ..jax.devices import use_jax_devices
from ..jax.crosscheck import quiet_jax
import textwrap

# Where notebooks opened outside a clone (Colab) install simpmd from: the one place to
# change it. SETUP_CELL and the README's "Open in Colab" links are built from it (tests keep
# every copy equal); `python scripts/set_repository.py URL` points all of them at a fork.
REPOSITORY = "https://github.com/simpmd/simpmd"

SETUP_CELL = f'''\
# Set-up (the same in every lesson). In a clone of the repository simpmd is already
# installed; elsewhere (Colab, a plain Jupyter) it is installed from the repository,
# without touching the jax that the runtime already has.
import importlib.util, subprocess, sys
if importlib.util.find_spec("simpmd") is None:
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                          "git+{REPOSITORY}"], capture_output=True, text=True)
    if pip.returncode != 0:
        raise SystemExit("Could not install simpmd from {REPOSITORY}: check that this "
                         "runtime is online and that the address is right, then run this cell again.")
import simpmd
simpmd.course.start()'''


def colab_url(notebook: str, repository: str = REPOSITORY, branch: str = "main") -> str:
    """The address that opens ``notebooks/<notebook>`` of ``repository`` in Colab."""
    path = repository.removeprefix("https://github.com/").removesuffix(".git")
    return f"https://colab.research.google.com/github/{path}/blob/{branch}/notebooks/{notebook}"


def start(device_count: int = 8):
    """Pick real JAX devices (accelerators if there are enough, else fake CPUs) and say so.

    Must run before anything imports jax. Also makes JAX's DeprecationWarnings errors
    when the course runs in CI, so that the day JAX deprecates an API the course uses,
    CI fails instead of the learner.
    """
    if os.environ.get("SIMPMD_STRICT_DEPRECATIONS"):
        warnings.filterwarnings("error", category=DeprecationWarning, module=r"jax(\..*)?$")
        warnings.filterwarnings("error", category=DeprecationWarning, message=r".*\bjax\b")
    use_jax_devices(device_count)       # prints its choice; simpmd.crosscheck reuses it


def banner():
    """One line: the versions and devices this notebook ran with."""
    import simpmd
    jax = sys.modules.get("jax")
    real = "jax not imported"
    if jax is not None:
        devices = jax.devices()
        real = f"jax {jax.__version__} on {len(devices)} {devices[0].platform} device(s)"
    platform = simpmd.platform()
    print(f"simpmd {simpmd.__version__} ({platform.hardware} x {len(platform.devices)} "
          f"simulated); {real}; numpy {np.__version__}")


def jax_outcome(call):
    """``(result, None)`` or ``(None, exception)`` of a call into JAX, keeping out of the
    notebook what some releases print as they raise (jax 0.12 prints the source line of a
    sharding error), so that a lesson's output reads the same on every release."""
    try:
        with quiet_jax():
            return call(), None
    except Exception as exc:
        return None, exc


def show_error(engine: str, run, first_line_only: bool = False) -> None:
    """Call ``run()`` and print the exception it raises, wrapped for reading.

    For JAX (an ``engine`` label starting with "jax"), whose errors change from release to
    release (the type, the words, and sometimes whether it refuses at all), what happened
    is printed on one line that starts "On this JAX (version):", which the course's tests
    leave out when they compare a lesson's output across JAX versions.
    """
    on_jax = engine.strip().startswith("jax")
    if on_jax:
        _, exc = jax_outcome(run)
    else:
        try:
            run()
            exc = None
        except Exception as raised:
            exc = raised
    lines = [line for line in str(exc).splitlines() if line.strip()] if exc else []
    lines = lines[:1] if first_line_only else lines
    if on_jax:
        version = getattr(sys.modules.get("jax"), "__version__", "?")
        what = f"raised {type(exc).__name__}: {' '.join(lines)}" if exc else "no error"
        print(f"{engine}:")
        print(f"    On this JAX ({version}): {what}")
    elif exc is None:
        print(f"{engine}: no error")
    else:
        print(f"{engine} raised {type(exc).__name__}:")
        for line in lines:
            print(textwrap.fill(line, 92, initial_indent="    ", subsequent_indent="    "))


# -- checking answers --------------------------------------------------------------------

class Verdict:
    """A check's outcome: true or false like a bool, but displayed as nothing in Jupyter.

    A check prints its verdict in words ("Correct: ..." / "Not yet: ..."); if it returned a
    bare bool, a check cell would also show ``False`` under those words.
    """

    __slots__ = ("ok",)

    def __init__(self, ok):
        self.ok = bool(ok)

    def __bool__(self):
        return self.ok

    def __eq__(self, other):
        return bool(self) == bool(other) if isinstance(other, (bool, Verdict)) else NotImplemented

    def __hash__(self):
        return hash(self.ok)

    def __repr__(self):
        return f"Verdict({self.ok})"

    def _ipython_display_(self):
        """Show nothing: the check already printed its verdict."""


def say(ok: bool, message: str) -> Verdict:
    """Print a check's verdict ("Correct: ..." or "Not yet: ...") and return it as a Verdict."""
    print(("Correct: " if ok else "Not yet: ") + message)
    return Verdict(ok)


def is_pmapped(answer) -> bool:
    """Whether ``answer`` is what ``simpmd.pmap(f, ...)`` returns, asked of the public
    function rather than of the engine's module layout."""
    import simpmd
    return isinstance(answer, type(simpmd.pmap(lambda x: x)))


def is_shard_mapped(answer) -> bool:
    """Whether ``answer`` is what ``simpmd.shard_map(f, ...)`` returns."""
    import simpmd
    probe = simpmd.shard_map(lambda x: x, mesh=simpmd.make_mesh((1,), ("i",)),
                             in_specs=simpmd.P(), out_specs=simpmd.P())
    return isinstance(answer, type(probe))


def is_placeholder(answer) -> bool:
    """True for the ``None`` / ``...`` an exercise cell starts with."""
    return answer is None or answer is Ellipsis


def error_summary(exc, *, first_sentence: bool = False) -> str:
    """'TypeName: first line of the message' of a learner's error, for a check's verdict.

    A simpmd DeviceError stands for what the body raised on a device, so that original
    exception is the one described. ``first_sentence`` keeps only the first sentence.
    """
    original = getattr(exc, "original", None) or exc
    text = (str(original).strip().splitlines() or [""])[0]
    if first_sentence:
        return f"{type(original).__name__}: {text.split('. ')[0].rstrip('.')}."
    return f"{type(original).__name__}: {text}"


def number_or_complaint(answer, what: str, unit: str):
    """``float(answer)``, or None after saying what is wrong with it (a placeholder, a
    string, an array, anything that is not one number)."""
    if is_placeholder(answer):
        say(False, f"{what} is still a placeholder; give a number of {unit}.")
        return None
    if isinstance(answer, (str, bytes)) or np.ndim(answer) != 0:
        say(False, f"{what} should be one number of {unit}, got {answer!r}.")
        return None
    try:
        return float(answer)
    except (TypeError, ValueError):
        say(False, f"{what} should be one number of {unit}, got {answer!r}.")
        return None


def check_against_mistakes(answer, expected, mistakes, *, what: str, unit: str,
                           rtol: float = 1e-6) -> Verdict:
    """Check a number, first naming the known mistake(s) whose value it equals.

    ``mistakes`` lists ``(wrong value, hint)`` pairs, each worked out from the same
    closed form with one thing done wrong (bf16 counted as 4 bytes, one ring phase
    instead of two, ...). Otherwise :func:`check` compares, with its unit hints.
    ``rtol`` is how close counts as equal, for the answer and for each mistake.
    """
    a = number_or_complaint(answer, what, unit)
    if a is None:
        return Verdict(False)
    if not math.isclose(a, expected, rel_tol=rtol):
        hints = [hint for wrong, hint in mistakes if math.isclose(a, wrong, rel_tol=rtol)]
        if hints:
            text = " Or ".join(h + "." for h in hints)
            return say(False, f"{what} = {a:g} {unit} is off. {text[0].upper()}{text[1:]}")
    return check(a, expected, what=what, unit=unit, rtol=rtol)


def check(answer, expected, *, what: str = "your answer", unit: str | None = None,
          rtol: float = 1e-6, atol: float = 0.0) -> Verdict:
    """Compare ``answer`` with ``expected``; print what is right or what is off.

    Returns a true :class:`Verdict` when they agree, so a reference solution can
    ``assert check(...)``.
    ``unit`` (e.g. ``"bytes"``, ``"s"``, ``"slots"``) turns on hints for numbers off by a
    factor that fits that unit: for bytes 2 or 4 (bytes per value), 8 (bits), KiB, MiB and
    GiB, kB, MB and GB; for seconds milliseconds, microseconds and nanoseconds; for other
    counts none, only the factor.
    """
    if answer is None or answer is Ellipsis:
        return say(False, f"{what} is still a placeholder; replace it with your answer.")
    if unit is not None:
        return _check_quantity(answer, expected, what, unit, rtol, atol)
    a = np.asarray(answer)
    e = np.asarray(expected)
    if a.shape != e.shape:
        return say(False, f"{what} has shape {a.shape}, expected {e.shape}.")
    if a.dtype.kind in "fciub" and e.dtype.kind in "fciub":
        if np.allclose(a, e, rtol=rtol, atol=atol, equal_nan=True):
            return say(True, f"{what} matches.")
        bad = np.argwhere(~np.isclose(a, e, rtol=rtol, atol=atol, equal_nan=True))
        first = tuple(int(i) for i in bad[0]) if a.ndim else ()
        where = f" at index {first}" if a.ndim else ""
        return say(False, f"{what} differs{where}: got {a[first] if a.ndim else a}, expected "
                    f"{e[first] if e.ndim else e} ({len(bad)} of {max(e.size, 1)} values differ).")
    ok = bool(np.all(a == e))
    return say(ok, f"{what} matches." if ok else f"{what} is {answer!r}, expected {expected!r}.")


def unit_kind(unit: str | None) -> str | None:
    """'bytes' (also bytes/s), 'seconds', or None for a unit whose slips are not about scale
    (slots, rows, values): which factor hints can explain an answer in that unit."""
    u = (unit or "").strip().lower()
    if u in ("b", "byte", "bytes", "b/s", "byte/s", "bytes/s"):
        return "bytes"
    if u in ("s", "sec", "second", "seconds"):
        return "seconds"
    return None


# The prefixes an answer in bytes may be given in by mistake.
_PREFIXES = [("KiB", 2**10, "1024"), ("MiB", 2**20, "2**20"), ("GiB", 2**30, "2**30"),
             ("kB", 10**3, "1000"), ("MB", 10**6, "a million"), ("GB", 10**9, "a billion")]
_NEAR_PREFIXES = [("KiB", "kB", 2**10 / 10**3), ("MiB", "MB", 2**20 / 10**6),
                  ("GiB", "GB", 2**30 / 10**9)]          # a binary prefix read as decimal
_BYTES_PER_VALUE = "bf16 and float16 take 2 bytes per value, float32 4, float64 8"

# (answer / expected, the factor's name, the quantity it fits, what it means). A ratio
# below 1 reads "too small": for bytes, often an answer given in a larger unit.
_FACTOR_HINTS = [
    (2, "2", "bytes", _BYTES_PER_VALUE),
    (1 / 2, "2", "bytes", _BYTES_PER_VALUE),
    (4, "4", "bytes", "float32 takes 4 bytes per value; check the bytes per value you used"),
    (1 / 4, "4", "bytes", "float32 takes 4 bytes per value; check the bytes per value you used"),
    (8, "8", "bytes", "that counts bits, not bytes (1 byte = 8 bits: bf16's 16 bits are 2 bytes)"),
    (1 / 8, "8", "bytes", "1 byte is 8 bits; check whether you divided by 8 once too often"),
    *[(1 / size, factor, "bytes", f"that is the number in {name}; give it in {{unit}} "
       f"(1 {name} = {size:,} bytes)") for name, size, factor in _PREFIXES],
    *[(size, factor, "bytes", f"check the unit: 1 {name} is {size:,} bytes")
      for name, size, factor in _PREFIXES],
    *[(r, f"about {ratio:.3f}", "bytes", f"{binary} vs {decimal}; use the question's prefix")
      for binary, decimal, ratio in _NEAR_PREFIXES for r in (ratio, 1 / ratio)],
    (10**3, "1000", "seconds", "that is milliseconds; the question asks for seconds"),
    (10**6, "a million", "seconds", "that is microseconds; the question asks for seconds"),
    (10**9, "a billion", "seconds", "that is nanoseconds; the question asks for seconds"),
    (1 / 10**3, "1000", "seconds", "check the unit (seconds vs milliseconds)"),
    (1 / 10**6, "a million", "seconds", "check the unit (seconds vs microseconds)"),
]


def factor_hint(answer: float, expected: float, unit: str | None, rtol: float = 1e-3) -> str | None:
    """'too small by a factor of 2**20: ...' when ``answer / expected`` is a factor that fits
    ``unit`` (see :func:`unit_kind`), else None."""
    kind = unit_kind(unit)
    if kind is None or answer == 0 or expected == 0 or (answer > 0) != (expected > 0):
        return None
    ratio = answer / expected
    for factor, name, fits, why in _FACTOR_HINTS:
        if fits == kind and math.isclose(ratio, factor, rel_tol=rtol):
            side = "too large" if ratio > 1 else "too small"
            return f"{side} by a factor of {name}: {why.format(unit=unit)}"
    return None


# An answer this close to the expected one is a near miss, not a slip of some factor: a
# factor printed to three figures would read "1".
NEAR_MISS = 0.01


def _round_significant(value: float, figures: int) -> float:
    return float(f"{value:.{figures}g}")


def near_miss(answer: float, expected: float) -> str | None:
    """'close but not exact (did you round?) ...' for an answer that is the expected one
    rounded (to a few significant figures, within 5 %) or that is within 1 % of it; else None.

    A checker says this instead of "off by a factor of 1.00", which names no slip.
    """
    if expected == 0 or answer == expected or (answer > 0) != (expected > 0):
        return None
    off = abs(answer / expected - 1)
    for figures in range(2, 7):
        rounded = _round_significant(expected, figures)
        if rounded != expected and off < 0.05 and math.isclose(answer, rounded, rel_tol=1e-9):
            return (f"close but not exact (did you round?): {_fmt(answer)} is the answer rounded to "
                    f"{figures} significant figures; give it exactly (write the calculation "
                    f"itself, and Python keeps every digit)")
    if off < NEAR_MISS:
        return (f"close but not exact (did you round?): within {100 * off:.2g} % of the answer, "
                f"but not equal to it; work it out without rounding the steps")
    return None


def off_by(answer: float, expected: float) -> str:
    """'off by a factor of 1.5', or the near-miss sentence where that factor would read 1."""
    return near_miss(answer, expected) or f"off by a factor of {answer / expected:.3g}"


def _check_quantity(answer, expected, what, unit, rtol, atol):
    try:
        a = float(answer)
    except (TypeError, ValueError):
        return say(False, f"{what} should be a number of {unit}, got {answer!r}.")
    e = float(expected)
    if math.isclose(a, e, rel_tol=rtol, abs_tol=atol):
        return say(True, f"{what} = {a:g} {unit}.")
    near = near_miss(a, e)
    if near:
        return say(False, f"{what} = {_fmt(a)} {unit} is {near}.")
    hint = factor_hint(a, e, unit, rtol=max(rtol, 1e-3))
    if hint:
        return say(False, f"{what} = {a:g} {unit} is {hint}.")
    return say(False, f"{what} = {a:g} {unit}, expected {e:g} {unit} "
                f"({off_by(a, e)})." if e else f"{what} = {a:g}, expected 0.")


# -- quantities made of factors ------------------------------------------------------------

def _fmt(value: float) -> str:
    """67,108,864 for whole numbers, 3.5e-05 otherwise."""
    return f"{int(value):,}" if float(value).is_integer() and abs(value) < 1e18 else f"{value:g}"


@dataclass
class Factor:
    """One factor of a quantity: its right value, and wrong values a learner may use,
    each with the hint that explains it, the most common slip first (when two
    combinations of slips explain an answer equally well, the one made of slips listed
    earlier is named)."""

    name: str
    right: float
    wrong: dict = field(default_factory=dict)     # wrong value -> hint


def _unit_factor(unit: str) -> Factor:
    """The slips of scale an answer in bytes can make, as one more factor of the quantity
    (so that a unit slip combines with another slip): a larger unit, or bits."""
    wrong = {1 / size: f"the question asks for {unit}, not {name} ({size:,} bytes)."
             for name, size, _ in _PREFIXES}
    wrong[8] = ("that counts bits; the question asks for bytes (1 byte = 8 bits, so bf16's "
                "16 bits are 2 bytes).")
    return Factor("unit", 1, wrong)


# At most this many factors are named as wrong at once: an answer that needs three slips to
# explain is more likely a slip the factors do not list, and a list of three hints misleads.
MAX_SLIPS = 2


def _explanations(a: float, factors) -> list[tuple[int, list[str]]]:
    """``(rank, hints)`` of every combination of at most :data:`MAX_SLIPS` wrong factors
    whose product is ``a``; ``rank`` adds up each slip's place in its factor's list."""
    expected = math.prod(f.right for f in factors)
    found = []
    for count in range(1, MAX_SLIPS + 1):
        for chosen in itertools.combinations(factors, count):
            right = math.prod(f.right for f in chosen)
            slips = [list(enumerate(f.wrong.items())) for f in chosen]
            for combo in itertools.product(*slips):
                value = expected / right * math.prod(v for _, (v, _) in combo)
                if math.isclose(value, a, rel_tol=1e-6):
                    found.append((sum(k for k, _ in combo), [h for _, (_, h) in combo]))
    return found


def _sentence(hint: str) -> str:
    """A hint ending with a full stop, so that two of them read as two sentences."""
    return hint if hint.rstrip().endswith((".", "!", "?")) else hint.rstrip() + "."


def _best_explanation(explanations) -> list[str] | None:
    """The hints to print: the explanation with the fewest slips; among several with one
    slip each, all of them (a reader can tell which one they made); among several
    combinations of two, the one of the earliest-listed slips, or none when that is a tie."""
    fewest = min(len(h) for _, h in explanations)
    simplest = [(r, h) for r, h in explanations if len(h) == fewest]
    texts = list(dict.fromkeys(_sentence(h[0]) for _, h in simplest))
    if fewest == 1:
        return texts
    best = min(r for r, _ in simplest)
    chosen = list(dict.fromkeys(" Also: ".join(map(_sentence, h)) for r, h in simplest if r == best))
    return chosen if len(chosen) == 1 else None


def check_quantity(answer, factors, *, what: str, unit: str) -> Verdict:
    """Check a number that is a product of ``factors`` and name every factor that is off.

    The expected value is the product of the right values. If ``answer`` equals the
    product with one or two factors replaced by their listed wrong values, the hints of
    exactly those factors are printed (the explanation with the fewest wrong factors; all
    of them when several single slips fit equally well, as bits and a device count of 8
    do; see :func:`_best_explanation`). A quantity in bytes also gets a factor for its
    unit (an answer in MiB, GB, ... or in bits), unless ``factors`` has one named "unit".
    Otherwise :func:`check` compares the numbers, says when the answer is a near miss, and
    looks for a factor that fits the unit on its own.
    """
    expected = math.prod(f.right for f in factors)
    if is_placeholder(answer):
        return say(False, f"{what} is still a placeholder; replace it with a number of {unit}.")
    a = number_or_complaint(answer, what, unit)
    if a is None:
        return Verdict(False)
    if math.isclose(a, expected, rel_tol=1e-6):
        return say(True, f"{what} = {_fmt(a)} {unit}.")
    if unit_kind(unit) == "bytes" and not any(f.name == "unit" for f in factors):
        factors = list(factors) + [_unit_factor(unit)]
    explanations = _explanations(a, factors)
    hints = _best_explanation(explanations) if explanations else None
    if hints:
        head = f"{what} = {_fmt(a)} {unit}, but the answer is {_fmt(expected)} {unit}: "
        if len(hints) == 1:
            return say(False, head + hints[0])
        return say(False, head + "one of these explains the difference: "
                   + " ".join(f"({i}) {h}" for i, h in enumerate(hints, 1)))
    return check(a, expected, what=what, unit=unit)
