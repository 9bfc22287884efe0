"""Sigmoid compute-scaling fits (paper Eq. 1, Sec. 2.1, App. A.4-A.6) and the power law (App. A.4).

Eq. 1:   R(C) = R0 + (A - R0) / (1 + (C_mid / C)^B),   0 <= A <= 1, B > 0, C in GPU-hours.

The paper's procedure (App. A.5, `method="grid"`): A in {0.450, 0.455, ..., 0.800} (71 values) x C_mid in
linspace(100, 40000, 100); for every cell B is fitted with `scipy.optimize.curve_fit` at its default
initialisation (B = 1, Levenberg-Marquardt), and the cell with the least sum of squared residuals (SSE) wins.
Points below `fit_from` = 1.5k GPU-hours are excluded (Sec. 2.1, App. A.7).

`method="fast"` finds the same cell without 7,100 `curve_fit` calls. Two facts make it exact and cheap:
for fixed (B, C_mid) the model is linear in a = A - R0, so SSE(a) = Syy - 2 a Sys + a^2 Sss with
Sys = sum y*s, Sss = sum s^2, s = 1 / (1 + (C_mid/C)^B), y = R - R0: one pass over the points per
(B, C_mid) serves every A on the grid. For fixed (A, C_mid) the model is one-dimensional in B: a coarse
log-spaced B grid (evaluated through the linearity above) brackets each cell's minimum, and a vectorised
golden-section search on log B finishes the cells that can still win (a cell is dropped only when a
pessimistic estimate of its minimum exceeds an SSE that some cell already achieves). Both methods then
apply the same argmin over the same cell layout.

Identification: when the optimum lies on the grid's edge the grid is
widened (flagged in `widened`). `identified=False`, with the reason, when: the optimum is still on the edge
after widening (e.g. A at its bound 1.0); the data stop before C_mid, or before the fitted curve reached
MIN_GAIN_FRACTION = 70% of its gain (noise just past C_mid can fake the bend); or A's profile range reaches
the grid's upper edge (the data do not bound A from above). `A_profile_interval` is the 95% profile
interval of A: the A whose best SSE (over the C_mid grid, B fitted) is within the small-sample threshold
SSE_min (1 + F_0.95(1, n - 3) / (n - 3)) of the optimum (the F-test for one parameter of a nonlinear
least-squares fit with the noise variance estimated from the residuals; at n = 4 the factor is 162, where
the large-sample chi-square value would give 4.84). Its ends are interpolated linearly between grid A
values; the coarse C_mid grid makes it approximate. `scaling.identify` decides identification from it.

Scales: the paper's grids and `fit_from=1500` only make sense in GPU-hours at the paper's scale. For other
scales (tiny CPU runs in device-hours) pass `fit_from=None` (no lower cut; points with C <= 0 are always
excluded because Eq. 1 pins them to R0) and explicit grids, e.g. `relative_grids(...)`: A in
{0.005, ..., 1.000} and C_mid geometric over [0.1 x smallest, 100 x largest fitted compute], 200 values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal, Sequence

import numpy as np

from scalerl_mega.scaling.cells import PROFILE_LEVEL, _cells_fast, _cells_grid, _extend, _spacing, profile_factor
from scalerl_mega.scaling.records import (  # sigmoid_law, power_law: re-exported for `scaling.fit` callers
    SIGMOID_PARAMS, GridInfo, LooTransform, PowerLawFit, RefinedFit, SigmoidFit, power_law, sigmoid_law)

PAPER_A_GRID: np.ndarray = np.round(np.arange(0.450, 0.800 + 1e-9, 0.005), 3)
"""App. A.5: A in {0.450, 0.455, ..., 0.800} (71 values)."""
PAPER_CMID_GRID: np.ndarray = np.linspace(100.0, 40000.0, 100)
"""App. A.5: C_mid in [100, 40000], 100 linearly spaced values (GPU-hours)."""
PAPER_FIT_FROM = 1500.0
"""Sec. 2.1 / App. A.7: fits begin after ~1.5k GPU-hours (about one epoch)."""
MIN_GAIN_FRACTION = 0.7
"""Identification: the fitted curve at the largest fitted compute must have reached this fraction of the
gain A - R0 (0.5 = C_mid itself). Data that stop just past C_mid can mimic a sigmoid's bend with noise."""
A_BOUNDS = (0.0, 1.0)
"""Eq. 1: 0 <= A <= 1 (pass rates); the limit of grid widening and of continuous refinement."""
LOG_CMID_REACH = 40.0
"""The continuous refit keeps log C_mid within this many e-folds of the fitted compute (C_mid within a factor
e^40 = 2e17 of the data: beyond it every Eq. 1 curve is flat over the points)."""


