"""Programs to time on a real accelerator, and simpmd's prediction of each.

``benchmarks/roofline_vs_device.py`` and lesson 7 time these with ``jax.jit`` on the
machine's accelerator and set :attr:`simpmd.cost.Roofline.predicted_s` (for the preset
that matches the device) beside each: matmuls in bf16, fp8 and f32 at DEFAULT and HIGHEST
precision, elementwise work, GELU, a reduction, a transpose, RMSNorm, layernorm, softmax,
attention, a SwiGLU MLP and a whole LLaMA-sized transformer layer, and gradients.
``size=1`` is the full size (a matmul of 8192^3, a LLaMA-3-70B layer at 4096 tokens, as
issue 36 measured them); ``size=16`` divides the dimensions by 16 for a CPU.

:data:`RECORDED` holds what was measured on real GPUs by an earlier session of this
project, with its provenance; ``tests/cost/test_predictions_vs_measured.py`` holds the
predictions to them.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math
import statistics
import time
from simpmd import cost
from simpmd.cost.hardware import HARDWARE, preset_for_device_kind


def _jax():
    import jax  # optional: JAX
    import jax.numpy as jnp
    return jax, jnp


def _matmul(m, k, n, dtype, precision=None, out=None):
    jax, jnp = _jax()
    dt = jnp.dtype(dtype)
    fn = lambda a, b: jnp.matmul(a, b, precision=precision, preferred_element_type=out)
    return fn, (jax.ShapeDtypeStruct((m, k), dt), jax.ShapeDtypeStruct((k, n), dt))


def _elementwise(s):
    jax, jnp = _jax()
    return (lambda x: 2 * x + 1), (jax.ShapeDtypeStruct((2 ** 29 // s ** 2,), jnp.bfloat16),)


def _gelu(s):
    jax, jnp = _jax()
    return jax.nn.gelu, (jax.ShapeDtypeStruct((2 ** 29 // s ** 2,), jnp.bfloat16),)


def _sum(s):
    jax, jnp = _jax()
    return (lambda x: x.sum()), (jax.ShapeDtypeStruct((2 ** 28 // s ** 2,), jnp.float32),)


def _transpose(s):
    jax, jnp = _jax()
    return (lambda x: x.T), (jax.ShapeDtypeStruct((16384 // s, 16384 // s), jnp.bfloat16),)


def rms_norm(x, w):
    """RMSNorm in float32, the weight applied before the cast back (w * x / rms(x))."""
    jax, jnp = _jax()
    xf = x.astype(jnp.float32)
    return (w * (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-5))).astype(x.dtype)


def layer_norm(x, g, b):
    """Layernorm in float32 (mean, then the variance of the centred values)."""
    jax, jnp = _jax()
    xf = x.astype(jnp.float32)
    m = xf.mean(-1, keepdims=True)
    v = ((xf - m) ** 2).mean(-1, keepdims=True)
    return ((xf - m) * jax.lax.rsqrt(v + 1e-5) * g + b).astype(x.dtype)


def attention(q, k, v):
    """Plain (unfused) attention, heads first: bf16 scores, softmax in float32."""
    jax, jnp = _jax()
    s = jnp.einsum("hqd,hkd->hqk", q, k).astype(jnp.float32) * (1 / math.sqrt(q.shape[-1]))
    p = jax.nn.softmax(s, -1).astype(q.dtype)
    return jnp.einsum("hqk,hkd->hqd", p, v)


def swiglu(x, wg, wu, wd):
    jax, _ = _jax()
    return (jax.nn.silu(x @ wg) * (x @ wu)) @ wd


def _norm_args(s, *extra):
    jax, jnp = _jax()
    d = 8192 // s
    return (jax.ShapeDtypeStruct((16384 // s, d), jnp.bfloat16),) + tuple(
        jax.ShapeDtypeStruct((d,), jnp.float32) for _ in extra)


def _attention_args(s):
    jax, jnp = _jax()
    a = jax.ShapeDtypeStruct((max(64 // s, 1), 4096 // s, 128), jnp.bfloat16)
    return (a, a, a)


def _mlp_args(s):
    jax, jnp = _jax()
    t, d, f = 4096 // s, 8192 // s, 28672 // s
    sd = lambda *shape: jax.ShapeDtypeStruct(shape, jnp.bfloat16)
    return (sd(t, d), sd(d, f), sd(d, f), sd(f, d))


def _grad(fn, argnums):
    """The gradient of fn's float32 sum with respect to ``argnums``."""
    jax, jnp = _jax()
    return jax.grad(lambda *a: fn(*a).astype(jnp.float32).sum(), argnums=argnums)


