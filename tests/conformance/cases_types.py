"""Sharding in types, after the ShardingInTypesTest cases of JAX's tests/pjit_test.py: jit
over a mesh of Explicit axes, where every value's type names how it is split (``typeof``
prints ``float32[8@x,4@y]``), ``reshard`` moves it, ``out_sharding=`` chooses a product's
split, and a program whose split is ambiguous is refused. Each program runs under jit on
arguments placed with ``device_put``; results are compared in value, type and sharding."""
import numpy as np

from .engines import Case
from .inputs import ar, mesh, put, rnd

CASES = []
PJ = "pjit_test.py::ShardingInTypesTest::"
NEW7 = ("new: jax 0.7.2 runs cumsum along a split dimension; simpmd refuses it as 0.10 "
        "and later do ('Input should be unsharded over the axis being reduced')")
NEW4 = "new: simpmd has no vmap (jax.vmap with spmd_axis_name has no counterpart)"


def add(name, program, inputs=lambda: (), **kw):
    CASES.append(Case(name, program, inputs, **kw))


def typed(body, *specs, shape=(4, 2), names=("x", "y"), jit=True):
    """A program: place each input as its spec on an Explicit mesh, run ``body(jx, *args)``
    (under jit unless ``jit=False``), return the result and its type's text."""
    def program(jx, *xs):
        m = mesh(jx, shape, names, types="explicit")
        args = [put(jx, x, m, *s) for x, s in zip(xs, specs)]
        f = (lambda *a: body(jx, *a))
        with jx.set_mesh(m):             # a bare P in reshard and out_sharding needs it
            out = (jx.jit(f) if jit else f)(*args)
        return out, str(jx.typeof(out))
    return program


def runs_on(jax, program, inputs) -> bool:
    """Whether this JAX runs ``program``: for the rules JAX's versions disagree on."""
    try:
        program(jax, *inputs())
    except Exception:
        return False
    return True


# -- placing and elementwise: test_basic_mul, test_fully_replicated_array_mul,
#    test_aval_repr, test_device_put_sharded ----------------------------------------------------

for _i, _spec in enumerate([("x", "y"), ("y", "x"), (("x", "y"),), (None, "y"), (), ("x",),
                            (("y", "x"), None)]):
    add(f"device_put_{_i}", typed(lambda jx, a: a, _spec, jit=False), lambda: (ar(8, 4),),
        follows=PJ + "test_aval_repr")
    add(f"elementwise_{_i}", typed(lambda jx, a: jx.numpy.sin(a) * 2 + 1, _spec),
        lambda: (rnd(8, 4, seed=30),), follows=PJ + "test_basic_mul")

_BINARY = {
    "same_specs": (lambda jx, a, b: a * b, ("x", "y"), ("x", "y"), False),
    "replicated_other": (lambda jx, a, b: a + b, ("x", "y"), (), False),
    "bias_broadcast": (lambda jx, a, b: a + b[0], ("x", "y"), (None, "y"), False),
    "different_specs": (lambda jx, a, b: a + b, ("x", None), (None, "x"), True),
    "crossed_axes": (lambda jx, a, b: a * b, ("x", "y"), ("y", "x"), True),
    "where": (lambda jx, a, b: jx.numpy.where(a > b, a, b), ("x", "y"), ("x", "y"), False),
    "maximum_with_scalar": (lambda jx, a, b: jx.numpy.maximum(a, 0.0) + b, ("x",), ("x",), False),
}
for _name, (_body, _sa, _sb, _raises) in _BINARY.items():
    add(f"binary_{_name}", typed(_body, _sa, _sb), lambda: (rnd(8, 4, seed=31), rnd(8, 4, seed=32)),
        follows=PJ + "test_fully_replicated_array_mul", raises=_raises)


# -- reductions, transposes, reshapes, slices: test_reduce_max, test_reduce_sum,
#    test_transpose, test_reshape_split, test_slice, test_squeeze, test_concatenate -------------

_UNARY = {
    "sum_all": lambda jx, a: a.sum(),
    "sum_axis0": lambda jx, a: a.sum(axis=0),
    "sum_axis1": lambda jx, a: a.sum(axis=1),
    "max_axis0": lambda jx, a: a.max(axis=0),
    "mean_axis1": lambda jx, a: jx.numpy.mean(a, axis=1),
    "argmax_axis1": lambda jx, a: jx.numpy.argmax(a, axis=1),
    "transpose": lambda jx, a: a.T,
    "swapaxes": lambda jx, a: jx.numpy.swapaxes(a, 0, 1),
    "reshape_split_leading": lambda jx, a: a.reshape(4, 2, 4),
    "reshape_split_trailing": lambda jx, a: a.reshape(8, 2, 2),
    "expand_dims": lambda jx, a: jx.numpy.expand_dims(a, 1),
    "index_first_row": lambda jx, a: a[0],
    "index_column": lambda jx, a: a[:, 1],
    "slice_whole_dim": lambda jx, a: a[:, :2],
    "slice_split_dim": lambda jx, a: a[:4],
    "slice_step": lambda jx, a: a[::2],
    "concatenate_axis1": lambda jx, a: jx.numpy.concatenate([a, a], axis=1),
    "concatenate_axis0": lambda jx, a: jx.numpy.concatenate([a, a], axis=0),
    "astype_int": lambda jx, a: a.astype(np.int32),
    "cumsum_axis1": lambda jx, a: jx.numpy.cumsum(a, axis=1),
    "square_and_sqrt": lambda jx, a: jx.numpy.sqrt(a * a + 1.0),
    "clip": lambda jx, a: jx.numpy.clip(a, -0.5, 0.5),
}


