"""Checks for lesson 11, from pmap to shard_map and jit with shardings.

Each check prints what is right or what is off and returns True or False, so that a
reference solution can ``assert`` it. Expected values come from NumPy closed forms and
the rules of partition specs written out here, never from the lesson's solutions.
"""
from __future__ import annotations

import warnings

import numpy as np

from simpmd.course import (Factor, Verdict, check_quantity, error_summary, is_pmapped,
                           is_shard_mapped, say as _say)
from simpmd import P


__all__ = ["check_specs", "check_block_shapes", "centering_data", "check_centering",
           "check_sharded_bytes"]


def _entries(spec):
    """A partition spec (simpmd's or JAX's) as a tuple of entries without trailing Nones,
    or None if ``spec`` is not a partition spec."""
    if type(spec).__name__ not in ("PartitionSpec", "P"):
        return None
    parts = [tuple(p) if isinstance(p, list) else p for p in spec]
    parts = [p[0] if isinstance(p, tuple) and len(p) == 1 else p for p in parts]
    while parts and parts[-1] is None:
        parts.pop()
    return tuple(parts)


def _names(spec) -> set:
    """The mesh axes a partition spec names, in any of its entries."""
    names = set()
    for entry in _entries(spec) or ():
        names |= set(entry) if isinstance(entry, tuple) else {entry}
    return names - {None}


def _spec_text(entries) -> str:
    """``P('i')``, ``P(None, 'i')``, ``P()``: a spec's entries as the learner wrote them."""
    return "P(" + ", ".join(repr(e) for e in entries) + ")"


def _not_a_spec(name, value) -> str:
    if isinstance(value, str):
        return f"{name} is the bare string {value!r}; a spec is P({value!r}) (from simpmd import P)."
    if value is None and name == "out_specs":
        return ("out_specs is None; a result that is the same on every device, returned once, "
                "is P().")
    if value is None:
        return (f"{name} is None, which passes x whole to every device (as P() would). x is "
                f"mapped (in_axes=0): split its axis 0 over 'i', P('i').")
    return f"{name} should be a partition spec such as P('i') or P(), got {value!r}."


# -- exercise 1: pmap's axes as specs ------------------------------------------------------

def check_specs(in_specs, out_specs) -> bool:
    """Specs for ``pmap(f, axis_name='i', in_axes=(0, None), out_axes=None)`` with
    ``x`` of shape (8, 3) and ``w`` of shape (3,), on a 1-D mesh with axis 'i'."""
    if in_specs is Ellipsis or out_specs is Ellipsis or in_specs is None:
        return _say(False, "in_specs and out_specs are still placeholders.")
    if not isinstance(in_specs, (tuple, list)) or len(in_specs) != 2:
        return _say(False, "in_specs needs one spec per argument: a tuple of two, for x and w "
                    f"(got {in_specs!r}).")
    problems, notes = [], []
    x_spec, w_spec = in_specs
    if w_spec is None:
        # jax.shard_map (checked on 0.7.2, 0.10.2 and 0.12.0.1) and simpmd.shard_map pass an
        # argument whose spec is None to every device whole, as a constant of the program
        w_spec = _P()
        notes.append("in_specs[1]=None works too: JAX and simpmd pass w whole to every device, "
                     "as a constant of the program; P() says the same in the language of specs, "
                     "and is what pmap's in_axes=None becomes.")
    want = {"in_specs[0] (x)": (x_spec, ("i",)), "in_specs[1] (w)": (w_spec, ()),
            "out_specs": (out_specs, ())}
    for name, (spec, expected) in want.items():
        got = _entries(spec)
        if got is None:
            problems.append(_not_a_spec(name, spec))
        elif got == expected:
            continue
        elif name.startswith("in_specs[0]"):
            if got == ():
                problems.append("in_specs[0]: x is mapped (in_axes=0), so its axis 0 is split "
                                "over 'i': P('i'). P() would give every device all of x.")
            elif "i" in got:
                problems.append(f"in_specs[0] is {_spec_text(got)}: in_axes=0 splits the FIRST "
                                "axis of x, so 'i' goes in the first entry: P('i').")
            else:
                problems.append(f"in_specs[0] is {_spec_text(got)}; the mesh's only axis is 'i'.")
        elif name.startswith("in_specs[1]"):
            problems.append(f"in_specs[1] is {_spec_text(got)}: in_axes=None gives every device "
                            "the whole w, which is a spec naming no mesh axis: P().")
        elif "i" in got:
            k = got.index("i")
            problems.append(f"out_specs is {_spec_text(got)}, which concatenates the 8 devices' "
                            f"blocks along axis {k}, like out_axes={k}. out_axes=None returns ONE "
                            "copy of a result that is the same on every device: P().")
        else:
            problems.append(f"out_specs is {_spec_text(got)}, which names no axis of this mesh "
                            "(its only axis is 'i'). out_axes=None returns ONE copy of a result "
                            "that is the same on every device: P().")
    if problems:
        return _say(False, " ".join(problems))
    return _say(True, "in_specs=(P('i'), P()), out_specs=P(): x split over 'i', w and the "
                "result whole on every device." + "".join(" " + n for n in notes))


