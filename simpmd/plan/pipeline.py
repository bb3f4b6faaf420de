"""Pipeline schedules as SPMD programs: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZB-V and DualPipeV.

A schedule is each stage's list of work, in the order the stage runs it: ``F`` (a
forward of one micro-batch through one of the stage's chunks of layers), ``B`` (the
gradient for that chunk's input) and ``W`` (the gradient for its weights). The schedules
that do not split the backward pass run each ``W`` right after its ``B``; the zero-bubble
ones run it later, where the stage would otherwise wait (Qi et al., *Zero Bubble Pipeline
Parallelism*, ICLR 2024, arXiv:2401.10241, section 2).

:meth:`Schedule.grid` places every item as early as its stage and its input allow, each
taking one tick (the papers' ``T_F = T_B = T_W``); an unsplit backward is then two ticks,
the ``B`` and its ``W``. :meth:`Schedule.program` is one device's SPMD program over a
pipeline axis that runs exactly that grid: a ``lax.scan`` over the ticks, in which each
stage reads its own row of the grid, takes its branch of a ``lax.switch`` (idle, F, B or
W), files what it must keep in numbered slots, and sends what the next chunk needs with
two ``ppermute`` s (one each way round the ring of stages), the same on every device.
What the program holds is read off the same grid: :meth:`Schedule.held` counts, per
stage, the micro-batches whose forward has run and whose ``W`` has not (the stage's
slots of kept inputs), and :meth:`Schedule.bubble` the ticks a stage has nothing to run.
:func:`paper_bubble` gives each paper's formula for the same sizes.

The model is a stack of ``n = v * p`` layers ``h -> tanh(h @ W[k] + b[k])`` with a mean
squared error at the end; chunk ``c`` of stage ``s`` is layer :meth:`Schedule.layer` ``(c,
s)``: ``s`` (one chunk a stage), ``c p + s`` (interleaved, Megatron's placement), or ``s``
and ``2p - 1 - s`` (the V shape of ZB-V and DualPipeV, whose loss is on stage 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .. import lax
from .. import numpy as snp
from ..api.grad import grad

NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipev")
KINDS = {"idle": 0, "F": 1, "B": 2, "W": 3}


def _tick_kernels():
    """The four things a stage can do in one tick (idle, F, B, W), each returning
    ``(out, g_used, dw, db, loss)``: the switch's branches in :meth:`Schedule.program`."""

    def layer(w, b, h):
        return snp.tanh(h @ w + b)

    def idle(w, b, h, g, y, last, scale):
        return h * 0.0, h * 0.0, w * 0.0, b * 0.0, (h * 0.0).sum()

    def forward(w, b, h, g, y, last, scale):
        return layer(w, b, h), h * 0.0, w * 0.0, b * 0.0, (h * 0.0).sum()

    def backward(w, b, h, g, y, last, scale):      # the input's gradient only
        out = layer(w, b, h)
        g = snp.where(last == 1, 2.0 * (out - y) * scale, g)
        dh = grad(lambda h: (layer(w, b, h) * g).sum())(h)
        loss = snp.where(last == 1, ((out - y) ** 2).sum() * scale, 0.0)
        return dh, g, w * 0.0, b * 0.0, loss

    def weights(w, b, h, g, y, last, scale):       # the weights' gradient only
        dw, db = grad(lambda w, b: (layer(w, b, h) * g).sum(), argnums=(0, 1))(w, b)
        return h * 0.0, h * 0.0, dw, db, (h * 0.0).sum()
    return idle, forward, backward, weights


def _put(buffer, slot, value):
    """``buffer`` with row ``slot`` replaced by ``value`` (a traced slot number)."""
    hit = (snp.arange(buffer.shape[0]) == slot)[:, None, None]
    return snp.where(hit, value[None], buffer)


class ScheduleError(ValueError):
    """Sizes a schedule cannot run; the message says which and why."""