def _unary_case(name, body, spec):
    program = typed(body, spec)
    inputs = lambda: (rnd(8, 4, seed=33),)
    ok = None

    def raises(jax):
        nonlocal ok
        if ok is None:
            ok = runs_on(jax, program, inputs)
        return not ok
    xfail = ""
    if name == "cumsum_axis1" and spec[-1] == "y":
        xfail = lambda jax: NEW7 if not raises(jax) else ""
    add(f"{name}_{'_'.join(str(s) for s in spec) or 'replicated'}", program, inputs,
        follows=PJ + "test_reduce_sum", raises=raises, xfail=xfail,
        versions="whether a slice or reshape of a split dimension is refused differs between "
                 "JAX releases; the running JAX decides")


for _name, _body in _UNARY.items():
    for _spec in (("x", "y"), ("x",), (None, "y")):
        _unary_case(_name, _body, _spec)


def _merge(jx, a):
    return a.reshape(8, 24, 1)


_MERGE = typed(_merge, ("a", "b"), shape=(4, 2), names=("a", "b"))
add("reshape_merging_split_and_whole_dims", _MERGE, lambda: (ar(8, 4, 6),),
    follows=PJ + "test_reshape_merge", raises=lambda jax: not runs_on(jax, _MERGE, lambda: (ar(8, 4, 6),)),
    versions="jax 0.10.2 refuses it; 0.12 types it float32[8@a,24@b,1]")


# -- products: test_dot_general, test_dot_general_out_sharding, test_einsum_with_out_sharding,
#    test_matmul_reshard, test_contracting_dim_sharded_error ------------------------------------

_DOTS = {
    "rows_split": (lambda jx, a, b: a @ b, ("x",), (), False),
    "cols_split": (lambda jx, a, b: a @ b, (), (None, "y"), False),
    "both_free_dims": (lambda jx, a, b: a @ b, ("x",), (None, "y"), False),
    "contracting_split_ambiguous": (lambda jx, a, b: a @ b, (None, "y"), ("y",), True),
    "contracting_split_out_sharding": (lambda jx, a, b: jx.numpy.matmul(a, b, out_sharding=jx.P("x")),
                                       (None, "y"), ("y",), False),
    "out_sharding_reshards": (lambda jx, a, b: jx.numpy.dot(a, b, out_sharding=jx.P(None, "y")),
                              ("x",), (), False),
    "einsum": (lambda jx, a, b: jx.numpy.einsum("ij,jk->ik", a, b), ("x",), (None, "y"), False),
    "einsum_out_sharding": (lambda jx, a, b: jx.numpy.einsum("ij,jk->ik", a, b,
                                                             out_sharding=jx.P("x", "y")),
                            ("x",), (), False),
    "same_axis_on_free_dims": (lambda jx, a, b: a @ b, ("x",), (None, "x"), True),
}
for _name, (_body, _sa, _sb, _raises) in _DOTS.items():
    add(f"dot_{_name}", typed(_body, _sa, _sb), lambda: (rnd(8, 4, seed=34), rnd(4, 6, seed=35)),
        follows=PJ + "test_dot_general", raises=_raises)


def _batched(jx, a, b):
    return jx.numpy.einsum("bij,bjk->bik", a, b)


add("dot_batch_dims_split_alike", typed(_batched, ("x",), ("x",)),
    lambda: (rnd(4, 2, 3, seed=36), rnd(4, 3, 2, seed=37)), follows=PJ + "test_dot_general_batch")


def _empty_product(jx, a, b):
    m = mesh(jx, (4, 2), ("model", "data"), types="explicit")
    a = put(jx, a, m, None, ("model", "data"))
    b = put(jx, b, m, None, ("model", "data"))
    out = jx.jit(lambda u, v: u @ v)(a, b)
    return out, str(jx.typeof(out))


add("dot_of_empty_arrays", _empty_product, lambda: (np.zeros((4, 0), np.float32), np.zeros((0, 8), np.float32)),
    follows=PJ + "test_dot_general")


# -- reshard and out_sharding: test_reshard, test_out_sharding_zeros, test_jit_out_shardings,
#    test_set_mesh_device_put ------------------------------------------------------------------

