"""Answer checks for lesson 8: nested pmap and 2-D meshes.

Each checker prints what is right or what is off (which group, which device, which
factor) and returns True or False, so a reference solution can ``assert`` it. Expected
values are worked out here from the mesh layout and NumPy closed forms, never by running
a solution.
"""
from __future__ import annotations

import numpy as np
from simpmd.course import is_placeholder as _placeholder, say as _say


# -- exercise 1: the groups of a collective over 'data' on a 4x2 mesh ----------------------

MESH_4x2 = np.arange(8).reshape(4, 2)          # device id = 2 * data + model (row-major)


def groups_along(ids: np.ndarray, axis: int) -> set:
    """The groups (frozensets of device ids) of a collective over mesh axis ``axis``:
    the devices that agree on every other coordinate."""
    moved = np.moveaxis(ids, axis, -1).reshape(-1, ids.shape[axis])
    return {frozenset(int(i) for i in row) for row in moved}


def _as_groups(answer):
    """``answer`` as a list of frozensets of ints, or a message saying why it is not one."""
    try:
        groups = [list(g) for g in answer]
    except TypeError:
        return None, ("give a list of groups, each a tuple of device ids, e.g. "
                      "[(0, 1), (2, 3)].")
    flat = []
    for g in groups:
        for i in g:
            if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
                return None, f"the groups should hold device ids (ints), found {i!r}."
            flat.append(int(i))
    missing = sorted(set(range(8)) - set(flat))
    repeated = sorted({i for i in flat if flat.count(i) > 1})
    outside = sorted(i for i in set(flat) if not 0 <= i < 8)
    if outside:
        return None, f"the mesh has devices 0-7; {outside} is not one of them."
    if repeated:
        return None, (f"device(s) {repeated} appear in more than one group; a collective puts "
                      f"every device in exactly one group.")
    if missing:
        return None, (f"device(s) {missing} are in no group; every device of the mesh takes "
                      f"part, each in exactly one group.")
    return [frozenset(int(i) for i in g) for g in groups], None


