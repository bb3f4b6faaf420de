"""What the exercise-checker tests share: reading a checker's printed verdict."""


def verdict(capsys, ok, *fragments):
    """The checker printed "Correct: ..." (ok) or "Not yet: ..." containing every fragment."""
    out = capsys.readouterr().out
    assert out.startswith("Correct: " if ok else "Not yet: "), out
    for fragment in fragments:
        assert fragment in out, f"{fragment!r} not in {out!r}"
    return out
