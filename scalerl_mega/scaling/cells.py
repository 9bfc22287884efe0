"""The per-cell search of `scaling.fit` (paper App. A.5): for every (A, C_mid) cell of the grid the best B
and its sum of squared residuals, either by the paper's `curve_fit` loop (`_cells_grid`) or by the exact
vectorised equivalent (`_cells_fast`; the method is described in `scaling.fit`'s docstring); and the grid
helpers of the widening search (`_spacing`, `_extend`)."""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np

from scalerl_mega.scaling.records import SIGMOID_PARAMS

PROFILE_LEVEL = 0.95
"""Confidence level of `A_profile_interval`."""


def profile_factor(n: int, n_params: int = 3, level: float = PROFILE_LEVEL) -> float:
    """SSE_max / SSE_min of the profile interval: 1 + F_level(1, n - n_params) / (n - n_params) (the F-test
    for one parameter with the noise variance estimated from the residuals; n - n_params >= 1)."""
    from scipy.special import fdtri  # the F quantile; scipy.special, not scipy.stats (seconds to import)

    dof = max(n - n_params, 1)
    return 1.0 + float(fdtri(1, dof, level)) / dof


# Fast method: the coarse log-spaced B grid that brackets each cell's minimum over B.
_FAST_B_LO, _FAST_B_HI, _FAST_N_B = 1e-2, 1e2, 81
_GOLDEN_ITERS = 52


# --------------------------------------------------------------------------------------------------------------
# Per-cell SSE: the paper's curve_fit loop and the exact vectorised equivalent


def _cell_model(A: float, C_mid: float, R0: float):
    """Eq. 1 with A, C_mid, R0 fixed: a function of (C, B) ONLY.

    curve_fit counts the parameters of the model's signature; a lambda with defaulted A/C_mid arguments
    would silently fit three parameters."""

    def model(C, B):
        return R0 + (A - R0) / (1.0 + (C_mid / C) ** B)

    return model


def _cells_grid(C, R, R0, a_grid, cm_grid, cache: dict) -> tuple[np.ndarray, np.ndarray]:
    """App. A.5 exactly: curve_fit of B at default init (p0 = 1, Levenberg-Marquardt) in every cell.

    A cell whose curve_fit raises (no convergence) gets SSE = inf. `cache` maps (A, C_mid) -> (sse, B)
    so that grid widening only fits new cells."""
    from scipy.optimize import OptimizeWarning, curve_fit

    sse = np.empty((a_grid.size, cm_grid.size))
    bb = np.empty_like(sse)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore", OptimizeWarning)
        warnings.simplefilter("ignore", RuntimeWarning)
        for i, A in enumerate(a_grid):
            for j, cm in enumerate(cm_grid):
                key = (round(float(A), 9), round(float(cm), 6))
                if key not in cache:
                    model = _cell_model(float(A), float(cm), R0)
                    try:
                        popt, _ = curve_fit(model, C, R)
                        b = float(popt[0])
                        s = float(np.sum((R - model(C, b)) ** 2))
                        cache[key] = (s if math.isfinite(s) else math.inf, b)
                    except (RuntimeError, ValueError):
                        cache[key] = (math.inf, math.nan)
                sse[i, j], bb[i, j] = cache[key]
    return sse, bb


def _sse_cells(x, R, R0, a_k, lcm_k, logb_k) -> np.ndarray:
    """Exact float64 SSE of K cells at their B: model = R0 + a / (1 + exp(-B (log C - log C_mid))) (= Eq. 1)."""
    with np.errstate(over="ignore"):
        s = 1.0 / (1.0 + np.exp(-np.exp(logb_k)[:, None] * (x[None, :] - lcm_k[:, None])))
    r = R[None, :] - R0 - a_k[:, None] * s
    return np.einsum("kn,kn->k", r, r)