@dataclass(frozen=True)
class Schedule:
    """Each stage's work in order: ``orders[s]`` is a tuple of ``(kind, micro-batch,
    chunk)``; ``placement`` is ``"line"``, ``"interleaved"`` or ``"v"``."""

    name: str
    p: int
    m: int
    v: int
    placement: str
    orders: tuple
    paired: frozenset = frozenset()    # (stage, position): an F that starts with the B after it
    split: bool = False                # every backward split, even a W right after its B

    # -- where each chunk sits in the model ---------------------------------------------
    def layer(self, c: int, s: int) -> int:
        """The model's layer that chunk ``c`` of stage ``s`` holds."""
        if self.placement == "v":
            return s if c == 0 else 2 * self.p - 1 - s
        return c * self.p + s

    def where(self, k: int) -> tuple:
        """``(stage, chunk)`` of the model's layer ``k``."""
        for s in range(self.p):
            for c in range(self.v):
                if self.layer(c, s) == k:
                    return s, c
        raise IndexError(k)

    @property
    def layers(self) -> int:
        return self.v * self.p

    # -- the grid: every item's tick ------------------------------------------------------
    def needs(self, kind, j, c, s):
        """The item (kind, micro-batch, chunk, stage) that must be done first, or None."""
        k = self.layer(c, s)
        if kind == "F":
            return None if k == 0 else ("F", j) + self.where(k - 1)[::-1]
        if kind == "B":
            if k == self.layers - 1:
                return ("F", j, c, s)
            t, d = self.where(k + 1)        # an unsplit backward hands its input's gradient
            after = (j, d, t) in self.fused      # on when its weights' gradient is done too
            return ("W" if after else "B", j, d, t)
        return ("B", j, c, s)

    @cached_property
    def fused(self) -> frozenset:
        """The ``(micro-batch, chunk, stage)`` whose backward is not split: their ``W``
        comes right after their ``B`` in the stage's order (one backward pass), unless the
        schedule splits every backward (ZB-V: its ``B`` hands its gradient on at once)."""
        if self.split:
            return frozenset()
        return frozenset((j, c, s) for s, order in enumerate(self.orders)
                         for a, z in zip(order, order[1:])
                         if a[0] == "B" and z == ("W",) + a[1:] for j, c in [a[1:]])

    @cached_property
    def grid(self) -> dict:
        """``{(kind, micro-batch, chunk, stage): tick}``, each item one tick, as early as
        its stage (in its order) and its input (done by the tick before) allow."""
        done, free, nxt = {}, [0] * self.p, [0] * self.p
        while any(nxt[s] < len(self.orders[s]) for s in range(self.p)):
            moved = False
            for s in range(self.p):
                while nxt[s] < len(self.orders[s]):
                    kind, j, c = self.orders[s][nxt[s]]
                    befores = [self.needs(kind, j, c, s)]
                    if (s, nxt[s]) in self.paired:      # overlapped with the next item: both
                        befores.append(self.needs(*self.orders[s][nxt[s] + 1], s))  # inputs
                    befores = [x for x in befores if x is not None]
                    if any(x not in done for x in befores):
                        break
                    tick = max([free[s]] + [done[x] + 1 for x in befores])
                    done[(kind, j, c, s)] = tick
                    free[s], nxt[s], moved = tick + 1, nxt[s] + 1, True
            if not moved:
                waiting = [self.orders[s][nxt[s]] for s in range(self.p)
                           if nxt[s] < len(self.orders[s])]
                raise ScheduleError(f"{self.name}: the stages' orders wait on each other "
                                    f"(next items {waiting}): no stage can go on")
        return done

    @property
    def ticks(self) -> int:
        return max(self.grid.values()) + 1

    def table(self) -> list:
        """``rows[s][t]``: the item stage ``s`` runs at tick ``t``, or None."""
        rows = [[None] * self.ticks for _ in range(self.p)]
        for (kind, j, c, s), t in self.grid.items():
            rows[s][t] = (kind, j, c)
        return rows

    # -- what the grid says ---------------------------------------------------------------
    def bubble(self) -> float:
        """The share of the stages' ticks with nothing to run: idle / (p x ticks)."""
        return 1 - len(self.grid) / (self.p * self.ticks)

    def held(self) -> list:
        """Per stage, the most micro-batches (counted in chunks: a micro-batch through
        one chunk is one) whose forward has run and whose weight gradient has not."""
        out = []
        for s in range(self.p):
            live = peak = 0
            for item in self.table()[s]:
                if item is not None and item[0] == "F":
                    live += 1
                    peak = max(peak, live)
                elif item is not None and item[0] == "W":
                    live -= 1
            out.append(peak)
        return out

    def timeline(self, tick_s: float = 1e-3):
        """The grid as a :class:`simpmd.viz.Timeline` (one tick ``tick_s`` seconds): each
        item a labelled compute segment (``F``/``B``/``W``, chunk, micro-batch), idle
        ticks idle."""
        from ..viz.timeline import Segment, Timeline   # optional: loads matplotlib
        segs = []
        for s, row in enumerate(self.table()):
            for t, item in enumerate(row):
                a, z = t * tick_s, (t + 1) * tick_s
                if item is None:
                    segs.append(Segment(s, "idle", a, z, self.name))
                else:
                    kind, j, c = item
                    label = f"{kind}{c}{j}" if self.v > 1 else f"{kind}{j}"
                    segs.append(Segment(s, "compute", a, z, self.name, label))
        return Timeline(segs, list(range(self.p)), self.ticks * tick_s,
                        "communication left out",
                        f"compute: F, B and W one tick ({tick_s * 1e3:g} ms) each", self.name)

    # -- the SPMD program ------------------------------------------------------------------
    @cached_property
    def tables(self) -> dict:
        """The program's per-tick, per-stage integers (``[ticks, p]`` each) and its slot
        counts: ``kind``, ``mb``, ``chunk``, ``first``/``last`` (the model's first or last
        layer), ``src`` (the inbox slot an F or B reads; -1: F reads the batch, B the
        loss), ``keep`` (the stash slot of the chunk's input), ``gkeep`` (the slot of the
        output's gradient, from B to W), ``send`` (0 none, 1 to the next stage, 2 to the
        one before, 3 to itself), ``local`` (the own inbox slot of a send to itself),
        ``from_prev``/``from_next`` (the inbox slot for what arrives that way, -1 none)."""
        T, p = self.ticks, self.p
        f = {k: np.full((T, p), -1, np.int32) for k in
             ("kind", "mb", "chunk", "first", "last", "src", "keep", "gkeep", "send",
              "local", "from_prev", "from_next")}
        f["kind"][:] = 0
        f["send"][:] = 0
        messages = []     # (stage to, written at tick, read at tick, (kind, j, c) it feeds)
        for (kind, j, c, s), t in self.grid.items():
            k = self.layer(c, s)
            f["kind"][t, s], f["mb"][t, s], f["chunk"][t, s] = KINDS[kind], j, c
            f["first"][t, s], f["last"][t, s] = k == 0, k == self.layers - 1
            nxt = None
            if kind == "F" and k < self.layers - 1:
                nxt = ("F",) + (j,) + self.where(k + 1)[::-1]
            if kind == "B" and k > 0:
                nxt = ("B",) + (j,) + self.where(k - 1)[::-1]
            if nxt is not None:
                to = nxt[3]
                f["send"][t, s] = 3 if to == s else 1 if (to - s) % p == 1 else 2
                messages.append((to, s, t, self.grid[nxt], nxt))
        inbox = _slots([(to, t, u, key) for to, _, t, u, key in messages], p)
        for to, frm, t, u, key in messages:
            slot = inbox[(to, key)]
            if f["send"][t, frm] == 3:
                f["local"][t, frm] = slot
            else:
                f["from_prev" if f["send"][t, frm] == 1 else "from_next"][t, to] = slot
            f["src"][u, to] = slot
        stash = _slots([(s, self.grid[("F", j, c, s)], t, (j, c))
                        for (kind, j, c, s), t in self.grid.items() if kind == "W"], p)
        grads = _slots([(s, self.grid[("B", j, c, s)], t, (j, c))
                        for (kind, j, c, s), t in self.grid.items() if kind == "W"], p)
        for (kind, j, c, s), t in self.grid.items():
            f["keep"][t, s] = stash[(s, (j, c))]
            if kind != "F":
                f["gkeep"][t, s] = grads[(s, (j, c))]
        f["slots"] = {"inbox": _count(inbox), "stash": _count(stash), "grads": _count(grads)}
        return f

    def program(self, axis: str = "stage"):
        """``step(w, b, x, y) -> (dw, db, loss)``: one device's program, to be
        ``shard_map`` ped over ``axis`` (``p`` devices) with ``in_specs=(P(None, axis),
        P(None, axis), P(), P())`` and ``out_specs=(P(None, axis), P(None, axis), P())``.
        ``w`` is ``(v, p, d, d)`` and ``b`` ``(v, p, d)``, chunk ``c`` of stage ``s`` at
        ``[c, s]`` (:meth:`stack` puts a model's layers there); ``x`` and ``y`` are
        ``(m, rows, d)``. The loss is the mean squared error over every element of
        ``y``; ``dw`` and ``db`` its gradients, in the layout of ``w`` and ``b``."""
        tab, p = self.tables, self.p
        sizes = tab["slots"]
        fields = [k for k in tab if k != "slots"]
        rows = np.stack([tab[k] for k in fields], axis=-1)          # [ticks, p, fields]
        col = {k: i for i, k in enumerate(fields)}
        to_next = [(j, (j + 1) % p) for j in range(p)]
        to_prev = [(j, (j - 1) % p) for j in range(p)]

        idle, forward, backward, weights, put = *_tick_kernels(), _put
        def step(w, b, x, y):
            w, b = w[:, 0], b[:, 0]                  # (v, d, d), (v, d): this stage's chunks
            stage = lax.axis_index(axis)
            scale = 1.0 / y.size

            def tick(carry, row):               # row: this tick's table, one line a stage
                inbox, stash, kept, dw, db, loss = carry
                r = row[stage]
                kind, j, c = r[col["kind"]], snp.clip(r[col["mb"]], 0, self.m - 1), \
                    snp.clip(r[col["chunk"]], 0, self.v - 1)
                src, keep, gkeep = (snp.clip(r[col[k]], 0, None) for k in ("src", "keep",
                                                                           "gkeep"))
                fresh = snp.where(r[col["first"]] == 1, x[j], inbox[src])
                h = snp.where(kind == KINDS["F"], fresh, stash[keep])
                g = snp.where(kind == KINDS["B"], inbox[src], kept[gkeep])
                out, g_used, dwc, dbc, l = lax.switch(
                    kind, [idle, forward, backward, weights], w[c], b[c], h, g, y[j],
                    r[col["last"]], scale)
                stash = snp.where(kind == KINDS["F"], put(stash, keep, h), stash)
                kept = snp.where(kind == KINDS["B"], put(kept, gkeep, g_used), kept)
                mine = (snp.arange(self.v) == c)
                dw = dw + snp.where(mine[:, None, None], dwc[None], 0.0)
                db = db + snp.where(mine[:, None], dbc[None], 0.0)
                send = r[col["send"]]
                inbox = snp.where(send == 3, put(inbox, r[col["local"]], out), inbox)
                down = lax.ppermute(snp.where(send == 1, out, 0.0), axis, to_next)
                up = lax.ppermute(snp.where(send == 2, out, 0.0), axis, to_prev)
                for name, arrived in (("from_prev", down), ("from_next", up)):
                    slot = r[col[name]]
                    inbox = snp.where(slot >= 0, put(inbox, slot, arrived), inbox)
                return (inbox, stash, kept, dw, db, loss + l), None

            zeros = lambda n: lax.pcast(snp.zeros((n,) + x.shape[1:], x.dtype), axis,
                                        to="varying")
            start = (zeros(max(sizes["inbox"], 1)), zeros(max(sizes["stash"], 1)),
                     zeros(max(sizes["grads"], 1)), snp.zeros_like(w), snp.zeros_like(b),
                     lax.pcast(snp.zeros((), x.dtype), axis, to="varying"))
            (_, _, _, dw, db, loss), _ = lax.scan(tick, start, snp.asarray(rows))
            return dw[:, None], db[:, None], lax.psum(loss, axis)
        return step

    def stack(self, a):
        """A model's layers ``a`` (``[v p, ...]``, in the model's order) as ``[v, p, ...]``:
        chunk ``c`` of stage ``s`` at ``[c, s]``."""
        a = np.asarray(a)
        return np.stack([np.stack([a[self.layer(c, s)] for s in range(self.p)])
                         for c in range(self.v)])

    def unstack(self, a):
        """The inverse of :meth:`stack`: ``[v, p, ...]`` back to the model's order."""
        a = np.asarray(a)
        return np.stack([a[self.where(k)[1], self.where(k)[0]] for k in range(self.layers)])


