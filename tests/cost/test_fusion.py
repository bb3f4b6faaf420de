"""simpmd.cost.fusion: the kernels XLA would run and the HBM bytes each moves, against
byte counts worked out by hand for small programs (real JAX's jaxprs and simpmd's own)."""
import numpy as np
import pytest

import simpmd
import simpmd.numpy as snp
from simpmd.cost.fusion import fuse, fused_bytes

R, C_ = 64, 32      # rows and columns of the small programs


def kernels(jax, fn, *shapes):
    program = jax.make_jaxpr(fn)(*[jax.ShapeDtypeStruct(s, d) for s, d in shapes])
    return fuse(program.jaxpr.eqns, program.jaxpr.outvars)


def total(ks):
    return sum(k.bytes for k in ks)


def test_elementwise_chain_is_one_pass(jax8):
    jnp = jax8.numpy
    ks = kernels(jax8, lambda x: 2 * x + 1, ((R, C_), jnp.bfloat16))
    assert [k.kind for k in ks] == ["loop"]
    assert total(ks) == 2 * R * C_ * 2              # read x, write the result, bf16


def test_rms_norm_reads_x_twice(jax8):
    """A reduction kernel (x, its square, the row sums) and an elementwise kernel that
    recomputes x in float32 and applies the scale: 3 passes of bf16 x, the row sums
    written once and read once, the weight read once."""
    from simpmd.jax.device_programs import rms_norm
    jnp = jax8.numpy
    ks = kernels(jax8, rms_norm, ((R, C_), jnp.bfloat16), ((C_,), jnp.float32))
    assert [k.kind for k in ks] == ["reduction", "loop"]
    assert total(ks) == 3 * 2 * R * C_ + 2 * 4 * R + 4 * C_


def test_softmax_is_three_kernels(jax8):
    """Row max; exp(x - max) with its row sums; exp(x - max) / sum recomputed: x read three
    times, the probabilities written once, each row vector written once and read where used."""
    jnp = jax8.numpy
    ks = kernels(jax8, lambda s: jax8.nn.softmax(s, -1), ((R, C_), jnp.float32))
    assert [k.kind for k in ks] == ["reduction", "reduction", "loop"]
    assert total(ks) == 4 * 4 * R * C_ + 5 * 4 * R


def test_sibling_reductions_share_a_pass(jax8):
    """mean(x) and mean(x * x) over the same rows: one kernel reads x once (XLA's
    multi-output fusion)."""
    jnp = jax8.numpy
    ks = kernels(jax8, lambda x: (x.mean(-1), (x * x).mean(-1)), ((R, C_), jnp.float32))
    assert len(ks) == 1 and total(ks) == 4 * R * C_ + 2 * 4 * R


def test_matmul_epilogue(jax8):
    """gelu(x @ w + b): one kernel reading x, w and the bias vector (never broadcast in
    memory), writing the activation."""
    jnp = jax8.numpy
    B, D, F = 32, 64, 128
    ks = kernels(jax8, lambda x, w, b: jax8.nn.gelu(x @ w + b), ((B, D), jnp.bfloat16),
                 ((D, F), jnp.bfloat16), ((F,), jnp.bfloat16))
    assert [k.kind for k in ks] == ["matmul"]
    assert total(ks) == 2 * (B * D + D * F + F + B * F)


def test_a_widening_cast_is_not_an_epilogue(jax8):
    """The GEMM writes its own (bf16) result; a cast to float32 is a kernel of its own."""
    jnp = jax8.numpy
    B, D, F = 32, 64, 128
    ks = kernels(jax8, lambda x, w: (x @ w).astype(jnp.float32), ((B, D), jnp.bfloat16),
                 ((D, F), jnp.bfloat16))
    assert [k.kind for k in ks] == ["matmul", "loop"]
    assert total(ks) == 2 * (B * D + D * F + B * F) + (2 + 4) * B * F


