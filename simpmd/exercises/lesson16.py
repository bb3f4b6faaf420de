"""Checks for lesson 16, many hosts.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values are worked out here from the rules the lesson
states (which mesh axes span processes, what replica 0 of a block is), never from the
lesson's solutions or from simpmd's implementation of the same rules.
"""
from __future__ import annotations

import numpy as np

from simpmd.course import Verdict, error_summary, is_placeholder, say
from simpmd.core.errors import DeadlockError

__all__ = ["check_global_shape", "check_crossing", "local_rows", "check_fixed_report",
           "check_checkpoint_bytes"]

# The lesson's machine: 4 processes of 2 devices; 'hosts' (or 'data') spans the processes,
# 'chips' (or 'model') stays inside each.
PROCESSES, PER_PROCESS = 4, 2


# -- exercise 1: the global shape from each process's data -------------------------------------

def check_global_shape(answer) -> Verdict:
    """Local data of shape (3, 6) on every process, P('hosts', 'chips') on the (4, 2) mesh."""
    if is_placeholder(answer):
        return say(False, "global_shape is still a placeholder; give a tuple such as (3, 6).")
    try:
        got = tuple(int(n) for n in answer)
    except (TypeError, ValueError):
        return say(False, f"global_shape should be a tuple of two sizes, got {answer!r}.")
    # dim 0: split over 'hosts', whose 4 devices sit in 4 processes: 4 parts, one each;
    # dim 1: split over 'chips', whose devices sit in one process: each passes it whole
    expected = (3 * PROCESSES, 6)
    if got == expected:
        return say(True, "global_shape = (12, 6): dimension 0 is split over 'hosts', so each "
                   "of the 4 processes passes its own 3 rows; dimension 1 is split over "
                   "'chips', within each process, so each passes all 6 columns and its two "
                   "devices take 3 each.")
    hints = {(3, 6): "dimension 0 is split over 'hosts', across the processes: each passes "
                     "only its part, so the global array has 4 times its rows.",
             (12, 12): "dimension 1 is split over 'chips', whose 2 devices belong to one "
                       "process: the process passes all of it (its devices each take half), "
                       "so it does not grow.",
             (3, 12): "the splits are the other way round: 'hosts' (dimension 0) crosses "
                      "processes, 'chips' (dimension 1) does not.",
             (24, 6): "dimension 0 grows once per process (4), not once per device (8): "
                      "'hosts' has 4 positions, one per process.",
             (24, 12): "count parts per process, not per device: 'hosts' has 4 positions "
                       "(one per process), and 'chips' stays inside a process."}
    hint = hints.get(got, f"expected a tuple of two sizes; got {got}. Dimension 0 is split "
                          f"over 'hosts' (across processes), dimension 1 over 'chips' "
                          f"(inside each process).")
    return say(False, f"global_shape = {got} is off: {hint}")


# -- exercise 2: which collectives cross hosts ----------------------------------------------------

CROSSING_QUESTIONS = {
    "a": "psum over 'model'",
    "b": "psum over 'data'",
    "c": "all_gather over ('data', 'model')",
    "d": "ppermute over 'model'",
}
_CROSSES = {"a": False, "b": True, "c": True, "d": False}       # 'data' spans the hosts
_WHY = {
    "a": "'model' is the fast axis of the hybrid mesh, inside each host (its 2 devices are "
         "one process's)",
    "b": "'data' is the slow axis: its 4 positions are the 4 hosts",
    "c": "a group over both axes holds all 8 devices, on all 4 hosts",
    "d": "a ppermute over 'model' sends only between the two devices of one host",
}


def _letters(answer):
    if isinstance(answer, dict):
        return {str(k).lower() for k, v in answer.items() if v}
    if isinstance(answer, str):
        return {c.lower() for c in answer if c.isalpha()}
    return {str(k).lower() for k in answer}


def check_crossing(answer) -> Verdict:
    """The letters of the collectives (a-d) whose groups cross hosts on the hybrid mesh."""
    if is_placeholder(answer):
        return say(False, "crossing is still a placeholder; give the letters, e.g. {'a', 'c'}.")
    try:
        got = _letters(answer)
    except TypeError:
        return say(False, f"crossing should be a set of letters, got {answer!r}.")
    unknown = got - set(_CROSSES)
    if unknown:
        return say(False, f"the questions are a to d; {sorted(unknown)} is not one of them.")
    expected = {k for k, v in _CROSSES.items() if v}
    if got == expected:
        return say(True, "b and c cross hosts: " + "; ".join(f"({k}) {_WHY[k]}" for k in "abcd") + ".")
    wrong = [f"({k}) {CROSSING_QUESTIONS[k]} {'does' if _CROSSES[k] else 'does not'} cross "
             f"hosts: {_WHY[k]}" for k in sorted(got ^ expected)]
    return say(False, "; ".join(wrong) + ".")


# -- exercise 3: report a loss from one process without a deadlock ------------------------------

def local_rows(jax) -> np.ndarray:
    """The rows process ``jax.process_index()`` loads: 2 rows of 3 of a fixed data set."""
    data = np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3)
    p = jax.process_index()
    return data[2 * p:2 * p + 2]


def _data() -> np.ndarray:
    return np.linspace(-1.0, 1.0, 24, dtype=np.float32).reshape(8, 3).astype(np.float64)


def _loss() -> float:
    return float((_data() ** 2).mean())


