"""Sigmoid/power-law fits (paper Eq. 1, App. A.4-A.5) against values computed independently in the tests."""

from __future__ import annotations

import math

import numpy as np
import pytest

from scalerl_mega.scaling.fit import (
    PAPER_A_GRID,
    PAPER_CMID_GRID,
    fit_power_law,
    fit_sigmoid,
    loo_transform,
    refit_fixed_A,
    sigmoid_law,
)

# Paper's table of large runs (C_mid, B, A) (App. A.8 / reference/SCALING_FIT.md).
PAPER_RUNS = {
    "scalerl": (2542.0, 1.92, 0.610),
    "32k": (11272.0, 1.89, 0.645),
    "8gen": (2542.0, 2.44, 0.585),
    "scout": (4242.0, 1.65, 0.710),
    "bs2048": (10909.0, 1.70, 0.645),
    "mathcode_code": (1675.0, 1.09, 0.615),
}
R0 = 0.30


def eq1(C, A, B, C_mid, R0):
    """Eq. 1 written out in float64, independently of the module."""
    C = np.asarray(C, dtype=np.float64)
    out = np.full(C.shape, R0, dtype=np.float64)
    pos = C > 0
    out[pos] = R0 + (A - R0) / (1.0 + (C_mid / C[pos]) ** B)
    return out


def synthetic(name, *, noise, seed, n=101, mult=5.0):
    cm, B, A = PAPER_RUNS[name]
    rng = np.random.default_rng(seed)
    C = np.linspace(0.0, mult * cm, n)
    return C, eq1(C, A, B, cm, R0) + rng.normal(0.0, noise, n)


def test_sigmoid_law_hand_values():
    # C = C_mid: half the gain; C = 2 C_mid, B = 1: 2/3 of the gain; C = 0: R0.
    assert sigmoid_law(1000.0, A=0.7, B=2.0, C_mid=1000.0, R0=0.3) == pytest.approx(0.5)
    assert sigmoid_law(2000.0, A=0.7, B=1.0, C_mid=1000.0, R0=0.3) == pytest.approx(0.3 + 0.4 * 2 / 3)
    assert sigmoid_law(0.0, A=0.7, B=1.5, C_mid=1000.0, R0=0.3) == pytest.approx(0.3)


def test_paper_grids_are_the_papers():
    assert PAPER_A_GRID.size == 71 and PAPER_A_GRID[0] == 0.45 and PAPER_A_GRID[-1] == 0.8
    assert np.allclose(np.diff(PAPER_A_GRID), 0.005)
    assert PAPER_CMID_GRID.size == 100 and PAPER_CMID_GRID[0] == 100.0 and PAPER_CMID_GRID[-1] == 40000.0
    assert np.allclose(np.diff(PAPER_CMID_GRID), 39900.0 / 99.0)


def test_grid_and_fast_recover_an_exact_grid_cell():
    """Noiseless data generated ON a grid cell: both methods must return that cell, B and SSE ~ 0.

    This is one of the two paper-grid (7,100 curve_fit) runs in the default suite."""
    A, cm, B = 0.610, float(PAPER_CMID_GRID[6]), 1.9  # C_mid = 2518.18...
    C = np.linspace(0.0, 12000.0, 60)
    R = eq1(C, A, B, cm, R0)
    for method in ("grid", "fast"):
        f = fit_sigmoid(C, R, r0=R0, method=method)
        assert (f.A, f.C_mid) == (A, cm), method
        assert f.B == pytest.approx(B, rel=1e-5), method
        assert f.sse < 1e-12, method
        assert f.identified and f.reason == ""
        assert f.n_points == int(np.sum(C >= 1500.0))


def _brute_cell_min(C, R, A, cm, r0):
    """Independent per-cell minimum over B: dense log grid then scipy bounded scalar search."""
    from scipy.optimize import minimize_scalar

    def sse(lb):
        return float(np.sum((R - eq1(C, A, math.exp(lb), cm, r0)) ** 2))

    lbs = np.linspace(math.log(0.01), math.log(100.0), 601)
    vals = np.array([sse(t) for t in lbs])
    k = int(np.argmin(vals))
    res = minimize_scalar(sse, bounds=(lbs[max(k - 1, 0)], lbs[min(k + 1, 600)]), method="bounded",
                          options={"xatol": 1e-10})
    return min(res.fun, vals[k])