def _golden(x, R, R0, a_k, lcm_k, lo, hi, f_stop, iters: int, keep=None):
    """Vectorised golden-section search on log B in [lo, hi] per cell (float64, exact SSE).

    After `f_stop` iterations only the cells within a hair of the best value so far continue (the rest are
    left at their current value, an upper bound of their minimum). Returns (t_best, f_best)."""
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    t1 = hi - phi * (hi - lo)
    t2 = lo + phi * (hi - lo)
    f1 = _sse_cells(x, R, R0, a_k, lcm_k, t1)
    f2 = _sse_cells(x, R, R0, a_k, lcm_k, t2)
    act = np.arange(a_k.size)
    for it in range(iters):
        if it == f_stop:
            fb = np.minimum(f1, f2)
            act = act[fb[act] <= fb.min() * (1.0 + 1e-6) + 1e-300]
        l1, l2, lo_a, hi_a = t1[act], t2[act], lo[act], hi[act]
        g1, g2 = f1[act], f2[act]
        left = g1 < g2  # the minimum is in [lo, t2]
        hi_a = np.where(left, l2, hi_a)
        lo_a = np.where(left, lo_a, l1)
        n1 = hi_a - phi * (hi_a - lo_a)
        n2 = lo_a + phi * (hi_a - lo_a)
        te = np.where(left, n1, n2)
        fe = _sse_cells(x, R, R0, a_k[act], lcm_k[act], te)
        f1[act], f2[act] = np.where(left, fe, g2), np.where(left, g1, fe)
        t1[act], t2[act] = np.where(left, n1, l2), np.where(left, l1, n2)
        lo[act], hi[act] = lo_a, hi_a
    better1 = f1 < f2
    return np.where(better1, t1, t2), np.where(better1, f1, f2)


def _cells_fast(C, R, R0, a_grid, cm_grid) -> tuple[np.ndarray, np.ndarray]:
    """Global minimum over B > 0 in every (A, C_mid) cell that can win, vectorised (see module docstring).

    Stage 1 (float32, through the linearity in a = A - R0): SSE of every (A, C_mid) cell at every B of a
    log grid over [0.01, 100]; stage 2 (float64, exact SSE): golden-section on log B for the cells whose
    pessimistic minimum estimate (parabolic estimate, minus twice its gain, minus the float32 error bound)
    does not exceed the best value known to be achievable (times the A-profile threshold factor, so that
    `A_profile_interval` sees exact values too). Returns (sse, B) in the layout of `_cells_grid`; other
    cells keep their stage-1 value (an estimate of an upper bound of their minimum)."""
    x = np.log(C)
    y = R - R0
    a = a_grid - R0  # (nA,)
    lcm = np.log(cm_grid)  # (nM,)
    tb = np.linspace(math.log(_FAST_B_LO), math.log(_FAST_B_HI), _FAST_N_B)
    bs = np.exp(tb)
    nB, n = tb.size, x.size
    Sys, Sss = _sigmoid_sums(x, y, lcm, bs)
    syy = float(y @ y)
    # SSE for every (A, C_mid, B-grid) triple through the linearity in a.
    g = syy - 2.0 * a[:, None, None] * Sys[None] + (a * a)[:, None, None] * Sss[None]  # (nA, nM, nB)
    err = 64.0 * float(np.finfo(np.float32).eps) * (2.0 * np.abs(a) * float(np.abs(y).sum()) + a * a * n + syy)
    k = np.argmin(g, axis=2)
    kc = np.clip(k, 1, nB - 2)
    gm = np.take_along_axis(g, (kc - 1)[..., None], 2)[..., 0]
    g0 = np.take_along_axis(g, kc[..., None], 2)[..., 0]
    gp = np.take_along_axis(g, (kc + 1)[..., None], 2)[..., 0]
    gk = np.take_along_axis(g, k[..., None], 2)[..., 0]
    curv = gp - 2.0 * g0 + gm
    with np.errstate(divide="ignore", invalid="ignore"):
        est = np.where(curv > 0, g0 - (gp - gm) ** 2 / (8.0 * curv), gk)
    est = np.minimum(est, gk)
    lower = est - 2.0 * (gk - est) - err[:, None]
    # Cells that might beat the best, or lie inside the A-profile threshold (`_profile_interval`), get exact values.
    prof = profile_factor(n, len(SIGMOID_PARAMS))
    cand = lower <= float((gk + err[:, None]).min()) * prof
    flat_est = est.ravel()
    cand.ravel()[np.argsort(flat_est)[: min(8, flat_est.size)]] = True
    ii, jj = np.nonzero(cand)
    kk = k[ii, jj]
    t_fin, f_fin = _refine_cells(x, R, R0, a[ii], lcm[jj], tb, kk)
    sse = gk.copy()
    b = bs[k].copy()
    sse[ii, jj] = f_fin
    b[ii, jj] = np.exp(t_fin)
    return sse, b


