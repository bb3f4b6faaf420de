"""How a training step is split over chips: a :class:`Layout`, and the checks that say
which layouts cannot run, naming the limit.

The axes are the field's: data parallelism (``dp``, each replica holds every weight),
fully sharded data parallelism (``fsdp``, weights split and gathered just in time),
tensor parallelism (``tp``, Megatron's split of heads and hidden units), pipeline
parallelism (``pp`` stages, each holding ``vp`` virtual stages of layers), context
parallelism (``cp``, each sequence split). Batches count sequences, as Megatron's
micro and global batch sizes do.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

RECOMPUTE = ("none", "selective", "full")
AXES = ("pp", "dp", "fsdp", "cp", "tp")        # the mesh's axes, slowest-varying first


class LayoutError(ValueError):
    """A layout that cannot run this model on these chips; the message names the limit."""


@dataclass(frozen=True)
class Layout:
    """A parallel layout of a training step.

    ``microbatch`` sequences go through the layers at once on each data-parallel rank;
    ``global_batch`` sequences make one step, so each rank runs ``global_batch / (dp *
    fsdp * microbatch)`` micro-batches and accumulates their gradients. ``recompute`` is
    what the backward pass computes again instead of keeping: ``"none"``, ``"selective"``
    (the attention's score matrices, Korthikanti et al. 2022) or ``"full"`` (each layer
    from its input). ``sequence_parallel`` splits the norms' and residual's tokens over
    ``tp`` too (all-gathers and reduce-scatters instead of all-reduces).
    ``distributed_optimizer`` splits the fp32 masters and Adam moments over ``dp``
    (Megatron's distributed optimizer, ZeRO stage 1)."""

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    microbatch: int = 1
    global_batch: int | None = None
    recompute: str = "none"
    sequence_parallel: bool = False
    distributed_optimizer: bool = False

    def __post_init__(self):
        for f in fields(self):
            value = getattr(self, f.name)
            if f.type == "int" and (not isinstance(value, int) or value < 1):
                raise LayoutError(f"Layout({f.name}={value!r}): each axis and batch size is "
                                  f"a whole number, at least 1")
        if self.recompute not in RECOMPUTE:
            raise LayoutError(f"Layout(recompute={self.recompute!r}): choose one of "
                              f"{', '.join(map(repr, RECOMPUTE))}")
        if self.global_batch is None:
            object.__setattr__(self, "global_batch", self.replicas * self.microbatch)
        if self.vp > 1 and self.pp == 1:
            raise LayoutError(f"Layout(vp={self.vp}, pp=1): virtual stages interleave a "
                              f"pipeline; with one stage there is nothing to interleave")

    @property
    def chips(self) -> int:
        return self.dp * self.fsdp * self.tp * self.pp * self.cp

    @property
    def replicas(self) -> int:
        """Ranks that take different sequences: data parallel and FSDP."""
        return self.dp * self.fsdp

    @property
    def microbatches(self) -> int:
        """Micro-batches each rank runs per step."""
        return self.global_batch // (self.replicas * self.microbatch)

    @property
    def shape(self) -> dict:
        """The mesh: every axis with its size, slowest-varying first (``tp`` innermost,
        so a tensor-parallel group is neighbouring chips, as Megatron orders its ranks)."""
        return {a: getattr(self, a) for a in AXES}

    def __str__(self):
        parts = [f"{a}={getattr(self, a)}" for a in ("dp", "fsdp", "tp", "pp", "vp", "cp")
                 if getattr(self, a) > 1]
        extras = [f"recompute={self.recompute}"] if self.recompute != "none" else []
        extras += ["sequence parallel"] * self.sequence_parallel
        extras += ["distributed optimizer"] * self.distributed_optimizer
        return (f"{' x '.join(parts) or 'one chip'}, micro-batch {self.microbatch}, global "
                f"batch {self.global_batch}" + "".join(f", {e}" for e in extras))


def check(model, layout: Layout, chips: int | None = None):
    """Raise :class:`LayoutError` naming the first limit ``layout`` breaks for ``model``
    on ``chips`` chips (None: as many as the layout's axes make)."""
    m, lay = model, layout
    if chips is not None and chips != lay.chips:
        raise LayoutError(f"{chips} chips, but the layout's axes make dp x fsdp x tp x pp x "
                          f"cp = {lay.dp} x {lay.fsdp} x {lay.tp} x {lay.pp} x {lay.cp} = "
                          f"{lay.chips}: the axes must multiply to the chip count")
    limits = [
        (m.heads % lay.tp, f"heads = {m.heads} do not split over tp = {lay.tp}: tensor "
                           f"parallelism gives each chip whole heads"),
        (m.kv_heads % lay.tp, f"kv_heads = {m.kv_heads} do not split over tp = {lay.tp}: each "
                              f"chip needs whole key/value heads (Megatron's rule)"),
        (m.d_ff % lay.tp, f"d_ff = {m.d_ff} does not split over tp = {lay.tp}"),
        (m.vocab % lay.tp, f"vocab = {m.vocab} does not split over tp = {lay.tp} (the "
                           f"vocabulary-parallel embedding); pad the vocabulary"),
        (m.layers % (lay.pp * lay.vp), f"layers = {m.layers} do not split into pp x vp = "
                                       f"{lay.pp} x {lay.vp} = {lay.pp * lay.vp} equal "
                                       f"virtual stages"),
        (lay.global_batch % (lay.replicas * lay.microbatch),
         f"global_batch = {lay.global_batch} sequences is not a whole number of micro-batches "
         f"of {lay.microbatch} on each of dp x fsdp = {lay.replicas} ranks "
         f"({lay.replicas * lay.microbatch} sequences per round)"),
        (m.seq % (lay.cp * (lay.tp if lay.sequence_parallel else 1)),
         f"seq = {m.seq} tokens do not split over cp = {lay.cp}"
         + (f" x tp = {lay.tp} (sequence parallelism)" if lay.sequence_parallel else "")),
        (m.d_model % (lay.fsdp * (lay.dp if lay.distributed_optimizer else 1)),
         f"d_model = {m.d_model} does not split over fsdp = {lay.fsdp}"
         + (f" x dp = {lay.dp} (the distributed optimizer)" if lay.distributed_optimizer
            else "") + ": FSDP splits each weight along d_model"),
    ]
    for broken, message in limits:
        if broken:
            raise LayoutError(message)
    if lay.vp > 1 and lay.microbatches < lay.pp:
        raise LayoutError(f"{lay.microbatches} micro-batches per rank, fewer than pp = "
                          f"{lay.pp} stages: the interleaved schedule needs at least one "
                          f"micro-batch per stage")