# --------------------------------------------------------------------------------------------------------------
# Input preparation


@dataclass(frozen=True)
class _Prepared:
    C: np.ndarray
    R: np.ndarray
    R0: float
    r0_source: str


def _as_series(compute, reward) -> tuple[np.ndarray, np.ndarray]:
    c = np.asarray(compute, dtype=np.float64)
    r = np.asarray(reward, dtype=np.float64)
    if c.ndim != 1 or r.ndim != 1:
        raise ValueError(f"compute and reward must be 1-D, got shapes {c.shape} and {r.shape}")
    if c.shape != r.shape:
        raise ValueError(f"compute has {c.size} values but reward has {r.size}")
    if c.size == 0:
        raise ValueError("empty series: no (compute, reward) points")
    for name, v in (("compute", c), ("reward", r)):
        bad = np.flatnonzero(~np.isfinite(v))
        if bad.size:
            raise ValueError(f"{name}[{bad[0]}] is {v[bad[0]]} (not finite); {bad.size} such value(s)")
    if np.any(c < 0):
        i = int(np.flatnonzero(c < 0)[0])
        raise ValueError(f"compute[{i}] = {c[i]} is negative")
    dec = np.flatnonzero(np.diff(c) < 0)
    if dec.size:
        i = int(dec[0]) + 1
        raise ValueError(f"compute is not monotone: compute[{i}] = {c[i]} after compute[{i - 1}] = {c[i - 1]}")
    return c, r


def _prepare(compute, reward, *, r0, fit_from, fit_to, n_params: int) -> _Prepared:
    c, r = _as_series(compute, reward)
    if r0 is None:
        i = int(np.argmin(c))
        R0, src = float(r[i]), f"reward at smallest compute (C={c[i]:g})"
    else:
        R0, src = float(r0), "given"
        if not math.isfinite(R0):
            raise ValueError(f"r0 = {r0} is not finite")
    if fit_from is not None and fit_to is not None and fit_to < fit_from:
        raise ValueError(f"fit_to = {fit_to} is below fit_from = {fit_from}")
    mask = c > 0
    if fit_from is not None:
        mask &= c >= fit_from
    if fit_to is not None:
        mask &= c <= fit_to
    n = int(mask.sum())
    window = f"[{'-inf' if fit_from is None else f'{fit_from:g}'}, {'inf' if fit_to is None else f'{fit_to:g}'}]"
    if n == 0:
        raise ValueError(
            f"empty fit window: no points with compute in {window} and > 0 (data span {c.min():g}..{c.max():g})"
        )
    if n <= n_params:
        raise ValueError(
            f"fit window {window} holds {n} point(s); {n_params} free parameters need at least {n_params + 1}"
        )
    return _Prepared(C=c[mask], R=r[mask], R0=R0, r0_source=src)


def paper_grids() -> tuple[np.ndarray, np.ndarray]:
    """The paper's grids (App. A.5): 71 A values x 100 C_mid values in GPU-hours."""
    return PAPER_A_GRID.copy(), PAPER_CMID_GRID.copy()