def _P():
    return P()


# -- exercise 2: the block a body sees --------------------------------------------------------

MESH = {"data": 2, "model": 4}
BLOCK_QUESTIONS = {
    "a": ((16, 24), ("data", "model")),
    "b": ((16, 24), (None, ("data", "model"))),
    "c": ((16, 24), ("model",)),
}


def _expected_block(shape, entries):
    out = []
    for k, size in enumerate(shape):
        entry = entries[k] if k < len(entries) else None
        names = () if entry is None else (entry if isinstance(entry, tuple) else (entry,))
        n = int(np.prod([MESH[a] for a in names])) if names else 1
        out.append((size // n, names, n))
    return out


def check_block_shapes(a, b, c) -> bool:
    """The block shapes a shard_map body sees for x of shape (16, 24) on the 2x4
    ('data', 'model') mesh, for in_specs (a) P('data', 'model'), (b) P(None, ('data',
    'model')), (c) P('model')."""
    ok = True
    for label, answer in zip("abc", (a, b, c)):
        shape, entries = BLOCK_QUESTIONS[label]
        spec_text = "P(" + ", ".join(repr(e) for e in entries) + ")"
        rows = _expected_block(shape, entries)
        want = tuple(r[0] for r in rows)
        if answer is None or answer is Ellipsis:
            ok = _say(False, f"({label}) is still a placeholder.") and ok
            continue
        try:
            got = tuple(int(v) for v in answer)
        except (TypeError, ValueError):
            ok = _say(False, f"({label}) should be a shape tuple such as (8, 6), got "
                      f"{answer!r}.") and ok
            continue
        if got == want:
            _say(True, f"({label}) {spec_text}: the body sees {want}.")
            continue
        ok = False
        if len(got) < len(want):
            _say(False, f"({label}) {got} has fewer dimensions than x: pmap removes the mapped "
                 f"axis, shard_map does not. Every dimension stays; a split one gets shorter "
                 f"(expected {want}).")
            continue
        if len(got) != len(want):
            _say(False, f"({label}) x has {len(want)} dimensions, so its block does too; "
                 f"got {got}.")
            continue
        notes = []
        for k, (g, (e, names, n)) in enumerate(zip(got, rows)):
            if g == e:
                continue
            if not names:
                notes.append(f"dimension {k} is not split by {spec_text} (no mesh axis in that "
                             f"entry), so it keeps its size {shape[k]}, not {g}")
            elif len(names) > 1:
                notes.append(f"dimension {k} is split over {names} together: "
                             f"{' x '.join(str(MESH[x]) for x in names)} = {n} blocks, so "
                             f"{shape[k]} / {n} = {e}, not {g}")
            else:
                notes.append(f"dimension {k} is split over {names[0]!r}, which has {n} devices "
                             f"('data' has 2, 'model' 4): {shape[k]} / {n} = {e}, not {g}")
        _say(False, f"({label}) {spec_text}: " + "; ".join(notes) + ".")
    return Verdict(ok)


# -- exercise 3: porting a pmap program -------------------------------------------------------

def centering_data():
    """The checker's test data: x of shape (8, 3), one row per device."""
    rng = np.random.default_rng(10)
    return rng.standard_normal((8, 3)).astype(np.float32)


def check_centering(centered) -> bool:
    """``centered(x)`` on x of shape (8, 3) must be a ``simpmd.shard_map`` that returns x
    minus its column means, (8, 3), as ``pmap(lambda r: r - lax.pmean(r, 'i'), 'i')`` does:
    rows split over the devices, the mean a collective."""
    import simpmd
    if centered is None or centered is Ellipsis:
        return _say(False, "centered is still a placeholder; build it with simpmd.shard_map.")
    if is_pmapped(centered):
        return _say(False, "centered is a simpmd.pmap; the exercise is to write it with "
                    "simpmd.shard_map(..., mesh=mesh_i, in_specs=..., out_specs=...).")
    if not is_shard_mapped(centered):
        return _say(False, _not_shard_mapped(centered))
    x = centering_data()
    want = x - x.mean(axis=0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = centered(x)
    except simpmd.ShardingError as exc:
        return _say(False, f"simpmd refused the program: {exc}")
    except Exception as exc:
        return _say(False, f"calling centered(x) raised {error_summary(exc)}")
    if out is None:
        return _say(False, "the body returned None; return the centered block.")
    got = np.asarray(out)
    if got.shape != want.shape:
        return _say(False, _shape_hint(got.shape, want.shape))
    specs = centered.in_specs if isinstance(centered.in_specs, (tuple, list)) else (centered.in_specs,)
    split = any("i" in _names(spec) for spec in specs)
    collectives = [call[0].op for call in centered.trace.calls()]
    if np.allclose(got, 0.0, atol=1e-6) and not np.allclose(want, 0.0, atol=1e-6):
        if split:
            return _say(False, "every value is 0: each device subtracted the mean of its own "
                        "block. With in_specs=P('i') a device's block is one row, shape (1, 3), "
                        "whose mean over axis 0 is the row itself. The mean over the devices "
                        "needs a collective: lax.pmean(r, 'i').")
        return _say(False, "every value is 0: each device subtracted the mean of copies that "
                    "were all the same. With in_specs=P() every device receives the whole x "
                    "(P() names no mesh axis, so nothing is split); give each device its own "
                    "row with in_specs=P('i').")
    if np.allclose(got, want, rtol=1e-5, atol=1e-5):
        if not collectives:
            return _say(False, "the values are right, but no collective ran: every device "
                        "received the whole x (in_specs=P()) and centred all of it alone, the "
                        "same work 8 times. Split the rows, in_specs=P('i'), and average over "
                        "the devices with lax.pmean(r, 'i').")
        return _say(True, "every row is x minus the column means, as in the pmap version.")
    return _say(False, _values_hint(got, x, want))


def _not_shard_mapped(value) -> str:
    """What to say of an answer that is not a simpmd.shard_map: a plain function, a JAX one."""
    build = "simpmd.shard_map(center, mesh=mesh_i, in_specs=..., out_specs=...)"
    module = getattr(type(value), "__module__", "") or ""
    if callable(value) and module.startswith("jax"):
        return (f"centered is a JAX function; build it with {build}, which the checker can run "
                f"device by device (on_jax turns it into a jax.shard_map afterwards).")
    if callable(value):
        return (f"centered is a plain Python function, not a simpmd.shard_map: it runs once, on "
                f"the whole array, with no devices and no collective. Wrap the pmap body: {build}.")
    return f"centered should be a simpmd.shard_map, built as {build}; got {value!r:.60}."


def _shape_hint(got, want) -> str:
    if got == (1, 3):
        return ("the result has shape (1, 3), one device's block: out_specs P('i') "
                "concatenates the 8 blocks back into (8, 3).")
    if got == (3,):
        return ("the result has shape (3,): inside shard_map each device's block is "
                "x[k:k+1], shape (1, 3); keep that axis, and concatenate with out_specs P('i').")
    if got == (8 * 8, 3):
        return ("the result has shape (64, 3), 8 blocks of (8, 3): every device received the "
                "whole x. in_specs=P() names no mesh axis, so nothing is split and each device "
                "gets a full copy; out_specs=P('i') then joins 8 whole copies. Split the rows "
                "over the devices: in_specs=P('i').")
    return f"the result has shape {got}, expected {want}."


def _values_hint(got, x, want) -> str:
    if np.allclose(got, x - 8 * x.mean(axis=0), rtol=1e-5, atol=1e-5):
        return "you subtracted the column SUMS: psum adds over the 8 devices; pmean averages."
    if np.allclose(got, x, rtol=1e-5, atol=1e-5):
        return "the result is x unchanged: subtract the mean over 'i'."
    if np.allclose(got, x - x.mean(axis=1, keepdims=True), rtol=1e-5, atol=1e-5):
        return ("you subtracted each row's own mean (over its 3 values); the mean is over the "
                "devices, axis 'i': lax.pmean(block, 'i').")
    bad = sorted({int(i) for i in np.argwhere(~np.isclose(got, want, rtol=1e-5, atol=1e-5))[:, 0]})
    return f"rows {bad} differ from x minus its column means (row k is device k's block)."


# -- exercise 4: bytes of a sharded array -------------------------------------------------------

def check_sharded_bytes(answer) -> bool:
    """Bytes ONE device holds of a bf16 array of shape (4096, 8192) laid out as
    NamedSharding(mesh, P('data', None)) on the 2x4 ('data', 'model') mesh."""
    factors = [
        Factor("values", 4096 * 8192),
        Factor("bytes per value", 2, {
            4: "bf16 takes 2 bytes per value (4 is float32)."}),
        Factor("share", 1 / 2, {
            1 / 8: "P('data', None) names only 'data': rows are split over its 2 devices, "
                   "and along 'model' the array is replicated, so do not divide by 8.",
            1: "P('data', None) splits the rows over 'data' (2 devices): each holds half.",
            1 / 4: "the rows are split over 'data' (2 devices), not 'model' (4)."}),
    ]
    return check_quantity(answer, factors, what="bytes per device", unit="bytes")
