"""How many lines of simpmd one ``lax.psum`` runs: the figures of docs/engine.md's "One
``lax.psum``, read end to end", measured.

``pmap(lambda x: lax.psum(x, 'i'))`` on 8 devices is called twice. On the first call
(tracing) every distinct line of simpmd run inside the call of ``lax.psum`` is counted; on
the second (cached: the traced program, one psum equation, is run again) every distinct
line run inside the core's ``eval_program``, and every line of the whole call. Lines are counted with ``sys.settrace``, each
(file, line) once however often it runs, so the counts are the code a reader follows, not
the time it takes. Run ``python scripts/engine_walk.py`` and copy its figures into
docs/engine.md when edits move them (tests/test_engine_walk.py holds the two together).
"""
from __future__ import annotations

import os
import sys

import numpy as np


def _lines_under(start, work) -> set:
    """The distinct (file, line) of simpmd run in every frame below one for which
    ``start(frame)`` holds, while ``work()`` runs."""
    import simpmd
    root = os.path.dirname(os.path.abspath(simpmd.__file__))
    seen, active = set(), []

    def local(frame, event, arg):
        if event == "line" and active:
            seen.add((frame.f_code.co_filename, frame.f_lineno))
        elif event == "return" and active and frame is active[0]:
            active.clear()
        return local

    def call(frame, event, arg):
        if not active and start(frame):
            active.append(frame)
        if active and frame.f_code.co_filename.startswith(root):
            return local                           # (its lines, not its ``def``)
        return None

    before = sys.gettrace()                        # (a coverage run's tracer, say)
    sys.settrace(call)
    try:
        work()
    finally:
        sys.settrace(before)
    return seen


def measure() -> dict:
    """``traced``/``traced_core``: lines one psum runs while traced (all simpmd, the core
    alone); ``cached``/``cached_core``: lines its program runs on a cached call; ``call``:
    lines of simpmd the whole cached pmap call runs."""
    import simpmd
    from simpmd import lax
    from simpmd.core.program import eval_program

    def body(x):
        return lax.psum(x, "i")

    f = simpmd.pmap(body, axis_name="i")
    x = np.arange(8.0)
    core = os.path.join(os.path.dirname(os.path.abspath(simpmd.__file__)), "core")
    traced = _lines_under(lambda fr: fr.f_back is not None and fr.f_back.f_code is body.__code__,
                          lambda: f(x))
    cached = _lines_under(lambda fr: fr.f_code is eval_program.__code__, lambda: f(x))
    call = _lines_under(lambda fr: True, lambda: f(x))
    return {"call": len(call), "traced": len(traced), "traced_core": sum(p.startswith(core) for p, _ in traced),
            "cached": len(cached), "cached_core": sum(p.startswith(core) for p, _ in cached)}


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    m = measure()
    print(f"first call (tracing): {m['traced']} lines, {m['traced_core']} of them in the core")
    print(f"cached call: {m['cached']} lines, {m['cached_core']} of them in the core "
          f"({m['call']} in the whole pmap call)")