def _slots(intervals, p) -> dict:
    """Slots for values held from tick ``a`` (written) to tick ``b`` (read), per stage:
    ``{(stage, key): slot}``, a slot reused once its value is read (greedy, by start)."""
    out = {}
    for s in range(p):
        ends = []                       # per slot, the tick its value is last read
        for _, a, z, key in sorted((iv for iv in intervals if iv[0] == s),
                                   key=lambda iv: (iv[1], iv[2])):
            free = [i for i, e in enumerate(ends) if e <= a]
            slot = free[0] if free else len(ends)
            if slot == len(ends):
                ends.append(z)
            ends[slot] = z
            out[(s, key)] = slot
    return out


def _count(slots: dict) -> int:
    return max(slots.values(), default=-1) + 1


# -- the schedules -------------------------------------------------------------------------

def _check(name, p, m, least=1, multiple=1):
    if not (isinstance(p, int) and isinstance(m, int)) or p < 2 or m < least or m % multiple:
        raise ScheduleError(
            f"{name} with p = {p} stages and m = {m} micro-batches: it needs p >= 2 and "
            f"m >= {least}" + (f", m a multiple of {multiple}" if multiple > 1 else "")
            + "; pick other sizes")


def _full(kind, j, c=0):
    """An unsplit backward is its B and then at once its W."""
    return [("B", j, c), ("W", j, c)] if kind == "B" else [(kind, j, c)]


