"""XLA's fusion as simpmd models it: which equations of a program run as one kernel, and
the bytes each kernel reads from and writes to HBM.

XLA does not run a jaxpr equation by equation. It fuses chains of cheap operations into one
kernel that reads its inputs once and writes only what later kernels need; the
intermediate values stay in registers. The rules here follow XLA's passes in outline:

* **elementwise chains** (arithmetic, comparisons, ``convert_element_type``, ``select_n``,
  and layout moves such as ``transpose``, ``slice``, ``pad``) join the kernel of the
  operand produced last (*loop fusion*);
* a **broadcast** is not materialised: each consumer reads the small value it broadcasts;
  ``reshape`` and ``squeeze`` are views (a view may keep other buffers alive as long as
  its readers run, as an FP8 value read by a GEMM keeps its transposed copy for the weight
  gradient's: its row's ``keeps`` column), and so is a ``transpose`` that only dot_generals
  read (XLA folds it into the dot's dimension numbers); a ``transpose`` that alone reads a
  product's result, swapping its operands' free axes, is the product with its operands
  swapped, writing that layout (XLA's ``HandleTranspose``: transpose(dot(a, b)) ->
  dot(b, a); cuBLAS's transposed-operand flags, as Megatron-LM computes each weight
  gradient in the weight's own layout);
* a **reduction** joins the elementwise kernel that produces its operand (*input fusion*),
  or a reduction that already reads the same operand into the same shape (*multi-output
  fusion*: a layernorm's mean and mean of squares in one pass); an elementwise consumer of
  the reduced shape joins it too (*reduction epilogue*);
* a **matmul** starts its own kernel, and elementwise consumers of its result's shape join
  it (*epilogue*: a bias, a residual add, an activation, a cast);
* a **scatter** (or ``dynamic_update_slice``) updates its operand in place, moving the
  bytes of its updates; an addition into the result of a scatter is folded into it (XLA's
  algebraic simplifier rewrites ``A + scatter(0, i, u)`` as ``scatter(A, i, u)``:
  ``AlgebraicSimplifierVisitor::HandleAdd`` in openxla/xla's
  ``xla/hlo/transforms/simplifiers/algebraic_simplifier.cc``, commit 0057bb15e6);
* an **accumulation** (an addition of a matmul's result into a value of its shape) is
  done in place by the GEMM, which adds into its output buffer (cuBLAS's ``beta = 1``);
  with ``accumulation_fusion``, as Megatron-LM's gradient-accumulation fusion adds each
  weight gradient into its buffer inside the GEMM that computes it
  (``--gradient-accumulation-fusion``, Megatron-LM's ``arguments.py``), so is autodiff's
  ``add_any`` of a loop's result (the loop's gradients added where they are computed),
  and a loop whose accumulator starts at zero and is then added into another starts
  from that one (no zeros are written);
* a **slice** (``slice``, ``dynamic_slice``, ``gather``) is read where it lies: the
  kernel that reads it reads the region it names (a loop fusion indexes its operand;
  XLA's dynamic-slice fusion passes cuBLAS an offset into the buffer); only where a loop
  or a collective reads it is it copied out;
* a scalar computed from constants alone is folded away, as XLA's constant folding does;
* **eager PyTorch** (a :class:`~simpmd.cost.walk.Walker` made with ``eager=True``) fuses
  nothing: each elementwise operation and each reduction is a kernel of its own that
  reads its operands from HBM and writes its result there, as PyTorch runs operators one
  by one outside ``torch.compile`` (Ansel et al. 2024, 'PyTorch 2', ASPLOS, section 2:
  eager mode dispatches each operator to its own kernel; TorchInductor's fusion of
  pointwise operations and reductions is what ``torch.compile`` adds); views, broadcasts
  (``expand``) and slices stay free, and the GEMM still adds into its output; the
  gradient of a split (autodiff's ``pad`` of each piece, added up) is PyTorch's
  ``cat``: each piece read once and written into its place;
* collectives, sorts and cumulative sums run on their own, writing every result they
  return, and so does an operation a framework runs as a kernel of its own (a row's
  ``fusion`` rule of its parameters says which) and a loop or a conditional (a *block*:
  its body is a program of its own kernels); a broadcast a block or a collective reads
  is written out, as their operands must be buffers.

A kernel joins only the latest of its operands' kernels, so kernels stay in an order in
which each reads only what earlier ones wrote. The counts are per device, as the roofline's.
:func:`body_kernels` gives the kernels of one body of a program, its calls inlined as XLA
inlines them, for the prediction (:mod:`simpmd.cost.predict`) and the memory walk
(:mod:`simpmd.cost.memory`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .rows import column
from .walk import (_is_var, _nbytes, _primitive_name, _row, _typed, axes_in, flops_and_bytes,
                   jax_fusion, nested, scan_split)

# The rows' fusion columns (``fusion``, ``slice_view``, ``fuses_into_dot``, ...) are the
# cost model's, registered in simpmd/cost/rows.py.
ACCUMULATING = frozenset({"matmul", "in_place", "block"})


def fusion_kind(eqn) -> str:
    """``'view'``, ``'broadcast'``, ``'elementwise'``, ``'reduction'``, ``'matmul'``,
    ``'collective'``, ``'in_place'``, ``'block'`` (a loop or a conditional) or
    ``'opaque'``: how XLA's fusion treats this equation (a row's ``fusion`` column, or
    its rule of the equation's parameters: a framework that runs it as a kernel of its
    own, as PyTorch runs ``torch.nn.Dropout``; for a primitive of JAX's without one,
    :func:`simpmd.cost.walk.jax_fusion`)."""
    row = _row(eqn)
    if nested(eqn)[0] in ("repeat", "until", "branches"):
        return "block"
    if column(row, "matmul"):
        return "matmul"
    fusion = column(row, "fusion")
    if fusion:                                     # a kind, or a rule of the parameters
        return fusion(eqn.params) if callable(fusion) else fusion
    if row is not None and row.collective:
        return "collective"
    if row is not None and row.elementwise:
        return "elementwise"
    return jax_fusion(eqn)


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

    ``kind`` is ``'loop'`` (elementwise), ``'reduction'``, ``'matmul'``, ``'collective'``,
    ``'in_place'``, ``'block'`` (a loop or a conditional) or ``'opaque'``; ``reads`` and
    ``writes`` map each value read from or written to HBM to its bytes (a value read twice
    by the kernel counts once). ``in_place`` maps a result to the value whose buffer it
    updates; ``redo`` lists the equations of other kernels it computes again rather than
    read their results (cheap elementwise producers)."""

    kind: str
    eqns: list = field(default_factory=list)
    reads: dict = field(default_factory=dict)
    writes: dict = field(default_factory=dict)
    shape: tuple = ()              # a reduction's result shape, a matmul's output shape
    itemsize: int = 0              # a matmul's output element size
    in_place: dict = field(default_factory=dict)
    own_bytes: int | None = None   # an in-place update's bytes (its updates, not the buffer)
    redo: list = field(default_factory=list)

    @property
    def bytes(self) -> int:
        if self.own_bytes is not None:
            return self.own_bytes
        return sum(self.reads.values()) + sum(self.writes.values())

    @property
    def name(self) -> str:
        names = [_primitive_name(e) for e in self.eqns]
        lead = next((n for e, n in zip(self.eqns, names) if column(_row(e, n), "matmul")),
                    names[0] if names else self.kind)
        return lead if len(names) == 1 else f"{lead}+{len(names) - 1}"


