"""plan.serve against the published serving runs (simpmd.plan.runs.serving).

    python scripts/serving_table.py                  # the development half
    python scripts/serving_table.py --held-out       # both halves (the headline)
    python scripts/serving_table.py --write-spreads  # simpmd/plan/serve_spreads.py, from
                                                     # the development half only
    python scripts/serving_table.py --markdown       # both halves as docs/validation.md's rows
"""
from __future__ import annotations

import math
import pathlib
import sys
import time

from simpmd.plan.runs import serving as S


def predict(run):
    return run.serve()


def rows(runs):
    out = []
    for run in runs:
        e = predict(run)
        out.append((run, e, run.predicted_s(e) / run.measured_s))
    return out


def spread(ratios):
    logs = [math.log(r) for r in ratios]
    n = len(logs)
    mean = sum(logs) / n if n else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / (n - 1)) if n > 1 else 0.0
    return (n, round(mean, 4), round(sd, 4))


def spreads(table):
    return {"ttft": spread([r for run, _, r in table if run.metric == "ttft"]),
            "decode": spread([r for run, _, r in table if run.metric == "throughput"])}


def show(table, label):
    print(f"\n{label}")
    for run, e, r in table:
        ok = "ok" if 0.8 <= r <= 1.25 else "MISS"
        print(f"  {run.name:52s} measured {run.measured_s * 1e3:9.1f} ms predicted "
              f"{run.predicted_s(e) * 1e3:9.1f} ms  x{r:.2f} {ok}  "
              f"(ttft {e.ttft_s * 1e3:.1f} ms, tpot {e.tpot_s * 1e3:.2f} ms)")
    inside = sum(0.8 <= r <= 1.25 for _, _, r in table)
    print(f"  {inside} of {len(table)} within 0.8-1.25x")


def inside(run, e) -> bool:
    """Whether the measured seconds lie in the estimate's interval (for a static batch's
    whole time, the decode interval's factors applied to it)."""
    if run.metric == "ttft":
        low, high = e.ttft_interval_s
    else:
        low, high = (e.total_s * f / e.tpot_s for f in e.interval_s)
    return low <= run.measured_s <= high


def markdown(table, half):
    for run, e, r in table:
        what = "first token" if run.metric == "ttft" else "batch time"
        printed = (f"{run.measured * 1e3:g} ms" if run.metric == "ttft"
                   else f"{run.measured:,.0f} tok/s/GPU")
        verdict = "in band" if 0.8 <= r <= 1.25 else "**miss**"
        print(f"| {half} | {run.model.name} | {run.hardware} x{run.tp} | {run.precision}, "
              f"cache {run.kv_dtype} | {run.batch} | {run.prompt_len}/{run.gen_len} | "
              f"{run.table} | {printed} | {what} {run.measured_s:.4g} s | "
              f"{run.predicted_s(e):.4g} s | {r:.2f} | {verdict} | "
              f"{'yes' if inside(run, e) else 'no'} |")


if __name__ == "__main__":
    if "--markdown" in sys.argv:
        markdown(rows(S.development()), "development")
        markdown(rows(S.held_out()), "held-out")
        sys.exit()
    t = time.time()
    dev = rows(S.development())
    show(dev, "development")
    if "--write-spreads" in sys.argv:
        path = pathlib.Path(__file__).resolve().parents[1] / "simpmd/plan/serve_spreads.py"
        text = path.read_text()
        head = text[:text.index("SPREADS = ")]
        path.write_text(head + f"SPREADS = {spreads(dev)!r}\n")
        print("wrote", path, spreads(dev))
    if "--held-out" in sys.argv:
        show(rows(S.held_out()), "held-out")
    print(f"{time.time() - t:.1f} s")
