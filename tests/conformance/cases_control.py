"""Control flow, after JAX's tests/lax_control_flow_test.py (fori_loop, while_loop, scan,
cond, switch, their gradients and their type errors) and the rep-rule tests of
tests/shard_map_test.py (test_scan_rep_rule, test_while_rep_rule, test_cond_rep_rule,
test_switch_rep_rule, test_cond_pvary_errors, test_scan_pvary_errors)."""
import numpy as np

from .engines import Case
from .inputs import ar, mesh, pcast_varying, rnd

CASES = []
CF = "lax_control_flow_test.py::"
SM = "shard_map_test.py::"
ITEM17 = ("issue 45 item 17: grad of (x, w) through a cond in shard_map says w's gradient "
          "varies and refuses it")


def add(name, program, inputs=lambda: (), **kw):
    CASES.append(Case(name, program, inputs, **kw))


# -- loops and branches under jit, no mesh: testForiLoopBasic, testWhileWithTuple,
#    testScanImpl, testCond, testSwitch, testScanGrad, testWhileTypeErrors ------------------

_LOOPS = {
    "fori_loop_sum": lambda jx, x: jx.lax.fori_loop(0, 5, lambda i, c: c + i * x, x),
    "fori_loop_traced_upper": lambda jx, x: jx.lax.fori_loop(0, x.shape[0], lambda i, c: c * 1.5, x),
    "while_loop_tuple": lambda jx, x: jx.lax.while_loop(
        lambda c: c[0] < 4, lambda c: (c[0] + 1, c[1] * 2.0), (0, x))[1],
    "while_loop_data_dependent": lambda jx, x: jx.lax.while_loop(
        lambda c: c.sum() < 100.0, lambda c: c * 2.0 + 1.0, x),
    "scan_cumsum": lambda jx, x: jx.lax.scan(lambda c, r: (c + r, c * r), np.zeros(3, np.float32),
                                             x.reshape(4, 3)),
    "scan_reverse": lambda jx, x: jx.lax.scan(lambda c, r: (c + r, c), np.zeros(3, np.float32),
                                              x.reshape(4, 3), reverse=True),
    "scan_no_xs": lambda jx, x: jx.lax.scan(lambda c, _: (c * 0.5, c.sum()), x, None, length=3),
    "scan_unroll": lambda jx, x: jx.lax.scan(lambda c, r: (jx.numpy.sin(c) + r, c),
                                             np.zeros(3, np.float32), x.reshape(4, 3), unroll=2),
    "scan_pytree_carry": lambda jx, x: jx.lax.scan(
        lambda c, r: ({"a": c["a"] + r, "b": c["b"] * 2.0}, r.sum()),
        {"a": np.zeros(3, np.float32), "b": np.float32(1.0)}, x.reshape(4, 3)),
    "cond_true": lambda jx, x: jx.lax.cond(x.sum() > 0, lambda v: v * 2.0, lambda v: v - 1.0, x),
    "cond_false": lambda jx, x: jx.lax.cond(x.sum() < 0, lambda v: v * 2.0, lambda v: v - 1.0, x),
    "cond_two_operands": lambda jx, x: jx.lax.cond(True, lambda a, b: a + b, lambda a, b: a - b, x, x),
    "switch_middle": lambda jx, x: jx.lax.switch(1, [lambda v: v, lambda v: v * 3.0, lambda v: -v], x),
    "switch_clamps_high": lambda jx, x: jx.lax.switch(7, [lambda v: v, lambda v: v * 3.0], x),
    "switch_clamps_negative": lambda jx, x: jx.lax.switch(-3, [lambda v: v, lambda v: v * 3.0], x),
}
for _name, _body in _LOOPS.items():
    for _jit in (False, True):
        add(f"{_name}{'_jit' if _jit else ''}",
            (lambda b, j: lambda jx, x: (jx.jit(lambda v: b(jx, v)) if j else (lambda v: b(jx, v)))(x))(_body, _jit),
            lambda: (ar(12) / 4,), follows=CF + "testForiLoopBasic")