def test_fast_optimum_matches_independent_brute_force_on_small_grid():
    C, R = synthetic("scout", noise=0.0075, seed=3)
    a_grid = np.round(np.arange(0.67, 0.75 + 1e-9, 0.01), 3)
    cm_grid = np.linspace(3400.0, 5000.0, 9)
    f = fit_sigmoid(C, R, r0=R0, method="fast", a_grid=a_grid, cmid_grid=cm_grid, widen=False)
    m = C >= 1500.0
    ref = np.array([[_brute_cell_min(C[m], R[m], a, cm, R0) for cm in cm_grid] for a in a_grid])
    i, j = np.unravel_index(np.argmin(ref), ref.shape)
    assert (f.A, f.C_mid) == (a_grid[i], cm_grid[j])
    assert f.sse == pytest.approx(ref[i, j], rel=1e-7)


@pytest.mark.parametrize("name", list(PAPER_RUNS))
def test_fast_recovers_paper_runs(name):
    """Acceptance: noise 0.005, 101 points up to 5 x C_mid, seed 0: A within 0.02, B and C_mid within 10%."""
    cm, B, A = PAPER_RUNS[name]
    C, R = synthetic(name, noise=0.005, seed=0)
    f = fit_sigmoid(C, R, r0=R0, method="fast", refine=True)
    assert f.identified, f.reason
    assert abs(f.A - A) <= 0.02
    assert abs(f.B - B) <= 0.10 * B
    assert abs(f.C_mid - cm) <= 0.10 * cm
    assert f.A_profile_interval[0] <= f.A <= f.A_profile_interval[1]
    # The continuous refit never has a larger SSE than the grid optimum it starts from.
    assert f.refined.sse <= f.sse * (1 + 1e-9)


def _same_cell(name, noise, seed):
    C, R = synthetic(name, noise=noise, seed=seed)
    g = fit_sigmoid(C, R, r0=R0, method="grid")
    f = fit_sigmoid(C, R, r0=R0, method="fast")
    assert (g.A, g.C_mid) == (f.A, f.C_mid)
    assert f.B == pytest.approx(g.B, rel=1e-4)
    assert f.sse == pytest.approx(g.sse, rel=1e-7)
    assert f.A_profile_interval == pytest.approx(g.A_profile_interval, abs=1e-9)
    assert f.identified == g.identified
    cm, B, A = PAPER_RUNS[name]
    assert abs(g.A - A) <= 0.02 and abs(g.B - B) <= 0.1 * B and abs(g.C_mid - cm) <= 0.1 * cm


def test_grid_and_fast_same_cell_scalerl():
    """Paper grid (7,100 curve_fit calls) vs fast on the ScaleRL run: the second default-suite grid run."""
    _same_cell("scalerl", 0.0075, 1)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PAPER_RUNS if n != "scalerl"])
def test_grid_and_fast_same_cell_other_runs(name):
    _same_cell(name, 0.005, 0)


def test_truncated_before_cmid_is_not_identified():
    cm, B, A = PAPER_RUNS["scalerl"]
    rng = np.random.default_rng(0)
    C = np.linspace(0.0, 0.8 * cm, 60)  # data stop before C_mid
    R = eq1(C, A, B, cm, R0) + rng.normal(0.0, 0.0075, C.size)
    f = fit_sigmoid(C, R, r0=R0, fit_from=None, method="fast")
    assert not f.identified
    assert "C_mid" in f.reason or "edge" in f.reason


def test_optimum_on_edge_widens_grid():
    A, B, cm = 0.86, 1.8, 3000.0  # A outside the paper's 0.45..0.80
    C = np.linspace(0.0, 15000.0, 80)
    R = eq1(C, A, B, cm, R0) + np.random.default_rng(2).normal(0.0, 0.003, C.size)
    f = fit_sigmoid(C, R, r0=R0, method="fast", refine=True)
    assert "A_high" in f.widened
    assert f.identified
    assert abs(f.A - A) <= 0.01
    assert f.grid.a_hi > 0.8
    g = fit_sigmoid(C, R, r0=R0, method="fast", widen=False)
    assert not g.identified and g.A == 0.8 and "edge" in g.reason


