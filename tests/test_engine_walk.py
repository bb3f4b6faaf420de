"""docs/engine.md's walk of one ``lax.psum`` says what scripts/engine_walk.py measures."""
import importlib.util
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOLERANCE = 0.15      # line counts move with edits: the docs may lag the code by this much


def _measure() -> dict:
    spec = importlib.util.spec_from_file_location("engine_walk", ROOT / "scripts" / "engine_walk.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.measure()


def _documented() -> dict:
    text = " ".join((ROOT / "docs" / "engine.md").read_text().split())
    traced = re.search(r"(\d+) distinct lines of simpmd run inside the call of `lax.psum`, "
                       r"(\d+) of them in the core", text)
    cached = re.search(r"(\d+) distinct lines run inside `eval_program`, all of them in the "
                       r"core \((\d+) in the whole cached pmap call\)", text)
    assert traced and cached, "docs/engine.md no longer states the walk's figures"
    return {"traced": int(traced[1]), "traced_core": int(traced[2]),
            "cached": int(cached[1]), "cached_core": int(cached[1]), "call": int(cached[2])}


def test_engine_docs_walk_figures_are_measured():
    measured, documented = _measure(), _documented()
    for key, value in documented.items():
        assert abs(value - measured[key]) <= TOLERANCE * measured[key], (
            f"docs/engine.md says {value} for {key}; scripts/engine_walk.py measures "
            f"{measured[key]}: run the script and update the docs")


def test_cached_psum_runs_the_core_alone_and_less_than_tracing():
    m = _measure()
    assert m["cached_core"] == m["cached"] > 0
    assert m["traced"] > m["cached"] and m["traced_core"] < m["traced"]
    assert m["call"] > m["cached"]
