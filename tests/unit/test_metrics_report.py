"""report.py: markdown + PNG from a metrics.jsonl whose validation points follow a known sigmoid."""

from __future__ import annotations

import math

import pytest

from scalerl_mega.metrics.writer import MetricsWriter
from scalerl_mega.report import compute_key, write_report


def _sigmoid(c, *, A, B, C_mid, R0):
    return R0 + (A - R0) / (1 + (C_mid / c) ** B)


def test_report_fits_known_curve(tmp_path):
    A, B, C_mid, R0 = 0.7, 1.5, 0.02, 0.2
    with MetricsWriter(tmp_path) as w:
        w.write("validation", 0, {"val_pass_rate": R0, "compute_gpu_hours": 0.0, "compute_device_hours": 0.0})
        for i in range(1, 13):
            c = 0.005 * i
            w.write("train", i, {"truncation_rate": 0.01, "compute_gpu_hours": 0.0, "compute_device_hours": c})
            w.write("validation", i, {"val_pass_rate": _sigmoid(c, A=A, B=B, C_mid=C_mid, R0=R0),
                                      "compute_gpu_hours": 0.0, "compute_device_hours": c})
    md = write_report(tmp_path, title="t").read_text()
    assert (tmp_path / "scaling.png").stat().st_size > 1000
    assert "first validation (step 0): pass rate 0.200" in md
    row = [line for line in md.splitlines() if line.startswith("| 0.")][0].split("|")
    assert float(row[1]) == pytest.approx(A, abs=0.02)
    lo, hi = (float(v) for v in row[2].split(".."))
    assert lo <= A <= hi and hi - lo <= 0.04  # noise-free: the interval is tight and holds the truth
    assert float(row[3]) == pytest.approx(B, rel=0.15)
    assert "device-hours" in md
    # the cut: 0.1 x the final compute 0.06 (identify.CUT_FRACTION), 11 of the 12 points with compute > 0
    assert "| 0.006 device-hours | 11 | True |" in md and f"The rule's words: A = {float(row[1]):.3f} (95% interval" in md
    # the expected pass rate at the run's budget (its last compute, 0.06) and at twice it, with bands that hold
    # the true curve there (noise-free points: tight bands, widened beyond the data only by the least misfit of
    # Eq. 1 the band assumes, 1.96 x band.KAPPA_FLOOR x log(C / 0.06) on each side)
    from scalerl_mega.scaling.band import KAPPA_FLOOR

    for name, c in (("this run's budget", 0.06), ("twice the budget", 0.12)):
        cells = next(line for line in md.splitlines() if line.startswith(f"| {name} |")).split("|")
        assert float(cells[2].split()[0]) == pytest.approx(c, rel=1e-3)
        lo, hi = (float(v) for v in cells[4].split(".."))
        truth = _sigmoid(c, A=A, B=B, C_mid=C_mid, R0=R0)
        floor = 2 * 1.959964 * KAPPA_FLOOR * math.log(c / 0.06)
        assert lo - 1e-3 <= truth <= hi + 1e-3 and hi - lo < 0.03 + floor, (name, lo, hi, truth)
    assert "**Verdict**: the pass rate went from 0.200 to " in md and "ceiling A = 0.70" in md


def test_report_without_enough_points(tmp_path):
    with MetricsWriter(tmp_path) as w:
        w.write("validation", 0, {"val_pass_rate": 0.1, "compute_gpu_hours": 0.0, "compute_device_hours": 0.0})
    md = write_report(tmp_path).read_text()
    assert "No fit" in md and not (tmp_path / "scaling.png").exists()


def test_compute_key_prefers_gpu_hours():
    assert compute_key([{"compute_gpu_hours": 1.0}]) == "compute_gpu_hours"
    assert compute_key([{"compute_gpu_hours": 0.0}]) == "compute_device_hours"