class _Fuser:
    """The state of one pass over a flat list of equations."""

    def __init__(self, eqns, outvars, accumulation_fusion=False, eager=False):
        self.eqns = [e if isinstance(e, Eqn) else Eqn(e) for e in eqns]
        self.accumulation_fusion, self.eager = accumulation_fusion, eager
        self.kernels, self.free = [], []           # kernels; equations in none (views)
        self.alias, self.made_by = {}, {}          # var -> var it views; var -> kernel
        self.within = {}                           # a slice read where it lies -> its source
        self.constants = set()                     # scalars computed from constants alone
        self.kept = {}                             # a view -> buffers its readers also keep
        self.reduced = {}                          # value -> kernels reducing it
        self.kinds = {id(e): fusion_kind(e) for e in self.eqns}
        self.users, self.finals = {}, {}           # var -> equations reading it
        for eqn in self.eqns:
            for v in eqn.invars:
                if _is_var(v):
                    self.users.setdefault(v, []).append(eqn)
        self.outvars = [ref(v) for v in outvars if _is_var(v)]
        self.folded = self._zero_starts() if accumulation_fusion else set()

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

    def read_by(self, v) -> frozenset:
        """How the equations that finally read ``v`` fuse (through views of it)."""
        if v not in self.finals:
            kinds = set()
            for e in self.users.get(v, ()):
                kind = self.kinds[id(e)]
                kinds |= (set().union(*map(self.read_by, e.outvars)) if kind == "view"
                          else {kind})
            self.finals[v] = frozenset(kinds)
        return self.finals[v]

    def place(self, eqn):
        kind, row = self.kinds[id(eqn)], _row(eqn)
        if kind == "elementwise" and self._folds(eqn, row):
            self.free.append(eqn)
            return
        if kind == "broadcast" and self.read_by(eqn.outvars[0]) & {"block", "collective"}:
            kind = "elementwise"                   # a buffer its reader needs
        if column(row, "fuses_into_dot") and self._out_of_dot(eqn):
            k = self.producer(eqn.invars[0])       # the product writes the transposed layout
            self.kernels[k].eqns.append(eqn)
            self.kernels[k].shape = tuple(_typed(eqn.outvars[0]).shape)
            self.made_by[eqn.outvars[0]] = k
            return
        if kind in ("view", "broadcast") or (column(row, "fuses_into_dot") and self._into_dot(eqn)) \
                or id(eqn) in self.folded:
            for o, i in zip(eqn.outvars, eqn.invars):
                self.alias[o] = i                  # read where it is, at its own size
            keeps = column(row, "keeps")
            if keeps is not None:                  # ... with buffers its readers also need
                self.kept[eqn.outvars[0]] = [self.root(v) for v in keeps(eqn.params, eqn.invars)
                                             if _is_var(v)]
            self.free.append(eqn)
            return
        if column(row, "slice_view"):
            if self.read_by(eqn.outvars[0]) & {"block", "collective"}:
                kind = "copy"                      # a buffer its reader needs
            else:                                  # its readers read the region it names
                self.within[eqn.outvars[0]] = self.root(eqn.invars[0])
                self.free.append(eqn)
                return
        if self.eager and column(row, "eager_piece"):
            kind = "in_place"                      # a piece of a concatenation (below)
        k = None
        if kind == "elementwise":
            k = self._accumulation(eqn, column(row, "accumulates"))
            k = self._elementwise(eqn) if k is None and not self.eager else k
        elif kind == "reduction" and not self.eager:
            k = self._reduction(eqn)
        if k is None:
            k = self._new_kernel(eqn, kind)
        self.kernels[k].eqns.append(eqn)
        for o in eqn.outvars:
            self.made_by[o] = k
        if kind == "reduction":
            self.reduced.setdefault(self.root(eqn.invars[0]), []).append(k)

    def _zero_starts(self) -> set:
        """The broadcasts that start a scan's carry whose result only an ``add_any`` reads
        (an accumulator added into another when the loop ends): ids of their equations."""
        makers = {o: e for e in self.eqns for o in e.outvars}
        found = set()
        for e in self.eqns:
            if nested(e)[0] != "repeat":
                continue
            consts, carry = scan_split(e.eqn)
            for j in range(consts, consts + carry):
                readers = self.users.get(e.outvars[j - consts], [])
                if len(readers) != 1 or column(_row(readers[0]), "accumulates") != "gradients":
                    continue
                src = makers.get(e.invars[j])
                while src is not None and self.kinds[id(src)] == "view":
                    src = makers.get(src.invars[0])
                if src is not None and self.kinds[id(src)] == "broadcast":
                    found.add(id(src))
        return found

    def _constant(self, v) -> bool:
        v = self.root(v)
        return not _is_var(v) or v in self.constants

    def _folds(self, eqn, row) -> bool:
        """A scalar computed from constants alone is a constant (XLA's constant folding,
        ``HloConstantFolding``); a select on a constant predicate is the case it picks
        (``HandleSelect``: select(true, x, y) -> x), at no cost either way."""
        out = _typed(eqn.outvars[0]) if len(eqn.outvars) == 1 else None
        if out is None or tuple(out.shape) != ():
            return False
        if all(self._constant(v) for v in eqn.invars):
            self.constants.add(eqn.outvars[0])
            return True
        if column(row, "selects") and self._constant(eqn.invars[0]):
            cases = [v for v in eqn.invars[1:] if not self._constant(v)]
            self.alias[eqn.outvars[0]] = cases[0]
            return True
        return False

    def _new_kernel(self, eqn, kind) -> int:
        kernel = Kernel("loop" if kind == "elementwise" else kind)
        out = _typed(eqn.outvars[0]) if eqn.outvars else None
        kernel.shape = tuple(out.shape) if out is not None else ()
        kernel.itemsize = out.dtype.itemsize if out is not None else 0
        if kind == "copy":                         # read the region, write it out
            kernel.own_bytes = 2 * _nbytes(out)
        if kind == "in_place":                     # the updates' bytes, as the row counts
            update = _nbytes(_typed(eqn.invars[1])) if len(eqn.invars) > 1 else 0
            kernel.own_bytes = flops_and_bytes(eqn.eqn)[1] or 2 * update
            if column(_row(eqn), "eager_piece"):   # eager: its piece, read and written
                kernel.own_bytes = 2 * _nbytes(_typed(eqn.invars[0]))
            buffer = self.root(eqn.invars[0])
            if _is_var(buffer) and _nbytes(_typed(buffer)) == _nbytes(out):
                kernel.in_place[eqn.outvars[0]] = buffer
        if kind == "block" and nested(eqn)[0] == "repeat":
            self._carries_in_place(eqn, kernel)
        self.kernels.append(kernel)
        return len(self.kernels) - 1

    def _carries_in_place(self, eqn, kernel):
        """A scan's carries: each result in its initial value's buffer, which the loop
        updates (XLA's buffer assignment colocates a while loop's operand, its body's
        parameter and root, and its result; copy insertion adds a copy only where the
        initial value is read after the loop: openxla/xla, xla/service/copy_insertion.cc),
        so that an accumulator is one buffer, not its start and its end."""
        consts, carry = scan_split(eqn.eqn)
        for out, start in zip(eqn.outvars[:carry], eqn.invars[consts:consts + carry]):
            buffer = self.root(start)
            if _is_var(buffer) and _nbytes(_typed(buffer)) == _nbytes(_typed(out)):
                kernel.in_place[out] = buffer

    def _into_dot(self, eqn):
        """A transpose or a slice only matmuls read: part of their operand load."""
        kinds = set().union(*map(self.read_by, eqn.outvars))
        return kinds == {"matmul"}

    def _out_of_dot(self, eqn) -> bool:
        """A transpose that alone reads a product's result and puts the right operand's
        free axes before the left's (batch axes first): the product computed with its
        operands swapped gives that layout at once (XLA's algebraic simplifier,
        ``HandleTranspose``: transpose(dot(a, b)) -> dot(b, a) when the dot has no other
        user; cuBLAS's transposed-operand flags, as Megatron-LM computes a weight gradient
        in the weight's layout)."""
        v = eqn.invars[0]
        k = self.producer(v) if _is_var(v) and self.root(v) is v else None
        if k is None or self.kernels[k].kind != "matmul" or len(self.users.get(v, ())) != 1 \
                or v in self.outvars:
            return False
        dot = next((e for e in self.kernels[k].eqns if v in e.outvars), None)
        if dot is None or not column(_row(dot), "writes_transposed"):
            return False
        (lc, rc), (lb, _) = dot.params["dimension_numbers"]
        nb = len(lb)
        nl = len(_typed(dot.invars[0]).shape) - len(lc) - nb
        nr = len(_typed(dot.invars[1]).shape) - len(rc) - nb
        perm = [int(d) for d in eqn.params["permutation"]]
        return (sorted(perm[:nb]) == list(range(nb))
                and perm[nb:nb + nr] == list(range(nb + nl, nb + nl + nr))
                and perm[nb + nr:] == list(range(nb, nb + nl)))

    def _accumulation(self, eqn, accumulates):
        """An addition into the result of a matmul, a scatter or (autodiff's ``add_any``)
        a loop, of that result's shape: done in place by its producer."""
        if accumulates is None:
            return None
        out, found = _typed(eqn.outvars[0]), []
        for i, v in enumerate(eqn.invars):
            k, a = self.producer(v), _typed(self.root(v))
            if k is None or a is None or out is None or (tuple(a.shape), a.dtype) != (
                    tuple(out.shape), out.dtype):
                continue
            kind = self.kernels[k].kind
            if kind in ACCUMULATING and (kind != "block" or (
                    accumulates == "gradients" and self.accumulation_fusion)):
                found.append((k, i))
        if not found or max(found)[0] != self.latest(eqn):
            return None
        k, i = max(found)
        other = self.root(eqn.invars[1 - i]) if len(eqn.invars) == 2 else None
        if _is_var(other):
            self.kernels[k].in_place[eqn.outvars[0]] = other
        return k

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
        if self.eager or k is None or self.kernels[k].kind not in ("loop", "reduction"):
            return False
        return self.kinds[id(self.maker[v])] == "elementwise"

    def sources(self, v) -> tuple:
        """(the stored values a kernel that needs ``v`` reads, the equations it runs again
        to make ``v`` from them): what ``v`` is computed from, when reading those costs
        about what reading ``v`` would (XLA weighs duplicating a producer against the bytes
        it saves); else ``v`` itself, stored."""
        v = self.root(v)
        if not _is_var(v):
            return frozenset(), ()
        if v not in self.memo:
            self.memo[v] = (frozenset((v,)), ())     # stored, unless recomputing is as cheap
            if self._recomputable(v):
                parts = [self.sources(u) for u in self.maker[v].invars]
                found = frozenset().union(*(p[0] for p in parts))
                if sum(_nbytes(_typed(u)) for u in found) <= 1.25 * _nbytes(_typed(v)):
                    chain = tuple(dict.fromkeys(e for p in parts for e in p[1]))
                    self.memo[v] = (found, chain + (self.maker[v],))
        return self.memo[v]

    def _merge_siblings(self):
        """Reductions into the same shape that read a common value, the later not waiting
        on the earlier and no kernel between them reading the earlier's results: one
        kernel, where the later is (XLA's multi-output fusion: layernorm's mean and mean
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
                if j in gone or other.shape != kern.shape or waits_on(k, members[j]) or any(
                        direct[m] & members[j] for m in range(j + 1, k) if m not in gone):
                    continue                       # (a kernel between them reads j's)
                kern.eqns[:0] = other.eqns
                kern.redo[:0] = other.redo
                kern.reads = {**other.reads, **kern.reads}
                members[k] |= members[j]
                direct[k] |= direct[j]
                gone.add(j)
        self.kernels = [kern for n, kern in enumerate(kernels) if n not in gone]
        for n, kern in enumerate(self.kernels):
            inside = {o for e in kern.eqns for o in e.outvars}
            kern.reads = {u: b for u, b in kern.reads.items() if u not in inside}
            kern.redo = [e for e in kern.redo if e.outvars[0] not in inside]
            for o in inside:
                self.made_by[o] = n

    def _read(self, k, kernel, eqn):
        """Record what ``eqn`` of kernel ``k`` reads from HBM (a loop or reduction kernel
        recomputes the elementwise values of others, as XLA duplicates cheap producers
        into their consumers)."""
        for v in eqn.invars:
            r = self.root(v)
            for u in self._kept_along(v):          # kept alive by the read, not read
                if self.made_by.get(u) != k:
                    kernel.reads.setdefault(u, 0)
            if not _is_var(r) or self.made_by.get(r) == k:
                continue
            found, chain = (self.sources(r) if kernel.kind in ("loop", "reduction")
                            else ((r,), ()))
            for u in found:
                if self.made_by.get(u) != k:
                    kernel.reads[u] = _nbytes(_typed(u))
            kernel.redo += [e for e in chain if self.made_by.get(e.outvars[0]) != k
                            and e not in kernel.redo]

    def _kept_along(self, v) -> list:
        """The buffers the views on the way from ``v`` to what it reads keep alive."""
        found = []
        while _is_var(v) and v in self.alias:
            found += self.kept.get(v, [])
            v = self.alias[v]
        return found

    def finish(self):
        """Each kernel's reads (stored values from outside it) and writes (values another
        kernel reads, or results); loop kernels nothing reads from are left out (their
        readers compute them again: :attr:`dropped`)."""
        self.maker = {o: e for kernel in self.kernels for e in kernel.eqns for o in e.outvars}
        self.memo = {}
        for k, kernel in enumerate(self.kernels):
            for eqn in kernel.eqns:
                self._read(k, kernel, eqn)
        if not self.eager:
            self._merge_siblings()
        needed = {self.root(v) for v in self.outvars} | {
            u for kernel in self.kernels for u in kernel.reads}
        for kernel in self.kernels:                # (a kernel of its own writes all it returns)
            kernel.writes = {o: _nbytes(_typed(o)) for e in kernel.eqns for o in e.outvars
                             if o in needed or kernel.kind == "opaque" or self.eager}
        self.dropped = [kern for kern in self.kernels if not kern.writes and kern.kind == "loop"]
        return [kern for kern in self.kernels if kern.writes or kern.kind != "loop"]


def fuse(eqns, outvars=(), eager=False) -> list:
    """The kernels XLA would run for ``eqns`` (a flat list: no nested bodies), in an order
    in which each reads only what earlier ones wrote. ``outvars`` are the values the
    program returns (always written); ``eager``: eager PyTorch's kernels, one per
    operation, instead."""
    fuser = _Fuser(eqns, outvars, eager=eager)
    for eqn in fuser.eqns:
        fuser.place(eqn)
    return fuser.finish()


def fused_bytes(program) -> int:
    """The HBM bytes ``program`` (a jaxpr without nested bodies) moves once fused."""
    inner = getattr(program, "jaxpr", program)
    return sum(k.bytes for k in fuse(inner.eqns, inner.outvars))


# -- the kernels of one body of a program ------------------------------------------------------

@dataclass
class Body:
    """The kernels of one body of a program as one device runs it (:func:`body_kernels`):
    ``kernels`` in the order they run; ``dropped``, loop kernels whose readers compute them
    again; ``free``, the equations in no kernel (views, slices read where they lie);
    ``invars``/``constvars``/``outvars`` the body's inputs and results as Refs; ``alias``
    and ``within``, each view's and slice's source; ``sizes`` and ``phase``, each
    equation's mesh axes in scope and its pass (by ``id`` of its :class:`Eqn`)."""

    kernels: list
    dropped: list
    free: list
    invars: list
    constvars: list
    outvars: list
    alias: dict
    within: dict
    sizes: dict
    phase: dict

    def base(self, v):
        """The stored value ``v`` is, or lies in (a view's, a slice's source)."""
        while _is_var(v):
            if v in self.alias:
                v = self.alias[v]
            elif v in self.within:
                v = self.within[v]
            else:
                break
        return v


