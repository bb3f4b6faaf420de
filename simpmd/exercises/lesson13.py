"""Checks for lesson 13, pipeline parallelism.

Each check prints what is right or what is off and returns a Verdict, so that a reference
solution can ``assert`` it. Expected values come from closed forms written out here (the
bubble (p-1)/(m+p-1), microbatch t-d at step t on stage d, the activations a stage holds),
and the pipeline runs that the checks make are compared with a NumPy model run layer after
layer, never with the lesson's solutions.
"""
from __future__ import annotations

import warnings

import numpy as np

from simpmd.course import Verdict, error_summary, is_placeholder, near_miss, say as _say
import simpmd.numpy as snp
from simpmd import P, lax

__all__ = ["check_bubble", "check_training_idle", "check_send_perm", "pipeline_data",
           "check_activations_held"]


# -- exercise 1: the bubble ------------------------------------------------------------------

BUBBLE_STAGES, BUBBLE_MICROBATCHES = 8, 24


def check_bubble(answer, p: int = BUBBLE_STAGES, m: int = BUBBLE_MICROBATCHES) -> Verdict:
    """The fraction of a GPipe step that a stage spends idle, for ``p`` stages and ``m``
    microbatches of equal cost (communication left out)."""
    if is_placeholder(answer):
        return _say(False, "bubble is still a placeholder; give a fraction between 0 and 1.")
    try:
        a = float(answer)
    except (TypeError, ValueError):
        return _say(False, f"bubble should be a number between 0 and 1, got {answer!r}.")
    want = (p - 1) / (m + p - 1)
    if np.isclose(a, want, rtol=1e-3):
        return _say(True, f"{p - 1} of the {m + p - 1} steps are idle on every stage: "
                    f"{p - 1}/{m + p - 1} = {want:.3f} of the step.")
    mistakes = [
        (100 * want, f"{a:g} looks like a percentage; give the fraction, {want:.3f} is "
                     f"{100 * want:.1f}%"),
        (1 - want, "that is the share of the step a stage is BUSY (m of m+p-1 steps); the "
                   "bubble is the rest"),
        ((p - 1) / m, f"(p-1)/m = {p - 1}/{m} divides the idle steps by the busy ones (the form "
                      f"Narayanan et al. 2021 quote); the question asks for the share of the "
                      f"whole step, which divides by all m+p-1 = {m + p - 1} steps"),
        (p / (m + p - 1), f"a stage idles p-1 = {p - 1} steps, not p: the first stage starts at "
                          f"step 0, the last at step p-1"),
        (p / (m + p), f"a stage idles p-1 = {p - 1} of m+p-1 = {m + p - 1} steps"),
        ((p - 1) / (m + p), f"the step lasts m+p-1 = {m + p - 1} steps (the last microbatch "
                            f"enters stage 0 at step m-1 and leaves stage p-1 at step m+p-2)"),
        (2 * (p - 1) / (m + p - 1), "forward and backward each have a bubble of p-1 steps, but "
                                    "the step is twice as long too: the fraction stays the same"),
        ((m - 1) / (m + p - 1), f"that swaps p and m: a stage idles one step fewer than there "
                                f"are stages, p-1 = {p - 1}, not m-1 = {m - 1}"),
        ((m - 1) / p, f"that is (p-1)/m with p and m swapped: p = {p} stages, m = {m} "
                      f"microbatches, and the share of the whole step is (p-1)/(m+p-1)"),
    ]
    for wrong, hint in mistakes:
        if np.isclose(a, wrong, rtol=1e-3):
            return _say(False, f"{a:g}: {hint}.")
    near = near_miss(a, want)
    if near:
        return _say(False, f"{a:g} is {near}.")
    return _say(False, f"{a:g} is not the bubble fraction: count the steps of the schedule "
                f"(m+p-1) and those in which one stage has no microbatch.")


# -- exercise 2: the bubble of a training step ------------------------------------------------

TRAINING_STAGES = 4


def _training_idle(d, k, m, p=TRAINING_STAGES, backward="reversed"):
    """Whether stage d idles in compute segment k of the training step: forward steps
    0..m+p-2, then their backwards, last forward step first (``backward`` names the
    variants the checker recognises as mistakes)."""
    steps = m + p - 1
    if k < steps:
        t = k
    elif backward == "reversed":
        t = 2 * steps - 1 - k
    elif backward == "in order":
        t = k - steps
    elif backward == "one off":
        t = 2 * steps - k
    elif backward == "all idle":
        return True
    else:                                     # "all busy"
        return False
    return not 0 <= t - d < m


