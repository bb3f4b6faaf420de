"""XLA's fusion as simpmd models it: which equations of a program run as one kernel, and
the bytes each kernel reads from and writes to HBM.

XLA does not run a jaxpr equation by equation. It fuses chains of cheap operations into one
kernel that reads its inputs once and writes only what later kernels need; the
intermediate values stay in registers. The rules here follow XLA's passes in outline:

* **elementwise chains** (arithmetic, comparisons, ``convert_element_type``, ``select_n``,
  and layout moves such as ``transpose``, ``slice``, ``pad``) join the kernel of the
  operand produced last (*loop fusion*);
* a **broadcast** is not materialised: each consumer reads the small value it broadcasts;
  ``reshape`` and ``squeeze`` are views, and so is a ``transpose`` that only dot_generals
  read (XLA folds it into the dot's dimension numbers);
* a **reduction** joins the elementwise kernel that produces its operand (*input fusion*),
  or a reduction that already reads the same operand into the same shape (*multi-output
  fusion*: a layernorm's mean and mean of squares in one pass); an elementwise consumer of
  the reduced shape joins it too (*reduction epilogue*);
* a **matmul** starts its own kernel, and elementwise consumers of its result's shape join
  it (*epilogue*: a bias, a residual add, an activation, a cast);
* collectives, sorts, scatters and cumulative sums run on their own.

A kernel joins only the latest of its operands' kernels, so kernels stay in an order in
which each reads only what earlier ones wrote. The counts are per device, as the roofline's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..core import collectives as C
from ..core import loops as L
from ..core import primitives as P
from ..core.core import PRIMITIVES
from .walk import JAX_UNARY, MATMULS, NO_COST, _is_var, _nbytes, _primitive_name, _row, _typed

# The fusion column of each row, set on the row object: how XLA's fusion treats it.
for _rows, _kind in (
        ((P.reshape, P.squeeze, P.copy, C.pvary, L.name_p), "view"),
        ((P.broadcast_in_dim,), "broadcast"),
        ((P.convert_element_type, P.select_n, P.clamp, P.transpose, P.slice_, P.pad, P.rev,
          P.concatenate, P.gather, P.iota, PRIMITIVES["dynamic_slice"]), "elementwise"),
        ((P.reduce_sum, P.reduce_max, P.reduce_min, P.reduce_prod, P.reduce_and, P.reduce_or,
          P.argmax, P.argmin), "reduction"),
        ((P.dot_general,), "matmul"),
        ((P.sort, P.cumsum, P.cumprod, P.cummax, P.cummin, P.numpy_call) +
         tuple(r for n, r in PRIMITIVES.items() if n.startswith("scatter")), "opaque")):
    for _row_obj in _rows:
        _row_obj.fusion = _kind

# JAX primitives with no simpmd row: how XLA fuses them.
JAX_VIEWS = frozenset("""expand_dims bitcast_convert_type stop_gradient pcast
    sharding_constraint device_put optimization_barrier mesh_cast reshard copy_p
    random_wrap random_unwrap axis_index axis_size""".split())
JAX_ELEMENTWISE = JAX_UNARY | frozenset("""reduce_precision dynamic_update_slice
    threefry2x32 random_bits erf_inv population_count clz""".split())


def fusion_kind(eqn) -> str:
    """``'view'``, ``'broadcast'``, ``'elementwise'``, ``'reduction'``, ``'matmul'``,
    ``'collective'`` or ``'opaque'``: how XLA's fusion treats this equation."""
    name = _primitive_name(eqn)
    row = _row(eqn, name)
    if row is not None and getattr(row, "collective", False):
        return "view" if getattr(row, "op", None) in (None, "axis_index") else "collective"
    if row is not None and getattr(row, "fusion", None):
        return row.fusion
    if row is not None and getattr(row, "elementwise", False):
        return "elementwise"
    if name in MATMULS:
        return "matmul"
    if name in JAX_VIEWS or (name in NO_COST and name not in ("while", "split")):
        return "view"
    if name in JAX_ELEMENTWISE:
        return "elementwise"
    if name.startswith("reduce_") or name in ("argmax", "argmin"):
        return "reduction"
    return "opaque"


class Ref:
    """A program's value as a key (some programs' variables cannot be hashed): equal to
    another Ref of the same variable in the same ``scope`` (a body inlined twice gets two
    scopes, so its values stay apart)."""

    __slots__ = ("var", "scope")

    def __init__(self, var, scope=0):
        self.var, self.scope = var, scope

    def __hash__(self):
        return hash((id(self.var), self.scope))

    def __eq__(self, other):
        return isinstance(other, Ref) and other.var is self.var and other.scope == self.scope

    @property
    def aval(self):
        return getattr(self.var, "aval", None)

    def __repr__(self):
        return f"Ref({self.var})"


def ref(v, scope=0):
    """``v`` as a key: a :class:`Ref` of a variable; a literal as it is."""
    return v if isinstance(v, Ref) or not _is_var(v) else Ref(v, scope)