def _sigmoid_sums(x, y, lcm, bs) -> tuple[np.ndarray, np.ndarray]:
    """Stage 1 of `_cells_fast` (float32): for every (C_mid, B) pair, sum_i s_i y_i and sum_i s_i^2 with
    s_i = expit(B (x_i - log C_mid)), computed in chunks of C_mid to bound memory. Returns (Sys, Sss), (nM, nB)."""
    nM, nB, n = lcm.size, bs.size, x.size
    Sys = np.empty((nM, nB))
    Sss = np.empty((nM, nB))
    x32, y32, hb32 = x.astype(np.float32), y.astype(np.float32), (0.5 * bs).astype(np.float32)
    chunk = max(1, int(2_000_000 // (nB * n)))
    for j0 in range(0, nM, chunk):
        d = x32[None, :] - lcm[j0 : j0 + chunk, None].astype(np.float32)  # (m, n)
        s = np.tanh(hb32[None, :, None] * d[:, None, :])  # expit(z) = (1 + tanh(z / 2)) / 2
        s += np.float32(1.0)
        s *= np.float32(0.5)  # (m, nB, n)
        Sys[j0 : j0 + chunk] = s @ y32
        Sss[j0 : j0 + chunk] = np.einsum("mbn,mbn->mb", s, s)
    return Sys, Sss


def _refine_cells(x, R, R0, a_k, lcm_k, tb, kk) -> tuple[np.ndarray, np.ndarray]:
    """Stage 2 of `_cells_fast` (float64, exact SSE): golden-section on log B within two B-grid steps of each
    candidate cell's grid minimum `kk`, keeping the grid point itself when it is better (minimum at B -> 0.01
    or 100). Returns (log B, SSE) per candidate cell."""
    nB = tb.size
    lo = tb[np.clip(kk - 2, 0, nB - 1)]
    hi = tb[np.clip(kk + 2, 0, nB - 1)]
    t_best, f_best = _golden(x, R, R0, a_k, lcm_k, lo.copy(), hi.copy(), f_stop=20, iters=_GOLDEN_ITERS)
    # Keep the B-grid end point when the minimum sits there (B -> 0.01 or 100).
    t_end = tb[kk]
    f_end = _sse_cells(x, R, R0, a_k, lcm_k, t_end)
    use_end = f_end < f_best
    return np.where(use_end, t_end, t_best), np.where(use_end, f_end, f_best)


# --------------------------------------------------------------------------------------------------------------
# Grid spacing and widening


def _spacing(g: np.ndarray) -> Literal["linear", "geometric", "irregular"]:
    if g.size < 2:
        return "irregular"
    d = np.diff(g)
    if np.allclose(d, d[0], rtol=1e-6):
        return "linear"
    if g[0] > 0:
        q = g[1:] / g[:-1]
        if np.allclose(q, q[0], rtol=1e-6):
            return "geometric"
    return "irregular"


def _extend(g: np.ndarray, side: str, *, steps: int, lo_limit: float, hi_limit: float) -> np.ndarray | None:
    """Extend grid `g` by up to `steps` values on `side` ("low"/"high") with its own spacing (geometric
    grids geometrically, others by their end step), within lo_limit < or <= value <= hi_limit (values must
    stay > 0 when lo_limit is 0 and the grid is a C_mid grid: callers pass lo_limit=0 and filter). Returns
    None when there is no room."""
    eps = 1e-12
    geometric = _spacing(g) == "geometric"
    k = np.arange(1, steps + 1, dtype=np.float64)
    if side == "high":
        if g[-1] >= hi_limit - eps:
            return None
        if geometric:
            new = g[-1] * (g[-1] / g[-2]) ** k
        else:
            new = g[-1] + (g[-1] - g[-2] if g.size > 1 else 0.005) * k
        new = new[new <= hi_limit + eps]
        if math.isfinite(hi_limit) and new.size < steps and (new.size == 0 or new[-1] < hi_limit - 1e-9):
            new = np.append(new, hi_limit)
        return np.concatenate([g, np.round(new, 9)])
    if g[0] <= lo_limit + eps:
        return None
    if geometric:
        new = g[0] / (g[1] / g[0]) ** k[::-1]
    else:
        new = g[0] - (g[1] - g[0] if g.size > 1 else 0.005) * k[::-1]
    new = new[new >= lo_limit - eps]
    if new.size < steps and (new.size == 0 or new[0] > lo_limit + 1e-9) and not geometric:
        new = np.insert(new, 0, lo_limit)
    if new.size == 0:
        return None
    return np.concatenate([np.round(new, 9), g])
