"""Which collectives of a run cross hosts: each group's devices and the processes that
drive them.

A collective among devices of one host travels over that host's fast links (ICI between
the chips of a TPU host, NVLink inside a GPU node); one whose group spans hosts also
travels over the slower network between them (ICI across a TPU slice's hosts, or the data
centre network between slices; InfiniBand or Ethernet between GPU nodes). A mesh is laid
out so that the axes whose collectives are frequent and large stay within a host.
"""
from __future__ import annotations

from ..core.errors import id_ranges
from ..machine import devices as machine


def _process_of(device_id: int) -> int:
    return machine.platform().devices[device_id].process_index


def collective_calls(trace) -> list:
    """One row per collective call of ``trace``: its op, axes, groups (device ids) and,
    per group, the processes its devices belong to."""
    rows = []
    for events in trace.calls():
        groups = list(dict.fromkeys(tuple(e.group) for e in events))
        hosts = [sorted({_process_of(d) for d in g}) for g in groups]
        first = events[0]
        rows.append({"op": first.op, "axes": tuple(first.axes), "groups": groups,
                     "hosts": hosts, "crosses": any(len(h) > 1 for h in hosts),
                     "source": getattr(first, "source", "")})
    return rows


def _group_text(row) -> str:
    groups, hosts = row["groups"], row["hosts"]
    size, spans = len(groups[0]), {len(h) for h in hosts}
    if len(groups) == 1:
        where = (f"across processes {id_ranges(hosts[0])}" if row["crosses"]
                 else f"within process {hosts[0][0]}")
        return f"1 group of {size} devices, {where}"
    if spans == {1}:
        where = "each within one process"
    elif len(spans) == 1:
        where = f"each across {spans.pop()} processes"
    else:
        where = f"across {min(spans)} to {max(spans)} processes each"
    return f"{len(groups)} groups of {size} devices, {where}"


def calls_text(trace) -> str:
    """'psum over 'x' (1 group of 8 devices, across processes 0-3)': every collective call."""
    parts = [f"{r['op']} over {', '.join(map(repr, r['axes']))} ({_group_text(r)})"
             for r in collective_calls(trace)]
    return "; ".join(parts) if parts else "none"


def hosts_table(trace) -> str:
    """A table of a run's collective calls: which devices meet in each group, the hosts
    they are on, and whether the call crosses hosts (its data then leaves the host)."""
    rows = [("collective", "axes", "groups (devices)", "hosts of each group", "crosses hosts")]
    for r in collective_calls(trace):
        rows.append((r["op"], ",".join(r["axes"]),
                     " ".join("{" + id_ranges(g) + "}" for g in r["groups"]),
                     " ".join("{" + id_ranges(h) + "}" for h in r["hosts"]),
                     "yes" if r["crosses"] else "no"))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