def test_a_transpose_into_a_dot_is_free(jax8):
    jnp = jax8.numpy
    B, D, F = 32, 64, 128
    ks = kernels(jax8, lambda x, w: x @ w.T, ((B, D), jnp.bfloat16), ((F, D), jnp.bfloat16))
    assert len(ks) == 1 and total(ks) == 2 * (B * D + F * D + B * F)
    alone = kernels(jax8, lambda w: w.T, ((F, D), jnp.bfloat16))
    assert total(alone) == 2 * 2 * F * D                   # a transpose on its own copies


def test_a_transposed_product_is_the_product_with_its_operands_swapped(jax8):
    """A weight's gradient as JAX's transpose rule writes it, dot(ct, x) then a transpose
    into the weight's layout: one GEMM that writes the transposed result (XLA's
    transpose(dot(a, b)) -> dot(b, a)), reading ct and x and writing dw once."""
    jnp = jax8.numpy
    B, D, F = 32, 64, 128
    grad = lambda x, w: jax8.grad(lambda w: (x @ w).astype(jnp.float32).sum())(w)
    ks = kernels(jax8, grad, ((B, D), jnp.bfloat16), ((D, F), jnp.bfloat16))
    last = ks[-1]
    assert last.kind == "matmul" and [e.primitive.name for e in last.eqns] == [
        "dot_general", "transpose"]
    assert last.bytes == 2 * (B * F + B * D + D * F)


def test_a_transpose_of_a_product_read_elsewhere_still_copies(jax8):
    """The product's result is also returned, so it is written, and its transpose is a
    copy (the rule needs the transpose to be the product's only reader); a transpose that
    moves a batch axis out of the front is a copy too."""
    jnp = jax8.numpy
    B, D, F = 32, 64, 128
    def both(x, w):
        y = x @ w
        return y, y.T
    ks = kernels(jax8, both, ((B, D), jnp.bfloat16), ((D, F), jnp.bfloat16))
    assert sum(k.kind == "loop" for k in ks) == 1
    batched = kernels(jax8, lambda a, b: jnp.einsum("bij,bjk->bik", a, b).transpose(1, 0, 2),
                      ((4, B, D), jnp.bfloat16), ((4, D, F), jnp.bfloat16))
    assert [k.kind for k in batched] == ["matmul", "loop"]


def test_simpmd_programs_fuse_alike():
    program = simpmd.make_jaxpr(lambda x: (2 * x + 1, snp.sum(x * x, axis=-1)))(
        np.ones((R, C_), np.float32))
    ks = fuse(program.eqns, program.outvars)
    # the sum of squares reads x; 2x + 1 reads x again and writes its result
    assert total(ks) == 4 * R * C_ + 4 * R + 4 * R * C_ + 4 * R * C_
    assert fused_bytes(program) == total(ks)


def test_fusion_never_moves_more_than_every_equation_on_its_own(jax8):
    """For every program the benchmark times (and their gradients), the fused kernels move
    no more bytes than the equations one by one (JAX's unfused_hbm_bytes), and at least
    what the program must read and write once."""
    from simpmd import cost as C
    from simpmd.jax.device_programs import programs
    for program in programs():
        fn, args = program.at(32)
        jaxpr = jax8.make_jaxpr(fn)(*args)
        r = C.roofline_of(jaxpr, hardware="H100")
        p = r.prediction
        io = sum(v.aval.size * v.aval.dtype.itemsize for v in jaxpr.jaxpr.invars) + sum(
            v.aval.size * v.aval.dtype.itemsize for v in jaxpr.jaxpr.outvars)
        # (JAX's unfused count has a transpose free; on its own it copies: io bytes)
        assert io <= p.fused_bytes <= max(r.bytes, io), program.name


def _in_order(ks):
    """Whether each kernel reads only what earlier kernels wrote (what a compute stream
    running them in order needs)."""
    made = {o: n for n, k in enumerate(ks) for e in k.eqns for o in e.outvars}
    return all(made.get(v, -1) < n for n, k in enumerate(ks) for v in k.reads)


