"""``plan.serve``: serving a model, its prefill and its decode step simulated on shapes.

    from simpmd import plan
    s = plan.serve(plan.LLAMA3_70B, plan.Layout(tp=8), hardware="H100", batch=16,
                   prompt_len=2048, gen_len=256, precision="fp8")
    s.ttft_s, s.tpot_s, s.tokens_per_s_per_chip, s.kv_cache_bytes

A served request has two phases (the Scaling Book's chapter "All About Transformer
Inference"): the **prefill** runs the whole prompt through the layers at once, as a
training step's forward pass does, writing each layer's keys and values into the **KV
cache**; each **decode** step then runs one new token per sequence through the layers,
its attention reading every cached key and value. Both are SPMD programs here, run with
``simpmd.shard_map`` over the layout's mesh on ``ShapeDtypeStruct`` s and costed by the
one predictor (:func:`simpmd.cost.predict.predict`), as ``plan.estimate`` costs a
training step:

* **tensor parallelism** (``tp``) is Megatron's: each chip holds ``heads / tp`` query heads
  and their keys and values, ``1 / tp`` of the MLP's columns and rows; one all-reduce after
  attention and one after the MLP. With more chips than key/value heads
  (grouped-query attention, ``kv_heads < tp``), each key/value head is held by
  ``tp / kv_heads`` chips (duplicated; splitting a head's width instead is not
  modelled): the cache splits over ``min(tp, kv_heads)`` chips only;
* **data parallelism** (``dp``) splits the batch: each replica serves ``batch / dp``
  sequences with every weight;
* **sequence parallelism of the cache** (``cp``) splits the prompt's tokens, and so the
  cache, over ``cp`` chips: the prefill gathers every chip's keys and values for its
  queries (as context parallelism trains); each decode step's query is on every ``cp``
  chip, each attends over its own part of the cache, and one ``psum`` over ``cp``
  combines the parts (the combination of partial attentions by their log-sum-exps that
  flash-decoding uses: T. Dao, D. Haziza, F. Massa, G. Sizov, "Flash-Decoding for
  long-context inference", PyTorch blog, October 2023; the psum moves the partial
  outputs, which is what that combination moves, and on values would need the parts'
  log-sum-exps, which the program leaves out: it is for costing, on shapes).

Decoding is bound by memory: each step reads every weight the chip holds and its share
of the cache to produce one token per sequence, so ``tpot_s`` is at least those bytes
over the chip's HBM bandwidth; a large enough batch makes the products' FLOPs the larger
term. ``precision`` is the weights' and the products' type ("bf16", "fp16" or "fp8": FP8
weights and activations, as TensorRT-LLM's FP8 engines run; the output projection onto
the vocabulary stays 16-bit, an assumption); ``kv_dtype`` the cache's
("bf16", "fp16", "fp8" or "int8"; by default the precision's, as TensorRT-LLM's
FP8 engines of :mod:`simpmd.plan.runs.serving` are built, ``--fp8_kv_cache``). The decode
step's attention reads the cache in its own type (TensorRT-LLM's kernels dequantize "on
the fly", docs/source/gpt_attention.md, "INT8/FP8 KV Caches").

The decode step's attention is one kernel that reads each key/value head's cache once for
its whole group of query heads (``grouped_kernel=True``), or, as TensorRT-LLM's masked
multi-head attention kernel does, once per query head (``grouped_kernel=False``:
:func:`decode_attention`). The decode step is costed once, at the cache's mean length over the generation,
``prompt_len + gen_len / 2`` (its attention grows linearly with the cache, so the mean
step is the step at the mean length); ``kv_cache_bytes`` is the cache after the last
token, ``prompt_len + gen_len`` tokens. Throughput is that of a static batch, as
TensorRT-LLM's ``gptSessionBenchmark`` measures it: ``batch * gen_len`` tokens (the
first from the prefill) in ``ttft_s + (gen_len - 1) * tpot_s``, over the chips.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
import math

import numpy as np

from .. import lax
from .. import numpy as snp
from ..api.shapes import ShapeDtypeStruct
from ..api.shard_map import shard_map
from ..core import primitives as _prim
from ..core.core import Primitive, bind
from ..cost.rows import register
from ..cost.hardware import hardware_preset
from ..cost.predict import predict
from ..machine import devices as _devices
from ..machine.mesh import Mesh
from ..machine.mesh import PartitionSpec as P
from . import layers as L
from . import attention as A
from .attention import flash_attention
from .layout import Layout, LayoutError
from .simulate import HBM_CAPACITY, machine
from .serve_spreads import SPREADS

AXES = ("dp", "cp", "tp")          # the serving mesh, slowest-varying first
TYPES = {"bf16": "bfloat16", "fp16": "float16", "fp8": "float8_e4m3fn", "int8": "int8"}
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1}
PRECISIONS = ("bf16", "fp16", "fp8")
K = 2.0      # the interval's half-width in deviations of ln(predicted / measured)


@dataclass(frozen=True)
class ServingEstimate:
    """What :func:`serve` found: the time to the first token (``ttft_s``, the prefill of
    the batch's prompts), the time per output token after it (``tpot_s``, one decode step
    at the cache's mean length), the bytes of the KV cache one chip holds after the last
    token (``kv_cache_bytes``) and of the weights it holds (``weight_bytes``), and where
    each phase's time goes (``breakdown["prefill"]``, ``breakdown["decode"]``: the
    predictor's terms, adding up to ``ttft_s`` and ``tpot_s``). ``interval_s`` is where a
    measured ``tpot_s`` should lie, from how far the predicted whole times of static
    batches missed on ``validation_runs`` development runs (:mod:`simpmd.plan.runs.serving`,
    ``simpmd/plan/serve_spreads.py``: ``tpot_s * exp(-(m +- 2 s))``, as
    :mod:`simpmd.plan.interval` does for training); ``ttft_interval_s`` the same for
    ``ttft_s`` from the first-token runs."""

    model: object
    layout: Layout
    hardware: str
    precision: str
    kv_dtype: str
    batch: int
    prompt_len: int
    gen_len: int
    ttft_s: float
    tpot_s: float
    kv_cache_bytes: int
    weight_bytes: int
    breakdown: dict
    hbm_bytes: float
    interval_s: tuple = (0.0, math.inf)
    ttft_interval_s: tuple = (0.0, math.inf)
    validation_runs: int = 0

    @property
    def chips(self) -> int:
        return self.layout.chips

    @property
    def total_s(self) -> float:
        """Seconds to serve the batch: the prefill, then ``gen_len - 1`` decode steps."""
        return self.ttft_s + (self.gen_len - 1) * self.tpot_s

    @property
    def tokens_per_s_per_chip(self) -> float:
        """Output tokens per second per chip, the batch served as one static batch."""
        return self.batch * self.gen_len / self.total_s / self.chips

    @property
    def tokens_per_s_per_sequence(self) -> float:
        """What one user sees while decoding: 1 / ``tpot_s``."""
        return 1.0 / self.tpot_s

    @property
    def held_bytes(self) -> int:
        return self.weight_bytes + self.kv_cache_bytes

    @property
    def fits(self) -> bool:
        """Whether the weights and the cache fit the chip's HBM (activations, a few
        tokens' worth per sequence in decode, are not counted)."""
        return self.held_bytes <= self.hbm_bytes

    def __str__(self):
        def parts(phase, total):
            return ", ".join(f"{k} {v * 1e3:.3g} ms" for k, v in self.breakdown[phase].items()
                             if v > 5e-4 * total)
        return (f"{self.model.name or 'model'} served on {self.chips} x {self.hardware} "
                f"({self.precision}, cache {self.kv_dtype}), {describe(self.layout)}, batch "
                f"{self.batch}, {self.prompt_len} tokens in, {self.gen_len} out:\n"
                f"  first token {self.ttft_s * 1e3:.3g} ms ({parts('prefill', self.ttft_s)})\n"
                f"  per output token {self.tpot_s * 1e3:.3g} ms ({parts('decode', self.tpot_s)});"
                f" measured expected in {self.interval_s[0] * 1e3:.3g}-"
                f"{self.interval_s[1] * 1e3:.3g} ms ({self.validation_runs} development runs)\n"
                f"  {self.tokens_per_s_per_chip:,.0f} output tokens/s per chip\n"
                f"  per chip: weights {self.weight_bytes / 1e9:.2f} GB, KV cache "
                f"{self.kv_cache_bytes / 1e9:.2f} GB, of {self.hbm_bytes / 1e9:.0f} GB")


def describe(layout) -> str:
    parts = [f"{a}={getattr(layout, a)}" for a in AXES if getattr(layout, a) > 1]
    return " x ".join(parts) or "one chip"


# -- the layout's limits ----------------------------------------------------------------------

def cache_split(model, layout) -> int:
    """Over how many chips the cache's key/value heads split: ``min(tp, kv_heads)``."""
    return min(layout.tp, model.kv_heads)


def kv_per_chip(model, layout) -> int:
    """Key/value heads one chip holds (a duplicate where ``tp > kv_heads``)."""
    return model.kv_heads // cache_split(model, layout)


def check_serving(model, layout, chips, batch, prompt_len, gen_len, precision, kv_dtype):
    """Raise :class:`LayoutError` naming the first limit the request or the layout breaks."""
    if not isinstance(layout, Layout):
        raise LayoutError(f"layout={layout!r}: pass a plan.Layout (tp=, dp=, cp=)")
    used = [f"{a}={getattr(layout, a)}" for a in ("pp", "vp", "fsdp")
            if getattr(layout, a) > 1]
    if used:
        raise LayoutError(f"Layout({', '.join(used)}): plan.serve lays a model out over tp "
                          f"(heads), dp (the batch) and cp (the cache's tokens); pipeline "
                          f"stages and FSDP are not modelled for serving: use tp, dp and cp")
    for name, value in (("batch", batch), ("prompt_len", prompt_len), ("gen_len", gen_len)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
            raise LayoutError(f"{name}={value!r}: a whole number, at least 1")
    if chips is not None and chips != layout.chips:
        raise LayoutError(f"{chips} chips, but the layout's axes make dp x cp x tp = "
                          f"{layout.dp} x {layout.cp} x {layout.tp} = {layout.chips}")
    if precision not in PRECISIONS:
        raise LayoutError(f"precision={precision!r}: choose one of {', '.join(PRECISIONS)}")
    if kv_dtype not in TYPES:
        raise LayoutError(f"kv_dtype={kv_dtype!r}: choose one of {', '.join(TYPES)}")
    tp, kv = layout.tp, model.kv_heads
    limits = [
        (model.heads % tp, f"heads = {model.heads} do not split over tp = {tp}: each chip "
                           f"serves whole query heads"),
        (kv % tp and tp % kv, f"kv_heads = {kv} and tp = {tp}: either each chip holds whole "
                              f"key/value heads (kv_heads a multiple of tp) or each head is "
                              f"duplicated on a whole number of chips (tp a multiple of "
                              f"kv_heads)"),
        (model.d_ff % tp, f"d_ff = {model.d_ff} does not split over tp = {tp}"),
        (model.vocab % tp, f"vocab = {model.vocab} does not split over tp = {tp} (the "
                           f"vocabulary-parallel embedding and head); pad the vocabulary"),
        (batch % layout.dp, f"batch = {batch} sequences do not split over dp = {layout.dp} "
                            f"replicas"),
        (prompt_len % layout.cp, f"prompt_len = {prompt_len} tokens do not split over cp = "
                                 f"{layout.cp} chips"),
        ((prompt_len + gen_len) % layout.cp,
         f"the cache's {prompt_len} + {gen_len} tokens do not split over cp = {layout.cp}"),
    ]
    for broken, message in limits:
        if broken:
            raise LayoutError(message)


# -- the weights and the cache ----------------------------------------------------------------

def weight_specs(model, layout, precision):
    """{name: (global shape, dtype, PartitionSpec)} of the served weights: the layers'
    stacked ``[layers, ...]``; the key/value projection as wide as the duplicated heads
    where ``tp > kv_heads``."""
    D, hd, Lr = model.d_model, model.head_dim, model.layers
    kvs = kv_per_chip(model, layout) * layout.tp          # key/value heads, duplicates too
    w, a = TYPES[precision], _activations(precision)
    mats = model.mlp_matrices - 1
    return {
        "attn_norm": ((Lr, D), a, P()), "mlp_norm": ((Lr, D), a, P()),
        "wq": ((Lr, D, model.heads * hd), w, P(None, None, "tp")),
        "wkv": ((Lr, D, kvs, 2 * hd), w, P(None, None, "tp")),
        "wo": ((Lr, model.heads * hd, D), w, P(None, "tp")),
        "w_in": ((Lr, D, mats * model.d_ff), w, P(None, None, "tp")),
        "w_out": ((Lr, model.d_ff, D), w, P(None, "tp")),
        "embed": ((model.vocab, D), a, P("tp")),
        "final_norm": ((D,), a, P()),
        "head": ((D, model.vocab), a, P(None, "tp")),
    }


def _activations(precision) -> str:
    """The activations' type: float16 in an fp16 engine, else bfloat16."""
    return "float16" if precision == "fp16" else "bfloat16"


def cache_shape(model, layout, batch, tokens) -> tuple:
    """The global cache of keys (or values): ``[layers, batch, tokens, heads held, width]``."""
    return (model.layers, batch, tokens, kv_per_chip(model, layout) * layout.tp,
            model.head_dim)


CACHE_SPEC = P(None, "dp", "cp", "tp")


def kv_cache_bytes(model, layout, batch, tokens, kv_dtype) -> int:
    """Bytes of keys and values one chip holds for ``tokens`` tokens of each sequence."""
    per = (model.layers * kv_per_chip(model, layout) * model.head_dim
           * (tokens // layout.cp) * (batch // layout.dp))
    return 2 * per * BYTES[kv_dtype]


def weight_bytes(model, layout, precision) -> int:
    """Bytes of the weights one chip holds."""
    total = 0
    for shape, dtype, spec in weight_specs(model, layout, precision).values():
        split = math.prod(layout.tp for d in spec if d == "tp")
        total += math.prod(shape) // split * np.dtype(_dtype(dtype)).itemsize
    return total


def _dtype(name):
    if name.startswith("float8") or name == "bfloat16":
        import ml_dtypes   # optional: it comes with JAX
        return getattr(ml_dtypes, name)
    return np.dtype(name)


# -- one device's programs --------------------------------------------------------------------

def _linear(x, w, precision):
    """``x @ w`` at the precision: FP8 operands (the activation cast as it is written) with
    a 16-bit result, as an FP8 GEMM writes it."""
    if precision == "fp8":
        x = x.astype(_dtype(TYPES["fp8"]))
    dims = (([x.ndim - 1], [0]), ([], []))
    return bind(_prim.dot_general, x, w, dimension_numbers=dims,
                preferred_element_type=np.dtype(_dtype(_activations(precision))))


def _sum_tp(y, tp):
    return lax.psum(y, "tp") if tp > 1 else y


def _attention_proj(model, lay, x, w, precision):
    """q [b, t, heads here, width], k and v [b, t, kv heads here, width]."""
    b, t, _ = x.shape
    hd = model.head_dim
    h = L._rms_norm(x, w["attn_norm"])
    q = _linear(h, w["wq"], precision).reshape(b, t, model.heads // lay.tp, hd)
    kv = _linear(h, w["wkv"].reshape(model.d_model, -1), precision)
    kv = kv.reshape(b, t, -1, 2 * hd)
    return q, kv[..., :hd], kv[..., hd:]


def _after_attention(model, lay, x, o, w, precision):
    b, t = o.shape[:2]
    y = _sum_tp(_linear(o.reshape(b, t, -1), w["wo"], precision), lay.tp)
    x = x + y
    u = _linear(L._rms_norm(x, w["mlp_norm"]), w["w_in"], precision)
    u = L._swiglu(u) if model.gated_mlp else L._gelu(u)
    return x + _sum_tp(_linear(u, w["w_out"], precision), lay.tp)


def _embed(lay, table, tokens):
    """Vocabulary-parallel lookup (each ``tp`` chip holds ``vocab / tp`` rows), psummed."""
    if lay.tp == 1:
        return table[tokens]
    rows = table.shape[0]
    local = tokens - lax.axis_index("tp") * rows
    inside = (local >= 0) & (local < rows)
    found = table[snp.clip(local, 0, rows - 1)]
    return lax.psum(found * inside[..., None].astype(table.dtype), "tp")


def _greedy(lay, params, x):
    """The next token of each sequence from its last position ``x`` [b, D]: the
    vocabulary-parallel head, each chip's best token and score, gathered over ``tp``."""
    h = L._rms_norm(x, params["final_norm"])
    logits = (h @ params["head"]).astype(snp.float32)
    best, where = logits.max(axis=-1), logits.argmax(axis=-1).astype(snp.int32)
    if lay.tp == 1:
        return where
    rows = logits.shape[-1]
    where = where + lax.axis_index("tp") * rows
    bests = lax.all_gather(best, "tp", axis=1, tiled=False)       # [b, tp]
    wheres = lax.all_gather(where, "tp", axis=1, tiled=False)
    pick = bests.argmax(axis=-1)
    return snp.take_along_axis(wheres, pick[:, None], axis=1)[:, 0]


# -- the decode step's attention ---------------------------------------------------------------

def _decode_stacked(q, k, v, *, scale, kv_reads):
    return A._forward_stacked(q, k, v, causal=False, scale=scale)


def _decode_abstract(q, k, v, *, scale, kv_reads):
    return A._forward_abstract(q, k, v, causal=False, scale=scale)


def _decode_cost(ins, outs, *, scale, kv_reads):
    """One query per sequence against every cached key: 4 b n s h FLOPs (Q K^T, P V), and
    the bytes of the query, the output and the cache, the cache read ``kv_reads`` times."""
    q, k, v = ins
    b, _, n, h = q.shape
    cache = A._nbytes(k, v)
    return 4 * b * n * k.shape[1] * h, A._nbytes(q, outs[0]) + kv_reads * cache


decode_attention_p = Primitive("decode_attention", _decode_stacked, _decode_abstract,
                               cost=_decode_cost)
register(decode_attention_p, matmul=True)


def _per_query_head(q, k, v):
    """Decode attention as a kernel per query head of each group (the masked multi-head
    attention kernel's thread block per head): each reads its key/value head's cache, so
    the cache is read once per query head of a group, ``heads / kv_heads`` times."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    grouped = q.reshape(b, t, kv, n // kv, h)
    parts = [decode_attention(grouped[:, :, :, j], k, v) for j in range(n // kv)]
    return snp.stack(parts, axis=3).reshape(b, t, n, h)


def decode_attention(q, k, v, kv_reads: int = 1):
    """Attention of one new token per sequence, ``q`` [b, 1, heads, width], over the cache
    ``k``, ``v`` [b, tokens, kv_heads, width]: one fused kernel (the keys and values it
    reads are the cache as stored, in its own type). ``kv_reads``: how many times the
    kernel reads each key/value head's cache from HBM: once where the kernel serves a
    whole group of query heads from one read (a grouped-query kernel: TensorRT-LLM's XQA,
    FlashInfer's, flash-decoding's), ``heads / kv_heads`` times where each query head's
    thread block reads its own copy (TensorRT-LLM's masked multi-head attention kernel,
    "a single CUDA thread-block per head", docs/source/gpt_attention.md; its XQA kernel for
    grouped-query models needs a paged cache)."""
    return bind(decode_attention_p, q, k, v, scale=1.0 / math.sqrt(q.shape[-1]),
                kv_reads=int(kv_reads))


LAYER_KEYS = ("attn_norm", "mlp_norm", "wq", "wkv", "wo", "w_in", "w_out")


def prefill_step(model, lay, precision, kv_dtype):
    """``prefill(params, tokens) -> (next tokens, keys, values)``: one device's prefill of
    its sequences' prompt tokens [b, t] (its ``cp`` chunk), writing each layer's keys and
    values [layers, b, t, kv heads here, width] in the cache's type."""
    cache = _dtype(TYPES[kv_dtype])

    def prefill(params, tokens):
        x = _embed(lay, params["embed"], tokens)
        stacked = {k: params[k] for k in LAYER_KEYS}

        def layer(x, w):
            q, k, v = _attention_proj(model, lay, x, w, precision)
            written = (k.astype(cache), v.astype(cache))
            offset = None
            if lay.cp > 1:
                k = lax.all_gather(k, "cp", axis=1, tiled=True)
                v = lax.all_gather(v, "cp", axis=1, tiled=True)
                offset = lax.axis_index("cp") * q.shape[1]
            o = flash_attention(q, k, v, causal=True, q_offset=offset)
            return _after_attention(model, lay, x, o, w, precision), written

        x, (ks, vs) = lax.scan(layer, x, stacked)
        return _greedy(lay, params, x[:, -1]), ks, vs
    return prefill


def decode_step(model, lay, precision, kv_reads=1):
    """``decode(params, tokens, keys, values) -> (next tokens, new keys, new values)``: one
    device's decode step of its sequences' newest tokens [b, 1] over its part of the cache
    [layers, b, tokens here, kv heads here, width]. The new keys and values it returns are
    what the step writes into the cache in place."""

    def decode(params, tokens, keys, values):
        x = _embed(lay, params["embed"], tokens)
        stacked = {k: params[k] for k in LAYER_KEYS}

        def layer(x, xs):
            w, ck, cv = xs
            q, k, v = _attention_proj(model, lay, x, w, precision)
            o = _per_query_head(q, ck, cv) if kv_reads > 1 else decode_attention(q, ck, cv)
            if lay.cp > 1:                       # the parts' outputs, combined
                o = lax.psum(o, "cp")
            return _after_attention(model, lay, x, o, w, precision), (k.astype(ck.dtype),
                                                                      v.astype(cv.dtype))

        x, (ks, vs) = lax.scan(layer, x, (stacked, keys, values))
        return _greedy(lay, params, x[:, -1]), ks, vs
    return decode


def _mesh(layout, hw_name):
    platform = _devices._make_platform(layout.chips, hw_name, None)
    grid = np.empty(layout.chips, dtype=object)
    grid[:] = platform.devices
    return platform, Mesh(grid.reshape(tuple(getattr(layout, a) for a in AXES)), AXES)


def _traced(fn, layout, hw_name, ins, outs, args):
    platform, mesh = _mesh(layout, hw_name)
    saved = _devices._platform
    try:
        _devices._platform = platform
        run = shard_map(fn, mesh=mesh, in_specs=ins, out_specs=outs, check_vma=False)
        run(*args)
    finally:
        _devices._platform = saved
    return run.trace.program


def trace_prefill(model, layout, hw_name, batch, prompt_len, precision="bf16",
                  kv_dtype="bf16"):
    """The prefill's per-device program, traced on shapes over the layout's mesh."""
    specs = weight_specs(model, layout, precision)
    params = {k: ShapeDtypeStruct(s, d) for k, (s, d, _) in specs.items()}
    pspecs = {k: sp for k, (_, _, sp) in specs.items()}
    tokens = ShapeDtypeStruct((batch, prompt_len), "int32")
    ins = (pspecs, P("dp", "cp"))
    outs = (P("dp"), CACHE_SPEC, CACHE_SPEC)
    return _traced(prefill_step(model, layout, precision, kv_dtype), layout, hw_name, ins,
                   outs, (params, tokens))


def trace_decode(model, layout, hw_name, batch, tokens, precision="bf16", kv_dtype="bf16",
                 kv_reads=1):
    """One decode step's per-device program over a cache of ``tokens`` tokens."""
    specs = weight_specs(model, layout, precision)
    params = {k: ShapeDtypeStruct(s, d) for k, (s, d, _) in specs.items()}
    pspecs = {k: sp for k, (_, _, sp) in specs.items()}
    cache = ShapeDtypeStruct(cache_shape(model, layout, batch, tokens), TYPES[kv_dtype])
    new = P(None, "dp", None, "tp")
    ins = (pspecs, P("dp"), CACHE_SPEC, CACHE_SPEC)
    outs = (P("dp"), new, new)
    return _traced(decode_step(model, layout, precision, kv_reads), layout, hw_name, ins, outs,
                   (params, ShapeDtypeStruct((batch, 1), "int32"), cache, cache))


# -- the estimate -----------------------------------------------------------------------------

def _interval(value, spread):
    n, mean, sd = spread
    if n < 2:
        return (0.0, math.inf), n
    low, high = value * math.exp(-(mean + K * sd)), value * math.exp(-(mean - K * sd))
    return (min(low, value), max(high, value)), n


def _spreads():
    return SPREADS


def serve(model, layout: Layout | None = None, hardware="H100", chips: int | None = None,
          batch: int = 1, prompt_len: int = 1024, gen_len: int = 256,
          precision: str = "bf16", *, kv_dtype: str | None = None,
          grouped_kernel: bool = True, check_memory: bool = True) -> ServingEstimate:
    """Serve ``batch`` sequences of ``prompt_len`` prompt tokens each, generating
    ``gen_len`` tokens each, with ``model`` laid out as ``layout`` (``tp``, ``dp``,
    ``cp``: see the module) on ``chips`` chips of ``hardware``: the prefill and one decode
    step traced as SPMD programs on shapes and costed by the predictor. ``precision``:
    the weights' and products' type ("bf16", "fp16", "fp8"); ``kv_dtype``: the cache's
    ("bf16", "fp16", "fp8", "int8"; None: the precision's). ``grouped_kernel``: the decode
    step's attention reads each key/value head's cache once for its whole group of query
    heads (False: once per query head, :func:`decode_attention`). Raises :class:`LayoutError`
    for a layout or request that cannot run, weights and cache over the chip's HBM
    included (``check_memory=False`` reports it in ``fits`` instead)."""
    layout = layout or Layout()
    kv_dtype = kv_dtype or precision
    check_serving(model, layout, chips, batch, prompt_len, gen_len, precision, kv_dtype)
    hw = hardware_preset(hardware)
    if precision == "fp8" and "fp8" not in hw.matmul_paths:
        raise LayoutError(f"{hw.name} has no FP8 matrix units; use precision='bf16'")
    topology = machine(hw, layout.chips)
    cache, sizes = {}, [(a, getattr(layout, a)) for a in AXES]
    pre = predict(trace_prefill(model, layout, hw.name, batch, prompt_len, precision,
                                kv_dtype), hw, sizes, topology, collective_times=cache)
    mean = prompt_len + gen_len // 2
    mean = -(-mean // layout.cp) * layout.cp
    reads = 1 if grouped_kernel else model.heads // model.kv_heads
    dec = predict(trace_decode(model, layout, hw.name, batch, mean, precision, kv_dtype,
                               reads), hw,
                  sizes, topology, collective_times=cache)
    tokens = prompt_len + gen_len
    spreads = _spreads()
    result = ServingEstimate(
        model, layout, hw.name, precision, kv_dtype, batch, prompt_len, gen_len,
        pre.time_s, dec.time_s, kv_cache_bytes(model, layout, batch, tokens, kv_dtype),
        weight_bytes(model, layout, precision),
        {"prefill": dict(pre.terms), "decode": dict(dec.terms)},
        HBM_CAPACITY.get(hw.name, math.inf))
    decode_interval, n = _interval(dec.time_s, spreads["decode"])
    ttft_interval, _ = _interval(pre.time_s, spreads["ttft"])
    result = replace(result, interval_s=decode_interval, ttft_interval_s=ttft_interval,
                     validation_runs=n)
    if check_memory and not result.fits:
        raise LayoutError(
            f"{result.held_bytes / 1e9:.1f} GB per chip (weights {result.weight_bytes / 1e9:.1f}"
            f" GB, KV cache {result.kv_cache_bytes / 1e9:.1f} GB) over the "
            f"{result.hbm_bytes / 1e9:.0f} GB of HBM a {hw.name} has: split the weights over "
            f"more chips (tp), the cache too (tp up to kv_heads = {model.kv_heads}, then cp), "
            f"serve fewer sequences per replica (batch / dp), keep the cache in fp8 or int8 "
            f"(kv_dtype=), or pass check_memory=False to see the estimate anyway")
    return result