def gpipe(p: int, m: int) -> Schedule:
    """GPipe (Huang et al. 2019): every forward, then every backward, last first."""
    _check("GPipe", p, m)
    order = [("F", j, 0) for j in range(m)]
    for j in reversed(range(m)):
        order += _full("B", j)
    return Schedule("gpipe", p, m, 1, "line", (tuple(order),) * p)


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (Narayanan et al. 2021, section 2.2.1): stage ``s`` runs ``p - s - 1``
    forwards, then one forward and one backward in turn, then the backwards left."""
    _check("1F1B", p, m)
    orders = []
    for s in range(p):
        fill = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(fill)]
        for j in range(m - fill):
            order += [("F", fill + j, 0)] + _full("B", j)
        for j in range(m - fill, m):
            order += _full("B", j)
        orders.append(tuple(order))
    return Schedule("1f1b", p, m, 1, "line", tuple(orders))


def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, section 2.2.2; its
    ``forward_backward_pipelining_with_interleaving``): ``v`` chunks a stage, a group of
    ``p`` micro-batches through one chunk before the next; stage ``s`` first runs
    ``2(p - s - 1) + (v - 1)p`` forwards. ``m`` a multiple of ``p``."""
    _check("interleaved 1F1B", p, m, p, p)

    def item(kind, k):
        group = (k // p) % v
        return (kind, (k // (p * v)) * p + k % p, group if kind == "F" else v - 1 - group)
    orders = []
    for s in range(p):
        total = v * m
        warm = min(2 * (p - s - 1) + (v - 1) * p, total)
        order = [item("F", k) for k in range(warm)]
        for k in range(total - warm):
            order += [item("F", warm + k)] + _full(*item("B", k))
        for k in range(total - warm, total):
            order += _full(*item("B", k))
        orders.append(tuple(order))
    return Schedule("interleaved", p, m, v, "interleaved", tuple(orders))


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2024, section 2.1): 1F1B's order with the backward split, stage
    ``s``'s weight gradients run ``s`` micro-batches late, so that every stage keeps
    ``p`` micro-batches in flight and the ``W`` s fill the cool-down."""
    _check("ZB-H1", p, m)
    orders = []
    for s in range(p):
        fill = min(p - s - 1, m)
        order = [("F", j, 0) for j in range(fill)]
        w = 0
        for j in range(m):
            if fill + j < m:
                order.append(("F", fill + j, 0))
            order.append(("B", j, 0))
            if j >= s:
                order.append(("W", w, 0))
                w += 1
        order += [("W", k, 0) for k in range(w, m)]
        orders.append(tuple(order))
    return Schedule("zb-h1", p, m, 1, "line", tuple(orders))


def zb_v(p: int, m: int) -> Schedule:
    """ZB-V (Qi et al., *Zero Bubble Pipeline Parallelism*, ICLR 2024, arXiv:2401.10241,
    section 6): two chunks a stage in a V (chunk 0 down the stages, chunk 1 back up, the
    loss on stage 0), the backward split, each stage's order as PyTorch's
    ``torch.distributed.pipelining.ScheduleZBVZeroBubble`` builds it: a warm-up of
    ``2(p - s) - 1`` chunk-0 forwards, ``s`` pairs of chunk-1 and chunk-0 forwards, then
    ``p - s`` chunk-1 forwards each with its backward; a steady state of F, B, W on each
    chunk in turn; a cool-down whose input gradients run first and whose weight gradients
    fill the end. Sizes below ``2p - 1`` micro-batches drop the items of the missing ones."""
    _check("ZB-V", p, m)
    n = max(2 * p - 1, m)
    orders = []
    for r in range(p):
        done, order = {"F": [0, 0], "B": [0, 0], "W": [0, 0]}, []
        f, b, w = done["F"], done["B"], done["W"]

        def run(*items):                 # each "F1": the next micro-batch's F on chunk 1
            for item in items:
                kind, c = item[0], int(item[1])
                order.append((kind, done[kind][c], c))
                done[kind][c] += 1

        for _ in range(2 * (p - r) - 1):
            run("F0")
        for _ in range(r):
            run("F1", "F0")
        for _ in range(p - r):
            run("F1", "B1", "W1")
        while f[1] < f[0] or f[0] < n:
            run(*(["F0"] if f[0] < n else []), "B0", "W0", "F1", "B1", "W1")
        for _ in range(r):
            run("B0", "B1")
        for _ in range(p - r):
            run("B0", "W0")
        run(*["W1"] * (b[1] - w[1]), *["W0"] * (b[0] - w[0]))
        assert f == b == w == [n, n]
        orders.append(tuple(item for item in order if item[1] < m))
    return Schedule("zb-v", p, m, 2, "v", tuple(orders), split=True)


def dualpipev(p: int, m: int) -> Schedule:
    """DualPipeV (deepseek-ai/DualPipe, ``dualpipe/dualpipev.py``, 2025: DualPipe of the
    DeepSeek-V3 technical report, arXiv:2412.19437, cut in half into a V): ``p`` ranks,
    two chunks each (chunk 0 down the ranks, chunk 1 back up, the loss on rank 0), its
    eight phases of work per rank as that file orders them. A backward run "zero
    bubble" leaves its ``W`` in a queue that later ``W`` s empty first in, first out; a
    forward and a backward the file overlaps run here one after the other.
    ``m >= 2p``."""
    _check("DualPipeV", p, m, 2 * p)
    orders = tuple(_dualpipev_rank(p, m, r) for r in range(p))
    return Schedule("dualpipev", p, m, 2, "v", orders, paired=frozenset())


def _dualpipev_rank(p: int, m: int, r: int) -> tuple:
    """Rank ``r``'s order of work in :func:`dualpipev`, phase by phase."""
    nf, nb, queue, order = [0, 0], [0, 0], [], []

    def F(c):
        order.append(("F", nf[c], c))
        nf[c] += 1

    def B(c, zb=False):
        j = nb[c]
        nb[c] += 1
        order.append(("B", j, c))
        if zb:
            queue.append((j, c))
        else:
            order.append(("W", j, c))

    def W():
        j, c = queue.pop(0)
        order.append(("W", j, c))

    for _ in range(2 * (p - r - 1)):                       # 1: F0 ...
        F(0)
    for _ in range(r + 1):                                 # 2: F0 F1 ...
        F(0)
        F(1)
    for _ in range(p - r - 1):                             # 3: B1 W F1 (zero bubble)
        B(1, True)
        W()
        F(1)
    for _ in range(m - 2 * p + r + 1):                     # 4: F0&B1, F1&B0
        F(0)
        B(1)
        F(1)
        B(0)
    for _ in range(p - r - 1):                             # 5: B1, F1&B0
        B(1)
        F(1)
        B(0)
    zb = False
    for i in range(r + 1):                                 # 6: B1 B0, the second
        if i == (r + 1) // 2 and r % 2 == 1:               # half zero bubble
            zb = True
        B(1, zb)
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        B(0, zb)
    for _ in range(p - r - 1):                             # 7: W B0 (zero bubble)
        W()
        B(0, True)
    for _ in range(r + 1):                                 # 8: W ...
        W()
    assert not queue and nf == [m, m] and nb == [m, m]
    return tuple(order)


def schedule(name: str, p: int, m: int, v: int = 2) -> Schedule:
    """The schedule called ``name`` (one of :data:`NAMES`) for ``p`` stages and ``m``
    micro-batches (``v``: the interleaved schedule's chunks per stage)."""
    makers = {"gpipe": gpipe, "1f1b": one_f_one_b, "zb-h1": zb_h1, "zb-v": zb_v,
              "dualpipev": dualpipev,
              "interleaved": lambda p, m: interleaved(p, m, v)}
    if name not in makers:
        raise ScheduleError(f"schedule={name!r}: choose one of {', '.join(map(repr, NAMES))}")
    return makers[name](p, m)


def paper_bubble(name: str, p: int, m: int, v: int = 2, F=1.0, B=1.0, W=1.0) -> float:
    """The bubble as a share of the stages' time, from each paper's formula, with ``F``,
    ``B`` and ``W`` the times of a forward, an input-gradient and a weight-gradient pass
    of one chunk (a stage's share of layers for the one-chunk schedules). GPipe and
    1F1B: ``(p - 1)(F + B + W)`` idle of each stage's ``m (F + B + W)`` busy (Huang et
    al. 2019; Narayanan et al. 2021, section 2.2.1); interleaved: the same over ``v m``
    chunks (section 2.2.2); ZB-H1: ``(p - 1)(F + B - W)`` (Qi et al. 2024, section 2.1;
    DualPipe's table writes it ``(PP - 1)(F + B - 2W)`` with B the full backward);
    ZB-V: no stage idles between its first item and its last (sail-sg/zero-bubble-pipeline-
    parallelism's README, its table of schedules at ``T_F = T_B = T_W``: a bubble rate of
    0); what is left is the ramp, the ``p - 1`` chunk forwards by which the last stage
    starts after the first and the first ends after the last: ``(p - 1) F`` idle of each
    stage's ``2m (F + B + W)``. DualPipeV: ``(PP/2 - 1)(F&B + B - 3W)`` for ``PP = 2p``
    stages of one chunk, with B the full backward and ``F&B`` a forward and a backward
    overlapped, here one after the other, ``F + B`` (deepseek-ai/DualPipe's README, its
    table of bubbles)."""
    busy = F + B + W
    if name in ("gpipe", "1f1b"):
        idle, work = (p - 1) * busy, m * busy
    elif name == "interleaved":
        idle, work = (p - 1) * busy, v * m * busy
    elif name == "zb-h1":
        idle, work = (p - 1) * (F + B - W), m * busy
    elif name == "zb-v":
        idle, work = (p - 1) * F, 2 * m * busy
    elif name == "dualpipev":
        full = B + W
        idle, work = (p - 1) * ((F + full) + full - 3 * W), 2 * m * busy
    else:
        raise ScheduleError(f"no formula for {name!r}: one of {', '.join(NAMES)}")
    return idle / (idle + work)
