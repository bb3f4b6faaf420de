"""A decoder-only transformer's sizes, its parameters and its model FLOPs per token.

:class:`Transformer` names what a training plan needs of a model: the sizes of its layers,
its vocabulary and the sequence it trains on. Everything else (the weights' shapes, how
many there are, the FLOPs a token costs by PaLM's definition) is computed from them.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Transformer:
    """A decoder: ``layers`` blocks of attention (``heads`` query heads of width
    ``head_dim``, ``kv_heads`` key/value heads, grouped-query attention when fewer) and an
    MLP of width ``d_ff`` (gated, SwiGLU, with three matrices when ``gated_mlp``; else two),
    each after a norm, on a residual stream of width ``d_model``; token embeddings and an
    output projection onto ``vocab`` (one matrix when ``tied_embeddings``), trained on
    sequences of ``seq`` tokens. ``head_dim`` defaults to ``d_model // heads``.
    ``attention_dropout`` and ``hidden_dropout`` are the probabilities of dropout on the
    attention's probabilities and on the embeddings and each block's output (Megatron-LM's
    ``--attention-dropout`` and ``--hidden-dropout``; 0: none, as LLaMA trains)."""

    layers: int
    d_model: int
    heads: int
    d_ff: int
    vocab: int
    seq: int
    kv_heads: int | None = None
    gated_mlp: bool = False
    head_dim: int | None = None
    tied_embeddings: bool = False
    name: str = ""
    attention_dropout: float = 0.0
    hidden_dropout: float = 0.0

    def __post_init__(self):
        if self.kv_heads is None:
            object.__setattr__(self, "kv_heads", self.heads)
        if self.head_dim is None:
            if self.d_model % self.heads:
                raise ValueError(f"d_model = {self.d_model} is not a multiple of heads = "
                                 f"{self.heads}: pass head_dim= to say how wide a head is")
            object.__setattr__(self, "head_dim", self.d_model // self.heads)
        if self.heads % self.kv_heads:
            raise ValueError(f"heads = {self.heads} is not a multiple of kv_heads = "
                             f"{self.kv_heads}: each key/value head serves a whole group of "
                             f"query heads")

    # -- parameters ------------------------------------------------------------------------

    @property
    def mlp_matrices(self) -> int:
        """Weight matrices in the MLP: gate, up and down when gated, else up and down."""
        return 3 if self.gated_mlp else 2

    def layer_shapes(self) -> dict:
        """One layer's weights, as the planner stores them: the query, key and value
        projections side by side in one matrix (as Megatron fuses them), the MLP's input
        matrices likewise, and the two norms' scales."""
        D, hd = self.d_model, self.head_dim
        qkv = (self.heads + 2 * self.kv_heads) * hd
        return {"attn_norm": (D,), "wqkv": (D, qkv), "wo": (self.heads * hd, D),
                "mlp_norm": (D,), "w_in": (D, (self.mlp_matrices - 1) * self.d_ff),
                "w_out": (self.d_ff, D)}

    def other_shapes(self) -> dict:
        """The weights outside the layers: the embedding table, the final norm's scale
        and, unless tied to the embedding, the output projection."""
        shapes = {"embed": (self.vocab, self.d_model), "final_norm": (self.d_model,)}
        if not self.tied_embeddings:
            shapes["head"] = (self.d_model, self.vocab)
        return shapes

    @property
    def params(self) -> int:
        """Every weight, counted: layers, embeddings (once if tied) and norms."""
        size = lambda shape: shape[0] * (shape[1] if len(shape) > 1 else 1)
        layer = sum(map(size, self.layer_shapes().values()))
        return self.layers * layer + sum(map(size, self.other_shapes().values()))

    @property
    def matmul_params(self) -> int:
        """The weights a token multiplies: all but the norms' scales and the embedding
        table, which a token only looks up (counted again when it is also the tied
        output projection)."""
        D = self.d_model
        norms = (2 * self.layers + 1) * D
        lookup = 0 if self.tied_embeddings else self.vocab * D
        return self.params - norms - lookup

    # -- FLOPs -----------------------------------------------------------------------------

    def flops_per_token(self) -> float:
        """Model FLOPs per token of a training step as PaLM's Appendix B defines them
        (Chowdhery et al. 2022, arXiv:2204.02311): 6 N + 12 L H Q T, with N the parameters,
        L layers, H heads, Q the head width and T the sequence. The attention term counts
        every query against every key (no causal saving), and recomputation is not model
        FLOPs: MFU divides these by the time and the chips' peak."""
        return 6 * self.params + 12 * self.layers * self.heads * self.head_dim * self.seq

    def __str__(self):
        label = f"{self.name}: " if self.name else ""
        return (f"{label}{self.layers} layers, d_model {self.d_model}, {self.heads} heads "
                f"({self.kv_heads} key/value) of {self.head_dim}, d_ff {self.d_ff}"
                f"{' gated' if self.gated_mlp else ''}, vocabulary {self.vocab}, "
                f"sequences of {self.seq}: {self.params / 1e9:.2f}e9 parameters")


# LLaMA 3-70B, from meta-llama/Meta-Llama-3-70B's config.json on Hugging Face (the Scaling
# Book's table in "Training LLaMA 3 on TPUs"), trained on sequences of 8,192 tokens.
LLAMA3_70B = Transformer(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                         vocab=128256, seq=8192, gated_mlp=True, name="LLaMA 3-70B")
# LLaMA 3-8B, meta-llama/Meta-Llama-3-8B's config.json.
LLAMA3_8B = Transformer(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                        vocab=128256, seq=8192, gated_mlp=True, name="LLaMA 3-8B")