class Eqn:
    """An equation read through Refs, its operands renamed by ``resolve`` (the values a
    call's body reads are the caller's)."""

    def __init__(self, eqn, resolve=lambda v: v, scope=0):
        self.eqn = getattr(eqn, "eqn", eqn)
        self.primitive, self.params = eqn.primitive, eqn.params
        self.invars = [resolve(ref(v, scope)) for v in eqn.invars]
        self.outvars = [ref(v, scope) for v in eqn.outvars]


@dataclass
class Kernel:
    """One kernel XLA would launch: its equations, what it reads and writes in HBM.

    ``kind`` is ``'loop'`` (elementwise), ``'reduction'``, ``'matmul'``, ``'collective'``
    or ``'opaque'``; ``reads`` and ``writes`` map each value read from or written to HBM
    to its bytes (a value read twice by the kernel counts once)."""

    kind: str
    eqns: list = field(default_factory=list)
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)
    shape: tuple = ()              # a reduction's result shape, a matmul's output shape
    itemsize: int = 0              # a matmul's output element size

    @property
    def bytes(self) -> int:
        return sum(self.reads.values()) + sum(self.writes.values())

    @property
    def name(self) -> str:
        names = [_primitive_name(e) for e in self.eqns]
        lead = next((n for n in names if n in MATMULS), names[0] if names else self.kind)
        return lead if len(names) == 1 else f"{lead}+{len(names) - 1}"