def relative_grids(
    compute_lo: float, compute_hi: float, *, n_cmid: int = 200, span: tuple[float, float] = (0.1, 100.0)
) -> tuple[np.ndarray, np.ndarray]:
    """Scale-free grids for runs not measured in paper-scale GPU-hours (documented default for small runs).

    A in {0.005, 0.010, ..., 1.000} (pass rates, Eq. 1's 0 <= A <= 1, the paper's 0.005 step);
    C_mid geometric from span[0] x compute_lo to span[1] x compute_hi with `n_cmid` values, where
    compute_lo/hi are the smallest/largest compute in the fit window (or the forecast budget)."""
    if not (compute_lo > 0 and compute_hi >= compute_lo):
        raise ValueError(f"relative_grids needs 0 < compute_lo <= compute_hi, got {compute_lo}, {compute_hi}")
    a = np.round(np.arange(0.005, 1.0 + 1e-9, 0.005), 3)
    cm = np.geomspace(span[0] * compute_lo, span[1] * compute_hi, n_cmid)
    return a, cm


def _check_grid(name: str, g, *, positive: bool) -> np.ndarray:
    g = np.asarray(g, dtype=np.float64)
    if g.ndim != 1 or g.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-D sequence, got shape {g.shape}")
    if not np.all(np.isfinite(g)) or np.any(np.diff(g) <= 0):
        raise ValueError(f"{name} must be finite and strictly increasing")
    if positive and g[0] <= 0:
        raise ValueError(f"{name} must be positive, got {g[0]}")
    return g


# --------------------------------------------------------------------------------------------------------------
# Grid search with widening (the grid helpers `_spacing`, `_extend` are in `scaling.cells`)


@dataclass
class _GridResult:
    i: int
    j: int
    sse: np.ndarray
    b: np.ndarray
    a_grid: np.ndarray
    cm_grid: np.ndarray
    widened: list = field(default_factory=list)
    on_edge: bool = False
    edge_note: str = ""


