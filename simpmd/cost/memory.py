"""Memory per device, read off the program: a liveness walk.

At any point of a step a device holds every value that has been computed and will still
be read, and the step's arguments (parameters, optimizer state, its shard of the batch),
which the caller keeps. Walking a program's equations in order, adding each result when it
is computed and dropping each value after its last use, gives the bytes live at every
equation; the largest is the memory the device needs. In a gradient step the values that
stay live longest are the forward pass's *residuals*, read again by the backward pass
(activations, mostly: a scan stacks one set per iteration); ``simpmd.checkpoint`` keeps
fewer of them and computes the rest again. The program is the one a device runs (the body
of a ``pmap`` or ``shard_map``), so every shape is one device's. It is read as every cost
analysis reads it (:mod:`simpmd.cost.walk`): equations nothing reads left out; a nested
body's values on top of what is live around it, a loop's body once (its values live for
one iteration at a time), a cond's branch the one the device takes (on values) or the
costliest (on shapes).

``jax.experimental.roofline`` reports a ``peak_hbm_bytes`` from a walk of the same kind,
with four differences, which :func:`peak_memory` can take on (``like_jax=True``) to
reproduce its number:

* it frees an argument after its last use, as if the caller had donated it; here the
  arguments stay live for the whole step (a training step without donation keeps the
  old parameters until it returns);
* it counts an equation's bytes after the equation has freed its dead inputs; here an
  equation's inputs and results are live together while it runs;
* it walks a nested program under ``jaxpr`` or ``call_jaxpr`` (a scan's body, a
  checkpoint, a jit) on its own, as if nothing outside it were live, and never a cond's
  branches or a while loop's body; a result nothing reads is never freed; here a body's
  own values come on top of what is live around it, and an unread result is dropped at once;
* it counts the result of ``pvary`` (a value's type made varying, under
  ``shard_map(check_vma=True)``) as new bytes; here it is the same buffer, as on hardware.

Neither is what XLA allocates: XLA fuses elementwise chains (their intermediates never
reach memory), updates buffers in place, and may recompute or offload on its own. With
``fused=True`` the same walk goes kernel by kernel instead, the kernels the prediction
runs (:func:`simpmd.cost.fusion.body_kernels`): a value is memory only if a kernel writes
it to HBM, from the kernel that writes it to the last that reads it (a fused chain's
intermediates are none; a value its readers compute again is held as its sources); a
kernel's inputs and results are live together while it runs; a scatter, or a gradient
added into its accumulator, updates the buffer in place. ``donate=True`` frees each
argument after its last use, as a training step that donates its old weights and
optimizer state does. And simpmd's backward pass keeps the values its derivative rules
read (the input of ``sin``), where JAX keeps what its linearization computed (``cos`` of
it): different values, of the same size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .fusion import body_kernels
from .rows import column
from .walk import (Walker, _equation_list, _is_var, _primitive_name, _row, axes_in,
                   flops_and_bytes, nested, traced, var_bytes, walk)

__all__ = ["Memory", "peak_memory", "memory", "flops"]


@dataclass
class Memory:
    """The liveness walk of one device's program.

    ``peak``: the most bytes live at once; ``arguments``: the bytes of the program's
    inputs; ``residuals``: the bytes of the forward pass's values that the backward pass
    reads (each counted once, wherever the peak is); ``at``: the equation running at the
    peak (-1 before any); ``timeline``: bytes live at each equation.
    """

    peak: int
    arguments: int
    residuals: int
    at: int
    equation: str = ""
    timeline: list = field(default_factory=list)

    def __str__(self):
        def size(b):
            return f"{b / 2**20:.3g} MiB" if b >= 2**20 else f"{b / 2**10:.3g} KiB" if b >= 2**10 \
                else f"{b} B"
        return (f"peak {size(self.peak)} per device (arguments {size(self.arguments)}); "
                f"residuals kept for the backward pass {size(self.residuals)}; the peak at "
                f"equation {self.at}: {self.equation}")


def _same_buffer(eqn) -> bool:
    return column(_row(eqn), "same_buffer")


def _bodies(eqn, like_jax, walker, sizes) -> list:
    """The programs ``eqn`` runs, as this walk counts them: JAX's roofline walks the one
    under ``jaxpr`` or ``call_jaxpr``; simpmd every body a device runs (a while loop's
    predicate and body; a cond's branch the device takes, or on shapes the costliest)."""
    if like_jax:
        inner = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
        return [inner] if hasattr(getattr(inner, "jaxpr", inner), "eqns") else []
    kind, bodies = nested(eqn)
    if kind == "branches" or (walker.taken is not None and bodies):
        return [b for b, _ in walker.bodies(eqn, axes_in(eqn, sizes))]
    return bodies


def _last_uses(eqns, inner, like_jax) -> tuple:
    """(index of each variable's last reader, the results that alias their operand)."""
    last = {}
    for k, e in enumerate(eqns):
        for v in e.invars:
            if _is_var(v):
                last[v] = k
    for v in inner.outvars:
        if _is_var(v):
            last[v] = len(eqns)
    alias = set()
    for e in reversed(eqns if not like_jax else []):     # an alias keeps its source alive
        if _same_buffer(e) and _is_var(e.invars[0]):
            alias.update(e.outvars)
            last[e.invars[0]] = max(last.get(e.invars[0], -1), last.get(e.outvars[0], -1))
    return last, alias


def _body_peak(eqn, like_jax, walker, sizes) -> int:
    """What ``eqn``'s bodies need: like JAX, the largest peak of one on its own; else the
    most any of them adds to what is live around it (its own values, not its inputs)."""
    extra = 0
    for body in _bodies(eqn, like_jax, walker, sizes):
        p = _liveness(body, like_jax, walker, axes_in(eqn, sizes))[0]
        inner = walker.live(body)
        extra = max(extra, p if like_jax else p - sum(
            var_bytes(v) for v in list(inner.invars) + list(inner.constvars) if _is_var(v)))
    return extra


def _liveness(program, like_jax, walker, sizes, donate=False, top=False):
    """(peak, the equation running at it, timeline) of one program (``top``: the program
    itself, not a body of one: like JAX, its arguments nothing reads are left out, as
    ``dce_jaxpr`` drops them before JAX's roofline walks it)."""
    inner = walker.live(program)
    eqns = inner.eqns
    args = [v for v in list(inner.constvars) + list(inner.invars) if _is_var(v)]
    last, alias = _last_uses(eqns, inner, like_jax)
    if like_jax and top:
        args = [v for v in args if v in last]
    live = {v: var_bytes(v) for v in args}
    constants = _constants_by_equation(eqns) if like_jax else []
    held = {c: n for read in constants for c, n in read.items()}
    last_read = {c: k for k, read in enumerate(constants) for c in read}
    current = sum(live.values()) + sum(held.values())
    peak, at, timeline = current, -1, []
    for k, e in enumerate(eqns):
        for v in e.outvars:
            live[v] = 0 if v in alias else var_bytes(v)
            current += live[v]
        extra = _body_peak(e, like_jax, walker, sizes)
        if like_jax and extra > peak:           # a nested program on its own
            peak, at = extra, k
        if not like_jax:
            timeline.append(current + extra)
            if current + extra > peak:
                peak, at = current + extra, k
        for v in e.invars:
            if _is_var(v) and last.get(v) == k and (like_jax or donate or v not in args) \
                    and v in live:
                current -= live.pop(v)
        if like_jax:
            current -= sum(held.pop(c) for c, at in last_read.items() if at == k and c in held)
            timeline.append(current)
            if current > peak:
                peak, at = current, k
        else:
            for v in e.outvars:
                if v not in last and v in live:       # nothing reads it
                    current -= live.pop(v)
    return peak, at, timeline


def _constants_by_equation(eqns) -> list:
    """Per equation, the array constants it reads, itself or in any body it runs
    (id -> bytes). JAX lifts each NumPy array a traced function closes over into the
    jaxpr's constants, live from the start until their last reader, and passes it to every
    body that reads it; simpmd's programs keep them in the equations that read them."""
    return [_constants_read(e) for e in eqns]


def _constants_read(eqn) -> dict:
    found = {id(v.value): var_bytes(v) for v in eqn.invars
             if not _is_var(v) and np.ndim(getattr(v, "value", 0)) > 0}
    for body in nested(eqn)[1]:
        for e in _equation_list(body):
            found.update(_constants_read(e))
    return found


def _kernel_liveness(program, walker, sizes, donate, bodies, accumulation_fusion,
                     results_elsewhere=False) -> tuple:
    """(peak, most bytes of its own values at once, the index of the kernel at the peak,
    timeline, the body's kernels) of one body walked kernel by kernel (see the module's
    docstring); ``bodies`` caches each body's kernels; with ``results_elsewhere`` (a loop's
    or a branch's body) its results go to buffers its caller holds."""
    if id(program) not in bodies:
        bodies[id(program)] = body_kernels(program, walker, sizes,
                                           accumulation_fusion=accumulation_fusion)
    body = bodies[id(program)]
    args = set(body.constvars) | set(body.invars)
    results = {body.base(v) for v in body.outvars} if results_elsewhere else set()
    last = {}
    for k, kernel in enumerate(body.kernels):
        for v in kernel.reads:
            last[body.base(v)] = k
    for v in body.outvars:
        if _is_var(v):
            last[body.base(v)] = len(body.kernels)
    live = {a: var_bytes(a.var) for a in args}
    held = top = given = sum(live.values())            # given: the arguments still held
    own_top, at, timeline, owner = 0, -1, [], {}
    for k, kernel in enumerate(body.kernels):
        for v, nbytes in kernel.writes.items():
            base = owner.get(kernel.in_place.get(v), kernel.in_place.get(v))
            if base in live and last.get(base, -1) <= k and (donate or base not in args):
                owner[v], last[base] = base, max(last[base], last.get(v, -1))
            elif v not in results:                  # updated in place, or a new buffer
                live[v] = nbytes
                held += nbytes
        extra = (_blocks_own(kernel, body, walker, bodies, accumulation_fusion)
                 if kernel.kind == "block" else 0)
        timeline.append(held + extra)
        own_top = max(own_top, held + extra - given)
        if held + extra > top:
            top, at = held + extra, k
        for v in [v for v in live if last.get(v, -1) <= k and (donate or v not in args)]:
            nbytes = live.pop(v)
            held, given = held - nbytes, given - (nbytes if v in args else 0)
    return top, own_top, at, timeline, body


def _blocks_own(kernel, body, walker, bodies, accumulation_fusion) -> int:
    """The most bytes a loop's or a conditional's bodies hold of their own at once."""
    e = kernel.eqns[0]
    sizes = axes_in(e.eqn, body.sizes[id(e)])
    return max((_kernel_liveness(b, walker, sizes, False, bodies, accumulation_fusion, True)[1]
                for b, _ in walker.bodies(e.eqn, sizes)), default=0)


def peak_memory(program, like_jax=False, *, fused=False, donate=False,
                accumulation_fusion=False, while_trips=None, taken=None, device=None,
                walker=None) -> Memory:
    """The liveness walk of ``program`` (a simpmd program, or a jaxpr from
    ``jax.make_jaxpr``): see the module's docstring. ``like_jax=True`` takes on
    ``jax.experimental.roofline``'s definition of ``peak_hbm_bytes``; ``fused=True`` walks
    the kernels XLA would run (``accumulation_fusion``: as the prediction forms them), and
    ``donate=True`` frees each argument after its last use.
    ``while_trips``, ``taken`` and ``device`` say what values decide, as for the roofline
    (:func:`simpmd.cost.walk.walk`); or ``walker``, a walk of it already made."""
    walker = walker or Walker(program, while_trips=while_trips, taken=taken, device=device)
    eqns = walker.live(program).eqns
    if fused:
        peak, _, at, timeline, body = _kernel_liveness(program, walker, walker.sizes, donate,
                                                       {}, accumulation_fusion)
        where = body.kernels[at].name if at >= 0 else ""
    else:
        peak, at, timeline = _liveness(program, like_jax, walker, walker.sizes, donate, top=True)
        where = _describe(eqns[at]) if 0 <= at < len(eqns) else ""
    inner = getattr(program, "jaxpr", program)
    args = [v for v in list(inner.constvars) + list(inner.invars) if _is_var(v)]
    forward = {v for e in eqns if getattr(e, "phase", "forward") == "forward" for v in e.outvars}
    read_back = {v for e in eqns if getattr(e, "phase", "forward") != "forward"
                 for v in e.invars if _is_var(v)}
    alias_of = set()
    for e in reversed(eqns):
        if _same_buffer(e) and e.outvars[0] in read_back:
            read_back.add(e.invars[0])
            alias_of.add(e.outvars[0])
    return Memory(peak=peak, arguments=sum(var_bytes(v) for v in args),
                  residuals=sum(var_bytes(v) for v in forward & read_back if v not in alias_of),
                  at=at, equation=where, timeline=timeline)


def _describe(eqn) -> str:
    outs = " ".join(f"{getattr(v, 'aval', v).str_short()}" for v in eqn.outvars)
    return f"{outs} = {_primitive_name(eqn)}" if outs else _primitive_name(eqn)


def memory(fun, *args, axis_env=None, like_jax=False, while_trips=None) -> Memory:
    """The memory one device needs to run ``fun(*args)``: ``fun`` traced as the roofline
    traces it (a pmapped or shard_mapped function: its body, as each device runs it;
    otherwise inside a map over ``axis_env``; on arrays, what values decide counted on a
    run), and its program walked."""
    program, _, taken = traced(fun, args, axis_env)
    return peak_memory(program, like_jax, while_trips=while_trips, taken=taken)


def flops(program, phase=None, *, while_trips=None, taken=None, device=None) -> int:
    """The FLOPs one device computes running ``program``, from each row's cost column,
    walked as the roofline walks it (a loop's body once per iteration, a while loop's
    ``while_trips`` times on shapes, a cond's costliest branch on shapes), or only those
    of the equations of ``phase`` ('recompute': what a checkpoint computes again in the
    backward pass)."""
    total = 0
    for v in walk(program, while_trips=while_trips, taken=taken, device=device):
        if not v.body and (phase is None or v.phase == phase):
            total += flops_and_bytes(v.eqn, v.row, v.name)[0] * v.times
    return int(total)