def transformer_layer(x, p):
    """One LLaMA-style decoder layer (RMSNorm, grouped-query attention with a causal mask,
    SwiGLU MLP, residuals) for a single sequence, in bf16 with float32 softmax and norms."""
    jax, jnp = _jax()
    t, d = x.shape
    hd = 128
    h, kv = d // hd, p["wk"].shape[1] // hd
    y = rms_norm(x, p["n1"])
    q = (y @ p["wq"]).reshape(t, h, hd).transpose(1, 0, 2)
    k = jnp.repeat((y @ p["wk"]).reshape(t, kv, hd).transpose(1, 0, 2), h // kv, axis=0)
    v = jnp.repeat((y @ p["wv"]).reshape(t, kv, hd).transpose(1, 0, 2), h // kv, axis=0)
    s = jnp.einsum("hqd,hkd->hqk", q, k).astype(jnp.float32) * (1 / math.sqrt(hd))
    s = jnp.where(jnp.tril(jnp.ones((t, t), bool)), s, -1e30)
    o = jnp.einsum("hqk,hkd->hqd", jax.nn.softmax(s, -1).astype(x.dtype), v)
    x = x + o.transpose(1, 0, 2).reshape(t, d) @ p["wo"]
    return x + swiglu(rms_norm(x, p["n2"]), p["wg"], p["wu"], p["wd"])


def _layer_args(s):
    jax, jnp = _jax()
    t, d, f = 4096 // s, 8192 // s, 28672 // s
    kv = max(8 // s, 1) * 128
    sd = lambda *shape, dt=jnp.bfloat16: jax.ShapeDtypeStruct(shape, dt)
    p = {"n1": sd(d, dt=jnp.float32), "n2": sd(d, dt=jnp.float32), "wq": sd(d, d),
         "wk": sd(d, kv), "wv": sd(d, kv), "wo": sd(d, d), "wg": sd(d, f), "wu": sd(d, f),
         "wd": sd(f, d)}
    return (sd(t, d), p)


@dataclass(frozen=True)
class Program:
    """One program to time: its name and how to build (function, abstract arguments) at
    a size divisor ``s`` (1: full size)."""

    name: str
    build: object

    def at(self, s: int):
        return self.build(s)


def _programs():
    jax, jnp = _jax()
    hi = jax.lax.Precision.HIGHEST
    m = lambda s, n: max(n // s, 128)
    return [
        Program("bf16 matmul 8192^3", lambda s: _matmul(m(s, 8192), m(s, 8192), m(s, 8192), "bfloat16")),
        Program("bf16 matmul 4096x8192 @ 8192x28672",
                lambda s: _matmul(m(s, 4096), m(s, 8192), m(s, 28672), "bfloat16")),
        Program("bf16 matmul 2048^3", lambda s: _matmul(m(s, 2048), m(s, 2048), m(s, 2048), "bfloat16")),
        Program("bf16 matmul 1024^3", lambda s: _matmul(m(s, 1024), m(s, 1024), m(s, 1024), "bfloat16")),
        Program("fp8 matmul 8192^3 (e4m3, bf16 out)",
                lambda s: _matmul(m(s, 8192), m(s, 8192), m(s, 8192), "float8_e4m3fn",
                                  out=jnp.bfloat16)),
        Program("f32 matmul 8192^3 (DEFAULT)", lambda s: _matmul(m(s, 8192), m(s, 8192), m(s, 8192), "float32")),
        Program("f32 matmul 8192^3 (HIGHEST)",
                lambda s: _matmul(m(s, 8192), m(s, 8192), m(s, 8192), "float32", precision=hi)),
        Program("f32 matmul 4096^3 (DEFAULT)", lambda s: _matmul(m(s, 4096), m(s, 4096), m(s, 4096), "float32")),
        Program("elementwise 2x+1, 1 GiB bf16", _elementwise),
        Program("GELU, 1 GiB bf16", _gelu),
        Program("sum of 1 GiB f32", _sum),
        Program("transpose 16384^2 bf16", _transpose),
        Program("RMSNorm 16384x8192 bf16", lambda s: (rms_norm, _norm_args(s, "w"))),
        Program("layernorm 16384x8192 bf16", lambda s: (layer_norm, _norm_args(s, "g", "b"))),
        Program("softmax 64x4096x4096 f32", lambda s: (lambda x: jax.nn.softmax(x, -1), (
            jax.ShapeDtypeStruct((max(64 // s, 1), 4096 // s, 4096 // s), jnp.float32),))),
        Program("attention 64 heads x 4096 x 128", lambda s: (attention, _attention_args(s))),
        Program("SwiGLU MLP, 4096 tokens (LLaMA-70B sizes)", lambda s: (swiglu, _mlp_args(s))),
        Program("transformer layer, 4096 tokens (LLaMA-70B sizes)",
                lambda s: (transformer_layer, _layer_args(s))),
        Program("gradient: RMSNorm", lambda s: (_grad(rms_norm, (0, 1)), _norm_args(s, "w"))),
        Program("gradient: attention", lambda s: (_grad(attention, (0, 1, 2)), _attention_args(s))),
        Program("gradient: SwiGLU MLP (weights)", lambda s: (_grad(swiglu, (1, 2, 3)), _mlp_args(s))),
        Program("gradient: transformer layer",
                lambda s: (_grad(transformer_layer, (0, 1)), _layer_args(s))),
    ]


def programs():
    """Every :class:`Program` the benchmark times, in the order it prints them."""
    return _programs()


def find(name: str) -> Program:
    for p in programs():
        if p.name == name:
            return p
    raise KeyError(f"no program named {name!r}; the programs are {[p.name for p in programs()]}")


def predict(fn, args, hardware, *, overlap=True):
    """simpmd's prediction of ``fn(*args)`` (abstract arguments) on ``hardware``."""
    jax, _ = _jax()
    return cost.roofline_of(jax.make_jaxpr(fn)(*args), hardware=hardware).predict(overlap=overlap)


def accelerator():
    """The device to time on: the first GPU or TPU JAX can reach (even when the CPU is its
    default backend, as lesson 7's set-up makes it), else the first CPU device."""
    jax, _ = _jax()
    for platform in ("gpu", "tpu"):
        try:
            return jax.devices(platform)[0]
        except RuntimeError:
            continue
    return jax.devices("cpu")[0]


def preset_for(device):
    """The simpmd.cost preset that matches ``device`` (its ``device_kind``), or None."""
    return None if device.platform == "cpu" else preset_for_device_kind(device.device_kind)


def concrete(args, device, seed=0):
    """Arrays on ``device`` with the shapes and dtypes of the abstract ``args``."""
    jax, jnp = _jax()
    key = jax.random.key(seed)
    leaves, tree = jax.tree_util.tree_flatten(args)
    out = []
    for n, a in enumerate(leaves):
        x = jax.random.normal(jax.random.fold_in(key, n), a.shape, jnp.float32) * 0.1
        out.append(jax.device_put(x.astype(a.dtype), device))
    return jax.tree_util.tree_unflatten(tree, out)


def time_on(fn, args, device, repeats=10):
    """The median seconds of ``jax.jit(fn)`` on ``device``, called from Python and waited
    for (after one call that compiles it)."""
    jax, _ = _jax()
    compiled = jax.jit(fn)
    values = concrete(args, device)
    jax.block_until_ready(compiled(*values))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*values))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def _horner(x):
    """A degree-8 polynomial, 16 multiplies and adds per value, all in one fused kernel."""
    y = x
    for _ in range(8):
        y = y * x + 1.0
    return y


def measure_cpu(device=None, repeats=5, n=1024, stream_bytes=2**22):
    """A preset for this machine's CPU whose rates are measured here, with ``jax.jit``:

    * the cost of one call: a jitted ``x + 1`` on 8 values (``dispatch_s``);
    * matmul FLOP/s, float32 and bfloat16: an ``n``-cubed product (2 n^3 FLOPs);
    * memory bandwidth: the bytes a maximum over ``stream_bytes`` of float32 reads;
    * elementwise FLOP/s: a fused degree-8 polynomial over 2^16 float32 values, its FLOPs
      counted as simpmd's roofline counts them.

    Each is the median of ``repeats`` calls after one that compiles (:func:`time_on`), less
    the cost of a call. The rest (links, latencies) is the toy ``"CPU"`` preset's. A CPU's
    caches make its rates depend on sizes: the defaults are those of the programs
    :func:`programs` builds at a sixteenth of their size (4 MiB arrays)."""
    jax, jnp = _jax()
    device = device or jax.devices("cpu")[0]
    call = time_on(lambda a: a + 1, (jax.ShapeDtypeStruct((8,), jnp.float32),), device,
                   max(repeats, 50))

    def rate(work, fn, *shapes):
        seconds = time_on(fn, tuple(jax.ShapeDtypeStruct(*a) for a in shapes), device, repeats)
        return work / max(seconds - call, seconds / 10)

    matmul = {dt: rate(2 * n**3, lambda a, b: a @ b, ((n, n), dt), ((n, n), dt))
              for dt in (jnp.float32, jnp.bfloat16)}
    bandwidth = rate(stream_bytes, jnp.max, ((stream_bytes // 4,), jnp.float32))
    values = jax.ShapeDtypeStruct((2**16,), jnp.float32)
    polynomial = cost.roofline_of(jax.make_jaxpr(_horner)(values)).unfused_flops
    elementwise = rate(polynomial, _horner, ((2**16,), jnp.float32))
    note = (f"measured on this machine's CPU with jax {jax.__version__} by simpmd.jax."
            f"device_programs.measure_cpu: {matmul[jnp.float32] / 1e9:.3g} and "
            f"{matmul[jnp.bfloat16] / 1e9:.3g} GFLOP/s (f32, bf16 {n}^3 matmuls), "
            f"{bandwidth / 1e9:.3g} GB/s (max over {stream_bytes / 2**20:g} MiB), "
            f"{elementwise / 1e9:.3g} GFLOP/s elementwise, {call * 1e6:.3g} us a call")
    return replace(HARDWARE["CPU"], peak_fp32_flops=matmul[jnp.float32],
                   peak_bf16_flops=matmul[jnp.bfloat16], hbm_bandwidth=bandwidth,
                   elementwise_flops=elementwise, dispatch_s=call, memory_efficiency=None,
                   matmul_efficiency=(), citations=(note,))


LAUNCH_BOUND_S = 50e-6     # programs measured below this are reported, not judged


@dataclass(frozen=True)
class Row:
    name: str
    predicted_s: float | None
    measured_s: float
    bound: str = ""

    @property
    def ratio(self):
        return self.predicted_s / self.measured_s if self.predicted_s else None

    @property
    def judged(self) -> bool:
        return self.ratio is not None and self.measured_s >= LAUNCH_BOUND_S


def geomean(rows) -> float | None:
    """The geometric mean of predicted / measured over the judged rows."""
    ratios = [r.ratio for r in rows if r.judged]
    return math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None


def table(rows, hardware=None) -> str:
    """Predicted against measured, one line per program, and the geometric mean."""
    lines = [f"{'program':52s} {'predicted':>11s} {'measured':>11s} {'ratio':>6s}  bound"]
    for r in rows:
        pred = f"{r.predicted_s * 1e3:9.3f} ms" if r.predicted_s else f"{'-':>12s}"
        ratio = f"{r.ratio:6.2f}" if r.ratio else f"{'':6s}"
        flag = "" if r.judged or r.ratio is None else "  (launch-bound: under 50 us)"
        lines.append(f"{r.name:52s} {pred} {r.measured_s * 1e3:8.3f} ms {ratio}  {r.bound}{flag}")
    g = geomean(rows)
    if g is not None:
        lines.append(f"geometric mean of predicted / measured ({hardware}): {g:.2f}")
    return "\n".join(lines)


# -- what was measured on real GPUs (issue 36; docs/benchmarks.md) ------------------------
# Each row: (program, the preset it ran on, measured seconds, its JAX version, where it was
# recorded, the "simpmd lower bound" the issue printed for it in ms (the Scaling Book's
# roofline as simpmd computed it before this work, which pins down which program ran), or
# None). None of these numbers chose any parameter of the presets.
_ISSUE_H200 = ("issue 36, 'On a real NVIDIA H200 (jax 0.11.2)': median of jax.jit(f) over the "
               "lower bound simpmd.cost.roofline_of printed")
_DESIGN = "docs/DESIGN.md, 'What XLA runs, measured on a real H200 (jax 0.11.2, 2026-11-28)'"
_ISSUE_H100 = ("issue 36, 'On a real H100 (jax 0.11.2)': one whole LLaMA-70B layer at 4096 "
               "tokens, its lower bound 1.21x (forward) and 1.31x (gradient) the measured time")
RECORDED = (
    ("bf16 matmul 8192^3", "H200", 1.76e-3, "0.11.2", _ISSUE_H200, 1.11),
    ("bf16 matmul 4096x8192 @ 8192x28672", "H200", 2.89e-3, "0.11.2", _ISSUE_H200, 1.94),
    ("SwiGLU MLP, 4096 tokens (LLaMA-70B sizes)", "H200", 8.80e-3, "0.11.2", _ISSUE_H200, 5.83),
    ("gradient: SwiGLU MLP (weights)", "H200", 16.97e-3, "0.11.2", _ISSUE_H200, 13.61),
    ("elementwise 2x+1, 1 GiB bf16", "H200", 0.85e-3, "0.11.2", _ISSUE_H200, 0.90),
    ("sum of 1 GiB f32", "H200", 0.37e-3, "0.11.2", _ISSUE_H200, 0.22),
    ("f32 matmul 8192^3 (DEFAULT)", "H200", 3.18e-3, "0.11.2", _ISSUE_H200, 16.4),
    ("RMSNorm 16384x8192 bf16", "H200", 0.30e-3, "0.11.2", _ISSUE_H200, 0.90),
    ("attention 64 heads x 4096 x 128", "H200", 2.59e-3, "0.11.2", _ISSUE_H200, 9.90),
    ("bf16 matmul 1024^3", "H200", 60e-6, "0.11.2", _DESIGN + ": 'about 60 us' from Python", None),
    ("transformer layer, 4096 tokens (LLaMA-70B sizes)", "H100", 13.6e-3, "0.11.2", _ISSUE_H100,
     13.6 * 1.21),
    ("gradient: transformer layer", "H100", 35.8e-3, "0.11.2", _ISSUE_H100, 35.8 * 1.31),
)
