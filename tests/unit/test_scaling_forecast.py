"""Live forecast: pure, cheap, honest about identification."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl_mega.scaling.forecast import LiveForecaster, forecast


def eq1(C, A, B, C_mid, r0):
    C = np.asarray(C, dtype=np.float64)
    return np.where(C > 0, r0 + (A - r0) / (1.0 + (C_mid / np.where(C > 0, C, 1.0)) ** B), r0)


# A tiny CPU run in device-hours: nothing near the paper's GPU-hour scale.
A, B, CM, R0, BUDGET = 0.72, 1.6, 0.25, 0.1, 2.0


def tiny(n, c_max, seed=0, noise=0.005):
    C = np.linspace(0.0, c_max, n)
    return C, eq1(C, A, B, CM, R0) + np.random.default_rng(seed).normal(0.0, noise, n)


def test_forecast_after_cmid_identifies_and_predicts_budget():
    C, R = tiny(60, 1.25)  # 5 x C_mid
    f = forecast(C, R, budget=BUDGET)
    assert f.ok and f.identified, f.reason
    assert abs(f.A - A) <= 0.02
    assert abs(f.C_mid - CM) <= 0.1 * CM
    expect = eq1([BUDGET], A, B, CM, R0)[0]
    assert abs(f.predicted_reward_at_budget - expect) <= 0.02
    # The forecast's prediction is Eq. 1 at the budget with its own parameters.
    assert f.predicted_reward_at_budget == pytest.approx(eq1([BUDGET], f.A, f.B, f.C_mid, f.R0)[0])


def test_forecast_before_cmid_is_not_identified():
    C, R = tiny(20, 0.8 * CM)
    f = forecast(C, R, budget=BUDGET)
    assert f.ok and not f.identified and f.reason


def test_forecast_with_too_few_points_does_not_raise():
    f = forecast([0.0, 0.1, 0.2], [0.1, 0.2, 0.25], budget=BUDGET)
    assert not f.ok and "need at least 4" in f.reason
    g = forecast([0.0, 0.1, 0.2, 0.3, 0.4], [0.1, 0.2, 0.25, 0.3, 0.3], budget=-1.0)
    assert not g.ok and "budget" in g.reason


def test_live_forecaster_refits_every_n_points():
    C, R = tiny(30, 1.25)
    lf = LiveForecaster(budget=BUDGET, every=10)
    outs = [lf.add(c, r) for c, r in zip(C, R)]
    made = [k for k, o in enumerate(outs) if o is not None]
    assert made == [9, 19, 29]
    assert lf.latest is outs[29] and lf.latest.n_points == 30
    with pytest.raises(ValueError, match="backwards"):
        lf.add(0.5, 0.3)


def test_forecast_cut_gpu_hours_and_small_runs():
    """The cut (scaling.identify.fit_cut): the paper's 1.5k on a GPU-hour axis that reaches it, else 0.1 x the
    compute so far; on a GPU-hour run below 1.5k the relative rule applies."""
    C = np.linspace(0.0, 12000.0, 49)
    R = eq1(C, 0.61, 1.92, 2542.0, 0.3) + np.random.default_rng(0).normal(0.0, 0.004, C.size)
    f = forecast(C, R, budget=24000.0, gpu_hours=True, n_samples=16000)
    assert f.ok and f.fit_from == 1500.0 and f.assessment.n_points == int(np.sum(C >= 1500.0))
    small = forecast(C / 100.0, R, budget=240.0, gpu_hours=True)
    assert small.fit_from == pytest.approx(12.0)  # 0.1 x 120 GPU-hours
    fixed = forecast(C, R, budget=24000.0, fit_from=3000.0)
    assert fixed.fit_from == 3000.0 and fixed.assessment.n_points == int(np.sum(C >= 3000.0))


def test_the_live_forecast_carries_the_band_at_the_budget_and_twice_it_identified_or_not():
    """Every fitted forecast has the expected reward with a 95% band at the budget and at
    2 x the budget (rows in its metrics line), also when A is not identified; the band holds Eq. 1's truth."""
    from scalerl_mega.scaling.forecast import plain_line

    for n, c_max, identified in ((60, 1.25, True), (20, 0.8 * CM, False)):
        C, R = tiny(n, c_max)
        f = forecast(C, R, budget=BUDGET)  # Gaussian noise of 0.005: the residual variance stands for it
        assert f.ok and f.identified is identified, f.reason
        rows = f.summary()["forecast"]
        assert [r["compute"] for r in rows] == [BUDGET, 2 * BUDGET]
        truth = eq1([BUDGET, 2 * BUDGET], A, B, CM, R0)
        for r, t in zip(rows, truth):
            assert r["lo"] <= r["reward"] <= r["hi"] and r["lo"] <= t <= r["hi"], (identified, r, t)
        line = plain_line(f, unit="device-hours")
        assert f"{rows[0]['reward']:.3f} (95% band {rows[0]['lo']:.3f}-{rows[0]['hi']:.3f})" in line
        assert f"with twice that compute {rows[1]['reward']:.3f}" in line
        assert ("ceiling A = " in line) is identified and ("run longer" in line) is (not identified)
    assert f.summary()["A"] is None and f.summary()["predicted_reward_at_budget"] is None  # the rule still holds
    none = forecast([0.0, 0.1, 0.2], [0.1, 0.2, 0.25], budget=BUDGET)
    assert plain_line(none, unit="device-hours") == f"forecast: none yet ({none.reason})"