def check_data_groups(answer) -> bool:
    """Exercise 1: the device groups of ``psum(..., 'data')`` on the 4x2 mesh
    (``data`` = 4 rows, ``model`` = 2 columns, devices numbered row-major)."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; replace it with a list of groups.")
    groups, problem = _as_groups(answer)
    if problem:
        return _say(False, problem)
    got = set(groups)
    expected = groups_along(MESH_4x2, 0)
    if got == expected:
        return _say(True, "a collective over 'data' runs in 2 groups of 4: "
                    + ", ".join(str(tuple(sorted(g))) for g in sorted(expected, key=min))
                    + " (each group shares one 'model' index).")
    if got == groups_along(MESH_4x2, 1):
        return _say(False, "those are the groups of a collective over 'model' (the rows: devices "
                    "that share a 'data' index). A collective over 'data' groups the devices "
                    "that share a 'model' index: one group per column.")
    if got == {frozenset(range(8))}:
        return _say(False, "one group of all 8 devices is what a collective over ('data', "
                    "'model') together forms. Over 'data' alone, only devices with the same "
                    "'model' index meet.")
    if got == groups_along(np.arange(8).reshape(2, 4), 0):
        return _say(False, "those are the 'data' groups of a 2x4 mesh. This mesh is 4x2: 4 rows "
                    "('data') of 2 devices ('model'), device id = 2 * data + model.")
    for k in range(8):
        mine = next(h for h in got if k in h)
        right = next(g for g in expected if k in g)
        stranger = sorted(mine - right)
        if stranger:
            j = stranger[0]
            return _say(False, f"device {j} (data={j // 2}, model={j % 2}) is in the group of "
                        f"device {k} (data={k // 2}, model={k % 2}), but a collective over "
                        f"'data' only joins devices with the same 'model' index: device {k}'s "
                        f"group is {tuple(sorted(right))}.")
    return _say(False, "these are not the 'data' groups.")       # unreachable in practice


# -- exercise 2: the worked example's program on a 2x4 mesh --------------------------------

X_2x4 = np.arange(8, dtype=np.float32).reshape(2, 4)
P_2x4 = np.full((2, 4), 0.25, dtype=np.float32)


def expected_2x4() -> np.ndarray:
    """psum(x * p, 'model') * 2, then psum over 'data', per device, by NumPy closed form."""
    after_model = 2 * np.repeat((X_2x4 * P_2x4).sum(axis=1, keepdims=True), 4, axis=1)
    return np.repeat(after_model.sum(axis=0, keepdims=True), 2, axis=0)


def _explain_2x4(a: np.ndarray, what: str, quiet: bool = False) -> bool:
    """Compare a (2, 4) array of per-device values with the expected one, with hints
    (``quiet``: only say whether it matches)."""
    e = expected_2x4()
    if quiet:
        return a.shape == e.shape and bool(np.allclose(a, e))
    after_model = 2 * np.repeat((X_2x4 * P_2x4).sum(axis=1, keepdims=True), 4, axis=1)
    if a.shape == () and np.isclose(a, e[0, 0]):
        return _say(False, f"{float(a):g} is the right value, but give it per device: an array "
                    f"of shape (2, 4), rows 'data', columns 'model' (e.g. np.full((2, 4), ...)).")
    if a.shape != e.shape:
        return _say(False, f"{what} has shape {a.shape}; give one value per device: shape (2, 4) "
                    f"(rows: 'data' index, columns: 'model' index).")
    if np.allclose(a, e):
        return _say(True, f"{what} matches: {e[0, 0]:g} on every device.")
    if np.allclose(a, e * 4):
        return _say(False, f"{what} is 4 times too large: you added the values of all 8 devices "
                    f"(the 12.0 mistake of section 3). The psum over 'data' adds only the 2 devices "
                    f"that share a 'model' index; after the psum over 'model' the 4 devices of a "
                    f"row hold the same number, so adding all 8 counts each row 4 times.")
    if np.allclose(a, e / 2):
        return _say(False, f"{what} is half the expected value: the inner body multiplies by 2 "
                    f"after its psum over 'model'.")
    if np.allclose(a, after_model):
        return _say(False, f"{what} is the value after the psum over 'model' and the * 2 "
                    f"({after_model[0, 0]:g} on row 0, {after_model[1, 0]:g} on row 1); the outer "
                    f"psum over 'data' still adds the two rows, column by column.")
    bad = np.argwhere(~np.isclose(a, e))
    d, m = (int(i) for i in bad[0])
    return _say(False, f"{what} on device {4 * d + m} (data={d}, model={m}) is {a[d, m]:g}, "
                f"expected {e[d, m]:g} ({len(bad)} of 8 devices differ).")


def check_worked_example_2x4(answer) -> bool:
    """Exercise 2: the value every device returns, as a (2, 4) array."""
    if _placeholder(answer):
        return _say(False, "your answer is still a placeholder; replace it with a (2, 4) array.")
    try:
        a = np.asarray(answer, dtype=np.float64)
    except (TypeError, ValueError):
        return _say(False, f"your answer should be an array of numbers, got {answer!r}.")
    return _explain_2x4(a, "the value on each device")


# -- exercise 3: the same program in today's JAX, with 'model' on the devices ----------------

def _mapped_names(fn) -> set | None:
    """The axis names of the 2x4 program that reach JAX's traced program (a jaxpr).

    A jax.vmap axis is batched away while tracing (its psum becomes a sum over an array
    axis), so only axes mapped over devices (jax.pmap, jax.shard_map) keep their names.
    None if the program cannot be traced (the value check has already run it).
    """
    import jax  # optional: JAX
    try:
        text = str(jax.make_jaxpr(fn)(X_2x4, P_2x4))
    except Exception:                              # noqa: BLE001 - only a finer hint is lost
        return None
    return {name for name in ("data", "model") if name in text}


def check_modern(fn) -> bool:
    """Exercise 3: ``fn(x, p)`` runs the 2x4 program with today's JAX: ``jax.pmap`` over
    'model' (axis 1 of x, 4 devices) and ``jax.vmap`` over 'data' inside it."""
    if _placeholder(fn):
        return _say(False, "modern is still a placeholder; define it as a function of (x, p).")
    if not callable(fn):
        return _say(False, f"modern should be a function of (x, p), got {type(fn).__name__}.")
    try:
        out = fn(X_2x4, P_2x4)
    except Exception as exc:                       # the learner's program: say what it said
        first = (str(exc).strip().splitlines() or [""])[0]
        # jax >= 0.8 names the context mesh; jax 0.7 refuses a nested pmap given devices=.
        if "context mesh" in first or "Nested pmap" in first:
            return _say(False, "that is still a jax.pmap inside a jax.pmap, which today's JAX "
                        "refuses. Map the inner 'data' axis with jax.vmap(..., "
                        "axis_name='data') inside the jax.pmap over 'model'.")
        if "unbound axis" in first.lower():
            return _say(False, f"an axis name is not bound where a collective uses it ({first}). "
                        f"Name the jax.pmap's axis 'model' and the jax.vmap's 'data'.")
        return _say(False, f"modern(x, p) raised {type(exc).__name__}: {first}")
    if out is None:
        return _say(False, "modern(x, p) returned None; return the result of the JAX program.")
    module = type(out).__module__
    if module.startswith("simpmd"):
        return _say(False, "modern(x, p) returned simpmd's result; the exercise asks for the "
                    "program run by real JAX: jax.pmap over 'model' with jax.vmap over 'data'.")
    if not module.startswith("jax"):
        return _say(False, f"modern(x, p) returned a {type(out).__name__} made outside JAX; "
                    f"return what the JAX program computed (a jax.Array).")
    a = np.asarray(out, dtype=np.float64)
    if a.shape == (4, 2) and np.allclose(a.T, expected_2x4()):
        return _say(False, "the values are right but the result is (4, 2), 'model' first: "
                    "give jax.pmap out_axes=1 so that 'model' is axis 1 again, as in x.")
    if not _explain_2x4(a, "modern(x, p)", quiet=True):
        return _explain_2x4(a, "modern(x, p)")
    names = _mapped_names(fn)
    if names == {"data"}:
        return _say(False, "the values are right, but 'data' is the axis on the devices and "
                    "'model' the vmapped one: that is section 5a's port. Here put 'model' on "
                    "the 4 devices: jax.pmap over axis 1 of x (in_axes=1, out_axes=1), with "
                    "jax.vmap(..., axis_name='data') inside.")
    if names == {"data", "model"}:
        return _say(False, "the values are right, but both axes run on devices (a shard_map "
                    "over a 2-D mesh, as in section 5b). The exercise asks for jax.pmap over "
                    "'model' with jax.vmap over 'data' inside, so that each device holds one "
                    "column of the grid.")
    return _explain_2x4(a, "modern(x, p)")
