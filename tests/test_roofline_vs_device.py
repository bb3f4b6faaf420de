"""benchmarks/roofline_vs_device.py runs on a CPU: with no preset named it measures one of
this CPU (simpmd.jax.device_programs.measure_cpu) and predicts with it; with a preset named
it prints predicted, measured, ratio and the geometric mean. Times are never asserted
(they depend on the machine)."""
import pathlib

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture
def bench(monkeypatch, jax8):
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    import roofline_vs_device
    return roofline_vs_device


def test_on_a_cpu_it_measures_a_preset_and_predicts_with_it(bench):
    lines = []
    rows = bench.run(64, 1, only="RMSNorm", out=lines.append)
    text = "\n".join(lines)
    assert "measured on this machine's CPU" in text and "this CPU, measured" in text
    # at a 64th of every dimension each row says what ran: x[256, 128] bf16, w[128] f32
    assert [r.name for r in rows] == ["RMSNorm 16384x8192 bf16 [ran bf16[256,128] f32[128]: 64.5 KiB]",
                                      "gradient: RMSNorm [ran bf16[256,128] f32[128]: 64.5 KiB]"]
    assert rows[0].measured_s > 0 and rows[0].predicted_s > 0


def test_with_a_preset_it_prints_ratios_and_the_geometric_mean(bench):
    lines = []
    rows = bench.run(64, 1, only="matmul 8192", preset="H100", out=lines.append)
    text = "\n".join(lines)
    assert {r.name.split(" [ran")[0] for r in rows} >= {"bf16 matmul 8192^3",
                                                       "f32 matmul 8192^3 (HIGHEST)"}
    assert all(r.name.endswith("MiB]") or r.name.endswith("KiB]") for r in rows)
    assert all(r.predicted_s > 0 and r.ratio > 0 for r in rows)
    assert "preset: H100" in text and "ratio" in text
    # programs under 50 us are reported as launch-bound and left out of the mean
    assert ("geometric mean" in text) == any(r.judged for r in rows)
    assert all(("launch-bound" in line) for line in lines
               if any(r.name in line and not r.judged for r in rows))
