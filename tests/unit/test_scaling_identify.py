"""scaling/identify.py: the one identification rule, calibrated on synthetic Eq. 1 curves with binomial
noise of known A, and the live forecast, `scalerl-fit` and report.md pinned to the same answer.

Calibration (float64, seeded): for every shape, replicates of binomial validation noise around a known curve;
the 95% interval must cover the true A in >= 90% of replicates and "identified with |A_hat - A| > 0.02" must
happen in <= 5%. The default suite runs a few replicates per shape; `-m slow` runs 200 per shape.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from scalerl_mega.scaling.fit import profile_factor
from scalerl_mega.scaling.identify import MAX_A_WIDTH, MIN_POINTS, assess, holdout_check, options_for


def eq1(C, *, A, B, C_mid, R0):
    """Eq. 1 (paper Sec. 2.1), written out independently of scaling.fit."""
    C = np.asarray(C, dtype=np.float64)
    with np.errstate(over="ignore"):  # far-off (B, C_mid) tried by the optimiser: (C_mid / C)^B -> inf, R -> R0
        return np.where(C > 0, R0 + (A - R0) / (1.0 + (C_mid / np.where(C > 0, C, 1.0)) ** B), R0)


# name -> (compute, true pass rate per point, true A, validation samples per point, paper-scale GPU-hours?)
def shape(name: str):
    toy = np.linspace(0.0, 1.0, 41)  # a small run in device-hours (any unit: relative grids)
    if name == "toy":  # the demo's size: 21 points, data to 5 x C_mid, 200 prompts x 4 samples
        C = np.linspace(0.0, 1.0, 21)
        return C, eq1(C, A=0.70, B=1.5, C_mid=0.2, R0=0.3), 0.70, 800, False
    if name == "toy_long":  # data to 10 x C_mid
        return toy, eq1(toy, A=0.70, B=1.5, C_mid=0.1, R0=0.3), 0.70, 800, False
    if name == "paper":  # the paper's ScaleRL run: 16k GPU-hours, 1,000 prompts x 16 samples every 100 steps
        C = np.linspace(0.0, 16000.0, 161)
        return C, eq1(C, A=0.61, B=1.92, C_mid=2542.0, R0=0.3), 0.61, 16000, True
    if name == "transient":  # an off-model bump in the first 10% of compute
        p = eq1(toy, A=0.61, B=1.8, C_mid=0.25, R0=0.3) + 0.15 * np.exp(-(((toy - 0.04) / 0.03) ** 2))
        return toy, p, 0.61, 800, False
    if name == "truncated":  # the data stop before the midpoint
        return toy, eq1(toy, A=0.645, B=1.7, C_mid=1.6, R0=0.3), 0.645, 800, False
    if name == "collapse":  # a late collapse after 80% of compute
        p = eq1(toy, A=0.61, B=1.9, C_mid=0.2, R0=0.3) - np.where(toy > 0.8, 0.6 * (toy - 0.8), 0.0)
        return toy, p, 0.61, 800, False
    if name == "powerlaw":  # power-law shaped: A - (A - R0) (1 + C / c0)^-0.7, approaching A slowly
        return toy, 0.65 - 0.35 * (1.0 + toy / 0.02) ** -0.7, 0.65, 800, False
    if name == "noisy":  # 60 samples per point
        C = np.linspace(0.0, 1.0, 21)
        return C, eq1(C, A=0.70, B=1.5, C_mid=0.2, R0=0.3), 0.70, 60, False
    raise KeyError(name)


SHAPES = ("toy", "toy_long", "paper", "transient", "truncated", "collapse", "powerlaw", "noisy")


def calibrate(name: str, reps: int, seed: int = 0) -> dict:
    C, p, A, N, gpu = shape(name)
    rng = np.random.default_rng(seed)
    cover = over = ident = 0
    for _ in range(reps):
        y = rng.binomial(N, p) / N
        a = assess(C, y, options=options_for(C, grid="paper" if gpu else "relative"), n_samples=N)
        lo, hi = a.A_interval
        cover += lo - 1e-9 <= A <= hi + 1e-9
        ident += a.identified
        over += a.identified and abs(a.fit.A - A) > 0.02
    return {"coverage": cover / reps, "overclaim": over / reps, "identified": ident / reps}


DEFAULT_REPS = {"toy": 3, "toy_long": 8, "paper": 6, "transient": 5, "truncated": 3, "collapse": 5, "noisy": 4}
"""Replicates per shape in the default suite. The power-law shape is in the slow set only: its measured rate of
"identified with |A_hat - A| > 0.02" (8 of 200, 4.0%: of the 9 identified replicates 8 were off by 0.02-0.035)
is too close to the 5% limit for a handful of replicates to check anything but luck."""


@pytest.mark.parametrize("name", sorted(DEFAULT_REPS))
def test_calibration_few_replicates(name):
    """The first few replicates of the slow test (same seed, same draws)."""
    r = calibrate(name, DEFAULT_REPS[name], seed=1)
    assert r["coverage"] >= 0.9, r
    assert r["overclaim"] <= 0.05, r


@pytest.mark.slow
@pytest.mark.parametrize("name", SHAPES)
def test_calibration_200_replicates(name):
    r = calibrate(name, 200, seed=1)
    print(name, r)
    assert r["coverage"] >= 0.9, r
    assert r["overclaim"] <= 0.05, r


def test_paper_size_is_identified_and_toy_truncated_is_not():
    """The rule is not vacuous: the paper-size run is identified within 0.02; a run stopping before C_mid is not."""
    r = calibrate("paper", 3, seed=5)
    assert r["identified"] == 1.0 and r["overclaim"] == 0.0
    r = calibrate("truncated", 3, seed=5)
    assert r["identified"] == 0.0 and r["coverage"] == 1.0


def test_profile_factor_is_the_small_sample_F():
    # F_0.95(1, 1) = 161.4476 (tables): at n = 4 the threshold factor is 162.4, not 1 + 3.84
    assert profile_factor(4) == pytest.approx(1.0 + 161.4476, rel=1e-5)
    # F_0.95(1, 97) = 3.9391 -> 1 + 3.9391 / 97
    assert profile_factor(100) == pytest.approx(1.0 + 3.9391 / 97, rel=1e-4)


def _profile_sse(C, R, *, A, R0):
    """Independent profile: min over (B, C_mid) of the SSE at fixed A (Nelder-Mead from a grid of starts)."""
    from scipy.optimize import minimize

    def sse(t):
        return float(np.sum((eq1(C, A=A, B=math.exp(t[0]), C_mid=math.exp(t[1]), R0=R0) - R) ** 2))

    starts = [(math.log(b), math.log(cm)) for b in (0.5, 1.0, 2.0, 4.0) for cm in (0.05, 0.1, 0.2, 0.4, 0.8)]
    return min(minimize(sse, s, method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-14,
                                                                "maxiter": 4000}).fun for s in starts)


def test_interval_ends_sit_on_the_F_threshold():
    """The interval's ends are where the continuous profile SSE crosses SSE_min (1 + F(1, n-3)/(n-3))."""
    C, p, A, N, _ = shape("toy_long")
    y = np.random.default_rng(3).binomial(N, p) / N
    opts = options_for(C, grid="relative")
    f = opts.fit(C, y)  # the profile interval itself (assess widens it for R0's noise and on a misfit)
    m = C >= opts.fit_from
    n = int(m.sum())
    lo, hi = f.A_profile_interval
    best = min(_profile_sse(C[m], y[m], A=x, R0=y[0]) for x in np.linspace(f.A - 0.01, f.A + 0.01, 9))
    thr = best * (1.0 + __import__("scipy.stats").stats.f.ppf(0.95, 1, n - 3) / (n - 3))
    for end in (lo, hi):
        # linear interpolation between grid A 0.005 apart: the profile at the end is within 2% of the threshold
        assert _profile_sse(C[m], y[m], A=end, R0=y[0]) == pytest.approx(thr, rel=0.02)
    assert lo < f.A < hi and hi - lo < 0.2


