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


def _scored(reason, *, pid, idx):
    from scalerl_mega.types import Completion, FinishReason, ScoredCompletion

    comp = Completion(prompt_id=pid, sample_index=idx, prompt_ids=[1], output_ids=[2, 3], gen_logprobs=[-0.5] * 2,
                      weight_versions=[0, 0], finish_reason=FinishReason.STOP, submitted_version=0)
    return ScoredCompletion(completion=comp, reward=-1.0, passed=False, reason=reason)


def test_report_says_how_many_reward_calls_failed(tmp_path):
    """The loop's own metrics (`inflight.reward_error_metrics`) of 3 steps: step 1 clean, step 2 with 2 failures
    (a ValueError, then a dead worker), step 3 with 1; report.md counts 3 of 12 in 2 steps and quotes step 2's
    first error line. A run without failures says nothing about them."""
    from scalerl_mega.inflight import reward_error_metrics
    from scalerl_mega.metrics.rollout_stats import rollout_metrics
    from scalerl_mega.rewards.result import WORKER_DIED
    from scalerl_mega.types import Group, Prompt

    def raising():
        raise ValueError("no boxed answer in 'x = 3'")

    try:
        raising()
    except ValueError as e:
        from scalerl_mega.rewards.result import error_result
        reason = error_result(e).reason
    line = raising.__code__.co_firstlineno + 1
    steps = {1: ["", "", "", ""], 2: ["", reason, f"{WORKER_DIED}: exit -9", ""], 3: [reason, "", "", ""]}
    with MetricsWriter(tmp_path) as w, MetricsWriter(tmp_path / "clean") as clean:
        for step, reasons in steps.items():
            groups = [Group(prompt=Prompt(prompt_id=f"p{k}", text="q", task="synthetic", gold="1"),
                            samples=[_scored(r, pid=f"p{k}", idx=i) for i, r in enumerate(reasons[2 * k:2 * k + 2])])
                      for k in range(2)]
            w.write("train", step, {**rollout_metrics(groups, step=step), **reward_error_metrics(groups)})
            clean.write("train", step, {**rollout_metrics(groups, step=step), "reward/errors": 0.0})
    md = write_report(tmp_path, title="t").read_text()
    expected = (f"- reward calls that failed: 3 of 12 scored samples in 2 step(s); first error (step 2): ValueError "
                f"at test_metrics_report.py:{line}: no boxed answer in 'x = 3' (each error's first traceback is in "
                "the run's log; they scored as incorrect)")
    assert expected in md.splitlines()
    assert "reward calls" not in write_report(tmp_path / "clean", title="t").read_text()
