"""Answer checks for lesson 9: debugging SPMD programs.

Each checker prints what is right or what is off (which device, which collective, which
pair of a permutation) and returns True or False, so a reference solution can ``assert``
it. Expected values are NumPy closed forms or worked out by hand from the programs in the
lesson, never computed by running a solution.
"""
from __future__ import annotations

import numpy as np
from simpmd.course import is_placeholder as _placeholder, say as _say


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else ""


# -- exercise 1: the divergent program, fixed ---------------------------------------------

XS = np.array([3.0, -1.0, 4.0, 1.0, -5.0, 9.0, 2.0, -6.0], dtype=np.float32)


def expected_mixed() -> np.ndarray:
    """Device 3 gets the maximum over the axis, every other device the sum."""
    return np.where(np.arange(8) == 3, XS.max(), XS.sum()).astype(np.float32)


def check_fixed_mixed(fn) -> bool:
    """Exercise 1: ``fn`` (mapped over axis 'i' on 8 devices) gives device 3 the pmax and
    every other device the psum, on simpmd and on real JAX."""
    import simpmd

    if _placeholder(fn):
        return _say(False, "fixed_mixed is still a placeholder; define it as a function of x.")
    if not callable(fn):
        return _say(False, f"fixed_mixed should be a function of x, got {type(fn).__name__}.")
    try:
        out = simpmd.pmap(fn, axis_name="i")(XS)
    except simpmd.TracerBoolConversionError:
        return _say(False, "the function still branches in Python (if/else) on a device value, "
                    "which JAX refuses. Let every device call both collectives and pick one "
                    "result with snp.where(lax.axis_index('i') == 3, ..., ...).")
    except (simpmd.TracerIntegerConversionError, simpmd.ConcretizationTypeError):
        return _say(False, "the function turns a device value into a Python number (int(), an "
                    "index into a list), which JAX refuses. Choose between values with "
                    "snp.where instead.")
    except simpmd.UnboundAxisError as exc:
        return _say(False, f"{_first_line(exc)} (the mapped axis is named 'i').")
    except simpmd.TracerArrayConversionError:
        return _say(False, "the function applies a NumPy function (np.exp, np.where, ...) to a "
                    "device value, which real JAX refuses. Call it through simpmd.numpy "
                    "(snp.where, snp.exp), which works on both engines.")
    except (simpmd.DivergenceError, simpmd.DeadlockError) as exc:
        return _say(False, f"the devices still reach different collectives: "
                    f"{type(exc).__name__}: {_first_line(exc)}")
    except simpmd.SimpmdError as exc:
        return _say(False, f"simpmd raised {type(exc).__name__}: {_first_line(exc)}")
    except Exception as exc:                     # the learner's own code failed
        return _say(False, f"fixed_mixed raised {type(exc).__name__}: {_first_line(exc)}")
    if out is None:
        return _say(False, "fixed_mixed returned None; return the value each device should hold.")
    a = np.asarray(out, dtype=np.float64)
    e = expected_mixed().astype(np.float64)
    total, top = float(XS.sum()), float(XS.max())
    if a.shape != e.shape:
        return _say(False, f"the result has shape {a.shape}; each of the 8 devices should return "
                    f"one number (the mapped result has shape (8,)).")
    if not np.allclose(a, e):
        if np.allclose(a, total):
            return _say(False, f"every device holds the sum ({total:g}); device 3 should hold "
                        f"the maximum ({top:g}).")
        if np.allclose(a, top):
            return _say(False, f"every device holds the maximum ({top:g}); only device 3 should, "
                        f"the others hold the sum ({total:g}).")
        if np.isclose(a[3], total) and np.allclose(np.delete(a, 3), top):
            return _say(False, "sum and maximum are swapped: device 3 should hold the maximum "
                        "and the others the sum.")
        k = int(np.argwhere(~np.isclose(a, e))[0][0])
        return _say(False, f"device {k} holds {a[k]:g}, expected {e[k]:g} "
                    f"({'the maximum' if k == 3 else 'the sum'} over the 8 devices).")
    report = simpmd.crosscheck(fn, XS, axis_name="i")
    if not report.ok:
        print(report)
        return _say(False, "simpmd gives the right values but real JAX does not agree (see the "
                    "report above): use simpmd.lax and simpmd.numpy (snp) in the body, which "
                    "work on both engines.")
    return _say(True, f"device 3 holds the maximum ({top:g}), the others the sum ({total:g}), "
                "and real JAX agrees.")


# -- exercise 2: reading a failed run -----------------------------------------------------

# Worked out by hand from the program in the lesson: every device joins the psum over all
# 8 devices; then device 2 divides by its empty shard's size and raises; the pmax runs in
# groups [0, 1, 2, 3] and [4, 5, 6, 7], so devices 4-7 complete theirs and finish, while
# 0, 1 and 3 wait in theirs for device 2, which never comes.
FAILED_DEVICE = 2
WAITING = (0, 1, 3)
WAITING_IN = "pmax"