def check_training_idle(fn, p: int = TRAINING_STAGES, ms=(2, 4, 6)) -> Verdict:
    """``fn(d, k, m)``: whether stage ``d`` of the 4-stage GPipe training step (forward,
    loss, backward) idles in its ``k``-th compute segment, with ``m`` microbatches."""
    if is_placeholder(fn):
        return _say(False, "training_idle is still a placeholder; define it with def.")
    got, answers = {}, set()
    for m in ms:
        for d in range(p):
            for k in range(2 * (m + p - 1)):
                try:
                    answer = fn(d, k, m)
                    answers.add(answer is None)
                    got[d, k, m] = bool(answer)
                except Exception as exc:
                    return _say(False, f"training_idle({d}, {k}, {m}) raised {error_summary(exc)}")
    if answers == {True}:
        return _say(False, "training_idle returns None (the placeholder's body is still ...); "
                    "return True or False.")
    want = {key: _training_idle(*key) for key in got}
    wrong = [key for key in got if got[key] != want[key]]
    if not wrong:
        return _say(True, "segment k < m+p-1 is forward step k; the backward then runs the "
                    "steps in reverse, so segment k is the backward of step 2(m+p-1)-1-k; "
                    "stage d works in step t when 0 <= t-d < m.")
    d, k, m = wrong[0]
    first = (f"training_idle({d}, {k}, {m}) is {got[d, k, m]}, expected {want[d, k, m]} "
             f"({len(wrong)} of {len(got)} answers differ)")
    if all(k < m + p - 1 for d, k, m in wrong):
        return _say(False, f"{first}: the forward segments are off. In forward step t, "
                    f"stage d works on microbatch t-d when that is a microbatch (0..m-1).")
    for variant, hint in (
            ("in order", "the backward segments are taken in the forward's order. The backward "
                         "starts from the loss, at the last stage, so its first segment is the "
                         "backward of the LAST forward step"),
            ("one off", "the backward segments are one step off: segment m+p-1 is the "
                        "backward of forward step m+p-2, so step = 2(m+p-1)-1-k"),
            ("all idle", "every backward segment is idle in your answer, but each stage "
                         "computes the backward of each of its m microbatches"),
            ("all busy", "every backward segment is busy in your answer, but the backward has "
                         "its bubble too: p-1 idle segments per stage")):
        if all(got[key] == _training_idle(*key, backward=variant) for key in got):
            return _say(False, f"{first}: {hint}.")
    return _say(False, f"{first}. Number the segments: forward steps 0..m+p-2, then the "
                "backward of those steps, last one first.")


# -- exercise 3: where the activations go -------------------------------------------------------

