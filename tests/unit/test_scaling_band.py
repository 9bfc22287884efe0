"""scaling/band.py: the 95% forecast band on the expected reward, checked by hand, against an independent constrained
optimisation, and calibrated on synthetic runs fitted on their first half (float64, seeded): at paper scale, at
toy scale and with a slow rise that continues after the knee (the reproduction's late creep). Each family's band
must cover the true curve at >= 90% of the later points and stay sharp (the median half-widths are printed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl_mega.scaling.band import forecast_band
from scalerl_mega.scaling.cells import profile_factor
from scalerl_mega.scaling.fit import FitOptions
from scalerl_mega.scaling.identify import options_for


def eq1(c, A, B, Cm, R0):
    """Eq. 1 (paper Sec. 2.1) written out here; C = 0 gives R0."""
    c = np.asarray(c, dtype=np.float64)
    return np.where(c > 0, R0 + (A - R0) / (1.0 + (Cm / np.where(c > 0, c, 1.0)) ** B), R0)


def first_half_fit(c, r):
    half = 0.5 * float(c.max())
    first = c <= half
    opts = options_for(c[first], grid="relative", base=FitOptions(method="fast"))
    return first, opts.fit(c[first], r[first])


# (compute points, samples per point, truth) per family; the truths are the reproduction's and the paper's shapes
FAMILIES = {
    # paper scale: GPU-hours to 16k, a point every 100 steps, 1,000 prompts x 16 samples (App. A.5, A.7)
    "paper": (np.linspace(0.0, 16000.0, 161), 16000, lambda c: eq1(c, 0.61, 1.92, 2542.0, 0.30)),
    # toy scale: the predictability design's shape, thousands of samples, 200 prompts x 8 per point
    "toy": (np.linspace(0.0, 1636.0, 321), 1600, lambda c: eq1(c, 0.675, 1.7, 48.7, 0.054)),
    # misspecified: the toy curve plus a rise of 0.012 per doubling of compute after 400k samples
    "creep": (np.linspace(0.0, 1636.0, 321), 1600,
              lambda c: eq1(c, 0.665, 1.7, 48.7, 0.054) + 0.012 * np.log2(np.maximum(c, 1.0) / 400.0) * (c > 400)),
}
RUNS = 16
MAX_HALF_WIDTH_2X = {"paper": 0.025, "toy": 0.02, "creep": 0.05}
"""Sharpness: the median half-width at twice the fitted compute (the issue asks about +-0.02 for tens of thousands
of samples per point)."""


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_bands_fitted_on_the_first_half_cover_the_true_curve(family, capsys):
    c, n, truth_of = FAMILIES[family]
    truth = truth_of(c)
    covered, points, widths = 0, 0, []
    for seed in range(RUNS):
        r = np.random.default_rng(seed).binomial(n, np.clip(truth, 0.0, 1.0)) / n
        first, fit = first_half_fit(c, r)
        later = ~first
        band = forecast_band(c[first], r[first], fit=fit, at=c[later], n_samples=n)
        covered += int(np.sum((truth[later] >= band.lo) & (truth[later] <= band.hi)))
        points += int(later.sum())
        widths.append(float(band.half_width()[-1]))
    coverage, median = covered / points, float(np.median(widths))
    with capsys.disabled():
        print(f"\n[band calibration] {family}: coverage {coverage:.3f} of {points} later points over {RUNS} runs; "
              f"median half-width at 2x {median:.4f}")
    assert coverage >= 0.90, (family, coverage)
    assert median <= MAX_HALF_WIDTH_2X[family], (family, median)


def test_exact_data_give_a_tight_band_on_the_curve():
    c = np.linspace(0.0, 8000.0, 41)
    r = eq1(c, 0.61, 1.92, 2542.0, 0.30) + 1e-6 * np.sin(np.arange(41))  # all but noiseless
    fit = options_for(c, grid="relative", base=FitOptions(method="fast")).fit(c, r)
    at = np.array([9000.0, 16000.0, 32000.0])
    band = forecast_band(c, r, fit=fit, at=at, n_samples=1e9)
    truth = eq1(at, 0.61, 1.92, 2542.0, 0.30)
    assert np.all(band.lo <= truth + 1e-4) and np.all(truth - 1e-4 <= band.hi)
    assert np.all(band.half_width() < 0.003) and band.kappa < 1e-3
    assert band.reward == pytest.approx(fit.predict(at))
    assert [row["compute"] for row in band.rows()] == at.tolist() and set(band.rows()[0]) == {"compute", "reward",
                                                                                              "lo", "hi"}


def test_the_profile_band_matches_an_independent_constrained_optimum():
    """The band's parameter part at one compute = max / min of Eq. 1 there over the parameters whose SSE is within
    the profile threshold, found here by scipy's SLSQP from several starts (no grid)."""
    from scipy.optimize import minimize

    c = np.linspace(0.0, 4000.0, 21)
    rng = np.random.default_rng(3)
    r = eq1(c, 0.61, 1.9, 2500.0, 0.3) + rng.normal(0.0, 0.01, c.size)
    r[0] = 0.3
    fit = options_for(c, grid="relative", base=FitOptions(method="fast", refine=True)).fit(c, r)
    x, y = c[c >= fit.compute_range[0]], r[c >= fit.compute_range[0]]
    target = 12000.0

    def sse(p):
        return float(np.sum((eq1(x, p[0], math.exp(p[1]), math.exp(p[2]), fit.R0) - y) ** 2))

    T = fit.sse * profile_factor(x.size, 3)
    cons = [{"type": "ineq", "fun": lambda p: T - sse(p)}]
    ends = []
    for sign in (1.0, -1.0):
        best = None
        for A0, B0, C0 in ((fit.A, fit.B, fit.C_mid), (0.6, 2.0, 2500.0), (0.65, 1.5, 3000.0), (0.58, 2.5, 2200.0)):
            res = minimize(lambda p: -sign * float(eq1(target, p[0], math.exp(p[1]), math.exp(p[2]), fit.R0)),
                           [A0, math.log(B0), math.log(C0)], constraints=cons, method="SLSQP",
                           bounds=[(0.0, 1.0), (math.log(0.05), math.log(20.0)), (None, None)], options={"maxiter": 500})
            if res.success and sse(res.x) <= T * (1 + 1e-6):
                v = sign * -res.fun
                best = v if best is None else (max(best, v) if sign > 0 else min(best, v))
        ends.append(best)
    band = forecast_band(c, r, fit=fit, at=[target])
    assert band.param_hi[0] == pytest.approx(ends[0], abs=2e-3)
    assert band.param_lo[0] == pytest.approx(ends[1], abs=2e-3)