def test_r0_defaults_to_reward_at_smallest_compute():
    C, R = synthetic("scalerl", noise=0.005, seed=0)
    f = fit_sigmoid(C, R, method="fast")
    assert f.R0 == R[0] and "smallest compute" in f.r0_source
    g = fit_sigmoid(C, R, r0=0.25, method="fast")
    assert g.R0 == 0.25 and g.r0_source == "given"


def test_refine_recovers_off_grid_parameters_exactly():
    A, B, cm = 0.6234, 1.77, 2700.0  # neither A nor C_mid is on the paper grid
    C = np.linspace(0.0, 14000.0, 70)
    R = eq1(C, A, B, cm, R0)
    f = fit_sigmoid(C, R, r0=R0, method="fast", refine=True)
    assert f.refined is not None and f.refined.differs
    assert f.refined.A == pytest.approx(A, abs=1e-6)
    assert f.refined.B == pytest.approx(B, rel=1e-5)
    assert f.refined.C_mid == pytest.approx(cm, rel=1e-5)
    assert np.allclose(f.predict(C, refined=True), R, atol=1e-7)


@pytest.mark.parametrize(
    "compute,reward,kw,msg",
    [
        ([0, 2000, 3000, 4000, 5000, 6000], [0.3, 0.4, float("nan"), 0.5, 0.55, 0.56], {}, "not finite"),
        ([0, 2000, 3000, 2500, 5000, 6000], [0.3, 0.4, 0.45, 0.5, 0.55, 0.56], {}, "not monotone"),
        ([0, 2000, 3000, 4000], [0.3, 0.4, 0.45, 0.5], {}, "need at least 4"),
        ([0, 100, 200, 300], [0.3, 0.4, 0.45, 0.5], {}, "empty fit window"),
    ],
)
def test_bad_input_raises_clear_errors(compute, reward, kw, msg):
    with pytest.raises(ValueError, match=msg):
        fit_sigmoid(compute, reward, method="fast", **kw)


def test_power_law_recovers_exact_data_and_respects_a_max():
    C = np.linspace(1500.0, 50000.0, 60)
    A, D, B = 0.66, 25.0, 0.55
    R = A - D / C**B
    p = fit_power_law(C, R)
    assert p.A == pytest.approx(A, abs=1e-6) and p.B == pytest.approx(B, rel=1e-5)
    assert p.D == pytest.approx(D, rel=1e-4) and not p.a_at_bound
    q = fit_power_law(C, R, a_max=0.6)
    assert q.A == 0.6 and q.a_at_bound
    # With A clamped, D is the least-squares solution for that B: check the normal equation directly.
    u = C ** (-q.B)
    assert np.dot((0.6 - q.D * u) - R, u) == pytest.approx(0.0, abs=1e-9)


def test_loo_transform_slope_is_b_on_eq1():
    A, B, cm = 0.61, 1.92, 2542.0
    C = np.linspace(500.0, 12000.0, 40)
    R = eq1(C, A, B, cm, R0)
    t = loo_transform(C, R, A=A, B=B, C_mid=cm, R0=R0)
    assert t.valid.all()
    assert np.allclose(t.log_F, B * np.log(C), rtol=1e-10)
    assert t.slope == pytest.approx(B, rel=1e-9) and t.intercept == pytest.approx(0.0, abs=1e-8)
    # Points at or above A (or at/below R0) are undefined for log F.
    t2 = loo_transform([1000.0, 2000.0], [R0, A + 0.01], A=A, B=B, C_mid=cm, R0=R0)
    assert not t2.valid.any() and math.isnan(t2.slope)


def test_refit_fixed_a_recovers_b_and_cmid():
    A, B, cm = 0.61, 1.7, 3100.0
    C = np.linspace(0.0, 15000.0, 60)
    R = eq1(C, A, B, cm, R0)
    f = refit_fixed_A(C, R, A=A, r0=R0)
    assert f.A == A and f.fixed_A
    assert f.refined.B == pytest.approx(B, rel=1e-5) and f.refined.C_mid == pytest.approx(cm, rel=1e-5)
    assert abs(f.C_mid - cm) <= 39900.0 / 99.0 / 2 + 1e-6  # nearest grid value
