"""Random programs on unreduced and reduced values, written once for both engines.

``run(engine, program)`` runs a program (a list of operation names, applied one after the
other to a value drawn at the start) op by op on a 2 x 2 mesh of Explicit axes X and Y,
and gives what ``typeof`` printed after each step, or the kind of error that stopped it.
``engine`` is ``simpmd`` or ``jax``: the same code runs with either's names.
"""
import numpy as np

STARTS = ["unreduced", "unreduced_xy", "reduced", "replicated", "split"]
OPS = ["add", "add_other", "sub", "neg", "mul_scalar", "mul_reduced", "div_reduced", "mul_self",
       "transpose", "sum0", "sum", "reshape", "astype", "tanh", "cos", "abs", "pow3", "max", "min",
       "argmax", "where",
       "concat", "matmul", "reshard_whole", "reshard_split", "reshard_unreduced",
       "reshard_reduced", "add_replicated"]


def names(engine):
    """(numpy, reshard, P, make_mesh, device_put, typeof) of ``engine``."""
    if engine.__name__ == "jax":
        import jax.numpy as jnp
        reshard = getattr(engine, "reshard", None) or engine.sharding.reshard
        return jnp, reshard, engine.sharding.PartitionSpec, engine.make_mesh, engine.device_put, \
            engine.typeof
    import simpmd.numpy as snp
    return snp, engine.reshard, engine.P, engine.make_mesh, engine.device_put, engine.typeof


def start(engine, kind, P, reshard, device_put, np_):
    a = device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), P(None, "X"))
    b = device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4) / 4, P("X", None))
    if kind == "unreduced":
        return np_.einsum("ij,jk->ik", a, b, out_sharding=P(None, None, unreduced={"X"}))
    if kind == "unreduced_xy":
        a2 = device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), P(None, ("X", "Y")))
        b2 = device_put(np.ones((4, 4), np.float32), P(("X", "Y"), None))
        return np_.einsum("ij,jk->ik", a2, b2, out_sharding=P(None, None, unreduced={"X", "Y"}))
    whole = device_put(np.arange(16.0, dtype=np.float32).reshape(4, 4), P(None, None))
    if kind == "reduced":
        return reshard(whole, P(None, None, reduced={"X"}))
    if kind == "split":
        return b
    return whole


def step(op, v, engine):
    np_, reshard, P, _, device_put, typeof = names(engine)
    two = reshard(device_put(np.float32(2.0), P()), P(reduced={"X"}))
    if op == "add":
        return v + v
    if op == "add_other":
        return v + reshard(v, P(*([None] * v.ndim)))
    if op == "sub":
        return v - v
    if op == "neg":
        return -v
    if op == "mul_scalar":
        return v * 2.0
    if op == "mul_reduced":
        return v * two
    if op == "div_reduced":
        return v / two
    if op == "mul_self":
        return v * v
    if op == "transpose":
        return v.T
    if op == "sum0":
        return v.sum(0)
    if op == "sum":
        return v.sum()
    if op == "reshape":
        return v.reshape(-1)
    if op == "astype":
        return v.astype(np.int32)
    if op in ("tanh", "cos", "abs") or (op in ("max", "min") and v.ndim):  # (jnp.max of a
        return getattr(np_, op)(v)                          # scalar binds nothing in simpmd)
    if op == "pow3":
        return v ** 3
    if op == "argmax" and v.ndim:
        return np_.argmax(v, axis=0)
    if op == "where":
        return np_.where(True, v, v)
    if op == "concat":                            # (scalars do not concatenate)
        return np_.concatenate([v, v]) if v.ndim else v + v
    if op == "matmul" and v.ndim:
        return v @ device_put(np.eye(v.shape[-1], dtype=np.float32), P(None, None))
    if op == "reshard_whole":
        return reshard(v, P(*([None] * v.ndim)))
    if op == "reshard_split":                     # (a scalar has no dimension to split)
        return reshard(v, P("Y", *([None] * (v.ndim - 1))) if v.ndim else P())
    if op == "reshard_unreduced":                 # (jax 0.7.2 fails an assertion on a scalar)
        return reshard(v, P(*([None] * v.ndim), unreduced={"X"}) if v.ndim else P())
    if op == "reshard_reduced":
        return reshard(v, P(*([None] * v.ndim), reduced={"X"}))
    if op == "add_replicated":
        return v + device_put(np.ones(v.shape, np.float32), P(*([None] * v.ndim)))
    if op in ("max", "min", "argmax", "matmul"):  # on a scalar: left out
        return v
    raise ValueError(op)


# jax 0.11.2 takes the max (min) of an unreduced value as an unreduced max ({U_max:X}),
# whose reshard is the max of the partial sums' maxima, a wrong value: simpmd refuses it.
PARTIAL_EXTREME = "jax's extreme of partial sums"


def kind_of(exc) -> str:
    """An error's kind, as both engines name it (simpmd's subclass JAX's built-ins)."""
    if "of partial sums is not the" in str(exc):
        return PARTIAL_EXTREME
    if type(exc).__name__ == "ShardingTypeError":
        return "ShardingTypeError"
    for base in (NotImplementedError, ValueError, TypeError):
        if isinstance(exc, base):
            return base.__name__
    return type(exc).__name__


def run(engine, program) -> list:
    """What ``typeof`` printed after the start and each step; an error ends the list as
    'raised <kind>'."""
    np_, reshard, P, make_mesh, device_put, typeof = names(engine)
    axis_type = getattr(engine.sharding, "AxisType")
    mesh = make_mesh((2, 2), ("X", "Y"), axis_types=(axis_type.Explicit,) * 2)
    seen = []
    with engine.set_mesh(mesh):
        try:
            v = start(engine, program[0], P, reshard, device_put, np_)
            seen.append(str(typeof(v)))
            for op in program[1:]:
                v = step(op, v, engine)
                seen.append(str(typeof(v)))
                if "{U_max:" in seen[-1] or "{U_min:" in seen[-1]:
                    seen[-1] = f"raised {PARTIAL_EXTREME}"
                    break
        except Exception as exc:                  # the kind is compared, not the words
            seen.append(f"raised {kind_of(exc)}")
    return seen


def programs(count, seed=0, length=3) -> list:
    """``count`` random programs: a start, then 1 to ``length`` operations."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, length + 1))
        out.append([STARTS[rng.integers(len(STARTS))]] + [OPS[k] for k in rng.integers(len(OPS), size=n)])
    return out


if __name__ == "__main__":         # a long draw: python tests/unreduced_cases.py COUNT SEED
    import sys
    import jax
    import simpmd
    count, seed = (int(a) for a in (sys.argv[1:] + ["200", "1"])[:2])
    draw = programs(count, seed) + [[s, o] for s in STARTS for o in OPS]
    bad = [(p, run(simpmd, p), run(jax, p)) for p in draw]
    bad = [b for b in bad if b[1] != b[2]]
    for p, mine, theirs in bad:
        print(p, "\n  simpmd", mine, "\n  jax   ", theirs)
    print(f"jax {jax.__version__}: {len(draw) - len(bad)} of {len(draw)} programs agree")
