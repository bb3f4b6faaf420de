"""A trace as text: the merged table ``print(trace)`` shows, one program's table, and the
HTML table Jupyter shows. Read from the trace's records; nothing here computes."""
from __future__ import annotations

import html

import numpy as np



def needs_values(trace, what: str):
    """Refuse to draw values from a run that had none (one run on ShapeDtypeStructs)."""
    events = trace if isinstance(trace, (list, tuple)) else None
    shapes_only = getattr(trace, "shapes_only", False) or (
        events is not None and any(e.kind == "collective" and not e.inputs and e.in_avals
                                   for e in events))
    if shapes_only:
        raise ValueError(
            f"{what} draws the values each device holds, and this trace has none: its run "
            f"was on shapes alone (ShapeDtypeStructs), which logs types and bytes only. Run "
            f"the program on arrays (at a small size) to see values, or read this trace "
            f"with what needs only shapes: print(trace), simpmd.cost.estimate_trace(trace), "
            f"simpmd.viz.draw_timeline(trace).")


def summarize(value, limit: int = 6) -> str:
    """A short, deterministic description of an array for a log line."""
    if not hasattr(value, "__array__") and hasattr(value, "shape"):      # types only
        return f"{np.dtype(value.dtype)}{list(value.shape)}"
    a = np.asarray(value)
    if a.size == 0:
        return f"{a.dtype}{list(a.shape)} (empty)"
    if a.size <= limit:
        flat = np.array2string(a.ravel(), separator=" ", precision=4, suppress_small=True,
                               max_line_width=200)
        return flat if a.ndim <= 1 else f"{flat} as {list(a.shape)}"
    if np.issubdtype(a.dtype, np.number):
        return (f"{a.dtype}{list(a.shape)} min {_num(a.min())} max {_num(a.max())} "
                f"mean {_num(a.mean())}")
    return f"{a.dtype}{list(a.shape)}"


def _num(x) -> str:
    return np.format_float_positional(float(x), precision=4, trim="-")


def _leaves_summary(values) -> str:
    return "; ".join(summarize(v) for v in values)


def nbytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def _params_text(e) -> str:
    keep = {k: v for k, v in e.params.items() if v is not False and v is not None
            and k != "inserted"}
    return ", ".join(f"{k}={v}" for k, v in keep.items())


def _row(e) -> dict:
    """The columns a log line shows, as text."""
    if e.kind == "receive":
        what, moved = "receive " + e.detail, summarize((e.inputs or e.in_avals)[0])
        group = sent = recv = ""
    elif e.kind == "return":
        what, moved = "return " + e.detail, summarize((e.outputs or e.out_avals)[0])
        group = sent = recv = ""
    elif e.kind in ("error", "print"):
        what, moved, group, sent, recv = e.kind, e.detail, "", "", ""
    else:
        axes = e.axes[0] if len(e.axes) == 1 else e.axes
        params = _params_text(e)
        what = f"{e.op}({axes!r}{', ' + params if params else ''})"
        if e.params.get("inserted"):             # a collective jit inserted, and for what
            what = f"{e.op}({axes!r}) inserted by {e.params['inserted']}"
        if e.phase in ("backward", "recompute"):       # recompute: a checkpoint's, done again
            what = f"{e.phase} {what}"
        if getattr(e, "iteration", ()):                 # in a loop: which iteration
            what = f"[iteration {', '.join(map(str, e.iteration))}] {what}"
        moved = (f"{_leaves_summary(e.inputs or e.in_avals)} -> "
                 f"{_leaves_summary(e.outputs or e.out_avals)}")
        group = _group_text(e.group)
        sent, recv = nbytes_text(e.bytes_sent), nbytes_text(e.bytes_received)
    return {"step": str(e.step), "program": e.program, "what": what, "group": group,
            "values": moved, "sent": sent, "recv": recv, "source": e.source}


def _group_text(group) -> str:
    ids = list(group)
    if len(ids) > 2 and all(isinstance(i, int) for i in ids) and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}-{ids[-1]}"
    if len(ids) > 8:
        return ",".join(map(str, ids[:6])) + f",... ({len(ids)})"
    return ",".join(map(str, ids))


COLUMNS = ("step", "program", "what", "group", "values", "sent", "recv", "source")


def _table(rows, columns=COLUMNS, max_width: int = 60) -> str:
    def clip(s):
        return s if len(s) <= max_width else s[:max_width - 3] + "..."
    cells = [[clip(r[c]) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in cells]
    return "\n".join(lines)


def header(trace) -> str:
    summary = trace._columnar()
    if summary:
        ncoll, sent = summary["collective_groups"], summary["bytes_sent"]
    else:
        ncoll = len(trace.collectives())
        sent = sum(e.bytes_sent for e in trace.events)
    head = (f"Trace: {len(trace.programs)} program(s), {ncoll} collective group(s), "
            f"{nbytes_text(sent)} sent in all")
    if getattr(trace, "shapes_only", False):
        head += ("\nSHAPES ONLY: run on ShapeDtypeStructs, so the log holds types and bytes, "
                 "not values.")
        if getattr(trace, "unlogged", None):
            head += ("\nNOT LOGGED: the collectives inside " + " and ".join(trace.unlogged)
                     + ".")
    if trace.eager:
        head += ("\nEAGER RUN: Python control flow on values was allowed; real JAX cannot "
                 "run this program.")
    return head


def table(trace, program=None) -> str:
    """Text table of one program's log (``program='device 3'``) or of all, merged."""
    if program is None:
        events, total = trace.head(trace.max_rows), len(trace)
    else:
        events = trace.for_program(program)
        total = len(events)
    rows = [_row(e) for e in events[:trace.max_rows]]
    cut = ""
    if total > trace.max_rows:
        cut = (f"\n... {total - trace.max_rows} more event(s); see trace.events or "
               f"trace.device(i)")
    columns = COLUMNS if program is None else COLUMNS[:1] + COLUMNS[2:]
    return _table(rows, columns) + cut


def text(trace) -> str:
    notes = "".join(f"Note: {n}\n" for n in getattr(trace, "notes", ()))
    return header(trace) + "\n" + notes + table(trace)


def html_table(trace) -> str:
    rows = [_row(e) for e in trace.head(trace.max_rows)]
    head = "".join(f"<th>{c}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(r[c])}</td>" for c in COLUMNS) + "</tr>"
                   for r in rows)
    more = len(trace) - len(rows)
    note = f"<p>... {more} more event(s)</p>" if more > 0 else ""
    notes = "".join(f"<p>Note: {html.escape(n)}</p>" for n in getattr(trace, "notes", ()))
    return (f"<div><pre>{html.escape(header(trace))}</pre>{notes}"
            f"<table style='font-family:monospace;font-size:90%'><thead><tr>{head}</tr></thead>"
            f"<tbody>{body}</tbody></table>{note}</div>")