class _Flat:
    """A body's live equations as one device runs them: calls inlined (XLA inlines them),
    a loop or a conditional one equation (a block), each read through the walk."""

    def __init__(self, walker):
        self.walker, self.eqns, self.alias, self.sizes, self.phase = walker, [], {}, {}, {}
        self.scopes = 0

    def resolve(self, v):
        while _is_var(v) and v in self.alias:
            v = self.alias[v]
        return v

    def add(self, program, sizes, scope, phase):
        for eqn in self.walker.live(program).eqns:
            here = phase if getattr(eqn, "phase", "forward") == "forward" else eqn.phase
            if nested(eqn)[0] == "call":
                self._inline(eqn, sizes, scope, here)
                continue
            e = Eqn(eqn, self.resolve, scope)
            self.eqns.append(e)
            self.sizes[id(e)], self.phase[id(e)] = sizes, here

    def _inline(self, eqn, sizes, scope, phase):
        """A call's body in place: its inputs are the caller's values, its results the
        caller's (a shard_map's or a pmap's body reads one device's shards: its own)."""
        body = self.walker.bodies(eqn, sizes)[0][0]
        inner = getattr(body, "jaxpr", body)
        self.scopes += 1
        here, params = self.scopes, eqn.params
        if not (("mesh" in params or "shard_mesh" in params) or "axis_size" in params):
            for i, o in zip(inner.invars, eqn.invars):
                self.alias[ref(i, here)] = self.resolve(ref(o, scope))
        self.add(body, axes_in(eqn, sizes), here, phase)
        for o, i in zip(eqn.outvars, self.walker.live(body).outvars):
            self.alias[ref(o, scope)] = self.resolve(ref(i, here))