def test_kernels_come_in_an_order_each_can_run_in(jax8):
    """Two row sums of x, one read by a product before the other is taken: XLA could compute
    them in one pass only by delaying the product's input; they stay two kernels, in order."""
    jnp = jax8.numpy

    def f(x, w):
        a = x.sum(-1)
        return jnp.outer(a, a) @ w, (x * x).sum(-1)
    ks = kernels(jax8, f, ((R, C_), jnp.float32), ((R, C_), jnp.float32))
    assert _in_order(ks)
    assert sum(k.kind == "reduction" for k in ks) == 2


def test_the_kernels_of_every_timed_program_come_in_order(jax8):
    from simpmd.jax.device_programs import programs
    for program in programs():
        fn, args = program.at(32)
        jaxpr = jax8.make_jaxpr(fn)(*args)
        assert _in_order(fuse(jaxpr.jaxpr.eqns, jaxpr.jaxpr.outvars)), program.name


# -- eager PyTorch: one kernel per operation --------------------------------------------------

def test_eager_runs_each_operation_as_a_kernel(jax8):
    """2 * exp(x) + 1 in eager PyTorch: exp, mul, add, three kernels, each reading its
    operand and writing its result (the scalars broadcast in place): 6 passes of bf16 x,
    where XLA's one fused kernel makes 2."""
    jnp = jax8.numpy
    program = jax8.make_jaxpr(lambda x: 2 * jnp.exp(x) + 1)(
        jax8.ShapeDtypeStruct((R, C_), jnp.bfloat16))
    eager = fuse(program.jaxpr.eqns, program.jaxpr.outvars, eager=True)
    fused = fuse(program.jaxpr.eqns, program.jaxpr.outvars)
    assert [k.kind for k in eager] == ["loop"] * 3 and len(fused) == 1
    assert total(eager) == 3 * 2 * R * C_ * 2 and total(fused) == 2 * R * C_ * 2


def test_eager_reductions_do_not_join_their_producers(jax8):
    """mean(x * x) and mean(x) eagerly: the square (read x, write x * x), each row sum (read
    its operand, write R floats) and each division by the row length (read R, write R):
    five kernels, no input fusion and no shared pass (XLA: one kernel reading x once)."""
    jnp = jax8.numpy
    program = jax8.make_jaxpr(lambda x: ((x * x).mean(-1), x.mean(-1)))(
        jax8.ShapeDtypeStruct((R, C_), jnp.float32))
    ks = fuse(program.jaxpr.eqns, program.jaxpr.outvars, eager=True)
    n, r = 4 * R * C_, 4 * R
    assert [k.bytes for k in ks] == [2 * n, n + r, 2 * r, n + r, 2 * r]
    assert [k.kind for k in ks] == ["loop", "reduction", "loop", "reduction", "loop"]


def _calls_by_function(source) -> dict:
    """Each function of ``source`` -> the names of the functions it calls."""
    import ast
    found = {}
    for fn in ast.walk(ast.parse(source)):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.setdefault(fn.name, set()).update(
                node.func.id for node in ast.walk(fn)
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name))
    return found


def test_fusion_reads_no_primitive_names():
    """cost/fusion.py decides from the rows' columns: it reads a primitive's name only to
    label a kernel (Kernel.name), looks no row up by name, and holds no primitive's name
    as a string (outside its docstrings) to compare one with."""
    import ast
    import inspect
    from simpmd.core.core import PRIMITIVES
    from simpmd.cost import fusion
    source = inspect.getsource(fusion)
    readers = {f for f, called in _calls_by_function(source).items() if "_primitive_name" in called}
    assert readers == {"name"}
    tree = ast.parse(source)
    assert not any(isinstance(n, ast.Name) and n.id == "PRIMITIVES" for n in ast.walk(tree))
    assert not any(isinstance(n, ast.Attribute) and n.attr == "startswith" for n in ast.walk(tree))
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    held = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
            and isinstance(n.value, str) and id(n) not in docstrings}
    kinds = {"view", "broadcast", "elementwise", "reduction", "matmul", "collective",
             "in_place", "block", "opaque", "loop", "copy"}
    assert not (held - kinds) & set(PRIMITIVES), sorted((held - kinds) & set(PRIMITIVES))