def _search(C, R, R0, a_grid, cm_grid, *, method: str, widen: bool, max_widen: int, fixed_A: bool) -> _GridResult:
    cache: dict = {}

    def cells(ag, cg):
        if method == "grid":
            return _cells_grid(C, R, R0, ag, cg, cache)
        return _cells_fast(C, R, R0, ag, cg)

    widened: list[str] = []
    for round_ in range(max_widen + 1):
        sse, b = cells(a_grid, cm_grid)
        if not np.isfinite(sse).any():
            raise ValueError("no grid cell produced a finite fit (every per-cell B fit failed)")
        i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
        edges = []
        if not fixed_A and a_grid.size > 1:
            if i == 0:
                edges.append("A_low")
            if i == a_grid.size - 1:
                edges.append("A_high")
        if cm_grid.size > 1:
            if j == 0:
                edges.append("C_mid_low")
            if j == cm_grid.size - 1:
                edges.append("C_mid_high")
        if not edges:
            return _GridResult(int(i), int(j), sse, b, a_grid, cm_grid, widened)
        if not widen or round_ == max_widen:
            break
        grew = False
        for e in edges:
            if e.startswith("A"):
                ng = _extend(a_grid, e[2:], steps=20, lo_limit=A_BOUNDS[0], hi_limit=A_BOUNDS[1])
                if ng is not None:
                    a_grid, grew = np.round(ng, 6), True
                    widened.append(e)
            else:
                n_steps = max(10, cm_grid.size // 4)
                ng = _extend(cm_grid, e[6:], steps=n_steps, lo_limit=0.0, hi_limit=math.inf)
                if ng is not None:
                    ng = ng[ng > 0]
                    if ng.size > cm_grid.size:
                        cm_grid, grew = ng, True
                        widened.append(e)
        if not grew:
            break
    note = ", ".join(
        f"{e} ({'A' if e.startswith('A') else 'C_mid'}="
        f"{(a_grid[i] if e.startswith('A') else cm_grid[j]):g})"
        for e in edges
    )
    return _GridResult(int(i), int(j), sse, b, a_grid, cm_grid, widened, True, note)


def _profile_interval(gr: _GridResult, n: int, n_params: int, exact=None, best_exact: float | None = None
                      ) -> tuple[float, float]:
    """95% profile interval of A (module docstring): grid A within the F threshold, each end moved
    linearly towards the first grid A outside it (where the profile crosses the threshold).

    `exact(k)`: the continuous profile SSE at grid A index k (min over B and C_mid, no C_mid grid); with it
    the ends are found on exact values (the C_mid grid's quantisation otherwise moves them when the noise
    is small), and `best_exact` (the continuous optimum) sets the threshold."""
    prof = gr.sse.min(axis=1)
    best = float(prof.min()) if best_exact is None else min(float(prof.min()), best_exact)
    thr = best * profile_factor(n, n_params) + 1e-15
    ag = gr.a_grid
    ok = np.flatnonzero(prof <= thr)
    i0 = int(np.argmin(prof))
    if ok.size == 0:
        ok = np.array([i0])
    i, j = int(ok.min()), int(ok.max())
    cache: dict[int, float] = {}

    def val(k: int) -> float:
        if exact is None:
            return float(prof[k])
        if k not in cache:
            cache[k] = min(float(prof[k]), float(exact(k)))
        return cache[k]

    def end(k: int, step: int) -> float:
        while 0 <= k + step < ag.size and val(k + step) <= thr:
            k += step
        while k != i0 and val(k) > thr:
            k -= step
        out = k + step
        if not 0 <= out < ag.size:
            return float(ag[k])
        p_in, p_out = val(k), val(out)
        if not math.isfinite(p_out) or p_out <= p_in:
            return float(ag[out])
        t = (thr - p_in) / (p_out - p_in)
        return float(ag[k] + min(max(t, 0.0), 1.0) * (ag[out] - ag[k]))

    return end(i, -1), end(j, +1)


def _refine(C, R, R0, *, A0, B0, cm0, fixed_A: float | None) -> tuple[float, float, float, float]:
    """Continuous least squares in (A, log B, log C_mid) (or (log B, log C_mid) at fixed A) from the grid optimum."""
    from scipy.optimize import least_squares

    x = np.log(C)

    def unpack(p):
        if fixed_A is None:
            return p[0], math.exp(p[1]), p[2]
        return fixed_A, math.exp(p[0]), p[1]

    def resid(p):
        A, B, lcm = unpack(p)
        from scipy.special import expit

        return R0 + (A - R0) * expit(B * (x - lcm)) - R

    lb0 = math.log(max(B0, 1e-6))
    # log C_mid within LOG_CMID_REACH of the data: beyond it Eq. 1 is flat over the points (a curve that never
    # bends, or a run cut long before its midpoint, otherwise sends C_mid to an overflow)
    lcm_lo, lcm_hi = float(x.min()) - LOG_CMID_REACH, float(x.max()) + LOG_CMID_REACH
    if fixed_A is None:
        p0 = np.array([min(max(A0, A_BOUNDS[0]), A_BOUNDS[1]), lb0, math.log(cm0)])
        bounds = ([A_BOUNDS[0], -12.0, lcm_lo], [A_BOUNDS[1], 8.0, lcm_hi])
    else:
        p0 = np.array([lb0, math.log(cm0)])
        bounds = ([-12.0, lcm_lo], [8.0, lcm_hi])
    p0 = np.clip(p0, np.array(bounds[0]) + 1e-12, np.array(bounds[1]) - 1e-12)
    with np.errstate(all="ignore"):
        res = least_squares(resid, p0, bounds=bounds, x_scale="jac", xtol=1e-12, ftol=1e-12, gtol=1e-12)
    A, B, lcm = unpack(res.x)
    sse = float(np.sum(resid(res.x) ** 2))
    return float(A), float(B), float(math.exp(lcm)), sse


def _a_profile(prep: _Prepared, gr: _GridResult, *, A: float, B: float, cm: float,
               n_params: int) -> tuple[float, float]:
    """A's profile interval (`_profile_interval`) with the cells near its threshold refitted exactly."""
    def exact(k: int) -> float:
        jk = int(np.argmin(gr.sse[k]))
        b0 = float(gr.b[k, jk])
        if not (math.isfinite(b0) and b0 > 0):
            return math.inf
        a_k = float(gr.a_grid[k])
        try:
            return _refine(prep.C, prep.R, prep.R0, A0=a_k, B0=b0, cm0=float(gr.cm_grid[jk]), fixed_A=a_k)[3]
        except (OverflowError, ValueError):  # the refit ran off (C_mid -> inf): keep the grid value
            return math.inf

    try:
        best_exact = _refine(prep.C, prep.R, prep.R0, A0=A, B0=B, cm0=cm, fixed_A=None)[3] if B > 0 else None
    except (OverflowError, ValueError):
        best_exact = None
    return _profile_interval(gr, prep.C.size, n_params, exact=exact, best_exact=best_exact)


def _finish(
    prep: _Prepared,
    gr: _GridResult,
    *,
    method: str,
    fit_from,
    fit_to,
    refine: bool,
    fixed_A: bool,
) -> SigmoidFit:
    A = float(gr.a_grid[gr.i])
    cm = float(gr.cm_grid[gr.j])
    B = float(gr.b[gr.i, gr.j])
    sse = float(gr.sse[gr.i, gr.j])
    n = prep.C.size
    n_params = 2 if fixed_A else 3
    c_hi = float(prep.C.max())
    reasons = []
    if gr.on_edge:
        reasons.append(f"optimum on the grid's edge after widening: {gr.edge_note}")
    gain_frac = 1.0 / (1.0 + (cm / c_hi) ** B) if B > 0 else 0.0
    if c_hi < cm:
        reasons.append(f"data stop before C_mid (largest fitted compute {c_hi:g} < C_mid {cm:g})")
    elif gain_frac < MIN_GAIN_FRACTION:
        reasons.append(
            f"data stop at {100 * gain_frac:.0f}% of the fitted gain (need >= {100 * MIN_GAIN_FRACTION:.0f}%): "
            "too close to C_mid for A to be more than an extrapolation"
        )
    prof = (A, A) if fixed_A else _a_profile(prep, gr, A=A, B=B, cm=cm, n_params=n_params)
    if not fixed_A and gr.a_grid.size > 1 and prof[1] >= gr.a_grid[-1] - 1e-12 and not gr.on_edge:
        reasons.append(f"A's 95% profile range {prof[0]:.3f}..{prof[1]:.3f} reaches the grid's upper edge: "
                       "the data do not bound A from above")
    refined = None
    if refine:
        rA, rB, rcm, rsse = _refine(prep.C, prep.R, prep.R0, A0=A, B0=B, cm0=cm, fixed_A=A if fixed_A else None)
        differs = abs(rA - A) >= 0.005 - 1e-12 or abs(rB - B) >= 0.01 * abs(B) or abs(rcm - cm) >= 0.01 * cm
        refined = RefinedFit(A=rA, B=rB, C_mid=rcm, sse=rsse, differs=bool(differs))
    ag, cg = gr.a_grid, gr.cm_grid
    return SigmoidFit(
        A=A,
        B=B,
        C_mid=cm,
        R0=prep.R0,
        r0_source=prep.r0_source,
        sse=sse,
        n_points=n,
        identified=not reasons,
        reason="; ".join(reasons),
        method=method,
        fit_from=fit_from,
        fit_to=fit_to,
        compute_range=(float(prep.C.min()), c_hi),
        grid=GridInfo(a_lo=float(ag[0]), a_hi=float(ag[-1]), n_a=int(ag.size), cmid_lo=float(cg[0]),
                      cmid_hi=float(cg[-1]), n_cmid=int(cg.size), cmid_spacing=_spacing(cg)),
        on_edge=gr.on_edge,
        widened=tuple(gr.widened),
        A_profile_interval=prof,
        fixed_A=fixed_A,
        refined=refined,
    )


def fit_sigmoid(
    compute,
    reward,
    *,
    r0: float | None = None,
    fit_from: float | None = PAPER_FIT_FROM,
    fit_to: float | None = None,
    method: Literal["grid", "fast"] = "grid",
    a_grid: Sequence[float] | None = None,
    cmid_grid: Sequence[float] | None = None,
    refine: bool = False,
    widen: bool = True,
    max_widen: int = 4,
) -> SigmoidFit:
    """Fit Eq. 1 by the paper's grid search (App. A.5).

    compute, reward: the full series in compute order (compute >= 0, finite). R0 = `r0` if given, else the
    reward at the smallest compute of the full series (the step-0 evaluation); `r0_source` says which.
    Points with fit_from <= C <= fit_to (None = no bound) and C > 0 are fitted. Defaults: the paper's
    grids and fit_from = 1500 GPU-hours; for other scales pass `fit_from=None` and grids, e.g.
    `relative_grids(...)` (module docstring). `method="grid"`: 71 x 100 curve_fit calls (6-12 s);
    `method="fast"`: the same cell, vectorised. `refine=True` adds a continuous refit from the optimum.
    When the optimum lies on an edge the grid is widened (up to `max_widen` rounds, A within [0, 1]);
    see `SigmoidFit.identified` / `reason`."""
    if method not in ("grid", "fast"):
        raise ValueError(f"method must be 'grid' or 'fast', got {method!r}")
    prep = _prepare(compute, reward, r0=r0, fit_from=fit_from, fit_to=fit_to, n_params=len(SIGMOID_PARAMS))
    ag = _check_grid("a_grid", PAPER_A_GRID if a_grid is None else a_grid, positive=False)
    cg = _check_grid("cmid_grid", PAPER_CMID_GRID if cmid_grid is None else cmid_grid, positive=True)
    if ag[0] < A_BOUNDS[0] or ag[-1] > A_BOUNDS[1]:
        raise ValueError(f"a_grid must lie in {list(A_BOUNDS)} (Eq. 1: 0 <= A <= 1), got {ag[0]}..{ag[-1]}")
    gr = _search(prep.C, prep.R, prep.R0, ag, cg, method=method, widen=widen, max_widen=max_widen, fixed_A=False)
    return _finish(prep, gr, method=method, fit_from=fit_from, fit_to=fit_to, refine=refine, fixed_A=False)


def refit_fixed_A(
    compute,
    reward,
    *,
    A: float,
    r0: float | None = None,
    fit_from: float | None = PAPER_FIT_FROM,
    fit_to: float | None = None,
    method: Literal["grid", "fast"] = "fast",
    cmid_grid: Sequence[float] | None = None,
    refine: bool = True,
    widen: bool = True,
) -> SigmoidFit:
    """Refit B and C_mid with A held fixed (App. A.5: compare B at the mean A of runs within the margin).

    Same C_mid grid and per-cell B fit as `fit_sigmoid`; `refine=True` (default) adds the continuous
    (B, C_mid) refit, which the grid's C_mid step otherwise quantises."""
    if not (A_BOUNDS[0] <= A <= A_BOUNDS[1]):
        raise ValueError(f"A = {A} outside {list(A_BOUNDS)}")
    prep = _prepare(compute, reward, r0=r0, fit_from=fit_from, fit_to=fit_to, n_params=2)
    cg = _check_grid("cmid_grid", PAPER_CMID_GRID if cmid_grid is None else cmid_grid, positive=True)
    ag = np.array([float(A)])
    gr = _search(prep.C, prep.R, prep.R0, ag, cg, method=method, widen=widen, max_widen=4, fixed_A=True)
    return _finish(prep, gr, method=method, fit_from=fit_from, fit_to=fit_to, refine=refine, fixed_A=True)


def fit_power_law(
    compute,
    reward,
    *,
    fit_from: float | None = PAPER_FIT_FROM,
    fit_to: float | None = None,
    a_max: float | None = 1.0,
) -> PowerLawFit:
    """Fit R = A - D / C^B (App. A.4) by least squares, A <= a_max (None: unbounded).

    For fixed B the model is linear in (A, D): solved exactly; B is profiled on a log grid in
    [1e-3, 10] and refined by a bounded scalar search. No R0 is involved."""
    from scipy.optimize import minimize_scalar

    prep = _prepare(compute, reward, r0=0.0, fit_from=fit_from, fit_to=fit_to, n_params=3)
    C, R = prep.C, prep.R

    def solve(b: float) -> tuple[float, float, float, bool]:
        u = C ** (-b)
        X = np.stack([np.ones_like(u), -u], axis=1)
        (A, D), *_ = np.linalg.lstsq(X, R, rcond=None)
        at_bound = False
        if a_max is not None and A > a_max:
            A, at_bound = a_max, True
            D = float(np.dot(a_max - R, u) / np.dot(u, u))
        sse = float(np.sum((R - (A - D * u)) ** 2))
        return float(A), float(D), sse, at_bound

    lbs = np.linspace(math.log(1e-3), math.log(10.0), 241)
    sses = np.array([solve(math.exp(t))[2] for t in lbs])
    k = int(np.argmin(sses))
    lo, hi = lbs[max(k - 1, 0)], lbs[min(k + 1, lbs.size - 1)]
    res = minimize_scalar(lambda t: solve(math.exp(t))[2], bounds=(lo, hi), method="bounded",
                          options={"xatol": 1e-10})
    t = float(res.x) if res.fun <= sses[k] else float(lbs[k])
    A, D, sse, at_bound = solve(math.exp(t))
    return PowerLawFit(A=A, D=D, B=math.exp(t), sse=sse, n_points=int(C.size), a_at_bound=at_bound,
                       fit_from=fit_from, fit_to=fit_to)


def loo_transform(compute, reward, *, A: float, B: float, C_mid: float, R0: float) -> LooTransform:
    """Fig. 7 transform: log F(R) = B log C_mid - log((A - R0)/(R - R0) - 1), equal to B log C on Eq. 1.

    Returns natural-log coordinates, the mask of defined points and the least-squares slope over them
    (nan when fewer than two are defined)."""
    c, r = _as_series(compute, reward)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = (r - R0) / (A - R0)
        valid = (c > 0) & (frac > 0) & (frac < 1) & np.isfinite(frac)
        log_c = np.where(c > 0, np.log(np.where(c > 0, c, 1.0)), np.nan)
        log_f = np.where(valid, B * math.log(C_mid) - np.log(np.where(valid, 1.0 / frac - 1.0, 1.0)), np.nan)
    if valid.sum() >= 2:
        slope, intercept = np.polyfit(log_c[valid], log_f[valid], 1)
    else:
        slope = intercept = math.nan
    return LooTransform(log_C=log_c, log_F=log_f, valid=valid, slope=float(slope), intercept=float(intercept))


@dataclass(frozen=True, kw_only=True)
class FitOptions:
    """The keyword options of `fit_sigmoid`, bundled so that compare/forecast/CLI pass one object.

    Defaults are the paper's (App. A.5) except `method="fast"` (the same cell, vectorised)."""

    r0: float | None = None
    fit_from: float | None = PAPER_FIT_FROM
    fit_to: float | None = None
    method: Literal["grid", "fast"] = "fast"
    a_grid: tuple[float, ...] | None = None
    cmid_grid: tuple[float, ...] | None = None
    refine: bool = False
    widen: bool = True

    def fit(self, compute, reward, **overrides) -> SigmoidFit:
        kw = dict(r0=self.r0, fit_from=self.fit_from, fit_to=self.fit_to, method=self.method,
                  a_grid=self.a_grid, cmid_grid=self.cmid_grid, refine=self.refine, widen=self.widen)
        kw.update(overrides)
        return fit_sigmoid(compute, reward, **kw)

    def refit_fixed_A(self, compute, reward, *, A: float) -> SigmoidFit:
        return refit_fixed_A(compute, reward, A=A, r0=self.r0, fit_from=self.fit_from, fit_to=self.fit_to,
                             method=self.method, cmid_grid=self.cmid_grid, refine=True, widen=self.widen)


def relative_options(compute, options: FitOptions) -> FitOptions:
    """`options` with `relative_grids` over the series' compute inside its fit window (C > 0, fit_from/fit_to);
    unchanged when no point is inside (the fit itself then reports the empty window)."""
    c = np.asarray(compute, dtype=np.float64)
    m = c > 0
    if options.fit_from is not None:
        m &= c >= options.fit_from
    if options.fit_to is not None:
        m &= c <= options.fit_to
    if not m.any():
        return options
    a, cm = relative_grids(float(c[m].min()), float(c[m].max()))
    return replace(options, a_grid=tuple(a), cmid_grid=tuple(cm))