def body_kernels(program, walker, sizes=None, phase="forward",
                 accumulation_fusion=False) -> Body:
    """The kernels one device runs for ``program`` (one body: a loop's or a conditional's
    equations are a block, whose own body is walked on its own), read through ``walker``
    (:class:`simpmd.cost.walk.Walker`: dead code left out, what a call runs);
    ``accumulation_fusion``: gradients added in place where they are computed."""
    flat = _Flat(walker)
    flat.add(program, dict(sizes or {}), 0, phase)
    inner = getattr(program, "jaxpr", program)
    if hasattr(inner, "outvars"):
        outs = [flat.resolve(ref(v)) for v in inner.outvars]
    else:                                          # a list of equations: every result
        outs = [o for e in flat.eqns for o in e.outvars]
    stored = [v for v in outs if _is_var(v)]
    if walker.whole:                               # an eager re-run writes every result
        read = {v for e in flat.eqns for v in e.invars}
        stored += [o for e in flat.eqns if flat.phase[id(e)] == "recompute"
                   for o in e.outvars if o not in read]
    fuser = _Fuser(flat.eqns, stored, accumulation_fusion, getattr(walker, "eager", False))
    for eqn in fuser.eqns:
        fuser.place(eqn)
    kernels = fuser.finish()
    return Body(kernels, fuser.dropped, fuser.free,
                [ref(v) for v in getattr(inner, "invars", ())],
                [ref(v) for v in getattr(inner, "constvars", ())], outs, fuser.alias,
                fuser.within, flat.sizes, flat.phase)