def _loss_slips():
    """(value, what the learner did) for the losses a slip gives: ``.sum()`` for ``.mean()``,
    process 0's own rows instead of every host's, both."""
    squares, own = _data() ** 2, _data()[:2] ** 2
    return [(squares.sum(), "that is the sum of x*x over all 24 values, not its mean: "
                            "`.sum()` where `.mean()` was meant"),
            (own.mean(), "that is the mean over process 0's own 2 rows only: make the "
                         "rows one global array (every host's data) before taking the mean"),
            (own.sum(), "that is the sum over process 0's own 2 rows: take the mean, over "
                        "a global array of every host's rows"),
            (float(_data().mean()), "that is the mean of x, not of x*x")]


def check_fixed_report(main) -> Verdict:
    """``main(jax)`` must compute the mean of x*x over the global rows on every process and
    print 'loss <value>' on process 0 only; run on 4 simulated processes."""
    import simpmd
    if is_placeholder(main) or not callable(main):
        return say(False, "report_fixed is still a placeholder; write def report_fixed(jax): ...")
    try:
        run = simpmd.run_processes(main, PROCESSES, show=False)
    except DeadlockError:
        return say(False, "it still deadlocks: the loss is a computation over every host's "
                   "rows (its mean is an all-reduce across hosts), so every process must "
                   "launch it. Compute it on every process; keep only the print under "
                   "`if jax.process_index() == 0`.")
    except Exception as exc:
        return say(False, f"it raised {error_summary(exc)}")
    printed = run.printed
    if not any(text.strip() for text in printed) and all(r is None for r in run.results):
        return say(False, "report_fixed printed nothing and returned nothing: is its body "
                   "still the placeholder `...`?")
    if any(text.strip() for text in printed[1:]):
        return say(False, "processes 1-3 printed too: " + repr(printed[1]) + ". Print on "
                   "process 0 only (each host's log would otherwise repeat it).")
    words = printed[0].split()
    if len(words) != 2 or words[0] != "loss":
        return say(False, f"process 0 should print one line 'loss <value>', it printed "
                   f"{printed[0]!r}.")
    try:
        value = float(words[1])
    except ValueError:
        return say(False, f"'{words[1]}' is not a number.")
    if not np.isclose(value, _loss(), rtol=1e-4):
        for wrong, what in _loss_slips():
            if np.isclose(value, wrong, rtol=1e-4, atol=1e-6):
                return say(False, f"process 0 printed loss {value:.6g}: {what}.")
        return say(False, f"process 0 printed loss {value:.6g}, but the mean of x*x over all "
                   f"8 rows is {_loss():.6g}: is every host's data in it (a global array, "
                   f"not the process's own rows)?")
    return say(True, f"every process computed the loss (one all-reduce across the hosts), "
               f"and process 0 alone printed it: {value:.4f}.")


# -- exercise 4: what each host writes to a checkpoint -----------------------------------------------

MiB = 2 ** 20


def check_checkpoint_bytes(answer) -> Verdict:
    """Bytes each of the 4 hosts writes of a float32 (4096, 1024) array laid out
    P(None, 'model') on the hybrid mesh ('data' 4 across hosts, 'model' 2 within), when
    each writes only its shards with replica_id 0."""
    if is_placeholder(answer):
        return say(False, "bytes_per_host is still a placeholder; give 4 numbers, host 0 first.")
    try:
        got = [float(v) for v in answer]
    except (TypeError, ValueError):
        return say(False, f"bytes_per_host should be 4 numbers, got {answer!r}.")
    if len(got) != PROCESSES:
        return say(False, f"give one number per host: 4, got {len(got)}.")
    whole = 4096 * 1024 * 4
    # P(None, 'model'): the array is split over 'model' (2 halves, within each host) and
    # repeated over 'data' (each host holds a full copy). replica_id counts the copies along
    # 'data': copy 0 is on host 0, which holds both halves.
    expected = [whole, 0, 0, 0]
    if got == expected:
        return say(True, "host 0 writes the whole 16 MiB (both halves, split over 'model' "
                   "between its two devices, are replica 0); hosts 1-3 hold copies "
                   "(replica_id 1-3 along 'data') and write nothing.")
    hints = {
        (whole,) * 4: "every host holds a full copy, but only the copy with replica_id 0 "
                      "is written: that is host 0's ('data' = 0); the others would write "
                      "the same bytes again.",
        (whole / 2, 0, 0, 0): "host 0 holds both halves of the array (its two devices are "
                              "'model' 0 and 1), and both are replica 0.",
        (whole / 4,) * 4: "that is an even split over the hosts, as P('data', None) would "
                          "give; P(None, 'model') repeats the array on every host.",
        (whole / 2,) * 4: "each device holds half (split over 'model'), but the hosts "
                          "hold copies of each other's halves: only replica 0, on host 0, "
                          "is written.",
        (whole / 2, whole / 2, 0, 0): "the halves are split over 'model', whose two devices "
                                      "are one host's, not over two hosts.",
    }
    hint = hints.get(tuple(got))
    if hint is None and got[0] and np.isclose(got[0] * 2, whole):
        hint = "float32 takes 4 bytes per value (that looks like 2)."
    if hint is None and got[0] and np.isclose(got[0] / 2, whole):
        hint = "float32 takes 4 bytes per value (that looks like 8)."
    if hint is None and got[0] and np.isclose(got[0] * MiB, whole):
        hint = "give bytes, not MiB (1 MiB = 1,048,576 bytes)."
    return say(False, f"bytes_per_host = {[int(v) if v.is_integer() else v for v in got]} is "
               f"off: {hint or 'which copy of the array is replica 0, and which host holds it?'}")