class _Fuser:
    """The state of one pass over a flat list of equations."""

    def __init__(self, eqns, outvars):
        self.eqns = [e if isinstance(e, Eqn) else Eqn(e) for e in eqns]
        self.kernels = []
        self.alias, self.made_by = {}, {}          # var -> var it views; var -> kernel
        self.reduced = {}                          # value -> kernels reducing it
        self.readers = {}                          # var -> names of the equations reading it
        for eqn in self.eqns:
            for v in eqn.invars:
                if _is_var(v):
                    self.readers.setdefault(v, []).append(_primitive_name(eqn))
        self.outvars = [ref(v) for v in outvars if _is_var(v)]

    def root(self, v):
        while _is_var(v) and v in self.alias:
            v = self.alias[v]
        return v

    def producer(self, v):
        v = self.root(v)
        return self.made_by.get(v) if _is_var(v) else None

    def latest(self, eqn):
        """The index of the latest kernel producing one of ``eqn``'s operands, or None."""
        found = [self.producer(v) for v in eqn.invars]
        found = [k for k in found if k is not None]
        return max(found) if found else None

    def place(self, eqn):
        kind = fusion_kind(eqn)
        if kind in ("view", "broadcast") or (kind == "elementwise" and self._view_into_dot(eqn)):
            for o, i in zip(eqn.outvars, eqn.invars):
                self.alias[o] = i                  # read where it is, at its own size
            return
        k = {"elementwise": self._elementwise, "reduction": self._reduction}.get(
            kind, lambda e: None)(eqn)
        if k is None:
            k = len(self.kernels)
            self.kernels.append(Kernel("loop" if kind == "elementwise" else kind))
            out = _typed(eqn.outvars[0]) if eqn.outvars else None
            self.kernels[k].shape = tuple(out.shape) if out is not None else ()
            self.kernels[k].itemsize = out.dtype.itemsize if out is not None else 0
        self.kernels[k].eqns.append(eqn)
        for o in eqn.outvars:
            self.made_by[o] = k
        if kind == "reduction":
            self.reduced.setdefault(self.root(eqn.invars[0]), []).append(k)

    def _view_into_dot(self, eqn):
        """A transpose only dot_generals read: XLA folds it into their dimension numbers."""
        if _primitive_name(eqn) != "transpose":
            return False
        readers = [n for o in eqn.outvars for n in self.readers.get(o, ())]
        return bool(readers) and all(n in MATMULS for n in readers)

    def _elementwise(self, eqn):
        k = self.latest(eqn)
        if k is None:
            return None
        kernel, out = self.kernels[k], _typed(eqn.outvars[0])
        if kernel.kind == "loop":
            return k
        if kernel.kind in ("matmul", "reduction") and out is not None and \
                tuple(out.shape) == kernel.shape and (kernel.kind == "reduction" or
                                                      out.dtype.itemsize <= kernel.itemsize):
            return k                               # an epilogue (a GEMM's never widens)
        return None

    def _reduction(self, eqn):
        operand = self.root(eqn.invars[0])
        k = self.producer(operand)
        if k is not None and k == self.latest(eqn) and self.kernels[k].kind == "loop":
            self.kernels[k].kind = "reduction"
            self.kernels[k].shape = tuple(_typed(eqn.outvars[0]).shape)
            return k
        out = tuple(_typed(eqn.outvars[0]).shape)
        for j in reversed(self.reduced.get(operand, ())):    # a sibling reducing the same
            if (k is None or j >= k) and self.kernels[j].kind == "reduction" and \
                    self.kernels[j].shape == out:
                return j
        return None

    def _recomputable(self, v) -> bool:
        """A value an elementwise equation made in a loop or reduction kernel: a kernel
        that needs it computes it again from its sources rather than reading it."""
        k = self.made_by.get(v)
        if k is None or self.kernels[k].kind not in ("loop", "reduction"):
            return False
        return fusion_kind(self.maker[v]) == "elementwise"

    def sources(self, v) -> frozenset:
        """The stored values a kernel that needs ``v`` reads: what ``v`` is computed from,
        when reading those costs about what reading ``v`` would (XLA weighs duplicating a
        producer against the bytes it saves); else ``v`` itself, stored."""
        v = self.root(v)
        if not _is_var(v):
            return frozenset()
        if v not in self.memo:
            self.memo[v] = frozenset((v,))           # stored, unless recomputing is as cheap
            if self._recomputable(v):
                found = frozenset().union(*(self.sources(u) for u in self.maker[v].invars))
                if sum(_nbytes(_typed(u)) for u in found) <= 1.25 * _nbytes(_typed(v)):
                    self.memo[v] = found
        return self.memo[v]

    def _merge_siblings(self):
        """Reductions into the same shape that read a common value, the later not waiting
        on the earlier: one kernel (XLA's multi-output fusion: layernorm's mean and mean
        of squares in one pass)."""
        kernels = self.kernels
        made = {o: k for k, kern in enumerate(kernels) for e in kern.eqns for o in e.outvars}
        direct = [{made[u] for u in kern.reads if u in made} for kern in kernels]

        def waits_on(k, targets):
            """Whether kernel k waits, through any chain of kernels, on one of ``targets``
            (kernels come in an order where each waits only on earlier ones)."""
            low, seen, todo = min(targets), set(), [k]
            while todo:
                for d in direct[todo.pop()]:
                    if d in targets:
                        return True
                    if d >= low and d not in seen:
                        seen.add(d)
                        todo.append(d)
            return False
        gone, members, readers = set(), [{k} for k in range(len(kernels))], {}
        for k, kern in enumerate(kernels):
            if kern.kind != "reduction":
                continue
            candidates = sorted({j for u in kern.reads for j in readers.get(u, ())}, reverse=True)
            for u in kern.reads:
                readers.setdefault(u, []).append(k)
            for j in candidates:
                other = kernels[j]
                if j in gone or other.shape != kern.shape or waits_on(k, members[j]):
                    continue
                kern.eqns[:0] = other.eqns
                kern.reads = {**other.reads, **kern.reads}
                members[k] |= members[j]
                direct[k] |= direct[j]
                gone.add(j)
        self.kernels = [kern for n, kern in enumerate(kernels) if n not in gone]
        for n, kern in enumerate(self.kernels):
            inside = {o for e in kern.eqns for o in e.outvars}
            kern.reads = {u: b for u, b in kern.reads.items() if u not in inside}
            for o in inside:
                self.made_by[o] = n

    def finish(self):
        """Each kernel's reads (stored values from outside it; a loop or reduction kernel
        recomputes the elementwise values of others, as XLA duplicates cheap producers
        into their consumers) and writes (values another kernel reads, or results)."""
        self.maker = {o: e for kernel in self.kernels for e in kernel.eqns for o in e.outvars}
        self.memo = {}
        for k, kernel in enumerate(self.kernels):
            for eqn in kernel.eqns:
                for v in eqn.invars:
                    r = self.root(v)
                    if not _is_var(r) or self.made_by.get(r) == k:
                        continue
                    found = self.sources(r) if kernel.kind in ("loop", "reduction") else {r}
                    for u in found:
                        if self.made_by.get(u) != k:
                            kernel.reads[u] = _nbytes(_typed(u))
        self._merge_siblings()
        needed = {self.root(v) for v in self.outvars} | {
            u for kernel in self.kernels for u in kernel.reads}
        for kernel in self.kernels:
            kernel.writes = {o: _nbytes(_typed(o)) for e in kernel.eqns for o in e.outvars
                             if o in needed}
        return [kern for kern in self.kernels if kern.writes or kern.kind != "loop"]

def fuse(eqns, outvars=()) -> list:
    """The kernels XLA would run for ``eqns`` (a flat list: no nested bodies), in an order
    in which each reads only what earlier ones wrote. ``outvars`` are the values the
    program returns (always written)."""
    fuser = _Fuser(eqns, outvars)
    for eqn in fuser.eqns:
        fuser.place(eqn)
    return fuser.finish()


def fused_bytes(program) -> int:
    """The HBM bytes ``program`` (a jaxpr without nested bodies) moves once fused."""
    inner = getattr(program, "jaxpr", program)
    return sum(k.bytes for k in fuse(inner.eqns, inner.outvars))
