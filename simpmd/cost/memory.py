"""Memory per device, read off the program: a liveness walk.

At any point of a step a device holds every value that has been computed and will still
be read, and the step's arguments (parameters, optimizer state, its shard of the batch),
which the caller keeps. Walking a program's equations in order, adding each result when it
is computed and dropping each value after its last use, gives the bytes live at every
equation; the largest is the memory the device needs. In a gradient step the values that
stay live longest are the forward pass's *residuals*, read again by the backward pass
(activations, mostly: a scan stacks one set per iteration); ``simpmd.checkpoint`` keeps
fewer of them and computes the rest again. The program is the one a device runs (the body
of a ``pmap`` or ``shard_map``), so every shape is one device's.

``jax.experimental.roofline`` reports a ``peak_hbm_bytes`` from a walk of the same kind,
with four differences, which :func:`peak_memory` can take on (``like_jax=True``) to
reproduce its number:

* it frees an argument after its last use, as if the caller had donated it; here the
  arguments stay live for the whole step (a training step without donation keeps the
  old parameters until it returns);
* it counts an equation's bytes after the equation has freed its dead inputs; here an
  equation's inputs and results are live together while it runs;
* it walks a nested program (a scan's body, a checkpoint, a jit) on its own, as if nothing
  outside it were live, and a result nothing reads is never freed; here a body's own
  values come on top of what is live around it, and an unread result is dropped at once;
* it counts the result of ``pvary`` (a value's type made varying, under
  ``shard_map(check_vma=True)``) as new bytes; here it is the same buffer, as on hardware.

Neither is what XLA allocates: XLA fuses elementwise chains (their intermediates never
reach memory), updates buffers in place, and may recompute or offload on its own. And
simpmd's backward pass keeps the values its derivative rules read (the input of ``sin``),
where JAX keeps what its linearization computed (``cos`` of it): different values, of the
same size.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

__all__ = ["Memory", "peak_memory", "memory", "flops"]

BODIES = ("jaxpr", "call_jaxpr", "cond_jaxpr", "body_jaxpr", "branches")
ALIASES = ("pvary", "name")       # a new type, or a name, for the same bytes: no copy


def _nbytes(v) -> int:
    aval = getattr(v, "aval", v)
    try:
        width = np.dtype(aval.dtype).itemsize
    except TypeError:                          # e.g. a PRNG key type
        width = getattr(aval.dtype, "itemsize", 0)
    return int(np.prod(aval.shape, dtype=np.int64)) * int(width)


def _is_var(v) -> bool:
    return not hasattr(v, "val") and not hasattr(v, "value")


def _bodies(eqn) -> list:
    found = []
    for key in BODIES:
        value = eqn.params.get(key)
        for p in (value if isinstance(value, tuple) else (value,)):
            inner = getattr(p, "jaxpr", p)
            if hasattr(inner, "eqns"):
                found.append(inner)
    return found


def _name(eqn) -> str:
    prim = eqn.primitive
    return prim if isinstance(prim, str) else prim.name


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


def _live_equations(program) -> list:
    """The equations whose results are read (dead code removed, as jax's roofline does)."""
    used, kept = {v for v in program.outvars if _is_var(v)}, []
    for e in reversed(list(program.eqns)):
        if not e.outvars or any(v in used for v in e.outvars):
            kept.append(e)
            used.update(v for v in e.invars if _is_var(v))
    return kept[::-1]


def _walk(program, like_jax, depth=0):
    """(peak, at, live Vars at the peak, timeline) of one program."""
    inner_prog = getattr(program, "jaxpr", program)
    eqns = _live_equations(inner_prog) if like_jax else list(inner_prog.eqns)
    args = [v for v in list(inner_prog.constvars) + list(inner_prog.invars) if _is_var(v)]
    last = {}
    for k, e in enumerate(eqns):
        for v in e.invars:
            if _is_var(v):
                last[v] = k
    for v in inner_prog.outvars:
        if _is_var(v):
            last[v] = len(eqns)
    alias = set()
    for e in reversed(eqns if not like_jax else []):     # an alias keeps its source alive
        if _name(e) in ALIASES and _is_var(e.invars[0]):
            alias.update(e.outvars)
            last[e.invars[0]] = max(last.get(e.invars[0], -1), last.get(e.outvars[0], -1))
    live = {v: _nbytes(v) for v in args}
    peak, at, at_live, timeline = sum(live.values()), -1, dict(live), []
    for k, e in enumerate(eqns):
        for v in e.outvars:
            live[v] = 0 if v in alias else _nbytes(v)
        extra = 0
        for body in _bodies(e):
            p, _, _, _ = _walk(body, like_jax, depth + 1)
            if like_jax:                      # a nested program on its own
                if p > peak:
                    peak, at, at_live = p, k, {}
            else:                             # its own values, on top of what is live here
                body_args = getattr(body, "jaxpr", body)
                extra = max(extra, p - sum(_nbytes(v) for v in list(body_args.invars)
                                           + list(body_args.constvars) if _is_var(v)))
        if not like_jax:
            total = sum(live.values()) + extra
            timeline.append(total)
            if total > peak:
                peak, at, at_live = total, k, dict(live)
        for v in e.invars:
            if _is_var(v) and last.get(v) == k and (like_jax or v not in args):
                live.pop(v, None)
        if not like_jax:
            for v in e.outvars:
                if v not in last:             # nothing reads it
                    live.pop(v, None)
        else:
            total = sum(live.values())
            timeline.append(total)
            if total > peak:
                peak, at, at_live = total, k, dict(live)
    return peak, at, at_live, timeline


def _jax_dead_code_removed(program):
    """A jaxpr of real JAX without the equations nothing needs, loops' bodies included, by
    JAX's own rules, as ``roofline`` removes them before its walk."""
    inner = getattr(program, "jaxpr", program)
    if not type(inner).__module__.startswith("jax"):
        return program
    from jax._src.interpreters.partial_eval import dce_jaxpr
    return dce_jaxpr(inner, [True] * len(inner.outvars))[0]


def peak_memory(program, like_jax=False) -> Memory:
    """The liveness walk of ``program`` (a simpmd program, or a jaxpr from
    ``jax.make_jaxpr``): see the module's docstring. ``like_jax=True`` takes on
    ``jax.experimental.roofline``'s definition of ``peak_hbm_bytes`` (for a jaxpr of real
    JAX, after JAX's own dead-code removal; for simpmd's program, after removing the
    equations whose results nothing reads, loop bodies left whole)."""
    program = _jax_dead_code_removed(program) if like_jax else program
    inner = getattr(program, "jaxpr", program)
    peak, at, live, timeline = _walk(program, like_jax)
    args = [v for v in list(inner.constvars) + list(inner.invars) if _is_var(v)]
    eqns = list(inner.eqns)
    forward = {v for e in eqns if getattr(e, "phase", "forward") == "forward" for v in e.outvars}
    read_back = {v for e in eqns if getattr(e, "phase", "forward") != "forward"
                 for v in e.invars if _is_var(v)}
    alias_of = set()
    for e in reversed(eqns):
        if _name(e) in ALIASES and e.outvars[0] in read_back:
            read_back.add(e.invars[0])
            alias_of.add(e.outvars[0])
    return Memory(peak=peak, arguments=sum(_nbytes(v) for v in args),
                  residuals=sum(_nbytes(v) for v in forward & read_back if v not in alias_of),
                  at=at, equation=_describe(eqns[at]) if 0 <= at < len(eqns) else "",
                  timeline=timeline)


def _describe(eqn) -> str:
    outs = " ".join(f"{getattr(v, 'aval', v).str_short()}" for v in eqn.outvars)
    return f"{outs} = {_name(eqn)}" if outs else _name(eqn)


def memory(fun, *args, axis_env=None, like_jax=False) -> Memory:
    """The memory one device needs to run ``fun(*args)``: ``fun`` is traced with
    ``simpmd.make_jaxpr`` (a pmapped or shard_mapped function: its body, as each device
    runs it; otherwise inside a map over ``axis_env``), and its program walked."""
    from ..api.jaxpr import make_jaxpr
    program = make_jaxpr(fun, axis_env=axis_env)(*args)
    return peak_memory(program, like_jax)


def flops(program, phase=None) -> int:
    """The FLOPs one device computes running ``program``, from each row's cost column (a
    scan's body counted once per iteration; a while loop's body once, since its number of
    iterations is not in the program), or only those of the equations of ``phase``
    ('recompute': what a checkpoint computes again in the backward pass)."""
    total = 0
    for eqn in getattr(program, "jaxpr", program).eqns:
        bodies = _bodies(eqn)
        if bodies:
            times = eqn.params.get("length", 1)
            total += times * max(flops(b, phase) for b in bodies) if eqn.params.get(
                "branches") else times * sum(flops(b, phase) for b in bodies)
        elif phase is None or eqn.phase == phase:
            cost = getattr(eqn.primitive, "cost", None)
            if cost is not None:
                total += cost([v.aval for v in eqn.invars], [v.aval for v in eqn.outvars],
                              **eqn.params)[0]
    return int(total)