def test_far_extrapolation_widens_and_an_unidentified_A_gets_a_band_not_silence():
    c = np.linspace(0.0, 1500.0, 31)  # stops before C_mid = 2542: A is not identified
    r = np.random.default_rng(0).binomial(16000, eq1(c, 0.61, 1.92, 2542.0, 0.30)) / 16000
    fit = options_for(c, grid="relative", base=FitOptions(method="fast")).fit(c, r)
    band = forecast_band(c, r, fit=fit, at=[3000.0, 30000.0, 300000.0], n_samples=16000)
    w = band.half_width()
    assert w[0] < w[1] <= w[2] and w[2] > 0.05  # far beyond the data: wide, and still a band
    assert np.all(np.isfinite(band.lo)) and np.all(band.lo <= band.reward) and np.all(band.reward <= band.hi)
    assert np.all((0.0 <= band.lo) & (band.hi <= 1.0))


def test_bad_input_is_refused_with_the_reason():
    c = np.linspace(0.0, 100.0, 3)
    fit = options_for(np.linspace(0, 100, 11), grid="relative").fit(np.linspace(0, 100, 11),
                                                                     eq1(np.linspace(0, 100, 11), 0.6, 2, 30, 0.1))
    with pytest.raises(ValueError, match="fitted points: a band needs >= 4"):
        forecast_band(c, eq1(c, 0.6, 2, 30, 0.1), fit=fit, at=[200.0])
    c = np.linspace(0.0, 100.0, 11)
    with pytest.raises(ValueError, match="must be > 0"):
        forecast_band(c, eq1(c, 0.6, 2, 30, 0.1), fit=fit, at=[0.0])