def pipeline_data(p: int = 4, m: int = 4, width: int = 8, rows: int = 2, seed: int = 11):
    """The checker's model and inputs: weights (p, width, width), biases (p, width) and
    microbatches (m, rows, width), float32."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((p, width, width)) / np.sqrt(width)).astype(np.float32)
    b = (0.1 * rng.standard_normal((p, width))).astype(np.float32)
    x = rng.standard_normal((m, rows, width)).astype(np.float32)
    return w, b, x


def _unsplit(w, b, x):
    h = x.astype(np.float64)
    for k in range(w.shape[0]):
        h = np.tanh(h @ w[k] + b[k])
    return h


def _gpipe_with(perm):
    """The lesson's GPipe forward pass, as a simpmd.shard_map over 'stage', sending with
    ``perm``."""
    import simpmd

    def body(w, b, x):
        w, b = w[0], b[0]
        stage = lax.axis_index("stage")
        n, m = lax.axis_size("stage"), x.shape[0]
        arrived = snp.zeros_like(x[0])
        outputs = []
        for t in range(m + n - 1):
            inp = snp.where(stage == 0, x[min(t, m - 1)], arrived)
            y = snp.tanh(inp @ w + b)
            if t >= n - 1:
                outputs.append(y)
            if t < m + n - 2:
                arrived = lax.ppermute(y, "stage", perm)
        return snp.stack(outputs)[None]
    p = 4
    mesh = simpmd.make_mesh((p,), ("stage",))
    return simpmd.shard_map(body, mesh=mesh, in_specs=(P("stage"), P("stage"), P()),
                            out_specs=P("stage"))


def check_send_perm(perm, p: int = 4) -> Verdict:
    """``perm``: the ``ppermute`` pairs that pass each stage's output on to the next stage
    of a 4-stage pipeline (the lesson's GPipe program is run with it and compared with the
    unsplit model)."""
    if is_placeholder(perm):
        return _say(False, "send_perm is still a placeholder; give a list of (source, "
                    "destination) pairs.")
    try:
        pairs = [(int(s), int(d)) for s, d in perm]
    except (TypeError, ValueError):
        return _say(False, f"send_perm should be a list of (source, destination) pairs, got "
                    f"{perm!r}.")
    right = {(j, j + 1) for j in range(p - 1)}
    if set(pairs) == {(j + 1, j) for j in range(p - 1)}:
        return _say(False, "these pairs send from stage j+1 to stage j: backwards. In the "
                    "forward pass activations flow from stage j to j+1, (j, j+1); the "
                    "backward pass (its transpose) sends the gradients the other way.")
    w, b, x = pipeline_data(p)
    want = _unsplit(w, b, x)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = np.asarray(_gpipe_with(list(perm))(w, b, x))[-1]
    except Exception as exc:
        return _say(False, f"the pipeline with these pairs raised {error_summary(exc, first_sentence=True)}")
    correct = np.allclose(out, want, rtol=1e-4, atol=1e-5)
    extra = sorted(set(pairs) - right)
    missing = sorted(right - set(pairs))
    if correct and not extra:
        return _say(True, f"{pairs}: each stage sends to the next, and the last stage's "
                    f"outputs match the unsplit model.")
    if correct and extra == [(p - 1, 0)]:
        return _say(False, f"the result is right, but ({p - 1}, 0) closes a ring: the last "
                    f"stage sends its output to stage 0, which never reads it (stage 0 takes "
                    f"the next microbatch). It is {len(pairs)} sends per step where {p - 1} "
                    f"do; leave it out.")
    bad = [j for j in range(x.shape[0]) if not np.allclose(out[j], want[j], rtol=1e-4, atol=1e-5)]
    stray = [pair for pair in extra if pair != (p - 1, 0)]
    if stray:
        return _say(False, f"pairs {stray} do not go from a stage to the next one; microbatches "
                    f"{bad} come out different from the unsplit model. Stage j+1 must receive "
                    f"from stage j: (j, j+1) for j = 0..{p - 2}.")
    return _say(False, f"pairs {missing} are missing, so the stages they should feed compute on "
                f"zeros and microbatches {bad} come out wrong.")


# -- exercise 4: activations held, GPipe against 1F1B -----------------------------------------

HELD_STAGES, HELD_MICROBATCHES = 8, 32


def check_activations_held(gpipe, one_f_one_b, p: int = HELD_STAGES,
                           m: int = HELD_MICROBATCHES) -> Verdict:
    """The most microbatches whose activations each stage holds at once (forward done,
    backward not yet), one number per stage, for GPipe and for Megatron's 1F1B schedule
    (each stage waits for a backward before its next forward) with ``p`` stages and
    ``m`` microbatches."""
    ok = True
    want_g = [m] * p
    want_1 = [min(p - s, m) for s in range(p)]
    for name, answer, want in (("GPipe", gpipe, want_g), ("1F1B", one_f_one_b, want_1)):
        if is_placeholder(answer):
            ok = _say(False, f"{name}'s list is still a placeholder; give {p} numbers, one "
                      f"per stage.") and ok
            continue
        try:
            got = [int(v) for v in answer]
        except (TypeError, ValueError):
            ok = _say(False, f"{name} should be a list of {p} numbers, got {answer!r}.") and ok
            continue
        if len(got) != p:
            ok = _say(False, f"{name} has {len(got)} numbers; give one per stage, {p}.") and ok
            continue
        if got == want:
            _say(True, f"{name}: {got}.")
            continue
        ok = False
        hint = (_gpipe_hint(got, p, m) if name == "GPipe" else _one_f_one_b_hint(got, p, m))
        _say(False, f"{name}: {got}, expected {want}: {hint}.")
    return Verdict(ok)


def _lock_step(p, m):
    """What the lesson's lock-step SPMD program keeps live on stage s: 2(p-1-s)+1 inputs
    (at most m), and the buffer of 2p-1 slots every stage allocates."""
    return [min(2 * (p - 1 - s) + 1, m) for s in range(p)], [2 * p - 1] * p


def _gpipe_hint(got, p, m):
    if got == [min(p - s, m) for s in range(p)]:
        return ("that is 1F1B's profile. GPipe runs all m forwards before any backward, so "
                f"every stage holds all m = {m} microbatches at the turn")
    if got == [m - s for s in range(p)] or got == [m + s for s in range(p)]:
        return (f"every stage, not only the first, runs all {m} forwards before its first "
                f"backward, so each peaks at {m}")
    return f"GPipe finishes all {m} forwards before the first backward"


def _one_f_one_b_hint(got, p, m):
    want = [min(p - s, m) for s in range(p)]
    live, buffer = _lock_step(p, m)
    if got == live:
        return ("that is what the lock-step SPMD program of section 5 holds (stage s keeps "
                "microbatch j's input from tick j+s to tick j+2(p-1)-s: 2(p-1-s)+1 of them). "
                "The question is about Megatron's 1F1B schedule, the one `stage_orders` "
                "lists, where stage s runs its next forward only after a backward: p-s")
    if got == buffer:
        return (f"that is the buffer of the lock-step SPMD program of section 5: {2 * p - 1} "
                "slots on every stage, the most any stage needs. Megatron's 1F1B schedule "
                "(`stage_orders`) holds p-s on stage s")
    if got == [p - s - 1 for s in range(p)]:
        return ("one short on every stage: after its p-s-1 warm-up forwards, stage s runs one "
                "more forward before its first backward, so it holds p-s (the last stage "
                "holds 1, not 0)")
    if got == list(reversed(want)):
        return ("reversed: the FIRST stage holds most, since its warm-up lasts until its first "
                "microbatch has gone through all the later stages and back")
    if got == [p] * p:
        return "only stage 0 holds p; a later stage s waits fewer steps for its first gradient, p-s"
    if got == [m] * p:
        return ("that is GPipe; 1F1B starts each backward as soon as its gradient arrives, so "
                "stage s never holds more than p-s, however large m is")
    return "count, for stage s, the forwards it runs before its first backward"
