"""Comparison rule (App. A.5), bootstrap intervals and extrapolation error, with independent references."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl_mega.scaling.compare import (
    SEED_MARGIN_A,
    bootstrap_points,
    bootstrap_seeds,
    compare_loo,
    compare_runs,
)
from scalerl_mega.scaling.fit import PAPER_CMID_GRID, FitOptions

R0 = 0.3


def eq1(C, A, B, C_mid, r0=R0):
    C = np.asarray(C, dtype=np.float64)
    out = np.full(C.shape, r0)
    pos = C > 0
    out[pos] = r0 + (A - r0) / (1.0 + (C_mid / C[pos]) ** B)
    return out


def run(A, B, cm, *, noise=0.0, seed=0, n=81, c_max=15000.0):
    C = np.linspace(0.0, c_max, n)
    return C, eq1(C, A, B, cm) + np.random.default_rng(seed).normal(0.0, noise, n)


OPTS = FitOptions(r0=R0)


def test_margin_is_the_papers():
    assert SEED_MARGIN_A == 0.02


def test_a_beyond_margin_decides():
    a = run(0.61, 1.9, 2542.0, noise=0.004, seed=1)
    b = run(0.66, 1.6, 3000.0, noise=0.004, seed=2)
    c = compare_runs(a, b, labels=("scalerl", "other"), options=OPTS)
    assert not c.within_margin and c.better == "other"
    assert c.delta_A == pytest.approx(c.fit_b.A - c.fit_a.A)
    assert abs(c.delta_A - 0.05) <= 0.02
    assert c.fixed_a is None and math.isnan(c.B_a_fixed)


def test_within_margin_refits_at_mean_a_and_compares_b():
    # Same asymptote region, different efficiency: run b has the larger B at a similar C_mid.
    a = run(0.610, 1.4, 3000.0, seed=3)
    b = run(0.620, 2.4, 3000.0, seed=4)
    c = compare_runs(a, b, labels=("slow", "fast"), options=OPTS)
    assert c.within_margin
    assert c.A_mean == pytest.approx((c.fit_a.A + c.fit_b.A) / 2)
    assert c.fixed_a.A == c.A_mean and c.fixed_b.A == c.A_mean
    assert c.B_b_fixed > c.B_a_fixed and c.better == "fast"
    assert "seed margin" in c.verdict
    # Independent check of the fixed-A refit: SSE of the reported (B, C_mid) at A_mean on noiseless data b
    # is no worse than at the true (B, C_mid) (it is a least-squares optimum).
    C, R = b
    m = C >= 1500.0
    q = c.fixed_b.refined
    sse_fit = np.sum((R[m] - eq1(C[m], c.A_mean, q.B, q.C_mid)) ** 2)
    sse_true_bc = np.sum((R[m] - eq1(C[m], c.A_mean, 2.4, 3000.0)) ** 2)
    assert sse_fit <= sse_true_bc + 1e-15


def test_unidentified_run_is_not_compared():
    a = run(0.61, 1.9, 2542.0, noise=0.004, seed=1)
    C = np.linspace(0.0, 0.8 * 9000.0, 60)
    b = (C, eq1(C, 0.66, 1.9, 9000.0) + np.random.default_rng(0).normal(0, 0.005, C.size))
    c = compare_runs(a, b, options=FitOptions(r0=R0, fit_from=None))
    assert c.better is None and "not identified" in c.verdict


def test_bootstrap_points_and_seeds():
    C, R = run(0.61, 1.92, 2542.0, noise=0.0075, seed=6, n=81, c_max=12710.0)
    bp = bootstrap_points(C, R, options=OPTS, n_boot=25, seed=0)
    assert bp.kind == "points" and bp.n_ok == 25
    assert bp.A[0] <= bp.A[1] and bp.B[0] <= bp.B[1]
    assert 0.55 <= bp.A[0] and bp.A[1] <= 0.67
    runs = [run(0.61, 1.92, 2542.0, noise=0.0075, seed=s, n=61, c_max=12710.0) for s in (10, 11, 12)]
    bs = bootstrap_seeds(runs, options=OPTS, n_boot=12, seed=0)
    per = [OPTS.fit(c, r).A for c, r in runs]
    assert bs.per_seed_A == pytest.approx(per)
    assert bs.seed_half_range == pytest.approx((max(per) - min(per)) / 2)
    assert bs.kind == "seeds" and bs.n_ok == 12
    with pytest.raises(ValueError, match="at least 2 runs"):
        bootstrap_seeds(runs[:1], options=OPTS)


def test_loo_refits_every_run_at_the_mean_a_of_all_runs():
    """Known curves: three runs with A = 0.61 (noiseless, on the A grid) and B = 1.4, 1.9, 2.4: the common A
    is 0.61 and the refits recover each B; the ranking is by B, not relative to the first run."""
    cm = float(PAPER_CMID_GRID[7])  # on the paper's C_mid grid, so the grid optimum is the true curve
    runs = [run(0.61, b, cm) for b in (1.4, 2.4, 1.9)]
    loo = compare_loo(runs, labels=["slow", "fast", "mid"], options=OPTS)
    assert loo.A_mean == pytest.approx(0.61, abs=1e-9) and loo.excluded == ()
    for r, b in zip(loo.runs, (1.4, 2.4, 1.9)):
        assert r.fixed.A == loo.A_mean and r.within_margin
        assert r.B == pytest.approx(b, rel=1e-4) and r.C_mid == pytest.approx(cm, rel=1e-4)
    assert loo.best == "fast"


def test_loo_mean_is_over_all_runs_and_the_refit_is_a_least_squares_optimum():
    from scipy.optimize import curve_fit

    runs = [run(0.600, 1.6, 2500.0, noise=0.002, seed=5), run(0.615, 2.0, 3000.0, noise=0.002, seed=6),
            run(0.640, 1.8, 3500.0, noise=0.002, seed=7)]
    loo = compare_loo(runs, labels=["a", "b", "c"], options=OPTS)
    own = [OPTS.fit(*r).A for r in runs]
    assert loo.A_mean == pytest.approx(float(np.mean(own)), abs=1e-6)  # not pairwise with run 0
    assert [r.A_offset for r in loo.runs] == pytest.approx([a - loo.A_mean for a in own])
    assert [r.within_margin for r in loo.runs] == [abs(a - loo.A_mean) <= SEED_MARGIN_A + 1e-12 for a in own]
    for (C, R), r in zip(runs, loo.runs):  # independent fixed-A least squares over the paper's fit window
        m = C >= 1500.0
        (b, cm), _ = curve_fit(lambda c, b, cm: eq1(c, loo.A_mean, b, cm), C[m], R[m], p0=(1.8, 3000.0))
        assert r.B == pytest.approx(b, rel=2e-3) and r.C_mid == pytest.approx(cm, rel=2e-3)
    assert loo.best == max(loo.runs, key=lambda r: r.B).label


def test_loo_excludes_unidentified_runs():
    C = np.linspace(0.0, 0.8 * 9000.0, 60)
    bad = (C, eq1(C, 0.66, 1.9, 9000.0) + np.random.default_rng(0).normal(0, 0.005, C.size))
    good = run(0.61, 1.9, 2542.0, noise=0.004, seed=1)
    opts = FitOptions(r0=R0, fit_from=None)
    loo = compare_loo([good, bad], labels=["good", "bad"], options=opts)
    assert loo.excluded == ("bad",) and loo.A_mean == pytest.approx(opts.fit(*good).A, abs=1e-6)
    assert loo.best == "good" and math.isnan(loo.runs[1].B)