def check_failed_run(answer) -> bool:
    """Exercise 2: ``{'failed_device': int, 'waiting': [ids], 'collective': name}``."""
    if _placeholder(answer):
        return _say(False, "answer is still a placeholder; replace it with the dictionary.")
    if not isinstance(answer, dict):
        return _say(False, "answer should be a dict with keys 'failed_device', 'waiting' and "
                    "'collective'.")
    missing = [k for k in ("failed_device", "waiting", "collective") if k not in answer]
    if missing:
        return _say(False, f"answer is missing the key(s) {missing}.")
    failed, waiting, op = answer["failed_device"], answer["waiting"], answer["collective"]
    if _placeholder(failed) or _placeholder(waiting) or _placeholder(op):
        return _say(False, "some entries are still placeholders (...).")
    try:
        failed = int(failed)
        waiting_set = {int(i) for i in waiting}
    except (TypeError, ValueError):
        return _say(False, "'failed_device' should be a device id and 'waiting' a list of ids.")
    if failed != FAILED_DEVICE:
        return _say(False, f"device {failed} is not the one that raised: the error's .device "
                    f"attribute (and the 'error' event with the exception) names it.")
    if FAILED_DEVICE in waiting_set:
        return _say(False, f"device {FAILED_DEVICE} raised an exception: it does not wait for "
                    f"anything. List only the devices left waiting at a collective.")
    others = waiting_set - set(WAITING)
    if others & {4, 5, 6, 7}:
        return _say(False, f"devices {sorted(others & {4, 5, 6, 7})} did not wait: the pmax uses "
                    f"axis_index_groups, and devices 4-7 form their own group, which completed "
                    f"(look for their pmax events in trace.collectives()).")
    if waiting_set != set(WAITING):
        return _say(False, f"the devices left waiting are the ones with a 'still waiting in ...' "
                    f"event in the error's trace; you listed {sorted(waiting_set)}.")
    if str(op).strip().lower() != WAITING_IN:
        if str(op).strip().lower() == "psum":
            return _say(False, "the psum completed: all 8 devices joined it before device 2 "
                        "failed. Which collective do the 'still waiting in ...' events name?")
        return _say(False, f"{op!r} is not the collective they wait in; read the 'still waiting "
                    f"in ...' events of the trace.")
    return _say(True, f"device {FAILED_DEVICE} raised; devices {list(WAITING)} wait in "
                f"{WAITING_IN} for it, while its other group (4-7) completed.")


# -- exercise 3: a ring shift that ppermute accepts ----------------------------------------

RING_SIZE = 4


def check_ring_perm(perm) -> bool:
    """Exercise 3: ``perm`` sends device j's value to device (j + 1) % 4, for every j."""
    if _placeholder(perm):
        return _say(False, "perm is still a placeholder; give a list of (source, destination) "
                    "pairs.")
    try:
        pairs = [(int(s), int(d)) for s, d in perm]
    except (TypeError, ValueError):
        return _say(False, "perm should be a list of (source, destination) pairs of ints.")
    n = RING_SIZE
    for s, d in pairs:
        for role, i in (("source", s), ("destination", d)):
            if not 0 <= i < n:
                return _say(False, f"pair {(s, d)} names {role} {i}, outside the axis (devices "
                            f"0-{n - 1}).")
    sources = [s for s, _ in pairs]
    dests = [d for _, d in pairs]
    for role, seq in (("destination", dests), ("source", sources)):
        twice = sorted({i for i in seq if seq.count(i) > 1})
        if twice:
            return _say(False, f"{role} {twice} appears more than once. ppermute needs every "
                        f"source and every destination to be unique (JAX says 'ppermute "
                        f"sources and destinations must be unique'), so each device sends at "
                        f"most once and receives at most once.")
    expected = {(j, (j + 1) % n) for j in range(n)}
    got = set(pairs)
    if got == expected:
        return _say(True, "every device j sends to (j + 1) % 4: a ring shift to the right.")
    if got == {(j, (j - 1) % n) for j in range(n)}:
        return _say(False, "this shifts the ring to the left (device j sends to j - 1); the "
                    "exercise asks for j -> j + 1, with the last device sending to device 0.")
    for j in range(n):
        if j not in sources:
            return _say(False, f"device {j} sends nothing, so device {(j + 1) % n} receives "
                        f"zeros (ppermute fills a device that receives nothing with zeros). Add "
                        f"the pair {(j, (j + 1) % n)}.")
    s, d = next((s, d) for s, d in pairs if (s, d) not in expected)
    return _say(False, f"pair {(s, d)} sends device {s}'s value to device {d}; it should go to "
                f"device {(s + 1) % n}.")


# -- exercise 4: padding for psum_scatter --------------------------------------------------

VALUES_PER_DEVICE = 6
SCATTER_GROUP = 4


def check_padded_length(answer) -> bool:
    """Exercise 4: the smallest length >= 6 that psum_scatter(tiled=True) can split over 4."""
    if _placeholder(answer):
        return _say(False, "answer is still a placeholder; replace it with a number of values.")
    try:
        a = float(answer)
    except (TypeError, ValueError):
        return _say(False, f"answer should be a number of values, got {answer!r}.")
    n, p = VALUES_PER_DEVICE, SCATTER_GROUP
    expected = -(-n // p) * p
    if a == expected:
        return _say(True, f"{expected} values: {expected // p} per device after the scatter, "
                    f"with {expected - n} zeros of padding.")
    if a < n:
        return _say(False, f"{a:g} is shorter than the {n} values each device holds: padding "
                    f"adds zeros, it must not drop data.")
    if a % p:
        return _say(False, f"{a:g} does not split into {p} equal blocks (one per device of the "
                    f"group): that is exactly the error psum_scatter raised.")
    return _say(False, f"{a:g} splits into {p} blocks, but it is not the smallest length that "
                f"does: {a - n:g} zeros of padding is more than needed.")