def test_not_identified_reports_the_interval_and_no_forecast():
    from scalerl_mega.scaling.forecast import forecast

    C, p, A, N, _ = shape("truncated")
    y = np.random.default_rng(0).binomial(N, p) / N
    a = assess(C, y, options=options_for(C, grid="relative"), n_samples=N)
    assert not a.identified and a.A is None and a.predict(2.0) is None
    assert "wide (need <= 0.04" in a.reason and a.A_interval[1] - a.A_interval[0] > MAX_A_WIDTH
    f = forecast(C, y, budget=2.0, n_samples=[N] * C.size)
    assert f.ok and not f.identified and math.isnan(f.A) and math.isnan(f.predicted_reward_at_budget)
    s = f.summary()
    assert s["A"] is None and s["predicted_reward_at_budget"] is None and s["A_interval"] == list(a.A_interval)
    assert s["reason"] == a.reason and s["fit_from"] == pytest.approx(0.1)


def test_too_few_points_after_the_cut():
    C = np.linspace(0.0, 1.0, 9)  # 8 points > 0, the cut at 0.1 keeps 8; 7 if the cut is at 0.2
    y = eq1(C, A=0.7, B=2.0, C_mid=0.2, R0=0.3)
    a = assess(C, y, options=options_for(C, grid="relative", cut_fraction=0.2), n_samples=800)
    assert not a.identified and a.n_points == MIN_POINTS - 1
    assert f"7 points after the cut (fit from 0.2; need >= {MIN_POINTS})" in a.reason


