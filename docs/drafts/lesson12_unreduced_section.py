# Lesson 12, a section to insert after its FSDP backward (issue 40): unreduced and reduced
# types. Cells in the percent format (# %%); written by the hosts helper while lesson 12
# belonged to the learner branch, for the lead to place and re-execute. It needs only what
# lesson 12 already imports (numpy as np, jax, simpmd, P, snp, AxisType).
# Checked on jax 0.7.2, 0.10.2 and 0.12.0.1: the printed lines are the same on each, apart
# from the lines starting "On this JAX", which the course's tests leave out.

# %% [markdown]
# ## Partial sums in the type: `unreduced` and `reduced`
#
# A product over a dimension split on both operands leaves each device with a *partial
# sum*: section 4 asked `out_sharding` to finish it with an all-reduce (or a
# reduce-scatter). JAX can also keep the partial sums *as a type*: with
# `out_sharding=P(None, None, unreduced={'data'})` the result is `float32[8,8]{U:data}`,
# "unreduced over `data`": every device along `data` holds a full-shape partial sum, and the
# array is their sum. Nothing is communicated until a `reshard` to an ordinary sharding asks
# for the sum (JAX's *Autodiff and sharding*,
# https://docs.jax.dev/en/latest/301/sharding-ad.html).

# %%
umesh = simpmd.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
rng_u = np.random.default_rng(12)
XA, XB = rng_u.normal(size=(8, 16)).astype(np.float32), rng_u.normal(size=(16, 8)).astype(np.float32)
with simpmd.set_mesh(umesh):
    xa = simpmd.device_put(XA, P(None, "data"))          # columns split over 'data'
    xb = simpmd.device_put(XB, P("data", None))          # rows split over 'data'
    partial = snp.einsum("ij,jk->ik", xa, xb, out_sharding=P(None, None, unreduced={"data"}))
    print("the product:", simpmd.typeof(partial), "| collectives so far:",
          simpmd.last_trace().collective_counts() or "none")
    blocks = [s.data for s in partial.addressable_shards]
    print("device 0's block is its own columns' share:",
          np.allclose(blocks[0], np.outer(XA[:, 0], XB[0]) + np.outer(XA[:, 1], XB[1])))
    summed = simpmd.reshard(partial, P(None, None))
    print("reshard to P(None, None):", simpmd.typeof(summed), simpmd.last_trace().collective_counts(),
          "| equals XA @ XB:", np.allclose(np.asarray(summed), XA @ XB, atol=1e-4))
    split = simpmd.reshard(partial, P("data", None))
    print("reshard to P('data', None):", simpmd.typeof(split), simpmd.last_trace().collective_counts())

jumesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
with jax.set_mesh(jumesh):
    ja = jax.device_put(XA, jax.P(None, "data"))
    jb = jax.device_put(XB, jax.P("data", None))
    jpartial = jnp.einsum("ij,jk->ik", ja, jb, out_sharding=jax.P(None, None, unreduced={"data"}))
    print("on JAX:", jax.typeof(jpartial), "then", jax.typeof(jax.sharding.reshard(jpartial, jax.P(None, None))))

# %% [markdown]
# Only *linear* operations can work on partial sums: the sum of two unreduced arrays is the
# unreduced sum, but the `tanh` of a sum is not the sum of the `tanh`s. JAX refuses a
# nonlinear operation on an unreduced value (and, in older releases, most operations: which
# ones it accepts grew from 0.7 to 0.12; simpmd follows the JAX installed beside it).

# %%
with simpmd.set_mesh(umesh):
    print("partial + partial:", simpmd.typeof(partial + partial))
    try:
        snp.tanh(partial)
        print("tanh of partial sums: accepted")
    except Exception:
        print("tanh of partial sums: refused by simpmd")
with jax.set_mesh(jumesh):
    show_error("jax.numpy.tanh(partial sums)", lambda: jnp.tanh(jpartial), first_line_only=True)

# %% [markdown]
# **Gradients.** FSDP's backward (above) sums each weight's gradient over `data`; with a
# replicated weight, JAX sums it inside the product that makes it. A weight cast to
# `reduced={'data'}` (the same copies everywhere: the cast moves nothing) gets an
# *unreduced* gradient instead: JAX's cotangent of reduced is unreduced. The sum is then
# one `reshard`, placed where the program says: an all-reduce for a replicated weight, a
# reduce-scatter (FSDP's) for a split one. With several microbatches the partial sums add up
# first, and the weight's gradient is summed once per step instead of once per microbatch.

# %%
XD, WD = rng_u.normal(size=(32, 16)).astype(np.float32), rng_u.normal(size=(16, 4)).astype(np.float32)

def data_loss(w, x):
    return snp.sum((x @ w) ** 2)

with simpmd.set_mesh(umesh):
    x_d = simpmd.device_put(XD, P("data", None))
    w_r = simpmd.reshard(simpmd.device_put(WD, P(None, None)), P(None, None, reduced={"data"}))
    g = simpmd.grad(data_loss)(w_r, x_d)
    g_whole = simpmd.reshard(g, P(None, None))
    once = simpmd.last_trace().collective_counts()
    g_fsdp = simpmd.reshard(g, P("data", None))
    print("weight", simpmd.typeof(w_r), "| gradient summed:", simpmd.typeof(g_whole),
          "equals 2 x^T (x w):", np.allclose(np.asarray(g_whole), 2 * XD.T @ (XD @ WD), rtol=1e-4, atol=1e-3),
          "| scattered as FSDP keeps it:", simpmd.typeof(g_fsdp))
    # which rules hold depends on the JAX release (0.7.2 had no unreduced gradients), and
    # simpmd follows the one installed: these lines say what yours does
    print(f"On this JAX ({jax.__version__}): simpmd, following it, makes the gradient {simpmd.typeof(g)}; "
          f"summing it: {once or 'nothing left to sum'}; scattering it: "
          f"{simpmd.last_trace().collective_counts() or 'a local slice'}")

with jax.set_mesh(jumesh):
    jw_r = jax.sharding.reshard(jax.device_put(WD, jax.P(None, None)), jax.P(None, None, reduced={"data"}))
    jg = jax.grad(lambda w, x: jnp.sum((x @ w) ** 2))(jw_r, jax.device_put(XD, jax.P("data", None)))
    print(f"On this JAX ({jax.__version__}): the gradient is {jax.typeof(jg)}")
