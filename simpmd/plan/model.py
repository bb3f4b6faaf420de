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
    ``--attention-dropout`` and ``--hidden-dropout``; 0: none, as LLaMA trains).
    ``activation``: the ungated MLP's, ``"gelu"`` (its tanh form, GPT's) or ``"relu"``
    (MaxText's base.yml at 76bd53b0f, ``mlp_activations: ["relu"]``); a gated MLP is
    SwiGLU."""

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
    activation: str = "gelu"
    # Mixture of experts (0 experts: dense). Each MoE layer's MLP is ``experts`` routed
    # experts of width ``expert_d_ff`` (d_ff where None), of which each token runs
    # ``top_k``, a router (a [d_model, experts] matrix) and ``shared_experts`` experts every
    # token runs; the first ``dense_layers`` layers keep the dense MLP of width d_ff (as
    # DeepSeek-V3's first three do). ``capacity_factor``: the slots per expert as a multiple
    # of the mean load, tokens beyond dropped; None: dropless.
    experts: int = 0
    top_k: int = 1
    expert_d_ff: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    # Node-limited routing (DeepSeek-V3 report, arXiv:2412.19437, section 2.1.2): each
    # token's experts on at most ``route_nodes`` nodes, chosen by the sum of each node's
    # ``top_k / route_nodes`` highest affinities; its dispatch sends a token over the
    # network once to each of its nodes and forwards it within the node (section 3.2.2:
    # :func:`simpmd.plan.layers.node_limited`). None: the experts chosen freely, a copy
    # sent to each expert's rank.
    route_nodes: int | None = None

    def __post_init__(self):
        if self.activation not in ("gelu", "relu"):
            raise ValueError(f"activation = {self.activation!r}: the ungated MLP's is 'gelu' "
                             f"or 'relu' (a gated MLP, gated_mlp=True, is SwiGLU)")
        self._check_experts()
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

    def _check_experts(self):
        if self.experts == 0:
            if (self.shared_experts or self.dense_layers or self.expert_d_ff is not None
                    or self.route_nodes is not None):
                raise ValueError("shared_experts, dense_layers, expert_d_ff and route_nodes describe a "
                                 "mixture of experts: pass experts= (the routed experts) too")
            return
        if self.expert_d_ff is None:
            object.__setattr__(self, "expert_d_ff", self.d_ff)
        if not 1 <= self.top_k <= self.experts:
            raise ValueError(f"top_k = {self.top_k} with experts = {self.experts}: each token "
                             f"runs between 1 and all of the routed experts")
        if not 0 <= self.dense_layers <= self.layers:
            raise ValueError(f"dense_layers = {self.dense_layers} of {self.layers} layers")
        if self.route_nodes is not None and (self.route_nodes < 1
                                             or self.top_k % self.route_nodes):
            raise ValueError(f"route_nodes = {self.route_nodes} with top_k = {self.top_k}: "
                             f"each of a token's nodes gets top_k / route_nodes of its "
                             f"experts' scores (a whole number)")
        if self.capacity_factor is not None and self.capacity_factor <= 0:
            raise ValueError(f"capacity_factor = {self.capacity_factor}: a positive multiple "
                             f"of the mean load, or None for dropless routing")

    @property
    def moe(self) -> bool:
        return self.experts > 0

    @property
    def moe_layers(self) -> int:
        """Layers whose MLP is a mixture of experts."""
        return self.layers - self.dense_layers if self.moe else 0

    def expert_params(self) -> int:
        """One expert's weights: its input matrices (gate and up when gated) and output."""
        return self.mlp_matrices * self.d_model * self.expert_d_ff if self.moe else 0

    def moe_mlp_params(self, active: bool = False) -> int:
        """One MoE layer's MLP: the router, the routed experts (``active``: the ``top_k`` a
        token runs) and the shared experts."""
        routed = self.top_k if active else self.experts
        return (self.d_model * self.experts
                + (routed + self.shared_experts) * self.expert_params())

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
        return self._count(active=False)

    @property
    def active_params(self) -> int:
        """The weights one token uses: every weight of a dense model; in a mixture of
        experts, each MoE layer's router, ``top_k`` routed and the shared experts only."""
        return self._count(active=True)

    def _count(self, active: bool) -> int:
        size = lambda shape: shape[0] * (shape[1] if len(shape) > 1 else 1)
        layer = sum(map(size, self.layer_shapes().values()))
        total = self.layers * layer + sum(map(size, self.other_shapes().values()))
        if self.moe:     # the MoE layers' MLPs in place of the dense MLP
            dense_mlp = size(self.layer_shapes()["w_in"]) + size(self.layer_shapes()["w_out"])
            total += self.moe_layers * (self.moe_mlp_params(active) - dense_mlp)
        return total

    @property
    def matmul_params(self) -> int:
        """The weights a token multiplies: all but the norms' scales and the embedding
        table, which a token only looks up (counted again when it is also the tied
        output projection)."""
        D = self.d_model
        norms = (2 * self.layers + 1) * D
        lookup = 0 if self.tied_embeddings else self.vocab * D
        return self.params - norms - lookup

    @property
    def active_matmul_params(self) -> int:
        """:attr:`matmul_params` of the weights one token uses (:attr:`active_params`)."""
        return self.matmul_params - (self.params - self.active_params)

    # -- FLOPs -----------------------------------------------------------------------------

    def flops_per_token(self) -> float:
        """Model FLOPs per token of a training step as PaLM's Appendix B defines them
        (Chowdhery et al. 2022, arXiv:2204.02311): 6 N + 12 L H Q T, with N the parameters,
        L layers, H heads, Q the head width and T the sequence. The attention term counts
        every query against every key (no causal saving), and recomputation is not model
        FLOPs: MFU divides these by the time and the chips' peak. For a mixture of experts
        N is the active parameters (:attr:`active_params`): the weights a token multiplies,
        so MFU counts the experts a token runs, not every expert held."""
        return 6 * self.active_params + 12 * self.layers * self.heads * self.head_dim * self.seq

    def __str__(self):
        label = f"{self.name}: " if self.name else ""
        return (f"{label}{self.layers} layers, d_model {self.d_model}, {self.heads} heads "
                f"({self.kv_heads} key/value) of {self.head_dim}, d_ff {self.d_ff}"
                f"{' gated' if self.gated_mlp else ''}, vocabulary {self.vocab}, "
                f"sequences of {self.seq}: {self.params / 1e9:.2f}e9 parameters"
                + (f" ({self.active_params / 1e9:.2f}e9 active: {self.top_k} of "
                   f"{self.experts} experts of {self.expert_d_ff}"
                   f"{f', {self.shared_experts} shared' if self.shared_experts else ''})"
                   if self.moe else ""))


# LLaMA 3-70B, from meta-llama/Meta-Llama-3-70B's config.json on Hugging Face (the Scaling
# Book's table in "Training LLaMA 3 on TPUs"), trained on sequences of 8,192 tokens.
LLAMA3_70B = Transformer(layers=80, d_model=8192, heads=64, kv_heads=8, d_ff=28672,
                         vocab=128256, seq=8192, gated_mlp=True, name="LLaMA 3-70B")
# LLaMA 3-8B, meta-llama/Meta-Llama-3-8B's config.json.
LLAMA3_8B = Transformer(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                        vocab=128256, seq=8192, gated_mlp=True, name="LLaMA 3-8B")
# Mixtral 8x7B, mistralai/Mixtral-8x7B-v0.1's config.json on Hugging Face (32 layers,
# hidden 4096, 32 heads, 8 key/value heads, intermediate 14336, 8 local experts, 2 per
# token, vocabulary 32000, untied embeddings); Jiang et al. 2024 (arXiv:2401.04088,
# section 2.1) give 47B parameters, 13B active.
MIXTRAL_8X7B = Transformer(layers=32, d_model=4096, heads=32, kv_heads=8, d_ff=14336,
                           vocab=32000, seq=4096, gated_mlp=True, experts=8, top_k=2,
                           name="Mixtral 8x7B")