def test_the_runs_own_budget_is_its_planned_end():
    """forecast.budget=0: the budget is the compute at train.steps, extrapolated from the compute per step so far
    (2 x the compute so far where the step is unknown)."""
    from types import SimpleNamespace

    from scalerl_mega.train import AutoBudgetForecaster

    fc = AutoBudgetForecaster(SimpleNamespace(budget=0.0, min_points=2, fit_from=0.0, cut_fraction=0.1),
                              total_steps=400)
    fc.add(0.0, 0.1, 1600, step=0)
    fc.add(0.05, 0.3, 1600, step=20)
    assert fc.live.budget == pytest.approx(0.05 * 400 / 20)
    fc.add(0.11, 0.4, 1600, step=40)
    assert fc.live.budget == pytest.approx(0.11 * 400 / 40)
    fc.add(0.2, 0.45, 1600)
    assert fc.live.budget == pytest.approx(0.4) and fc.unit == "device-hours"
    fixed = AutoBudgetForecaster(SimpleNamespace(budget=3.0, min_points=2, fit_from=0.0, cut_fraction=0.1),
                                 total_steps=400, gpu_hours=True)
    fixed.add(0.0, 0.1, step=0)
    fixed.add(0.05, 0.3, step=20)
    assert fixed.live.budget == 3.0 and fixed.unit == "GPU-hours"


def test_the_readme_says_when_the_first_live_forecast_appears():
    """README: the demo prints a forecast "at every validation from the Nth on (`forecast.min_points`)". The live
    forecaster (train.AutoBudgetForecaster) fed the committed demo run's validation points with the demo's
    forecast.min_points answers None before the Nth point and a forecast at the Nth and every later one."""
    import json
    import re
    from pathlib import Path

    import yaml

    from scalerl_mega.config.run import ForecastConfig
    from scalerl_mega.train import AutoBudgetForecaster

    root = Path(__file__).resolve().parents[2]
    m = re.search(r"at every\s+validation from the (\d+)(?:st|nd|rd|th) on \(`forecast\.min_points`",
                  (root / "README.md").read_text())
    assert m, "README no longer says when the first forecast appears"
    first = int(m.group(1))
    demo = yaml.safe_load((root / "conf" / "experiment" / "demo.yaml").read_text())
    assert demo["forecast"]["min_points"] == first
    import lzma

    with lzma.open(root / "tests" / "fixtures" / "demo_run" / "metrics.jsonl.xz", "rt") as fh:
        points = [json.loads(line) for line in fh]
    points = [p for p in points if p["kind"] == "validation"][:first + 2]  # before, at and after the first
    live = AutoBudgetForecaster(ForecastConfig(min_points=first), total_steps=80)
    outs = [live.add(p["compute_device_hours"], p["val_pass_rate"], p["val_prompts"] * p["val_samples_per_prompt"],
                     step=p["step"]) for p in points]
    assert [o is not None for o in outs] == [k + 1 >= first for k in range(len(points))]
    assert all(o.ok for o in outs[first - 1:])