for _i, (_from, _to) in enumerate([(("x", "y"), ("y", "x")), (("x", "y"), ()), ((), ("x",)),
                                   (("x",), (None, "x")), ((("x", "y"),), ("x", "y"))]):
    add(f"reshard_{_i}", typed((lambda to: lambda jx, a: jx.sharding.reshard(a, jx.P(*to)))(_to), _from),
        lambda: (ar(8, 4),), follows=PJ + "test_reshard")


def _bare_spec_without_mesh(jx, x):
    m = mesh(jx, types="explicit")
    return jx.jit(lambda v: jx.sharding.reshard(v, jx.P()))(put(jx, x, m, "x"))


add("reshard_to_bare_spec_without_set_mesh", _bare_spec_without_mesh, lambda: (ar(8, 4),),
    follows=PJ + "test_reshard", raises=True)


def _zeros_out_sharding(jx):
    m = mesh(jx, types="explicit")
    with jx.set_mesh(m):
        out = jx.jit(lambda: jx.numpy.zeros((8, 4), out_sharding=jx.P("x", "y")))()
    return out, str(jx.typeof(out))


add("zeros_out_sharding", _zeros_out_sharding, follows=PJ + "test_out_sharding_zeros")


def _jit_out_shardings(jx, x):
    m = mesh(jx, types="explicit")
    a = put(jx, x, m, "x", "y")
    out = jx.jit(lambda v: v * 2, out_shardings=jx.NamedSharding(m, jx.P()))(a)
    return out, str(jx.typeof(out))


add("jit_out_shardings_replicated", _jit_out_shardings, lambda: (ar(8, 4),),
    follows="pjit_test.py::PJitTest::testOutShardingsReplicated")


def _set_mesh_device_put(jx, x):
    m = mesh(jx, types="explicit")
    with jx.set_mesh(m):
        a = jx.device_put(x, jx.P("x"))
        out = jx.jit(lambda v: v.sum(axis=1))(a)
    return out, str(jx.typeof(a)), str(jx.typeof(out))


add("set_mesh_device_put_spec", _set_mesh_device_put, lambda: (ar(8, 4),),
    follows=PJ + "test_set_mesh")


def _typeof_inside_jit(jx, x):
    m = mesh(jx, types="explicit")
    seen = []
    jx.jit(lambda v: seen.append(str(jx.typeof(v * 2 + v.sum(0)))) or v)(put(jx, x, m, "x"))
    return seen[0]


add("typeof_inside_jit", _typeof_inside_jit, lambda: (rnd(8, 4, seed=38),), follows=PJ + "test_aval_repr")


# -- autodiff of typed programs: test_grad_sharding, test_value_and_grad_types ------------------

_GRADS = {
    "square_sum": (lambda jx, a: (a * a).sum(), ("x", "y")),
    "tanh_mean": (lambda jx, a: jx.numpy.tanh(a).mean(), ("x",)),
    "matmul": (lambda jx, a: (a @ np.ones((4, 3), np.float32)).sum(), ("x",)),
    "reshard_inside": (lambda jx, a: (jx.sharding.reshard(a, jx.P()) ** 2).sum(), ("x", "y")),
    "sum_axis0": (lambda jx, a: jx.numpy.sin(a.sum(axis=0)).sum(), (None, "y")),
}
for _name, (_loss, _spec) in _GRADS.items():
    add(f"grad_{_name}_typed",
        typed((lambda f: lambda jx, a: jx.grad(lambda v: f(jx, v))(a))(_loss), _spec),
        lambda: (rnd(8, 4, seed=39),), follows=PJ + "test_grad_sharding")


def _mlp_step(jx, x, w1, w2):
    m = mesh(jx, types="explicit")
    x, w1, w2 = put(jx, x, m, "x"), put(jx, w1, m, None, "y"), put(jx, w2, m, "y")

    def loss(a, b):
        h = jx.numpy.tanh(x @ a)
        return jx.numpy.matmul(h, b, out_sharding=jx.P("x")).sum()
    with jx.set_mesh(m):
        g = jx.jit(jx.grad(loss, argnums=(0, 1)))(w1, w2)
    return g, [str(jx.typeof(t)) for t in g]


add("tensor_parallel_mlp_grads", _mlp_step, lambda: (rnd(8, 4, seed=40), rnd(4, 6, seed=41), rnd(6, 2, seed=42)),
    follows=PJ + "test_grad_sharding")


# -- Auto axes, where XLA chooses: values only --------------------------------------------------

def _auto(jx, x, w):
    m = mesh(jx)
    a, b = put(jx, x, m, "x"), put(jx, w, m)
    return jx.jit(lambda u, v: jx.numpy.tanh(u @ v).sum(axis=0))(a, b)


add("auto_mesh_jit_values", _auto, lambda: (rnd(8, 4, seed=43), rnd(4, 4, seed=44)),
    follows="pjit_test.py::PJitTest::testBasic1D", shardings=False)


def _vmap(jx, x):
    return jx.vmap(lambda v: v.sum())(x)


add("vmap_basic", _vmap, lambda: (ar(8, 4),), follows="api_test.py::vmap", xfail=NEW4)
