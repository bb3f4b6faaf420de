"""The most bytes one device holds at once while its step runs, kernel by kernel.

:func:`simpmd.cost.memory.peak_memory` walks a program equation by equation, so every
intermediate of an elementwise chain (Adam's ``b1 * m``, a norm's float32 square) is
memory. A compiler fuses such a chain into one kernel whose intermediates stay in
registers, and updates a loop's buffers in place. Here the same walk goes kernel by
kernel, with the kernels of :mod:`simpmd.plan.schedule`: a kernel's results are held
from the moment it runs to the last kernel that reads them; the step's arguments for the
whole step; a layout change (reshape, a type made varying) is the same buffer; a scatter
into a buffer, or a gradient added into its accumulator, updates it in place; a ``scan``
holds its stacked results (the forward pass's residuals, one set per iteration) and, on
top, what one iteration of its body holds.
"""
from __future__ import annotations

from ..cost.walk import _is_var, _nbytes, _primitive_name, _typed
from .schedule import _regions

ALIAS = frozenset({"pvary", "reshape", "squeeze", "expand_dims", "name", "stop_gradient",
                   "optimization_barrier"})
IN_PLACE = frozenset({"scatter", "scatter-add", "dynamic_update_slice"})
BROADCAST = frozenset({"broadcast_in_dim", "iota"})


def _size(v) -> int:
    a = _typed(v)
    return _nbytes(a) if a is not None else 0


def _body(eqn):
    for key in ("jaxpr", "call_jaxpr", "fun_jaxpr"):
        if key in eqn.params:
            return getattr(eqn.params[key], "jaxpr", eqn.params[key])
    return None


def _kernels(eqns) -> list:
    """``(made, reads, same_as, extra)`` per kernel: the variables it makes that hold new
    bytes, those it reads, those that share another's buffer, and a nested body's peak."""
    regions = _regions(eqns)
    buffers = {v for kind, group in regions if kind in ("scan", "inline", "collective")
               for x in group for v in x.invars}
    out = []
    for kind, group in regions:
        e = group[0]
        name = _primitive_name(e)
        made = {v for x in group for v in x.outvars}
        if name in BROADCAST:               # a constant spread out: a buffer only where a
            made = made & buffers            # loop or a collective needs one
        inner = {v for x in group for v in x.invars if _is_var(v)}
        same = {}
        if kind == "free" and (name in ALIAS or name in ("add_any", "add")):
            same = {o: next((v for v in e.invars if _is_var(v)), None) for o in e.outvars}
        elif name in IN_PLACE and _is_var(e.invars[0]):
            same = {e.outvars[0]: e.invars[0]}
        reads = inner - made
        extra = 0
        if kind in ("scan", "inline") and _body(e) is not None:
            body = _body(e)                 # its results go to the loop's own buffers,
            args = sum(_size(v) for v in body.invars)          # counted with ``made``
            extra = max(0, peak(body, results_elsewhere=True) - args)
        out.append((made, reads, same, extra))
    return out


def peak(program, keep_arguments=False, results_elsewhere=False) -> int:
    """The most bytes live at once running ``program``, its arguments included; an
    argument is freed after its last use (a training step donates its old weights and
    optimizer state, which it replaces) unless ``keep_arguments``; with
    ``results_elsewhere`` (a loop's body) its results are written into buffers that its
    caller counts."""
    inner = getattr(program, "jaxpr", program)
    eqns = list(inner.eqns)
    kernels = _kernels(eqns)
    wanted = {v for _, reads, _, _ in kernels for v in reads} | set(inner.outvars)
    kernels = [({v for v in made if v in wanted}, reads, same, extra)   # a fused run's
               for made, reads, same, extra in kernels]                # inside is no memory
    last = {}
    for k, (_, reads, _, _) in enumerate(kernels):
        for v in reads:
            last[v] = k
    for v in inner.outvars:
        if _is_var(v):
            last[v] = len(kernels)
    root = {}
    live = {v: _size(v) for v in list(inner.invars) + list(getattr(inner, "constvars", []))}
    args = set(live) if keep_arguments else set()
    top = sum(live.values())
    results = set(inner.outvars) if results_elsewhere else set()
    for k, (made, reads, same, extra) in enumerate(kernels):
        for v in made:
            if v in same and same[v] is not None:
                base = root.get(same[v], same[v])
                root[v] = base
                last[base] = max(last.get(base, -1), last.get(v, -1))
            elif v not in same and v not in results:
                live[v] = _size(v)
        top = max(top, sum(live.values()) + extra)
        for v in list(live):
            if v not in args and last.get(v, -1) <= k:
                del live[v]
    return top