def test_late_collapse_is_a_misfit_and_the_interval_still_covers_A():
    C, p, A, N, _ = shape("collapse")
    y = np.random.default_rng(0).binomial(N, p) / N
    a = assess(C, y, options=options_for(C, grid="relative"), n_samples=N)
    assert not a.identified and "misfit: fitted without the last" in a.reason
    assert a.holdout.ratio > 2.0 and not a.holdout.passed
    assert a.A_interval[0] <= A <= a.A_interval[1]


def test_holdout_noise_floor_is_the_binomial_se():
    """Exact Eq. 1 points, the last 3 shifted by +0.03: the partial fit (on exact points) predicts the curve,
    so the mean |error| is 0.03; the floor is sqrt(2/pi) x mean sqrt(p (1 - p) / N) over the held-out points."""
    C = np.linspace(0.0, 1.0, 13)
    y = eq1(C, A=0.7, B=2.0, C_mid=0.2, R0=0.3)
    y[-3:] += 0.03
    opts = options_for(C, grid="relative")
    fit = opts.fit(C, y)
    h = holdout_check(C, y, fit=fit, options=opts, n_samples=4000)
    assert h.n_heldout == 3 and h.n_fit == 8  # 11 points after the cut at 0.1; ceil(0.25 x 11) = 3 held out
    assert h.mae == pytest.approx(0.03, abs=1e-3)
    q = fit.predict(C[-3:])
    assert h.noise_floor == pytest.approx(math.sqrt(2 / math.pi) * np.mean(np.sqrt(q * (1 - q) / 4000)), rel=1e-9)
    assert not h.passed and h.ratio == pytest.approx(h.mae / h.noise_floor)


def _write_run(tmp_path, *, seed=0):
    from scalerl_mega.metrics.writer import MetricsWriter

    C, p, _, N, _ = shape("toy_long")
    y = np.random.default_rng(seed).binomial(N, p) / N
    with MetricsWriter(tmp_path) as w:
        for k, (c, r) in enumerate(zip(C, y)):
            w.write("validation", 10 * k, {"val_pass_rate": float(r), "val_prompts": 200.0,
                                           "val_samples_per_prompt": 4.0, "compute_gpu_hours": 0.0,
                                           "compute_device_hours": float(c)})
    return C, y, N


@pytest.mark.parametrize("seed", [0, 9])
def test_live_forecast_cli_and_report_agree(tmp_path, capsys, seed):
    from scalerl_mega.report import write_report
    from scalerl_mega.scaling.cli import main
    from scalerl_mega.scaling.forecast import LiveForecaster

    C, y, N = _write_run(tmp_path, seed=seed)
    live = LiveForecaster(budget=2.0, every=C.size)  # one refit, at the last point
    for c, r in zip(C, y):
        fc = live.add(c, r, N) or live.latest
    assert main([str(tmp_path), "--x", "compute_device_hours", "--forecast-at", "2.0", "4.0", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["runs"][0]
    md = write_report(tmp_path, budget=2.0).read_text()
    # the expected reward with its band at the budget and at twice it: one function (scaling.band), one answer
    got = [v for f in row["forecast"] for v in (f["compute"], f["reward"], f["lo"], f["hi"])]
    assert got == pytest.approx([float(v) for x in zip(fc.band.compute, fc.band.reward, fc.band.lo, fc.band.hi)
                                 for v in x], abs=1e-12)
    for name, k in (("this run's budget", 0), ("twice the budget", 1)):
        assert (f"| {name} | {fc.band.compute[k]:.4g} device-hours | {fc.band.reward[k]:.3f} | "
                f"{fc.band.lo[k]:.3f}..{fc.band.hi[k]:.3f} |") in md
    assert row["A_interval"] == pytest.approx(list(fc.A_interval), abs=1e-12)
    assert row["identified"] == fc.identified and row["reason"] == fc.reason and row["fit_from"] == fc.fit_from
    assert row["B"] == fc.B and row["C_mid"] == fc.C_mid and row["n_points"] == fc.assessment.n_points
    lo, hi = fc.A_interval
    assert f"| {lo:.3f}..{hi:.3f} |" in md and f"| {fc.identified} |" in md
    if fc.identified:
        assert row["A"] == fc.A and f"| {fc.A:.3f} |" in md and f"ceiling A = {fc.A:.3f}" in md
        assert fc.predicted_reward_at_budget == pytest.approx(fc.band.reward[0], abs=1e-12)
    else:
        assert row["A"] is None and "| not identified |" in md and "ceiling A somewhere in" in md
        assert "run longer" in md and math.isnan(fc.predicted_reward_at_budget)


def test_same_answer_for_both_seeds_is_not_trivial(tmp_path):
    """The agreement test above covers an identified and a not identified run."""
    from scalerl_mega.scaling.forecast import forecast

    got = set()
    for seed in (0, 9):
        C, p, _, N, _ = shape("toy_long")
        y = np.random.default_rng(seed).binomial(N, p) / N
        got.add(forecast(C, y, budget=2.0, n_samples=N).identified)
    assert got == {True, False}