_GRAD_LOOPS = {
    "scan": lambda jx, x: jx.lax.scan(lambda c, r: (jx.numpy.tanh(c * r), c), x[:3], x.reshape(4, 3))[0].sum(),
    "fori_loop": lambda jx, x: jx.lax.fori_loop(0, 3, lambda i, c: jx.numpy.sin(c) * x, x).sum(),
    "cond": lambda jx, x: jx.lax.cond(x[0] > 0, lambda v: (v ** 2).sum(), lambda v: v.sum(), x),
    "switch": lambda jx, x: jx.lax.switch(2, [lambda v: v.sum(), lambda v: (v ** 3).sum(),
                                              lambda v: jx.numpy.exp(v).sum()], x),
    "scan_checkpointed": lambda jx, x: jx.lax.scan(jx.checkpoint(lambda c, r: (jx.numpy.sin(c) * r, c)),
                                                   x[:3], x.reshape(4, 3))[0].sum(),
}
for _name, _loss in _GRAD_LOOPS.items():
    add(f"grad_{_name}", (lambda f: lambda jx, x: jx.jit(jx.grad(lambda v: f(jx, v)))(x))(_loss),
        lambda: (rnd(12, seed=20),), follows=CF + "testScanGrad")


_TYPE_ERRORS = {
    "cond_branch_shapes_differ": lambda jx, x: jx.lax.cond(True, lambda v: v, lambda v: v[:2], x),
    "cond_branch_dtypes_differ*": lambda jx, x: jx.lax.cond(True, lambda v: v, lambda v: v.astype(np.int32), x),
    "scan_carry_shape_changes": lambda jx, x: jx.lax.scan(lambda c, r: (c[:1], r), x[:3], x.reshape(4, 3)),
    "while_carry_dtype_changes": lambda jx, x: jx.lax.while_loop(lambda c: c[0] < 3,
                                                                 lambda c: c.astype(np.int32), x),
    "while_cond_not_scalar": lambda jx, x: jx.lax.while_loop(lambda c: c < 3, lambda c: c + 1, x),
    "fori_loop_carry_shape_changes": lambda jx, x: jx.lax.fori_loop(0, 2, lambda i, c: c[:1], x),
    "switch_branch_outputs_differ": lambda jx, x: jx.lax.switch(0, [lambda v: v, lambda v: (v, v)], x),
}
for _name, _bad in _TYPE_ERRORS.items():
    add(_name.rstrip("*"), (lambda f: lambda jx, x: jx.jit(lambda v: f(jx, v))(x))(_bad),
        lambda: (ar(12),), follows=CF + "testWhileTypeErrors", raises=True)


# -- control flow in shard_map and its vma rules ---------------------------------------------

def _in_shard_map(body, in_specs=("x",), out_specs=("x",), check_vma=True, jit=False):
    def program(jx, x):
        m = mesh(jx, (4,), ("x",))
        f = jx.shard_map(lambda v: body(jx, v), mesh=m, in_specs=jx.P(*in_specs),
                         out_specs=jx.P(*out_specs), check_vma=check_vma)
        return (jx.jit(f) if jit else f)(x)
    return program


_SHMAP = {
    "scan_varying_carry": (lambda jx, v: jx.lax.scan(lambda c, r: (c + r, c), v, v.reshape(1, -1) * np.ones((3, 1), np.float32))[0], None),
    "scan_psum_inside": (lambda jx, v: jx.lax.scan(lambda c, _: (jx.lax.psum(c, "x") * 0.25, None), v, None, length=3)[0], True),
    "fori_loop_ppermute": (lambda jx, v: jx.lax.fori_loop(0, 3, lambda i, c: jx.lax.ppermute(c, "x", [(k, (k + 1) % 4) for k in range(4)]), v), None),
    "while_loop_pmax": (lambda jx, v: jx.lax.while_loop(lambda c: jx.lax.pmax(c.max(), "x") < 50.0, lambda c: c * 2.0 + 1.0, v), None),
    "cond_on_axis_index": (lambda jx, v: jx.lax.cond(jx.lax.axis_index("x") % 2 == 0, lambda u: u * 10.0, lambda u: -u, v), None),
    "switch_on_axis_index": (lambda jx, v: jx.lax.switch(jx.lax.axis_index("x"), [lambda u: u, lambda u: u + 1.0, lambda u: u * 3.0], v), None),
    "cond_replicated_predicate": (lambda jx, v: jx.lax.cond(jx.lax.psum(v.sum(), "x") > 0, lambda u: u * 2.0, lambda u: u, v), None),
}
for _name, (_body, _note) in _SHMAP.items():
    for _jit in (False, True):
        add(f"shard_map_{_name}{'_jit' if _jit else ''}", _in_shard_map(_body, jit=_jit),
            lambda: (ar(8) - 3,), follows=SM + "test_scan_rep_rule", shardings=not _jit,
            raises=bool(_note))      # a varying carry that a psum makes replicated: refused


def _carry_turns_varying(jx, v):
    """The carry starts replicated and the body makes it vary: refused, pcast it first."""
    return jx.lax.scan(lambda c, r: (c + r, None), np.zeros(2, np.float32), v.reshape(1, 2))[0]


def _carry_pcast_first(jx, v):
    c0 = pcast_varying(jx, np.zeros(2, np.float32), "x")
    return jx.lax.scan(lambda c, r: (c + r, None), c0, v.reshape(1, 2))[0]


add("shard_map_scan_carry_turns_varying_is_refused", _in_shard_map(_carry_turns_varying),
    lambda: (ar(8),), follows=SM + "test_scan_pvary_errors", raises=True)
add("shard_map_scan_carry_pcast_first", _in_shard_map(_carry_pcast_first), lambda: (ar(8),),
    follows=SM + "test_scan_pvary_errors")


def _while_turns_varying(jx, v):
    return jx.lax.fori_loop(0, 2, lambda i, c: c + v, np.zeros(2, np.float32))


add("shard_map_fori_carry_turns_varying_is_refused", _in_shard_map(_while_turns_varying),
    lambda: (ar(8),), follows=SM + "test_while_rep_rule", raises=True)
add("shard_map_fori_carry_turns_varying_without_check", _in_shard_map(_while_turns_varying, check_vma=False),
    lambda: (ar(8),), follows=SM + "test_while_rep_rule")


def _cond_mixed(jx, v):
    """One branch returns a replicated value, the other a varying one: refused."""
    return jx.lax.cond(True, lambda u: u, lambda u: np.zeros(2, np.float32), v)


add("shard_map_cond_branch_vma_differs_is_refused", _in_shard_map(_cond_mixed), lambda: (ar(8),),
    follows=SM + "test_cond_pvary_errors", raises=True)


def _cond_two_axes(jx, x, y):
    m = mesh(jx)
    body = lambda a, b: jx.lax.cond(True, lambda u, w: u, lambda u, w: w, a, b)
    f = jx.shard_map(body, mesh=m, in_specs=(jx.P("x"), jx.P("y")), out_specs=jx.P(("x", "y")))
    return f(x, y)


add("shard_map_cond_branches_vary_over_different_axes", _cond_two_axes, lambda: (ar(8), ar(4)),
    follows=SM + "test_cond_pvary_errors", raises=True)


def _grad_cond_two_args(jx, x, w):
    m = mesh(jx, (4,), ("x",))

    def loss(a, b):
        y = jx.lax.cond(a.sum() > 0, lambda v: v @ b, lambda v: v, a)
        return (y ** 2).sum()
    f = jx.shard_map(jx.grad(loss, argnums=(0, 1)), mesh=m, in_specs=(jx.P("x"), jx.P()),
                     out_specs=(jx.P("x"), jx.P("x")), check_vma=True)
    return jx.jit(f)(x, w)


add("grad_of_cond_in_shard_map_two_argnums", _grad_cond_two_args,
    lambda: (np.abs(rnd(8, 3, seed=21)), rnd(3, 3, seed=22)), follows=SM + "test_cond_rep_rule",
    shardings=False)


def _pmap_loop(kind, jit):
    bodies = {"fori_loop": lambda jx, v: jx.lax.fori_loop(0, 2, lambda i, c: c * 2.0, v),
              "scan": lambda jx, v: jx.lax.scan(lambda c, _: (c * 2.0, None), v, None, length=2)[0],
              "while_loop": lambda jx, v: jx.lax.while_loop(lambda c: c.sum() < 50.0, lambda c: c * 2.0, v)}

    def program(jx, x):
        f = jx.pmap(lambda v: bodies[kind](jx, v), axis_name="p")
        return (jx.jit(f) if jit else f)(x)
    return program


for _kind in ("fori_loop", "scan", "while_loop"):
    for _jit in (False, True):
        add(f"pmap_{_kind}{'_under_jit' if _jit else ''}", _pmap_loop(_kind, _jit),
            lambda: (ar(8, 4) + 1,), follows=CF + "testForiLoopBasic", shardings=False)
